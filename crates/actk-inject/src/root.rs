//! Safe path resolution inside an untrusted container root.
//!
//! A [`ContainerRoot`] holds an `O_PATH` directory fd of the container's root filesystem. Every
//! path inside it is resolved by the kernel with `openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)`
//! (Linux >= 5.6, openat2(2)): absolute symlinks and `..` in the image are clamped at the root,
//! and `/proc/PID/root`-style magic links are refused, so a hostile image cannot make actk touch
//! a host path. Directories and files are created with `mkdirat`/`openat`/`mknodat` relative to a
//! resolved parent fd and a single name, so no path string is ever re-resolved outside openat2.
//! The final component of a target is never followed: a symlink there is replaced.
//!
//! Files of the image are read only when they are regular files, and nothing else of the image
//! is ever opened for reading or writing ([`ContainerRoot::open_regular`]; issue 29, finding 4):
//! a path is first resolved to an `O_PATH` descriptor, which opens nothing (no driver's `open`
//! runs for a device node, a FIFO does not block), its type is checked with `fstat` on that
//! descriptor, and only a regular file is reopened for reading through the descriptor itself
//! (`/proc/thread-self/fd/N`, as libpathrs reopens its handles), so what is read is the inode
//! that was checked, whatever the image swaps in meanwhile.
//!
//! We use rustix's openat2 directly rather than the `pathrs` crate: the kernel here always has
//! openat2 (pathrs's value is its userspace fallback for old kernels), pathrs's MPL/LGPL licence
//! is file-level copyleft, and the few operations actk needs (mkdir -p, create a mount target,
//! write a small file, mknod) are short on top of openat2.

use crate::error::{InjectError, Result};
use rustix::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;
use std::path::{Path, PathBuf};

/// Filesystems on which actk never creates anything, even inside the container root: writing a
/// mount target or node there would mean acting on kernel state, not on the image.
const REFUSED_FS: &[(u64, &str)] = &[
    (0x9fa0, "procfs"),
    (0x6265_6572, "sysfs"),
    (0x0027_e0eb, "cgroup"),
    (0x6367_7270, "cgroup2"),
    (0x7363_6673, "securityfs"),
    (0x6462_6720, "debugfs"),
];

/// What a mount target must be: an empty file (for a file source) or a directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TargetKind {
    /// A regular file (or anything that is not a directory, e.g. an existing device node or socket).
    File,
    /// A directory.
    Dir,
}

/// An open container root. Cheap to keep; all operations go through its fd.
#[derive(Debug)]
pub struct ContainerRoot {
    fd: OwnedFd,
    shown: PathBuf,
}

