//! oci-hooks(5) hook directories: JSON files (schema version 1.0.0) that say which OCI hooks to
//! inject into which containers, in which stages. This is the job `oci-add-hooks` does for the
//! Neuron OCI hook; podman and CRI-O read the same files.
//!
//! File shape (oci-hooks(5), "1.0.0 Hook Schema"):
//! ```json
//! {"version": "1.0.0",
//!  "hook": {"path": "/usr/bin/x", "args": ["x", "prestart"], "env": ["A=b"], "timeout": 5},
//!  "when": {"always": true, "annotations": {"^key-regex$": "value-regex"},
//!           "commands": ["regex on process.args[0]"], "hasBindMounts": true},
//!  "stages": ["prestart"]}
//! ```
//! Semantics kept from oci-hooks(5):
//! - only `*.json` files; a file in a later directory masks the file of the same name in an
//!   earlier one (our directories are in increasing precedence, [`crate::config::Config::hooks_dirs`]);
//! - hooks are injected in file-name order (byte order: the POSIX locale);
//! - `when` must set at least one condition; every condition set must match (AND):
//!   `always` must be true, some annotation must match each key/value regex pair, some command
//!   regex must match `process.args[0]`, `hasBindMounts` must equal whether the spec has bind mounts;
//! - regexes are unanchored searches (Go `regexp.MatchString`), write `^...$` to anchor.
//!
//! A missing directory is not an error; a malformed file is, naming the file and the problem.
//!
//! Only trusted files are read (crate::trusted): a file or directory that root does not own, or
//! that group or others may write, is skipped with a warning naming it and why, and masks
//! nothing (its hook would run as root in every container).

use crate::edits::{EditError, HOOK_DEFAULT_PATH, HOOK_STAGES, array_at};
use regex::Regex;
use serde::Deserialize;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The one schema version we read.
pub const HOOKS_VERSION: &str = "1.0.0";

/// One hook definition file.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct HookFile {
    /// Must be `1.0.0`.
    pub version: String,
    /// The OCI hook to inject.
    pub hook: HookDef,
    /// When to inject it.
    pub when: When,
    /// OCI hook stages to inject it into.
    pub stages: Vec<String>,
}

/// An OCI hook (runtime-spec config.md "POSIX-platform Hooks").
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct HookDef {
    /// Absolute path of the executable.
    pub path: String,
    /// argv including argv[0].
    #[serde(default)]
    pub args: Vec<String>,
    /// Environment; when empty actk gives a minimal PATH, never the engine's environment.
    #[serde(default)]
    pub env: Vec<String>,
    /// Seconds.
    #[serde(default)]
    pub timeout: Option<i64>,
}

/// Injection conditions.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct When {
    /// Inject always (when true).
    #[serde(default)]
    pub always: Option<bool>,
    /// Key regex -> value regex over the spec's annotations.
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    /// Regexes over `process.args[0]`.
    #[serde(default)]
    pub commands: Vec<String>,
    /// Whether the container must (true) or must not (false) have bind mounts.
    #[serde(default)]
    pub has_bind_mounts: Option<bool>,
}

/// A loaded, validated hook file with compiled regexes.
#[derive(Debug, Clone)]
pub struct LoadedHook {
    /// The file it came from.
    pub file: PathBuf,
    /// Its content.
    pub def: HookFile,
    annotations: Vec<(Regex, Regex)>,
    commands: Vec<Regex>,
}

/// A hook directory problem: the file and what is wrong with it.
#[derive(Debug, thiserror::Error)]
pub enum HooksError {
    /// The file or directory cannot be read.
    #[error("hooks file {path}: {source}")]
    Read {
        /// File or directory.
        path: PathBuf,
        /// OS error.
        source: std::io::Error,
    },
    /// The file is malformed: bad JSON, unknown field, wrong version, bad regex, empty `when`,
    /// unknown stage, relative hook path.
    #[error("hooks file {path}: {problem}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong, with the field.
        problem: String,
    },
    /// The hook could not be added to the spec.
    #[error("hooks file {path}: {source}")]
    Edit {
        /// The file.
        path: PathBuf,
        /// Why.
        source: EditError,
    },
}

fn invalid(path: &Path, problem: impl Into<String>) -> HooksError {
    HooksError::Invalid { path: path.to_owned(), problem: problem.into() }
}

