//! Issue 29, findings 2-4, end to end with the real runc: hostile image files against the work
//! actk's root-run hooks do on an image, through actk-hook (the prestart hook, as `docker run
//! --gpus` runs it) and through actk-runtime (the update-ldcache and enable-cuda-compat
//! createContainer hooks of its edits). Each test has a host canary (a directory and files
//! outside every rootfs whose listing, contents, modes and inodes must not change) and a
//! HostGuard (mount table, /dev, CDI directories).
//!
//! - finding 2: an `/etc/ld.so.cache` of 349k entries naming one 8 MB string;
//! - finding 3: 1,000 links to one crafted library (254 `PT_NOTE`, 4000 `DT_NEEDED`) in the
//!   injected library directory; 226,000 compat drop-in lines;
//! - finding 4: a `lib*.so*` and the cache file as device nodes (`c 1 11`), a FIFO placed as a
//!   compat drop-in and one raced in while containers start.
//!
//! Every hook here runs under `prlimit` with 512 MiB of address space and 10 s of CPU: a start
//! that succeeds did its work within those, without a timed assertion (the old reader demanded
//! terabytes for finding 2; finding 3 cost 24-57 s of CPU). What each run skipped is reported
//! by the hook on stderr, which runc drops for a hook that succeeds; the last test runs
//! `actk-hook update-ldcache` directly to check those warnings name the directory and the bound.

use actk_testsupport::engines::{
    self, Bundle, actk_runtime, bin, expect_success, require_root, runc, text, unique_name,
};
use actk_testsupport::fixture::{self, Fixture};
use actk_testsupport::hostcheck::{Canary, HostGuard};
use actk_testsupport::hostile::{self, Class, OpenWatch, node};
use rustix::fs::FileType;
use serde_json::json;
use std::ffi::OsString;
use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

const LIBDIR: &str = "/usr/lib/x86_64-linux-gnu";
const LIBCUDA: &str = "/usr/lib/x86_64-linux-gnu/libcuda.so.1";
/// The limits every hook of these tests runs under (prlimit): address space, CPU seconds.
const HOOK_LIMITS: &[&str] = &["--as=536870912", "--cpu=10"];

/// How a container start reaches actk.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Via {
    /// actk-hook as the prestart hook, called as Docker's `--gpus` calls it, under `runc run`.
    Hook,
    /// actk-runtime in runc's place (its edits' createContainer hooks).
    Runtime,
}

/// A prepared DGX fixture, a config for it, and a wrapper that runs actk-hook under
/// [`HOOK_LIMITS`] (the config's `hook_path`, so actk-runtime's hooks go through it too).
struct Node {
    fixture: Fixture,
    _config: engines::ActkConfig,
    config_file: PathBuf,
    limited_hook: PathBuf,
}

fn node_setup() -> Option<Node> {
    if !require_root() {
        return None;
    }
    let fixture = fixture::prepare("nvidia-dgx-h100").expect("prepare fixture")?;
    let mut config = engines::ActkConfig::new(&fixture.root).expect("actk config");
    let limited_hook = config.dir().join("actk-hook-limited");
    fs::write(
        &limited_hook,
        format!(
            "#!/bin/sh\nexec /usr/bin/prlimit {} -- '{}' \"$@\"\n",
            HOOK_LIMITS.join(" "),
            bin("actk-hook").display()
        ),
    )
    .unwrap();
    fs::set_permissions(&limited_hook, fs::Permissions::from_mode(0o755)).unwrap();
    config.extra = format!("hook_path = {}\n", json!(limited_hook.to_string_lossy()));
    let config_file = config.write().expect("write config");
    Some(Node { fixture, _config: config, config_file, limited_hook })
}

