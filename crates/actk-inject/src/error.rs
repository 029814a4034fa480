//! Errors of the injection library: each variant names the path (container path or host path),
//! the operation and the OS error, so that the message runc shows the user is enough to act on.
//! OS errors are `#[source]`s: print with the chain (anyhow's `{:#}`) to see them.

use std::path::PathBuf;

/// Result alias of this crate.
pub type Result<T, E = InjectError> = std::result::Result<T, E>;

/// Everything that can go wrong while injecting into a container.
#[derive(Debug, thiserror::Error)]
pub enum InjectError {
    /// A path given to the resolver is not absolute, or has a `..`/NUL component we refuse.
    #[error("container path {path:?} is invalid: {reason}")]
    InvalidPath {
        /// The path as given.
        path: String,
        /// Why it was refused.
        reason: &'static str,
    },
    /// A syscall on a path inside the container root failed.
    // The OS error is the `source`: printed by error chains (`{:#}` in the binaries), not here twice.
    #[error("{op} {path:?} inside container root {root}")]
    Container {
        /// The operation (`resolve`, `mkdir`, `mknod`, ...).
        op: &'static str,
        /// The container path.
        path: String,
        /// The container root as shown to the user.
        root: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The container image has something at a path that actk must not touch (a directory where a
    /// file must be mounted, a path on procfs/sysfs, a dangling symlink in a directory path).
    #[error("container path {path:?} inside {root}: {reason}")]
    Refused {
        /// The container path.
        path: String,
        /// The container root as shown to the user.
        root: PathBuf,
        /// What was found and why it is refused.
        reason: String,
    },
    /// Something in the image that actk would read is not a regular file (a device node, a FIFO,
    /// a socket, a directory): it is never opened (issue 29, finding 4).
    #[error("container path {path:?} inside {root} is {}, not a regular file: not opened", crate::root::type_name(*.file_type))]
    NotRegular {
        /// The container path.
        path: String,
        /// The container root as shown to the user.
        root: PathBuf,
        /// What it is.
        file_type: rustix::fs::FileType,
    },
    /// A syscall on a host path failed.
    #[error("{op} {path}")]
    Host {
        /// The operation.
        op: &'static str,
        /// The host path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A host file does not meet what actk requires of it (a mount source reached through a
    /// magic link, ...).
    #[error("host file {path}: {reason}")]
    HostRefused {
        /// The host path.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// A device node edit lacks something actk needs (type, major/minor and no host node to stat).
    #[error("device node {path:?}: {reason}")]
    DeviceNode {
        /// The container path of the node.
        path: String,
        /// Why.
        reason: String,
    },
    /// A cgroup could not be found or written.
    #[error("device cgroup of pid {pid}: {reason}")]
    Cgroup {
        /// The container's pid.
        pid: i32,
        /// Why.
        reason: String,
    },
    /// Attaching mounts in the container's mount namespace failed.
    #[error("bind mount {source_path} -> {target:?} in the mount namespace of pid {pid}: {error}")]
    Mount {
        /// The container's pid (or 0 for the caller's own namespace).
        pid: i32,
        /// Host source.
        source_path: PathBuf,
        /// Container target.
        target: String,
        /// The OS error.
        error: std::io::Error,
    },
    /// A CDI edit that a live container cannot take and that must not be dropped silently
    /// (`netDevices`, `intelRdt`: the runtime applies them when it creates the container).
    #[error("CDI edit {field} cannot be applied to a running container by a hook: {reason}")]
    NotInjectable {
        /// The CDI field (`netDevices`, `intelRdt`).
        field: &'static str,
        /// What to do instead.
        reason: String,
    },
}

impl InjectError {
    pub(crate) fn host(op: &'static str, path: impl Into<PathBuf>, e: impl Into<std::io::Error>) -> Self {
        InjectError::Host { op, path: path.into(), source: e.into() }
    }
}
