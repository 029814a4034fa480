//! Read-only bind mounts of host files into a live container, with the new mount API.
//!
//! 1. [`PreparedMount::new`] (host mount namespace): the host source is opened with openat2
//!    `RESOLVE_NO_MAGICLINKS` and cloned with `open_tree(OPEN_TREE_CLONE | AT_RECURSIVE)` into a
//!    detached mount, then made `ro,nosuid,nodev` with `mount_setattr` before anyone can see it.
//! 2. The target is created and opened as an `O_PATH` fd through [`ContainerRoot::create_target`].
//! 3. [`attach`] forks a single-threaded child that `setns`es into the container's mount
//!    namespace (setns(2) refuses a multi-threaded caller) and `move_mount`s each detached tree
//!    onto its target fd. No path is resolved after the fds exist, so swapping a symlink in the
//!    image after step 2 changes nothing.

// Raw syscalls with no safe wrapper in rustix: each unsafe block says what it relies on.
#![allow(unsafe_code)]

use crate::error::{InjectError, Result};
use crate::root::{ContainerRoot, TargetKind};
use rustix::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use rustix::fs::{FileType, Mode, OFlags, ResolveFlags};
use rustix::mount::{MountAttrFlags, MoveMountFlags, OpenTreeFlags};
use std::path::{Path, PathBuf};

/// A host source cloned into a detached read-only mount, and its target in the container.
#[derive(Debug)]
pub struct PreparedMount {
    /// Host source path.
    pub source: PathBuf,
    /// Container path.
    pub target: String,
    tree: OwnedFd,
    target_fd: Option<OwnedFd>,
    is_dir: bool,
}

/// The host driver root, opened once for all mount sources of a container.
#[derive(Debug)]
pub struct HostRoot {
    /// The path (`/`, or a driver root such as `/run/nvidia/driver`).
    pub path: PathBuf,
    fd: OwnedFd,
}

impl HostRoot {
    /// Opens `path` as an `O_PATH` directory.
    pub fn open(path: &Path) -> Result<HostRoot> {
        let fd = rustix::fs::open(path, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
            .map_err(|e| InjectError::host("open host driver root", path, e))?;
        Ok(HostRoot { path: path.to_path_buf(), fd })
    }
}

/// `struct mount_attr` of mount_setattr(2) (linux/mount.h, MOUNT_ATTR_SIZE_VER0 = 32 bytes).
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

impl PreparedMount {
    /// Opens and clones `source` (an absolute host path under `host_root`, the host driver root:
    /// `/` on a node, a fixture directory in tests), resolved inside `host_root`.
    ///
    /// Errors: [`InjectError::HostRefused`] for a source outside the driver root or one reached
    /// through a magic link (`/proc/PID/root/...`: another container's file),
    /// [`InjectError::Host`] when the source is missing or the clone fails.
    pub fn new(host_root: &HostRoot, source: &Path, target: &str) -> Result<PreparedMount> {
        Self::prepare(host_root, source, target, false)
    }

    /// A host device node cloned for a bind mount onto `target` (a container with its own user
    /// namespace cannot mknod, and a node it made would sit on a `nodev` /dev: runc bind-mounts
    /// the host's node there, and so does actk). `nosuid,noexec`, but not `nodev` or `ro`: the
    /// node must open read-write. `source` must be a character or block device under `host_root`.
    pub fn device(host_root: &HostRoot, source: &Path, target: &str) -> Result<PreparedMount> {
        Self::prepare(host_root, source, target, true)
    }

