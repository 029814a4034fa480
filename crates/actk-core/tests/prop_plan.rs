//! Property test of the whole path actk-runtime takes on `create` (plan.rs + edits.rs): a
//! config.json written by a real engine, with any selection variables and `cdi.k8s.io/`
//! annotations a container may carry, planned against a node with 8 NVIDIA GPUs and 12 Neuron
//! devices (an inventory given in memory, so no host is read), then applied.
//!
//! Invariants: `plan` returns a plan or an error, never panics; a request error shows as
//! `VARIABLE=value: problem` with the variable and value the container set; the planned edits
//! apply to the config.json, and applying them twice equals once; only devices of the node are
//! injected.
//!
//! Cases: `PROPTEST_CASES` (default 256); counts go to `$ACTK_VERIFY_COUNTS`.

use actk_core::edits;
use actk_core::inventory::{Device, DeviceNode, HostFile, HostFileKind, Inventory, VendorInventory};
use actk_core::plan::{PlanContext, PlanError, plan};
use actk_core::profile;
use actk_core::request;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use serde_json::Value;

mod common;
use common::check;

fn node(path: String, major: u32, minor: u32) -> DeviceNode {
    DeviceNode { host_path: path.clone().into(), path, node_type: 'c', major, minor, file_mode: Some(0o666), gid: None }
}

/// 8 GPUs (one with its node gone, as after a hot unplug) and 12 Neuron devices of 2 cores.
fn inventory() -> Inventory {
    let gpu = |i: u32| Device {
        index: i,
        uuid: Some(format!("GPU-{i}aaaaaaa-0000-1111-2222-333333333333")),
        pci_bus_id: Some(format!("0000:{:02x}:00.0", 0x18 + i)),
        nodes: if i == 5 { vec![] } else { vec![node(format!("/dev/nvidia{i}"), 195, i)] },
        ..Default::default()
    };
    let neuron = |i: u32| Device {
        index: i,
        cores: Some(2),
        nodes: vec![node(format!("/dev/neuron{i}"), 240, i)],
        ..Default::default()
    };
    let lib = |cap: &str, name: &str| HostFile {
        capability: cap.into(),
        kind: HostFileKind::Library,
        host_path: format!("/usr/lib/x86_64-linux-gnu/{name}").into(),
        container_path: format!("/usr/lib/x86_64-linux-gnu/{name}"),
    };
    Inventory {
        root: "/".into(),
        vendors: vec![
            VendorInventory {
                profile: "nvidia".into(),
                kind: "nvidia.com/gpu".into(),
                driver_version: Some("580.95.05".into()),
                devices: (0..8).map(gpu).collect(),
                shared_nodes: vec![node("/dev/nvidiactl".into(), 195, 255)],
                host_files: vec![lib("compute", "libcuda.so.580.95.05"), lib("utility", "libnvidia-ml.so.580.95.05")],
                ..Default::default()
            },
            VendorInventory {
                profile: "neuron".into(),
                kind: "aws.amazon.com/neuron".into(),
                devices: (0..12).map(neuron).collect(),
                ..Default::default()
            },
        ],
        warnings: vec![],
    }
}

fn value() -> impl Strategy<Value = String> {
    let token = prop_oneof![
        prop::sample::select(vec![
            "all",
            "none",
            "void",
            "",
            ",",
            "-",
            "5",
            "7",
            "8",
            "12",
            "0-3",
            "3-1",
            "GPU-3",
            "GPU-",
            "MIG-1",
            "0:1",
            "nvidia.com/gpu=0",
            "aws.amazon.com/neuron=1",
            "compute",
            "utility,video",
            "bogus"
        ])
        .prop_map(String::from),
        (0u32..14).prop_map(|n| n.to_string()),
        ".{0,4}",
    ];
    prop::collection::vec(token, 0..5).prop_map(|t| t.join(","))
}