impl Node {
    /// A busybox bundle with a glibc-style loader configuration asking for GPU 0, running
    /// `script`; through [`Via::Hook`] with the limited actk-hook as its prestart hook.
    fn bundle(&self, via: Via, script: &str) -> Bundle {
        let b = Bundle::busybox(&["sh", "-c", script], &["NVIDIA_VISIBLE_DEVICES=0"]).expect("bundle");
        fs::write(b.rootfs().join("etc/ld.so.conf"), "include /etc/ld.so.conf.d/*.conf\n").unwrap();
        fs::create_dir_all(b.rootfs().join("etc/ld.so.conf.d")).unwrap();
        fs::create_dir_all(b.rootfs().join(&LIBDIR[1..])).unwrap();
        if via == Via::Hook {
            let cfg = format!("ACTK_CONFIG={}", self.config_file.display());
            let hook = self.limited_hook.to_string_lossy().to_string();
            b.edit(|c| {
                c["hooks"] = json!({"prestart": [{
                    "path": hook, "args": ["nvidia-container-runtime-hook", "prestart"], "env": [cfg],
                }]});
            })
            .expect("edit config");
        }
        b
    }

    fn start(&self, via: Via, b: &Bundle) -> Output {
        let args = [OsString::from("run"), "--bundle".into(), b.path().into(), unique_name("hostile-files").into()];
        match via {
            Via::Hook => runc(&args),
            Via::Runtime => actk_runtime(&self.config_file, &args),
        }
    }
}

/// The container's ld.so.cache as the host sees it (empty when it is not a regular file).
fn cache_of(rootfs: &Path) -> Vec<u8> {
    match fs::symlink_metadata(rootfs.join("etc/ld.so.cache")) {
        Ok(m) if m.is_file() => fs::read(rootfs.join("etc/ld.so.cache")).unwrap(),
        _ => Vec::new(),
    }
}

fn lists(cache: &[u8], path: &str) -> bool {
    cache.windows(path.len() + 1).any(|w| &w[..path.len()] == path.as_bytes() && w[path.len()] == 0)
}

/// One hostile class through `via`: the container starts with the hook under its limits, its
/// cache is actk's (and lists libcuda when `lists_libcuda`), and neither canary nor host changed.
fn start_hostile(via: Via, what: &str, plant: impl FnOnce(&Path, &Canary), lists_libcuda: bool) {
    let Some(n) = node_setup() else { return };
    let guard = HostGuard::new(&format!("{what} via {via:?}")).unwrap();
    let canary = Canary::new(Some(&n.fixture.path(LIBCUDA))).unwrap();
    let b = n.bundle(via, "ls /dev; echo container-ran");
    plant(&b.rootfs(), &canary);
    let o = n.start(via, &b);
    let out = expect_success(&format!("{what} via {via:?}"), &o);
    assert!(out.contains("container-ran") && out.lines().any(|l| l.trim() == "nvidia0"), "{out}");
    let cache = cache_of(&b.rootfs());
    assert!(cache.starts_with(b"glibc-ld.so.cache1.1"), "{what} via {via:?}: the container has no cache of actk's");
    assert!(!lists(&cache, &canary.path().join("libcanary.so.1").to_string_lossy()), "the cache lists a host path");
    if lists_libcuda {
        assert!(lists(&cache, LIBCUDA), "{what} via {via:?}: the container's cache lacks {LIBCUDA}");
    }
    canary.assert_unchanged(&format!("{what} via {via:?}"));
    guard.finish().unwrap();
}

/// Finding 2: refused by the bounded reader; the container's cache is written with libcuda.
fn amplifying_cache(via: Via) {
    start_hostile(
        via,
        "amplifying ld.so.cache",
        |rootfs, _| hostile::plant(rootfs, Class::AmplifyingCache, LIBDIR, 0).unwrap(),
        true,
    );
}

#[test]
fn amplifying_image_cache_through_actk_hook() {
    amplifying_cache(Via::Hook);
}

#[test]
fn amplifying_image_cache_through_actk_runtime() {
    amplifying_cache(Via::Runtime);
}

/// Finding 3: 1,000 links to the crafted library in the injected directory (and links to the
/// canary among them). The scan may stop at the run's budget before it reaches libcuda (the
/// directory's order is the file system's), so only a cache of actk's is required.
fn elf_flood(via: Via) {
    start_hostile(
        via,
        "ELF flood",
        |rootfs, canary| {
            hostile::plant(rootfs, Class::ElfFlood, LIBDIR, 1000).unwrap();
            let dir = rootfs.join(&LIBDIR[1..]);
            symlink(canary.path().join("libcanary.so.1"), dir.join("libcanary.so.1")).unwrap();
            symlink(format!("/proc/1/root{}", canary.path().display()), dir.join("libcanarydir.so.1")).unwrap();
        },
        false,
    );
}

