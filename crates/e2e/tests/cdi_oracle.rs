//! The CNCF CDI reference library (`tags.cncf.io/container-device-interface`, the one
//! containerd, CRI-O and podman link) as a differential oracle for actk (issue 25).
//!
//! A corpus of CDI spec files goes through both sides:
//! - `ref-schema/`: the reference's schema test data (good and bad);
//! - `ref-tests/`: every spec literal of the reference's own pkg/cdi tests;
//! - `fixture/`: what `actk cdi generate` writes for every prepared fixture (fixtures/);
//! - `hand/`: the edge cases of tests/peers/cdi-oracle/corpus (each file says what it probes);
//! - `gen/`: specs generated from a proptest strategy with a fixed seed (`CDI_ORACLE_SEED`,
//!   `CDI_ORACLE_CASES`, default 150), JSON and YAML.
//!
//! For every spec the *verdict* is compared: the reference's `cdi.ReadSpec` (what an engine's
//! spec cache accepts) against actk's registry (`actk cdi list --spec-dir`, the loader of
//! actk-runtime; a skipped file is refused). `actk cdi validate` (schema + SPEC.md rules) is
//! reported beside them; it may be stricter than the engines (the reference's engines load
//! without a schema), never more lenient.
//!
//! For every device name a spec declares (up to [`SINGLE_NAMES`] of them one at a time, and all
//! of them together) the same base config.json (a container user 1000:1000), naming the devices
//! in a `cdi.k8s.io/oracle` annotation, goes through the reference's `Cache.InjectDevices`
//! (tests/peers/cdi-oracle, a Go test peer) and through the real actk-runtime (`create`, with
//! /bin/true as its low-level runtime, so the edited config.json stays in the bundle). The two
//! results are compared field by field after dropping empty values (Go's `omitempty`) and
//! actk's own `io.actk.*` annotations: device nodes (set, order, type, numbers, fileMode, uid,
//! gid), the device cgroup, mounts and their order, env, hooks per stage, additionalGids, and
//! anything else.
//!
//! Each difference gets a label (`devices:uid`, `mounts:order`, `verdict:actk-refuses`, ...).
//! tests/peers/cdi-oracle/allow.tsv lists the differences that are explained, with the reason;
//! the test fails on any other. The full report (counts side by side, every difference) is
//! written to target/conformance/cdi-oracle/report.txt and printed.

use actk_testsupport::engines::{self, bin, command_output, is_root, skip_or_fail, target_dir, text, which};
use actk_testsupport::fixture;
use anyhow::{Context, Result, bail};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config as PtConfig, RngAlgorithm, TestRng, TestRunner};
use serde_json::{Map, Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The annotation that names the devices for both sides (CDI's `cdi.k8s.io/` prefix).
const ANNOTATION: &str = "cdi.k8s.io/oracle";
/// At most this many names of one spec are requested one at a time (a CPX MI300X spec has
/// hundreds); all of a spec's names are always requested together once.
const SINGLE_NAMES: usize = 10;

fn repo() -> PathBuf {
    engines::workspace_root()
}

fn peer_dir() -> PathBuf {
    repo().join("tests/peers/cdi-oracle")
}

/// One spec file of the corpus, alone in its own spec directory.
struct SpecCase {
    /// `origin/file name`
    id: String,
    dir: PathBuf,
    file: PathBuf,
}

/// Verdicts on one spec file: `Ok` = accepted, `Err(message)` = refused.
struct Verdicts {
    reference: Result<(), String>,
    registry: Result<(), String>,
    validate: Result<(), String>,
    names: Vec<String>,
}

/// One difference between the two sides.
struct Difference {
    case: String,
    label: String,
    detail: String,
}

/// An allow-list entry: label and case patterns (`*` matches anything), and the reason.
struct Allowed {
    label: String,
    case: String,
    reason: String,
    used: std::cell::Cell<usize>,
}

fn glob(pattern: &str, s: &str) -> bool {
    // `*` only; enough for labels and case ids.
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == s;
    }
    let mut rest = s;
    for (i, p) in parts.iter().enumerate() {
        if i == 0 {
            let Some(r) = rest.strip_prefix(p) else { return false };
            rest = r;
        } else if i == parts.len() - 1 {
            return rest.ends_with(p);
        } else if let Some(pos) = rest.find(p) {
            rest = &rest[pos + p.len()..];
        } else {
            return false;
        }
    }
    true
}

fn read_allow_list() -> Result<Vec<Allowed>> {
    let path = peer_dir().join("allow.tsv");
    let text = fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() || line.starts_with('#') {
            continue;
        }
        let f: Vec<&str> = line.splitn(3, '\t').collect();
        if f.len() != 3 || f[2].trim().is_empty() {
            bail!("{}:{}: want LABEL<TAB>CASE<TAB>REASON, got {line:?}", path.display(), n + 1);
        }
        out.push(Allowed { label: f[0].into(), case: f[1].into(), reason: f[2].into(), used: std::cell::Cell::new(0) });
    }
    Ok(out)
}

/// Builds the Go peer (tests/peers/cdi-oracle/build.sh); returns its cache directory.
fn build_peer() -> Result<PathBuf> {
    let o = Command::new(peer_dir().join("build.sh")).stderr(Stdio::inherit()).output().context("running build.sh")?;
    if !o.status.success() {
        bail!("tests/peers/cdi-oracle/build.sh failed ({})", o.status);
    }
    let dir = String::from_utf8_lossy(&o.stdout).lines().last().unwrap_or_default().to_string();
    Ok(PathBuf::from(dir))
}

