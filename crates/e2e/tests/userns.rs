//! Containers with their own user namespace (issue 13 item 1, field case F15): a runc bundle
//! with uid/gid 0 mapped to 100000 (65536 ids), as podman `--uidmap`, Docker userns-remap and
//! Kubernetes `hostUsers: false` make them, on the DGX fixture, whose device nodes exist only
//! under the fixture root (the driver-container layout: /run/nvidia/driver/dev/...).
//!
//! What breaks without the fixes: runc cannot mknod in a user namespace and bind-mounts each
//! linux.devices entry from its container path on the host (absent here: "error creating device
//! nodes: mount /dev/nvidiactl ... no such file"); actk-hook, as host root, cannot create files
//! on the container's /dev tmpfs (EOVERFLOW: uid 0 has no mapping there) and a node made there
//! would be on a nodev file system; createContainer hooks run inside the user namespace, where
//! the bundle's config.json (0600, as engines write it) cannot be read.
//!
//! The ld.so.cache refresh of glibc images in a user namespace (the host ldconfig's ownership
//! check, seen through the namespace) is the security branch's part; these tests use busybox
//! images, which have no loader configuration to refresh.

use actk_testsupport::engines::{
    self, ActkConfig, Bundle, actk_runtime, bin, expect_success, podman, runc, text, unique_name,
};
use actk_testsupport::fixture::{self, Fixture};
use anyhow::{Context, Result};
use serde_json::{Value, json};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

type OsArg = std::ffi::OsString;

const HOST_ID: u32 = 100000;
const LIB: &str = "/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05";

/// Lists the container's NVIDIA nodes with type and numbers, opens /dev/nvidia0 (ENXIO: the
/// device cgroup allows it and no driver backs the fixture's node; EACCES/EPERM: refused or on a
/// nodev mount), and hashes libcuda.
const SCRIPT: &str = "for n in /dev/nvidia0 /dev/nvidiactl; do stat -c '%n %F %t:%T' $n; done; \
    cat /dev/nvidia0 2>&1; md5sum /usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05; cat /proc/self/uid_map";

/// A busybox bundle whose config.json asks for a user namespace with 0 -> 100000 (65536 ids),
/// with its rootfs owned by that root (what engines do), and config.json mode 0600.
fn userns_bundle(env: &[&str]) -> Result<Bundle> {
    let b = Bundle::busybox(&["sh", "-c", SCRIPT], env)?;
    let o = Command::new("chown").args(["-R", &format!("{HOST_ID}:{HOST_ID}")]).arg(b.rootfs()).output()?;
    expect_success("chown rootfs", &o);
    b.edit(|c| {
        let ns = c["linux"]["namespaces"].as_array_mut().expect("runc spec has namespaces");
        ns.push(json!({"type": "user"}));
        let map = json!([{"containerID": 0, "hostID": HOST_ID, "size": 65536}]);
        c["linux"]["uidMappings"] = map.clone();
        c["linux"]["gidMappings"] = map;
    })?;
    fs::set_permissions(b.config_path(), fs::Permissions::from_mode(0o600))?;
    Ok(b)
}

fn md5(p: &Path) -> Result<String> {
    let o = Command::new("md5sum").arg(p).output()?;
    Ok(text(&o).0.split_whitespace().next().unwrap_or_default().to_string())
}

/// What the user must see: GPU 0 and nvidiactl as the host's character nodes, usable (ENXIO),
/// the host's libcuda, and a uid map that is not the host's.
fn assert_f15(out: &str, fx: &Fixture, how: &str) -> Result<()> {
    assert!(out.contains("/dev/nvidia0 character special file c3:0"), "{how}: /dev/nvidia0 195:0: {out}");
    assert!(out.contains("/dev/nvidiactl character special file c3:ff"), "{how}: /dev/nvidiactl 195:255: {out}");
    assert!(out.contains("No such device or address"), "{how}: /dev/nvidia0 must open up to the driver (ENXIO): {out}");
    let want = md5(&fx.root.join(&LIB[1..]))?;
    assert!(out.contains(&format!("{want}  {LIB}")), "{how}: the host's libcuda: {out}");
    assert!(out.contains(&format!("0     {HOST_ID}      65536")), "{how}: the container's user namespace: {out}");
    Ok(())
}

