//! Trusted input files: CDI spec files and oci-hooks(5) hooks.d files say what runs as root in
//! every container (a CDI hook, a hooks.d hook) and what a device name means, so actk reads one
//! only when nobody but root could have written it.
//!
//! A file is trusted when it is a regular file (a symlink is followed; its target is judged)
//! that is owned by root (or by the user actk runs as: a rootless engine's own files), not
//! writable by group or others, and whose directory (the spec or hooks directory it is listed
//! in, and the real directory of a symlink's target) is owned the same way and not writable by
//! group or others. Anything else is skipped with a warning that names the file and the reason;
//! the file is read from the descriptor that was checked, so a swap after the check reads nothing
//! else.
//!
//! podman and CRI-O users meet this when a spec was written by a non-root tool into a shared
//! directory: `chown root: FILE; chmod go-w FILE DIR` fixes it.
//!
//! Owners are judged as the host sees them. In a user namespace (a hook of a rootless engine, or
//! run inside a userns container) `stat` shows owners through the namespace's uid map: a mapped
//! owner is translated back to its host uid (`/proc/self/uid_map`) and must be host root or the
//! reader; an owner the namespace does not map (shown as the overflow uid, 65534) is a user
//! outside the namespace, whom nobody inside it can act for (no capability reaches an unmapped
//! uid), as host root is: such a file is trusted when its mode is. In the initial namespace the
//! map is the identity and only root (or the reader) is trusted.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Largest spec or hooks file read (a generated spec for 64 GPUs is about 100 KB).
pub const MAX_FILE_BYTES: u64 = 16 << 20;

/// Why a file or directory is not trusted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: not trusted: {reason}", .path.display())]
pub struct Untrusted {
    /// The file or directory at fault.
    pub path: PathBuf,
    /// What is wrong and how to fix it (`is owned by uid 65534, not root; chown root FILE`).
    pub reason: String,
}

