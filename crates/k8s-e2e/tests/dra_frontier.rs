//! Issue 26 on the real single-node cluster, on the version `ACTK_KUBE_VERSION` names (1.34.4
//! and 1.37.2 are the two `make test-k8s` and `make verify` run): the extended-resource
//! mapping (KEP-5004) that serves an unchanged `limits: {nvidia.com/gpu: 2}` pod from the DRA
//! driver or from the device plugin, whichever the node label `actk.dev/nvidia.server` names,
//! with the same container view; the driver's metrics; the node-scoped write guard on
//! ResourceSlices; what a user sees for bad input; and dynamic MIG (issue 27, 1.36+).
//!
//! `#[ignore]`d like every cluster test: `make test-k8s` runs them alone, one at a time.

use actk_testsupport::cluster::{Cluster, PodSpec, TEST_NAMESPACE};
use actk_testsupport::fixture;
use anyhow::{Context, Result, ensure};
use serde_json::{Value, json};
use std::io::{Read, Write};
use std::time::Duration;

/// The device plugin and the DRA driver together, nvidia for DRA, the node label deciding
/// which one serves it (default: DRA), the driver's metrics on.
const BOTH: &str = "dra:\n  enabled: true\n  profiles: [nvidia]\n  perNodeServer:\n    enabled: true\n    default: dra\n  metrics:\n    enabled: true\n    port: 9401\n";

/// The DRA driver alone.
const DRA_ONLY: &str = "devicePlugin:\n  enabled: false\ndra:\n  enabled: true\n  profiles: [nvidia]\n";

/// The label that chooses what serves nvidia on a node (crates/actk-dra/src/servers.rs).
const SERVER_LABEL: &str = "actk.dev/nvidia.server";

/// Devices of `actk.dev` in the node's newest complete pool generation.
fn published(c: &Cluster) -> Result<Vec<Value>> {
    c.published_devices("actk.dev")
}

/// What a container sees of its devices: `/dev` entries, its environment, its mounts
/// (mount point, root and source; the kubelet's per-pod files by mount point only), and the
/// node it ran on.
const VIEW: &str = r#"echo "== dev"; ls /dev | sort
echo "== env"; env | sort
echo "== mounts"
awk '{split($0, h, " - "); split(h[1], l, " "); split(h[2], r, " ");
  if (l[5] ~ "^/etc/(hosts|hostname|resolv.conf)$" || l[5] == "/dev/termination-log") print l[5];
  else print l[5], l[4], r[1], r[2]}' /proc/self/mountinfo | sort"#;

/// The view of a `limits: {nvidia.com/gpu: 2}` pod named `name`, run to its end; and the pod.
fn limits_pod_view(c: &Cluster, name: &str) -> Result<(String, Value)> {
    c.delete_pod(name)?;
    let r = c.run_pod(&PodSpec::new(name, VIEW).limit("nvidia.com/gpu", 2))?;
    ensure!(r.phase() == "Succeeded", "pod {name}: {} {}\n{}", r.phase(), r.pod["status"], r.logs);
    let node = r.pod["spec"]["nodeName"].as_str().unwrap_or_default().to_string();
    Ok((format!("== node\n{node}\n{}", r.logs), r.pod))
}

/// A view without what names the pod itself (its cgroup directories carry its UID).
fn comparable(view: &str) -> String {
    view.lines()
        .map(|l| match l.strip_prefix("/sys/fs/cgroup/") {
            Some(rest) => format!("/sys/fs/cgroup/{}", rest.split(' ').next().unwrap_or("")),
            None => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// `GET /metrics` of the driver on the node (host network, the chart's dra.metrics.port).
fn metrics(port: u16) -> Result<String> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).context("connecting to the driver's metrics")?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

/// The value of metric line `name{labels}` (exact prefix up to the space).
fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.split_whitespace().next()?.parse().ok())
}

