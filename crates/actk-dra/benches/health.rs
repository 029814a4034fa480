//! Benchmark of health that acts (issue 26): the time from a fixture device turning unhealthy
//! to what acts on it, printed as plain figures (p50, p99, max over rounds):
//! - the DRA driver's publisher: the device's taint in the published ResourceSlice devices
//!   (what goes to the API server; the apply itself, one server-side apply, is left out) and
//!   the UNHEALTHY entry on the kubelet's DRAResourceHealth stream (v1, over the DRA socket);
//! - the device plugin's source: the shared engine's health channel (actk-node
//!   `health::spawn`), which ListAndWatch forwards to the kubelet as it changes;
//!
//! for each vendor's signal: a device node removed (NVIDIA, hetero fixture), an Xid from the
//! NVML double (DGX H100), an AMD RAS `ue` bump (MI300X), a Neuron ECC count (inf2), a Gaudi
//! hard reset; at the drivers' default health interval (500 ms) and at 50 ms. A round starts
//! just after the loop looked (the previous round's recovery was seen then), so each figure is
//! the worst case: one interval plus the work of one round. What it shows is that no other delay
//! hides in the path (a new generation built and handed to the sink, the stream's send).
//!
//! Run: `cargo bench -p actk-dra --bench health` (root: fixtures need mknod). Rounds per case:
//! `ACTK_BENCH_ROUNDS` (default 15).

use actk_dra::api::health_v1;
use actk_dra::health::{HealthReport, HealthService, TaintMode};
use actk_dra::publish::{self, HealthConfig, PublishConfig, Sink};
use actk_node::health::{HealthOptions, XidPolicy};
use actk_testsupport::fixture::{self, Fixture};
use actk_testsupport::nvml_double;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};

/// Device name -> tainted, per publication.
struct Recorder(mpsc::UnboundedSender<Vec<(String, bool)>>);

impl Sink for Recorder {
    async fn node(&mut self) -> Result<publish::NodeView, String> {
        Ok(Default::default())
    }
    async fn intact(&mut self, _: i64) -> Result<bool, String> {
        Ok(true)
    }
    async fn publish(&mut self, _: i64, pool: actk_dra::slice::Pool) -> Result<(), String> {
        let devices = pool.devices;
        let _ = self.0.send(devices.into_iter().map(|d| (d.name, d.taints.is_some_and(|t| !t.is_empty()))).collect());
        Ok(())
    }
}

/// One signal: fixture, profile, device name, how to make it unhealthy and healthy again.
struct Case {
    label: &'static str,
    fixture: &'static str,
    profile: &'static str,
    device: &'static str,
    sick: fn(&Fixture, u32),
    well: fn(&Fixture, u32),
}

fn real(f: &Fixture, path: &str) -> PathBuf {
    let host = actk_core::discover::HostRoot::new(&f.root);
    host.host_path(host.resolve(path).unwrap())
}

const CASES: &[Case] = &[
    Case {
        label: "device node removed (NVIDIA)",
        fixture: "hetero-nvidia-neuron",
        profile: "nvidia",
        device: "nvidia-0",
        sick: |f, _| std::fs::remove_file(f.path("/dev/nvidia1")).unwrap(),
        well: |f, _| {
            let ok = std::process::Command::new("mknod").arg(f.path("/dev/nvidia1")).args(["c", "195", "1"]).status();
            assert!(ok.unwrap().success());
        },
    },
    Case {
        label: "NVML Xid 79 (NVML double)",
        fixture: "nvidia-dgx-h100",
        profile: "nvidia",
        device: "nvidia-3",
        sick: |f, _| {
            let s = nvml_double::State::of(&f.root).unwrap();
            nvml_double::raise_xid(&f.root, &s.gpu_uuid(3), 79).unwrap();
        },
        well: |_, _| {},
    },
    Case {
        label: "AMD RAS umc ue +1",
        fixture: "amd-mi300x",
        profile: "amd",
        device: "amd-2",
        sick: |f, n| {
            std::fs::write(real(f, "/sys/class/drm/card3/device/ras/umc_err_count"), format!("ue: {n}\nce: 0\nde: 0\n"))
                .unwrap()
        },
        well: |_, _| {},
    },
    Case {
        label: "Neuron HBM ECC +1",
        fixture: "aws-inf2-48xlarge",
        profile: "neuron",
        device: "neuron-4",
        sick: |f, n| {
            std::fs::write(
                real(f, "/sys/class/neuron_device/neuron4/stats/hardware/mem_ecc_uncorrected"),
                format!("{n}\n"),
            )
            .unwrap()
        },
        well: |_, _| {},
    },
    Case {
        label: "Gaudi hard reset +1",
        fixture: "gaudi2",
        profile: "gaudi",
        device: "gaudi-7",
        sick: |f, n| {
            std::fs::write(real(f, "/sys/class/accel/accel7/device/hard_reset_cnt"), format!("{n}\n")).unwrap()
        },
        well: |_, _| {},
    },
];

