//! Hostile images against actk-hook, through a real `runc run` with the hook as a prestart hook
//! (exactly how Docker's `--gpus` reaches it). Each test builds a busybox rootfs with a trap,
//! requests GPUs on the DGX fixture, and asserts:
//! - nothing outside the container root changed on the host: a sentinel directory that the image
//!   points its symlinks at keeps exactly its one file and content, no file appears at the host
//!   path the trap aims at, and no mount of a fixture file is left in the host's mount table;
//! - the container either starts with the libraries where the image's own (in-root) symlinks put
//!   them, or fails with an actk-hook error naming the path.
//!
//! Classes covered: library dir, /dev and /usr/bin symlinked to `/`, `../../..` and
//! `/proc/self/root`; injection targets that are symlinks to host files; LD_PRELOAD in the image
//! env (CVE-2025-23266 class); an image shipping its own ldconfig (CVE-2024-0136 class); a
//! compat-library directory full of symlinks (CVE-2024-0132 / CVE-2025-23359 class); a symlink
//! swapped while the hook runs (a racing thread).

use actk_testsupport::engines::{self, Bundle, bin, require_root, runc, text, unique_name};
use actk_testsupport::fixture::{self, Fixture};
use serde_json::{Value, json};
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Output;

struct Env {
    fixture: Fixture,
    config: engines::ActkConfig,
    config_file: PathBuf,
    sentinel: tempfile::TempDir,
}

fn setup() -> Option<Env> {
    if !require_root() {
        return None;
    }
    let fixture = fixture::prepare("nvidia-dgx-h100").expect("prepare fixture")?;
    let config = engines::ActkConfig::new(&fixture.root).expect("actk config");
    let config_file = config.write().expect("write config");
    let sentinel = tempfile::Builder::new().prefix("actk-sentinel-").tempdir().expect("sentinel");
    std::fs::write(sentinel.path().join("shadow"), "secret\n").expect("sentinel file");
    Some(Env { fixture, config, config_file, sentinel })
}

impl Env {
    /// A busybox bundle running `script` with `NVIDIA_VISIBLE_DEVICES=0` plus `env`, and
    /// actk-hook as its prestart hook, called as Docker calls it.
    fn bundle(&self, script: &str, env: &[&str]) -> Bundle {
        let mut all = vec!["NVIDIA_VISIBLE_DEVICES=0"];
        all.extend_from_slice(env);
        let b = Bundle::busybox(&["sh", "-c", script], &all).expect("bundle");
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
        b
    }

    fn run(&self, b: &Bundle) -> Output {
        runc(&["run".as_ref(), "--bundle".as_ref(), b.path().as_os_str(), unique_name("hostile").as_ref()])
    }

    /// Host mount-table lines that mention the fixture root or the sentinel (our mount sources
    /// and trap targets). Must be empty after every test.
    fn host_mounts(&self) -> Vec<String> {
        let mi = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let root = self.fixture.root.to_string_lossy().to_string();
        let sent = self.sentinel.path().to_string_lossy().to_string();
        mi.lines().filter(|l| l.contains(&root) || l.contains(&sent)).map(str::to_string).collect()
    }

    fn assert_host_untouched(&self, what: &str) {
        let entries: Vec<String> = std::fs::read_dir(self.sentinel.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .collect();
        assert_eq!(entries, vec!["shadow".to_string()], "{what}: the host sentinel directory changed");
        assert_eq!(
            std::fs::read_to_string(self.sentinel.path().join("shadow")).unwrap(),
            "secret\n",
            "{what}: host file written"
        );
        let m = std::fs::symlink_metadata(self.sentinel.path().join("shadow")).unwrap();
        assert!(m.is_file(), "{what}: host file replaced");
        assert!(self.host_mounts().is_empty(), "{what}: actk mounts left on the host: {:?}", self.host_mounts());
    }

    fn sentinel(&self, rel: &str) -> PathBuf {
        self.sentinel.path().join(rel)
    }
}

fn replace_with_symlink(path: &Path, target: &str) {
    if path.is_dir() && !path.is_symlink() {
        std::fs::remove_dir_all(path).unwrap();
    } else {
        let _ = std::fs::remove_file(path);
    }
    if let Some(p) = path.parent() {
        std::fs::create_dir_all(p).unwrap();
    }
    symlink(target, path).unwrap();
}

/// Either success with `expect_out` in stdout, or a failure whose stderr is actk-hook's and
/// names `path`.
fn started_or_clear_error(o: &Output, expect_out: &str, path: &str) -> bool {
    let (out, err) = text(o);
    eprintln!("{path}: {}", if o.status.success() { "container started".to_string() } else { err.trim().to_string() });
    if o.status.success() {
        assert!(out.contains(expect_out), "container started but output lacks {expect_out:?}:\n{out}\n{err}");
        true
    } else {
        assert!(err.contains("actk-hook") && err.contains(path), "failure must be actk-hook's and name {path}:\n{err}");
        false
    }
}

const LIBDIR: &str = "usr/lib/x86_64-linux-gnu";

#[test]
fn library_dir_symlinked_to_root_lands_inside_container() {
    let Some(env) = setup() else { return };
    let b = env.bundle("wc -c < /usr/lib/x86_64-linux-gnu/libcuda.so.1; ls /libcuda.so.1", &[]);
    replace_with_symlink(&b.rootfs().join(LIBDIR), "/");
    let o = env.run(&b);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}\n{err}");
    assert!(out.contains("/libcuda.so.1"), "{out}");
    assert!(!Path::new("/libcuda.so.1").exists(), "a library appeared in the host's /");
    env.assert_host_untouched("library dir -> /");
}

