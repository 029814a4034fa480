//! Counts that add up on the real cluster (issue 28): hardware under two resources is never
//! handed out twice (items 1), shared devices spread before they stack (item 9), and the answers
//! of two resources to one container compose (item 10). Busybox pods print what they were given.
//!
//! `#[ignore]`d like every cluster test: `make test-k8s` runs them alone, one at a time.

use actk_testsupport::cluster::{Cluster, PodSpec};
use actk_testsupport::fixture;
use anyhow::{Context, Result, ensure};
use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

const NEURON: &str = "aws.amazon.com/neuron";
const NEURONCORE: &str = "aws.amazon.com/neuroncore";
const NEURONDEVICE: &str = "aws.amazon.com/neurondevice";
const GPU: &str = "nvidia.com/gpu";

/// The cluster with the chart installed for `root` and `values`, `resource` = `count` allocatable.
fn ready(root: &Path, values: &str, resource: &str, count: i64) -> Result<Option<Cluster>> {
    let Some(c) = Cluster::start(&Default::default())? else { return Ok(None) };
    c.install(root, values)?;
    c.wait_allocatable(resource, count)?;
    Ok(Some(c))
}

/// A pod that prints its /dev and env, then sleeps.
fn sleeper(name: &str) -> PodSpec {
    PodSpec::new(name, "echo DEV $(ls /dev); env | sed 's/^/ENV /'; exec sleep 3600")
}

/// Creates `spec` and waits until it runs.
fn run(c: &Cluster, spec: &PodSpec) -> Result<()> {
    c.create_pod(spec)?;
    c.wait_pod_phase(&spec.name, &["Running"], Duration::from_secs(120))
        .map_err(|e| anyhow::anyhow!("{e}; plugin log:\n{}", c.plugin_logs()))?;
    Ok(())
}

/// Device nodes `<prefix>N` a running pod sees, as numbers.
fn numbered(c: &Cluster, pod: &str, prefix: &str) -> Result<Vec<u32>> {
    let out = c.exec(pod, &["ls", "/dev"])?;
    let mut n: Vec<u32> = out.split_whitespace().filter_map(|d| d.strip_prefix(prefix)?.parse().ok()).collect();
    n.sort_unstable();
    Ok(n)
}

/// Issue 28 item 1, on the inf2.48xlarge fixture: pods asking for `neuroncore: 2`, `neuron: 1`
/// and `neurondevice: 1` at once get three different Neuron devices (before, each got
/// /dev/neuron0), the node's allocatable of each resource drops by what the others hold, and a
/// deleted pod gives its device back to the others.
#[test]
#[ignore = "needs the test cluster: make test runs it alone"]
fn inf2_neuroncore_neuron_and_neurondevice_pods_never_share_a_device() -> Result<()> {
    let Some(inf2) = fixture::prepare("aws-inf2-48xlarge")? else { return Ok(()) };
    let Some(c) = ready(&inf2.root, "config:\n  strategies: [cdi-cri]\n", NEURON, 12)? else { return Ok(()) };
    c.wait_allocatable(NEURONCORE, 24)?;
    c.wait_allocatable(NEURONDEVICE, 12)?;
    run(&c, &sleeper("nc-cores").limit(NEURONCORE, 2))?;
    run(&c, &sleeper("nc-neuron").limit(NEURON, 1))?;
    run(&c, &sleeper("nc-device").limit(NEURONDEVICE, 1))?;
    let mut seen = BTreeSet::new();
    for pod in ["nc-cores", "nc-neuron", "nc-device"] {
        let devs = numbered(&c, pod, "neuron")?;
        ensure!(devs.len() == 1, "{pod} sees one Neuron device: {devs:?}");
        ensure!(seen.insert(devs[0]), "{pod} got /dev/neuron{} which another pod holds ({seen:?})", devs[0]);
    }
    // What one resource holds is gone from the others: 12 devices, 3 held, each resource
    // sees its own holder's device as allocated and the other two withdrawn.
    c.wait_allocatable_within(NEURON, 10, Duration::from_secs(30))?;
    c.wait_allocatable_within(NEURONDEVICE, 10, Duration::from_secs(30))?;
    c.wait_allocatable_within(NEURONCORE, 20, Duration::from_secs(30))?;
    // A pod asking for every free device of one resource still never overlaps.
    run(&c, &sleeper("nc-rest").limit(NEURON, 9))?;
    let rest = numbered(&c, "nc-rest", "neuron")?;
    ensure!(rest.len() == 9 && rest.iter().all(|d| !seen.contains(d)), "the other 9 devices: {rest:?} vs {seen:?}");
    c.delete_pod("nc-rest")?;
    // The neuroncore pod goes: its device is the others' again (within the plugin's reconcile).
    c.delete_pod("nc-cores")?;
    c.wait_allocatable_within(NEURON, 11, Duration::from_secs(30))?;
    c.wait_allocatable_within(NEURONDEVICE, 11, Duration::from_secs(30))?;
    for pod in ["nc-neuron", "nc-device"] {
        c.delete_pod(pod)?;
    }
    c.wait_allocatable_within(NEURONCORE, 24, Duration::from_secs(30))?;
    Ok(())
}

