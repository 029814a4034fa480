//! Property tests of applying CDI container edits to an OCI runtime spec (edits.rs), the code
//! path through which every config.json passes in actk-runtime.
//!
//! Invariants:
//! - any JSON document (object or not, fields of any type) gives `Ok` or an `EditError` naming
//!   the field; never a panic;
//! - applying the same edits twice gives the document of applying them once;
//! - every field of the original survives: every value outside the edited lists is unchanged and
//!   in the same place, and every element of an edited list is still there unless an edit
//!   replaced it by key (`linux.devices[].path`, `mounts[].destination`, env `NAME`);
//! - a config.json read and written back (preserve_order) is byte-identical (compact form).
//!
//! The documents are the config.json files Docker 20.10 and Podman 4.3 wrote
//! (crates/e2e/tests/data/realspecs) with random fields added anywhere, and arbitrary JSON.
//! Cases per property: `PROPTEST_CASES` (default 256); counts go to `$ACTK_VERIFY_COUNTS`.

use actk_core::cdi::{CdiDeviceNode, CdiHook, CdiMount, ContainerEdits};
use actk_core::edits::{self, EditError, HOOK_STAGES};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use serde_json::{Map, Value};

mod common;
use common::check;

const REALSPECS: &[&str] = &[
    include_str!("../../e2e/tests/data/realspecs/docker-20.10-run.json"),
    include_str!("../../e2e/tests/data/realspecs/docker-20.10-gpus.json"),
    include_str!("../../e2e/tests/data/realspecs/podman-4.3-run.json"),
];

/// Arbitrary JSON, a few levels deep.
fn json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(Value::from),
        ".{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec((".{0,8}", inner), 0..4).prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

/// Keys the edits touch, so that random documents hit them with wrong types too.
fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::sample::select(vec![
            "process", "env", "linux", "devices", "resources", "mounts", "hooks", "prestart",
            "createContainer", "user", "additionalGids", "annotations", "x-vendor-field",
        ])
        .prop_map(String::from),
        1 => "[a-zA-Z]{1,10}",
    ]
}

/// A real config.json with `extra` (key, value) pairs inserted at random object positions
/// (chosen by `picks`), possibly replacing a field with a value of another type.
fn mutate(doc: &mut Value, extra: &[(String, Value)], picks: &[usize]) {
    for ((k, v), pick) in extra.iter().zip(picks) {
        let mut objects = Vec::new();
        collect_objects(doc, "", &mut objects);
        let at = &objects[pick % objects.len()];
        if let Some(Value::Object(m)) = doc.pointer_mut(at) {
            m.insert(k.clone(), v.clone());
        }
    }
}

fn collect_objects(v: &Value, at: &str, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            out.push(at.to_string());
            for (k, c) in m {
                collect_objects(c, &format!("{at}/{}", k.replace('~', "~0").replace('/', "~1")), out);
            }
        }
        Value::Array(a) => {
            for (i, c) in a.iter().enumerate() {
                collect_objects(c, &format!("{at}/{i}"), out);
            }
        }
        _ => {}
    }
}

