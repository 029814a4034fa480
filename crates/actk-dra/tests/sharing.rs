//! Claims that share a device (KEP-5075 consumable capacity: allocation results with a
//! `shareID` and `consumedCapacity`) and `actk.dev/v1` DeviceConfig parameters, prepared by the
//! driver on fixture nodes with claims from an in-memory API, as the scheduler allocates them.
//!
//! What a container of each claim would get is read from the claim's CDI spec: the cores
//! variable of a Neuron claim that consumed cores (disjoint between claims, freed at unprepare,
//! kept across a driver restart), the MPS client environment and mounts of an NVIDIA claim
//! that asked for MPS, nothing extra for time-slicing, and errors that name the field of a bad
//! parameter and leave nothing behind.

use actk_core::cdi::spec::Spec;
use actk_dra::claim::{ClaimRef, MpsNode, SpecOptions};
use actk_dra::driver::{Driver, MemoryClaims};
use actk_testsupport::fixture;
use k8s_openapi::api::resource::v1::ResourceClaim;
use serde_json::{Value, json};
use std::path::Path;
use std::sync::Arc;
use tokio::sync::watch;

const NODE: &str = "node-a";

fn uid(n: u32) -> String {
    format!("5a7e0000-{n:04x}-4d5e-8f90-a1b2c3d4e5f6")
}

fn want(n: u32) -> ClaimRef {
    ClaimRef { namespace: "ns".into(), uid: uid(n), name: format!("c{n}") }
}

/// Claim `n`, allocated `results` (request, device, consumed capacity or null) and `config`.
fn claim(n: u32, results: &[(&str, &str, Value)], config: Value) -> ResourceClaim {
    let results: Vec<Value> = results
        .iter()
        .enumerate()
        .map(|(i, (req, dev, consumed))| {
            let mut r = json!({"request": req, "driver": "actk.dev", "pool": NODE, "device": dev});
            if !consumed.is_null() {
                r["shareID"] = json!(format!("7c5f0a1e-0000-4000-8000-0000000000{n:01x}{i}"));
                r["consumedCapacity"] = consumed.clone();
            }
            r
        })
        .collect();
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"namespace": "ns", "name": format!("c{n}"), "uid": uid(n)},
        "spec": {"devices": {"requests": []}},
        "status": {"allocation": {"devices": {"results": results, "config": config}}}
    }))
    .unwrap()
}

fn driver(root: &Path, dir: &Path, claims: Arc<MemoryClaims>, mps: Option<MpsNode>) -> Driver {
    let profiles = actk_core::profile::builtin();
    let inv = actk_core::discover::discover(root, &profiles);
    let (tx, rx) = watch::channel(Arc::new(inv));
    std::mem::forget(tx);
    Driver::new(
        NODE.into(),
        profiles,
        dir.join("cdi"),
        dir.join("plugin/checkpoint.json"),
        SpecOptions { host_mount: "/".into(), mps, ..Default::default() },
        rx,
        claims,
    )
    .unwrap()
    .with_lock_file(dir.join("plugin/serialize.lock"))
}

/// A driver on fixture `name` with claims held in memory; with `mps`, the node's MPS control
/// daemon has its pipes in `<dir>/mps/pipe` and its shm in `<dir>/mps/shm`.
struct Node {
    f: fixture::Fixture,
    dir: tempfile::TempDir,
    claims: Arc<MemoryClaims>,
    d: Driver,
}

fn node(name: &str, mps: bool) -> Option<Node> {
    let f = fixture::prepare(name).unwrap()?;
    let dir = tempfile::tempdir().unwrap();
    let claims = Arc::new(MemoryClaims::default());
    let mps = mps.then(|| MpsNode {
        pipe_directory: dir.path().join("mps/pipe"),
        shm_directory: Some(dir.path().join("mps/shm")),
    });
    let d = driver(&f.root, dir.path(), claims.clone(), mps);
    Some(Node { f, dir, claims, d })
}

