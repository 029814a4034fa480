//! Issue 10, multi-tenant security, end to end with the real runc and podman: every finding of
//! the review as a hostile image or pod, with a host canary (a directory and files outside every
//! rootfs whose listing, contents, modes and inodes must not change), through actk-hook (a
//! prestart hook, as `docker run --gpus` runs it), actk-runtime (the update-ldcache
//! createContainer hook of generated edits) and podman.
//!
//! - F14 / findings 2-3: a generated sweep puts a symlink (to the canary, absolute, through
//!   `/proc/1/root` and `/proc/self/root`, and as a `../` chain) at every path component ldconfig
//!   reads or writes, and racing processes swap those components while containers start.
//! - F13 / finding 1: the trust policy with CRI-shaped config.json files (what containerd writes
//!   for a pod) through actk-runtime and runc, NVIDIA and Neuron.
//! - finding 4: a request over the size limit is refused before it is parsed.
//! - finding 5: an untrusted spec file and hooks.d file are skipped, their hooks never run.
//! - finding 7: a forged OCI state naming a host process is refused by the hook.
//!   (Finding 6, backups, is in crates/actk/tests/runtime_configure.rs.)
//! - issue 29 finding 1: a capability that adds device nodes (`fabric`, `all`) and every other
//!   such input never widen a pod's allocation, through actk-runtime and actk-hook; finding 5:
//!   `capabilities.add: [SYS_ADMIN]` is not privileged under `privileged_means =
//!   "privileged-flag"` (the NRI plugin's side is in nri_containerd.rs).

use actk_testsupport::engines::{
    self, ActkConfig, Bundle, actk_runtime, bin, expect_success, import_image, podman, require_root, runc, text,
    unique_name,
};
use actk_testsupport::fixture::{self, Fixture};
use actk_testsupport::hostcheck::HostGuard;
use serde_json::{Value, json};
use std::ffi::OsString;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

const LIBCUDA: &str = "/usr/lib/x86_64-linux-gnu/libcuda.so.1";

/// A directory and files on the host, outside every rootfs, that hostile images aim at.
struct Canary {
    dir: tempfile::TempDir,
    before: Vec<String>,
}

impl Canary {
    fn new(lib: Option<&Path>) -> Canary {
        let dir = tempfile::Builder::new().prefix("actk-canary-").tempdir().expect("canary dir");
        let p = dir.path();
        fs::set_permissions(p, fs::Permissions::from_mode(0o755)).unwrap();
        fs::write(p.join("secret"), "host secret\n").unwrap();
        fs::set_permissions(p.join("secret"), fs::Permissions::from_mode(0o600)).unwrap();
        fs::create_dir(p.join("sub")).unwrap();
        fs::write(p.join("sub/file"), "host file\n").unwrap();
        if let Some(lib) = lib {
            // A real library: an ld.so.conf listing this directory would put it in a cache.
            fs::copy(lib, p.join("libcanary.so.1")).unwrap();
        }
        let mut c = Canary { dir, before: Vec::new() };
        c.before = c.snapshot();
        c
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn snapshot(&self) -> Vec<String> {
        fn walk(base: &Path, p: &Path, out: &mut Vec<String>) {
            let m = fs::symlink_metadata(p).unwrap();
            let rel = p.strip_prefix(base).unwrap().display().to_string();
            let content = if m.is_file() { fs::read(p).unwrap() } else { Vec::new() };
            let sum =
                content.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ *b as u64).wrapping_mul(0x100_0000_01b3));
            out.push(format!(
                "{rel:?} {:?} mode={:o} ino={} uid={} gid={} size={} fnv={sum:x}",
                m.file_type(),
                m.mode(),
                m.ino(),
                m.uid(),
                m.gid(),
                m.len()
            ));
            if m.is_dir() {
                let mut names: Vec<_> = fs::read_dir(p).unwrap().map(|e| e.unwrap().path()).collect();
                names.sort();
                for n in names {
                    walk(base, &n, out);
                }
            }
        }
        let mut out = Vec::new();
        walk(self.path(), self.path(), &mut out);
        out
    }

    fn assert_unchanged(&self, what: &str) {
        assert_eq!(self.snapshot(), self.before, "{what}: the host canary {} changed", self.path().display());
    }
}

/// A prepared DGX fixture and an actk config for it.
struct Node {
    fixture: Fixture,
    config: ActkConfig,
    config_file: PathBuf,
}

fn node(name: &str, policy: &str) -> Option<Node> {
    if !require_root() {
        return None;
    }
    let fixture = fixture::prepare(name).expect("prepare fixture")?;
    let mut config = ActkConfig::new(&fixture.root).expect("actk config");
    config.extra = policy.to_string();
    let config_file = config.write().expect("write config");
    Some(Node { fixture, config, config_file })
}

/// How a container start reaches actk.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Via {
    /// actk-hook as the prestart hook, called as Docker's `--gpus` calls it, under `runc run`.
    Hook,
    /// actk-runtime in runc's place (the generated update-ldcache createContainer hook).
    Runtime,
}

impl Node {
    /// A busybox bundle with a glibc-style /etc/ld.so.conf (so the ld.so.cache is updated)
    /// running `script` with `env`.
    fn bundle(&self, via: Via, script: &str, env: &[&str]) -> Bundle {
        let b = Bundle::busybox(&["sh", "-c", script], env).expect("bundle");
        fs::write(b.rootfs().join("etc/ld.so.conf"), "include /etc/ld.so.conf.d/*.conf\n").unwrap();
        if via == Via::Hook {
            let hook = bin("actk-hook");
            let cfg = format!("ACTK_CONFIG={}", self.config_file.display());
            b.edit(|c| {
                c["hooks"] = json!({"prestart": [{
                    "path": hook.to_string_lossy(),
                    "args": ["nvidia-container-runtime-hook", "prestart"],
                    "env": [cfg],
                }]});
            })
            .expect("edit config");
        }
        b
    }

    fn start(&self, via: Via, b: &Bundle) -> Output {
        let id = unique_name("sec");
        match via {
            Via::Hook => runc(&[OsString::from("run"), "--bundle".into(), b.path().into(), id.into()]),
            Via::Runtime => {
                actk_runtime(&self.config_file, &[OsString::from("run"), "--bundle".into(), b.path().into(), id.into()])
            }
        }
    }
}