fn peer_batch(peer: &Path, request: &Value, out: &Path) -> Result<Value> {
    let req_path = out.with_extension("request.json");
    fs::write(&req_path, serde_json::to_vec_pretty(request)?)?;
    let o = Command::new(peer.join("cdi-oracle"))
        .arg("batch")
        .stdin(fs::File::open(&req_path)?)
        .output()
        .context("running cdi-oracle batch")?;
    if !o.status.success() {
        bail!("cdi-oracle batch failed ({}): {}", o.status, String::from_utf8_lossy(&o.stderr));
    }
    fs::write(out, &o.stdout)?;
    Ok(serde_json::from_slice(&o.stdout)?)
}

fn add_case(cases: &mut Vec<SpecCase>, root: &Path, id: String, file_name: &str, content: &[u8]) -> Result<()> {
    let dir = root.join(format!("{:04}", cases.len()));
    fs::create_dir_all(&dir)?;
    let file = dir.join(file_name);
    fs::write(&file, content)?;
    cases.push(SpecCase { id, dir, file });
    Ok(())
}

fn add_dir(cases: &mut Vec<SpecCase>, root: &Path, origin: &str, dir: &Path) -> Result<()> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("json" | "yaml")))
        .collect();
    files.sort();
    for f in files {
        let name = f.file_name().unwrap_or_default().to_string_lossy().into_owned();
        add_case(cases, root, format!("{origin}/{name}"), &name, &fs::read(&f)?)?;
    }
    Ok(())
}

// ------------------------------------------------------------------ generated specs (proptest)

fn opt_list(items: impl Strategy<Value = Vec<Value>>) -> impl Strategy<Value = Option<Value>> {
    // absent, null, empty or some items: SPEC.md's lists are optional and null means empty.
    prop_oneof![
        4 => Just(None),
        1 => Just(Some(Value::Null)),
        1 => Just(Some(json!([]))),
        4 => items.prop_map(|v| Some(Value::Array(v))),
    ]
}

fn device_node() -> impl Strategy<Value = Value> {
    let host = prop::sample::select(vec!["/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom"]);
    (
        host,
        any::<bool>(),
        prop::option::weighted(0.4, prop_oneof![9 => prop::sample::select(vec!["c", "b", "u", "p"]), 1 => Just("x")]),
        prop::option::weighted(0.4, (0i64..12, 0i64..12)),
        prop::option::weighted(0.4, prop::sample::select(vec![0o666, 0o660, 0o600, 0o644, 0o777])),
        prop::option::weighted(0.3, prop::sample::select(vec![0u32, 44, 1000])),
        prop::option::weighted(0.3, prop::sample::select(vec![0u32, 44, 1000])),
        prop::option::weighted(0.3, prop_oneof![9 => prop::sample::select(vec!["r", "rw", "rwm", "m"]), 1 => prop::sample::select(vec!["", "x"])]),
        0u8..4,
    )
        .prop_map(|(host, renamed, ty, nums, mode, uid, gid, perm, n)| {
            let mut m = Map::new();
            if renamed {
                m.insert("path".into(), json!(format!("/dev/oracle-gen/{n}")));
                m.insert("hostPath".into(), json!(host));
            } else {
                m.insert("path".into(), json!(host));
            }
            if let Some(t) = ty {
                m.insert("type".into(), json!(t));
            }
            if let Some((a, b)) = nums {
                m.insert("major".into(), json!(a));
                m.insert("minor".into(), json!(b));
            }
            if let Some(mode) = mode {
                m.insert("fileMode".into(), json!(mode));
            }
            if let Some(u) = uid {
                m.insert("uid".into(), json!(u));
            }
            if let Some(g) = gid {
                m.insert("gid".into(), json!(g));
            }
            if let Some(p) = perm {
                m.insert("permissions".into(), json!(p));
            }
            Value::Object(m)
        })
}

fn mount() -> impl Strategy<Value = Value> {
    (
        prop::sample::select(vec!["/tmp", "/etc/hosts", "/usr", "tmpfs"]),
        prop::collection::vec(prop::sample::select(vec!["a", "b", "lib", "x86_64"]), 0..4),
        prop_oneof![19 => prop::sample::select(vec!["/opt/gen", "/opt/gen/"]), 1 => Just("opt/gen")],
        prop::option::weighted(0.3, prop::sample::select(vec!["bind", "tmpfs"])),
        prop::collection::vec(prop::sample::select(vec!["ro", "rbind", "bind", "nosuid", "nodev"]), 0..3),
    )
        .prop_map(|(host, segs, base, ty, opts)| {
            let mut path = base.trim_end_matches('/').to_string();
            for s in segs {
                path.push('/');
                path.push_str(s);
            }
            if base.ends_with('/') && path == "/opt/gen" {
                path.push('/');
            }
            let mut m = Map::new();
            m.insert("hostPath".into(), json!(host));
            m.insert("containerPath".into(), json!(path));
            if let Some(t) = ty {
                m.insert("type".into(), json!(t));
            }
            if !opts.is_empty() {
                m.insert("options".into(), json!(opts));
            }
            Value::Object(m)
        })
}

fn hook() -> impl Strategy<Value = Value> {
    (
        prop_oneof![
            19 => prop::sample::select(vec!["prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop"]),
            1 => Just("preStart"),
        ],
        prop_oneof![9 => prop::sample::select(vec!["/usr/bin/true", "/bin/sh"]), 1 => Just("rel/hook")],
        prop::option::weighted(0.5, prop::collection::vec(prop::sample::select(vec!["true", "-c", "x"]), 0..3)),
        prop::option::weighted(0.3, prop::collection::vec(prop_oneof![9 => prop::sample::select(vec!["H=1", "H2="]), 1 => Just("NOEQ")], 0..2)),
        prop::option::weighted(0.2, prop::sample::select(vec![0i64, 5, -1])),
    )
        .prop_map(|(stage, path, args, env, timeout)| {
            let mut m = Map::new();
            m.insert("hookName".into(), json!(stage));
            m.insert("path".into(), json!(path));
            if let Some(a) = args {
                m.insert("args".into(), json!(a));
            }
            if let Some(e) = env {
                m.insert("env".into(), json!(e));
            }
            if let Some(t) = timeout {
                m.insert("timeout".into(), json!(t));
            }
            Value::Object(m)
        })
}

