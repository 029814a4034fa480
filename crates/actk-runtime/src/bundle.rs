//! Writing config.json back into the OCI bundle atomically: a temporary file in the bundle
//! directory (same filesystem), the original's permissions and owner, rename over the original.
//! A reader (runc) sees the old or the new file, never half.
//!
//! No fsync: the rename is atomic for every reader without it, and durability across a crash is
//! worth nothing here (a bundle does not outlive its container, whose state in /run is gone after
//! a reboot anyway), while two fsyncs cost 5-10 ms per container start on a disk-backed bundle
//! directory, several times all the rest of the shim's work (benches/runtime-bench.sh).

use anyhow::{Context, Result};
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Prefix of the temporary file's name (a dot file next to config.json).
pub const TEMP_PREFIX: &str = ".config.json.actk-";

/// Replaces `path` with `value` serialised as compact JSON (a `serde_json::Value` keeps its
/// field order), atomically. Errors name the step and the file; on any error after the
/// temporary file was made it is removed, and `path` is as it was.
pub fn write_atomic<T: serde::Serialize + ?Sized>(path: &Path, value: &T) -> Result<()> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let meta = std::fs::metadata(path).with_context(|| format!("cannot stat {}", path.display()))?;
    // Room for a typical edited config.json up front (tens of KB): growing by doubling copied
    // it several times and touched fresh heap pages at each step. Untouched capacity costs
    // nothing (it is below malloc's mmap threshold and not written).
    let mut bytes = Vec::with_capacity(64 * 1024);
    serde_json::to_writer(&mut bytes, value).context("cannot serialise config.json")?;
    let (tmp, mut f) = create_temp(dir)?;
    let written = (|| -> Result<()> {
        f.write_all(&bytes).with_context(|| format!("cannot write {}", tmp.display()))?;
        f.set_permissions(std::fs::Permissions::from_mode(meta.mode() & 0o7777))
            .with_context(|| format!("cannot set permissions on {}", tmp.display()))?;
        // Keep the owner (rootless engines own their bundles); only possible or needed as root.
        if rustix::process::geteuid().is_root() {
            std::os::unix::fs::fchown(&f, Some(meta.uid()), Some(meta.gid()))
                .with_context(|| format!("cannot set the owner of {}", tmp.display()))?;
        }
        std::fs::rename(&tmp, path).with_context(|| format!("cannot replace {}", path.display()))
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// A new file `TEMP_PREFIX` + 16 hex digits in `dir`, mode 0600, made with `O_CREAT|O_EXCL`
/// (never an existing file, and never through a symlink someone left under that name); a name
/// that exists is tried again with another suffix. The suffix is SipHash of the process id under
/// a fresh `RandomState` (std's per-process random keys, advanced for each state): not the
/// `tempfile` crate, whose name generator seeds itself from `std::thread::current()`, which on
/// musl sets up musl's own malloc and a pthread key for the thread handle, six system calls and
/// two page faults per create that nothing else needs (issue 31). Errors: the directory
/// cannot be written, or 16 names in a row exist.
fn create_temp(dir: &Path) -> Result<(PathBuf, File)> {
    use std::hash::{BuildHasher, Hasher};
    create_temp_from(
        dir,
        std::iter::repeat_with(|| {
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u32(std::process::id());
            h.finish()
        }),
    )
}

/// [`create_temp`] with the name suffixes given (the first 16 are tried).
fn create_temp_from(dir: &Path, suffixes: impl IntoIterator<Item = u64>) -> Result<(PathBuf, File)> {
    for suffix in suffixes.into_iter().take(16) {
        let tmp = dir.join(format!("{TEMP_PREFIX}{suffix:016x}"));
        match actk_core::rawfile::create_new(&tmp, 0o600) {
            Ok(f) => return Ok((tmp, f)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => {
                return Err(e)
                    .with_context(|| format!("cannot create a temporary file in the bundle {}", dir.display()));
            }
        }
    }
    anyhow::bail!("cannot create a temporary file in the bundle {}: 16 names in a row exist", dir.display())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_content_and_keeps_mode() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("config.json");
        std::fs::write(&p, "{\"a\":1}").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o640)).unwrap();
        write_atomic(&p, &serde_json::json!({"b": 2, "a": 1})).unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "{\"b\":2,\"a\":1}");
        assert_eq!(std::fs::metadata(&p).unwrap().mode() & 0o7777, 0o640);
        let left: Vec<_> = std::fs::read_dir(d.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left, vec![std::ffi::OsString::from("config.json")], "no temporary file left behind");
    }

    #[test]
    fn a_failed_replace_leaves_no_temporary_file_and_the_target_as_it_was() {
        let d = tempfile::tempdir().unwrap();
        // rename(2) of a file over a non-empty directory fails (EISDIR/ENOTEMPTY) after the
        // temporary file was written.
        let p = d.path().join("config.json");
        std::fs::create_dir(&p).unwrap();
        std::fs::write(p.join("keep"), "x").unwrap();
        let e = write_atomic(&p, &serde_json::json!({"a": 1})).unwrap_err();
        assert!(format!("{e:#}").contains("cannot replace"), "{e:#}");
        let left: Vec<_> = std::fs::read_dir(d.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left, vec![std::ffi::OsString::from("config.json")], "the temporary file was removed");
        assert_eq!(std::fs::read_to_string(p.join("keep")).unwrap(), "x");
    }

    #[test]
    fn temporary_names_differ_and_files_start_private() {
        let d = tempfile::tempdir().unwrap();
        let mut names = std::collections::BTreeSet::new();
        for _ in 0..200 {
            let (p, f) = create_temp(d.path()).unwrap();
            assert_eq!(f.metadata().unwrap().mode() & 0o7777, 0o600);
            let name = p.file_name().unwrap().to_str().unwrap().to_string();
            assert!(name.starts_with(TEMP_PREFIX) && name.len() == TEMP_PREFIX.len() + 16, "{name}");
            assert!(names.insert(name), "a name came twice");
        }
    }

    #[test]
    fn never_writes_through_a_symlink_or_file_already_there() {
        // A hostile bundle directory holding the next names: a symlink to a host file and a
        // file. O_EXCL refuses both, the third name is used, and neither is written.
        let d = tempfile::tempdir().unwrap();
        let victim = d.path().join("victim");
        std::fs::write(&victim, "host").unwrap();
        let bundle = d.path().join("bundle");
        std::fs::create_dir(&bundle).unwrap();
        let name = |n: u64| bundle.join(format!("{TEMP_PREFIX}{n:016x}"));
        std::os::unix::fs::symlink(&victim, name(1)).unwrap();
        std::os::unix::fs::symlink("/nonexistent/dangling", name(2)).unwrap();
        std::fs::write(name(3), "theirs").unwrap();
        let (p, mut f) = create_temp_from(&bundle, [1, 2, 3, 4]).unwrap();
        assert_eq!(p, name(4));
        f.write_all(b"edited").unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "host");
        assert!(!Path::new("/nonexistent/dangling").exists());
        assert_eq!(std::fs::read_to_string(name(3)).unwrap(), "theirs");
        // Only names that exist: an error that says so, nothing written.
        let e = create_temp_from(&bundle, [1, 2, 3]).unwrap_err();
        assert!(format!("{e:#}").contains("names in a row exist"), "{e:#}");
    }
}
