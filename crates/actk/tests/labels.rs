//! `actk node labels` on the fixture roots (issue 30): the labels an admin's nodeSelectors use
//! (GFD's `nvidia.com/gpu.product`, `nvidia.com/gpu.count`, AMD's labeller's names, actk's own
//! under `actk.dev/`), written to a node-feature-discovery feature file and kept current: a GPU
//! removed from the node is gone from the count on the next discovery.

use actk_testsupport::fixture;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn labels_of(text: &str) -> BTreeMap<String, String> {
    text.lines().filter_map(|l| l.split_once('=')).map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn run(root: &Path, extra: &[&str]) -> BTreeMap<String, String> {
    let out = Command::new(env!("CARGO_BIN_EXE_actk"))
        .args(["node", "labels", "--root"])
        .arg(root)
        .args(extra)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    labels_of(&String::from_utf8(out.stdout).unwrap())
}

struct Killed(Child);
impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn dgx_h100_gets_gfd_labels_that_existing_node_selectors_match_and_they_follow_a_removed_gpu() {
    let Some(fx) = fixture::prepare("nvidia-dgx-h100").unwrap() else { return };
    let l = run(&fx.root, &[]);
    for (k, v) in [
        ("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3"),
        ("nvidia.com/gpu.count", "8"),
        ("nvidia.com/gpu.memory", "81559"),
        ("nvidia.com/gpu.family", "hopper"),
        ("nvidia.com/gpu.compute.major", "9"),
        ("nvidia.com/gpu.compute.minor", "0"),
        ("nvidia.com/cuda.driver-version.full", "580.95.05"),
        ("nvidia.com/cuda.runtime-version.major", "13"),
        ("nvidia.com/mig.capable", "true"),
        ("nvidia.com/mig.strategy", "none"),
        ("nvidia.com/gpu.replicas", "1"),
        ("nvidia.com/gpu.sharing-strategy", "none"),
        ("actk.dev/nvidia.count", "8"),
        ("actk.dev/nvidia.numa-nodes", "2"),
        ("actk.dev/nvidia.sharing", "none"),
    ] {
        assert_eq!(l.get(k).map(String::as_str), Some(v), "{k} in {l:#?}");
    }
    // Every value is a valid Kubernetes label value.
    for v in l.values() {
        assert!(v.len() <= 63 && v.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c)), "{v}");
    }
    // Time-slicing and the MIG strategy come from the configuration.
    let shared = run(&fx.root, &["--replicas", "nvidia.com/gpu=4", "--mig-strategy", "mixed"]);
    assert_eq!(shared["nvidia.com/gpu.replicas"], "4");
    assert_eq!(shared["nvidia.com/gpu.sharing-strategy"], "time-slicing");
    assert_eq!(shared["nvidia.com/mig.strategy"], "mixed");

    // Kept current in NFD's feature file: GPU 7's device node disappears, the count follows.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("features.d/actk");
    let _w = Killed(
        Command::new(env!("CARGO_BIN_EXE_actk"))
            .args(["node", "labels", "--watch", "1", "--root"])
            .arg(&fx.root)
            .arg("--output")
            .arg(&file)
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let count = || labels_of(&std::fs::read_to_string(&file).unwrap_or_default()).get("nvidia.com/gpu.count").cloned();
    wait_for("the feature file", || count().as_deref() == Some("8"));
    std::fs::remove_file(fx.path("dev/nvidia7")).unwrap();
    wait_for("the count without GPU 7", || count().as_deref() == Some("7"));
}

#[test]
fn mi300x_gets_amd_labeller_names_with_partition_modes() {
    let Some(fx) = fixture::prepare("amd-mi300x").unwrap() else { return };
    let l = run(&fx.root, &[]);
    assert_eq!(l["amd.com/gpu.product-name"], "AMD-Instinct-MI300X-OAM", "{l:#?}");
    assert_eq!(l["amd.com/gpu.compute-partitioning-mode"], "spx");
    assert_eq!(l["amd.com/gpu.memory-partitioning-mode"], "nps1");
    assert_eq!(l["actk.dev/amd.count"], "8");
    assert!(!l.keys().any(|k| k.starts_with("nvidia.com/")), "{l:#?}");
}

#[test]
fn bad_options_are_refused_naming_the_fix() {
    let out = Command::new(env!("CARGO_BIN_EXE_actk"))
        .args(["node", "labels", "--root", "/", "--mig-strategy", "some"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("expected none, single or mixed"));
    let out = Command::new(env!("CARGO_BIN_EXE_actk"))
        .args(["node", "labels", "--root", "/", "--replicas", "nvidia.com/gpu=x"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("KIND=N")
            || String::from_utf8_lossy(&out.stderr).contains("not a number")
    );
}

fn wait_for(what: &str, ok: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}
