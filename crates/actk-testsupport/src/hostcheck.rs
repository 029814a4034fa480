//! Host cleanliness checks for end-to-end tests: a snapshot of what actk could leave behind on
//! the host, taken before a test and compared after it.
//!
//! What is compared:
//! - the host mount table (`/proc/self/mountinfo`, reduced to the stable fields: mount point,
//!   root, mount options, file system type, source), except mounts under the container engines'
//!   own state directories ([`ENGINE_STATE_DIRS`]: dockerd, containerd and podman mount and
//!   unmount there for every container of every test running in parallel);
//! - `/dev` (name, type, device number, mode of every entry; `pts`, `shm`, `mqueue` and
//!   `hugepages` skipped, their content is per-session);
//! - the CDI spec directories `/etc/cdi` and `/var/run/cdi` (file names and contents), read while
//!   holding the `var-run-cdi` lock the CDI tests take while their spec file exists;
//! - `/etc/docker/daemon.json` (parsed), read under [`engines::daemon_json_lock`]; runtime entries
//!   named `actk-e2e-*` are left out, as [`engines::DockerRuntime`] of parallel tests adds and
//!   removes them.
//!
//! Use the guard:
//! ```no_run
//! # fn main() -> anyhow::Result<()> {
//! use actk_testsupport::hostcheck::HostGuard;
//! let guard = HostGuard::new("my test")?;
//! // ... run containers ...
//! guard.finish()?; // Err lists every difference; dropping without finish() panics on one
//! # Ok(()) }
//! ```
//! A change the test asks for is declared with [`HostGuard::allow_path`] (e.g. a spec file the
//! test writes on purpose). The snapshot functions are public for tests that want the diff.

use crate::engines::{self, DAEMON_JSON};
use anyhow::{Context, Result};
use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// Directories where container engines mount and unmount for their own containers (overlay
/// roots, network namespaces, shm): changes under them are the engines' business.
pub const ENGINE_STATE_DIRS: &[&str] = &[
    "/var/lib/docker",
    "/run/docker",
    "/var/run/docker",
    "/run/containerd",
    "/var/lib/containerd",
    "/var/lib/containers",
    "/run/containers",
    "/run/libpod",
    "/run/netns",
    "/var/run/netns",
    "/run/user",
    "/run/runc",
    "/run/crun",
    // The test cluster of scripts/k8s-node.sh (kubelet volumes, containerd snapshots, shm).
    "/var/lib/actk-k8s",
    "/run/actk-k8s",
];

/// The CDI spec directories a guard compares (CDI SPEC.md).
pub const CDI_DIRS: &[&str] = &["/etc/cdi", "/var/run/cdi"];

/// Sub-directories of /dev whose contents change with terminals and shared memory.
const DEV_SKIP: &[&str] = &["pts", "shm", "mqueue", "hugepages"];

/// One snapshot of the host: each part a sorted map `line -> count` (mounts can be stacked).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Snapshot {
    /// `mountpoint root options fstype source` per mount.
    pub mounts: BTreeMap<String, usize>,
    /// `path type major:minor mode` per /dev entry.
    pub dev: BTreeMap<String, usize>,
    /// `path size fnv64` per file of the CDI directories.
    pub cdi: BTreeMap<String, usize>,
    /// daemon.json without the `actk-e2e-*` runtimes, as compact JSON (or `absent`/raw bytes).
    pub daemon_json: BTreeMap<String, usize>,
}

/// True when `path` is `dir` or below it.
fn under(path: &str, dir: &str) -> bool {
    path == dir || path.strip_prefix(dir).is_some_and(|r| r.starts_with('/'))
}

/// Undo mountinfo's octal escapes (`\040` for a space).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            let v = (b[i + 1] - b'0') as u32 * 64 + (b[i + 2] - b'0') as u32 * 8 + (b[i + 3] - b'0') as u32;
            out.push(v as u8);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The host mount table from `/proc/self/mountinfo` (proc(5)): stable fields of each mount
