//! `actk list` and `actk info` as a user runs them, over fixture host roots (prepared with
//! real device nodes; skipped with a message when not root).

use actk_testsupport::fixture;
use assert_cmd::Command;

fn actk() -> Command {
    let mut c = Command::cargo_bin("actk").unwrap();
    // Never pick up the machine's own profiles or root from the environment.
    c.env_remove("ACTK_ROOT").env_remove("ACTK_PROFILES_DIR").env("ACTK_PROFILES_DIR", "/nonexistent/actk-profiles.d");
    c
}

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8(out.stdout.clone()).unwrap()
}

#[test]
fn dgx_lists_eight_gpus_with_uuids_and_bus_ids_in_pci_order() {
    let Some(f) = fixture::prepare("nvidia-dgx-h100").unwrap() else { return };
    let out = actk().args(["list", "--root"]).arg(&f.root).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.stderr.is_empty(), "no warnings on a clean DGX: {}", String::from_utf8_lossy(&out.stderr));
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 8, "{text}");
    let mut buses = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        assert!(line.starts_with(&format!("nvidia.com/gpu {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-")), "{line}");
        let bus = line.split(" bus ").nth(1).and_then(|r| r.split_whitespace().next()).expect("bus id");
        let info = std::fs::read_to_string(f.path(&format!("/proc/driver/nvidia/gpus/{bus}/information"))).unwrap();
        let uuid = line.split("(UUID: ").nth(1).and_then(|r| r.split(')').next()).unwrap();
        assert!(info.contains(uuid), "{line}: UUID does not belong to bus {bus}");
        assert!(line.contains(" numa ") && line.contains(" nodes /dev/nvidia"), "{line}");
        buses.push(bus.to_string());
    }
    let mut sorted = buses.clone();
    sorted.sort();
    assert_eq!(buses, sorted);
}

#[test]
fn json_is_the_inventory() {
    let Some(f) = fixture::prepare("nvidia-dgx-h100").unwrap() else { return };
    let out = actk().args(["list", "--json", "--root"]).arg(&f.root).output().unwrap();
    assert!(out.status.success());
    let inv: actk_core::inventory::Inventory =
        serde_json::from_slice(&out.stdout).expect("JSON parses as an Inventory");
    assert_eq!(inv.device_count(), 8);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["vendors"][0]["kind"], "nvidia.com/gpu");
    assert_eq!(v["vendors"][0]["devices"][0]["nodes"][0]["path"], "/dev/nvidia0");
}

#[test]
fn hetero_lists_both_vendors() {
    let Some(f) = fixture::prepare("hetero-nvidia-neuron").unwrap() else { return };
    let out = actk().args(["list"]).env("ACTK_ROOT", &f.root).output().unwrap();
    assert!(out.status.success());
    let text = stdout(&out);
    assert_eq!(text.lines().filter(|l| l.starts_with("nvidia.com/gpu ")).count(), 2, "{text}");
    assert_eq!(text.lines().filter(|l| l.starts_with("aws.amazon.com/neuron ")).count(), 2, "{text}");
    assert!(
        text.contains("aws.amazon.com/neuron 1: Inferentia2 (UUID: ") && text.contains("cores 2 nodes /dev/neuron1"),
        "{text}"
    );
}

#[test]
fn empty_host_prints_nothing_and_exits_zero() {
    let Some(f) = fixture::prepare("empty").unwrap() else { return };
    let out = actk().args(["list", "--root"]).arg(&f.root).output().unwrap();
    assert!(out.status.success());
    assert!(out.stdout.is_empty(), "{}", stdout(&out));
    assert!(out.stderr.is_empty(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn malformed_profile_names_file_and_line() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("npu.toml");
    std::fs::write(
        &file,
        "name = \"npu\"\nkind = \"example.com/npu\"\n\n[devices]\nnode = \"/dev/npu{index}\"\nsysfs = [1, \n",
    )
    .unwrap();
    let out = actk().args(["list", "--root", "/nonexistent", "--profiles-dir"]).arg(tmp.path()).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("{}:6:", file.display())), "{err}");
}

