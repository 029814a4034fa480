//! actk-runtime as a program, called the way engines call runc, with a fake low-level runtime
//! that records its argv (no root needed), and one real `runc run` (root).
//!
//! Each test writes its own config (ACTK_CONFIG) with private spec, hooks and profile dirs.

use serde_json::{Value, json};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const SHIM: &str = env!("CARGO_BIN_EXE_actk-runtime");

/// A private config dir: config.toml, cdi/, hooks.d/, profiles.d/, and a fake runtime `fake-runc`
/// that writes its argv (one per line, argv[0] first) to `argv` and its cwd to `cwd`.
struct Env {
    dir: tempfile::TempDir,
}

impl Env {
    fn new() -> Env {
        let dir = tempfile::tempdir().unwrap();
        for d in ["cdi", "hooks.d", "profiles.d", "root"] {
            fs::create_dir_all(dir.path().join(d)).unwrap();
        }
        let fake = dir.path().join("fake-runc");
        fs::write(
            &fake,
            format!(
                "#!/bin/sh\nfor a in \"$0\" \"$@\"; do printf '%s\\n' \"$a\"; done > {d}/argv\npwd > {d}/cwd\n",
                d = dir.path().display()
            ),
        )
        .unwrap();
        fs::set_permissions(&fake, fs::Permissions::from_mode(0o755)).unwrap();
        let e = Env { dir };
        e.write_config(&format!("runtimes = [{:?}]\n", fake.display().to_string()));
        e
    }

    fn p(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    fn write_config(&self, runtimes_line: &str) {
        let s = |p: PathBuf| format!("{:?}", p.display().to_string());
        fs::write(
            self.p("config.toml"),
            format!(
                "{runtimes_line}root = {}\nspec_dirs = [{}]\nhooks_dirs = [{}]\nprofiles_dir = {}\n",
                s(self.p("root")),
                s(self.p("cdi")),
                s(self.p("hooks.d")),
                s(self.p("profiles.d"))
            ),
        )
        .unwrap();
    }

    /// A CDI spec for `kind` with devices `0..n` (nodes `/dev/<node>N`, major `major`) and `all`.
    fn cdi_spec(&self, kind: &str, node: &str, major: i64, n: i64) {
        let devs: Vec<Value> = (0..n)
            .map(|i| json!({"name": i.to_string(), "containerEdits": {"deviceNodes": [{"path": format!("/dev/{node}{i}"), "type": "c", "major": major, "minor": i}]}}))
            .chain(std::iter::once(json!({"name": "all", "containerEdits": {"deviceNodes": (0..n).map(|i| json!({"path": format!("/dev/{node}{i}"), "type": "c", "major": major, "minor": i})).collect::<Vec<_>>()}})))
            .collect();
        let spec = json!({"cdiVersion": "0.5.0", "kind": kind, "devices": devs, "containerEdits": {"env": [format!("FROM_SPEC_{}=1", node.to_uppercase())]}});
        fs::write(
            self.p(&format!("cdi/{}.json", kind.replace('/', "-"))),
            serde_json::to_string_pretty(&spec).unwrap(),
        )
        .unwrap();
    }

    fn bundle(&self, name: &str, config: &Value) -> PathBuf {
        let b = self.p(name);
        fs::create_dir_all(&b).unwrap();
        fs::write(b.join("config.json"), serde_json::to_string_pretty(config).unwrap()).unwrap();
        b
    }

    fn run(&self, args: &[&str], cwd: Option<&Path>) -> Output {
        let mut c = Command::new(SHIM);
        c.args(args).env("ACTK_CONFIG", self.p("config.toml"));
        if let Some(d) = cwd {
            c.current_dir(d);
        }
        c.output().unwrap()
    }

    fn argv(&self) -> Vec<String> {
        fs::read_to_string(self.p("argv")).unwrap_or_default().lines().map(str::to_string).collect()
    }
}

fn minimal(env: &[&str]) -> Value {
    json!({"ociVersion": "1.0.2", "process": {"args": ["sh"], "env": env}, "root": {"path": "rootfs"}, "linux": {}})
}

fn device_paths(c: &Value) -> Vec<String> {
    c.pointer("/linux/devices")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(|d| d["path"].as_str().map(str::to_string)).collect())
        .unwrap_or_default()
}

