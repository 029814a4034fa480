//! `actk who` against real runc containers and an emulated kubelet (issue 30): on the
//! heterogeneous fixture (two NVIDIA A10G whose device nodes are numbered across, as on the real
//! instance, and two Inferentia2), containers started through actk-runtime (NVIDIA and Neuron
//! requests), one started by plain runc with a GPU's device node in `linux.devices` (what an
//! engine's own CDI or a device plugin's device specs do), one with the CRI annotations of a
//! Kubernetes container, and one that already exited; the kubelet's PodResources API is played by
//! a server on a temporary socket (no kubelet can be installed here), answering `List` with a
//! device plugin allocation and a DRA allocation. `actk who --json` must name each device's
//! holder and nothing for free devices or the exited container. (The package test runs `actk
//! who` against dockerd's containers, `docker run --gpus` through the hook included.)

use actk_holders::podresources::api::pod_resources_lister_server::{PodResourcesLister, PodResourcesListerServer};
use actk_holders::podresources::api::{
    ClaimResource, ContainerDevices, ContainerResources, DynamicResource, ListPodResourcesRequest,
    ListPodResourcesResponse, PodResources,
};
use actk_testsupport::engines::{self, ActkConfig, Bundle, expect_success, require_root, text, unique_name};
use actk_testsupport::fixture;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use tonic::{Request, Response, Status};

/// The emulated kubelet's answer.
struct Kubelet(ListPodResourcesResponse);

#[tonic::async_trait]
impl PodResourcesLister for Kubelet {
    async fn list(&self, _: Request<ListPodResourcesRequest>) -> Result<Response<ListPodResourcesResponse>, Status> {
        Ok(Response::new(self.0.clone()))
    }
}

/// Serves `answer` on `sock` from a thread of its own until the process ends.
fn serve_kubelet(sock: &Path, answer: ListPodResourcesResponse) {
    let sock = sock.to_path_buf();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async move {
            let listener = tokio::net::UnixListener::bind(&sock).unwrap();
            tx.send(()).unwrap();
            tonic::transport::Server::builder()
                .add_service(PodResourcesListerServer::new(Kubelet(answer)))
                .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener))
                .await
                .unwrap();
        })
    });
    rx.recv().unwrap();
}

/// Containers of a private runc state root, killed and deleted on drop.
struct Containers {
    state: tempfile::TempDir,
    ids: Vec<String>,
    bundles: Vec<Bundle>,
}

impl Containers {
    /// Starts `bundle` detached, through actk-runtime with `config` or through plain runc.
    fn run(&mut self, bundle: Bundle, config: Option<&Path>) -> String {
        let id = unique_name("actk-who");
        let log = self.state.path().join(format!("{id}.log"));
        let exe: PathBuf = if config.is_some() { engines::bin("actk-runtime") } else { PathBuf::from("runc") };
        let mut cmd = Command::new(exe);
        if let Some(c) = config {
            cmd.env("ACTK_CONFIG", c);
        }
        // The container's stdio goes to a file: a pipe would be held open by the detached process.
        let out = std::fs::File::create(&log).unwrap();
        let status = cmd
            .arg("--root")
            .arg(self.state.path())
            .args(["run", "--detach", "--bundle"])
            .arg(bundle.path())
            .arg(&id)
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .status()
            .unwrap();
        assert!(status.success(), "starting {id}: {}", std::fs::read_to_string(&log).unwrap_or_default());
        self.ids.push(id.clone());
        self.bundles.push(bundle);
        id
    }
}

impl Drop for Containers {
    fn drop(&mut self) {
        for id in &self.ids {
            let _ = Command::new("runc").arg("--root").arg(self.state.path()).args(["delete", "--force", id]).output();
        }
    }
}

fn holders(who: &Value, kind: &str, index: u64) -> Vec<Value> {
    who.as_array()
        .unwrap()
        .iter()
        .find(|d| d["kind"] == kind && d["index"] == index)
        .unwrap_or_else(|| panic!("no {kind} {index} in {who:#}"))["holders"]
        .as_array()
        .unwrap()
        .clone()
}

