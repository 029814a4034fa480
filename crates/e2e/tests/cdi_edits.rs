//! Every CDI 1.1 container edit reaches the container or is refused by name (issue 13 item 4,
//! field case F17), and what runc would refuse at start is refused when the spec is read.
//!
//! Each test puts a CDI spec into its own spec dir, asks for its device by annotation
//! (`cdi.k8s.io/...`, as kubelet/CRI and podman do) and runs the bundle through actk-runtime.

use actk_testsupport::engines::{self, ActkConfig, Bundle, actk_runtime, expect_success, text, unique_name};
use anyhow::Result;
use serde_json::{Value, json};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

type OsArg = std::ffi::OsString;

/// A spec of kind `example.com/net` with one device `0` whose edits are `edits` plus a device
/// node (/dev/null) so the device is not empty.
fn spec(version: &str, edits: Value) -> Value {
    let mut e = edits;
    e["deviceNodes"] = json!([{"path": "/dev/null", "type": "c", "major": 1, "minor": 3}]);
    json!({"cdiVersion": version, "kind": "example.com/net", "devices": [{"name": "0", "containerEdits": e}]})
}

/// `actk-runtime run` of a busybox bundle that asks for `example.com/net=0` by annotation.
fn run(cfg: &Path, args: &[&str]) -> Result<(std::process::Output, Bundle, Vec<u8>)> {
    let bundle = Bundle::busybox(args, &[])?;
    bundle.edit(|c| c["annotations"] = json!({"cdi.k8s.io/e2e": "example.com/net=0"}))?;
    let before = fs::read(bundle.config_path())?;
    let id = unique_name("e2e-cdi-edits");
    let o = actk_runtime(cfg, &[OsArg::from("run"), "--bundle".into(), bundle.path().into(), id.as_str().into()]);
    Ok((o, bundle, before))
}

/// F17 with runc 1.1.5 (this machine's runc): its features document has no `linux.netDevices`
/// and it would drop the field without a word, so actk-runtime refuses the container naming the
/// CDI field, the OCI field and the runtime; config.json is left as it was.
#[test]
fn f17_net_devices_are_refused_by_name_when_runc_cannot_apply_them() -> Result<()> {
    if !engines::require_root() {
        return Ok(());
    }
    let host = tempfile::tempdir()?;
    let cfg = ActkConfig::new(host.path())?;
    let s = spec("1.1.0", json!({"netDevices": [{"hostInterfaceName": "actk-e2e0", "name": "net1"}]}));
    fs::write(cfg.spec_dir().join("net.json"), s.to_string())?;
    let (o, bundle, before) = run(&cfg.write()?, &["echo", "container-ran"])?;
    let (out, err) = text(&o);
    assert!(
        !o.status.success() && !out.contains("container-ran"),
        "the container started without its net device:\n{out}\n{err}"
    );
    for want in ["CDI edit netDevices (actk-e2e0)", "linux.netDevices", "runc", "example.com/net=0"] {
        assert!(err.contains(want), "the refusal must name {want:?}: {err}");
    }
    assert_eq!(fs::read(bundle.config_path())?, before, "config.json changed although the start was refused");
    Ok(())
}

