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
//! - `hasBindMounts: true` matches a spec with bind mounts; `false` never matches (podman's
//!   reading of oci-hooks(5): "if hasBindMounts is true and the caller requested ... bind mounts").
//!
//! The legacy schema 0.1.0 (no `version`, or `"version": "0.1.0"`; CentOS 8 ships
//! `oci-systemd-hook.json` and `oci-umount.json` in it) is read as podman reads it
//! (containers/common pkg/hooks/0.1.0): `hook` is the path, `arguments` follow it in argv
//! (`args = [hook, arguments...]`), `stage`/`stages` the stages, `cmd`/`cmds` command regexes,
//! `annotation`/`annotations` value regexes matched against any annotation, `hasbindmounts`;
//! each key pair may be given one way only; and its conditions are OR-ed, not AND-ed.
//!
//! As podman does, a file whose hook executable does not exist is skipped with a warning (a
//! package removed without its hooks.d file must not stop every container); a hook already in
//! the spec's stage (same path and argv: podman merged the same directory first) is not added
//! again.
//!
//! A missing directory is not an error; a malformed file is, naming the file and the problem.
//!
//! Only trusted files are read (crate::trusted): a file or directory that root does not own, or
//! that group or others may write, is skipped with a warning naming it and why, and masks
//! nothing (its hook would run as root in every container).

use crate::edits::{EditError, HOOK_DEFAULT_PATH, HOOK_STAGES, array_at, same_hook};
use regex::Regex;
use serde::Deserialize;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The current schema version (oci-hooks(5) "1.0.0 Hook Schema").
pub const HOOKS_VERSION: &str = "1.0.0";

/// The legacy schema version podman still reads (also what a file without `version` is).
pub const LEGACY_HOOKS_VERSION: &str = "0.1.0";

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
    /// `true`: matches a container with bind mounts (`false` never matches, as in podman).
    #[serde(default)]
    pub has_bind_mounts: Option<bool>,
    /// OR the conditions instead of AND-ing them: set for files of the legacy 0.1.0 schema,
    /// never read from JSON (podman's `When.Or`).
    #[serde(skip)]
    pub or: bool,
}

