//! Issue 27 on the real single-node cluster: claims that share a device through consumable
//! capacity (KEP-5075, `allowMultipleAllocations` and capacity `requestPolicy`; feature gate
//! `DRAConsumableCapacity`, alpha in 1.34, so this test starts the cluster with the gate on and
//! the next test without it starts it again as before; beta and on by default from 1.36).
//!
//! - A quarter of GPU 0 by `memory`: four pods whose claims each request a quarter of GPU 0's
//!   published memory all run on GPU 0 (each container sees /dev/nvidia0 and no other GPU); a
//!   fifth stays Pending with the scheduler's reason; the driver restarts with the four
//!   prepared, then deleting one pod unprepares only its claim (the others keep their CDI
//!   specs and run on) and lets the fifth run.
//! - NeuronCores: two pods claiming one core each of the same inf2 device run on that device
//!   with disjoint `NEURON_RT_VISIBLE_CORES`.
//!
//! `#[ignore]`d like every cluster test: `make test-k8s` runs them alone, one at a time.

use actk_testsupport::cluster::{Cluster, PodSpec, StartOptions, TEST_NAMESPACE};
use actk_testsupport::fixture;
use anyhow::{Context, Result, ensure};
use serde_json::{Value, json};
use std::time::Duration;

/// The DRA driver alone, for the profiles named, consumable capacity published whatever the
/// version (`auto` leaves it out on 1.34, kubernetes/kubernetes#133705; these claims each
/// select one device, which that version allocates right).
fn dra_only(profiles: &str) -> String {
    format!("devicePlugin:\n  enabled: false\ndra:\n  enabled: true\n  sharing: true\n  profiles: [{profiles}]\n")
}

/// The cluster with consumable capacity served (the gate where it is not on by default).
fn start() -> Result<Option<Cluster>> {
    let version = std::env::var("ACTK_KUBE_VERSION").unwrap_or_default();
    let before_beta = actk_testsupport::cluster::parse_minor(&version).is_none_or(|v| v < (1, 36));
    let opts = StartOptions {
        feature_gates: before_beta.then(|| "DRAConsumableCapacity=true".to_string()),
        ..Default::default()
    };
    Cluster::start(&opts)
}

/// Claim template `name`: one device of class `class` whose index is `index`, consuming
/// `amount` of capacity `capacity`.
fn template(name: &str, class: &str, index: u32, capacity: &str, amount: &str) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": TEST_NAMESPACE},
        "spec": {"spec": {"devices": {"requests": [{"name": "part", "exactly": {
            "deviceClassName": class,
            "selectors": [{"cel": {"expression": format!("device.attributes[\"actk.dev\"].index == {index}")}}],
            "capacity": {"requests": {capacity: amount}}
        }}]}}}
    })
}

/// A pod holding a claim from `template` in its container, which runs `cmd` then sleeps.
fn pod(name: &str, template: &str, cmd: &str) -> Value {
    let mut p = PodSpec::new(name, &format!("{cmd}; exec sleep 3600")).manifest();
    p["spec"]["resourceClaims"] = json!([{"name": "part", "resourceClaimTemplateName": template}]);
    p["spec"]["containers"][0]["resources"] = json!({"claims": [{"name": "part"}]});
    p
}

/// The allocation results of pod `name`'s claim: (device, shareID, consumed capacity).
fn results(c: &Cluster, name: &str) -> Result<Vec<(String, Option<String>, Value)>> {
    let p = c.pod(name)?;
    let claim = p["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
        .as_str()
        .with_context(|| format!("pod {name} has no claim yet: {}", p["status"]))?
        .to_string();
    let cl = c.get_json(&["resourceclaim", &claim, "-n", TEST_NAMESPACE])?;
    Ok(cl["status"]["allocation"]["devices"]["results"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            (
                r["device"].as_str().unwrap_or_default().to_string(),
                r["shareID"].as_str().map(str::to_string),
                r["consumedCapacity"].clone(),
            )
        })
        .collect())
}

