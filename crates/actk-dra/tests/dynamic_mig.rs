//! Dynamic MIG on the DGX A100 fixture and its NVML test double: GPU 4 is put in MIG mode with
//! no MIG devices (as `nvidia-smi -i 4 -mig 1` leaves it), the publisher offers every
//! placement of its profiles with shared counters, and the driver makes the MIG device of an
//! allocated placement at prepare and destroys it at unprepare. What is checked is what a user
//! sees: the published pool, the node's MIG devices as discovery (and so `nvidia-smi -L`)
//! lists them, the capability files the driver made, the claim's CDI spec, and errors that
//! name the claim and leave nothing behind.

use actk_core::cdi::spec::Spec;
use actk_core::inventory::Inventory;
use actk_dra::claim::{ClaimRef, SpecOptions};
use actk_dra::driver::{Driver, MemoryClaims};
use actk_dra::mig::Placements;
use actk_dra::publish::{self, DynamicMigConfig, PublishConfig, Sink};
use actk_dra::slice::Pool;
use actk_testsupport::{fixture, nvml_double};
use k8s_openapi::api::resource::v1::ResourceClaim;
use serde_json::json;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};

const NODE: &str = "dgx-a100";

struct Recorder(mpsc::UnboundedSender<Pool>);

impl Sink for Recorder {
    async fn node(&mut self) -> Result<publish::NodeView, String> {
        Ok(publish::NodeView { allocatable: BTreeMap::new(), labels: BTreeMap::new() })
    }
    async fn intact(&mut self, _: i64) -> Result<bool, String> {
        Ok(true)
    }
    async fn publish(&mut self, _: i64, pool: Pool) -> Result<(), String> {
        let _ = self.0.send(pool);
        Ok(())
    }
}

fn uid(n: u32) -> String {
    format!("d1a90000-{n:04x}-4d5e-8f90-a1b2c3d4e5f6")
}

fn want(n: u32) -> ClaimRef {
    ClaimRef { namespace: "ns".into(), uid: uid(n), name: format!("mig{n}") }
}

/// Claim `n` allocated `device` of this node for request `mig`.
fn claim(n: u32, device: &str) -> ResourceClaim {
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"namespace": "ns", "name": format!("mig{n}"), "uid": uid(n)},
        "spec": {"devices": {"requests": []}},
        "status": {"allocation": {"devices": {"results": [
            {"request": "mig", "driver": "actk.dev", "pool": NODE, "device": device}
        ]}}}
    }))
    .unwrap()
}

/// GPU `index`'s MIG devices as discovery lists them: (profile, placement start, UUID).
fn migs(root: &Path, index: u32) -> Vec<(String, u32, String)> {
    let inv = actk_core::discover::discover(root, &actk_core::profile::builtin());
    let gpu = inv.vendor("nvidia").unwrap().devices.iter().find(|d| d.index == index).unwrap().clone();
    gpu.mig.unwrap().devices.iter().map(|m| (m.profile.clone(), m.placement.start, m.uuid.clone())).collect()
}

async fn next(rx: &mut mpsc::UnboundedReceiver<Pool>) -> Pool {
    tokio::time::timeout(Duration::from_secs(10), rx.recv()).await.expect("published within 10 s").unwrap()
}

/// Waits for a pool for which `ok` holds.
async fn until(rx: &mut mpsc::UnboundedReceiver<Pool>, what: &str, ok: impl Fn(&Pool) -> bool) -> Pool {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let p = tokio::time::timeout(left, rx.recv())
            .await
            .unwrap_or_else(|_| panic!("no pool where {what} within 15 s"))
            .unwrap();
        if ok(&p) {
            return p;
        }
    }
}

/// Whether `name` is a MIG device that exists (`nvidia-4-mig-<GI>-<CI>`), not a placement
/// (`nvidia-4-mig-<profile>-<start>`), on GPU `gpu`.
fn is_made(name: &str, gpu: u32) -> bool {
    name.strip_prefix(&format!("nvidia-{gpu}-mig-"))
        .is_some_and(|rest| rest.split('-').count() == 2 && rest.split('-').all(|p| p.parse::<u32>().is_ok()))
}

/// Whether `name` is a placement device of GPU `gpu`.
fn is_placement(name: &str, gpu: u32) -> bool {
    name.starts_with(&format!("nvidia-{gpu}-mig-")) && !is_made(name, gpu)
}

fn names(p: &Pool) -> Vec<&str> {
    p.devices.iter().map(|d| d.name.as_str()).collect()
}