/// A hook file of the legacy 0.1.0 schema (containers/common pkg/hooks/0.1.0 `Hook`), with both
/// spellings podman accepts for each list.
// Unknown keys are ignored, as Go's encoding/json does in podman's reader: these files come
// from distribution packages, not from the admin's hand.
#[derive(Debug, Deserialize)]
struct LegacyHookFile {
    #[serde(default)]
    version: Option<String>,
    hook: Option<String>,
    #[serde(default)]
    arguments: Option<Vec<String>>,
    #[serde(default)]
    stage: Option<Vec<String>>,
    #[serde(default)]
    stages: Option<Vec<String>>,
    #[serde(default)]
    cmd: Option<Vec<String>>,
    #[serde(default)]
    cmds: Option<Vec<String>>,
    #[serde(default)]
    annotation: Option<Vec<String>>,
    #[serde(default)]
    annotations: Option<Vec<String>>,
    #[serde(default)]
    hasbindmounts: Option<bool>,
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

/// Converts a 0.1.0 file as podman's `pkg/hooks/0.1.0` Read does (errors in its words).
fn from_legacy(text: &str, path: &Path) -> Result<HookFile, HooksError> {
    let raw: LegacyHookFile =
        serde_json::from_str(text).map_err(|e| invalid(path, format!("{e} (schema {LEGACY_HOOKS_VERSION})")))?;
    let one_of = |a: Option<Vec<String>>, b: Option<Vec<String>>, names: (&str, &str)| match (a, b) {
        (Some(_), Some(_)) => Err(invalid(path, format!("cannot set both '{}' and '{}'", names.0, names.1))),
        (a, b) => Ok(a.or(b)),
    };
    let hook = raw.hook.ok_or_else(|| invalid(path, "missing required property: hook"))?;
    let stages = one_of(raw.stage, raw.stages, ("stage", "stages"))?
        .ok_or_else(|| invalid(path, "missing required property: stages"))?;
    let commands = one_of(raw.cmd, raw.cmds, ("cmd", "cmds"))?.unwrap_or_default();
    let annotations = one_of(raw.annotation, raw.annotations, ("annotation", "annotations"))?;
    let _ = raw.version;
    let args = match raw.arguments {
        Some(rest) => std::iter::once(hook.clone()).chain(rest).collect(),
        None => Vec::new(),
    };
    Ok(HookFile {
        version: LEGACY_HOOKS_VERSION.into(),
        hook: HookDef { path: hook, args, env: Vec::new(), timeout: None },
        when: When {
            always: None,
            // podman: any annotation whose value matches one of the listed regexes.
            annotations: annotations.map(|a| BTreeMap::from([(".*".to_string(), a.join("|"))])).unwrap_or_default(),
            commands,
            has_bind_mounts: raw.hasbindmounts,
            or: true,
        },
        stages,
    })
}

/// Parses and validates one hook file's text, schema 1.0.0 or the legacy 0.1.0 (by its
/// `version`, absent meaning 0.1.0, as podman decides). `path` names it in errors.
pub fn parse(text: &str, path: &Path) -> Result<LoadedHook, HooksError> {
    let version: Option<String> = match serde_json::from_str::<Value>(text) {
        Ok(v) => match v.get("version") {
            None => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(other) => return Err(invalid(path, format!("version {other} is not a string"))),
        },
        Err(e) => return Err(invalid(path, e.to_string())),
    };
    let def: HookFile = match version.as_deref() {
        Some(HOOKS_VERSION) => serde_json::from_str(text).map_err(|e| invalid(path, e.to_string()))?,
        None | Some(LEGACY_HOOKS_VERSION) => from_legacy(text, path)?,
        Some(v) => {
            return Err(invalid(
                path,
                format!(
                    "version {v:?} is not supported; expected \"{HOOKS_VERSION}\" (or the legacy \"{LEGACY_HOOKS_VERSION}\")"
                ),
            ));
        }
    };
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
    // A 0.1.0 file without conditions is valid for podman (it just never matches).
    if !w.or && w.always.is_none() && w.annotations.is_empty() && w.commands.is_empty() && w.has_bind_mounts.is_none() {
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
/// files and directories are skipped with a `tracing` warning ([`load_with_skipped`] returns them),
/// and so are files whose hook executable does not exist (a warning, as podman).
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
        let rd = match crate::dirlist::list(dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(source) => return Err(HooksError::Read { path: dir.clone(), source }),
        };
        let mut names = Vec::new();
        for entry in rd {
            let name = entry.name.to_string_lossy().into_owned();
            if name.ends_with(".json") {
                let path = dir.join(&entry.name);
                names.push((name, path));
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
        let hook = parse(text, path)?;
        // podman skips (with a warning) a hook whose executable is gone; so does actk.
        if let Err(e) = std::fs::metadata(&hook.def.hook.path) {
            tracing::warn!("hooks file {}: skipped: hook {}: {e}", path.display(), hook.def.hook.path);
            continue;
        }
        loaded.hooks.push(hook);
    }
    Ok(loaded)
}

impl LoadedHook {
    /// Whether this hook applies to `spec` (a config.json): every condition `when` sets matches
    /// (any one of them, for a 0.1.0 file). The order and rules are podman's `When.Match`.
    pub fn matches(&self, spec: &Value) -> bool {
        let w = &self.def.when;
        // Each condition set: Some(hit). AND: all must hit; OR: one must.
        let mut results: Vec<bool> = Vec::new();
        if let Some(a) = w.always {
            results.push(a);
        }
        if let Some(want) = w.has_bind_mounts {
            results.push(want && has_bind_mounts(spec));
        }
        let annotations = spec.get("annotations").and_then(Value::as_object);
        for (kre, vre) in &self.annotations {
            results.push(annotations.is_some_and(|a| {
                a.iter().any(|(k, v)| kre.is_match(k) && v.as_str().is_some_and(|v| vre.is_match(v)))
            }));
        }
        if !self.commands.is_empty() {
            let arg0 = spec.pointer("/process/args/0").and_then(Value::as_str).unwrap_or("");
            results.push(self.commands.iter().any(|c| c.is_match(arg0)));
        }
        if w.or { results.iter().any(|r| *r) } else { !results.is_empty() && results.iter().all(|r| *r) }
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
            // Already there (podman merged the same hooks dir before calling the runtime, with
            // its own env): running it twice would do its work twice.
            if !list.iter().any(|e| same_hook(e, &entry)) {
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
        write(a.path(), "20-x.json", "/bin/true");
        write(a.path(), "10-y.json", "/bin/sh");
        write(b.path(), "20-x.json", "/bin/false");
        write(b.path(), "30-gone.json", "/nonexistent/hook-removed-with-its-package");
        std::fs::write(a.path().join("README"), "not a hook").unwrap();
        let hooks = load(&[a.path().to_owned(), b.path().to_owned(), "/nonexistent/hooks.d".into()]).unwrap();
        let paths: Vec<_> = hooks.iter().map(|h| h.def.hook.path.as_str()).collect();
        assert_eq!(paths, vec!["/bin/sh", "/bin/false"], "masked by name, ordered by name, missing executable skipped");
    }

    /// Field case F16: CentOS 8's oci-systemd-hook.json (schema 0.1.0: `cmd`, `hook`, `stage`,
    /// no version) is read as podman reads it: conditions OR-ed, commands on process.args[0].
    #[test]
    fn f16_centos8_oci_systemd_hook_0_1_0_is_read_as_podman_reads_it() {
        let text = r#"{
    "cmd" : [".*/init$" , ".*/systemd$" ],
    "hook" : "/usr/libexec/oci/hooks.d/oci-systemd-hook",
    "stage" : [ "prestart", "poststop" ]
}"#;
        let h = parse(text, Path::new("/usr/share/containers/oci/hooks.d/oci-systemd-hook.json")).unwrap();
        assert_eq!(h.def.hook.path, "/usr/libexec/oci/hooks.d/oci-systemd-hook");
        assert!(h.def.hook.args.is_empty(), "no `arguments`: argv is the path alone, as podman leaves it");
        assert_eq!(h.def.stages, ["prestart", "poststop"]);
        assert!(h.def.when.or);
        let with_cmd = |cmd: &str| json!({"process": {"args": [cmd]}});
        assert!(h.matches(&with_cmd("/sbin/init")));
        assert!(h.matches(&with_cmd("/usr/lib/systemd/systemd")));
        assert!(!h.matches(&with_cmd("/bin/sh")));
        let mut s = with_cmd("/sbin/init");
        merge(&mut s, std::slice::from_ref(&h)).unwrap();
        assert_eq!(s["hooks"]["poststop"][0]["path"], "/usr/libexec/oci/hooks.d/oci-systemd-hook");
    }

    /// The rest of podman's 0.1.0 reader: `arguments` after the hook in argv, `annotation(s)`
    /// matched as value regexes of any annotation, OR-ed with `hasbindmounts`, `"version":
    /// "0.1.0"` the same as none, and each pair of spellings given one way only.
    #[test]
    fn legacy_0_1_0_arguments_annotations_or_and_errors_follow_podman() {
        let p = Path::new("/etc/containers/oci/hooks.d/old.json");
        let h = parse(
            r#"{"version": "0.1.0", "hook": "/usr/libexec/oci/hooks.d/oci-umount", "arguments": ["--debug"],
                "stages": ["prestart"], "annotations": ["^yes$"], "hasbindmounts": true}"#,
            p,
        )
        .unwrap();
        assert_eq!(h.def.hook.args, ["/usr/libexec/oci/hooks.d/oci-umount", "--debug"]);
        let bind = json!({"mounts": [{"destination": "/d", "type": "bind", "source": "/s", "options": ["rbind"]}]});
        assert!(h.matches(&bind), "OR: bind mounts alone are enough");
        assert!(h.matches(&json!({"annotations": {"anything": "yes"}})), "OR: an annotation value alone is enough");
        assert!(!h.matches(&json!({"annotations": {"anything": "no"}})));
        for (text, want) in [
            (r#"{"stage": ["prestart"]}"#, "missing required property: hook"),
            (r#"{"hook": "/x"}"#, "missing required property: stages"),
            (
                r#"{"hook": "/x", "stage": ["prestart"], "stages": ["prestart"]}"#,
                "cannot set both 'stage' and 'stages'",
            ),
            (
                r#"{"hook": "/x", "stage": ["prestart"], "cmd": ["a"], "cmds": ["b"]}"#,
                "cannot set both 'cmd' and 'cmds'",
            ),
            (r#"{"hook": "/x", "stage": ["prestart"], "cmd": ["("]}"#, "bad regular expression"),
            (r#"{"hook": "/x", "stage": ["prestrat"]}"#, "unknown stage \"prestrat\""),
            (r#"{"version": "0.2.0", "hook": "/x"}"#, "version \"0.2.0\" is not supported"),
        ] {
            let e = parse(text, p).unwrap_err().to_string();
            assert!(
                e.starts_with("hooks file /etc/containers/oci/hooks.d/old.json: ") && e.contains(want),
                "{text}: {e}"
            );
        }
    }

    /// Issue 13 item 5: podman merged the hooks dir already (its entry has no env); actk-runtime,
    /// reading the same dir, adds nothing, so the hook runs once.
    #[test]
    fn item5_hook_already_in_config_json_is_not_added_again() {
        let h = loaded(r#"{"always":true}"#);
        let mut s = json!({"hooks": {"prestart": [{"path": "/usr/bin/neuron-hook", "args": ["neuron-hook"]}]}});
        merge(&mut s, std::slice::from_ref(&h)).unwrap();
        assert_eq!(s["hooks"]["prestart"].as_array().unwrap().len(), 1, "{}", s["hooks"]);
        assert_eq!(s["hooks"]["createContainer"].as_array().unwrap().len(), 1);
        // The same program with other arguments is another hook.
        let mut s = json!({"hooks": {"prestart": [{"path": "/usr/bin/neuron-hook", "args": ["neuron-hook", "-v"]}]}});
        merge(&mut s, &[h]).unwrap();
        assert_eq!(s["hooks"]["prestart"].as_array().unwrap().len(), 2);
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
        // Executables that exist: a file whose hook is gone is skipped for that reason instead.
        std::fs::write(a.path().join("10-x.json"), hook("/bin/true")).unwrap();
        std::fs::write(b.path().join("10-x.json"), hook("/bin/false")).unwrap();
        std::fs::set_permissions(b.path().join("10-x.json"), std::fs::Permissions::from_mode(0o666)).unwrap();
        let l = load_with_skipped(&[a.path().to_owned(), b.path().to_owned()]).unwrap();
        let paths: Vec<_> = l.hooks.iter().map(|h| h.def.hook.path.as_str()).collect();
        assert_eq!(paths, ["/bin/true"], "the untrusted file must not mask the trusted one");
        assert_eq!(l.skipped.len(), 1);
        let w = l.skipped[0].to_string();
        assert!(w.contains("10-x.json: not trusted: the file is writable by group and others"), "{w}");
        std::fs::set_permissions(b.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let l = load_with_skipped(&[b.path().to_owned()]).unwrap();
        assert!(l.hooks.is_empty());
        assert!(l.skipped[0].to_string().contains("the directory is writable"), "{:?}", l.skipped);
    }
}