/// Replace `path` (file, directory or link) by a symlink to `target`.
fn plant(path: &Path, target: &str) {
    match fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => fs::remove_dir_all(path).unwrap(),
        Ok(_) => fs::remove_file(path).unwrap(),
        Err(_) => {}
    }
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    symlink(target, path).unwrap();
}

/// The container's ld.so.cache (on the host side of its rootfs), or empty.
fn cache_of(rootfs: &Path) -> Vec<u8> {
    match fs::symlink_metadata(rootfs.join("etc/ld.so.cache")) {
        Ok(m) if m.is_file() => fs::read(rootfs.join("etc/ld.so.cache")).unwrap(),
        _ => Vec::new(),
    }
}

fn contains(hay: &[u8], needle: &str) -> bool {
    hay.windows(needle.len()).any(|w| w == needle.as_bytes())
}

/// Either the container started, or actk refused it with a message of its own.
fn started_or_refused(o: &Output, what: &str) -> bool {
    let (out, err) = text(o);
    if o.status.success() {
        return true;
    }
    assert!(err.contains("actk"), "{what}: the start failed without an actk message:\n{out}\n{err}");
    eprintln!("{what}: refused: {}", err.lines().last().unwrap_or_default());
    false
}

/// The symlink targets of the sweep for canary path `c` (absolute host path).
fn targets(c: &Path) -> Vec<String> {
    let c = c.display().to_string();
    vec![c.clone(), format!("/proc/1/root{c}"), format!("/proc/self/root{c}"), format!("../../../../../../../../..{c}")]
}

/// Every path component ldconfig reads or writes (issue 10's list), and whether a container with
/// a symlink there must still start with the injected libraries in its own cache.
const COMPONENTS: &[(&str, bool)] = &[
    ("etc", false),
    ("etc/ld.so.cache", true),
    ("etc/ld.so.cache~", true),
    ("etc/ld.so.conf", false),
    ("etc/ld.so.conf.d", true),
    ("etc/ld.so.conf.d/00-actk.conf", true),
    ("etc/ld.so.conf.d/image.conf", true),
    ("opt/include", true),
    ("var", true),
    ("var/cache", true),
    ("var/cache/ldconfig", true),
    ("var/cache/ldconfig/aux-cache", true),
    ("usr/lib/x86_64-linux-gnu", false),
];

/// The generated sweep: each component of [`COMPONENTS`] replaced by each target of [`targets`],
/// one container start each, through `via`. Zero escapes: the canary never changes; the
/// container's cache never lists a canary path; where the component does not carry the library
/// directory, the container starts and its own ld.so.cache lists libcuda.
fn sweep(via: Via) {
    let Some(n) = node("nvidia-dgx-h100", "") else { return };
    let guard = HostGuard::new(&format!("symlink sweep via {via:?}")).unwrap();
    let canary = Canary::new(Some(&n.fixture.path(LIBCUDA)));
    let mut started = 0;
    let mut runs = 0;
    for (component, must_cache) in COMPONENTS {
        for target in targets(canary.path()) {
            let what = format!("{via:?}: /{component} -> {target}");
            let b = n.bundle(via, "true", &["NVIDIA_VISIBLE_DEVICES=0"]);
            let rf = b.rootfs();
            // ld.so.conf names the canary through /proc/1/root (finding 3) and an include dir.
            fs::write(
                rf.join("etc/ld.so.conf"),
                format!(
                    "/proc/1/root{}\ninclude /etc/ld.so.conf.d/*.conf /opt/include/*.conf\n",
                    canary.path().display()
                ),
            )
            .unwrap();
            fs::create_dir_all(rf.join("etc/ld.so.conf.d")).unwrap();
            fs::write(rf.join("etc/ld.so.conf.d/image.conf"), "/usr/local/lib\n").unwrap();
            fs::create_dir_all(rf.join("opt/include")).unwrap();
            fs::create_dir_all(rf.join("var/cache/ldconfig")).unwrap();
            plant(&rf.join(component), &target);
            let o = n.start(via, &b);
            runs += 1;
            let ok = started_or_refused(&o, &what);
            started += ok as usize;
            canary.assert_unchanged(&what);
            let cache = cache_of(&rf);
            assert!(!contains(&cache, "actk-canary"), "{what}: the container's cache lists a host path");
            if *must_cache {
                assert!(ok, "{what}: the container must start:\n{}", text(&o).1);
                assert!(contains(&cache, LIBCUDA), "{what}: the container's own ld.so.cache lacks {LIBCUDA}");
            }
        }
    }
    eprintln!("sweep via {via:?}: {started}/{runs} containers started, 0 escapes");
    guard.finish().unwrap();
}

#[test]
fn f14_symlink_sweep_over_ldconfig_paths_through_actk_hook() {
    sweep(Via::Hook);
}

#[test]
fn f14_symlink_sweep_over_ldconfig_paths_through_actk_runtime() {
    sweep(Via::Runtime);
}

