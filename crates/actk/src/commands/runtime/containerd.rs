//! containerd: /etc/containerd/config.toml, the CRI plugin's runtime table
//! `[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.NAME]` with
//! `runtime_type = "io.containerd.runc.v2"` and `options.BinaryName` = actk-runtime (the runc v2
//! shim then calls actk-runtime as runc). Config `version = 3` (containerd 2.x) keeps runtimes
//! under `plugins."io.containerd.cri.v1.runtime"`. `--set-as-default` sets
//! `containerd.default_runtime_name`. Edited with toml_edit: comments and layout stay.

use super::Entry;
use super::tomlx::{get_table, parse, prune, restore_default, set, table_at};
use anyhow::Result;
use toml_edit::{DocumentMut, value};

fn plugin(doc: &DocumentMut) -> &'static str {
    match doc.get("version").and_then(|v| v.as_integer()) {
        Some(3) => "io.containerd.cri.v1.runtime",
        _ => "io.containerd.grpc.v1.cri",
    }
}

/// config.toml with the runtime added (or updated).
pub fn add(text: &str, e: &Entry<'_>) -> Result<String> {
    let mut doc = parse(text)?;
    if doc.as_table().is_empty() {
        doc.insert("version", value(2));
    }
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
    if doc.as_table().len() == 1 && doc.get("version").is_some() && original.is_none() {
        // Only the `version` line configure wrote into a new file is left.
        doc.remove("version");
    }
    Ok(doc.to_string())
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
    fn version_3_uses_the_runtime_plugin_and_new_file_round_trips() {
        let out = add("version = 3\n", &e(false)).unwrap();
        let t: toml::Table = out.parse().unwrap();
        assert!(t["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]["actk"].is_table(), "{out}");
        let fresh = add("", &e(false)).unwrap();
        assert!(fresh.starts_with("version = 2\n"), "{fresh}");
        assert!(toml_is_empty(&remove(&fresh, "actk", None).unwrap()));
    }
}