/// F15 through actk-runtime: the shim's edits work in runc's user-namespace mode.
#[test]
fn f15_userns_bundle_gets_gpu_0_and_libraries_via_actk_runtime() -> Result<()> {
    if !engines::require_root() {
        return Ok(());
    }
    let Some(fx) = fixture::prepare("nvidia-dgx-h100")? else { return Ok(()) };
    let b = userns_bundle(&["NVIDIA_VISIBLE_DEVICES=0"])?;
    let cfg = ActkConfig::new(&fx.root)?;
    let path = cfg.write()?;
    let id = unique_name("e2e-f15-runtime");
    let o = actk_runtime(&path, &[OsArg::from("run"), "--bundle".into(), b.path().into(), id.as_str().into()]);
    let out = expect_success("actk-runtime run (user namespace)", &o);
    assert_f15(&out, &fx, "actk-runtime")?;
    // The nodes that exist only under the root became bind mounts from there.
    let c: Value = serde_json::from_str(&fs::read_to_string(b.config_path())?)?;
    let mounts = c["mounts"].as_array().context("mounts")?;
    let bind = mounts.iter().find(|m| m["destination"] == "/dev/nvidia0").context("/dev/nvidia0 bind mount")?;
    assert_eq!(bind["source"], fx.root.join("dev/nvidia0").display().to_string(), "{bind}");
    Ok(())
}

/// F15 through actk-hook as Docker's `--gpus` adds it (a prestart hook, host namespaces).
#[test]
fn f15_userns_bundle_gets_gpu_0_and_libraries_via_the_hook() -> Result<()> {
    if !engines::require_root() {
        return Ok(());
    }
    let Some(fx) = fixture::prepare("nvidia-dgx-h100")? else { return Ok(()) };
    let cfg = ActkConfig::new(&fx.root)?;
    let path = cfg.write()?;
    let b = userns_bundle(&["NVIDIA_VISIBLE_DEVICES=0"])?;
    let env = format!("ACTK_CONFIG={}", path.display());
    b.edit(|c| {
        c["hooks"] = json!({"prestart": [{"path": bin("actk-hook").to_string_lossy(), "args": ["nvidia-container-runtime-hook", "prestart"], "env": [env]}]});
    })?;
    fs::set_permissions(b.config_path(), fs::Permissions::from_mode(0o600))?;
    let o = runc(&[OsArg::from("run"), "--bundle".into(), b.path().into(), unique_name("e2e-f15-hook").into()]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "runc run with actk-hook (user namespace): {err}\n{out}");
    assert_f15(&out, &fx, "actk-hook")
}

/// A createContainer hook inside the user namespace cannot read config.json; a hook that only
/// needs the rootfs (enable-cuda-compat) takes it from its working directory, which runc sets to
/// the rootfs; a hook that must plan (the request is in config.json) says which stage to use.
#[test]
fn item1_create_container_hooks_inside_the_user_namespace() -> Result<()> {
    if !engines::require_root() {
        return Ok(());
    }
    let b = userns_bundle(&[])?;
    // A CUDA image with forward-compat libraries of a newer driver (590) than the host's (580).
    let compat = b.rootfs().join("usr/local/cuda/compat");
    fs::create_dir_all(&compat)?;
    fs::write(compat.join("libcuda.so.590.44.01"), b"\x7fELF")?;
    fs::create_dir_all(b.rootfs().join("etc/ld.so.conf.d"))?;
    fs::write(b.rootfs().join("etc/ld.so.cache"), b"")?;
    let o = Command::new("chown").args(["-R", &format!("{HOST_ID}:{HOST_ID}")]).arg(b.rootfs()).output()?;
    expect_success("chown rootfs", &o);
    let hook = bin("actk-hook").to_string_lossy().into_owned();
    b.edit(|c| {
        c["hooks"] = json!({"createContainer": [{"path": hook, "args": ["actk-hook", "enable-cuda-compat", "--host-driver-version", "580.95.05"]}]});
    })?;
    fs::set_permissions(b.config_path(), fs::Permissions::from_mode(0o600))?;
    let o = runc(&[OsArg::from("run"), "--bundle".into(), b.path().into(), unique_name("e2e-userns-cc").into()]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "enable-cuda-compat inside the user namespace: {err}\n{out}");
    let drop_in = fs::read_to_string(b.rootfs().join("etc/ld.so.conf.d/00-compat-actk.conf"))?;
    assert_eq!(drop_in.lines().last(), Some("/usr/local/cuda/compat"), "{drop_in}");

    let planner = userns_bundle(&["NVIDIA_VISIBLE_DEVICES=0"])?;
    planner.edit(|c| {
        c["hooks"] = json!({"createContainer": [{"path": hook, "args": ["actk-hook", "createContainer"]}]})
    })?;
    fs::set_permissions(planner.config_path(), fs::Permissions::from_mode(0o600))?;
    let o =
        runc(&[OsArg::from("run"), "--bundle".into(), planner.path().into(), unique_name("e2e-userns-plan").into()]);
    let (_, err) = text(&o);
    assert!(!o.status.success(), "a planning hook cannot read its request inside the user namespace");
    assert!(err.contains("run `actk-hook prestart` or `createRuntime` instead"), "{err}");
    Ok(())
}