fn edits() -> impl Strategy<Value = ContainerEdits> {
    let path =
        prop::sample::select(vec!["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl", "/dev/neuron0", "/dev/null"]);
    let node = (
        path,
        prop::option::of(prop::sample::select(vec!["c", "b", "p", "u"])),
        prop::option::of(0i64..300),
        prop::option::of(0i64..300),
        prop::option::of(0u32..0o777),
        prop::option::of(prop::sample::select(vec!["/run/nvidia/driver", ""])),
    )
        .prop_map(|(p, t, ma, mi, mode, under)| CdiDeviceNode {
            path: p.to_string(),
            host_path: under.map(|u| format!("{u}{p}")),
            node_type: t.map(String::from),
            major: ma,
            minor: mi,
            file_mode: mode,
            ..Default::default()
        });
    let dest = prop::sample::select(vec!["/usr/lib/libcuda.so.1", "/usr/bin/nvidia-smi", "/proc", "/dev"]);
    let mount = (
        dest,
        prop::collection::vec(prop::sample::select(vec!["ro", "nosuid", "bind", "rbind"]), 0..3),
        prop::option::of(prop::sample::select(vec!["", "bind", "tmpfs"])),
    )
        .prop_map(|(d, o, t)| CdiMount {
            host_path: format!("/host{d}"),
            container_path: d.to_string(),
            mount_type: t.map(String::from),
            options: o.into_iter().map(String::from).collect(),
        });
    let stage = prop_oneof![5 => prop::sample::select(HOOK_STAGES.to_vec()).prop_map(String::from), 1 => "[a-z]{1,6}"];
    let hook = (stage, prop::collection::vec("[a-z=/]{0,6}", 0..2)).prop_map(|(s, env)| CdiHook {
        hook_name: s,
        path: "/usr/bin/actk-hook".into(),
        args: vec!["actk-hook".into(), "update-ldcache".into()],
        env,
        timeout: None,
    });
    let env = prop_oneof![
        5 => prop::sample::select(vec!["NVIDIA_VISIBLE_DEVICES", "PATH", "LD_LIBRARY_PATH", "A"]).prop_flat_map(|n| ".{0,6}".prop_map(move |v| format!("{n}={v}"))),
        1 => ".{0,8}",
    ];
    let net = prop::sample::select(vec!["eth0", "eth1", "ib0"])
        .prop_map(|h| serde_json::json!({"hostInterfaceName": h, "name": format!("net-{h}")}));
    let rdt = prop::option::of(
        (
            prop::sample::select(vec!["gpu", "batch"]),
            prop::option::of(prop::sample::select(vec!["L3:0=ff", "MB:0=50"])),
        )
            .prop_map(|(c, l3)| match l3 {
                Some(l3) => serde_json::json!({"closID": c, "l3CacheSchema": l3}),
                None => serde_json::json!({"closID": c}),
            }),
    );
    (
        prop::collection::vec(env, 0..3),
        prop::collection::vec(node, 0..3),
        prop::collection::vec(mount, 0..3),
        prop::collection::vec(hook, 0..2),
        prop::collection::vec(0u32..100, 0..3),
        prop::collection::vec(net, 0..2),
        rdt,
    )
        .prop_map(|(env, device_nodes, mounts, hooks, additional_gids, net_devices, intel_rdt)| ContainerEdits {
            env,
            device_nodes,
            mounts,
            hooks,
            additional_gids,
            net_devices,
            intel_rdt,
        })
}

/// The lists apply() may change, as JSON pointers; everything else must stay as it was.
const EDITED: &[&str] = &[
    "/process/env",
    "/linux/devices",
    "/linux/resources/devices",
    "/mounts",
    "/process/user/additionalGids",
    "/hooks",
    "/linux/netDevices",
    "/linux/intelRdt",
];

/// Every field of `orig` is in `got`: values outside [`EDITED`] identical, list elements of the
/// edited lists still present (or replaced by an edit with the same key).
fn survives(orig: &Value, got: &Value, edits: &ContainerEdits, at: &str) -> Result<(), String> {
    // Objects keyed by what the edit names: every other key keeps its value.
    if let ("/linux/netDevices" | "/linux/intelRdt", Some(o), Some(g)) = (at, orig.as_object(), got.as_object()) {
        for (k, v) in o {
            let named = match at {
                "/linux/netDevices" => {
                    edits.net_devices.iter().any(|d| d.get("hostInterfaceName").and_then(Value::as_str) == Some(k))
                }
                _ => edits.intel_rdt.as_ref().is_some_and(|r| r.get(k).is_some()),
            };
            match g.get(k) {
                Some(gv) if gv == v || named => {}
                Some(gv) => return Err(format!("{at}/{k} changed: {v} -> {gv}")),
                None => return Err(format!("{at}/{k} is missing")),
            }
        }
        return Ok(());
    }
    if EDITED.contains(&at) {
        let (Some(o), Some(g)) = (orig.as_array(), got.as_array()) else {
            return match (orig.as_object(), got.as_object()) {
                // `hooks` is an object of stage lists.
                (Some(o), Some(g)) => o.iter().try_for_each(|(k, v)| match g.get(k) {
                    Some(gv) => survives(v, gv, edits, &format!("{at}/{k}")),
                    None => Err(format!("{at}/{k} is missing")),
                }),
                // A null list is created by the edit (OCI: null means absent).
                _ if orig == got || orig.is_null() => Ok(()),
                _ => Err(format!("{at} changed type: {orig} -> {got}")),
            };
        };
        for e in o {
            if g.contains(e) || replaced(at, e, edits) {
                continue;
            }
            return Err(format!("{at}: element {e} is missing"));
        }
        return Ok(());
    }
    if at.starts_with("/hooks/") {
        let (Some(o), Some(g)) = (orig.as_array(), got.as_array()) else {
            return match (orig, got) {
                _ if orig == got => Ok(()),
                // OCI: a null stage list is an absent one; an edit adding a hook to that stage
                // creates the list (issue 13 item 9: the oracle called this a lost field).
                (Value::Null, Value::Array(_)) => Ok(()),
                _ => Err(format!("{at} changed: {orig} -> {got}")),
            };
        };
        return o
            .iter()
            .try_for_each(|e| if g.contains(e) { Ok(()) } else { Err(format!("{at}: hook {e} is missing")) });
    }
    match (orig, got) {
        (Value::Object(o), Value::Object(g)) => {
            let gkeys: Vec<&String> = g.keys().collect();
            let mut last = 0;
            for (k, v) in o {
                let Some(pos) = gkeys.iter().position(|gk| *gk == k) else {
                    return Err(format!("{at}/{k} is missing"));
                };
                if pos < last {
                    return Err(format!("{at}/{k} moved"));
                }
                last = pos;
                survives(v, &g[k], edits, &format!("{at}/{k}"))?;
            }
            Ok(())
        }
        _ if orig == got => Ok(()),
        // A null where an edited list or object is created is the one allowed change.
        (Value::Null, _)
            if EDITED.iter().any(|e| e.starts_with(at)) || at == "/process/user" || at == "/linux/resources" =>
        {
            Ok(())
        }
        _ => Err(format!("{at} changed: {orig} -> {got}")),
    }
}

