//! The DRA driver (actk-dra-driver, driver `actk.dev`, resource.k8s.io/v1) on the real
//! single-node cluster (issue 11): the chart with `dra.enabled=true` for the nvidia profile on a
//! node laid out as the DGX H100 fixture. The driver publishes the node's ResourceSlices, the
//! scheduler allocates a claim for one `actk-nvidia` device, the kubelet calls
//! NodePrepareResources, and the pod's container sees exactly the allocated GPU (plus the
//! control nodes) through the claim's transient CDI spec, which is gone once the pod is.
//!
//! `#[ignore]`d like every cluster test: `make test-k8s` runs them alone, one at a time.

use actk_testsupport::cluster::{Cluster, TEST_NAMESPACE};
use actk_testsupport::fixture;
use anyhow::{Context, Result, ensure};
use serde_json::{Value, json};
use std::path::Path;
use std::time::Duration;

/// The DRA driver alone (no device plugin, which would serve nothing), nvidia only.
const VALUES: &str = "devicePlugin:\n  enabled: false\ndra:\n  enabled: true\n  profiles: [nvidia]\n";

/// Devices of `actk.dev` in the node's newest complete pool generation.
fn published(c: &Cluster) -> Result<Vec<Value>> {
    c.published_devices("actk.dev")
}

/// `ls /dev` entries of the NVIDIA driver: GPU nodes (`nvidiaN`) as numbers, the rest as names.
fn nvidia_nodes(dev: &str) -> (Vec<u32>, Vec<String>) {
    let mut gpus = vec![];
    let mut other = vec![];
    for d in dev.split_whitespace().filter(|d| d.starts_with("nvidia")) {
        match d.strip_prefix("nvidia").and_then(|n| n.parse().ok()) {
            Some(n) => gpus.push(n),
            None => other.push(d.to_string()),
        }
    }
    gpus.sort_unstable();
    other.sort();
    (gpus, other)
}

