//! Device health in the DRA driver, for every vendor's signal, over the fixture hosts: the
//! publisher (the API server replaced by a recorder of the slices' devices and taints) and the
//! DRAResourceHealth service on a unix socket, watched as the kubelet watches it. A device made
//! unhealthy (its node removed, an Xid from the NVML double, an AMD RAS `ue` bump, a Neuron ECC
//! count, a Gaudi hard reset) is tainted `actk.dev/unhealthy` in the slice and reported
//! UNHEALTHY to the kubelet within seconds; recovery removes the taint and reports HEALTHY.
//! Where the API server drops taints (1.34), the device leaves the slice instead and is still
//! reported.

use actk_dra::api::{health_v1, health_v1alpha1};
use actk_dra::health::{HealthReport, HealthService, TAINT_KEY, TaintMode};
use actk_dra::publish::{self, HealthConfig, PublishConfig, Sink};
use actk_node::health::{HealthOptions, XidPolicy};
use actk_testsupport::fixture::{self, Fixture};
use actk_testsupport::nvml_double;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};

/// A published device: its name and its taints as `key=value:effect`.
type Published = Vec<(String, Vec<String>)>;

struct Recorder {
    tx: mpsc::UnboundedSender<Published>,
}

impl Sink for Recorder {
    async fn node(&mut self) -> Result<publish::NodeView, String> {
        Ok(publish::NodeView::default())
    }
    async fn intact(&mut self, _: i64) -> Result<bool, String> {
        Ok(true)
    }
    async fn publish(&mut self, _: i64, pool: actk_dra::slice::Pool) -> Result<(), String> {
        let devices = pool.devices;
        let p = devices
            .into_iter()
            .map(|d| {
                let t = d
                    .taints
                    .unwrap_or_default()
                    .into_iter()
                    .map(|t| format!("{}={}:{}", t.key, t.value.unwrap_or_default(), t.effect))
                    .collect();
                (d.name, t)
            })
            .collect();
        let _ = self.tx.send(p);
        Ok(())
    }
}

