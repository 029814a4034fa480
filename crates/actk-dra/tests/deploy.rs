//! The chart's DRA part (deploy/helm/actk-device-plugin with dra.enabled) and the example claims
//! (deploy/kubernetes/actk-dra-examples.yaml): rendered with a real `helm template`, the driver
//! gets only variables it reads, least privilege, one DeviceClass per profile selecting its
//! kind, the device plugin never serves a kind the DRA driver serves, and bad values are refused
//! with a message naming the value.

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

fn helm() -> Option<PathBuf> {
    let found = [
        std::env::var_os("ACTK_HELM").map(PathBuf::from),
        Some(actk_testsupport::engines::target_dir().join("tools/helm")),
        Some(repo().join("target/tools/helm")),
        actk_testsupport::engines::which("helm"),
    ]
    .into_iter()
    .flatten()
    .find(|p| p.is_file());
    if found.is_none() {
        assert!(std::env::var_os("CI").is_none(), "no helm binary under CI (scripts/install-deps.sh installs it)");
        eprintln!("skipping: no helm binary (run deploy/helm/install-helm.sh, or set ACTK_HELM)");
    }
    found
}

fn template(helm: &Path, set: &[&str]) -> Result<Vec<Value>, String> {
    template_for(helm, None, set)
}

/// `helm template` as for a cluster of Kubernetes `kube_version` (`1.37.2`; `None`: Helm's own
/// default).
fn template_for(helm: &Path, kube_version: Option<&str>, set: &[&str]) -> Result<Vec<Value>, String> {
    let mut cmd = Command::new(helm);
    cmd.args(["template", "actk", "--namespace", "kube-system"]).arg(repo().join("deploy/helm/actk-device-plugin"));
    if let Some(v) = kube_version {
        cmd.args(["--kube-version", v]);
    }
    for s in set {
        cmd.args(["--set", s]);
    }
    let o = cmd.output().unwrap();
    if !o.status.success() {
        return Err(String::from_utf8_lossy(&o.stderr).into_owned());
    }
    Ok(docs(&String::from_utf8_lossy(&o.stdout), "helm template output"))
}

/// The device plugin's and the DRA driver's DaemonSets (the exporter's and the node labeller's,
/// on by default since issue 30, are tested in actk-device-plugin's deploy tests).
fn daemonsets(all: &[Value]) -> Vec<&Value> {
    all.iter()
        .filter(|d| d["kind"] == "DaemonSet")
        .filter(|d| {
            !matches!(
                d["metadata"]["labels"]["app.kubernetes.io/component"].as_str(),
                Some("exporter" | "node-labeller")
            )
        })
        .collect()
}

