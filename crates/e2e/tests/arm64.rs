//! An arm64 node (issue 13 item 2): on the Grace Hopper fixture (nvidia-gh200: aarch64 driver
//! libraries and an aarch64 ld.so.cache), `actk cdi generate` describes the aarch64 libraries,
//! and a container started through actk-runtime, or injected by actk-hook, gets GPU 0 and
//! those libraries: the ELF machine the container reads in its libcuda is EM_AARCH64 (0xb7).
//!
//! The container here is an x86 busybox (it cannot run aarch64 code, and does not need to: it
//! only reads the files it was given).

use actk_testsupport::engines::{
    self, ActkConfig, Bundle, actk, actk_runtime, bin, expect_success, runc, text, unique_name,
};
use actk_testsupport::fixture;
use anyhow::Result;
use serde_json::{Value, json};

type OsArg = std::ffi::OsString;

const LIB: &str = "/usr/lib/aarch64-linux-gnu/libcuda.so.1";

/// Prints the container's GPU nodes and the e_machine bytes (offset 18) of its libcuda.so.1.
const SCRIPT: &str =
    "ls /dev; echo ---; dd if=/usr/lib/aarch64-linux-gnu/libcuda.so.1 bs=1 skip=18 count=2 2>/dev/null | od -An -tx1";

fn assert_arm64_gpu(out: &str, how: &str) {
    let (dev, machine) = out.split_once("---").unwrap_or((out, ""));
    assert!(dev.split_whitespace().any(|n| n == "nvidia0"), "{how}: /dev/nvidia0 missing: {out}");
    assert_eq!(machine.split_whitespace().collect::<Vec<_>>(), ["b7", "00"], "{how}: {LIB} is not aarch64: {out}");
}

#[test]
fn item2_cdi_generate_on_the_grace_hopper_node_describes_its_aarch64_libraries() -> Result<()> {
    if !engines::require_root() {
        return Ok(());
    }
    let Some(fx) = fixture::prepare("nvidia-gh200")? else { return Ok(()) };
    let out = expect_success(
        "actk cdi generate (GH200)",
        &actk(
            None,
            &[
                OsArg::from("cdi"),
                "generate".into(),
                "--ldcache-hook".into(),
                "none".into(),
                "--root".into(),
                fx.root.clone().into(),
            ],
        ),
    );
    let spec: Value = serde_json::from_str(&out)?;
    let mounts: Vec<&str> = spec["containerEdits"]["mounts"]
        .as_array()
        .expect("mounts")
        .iter()
        .filter_map(|m| m["containerPath"].as_str())
        .collect();
    for want in [LIB, "/usr/lib/aarch64-linux-gnu/libcuda.so.580.95.05", "/usr/lib/aarch64-linux-gnu/libnvidia-ml.so.1"]
    {
        assert!(mounts.contains(&want), "{want} not in the spec: {mounts:?}");
    }
    assert!(!mounts.iter().any(|m| m.contains("x86_64")), "{mounts:?}");
    Ok(())
}

#[test]
fn item2_container_on_the_grace_hopper_node_gets_gpu_0_and_aarch64_libraries_via_actk_runtime() -> Result<()> {
    if !engines::require_root() {
        return Ok(());
    }
    let Some(fx) = fixture::prepare("nvidia-gh200")? else { return Ok(()) };
    let b = Bundle::busybox(&["sh", "-c", SCRIPT], &["NVIDIA_VISIBLE_DEVICES=0"])?;
    let cfg = ActkConfig::new(&fx.root)?;
    let path = cfg.write()?;
    let id = unique_name("e2e-arm64");
    let o = actk_runtime(&path, &[OsArg::from("run"), "--bundle".into(), b.path().into(), id.as_str().into()]);
    assert_arm64_gpu(&expect_success("actk-runtime run on the GH200 fixture", &o), "actk-runtime");
    Ok(())
}

#[test]
fn item2_container_on_the_grace_hopper_node_gets_gpu_0_and_aarch64_libraries_via_the_hook() -> Result<()> {
    if !engines::require_root() {
        return Ok(());
    }
    let Some(fx) = fixture::prepare("nvidia-gh200")? else { return Ok(()) };
    let cfg = ActkConfig::new(&fx.root)?;
    let path = cfg.write()?;
    let b = Bundle::busybox(&["sh", "-c", SCRIPT], &["NVIDIA_VISIBLE_DEVICES=0"])?;
    let env = format!("ACTK_CONFIG={}", path.display());
    b.edit(|c| {
        c["hooks"] = json!({"prestart": [{"path": bin("actk-hook").to_string_lossy(), "args": ["nvidia-container-runtime-hook", "prestart"], "env": [env]}]});
    })?;
    let o = runc(&[OsArg::from("run"), "--bundle".into(), b.path().into(), unique_name("e2e-arm64-hook").into()]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "runc run with actk-hook: {err}");
    assert_arm64_gpu(&out, "actk-hook");
    Ok(())
}
