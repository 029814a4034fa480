//! The one-pass env and cgroup-rule steps of `edits::apply` (issue 31: they were a scan of the
//! list per edit, quadratic in the devices of a node) against the rule they replace, stated
//! the direct way: for each env edit in turn, replace the last entry of its NAME in place or
//! append it when the NAME is new (the CDI reference library's order); for each device node in
//! turn, append its allow rule unless an equal rule (the five fields `allow: true`, type,
//! major, minor, access, nothing else; empty permissions are `rwm`) is in the list by then.
//!
//! Inputs: env lists and rule lists with repeated names and rules, entries that are not
//! strings or not `NAME=value`, rules with extra fields, float, string or null numbers, and
//! nodes with repeated and FIFO (no numbers) entries. Cases: `PROPTEST_CASES` (default 256).

use actk_core::cdi::{CdiDeviceNode, ContainerEdits};
use actk_core::edits;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use serde_json::{Map, Value, json};

mod common;
use common::check;

/// The env list after the edits, as the module docs state the rule: one edit at a time, each
/// a scan of the list for the last entry of its NAME (an entry without `=` is all NAME).
fn env_direct(mut env: Vec<Value>, edits: &[String]) -> Vec<Value> {
    let name = |s: &str| s.split_once('=').map_or(s, |(n, _)| n).to_string();
    for e in edits {
        let n = name(e);
        match env.iter().rposition(|v| v.as_str().is_some_and(|s| name(s) == n)) {
            Some(i) => env[i] = Value::String(e.clone()),
            None => env.push(Value::String(e.clone())),
        }
    }
    env
}

/// The rule list after the nodes, one node at a time with a scan of the list.
fn rules_direct(mut rules: Vec<Value>, nodes: &[CdiDeviceNode]) -> Vec<Value> {
    for n in nodes {
        // Only block and character nodes get a rule: a FIFO gets none (runc 1.1 refuses type
        // `p`; the CDI reference library writes none either).
        if !matches!(n.node_type.as_deref().unwrap_or("c"), "b" | "c") {
            continue;
        }
        let mut rule = Map::new();
        rule.insert("allow".into(), Value::Bool(true));
        rule.insert("type".into(), Value::from(n.node_type.as_deref().unwrap_or("c")));
        rule.insert("major".into(), Value::from(n.major));
        rule.insert("minor".into(), Value::from(n.minor));
        rule.insert("access".into(), Value::from(n.permissions.as_deref().filter(|p| !p.is_empty()).unwrap_or("rwm")));
        let rule = Value::Object(rule);
        if !rules.contains(&rule) {
            rules.push(rule);
        }
    }
    rules
}

fn env_entry() -> impl Strategy<Value = Value> {
    prop_oneof![
        6 => ("[ABC]", "[01]{0,2}").prop_map(|(n, v)| Value::String(format!("{n}={v}"))),
        1 => "[ABC]{0,2}".prop_map(Value::String),
        1 => Just(Value::from(7)),
    ]
}

fn number() -> impl Strategy<Value = Value> {
    prop_oneof![
        6 => (0i64..4).prop_map(Value::from),
        1 => Just(Value::Null),
        1 => Just(json!(1.0)),
        1 => Just(json!("1")),
    ]
}

fn rule() -> impl Strategy<Value = Value> {
    (
        any::<bool>(),
        prop::sample::select(vec!["c", "b", "p"]),
        number(),
        number(),
        prop::sample::select(vec!["rwm", "rw"]),
        0..6u8,
    )
        .prop_map(|(allow, ty, major, minor, access, shape)| {
            let mut m = Map::new();
            m.insert("allow".into(), Value::Bool(allow || shape == 1));
            m.insert("type".into(), Value::from(ty));
            m.insert("major".into(), major);
            m.insert("minor".into(), minor);
            m.insert("access".into(), Value::from(access));
            match shape {
                0 => {
                    m.insert("extra".into(), Value::Bool(true));
                }
                2 => {
                    m.remove("access");
                }
                _ => {}
            }
            Value::Object(m)
        })
}

