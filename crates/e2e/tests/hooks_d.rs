//! hooks.d as podman reads it (issue 13 item 5): legacy 0.1.0 files (field case F16) and a hooks
//! dir that podman and actk-runtime both read, with the real runc and podman 4.3.

use actk_testsupport::engines::{self, ActkConfig, Bundle, actk_runtime, expect_success, podman, unique_name};
use actk_testsupport::fixture;
use anyhow::Result;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

type OsArg = std::ffi::OsString;

/// CentOS 8's /usr/share/containers/oci/hooks.d/oci-systemd-hook.json (package oci-systemd-hook
/// 0.2.0, schema 0.1.0: `cmd`, `hook`, `stage`, no version), verbatim.
const CENTOS8_OCI_SYSTEMD_HOOK: &str = r#"{
    "cmd" : [".*/init$" , ".*/systemd$" ],
    "hook" : "/usr/libexec/oci/hooks.d/oci-systemd-hook",
    "stage" : [ "prestart", "poststop" ]
}
"#;

/// An executable hook at `dir/name` that appends one line (`name <container id>`) to `log`.
fn recording_hook(dir: &Path, name: &str, log: &Path) -> Result<std::path::PathBuf> {
    let p = dir.join(name);
    fs::write(
        &p,
        format!(
            "#!/bin/sh\n# OCI state on stdin: append the hook's name and the container id.\nid=$(sed -n 's/.*\"id\": *\"\\([^\"]*\\)\".*/\\1/p')\necho \"{name} $id\" >> '{}'\n",
            log.display()
        ),
    )?;
    fs::set_permissions(&p, fs::Permissions::from_mode(0o755))?;
    Ok(p)
}