/// Why a trusted file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The file (or its directory) is not trusted.
    #[error(transparent)]
    Untrusted(#[from] Untrusted),
    /// The file cannot be opened or read.
    #[error("{}: {source}", .path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

fn euid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// A uid as this process's user namespace shows it, translated to the host: `Some(host uid)`
/// when the namespace maps it, `None` when it is the overflow uid of an owner the namespace does
/// not map (see the module docs).
fn host_uid(shown: u32) -> Option<u32> {
    let map =
        crate::rawfile::read_to_string(Path::new("/proc/self/uid_map")).unwrap_or_else(|_| "0 0 4294967295".into());
    host_uid_in(&map, shown, overflow_uid())
}

fn overflow_uid() -> u32 {
    crate::rawfile::read_to_string(Path::new("/proc/sys/kernel/overflowuid"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(65534)
}

/// [`host_uid`] for a `uid_map` text (`inside outside count` lines, user_namespaces(7)).
fn host_uid_in(map: &str, shown: u32, overflow: u32) -> Option<u32> {
    for line in map.lines() {
        let f: Vec<u64> = line.split_whitespace().filter_map(|w| w.parse().ok()).collect();
        if let [inside, outside, count] = f[..]
            && (inside..inside + count).contains(&u64::from(shown))
        {
            return u32::try_from(outside + (u64::from(shown) - inside)).ok();
        }
    }
    if shown == overflow { None } else { Some(shown) }
}

/// Whether an owner (as `stat` shows it) may own a trusted file: the reader, host root, or a
/// user outside this user namespace.
fn owner_trusted(shown: u32) -> bool {
    shown == euid() || host_uid(shown).is_none_or(|h| h == 0)
}

/// Checks the owner and mode of a file or directory already stat'ed.
fn judge(path: &Path, md: &std::fs::Metadata, what: &str) -> Result<(), Untrusted> {
    let untrusted = |reason: String| Untrusted { path: path.to_path_buf(), reason };
    let uid = md.uid();
    if !owner_trusted(uid) {
        return Err(untrusted(format!(
            "{what} is owned by uid {uid}, not root; `chown root {}` if its content is yours",
            path.display()
        )));
    }
    let mode = md.mode() & 0o7777;
    if mode & 0o022 != 0 {
        let who = match (mode & 0o020 != 0, mode & 0o002 != 0) {
            (true, true) => "group and others",
            (true, false) => "its group",
            _ => "others",
        };
        return Err(untrusted(format!(
            "{what} is writable by {who} (mode {mode:04o}); `chmod go-w {}`",
            path.display()
        )));
    }
    Ok(())
}

/// Checks a directory that files are read from (a spec or hooks directory).
///
/// Errors: [`Untrusted`] naming the directory; a directory that cannot be stat'ed is
/// [`ReadError::Io`].
pub fn check_dir(dir: &Path) -> Result<(), ReadError> {
    let md = std::fs::metadata(dir).map_err(|source| ReadError::Io { path: dir.to_path_buf(), source })?;
    judge(dir, &md, "the directory")?;
    Ok(())
}

/// Reads `path` (listed in a directory already passed to [`check_dir`]) if it is trusted; see
/// the module docs. At most [`MAX_FILE_BYTES`] are read.
///
/// Errors: [`ReadError::Untrusted`] naming the file (or the directory of a symlink's target)
/// and why; [`ReadError::Io`] when it cannot be opened or read.
pub fn read(path: &Path) -> Result<Vec<u8>, ReadError> {
    let io = |source| ReadError::Io { path: path.to_path_buf(), source };
    // O_NONBLOCK: a FIFO dropped into a spec directory must not hang every container start.
    let f = std::fs::File::from(crate::rawfile::open_read(path, rustix::fs::OFlags::NONBLOCK).map_err(io)?);
    let md = f.metadata().map_err(io)?;
    if !md.is_file() {
        return Err(Untrusted { path: path.to_path_buf(), reason: "is not a regular file".into() }.into());
    }
    judge(path, &md, "the file")?;
    if std::fs::symlink_metadata(path).map_err(io)?.file_type().is_symlink() {
        // The target's own directory could let someone else replace it.
        let real = std::fs::canonicalize(path).map_err(io)?;
        if let Some(dir) = real.parent() {
            let dmd = std::fs::metadata(dir).map_err(|source| ReadError::Io { path: dir.to_path_buf(), source })?;
            judge(dir, &dmd, "the directory of the link's target").map_err(|mut e| {
                e.reason = format!("{} is a symlink to {}, and {}", path.display(), real.display(), e.reason);
                e
            })?;
        }
    }
    if md.len() > MAX_FILE_BYTES {
        return Err(Untrusted {
            path: path.to_path_buf(),
            reason: format!(
                "is {} bytes, more than the {MAX_FILE_BYTES} bytes a spec or hooks file may have",
                md.len()
            ),
        }
        .into());
    }
    crate::rawfile::read_regular(&f, md.len(), MAX_FILE_BYTES as usize).map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn chmod(p: &Path, mode: u32) {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn owners_are_judged_as_the_host_sees_them() {
        let initial = "         0          0 4294967295\n";
        assert_eq!(host_uid_in(initial, 0, 65534), Some(0));
        assert_eq!(host_uid_in(initial, 65534, 65534), Some(65534), "nobody is nobody on the host");
        // A container's user namespace: 0..65535 inside are 100000.. on the host.
        let userns = "0 100000 65536\n";
        assert_eq!(host_uid_in(userns, 0, 65534), Some(100_000), "the container's root is not the host's");
        assert_eq!(host_uid_in(userns, 65534, 65534), Some(165_534), "a mapped 65534 is mapped");
        // Rootless: 0 is the user 1000, the rest a subordinate range; host root is unmapped.
        let rootless = "0 1000 1\n1 100000 65536\n";
        assert_eq!(host_uid_in(rootless, 0, 65534), Some(1000));
        assert_eq!(host_uid_in("0 1000 1\n", 65534, 65534), None, "shown as overflow: outside the namespace");
    }

    #[test]
    fn modes_owners_and_directories() {
        let d = tempfile::tempdir().unwrap();
        chmod(d.path(), 0o755);
        let f = d.path().join("a.json");
        std::fs::write(&f, "{}").unwrap();
        chmod(&f, 0o644);
        check_dir(d.path()).unwrap();
        assert_eq!(read(&f).unwrap(), b"{}");
        chmod(&f, 0o664);
        let e = read(&f).unwrap_err().to_string();
        assert!(e.contains("a.json: not trusted: the file is writable by its group (mode 0664)"), "{e}");
        chmod(&f, 0o646);
        assert!(read(&f).unwrap_err().to_string().contains("writable by others"));
        chmod(&f, 0o644);
        chmod(d.path(), 0o777);
        let e = check_dir(d.path()).unwrap_err().to_string();
        assert!(e.contains("the directory is writable by group and others (mode 0777)"), "{e}");
        chmod(d.path(), 0o755);
        if euid() == 0 {
            std::os::unix::fs::chown(&f, Some(65534), None).unwrap();
            let e = read(&f).unwrap_err().to_string();
            assert!(e.contains("the file is owned by uid 65534, not root"), "{e}");
            std::os::unix::fs::chown(&f, Some(0), None).unwrap();
        }
        // A symlink to a file in a world-writable directory.
        let other = tempfile::tempdir().unwrap();
        chmod(other.path(), 0o1777);
        let target = other.path().join("real.json");
        std::fs::write(&target, "{}").unwrap();
        chmod(&target, 0o644);
        std::os::unix::fs::symlink(&target, d.path().join("link.json")).unwrap();
        let e = read(&d.path().join("link.json")).unwrap_err().to_string();
        assert!(e.contains("is a symlink to") && e.contains("writable by group and others"), "{e}");
        // A FIFO does not block and is refused.
        let fifo = d.path().join("fifo.json");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o644),
            0,
        )
        .unwrap();
        assert!(read(&fifo).unwrap_err().to_string().contains("not a regular file"));
    }
}
