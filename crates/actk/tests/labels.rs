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

/// The chart's labeller reads the device plugin's config (`--plugin-config`) and labels the
/// named config the plugin serves: time-slicing under the plain name marks the product
/// `-SHARED` as GFD does (so a nodeSelector on the plain product avoids shares), renamed shares
/// keep it, the config's MIG strategy replaces --mig-strategy, and a name that does not load
/// keeps the last good labels (here, with nothing loaded yet, --mig-strategy's).
#[test]
fn plugin_config_named_config_gives_the_sharing_labels() {
    let Some(fx) = fixture::prepare("nvidia-dgx-h100").unwrap() else { return };
    let dir = tempfile::tempdir().unwrap();
    let cm = dir.path().join("nvidia");
    std::fs::create_dir_all(&cm).unwrap();
    std::fs::write(cm.join("default"), "version: v1\nflags:\n  migStrategy: single\n").unwrap();
    let ts = |rename: bool| {
        format!(
            "version: v1\nsharing:\n  timeSlicing:\n    renameByDefault: {rename}\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n"
        )
    };
    std::fs::write(cm.join("ts4"), ts(false)).unwrap();
    std::fs::write(cm.join("ts4-renamed"), ts(true)).unwrap();
    let toml = dir.path().join("device-plugin.toml");
    std::fs::write(&toml, format!("nvidia_config = {:?}\n", cm.display().to_string())).unwrap();
    let pc = toml.to_str().unwrap();

    let d = run(&fx.root, &["--plugin-config", pc]);
    assert_eq!(d["actk.dev/config.applied"], "default");
    assert_eq!(d["nvidia.com/mig.strategy"], "single");
    assert_eq!(d["nvidia.com/gpu.sharing-strategy"], "none");
    assert_eq!(d["nvidia.com/gpu.product"], "NVIDIA-H100-80GB-HBM3");

    let t = run(&fx.root, &["--plugin-config", pc, "--config-name", "ts4"]);
    for (k, v) in [
        ("actk.dev/config.applied", "ts4"),
        ("nvidia.com/mig.strategy", "none"),
        ("nvidia.com/gpu.replicas", "4"),
        ("nvidia.com/gpu.sharing-strategy", "time-slicing"),
        ("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3-SHARED"),
        ("actk.dev/nvidia.sharing", "time-slicing"),
        ("actk.dev/nvidia.replicas", "4"),
        ("actk.dev/nvidia.product", "NVIDIA-H100-80GB-HBM3"),
    ] {
        assert_eq!(t.get(k).map(String::as_str), Some(v), "{k} in {t:#?}");
    }
    let r = run(&fx.root, &["--plugin-config", pc, "--config-name", "ts4-renamed"]);
    assert_eq!(
        (r["nvidia.com/gpu.product"].as_str(), r["nvidia.com/gpu.replicas"].as_str()),
        ("NVIDIA-H100-80GB-HBM3", "4")
    );

    let out = Command::new(env!("CARGO_BIN_EXE_actk"))
        .args(["node", "labels", "--root"])
        .arg(&fx.root)
        .args(["--plugin-config", pc, "--config-name", "gone", "--mig-strategy", "mixed"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("a config named \"gone\"") && err.contains("last good config"), "{err}");
    let g = labels_of(&String::from_utf8(out.stdout).unwrap());
    assert_eq!(g["nvidia.com/mig.strategy"], "mixed");
    assert!(!g.contains_key("actk.dev/config.applied"), "{g:#?}");
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