#[test]
fn elf_flood_through_actk_hook() {
    elf_flood(Via::Hook);
}

#[test]
fn elf_flood_through_actk_runtime() {
    elf_flood(Via::Runtime);
}

/// Finding 3: 226,000 compat drop-in lines (one naming the canary): at most 64 directories are
/// taken, none of them leads out, and the injected directory is still indexed.
fn drop_in_flood(via: Via) {
    start_hostile(
        via,
        "compat drop-in flood",
        |rootfs, canary| {
            hostile::plant(rootfs, Class::DropInFlood, LIBDIR, 0).unwrap();
            fs::write(
                rootfs.join("etc/ld.so.conf.d/00-compat-0canary.conf"),
                format!("{}\n/proc/1/root{}\n", canary.path().display(), canary.path().display()),
            )
            .unwrap();
        },
        true,
    );
}

#[test]
fn compat_drop_in_flood_through_actk_hook() {
    drop_in_flood(Via::Hook);
}

#[test]
fn compat_drop_in_flood_through_actk_runtime() {
    drop_in_flood(Via::Runtime);
}

/// Finding 4: `lib*.so*` entries that are a device node (`c 1 11`, what /dev/kmsg is) and a
/// FIFO, links to a device node elsewhere in the image, and `/etc/ld.so.cache` as a device node:
/// none is ever opened (inotify sees no open of any of them, from any namespace), the container
/// starts, and its cache (a regular file now) lists libcuda.
fn device_nodes(via: Via) {
    let mut watch = None;
    start_hostile(
        via,
        "device nodes as libraries and cache",
        |rootfs, _| {
            let dir = rootfs.join(&LIBDIR[1..]);
            let nodes = [
                dir.join("libkmsg.so.1"),
                dir.join("libfifo.so.1"),
                rootfs.join("opt/kmsg"),
                rootfs.join("etc/ld.so.cache"),
            ];
            fs::create_dir_all(rootfs.join("opt")).unwrap();
            for (p, kind) in nodes.iter().zip([
                FileType::CharacterDevice,
                FileType::Fifo,
                FileType::CharacterDevice,
                FileType::CharacterDevice,
            ]) {
                node(p, kind).unwrap();
            }
            symlink("/opt/kmsg", dir.join("libkmsglink.so.1")).unwrap();
            symlink("../../../opt/kmsg", dir.join("libkmsgrel.so.1")).unwrap();
            let refs: Vec<&Path> = nodes.iter().map(PathBuf::as_path).collect();
            watch = Some((OpenWatch::new(&refs).unwrap(), nodes));
        },
        true,
    );
    if let Some((watch, _)) = watch {
        assert_eq!(watch.opened(), Vec::<PathBuf>::new(), "via {via:?}: actk opened an image node");
    }
}

#[test]
fn device_nodes_as_libraries_and_cache_are_never_opened_through_actk_hook() {
    device_nodes(Via::Hook);
}

#[test]
fn device_nodes_as_libraries_and_cache_are_never_opened_through_actk_runtime() {
    device_nodes(Via::Runtime);
}

