//! Benchmark of the running plugin (issue 5 item 9), printed as plain figures:
//! - resident memory (VmRSS, and its peak VmHWM) of the actk-device-plugin process serving a
//!   64-device node, idle and after the Allocate run (target: under 10 MiB);
//! - Allocate latency over 10,000 calls as the kubelet makes them (one gRPC call over the unix
//!   socket per container, every strategy on, 1 and 8 devices per call): p50, p99, max
//!   (target: p99 under 1 ms).
//!
//! The 64-device node is built here in a temporary directory: a generic vendor profile
//! (`example.com/npu`, `/dev/npu{index}`) and 64 character nodes made with mknod (root needed;
//! otherwise the bench says it is skipping). The plugin is the binary cargo built for this
//! profile (`cargo bench -p actk-device-plugin` uses the release build). No kubelet is needed:
//! the plugin serves its socket before it registers, so the bench dials it directly.
//!
//! The same Allocate answers are also timed in-process (the pure `allocate::container_response`,
//! no gRPC, no scheduler between two processes), to separate the plugin's own work from the
//! transport and from the machine's load.
//!
//! Run: `cargo bench -p actk-device-plugin --bench plugin` (on a busy machine, under
//! `nice -n -20` to keep other jobs' scheduling out of the tail).

use actk_device_plugin::api::device_plugin_client::DevicePluginClient;
use actk_device_plugin::api::{AllocateRequest, ContainerAllocateRequest, Empty};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const DEVICES: u32 = 64;
const CALLS: usize = 10_000;
const RSS_TARGET_KIB: u64 = 10 * 1024;
const P99_TARGET: Duration = Duration::from_millis(1);

/// `VmRSS` and `VmHWM` of `pid` in KiB, from /proc/PID/status.
fn rss_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

