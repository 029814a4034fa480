//! actk-runtime in runc's place, on OCI bundles, with fixture host roots (issue 3, item 4):
//! what a user of `runc` (or of anything that calls an OCI runtime) sees.
//!
//! Each test writes its own actk config (ACTK_CONFIG) with private, empty spec, hooks and profile
//! directories, so tests never read the machine's /etc/cdi or hooks.d and run in parallel.

use actk_testsupport::engines::{self, ActkConfig, Bundle, actk_runtime, expect_success, text, unique_name};
use actk_testsupport::fixture;
use anyhow::{Context, Result};
use std::collections::BTreeSet;
use std::fs;
use std::path::Path;
use std::process::Command;

/// Replace the fixture's node `rel` by one with /dev/null's numbers (1:3), so the container can
/// really open it (a node with the driver's numbers gives ENXIO: no driver here, ENVIRONMENT.md).
fn make_openable(root: &Path, rel: &str) -> Result<()> {
    let node = root.join(rel.trim_start_matches('/'));
    fs::remove_file(&node).with_context(|| format!("removing {}", node.display()))?;
    let o = Command::new("mknod").args(["-m", "0666"]).arg(&node).args(["c", "1", "3"]).output()?;
    expect_success(&format!("mknod {} c 1 3", node.display()), &o);
    Ok(())
}

/// The running driver's version from the fixture's /proc/driver/nvidia/version
/// (`NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build ...`).
fn driver_version(root: &Path) -> Result<String> {
    let p = root.join("proc/driver/nvidia/version");
    let text = fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
    text.split_whitespace()
        .find(|w| {
            w.split('.').count() >= 2 && w.split('.').all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
        })
        .map(String::from)
        .with_context(|| format!("no driver version in {}", p.display()))
}

/// The running driver's library `<prefix><driver version>` in `<root>/usr/lib/x86_64-linux-gnu`
/// (a regular file, not a symlink), as container paths. Libraries of another driver version
/// (the DGX fixture keeps a stale 535 one) are not the container's business.
fn versioned_libs(root: &Path, prefix: &str) -> Result<Vec<String>> {
    let dir = root.join("usr/lib/x86_64-linux-gnu");
    let version = driver_version(root)?;
    let mut v = Vec::new();
    for e in fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        if name == format!("{prefix}{version}") && e.file_type()?.is_file() {
            v.push(format!("/usr/lib/x86_64-linux-gnu/{name}"));
        }
    }
    v.sort();
    Ok(v)
}

/// md5sum of a host file (the `md5sum` tool, as the container uses busybox's).
fn md5(path: &Path) -> Result<String> {
    let o = Command::new("md5sum").arg(path).output()?;
    let out = expect_success("md5sum", &o);
    Ok(out.split_whitespace().next().unwrap_or_default().to_string())
}

/// The section `== NAME` of the container's output (lines until the next `== `).
fn section<'a>(out: &'a str, name: &str) -> Vec<&'a str> {
    let head = format!("== {name}");
    out.lines().skip_while(|l| l.trim() != head).skip(1).take_while(|l| !l.starts_with("== ")).collect()
}