#[test]
fn any_request_on_a_real_config_json_plans_and_applies_or_names_the_variable() {
    let profiles = profile::builtin();
    let mut vars: Vec<String> = profiles
        .iter()
        .flat_map(|p| {
            p.selection
                .env
                .iter()
                .cloned()
                .chain(p.selection.cores_env.clone())
                .chain(p.selection.capabilities_env.clone())
        })
        .collect();
    vars.sort();
    vars.dedup();
    let ctx = PlanContext {
        profiles,
        root: "/nonexistent".into(),
        spec_dirs: vec![],
        inventory: Some(inventory()),
        ..Default::default()
    };
    let base: Value =
        serde_json::from_str(include_str!("../../e2e/tests/data/realspecs/docker-20.10-gpus.json")).expect("realspec");
    let env = prop::collection::vec((prop::sample::select(vars), value()).prop_map(|(k, v)| format!("{k}={v}")), 0..4);
    let ann = prop::option::of(value());
    check("plan+apply", (env, ann), |(env, ann)| {
        let mut spec = base.clone();
        if let Some(list) = spec["process"]["env"].as_array_mut() {
            list.extend(env.iter().cloned().map(Value::from));
        }
        if let Some(a) = &ann {
            spec["annotations"] = serde_json::json!({ "cdi.k8s.io/test": a });
        }
        let all_env: Vec<String> = spec["process"]["env"]
            .as_array()
            .map(|a| a.iter().filter_map(|v| v.as_str().map(String::from)).collect())
            .unwrap_or_default();
        match plan(&spec, &ctx) {
            Ok(p) => {
                let mut once = spec.clone();
                edits::apply(&mut once, &p.edits)
                    .map_err(|e| TestCaseError::fail(format!("planned edits do not apply: {e}")))?;
                let mut twice = once.clone();
                edits::apply(&mut twice, &p.edits).map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert_eq!(&twice, &once);
                for n in &p.edits.device_nodes {
                    let known = n.path == "/dev/nvidiactl"
                        || n.path
                            .strip_prefix("/dev/nvidia")
                            .and_then(|i| i.parse::<u32>().ok())
                            .is_some_and(|i| i < 8 && i != 5)
                        || n.path
                            .strip_prefix("/dev/neuron")
                            .and_then(|i| i.parse::<u32>().ok())
                            .is_some_and(|i| i < 12);
                    prop_assert!(known, "injected {} which the node does not have", n.path);
                }
            }
            Err(PlanError::Request(e)) => {
                let shown = e.to_string();
                prop_assert!(
                    shown.starts_with(&format!("{}={}: ", e.variable, request::shorten(&e.value))),
                    "{}",
                    shown
                );
                match e.variable.strip_prefix("annotation ") {
                    Some(_) => prop_assert_eq!(Some(&e.value), ann.as_ref()),
                    None => {
                        prop_assert_eq!(request::env_value(&all_env, &e.variable), Some(e.value.as_str()), "{}", shown)
                    }
                }
            }
            // CDI names no spec defines (there are no spec dirs): the error names where they came from.
            Err(e @ PlanError::UnknownCdiDevice { .. }) => {
                let shown = e.to_string();
                prop_assert!(
                    shown.contains("NVIDIA_VISIBLE_DEVICES")
                        || shown.contains("AWS_NEURON")
                        || shown.contains("annotation")
                        || shown.contains('_'),
                    "{}",
                    shown
                );
            }
            Err(e) => return Err(TestCaseError::fail(format!("unexpected error kind: {e}"))),
        }
        Ok(())
    });
}

/// The trust policy of a Kubernetes node (issue 10): whatever an unprivileged container's env and
/// `cdi.k8s.io/` annotations say, the devices injected are the device list's (the kubelet's
/// allocation) and nothing else. No selection variable or annotation fails the start (they are
/// refused unparsed); a malformed capabilities variable does, naming it, since capabilities still
/// choose the driver files of the allocated devices.
#[test]
fn on_a_kubernetes_node_env_and_annotations_never_widen_the_device_list() {
    let profiles = profile::builtin();
    let mut vars: Vec<String> = profiles
        .iter()
        .flat_map(|p| {
            p.selection
                .env
                .iter()
                .cloned()
                .chain(p.selection.cores_env.clone())
                .chain(p.selection.capabilities_env.clone())
        })
        .collect();
    vars.sort();
    vars.dedup();
    let ctx = PlanContext {
        profiles,
        root: "/nonexistent".into(),
        inventory: Some(inventory()),
        policy: actk_core::policy::Policy::kubernetes(),
        ..Default::default()
    };
    let base: Value =
        serde_json::from_str(include_str!("../../e2e/tests/data/realspecs/docker-20.10-gpus.json")).expect("realspec");
    // GPU 5 has no node (unplugged): a device list naming it must fail with the list named.
    let gpus = prop::collection::btree_set(prop::sample::select(vec![0u32, 1, 2, 3, 4, 6, 7]), 0..4);
    let neurons = prop::collection::btree_set(0u32..12, 0..3);
    let env = prop::collection::vec((prop::sample::select(vars), value()).prop_map(|(k, v)| format!("{k}={v}")), 0..4);
    let ann = prop::option::of(value());
    check("kubernetes-policy", (env, ann, gpus, neurons), |(env, ann, gpus, neurons)| {
        let mut spec = base.clone();
        if let Some(list) = spec["process"]["env"].as_array_mut() {
            list.extend(env.iter().cloned().map(Value::from));
        }
        if let Some(a) = &ann {
            spec["annotations"] = serde_json::json!({ "cdi.k8s.io/test": a });
        }
        // The Docker spec's bounding set has no CAP_SYS_ADMIN: an unprivileged container.
        let mounts = spec["mounts"].as_array_mut().expect("mounts");
        let listed = gpus
            .iter()
            .map(|g| format!("nvidia.com/gpu/{g}"))
            .chain(neurons.iter().map(|n| format!("aws.amazon.com/neuron/{n}")));
        for l in listed {
            mounts.push(serde_json::json!({"destination": format!("/var/run/actk/devices/{l}"), "type": "bind",
                "source": "/dev/null", "options": ["rbind", "ro"]}));
        }
        let p = match plan(&spec, &ctx) {
            Ok(p) => p,
            Err(PlanError::Request(e)) if e.variable.ends_with("_CAPABILITIES") => return Ok(()),
            Err(e) => {
                return Err(TestCaseError::fail(format!("a container's env or annotations failed the start: {e}")));
            }
        };
        let mut want: Vec<String> = gpus
            .iter()
            .map(|g| format!("/dev/nvidia{g}"))
            .chain(neurons.iter().map(|n| format!("/dev/neuron{n}")))
            .collect();
        if !gpus.is_empty() {
            want.push("/dev/nvidiactl".into());
        }
        want.sort();
        let mut got: Vec<String> = p.edits.device_nodes.iter().map(|n| n.path.clone()).collect();
        got.sort();
        prop_assert_eq!(got, want);
        Ok(())
    });
}