fn container_edits() -> impl Strategy<Value = Value> {
    (
        opt_list(prop::collection::vec(
            prop_oneof![19 => prop::sample::select(vec!["G_A=1", "G_B=2", "G_A=3", "G_C="]), 1 => prop::sample::select(vec!["NOEQ", "=x"])]
                .prop_map(|s| json!(s)),
            0..3,
        )),
        opt_list(prop::collection::vec(device_node(), 0..3)),
        opt_list(prop::collection::vec(mount(), 0..4)),
        opt_list(prop::collection::vec(hook(), 0..2)),
        opt_list(prop::collection::vec(prop::sample::select(vec![0u32, 44, 1000]).prop_map(|g| json!(g)), 0..3)),
    )
        .prop_map(|(env, nodes, mounts, hooks, gids)| {
            let mut m = Map::new();
            for (k, v) in [
                ("env", env),
                ("deviceNodes", nodes),
                ("mounts", mounts),
                ("hooks", hooks),
                ("additionalGids", gids),
            ] {
                if let Some(v) = v {
                    m.insert(k.into(), v);
                }
            }
            Value::Object(m)
        })
}

/// A device's edits: SPEC.md wants at least one edit per device, so most get a node.
fn device_edits() -> impl Strategy<Value = Value> {
    (container_edits(), prop::bool::weighted(0.85)).prop_map(|(mut e, force)| {
        let has_node = e.get("deviceNodes").and_then(Value::as_array).is_some_and(|a| !a.is_empty());
        if force && !has_node {
            e["deviceNodes"] = json!([{"path": "/dev/null"}]);
        }
        e
    })
}

/// A CDI spec, mostly plausible, with the knobs SPEC.md leaves open turned at random.
fn spec_strategy() -> impl Strategy<Value = Value> {
    (
        // Mostly a version that allows every field generated here; older ones probe the
        // version rules.
        prop_oneof![
            6 => Just("1.0.0"),
            2 => Just("1.1.0"),
            3 => prop::sample::select(vec!["0.3.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0"]),
        ],
        prop_oneof![
            19 => prop::sample::select(vec!["oracle.gen/dev", "oracle-gen.example.com/a.b_c"]),
            1 => prop::sample::select(vec!["oracle.gen", "Oracle.gen/dev", "oracle.gen/"]),
        ],
        prop_oneof![3 => Just(None), 1 => Just(Some(Value::Null)), 2 => container_edits().prop_map(Some)],
        prop::collection::vec(
            (
                prop_oneof![
                    19 => prop::sample::select(vec!["0", "1", "gpu0", "GPU-0000", "a_b-c.d", "all"]),
                    1 => prop::sample::select(vec!["bad/name", "", "-lead"]),
                ],
                prop_oneof![1 => Just(Value::Null), 19 => device_edits()],
            ),
            1..4,
        ),
    )
        .prop_map(|(version, kind, spec_edits, devices)| {
            let mut m = Map::new();
            m.insert("cdiVersion".into(), json!(version));
            m.insert("kind".into(), json!(kind));
            if let Some(e) = spec_edits {
                m.insert("containerEdits".into(), e);
            }
            let devs: Vec<Value> =
                devices.into_iter().map(|(name, edits)| json!({"name": name, "containerEdits": edits})).collect();
            m.insert("devices".into(), Value::Array(devs));
            Value::Object(m)
        })
}

/// Block-style YAML for a JSON value; every string double-quoted (typing is probed by the hand
/// corpus, not here), null as `~`.
fn to_yaml(v: &Value, indent: usize, out: &mut String) {
    let pad = " ".repeat(indent);
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, val) in m {
                match val {
                    Value::Object(o) if !o.is_empty() => {
                        let _ = writeln!(out, "{pad}{k}:");
                        to_yaml(val, indent + 2, out);
                    }
                    Value::Array(a) if !a.is_empty() => {
                        let _ = writeln!(out, "{pad}{k}:");
                        to_yaml(val, indent + 2, out);
                    }
                    _ => {
                        let _ = writeln!(out, "{pad}{k}: {}", scalar(val));
                    }
                }
            }
        }
        Value::Array(a) if !a.is_empty() => {
            for item in a {
                match item {
                    Value::Object(o) if !o.is_empty() => {
                        let mut inner = String::new();
                        to_yaml(item, indent + 2, &mut inner);
                        // "- " takes the place of the first line's indentation.
                        let inner = inner.replacen(&" ".repeat(indent + 2), &format!("{pad}- "), 1);
                        out.push_str(&inner);
                    }
                    _ => {
                        let _ = writeln!(out, "{pad}- {}", scalar(item));
                    }
                }
            }
        }
        _ => {
            let _ = writeln!(out, "{pad}{}", scalar(v));
        }
    }
}

fn scalar(v: &Value) -> String {
    match v {
        Value::Null => "~".into(),
        Value::Object(_) => "{}".into(),
        Value::Array(_) => "[]".into(),
        other => other.to_string(),
    }
}