/// Finding 3: a second process that can write the rootfs swaps each component for a symlink
/// (to the canary, absolute and through /proc/1/root) and back, as fast as it can, while
/// containers start. Zero escapes over all starts.
fn race(via: Via, starts_per_component: usize) {
    let Some(n) = node("nvidia-dgx-h100", "") else { return };
    let guard = HostGuard::new(&format!("racing swaps via {via:?}")).unwrap();
    let canary = Canary::new(None);
    let components = ["etc", "etc/ld.so.cache", "etc/ld.so.cache~", "etc/ld.so.conf.d", "var/cache"];
    let (mut started, mut runs) = (0, 0);
    for component in components {
        for i in 0..starts_per_component {
            let b = n.bundle(via, "true", &["NVIDIA_VISIBLE_DEVICES=0"]);
            let rf = b.rootfs();
            fs::create_dir_all(rf.join("var/cache/ldconfig")).unwrap();
            fs::create_dir_all(rf.join("etc/ld.so.conf.d")).unwrap();
            // Existing files, so the racer has something to swap: the cache and ldconfig's temporary file.
            fs::write(rf.join("etc/ld.so.cache"), b"").unwrap();
            fs::write(rf.join("etc/ld.so.cache~"), b"").unwrap();
            let real = rf.join(component);
            let aside = rf.join(format!("{component}.real"));
            let link = rf.join(format!("{component}.link"));
            let target = targets(canary.path())[i % 2].clone();
            let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let racer = {
                let (stop, real, aside, link) = (stop.clone(), real.clone(), aside.clone(), link.clone());
                std::thread::spawn(move || {
                    let mut swaps = 0u64;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let _ = fs::remove_file(&link);
                        let _ = symlink(&target, &link);
                        if fs::rename(&real, &aside).is_ok() {
                            let _ = fs::rename(&link, &real);
                            std::thread::yield_now();
                            let _ = fs::rename(&real, &link);
                            let _ = fs::rename(&aside, &real);
                            swaps += 1;
                        }
                        std::thread::yield_now();
                    }
                    swaps
                })
            };
            let o = n.start(via, &b);
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            let swaps = racer.join().unwrap();
            runs += 1;
            let what = format!("{via:?}: racing /{component} (start {i}, {swaps} swaps)");
            assert!(swaps > 0, "{what}: the racer never swapped");
            let (_, err) = text(&o);
            if o.status.success() {
                started += 1;
            } else {
                // runc itself, or actk, may find a component swapped away: a failed start, never an escape.
                eprintln!("{what}: failed: {}", err.lines().last().unwrap_or_default());
            }
            canary.assert_unchanged(&what);
        }
    }
    eprintln!("racing swaps via {via:?}: {started}/{runs} containers started, 0 escapes");
    guard.finish().unwrap();
}

#[test]
fn racing_swaps_of_ldconfig_paths_through_actk_runtime_never_escape() {
    race(Via::Runtime, 8);
}

#[test]
fn racing_swaps_of_ldconfig_paths_through_actk_hook_never_escape() {
    race(Via::Hook, 4);
}

/// F14 itself through podman: an image whose /var/cache is a symlink to /proc/1/root/<host dir>,
/// asking for a GPU, with actk-runtime as podman's runtime and with actk-hook from a hooks dir.
#[test]
fn f14_podman_image_with_var_cache_through_proc_1_root() {
    if !engines::require_root_and_engines() {
        return;
    }
    let Some(n) = node("nvidia-dgx-h100", "") else { return };
    let guard = HostGuard::new("F14 podman").unwrap();
    let canary = Canary::new(None);
    // The hostile image: busybox, a glibc-style ld.so.conf, /var/cache -> /proc/1/root/<canary>.
    let rootfs = tempfile::tempdir().unwrap();
    let img_root = rootfs.path().join("r");
    engines::copy_tree(&engines::busybox_rootfs().unwrap(), &img_root).unwrap();
    fs::write(img_root.join("etc/ld.so.conf"), "include /etc/ld.so.conf.d/*.conf\n").unwrap();
    plant(&img_root.join("var/cache"), &format!("/proc/1/root{}", canary.path().display()));
    let image = format!("localhost/actk-e2e-f14:{}", unique_name("t"));
    import_image("podman", &img_root, &image).unwrap();

    let wrapper = n.config.write_wrapper().unwrap();
    let hooks = tempfile::tempdir().unwrap();
    fs::write(
        hooks.path().join("50-actk.json"),
        json!({"version": "1.0.0",
               "hook": {"path": bin("actk-hook").to_string_lossy(), "args": ["actk-hook", "prestart"],
                        "env": [format!("ACTK_CONFIG={}", n.config_file.display())]},
               "when": {"always": true}, "stages": ["prestart"]})
        .to_string(),
    )
    .unwrap();
    let script = format!("grep -q {LIBCUDA} /etc/ld.so.cache && echo cache-lists-libcuda; ls /dev");
    let runtime = wrapper.display().to_string();
    let hooks_dir = hooks.path().display().to_string();
    for (what, extra) in [
        ("podman --runtime actk-runtime", vec!["--runtime", runtime.as_str()]),
        ("podman --hooks-dir actk-hook", vec!["--hooks-dir", hooks_dir.as_str()]),
    ] {
        let mut args = vec!["run", "--rm", "--network", "none", "-e", "NVIDIA_VISIBLE_DEVICES=0"];
        args.extend(extra);
        args.extend([image.as_str(), "sh", "-c", script.as_str()]);
        let out = expect_success(what, &podman(&args));
        assert!(out.contains("cache-lists-libcuda"), "{what}: the container's ld.so.cache lacks libcuda:\n{out}");
        assert!(out.lines().any(|l| l.trim() == "nvidia0"), "{what}: no /dev/nvidia0:\n{out}");
        canary.assert_unchanged(what);
    }
    let _ = podman(&["rmi", "-f", image.as_str()]);
    guard.finish().unwrap();
}

/// The capabilities containerd gives a pod's container by default (no CAP_SYS_ADMIN).
const CRI_CAPS: &[&str] = &[
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_MKNOD",
    "CAP_NET_RAW",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
];

/// The node policy the Kubernetes node setup writes.
const K8S_POLICY: &str = "[policy]\nenv_requests = \"privileged\"\nannotation_requests = \"privileged\"\nmount_requests = \"always\"\non_refused = \"warn\"\nprivileged_means = \"privileged-flag\"\n";

/// Turns a bundle's config.json into what containerd's CRI plugin writes for a pod's container:
/// the image's env, containerd's default capabilities (for `privileged: true` also
/// CAP_SYS_ADMIN and every device allowed, as containerd's `WithPrivileged` and
/// `WithAllDevicesAllowed` write it), the kubelet's mounts (hosts file, termination log) and the
/// CRI annotations; `listed` are the device list mounts the kubelet adds for the device
/// plugin's volume-mounts answer (`<kind>/<index>`), exactly as containerd writes a kubelet mount.
fn cri_shape(b: &Bundle, kubelet: &Path, listed: &[&str], privileged: bool) {
    cri_shape_with(b, kubelet, listed, if privileged { Privilege::PrivilegedTrue } else { Privilege::None });
}

/// How privileged a CRI pod's container is.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Privilege {
    None,
    /// `capabilities.add: [SYS_ADMIN]` without `privileged`: the capability, the ordinary
    /// device cgroup.
    AddSysAdmin,
    /// `privileged: true`.
    PrivilegedTrue,
}

