//! containerd: /etc/containerd/config.toml, the CRI plugin's runtime table
//! `[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.NAME]` with
//! `runtime_type = "io.containerd.runc.v2"` and `options.BinaryName` = actk-runtime (the runc v2
//! shim then calls actk-runtime as runc). Config `version = 3` (containerd 2.x) keeps runtimes
//! under `plugins."io.containerd.cri.v1.runtime"`. `--set-as-default` sets
//! `containerd.default_runtime_name`. Edited with toml_edit: comments and layout stay.
//!
//! CDI (`--cdi`): `enable_cdi = true` and `cdi_spec_dirs = [...]` in the same plugin table
//! (containerd 1.7: `io.containerd.grpc.v1.cri`, off by default; containerd 2: on by default,
//! `io.containerd.cri.v1.runtime` in a version 3 file; a version 2 file is migrated by
//! containerd 2 and works for both).
//!
//! Drop-in (`--drop-in FILE`): the same tables go to FILE, a file of its own, and the main config
//! gets FILE in its top-level `imports` (unless a glob there already covers it). containerd (1.5+
//! and 2.x) merges imported files into the main config table by table (checked with containerd
//! 2.1's `config dump`), so the main file keeps only one line of actk's.

use super::Entry;
use super::tomlx::{get_table, parse, prune, restore_default, restore_key, set, table_at};
use anyhow::{Result, bail};
use toml_edit::{Array, DocumentMut, value};

fn plugin(doc: &DocumentMut) -> &'static str {
    match doc.get("version").and_then(|v| v.as_integer()) {
        Some(3) => "io.containerd.cri.v1.runtime",
        _ => "io.containerd.grpc.v1.cri",
    }
}

/// A new file's `version = 2`: containerd 1.7 needs it and containerd 2 migrates it.
fn versioned(text: &str) -> Result<DocumentMut> {
    let mut doc = parse(text)?;
    if doc.as_table().is_empty() {
        doc.insert("version", value(2));
    }
    Ok(doc)
}

/// config.toml with the runtime added (or updated).
pub fn add(text: &str, e: &Entry<'_>) -> Result<String> {
    let mut doc = versioned(text)?;
    let p = plugin(&doc);
    let rt = table_at(&mut doc, &["plugins", p, "containerd", "runtimes", e.name])?;
    rt.set_implicit(false);
    set(rt, "runtime_type", value("io.containerd.runc.v2"));
    let opts = table_at(&mut doc, &["plugins", p, "containerd", "runtimes", e.name, "options"])?;
    opts.set_implicit(false);
    set(opts, "BinaryName", value(e.path));
    if e.set_as_default {
        set(table_at(&mut doc, &["plugins", p, "containerd"])?, "default_runtime_name", value(e.name));
    }
    Ok(doc.to_string())
}

/// config.toml without the runtime; the default restored from `original` when it named it.
pub fn remove(text: &str, name: &str, original: Option<&str>) -> Result<String> {
    let mut doc = parse(text)?;
    let p = plugin(&doc);
    let path = ["plugins", p, "containerd", "runtimes"];
    if let Some(r) = get_table(&mut doc, &path) {
        r.remove(name);
    }
    restore_default(&mut doc, &path[..3], "default_runtime_name", name, original);
    prune(&mut doc, &path, 0);
    Ok(finish(doc, original))
}

fn finish(mut doc: DocumentMut, original: Option<&str>) -> String {
    if doc.as_table().len() == 1 && doc.get("version").is_some() && original.is_none() {
        // Only the `version` line configure wrote into a new file is left.
        doc.remove("version");
    }
    doc.to_string()
}

/// config.toml with CDI turned on: `enable_cdi = true`, `cdi_spec_dirs = dirs` in the CRI
/// plugin's table for the file's version.
pub fn add_cdi(text: &str, dirs: &[String]) -> Result<String> {
    let mut doc = versioned(text)?;
    let p = plugin(&doc);
    let t = table_at(&mut doc, &["plugins", p])?;
    t.set_implicit(false);
    set(t, "enable_cdi", value(true));
    set(t, "cdi_spec_dirs", value(dirs.iter().collect::<Array>()));
    Ok(doc.to_string())
}

