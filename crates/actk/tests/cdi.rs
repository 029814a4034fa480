//! `actk cdi generate | list | validate` as a user runs them, on fixture host roots.

use actk_testsupport::fixture;
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};

fn actk(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_actk")).args(args).env("ACTK_LOG", "error").output().expect("run actk")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn root_arg(f: &fixture::Fixture) -> String {
    f.root.display().to_string()
}

#[test]
fn generate_then_validate_round_trip_on_dgx() {
    let Some(f) = fixture::prepare("nvidia-dgx-h100").unwrap() else { return };
    let out = tempfile::tempdir().unwrap();
    let dir = out.path().join("cdi");
    let o = actk(&["cdi", "generate", "--root", &root_arg(&f), "--output", dir.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let file = dir.join("nvidia.com-gpu.json");
    assert!(stdout(&o).contains(&format!("wrote {}", file.display())), "{}", stdout(&o));

    let spec: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    // podman 4.3 (CDI 0.5.x) must accept it: version <= 0.5.0, no annotations anywhere.
    assert_eq!(spec["cdiVersion"], "0.5.0");
    assert!(spec.get("annotations").is_none());
    let names: Vec<&str> = spec["devices"].as_array().unwrap().iter().map(|d| d["name"].as_str().unwrap()).collect();
    // 8 GPUs by index and UUID, `all`, and the two MIG management capabilities (MIG is off).
    assert_eq!(names.len(), 8 * 2 + 1 + 2, "{names:?}");
    assert_eq!(names[0], "0");
    assert!(names[1].starts_with("GPU-"), "{names:?}");
    assert_eq!(names[16..], ["all", "mig-config", "mig-monitor"]);
    let node = &spec["devices"][2]["containerEdits"]["deviceNodes"][0];
    assert_eq!(node["path"], "/dev/nvidia1");
    assert_eq!(node["hostPath"], format!("{}/dev/nvidia1", f.root.display()));
    assert_eq!(
        (node["type"].as_str(), node["major"].as_i64(), node["minor"].as_i64()),
        (Some("c"), Some(195), Some(1))
    );
    let shared: Vec<&str> =
        spec["containerEdits"]["deviceNodes"].as_array().unwrap().iter().map(|n| n["path"].as_str().unwrap()).collect();
    assert!(shared.contains(&"/dev/nvidiactl"), "{shared:?}");
    let mounts = spec["containerEdits"]["mounts"].as_array().unwrap();
    assert!(mounts.iter().any(|m| m["containerPath"].as_str().unwrap().ends_with("/libcuda.so.580.95.05")));
    assert!(mounts.iter().all(|m| m["options"] == serde_json::json!(["ro", "nosuid", "nodev", "bind"])));

    let v = actk(&["cdi", "validate", file.to_str().unwrap()]);
    assert!(v.status.success(), "{}", stderr(&v));
    assert_eq!(stdout(&v), format!("{}: valid (nvidia.com/gpu, 19 devices, cdiVersion 0.5.0)\n", file.display()));

    let l = actk(&["cdi", "list", "--spec-dir", dir.to_str().unwrap()]);
    assert!(l.status.success());
    let listed: Vec<String> = stdout(&l).lines().map(String::from).collect();
    assert_eq!(listed.len(), 19);
    assert!(listed.contains(&"nvidia.com/gpu=all".to_string()));
    assert!(listed.contains(&"nvidia.com/gpu=7".to_string()));
}

#[test]
fn yaml_output_validates_and_matches_json() {
    let Some(f) = fixture::prepare("aws-inf2-48xlarge").unwrap() else { return };
    let out = tempfile::tempdir().unwrap();
    let yaml = out.path().join("neuron.yaml");
    let o = actk(&["cdi", "generate", "--root", &root_arg(&f), "--output", yaml.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = std::fs::read_to_string(&yaml).unwrap();
    assert!(text.contains("kind: aws.amazon.com/neuron"), "{text}");
    let v = actk(&["cdi", "validate", yaml.to_str().unwrap()]);
    assert!(v.status.success(), "{}", stderr(&v));
    assert!(stdout(&v).contains("(aws.amazon.com/neuron, 25 devices,"), "{}", stdout(&v));

    let json = actk(&["cdi", "generate", "--root", &root_arg(&f), "--format", "json"]);
    let from_json: Value = serde_json::from_slice(&json.stdout).unwrap();
    let from_yaml: Value = serde_saphyr_value(&text);
    assert_eq!(from_json, from_yaml);
}

fn serde_saphyr_value(text: &str) -> Value {
    // Parse through actk's own reader so this test also covers YAML input.
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("x.yaml");
    std::fs::write(&p, text).unwrap();
    let spec = actk_core::cdi::validate::validate_file(&p).unwrap();
    serde_json::to_value(spec).unwrap()
}

#[test]
fn several_kinds_need_a_directory_output() {
    let Some(f) = fixture::prepare("hetero-nvidia-neuron").unwrap() else { return };
    let out = tempfile::tempdir().unwrap();
    let file = out.path().join("one.json");
    let o = actk(&["cdi", "generate", "--root", &root_arg(&f), "--output", file.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(
        err.contains("2 kinds were found (nvidia.com/gpu, aws.amazon.com/neuron)")
            && err.contains("give a directory to --output"),
        "{err}"
    );
    assert!(!file.exists());

    let dir = out.path().join("specs");
    let o = actk(&["cdi", "generate", "--root", &root_arg(&f), "--output", dir.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(dir.join("nvidia.com-gpu.json").is_file() && dir.join("aws.amazon.com-neuron.json").is_file());

    let o =
        actk(&["cdi", "generate", "--root", &root_arg(&f), "--vendor", "neuron", "--output", file.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let spec: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(spec["kind"], "aws.amazon.com/neuron");

    let o = actk(&["cdi", "generate", "--root", &root_arg(&f), "--vendor", "amd"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("no devices of vendor \"amd\""), "{}", stderr(&o));
}

#[test]
fn every_fixture_generates_specs_podman_4_3_accepts() {
    for name in fixture::ALL {
        let Some(f) = fixture::prepare(name).unwrap() else { return };
        let out = tempfile::tempdir().unwrap();
        let o = actk(&["cdi", "generate", "--root", &root_arg(&f), "--output", out.path().to_str().unwrap()]);
        assert!(o.status.success(), "{name}: {}", stderr(&o));
        for entry in std::fs::read_dir(out.path()).unwrap() {
            let path = entry.unwrap().path();
            let spec: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            let version = spec["cdiVersion"].as_str().unwrap();
            assert!(["0.3.0", "0.4.0", "0.5.0"].contains(&version), "{name}: {} declares {version}", path.display());
            let v = actk(&["cdi", "validate", path.to_str().unwrap()]);
            assert!(v.status.success(), "{name}: {}", stderr(&v));
        }
    }
}

#[test]
fn host_without_accelerators_generates_nothing_and_succeeds() {
    let Some(f) = fixture::prepare("empty").unwrap() else { return };
    let o = actk(&["cdi", "generate", "--root", &root_arg(&f)]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), "");
    assert!(stderr(&o).contains("no accelerator devices found"), "{}", stderr(&o));
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    std::fs::create_dir_all(dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.display().to_string()
}

#[test]
fn validate_f06_additional_gids_with_0_5_0_fails_naming_field_and_version() {
    let tmp = tempfile::tempdir().unwrap();
    let bad = write(
        tmp.path(),
        "f06.json",
        r#"{"cdiVersion": "0.5.0", "kind": "vendor.com/dev",
            "devices": [{"name": "dev0", "containerEdits": {"deviceNodes": [{"path": "/dev/null"}], "additionalGids": [44]}}]}"#,
    );
    let o = actk(&["cdi", "validate", &bad]);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(
        err.contains(&format!("{bad}: /cdiVersion: spec declares cdiVersion 0.5.0 but uses additionalGids (at devices[0] (dev0) containerEdits), which needs cdiVersion >= 0.7.0")),
        "{err}"
    );
    assert!(err.contains("1 of 1 CDI spec files are invalid"), "{err}");
}

#[test]
fn validate_reports_every_bad_file_and_keeps_going() {
    let tmp = tempfile::tempdir().unwrap();
    let good = write(
        tmp.path(),
        "good.yaml",
        "cdiVersion: 0.3.0\nkind: vendor.com/dev\ndevices:\n  - name: dev0\n    containerEdits:\n      deviceNodes:\n        - path: /dev/null\n",
    );
    let hook = write(
        tmp.path(),
        "hook.json",
        r#"{"cdiVersion": "0.3.0", "kind": "vendor.com/dev",
            "devices": [{"name": "dev0", "containerEdits": {"hooks": [{"hookName": "createContainer", "path": "my-hook"}]}}]}"#,
    );
    let broken = write(tmp.path(), "broken.json", "{\"cdiVersion\": ");
    let o = actk(&["cdi", "validate", &good, &hook, &broken]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stdout(&o).contains(&format!("{good}: valid (vendor.com/dev, 1 devices, cdiVersion 0.3.0)")),
        "{}",
        stdout(&o)
    );
    let err = stderr(&o);
    assert!(
        err.contains(&format!(
            "{hook}: /devices/0/containerEdits/hooks/0/path: hook path \"my-hook\" must be absolute"
        )),
        "{err}"
    );
    assert!(err.contains(&format!("{broken}: cannot parse CDI spec as JSON")), "{err}");
    assert!(err.contains("2 of 3 CDI spec files are invalid"), "{err}");
}

#[test]
fn list_later_spec_dir_wins_and_bad_files_are_warned() {
    let tmp = tempfile::tempdir().unwrap();
    let (etc, run) = (tmp.path().join("etc"), tmp.path().join("run"));
    let spec = |names: &[&str]| {
        let devs: Vec<String> = names
            .iter()
            .map(|n| format!(r#"{{"name": "{n}", "containerEdits": {{"deviceNodes": [{{"path": "/dev/null"}}]}}}}"#))
            .collect();
        format!(r#"{{"cdiVersion": "0.5.0", "kind": "vendor.com/dev", "devices": [{}]}}"#, devs.join(","))
    };
    write(&etc, "a.json", &spec(&["0", "1"]));
    write(&run, "b.json", &spec(&["1", "2"]));
    write(&run, "c.json", "not: [valid");
    let o = actk(&["cdi", "list", "--spec-dir", etc.to_str().unwrap(), "--spec-dir", run.to_str().unwrap()]);
    assert!(o.status.success());
    assert_eq!(stdout(&o), "vendor.com/dev=0\nvendor.com/dev=1\nvendor.com/dev=2\n");
    assert!(stderr(&o).contains(&format!("skipped {}", run.join("c.json").display())), "{}", stderr(&o));
}

#[test]
fn config_file_gives_root_and_spec_dirs() {
    let Some(f) = fixture::prepare("aws-inf2-48xlarge").unwrap() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let specs = tmp.path().join("specs");
    let cfg = tmp.path().join("config.toml");
    std::fs::write(
        &cfg,
        format!("root = {:?}\nspec_dirs = [{:?}]\n", f.root.display().to_string(), specs.display().to_string()),
    )
    .unwrap();
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_actk"))
            .args(args)
            .env("ACTK_CONFIG", &cfg)
            .env_remove("ACTK_ROOT")
            .output()
            .unwrap()
    };
    let o = run(&["cdi", "generate", "--output", specs.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = run(&["cdi", "list"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let names = stdout(&o);
    assert!(
        names.lines().any(|l| l == "aws.amazon.com/neuron=11")
            && names.lines().any(|l| l == "aws.amazon.com/neuron=all"),
        "{names}"
    );
}

/// Issue 13 item 4: `actk cdi generate --root <relative path>` resolves the root against the
/// working directory (the spec names absolute host paths and validates), instead of refusing
/// its own output as "a defect in actk".
#[test]
fn item4_relative_root_is_resolved_against_the_working_directory() {
    let Some(f) = fixture::prepare("nvidia-dgx-h100").unwrap() else { return };
    let parent = f.root.parent().unwrap();
    let rel = f.root.file_name().unwrap().to_str().unwrap();
    let out = tempfile::tempdir().unwrap();
    let file = out.path().join("gpu.json");
    let o = Command::new(env!("CARGO_BIN_EXE_actk"))
        .args(["cdi", "generate", "--ldcache-hook", "none", "--root", rel, "--output", file.to_str().unwrap()])
        .current_dir(parent)
        .env("ACTK_LOG", "error")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let spec: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let node = &spec["devices"][0]["containerEdits"]["deviceNodes"][0];
    assert_eq!(node["hostPath"], format!("{}/dev/nvidia0", f.root.display()), "{node}");
    for m in spec["containerEdits"]["mounts"].as_array().unwrap() {
        assert!(m["hostPath"].as_str().unwrap().starts_with(&format!("{}/", f.root.display())), "{m}");
    }
    let v = actk(&["cdi", "validate", file.to_str().unwrap()]);
    assert!(v.status.success(), "{}", stderr(&v));
}

/// Issue 13 item 4: under `umask 077` the spec directories `actk cdi generate` creates are 0755
/// (and the spec 0644), so an engine reading them as another user (rootless podman) can.
#[test]
fn item4_spec_directories_are_0755_under_umask_077() {
    use std::os::unix::fs::PermissionsExt;
    let Some(f) = fixture::prepare("nvidia-dgx-h100").unwrap() else { return };
    let out = tempfile::tempdir().unwrap();
    let dir = out.path().join("run/cdi");
    let o = Command::new("sh")
        .arg("-c")
        .arg("umask 077 && exec \"$0\" cdi generate --ldcache-hook none --root \"$1\" --output \"$2\"")
        .arg(env!("CARGO_BIN_EXE_actk"))
        .arg(&f.root)
        .arg(&dir)
        .env("ACTK_LOG", "error")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&out.path().join("run")), 0o755, "parent created by actk");
    assert_eq!(mode(&dir), 0o755, "spec directory");
    assert_eq!(mode(&dir.join("nvidia.com-gpu.json")), 0o644, "spec file");
}

/// Issue 13 item 7: a generated spec serves every request of its kind, so the NVSwitch nodes
/// (capability `fabric`) are in it only when asked for; the graphics manifests are mounted.
#[test]
fn item7_generated_spec_has_nvswitch_nodes_only_when_fabric_is_asked_and_graphics_manifests() {
    let Some(f) = fixture::prepare("nvidia-dgx-h100").unwrap() else { return };
    let nodes_of = |args: &[&str]| -> (Vec<String>, Vec<String>) {
        let mut a = vec!["cdi", "generate", "--ldcache-hook", "none", "--root", f.root.to_str().unwrap()];
        a.extend(args);
        let o = actk(&a);
        assert!(o.status.success(), "{}", stderr(&o));
        let spec: Value = serde_json::from_str(&stdout(&o)).unwrap();
        let nodes = spec["containerEdits"]["deviceNodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["path"].as_str().unwrap().to_string())
            .collect();
        let mounts = spec["containerEdits"]["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["containerPath"].as_str().unwrap().to_string())
            .collect();
        (nodes, mounts)
    };
    let (nodes, mounts) = nodes_of(&[]);
    assert!(!nodes.iter().any(|n| n.contains("nvswitch")), "{nodes:?}");
    assert!(mounts.contains(&"/usr/share/vulkan/icd.d/nvidia_icd.json".to_string()), "{mounts:?}");
    assert!(mounts.contains(&"/usr/share/glvnd/egl_vendor.d/10_nvidia.json".to_string()), "{mounts:?}");
    let (nodes, _) = nodes_of(&["--capabilities", "utility,fabric"]);
    assert_eq!(nodes.iter().filter(|n| n.contains("nvswitch")).count(), 5, "{nodes:?}");
}

#[test]
fn mig_devices_get_cdi_entries_by_gpu_and_mig_index_by_gi_ci_and_by_uuid() {
    let Some(f) = fixture::prepare("nvidia-dgx-a100").unwrap() else { return };
    let state = actk_testsupport::nvml_double::State::of(&f.root).unwrap();
    let out = tempfile::tempdir().unwrap();
    let file = out.path().join("nvidia.json");
    let o =
        actk(&["cdi", "generate", "--root", &root_arg(&f), "--vendor", "nvidia", "--output", file.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let spec: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let device = |name: &str| -> Vec<String> {
        let d = spec["devices"].as_array().unwrap().iter().find(|d| d["name"] == name);
        let d = d.unwrap_or_else(|| panic!("no CDI device {name:?}"));
        d["containerEdits"]["deviceNodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["path"].as_str().unwrap().to_string())
            .collect()
    };
    // GPU 3's MIG device 1: compute instance 1 of GPU instance 2 (a 1c.3g.40gb).
    let m = state.migs(3)[1];
    let (gi, ci, uuid) = (m.num("gi"), m.num("ci"), m.get("uuid"));
    let caps = |file: &str| {
        let t = std::fs::read_to_string(f.path(&format!("proc/driver/nvidia/capabilities/gpu3/mig/{file}"))).unwrap();
        format!("/dev/nvidia-caps/nvidia-cap{}", t.lines().next().unwrap().split_whitespace().nth(1).unwrap())
    };
    let want =
        vec!["/dev/nvidia3".to_string(), caps(&format!("gi{gi}/access")), caps(&format!("gi{gi}/ci{ci}/access"))];
    assert_eq!(device("3:1"), want, "by GPU:MIG index");
    assert_eq!(device(&format!("3:{gi}:{ci}")), want, "by GPU:GI:CI");
    assert_eq!(device(uuid), want, "by MIG UUID");
    // The whole GPU stays requestable, and `all` holds every MIG device's capability nodes.
    assert_eq!(device("3"), ["/dev/nvidia3"]);
    let all = device("all");
    assert!(
        all.contains(&want[2]) && all.iter().filter(|p| p.starts_with("/dev/nvidia-caps/")).count() == 2 * 17 - 2,
        "{all:?}"
    );
    assert!(!all.contains(&"/dev/nvidia-caps/nvidia-cap1".to_string()), "MIG config is not part of all");
    assert_eq!(device("mig-config"), ["/dev/nvidia-caps/nvidia-cap1"]);
    let v = actk(&["cdi", "validate", file.to_str().unwrap()]);
    assert!(v.status.success(), "{}", stderr(&v));
}

/// What the OS package's actk-cdi-refresh.service runs (`generate --output DIR --prune`) and its
/// prerm (`clean`): a kind whose devices are all gone loses its spec file, a foreign file in the
/// directory (another name, or actk's name holding another kind) is never touched.
#[test]
fn prune_removes_the_spec_of_a_kind_that_is_gone_and_clean_removes_only_actks_specs() {
    let Some(dgx) = fixture::prepare("nvidia-dgx-h100").unwrap() else { return };
    let Some(empty) = fixture::prepare("empty").unwrap() else { return };
    let out = tempfile::tempdir().unwrap();
    let dir = out.path().join("cdi");
    let d = dir.to_str().unwrap();
    let o = actk(&["cdi", "generate", "--root", &root_arg(&dgx), "--output", d, "--prune"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let ours = dir.join("nvidia.com-gpu.json");
    assert!(ours.is_file());
    let foreign = dir.join("vendor.yaml");
    std::fs::write(&foreign, "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices: []\n").unwrap();
    // actk's file name for the Neuron kind, but another kind inside: not actk's to remove.
    let squatter = dir.join("aws.amazon.com-neuron.json");
    let other =
        r#"{"cdiVersion":"0.5.0","kind":"example.com/x","devices":[{"name":"0","containerEdits":{"env":["A=1"]}}]}"#;
    std::fs::write(&squatter, other).unwrap();

    // The driver is gone: no NVIDIA devices on the root any more.
    let o = actk(&["cdi", "generate", "--root", &root_arg(&empty), "--output", d, "--prune"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!ours.exists(), "the spec of a kind with no devices is still there");
    assert!(stdout(&o).contains(&format!("removed {}", ours.display())), "{}", stdout(&o));
    assert!(foreign.is_file() && squatter.is_file(), "prune removed a file that is not actk's");

    let o = actk(&["cdi", "generate", "--root", &root_arg(&empty), "--prune"]);
    assert!(!o.status.success() && stderr(&o).contains("--prune needs --output DIR"), "{}", stderr(&o));

    let o = actk(&["cdi", "generate", "--root", &root_arg(&dgx), "--output", d]);
    assert!(o.status.success() && ours.is_file(), "{}", stderr(&o));
    let o = actk(&["cdi", "clean", "--output", d]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!ours.exists(), "clean left actk's spec");
    assert!(foreign.is_file() && squatter.is_file(), "clean removed a file that is not actk's");
}