fn cri_shape_with(b: &Bundle, kubelet: &Path, listed: &[&str], privilege: Privilege) {
    fs::write(kubelet.join("etc-hosts"), "127.0.0.1 localhost\n").unwrap();
    fs::write(kubelet.join("termination-log"), "").unwrap();
    let mut caps: Vec<&str> = CRI_CAPS.to_vec();
    if privilege != Privilege::None {
        caps.push("CAP_SYS_ADMIN");
    }
    b.edit(|c| {
        c["process"]["capabilities"] = json!({"bounding": caps, "effective": caps, "permitted": caps});
        if privilege == Privilege::PrivilegedTrue {
            c["linux"]["resources"]["devices"] = json!([{"allow": true, "access": "rwm"}]);
        }
        let mounts = c["mounts"].as_array_mut().unwrap();
        mounts.push(json!({"destination": "/etc/hosts", "type": "bind",
            "source": kubelet.join("etc-hosts"), "options": ["rbind", "rprivate", "rw"]}));
        mounts.push(json!({"destination": "/dev/termination-log", "type": "bind",
            "source": kubelet.join("termination-log"), "options": ["rbind", "rprivate", "rw"]}));
        for l in listed {
            mounts.push(json!({"destination": format!("/var/run/actk/devices/{l}"), "type": "bind",
                "source": "/dev/null", "options": ["rbind", "rprivate", "ro"]}));
        }
        c["annotations"] = json!({
            "io.kubernetes.cri.container-type": "container",
            "io.kubernetes.cri.container-name": "cuda",
            "io.kubernetes.cri.sandbox-id": "4b1f3a0c5d7e",
            "io.kubernetes.cri.sandbox-name": "trainer-0",
            "io.kubernetes.cri.sandbox-namespace": "tenant-a",
            "io.kubernetes.cri.image-name": "docker.io/nvidia/cuda:12.4.1-base-ubuntu22.04",
        });
    })
    .unwrap();
}

/// Starts a CRI-shaped container through actk-runtime + runc (with runc's `--log` as containerd
/// gives it) and returns (stdout, stderr, runc log).
fn cri_run(n: &Node, b: &Bundle) -> (Output, String) {
    let log = b.path().join("log.json");
    let id = unique_name("cri");
    let o = actk_runtime(
        &n.config_file,
        &[
            OsString::from("--log"),
            log.clone().into(),
            "--log-format".into(),
            "json".into(),
            "run".into(),
            "--bundle".into(),
            b.path().into(),
            id.into(),
        ],
    );
    (o, fs::read_to_string(&log).unwrap_or_default())
}

fn dev_nodes(out: &str, prefix: &str) -> Vec<String> {
    let mut v: Vec<String> = out.lines().map(str::trim).filter(|l| l.starts_with(prefix)).map(str::to_string).collect();
    v.sort();
    v
}

fn gpus(out: &str) -> Vec<String> {
    dev_nodes(out, "nvidia").into_iter().filter(|n| n.len() > 6 && n[6..].chars().all(|c| c.is_ascii_digit())).collect()
}