fn generated_specs(n: usize, seed: u64) -> Vec<(String, Vec<u8>)> {
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let mut runner = TestRunner::new_with_rng(PtConfig::default(), TestRng::from_seed(RngAlgorithm::ChaCha, &bytes));
    let strategy = spec_strategy();
    (0..n)
        .map(|i| {
            let spec = strategy.new_tree(&mut runner).expect("a spec strategy never rejects").current();
            if i % 3 == 2 {
                let mut y = String::new();
                to_yaml(&spec, 0, &mut y);
                (format!("gen-{i:03}.yaml"), y.into_bytes())
            } else {
                (format!("gen-{i:03}.json"), serde_json::to_vec_pretty(&spec).unwrap_or_default())
            }
        })
        .collect()
}

// --------------------------------------------------------------------------- actk's side

/// actk's registry verdict: `actk cdi list --spec-dir DIR` skips a file it refuses, saying why.
fn registry_verdict(case: &SpecCase) -> Result<(), String> {
    let o = Command::new(bin("actk"))
        .args(["cdi", "list", "--spec-dir"])
        .arg(&case.dir)
        .env_remove("ACTK_CONFIG")
        .output()
        .map_err(|e| format!("running actk cdi list: {e}"))?;
    let (_, err) = text(&o);
    let needle = format!("skipped {}", case.file.display());
    match err.lines().find(|l| l.contains(&needle)) {
        Some(line) => Err(line.split_once(": ").map(|x| x.1).unwrap_or(line).to_string()),
        None if o.status.success() => Ok(()),
        None => Err(format!("actk cdi list failed ({}): {}", o.status, err.trim())),
    }
}

fn validate_verdict(case: &SpecCase) -> Result<(), String> {
    let o = Command::new(bin("actk"))
        .args(["cdi", "validate"])
        .arg(&case.file)
        .output()
        .map_err(|e| format!("running actk cdi validate: {e}"))?;
    if o.status.success() {
        Ok(())
    } else {
        let (out, err) = text(&o);
        Err(format!("{}{}", out.trim(), err.trim()).chars().take(300).collect())
    }
}

/// The config.json both sides start from: a non-root container user (so device node ownership
/// shows), a default-deny device cgroup, the mounts `runc spec` writes.
fn base_config(names: &[String]) -> Value {
    json!({
        "ociVersion": "1.0.2-dev",
        "process": {
            "user": {"uid": 1000, "gid": 1000},
            "args": ["sh"],
            "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "TERM=xterm"],
            "cwd": "/"
        },
        "root": {"path": "rootfs", "readonly": true},
        "hostname": "oracle",
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
            {"destination": "/dev/pts", "type": "devpts", "source": "devpts", "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"]},
            {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]}
        ],
        "annotations": {ANNOTATION: names.join(",")},
        "linux": {
            "resources": {"devices": [{"allow": false, "access": "rwm"}]},
            "namespaces": [{"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}, {"type": "network"}]
        }
    })
}

// ------------------------------------------------------------------------------ comparing

/// Drops null, empty arrays and empty objects (Go's `omitempty` writes none of them) and
/// actk's own `io.actk.*` annotations.
fn normalize(v: &Value) -> Value {
    match v {
        Value::Object(m) => {
            let mut out = Map::new();
            for (k, val) in m {
                if k.starts_with("io.actk.") {
                    continue;
                }
                let n = normalize(val);
                let empty = match &n {
                    Value::Null => true,
                    Value::Array(a) => a.is_empty(),
                    Value::Object(o) => o.is_empty(),
                    _ => false,
                };
                if !empty {
                    out.insert(k.clone(), n);
                }
            }
            Value::Object(out)
        }
        Value::Array(a) => Value::Array(a.iter().map(normalize).collect()),
        other => other.clone(),
    }
}

fn take(v: &mut Value, path: &[&str]) -> Value {
    let mut cur = v;
    for (i, k) in path.iter().enumerate() {
        let Some(obj) = cur.as_object_mut() else { return Value::Null };
        if i == path.len() - 1 {
            return obj.remove(*k).unwrap_or(Value::Null);
        }
        let Some(next) = obj.get_mut(*k) else { return Value::Null };
        cur = next;
    }
    Value::Null
}

fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.len() > 400 { format!("{}...", &s[..400]) } else { s }
}

fn list(v: &Value) -> Vec<Value> {
    v.as_array().cloned().unwrap_or_default()
}

/// `v` as text with every object's keys sorted (serde_json keeps insertion order here).
fn canon(v: &Value) -> String {
    match v {
        Value::Object(m) => {
            let sorted: BTreeMap<&String, String> = m.iter().map(|(k, x)| (k, canon(x))).collect();
            let inner: Vec<String> = sorted.iter().map(|(k, x)| format!("{k:?}:{x}")).collect();
            format!("{{{}}}", inner.join(","))
        }
        Value::Array(a) => format!("[{}]", a.iter().map(canon).collect::<Vec<_>>().join(",")),
        other => other.to_string(),
    }
}

fn same_multiset(a: &[Value], b: &[Value]) -> bool {
    let mut x: Vec<String> = a.iter().map(canon).collect();
    let mut y: Vec<String> = b.iter().map(canon).collect();
    x.sort();
    y.sort();
    x == y
}

