//! Property tests of the CDI parsers (cdi/validate.rs, cdi/name.rs, cdi/write.rs): spec files
//! in /etc/cdi and /var/run/cdi are read by actk-runtime on every container start that asks for
//! a device, and qualified names come from container env and annotations.
//!
//! Invariants:
//! - any text, as JSON or YAML, gives a spec or errors; every error names the file;
//! - a valid spec with one field mutated (any JSON at any place, or a field removed) is either
//!   still valid or rejected with errors naming the file (and a JSON pointer for rule errors);
//! - a valid spec written as JSON or YAML reads back equal;
//! - the registry's fast path (`spec_from_text`) gives the long way's verdict and spec;
//! - the start's JSON scanner (`cdi::scan`) accepts exactly the text serde_json accepts, and
//!   splits a spec into the devices and the rest serde_json reads there;
//! - any string given as a qualified name or kind parses or errors naming it; a parsed name
//!   prints back as the input.
//!
//! Cases per property: `PROPTEST_CASES` (default 256); counts go to `$ACTK_VERIFY_COUNTS`.

use actk_core::cdi::scan::{split_devices, value_end};
use actk_core::cdi::validate::{parse_value, spec_from_text, spec_from_value, validate_value};
use actk_core::cdi::write::to_text;
use actk_core::cdi::{CdiError, Format, Kind, QualifiedName};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use serde_json::{Value, json};
use std::path::Path;

mod common;
use common::check;