fn read_json(p: &Path) -> Value {
    serde_json::from_str(&fs::read_to_string(p).unwrap()).unwrap()
}

#[test]
fn f03_every_argument_reaches_the_runtime_unchanged_and_in_order() {
    let e = Env::new();
    e.cdi_spec("nvidia.com/gpu", "nvidia", 195, 2);
    let b = e.bundle("b", &minimal(&["NVIDIA_VISIBLE_DEVICES=1"]));
    let bs = b.display().to_string();
    let args = [
        "--systemd-cgroup",
        "--rootless=false",
        "--console-socket",
        "/x",
        "--root",
        "/run/r",
        "--log",
        "/dev/null",
        "--log-format",
        "json",
        "create",
        "--console-socket",
        "/x",
        "--pidfd-socket",
        "/y",
        "--systemd-cgroup",
        "--rootless=false",
        "--bundle",
        &bs,
        "--pid-file",
        "/run/p.pid",
        "--weird=1",
        "ctr-1",
    ];
    let o = e.run(&args, None);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let got = e.argv();
    assert_eq!(got[0], e.p("fake-runc").display().to_string());
    assert_eq!(&got[1..], &args[..]);
    assert_eq!(
        device_paths(&read_json(&b.join("config.json"))),
        vec!["/dev/nvidia1"],
        "create was recognised after unknown flags"
    );
    // Non-create subcommands pass through the same way, bundle untouched.
    let o = e.run(&["--unknown", "state", "ctr-1"], None);
    assert!(o.status.success());
    assert_eq!(&e.argv()[1..], &["--unknown", "state", "ctr-1"]);
}

