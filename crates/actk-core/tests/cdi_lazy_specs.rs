//! A container start reads CDI specs lazily (issue 31, `Registry::load_for_start`): the
//! spec-level part of a file at once, a device only when the start names it. What it resolves
//! must be what the whole reading (`Registry::load`) resolves: the same edits for every device
//! the whole reading serves, a refusal (naming the file and the JSON pointer) for every device
//! it refuses, alone and together with the file's other devices.
//!
//! Checked on the specs `actk cdi generate` writes for every fixture (`fixture::ALL`, prepared
//! with mknod: root only, those skipped otherwise), on the JSON specs of the fuzz and CDI
//! oracle corpora, and on hostile specs: one device of a good spec broken in each way the
//! rules know (relative paths, bad permissions, device numbers, NULs, unknown fields, wrong
//! types, a version too low for its fields, bad net devices and closID, no edits), names that
//! make the file be read whole (numbers, missing, duplicates, null devices), and spec-level
//! defects. The one documented difference: a device that is not named is not read, so a key
//! given twice inside it (the whole reading cannot parse the file then) refuses the whole file
//! there and only that device here.

use actk_core::cdi::{ContainerEdits, GenerateOptions, QualifiedName, Registry};
use serde_json::{Value, json};
use std::path::Path;

/// What a registry resolves for `names`: the edits, or the error.
fn outcome(reg: &Registry, names: &[String]) -> Result<ContainerEdits, String> {
    let q: Vec<QualifiedName> = names.iter().map(|n| QualifiedName::parse(n).unwrap()).collect();
    for n in &q {
        reg.check(n).map_err(|e| e.to_string())?;
    }
    reg.resolve(&q).map_err(|e| e.to_string())
}

/// Device names written in a spec text, as JSON strings (any the whole reading types too).
fn written_names(text: &str) -> Vec<String> {
    let Ok(v) = serde_json::from_str::<Value>(text) else { return Vec::new() };
    let kind = v.get("kind").and_then(Value::as_str).unwrap_or("");
    let mut out = Vec::new();
    for d in v.get("devices").and_then(Value::as_array).into_iter().flatten() {
        let name = match d.get("name") {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Number(n)) => n.to_string(),
            _ => continue,
        };
        if QualifiedName::parse(&format!("{kind}={name}")).is_ok() {
            out.push(format!("{kind}={name}"));
        }
    }
    out
}

/// How the two readings compared for one spec text.
#[derive(Debug, Default, PartialEq)]
struct Compared {
    /// Names the whole reading served, and the lazy one with the same edits.
    served: usize,
    /// Names both refused.
    refused: usize,
    /// Names the whole reading refused and the lazy one served.
    lazy_only: Vec<String>,
}