#[test]
fn who_names_runtime_containers_plain_runc_devices_and_kubelet_allocations_for_every_vendor() {
    if !require_root() {
        return;
    }
    let Some(fx) = fixture::prepare("hetero-nvidia-neuron").unwrap() else { return };
    let cfg = ActkConfig::new(&fx.root).unwrap();
    let config = cfg.write().unwrap();
    let sleeper = |env: &[&str]| Bundle::busybox(&["sleep", "300"], env).unwrap();
    let mut c = Containers { state: tempfile::tempdir().unwrap(), ids: Vec::new(), bundles: Vec::new() };

    let gpu1 = c.run(sleeper(&["NVIDIA_VISIBLE_DEVICES=1"]), Some(&config));
    let neuron1 = c.run(sleeper(&["AWS_NEURON_VISIBLE_DEVICES=1"]), Some(&config));
    // GPU 0 of this node is /dev/nvidia1 (195:1): the node in linux.devices, no annotation.
    let plain = sleeper(&[]);
    plain
        .edit(|v| {
            v["linux"]["devices"] =
                json!([{"path": "/dev/nvidia1", "type": "c", "major": 195, "minor": 1, "fileMode": 438}]);
        })
        .unwrap();
    let by_node = c.run(plain, None);
    let pod = sleeper(&["AWS_NEURON_VISIBLE_DEVICES=0"]);
    pod.edit(|v| {
        v["annotations"] = json!({
            "io.kubernetes.cri.container-type": "container",
            "io.kubernetes.cri.container-name": "main",
            "io.kubernetes.cri.sandbox-name": "p",
            "io.kubernetes.cri.sandbox-namespace": "ns",
        });
    })
    .unwrap();
    let in_pod = c.run(pod, Some(&config));
    let exited = c.run(Bundle::busybox(&["true"], &["NVIDIA_VISIBLE_DEVICES=0"]).unwrap(), Some(&config));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let st = Command::new("runc").arg("--root").arg(c.state.path()).args(["state", &exited]).output().unwrap();
        if text(&st).0.contains("\"stopped\"") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "container {exited} did not stop: {}", text(&st).0);
        std::thread::sleep(std::time::Duration::from_millis(100));
    }

    let serial0 = "085ae1b8d8596f77";
    let kubelet = ListPodResourcesResponse {
        pod_resources: vec![
            PodResources {
                name: "p".into(),
                namespace: "ns".into(),
                containers: vec![ContainerResources {
                    name: "main".into(),
                    devices: vec![ContainerDevices {
                        resource_name: "aws.amazon.com/neuron".into(),
                        device_ids: vec![serial0.into()],
                    }],
                    dynamic_resources: vec![],
                }],
            },
            PodResources {
                name: "q".into(),
                namespace: "ns".into(),
                containers: vec![ContainerResources {
                    name: "c".into(),
                    devices: vec![],
                    dynamic_resources: vec![DynamicResource {
                        claim_name: "gpu".into(),
                        claim_namespace: "ns".into(),
                        claim_resources: vec![ClaimResource {
                            cdi_devices: vec![],
                            driver_name: "actk.dev".into(),
                            pool_name: "node".into(),
                            device_name: "nvidia-1".into(),
                        }],
                    }],
                }],
            },
        ],
    };
    let sock = c.state.path().join("kubelet.sock");
    serve_kubelet(&sock, kubelet);

    let args = |json: bool| {
        let mut a = vec![
            "who".to_string(),
            "--state-root".into(),
            c.state.path().display().to_string(),
            "--pod-resources".into(),
            sock.display().to_string(),
        ];
        if json {
            a.push("--json".into());
        }
        a
    };
    let out = expect_success("actk who --json", &engines::actk(Some(&config), &args(true)));
    let who: Value = serde_json::from_str(&out).unwrap();

    let g1 = holders(&who, "nvidia.com/gpu", 1);
    assert_eq!(g1.len(), 2, "{g1:#?}");
    assert!(
        g1.iter().any(|h| h["container_id"] == gpu1.as_str() && h["via"] == "NVIDIA_VISIBLE_DEVICES (actk-runtime)"),
        "{g1:#?}"
    );
    assert!(
        g1.iter().any(|h| h["pod"] == "q" && h["via"] == "DRA claim ns/gpu (actk.dev)" && h["engine"] == "kubelet"),
        "{g1:#?}"
    );
    let g0 = holders(&who, "nvidia.com/gpu", 0);
    assert_eq!(g0.len(), 1, "GPU 0 is held only by the plain runc container (the exited one is gone): {g0:#?}");
    assert_eq!(g0[0]["container_id"], by_node.as_str());
    assert_eq!(g0[0]["via"], "device node /dev/nvidia1");
    let n1 = holders(&who, "aws.amazon.com/neuron", 1);
    assert_eq!(n1.len(), 1, "{n1:#?}");
    assert_eq!(n1[0]["container_id"], neuron1.as_str());
    assert_eq!(n1[0]["via"], "AWS_NEURON_VISIBLE_DEVICES (actk-runtime)");
    // The kubelet's allocation and the running CRI container are one holder.
    let n0 = holders(&who, "aws.amazon.com/neuron", 0);
    assert_eq!(n0.len(), 1, "{n0:#?}");
    assert_eq!(n0[0]["namespace"], "ns");
    assert_eq!(n0[0]["pod"], "p");
    assert_eq!(n0[0]["container"], "main");
    assert_eq!(n0[0]["container_id"], in_pod.as_str());
    assert_eq!(n0[0]["via"], "device plugin aws.amazon.com/neuron");
    assert!(!out.contains(&exited), "an exited container is listed: {out}");

    let table = expect_success("actk who", &engines::actk(Some(&config), &args(false)));
    assert!(table.lines().next().unwrap().starts_with("KIND"), "{table}");
    assert!(table.contains("pod ns/p container main"), "{table}");
    assert!(table.contains(&format!("runc {}", &by_node[..12])), "{table}");

    // A kubelet that is gone but left its socket: a warning, and the containers are still listed.
    let stale = c.state.path().join("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    let o = engines::actk(
        Some(&config),
        &[
            "who",
            "--json",
            "--state-root",
            &c.state.path().display().to_string(),
            "--pod-resources",
            &stale.display().to_string(),
        ],
    );
    let (out, err) = text(&o);
    assert!(o.status.success() && err.contains("kubelet allocations are not shown"), "{err}");
    assert_eq!(holders(&serde_json::from_str(&out).unwrap(), "aws.amazon.com/neuron", 1).len(), 1);

    // No kubelet on the node: the socket is absent, containers are still listed.
    let no_kubelet = engines::actk(
        Some(&config),
        &[
            "who",
            "--json",
            "--state-root",
            &c.state.path().display().to_string(),
            "--pod-resources",
            "/nonexistent/kubelet.sock",
        ],
    );
    let (o, e) = text(&no_kubelet);
    assert!(no_kubelet.status.success(), "{e}");
    let who: Value = serde_json::from_str(&o).unwrap();
    assert_eq!(holders(&who, "nvidia.com/gpu", 1).len(), 1);
}