/// whose mount point is not under [`ENGINE_STATE_DIRS`].
pub fn mounts() -> Result<BTreeMap<String, usize>> {
    let text = fs::read_to_string("/proc/self/mountinfo").context("reading /proc/self/mountinfo")?;
    let mut out = BTreeMap::new();
    for line in text.lines() {
        // `ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER`
        let Some((left, right)) = line.split_once(" - ") else { continue };
        let l: Vec<&str> = left.split(' ').collect();
        let r: Vec<&str> = right.split(' ').collect();
        if l.len() < 6 || r.len() < 2 {
            continue;
        }
        let mount_point = unescape(l[4]);
        if ENGINE_STATE_DIRS.iter().any(|d| under(&mount_point, d)) {
            continue;
        }
        let key =
            format!("{mount_point} root={} opts={} type={} source={}", unescape(l[3]), l[5], r[0], unescape(r[1]));
        *out.entry(key).or_insert(0) += 1;
    }
    Ok(out)
}

/// Every entry of /dev (without [`DEV_SKIP`]): path, type, device number, mode.
pub fn dev_entries() -> Result<BTreeMap<String, usize>> {
    fn walk(dir: &Path, out: &mut BTreeMap<String, usize>, top: bool) -> Result<()> {
        let rd = match fs::read_dir(dir) {
            Ok(rd) => rd,
            // A directory removed while walking (a hot-unplugged device) is not a leak.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e).with_context(|| format!("reading {}", dir.display())),
        };
        for entry in rd.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if top && DEV_SKIP.contains(&name.as_str()) {
                continue;
            }
            let path = entry.path();
            let Ok(md) = fs::symlink_metadata(&path) else { continue };
            let ft = md.file_type();
            let kind = if ft.is_dir() {
                "dir"
            } else if ft.is_symlink() {
                "link"
            } else if ft.is_char_device() {
                "char"
            } else if ft.is_block_device() {
                "block"
            } else if ft.is_fifo() {
                "fifo"
            } else if ft.is_socket() {
                "socket"
            } else {
                "file"
            };
            let rdev = md.rdev();
            let target = if ft.is_symlink() {
                fs::read_link(&path).map(|t| format!(" -> {}", t.display())).unwrap_or_default()
            } else {
                String::new()
            };
            let key = format!(
                "{} {kind} {}:{} {:o}{target}",
                path.display(),
                dev_major(rdev),
                dev_minor(rdev),
                md.mode() & 0o7777
            );
            *out.entry(key).or_insert(0) += 1;
            if ft.is_dir() {
                walk(&path, out, false)?;
            }
        }
        Ok(())
    }
    let mut out = BTreeMap::new();
    walk(Path::new("/dev"), &mut out, true)?;
    Ok(out)
}

/// glibc's `major()` / `minor()` of a `dev_t`.
fn dev_major(dev: u64) -> u64 {
    ((dev >> 32) & 0xffff_f000) | ((dev >> 8) & 0x0000_0fff)
}

fn dev_minor(dev: u64) -> u64 {
    ((dev >> 12) & 0xffff_ff00) | (dev & 0x0000_00ff)
}

/// FNV-1a 64 of `bytes`: enough to see that a file changed.
fn fnv64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ *b as u64).wrapping_mul(0x0100_0000_01b3))
}

/// Files of `dirs` (recursively): path, size and content hash.
pub fn files(dirs: &[&str]) -> BTreeMap<String, usize> {
    fn walk(dir: &Path, out: &mut BTreeMap<String, usize>) {
        let Ok(rd) = fs::read_dir(dir) else { return };
        for entry in rd.flatten() {
            let path = entry.path();
            let Ok(md) = fs::symlink_metadata(&path) else { continue };
            if md.is_dir() {
                walk(&path, out);
                continue;
            }
            let content = fs::read(&path).unwrap_or_default();
            *out.entry(format!("{} {} {:016x} {:o}", path.display(), md.len(), fnv64(&content), md.mode() & 0o7777))
                .or_insert(0) += 1;
        }
    }
    let mut out = BTreeMap::new();
    for d in dirs {
        walk(Path::new(d), &mut out);
    }
    out
}