impl ContainerRoot {
    /// Opens a host directory as a container root (a bundle's rootfs). `path` is a host path
    /// (trusted: it comes from the engine's bundle, not from the image).
    ///
    /// Errors: [`InjectError::Host`] when the directory cannot be opened.
    pub fn open(path: &Path) -> Result<Self> {
        let fd = rustix::fs::open(path, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
            .map_err(|e| InjectError::host("open container root", path, e))?;
        Ok(ContainerRoot { fd, shown: path.to_path_buf() })
    }

    /// Opens the root filesystem of a live container as its mount namespace sees it:
    /// `rootfs` (the bundle's `root.path` made absolute) resolved inside `/proc/PID/root`.
    ///
    /// At the prestart / createRuntime / createContainer stages the container has not yet
    /// pivoted (OCI runtime-spec "Lifecycle"), so its mount namespace shows the rootfs at its host
    /// path with the runtime's /dev, /proc mounts on it; from the host mount namespace the same
    /// directory lacks them. If the container has already pivoted (the rootfs path does not
    /// exist there), `/proc/PID/root` itself is the container root.
    pub fn for_pid(pid: i32, rootfs: &Path) -> Result<Self> {
        let proc_root = PathBuf::from(format!("/proc/{pid}/root"));
        let pr = ContainerRoot::open(&proc_root)?;
        let rel = rootfs.to_string_lossy().to_string();
        match pr.resolve(&rel, OFlags::DIRECTORY) {
            Ok(fd) => Ok(ContainerRoot { fd, shown: proc_root.join(rootfs.strip_prefix("/").unwrap_or(rootfs)) }),
            Err(InjectError::Container { source, .. }) if source.raw_os_error() == Some(libc::ENOENT) => Ok(pr),
            Err(e) => Err(e),
        }
    }

    /// The root's fd (`O_PATH`, directory).
    pub fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The root as shown in messages.
    pub fn shown(&self) -> &Path {
        &self.shown
    }

    fn cerr(&self, op: &'static str, path: &str, e: Errno) -> InjectError {
        InjectError::Container { op, path: path.to_string(), root: self.shown.clone(), source: e.into() }
    }

    fn refused(&self, path: &str, reason: impl Into<String>) -> InjectError {
        InjectError::Refused { path: path.to_string(), root: self.shown.clone(), reason: reason.into() }
    }

    /// Resolves `path` (container path; absolute or relative to the root) inside the root and
    /// opens it `O_PATH | O_CLOEXEC | extra`. Symlinks are followed but clamped at the root;
    /// magic links are refused (ELOOP).
    pub fn resolve(&self, path: &str, extra: OFlags) -> Result<OwnedFd> {
        let comps = components(path)?;
        let rel = if comps.is_empty() { ".".to_string() } else { comps.join("/") };
        self.resolve_rel(&rel, extra).map_err(|e| self.cerr("resolve", path, e))
    }

    /// Opens `path` inside the root with `flags` (not `O_PATH`: for reading a file or listing a
    /// directory), resolved as [`ContainerRoot::resolve`] resolves it; `O_CLOEXEC` is added.
    pub fn open_in(&self, path: &str, flags: OFlags) -> Result<OwnedFd> {
        let comps = components(path)?;
        let rel = if comps.is_empty() { ".".to_string() } else { comps.join("/") };
        self.openat2(&rel, flags | OFlags::CLOEXEC).map_err(|e| self.cerr("open", path, e))
    }

    /// Opens `path` for reading when it is a regular file, and only then: resolved inside the
    /// root to an `O_PATH` descriptor (as [`ContainerRoot::resolve`]; a symlink at the final
    /// component is followed inside the root when `follow`, else it counts as not a regular
    /// file), checked with `fstat` on that descriptor, then reopened read-only and non-blocking
    /// through it (`/proc/thread-self/fd/N`). Returns the file and its length in bytes.
    ///
    /// Errors: [`InjectError::Container`] when it cannot be resolved (ENOENT for a missing file),
    /// [`InjectError::NotRegular`] naming the type found when it is not a regular file (a device
    /// node, a FIFO, a socket, a directory, an unfollowed symlink): that was never opened.
    pub fn open_regular(&self, path: &str, follow: bool) -> Result<(std::fs::File, u64)> {
        let extra = if follow { OFlags::empty() } else { OFlags::NOFOLLOW };
        let fd = self.resolve(path, extra)?;
        self.reopen_regular(fd, path)
    }

    /// [`ContainerRoot::open_regular`] for the entry `name` of the directory `dir` (a descriptor
    /// resolved inside this root; `shown`: its container path, for messages), never following a
    /// symlink there.
    pub fn open_regular_at(&self, dir: BorrowedFd<'_>, name: &str, shown: &str) -> Result<(std::fs::File, u64)> {
        let fd = rustix::fs::openat(dir, name, OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty())
            .map_err(|e| self.cerr("open", shown, e))?;
        self.reopen_regular(fd, shown)
    }

    fn reopen_regular(&self, fd: OwnedFd, shown: &str) -> Result<(std::fs::File, u64)> {
        let st = rustix::fs::fstat(&fd).map_err(|e| self.cerr("stat", shown, e))?;
        let ft = FileType::from_raw_mode(st.st_mode);
        if ft != FileType::RegularFile {
            return Err(InjectError::NotRegular { path: shown.to_string(), root: self.shown.clone(), file_type: ft });
        }
        let file = self.reopen_same(fd.as_fd(), &st, OFlags::RDONLY, shown)?;
        Ok((file.into(), st.st_size as u64))
    }

    /// [`reopen`] of `fd` (whose `fstat` is `st`), checking that the file opened is that inode.
    fn reopen_same(&self, fd: BorrowedFd<'_>, st: &rustix::fs::Stat, flags: OFlags, shown: &str) -> Result<OwnedFd> {
        let file = reopen(fd, flags).map_err(|e| self.cerr("open", shown, e))?;
        let again = rustix::fs::fstat(&file).map_err(|e| self.cerr("stat", shown, e))?;
        if (again.st_dev, again.st_ino) != (st.st_dev, st.st_ino) {
            return Err(self.refused(shown, "reopened as another file (is /proc a procfs?): not used"));
        }
        Ok(file)
    }

    fn resolve_rel(&self, rel: &str, extra: OFlags) -> rustix::io::Result<OwnedFd> {
        self.openat2(rel, OFlags::PATH | OFlags::CLOEXEC | extra)
    }

    fn openat2(&self, rel: &str, flags: OFlags) -> rustix::io::Result<OwnedFd> {
        let how = ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS;
        let mut tries = 0;
        loop {
            // openat2 returns EAGAIN when a rename elsewhere raced with a `..` walk; retrying is
            // what openat2(2) asks callers to do.
            match rustix::fs::openat2(&self.fd, rel, flags, Mode::empty(), how) {
                Err(Errno::AGAIN) if tries < 16 => tries += 1,
                r => return r,
            }
        }
    }

    fn check_fs(&self, fd: BorrowedFd<'_>, path: &str) -> Result<()> {
        let st = rustix::fs::fstatfs(fd).map_err(|e| self.cerr("statfs", path, e))?;
        let t = st.f_type as u64;
        if let Some((_, name)) = REFUSED_FS.iter().find(|(m, _)| *m == t) {
            return Err(self.refused(path, format!("resolves onto {name}; actk creates nothing there")));
        }
        Ok(())
    }

    /// `mkdir -p` inside the root; returns an `O_PATH` fd of the directory. Each missing
    /// component is created with `mkdirat(parent_fd, name, 0755)` where `parent_fd` was resolved
    /// inside the root. A component that is a dangling symlink or not a directory is refused.
    pub fn mkdir_all(&self, path: &str) -> Result<OwnedFd> {
        let comps = components(path)?;
        let mut cur = self.resolve_rel(".", OFlags::DIRECTORY).map_err(|e| self.cerr("resolve", "/", e))?;
        for i in 0..comps.len() {
            let prefix = comps[..=i].join("/");
            let shown = format!("/{prefix}");
            match self.resolve_rel(&prefix, OFlags::DIRECTORY) {
                Ok(fd) => cur = fd,
                Err(Errno::NOENT) => {
                    self.check_fs(cur.as_fd(), &shown)?;
                    match rustix::fs::mkdirat(&cur, comps[i], Mode::from_raw_mode(0o755)) {
                        Ok(()) | Err(Errno::EXIST) => {}
                        Err(e) => return Err(self.cerr("mkdir", &shown, e)),
                    }
                    cur = match self.resolve_rel(&prefix, OFlags::DIRECTORY) {
                        Ok(fd) => fd,
                        Err(Errno::NOENT) => {
                            return Err(self.refused(&shown, "is a dangling symlink; remove it from the image"));
                        }
                        Err(Errno::NOTDIR) => return Err(self.refused(&shown, "is not a directory")),
                        Err(e) => return Err(self.cerr("resolve", &shown, e)),
                    };
                }
                Err(Errno::NOTDIR) => return Err(self.refused(&shown, "is not a directory")),
                Err(e) => return Err(self.cerr("resolve", &shown, e)),
            }
        }
        Ok(cur)
    }

    /// The resolved parent directory (created if missing) and the final name of `path`.
    pub fn parent_of<'p>(&self, path: &'p str) -> Result<(OwnedFd, &'p str)> {
        let comps = components(path)?;
        let Some((name, dirs)) = comps.split_last() else {
            return Err(InjectError::InvalidPath { path: path.to_string(), reason: "names the root itself" });
        };
        let parent = self.mkdir_all(&dirs.join("/"))?;
        self.check_fs(parent.as_fd(), path)?;
        Ok((parent, name))
    }

