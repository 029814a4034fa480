//! Property tests of request parsing (request.rs): the selection variables of every built-in
//! vendor profile (`NVIDIA_VISIBLE_DEVICES`, `NVIDIA_DRIVER_CAPABILITIES`,
//! `AWS_NEURON_VISIBLE_DEVICES`, `NEURON_RT_VISIBLE_CORES`, `AMD_VISIBLE_DEVICES`,
//! `HABANA_VISIBLE_DEVICES`, ...) and `cdi.k8s.io/` annotations, all of which a container image
//! or a user controls.
//!
//! Invariants, for any value:
//! - `collect` and `resolve` return (no panic, no unbounded work: a range such as
//!   `0-4294967295` must not allocate billions of entries);
//! - an error names the variable and the value exactly as given (`VAR=value: problem`);
//! - a successful resolution is a sorted, duplicate-free subset of the node's device indexes.
//!
//! Cases per property: `PROPTEST_CASES` (proptest's default 256 when unset; `make verify` raises
//! it). With `ACTK_VERIFY_COUNTS=FILE` each property appends `parser cases` to FILE.

use actk_core::inventory::{Device, VendorInventory};
use actk_core::profile::{self, Profile};
use actk_core::request::{self, Selection};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

mod common;
use common::check;

/// Every selection variable of the built-in profiles, with its profile.
fn variables() -> Vec<String> {
    let mut v = Vec::new();
    for p in profile::builtin() {
        v.extend(p.selection.env.iter().cloned());
        v.extend(p.selection.cores_env.iter().cloned());
        v.extend(p.selection.capabilities_env.iter().cloned());
    }
    v.sort();
    v.dedup();
    v
}

/// Pieces that reach the parser's branches: keywords, digits, separators, ranges, UUIDs, MIG ids,
/// CDI names, capability names, large numbers, non-ASCII.
fn token() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("all".to_string()),
        Just("ALL".to_string()),
        Just("none".to_string()),
        Just("void".to_string()),
        Just(",".to_string()),
        Just("-".to_string()),
        Just(" ".to_string()),
        Just(":".to_string()),
        Just("=".to_string()),
        Just("GPU-".to_string()),
        Just("MIG-".to_string()),
        Just("nvidia.com/gpu=0".to_string()),
        Just("aws.amazon.com/neuron=all".to_string()),
        Just("compute".to_string()),
        Just("utility".to_string()),
        Just("4294967295".to_string()),
        Just("4294967296".to_string()),
        Just("99999999999999999999".to_string()),
        Just("é".to_string()),
        (0u32..20).prop_map(|n| n.to_string()),
        (0u32..20, 0u32..20).prop_map(|(a, b)| format!("{a}-{b}")),
        "[0-9a-fA-F-]{1,12}",
        any::<u32>().prop_map(|n| n.to_string()),
    ]
}

/// A value: tokens glued together, or any string at all.
fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::collection::vec(token(), 0..8).prop_map(|t| t.concat()),
        1 => any::<String>(),
    ]
}

/// An env list: some selection variables (possibly repeated: the last one wins) and noise.
fn env() -> impl Strategy<Value = Vec<String>> {
    let vars = variables();
    let entry = (prop::sample::select(vars), value()).prop_map(|(k, v)| format!("{k}={v}"));
    prop::collection::vec(prop_oneof![4 => entry, 1 => Just("PATH=/bin".to_string()), 1 => any::<String>()], 0..6)
}

fn annotations() -> impl Strategy<Value = BTreeMap<String, String>> {
    let key = prop_oneof![
        "cdi\\.k8s\\.io/[a-z]{0,6}".prop_map(String::from),
        Just("io.kubernetes.cri.sandbox-id".to_string()),
        any::<String>(),
    ];
    prop::collection::btree_map(key, value(), 0..3)
}