/// Field case F13 and finding 1 on a node set up for Kubernetes: only what the kubelet
/// allocated; the image's NVIDIA_VISIBLE_DEVICES=all is refused and the refusal is logged naming
/// the policy key (stderr and the runc log containerd keeps).
#[test]
fn f13_cri_pod_allocated_gpu_0_with_visible_devices_all_sees_only_gpu_0() {
    let Some(n) = node("nvidia-dgx-h100", K8S_POLICY) else { return };
    let kubelet = tempfile::tempdir().unwrap();
    let script = "ls -1 /dev; ls /usr/lib/x86_64-linux-gnu 2>/dev/null; true";
    let env = ["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=compute,utility"];

    // The volume-mounts strategy: the device list is the allocation, actk-runtime serves it.
    let b = Bundle::busybox(&["sh", "-c", script], &env).unwrap();
    cri_shape(&b, kubelet.path(), &["nvidia.com/gpu/0"], false);
    let (o, log) = cri_run(&n, &b);
    let out = expect_success("CRI pod allocated GPU 0 (device list)", &o);
    assert_eq!(gpus(&out), ["nvidia0"], "{out}");
    assert!(out.contains("libcuda.so.1"), "the allocated GPU comes with its driver libraries:\n{out}");
    let err = text(&o).1;
    for (what, text) in [("stderr", &err), ("runc log", &log)] {
        assert!(
            text.contains("NVIDIA_VISIBLE_DEVICES=all: refused by the node's trust policy (policy.env_requests = \\\"privileged\\\"")
                || text.contains("NVIDIA_VISIBLE_DEVICES=all: refused by the node's trust policy (policy.env_requests = \"privileged\""),
            "{what} must log the refusal naming the policy key:\n{text}"
        );
    }
    assert!(log.contains("\"level\":\"warning\""), "{log}");

    // The cdi-cri strategy: containerd already applied nvidia.com/gpu=0 to the spec.
    let b = Bundle::busybox(&["sh", "-c", script], &env).unwrap();
    cri_shape(&b, kubelet.path(), &[], false);
    b.edit(|c| {
        c["linux"]["devices"] = json!([{"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0, "fileMode": 438, "uid": 0, "gid": 0}]);
        c["linux"]["resources"]["devices"].as_array_mut().unwrap().push(json!({"allow": true, "type": "c", "major": 195, "minor": 0, "access": "rwm"}));
    })
    .unwrap();
    let (o, _) = cri_run(&n, &b);
    let out = expect_success("CRI pod with nvidia.com/gpu=0 applied by containerd", &o);
    assert_eq!(gpus(&out), ["nvidia0"], "{out}");
}

#[test]
fn cri_pod_without_a_request_gets_nothing_from_env_or_annotations() {
    let Some(n) = node("nvidia-dgx-h100", K8S_POLICY) else { return };
    // A spec for the annotation to name.
    let o = engines::actk(
        Some(&n.config_file),
        &["cdi".as_ref(), "generate".as_ref(), "--output".as_ref(), n.config.spec_dir().as_os_str()],
    );
    expect_success("actk cdi generate", &o);
    let kubelet = tempfile::tempdir().unwrap();
    let script = "ls -1 /dev; ls /usr/lib/x86_64-linux-gnu 2>/dev/null; true";
    for (what, env, annotation) in [
        ("env all", vec!["NVIDIA_VISIBLE_DEVICES=all"], None),
        ("env 0,1", vec!["NVIDIA_VISIBLE_DEVICES=0,1"], None),
        // "none" with every capability got every driver library (finding 1).
        ("env none + all capabilities", vec!["NVIDIA_VISIBLE_DEVICES=none", "NVIDIA_DRIVER_CAPABILITIES=all"], None),
        ("annotation", vec![], Some("nvidia.com/gpu=all")),
    ] {
        let b = Bundle::busybox(&["sh", "-c", script], &env).unwrap();
        cri_shape(&b, kubelet.path(), &[], false);
        if let Some(a) = annotation {
            b.edit(|c| c["annotations"]["cdi.k8s.io/tenant"] = Value::from(a)).unwrap();
        }
        let (o, log) = cri_run(&n, &b);
        let out = expect_success(what, &o);
        assert!(dev_nodes(&out, "nvidia").is_empty(), "{what}: NVIDIA nodes in a pod without a request:\n{out}");
        assert!(!out.contains("libcuda") && !out.contains("libnvidia"), "{what}: driver libraries:\n{out}");
        let key = if annotation.is_some() { "policy.annotation_requests" } else { "policy.env_requests" };
        assert!(log.contains(key), "{what}: the runc log must name {key}:\n{log}");
    }
    // The same pod, privileged (CAP_SYS_ADMIN): env requests are honoured.
    let b = Bundle::busybox(&["sh", "-c", script], &["NVIDIA_VISIBLE_DEVICES=all"]).unwrap();
    cri_shape(&b, kubelet.path(), &[], true);
    let (o, _) = cri_run(&n, &b);
    let out = expect_success("privileged pod, env all", &o);
    assert_eq!(gpus(&out).len(), 8, "{out}");
}

#[test]
fn cri_neuron_pod_allocated_device_3_with_visible_devices_all_sees_only_neuron3() {
    let Some(n) = node("aws-inf2-48xlarge", K8S_POLICY) else { return };
    let kubelet = tempfile::tempdir().unwrap();
    let b = Bundle::busybox(&["ls", "-1", "/dev"], &["AWS_NEURON_VISIBLE_DEVICES=ALL"]).unwrap();
    cri_shape(&b, kubelet.path(), &["aws.amazon.com/neuron/3"], false);
    let (o, log) = cri_run(&n, &b);
    let out = expect_success("neuron pod allocated device 3", &o);
    assert_eq!(dev_nodes(&out, "neuron"), ["neuron3"], "{out}");
    assert!(log.contains("AWS_NEURON_VISIBLE_DEVICES=ALL: refused"), "{log}");
    let b = Bundle::busybox(&["ls", "-1", "/dev"], &["AWS_NEURON_VISIBLE_DEVICES=ALL"]).unwrap();
    cri_shape(&b, kubelet.path(), &[], false);
    let (o, _) = cri_run(&n, &b);
    let out = expect_success("neuron pod without a request", &o);
    assert!(dev_nodes(&out, "neuron").is_empty(), "{out}");
}

/// `on_refused = "fail"`: the refused request fails the container, naming the key; config.json
/// is untouched.
#[test]
fn refused_request_fails_the_container_naming_the_policy_key() {
    let fail = K8S_POLICY.replace("on_refused = \"warn\"", "on_refused = \"fail\"");
    let Some(n) = node("nvidia-dgx-h100", &fail) else { return };
    let kubelet = tempfile::tempdir().unwrap();
    let b = Bundle::busybox(&["echo", "container-ran"], &["NVIDIA_VISIBLE_DEVICES=all"]).unwrap();
    cri_shape(&b, kubelet.path(), &[], false);
    let before = fs::read(b.config_path()).unwrap();
    let (o, log) = cri_run(&n, &b);
    let (out, err) = text(&o);
    assert!(!o.status.success() && !out.contains("container-ran"), "{out}\n{err}");
    assert!(err.contains("policy.env_requests = \"privileged\"") && err.contains("on_refused"), "{err}");
    assert!(log.contains("\"level\":\"error\"") && log.contains("policy.env_requests"), "{log}");
    assert_eq!(fs::read(b.config_path()).unwrap(), before);
}

/// Finding 4: a request over the limit fails at once with the limit in the message.
#[test]
fn oversized_request_is_refused_with_the_limit() {
    let Some(n) = node("nvidia-dgx-h100", "") else { return };
    let value = format!("NVIDIA_VISIBLE_DEVICES={}", "nvidia.com/gpu=0,".repeat(70_000));
    let b = Bundle::busybox(&["echo", "container-ran"], &[&value]).unwrap();
    let o = n.start(Via::Runtime, &b);
    let (out, err) = text(&o);
    assert!(!o.status.success() && !out.contains("container-ran"), "{out}");
    assert!(err.contains("a request may be at most 1048576 bytes (1 MiB)"), "{err}");
    assert!(err.len() < 2000, "the message must not carry the value ({} bytes)", err.len());
}

/// Finding 5: a spec file owned by nobody in a world-writable spec directory (higher priority
/// than the real one) and a group-writable hooks.d file are skipped with a warning naming them;
/// their hooks never run, the real GPU spec serves the request.
#[test]
fn untrusted_spec_and_hooks_files_are_skipped_and_their_hooks_never_run() {
    let Some(mut n) = node("nvidia-dgx-h100", "") else { return };
    let canary = Canary::new(None);
    let marker = canary.path().join("sub").join("hook-ran");
    let real = n.config.spec_dir().to_path_buf();
    let out = engines::actk(
        Some(&n.config_file),
        &["cdi".as_ref(), "generate".as_ref(), "--output".as_ref(), real.as_os_str()],
    );
    expect_success("actk cdi generate", &out);
    let open = n.config.dir().join("open-cdi");
    fs::create_dir(&open).unwrap();
    fs::set_permissions(&open, fs::Permissions::from_mode(0o1777)).unwrap();
    let touch = json!({"hookName": "createRuntime", "path": "/bin/sh", "args": ["sh", "-c", format!("touch {}", marker.display())]});
    let evil = open.join("evil.json");
    fs::write(&evil, json!({"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu",
        "devices": [{"name": "0", "containerEdits": {"deviceNodes": [{"path": "/dev/evil0", "type": "c", "major": 1, "minor": 5}]}}],
        "containerEdits": {"hooks": [touch]}}).to_string()).unwrap();
    std::os::unix::fs::chown(&evil, Some(65534), Some(65534)).unwrap();
    let hook_file = n.config.hooks_dir().join("50-evil.json");
    fs::write(&hook_file, json!({"version": "1.0.0", "hook": {"path": "/bin/sh", "args": ["sh", "-c", format!("touch {}", marker.display())]},
        "when": {"always": true}, "stages": ["prestart"]}).to_string()).unwrap();
    fs::set_permissions(&hook_file, fs::Permissions::from_mode(0o664)).unwrap();
    n.config.spec_dirs.push(open.clone());
    n.config_file = n.config.write().unwrap();
    let b = n.bundle(Via::Runtime, "ls -1 /dev", &["NVIDIA_VISIBLE_DEVICES=0"]);
    let o = n.start(Via::Runtime, &b);
    let out = expect_success("request with an untrusted spec around", &o);
    let err = text(&o).1;
    assert!(out.lines().any(|l| l.trim() == "nvidia0") && !out.contains("evil0"), "{out}");
    assert!(!marker.exists(), "an untrusted file's hook ran");
    assert!(
        err.contains(&format!(
            "CDI spec file skipped: {}: not trusted: the directory is writable by group and others (mode 1777)",
            open.display()
        )),
        "{err}"
    );
    assert!(
        err.contains("hooks file skipped: ")
            && err.contains("50-evil.json: not trusted: the file is writable by its group"),
        "{err}"
    );
    // The file itself, once its directory is fixed.
    fs::set_permissions(&open, fs::Permissions::from_mode(0o755)).unwrap();
    let b = n.bundle(Via::Runtime, "ls -1 /dev", &["NVIDIA_VISIBLE_DEVICES=0"]);
    let o = n.start(Via::Runtime, &b);
    let out = expect_success("request with an untrusted spec file", &o);
    let err = text(&o).1;
    assert!(out.lines().any(|l| l.trim() == "nvidia0") && !out.contains("evil0"), "{out}");
    assert!(!marker.exists(), "an untrusted file's hook ran");
    assert!(err.contains("evil.json: not trusted: the file is owned by uid 65534, not root"), "{err}");
    fs::remove_file(&evil).unwrap();
    canary.assert_unchanged("untrusted spec and hooks files");
}

/// Finding 7: given an OCI state whose pid is a host process, the hook attaches nothing in the
/// host's mount namespace and writes no device rule for that process.
#[test]
fn hook_refuses_a_forged_state_naming_a_host_process() {
    let Some(n) = node("nvidia-dgx-h100", "") else { return };
    let guard = HostGuard::new("forged OCI state").unwrap();
    let b = n.bundle(Via::Hook, "true", &["NVIDIA_VISIBLE_DEVICES=all"]);
    let mut host = Command::new("sleep").arg("60").spawn().unwrap();
    let pid = host.id();
    let devices = |pid: u32| -> String {
        let cg = fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
        let path = cg.lines().find_map(|l| l.split_once(":devices:").map(|(_, p)| p.to_string())).unwrap_or_default();
        fs::read_to_string(format!("/sys/fs/cgroup/devices{path}/devices.list")).unwrap_or_default()
    };
    let before = devices(pid);
    let state = json!({"ociVersion": "1.0.2", "id": "forged", "status": "creating", "pid": pid, "bundle": b.path()});
    let mut child = Command::new(bin("actk-hook"))
        .arg("prestart")
        .env("ACTK_CONFIG", &n.config_file)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), state.to_string().as_bytes()).unwrap();
    let o = child.wait_with_output().unwrap();
    let _ = host.kill();
    let _ = host.wait();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "the hook accepted a host process: {err}");
    assert!(err.contains(&format!("pid {pid} of the OCI state shares this hook's own mount namespace")), "{err}");
    assert_eq!(devices(pid), before, "device rules were written for the host process");
    guard.finish().unwrap();
}