#[test]
fn invented_vendor_by_profile_file_is_listed() {
    let Some(f) = fixture::prepare("empty").unwrap() else { return };
    let r = &f.root;
    std::fs::create_dir_all(r.join("sys/class/npu/npu0")).unwrap();
    std::fs::write(r.join("sys/class/npu/npu0/serial"), "NPU0001\n").unwrap();
    std::fs::write(r.join("sys/class/npu/npu0/numa_node"), "0\n").unwrap();
    let st = std::process::Command::new("mknod").arg(r.join("dev/npu0")).args(["c", "1", "5"]).status().unwrap();
    assert!(st.success());
    let profiles = tempfile::tempdir().unwrap();
    std::fs::write(
        profiles.path().join("npu.toml"),
        "name = \"npu\"\nkind = \"example.com/npu\"\n[devices]\nnode = \"/dev/npu{index}\"\nsysfs = \"/sys/class/npu/npu{index}\"\n[devices.attributes]\nuuid = \"serial\"\nnuma_node = \"numa_node\"\nmodel = \"model\"\n",
    )
    .unwrap();
    let out = actk().args(["list", "--root"]).arg(r).arg("--profiles-dir").arg(profiles.path()).output().unwrap();
    assert!(out.status.success());
    assert_eq!(stdout(&out), "example.com/npu 0: (unknown model) (UUID: NPU0001) numa 0 nodes /dev/npu0\n");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "actk: warning: {}: attribute model unreadable",
            r.join("sys/class/npu/npu0/model").display()
        )),
        "{err}"
    );
}

#[test]
fn info_shows_driver_kinds_and_what_a_request_injects() {
    let Some(f) = fixture::prepare("nvidia-dgx-h100").unwrap() else { return };
    let out = actk().args(["info", "--root"]).arg(&f.root).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = stdout(&out);
    for want in [
        "nvidia.com/gpu (profile nvidia)",
        "driver version: 580.95.05",
        "selected by: NVIDIA_VISIBLE_DEVICES",
        "/dev/nvidiactl (c 195:255)",
        "    compute:\n",
        "/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05 [library]",
        "/usr/bin/nvidia-smi [binary]",
        "nvidia.com/gpu=1 GPU-",
    ] {
        assert!(text.contains(want), "missing {want:?} in:\n{text}");
    }
}

/// Issue 13 item 8: output into a pipe whose reader is gone (`actk list | head -1`) ends the
/// command quietly, as `ls | head -1` does: exit 0 and nothing on stderr, for every command that
/// prints (the read end is closed before actk starts, so every write meets a broken pipe).
#[test]
fn item8_broken_pipe_ends_quietly_for_every_printing_command() {
    let Some(f) = fixture::prepare("nvidia-dgx-h100").unwrap() else { return };
    let root = f.root.to_string_lossy().into_owned();
    let cases: Vec<Vec<&str>> = vec![
        vec!["list", "--root", &root],
        vec!["list", "--json", "--root", &root],
        vec!["info", "--root", &root],
        vec!["cdi", "generate", "--ldcache-hook", "none", "--root", &root],
        vec!["config", "default"],
        vec!["--help"],
    ];
    for args in cases {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = std::process::Command::new(assert_cmd::cargo::cargo_bin("actk"))
            .args(&args)
            .env("ACTK_PROFILES_DIR", "/nonexistent/actk-profiles.d")
            .env_remove("ACTK_ROOT")
            .stdout(writer)
            .stderr(std::process::Stdio::piped())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success() && err.is_empty(), "actk {args:?} | (closed pipe): {}\n{err}", out.status);
    }
}

/// Issue 13 item 7: `actk system create-dev-char-symlinks` makes /dev/char/MAJOR:MINOR links
/// (relative, as udev does) for every accelerator character node, keeps existing ones, and a
/// second run makes none.
#[test]
fn item7_create_dev_char_symlinks_for_every_accelerator_node() {
    let Some(f) = fixture::prepare("nvidia-dgx-h100").unwrap() else { return };
    let run = |extra: &[&str]| {
        let out =
            actk().args(["system", "create-dev-char-symlinks", "--root"]).arg(&f.root).args(extra).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        stdout(&out)
    };
    let dry = run(&["--dry-run"]);
    assert!(!f.root.join("dev/char").exists(), "a dry run makes nothing");
    let made = run(&[]);
    assert_eq!(dry, made);
    // 8 GPUs, nvidiactl, modeset, uvm, uvm-tools, 5 NVSwitch nodes.
    assert_eq!(made.lines().count(), 17, "{made}");
    assert_eq!(std::fs::read_link(f.root.join("dev/char/195:0")).unwrap(), std::path::Path::new("../nvidia0"));
    assert_eq!(
        std::fs::read_link(f.root.join("dev/char/234:255")).unwrap(),
        std::path::Path::new("../nvidia-nvswitchctl")
    );
    assert!(f.root.join("dev/char/195:255").exists(), "the link resolves to the node");
    assert_eq!(run(&[]), "", "second run: nothing to do");
}