const TIME_SLICED_4: &str = "config:\n  strategies: [cdi-cri]\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 4\n";

/// Issue 28 item 9: with 4 replicas per GPU, a pod asking for 2 gets 2 GPUs while the node has
/// them, also when other pods already share some (the preferred allocation spreads before it
/// stacks); only when one GPU is left does a pod get one GPU for its replicas.
#[test]
#[ignore = "needs the test cluster: make test runs it alone"]
fn two_time_sliced_gpus_are_two_gpus_while_the_node_has_them() -> Result<()> {
    let Some(dgx) = fixture::prepare("nvidia-dgx-h100")? else { return Ok(()) };
    let Some(c) = ready(&dgx.root, TIME_SLICED_4, GPU, 32)? else { return Ok(()) };
    for i in 0..3 {
        let name = format!("ts-two-{i}");
        run(&c, &sleeper(&name).limit(GPU, 2))?;
        ensure!(numbered(&c, &name, "nvidia")?.len() == 2, "{name}: two GPUs");
    }
    for i in 0..3 {
        c.delete_pod(&format!("ts-two-{i}"))?;
    }
    // Two GPUs left, each with replicas held by one pod: a pod asking 2 still gets both.
    for g in 2..8 {
        std::fs::remove_file(dgx.path(&format!("/dev/nvidia{g}")))?;
    }
    c.wait_allocatable_within(GPU, 8, Duration::from_secs(30))?;
    run(&c, &sleeper("ts-one-a").limit(GPU, 1))?;
    run(&c, &sleeper("ts-one-b").limit(GPU, 1))?;
    let (a, b) = (numbered(&c, "ts-one-a", "nvidia")?, numbered(&c, "ts-one-b", "nvidia")?);
    ensure!(a != b, "spread before stacking: {a:?} {b:?}");
    run(&c, &sleeper("ts-two-more").limit(GPU, 2))?;
    ensure!(numbered(&c, "ts-two-more", "nvidia")? == [0, 1], "both GPUs, not one twice");
    for p in ["ts-one-a", "ts-one-b", "ts-two-more"] {
        c.delete_pod(p)?;
    }
    Ok(())
}