/// Labelled differences between the reference's config (`r`) and actk's (`a`).
fn diff_configs(r: &Value, a: &Value) -> Vec<(String, String)> {
    let mut r = normalize(r);
    let mut a = normalize(a);
    let mut out = Vec::new();
    let ordered = |label: &str, rv: Value, av: Value, out: &mut Vec<(String, String)>| {
        if rv == av {
            return;
        }
        let (rl, al) = (list(&rv), list(&av));
        let names = |l: &[Value]| -> Vec<String> {
            l.iter()
                .map(|m| m.get("destination").and_then(Value::as_str).map(String::from).unwrap_or_else(|| canon(m)))
                .collect()
        };
        if same_multiset(&rl, &al) {
            // Same entries in another order: show where the orders part.
            let (rn, an) = (names(&rl), names(&al));
            let first = rn.iter().zip(&an).position(|(x, y)| x != y).unwrap_or(0);
            let window = |v: &[String]| v[first..(first + 4).min(v.len())].to_vec();
            // For mounts, the order matters when a mount lands under one that comes later
            // (the later one hides it); anything else is the same container.
            let hides = label == "mounts"
                && an
                    .iter()
                    .enumerate()
                    .any(|(i, a)| an[i + 1..].iter().any(|b| a.starts_with(&format!("{}/", b.trim_end_matches('/')))));
            let l = if hides { format!("{label}:order-hides") } else { format!("{label}:order") };
            out.push((
                l,
                format!("from entry {first} of {}: reference {:?} | actk {:?}", rn.len(), window(&rn), window(&an)),
            ));
        } else if label == "mounts" {
            let count = |l: &[Value]| {
                l.iter().fold(BTreeMap::<String, i64>::new(), |mut m, v| {
                    *m.entry(canon(v)).or_default() += 1;
                    m
                })
            };
            let (rc, ac) = (count(&rl), count(&al));
            let only = |x: &BTreeMap<String, i64>, y: &BTreeMap<String, i64>| -> Vec<String> {
                x.iter().filter(|(k, n)| y.get(*k).copied().unwrap_or(0) < **n).map(|(k, _)| k.clone()).collect()
            };
            // The same mount (destination and source) with other options or type, or a mount
            // that one side has and the other has not.
            let keys = |l: &[Value]| -> BTreeSet<String> {
                l.iter().map(|m| format!("{} <- {}", m["destination"], m["source"])).collect()
            };
            let l = if keys(&rl) == keys(&al) { "mounts:options" } else { "mounts:set" };
            out.push((l.into(), format!("only reference {:?} | only actk {:?}", only(&rc, &ac), only(&ac, &rc))));
        } else {
            out.push((label.to_string(), format!("reference {} | actk {}", short(&rv), short(&av))));
        }
    };
    ordered("env", take(&mut r, &["process", "env"]), take(&mut a, &["process", "env"]), &mut out);
    ordered(
        "additionalGids",
        take(&mut r, &["process", "user", "additionalGids"]),
        take(&mut a, &["process", "user", "additionalGids"]),
        &mut out,
    );
    // A bind mount with `type: bind` on one side and no type on the other: runc treats both
    // the same (the options decide), but runtime-tools' checker does not, so actk writes the
    // spec's type as the reference does. Its own label, so that it hides nothing else.
    let (mut rm, mut am) = (take(&mut r, &["mounts"]), take(&mut a, &["mounts"]));
    let untyped_bind = |v: &mut Value| -> usize {
        let mut n = 0;
        for m in v.as_array_mut().into_iter().flatten() {
            if m["type"] == "bind" {
                m.as_object_mut().map(|o| o.remove("type"));
                n += 1;
            }
        }
        n
    };
    let (rn, an) = (untyped_bind(&mut rm), untyped_bind(&mut am));
    if rn != an {
        out.push(("mounts:type-bind".into(), format!("reference gives {rn} bind mounts a type, actk {an}")));
    }
    ordered("mounts", rm, am, &mut out);
    // Device cgroup rules: repeating a rule allows nothing more, so a difference only in
    // repeats has its own label.
    let (rc, ac) = (take(&mut r, &["linux", "resources", "devices"]), take(&mut a, &["linux", "resources", "devices"]));
    let distinct = |v: &Value| -> Vec<String> {
        let mut seen = BTreeSet::new();
        list(v).iter().map(canon).filter(|c| seen.insert(c.clone())).collect()
    };
    // After the engine's rules (the same on both sides), only allow rules are added: their
    // order allows nothing more or less either.
    let added_allows = |v: &Value, base: usize| -> Option<BTreeSet<String>> {
        let l = list(v);
        let rest = l.get(base..)?;
        rest.iter().all(|x| x["allow"] == true).then(|| rest.iter().map(canon).collect())
    };
    let base = list(&rc).iter().zip(list(&ac).iter()).take_while(|(x, y)| x == y && x["allow"] != true).count();
    let (r_allows, a_allows) = (added_allows(&rc, base), added_allows(&ac, base));
    // The nodes actk gives the container, as (type, major, minor) of a rule.
    let rule_key = |x: &Value| {
        (
            x["type"].as_str().unwrap_or_default().to_string(),
            x["major"].as_i64().unwrap_or(-1),
            x["minor"].as_i64().unwrap_or(-1),
        )
    };
    let a_nodes: BTreeSet<(String, i64, i64)> = list(&a["linux"]["devices"]).iter().map(rule_key).collect();
    if rc == ac {
    } else if distinct(&rc) == distinct(&ac) || (r_allows.is_some() && r_allows == a_allows) {
        out.push(("device-cgroup:repeats".into(), format!("reference {} | actk {}", short(&rc), short(&ac))));
    } else if let (Some(ra), Some(aa)) = (&r_allows, &a_allows)
        && aa.is_subset(ra)
        && list(&rc)[base..].iter().filter(|x| !aa.contains(&canon(x))).all(|x| !a_nodes.contains(&rule_key(x)))
    {
        // The reference also allows devices the container gets no node for (a node that a
        // later mention of its path replaced keeps its rule there).
        out.push(("device-cgroup:fewer".into(), format!("reference {} | actk {}", short(&rc), short(&ac))));
    } else {
        ordered("device-cgroup", rc, ac, &mut out);
    }
    // Device nodes: by path, field by field.
    let (rd, ad) = (list(&take(&mut r, &["linux", "devices"])), list(&take(&mut a, &["linux", "devices"])));
    if rd != ad {
        let by_path = |l: &[Value]| -> BTreeMap<String, Value> {
            l.iter().map(|d| (d["path"].as_str().unwrap_or_default().to_string(), d.clone())).collect()
        };
        let (rm, am) = (by_path(&rd), by_path(&ad));
        let rk: BTreeSet<_> = rm.keys().cloned().collect();
        let ak: BTreeSet<_> = am.keys().cloned().collect();
        if rk != ak {
            out.push((
                "devices:set".into(),
                format!(
                    "only reference {:?} | only actk {:?}",
                    rk.difference(&ak).collect::<Vec<_>>(),
                    ak.difference(&rk).collect::<Vec<_>>()
                ),
            ));
        }
        let mut fields: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for p in rk.intersection(&ak) {
            let (x, y) =
                (rm[p].as_object().cloned().unwrap_or_default(), am[p].as_object().cloned().unwrap_or_default());
            let keys: BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                if x.get(k) != y.get(k) {
                    // A fifo has no device numbers: 0:0 written out or left out is one node.
                    // A fifo has no device numbers (mknod(2) ignores them for S_IFIFO).
                    let fifo = x.get("type").and_then(Value::as_str) == Some("p") && (k == "major" || k == "minor");
                    let label = if fifo { "fifo-numbers".to_string() } else { k.clone() };
                    fields.entry(label).or_default().push(format!(
                        "{p}: reference {} | actk {}",
                        x.get(k).map(short).unwrap_or("-".into()),
                        y.get(k).map(short).unwrap_or("-".into())
                    ));
                }
            }
        }
        for (k, v) in &fields {
            out.push((format!("devices:{k}"), v.join("; ")));
        }
        if rk == ak && fields.is_empty() {
            out.push((
                "devices:order".into(),
                format!(
                    "reference {:?} | actk {:?}",
                    rd.iter().map(|d| d["path"].clone()).collect::<Vec<_>>(),
                    ad.iter().map(|d| d["path"].clone()).collect::<Vec<_>>()
                ),
            ));
        }
    }
    let (rh, ah) = (take(&mut r, &["hooks"]), take(&mut a, &["hooks"]));
    if rh != ah {
        let stages: BTreeSet<String> =
            rh.as_object().into_iter().chain(ah.as_object()).flat_map(|m| m.keys().cloned()).collect();
        for s in stages {
            ordered(
                &format!("hooks:{s}"),
                rh.get(&s).cloned().unwrap_or(Value::Null),
                ah.get(&s).cloned().unwrap_or(Value::Null),
                &mut out,
            );
        }
    }
    // Anything else, by its first two levels.
    let mut rest = Vec::new();
    other_diffs(&r, &a, "", 0, &mut rest);
    for (path, d) in rest {
        out.push((format!("other:{path}"), d));
    }
    out
}