fn run(c: &Cluster, name: &str) -> Result<()> {
    c.wait_pod_phase(name, &["Running"], Duration::from_secs(120)).map_err(|e| {
        let events = c.events(TEST_NAMESPACE, name).unwrap_or_default();
        anyhow::anyhow!("{e}; events: {events:#?}; driver log:\n{}", c.plugin_logs())
    })?;
    Ok(())
}

/// The UID of pod `name`'s claim.
fn claim_uid(c: &Cluster, name: &str) -> Result<String> {
    let p = c.pod(name)?;
    let claim = p["status"]["resourceClaimStatuses"][0]["resourceClaimName"].as_str().context("no claim")?.to_string();
    let cl = c.get_json(&["resourceclaim", &claim, "-n", TEST_NAMESPACE])?;
    Ok(cl["metadata"]["uid"].as_str().context("claim without uid")?.to_string())
}

/// What the container of pod `name` printed first: its `ls /dev` and env lines.
fn view(c: &Cluster, name: &str) -> Result<String> {
    c.kubectl_ok(&["logs", name, "-n", TEST_NAMESPACE])
}

#[test]
#[ignore = "needs the test cluster: make test runs it alone"]
fn dra_quarters_of_a_gpu_by_memory_and_neuron_cores_by_count() -> Result<()> {
    let Some(dgx) = fixture::prepare("nvidia-dgx-h100")? else { return Ok(()) };
    let Some(c) = start()? else { return Ok(()) };
    let pods = ["q1", "q2", "q3", "q4", "q5", "nc1", "nc2"];
    for p in pods {
        c.delete_pod(p)?;
    }
    c.install(&dgx.root, &dra_only("nvidia"))?;
    let devices = c.wait_until("8 GPUs in the node's slices", Duration::from_secs(120), || {
        let d = c.published_devices("actk.dev")?;
        Ok((d.len() == 8).then_some(d))
    })?;
    let gpu0 = devices.iter().find(|d| d["name"] == "nvidia-0").context("no nvidia-0")?;
    ensure!(
        gpu0["allowMultipleAllocations"] == true,
        "the API server dropped allowMultipleAllocations (is DRAConsumableCapacity on?): {gpu0}"
    );
    let memory = &gpu0["capacity"]["memory"];
    let total = memory["value"].as_str().context("no memory capacity")?;
    assert_eq!(memory["requestPolicy"]["default"], total, "{gpu0}");
    let mib: u64 = total.strip_suffix("Mi").context("memory not in Mi")?.parse()?;
    let quarter = format!("{}Mi", mib / 4);
    c.apply(&template("quarter-gpu0", "actk-nvidia", 0, "memory", &quarter).to_string())?;
    let gpus = r#"ls /dev | grep -E '^nvidia[0-9]+$'; env | grep -E '^(NVIDIA_VISIBLE_DEVICES|CUDA_MPS)' || true"#;
    for p in &pods[..4] {
        c.apply(&pod(p, "quarter-gpu0", gpus).to_string())?;
    }
    for p in &pods[..4] {
        run(&c, p)?;
        let r = results(&c, p)?;
        ensure!(r.len() == 1 && r[0].0 == "nvidia-0" && r[0].1.is_some(), "{p}: {r:?}");
        assert_eq!(r[0].2["memory"], quarter.as_str(), "{p}: {r:?}");
        let v = view(&c, p)?;
        let seen: Vec<&str> = v.lines().filter(|l| l.starts_with("nvidia")).collect();
        assert_eq!(seen, ["nvidia0"], "{p} sees:\n{v}");
        assert!(v.lines().any(|l| l == "NVIDIA_VISIBLE_DEVICES=void"), "{p}:\n{v}");
    }
    // Distinct claims, distinct shares of one device.
    let shares: std::collections::BTreeSet<String> =
        pods[..4].iter().map(|p| results(&c, p).map(|r| r[0].1.clone().unwrap_or_default())).collect::<Result<_>>()?;
    assert_eq!(shares.len(), 4, "{shares:?}");
    c.apply(&pod("q5", "quarter-gpu0", gpus).to_string())?;
    let why = c.unschedulable("q5")?;
    eprintln!("the fifth quarter waits: {why}");
    ensure!(why.contains("cannot allocate all claims") || why.contains("resource"), "{why}");
    // The driver restarts with the four shared claims prepared. Then one pod goes: its claim is
    // unprepared (its spec removed, by the new driver); the other three claims keep their
    // specs and their pods run on; the fifth gets the freed quarter.
    let uids: Vec<String> = pods[..4].iter().map(|p| claim_uid(&c, p)).collect::<Result<_>>()?;
    let spec = |uid: &str| std::path::Path::new(c.env("CDI_DIR")).join(format!("actk.dev-claim_{uid}.json"));
    for u in &uids {
        ensure!(spec(u).exists(), "no spec {}", spec(u).display());
    }
    let ds = c.get_json(&["daemonsets", "-n", "kube-system", "-l", "app.kubernetes.io/component=dra-driver"])?["items"]
        [0]["metadata"]["name"]
        .as_str()
        .context("no DRA driver DaemonSet")?
        .to_string();
    c.kubectl_ok(&["rollout", "restart", "daemonset", &ds, "-n", "kube-system"])?;
    c.kubectl_ok(&["rollout", "status", "daemonset", &ds, "-n", "kube-system", "--timeout=180s"])?;
    c.delete_pod("q1")?;
    c.wait_until("q1's claim unprepared", Duration::from_secs(60), || Ok((!spec(&uids[0]).exists()).then_some(())))?;
    for (p, u) in pods[1..4].iter().zip(&uids[1..]) {
        ensure!(spec(u).exists(), "{p}'s spec went with q1's: {}", spec(u).display());
        assert_eq!(c.pod(p)?["status"]["phase"], "Running", "{p}");
    }
    run(&c, "q5")?;
    let r = results(&c, "q5")?;
    ensure!(r.len() == 1 && r[0].0 == "nvidia-0", "q5: {r:?}");
    for p in &pods[..5] {
        c.delete_pod(p)?;
    }
    c.kubectl(&["delete", "resourceclaimtemplate", "quarter-gpu0", "-n", TEST_NAMESPACE, "--ignore-not-found"]);

    // NeuronCores: one core each of inf2 device 3 (two per device: global cores 6 and 7).
    let Some(inf2) = fixture::prepare("aws-inf2-48xlarge")? else { return Ok(()) };
    c.install(&inf2.root, &dra_only("neuron"))?;
    c.wait_until("12 Neuron devices in the node's slices", Duration::from_secs(120), || {
        let d = c.published_devices("actk.dev")?;
        Ok((d.len() == 12 && d.iter().all(|x| x["allowMultipleAllocations"] == true)).then_some(()))
    })?;
    c.apply(&template("one-core", "actk-neuron", 3, "cores", "1").to_string())?;
    let cores = r#"ls /dev | grep -E '^neuron[0-9]+$'; env | grep -E '^NEURON_RT_VISIBLE_CORES=' || true"#;
    let mut got = Vec::new();
    for p in ["nc1", "nc2"] {
        c.apply(&pod(p, "one-core", cores).to_string())?;
    }
    for p in ["nc1", "nc2"] {
        run(&c, p)?;
        let v = view(&c, p)?;
        let devs: Vec<&str> = v.lines().filter(|l| l.starts_with("neuron")).collect();
        assert_eq!(devs, ["neuron3"], "{p} sees:\n{v}");
        let core = v.lines().find_map(|l| l.strip_prefix("NEURON_RT_VISIBLE_CORES=")).map(str::to_string);
        got.push(core.with_context(|| format!("{p}: no NEURON_RT_VISIBLE_CORES:\n{v}"))?);
    }
    got.sort();
    assert_eq!(got, ["6", "7"], "two claims of one core each of neuron-3");
    for p in ["nc1", "nc2"] {
        c.delete_pod(p)?;
    }
    c.kubectl(&["delete", "resourceclaimtemplate", "one-core", "-n", TEST_NAMESPACE, "--ignore-not-found"]);
    c.uninstall()?;
    Ok(())
}
