//! The chart as an admin meets it on the real cluster (issue 28 items 3, 6, 11): NVIDIA's
//! ConfigMaps and values carried over, `helm upgrade --wait` that fails for a plugin that does
//! not come up while the old one keeps serving, `--reuse-values` from an earlier revision, two
//! releases on one node, and plain logs.
//!
//! `#[ignore]`d like every cluster test: `make test-k8s` runs them alone, one at a time.

use actk_testsupport::cluster::{Cluster, NAMESPACE, PodSpec, RELEASE};
use actk_testsupport::engines::workspace_root;
use actk_testsupport::fixture;
use anyhow::{Context, Result, bail, ensure};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const GPU: &str = "nvidia.com/gpu";

fn ready(root: &Path, values: &str, resource: &str, count: i64) -> Result<Option<Cluster>> {
    let Some(c) = Cluster::start(&Default::default())? else { return Ok(None) };
    c.install(root, values)?;
    c.wait_allocatable(resource, count)?;
    Ok(Some(c))
}

/// A pod asking for `n` GPUs runs and sees `n` of them.
fn gets_gpus(c: &Cluster, name: &str, n: u32) -> Result<()> {
    let r = c.run_pod(&PodSpec::new(name, "ls /dev").limit(GPU, n))?;
    let got = r
        .logs
        .split_whitespace()
        .filter(|d| d.strip_prefix("nvidia").is_some_and(|x| x.parse::<u32>().is_ok()))
        .count();
    ensure!(r.phase() == "Succeeded" && got == n as usize, "{name}: {} with {got} GPUs:\n{}", r.phase(), r.logs);
    Ok(())
}

/// `helm ARGS` on the cluster with the harness's own values first (image, paths of this node).
fn helm_with_harness(c: &Cluster, args: &[&str]) -> std::process::Output {
    let harness = format!("{}/harness-values.yaml", c.env("STATE_DIR"));
    let mut a: Vec<&str> = args.to_vec();
    a.extend(["-f", harness.as_str()]);
    c.helm_output(&a)
}

/// The harness's values file without the `extraEnv` list under the top-level `nri:` key (the
/// file as scripts/k8s-node.sh writes it: two-space indents, the list's items deeper).
fn without_nri_extra_env(values: &str) -> String {
    let (mut top, mut skipping) = (String::new(), false);
    let mut out = String::new();
    for line in values.lines() {
        if !line.starts_with(' ') && !line.starts_with('#') && !line.is_empty() {
            top = line.to_string();
        }
        if skipping && line.starts_with("    ") {
            continue;
        }
        skipping = top == "nri:" && line == "  extraEnv:";
        if skipping {
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// Removes, when dropped, the node labels the named-config and labeller tests set.
struct Unlabel<'a>(&'a Cluster, String);

impl Drop for Unlabel<'_> {
    fn drop(&mut self) {
        let _ = self.0.kubectl(&[
            "label",
            "node",
            &self.1,
            "actk.dev/config-",
            "nvidia.com/device-plugin.config-",
            "actk.dev/retired.count-",
        ]);
    }
}

fn text(o: &std::process::Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// Issue 28 item 3: an existing ConfigMap in NVIDIA's config format (config.name, the config
/// chosen by config.default) configures the plugin, NVIDIA's top-level migStrategy reaches it,
/// and a value of NVIDIA's chart actk does not support is refused by `helm install` naming the
/// fix.
#[test]
#[ignore = "needs the test cluster: make test runs it alone"]
fn nvidia_configmap_and_chart_values_carry_over() -> Result<()> {
    let Some(dgx) = fixture::prepare("nvidia-dgx-h100")? else { return Ok(()) };
    let Some(c) = Cluster::start(&Default::default())? else { return Ok(()) };
    // As NVIDIA's docs write it: time-slicing GPUs 0 and 1 four ways, the others unshared.
    c.apply(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: nvidia-dp-configs, namespace: kube-system}\ndata:\n  \
         plain: |-\n    version: v1\n    flags:\n      migStrategy: none\n  \
         sliced: |-\n    version: v1\n    sharing:\n      timeSlicing:\n        resources:\n        - name: nvidia.com/gpu\n          replicas: 4\n          devices: [0, 1]\n",
    )?;
    c.install(&dgx.root, "config:\n  name: nvidia-dp-configs\n  default: sliced\n")?;
    c.wait_allocatable(GPU, 2 * 4 + 6)?;
    gets_gpus(&c, "nv-cm-pod", 2)?;
    // NVIDIA's migStrategy at the top level of the values is the plugin's.
    c.install(&dgx.root, "migStrategy: mixed\n")?;
    let toml =
        c.kubectl_ok(&["get", "configmap", RELEASE, "-n", NAMESPACE, "-o", "jsonpath={.data.device-plugin\\.toml}"])?;
    ensure!(toml.contains("mig_strategy = \"mixed\""), "{toml}");
    c.wait_allocatable(GPU, 8)?;
    // Refused with the fix, and the release stays as it was.
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("v.yaml"), "failOnInitError: true\n")?;
    let v = dir.path().join("v.yaml");
    let o = helm_with_harness(
        &c,
        &["upgrade", RELEASE, c.env("CHART"), "-n", NAMESPACE, "--reuse-values", "-f", v.to_str().unwrap()],
    );
    ensure!(!o.status.success() && text(&o).contains("remove failOnInitError"), "{}", text(&o));
    c.kubectl_ok(&["delete", "configmap", "nvidia-dp-configs", "-n", NAMESPACE])?;
    Ok(())
}

