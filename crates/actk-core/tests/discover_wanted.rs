//! A container start that asks for devices by index describes only those devices (issue 31:
//! `DiscoverOptions::only`, what a start reads follows what it asks for, not the node's size).
//! What it plans must be what planning against a full discovery of the node gives: the same
//! edits, warnings and served devices, or the same error naming the same existing devices.
//! Checked on every fixture (`fixture::ALL`, prepared with mknod: root only, skipped
//! otherwise) and on scaled nodes (fixtures/generate.py --devices), for a table of requests
//! per vendor (each device alone at the ends, every third, out of order with repeats, past the
//! end, `all`, `none`, `void`, empty, by UUID, UUID and index mixed), every pair of vendors of a
//! node asked at once, and random index lists (proptest, `PROPTEST_CASES`, default 256 over
//! all vendors). Discovery itself is compared too: the devices asked for, field for field as a
//! full pass describes them, with the same host files and control nodes; a profile nobody
//! asked for is not looked at; the devices' identity alone (`attributes_only`) has each
//! device's node and named attributes as the full pass. With the node's CDI spec files, the
//! same holds for requests the files serve, by variable and by CDI name (`check_specs`).

use actk_core::discover::{self, DiscoverOptions};
use actk_core::inventory::Inventory;
use actk_core::plan::{Plan, PlanContext, plan};
use actk_core::profile::{self, Profile};
use proptest::prelude::*;
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};

mod common;

/// The requests of the table for a vendor of `n` devices, the first device's UUID if any.
fn table(n: u32, uuid0: Option<&str>) -> Vec<String> {
    let last = n.saturating_sub(1);
    let every_third: Vec<String> = (0..n).step_by(3).map(|i| i.to_string()).collect();
    let mut out = vec![
        "0".into(),
        last.to_string(),
        every_third.join(","),
        format!("{last},0,{last}"),
        n.to_string(),
        format!("0,{}", n + 7),
        "4000".into(),
        "all".into(),
        "none".into(),
        "void".into(),
        String::new(),
    ];
    if let Some(u) = uuid0 {
        out.push(u.to_string());
        out.push(format!("{u},{last}"));
    }
    out
}

fn spec(env: &[(String, String)]) -> Value {
    let mut vars = vec!["PATH=/bin".to_string()];
    vars.extend(env.iter().map(|(k, v)| format!("{k}={v}")));
    json!({"ociVersion": "1.0.2", "process": {"env": vars}, "annotations": {}})
}

/// The plan, or its error, as text to compare.
fn outcome(r: Result<Plan, actk_core::plan::PlanError>) -> String {
    match r {
        Ok(p) => format!("{:?}\n{:?}\n{:?}", p.edits, p.warnings, p.served),
        Err(e) => format!("error: {e}"),
    }
}

/// Planning `env` with discovery of what it asks for equals planning it against `full`.
///
/// Returns the outcome, as text.
fn same_plan(
    name: &str,
    root: &std::path::Path,
    profiles: &[Profile],
    full: &Inventory,
    env: &[(String, String)],
) -> String {
    let lazy = PlanContext { profiles: profiles.to_vec(), root: root.to_path_buf(), ..Default::default() };
    let whole = PlanContext { inventory: Some(full.clone()), ..lazy.clone() };
    let s = spec(env);
    let got = outcome(plan(&s, &lazy));
    assert_eq!(
        got,
        outcome(plan(&s, &whole)),
        "{name}: {env:?} planned from the devices asked for differs from the full node"
    );
    got
}

/// Each vendor's selection variable, device count and first UUID on `full`.
fn vendors(profiles: &[Profile], full: &Inventory) -> Vec<(Profile, String, u32, Option<String>)> {
    full.vendors
        .iter()
        .map(|v| {
            let p = profiles.iter().find(|p| p.name == v.profile).expect("profile").clone();
            let var = p.selection.env[0].clone();
            (p, var, v.devices.len() as u32, v.devices.first().and_then(|d| d.uuid.clone()))
        })
        .collect()
}