/// The cache actk writes (instead of ldconfig) is the one the container's own glibc loader uses:
/// a program linked against a library that lives only in a directory no loader searches by
/// default (/opt/actk-probe/lib), mounted by a CDI spec whose update-ldcache hook adds that
/// directory, runs in a Debian glibc container; the image's own `ldconfig -p` lists it too.
#[test]
fn glibc_loader_finds_a_library_through_the_cache_actk_wrote() {
    if !require_root() {
        return;
    }
    let host = tempfile::tempdir().unwrap();
    let h = host.path();
    fs::write(h.join("probe.c"), "int actk_probe(void) { return 7; }\n").unwrap();
    fs::write(
        h.join("main.c"),
        "#include <stdio.h>\nint actk_probe(void);\nint main(void) { printf(\"actk_probe=%d\\n\", actk_probe()); return 0; }\n",
    )
    .unwrap();
    let gcc = |args: &[&str]| Command::new("gcc").current_dir(h).args(args).status().is_ok_and(|s| s.success());
    assert!(
        gcc(&["-shared", "-fPIC", "-Wl,-soname,libactkprobe.so.1", "-o", "libactkprobe.so.1", "probe.c"])
            && gcc(&["-o", "actk-probe", "main.c", "-L.", "-l:libactkprobe.so.1"]),
        "gcc cannot build the probe (scripts/install-deps.sh installs gcc)"
    );
    let cfg = ActkConfig::new(h).unwrap();
    let mount = |src: &str, dst: &str| json!({"hostPath": h.join(src), "containerPath": dst, "options": ["ro", "nosuid", "nodev", "bind"]});
    fs::write(
        cfg.spec_dir().join("probe.json"),
        json!({"cdiVersion": "0.5.0", "kind": "example.com/probe", "devices": [{"name": "0", "containerEdits": {
            "mounts": [mount("libactkprobe.so.1", "/opt/actk-probe/lib/libactkprobe.so.1"), mount("actk-probe", "/usr/local/bin/actk-probe")],
            "hooks": [{"hookName": "createContainer", "path": bin("actk-hook").to_string_lossy(),
                       "args": ["actk-hook", "update-ldcache", "--folder", "/opt/actk-probe/lib"], "env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"]}]}}]})
        .to_string(),
    )
    .unwrap();
    let cfg_file = cfg.write().unwrap();
    let b = Bundle::glibc(&["sh", "-c", "/usr/local/bin/actk-probe; /sbin/ldconfig -p | grep actkprobe"], &[]).unwrap();
    b.edit(|c| c["annotations"] = json!({"cdi.k8s.io/probe": "example.com/probe=0"})).unwrap();
    let id = unique_name("ldcache-loader");
    let o = actk_runtime(&cfg_file, &[OsString::from("run"), "--bundle".into(), b.path().into(), id.into()]);
    let out = expect_success("glibc container with the probe library", &o);
    assert!(out.contains("actk_probe=7"), "the loader did not find the library through the cache:\n{out}");
    assert!(
        out.contains("libactkprobe.so.1 (libc6,x86-64) => /opt/actk-probe/lib/libactkprobe.so.1"),
        "the image's ldconfig -p does not list it:\n{out}"
    );
}

