//! Writing CDI spec files atomically, so that an engine reading the spec directory never sees
//! a half-written spec: a temporary file in the same directory, written, set to mode 0644,
//! fsynced, then renamed over the target, and the directory fsynced.

use super::CdiError;
use super::spec::Spec;
use super::validate::Format;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The default file name of a spec: `<vendor>-<class>.<json|yaml>` (`nvidia.com-gpu.json`).
pub fn default_file_name(spec: &Spec, format: Format) -> String {
    let stem = spec.kind.replace('/', "-");
    match format {
        Format::Json => format!("{stem}.json"),
        Format::Yaml => format!("{stem}.yaml"),
    }
}

/// The spec as text: pretty JSON, or YAML, each ending with a newline.
pub fn to_text(spec: &Spec, format: Format) -> Result<String, CdiError> {
    let fail = |message: String| CdiError::Generate { kind: spec.kind.clone(), message };
    let mut text = match format {
        Format::Json => {
            serde_json::to_string_pretty(spec).map_err(|e| fail(format!("cannot serialise as JSON: {e}")))?
        }
        #[cfg(feature = "yaml")]
        Format::Yaml => serde_saphyr::to_string(spec).map_err(|e| fail(format!("cannot serialise as YAML: {e}")))?,
        #[cfg(not(feature = "yaml"))]
        Format::Yaml => return Err(fail(super::validate::NO_YAML.into())),
    };
    if !text.ends_with('\n') {
        text.push('\n');
    }
    Ok(text)
}

/// The spec as a spec file holds it: compact JSON (as the CNCF CDI library's `WriteSpec`
/// writes `.json` files, with `json.Marshal`), or YAML, each ending with a newline. Compact
/// because every container start that names a device of the file reads all of it: a 256-device
/// spec is half whitespace when indented, and skipping it was a tenth of a start's
/// instructions (issue 31). [`to_text`] gives the indented form for people.
pub fn to_file_text(spec: &Spec, format: Format) -> Result<String, CdiError> {
    if format != Format::Json {
        return to_text(spec, format);
    }
    let mut text = serde_json::to_string(spec).map_err(|e| CdiError::Generate {
        kind: spec.kind.clone(),
        message: format!("cannot serialise as JSON: {e}"),
    })?;
    text.push('\n');
    Ok(text)
}

/// Writes `spec` to exactly `path` as [`to_file_text`] (missing parent directories are created with mode 0755 under
/// any umask, [`create_dirs_0755`]), atomically,
/// with mode 0644. Errors: [`CdiError::Io`] naming the file or directory.
pub fn write_spec(spec: &Spec, path: &Path, format: Format) -> Result<(), CdiError> {
    let text = to_file_text(spec, format)?;
    let io = |p: &Path| {
        let p = p.to_path_buf();
        move |source| CdiError::Io { path: p, source }
    };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    create_dirs_0755(&dir).map_err(io(&dir))?;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "spec".into());
    // A name engines skip (no .json/.yaml suffix), unique per process and attempt.
    let tmp = dir.join(format!(".{name}.{}.{}.tmp", std::process::id(), unique()));
    let result = (|| {
        let mut f =
            std::fs::OpenOptions::new().write(true).create_new(true).mode(0o644).open(&tmp).map_err(io(&tmp))?;
        f.write_all(text.as_bytes()).map_err(io(&tmp))?;
        // The umask may have cleared bits of 0644; engines running as other users must read it.
        f.set_permissions(std::fs::Permissions::from_mode(0o644)).map_err(io(&tmp))?;
        f.sync_all().map_err(io(&tmp))?;
        std::fs::rename(&tmp, path).map_err(io(path))?;
        if let Ok(d) = std::fs::File::open(&dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Creates `dir` and its missing parents with mode 0755 whatever the umask (under `umask 077`
/// `create_dir_all` would make them 0700, and engines that read specs as another user, rootless
/// podman, could not list them). Directories that already exist keep their mode.
pub fn create_dirs_0755(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    let mut missing = Vec::new();
    let mut cur = Some(dir);
    while let Some(d) = cur.filter(|d| !d.as_os_str().is_empty()) {
        if d.is_dir() {
            break;
        }
        missing.push(d);
        cur = d.parent();
    }
    for d in missing.into_iter().rev() {
        match std::fs::DirBuilder::new().mode(0o755).create(d) {
            Ok(()) => std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755))?,
            // Made by a concurrent writer in the meantime: theirs, keep it.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && d.is_dir() => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Writes `spec` into directory `dir` under [`default_file_name`]; returns the file's path.
pub fn write_spec_in_dir(spec: &Spec, dir: &Path, format: Format) -> Result<PathBuf, CdiError> {
    let path = dir.join(default_file_name(spec, format));
    write_spec(spec, &path, format)?;
    Ok(path)
}

fn unique() -> u128 {
    static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    t.wrapping_mul(1000).wrapping_add(u128::from(n))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cdi::spec::{ContainerEdits, Device, DeviceNode};
    use crate::cdi::validate::read_spec_file;

    fn spec() -> Spec {
        Spec {
            cdi_version: "0.5.0".into(),
            kind: "vendor.com/dev".into(),
            devices: vec![Device {
                name: "0".into(),
                container_edits: ContainerEdits {
                    device_nodes: vec![DeviceNode {
                        path: "/dev/x0".into(),
                        node_type: Some("c".into()),
                        major: Some(1),
                        minor: Some(3),
                        file_mode: Some(0o666),
                        ..Default::default()
                    }],
                    ..Default::default()
                },
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn writes_json_and_yaml_atomically_with_mode_0644_and_reads_back() {
        let tmp = tempfile::tempdir().unwrap();
        for format in [Format::Json, Format::Yaml] {
            let path = write_spec_in_dir(&spec(), &tmp.path().join("cdi"), format).unwrap();
            let expected = if format == Format::Json { "vendor.com-dev.json" } else { "vendor.com-dev.yaml" };
            assert_eq!(path.file_name().unwrap(), expected);
            let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o644);
            assert_eq!(read_spec_file(&path).unwrap(), spec());
            if format == Format::Json {
                // One line, as the CDI library writes a .json spec; stdout's text is indented.
                let text = std::fs::read_to_string(&path).unwrap();
                assert_eq!(text.lines().count(), 1, "{text}");
                assert_eq!(text, to_file_text(&spec(), format).unwrap());
                assert!(to_text(&spec(), format).unwrap().contains("\n  \"kind\""));
            }
            // overwrite in place works and leaves no temporary files
            write_spec(&spec(), &path, format).unwrap();
        }
        let names: Vec<_> =
            std::fs::read_dir(tmp.path().join("cdi")).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names.len(), 2, "{names:?}");
    }

    #[test]
    fn unwritable_target_names_the_path() {
        let err = write_spec(&spec(), Path::new("/proc/actk-no/x.json"), Format::Json).unwrap_err().to_string();
        assert!(err.starts_with("/proc/actk-no"), "{err}");
    }
}
