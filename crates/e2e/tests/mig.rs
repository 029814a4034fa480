//! MIG devices through actk-runtime and actk-hook with the real runc, on the DGX A100 fixture
//! (MIG in mixed layouts on GPUs 0-3; its NVML test double answers with the MIG devices of
//! fixtures/nvidia-dgx-a100/nvml.tsv). What a container that asks for one MIG device must see:
//! its parent GPU's node, the GPU-instance and compute-instance capability nodes, the control
//! nodes, and no other GPU or capability node — whether the request is `MIG-<uuid>`, `GPU:MIG`
//! or `GPU:GI:CI`, served from discovery (NVML loaded for this request) or from a CDI spec.

use actk_testsupport::engines::{
    self, ActkConfig, Bundle, actk, actk_runtime, expect_success, require_root, text, unique_name,
};
use actk_testsupport::fixture::{self, Fixture};
use actk_testsupport::nvml_double::State;
use serde_json::json;
use std::collections::BTreeSet;
use std::path::Path;

/// Every character device under /dev/nvidia* and /dev/nvidia-caps as `name major minor` (hex).
const LIST: &str =
    "for f in /dev/nvidia* /dev/nvidia-caps/*; do [ -c \"$f\" ] && stat -c '%n %t %T' \"$f\"; done; true";

struct Node {
    fx: Fixture,
    state: State,
}

fn setup() -> Option<Node> {
    if !require_root() {
        return None;
    }
    let fx = fixture::prepare("nvidia-dgx-a100").expect("prepare")?;
    let state = State::of(&fx.root).expect("state");
    Some(Node { fx, state })
}

impl Node {
    /// `/dev/nvidia-caps/nvidia-capN major minor` of a capability access file of GPU `gpu`.
    fn cap(&self, gpu: u64, file: &str) -> String {
        let p = self.fx.path(&format!("proc/driver/nvidia/capabilities/gpu{gpu}/mig/{file}"));
        let text = std::fs::read_to_string(&p).unwrap();
        let minor: u32 = text.lines().next().unwrap().split_whitespace().nth(1).unwrap().parse().unwrap();
        format!("/dev/nvidia-caps/nvidia-cap{minor} ec {minor:x}")
    }

    /// What a container asking for MIG device `mig` of GPU `gpu` must see, by path.
    fn expected(&self, gpu: u64, mig: u64) -> BTreeSet<String> {
        let m = self.state.migs(gpu)[mig as usize];
        let (gi, ci) = (m.num("gi"), m.num("ci"));
        let mut want: BTreeSet<String> = [
            format!("/dev/nvidia{gpu} c3 {gpu:x}"),
            self.cap(gpu, &format!("gi{gi}/access")),
            self.cap(gpu, &format!("gi{gi}/ci{ci}/access")),
        ]
        .into();
        // Control nodes every CUDA program opens (nvidia-uvm's major is 508 = 0x1fc here).
        want.extend(
            [
                "/dev/nvidiactl c3 ff",
                "/dev/nvidia-uvm 1fc 0",
                "/dev/nvidia-uvm-tools 1fc 1",
                "/dev/nvidia-modeset c3 fe",
            ]
            .map(String::from),
        );
        want
    }
}

fn seen(out: &str) -> BTreeSet<String> {
    out.lines().map(str::trim).filter(|l| l.starts_with("/dev/")).map(String::from).collect()
}

fn run_runtime(cfg: &Path, env: &[&str]) -> std::process::Output {
    let bundle = Bundle::busybox(&["sh", "-c", LIST], env).expect("bundle");
    let id = unique_name("e2e-mig");
    actk_runtime(cfg, &["run", "--bundle", bundle.path().to_str().unwrap(), id.as_str()])
}