/// Loads `text` as `file` both ways and compares every name it writes, alone, then the names
/// the whole reading serves all together.
fn compare(file: &str, text: &str) -> Compared {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(file), text).unwrap();
    let whole = Registry::load(&[dir.path()]);
    let lazy = Registry::load_for_start(&[dir.path()]);
    let mut names = written_names(text);
    names.extend(whole.device_names().iter().map(|n| n.to_string()));
    names.push("vendor.com/dev=absent".into());
    names.sort();
    names.dedup();
    let mut c = Compared::default();
    let mut served = Vec::new();
    for n in &names {
        let one = std::slice::from_ref(n);
        match (outcome(&whole, one), outcome(&lazy, one)) {
            (Ok(a), Ok(b)) => {
                assert_eq!(a, b, "{file}: {n}: the lazy reading's edits differ");
                c.served += 1;
                served.push(n.clone());
            }
            (Ok(_), Err(e)) => panic!("{file}: {n}: the whole reading serves it, the lazy one refuses: {e}\n{text}"),
            (Err(_), Ok(_)) => c.lazy_only.push(n.clone()),
            (Err(w), Err(e)) => {
                // A device the lazy reading refused says why, with the file and the pointer,
                // in the words of the whole reading when that refused the device alone.
                if e.contains("refused") {
                    assert!(e.contains(file) && e.contains(": /"), "{file}: {n}: {e}");
                    if w.contains("refused") {
                        assert_eq!(w, e, "{file}: {n}");
                    }
                }
                c.refused += 1;
            }
        }
    }
    if !served.is_empty() {
        assert_eq!(outcome(&whole, &served), outcome(&lazy, &served), "{file}: all served names at once");
        // A container start moves the edits out instead of cloning them (resolve_into_taking):
        // the same edits, in the same order, from either reading, with the first name given
        // again last (cloned for its first mention, moved for its last).
        let mut q: Vec<QualifiedName> = served.iter().map(|n| QualifiedName::parse(n).unwrap()).collect();
        q.push(q[0].clone());
        for (how, reg) in [("whole", &whole), ("lazy", &lazy)] {
            let mut cloned = ContainerEdits::default();
            reg.resolve_into(&q, &mut cloned).unwrap();
            let mut owned = match how {
                "whole" => Registry::load(&[dir.path()]),
                _ => Registry::load_for_start(&[dir.path()]),
            };
            let mut moved = ContainerEdits::default();
            owned.resolve_into_taking(&q, &mut moved).unwrap();
            assert_eq!(moved, cloned, "{file}: {how}: the edits moved out differ from the cloned ones");
        }
    }
    c
}

fn device(name: &str, minor: u32) -> Value {
    json!({"name": name, "containerEdits": {
        "env": [format!("DEV{minor}=1")],
        "deviceNodes": [{"path": format!("/dev/x{minor}"), "type": "c", "major": 1, "minor": minor, "permissions": "rw"}],
        "mounts": [{"hostPath": format!("/lib/x{minor}.so"), "containerPath": format!("/lib/x{minor}.so"), "options": ["ro", "bind"]}]
    }})
}

/// A good spec of three devices, `1` replaced by `bad`.
fn with_device_1(bad: Value) -> String {
    json!({
        "cdiVersion": "0.7.0",
        "kind": "vendor.com/dev",
        "containerEdits": {"env": ["SPEC=1"], "hooks": [{"hookName": "createContainer", "path": "/usr/bin/hook", "args": ["hook", "x"], "env": ["PATH=/bin"]}]},
        "devices": [device("0", 0), bad, device("2", 2)]
    })
    .to_string()
}

fn edits(v: Value) -> Value {
    json!({"name": "1", "containerEdits": v})
}

