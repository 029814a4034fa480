//! The shim-less paths through the CRI of a real containerd 2.1 (issue 14), driven with crictl:
//! - the actk NRI plugin (actk-nri) answers containerd's CreateContainer: a CRI container that
//!   asks for GPUs 1 and 3 sees exactly those, the control nodes and the driver libraries; under
//!   a multi-tenant node's trust policy only the kubelet's device list counts;
//! - containerd's own CDI (CDI-by-CRI) with the specs `actk cdi generate` wrote;
//! - RuntimeClass actk (actk-runtime as the runc shim's BinaryName), for comparison.
//!
//! containerd runs on its own sockets and state (actk_testsupport::engines::Containerd2) on the
//! DGX H100 fixture; pods use the host network (loopback-only CNI).

use actk_testsupport::engines::{self, ActkConfig, Containerd2, Containerd2Options, bin, expect_success, unique_name};
use actk_testsupport::fixture;
use anyhow::{Context, Result, bail};
use serde_json::json;
use std::fs;
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// actk-nri attached to a containerd's NRI socket; stopped on drop.
struct NriPlugin {
    child: Child,
    log: std::path::PathBuf,
}

impl NriPlugin {
    fn start(c: &Containerd2, config: &Path) -> Result<NriPlugin> {
        NriPlugin::start_with(c, config, &[])
    }