/// podman `--uidmap 0:100000:65536` as root through actk-runtime: the same container, started
/// by a real engine that writes its own bundle.
#[test]
fn item1_podman_uidmap_through_actk_runtime_sees_gpu_0() -> Result<()> {
    if !engines::require_root_and_engines() {
        return Ok(());
    }
    let Some(fx) = fixture::prepare("nvidia-dgx-h100")? else { return Ok(()) };
    let cfg = ActkConfig::new(&fx.root)?;
    let wrapper = cfg.write_wrapper()?;
    let image = engines::podman_busybox_image()?;
    let name = unique_name("e2e-podman-uidmap");
    let runtime = wrapper.display().to_string();
    let o = podman(&[
        "run",
        "--rm",
        "--network",
        "none",
        "--name",
        &name,
        "--runtime",
        &runtime,
        "--uidmap",
        "0:100000:65536",
        "--gidmap",
        "0:100000:65536",
        "-e",
        "NVIDIA_VISIBLE_DEVICES=0",
        image,
        "sh",
        "-c",
        SCRIPT,
    ]);
    let out = expect_success("podman run --uidmap --runtime actk-runtime", &o);
    assert_f15(&out, &fx, "podman --uidmap")
}

/// podman `--uidmap` with actk-hook in a hooks.d directory (podman merges it, runc runs it at
/// prestart in the host namespaces): the hook path of a user-namespaced container.
#[test]
fn item1_podman_uidmap_with_the_hook_from_hooks_d_sees_gpu_0() -> Result<()> {
    if !engines::require_root_and_engines() {
        return Ok(());
    }
    let Some(fx) = fixture::prepare("nvidia-dgx-h100")? else { return Ok(()) };
    let cfg = ActkConfig::new(&fx.root)?;
    let path = cfg.write()?;
    let hooks = tempfile::tempdir()?;
    fs::write(
        hooks.path().join("50-actk.json"),
        json!({"version": "1.0.0",
               "hook": {"path": bin("actk-hook").to_string_lossy(), "args": ["actk-hook", "prestart"], "env": [format!("ACTK_CONFIG={}", path.display())]},
               "when": {"always": true}, "stages": ["prestart"]})
        .to_string(),
    )?;
    let image = engines::podman_busybox_image()?;
    let name = unique_name("e2e-podman-uidmap-hook");
    let hooks_dir = hooks.path().display().to_string();
    let o = podman(&[
        "run",
        "--rm",
        "--network",
        "none",
        "--name",
        &name,
        "--hooks-dir",
        &hooks_dir,
        "--uidmap",
        "0:100000:65536",
        "--gidmap",
        "0:100000:65536",
        "-e",
        "NVIDIA_VISIBLE_DEVICES=0",
        image,
        "sh",
        "-c",
        SCRIPT,
    ]);
    let out = expect_success("podman run --uidmap --hooks-dir (actk-hook)", &o);
    assert_f15(&out, &fx, "podman --uidmap + hook")
}

