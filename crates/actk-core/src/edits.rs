//! Applying CDI container edits to an OCI runtime spec (config.json) held as a
//! `serde_json::Value`, so that every field actk does not know, and the order of all fields,
//! survive (serde_json's `preserve_order`). oci-spec types would drop unknown fields and reject
//! unknown enum values, so the injected pieces are built as JSON directly, with the field names of
//! the OCI runtime spec (config.md "Mounts", "POSIX process" `user.additionalGids`, "Hooks";
//! config-linux.md "Devices", "Allowed Device list").
//!
//! Rules (CDI SPEC.md "Container Edits" applied as OCI fields):
//! - device nodes -> `linux.devices[]` (`path`, `type`, `major`, `minor`, `fileMode`, `uid`,
//!   `gid`), an entry with the same `path` is replaced in place; and an allow rule
//!   `{"allow":true,"type":T,"major":M,"minor":m,"access":"rwm"}` appended to
//!   `linux.resources.devices` unless the same rule is there (appended last, so it overrides a
//!   deny-all earlier in the list).
//! - mounts -> appended to `mounts[]`; one with the same `destination` is replaced in place.
//! - env -> `process.env`: every entry with the same NAME is removed, then `NAME=value` appended
//!   (the last duplicate wins anyway; removing the others keeps the list readable).
//! - hooks -> `hooks.<stage>[]`, each with an explicit `env` (a minimal PATH when the edit has
//!   none: a hook must never inherit the engine's environment); an identical hook is not added twice.
//! - additional GIDs -> `process.user.additionalGids`, each at most once.
//!
//! Applying the same edits twice gives the same document as applying them once.

use crate::cdi::spec::{ContainerEdits, DeviceNode, Hook, Mount};
use serde_json::{Map, Value, json};

/// Annotation actk-runtime sets on a spec it has edited; actk-hook sees it and does nothing.
pub const APPLIED_ANNOTATION: &str = "io.actk.applied";

/// Name under which Docker's `--gpus` adds its prestart hook (and under which actk-hook answers).
pub const LEGACY_NVIDIA_HOOK: &str = "nvidia-container-runtime-hook";

/// `PATH` given to a hook whose edit names no environment.
pub const HOOK_DEFAULT_PATH: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// OCI runtime spec hook stages (config.md "POSIX-platform Hooks").
pub const HOOK_STAGES: &[&str] =
    &["prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop"];

/// Why edits could not be applied. Each names the field or the edit at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EditError {
    /// A field of config.json has another JSON type than the OCI runtime spec says.
    #[error("config.json: `{field}` is not {expected}")]
    WrongType {
        /// Dotted field path (`linux.devices`).
        field: String,
        /// `an object`, `an array`.
        expected: &'static str,
    },
    /// A device node edit without major/minor numbers (the planner fills them from the host node).
    #[error("device node {path}: no major/minor number (the host node could not be read)")]
    MissingNumbers {
        /// Container path of the node.
        path: String,
    },
    /// A hook edit with a stage the OCI runtime spec does not define.
    #[error("hook {path}: unknown stage {stage:?}; expected one of {}", HOOK_STAGES.join(", "))]
    BadStage {
        /// Hook executable.
        path: String,
        /// The stage given.
        stage: String,
    },
    /// An env edit that is not `NAME=value`.
    #[error("env edit {entry:?} is not NAME=value")]
    BadEnv {
        /// The entry.
        entry: String,
    },
}

/// Applies `edits` to `spec` (a whole config.json). See the module docs for the rules.
/// Errors leave `spec` partly edited: callers work on a copy and write it only on success.
pub fn apply(spec: &mut Value, edits: &ContainerEdits) -> Result<(), EditError> {
    for e in &edits.env {
        if e.split_once('=').is_none_or(|(n, _)| n.is_empty()) {
            return Err(EditError::BadEnv { entry: e.clone() });
        }
    }
    for h in &edits.hooks {
        if !HOOK_STAGES.contains(&h.hook_name.as_str()) {
            return Err(EditError::BadStage { path: h.path.clone(), stage: h.hook_name.clone() });
        }
    }
    let root =
        spec.as_object_mut().ok_or(EditError::WrongType { field: "(document)".into(), expected: "an object" })?;

    if !edits.env.is_empty() {
        let env = array_at(root, &["process", "env"])?;
        for e in &edits.env {
            let name = e.split_once('=').map(|(n, _)| n).unwrap_or(e);
            env.retain(|v| v.as_str().and_then(|s| s.split_once('=')).is_none_or(|(n, _)| n != name));
            env.push(Value::String(e.clone()));
        }
    }

    if !edits.device_nodes.is_empty() {
        let entries = edits.device_nodes.iter().map(device_json).collect::<Result<Vec<_>, _>>()?;
        upsert_all(array_at(root, &["linux", "devices"])?, "path", entries);
        let rules = array_at(root, &["linux", "resources", "devices"])?;
        for node in &edits.device_nodes {
            let rule = json!({
                "allow": true,
                "type": node_type(node),
                "major": node.major,
                "minor": node.minor,
                "access": node.permissions.clone().unwrap_or_else(|| "rwm".into()),
            });
            if !rules.contains(&rule) {
                rules.push(rule);
            }
        }
    }

    if !edits.mounts.is_empty() {
        upsert_all(array_at(root, &["mounts"])?, "destination", edits.mounts.iter().map(mount_json).collect());
    }

    for h in &edits.hooks {
        let stage = array_at(root, &["hooks", h.hook_name.as_str()])?;
        let entry = hook_json(h);
        if !stage.contains(&entry) {
            stage.push(entry);
        }
    }

    if !edits.additional_gids.is_empty() {
        let gids = array_at(root, &["process", "user", "additionalGids"])?;
        for g in &edits.additional_gids {
            let v = json!(g);
            if !gids.contains(&v) {
                gids.push(v);
            }
        }
    }
    Ok(())
}

