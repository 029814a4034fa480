//! Exporter and labeller costs (issue 30, "Measured, in a bench"): for 8 and 64 devices, the
//! wall time and the CPU time of one scrape; and the label reconciliation after a device
//! change (discovery, labels, the NFD feature file written).
//!
//! - 8 devices: the whole scrape of the DGX H100 fixture (discovery cached as in the running
//!   exporter, NVML readings through the NVML double, the health engine's checks, attribution,
//!   encoding), no kubelet round trip (that is the kubelet's cost, not the exporter's).
//! - 64 devices: no real node has 64 GPUs; the readings, holders and health of 64 devices
//!   (every one held by a pod) are synthesised and the page rendered, which is the part that
//!   grows with the device count; the per-device read cost is the 8-device figure / 8.
//!
//! Run: `cargo bench -p actk-exporter --bench scrape` (as root: the fixture has device nodes).
//! Prints medians over about a second of runs each; CPU time is the calling thread's.

use actk_exporter::{Exporter, Page, render};
use actk_holders::{DeviceHolders, Holder};
use actk_node::telemetry::{ErrorCount, Reading};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

fn thread_cpu() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// Median wall and CPU time of `f` over about a second of runs (at least 20).
fn measure(mut f: impl FnMut()) -> (Duration, Duration) {
    let mut wall = Vec::new();
    let mut cpu = Vec::new();
    let start = Instant::now();
    while wall.len() < 20 || start.elapsed() < Duration::from_secs(1) {
        let (w, c) = (Instant::now(), thread_cpu());
        f();
        cpu.push(thread_cpu() - c);
        wall.push(w.elapsed());
    }
    wall.sort();
    cpu.sort();
    (wall[wall.len() / 2], cpu[cpu.len() / 2])
}

/// Health by (kind, index), as [`Page::health`].
type Health = BTreeMap<(String, u32), Option<String>>;

fn synthetic(n: u32) -> (Vec<Reading>, Vec<DeviceHolders>, Health) {
    let kind = "nvidia.com/gpu".to_string();
    let readings = (0..n)
        .map(|i| Reading {
            kind: kind.clone(),
            vendor: "nvidia".into(),
            index: i,
            uuid: Some(format!("GPU-{i:08x}-0000-0000-0000-000000000000")),
            model: Some("NVIDIA H100 80GB HBM3".into()),
            utilization_percent: Some(50.0),
            memory_used_bytes: Some(1 << 34),
            memory_total_bytes: Some(81559 << 20),
            temperatures: vec![("gpu".into(), 40.0)],
            power_watts: Some(300.0),
            power_limit_watts: Some(700.0),
            errors: ["volatile", "aggregate"]
                .iter()
                .flat_map(|c| {
                    ["corrected", "uncorrected"].map(|s| ErrorCount {
                        source: format!("ecc_{c}"),
                        severity: s.into(),
                        count: 0,
                    })
                })
                .collect(),
            ..Default::default()
        })
        .collect();
    let holders = (0..n)
        .map(|i| DeviceHolders {
            kind: kind.clone(),
            index: i,
            uuid: None,
            model: None,
            holders: vec![Holder {
                namespace: Some("ml".into()),
                pod: Some(format!("train-{i}")),
                container: Some("trainer".into()),
                container_id: None,
                engine: "kubelet".into(),
                via: "device plugin nvidia.com/gpu".into(),
                part: None,
            }],
        })
        .collect();
    let health = (0..n).map(|i| ((kind.clone(), i), None)).collect();
    (readings, holders, health)
}

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    if !actk_testsupport::fixture::prepare_at("nvidia-dgx-h100", &root).unwrap() {
        eprintln!("skipping: the fixture needs root for mknod");
        return;
    }
    let ex = Exporter::new(&root, &root, actk_core::profile::builtin(), "bench".into(), Duration::from_secs(3600));
    let page = ex.scrape(Some(&[]));
    let (w, c) = measure(|| {
        std::hint::black_box(ex.scrape(Some(&[])));
    });
    println!("scrape, 8 devices (DGX H100 fixture, NVML double): wall {w:?}, CPU {c:?}, page {} bytes", page.len());

    for n in [8u32, 64] {
        let (readings, holders, health) = synthetic(n);
        let drivers = BTreeMap::from([("nvidia.com/gpu".to_string(), "580.95.05".to_string())]);
        let p = Page {
            node: "bench",
            readings: &readings,
            holders: &holders,
            health: &health,
            drivers: &drivers,
            pod_resources_up: true,
        };
        let text = render(&p);
        let (w, c) = measure(|| {
            std::hint::black_box(render(&p));
        });
        println!("render, {n} devices held by pods: wall {w:?}, CPU {c:?}, page {} bytes", text.len());
    }

    // Label reconciliation after a device change: GPU 7's node goes, discovery runs, the labels
    // are computed and the NFD feature file replaced.
    std::fs::remove_file(root.join("dev/nvidia7")).unwrap();
    let profiles = actk_core::profile::builtin();
    let out = dir.path().join("features.d/actk");
    std::fs::create_dir_all(out.parent().unwrap()).unwrap();
    let (w, c) = measure(|| {
        let inv = actk_core::discover::discover(&root, &profiles);
        let l = actk_node::labels::labels(&inv, &Default::default());
        assert_eq!(l["nvidia.com/gpu.count"], "7");
        let tmp = out.with_extension("tmp");
        std::fs::write(&tmp, actk_node::labels::feature_file(&l)).unwrap();
        std::fs::rename(&tmp, &out).unwrap();
    });
    println!("label reconciliation after a device change (discover + labels + feature file): wall {w:?}, CPU {c:?}");
}