/// Issue 26: an unchanged `limits: {nvidia.com/gpu: 2}` pod. On a cluster that serves the
/// mapping (1.36+; DRAExtendedResource GA in 1.37), the chart's class `actk-nvidia` names
/// `nvidia.com/gpu`, every published device carries `resource.kubernetes.io/pciBusID`, and the
/// pod is served by the DRA driver (a claim the scheduler made, prepared by actk.dev). Then the
/// node label `actk.dev/nvidia.server=device-plugin` hands the kind to the device plugin (the
/// driver withdraws the GPUs, the plugin registers them) and the same pod is served by the
/// plugin. Both containers see the same devices, environment and mounts on the same node.
/// On 1.34 (gate off by default) the class names nothing and the pod waits with the
/// scheduler's reason; the driver works as before.
#[test]
#[ignore = "needs the test cluster: make test runs it alone"]
fn dra_extended_resource_limits_served_by_dra_or_the_device_plugin_alike() -> Result<()> {
    let Some(dgx) = fixture::prepare("nvidia-dgx-h100")? else { return Ok(()) };
    let Some(c) = Cluster::start(&Default::default())? else { return Ok(()) };
    let node = c.node_name().to_string();
    c.kubectl_ok(&["label", "node", &node, &format!("{SERVER_LABEL}-")])?;
    c.install(&dgx.root, BOTH)?;
    let devices = c.wait_until("8 GPUs in the node's slices", Duration::from_secs(120), || {
        let d = published(&c)?;
        Ok((d.len() == 8).then_some(d))
    })?;
    for d in &devices {
        let bus = d["attributes"]["resource.kubernetes.io/pciBusID"]["string"].as_str();
        ensure!(bus.is_some_and(|b| b.len() == 12 && b.contains(':')), "no standard pciBusID: {d}");
    }
    let class = c.get_json(&["deviceclass", "actk-nvidia"])?;
    let mapped = class["spec"]["extendedResourceName"].as_str().map(str::to_string);
    let served = c.kube_version() >= (1, 36)
        || std::env::var("ACTK_KUBE_FEATURE_GATES").is_ok_and(|g| g.contains("DRAExtendedResource=true"));
    if !served {
        // 1.34/1.35 without the gate: the chart maps nothing (auto), the pod waits, named.
        ensure!(mapped.is_none(), "the class maps {mapped:?} on {:?} without the gate", c.kube_version());
        c.delete_pod("xr-waits")?;
        c.create_pod(&PodSpec::new("xr-waits", "true").limit("nvidia.com/gpu", 2))?;
        let why = c.unschedulable("xr-waits")?;
        ensure!(why.contains("nvidia.com/gpu"), "{why}");
        c.delete_pod("xr-waits")?;
        eprintln!("Kubernetes {:?}: no extended-resource mapping by default; the DRA path is 1.36+", c.kube_version());
        return Ok(());
    }
    assert_eq!(mapped.as_deref(), Some("nvidia.com/gpu"), "kubectl get deviceclass actk-nvidia: {class}");
    let alloc = c.allocatable()?;
    ensure!(alloc.get("nvidia.com/gpu").copied().unwrap_or(0) == 0, "the device plugin serves nvidia too: {alloc:?}");
    let m = metrics(9401)?;
    assert_eq!(metric(&m, "actk_dra_published_devices{profile=\"nvidia\"}"), Some(8.0), "{m}");
    let prepared_before = metric(&m, "actk_dra_claims_total{operation=\"prepare\",result=\"ok\"}").unwrap_or(0.0);

    // DRA: the scheduler makes the pod's claim from the class and actk.dev prepares it.
    let (via_dra, pod) = limits_pod_view(&c, "xr-dra")?;
    let claim = pod["status"]["extendedResourceClaimStatus"]["resourceClaimName"]
        .as_str()
        .with_context(|| format!("no extendedResourceClaimStatus: the pod was not served by DRA: {}", pod["status"]))?
        .to_string();
    let mappings = &pod["status"]["extendedResourceClaimStatus"]["requestMappings"];
    assert_eq!(mappings[0]["resourceName"], "nvidia.com/gpu", "{mappings}");
    let m = metrics(9401)?;
    let prepared = metric(&m, "actk_dra_claims_total{operation=\"prepare\",result=\"ok\"}").unwrap_or(0.0);
    assert!(prepared > prepared_before, "prepare not counted ({prepared_before} -> {prepared}):\n{m}");
    assert!(m.contains("actk_dra_request_duration_seconds_bucket"), "{m}");
    eprintln!("DRA served {claim}");

    // The device plugin: the label hands nvidia over; the driver withdraws, the plugin registers.
    c.kubectl_ok(&["label", "node", &node, &format!("{SERVER_LABEL}=device-plugin"), "--overwrite"])?;
    c.wait_until("the GPUs leave the DRA pool", Duration::from_secs(60), || {
        let d = c.get_json(&["resourceslices"])?;
        let any = d["items"].as_array().into_iter().flatten().any(|s| {
            s["spec"]["driver"] == "actk.dev"
                && s["spec"]["devices"]
                    .as_array()
                    .is_some_and(|d| d.iter().any(|x| x["name"].as_str().unwrap_or("").starts_with("nvidia")))
        });
        Ok((!any).then_some(()))
    })?;
    c.wait_allocatable_within("nvidia.com/gpu", 8, Duration::from_secs(90))?;
    let (via_plugin, pod) = limits_pod_view(&c, "xr-plugin")?;
    ensure!(pod["status"]["extendedResourceClaimStatus"].is_null(), "DRA served it: {}", pod["status"]);

    c.kubectl_ok(&["label", "node", &node, &format!("{SERVER_LABEL}-")])?;
    c.uninstall()?;
    // Both answers set the selection variable to `void` (the claim spec, and the device
    // plugin's CDI-only answer), so that an image's NVIDIA_VISIBLE_DEVICES=all cannot make a
    // legacy hook add GPUs the kubelet did not allocate: as NVIDIA's stack does on both paths.
    let via_dra = comparable(&via_dra);
    for (path, view) in [("DRA", &via_dra), ("device plugin", &via_plugin)] {
        assert!(
            view.lines().any(|l| l == "NVIDIA_VISIBLE_DEVICES=void"),
            "{path}: no NVIDIA_VISIBLE_DEVICES=void:\n{view}"
        );
    }
    assert_eq!(via_dra, comparable(&via_plugin), "the two paths give the container different views");
    Ok(())
}

/// A kubeconfig like the cluster's, whose requests impersonate `user` with the user-info extra
/// `authentication.kubernetes.io/node-name: [node]` (what a pod-bound ServiceAccount token of a
/// pod on `node` carries). The test cluster authorizes every request, impersonation included.
fn impersonating(c: &Cluster, dir: &std::path::Path, user: &str, node: Option<&str>) -> Result<std::path::PathBuf> {
    let mut kc: Value = serde_json::from_str(&c.kubectl_ok(&["config", "view", "--raw", "-o", "json"])?)?;
    for u in kc["users"].as_array_mut().context("no users in the kubeconfig")? {
        u["user"]["as"] = json!(user);
        if let Some(n) = node {
            u["user"]["as-user-extra"] = json!({"authentication.kubernetes.io/node-name": [n]});
        }
    }
    let f = dir.join(format!("{}.kubeconfig", node.unwrap_or("none")));
    std::fs::write(&f, kc.to_string())?;
    Ok(f)
}

