//! Device nodes inside the container's /dev, created with `mknodat` relative to a parent fd
//! resolved inside the container root (OCI runtime-spec "Devices"; CDI SPEC.md "Device Nodes").

use crate::error::{InjectError, Result};
use crate::root::{ContainerRoot, proc_fd};
use actk_core::cdi::CdiDeviceNode;
use rustix::fd::AsFd;
use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;
use std::path::Path;

/// A fully specified device node: what the CDI edit said, completed from the host node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSpec {
    /// Container path (`/dev/nvidia0`).
    pub path: String,
    /// `'c'` (character) or `'b'` (block).
    pub kind: char,
    /// Major number.
    pub major: u32,
    /// Minor number.
    pub minor: u32,
    /// Permission bits of the node (`0o666`).
    pub mode: u32,
    /// Owner uid, when the edit sets one.
    pub uid: Option<u32>,
    /// Owner gid, when the edit sets one.
    pub gid: Option<u32>,
    /// cgroup access the node needs, any of `rwm` (default `rwm`).
    pub permissions: String,
}

/// What [`create_node`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeOutcome {
    /// The node was created.
    Created,
    /// A node of the same type and numbers was already there (created by the runtime).
    Existing,
    /// Something else was there (a file, a symlink, another node) and was replaced.
    Replaced,
    /// The host's node was bind-mounted there (a container with its own user namespace).
    BindMounted,
}

impl NodeSpec {
    /// Completes a CDI device node edit. Missing type/major/minor/mode are read from the host
    /// node: `hostPath` if given, else the container path under `host_root` (the host driver
    /// root, never the image).
    ///
    /// Errors: [`InjectError::DeviceNode`] when the numbers are missing and the host node cannot
    /// be read, or the type is not `c`/`b`.
    pub fn from_cdi(n: &CdiDeviceNode, host_root: &Path) -> Result<NodeSpec> {
        let err = |reason: String| InjectError::DeviceNode { path: n.path.clone(), reason };
        let host = match &n.host_path {
            Some(h) => std::path::PathBuf::from(h),
            None => host_root.join(n.path.trim_start_matches('/')),
        };
        let need_stat = n.major.is_none() || n.minor.is_none() || n.node_type.is_none() || n.file_mode.is_none();
        let st = if need_stat { Some(rustix::fs::stat(&host)) } else { None };
        let st_ok = st.as_ref().and_then(|s| s.as_ref().ok());
        let kind = match (n.node_type.as_deref(), st_ok) {
            (Some("c") | Some("u"), _) => 'c',
            (Some("b"), _) => 'b',
            (Some(other), _) => {
                return Err(err(format!("type {other:?} is not a character or block device (use c or b)")));
            }
            (None, Some(s)) => match FileType::from_raw_mode(s.st_mode) {
                FileType::CharacterDevice => 'c',
                FileType::BlockDevice => 'b',
                _ => return Err(err(format!("host node {} is not a device node", host.display()))),
            },
            (None, None) => {
                return Err(err(format!(
                    "no type/major/minor in the edit and host node {} cannot be read: {}",
                    host.display(),
                    st.map(|r| r.err().map(|e| e.to_string()).unwrap_or_default()).unwrap_or_default()
                )));
            }
        };
        let num = |v: Option<i64>, f: fn(u64) -> u32, what: &str| -> Result<u32> {
            match (v, st_ok) {
                (Some(v), _) => u32::try_from(v).map_err(|_| err(format!("{what} {v} is out of range"))),
                (None, Some(s)) => Ok(f(s.st_rdev)),
                (None, None) => {
                    Err(err(format!("no {what} in the edit and host node {} cannot be read", host.display())))
                }
            }
        };
        let major = num(n.major, rustix::fs::major, "major")?;
        let minor = num(n.minor, rustix::fs::minor, "minor")?;
        let mode = n.file_mode.map(|m| m & 0o7777).or(st_ok.map(|s| s.st_mode & 0o777)).unwrap_or(0o666);
        // Absent or empty: rwm (CDI SPEC.md).
        let permissions = n.permissions.clone().filter(|p| !p.is_empty()).unwrap_or_else(|| "rwm".into());
        if !permissions.chars().all(|c| "rwm".contains(c)) {
            return Err(err(format!("permissions {permissions:?} must be letters of \"rwm\"")));
        }
        Ok(NodeSpec { path: n.path.clone(), kind, major, minor, mode, uid: n.uid, gid: n.gid, permissions })
    }
}