#[test]
fn usr_bin_symlinked_to_root_dotdot_and_proc_self_root() {
    let Some(env) = setup() else { return };
    for target in ["/", "../../..", "/proc/self/root/usr/bin"] {
        let b = env.bundle("/bin/busybox wc -c < /usr/bin/nvidia-smi", &[]);
        replace_with_symlink(&b.rootfs().join("usr/bin"), target);
        let o = env.run(&b);
        started_or_clear_error(&o, "", "/usr/bin");
        assert!(!Path::new("/nvidia-smi").exists(), "usr/bin -> {target}: nvidia-smi appeared in the host's /");
        assert!(
            !Path::new("/usr/bin/nvidia-smi").exists(),
            "usr/bin -> {target}: nvidia-smi appeared in the host's /usr/bin"
        );
        env.assert_host_untouched(&format!("usr/bin -> {target}"));
        if target == "/proc/self/root/usr/bin" {
            // /proc/self inside the container's procfs is not the hook's; /proc/PID/root is a magic link: refused.
            assert!(!o.status.success(), "a path through /proc/self/root must be refused");
        }
    }
}

#[test]
fn dev_symlinked_to_root_touches_nothing_on_host() {
    let Some(env) = setup() else { return };
    let b = env.bundle("ls /dev/nvidia0", &[]);
    replace_with_symlink(&b.rootfs().join("dev"), "/");
    let before = std::fs::symlink_metadata("/nvidia0").is_ok();
    let o = env.run(&b);
    let (out, err) = text(&o);
    assert!(!before && !Path::new("/nvidia0").exists(), "a device node appeared in the host's /");
    eprintln!(
        "/dev -> /: {}",
        if o.status.success() { "container started".to_string() } else { err.trim().to_string() }
    );
    // runc itself resolves /dev inside the rootfs; whatever it decides, the node is ours or absent.
    if o.status.success() {
        assert!(out.contains("/dev/nvidia0"), "{out}\n{err}");
    }
    env.assert_host_untouched("/dev -> /");
}

#[test]
fn injection_targets_that_are_symlinks_to_host_files_are_replaced() {
    let Some(env) = setup() else { return };
    let shadow = env.sentinel("shadow");
    let b = env.bundle("wc -c < /usr/bin/nvidia-smi; wc -c < /usr/lib/x86_64-linux-gnu/libcuda.so.1", &[]);
    let rf = b.rootfs();
    std::fs::create_dir_all(rf.join(LIBDIR)).unwrap();
    replace_with_symlink(&rf.join("usr/bin/nvidia-smi"), &shadow.to_string_lossy());
    replace_with_symlink(&rf.join(LIBDIR).join("libcuda.so.1"), &shadow.to_string_lossy());
    // Relative form: climbs out of the rootfs when followed naively from the host.
    let up = format!("../../../../../../../../..{}", shadow.display());
    replace_with_symlink(&rf.join(LIBDIR).join("libnvidia-ml.so.1"), &up);
    let o = env.run(&b);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}\n{err}");
    let smi = std::fs::metadata(env.fixture.path("/usr/bin/nvidia-smi")).unwrap().len();
    assert!(
        out.lines().next().map(|l| l.trim()) == Some(smi.to_string().as_str()),
        "container does not see the host nvidia-smi ({smi} bytes):\n{out}"
    );
    env.assert_host_untouched("targets symlinked to a host file");
}

