//! A driver root apart from the device root (issue 13 item 3), as on a GPU Operator node: the
//! host has the kernel module (/dev, /proc, /sys) but no driver user space; the driver
//! container's file system, bind-propagated to /run/nvidia/driver, has the libraries, tools,
//! firmware and its own ld.so.cache.
//!
//! Built from two copies of the DGX H100 fixture: the device root loses every driver file, the
//! driver root keeps them (and is the only place they are).

use actk_testsupport::engines::{self, ActkConfig, Bundle, actk, actk_runtime, expect_success, text, unique_name};
use actk_testsupport::fixture::{self, Fixture};
use anyhow::Result;
use serde_json::Value;
use std::fs;
use std::path::Path;

type OsArg = std::ffi::OsString;

/// The GPU Operator layout: (device root, driver root).
fn operator_layout() -> Result<Option<(Fixture, Fixture)>> {
    let Some(devices) = fixture::prepare("nvidia-dgx-h100")? else { return Ok(None) };
    let Some(driver) = fixture::prepare("nvidia-dgx-h100")? else { return Ok(None) };
    // The host: kernel module only. No NVIDIA library, tool, firmware or cache entry.
    let lib = devices.root.join("usr/lib/x86_64-linux-gnu");
    for e in fs::read_dir(&lib)? {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        if name.contains("nvidia") || name.starts_with("lib") || name == "vdpau" {
            let p = e.path();
            if p.is_dir() { fs::remove_dir_all(&p)? } else { fs::remove_file(&p)? }
        }
    }
    for t in
        ["nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nvidia-cuda-mps-control", "nvidia-cuda-mps-server"]
    {
        fs::remove_file(devices.root.join("usr/bin").join(t))?;
    }
    fs::remove_dir_all(devices.root.join("usr/lib/firmware/nvidia"))?;
    for d in ["usr/share/vulkan", "usr/share/glvnd", "usr/share/egl"] {
        fs::remove_dir_all(devices.root.join(d))?;
    }
    fs::remove_file(devices.root.join("etc/ld.so.cache"))?;
    Ok(Some((devices, driver)))
}

/// `actk cdi generate --root DEVICES --driver-root DRIVER`: device nodes from the device root,
/// every mount from the driver root; alone, the device root gives GPUs but no libraries.
#[test]
fn item3_cdi_generate_with_a_driver_root_apart_from_the_device_root() -> Result<()> {
    if !engines::require_root() {
        return Ok(());
    }
    let Some((devices, driver)) = operator_layout()? else { return Ok(()) };
    let generate = |extra: &[&Path]| -> Result<Value> {
        let mut args: Vec<OsArg> = vec![
            "cdi".into(),
            "generate".into(),
            "--ldcache-hook".into(),
            "none".into(),
            "--root".into(),
            devices.root.clone().into(),
        ];
        for p in extra {
            args.push("--driver-root".into());
            args.push(p.as_os_str().into());
        }
        Ok(serde_json::from_str(&expect_success("actk cdi generate", &actk(None, &args)))?)
    };
    let spec = generate(&[&driver.root])?;
    let node = &spec["devices"][0]["containerEdits"]["deviceNodes"][0];
    assert_eq!(node["hostPath"], format!("{}/dev/nvidia0", devices.root.display()), "{node}");
    let mounts = spec["containerEdits"]["mounts"].as_array().expect("mounts");
    assert!(
        mounts.iter().any(|m| m["containerPath"] == "/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05"),
        "{mounts:?}"
    );
    for m in mounts {
        assert!(
            m["hostPath"].as_str().unwrap().starts_with(&driver.root.display().to_string()),
            "mount from the driver root: {m}"
        );
    }
    let alone = generate(&[])?;
    let left = &alone["containerEdits"]["mounts"];
    assert!(left.as_array().is_none_or(|m| m.is_empty()), "the host alone has no driver files: {left}");
    Ok(())
}

/// actk-runtime with `root` (devices) and `driver_root` (driver files) in its config: the
/// container sees GPU 0 and the driver root's libcuda, byte for byte.
#[test]
fn item3_container_gets_devices_from_the_host_and_libraries_from_the_driver_root() -> Result<()> {
    if !engines::require_root() {
        return Ok(());
    }
    let Some((devices, driver)) = operator_layout()? else { return Ok(()) };
    let lib = "/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05";
    let b = Bundle::busybox(&["sh", "-c", &format!("ls /dev; md5sum {lib}")], &["NVIDIA_VISIBLE_DEVICES=0"])?;
    let mut cfg = ActkConfig::new(&devices.root)?;
    cfg.extra = format!("driver_root = {:?}\n", driver.root.display().to_string());
    let path = cfg.write()?;
    let id = unique_name("e2e-driver-root");
    let o = actk_runtime(&path, &[OsArg::from("run"), "--bundle".into(), b.path().into(), id.as_str().into()]);
    let out = expect_success("actk-runtime run with driver_root", &o);
    assert!(out.split_whitespace().any(|n| n == "nvidia0"), "{out}");
    let want = std::process::Command::new("md5sum").arg(driver.root.join(&lib[1..])).output()?;
    let want = text(&want).0.split_whitespace().next().unwrap_or_default().to_string();
    assert!(out.contains(&format!("{want}  {lib}")), "libcuda from the driver root (md5 {want}): {out}");
    Ok(())
}