/// A spec as `actk cdi generate` writes one for two GPUs: every kind of edit, spec-level and
/// per device.
fn good() -> Value {
    json!({
        "cdiVersion": "0.6.0",
        "kind": "nvidia.com/gpu",
        "devices": [
            {"name": "0", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0}]}},
            {"name": "GPU-8f6a2c1e-0000", "annotations": {"a": "b"}, "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia1", "hostPath": "/dev/nvidia1", "type": "c", "major": 195, "minor": 1, "permissions": "rw"}]}},
            {"name": "all", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}, {"path": "/dev/nvidia1"}]}}
        ],
        "containerEdits": {
            "env": ["NVIDIA_VISIBLE_DEVICES=void"],
            "deviceNodes": [{"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255}],
            "mounts": [{"hostPath": "/usr/lib/x86_64-linux-gnu/libcuda.so.1", "containerPath": "/usr/lib/x86_64-linux-gnu/libcuda.so.1", "options": ["ro", "nosuid", "nodev", "bind"]}],
            "hooks": [{"hookName": "createContainer", "path": "/usr/bin/actk-hook", "args": ["actk-hook", "update-ldcache", "--folder", "/usr/lib/x86_64-linux-gnu"], "env": ["PATH=/bin"]}]
        }
    })
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        prop::sample::select(vec![
            "",
            "c",
            "b",
            "rwm",
            "x",
            "/dev/x",
            "rel/path",
            "prestart",
            "1.1.0",
            "0.2.0",
            "a=b",
            "=",
            "nvidia.com/gpu"
        ])
        .prop_map(Value::from),
        ".{0,10}".prop_map(Value::String),
    ];
    leaf.prop_recursive(2, 12, 3, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
            prop::collection::vec(("[a-zA-Z]{0,8}", inner), 0..3)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

/// Every JSON pointer in `v`.
fn pointers(v: &Value, at: String, out: &mut Vec<String>) {
    out.push(at.clone());
    match v {
        Value::Object(m) => m.iter().for_each(|(k, c)| pointers(c, format!("{at}/{k}"), out)),
        Value::Array(a) => a.iter().enumerate().for_each(|(i, c)| pointers(c, format!("{at}/{i}"), out)),
        _ => {}
    }
}

/// The file every error must name, and each error does.
fn errors_name_file(errors: &[CdiError], file: &Path) -> Result<(), TestCaseError> {
    prop_assert!(!errors.is_empty(), "rejected without an error");
    for e in errors {
        let shown = e.to_string();
        prop_assert!(shown.contains(&file.display().to_string()), "error does not name {}: {}", file.display(), shown);
    }
    Ok(())
}

/// Parse + validate, as `actk cdi validate` does (with the schema) or the registry (without).
fn read(text: &str, file: &Path, format: Option<Format>, schema: bool) -> Result<actk_core::cdi::Spec, Vec<CdiError>> {
    let v = parse_value(text, file, format).map_err(|e| vec![e])?;
    if schema { validate_value(v, Some(file)) } else { spec_from_value(v, Some(file)) }
}

#[test]
fn arbitrary_text_as_json_or_yaml_never_panics_and_errors_name_the_file() {
    let text = prop_oneof![
        any::<String>(),
        "[{}\\[\\]:,\"a-z0-9 \n-]{0,64}",
        json_value().prop_map(|v| v.to_string()),
        // YAML structure: indentation, lists, anchors and aliases, tags, documents.
        prop::collection::vec(
            prop::sample::select(vec![
                "a: ",
                "- ",
                "  ",
                "\n",
                "&x ",
                "*x",
                "!!str ",
                "---\n",
                "{",
                "}",
                "[",
                "]",
                "cdiVersion: 0.5.0\n",
                "kind: nvidia.com/gpu\n",
                "devices:\n",
                "'",
                "\"",
                "#",
                "? ",
                "<<: *x\n"
            ]),
            0..24
        )
        .prop_map(|t| t.concat()),
    ];
    let format = prop::sample::select(vec![None, Some(Format::Json), Some(Format::Yaml)]);
    check("cdi-spec-text", (text, format, any::<bool>()), |(text, format, schema)| {
        let file = Path::new("/etc/cdi/fuzz-input.yaml");
        if let Err(errors) = read(&text, file, format, schema) {
            errors_name_file(&errors, file)?;
        }
        Ok(())
    });
}

#[test]
fn mutated_valid_specs_are_accepted_or_rejected_naming_file_and_field() {
    let base = good();
    let file = Path::new("/var/run/cdi/nvidia.com-gpu.json");
    if let Err(e) = validate_value(base.clone(), Some(file)) {
        panic!("the base spec must be valid: {e:?}");
    }
    let mut ptrs = Vec::new();
    pointers(&base, String::new(), &mut ptrs);
    let strategy = (prop::sample::select(ptrs), json_value(), 0u8..3, "[a-zA-Z]{1,8}", any::<bool>());
    check("cdi-spec-mutated", strategy, |(at, value, how, key, schema)| {
        let mut doc = base.clone();
        match how {
            // Replace the value at `at`.
            0 => {
                if let Some(slot) = doc.pointer_mut(&at) {
                    *slot = value;
                }
            }
            // Remove it from its parent.
            1 => {
                if let Some((parent, last)) = at.rsplit_once('/') {
                    match doc.pointer_mut(parent) {
                        Some(Value::Object(m)) => {
                            m.shift_remove(last);
                        }
                        Some(Value::Array(a)) => {
                            if let Ok(i) = last.parse::<usize>() {
                                a.remove(i);
                            }
                        }
                        _ => {}
                    }
                }
            }
            // Add a field to it (when it is an object).
            _ => {
                if let Some(Value::Object(m)) = doc.pointer_mut(&at) {
                    m.insert(key, value);
                }
            }
        }
        // The registry's fast path (straight into the typed model, the long way only for what it
        // rejects) reaches the long way's verdict, and the same spec.
        let json_text = doc.to_string();
        match (spec_from_text(&json_text, file), read(&json_text, file, Some(Format::Json), false)) {
            (Ok(fast), Ok(long)) => prop_assert_eq!(fast, long),
            (Err(_), Err(_)) => {}
            (fast, long) => {
                return Err(TestCaseError::fail(format!("fast path {fast:?} but the long way {long:?}: {json_text}")));
            }
        }
        for (text, format) in
            [(doc.to_string(), Format::Json), (serde_json::to_string_pretty(&doc).unwrap_or_default(), Format::Yaml)]
        {
            // JSON is valid YAML: the YAML reader must reach the same verdict.
            match read(&text, file, Some(format), schema) {
                Ok(spec) => {
                    // What validates also writes back and reads back to the same spec.
                    for f in [Format::Json, Format::Yaml] {
                        let out = to_text(&spec, f).map_err(|e| TestCaseError::fail(e.to_string()))?;
                        let back = read(&out, file, Some(f), true)
                            .map_err(|e| TestCaseError::fail(format!("{e:?}\n{out}")))?;
                        prop_assert_eq!(&back, &spec);
                    }
                }
                Err(errors) => errors_name_file(&errors, file)?,
            }
        }
        Ok(())
    });
}

/// `text` with each edit applied: at a position (modulo the length, on a char boundary), insert,
/// replace or delete one of the bytes JSON's grammar turns on.
fn mutate(text: &str, edits: &[(usize, u8, char)]) -> String {
    let mut t: Vec<char> = text.chars().collect();
    for &(at, how, c) in edits {
        let at = if t.is_empty() { 0 } else { at % (t.len() + 1) };
        match how % 3 {
            0 => t.insert(at, c),
            1 if at < t.len() => t[at] = c,
            _ if at < t.len() => {
                t.remove(at);
            }
            _ => {}
        }
    }
    t.into_iter().collect()
}

#[test]
fn the_start_scanner_accepts_exactly_what_serde_json_accepts() {
    let valid = prop_oneof![
        json_value().prop_map(|v| v.to_string()),
        json_value().prop_map(|v| serde_json::to_string_pretty(&v).unwrap_or_default()),
        Just(good().to_string()),
        Just(serde_json::to_string_pretty(&good()).unwrap_or_default()),
    ];
    let grammar = prop::sample::select(vec![
        '"', '\\', '{', '}', '[', ']', ',', ':', '0', '1', '-', '+', '.', 'e', 'E', 'u', 't', 'n', 'f', 'a', ' ', '\n',
        '\t', '\r', '\u{0}', '\u{1f}', '\u{7f}', '\u{a0}', '\u{feff}', 'é',
    ]);
    let text = prop_oneof![
        valid.clone(),
        (valid, prop::collection::vec((any::<usize>(), any::<u8>(), grammar), 1..4)).prop_map(|(t, e)| mutate(&t, &e)),
        any::<String>(),
    ];
    check("cdi-json-scan", text, |text| {
        let b = text.as_bytes();
        let start = b.iter().position(|c| !matches!(c, b' ' | b'\t' | b'\n' | b'\r')).unwrap_or(b.len());
        let end = value_end(b, start, 64);
        let scanned = end.is_some_and(|e| b[e..].iter().all(|c| matches!(c, b' ' | b'\t' | b'\n' | b'\r')));
        // serde_json's skipping, as the lazy reading used it before (a number past f64's range is
        // grammar, and only a typed read refuses it).
        let serde = serde_json::from_str::<serde::de::IgnoredAny>(&text);
        prop_assert_eq!(scanned, serde.is_ok(), "scanner {:?}, serde_json {:?}: {:?}", end, serde, text);
        if let (Some(split), Ok(Value::Object(mut whole))) = (split_devices(&text), serde_json::from_str(&text)) {
            // The devices serde_json reads, one by one, and everything else as one object.
            // The text after `devices` is in `rest` unscanned: a second `devices` (serde_json
            // keeps the last) is there, for the lazy reader to refuse (it denies the key).
            let devices: Vec<Value> = split.devices.iter().map(|d| serde_json::from_str(d).unwrap()).collect();
            let rest: Value = serde_json::from_str(&split.rest).map_err(|e| TestCaseError::fail(e.to_string()))?;
            if rest.get("devices").is_none() {
                prop_assert_eq!(Some(Value::Array(devices)), whole.shift_remove("devices"));
                prop_assert_eq!(rest, Value::Object(whole));
            }
        }
        Ok(())
    });
}

#[test]
fn qualified_names_and_kinds_parse_or_name_the_input() {
    let part = prop_oneof!["[a-z][a-z0-9.-]{0,10}[a-z0-9]", ".{0,6}", Just(String::new())];
    let name = prop_oneof![
        (part.clone(), part.clone(), part.clone()).prop_map(|(v, c, n)| format!("{v}/{c}={n}")),
        (part.clone(), part).prop_map(|(v, c)| format!("{v}/{c}")),
        any::<String>(),
    ];
    check("cdi-names", name, |input| {
        match QualifiedName::parse(&input) {
            Ok(q) => prop_assert_eq!(q.to_string(), input.clone()),
            Err(e) => prop_assert!(e.to_string().contains(&format!("{input:?}")), "{}", e),
        }
        match Kind::parse(&input) {
            Ok(k) => prop_assert_eq!(format!("{}/{}", k.vendor, k.class), input.clone()),
            Err(e) => prop_assert!(e.to_string().contains(&format!("{input:?}")), "{}", e),
        }
        Ok(())
    });
}
