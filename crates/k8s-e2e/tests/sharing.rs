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
const SHARED: &str = "nvidia.com/gpu.shared";

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

/// Issue 28 item 1, MIG-mixed and whole GPUs, on the DGX A100 fixture (GPUs 0-3 in MIG mode
/// with 17 MIG devices of five profiles, GPUs 4-7 whole) with `migStrategy: mixed`: a GPU in MIG
/// mode is never advertised whole (NVIDIA's mixed strategy; the ledger of held units keeps that
/// across a mode change under a running pod, unit-tested in actk-device-plugin's `held`), so
/// `nvidia.com/gpu` counts 4. Pods holding every whole GPU and every MIG device of each profile
/// at once never see the same physical GPU: the whole-GPU pod sees /dev/nvidia4-7, each MIG pod
/// its MIG devices' caps and only their parent GPUs' /dev/nvidiaN, all among 0-3.
#[test]
#[ignore = "needs the test cluster: make test runs it alone"]
fn mig_mixed_devices_and_whole_gpus_never_share_a_gpu() -> Result<()> {
    use actk_testsupport::nvml_double::State;
    let Some(a100) = fixture::prepare("nvidia-dgx-a100")? else { return Ok(()) };
    let state = State::of(&a100.root)?;
    let values = "config:\n  strategies: [cdi-cri]\n  migStrategy: mixed\n";
    let Some(c) = ready(&a100.root, values, GPU, 4)? else { return Ok(()) };
    // Which GPU each MIG caps node belongs to (the driver's capability files, as nvidia-smi
    // creates the nodes), and how many MIG devices each profile has.
    let mut cap_gpu = std::collections::BTreeMap::new();
    let mut profiles = std::collections::BTreeMap::<String, u32>::new();
    for g in state.gpus() {
        let gpu = g.num("index");
        for m in state.migs(gpu) {
            *profiles.entry(m.get("profile").replace('+', ".")).or_default() += 1;
            for file in [format!("gi{}/access", m.num("gi")), format!("gi{}/ci{}/access", m.num("gi"), m.num("ci"))] {
                let p = a100.path(&format!("proc/driver/nvidia/capabilities/gpu{gpu}/mig/{file}"));
                let t = std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
                let minor = t.lines().next().and_then(|l| l.split_whitespace().nth(1)).unwrap_or("").to_string();
                cap_gpu.insert(format!("nvidia-cap{minor}"), gpu as u32);
            }
        }
    }
    ensure!(profiles.values().sum::<u32>() == 17, "the fixture's 17 MIG devices: {profiles:?}");
    for (p, n) in &profiles {
        c.wait_allocatable(&format!("nvidia.com/mig-{p}"), i64::from(*n))?;
    }
    let whole: Vec<u32> = (4..8).collect();
    run(&c, &sleeper("mixed-whole").limit(GPU, 4))?;
    ensure!(numbered(&c, "mixed-whole", "nvidia")? == whole, "the 4 GPUs outside MIG mode, whole");
    let mut pods = Vec::new();
    for (p, n) in &profiles {
        let pod = format!("mixed-{}", p.replace('.', "-"));
        run(&c, &sleeper(&pod).limit(&format!("nvidia.com/mig-{p}"), *n))?;
        let gpus = numbered(&c, &pod, "nvidia")?;
        let caps: Vec<String> =
            c.exec(&pod, &["ls", "/dev/nvidia-caps"])?.split_whitespace().map(String::from).collect();
        let parents: BTreeSet<u32> = caps
            .iter()
            .map(|cap| cap_gpu.get(cap).copied().with_context(|| format!("{pod}: {cap} is no MIG device's cap")))
            .collect::<Result<_>>()?;
        ensure!(!caps.is_empty(), "{pod}: its MIG devices' caps");
        ensure!(
            gpus.iter().copied().collect::<BTreeSet<u32>>() == parents,
            "{pod} sees exactly its MIG devices' parent GPUs: /dev/nvidia{gpus:?}, caps {caps:?} of GPUs {parents:?}"
        );
        ensure!(gpus.iter().all(|g| *g < 4 && !whole.contains(g)), "{pod}: a GPU held whole by mixed-whole: {gpus:?}");
        pods.push(pod);
    }
    // Every unit of every resource is held: nothing of the node is left to hand out twice.
    c.wait_allocatable_within(GPU, 4, Duration::from_secs(30))?;
    pods.push("mixed-whole".into());
    for p in pods {
        c.delete_pod(&p)?;
    }
    Ok(())
}