/// Issue 26: a node's driver writes only its own node's ResourceSlices. With the chart's policy
/// in place, requests as the driver's ServiceAccount bound to node A may create A's slice but
/// not B's, may not move A's slice to B, may not delete B's, and need a node at all; the
/// driver itself (on the real node) still publishes. Runs on every version (the policy is
/// admissionregistration.k8s.io/v1, Kubernetes 1.30+).
#[test]
#[ignore = "needs the test cluster: make test runs it alone"]
fn dra_driver_identity_writes_only_its_own_nodes_slices() -> Result<()> {
    let Some(dgx) = fixture::prepare("nvidia-dgx-h100")? else { return Ok(()) };
    let Some(c) = Cluster::start(&Default::default())? else { return Ok(()) };
    c.install(&dgx.root, DRA_ONLY)?;
    c.wait_until("8 GPUs in the node's slices", Duration::from_secs(120), || {
        Ok((published(&c)?.len() == 8).then_some(()))
    })?;
    let sa =
        c.get_json(&["serviceaccounts", "-n", "kube-system", "-l", "app.kubernetes.io/instance=actk-device-plugin"])?;
    let sa = sa["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s["metadata"]["name"].as_str())
        .find(|n| n.ends_with("-dra"))
        .context("no DRA ServiceAccount")?
        .to_string();
    let user = format!("system:serviceaccount:kube-system:{sa}");
    // The policy is enforced once the API server has loaded it (a few seconds after install).
    let dir = tempfile::tempdir()?;
    let on_a = impersonating(&c, dir.path(), &user, Some("node-a"))?;
    let on_b = impersonating(&c, dir.path(), &user, Some("node-b"))?;
    let nowhere = impersonating(&c, dir.path(), &user, None)?;
    let slice = |name: &str, node: &str| {
        json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": name},
            "spec": {"driver": "actk.dev", "nodeName": node, "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                     "devices": [{"name": "probe-0"}]},
        })
        .to_string()
    };
    let kubectl_as = |kc: &std::path::Path, args: &[&str], stdin: Option<&str>| -> (bool, String) {
        let mut cmd = std::process::Command::new(c.env("KUBECTL"));
        cmd.arg("--kubeconfig").arg(kc).args(args);
        cmd.stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = cmd.spawn().expect("kubectl");
        if let Some(s) = stdin {
            child.stdin.take().unwrap().write_all(s.as_bytes()).unwrap();
        } else {
            drop(child.stdin.take());
        }
        let o = child.wait_with_output().unwrap();
        (o.status.success(), format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)))
    };
    // The admin (the cluster's own identity, not matched) makes node B's slice.
    for n in ["actk-guard-a", "actk-guard-b"] {
        c.kubectl(&["delete", "resourceslice", n, "--ignore-not-found"]);
    }
    c.apply(&slice("actk-guard-b", "node-b"))?;
    // Node A's driver: its own slice yes, B's no (create, update, delete), moving its own to B no.
    let denied = c.wait_until("the policy denies node A's driver node B's slice", Duration::from_secs(30), || {
        let (ok, out) = kubectl_as(&on_a, &["create", "-f", "-"], Some(&slice("actk-guard-b2", "node-b")));
        if ok {
            c.kubectl(&["delete", "resourceslice", "actk-guard-b2", "--ignore-not-found"]);
            return Ok(None);
        }
        Ok(Some(out))
    })?;
    assert!(
        denied.contains("ValidatingAdmissionPolicy") && denied.contains("may write only that node's ResourceSlices"),
        "{denied}"
    );
    assert!(denied.contains("node node-b's"), "{denied}");
    let (ok, out) = kubectl_as(&on_a, &["create", "-f", "-"], Some(&slice("actk-guard-a", "node-a")));
    assert!(ok, "node A's driver cannot create its own slice: {out}");
    let (ok, out) = kubectl_as(
        &on_a,
        &["apply", "--server-side", "--force-conflicts", "--field-manager=actk-test", "-f", "-"],
        Some(&slice("actk-guard-a", "node-b")),
    );
    // Refused before admission too: spec.nodeName and the pool are immutable.
    assert!(
        !ok && (out.contains("may write only") || out.contains("field is immutable")),
        "node A's driver moved its slice to node B: {out}"
    );
    let (ok, out) = kubectl_as(&on_a, &["label", "resourceslice", "actk-guard-b", "actk-test=touched"], None);
    assert!(!ok && out.contains("may write only"), "node A's driver updated node B's slice: {out}");
    let (ok, out) = kubectl_as(&on_a, &["delete", "resourceslice", "actk-guard-b"], None);
    assert!(!ok && out.contains("may write only"), "node A's driver deleted node B's slice: {out}");
    let (ok, out) = kubectl_as(&on_b, &["delete", "resourceslice", "actk-guard-b"], None);
    assert!(ok, "node B's driver cannot delete its own slice: {out}");
    let (ok, out) = kubectl_as(&nowhere, &["create", "-f", "-"], Some(&slice("actk-guard-b", "node-b")));
    assert!(!ok && out.contains("names no node"), "a token without a node wrote a slice: {out}");
    let (ok, out) = kubectl_as(&on_a, &["delete", "resourceslice", "actk-guard-a"], None);
    assert!(ok, "{out}");
    // The driver itself, with its pod-bound token, still publishes its node's pool after a restart.
    let ds = c.get_json(&["daemonsets", "-n", "kube-system", "-l", "app.kubernetes.io/component=dra-driver"])?["items"]
        [0]["metadata"]["name"]
        .as_str()
        .context("no DRA driver DaemonSet")?
        .to_string();
    let before: i64 = c.get_json(&["resourceslices"])?["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s["spec"]["pool"]["generation"].as_i64())
        .max()
        .unwrap_or(0);
    c.kubectl_ok(&["rollout", "restart", "daemonset", &ds, "-n", "kube-system"])?;
    c.kubectl_ok(&["rollout", "status", "daemonset", &ds, "-n", "kube-system", "--timeout=120s"])?;
    c.wait_until("the restarted driver publishes a newer generation", Duration::from_secs(120), || {
        let d = published(&c)?;
        let g = c.get_json(&["resourceslices"])?["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s["spec"]["pool"]["generation"].as_i64())
            .max()
            .unwrap_or(0);
        Ok((d.len() == 8 && g > before).then_some(()))
    })
    .map_err(|e| anyhow::anyhow!("{e}; driver log:\n{}", c.plugin_logs()))?;
    Ok(())
}

/// Issue 26, bad input: a DeviceClass whose CEL reads an attribute no device has, and a pod
/// asking for an extended resource that nothing serves and no class maps. Each pod stays
/// Pending with the scheduler's reason naming the problem.
#[test]
#[ignore = "needs the test cluster: make test runs it alone"]
fn dra_bad_input_is_told_by_the_scheduler() -> Result<()> {
    let Some(dgx) = fixture::prepare("nvidia-dgx-h100")? else { return Ok(()) };
    let Some(c) = Cluster::start(&Default::default())? else { return Ok(()) };
    c.install(&dgx.root, DRA_ONLY)?;
    c.wait_until("8 GPUs in the node's slices", Duration::from_secs(120), || {
        Ok((published(&c)?.len() == 8).then_some(()))
    })?;
    c.kubectl(&["delete", "deviceclass", "actk-test-typo", "--ignore-not-found"]);
    c.apply(
        &json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": "actk-test-typo"},
            "spec": {"selectors": [{"cel": {"expression": "device.driver == \"actk.dev\" && device.attributes[\"actk.dev\"].modle == \"H100\""}}]},
        })
        .to_string(),
    )?;
    c.kubectl(&["delete", "resourceclaim", "typo", "-n", TEST_NAMESPACE, "--ignore-not-found"]);
    c.apply(
        &json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "typo", "namespace": TEST_NAMESPACE},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "actk-test-typo"}}]}},
        })
        .to_string(),
    )?;
    c.delete_pod("bad-cel")?;
    let mut pod = PodSpec::new("bad-cel", "true").manifest();
    pod["spec"]["resourceClaims"] = json!([{"name": "gpu", "resourceClaimName": "typo"}]);
    pod["spec"]["containers"][0]["resources"] = json!({"claims": [{"name": "gpu"}]});
    c.apply(&pod.to_string())?;
    // A CEL runtime error is a scheduling error (not "Unschedulable"): the pod's PodScheduled
    // condition or its FailedScheduling event carries the scheduler's message.
    let why = c.wait_until("the scheduler's reason for pod bad-cel", Duration::from_secs(90), || {
        let p = c.pod("bad-cel")?;
        ensure!(p["status"]["phase"] == "Pending", "pod bad-cel left Pending: {}", p["status"]);
        let mut told: Vec<String> = p["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|c| c["type"] == "PodScheduled" && c["status"] == "False")
            .map(|c| format!("{}: {}", c["reason"].as_str().unwrap_or(""), c["message"].as_str().unwrap_or("")))
            .collect();
        told.extend(c.events(TEST_NAMESPACE, "bad-cel")?);
        Ok(told.into_iter().find(|m| m.contains("modle")))
    })?;
    assert!(why.contains("actk-test-typo"), "the scheduler's reason names the class: {why}");
    eprintln!("bad CEL: {why}");
    c.delete_pod("bad-cel")?;
    c.kubectl(&["delete", "resourceclaim", "typo", "-n", TEST_NAMESPACE, "--ignore-not-found"]);
    c.kubectl(&["delete", "deviceclass", "actk-test-typo", "--ignore-not-found"]);

    c.delete_pod("bad-resource")?;
    c.create_pod(&PodSpec::new("bad-resource", "true").limit("example.com/no-such-accelerator", 1))?;
    let why = c.unschedulable("bad-resource")?;
    assert!(why.contains("example.com/no-such-accelerator"), "the scheduler's reason: {why}");
    eprintln!("unmapped extended resource: {why}");
    c.delete_pod("bad-resource")?;
    Ok(())
}

