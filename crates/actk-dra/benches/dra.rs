//! Benchmark of the DRA driver's node side (issue 11), printed as plain figures:
//! - NodePrepareResources and NodeUnprepareResources latency over many claims, as the kubelet
//!   calls them (one gRPC call per pod's claim over the DRA unix socket, v1 service), on the
//!   DGX H100 fixture: p50, p99, max. Claims come from an in-memory API (the API server read
//!   is left out; on a cluster it adds one GET per claim);
//! - time from publisher start (discovery, health probes, slices built) to the first published
//!   pool, on the DGX fixture and on a 64-device host, median of several starts;
//! - the same prepare done in-process without gRPC, to separate the driver's work (spec build,
//!   atomic spec write, checkpoint write) from the transport;
//! - prepare and unprepare of a dynamic MIG claim (the MIG device made and destroyed through
//!   the NVML double) against a static MIG device's claim, on the DGX A100 fixture.
//!
//! The cluster figures (driver start to a slice in the API server, pod start with a claim
//! against the device plugin path) are in benches/dra-bench.sh, which needs the test cluster.
//!
//! Run: `cargo bench -p actk-dra --bench dra` (root: fixtures need mknod).

use actk_dra::api::v1;
use actk_dra::claim::{ClaimRef, SpecOptions};
use actk_dra::driver::{Driver, MemoryClaims};
use actk_dra::plugin::{self, Socket};
use actk_dra::publish::{self, PublishConfig, Sink};
use actk_dra::service::DraService;
use k8s_openapi::api::resource::v1::ResourceClaim;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{oneshot, watch};

const CLAIMS: usize = 2000;

fn claim(i: usize) -> ResourceClaim {
    serde_json::from_value(serde_json::json!({
        "metadata": {"namespace": "bench", "name": format!("c{i}"), "uid": format!("00000000-0000-4000-8000-{i:012}")},
        "spec": {"devices": {"requests": []}},
        "status": {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": "actk.dev", "pool": "node-a", "device": format!("nvidia-{}", i % 8)}
        ]}}}
    }))
    .unwrap()
}

fn want(i: usize) -> ClaimRef {
    ClaimRef { namespace: "bench".into(), uid: format!("00000000-0000-4000-8000-{i:012}"), name: format!("c{i}") }
}

fn pct(mut v: Vec<Duration>) -> (Duration, Duration, Duration) {
    v.sort();
    let at = |p: f64| v[((v.len() as f64 * p) as usize).min(v.len() - 1)];
    (at(0.50), at(0.99), *v.last().unwrap())
}

fn us(d: Duration) -> String {
    format!("{:.0} us", d.as_secs_f64() * 1e6)
}

struct First(Option<oneshot::Sender<usize>>);
impl Sink for First {
    async fn node(&mut self) -> Result<publish::NodeView, String> {
        Ok(Default::default())
    }
    async fn intact(&mut self, _: i64) -> Result<bool, String> {
        Ok(true)
    }
    async fn publish(&mut self, _: i64, pool: actk_dra::slice::Pool) -> Result<(), String> {
        let devices = pool.devices;
        if let Some(tx) = self.0.take() {
            let _ = tx.send(devices.len());
        }
        Ok(())
    }
}

async fn time_to_first_slice(root: &Path) -> (Duration, usize) {
    let (tx, rx) = oneshot::channel();
    let (inv_tx, _rx) = watch::channel(Arc::new(actk_core::inventory::Inventory::default()));
    let cfg = PublishConfig {
        root: root.to_path_buf(),
        profiles: actk_core::profile::builtin(),
        served: None,
        health: Duration::from_millis(500),
        rediscover: Duration::from_secs(60),
        allow_device_plugin_overlap: false,
        state: None,
        node_choice: None,
        publish_lock: None,
        defer_to: None,
        metrics: None,
        health_engine: Default::default(),
        dynamic_mig: None,
    };
    let t = Instant::now();
    let task = tokio::spawn(publish::run(cfg, First(Some(tx)), 1, inv_tx, watch::channel(Some(Ok(()))).1));
    let n = rx.await.unwrap();
    let d = t.elapsed();
    task.abort();
    (d, n)
}

