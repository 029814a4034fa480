//! The real single-node Kubernetes cluster for tests (`scripts/k8s-node.sh`): kubelet,
//! kube-apiserver, kube-scheduler, kube-controller-manager (the version `ACTK_KUBE_VERSION`
//! names, e.g. `v1.34.4` or `v1.37.2`; else the script's default), etcd and containerd 2, with
//! actk deployed by its Helm chart for a node whose devices are under a fixture root.
//!
//! One cluster runs on a machine at a time: [`Cluster::start`] takes the machine-wide flock
//! [`LOCK`] and holds it until the [`Cluster`] is dropped, so tests of several checkouts (and of
//! several test binaries) take turns. The cluster itself outlives the value: the next test
//! reuses it (`k8s-node.sh start` only starts what is not running) and `k8s-node.sh down` ends it
//! (`make test` runs that, and tests it, after the cluster tests).
//!
//! ```no_run
//! # fn main() -> anyhow::Result<()> {
//! use actk_testsupport::cluster::{Cluster, PodSpec};
//! let Some(dgx) = actk_testsupport::fixture::prepare("nvidia-dgx-h100")? else { return Ok(()) };
//! let Some(c) = Cluster::start(&Default::default())? else { return Ok(()) };
//! c.install(&dgx.root, "config:\n  strategies: [cdi-cri]\n")?;
//! c.wait_allocatable("nvidia.com/gpu", 8)?;
//! let pod = c.run_pod(&PodSpec::new("two-gpus", "ls /dev").limit("nvidia.com/gpu", 2))?;
//! assert!(pod.logs.contains("nvidia1"));
//! # Ok(()) }
//! ```
//!
//! Everything goes through the real CLIs: `kubectl` (JSON output parsed with serde_json) and
//! `helm` of the script, so a test sees what a cluster admin sees. Every command runs under a
//! time limit, and a failure's error carries the command's output.

use crate::engines;
use anyhow::{Context, Result, bail};
use serde_json::Value;
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The machine-wide lock of the one cluster.
pub const LOCK: &str = "/run/lock/actk-k8s-cluster.lock";

/// Release name of the chart on the test cluster.
pub const RELEASE: &str = "actk-device-plugin";

/// Namespace of the chart.
pub const NAMESPACE: &str = "kube-system";

/// Namespace of test pods.
pub const TEST_NAMESPACE: &str = "default";

/// The busybox image of the cluster (scripts/k8s/base-images.sh).
pub const BUSYBOX: &str = "actk.local/busybox:1.35";

/// Time limit of one kubectl or helm call.
const CALL_TIMEOUT_S: u32 = 300;

/// How the cluster's kubelet is configured.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StartOptions {
    /// Kubelet `topologyManagerPolicy` (`none` when unset; `single-numa-node`, ...). Another
    /// policy than the running kubelet's restarts the kubelet.
    pub topology_policy: Option<String>,
    /// Kubernetes version (`v1.37.2`); `None`: `ACTK_KUBE_VERSION`, else the script's default.
    /// A running cluster of another version is taken down and started again with this one.
    pub kube_version: Option<String>,
    /// Feature gates of every component (`DRAConsumableCapacity=true`), added to
    /// `ACTK_KUBE_FEATURE_GATES`'s. A running cluster with other gates is taken down and
    /// started again with these (and the next test without them starts it again without).
    pub feature_gates: Option<String>,
}

/// The environment variable naming the cluster's Kubernetes version (`v1.34.4`, `v1.37.2`),
/// read by `scripts/k8s/build-kube.sh` and [`Cluster::start`].
pub const KUBE_VERSION_ENV: &str = "ACTK_KUBE_VERSION";

/// The test cluster, held by one test at a time (the lock is released on drop).
#[derive(Debug)]
pub struct Cluster {
    env: BTreeMap<String, String>,
    script: PathBuf,
    start_gates: Option<String>,
    _lock: fs::File,
}

/// A finished (or failed) test pod: its last status and its log.
#[derive(Debug, Clone)]
pub struct PodResult {
    /// `kubectl get pod -o json`.
    pub pod: Value,
    /// The container's log (empty when it never started).
    pub logs: String,
}

impl PodResult {
    /// `.status.phase`.
    pub fn phase(&self) -> &str {
        self.pod["status"]["phase"].as_str().unwrap_or("")
    }
}