    /// Creates (if needed) a mount target at `path` and returns an `O_PATH` fd of it. The final
    /// component is never followed: a symlink there is removed and replaced by an empty file
    /// (mode 0644) or a directory (0755). An existing non-directory is a valid file target; a
    /// directory where a file is wanted (or the reverse) is refused.
    pub fn create_target(&self, path: &str, kind: TargetKind) -> Result<OwnedFd> {
        let (parent, name) = self.parent_of(path)?;
        for _ in 0..8 {
            match rustix::fs::statat(&parent, name, AtFlags::SYMLINK_NOFOLLOW) {
                Err(Errno::NOENT) => {
                    let r = match kind {
                        TargetKind::Dir => rustix::fs::mkdirat(&parent, name, Mode::from_raw_mode(0o755)),
                        TargetKind::File => rustix::fs::openat(
                            &parent,
                            name,
                            OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::WRONLY | OFlags::CLOEXEC,
                            Mode::from_raw_mode(0o644),
                        )
                        .map(drop),
                    };
                    match r {
                        Ok(()) | Err(Errno::EXIST) => continue,
                        Err(e) => return Err(self.cerr("create mount target", path, e)),
                    }
                }
                Err(e) => return Err(self.cerr("stat", path, e)),
                Ok(st) => {
                    let ft = FileType::from_raw_mode(st.st_mode);
                    match (ft, kind) {
                        (FileType::Symlink, _) => match rustix::fs::unlinkat(&parent, name, AtFlags::empty()) {
                            Ok(()) | Err(Errno::NOENT) => continue,
                            Err(e) => return Err(self.cerr("remove symlink at mount target", path, e)),
                        },
                        (FileType::Directory, TargetKind::File) => {
                            return Err(
                                self.refused(path, "is a directory in the image, but a file is to be mounted there")
                            );
                        }
                        (FileType::Directory, TargetKind::Dir) => {}
                        (_, TargetKind::Dir) => {
                            return Err(
                                self.refused(path, "is a file in the image, but a directory is to be mounted there")
                            );
                        }
                        (_, TargetKind::File) => {}
                    }
                    let fd = rustix::fs::openat(
                        &parent,
                        name,
                        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                        Mode::empty(),
                    )
                    .map_err(|e| self.cerr("open mount target", path, e))?;
                    // Someone may have swapped the entry between stat and open: re-check the inode we hold.
                    let st2 = rustix::fs::fstat(&fd).map_err(|e| self.cerr("stat", path, e))?;
                    if FileType::from_raw_mode(st2.st_mode) == FileType::Symlink
                        || (FileType::from_raw_mode(st2.st_mode) == FileType::Directory) != (kind == TargetKind::Dir)
                    {
                        continue;
                    }
                    return Ok(fd);
                }
            }
        }
        Err(self
            .refused(path, "kept changing while actk created the mount target (a racing process in the container?)"))
    }

