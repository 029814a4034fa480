//! A container start that asks for devices by index describes only those devices (issue 31:
//! `DiscoverOptions::only`, what a start reads follows what it asks for, not the node's size).
//! What it plans must be what planning against a full discovery of the node gives: the same
//! edits, warnings and served devices for every subset of every vendor's devices, and the same
//! error, naming the same existing devices, for an index the node lacks. On every fixture
//! (prepared with mknod: root only, skipped otherwise), and on a scaled 64-GPU DGX and
//! 64-partition MI300X CPX node.

use actk_core::discover::{self, DiscoverOptions};
use actk_core::plan::{Plan, PlanContext, plan};
use actk_core::profile;
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};

/// The subsets asked for on a vendor of `n` devices: each alone at the ends, every third,
/// out of order with a repeat, one past the end, and a large index.
fn subsets(n: u32) -> Vec<String> {
    let last = n - 1;
    let every_third: Vec<String> = (0..n).step_by(3).map(|i| i.to_string()).collect();
    vec![
        "0".into(),
        last.to_string(),
        every_third.join(","),
        format!("{last},0,{last}"),
        n.to_string(),
        format!("0,{}", n + 7),
        "4000".into(),
    ]
}

fn spec(var: &str, value: &str) -> Value {
    json!({"ociVersion": "1.0.2", "process": {"env": ["PATH=/bin", format!("{var}={value}")]}, "annotations": {}})
}

/// The plan, or its error, as text to compare.
fn outcome(r: Result<Plan, actk_core::plan::PlanError>) -> String {
    match r {
        Ok(p) => format!("{:?}\n{:?}\n{:?}", p.edits, p.warnings, p.served),
        Err(e) => format!("error: {e}"),
    }
}

fn check_root(name: &str, root: &std::path::Path) {
    let profiles = profile::builtin();
    let opts = DiscoverOptions { nvml: false, topology: false, only: BTreeMap::new() };
    let full = discover::discover_roots_with(root, root, &profiles, &opts);
    assert!(!full.vendors.is_empty(), "{name}: no vendor found");
    let lazy_ctx = PlanContext { profiles: profiles.clone(), root: root.to_path_buf(), ..Default::default() };
    let full_ctx = PlanContext { inventory: Some(full.clone()), ..lazy_ctx.clone() };
    for v in &full.vendors {
        let p = profiles.iter().find(|p| p.name == v.profile).expect("profile");
        let var = &p.selection.env[0];
        let n = v.devices.len() as u32;
        for value in subsets(n) {
            let s = spec(var, &value);
            assert_eq!(
                outcome(plan(&s, &lazy_ctx)),
                outcome(plan(&s, &full_ctx)),
                "{name}: {var}={value} planned from the devices asked for differs from the full node"
            );
        }
        // Discovery itself: the devices asked for, exactly as a full pass describes them.
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
    }
}

#[test]
fn requests_by_index_plan_as_against_the_whole_node() {
    for name in [
        "nvidia-dgx-h100",
        "nvidia-dgx-a100",
        "nvidia-h200-nvl",
        "hetero-nvidia-neuron",
        "aws-inf2-48xlarge",
        "aws-trn1-32xlarge",
        "amd-mi300x",
        "amd-mi300x-cpx",
        "gaudi2",
    ] {
        let Some(f) = actk_testsupport::fixture::prepare(name).expect("fixture") else { return };
        check_root(name, &f.root);
    }
}

/// Scaled nodes (fixtures/generate.py --devices) of 64 GPUs and of 64 partitions on 8 GPUs.
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