/// Finding 4: a FIFO placed as a compat drop-in, and one raced in: a second process swaps a
/// regular drop-in and a FIFO under the same name as fast as it can while containers start
/// (before: 7 of 82 runtime starts and 4 of 46 hook starts blocked forever). Every start ends
/// and starts the container.
fn fifo_drop_in(via: Via, starts: usize) {
    let Some(n) = node_setup() else { return };
    let guard = HostGuard::new(&format!("FIFO drop-in via {via:?}")).unwrap();
    let canary = Canary::new(None).unwrap();
    for i in 0..starts {
        let b = n.bundle(via, "echo container-ran");
        let d = b.rootfs().join("etc/ld.so.conf.d");
        node(&d.join("00-compat-placed.conf"), FileType::Fifo).unwrap();
        let target = d.join("00-compat-raced.conf");
        fs::write(&target, format!("{}\n", canary.path().display())).unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let racer = {
            let (stop, d, target) = (stop.clone(), d.clone(), target.clone());
            std::thread::spawn(move || {
                let (fifo, file) = (d.join(".fifo"), d.join(".file"));
                let mut swaps = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let _ = fs::remove_file(&fifo);
                    if node(&fifo, FileType::Fifo).is_ok() && fs::rename(&fifo, &target).is_ok() {
                        swaps += 1;
                    }
                    std::thread::yield_now();
                    if fs::write(&file, "/opt/raced\n").is_ok() {
                        let _ = fs::rename(&file, &target);
                    }
                }
                swaps
            })
        };
        let o = n.start(via, &b);
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let swaps = racer.join().unwrap();
        let what = format!("FIFO drop-in via {via:?}, start {i} ({swaps} swaps)");
        assert!(swaps > 0, "{what}: the racer never swapped");
        let out = expect_success(&what, &o);
        assert!(out.contains("container-ran"), "{what}: {out}");
        canary.assert_unchanged(&what);
    }
    guard.finish().unwrap();
}

#[test]
fn fifo_compat_drop_in_placed_and_raced_never_blocks_through_actk_hook() {
    fifo_drop_in(Via::Hook, 8);
}

#[test]
fn fifo_compat_drop_in_placed_and_raced_never_blocks_through_actk_runtime() {
    fifo_drop_in(Via::Runtime, 8);
}

/// What a run skipped is said, naming the directory and the bound: `actk-hook update-ldcache`
/// (as a CDI createContainer hook is called) on a rootfs with the ELF flood, the device nodes and
/// a FIFO drop-in, for a process in its own mount namespace standing in for the container.
#[test]
fn the_hook_warns_naming_the_directory_the_bound_and_each_skipped_file() {
    let Some(n) = node_setup() else { return };
    let canary = Canary::new(None).unwrap();
    let b = n.bundle(Via::Runtime, "true");
    let rootfs = b.rootfs();
    hostile::plant(&rootfs, Class::ElfFlood, LIBDIR, 1000).unwrap();
    // Before the flood (which spends the budget in the file system's order).
    fs::create_dir_all(rootfs.join("opt/first")).unwrap();
    node(&rootfs.join("opt/first/libkmsg.so.1"), FileType::CharacterDevice).unwrap();
    node(&rootfs.join("etc/ld.so.conf.d/00-compat-fifo.conf"), FileType::Fifo).unwrap();
    node(&rootfs.join("etc/ld.so.cache"), FileType::CharacterDevice).unwrap();
    let mut holder = Command::new("unshare").args(["-m", "--propagation", "private", "sleep", "60"]).spawn().unwrap();
    // The namespace exists once unshare has exec'd sleep.
    for _ in 0..100 {
        let comm = fs::read_to_string(format!("/proc/{}/comm", holder.id())).unwrap_or_default();
        if comm.trim() == "sleep" {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let state = json!({"ociVersion": "1.0.2", "id": "hostile-files", "status": "creating", "pid": holder.id(), "bundle": b.path()});
    let mut child = Command::new(&n.limited_hook)
        .args(["update-ldcache", "--folder", "/opt/first", "--folder", LIBDIR, "--folder", "/opt/after"])
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), state.to_string().as_bytes()).unwrap();
    let o = child.wait_with_output().unwrap();
    let _ = holder.kill();
    let _ = holder.wait();
    let (_, err) = text(&o);
    assert!(o.status.success(), "{err}");
    for want in [
        format!("{LIBDIR}: the budget of 67108864 bytes read per start is spent;"),
        "/opt/after: not indexed: the budget of 67108864 bytes read per start is spent".to_string(),
        "container path \"/opt/first/libkmsg.so.1\" inside".to_string(),
        "is a character device, not a regular file: not opened; skipped".to_string(),
        "/etc/ld.so.conf.d/00-compat-fifo.conf".to_string(),
        "/etc/ld.so.cache: not read, replaced".to_string(),
    ] {
        assert!(err.contains(&want), "{want:?} not in:\n{err}");
    }
    assert!(cache_of(&rootfs).starts_with(b"glibc-ld.so.cache1.1"));
    canary.assert_unchanged("update-ldcache warnings");
}
