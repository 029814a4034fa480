//! podman 4.3 with CDI on specs written by `actk cdi generate` (issue 2 "Done when", case F06's
//! second half): `podman run --device nvidia.com/gpu=1` on the DGX fixture shows /dev/nvidia1,
//! the control nodes and the driver libraries and not /dev/nvidia0; the same for a Neuron
//! device on the inf2 fixture.
//!
//! podman 4.3 reads CDI specs only from /etc/cdi and /var/run/cdi (its containers.conf has no
//! spec-dir setting), so each test writes its spec into /var/run/cdi under a unique
//! `actk-e2e-cdi-*` name, holds a lock while the file exists (two specs of one kind in one
//! directory would conflict and podman would refuse both), and removes the file afterwards,
//! touching nothing else in the directory.

use actk_testsupport::engines::{
    bin, expect_success, machine_lock_path, podman, podman_busybox_image, podman_glibc_image, require_root, text,
    unique_name, which, with_lock_at,
};
use actk_testsupport::fixture;
use anyhow::Result;
use std::path::{Path, PathBuf};

const SPEC_DIR: &str = "/var/run/cdi";
const PREFIX: &str = "actk-e2e-cdi-";

/// Removes the spec file when the test ends, pass or fail.
struct SpecFile(PathBuf);

impl Drop for SpecFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn can_run() -> bool {
    if !require_root() {
        return false;
    }
    if which("podman").is_none() {
        eprintln!("skipping: podman is not on PATH (run scripts/install-deps.sh)");
        return false;
    }
    true
}

/// Removes spec files earlier runs of these tests left behind (a killed run); only our own
/// prefix, and only while holding the lock, so no live test's file is touched.
fn remove_stale_specs() {
    if let Ok(entries) = std::fs::read_dir(SPEC_DIR) {
        for e in entries.flatten() {
            if e.file_name().to_string_lossy().starts_with(PREFIX) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

/// Generates the spec of `vendor` on fixture root `root` into /var/run/cdi, then runs
/// `podman run --device DEVICE IMG sh -c SCRIPT` and returns its stdout.
fn podman_with_generated_spec(root: &Path, vendor: &str, device: &str, script: &str) -> Result<String> {
    podman_image_with_generated_spec(root, vendor, device, podman_busybox_image()?, script)
}

fn podman_image_with_generated_spec(
    root: &Path,
    vendor: &str,
    device: &str,
    image: &str,
    script: &str,
) -> Result<String> {
    with_lock_at(&machine_lock_path("var-run-cdi"), || {
        remove_stale_specs();
        std::fs::create_dir_all(SPEC_DIR)?;
        let spec =
            SpecFile(PathBuf::from(SPEC_DIR).join(format!("{}.json", unique_name(&format!("{PREFIX}{vendor}")))));
        let o = std::process::Command::new(bin("actk"))
            .args(["cdi", "generate", "--vendor", vendor, "--root"])
            .arg(root)
            .arg("--output")
            .arg(&spec.0)
            .output()?;
        expect_success("actk cdi generate", &o);
        let v = std::process::Command::new(bin("actk")).args(["cdi", "validate"]).arg(&spec.0).output()?;
        expect_success("actk cdi validate", &v);

        let name = unique_name("e2e-cdi-podman");
        let o = podman(&["run", "--rm", "--name", &name, "--device", device, image, "sh", "-c", script]);
        let (out, err) = text(&o);
        assert!(
            o.status.success(),
            "podman run --device {device} failed (spec {}):\nstdout: {out}\nstderr: {err}",
            spec.0.display()
        );
        Ok(out)
    })
}

#[test]
fn podman_4_3_runs_nvidia_gpu_1_from_generated_cdi_spec() -> Result<()> {
    if !can_run() {
        return Ok(());
    }
    let Some(f) = fixture::prepare("nvidia-dgx-h100")? else { return Ok(()) };
    let out = podman_with_generated_spec(
        &f.root,
        "nvidia",
        "nvidia.com/gpu=1",
        "ls -1 /dev; echo ---; ls -1 /usr/lib/x86_64-linux-gnu /usr/bin",
    )?;
    let (devs, libs) = out.split_once("---").unwrap_or((&out, ""));
    let devs: Vec<&str> = devs.lines().collect();
    for want in ["nvidia1", "nvidiactl", "nvidia-uvm"] {
        assert!(devs.contains(&want), "/dev lacks {want}: {devs:?}");
    }
    for absent in ["nvidia0", "nvidia2", "nvidia7"] {
        assert!(!devs.contains(&absent), "/dev has {absent} although only gpu=1 was asked for: {devs:?}");
    }
    let libs: Vec<&str> = libs.lines().collect();
    for want in ["libcuda.so.580.95.05", "libcuda.so.1", "libnvidia-ml.so.1", "nvidia-smi"] {
        assert!(libs.contains(&want), "driver file {want} is not mounted: {libs:?}");
    }
    Ok(())
}

#[test]
fn podman_4_3_runs_neuron_device_from_generated_cdi_spec() -> Result<()> {
    if !can_run() {
        return Ok(());
    }
    let Some(f) = fixture::prepare("aws-inf2-48xlarge")? else { return Ok(()) };
    let out = podman_with_generated_spec(
        &f.root,
        "neuron",
        "aws.amazon.com/neuron=3",
        "ls -1 /dev; echo ---; ls -1 /opt/aws/neuron/bin",
    )?;
    let (devs, tools) = out.split_once("---").unwrap_or((&out, ""));
    let devs: Vec<&str> = devs.lines().collect();
    assert!(devs.contains(&"neuron3"), "/dev lacks neuron3: {devs:?}");
    for absent in ["neuron0", "neuron2", "neuron11"] {
        assert!(!devs.contains(&absent), "/dev has {absent} although only neuron=3 was asked for: {devs:?}");
    }
    assert!(tools.lines().any(|l| l == "neuron-ls"), "neuron-ls is not mounted: {tools}");
    Ok(())
}

/// A generated spec carries a createContainer hook (`actk-hook update-ldcache`, the actk-hook
/// next to actk) so that a glibc image's dynamic linker finds the mounted driver libraries, as
/// CUDA's `dlopen("libcuda.so.1")` needs; and the hook never runs the image's own ldconfig.
#[test]
fn podman_4_3_glibc_image_finds_libcuda_in_ld_so_cache_through_the_spec_hook() -> Result<()> {
    if !can_run() {
        return Ok(());
    }
    let Some(f) = fixture::prepare("nvidia-dgx-h100")? else { return Ok(()) };
    let image = podman_glibc_image()?;
    let out = podman_image_with_generated_spec(&f.root, "nvidia", "nvidia.com/gpu=0", image, "ldconfig -p")?;
    assert!(
        out.lines().any(|l| l.trim_start().starts_with("libcuda.so.1 ") && l.contains("/libcuda.so.1")),
        "ldconfig -p in the container does not list libcuda.so.1:\n{out}"
    );
    Ok(())
}