#[test]
fn one_mig_device_by_uuid_index_or_gi_ci_gives_its_parent_and_caps_nodes_only() {
    let Some(n) = setup() else { return };
    let config = ActkConfig::new(&n.fx.root).unwrap();
    let cfg = config.write().unwrap();
    // GPU 3's MIG device 1: compute instance 1 of the split 3g.40gb (a 1c.3g.40gb).
    let m = n.state.migs(3)[1];
    let uuid = m.get("uuid").to_string();
    let gi_ci = format!("3:{}:{}", m.num("gi"), m.num("ci"));
    let want = n.expected(3, 1);
    for value in [uuid.as_str(), "3:1", gi_ci.as_str()] {
        let env = format!("NVIDIA_VISIBLE_DEVICES={value}");
        let out = expect_success(&format!("actk-runtime run ({env})"), &run_runtime(&cfg, &[&env]));
        assert_eq!(seen(&out), want, "{env}:\n{out}");
    }
    // A GPU and a MIG device of another GPU together.
    let out = expect_success("GPU 5 + MIG 0:2", &run_runtime(&cfg, &["NVIDIA_VISIBLE_DEVICES=5,0:2"]));
    let got = seen(&out);
    let mut want = n.expected(0, 2);
    want.insert("/dev/nvidia5 c3 5".into());
    assert_eq!(got, want, "{out}");
}

#[test]
fn mig_devices_from_a_generated_cdi_spec_are_the_same() {
    let Some(n) = setup() else { return };
    let config = ActkConfig::new(&n.fx.root).unwrap();
    let cfg = config.write().unwrap();
    let o =
        actk(Some(&cfg), &["cdi", "generate", "--vendor", "nvidia", "--output", config.spec_dir().to_str().unwrap()]);
    expect_success("actk cdi generate", &o);
    let uuid = n.state.migs(1)[4].get("uuid").to_string();
    for value in [format!("NVIDIA_VISIBLE_DEVICES={uuid}"), "NVIDIA_VISIBLE_DEVICES=1:4".into()] {
        let o = run_runtime(&cfg, &[&value]);
        let out = expect_success(&value, &o);
        let want: BTreeSet<String> = n.expected(1, 4).into_iter().filter(|l| !l.contains("modeset")).collect();
        // The spec's shared edits carry every control node the driver made (modeset included).
        let got: BTreeSet<String> = seen(&out).into_iter().filter(|l| !l.contains("modeset")).collect();
        assert_eq!(got, want, "{value}:\n{out}");
    }
}

#[test]
fn the_hook_injects_the_same_mig_device() {
    let Some(n) = setup() else { return };
    let config = ActkConfig::new(&n.fx.root).unwrap();
    let cfg = config.write().unwrap();
    let uuid = n.state.migs(0)[0].get("uuid").to_string();
    let b = Bundle::busybox(&["sh", "-c", LIST], &[&format!("NVIDIA_VISIBLE_DEVICES={uuid}")]).unwrap();
    let hook = engines::bin("actk-hook");
    b.edit(|c| {
        c["hooks"] = json!({"prestart": [{"path": hook.to_string_lossy(), "args": ["actk-hook", "prestart"], "env": [format!("ACTK_CONFIG={}", cfg.display())]}]});
    })
    .unwrap();
    let o = engines::runc(&["run", "--bundle", b.path().to_str().unwrap(), unique_name("e2e-mig-hook").as_str()]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}\n{err}");
    assert_eq!(seen(&out), n.expected(0, 0), "{out}\n{err}");
}

#[test]
fn bad_mig_requests_stop_the_container_naming_the_value_and_what_exists() {
    let Some(n) = setup() else { return };
    let config = ActkConfig::new(&n.fx.root).unwrap();
    let cfg = config.write().unwrap();
    for (value, needle) in [
        (
            "MIG-00000000-dead-5eef-8000-000000000000",
            "no MIG device has the id \"MIG-00000000-dead-5eef-8000-000000000000\"; MIG devices on this node: 0:0-3, 1:0-6, 2:0-1, 3:0-3",
        ),
        ("5:0", "GPU 5 (NVIDIA A100-SXM4-80GB) has MIG disabled; MIG devices on this node: 0:0-3"),
        ("2:7", "GPU 2 has no such MIG device; it has 2:0 (3g.40gb, GI 1 CI 0), 2:1 (3g.40gb, GI 2 CI 0)"),
    ] {
        let o = run_runtime(&cfg, &[&format!("NVIDIA_VISIBLE_DEVICES={value}")]);
        let (_, err) = text(&o);
        assert!(!o.status.success(), "{value} must fail");
        assert!(err.contains(&format!("NVIDIA_VISIBLE_DEVICES={value}: ")) && err.contains(needle), "{value}: {err}");
    }
}