/// config.toml with `enable_cdi` and `cdi_spec_dirs` as `original` (the `.bak`) had them, or
/// removed when it had none.
pub fn remove_cdi(text: &str, original: Option<&str>) -> Result<String> {
    let mut doc = parse(text)?;
    let p = plugin(&doc);
    for key in ["enable_cdi", "cdi_spec_dirs"] {
        restore_key(&mut doc, &["plugins", p], key, original);
    }
    prune(&mut doc, &["plugins", p], 0);
    Ok(finish(doc, original))
}

/// The main config with `drop_in` in its top-level `imports` (kept as is when an entry or glob
/// there already names it). A new main file gets `version = 2` too.
pub fn add_import(text: &str, drop_in: &str) -> Result<String> {
    let mut doc = versioned(text)?;
    let imports = doc.entry("imports").or_insert_with(|| value(Array::new()));
    let Some(list) = imports.as_array_mut() else { bail!("`imports` is not an array of file names") };
    let covered = list.iter().filter_map(|v| v.as_str()).any(|i| i == drop_in || glob_matches(i, drop_in));
    if !covered {
        list.push(drop_in);
    }
    Ok(doc.to_string())
}

/// The main config without `drop_in` in `imports`, unless `original` had it there.
pub fn remove_import(text: &str, drop_in: &str, original: Option<&str>) -> Result<String> {
    let mut doc = parse(text)?;
    let had = original.and_then(|o| o.parse::<toml::Table>().ok()).is_some_and(|t| {
        t.get("imports").and_then(|v| v.as_array()).is_some_and(|a| a.iter().any(|v| v.as_str() == Some(drop_in)))
    });
    if !had && let Some(list) = doc.get_mut("imports").and_then(|v| v.as_array_mut()) {
        list.retain(|v| v.as_str() != Some(drop_in));
        if list.is_empty() && original.is_none_or(|o| !o.contains("imports")) {
            doc.remove("imports");
        }
    }
    Ok(finish(doc, original))
}

/// The config version the main file declares (2 when it declares none): a drop-in must use the
/// same table names.
pub fn version_of(text: &str) -> i64 {
    text.parse::<toml::Table>().ok().and_then(|t| t.get("version").and_then(|v| v.as_integer())).unwrap_or(2)
}

/// `pattern` as containerd expands an import (filepath.Glob: `*` and `?` within one path
/// component, no `/` crossing) matches `path`.
fn glob_matches(pattern: &str, path: &str) -> bool {
    let (pd, pf) = pattern.rsplit_once('/').unwrap_or(("", pattern));
    let (d, f) = path.rsplit_once('/').unwrap_or(("", path));
    pd == d && component_matches(pf.as_bytes(), f.as_bytes())
}