/// Issue 28 item 6: `helm upgrade --wait` of a plugin that cannot start (a bad flag) fails,
/// while the old plugin keeps serving (the surge rollout waits for the new pod's readiness);
/// the plugin's log has no colour escapes.
#[test]
#[ignore = "needs the test cluster: make test runs it alone"]
fn helm_wait_fails_for_a_plugin_that_does_not_come_up_and_the_old_one_serves() -> Result<()> {
    let Some(dgx) = fixture::prepare("nvidia-dgx-h100")? else { return Ok(()) };
    let Some(c) = ready(&dgx.root, "config:\n  strategies: [cdi-cri]\n", GPU, 8)? else { return Ok(()) };
    let logs = c.plugin_logs();
    ensure!(!logs.contains('\u{1b}') && logs.contains("INFO"), "plain logs:\n{logs:?}");
    let o = c.helm_output(&[
        "upgrade",
        RELEASE,
        c.env("CHART"),
        "-n",
        NAMESPACE,
        "--reuse-values",
        "--set",
        "extraArgs={--strategies=bogus}",
        "--wait",
        "--timeout",
        "60s",
    ]);
    ensure!(!o.status.success(), "helm upgrade --wait must fail for a plugin that exits at once:\n{}", text(&o));
    // The old pod still serves: allocatable unchanged and a pod gets its GPUs.
    c.wait_allocatable(GPU, 8)?;
    gets_gpus(&c, "still-served", 2)?;
    // Back to good values: the rollout completes.
    c.install(&dgx.root, "config:\n  strategies: [cdi-cri]\n")?;
    gets_gpus(&c, "served-again", 1)?;
    Ok(())
}