fn node() -> impl Strategy<Value = CdiDeviceNode> {
    (0i64..4, 0i64..4, prop::sample::select(vec![None, Some("c"), Some("b"), Some("p")]), any::<bool>()).prop_map(
        |(major, minor, ty, rw)| {
            let fifo = ty == Some("p");
            CdiDeviceNode {
                path: format!("/dev/n{major}-{minor}-{}", ty.unwrap_or("c")),
                node_type: ty.map(String::from),
                major: (!fifo).then_some(major),
                minor: (!fifo).then_some(minor),
                permissions: match (rw, minor) {
                    (true, 3) => Some(String::new()),
                    (true, _) => None,
                    (false, _) => Some("rw".to_string()),
                },
                ..Default::default()
            }
        },
    )
}

#[test]
fn env_and_rules_equal_the_one_at_a_time_rule() {
    let env_edit = ("[ABC]", "[01]{0,2}").prop_map(|(n, v)| format!("{n}={v}"));
    let inputs = (
        prop::collection::vec(env_entry(), 0..8),
        prop::collection::vec(env_edit, 0..6),
        prop::collection::vec(rule(), 0..8),
        prop::collection::vec(node(), 0..10),
    );
    check("env_and_rules_equal_the_one_at_a_time_rule", inputs, |(env, env_edits, rules, nodes)| {
        let mut spec = json!({"process": {"env": env}, "linux": {"resources": {"devices": rules}}});
        let e = ContainerEdits { env: env_edits.clone(), device_nodes: nodes.clone(), ..Default::default() };
        edits::apply(&mut spec, &e).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(spec["process"]["env"].as_array().unwrap(), &env_direct(env.clone(), &env_edits));
        prop_assert_eq!(
            spec["linux"]["resources"]["devices"].as_array().unwrap(),
            &rules_direct(rules.clone(), &nodes)
        );
        Ok(())
    });
}

/// 256 nodes and 256 env edits over lists already holding as many: the result of the direct
/// rule, with every rule once.
#[test]
fn many_nodes_and_env_edits_apply_as_one_at_a_time() {
    let nodes: Vec<CdiDeviceNode> = (0..256)
        .map(|i| CdiDeviceNode {
            path: format!("/dev/accel/accel{i}"),
            major: Some(261),
            minor: Some(i),
            ..Default::default()
        })
        .collect();
    let rules: Vec<Value> = (0..256)
        .step_by(2)
        .map(|i| json!({"allow": true, "type": "c", "major": 261, "minor": i, "access": "rwm"}))
        .collect();
    let env: Vec<Value> = (0..256).map(|i| Value::String(format!("V{}={i}", i % 64))).collect();
    let env_edits: Vec<String> = (0..256).map(|i| format!("V{}=x{i}", i % 128)).collect();
    let mut spec = json!({"process": {"env": env}, "linux": {"resources": {"devices": rules}}});
    let e = ContainerEdits { env: env_edits.clone(), device_nodes: nodes.clone(), ..Default::default() };
    edits::apply(&mut spec, &e).unwrap();
    let got_rules = spec["linux"]["resources"]["devices"].as_array().unwrap();
    assert_eq!(got_rules.len(), 256);
    assert_eq!(got_rules, &rules_direct(rules, &nodes));
    let got_env = spec["process"]["env"].as_array().unwrap();
    // V0..V63 four times each: the last of each replaced in place; V64..V127 appended once.
    assert_eq!(got_env.len(), 256 + 64);
    assert_eq!(got_env, &env_direct(env, &env_edits));
    assert_eq!(got_env[0], "V0=0");
    assert_eq!(got_env[192], "V0=x128", "the last V0 takes the last V0 edit");
    assert_eq!(got_env[256], "V64=x192");
}