/// Issue 25 item 5: `create -h`, `run --help` and the like go to the runtime unchanged without
/// reading a config.json (runc prints its help); a bundle without config.json is the runtime's
/// to report, in its own words; a bundle asking for a device with `--help` after it is not
/// edited.
#[test]
fn help_and_a_missing_config_json_pass_through_to_the_runtime() {
    let e = Env::new();
    let empty = e.p("no-bundle");
    fs::create_dir_all(&empty).unwrap();
    for args in [&["create", "-h"][..], &["run", "--help"], &["--root", "/r", "create", "--help", "x"], &["run", "x"]] {
        let o = e.run(args, Some(&empty));
        assert!(o.status.success(), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
        assert_eq!(&e.argv()[1..], args);
    }
    e.cdi_spec("nvidia.com/gpu", "nvidia", 195, 2);
    let b = e.bundle("b", &minimal(&["NVIDIA_VISIBLE_DEVICES=1"]));
    let before = fs::read(b.join("config.json")).unwrap();
    let o = e.run(&["create", "--bundle", b.to_str().unwrap(), "x", "--help"], None);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(fs::read(b.join("config.json")).unwrap(), before, "help creates nothing: config.json untouched");
}

/// Field case F04: every way of naming the bundle edits the same config.json.
#[test]
fn f04_bundle_forms_edit_the_same_config_json() {
    let e = Env::new();
    e.cdi_spec("nvidia.com/gpu", "nvidia", 195, 4);
    type Form = (&'static str, fn(&str) -> Vec<String>);
    let forms: [Form; 4] = [
        ("-b DIR", |b| vec!["create".into(), "-b".into(), b.into(), "id".into()]),
        ("--bundle=DIR", |b| vec!["create".into(), format!("--bundle={b}"), "id".into()]),
        ("--bundle DIR", |b| vec!["create".into(), "--bundle".into(), b.into(), "id".into()]),
        ("working directory", |_| vec!["create".into(), "id".into()]),
    ];
    let mut results = Vec::new();
    for (i, (what, args)) in forms.iter().enumerate() {
        let b = e.bundle(&format!("b{i}"), &minimal(&["NVIDIA_VISIBLE_DEVICES=2"]));
        let args = args(&b.display().to_string());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = e.run(&args, Some(&b));
        assert!(o.status.success(), "{what}: {}", String::from_utf8_lossy(&o.stderr));
        let c = read_json(&b.join("config.json"));
        assert_eq!(device_paths(&c), vec!["/dev/nvidia2"], "{what}");
        results.push(c);
    }
    assert!(results.windows(2).all(|w| w[0] == w[1]), "all four forms give the same config.json");
}

#[test]
fn f02_missing_runtime_names_the_name_and_the_path_searched_and_logs_json_for_docker() {
    let e = Env::new();
    e.write_config("runtimes = [\"actk-no-such-runc\"]\n");
    let b = e.bundle("b", &minimal(&["NVIDIA_VISIBLE_DEVICES=0"]));
    let before = fs::read(b.join("config.json")).unwrap();
    let log = e.p("log.json");
    let bs = b.display().to_string();
    let ls = log.display().to_string();
    let o = Command::new(SHIM)
        .args(["--log", &ls, "--log-format", "json", "create", "--bundle", &bs, "id"])
        .env("ACTK_CONFIG", e.p("config.toml"))
        .env("PATH", "/opt/a:/opt/b")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("actk-no-such-runc") && err.contains("PATH=/opt/a:/opt/b"), "{err}");
    let line: Value = serde_json::from_str(fs::read_to_string(&log).unwrap().lines().last().unwrap()).unwrap();
    assert_eq!(line["level"], "error");
    assert!(line["msg"].as_str().unwrap().contains("actk-no-such-runc"), "{line}");
    assert_eq!(fs::read(b.join("config.json")).unwrap(), before, "config.json untouched");
}

#[test]
fn f02_bare_name_is_found_on_path() {
    let e = Env::new();
    fs::create_dir_all(e.p("bin")).unwrap();
    fs::rename(e.p("fake-runc"), e.p("bin/my-runc")).unwrap();
    e.write_config("runtimes = [\"no-such-one\", \"my-runc\"]\n");
    let o = Command::new(SHIM)
        .args(["state", "x"])
        .env("ACTK_CONFIG", e.p("config.toml"))
        .env("PATH", e.p("bin"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // ($0 of a script is its path whatever argv[0] was: the kernel passes the path to sh.)
    assert_eq!(e.argv(), vec![e.p("bin/my-runc").display().to_string(), "state".into(), "x".into()]);
}

#[test]
fn unknown_device_fails_before_exec_naming_variable_value_and_devices_and_leaves_config_json() {
    let e = Env::new();
    e.cdi_spec("nvidia.com/gpu", "nvidia", 195, 2);
    for (env, want) in [
        (
            "NVIDIA_VISIBLE_DEVICES=7",
            "NVIDIA_VISIBLE_DEVICES=7: no such device 7; the CDI specs on this node define nvidia.com/gpu 0,1, all",
        ),
        ("NVIDIA_VISIBLE_DEVICES=0,,banana", "NVIDIA_VISIBLE_DEVICES=0,,banana: empty entry"),
    ] {
        let b = e.bundle("b", &minimal(&[env]));
        let before = fs::read(b.join("config.json")).unwrap();
        let log = e.p("log.txt");
        let o = e.run(&["--log", log.to_str().unwrap(), "create", "-b", b.to_str().unwrap(), "id"], None);
        assert_eq!(o.status.code(), Some(1));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(want), "{err}");
        assert!(!e.p("argv").exists(), "the low-level runtime must not run");
        assert_eq!(fs::read(b.join("config.json")).unwrap(), before);
        assert!(
            fs::read_to_string(&log).unwrap().contains("level=error"),
            "text log line when --log-format is not json"
        );
    }
    // A CDI name no spec defines.
    let mut c = minimal(&[]);
    c["annotations"] = json!({"cdi.k8s.io/x": "example.com/accel=3"});
    let b = e.bundle("b2", &c);
    let o = e.run(&["create", "-b", b.to_str().unwrap(), "id"], None);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("annotation cdi.k8s.io/x") && err.contains("example.com/accel=3"),
        "{err}"
    );
}

#[test]
fn log_file_records_what_was_served() {
    let e = Env::new();
    e.cdi_spec("nvidia.com/gpu", "nvidia", 195, 2);
    let cfg = fs::read_to_string(e.p("config.toml")).unwrap();
    fs::write(e.p("config.toml"), format!("log_file = {:?}\n{cfg}", e.p("actk.log").display().to_string())).unwrap();
    let b = e.bundle("b", &minimal(&["NVIDIA_VISIBLE_DEVICES=1"]));
    assert!(e.run(&["create", "-b", b.to_str().unwrap(), "id"], None).status.success());
    let log = fs::read_to_string(e.p("actk.log")).unwrap();
    assert!(log.contains("nvidia.com/gpu=1 (NVIDIA_VISIBLE_DEVICES, spec)"), "{log}");
}

#[test]
fn nothing_requested_leaves_config_json_byte_for_byte() {
    let e = Env::new();
    let b = e.bundle("b", &minimal(&["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_VISIBLE_DEVICES=void"]));
    let before = fs::read(b.join("config.json")).unwrap();
    let o = e.run(&["create", "--bundle", b.to_str().unwrap(), "id"], None);
    assert!(o.status.success(), "F01: void after all starts the container: {}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(fs::read(b.join("config.json")).unwrap(), before);
}

#[test]
fn hooks_d_file_merged_only_for_matching_annotation_and_malformed_file_named() {
    let e = Env::new();
    // The hook's executable must exist (a file naming a missing one is skipped, as podman does).
    let hook = e.p("neuron-oci-hook");
    fs::write(&hook, "#!/bin/sh\n").unwrap();
    fs::set_permissions(&hook, fs::Permissions::from_mode(0o755)).unwrap();
    fs::write(
        e.p("hooks.d/10-neuron.json"),
        r#"{"version":"1.0.0","hook":{"path":"HOOK","args":["neuron-oci-hook"]},"when":{"annotations":{"^com\\.example\\.neuron$":"^yes$"}},"stages":["createRuntime"]}"#
            .replace("HOOK", &hook.display().to_string()),
    )
    .unwrap();
    let mut c = minimal(&[]);
    c["annotations"] = json!({"com.example.neuron": "yes"});
    let yes = e.bundle("yes", &c);
    let no = e.bundle("no", &minimal(&[]));
    assert!(e.run(&["create", "-b", yes.to_str().unwrap(), "a"], None).status.success());
    assert!(e.run(&["create", "-b", no.to_str().unwrap(), "b"], None).status.success());
    assert_eq!(read_json(&yes.join("config.json"))["hooks"]["createRuntime"][0]["path"], hook.display().to_string());
    assert!(read_json(&no.join("config.json")).get("hooks").is_none());

    fs::write(e.p("hooks.d/20-bad.json"), "{\"version\": \"1.0.0\",").unwrap();
    let o = e.run(&["create", "-b", no.to_str().unwrap(), "c"], None);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("20-bad.json"), "{err}");
}

/// create fails on a malformed config.toml naming the file, line and key; the other calls need
/// only `runtimes` (issue 14's fast path), so a typo elsewhere cannot stop the delete of a
/// running container, while a bad `runtimes` still fails them.
#[test]
fn malformed_config_toml_names_file_and_line() {
    let e = Env::new();
    let fake = e.p("fake-runc").display().to_string();
    fs::write(e.p("config.toml"), format!("runtimes = [{fake:?}]\nspec_dir = [\"/etc/cdi\"]\n")).unwrap();
    let b = e.bundle("b", &minimal(&[]));
    let o = e.run(&["create", "-b", b.to_str().unwrap(), "x"], None);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("config.toml") && err.contains("line 2") && err.contains("spec_dir"),
        "{err}"
    );
    let o = e.run(&["delete", "x"], None);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(fs::read_to_string(e.p("argv")).unwrap().lines().nth(1), Some("delete"), "delete reached the runtime");
    fs::write(e.p("config.toml"), "runtimes = \"runc\"\n").unwrap();
    let o = e.run(&["delete", "x"], None);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("config.toml") && err.contains("line 1"), "{err}");
}