fn other_diffs(r: &Value, a: &Value, at: &str, depth: usize, out: &mut Vec<(String, String)>) {
    if r == a {
        return;
    }
    match (r, a) {
        (Value::Object(x), Value::Object(y)) if depth < 2 => {
            let keys: BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                other_diffs(
                    x.get(k).unwrap_or(&Value::Null),
                    y.get(k).unwrap_or(&Value::Null),
                    &format!("{at}.{k}"),
                    depth + 1,
                    out,
                );
            }
        }
        _ => out.push((at.to_string(), format!("reference {} | actk {}", short(r), short(a)))),
    }
}

/// What a refusal is about, from its message (either side's): the allow-list explains classes,
/// not single files. `other` when no class fits (always worth a look).
fn refusal_class(message: &str) -> &'static str {
    let m = message;
    if m.contains("invalid type: null") {
        "null"
    } else if m.contains("permissions \"\"") {
        "empty-permissions"
    } else if m.contains("invalid type: integer")
        || m.contains("invalid type: boolean")
        || m.contains("invalid type: floating")
    {
        "yaml-typing"
    } else if m.contains("must be absolute") || m.contains("must be an absolute") {
        "relative-path"
    } else if m.contains("already defined") || m.contains("duplicate") {
        "duplicate-key"
    } else if m.contains("timeout") {
        "hook-timeout"
    } else if m.contains("ClosID") || m.contains("closID") {
        "closid"
    } else {
        "other"
    }
}

