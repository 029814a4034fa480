//! Docker: /etc/docker/daemon.json, `"runtimes": {"NAME": {"path": "/usr/bin/actk-runtime"}}`
//! and optionally `"default-runtime": "NAME"` (dockerd(8), "Daemon configuration file"; dockerd
//! reloads `runtimes` on SIGHUP). Edited as JSON with key order kept (serde_json
//! `preserve_order`): every other key and value stays where it was.
//!
//! CDI (`--cdi`): `"features": {"cdi": true}` (Docker 25-27 need it; 28 has CDI on by default,
//! where it is harmless), and `"cdi-spec-dirs"` only when the directories differ from dockerd's
//! default (`/etc/cdi`, `/var/run/cdi`): dockerd before 25 refuses to start with a key it does
//! not know, and an unknown `features` entry is merely ignored.

use super::Entry;
use anyhow::{Context, Result, bail};
use serde_json::{Map, Value};

fn parse(text: &str) -> Result<Map<String, Value>> {
    if text.trim().is_empty() {
        return Ok(Map::new());
    }
    match serde_json::from_str::<Value>(text).context("not valid JSON")? {
        Value::Object(m) => Ok(m),
        other => bail!("the top level must be a JSON object, not {}", kind(&other)),
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The indentation the file uses (tab, or N spaces; 2 for a new file).
fn indent_of(text: &str) -> Vec<u8> {
    for line in text.lines().skip(1) {
        let ws: String = line.chars().take_while(|c| *c == ' ' || *c == '\t').collect();
        if !ws.is_empty() && ws.len() < line.len() {
            return if ws.starts_with('\t') { b"\t".to_vec() } else { vec![b' '; ws.len()] };
        }
    }
    b"  ".to_vec()
}

fn render(m: &Map<String, Value>, like: &str) -> Result<String> {
    use serde::Serialize;
    let indent = indent_of(like);
    let mut out = Vec::new();
    let mut ser =
        serde_json::Serializer::with_formatter(&mut out, serde_json::ser::PrettyFormatter::with_indent(&indent));
    m.serialize(&mut ser)?;
    out.push(b'\n');
    Ok(String::from_utf8(out)?)
}

/// daemon.json with runtime `e.name` added (or its path updated) and, with `set_as_default`,
/// `default-runtime` set. Errors: not JSON, not an object, `runtimes` not an object.
pub fn add(text: &str, e: &Entry<'_>) -> Result<String> {
    let mut m = parse(text)?;
    let runtimes = m.entry("runtimes").or_insert_with(|| Value::Object(Map::new()));
    let Some(r) = runtimes.as_object_mut() else { bail!("\"runtimes\" is {}, expected an object", kind(runtimes)) };
    match r.get_mut(e.name).and_then(Value::as_object_mut) {
        // Keep other fields of an existing entry (runtimeArgs) and its position.
        Some(existing) => {
            existing.insert("path".into(), Value::from(e.path));
        }
        None => {
            let mut entry = Map::new();
            entry.insert("path".into(), Value::from(e.path));
            r.insert(e.name.to_string(), Value::Object(entry));
        }
    }
    if e.set_as_default {
        m.insert("default-runtime".into(), Value::from(e.name));
    }
    render(&m, text)
}

/// daemon.json without runtime `name`; `default-runtime` restored from `original` (the `.bak`)
/// when it named `name`; an empty `runtimes` removed when the original had none.
pub fn remove(text: &str, name: &str, original: Option<&str>) -> Result<String> {
    let mut m = parse(text)?;
    let orig = original.and_then(|o| parse(o).ok());
    if let Some(r) = m.get_mut("runtimes").and_then(Value::as_object_mut) {
        r.shift_remove(name);
        let had_runtimes = orig.as_ref().is_some_and(|o| o.contains_key("runtimes"));
        if r.is_empty() && !had_runtimes {
            m.shift_remove("runtimes");
        }
    }
    if m.get("default-runtime").and_then(Value::as_str) == Some(name) {
        match orig.as_ref().and_then(|o| o.get("default-runtime")) {
            Some(prev) if prev.as_str() != Some(name) => {
                m.insert("default-runtime".into(), prev.clone());
            }
            _ => {
                m.shift_remove("default-runtime");
            }
        }
    }
    render(&m, text)
}

/// dockerd's CDI spec directories when daemon.json names none.
const DOCKER_CDI_DIRS: &[&str] = &["/etc/cdi", "/var/run/cdi"];

/// daemon.json with CDI turned on (see the module docs). Errors: not JSON, not an object,
/// `features` not an object.
pub fn add_cdi(text: &str, dirs: &[String]) -> Result<String> {
    let mut m = parse(text)?;
    let features = m.entry("features").or_insert_with(|| Value::Object(Map::new()));
    let Some(f) = features.as_object_mut() else { bail!("\"features\" is {}, expected an object", kind(features)) };
    f.insert("cdi".into(), Value::Bool(true));
    if dirs.iter().map(String::as_str).ne(DOCKER_CDI_DIRS.iter().copied()) {
        m.insert("cdi-spec-dirs".into(), Value::from(dirs.to_vec()));
    }
    render(&m, text)
}

/// daemon.json with `features.cdi` and `cdi-spec-dirs` as `original` (the `.bak`) had them,
/// or removed when it had none; a `features` object left empty goes when the original had none.
pub fn remove_cdi(text: &str, original: Option<&str>) -> Result<String> {
    let mut m = parse(text)?;
    let orig = original.and_then(|o| parse(o).ok()).unwrap_or_default();
    let orig_features = orig.get("features").and_then(Value::as_object);
    if let Some(f) = m.get_mut("features").and_then(Value::as_object_mut) {
        match orig_features.and_then(|o| o.get("cdi")) {
            Some(v) => {
                f.insert("cdi".into(), v.clone());
            }
            None => {
                f.shift_remove("cdi");
            }
        }
        if f.is_empty() && orig_features.is_none() {
            m.shift_remove("features");
        }
    }
    match orig.get("cdi-spec-dirs") {
        Some(v) => {
            m.insert("cdi-spec-dirs".into(), v.clone());
        }
        None => {
            m.shift_remove("cdi-spec-dirs");
        }
    }
    render(&m, text)
}

/// Same JSON value.
pub fn same(a: &str, b: &str) -> bool {
    matches!((parse(a), parse(b)), (Ok(x), Ok(y)) if x == y)
}

/// `{}` or nothing.
pub fn is_empty(text: &str) -> bool {
    parse(text).is_ok_and(|m| m.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    const F11: &str = r#"{
    "features": {"buildkit": true},
    "log-driver": "json-file",
    "log-opts": {"max-size": "10m", "max-file": "3"},
    "default-runtime": "runc",
    "runtimes": {"crun": {"path": "/usr/bin/crun", "runtimeArgs": ["--debug"]}},
    "storage-driver": "overlay2"
}
"#;

    fn entry(default: bool) -> Entry<'static> {
        Entry { name: "actk", path: "/usr/bin/actk-runtime", set_as_default: default }
    }

    #[test]
    fn f11_adds_only_actk_and_keeps_every_other_key_in_order() {
        let out = add(F11, &entry(false)).unwrap();
        let v: Value = serde_json::from_str(&out).unwrap();
        let mut want: Value = serde_json::from_str(F11).unwrap();
        want["runtimes"]["actk"] = serde_json::json!({"path": "/usr/bin/actk-runtime"});
        assert_eq!(v, want);
        let keys: Vec<_> = v.as_object().unwrap().keys().cloned().collect();
        assert_eq!(keys, ["features", "log-driver", "log-opts", "default-runtime", "runtimes", "storage-driver"]);
        assert_eq!(v["runtimes"].as_object().unwrap().keys().collect::<Vec<_>>(), ["crun", "actk"]);
        assert!(out.contains("\n    \"features\""), "4-space indentation kept:\n{out}");
        // Adding twice changes nothing more.
        assert_eq!(add(&out, &entry(false)).unwrap(), out);
    }

    #[test]
    fn f11_remove_gives_back_the_same_value() {
        let out = add(F11, &entry(true)).unwrap();
        assert!(out.contains("\"default-runtime\": \"actk\""));
        let back = remove(&out, "actk", Some(F11)).unwrap();
        assert!(same(&back, F11), "{back}");
        let v: Value = serde_json::from_str(&back).unwrap();
        assert_eq!(v["default-runtime"], "runc");
    }

    #[test]
    fn new_file_and_its_removal() {
        let out = add("", &entry(false)).unwrap();
        assert_eq!(
            out,
            "{\n  \"runtimes\": {\n    \"actk\": {\n      \"path\": \"/usr/bin/actk-runtime\"\n    }\n  }\n}\n"
        );
        assert!(is_empty(&remove(&out, "actk", None).unwrap()));
    }

    #[test]
    fn cdi_feature_on_keeps_other_features_and_comes_off_again() {
        let dirs: Vec<String> = DOCKER_CDI_DIRS.iter().map(|d| d.to_string()).collect();
        let out = add_cdi(F11, &dirs).unwrap();
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["features"], serde_json::json!({"buildkit": true, "cdi": true}));
        assert!(v.get("cdi-spec-dirs").is_none(), "default dirs are not written (dockerd < 25 rejects the key)");
        assert_eq!(add_cdi(&out, &dirs).unwrap(), out, "twice changes nothing more");
        assert!(same(&remove_cdi(&out, Some(F11)).unwrap(), F11));

        let out = add_cdi("", &["/run/actk/cdi".to_string()]).unwrap();
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v, serde_json::json!({"features": {"cdi": true}, "cdi-spec-dirs": ["/run/actk/cdi"]}));
        assert!(is_empty(&remove_cdi(&out, None).unwrap()));
        let off = r#"{"features": {"cdi": false}}"#;
        assert!(
            same(&remove_cdi(&add_cdi(off, &dirs).unwrap(), Some(off)).unwrap(), off),
            "the original value comes back"
        );
        assert!(add_cdi(r#"{"features": []}"#, &dirs).unwrap_err().to_string().contains("\"features\" is an array"));
    }

    #[test]
    fn bad_files_are_errors() {
        assert!(add("[1]", &entry(false)).unwrap_err().to_string().contains("must be a JSON object"));
        assert!(add("{\"runtimes\": 3}", &entry(false)).unwrap_err().to_string().contains("\"runtimes\" is a number"));
        assert!(add("{", &entry(false)).is_err());
    }
}