/// F16: a hooks dir holding CentOS 8's oci-systemd-hook.json (its executable is not installed
/// here, so it is skipped as podman skips it) and a 0.1.0 file of the same shape whose hook
/// exists: the container starts, and the 0.1.0 hook runs for the command its `cmd` names only.
#[test]
fn f16_hooks_dir_with_a_0_1_0_file_starts_containers_and_runs_the_hook_as_podman_would() -> Result<()> {
    if !engines::require_root() {
        return Ok(());
    }
    let host = tempfile::tempdir()?;
    let cfg = ActkConfig::new(host.path())?;
    let log = cfg.dir().join("ran.log");
    fs::write(cfg.hooks_dir().join("oci-systemd-hook.json"), CENTOS8_OCI_SYSTEMD_HOOK)?;
    let hook = recording_hook(cfg.dir(), "legacy-hook", &log)?;
    fs::write(
        cfg.hooks_dir().join("legacy.json"),
        format!(r#"{{"cmd": [".*/echo$"], "hook": "{}", "stage": ["prestart"]}}"#, hook.display()),
    )?;
    let cfg_path = cfg.write()?;
    let mut ran = Vec::new();
    for (tag, arg0) in [("echo", "/bin/echo"), ("sh", "/bin/sh")] {
        let args: &[&str] = if tag == "echo" { &[arg0, "container-ran"] } else { &[arg0, "-c", "echo container-ran"] };
        let bundle = Bundle::busybox(args, &[])?;
        let id = unique_name(&format!("e2e-f16-{tag}"));
        let o =
            actk_runtime(&cfg_path, &[OsArg::from("run"), "--bundle".into(), bundle.path().into(), id.as_str().into()]);
        let out = expect_success(&format!("actk-runtime run with a 0.1.0 hooks dir ({tag})"), &o);
        assert!(out.contains("container-ran"), "{out}");
        ran.push(id);
    }
    let lines: Vec<String> = fs::read_to_string(&log).unwrap_or_default().lines().map(String::from).collect();
    assert_eq!(lines, [format!("legacy-hook {}", ran[0])], "the 0.1.0 hook runs for /bin/echo only");
    Ok(())
}

/// Item 5: podman (--hooks-dir DIR) and actk-runtime (hooks_dirs = [DIR]) read the same hooks dir;
/// the hook runs once per container, not twice. The legacy 0.1.0 file in the same dir is one
/// podman accepts, and the container starts.
#[test]
fn item5_podman_and_actk_runtime_sharing_a_hooks_dir_run_each_hook_once() -> Result<()> {
    if !engines::require_root_and_engines() {
        return Ok(());
    }
    let host = tempfile::tempdir()?;
    let cfg = ActkConfig::new(host.path())?;
    let log = cfg.dir().join("ran.log");
    let current = recording_hook(cfg.dir(), "current-hook", &log)?;
    let legacy = recording_hook(cfg.dir(), "legacy-hook", &log)?;
    fs::write(
        cfg.hooks_dir().join("10-current.json"),
        format!(
            r#"{{"version": "1.0.0", "hook": {{"path": "{}"}}, "when": {{"always": true}}, "stages": ["prestart"]}}"#,
            current.display()
        ),
    )?;
    fs::write(
        cfg.hooks_dir().join("20-legacy.json"),
        format!(r#"{{"cmd": [".*"], "hook": "{}", "stage": ["prestart"]}}"#, legacy.display()),
    )?;
    fs::write(cfg.hooks_dir().join("oci-systemd-hook.json"), CENTOS8_OCI_SYSTEMD_HOOK)?;
    let wrapper = cfg.write_wrapper()?;
    let image = engines::podman_busybox_image()?;
    let name = unique_name("e2e-hooksd-podman");
    let hooks_dir = cfg.hooks_dir().display().to_string();
    let runtime = wrapper.display().to_string();
    let o = podman(&[
        "run",
        "--rm",
        "--network",
        "none",
        "--name",
        &name,
        "--hooks-dir",
        &hooks_dir,
        "--runtime",
        &runtime,
        image,
        "echo",
        "container-ran",
    ]);
    let out = expect_success("podman run --hooks-dir DIR --runtime actk-runtime", &o);
    assert!(out.contains("container-ran"), "{out}");
    let lines = fs::read_to_string(&log).unwrap_or_default();
    let count = |hook: &str| lines.lines().filter(|l| l.starts_with(&format!("{hook} "))).count();
    assert_eq!((count("current-hook"), count("legacy-hook")), (1, 1), "each hook must run once: {lines}");
    Ok(())
}

/// A hooks.d hook `when: {hasBindMounts: true}` sees the mounts actk-runtime adds (issue 31:
/// the added mounts are written straight from the edits, and a hooks.d condition must still see
/// them): on a bundle without bind mounts of its own, the hook runs for a container asking for
/// a GPU (the driver libraries are bind-mounted) and not for one asking for nothing.
#[test]
fn has_bind_mounts_hook_sees_the_driver_mounts_actk_adds() -> Result<()> {
    if !engines::require_root() {
        return Ok(());
    }
    let Some(fx) = fixture::prepare("nvidia-dgx-h100")? else { return Ok(()) };
    let cfg = ActkConfig::new(&fx.root)?;
    let log = cfg.dir().join("ran.log");
    let hook = recording_hook(cfg.dir(), "binds-hook", &log)?;
    fs::write(
        cfg.hooks_dir().join("binds.json"),
        format!(
            r#"{{"version": "1.0.0", "hook": {{"path": "{}"}}, "when": {{"hasBindMounts": true}}, "stages": ["prestart"]}}"#,
            hook.display()
        ),
    )?;
    let cfg_path = cfg.write()?;
    let mut ids = Vec::new();
    for (tag, env) in [("gpu", &["NVIDIA_VISIBLE_DEVICES=1"][..]), ("plain", &[][..])] {
        let bundle = Bundle::busybox(&["true"], env)?;
        let spec: serde_json::Value = serde_json::from_slice(&fs::read(bundle.path().join("config.json"))?)?;
        let binds = spec["mounts"].as_array().into_iter().flatten().filter(|m| {
            m["type"] == "bind"
                || m["options"].as_array().is_some_and(|o| o.iter().any(|x| x == "bind" || x == "rbind"))
        });
        assert_eq!(binds.count(), 0, "the bundle must have no bind mounts of its own: {spec}");
        let id = unique_name(&format!("e2e-binds-{tag}"));
        let o =
            actk_runtime(&cfg_path, &[OsArg::from("run"), "--bundle".into(), bundle.path().into(), id.as_str().into()]);
        expect_success(&format!("actk-runtime run with a hasBindMounts hook ({tag})"), &o);
        ids.push(id);
    }
    let lines: Vec<String> = fs::read_to_string(&log).unwrap_or_default().lines().map(String::from).collect();
    assert_eq!(lines, [format!("binds-hook {}", ids[0])], "the hook runs for the GPU container only");
    Ok(())
}
