//! The registry of CDI specs in the spec directories, and resolution of qualified device names
//! to container edits (CNCF container-device-interface SPEC.md, pkg/cdi cache semantics).
//!
//! - Spec directories are read in order (default `/etc/cdi`, then `/var/run/cdi`); each
//!   directory's index is its priority. Within a directory, files are read in name order; only
//!   `*.json` and `*.yaml` files count (as in pkg/cdi), other names and subdirectories are skipped.
//! - A device defined in a later (higher-priority) directory replaces the same qualified name
//!   from an earlier one. The same name defined twice in one directory is a conflict: the name
//!   is dropped and both files are reported.
//! - A file that does not parse, or whose spec-level part does not validate, is recorded with
//!   its errors and skipped; other files are unaffected. A device that does not validate (an
//!   unknown field, a wrong type, a broken rule in its own part) is recorded by name and left
//!   out alone: the file's other devices stay usable, and asking for the refused one says why
//!   ([`super::validate::usable_from_text`]). (The reference library refuses the whole file.)
//! - A file or directory that root does not own, or that group or others may write, is skipped
//!   the same way (crate::trusted: its hooks would run as root in every container).
//! - Resolving adds a spec's spec-level edits once, however many of its devices are asked for,
//!   then each device's edits, in request order; the result is de-duplicated.
//!
//! - A container start reads specs lazily ([`Registry::load_for_start`], issue 31): the
//!   spec-level part of each file is checked at once, a device only when the start names it, so
//!   a defect in a device the start does not name is not seen by that start (the rule above
//!   leaves such a device out anyway; the start just does not report it).
//!
//! Loading checks fields and SPEC.md rules but not the JSON schema, which is `actk cdi
//! validate`'s job: the runtime shim loads the registry for every container.

use super::CdiError;
use super::generate::dedup;
use super::name::QualifiedName;
use super::spec::Device;
use super::spec::{ContainerEdits, Spec};
use super::validate::{LazyDevice, lazy_from_text, usable_from_text};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Device names of one kind -> (index into `specs`, index into that spec's devices).
type KindIndex = std::collections::HashMap<Box<str>, (usize, usize), foldhash::fast::RandomState>;

/// The spec directories engines read, in priority order (lowest first).
pub const DEFAULT_SPEC_DIRS: &[&str] = &["/etc/cdi", "/var/run/cdi"];

/// A spec loaded from a file (or added in memory).
#[derive(Debug, Clone)]
pub struct LoadedSpec {
    /// The file it came from (for in-memory specs, a descriptive path such as `<generated>/nvidia.com-gpu`).
    pub path: PathBuf,
    /// Index of its spec directory; higher overrides lower.
    pub priority: usize,
    /// The spec. Read for a container start ([`Registry::load_for_start`]), its `devices` is
    /// empty and the devices are in [`LoadedSpec::lazy`].
    pub spec: Spec,
    /// The devices of a spec read for a container start, each parsed and checked when named;
    /// `None` when they are in `spec.devices`.
    pub lazy: Option<Vec<LazyDevice>>,
}

/// A spec file (or directory), or one device of a spec file, that could not be used, with
/// every error found in it.
#[derive(Debug)]
pub struct SpecFileError {
    /// The file or directory.
    pub path: PathBuf,
    /// The device of the file that was left out (`"gpu0" (devices[3])`), when only it was.
    pub device: Option<String>,
    /// What is wrong with it.
    pub errors: Vec<CdiError>,
}

impl SpecFileError {
    fn file(path: PathBuf, errors: Vec<CdiError>) -> SpecFileError {
        SpecFileError { path, device: None, errors }
    }

    /// One line for a warning: `CDI spec file skipped: ...` or `CDI device "x" (devices[2]) of
    /// FILE skipped: ...`.
    pub fn warning(&self) -> String {
        match &self.device {
            Some(d) => format!("CDI device {d} of {} skipped: {self}", self.path.display()),
            None => format!("CDI spec file skipped: {self}"),
        }
    }
}

impl std::fmt::Display for SpecFileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let msgs: Vec<String> = self.errors.iter().map(|e| e.to_string()).collect();
        write!(f, "{}", msgs.join("; "))
    }
}