fn check_root(name: &str, root: &std::path::Path) {
    let profiles = profile::builtin();
    let opts = DiscoverOptions { nvml: false, topology: false, ..Default::default() };
    let full = discover::discover_roots_with(root, root, &profiles, &opts);
    let found = vendors(&profiles, &full);
    if found.is_empty() {
        // A node without devices: every vendor's request by index fails alike.
        for p in &profiles {
            for value in ["0", "0,1"] {
                same_plan(name, root, &profiles, &full, &[(p.selection.env[0].clone(), value.into())]);
            }
        }
        return;
    }
    for (p, var, n, uuid0) in &found {
        for value in table(*n, uuid0.as_deref()) {
            let got = same_plan(name, root, &profiles, &full, &[(var.clone(), value.clone())]);
            // The comparison is not between two failures: a device that is there is served.
            if value == "0" && *n > 0 {
                assert!(got.contains("device_nodes: [DeviceNode"), "{name}: {var}=0 served no device node: {got}");
            }
        }
        if *n == 0 {
            continue;
        }
        // Discovery itself: the devices asked for, exactly as a full pass describes them.
        let v = full.vendor(&p.name).expect("vendor");
        let wanted: BTreeSet<u32> = [0, n / 2, n - 1].into();
        let only = DiscoverOptions { only: BTreeMap::from([(p.name.clone(), wanted.clone())]), ..opts.clone() };
        let part = discover::discover_roots_with(root, root, &profiles, &only);
        let got = part.vendor(&p.name).expect("vendor asked for");
        let want: Vec<_> = v.devices.iter().filter(|d| wanted.contains(&d.index)).collect();
        assert_eq!(got.devices.iter().collect::<Vec<_>>(), want, "{name}: {} devices {wanted:?}", p.name);
        assert_eq!(got.host_files, v.host_files, "{name}: {} files", p.name);
        assert_eq!(got.shared_nodes, v.shared_nodes, "{name}: {} control nodes", p.name);
        // A profile nobody asked for is not looked at.
        let none = DiscoverOptions { only: BTreeMap::from([(p.name.clone(), BTreeSet::new())]), ..opts.clone() };
        assert!(discover::discover_roots_with(root, root, &profiles, &none).vendor(&p.name).is_none());
        // The devices' identity alone: each device asked for, with its node and the attributes
        // named as a full pass reads them; no host files, control nodes or other nodes.
        let attrs: BTreeSet<String> =
            profiles.iter().flat_map(|p| &p.selection.device_env).map(|e| e.attribute.clone()).collect();
        let identity = DiscoverOptions { attributes_only: Some(attrs.clone()), ..only.clone() };
        let part = discover::discover_roots_with(root, root, &profiles, &identity);
        let got = part.vendor(&p.name).expect("vendor asked for");
        assert!(got.host_files.is_empty() && got.shared_nodes.is_empty(), "{name}: {} identity only", p.name);
        assert_eq!(got.devices.len(), want.len(), "{name}: {} identity of {wanted:?}", p.name);
        for (g, w) in got.devices.iter().zip(&want) {
            assert_eq!((g.index, g.nodes.first()), (w.index, w.nodes.first()), "{name}: {}", p.name);
            // The UUID too: a spec may name devices by it, and the names are matched on it.
            assert_eq!(g.uuid, w.uuid, "{name}: {} device {} uuid", p.name, w.index);
            for a in &attrs {
                assert_eq!(g.attributes.get(a), w.attributes.get(a), "{name}: {} device {} {a}", p.name, w.index);
            }
        }
    }
    check_specs(name, root, &profiles, &full, &found);
    // Two vendors of one node at once: both by index, and one by index with the other all.
    for (i, (_, a, na, _)) in found.iter().enumerate() {
        for (_, b, nb, _) in found.iter().skip(i + 1) {
            same_plan(
                name,
                root,
                &profiles,
                &full,
                &[(a.clone(), na.saturating_sub(1).to_string()), (b.clone(), "0".into())],
            );
            same_plan(name, root, &profiles, &full, &[(a.clone(), "0".into()), (b.clone(), "all".into())]);
            same_plan(name, root, &profiles, &full, &[(a.clone(), "0".into()), (b.clone(), format!("{nb}"))]);
        }
    }
    // Random index lists, up to two past the last device.
    let max = found.iter().map(|(_, _, n, _)| *n).max().unwrap_or(1);
    let strategy = (0..found.len(), prop::collection::vec(0..max + 2, 1..8));
    common::check(&format!("discover_wanted {name}"), strategy, |(v, idx)| {
        let (_, var, n, _) = &found[v];
        let value: Vec<String> = idx.iter().map(|i| (i % (n + 2)).to_string()).collect();
        same_plan(name, root, &profiles, &full, &[(var.clone(), value.join(","))]);
        Ok(())
    });
}