fn spec(dir: &Path, n: u32) -> Spec {
    actk_core::cdi::validate::validate_file(&dir.join(format!("cdi/actk.dev-claim_{}.json", uid(n))))
        .expect("the claim's spec passes CDI validation")
}

/// The env of the common device of `profile` in claim `n`'s spec (what every container of the
/// claim gets once).
fn common_env(dir: &Path, n: u32, profile: &str) -> Vec<String> {
    let s = spec(dir, n);
    let name = format!("{}-{profile}-common", uid(n));
    s.devices.iter().find(|d| d.name == name).unwrap_or_else(|| panic!("no {name}")).container_edits.env.clone()
}

/// The env of the MPS device of `profile` in claim `n`'s spec (what the containers of the
/// requests that asked for MPS get; empty when there is none).
fn mps_env(dir: &Path, n: u32, profile: &str) -> Vec<String> {
    let s = spec(dir, n);
    let name = format!("{}-{profile}-mps", uid(n));
    s.devices.iter().find(|d| d.name == name).map(|d| d.container_edits.env.clone()).unwrap_or_default()
}

fn var<'a>(env: &'a [String], name: &str) -> Option<&'a str> {
    env.iter().rev().find_map(|e| e.strip_prefix(name)?.strip_prefix('='))
}

#[tokio::test]
async fn claims_sharing_a_neuron_device_get_disjoint_cores() {
    let Some(Node { f, dir, claims, d }) = node("aws-inf2-48xlarge", false) else { return };
    // inf2: 2 NeuronCores per device; neuron-3's are global cores 6 and 7.
    let one_core = json!({"cores": "1"});
    for n in 1..=3 {
        claims.put(claim(n, &[("nc", "neuron-3", one_core.clone())], Value::Null));
    }
    d.prepare(&want(1)).await.unwrap();
    d.prepare(&want(2)).await.unwrap();
    assert_eq!(var(&common_env(dir.path(), 1, "neuron"), "NEURON_RT_VISIBLE_CORES"), Some("6"));
    assert_eq!(var(&common_env(dir.path(), 2, "neuron"), "NEURON_RT_VISIBLE_CORES"), Some("7"));
    // The checkpoint holds them by device and core within it (not by global number, which
    // another device's coming or going would shift).
    let cp: Value = serde_json::from_slice(&std::fs::read(dir.path().join("plugin/checkpoint.json")).unwrap()).unwrap();
    assert_eq!(cp["claims"][uid(1)]["cores"], json!({"neuron-3": [0]}));
    assert_eq!(cp["claims"][uid(2)]["cores"], json!({"neuron-3": [1]}));
    // Both containers get the device itself.
    for n in [1, 2] {
        let s = spec(dir.path(), n);
        let dev = s.devices.iter().find(|x| x.name == format!("{}-neuron-3", uid(n))).unwrap();
        assert_eq!(dev.container_edits.device_nodes[0].path, "/dev/neuron3");
    }
    // A third claim on the full device (the scheduler would not allocate it; a driver that
    // lost count must not hand out a held core).
    let e = d.prepare(&want(3)).await.unwrap_err();
    assert!(e.contains("device neuron-3 has 2 cores, 2 of them held by other claims"), "{e}");
    assert!(!dir.path().join(format!("cdi/actk.dev-claim_{}.json", uid(3))).exists());

    // A restarted driver remembers which cores are held (the checkpoint).
    let d = driver(&f.root, dir.path(), claims.clone(), None);
    assert!(d.prepare(&want(3)).await.is_err());
    // Unprepare of one claim frees its core and leaves the other's spec and core alone.
    d.unprepare(&want(1)).await.unwrap();
    assert_eq!(var(&common_env(dir.path(), 2, "neuron"), "NEURON_RT_VISIBLE_CORES"), Some("7"));
    d.prepare(&want(3)).await.unwrap();
    assert_eq!(var(&common_env(dir.path(), 3, "neuron"), "NEURON_RT_VISIBLE_CORES"), Some("6"));

    // A claim with a whole device and a shared one sees all cores of the first.
    claims.put(claim(4, &[("a", "neuron-0", Value::Null), ("b", "neuron-5", json!({"cores": "1"}))], Value::Null));
    d.prepare(&want(4)).await.unwrap();
    assert_eq!(var(&common_env(dir.path(), 4, "neuron"), "NEURON_RT_VISIBLE_CORES"), Some("0,1,10"));
    // A claim of whole devices only is as before: no cores variable of its own.
    claims.put(claim(5, &[("a", "neuron-1", Value::Null)], Value::Null));
    d.prepare(&want(5)).await.unwrap();
    assert_eq!(var(&common_env(dir.path(), 5, "neuron"), "NEURON_RT_VISIBLE_CORES"), None);
}

