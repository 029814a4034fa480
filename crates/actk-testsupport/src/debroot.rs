//! A fresh Debian 12 root with the container engines installed from Debian's packages, for the
//! OS package test (crates/e2e/tests/package.rs): what an admin's host is before `apt install
//! ./actk.deb`.
//!
//! Built once per machine and kept outside any checkout (several worktrees share it):
//! - `/var/cache/actk/pkgtest/bookworm-<key>.tgz`: `debootstrap --make-tarball` of the packages
//!   (downloaded once from Debian's mirror, `$ACTK_DEBIAN_MIRROR` or deb.debian.org);
//! - `/var/cache/actk/pkgtest/root-<key>/`: that tarball unpacked and configured
//!   (`debootstrap --unpack-tarball`, about 2 minutes on 2 cores), marked complete by a file
//!   beside it. It is never changed: each test mounts an [`Overlay`] on it, so a run starts from
//!   the same fresh root in no time, and everything the run changed is in the overlay's upper
//!   directory, which is thrown away.
//!
//! `<key>` is a hash of [`PACKAGES`], so changing the list builds a new root.

use crate::engines::{text, with_lock_at};
use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The packages the root gets on top of debootstrap's minbase: the engines (docker.io with its
/// containerd, podman with the CNI plugins it needs for `container-network-stack`, runc) and
/// systemd as init, so the root can be booted (systemd-nspawn) to run the package's units.
pub const PACKAGES: &[&str] =
    &["docker.io", "podman", "runc", "containernetworking-plugins", "iptables", "systemd", "systemd-sysv", "dbus"];

/// Where the cached tarball and root live.
pub const CACHE_DIR: &str = "/var/cache/actk/pkgtest";

fn key() -> String {
    // FNV-1a over the package list: stable across builds and Rust versions.
    let mut h: u64 = 0xcbf29ce484222325;
    for b in PACKAGES.join(",").bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x100000001b3);
    }
    format!("{:08x}", h as u32)
}

fn run(what: &str, cmd: &mut Command) -> Result<()> {
    let o = cmd.stdin(Stdio::null()).output().with_context(|| format!("starting {what}"))?;
    if !o.status.success() {
        let (out, err) = text(&o);
        let tail =
            |s: &str| s.lines().rev().take(30).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n");
        bail!("{what} failed ({}):\n{}\n{}", o.status, tail(&out), tail(&err));
    }
    Ok(())
}

/// The cached, configured Debian 12 root (built when missing; minutes). Treat it as read-only.
pub fn base_root() -> Result<PathBuf> {
    let cache = Path::new(CACHE_DIR);
    let key = key();
    let root = cache.join(format!("root-{key}"));
    let done = cache.join(format!("root-{key}.complete"));
    let tarball = cache.join(format!("bookworm-{key}.tgz"));
    with_lock_at(&crate::engines::machine_lock_path("pkgtest-root"), || {
        if done.is_file() && root.join("etc/debian_version").is_file() {
            return Ok(root.clone());
        }
        std::fs::create_dir_all(cache).with_context(|| format!("creating {}", cache.display()))?;
        if crate::engines::which("debootstrap").is_none() {
            bail!("debootstrap is not installed (scripts/install-deps.sh installs it)");
        }
        let mirror = std::env::var("ACTK_DEBIAN_MIRROR").unwrap_or_else(|_| "http://deb.debian.org/debian".into());
        let include = format!("--include={}", PACKAGES.join(","));
        if !tarball.is_file() {
            let tmp = cache.join(format!("bookworm-{key}.tgz.tmp"));
            let work = cache.join(format!("work-{key}"));
            let _ = std::fs::remove_dir_all(&work);
            run(
                "debootstrap --make-tarball",
                Command::new("debootstrap")
                    .args(["--variant=minbase", &include])
                    .arg(format!("--make-tarball={}", tmp.display()))
                    .arg("bookworm")
                    .arg(&work)
                    .arg(&mirror),
            )?;
            let _ = std::fs::remove_dir_all(&work);
            std::fs::rename(&tmp, &tarball)?;
        }
        let _ = std::fs::remove_dir_all(&root);
        run(
            "debootstrap --unpack-tarball",
            Command::new("debootstrap")
                .args(["--variant=minbase", &include])
                .arg(format!("--unpack-tarball={}", tarball.display()))
                .arg("bookworm")
                .arg(&root)
                .arg(&mirror),
        )?;
        std::fs::write(&done, format!("{}\n", PACKAGES.join(" ")))?;
        Ok(root.clone())
    })
}

/// An overlay mount of [`base_root`]: a fresh root whose changes go to an upper directory of
/// its own. Unmounted and removed on drop.
pub struct Overlay {
    dir: tempfile::TempDir,
    /// The merged root to chroot or boot into.
    pub root: PathBuf,
    mounted: bool,
}

impl Overlay {
    /// Mounts a fresh overlay of [`base_root`] under a new directory in `parent` (which must be
    /// on a file system that can hold an overlay's upper directory, not tmpfs for large runs).
    pub fn new(parent: &Path) -> Result<Overlay> {
        let lower = base_root()?;
        std::fs::create_dir_all(parent)?;
        let dir = tempfile::Builder::new().prefix("pkgtest-").tempdir_in(parent)?;
        for d in ["upper", "work", "root"] {
            std::fs::create_dir(dir.path().join(d))?;
        }
        let root = dir.path().join("root");
        let opts = format!(
            "lowerdir={},upperdir={},workdir={}",
            lower.display(),
            dir.path().join("upper").display(),
            dir.path().join("work").display()
        );
        run("mount -t overlay", Command::new("mount").args(["-t", "overlay", "overlay", "-o", &opts]).arg(&root))?;
        Ok(Overlay { dir, root, mounted: true })
    }

    /// The overlay's upper directory: every path the run created, changed or deleted.
    pub fn upper(&self) -> PathBuf {
        self.dir.path().join("upper")
    }
}

impl Drop for Overlay {
    fn drop(&mut self) {
        if self.mounted {
            // Mounts a test made below the root first (lazy: a process of a failed test may
            // still hold one).
            let _ = Command::new("umount").arg("-R").arg("-l").arg(&self.root).status();
            self.mounted = false;
        }
    }
}
