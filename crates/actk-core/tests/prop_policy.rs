//! Property test of the node's trust policy (issue 29 finding 1: "one rule for every request
//! input"): over every input variable of every built-in profile (selection, cores, capabilities,
//! logical core size and device attribute variables, `NVIDIA_MIG_*_DEVICES`), `cdi.k8s.io/`
//! annotations and the device list, under every policy setting (each input `always`,
//! `privileged` or `never`, `on_refused` `warn` or `fail`, `privileged_means` either rule) and
//! every kind of container (unprivileged, `capabilities.add: [SYS_ADMIN]`, `privileged: true`),
//! on a node whose devices are served from discovery or from CDI spec files:
//!
//! 1. no untrusted input adds a device node: the nodes planned for a container are among those
//!    planned for the same container without its untrusted inputs;
//! 2. on a Kubernetes node (env and annotations untrusted for the container, the device list
//!    trusted), the nodes are those of the listed devices plus the control nodes they need, never
//!    a node reserved to a capability (NVSwitch) or a MIG management node.
//!
//! The inventory is given in memory (every built-in profile, with NVSwitch, MIG management and
//! IMEX nodes), so no host is read. Which container is privileged is computed here from the
//! container's shape, not with actk's own function.
//!
//! Cases: `PROPTEST_CASES` (default 256); counts go to `$ACTK_VERIFY_COUNTS`.

use actk_core::cdi::Registry;
use actk_core::cdi::generate::{GenerateOptions, generate, reserved_to_capabilities};
use actk_core::inventory::{Device, DeviceNode, HostFile, HostFileKind, Inventory, VendorInventory};
use actk_core::plan::{PlanContext, plan};
use actk_core::policy::{OnRefused, Policy, PrivilegedMeans, Trust};
use actk_core::profile::{self, Profile};
use actk_core::request::MIG_CAPABILITY_ENV;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::sync::Arc;

mod common;
use common::check;

fn node(path: &str, major: u32, minor: u32) -> DeviceNode {
    DeviceNode {
        host_path: path.into(),
        path: path.into(),
        node_type: 'c',
        major,
        minor,
        file_mode: Some(0o666),
        gid: None,
    }
}

fn file(cap: &str, kind: HostFileKind, path: &str) -> HostFile {
    HostFile { capability: cap.into(), kind, host_path: path.into(), container_path: path.into() }
}

/// Two devices of every built-in profile, with the nodes a real node of each has: NVIDIA's
/// control nodes, NVSwitch nodes (`fabric`) and MIG management nodes (nvidia-dgx-h100,
/// nvidia-dgx-a100 fixtures), IMEX channels, Neuron cores, AMD's /dev/kfd, Gaudi's control nodes
/// and module ids, DRM accel.
fn inventory(profiles: &[Profile]) -> Inventory {
    let mut vendors = Vec::new();
    for p in profiles {
        let dev = |i: u32, nodes: Vec<DeviceNode>| Device {
            index: i,
            uuid: Some(format!("{}-{i}aaaaaaa-0000-1111-2222-333333333333", p.name.to_ascii_uppercase())),
            nodes,
            ..Default::default()
        };
        let mut v = VendorInventory { profile: p.name.clone(), kind: p.kind.clone(), ..Default::default() };
        match p.name.as_str() {
            "nvidia" => {
                v.driver_version = Some("580.95.05".into());
                v.devices = (0..2).map(|i| dev(i, vec![node(&format!("/dev/nvidia{i}"), 195, i)])).collect();
                v.shared_nodes = vec![
                    node("/dev/nvidiactl", 195, 255),
                    node("/dev/nvidia-uvm", 510, 0),
                    node("/dev/nvidia-modeset", 195, 254),
                    node("/dev/nvidia-nvswitchctl", 507, 255),
                    node("/dev/nvidia-nvswitch0", 507, 0),
                    node("/dev/nvidia-nvswitch1", 507, 1),
                ];
                v.mig_capabilities = [
                    ("config".to_string(), node("/dev/nvidia-caps/nvidia-cap1", 236, 1)),
                    ("monitor".to_string(), node("/dev/nvidia-caps/nvidia-cap2", 236, 2)),
                ]
                .into();
                v.host_files = vec![
                    file("compute", HostFileKind::Library, "/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05"),
                    file("utility", HostFileKind::Binary, "/usr/bin/nvidia-smi"),
                    file("graphics", HostFileKind::File, "/etc/vulkan/icd.d/nvidia_icd.json"),
                ];
            }
            "nvidia-imex" => {
                v.devices = (0..2)
                    .map(|i| dev(i, vec![node(&format!("/dev/nvidia-caps-imex-channels/channel{i}"), 234, i)]))
                    .collect();
            }
            "neuron" => {
                v.devices = (0..2)
                    .map(|i| Device { cores: Some(2), ..dev(i, vec![node(&format!("/dev/neuron{i}"), 240, i)]) })
                    .collect();
                v.host_files = vec![file("utility", HostFileKind::Binary, "/opt/aws/neuron/bin/neuron-ls")];
            }
            "amd" => {
                v.devices = (0..2)
                    .map(|i| {
                        dev(
                            i,
                            vec![
                                node(&format!("/dev/dri/renderD{}", 128 + i), 226, 128 + i),
                                node(&format!("/dev/dri/card{}", i + 1), 226, i + 1),
                            ],
                        )
                    })
                    .collect();
                v.shared_nodes = vec![node("/dev/kfd", 235, 0)];
            }
            "gaudi" => {
                v.devices = (0..2)
                    .map(|i| Device {
                        attributes: [("module_id".to_string(), (3 - i).to_string())].into(),
                        ..dev(
                            i,
                            vec![
                                node(&format!("/dev/accel/accel{i}"), 261, i),
                                node(&format!("/dev/accel/accel_controlD{i}"), 508, i),
                            ],
                        )
                    })
                    .collect();
            }
            _ => {
                v.devices =
                    (0..2).map(|i| dev(i, vec![node(&format!("/dev/accel/accel{}", 10 + i), 261, 10 + i)])).collect();
            }
        }
        vendors.push(v);
    }
    Inventory { root: "/".into(), vendors, warnings: vec![] }
}