/// The specs of a set of spec directories and the devices they define.
#[derive(Debug, Default)]
pub struct Registry {
    dirs: Vec<PathBuf>,
    specs: Vec<LoadedSpec>,
    /// Kind -> device name -> (index into `specs`, index into that spec's devices). Hashed by
    /// name within a kind (issue 31): a container start adds every device of every spec, and
    /// an ordered map of qualified names compared the shared `kind=` prefix byte by byte on
    /// every step (a fifth of a 256-device start's instructions).
    devices: BTreeMap<String, KindIndex>,
    /// Qualified names defined more than once at the same priority -> the files.
    conflicts: BTreeMap<String, Vec<PathBuf>>,
    /// Qualified names of devices left out of their file -> the file and why.
    refused: BTreeMap<String, String>,
    errors: Vec<SpecFileError>,
}

impl Registry {
    /// Loads every spec file of `dirs` (missing directories are skipped). Never fails: bad files
    /// and unreadable directories are recorded in [`Registry::errors`].
    pub fn load<P: AsRef<Path>>(dirs: &[P]) -> Registry {
        Registry::load_with(dirs, false)
    }

    /// [`Registry::load`] for one container start, which names a few devices of specs that
    /// may list hundreds (issue 31): each JSON spec file's spec-level part is parsed and
    /// checked, its devices only by name; a device is parsed and checked, by the same rules,
    /// when [`Registry::check`] or [`Registry::resolve`] names it
    /// ([`super::validate::LazySpec`]). A defect in a device nobody names is therefore not
    /// seen: it neither fails the start nor shows in [`Registry::errors`], where the whole
    /// reading of [`Registry::load`] leaves that device out and reports it. Files the lazy
    /// reading does not take (YAML, a spec-level problem, duplicate device names, a device
    /// without a string name) are read whole, as by [`Registry::load`].
    pub fn load_for_start<P: AsRef<Path>>(dirs: &[P]) -> Registry {
        Registry::load_with(dirs, true)
    }

    fn load_with<P: AsRef<Path>>(dirs: &[P], lazy: bool) -> Registry {
        let mut reg = Registry { dirs: dirs.iter().map(|d| d.as_ref().to_path_buf()).collect(), ..Default::default() };
        for (priority, dir) in dirs.iter().enumerate() {
            let dir = dir.as_ref();
            let entries = match crate::dirlist::list(dir) {
                Ok(e) => e,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(source) => {
                    reg.errors.push(SpecFileError::file(
                        dir.to_path_buf(),
                        vec![CdiError::Io { path: dir.to_path_buf(), source }],
                    ));
                    continue;
                }
            };
            let dir_trust = crate::trusted::check_dir(dir);
            let mut files: Vec<PathBuf> = entries
                .iter()
                .filter(|e| {
                    matches!(Path::new(&e.name).extension().and_then(|e| e.to_str()), Some("json") | Some("yaml"))
                })
                .filter(|e| !e.is_dir(dir))
                .map(|e| dir.join(&e.name))
                .collect();
            files.sort();
            if let Err(e) = dir_trust {
                // One entry for the directory, and only when it holds spec files.
                if !files.is_empty() {
                    reg.errors.push(SpecFileError::file(dir.to_path_buf(), vec![read_error(e)]));
                }
                continue;
            }
            for file in files {
                let text = match crate::trusted::read(&file) {
                    Ok(bytes) => String::from_utf8(bytes).map_err(|_| CdiError::Io {
                        path: file.clone(),
                        source: std::io::Error::new(std::io::ErrorKind::InvalidData, "not UTF-8 text"),
                    }),
                    Err(e) => Err(read_error(e)),
                };
                if lazy
                    && let Ok(t) = &text
                    && let Some(l) = lazy_from_text(t, &file)
                {
                    reg.add_loaded(LoadedSpec { path: file, priority, spec: l.spec, lazy: Some(l.devices) });
                    continue;
                }
                match text.map_err(|e| vec![e]).and_then(|t| usable_from_text(&t, &file)) {
                    Ok(usable) => {
                        for r in usable.refused {
                            let label = r.label();
                            if let Some(n) = &r.name {
                                let msg: Vec<String> = r.errors.iter().map(|e| e.to_string()).collect();
                                reg.refused.insert(
                                    format!("{}={n}", usable.spec.kind),
                                    format!("{}: {}", file.display(), msg.join("; ")),
                                );
                            }
                            reg.errors.push(SpecFileError {
                                path: file.clone(),
                                device: Some(label),
                                errors: r.errors,
                            });
                        }
                        reg.add(usable.spec, file, priority);
                    }
                    Err(errors) => reg.errors.push(SpecFileError::file(file, errors)),
                }
            }
        }
        reg
    }