struct Node {
    f: fixture::Fixture,
    dir: tempfile::TempDir,
    claims: Arc<MemoryClaims>,
    driver: Driver,
    pools: mpsc::UnboundedReceiver<Pool>,
    task: tokio::task::JoinHandle<()>,
}

/// The DGX A100 with GPU 4 in MIG mode, its publisher (dynamic MIG on, rediscovery every
/// 200 ms) and driver.
fn node() -> Option<Node> {
    let f = fixture::prepare("nvidia-dgx-a100").unwrap()?;
    nvml_double::enable_mig(&f.root, 4).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let checkpoint = dir.path().join("plugin/checkpoint.json");
    let (inv_tx, inv_rx) = watch::channel(Arc::new(Inventory::default()));
    let (placements_tx, placements_rx) = watch::channel(Arc::new(Placements::new()));
    let (tx, pools) = mpsc::unbounded_channel();
    let cfg = PublishConfig {
        root: f.root.clone(),
        profiles: actk_core::profile::builtin(),
        served: Some(["nvidia".to_string()].into()),
        health: Duration::from_millis(50),
        rediscover: Duration::from_millis(200),
        allow_device_plugin_overlap: false,
        state: None,
        node_choice: None,
        publish_lock: None,
        defer_to: None,
        metrics: None,
        health_engine: Default::default(),
        dynamic_mig: Some(DynamicMigConfig {
            node: NODE.into(),
            checkpoint: checkpoint.clone(),
            placements: Arc::new(placements_tx),
        }),
    };
    let task = tokio::spawn(publish::run(cfg, Recorder(tx), 1, inv_tx, watch::channel(Some(Ok(()))).1));
    let claims = Arc::new(MemoryClaims::default());
    let driver = Driver::new(
        NODE.into(),
        actk_core::profile::builtin(),
        dir.path().join("cdi"),
        checkpoint,
        SpecOptions { host_mount: "/".into(), ..Default::default() },
        inv_rx,
        claims.clone(),
    )
    .unwrap()
    .with_lock_file(dir.path().join("plugin/serialize.lock"))
    .with_dynamic_mig(f.root.clone(), placements_rx);
    Some(Node { f, dir, claims, driver, pools, task })
}

fn spec(dir: &Path, n: u32) -> Spec {
    actk_core::cdi::validate::validate_file(&dir.join(format!("cdi/actk.dev-claim_{}.json", uid(n))))
        .expect("the claim's spec passes CDI validation")
}