#[test]
#[ignore = "needs the test cluster: make test runs it alone"]
fn dra_claim_for_one_gpu_gets_exactly_it_and_its_spec_goes_with_the_pod() -> Result<()> {
    let Some(dgx) = fixture::prepare("nvidia-dgx-h100")? else { return Ok(()) };
    let Some(c) = Cluster::start(&Default::default())? else { return Ok(()) };
    c.install(&dgx.root, VALUES)?;

    // The pool: the fixture's eight GPUs, each with its kind and index.
    let devices = c
        .wait_until("the node's ResourceSlices of actk.dev with 8 GPUs", Duration::from_secs(120), || {
            let d = published(&c)?;
            Ok((d.len() == 8).then_some(d))
        })
        .map_err(|e| anyhow::anyhow!("{e}; driver log:\n{}", c.plugin_logs()))?;
    for d in &devices {
        let attrs = &d["attributes"];
        assert_eq!(attrs["kind"]["string"], "nvidia.com/gpu", "{d}");
        assert!(attrs["uuid"]["string"].as_str().is_some_and(|u| u.starts_with("GPU-")), "{d}");
    }

    // A claim template for one device of the chart's DeviceClass, and a pod using it.
    let template = json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "actk-one-gpu", "namespace": TEST_NAMESPACE},
        "spec": {"spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": "actk-nvidia", "count": 1}}
        ]}}}
    });
    c.apply(&template.to_string())?;
    let name = "dra-one-gpu";
    let mut pod = actk_testsupport::cluster::PodSpec::new(name, "exec sleep 3600").manifest();
    pod["spec"]["resourceClaims"] = json!([{"name": "gpu", "resourceClaimTemplateName": "actk-one-gpu"}]);
    pod["spec"]["containers"][0]["resources"] = json!({"claims": [{"name": "gpu"}]});
    c.delete_pod(name)?;
    c.apply(&pod.to_string())?;
    let running = c
        .wait_pod_phase(name, &["Running"], Duration::from_secs(120))
        .map_err(|e| anyhow::anyhow!("{e}; driver log:\n{}", c.plugin_logs()))?;

    // The claim the template made: allocated one device of this node's pool.
    let claim_name = running["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
        .as_str()
        .context("the pod's resourceClaimStatuses name no claim")?
        .to_string();
    let claim = c.get_json(&["resourceclaim", &claim_name, "-n", TEST_NAMESPACE])?;
    let results = claim["status"]["allocation"]["devices"]["results"].as_array().cloned().unwrap_or_default();
    ensure!(results.len() == 1, "one allocated device: {}", claim["status"]);
    assert_eq!(results[0]["driver"], "actk.dev");
    assert_eq!(results[0]["pool"], c.node_name());
    let device = results[0]["device"].as_str().unwrap_or_default().to_string();
    let index = devices
        .iter()
        .find(|d| d["name"] == device.as_str())
        .and_then(|d| d["attributes"]["index"]["int"].as_u64())
        .with_context(|| format!("allocated device {device} is not in the published pool"))?;

    // What the container sees: that GPU's node, the control nodes, no other GPU.
    let dev = c.exec(name, &["ls", "/dev"])?;
    let (gpus, control) = nvidia_nodes(&dev);
    assert_eq!(gpus, [index as u32], "exactly the allocated GPU ({device}): /dev has {dev}");
    for ctl in ["nvidiactl", "nvidia-uvm"] {
        assert!(control.iter().any(|n| n == ctl), "control node {ctl} missing: /dev has {dev}");
    }
    // The image's env cannot widen it: the claim spec voids the selection variable.
    let env = c.exec(name, &["env"])?;
    assert!(env.lines().any(|l| l == "NVIDIA_VISIBLE_DEVICES=void"), "{env}");

    // The claim's transient CDI spec is on the node while the pod runs ...
    let uid = claim["metadata"]["uid"].as_str().context("claim without uid")?;
    let spec = Path::new(c.env("CDI_DIR")).join(format!("actk.dev-claim_{uid}.json"));
    ensure!(spec.is_file(), "{} missing while the pod runs", spec.display());
    let text = std::fs::read_to_string(&spec)?;
    let v: Value = serde_json::from_str(&text).with_context(|| format!("{} is not JSON", spec.display()))?;
    assert_eq!(v["kind"], "actk.dev/claim");

    // ... and gone once it is deleted (NodeUnprepareResources), as is the template's claim.
    c.delete_pod(name)?;
    c.wait_until("the claim's CDI spec removed", Duration::from_secs(60), || Ok((!spec.exists()).then_some(())))
        .map_err(|e| anyhow::anyhow!("{e}; driver log:\n{}", c.plugin_logs()))?;
    c.wait_until("the template's claim deleted", Duration::from_secs(60), || {
        let o = c.kubectl(&["get", "resourceclaim", &claim_name, "-n", TEST_NAMESPACE]);
        Ok((!o.status.success()).then_some(()))
    })?;
    c.kubectl_ok(&["delete", "resourceclaimtemplate", "actk-one-gpu", "-n", TEST_NAMESPACE, "--ignore-not-found"])?;
    Ok(())
}

/// The claim templates of deploy/kubernetes/actk-dra-examples.yaml (the documents that are not
/// a Pod: its example pod names a registry image), applied in the test namespace. Templates that
/// name their own namespace (the admin-access example lives in a namespace labelled for admin
/// access) are left to the docs cluster test, which applies the whole file.
fn apply_examples(c: &Cluster) -> Result<()> {
    let path = actk_testsupport::engines::workspace_root().join("deploy/kubernetes/actk-dra-examples.yaml");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let templates =
        text.split("\n---\n").filter(|d| d.contains("kind: ResourceClaimTemplate") && !d.contains("\n  namespace: "));
    for doc in templates {
        // No namespace in the examples: they go to the default one, the test namespace.
        c.apply(doc).with_context(|| format!("applying the example\n{doc}"))?;
    }
    Ok(())
}