    /// Loads the default spec directories ([`DEFAULT_SPEC_DIRS`]).
    pub fn load_default() -> Registry {
        Registry::load(DEFAULT_SPEC_DIRS)
    }

    /// Adds a spec (already validated) at a priority, with the override and conflict rules of
    /// the module docs. The runtime shim adds specs it generated in memory this way, with a
    /// priority below 0's files when spec files should win (use 0 and load files after, or a
    /// higher number to override them).
    pub fn add(&mut self, spec: Spec, path: PathBuf, priority: usize) {
        self.add_loaded(LoadedSpec { path, priority, spec, lazy: None });
    }

    /// [`Registry::add`] for a spec read either way.
    fn add_loaded(&mut self, loaded: LoadedSpec) {
        let idx = self.specs.len();
        self.specs.push(loaded);
        let loaded = &self.specs[idx];
        let (path, priority) = (&loaded.path, loaded.priority);
        let kind = loaded.spec.kind.as_str();
        let count = loaded.lazy.as_ref().map_or(loaded.spec.devices.len(), Vec::len);
        let names: Box<dyn Iterator<Item = &str>> = match &loaded.lazy {
            Some(devices) => Box::new(devices.iter().map(|d| d.name())),
            None => Box::new(loaded.spec.devices.iter().map(|d| d.name.as_str())),
        };
        let index = self.devices.entry(kind.to_string()).or_default();
        index.reserve(count);
        for (di, name) in names.enumerate() {
            if !self.conflicts.is_empty()
                && let Some(files) = self.conflicts.get_mut(&format!("{kind}={name}"))
            {
                files.push(path.clone());
                continue;
            }
            let Some(slot) = index.get_mut(name) else {
                index.insert(name.into(), (idx, di));
                continue;
            };
            let other = slot.0;
            if self.specs[other].priority > priority {
                continue;
            }
            if self.specs[other].priority < priority {
                *slot = (idx, di);
                continue;
            }
            index.remove(name);
            let qualified = format!("{kind}={name}");
            let other_path = self.specs[other].path.clone();
            self.conflicts.insert(qualified.clone(), vec![other_path.clone(), path.clone()]);
            let msg = format!(
                "CDI device {qualified} is defined by both {} and {}; it is not usable until one is removed",
                other_path.display(),
                path.display()
            );
            for p in [other_path, path.clone()] {
                self.errors.push(SpecFileError::file(
                    p.clone(),
                    vec![CdiError::Conflict { name: qualified.clone(), message: msg.clone() }],
                ));
            }
        }
    }

    /// The spec directories this registry was loaded from.
    pub fn dirs(&self) -> &[PathBuf] {
        &self.dirs
    }

    /// Files (and directories) that could not be used, with their errors.
    pub fn errors(&self) -> &[SpecFileError] {
        &self.errors
    }

    /// Every loaded spec, in load order (read by [`Registry::load_for_start`], a JSON spec's
    /// devices are in [`LoadedSpec::lazy`], not in its `spec.devices`).
    pub fn specs(&self) -> &[LoadedSpec] {
        &self.specs
    }

    /// The kinds with at least one usable device, sorted.
    pub fn kinds(&self) -> Vec<String> {
        self.devices.iter().filter(|(_, names)| !names.is_empty()).map(|(kind, _)| kind.clone()).collect()
    }

