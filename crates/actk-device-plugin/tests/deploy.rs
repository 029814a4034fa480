//! deploy/: the manifest and the Helm chart parse (serde-saphyr), ask for no more privilege than
//! each part needs (the plugin, the CDI spec generator, the node setup, the NRI plugin), configure the plugin
//! with keys and variables it accepts, and agree with each other; the chart's schema refuses bad
//! values.
//!
//! The chart is rendered with a real `helm template` (and `helm lint`) when a helm binary is
//! found ($ACTK_HELM, `target/tools/helm` as deploy/helm/install-helm.sh puts it, or PATH);
//! without one those tests say they are skipping. The checks that need no helm always run: every
//! `.Values.x.y` a template uses exists in values.yaml. The chart on a real cluster:
//! crates/k8s-e2e.

use actk_core::policy::{OnRefused, Trust};
use actk_device_plugin::config::{FileConfig, Settings};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn docs(text: &str, what: &str) -> Vec<Value> {
    serde_saphyr::from_multiple::<Value>(text)
        .unwrap_or_else(|e| panic!("{what} is not valid YAML: {e}"))
        .into_iter()
        .filter(|d| !d.is_null())
        .collect()
}

fn kind<'a>(docs: &'a [Value], k: &str) -> &'a Value {
    docs.iter().find(|d| d["kind"] == k).unwrap_or_else(|| panic!("no {k} in {docs:?}"))
}

/// The container named `name` of a pod spec.
fn container<'a>(pod: &'a Value, name: &str) -> &'a Value {
    pod["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no container {name}"))
}

/// The plugin's DaemonSet (the node setup's has the component label).
fn plugin_daemonset<'a>(all: &'a [Value], what: &str) -> &'a Value {
    all.iter()
        .find(|d| d["kind"] == "DaemonSet" && d["metadata"]["labels"]["app.kubernetes.io/component"].is_null())
        .unwrap_or_else(|| panic!("{what}: no plugin DaemonSet"))
}

