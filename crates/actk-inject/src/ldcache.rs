//! Refreshing the container's ld.so.cache with the HOST's ldconfig.
//!
//! Never a binary from the image (CVE-2024-0136 class): the host ldconfig is opened
//! `O_PATH | O_NOFOLLOW`, checked (a regular file owned by root, not writable by group or others,
//! executable), and executed through that very fd (`/proc/self/fd/N`, what fexecve(3) does), so a
//! swap of the path after the check runs nothing else. It runs with `-r <container root>` (it
//! chroots there) and `-X` (it writes the cache file only, no soname links in directories the
//! image names, which may be host volumes), with an environment of exactly
//! [`crate::env::minimal_env`], under a timeout. Discovery mounts each soname as a file, so the
//! cache entries point at files that exist.
//!
//! `ldconfig -r` reads the image's own /etc/ld.so.conf, so the library directories are given
//! both as a drop-in `/etc/ld.so.conf.d/00-actk.conf` (kept for later ldconfig runs inside the
//! container) and on the command line (for images whose ld.so.conf has no include line).
//! An image without /etc/ld.so.conf has no glibc loader configuration (busybox, musl): then
//! nothing is written or run.

// Raw syscalls with no safe wrapper in rustix: each unsafe block says what it relies on.
#![allow(unsafe_code)]

use crate::env::minimal_env;
use crate::error::{InjectError, Result};
use crate::root::ContainerRoot;
use rustix::fd::{AsRawFd, OwnedFd};
use rustix::fs::{FileType, Mode, OFlags};
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Path of the drop-in written into the container.
pub const DROP_IN: &str = "/etc/ld.so.conf.d/00-actk.conf";

/// Default time limit for one ldconfig run.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// The host's ldconfig, opened and verified.
#[derive(Debug)]
pub struct HostLdconfig {
    fd: OwnedFd,
    path: PathBuf,
}

/// What [`update`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LdcacheOutcome {
    /// The image has no /etc/ld.so.conf: no glibc loader reads a cache there.
    NoLoaderConfig,
    /// No library directories to add.
    NothingToDo,
    /// ldconfig ran; its stderr (warnings), if any.
    Updated(String),
}

impl HostLdconfig {
    /// Opens and verifies the host ldconfig at `path` (default `/sbin/ldconfig`).
    ///
    /// Errors: [`InjectError::HostRefused`] when it is a symlink, not a regular file, not owned
    /// by root, writable by group/others or not executable; [`InjectError::Host`] when missing.
    pub fn open(path: &Path) -> Result<HostLdconfig> {
        let fd = rustix::fs::open(path, OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty())
            .map_err(|e| InjectError::host("open host ldconfig", path, e))?;
        let st = rustix::fs::fstat(&fd).map_err(|e| InjectError::host("stat host ldconfig", path, e))?;
        let refuse = |reason: &str| Err(InjectError::HostRefused { path: path.into(), reason: reason.into() });
        match FileType::from_raw_mode(st.st_mode) {
            FileType::RegularFile => {}
            FileType::Symlink => return refuse("is a symlink; give the real file's path"),
            _ => return refuse("is not a regular file"),
        }
        if st.st_uid != 0 {
            return refuse("is not owned by root");
        }
        if st.st_mode & 0o022 != 0 {
            return refuse("is writable by group or others");
        }
        if st.st_mode & 0o100 == 0 {
            return refuse("is not executable");
        }
        Ok(HostLdconfig { fd, path: path.into() })
    }

