//! What README.md and deploy/README.md show, checked on the real cluster (issue 28 item 7):
//! the commands they give and what those print, and the attribute values their tables give as
//! examples, as the DRA driver publishes them for the fixtures those values come from.
//!
//! `#[ignore]`d like every cluster test: `make test-k8s` runs them alone, one at a time.

use actk_testsupport::cluster::Cluster;
use actk_testsupport::engines::workspace_root;
use actk_testsupport::fixture;
use anyhow::{Context, Result, ensure};
use serde_json::Value;
use std::time::Duration;

fn read(rel: &str) -> String {
    std::fs::read_to_string(workspace_root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The devices of this node's actk.dev ResourceSlices, waiting until there are `n`.
fn devices(c: &Cluster, n: usize) -> Result<Vec<Value>> {
    c.wait_until(&format!("{n} devices in actk.dev slices"), Duration::from_secs(120), || {
        let l = c.get_json(&["resourceslices"])?;
        let d: Vec<Value> = l["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|s| s["spec"]["driver"] == "actk.dev" && s["spec"]["nodeName"] == c.node_name())
            .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
            .collect();
        Ok((d.len() >= n).then_some(d))
    })
}

/// A string attribute of a slice device.
fn attr(d: &Value, name: &str) -> Option<String> {
    let a = &d["attributes"][name];
    a["string"]
        .as_str()
        .or_else(|| a["version"].as_str())
        .map(String::from)
        .or_else(|| a["int"].as_i64().map(|i| i.to_string()))
}

/// README's DRA commands on the DGX H100 node: `kubectl get resourceslices -o wide` shows one
/// pool per node (and, as kubectl prints slices, no devices: README names the command that
/// lists them), the examples file applies and creates only claims and templates, and the
/// attribute values deploy/README.md's table gives for NVIDIA are this node's.
#[test]
#[ignore = "needs the test cluster: make test runs it alone"]
fn readme_dra_commands_and_nvidia_attribute_values() -> Result<()> {
    let Some(dgx) = fixture::prepare("nvidia-dgx-h100")? else { return Ok(()) };
    let Some(c) = Cluster::start(&Default::default())? else { return Ok(()) };
    c.install(&dgx.root, "dra:\n  enabled: true\ndevicePlugin:\n  enabled: false\n")?;
    let devs = devices(&c, 8)?;
    let readme = read("README.md");
    let deploy = read("deploy/README.md");

    // kubectl get resourceslices -o wide: README says what its columns are.
    let wide = c.kubectl_ok(&["get", "resourceslices", "-o", "wide"])?;
    let header: Vec<&str> = wide.lines().next().unwrap_or_default().split_whitespace().collect();
    ensure!(header == ["NAME", "NODE", "DRIVER", "POOL", "AGE"], "{wide}");
    ensure!(readme.contains("kubectl get resourceslices -o wide") && readme.contains("NAME NODE DRIVER POOL AGE"));
    ensure!(wide.lines().filter(|l| l.contains("actk.dev")).all(|l| l.contains(c.node_name())), "{wide}");
    // The command README gives for the devices prints nvidia-0 ... (as README says).
    let line = readme
        .lines()
        .find(|l| l.contains("kubectl get resourceslices -o jsonpath="))
        .context("README names the command that lists the devices")?;
    let jsonpath = line.split('\'').nth(1).context("the jsonpath in quotes")?;
    let names = c.kubectl_ok(&["get", "resourceslices", "-o", &format!("jsonpath={jsonpath}")])?;
    let names: Vec<&str> = names.split_whitespace().collect();
    for d in ["nvidia-0", "nvidia-7"] {
        ensure!(names.contains(&d), "{d} in {names:?}");
        ensure!(line.contains("nvidia-0"), "{line}");
    }

    // kubectl apply -f deploy/kubernetes/actk-dra-examples.yaml: claims and templates only.
    let path = workspace_root().join("deploy/kubernetes/actk-dra-examples.yaml");
    let out = c.kubectl_ok(&["apply", "-f", path.to_str().unwrap()])?;
    // Claims and templates, and the namespace of the admin-access example (admin access is
    // granted per namespace, by its label).
    ensure!(
        out.lines().all(|l| l.starts_with("resourceclaimtemplate.")
            || l.starts_with("resourceclaim.")
            || l == "namespace/gpu-monitoring created"
            || l == "namespace/gpu-monitoring unchanged"),
        "{out}"
    );
    ensure!(out.contains("resourceclaimtemplate.resource.k8s.io/one-gpu"), "{out}");
    let pods = c.get_json(&["pods", "-n", "default"])?;
    ensure!(pods["items"].as_array().is_none_or(|a| a.is_empty()), "the examples create no pod");
    c.kubectl_ok(&["delete", "-f", path.to_str().unwrap(), "--ignore-not-found"])?;

    // deploy/README.md's attribute table: the NVIDIA example values are this node's.
    for (name, want) in [
        ("model", "NVIDIA H100 80GB HBM3"),
        ("pciBusID", "0000:1b:00.0"),
        ("driverVersion", "580.95.5"),
        ("resource.kubernetes.io/pcieRoot", "pci0000:00"),
    ] {
        ensure!(deploy.contains(want), "deploy/README.md shows {want} for {name}");
        let key = name.rsplit_once('/').map_or(name, |(_, n)| n);
        let got: Vec<String> = devs
            .iter()
            .filter_map(|d| attr(d, name).or_else(|| attr(d, &format!("resource.kubernetes.io/{key}"))))
            .collect();
        ensure!(got.iter().any(|g| g == want), "{name}: {want} among {got:?}");
    }
    ensure!(devs.iter().all(|d| attr(d, "uuid").is_some_and(|u| u.starts_with("GPU-"))), "uuid GPU-…");
    c.uninstall()?;
    Ok(())
}

/// The Neuron `architecture` attribute: deploy/README.md gives the driver's values (NDv3 on
/// Inferentia2, NDv2 on Trainium1), and the DRA driver publishes them for the inf2 and trn1
/// nodes; README's device name example neuron-3 is a device of such a node.
#[test]
#[ignore = "needs the test cluster: make test runs it alone"]
fn neuron_architecture_attribute_is_what_the_docs_say() -> Result<()> {
    let deploy = read("deploy/README.md");
    let Some(c) = Cluster::start(&Default::default())? else { return Ok(()) };
    for (fixture_name, arch, model, n) in
        [("aws-inf2-48xlarge", "NDv3", "Inferentia2", 12), ("aws-trn1-32xlarge", "NDv2", "Trainium1", 16)]
    {
        let Some(f) = fixture::prepare(fixture_name)? else { return Ok(()) };
        ensure!(
            deploy.contains(&format!("`{arch}`")) && deploy.contains(model),
            "deploy/README.md names {arch} ({model})"
        );
        c.install(&f.root, "dra:\n  enabled: true\ndevicePlugin:\n  enabled: false\n")?;
        let devs = devices(&c, n)?;
        let got: Vec<String> = devs.iter().filter_map(|d| attr(d, "architecture")).collect();
        ensure!(got.len() == n && got.iter().all(|a| a == arch), "{fixture_name}: architecture {got:?}");
        ensure!(devs.iter().any(|d| d["name"] == "neuron-3"), "README's neuron-3");
        ensure!(devs.iter().all(|d| attr(d, "model").as_deref() == Some(model)), "{fixture_name}: model {model}");
        c.uninstall()?;
    }
    Ok(())
}

/// README's first cluster command: the node's allocatable shows the simulated DGX's 8 GPUs.
#[test]
#[ignore = "needs the test cluster: make test runs it alone"]
fn readme_allocatable_command() -> Result<()> {
    let Some(dgx) = fixture::prepare("nvidia-dgx-h100")? else { return Ok(()) };
    let Some(c) = Cluster::start(&Default::default())? else { return Ok(()) };
    c.install(&dgx.root, "")?;
    c.wait_allocatable("nvidia.com/gpu", 8)?;
    let readme = read("README.md");
    let line = readme.lines().find(|l| l.contains("k8s-node.sh kubectl get node -o jsonpath=")).context("README")?;
    let jsonpath = line.split('\'').nth(1).context("jsonpath")?;
    let out = c.kubectl_ok(&["get", "node", "-o", &format!("jsonpath={jsonpath}")])?;
    let v: Value = serde_json::from_str(&out).with_context(|| out.clone())?;
    ensure!(v["nvidia.com/gpu"] == "8", "{out}");
    Ok(())
}