/// With the node's CDI spec files (`actk cdi generate`'s, from `full`), requests the files
/// serve plan as against the whole node too: by selection variable, and by CDI name in an
/// annotation as the device plugin hands devices out. A profile's device variables
/// (HABANA_VISIBLE_MODULES) come from the attributes of the devices named, which a start
/// discovers alone (`DiscoverOptions::attributes_only`).
fn check_specs(
    name: &str,
    root: &std::path::Path,
    profiles: &[Profile],
    full: &Inventory,
    found: &[(Profile, String, u32, Option<String>)],
) {
    let dir = tempfile::tempdir().expect("tempdir");
    let specs = actk_core::cdi::generate::generate_all(profiles, full, None, &Default::default()).expect("specs");
    for s in &specs {
        actk_core::cdi::write::write_spec_in_dir(s, dir.path(), actk_core::cdi::validate::Format::Json).expect("write");
    }
    let lazy = PlanContext {
        profiles: profiles.to_vec(),
        root: root.to_path_buf(),
        spec_dirs: vec![dir.path().to_path_buf()],
        ..Default::default()
    };
    let whole = PlanContext { inventory: Some(full.clone()), ..lazy.clone() };
    let same = |s: &Value, what: &str| {
        let got = outcome(plan(s, &lazy));
        assert_eq!(got, outcome(plan(s, &whole)), "{name}: {what} planned from the devices asked for differs");
        got
    };
    for (p, var, n, uuid0) in found {
        let Some(spec) = specs.iter().find(|s| s.kind == p.kind) else { continue };
        for value in table(*n, uuid0.as_deref()) {
            same(&self::spec(&[(var.clone(), value.clone())]), &format!("{var}={value} with spec files"));
        }
        let names: Vec<&str> = spec.devices.iter().map(|d| d.name.as_str()).collect();
        let (first, last) = (names[0], names[names.len() - 1]);
        let mut asks = vec![vec![first], vec![last, first], names.iter().copied().step_by(3).collect()];
        if names.contains(&"all") {
            asks.push(vec!["all"]);
        }
        for ask in asks {
            let value: Vec<String> = ask.iter().map(|d| format!("{}={d}", p.kind)).collect();
            let s = json!({"ociVersion": "1.0.2", "process": {"env": ["PATH=/bin"]},
                "annotations": {"cdi.k8s.io/test": value.join(",")}});
            let got = same(&s, &format!("CDI names {value:?}"));
            if !p.selection.device_env.is_empty() && ask != ["all"] {
                // The variable is set: the attributes of the named devices were found.
                for e in &p.selection.device_env {
                    assert!(got.contains(&format!("\"{}=", e.name)), "{name}: {value:?} set no {}: {got}", e.name);
                }
            }
        }
    }
}

#[test]
fn requests_by_index_plan_as_against_the_whole_node() {
    for name in actk_testsupport::fixture::ALL {
        let Some(f) = actk_testsupport::fixture::prepare(name).expect("fixture") else { return };
        check_root(name, &f.root);
    }
}

/// Scaled nodes (fixtures/generate.py --devices): 64 NVIDIA GPUs, 24 Gaudi2 and 32 Trainium
/// devices (the committed MI300X CPX fixture already has 64 partitions).
#[test]
fn requests_by_index_plan_as_against_the_whole_node_on_scaled_nodes() {
    if !nix_root() {
        println!("skipping: scaled fixtures need root for mknod");
        return;
    }
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    for (fixture, n) in [("nvidia-dgx-h100", 64), ("gaudi2", 24), ("aws-trn1-32xlarge", 32)] {
        let tmp = tempfile::tempdir().expect("tempdir");
        let src = tmp.path().join("src");
        let root = tmp.path().join("root");
        let ok = std::process::Command::new("python3")
            .arg(repo.join("fixtures/generate.py"))
            .args(["--devices", &n.to_string(), "--out"])
            .arg(&src)
            .arg(fixture)
            .status()
            .expect("python3")
            .success()
            && std::process::Command::new("sh")
                .arg(repo.join("fixtures/prepare.sh"))
                .arg(&src)
                .arg(&root)
                .stdout(std::process::Stdio::null())
                .status()
                .expect("sh")
                .success();
        assert!(ok, "cannot make the scaled {fixture} node of {n}");
        check_root(&format!("{fixture} x{n}"), &root);
    }
}

fn nix_root() -> bool {
    rustix::process::geteuid().is_root()
}