fn build_node(root: &Path, profiles: &Path) -> bool {
    std::fs::create_dir_all(root.join("dev")).unwrap();
    std::fs::create_dir_all(root.join("proc")).unwrap();
    std::fs::write(root.join("proc/devices"), "Character devices:\n  1 mem\n240 npu\n\nBlock devices:\n").unwrap();
    for i in 0..DEVICES {
        let p = root.join(format!("dev/npu{i}"));
        let ok = Command::new("mknod")
            .arg(&p)
            .args(["c", "240", &i.to_string()])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            return false;
        }
    }
    std::fs::create_dir_all(profiles).unwrap();
    std::fs::write(
        profiles.join("npu.toml"),
        "name = \"npu\"\nkind = \"example.com/npu\"\ndescription = \"64-device bench node\"\n\n[selection]\nenv = [\"NPU_VISIBLE_DEVICES\"]\n\n[devices]\nnode = \"/dev/npu{index}\"\nproc_devices_name = \"npu\"\n\n[kubernetes]\nresources = [\"example.com/npu\"]\n",
    )
    .unwrap();
    true
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn fmt(d: Duration) -> String {
    format!("{:.1} us", d.as_secs_f64() * 1e6)
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` passes nothing: both just run.
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let profiles = tmp.path().join("profiles.d");
    let sockets = tmp.path().join("device-plugins");
    if !build_node(&root, &profiles) {
        eprintln!("skipping: mknod failed; the bench needs root to build its 64-device node");
        return;
    }
    let config = tmp.path().join("dp.toml");
    std::fs::write(&config, "").unwrap();
    // The node's CDI spec, as `actk cdi generate` writes it: the CDI strategies name only
    // devices a spec defines.
    let spec_dir = tmp.path().join("cdi");
    let bench_profiles = actk_core::profile::load(Some(&profiles)).expect("bench profile loads");
    let inventory = actk_core::discover::discover(&root, &bench_profiles);
    for spec in actk_core::cdi::generate::generate_all(
        &bench_profiles,
        &inventory,
        Some("example.com/npu"),
        &Default::default(),
    )
    .expect("CDI spec of the bench node")
    {
        actk_core::cdi::write::write_spec_in_dir(&spec, &spec_dir, actk_core::cdi::validate::Format::Json)
            .expect("write the bench node's CDI spec");
    }
    let mut child = Command::new(env!("CARGO_BIN_EXE_actk-device-plugin"))
        .arg("--config")
        .arg(&config)
        .arg("--root")
        .arg(&root)
        .arg("--profiles-dir")
        .arg(&profiles)
        .arg("--socket-dir")
        .arg(&sockets)
        .arg("--spec-dirs")
        .arg(&spec_dir)
        .args(["--device-ids", "index", "--strategies", "cdi-cri,cdi-annotations,envvar,device-specs"])
        .env("ACTK_LOG", "warn")
        .stdin(Stdio::null())
        .spawn()
        .expect("start actk-device-plugin");
    let pid = child.id();
    let sock = sockets.join("actk-example_com_npu.sock");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let result = rt.block_on(async {
        let t = Instant::now();
        while !sock.exists() {
            if t.elapsed() > Duration::from_secs(20) {
                return Err(format!("the plugin did not create {} within 20 s", sock.display()));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let ch = actk_device_plugin::uds::connect(&sock).await.map_err(|e| e.to_string())?;
        let mut client = DevicePluginClient::new(ch);
        let mut stream = client.list_and_watch(Empty {}).await.map_err(|e| e.to_string())?.into_inner();
        let list = stream.message().await.map_err(|e| e.to_string())?.ok_or("empty stream")?;
        if list.devices.len() != DEVICES as usize {
            return Err(format!("the plugin lists {} devices, expected {DEVICES}", list.devices.len()));
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let idle = rss_kib(pid);
        let mut out = Vec::new();
        for per_call in [1usize, 8] {
            let mut lat = Vec::with_capacity(CALLS);
            for i in 0..CALLS {
                let ids = (0..per_call).map(|k| ((i * per_call + k) % DEVICES as usize).to_string()).collect();
                let req = AllocateRequest { container_requests: vec![ContainerAllocateRequest { devices_ids: ids }] };
                let t = Instant::now();
                let resp = client.allocate(req).await.map_err(|e| e.to_string())?.into_inner();
                lat.push(t.elapsed());
                if resp.container_responses[0].cdi_devices.len() != per_call {
                    return Err("an Allocate answer lacks devices".into());
                }
            }
            lat.sort_unstable();
            out.push((per_call, percentile(&lat, 0.5), percentile(&lat, 0.99), lat[lat.len() - 1]));
        }
        Ok((idle, rss_kib(pid), out))
    });
    let _ = child.kill();
    let _ = child.wait();
    let (idle, after, lat) = match result {
        Ok(r) => r,
        Err(e) => panic!("bench failed: {e}"),
    };
    // In-process: the answer itself, on the same node, with the same strategies.
    let profiles_all = actk_core::profile::load(Some(&profiles)).expect("bench profile loads");
    let inv = actk_core::discover::discover(&root, &profiles_all);
    let res = actk_device_plugin::resources::build(
        &inv,
        &profiles_all,
        &actk_device_plugin::resources::BuildOptions {
            ids: actk_device_plugin::resources::DeviceIds::Index,
            ..Default::default()
        },
    );
    let res = res.into_iter().find(|r| r.name == "example.com/npu").expect("the npu resource");
    let opts = actk_device_plugin::allocate::AllocateOptions {
        strategies: "cdi-cri,cdi-annotations,envvar,device-specs".split(',').map(|s| s.parse().unwrap()).collect(),
        host_mount: "/".into(),
        capabilities: None,
        spec_dirs: vec![spec_dir.clone()],
        logical_core_size: 1,
        nri_gate: false,
    };
    let names = actk_device_plugin::allocate::CdiNames::load(&res, &opts.spec_dirs);
    let mut pure = Vec::new();
    for per_call in [1usize, 8] {
        let mut lat = Vec::with_capacity(CALLS);
        for i in 0..CALLS {
            let ids: Vec<String> = (0..per_call).map(|k| ((i * per_call + k) % DEVICES as usize).to_string()).collect();
            let t = Instant::now();
            let r = actk_device_plugin::allocate::container_response(&res, &ids, &opts, &names).expect("allocate");
            lat.push(t.elapsed());
            assert_eq!(r.devices.len(), per_call);
        }
        lat.sort_unstable();
        pure.push((per_call, percentile(&lat, 0.5), percentile(&lat, 0.99)));
    }
    let verdict = |ok: bool| if ok { "ok" } else { "OVER TARGET" };
    println!("actk-device-plugin bench: {DEVICES}-device node, all four strategies");
    println!(
        "  RSS idle:            {} KiB ({:.2} MiB)  [{}]",
        idle.0,
        idle.0 as f64 / 1024.0,
        verdict(idle.0 < RSS_TARGET_KIB)
    );
    println!(
        "  RSS after Allocates: {} KiB ({:.2} MiB), peak {} KiB  [{}]",
        after.0,
        after.0 as f64 / 1024.0,
        after.1,
        verdict(after.1 < RSS_TARGET_KIB)
    );
    for (n, p50, p99, max) in lat {
        println!(
            "  Allocate x{CALLS}, {n} device(s)/call: p50 {}  p99 {}  max {}  [{}]",
            fmt(p50),
            fmt(p99),
            fmt(max),
            verdict(p99 < P99_TARGET)
        );
    }
    for (n, p50, p99) in pure {
        println!("  in-process answer x{CALLS}, {n} device(s): p50 {}  p99 {}", fmt(p50), fmt(p99));
    }
    if let Ok(load) = std::fs::read_to_string("/proc/loadavg") {
        println!("  machine load average: {}", load.split_whitespace().take(3).collect::<Vec<_>>().join(" "));
    }
}