/// One device of a good spec broken in every way the rules know, and names that make the file
/// be read whole: the devices the whole reading serves are served the same, the broken one is
/// refused by both.
#[test]
fn hostile_devices_resolve_as_the_whole_reading_does() {
    let node = |extra: Value| {
        let mut n = json!({"path": "/dev/x1", "type": "c", "major": 1, "minor": 1});
        n.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        edits(json!({"deviceNodes": [n]}))
    };
    let cases: Vec<(&str, Value)> = vec![
        ("relative-node-path", node(json!({"path": "dev/x1"}))),
        ("relative-host-path", node(json!({"hostPath": "x1"}))),
        ("permissions", node(json!({"permissions": "rwx"}))),
        ("bad-type", node(json!({"type": "z"}))),
        ("major-range", node(json!({"major": 5000}))),
        ("minor-negative", node(json!({"minor": -1}))),
        ("file-mode-string", node(json!({"fileMode": "438"}))),
        ("node-unknown-field", node(json!({"owner": 0}))),
        ("nul-env", edits(json!({"env": ["A=\u{0}x"]}))),
        ("env-not-pair", edits(json!({"env": ["NOVALUE"]}))),
        ("hook-relative", edits(json!({"hooks": [{"hookName": "createContainer", "path": "hook"}]}))),
        ("hook-stage", edits(json!({"hooks": [{"hookName": "whenever", "path": "/bin/hook"}]}))),
        ("hook-timeout", edits(json!({"hooks": [{"hookName": "prestart", "path": "/bin/hook", "timeout": 0}]}))),
        ("hook-nul-arg", edits(json!({"hooks": [{"hookName": "prestart", "path": "/bin/hook", "args": ["a\u{0}b"]}]}))),
        ("mount-relative", edits(json!({"mounts": [{"hostPath": "/x", "containerPath": "x"}]}))),
        ("mount-relative-host", edits(json!({"mounts": [{"hostPath": "x", "containerPath": "/x"}]}))),
        ("gids-negative", edits(json!({"additionalGids": [-1]}))),
        ("net-device-bad", edits(json!({"netDevices": [{"hostInterfaceName": "eth0/x", "name": "e"}]}))),
        ("net-device-good", edits(json!({"netDevices": [{"hostInterfaceName": "eth1", "name": "net1"}]}))),
        ("closid-bad", edits(json!({"intelRdt": {"closID": "a/b"}}))),
        ("closid-good", edits(json!({"intelRdt": {"closID": "gold"}}))),
        ("edits-unknown-field", edits(json!({"devices": []}))),
        ("no-edits", edits(json!({}))),
        ("edits-list", edits(json!([]))),
        (
            "edits-null-lists",
            edits(json!({"env": null, "deviceNodes": [{"path": "/dev/x1", "type": "c", "major": 1, "minor": 1}]})),
        ),
        ("device-unknown-field", json!({"name": "1", "extra": 1, "containerEdits": {"env": ["A=1"]}})),
        (
            "device-annotations-dup-ok",
            json!({"name": "1", "annotations": {"a": "b"}, "containerEdits": {"env": ["A=1"]}}),
        ),
        ("name-invalid", json!({"name": "bad/name", "containerEdits": {"env": ["A=1"]}})),
        ("name-escaped", json!({"name": "g\u{0070}u", "containerEdits": {"env": ["A=1"]}})),
        ("name-number", json!({"name": 1, "containerEdits": {"env": ["A=1"]}})),
        ("name-null", json!({"name": null, "containerEdits": {"env": ["A=1"]}})),
        ("name-missing", json!({"containerEdits": {"env": ["A=1"]}})),
        ("name-duplicate", json!({"name": "0", "containerEdits": {"env": ["A=1"]}})),
        ("device-null", Value::Null),
        ("device-list", json!([1])),
        ("device-string", json!("1")),
        ("version-too-low", node(json!({"hostPath": "/dev/x1"}))),
    ];
    for (case, bad) in cases {
        let mut text = with_device_1(bad);
        if case == "version-too-low" {
            text = text.replace("\"0.7.0\"", "\"0.4.0\"");
        }
        if case.starts_with("net-device") {
            text = text.replace("\"0.7.0\"", "\"1.1.0\"");
        }
        let c = compare(&format!("{case}.json"), &text);
        assert!(c.lazy_only.is_empty(), "{case}: {c:?}");
        let good = match case {
            "version-too-low" => 0,
            "name-duplicate" => 1, // both devices named 0 are refused, by rule
            _ => 2,
        };
        assert!(c.served >= good, "{case}: the good devices must be served: {c:?}");
    }
}

