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

/// The devices the node's ResourceSlices of `actk.dev` publish, once every slice of the pool's
/// newest generation is there.
fn published(c: &Cluster) -> Result<Vec<Value>> {
    let list = c.get_json(&["resourceslices"])?;
    let slices: Vec<&Value> = list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| s["spec"]["driver"] == "actk.dev" && s["spec"]["nodeName"] == c.node_name())
        .collect();
    let generation = slices.iter().filter_map(|s| s["spec"]["pool"]["generation"].as_i64()).max();
    let newest: Vec<&&Value> =
        slices.iter().filter(|s| s["spec"]["pool"]["generation"].as_i64() == generation).collect();
    let complete = newest.first().and_then(|s| s["spec"]["pool"]["resourceSliceCount"].as_u64());
    if complete != Some(newest.len() as u64) {
        return Ok(vec![]);
    }
    Ok(newest.iter().flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default()).collect())
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