    /// Runs `ldconfig -X -r <root> DIR...` with the minimal environment and `timeout`.
    /// Returns ldconfig's stderr.
    ///
    /// Errors: [`InjectError::Ldconfig`] with the exit status and stderr, or "timed out".
    pub fn run(&self, root: &ContainerRoot, dirs: &[String], timeout: Duration) -> Result<String> {
        let exe = format!("/proc/self/fd/{}", self.fd.as_raw_fd());
        let errbuf = rustix::fs::memfd_create("actk-ldconfig-stderr", rustix::fs::MemfdFlags::CLOEXEC)
            .map_err(|e| InjectError::Ldconfig(format!("memfd_create: {e}")))?;
        let err_dup = errbuf.try_clone().map_err(|e| InjectError::Ldconfig(format!("dup: {e}")))?;
        let keep = [self.fd.as_raw_fd(), root.as_fd().as_raw_fd()];
        let mut cmd = Command::new(&exe);
        // -X: write only the cache, never soname symlinks: the image's ld.so.conf may list a
        // directory that is a volume bind-mounted from the host, where ldconfig must not write.
        cmd.arg0("ldconfig").arg("-X").arg("-r").arg(root.proc_fd_path()).args(dirs);
        cmd.env_clear().envs(minimal_env()).current_dir("/");
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::from(err_dup));
        // SAFETY: only fcntl(2) between fork and exec, which is async-signal-safe.
        unsafe {
            cmd.pre_exec(move || {
                // The exe and root fds must survive exec for /proc/self/fd/N to name them.
                for fd in keep {
                    if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        let mut child =
            cmd.spawn().map_err(|e| InjectError::Ldconfig(format!("start {} ({exe}): {e}", self.path.display())))?;
        let start = Instant::now();
        let status = loop {
            match child.try_wait() {
                Ok(Some(s)) => break s,
                Ok(None) if start.elapsed() >= timeout => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(InjectError::Ldconfig(format!(
                        "{} timed out after {:?} and was killed",
                        self.path.display(),
                        timeout
                    )));
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(2)),
                Err(e) => return Err(InjectError::Ldconfig(format!("wait for {}: {e}", self.path.display()))),
            }
        };
        let mut stderr = String::new();
        let mut f = std::fs::File::from(errbuf);
        use std::io::Seek;
        let _ = f.seek(std::io::SeekFrom::Start(0));
        let _ = f.read_to_string(&mut stderr);
        if !status.success() {
            return Err(InjectError::Ldconfig(format!(
                "{} -r {} exited with {status}: {}",
                self.path.display(),
                root.shown().display(),
                stderr.trim()
            )));
        }
        Ok(stderr)
    }
}

/// Writes the drop-in listing `dirs` and runs the host ldconfig on `root`; see the module docs.
pub fn update(
    root: &ContainerRoot,
    ldconfig: &HostLdconfig,
    dirs: &[String],
    timeout: Duration,
) -> Result<LdcacheOutcome> {
    if dirs.is_empty() {
        return Ok(LdcacheOutcome::NothingToDo);
    }
    if !root.exists("/etc/ld.so.conf") {
        return Ok(LdcacheOutcome::NoLoaderConfig);
    }
    // CUDA forward-compat directories (crate::compat) go first: ldconfig keeps the first
    // directory's library of a soname, and the image's newer libcuda.so.1 must win.
    let compat = crate::compat::compat_dirs(root);
    let dirs: Vec<String> = compat.iter().chain(dirs.iter().filter(|d| !compat.contains(d))).cloned().collect();
    let dirs = dirs.as_slice();
    let mut body = String::from("# Written by actk: driver library directories mounted from the host.\n");
    for d in dirs {
        body.push_str(d);
        body.push('\n');
    }
    root.write_file(DROP_IN, body.as_bytes(), 0o644)?;
    ldconfig.run(root, dirs, timeout).map(LdcacheOutcome::Updated)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn refuses_symlink_and_group_writable_ldconfig() {
        let d = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("/sbin/ldconfig", d.path().join("link")).unwrap();
        let e = HostLdconfig::open(&d.path().join("link")).unwrap_err();
        assert!(e.to_string().contains("symlink"), "{e}");
        let f = d.path().join("ldconfig");
        std::fs::write(&f, b"#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o775)).unwrap();
        let e = HostLdconfig::open(&f).unwrap_err();
        assert!(e.to_string().contains("writable by group"), "{e}");
    }

    #[test]
    fn image_ldconfig_is_never_run_and_cache_is_built_by_host_ldconfig() {
        // A rootfs with a glibc-style ld.so.conf and an "ldconfig" that would leave a mark if run.
        let base = tempfile::tempdir().unwrap();
        let b = base.path();
        std::fs::create_dir_all(b.join("etc")).unwrap();
        std::fs::create_dir_all(b.join("sbin")).unwrap();
        std::fs::create_dir_all(b.join("opt/drv")).unwrap();
        std::fs::write(b.join("etc/ld.so.conf"), "include /etc/ld.so.conf.d/*.conf\n").unwrap();
        std::fs::write(b.join("sbin/ldconfig"), "#!/bin/sh\ntouch /tmp/actk-image-ldconfig-ran\n").unwrap();
        std::fs::set_permissions(b.join("sbin/ldconfig"), std::fs::Permissions::from_mode(0o755)).unwrap();
        // A real shared library copied from the host so ldconfig has something to index.
        let lib = [
            "/lib/x86_64-linux-gnu/libz.so.1",
            "/usr/lib/x86_64-linux-gnu/libz.so.1",
            "/lib/x86_64-linux-gnu/libc.so.6",
        ]
        .iter()
        .find(|p| Path::new(p).exists())
        .copied()
        .unwrap();
        let name = Path::new(lib).file_name().unwrap();
        std::fs::copy(lib, b.join("opt/drv").join(name)).unwrap();
        let root = ContainerRoot::open(b).unwrap();
        let ld = HostLdconfig::open(Path::new("/sbin/ldconfig")).unwrap();
        let out = update(&root, &ld, &["/opt/drv".into()], DEFAULT_TIMEOUT).unwrap();
        assert!(matches!(out, LdcacheOutcome::Updated(_)), "{out:?}");
        assert!(!b.join("tmp/actk-image-ldconfig-ran").exists());
        assert_eq!(
            std::fs::read_to_string(b.join("etc/ld.so.conf.d/00-actk.conf")).unwrap().lines().last(),
            Some("/opt/drv")
        );
        let cache = std::fs::read(b.join("etc/ld.so.cache")).unwrap();
        let needle = format!("/opt/drv/{}", name.to_string_lossy());
        assert!(cache.windows(needle.len()).any(|w| w == needle.as_bytes()), "cache lacks {needle}");
    }

    #[test]
    fn image_without_ld_so_conf_is_left_alone() {
        let base = tempfile::tempdir().unwrap();
        let root = ContainerRoot::open(base.path()).unwrap();
        let ld = HostLdconfig::open(Path::new("/sbin/ldconfig")).unwrap();
        assert_eq!(update(&root, &ld, &["/usr/lib".into()], DEFAULT_TIMEOUT).unwrap(), LdcacheOutcome::NoLoaderConfig);
        assert!(std::fs::read_dir(base.path()).unwrap().next().is_none());
    }
}