/// Every field of `before` is in `after` with the same value; arrays keep `before`'s elements in
/// order (new elements may be interleaved). Returns the first difference as a JSON pointer.
fn kept(before: &Value, after: &Value, at: &str) -> Result<(), String> {
    match (before, after) {
        (Value::Object(b), Value::Object(a)) => {
            let keys_a: Vec<&String> = a.keys().filter(|k| b.contains_key(*k)).collect();
            let keys_b: Vec<&String> = b.keys().collect();
            if keys_a != keys_b {
                return Err(format!("{at}: keys or their order changed: {keys_b:?} -> {keys_a:?}"));
            }
            b.iter().try_for_each(|(k, v)| kept(v, &a[k], &format!("{at}/{k}")))
        }
        (Value::Array(b), Value::Array(a)) => {
            let mut it = a.iter();
            for (i, x) in b.iter().enumerate() {
                if !it.any(|y| y == x) {
                    return Err(format!("{at}/{i}: {x} is gone or moved"));
                }
            }
            Ok(())
        }
        _ if before == after => Ok(()),
        _ => Err(format!("{at}: {before} -> {after}")),
    }
}

fn realspec(name: &str) -> Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/reference/realspecs").join(name);
    let p = if p.exists() {
        p
    } else {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../e2e/tests/data/realspecs").join(name)
    };
    read_json(&p)
}