/// True when an edit replaces list element `e` of `at` by its key.
fn replaced(at: &str, e: &Value, edits: &ContainerEdits) -> bool {
    match at {
        "/linux/devices" => {
            edits.device_nodes.iter().any(|n| e.get("path").and_then(Value::as_str) == Some(n.path.as_str()))
        }
        "/mounts" => {
            edits.mounts.iter().any(|m| e.get("destination").and_then(Value::as_str) == Some(m.container_path.as_str()))
        }
        "/process/env" => {
            let name = e.as_str().and_then(|s| s.split_once('=')).map(|(n, _)| n);
            edits.env.iter().any(|x| x.split_once('=').map(|(n, _)| n) == name)
        }
        _ => false,
    }
}

/// A real engine's config.json, with random fields anywhere: apply once == apply twice, every
/// original field survives, and errors name a field.
#[test]
fn config_json_edits_are_idempotent_and_keep_every_field() {
    let strategy = (
        0..REALSPECS.len(),
        prop::collection::vec((key(), json()), 0..4),
        prop::collection::vec(any::<usize>(), 4),
        edits(),
    );
    check("config.json-edits", strategy, |(which, extra, picks, e)| {
        let mut doc: Value = serde_json::from_str(REALSPECS[which]).expect("realspec is JSON");
        mutate(&mut doc, &extra, &picks);
        let orig = doc.clone();
        let mut once = doc.clone();
        match edits::apply(&mut once, &e) {
            Ok(()) => {
                let mut twice = once.clone();
                edits::apply(&mut twice, &e)
                    .map_err(|err| TestCaseError::fail(format!("second apply failed: {err}")))?;
                prop_assert_eq!(&twice, &once, "applying twice differs from once");
                survives(&orig, &once, &e, "").map_err(|m| TestCaseError::fail(format!("{m}\nedits: {e:?}")))?;
                for n in &e.device_nodes {
                    let listed = once["linux"]["devices"]
                        .as_array()
                        .is_some_and(|a| a.iter().any(|d| d["path"] == n.path.as_str()));
                    prop_assert!(listed, "{} not in linux.devices", n.path);
                }
                for d in &e.net_devices {
                    let host = d["hostInterfaceName"].as_str().unwrap_or_default();
                    prop_assert_eq!(&once["linux"]["netDevices"][host]["name"], &d["name"], "net device {}", host);
                }
                if let Some(Value::Object(rdt)) = &e.intel_rdt {
                    for (k, v) in rdt {
                        prop_assert_eq!(&once["linux"]["intelRdt"][k.as_str()], v, "intelRdt.{}", k);
                    }
                }
                for m in &e.mounts {
                    let listed = once["mounts"]
                        .as_array()
                        .is_some_and(|a| a.iter().any(|d| d["destination"] == m.container_path.as_str()));
                    prop_assert!(listed, "{} not in mounts", m.container_path);
                }
            }
            Err(err) => {
                let shown = err.to_string();
                match &err {
                    EditError::WrongType { field, .. } => {
                        let ptr = format!("/{}", field.replace('.', "/"));
                        let v = orig.pointer(&ptr);
                        prop_assert!(v.is_some_and(|v| !v.is_null()), "{} names {} which is {:?}", shown, ptr, v);
                    }
                    EditError::BadEnv { entry } => prop_assert!(e.env.contains(entry), "{shown}"),
                    EditError::BadStage { stage, .. } => {
                        prop_assert!(!HOOK_STAGES.contains(&stage.as_str()), "{shown}")
                    }
                    EditError::MissingNumbers { path } => {
                        prop_assert!(e.device_nodes.iter().any(|n| &n.path == path), "{shown}")
                    }
                    // The strategy only makes well-formed net device and intelRdt edits.
                    EditError::BadEdit { .. } => prop_assert!(false, "well-formed edit refused: {shown}"),
                }
            }
        }
        Ok(())
    });
}

