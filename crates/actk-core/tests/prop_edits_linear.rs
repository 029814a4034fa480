//! The one-pass env and cgroup-rule steps of `edits::apply` (issue 31: they were a scan of the
//! list per edit, quadratic in the devices of a node) against the rule they replace, stated
//! the direct way: for each env edit in turn, remove every entry of its NAME and append it; for
//! each device node in turn, append its allow rule unless an equal rule (the five fields
//! `allow: true`, type, major, minor, access, nothing else) is in the list by then.
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

/// The env list after the edits, as the module docs state the rule: one edit at a time.
fn env_direct(mut env: Vec<Value>, edits: &[String]) -> Vec<Value> {
    for e in edits {
        let name = e.split_once('=').map_or(e.as_str(), |(n, _)| n);
        env.retain(|v| v.as_str().and_then(|s| s.split_once('=')).is_none_or(|(n, _)| n != name));
        env.push(Value::String(e.clone()));
    }
    env
}

/// The rule list after the nodes, one node at a time with a scan of the list.
fn rules_direct(mut rules: Vec<Value>, nodes: &[CdiDeviceNode]) -> Vec<Value> {
    for n in nodes {
        let mut rule = Map::new();
        rule.insert("allow".into(), Value::Bool(true));
        rule.insert("type".into(), Value::from(n.node_type.as_deref().unwrap_or("c")));
        rule.insert("major".into(), Value::from(n.major));
        rule.insert("minor".into(), Value::from(n.minor));
        rule.insert("access".into(), Value::from(n.permissions.as_deref().unwrap_or("rwm")));
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
                permissions: (!rw).then(|| "rw".to_string()),
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
/// rule, with every rule and name once.
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
    assert_eq!(got_env.len(), 128, "every name once, the last edit of each");
    assert_eq!(got_env, &env_direct(env, &env_edits));
    assert_eq!(got_env[0], "V0=x128");
}