/// Issue 28 item 11 on the cluster: the release installed from the chart as it was before this
/// work (its values.yaml has no kubeletPodResourcesDir, updateStrategy, sharing.mps, ...) is
/// upgraded with `helm upgrade --reuse-values`, which renders the new templates with the old
/// values only; the upgrade succeeds and the node serves GPUs.
#[test]
#[ignore = "needs the test cluster: make test runs it alone"]
fn reuse_values_upgrade_from_an_earlier_chart_revision() -> Result<()> {
    let Some(dgx) = fixture::prepare("nvidia-dgx-h100")? else { return Ok(()) };
    let Some(c) = ready(&dgx.root, "config:\n  strategies: [cdi-cri]\n", GPU, 8)? else { return Ok(()) };
    c.uninstall()?;
    let old = tempfile::tempdir()?;
    let repo = workspace_root();
    // The chart as of d98ccd5 (the last revision before issue 28).
    let archive = Command::new("sh")
        .arg("-c")
        .arg("git archive d98ccd5 deploy/helm/actk-device-plugin | tar -x -C \"$1\"")
        .arg("sh")
        .arg(old.path())
        .current_dir(&repo)
        .status()?;
    ensure!(archive.success(), "git archive of the earlier chart");
    let old_chart = old.path().join("deploy/helm/actk-device-plugin");
    // The harness's values: this node's paths, the image, the fixture root as hostRoot; less
    // `nri.extraEnv`, which the harness writes for today's chart and the earlier chart's schema
    // (rightly) refuses: an admin's values of that revision never had it.
    let harness = std::fs::read_to_string(format!("{}/harness-values.yaml", c.env("STATE_DIR")))?;
    let earlier = old.path().join("harness-values.yaml");
    std::fs::write(&earlier, without_nri_extra_env(&harness))?;
    let o = c.helm_output(&[
        "upgrade",
        "--install",
        RELEASE,
        old_chart.to_str().unwrap(),
        "-n",
        NAMESPACE,
        "--wait",
        "--timeout",
        "3m",
        "-f",
        earlier.to_str().unwrap(),
    ]);
    ensure!(o.status.success(), "installing the earlier chart: {}", text(&o));
    c.wait_allocatable(GPU, 8)?;
    let o = c.helm_output(&[
        "upgrade",
        RELEASE,
        c.env("CHART"),
        "-n",
        NAMESPACE,
        "--reuse-values",
        // The exporter and the labeller are on by default since issue 30; the labeller needs the
        // API server, which this node reaches only through the loopback (no kube-proxy), and the
        // earlier values have no nodeLabeller.extraEnv to say so. Their templates' rendering
        // with every earlier values.yaml is the deploy test's
        // (every_earlier_values_yaml_renders_as_reuse_values_would).
        "--set",
        "exporter.enabled=false,nodeLabeller.enabled=false",
        "--wait",
        "--timeout",
        "3m",
    ]);
    ensure!(o.status.success(), "helm upgrade --reuse-values from the earlier revision: {}", text(&o));
    let ds = c.get_json(&["ds", RELEASE, "-n", NAMESPACE])?;
    ensure!(
        ds["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"] == 0,
        "the new defaults filled in: {}",
        ds["spec"]["updateStrategy"]
    );
    c.wait_allocatable(GPU, 8)?;
    gets_gpus(&c, "after-reuse-values", 2)?;
    Ok(())
}