/// The checks every rendering of the DaemonSet must pass.
fn check_daemonset(all: &[Value], what: &str) {
    let ds = plugin_daemonset(all, what);
    assert_eq!(ds["apiVersion"], "apps/v1", "{what}");
    let pod = &ds["spec"]["template"]["spec"];
    // The plugin talks to the API server only to read its Node's config label (named configs).
    let named = pod["volumes"].as_array().unwrap().iter().any(|v| v["name"] == "nvidia-config");
    assert_eq!(pod["automountServiceAccountToken"], named, "{what}: a token only for named configs");
    // ... but always the same service account, rendered beside it: an upgrade that drops a
    // serviceAccountName leaves it in the live template (the API server's deprecated
    // serviceAccount field), and a ServiceAccount that went with it would stop every new pod.
    let sa = pod["serviceAccountName"].as_str().unwrap_or_else(|| panic!("{what}: no serviceAccountName"));
    assert!(sa.ends_with("-device-plugin"), "{what}: {sa}");
    assert!(
        all.iter().any(|d| d["kind"] == "ServiceAccount" && d["metadata"]["name"] == sa),
        "{what}: the DaemonSet names ServiceAccount {sa}, which is not rendered"
    );
    assert!(pod["hostPID"].is_null(), "{what}: only the node setup needs the host's pids");
    let volumes = pod["volumes"].as_array().unwrap();
    let host_path =
        |name: &str| volumes.iter().find(|v| v["name"] == name).and_then(|v| v["hostPath"]["path"].as_str());
    let mut seen = Vec::new();
    for c in pod["containers"].as_array().unwrap() {
        let name = c["name"].as_str().unwrap();
        let sc = &c["securityContext"];
        assert_eq!(sc["privileged"], false, "{what}: {name}");
        assert_eq!(sc["allowPrivilegeEscalation"], false, "{what}: {name}");
        assert_eq!(sc["readOnlyRootFilesystem"], true, "{what}: {name}");
        assert_eq!(sc["capabilities"]["drop"], serde_json::json!(["ALL"]), "{what}: {name}");
        assert!(sc["capabilities"]["add"].is_null(), "{what}: {name}: no capability is added");
        assert_eq!(c["terminationMessagePolicy"], "FallbackToLogsOnError", "{what}: {name}: errors show in the status");
        // hostPath volumes: the plugin writes only its sockets, the generator only the specs.
        for m in c["volumeMounts"].as_array().unwrap() {
            let vol = m["name"].as_str().unwrap();
            let Some(hp) = host_path(vol) else { continue };
            seen.push(hp.to_string());
            let writable = (name == "actk-device-plugin" && hp == "/var/lib/kubelet/device-plugins")
                || (name == "cdi-spec-generator" && vol.ends_with("-rw") && hp == "/var/run/cdi");
            if writable {
                assert_ne!(m["readOnly"], true, "{what}: {name} writes to {hp}");
            } else {
                assert_eq!(m["readOnly"], true, "{what}: {name}: host path {hp} must be mounted read-only");
            }
        }
    }
    for wanted in ["/var/lib/kubelet/device-plugins", "/var/run/cdi"] {
        assert!(seen.iter().any(|s| s == wanted), "{what}: hostPath {wanted} missing ({seen:?})");
    }
    let c = container(pod, "actk-device-plugin");
    let mounts = c["volumeMounts"].as_array().unwrap();
    // The host root the plugin is told about is where /dev and /sys are mounted (or all of it).
    let env: Vec<(&str, &str)> =
        c["env"].as_array().unwrap().iter().filter_map(|e| Some((e["name"].as_str()?, e["value"].as_str()?))).collect();
    let value = |n: &str| env.iter().find(|(k, _)| *k == n).map(|(_, v)| *v).unwrap_or_else(|| panic!("{what}: {n}"));
    let root = value("ACTK_ROOT");
    for dir in ["dev", "sys"] {
        assert!(
            mounts.iter().any(|m| m["mountPath"] == format!("{root}/{dir}").as_str() || m["mountPath"] == root),
            "{what}: {root}/{dir} not mounted"
        );
    }
    // The spec directories the plugin reads are mounted under the host mount.
    assert_eq!(value("ACTK_DEVICE_PLUGIN_HOST_MOUNT"), "/host");
    for d in value("ACTK_DEVICE_PLUGIN_SPEC_DIRS").split(',') {
        assert!(
            mounts.iter().any(|m| m["mountPath"] == format!("/host{d}").as_str()),
            "{what}: spec dir {d} not mounted"
        );
    }
    // Every variable is one the binary reads (its --help lists them).
    let help = Command::new(env!("CARGO_BIN_EXE_actk-device-plugin")).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    for (name, _) in &env {
        if *name != "ACTK_LOG" {
            assert!(
                help.contains(&format!("[env: {name}")),
                "{what}: {name} is not a variable of actk-device-plugin --help"
            );
        }
    }
    // The config file the pod mounts is a config the plugin accepts.
    let cm = kind(all, "ConfigMap");
    let text = cm["data"]["device-plugin.toml"].as_str().expect("device-plugin.toml in the ConfigMap");
    let file: FileConfig = toml::from_str(text).unwrap_or_else(|e| panic!("{what}: ConfigMap device-plugin.toml: {e}"));
    Settings::merge(Default::default(), file, what).unwrap_or_else(|e| panic!("{what}: {e}"));
    let args: Vec<&str> = c["args"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    let cfg_mount = mounts.iter().find(|m| m["name"] == "config").expect("config mount");
    assert!(
        args.contains(&format!("--config={}", cfg_mount["mountPath"].as_str().unwrap()).as_str()),
        "{what}: {args:?}"
    );
}

#[test]
fn daemonset_manifest_parses_and_is_least_privilege() {
    let path = repo().join("deploy/kubernetes/actk-device-plugin.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    let all = docs(&text, &path.display().to_string());
    let mut kinds: Vec<&str> = all.iter().filter_map(|d| d["kind"].as_str()).collect();
    kinds.sort_unstable();
    assert_eq!(
        kinds,
        [
            "ClusterRole",
            "ClusterRoleBinding",
            "ConfigMap",
            "DaemonSet",
            "DaemonSet",
            "DaemonSet",
            "Service",
            "ServiceAccount",
            "ServiceAccount",
            "ServiceAccount",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
            "ValidatingAdmissionPolicyBinding"
        ],
        "the plugin (its service account always there), the exporter (its telemetry grant's policy) and the node labeller"
    );
    check_daemonset(&all, "deploy/kubernetes/actk-device-plugin.yaml");
}

/// Issue 30: the exporter and the node labeller, on by default (as GPU Operator deploys
/// dcgm-exporter and GFD): unprivileged like every part; the exporter without a token, behind a
/// Service with Prometheus scrape annotations; the labeller with `get`/`patch` on nodes only,
/// narrowed to its own node by an admission policy bound with Deny; both off with their values.
#[test]
fn exporter_and_node_labeller_render_least_privilege() {
    let Some(helm) = helm() else {
        eprintln!("skipping: no helm binary (run deploy/helm/install-helm.sh, or set ACTK_HELM)");
        return;
    };
    let all = render(&helm, &[]);
    let named = |kind: &str, name: &str| {
        all.iter()
            .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no {kind} {name}"))
            .clone()
    };
    for (ds, c) in
        [("actk-device-plugin-exporter", "actk-exporter"), ("actk-device-plugin-labeller", "actk-node-labeller")]
    {
        let pod = named("DaemonSet", ds)["spec"]["template"]["spec"].clone();
        let sc = &container(&pod, c)["securityContext"];
        assert_eq!(
            (sc["privileged"].clone(), sc["readOnlyRootFilesystem"].clone()),
            (false.into(), true.into()),
            "{ds}"
        );
        assert_eq!(sc["capabilities"]["drop"], serde_json::json!(["ALL"]), "{ds}");
        for m in container(&pod, c)["volumeMounts"].as_array().unwrap() {
            assert_eq!(m["readOnly"], true, "{ds}: {m}");
        }
    }
    let exporter = named("DaemonSet", "actk-device-plugin-exporter")["spec"]["template"]["spec"].clone();
    assert_eq!(exporter["automountServiceAccountToken"], false);
    let args = container(&exporter, "actk-exporter")["args"].clone();
    assert!(args.as_array().unwrap().iter().any(|a| a == "--listen=0.0.0.0:9500"), "{args}");
    let svc = named("Service", "actk-device-plugin-exporter");
    assert_eq!(svc["metadata"]["annotations"]["prometheus.io/scrape"], "true");
    assert_eq!(svc["metadata"]["annotations"]["prometheus.io/port"], "9500");
    assert_eq!(svc["spec"]["selector"]["app.kubernetes.io/name"], "actk-exporter");
    let labeller = named("DaemonSet", "actk-device-plugin-labeller")["spec"]["template"]["spec"].clone();
    assert_eq!(labeller["serviceAccountName"], "actk-device-plugin-labeller");
    let args = container(&labeller, "actk-node-labeller")["args"].clone();
    assert_eq!(
        args.as_array().unwrap()[0..3],
        serde_json::json!(["node", "labels", "--root=/host"]).as_array().unwrap()[..],
        "{args}"
    );
    assert!(args.as_array().unwrap().iter().any(|a| a == "--node=$(NODE_NAME)"), "{args}");
    assert_eq!(
        named("ClusterRole", "actk-device-plugin-labeller")["rules"],
        serde_json::json!([{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}])
    );
    let vap = named("ValidatingAdmissionPolicy", "actk-device-plugin-labeller-own-node");
    assert!(
        vap["spec"]["matchConditions"][0]["expression"]
            .as_str()
            .unwrap()
            .contains("system:serviceaccount:kube-system:actk-device-plugin-labeller"),
        "{vap}"
    );
    let binding = named("ValidatingAdmissionPolicyBinding", "actk-device-plugin-labeller-own-node");
    assert_eq!(binding["spec"]["validationActions"], serde_json::json!(["Deny"]));
    assert!(args.as_array().unwrap().iter().any(|a| a == "--plugin-config=/etc/actk/device-plugin.toml"), "{args}");
    // No named configs: the label is not an input (the plugin ignores it too).
    assert!(!args.as_array().unwrap().iter().any(|a| a == "--node-config"), "{args}");
    // Without the plugin (DRA only) there is no plugin config: the chart's MIG strategy only.
    let dra_only = render(&helm, &["devicePlugin.enabled=false", "dra.enabled=true"]);
    let l = dra_only
        .iter()
        .find(|d| d["kind"] == "DaemonSet" && d["metadata"]["name"] == "actk-device-plugin-labeller")
        .expect("the labeller without the plugin");
    let a = container(&l["spec"]["template"]["spec"], "actk-node-labeller")["args"].as_array().unwrap().clone();
    assert!(!a.iter().any(|a| a.as_str().unwrap().starts_with("--plugin-config")), "{a:?}");
    assert!(a.iter().any(|a| a == "--mig-strategy=none"), "{a:?}");
    // exporter.privileged=true (NVML on a real NVIDIA node): the exporter alone is privileged,
    // with nothing that a privileged container must not set (allowPrivilegeEscalation: false
    // is refused by the API server then); its mounts stay read-only, every other part as before.
    let privileged = render(&helm, &["exporter.privileged=true"]);
    for d in privileged.iter().filter(|d| d["kind"] == "DaemonSet") {
        let name = d["metadata"]["name"].as_str().unwrap();
        for c in d["spec"]["template"]["spec"]["containers"].as_array().unwrap() {
            let sc = &c["securityContext"];
            if name == "actk-device-plugin-exporter" {
                assert_eq!(sc["privileged"], true, "{name}");
                assert!(sc["allowPrivilegeEscalation"].is_null(), "{name}: {sc}");
                assert_eq!(sc["readOnlyRootFilesystem"], true, "{name}");
                for m in c["volumeMounts"].as_array().unwrap() {
                    assert_eq!(m["readOnly"], true, "{name}: {m}");
                }
            } else {
                assert_eq!(sc["privileged"], false, "{name}: only the exporter");
            }
        }
    }
    check_daemonset(&privileged, "exporter.privileged=true");
    // The telemetry grant (values.yaml exporter.deviceGrant): by default the plugin serves
    // actk.dev/telemetry, the unprivileged exporter asks for one under its own service account,
    // and a policy bound with Deny lets no other pod ask. Privileged, or without the plugin, or
    // off: none of the three.
    let grant_of = |all: &[Value]| {
        let plugin = all.iter().find(|d| d["kind"] == "DaemonSet" && d["metadata"]["name"] == "actk-device-plugin");
        let env = plugin.map(|p| {
            container(&p["spec"]["template"]["spec"], "actk-device-plugin")["env"]
                .as_array()
                .unwrap()
                .iter()
                .find(|e| e["name"] == "ACTK_DEVICE_PLUGIN_TELEMETRY_RESOURCE")
                .map(|e| e["value"].clone())
        });
        let exporter = all
            .iter()
            .find(|d| d["kind"] == "DaemonSet" && d["metadata"]["name"] == "actk-device-plugin-exporter")
            .map(|d| container(&d["spec"]["template"]["spec"], "actk-exporter")["resources"]["limits"].clone());
        let policy = all.iter().any(|d| {
            d["kind"] == "ValidatingAdmissionPolicyBinding"
                && d["spec"]["policyName"] == "actk-device-plugin-telemetry-grant"
                && d["spec"]["validationActions"] == serde_json::json!(["Deny"])
        });
        (env.flatten(), exporter.map(|l| l["actk.dev/telemetry"].clone()), policy)
    };
    assert_eq!(grant_of(&all), (Some("actk.dev/telemetry".into()), Some(1.into()), true));
    assert_eq!(exporter["serviceAccountName"], "actk-device-plugin-exporter");
    let vap = named("ValidatingAdmissionPolicy", "actk-device-plugin-telemetry-grant");
    let rule = vap["spec"]["validations"][0]["expression"].as_str().unwrap();
    assert!(
        rule.contains("request.namespace == \"kube-system\"")
            && rule.contains("object.spec.serviceAccountName == \"actk-device-plugin-exporter\""),
        "{vap}"
    );
    assert!(vap["spec"]["variables"][0]["expression"].as_str().unwrap().contains("initContainers"), "{vap}");
    // The policy stays whatever the exporter's values: a plugin pod of the revision before may
    // still serve the grant while the one that turns it off rolls out.
    assert_eq!(grant_of(&privileged), (None, Some(Value::Null), true), "privileged: no grant, the policy kept");
    let no_plugin = render(&helm, &["devicePlugin.enabled=false", "dra.enabled=true"]);
    assert_eq!(grant_of(&no_plugin), (None, Some(Value::Null), false), "no plugin to serve it");
    let off = render(&helm, &["exporter.deviceGrant.enabled=false"]);
    assert_eq!(grant_of(&off), (None, Some(Value::Null), true), "deviceGrant off: the policy kept");
    // A cluster without the policy API (before 1.30) gets no grant rather than an unguarded one.
    let old = render_args(&helm, &[]).unwrap();
    assert_eq!(grant_of(&old), (None, Some(Value::Null), false), "no admission policy API");
    let off = render(&helm, &["exporter.enabled=false", "nodeLabeller.enabled=false"]);
    let mut kinds: Vec<&str> = off.iter().filter_map(|d| d["kind"].as_str()).collect();
    kinds.sort_unstable();
    assert_eq!(
        kinds,
        ["ConfigMap", "DaemonSet", "ServiceAccount", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"],
        "only the plugin (and its tokenless identity, and the telemetry grant's policy, kept with the plugin)"
    );
}

/// Every `.Values.a.b` a template refers to is defined in values.yaml.
#[test]
fn chart_templates_use_only_defined_values() {
    let chart = repo().join("deploy/helm/actk-device-plugin");
    let values: Value = serde_saphyr::from_str(&std::fs::read_to_string(chart.join("values.yaml")).unwrap()).unwrap();
    let re = regex::Regex::new(r"\.Values((?:\.[A-Za-z_][A-Za-z0-9_]*)+)").unwrap();
    let mut checked = 0;
    for e in std::fs::read_dir(chart.join("templates")).unwrap() {
        let p = e.unwrap().path();
        let text = std::fs::read_to_string(&p).unwrap();
        for cap in re.captures_iter(&text) {
            let mut v = &values;
            for key in cap[1].trim_start_matches('.').split('.') {
                v = v.get(key).unwrap_or_else(|| panic!("{}: .Values{} is not in values.yaml", p.display(), &cap[1]));
            }
            checked += 1;
        }
    }
    assert!(checked > 10, "templates refer to values ({checked} checked)");
}

fn helm() -> Option<PathBuf> {
    let candidates = [
        std::env::var_os("ACTK_HELM").map(PathBuf::from),
        Some(actk_testsupport::engines::target_dir().join("tools/helm")),
        Some(repo().join("target/tools/helm")),
        actk_testsupport::engines::which("helm"),
    ];
    candidates.into_iter().flatten().find(|p| p.is_file())
}

fn render(helm: &Path, set: &[&str]) -> Vec<Value> {
    let chart = repo().join("deploy/helm/actk-device-plugin");
    let mut cmd = Command::new(helm);
    // What `helm install` sees on a cluster of 1.30 or later, the chart's floor (the labeller's
    // admission policy): the ValidatingAdmissionPolicy API.
    cmd.args(["template", "actk-device-plugin", "--namespace", "kube-system", "--api-versions", VAP_API]).arg(&chart);
    for s in set {
        cmd.args(["--set", s]);
    }
    let o = cmd.output().unwrap();
    assert!(o.status.success(), "helm template {set:?}: {}", String::from_utf8_lossy(&o.stderr));
    docs(&String::from_utf8_lossy(&o.stdout), "helm template output")
}

#[test]
fn helm_chart_lints_renders_and_matches_the_manifest() {
    let Some(helm) = helm() else {
        eprintln!("skipping: no helm binary (run deploy/helm/install-helm.sh, or set ACTK_HELM)");
        return;
    };
    let chart = repo().join("deploy/helm/actk-device-plugin");
    let lint = Command::new(&helm).arg("lint").arg("--strict").arg(&chart).output().unwrap();
    assert!(
        lint.status.success(),
        "helm lint: {}{}",
        String::from_utf8_lossy(&lint.stdout),
        String::from_utf8_lossy(&lint.stderr)
    );

    let default = render(&helm, &[]);
    check_daemonset(&default, "helm template (defaults)");
    assert!(
        !default.iter().any(|d| d["kind"] == "Service" && d["metadata"]["name"] == "actk-device-plugin-metrics"),
        "no metrics Service unless enabled"
    );
    assert!(!default.iter().any(|d| d["kind"] == "RuntimeClass"), "no RuntimeClass without node setup");

    // The static manifest is the chart's default rendering: every object agrees.
    let manifest =
        docs(&std::fs::read_to_string(repo().join("deploy/kubernetes/actk-device-plugin.yaml")).unwrap(), "manifest");
    assert_eq!(default.len(), manifest.len(), "the same objects in the chart and deploy/kubernetes");
    for (a, b) in default.iter().zip(&manifest) {
        assert_eq!(
            a, b,
            "{} differs between the chart and deploy/kubernetes (render it again: see its header)",
            a["kind"]
        );
    }

    let with_metrics =
        render(&helm, &["metrics.enabled=true", "metrics.port=9555", "config.strategies={cdi-cri,device-specs}"]);
    check_daemonset(&with_metrics, "helm template (metrics)");
    let svc = with_metrics
        .iter()
        .find(|d| d["kind"] == "Service" && d["metadata"]["name"] == "actk-device-plugin-metrics")
        .expect("the metrics Service");
    assert_eq!(svc["spec"]["ports"][0]["port"], 9555);
    let toml_text = kind(&with_metrics, "ConfigMap")["data"]["device-plugin.toml"].as_str().unwrap().to_string();
    let file: FileConfig = toml::from_str(&toml_text).unwrap();
    let s = Settings::merge(Default::default(), file, "chart").unwrap();
    assert_eq!(s.metrics_address.map(|a| a.port()), Some(9555));
    assert_eq!(s.strategies.iter().map(|s| s.to_string()).collect::<Vec<_>>(), ["cdi-cri", "device-specs"]);
    let pod = &plugin_daemonset(&with_metrics, "metrics")["spec"]["template"]["spec"];
    let plugin = container(pod, "actk-device-plugin");
    assert_eq!(plugin["ports"][0]["containerPort"], 9555);
    // device-specs sends driver files: the plugin then sees the whole host root, read-only.
    let root_mount = plugin["volumeMounts"].as_array().unwrap().iter().find(|m| m["name"] == "host-root");
    assert_eq!(
        root_mount.map(|m| (m["mountPath"].clone(), m["readOnly"].clone())),
        Some(("/host".into(), true.into()))
    );
    let pod = &plugin_daemonset(&default, "defaults")["spec"]["template"]["spec"];
    assert!(
        !container(pod, "actk-device-plugin")["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["name"] == "host-root"),
        "without device-specs the plugin sees only /dev, /sys and two /proc entries"
    );
}

/// The parts the chart adds on a node: the CDI generator (with the arguments the chart's values
/// give), the node setup (its own DaemonSet, the only one with the host's pids, nothing
/// privileged), the RuntimeClass, and values the schema refuses.
#[test]
fn helm_chart_generator_node_setup_and_schema() {
    let Some(helm) = helm() else {
        eprintln!("skipping: no helm binary (run deploy/helm/install-helm.sh, or set ACTK_HELM)");
        return;
    };
    let all = render(&helm, &["nodeSetup.enabled=true", "hostRoot=/run/nvidia/driver", "cdi.deviceNameStrategy=uuid"]);
    check_daemonset(&all, "helm template (node setup)");
    let pod = &plugin_daemonset(&all, "node setup")["spec"]["template"]["spec"];
    let generator = container(pod, "cdi-spec-generator");
    let args: Vec<&str> = generator["args"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert_eq!(args[..2], ["cdi", "generate"]);
    for a in [
        "--root=/host/run/nvidia/driver",
        "--host-mount=/host",
        "--output=/host/var/run/cdi",
        "--device-name-strategy=uuid",
        "--ldcache-hook=/usr/local/actk/actk-hook",
        "--watch=5",
    ] {
        assert!(args.contains(&a), "{a} in {args:?}");
    }
    let plugin = container(pod, "actk-device-plugin");
    let env = |n: &str| plugin["env"].as_array().unwrap().iter().find(|e| e["name"] == n).map(|e| e["value"].clone());
    assert_eq!(env("ACTK_ROOT"), Some("/host/run/nvidia/driver".into()));

    let setup = all
        .iter()
        .find(|d| d["kind"] == "DaemonSet" && d["metadata"]["labels"]["app.kubernetes.io/component"] == "node-setup")
        .expect("the node setup DaemonSet");
    let spod = &setup["spec"]["template"]["spec"];
    assert_eq!(spod["hostPID"], true, "it finds and signals containerd");
    assert_eq!(spod["automountServiceAccountToken"], false);
    let c = container(spod, "node-setup");
    let sc = &c["securityContext"];
    assert_eq!(sc["privileged"], false);
    assert_eq!(sc["capabilities"]["drop"], serde_json::json!(["ALL"]));
    let args: Vec<&str> = c["args"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    for a in [
        "node",
        "setup",
        "--wait",
        "--host-mount=/host",
        "--install-dir=/usr/local/actk",
        "--config=/etc/containerd/config.toml",
        "--root=/run/nvidia/driver",
    ] {
        assert!(args.contains(&a), "{a} in {args:?}");
    }
    let vols = spod["volumes"].as_array().unwrap();
    let paths: Vec<&str> = vols.iter().filter_map(|v| v["hostPath"]["path"].as_str()).collect();
    assert_eq!(paths, ["/usr/local/actk", "/etc/containerd", "/run/containerd"], "what it edits, and the socket's dir");
    let socket_mount = c["volumeMounts"].as_array().unwrap().iter().find(|m| m["name"] == "containerd-socket").unwrap();
    assert_eq!(socket_mount["readOnly"], true);
    // The trust policy of a multi-tenant node (SECURITY.md) by default, each key a value.
    for a in [
        "--env-requests=privileged",
        "--annotation-requests=privileged",
        "--mount-requests=always",
        "--on-refused=warn",
        "--privileged-means=privileged-flag",
    ] {
        assert!(args.contains(&a), "{a} in {args:?}");
    }
    let rc = kind(&all, "RuntimeClass");
    assert_eq!((rc["metadata"]["name"].as_str(), rc["handler"].as_str()), (Some("actk"), Some("actk")));

    // Values the schema refuses at install time, the value's path named.
    let chart = repo().join("deploy/helm/actk-device-plugin");
    for (set, words) in [
        ("config.strategies={cdi}", ["config.strategies", "cdi-cri"]),
        ("hostRoot=relative", ["hostRoot", "pattern"]),
        ("cdi.deviceNameStrategy=name", ["cdi.deviceNameStrategy", "index"]),
        ("nodeSetup.restart=systemd", ["nodeSetup.restart", "signal"]),
        ("nodeSetup.policy.envRequests=sometimes", ["nodeSetup.policy.envRequests", "privileged"]),
        ("config.migStrategy=all", ["config.migStrategy", "mixed"]),
        // envvar with the multi-tenant policy would start every pod without its devices.
        ("nodeSetup.enabled=true,config.strategies={envvar}", ["envvar", "nodeSetup.policy.envRequests"]),
        (
            "sharing.timeSlicing.resources[0].name=nvidia.com/gpu,sharing.timeSlicing.resources[0].replicas=0",
            ["sharing.timeSlicing.resources.0.replicas", "greater than or equal to 1"],
        ),
    ] {
        let o = Command::new(&helm).args(["template", "x"]).arg(&chart).args(["--set", set]).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{set} must be refused");
        for w in words {
            assert!(err.contains(w), "{set}: the error names {w}: {err}");
        }
    }
}

/// Chart values for the device list, MIG and time-slicing reach the plugin's config file as
/// keys it accepts, and the node setup's policy flags follow nodeSetup.policy.
#[test]
fn helm_chart_sharing_mig_volume_mounts_and_policy_values() {
    let Some(helm) = helm() else {
        eprintln!("skipping: no helm binary (run deploy/helm/install-helm.sh, or set ACTK_HELM)");
        return;
    };
    let all = render(
        &helm,
        &[
            "config.strategies={volume-mounts}",
            "config.migStrategy=mixed",
            "sharing.timeSlicing.failRequestsGreaterThanOne=true",
            "sharing.timeSlicing.resources[0].name=nvidia.com/gpu",
            "sharing.timeSlicing.resources[0].replicas=4",
            "sharing.timeSlicing.resources[1].name=aws.amazon.com/neuron",
            "sharing.timeSlicing.resources[1].replicas=2",
            "sharing.timeSlicing.resources[1].rename=aws.amazon.com/neuron.shared",
            "nodeSetup.enabled=true",
            "nodeSetup.policy.envRequests=never",
            "nodeSetup.policy.onRefused=fail",
        ],
    );
    check_daemonset(&all, "helm template (sharing)");
    let toml_text = kind(&all, "ConfigMap")["data"]["device-plugin.toml"].as_str().unwrap().to_string();
    let file: FileConfig = toml::from_str(&toml_text).unwrap_or_else(|e| panic!("{e}: {toml_text}"));
    assert_eq!(file.mig_strategy.as_deref(), Some("mixed"), "{toml_text}");
    let ts = file.sharing.as_ref().and_then(|s| s.time_slicing.as_ref()).expect("[sharing.time_slicing]");
    assert_eq!(ts.fail_requests_greater_than_one, Some(true));
    assert_eq!(ts.rename_by_default, Some(false));
    let entries: Vec<(&str, i64, Option<&str>)> =
        ts.resources.iter().map(|r| (r.name.as_str(), r.replicas, r.rename.as_deref())).collect();
    assert_eq!(
        entries,
        [("nvidia.com/gpu", 4, None), ("aws.amazon.com/neuron", 2, Some("aws.amazon.com/neuron.shared"))]
    );
    let s = Settings::merge(Default::default(), file, "chart").unwrap();
    assert_eq!(s.strategies.iter().map(|s| s.to_string()).collect::<Vec<_>>(), ["volume-mounts"]);
    let setup = all
        .iter()
        .find(|d| d["kind"] == "DaemonSet" && d["metadata"]["labels"]["app.kubernetes.io/component"] == "node-setup")
        .expect("the node setup DaemonSet");
    let c = container(&setup["spec"]["template"]["spec"], "node-setup");
    let args: Vec<&str> = c["args"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    for a in ["--env-requests=never", "--annotation-requests=privileged", "--on-refused=fail"] {
        assert!(args.contains(&a), "{a} in {args:?}");
    }
    // Without sharing values the file has no [sharing] (the defaults render as before).
    let plain = render(&helm, &[]);
    let text = kind(&plain, "ConfigMap")["data"]["device-plugin.toml"].as_str().unwrap().to_string();
    assert!(!text.contains("sharing") && !text.contains("mig_strategy"), "{text}");
}

/// The NRI plugin's DaemonSet (nri.enabled, issue 14): least privilege (nothing privileged, no
/// capability, no host pids, every host path read-only but the spec directory its gate's spec
/// goes to: it writes nothing else on the node), the node's NRI socket directory under the host
/// mount, and a config actk accepts that names the node's root, spec directories and hook under
/// /host and carries nri.policy. Values that would start pods without their devices are refused
/// at install time.
#[test]
fn helm_chart_nri_plugin() {
    let Some(helm) = helm() else {
        eprintln!("skipping: no helm binary (run deploy/helm/install-helm.sh, or set ACTK_HELM)");
        return;
    };
    let all = render(
        &helm,
        &[
            "config.strategies={volume-mounts}",
            "nri.enabled=true",
            "nri.socket=/run/nri/nri.sock",
            "nri.policy.onRefused=fail",
            "nodeSetup.enabled=true",
        ],
    );
    check_daemonset(&all, "helm template (nri)");
    let labelled = |k: &str| {
        all.iter()
            .find(|d| d["kind"] == k && d["metadata"]["labels"]["app.kubernetes.io/component"] == "nri-plugin")
            .unwrap_or_else(|| panic!("no NRI plugin {k}"))
    };
    let ds = labelled("DaemonSet");
    let pod = &ds["spec"]["template"]["spec"];
    assert!(pod["hostPID"].is_null() && pod["automountServiceAccountToken"] == false, "{pod}");
    assert_ne!(
        ds["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"], "actk-device-plugin",
        "the device plugin's selector must not match the NRI plugin's pods"
    );
    let c = container(pod, "actk-nri");
    let sc = &c["securityContext"];
    assert_eq!(sc["privileged"], false);
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["capabilities"]["drop"], serde_json::json!(["ALL"]));
    let args: Vec<&str> = c["args"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert_eq!(
        args,
        [
            "--socket=/host/run/nri/nri.sock",
            "--name=actk",
            "--idx=10",
            "--host-mount=/host",
            "--gate-spec-dir=/host/var/run/cdi"
        ]
    );
    let vols = pod["volumes"].as_array().unwrap();
    let mut host_paths = Vec::new();
    for m in c["volumeMounts"].as_array().unwrap() {
        let Some(hp) = vols.iter().find(|v| v["name"] == m["name"]).and_then(|v| v["hostPath"]["path"].as_str()) else {
            continue;
        };
        // The gate's spec goes where the CDI generator writes, the last spec directory.
        let writable = hp == "/var/run/cdi";
        assert_eq!(
            m["readOnly"], !writable,
            "host path {hp} must be mounted read-only unless it takes the gate's spec"
        );
        let at = if hp == "/" { "/host".to_string() } else { format!("/host{hp}") };
        assert_eq!(m["mountPath"].as_str().unwrap(), at, "node path {hp} at {at}");
        host_paths.push(hp);
    }
    for want in ["/run/nri", "/", "/etc/cdi", "/var/run/cdi", "/usr/local/actk"] {
        assert!(host_paths.contains(&want), "{want} mounted: {host_paths:?}");
    }
    let root = c["volumeMounts"].as_array().unwrap().iter().find(|m| m["name"] == "host-root").unwrap();
    assert_eq!(root["recursiveReadOnly"], "IfPossible", "its submounts read-only too where possible: {root}");
    // A hook in a directory another mount shows already gets no mount of its own (the API
    // refuses a pod with two mounts at one path).
    let all = render(
        &helm,
        &["config.strategies={volume-mounts}", "nri.enabled=true", "cdi.ldcacheHook=/var/run/cdi/actk-hook"],
    );
    let ds = all
        .iter()
        .find(|d| d["kind"] == "DaemonSet" && d["metadata"]["labels"]["app.kubernetes.io/component"] == "nri-plugin")
        .unwrap();
    let c = container(&ds["spec"]["template"]["spec"], "actk-nri");
    let mut paths: Vec<&str> =
        c["volumeMounts"].as_array().unwrap().iter().filter_map(|m| m["mountPath"].as_str()).collect();
    let n = paths.len();
    paths.sort();
    paths.dedup();
    assert_eq!(paths.len(), n, "one mount per path: {paths:?}");
    // The config the plugin reads (ACTK_CONFIG) is the ConfigMap's, and actk accepts it.
    let env = &c["env"][0];
    assert_eq!((env["name"].as_str(), env["value"].as_str()), (Some("ACTK_CONFIG"), Some("/etc/actk/actk.toml")));
    let text = labelled("ConfigMap")["data"]["actk.toml"].as_str().expect("actk.toml in the NRI ConfigMap");
    let cfg = actk_core::config::Config::parse(text, Path::new("actk.toml")).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_eq!(cfg.root, Path::new("/host"));
    assert_eq!(cfg.spec_dirs, [Path::new("/host/etc/cdi"), Path::new("/host/var/run/cdi")]);
    assert_eq!(cfg.hook_path.as_deref(), Some(Path::new("/usr/local/actk/actk-hook")), "a node path");
    let p = &cfg.policy;
    assert_eq!(
        (p.env_requests, p.annotation_requests, p.mount_requests, p.on_refused),
        (Trust::Privileged, Trust::Privileged, Trust::Always, OnRefused::Fail)
    );

    // A simulated node or driver root; no hook without the node setup.
    let all = render(&helm, &["config.strategies={volume-mounts}", "nri.enabled=true", "hostRoot=/run/nvidia/driver"]);
    let text = all
        .iter()
        .find(|d| d["kind"] == "ConfigMap" && d["metadata"]["labels"]["app.kubernetes.io/component"] == "nri-plugin")
        .and_then(|d| d["data"]["actk.toml"].as_str())
        .unwrap();
    let cfg = actk_core::config::Config::parse(text, Path::new("actk.toml")).unwrap();
    assert_eq!((cfg.root.as_path(), cfg.hook_path), (Path::new("/host/run/nvidia/driver"), None));

    let chart = repo().join("deploy/helm/actk-device-plugin");
    for (set, words) in [
        // envvar needs env requests trusted: NRI never sees a container as privileged.
        ("nri.enabled=true,config.strategies={envvar}", &["envvar", "nri.policy.envRequests", "always"][..]),
        ("nri.enabled=true,nri.index=100", &["nri.index"][..]),
        ("nri.enabled=true,nri.index=x1", &["nri.index"][..]),
        ("nri.enabled=true,nri.socket=nri.sock", &["nri.socket", "pattern"][..]),
        ("nri.policy.mountRequests=maybe", &["nri.policy.mountRequests"][..]),
    ] {
        let o = Command::new(&helm).args(["template", "x"]).arg(&chart).args(["--set", set]).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{set} must be refused");
        for w in words {
            assert!(err.contains(w), "{set}: the error names {w}: {err}");
        }
    }
    // envvar with env requests trusted renders; an index given as a number is two digits.
    let all = render(
        &helm,
        &["config.strategies={envvar}", "nri.enabled=true", "nri.policy.envRequests=always", "nri.index=7"],
    );
    let ds = all
        .iter()
        .find(|d| d["kind"] == "DaemonSet" && d["metadata"]["labels"]["app.kubernetes.io/component"] == "nri-plugin")
        .unwrap();
    let args = &container(&ds["spec"]["template"]["spec"], "actk-nri")["args"];
    assert_eq!(args[2], "--idx=07", "{args}");
}

/// Without the gate (`nri.gate: false`, issue 28 item 8's "start, and an Event says so") the NRI
/// plugin posts Events on the pods of containers it did not serve: `--post-events`, its node's
/// name, and a service account whose ClusterRole allows creating Events and nothing else. With
/// the gate it has no API access at all (no token, no service account of its own).
#[test]
fn helm_chart_nri_plugin_without_the_gate_may_only_create_events() {
    let Some(helm) = helm() else {
        eprintln!("skipping: no helm binary (run deploy/helm/install-helm.sh, or set ACTK_HELM)");
        return;
    };
    let all = render(&helm, &["config.strategies={volume-mounts}", "nri.enabled=true", "nri.gate=false"]);
    let nri = |k: &str| all.iter().find(|d| d["kind"] == k && d["metadata"]["name"] == "actk-device-plugin-nri");
    let ds = nri("DaemonSet").expect("the NRI DaemonSet");
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "actk-device-plugin-nri", "{pod}");
    assert!(pod["automountServiceAccountToken"].is_null(), "the token it needs to post: {pod}");
    let c = container(pod, "actk-nri");
    let args: Vec<&str> = c["args"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert!(args.contains(&"--post-events") && !args.iter().any(|a| a.starts_with("--gate-spec-dir")), "{args:?}");
    let env = c["env"].as_array().unwrap();
    assert!(
        env.iter().any(|e| e["name"] == "NODE_NAME" && e["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"),
        "{env:?}"
    );
    assert!(nri("ServiceAccount").is_some());
    let role = nri("ClusterRole").expect("the NRI plugin's ClusterRole");
    assert_eq!(
        role["rules"],
        serde_json::json!([{"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]),
        "events create, nothing else"
    );
    let binding = nri("ClusterRoleBinding").expect("its binding");
    assert_eq!(binding["subjects"][0]["name"], "actk-device-plugin-nri");
    // With the gate (the default): no service account, no token, no RBAC.
    let all = render(&helm, &["config.strategies={volume-mounts}", "nri.enabled=true"]);
    assert!(!all.iter().any(|d| d["metadata"]["name"] == "actk-device-plugin-nri"
        && d["kind"] != "DaemonSet"
        && d["kind"] != "ConfigMap"));
}

/// Helm gives templates no access to values.yaml itself: files/defaults.yaml is its copy, from
/// which every template fills in keys an earlier revision's values lack (issue 28 item 11).
#[test]
fn chart_defaults_file_is_values_yaml() {
    let chart = repo().join("deploy/helm/actk-device-plugin");
    let values = std::fs::read_to_string(chart.join("values.yaml")).unwrap();
    let defaults = std::fs::read_to_string(chart.join("files/defaults.yaml")).unwrap();
    assert!(
        values == defaults,
        "files/defaults.yaml differs from values.yaml: cp deploy/helm/actk-device-plugin/values.yaml deploy/helm/actk-device-plugin/files/defaults.yaml"
    );
}

/// `helm template` of the chart at `chart` with `set` values and `--kube-version 1.34`: the
/// documents, or helm's error text.
fn render_chart(helm: &Path, chart: &Path, set: &[&str]) -> Result<Vec<Value>, String> {
    let mut cmd = Command::new(helm);
    cmd.args(["template", "actk-device-plugin", "--namespace", "kube-system"]).arg(chart);
    for s in set {
        cmd.args(["--set", s]);
    }
    let o = cmd.output().unwrap();
    if !o.status.success() {
        return Err(String::from_utf8_lossy(&o.stderr).into_owned());
    }
    Ok(docs(&String::from_utf8_lossy(&o.stdout), "helm template output"))
}

/// Copies the chart directory to `dest`.
fn copy_chart(dest: &Path) {
    let chart = repo().join("deploy/helm/actk-device-plugin");
    let ok = Command::new("cp").arg("-r").arg(&chart).arg(dest).status().unwrap().success();
    assert!(ok, "cp -r {}", chart.display());
}

/// Issue 28 item 11: `helm upgrade --reuse-values` from every earlier revision of the chart.
/// Helm then renders this chart's templates and checks its schema with the old revision's
/// values only (its defaults and the user's, none of this chart's): the test puts each
/// values.yaml of the repository's history (`git log -- values.yaml`) in place of this one's in a
/// copy of the chart, which is exactly that, and every rendering must succeed and configure
/// the plugin with keys it accepts.
#[test]
fn every_earlier_values_yaml_renders_as_reuse_values_would() {
    let Some(helm) = helm() else {
        eprintln!("skipping: no helm binary (run deploy/helm/install-helm.sh, or set ACTK_HELM)");
        return;
    };
    let path = "deploy/helm/actk-device-plugin/values.yaml";
    let log = Command::new("git").current_dir(repo()).args(["log", "--format=%H", "--", path]).output();
    let commits: Vec<String> = match log {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).lines().map(String::from).collect(),
        _ => {
            eprintln!("skipping: not a git checkout (the chart's history is what is tested)");
            return;
        }
    };
    let shallow = Command::new("git").current_dir(repo()).args(["rev-parse", "--is-shallow-repository"]).output();
    if shallow.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "true") {
        eprintln!("note: a shallow clone: only the {} revisions it has are rendered", commits.len());
    } else {
        assert!(commits.len() >= 8, "the chart's values.yaml has a history: {commits:?}");
    }
    let tmp = tempfile::tempdir().unwrap();
    let chart = tmp.path().join("chart");
    copy_chart(&chart);
    for c in &commits {
        let old = Command::new("git").current_dir(repo()).args(["show", &format!("{c}:{path}")]).output().unwrap();
        assert!(old.status.success(), "git show {c}:{path}");
        std::fs::write(chart.join("values.yaml"), &old.stdout).unwrap();
        let what = format!("values.yaml of {}", &c[..12]);
        let all = render_chart(&helm, &chart, &[]).unwrap_or_else(|e| panic!("{what}: {e}"));
        check_daemonset(&all, &what);
        // The parts an old revision had no value for stay off (nri, sharing), as before.
        assert!(!all.iter().any(|d| d["metadata"]["labels"]["app.kubernetes.io/component"] == "nri-plugin"), "{what}");
        // And with what a user would switch on in the same upgrade (--reuse-values --set ...).
        let all = render_chart(&helm, &chart, &["nri.enabled=true", "config.strategies={volume-mounts}"])
            .unwrap_or_else(|e| panic!("{what} with nri.enabled: {e}"));
        assert!(all.iter().any(|d| d["metadata"]["labels"]["app.kubernetes.io/component"] == "nri-plugin"), "{what}");
        assert!(plugin_settings(&all).nri_gate, "{what}: the gate is on with the NRI plugin (nri.gate's default)");
    }
}

/// The NRI gate's arguments of the NRI plugin's container (`--gate-spec-dir=...`).
fn nri_gate_args(all: &[Value]) -> Vec<String> {
    let Some(ds) = all
        .iter()
        .find(|d| d["kind"] == "DaemonSet" && d["metadata"]["labels"]["app.kubernetes.io/component"] == "nri-plugin")
    else {
        return Vec::new();
    };
    let c = container(&ds["spec"]["template"]["spec"], "actk-nri");
    c["args"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .filter(|a| a.contains("gate"))
        .map(String::from)
        .collect()
}

/// The NRI gate wired end to end (issue 28 item 8): with the NRI plugin the device plugin names
/// actk.dev/nri-plugin=required in its answers (`nri_gate`), and the NRI plugin writes that
/// device's spec into a directory the node's runtime reads (the last of cdi.specDirs, mounted
/// writable for it alone); `nri.gate=false` turns both off, and without the NRI plugin there is
/// no gate (nothing would remove its mount).
#[test]
fn nri_gate_reaches_the_device_plugin_and_the_nri_plugin() {
    let Some(helm) = helm() else {
        eprintln!("skipping: no helm binary (run deploy/helm/install-helm.sh, or set ACTK_HELM)");
        return;
    };
    let chart = repo().join("deploy/helm/actk-device-plugin");
    let nri = ["nri.enabled=true", "config.strategies={volume-mounts}"];
    let all = render_chart(&helm, &chart, &nri).unwrap();
    let s = plugin_settings(&all);
    assert!(s.nri_gate);
    assert_eq!(nri_gate_args(&all), ["--gate-spec-dir=/host/var/run/cdi"]);
    assert_eq!(
        s.spec_dirs.last().map(PathBuf::as_path),
        Some(Path::new("/var/run/cdi")),
        "a directory the runtime reads"
    );

    let all = render_chart(&helm, &chart, &[nri[0], nri[1], "cdi.specDirs={/etc/cdi,/run/actk-k8s/cdi}"]).unwrap();
    assert_eq!(nri_gate_args(&all), ["--gate-spec-dir=/host/run/actk-k8s/cdi"]);
    let ds = all
        .iter()
        .find(|d| d["kind"] == "DaemonSet" && d["metadata"]["labels"]["app.kubernetes.io/component"] == "nri-plugin")
        .unwrap();
    let mounts = container(&ds["spec"]["template"]["spec"], "actk-nri")["volumeMounts"].as_array().unwrap().clone();
    let writable: Vec<&str> =
        mounts.iter().filter(|m| m["readOnly"] != true).filter_map(|m| m["mountPath"].as_str()).collect();
    assert_eq!(writable, ["/host/run/actk-k8s/cdi"]);

    let all = render_chart(&helm, &chart, &[nri[0], nri[1], "nri.gate=false"]).unwrap();
    assert!(!plugin_settings(&all).nri_gate);
    assert!(nri_gate_args(&all).is_empty());
    let all = render_chart(&helm, &chart, &["config.strategies={volume-mounts}"]).unwrap();
    assert!(!plugin_settings(&all).nri_gate, "no NRI plugin, no gate");
}

/// The plugin's config file from the chart (the ConfigMap's device-plugin.toml), loaded as the
/// plugin loads it, with NVIDIA's ConfigMap (config.map) written where the pod mounts it.
fn plugin_settings(all: &[Value]) -> Settings {
    let tmp = tempfile::tempdir().unwrap();
    let cm = |suffix: &str| {
        all.iter()
            .find(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"].as_str().is_some_and(|n| n.ends_with(suffix)))
    };
    let mut text = cm("actk-device-plugin").unwrap()["data"]["device-plugin.toml"].as_str().unwrap().to_string();
    if let Some(nv) = cm("-nvidia-config") {
        let dir = tmp.path().join("nvidia");
        std::fs::create_dir_all(&dir).unwrap();
        for (k, v) in nv["data"].as_object().unwrap() {
            std::fs::write(dir.join(k), v.as_str().unwrap()).unwrap();
        }
        text = text.replace("/etc/actk/nvidia", dir.to_str().unwrap());
    }
    let f = tmp.path().join("device-plugin.toml");
    std::fs::write(&f, &text).unwrap();
    let file = FileConfig::load(&f, true).unwrap_or_else(|e| panic!("{e}:\n{text}"));
    Settings::merge(Default::default(), file, "chart").unwrap_or_else(|e| panic!("{e}:\n{text}"))
}

/// Issue 28 item 3: values written for NVIDIA's chart either work (MIG strategy at the top or
/// in flags, list and ID strategies, compatWithCPUManager, config.map/config.name/default, pull
/// secrets, affinity, pod annotations) or are refused at install time naming actk's value to use;
/// nothing is dropped silently (an unknown key is refused by the schema).
#[test]
fn nvidia_chart_values_are_honoured_or_refused_with_the_fix() {
    let Some(helm) = helm() else {
        eprintln!("skipping: no helm binary (run deploy/helm/install-helm.sh, or set ACTK_HELM)");
        return;
    };
    let chart = repo().join("deploy/helm/actk-device-plugin");
    let ok = |set: &[&str]| render_chart(&helm, &chart, set).unwrap_or_else(|e| panic!("{set:?}: {e}"));
    use actk_device_plugin::resources::MigStrategy;
    assert_eq!(plugin_settings(&ok(&["migStrategy=mixed"])).mig_strategy, MigStrategy::Mixed);
    assert_eq!(plugin_settings(&ok(&["flags.migStrategy=single"])).mig_strategy, MigStrategy::Single);
    let s = plugin_settings(&ok(&["deviceListStrategy=volume-mounts\\,cdi-annotations", "deviceIDStrategy=index"]));
    assert_eq!(s.strategies.iter().map(|s| s.to_string()).collect::<Vec<_>>(), ["volume-mounts", "cdi-annotations"]);
    assert_eq!(s.device_ids, actk_device_plugin::resources::DeviceIds::Index);
    let s = plugin_settings(&ok(&["compatWithCPUManager=true"]));
    assert_eq!(s.strategies.iter().map(|s| s.to_string()).collect::<Vec<_>>(), ["cdi-cri", "device-specs"]);
    // NVIDIA's defaults (what a copied values.yaml of theirs carries) change nothing.
    let defaults = ok(&[
        "migStrategy=null",
        "failOnInitError=false",
        "gfd.enabled=false",
        "mps.root=/run/nvidia/mps",
        "allowDefaultNamespace=false",
        "nfd.worker.config.sources.pci.deviceLabelFields={vendor}",
        "deviceDiscoveryStrategy=auto",
    ]);
    assert_eq!(defaults, ok(&[]));
    // config.map: NVIDIA's configs in a ConfigMap of the chart, mounted; config.default picks.
    let cfgs = [
        "config.map.default=version: v1\nflags:\n  migStrategy: none\n",
        "config.map.shared=version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n      devices: [0]\n",
        "config.default=shared",
    ];
    let all = ok(&cfgs);
    let s = plugin_settings(&all);
    let t = s.time_slicing.unwrap();
    assert_eq!((t.resources[0].replicas, t.resources[0].devices.as_deref()), (4, Some(&["0".to_string()][..])));
    let pod = &plugin_daemonset(&all, "config.map")["spec"]["template"]["spec"];
    let vol = pod["volumes"].as_array().unwrap().iter().find(|v| v["name"] == "nvidia-config").unwrap();
    assert_eq!(vol["configMap"]["name"], "actk-device-plugin-nvidia-config");
    // Each node's label actk.dev/config chooses among them: the plugin reads its own Node (get)
    // and may post Events, nothing more.
    check_daemonset(&all, "config.map");
    // The node labeller reads the same file and named configs where the plugin reads them, so
    // its sharing labels and actk.dev/config.applied follow the same node label.
    let labeller = &all
        .iter()
        .find(|d| d["kind"] == "DaemonSet" && d["metadata"]["name"] == "actk-device-plugin-labeller")
        .expect("the labeller DaemonSet")["spec"]["template"];
    let largs = container(&labeller["spec"], "actk-node-labeller")["args"].as_array().unwrap().clone();
    assert!(largs.iter().any(|a| a == "--plugin-config=/etc/actk/device-plugin.toml"), "{largs:?}");
    assert!(largs.iter().any(|a| a == "--node-config"), "the node's label picks, as for the plugin: {largs:?}");
    let mounted = |pod: &Value, c: &str| -> Vec<(String, String, String)> {
        let vols = pod["volumes"].as_array().unwrap();
        container(pod, c)["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|m| {
                let v = vols.iter().find(|v| v["name"] == m["name"])?;
                let cm = v["configMap"]["name"].as_str()?;
                Some((cm.to_string(), m["mountPath"].as_str()?.to_string(), m["subPath"].to_string()))
            })
            .collect()
    };
    let (pm, lm) = (mounted(pod, "actk-device-plugin"), mounted(&labeller["spec"], "actk-node-labeller"));
    assert_eq!((lm.len(), pm), (2, lm), "the same ConfigMaps at the same paths");
    assert_eq!(
        labeller["metadata"]["annotations"]["checksum/config"],
        plugin_daemonset(&all, "config.map")["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
    );
    let env = container(pod, "actk-device-plugin")["env"].as_array().unwrap().clone();
    let env_of = |n: &str| env.iter().find(|e| e["name"] == n).cloned().unwrap_or_default();
    assert_eq!(env_of("ACTK_DEVICE_PLUGIN_NODE_CONFIG")["value"], "true");
    assert_eq!(env_of("NODE_NAME")["valueFrom"]["fieldRef"]["fieldPath"], "spec.nodeName");
    assert_eq!(pod["serviceAccountName"], "actk-device-plugin-device-plugin");
    let role = all
        .iter()
        .find(|o| o["kind"] == "ClusterRole" && o["metadata"]["name"] == "actk-device-plugin-device-plugin")
        .expect("the plugin's ClusterRole");
    assert_eq!(
        role["rules"],
        serde_json::json!([
            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
            {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}
        ])
    );
    // Several configs without config.default: a key `default` is the default (NVIDIA's `named`).
    let mut named = cfgs[..2].to_vec();
    named.push("config.map.ts2=version: v1\n");
    let s = plugin_settings(&ok(&named));
    assert!(s.time_slicing.is_none(), "the key default");
    // config.name: the admin's own ConfigMap.
    let all = ok(&["config.name=nvidia-device-plugin-configs"]);
    let pod = &plugin_daemonset(&all, "config.name")["spec"]["template"]["spec"];
    let vol = pod["volumes"].as_array().unwrap().iter().find(|v| v["name"] == "nvidia-config").unwrap();
    assert_eq!(vol["configMap"]["name"], "nvidia-device-plugin-configs");
    let mount = container(pod, "actk-device-plugin")["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "nvidia-config")
        .cloned()
        .unwrap();
    assert_eq!((mount["mountPath"].as_str(), mount["readOnly"].as_bool()), (Some("/etc/actk/nvidia"), Some(true)));
    // Pod fields NVIDIA's chart has.
    let all = ok(&["imagePullSecrets[0].name=registry", "podAnnotations.team=ml", "affinity.nodeAffinity.x=y"]);
    let tpl = &plugin_daemonset(&all, "pod fields")["spec"]["template"];
    assert_eq!(tpl["spec"]["imagePullSecrets"][0]["name"], "registry");
    assert_eq!(tpl["metadata"]["annotations"]["team"], "ml");
    assert_eq!(tpl["spec"]["affinity"]["nodeAffinity"]["x"], "y");
    for (set, words) in [
        ("failOnInitError=true", &["failOnInitError", "looks again every 5 s"][..]),
        ("nvidiaDriverRoot=/run/nvidia/driver", &["nvidiaDriverRoot", "set hostRoot"][..]),
        ("gdsEnabled=true", &["gdsEnabled", "user profile"][..]),
        ("deviceDiscoveryStrategy=tegra", &["deviceDiscoveryStrategy", "vendor profiles"][..]),
        ("runtimeClassName=nvidia", &["runtimeClassName", "no runtime class"][..]),
        ("fullnameOverride=x", &["fullnameOverride", "release name"][..]),
        ("securityContext.privileged=true", &["securityContext", "unprivileged"][..]),
        ("gfd.enabled=true", &["gfd.enabled", "gpu-feature-discovery"][..]),
        ("mps.root=/var/mps", &["mps.root", "sharing.mps.pipeDirectory"][..]),
        ("cdi.nvidiaHookPath=/usr/bin/nvidia-cdi-hook", &["cdi.nvidiaHookPath", "cdi.ldcacheHook"][..]),
        ("devicePlugin.containers.main.env[0].name=X", &["devicePlugin.containers", "extraEnv"][..]),
        ("flags.plugin.passDeviceSpecs=true", &["flags.plugin", "config.map"][..]),
        (
            "migStrategy=mixed,config.migStrategy=single",
            &["migStrategy is \"mixed\"", "config.migStrategy is \"single\""][..],
        ),
        ("deviceListStrategy=envvar,config.strategies={volume-mounts}", &["deviceListStrategy", "set one of them"][..]),
        ("config.name=a,config.map.b=x", &["config.name and config.map"][..]),
        ("config.map.a=x,config.map.b=y", &["config.map has a, b", "config.default", "node label actk.dev/config"][..]),
        ("config.map.a=x,config.default=b", &["config.default \"b\" is not a key of config.map (a)"][..]),
        ("migStrategy=all", &["migStrategy"][..]),
        ("someTypo=1", &["someTypo", "not allowed"][..]),
        (
            "sharing.timeSlicing.resources[0].name=nvidia.com/gpu,sharing.timeSlicing.resources[0].replicas=2,sharing.timeSlicing.resources[0].devices=2",
            &["sharing.timeSlicing.resources.0.devices"][..],
        ),
    ] {
        let err = render_chart(&helm, &chart, &[set]).err().unwrap_or_else(|| panic!("{set} must be refused"));
        for w in words {
            assert!(err.contains(w), "{set}: the error names {w}: {err}");
        }
    }
}

/// MPS from the chart (sharing.mps, as the docs describe it): the plugin's [sharing.mps], and
/// the daemon's pipe directory mounted read-only at its node path (the plugin watches the
/// daemon's control FIFO there and hands the same path to the kubelet for the clients).
#[test]
fn mps_values_reach_the_plugin_with_the_pipe_directory_mounted() {
    let Some(helm) = helm() else {
        eprintln!("skipping: no helm binary (run deploy/helm/install-helm.sh, or set ACTK_HELM)");
        return;
    };
    let chart = repo().join("deploy/helm/actk-device-plugin");
    let all = render_chart(
        &helm,
        &chart,
        &[
            "sharing.mps.pipeDirectory=/run/mps/pipe",
            "sharing.mps.shmDirectory=/run/mps/shm",
            "sharing.mps.resources[0].name=nvidia.com/gpu",
            "sharing.mps.resources[0].replicas=3",
        ],
    )
    .unwrap();
    check_daemonset(&all, "helm template (mps)");
    let m = plugin_settings(&all).mps.expect("[sharing.mps]");
    assert_eq!(m.pipe_directory, Path::new("/run/mps/pipe"));
    assert_eq!(m.shm_directory.as_deref(), Some(Path::new("/run/mps/shm")));
    assert_eq!((m.resources[0].name.as_str(), m.resources[0].replicas), ("nvidia.com/gpu", 3));
    let pod = &plugin_daemonset(&all, "mps")["spec"]["template"]["spec"];
    let mount = container(pod, "actk-device-plugin")["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "mps-pipes")
        .cloned()
        .expect("the pipe directory mounted");
    assert_eq!((mount["mountPath"].as_str(), mount["readOnly"].as_bool()), (Some("/run/mps/pipe"), Some(true)));
    // Without MPS nothing of it is mounted.
    let plain = render_chart(&helm, &chart, &[]).unwrap();
    let pod = &plugin_daemonset(&plain, "plain")["spec"]["template"]["spec"];
    assert!(!pod["volumes"].as_array().unwrap().iter().any(|v| v["name"] == "mps-pipes"));
    // A rename (NVIDIA has none for MPS) is refused by the schema.
    let err = render_chart(
        &helm,
        &chart,
        &[
            "sharing.mps.resources[0].name=nvidia.com/gpu",
            "sharing.mps.resources[0].replicas=3",
            "sharing.mps.resources[0].rename=nvidia.com/gpu.mps",
        ],
    )
    .unwrap_err();
    assert!(err.contains("sharing.mps.resources.0"), "{err}");
}

/// Issue 28 items 1 and 6: the plugin reads the kubelet's PodResources (its directory mounted
/// read-only), is ready only once it serves (an exec probe of its own readiness file), and rolls
/// with a surge so that `helm upgrade --wait` waits for that; the node setup and the NRI plugin,
/// which must not run twice on a node, roll one at a time. The generator names its specs after
/// the release.
#[test]
fn plugin_rolls_with_surge_behind_a_readiness_probe_and_reads_pod_resources() {
    let Some(helm) = helm() else {
        eprintln!("skipping: no helm binary (run deploy/helm/install-helm.sh, or set ACTK_HELM)");
        return;
    };
    let chart = repo().join("deploy/helm/actk-device-plugin");
    let all = render_chart(
        &helm,
        &chart,
        &[
            "nodeSetup.enabled=true",
            "nri.enabled=true",
            "config.strategies={volume-mounts}",
            "kubeletPodResourcesDir=/k/pr",
        ],
    )
    .unwrap();
    let ds = plugin_daemonset(&all, "rollout");
    assert_eq!(
        ds["spec"]["updateStrategy"],
        serde_json::json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}})
    );
    let pod = &ds["spec"]["template"]["spec"];
    let c = container(pod, "actk-device-plugin");
    let probe = &c["readinessProbe"]["exec"]["command"];
    assert_eq!(probe, &serde_json::json!(["/usr/bin/actk-device-plugin", "--check-ready", "/run/actk/ready"]));
    let env = |n: &str| c["env"].as_array().unwrap().iter().find(|e| e["name"] == n).map(|e| e["value"].clone());
    assert_eq!(env("ACTK_DEVICE_PLUGIN_READY_FILE"), Some("/run/actk/ready".into()));
    assert_eq!(env("ACTK_DEVICE_PLUGIN_POD_RESOURCES_SOCKET"), Some("/k/pr/kubelet.sock".into()));
    let run = pod["volumes"].as_array().unwrap().iter().find(|v| v["name"] == "run").unwrap();
    assert!(run["emptyDir"].is_object(), "the readiness file is in the pod's own memory: {run}");
    let pr = c["volumeMounts"].as_array().unwrap().iter().find(|m| m["name"] == "pod-resources").unwrap();
    assert_eq!((pr["mountPath"].as_str(), pr["readOnly"].as_bool()), (Some("/k/pr"), Some(true)));
    // The probe command is one the binary has.
    // In the container's environment (its ACTK_* variables are set too, clap reads them).
    let probe = |file: &Path| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_actk-device-plugin"));
        cmd.arg("--check-ready").arg(file);
        for e in c["env"].as_array().unwrap() {
            if let (Some(k), Some(v)) = (e["name"].as_str(), e["value"].as_str()) {
                cmd.env(k, v);
            }
        }
        cmd.output().unwrap()
    };
    let o = probe(Path::new("/nonexistent"));
    assert_eq!(o.status.code(), Some(1), "not ready without the file: {}", String::from_utf8_lossy(&o.stderr));
    let ready = tempfile::NamedTempFile::new().unwrap();
    assert_eq!(probe(ready.path()).status.code(), Some(0), "ready with it");
    for component in ["node-setup", "nri-plugin"] {
        let d = all
            .iter()
            .find(|d| d["kind"] == "DaemonSet" && d["metadata"]["labels"]["app.kubernetes.io/component"] == component)
            .unwrap();
        assert_eq!(d["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"], 1, "{component}");
    }
    let generator = container(pod, "cdi-spec-generator");
    assert!(generator["args"].as_array().unwrap().iter().any(|a| a == "--owner=actk-device-plugin"), "{generator}");
}

/// The install notes name NVIDIA values that have no effect here (they configure parts actk
/// does not deploy), so those are not dropped silently either. Helm renders NOTES.txt only on
/// install; the test renders a copy of it as a template.
#[test]
fn install_notes_name_nvidia_values_without_effect() {
    let Some(helm) = helm() else {
        eprintln!("skipping: no helm binary (run deploy/helm/install-helm.sh, or set ACTK_HELM)");
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let chart = tmp.path().join("chart");
    copy_chart(&chart);
    // Helm reads every other template as YAML: the notes become one string of a document.
    std::fs::rename(chart.join("templates/NOTES.txt"), chart.join("files/notes.tpl")).unwrap();
    std::fs::write(chart.join("templates/notes.yaml"), "text: {{ tpl (.Files.Get \"files/notes.tpl\") . | toJson }}\n")
        .unwrap();
    let notes = |set: &[&str]| {
        let mut cmd = Command::new(&helm);
        cmd.args(["template", "x", "--show-only", "templates/notes.yaml"]).arg(&chart);
        for s in set {
            cmd.args(["--set", s]);
        }
        let o = cmd.output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let doc: Value = serde_saphyr::from_str(&String::from_utf8_lossy(&o.stdout)).unwrap();
        doc["text"].as_str().unwrap().to_string()
    };
    let text = notes(&["nfd.master.serviceAccount.create=true", "mps.enableHostPID=true"]);
    assert!(text.contains("no effect here") && text.contains("nfd, mps.enableHostPID"), "{text}");
    assert!(!notes(&[]).contains("no effect"), "nothing to say by default");
}

/// The DRA examples create claims and templates only (and the namespace the admin-access
/// example needs, labelled for it): nothing there holds a GPU or pulls an image.
#[test]
fn dra_examples_create_only_claims_and_templates() {
    let text = std::fs::read_to_string(repo().join("deploy/kubernetes/actk-dra-examples.yaml")).unwrap();
    let all = docs(&text, "actk-dra-examples.yaml");
    for d in &all {
        let kind = d["kind"].as_str().unwrap_or_default();
        if kind == "Namespace" {
            assert_eq!(d["metadata"]["labels"]["resource.kubernetes.io/admin-access"], "true", "{d}");
            continue;
        }
        assert!(kind == "ResourceClaimTemplate" || kind == "ResourceClaim", "{kind}: {d}");
    }
    assert!(all.iter().any(|d| d["kind"] == "ResourceClaim"));
}

/// Keys an earlier revision lacks are filled in, but a value given as false, 0 or "" stays
/// what it was given (a fill that took those for missing turned devicePlugin.enabled=false into
/// true, seen on the test cluster), and a map given as null is filled in whole.
#[test]
fn values_given_as_false_stay_false_and_null_maps_get_defaults() {
    let Some(helm) = helm() else {
        eprintln!("skipping: no helm binary (run deploy/helm/install-helm.sh, or set ACTK_HELM)");
        return;
    };
    let chart = repo().join("deploy/helm/actk-device-plugin");
    let all = render_chart(&helm, &chart, &["dra.enabled=true", "devicePlugin.enabled=false"]).unwrap();
    let mut ds: Vec<&str> =
        all.iter().filter(|d| d["kind"] == "DaemonSet").filter_map(|d| d["metadata"]["name"].as_str()).collect();
    ds.sort_unstable();
    assert_eq!(
        ds,
        ["actk-device-plugin-dra", "actk-device-plugin-exporter", "actk-device-plugin-labeller"],
        "no device plugin DaemonSet"
    );
    let all = render_chart(&helm, &chart, &["cdi.generate=false", "hostLibraries=false", "metrics.port=0"]);
    let all = all.expect_err("metrics.port 0 is refused by the schema");
    assert!(all.contains("metrics.port"), "{all}");
    let all = render_chart(&helm, &chart, &["cdi.generate=false", "hostLibraries=false"]).unwrap();
    let pod = &plugin_daemonset(&all, "generate=false")["spec"]["template"]["spec"];
    assert_eq!(pod["containers"].as_array().unwrap().len(), 1, "no generator: {pod}");
    let all = render_chart(&helm, &chart, &["nri=null", "sharing=null"]).unwrap();
    check_daemonset(&all, "null maps");
}

/// `helm template` with its own arguments (`--api-versions`, `--set`).
fn render_args(helm: &Path, args: &[&str]) -> Result<Vec<Value>, String> {
    let chart = repo().join("deploy/helm/actk-device-plugin");
    let o = Command::new(helm)
        .args(["template", "actk-device-plugin", "--namespace", "gpu-operator"])
        .arg(&chart)
        .args(args)
        .output()
        .unwrap();
    if !o.status.success() {
        return Err(String::from_utf8_lossy(&o.stderr).into_owned());
    }
    Ok(docs(&String::from_utf8_lossy(&o.stdout), "helm template output"))
}

const VAP_API: &str = "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy";

/// Issue 29 finding 5: the admission guard is rendered when a reader of the device list is
/// (node setup, the NRI plugin) on a cluster with ValidatingAdmissionPolicy, refuses pods
/// outside the release's namespace, and its path test refuses every mountPath that actk would
/// read as a device list entry: each path below is judged by actk's own `device_list` (a
/// `/dev/null` bind mount there) and by the policy's regular expressions (CEL `matches` is RE2,
/// which these patterns share with the regex crate).
#[test]
fn helm_chart_admission_guard_refuses_every_device_list_path() {
    let Some(helm) = helm() else {
        eprintln!("skipping: no helm binary (run deploy/helm/install-helm.sh, or set ACTK_HELM)");
        return;
    };
    let guard = |args: &[&str]| -> Vec<Value> {
        render_args(&helm, args)
            .unwrap()
            .into_iter()
            .filter(|d| d["metadata"]["labels"]["app.kubernetes.io/component"] == "admission-guard")
            .collect()
    };
    let api = ["--api-versions", VAP_API];
    assert!(guard(&api).is_empty(), "no reader of the device list: no guard");
    assert!(guard(&["--set", "nodeSetup.enabled=true"]).is_empty(), "a cluster without the API: no guard under auto");
    assert!(
        guard(&["--api-versions", VAP_API, "--set", "nodeSetup.enabled=true,admissionGuard.enabled=false"]).is_empty()
    );
    assert_eq!(guard(&["--set", "admissionGuard.enabled=true"]).len(), 2, "true renders it whatever the cluster says");
    assert_eq!(
        guard(&["--api-versions", VAP_API, "--set", "nri.enabled=true,config.strategies={volume-mounts}"]).len(),
        2
    );
    let objs = guard(&["--api-versions", VAP_API, "--set", "nodeSetup.enabled=true"]);
    let policy = kind(&objs, "ValidatingAdmissionPolicy");
    let binding = kind(&objs, "ValidatingAdmissionPolicyBinding");
    assert_eq!(binding["spec"]["policyName"], policy["metadata"]["name"]);
    assert_eq!(binding["spec"]["validationActions"], serde_json::json!(["Deny"]));
    let spec = &policy["spec"];
    assert_eq!(spec["failurePolicy"], "Fail");
    let rules = &spec["matchConstraints"]["resourceRules"][0];
    assert_eq!(rules["resources"], serde_json::json!(["pods", "pods/ephemeralcontainers"]));
    assert_eq!(rules["operations"], serde_json::json!(["CREATE", "UPDATE"]));
    let ns = &spec["matchConstraints"]["namespaceSelector"]["matchExpressions"][0];
    assert_eq!(
        (ns["key"].as_str(), ns["operator"].as_str(), &ns["values"]),
        (Some("kubernetes.io/metadata.name"), Some("NotIn"), &serde_json::json!(["gpu-operator"]))
    );
    let validations = spec["validations"].as_array().unwrap();
    let fields: Vec<&str> = validations
        .iter()
        .map(|v| {
            let e = v["expression"].as_str().unwrap();
            ["containers", "initContainers", "ephemeralContainers"]
                .into_iter()
                .find(|f| e.contains(&format!("object.spec.{f}.")))
                .unwrap()
        })
        .collect();
    assert_eq!(fields, ["containers", "initContainers", "ephemeralContainers"]);
    // The expression refuses a path when `p.matches(A) || (p.contains('actk') && p.matches(B))`.
    let expr = validations[0]["expression"].as_str().unwrap();
    let re = regex::Regex::new(r"p\.matches\('([^']*)'\)").unwrap();
    let pats: Vec<regex::Regex> = re.captures_iter(expr).map(|c| regex::Regex::new(&c[1]).unwrap()).collect();
    assert_eq!(pats.len(), 2, "{expr}");
    let refused = |p: &str| pats[0].is_match(p) || (p.contains("actk") && pats[1].is_match(p));
    let paths = [
        "/var/run/actk/devices/nvidia.com/gpu/all",
        "/var/run/actk/devices",
        "/var/run/actk/devices/",
        "//var/run/actk/devices/nvidia.com/gpu/0",
        "/var//run///actk/devices//nvidia.com//gpu/0",
        "var/run/actk/devices/nvidia.com/gpu/0",
        "/var/run/actk/devices/x/../nvidia.com/gpu/0",
        "/var/./run/actk/devices/nvidia.com/gpu/0",
        "/tmp/../var/run/actk/devices/nvidia.com/gpu/0",
        "/var/run/actk/devices/aws.amazon.com/neuron/3",
        "/var/run/actk/devicesX/nvidia.com/gpu/0",
        "/run/actk/devices/nvidia.com/gpu/0",
        "/var/run/actk",
        "/var/run/secrets/kubernetes.io/serviceaccount",
        "/data",
    ];
    let mut entries = 0;
    for p in paths {
        let m =
            serde_json::json!({"destination": p, "type": "bind", "source": "/dev/null", "options": ["rbind", "ro"]});
        let (list, _) = actk_core::request::device_list(std::slice::from_ref(&m));
        if !list.is_empty() {
            entries += 1;
            assert!(refused(p), "{p}: actk reads it as a device list entry, the admission guard lets it through");
        }
        // Anything that could be cleaned into the directory is refused too.
        let cleaned = Path::new(p).components().fold(Vec::<String>::new(), |mut v, c| {
            match c {
                std::path::Component::ParentDir => {
                    v.pop();
                }
                std::path::Component::Normal(n) => v.push(n.to_string_lossy().into_owned()),
                _ => {}
            }
            v
        });
        if cleaned.len() >= 4 && cleaned[..4] == ["var", "run", "actk", "devices"] {
            assert!(refused(p), "{p} cleans into the device list and is let through");
        }
    }
    assert!(entries >= 5, "the table has device list entries ({entries})");
    for p in [
        "/run/actk/devices/nvidia.com/gpu/0",
        "/var/run/actk",
        "/var/run/secrets/kubernetes.io/serviceaccount",
        "/data",
        "/var/run/actk/devicesX/a/b/c",
    ] {
        assert!(!refused(p), "{p} is not the device list");
    }
}