#[test]
fn cdi_reference_library_oracle() -> Result<()> {
    if !is_root() {
        skip_or_fail("Run the tests as root.", "the fixtures need mknod (root)");
        return Ok(());
    }
    if which("go").is_none() && !Path::new("/usr/local/go/bin/go").exists() {
        skip_or_fail("Install Go (>= 1.23).", "go is not installed: the CDI reference oracle is a Go test peer");
        return Ok(());
    }
    let peer = build_peer()?;
    let out = target_dir().join("conformance/cdi-oracle");
    let _ = fs::remove_dir_all(&out);
    fs::create_dir_all(&out)?;
    let cases_root = out.join("specs");

    // ---------------------------------------------------------------- the corpus
    let mut cases = Vec::new();
    add_dir(&mut cases, &cases_root, "ref-schema/good", &peer.join("corpus/schema/good"))?;
    add_dir(&mut cases, &cases_root, "ref-schema/bad", &peer.join("corpus/schema/bad"))?;
    add_dir(&mut cases, &cases_root, "ref-tests", &peer.join("corpus/tests"))?;
    add_dir(&mut cases, &cases_root, "hand", &peer_dir().join("corpus"))?;
    let mut fixtures = Vec::new(); // kept alive: the generated specs name paths inside them
    let hook = bin("actk-hook");
    for name in fixture::ALL {
        let Some(f) = fixture::prepare(name)? else { return Ok(()) };
        let gen_dir = out.join("generated").join(name);
        fs::create_dir_all(&gen_dir)?;
        let o = command_output(
            bin("actk"),
            &[
                "cdi".as_ref(),
                "generate".as_ref(),
                "--root".as_ref(),
                f.root.as_os_str(),
                "--ldcache-hook".as_ref(),
                hook.as_os_str(),
                "--output".as_ref(),
                gen_dir.as_os_str(),
            ],
            &[],
        );
        let (_, err) = text(&o);
        if !o.status.success() {
            bail!("actk cdi generate --root <{name}> failed: {err}");
        }
        add_dir(&mut cases, &cases_root, &format!("fixture/{name}"), &gen_dir)?;
        fixtures.push(f);
    }
    let n_gen: usize = std::env::var("CDI_ORACLE_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(150);
    let seed: u64 = std::env::var("CDI_ORACLE_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(25);
    for (name, content) in generated_specs(n_gen, seed) {
        add_case(&mut cases, &cases_root, format!("gen/{name}"), &name, &content)?;
    }

    // ---------------------------------------------------------------- verdicts
    let specs_req =
        json!({"specs": cases.iter().map(|c| c.file.display().to_string()).collect::<Vec<_>>(), "injections": []});
    let ref_specs = peer_batch(&peer, &specs_req, &out.join("reference-specs.json"))?;
    let ref_specs = ref_specs["specs"].as_array().cloned().unwrap_or_default();
    if ref_specs.len() != cases.len() {
        bail!("cdi-oracle answered for {} of {} specs", ref_specs.len(), cases.len());
    }
    let verdicts: Vec<Verdicts> = cases
        .iter()
        .zip(&ref_specs)
        .map(|(c, r)| Verdicts {
            reference: if r["valid"].as_bool() == Some(true) {
                Ok(())
            } else {
                Err(r["error"].as_str().unwrap_or_default().to_string())
            },
            registry: registry_verdict(c),
            validate: validate_verdict(c),
            names: r["names"]
                .as_array()
                .map(|a| a.iter().filter_map(|n| n.as_str().map(String::from)).collect())
                .unwrap_or_default(),
        })
        .collect();

    // ---------------------------------------------------------------- injections
    let empty_root = out.join("empty-root");
    fs::create_dir_all(&empty_root)?;
    struct Injection {
        case: usize,
        id: String,
        bundle: PathBuf,
        actk: Result<Value, String>,
    }
    let mut injections = Vec::new();
    for (i, (c, v)) in cases.iter().zip(&verdicts).enumerate() {
        if v.names.is_empty() {
            continue;
        }
        let cfg = c.dir.join("actk.toml");
        fs::write(
            &cfg,
            format!(
                "runtimes = [\"/bin/true\"]\nspec_dirs = [{:?}]\nhooks_dirs = []\nroot = {:?}\nprofiles_dir = {:?}\n",
                c.dir.display().to_string(),
                empty_root.display().to_string(),
                empty_root.display().to_string()
            ),
        )?;
        let mut requests: Vec<Vec<String>> = Vec::new();
        let mut seen = BTreeSet::new();
        for n in v.names.iter().filter(|n| seen.insert((*n).clone())).take(SINGLE_NAMES) {
            requests.push(vec![n.clone()]);
        }
        let all: Vec<String> = seen.into_iter().collect();
        if all.len() > 1 {
            requests.push(all);
        }
        for names in requests {
            let k = injections.len();
            let bundle = out.join("bundles").join(format!("{k:05}"));
            fs::create_dir_all(bundle.join("rootfs"))?;
            let config = serde_json::to_vec_pretty(&base_config(&names))?;
            fs::write(bundle.join("config.json"), &config)?;
            fs::write(bundle.join("config.in.json"), &config)?;
            let o = command_output(
                bin("actk-runtime"),
                &["create".as_ref(), "--bundle".as_ref(), bundle.as_os_str(), format!("oracle-{k}").as_ref()],
                &[("ACTK_CONFIG", cfg.as_os_str())],
            );
            let actk = if o.status.success() {
                let edited = fs::read(bundle.join("config.json"))?;
                Ok(serde_json::from_slice(&edited).context("actk-runtime left a config.json that is not JSON")?)
            } else {
                Err(text(&o).1.trim().chars().take(400).collect())
            };
            let label = if names.len() == 1 { names[0].clone() } else { format!("all {}", names.len()) };
            injections.push(Injection { case: i, id: format!("{} [{label}]", c.id), bundle, actk });
        }
    }
    let inj_req = json!({
        "specs": [],
        "injections": injections.iter().enumerate().map(|(k, inj)| json!({
            "id": k.to_string(),
            "specDir": cases[inj.case].dir.display().to_string(),
            "config": inj.bundle.join("config.in.json").display().to_string(),
        })).collect::<Vec<_>>()
    });
    let ref_inj = peer_batch(&peer, &inj_req, &out.join("reference-injections.json"))?;
    let ref_inj = ref_inj["injections"].as_array().cloned().unwrap_or_default();
    if ref_inj.len() != injections.len() {
        bail!("cdi-oracle answered for {} of {} injections", ref_inj.len(), injections.len());
    }

    // ---------------------------------------------------------------- compare
    let mut diffs: Vec<Difference> = Vec::new();
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    let mut bump = |k: &'static str| *counts.entry(k).or_default() += 1;
    let mut report = String::new();
    for (c, v) in cases.iter().zip(&verdicts) {
        bump(if v.reference.is_ok() { "spec: reference valid" } else { "spec: reference invalid" });
        bump(if v.registry.is_ok() { "spec: actk registry valid" } else { "spec: actk registry invalid" });
        bump(if v.validate.is_ok() { "spec: actk cdi validate valid" } else { "spec: actk cdi validate invalid" });
        match (&v.reference, &v.registry) {
            (Ok(()), Err(e)) => diffs.push(Difference {
                case: c.id.clone(),
                label: format!("verdict:actk-refuses:{}", refusal_class(e)),
                detail: format!("actk: {e}"),
            }),
            (Err(e), Ok(())) => diffs.push(Difference {
                case: c.id.clone(),
                label: format!("verdict:actk-accepts:{}", refusal_class(e)),
                detail: format!("reference: {e}"),
            }),
            _ => bump("spec: verdicts agree"),
        }
        match (&v.reference, &v.validate) {
            (Err(e), Ok(())) => diffs.push(Difference {
                case: c.id.clone(),
                label: format!("validate:accepts-what-reference-refuses:{}", refusal_class(e)),
                detail: format!("reference: {e}"),
            }),
            (Ok(()), Err(_)) => bump("spec: actk cdi validate stricter than the reference"),
            _ => {}
        }
    }
    for (inj, r) in injections.iter().zip(&ref_inj) {
        let v = &verdicts[inj.case];
        let verdicts_differ = v.reference.is_ok() != v.registry.is_ok();
        let reference: Result<Value, String> = if r["ok"].as_bool() == Some(true) {
            Ok(r["config"].clone())
        } else {
            Err(r["error"].as_str().unwrap_or_default().to_string())
        };
        bump("injections");
        match (&reference, &inj.actk) {
            (Ok(rc), Ok(ac)) => {
                bump("injection: both applied");
                let d = diff_configs(rc, ac);
                if d.is_empty() {
                    bump("injection: identical result");
                }
                for (label, detail) in d {
                    diffs.push(Difference { case: inj.id.clone(), label, detail });
                }
            }
            (Err(_), Err(_)) => bump("injection: both refused"),
            _ if verdicts_differ => bump("injection: outcome follows a verdict difference"),
            (Ok(_), Err(e)) => diffs.push(Difference {
                case: inj.id.clone(),
                label: "inject:actk-refuses".into(),
                detail: format!("actk: {e}"),
            }),
            // Both found a fault in the spec file, the reference dropped the whole file and
            // actk only the faulty devices (issue 25 item 6): its own label.
            (Err(e), Ok(_)) if v.registry.is_err() && e.starts_with("unresolvable CDI devices") => {
                diffs.push(Difference {
                    case: inj.id.clone(),
                    label: "inject:actk-accepts:isolated".into(),
                    detail: format!("reference: {e}; actk: {}", v.registry.as_ref().err().map_or("", |s| s.as_str())),
                })
            }
            (Err(e), Ok(_)) => diffs.push(Difference {
                case: inj.id.clone(),
                label: "inject:actk-accepts".into(),
                detail: format!("reference: {e}"),
            }),
        }
    }

    // ---------------------------------------------------------------- allow-list and report
    let allow = read_allow_list()?;
    let mut unexplained = 0;
    let mut by_label: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    let mut lines = Vec::new();
    for d in &diffs {
        let hit = allow.iter().find(|a| glob(&a.label, &d.label) && glob(&a.case, &d.case));
        let e = by_label.entry(d.label.clone()).or_default();
        match hit {
            Some(a) => {
                a.used.set(a.used.get() + 1);
                e.0 += 1;
                lines.push(format!(
                    "  allowed  {:<28} {}\n           {}\n           reason: {}",
                    d.label, d.case, d.detail, a.reason
                ));
            }
            None => {
                unexplained += 1;
                e.1 += 1;
                lines.push(format!("  DIFFERS  {:<28} {}\n           {}", d.label, d.case, d.detail));
            }
        }
    }
    let origins: BTreeMap<String, usize> = cases.iter().fold(BTreeMap::new(), |mut m, c| {
        let o = c.id.split('/').next().unwrap_or_default().to_string();
        *m.entry(o).or_default() += 1;
        m
    });
    let _ = writeln!(
        report,
        "CDI reference oracle: tags.cncf.io/container-device-interface (tests/peers/cdi-oracle/go.mod) vs actk"
    );
    let _ = writeln!(report, "corpus: {} spec files ({origins:?})", cases.len());
    for (k, n) in &counts {
        let _ = writeln!(report, "  {k:<58} {n}");
    }
    let _ = writeln!(report, "differences by label (allowed / unexplained):");
    for (l, (a, u)) in &by_label {
        let _ = writeln!(report, "  {l:<40} {a:>5} {u:>5}");
    }
    for a in &allow {
        if a.used.get() == 0 {
            let _ = writeln!(
                report,
                "  stale allow-list entry {} {}: no such difference any more; remove it",
                a.label, a.case
            );
        }
    }
    let _ = writeln!(report, "every difference:");
    for l in &lines {
        let _ = writeln!(report, "{l}");
    }
    let _ = writeln!(report, "unexplained differences: {unexplained}");
    fs::write(out.join("report.txt"), &report)?;
    println!("{report}");
    drop(fixtures);
    assert_eq!(
        unexplained,
        0,
        "{unexplained} differences from the CDI reference library are not in tests/peers/cdi-oracle/allow.tsv; \
         see {}",
        out.join("report.txt").display()
    );
    Ok(())
}