/// F17 with a runtime that says it supports network devices (a wrapper whose `features` answers
/// `linux.netDevices.enabled`, standing in for runc >= 1.3): the edit is applied, the runtime
/// receives `linux.netDevices` keyed by the host interface.
#[test]
fn f17_net_devices_reach_a_runtime_that_supports_them() -> Result<()> {
    if !engines::require_root() {
        return Ok(());
    }
    let host = tempfile::tempdir()?;
    let mut cfg = ActkConfig::new(host.path())?;
    let seen = cfg.dir().join("config-seen.json");
    let fake = cfg.dir().join("runtime-with-netdevices");
    fs::write(
        &fake,
        format!(
            "#!/bin/sh\n\
             # features: what runc >= 1.3 answers; create/run: keep the config.json the runtime got.\n\
             if [ \"$1\" = features ]; then echo '{{\"linux\":{{\"netDevices\":{{\"enabled\":true}},\"intelRdt\":{{\"enabled\":true,\"schemata\":true}}}}}}'; exit 0; fi\n\
             while [ $# -gt 0 ]; do case \"$1\" in --bundle|-b) cp \"$2/config.json\" '{}'; shift;; esac; shift; done\n",
            seen.display()
        ),
    )?;
    fs::set_permissions(&fake, fs::Permissions::from_mode(0o755))?;
    cfg.runtimes = vec![fake.display().to_string()];
    let s = spec("1.1.0", json!({"netDevices": [{"hostInterfaceName": "eth7", "name": "net1"}]}));
    fs::write(cfg.spec_dir().join("net.json"), s.to_string())?;
    let (o, _bundle, _) = run(&cfg.write()?, &["true"])?;
    expect_success("actk-runtime run with a netDevices-capable runtime", &o);
    let got: Value = serde_json::from_str(&fs::read_to_string(&seen)?)?;
    assert_eq!(got["linux"]["netDevices"], json!({"eth7": {"name": "net1"}}), "{}", got["linux"]);
    Ok(())
}

/// F17, intelRdt on this host: runc 1.1.5 would start the container without the class when the
/// host has no resctrl (checked first with runc itself), so actk-runtime refuses it naming the
/// field; where resctrl is mounted the class is applied and the container starts in it.
#[test]
fn f17_intel_rdt_is_applied_or_refused_by_name_never_dropped() -> Result<()> {
    if !engines::require_root() {
        return Ok(());
    }
    let resctrl = fs::read_to_string("/proc/self/mountinfo")?.contains(" - resctrl ");
    let host = tempfile::tempdir()?;
    let cfg = ActkConfig::new(host.path())?;
    let s = spec("0.7.0", json!({"intelRdt": {"closID": "actk-e2e"}}));
    fs::write(cfg.spec_dir().join("rdt.json"), s.to_string())?;
    let (o, bundle, before) = run(&cfg.write()?, &["echo", "container-ran"])?;
    let (out, err) = text(&o);
    if resctrl {
        expect_success("actk-runtime run with intelRdt on an RDT host", &o);
        let applied: Value = serde_json::from_str(&fs::read_to_string(bundle.config_path())?)?;
        assert_eq!(applied["linux"]["intelRdt"]["closID"], "actk-e2e", "config.json: {}", applied["linux"]);
        return Ok(());
    }
    // runc alone: the RDT class is dropped without a word.
    let b = Bundle::busybox(&["echo", "container-ran"], &[])?;
    b.edit(|c| c["linux"]["intelRdt"] = json!({"closID": "actk-e2e"}))?;
    let id = unique_name("e2e-runc-rdt");
    let r = engines::runc(&[OsArg::from("run"), "--bundle".into(), b.path().into(), id.as_str().into()]);
    assert!(text(&r).0.contains("container-ran"), "premise: runc 1.1 ignores intelRdt without resctrl: {:?}", text(&r));
    assert!(
        !o.status.success() && !out.contains("container-ran"),
        "the container started without its RDT class:\n{out}"
    );
    for want in ["CDI edit intelRdt", "linux.intelRdt", "resctrl", "example.com/net=0"] {
        assert!(err.contains(want), "the refusal must name {want:?}: {err}");
    }
    assert_eq!(fs::read(bundle.config_path())?, before);
    Ok(())
}