/// Parses and validates one hook file's text. `path` names it in errors.
pub fn parse(text: &str, path: &Path) -> Result<LoadedHook, HooksError> {
    let def: HookFile = serde_json::from_str(text).map_err(|e| invalid(path, e.to_string()))?;
    if def.version != HOOKS_VERSION {
        return Err(invalid(path, format!("version {:?} is not supported; expected \"{HOOKS_VERSION}\"", def.version)));
    }
    if !def.hook.path.starts_with('/') {
        return Err(invalid(path, format!("hook.path {:?} must be absolute", def.hook.path)));
    }
    if def.stages.is_empty() {
        return Err(invalid(path, "stages is empty; name at least one of prestart, createRuntime, ...".to_string()));
    }
    for s in &def.stages {
        if !HOOK_STAGES.contains(&s.as_str()) {
            return Err(invalid(path, format!("unknown stage {s:?}; expected one of {}", HOOK_STAGES.join(", "))));
        }
    }
    let w = &def.when;
    if w.always.is_none() && w.annotations.is_empty() && w.commands.is_empty() && w.has_bind_mounts.is_none() {
        return Err(invalid(path, "when sets no condition; set always, annotations, commands or hasBindMounts"));
    }
    let re = |field: &str, s: &str| {
        Regex::new(s).map_err(|e| invalid(path, format!("{field}: bad regular expression {s:?}: {e}")))
    };
    let mut annotations = Vec::new();
    for (k, v) in &w.annotations {
        annotations.push((re("when.annotations key", k)?, re("when.annotations value", v)?));
    }
    let commands = w.commands.iter().map(|c| re("when.commands", c)).collect::<Result<_, _>>()?;
    Ok(LoadedHook { file: path.to_owned(), def, annotations, commands })
}

/// Loads every `*.json` file of `dirs` (increasing precedence: a later directory's file masks the
/// same name in an earlier one), in file-name order. Missing directories are skipped; untrusted
/// files and directories are skipped with a `tracing` warning ([`load_with_skipped`] returns them).
pub fn load(dirs: &[PathBuf]) -> Result<Vec<LoadedHook>, HooksError> {
    let loaded = load_with_skipped(dirs)?;
    for u in &loaded.skipped {
        tracing::warn!("hooks file skipped: {u}");
    }
    Ok(loaded.hooks)
}

/// What [`load_with_skipped`] found.
#[derive(Debug, Default)]
pub struct Loaded {
    /// The hooks of trusted files, in file-name order.
    pub hooks: Vec<LoadedHook>,
    /// Files and directories skipped because they are not trusted, each with the reason.
    pub skipped: Vec<crate::trusted::Untrusted>,
}

/// [`load`], returning the untrusted files and directories it skipped instead of logging them.
pub fn load_with_skipped(dirs: &[PathBuf]) -> Result<Loaded, HooksError> {
    use crate::trusted::{self, ReadError};
    let mut loaded = Loaded::default();
    let mut by_name: BTreeMap<String, (PathBuf, Vec<u8>)> = BTreeMap::new();
    for dir in dirs {
        let rd = match std::fs::read_dir(dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(source) => return Err(HooksError::Read { path: dir.clone(), source }),
        };
        let mut names = Vec::new();
        for entry in rd {
            let entry = entry.map_err(|source| HooksError::Read { path: dir.clone(), source })?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.ends_with(".json") {
                names.push((name, entry.path()));
            }
        }
        if names.is_empty() {
            continue;
        }
        match trusted::check_dir(dir) {
            Ok(()) => {}
            Err(ReadError::Untrusted(u)) => {
                loaded.skipped.push(u);
                continue;
            }
            Err(ReadError::Io { path, source }) => return Err(HooksError::Read { path, source }),
        }
        for (name, path) in names {
            match trusted::read(&path) {
                Ok(bytes) => {
                    by_name.insert(name, (path, bytes));
                }
                Err(ReadError::Untrusted(u)) => loaded.skipped.push(u),
                Err(ReadError::Io { path, source }) => return Err(HooksError::Read { path, source }),
            }
        }
    }
    for (path, bytes) in by_name.values() {
        let text = std::str::from_utf8(bytes).map_err(|_| invalid(path, "is not UTF-8 text"))?;
        loaded.hooks.push(parse(text, path)?);
    }
    Ok(loaded)
}