/// A test pod: busybox on the host network, `sh -c SCRIPT`, never restarted, no service account
/// token, `imagePullPolicy: Never`.
#[derive(Debug, Clone)]
pub struct PodSpec {
    /// Pod name (in [`TEST_NAMESPACE`]).
    pub name: String,
    /// Shell script the container runs.
    pub script: String,
    /// `resources.limits` (extended resources: requests equal limits).
    pub limits: Vec<(String, String)>,
    /// `runtimeClassName`.
    pub runtime_class: Option<String>,
    /// Extra container env.
    pub env: Vec<(String, String)>,
    /// Pod annotations (`metadata.annotations`).
    pub annotations: Vec<(String, String)>,
    /// `spec.nodeSelector` (node labels the pod asks for).
    pub node_selector: Vec<(String, String)>,
}

impl PodSpec {
    /// A pod named `name` running `script`.
    pub fn new(name: &str, script: &str) -> PodSpec {
        PodSpec {
            name: name.into(),
            script: script.into(),
            limits: vec![],
            runtime_class: None,
            env: vec![],
            annotations: vec![],
            node_selector: vec![],
        }
    }

    /// Adds `nodeSelector: {key: value}`.
    pub fn node_selector(mut self, key: &str, value: &str) -> PodSpec {
        self.node_selector.push((key.into(), value.into()));
        self
    }

    /// Adds `limits: {resource: count}`.
    pub fn limit(mut self, resource: &str, count: u32) -> PodSpec {
        self.limits.push((resource.into(), count.to_string()));
        self
    }

    /// Sets `runtimeClassName`.
    pub fn runtime_class(mut self, name: &str) -> PodSpec {
        self.runtime_class = Some(name.into());
        self
    }

    /// Adds a container env variable `key=value`.
    pub fn env(mut self, key: &str, value: &str) -> PodSpec {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Adds a pod annotation `key: value`.
    pub fn annotation(mut self, key: &str, value: &str) -> PodSpec {
        self.annotations.push((key.into(), value.into()));
        self
    }

    /// The manifest (JSON, which kubectl takes as YAML).
    pub fn manifest(&self) -> Value {
        let limits: serde_json::Map<String, Value> =
            self.limits.iter().map(|(k, v)| (k.clone(), Value::String(v.clone()))).collect();
        let env: Vec<Value> = self.env.iter().map(|(k, v)| serde_json::json!({"name": k, "value": v})).collect();
        let mut spec = serde_json::json!({
            "hostNetwork": true,
            "automountServiceAccountToken": false,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "c",
                "image": BUSYBOX,
                "imagePullPolicy": "Never",
                "command": ["sh", "-c", self.script],
                "env": env,
                "resources": {"limits": limits},
            }],
        });
        if let Some(rc) = &self.runtime_class {
            spec["runtimeClassName"] = Value::String(rc.clone());
        }
        if !self.node_selector.is_empty() {
            spec["nodeSelector"] =
                self.node_selector.iter().map(|(k, v)| (k.clone(), Value::String(v.clone()))).collect();
        }
        let annotations: serde_json::Map<String, Value> =
            self.annotations.iter().map(|(k, v)| (k.clone(), Value::String(v.clone()))).collect();
        serde_json::json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": self.name,
                "namespace": TEST_NAMESPACE,
                "labels": {"actk-test": "true"},
                "annotations": annotations,
            },
            "spec": spec,
        })
    }
}