/// Issue 28 item 6: two releases on one node never share a spec: the second release's generator
/// leaves nvidia.com/gpu to the first's spec (two specs of one kind in one directory make its
/// devices unresolvable), and uninstalling it takes nothing of the first's.
#[test]
#[ignore = "needs the test cluster: make test runs it alone"]
fn two_releases_keep_to_their_own_specs() -> Result<()> {
    let Some(dgx) = fixture::prepare("nvidia-dgx-h100")? else { return Ok(()) };
    let Some(c) = ready(&dgx.root, "config:\n  strategies: [cdi-cri]\n", GPU, 8)? else { return Ok(()) };
    let cdi = std::path::PathBuf::from(c.env("CDI_DIR"));
    let nvidia_specs = || -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(&cdi)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with("nvidia.com-gpu.json"))
            .collect();
        v.sort();
        v
    };
    ensure!(nvidia_specs() == [format!("{RELEASE}.nvidia.com-gpu.json")], "{:?}", nvidia_specs());
    // A second release on the same node (serving no resource: the kubelet takes one plugin per name).
    let dir = tempfile::tempdir()?;
    let second = dir.path().join("second.yaml");
    std::fs::write(&second, format!("hostRoot: {}\nconfig:\n  resources: [example.com/none]\n", dgx.root.display()))?;
    let o = helm_with_harness(&c, &["install", "second", c.env("CHART"), "-n", NAMESPACE, "--wait", "--timeout", "3m"]);
    ensure!(o.status.success(), "{}", text(&o));
    let o = c.helm_output(&[
        "upgrade",
        "second",
        c.env("CHART"),
        "-n",
        NAMESPACE,
        "--reuse-values",
        "-f",
        second.to_str().unwrap(),
        "--wait",
        "--timeout",
        "3m",
    ]);
    ensure!(o.status.success(), "{}", text(&o));
    std::thread::sleep(Duration::from_secs(8));
    ensure!(nvidia_specs() == [format!("{RELEASE}.nvidia.com-gpu.json")], "one spec of the kind: {:?}", nvidia_specs());
    gets_gpus(&c, "two-releases", 2)?;
    let o = c.helm_output(&["uninstall", "second", "-n", NAMESPACE, "--wait", "--timeout", "3m"]);
    ensure!(o.status.success(), "{}", text(&o));
    c.wait_until("the second release's pods gone", Duration::from_secs(120), || {
        let l = c.get_json(&["pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/instance=second"])?;
        Ok(l["items"].as_array().is_none_or(|a| a.is_empty()).then_some(()))
    })?;
    ensure!(
        nvidia_specs() == [format!("{RELEASE}.nvidia.com-gpu.json")],
        "the first's spec stays: {:?}",
        nvidia_specs()
    );
    gets_gpus(&c, "after-second-gone", 2)?;
    Ok(())
}

/// Issue 28 item 6: with values that put every device on the DRA driver, `k8s-node.sh install`
/// waits for the rollout and `wait-devices` (what `up` waits on) returns once the driver
/// publishes the node's devices, where waiting for an extended resource never ended.
#[test]
#[ignore = "needs the test cluster: make test runs it alone"]
fn up_with_dra_values_waits_for_slices_not_extended_resources() -> Result<()> {
    let Some(dgx) = fixture::prepare("nvidia-dgx-h100")? else { return Ok(()) };
    let Some(c) = Cluster::start(&Default::default())? else { return Ok(()) };
    c.install(&dgx.root, "dra:\n  enabled: true\ndevicePlugin:\n  enabled: false\n")?;
    let o = Command::new("timeout")
        .args(["120", workspace_root().join("scripts/k8s-node.sh").to_str().unwrap(), "wait-devices"])
        .env("ACTK_K8S_LOCK_HELD", "1")
        .output()
        .context("k8s-node.sh wait-devices")?;
    if !o.status.success() {
        bail!("wait-devices: {}\n{}", text(&o), c.plugin_logs());
    }
    ensure!(text(&o).contains("the DRA driver publishes 8 devices"), "{}", text(&o));
    ensure!(c.allocatable()?.get(GPU).is_none_or(|n| *n == 0), "no extended resource: the DRA driver serves the GPUs");
    c.uninstall()?;
    Ok(())
}

/// The plugin's pod: its name and its container's restart count.
fn plugin_pod(c: &Cluster) -> Result<(String, i64)> {
    let pods = c.release_pods()?;
    let p = pods
        .iter()
        .find(|p| {
            p["status"]["phase"] == "Running"
                && p["metadata"]["labels"]["app.kubernetes.io/component"].is_null()
                && p["metadata"]["deletionTimestamp"].is_null()
        })
        .context("no running plugin pod")?;
    let restarts = p["status"]["containerStatuses"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["name"] == "actk-device-plugin"))
        .and_then(|s| s["restartCount"].as_i64())
        .unwrap_or(-1);
    Ok((p["metadata"]["name"].as_str().unwrap_or_default().to_string(), restarts))
}