    /// Writes a small regular file at `path` (parents created), replacing a symlink at the final
    /// component instead of following it, and refusing anything that is not a regular file
    /// without opening it: an existing entry is looked at through an `O_PATH | O_NOFOLLOW`
    /// descriptor and only a regular file is reopened for writing through it; a missing one is
    /// created `O_EXCL`, which never opens what a racing process put there meanwhile.
    pub fn write_file(&self, path: &str, contents: &[u8], mode: u32) -> Result<()> {
        let (parent, name) = self.parent_of(path)?;
        for _ in 0..8 {
            let fd = match rustix::fs::openat(
                &parent,
                name,
                OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            ) {
                Err(Errno::NOENT) => match rustix::fs::openat(
                    &parent,
                    name,
                    OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::from_raw_mode(mode),
                ) {
                    Ok(fd) => fd,
                    Err(Errno::EXIST) => continue,
                    Err(e) => return Err(self.cerr("create", path, e)),
                },
                Err(e) => return Err(self.cerr("open for writing", path, e)),
                Ok(existing) => {
                    let st = rustix::fs::fstat(&existing).map_err(|e| self.cerr("stat", path, e))?;
                    match FileType::from_raw_mode(st.st_mode) {
                        // A symlink: removed, a real file written in its place.
                        FileType::Symlink => match rustix::fs::unlinkat(&parent, name, AtFlags::empty()) {
                            Ok(()) | Err(Errno::NOENT) => continue,
                            Err(e) => return Err(self.cerr("remove symlink", path, e)),
                        },
                        FileType::RegularFile => self.reopen_same(existing.as_fd(), &st, OFlags::WRONLY, path)?,
                        ft => {
                            return Err(
                                self.refused(path, format!("exists and is {}, not a regular file", type_name(ft)))
                            );
                        }
                    }
                }
            };
            rustix::fs::ftruncate(&fd, 0).map_err(|e| self.cerr("truncate", path, e))?;
            let mut off = 0;
            while off < contents.len() {
                off += rustix::io::write(&fd, &contents[off..]).map_err(|e| self.cerr("write", path, e))?;
            }
            return Ok(());
        }
        Err(self.refused(path, "kept changing while actk wrote it"))
    }