    fn prepare(host_root: &HostRoot, source: &Path, target: &str, device: bool) -> Result<PreparedMount> {
        let rel = match source.strip_prefix(&host_root.path) {
            Ok(rel) if source.is_absolute() => rel,
            _ => {
                return Err(InjectError::HostRefused {
                    path: source.into(),
                    reason: format!(
                        "mount source is not under the host driver root {}; actk mounts only host driver files",
                        host_root.path.display()
                    ),
                });
            }
        };
        let root_fd = &host_root.fd;
        let rel = if rel.as_os_str().is_empty() { Path::new(".") } else { rel };
        // Symlinks in the driver root resolve inside it (as discovery resolved them); magic links never.
        let src = rustix::fs::openat2(
            root_fd,
            rel,
            OFlags::PATH | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS,
        )
        .map_err(|e| match e {
            rustix::io::Errno::LOOP => InjectError::HostRefused {
                path: source.into(),
                reason:
                    "is reached through a magic link (/proc/PID/...) or a symlink loop; actk mounts host files only"
                        .into(),
            },
            e => InjectError::host("open mount source", source, e),
        })?;
        let st = rustix::fs::fstat(&src).map_err(|e| InjectError::host("stat mount source", source, e))?;
        let ft = FileType::from_raw_mode(st.st_mode);
        let is_dir = ft == FileType::Directory;
        if device && ft != FileType::CharacterDevice && ft != FileType::BlockDevice {
            return Err(InjectError::HostRefused {
                path: source.into(),
                reason: "is not a device node; only the host's device nodes are bind-mounted as devices".into(),
            });
        }
        let tree = rustix::mount::open_tree(
            &src,
            "",
            OpenTreeFlags::OPEN_TREE_CLONE
                | OpenTreeFlags::OPEN_TREE_CLOEXEC
                | OpenTreeFlags::AT_EMPTY_PATH
                | OpenTreeFlags::AT_RECURSIVE,
        )
        .map_err(|e| InjectError::host("open_tree (clone) of mount source", source, e))?;
        let flags = if device {
            MountAttrFlags::MOUNT_ATTR_NOSUID | MountAttrFlags::MOUNT_ATTR_NOEXEC
        } else {
            MountAttrFlags::MOUNT_ATTR_RDONLY | MountAttrFlags::MOUNT_ATTR_NOSUID | MountAttrFlags::MOUNT_ATTR_NODEV
        };
        let attr = MountAttr { attr_set: flags.bits() as u64, attr_clr: 0, propagation: 0, userns_fd: 0 };
        // SAFETY: a plain syscall with a valid fd, a NUL-terminated empty path and a live struct.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_mount_setattr,
                tree.as_raw_fd(),
                c"".as_ptr(),
                (libc::AT_EMPTY_PATH | libc::AT_RECURSIVE) as libc::c_uint,
                &attr as *const MountAttr,
                size_of::<MountAttr>(),
            )
        };
        if rc != 0 {
            let what = if device { "mount_setattr nosuid,noexec on" } else { "mount_setattr ro,nosuid,nodev on" };
            return Err(InjectError::host(what, source, std::io::Error::last_os_error()));
        }
        Ok(PreparedMount { source: source.into(), target: target.into(), tree, target_fd: None, is_dir })
    }

    /// Creates the target inside the container root (an empty file or a directory, by the
    /// source's type) and keeps its `O_PATH` fd for [`attach`].
    pub fn create_target(&mut self, root: &ContainerRoot) -> Result<()> {
        self.create_target_as(root, None)
    }

    /// [`PreparedMount::create_target`]; when the container has its own user namespace
    /// (`ids`: the host uid/gid of its root), a target on a file system of that namespace (the
    /// tmpfs runc mounts on /dev) cannot be created by host root (EOVERFLOW: uid 0 has no mapping
    /// there), so it is created again with the file system ids of the container's root, and
    /// belongs to it.
    pub fn create_target_as(&mut self, root: &ContainerRoot, ids: Option<(u32, u32)>) -> Result<()> {
        let kind = if self.is_dir { TargetKind::Dir } else { TargetKind::File };
        let fd = match root.create_target(&self.target, kind) {
            Err(e) if is_overflow(&e) && ids.is_some_and(|i| i != (0, 0)) => {
                let (uid, gid) = ids.unwrap_or((0, 0));
                with_fs_ids(uid, gid, || root.create_target(&self.target, kind))?
            }
            r => r?,
        };
        self.target_fd = Some(fd);
        Ok(())
    }
}

