//! Writing config.json back into the OCI bundle atomically: a temporary file in the bundle
//! directory (same filesystem), the original's permissions and owner, rename over the original.
//! A reader (runc) sees the old or the new file, never half.
//!
//! No fsync: the rename is atomic for every reader without it, and durability across a crash is
//! worth nothing here (a bundle does not outlive its container, whose state in /run is gone after
//! a reboot anyway), while two fsyncs cost 5-10 ms per container start on a disk-backed bundle
//! directory, several times all the rest of the shim's work (benches/runtime-bench.sh).

use anyhow::{Context, Result};
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

/// Replaces `path` with `value` serialised as compact JSON (a `serde_json::Value` keeps its
/// field order), atomically.
pub fn write_atomic<T: serde::Serialize + ?Sized>(path: &Path, value: &T) -> Result<()> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let meta = std::fs::metadata(path).with_context(|| format!("cannot stat {}", path.display()))?;
    // Room for a typical edited config.json up front (tens of KB): growing by doubling copied
    // it several times and touched fresh heap pages at each step. Untouched capacity costs
    // nothing (it is below malloc's mmap threshold and not written).
    let mut bytes = Vec::with_capacity(64 * 1024);
    serde_json::to_writer(&mut bytes, value).context("cannot serialise config.json")?;
    let mut tmp = tempfile::Builder::new()
        .prefix(".config.json.actk-")
        .tempfile_in(dir)
        .with_context(|| format!("cannot create a temporary file in the bundle {}", dir.display()))?;
    tmp.write_all(&bytes).with_context(|| format!("cannot write {}", tmp.path().display()))?;
    let f = tmp.as_file();
    f.set_permissions(std::fs::Permissions::from_mode(meta.mode() & 0o7777))
        .with_context(|| format!("cannot set permissions on {}", tmp.path().display()))?;
    // Keep the owner (rootless engines own their bundles); only possible or needed as root.
    if rustix::process::geteuid().is_root() {
        std::os::unix::fs::fchown(f, Some(meta.uid()), Some(meta.gid()))
            .with_context(|| format!("cannot set the owner of {}", tmp.path().display()))?;
    }
    tmp.persist(path).map_err(|e| e.error).with_context(|| format!("cannot replace {}", path.display()))?;
    Ok(())
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
}