/// A pod in `ns` whose container `c` holds the claim of template `template` and sleeps.
fn template_pod(ns: &str, name: &str, template: &str) -> Value {
    let mut pod = PodSpec::new(name, "ls /dev; sleep 600").manifest();
    pod["metadata"]["namespace"] = json!(ns);
    pod["spec"]["resourceClaims"] = json!([{"name": "gpus", "resourceClaimTemplateName": template}]);
    pod["spec"]["containers"][0]["resources"] = json!({"claims": [{"name": "gpus"}]});
    pod
}

/// The allocation results (`request`, `device`) of the claim pod `name` in `ns` got from its template.
fn results_of(c: &Cluster, ns: &str, name: &str) -> Result<Vec<(String, String)>> {
    let p = c.get_json(&["pod", name, "-n", ns])?;
    let claim = p["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
        .as_str()
        .with_context(|| format!("pod {name} has no claim yet: {}", p["status"]))?
        .to_string();
    let cl = c.get_json(&["resourceclaim", &claim, "-n", ns])?;
    Ok(cl["status"]["allocation"]["devices"]["results"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| (r["request"].as_str().unwrap_or("").to_string(), r["device"].as_str().unwrap_or("").to_string()))
        .collect())
}

/// Issue 26: the chart's examples (deploy/kubernetes/actk-dra-examples.yaml) on the node
/// fixtures, as the scheduler places them: "two H100, else four A100" gets two H100 on the DGX
/// H100 and four A100 on the DGX A100 (its MIG-mode GPUs left out); "NVIDIA, else AMD" gets the
/// NVIDIA GPU on the heterogeneous node and the AMD GPU on the MI300X; the admin-access
/// monitoring claim sees all eight H100 while another pod holds two. PrioritizedList and
/// DRAAdminAccess are beta and on in 1.34, GA in 1.36: both versions.
#[test]
#[ignore = "needs the test cluster: make test runs it alone"]
fn dra_first_available_and_admin_access_on_fixtures() -> Result<()> {
    let Some(c) = Cluster::start(&Default::default())? else { return Ok(()) };
    let values = "devicePlugin:\n  enabled: false\ndra:\n  enabled: true\n  profiles: [nvidia, amd]\n";
    let examples = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/kubernetes/actk-dra-examples.yaml"),
    )?;
    type Ready = fn(&[Value]) -> bool;
    let cases: [(&str, &str, &str, usize, Ready); 4] = [
        ("nvidia-dgx-h100", "two-h100-else-four-a100", "gpus/h100", 2, |d| {
            d.len() == 8
                && d.iter()
                    .all(|x| x["attributes"]["model"]["string"].as_str().is_some_and(|m| m.starts_with("NVIDIA H100")))
        }),
        ("nvidia-dgx-a100", "two-h100-else-four-a100", "gpus/a100", 4, |d| {
            // The eight GPUs (the MIG devices of those in MIG mode are devices too).
            let d: Vec<&Value> = d.iter().filter(|x| x["attributes"]["migProfile"].is_null()).collect();
            d.len() == 8
                && d.iter()
                    .all(|x| x["attributes"]["model"]["string"].as_str().is_some_and(|m| m.starts_with("NVIDIA A100")))
        }),
        ("hetero-nvidia-neuron", "nvidia-else-amd", "gpu/nvidia", 1, |d| {
            !d.is_empty() && d.iter().all(|x| x["attributes"]["kind"]["string"] == "nvidia.com/gpu")
        }),
        ("amd-mi300x", "nvidia-else-amd", "gpu/amd", 1, |d| {
            !d.is_empty() && d.iter().all(|x| x["attributes"]["kind"]["string"] == "amd.com/gpu")
        }),
    ];
    let mut seen = vec![];
    for (fx, template, want, count, ready) in cases {
        let Some(f) = fixture::prepare(fx)? else { return Ok(()) };
        c.install(&f.root, values)?;
        c.wait_until(&format!("the {fx} devices in the node's slices"), Duration::from_secs(120), || {
            let d = published(&c)?;
            Ok(ready(&d).then_some(()))
        })
        .map_err(|e| anyhow::anyhow!("{e}; driver log:\n{}", c.plugin_logs()))?;
        c.apply(&examples)?;
        let pod = format!("fa-{}", fx.replace('_', "-"));
        c.delete_pod(&pod)?;
        c.apply(&template_pod(TEST_NAMESPACE, &pod, template).to_string())?;
        c.wait_pod_phase(&pod, &["Running"], Duration::from_secs(120)).map_err(|e| {
            let events = c.events(TEST_NAMESPACE, &pod).unwrap_or_default();
            anyhow::anyhow!("{e}; events: {events:#?}; driver log:\n{}", c.plugin_logs())
        })?;
        let got = results_of(&c, TEST_NAMESPACE, &pod)?;
        ensure!(
            got.len() == count && got.iter().all(|(r, _)| r == want),
            "{fx}: {template} should give {count} device(s) of {want}, got {got:?}"
        );
        if fx == "nvidia-dgx-h100" {
            // Admin access: the monitoring claim sees all eight while this pod holds two.
            let admin = template_pod("gpu-monitoring", "fa-monitor", "monitor-all-gpus");
            let _ = c.kubectl(&[
                "delete",
                "pod",
                "fa-monitor",
                "-n",
                "gpu-monitoring",
                "--ignore-not-found",
                "--wait=true",
            ]);
            if c.kube_version() >= (1, 35) {
                // Sharing is published (dra.sharing auto): the allocator checks the admin
                // claim against what the two held GPUs consumed and places nothing
                // (kubernetes/kubernetes#140729; docs/sharing.md). When this stops failing
                // to place, the fault is fixed upstream: update docs/sharing.md.
                c.apply(&admin.to_string())?;
                let told = c.wait_until("the monitoring pod refused for capacity", Duration::from_secs(60), || {
                    let events = c.events("gpu-monitoring", "fa-monitor")?;
                    let p = c.get_json(&["pod", "fa-monitor", "-n", "gpu-monitoring"])?;
                    ensure!(p["status"]["phase"] != "Running", "it runs: the upstream fault is fixed; {events:#?}");
                    Ok(events.iter().any(|e| e.contains("cannot allocate all claims")).then_some(()))
                });
                told.map_err(|e| anyhow::anyhow!("{e}; driver log:\n{}", c.plugin_logs()))?;
                let _ = c.kubectl(&["delete", "pod", "fa-monitor", "-n", "gpu-monitoring", "--wait=true"]);
                // The documented workaround: no sharing on a node monitored by admin access.
                // The held GPUs' claim goes too: its allocation consumed their capacity, which
                // the allocator counts as long as the claim exists.
                c.delete_pod(&pod)?;
                c.install(&f.root, &format!("{values}  sharing: false\n"))?;
                c.wait_until("the GPUs published without sharing", Duration::from_secs(120), || {
                    let d = published(&c)?;
                    Ok((d.len() == 8 && d.iter().all(|x| x["allowMultipleAllocations"].as_bool() != Some(true)))
                        .then_some(()))
                })
                .map_err(|e| anyhow::anyhow!("{e}; driver log:\n{}", c.plugin_logs()))?;
                c.apply(&template_pod(TEST_NAMESPACE, &pod, template).to_string())?;
                c.wait_pod_phase(&pod, &["Running"], Duration::from_secs(120))?;
                ensure!(results_of(&c, TEST_NAMESPACE, &pod)?.len() == count, "{fx}: {template} again");
            }
            c.apply(&admin.to_string())?;
            c.wait_until("the monitoring pod runs", Duration::from_secs(120), || {
                let p = c.get_json(&["pod", "fa-monitor", "-n", "gpu-monitoring"])?;
                Ok((p["status"]["phase"] == "Running").then_some(()))
            })
            .map_err(|e| {
                let events = c.events("gpu-monitoring", "fa-monitor").unwrap_or_default();
                anyhow::anyhow!("{e}; events: {events:#?}; driver log:\n{}", c.plugin_logs())
            })?;
            let dev = c.kubectl_ok(&["logs", "fa-monitor", "-n", "gpu-monitoring"])?;
            let gpus = dev
                .split_whitespace()
                .filter(|d| d.strip_prefix("nvidia").is_some_and(|n| n.parse::<u32>().is_ok()))
                .count();
            ensure!(gpus == 8, "the monitoring pod sees {gpus} GPUs:\n{dev}");
            let _ = c.kubectl(&["delete", "pod", "fa-monitor", "-n", "gpu-monitoring", "--wait=true"]);
        }
        c.delete_pod(&pod)?;
        seen.push(format!("{fx}: {want} x{count}"));
    }
    eprintln!("firstAvailable on fixtures: {}", seen.join("; "));
    Ok(())
}