    /// Whether `path` exists inside the root (following symlinks inside the root).
    pub fn exists(&self, path: &str) -> bool {
        self.resolve(path, OFlags::empty()).is_ok()
    }
}

/// Splits a container path into its normal components. Refuses `..` (the resolver would clamp
/// it, but a CDI edit naming `..` is a mistake worth reporting) and NUL.
pub(crate) fn components(path: &str) -> Result<Vec<&str>> {
    if path.contains('\0') {
        return Err(InjectError::InvalidPath { path: path.to_string(), reason: "contains a NUL byte" });
    }
    let mut out = Vec::new();
    for c in path.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                return Err(InjectError::InvalidPath { path: path.to_string(), reason: "contains a `..` component" });
            }
            c => out.push(c),
        }
    }
    Ok(out)
}

/// `/proc/self/fd/N` for an fd: the only way to chmod an `O_PATH` fd without re-resolving a path.
pub(crate) fn proc_fd(fd: BorrowedFd<'_>) -> String {
    format!("/proc/self/fd/{}", fd.as_raw_fd())
}

/// Opens the file of the `O_PATH` descriptor `fd` again with `flags` (plus `O_NONBLOCK`,
/// `O_NOCTTY`, `O_CLOEXEC`) through `/proc/thread-self/fd/N`: the inode `fd` names, not a
/// path that could name another one by now. Callers check the type on `fd` first.
fn reopen(fd: BorrowedFd<'_>, flags: OFlags) -> rustix::io::Result<OwnedFd> {
    let p = format!("/proc/thread-self/fd/{}", fd.as_raw_fd());
    rustix::fs::open(p.as_str(), flags | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC, Mode::empty())
}