/// A host root with 64 devices of a generic profile (`example.com/npu`, /dev/npuN).
fn npu_host(dir: &Path) -> Option<Vec<actk_core::profile::Profile>> {
    std::fs::create_dir_all(dir.join("dev")).unwrap();
    std::fs::create_dir_all(dir.join("profiles")).unwrap();
    std::fs::write(
        dir.join("profiles/npu.toml"),
        "name = \"npu\"\nkind = \"example.com/npu\"\ndescription = \"bench\"\ndiscovery = \"generic\"\n[selection]\nenv = [\"NPU_VISIBLE_DEVICES\"]\n[devices]\nnode = \"/dev/npu{index}\"\nmajor = 240\n[kubernetes]\nresources = [\"example.com/npu\"]\n",
    )
    .unwrap();
    for i in 0..64 {
        let ok = std::process::Command::new("mknod")
            .arg(dir.join(format!("dev/npu{i}")))
            .args(["c", "240", &i.to_string()])
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            return None;
        }
    }
    actk_core::profile::load(Some(&dir.join("profiles"))).ok()
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let Some(f) = actk_testsupport::fixture::prepare("nvidia-dgx-h100").unwrap() else {
            println!("skipping: the fixtures need root for mknod");
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        let claims = Arc::new(MemoryClaims::default());
        for i in 0..CLAIMS {
            claims.put(claim(i));
        }
        let profiles = actk_core::profile::builtin();
        let inv = Arc::new(actk_core::discover::discover(&f.root, &profiles));
        let (_inv_tx, inv_rx) = watch::channel(inv);
        let driver = Arc::new(
            Driver::new(
                "node-a".into(),
                profiles,
                dir.path().join("cdi"),
                dir.path().join("plugin/checkpoint.json"),
                SpecOptions { host_mount: "/".into(), ..Default::default() },
                inv_rx,
                claims.clone(),
            )
            .unwrap(),
        );
        let sock = dir.path().join("plugin/dra.sock");
        let (tx, rx) = oneshot::channel();
        tokio::spawn(plugin::serve(sock.clone(), Socket::Dra(DraService(driver.clone())), Some(tx)));
        rx.await.unwrap();
        let ch = actk_node::uds::connect(&sock).await.unwrap();
        let mut client = v1::dra_plugin_client::DraPluginClient::new(ch);
        let to_v1 = |c: ClaimRef| v1::Claim { namespace: c.namespace, uid: c.uid, name: c.name };
        // Claims prepared one after the other stay prepared (as on a busy node), so the
        // checkpoint grows to CLAIMS entries: its rewrite is part of each prepare.
        let (mut prep, mut unprep) = (Vec::new(), Vec::new());
        for i in 0..CLAIMS {
            let req = v1::NodePrepareResourcesRequest { claims: vec![to_v1(want(i))] };
            let t = Instant::now();
            let r = client.node_prepare_resources(req).await.unwrap().into_inner();
            prep.push(t.elapsed());
            assert_eq!(r.claims.values().next().unwrap().error, "");
        }
        for i in 0..CLAIMS {
            let req = v1::NodeUnprepareResourcesRequest { claims: vec![to_v1(want(i))] };
            let t = Instant::now();
            client.node_unprepare_resources(req).await.unwrap();
            unprep.push(t.elapsed());
        }
        let (p50, p99, max) = pct(prep);
        println!(
            "NodePrepareResources   (gRPC, {CLAIMS} claims, 1 GPU each, DGX): p50 {}  p99 {}  max {}",
            us(p50),
            us(p99),
            us(max)
        );
        let (u50, u99, umax) = pct(unprep);
        println!(
            "NodeUnprepareResources (gRPC, {CLAIMS} claims):                  p50 {}  p99 {}  max {}",
            us(u50),
            us(u99),
            us(umax)
        );
        // The same with an empty checkpoint each time (one claim on the node), in-process.
        let mut solo = Vec::new();
        for i in 0..500 {
            let t = Instant::now();
            driver.prepare(&want(i)).await.unwrap();
            solo.push(t.elapsed());
            driver.unprepare(&want(i)).await.unwrap();
        }
        let (s50, s99, _) = pct(solo);
        println!("prepare in-process (1 claim on the node, 500 runs):            p50 {}  p99 {}", us(s50), us(s99));
        println!("gRPC + growing checkpoint / in-process solo, p50: {:.2}x", p50.as_secs_f64() / s50.as_secs_f64());

        let mut starts = Vec::new();
        let mut n = 0;
        for _ in 0..9 {
            let (d, k) = time_to_first_slice(&f.root).await;
            starts.push(d);
            n = k;
        }
        let (d50, _, _) = pct(starts);
        println!("publisher start to first pool (DGX, {n} devices, median of 9): {:.1} ms", d50.as_secs_f64() * 1e3);
        let big = tempfile::tempdir().unwrap();
        if let Some(profiles) = npu_host(big.path()) {
            let mut starts = Vec::new();
            for _ in 0..9 {
                let (tx, rx) = oneshot::channel();
                let (inv_tx, _rx) = watch::channel(Arc::new(actk_core::inventory::Inventory::default()));
                let cfg = PublishConfig {
                    root: big.path().to_path_buf(),
                    profiles: profiles.clone(),
                    served: Some(["npu".to_string()].into()),
                    health: Duration::from_millis(500),
                    rediscover: Duration::from_secs(60),
                    allow_device_plugin_overlap: false,
                    state: None,
                    node_choice: None,
                    publish_lock: None,
                    defer_to: None,
                    metrics: None,
                    health_engine: Default::default(),
                    dynamic_mig: None,
                };
                let t = Instant::now();
                let task = tokio::spawn(publish::run(cfg, First(Some(tx)), 1, inv_tx, watch::channel(Some(Ok(()))).1));
                let k = rx.await.unwrap();
                starts.push(t.elapsed());
                task.abort();
                assert_eq!(k, 64);
            }
            let (b50, _, _) = pct(starts);
            println!("publisher start to first pool (64 devices, median of 9):      {:.1} ms", b50.as_secs_f64() * 1e3);
            println!("64 devices / DGX 8 devices: {:.2}x", b50.as_secs_f64() / d50.as_secs_f64());
        }
        dynamic_mig().await;
    });
}

