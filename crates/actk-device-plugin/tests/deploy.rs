//! deploy/: the DaemonSet manifest and the Helm chart parse (serde-saphyr), ask for no more
//! privilege than the plugin needs, configure it with keys and variables the plugin accepts,
//! and agree with each other.
//!
//! The chart is rendered with a real `helm template` (and `helm lint`) when a helm binary is
//! found ($ACTK_HELM, `target/tools/helm` as deploy/helm/install-helm.sh puts it, or PATH);
//! without one that test says it is skipping. The checks that need no helm always run: every
//! `.Values.x.y` a template uses exists in values.yaml.

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

/// The checks every rendering of the DaemonSet must pass.
fn check_daemonset(all: &[Value], what: &str) {
    let ds = kind(all, "DaemonSet");
    assert_eq!(ds["apiVersion"], "apps/v1", "{what}");
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(pod["automountServiceAccountToken"], false, "{what}: the plugin never talks to the API server");
    let c = &pod["containers"][0];
    let sc = &c["securityContext"];
    assert_eq!(sc["privileged"], false, "{what}");
    assert_eq!(sc["allowPrivilegeEscalation"], false, "{what}");
    assert_eq!(sc["readOnlyRootFilesystem"], true, "{what}");
    assert_eq!(sc["capabilities"]["drop"], serde_json::json!(["ALL"]), "{what}");
    assert!(sc["capabilities"]["add"].is_null(), "{what}: no capability is added");

    // hostPath volumes: only the device-plugins directory is writable.
    let volumes = pod["volumes"].as_array().unwrap();
    let host_path =
        |name: &str| volumes.iter().find(|v| v["name"] == name).and_then(|v| v["hostPath"]["path"].as_str());
    let mounts = c["volumeMounts"].as_array().unwrap();
    let mut seen = Vec::new();
    for m in mounts {
        let name = m["name"].as_str().unwrap();
        if let Some(hp) = host_path(name) {
            seen.push(hp.to_string());
            if hp == "/var/lib/kubelet/device-plugins" {
                assert_ne!(m["readOnly"], true, "{what}: the plugin creates its sockets there");
            } else {
                assert_eq!(m["readOnly"], true, "{what}: host path {hp} must be mounted read-only");
            }
        }
    }
    for wanted in ["/var/lib/kubelet/device-plugins", "/dev", "/sys", "/var/run/cdi"] {
        assert!(seen.iter().any(|s| s == wanted), "{what}: hostPath {wanted} missing ({seen:?})");
    }
    // The host root the plugin is told about is where /dev and /sys are mounted.
    let env: Vec<(&str, &str)> =
        c["env"].as_array().unwrap().iter().filter_map(|e| Some((e["name"].as_str()?, e["value"].as_str()?))).collect();
    let root = env.iter().find(|(n, _)| *n == "ACTK_ROOT").map(|(_, v)| *v).expect("ACTK_ROOT");
    for dir in ["dev", "sys"] {
        assert!(
            mounts.iter().any(|m| m["mountPath"] == format!("{root}/{dir}").as_str()),
            "{what}: {root}/{dir} not mounted"
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
    assert_eq!(all.len(), 2);
    check_daemonset(&all, "deploy/kubernetes/actk-device-plugin.yaml");
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
    cmd.args(["template", "actk-device-plugin", "--namespace", "kube-system"]).arg(&chart);
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
    assert!(!default.iter().any(|d| d["kind"] == "Service"), "no metrics Service unless enabled");

    // The static manifest is the chart's default rendering, kept by hand: the pod must agree.
    let manifest =
        docs(&std::fs::read_to_string(repo().join("deploy/kubernetes/actk-device-plugin.yaml")).unwrap(), "manifest");
    let pod = |d: &[Value]| kind(d, "DaemonSet")["spec"]["template"]["spec"].clone();
    let (a, b) = (pod(&default), pod(&manifest));
    for key in ["volumes", "tolerations", "priorityClassName"] {
        assert_eq!(a[key], b[key], "{key} differs between the chart and deploy/kubernetes");
    }
    for key in ["securityContext", "volumeMounts", "env", "args", "resources"] {
        assert_eq!(
            a["containers"][0][key], b["containers"][0][key],
            "container {key} differs between the chart and deploy/kubernetes"
        );
    }

    let with_metrics = render(
        &helm,
        &[
            "metrics.enabled=true",
            "metrics.port=9555",
            "config.strategies={cdi-cri,device-specs}",
            "hostLibraries=false",
        ],
    );
    check_daemonset(&with_metrics, "helm template (metrics)");
    let svc = kind(&with_metrics, "Service");
    assert_eq!(svc["spec"]["ports"][0]["port"], 9555);
    let toml_text = kind(&with_metrics, "ConfigMap")["data"]["device-plugin.toml"].as_str().unwrap().to_string();
    let file: FileConfig = toml::from_str(&toml_text).unwrap();
    let s = Settings::merge(Default::default(), file, "chart").unwrap();
    assert_eq!(s.metrics_address.map(|a| a.port()), Some(9555));
    assert_eq!(s.strategies.iter().map(|s| s.to_string()).collect::<Vec<_>>(), ["cdi-cri", "device-specs"]);
    let ds = kind(&with_metrics, "DaemonSet");
    assert_eq!(ds["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"], 9555);
    let vols = ds["spec"]["template"]["spec"]["volumes"].as_array().unwrap();
    assert!(!vols.iter().any(|v| v["hostPath"]["path"] == "/usr"), "hostLibraries=false mounts no host libraries");
}