/// Every environment variable a built-in profile reads, and NVIDIA's MIG management variables.
fn input_variables(profiles: &[Profile]) -> Vec<String> {
    let mut vars: Vec<String> = profiles
        .iter()
        .flat_map(|p| {
            let s = &p.selection;
            s.env
                .iter()
                .cloned()
                .chain(s.cores_env.clone())
                .chain(s.capabilities_env.clone())
                .chain(s.logical_core_size_env.clone())
                .chain(s.device_env.iter().map(|d| d.name.clone()))
        })
        .chain(MIG_CAPABILITY_ENV.iter().map(|(v, _)| v.to_string()))
        .collect();
    vars.sort();
    vars.dedup();
    vars
}

/// Values a hostile container tries: selections, capabilities (those that add nodes too), CDI
/// names of every kind (MIG management, IMEX channels), MIG ids, odd syntax.
fn value(profiles: &[Profile]) -> impl Strategy<Value = String> {
    let words = words(profiles);
    let word = prop::sample::select(words);
    prop_oneof![
        4 => word.clone(),
        1 => prop::collection::vec(word, 2..4).prop_map(|t| t.join(",")),
        1 => ".{0,4}",
    ]
}

/// The vocabulary of [`value`].
fn words(profiles: &[Profile]) -> Vec<String> {
    let mut words: Vec<String> = [
        "all",
        "ALL",
        "none",
        "void",
        "",
        "0",
        "1",
        "0,1",
        "0-1",
        "1-0",
        "2",
        "3",
        "0:0",
        "MIG-",
        "GPU-",
        "fabric",
        "compute,fabric",
        "all,utility",
        "utility",
        "graphics,display",
        "config",
        "monitor",
        "bogus",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for p in profiles {
        for name in ["0", "1", "all", "mig-config", "mig-monitor"] {
            words.push(format!("{}={name}", p.kind));
        }
    }
    words
}

/// The kinds of container: their capabilities and device cgroup as containerd's CRI writes them.
#[derive(Debug, Clone, Copy)]
enum Container {
    Plain,
    /// `capabilities.add: [SYS_ADMIN]` without `privileged`.
    SysAdmin,
    /// `privileged: true`: every capability, every device allowed.
    Privileged,
}

impl Container {
    fn privileged_under(self, means: PrivilegedMeans) -> bool {
        match self {
            Container::Plain => false,
            Container::SysAdmin => means == PrivilegedMeans::CapSysAdmin,
            Container::Privileged => true,
        }
    }
}

fn trust() -> impl Strategy<Value = Trust> {
    prop::sample::select(vec![Trust::Always, Trust::Privileged, Trust::Never])
}

fn policy() -> impl Strategy<Value = Policy> {
    (
        trust(),
        trust(),
        trust(),
        prop::sample::select(vec![OnRefused::Warn, OnRefused::Fail]),
        prop::sample::select(vec![PrivilegedMeans::CapSysAdmin, PrivilegedMeans::PrivilegedFlag]),
    )
        .prop_map(|(env_requests, annotation_requests, mount_requests, on_refused, privileged_means)| Policy {
            env_requests,
            annotation_requests,
            mount_requests,
            on_refused,
            privileged_means,
        })
}

/// The container's config.json: a real engine's (docker 20.10), reshaped as `kind`, with `env`,
/// `annotation` (as `cdi.k8s.io/tenant`) and the device list `listed` (`<kind>/<name>`).
fn config_json(base: &Value, kind: Container, env: &[String], annotation: Option<&String>, listed: &[String]) -> Value {
    let mut spec = base.clone();
    let mut caps: Vec<&str> = vec!["CAP_CHOWN", "CAP_KILL", "CAP_NET_BIND_SERVICE"];
    let mut devices = json!([{"allow": false, "access": "rwm"}]);
    match kind {
        Container::Plain => {}
        Container::SysAdmin => caps.push("CAP_SYS_ADMIN"),
        Container::Privileged => {
            caps.extend(["CAP_MKNOD", "CAP_SYS_ADMIN", "CAP_SYS_RAWIO"]);
            devices = json!([{"allow": true, "access": "rwm"}]);
        }
    }
    spec["process"]["capabilities"] = json!({"bounding": caps, "effective": caps, "permitted": caps});
    spec["linux"]["resources"]["devices"] = devices;
    if let Some(list) = spec["process"]["env"].as_array_mut() {
        list.extend(env.iter().cloned().map(Value::from));
    }
    spec["annotations"] = match annotation {
        Some(a) => json!({"cdi.k8s.io/tenant": a}),
        None => json!({}),
    };
    let mounts = spec["mounts"].as_array_mut().expect("mounts");
    for l in listed {
        mounts.push(json!({"destination": format!("/var/run/actk/devices/{l}"), "type": "bind",
            "source": "/dev/null", "options": ["rbind", "ro"]}));
    }
    spec
}

/// The device nodes of a plan, or none when it failed (a failed start adds nothing).
fn nodes(spec: &Value, ctx: &PlanContext) -> (BTreeSet<String>, String) {
    match plan(spec, ctx) {
        Ok(p) => (p.edits.device_nodes.iter().map(|n| n.path.clone()).collect(), format!("{:?}", p.warnings)),
        Err(e) => (BTreeSet::new(), format!("error: {e}")),
    }
}

#[test]
fn no_untrusted_input_adds_a_device_node() {
    let profiles = profile::builtin();
    let inv = inventory(&profiles);
    let vars = input_variables(&profiles);
    let discovery = PlanContext {
        profiles: profiles.clone(),
        root: "/nonexistent".into(),
        inventory: Some(inv.clone()),
        ..Default::default()
    };
    // The specs `actk cdi generate` writes for the same node (every kind), served in memory.
    let mut reg = Registry::load::<std::path::PathBuf>(&[]);
    for v in &inv.vendors {
        let p = profiles.iter().find(|p| p.name == v.profile).unwrap();
        let spec = generate(p, v, &GenerateOptions::default()).expect("spec of the inventory");
        reg.add(spec, format!("/etc/cdi/{}.json", v.profile).into(), 0);
    }
    let spec_served = PlanContext { registry: Some(Arc::new(reg)), ..discovery.clone() };
    let mut base: Value =
        serde_json::from_str(include_str!("../../e2e/tests/data/realspecs/docker-20.10-gpus.json")).expect("realspec");
    // The container's inputs are all drawn below (its image's ENV among them), so that the
    // container without its untrusted inputs is this spec with none of them.
    if let Some(env) = base["process"]["env"].as_array_mut() {
        env.retain(|e| e.as_str().and_then(|e| e.split_once('=')).is_some_and(|(k, _)| !vars.iter().any(|v| v == k)));
    }
    let listable: Vec<String> =
        profiles.iter().flat_map(|p| ["0", "1", "all"].map(|n| format!("{}/{n}", p.kind))).collect();
    let env = prop::collection::vec(
        (prop::sample::select(vars.clone()), value(&profiles)).prop_map(|(k, v)| format!("{k}={v}")),
        0..5,
    );
    let container = prop::sample::select(vec![Container::Plain, Container::SysAdmin, Container::Privileged]);
    let listed = prop::sample::subsequence(listable, 0..3);
    let inputs = (policy(), container, env, prop::option::of(value(&profiles)), listed, any::<bool>());
    check("trust-policy", inputs, |(policy, kind, env, annotation, listed, from_specs)| {
        let privileged = kind.privileged_under(policy.privileged_means);
        let env_t = policy.env_requests.allows(privileged);
        let ann_t = policy.annotation_requests.allows(privileged);
        let mount_t = policy.mount_requests.allows(privileged);
        let ctx =
            PlanContext { policy: policy.clone(), ..if from_specs { spec_served.clone() } else { discovery.clone() } };
        let full = config_json(&base, kind, &env, annotation.as_ref(), &listed);
        let trusted_only = config_json(
            &base,
            kind,
            if env_t { &env } else { &[] },
            annotation.as_ref().filter(|_| ann_t),
            if mount_t { &listed } else { &[] },
        );
        let (got, said) = nodes(&full, &ctx);
        let (allowed, _) = nodes(&trusted_only, &ctx);
        let added: Vec<&String> = got.difference(&allowed).collect();
        prop_assert!(
            added.is_empty(),
            "untrusted input added {:?} (privileged {}, env {}, annotations {}, list {}): {}",
            added,
            privileged,
            env_t,
            ann_t,
            mount_t,
            said
        );
        if !env_t && !ann_t && mount_t {
            // A Kubernetes node: the listed devices' nodes and the control nodes they need.
            let mut want: BTreeSet<String> = BTreeSet::new();
            for l in &listed {
                let (kind, name) = l.rsplit_once('/').expect("kind/name");
                let v = inv.vendors.iter().find(|v| v.kind == kind).expect("vendor of the kind");
                let p = profiles.iter().find(|p| p.kind == kind).expect("profile of the kind");
                for d in v.devices.iter().filter(|d| name == "all" || d.index.to_string() == name) {
                    want.extend(d.nodes.iter().map(|n| n.path.clone()));
                }
                want.extend(
                    v.shared_nodes.iter().filter(|n| !reserved_to_capabilities(p, &n.path)).map(|n| n.path.clone()),
                );
            }
            let beyond: Vec<&String> = got.difference(&want).collect();
            prop_assert!(beyond.is_empty(), "beyond the allocation {:?}: {:?} ({})", listed, beyond, said);
        }
        Ok::<(), TestCaseError>(())
    });
}

/// The same property without sampling, on a Kubernetes node (env and annotations trusted for
/// `privileged` containers, the device list always, refusals as warnings) where device 1 of
/// every kind is allocated: every input variable of every built-in profile set to every value
/// of the vocabulary, and every `cdi.k8s.io/` annotation value, in each container that is not
/// privileged under each `privileged_means` rule, served from discovery and from spec files,
/// adds no device node to what the allocation alone gives.
#[test]
fn every_input_of_every_profile_on_a_kubernetes_node() {
    let profiles = profile::builtin();
    let inv = inventory(&profiles);
    let vars = input_variables(&profiles);
    let words = words(&profiles);
    let mut reg = Registry::load::<std::path::PathBuf>(&[]);
    for v in &inv.vendors {
        let p = profiles.iter().find(|p| p.name == v.profile).unwrap();
        reg.add(generate(p, v, &GenerateOptions::default()).unwrap(), format!("/etc/cdi/{}.json", v.profile).into(), 0);
    }
    let discovery = PlanContext {
        profiles: profiles.clone(),
        root: "/nonexistent".into(),
        inventory: Some(inv),
        ..Default::default()
    };
    let spec_served = PlanContext { registry: Some(Arc::new(reg)), ..discovery.clone() };
    let mut base: Value =
        serde_json::from_str(include_str!("../../e2e/tests/data/realspecs/docker-20.10-gpus.json")).expect("realspec");
    if let Some(env) = base["process"]["env"].as_array_mut() {
        env.retain(|e| e.as_str().and_then(|e| e.split_once('=')).is_some_and(|(k, _)| !vars.iter().any(|v| v == k)));
    }
    let listed: Vec<String> = profiles.iter().map(|p| format!("{}/1", p.kind)).collect();
    let mut tried = 0u64;
    for means in [PrivilegedMeans::CapSysAdmin, PrivilegedMeans::PrivilegedFlag] {
        let policy = Policy { privileged_means: means, ..Policy::kubernetes() };
        for kind in [Container::Plain, Container::SysAdmin].into_iter().filter(|k| !k.privileged_under(means)) {
            for (served, ctx) in [("discovery", &discovery), ("specs", &spec_served)] {
                let ctx = PlanContext { policy: policy.clone(), ..ctx.clone() };
                let (allowed, _) = nodes(&config_json(&base, kind, &[], None, &listed), &ctx);
                assert!(allowed.len() > listed.len(), "{served}: the allocation alone plans its nodes: {allowed:?}");
                let inputs = vars
                    .iter()
                    .flat_map(|v| words.iter().map(move |w| (Some(format!("{v}={w}")), None)))
                    .chain(words.iter().map(|w| (None, Some(w.clone()))));
                for (env, annotation) in inputs {
                    let env: Vec<String> = env.into_iter().collect();
                    let (got, said) = nodes(&config_json(&base, kind, &env, annotation.as_ref(), &listed), &ctx);
                    let added: Vec<&String> = got.difference(&allowed).collect();
                    assert!(
                        added.is_empty(),
                        "{served}, {kind:?}, {means:?}, {env:?} {annotation:?}: added {added:?} ({said})"
                    );
                    tried += 1;
                }
            }
        }
    }
    common::report("trust-policy-sweep", tried);
}