/// Issue 31: what actk-runtime writes, config.json serialised with the deferred mounts and
/// device entries in place (edits::apply_deferred), is byte for byte the document edits::apply_in
/// gives, with and without a user namespace (device nodes become bind mounts there), and the
/// two fail alike.
#[test]
fn deferred_lists_serialise_as_the_applied_document() {
    let strategy = (
        0..REALSPECS.len(),
        prop::collection::vec((key(), json()), 0..4),
        prop::collection::vec(any::<usize>(), 4),
        edits(),
        any::<bool>(),
    );
    check("config.json-deferred", strategy, |(which, extra, picks, e, userns)| {
        let mut doc: Value = serde_json::from_str(REALSPECS[which]).expect("realspec is JSON");
        mutate(&mut doc, &extra, &picks);
        let mut applied = doc.clone();
        let mut deferred_doc = doc;
        match (edits::apply_in(&mut applied, &e, userns), edits::apply_deferred(&mut deferred_doc, &e, userns)) {
            (Ok(()), Ok(d)) => {
                let want = serde_json::to_string(&applied).expect("serialises");
                let got = serde_json::to_string(&d.with(&deferred_doc)).expect("serialises");
                prop_assert_eq!(&got, &want, "edits: {:?}", e);
                d.write_into(&mut deferred_doc);
                prop_assert_eq!(&deferred_doc, &applied, "write_into differs from apply_in");
            }
            (Err(a), Err(b)) => prop_assert_eq!(a, b),
            (a, b) => prop_assert!(false, "apply_in {:?}, apply_deferred {:?}", a, b.map(|_| ())),
        }
        Ok(())
    });
}

/// Issue 13 item 9: the input `make verify` found. A config.json whose `hooks.prestart` is
/// `null` (OCI: the same as absent) and an edit adding a prestart hook: the hook is added as a
/// list, every other field survives, and the oracle agrees that nothing was lost.
#[test]
fn item9_null_prestart_list_gets_the_hook_and_loses_nothing() {
    let mut doc: Value = serde_json::from_str(REALSPECS[0]).expect("realspec is JSON");
    doc["hooks"] = serde_json::json!({"prestart": null, "poststop": [{"path": "/bin/true"}]});
    let e = ContainerEdits {
        hooks: vec![CdiHook {
            hook_name: "prestart".into(),
            path: "/usr/bin/actk-hook".into(),
            args: vec!["actk-hook".into(), "prestart".into()],
            env: vec![],
            timeout: None,
        }],
        ..Default::default()
    };
    let orig = doc.clone();
    edits::apply(&mut doc, &e).expect("applies");
    assert_eq!(doc["hooks"]["prestart"][0]["path"], "/usr/bin/actk-hook", "{}", doc["hooks"]);
    assert_eq!(doc["hooks"]["poststop"], orig["hooks"]["poststop"]);
    survives(&orig, &doc, &e, "").expect("nothing of the original is lost");
    let mut twice = doc.clone();
    edits::apply(&mut twice, &e).expect("applies again");
    assert_eq!(twice, doc);
}

/// Any JSON document (not only objects) and any edits: a result, never a panic.
#[test]
fn arbitrary_json_documents_never_panic() {
    check("config.json-arbitrary", (json(), edits()), |(doc, e)| {
        let mut d = doc.clone();
        if edits::apply(&mut d, &e).is_err() {
            return Ok(());
        }
        prop_assert!(doc.is_object(), "a non-object document was accepted: {doc}");
        let mut d2 = d.clone();
        prop_assert!(edits::apply(&mut d2, &e).is_ok());
        prop_assert_eq!(d2, d);
        let _ = edits::remove_legacy_nvidia_hook(&mut doc.clone());
        let _ = edits::mark_applied(&mut doc.clone(), "x");
        Ok(())
    });
}

/// Reading config.json and writing it back (as actk-runtime does) keeps every byte: field order,
/// unknown fields, numbers.
#[test]
fn config_json_round_trip_keeps_every_field_in_order() {
    let strategy =
        (0..REALSPECS.len(), prop::collection::vec((key(), json()), 0..6), prop::collection::vec(any::<usize>(), 6));
    check("config.json-round-trip", strategy, |(which, extra, picks)| {
        let mut doc: Value = serde_json::from_str(REALSPECS[which]).expect("realspec is JSON");
        mutate(&mut doc, &extra, &picks);
        let text = serde_json::to_string(&doc).expect("serialises");
        let back: Value = serde_json::from_str(&text).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(serde_json::to_string(&back).expect("serialises"), text);
        let keys = |v: &Value| v.as_object().map(|m: &Map<String, Value>| m.keys().cloned().collect::<Vec<_>>());
        prop_assert_eq!(keys(&back), keys(&doc));
        Ok(())
    });
}