fn mps_config(mps: Value) -> Value {
    json!([{"source": "FromClaim", "requests": ["gpu"], "opaque": {"driver": "actk.dev", "parameters":
        {"apiVersion": "actk.dev/v1", "kind": "DeviceConfig", "sharing": {"strategy": "MPS", "mps": mps}}}}])
}

#[tokio::test]
async fn a_quarter_of_a_gpu_by_memory_with_mps_or_time_slicing() {
    let Some(Node { f: _f, dir, claims, d }) = node("nvidia-dgx-h100", true) else { return };
    // nvidia-0: an H100 80GB, 81559 MiB as NVML reports it (the fixture's NVML double).
    let quarter = json!({"memory": "20389Mi"});
    claims.put(claim(1, &[("gpu", "nvidia-0", quarter.clone())], mps_config(json!({}))));
    claims.put(claim(2, &[("gpu", "nvidia-0", quarter.clone())], Value::Null));
    claims.put(claim(
        3,
        &[("gpu", "nvidia-0", quarter.clone())],
        mps_config(json!({"activeThreadPercentage": 10, "pinnedMemoryLimit": "8Gi"})),
    ));
    for n in 1..=3 {
        d.prepare(&want(n)).await.unwrap();
    }
    let uuid = "GPU-fb142024-48b7-541d-86b5-8bdac2e02a4e";
    let env = mps_env(dir.path(), 1, "nvidia");
    assert_eq!(var(&env, "CUDA_MPS_PIPE_DIRECTORY"), Some("/tmp/nvidia-mps"));
    assert_eq!(var(&env, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"), Some(format!("{uuid}=20389M").as_str()));
    assert_eq!(var(&env, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), Some("25"));
    assert_eq!(var(&common_env(dir.path(), 1, "nvidia"), "NVIDIA_VISIBLE_DEVICES"), Some("void"));
    let s = spec(dir.path(), 1);
    let on_mps = &s.devices.iter().find(|x| x.name.ends_with("-nvidia-mps")).unwrap().container_edits;
    let mounts: Vec<(&str, &str)> =
        on_mps.mounts.iter().map(|m| (m.host_path.as_str(), m.container_path.as_str())).collect();
    let pipe = dir.path().join("mps/pipe");
    assert!(mounts.contains(&(pipe.to_str().unwrap(), "/tmp/nvidia-mps")), "{mounts:?}");
    assert!(mounts.iter().any(|(_, c)| *c == "/dev/shm"), "{mounts:?}");
    // Time-slicing (no config): the GPU, no MPS.
    let env = common_env(dir.path(), 2, "nvidia");
    assert!(!env.iter().any(|e| e.starts_with("CUDA_MPS")), "{env:?}");
    assert!(mps_env(dir.path(), 2, "nvidia").is_empty());
    // The configured limits win over the consumed share.
    let env = mps_env(dir.path(), 3, "nvidia");
    assert_eq!(var(&env, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"), Some(format!("{uuid}=8192M").as_str()));
    assert_eq!(var(&env, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), Some("10"));
    // Every claim gets GPU 0's node; unpreparing one leaves the others' specs.
    d.unprepare(&want(2)).await.unwrap();
    for n in [1, 3] {
        let s = spec(dir.path(), n);
        let dev = s.devices.iter().find(|x| x.name == format!("{}-nvidia-0", uid(n))).unwrap();
        assert_eq!(dev.container_edits.device_nodes[0].path, "/dev/nvidia0");
    }
}

#[tokio::test]
async fn device_config_errors_name_the_field_and_leave_nothing() {
    let Some(Node { f: _f, dir, claims, d }) = node("hetero-nvidia-neuron", false) else { return };
    let bad = |params: Value| json!([{"source": "FromClaim", "opaque": {"driver": "actk.dev", "parameters": params}}]);
    let cases = [
        (
            bad(json!({"apiVersion": "actk.dev/v1", "kind": "DeviceConfig", "sharing": {"strategy": "Spatial"}})),
            "status.allocation.devices.config[0].opaque.parameters: unknown variant `Spatial`",
        ),
        (bad(json!({"sharing": {}})), "status.allocation.devices.config[0].opaque.parameters.apiVersion is missing"),
        (
            bad(json!({"apiVersion": "actk.dev/v1", "kind": "DeviceConfig", "sharing": {"strategy": "MPS"}})),
            "sharing.strategy: MPS: this node's driver knows no MPS control daemon",
        ),
    ];
    for (i, (config, want_msg)) in cases.into_iter().enumerate() {
        let n = i as u32 + 1;
        claims.put(claim(n, &[("gpu", "nvidia-0", Value::Null)], config));
        let e = d.prepare(&want(n)).await.unwrap_err();
        assert!(e.contains(want_msg), "{e}");
        assert!(e.starts_with(&format!("claim ns/c{n} (uid {})", uid(n))), "{e}");
    }
    // MPS is for NVIDIA GPUs.
    claims.put(claim(
        9,
        &[("nc", "neuron-0", json!({"cores": "1"}))],
        bad(json!({"apiVersion": "actk.dev/v1", "kind": "DeviceConfig", "sharing": {"strategy": "MPS"}})),
    ));
    let e = d.prepare(&want(9)).await.unwrap_err();
    assert!(
        e.contains("sharing.strategy: MPS is for NVIDIA GPUs; device neuron-0 is a aws.amazon.com/neuron device"),
        "{e}"
    );
    let left: Vec<_> = std::fs::read_dir(dir.path().join("cdi")).map(|r| r.count()).into_iter().collect();
    assert!(left.is_empty() || left == [0], "no spec written: {left:?}");
    assert!(d.prepared_claims().await.unwrap().is_empty());
    // Another driver's parameters are not ours to judge.
    claims.put(claim(
        10,
        &[("gpu", "nvidia-0", Value::Null)],
        json!([{"source": "FromClaim", "opaque": {"driver": "gpu.example.com", "parameters": {"x": 1}}}]),
    ));
    d.prepare(&want(10)).await.unwrap();
}

/// A static MIG device (a 3g.40gb of the DGX A100 fixture's GPU 0) is prepared as
/// nvidia-container-toolkit injects one: the parent GPU's node and the capability nodes of its
/// GPU and compute instance (`/proc/driver/nvidia/capabilities/gpu0/mig/gi2/access` and
/// `gi2/ci0/access`), nothing of another instance; MPS is refused on it.
#[tokio::test]
async fn a_mig_device_claim_gets_its_parent_and_its_capability_nodes() {
    let Some(Node { f, dir, claims, d }) = node("nvidia-dgx-a100", false) else { return };
    claims.put(claim(1, &[("mig", "nvidia-0-mig-2-0", Value::Null)], Value::Null));
    let answer = d.prepare(&want(1)).await.unwrap();
    assert_eq!(answer[0].device, "nvidia-0-mig-2-0");
    let s = spec(dir.path(), 1);
    let dev = s.devices.iter().find(|x| x.name == format!("{}-nvidia-0-mig-2-0", uid(1))).unwrap();
    let nodes: Vec<&str> = dev.container_edits.device_nodes.iter().map(|n| n.path.as_str()).collect();
    let caps = |file: &str| -> String {
        let t = std::fs::read_to_string(f.root.join("proc/driver/nvidia/capabilities/gpu0/mig").join(file)).unwrap();
        let minor = t.lines().find_map(|l| l.strip_prefix("DeviceFileMinor: ")).unwrap().trim().to_string();
        format!("/dev/nvidia-caps/nvidia-cap{minor}")
    };
    assert_eq!(nodes, ["/dev/nvidia0", &caps("gi2/access"), &caps("gi2/ci0/access")]);
    assert_eq!(var(&common_env(dir.path(), 1, "nvidia"), "NVIDIA_VISIBLE_DEVICES"), Some("void"));
    claims.put(claim(
        2,
        &[("mig", "nvidia-0-mig-9-0", Value::Null)],
        json!([{"source": "FromClaim", "opaque": {"driver": "actk.dev", "parameters":
            {"apiVersion": "actk.dev/v1", "kind": "DeviceConfig", "sharing": {"strategy": "MPS"}}}}]),
    ));
    let e = d.prepare(&want(2)).await.unwrap_err();
    assert!(e.contains("on MIG device nvidia-0-mig-9-0 is not supported"), "{e}");
}

/// `neuron.logicalCoreSize: 2` (Trainium2's LNC=2 grouping; the arithmetic is the same on the
/// inf2 fixture's two cores per device): a claim that consumed 2 cores gets an aligned pair,
/// `NEURON_RT_VISIBLE_CORES` counts logical cores and `NEURON_LOGICAL_NC_CONFIG=2`; an odd
/// count is refused naming the setting, as is the setting on an NVIDIA GPU.
#[tokio::test]
async fn logical_core_size_groups_cores_and_numbers_them_logically() {
    let Some(Node { f: _f, dir, claims, d }) = node("hetero-nvidia-neuron", false) else { return };
    let lnc = |n: u32| {
        json!([{"source": "FromClaim", "opaque": {"driver": "actk.dev", "parameters":
            {"apiVersion": "actk.dev/v1", "kind": "DeviceConfig", "neuron": {"logicalCoreSize": n}}}}])
    };
    // neuron-1's physical cores are 2 and 3: logical core 1.
    claims.put(claim(1, &[("nc", "neuron-1", json!({"cores": "2"}))], lnc(2)));
    d.prepare(&want(1)).await.unwrap();
    let env = common_env(dir.path(), 1, "neuron");
    assert_eq!(var(&env, "NEURON_RT_VISIBLE_CORES"), Some("1"), "{env:?}");
    assert_eq!(var(&env, "NEURON_LOGICAL_NC_CONFIG"), Some("2"), "{env:?}");
    // One core is no logical core of two.
    claims.put(claim(2, &[("nc", "neuron-0", json!({"cores": "1"}))], lnc(2)));
    let e = d.prepare(&want(2)).await.unwrap_err();
    assert!(
        e.contains(
            "consumed 1 cores of device neuron-0, which are not whole logical cores of neuron.logicalCoreSize 2"
        ),
        "{e}"
    );
    // A whole device with the setting: the variable only.
    claims.put(claim(3, &[("nc", "neuron-0", Value::Null)], lnc(2)));
    d.prepare(&want(3)).await.unwrap();
    let env = common_env(dir.path(), 3, "neuron");
    assert_eq!(var(&env, "NEURON_LOGICAL_NC_CONFIG"), Some("2"));
    assert_eq!(var(&env, "NEURON_RT_VISIBLE_CORES"), None);
    claims.put(claim(4, &[("gpu", "nvidia-0", Value::Null)], lnc(1)));
    let e = d.prepare(&want(4)).await.unwrap_err();
    assert!(
        e.contains("neuron.logicalCoreSize is for Neuron devices; device nvidia-0 is a nvidia.com/gpu device"),
        "{e}"
    );
}

/// One claim for an NVIDIA GPU and two Neuron cores with one DeviceConfig for every request
/// (MPS and a logical core size of 2): each device takes the section that is for it, as
/// NVIDIA's DRA driver applies a `GpuConfig` without requests to its GPUs only. The same entry
/// naming both requests is refused, naming the device a section is not for.
#[tokio::test]
async fn a_config_for_every_request_of_a_mixed_claim_applies_where_it_fits() {
    let Some(Node { f: _f, dir, claims, d }) = node("hetero-nvidia-neuron", true) else { return };
    let cfg = |requests: Value| {
        json!([{"source": "FromClaim", "requests": requests, "opaque": {"driver": "actk.dev", "parameters":
            {"apiVersion": "actk.dev/v1", "kind": "DeviceConfig", "sharing": {"strategy": "MPS"},
             "neuron": {"logicalCoreSize": 2}}}}])
    };
    let results = [("gpu", "nvidia-0", Value::Null), ("nc", "neuron-1", json!({"cores": "2"}))];
    claims.put(claim(1, &results, cfg(Value::Null)));
    d.prepare(&want(1)).await.unwrap();
    let gpu = [common_env(dir.path(), 1, "nvidia"), mps_env(dir.path(), 1, "nvidia")].concat();
    assert_eq!(var(&gpu, "CUDA_MPS_PIPE_DIRECTORY"), Some("/tmp/nvidia-mps"), "{gpu:?}");
    assert!(!gpu.iter().any(|e| e.starts_with("NEURON_")), "{gpu:?}");
    let nc = [common_env(dir.path(), 1, "neuron"), mps_env(dir.path(), 1, "neuron")].concat();
    // neuron-1's physical cores 2 and 3 are logical core 1.
    assert_eq!(var(&nc, "NEURON_RT_VISIBLE_CORES"), Some("1"), "{nc:?}");
    assert_eq!(var(&nc, "NEURON_LOGICAL_NC_CONFIG"), Some("2"), "{nc:?}");
    assert!(!nc.iter().any(|e| e.starts_with("CUDA_MPS")), "{nc:?}");

    // Named for both requests, each section is for both devices: refused, nothing written.
    let results = [("gpu", "nvidia-1", Value::Null), ("nc", "neuron-0", json!({"cores": "2"}))];
    claims.put(claim(2, &results, cfg(json!(["gpu", "nc"]))));
    let e = d.prepare(&want(2)).await.unwrap_err();
    assert!(
        e.contains("neuron.logicalCoreSize is for Neuron devices; device nvidia-1 is a nvidia.com/gpu device"),
        "{e}"
    );
    assert!(!dir.path().join(format!("cdi/actk.dev-claim_{}.json", uid(2))).exists());
    // The first claim's cores are still its own.
    assert_eq!(var(&common_env(dir.path(), 1, "neuron"), "NEURON_RT_VISIBLE_CORES"), Some("1"));
}

/// MPS from an entry for every request is not left out for a MIG device in a claim with a whole
/// GPU: it is refused there, as when the entry names it (the claim's MPS settings would reach
/// the MIG request's containers too).
#[tokio::test]
async fn mps_for_every_request_is_refused_on_a_mig_device_beside_a_whole_gpu() {
    let Some(Node { f: _f, dir, claims, d }) = node("nvidia-dgx-a100", true) else { return };
    let mps = json!([{"source": "FromClaim", "opaque": {"driver": "actk.dev", "parameters":
        {"apiVersion": "actk.dev/v1", "kind": "DeviceConfig", "sharing": {"strategy": "MPS"}}}}]);
    claims.put(claim(1, &[("gpu", "nvidia-4", Value::Null), ("mig", "nvidia-0-mig-2-0", Value::Null)], mps.clone()));
    let e = d.prepare(&want(1)).await.unwrap_err();
    assert!(e.contains("sharing.strategy: MPS on MIG device nvidia-0-mig-2-0 is not supported"), "{e}");
    assert!(!dir.path().join(format!("cdi/actk.dev-claim_{}.json", uid(1))).exists());
    // The whole GPU alone takes it.
    claims.put(claim(2, &[("gpu", "nvidia-4", Value::Null)], mps));
    d.prepare(&want(2)).await.unwrap();
    assert_eq!(var(&mps_env(dir.path(), 2, "nvidia"), "CUDA_MPS_PIPE_DIRECTORY"), Some("/tmp/nvidia-mps"));
}

/// A claim with an MPS request and a time-sliced one: only the MPS request's devices name the
/// MPS device, so a container that references the other request is no MPS client (its CUDA
/// would otherwise go through the daemon under the first request's limits).
#[tokio::test]
async fn only_the_requests_that_ask_for_mps_get_it() {
    let Some(Node { f: _f, dir, claims, d }) = node("nvidia-dgx-h100", true) else { return };
    let cfg = json!([{"source": "FromClaim", "requests": ["shared"], "opaque": {"driver": "actk.dev", "parameters":
        {"apiVersion": "actk.dev/v1", "kind": "DeviceConfig", "sharing": {"strategy": "MPS"}}}}]);
    let results =
        [("shared", "nvidia-0", Value::Null), ("shared", "nvidia-1", Value::Null), ("own", "nvidia-2", Value::Null)];
    claims.put(claim(1, &results, cfg));
    let prepared = d.prepare(&want(1)).await.unwrap();
    let ids = |request: &str| -> Vec<String> {
        prepared.iter().filter(|p| p.request == request).flat_map(|p| p.cdi_ids.clone()).collect()
    };
    let mps = format!("actk.dev/claim={}-nvidia-mps", uid(1));
    let common = format!("actk.dev/claim={}-nvidia-common", uid(1));
    assert_eq!(ids("shared").iter().filter(|i| **i == mps).count(), 1, "{prepared:?}");
    assert_eq!(ids("own").iter().filter(|i| **i == common).count(), 1, "{prepared:?}");
    assert!(!ids("own").contains(&mps), "{prepared:?}");
    let env = mps_env(dir.path(), 1, "nvidia");
    let limits = var(&env, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT").unwrap();
    assert_eq!(limits.split(',').count(), 2, "the two MPS GPUs, not the third: {limits}");
    assert!(!common_env(dir.path(), 1, "nvidia").iter().any(|e| e.starts_with("CUDA_MPS")));
}

/// Two results of one claim on the same device (two requests, each with its own shareID) hold
/// the cores of both: a later claim must not get any of them, also after a driver restart.
#[tokio::test]
async fn two_shares_of_one_device_in_one_claim_hold_both_cores() {
    let Some(Node { f, dir, claims, d }) = node("aws-inf2-48xlarge", false) else { return };
    let one_core = json!({"cores": "1"});
    claims.put(claim(1, &[("a", "neuron-3", one_core.clone()), ("b", "neuron-3", one_core.clone())], Value::Null));
    claims.put(claim(2, &[("nc", "neuron-3", one_core.clone())], Value::Null));
    d.prepare(&want(1)).await.unwrap();
    assert_eq!(var(&common_env(dir.path(), 1, "neuron"), "NEURON_RT_VISIBLE_CORES"), Some("6,7"));
    let e = d.prepare(&want(2)).await.unwrap_err();
    assert!(e.contains("device neuron-3 has 2 cores, 2 of them held by other claims"), "{e}");
    let d = driver(&f.root, dir.path(), claims.clone(), None);
    assert!(d.prepare(&want(2)).await.is_err(), "a restarted driver still knows both cores are held");
}

/// A shared result whose consumed `cores` is missing or not a quantity the driver can read is
/// refused: it must not fall back to the whole device (every core, none of them recorded), which
/// would give cores that other claims hold. Exponent forms (`1e0`, the API's canonical form of
/// a quantity written with an exponent) are read.
#[tokio::test]
async fn a_shared_result_without_a_readable_core_count_gets_no_cores_of_others() {
    let Some(Node { f: _f, dir, claims, d }) = node("aws-inf2-48xlarge", false) else { return };
    claims.put(claim(1, &[("nc", "neuron-3", json!({"cores": "1"}))], Value::Null));
    d.prepare(&want(1)).await.unwrap();
    assert_eq!(var(&common_env(dir.path(), 1, "neuron"), "NEURON_RT_VISIBLE_CORES"), Some("6"));
    for (n, consumed) in
        [(2, json!({})), (3, json!({"cores": "-1"})), (4, json!({"cores": "x"})), (5, json!({"cores": "0.5"}))]
    {
        claims.put(claim(n, &[("nc", "neuron-3", consumed.clone())], Value::Null));
        match d.prepare(&want(n)).await {
            Err(e) => assert!(e.contains("neuron-3"), "{consumed}: {e}"),
            Ok(_) => panic!(
                "{consumed}: prepared with NEURON_RT_VISIBLE_CORES={:?} while core 6 is held",
                var(&common_env(dir.path(), n, "neuron"), "NEURON_RT_VISIBLE_CORES")
            ),
        }
    }
    claims.put(claim(6, &[("nc", "neuron-3", json!({"cores": "1e0"}))], Value::Null));
    d.prepare(&want(6)).await.unwrap();
    assert_eq!(var(&common_env(dir.path(), 6, "neuron"), "NEURON_RT_VISIBLE_CORES"), Some("7"));
}

/// The memory an MPS claim consumed, in exponent form (`131072e3`, 125Mi, as the API server
/// writes a quantity given with an exponent), is its limit, not the whole GPU; a shared result
/// whose consumed memory cannot be read is refused rather than given the whole GPU.
#[tokio::test]
async fn mps_limits_come_from_the_consumed_memory_in_any_form() {
    let Some(Node { f: _f, dir, claims, d }) = node("nvidia-dgx-h100", true) else { return };
    let uuid = "GPU-fb142024-48b7-541d-86b5-8bdac2e02a4e";
    claims.put(claim(2, &[("gpu", "nvidia-0", json!({"memory": "131072e3"}))], mps_config(json!({}))));
    d.prepare(&want(2)).await.unwrap();
    let env = mps_env(dir.path(), 2, "nvidia");
    assert_eq!(var(&env, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"), Some(format!("{uuid}=125M").as_str()));
    assert_eq!(var(&env, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), Some("1"));
    for (n, consumed) in [(3, json!({"memory": "-5Gi"})), (4, json!({}))] {
        claims.put(claim(n, &[("gpu", "nvidia-0", consumed.clone())], mps_config(json!({}))));
        let e = d.prepare(&want(n)).await.unwrap_err();
        assert!(e.contains("nvidia-0"), "{consumed}: {e}");
    }
}

/// A tenant's `pinnedMemoryLimit` cannot widen what the claim was allocated: the limit is at
/// most the memory the claim consumed.
#[tokio::test]
async fn a_pinned_memory_limit_above_the_consumed_memory_is_cut_to_it() {
    let Some(Node { f: _f, dir, claims, d }) = node("nvidia-dgx-h100", true) else { return };
    let uuid = "GPU-fb142024-48b7-541d-86b5-8bdac2e02a4e";
    claims.put(claim(
        1,
        &[("gpu", "nvidia-0", json!({"memory": "20389Mi"}))],
        mps_config(json!({"pinnedMemoryLimit": "80Gi"})),
    ));
    d.prepare(&want(1)).await.unwrap();
    let env = mps_env(dir.path(), 1, "nvidia");
    assert_eq!(var(&env, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"), Some(format!("{uuid}=20389M").as_str()));
}