#[test]
fn runc_bundle_asking_nvidia_1_3_sees_exactly_gpus_1_and_3_control_nodes_and_driver_libraries() -> Result<()> {
    if !engines::require_root() {
        return Ok(());
    }
    let Some(fx) = fixture::prepare("nvidia-dgx-h100")? else { return Ok(()) };
    // The control node every CUDA program opens first. (A GPU node cannot be swapped: discovery
    // checks that /dev/nvidiaN is 195:N and drops it otherwise.)
    make_openable(&fx.root, "/dev/nvidiactl")?;
    // utility and compute are the default capabilities: libnvidia-ml and libcuda must be there.
    let mut libs = versioned_libs(&fx.root, "libcuda.so.")?;
    libs.extend(versioned_libs(&fx.root, "libnvidia-ml.so.")?);
    assert_eq!(libs.len(), 2, "fixture should have one versioned libcuda and one libnvidia-ml: {libs:?}");

    let script = format!(
        "echo '== dev'; ls -1 /dev; \
         echo '== nvidiactl'; stat -c '%F %t:%T' /dev/nvidiactl; echo hello > /dev/nvidiactl && echo write-ok; \
         echo '== libs'; md5sum {}; \
         echo '== env'; env",
        libs.join(" ")
    );
    let bundle = Bundle::busybox(&["sh", "-c", &script], &["NVIDIA_VISIBLE_DEVICES=1,3"])?;
    // Keep the ActkConfig alive: dropping it deletes the config file.
    let actk_config = ActkConfig::new(&fx.root)?;
    let cfg = actk_config.write()?;
    let id = unique_name("e2e-runc-dgx");
    let o = actk_runtime(&cfg, &[OsArg::from("run"), "--bundle".into(), bundle.path().into(), id.as_str().into()]);
    let out = expect_success("actk-runtime run --bundle B ID (NVIDIA_VISIBLE_DEVICES=1,3)", &o);

    let dev: BTreeSet<String> = section(&out, "dev").iter().map(|s| s.trim().to_string()).collect();
    let nvidia: BTreeSet<&str> = dev.iter().map(String::as_str).filter(|n| n.starts_with("nvidia")).collect();
    // GPU nodes: exactly the two asked for.
    let gpus: BTreeSet<&str> =
        nvidia.iter().copied().filter(|n| n[6..].chars().all(|c| c.is_ascii_digit()) && n.len() > 6).collect();
    assert_eq!(gpus, BTreeSet::from(["nvidia1", "nvidia3"]), "GPU nodes in the container: {dev:?}\n{out}");
    // Control nodes every CUDA program opens.
    for ctl in ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"] {
        assert!(nvidia.contains(ctl), "control node /dev/{ctl} missing in the container: {dev:?}");
    }
    // Nothing else of the host's NVIDIA nodes: no NVSwitch, no MIG capability nodes.
    let allowed = ["nvidia1", "nvidia3", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"];
    let extra: Vec<&&str> = nvidia.iter().filter(|n| !allowed.contains(n)).collect();
    assert!(extra.is_empty(), "nodes that were not asked for are in the container: {extra:?}");

    let ctl = section(&out, "nvidiactl");
    assert_eq!(
        ctl.first().map(|s| s.trim()),
        Some("character special file 1:3"),
        "/dev/nvidiactl in the container: {ctl:?}"
    );
    assert!(ctl.contains(&"write-ok"), "the container could not open /dev/nvidiactl (1:3): {out}");

    let seen: Vec<(String, String)> = section(&out, "libs")
        .iter()
        .filter_map(|l| l.split_once("  ").map(|(h, p)| (p.trim().to_string(), h.to_string())))
        .collect();
    for lib in &libs {
        let want = md5(&fx.root.join(lib.trim_start_matches('/')))?;
        let got = seen.iter().find(|(p, _)| p == lib).map(|(_, h)| h.clone());
        assert_eq!(got.as_deref(), Some(want.as_str()), "{lib} in the container is not the host's file: {out}");
    }
    let env = section(&out, "env");
    assert!(env.contains(&"NVIDIA_VISIBLE_DEVICES=1,3"), "env in the container: {env:?}");
    Ok(())
}

/// The hooks.d file of [`hooks_d_hook_with_when_annotations_runs_only_for_matching_containers`]:
/// a prestart hook appending the OCI state (which has the container id) to `out`.
fn annotation_hook(out: &Path) -> String {
    serde_json::json!({
        "version": "1.0.0",
        "hook": {
            "path": "/bin/sh",
            "args": ["sh", "-c", format!("cat >> {0}; echo >> {0}", out.display())]
        },
        "when": { "annotations": { "^com\\.example\\.actk-e2e$": "^yes$" } },
        "stages": ["prestart"]
    })
    .to_string()
}