fn env_of(c: &Value) -> Vec<(String, String)> {
    c["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["name"].as_str().unwrap().to_string(), e["value"].as_str().unwrap_or("").to_string()))
        .collect()
}

#[test]
fn dra_driver_daemonset_rbac_and_device_classes() {
    let Some(helm) = helm() else { return };
    let all = template(&helm, &["dra.enabled=true", "dra.profiles={nvidia,neuron}"]).unwrap();
    let ds = daemonsets(&all);
    assert_eq!(ds.len(), 2, "device plugin and DRA driver");
    let dra = ds.iter().find(|d| d["metadata"]["name"].as_str().unwrap().ends_with("-dra")).unwrap();
    let plugin = ds.iter().find(|d| !d["metadata"]["name"].as_str().unwrap().ends_with("-dra")).unwrap();
    // Selectors do not overlap.
    let sel = |d: &Value| d["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"].as_str().unwrap().to_string();
    assert_ne!(sel(dra), sel(plugin));
    let pod = &dra["spec"]["template"]["spec"];
    assert!(pod["serviceAccountName"].as_str().unwrap().ends_with("-dra"));
    assert_ne!(pod["automountServiceAccountToken"], false, "the driver talks to the API server");
    let c = &pod["containers"][0];
    assert_eq!(c["command"][0], "/usr/bin/actk-dra-driver", "the binary in the actk image");
    let sc = &c["securityContext"];
    assert_eq!((sc["privileged"].clone(), sc["readOnlyRootFilesystem"].clone()), (false.into(), true.into()));
    assert_eq!(sc["capabilities"]["drop"], serde_json::json!(["ALL"]));
    // Writable host paths: the plugin dir, the registry dir and /var/run/cdi only.
    let volumes = pod["volumes"].as_array().unwrap();
    for m in c["volumeMounts"].as_array().unwrap() {
        let v = volumes.iter().find(|v| v["name"] == m["name"]).unwrap();
        let Some(hp) = v["hostPath"]["path"].as_str() else {
            // The readiness file's memory-backed emptyDir, nothing of the host's.
            assert_eq!(v["emptyDir"]["medium"], "Memory", "{v}");
            continue;
        };
        let writable = m["readOnly"] != true;
        let may = ["/var/lib/kubelet/plugins/actk.dev", "/var/lib/kubelet/plugins_registry", "/var/run/cdi"];
        assert_eq!(writable, may.contains(&hp), "{hp} writable={writable}");
    }
    // Every variable is one the driver reads (its --help lists it); NODE_NAME from the pod.
    let help = Command::new(env!("CARGO_BIN_EXE_actk-dra-driver")).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    let env = env_of(c);
    for (n, _) in &env {
        assert!(n == "ACTK_LOG" || help.contains(&format!("[env: {n}")), "{n} is not read by actk-dra-driver");
    }
    assert!(env.contains(&("ACTK_DRA_PROFILES".into(), "nvidia,neuron".into())), "{env:?}");
    let cm = all.iter().find(|d| d["kind"] == "ConfigMap").unwrap();
    let toml = cm["data"]["device-plugin.toml"].as_str().unwrap();
    let line = toml.lines().find(|l| l.starts_with("resources")).expect("device plugin resources restricted");
    assert!(line.contains("amd.com/gpu") && line.contains("habana.ai/gaudi"), "{line}");
    assert!(!line.contains("nvidia.com/gpu") && !line.contains("aws.amazon.com/neuron"), "{line}");
    // The RBAC the driver needs, and no more: events only created (issue 28, item 4).
    let role = all.iter().find(|d| d["kind"] == "ClusterRole").unwrap();
    let rules = serde_json::to_string(&role["rules"]).unwrap();
    assert!(rules.contains("resourceslices") && rules.contains("resourceclaims") && rules.contains("nodes"));
    let verbs = |resource: &str| -> Vec<&str> {
        role["rules"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["resources"].as_array().unwrap().iter().any(|x| x == resource))
            .flat_map(|r| r["verbs"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()))
            .collect()
    };
    assert_eq!(verbs("events"), ["create"]);
    assert_eq!(verbs("resourceclaims"), ["get", "list"]);
    assert_eq!(verbs("resourceclaims/status"), ["patch"]);
    assert_eq!(verbs("deviceclasses"), ["list"]);
    assert!(verbs("pods").is_empty() && verbs("pods/status").is_empty(), "{rules}");
    // Opaque config for actk.dev is checked at admission (a DeviceConfig), for claims, templates
    // and classes; the cases themselves run on the cluster (k8s-e2e dra_told).
    let vap = all
        .iter()
        .find(|d| {
            d["kind"] == "ValidatingAdmissionPolicy"
                && d["metadata"]["name"].as_str().unwrap().ends_with("-dra-opaque-config")
        })
        .expect("the opaque config policy");
    let res = &vap["spec"]["matchConstraints"]["resourceRules"][0]["resources"];
    assert_eq!(res, &serde_json::json!(["resourceclaims", "resourceclaimtemplates", "deviceclasses"]));
    let vars = vap["spec"]["variables"].as_array().unwrap();
    let params = vars.iter().find(|v| v["name"] == "params").expect("the parameters of actk.dev's entries");
    assert!(params["expression"].as_str().unwrap().contains("c.opaque.driver == \"actk.dev\""), "{params}");
    let checks = vap["spec"]["validations"].as_array().unwrap();
    assert!(checks.len() > 3);
    assert!(checks.iter().all(|v| v["messageExpression"].as_str().unwrap().starts_with("variables.where + ")));
    let binding = all
        .iter()
        .find(|d| d["kind"] == "ValidatingAdmissionPolicyBinding" && d["spec"]["policyName"] == vap["metadata"]["name"])
        .unwrap();
    assert_eq!(binding["spec"]["policyName"], vap["metadata"]["name"]);
    assert_eq!(binding["spec"]["validationActions"], serde_json::json!(["Deny"]));
    // One DeviceClass per profile the driver serves (dra.profiles), selecting the driver and the
    // profile's kind, never a GPU in MIG mode (issue 28, items 2 and 4): a class for a kind the
    // driver does not serve would leave its claims Pending for ever.
    let mut classes: Vec<&Value> = all.iter().filter(|d| d["kind"] == "DeviceClass").collect();
    let names: Vec<&str> = classes.iter().map(|c| c["metadata"]["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["actk-nvidia", "actk-neuron", "actk-nvidia-mig"]);
    // MIG devices have a class of their own, which the profile classes leave out.
    let mig = classes.pop_if(|c| c["metadata"]["name"] == "actk-nvidia-mig").expect("the MIG class");
    assert_eq!(
        mig["spec"]["selectors"][0]["cel"]["expression"],
        format!(
            "device.driver == \"actk.dev\" && device.attributes[\"actk.dev\"].kind == \"nvidia.com/gpu\" && {}",
            actk_dra::slice::IS_MIG_DEVICE
        )
        .as_str()
    );
    assert!(mig["metadata"]["labels"].get("actk.dev/profile").is_none(), "{mig}");
    let profiles = actk_core::profile::builtin();
    for c in &classes {
        let p = c["metadata"]["labels"]["actk.dev/profile"].as_str().expect("the profile label the driver reads");
        assert_eq!(c["metadata"]["name"], format!("actk-{p}").as_str());
        let kind = &profiles.iter().find(|x| x.name == p).unwrap().kind;
        assert_eq!(c["apiVersion"], "resource.k8s.io/v1");
        let cel = c["spec"]["selectors"][0]["cel"]["expression"].as_str().unwrap();
        assert_eq!(
            cel,
            format!(
                "device.driver == \"actk.dev\" && device.attributes[\"actk.dev\"].kind == \"{kind}\" && {}",
                actk_dra::slice::NOT_MIG_ENABLED
            )
        );
    }
    // Every built-in profile gets its class when the driver serves every profile.
    let all = template(&helm, &["dra.enabled=true", "devicePlugin.enabled=false"]).unwrap();
    assert_eq!(all.iter().filter(|d| d["kind"] == "DeviceClass").count(), profiles.len() + 1);
}

/// Issue 26: the DeviceClasses map each profile's device plugin resource (KEP-5004,
/// `spec.extendedResourceName`) where the cluster has it on by default (1.36+) or the admin says
/// so, never on 1.34 by default; the IMEX profile, which has no such resource, maps nothing.
#[test]
fn device_classes_name_their_extended_resource_where_the_cluster_serves_it() {
    let Some(helm) = helm() else { return };
    let mapped = |all: &[Value]| -> Vec<(String, String)> {
        all.iter()
            .filter(|d| d["kind"] == "DeviceClass")
            .filter_map(|c| {
                let er = c["spec"]["extendedResourceName"].as_str()?;
                Some((c["metadata"]["name"].as_str().unwrap().to_string(), er.to_string()))
            })
            .collect()
    };
    let on = ["dra.enabled=true", "devicePlugin.enabled=false"];
    let want: Vec<(String, String)> = [
        ("actk-nvidia", "nvidia.com/gpu"),
        ("actk-neuron", "aws.amazon.com/neuron"),
        ("actk-amd", "amd.com/gpu"),
        ("actk-gaudi", "habana.ai/gaudi"),
        ("actk-accel", "kernel.org/accel"),
    ]
    .iter()
    .map(|(a, b)| (a.to_string(), b.to_string()))
    .collect();
    for v in ["1.37.2", "1.36.3"] {
        assert_eq!(mapped(&template_for(&helm, Some(v), &on).unwrap()), want, "Kubernetes {v}");
    }
    // 1.34: DRAExtendedResource is alpha (off): nothing by default, everything when asked.
    assert!(mapped(&template_for(&helm, Some("1.34.4"), &on).unwrap()).is_empty());
    let mut asked = on.to_vec();
    asked.push("dra.extendedResourceNames=true");
    assert_eq!(mapped(&template_for(&helm, Some("1.34.4"), &asked).unwrap()), want);
    let mut off = on.to_vec();
    off.push("dra.extendedResourceNames=false");
    assert!(mapped(&template_for(&helm, Some("1.37.2"), &off).unwrap()).is_empty());
    // A profile's own name wins over its first resource.
    let mut own = on.to_vec();
    own.push("profiles.neuron.extendedResourceName=aws.amazon.com/neurondevice");
    let m = mapped(&template_for(&helm, Some("1.37.2"), &own).unwrap());
    assert!(m.contains(&("actk-neuron".into(), "aws.amazon.com/neurondevice".into())), "{m:?}");
    let mut bad = on.to_vec();
    bad.push("dra.extendedResourceNames=maybe");
    let e = template_for(&helm, Some("1.37.2"), &bad).unwrap_err();
    assert!(e.contains("extendedResourceNames"), "{e}");
}

/// Issue 26: with `dra.perNodeServer.enabled` the driver decides per node from the label
/// `actk.dev/<profile>.server` and writes its servers file where the device plugin's pod reads
/// it (read-only); the device plugin then keeps every profile's resources in its list and
/// leaves alone what the file names (the DRA profiles until the file is there). Rolling updates
/// surge: per-pod sockets (POD_UID), a readiness probe on the kubelet's registration.
#[test]
fn per_node_server_choice_and_rolling_update_wiring() {
    let Some(helm) = helm() else { return };
    let all = template(
        &helm,
        &["dra.enabled=true", "dra.profiles={nvidia}", "dra.perNodeServer.enabled=true", "dra.metrics.enabled=true"],
    )
    .unwrap();
    let ds = daemonsets(&all);
    let dra = ds.iter().find(|d| d["metadata"]["name"].as_str().unwrap().ends_with("-dra")).unwrap();
    let plugin = ds.iter().find(|d| !d["metadata"]["name"].as_str().unwrap().ends_with("-dra")).unwrap();
    let dc = &dra["spec"]["template"]["spec"]["containers"][0];
    let env = env_of(dc);
    let file = "/var/lib/kubelet/plugins/actk.dev/servers.json";
    for (k, v) in [
        ("ACTK_DRA_SERVER_LABELS", "true"),
        ("ACTK_DRA_DEFAULT_SERVER", "dra"),
        ("ACTK_DRA_SERVERS_FILE", file),
        ("ACTK_DRA_METRICS_ADDRESS", "0.0.0.0:9401"),
        ("ACTK_DRA_READY_FILE", "/run/actk/ready"),
    ] {
        assert!(env.contains(&(k.into(), v.into())), "{k}={v} not in {env:?}");
    }
    let uid = dc["env"].as_array().unwrap().iter().find(|e| e["name"] == "POD_UID").expect("POD_UID");
    assert_eq!(uid["valueFrom"]["fieldRef"]["fieldPath"], "metadata.uid");
    assert_eq!(dc["readinessProbe"]["exec"]["command"][1], "--check-ready");
    assert_eq!(dra["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"], 0);
    assert_eq!(dra["spec"]["updateStrategy"]["rollingUpdate"]["maxSurge"], 1);
    let pc = &plugin["spec"]["template"]["spec"]["containers"][0];
    let penv = env_of(pc);
    assert!(penv.contains(&("ACTK_DEVICE_PLUGIN_DRA_SERVERS_FILE".into(), file.into())), "{penv:?}");
    assert!(penv.contains(&("ACTK_DEVICE_PLUGIN_DRA_DEFAULT_PROFILES".into(), "nvidia".into())), "{penv:?}");
    let m = pc["volumeMounts"].as_array().unwrap().iter().find(|m| m["name"] == "dra-servers").expect("servers dir");
    assert_eq!(
        (m["mountPath"].as_str(), m["readOnly"].as_bool()),
        (Some("/var/lib/kubelet/plugins/actk.dev"), Some(true))
    );
    // The plugin's list keeps nvidia.com/gpu: the file, not the chart, takes it away per node.
    let cm = all.iter().find(|d| d["kind"] == "ConfigMap").unwrap();
    let toml = cm["data"]["device-plugin.toml"].as_str().unwrap();
    assert!(!toml.lines().any(|l| l.starts_with("resources")), "every resource: {toml}");
    // Default device-plugin: the plugin takes everything until the driver's file says otherwise.
    let all = template(
        &helm,
        &[
            "dra.enabled=true",
            "dra.profiles={nvidia}",
            "dra.perNodeServer.enabled=true",
            "dra.perNodeServer.default=device-plugin",
        ],
    )
    .unwrap();
    let plugin =
        daemonsets(&all).into_iter().find(|d| !d["metadata"]["name"].as_str().unwrap().ends_with("-dra")).unwrap();
    let penv = env_of(&plugin["spec"]["template"]["spec"]["containers"][0]);
    assert!(!penv.iter().any(|(k, _)| k == "ACTK_DEVICE_PLUGIN_DRA_DEFAULT_PROFILES"), "{penv:?}");
    // Off: the static split of before, no servers file anywhere.
    let all = template(&helm, &["dra.enabled=true", "dra.profiles={nvidia}"]).unwrap();
    let text = serde_json::to_string(&all).unwrap();
    assert!(!text.contains("servers.json") && !text.contains("ACTK_DRA_METRICS_ADDRESS"), "{text}");
}

/// Issue 26: the node-scoped write guard is in the chart with the driver: it matches the
/// driver's ServiceAccount only, on every write of ResourceSlices, and compares spec.nodeName
/// (before and after an update) with the node of the pod-bound token. The cluster test
/// (crates/k8s-e2e/tests/dra_frontier.rs) proves the API server enforces it.
#[test]
fn the_driver_writes_only_its_own_nodes_slices() {
    let Some(helm) = helm() else { return };
    let all = template(&helm, &["dra.enabled=true", "devicePlugin.enabled=false"]).unwrap();
    let vap = all
        .iter()
        .find(|d| {
            d["kind"] == "ValidatingAdmissionPolicy"
                && d["metadata"]["name"].as_str().unwrap().ends_with("-dra-node-slices")
        })
        .expect("the node-scoped write policy");
    let rule = &vap["spec"]["matchConstraints"]["resourceRules"][0];
    assert_eq!(rule["resources"], serde_json::json!(["resourceslices"]));
    assert_eq!(rule["operations"], serde_json::json!(["CREATE", "UPDATE", "DELETE"]));
    assert_eq!(vap["spec"]["failurePolicy"], "Fail");
    let sa = all
        .iter()
        .find(|d| d["kind"] == "ServiceAccount" && d["metadata"]["name"].as_str().unwrap().ends_with("-dra"))
        .unwrap();
    let who = format!("system:serviceaccount:kube-system:{}", sa["metadata"]["name"].as_str().unwrap());
    let cond = vap["spec"]["matchConditions"][0]["expression"].as_str().unwrap();
    assert!(cond.contains(&format!("\"{who}\"")), "{cond}");
    let text = serde_json::to_string(&vap["spec"]).unwrap();
    assert!(
        text.contains("authentication.kubernetes.io/node-name") && text.contains("oldObject.spec.nodeName"),
        "{text}"
    );
    let binding = all
        .iter()
        .find(|d| d["kind"] == "ValidatingAdmissionPolicyBinding" && d["spec"]["policyName"] == vap["metadata"]["name"])
        .expect("its binding");
    assert_eq!(binding["spec"]["validationActions"], serde_json::json!(["Deny"]));
    // Not without the driver.
    let all = template(&helm, &[]).unwrap();
    assert!(!all.iter().any(|d| d["kind"] == "ValidatingAdmissionPolicy"
        && d["metadata"]["name"].as_str().unwrap().ends_with("-dra-node-slices")));
}

#[test]
fn chart_profiles_match_the_builtin_profiles() {
    let values: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(repo().join("deploy/helm/actk-device-plugin/values.yaml")).unwrap(),
    )
    .unwrap();
    let profiles = actk_core::profile::builtin();
    let map = values["profiles"].as_object().unwrap();
    assert_eq!(map.len(), profiles.len());
    for p in &profiles {
        let v = &map[&p.name];
        assert_eq!(v["kind"], p.kind.as_str(), "{}", p.name);
        assert_eq!(v["resources"], serde_json::json!(p.kubernetes.resources), "{}", p.name);
    }
    let dra: Vec<&str> = values["dra"]["profiles"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert_eq!(dra, profiles.iter().map(|p| p.name.as_str()).collect::<Vec<_>>());
}

#[test]
fn bad_values_are_refused_naming_the_value() {
    let Some(helm) = helm() else { return };
    let cases: &[(&[&str], &str)] = &[
        (&["dra.enabled=true"], "set devicePlugin.enabled=false"),
        (
            &["dra.enabled=true", "dra.profiles={nvidia}", "config.resources={nvidia.com/gpu}"],
            "config.resources has nvidia.com/gpu, but the DRA driver serves its profile",
        ),
        (&["dra.enabled=true", "devicePlugin.enabled=false", "dra.profiles={nvida}"], "dra.profiles names \"nvida\""),
        (&["dra.enabled=true", "devicePlugin.enabled=false", "hostRoot=relative/dir"], "hostRoot"),
        (&["dra.enabled=true", "devicePlugin.enabled=false", "cdi.ldcacheHook=actk-hook"], "ldcacheHook"),
        // The driver's root is the chart's hostRoot, shared with the device plugin.
        (&["dra.enabled=true", "devicePlugin.enabled=false", "dra.hostRoot=/x"], "hostRoot"),
        (&["dra.enabled=true", "devicePlugin.enabled=false", "dra.typo=1"], "typo"),
    ];
    for (set, want) in cases {
        let err = template(&helm, set).expect_err(&format!("{set:?} must be refused"));
        assert!(err.contains(want), "{set:?}: {err}");
    }
    // DRA for every profile and no device plugin; a simulated node's root (hostRoot) mounted
    // read-only at /host<root>, as in the device plugin's pod, and no other host directory.
    let all =
        template(&helm, &["dra.enabled=true", "devicePlugin.enabled=false", "hostRoot=/var/lib/actk/simulated-node"])
            .unwrap();
    let ds = daemonsets(&all);
    assert_eq!(ds.len(), 1);
    let pod = &ds[0]["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    let env = env_of(c);
    assert!(env.contains(&("ACTK_ROOT".into(), "/host/var/lib/actk/simulated-node".into())), "{env:?}");
    assert!(env.contains(&("ACTK_DRA_HOST_MOUNT".into(), "/host".into())), "{env:?}");
    assert!(!env.iter().any(|(n, _)| n == "ACTK_DRA_LDCACHE_HOOK"), "no hook without node setup: {env:?}");
    assert!(!env.iter().any(|(n, _)| n == "ACTK_DRA_DYNAMIC_MIG"), "dynamic MIG is off by default: {env:?}");
    let all = template(&helm, &["dra.enabled=true", "devicePlugin.enabled=false", "dra.dynamicMig=true"]).unwrap();
    let env = env_of(&daemonsets(&all)[0]["spec"]["template"]["spec"]["containers"][0]);
    assert!(env.contains(&("ACTK_DRA_DYNAMIC_MIG".into(), "true".into())), "{env:?}");
    let sc = &daemonsets(&all)[0]["spec"]["template"]["spec"]["containers"][0]["securityContext"];
    assert_eq!((&sc["privileged"], &sc["allowPrivilegeEscalation"]), (&true.into(), &true.into()), "{sc}");
    let plain = template(&helm, &["dra.enabled=true", "devicePlugin.enabled=false"]).unwrap();
    let sc = &daemonsets(&plain)[0]["spec"]["template"]["spec"]["containers"][0]["securityContext"];
    assert_eq!(sc["privileged"], false, "unprivileged without dynamic MIG: {sc}");
    let err = template(&helm, &["dra.enabled=true", "dra.dynamicMig=yes"]).expect_err("a string is refused");
    assert!(err.contains("dynamicMig"), "{err}");
    let root = c["volumeMounts"].as_array().unwrap().iter().find(|m| m["name"] == "host-root").unwrap();
    assert_eq!(
        (root["mountPath"].clone(), root["readOnly"].clone()),
        ("/host/var/lib/actk/simulated-node".into(), true.into())
    );
    assert!(c["volumeMounts"].as_array().unwrap().iter().all(|m| m["name"] != "host-dev"));
    // With the node setup, claim specs get its actk-hook for the ld.so.cache hook.
    let all = template(&helm, &["dra.enabled=true", "devicePlugin.enabled=false", "nodeSetup.enabled=true"]).unwrap();
    let dra = daemonsets(&all).into_iter().find(|d| d["metadata"]["name"].as_str().unwrap().ends_with("-dra")).unwrap();
    let env = env_of(&dra["spec"]["template"]["spec"]["containers"][0]);
    assert!(env.contains(&("ACTK_DRA_LDCACHE_HOOK".into(), "/usr/local/actk/actk-hook".into())), "{env:?}");
    // hostRoot / : all of it at /host, read-only. A Debian or Ubuntu ld.so.cache names driver
    // libraries under /lib, a symlink to usr/lib on a merged /usr: with /usr alone mounted, the
    // driver found no library and claim specs carried none.
    let pod = &dra["spec"]["template"]["spec"];
    let root = pod["containers"][0]["volumeMounts"].as_array().unwrap().iter().find(|m| m["name"] == "host-root");
    let vol = pod["volumes"].as_array().unwrap().iter().find(|v| v["name"] == "host-root");
    assert_eq!(
        (root.map(|m| (&m["mountPath"], &m["readOnly"])), vol.map(|v| &v["hostPath"]["path"])),
        (Some((&"/host".into(), &true.into())), Some(&"/".into())),
        "{pod}"
    );
    // Claim specs go to the last of cdi.specDirs (where the runtime reads them), which is the
    // driver's one writable spec directory; dra.extraEnv comes after the fixed variables.
    let all = template(
        &helm,
        &[
            "dra.enabled=true",
            "devicePlugin.enabled=false",
            "cdi.specDirs={/etc/cdi,/run/node/cdi}",
            "dra.extraEnv[0].name=KUBERNETES_SERVICE_HOST",
            "dra.extraEnv[0].value=127.0.0.1",
        ],
    )
    .unwrap();
    let pod = &daemonsets(&all)[0]["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    let env = env_of(c);
    assert!(env.contains(&("ACTK_DRA_CDI_DIR".into(), "/run/node/cdi".into())), "{env:?}");
    assert_eq!(env.last(), Some(&("KUBERNETES_SERVICE_HOST".into(), "127.0.0.1".into())), "{env:?}");
    let m = c["volumeMounts"].as_array().unwrap().iter().find(|m| m["name"] == "cdi-specs").unwrap();
    let v = pod["volumes"].as_array().unwrap().iter().find(|v| v["name"] == "cdi-specs").unwrap();
    assert_eq!(
        (m["mountPath"].as_str(), v["hostPath"]["path"].as_str()),
        (Some("/run/node/cdi"), Some("/run/node/cdi"))
    );
    // Without dra.enabled nothing of the driver is rendered.
    let all = template(&helm, &[]).unwrap();
    // (The node labeller's ClusterRole and admission policy are there by default: not the
    // driver's, whose names carry "dra".)
    let drivers = |d: &&Value| d["metadata"]["name"].as_str().is_some_and(|n| n.contains("dra"));
    assert!(all.iter().all(|d| d["kind"] != "DeviceClass"
        && !(d["kind"] == "ClusterRole" && drivers(&d))
        && !(d["kind"] == "ValidatingAdmissionPolicy" && drivers(&d))));
    assert_eq!(daemonsets(&all).len(), 1);
}

#[test]
fn example_claims_parse_and_name_chart_device_classes() {
    let text = std::fs::read_to_string(repo().join("deploy/kubernetes/actk-dra-examples.yaml")).unwrap();
    let all = docs(&text, "actk-dra-examples.yaml");
    let templates: Vec<&Value> = all.iter().filter(|d| d["kind"] == "ResourceClaimTemplate").collect();
    assert!(templates.len() >= 6);
    let classes: Vec<String> = actk_core::profile::builtin().iter().map(|p| format!("actk-{}", p.name)).collect();
    for t in &templates {
        assert_eq!(t["apiVersion"], "resource.k8s.io/v1");
        for r in t["spec"]["spec"]["devices"]["requests"].as_array().unwrap() {
            // One exact request, or a prioritized list of subrequests (firstAvailable).
            let subs: Vec<&Value> = match r["firstAvailable"].as_array() {
                Some(l) => l.iter().collect(),
                None => vec![&r["exactly"]],
            };
            assert!(!subs.is_empty(), "{r}");
            for sub in subs {
                let class = sub["deviceClassName"].as_str().unwrap();
                assert!(classes.iter().any(|c| c == class), "{class}");
            }
        }
        for c in t["spec"]["spec"]["devices"]["constraints"].as_array().into_iter().flatten() {
            let attr = c["matchAttribute"].as_str().unwrap();
            let (domain, name) = attr.split_once('/').unwrap();
            assert!(domain == "actk.dev" || domain == "resource.kubernetes.io", "{attr}");
            assert!(
                ["linkGroup2", "linkGroup4", "linkGroup8", "hiveID", "pcieRoot", "numaNode"].contains(&name),
                "{attr}"
            );
        }
    }
}

/// `device.attributes["actk.dev"].NAME` names in a CEL expression.
fn attributes_read(cel: &str) -> Vec<String> {
    let key = "device.attributes[\"actk.dev\"].";
    cel.match_indices(key)
        .map(|(i, _)| {
            cel[i + key.len()..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect::<String>()
        })
        .collect()
}

/// The devices of fixture `name` as the driver publishes them (whole GPUs out of MIG mode: what
/// the chart's class actk-nvidia matches).
fn fixture_devices(name: &str) -> Vec<k8s_openapi::api::resource::v1::Device> {
    let f = actk_testsupport::fixture::prepare(name).expect("fixture prepares").expect("fixture tools present");
    let inv = actk_core::discover::discover(&f.root, &actk_core::profile::builtin());
    actk_dra::slice::devices(&inv, None, &std::collections::BTreeSet::new())
}

fn attr<'a>(d: &'a k8s_openapi::api::resource::v1::Device, k: &str) -> Option<&'a str> {
    d.attributes.as_ref()?.get(k)?.string.as_deref()
}

/// Issue 26: every attribute the examples' CEL reads is one the driver publishes on some
/// fixture node (a typo would leave a claim Pending for ever), and the prioritized-list
/// examples pick what they say on the fixtures: two H100 on the DGX H100, four A100 on the DGX
/// A100 (whose MIG-mode GPUs 0-3 are not matched), nothing on the H200 NVL; NVIDIA on the
/// heterogeneous node, AMD on the MI300X. The scheduler's real choice on the same fixtures is
/// crates/k8s-e2e/tests/dra_frontier.rs (dra_first_available_and_admin_access_on_fixtures).
#[test]
fn example_selectors_read_published_attributes_and_first_available_picks_on_fixtures() {
    let text = std::fs::read_to_string(repo().join("deploy/kubernetes/actk-dra-examples.yaml")).unwrap();
    let all = docs(&text, "actk-dra-examples.yaml");
    let fixtures = [
        "nvidia-dgx-h100",
        "nvidia-dgx-a100",
        "nvidia-h200-nvl",
        "hetero-nvidia-neuron",
        "amd-mi300x",
        "aws-trn1-32xlarge",
        "aws-inf2-48xlarge",
        "gaudi2",
    ];
    let mut published: std::collections::BTreeSet<String> = Default::default();
    let mut by_fixture = std::collections::BTreeMap::new();
    for f in fixtures {
        let devs = fixture_devices(f);
        for d in &devs {
            published.extend(d.attributes.iter().flatten().map(|(k, _)| k.clone()));
        }
        by_fixture.insert(f, devs);
    }
    let text_all = serde_json::to_string(&all).unwrap();
    let read = attributes_read(&text_all.replace("\\\"", "\""));
    assert!(read.len() >= 4, "{read:?}");
    // matchAttribute constraints too (`actk.dev/linkGroup4` is the driver's `linkGroup4`).
    let mut read = read;
    for t in &all {
        for c in t["spec"]["spec"]["devices"]["constraints"].as_array().into_iter().flatten() {
            let a = c["matchAttribute"].as_str().unwrap();
            read.push(a.strip_prefix("actk.dev/").unwrap_or(a).to_string());
        }
    }
    for a in &read {
        assert!(
            published.contains(a),
            "the examples' CEL reads actk.dev {a}, which no fixture device has: {published:?}"
        );
    }
    // The prioritized lists, evaluated for their model prefixes and counts on each fixture.
    let template = |name: &str| all.iter().find(|d| d["metadata"]["name"] == name).unwrap_or_else(|| panic!("{name}"));
    let kind_of = |class: &str| {
        let p = class.strip_prefix("actk-").unwrap();
        actk_core::profile::builtin().into_iter().find(|x| x.name == p).unwrap().kind
    };
    let pick = |t: &Value, fixture: &str| -> Option<String> {
        let devs = &by_fixture[fixture];
        let r = &t["spec"]["spec"]["devices"]["requests"][0];
        for sub in r["firstAvailable"].as_array().unwrap() {
            let kind = kind_of(sub["deviceClassName"].as_str().unwrap());
            let prefix = sub["selectors"][0]["cel"]["expression"]
                .as_str()
                .and_then(|e| e.split("startsWith(\"").nth(1))
                .map(|p| p.split('"').next().unwrap().to_string());
            let n = devs
                .iter()
                .filter(|d| attr(d, "kind") == Some(kind.as_str()) && attr(d, "migMode") != Some("enabled"))
                .filter(|d| prefix.as_ref().is_none_or(|p| attr(d, "model").is_some_and(|m| m.starts_with(p.as_str()))))
                .count() as u64;
            if n >= sub["count"].as_u64().unwrap_or(1) {
                return Some(sub["name"].as_str().unwrap().to_string());
            }
        }
        None
    };
    let gpus = template("two-h100-else-four-a100");
    assert_eq!(pick(gpus, "nvidia-dgx-h100").as_deref(), Some("h100"));
    assert_eq!(pick(gpus, "nvidia-dgx-a100").as_deref(), Some("a100"));
    assert_eq!(pick(gpus, "nvidia-h200-nvl"), None);
    let either = template("nvidia-else-amd");
    assert_eq!(pick(either, "hetero-nvidia-neuron").as_deref(), Some("nvidia"));
    assert_eq!(pick(either, "amd-mi300x").as_deref(), Some("amd"));
    assert_eq!(pick(either, "aws-trn1-32xlarge"), None);
    // Admin access only in a namespace labelled for it, the class's devices all.
    let admin = template("monitor-all-gpus");
    let ns = admin["metadata"]["namespace"].as_str().unwrap();
    let nsdoc = all.iter().find(|d| d["kind"] == "Namespace" && d["metadata"]["name"] == ns).expect("its namespace");
    assert_eq!(nsdoc["metadata"]["labels"]["resource.kubernetes.io/admin-access"], "true");
    let ex = &admin["spec"]["spec"]["devices"]["requests"][0]["exactly"];
    assert_eq!((ex["adminAccess"].as_bool(), ex["allocationMode"].as_str()), (Some(true), Some("All")));
}