    /// Whether some spec defines a usable device of `kind` (`vendor/class`).
    pub fn has_kind(&self, kind: &str) -> bool {
        self.devices.get(kind).is_some_and(|names| !names.is_empty())
    }

    /// Whether some spec defines a usable device `name` (as written) of `kind`: one hash lookup.
    pub fn has_device(&self, kind: &str, name: &str) -> bool {
        self.devices.get(kind).is_some_and(|names| names.contains_key(name))
    }

    /// Every usable qualified device name, sorted by kind then name.
    pub fn device_names(&self) -> Vec<QualifiedName> {
        self.devices
            .keys()
            .flat_map(|kind| self.names_of_kind(kind).into_iter().map(move |n| format!("{kind}={n}")))
            .filter_map(|q| QualifiedName::parse(&q).ok())
            .collect()
    }

    /// Device names (within `kind`, `vendor/class`) that some spec defines usably, in name order;
    /// no name is parsed again. Sorted on each call: a container start looks names up with
    /// [`Registry::has_device`] and asks for this list only to name what exists in an error.
    pub fn names_of_kind(&self, kind: &str) -> Vec<String> {
        let mut names: Vec<String> =
            self.devices.get(kind).map(|names| names.keys().map(|n| n.to_string()).collect()).unwrap_or_default();
        names.sort_unstable();
        names
    }

    /// Where the usable device `name` is: (index into `specs`, index into its devices).
    fn lookup(&self, name: &QualifiedName) -> Option<(usize, usize)> {
        let kind = self.devices.iter().find(|(k, _)| is_kind_of(k, name)).map(|(_, names)| names)?;
        kind.get(name.name.as_str()).copied()
    }

    /// Whether `name` resolves, without building its edits. Errors: those of [`Registry::resolve`].
    /// A device read lazily is parsed and checked here (the first time), and refused with
    /// [`CdiError::Refused`] naming the file when it breaks a rule.
    pub fn check(&self, name: &QualifiedName) -> Result<(), CdiError> {
        match self.lookup(name) {
            Some((si, di)) => self.device(si, di).map(|_| ()),
            None => Err(self.unresolved(name)),
        }
    }

    /// Device `di` of spec `si`, parsed and checked now if it was read lazily.
    fn device(&self, si: usize, di: usize) -> Result<&Device, CdiError> {
        let l = &self.specs[si];
        match &l.lazy {
            None => Ok(&l.spec.devices[di]),
            Some(devices) => devices[di].device(&l.spec.cdi_version, &l.path).map_err(|why| CdiError::Refused {
                name: format!("{}={}", l.spec.kind, devices[di].name()),
                message: why.to_string(),
            }),
        }
    }

    /// The container edits for a set of qualified names: each spec's spec-level edits once,
    /// then each device's edits, de-duplicated.
    ///
    /// Errors: [`CdiError::UnknownKind`] naming the device, the spec directories and the kinds
    /// that exist; [`CdiError::UnknownDevice`] naming the device and the names its kind has;
    /// [`CdiError::Conflict`] when two files in one directory define it.
    pub fn resolve(&self, names: &[QualifiedName]) -> Result<ContainerEdits, CdiError> {
        let mut edits = ContainerEdits::default();
        self.resolve_into(names, &mut edits)?;
        dedup(&mut edits);
        Ok(edits)
    }

    /// [`Registry::resolve`] appending to `edits` without de-duplicating (the caller does, once,
    /// after gathering edits from every source). On error `edits` may hold a part.
    pub fn resolve_into(&self, names: &[QualifiedName], edits: &mut ContainerEdits) -> Result<(), CdiError> {
        let mut specs_done = Vec::new();
        for name in names {
            let Some((si, di)) = self.lookup(name) else {
                return Err(self.unresolved(name));
            };
            let device = self.device(si, di)?;
            if !specs_done.contains(&si) {
                specs_done.push(si);
                edits.append(&self.specs[si].spec.container_edits);
            }
            edits.append(&device.container_edits);
        }
        Ok(())
    }