/// Issue 30, per-node configs: the chart takes named configs (config.map, config.default) and
/// the node label actk.dev/config picks this node's. On the DGX H100 fixture (8 GPUs): the
/// default serves 8, `ts2` (time-slicing, 2 replicas) 16 within a minute of labelling, in the
/// same pod and container (a restart in place); an unknown name keeps 16 and posts a Warning
/// Event ConfigRefused on the Node naming the label and the configs there are; the label
/// removed gives 8 again; NVIDIA's label nvidia.com/device-plugin.config is honoured too.
#[test]
#[ignore = "needs the test cluster: make test runs it alone"]
fn node_label_chooses_the_named_config_without_a_reinstall() -> Result<()> {
    let Some(dgx) = fixture::prepare("nvidia-dgx-h100")? else { return Ok(()) };
    let Some(c) = Cluster::start(&Default::default())? else { return Ok(()) };
    let node = c.node_name().to_string();
    let _unlabel = Unlabel(&c, node.clone());
    let label = |key: &str, v: Option<&str>| -> Result<()> {
        let arg = match v {
            Some(v) => format!("{key}={v}"),
            None => format!("{key}-"),
        };
        c.kubectl_ok(&["label", "node", &node, &arg, "--overwrite"]).map(|_| ())
    };
    label("actk.dev/config", None)?;
    label("nvidia.com/device-plugin.config", None)?;
    c.install(
        &dgx.root,
        "config:\n  map:\n    default: |\n      version: v1\n    ts2: |\n      version: v1\n      sharing:\n        \
         timeSlicing:\n          resources:\n          - name: nvidia.com/gpu\n            replicas: 2\n  default: default\n",
    )?;
    c.wait_allocatable(GPU, 8)?;
    let before = plugin_pod(&c)?;
    let minute = Duration::from_secs(60);

    label("actk.dev/config", Some("ts2"))?;
    c.wait_allocatable_within(GPU, 16, minute)?;
    let after = plugin_pod(&c)?;
    ensure!(after == before, "restarted in place, same pod and no container restart: {before:?} then {after:?}");
    let logs = c.plugin_logs();
    ensure!(logs.contains("serving config \"ts2\""), "the log names the config:\n{logs}");
    gets_gpus(&c, "ts2-pod", 2)?;

    // A name that is not a config: refused where the admin looks, the running config kept.
    label("actk.dev/config", Some("ts9"))?;
    let ev = c.wait_until("the ConfigRefused event on the node", minute, || {
        let evs = c.events("default", &node)?;
        Ok(evs.into_iter().find(|e| e.starts_with("ConfigRefused:") && e.contains("actk.dev/config=ts9")))
    })?;
    ensure!(ev.contains("it has default, ts2") && ev.contains("keeping config \"ts2\""), "{ev}");
    std::thread::sleep(Duration::from_secs(12));
    ensure!(c.allocatable()?.get(GPU) == Some(&16), "the running config stays: {:?}", c.allocatable()?);
    let logs = c.plugin_logs();
    ensure!(logs.contains("ERROR") && logs.contains("actk.dev/config=ts9"), "the log says so:\n{logs}");

    // The label removed: the default again.
    label("actk.dev/config", None)?;
    c.wait_allocatable_within(GPU, 8, minute)?;
    // NVIDIA's label, for nodes labelled for NVIDIA's plugin.
    label("nvidia.com/device-plugin.config", Some("ts2"))?;
    c.wait_allocatable_within(GPU, 16, minute)?;
    label("nvidia.com/device-plugin.config", None)?;
    c.wait_allocatable_within(GPU, 8, minute)?;
    ensure!(plugin_pod(&c)? == before, "still the same pod and container");
    Ok(())
}