/// A claim for one MIG device of the DGX A100 fixture, `n`-th of its kind `kind`.
fn mig_claim(kind: &str, n: usize, device: &str) -> (ResourceClaim, ClaimRef) {
    let uid = format!("00000000-0000-4000-9{}00-{n:012}", if kind == "dyn" { 1 } else { 2 });
    let name = format!("{kind}{n}");
    let c = serde_json::from_value(serde_json::json!({
        "metadata": {"namespace": "bench", "name": name, "uid": uid},
        "spec": {"devices": {"requests": []}},
        "status": {"allocation": {"devices": {"results": [
            {"request": "mig", "driver": "actk.dev", "pool": "node-a", "device": device}
        ]}}}
    }))
    .unwrap();
    (c, ClaimRef { namespace: "bench".into(), uid, name })
}

/// Issue 27: prepare and unprepare latency of a dynamic MIG claim (a 3g.40gb made at prepare
/// and destroyed at unprepare through the NVML double, on the DGX A100 fixture's GPU 4 in MIG
/// mode) against a claim for a static MIG device of the same fixture (GPU 0's 3g.40gb), in
/// one run, in-process. The double's create and destroy rewrite its state file and the
/// capability files; on a real node they are ioctls to the kernel driver, whose own time
/// (tens of ms per GPU instance, NVIDIA's figures) this does not include.
async fn dynamic_mig() {
    const RUNS: usize = 40;
    let Some(f) = actk_testsupport::fixture::prepare("nvidia-dgx-a100").unwrap() else { return };
    actk_testsupport::nvml_double::enable_mig(&f.root, 4).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let profiles = actk_core::profile::builtin();
    let inv = actk_core::discover::discover(&f.root, &profiles);
    let mut layouts = actk_dra::mig::Layouts::new();
    actk_dra::mig::read_layouts(&f.root, &inv, &mut layouts);
    let plan = actk_dra::mig::plan(&inv, &layouts, &Default::default());
    assert!(plan.placements.contains_key("nvidia-4-mig-3g-40gb-4"));
    let (_p_tx, p_rx) = watch::channel(Arc::new(plan.placements));
    let (_inv_tx, inv_rx) = watch::channel(Arc::new(inv));
    let claims = Arc::new(MemoryClaims::default());
    let driver = Driver::new(
        "node-a".into(),
        profiles,
        dir.path().join("cdi"),
        dir.path().join("plugin/checkpoint.json"),
        SpecOptions { host_mount: "/".into(), ..Default::default() },
        inv_rx,
        claims.clone(),
    )
    .unwrap()
    .with_dynamic_mig(f.root.clone(), p_rx);
    let mut figures = Vec::new();
    for (kind, device) in [("static", "nvidia-0-mig-2-0"), ("dyn", "nvidia-4-mig-3g-40gb-4")] {
        let (mut prep, mut unprep) = (Vec::new(), Vec::new());
        for n in 0..RUNS {
            let (c, want) = mig_claim(kind, n, device);
            claims.put(c);
            let t = Instant::now();
            driver.prepare(&want).await.unwrap();
            prep.push(t.elapsed());
            let t = Instant::now();
            driver.unprepare(&want).await.unwrap();
            unprep.push(t.elapsed());
        }
        let (p50, p99, _) = pct(prep);
        let (u50, u99, _) = pct(unprep);
        println!(
            "MIG claim, {kind:>6} ({device}, {RUNS} runs): prepare p50 {} p99 {}; unprepare p50 {} p99 {}",
            us(p50),
            us(p99),
            us(u50),
            us(u99)
        );
        figures.push((p50, u50));
    }
    println!(
        "dynamic / static MIG claim, p50: prepare {:.1}x, unprepare {:.1}x",
        figures[1].0.as_secs_f64() / figures[0].0.as_secs_f64(),
        figures[1].1.as_secs_f64() / figures[0].1.as_secs_f64()
    );
}