/// Where a pod's claim comes from.
enum Source<'a> {
    Template(&'a str),
    Claim(&'a str),
}

/// A sleeping pod with `claims` (pod claim name, source) and one container per
/// `(container, claim names)`; the first container is `c`.
fn claim_pod(name: &str, claims: &[(&str, Source<'_>)], containers: &[(&str, &[&str])]) -> Value {
    let mut pod = actk_testsupport::cluster::PodSpec::new(name, "exec sleep 3600").manifest();
    pod["spec"]["resourceClaims"] = claims
        .iter()
        .map(|(n, s)| match s {
            Source::Template(t) => json!({"name": n, "resourceClaimTemplateName": t}),
            Source::Claim(cl) => json!({"name": n, "resourceClaimName": cl}),
        })
        .collect();
    let template = pod["spec"]["containers"][0].clone();
    pod["spec"]["containers"] = containers
        .iter()
        .map(|(cname, cl)| {
            let mut ct = template.clone();
            ct["name"] = json!(cname);
            ct["resources"] = json!({"claims": cl.iter().map(|n| json!({"name": n})).collect::<Vec<_>>()});
            ct
        })
        .collect();
    pod
}

/// Creates the pod (an old one of the name deleted first) and waits until it runs.
fn run_claim_pod(c: &Cluster, pod: &Value) -> Result<Value> {
    let name = pod["metadata"]["name"].as_str().unwrap_or_default().to_string();
    c.delete_pod(&name)?;
    c.apply(&pod.to_string())?;
    c.wait_pod_phase(&name, &["Running"], Duration::from_secs(120))
        .map_err(|e| anyhow::anyhow!("{e}; driver log:\n{}", c.plugin_logs()))
}

/// The slice devices allocated to the claims of running pod `pod`, with their published
/// attributes.
fn allocated(c: &Cluster, pod: &Value, devices: &[Value]) -> Result<Vec<Value>> {
    let mut out = vec![];
    // Claims made from a template are named in the status, claims of their own in the spec.
    let from_templates = pod["status"]["resourceClaimStatuses"].as_array().into_iter().flatten();
    let own = pod["spec"]["resourceClaims"].as_array().into_iter().flatten();
    let names: Vec<&str> =
        from_templates.chain(own).filter_map(|s| s["resourceClaimName"].as_str()).collect::<Vec<_>>();
    for claim_name in names {
        let claim = c.get_json(&["resourceclaim", claim_name, "-n", TEST_NAMESPACE])?;
        for r in claim["status"]["allocation"]["devices"]["results"].as_array().into_iter().flatten() {
            ensure!(r["driver"] == "actk.dev" && r["pool"] == c.node_name(), "allocation of another pool: {r}");
            let d = devices
                .iter()
                .find(|d| d["name"] == r["device"])
                .with_context(|| format!("allocated device {} is not in the published pool", r["device"]))?;
            out.push(d.clone());
        }
    }
    Ok(out)
}

fn attr_int(d: &Value, k: &str) -> Option<i64> {
    d["attributes"][k]["int"].as_i64()
}

/// Whether the published devices `d` take GPU `index` out of service: where the API server
/// keeps device taints (1.36+) it stays in the slice tainted `actk.dev/unhealthy` with a lost
/// cause; elsewhere it leaves the slice (docs/kubernetes.md, "Device health").
fn out_of_service(c: &Cluster, d: &[Value], index: i64) -> bool {
    let gpu = d.iter().find(|x| attr_int(x, "index") == Some(index) && x["attributes"]["migProfile"].is_null());
    match (gpu, c.kube_version() >= (1, 36)) {
        (None, false) => true,
        (Some(g), true) => g["taints"].as_array().is_some_and(|t| {
            t.iter().any(|t| {
                t["key"] == "actk.dev/unhealthy"
                    && t["value"].as_str().is_some_and(|v| v == "device-node-gone" || v == "device-gone")
            })
        }),
        _ => false,
    }
}

/// Whether every one of the eight GPUs is published untainted.
fn all_eight_in_service(d: &[Value]) -> bool {
    d.len() == 8 && d.iter().all(|x| x["taints"].as_array().is_none_or(|t| t.is_empty()))
}

/// `ls /dev` of container `container` of pod `pod`.
fn dev_of(c: &Cluster, pod: &str, container: &str) -> Result<String> {
    c.kubectl_ok(&["exec", pod, "-n", TEST_NAMESPACE, "-c", container, "--", "ls", "/dev"])
}

/// Devices `<prefix>N` in a `ls /dev` listing, as sorted numbers.
fn numbered(dev: &str, prefix: &str) -> Vec<i64> {
    let mut v: Vec<i64> = dev.split_whitespace().filter_map(|d| d.strip_prefix(prefix)?.parse().ok()).collect();
    v.sort_unstable();
    v
}

fn indices(devs: &[Value]) -> Vec<i64> {
    let mut v: Vec<i64> = devs.iter().filter_map(|d| attr_int(d, "index")).collect();
    v.sort_unstable();
    v
}

/// The claim templates and selectors users write (the chart's examples), on the DGX H100:
/// 2 GPUs; CEL on `index` and on `model`; a claim no device satisfies and a claim for a class
/// that does not exist stay pending with the scheduler's reason; one claim shared by two
/// containers; pods with claims of their own get disjoint GPUs; a driver restart keeps the
/// running pod and still unprepares it; a device node removed from the node leaves the slice.
#[test]
#[ignore = "needs the test cluster: make test runs it alone"]
fn dra_templates_cel_sharing_restart_and_removal_on_the_dgx() -> Result<()> {
    let Some(dgx) = fixture::prepare("nvidia-dgx-h100")? else { return Ok(()) };
    let Some(c) = Cluster::start(&Default::default())? else { return Ok(()) };
    c.install(&dgx.root, VALUES)?;
    let devices = c
        .wait_until("8 GPUs in the node's slices", Duration::from_secs(120), || {
            let d = published(&c)?;
            Ok((d.len() == 8).then_some(d))
        })
        .map_err(|e| anyhow::anyhow!("{e}; driver log:\n{}", c.plugin_logs()))?;
    apply_examples(&c)?;
    let pods = ["dra-two", "dra-index", "dra-model", "dra-shared", "dra-unsat", "dra-noclass"];
    for p in pods {
        c.delete_pod(p)?;
    }

    // Two GPUs: exactly the two allocated nodes, the control nodes and the driver libraries.
    let two = run_claim_pod(&c, &claim_pod("dra-two", &[("gpus", Source::Template("two-gpus"))], &[("c", &["gpus"])]))?;
    let two_devs = allocated(&c, &two, &devices)?;
    ensure!(two_devs.len() == 2, "two devices allocated: {two_devs:?}");
    let dev = dev_of(&c, "dra-two", "c")?;
    assert_eq!(numbered(&dev, "nvidia"), indices(&two_devs), "/dev has {dev}");
    assert!(dev.split_whitespace().any(|d| d == "nvidiactl"), "{dev}");
    let libs = c.exec("dra-two", &["ls", "/usr/lib/x86_64-linux-gnu"])?;
    assert!(libs.split_whitespace().any(|l| l.starts_with("libcuda.so.")), "driver libraries: {libs}");

    // CEL on index: a ResourceClaim of its own for GPU 5, or the first GPU the two-GPU pod
    // does not hold; and the example template on model.
    let taken = indices(&two_devs);
    let want = if taken.contains(&5) { (0..8).find(|i| !taken.contains(i)).unwrap_or(0) } else { 5 };
    let by_index_claim = json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "gpu-by-index", "namespace": TEST_NAMESPACE},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "actk-nvidia",
            "selectors": [{"cel": {"expression": format!("device.attributes[\"actk.dev\"].index == {want}")}}]}}]}}
    });
    c.kubectl(&["delete", "resourceclaim", "gpu-by-index", "-n", TEST_NAMESPACE, "--ignore-not-found"]);
    c.apply(&by_index_claim.to_string())?;
    let by_index =
        run_claim_pod(&c, &claim_pod("dra-index", &[("gpu", Source::Claim("gpu-by-index"))], &[("c", &["gpu"])]))?;
    let idx_devs = allocated(&c, &by_index, &devices)?;
    assert_eq!(indices(&idx_devs), [want], "CEL index == {want}");
    assert_eq!(numbered(&dev_of(&c, "dra-index", "c")?, "nvidia"), [want]);

    let by_model =
        run_claim_pod(&c, &claim_pod("dra-model", &[("gpu", Source::Template("one-h100"))], &[("c", &["gpu"])]))?;
    let model_devs = allocated(&c, &by_model, &devices)?;
    ensure!(model_devs.len() == 1, "{model_devs:?}");
    let model = model_devs[0]["attributes"]["model"]["string"].as_str().unwrap_or_default();
    assert!(model.starts_with("NVIDIA H100"), "CEL on model got {model}");

    // One claim, two containers: both see the one allocated GPU.
    let shared = run_claim_pod(
        &c,
        &claim_pod("dra-shared", &[("gpu", Source::Template("one-gpu"))], &[("c", &["gpu"]), ("c2", &["gpu"])]),
    )?;
    let shared_devs = allocated(&c, &shared, &devices)?;
    ensure!(shared_devs.len() == 1, "{shared_devs:?}");
    for ct in ["c", "c2"] {
        assert_eq!(numbered(&dev_of(&c, "dra-shared", ct)?, "nvidia"), indices(&shared_devs), "container {ct}");
    }

    // Pods with claims of their own: no GPU is given twice.
    let mut all: Vec<i64> = [&two_devs, &idx_devs, &model_devs, &shared_devs].iter().flat_map(|d| indices(d)).collect();
    all.sort_unstable();
    let n = all.len();
    all.dedup();
    assert_eq!(all.len(), n, "each GPU to one claim: {all:?}");

    // No device satisfies the claim / the class does not exist: pending, with the reason.
    let nope = json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": "no-such-model", "namespace": TEST_NAMESPACE},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "actk-nvidia",
            "selectors": [{"cel": {"expression": "device.attributes[\"actk.dev\"].model == \"NVIDIA B200\""}}]}}]}}}
    });
    let noclass = json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": "no-such-class", "namespace": TEST_NAMESPACE},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "actk-nosuch"}}]}}}
    });
    c.apply(&nope.to_string())?;
    c.apply(&noclass.to_string())?;
    c.apply(&claim_pod("dra-unsat", &[("gpu", Source::Template("no-such-model"))], &[("c", &["gpu"])]).to_string())?;
    c.apply(&claim_pod("dra-noclass", &[("gpu", Source::Template("no-such-class"))], &[("c", &["gpu"])]).to_string())?;
    let why = c.unschedulable("dra-unsat")?;
    assert!(why.contains("cannot allocate all claims"), "{why}");
    let why = c.unschedulable("dra-noclass")?;
    assert!(why.contains("actk-nosuch") && why.contains("does not exist"), "{why}");

    // Driver restart: the running pod keeps its GPU, and the new driver unprepares it (from its
    // checkpoint) when it goes, removing the claim's spec.
    let uid = c.get_json(&["resourceclaim", "gpu-by-index", "-n", TEST_NAMESPACE])?["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let spec = Path::new(c.env("CDI_DIR")).join(format!("actk.dev-claim_{uid}.json"));
    ensure!(spec.is_file(), "{} missing while dra-index runs", spec.display());
    let sel = "app.kubernetes.io/name=actk-dra-driver";
    let before = c.get_json(&["pods", "-n", actk_testsupport::cluster::NAMESPACE, "-l", sel])?;
    let old_uid = before["items"][0]["metadata"]["uid"].clone();
    ensure!(!old_uid.is_null(), "a DRA driver pod ({sel}): {before}");
    c.kubectl_ok(&["delete", "pods", "-n", actk_testsupport::cluster::NAMESPACE, "-l", sel, "--wait=true"])?;
    c.wait_until("a new DRA driver pod running", Duration::from_secs(120), || {
        let l = c.get_json(&["pods", "-n", actk_testsupport::cluster::NAMESPACE, "-l", sel])?;
        Ok(l["items"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|p| p["metadata"]["uid"] != old_uid && p["status"]["phase"] == "Running")
            .then_some(()))
    })?;
    let still = c.pod("dra-index")?;
    assert_eq!(still["status"]["phase"], "Running");
    assert_eq!(still["status"]["containerStatuses"][0]["restartCount"], 0);
    assert_eq!(numbered(&dev_of(&c, "dra-index", "c")?, "nvidia"), [want]);
    c.delete_pod("dra-index")?;
    c.wait_until("the restarted driver removes the claim's spec", Duration::from_secs(60), || {
        Ok((!spec.exists()).then_some(()))
    })
    .map_err(|e| anyhow::anyhow!("{e}; driver log:\n{}", c.plugin_logs()))?;

    // A device node that goes takes the GPU out of service within seconds (out of the pool, or
    // tainted where taints are kept); back, it is published whole again.
    let free = (0..8).rev().find(|i| !all.contains(i)).context("a GPU no pod holds")?;
    let node = dgx.path(&format!("/dev/nvidia{free}"));
    let meta = std::fs::metadata(&node)?;
    std::fs::remove_file(&node)?;
    let t = std::time::Instant::now();
    let gone = c.wait_until("the removed GPU out of service", Duration::from_secs(30), || {
        let d = published(&c)?;
        Ok(out_of_service(&c, &d, free).then_some(d))
    });
    let mknod = std::process::Command::new("mknod")
        .args(["-m", "0666"])
        .arg(&node)
        .args(["c", "195", &(std::os::unix::fs::MetadataExt::rdev(&meta) & 0xff).to_string()])
        .status()?;
    ensure!(mknod.success(), "mknod {}", node.display());
    let gone = gone?;
    eprintln!("removed GPU {free} out of service after {:?}", t.elapsed());
    ensure!(gone.iter().filter(|d| d["taints"].as_array().is_some_and(|t| !t.is_empty())).count() <= 1, "{gone:?}");
    c.wait_until("the GPU is published whole again", Duration::from_secs(30), || {
        Ok(all_eight_in_service(&published(&c)?).then_some(()))
    })?;

    for p in pods {
        c.delete_pod(p)?;
    }
    c.kubectl(&["delete", "resourceclaim", "gpu-by-index", "-n", TEST_NAMESPACE, "--ignore-not-found"]);
    c.kubectl(&["delete", "resourceclaimtemplate", "--all", "-n", TEST_NAMESPACE]);
    Ok(())
}

