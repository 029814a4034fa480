//! podman: containers.conf(5) `[engine.runtimes] NAME = ["/usr/bin/actk-runtime"]` (a list of
//! candidate paths), and with `--set-as-default` `[engine] runtime = "NAME"`. toml_edit keeps
//! comments and the rest of the file.

use super::Entry;
use super::tomlx::{get_table, parse, prune, restore_default, set, table_at};
use anyhow::Result;
use toml_edit::{Array, value};

/// containers.conf with the runtime added (or updated).
pub fn add(text: &str, e: &Entry<'_>) -> Result<String> {
    let mut doc = parse(text)?;
    let rts = table_at(&mut doc, &["engine", "runtimes"])?;
    rts.set_implicit(false);
    let mut paths = Array::new();
    paths.push(e.path);
    set(rts, e.name, value(paths));
    if e.set_as_default {
        let eng = table_at(&mut doc, &["engine"])?;
        eng.set_implicit(false);
        set(eng, "runtime", value(e.name));
    }
    Ok(doc.to_string())
}

/// containers.conf without the runtime (and the default restored when it named it).
pub fn remove(text: &str, name: &str, original: Option<&str>) -> Result<String> {
    let mut doc = parse(text)?;
    if let Some(r) = get_table(&mut doc, &["engine", "runtimes"]) {
        r.remove(name);
    }
    restore_default(&mut doc, &["engine"], "runtime", name, original);
    let had_runtimes =
        original.and_then(|o| parse(o).ok()).is_some_and(|mut o| get_table(&mut o, &["engine", "runtimes"]).is_some());
    if !had_runtimes {
        prune(&mut doc, &["engine", "runtimes"], 0);
    }
    Ok(doc.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::runtime::toml_same;

    const CONF: &str = "# site containers.conf\n[containers]\nulimits = [\"nofile=1024:1024\"]\n\n[engine]\n# runc: crun fails on hybrid cgroups here\nruntime = \"runc\"\n";

    #[test]
    fn adds_engine_runtime_keeping_comments_and_round_trips() {
        let e = Entry { name: "actk", path: "/usr/bin/actk-runtime", set_as_default: true };
        let out = add(CONF, &e).unwrap();
        assert!(out.contains("# runc: crun fails on hybrid cgroups here"), "{out}");
        let t: toml::Table = out.parse().unwrap();
        assert_eq!(t["engine"]["runtimes"]["actk"].as_array().unwrap()[0].as_str(), Some("/usr/bin/actk-runtime"));
        assert_eq!(t["engine"]["runtime"].as_str(), Some("actk"));
        assert_eq!(t["containers"]["ulimits"].as_array().unwrap().len(), 1);
        let back = remove(&out, "actk", Some(CONF)).unwrap();
        assert!(toml_same(&back, CONF), "{back}");
    }
}