/// Removes the prestart hooks Docker's `--gpus` adds (executable or argv[0] named
/// [`LEGACY_NVIDIA_HOOK`]), once actk-runtime has served the request itself, so that nothing is
/// injected twice. Returns how many were removed. An empty `prestart` list is removed too.
pub fn remove_legacy_nvidia_hook(spec: &mut Value) -> usize {
    let Some(hooks) = spec.get_mut("hooks").and_then(Value::as_object_mut) else { return 0 };
    let Some(pre) = hooks.get_mut("prestart").and_then(Value::as_array_mut) else { return 0 };
    let before = pre.len();
    let is_legacy = |h: &Value| {
        let base = |s: &str| s.rsplit('/').next().unwrap_or(s).to_string();
        let path = h.get("path").and_then(Value::as_str).map(base);
        let arg0 = h.get("args").and_then(|a| a.get(0)).and_then(Value::as_str).map(base);
        path.as_deref() == Some(LEGACY_NVIDIA_HOOK) || arg0.as_deref() == Some(LEGACY_NVIDIA_HOOK)
    };
    pre.retain(|h| !is_legacy(h));
    let removed = before - pre.len();
    if pre.is_empty() && removed > 0 {
        hooks.remove("prestart");
    }
    removed
}

/// Sets [`APPLIED_ANNOTATION`] to `summary` (e.g. the qualified names served).
pub fn mark_applied(spec: &mut Value, summary: &str) -> Result<(), EditError> {
    let root =
        spec.as_object_mut().ok_or(EditError::WrongType { field: "(document)".into(), expected: "an object" })?;
    let ann = object_at(root, &["annotations"])?;
    ann.insert(APPLIED_ANNOTATION.into(), Value::String(summary.into()));
    Ok(())
}

/// True when the spec carries [`APPLIED_ANNOTATION`].
pub fn is_applied(spec: &Value) -> bool {
    spec.pointer("/annotations").and_then(|a| a.get(APPLIED_ANNOTATION)).is_some()
}

fn node_type(n: &DeviceNode) -> String {
    n.node_type.clone().unwrap_or_else(|| "c".into())
}

fn device_json(n: &DeviceNode) -> Result<Value, EditError> {
    let t = node_type(n);
    let mut m = Map::new();
    m.insert("path".into(), json!(n.path));
    m.insert("type".into(), json!(t));
    // A FIFO (`p`) has no numbers; character and block devices must have them.
    if t != "p" {
        match (n.major, n.minor) {
            (Some(ma), Some(mi)) => {
                m.insert("major".into(), json!(ma));
                m.insert("minor".into(), json!(mi));
            }
            _ => return Err(EditError::MissingNumbers { path: n.path.clone() }),
        }
    }
    if let Some(mode) = n.file_mode {
        m.insert("fileMode".into(), json!(mode));
    }
    if let Some(uid) = n.uid {
        m.insert("uid".into(), json!(uid));
    }
    if let Some(gid) = n.gid {
        m.insert("gid".into(), json!(gid));
    }
    Ok(Value::Object(m))
}

fn mount_json(m: &Mount) -> Value {
    let ty = m.mount_type.clone().unwrap_or_else(|| "bind".into());
    let mut options = m.options.clone();
    // runc makes a bind mount only when the options say so; CDI specs often leave it implied.
    if ty == "bind" && !options.iter().any(|o| o == "bind" || o == "rbind") {
        options.push("bind".into());
    }
    json!({
        "destination": m.container_path,
        "type": ty,
        "source": m.host_path,
        "options": options,
    })
}