/// Issue 13 item 4: runc refuses a device rule with an empty access (shown first with runc
/// itself), so a spec whose device node asks for one (`"permissions": "none"`, SPEC.md's empty
/// access) is refused when read, with the file, the JSON pointer and the fix, instead of a runc
/// failure at start. Issue 25 item 6: an empty `"permissions": ""` is not that: SPEC.md and the
/// reference library read it as `rwm`, and so does actk; the container runs.
#[test]
fn item4_empty_access_is_refused_when_the_spec_is_read_and_empty_permissions_are_rwm() -> Result<()> {
    if !engines::require_root() {
        return Ok(());
    }
    // What runc does with such a rule.
    let b = Bundle::busybox(&["echo", "container-ran"], &[])?;
    b.edit(|c| {
        c["linux"]["devices"] = json!([{"path": "/dev/actk-null", "type": "c", "major": 1, "minor": 3}]);
        c["linux"]["resources"]["devices"]
            .as_array_mut()
            .expect("runc spec has a device rule list")
            .push(json!({"allow": true, "type": "c", "major": 1, "minor": 3, "access": ""}));
    })?;
    let id = unique_name("e2e-runc-empty-access");
    let o = engines::runc(&[OsArg::from("run"), "--bundle".into(), b.path().into(), id.as_str().into()]);
    let (rout, rerr) = text(&o);
    assert!(!o.status.success() && !rout.contains("container-ran"), "runc accepted an empty access: {rout}{rerr}");

    let host = tempfile::tempdir()?;
    let cfg = ActkConfig::new(host.path())?;
    let mut s = spec("0.5.0", json!({}));
    s["devices"][0]["containerEdits"]["deviceNodes"][0]["permissions"] = json!("none");
    let file = cfg.spec_dir().join("net.json");
    fs::write(&file, s.to_string())?;
    let (o, bundle, before) = run(&cfg.write()?, &["echo", "container-ran"])?;
    let (out, err) = text(&o);
    assert!(!o.status.success() && !out.contains("container-ran"), "{out}\n{err}");
    let want = format!("{}: /devices/0/containerEdits/deviceNodes/0/permissions", file.display());
    assert!(err.contains(&want) && err.contains("leave the field out"), "the error names file, field and fix: {err}");
    assert_eq!(fs::read(bundle.config_path())?, before);
    let v = engines::actk(None, &[OsArg::from("cdi"), "validate".into(), file.clone().into()]);
    assert!(!v.status.success(), "actk cdi validate accepts what runc refuses: {}", text(&v).0);

    s["devices"][0]["containerEdits"]["deviceNodes"][0]["permissions"] = json!("");
    fs::write(&file, s.to_string())?;
    let (o, _, _) = run(&cfg.write()?, &["echo", "container-ran"])?;
    let out = expect_success("actk-runtime run (permissions \"\")", &o);
    assert!(out.contains("container-ran"), "{out}");
    let v = engines::actk(None, &[OsArg::from("cdi"), "validate".into(), file.clone().into()]);
    assert!(v.status.success(), "actk cdi validate refuses what SPEC.md calls rwm: {}", text(&v).1);
    Ok(())
}

/// F17 on the hook path (`docker run --gpus`, hooks.d): a live container cannot take a net device
/// or an RDT class from a hook, so actk-hook refuses such edits by name instead of dropping them.
#[test]
fn f17_hook_refuses_net_devices_and_intel_rdt_by_name() -> Result<()> {
    if !engines::require_root() {
        return Ok(());
    }
    let b = Bundle::busybox(&["true"], &[])?;
    for (field, edits) in [
        ("netDevices", json!({"netDevices": [{"hostInterfaceName": "eth7", "name": "net1"}]})),
        ("intelRdt", json!({"intelRdt": {"closID": "gpu-jobs"}})),
    ] {
        let file = b.path().join("edits.json");
        fs::write(&file, edits.to_string())?;
        let state = json!({"ociVersion": "1.0.2", "id": "e2e-hook-f17", "status": "creating",
                           "pid": std::process::id(), "bundle": b.path()});
        let mut child = std::process::Command::new(engines::bin("actk-hook"))
            .args(["prestart", "--edits"])
            .arg(&file)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()?;
        use std::io::Write as _;
        child.stdin.take().expect("stdin").write_all(state.to_string().as_bytes())?;
        let o = child.wait_with_output()?;
        let err = text(&o).1;
        assert!(!o.status.success(), "actk-hook accepted a {field} edit it cannot apply");
        assert!(err.contains(&format!("CDI edit {field} cannot be applied to a running container")), "{err}");
    }
    Ok(())
}