/// NeuronLink constraints through the scheduler: on trn1 a claim for four devices with
/// `matchAttribute: actk.dev/linkGroup4` gets one connected block (a torus row), on inf2 two
/// linked devices (`linkGroup2`); the pod sees exactly those Neuron devices.
#[test]
#[ignore = "needs the test cluster: make test runs it alone"]
fn dra_neuron_claims_with_match_attribute_get_linked_devices() -> Result<()> {
    for (fixture_name, template, count, group, total) in [
        ("aws-trn1-32xlarge", "neuron-4-linked", 4, "linkGroup4", 16),
        ("aws-inf2-48xlarge", "neuron-2-linked", 2, "linkGroup2", 12),
    ] {
        let Some(f) = fixture::prepare(fixture_name)? else { return Ok(()) };
        let Some(c) = Cluster::start(&Default::default())? else { return Ok(()) };
        c.install(&f.root, "devicePlugin:\n  enabled: false\ndra:\n  enabled: true\n  profiles: [neuron]\n")?;
        let devices = c
            .wait_until(&format!("{total} Neuron devices in the slices"), Duration::from_secs(120), || {
                let d = published(&c)?;
                Ok((d.len() == total && d.iter().all(|d| d["attributes"].get(group).is_some())).then_some(d))
            })
            .map_err(|e| anyhow::anyhow!("{fixture_name}: {e}; driver log:\n{}", c.plugin_logs()))?;
        apply_examples(&c)?;
        let name = "dra-neuron";
        let pod = run_claim_pod(&c, &claim_pod(name, &[("n", Source::Template(template))], &[("c", &["n"])]))?;
        let got = allocated(&c, &pod, &devices)?;
        ensure!(got.len() == count, "{fixture_name}: {count} devices: {got:?}");
        let groups: std::collections::BTreeSet<Option<i64>> = got.iter().map(|d| attr_int(d, group)).collect();
        assert_eq!(groups.len(), 1, "{fixture_name}: one {group}: {got:?}");
        assert!(groups.iter().all(Option::is_some), "{fixture_name}: {got:?}");
        let dev = dev_of(&c, name, "c")?;
        assert_eq!(numbered(&dev, "neuron"), indices(&got), "{fixture_name}: /dev has {dev}");
        c.delete_pod(name)?;
        c.kubectl(&["delete", "resourceclaimtemplate", "--all", "-n", TEST_NAMESPACE]);
    }
    Ok(())
}