fn hook_json(h: &Hook) -> Value {
    let mut m = Map::new();
    m.insert("path".into(), json!(h.path));
    if !h.args.is_empty() {
        m.insert("args".into(), json!(h.args));
    }
    let env = if h.env.is_empty() { vec![HOOK_DEFAULT_PATH.to_string()] } else { h.env.clone() };
    m.insert("env".into(), json!(env));
    if let Some(t) = h.timeout {
        m.insert("timeout".into(), json!(t));
    }
    Value::Object(m)
}

/// For each entry: replaces the element whose string `key` equals the entry's, in place, or
/// appends it. The elements are indexed by key once, so this stays linear in the list and the
/// entries (a container start adds dozens of mounts to a spec that has dozens already).
fn upsert_all(list: &mut Vec<Value>, key: &str, entries: Vec<Value>) {
    // Where each entry goes, worked out first with the keys borrowed (no copy of any string):
    // `Some(i)` replaces element i, `None` appends.
    let targets: Vec<Option<usize>> = {
        let mut index: std::collections::BTreeMap<&str, usize> = std::collections::BTreeMap::new();
        for (i, v) in list.iter().enumerate() {
            if let Some(k) = v.get(key).and_then(Value::as_str) {
                index.entry(k).or_insert(i);
            }
        }
        let mut next = list.len();
        entries
            .iter()
            .map(|e| {
                let k = e.get(key).and_then(Value::as_str);
                match k.and_then(|k| index.get(k)).copied() {
                    Some(i) => Some(i),
                    None => {
                        if let Some(k) = k {
                            index.insert(k, next);
                        }
                        next += 1;
                        None
                    }
                }
            })
            .collect()
    };
    for (entry, target) in entries.into_iter().zip(targets) {
        // An index past the list's original end names an entry this call appended earlier;
        // the appends happen in order, so it is there by now.
        match target {
            Some(i) => list[i] = entry,
            None => list.push(entry),
        }
    }
}

/// The object at `path` under `root`, created (empty) where missing.
pub(crate) fn object_at<'a>(
    root: &'a mut Map<String, Value>,
    path: &[&str],
) -> Result<&'a mut Map<String, Value>, EditError> {
    let mut cur = root;
    for (i, key) in path.iter().enumerate() {
        let v = cur.entry(key.to_string()).or_insert_with(|| Value::Object(Map::new()));
        if v.is_null() {
            *v = Value::Object(Map::new());
        }
        cur = v
            .as_object_mut()
            .ok_or_else(|| EditError::WrongType { field: path[..=i].join("."), expected: "an object" })?;
    }
    Ok(cur)
}