#[test]
fn cve_2025_23266_class_ld_preload_in_image_env_is_never_used() {
    let Some(env) = setup() else { return };
    let marker = env.sentinel("preload-ran");
    let b = env.bundle("true", &[]);
    let so = b.rootfs().join("evil.so");
    let src = env.config.dir().join("evil.c");
    std::fs::write(
        &src,
        format!(
            "#include <fcntl.h>\n__attribute__((constructor)) static void f(void) {{ open(\"{}\", O_CREAT|O_WRONLY, 0644); }}\n",
            marker.display()
        ),
    )
    .unwrap();
    let cc = std::process::Command::new("cc").args(["-shared", "-fPIC", "-o"]).arg(&so).arg(&src).output();
    if !cc.map(|o| o.status.success()).unwrap_or(false) {
        eprintln!("skipping: no C compiler to build the preload library");
        return;
    }
    // Both the in-container path and the host path of the image's library, plus the
    // /proc/self/cwd trick (the hook's cwd is the bundle).
    let cwd_form = format!("LD_PRELOAD=/proc/self/cwd/rootfs/evil.so:{}:/evil.so", so.display());
    b.edit(|c| {
        let env = c["process"]["env"].as_array_mut().unwrap();
        env.push(Value::from(cwd_form.clone()));
        env.push(Value::from("LD_LIBRARY_PATH=/"));
    })
    .unwrap();
    // A glibc-style ld.so.conf makes the hook run the host ldconfig (a child process that must
    // not inherit the container's environment).
    std::fs::write(b.rootfs().join("etc/ld.so.conf"), "include /etc/ld.so.conf.d/*.conf\n").unwrap();
    let o = env.run(&b);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}\n{err}");
    assert!(!marker.exists(), "the image's LD_PRELOAD library ran on the host");
    std::fs::remove_file(&so).ok();
    env.assert_host_untouched("LD_PRELOAD");
}

#[test]
fn cve_2024_0136_class_image_ldconfig_is_never_run() {
    let Some(env) = setup() else { return };
    let host_marker = env.sentinel("image-ldconfig-ran");
    let b = env.bundle("true", &[]);
    let rf = b.rootfs();
    std::fs::write(rf.join("etc/ld.so.conf"), "include /etc/ld.so.conf.d/*.conf\n").unwrap();
    for p in ["sbin/ldconfig", "usr/sbin/ldconfig", "sbin/ldconfig.real", "usr/bin/ldconfig"] {
        let f = rf.join(p);
        std::fs::create_dir_all(f.parent().unwrap()).unwrap();
        let _ = std::fs::remove_file(&f);
        std::fs::write(
            &f,
            format!("#!/bin/sh\necho ran > {}\necho ran > /image-ldconfig-ran\n", host_marker.display()),
        )
        .unwrap();
        std::os::unix::fs::PermissionsExt::set_mode(&mut std::fs::metadata(&f).unwrap().permissions(), 0o755);
        std::fs::set_permissions(&f, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    }
    let o = env.run(&b);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}\n{err}");
    assert!(!host_marker.exists(), "the image's ldconfig ran on the host");
    assert!(!rf.join("image-ldconfig-ran").exists(), "the image's ldconfig ran (chrooted)");
    let cache = std::fs::read(rf.join("etc/ld.so.cache")).expect("the host ldconfig wrote the container's ld.so.cache");
    let needle = b"/usr/lib/x86_64-linux-gnu/libcuda.so.1";
    assert!(cache.windows(needle.len()).any(|w| w == needle), "ld.so.cache lacks libcuda.so.1");
    env.assert_host_untouched("image ldconfig");
}