/// Spec-level defects refuse the file both ways (the lazy reading hands such a file to the
/// whole one); so do files that do not parse.
#[test]
fn spec_level_defects_refuse_the_file_both_ways() {
    let good = with_device_1(device("1", 1));
    let v: Value = serde_json::from_str(&good).unwrap();
    let set = |k: &str, x: Value| {
        let mut v = v.clone();
        v[k] = x;
        v.to_string()
    };
    let cases = vec![
        ("unknown-top-field", set("extra", json!(1))),
        ("bad-kind", set("kind", json!("vendor"))),
        ("unknown-version", set("cdiVersion", json!("9.9.9"))),
        ("spec-env", set("containerEdits", json!({"env": ["=x"]}))),
        ("spec-hook", set("containerEdits", json!({"hooks": [{"hookName": "prestart", "path": "rel"}]}))),
        ("spec-closid", set("containerEdits", json!({"intelRdt": {"closID": ".."}}))),
        ("spec-edits-list", set("containerEdits", json!([]))),
        ("no-devices", set("devices", json!([]))),
        ("devices-object", set("devices", json!({}))),
        ("annotations-dup", good.replacen("\"kind\"", "\"annotations\": {\"a\": \"1\", \"a\": \"2\"}, \"kind\"", 1)),
        ("top-dup-key", good.replacen("\"kind\"", "\"cdiVersion\": \"0.7.0\", \"kind\"", 1)),
        ("trailing", format!("{good} x")),
        ("truncated", good[..good.len() - 3].to_string()),
    ];
    for (case, text) in cases {
        let c = compare(&format!("{case}.json"), &text);
        assert_eq!(c.served, 0, "{case}: {c:?}");
        assert!(c.lazy_only.is_empty(), "{case}: {c:?}");
    }
    // `devices` before the spec-level edits, as `actk cdi generate` and nvidia-ctk write it:
    // the lazy reading does not scan what follows the devices (issue 31) and leaves it to its
    // reading of the spec-level part, which must refuse the same defects there.
    let devices_first = |edits: &str| {
        format!(
            r#"{{"cdiVersion":"0.7.0","kind":"vendor.com/dev","devices":{},{edits}}}"#,
            json!([device("0", 0), device("1", 1), device("2", 2)])
        )
    };
    let good_edits = r#""containerEdits":{"env":["SPEC=1"]}"#;
    let c = compare("devices-first.json", &devices_first(good_edits));
    assert_eq!((c.served, c.lazy_only.len()), (3, 0), "devices-first: {c:?}");
    let cases = vec![
        ("after-spec-env", devices_first(r#""containerEdits":{"env":["=x"]}"#)),
        ("after-bad-json", devices_first(r#""containerEdits":{"env":["A=1",]}"#)),
        ("after-second-devices", devices_first(&format!(r#"{good_edits},"devices":[]"#))),
        ("after-escaped-devices", devices_first(&format!(r#"{good_edits},"d\u0065vices":[]"#))),
        ("after-dup-key", devices_first(&format!(r#"{good_edits},"kind":"vendor.com/dev""#))),
        ("after-unknown", devices_first(&format!(r#"{good_edits},"extra":1"#))),
        ("after-trailing", format!("{} x", devices_first(good_edits))),
        ("after-open-string", devices_first(r#""containerEdits":{"env":["A=1]}"#)),
    ];
    for (case, text) in cases {
        let c = compare(&format!("{case}.json"), &text);
        assert_eq!(c.served, 0, "{case}: {c:?}");
        assert!(c.lazy_only.is_empty(), "{case}: {c:?}");
    }
    // Every device broken: the whole reading refuses the file ("none of its 3 device(s) is
    // usable"), the lazy one each device as it is named.
    let bad = |n: &str| json!({"name": n, "containerEdits": {"deviceNodes": [{"path": "rel"}]}});
    let text = json!({"cdiVersion": "0.5.0", "kind": "vendor.com/dev", "devices": [bad("0"), bad("1")]}).to_string();
    let c = compare("all-bad.json", &text);
    assert_eq!((c.served, c.lazy_only.len()), (0, 0), "{c:?}");
}

/// The documented difference: a key given twice inside a device nobody names. The whole
/// reading cannot parse the file and refuses all of it; the lazy one never reads that device,
/// serves the others, and refuses it when named.
#[test]
fn a_duplicate_key_in_an_unnamed_device_refuses_only_that_device_when_lazy() {
    let text = with_device_1(json!({"name": "1", "containerEdits": {"env": ["A=1"]}})).replacen(
        "{\"env\":[\"A=1\"]}",
        "{\"env\":[\"A=1\"],\"env\":[\"B=1\"]}",
        1,
    );
    assert!(text.contains("\"B=1\""), "{text}");
    let c = compare("dup-key.json", &text);
    assert_eq!(c.lazy_only, ["vendor.com/dev=0", "vendor.com/dev=2"], "{c:?}");
    assert_eq!(c.refused, 2, "the broken device and an absent one: {c:?}");
    // The same for `name` given twice: the lazy reading takes the first from the text and
    // refuses the device when it is named.
    let text = with_device_1(json!({"name": "1", "containerEdits": {"env": ["A=1"]}})).replacen(
        "{\"name\":\"1\",",
        "{\"name\":\"1\",\"name\":\"3\",",
        1,
    );
    assert!(text.contains("\"3\""), "{text}");
    let c = compare("dup-name-key.json", &text);
    assert_eq!(c.lazy_only, ["vendor.com/dev=0", "vendor.com/dev=2"], "{c:?}");
    let lazy = {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("d.json"), &text).unwrap();
        Registry::load_for_start(&[dir.path()])
    };
    let e = outcome(&lazy, &["vendor.com/dev=1".to_string()]).unwrap_err();
    assert!(e.contains("refused") && e.contains("d.json") && e.contains("/devices/1"), "{e}");
}

/// The JSON specs of the fuzz corpus and the CDI oracle corpus.
#[test]
fn corpus_specs_resolve_as_the_whole_reading_does() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut n = 0;
    for dir in ["fuzz/corpus/cdi_spec", "tests/peers/cdi-oracle/corpus"] {
        for e in std::fs::read_dir(repo.join(dir)).unwrap() {
            let p = e.unwrap().path();
            if p.extension().and_then(|e| e.to_str()) != Some("json") {
                continue;
            }
            let text = std::fs::read_to_string(&p).unwrap();
            let c = compare(p.file_name().unwrap().to_str().unwrap(), &text);
            assert!(c.lazy_only.is_empty(), "{}: {c:?}", p.display());
            n += 1;
        }
    }
    assert!(n >= 4, "corpus files read: {n}");
}

/// The specs `actk cdi generate` writes for every fixture (all capabilities, the ld.so.cache
/// hook), and the same specs with their last device broken.
#[test]
fn fixture_specs_resolve_as_the_whole_reading_does() {
    let profiles = actk_core::profile::builtin();
    let opts = GenerateOptions {
        capabilities: Some(vec!["all".into()]),
        ldcache_hook: Some("/usr/bin/actk-hook".into()),
        ..Default::default()
    };
    let mut specs = 0;
    for name in actk_testsupport::fixture::ALL {
        let Some(f) = actk_testsupport::fixture::prepare(name).expect("fixture") else { return };
        let root = f.path("");
        let inventory = actk_core::discover::discover_roots_with(
            &root,
            &root,
            &profiles,
            &actk_core::discover::DiscoverOptions::default(),
        );
        let Ok(generated) = actk_core::cdi::generate::generate_all(&profiles, &inventory, None, &opts) else {
            continue;
        };
        for spec in generated {
            let text = serde_json::to_string_pretty(&spec).unwrap();
            let file = format!("{name}-{}.json", spec.kind.replace('/', "-"));
            let c = compare(&file, &text);
            assert!(c.lazy_only.is_empty() && c.refused == 1 && c.served == spec.devices.len(), "{file}: {c:?}");
            // The last device broken: refused both ways, the others served the same.
            let mut v: Value = serde_json::from_str(&text).unwrap();
            let last = v["devices"].as_array().unwrap().len() - 1;
            v["devices"][last]["containerEdits"]["deviceNodes"] = json!([{"path": "relative"}]);
            let c = compare(&format!("broken-{file}"), &v.to_string());
            assert!(c.lazy_only.is_empty() && c.served == spec.devices.len() - 1, "broken {file}: {c:?}");
            specs += 1;
        }
    }
    assert!(specs >= actk_testsupport::fixture::ALL.len() / 2, "specs compared: {specs}");
}
