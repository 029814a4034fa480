//! Property tests of the DRA driver's opaque claim parameters (`actk_dra::config`): the
//! `DeviceConfig` a ResourceClaim or DeviceClass gives (`opaque.parameters`, written by any
//! user who can create a claim), read at NodePrepareResources.
//!
//! Invariants:
//! - any JSON as parameters gives a `DeviceConfig` or an error that names the field (the
//!   `field` prefix the driver passes); never a panic;
//! - what is accepted keeps every rule the module states: apiVersion and kind exact, `mps` only
//!   with strategy MPS, activeThreadPercentage 1..100, pinnedMemoryLimit a whole nonzero byte
//!   quantity, logicalCoreSize 1 or 2; and a well-formed config is accepted with its values;
//! - `quantity_bytes` of a number and a suffix is the number times the suffix's multiplier,
//!   `None` past u64, and any text gives a value or `None`, never a panic;
//! - `for_request` over any list of entries equals the rule stated directly: the entries of
//!   driver actk.dev that apply to the request (no `requests`, an empty list, the request or
//!   its base request named), in order; the first applying entry that is not valid is the
//!   error, naming its index; otherwise a later entry's `sharing` or `neuron` replaces an
//!   earlier one's, where an entry for every request (no `requests`, an empty list) has no
//!   MPS `sharing` when `Skip::mps` is set and no `neuron` when `Skip::neuron` is.
//!
//! Cases per property: `PROPTEST_CASES` (default 256); counts go to `$ACTK_VERIFY_COUNTS`.

use actk_dra::config::{API_VERSION, DeviceConfig, KIND, Skip, Strategy as Sharing, for_request, quantity_bytes};
use k8s_openapi::api::resource::v1::{DeviceAllocationConfiguration, OpaqueDeviceConfiguration};
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use proptest::prelude::*;
use serde_json::{Map, Value, json};

#[path = "../../actk-core/tests/common/mod.rs"]
mod common;
use common::check;

/// Keys of the parameters at every level, and some that are not.
fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::sample::select(vec![
            "apiVersion", "kind", "sharing", "strategy", "mps", "activeThreadPercentage",
            "pinnedMemoryLimit", "neuron", "logicalCoreSize",
        ])
        .prop_map(String::from),
        1 => "[a-zA-Z]{1,8}",
    ]
}

/// Values the fields take, well-formed or not, and any JSON.
fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        prop::sample::select(vec![-1i64, 0, 1, 2, 3, 99, 100, 101]).prop_map(Value::from),
        (-3i64..120).prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(Value::from),
        prop::sample::select(vec![
            API_VERSION,
            KIND,
            "actk.dev/v2",
            "TimeSlicing",
            "MPS",
            "Spatial",
            "20Gi",
            "1.5Gi",
            "0",
            "100m",
            "131072e3",
            "1e30",
            "",
        ])
        .prop_map(Value::from),
        ".{0,10}".prop_map(Value::String),
    ]
}

/// Parameters: an object of known and unknown keys, a few levels deep, often with the right
/// apiVersion and kind so that the checks past them are reached.
fn parameters() -> impl Strategy<Value = Value> {
    let tree = leaf().prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
            prop::collection::vec((key(), inner), 0..4).prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    });
    (tree, any::<bool>()).prop_map(|(v, head)| match v {
        Value::Object(mut m) if head => {
            m.insert("apiVersion".into(), API_VERSION.into());
            m.insert("kind".into(), KIND.into());
            Value::Object(m)
        }
        other => other,
    })
}

/// What a well-formed config says of sharing: MPS or not, the thread percentage, the memory
/// limit in bytes.
type SharingSaid = Option<(bool, Option<u32>, Option<u64>)>;

/// A well-formed config, what it says of sharing, and its logical core size.
fn well_formed() -> impl Strategy<Value = (Value, SharingSaid, Option<u32>)> {
    let mps = (prop::option::of(1u32..=100), prop::option::of((1u64..1 << 20, 0usize..3)));
    (prop::option::of((any::<bool>(), prop::option::of(mps))), prop::option::of(prop::option::of(1u32..=2))).prop_map(
        |(sharing, neuron)| {
            let mut v = json!({"apiVersion": API_VERSION, "kind": KIND});
            let mut want_sharing = None;
            if let Some((is_mps, mps)) = sharing {
                let mut s = Map::new();
                s.insert("strategy".into(), (if is_mps { "MPS" } else { "TimeSlicing" }).into());
                let (mut pct, mut bytes) = (None, None);
                if let Some((p, q)) = mps.filter(|_| is_mps) {
                    let mut m = Map::new();
                    if let Some(p) = p {
                        m.insert("activeThreadPercentage".into(), p.into());
                        pct = Some(p);
                    }
                    if let Some((n, unit)) = q {
                        let (suffix, mult) = [("", 1u64), ("Mi", 1 << 20), ("G", 1_000_000_000)][unit];
                        m.insert("pinnedMemoryLimit".into(), format!("{n}{suffix}").into());
                        bytes = Some(n * mult);
                    }
                    s.insert("mps".into(), Value::Object(m));
                }
                v["sharing"] = Value::Object(s);
                want_sharing = Some((is_mps, pct, bytes));
            }
            if let Some(n) = neuron {
                v["neuron"] = n.map_or(json!({}), |n| json!({"logicalCoreSize": n}));
            }
            (v, want_sharing, neuron.flatten())
        },
    )
}