/// A file type in words, for messages.
pub(crate) fn type_name(ft: FileType) -> &'static str {
    match ft {
        FileType::RegularFile => "a regular file",
        FileType::Directory => "a directory",
        FileType::Symlink => "a symlink",
        FileType::Fifo => "a FIFO",
        FileType::Socket => "a socket",
        FileType::CharacterDevice => "a character device",
        FileType::BlockDevice => "a block device",
        FileType::Unknown => "of an unknown type",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn root() -> (tempfile::TempDir, tempfile::TempDir, ContainerRoot) {
        // `outside` stands for the host: nothing may appear in it.
        let outside = tempfile::tempdir().unwrap();
        let base = tempfile::tempdir().unwrap();
        let r = ContainerRoot::open(base.path()).unwrap();
        (outside, base, r)
    }

    fn is_empty(d: &Path) -> bool {
        std::fs::read_dir(d).unwrap().next().is_none()
    }

    #[test]
    fn mkdir_all_creates_nested_dirs_inside_root() {
        let (_o, base, r) = root();
        r.mkdir_all("/usr/lib/x86_64-linux-gnu").unwrap();
        assert!(base.path().join("usr/lib/x86_64-linux-gnu").is_dir());
    }

    /// Field case F05: a relative library-dir symlink resolves inside the container root.
    #[test]
    fn f05_relative_lib_symlink_lands_in_its_target_inside_root() {
        let (_o, base, r) = root();
        std::fs::create_dir_all(base.path().join("usr/lib")).unwrap();
        symlink("usr/lib", base.path().join("lib")).unwrap();
        r.create_target("/lib/libcuda.so.1", TargetKind::File).unwrap();
        assert!(base.path().join("usr/lib/libcuda.so.1").is_file());
    }

    #[test]
    fn absolute_symlink_to_host_dir_is_clamped_inside_root() {
        let (outside, base, r) = root();
        std::fs::create_dir_all(base.path().join("usr")).unwrap();
        // usr/bin -> <host dir>: an absolute symlink is resolved against the container root.
        symlink(outside.path(), base.path().join("usr/bin")).unwrap();
        // The same path does not exist inside the root: refused as dangling, nothing on the host.
        let e = r.create_target("/usr/bin/nvidia-smi", TargetKind::File).unwrap_err();
        assert!(e.to_string().contains("dangling"), "{e}");
        assert!(is_empty(outside.path()), "a file was created on the host");
        // Once it exists inside the root, the target lands there.
        let inside_dir = base.path().join(outside.path().strip_prefix("/").unwrap());
        std::fs::create_dir_all(&inside_dir).unwrap();
        r.create_target("/usr/bin/nvidia-smi", TargetKind::File).unwrap();
        assert!(is_empty(outside.path()), "a file was created on the host");
        let inside = inside_dir.join("nvidia-smi");
        assert!(inside.is_file(), "expected {inside:?}");
    }

    #[test]
    fn dotdot_symlink_chain_stays_inside_root() {
        let (_o, base, r) = root();
        std::fs::create_dir_all(base.path().join("usr")).unwrap();
        symlink("../../../../../../..", base.path().join("usr/bin")).unwrap();
        r.create_target("/usr/bin/actk-probe", TargetKind::File).unwrap();
        assert!(base.path().join("actk-probe").is_file());
        assert!(!Path::new("/actk-probe").exists());
    }

    #[test]
    fn proc_self_root_magic_link_is_refused() {
        let (_o, base, r) = root();
        // A symlink to the container's /proc, whose `self/root` is a magic link to "/" of the caller.
        std::fs::create_dir_all(base.path().join("usr")).unwrap();
        symlink("/proc/self/root/tmp", base.path().join("usr/bin")).unwrap();
        // Inside the root that is <root>/proc/self/root/tmp: absent here, so refused as dangling.
        let err = r.create_target("/usr/bin/x", TargetKind::File).unwrap_err();
        assert!(err.to_string().contains("/usr/bin"), "{err}");
        // Through a real procfs the same walk meets the magic link `root`: refused (ELOOP).
        let procroot = ContainerRoot::open(Path::new("/proc/self")).unwrap();
        let e = procroot.resolve("root/tmp", OFlags::empty()).unwrap_err();
        assert!(e.to_string().contains("resolve"), "{e}");
    }

    #[test]
    fn final_symlink_to_host_file_is_replaced_not_followed() {
        let (outside, base, r) = root();
        let host_file = outside.path().join("shadow");
        std::fs::write(&host_file, b"secret").unwrap();
        std::fs::create_dir_all(base.path().join("usr/lib")).unwrap();
        symlink(&host_file, base.path().join("usr/lib/libcuda.so.1")).unwrap();
        r.write_file("/usr/lib/libcuda.so.1", b"x", 0o644).unwrap();
        assert_eq!(std::fs::read(&host_file).unwrap(), b"secret");
        let meta = std::fs::symlink_metadata(base.path().join("usr/lib/libcuda.so.1")).unwrap();
        assert!(meta.file_type().is_file());
        symlink(&host_file, base.path().join("usr/lib/libnvidia-ml.so.1")).unwrap();
        let fd = r.create_target("/usr/lib/libnvidia-ml.so.1", TargetKind::File).unwrap();
        assert!(FileType::from_raw_mode(rustix::fs::fstat(&fd).unwrap().st_mode) == FileType::RegularFile);
        assert_eq!(std::fs::read(&host_file).unwrap(), b"secret");
    }

    #[test]
    fn directory_where_file_is_wanted_is_refused_with_path() {
        let (_o, base, r) = root();
        std::fs::create_dir_all(base.path().join("usr/bin/nvidia-smi")).unwrap();
        let e = r.create_target("/usr/bin/nvidia-smi", TargetKind::File).unwrap_err();
        assert!(e.to_string().contains("\"/usr/bin/nvidia-smi\"") && e.to_string().contains("is a directory"), "{e}");
    }

    #[test]
    fn dangling_dir_symlink_is_refused() {
        let (_o, base, r) = root();
        symlink("/nonexistent/dir", base.path().join("lib64")).unwrap();
        let e = r.mkdir_all("/lib64/x").unwrap_err();
        assert!(e.to_string().contains("dangling symlink"), "{e}");
    }

    #[test]
    fn dotdot_in_request_is_an_error() {
        let (_o, _b, r) = root();
        let e = r.mkdir_all("/usr/../etc").unwrap_err();
        assert!(e.to_string().contains("`..`"), "{e}");
    }

    #[test]
    fn refuses_to_create_on_procfs() {
        let r = ContainerRoot::open(Path::new("/proc")).unwrap();
        let e = r.create_target("/actk-x", TargetKind::File).unwrap_err();
        assert!(e.to_string().contains("procfs"), "{e}");
    }

    #[test]
    fn fifo_at_write_target_does_not_block_and_is_refused() {
        let (_o, base, r) = root();
        std::fs::create_dir_all(base.path().join("etc")).unwrap();
        rustix::fs::mknodat(rustix::fs::CWD, base.path().join("etc/x"), FileType::Fifo, Mode::from_raw_mode(0o644), 0)
            .unwrap();
        let e = r.write_file("/etc/x", b"y", 0o644).unwrap_err();
        assert!(e.to_string().contains("not a regular file") || e.to_string().contains("open"), "{e}");
    }

    /// Issue 29, finding 4: a device node (`c 1 11`, as the hostile image ships), a FIFO, a
    /// socket, or a symlink to one of them is never opened for reading (no `IN_OPEN` on it, no
    /// blocking on the FIFO); a regular file, directly or through a symlink inside the root, is.
    #[test]
    fn open_regular_opens_regular_files_only() {
        use actk_testsupport::hostile::{OpenWatch, node};
        let (_o, base, r) = root();
        let etc = base.path().join("etc");
        std::fs::create_dir_all(&etc).unwrap();
        node(&etc.join("dev"), FileType::CharacterDevice).unwrap();
        node(&etc.join("fifo"), FileType::Fifo).unwrap();
        let _sock = std::os::unix::net::UnixListener::bind(etc.join("sock")).unwrap();
        std::fs::write(etc.join("file"), b"contents").unwrap();
        symlink("/etc/dev", etc.join("link-dev")).unwrap();
        symlink("fifo", etc.join("link-fifo")).unwrap();
        symlink("/etc/file", etc.join("link-file")).unwrap();
        let watch =
            OpenWatch::new(&[&etc.join("dev"), &etc.join("fifo"), &etc.join("sock"), &etc.join("file")]).unwrap();
        for (path, follow, what) in [
            ("/etc/dev", true, "a character device"),
            ("/etc/fifo", true, "a FIFO"),
            ("/etc/sock", true, "a socket"),
            ("/etc/link-dev", true, "a character device"),
            ("/etc/link-fifo", true, "a FIFO"),
            ("/etc/link-file", false, "a symlink"),
            ("/etc", true, "a directory"),
        ] {
            let e = r.open_regular(path, follow).unwrap_err();
            assert!(matches!(e, InjectError::NotRegular { .. }), "{path}: {e}");
            assert!(e.to_string().contains(&format!("is {what}, not a regular file: not opened")), "{path}: {e}");
        }
        let dir = r.resolve("/etc", OFlags::DIRECTORY).unwrap();
        let e = r.open_regular_at(dir.as_fd(), "link-file", "/etc/link-file").unwrap_err();
        assert!(e.to_string().contains("is a symlink"), "{e}");
        assert_eq!(watch.opened(), Vec::<PathBuf>::new(), "a node was opened");
        for (file, len) in [
            r.open_regular("/etc/link-file", true).unwrap(),
            r.open_regular_at(dir.as_fd(), "file", "/etc/file").unwrap(),
        ] {
            assert_eq!(len, 8);
            assert_eq!(std::io::read_to_string(file).unwrap(), "contents");
        }
        assert_eq!(watch.opened(), vec![etc.join("file")], "the watch sees real opens");
    }

    /// A drop-in path that is a device node is refused without being opened for writing.
    #[test]
    fn write_file_never_opens_a_device_node() {
        use actk_testsupport::hostile::{OpenWatch, node};
        let (_o, base, r) = root();
        let d = base.path().join("etc/ld.so.conf.d");
        std::fs::create_dir_all(&d).unwrap();
        node(&d.join("00-actk.conf"), FileType::CharacterDevice).unwrap();
        let watch = OpenWatch::new(&[&d.join("00-actk.conf")]).unwrap();
        let e = r.write_file("/etc/ld.so.conf.d/00-actk.conf", b"/x\n", 0o644).unwrap_err();
        assert!(e.to_string().contains("exists and is a character device, not a regular file"), "{e}");
        assert_eq!(watch.opened(), Vec::<PathBuf>::new());
        // A regular file there is rewritten in place (same inode), a missing one created.
        std::fs::write(d.join("x.conf"), b"old contents\n").unwrap();
        let ino = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(d.join("x.conf")).unwrap());
        r.write_file("/etc/ld.so.conf.d/x.conf", b"new\n", 0o644).unwrap();
        assert_eq!(std::fs::read(d.join("x.conf")).unwrap(), b"new\n");
        assert_eq!(std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(d.join("x.conf")).unwrap()), ino);
        r.write_file("/etc/ld.so.conf.d/y.conf", b"y\n", 0o644).unwrap();
        assert_eq!(std::fs::read(d.join("y.conf")).unwrap(), b"y\n");
    }
}