/// The one-GPU claim template `name` of class actk-nvidia, and a pod `pod` holding a claim
/// from it in its container `c` (which sleeps).
fn one_gpu_claim_pod(pod: &str, template: &str) -> Value {
    let mut p = PodSpec::new(pod, "exec sleep 3600").manifest();
    p["spec"]["resourceClaims"] = json!([{"name": "gpu", "resourceClaimTemplateName": template}]);
    p["spec"]["containers"][0]["resources"] = json!({"claims": [{"name": "gpu"}]});
    p
}

/// The GPU nodes (`/dev/nvidiaN`) pod `pod` sees, and its claim's name and UID.
fn held_gpus(c: &Cluster, pod: &str) -> Result<(Vec<String>, String, String)> {
    let dev = c.exec(pod, &["ls", "/dev"])?;
    let gpus: Vec<String> = dev
        .split_whitespace()
        .filter(|n| n.strip_prefix("nvidia").is_some_and(|r| !r.is_empty() && r.bytes().all(|b| b.is_ascii_digit())))
        .map(str::to_string)
        .collect();
    let p = c.pod(pod)?;
    let claim = p["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
        .as_str()
        .with_context(|| format!("pod {pod} names no claim: {}", p["status"]))?
        .to_string();
    let uid = c.get_json(&["resourceclaim", &claim, "-n", TEST_NAMESPACE])?["metadata"]["uid"]
        .as_str()
        .context("claim without uid")?
        .to_string();
    Ok((gpus, claim, uid))
}

/// The container of pod `pod`: its ID and restart count.
fn container_identity(c: &Cluster, pod: &str) -> Result<(String, i64)> {
    let s = &c.pod(pod)?["status"]["containerStatuses"][0];
    Ok((s["containerID"].as_str().unwrap_or_default().to_string(), s["restartCount"].as_i64().unwrap_or(-1)))
}

/// Issue 26, "roll the driver under a running claim": a pod holds a one-GPU claim while the
/// DRA driver's DaemonSet is rolled by a `helm upgrade` that changes the driver's pod template
/// (its CPU request). The pod keeps running in the same container (same ID, no
/// restart) and keeps its GPU (the same `/dev/nvidiaN`, the claim still reserved for it, its
/// CDI spec still on the node). A claim created while the roll runs and one created after it
/// are prepared by the driver and their pods run with a GPU of their own. Deleting the first
/// pod then unprepares its claim through the new driver: its CDI spec is removed.
/// (dra_told's rollout test creates claims throughout a `rollout restart`; this one holds one
/// across a Helm upgrade, as an admin upgrading the chart does.)
#[test]
#[ignore = "needs the test cluster: make test runs it alone"]
fn dra_roll_the_driver_under_a_running_claim() -> Result<()> {
    let Some(dgx) = fixture::prepare("nvidia-dgx-h100")? else { return Ok(()) };
    let Some(c) = Cluster::start(&Default::default())? else { return Ok(()) };
    c.install(&dgx.root, DRA_ONLY)?;
    c.wait_until("8 GPUs in the node's slices", Duration::from_secs(120), || {
        Ok((published(&c)?.len() == 8).then_some(()))
    })?;
    let tmpl = json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "roll-held", "namespace": TEST_NAMESPACE},
        "spec": {"spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": "actk-nvidia", "count": 1}}
        ]}}}
    });
    c.apply(&tmpl.to_string())?;
    let pods = ["roll-held", "roll-during", "roll-after"];
    for p in pods {
        c.delete_pod(p)?;
    }
    c.apply(&one_gpu_claim_pod("roll-held", "roll-held").to_string())?;
    c.wait_pod_phase("roll-held", &["Running"], Duration::from_secs(120))
        .map_err(|e| anyhow::anyhow!("{e}; driver log:\n{}", c.plugin_logs()))?;
    let (gpus, claim, uid) = held_gpus(&c, "roll-held")?;
    ensure!(gpus.len() == 1, "the held pod sees one GPU: {gpus:?}");
    let before = container_identity(&c, "roll-held")?;
    let spec = std::path::Path::new(c.env("CDI_DIR")).join(format!("actk.dev-claim_{uid}.json"));
    ensure!(spec.is_file(), "{} missing while the pod runs", spec.display());

    let driver_pods = |c: &Cluster| -> Result<Vec<String>> {
        let l = c.get_json(&["pods", "-n", "kube-system", "-l", "app.kubernetes.io/name=actk-dra-driver"])?;
        Ok(l["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| p["metadata"]["uid"].as_str().map(str::to_string))
            .collect())
    };
    let old_driver = driver_pods(&c)?;
    ensure!(old_driver.len() == 1, "one driver pod before the roll: {old_driver:?}");
    let ds = c.get_json(&["daemonsets", "-n", "kube-system", "-l", "app.kubernetes.io/component=dra-driver"])?["items"]
        [0]["metadata"]["name"]
        .as_str()
        .context("no DRA driver DaemonSet")?
        .to_string();

    // The upgrade: the driver's pod template changes (its CPU request; not dra.extraEnv, a
    // list the test cluster's own values fill with the API server's address), so the DaemonSet
    // rolls it (a surge: the new pod registers beside the old one, which stops once the new one
    // is ready).
    let upgraded = format!("{DRA_ONLY}  resources:\n    requests:\n      cpu: 11m\n");
    c.install_no_wait(&dgx.root, &upgraded)?;
    c.apply(&one_gpu_claim_pod("roll-during", "roll-held").to_string())?;
    c.kubectl_ok(&["rollout", "status", "daemonset", &ds, "-n", "kube-system", "--timeout=180s"])?;
    c.wait_until("the old driver pod gone", Duration::from_secs(120), || {
        let now = driver_pods(&c)?;
        Ok((now.len() == 1 && !now.iter().any(|u| old_driver.contains(u))).then_some(()))
    })?;
    c.apply(&one_gpu_claim_pod("roll-after", "roll-held").to_string())?;
    let mut seen = vec![gpus[0].clone()];
    for p in ["roll-during", "roll-after"] {
        c.wait_pod_phase(p, &["Running"], Duration::from_secs(120))
            .map_err(|e| anyhow::anyhow!("{e}; driver log:\n{}", c.plugin_logs()))?;
        let (g, _, _) = held_gpus(&c, p)?;
        ensure!(g.len() == 1 && !seen.contains(&g[0]), "{p} sees {g:?}; GPUs of the pods before: {seen:?}");
        seen.push(g[0].clone());
    }

    // The held pod: same container, same GPU, its claim still reserved for it, its spec kept.
    assert_eq!(container_identity(&c, "roll-held")?, before, "the held pod's container was replaced or restarted");
    let (after, claim_after, _) = held_gpus(&c, "roll-held")?;
    assert_eq!((&after, &claim_after), (&gpus, &claim), "the held pod's GPU or claim changed across the roll");
    let rc = c.get_json(&["resourceclaim", &claim, "-n", TEST_NAMESPACE])?;
    let reserved = rc["status"]["reservedFor"].as_array().cloned().unwrap_or_default();
    ensure!(
        reserved.iter().any(|r| r["name"] == "roll-held"),
        "claim {claim} no longer reserved for the pod: {}",
        rc["status"]
    );
    ensure!(spec.is_file(), "{} removed by the roll while its pod runs", spec.display());

    // The new driver unprepares the old claim when its pod goes.
    c.delete_pod("roll-held")?;
    c.wait_until("the held claim's CDI spec removed", Duration::from_secs(60), || Ok((!spec.exists()).then_some(())))
        .map_err(|e| anyhow::anyhow!("{e}; driver log:\n{}", c.plugin_logs()))?;
    for p in pods {
        c.delete_pod(p)?;
    }
    c.kubectl(&["delete", "resourceclaimtemplate", "roll-held", "-n", TEST_NAMESPACE, "--ignore-not-found"]);
    Ok(())
}