fn pct(mut v: Vec<Duration>) -> String {
    v.sort();
    let at = |p: f64| v[((v.len() as f64 * p) as usize).min(v.len() - 1)];
    let ms = |d: Duration| format!("{:.1}", d.as_secs_f64() * 1e3);
    format!("p50 {} / p99 {} / max {} ms", ms(at(0.5)), ms(at(0.99)), ms(*v.last().unwrap()))
}

/// Counter values written by the cases: always rising, across every run on one fixture (a
/// counter that went down is re-based, not an error).
static COUNT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

fn next_count() -> u32 {
    COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1
}

/// The recovery time of error events in the bench: short, so that rounds follow each other.
const RECOVERY: Duration = Duration::from_millis(200);

async fn bench_dra(case: &Case, f: &Fixture, interval: Duration, rounds: u32) -> (Vec<Duration>, Vec<Duration>) {
    let (tx, mut slices) = mpsc::unbounded_channel();
    let (inv_tx, _inv_rx) = watch::channel(Arc::new(actk_core::inventory::Inventory::default()));
    let (report_tx, report_rx) = watch::channel(Arc::new(HealthReport::default()));
    let cfg = PublishConfig {
        root: f.root.clone(),
        profiles: actk_core::profile::builtin(),
        served: Some([case.profile.to_string()].into()),
        health: interval,
        rediscover: Duration::from_secs(600),
        allow_device_plugin_overlap: false,
        state: None,
        node_choice: None,
        publish_lock: None,
        defer_to: None,
        metrics: None,
        health_engine: HealthConfig {
            options: Some(HealthOptions { policy: XidPolicy::new(&[], RECOVERY, None, None), poll: interval }),
            taints: TaintMode::Taint { lost_no_execute: false },
            report: Some((Arc::new(report_tx), "node-a".into())),
        },
        dynamic_mig: None,
    };
    let task = tokio::spawn(publish::run(cfg, Recorder(tx), 1, inv_tx, watch::channel(Some(Ok(()))).1));
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("dra.sock");
    let svc = HealthService { reports: report_rx, heartbeat: Duration::from_secs(10) };
    let (_itx, irx) = watch::channel(Arc::new(actk_core::inventory::Inventory::default()));
    let driver = actk_dra::driver::Driver::new(
        "node-a".into(),
        actk_core::profile::builtin(),
        dir.path().join("cdi"),
        dir.path().join("checkpoint.json"),
        Default::default(),
        irx,
        Arc::new(actk_dra::driver::MemoryClaims::default()),
    )
    .unwrap();
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    tokio::spawn(actk_dra::plugin::serve(
        sock.clone(),
        actk_dra::plugin::Socket::DraWithHealth(actk_dra::service::DraService(Arc::new(driver)), svc),
        Some(ready_tx),
    ));
    ready_rx.await.unwrap();
    let ch = actk_node::uds::connect(&sock).await.unwrap();
    let mut stream = health_v1::dra_resource_health_client::DraResourceHealthClient::new(ch)
        .node_watch_resources(health_v1::NodeWatchResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    let tainted = |p: &Vec<(String, bool)>| p.iter().any(|(n, t)| n == case.device && *t);
    let limit = Duration::from_secs(10);
    // The first pool, untainted, and a baseline read of every counter.
    loop {
        let p = tokio::time::timeout(limit, slices.recv())
            .await
            .unwrap_or_else(|_| panic!("{}: no untainted first pool within {limit:?}", case.label))
            .unwrap();
        if p.iter().any(|(n, _)| n == case.device) && !tainted(&p) {
            break;
        }
    }
    tokio::time::sleep(interval * 3).await;
    let (mut to_taint, mut to_stream) = (Vec::new(), Vec::new());
    for round in 1..=rounds {
        while slices.try_recv().is_ok() {}
        let t = Instant::now();
        (case.sick)(f, next_count());
        let mut seen_slice = None;
        let mut seen_stream = None;
        while seen_slice.is_none() || seen_stream.is_none() {
            tokio::select! {
                p = slices.recv() => if tainted(&p.unwrap()) && seen_slice.is_none() { seen_slice = Some(t.elapsed()) },
                r = stream.message() => {
                    let r = r.unwrap().unwrap();
                    let bad = r.devices.iter().any(|d| {
                        d.device.as_ref().is_some_and(|i| i.device_name == case.device)
                            && d.health == health_v1::HealthStatus::Unhealthy as i32
                    });
                    if bad && seen_stream.is_none() { seen_stream = Some(t.elapsed()) }
                }
                _ = tokio::time::sleep(limit) => panic!("{}: round {round} not seen within {limit:?}", case.label),
            }
        }
        to_taint.push(seen_slice.unwrap());
        to_stream.push(seen_stream.unwrap());
        (case.well)(f, round);
        // Healthy again (the node back, or the quiet time over) before the next round.
        loop {
            let p = tokio::time::timeout(limit, slices.recv())
                .await
                .unwrap_or_else(|_| panic!("{}: round {round}: not healthy again within {limit:?}", case.label))
                .unwrap();
            if !tainted(&p) {
                break;
            }
        }
        if case.label.contains("Xid") {
            // The double's events file grows; the watch reads each event once.
            tokio::time::sleep(interval).await;
        }
    }
    task.abort();
    (to_taint, to_stream)
}

async fn bench_engine(case: &Case, f: &Fixture, interval: Duration, rounds: u32) -> Vec<Duration> {
    let profiles = actk_core::profile::builtin();
    let inv = actk_core::discover::discover(&f.root, &profiles);
    let p = profiles.iter().find(|p| p.name == case.profile).unwrap();
    let v = inv.vendor(&p.name).unwrap();
    let opts = HealthOptions { policy: XidPolicy::new(&[], RECOVERY, None, None), poll: interval };
    let monitor = actk_node::health::Monitor::new(&f.root, p, v, &opts);
    let index: u32 = case.device.rsplit('-').next().unwrap().parse().unwrap();
    let mut rx = actk_node::health::spawn(case.profile.into(), monitor, interval);
    tokio::time::sleep(interval * 3).await;
    let sick = |h: &actk_node::health::HealthMap| h.get(&(index, None)).is_some_and(Option::is_some);
    let mut out = Vec::new();
    for round in 1..=rounds {
        rx.borrow_and_update();
        let t = Instant::now();
        (case.sick)(f, next_count());
        tokio::time::timeout(Duration::from_secs(10), rx.wait_for(sick)).await.unwrap().unwrap();
        out.push(t.elapsed());
        (case.well)(f, round);
        tokio::time::timeout(Duration::from_secs(10), rx.wait_for(|h| !sick(h))).await.unwrap().unwrap();
        if case.label.contains("Xid") {
            tokio::time::sleep(interval).await;
        }
    }
    out
}

fn main() {
    let rounds: u32 = std::env::var("ACTK_BENCH_ROUNDS").ok().and_then(|s| s.parse().ok()).unwrap_or(15);
    // One thread, as the driver runs.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    println!("health that acts: time from a device turning unhealthy, {rounds} rounds each");
    for case in CASES {
        let Some(f) = fixture::prepare(case.fixture).unwrap() else {
            println!("skipped: fixtures need root (mknod)");
            return;
        };
        for interval in [Duration::from_millis(500), Duration::from_millis(50)] {
            let (taint, stream) = rt.block_on(bench_dra(case, &f, interval, rounds));
            let engine = rt.block_on(bench_engine(case, &f, interval, rounds));
            let iv = interval.as_millis();
            println!("{:<30} interval {iv:>3} ms  DRA taint in slice:        {}", case.label, pct(taint));
            println!("{:<30} interval {iv:>3} ms  kubelet health stream:     {}", case.label, pct(stream));
            println!("{:<30} interval {iv:>3} ms  ListAndWatch source (engine): {}", case.label, pct(engine));
        }
    }
}
