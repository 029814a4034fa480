//! Health that acts (issue 26), on the real single-node cluster: the DRA driver for the nvidia
//! profile on a node laid out as the DGX H100 fixture, a pod running with a claim for one GPU,
//! then that GPU's device node removed from the node (a GPU that fell off the bus):
//! - where the API server keeps device taints (1.36+): the device stays in the ResourceSlice
//!   with the taint `actk.dev/unhealthy=device-node-gone:NoSchedule` within seconds;
//! - on 1.34 (taints dropped): the device leaves the slice;
//! - where the kubelet watches device health (ResourceHealthStatus: on by default from 1.36,
//!   a gate on 1.34): the running pod's `allocatedResourcesStatus` says Unhealthy;
//! - the runner deleted (the GPU free, so only the taint keeps claims off it), a new claim
//!   asking for exactly that GPU is not placed on it (Pending);
//! - the node restored: the taint is gone (the device back), the waiting pod is placed on that
//!   GPU, runs, and its status says Healthy.
//!
//! `#[ignore]`d like every cluster test. On 1.37: `ACTK_KUBE_VERSION=v1.37.2`.

use actk_testsupport::cluster::{Cluster, PodSpec, TEST_NAMESPACE};
use actk_testsupport::fixture;
use anyhow::{Context, Result, ensure};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

const VALUES: &str = "devicePlugin:\n  enabled: false\ndra:\n  enabled: true\n  profiles: [nvidia]\n";

/// Devices of `actk.dev` in the node's newest complete pool generation.
fn published(c: &Cluster) -> Result<Vec<Value>> {
    c.published_devices("actk.dev")
}

/// A pod with one claim from template `template`, sleeping.
fn claim_pod(name: &str, template: &str) -> Value {
    let mut pod = PodSpec::new(name, "exec sleep 3600").manifest();
    pod["spec"]["resourceClaims"] = json!([{"name": "gpu", "resourceClaimTemplateName": template}]);
    pod["spec"]["containers"][0]["resources"] = json!({"claims": [{"name": "gpu"}]});
    pod
}

fn template(name: &str, selector: Option<&str>) -> Value {
    let mut exactly = json!({"deviceClassName": "actk-nvidia", "count": 1});
    if let Some(cel) = selector {
        exactly["selectors"] = json!([{"cel": {"expression": cel}}]);
    }
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": TEST_NAMESPACE},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}}
    })
}

/// The healths of pod `name`'s allocated resources (`allocatedResourcesStatus`).
fn resource_health(c: &Cluster, name: &str) -> Result<Vec<String>> {
    let p = c.pod(name)?;
    Ok(p["status"]["containerStatuses"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|s| s["allocatedResourcesStatus"].as_array().cloned().unwrap_or_default())
        .flat_map(|r| r["resources"].as_array().cloned().unwrap_or_default())
        .filter_map(|r| r["health"].as_str().map(str::to_string))
        .collect())
}

/// Whether the kubelet watches device health: ResourceHealthStatus is on by default from
/// 1.36, a gate the cluster's components were started with on 1.34.
fn kubelet_watches_health(c: &Cluster) -> bool {
    c.kube_version() >= (1, 36)
        || std::env::var("ACTK_KUBE_FEATURE_GATES").is_ok_and(|g| g.contains("ResourceHealthStatus=true"))
}