    /// [`Registry::resolve_into`] for a registry that is not used again for edits: the edits are
    /// moved out of it, not cloned (a DGX node's spec-level edits are ~60 driver mounts, cloned
    /// at every container start; issue 31). A device named twice gets its edits cloned for the
    /// earlier mention and moved for the last, so `edits` is what [`Registry::resolve_into`]
    /// gives. Afterwards the registry still names its devices and reports its errors, but the
    /// edits it handed out are empty. Errors: as [`Registry::resolve_into`], before anything is
    /// moved.
    pub fn resolve_into_taking(&mut self, names: &[QualifiedName], edits: &mut ContainerEdits) -> Result<(), CdiError> {
        let mut found = Vec::with_capacity(names.len());
        for name in names {
            let Some((si, di)) = self.lookup(name) else {
                return Err(self.unresolved(name));
            };
            self.device(si, di)?;
            found.push((si, di));
        }
        let mut specs_done = Vec::new();
        for (k, &(si, di)) in found.iter().enumerate() {
            let loaded = &mut self.specs[si];
            if !specs_done.contains(&si) {
                specs_done.push(si);
                edits.append_owned(std::mem::take(&mut loaded.spec.container_edits));
            }
            if found[k + 1..].contains(&(si, di)) {
                edits.append(&self.device(si, di)?.container_edits);
                continue;
            }
            match &mut loaded.lazy {
                None => edits.append_owned(std::mem::take(&mut loaded.spec.devices[di].container_edits)),
                Some(devices) => edits.append_owned(devices[di].take_edits()),
            }
        }
        Ok(())
    }

    fn unresolved(&self, name: &QualifiedName) -> CdiError {
        let qualified = name.to_string();
        if let Some(files) = self.conflicts.get(&qualified) {
            let files: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
            return CdiError::Conflict {
                name: qualified.clone(),
                message: format!(
                    "CDI device {qualified} is defined by more than one spec file in one directory ({}); remove all but one",
                    files.join(", ")
                ),
            };
        }
        if let Some(why) = self.refused.get(&qualified) {
            return CdiError::Refused { name: qualified.clone(), message: why.clone() };
        }
        let kind = name.kind_string();
        let known = self.names_of_kind(&kind);
        if known.is_empty() {
            let kinds = self.kinds();
            CdiError::UnknownKind {
                name: qualified,
                kind,
                dirs: self.dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", "),
                known: if kinds.is_empty() { "none".into() } else { kinds.join(", ") },
            }
        } else {
            CdiError::UnknownDevice { name: qualified, kind, known: known.join(", ") }
        }
    }
}

/// Whether `kind` (`vendor/class`) is the kind of `name`, without building the string.
fn is_kind_of(kind: &str, name: &QualifiedName) -> bool {
    kind.len() == name.vendor.len() + 1 + name.class.len()
        && kind.starts_with(name.vendor.as_str())
        && kind.as_bytes()[name.vendor.len()] == b'/'
        && kind.ends_with(name.class.as_str())
}