#[test]
fn real_engine_config_json_files_keep_every_field_through_the_shim() {
    let e = Env::new();
    e.cdi_spec("nvidia.com/gpu", "nvidia", 195, 4);
    e.cdi_spec("aws.amazon.com/neuron", "neuron", 240, 2);
    e.cdi_spec("example.com/accel", "accel", 261, 1);
    for (file, want_devices) in [
        ("docker-20.10-gpus.json", vec!["/dev/nvidia1", "/dev/nvidia3"]),
        ("docker-20.10-run.json", vec![]),
        ("podman-4.3-run.json", vec!["/dev/neuron0", "/dev/neuron1", "/dev/accel0"]),
    ] {
        let mut before = realspec(file);
        let b = e.bundle(file, &before);
        // Docker calls the runtime this way (ENVIRONMENT.md).
        let o = e.run(
            &[
                "--root",
                "/run/r",
                "--log",
                e.p("log.json").to_str().unwrap(),
                "--log-format",
                "json",
                "create",
                "--bundle",
                b.to_str().unwrap(),
                "--pid-file",
                "/run/p",
                "id",
            ],
            None,
        );
        assert!(o.status.success(), "{file}: {}", String::from_utf8_lossy(&o.stderr));
        let after = read_json(&b.join("config.json"));
        let devs = device_paths(&after);
        let injected: Vec<&str> = devs.iter().map(String::as_str).filter(|d| want_devices.contains(d)).collect();
        assert_eq!(injected, want_devices, "{file}: {devs:?}");
        if file == "docker-20.10-gpus.json" {
            // The one deliberate removal: Docker's --gpus hook, since actk served the request.
            let pre = before["hooks"]["prestart"].as_array_mut().unwrap();
            pre.retain(|h| h["args"][0] != "nvidia-container-runtime-hook");
            assert_eq!(after["hooks"]["prestart"].as_array().unwrap().len(), 1, "{}", after["hooks"]);
        }
        kept(&before, &after, "").unwrap_or_else(|d| panic!("{file} lost a field: {d}"));
        if !want_devices.is_empty() {
            assert!(after["annotations"]["io.actk.applied"].is_string(), "{file}");
        }
    }
}