/// `DeviceFileMinor` of a capability access file.
fn cap_minor(root: &Path, rel: &str) -> u32 {
    let text = std::fs::read_to_string(root.join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"));
    text.lines().find_map(|l| l.strip_prefix("DeviceFileMinor:")).unwrap().trim().parse().unwrap()
}

#[tokio::test]
async fn a_placement_is_made_at_prepare_and_destroyed_at_unprepare() {
    let Some(Node { f, dir, claims, driver, mut pools, task }) = node() else { return };
    let first = next(&mut pools).await;
    // One counter set per GPU in MIG mode; GPU 4's placements all offered (7 + 7 + 4 + 3 + 2
    // + 1 + 1 on the A100: 1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb).
    let sets: Vec<&str> = first.counter_sets.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(sets, ["nvidia-0-slices", "nvidia-1-slices", "nvidia-2-slices", "nvidia-3-slices", "nvidia-4-slices"]);
    let four = &first.counter_sets[4];
    assert_eq!(four.counters.keys().filter(|k| k.starts_with("memory-slice-")).count(), 8);
    let gpu4: Vec<&str> = names(&first).into_iter().filter(|n| is_placement(n, 4)).collect();
    assert_eq!(gpu4.len(), 25, "{gpu4:?}");
    // GPU 0's static layout (3g@4, 2g@0, 1g@2, 1g@3) takes every memory slice: no placement,
    // but its MIG devices are published as they are.
    assert!(!names(&first).iter().any(|n| is_placement(n, 0)), "{:?}", names(&first));
    assert!(names(&first).contains(&"nvidia-0-mig-2-0"));
    assert!(migs(&f.root, 4).is_empty());

    claims.put(claim(1, "nvidia-4-mig-3g-40gb-4"));
    let devices = driver.prepare(&want(1)).await.unwrap();
    assert_eq!(devices[0].device, "nvidia-4-mig-3g-40gb-4", "the answer names the allocated device");
    let made = migs(&f.root, 4);
    assert_eq!(made.len(), 1, "{made:?}");
    let (profile, start, mig_uuid) = made[0].clone();
    let cp: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("plugin/checkpoint.json")).unwrap()).unwrap();
    assert_eq!(cp["claims"][uid(1)]["made"][0]["uuid"], json!(mig_uuid), "the checkpoint knows what to destroy");
    assert!(cp.get("making").is_none(), "nothing left being made: {cp}");
    assert_eq!((profile.as_str(), start), ("3g.40gb", 4));
    // The GPU's node and the new instance's capability nodes, minors from the access files
    // the driver made (GI 2: 3g.40gb at 4, as the A100 driver numbers it).
    let s = spec(dir.path(), 1);
    let dev = s.devices.iter().find(|d| d.name == format!("{}-nvidia-4-mig-3g-40gb-4", uid(1))).unwrap();
    let paths: Vec<&str> = dev.container_edits.device_nodes.iter().map(|n| n.path.as_str()).collect();
    let gi = cap_minor(&f.root, "proc/driver/nvidia/capabilities/gpu4/mig/gi2/access");
    let ci = cap_minor(&f.root, "proc/driver/nvidia/capabilities/gpu4/mig/gi2/ci0/access");
    assert_eq!(
        paths,
        [
            "/dev/nvidia4".to_string(),
            format!("/dev/nvidia-caps/nvidia-cap{gi}"),
            format!("/dev/nvidia-caps/nvidia-cap{ci}")
        ]
    );
    // The made device is not published a second time, not even while it was being made (the
    // checkpoint said so first); its placement stays (the claim holds it). Five rediscoveries.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    while let Ok(p) = pools.try_recv() {
        assert!(!names(&p).iter().any(|n| is_made(n, 4)), "published twice: {:?}", names(&p));
        assert!(names(&p).contains(&"nvidia-4-mig-3g-40gb-4"));
    }
    // Prepare again (a kubelet retry) answers from the checkpoint and makes nothing.
    assert_eq!(driver.prepare(&want(1)).await.unwrap(), devices);
    assert_eq!(migs(&f.root, 4).len(), 1);

    driver.unprepare(&want(1)).await.unwrap();
    assert!(migs(&f.root, 4).is_empty());
    assert!(!f.root.join("proc/driver/nvidia/capabilities/gpu4/mig/gi2").exists());
    let cp: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("plugin/checkpoint.json")).unwrap()).unwrap();
    assert_eq!(cp["claims"], json!({}));
    task.abort();
}

#[tokio::test]
async fn a_placement_taken_outside_the_driver_is_refused_and_nothing_is_left() {
    let Some(Node { f, dir, claims, driver, mut pools, task }) = node() else { return };
    next(&mut pools).await;
    // The admin makes a 1g.10gb at memory slice 0 behind the driver's back, after the
    // scheduler allocated the 7g.80gb placement that covers it.
    {
        let lib = actk_core::discover::nvml::open(&actk_core::discover::HostRoot::new(&f.root)).unwrap();
        let gpu4 = nvml_double::State::of(&f.root).unwrap().gpus()[4].get("uuid").to_string();
        actk_core::discover::nvml::dynamic::create(&lib, &gpu4, 0, 0).unwrap();
    }
    claims.put(claim(2, "nvidia-4-mig-7g-80gb-0"));
    let e = driver.prepare(&want(2)).await.unwrap_err();
    assert!(e.contains(&uid(2)) && e.contains("nvidia-4-mig-7g-80gb-0"), "{e}");
    assert_eq!(migs(&f.root, 4).len(), 1, "only the admin's");
    assert!(!dir.path().join(format!("cdi/actk.dev-claim_{}.json", uid(2))).exists());
    // The publisher then sees the admin's device: published as it is, and no placement that
    // overlaps it offered any more.
    let p = until(&mut pools, "the admin's MIG device is published", |p| names(p).iter().any(|n| is_made(n, 4))).await;
    assert!(!names(&p).contains(&"nvidia-4-mig-7g-80gb-0"));
    assert!(names(&p).contains(&"nvidia-4-mig-3g-40gb-4"));
    task.abort();
}

/// The NVML of the fixture and GPU 4's UUID.
fn nvml4(root: &Path) -> (nvml_wrapper::Nvml, String) {
    let lib = actk_core::discover::nvml::open(&actk_core::discover::HostRoot::new(root)).unwrap();
    (lib, nvml_double::State::of(root).unwrap().gpu_uuid(4))
}