/// daemon.json without the runtimes parallel tests register (`actk-e2e-*`), one line per
/// top-level key (compact JSON value); `absent` when there is no file or nothing is left (no
/// key but an emptied `runtimes`: dockerd reads that as no file, and a parallel test that
/// registered a runtime on an absent file removes the file again when done), the raw text
/// when it is not JSON (which is itself worth seeing in a diff).
pub fn daemon_json() -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    let absent = |mut out: BTreeMap<String, usize>| {
        out.insert(format!("{DAEMON_JSON} absent"), 1);
        out
    };
    let Ok(text) = fs::read_to_string(DAEMON_JSON) else { return absent(out) };
    match serde_json::from_str::<serde_json::Value>(&text) {
        Ok(serde_json::Value::Object(mut m)) => {
            if let Some(serde_json::Value::Object(rt)) = m.get_mut("runtimes") {
                rt.retain(|k, _| !k.starts_with("actk-e2e-"));
                if rt.is_empty() {
                    m.remove("runtimes");
                }
            }
            if m.is_empty() {
                return absent(out);
            }
            for (k, v) in m {
                out.insert(format!("{DAEMON_JSON} {k}={v}"), 1);
            }
        }
        _ => {
            out.insert(format!("{DAEMON_JSON} (not a JSON object) {text}"), 1);
        }
    }
    out
}

/// Holds an exclusive flock on a lock file (those of [`engines::machine_lock_path`]) until dropped.
struct HeldLock(fs::File);

impl HeldLock {
    fn take(path: &Path) -> Result<HeldLock> {
        let f = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .with_context(|| format!("opening lock file {}", path.display()))?;
        f.lock().with_context(|| format!("locking {}", path.display()))?;
        Ok(HeldLock(f))
    }
}

impl Drop for HeldLock {
    fn drop(&mut self) {
        let _ = self.0.unlock();
    }
}

/// Takes a full snapshot. The CDI directories are read under the `var-run-cdi` lock and
/// daemon.json under [`engines::daemon_json_lock`] (unless `cdi_lock_held`: the caller holds it).
pub fn snapshot(cdi_lock_held: bool) -> Result<Snapshot> {
    let cdi = if cdi_lock_held {
        files(CDI_DIRS)
    } else {
        let _l = HeldLock::take(&engines::machine_lock_path("var-run-cdi"))?;
        files(CDI_DIRS)
    };
    let daemon = {
        let _l = HeldLock::take(&engines::daemon_json_lock())?;
        daemon_json()
    };
    Ok(Snapshot { mounts: mounts()?, dev: dev_entries()?, cdi, daemon_json: daemon })
}

/// Lines only in `before` (`-`) or only in `after` (`+`), for one part, prefixed by `what`.
fn diff_part(
    what: &str,
    before: &BTreeMap<String, usize>,
    after: &BTreeMap<String, usize>,
    allowed: &[PathBuf],
    out: &mut Vec<String>,
) {
    let is_allowed = |line: &str| {
        allowed.iter().any(|p| line.split(' ').next().is_some_and(|first| under(first, &p.to_string_lossy())))
    };
    for (line, n) in before {
        let m = after.get(line).copied().unwrap_or(0);
        if m < *n && !is_allowed(line) {
            out.push(format!("{what}: - {line}"));
        }
    }
    for (line, n) in after {
        let m = before.get(line).copied().unwrap_or(0);
        if *n > m && !is_allowed(line) {
            out.push(format!("{what}: + {line}"));
        }
    }
}

/// Every difference between two snapshots, except under `allowed` paths (compared by the first
/// field of each line: mount point, /dev path, file path).
pub fn diff(before: &Snapshot, after: &Snapshot, allowed: &[PathBuf]) -> Vec<String> {
    let mut out = Vec::new();
    diff_part("mount", &before.mounts, &after.mounts, allowed, &mut out);
    diff_part("dev", &before.dev, &after.dev, allowed, &mut out);
    diff_part("cdi", &before.cdi, &after.cdi, allowed, &mut out);
    diff_part("daemon.json", &before.daemon_json, &after.daemon_json, allowed, &mut out);
    out
}

/// A guard that snapshots the host at creation and checks it at [`HostGuard::finish`] (or on
/// drop, panicking with the differences unless the thread is already panicking).
///
/// With [`HostGuard::exclusive_cdi`], it holds the `var-run-cdi` lock for its whole life, so
/// that CDI tests of other binaries cannot change /var/run/cdi in between (use it in tests
/// that write specs there); without, the CDI directories are still compared, read under the
/// lock, and a concurrent CDI test's own file is outside any snapshot because that test holds
/// the lock for as long as its file exists.
pub struct HostGuard {
    name: String,
    before: Snapshot,
    allowed: Vec<PathBuf>,
    cdi_lock: Option<HeldLock>,
    finished: bool,
}

