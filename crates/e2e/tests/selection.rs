//! Selection variables as each vendor's own runtime reads them (issue 13 item 6), through
//! actk-runtime in runc's place on fixture host roots: what the container sees.

use actk_testsupport::engines::{self, ActkConfig, Bundle, actk_runtime, expect_success, text, unique_name};
use actk_testsupport::fixture;
use anyhow::{Context, Result};
use std::fs;
use std::path::Path;
use std::process::Command;

type OsArg = std::ffi::OsString;

/// `actk-runtime run` of `bundle` with the config of host root `root`; the Output.
fn run(root: &Path, bundle: &Bundle, tag: &str) -> Result<std::process::Output> {
    let cfg = ActkConfig::new(root)?;
    let path = cfg.write()?;
    let id = unique_name(tag);
    let o = actk_runtime(&path, &[OsArg::from("run"), "--bundle".into(), bundle.path().into(), id.as_str().into()]);
    drop(cfg);
    Ok(o)
}

/// AMD_VISIBLE_DEVICES=1-2 on the MI300X node: the container gets the two GPUs' render and card
/// nodes (and /dev/kfd), as AMD's runtime does for a range.
#[test]
fn item6_amd_visible_devices_range_gives_the_container_those_gpus() -> Result<()> {
    if !engines::require_root() {
        return Ok(());
    }
    let Some(fx) = fixture::prepare("amd-mi300x")? else { return Ok(()) };
    let b = Bundle::busybox(&["sh", "-c", "ls /dev /dev/dri"], &["AMD_VISIBLE_DEVICES=1-2"])?;
    let out = expect_success("actk-runtime run (AMD_VISIBLE_DEVICES=1-2)", &run(&fx.root, &b, "e2e-amd-range")?);
    let listed: Vec<&str> = out.split_whitespace().collect();
    let render: Vec<&&str> = listed.iter().filter(|n| n.starts_with("renderD")).collect();
    assert_eq!(render.len(), 2, "two GPUs' render nodes: {out}");
    assert!(listed.contains(&"kfd"), "/dev/kfd: {out}");
    Ok(())
}

/// HABANA_VISIBLE_DEVICES=1,7 on the Gaudi2 node: the container's env has
/// HABANA_VISIBLE_MODULES=2,0, the module ids of accel1 and accel7, as Habana's runtime sets it.
#[test]
fn item6_habana_visible_modules_is_set_in_the_container() -> Result<()> {
    if !engines::require_root() {
        return Ok(());
    }
    let Some(fx) = fixture::prepare("gaudi2")? else { return Ok(()) };
    let b = Bundle::busybox(&["sh", "-c", "env; ls /dev/accel"], &["HABANA_VISIBLE_DEVICES=1,7"])?;
    let out = expect_success("actk-runtime run (HABANA_VISIBLE_DEVICES=1,7)", &run(&fx.root, &b, "e2e-habana")?);
    assert!(out.lines().any(|l| l == "HABANA_VISIBLE_MODULES=2,0"), "{out}");
    assert!(out.contains("accel1") && out.contains("accel7") && !out.contains("accel0"), "{out}");
    // A value the container gives must name modules of its devices.
    let b = Bundle::busybox(&["true"], &["HABANA_VISIBLE_DEVICES=1,7", "HABANA_VISIBLE_MODULES=5"])?;
    let o = run(&fx.root, &b, "e2e-habana-bad")?;
    let err = text(&o).1;
    assert!(!o.status.success() && err.contains("HABANA_VISIBLE_MODULES=5: module_id \"5\" is not one of"), "{err}");
    Ok(())
}

/// Gaudi devices asked for by CDI name, as the device plugin hands them out (a `cdi.k8s.io/`
/// annotation naming `habana.ai/gaudi=1` and `=7`), served by the spec `actk cdi generate`
/// wrote: the container's env has HABANA_VISIBLE_MODULES=2,0 as with HABANA_VISIBLE_DEVICES.
/// (It had none: the start's discovery left out the Gaudi devices that no variable named.)
#[test]
fn habana_visible_modules_is_set_for_gaudi_devices_asked_for_by_cdi_name() -> Result<()> {
    if !engines::require_root() {
        return Ok(());
    }
    let Some(fx) = fixture::prepare("gaudi2")? else { return Ok(()) };
    let cfg = ActkConfig::new(&fx.root)?;
    let o = Command::new(engines::bin("actk"))
        .args(["cdi", "generate", "--vendor", "gaudi", "--root"])
        .arg(&fx.root)
        .arg("--output")
        .arg(cfg.spec_dir())
        .output()?;
    expect_success("actk cdi generate --vendor gaudi", &o);
    let path = cfg.write()?;
    let b = Bundle::busybox(&["sh", "-c", "env; ls /dev/accel"], &[])?;
    b.edit(|c| c["annotations"] = serde_json::json!({"cdi.k8s.io/e2e": "habana.ai/gaudi=1,habana.ai/gaudi=7"}))?;
    let id = unique_name("e2e-habana-cdi");
    let o = actk_runtime(&path, &[OsArg::from("run"), "--bundle".into(), b.path().into(), id.as_str().into()]);
    let out = expect_success("actk-runtime run (habana.ai/gaudi=1,7 by CDI name)", &o);
    assert!(out.lines().any(|l| l == "HABANA_VISIBLE_MODULES=2,0"), "{out}");
    assert!(out.contains("accel1") && out.contains("accel7") && !out.contains("accel0"), "{out}");
    Ok(())
}