#[test]
fn hooks_d_hook_with_when_annotations_runs_only_for_matching_containers() -> Result<()> {
    if !engines::require_root() {
        return Ok(());
    }
    let host = tempfile::tempdir()?;
    let cfg = ActkConfig::new(host.path())?;
    let ran = cfg.dir().join("hook-ran.jsonl");
    fs::write(cfg.hooks_dir().join("50-actk-e2e.json"), annotation_hook(&ran))?;
    let cfg_path = cfg.write()?;

    let mut ids = Vec::new();
    for (tag, annotation) in [("match", Some("yes")), ("other-value", Some("no")), ("none", None)] {
        let bundle = Bundle::busybox(&["echo", "container-ran"], &[])?;
        if let Some(v) = annotation {
            bundle.edit(|c| c["annotations"] = serde_json::json!({ "com.example.actk-e2e": v }))?;
        }
        let id = unique_name(&format!("e2e-hooksd-{tag}"));
        let o =
            actk_runtime(&cfg_path, &[OsArg::from("run"), "--bundle".into(), bundle.path().into(), id.as_str().into()]);
        let out = expect_success(&format!("actk-runtime run ({tag})"), &o);
        assert!(out.contains("container-ran"), "container {tag} did not run: {out}");
        ids.push(id);
    }
    let log = fs::read_to_string(&ran).unwrap_or_default();
    let hooked: Vec<String> = log
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str::<serde_json::Value>(l).map(|v| v["id"].as_str().unwrap_or_default().to_string()))
        .collect::<Result<_, _>>()
        .with_context(|| format!("hook output is not OCI state JSON: {log}"))?;
    assert_eq!(hooked, vec![ids[0].clone()], "the hook must run for the annotated container only");
    Ok(())
}

/// Run `actk-runtime run` on a fresh busybox bundle with config `cfg`, expecting failure.
/// Returns stderr; asserts that config.json was left untouched and the container never ran.
fn run_expect_failure(cfg: &Path, env: &[&str], what: &str) -> Result<String> {
    let bundle = Bundle::busybox(&["echo", "container-ran"], env)?;
    let before = fs::read(bundle.config_path())?;
    let id = unique_name("e2e-bad");
    let o = actk_runtime(cfg, &[OsArg::from("run"), "--bundle".into(), bundle.path().into(), id.as_str().into()]);
    let (out, err) = text(&o);
    assert!(!o.status.success(), "{what}: actk-runtime must fail, but it exited 0:\n{out}\n{err}");
    assert!(!out.contains("container-ran"), "{what}: the container ran anyway: {out}");
    assert_eq!(fs::read(bundle.config_path())?, before, "{what}: config.json was changed although the start failed");
    Ok(err)
}

#[test]
fn malformed_hooks_d_file_stops_the_start_with_an_error_naming_the_file() -> Result<()> {
    if !engines::require_root() {
        return Ok(());
    }
    let host = tempfile::tempdir()?;
    let cfg = ActkConfig::new(host.path())?;
    let bad = cfg.hooks_dir().join("10-broken.json");
    // Truncated JSON, as an editor crash or a half-written package file leaves it.
    fs::write(
        &bad,
        "{\n  \"version\": \"1.0.0\",\n  \"hook\": { \"path\": \"/bin/true\" },\n  \"when\": { \"always\": true ",
    )?;
    let err = run_expect_failure(&cfg.write()?, &[], "malformed hooks.d file")?;
    assert!(err.contains(&bad.display().to_string()), "the error must name {}: {err}", bad.display());
    Ok(())
}