    fn start_with(c: &Containerd2, config: &Path, args: &[&str]) -> Result<NriPlugin> {
        let log = c.dir().join("actk-nri.log");
        let f = fs::File::create(&log)?;
        let child = Command::new(bin("actk-nri"))
            .args(["--socket", c.nri_socket.to_str().unwrap_or_default(), "--idx", "10"])
            .args(args)
            .env("ACTK_CONFIG", config)
            .stdout(f.try_clone()?)
            .stderr(f)
            .spawn()
            .context("starting actk-nri")?;
        let p = NriPlugin { child, log };
        let start = Instant::now();
        while !p.log().contains("registered with NRI") {
            if start.elapsed() > Duration::from_secs(30) {
                bail!("actk-nri did not register within 30 s; its log:\n{}\ncontainerd:\n{}", p.log(), c.log());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(p)
    }

    fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for NriPlugin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A container that prints what it sees: its device nodes, the driver libraries mounted, and
/// its NVIDIA environment.
fn probe(env: &[(&str, &str)]) -> serde_json::Value {
    let envs: Vec<serde_json::Value> = env.iter().map(|(k, v)| json!({"key": k, "value": v})).collect();
    json!({
        "command": ["sh", "-c", "ls /dev; echo ---; grep -o '[^ ]*libcuda[^ ]*' /proc/self/mountinfo | sort -u; echo ---; env | grep ^NVIDIA_ | sort"],
        "envs": envs,
        "linux": {}
    })
}

/// (device nodes under /dev, libcuda mount points, NVIDIA_* env) from a probe's output.
fn seen(out: &str) -> (Vec<String>, Vec<String>, Vec<String>) {
    let mut parts = out.split("---\n");
    let mut next = || parts.next().unwrap_or_default().lines().map(str::to_string).collect::<Vec<_>>();
    (next(), next(), next())
}

fn nvidia_nodes(devs: &[String]) -> Vec<&str> {
    devs.iter().map(String::as_str).filter(|d| d.starts_with("nvidia") && !d.starts_with("nvidia-")).collect()
}

#[test]
fn nri_plugin_gives_a_cri_container_exactly_the_gpus_it_asks_for() -> Result<()> {
    let Some(fx) = fixture::prepare("nvidia-dgx-h100")? else { return Ok(()) };
    let Some(c) = Containerd2::start(&Containerd2Options::default())? else { return Ok(()) };
    let mut cfg = ActkConfig::new(&fx.root)?;
    cfg.extra = format!("hook_path = {:?}\n", bin("actk-hook").display().to_string());
    let config = cfg.write()?;
    let plugin = NriPlugin::start(&c, &config)?;

    let (code, out) = c.run_pod("gpus13", probe(&[("NVIDIA_VISIBLE_DEVICES", "1,3")]), None)?;
    assert_eq!(code, 0, "{out}\nplugin:\n{}", plugin.log());
    let (devs, libs, env) = seen(&out);
    assert_eq!(
        nvidia_nodes(&devs),
        ["nvidia1", "nvidia3", "nvidiactl"],
        "{out}\nplugin:\n{}\ncontainerd:\n{}",
        plugin.log(),
        c.log()
    );
    assert!(!libs.is_empty(), "libcuda is mounted: {out}");
    assert!(env.iter().any(|e| e == "NVIDIA_VISIBLE_DEVICES=1,3"), "{out}");

    // Nothing asked: nothing given. A request the node cannot serve fails the create with
    // actk's message, as through actk-runtime.
    let (code, out) = c.run_pod("nogpu", probe(&[]), None)?;
    assert_eq!(code, 0, "{out}");
    assert!(nvidia_nodes(&seen(&out).0).is_empty(), "{out}");
    let err = c.run_pod("gpu9", probe(&[("NVIDIA_VISIBLE_DEVICES", "9")]), None).unwrap_err().to_string();
    assert!(err.contains("NVIDIA_VISIBLE_DEVICES=9") && err.contains("no such device 9"), "{err}");
    drop(plugin);
    Ok(())
}

/// The kubelet's device list (the volume-mounts strategy) for a CRI container: `/dev/null`
/// mounted at /var/run/actk/devices/nvidia.com/gpu/NAME for each allocated GPU.
fn allocated(mut ctr: serde_json::Value, gpus: &[&str]) -> serde_json::Value {
    let mounts: Vec<serde_json::Value> = gpus
        .iter()
        .map(|g| {
            json!({"container_path": format!("/var/run/actk/devices/nvidia.com/gpu/{g}"), "host_path": "/dev/null", "readonly": true})
        })
        .collect();
    ctr["mounts"] = json!(mounts);
    ctr
}

/// The trust policy of a multi-tenant node (SECURITY.md) under the NRI plugin: the device list
/// the kubelet mounted is the only authority. A container allocated GPU 2 whose image says
/// NVIDIA_VISIBLE_DEVICES=all sees GPU 2 and no other; one that asks by env alone gets nothing
/// (NRI tells a plugin nothing of capabilities, so no container counts as privileged), and the
/// plugin's log names the policy key; with `on_refused = "fail"` that create fails, naming it.
#[test]
fn nri_plugin_under_the_multi_tenant_policy_gives_only_the_allocated_gpus() -> Result<()> {
    let Some(fx) = fixture::prepare("nvidia-dgx-h100")? else { return Ok(()) };
    let Some(c) = Containerd2::start(&Containerd2Options::default())? else { return Ok(()) };
    let policy = |on_refused: &str| -> Result<ActkConfig> {
        let mut cfg = ActkConfig::new(&fx.root)?;
        cfg.extra = format!(
            "hook_path = {:?}\n[policy]\nenv_requests = \"privileged\"\nannotation_requests = \"privileged\"\nmount_requests = \"always\"\non_refused = {on_refused:?}\n",
            bin("actk-hook").display().to_string()
        );
        Ok(cfg)
    };
    let warn = policy("warn")?;
    let plugin = NriPlugin::start(&c, &warn.write()?)?;

    let ctr = allocated(probe(&[("NVIDIA_VISIBLE_DEVICES", "all")]), &["2"]);
    let (code, out) = c.run_pod("listed2", ctr, None)?;
    assert_eq!(code, 0, "{out}\nplugin:\n{}", plugin.log());
    let (devs, libs, _) = seen(&out);
    assert_eq!(
        nvidia_nodes(&devs),
        ["nvidia2", "nvidiactl"],
        "only the allocated GPU: {out}\nplugin:\n{}",
        plugin.log()
    );
    assert!(!libs.is_empty(), "the driver libraries come with it: {out}");

    let (code, out) = c.run_pod("envonly", probe(&[("NVIDIA_VISIBLE_DEVICES", "0,1")]), None)?;
    assert_eq!(code, 0, "on_refused = warn starts the container: {out}");
    assert!(nvidia_nodes(&seen(&out).0).is_empty(), "env alone widens nothing: {out}");
    assert!(plugin.log().contains("env_requests"), "the refusal names the policy key: {}", plugin.log());
    drop(plugin);

    let fail = policy("fail")?;
    let plugin = NriPlugin::start(&c, &fail.write()?)?;
    let err = c.run_pod("envfail", probe(&[("NVIDIA_VISIBLE_DEVICES", "0,1")]), None).unwrap_err().to_string();
    assert!(err.contains("env_requests"), "{err}\nplugin:\n{}", plugin.log());
    let (code, out) = c.run_pod("listed0", allocated(probe(&[]), &["0"]), None)?;
    assert_eq!((code, nvidia_nodes(&seen(&out).0)), (0, vec!["nvidia0", "nvidiactl"]), "{out}");
    drop(plugin);
    Ok(())
}

#[test]
fn containerd_applies_actk_cdi_specs_itself_and_runs_actk_runtime_as_a_runtime_class() -> Result<()> {
    let Some(fx) = fixture::prepare("nvidia-dgx-h100")? else { return Ok(()) };
    let cfg = ActkConfig::new(&fx.root)?;
    let config = cfg.write()?;
    let o = engines::actk(
        Some(&config),
        &[
            "cdi",
            "generate",
            "--root",
            fx.root.to_str().unwrap_or_default(),
            "--vendor",
            "nvidia",
            "--ldcache-hook",
            "none",
        ],
    );
    let spec = expect_success("actk cdi generate", &o);
    fs::write(cfg.spec_dir().join("nvidia.com-gpu.json"), spec)?;
    // The runc shim starts its runtime with its own environment: a wrapper carries ACTK_CONFIG.
    let wrapper = cfg.write_wrapper()?;
    let opts = Containerd2Options { cdi_spec_dirs: vec![cfg.spec_dir().to_path_buf()], actk_runtime: Some(wrapper) };
    let Some(c) = Containerd2::start(&opts)? else { return Ok(()) };

    // CDI-by-CRI: the kubelet's cdi-cri strategy puts names in the CRI CDIDevices field.
    let mut ctr = probe(&[]);
    ctr["CDI_devices"] = json!([{"name": "nvidia.com/gpu=2"}]);
    let (code, out) = c.run_pod("cdi2", ctr, None)?;
    assert_eq!(code, 0, "{out}");
    let (devs, libs, _) = seen(&out);
    assert_eq!(nvidia_nodes(&devs), ["nvidia2", "nvidiactl"], "containerd applied the spec: {out}");
    assert!(!libs.is_empty(), "{out}");

    // RuntimeClass actk: actk-runtime edits the bundle containerd wrote, then runc runs it.
    let (code, out) = c.run_pod("rt0", probe(&[("NVIDIA_VISIBLE_DEVICES", "0")]), Some("actk"))?;
    assert_eq!(code, 0, "{out}\n{}", c.log());
    assert_eq!(nvidia_nodes(&seen(&out).0), ["nvidia0", "nvidiactl"], "{out}");
    Ok(())
}

/// Issue 29 finding 1 under the NRI plugin, on the DGX H100 fixture (4 NVSwitch nodes and
/// nvidia-nvswitchctl, MIG management nodes): a CRI container allocated GPU 2 (the device list)
/// whose env asks for the `fabric` capability, `all` capabilities, MIG management and IMEX
/// channels sees GPU 2 and its control nodes, never an NVSwitch or MIG management node, with
/// the driver files of its other capabilities; the plugin logs the refusal with the policy key.
/// With `on_refused = "fail"` the explicit `fabric` fails the create, naming the key.
#[test]
fn nri_plugin_never_widens_an_allocation_for_a_capability_that_adds_nodes() -> Result<()> {
    let Some(fx) = fixture::prepare("nvidia-dgx-h100")? else { return Ok(()) };
    let Some(c) = Containerd2::start(&Containerd2Options::default())? else { return Ok(()) };
    let policy = |on_refused: &str| -> Result<ActkConfig> {
        let mut cfg = ActkConfig::new(&fx.root)?;
        cfg.extra = format!(
            "hook_path = {:?}\n[policy]\nenv_requests = \"privileged\"\nannotation_requests = \"privileged\"\nmount_requests = \"always\"\non_refused = {on_refused:?}\nprivileged_means = \"privileged-flag\"\n",
            bin("actk-hook").display().to_string()
        );
        Ok(cfg)
    };
    let warn = policy("warn")?;
    let plugin = NriPlugin::start(&c, &warn.write()?)?;
    for (name, env) in [
        ("fabric", vec![("NVIDIA_DRIVER_CAPABILITIES", "compute,utility,fabric")]),
        ("allcaps", vec![("NVIDIA_DRIVER_CAPABILITIES", "all")]),
        (
            "everything",
            vec![
                ("NVIDIA_DRIVER_CAPABILITIES", "all"),
                ("NVIDIA_VISIBLE_DEVICES", "all"),
                ("NVIDIA_MIG_CONFIG_DEVICES", "all"),
                ("NVIDIA_MIG_MONITOR_DEVICES", "all"),
                ("NVIDIA_IMEX_CHANNELS", "all"),
            ],
        ),
    ] {
        let (code, out) = c.run_pod(name, allocated(probe(&env), &["2"]), None)?;
        assert_eq!(code, 0, "{name}: {out}\nplugin:\n{}", plugin.log());
        let (devs, libs, _) = seen(&out);
        assert_eq!(nvidia_nodes(&devs), ["nvidia2", "nvidiactl"], "{name}: {out}\nplugin:\n{}", plugin.log());
        assert!(
            !devs.iter().any(|d| d.starts_with("nvidia-nvswitch") || d == "nvidia-caps"),
            "{name}: a node the allocation does not need: {devs:?}\nplugin:\n{}",
            plugin.log()
        );
        assert!(!libs.is_empty(), "{name}: the files of the other capabilities stay: {out}");
    }
    let log = plugin.log();
    assert!(
        log.contains("NVIDIA_DRIVER_CAPABILITIES=fabric: refused by the node's trust policy")
            && log.contains("env_requests"),
        "the refusal names the variable and the policy key:\n{log}"
    );
    drop(plugin);

    let fail = policy("fail")?;
    let plugin = NriPlugin::start(&c, &fail.write()?)?;
    let ctr = allocated(probe(&[("NVIDIA_DRIVER_CAPABILITIES", "utility,fabric")]), &["2"]);
    let err = c.run_pod("fabricfail", ctr, None).unwrap_err().to_string();
    assert!(
        err.contains("NVIDIA_DRIVER_CAPABILITIES=fabric") && err.contains("env_requests"),
        "{err}\nplugin:\n{}",
        plugin.log()
    );
    drop(plugin);
    Ok(())
}
/// A pod sandbox of `c` whose annotations carry `kib` KiB (a Kubernetes pod may carry up to
/// 256 KiB), with one container running `sleep` that asks for `env`; returns the pod's id.
fn sleeping_pod(c: &Containerd2, name: &str, kib: usize, env: &[(&str, &str)]) -> Result<String> {
    let mut pod = c.pod_config(name);
    pod["annotations"] = json!({"example.com/blob": "x".repeat(kib << 10)});
    let pod_file = c.write_json(&format!("{name}-pod.json"), &pod)?;
    let out = c.crictl(&["runp", pod_file.to_str().unwrap_or_default()]);
    if !out.status.success() {
        bail!("crictl runp {name}: {}", String::from_utf8_lossy(&out.stderr));
    }
    let pod_id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let envs: Vec<serde_json::Value> = env.iter().map(|(k, v)| json!({"key": k, "value": v})).collect();
    let ctr = json!({
        "metadata": {"name": name},
        "image": {"image": c.busybox_image},
        "command": ["sleep", "600"],
        "envs": envs,
        "log_path": format!("{name}.log"),
        "linux": {}
    });
    let ctr_file = c.write_json(&format!("{name}-ctr.json"), &ctr)?;
    let out =
        c.crictl(&["create", &pod_id, ctr_file.to_str().unwrap_or_default(), pod_file.to_str().unwrap_or_default()]);
    if !out.status.success() {
        bail!("crictl create {name}: {}", String::from_utf8_lossy(&out.stderr));
    }
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let out = c.crictl(&["start", &id]);
    if !out.status.success() {
        bail!("crictl start {name}: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(pod_id)
}

/// A busy node (issue 28, item 8; containerd/nri#102, fixed by nri#111): 24 pods with 240 KiB
/// of annotations each, a container in each as on a Kubernetes node, make containerd 2.1's
/// initial Synchronize over ttrpc's 4 MiB, so it sends it in parts. (Pods without containers
/// would not do: NRI 0.8's split scales the container count per message down to 0 when there
/// are few, then sends empty parts with `more` set until the request times out.) The plugin answers every part and stays registered, so the next
/// container gets its GPUs; a container created while the plugin was away is named in its log
/// at warn level.
///
/// The gate: a container with the CDI device actk.dev/nri-plugin=required (the device plugin
/// adds it under the chart's NRI plugin) starts with its GPUs and without the gate's mount
/// while the plugin serves, and fails naming the plugin once the plugin is gone, instead of
/// starting without its GPUs.
#[test]
fn nri_plugin_survives_a_split_synchronize_and_its_gate_fails_unserved_containers() -> Result<()> {
    let Some(fx) = fixture::prepare("nvidia-dgx-h100")? else { return Ok(()) };
    let Some(c) = Containerd2::start(&Containerd2Options::default())? else { return Ok(()) };
    let mut cfg = ActkConfig::new(&fx.root)?;
    cfg.extra = format!("hook_path = {:?}\n", bin("actk-hook").display().to_string());
    let config = cfg.write()?;
    // Created before the plugin runs: started without its GPU, and no gate to stop it.
    sleeping_pod(&c, &unique_name("missed"), 1, &[("NVIDIA_VISIBLE_DEVICES", "2")])?;
    for i in 0..24 {
        sleeping_pod(&c, &format!("busy{i}"), 240, &[])?;
    }
    let gate_dir = c.dir().join("cdi");
    let plugin = NriPlugin::start_with(&c, &config, &["--gate-spec-dir", gate_dir.to_str().unwrap_or_default()])?;
    let start = Instant::now();
    while !plugin.log().contains("synchronized with the runtime") {
        if start.elapsed() > Duration::from_secs(30) {
            bail!("no synchronization within 30 s; plugin:\n{}\ncontainerd:\n{}", plugin.log(), c.log());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_secs(1));
    let log = plugin.log();
    let line = log.lines().find(|l| l.contains("synchronized with the runtime")).unwrap_or_default().to_string();
    let parts: usize =
        line.rsplit(" in ").next().and_then(|t| t.split_whitespace().next()).and_then(|n| n.parse().ok()).unwrap_or(0);
    assert!(line.contains("25 pod(s)") && parts >= 2, "a split Synchronize of every pod: {line}\n{log}");
    assert!(!c.log().contains("does not handle split sync"), "containerd kept the plugin:\n{}", c.log());
    assert!(
        log.lines().any(|l| l.contains("WARN") && l.contains("was created while this NRI plugin was not serving")),
        "the container created before it is named at warn level:\n{log}"
    );

    let (code, out) = c.run_pod("afterbusy", probe(&[("NVIDIA_VISIBLE_DEVICES", "1")]), None)?;
    assert_eq!(code, 0, "{out}");
    assert_eq!(nvidia_nodes(&seen(&out).0), ["nvidia1", "nvidiactl"], "{out}\nplugin:\n{}", plugin.log());

    // The gate, served: the GPU and no gate mount.
    let gated = |env: &[(&str, &str)]| {
        let mut ctr = probe(env);
        ctr["command"] = json!(["sh", "-c", "ls /dev; echo ---; grep -c actk-nri-gate /proc/self/mountinfo; echo ---"]);
        ctr["CDI_devices"] = json!([{"name": actk_nri_gate_name()}]);
        ctr
    };
    let (code, out) = c.run_pod("gated", gated(&[("NVIDIA_VISIBLE_DEVICES", "3")]), None)?;
    assert_eq!(code, 0, "{out}\nplugin:\n{}\ncontainerd:\n{}", plugin.log(), c.log());
    let (devs, mounts, _) = seen(&out);
    assert_eq!((nvidia_nodes(&devs), mounts), (vec!["nvidia3", "nvidiactl"], vec!["0".to_string()]), "{out}");
    drop(plugin);

    // Unserved: the create fails and names the plugin.
    let err = c.run_pod("gatedaway", gated(&[("NVIDIA_VISIBLE_DEVICES", "3")]), None).unwrap_err().to_string();
    assert!(err.contains("actk-nri-plugin-10-actk-did-not-serve-this-container"), "{err}");
    Ok(())
}

/// The gate's CDI name as the device plugin names it.
fn actk_nri_gate_name() -> &'static str {
    "actk.dev/nri-plugin=required"
}
