//! The engines themselves, without actk: a busybox container starts under plain runc, dockerd
//! and podman on this machine. When one of these fails, the actk tests of that engine cannot
//! say anything about actk; these name the broken piece of the machine instead.

use actk_testsupport::engines::{self, Bundle, docker, expect_success, podman, runc, unique_name};
use anyhow::Result;

#[test]
fn plain_runc_runs_a_busybox_bundle() -> Result<()> {
    if !engines::require_root() {
        return Ok(());
    }
    let bundle = Bundle::busybox(&["sh", "-c", "echo hello from $(uname -s) && ls /dev"], &[])?;
    let id = unique_name("e2e-baseline-runc");
    let o = runc(&["run".as_ref(), "--bundle".as_ref(), bundle.path().as_os_str(), id.as_ref()]);
    let out = expect_success("runc run", &o);
    assert!(out.contains("hello from Linux"), "{out}");
    assert!(!out.contains("nvidia"), "plain runc must not add accelerator nodes: {out}");
    Ok(())
}

#[test]
fn plain_docker_runs_the_busybox_image() -> Result<()> {
    if !engines::require_root_and_engines() {
        return Ok(());
    }
    let image = engines::docker_busybox_image()?;
    let name = unique_name("e2e-baseline-docker");
    let o = docker(&["run", "--rm", "--network", "none", "--name", &name, image, "sh", "-c", "echo hello"]);
    assert_eq!(expect_success("docker run", &o).trim(), "hello");
    Ok(())
}

#[test]
fn plain_podman_runs_the_busybox_image_with_runc() -> Result<()> {
    if !engines::require_root_and_engines() {
        return Ok(());
    }
    let image = engines::podman_busybox_image()?;
    let name = unique_name("e2e-baseline-podman");
    let o = podman(&["run", "--rm", "--network", "none", "--name", &name, image, "sh", "-c", "echo hello"]);
    assert_eq!(expect_success("podman run", &o).trim(), "hello");
    Ok(())
}

#[test]
fn the_harness_config_file_is_one_actk_accepts() -> Result<()> {
    // Every end-to-end test hands actk an ActkConfig; if its keys drifted from actk's config
    // (unknown keys are errors), all of them would fail for a reason that is not theirs.
    let host = tempfile::tempdir()?;
    let cfg = engines::ActkConfig::new(host.path())?;
    let path = cfg.write()?;
    let o = engines::actk(Some(&path), &["config", "show"]);
    let out = expect_success("actk config show with the harness config", &o);
    assert!(out.contains(&host.path().display().to_string()), "root not taken from the harness config: {out}");
    assert!(out.contains(&cfg.hooks_dir().display().to_string()), "hooks_dirs not taken: {out}");
    Ok(())
}