/// Writes into the driver's checkpoint that claim `n` is being made at `placement`, as a driver
/// killed between recording it and finishing leaves it.
fn killed_while_making(dir: &Path, n: u32, placement: &str, root: &Path) {
    let path = dir.join("plugin/checkpoint.json");
    let mut cp = actk_dra::checkpoint::Checkpoint::load(&path, NODE).unwrap();
    let mut layouts = actk_dra::mig::Layouts::new();
    let inv = actk_core::discover::discover(root, &actk_core::profile::builtin());
    actk_dra::mig::read_layouts(root, &inv, &mut layouts);
    let plan = actk_dra::mig::plan(&inv, &layouts, &Default::default());
    cp.making.insert(uid(n), vec![plan.placements[placement].clone()]);
    cp.save(&path).unwrap();
}

#[tokio::test]
async fn what_a_killed_prepare_made_is_destroyed_by_the_next_prepare_or_the_unprepare() {
    let Some(Node { f, dir, claims, driver, mut pools, task }) = node() else { return };
    next(&mut pools).await;
    let (lib, gpu4) = nvml4(&f.root);
    // Killed after NVML made the 3g.40gb at 4 and before the checkpoint said so.
    killed_while_making(dir.path(), 3, "nvidia-4-mig-3g-40gb-4", &f.root);
    let left = actk_core::discover::nvml::dynamic::create(&lib, &gpu4, 2, 4).unwrap();
    claims.put(claim(3, "nvidia-4-mig-3g-40gb-4"));
    // The kubelet calls again: what was left goes, the claim gets a device of its own.
    driver.prepare(&want(3)).await.unwrap();
    let now = migs(&f.root, 4);
    assert_eq!(now.len(), 1, "{now:?}");
    assert_ne!(now[0].2, left.uuid, "the leftover was destroyed and a new one made");
    let cp: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("plugin/checkpoint.json")).unwrap()).unwrap();
    assert_eq!(cp["claims"][uid(3)]["made"][0]["uuid"], json!(now[0].2));
    assert!(cp.get("making").is_none(), "{cp}");
    driver.unprepare(&want(3)).await.unwrap();
    assert!(migs(&f.root, 4).is_empty());

    // Killed again; this time the pod is deleted instead: unprepare destroys the leftover.
    killed_while_making(dir.path(), 4, "nvidia-4-mig-3g-40gb-4", &f.root);
    actk_core::discover::nvml::dynamic::create(&lib, &gpu4, 2, 4).unwrap();
    driver.unprepare(&want(4)).await.unwrap();
    assert!(migs(&f.root, 4).is_empty());
    let cp: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("plugin/checkpoint.json")).unwrap()).unwrap();
    assert!(cp.get("making").is_none(), "{cp}");
    task.abort();
}

#[tokio::test]
async fn unprepare_destroys_only_the_device_it_made_even_where_its_ids_were_reused() {
    let Some(Node { f, dir: _dir, claims, driver, mut pools, task }) = node() else { return };
    next(&mut pools).await;
    claims.put(claim(5, "nvidia-4-mig-3g-40gb-4"));
    driver.prepare(&want(5)).await.unwrap();
    let made = migs(&f.root, 4)[0].2.clone();
    // Someone destroys it with nvidia-smi and makes a 3g.40gb at 4 again: same GI, new UUID.
    let (lib, gpu4) = nvml4(&f.root);
    assert_eq!(actk_core::discover::nvml::dynamic::destroy_by_uuid(&lib, &gpu4, &made), Ok(true));
    let theirs = actk_core::discover::nvml::dynamic::create(&lib, &gpu4, 2, 4).unwrap();
    driver.unprepare(&want(5)).await.unwrap();
    assert_eq!(migs(&f.root, 4).into_iter().map(|m| m.2).collect::<Vec<_>>(), [theirs.uuid]);
    task.abort();
}

#[tokio::test]
async fn admin_access_to_a_placement_is_refused_and_makes_nothing() {
    let Some(Node { f, dir, claims, driver, mut pools, task }) = node() else { return };
    next(&mut pools).await;
    let mut c = claim(6, "nvidia-4-mig-1g-10gb-0");
    c.status.as_mut().unwrap().allocation.as_mut().unwrap().devices.as_mut().unwrap().results.as_mut().unwrap()[0]
        .admin_access = Some(true);
    claims.put(c);
    let e = driver.prepare(&want(6)).await.unwrap_err();
    assert!(e.contains(&uid(6)) && e.contains("nvidia-4-mig-1g-10gb-0") && e.contains("admin access"), "{e}");
    assert!(migs(&f.root, 4).is_empty());
    assert!(!dir.path().join(format!("cdi/actk.dev-claim_{}.json", uid(6))).exists());
    task.abort();
}