#[test]
#[ignore = "needs the test cluster: make test runs it alone"]
fn dra_unhealthy_gpu_is_tainted_not_placed_and_shown_in_pod_status() -> Result<()> {
    let Some(dgx) = fixture::prepare("nvidia-dgx-h100")? else { return Ok(()) };
    let Some(c) = Cluster::start(&Default::default())? else { return Ok(()) };
    c.install(&dgx.root, VALUES)?;
    let taints = c.kube_version() >= (1, 36);
    let logs = |e: anyhow::Error| anyhow::anyhow!("{e}; driver log:\n{}", c.plugin_logs());
    c.wait_until("8 GPUs published", Duration::from_secs(120), || Ok((published(&c)?.len() == 8).then_some(())))
        .map_err(logs)?;

    c.apply(&template("health-one-gpu", None).to_string())?;
    let runner = "dra-health-runner";
    c.delete_pod(runner)?;
    c.apply(&claim_pod(runner, "health-one-gpu").to_string())?;
    let running = c.wait_pod_phase(runner, &["Running"], Duration::from_secs(120)).map_err(logs)?;
    let claim_name = running["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
        .as_str()
        .context("no claim in the pod's status")?
        .to_string();
    let claim = c.get_json(&["resourceclaim", &claim_name, "-n", TEST_NAMESPACE])?;
    let device = claim["status"]["allocation"]["devices"]["results"][0]["device"]
        .as_str()
        .context("the claim names no device")?
        .to_string();
    let index: u32 = device.strip_prefix("nvidia-").and_then(|i| i.parse().ok()).context("device name")?;
    if kubelet_watches_health(&c) {
        c.wait_until("the runner's GPU reported Healthy", Duration::from_secs(60), || {
            Ok((resource_health(&c, runner)? == ["Healthy"]).then_some(()))
        })
        .map_err(logs)?;
    }

    // The GPU falls off the bus: its node is gone from the node's /dev (the fixture's).
    let node = dgx.path(&format!("/dev/nvidia{index}"));
    std::fs::remove_file(&node).with_context(|| format!("removing {}", node.display()))?;
    let t = Instant::now();
    let restore = || {
        let ok = std::process::Command::new("mknod").arg(&node).args(["c", "195", &index.to_string()]).status();
        ensure!(ok.is_ok_and(|s| s.success()), "mknod {} failed", node.display());
        Ok(())
    };
    let acted = c.wait_until(&format!("{device} tainted or withdrawn"), Duration::from_secs(30), || {
        let d = published(&c)?;
        if d.is_empty() {
            return Ok(None);
        }
        let mine = d.iter().find(|x| x["name"] == device.as_str()).cloned();
        Ok(match (&mine, taints) {
            (Some(m), true) if m["taints"].as_array().is_some_and(|t| !t.is_empty()) => Some(mine),
            (None, false) => Some(None),
            _ => None,
        })
    });
    let acted = match acted {
        Ok(a) => a,
        Err(e) => {
            restore()?;
            return Err(logs(e));
        }
    };
    eprintln!("{device}: acted on in the API server {:?} after its node was removed", t.elapsed());
    if let Some(m) = &acted {
        let t = &m["taints"][0];
        assert_eq!(
            (t["key"].as_str(), t["value"].as_str(), t["effect"].as_str()),
            (Some("actk.dev/unhealthy"), Some("device-node-gone"), Some("NoSchedule")),
            "{m}"
        );
    }
    if kubelet_watches_health(&c) {
        let shown = c.wait_until("the runner's GPU reported Unhealthy", Duration::from_secs(60), || {
            Ok((resource_health(&c, runner)? == ["Unhealthy"]).then_some(()))
        });
        if let Err(e) = shown {
            restore()?;
            return Err(logs(e));
        }
    }

    // The runner goes, so the GPU is free: a new claim for exactly that GPU is still not placed
    // on it, for its taint (or its absence from the slice) alone.
    c.delete_pod(runner)?;
    c.wait_until(&format!("claim {claim_name} gone"), Duration::from_secs(60), || {
        Ok((!c.kubectl(&["get", "resourceclaim", &claim_name, "-n", TEST_NAMESPACE]).status.success()).then_some(()))
    })?;
    let pinned = "dra-health-pinned";
    c.apply(
        &template("health-that-gpu", Some(&format!("device.attributes[\"actk.dev\"].index == {index}"))).to_string(),
    )?;
    c.delete_pod(pinned)?;
    c.apply(&claim_pod(pinned, "health-that-gpu").to_string())?;
    let pending = c.wait_until(&format!("pod {pinned} unschedulable"), Duration::from_secs(60), || {
        let p = c.pod(pinned)?;
        ensure!(p["status"]["phase"] == "Pending", "pod {pinned} was placed on the unhealthy GPU: {}", p["status"]);
        Ok(p["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "PodScheduled" && c["status"] == "False")
            .map(|c| c["message"].as_str().unwrap_or_default().to_string()))
    });
    if let Err(e) = pending {
        restore()?;
        return Err(logs(e));
    }
    // Recovery: the node is back, the taint goes, the waiting pod gets that GPU.
    restore()?;
    c.wait_until(&format!("{device} published untainted"), Duration::from_secs(30), || {
        let d = published(&c)?;
        Ok(d.iter()
            .any(|x| x["name"] == device.as_str() && x["taints"].as_array().is_none_or(Vec::is_empty))
            .then_some(()))
    })
    .map_err(logs)?;
    c.wait_pod_phase(pinned, &["Running"], Duration::from_secs(120)).map_err(logs)?;
    if kubelet_watches_health(&c) {
        c.wait_until("the recovered GPU reported Healthy to its new pod", Duration::from_secs(60), || {
            Ok((resource_health(&c, pinned)? == ["Healthy"]).then_some(()))
        })
        .map_err(logs)?;
    }
    c.delete_pod(pinned)?;
    for t in ["health-one-gpu", "health-that-gpu"] {
        c.kubectl_ok(&["delete", "resourceclaimtemplate", t, "-n", TEST_NAMESPACE, "--ignore-not-found"])?;
    }
    Ok(())
}