/// The rules a config the driver accepted must keep.
fn keeps_the_rules(c: &DeviceConfig) -> Result<(), String> {
    if c.api_version != API_VERSION || c.kind != KIND {
        return Err(format!("accepted apiVersion {:?} kind {:?}", c.api_version, c.kind));
    }
    if let Some(s) = &c.sharing
        && let Some(m) = &s.mps
    {
        if s.strategy != Sharing::Mps {
            return Err("accepted mps without strategy MPS".into());
        }
        if m.active_thread_percentage.is_some_and(|p| !(1..=100).contains(&p)) {
            return Err(format!("accepted activeThreadPercentage {:?}", m.active_thread_percentage));
        }
        if let Some(q) = &m.pinned_memory_limit
            && quantity_bytes(&q.0).is_none_or(|b| b == 0)
        {
            return Err(format!("accepted pinnedMemoryLimit {:?}", q.0));
        }
    }
    if let Some(n) = c.neuron.as_ref().and_then(|n| n.logical_core_size)
        && !(1..=2).contains(&n)
    {
        return Err(format!("accepted logicalCoreSize {n}"));
    }
    Ok(())
}

/// A well-formed config with one field set to another value (of any type, in range or not),
/// or with an unknown key added at one level: inputs that reach each check past the first.
fn near_valid() -> impl Strategy<Value = Value> {
    const PATHS: &[&[&str]] = &[
        &["sharing", "strategy"],
        &["sharing", "mps"],
        &["sharing", "mps", "activeThreadPercentage"],
        &["sharing", "mps", "pinnedMemoryLimit"],
        &["neuron"],
        &["neuron", "logicalCoreSize"],
        &["apiVersion"],
        &["kind"],
    ];
    // Mostly the numbers at the edges of each field's range.
    let value = prop_oneof![
        3 => prop::sample::select(vec![-1i64, 0, 1, 2, 3, 99, 100, 101]).prop_map(Value::from),
        1 => leaf(),
    ];
    (well_formed(), 0..PATHS.len(), value, any::<bool>()).prop_map(|((mut v, _, _), at, value, mps)| {
        if mps {
            v["sharing"] = json!({"strategy": "MPS", "mps": {}});
        }
        let path = PATHS[at];
        let mut cur = &mut v;
        for k in &path[..path.len() - 1] {
            if !cur[*k].is_object() {
                cur[*k] = json!({});
            }
            cur = &mut cur[*k];
        }
        cur[path[path.len() - 1]] = value;
        v
    })
}

#[test]
fn any_parameters_give_a_checked_config_or_an_error_naming_the_field() {
    let strategy = prop_oneof![1 => parameters(), 2 => near_valid()];
    check("dra-device-config", strategy, |p| {
        match DeviceConfig::parse(&p, "claim.opaque.parameters") {
            Ok(c) => keeps_the_rules(&c).map_err(|e| TestCaseError::fail(format!("{e}: {p}")))?,
            Err(e) => prop_assert!(e.starts_with("claim.opaque.parameters"), "error does not name the field: {e}"),
        }
        Ok(())
    });
}

#[test]
fn a_well_formed_config_is_accepted_with_its_values() {
    check("dra-device-config-valid", well_formed(), |(v, sharing, neuron)| {
        let c = DeviceConfig::parse(&v, "p").map_err(|e| TestCaseError::fail(format!("{e}: {v}")))?;
        match (&c.sharing, sharing) {
            (None, None) => {}
            (Some(s), Some((is_mps, pct, bytes))) => {
                prop_assert_eq!(s.strategy == Sharing::Mps, is_mps);
                let m = s.mps.clone().unwrap_or_default();
                prop_assert_eq!(m.active_thread_percentage, pct);
                prop_assert_eq!(m.pinned_memory_limit.and_then(|q| quantity_bytes(&q.0)), bytes);
            }
            (got, want) => prop_assert!(false, "sharing {:?}, wanted {:?}", got, want),
        }
        prop_assert_eq!(c.neuron.and_then(|n| n.logical_core_size), neuron);
        Ok(())
    });
}