/// A CUDA image requiring `cuda>=99.0` on the DGX (driver 580.95.05, CUDA 13.0) does not start,
/// and says why; with NVIDIA_DISABLE_REQUIRE=true it starts with its GPU.
#[test]
fn item6_nvidia_require_cuda_is_checked_and_nvidia_disable_require_honoured() -> Result<()> {
    if !engines::require_root() {
        return Ok(());
    }
    let Some(fx) = fixture::prepare("nvidia-dgx-h100")? else { return Ok(()) };
    let need = ["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_REQUIRE_CUDA=cuda>=99.0"];
    let b = Bundle::busybox(&["echo", "container-ran"], &need)?;
    let before = fs::read(b.config_path())?;
    let o = run(&fx.root, &b, "e2e-require")?;
    let (out, err) = text(&o);
    assert!(!o.status.success() && !out.contains("container-ran"), "{out}");
    assert!(
        err.contains("NVIDIA_REQUIRE_CUDA=cuda>=99.0: unsatisfied condition: cuda>=99.0 (cuda=13.0)")
            && err.contains("NVIDIA_DISABLE_REQUIRE=true"),
        "{err}"
    );
    assert_eq!(fs::read(b.config_path())?, before, "config.json untouched");
    let b = Bundle::busybox(&["ls", "/dev"], &[need[0], need[1], "NVIDIA_DISABLE_REQUIRE=true"])?;
    let out =
        expect_success("actk-runtime run with NVIDIA_DISABLE_REQUIRE=true", &run(&fx.root, &b, "e2e-require-off")?);
    assert!(out.split_whitespace().any(|n| n == "nvidia0"), "{out}");
    Ok(())
}

/// Builds `dir/name` as a tiny shared library with soname `soname` (gcc -nostdlib, as the
/// fixtures' libraries).
fn tiny_lib(dir: &Path, name: &str, soname: &str) -> Result<()> {
    fs::create_dir_all(dir)?;
    let src = dir.join(".lib.c");
    fs::write(&src, "int actk_compat(void){return 1;}\n")?;
    let o = Command::new("gcc")
        .args(["-shared", "-fPIC", "-nostdlib", &format!("-Wl,-soname,{soname}"), "-o"])
        .arg(dir.join(name))
        .arg(&src)
        .output()
        .context("gcc")?;
    expect_success("gcc -shared", &o);
    fs::remove_file(src)?;
    Ok(())
}

/// CUDA forward compatibility (enable-cuda-compat): a glibc image shipping
/// /usr/local/cuda/compat/libcuda.so.590.44.01 on the 580 DGX gets that libcuda.so.1 first in its
/// ld.so.cache; an image whose compat driver is older (570) keeps the host's first.
#[test]
fn item6_cuda_compat_libraries_of_a_newer_driver_come_first() -> Result<()> {
    if !engines::require_root() {
        return Ok(());
    }
    let Some(fx) = fixture::prepare("nvidia-dgx-h100")? else { return Ok(()) };
    let glibc = engines::glibc_rootfs()?;
    for (compat, want_first) in
        [("590.44.01", "/usr/local/cuda/compat/libcuda.so.1"), ("570.86.10", "/usr/lib/x86_64-linux-gnu/libcuda.so.1")]
    {
        let b =
            Bundle::new(&glibc, &["sh", "-c", "ldconfig -p | grep 'libcuda.so.1 '"], &["NVIDIA_VISIBLE_DEVICES=0"])?;
        let dir = b.rootfs().join("usr/local/cuda/compat");
        tiny_lib(&dir, &format!("libcuda.so.{compat}"), "libcuda.so.1")?;
        std::os::unix::fs::symlink(format!("libcuda.so.{compat}"), dir.join("libcuda.so.1"))?;
        let out = expect_success(&format!("actk-runtime run (compat {compat})"), &run(&fx.root, &b, "e2e-compat")?);
        let first = out.lines().next().and_then(|l| l.split("=> ").nth(1)).map(str::trim);
        assert_eq!(first, Some(want_first), "compat {compat}: ldconfig -p in the container:\n{out}");
    }
    Ok(())
}