/// The array at `path` under `root`, created (empty, with missing parents) where missing.
pub(crate) fn array_at<'a>(root: &'a mut Map<String, Value>, path: &[&str]) -> Result<&'a mut Vec<Value>, EditError> {
    let (last, parents) = path.split_last().expect("array_at is called with a non-empty path");
    let parent = object_at(root, parents)?;
    let v = parent.entry(last.to_string()).or_insert_with(|| Value::Array(Vec::new()));
    if v.is_null() {
        *v = Value::Array(Vec::new());
    }
    v.as_array_mut().ok_or_else(|| EditError::WrongType { field: path.join("."), expected: "an array" })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn edits() -> ContainerEdits {
        ContainerEdits {
            env: vec!["NVIDIA_VISIBLE_DEVICES=void".into(), "ACTK=1".into()],
            device_nodes: vec![
                DeviceNode {
                    path: "/dev/nvidia1".into(),
                    node_type: Some("c".into()),
                    major: Some(195),
                    minor: Some(1),
                    file_mode: Some(0o666),
                    ..Default::default()
                },
                DeviceNode {
                    path: "/dev/nvidiactl".into(),
                    major: Some(195),
                    minor: Some(255),
                    uid: Some(0),
                    gid: Some(0),
                    ..Default::default()
                },
            ],
            mounts: vec![Mount {
                host_path: "/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05".into(),
                container_path: "/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05".into(),
                mount_type: None,
                options: vec!["ro".into(), "nosuid".into(), "nodev".into()],
            }],
            hooks: vec![Hook {
                hook_name: "createContainer".into(),
                path: "/usr/bin/actk-hook".into(),
                args: vec!["actk-hook".into(), "ldconfig".into()],
                ..Default::default()
            }],
            additional_gids: vec![44, 0],
            ..Default::default()
        }
    }

    fn base() -> Value {
        json!({
            "ociVersion": "1.0.2",
            "zzUnknown": {"keep": [1, 2]},
            "process": {"user": {"uid": 0, "gid": 0, "additionalGids": [0]}, "env": ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_VISIBLE_DEVICES=1"]},
            "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}],
            "linux": {"resources": {"devices": [{"allow": false, "access": "rwm"}]}, "devices": [{"path": "/dev/nvidia1", "type": "c", "major": 1, "minor": 1}]}
        })
    }

    #[test]
    fn upsert_replaces_in_place_appends_in_order_and_a_later_duplicate_wins() {
        let mut list = vec![json!({"d": "/a", "v": 1}), json!({"d": "/b", "v": 1}), json!({"x": 0})];
        let entries =
            vec![json!({"d": "/c", "v": 2}), json!({"d": "/a", "v": 2}), json!({"d": "/c", "v": 3}), json!({"y": 1})];
        upsert_all(&mut list, "d", entries);
        assert_eq!(
            list,
            vec![
                json!({"d": "/a", "v": 2}),
                json!({"d": "/b", "v": 1}),
                json!({"x": 0}),
                json!({"d": "/c", "v": 3}),
                json!({"y": 1})
            ]
        );
    }

    #[test]
    fn applies_every_kind_of_edit() {
        let mut s = base();
        apply(&mut s, &edits()).unwrap();
        assert_eq!(s["process"]["env"], json!(["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=void", "ACTK=1"]));
        assert_eq!(
            s["linux"]["devices"],
            json!([
                {"path": "/dev/nvidia1", "type": "c", "major": 195, "minor": 1, "fileMode": 438},
                {"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255, "uid": 0, "gid": 0}
            ])
        );
        assert_eq!(
            s["linux"]["resources"]["devices"],
            json!([
                {"allow": false, "access": "rwm"},
                {"allow": true, "type": "c", "major": 195, "minor": 1, "access": "rwm"},
                {"allow": true, "type": "c", "major": 195, "minor": 255, "access": "rwm"}
            ])
        );
        assert_eq!(s["mounts"][1]["options"], json!(["ro", "nosuid", "nodev", "bind"]));
        assert_eq!(s["mounts"][1]["type"], "bind");
        assert_eq!(s["hooks"]["createContainer"][0]["env"], json!([HOOK_DEFAULT_PATH]));
        assert_eq!(s["process"]["user"]["additionalGids"], json!([0, 44]));
        assert_eq!(s["zzUnknown"], json!({"keep": [1, 2]}));
        let keys: Vec<_> = s.as_object().unwrap().keys().cloned().collect();
        assert_eq!(
            keys,
            vec!["ociVersion", "zzUnknown", "process", "mounts", "linux", "hooks"],
            "field order kept, new ones last"
        );
    }

    #[test]
    fn applying_twice_equals_once() {
        let mut once = base();
        apply(&mut once, &edits()).unwrap();
        let mut twice = once.clone();
        apply(&mut twice, &edits()).unwrap();
        assert_eq!(serde_json::to_string(&once).unwrap(), serde_json::to_string(&twice).unwrap());
    }

    #[test]
    fn creates_missing_sections() {
        let mut s = json!({"ociVersion": "1.0.2"});
        apply(&mut s, &edits()).unwrap();
        assert_eq!(s["linux"]["devices"].as_array().unwrap().len(), 2);
        assert_eq!(s["process"]["user"]["additionalGids"], json!([44, 0]));
    }

    #[test]
    fn wrong_types_are_named() {
        let mut s = json!({"linux": {"devices": {"oops": 1}}});
        let e = apply(&mut s, &edits()).unwrap_err().to_string();
        assert_eq!(e, "config.json: `linux.devices` is not an array");
        let mut s = json!({});
        let mut bad = ContainerEdits::default();
        bad.hooks.push(Hook { hook_name: "prestrat".into(), path: "/x".into(), ..Default::default() });
        assert!(apply(&mut s, &bad).unwrap_err().to_string().contains("unknown stage \"prestrat\""));
        let mut nonum = ContainerEdits::default();
        nonum.device_nodes.push(DeviceNode { path: "/dev/x".into(), ..Default::default() });
        assert!(matches!(apply(&mut s, &nonum), Err(EditError::MissingNumbers { .. })));
    }

    #[test]
    fn removes_dockers_gpus_hook_only() {
        let mut s = json!({"hooks": {"prestart": [
            {"path": "/usr/local/bin/nvidia-container-runtime-hook", "args": ["nvidia-container-runtime-hook", "prestart"]},
            {"path": "/proc/31191/exe", "args": ["libnetwork-setkey", "-exec-root=/var/run/docker"]}
        ]}});
        assert_eq!(remove_legacy_nvidia_hook(&mut s), 1);
        assert_eq!(s["hooks"]["prestart"][0]["args"][0], "libnetwork-setkey");
        assert_eq!(remove_legacy_nvidia_hook(&mut s), 0);
    }

    #[test]
    fn marks_applied() {
        let mut s = json!({"annotations": {"a": "b"}});
        assert!(!is_applied(&s));
        mark_applied(&mut s, "nvidia.com/gpu=1").unwrap();
        assert!(is_applied(&s));
        assert_eq!(s["annotations"]["a"], "b");
    }
}