impl HostGuard {
    /// Snapshots the host for the test `name`.
    pub fn new(name: &str) -> Result<HostGuard> {
        Ok(HostGuard {
            name: name.to_string(),
            before: snapshot(false)?,
            allowed: Vec::new(),
            cdi_lock: None,
            finished: false,
        })
    }

    /// Like [`HostGuard::new`], holding the `var-run-cdi` lock until the guard is finished.
    pub fn exclusive_cdi(name: &str) -> Result<HostGuard> {
        let lock = HeldLock::take(&engines::machine_lock_path("var-run-cdi"))?;
        Ok(HostGuard {
            name: name.to_string(),
            before: snapshot(true)?,
            allowed: Vec::new(),
            cdi_lock: Some(lock),
            finished: false,
        })
    }

    /// Declares a change the test asks for: differences at or under `path` are not reported.
    pub fn allow_path(&mut self, path: impl Into<PathBuf>) -> &mut HostGuard {
        self.allowed.push(path.into());
        self
    }

    /// The snapshot taken at creation.
    pub fn before(&self) -> &Snapshot {
        &self.before
    }

    /// The differences between the snapshot at creation and now (empty when the host is clean).
    pub fn differences(&self) -> Result<Vec<String>> {
        let after = snapshot(self.cdi_lock.is_some())?;
        Ok(diff(&self.before, &after, &self.allowed))
    }

    /// Compares the host with the snapshot: `Err` lists every difference not allowed.
    pub fn finish(mut self) -> Result<()> {
        self.finished = true;
        let d = self.differences()?;
        self.cdi_lock = None;
        if d.is_empty() {
            Ok(())
        } else {
            anyhow::bail!("{}: the host changed ({} difference(s)):\n{}", self.name, d.len(), d.join("\n"))
        }
    }
}

impl Drop for HostGuard {
    fn drop(&mut self) {
        if self.finished || std::thread::panicking() {
            return;
        }
        match self.differences() {
            Ok(d) if d.is_empty() => {}
            Ok(d) => panic!("{}: the host changed ({} difference(s)):\n{}", self.name, d.len(), d.join("\n")),
            Err(e) => panic!("{}: cannot check the host: {e:#}", self.name),
        }
    }
}

/// A directory and files on the host, outside every rootfs, that hostile images aim at: its
/// listing, file types, contents, modes, owners and inodes must not change
/// ([`Canary::assert_unchanged`]). (security.rs keeps its own copy of the same idea.)
pub struct Canary {
    dir: tempfile::TempDir,
    before: Vec<String>,
}

impl Canary {
    /// A canary directory with `secret` (mode 0600), `sub/file` and, when `lib` is given, a copy
    /// of that library as `libcanary.so.1` (a real library: a cache listing this directory would
    /// index it).
    ///
    /// Errors: the files cannot be written.
    pub fn new(lib: Option<&Path>) -> Result<Canary> {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::Builder::new().prefix("actk-canary-").tempdir().context("canary dir")?;
        let p = dir.path();
        fs::set_permissions(p, fs::Permissions::from_mode(0o755))?;
        fs::write(p.join("secret"), "host secret\n")?;
        fs::set_permissions(p.join("secret"), fs::Permissions::from_mode(0o600))?;
        fs::create_dir(p.join("sub"))?;
        fs::write(p.join("sub/file"), "host file\n")?;
        if let Some(lib) = lib {
            fs::copy(lib, p.join("libcanary.so.1"))?;
        }
        let mut c = Canary { dir, before: Vec::new() };
        c.before = c.snapshot();
        Ok(c)
    }