#[test]
fn quantities_are_the_number_times_the_suffix() {
    const SUFFIXES: &[(&str, u64)] = &[
        ("", 1),
        ("k", 1_000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
        ("T", 1_000_000_000_000),
        ("P", 1_000_000_000_000_000),
        ("E", 1_000_000_000_000_000_000),
        ("Ki", 1 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("Pi", 1 << 50),
        ("Ei", 1 << 60),
    ];
    let strategy = (any::<u64>(), 0..SUFFIXES.len(), 0u32..25, ".{0,8}");
    check("dra-quantity-bytes", strategy, |(n, s, exp, junk)| {
        let (suffix, mult) = SUFFIXES[s];
        prop_assert_eq!(quantity_bytes(&format!("{n}{suffix}")), n.checked_mul(mult));
        let e = 10u64.checked_pow(exp).and_then(|p| n.checked_mul(p));
        prop_assert_eq!(quantity_bytes(&format!("{n}e{exp}")), e);
        // Any text: a value or None, and a value only for a plain whole quantity.
        if let Some(b) = quantity_bytes(&junk) {
            prop_assert!(junk.trim().starts_with(|c: char| c.is_ascii_digit()), "{:?} gave {}", junk, b);
        }
        Ok(())
    });
}

/// One config entry: its driver (actk.dev or another), its `requests`, and parameters that are
/// valid (sharing, neuron or both, given) or not.
fn entry() -> impl Strategy<Value = DeviceAllocationConfiguration> {
    let requests = prop::option::of(prop::collection::vec(
        prop::sample::select(vec!["gpu", "gpu/small", "gpu/large", "tpu", "other"]).prop_map(String::from),
        0..3,
    ));
    let params = prop_oneof![
        3 => (prop::option::of(any::<bool>()), prop::option::of(1u32..=2)).prop_map(|(s, n)| {
            let mut v = json!({"apiVersion": API_VERSION, "kind": KIND});
            if let Some(mps) = s {
                v["sharing"] = json!({"strategy": if mps { "MPS" } else { "TimeSlicing" }});
            }
            if let Some(n) = n {
                v["neuron"] = json!({"logicalCoreSize": n});
            }
            v
        }),
        1 => parameters(),
    ];
    (any::<bool>(), any::<bool>(), requests, params).prop_map(|(ours, class, requests, p)| {
        DeviceAllocationConfiguration {
            source: (if class { "FromClass" } else { "FromClaim" }).into(),
            requests,
            opaque: Some(OpaqueDeviceConfiguration {
                driver: (if ours { "actk.dev" } else { "gpu.example.com" }).into(),
                parameters: RawExtension(p),
            }),
        }
    })
}

#[test]
fn for_request_equals_the_rule_stated_directly() {
    let strategy = (
        prop::collection::vec(entry(), 0..5),
        prop::sample::select(vec!["gpu", "gpu/small", "tpu", "none"]),
        any::<(bool, bool)>(),
    );
    check("dra-config-for-request", strategy, |(configs, request, (mps, neuron))| {
        let skip = Skip { mps, neuron };
        let base = request.split_once('/').map_or(request, |(b, _)| b);
        let mut want: Result<Option<DeviceConfig>, usize> = Ok(None);
        for (i, c) in configs.iter().enumerate() {
            let o = c.opaque.as_ref().expect("the strategy gives every entry parameters");
            let every = c.requests.as_ref().is_none_or(|r| r.is_empty());
            let applies = o.driver == "actk.dev"
                && c.requests.as_ref().is_none_or(|r| r.is_empty() || r.iter().any(|r| r == request || r == base));
            if !applies {
                continue;
            }
            match DeviceConfig::parse(&o.parameters.0, "x") {
                Err(_) => {
                    want = Err(i);
                    break;
                }
                Ok(mut c) => {
                    if every && skip.mps && c.sharing.as_ref().is_some_and(|s| s.strategy == Sharing::Mps) {
                        c.sharing = None;
                    }
                    if every && skip.neuron {
                        c.neuron = None;
                    }
                    let Ok(prev) = &mut want else { unreachable!("an error ends the loop") };
                    match prev {
                        None => *prev = Some(c),
                        Some(p) => {
                            if c.sharing.is_some() {
                                p.sharing = c.sharing;
                            }
                            if c.neuron.is_some() {
                                p.neuron = c.neuron;
                            }
                        }
                    }
                }
            }
        }
        match (for_request(&configs, request, skip), want) {
            (Ok(got), Ok(want)) => prop_assert_eq!(got, want),
            (Err(e), Err(i)) => {
                let at = format!("status.allocation.devices.config[{i}].opaque.parameters");
                prop_assert!(e.starts_with(&at), "error {e:?} does not name entry {i}");
            }
            (got, want) => prop_assert!(false, "for_request gave {:?}, the rule {:?}", got, want),
        }
        Ok(())
    });
}
