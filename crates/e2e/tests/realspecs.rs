//! The config.json files that Docker 20.10 and Podman 4.3 really wrote on this machine
//! (../shared/reference/realspecs) go through actk-runtime with every field they had kept, in
//! their order (issue 3, items 1c, 1e and 4); mounts in the order by depth that the CDI
//! reference library gives them too (issue 25 item 4).
//!
//! The low-level runtime is a fake: a script that copies the edited config.json out of the
//! bundle, so the test sees exactly what runc would have been given.

use actk_testsupport::engines::{self, ActkConfig, actk_runtime, busybox_rootfs, copy_tree, text, unique_name};
use actk_testsupport::fixture;
use anyhow::{Context, Result};
use serde_json::Value;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

/// crates/e2e/tests/data/realspecs: copies of the shared reference files, so a fresh clone has them.
fn realspecs_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/realspecs")
}

/// `want` is contained in `got`: every key of every object is there with a contained value, and
/// in the same relative order; every array element is there in the same relative order.
/// Returns the first difference as a path (`.hooks.prestart[0]`).
fn contained(want: &Value, got: &Value, at: &str) -> Result<(), String> {
    match (want, got) {
        (Value::Object(w), Value::Object(g)) => {
            let mut last = 0;
            for (k, wv) in w {
                let Some(pos) = g.keys().position(|gk| gk == k) else {
                    return Err(format!("{at}.{k} is missing"));
                };
                if pos < last {
                    return Err(format!("{at}.{k} moved before a key that preceded it"));
                }
                last = pos;
                contained(wv, &g[k], &format!("{at}.{k}"))?;
            }
            Ok(())
        }
        (Value::Array(w), Value::Array(g)) => {
            let mut from = 0;
            for (i, wv) in w.iter().enumerate() {
                match g[from..].iter().position(|gv| contained(wv, gv, "").is_ok() && contained(gv, wv, "").is_ok()) {
                    Some(p) => from += p + 1,
                    None => return Err(format!("{at}[{i}] = {wv} is missing or out of order")),
                }
            }
            Ok(())
        }
        (w, g) if w == g => Ok(()),
        (w, g) => Err(format!("{at} was {w}, now {g}")),
    }
}

/// The engine's mounts in the order actk (as the CDI reference library, Docker and CRI-O) puts
/// them once it adds mounts: stably sorted by the depth of the destination (issue 25 item 4).
fn by_depth(spec: &mut Value) {
    if let Some(m) = spec["mounts"].as_array_mut() {
        m.sort_by_key(|m| m["destination"].as_str().unwrap_or("").trim_end_matches('/').matches('/').count().max(1));
    }
}

/// Run one reference spec through actk-runtime as Docker would call it (`--root --log
/// --log-format json create --bundle B --pid-file F ID`), with `root.path` pointed at a real
/// busybox rootfs. Returns (input as given, what the low-level runtime received).
fn through_the_shim(file: &str, cfg: &mut ActkConfig) -> Result<(Value, Value)> {
    let work = tempfile::tempdir()?;
    let bundle = work.path().join("bundle");
    fs::create_dir_all(&bundle)?;
    copy_tree(&busybox_rootfs()?, &bundle.join("rootfs"))?;
    let src = realspecs_dir().join(file);
    let mut spec: Value =
        serde_json::from_str(&fs::read_to_string(&src)?).with_context(|| format!("parsing {}", src.display()))?;
    spec["root"]["path"] = Value::from(bundle.join("rootfs").display().to_string());
    fs::write(bundle.join("config.json"), serde_json::to_vec_pretty(&spec)?)?;

    let copied = work.path().join("received.json");
    let fake = work.path().join("fake-runc");
    fs::write(
        &fake,
        format!(
            "#!/bin/sh\n# fake low-level runtime: keep the bundle's config.json as the shim left it\n\
             b=.\nwhile [ $# -gt 0 ]; do case \"$1\" in --bundle|-b) b=$2; shift;; --bundle=*) b=${{1#--bundle=}};; esac; shift; done\n\
             cp \"$b/config.json\" '{}'\n",
            copied.display()
        ),
    )?;
    fs::set_permissions(&fake, fs::Permissions::from_mode(0o755))?;
    cfg.runtimes = vec![fake.display().to_string()];
    let cfg_path = cfg.write()?;

    let id = unique_name("e2e-realspec");
    let state = work.path().join("state");
    let log = work.path().join("log.json");
    let pid = work.path().join("pid");
    let args: Vec<&std::ffi::OsStr> = vec![
        "--root".as_ref(),
        state.as_os_str(),
        "--log".as_ref(),
        log.as_os_str(),
        "--log-format".as_ref(),
        "json".as_ref(),
        "create".as_ref(),
        "--bundle".as_ref(),
        bundle.as_os_str(),
        "--pid-file".as_ref(),
        pid.as_os_str(),
        id.as_ref(),
    ];
    let o = actk_runtime(&cfg_path, &args);
    let (out, err) = text(&o);
    assert!(
        o.status.success(),
        "actk-runtime create on {file} failed:\n{out}\n{err}\nlog: {}",
        fs::read_to_string(&log).unwrap_or_default()
    );
    let got: Value = serde_json::from_str(
        &fs::read_to_string(&copied)
            .with_context(|| format!("the low-level runtime was not called with the bundle of {file}"))?,
    )?;
    Ok((spec, got))
}