/// GPU 4's MIG devices in the NVML double's state (what `nvidia-smi -L` would list): (GPU
/// instance profile id, first memory slice), sorted.
fn gpu4_migs(root: &std::path::Path) -> Result<Vec<(u64, u64)>> {
    let state = actk_testsupport::nvml_double::State::of(root)?;
    let mut out = Vec::new();
    for m in state.migs(4) {
        let gi = state.gi(4, m.num("gi")).with_context(|| format!("no gi record for {}", m.get("uuid")))?;
        out.push((gi.num("profile_id"), gi.num("start")));
    }
    out.sort_unstable();
    Ok(out)
}

/// Makes the DRA driver's view of the host root writable (a `kubectl patch` of its
/// DaemonSet, then the rollout): on the simulated node the NVML double keeps the MIG instances
/// it makes in files of the fixture root (its state file, the capability access files), where
/// a real node keeps them in the kernel driver. The chart never mounts the root writable.
fn writable_root_for_the_nvml_double(c: &Cluster) -> Result<()> {
    let list = c.get_json(&["daemonsets", "-n", "kube-system", "-l", "app.kubernetes.io/component=dra-driver"])?;
    let ds = &list["items"][0];
    let name = ds["metadata"]["name"].as_str().context("no DRA driver DaemonSet")?.to_string();
    let mounts =
        ds["spec"]["template"]["spec"]["containers"][0]["volumeMounts"].as_array().cloned().unwrap_or_default();
    let i = mounts.iter().position(|m| m["name"] == "host-root").context("no host-root mount")?;
    let at = format!("/spec/template/spec/containers/0/volumeMounts/{i}");
    let mut ops = vec![json!({"op": "replace", "path": format!("{at}/readOnly"), "value": false})];
    if !mounts[i]["recursiveReadOnly"].is_null() {
        ops.insert(0, json!({"op": "remove", "path": format!("{at}/recursiveReadOnly")}));
    }
    c.kubectl_ok(&[
        "patch",
        "daemonset",
        &name,
        "-n",
        "kube-system",
        "--type=json",
        "-p",
        &Value::from(ops).to_string(),
    ])?;
    c.kubectl_ok(&["rollout", "status", "daemonset", &name, "-n", "kube-system", "--timeout=180s"])?;
    Ok(())
}