/// The heterogeneous node publishes both kinds in its pool, and a pod with one claim of each
/// class sees one GPU and one Neuron device.
#[test]
#[ignore = "needs the test cluster: make test runs it alone"]
fn dra_hetero_node_serves_a_claim_of_each_kind() -> Result<()> {
    let Some(f) = fixture::prepare("hetero-nvidia-neuron")? else { return Ok(()) };
    let Some(c) = Cluster::start(&Default::default())? else { return Ok(()) };
    c.install(&f.root, "devicePlugin:\n  enabled: false\ndra:\n  enabled: true\n  profiles: [nvidia, neuron]\n")?;
    let devices = c
        .wait_until("2 GPUs and 2 Neuron devices in the slices", Duration::from_secs(120), || {
            let d = published(&c)?;
            let of = |k: &str| d.iter().filter(|x| x["attributes"]["kind"]["string"] == k).count();
            Ok((of("nvidia.com/gpu") == 2 && of("aws.amazon.com/neuron") == 2).then_some(d))
        })
        .map_err(|e| anyhow::anyhow!("{e}; driver log:\n{}", c.plugin_logs()))?;
    for (t, class) in [("one-nvidia", "actk-nvidia"), ("one-neuron", "actk-neuron")] {
        c.apply(
            &json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": t, "namespace": TEST_NAMESPACE},
                "spec": {"spec": {"devices": {"requests": [{"name": "d", "exactly": {"deviceClassName": class}}]}}}
            })
            .to_string(),
        )?;
    }
    let name = "dra-hetero";
    let pod = run_claim_pod(
        &c,
        &claim_pod(
            name,
            &[("g", Source::Template("one-nvidia")), ("n", Source::Template("one-neuron"))],
            &[("c", &["g", "n"])],
        ),
    )?;
    let got = allocated(&c, &pod, &devices)?;
    let kinds: Vec<&str> = got.iter().filter_map(|d| d["attributes"]["kind"]["string"].as_str()).collect();
    ensure!(
        kinds.len() == 2 && kinds.contains(&"nvidia.com/gpu") && kinds.contains(&"aws.amazon.com/neuron"),
        "{got:?}"
    );
    let dev = dev_of(&c, name, "c")?;
    let of_kind = |k: &str| -> Vec<i64> {
        got.iter().filter(|d| d["attributes"]["kind"]["string"] == k).filter_map(|d| attr_int(d, "index")).collect()
    };
    // This node's GPU minors are not in bus order (fixtures/hetero-nvidia-neuron/SOURCES.md):
    // index 0 (00:1b.0) is /dev/nvidia1. The node the container gets is the GPU's Device Minor.
    let minors: Vec<i64> = got
        .iter()
        .filter(|d| d["attributes"]["kind"]["string"] == "nvidia.com/gpu")
        .map(|d| -> Result<i64> {
            let bus = d["attributes"]["pciBusID"]["string"].as_str().context("a GPU without pciBusID")?;
            let info = std::fs::read_to_string(f.path(&format!("/proc/driver/nvidia/gpus/{bus}/information")))?;
            info.lines()
                .find_map(|l| l.strip_prefix("Device Minor:").and_then(|m| m.trim().parse().ok()))
                .with_context(|| format!("no Device Minor for {bus}"))
        })
        .collect::<Result<_>>()?;
    assert_eq!(numbered(&dev, "nvidia"), minors, "GPU {:?}: /dev has {dev}", of_kind("nvidia.com/gpu"));
    assert_eq!(numbered(&dev, "neuron"), of_kind("aws.amazon.com/neuron"), "/dev has {dev}");
    c.delete_pod(name)?;
    c.kubectl(&[
        "delete",
        "resourceclaimtemplate",
        "one-nvidia",
        "one-neuron",
        "-n",
        TEST_NAMESPACE,
        "--ignore-not-found",
    ]);
    Ok(())
}