impl LoadedHook {
    /// Whether this hook applies to `spec` (a config.json): every condition `when` sets matches.
    pub fn matches(&self, spec: &Value) -> bool {
        let w = &self.def.when;
        if w.always == Some(false) {
            return false;
        }
        if let Some(want) = w.has_bind_mounts
            && want != has_bind_mounts(spec)
        {
            return false;
        }
        let annotations = spec.get("annotations").and_then(Value::as_object);
        for (kre, vre) in &self.annotations {
            let hit = annotations
                .is_some_and(|a| a.iter().any(|(k, v)| kre.is_match(k) && v.as_str().is_some_and(|v| vre.is_match(v))));
            if !hit {
                return false;
            }
        }
        if !self.commands.is_empty() {
            let arg0 = spec.pointer("/process/args/0").and_then(Value::as_str).unwrap_or("");
            if !self.commands.iter().any(|c| c.is_match(arg0)) {
                return false;
            }
        }
        true
    }
}

fn has_bind_mounts(spec: &Value) -> bool {
    spec.get("mounts").and_then(Value::as_array).is_some_and(|ms| {
        ms.iter().any(|m| {
            m.get("type").and_then(Value::as_str) == Some("bind")
                || m.get("options")
                    .and_then(Value::as_array)
                    .is_some_and(|o| o.iter().any(|x| x == "bind" || x == "rbind"))
        })
    })
}