fn component_matches(p: &[u8], s: &[u8]) -> bool {
    match p.split_first() {
        None => s.is_empty(),
        Some((b'*', rest)) => (0..=s.len()).any(|i| component_matches(rest, &s[i..])),
        Some((b'?', rest)) => !s.is_empty() && component_matches(rest, &s[1..]),
        Some((c, rest)) => s.first() == Some(c) && component_matches(rest, &s[1..]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::runtime::{toml_is_empty, toml_same};

    const V2: &str = r#"# containerd config, hand-edited
version = 2

[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "registry.k8s.io/pause:3.9" # pinned
    [plugins."io.containerd.grpc.v1.cri".containerd]
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
"#;

    fn e(default: bool) -> Entry<'static> {
        Entry { name: "actk", path: "/usr/bin/actk-runtime", set_as_default: default }
    }

    #[test]
    fn adds_runtime_keeping_comments_and_other_tables() {
        let out = add(V2, &e(true)).unwrap();
        assert!(out.starts_with("# containerd config, hand-edited\nversion = 2\n"), "{out}");
        assert!(out.contains("sandbox_image = \"registry.k8s.io/pause:3.9\" # pinned"), "{out}");
        let t: toml::Table = out.parse().unwrap();
        let c = &t["plugins"]["io.containerd.grpc.v1.cri"]["containerd"];
        assert_eq!(c["runtimes"]["actk"]["runtime_type"].as_str(), Some("io.containerd.runc.v2"));
        assert_eq!(c["runtimes"]["actk"]["options"]["BinaryName"].as_str(), Some("/usr/bin/actk-runtime"));
        assert_eq!(c["runtimes"]["runc"]["runtime_type"].as_str(), Some("io.containerd.runc.v2"));
        assert_eq!(c["default_runtime_name"].as_str(), Some("actk"));
        let back = remove(&out, "actk", Some(V2)).unwrap();
        assert!(toml_same(&back, V2), "{back}");
    }

    #[test]
    fn cdi_on_in_the_plugin_of_each_version_and_back() {
        let dirs = ["/etc/cdi".to_string(), "/var/run/cdi".to_string()];
        let out = add_cdi(V2, &dirs).unwrap();
        assert!(out.contains("sandbox_image = \"registry.k8s.io/pause:3.9\" # pinned"), "{out}");
        let t: toml::Table = out.parse().unwrap();
        let cri = &t["plugins"]["io.containerd.grpc.v1.cri"];
        assert_eq!(cri["enable_cdi"].as_bool(), Some(true));
        assert_eq!(cri["cdi_spec_dirs"].as_array().unwrap().len(), 2);
        assert_eq!(cri["containerd"]["default_runtime_name"].as_str(), Some("runc"), "other keys stay");
        assert!(toml_same(&remove_cdi(&out, Some(V2)).unwrap(), V2));

        let v3 = "version = 3\n[plugins.\"io.containerd.cri.v1.runtime\"]\nenable_cdi = false # off here\n";
        let out = add_cdi(v3, &dirs[..1]).unwrap();
        let t: toml::Table = out.parse().unwrap();
        assert_eq!(t["plugins"]["io.containerd.cri.v1.runtime"]["enable_cdi"].as_bool(), Some(true));
        assert!(out.contains("# off here"), "the key's comment stays: {out}");
        let back = remove_cdi(&out, Some(v3)).unwrap();
        assert!(toml_same(&back, v3), "the original's value comes back: {back}");
        assert!(toml_is_empty(&remove_cdi(&add_cdi("", &dirs).unwrap(), None).unwrap()));
    }

    #[test]
    fn drop_in_import_added_once_and_taken_back() {
        let main = "version = 3\nimports = [\"/etc/containerd/conf.d/*.toml\"]\n";
        assert_eq!(add_import(main, "/etc/containerd/conf.d/99-actk.toml").unwrap(), main, "the glob covers it");
        let out = add_import("version = 3\n", "/etc/containerd/conf.d/99-actk.toml").unwrap();
        let t: toml::Table = out.parse().unwrap();
        assert_eq!(t["imports"].as_array().unwrap()[0].as_str(), Some("/etc/containerd/conf.d/99-actk.toml"));
        assert_eq!(add_import(&out, "/etc/containerd/conf.d/99-actk.toml").unwrap(), out, "only once");
        let back = remove_import(&out, "/etc/containerd/conf.d/99-actk.toml", Some("version = 3\n")).unwrap();
        assert!(toml_same(&back, "version = 3\n"), "{back}");
        assert_eq!(version_of(main), 3);
        assert_eq!(version_of(""), 2);
        assert!(!glob_matches("/etc/containerd/*.toml", "/etc/containerd/conf.d/a.toml"));
        assert!(glob_matches("/etc/c/9?-*.toml", "/etc/c/99-actk.toml"));
        assert!(add_import("imports = 3\n", "/x.toml").is_err());
    }

    #[test]
    fn version_3_uses_the_runtime_plugin_and_new_file_round_trips() {
        let out = add("version = 3\n", &e(false)).unwrap();
        let t: toml::Table = out.parse().unwrap();
        assert!(t["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]["actk"].is_table(), "{out}");
        let fresh = add("", &e(false)).unwrap();
        assert!(fresh.starts_with("version = 2\n"), "{fresh}");
        assert!(toml_is_empty(&remove(&fresh, "actk", None).unwrap()));
    }
}