/// Issue 30, the chart's exporter and node labeller (both on by default; the harness turns them
/// off for the other tests): on the DGX H100 fixture the labeller puts GFD's and actk's labels on
/// the Node (product and count as the fixture has them), removes an actk.dev/ label it does not
/// compute but never the admin's actk.dev/config, and cannot write the Node with a token that
/// names no node (the admission policy); a pod selecting GFD's product label runs there and one
/// selecting a product the node lacks stays Pending; relabelling the node to a time-sliced named
/// config turns its sharing labels on (GFD's `-SHARED` product, replicas, strategy) within a
/// minute, as it turns the plugin's replicas on; a GPU removed from the node leaves the count
/// within the watch interval; the exporter's /metrics answers at its Service's endpoint with a
/// series per GPU. One install for all of it.
#[test]
#[ignore = "needs the test cluster: make test runs it alone"]
fn exporter_and_node_labeller_daemonsets() -> Result<()> {
    let Some(dgx) = fixture::prepare("nvidia-dgx-h100")? else { return Ok(()) };
    let Some(c) = Cluster::start(&Default::default())? else { return Ok(()) };
    let node = c.node_name().to_string();
    // Whatever happens, the node leaves without the labels this test sets: a config label left
    // behind names a config the next test's chart does not have, and its plugin would not start.
    let _unlabel = Unlabel(&c, node.clone());
    // A label a labeller set before (stale) and the admin's config label.
    c.kubectl_ok(&[
        "label",
        "node",
        &node,
        "actk.dev/retired.count=1",
        "actk.dev/config=default",
        "nvidia.com/device-plugin.config-",
        "--overwrite",
    ])?;
    c.install(
        &dgx.root,
        "exporter:\n  enabled: true\nnodeLabeller:\n  enabled: true\n  intervalSeconds: 2\nconfig:\n  map:\n    \
         default: |\n      version: v1\n    ts2: |\n      version: v1\n      sharing:\n        timeSlicing:\n          \
         resources:\n          - name: nvidia.com/gpu\n            replicas: 2\n",
    )?;
    c.wait_allocatable(GPU, 8)?;
    let labels_are = |what: &str, want: &[(&str, &str)], limit: Duration| -> Result<serde_json::Value> {
        let mut last = serde_json::Value::Null;
        let r = c.wait_until(what, limit, || {
            last = c.get_json(&["node", &node])?["metadata"].clone();
            let l = &last["labels"];
            Ok((want.iter().all(|(k, v)| l[*k] == *v) && l["actk.dev/retired.count"].is_null()).then_some(()))
        });
        r.map_err(|e| anyhow::anyhow!("{e}; node metadata: {last}\n{}", c.plugin_logs()))?;
        Ok(last)
    };
    let last = labels_are(
        "the node's labels from the labeller",
        &[
            ("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3"),
            ("nvidia.com/gpu.count", "8"),
            ("nvidia.com/gpu.replicas", "1"),
            ("nvidia.com/gpu.sharing-strategy", "none"),
            ("actk.dev/nvidia.count", "8"),
            ("actk.dev/config", "default"),
            ("actk.dev/config.applied", "default"),
        ],
        Duration::from_secs(90),
    )?;
    let owned = last["annotations"]["actk.dev/labels"].as_str().unwrap_or_default().to_string();
    ensure!(
        owned.split(',').any(|k| k == "nvidia.com/gpu.product") && !owned.split(',').any(|k| k == "actk.dev/config"),
        "{owned}"
    );
    // The labeller's identity without a pod-bound token (no node in it) may not write the Node.
    let sa = format!("system:serviceaccount:{NAMESPACE}:{RELEASE}-labeller");
    let o = c.kubectl(&["label", "node", &node, "actk.dev/forged=1", "--as", &sa]);
    let msg = String::from_utf8_lossy(&o.stderr).to_string();
    ensure!(!o.status.success() && msg.contains("names no node"), "refused by the own-node policy: {msg}");

    // Existing nodeSelectors on GFD's product label: the H100 node takes the pod, a product it
    // does not have leaves the other Pending (unschedulable, not failed).
    let h100 = PodSpec::new("selects-h100", "ls /dev")
        .limit(GPU, 1)
        .node_selector("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3");
    let r = c.run_pod(&h100)?;
    ensure!(r.phase() == "Succeeded", "the H100 pod: {}\n{}", r.phase(), r.logs);
    let a100 = PodSpec::new("selects-a100", "true")
        .limit(GPU, 1)
        .node_selector("nvidia.com/gpu.product", "NVIDIA-A100-SXM4-80GB");
    c.create_pod(&a100)?;
    let why = c.wait_until("the A100 pod unschedulable", Duration::from_secs(30), || {
        let p = c.pod("selects-a100")?;
        let cond = p["status"]["conditions"].as_array().cloned().unwrap_or_default();
        Ok(cond
            .iter()
            .find(|x| x["type"] == "PodScheduled" && x["status"] == "False" && x["reason"] == "Unschedulable")
            .map(|x| x["message"].to_string()))
    })?;
    ensure!(c.pod("selects-a100")?["status"]["phase"] == "Pending", "still Pending: {why}");
    c.delete_pod("selects-a100")?;

    // Relabelled to the time-sliced config: the plugin serves 16 and the labels say so, as GFD
    // writes them (the product marked -SHARED: a pod selecting the plain product avoids shares).
    c.kubectl_ok(&["label", "node", &node, "actk.dev/config=ts2", "--overwrite"])?;
    let minute = Duration::from_secs(60);
    c.wait_allocatable_within(GPU, 16, minute)?;
    labels_are(
        "the time-slicing labels",
        &[
            ("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3-SHARED"),
            ("nvidia.com/gpu.replicas", "2"),
            ("nvidia.com/gpu.sharing-strategy", "time-slicing"),
            ("actk.dev/nvidia.sharing", "time-slicing"),
            ("actk.dev/nvidia.replicas", "2"),
            ("actk.dev/config.applied", "ts2"),
        ],
        minute,
    )?;

    // GPU 7 falls off the bus (its device node goes): the count follows within the interval
    // (2 s here), the node's other labels stay.
    let gpu7 = dgx.path("/dev/nvidia7");
    std::fs::remove_file(&gpu7).with_context(|| format!("removing {}", gpu7.display()))?;
    let removed = labels_are(
        "the count without GPU 7",
        &[("nvidia.com/gpu.count", "7"), ("actk.dev/nvidia.count", "7"), ("nvidia.com/gpu.replicas", "2")],
        Duration::from_secs(20),
    );
    let back = Command::new("mknod").arg(&gpu7).args(["c", "195", "7"]).status();
    removed?;
    ensure!(back.is_ok_and(|s| s.success()), "mknod {} failed", gpu7.display());
    labels_are("the count with GPU 7 back", &[("nvidia.com/gpu.count", "8")], Duration::from_secs(20))?;

    // The exporter, through its Service's endpoints (the test node has no kube-proxy).
    let slices = c.get_json(&[
        "endpointslices",
        "-n",
        NAMESPACE,
        "-l",
        &format!("kubernetes.io/service-name={RELEASE}-exporter"),
    ])?;
    let addr = c.wait_until("a ready exporter endpoint", Duration::from_secs(60), || {
        let s = c.get_json(&[
            "endpointslices",
            "-n",
            NAMESPACE,
            "-l",
            &format!("kubernetes.io/service-name={RELEASE}-exporter"),
        ])?;
        let Some(slice) = s["items"].as_array().and_then(|a| a.first()).cloned() else { return Ok(None) };
        let ip = slice["endpoints"][0]["addresses"][0].as_str().map(str::to_string);
        let ready = slice["endpoints"][0]["conditions"]["ready"] == true;
        let port = slice["ports"][0]["port"].as_i64();
        Ok(match (ip, port, ready) {
            (Some(ip), Some(port), true) => Some(format!("{ip}:{port}")),
            _ => None,
        })
    });
    let addr = addr.map_err(|e| anyhow::anyhow!("{e}; {slices}"))?;
    let o = Command::new("curl").args(["-fsS", "--max-time", "20", &format!("http://{addr}/metrics")]).output()?;
    let body = String::from_utf8_lossy(&o.stdout).to_string();
    ensure!(o.status.success(), "GET http://{addr}/metrics: {}", String::from_utf8_lossy(&o.stderr));
    let gpus =
        body.lines().filter(|l| l.starts_with("actk_device_info{") && l.contains("NVIDIA H100 80GB HBM3")).count();
    let mem = body.lines().filter(|l| l.starts_with("actk_device_memory_total_bytes{")).count();
    ensure!(gpus == 8 && mem >= 8, "8 H100s in /metrics ({gpus} info, {mem} memory series):\n{body}");

    // The telemetry grant: the unprivileged exporter's container has the nodes NVML opens for
    // every GPU (the kubelet's device specs from the plugin's actk.dev/telemetry), and nothing
    // of CUDA's; the exporter does not count itself as a holder of any GPU.
    let dev = exporter_nvidia_nodes()?;
    // The fixture's MIG monitor capability (nvidia-cap2) too: NVML reads every MIG device by it.
    let mut want: Vec<String> = (0..8).map(|i| format!("nvidia{i}")).collect();
    want.extend(["nvidiactl".into(), "nvidia-caps/nvidia-cap2".into()]);
    want.sort();
    ensure!(dev == want, "the exporter's /dev: {dev:?}, want {want:?}");
    let own = body.lines().filter(|l| l.contains("pod=\"") && l.contains("-exporter-")).collect::<Vec<_>>();
    ensure!(own.is_empty(), "the exporter attributed devices to itself: {own:?}");
    // Nobody else may ask for it: a test pod, and a pod in the release's namespace under
    // another service account, are refused at creation naming the rule.
    let asks = PodSpec::new("asks-telemetry", "ls /dev").limit("actk.dev/telemetry", 1);
    let refused = c.create_pod(&asks).err().map(|e| format!("{e:#}")).unwrap_or_default();
    ensure!(refused.contains("telemetry grant"), "a test pod asking for the grant: {refused:?}");
    let mut in_release = asks.manifest();
    in_release["metadata"]["namespace"] = NAMESPACE.into();
    // A server-side dry run: admission runs, nothing is created in the release's namespace.
    let f = tempfile::NamedTempFile::new()?;
    std::fs::write(f.path(), in_release.to_string())?;
    let o =
        c.kubectl(&[std::ffi::OsStr::new("create"), "--dry-run=server".as_ref(), "-f".as_ref(), f.path().as_os_str()]);
    let refused = if o.status.success() { String::new() } else { String::from_utf8_lossy(&o.stderr).to_string() };
    ensure!(
        refused.contains("telemetry grant") && refused.contains("-exporter"),
        "a pod of {NAMESPACE} under the default service account: {refused:?}"
    );
    c.kubectl_ok(&["label", "node", &node, "actk.dev/config-"])?;
    Ok(())
}

/// The character devices named nvidia* in the /dev of the exporter's container, and in its
/// /dev/nvidia-caps (`nvidia-caps/<name>`), seen from the node through the `actk-exporter`
/// process's root.
fn exporter_nvidia_nodes() -> Result<Vec<String>> {
    use std::os::unix::fs::FileTypeExt;
    for e in std::fs::read_dir("/proc")?.flatten() {
        let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        if !cmd.starts_with(b"/usr/bin/actk-exporter\0") {
            continue;
        }
        let dev = e.path().join("root/dev");
        let caps = std::fs::read_dir(dev.join("nvidia-caps")).into_iter().flatten().flatten();
        let mut out = Vec::new();
        for (prefix, d) in std::fs::read_dir(&dev)?.flatten().map(|d| ("", d)).chain(caps.map(|d| ("nvidia-caps/", d)))
        {
            let name = d.file_name().to_string_lossy().to_string();
            if name.starts_with("nvidia") && d.file_type().is_ok_and(|t| t.is_char_device()) {
                out.push(format!("{prefix}{name}"));
            }
        }
        out.sort();
        return Ok(out);
    }
    bail!("no actk-exporter process on the node")
}