#[test]
fn mig_config_capability_only_for_privileged_containers() {
    let Some(n) = setup() else { return };
    let config = ActkConfig::new(&n.fx.root).unwrap();
    let cfg = config.write().unwrap();
    let o = run_runtime(&cfg, &["NVIDIA_MIG_CONFIG_DEVICES=all"]);
    let (_, err) = text(&o);
    assert!(
        !o.status.success()
            && err.contains(
                "NVIDIA_MIG_CONFIG_DEVICES=all: the MIG config capability is given to privileged containers only"
            ),
        "{err}"
    );
    let b = Bundle::busybox(&["sh", "-c", LIST], &["NVIDIA_MIG_CONFIG_DEVICES=all", "NVIDIA_VISIBLE_DEVICES=void"])
        .unwrap();
    b.edit(|c| {
        let caps = &mut c["process"]["capabilities"];
        for set in ["bounding", "effective", "permitted"] {
            caps[set].as_array_mut().unwrap().push(json!("CAP_SYS_ADMIN"));
        }
    })
    .unwrap();
    let o = actk_runtime(&cfg, &["run", "--bundle", b.path().to_str().unwrap(), unique_name("e2e-migcfg").as_str()]);
    let out = expect_success("privileged NVIDIA_MIG_CONFIG_DEVICES=all", &o);
    assert_eq!(seen(&out), BTreeSet::from(["/dev/nvidia-caps/nvidia-cap1 ec 1".to_string()]), "{out}");
    let _ = n;
}

/// Issue 28 item 10: the device plugin's envvar answers for two MIG resources of one container
/// (NVIDIA_VISIBLE_DEVICES, of which the kubelet kept one, and each resource's own variable)
/// give the container both MIG devices; under a policy that does not trust env requests, an
/// unprivileged container's per-resource variable is refused like NVIDIA_VISIBLE_DEVICES
/// itself (a hostile image cannot use it to reach a GPU).
#[test]
fn per_resource_answers_compose_and_obey_the_trust_policy() {
    let Some(n) = setup() else { return };
    let config = ActkConfig::new(&n.fx.root).unwrap();
    let cfg = config.write().unwrap();
    let (small, big) = (n.state.migs(1)[4], n.state.migs(0)[1]);
    let env = [
        format!("NVIDIA_VISIBLE_DEVICES={}", big.get("uuid")),
        format!("NVIDIA_VISIBLE_DEVICES_ACTK_NVIDIA_COM_MIG_1G_10GB={}", small.get("uuid")),
        format!("NVIDIA_VISIBLE_DEVICES_ACTK_NVIDIA_COM_MIG_2G_20GB={}", big.get("uuid")),
    ];
    let env: Vec<&str> = env.iter().map(String::as_str).collect();
    let out = expect_success("two MIG answers", &run_runtime(&cfg, &env));
    let mut want = n.expected(1, 4);
    want.extend(n.expected(0, 1));
    assert_eq!(seen(&out), want, "{out}");

    let mut strict = ActkConfig::new(&n.fx.root).unwrap();
    strict.extra = "[policy]\nenv_requests = \"privileged\"\non_refused = \"fail\"\n".into();
    let cfg = strict.write().unwrap();
    let o = run_runtime(&cfg, &["NVIDIA_VISIBLE_DEVICES_ACTK_NVIDIA_COM_GPU=all"]);
    let (_, err) = text(&o);
    assert!(!o.status.success() && err.contains("env_requests"), "refused naming the policy key: {err}");
}