    /// The canary directory.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// One line per entry: relative path, type, mode, inode, owner, size, content hash.
    pub fn snapshot(&self) -> Vec<String> {
        fn walk(base: &Path, p: &Path, out: &mut Vec<String>) {
            let Ok(m) = fs::symlink_metadata(p) else {
                out.push(format!("{} vanished", p.display()));
                return;
            };
            let rel = p.strip_prefix(base).unwrap_or(p).display().to_string();
            let content = if m.is_file() { fs::read(p).unwrap_or_default() } else { Vec::new() };
            out.push(format!(
                "{rel:?} {:?} mode={:o} ino={} uid={} gid={} size={} fnv={:x}",
                m.file_type(),
                m.mode(),
                m.ino(),
                m.uid(),
                m.gid(),
                m.len(),
                fnv64(&content)
            ));
            if m.is_dir() {
                let mut names: Vec<_> =
                    fs::read_dir(p).map(|r| r.flatten().map(|e| e.path()).collect()).unwrap_or_default();
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

    /// Panics, naming `what`, when anything in the canary changed.
    pub fn assert_unchanged(&self, what: &str) {
        assert_eq!(self.snapshot(), self.before, "{what}: the host canary {} changed", self.path().display());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_are_undone() {
        assert_eq!(unescape("/mnt/a\\040b"), "/mnt/a b");
        assert_eq!(unescape("/x\\\\y"), "/x\\\\y");
        assert_eq!(unescape("/end\\04"), "/end\\04");
    }

    #[test]
    fn diff_reports_added_and_removed_lines_outside_allowed_paths() {
        let mut a = Snapshot::default();
        a.mounts.insert("/mnt/x root=/ opts=rw type=tmpfs source=tmpfs".into(), 1);
        let mut b = a.clone();
        b.mounts.insert("/tmp/t/rootfs/usr/lib/libcuda.so.1 root=/ opts=ro type=ext4 source=/dev/vda".into(), 1);
        b.dev.insert("/dev/nvidia0 char 195:0 666".into(), 1);
        let d = diff(&a, &b, &[]);
        assert_eq!(d.len(), 2, "{d:?}");
        assert!(d[0].starts_with("mount: + /tmp/t/rootfs/usr/lib/libcuda.so.1"), "{d:?}");
        assert!(d[1].starts_with("dev: + /dev/nvidia0"), "{d:?}");
        assert_eq!(diff(&a, &b, &[PathBuf::from("/tmp/t"), PathBuf::from("/dev/nvidia0")]), Vec::<String>::new());
        // A stacked mount (the same line twice) is a difference too.
        let mut c = a.clone();
        *c.mounts.get_mut("/mnt/x root=/ opts=rw type=tmpfs source=tmpfs").unwrap() = 2;
        assert_eq!(diff(&a, &c, &[]).len(), 1);
        assert_eq!(diff(&c, &a, &[]), vec!["mount: - /mnt/x root=/ opts=rw type=tmpfs source=tmpfs".to_string()]);
    }

    #[test]
    fn engine_state_mounts_are_left_out_and_under_is_by_component() {
        assert!(under("/var/lib/docker/overlay2/x/merged", "/var/lib/docker"));
        assert!(!under("/var/lib/dockerx", "/var/lib/docker"));
        let m = mounts().unwrap();
        assert!(m.keys().any(|k| k.starts_with("/proc ")), "/proc missing from {m:?}");
        assert!(!m.keys().any(|k| k.starts_with("/var/lib/docker/")), "{m:?}");
    }

    #[test]
    fn a_tmpfs_mounted_and_left_is_found_and_unmounting_it_clears_the_diff() {
        if !engines::is_root() {
            eprintln!("skipping: needs root to mount");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let before = mounts().unwrap();
        let st = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=64k", "actk-hostcheck", dir.path().to_str().unwrap()])
            .status()
            .unwrap();
        assert!(st.success());
        let during = mounts().unwrap();
        let _ = std::process::Command::new("umount").arg(dir.path()).status();
        let after = mounts().unwrap();
        let snap = |m| Snapshot { mounts: m, ..Snapshot::default() };
        let d = diff(&snap(before.clone()), &snap(during), &[]);
        assert!(
            d.iter().any(|l| l.contains(&dir.path().display().to_string()) && l.contains("source=actk-hostcheck")),
            "{d:?}"
        );
        // Other tests may mount in parallel; only our mount point matters here.
        let ours =
            |m: &BTreeMap<String, usize>| m.keys().filter(|k| k.contains(&dir.path().display().to_string())).count();
        assert_eq!(ours(&after), ours(&before));
    }

    #[test]
    fn dev_snapshot_lists_null_with_its_numbers() {
        let d = dev_entries().unwrap();
        assert!(d.keys().any(|k| k.starts_with("/dev/null char 1:3 ")), "{:?}", d.keys().take(10).collect::<Vec<_>>());
        assert!(!d.keys().any(|k| k.starts_with("/dev/pts/")));
    }
}