fn device_paths(spec: &Value) -> Vec<String> {
    spec["linux"]["devices"]
        .as_array()
        .map(|a| a.iter().filter_map(|d| d["path"].as_str().map(String::from)).collect())
        .unwrap_or_default()
}

#[test]
fn docker_gpus_spec_keeps_every_field_and_only_drops_the_hook_actk_replaced() -> Result<()> {
    if !engines::require_root() {
        return Ok(());
    }
    let Some(fx) = fixture::prepare("nvidia-dgx-h100")? else { return Ok(()) };
    let mut cfg = ActkConfig::new(&fx.root)?;
    let (mut input, got) = through_the_shim("docker-20.10-gpus.json", &mut cfg)?;
    // actk served NVIDIA_VISIBLE_DEVICES=1,3 itself, so the nvidia-container-runtime-hook that
    // Docker's --gpus added must be gone (issue 3, 1c); everything else must stay.
    let prestart = input["hooks"]["prestart"].as_array_mut().context("no prestart hooks in the reference")?;
    prestart.retain(|h| !h["path"].as_str().unwrap_or_default().ends_with("nvidia-container-runtime-hook"));
    by_depth(&mut input);
    if let Err(d) = contained(&input, &got, "") {
        panic!("docker-20.10-gpus.json lost a field going through actk-runtime: {d}\ngot: {got:#}");
    }
    let hooks = got["hooks"]["prestart"].to_string();
    assert!(!hooks.contains("nvidia-container-runtime-hook"), "the --gpus hook is still there: {hooks}");
    let devs = device_paths(&got);
    for d in ["/dev/nvidia1", "/dev/nvidia3", "/dev/nvidiactl"] {
        assert!(devs.iter().any(|p| p == d), "{d} was not injected: {devs:?}");
    }
    assert!(!devs.iter().any(|p| p == "/dev/nvidia0"), "/dev/nvidia0 was not asked for: {devs:?}");
    Ok(())
}

#[test]
fn docker_run_spec_keeps_every_field() -> Result<()> {
    if !engines::require_root() {
        return Ok(());
    }
    let Some(fx) = fixture::prepare("nvidia-dgx-h100")? else { return Ok(()) };
    let mut cfg = ActkConfig::new(&fx.root)?;
    let (mut input, got) = through_the_shim("docker-20.10-run.json", &mut cfg)?;
    by_depth(&mut input);
    if let Err(d) = contained(&input, &got, "") {
        panic!("docker-20.10-run.json lost a field going through actk-runtime: {d}\ngot: {got:#}");
    }
    let devs = device_paths(&got);
    assert!(devs.iter().any(|p| p == "/dev/nvidia0"), "NVIDIA_VISIBLE_DEVICES=0 was not served: {devs:?}");
    Ok(())
}

#[test]
fn podman_spec_with_cdi_annotation_and_neuron_range_keeps_every_field() -> Result<()> {
    if !engines::require_root() {
        return Ok(());
    }
    let Some(fx) = fixture::prepare("hetero-nvidia-neuron")? else { return Ok(()) };
    let mut cfg = ActkConfig::new(&fx.root)?;
    // The reference asks for `example.com/accel=0` by annotation (cdi.k8s.io/test): a CDI spec
    // defining it, with an env edit only, so nothing on the host is needed. A device name that
    // starts with a digit needs cdiVersion 0.5.0 (CDI SPEC.md).
    let spec_file = cfg.spec_dir().join("example-accel.json");
    fs::write(
        &spec_file,
        serde_json::json!({
            "cdiVersion": "0.5.0",
            "kind": "example.com/accel",
            "devices": [{ "name": "0", "containerEdits": { "env": ["EXAMPLE_ACCEL=0"] } }]
        })
        .to_string(),
    )?;
    let (mut input, got) = through_the_shim("podman-4.3-run.json", &mut cfg)?;
    by_depth(&mut input);
    if let Err(d) = contained(&input, &got, "") {
        panic!("podman-4.3-run.json lost a field going through actk-runtime: {d}\ngot: {got:#}");
    }
    let env = got["process"]["env"].to_string();
    assert!(env.contains("EXAMPLE_ACCEL=0"), "the CDI device from the annotation was not applied: {env}");
    let devs = device_paths(&got);
    for d in ["/dev/neuron0", "/dev/neuron1"] {
        assert!(devs.iter().any(|p| p == d), "AWS_NEURON_VISIBLE_DEVICES=0-1 did not inject {d}: {devs:?}");
    }
    Ok(())
}

#[test]
fn contained_reports_a_dropped_field_a_dropped_element_and_a_reordering() {
    // The comparison above must be able to fail, or the tests using it prove nothing.
    let a: Value = serde_json::json!({"a": 1, "b": {"c": [1, 2, 3]}});
    assert!(contained(&a, &serde_json::json!({"a": 1, "b": {"c": [1, 2, 3]}, "x": 0}), "").is_ok());
    assert!(contained(&a, &serde_json::json!({"b": {"c": [1, 2, 3]}}), "").is_err());
    assert!(contained(&a, &serde_json::json!({"a": 1, "b": {"c": [1, 3]}}), "").is_err());
    assert!(contained(&a, &serde_json::json!({"a": 1, "b": {"c": [3, 2, 1]}}), "").is_err());
    assert!(contained(&a, &serde_json::json!({"b": {"c": [1, 2, 3]}, "a": 1}), "").is_err());
}