/// The first ordinary user (uid 1000-59999) with a home directory: rootless podman's user.
fn rootless_user() -> Option<(String, u32)> {
    let passwd = fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        let uid: u32 = f.get(2)?.parse().ok()?;
        ((1000..60000).contains(&uid) && f.get(5).is_some_and(|h| Path::new(h).is_dir()))
            .then(|| (f[0].to_string(), uid))
    })
}

/// Rootless podman (where the machine has an ordinary user to run it): podman runs runc, and so
/// actk-runtime, inside its own user namespace, and the config.json it writes has no user
/// namespace of its own; the container still gets GPU 0, bind-mounted from the host root.
#[test]
fn item1_rootless_podman_through_actk_runtime_sees_gpu_0() -> Result<()> {
    if !engines::require_root_and_engines() {
        return Ok(());
    }
    let Some((user, uid)) = rootless_user() else {
        eprintln!("skipping: no ordinary user (uid 1000-59999 with a home) to run rootless podman as");
        return Ok(());
    };
    let Some(fx) = fixture::prepare("nvidia-dgx-h100")? else { return Ok(()) };
    // The user must reach the fixture, the config and the wrapper.
    if let Some(parent) = fx.root.parent() {
        fs::set_permissions(parent, fs::Permissions::from_mode(0o755))?;
    }
    let dir = tempfile::Builder::new().prefix("actk-rootless-").tempdir()?;
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755))?;
    let none = dir.path().join("none");
    let cfg = dir.path().join("config.toml");
    fs::write(
        &cfg,
        format!(
            "root = {:?}\nruntimes = [\"runc\"]\nspec_dirs = [{none:?}]\nhooks_dirs = [{none:?}]\nprofiles_dir = {none:?}\n",
            fx.root.display().to_string()
        ),
    )?;
    let wrapper = dir.path().join("actk-runtime");
    fs::write(
        &wrapper,
        format!("#!/bin/sh\nACTK_CONFIG='{}' exec '{}' \"$@\"\n", cfg.display(), bin("actk-runtime").display()),
    )?;
    for p in [&cfg, &wrapper] {
        fs::set_permissions(p, fs::Permissions::from_mode(0o755))?;
    }
    let xdg = dir.path().join("xdg");
    fs::create_dir_all(&xdg)?;
    let o = Command::new("chown").arg(format!("{uid}:{uid}")).arg(&xdg).output()?;
    expect_success("chown XDG_RUNTIME_DIR", &o);
    fs::set_permissions(&xdg, fs::Permissions::from_mode(0o700))?;
    let image = format!("actk-rootless-busybox:{}", std::process::id());
    let rootfs = engines::busybox_rootfs()?;
    let script = format!(
        "export XDG_RUNTIME_DIR='{xdg}'; cd /tmp; tar -C '{rootfs}' -c . | podman import - {image} >/dev/null && \
         podman run --rm --runtime '{wrapper}' --network none --ulimit nofile=1024:1024 --ulimit nproc=4096:4096 \
         -e NVIDIA_VISIBLE_DEVICES=0 {image} sh -c \"{script}\"; rc=$?; podman rmi -f {image} >/dev/null 2>&1; exit $rc",
        xdg = xdg.display(),
        rootfs = rootfs.display(),
        wrapper = wrapper.display(),
        script = SCRIPT.replace('"', "\\\"").replace('$', "\\$"),
    );
    let o = Command::new("timeout").args(["180", "su", &user, "-s", "/bin/sh", "-c", &script]).output()?;
    let out = expect_success(&format!("rootless podman as {user} through actk-runtime"), &o);
    assert!(out.contains("/dev/nvidia0 character special file c3:0"), "{out}");
    assert!(out.contains("No such device or address"), "/dev/nvidia0 opens up to the driver: {out}");
    let want = md5(&fx.root.join(&LIB[1..]))?;
    assert!(out.contains(&format!("{want}  {LIB}")), "the host's libcuda: {out}");
    assert!(out.contains(&format!("0       {uid}          1")), "rootless: the user's uid is root: {out}");
    Ok(())
}