#[test]
fn cve_2024_0132_class_compat_dir_full_of_symlinks() {
    let Some(env) = setup() else { return };
    let b = env.bundle("ls -l /usr/local/cuda/compat/ >/dev/null; wc -c < /usr/lib/x86_64-linux-gnu/libcuda.so.1", &[]);
    let rf = b.rootfs();
    let sent = env.sentinel.path().to_string_lossy().to_string();
    // The compat dir: every entry points at the host, absolute and relative, files and dirs.
    let compat = rf.join("usr/local/cuda/compat");
    std::fs::create_dir_all(&compat).unwrap();
    for (name, target) in [
        ("libcuda.so.1", format!("{sent}/shadow")),
        ("libcuda.so", format!("../../../../../../../../{sent}/shadow")),
        ("libnvidia-ml.so.1", format!("{sent}/shadow")),
        ("lib64", sent.clone()),
        ("host-root", "/".into()),
    ] {
        symlink(target, compat.join(name)).unwrap();
    }
    // The library dir itself is the compat dir's host-root link: resolved inside the root.
    std::fs::create_dir_all(rf.join("usr/lib")).unwrap();
    replace_with_symlink(&rf.join(LIBDIR), "/usr/local/cuda/compat/lib64");
    std::fs::write(
        rf.join("etc/ld.so.conf"),
        "/usr/local/cuda/compat\n/usr/local/cuda/compat/lib64\ninclude /etc/ld.so.conf.d/*.conf\n",
    )
    .unwrap();
    let o = env.run(&b);
    started_or_clear_error(&o, "", "/usr/lib/x86_64-linux-gnu");
    env.assert_host_untouched("compat dir of symlinks");
}

#[test]
fn symlink_swapped_while_the_hook_runs() {
    let Some(env) = setup() else { return };
    let sent = env.sentinel.path().to_path_buf();
    let mut started = 0;
    for i in 0..6 {
        let b = env.bundle("wc -c < /usr/lib/x86_64-linux-gnu/libcuda.so.1", &[]);
        let dir = b.rootfs().join(LIBDIR);
        std::fs::create_dir_all(&dir).unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let racer = {
            let (stop, dir, sent) = (stop.clone(), dir.clone(), sent.clone());
            std::thread::spawn(move || {
                let aside = dir.with_file_name("x86_64-linux-gnu.real");
                let link = dir.with_file_name("x86_64-linux-gnu.link");
                let mut n = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    // Swap the real directory for a symlink to the host sentinel and back.
                    let _ = std::fs::remove_file(&link);
                    let _ = symlink(if n.is_multiple_of(2) { sent.as_path() } else { Path::new("/") }, &link);
                    let _ = std::fs::rename(&dir, &aside);
                    let _ = std::fs::rename(&link, &dir);
                    std::thread::yield_now();
                    let _ = std::fs::rename(&dir, &link);
                    let _ = std::fs::rename(&aside, &dir);
                    n += 1;
                }
                n
            })
        };
        let o = env.run(&b);
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let swaps = racer.join().unwrap();
        assert!(swaps > 0, "the racing thread never ran");
        let (_, err) = text(&o);
        eprintln!(
            "race round {i}: {swaps} swaps, {}",
            if o.status.success() { "started".to_string() } else { err.trim().to_string() }
        );
        if o.status.success() {
            started += 1;
        } else {
            // Either the hook refused a path it saw change, or the container's own command saw the
            // directory swapped away after injection (the racer keeps going while it runs).
            assert!(
                err.contains("actk-hook") || err.contains("/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
                "round {i}: unclear failure: {err}"
            );
        }
        env.assert_host_untouched(&format!("race round {i}"));
    }
    eprintln!("race: {started}/6 containers started");
}

#[test]
fn ldconfig_writes_no_links_into_a_host_volume_the_image_lists() {
    let Some(env) = setup() else { return };
    // A real library whose soname link is missing, in a host directory bind-mounted rw.
    let lib = std::fs::read_dir("/lib/x86_64-linux-gnu")
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("libz.so.1.")))
        .expect("a versioned libz on the host");
    let vol = tempfile::Builder::new().prefix("actk-volume-").tempdir().unwrap();
    std::fs::copy(&lib, vol.path().join(lib.file_name().unwrap())).unwrap();
    let before: Vec<_> = std::fs::read_dir(vol.path()).unwrap().flatten().map(|e| e.file_name()).collect();
    let b = env.bundle("true", &[]);
    let v = vol.path().to_string_lossy().to_string();
    b.edit(|c| {
        c["mounts"]
            .as_array_mut()
            .unwrap()
            .push(json!({"destination": "/vol", "type": "bind", "source": v, "options": ["rbind", "rw"]}));
    })
    .unwrap();
    std::fs::write(b.rootfs().join("etc/ld.so.conf"), "/vol\ninclude /etc/ld.so.conf.d/*.conf\n").unwrap();
    let o = env.run(&b);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}\n{err}");
    let after: Vec<_> = std::fs::read_dir(vol.path()).unwrap().flatten().map(|e| e.file_name()).collect();
    assert_eq!(before, after, "ldconfig created entries in the host volume");
    assert!(b.rootfs().join("etc/ld.so.cache").exists(), "the hook did not run ldconfig");
    env.assert_host_untouched("volume listed in ld.so.conf");
}