/// Whether an error is EOVERFLOW (an id without a mapping in the file system's user namespace).
fn is_overflow(e: &InjectError) -> bool {
    std::error::Error::source(e).and_then(|s| s.downcast_ref::<std::io::Error>()).and_then(std::io::Error::raw_os_error)
        == Some(libc::EOVERFLOW)
}

/// Runs `f` with this thread's file system uid and gid set to `uid`/`gid` (setfsuid(2): only file
/// creation and permission checks use them), and back to 0 after. setfsuid to a non-zero id
/// drops the file capabilities (CAP_DAC_OVERRIDE...) from the effective set, and back to 0
/// restores them: `f` creates files as that user would.
fn with_fs_ids<T>(uid: u32, gid: u32, f: impl FnOnce() -> Result<T>) -> Result<T> {
    // SAFETY: setfsgid/setfsuid only change this thread's credentials; they cannot fail in a way
    // that leaves memory unsound (they return the previous id).
    unsafe {
        libc::setfsgid(gid);
        libc::setfsuid(uid);
    }
    let r = f();
    // SAFETY: as above, back to root's ids.
    unsafe {
        libc::setfsuid(0);
        libc::setfsgid(0);
    }
    r
}

impl PreparedMount {
    /// The container path this mount goes to.
    pub fn target_path(&self) -> &str {
        &self.target
    }
}

/// Moves every prepared mount onto its target inside the mount namespace `mnt_ns` (an fd of
/// `/proc/PID/ns/mnt`; `None` = the caller's own namespace, for tests that unshare). Runs in a
/// forked child so that the caller stays in its namespace whatever threads it has.
///
/// Errors: [`InjectError::Mount`] naming the first mount that failed; earlier ones stay attached
/// (they are inside the container's namespace and vanish with it).
pub fn attach(mnt_ns: Option<BorrowedFd<'_>>, pid: i32, mounts: &[PreparedMount]) -> Result<()> {
    let pairs: Vec<(i32, i32)> = mounts
        .iter()
        .map(|m| (m.tree.as_raw_fd(), m.target_fd.as_ref().map(|f| f.as_raw_fd()).unwrap_or(-1)))
        .collect();
    if let Some(i) = pairs.iter().position(|p| p.1 < 0) {
        return Err(InjectError::Mount {
            pid,
            source_path: mounts[i].source.clone(),
            target: mounts[i].target.clone(),
            error: std::io::Error::other("target not created (call create_target first)"),
        });
    }
    if pairs.is_empty() {
        return Ok(());
    }
    let (rd, wr) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
        .map_err(|e| InjectError::host("pipe", "attach", e))?;
    let ns = mnt_ns.map(|f| f.as_raw_fd()).unwrap_or(-1);
    let wr_raw = wr.as_raw_fd();
    let flags = (MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH | MoveMountFlags::MOVE_MOUNT_T_EMPTY_PATH).bits();
    // SAFETY: the child only makes raw syscalls on memory prepared before fork (no allocation,
    // no locks), then _exit()s, so forking from a multi-threaded process is sound.
    let child = unsafe { libc::fork() };
    if child < 0 {
        return Err(InjectError::host("fork", "attach", std::io::Error::last_os_error()));
    }
    if child == 0 {
        unsafe { child_attach(ns, &pairs, flags, wr_raw) }
    }
    drop(wr);
    let mut buf = [0u8; 8];
    let mut got = 0;
    while got < 8 {
        match rustix::io::read(&rd, &mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) => break,
        }
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    unsafe { libc::waitpid(child, &mut status, 0) };
    if got == 8 {
        let idx = u32::from_ne_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
        let errno = i32::from_ne_bytes([buf[4], buf[5], buf[6], buf[7]]);
        let (source_path, target) = match mounts.get(idx) {
            Some(m) => (m.source.clone(), m.target.clone()),
            None => (PathBuf::from("/proc"), "(setns)".to_string()),
        };
        return Err(InjectError::Mount { pid, source_path, target, error: std::io::Error::from_raw_os_error(errno) });
    }
    if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
        return Err(InjectError::Mount {
            pid,
            source_path: mounts[0].source.clone(),
            target: mounts[0].target.clone(),
            error: std::io::Error::other(format!("mount helper process ended with status {status:#x}")),
        });
    }
    Ok(())
}