/// The publisher and health service of one fixture, and the kubelet's side of both.
struct Node {
    slices: mpsc::UnboundedReceiver<Published>,
    /// What the publisher offers to prepare.
    inventory: watch::Receiver<Arc<actk_core::inventory::Inventory>>,
    health: tonic::Streaming<health_v1::NodeWatchResourcesResponse>,
    _dir: tempfile::TempDir,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Node {
    fn drop(&mut self) {
        self.task.abort();
    }
}

const POOL: &str = "node-a";

/// Starts the publisher over `f` serving `profile` with `mode` and error recovery `recovery`,
/// and the health service on a socket, and opens the kubelet's v1 health stream.
async fn start(f: &Fixture, profile: &str, mode: TaintMode, recovery: Duration) -> Node {
    start_with(f, profile, mode, recovery, Duration::from_secs(60)).await
}

/// [`start`], rediscovering every `rediscover`.
async fn start_with(f: &Fixture, profile: &str, mode: TaintMode, recovery: Duration, rediscover: Duration) -> Node {
    let (tx, slices) = mpsc::unbounded_channel();
    let (inv_tx, inventory) = watch::channel(Arc::new(actk_core::inventory::Inventory::default()));
    let (report_tx, report_rx) = watch::channel(Arc::new(HealthReport::default()));
    let cfg = PublishConfig {
        root: f.root.clone(),
        profiles: actk_core::profile::builtin(),
        served: Some([profile.to_string()].into()),
        health: Duration::from_millis(50),
        rediscover,
        allow_device_plugin_overlap: false,
        state: None,
        node_choice: None,
        publish_lock: None,
        defer_to: None,
        metrics: None,
        health_engine: HealthConfig {
            options: Some(HealthOptions {
                policy: XidPolicy::new(&[], recovery, None, None),
                poll: Duration::from_millis(50),
            }),
            taints: mode,
            report: Some((Arc::new(report_tx), POOL.into())),
        },
        dynamic_mig: None,
    };
    let registered = watch::channel(Some(Ok(()))).1;
    let task = tokio::spawn(publish::run(cfg, Recorder { tx }, 1, inv_tx, registered));
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("dra.sock");
    let svc = HealthService { reports: report_rx, heartbeat: Duration::from_millis(300) };
    let driver = Arc::new(dummy_driver(dir.path()));
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    tokio::spawn(actk_dra::plugin::serve(
        sock.clone(),
        actk_dra::plugin::Socket::DraWithHealth(actk_dra::service::DraService(driver), svc),
        Some(ready_tx),
    ));
    ready_rx.await.unwrap();
    let ch = actk_node::uds::connect(&sock).await.unwrap();
    let health = health_v1::dra_resource_health_client::DraResourceHealthClient::new(ch)
        .node_watch_resources(health_v1::NodeWatchResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    Node { slices, inventory, health, _dir: dir, task }
}

/// A driver with no inventory (the health service shares the DRA socket; these tests prepare
/// nothing).
fn dummy_driver(dir: &std::path::Path) -> actk_dra::driver::Driver {
    struct NoClaims;
    impl actk_dra::driver::ClaimSource for NoClaims {
        fn get(
            &self,
            _: &str,
            _: &str,
        ) -> std::pin::Pin<
            Box<dyn Future<Output = Result<k8s_openapi::api::resource::v1::ResourceClaim, String>> + Send + '_>,
        > {
            Box::pin(async { Err("no API server in this test".to_string()) })
        }
    }
    let (_tx, rx) = watch::channel(Arc::new(actk_core::inventory::Inventory::default()));
    actk_dra::driver::Driver::new(
        POOL.into(),
        actk_core::profile::builtin(),
        dir.join("cdi"),
        dir.join("checkpoint.json"),
        Default::default(),
        rx,
        Arc::new(NoClaims),
    )
    .unwrap()
}

impl Node {
    /// The next publication whose device `name` satisfies `want` (`None`: not published),
    /// within `limit`.
    async fn slice_until(
        &mut self,
        name: &str,
        limit: Duration,
        want: impl Fn(Option<&Vec<String>>) -> bool,
    ) -> Published {
        let t = Instant::now();
        loop {
            let left = limit.checked_sub(t.elapsed()).unwrap_or_default();
            let p = tokio::time::timeout(left, self.slices.recv())
                .await
                .unwrap_or_else(|_| panic!("{name}: no matching publication within {limit:?}"))
                .unwrap();
            if want(p.iter().find(|(n, _)| n == name).map(|(_, t)| t)) {
                return p;
            }
        }
    }

    /// The health the kubelet is told of device `name` once it is `want` (1 healthy, 2
    /// unhealthy), within `limit`, with its message.
    async fn health_until(&mut self, name: &str, want: i32, limit: Duration) -> String {
        let t = Instant::now();
        loop {
            let left = limit.checked_sub(t.elapsed()).unwrap_or_default();
            let r = tokio::time::timeout(left, self.health.message())
                .await
                .unwrap_or_else(|_| panic!("{name}: health {want} not reported within {limit:?}"))
                .unwrap()
                .unwrap();
            if let Some(d) = r.devices.iter().find(|d| d.device.as_ref().is_some_and(|i| i.device_name == name))
                && d.health == want
            {
                assert_eq!(d.device.as_ref().unwrap().pool_name, POOL);
                assert!(d.last_updated_time > 0);
                return d.message.clone();
            }
        }
    }
}

const HEALTHY: i32 = health_v1::HealthStatus::Healthy as i32;
const UNHEALTHY: i32 = health_v1::HealthStatus::Unhealthy as i32;

fn real(f: &Fixture, path: &str) -> PathBuf {
    let host = actk_core::discover::HostRoot::new(&f.root);
    host.host_path(host.resolve(path).unwrap_or_else(|e| panic!("{path}: {e}")))
}

fn taint(code: &str, effect: &str) -> Vec<String> {
    vec![format!("{TAINT_KEY}={code}:{effect}")]
}

const TAINTS: TaintMode = TaintMode::Taint { lost_no_execute: false };
/// How long a test waits for a publication or a health report: long enough for a CI machine
/// running six of these at once on 2 cores (5 s was not, once: an Xid's taint came later); a
/// wait ends as soon as what it waits for arrives, so this only bounds a failure.
const SECONDS: Duration = Duration::from_secs(20);

#[tokio::test]
async fn a_removed_device_node_is_tainted_reported_and_recovers() {
    let Some(f) = fixture::prepare("hetero-nvidia-neuron").unwrap() else { return };
    let mut n = start(&f, "nvidia", TaintMode::Taint { lost_no_execute: true }, Duration::from_secs(60)).await;
    let first = n.slice_until("nvidia-0", SECONDS, |t| t.is_some_and(Vec::is_empty)).await;
    assert_eq!(first.len(), 2, "{first:?}");
    n.health_until("nvidia-0", HEALTHY, SECONDS).await;
    // GPU index 0 is /dev/nvidia1 on this fixture (Device Minor 1, SOURCES.md).
    let node = f.path("/dev/nvidia1");
    std::fs::remove_file(&node).unwrap();
    let t = Instant::now();
    let p = n.slice_until("nvidia-0", SECONDS, |t| t.is_some_and(|t| !t.is_empty())).await;
    let took = t.elapsed();
    let tainted: BTreeMap<_, _> = p.into_iter().collect();
    assert_eq!(tainted["nvidia-0"], taint("device-node-gone", "NoExecute"), "lost, and the admin opted in");
    assert_eq!(tainted["nvidia-1"], Vec::<String>::new(), "the other GPU is untouched");
    let msg = n.health_until("nvidia-0", UNHEALTHY, SECONDS).await;
    assert!(msg.contains("/dev/nvidia1") && msg.contains("device-node-gone"), "{msg}");
    eprintln!("taint published {took:?} after the node was removed");
    // Lost: not offered to prepare, even to a claim that tolerates the taint.
    let usable = n.inventory.borrow().clone();
    let left: Vec<u32> = usable.vendor("nvidia").unwrap().devices.iter().map(|d| d.index).collect();
    assert_eq!(left, [1], "the lost GPU is not preparable");
    assert!(std::process::Command::new("mknod").arg(&node).args(["c", "195", "1"]).status().unwrap().success());
    n.slice_until("nvidia-0", SECONDS, |t| t.is_some_and(Vec::is_empty)).await;
    n.health_until("nvidia-0", HEALTHY, SECONDS).await;
}

/// A rediscovery that runs before the health check sees the node gone finds the GPU without
/// a node; the GPU stays in the slice, tainted as lost, and the kubelet is told (it left the
/// slice untold when discovery saw it first, on a 1.37 cluster).
#[tokio::test]
async fn a_gpu_rediscovery_finds_without_its_node_stays_tainted() {
    let Some(f) = fixture::prepare("hetero-nvidia-neuron").unwrap() else { return };
    // Rediscovery every 20 ms, health every 50 ms: discovery usually sees the node gone first.
    let mut n = start_with(&f, "nvidia", TAINTS, Duration::from_secs(60), Duration::from_millis(20)).await;
    n.slice_until("nvidia-0", SECONDS, |t| t.is_some_and(Vec::is_empty)).await;
    n.health_until("nvidia-0", HEALTHY, SECONDS).await;
    let node = f.path("/dev/nvidia1");
    std::fs::remove_file(&node).unwrap();
    let p = n.slice_until("nvidia-0", SECONDS, |t| t.is_none_or(|t| !t.is_empty())).await;
    let p: BTreeMap<_, _> = p.into_iter().collect();
    assert_eq!(p.get("nvidia-0"), Some(&taint("device-node-gone", "NoSchedule")), "{p:?}");
    let msg = n.health_until("nvidia-0", UNHEALTHY, SECONDS).await;
    assert!(msg.contains("/dev/nvidia1"), "{msg}");
    // Several rediscoveries later it is still there, still tainted.
    tokio::time::sleep(Duration::from_millis(300)).await;
    while let Ok(p) = n.slices.try_recv() {
        let p: BTreeMap<_, _> = p.into_iter().collect();
        assert_eq!(p.get("nvidia-0"), Some(&taint("device-node-gone", "NoSchedule")), "{p:?}");
    }
    assert!(std::process::Command::new("mknod").arg(&node).args(["c", "195", "1"]).status().unwrap().success());
    n.slice_until("nvidia-0", SECONDS, |t| t.is_some_and(Vec::is_empty)).await;
    n.health_until("nvidia-0", HEALTHY, SECONDS).await;
}

/// A GPU that discovery no longer finds at all (it left /proc/driver/nvidia/gpus, as on a PCI
/// remove) while its node stays (NVIDIA's nodes are static): the probe alone would call it
/// healthy; it is kept in the slice tainted `device-gone`, reported unhealthy, and not offered
/// to prepare; back in procfs, it is published whole again.
#[tokio::test]
async fn a_gpu_discovery_no_longer_finds_is_tainted_gone_though_its_node_stays() {
    let Some(f) = fixture::prepare("hetero-nvidia-neuron").unwrap() else { return };
    let mut n = start_with(&f, "nvidia", TAINTS, Duration::from_secs(60), Duration::from_millis(50)).await;
    n.slice_until("nvidia-1", SECONDS, |t| t.is_some_and(Vec::is_empty)).await;
    // GPU index 1 is the second bus id in procfs order (SOURCES.md): 0000:00:1c.0.
    let proc = real(&f, "/proc/driver/nvidia/gpus/0000:00:1c.0");
    let aside = f.root.join("gpu-1-removed");
    std::fs::rename(&proc, &aside).unwrap();
    let p = n.slice_until("nvidia-1", SECONDS, |t| t.is_none_or(|t| !t.is_empty())).await;
    let p: BTreeMap<_, _> = p.into_iter().collect();
    assert_eq!(p.get("nvidia-1"), Some(&taint("device-gone", "NoSchedule")), "{p:?}");
    assert_eq!(p.get("nvidia-0"), Some(&vec![]), "{p:?}");
    let usable =
        n.inventory.wait_for(|i| i.vendor("nvidia").is_some_and(|v| v.devices.len() == 1)).await.unwrap().clone();
    assert_eq!(usable.vendor("nvidia").unwrap().devices[0].index, 0, "the lost GPU is not offered to prepare");
    std::fs::rename(&aside, &proc).unwrap();
    n.slice_until("nvidia-1", SECONDS, |t| t.is_some_and(Vec::is_empty)).await;
}

#[tokio::test]
async fn nvml_xids_taint_the_gpu_and_application_xids_do_not() {
    let Some(f) = fixture::prepare("nvidia-dgx-h100").unwrap() else { return };
    let state = nvml_double::State::of(&f.root).unwrap();
    let mut n = start(&f, "nvidia", TAINTS, Duration::from_millis(1500)).await;
    n.slice_until("nvidia-3", SECONDS, |t| t.is_some_and(Vec::is_empty)).await;
    nvml_double::raise_xid(&f.root, &state.gpu_uuid(2), 13).unwrap();
    nvml_double::raise_xid(&f.root, &state.gpu_uuid(3), 79).unwrap();
    let p = n.slice_until("nvidia-3", SECONDS, |t| t.is_some_and(|t| !t.is_empty())).await;
    let tainted: BTreeMap<_, _> = p.into_iter().collect();
    assert_eq!(tainted["nvidia-3"], taint("xid-79", "NoSchedule"));
    assert!(tainted["nvidia-2"].is_empty(), "Xid 13 is an application error");
    let msg = n.health_until("nvidia-3", UNHEALTHY, SECONDS).await;
    assert!(msg.contains("Xid 79"), "{msg}");
    // Faulty, not lost: still preparable for a claim that tolerates the taint.
    let usable = n.inventory.borrow().clone();
    assert_eq!(usable.vendor("nvidia").unwrap().devices.len(), 8, "a faulty GPU stays preparable");
    // Quiet for the recovery time: the taint goes.
    n.slice_until("nvidia-3", SECONDS, |t| t.is_some_and(Vec::is_empty)).await;
    n.health_until("nvidia-3", HEALTHY, SECONDS).await;
}

#[tokio::test]
async fn an_amd_ras_uncorrectable_count_taints_the_gpu_until_the_quiet_time_passes() {
    let Some(f) = fixture::prepare("amd-mi300x").unwrap() else { return };
    let mut n = start(&f, "amd", TAINTS, Duration::from_millis(1500)).await;
    n.slice_until("amd-2", SECONDS, |t| t.is_some_and(Vec::is_empty)).await;
    let umc = real(&f, "/sys/class/drm/card3/device/ras/umc_err_count");
    std::fs::write(&umc, "ue: 0\nce: 4\nde: 0\n").unwrap();
    std::fs::write(&umc, "ue: 1\nce: 4\nde: 0\n").unwrap();
    let p = n.slice_until("amd-2", SECONDS, |t| t.is_some_and(|t| !t.is_empty())).await;
    assert_eq!(p.iter().filter(|(_, t)| !t.is_empty()).count(), 1, "{p:?}");
    assert_eq!(p.iter().find(|(d, _)| d == "amd-2").unwrap().1, taint("ras-umc-ue", "NoSchedule"));
    let msg = n.health_until("amd-2", UNHEALTHY, SECONDS).await;
    assert!(msg.contains("rose from 0 to 1") && msg.contains("umc_err_count"), "{msg}");
    n.slice_until("amd-2", SECONDS, |t| t.is_some_and(Vec::is_empty)).await;
    n.health_until("amd-2", HEALTHY, SECONDS).await;
}

#[tokio::test]
async fn neuron_and_gaudi_error_counters_taint_their_devices() {
    for (fixture, profile, name, path, text, code) in [
        (
            "aws-inf2-48xlarge",
            "neuron",
            "neuron-4",
            "/sys/class/neuron_device/neuron4/stats/hardware/mem_ecc_uncorrected",
            "3\n",
            "mem-ecc-uncorrected",
        ),
        ("gaudi2", "gaudi", "gaudi-7", "/sys/class/accel/accel7/device/hard_reset_cnt", "1\n", "hard-reset"),
    ] {
        let Some(f) = fixture::prepare(fixture).unwrap() else { return };
        let mut n = start(&f, profile, TAINTS, Duration::ZERO).await;
        n.slice_until(name, SECONDS, |t| t.is_some_and(Vec::is_empty)).await;
        std::fs::write(real(&f, path), text).unwrap();
        let p = n.slice_until(name, SECONDS, |t| t.is_some_and(|t| !t.is_empty())).await;
        assert_eq!(p.iter().find(|(d, _)| d == name).unwrap().1, taint(code, "NoSchedule"), "{fixture}");
        assert_eq!(p.iter().filter(|(_, t)| !t.is_empty()).count(), 1, "{fixture}: {p:?}");
        let msg = n.health_until(name, UNHEALTHY, SECONDS).await;
        assert!(msg.contains(code), "{fixture}: {msg}");
    }
}

/// On a server that drops device taints (1.34 without DRADeviceTaints) the device leaves the
/// slice while it is unhealthy, and the kubelet still hears of it (v1alpha1, the 1.34 kubelet's).
#[tokio::test]
async fn without_taints_the_device_is_withdrawn_and_still_reported() {
    let Some(f) = fixture::prepare("amd-mi300x").unwrap() else { return };
    let mut n = start(&f, "amd", TaintMode::Withdraw, Duration::from_secs(60)).await;
    n.slice_until("amd-5", SECONDS, |t| t.is_some()).await;
    std::fs::write(real(&f, "/sys/class/drm/card6/device/ras/gfx_err_count"), "ue: 2\nce: 0\n").unwrap();
    let p = n.slice_until("amd-5", SECONDS, |t| t.is_none()).await;
    assert_eq!(p.len(), 7, "the other seven stay: {p:?}");
    assert!(p.iter().all(|(_, t)| t.is_empty()));
    n.health_until("amd-5", UNHEALTHY, SECONDS).await;
}

/// The v1alpha1 service (kubelet 1.34) streams the same report.
#[tokio::test]
async fn the_v1alpha1_stream_says_the_same() {
    let (tx, rx) = watch::channel(Arc::new(HealthReport::default()));
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("dra.sock");
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    tokio::spawn(actk_dra::plugin::serve(
        sock.clone(),
        actk_dra::plugin::Socket::DraWithHealth(
            actk_dra::service::DraService(Arc::new(dummy_driver(dir.path()))),
            HealthService { reports: rx, heartbeat: Duration::from_millis(200) },
        ),
        Some(ready_tx),
    ));
    ready_rx.await.unwrap();
    let ch = actk_node::uds::connect(&sock).await.unwrap();
    let mut s = health_v1alpha1::dra_resource_health_client::DraResourceHealthClient::new(ch)
        .node_watch_resources(health_v1alpha1::NodeWatchResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    let first = s.message().await.unwrap().unwrap();
    assert!(first.devices.is_empty());
    let problem = actk_node::health::Problem {
        kind: actk_node::health::ProblemKind::Faulty,
        code: "xid-48".into(),
        reason: "Xid 48 (critical) reported by NVML".into(),
    };
    let report = HealthReport {
        pool: POOL.into(),
        devices: [("nvidia-0".to_string(), None), ("nvidia-1".to_string(), Some(problem))].into(),
    };
    tx.send_replace(Arc::new(report));
    let r = s.message().await.unwrap().unwrap();
    let got: Vec<(String, i32, String)> =
        r.devices.iter().map(|d| (d.device.clone().unwrap().device_name, d.health, d.message.clone())).collect();
    assert_eq!(
        got,
        [
            ("nvidia-0".into(), health_v1alpha1::HealthStatus::Healthy as i32, String::new()),
            (
                "nvidia-1".into(),
                health_v1alpha1::HealthStatus::Unhealthy as i32,
                "Xid 48 (critical) reported by NVML [xid-48]".into()
            ),
        ]
    );
    // Unchanged, it is repeated (the kubelet takes a status older than 30 s as Unknown).
    let t = Instant::now();
    let again = tokio::time::timeout(Duration::from_secs(2), s.message()).await.unwrap().unwrap().unwrap();
    assert_eq!(again.devices.len(), 2);
    assert!(t.elapsed() >= Duration::from_millis(150), "{:?}", t.elapsed());
}