/// Bad input that reaches the kubelet: an allocation naming a device the node no longer has
/// (its node removed, the slice updated, then a claim allocated to it by hand and reserved for
/// a pod bound to the node). NodePrepareResources refuses it naming the claim and the device,
/// the pod does not start, and no spec is written for the claim.
#[test]
#[ignore = "needs the test cluster: make test runs it alone"]
fn dra_allocation_of_a_vanished_device_is_refused_naming_claim_and_device() -> Result<()> {
    let Some(dgx) = fixture::prepare("nvidia-dgx-h100")? else { return Ok(()) };
    let Some(c) = Cluster::start(&Default::default())? else { return Ok(()) };
    c.install(&dgx.root, VALUES)?;
    c.wait_until("8 GPUs in the node's slices", Duration::from_secs(120), || {
        Ok((published(&c)?.len() == 8).then_some(()))
    })?;
    let node = dgx.path("/dev/nvidia7");
    std::fs::remove_file(&node)?;
    let result = (|| -> Result<()> {
        c.wait_until("GPU 7 out of service", Duration::from_secs(30), || {
            Ok(out_of_service(&c, &published(&c)?, 7).then_some(()))
        })?;
        let (pod_name, claim_name) = ("dra-ghost", "ghost-claim");
        c.delete_pod(pod_name)?;
        c.kubectl(&["delete", "resourceclaim", claim_name, "-n", TEST_NAMESPACE, "--ignore-not-found", "--wait=true"]);
        c.apply(
            &json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": claim_name, "namespace": TEST_NAMESPACE},
                "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "actk-nvidia"}}]}}
            })
            .to_string(),
        )?;
        // No scheduler takes the pod (its schedulerName has none), so the claim's allocation is
        // ours to write; it is bound to the node only once the claim is reserved for it, so that
        // the kubelet's first try reaches the driver (a refused try puts the next one behind the
        // pod worker's backoff, past a minute on a loaded node).
        let mut pod = claim_pod(pod_name, &[("gpu", Source::Claim(claim_name))], &[("c", &["gpu"])]);
        pod["spec"]["schedulerName"] = json!("actk-test-nobody");
        c.apply(&pod.to_string())?;
        let uid = c.pod(pod_name)?["metadata"]["uid"].as_str().context("pod without uid")?.to_string();
        let status = json!({"status": {
            "allocation": {"devices": {"results": [
                {"request": "gpu", "driver": "actk.dev", "pool": c.node_name(), "device": "nvidia-7"}
            ]}},
            "reservedFor": [{"resource": "pods", "name": pod_name, "uid": uid}]
        }});
        c.kubectl_ok(&[
            "patch",
            "resourceclaim",
            claim_name,
            "-n",
            TEST_NAMESPACE,
            "--subresource=status",
            "--type=merge",
            "-p",
            &status.to_string(),
        ])?;
        let claim_uid = c.get_json(&["resourceclaim", claim_name, "-n", TEST_NAMESPACE])?["metadata"]["uid"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let binding = json!({
            "apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": pod_name, "namespace": TEST_NAMESPACE},
            "target": {"apiVersion": "v1", "kind": "Node", "name": c.node_name()}
        });
        let dir = tempfile::tempdir()?;
        let file = dir.path().join("binding.json");
        std::fs::write(&file, binding.to_string())?;
        let path = format!("/api/v1/namespaces/{TEST_NAMESPACE}/pods/{pod_name}/binding");
        c.kubectl_ok(&[
            std::ffi::OsStr::new("create"),
            "--raw".as_ref(),
            path.as_ref(),
            "-f".as_ref(),
            file.as_os_str(),
        ])?;
        // The driver's refusal is the event that names the device.
        let want =
            format!("claim {TEST_NAMESPACE}/{claim_name} (uid {claim_uid}): device nvidia-7 is not on this node");
        c.wait_until(
            "the kubelet's FailedPrepareDynamicResources event from the driver",
            Duration::from_secs(90),
            || {
                let events = c.events(TEST_NAMESPACE, pod_name)?;
                Ok(events
                    .iter()
                    .any(|e| e.starts_with("FailedPrepareDynamicResources") && e.contains(&want))
                    .then_some(()))
            },
        )
        .map_err(|e| {
            let events = c.events(TEST_NAMESPACE, pod_name).unwrap_or_default();
            anyhow::anyhow!("{e}; events: {events:#?}; driver log:\n{}", c.plugin_logs())
        })?;
        let p = c.pod(pod_name)?;
        assert_eq!(p["status"]["phase"], "Pending", "{}", p["status"]);
        let written: Vec<String> = std::fs::read_dir(c.env("CDI_DIR"))?
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains(&claim_uid))
            .collect();
        assert!(written.is_empty(), "nothing written for the refused claim: {written:?}");
        c.delete_pod(pod_name)?;
        c.kubectl(&["delete", "resourceclaim", claim_name, "-n", TEST_NAMESPACE, "--ignore-not-found"]);
        Ok(())
    })();
    let back = std::process::Command::new("mknod").args(["-m", "0666"]).arg(&node).args(["c", "195", "7"]).status()?;
    ensure!(back.success(), "mknod {}", node.display());
    result
}