/// The forked child: setns, move_mount each pair, report the first failure as (index, errno).
unsafe fn child_attach(ns: i32, pairs: &[(i32, i32)], flags: u32, wr: i32) -> ! {
    let fail = |idx: u32| -> ! {
        let errno = unsafe { *libc::__errno_location() };
        let mut msg = [0u8; 8];
        msg[..4].copy_from_slice(&idx.to_ne_bytes());
        msg[4..].copy_from_slice(&errno.to_ne_bytes());
        unsafe {
            libc::write(wr, msg.as_ptr().cast(), 8);
            libc::_exit(1)
        }
    };
    if ns >= 0 && unsafe { libc::setns(ns, libc::CLONE_NEWNS) } != 0 {
        fail(u32::MAX);
    }
    for (i, (tree, target)) in pairs.iter().enumerate() {
        let rc = unsafe { libc::syscall(libc::SYS_move_mount, *tree, c"".as_ptr(), *target, c"".as_ptr(), flags) };
        if rc != 0 {
            fail(i as u32);
        }
    }
    unsafe { libc::_exit(0) }
}

/// Opens `/proc/PID/ns/mnt`.
pub fn open_mnt_ns(pid: i32) -> Result<OwnedFd> {
    open_mnt_ns_path(&format!("/proc/{pid}/ns/mnt"))
}

/// Opens a mount namespace file (`/proc/thread-self/ns/mnt`, `/proc/PID/ns/mnt`).
pub fn open_mnt_ns_path(p: &str) -> Result<OwnedFd> {
    rustix::fs::open(p, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty()).map_err(|e| InjectError::host("open", p, e))
}

impl AsFd for PreparedMount {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.tree.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_outside_the_driver_root_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let hr = HostRoot::open(d.path()).unwrap();
        let e = PreparedMount::new(&hr, Path::new("/etc/passwd"), "/etc/passwd").unwrap_err();
        assert!(e.to_string().contains("not under the host driver root"), "{e}");
    }

    #[test]
    fn source_through_a_magic_link_is_refused() {
        // /proc/self/root/etc/passwd would be "another process's root": never a mount source.
        let hr = HostRoot::open(Path::new("/")).unwrap();
        let e = PreparedMount::new(&hr, Path::new("/proc/self/root/etc/passwd"), "/x").unwrap_err();
        assert!(e.to_string().contains("magic link"), "{e}");
    }

    #[test]
    fn symlink_in_the_driver_root_resolves_inside_it() {
        // lib -> /usr/lib (absolute, as on merged-/usr hosts) must mean <root>/usr/lib, not the host's.
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("usr/lib")).unwrap();
        std::os::unix::fs::symlink("/usr/lib", d.path().join("lib")).unwrap();
        let hr = HostRoot::open(d.path()).unwrap();
        // Exists on the host, absent in the driver root: must not be found.
        let probe = ["/usr/lib/os-release", "/usr/lib/x86_64-linux-gnu/libc.so.6"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .unwrap();
        let rel = Path::new(probe).strip_prefix("/usr/lib").unwrap();
        let src = d.path().join("lib").join(rel);
        let e = PreparedMount::new(&hr, &src, "/x").unwrap_err();
        let cause = std::error::Error::source(&e).map(|s| s.to_string()).unwrap_or_default();
        assert!(e.to_string().contains("open mount source") && cause.contains("No such file"), "{e}: {cause}");
    }
}