/// A node with `n` devices of `kind`, each with a UUID and `cores` cores.
fn inventory(p: &Profile, n: u32, cores: Option<u32>) -> VendorInventory {
    VendorInventory {
        profile: p.name.clone(),
        kind: p.kind.clone(),
        devices: (0..n)
            .map(|i| Device {
                index: i,
                uuid: Some(format!("GPU-{i:02}ab0000-1111-2222")),
                cores,
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

/// Whatever a container sets, `collect` and `resolve` return quickly; errors name the variable
/// and its (last) value; successes are sorted subsets of the node's devices.
#[test]
fn selection_variables_of_every_vendor_never_panic_and_errors_name_variable_and_value() {
    let profiles = profile::builtin();
    assert!(profiles.len() >= 5, "built-in profiles: {}", profiles.len());
    let strategy = (env(), annotations(), 0u32..17, prop::option::of(0u32..9));
    check("selection-variables", strategy, |(env, ann, n, cores)| {
        let start = Instant::now();
        match request::collect(&env, &ann, &profiles, &BTreeMap::new()) {
            Err(e) => {
                let shown = e.to_string();
                prop_assert!(shown.starts_with(&format!("{}={}: ", e.variable, request::shorten(&e.value))), "{shown}");
                if let Some(key) = e.variable.strip_prefix("annotation ") {
                    prop_assert_eq!(ann.get(key), Some(&e.value), "annotation value named: {}", shown);
                } else {
                    prop_assert_eq!(request::env_value(&env, &e.variable), Some(e.value.as_str()), "{}", shown);
                }
            }
            Ok(req) => {
                for v in &req.vendors {
                    prop_assert_eq!(request::env_value(&env, &v.variable), Some(v.value.as_str()));
                    let p = profiles.iter().find(|p| p.name == v.profile).expect("request of a known profile");
                    let inv = inventory(p, n, cores);
                    match v.resolve(Some(&inv)) {
                        Ok(idx) => {
                            prop_assert!(idx.windows(2).all(|w| w[0] < w[1]), "not sorted/unique: {:?}", idx);
                            prop_assert!(idx.iter().all(|i| *i < n), "{:?} beyond {} devices", idx, n);
                            if v.selection == Selection::All {
                                prop_assert_eq!(idx.len() as u32, n);
                            }
                        }
                        Err(e) => {
                            prop_assert_eq!(&e.variable, &v.variable);
                            prop_assert_eq!(&e.value, &v.value);
                        }
                    }
                    prop_assert!(
                        v.resolve(None).is_ok() || !matches!(v.selection, Selection::All | Selection::DriverOnly)
                    );
                }
                for name in &req.cdi_names {
                    prop_assert!(actk_core::cdi::QualifiedName::parse(&name.name).is_ok(), "{}", name.name);
                }
            }
        }
        // A few ms at most; a range that expands to billions of entries would take minutes or
        // exhaust memory (a container could do that to every start).
        prop_assert!(start.elapsed() < Duration::from_secs(2), "took {:?} on {:?}", start.elapsed(), env);
        Ok(())
    });
}

/// Lists and ranges select the same devices in any spelling (F08 for every index set).
#[test]
fn neuron_ranges_and_lists_select_the_same_devices() {
    let profiles = profile::builtin();
    let neuron = profiles.iter().find(|p| p.name == "neuron").expect("built-in neuron profile").clone();
    check("selection-ranges", (0u32..16, 0u32..16), |(a, b)| {
        let (lo, hi) = (a.min(b), a.max(b));
        let list: Vec<String> = (lo..=hi).map(|i| i.to_string()).collect();
        let inv = inventory(&neuron, 16, Some(2));
        let sel = |value: String| {
            let env = vec![format!("AWS_NEURON_VISIBLE_DEVICES={value}")];
            request::collect(&env, &BTreeMap::new(), std::slice::from_ref(&neuron), &BTreeMap::new())
                .and_then(|r| r.vendors[0].resolve(Some(&inv)))
        };
        let by_range = sel(format!("{lo}-{hi}")).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let by_list = sel(list.join(",")).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(&by_range, &by_list);
        prop_assert_eq!(by_range, (lo..=hi).collect::<Vec<_>>());
        if lo < hi {
            let backwards = sel(format!("{hi}-{lo}")).expect_err("a backwards range is an error");
            prop_assert!(backwards.to_string().contains("runs backwards"), "{}", backwards);
        }
        Ok(())
    });
}

/// A range as wide as u32 allows must be refused (or served) at once, not expanded into billions
/// of device references: the value comes from the container image.
#[test]
fn huge_ranges_in_device_and_core_variables_return_quickly() {
    let profiles = profile::builtin();
    for value in [
        "AWS_NEURON_VISIBLE_DEVICES=0-4294967295",
        "AWS_NEURON_VISIBLE_DEVICES=1-4294967294,0",
        "NEURON_RT_VISIBLE_CORES=0-4294967295",
    ] {
        let start = Instant::now();
        let env = vec![value.to_string()];
        let result = request::collect(&env, &BTreeMap::new(), &profiles, &BTreeMap::new());
        let neuron = profiles.iter().find(|p| p.name == "neuron").expect("neuron profile");
        let resolved = result.map(|r| r.vendors[0].resolve(Some(&inventory(neuron, 12, Some(2)))));
        assert!(start.elapsed() < Duration::from_secs(1), "{value} took {:?}", start.elapsed());
        let e = match resolved {
            Err(e) | Ok(Err(e)) => e,
            Ok(Ok(idx)) => panic!("{value} selected {idx:?} on a 12-device node"),
        };
        let name = value.split_once('=').map(|(n, _)| n).unwrap_or(value);
        assert!(e.to_string().starts_with(&format!("{value}: ")) && e.variable == name, "{e}");
    }
}