/// Creates one device node in the container root. An existing node with the same type and
/// numbers is kept; any other non-directory entry (a symlink to a host file, a regular file, a
/// different node) is removed first, never followed. A directory there is refused.
pub fn create_node(root: &ContainerRoot, spec: &NodeSpec) -> Result<NodeOutcome> {
    let path = spec.path.as_str();
    let cerr = |op: &'static str, e: Errno| InjectError::Container {
        op,
        path: path.to_string(),
        root: root.shown().to_path_buf(),
        source: e.into(),
    };
    let (parent, name) = root.parent_of(path)?;
    let ft = if spec.kind == 'b' { FileType::BlockDevice } else { FileType::CharacterDevice };
    let dev = rustix::fs::makedev(spec.major, spec.minor);
    let mut replaced = false;
    for _ in 0..8 {
        match rustix::fs::statat(&parent, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) if FileType::from_raw_mode(st.st_mode) == ft && st.st_rdev == dev => {
                return Ok(if replaced { NodeOutcome::Replaced } else { NodeOutcome::Existing });
            }
            Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Directory => {
                return Err(InjectError::Refused {
                    path: path.to_string(),
                    root: root.shown().to_path_buf(),
                    reason: "is a directory; a device node is to be created there".into(),
                });
            }
            Ok(_) => {
                match rustix::fs::unlinkat(&parent, name, AtFlags::empty()) {
                    Ok(()) | Err(Errno::NOENT) => {}
                    Err(e) => return Err(cerr("remove existing entry for device node", e)),
                }
                replaced = true;
                continue;
            }
            Err(Errno::NOENT) => {}
            Err(e) => return Err(cerr("stat", e)),
        }
        match rustix::fs::mknodat(&parent, name, ft, Mode::from_raw_mode(spec.mode), dev) {
            Ok(()) => {}
            Err(Errno::EXIST) => continue,
            Err(e) => return Err(cerr("mknod", e)),
        }
        // mknod's mode is masked by the umask: set it exactly, on the inode we just made.
        let fd = rustix::fs::openat(&parent, name, OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty())
            .map_err(|e| cerr("open device node", e))?;
        let st = rustix::fs::fstat(&fd).map_err(|e| cerr("stat", e))?;
        if FileType::from_raw_mode(st.st_mode) != ft || st.st_rdev != dev {
            continue;
        }
        rustix::fs::chmod(proc_fd(fd.as_fd()), Mode::from_raw_mode(spec.mode)).map_err(|e| cerr("chmod", e))?;
        if spec.uid.is_some() || spec.gid.is_some() {
            rustix::fs::chownat(
                &fd,
                "",
                spec.uid.map(rustix::fs::Uid::from_raw),
                spec.gid.map(rustix::fs::Gid::from_raw),
                AtFlags::EMPTY_PATH,
            )
            .map_err(|e| cerr("chown", e))?;
        }
        return Ok(if replaced { NodeOutcome::Replaced } else { NodeOutcome::Created });
    }
    Err(InjectError::Refused {
        path: path.to_string(),
        root: root.shown().to_path_buf(),
        reason: "kept changing while actk created the device node".into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt, symlink};

    fn spec(path: &str, minor: u32) -> NodeSpec {
        NodeSpec {
            path: path.into(),
            kind: 'c',
            major: 1,
            minor,
            mode: 0o666,
            uid: None,
            gid: None,
            permissions: "rwm".into(),
        }
    }

    #[test]
    fn creates_node_with_exact_mode_and_numbers() {
        let base = tempfile::tempdir().unwrap();
        let r = ContainerRoot::open(base.path()).unwrap();
        assert_eq!(create_node(&r, &spec("/dev/nvidia0", 3)).unwrap(), NodeOutcome::Created);
        let m = std::fs::symlink_metadata(base.path().join("dev/nvidia0")).unwrap();
        assert!(m.file_type().is_char_device());
        assert_eq!(m.rdev(), rustix::fs::makedev(1, 3));
        assert_eq!(m.permissions().mode() & 0o777, 0o666);
        assert_eq!(create_node(&r, &spec("/dev/nvidia0", 3)).unwrap(), NodeOutcome::Existing);
    }

    #[test]
    fn symlink_to_host_node_is_replaced_not_followed() {
        let host = tempfile::tempdir().unwrap();
        let target = host.path().join("hostfile");
        std::fs::write(&target, b"keep").unwrap();
        let base = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(base.path().join("dev")).unwrap();
        symlink(&target, base.path().join("dev/nvidia1")).unwrap();
        assert_eq!(create_node(&r_open(base.path()), &spec("/dev/nvidia1", 5)).unwrap(), NodeOutcome::Replaced);
        assert_eq!(std::fs::read(&target).unwrap(), b"keep");
        assert!(std::fs::symlink_metadata(&target).unwrap().is_file());
        assert!(std::fs::symlink_metadata(base.path().join("dev/nvidia1")).unwrap().file_type().is_char_device());
    }

    #[test]
    fn dev_symlinked_to_host_dev_stays_inside_root() {
        let base = tempfile::tempdir().unwrap();
        symlink("/dev", base.path().join("dev")).unwrap();
        // /dev -> /dev resolves to <root>/dev, itself: a loop, so nothing can be created (ELOOP).
        let e = create_node(&r_open(base.path()), &spec("/dev/actk-hostile-test", 3)).unwrap_err();
        assert!(!Path::new("/dev/actk-hostile-test").exists());
        assert!(e.to_string().contains("/dev"), "{e}");
    }

    #[test]
    fn from_cdi_reads_numbers_from_host_node() {
        let n = CdiDeviceNode { path: "/dev/null".into(), ..Default::default() };
        let s = NodeSpec::from_cdi(&n, Path::new("/")).unwrap();
        assert_eq!((s.kind, s.major, s.minor, s.mode), ('c', 1, 3, 0o666));
        let bad = CdiDeviceNode { path: "/dev/none-such".into(), ..Default::default() };
        let e = NodeSpec::from_cdi(&bad, Path::new("/")).unwrap_err();
        assert!(e.to_string().contains("/dev/none-such"), "{e}");
    }

    fn r_open(p: &Path) -> ContainerRoot {
        ContainerRoot::open(p).unwrap()
    }
}