/// Issue 28 item 10 on the cluster (the DGX A100 fixture, MIG `mixed`, the envvar strategy
/// through RuntimeClass actk): a pod asking for `nvidia.com/mig-1g.10gb` and
/// `nvidia.com/mig-2g.20gb` gets both MIG devices, not the one whose NVIDIA_VISIBLE_DEVICES the
/// kubelet kept.
#[test]
#[ignore = "needs the test cluster: make test runs it alone"]
fn two_mig_profiles_with_envvar_give_both_mig_devices() -> Result<()> {
    use actk_testsupport::nvml_double::State;
    let Some(a100) = fixture::prepare("nvidia-dgx-a100")? else { return Ok(()) };
    let state = State::of(&a100.root)?;
    let values = "config:\n  strategies: [envvar]\n  migStrategy: mixed\nhostLibraries: true\n\
                  nodeSetup:\n  enabled: true\n  policy:\n    envRequests: always\n";
    let Some(c) = ready(&a100.root, values, "nvidia.com/mig-2g.20gb", 1)? else { return Ok(()) };
    c.wait_until("RuntimeClass actk", Duration::from_secs(60), || {
        Ok(c.kubectl(&["get", "runtimeclass", "actk"]).status.success().then_some(()))
    })?;
    let spec = sleeper("two-migs").limit("nvidia.com/mig-1g.10gb", 1).limit("nvidia.com/mig-2g.20gb", 1);
    run(&c, &spec.runtime_class("actk"))?;
    let env = c.exec("two-migs", &["env"])?;
    let own = |res: &str| {
        let var = format!(
            "NVIDIA_VISIBLE_DEVICES_ACTK_{}=",
            res.chars()
                .map(|x| if x.is_ascii_alphanumeric() { x.to_ascii_uppercase() } else { '_' })
                .collect::<String>()
        );
        env.lines().find_map(|l| l.strip_prefix(&var)).map(str::to_string)
    };
    let uuids: Vec<String> = ["nvidia.com/mig-1g.10gb", "nvidia.com/mig-2g.20gb"]
        .iter()
        .map(|r| own(r).with_context(|| format!("the answer for {r} in the container's env:\n{env}")))
        .collect::<Result<_>>()?;
    let mut want = BTreeSet::new();
    for u in &uuids {
        let (gpu, m) = state
            .gpus()
            .into_iter()
            .find_map(|g| {
                state.migs(g.num("index")).into_iter().find(|m| m.get("uuid") == u).map(|m| (g.num("index"), m))
            })
            .with_context(|| format!("{u} is a MIG device of the double"))?;
        for file in [format!("gi{}/access", m.num("gi")), format!("gi{}/ci{}/access", m.num("gi"), m.num("ci"))] {
            let p = a100.path(&format!("proc/driver/nvidia/capabilities/gpu{gpu}/mig/{file}"));
            let t = std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
            want.insert(format!(
                "nvidia-cap{}",
                t.lines().next().and_then(|l| l.split_whitespace().nth(1)).unwrap_or("")
            ));
        }
    }
    let caps: BTreeSet<String> =
        c.exec("two-migs", &["ls", "/dev/nvidia-caps"])?.split_whitespace().map(String::from).collect();
    ensure!(caps == want, "both MIG devices' caps nodes: {caps:?}, want {want:?}");
    c.delete_pod("two-migs")?;
    Ok(())
}

/// ROCm's resources on the MI300X nodes: `amd.com/gpu: 2` gets two GPUs' render nodes and
/// /dev/kfd; on the CPX node with ROCm's mixed naming, `amd.com/cpx_nps4: 1` gets one
/// partition's render node, and partitions of two pods never coincide.
#[test]
#[ignore = "needs the test cluster: make test runs it alone"]
fn rocm_pods_get_gpus_and_partitions() -> Result<()> {
    let Some(mi300x) = fixture::prepare("amd-mi300x")? else { return Ok(()) };
    let Some(c) = ready(&mi300x.root, "config:\n  strategies: [cdi-cri]\n", "amd.com/gpu", 8)? else { return Ok(()) };
    run(&c, &sleeper("rocm-two").limit("amd.com/gpu", 2))?;
    let dri = c.exec("rocm-two", &["ls", "/dev/dri"])?;
    let render: Vec<&str> = dri.split_whitespace().filter(|d| d.starts_with("renderD")).collect();
    ensure!(render.len() == 2, "two render nodes: {dri}");
    ensure!(c.exec("rocm-two", &["ls", "/dev"])?.split_whitespace().any(|d| d == "kfd"), "/dev/kfd");
    c.delete_pod("rocm-two")?;
    let Some(cpx) = fixture::prepare("amd-mi300x-cpx")? else { return Ok(()) };
    c.install(&cpx.root, "config:\n  strategies: [cdi-cri]\nextraArgs: [--resource-naming-strategy=mixed]\n")?;
    c.wait_allocatable("amd.com/cpx_nps4", 64)?;
    let mut seen = BTreeSet::new();
    for p in ["rocm-part-a", "rocm-part-b"] {
        run(&c, &sleeper(p).limit("amd.com/cpx_nps4", 1))?;
        let dri = c.exec(p, &["ls", "/dev/dri"])?;
        let render: Vec<String> =
            dri.split_whitespace().filter(|d| d.starts_with("renderD")).map(String::from).collect();
        ensure!(render.len() == 1, "{p}: one partition's render node: {dri}");
        ensure!(seen.insert(render[0].clone()), "{p}: {render:?} is another pod's");
    }
    for p in ["rocm-part-a", "rocm-part-b"] {
        c.delete_pod(p)?;
    }
    Ok(())
}