/// Appends the hooks of `hooks` that match `spec` to its stages (an identical hook already in a
/// stage is not added again). Returns the files whose hooks were added.
pub fn merge(spec: &mut Value, hooks: &[LoadedHook]) -> Result<Vec<PathBuf>, HooksError> {
    let mut added = Vec::new();
    for h in hooks {
        if !h.matches(spec) {
            continue;
        }
        let d = &h.def.hook;
        let mut entry = serde_json::Map::new();
        entry.insert("path".into(), json!(d.path));
        if !d.args.is_empty() {
            entry.insert("args".into(), json!(d.args));
        }
        let env = if d.env.is_empty() { vec![HOOK_DEFAULT_PATH.to_string()] } else { d.env.clone() };
        entry.insert("env".into(), json!(env));
        if let Some(t) = d.timeout {
            entry.insert("timeout".into(), json!(t));
        }
        let entry = Value::Object(entry);
        let root = spec.as_object_mut().ok_or_else(|| HooksError::Edit {
            path: h.file.clone(),
            source: EditError::WrongType { field: "(document)".into(), expected: "an object" },
        })?;
        for stage in &h.def.stages {
            let list = array_at(root, &["hooks", stage.as_str()])
                .map_err(|source| HooksError::Edit { path: h.file.clone(), source })?;
            if !list.contains(&entry) {
                list.push(entry.clone());
            }
        }
        added.push(h.file.clone());
    }
    Ok(added)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(when: &str) -> String {
        format!(
            r#"{{"version":"1.0.0","hook":{{"path":"/usr/bin/neuron-hook","args":["neuron-hook"]}},"when":{when},"stages":["prestart","createContainer"]}}"#
        )
    }

    fn spec() -> Value {
        json!({"process": {"args": ["/usr/bin/python3", "x.py"]},
               "annotations": {"com.amazonaws.neuron": "yes", "other": "1"},
               "mounts": [{"destination": "/data", "type": "bind", "source": "/srv", "options": ["rbind"]}]})
    }

    fn loaded(when: &str) -> LoadedHook {
        parse(&file(when), Path::new("/etc/actk/hooks.d/10-neuron.json")).unwrap()
    }

    #[test]
    fn when_conditions_and_together() {
        assert!(loaded(r#"{"always":true}"#).matches(&spec()));
        assert!(!loaded(r#"{"always":false}"#).matches(&spec()));
        assert!(loaded(r#"{"annotations":{"^com\\.amazonaws\\.neuron$":"^yes$"}}"#).matches(&spec()));
        assert!(!loaded(r#"{"annotations":{"^com\\.amazonaws\\.neuron$":"^no$"}}"#).matches(&spec()));
        assert!(!loaded(r#"{"annotations":{"^missing$":".*"}}"#).matches(&spec()));
        assert!(loaded(r#"{"commands":["python"]}"#).matches(&spec()), "unanchored search on args[0]");
        assert!(!loaded(r#"{"commands":["^python"]}"#).matches(&spec()));
        assert!(loaded(r#"{"hasBindMounts":true}"#).matches(&spec()));
        assert!(!loaded(r#"{"hasBindMounts":false}"#).matches(&spec()));
        assert!(!loaded(r#"{"always":true,"commands":["^sh$"]}"#).matches(&spec()), "all conditions must match");
        assert!(!loaded(r#"{"annotations":{"x":"y"}}"#).matches(&json!({})));
    }

    #[test]
    fn merge_adds_to_each_stage_with_env_once() {
        let h = loaded(r#"{"always":true}"#);
        let mut s = spec();
        assert_eq!(merge(&mut s, std::slice::from_ref(&h)).unwrap().len(), 1);
        merge(&mut s, &[h]).unwrap();
        assert_eq!(
            s["hooks"]["prestart"],
            json!([{"path": "/usr/bin/neuron-hook", "args": ["neuron-hook"], "env": [HOOK_DEFAULT_PATH]}])
        );
        assert_eq!(s["hooks"]["createContainer"].as_array().unwrap().len(), 1);
    }

    #[test]
    fn malformed_files_name_file_and_problem() {
        let p = Path::new("/etc/actk/hooks.d/bad.json");
        let cases = [
            ("{", "EOF"),
            (
                r#"{"version":"2.0.0","hook":{"path":"/x"},"when":{"always":true},"stages":["prestart"]}"#,
                "version \"2.0.0\"",
            ),
            (
                r#"{"version":"1.0.0","hook":{"path":"x"},"when":{"always":true},"stages":["prestart"]}"#,
                "must be absolute",
            ),
            (r#"{"version":"1.0.0","hook":{"path":"/x"},"when":{},"stages":["prestart"]}"#, "when sets no condition"),
            (
                r#"{"version":"1.0.0","hook":{"path":"/x"},"when":{"always":true},"stages":["prestrat"]}"#,
                "unknown stage \"prestrat\"",
            ),
            (
                r#"{"version":"1.0.0","hook":{"path":"/x"},"when":{"commands":["("]},"stages":["prestart"]}"#,
                "bad regular expression",
            ),
            (
                r#"{"version":"1.0.0","hook":{"path":"/x"},"when":{"always":true},"stages":["prestart"],"extra":1}"#,
                "unknown field `extra`",
            ),
        ];
        for (text, want) in cases {
            let e = parse(text, p).unwrap_err().to_string();
            assert!(e.starts_with("hooks file /etc/actk/hooks.d/bad.json: ") && e.contains(want), "{text}: {e}");
        }
    }

    #[test]
    fn later_directory_masks_same_name_and_order_is_by_name() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let write = |d: &Path, name: &str, path: &str| {
            std::fs::write(
                d.join(name),
                format!(
                    r#"{{"version":"1.0.0","hook":{{"path":"{path}"}},"when":{{"always":true}},"stages":["prestart"]}}"#
                ),
            )
            .unwrap();
        };
        write(a.path(), "20-x.json", "/from/a");
        write(a.path(), "10-y.json", "/y");
        write(b.path(), "20-x.json", "/from/b");
        std::fs::write(a.path().join("README"), "not a hook").unwrap();
        let hooks = load(&[a.path().to_owned(), b.path().to_owned(), "/nonexistent/hooks.d".into()]).unwrap();
        let paths: Vec<_> = hooks.iter().map(|h| h.def.hook.path.as_str()).collect();
        assert_eq!(paths, vec!["/y", "/from/b"]);
    }

    #[test]
    fn untrusted_files_and_directories_are_skipped_and_mask_nothing() {
        use std::os::unix::fs::PermissionsExt;
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let hook = |path: &str| {
            format!(
                r#"{{"version":"1.0.0","hook":{{"path":"{path}"}},"when":{{"always":true}},"stages":["prestart"]}}"#
            )
        };
        std::fs::write(a.path().join("10-x.json"), hook("/trusted")).unwrap();
        std::fs::write(b.path().join("10-x.json"), hook("/evil")).unwrap();
        std::fs::set_permissions(b.path().join("10-x.json"), std::fs::Permissions::from_mode(0o666)).unwrap();
        let l = load_with_skipped(&[a.path().to_owned(), b.path().to_owned()]).unwrap();
        let paths: Vec<_> = l.hooks.iter().map(|h| h.def.hook.path.as_str()).collect();
        assert_eq!(paths, ["/trusted"], "the untrusted file must not mask the trusted one");
        assert_eq!(l.skipped.len(), 1);
        let w = l.skipped[0].to_string();
        assert!(w.contains("10-x.json: not trusted: the file is writable by group and others"), "{w}");
        std::fs::set_permissions(b.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let l = load_with_skipped(&[b.path().to_owned()]).unwrap();
        assert!(l.hooks.is_empty());
        assert!(l.skipped[0].to_string().contains("the directory is writable"), "{:?}", l.skipped);
    }
}