/// The trust policy through actk-hook (the prestart hook `docker run --gpus` uses): the same
/// planning path, so the same answer as actk-runtime for a CRI-shaped pod (F13).
#[test]
fn f13_policy_through_actk_hook_serves_only_the_device_list() {
    let Some(n) = node("nvidia-dgx-h100", K8S_POLICY) else { return };
    let kubelet = tempfile::tempdir().unwrap();
    for (what, listed, want) in
        [("allocated GPU 2", vec!["nvidia.com/gpu/2"], vec!["nvidia2"]), ("no request", vec![], vec![])]
    {
        let b = n.bundle(Via::Hook, "ls -1 /dev", &["NVIDIA_VISIBLE_DEVICES=all"]);
        let hooks = b.config().unwrap()["hooks"].clone();
        cri_shape(&b, kubelet.path(), &listed, false);
        b.edit(|c| c["hooks"] = hooks).unwrap();
        let o = n.start(Via::Hook, &b);
        let out = expect_success(&format!("hook path, {what}"), &o);
        assert_eq!(gpus(&out), want, "{what}:\n{out}");
    }
}

/// The trust policy through podman with actk-runtime: `-e NVIDIA_VISIBLE_DEVICES=all` in an
/// unprivileged container gets nothing; a device list entry given as a podman mount of /dev/null
/// (what the kubelet does for the device plugin) gets exactly that GPU; `--privileged` may ask.
#[test]
fn policy_through_podman_with_actk_runtime() {
    if !engines::require_root_and_engines() {
        return;
    }
    let Some(n) = node("nvidia-dgx-h100", K8S_POLICY) else { return };
    let wrapper = n.config.write_wrapper().unwrap();
    let image = engines::podman_busybox_image().unwrap();
    let runtime = wrapper.display().to_string();
    let list = "type=bind,src=/dev/null,dst=/var/run/actk/devices/nvidia.com/gpu/1,ro";
    for (what, extra, want) in [
        ("env all", vec![], 0),
        ("device list entry for GPU 1", vec!["--mount", list], 1),
        ("privileged, env all", vec!["--privileged"], 8),
    ] {
        let mut args =
            vec!["run", "--rm", "--network", "none", "--runtime", runtime.as_str(), "-e", "NVIDIA_VISIBLE_DEVICES=all"];
        args.extend(extra);
        args.extend([image, "ls", "-1", "/dev"]);
        let out = expect_success(what, &podman(&args));
        let g = gpus(&out);
        assert_eq!(g.len(), want, "{what}: {g:?}\n{out}");
        if want == 1 {
            assert_eq!(g, ["nvidia1"], "{what}");
        }
    }
}

/// Issue 13 item 1: under a user namespace the update-ldcache hook (a createContainer hook, so it
/// runs inside the container's namespaces) refused "/sbin/ldconfig is not owned by root": host
/// root shows as the overflow uid there. No ldconfig is run now and nothing is judged through the
/// namespace: a bundle mapping uid/gid 0 to 100000 starts through actk-runtime with the driver
/// libraries in its own ld.so.cache.
#[test]
fn update_ldcache_hook_works_under_a_user_namespace() {
    let Some(n) = node("nvidia-dgx-h100", "") else { return };
    let canary = Canary::new(None);
    // Only libraries and the update-ldcache hook: device nodes under a user namespace are runc's
    // bind mounts of host nodes, which the fixture's are not (issue 13 covers those).
    fs::write(
        n.config.spec_dir().join("lib.json"),
        json!({"cdiVersion": "0.5.0", "kind": "example.com/lib", "devices": [{"name": "0", "containerEdits": {
            "mounts": [{"hostPath": n.fixture.path(LIBCUDA), "containerPath": LIBCUDA, "options": ["ro", "nosuid", "nodev", "bind"]}],
            "hooks": [{"hookName": "createContainer", "path": bin("actk-hook").to_string_lossy(),
                       "args": ["actk-hook", "update-ldcache", "--folder", "/usr/lib/x86_64-linux-gnu"]}]}}]})
        .to_string(),
    )
    .unwrap();
    let b = n.bundle(Via::Runtime, "true", &[]);
    b.edit(|c| c["annotations"] = json!({"cdi.k8s.io/lib": "example.com/lib=0"})).unwrap();
    plant(&b.rootfs().join("var/cache"), &format!("/proc/1/root{}", canary.path().display()));
    let st = Command::new("chown").args(["-R", "-h", "100000:100000"]).arg(b.rootfs()).status().unwrap();
    assert!(st.success());
    b.edit(|c| {
        c["linux"]["namespaces"].as_array_mut().unwrap().push(json!({"type": "user"}));
        c["linux"]["uidMappings"] = json!([{"containerID": 0, "hostID": 100000, "size": 65536}]);
        c["linux"]["gidMappings"] = json!([{"containerID": 0, "hostID": 100000, "size": 65536}]);
        // A user namespace cannot mount a new sysfs over the host's: runc's usual rbind instead.
        for m in c["mounts"].as_array_mut().unwrap() {
            if m["destination"] == "/sys" {
                *m = json!({"destination": "/sys", "type": "none", "source": "/sys", "options": ["rbind", "nosuid", "noexec", "nodev", "ro"]});
            }
        }
    })
    .unwrap();
    let o = n.start(Via::Runtime, &b);
    expect_success("user-namespace bundle through actk-runtime", &o);
    let cache = cache_of(&b.rootfs());
    assert!(contains(&cache, LIBCUDA), "the container's ld.so.cache lacks {LIBCUDA}");
    let m = fs::metadata(b.rootfs().join("etc/ld.so.cache")).unwrap();
    assert_eq!(m.uid(), 100_000, "written as the container's root, inside its namespace");
    canary.assert_unchanged("user namespace");
}