fn read_error(e: crate::trusted::ReadError) -> CdiError {
    match e {
        crate::trusted::ReadError::Untrusted(u) => CdiError::Untrusted(u),
        crate::trusted::ReadError::Io { path, source } => CdiError::Io { path, source },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn spec_text(kind: &str, names: &[&str], env: &str) -> String {
        let devices: Vec<String> = names
            .iter()
            .map(|n| format!(r#"{{"name": "{n}", "containerEdits": {{"deviceNodes": [{{"path": "/dev/x{n}", "type": "c", "major": 1, "minor": 3}}]}}}}"#))
            .collect();
        format!(
            r#"{{"cdiVersion": "0.5.0", "kind": "{kind}", "devices": [{}], "containerEdits": {{"env": ["{env}"]}}}}"#,
            devices.join(",")
        )
    }

    #[test]
    fn later_dir_overrides_and_bad_files_are_reported() {
        let tmp = tempfile::tempdir().unwrap();
        let (etc, run) = (tmp.path().join("etc"), tmp.path().join("run"));
        fs::create_dir_all(&etc).unwrap();
        fs::create_dir_all(&run).unwrap();
        fs::write(etc.join("a.json"), spec_text("vendor.com/dev", &["0", "1"], "FROM=etc")).unwrap();
        fs::write(run.join("b.json"), spec_text("vendor.com/dev", &["1"], "FROM=run")).unwrap();
        fs::write(run.join("bad.json"), "{ not json").unwrap();
        fs::write(run.join("ignored.txt"), "x").unwrap();
        let reg = Registry::load(&[&etc, &run, &tmp.path().join("missing")]);
        assert_eq!(reg.kinds(), ["vendor.com/dev"]);
        let names: Vec<String> = reg.device_names().iter().map(|n| n.to_string()).collect();
        assert_eq!(names, ["vendor.com/dev=0", "vendor.com/dev=1"]);
        assert_eq!(reg.errors().len(), 1);
        assert!(reg.errors()[0].path.ends_with("bad.json"));
        assert!(reg.errors()[0].to_string().contains("bad.json: cannot parse CDI spec as JSON"));

        let one = reg.resolve(&[QualifiedName::parse("vendor.com/dev=1").unwrap()]).unwrap();
        assert_eq!(one.env, ["FROM=run"], "device 1 comes from the higher-priority dir");
        let both = reg
            .resolve(&[
                QualifiedName::parse("vendor.com/dev=0").unwrap(),
                QualifiedName::parse("vendor.com/dev=1").unwrap(),
            ])
            .unwrap();
        assert_eq!(both.env, ["FROM=etc", "FROM=run"]);
        assert_eq!(both.device_nodes.iter().map(|n| n.path.as_str()).collect::<Vec<_>>(), ["/dev/x0", "/dev/x1"]);
    }

    #[test]
    fn unknown_names_are_errors_naming_what_exists() {
        let tmp = tempfile::tempdir().unwrap();
        fs::write(tmp.path().join("a.yaml"), spec_text("vendor.com/dev", &["0", "1"], "A=1")).unwrap();
        let reg = Registry::load(&[tmp.path()]);
        let err = reg.resolve(&[QualifiedName::parse("vendor.com/dev=7").unwrap()]).unwrap_err().to_string();
        assert_eq!(err, "unresolvable CDI device vendor.com/dev=7: kind vendor.com/dev has devices 0, 1");
        let err = reg.resolve(&[QualifiedName::parse("other.com/gpu=0").unwrap()]).unwrap_err().to_string();
        assert!(
            err.contains("no CDI spec for kind other.com/gpu") && err.contains("known kinds: vendor.com/dev"),
            "{err}"
        );
    }

    #[test]
    fn same_dir_conflict_drops_the_name_and_reports_both_files() {
        let tmp = tempfile::tempdir().unwrap();
        fs::write(tmp.path().join("a.json"), spec_text("vendor.com/dev", &["0", "1"], "A=1")).unwrap();
        fs::write(tmp.path().join("b.json"), spec_text("vendor.com/dev", &["1"], "B=1")).unwrap();
        let reg = Registry::load(&[tmp.path()]);
        assert_eq!(reg.errors().len(), 2);
        let err = reg.resolve(&[QualifiedName::parse("vendor.com/dev=1").unwrap()]).unwrap_err().to_string();
        assert!(err.contains("a.json") && err.contains("b.json"), "{err}");
        reg.resolve(&[QualifiedName::parse("vendor.com/dev=0").unwrap()]).unwrap();
    }

    #[test]
    fn invalid_spec_file_is_reported_with_its_rule() {
        let tmp = tempfile::tempdir().unwrap();
        let text = spec_text("vendor.com/dev", &["0"], "A=1").replace("\"0.5.0\"", "\"0.4.0\"");
        fs::write(tmp.path().join("old.json"), text).unwrap();
        let reg = Registry::load(&[tmp.path()]);
        assert!(reg.device_names().is_empty());
        let msg = reg.errors()[0].to_string();
        assert!(msg.contains("old.json: /cdiVersion") && msg.contains(">= 0.5.0"), "{msg}");
    }

    /// Issue 10 finding 5: a spec file owned by nobody in a world-writable spec directory
    /// overrode the real GPU spec (and its hook ran as root). Untrusted files are skipped.
    #[test]
    fn untrusted_spec_files_and_directories_are_skipped_with_the_reason() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let (etc, run) = (tmp.path().join("etc"), tmp.path().join("run"));
        fs::create_dir_all(&etc).unwrap();
        fs::create_dir_all(&run).unwrap();
        fs::write(etc.join("gpu.json"), spec_text("vendor.com/dev", &["0"], "FROM=etc")).unwrap();
        fs::write(run.join("evil.json"), spec_text("vendor.com/dev", &["0"], "FROM=evil")).unwrap();
        let evil = run.join("evil.json");
        if rustix::process::geteuid().is_root() {
            std::os::unix::fs::chown(&evil, Some(65534), Some(65534)).unwrap();
        } else {
            fs::set_permissions(&evil, fs::Permissions::from_mode(0o666)).unwrap();
        }
        let reg = Registry::load(&[&etc, &run]);
        let one = reg.resolve(&[QualifiedName::parse("vendor.com/dev=0").unwrap()]).unwrap();
        assert_eq!(one.env, ["FROM=etc"], "the untrusted higher-priority file must not override");
        let msg = reg.errors()[0].to_string();
        assert!(msg.contains("evil.json: not trusted: the file is"), "{msg}");
        // The whole directory when it is world-writable.
        fs::set_permissions(&run, fs::Permissions::from_mode(0o1777)).unwrap();
        fs::write(run.join("other.json"), spec_text("vendor.com/other", &["0"], "X=1")).unwrap();
        let reg = Registry::load(&[&etc, &run]);
        assert_eq!(reg.kinds(), ["vendor.com/dev"]);
        assert!(
            reg.errors()[0].to_string().contains("the directory is writable by group and others (mode 1777)"),
            "{:?}",
            reg.errors()
        );
    }

    /// Issue 25 item 6: a device whose edits are refused is skipped by name; the other devices
    /// of the file still resolve, and asking for the refused one says why.
    #[test]
    fn a_refused_device_is_named_and_the_others_resolve() {
        let tmp = tempfile::tempdir().unwrap();
        let text = r#"{"cdiVersion": "0.5.0", "kind": "vendor.com/dev", "containerEdits": {"env": ["S=1"]}, "devices": [
            {"name": "0", "containerEdits": {"deviceNodes": [{"path": "/dev/x0", "type": "c", "major": 1, "minor": 3, "permissions": "rwx"}]}},
            {"name": "1", "containerEdits": {"deviceNodes": [{"path": "/dev/x1", "type": "c", "major": 1, "minor": 5, "permissions": ""}], "mounts": null}}
        ]}"#;
        fs::write(tmp.path().join("a.json"), text).unwrap();
        let reg = Registry::load(&[tmp.path()]);
        let one = reg.resolve(&[QualifiedName::parse("vendor.com/dev=1").unwrap()]).unwrap();
        assert_eq!(one.env, ["S=1"]);
        assert_eq!(one.device_nodes[0].permissions, None, "empty permissions are the default rwm");
        assert_eq!(reg.errors().len(), 1);
        let w = reg.errors()[0].warning();
        assert!(w.starts_with("CDI device \"0\" (devices[0]) of ") && w.contains("a.json skipped: "), "{w}");
        assert!(w.contains("/devices/0/containerEdits/deviceNodes/0/permissions"), "{w}");
        let e = reg.resolve(&[QualifiedName::parse("vendor.com/dev=0").unwrap()]).unwrap_err().to_string();
        assert!(
            e.starts_with("unresolvable CDI device vendor.com/dev=0: its spec file defines it but it was refused: "),
            "{e}"
        );
        assert!(e.contains("a.json") && e.contains("permissions \"rwx\""), "{e}");
    }
}
