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
    let mut cmd = Command::new(helm);
    cmd.args(["template", "actk", "--namespace", "kube-system"]).arg(repo().join("deploy/helm/actk-device-plugin"));
    for s in set {
        cmd.args(["--set", s]);
    }
    let o = cmd.output().unwrap();
    if !o.status.success() {
        return Err(String::from_utf8_lossy(&o.stderr).into_owned());
    }
    Ok(docs(&String::from_utf8_lossy(&o.stdout), "helm template output"))
}

fn daemonsets(all: &[Value]) -> Vec<&Value> {
    all.iter().filter(|d| d["kind"] == "DaemonSet").collect()
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
        let hp = v["hostPath"]["path"].as_str().unwrap();
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
    // Opaque config for actk.dev is refused at admission, for claims, templates and classes.
    let vap = all.iter().find(|d| d["kind"] == "ValidatingAdmissionPolicy").expect("the opaque config policy");
    let res = &vap["spec"]["matchConstraints"]["resourceRules"][0]["resources"];
    assert_eq!(res, &serde_json::json!(["resourceclaims", "resourceclaimtemplates", "deviceclasses"]));
    let checks = vap["spec"]["validations"].as_array().unwrap();
    assert_eq!(checks.len(), 3);
    assert!(checks.iter().all(|v| v["expression"].as_str().unwrap().contains("c.opaque.driver == \"actk.dev\"")));
    let binding = all.iter().find(|d| d["kind"] == "ValidatingAdmissionPolicyBinding").unwrap();
    assert_eq!(binding["spec"]["policyName"], vap["metadata"]["name"]);
    assert_eq!(binding["spec"]["validationActions"], serde_json::json!(["Deny"]));
    // One DeviceClass per profile the driver serves (dra.profiles), selecting the driver and the
    // profile's kind, never a GPU in MIG mode (issue 28, items 2 and 4): a class for a kind the
    // driver does not serve would leave its claims Pending for ever.
    let classes: Vec<&Value> = all.iter().filter(|d| d["kind"] == "DeviceClass").collect();
    let names: Vec<&str> = classes.iter().map(|c| c["metadata"]["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["actk-nvidia", "actk-neuron"]);
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
    assert_eq!(all.iter().filter(|d| d["kind"] == "DeviceClass").count(), profiles.len());
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
    assert!(
        all.iter().all(|d| d["kind"] != "DeviceClass"
            && d["kind"] != "ClusterRole"
            && d["kind"] != "ValidatingAdmissionPolicy")
    );
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
            let class = r["exactly"]["deviceClassName"].as_str().unwrap();
            assert!(classes.iter().any(|c| c == class), "{class}");
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
