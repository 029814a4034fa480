//! NVIDIA injection gaps of real nodes (issue 13 item 7), on the DGX H100 fixture through
//! actk-runtime in runc's place: daemon sockets, NVSwitch and IMEX nodes, graphics manifests.

use actk_testsupport::engines::{self, ActkConfig, Bundle, actk_runtime, expect_success, unique_name};
use actk_testsupport::fixture;
use anyhow::Result;
use std::fs;
use std::path::Path;
use std::process::Command;

type OsArg = std::ffi::OsString;

/// The container's output of `script` with `env`, on host root `root`.
fn run(root: &Path, script: &str, env: &[&str]) -> Result<String> {
    let b = Bundle::busybox(&["sh", "-c", script], env)?;
    let cfg = ActkConfig::new(root)?;
    let path = cfg.write()?;
    let id = unique_name("e2e-nvidia-extras");
    let o = actk_runtime(&path, &[OsArg::from("run"), "--bundle".into(), b.path().into(), id.as_str().into()]);
    Ok(expect_success(&format!("actk-runtime run ({env:?})"), &o))
}

/// nvidia-persistenced's socket and the MPS pipe directory are mounted when the daemons run on
/// the host (utility and compute, as libnvidia-container does); without them nothing is.
#[test]
fn item7_persistenced_socket_and_mps_pipe_directory_reach_the_container() -> Result<()> {
    if !engines::require_root() {
        return Ok(());
    }
    let Some(fx) = fixture::prepare("nvidia-dgx-h100")? else { return Ok(()) };
    let script = "stat -c '%F' /run/nvidia-persistenced/socket 2>/dev/null || echo no-socket; \
                  ls /tmp/nvidia-mps 2>/dev/null || echo no-mps";
    let out = run(&fx.root, script, &["NVIDIA_VISIBLE_DEVICES=0"])?;
    assert!(out.contains("no-socket") && out.contains("no-mps"), "no daemon, nothing mounted: {out}");

    // The daemons start: persistenced listens on its socket, the MPS control daemon makes its pipes.
    fs::create_dir_all(fx.root.join("run/nvidia-persistenced"))?;
    let _listener = std::os::unix::net::UnixListener::bind(fx.root.join("run/nvidia-persistenced/socket"))?;
    fs::create_dir_all(fx.root.join("tmp/nvidia-mps"))?;
    let o = Command::new("mkfifo").arg(fx.root.join("tmp/nvidia-mps/control")).output()?;
    expect_success("mkfifo", &o);
    let out = run(&fx.root, script, &["NVIDIA_VISIBLE_DEVICES=0"])?;
    assert!(out.lines().any(|l| l == "socket"), "persistenced socket in the container: {out}");
    assert!(out.lines().any(|l| l == "control"), "MPS pipe directory in the container: {out}");
    let out = run(&fx.root, script, &["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=video"])?;
    assert!(out.contains("no-socket") && out.contains("no-mps"), "neither utility nor compute: {out}");
    Ok(())
}

/// The DGX's NVSwitch nodes are injected for a fabric-manager workload (capability `fabric`) and
/// for nobody else.
#[test]
fn item7_nvswitch_nodes_for_the_fabric_capability_only() -> Result<()> {
    if !engines::require_root() {
        return Ok(());
    }
    let Some(fx) = fixture::prepare("nvidia-dgx-h100")? else { return Ok(()) };
    let nodes = |out: &str| -> Vec<String> {
        out.split_whitespace().filter(|n| n.starts_with("nvidia-nvswitch")).map(String::from).collect()
    };
    let out = run(&fx.root, "ls /dev", &["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=utility,fabric"])?;
    assert_eq!(
        nodes(&out),
        ["nvidia-nvswitch0", "nvidia-nvswitch1", "nvidia-nvswitch2", "nvidia-nvswitch3", "nvidia-nvswitchctl"],
        "{out}"
    );
    let out = run(&fx.root, "ls /dev", &["NVIDIA_VISIBLE_DEVICES=all"])?;
    assert!(nodes(&out).is_empty(), "default capabilities get no NVSwitch node: {out}");
    Ok(())
}

/// IMEX channels, where the node has them (`nvidia-modprobe -i 0` made channel 0; the DGX's
/// /proc/devices has the nvidia-caps-imex-channels major), are selected by NVIDIA_IMEX_CHANNELS.
#[test]
fn item7_imex_channels_where_the_node_has_them() -> Result<()> {
    if !engines::require_root() {
        return Ok(());
    }
    let Some(fx) = fixture::prepare("nvidia-dgx-h100")? else { return Ok(()) };
    let dir = fx.root.join("dev/nvidia-caps-imex-channels");
    fs::create_dir_all(&dir)?;
    let o = Command::new("mknod").args(["-m", "0666"]).arg(dir.join("channel0")).args(["c", "237", "0"]).output()?;
    expect_success("mknod channel0", &o);
    let out = run(&fx.root, "ls /dev/nvidia-caps-imex-channels", &["NVIDIA_IMEX_CHANNELS=0"])?;
    assert_eq!(out.split_whitespace().collect::<Vec<_>>(), ["channel0"], "{out}");
    let out =
        run(&fx.root, "ls /dev/nvidia-caps-imex-channels 2>/dev/null || echo none", &["NVIDIA_VISIBLE_DEVICES=0"])?;
    assert!(out.contains("none"), "GPUs alone get no IMEX channel: {out}");
    Ok(())
}

/// `graphics` gets the Vulkan ICD, its implicit layer and the EGL vendor and platform files, the
/// host's files as they are.
#[test]
fn item7_graphics_gets_the_vulkan_icd_and_egl_vendor_files() -> Result<()> {
    if !engines::require_root() {
        return Ok(());
    }
    let Some(fx) = fixture::prepare("nvidia-dgx-h100")? else { return Ok(()) };
    let files = [
        "/usr/share/vulkan/icd.d/nvidia_icd.json",
        "/usr/share/vulkan/implicit_layer.d/nvidia_layers.json",
        "/usr/share/glvnd/egl_vendor.d/10_nvidia.json",
        "/usr/share/egl/egl_external_platform.d/15_nvidia_gbm.json",
    ];
    let out = run(
        &fx.root,
        &format!("cat {}", files.join(" ")),
        &["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=graphics"],
    )?;
    let want: String = files.iter().map(|f| fs::read_to_string(fx.root.join(&f[1..]))).collect::<Result<_, _>>()?;
    assert_eq!(out, want, "the container's manifests are the host's");
    assert!(out.contains("\"library_path\": \"libGLX_nvidia.so.0\""), "{out}");
    Ok(())
}