/// A real `runc run` of a busybox bundle through actk-runtime on the DGX fixture: the container
/// sees exactly /dev/nvidia1, /dev/nvidia3 and the control nodes, and can write to a node that
/// has /dev/null's numbers. Needs root and runc; skipped (with a message) otherwise.
#[test]
fn runc_run_through_shim_on_dgx_fixture_sees_exactly_gpus_1_and_3() {
    use actk_testsupport::{engines, fixture};
    if !engines::require_root() {
        return;
    }
    let Some(fx) = fixture::prepare("nvidia-dgx-h100").unwrap() else { return };
    // A node the container really opens: /dev/null's numbers (1:3), in the fixture root, named by
    // a CDI spec without numbers (the shim reads them from the host node). The GPU nodes keep
    // the driver's numbers: discovery rightly refuses a /dev/nvidiaN that is not 195:N.
    let null_node = fx.root.join("dev/actk-null");
    let _ = fs::remove_file(&null_node);
    assert!(
        Command::new("mknod").args(["-m", "0666"]).arg(&null_node).args(["c", "1", "3"]).status().unwrap().success()
    );
    let bundle = engines::Bundle::busybox(
        &["sh", "-c", "ls -1 /dev | grep nvidia; echo x > /dev/actk-null && echo write-ok"],
        &["NVIDIA_VISIBLE_DEVICES=1,3"],
    )
    .unwrap();
    bundle.edit(|c| c["annotations"] = json!({"cdi.k8s.io/test": "example.com/null=0"})).unwrap();
    let e = Env::new();
    let spec = json!({"cdiVersion": "0.5.0", "kind": "example.com/null",
        "devices": [{"name": "0", "containerEdits": {"deviceNodes": [{"path": "/dev/actk-null", "hostPath": null_node.display().to_string()}]}}]});
    fs::write(e.p("cdi/null.json"), spec.to_string()).unwrap();
    e.write_config("runtimes = [\"runc\"]\n");
    let cfg = fs::read_to_string(e.p("config.toml")).unwrap().replace(
        &format!("root = {:?}", e.p("root").display().to_string()),
        &format!("root = {:?}", fx.root.display().to_string()),
    );
    fs::write(e.p("config.toml"), cfg).unwrap();
    let id = engines::unique_name("actk-runtime-test");
    let o = e.run(&["run", "--bundle", bundle.path().to_str().unwrap(), &id], None);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{out}\n{}", String::from_utf8_lossy(&o.stderr));
    let nodes: Vec<&str> = out.lines().filter(|l| l.starts_with("nvidia")).collect();
    let mut want = vec!["nvidia1", "nvidia3"];
    for c in ["nvidia-modeset", "nvidia-uvm", "nvidia-uvm-tools", "nvidiactl"] {
        if fx.root.join("dev").join(c).exists() {
            want.push(c);
        }
    }
    want.sort();
    let mut got = nodes.clone();
    got.sort();
    assert_eq!(got, want, "{out}");
    assert!(out.contains("write-ok"), "{out}");
}

#[test]
fn f07_two_containers_started_at_the_same_moment_both_get_all_devices() {
    let e = Env::new();
    e.cdi_spec("nvidia.com/gpu", "nvidia", 195, 8);
    let bundles: Vec<PathBuf> =
        (0..2).map(|i| e.bundle(&format!("c{i}"), &minimal(&["NVIDIA_VISIBLE_DEVICES=all"]))).collect();
    let barrier = std::sync::Barrier::new(2);
    std::thread::scope(|s| {
        let handles: Vec<_> = bundles
            .iter()
            .map(|b| {
                let (e, barrier) = (&e, &barrier);
                s.spawn(move || {
                    barrier.wait();
                    e.run(&["create", "--bundle", b.to_str().unwrap(), "id"], None)
                })
            })
            .collect();
        for h in handles {
            let o = h.join().unwrap();
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        }
    });
    let want: Vec<String> = (0..8).map(|i| format!("/dev/nvidia{i}")).collect();
    for b in &bundles {
        assert_eq!(device_paths(&read_json(&b.join("config.json"))), want, "{}", b.display());
    }
}

/// Issue 13 item 7: with the systemd cgroup driver (`--systemd-cgroup`), actk-runtime makes the
/// /dev/char/MAJOR:MINOR links of the nodes it injects (systemd drops a DeviceAllow rule whose
/// /dev/char path is missing, and a daemon-reload then takes the device away); without it, none.
#[test]
fn item7_systemd_cgroup_gets_dev_char_links_for_the_injected_nodes() {
    let e = Env::new();
    e.cdi_spec("nvidia.com/gpu", "nvidia", 195, 2);
    let b = e.bundle("b", &minimal(&["NVIDIA_VISIBLE_DEVICES=1"]));
    let o = e.run(&["create", "--bundle", &b.display().to_string(), "c1"], None);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(!e.p("root/dev/char").exists(), "cgroupfs driver: no links");
    let b = e.bundle("b2", &minimal(&["NVIDIA_VISIBLE_DEVICES=1"]));
    let o = e.run(&["--systemd-cgroup", "create", "--bundle", &b.display().to_string(), "c2"], None);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let links: Vec<String> = fs::read_dir(e.p("root/dev/char"))
        .unwrap()
        .map(|d| d.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(links, ["195:1"], "only the injected GPU's node");
    assert_eq!(fs::read_link(e.p("root/dev/char/195:1")).unwrap(), Path::new("/dev/nvidia1"));
}