/// Issue 27, dynamic MIG (KEP-4815 partitionable devices) on the DGX A100 fixture with GPU 4
/// put in MIG mode and left empty (`nvidia-smi -i 4 -mig 1`), the chart's `dra.dynamicMig`
/// on. Where the API server keeps shared counters (1.36+): GPU 4 offers its 25 placements
/// over the counter set of its 8 memory slices; two pods claiming a 3g.40gb of GPU 4 each get
/// one, made at prepare (the NVML double's state lists them) and seen in the container as
/// the GPU's node and the two capability nodes; a third stays Pending (no placement left that
/// does not overlap); deleting a pod destroys its MIG device and the third gets the freed
/// placement; a 4g.40gb, which overlaps the 3g.40gb at 0, waits; with every pod gone GPU 4 is
/// empty again. On 1.34 (the gate is alpha and off)
/// the driver says the API server drops shared counters and offers no placement.
#[test]
#[ignore = "needs the test cluster: make test runs it alone"]
fn dra_dynamic_mig_devices_are_made_for_their_pods_and_destroyed_with_them() -> Result<()> {
    let Some(a100) = fixture::prepare("nvidia-dgx-a100")? else { return Ok(()) };
    actk_testsupport::nvml_double::enable_mig(&a100.root, 4)?;
    let Some(c) = Cluster::start(&Default::default())? else { return Ok(()) };
    c.install(&a100.root, &format!("{DRA_ONLY}  dynamicMig: true\n"))?;
    let is_placement = |d: &Value| d["attributes"]["dynamicMig"]["bool"] == true;
    if c.kube_version() < (1, 36) {
        c.wait_until("the driver's word on shared counters", Duration::from_secs(120), || {
            Ok(c.plugin_logs().contains("--dynamic-mig is set but the API server drops shared counters").then_some(()))
        })?;
        let devices = c.wait_until("the pool", Duration::from_secs(60), || {
            let d = published(&c)?;
            Ok((!d.is_empty()).then_some(d))
        })?;
        ensure!(!devices.iter().any(is_placement), "placements offered without shared counters");
        eprintln!("Kubernetes {:?}: shared counters dropped; dynamic MIG is 1.36+", c.kube_version());
        return Ok(());
    }
    writable_root_for_the_nvml_double(&c)?;
    let placements = c
        .wait_until("GPU 4's placements", Duration::from_secs(120), || {
            let p: Vec<Value> = published(&c)?
                .into_iter()
                .filter(|d| is_placement(d) && d["attributes"]["parentIndex"]["int"] == 4)
                .collect();
            Ok((p.len() == 25).then_some(p))
        })
        .map_err(|e| anyhow::anyhow!("{e}; driver log:\n{}", c.plugin_logs()))?;
    let three: Vec<&str> = placements
        .iter()
        .filter(|d| d["attributes"]["migProfile"]["string"] == "3g.40gb")
        .filter_map(|d| d["name"].as_str())
        .collect();
    assert_eq!(three, ["nvidia-4-mig-3g-40gb-0", "nvidia-4-mig-3g-40gb-4"]);
    // The counter set, in a slice of its own, as the API server stored it.
    let slices = c.get_json(&["resourceslices"])?;
    let set = slices["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| s["spec"]["nodeName"] == c.node_name())
        .flat_map(|s| s["spec"]["sharedCounters"].as_array().cloned().unwrap_or_default())
        .find(|s| s["name"] == "nvidia-4-slices")
        .context("no counter set nvidia-4-slices")?;
    let memory_slices =
        set["counters"].as_object().map_or(0, |m| m.keys().filter(|k| k.starts_with("memory-slice-")).count());
    assert_eq!(memory_slices, 8, "{set}");
    ensure!(gpu4_migs(&a100.root)?.is_empty(), "GPU 4 starts empty");

    c.kubectl(&["delete", "resourceclaimtemplate", "dyn-3g", "-n", TEST_NAMESPACE, "--ignore-not-found"]);
    c.apply(
        &json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "dyn-3g", "namespace": TEST_NAMESPACE},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "actk-nvidia-mig",
                "selectors": [{"cel": {"expression":
                    "device.attributes[\"actk.dev\"].migProfile == \"3g.40gb\" && device.attributes[\"actk.dev\"].parentIndex == 4"}}]
            }}]}}}
        })
        .to_string(),
    )?;
    let pods = ["dyn-a", "dyn-b", "dyn-c"];
    for p in pods {
        c.delete_pod(p)?;
    }
    for p in &pods[..2] {
        c.apply(&one_gpu_claim_pod(p, "dyn-3g").to_string())?;
    }
    let mut held = Vec::new();
    for p in &pods[..2] {
        c.wait_pod_phase(p, &["Running"], Duration::from_secs(120))
            .map_err(|e| anyhow::anyhow!("{e}; driver log:\n{}", c.plugin_logs()))?;
        let (gpus, claim, _) = held_gpus(&c, p)?;
        assert_eq!(gpus, ["nvidia4"], "{p}");
        let caps = c.exec(p, &["ls", "/dev/nvidia-caps"])?;
        assert_eq!(caps.split_whitespace().count(), 2, "{p}: the GI and CI capability nodes:\n{caps}");
        let cl = c.get_json(&["resourceclaim", &claim, "-n", TEST_NAMESPACE])?;
        held.push(
            cl["status"]["allocation"]["devices"]["results"][0]["device"].as_str().unwrap_or_default().to_string(),
        );
    }
    held.sort();
    assert_eq!(held, ["nvidia-4-mig-3g-40gb-0", "nvidia-4-mig-3g-40gb-4"], "two placements that do not overlap");
    // 3g.40gb is profile id 9 on the A100 (nvidia-smi mig -lgip).
    assert_eq!(gpu4_migs(&a100.root)?, [(9, 0), (9, 4)], "made at prepare");
    c.apply(&one_gpu_claim_pod("dyn-c", "dyn-3g").to_string())?;
    let why = c.unschedulable("dyn-c")?;
    ensure!(why.contains("cannot allocate all claims"), "{why}");
    c.delete_pod("dyn-a")?;
    c.wait_pod_phase("dyn-c", &["Running"], Duration::from_secs(120))
        .map_err(|e| anyhow::anyhow!("{e}; driver log:\n{}", c.plugin_logs()))?;
    assert_eq!(gpu4_migs(&a100.root)?.len(), 2, "dyn-a's destroyed, dyn-c's made");
    // A 4g.40gb (memory slices 0-3) overlaps the 3g.40gb at 0: never allocated beside it.
    let four_g = json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "dyn-4g", "namespace": TEST_NAMESPACE},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "actk-nvidia-mig",
            "selectors": [{"cel": {"expression":
                "device.attributes[\"actk.dev\"].migProfile == \"4g.40gb\" && device.attributes[\"actk.dev\"].parentIndex == 4"}}]
        }}]}}}
    });
    c.kubectl(&["delete", "resourceclaimtemplate", "dyn-4g", "-n", TEST_NAMESPACE, "--ignore-not-found"]);
    c.apply(&four_g.to_string())?;
    c.delete_pod("dyn-4g")?;
    c.apply(&one_gpu_claim_pod("dyn-4g", "dyn-4g").to_string())?;
    let why = c.unschedulable("dyn-4g")?;
    ensure!(why.contains("cannot allocate all claims"), "{why}");
    c.delete_pod("dyn-4g")?;
    c.kubectl(&["delete", "resourceclaimtemplate", "dyn-4g", "-n", TEST_NAMESPACE, "--ignore-not-found"]);
    assert_eq!(gpu4_migs(&a100.root)?.len(), 2, "nothing made for the waiting 4g.40gb");
    for p in ["dyn-b", "dyn-c"] {
        c.delete_pod(p)?;
    }
    c.wait_until("GPU 4 empty again", Duration::from_secs(60), || Ok(gpu4_migs(&a100.root)?.is_empty().then_some(())))
        .map_err(|e| anyhow::anyhow!("{e}; driver log:\n{}", c.plugin_logs()))?;
    c.kubectl(&["delete", "resourceclaimtemplate", "dyn-3g", "-n", TEST_NAMESPACE, "--ignore-not-found"]);
    Ok(())
}
