//! CRI-O: a drop-in file (default /etc/crio/crio.conf.d/99-actk.conf, read after crio.conf)
//! with `[crio.runtime.runtimes.NAME] runtime_path = ..., runtime_type = "oci"`, and with
//! `--set-as-default` `[crio.runtime] default_runtime = NAME` (crio.conf(5)). toml_edit keeps
//! anything else in the file.

use super::Entry;
use super::tomlx::{get_table, parse, prune, restore_default, set, table_at};
use anyhow::Result;
use toml_edit::value;

/// The drop-in with the runtime added (or updated).
pub fn add(text: &str, e: &Entry<'_>) -> Result<String> {
    let mut doc = parse(text)?;
    let rt = table_at(&mut doc, &["crio", "runtime", "runtimes", e.name])?;
    rt.set_implicit(false);
    set(rt, "runtime_path", value(e.path));
    set(rt, "runtime_type", value("oci"));
    if e.set_as_default {
        let r = table_at(&mut doc, &["crio", "runtime"])?;
        r.set_implicit(false);
        set(r, "default_runtime", value(e.name));
    }
    Ok(doc.to_string())
}

/// The drop-in without the runtime (and without the default if it named it).
pub fn remove(text: &str, name: &str, original: Option<&str>) -> Result<String> {
    let mut doc = parse(text)?;
    if let Some(r) = get_table(&mut doc, &["crio", "runtime", "runtimes"]) {
        r.remove(name);
    }
    restore_default(&mut doc, &["crio", "runtime"], "default_runtime", name, original);
    prune(&mut doc, &["crio", "runtime", "runtimes"], 0);
    Ok(doc.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::runtime::toml_is_empty;

    #[test]
    fn drop_in_round_trip() {
        let e = Entry { name: "nvidia", path: "/usr/bin/actk-runtime", set_as_default: true };
        let out = add("", &e).unwrap();
        let t: toml::Table = out.parse().unwrap();
        assert_eq!(t["crio"]["runtime"]["runtimes"]["nvidia"]["runtime_path"].as_str(), Some("/usr/bin/actk-runtime"));
        assert_eq!(t["crio"]["runtime"]["runtimes"]["nvidia"]["runtime_type"].as_str(), Some("oci"));
        assert_eq!(t["crio"]["runtime"]["default_runtime"].as_str(), Some("nvidia"));
        assert!(toml_is_empty(&remove(&out, "nvidia", None).unwrap()));
    }
}