/// Issue 28 item 1, time-sliced replicas and whole devices, on the DGX H100 fixture with
/// NVIDIA's `devices` list: GPUs 0 and 1 shared as `nvidia.com/gpu.shared` (4 replicas each),
/// the others whole as `nvidia.com/gpu`. A device is served under one of the two, never both
/// (the shared entry takes its devices out of the whole resource), so the counts are 8 and 6,
/// and pods holding every replica and every whole GPU at once see disjoint GPUs: the replicas'
/// pods /dev/nvidia0-1 only, the whole-GPU pod /dev/nvidia2-7.
#[test]
#[ignore = "needs the test cluster: make test runs it alone"]
fn time_sliced_replicas_and_whole_gpus_never_share_a_gpu() -> Result<()> {
    let Some(dgx) = fixture::prepare("nvidia-dgx-h100")? else { return Ok(()) };
    let values = "config:\n  strategies: [cdi-cri]\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 4\n        rename: nvidia.com/gpu.shared\n        devices: [0, 1]\n";
    let Some(c) = ready(&dgx.root, values, GPU, 6)? else { return Ok(()) };
    c.wait_allocatable(SHARED, 8)?;
    run(&c, &sleeper("ts-whole").limit(GPU, 6))?;
    run(&c, &sleeper("ts-shared-a").limit(SHARED, 2))?;
    run(&c, &sleeper("ts-shared-b").limit(SHARED, 6))?;
    let whole = numbered(&c, "ts-whole", "nvidia")?;
    ensure!(whole == [2, 3, 4, 5, 6, 7], "the 6 unshared GPUs, whole: {whole:?}");
    let a = numbered(&c, "ts-shared-a", "nvidia")?;
    ensure!(a == [0, 1], "2 replicas: 2 GPUs, spread: {a:?}");
    let b = numbered(&c, "ts-shared-b", "nvidia")?;
    ensure!(!b.is_empty() && b.iter().all(|g| *g < 2), "the other 6 replicas, of GPUs 0-1 only: {b:?}");
    for p in ["ts-whole", "ts-shared-a", "ts-shared-b"] {
        c.delete_pod(p)?;
    }
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
    // The health watch turns GPUs 2-7 Unhealthy within a second; the plugin's rediscovery (every
    // 5 s) then serves the node again and re-registers, and the kubelet closes its connection
    // to the old endpoint, failing an Allocate still in flight there (UnexpectedAdmissionError,
    // as with any device plugin that re-registers). The pods below start after that.
    let reserved = || -> Result<usize> {
        let sel = format!("app.kubernetes.io/instance={}", actk_testsupport::cluster::RELEASE);
        let o = c.kubectl(&[
            "logs",
            "-n",
            actk_testsupport::cluster::NAMESPACE,
            "-l",
            &sel,
            "-c",
            "actk-device-plugin",
            "--tail=-1",
        ]);
        Ok(String::from_utf8_lossy(&o.stdout).matches("changed; serving them again").count())
    };
    let before = reserved()?;
    for g in 2..8 {
        std::fs::remove_file(dgx.path(&format!("/dev/nvidia{g}")))?;
    }
    c.wait_until("the plugin serving the node's devices again", Duration::from_secs(30), || {
        Ok((reserved()? > before).then_some(()))
    })?;
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
