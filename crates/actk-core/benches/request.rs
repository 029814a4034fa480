//! Cost of request parsing per KB of request (issue 10, finding 4: 80k CDI names in one
//! variable cost 36 s of root CPU per container start, quadratic de-duplication).
//!
//! For each request shape, values of 64 KB, 256 KB and 1 MB (1,000,000 bytes, under the 1 MiB
//! limit, so they are parsed in full) go through the planning path of a container start; the
//! median of several runs is printed as milliseconds and nanoseconds per KB, with the ratio of
//! the 1 MB cost per KB to the 64 KB cost per KB: about 1 means linear time (a quadratic parser
//! shows about 16; a 1 MB working set that no longer fits the CPU caches adds a little).
//! Each figure is the least thread CPU time over about a second of runs, so other processes on
//! the machine disturb it little.
//!
//! Shapes:
//! - `uuids`: `NVIDIA_VISIBLE_DEVICES` listing the 8 GPUs' UUIDs over and over, collected and
//!   resolved against an 8-GPU inventory (`request::collect` + `VendorRequest::resolve`);
//! - `cdi-names`: distinct qualified CDI names in `NVIDIA_VISIBLE_DEVICES` (`request::collect`;
//!   de-duplication of up to 50k names);
//! - `annotation`: one `cdi.k8s.io/` annotation repeating `nvidia.com/gpu=0`, planned through
//!   `plan::plan` with a CDI spec directory (names resolved through the registry);
//! - `refused`: the `uuids` value in a pod on a Kubernetes-policy node (`plan::plan`), which must
//!   not be parsed at all.
//!
//! Run: `cargo bench -p actk-core --bench request` (no root needed).

use actk_core::inventory::{Device, DeviceNode, Inventory, VendorInventory};
use actk_core::plan::{PlanContext, plan};
use actk_core::policy::Policy;
use actk_core::request;
use serde_json::json;
use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::{Duration, Instant};

const SIZES: &[usize] = &[64_000, 256_000, 1_000_000];

fn uuid(i: u32) -> String {
    format!("GPU-5e7e7e7e-0000-4000-8000-{i:012x}")
}

fn inventory() -> Inventory {
    let node = |path: String, minor| DeviceNode {
        path: path.clone(),
        host_path: path.into(),
        node_type: 'c',
        major: 1,
        minor,
        file_mode: Some(0o666),
        gid: None,
    };
    Inventory {
        root: "/".into(),
        vendors: vec![VendorInventory {
            profile: "nvidia".into(),
            kind: "nvidia.com/gpu".into(),
            devices: (0..8)
                .map(|i| Device {
                    index: i,
                    uuid: Some(uuid(i)),
                    nodes: vec![node(format!("/dev/nvidia{i}"), 3)],
                    ..Default::default()
                })
                .collect(),
            shared_nodes: vec![node("/dev/nvidiactl".into(), 3)],
            ..Default::default()
        }],
        warnings: vec![],
    }
}

/// A comma-separated list of `item(i)` as close to `size` bytes as whole items allow.
fn value_of(size: usize, item: impl Fn(u32) -> String) -> String {
    let mut v = String::with_capacity(size + 64);
    let mut i = 0;
    loop {
        let it = item(i);
        if v.len() + it.len() + 1 > size {
            break;
        }
        if !v.is_empty() {
            v.push(',');
        }
        v.push_str(&it);
        i += 1;
    }
    v
}

/// CPU time of this thread (CLOCK_THREAD_CPUTIME_ID): on a shared machine wall time mostly
/// measures the other processes.
fn thread_cpu() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// The least CPU time of `f` over enough runs to fill about a second of wall time (at least
/// 7): the run least disturbed by other processes (cache, frequency) is the closest to the
/// cost of the code itself.
fn best(mut f: impl FnMut()) -> Duration {
    f();
    let mut times = Vec::new();
    let start = Instant::now();
    while times.len() < 7 || (start.elapsed() < Duration::from_secs(1) && times.len() < 400) {
        let t = thread_cpu();
        f();
        times.push(thread_cpu() - t);
    }
    times.into_iter().min().unwrap_or_default()
}

fn main() {
    let profiles = actk_core::profile::builtin();
    let nvidia: Vec<_> = profiles.iter().filter(|p| p.name == "nvidia").cloned().collect();
    let inv = inventory();
    let spec_dir = tempfile::tempdir().expect("temporary spec dir");
    std::fs::write(
        spec_dir.path().join("nvidia.json"),
        json!({"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu", "devices": [
            {"name": "0", "containerEdits": {"deviceNodes": [{"path": "/dev/null", "type": "c", "major": 1, "minor": 3}]}}
        ]})
        .to_string(),
    )
    .expect("write spec");
    let ctx = PlanContext {
        profiles: nvidia.clone(),
        spec_dirs: vec![spec_dir.path().to_path_buf()],
        inventory: Some(inv.clone()),
        ..Default::default()
    };
    let k8s = PlanContext { policy: Policy::kubernetes(), ..ctx.clone() };
    let none: BTreeMap<String, String> = BTreeMap::new();
    let no_caps: BTreeMap<String, Vec<String>> = BTreeMap::new();

    println!("{:<11} {:>9} {:>12} {:>10}", "shape", "value KB", "best CPU ms", "ns per KB");
    let shapes: &[(&str, &dyn Fn(u32) -> String)] = &[
        ("uuids", &|i| uuid(i % 8)),
        ("cdi-names", &|i| format!("vendor.example/gpu={i}")),
        ("annotation", &|_| "nvidia.com/gpu=0".to_string()),
        ("refused", &|i| uuid(i % 8)),
    ];
    for (shape, item) in shapes {
        let mut per_kb = Vec::new();
        for &size in SIZES {
            let value = value_of(size, item);
            let kb = value.len() as f64 / 1000.0;
            let env = vec![format!("NVIDIA_VISIBLE_DEVICES={value}")];
            let t = match *shape {
                "uuids" => best(|| {
                    let r = request::collect(&env, &none, &nvidia, &no_caps).expect("valid request");
                    black_box(r.vendors[0].resolve(Some(&inv.vendors[0])).expect("known UUIDs"));
                }),
                "cdi-names" => best(|| {
                    black_box(request::collect(&env, &none, &nvidia, &no_caps).expect("valid request"));
                }),
                "annotation" => {
                    let spec = json!({"process": {"env": []}, "annotations": {"cdi.k8s.io/x": value}});
                    best(|| {
                        black_box(plan(&spec, &ctx).expect("plan"));
                    })
                }
                _ => {
                    let spec = json!({"process": {"env": env, "capabilities": {"bounding": ["CAP_CHOWN"]}}});
                    best(|| {
                        let p = plan(&spec, &k8s).expect("plan");
                        assert!(p.is_empty());
                        black_box(p);
                    })
                }
            };
            let ns_per_kb = t.as_nanos() as f64 / kb;
            per_kb.push(ns_per_kb);
            println!("{shape:<11} {kb:>9.0} {:>12.3} {ns_per_kb:>10.0}", t.as_secs_f64() * 1000.0);
        }
        println!(
            "{shape:<11} cost per KB at 1 MB / at 64 KB: {:.2} (1 = linear, 16 = quadratic)",
            per_kb[per_kb.len() - 1] / per_kb[0]
        );
    }
}