/// A CRI-shaped pod allocated GPU 0 (the device list) through `via`, running `script`; returns
/// the container's output and what actk said (actk-runtime's stderr and runc log; for the hook,
/// runc's output).
fn cri_pod(
    n: &Node,
    via: Via,
    script: &str,
    env: &[&str],
    annotation: Option<&str>,
    privilege: Privilege,
) -> (String, String) {
    let kubelet = tempfile::tempdir().unwrap();
    let b = n.bundle(via, script, env);
    let hooks = b.config().unwrap()["hooks"].clone();
    cri_shape_with(&b, kubelet.path(), &["nvidia.com/gpu/0"], privilege);
    b.edit(|c| {
        c["hooks"] = hooks;
        if let Some(a) = annotation {
            c["annotations"]["cdi.k8s.io/tenant"] = Value::from(a);
        }
    })
    .unwrap();
    let (o, log) = match via {
        Via::Runtime => cri_run(n, &b),
        Via::Hook => (n.start(Via::Hook, &b), String::new()),
    };
    let what = format!("{via:?} {env:?} {annotation:?} {privilege:?}");
    let out = expect_success(&what, &o);
    (out, format!("{}\n{log}", text(&o).1))
}

fn nvswitch_nodes(out: &str) -> Vec<String> {
    dev_nodes(out, "nvidia-nvswitch")
}

/// Issue 29 finding 1 with the real runc, through actk-runtime and through actk-hook, on the
/// DGX H100 fixture (8 GPUs, 4 NVSwitch nodes and nvidia-nvswitchctl, the MIG management
/// nodes) set up as a Kubernetes node: a pod allocated GPU 0 whose env asks for the `fabric`
/// capability, `all` capabilities, and every other input that adds nodes (selection, MIG
/// management, IMEX, a CDI annotation) sees GPU 0 and its control nodes only; the driver files
/// its capabilities choose stay; the refusal is logged naming the policy key. A
/// `capabilities.add: [SYS_ADMIN]` pod is not privileged there; a `privileged: true` pod may
/// ask for `fabric`. The host canary never changes.
#[test]
fn capabilities_that_add_nodes_never_widen_a_pods_allocation() {
    let Some(n) = node("nvidia-dgx-h100", K8S_POLICY) else { return };
    let canary = Canary::new(None);
    let script = "ls -1 /dev; ls -1 /dev/nvidia-caps 2>/dev/null; ls /usr/lib/x86_64-linux-gnu 2>/dev/null; true";
    let everything: &[&str] = &[
        "NVIDIA_DRIVER_CAPABILITIES=all",
        "NVIDIA_VISIBLE_DEVICES=all",
        "NVIDIA_MIG_CONFIG_DEVICES=all",
        "NVIDIA_MIG_MONITOR_DEVICES=all",
        "NVIDIA_IMEX_CHANNELS=all",
    ];
    for via in [Via::Runtime, Via::Hook] {
        for (env, annotation) in [
            (&["NVIDIA_DRIVER_CAPABILITIES=fabric"][..], None),
            (&["NVIDIA_DRIVER_CAPABILITIES=compute,utility,fabric"][..], None),
            (&["NVIDIA_DRIVER_CAPABILITIES=all"][..], None),
            (everything, Some("nvidia.com/gpu=all")),
        ] {
            let what = format!("{via:?} {env:?}");
            let (out, said) = cri_pod(&n, via, script, env, annotation, Privilege::None);
            assert_eq!(gpus(&out), ["nvidia0"], "{what}:\n{out}");
            assert!(nvswitch_nodes(&out).is_empty(), "{what}: NVSwitch nodes in the pod:\n{out}");
            assert!(!out.contains("nvidia-cap"), "{what}: MIG management nodes in the pod:\n{out}");
            assert!(out.lines().any(|l| l == "nvidiactl"), "{what}: the allocated GPU's control node:\n{out}");
            if env[0] != "NVIDIA_DRIVER_CAPABILITIES=fabric" {
                assert!(out.contains("libcuda.so.1"), "{what}: the files of the other capabilities stay:\n{out}");
            }
            if via == Via::Runtime {
                assert!(said.contains("policy.env_requests"), "{what}: the refusal names the policy key:\n{said}");
                if env == ["NVIDIA_DRIVER_CAPABILITIES=fabric"] {
                    assert!(said.contains("NVIDIA_DRIVER_CAPABILITIES=fabric: refused"), "{what}:\n{said}");
                }
            }
        }
        // capabilities.add: [SYS_ADMIN] is not privileged: true on a node with privileged-flag.
        let env = ["NVIDIA_DRIVER_CAPABILITIES=fabric", "NVIDIA_VISIBLE_DEVICES=all"];
        let (out, said) = cri_pod(&n, via, script, &env, None, Privilege::AddSysAdmin);
        assert_eq!(gpus(&out), ["nvidia0"], "{via:?} SYS_ADMIN:\n{out}");
        assert!(nvswitch_nodes(&out).is_empty(), "{via:?} SYS_ADMIN:\n{out}");
        if via == Via::Runtime {
            assert!(
                said.contains("privileged_means = \\\"privileged-flag\\\"")
                    || said.contains("privileged_means = \"privileged-flag\""),
                "{said}"
            );
        }
        // privileged: true may ask (it reaches every node anyway): the nodes come.
        let (out, _) =
            cri_pod(&n, via, script, &["NVIDIA_DRIVER_CAPABILITIES=utility,fabric"], None, Privilege::PrivilegedTrue);
        assert_eq!(
            nvswitch_nodes(&out),
            ["nvidia-nvswitch0", "nvidia-nvswitch1", "nvidia-nvswitch2", "nvidia-nvswitch3", "nvidia-nvswitchctl"],
            "{via:?} privileged: true asks for fabric:\n{out}"
        );
    }
    canary.assert_unchanged("capabilities that add nodes");
}