#[test]
fn malformed_config_toml_gives_an_error_naming_the_file_and_line() -> Result<()> {
    if !engines::require_root() {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let cfg = dir.path().join("config.toml");
    fs::write(&cfg, "runtimes = [\"runc\"]\nspec_dirs = [\"/etc/cdi\"\nroot = \"/\"\n")?;
    let err = run_expect_failure(&cfg, &[], "malformed config.toml")?;
    assert!(err.contains(&cfg.display().to_string()), "the error must name {}: {err}", cfg.display());
    assert!(err.contains("line"), "the error must say which line is wrong: {err}");
    Ok(())
}

#[test]
fn unknown_key_in_config_toml_gives_an_error_naming_the_key() -> Result<()> {
    if !engines::require_root() {
        return Ok(());
    }
    let host = tempfile::tempdir()?;
    let mut cfg = ActkConfig::new(host.path())?;
    cfg.extra = "runtime_path = \"/usr/bin/runc\"\n".into();
    let path = cfg.write()?;
    let err = run_expect_failure(&path, &[], "unknown config key")?;
    assert!(err.contains("runtime_path"), "the error must name the unknown key runtime_path: {err}");
    assert!(err.contains(&path.display().to_string()), "the error must name {}: {err}", path.display());
    Ok(())
}

#[test]
fn missing_low_level_runtime_names_the_runtime_and_the_path_searched_f02() -> Result<()> {
    if !engines::require_root() {
        return Ok(());
    }
    let host = tempfile::tempdir()?;
    let mut cfg = ActkConfig::new(host.path())?;
    cfg.runtimes = vec!["actk-e2e-no-such-runc".into()];
    let err = run_expect_failure(&cfg.write()?, &[], "missing low-level runtime")?;
    assert!(err.contains("actk-e2e-no-such-runc"), "the error must name the runtime it looked for: {err}");
    assert!(err.contains("PATH"), "the error must say that PATH was searched: {err}");
    Ok(())
}

#[test]
fn unknown_device_through_runc_names_the_variable_the_value_and_the_devices_that_exist() -> Result<()> {
    if !engines::require_root() {
        return Ok(());
    }
    let Some(fx) = fixture::prepare("hetero-nvidia-neuron")? else { return Ok(()) };
    // Keep the ActkConfig alive: dropping it deletes the config file.
    let actk_config = ActkConfig::new(&fx.root)?;
    let cfg = actk_config.write()?;
    let err = run_expect_failure(&cfg, &["NVIDIA_VISIBLE_DEVICES=7"], "NVIDIA_VISIBLE_DEVICES=7 on 2 GPUs")?;
    engines::assert_names_unknown_device(&err, "NVIDIA_VISIBLE_DEVICES", "7", &fx.root);
    Ok(())
}

/// An argument list element: `&str` and paths mixed in one slice.
type OsArg = std::ffi::OsString;

#[test]
fn glibc_container_asking_for_a_gpu_finds_libcuda_so_1_with_ldconfig_p() -> Result<()> {
    if !engines::require_root() {
        return Ok(());
    }
    let Some(fx) = fixture::prepare("nvidia-dgx-h100")? else { return Ok(()) };
    // A CUDA program dlopens "libcuda.so.1": the container's ld.so.cache must know the injected
    // driver libraries, which needs ldconfig run inside the container after the mounts.
    let bundle = Bundle::glibc(&["/sbin/ldconfig", "-p"], &["NVIDIA_VISIBLE_DEVICES=0"])?;
    // Keep the ActkConfig alive: dropping it deletes the config file.
    let actk_config = ActkConfig::new(&fx.root)?;
    let cfg = actk_config.write()?;
    let id = unique_name("e2e-runc-ldcache");
    let o = actk_runtime(&cfg, &[OsArg::from("run"), "--bundle".into(), bundle.path().into(), id.as_str().into()]);
    let out = expect_success("actk-runtime run (glibc image, ldconfig -p)", &o);
    for soname in ["libcuda.so.1", "libnvidia-ml.so.1"] {
        let line = out.lines().find(|l| l.trim_start().starts_with(&format!("{soname} ")));
        assert!(
            line.is_some_and(|l| l.contains("=> /usr/lib/x86_64-linux-gnu/")),
            "ldconfig -p in the container does not list {soname} in /usr/lib/x86_64-linux-gnu:\n{out}"
        );
    }
    Ok(())
}

/// Field case F04 (shared/cases): `-b DIR`, `--bundle=DIR`, `--bundle DIR` and no flag edit the same config.json.
#[test]
fn bundle_given_as_dash_b_bundle_equals_bundle_space_or_working_directory_is_edited_alike_f04() -> Result<()> {
    if !engines::require_root() {
        return Ok(());
    }
    let Some(fx) = fixture::prepare("nvidia-dgx-h100")? else { return Ok(()) };
    let actk_config = ActkConfig::new(&fx.root)?;
    let cfg = actk_config.write()?;
    for form in ["-b", "--bundle=", "--bundle", "cwd"] {
        let bundle = Bundle::busybox(&["ls", "-1", "/dev"], &["NVIDIA_VISIBLE_DEVICES=2"])?;
        let id = unique_name("e2e-f04");
        let dir = bundle.path().display().to_string();
        let mut cmd = Command::new("timeout");
        cmd.args(["--kill-after=10", "180"]).arg(engines::bin("actk-runtime")).env("ACTK_CONFIG", &cfg).arg("run");
        match form {
            "-b" | "--bundle" => cmd.args([form, &dir]),
            "--bundle=" => cmd.arg(format!("--bundle={dir}")),
            _ => cmd.current_dir(bundle.path()),
        };
        let o = cmd.arg(&id).stdin(std::process::Stdio::null()).output()?;
        let dev = engines::names(&expect_success(&format!("actk-runtime run with the bundle as {form}"), &o));
        assert!(dev.contains("nvidia2") && !dev.contains("nvidia0"), "bundle as {form}: /dev is {dev:?}");
    }
    Ok(())
}

/// Field case F05 (shared/cases): the image's library dir is a symlink; libraries land in its target inside the root.
#[test]
fn image_whose_library_dir_is_an_absolute_symlink_gets_the_libraries_inside_its_root_f05() -> Result<()> {
    if !engines::require_root() {
        return Ok(());
    }
    let Some(fx) = fixture::prepare("nvidia-dgx-h100")? else { return Ok(()) };
    let libcuda = versioned_libs(&fx.root, "libcuda.so.")?;
    let libcuda = libcuda.first().context("no libcuda in the fixture")?;
    let name = libcuda.rsplit('/').next().unwrap_or_default();
    // As images do (merged /usr, multiarch moves): the library directory is an absolute symlink to
    // another directory of the image. Its target does not exist on the host: if anything followed
    // the link outside the container root, the host would get that directory.
    let target = format!("/actk-e2e-f05-{}", std::process::id());
    let script = format!("md5sum /usr/lib/x86_64-linux-gnu/{name} && ls -1 {target}");
    let bundle = Bundle::busybox(&["sh", "-c", &script], &["NVIDIA_VISIBLE_DEVICES=0"])?;
    let rootfs = bundle.rootfs();
    fs::create_dir_all(rootfs.join(target.trim_start_matches('/')))?;
    fs::create_dir_all(rootfs.join("usr/lib"))?;
    std::os::unix::fs::symlink(&target, rootfs.join("usr/lib/x86_64-linux-gnu"))?;
    let actk_config = ActkConfig::new(&fx.root)?;
    let cfg = actk_config.write()?;
    let id = unique_name("e2e-f05");
    let o = actk_runtime(&cfg, &[OsArg::from("run"), "--bundle".into(), bundle.path().into(), id.as_str().into()]);
    let out = expect_success("actk-runtime run on an image with /usr/lib/x86_64-linux-gnu -> /elsewhere", &o);
    let want = md5(&fx.root.join(libcuda.trim_start_matches('/')))?;
    assert!(out.lines().any(|l| l.starts_with(&want)), "the container does not see the host's {libcuda}: {out}");
    assert!(
        out.lines().any(|l| l.trim() == name),
        "{name} did not land in the symlink's target {target} inside the image: {out}"
    );
    assert!(
        !Path::new(&target).exists(),
        "{target} was created on the host: a symlink was followed out of the container root"
    );
    Ok(())
}