/// `(major, minor)` of `v1.37.2` (or `1.37.2`, `v1.37.2-rc.0`).
pub fn parse_minor(v: &str) -> Option<(u32, u32)> {
    let mut it = v.trim().trim_start_matches('v').split(['.', '-', '+']);
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

fn output_text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

impl Cluster {
    /// Takes [`LOCK`] (waiting for another user of the cluster), then starts the cluster or
    /// reuses the running one (`k8s-node.sh start`): the first start on a machine builds the
    /// Kubernetes binaries (minutes). `Ok(None)` when this machine cannot run it (not root),
    /// after printing why; under `CI=true` or `ACTK_E2E_STRICT=1` that panics instead.
    pub fn start(opts: &StartOptions) -> Result<Option<Cluster>> {
        if !engines::require_root() {
            return Ok(None);
        }
        let lock = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(LOCK)
            .with_context(|| format!("opening {LOCK}"))?;
        if lock.try_lock().is_err() {
            eprintln!("cluster: waiting for {LOCK} (another test uses the cluster)");
            lock.lock().with_context(|| format!("locking {LOCK}"))?;
        }
        let script = engines::workspace_root().join("scripts/k8s-node.sh");
        let mut c = Cluster { env: BTreeMap::new(), script, start_gates: None, _lock: lock };
        let mut args = vec!["start".to_string()];
        if let Some(p) = &opts.topology_policy {
            args.extend(["--topology-policy".into(), p.clone()]);
        }
        let version =
            opts.kube_version.clone().or_else(|| std::env::var(KUBE_VERSION_ENV).ok().filter(|v| !v.is_empty()));
        if let Some(v) = version {
            args.extend(["--version".into(), v]);
        }
        let global = std::env::var("ACTK_KUBE_FEATURE_GATES").unwrap_or_default();
        let gates: Vec<&str> = [global.as_str(), opts.feature_gates.as_deref().unwrap_or("")]
            .into_iter()
            .filter(|g| !g.is_empty())
            .collect();
        c.start_gates = Some(gates.join(","));
        c.script_ok(&args, 3600).context("starting the test cluster (scripts/k8s-node.sh start)")?;
        c.start_gates = None;
        let env = c.script_ok(&["env".to_string()], 600)?;
        c.env = env.lines().filter_map(|l| l.split_once('=')).map(|(k, v)| (k.to_string(), v.to_string())).collect();
        // Pods a failed test left would hold devices the next test counts on.
        c.kubectl_ok(&[
            "delete",
            "pods",
            "-n",
            TEST_NAMESPACE,
            "-l",
            "actk-test=true",
            "--grace-period=0",
            "--force",
            "--wait=true",
            "--ignore-not-found",
        ])?;
        Ok(Some(c))
    }

    fn script(&self, args: &[String], timeout_s: u32) -> Output {
        let mut cmd = Command::new("timeout");
        cmd.arg("--kill-after=10").arg(timeout_s.to_string()).arg(&self.script).args(args);
        cmd.env("ACTK_K8S_LOCK_HELD", "1").stdin(Stdio::null());
        if let Some(g) = &self.start_gates {
            cmd.env("ACTK_KUBE_FEATURE_GATES", g);
        }
        cmd.output().unwrap_or_else(|e| panic!("cannot run {}: {e}", self.script.display()))
    }

    fn script_ok(&self, args: &[String], timeout_s: u32) -> Result<String> {
        let o = self.script(args, timeout_s);
        if !o.status.success() {
            bail!("k8s-node.sh {} failed ({}):\n{}", args.join(" "), o.status, output_text(&o));
        }
        Ok(String::from_utf8_lossy(&o.stdout).into_owned())
    }

    /// A value of `k8s-node.sh env`: `KUBECONFIG`, `NODE_NAME`, `DEVICE_PLUGIN_DIR`, `CDI_DIR`,
    /// `CONTAINERD_SOCKET`, `PLUGINS_REGISTRY_DIR`, `STATE_DIR`, ... (panics on an unknown key).
    pub fn env(&self, key: &str) -> &str {
        self.env.get(key).unwrap_or_else(|| panic!("k8s-node.sh env has no {key}: {:?}", self.env.keys()))
    }

    /// The node's name.
    pub fn node_name(&self) -> &str {
        self.env("NODE_NAME")
    }

    /// The cluster's Kubernetes version as `(major, minor)` (`(1, 37)`), from `k8s-node.sh env`'s
    /// `KUBE_VERSION` (`v1.37.2`). Tests of features a version lacks check it.
    pub fn kube_version(&self) -> (u32, u32) {
        let v = self.env("KUBE_VERSION");
        parse_minor(v).unwrap_or_else(|| panic!("KUBE_VERSION {v:?} is not vMAJOR.MINOR.PATCH"))
    }

    /// `kubectl ARGS` against the cluster.
    pub fn kubectl<S: AsRef<std::ffi::OsStr>>(&self, args: &[S]) -> Output {
        let mut cmd = Command::new("timeout");
        cmd.arg("--kill-after=10").arg(CALL_TIMEOUT_S.to_string()).arg(self.env("KUBECTL"));
        cmd.arg("--kubeconfig").arg(self.env("KUBECONFIG")).args(args).stdin(Stdio::null());
        cmd.output().unwrap_or_else(|e| panic!("cannot run kubectl: {e}"))
    }

    /// `kubectl ARGS`; its stdout, or an error with its output.
    pub fn kubectl_ok<S: AsRef<std::ffi::OsStr>>(&self, args: &[S]) -> Result<String> {
        let o = self.kubectl(args);
        if !o.status.success() {
            let shown: Vec<String> = args.iter().map(|a| a.as_ref().to_string_lossy().into_owned()).collect();
            bail!("kubectl {} failed ({}):\n{}", shown.join(" "), o.status, output_text(&o));
        }
        Ok(String::from_utf8_lossy(&o.stdout).into_owned())
    }

    /// The devices `driver`'s ResourceSlices of this node publish (each device's JSON as the
    /// API server returns it), once every slice of the pool's newest generation is there; empty
    /// while that generation is incomplete or absent (resource.k8s.io v1 `spec.pool`).
    pub fn published_devices(&self, driver: &str) -> Result<Vec<Value>> {
        let list = self.get_json(&["resourceslices"])?;
        let slices: Vec<&Value> = list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|s| s["spec"]["driver"] == driver && s["spec"]["nodeName"] == self.node_name())
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

    /// `kubectl get ARGS -o json`, parsed.
    pub fn get_json(&self, args: &[&str]) -> Result<Value> {
        let mut a: Vec<&str> = vec!["get"];
        a.extend_from_slice(args);
        a.extend(["-o", "json"]);
        let text = self.kubectl_ok(&a)?;
        serde_json::from_str(&text).with_context(|| format!("kubectl {} printed no JSON", a.join(" ")))
    }

    /// `kubectl apply -f -` with `manifest` (YAML or JSON text).
    pub fn apply(&self, manifest: &str) -> Result<()> {
        let dir = tempfile::tempdir()?;
        let f = dir.path().join("manifest.yaml");
        fs::write(&f, manifest)?;
        self.kubectl_ok(&[std::ffi::OsStr::new("apply"), "-f".as_ref(), f.as_os_str()])?;
        Ok(())
    }

    /// `helm ARGS` against the cluster; an error with its output when it fails.
    pub fn helm(&self, args: &[&str]) -> Result<String> {
        let o = self.helm_output(args);
        if !o.status.success() {
            bail!("helm {} failed ({}):\n{}", args.join(" "), o.status, output_text(&o));
        }
        Ok(String::from_utf8_lossy(&o.stdout).into_owned())
    }

    /// `helm ARGS` against the cluster, whatever its exit status.
    pub fn helm_output(&self, args: &[&str]) -> Output {
        let mut cmd = Command::new("timeout");
        cmd.arg("--kill-after=10").arg(CALL_TIMEOUT_S.to_string()).arg(self.env("HELM"));
        cmd.arg("--kubeconfig").arg(self.env("KUBECONFIG")).args(args).stdin(Stdio::null());
        cmd.output().unwrap_or_else(|e| panic!("cannot run helm: {e}"))
    }

    /// Installs or upgrades the chart for a node whose devices are under `root`, with the
    /// cluster's own values (image, kubelet and CDI dirs, containerd paths) and then
    /// `values_yaml` on top; waits until every pod of the release runs the new revision.
    pub fn install(&self, root: &Path, values_yaml: &str) -> Result<()> {
        self.install_with(root, values_yaml, true)
    }

    /// [`Cluster::install`] without waiting for the pods (for values that keep them from running).
    pub fn install_no_wait(&self, root: &Path, values_yaml: &str) -> Result<()> {
        self.install_with(root, values_yaml, false)
    }

    fn install_with(&self, root: &Path, values_yaml: &str, wait: bool) -> Result<()> {
        let dir = tempfile::tempdir()?;
        let values = dir.path().join("values.yaml");
        fs::write(&values, values_yaml)?;
        let mut args = vec![
            "install".to_string(),
            "--root".into(),
            root.display().to_string(),
            "--values".into(),
            values.display().to_string(),
        ];
        if !wait {
            args.push("--no-wait".into());
        }
        self.script_ok(&args, 1800).map(|_| ())
    }

    /// `helm uninstall` of the chart, waiting until its pods are gone.
    pub fn uninstall(&self) -> Result<()> {
        let o = self.helm_output(&["uninstall", RELEASE, "--namespace", NAMESPACE, "--wait", "--timeout", "3m"]);
        if !o.status.success() && !output_text(&o).contains("not found") {
            bail!("helm uninstall failed ({}):\n{}", o.status, output_text(&o));
        }
        self.wait_until("the release's pods are gone", Duration::from_secs(180), || {
            let pods = self.release_pods()?;
            Ok(pods.is_empty().then_some(()))
        })
    }

    /// The pods of the release (`kubectl get pods -l app.kubernetes.io/instance=RELEASE`).
    pub fn release_pods(&self) -> Result<Vec<Value>> {
        let sel = format!("app.kubernetes.io/instance={RELEASE}");
        let list = self.get_json(&["pods", "-n", NAMESPACE, "-l", &sel])?;
        Ok(list["items"].as_array().cloned().unwrap_or_default())
    }

    /// The node's `.status.allocatable` extended resources (`vendor/name` -> count).
    pub fn allocatable(&self) -> Result<BTreeMap<String, i64>> {
        let node = self.get_json(&["node", self.node_name()])?;
        let mut out = BTreeMap::new();
        if let Some(m) = node["status"]["allocatable"].as_object() {
            for (k, v) in m {
                if k.contains('/') && !k.starts_with("kubernetes.io/") {
                    out.insert(k.clone(), v.as_str().and_then(|s| s.parse().ok()).unwrap_or(0));
                }
            }
        }
        Ok(out)
    }

    /// Waits (up to 90 s) until the node's allocatable `resource` is `count`.
    pub fn wait_allocatable(&self, resource: &str, count: i64) -> Result<()> {
        self.wait_allocatable_within(resource, count, Duration::from_secs(90))
    }

    /// Waits up to `limit` until the node's allocatable `resource` is `count`; the error names
    /// the last value seen and the plugin's log.
    pub fn wait_allocatable_within(&self, resource: &str, count: i64, limit: Duration) -> Result<()> {
        let mut last = None;
        let r = self.wait_until(&format!("allocatable {resource} = {count}"), limit, || {
            let a = self.allocatable()?;
            last = a.get(resource).copied();
            Ok((last == Some(count)).then_some(()))
        });
        r.map_err(|e| anyhow::anyhow!("{e} (last seen: {last:?}); plugin log:\n{}", self.plugin_logs()))
    }

    /// The log of `container` in the release's pod `pod`, this run's and the previous one's.
    pub fn release_log(&self, pod: &str, container: &str) -> String {
        let mut out = String::new();
        for prev in [true, false] {
            let mut a = vec!["logs", "-n", NAMESPACE, pod, "-c", container];
            if prev {
                a.push("--previous");
            }
            let o = self.kubectl(&a);
            if o.status.success() {
                out.push_str(&String::from_utf8_lossy(&o.stdout));
            }
        }
        out
    }

    /// Every container log of the release's pods (for failure messages).
    pub fn plugin_logs(&self) -> String {
        let sel = format!("app.kubernetes.io/instance={RELEASE}");
        let o = self.kubectl(&["logs", "-n", NAMESPACE, "-l", &sel, "--all-containers", "--tail=60", "--prefix"]);
        output_text(&o)
    }

    /// Calls `f` every 250 ms until it gives `Some`, or fails after `limit` naming `what`.
    pub fn wait_until<T>(&self, what: &str, limit: Duration, mut f: impl FnMut() -> Result<Option<T>>) -> Result<T> {
        let t = Instant::now();
        let mut last_err = None;
        loop {
            match f() {
                Ok(Some(v)) => return Ok(v),
                Ok(None) => {}
                Err(e) => last_err = Some(e),
            }
            if t.elapsed() > limit {
                match last_err {
                    Some(e) => bail!("{what}: not within {limit:?}; last error: {e:#}"),
                    None => bail!("{what}: not within {limit:?}"),
                }
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// Creates the pod (deleting an old one of the same name first).
    pub fn create_pod(&self, spec: &PodSpec) -> Result<()> {
        self.delete_pod(&spec.name)?;
        self.apply(&spec.manifest().to_string())
    }

    /// Deletes a test pod at once (no grace), waiting until it is gone.
    pub fn delete_pod(&self, name: &str) -> Result<()> {
        self.kubectl_ok(&[
            "delete",
            "pod",
            name,
            "-n",
            TEST_NAMESPACE,
            "--ignore-not-found",
            "--grace-period=0",
            "--force",
            "--wait=true",
        ])
        .map(|_| ())
    }

    /// `kubectl get pod NAME -o json` in [`TEST_NAMESPACE`].
    pub fn pod(&self, name: &str) -> Result<Value> {
        self.get_json(&["pod", name, "-n", TEST_NAMESPACE])
    }

    /// Waits (a minute at most) until pod `name` in [`TEST_NAMESPACE`] is reported
    /// unschedulable (condition PodScheduled False, reason Unschedulable); the scheduler's
    /// message. Errors when the pod leaves Pending or the minute passes.
    pub fn unschedulable(&self, name: &str) -> Result<String> {
        self.wait_until(&format!("pod {name} unschedulable"), Duration::from_secs(60), || {
            let p = self.pod(name)?;
            anyhow::ensure!(p["status"]["phase"] == "Pending", "pod {name} left Pending: {}", p["status"]);
            let cond = p["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|c| c["type"] == "PodScheduled" && c["status"] == "False" && c["reason"] == "Unschedulable")
                .cloned();
            Ok(cond.map(|c| c["message"].as_str().unwrap_or_default().to_string()))
        })
    }

    /// Waits until pod `name` is in one of `phases`; returns the pod.
    pub fn wait_pod_phase(&self, name: &str, phases: &[&str], limit: Duration) -> Result<Value> {
        let mut last = Value::Null;
        let r = self.wait_until(&format!("pod {name} in phase {phases:?}"), limit, || {
            last = self.pod(name)?;
            let phase = last["status"]["phase"].as_str().unwrap_or("");
            Ok(phases.contains(&phase).then(|| last.clone()))
        });
        r.map_err(|e| anyhow::anyhow!("{e}; pod status: {}", last["status"]))
    }

    /// The log of pod `name`'s container `c`.
    pub fn logs(&self, name: &str) -> Result<String> {
        self.kubectl_ok(&["logs", name, "-n", TEST_NAMESPACE, "-c", "c"])
    }

    /// Runs a pod to its end (Succeeded or Failed) and returns its status and log; the pod is
    /// deleted afterwards.
    pub fn run_pod(&self, spec: &PodSpec) -> Result<PodResult> {
        self.create_pod(spec)?;
        let pod = self.wait_pod_phase(&spec.name, &["Succeeded", "Failed"], Duration::from_secs(120));
        let logs = self.logs(&spec.name).unwrap_or_default();
        let _ = self.delete_pod(&spec.name);
        Ok(PodResult { pod: pod?, logs })
    }

    /// `kubectl exec NAME -- CMD...` in [`TEST_NAMESPACE`]; stdout.
    pub fn exec(&self, name: &str, cmd: &[&str]) -> Result<String> {
        let mut a = vec!["exec", name, "-n", TEST_NAMESPACE, "-c", "c", "--"];
        a.extend_from_slice(cmd);
        self.kubectl_ok(&a)
    }

    /// The node's events about `name` (`kubectl get events --field-selector involvedObject.name=`),
    /// as `reason: message` lines.
    pub fn events(&self, namespace: &str, name: &str) -> Result<Vec<String>> {
        let sel = format!("involvedObject.name={name}");
        let list = self.get_json(&["events", "-n", namespace, "--field-selector", &sel])?;
        Ok(list["items"]
            .as_array()
            .map(|items| {
                items
                    .iter()
                    .map(|e| format!("{}: {}", e["reason"].as_str().unwrap_or(""), e["message"].as_str().unwrap_or("")))
                    .collect()
            })
            .unwrap_or_default())
    }

    /// Restarts the kubelet (state kept), waiting until the node is Ready again.
    pub fn restart_kubelet(&self) -> Result<()> {
        self.script_ok(&["restart".into(), "kubelet".into()], 600).map(|_| ())
    }

    /// Stops everything of the cluster (`k8s-node.sh down`).
    pub fn down(self) -> Result<()> {
        self.script_ok(&["down".into()], 600).map(|_| ())
    }
}
