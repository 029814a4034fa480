//! The device plugin binary against a kubelet emulator: no kubelet can be installed here, so
//! these tests play its part over the same proto (kubelet device plugin API v1beta1): a
//! Registration server on a temporary kubelet.sock, and a DevicePlugin client that dials the
//! endpoint the plugin registered. Host roots are the repository's fixtures (device nodes need
//! root; the tests skip with a message otherwise).
//!
//! Covered: register (serving before Register), ListAndWatch with NUMA topology, Allocate with
//! every strategy and unknown IDs, GetPreferredAllocation (F10), health (a node removed and
//! re-created), a kubelet restart that wipes the socket directory (F12), a late kubelet.sock,
//! and a real runc container started from an Allocate answer; with the NVML test double of the
//! NVIDIA fixtures: MIG strategies (mixed on the DGX A100), time-slicing (F20), Xid health, and
//! NVLink peers in the preferred allocation. The emulated kubelet also serves PodResources
//! (`List`: what the test says pods hold), from which the plugin learns what is held: hardware
//! covered by several resources (Neuron devices and cores) is never handed out twice (issue 28).

use actk_device_plugin::api::device_plugin_client::DevicePluginClient;
use actk_device_plugin::api::podresources::pod_resources_lister_server::{
    PodResourcesLister, PodResourcesListerServer,
};
use actk_device_plugin::api::podresources::{
    ContainerDevices, ContainerResources, ListPodResourcesRequest, ListPodResourcesResponse, PodResources,
};
use actk_device_plugin::api::registration_server::{Registration, RegistrationServer};
use actk_device_plugin::api::{
    AllocateRequest, ContainerAllocateRequest, ContainerAllocateResponse, ContainerPreferredAllocationRequest, Empty,
    ListAndWatchResponse, PreferredAllocationRequest, RegisterRequest,
};
use actk_testsupport::fixture::{self, Fixture};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};
use tonic::{Request, Response, Status, Streaming};

/// The Registration service of the emulated kubelet: it records every RegisterRequest.
struct Kubelet {
    dir: PathBuf,
    tx: mpsc::UnboundedSender<RegisterRequest>,
}

#[tonic::async_trait]
impl Registration for Kubelet {
    async fn register(&self, req: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        let req = req.into_inner();
        if req.version != "v1beta1" {
            return Err(Status::invalid_argument(format!("unsupported version {:?}", req.version)));
        }
        // The kubelet dials the endpoint as soon as Register arrives: it must already answer.
        let sock = self.dir.join(&req.endpoint);
        let serving = async {
            let ch = actk_device_plugin::uds::connect(&sock).await.ok()?;
            DevicePluginClient::new(ch).get_device_plugin_options(Empty {}).await.ok()
        };
        if tokio::time::timeout(Duration::from_secs(2), serving).await.ok().flatten().is_none() {
            return Err(Status::failed_precondition(format!("endpoint {} does not answer", sock.display())));
        }
        let _ = self.tx.send(req);
        Ok(Response::new(Empty {}))
    }
}

/// The PodResources service of the emulated kubelet: it lists what the test says the node's
/// pods hold, as (resource, device IDs) per container.
#[derive(Clone, Default)]
struct PodResourcesState(Arc<Mutex<Held>>);

/// (resource, device IDs) per container.
type Held = Vec<(String, Vec<String>)>;

impl PodResourcesState {
    fn set(&self, held: &[(&str, &[&str])]) {
        *self.0.lock().unwrap() =
            held.iter().map(|(r, ids)| (r.to_string(), ids.iter().map(|i| i.to_string()).collect())).collect();
    }
}

#[tonic::async_trait]
impl PodResourcesLister for PodResourcesState {
    async fn list(&self, _: Request<ListPodResourcesRequest>) -> Result<Response<ListPodResourcesResponse>, Status> {
        let held = self.0.lock().unwrap().clone();
        let pod_resources = held
            .into_iter()
            .enumerate()
            .map(|(i, (resource_name, device_ids))| PodResources {
                name: format!("pod-{i}"),
                namespace: "default".into(),
                containers: vec![ContainerResources {
                    name: "c".into(),
                    devices: vec![ContainerDevices { resource_name, device_ids }],
                }],
            })
            .collect();
        Ok(Response::new(ListPodResourcesResponse { pod_resources }))
    }
}

/// Where the emulated kubelet serves PodResources: a directory of its own under the socket
/// directory (a kubelet restart wipes the sockets of the directory, not its subdirectories).
fn pod_resources_socket(socket_dir: &Path) -> PathBuf {
    socket_dir.join("pod-resources/kubelet.sock")
}

/// An emulated kubelet: its socket directory, the Registration server on kubelet.sock, and the
/// PodResources server.
struct Emulator {
    dir: PathBuf,
    registered: mpsc::UnboundedReceiver<RegisterRequest>,
    tx: mpsc::UnboundedSender<RegisterRequest>,
    stop: Option<oneshot::Sender<()>>,
    pods: PodResourcesState,
    pods_served: bool,
}

impl Emulator {
    fn new(dir: &Path) -> Emulator {
        let (tx, registered) = mpsc::unbounded_channel();
        Emulator { dir: dir.to_path_buf(), registered, tx, stop: None, pods: Default::default(), pods_served: false }
    }

    /// Start serving kubelet.sock, as a kubelet does when it starts (and PodResources, once).
    fn start(&mut self) {
        if !self.pods_served {
            let sock = pod_resources_socket(&self.dir);
            std::fs::create_dir_all(sock.parent().unwrap()).unwrap();
            let listener = tokio::net::UnixListener::bind(&sock).expect("bind pod-resources/kubelet.sock");
            tokio::spawn(
                tonic::transport::Server::builder()
                    .add_service(PodResourcesListerServer::new(self.pods.clone()))
                    .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
            );
            self.pods_served = true;
        }
        let sock = self.dir.join("kubelet.sock");
        let _ = std::fs::remove_file(&sock);
        let listener = tokio::net::UnixListener::bind(&sock).expect("bind kubelet.sock");
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        self.stop = Some(stop_tx);
        let svc = RegistrationServer::new(Kubelet { dir: self.dir.clone(), tx: self.tx.clone() });
        tokio::spawn(tonic::transport::Server::builder().add_service(svc).serve_with_incoming_shutdown(
            tokio_stream::wrappers::UnixListenerStream::new(listener),
            async {
                let _ = stop_rx.await;
            },
        ));
    }

    /// A kubelet that comes back on a new kubelet.sock without touching the plugins' sockets.
    async fn restart_keeping_dir(&mut self, down: Duration) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        let _ = std::fs::remove_file(self.dir.join("kubelet.sock"));
        tokio::time::sleep(down).await;
        self.start();
    }

    /// A kubelet restart as kubelet does it: stop, wipe the device-plugins directory (every
    /// socket in it), and come back with a new kubelet.sock after `down`.
    async fn restart_wiping_dir(&mut self, down: Duration) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        for e in std::fs::read_dir(&self.dir).unwrap() {
            let _ = std::fs::remove_file(e.unwrap().path());
        }
        tokio::time::sleep(down).await;
        self.start();
    }

    /// The next RegisterRequest within `limit`.
    async fn next_register(&mut self, limit: Duration) -> RegisterRequest {
        tokio::time::timeout(limit, self.registered.recv())
            .await
            .unwrap_or_else(|_| panic!("no Register within {limit:?}"))
            .expect("channel open")
    }

    /// The next RegisterRequest for `resource` within `limit`, skipping the others: a node that
    /// serves several resources registers them in no fixed order.
    async fn next_register_of(&mut self, resource: &str, limit: Duration) -> RegisterRequest {
        let t = Instant::now();
        loop {
            let r = self.next_register(limit.saturating_sub(t.elapsed())).await;
            if r.resource_name == resource {
                return r;
            }
        }
    }

    /// Asserts that no Register arrives within `quiet` (the plugin is calm, not looping).
    async fn assert_no_register(&mut self, quiet: Duration) {
        if let Ok(Some(r)) = tokio::time::timeout(quiet, self.registered.recv()).await {
            panic!("unexpected Register of {} ({})", r.resource_name, r.endpoint);
        }
    }

    /// A DevicePlugin client to the endpoint of `reg`, as the kubelet dials it.
    async fn dial(&self, reg: &RegisterRequest) -> DevicePluginClient<tonic::transport::Channel> {
        let ch =
            actk_device_plugin::uds::connect(&self.dir.join(&reg.endpoint)).await.expect("dial the plugin endpoint");
        DevicePluginClient::new(ch)
    }
}

/// The plugin binary, killed when dropped.
struct PluginProcess {
    child: Child,
    _config: tempfile::TempDir,
}

/// The node's CDI specs as `actk cdi generate --output DIR` writes them for `root` (names by
/// index and UUID), in `dir`.
fn write_specs(root: &Path, dir: &Path, names: actk_core::cdi::DeviceNameStrategy) {
    let profiles = actk_core::profile::builtin();
    let inv = actk_core::discover::discover(root, &profiles);
    let opts = actk_core::cdi::GenerateOptions { device_name_strategy: names, ..Default::default() };
    for spec in actk_core::cdi::generate::generate_all(&profiles, &inv, None, &opts).unwrap() {
        actk_core::cdi::write::write_spec_in_dir(&spec, dir, actk_core::cdi::Format::Json).unwrap();
    }
}

impl PluginProcess {
    /// The plugin for `root`, with the node's CDI specs in a directory of its own (unless
    /// `args` name `--spec-dirs`).
    fn start(root: &Path, socket_dir: &Path, args: &[&str]) -> PluginProcess {
        PluginProcess::start_with_config(root, socket_dir, "", args)
    }

    /// The plugin with `extra` appended to its config file (TOML).
    fn start_with_config(root: &Path, socket_dir: &Path, extra: &str, args: &[&str]) -> PluginProcess {
        let config = tempfile::tempdir().unwrap();
        std::fs::write(config.path().join("dp.toml"), format!("health_interval_ms = 100\n{extra}")).unwrap();
        std::fs::create_dir_all(config.path().join("profiles.d")).unwrap();
        let spec_dir = config.path().join("cdi");
        if !args.contains(&"--spec-dirs") {
            write_specs(root, &spec_dir, actk_core::cdi::DeviceNameStrategy::Both);
        }
        let child = Command::new(env!("CARGO_BIN_EXE_actk-device-plugin"))
            .arg("--config")
            .arg(config.path().join("dp.toml"))
            .arg("--root")
            .arg(root)
            .arg("--socket-dir")
            .arg(socket_dir)
            .arg("--profiles-dir")
            .arg(config.path().join("profiles.d"))
            .args(if args.contains(&"--spec-dirs") { vec![] } else { vec!["--spec-dirs".into(), spec_dir] })
            .arg("--pod-resources-socket")
            .arg(pod_resources_socket(socket_dir))
            .args(args)
            .env("ACTK_LOG", "actk_device_plugin=debug,info")
            .stdin(Stdio::null())
            .spawn()
            .expect("start actk-device-plugin");
        PluginProcess { child, _config: config }
    }

    /// The spec directory the plugin reads when the test gave none (`--spec-dirs`).
    fn spec_dir(&self) -> PathBuf {
        self._config.path().join("cdi")
    }

    fn assert_running(&mut self) {
        assert!(self.child.try_wait().unwrap().is_none(), "the plugin exited: {:?}", self.child.try_wait());
    }
}

impl Drop for PluginProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn prepare(name: &str) -> Option<Fixture> {
    fixture::prepare(name).expect("fixture prepares")
}

fn one(ids: &[&str]) -> AllocateRequest {
    AllocateRequest {
        container_requests: vec![ContainerAllocateRequest { devices_ids: ids.iter().map(|s| s.to_string()).collect() }],
    }
}

async fn next_list(stream: &mut Streaming<ListAndWatchResponse>, limit: Duration) -> ListAndWatchResponse {
    tokio::time::timeout(limit, stream.message())
        .await
        .unwrap_or_else(|_| panic!("no ListAndWatch update within {limit:?}"))
        .expect("stream ok")
        .expect("stream open")
}

fn health_of(list: &ListAndWatchResponse, id: &str) -> String {
    list.devices.iter().find(|d| d.id == id).map(|d| d.health.clone()).unwrap_or_else(|| panic!("{id} not listed"))
}

/// GPU UUIDs of the fixture in index (PCI bus) order, read from procfs.
fn gpu_uuids(root: &Path) -> Vec<String> {
    let inv = actk_core::discover::discover(root, &actk_core::profile::builtin());
    inv.vendor_by_kind("nvidia.com/gpu").unwrap().devices.iter().map(|d| d.uuid.clone().unwrap()).collect()
}

#[tokio::test]
async fn register_stream_allocate_and_errors_on_dgx() {
    let Some(f) = prepare("nvidia-dgx-h100") else { return };
    let dir = tempfile::tempdir().unwrap();
    let mut kubelet = Emulator::new(dir.path());
    kubelet.start();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let metrics_addr = format!("127.0.0.1:{port}");
    let _plugin = PluginProcess::start(
        &f.root,
        dir.path(),
        &[
            "--strategies",
            "cdi-cri,cdi-annotations,envvar,device-specs,volume-mounts",
            "--metrics-address",
            &metrics_addr,
        ],
    );
    let reg = kubelet.next_register(Duration::from_secs(10)).await;
    assert_eq!((reg.version.as_str(), reg.resource_name.as_str()), ("v1beta1", "nvidia.com/gpu"));
    assert!(dir.path().join(&reg.endpoint).exists(), "endpoint {} is a file in the socket dir", reg.endpoint);
    assert!(reg.options.unwrap().get_preferred_allocation_available);
    let mut client = kubelet.dial(&reg).await;
    let opts = client.get_device_plugin_options(Empty {}).await.unwrap().into_inner();
    assert!(opts.get_preferred_allocation_available && !opts.pre_start_required);

    let uuids = gpu_uuids(&f.root);
    let mut stream = client.list_and_watch(Empty {}).await.unwrap().into_inner();
    let list = next_list(&mut stream, Duration::from_secs(5)).await;
    let ids: Vec<&str> = list.devices.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(ids, uuids.iter().map(String::as_str).collect::<Vec<_>>(), "device IDs are the GPU UUIDs");
    assert!(list.devices.iter().all(|d| d.health == "Healthy"));
    let numa: Vec<i64> = list.devices.iter().map(|d| d.topology.as_ref().unwrap().nodes[0].id).collect();
    assert_eq!(numa, [0, 0, 0, 0, 1, 1, 1, 1], "NUMA nodes from the fixture's sysfs");

    let resp = client.allocate(one(&[&uuids[1], &uuids[0]])).await.unwrap().into_inner();
    let c: &ContainerAllocateResponse = &resp.container_responses[0];
    let cdi: Vec<&str> = c.cdi_devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(cdi, ["nvidia.com/gpu=0", "nvidia.com/gpu=1"]);
    assert_eq!(c.annotations["cdi.k8s.io/actk_nvidia.com_gpu"], "nvidia.com/gpu=0,nvidia.com/gpu=1");
    assert_eq!(c.envs["NVIDIA_VISIBLE_DEVICES"], format!("{},{}", uuids[0], uuids[1]));
    let specs: Vec<(&str, &str)> =
        c.devices.iter().map(|d| (d.container_path.as_str(), d.host_path.as_str())).collect();
    let host = |p: &str| f.root.join(p.trim_start_matches('/')).display().to_string();
    assert!(specs.contains(&("/dev/nvidia0", host("/dev/nvidia0").as_str())), "{specs:?}");
    assert!(specs.contains(&("/dev/nvidia1", host("/dev/nvidia1").as_str())), "{specs:?}");
    assert!(specs.contains(&("/dev/nvidiactl", host("/dev/nvidiactl").as_str())), "{specs:?}");
    assert!(!specs.iter().any(|(p, _)| *p == "/dev/nvidia2"), "{specs:?}");
    assert!(
        c.mounts.iter().any(|m| m.container_path.ends_with("libcuda.so.580.95.05") && m.read_only),
        "{:?}",
        c.mounts
    );
    // volume-mounts: the device list actk-runtime serves as the allocation (issue 10).
    let list: Vec<(&str, &str, bool)> = c
        .mounts
        .iter()
        .filter(|m| m.container_path.starts_with("/var/run/actk/devices/"))
        .map(|m| (m.container_path.as_str(), m.host_path.as_str(), m.read_only))
        .collect();
    assert_eq!(
        list,
        [
            ("/var/run/actk/devices/nvidia.com/gpu/0", "/dev/null", true),
            ("/var/run/actk/devices/nvidia.com/gpu/1", "/dev/null", true)
        ]
    );

    let err = client.allocate(one(&[&uuids[0], "GPU-nope", "7x"])).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("GPU-nope, 7x") && err.message().contains("nvidia.com/gpu"), "{}", err.message());

    // OpenMetrics text on /metrics (what Prometheus asks for first): what just happened, per
    // resource.
    let page = http_get(&metrics_addr, "/metrics");
    assert!(
        page.starts_with("HTTP/1.1 200 OK\r\n")
            && page.to_ascii_lowercase().contains("content-type: application/openmetrics-text; version=1.0.0"),
        "{page}"
    );
    assert!(page.ends_with("# EOF\n"), "{page}");
    for line in [
        "actk_device_plugin_allocations_total{resource=\"nvidia.com/gpu\"} 1",
        "actk_device_plugin_allocate_errors_total{resource=\"nvidia.com/gpu\"} 1",
        "actk_device_plugin_registrations_total{resource=\"nvidia.com/gpu\"} 1",
        "actk_device_plugin_devices{resource=\"nvidia.com/gpu\",health=\"Healthy\"} 8",
        "actk_device_plugin_devices{resource=\"nvidia.com/gpu\",health=\"Unhealthy\"} 0",
    ] {
        assert!(page.lines().any(|l| l == line), "{line} missing from:\n{page}");
    }
    assert!(http_get(&metrics_addr, "/").starts_with("HTTP/1.1 404"), "only /metrics is served");
}

/// A plain HTTP/1.1 GET, retried while the endpoint starts.
fn http_get(addr: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let t = Instant::now();
    loop {
        match std::net::TcpStream::connect(addr) {
            Ok(mut c) => {
                c.write_all(format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n").as_bytes())
                    .unwrap();
                let mut out = String::new();
                c.read_to_string(&mut out).unwrap();
                return out;
            }
            Err(e) if t.elapsed() < Duration::from_secs(5) => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("metrics endpoint {addr}: {e}"),
        }
    }
}

/// F18: a node whose CDI spec names GPUs by UUID only: Allocate answers with the UUID names
/// that spec defines; with no spec for the kind it refuses, naming the device and the fix,
/// instead of handing out a name the runtime cannot resolve.
#[tokio::test]
async fn f18_cdi_names_come_from_the_node_specs() {
    let Some(f) = prepare("nvidia-dgx-h100") else { return };
    let dir = tempfile::tempdir().unwrap();
    let specs = tempfile::tempdir().unwrap();
    write_specs(&f.root, specs.path(), actk_core::cdi::DeviceNameStrategy::Uuid);
    let mut kubelet = Emulator::new(dir.path());
    kubelet.start();
    let spec_dir = specs.path().display().to_string();
    let _plugin = PluginProcess::start(&f.root, dir.path(), &["--strategies", "cdi-cri", "--spec-dirs", &spec_dir]);
    let reg = kubelet.next_register(Duration::from_secs(10)).await;
    let mut client = kubelet.dial(&reg).await;
    let uuids = gpu_uuids(&f.root);
    let resp = client.allocate(one(&[&uuids[3]])).await.unwrap().into_inner();
    let names: Vec<&str> = resp.container_responses[0].cdi_devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, [format!("nvidia.com/gpu={}", uuids[3])], "the name the node's spec defines, not =3");
    let spec: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(specs.path().join("nvidia.com-gpu.json")).unwrap()).unwrap();
    let defined: Vec<&str> = spec["devices"].as_array().unwrap().iter().filter_map(|d| d["name"].as_str()).collect();
    assert!(defined.contains(&uuids[3].as_str()) && !defined.contains(&"3"), "{defined:?}");

    let mut stream = client.list_and_watch(Empty {}).await.unwrap().into_inner();
    let listed = next_list(&mut stream, Duration::from_secs(5)).await;
    assert!(listed.devices.iter().all(|d| d.health == "Healthy"), "{:?}", listed.devices);

    // The spec is removed (the generator's pod went): the devices are no longer allocatable
    // (Unhealthy in ListAndWatch) and no name is handed out any more.
    std::fs::remove_file(specs.path().join("nvidia.com-gpu.json")).unwrap();
    let gone = next_list(&mut stream, Duration::from_secs(5)).await;
    assert!(gone.devices.iter().all(|d| d.health == "Unhealthy"), "{:?}", gone.devices);
    let err = client.allocate(one(&[&uuids[3]])).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    let msg = err.message();
    assert!(msg.contains("no CDI spec in") && msg.contains(&spec_dir) && msg.contains("device 3"), "{msg}");
    assert!(msg.contains("actk cdi generate"), "{msg}");
    // Written again (index names this time): picked up at the next Allocate.
    write_specs(&f.root, specs.path(), actk_core::cdi::DeviceNameStrategy::Index);
    let back = next_list(&mut stream, Duration::from_secs(5)).await;
    assert!(back.devices.iter().all(|d| d.health == "Healthy"), "{:?}", back.devices);
    let resp = client.allocate(one(&[&uuids[3]])).await.unwrap().into_inner();
    assert_eq!(resp.container_responses[0].cdi_devices[0].name, "nvidia.com/gpu=3");
}

#[tokio::test]
async fn f10_preferred_allocation_over_grpc_is_a_contiguous_pair() {
    let Some(f) = prepare("aws-inf2-48xlarge") else { return };
    let dir = tempfile::tempdir().unwrap();
    let mut kubelet = Emulator::new(dir.path());
    kubelet.start();
    let _plugin =
        PluginProcess::start(&f.root, dir.path(), &["--device-ids", "index", "--strategies", "envvar,cdi-cri"]);
    let mut regs = Vec::new();
    for _ in 0..3 {
        regs.push(kubelet.next_register(Duration::from_secs(10)).await);
    }
    let names: std::collections::BTreeSet<&str> = regs.iter().map(|r| r.resource_name.as_str()).collect();
    assert_eq!(names, ["aws.amazon.com/neuron", "aws.amazon.com/neuroncore", "aws.amazon.com/neurondevice"].into());
    let neuron = regs.iter().find(|r| r.resource_name == "aws.amazon.com/neuron").unwrap();
    let mut client = kubelet.dial(neuron).await;
    let available: Vec<String> = (0..12).filter(|d| *d != 1 && *d != 2).map(|d| d.to_string()).collect();
    let req = PreferredAllocationRequest {
        container_requests: vec![ContainerPreferredAllocationRequest {
            available_device_i_ds: available,
            must_include_device_i_ds: vec![],
            allocation_size: 2,
        }],
    };
    let resp = client.get_preferred_allocation(req).await.unwrap().into_inner();
    assert_eq!(resp.container_responses[0].device_i_ds, ["3", "4"]);
    let alloc = client.allocate(one(&["4", "3"])).await.unwrap().into_inner();
    assert_eq!(alloc.container_responses[0].envs["AWS_NEURON_VISIBLE_DEVICES"], "3,4");

    // neuroncore: global core numbers; the cores variable is always set.
    let cores = regs.iter().find(|r| r.resource_name == "aws.amazon.com/neuroncore").unwrap();
    let mut client = kubelet.dial(cores).await;
    let mut stream = client.list_and_watch(Empty {}).await.unwrap().into_inner();
    assert_eq!(next_list(&mut stream, Duration::from_secs(5)).await.devices.len(), 24, "12 devices x 2 cores");
    // (Cores of device 5: devices 3 and 4 are held through aws.amazon.com/neuron above.)
    let alloc = client.allocate(one(&["10", "11"])).await.unwrap().into_inner();
    let c = &alloc.container_responses[0];
    assert_eq!(c.envs["NEURON_RT_VISIBLE_CORES"], "10,11");
    assert_eq!(c.envs["AWS_NEURON_VISIBLE_DEVICES"], "5");
    assert_eq!(c.cdi_devices.iter().map(|d| d.name.as_str()).collect::<Vec<_>>(), ["aws.amazon.com/neuron=5"]);
}

#[tokio::test]
async fn health_goes_unhealthy_within_2s_and_recovers() {
    let Some(f) = prepare("nvidia-dgx-h100") else { return };
    let dir = tempfile::tempdir().unwrap();
    let mut kubelet = Emulator::new(dir.path());
    kubelet.start();
    let _plugin = PluginProcess::start(&f.root, dir.path(), &["--device-ids", "index"]);
    let reg = kubelet.next_register(Duration::from_secs(10)).await;
    let mut client = kubelet.dial(&reg).await;
    let mut stream = client.list_and_watch(Empty {}).await.unwrap().into_inner();
    let first = next_list(&mut stream, Duration::from_secs(5)).await;
    assert_eq!(health_of(&first, "3"), "Healthy");

    let node = f.path("dev/nvidia3");
    let meta = std::fs::metadata(&node).unwrap();
    std::fs::remove_file(&node).unwrap();
    let t = Instant::now();
    let update = next_list(&mut stream, Duration::from_secs(2)).await;
    assert_eq!(health_of(&update, "3"), "Unhealthy", "after {:?}", t.elapsed());
    assert_eq!(health_of(&update, "2"), "Healthy");
    assert_eq!(update.devices.len(), 8, "an unhealthy device stays listed");

    use std::os::unix::fs::MetadataExt;
    let st = Command::new("mknod")
        .arg(&node)
        .arg("c")
        .arg(((meta.rdev() >> 8) & 0xfff).to_string())
        .arg((meta.rdev() & 0xff).to_string())
        .status()
        .unwrap();
    assert!(st.success());
    let back = next_list(&mut stream, Duration::from_secs(2)).await;
    assert_eq!(health_of(&back, "3"), "Healthy", "the device recovers without a restart");
}

/// A GPU whose device node is missing when the plugin starts is listed Unhealthy (not handed
/// out); once the node appears, the plugin serves the new set of devices (a new Register) with
/// the GPU healthy, without a restart.
#[tokio::test]
async fn device_whose_node_appears_late_is_served_once_it_does() {
    let Some(f) = prepare("nvidia-dgx-h100") else { return };
    let node = f.path("dev/nvidia7");
    std::fs::remove_file(&node).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut kubelet = Emulator::new(dir.path());
    kubelet.start();
    let plugin = PluginProcess::start(&f.root, dir.path(), &["--device-ids", "index"]);
    let reg = kubelet.next_register(Duration::from_secs(10)).await;
    let mut client = kubelet.dial(&reg).await;
    let mut stream = client.list_and_watch(Empty {}).await.unwrap().into_inner();
    let first = next_list(&mut stream, Duration::from_secs(5)).await;
    assert_eq!(health_of(&first, "7"), "Unhealthy", "no node, not usable");
    assert_eq!(health_of(&first, "6"), "Healthy");

    let st = Command::new("mknod").arg(&node).args(["c", "195", "7"]).status().unwrap();
    assert!(st.success());
    let again = kubelet.next_register(Duration::from_secs(12)).await;
    assert_eq!(again.resource_name, "nvidia.com/gpu");
    let mut client = kubelet.dial(&again).await;
    let mut stream = client.list_and_watch(Empty {}).await.unwrap().into_inner();
    let now = next_list(&mut stream, Duration::from_secs(5)).await;
    // Until the node's specs name GPU 7 it cannot be handed out by CDI name, so the kubelet
    // must not count it: Unhealthy, the others Healthy.
    assert_eq!(health_of(&now, "7"), "Unhealthy", "no spec names it yet: {:?}", now.devices);
    assert!(now.devices.iter().filter(|d| d.id != "7").all(|d| d.health == "Healthy"), "{:?}", now.devices);
    let resp = client.allocate(one(&["6"])).await.unwrap().into_inner();
    assert_eq!(resp.container_responses[0].cdi_devices[0].name, "nvidia.com/gpu=6");
    // The generator's next pass writes the spec with GPU 7: the stream reports it Healthy and
    // Allocate names it.
    write_specs(&f.root, &plugin.spec_dir(), actk_core::cdi::DeviceNameStrategy::Both);
    let later = next_list(&mut stream, Duration::from_secs(5)).await;
    assert!(later.devices.iter().all(|d| d.health == "Healthy"), "{:?}", later.devices);
    let resp = client.allocate(one(&["7"])).await.unwrap().into_inner();
    assert_eq!(resp.container_responses[0].cdi_devices[0].name, "nvidia.com/gpu=7");
}

#[tokio::test]
async fn f12_kubelet_restart_wiping_socket_dir_reregisters_within_5s() {
    let Some(f) = prepare("hetero-nvidia-neuron") else { return };
    let dir = tempfile::tempdir().unwrap();
    let mut kubelet = Emulator::new(dir.path());
    kubelet.start();
    let mut plugin =
        PluginProcess::start(&f.root, dir.path(), &["--resources", "nvidia.com/gpu,aws.amazon.com/neuron"]);
    let mut before = Vec::new();
    for _ in 0..2 {
        before.push(kubelet.next_register(Duration::from_secs(10)).await);
    }
    before.sort_by(|a, b| a.resource_name.cmp(&b.resource_name));
    // The kubelet holds one ListAndWatch stream per plugin for as long as it lives.
    let mut streams = Vec::new();
    let mut devices_before = Vec::new();
    for r in &before {
        let mut s = kubelet.dial(r).await.list_and_watch(Empty {}).await.unwrap().into_inner();
        devices_before.push(next_list(&mut s, Duration::from_secs(5)).await.devices);
        streams.push(s);
    }
    kubelet.assert_no_register(Duration::from_secs(1)).await;

    // Rounds 0 and 1: a real restart (connections die, directory wiped). Round 2: only
    // kubelet.sock is re-created while the old streams stay open, so the plugin must notice
    // the new socket itself.
    for round in 0..3 {
        if round < 2 {
            streams.clear(); // the old kubelet's connections die with it
            kubelet.restart_wiping_dir(Duration::from_millis(300)).await;
        } else {
            kubelet.restart_keeping_dir(Duration::from_millis(300)).await;
        }
        let t = Instant::now();
        let mut after = Vec::new();
        for _ in 0..2 {
            after.push(kubelet.next_register(Duration::from_secs(5)).await);
        }
        assert!(t.elapsed() < Duration::from_secs(5), "round {round}: re-registered after {:?}", t.elapsed());
        after.sort_by(|a, b| a.resource_name.cmp(&b.resource_name));
        assert_eq!(after, before, "round {round}: same resources and endpoints");
        for (r, want) in after.iter().zip(&devices_before) {
            assert!(dir.path().join(&r.endpoint).exists(), "{} serves again", r.endpoint);
            let mut s = kubelet.dial(r).await.list_and_watch(Empty {}).await.unwrap().into_inner();
            assert_eq!(&next_list(&mut s, Duration::from_secs(5)).await.devices, want, "round {round}: same devices");
            streams.push(s);
        }
        kubelet.assert_no_register(Duration::from_secs(1)).await;
        plugin.assert_running();
    }
}

#[tokio::test]
async fn late_kubelet_socket_plugin_waits_serving_then_registers() {
    let Some(f) = prepare("gaudi2") else { return };
    let dir = tempfile::tempdir().unwrap();
    let mut kubelet = Emulator::new(dir.path());
    let mut plugin = PluginProcess::start(&f.root, dir.path(), &[]);
    tokio::time::sleep(Duration::from_secs(2)).await;
    plugin.assert_running();
    let sock = dir.path().join("actk-habana_ai_gaudi.sock");
    assert!(sock.exists(), "the plugin serves before any kubelet is there");
    // Serving already: the DevicePlugin answers although nobody registered it yet.
    let ch = actk_device_plugin::uds::connect(&sock).await.unwrap();
    let opts = DevicePluginClient::new(ch).get_device_plugin_options(Empty {}).await.unwrap().into_inner();
    assert!(opts.get_preferred_allocation_available);
    kubelet.start();
    let t = Instant::now();
    let reg = kubelet.next_register(Duration::from_secs(5)).await;
    assert_eq!(reg.resource_name, "habana.ai/gaudi");
    assert!(t.elapsed() < Duration::from_secs(5));
    let mut s = kubelet.dial(&reg).await.list_and_watch(Empty {}).await.unwrap().into_inner();
    assert_eq!(next_list(&mut s, Duration::from_secs(5)).await.devices.len(), 8);
    plugin.assert_running();
}

/// Device nodes a container sees under /dev matching `nvidia*`, as "name major minor" lines.
const LIST_NODES: &str = "cd /dev && for f in nvidia*; do [ -c \"$f\" ] && stat -c '%n %t %T' \"$f\"; done; test -e /usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05 && echo libcuda";

fn run_bundle(b: &actk_testsupport::engines::Bundle, what: &str) -> String {
    let id = actk_testsupport::engines::unique_name(what);
    let o = actk_testsupport::engines::runc(&[
        "run".as_ref(),
        "--bundle".as_ref(),
        b.path().as_os_str(),
        std::ffi::OsStr::new(&id),
    ]);
    actk_testsupport::engines::expect_success(&format!("runc run ({what})"), &o)
}

/// A busybox bundle running `script` with what the kubelet makes of Allocate answer `c`'s device
/// specs and mounts: OCI devices (numbers from the host node), cgroup allow rules, bind mounts.
fn kubelet_bundle(c: &ContainerAllocateResponse, script: &str) -> actk_testsupport::engines::Bundle {
    let bundle = actk_testsupport::engines::Bundle::busybox(&["sh", "-c", script], &[]).unwrap();
    bundle
        .edit(|cfg| {
            use std::os::unix::fs::MetadataExt;
            for d in &c.devices {
                let rdev = std::fs::metadata(&d.host_path).unwrap().rdev();
                let (major, minor) = ((rdev >> 8) & 0xfff, (rdev & 0xff) | ((rdev >> 12) & 0xfff00));
                let dev = serde_json::json!({"path": d.container_path, "type": "c", "major": major, "minor": minor, "fileMode": 0o666});
                if cfg["linux"]["devices"].is_null() {
                    cfg["linux"]["devices"] = serde_json::json!([]);
                }
                cfg["linux"]["devices"].as_array_mut().unwrap().push(dev);
                cfg["linux"]["resources"]["devices"]
                    .as_array_mut()
                    .unwrap()
                    .push(serde_json::json!({"allow": true, "type": "c", "major": major, "minor": minor, "access": d.permissions}));
            }
            for m in &c.mounts {
                let opts = if m.read_only { serde_json::json!(["rbind", "ro"]) } else { serde_json::json!(["rbind"]) };
                cfg["mounts"].as_array_mut().unwrap().push(serde_json::json!({"destination": m.container_path, "source": m.host_path, "type": "bind", "options": opts}));
            }
        })
        .unwrap();
    bundle
}

#[tokio::test]
async fn allocate_answer_starts_a_runc_container_with_the_same_devices() {
    if !actk_testsupport::engines::require_root() {
        return;
    }
    let Some(f) = prepare("nvidia-dgx-h100") else { return };
    // The node's CDI spec, written by actk's generator into a private spec directory.
    let profiles = actk_core::profile::builtin();
    let inv = actk_core::discover::discover(&f.root, &profiles);
    let specs = actk_core::cdi::generate::generate_all(&profiles, &inv, None, &Default::default()).unwrap();
    let spec_dir = tempfile::tempdir().unwrap();
    for spec in &specs {
        actk_core::cdi::write::write_spec_in_dir(spec, spec_dir.path(), actk_core::cdi::Format::Json).unwrap();
    }

    let dir = tempfile::tempdir().unwrap();
    let mut kubelet = Emulator::new(dir.path());
    kubelet.start();
    let _plugin =
        PluginProcess::start(&f.root, dir.path(), &["--device-ids", "index", "--strategies", "cdi-cri,device-specs"]);
    let reg = kubelet.next_register(Duration::from_secs(10)).await;
    let resp = kubelet.dial(&reg).await.allocate(one(&["2", "5"])).await.unwrap().into_inner();
    let c = &resp.container_responses[0];

    // 1. What a CDI-enabled runtime does with cdi_devices: resolve the names, apply the edits.
    let names: Vec<actk_core::cdi::QualifiedName> =
        c.cdi_devices.iter().map(|d| actk_core::cdi::QualifiedName::parse(&d.name).unwrap()).collect();
    let edits = actk_core::cdi::Registry::load(&[spec_dir.path()]).resolve(&names).unwrap();
    let cdi_bundle = actk_testsupport::engines::Bundle::busybox(&["sh", "-c", LIST_NODES], &[]).unwrap();
    cdi_bundle.edit(|cfg| actk_core::edits::apply(cfg, &edits).unwrap()).unwrap();
    let via_cdi = run_bundle(&cdi_bundle, "dp-cdi");

    // 2. What the kubelet does with device specs and mounts: OCI devices (numbers from the
    //    host node), cgroup allow rules, read-only bind mounts.
    let spec_bundle = kubelet_bundle(c, LIST_NODES);
    let via_specs = run_bundle(&spec_bundle, "dp-specs");

    let expect_gpu = |i: usize| {
        let node = &inv.vendors[0].devices[i].nodes[0];
        format!("{} {:x} {:x}", node.path.trim_start_matches("/dev/"), node.major, node.minor)
    };
    for out in [&via_cdi, &via_specs] {
        assert!(out.lines().any(|l| l == expect_gpu(2)), "GPU 2 in the container: {out}");
        assert!(out.lines().any(|l| l == expect_gpu(5)), "GPU 5 in the container: {out}");
        for other in [0, 1, 3, 4, 6, 7] {
            assert!(!out.lines().any(|l| l == expect_gpu(other)), "GPU {other} must not be there: {out}");
        }
        assert!(out.contains("nvidiactl c3 ff"), "control node: {out}");
        assert!(out.lines().any(|l| l == "libcuda"), "driver library mounted: {out}");
    }
    let nodes = |out: &str| {
        out.lines().filter(|l| *l != "libcuda").map(str::to_string).collect::<std::collections::BTreeSet<_>>()
    };
    assert_eq!(nodes(&via_cdi), nodes(&via_specs), "CDI names and device specs give the same device nodes");
}

/// Issue 30, the telemetry grant (`--telemetry-resource`): served next to the GPUs, one device,
/// Healthy; its Allocate gives a container (as the kubelet makes it of the device specs) the
/// nodes NVML opens for all eight GPUs, /dev/nvidiactl and every /dev/nvidiaN, and nothing of
/// CUDA's (/dev/nvidia-uvm) or the driver's files; any other ID is refused. A node without
/// NVIDIA GPUs serves it too (the exporter's DaemonSet asks for it on every node), with an
/// empty answer.
#[tokio::test]
async fn telemetry_grant_gives_the_nodes_nvml_opens_for_every_gpu_and_nothing_else() {
    let Some(f) = prepare("nvidia-dgx-h100") else { return };
    let dir = tempfile::tempdir().unwrap();
    let mut kubelet = Emulator::new(dir.path());
    kubelet.start();
    let _plugin = PluginProcess::start(&f.root, dir.path(), &["--telemetry-resource", "actk.dev/telemetry"]);
    let reg = kubelet.next_register_of("actk.dev/telemetry", Duration::from_secs(10)).await;
    let mut client = kubelet.dial(&reg).await;
    let mut s = client.list_and_watch(Empty {}).await.unwrap().into_inner();
    let list = next_list(&mut s, Duration::from_secs(5)).await;
    assert_eq!(list.devices.len(), 1, "{list:?}");
    assert_eq!(health_of(&list, "telemetry"), "Healthy");
    let bad = client.allocate(one(&["0"])).await.unwrap_err();
    assert!(bad.message().contains("\"0\"") && bad.message().contains("telemetry"), "{}", bad.message());
    let resp = client.allocate(one(&["telemetry"])).await.unwrap().into_inner();
    let c = &resp.container_responses[0];
    assert!(c.mounts.is_empty() && c.envs.is_empty() && c.cdi_devices.is_empty(), "{c:?}");
    if actk_testsupport::engines::require_root() {
        // LIST_NODES then `true`: its last test (libcuda mounted) fails without driver files.
        let out = run_bundle(&kubelet_bundle(c, &format!("{LIST_NODES}; true")), "dp-telemetry");
        assert!(!out.contains("libcuda"), "no driver library: {out}");
        let mut seen: Vec<&str> = out.lines().map(|l| l.split(' ').next().unwrap_or_default()).collect();
        seen.sort();
        let mut want: Vec<String> = (0..8).map(|i| format!("nvidia{i}")).collect();
        want.push("nvidiactl".into());
        want.sort();
        assert_eq!(seen, want, "the container's NVIDIA nodes: {out}");
        assert!(out.contains("nvidiactl c3 ff"), "the control node's numbers: {out}");
    }

    let Some(inf2) = prepare("aws-inf2-48xlarge") else { return };
    let dir = tempfile::tempdir().unwrap();
    let mut kubelet = Emulator::new(dir.path());
    kubelet.start();
    let _plugin = PluginProcess::start(&inf2.root, dir.path(), &["--telemetry-resource", "actk.dev/telemetry"]);
    let reg = kubelet.next_register_of("actk.dev/telemetry", Duration::from_secs(10)).await;
    let resp = kubelet.dial(&reg).await.allocate(one(&["telemetry"])).await.unwrap().into_inner();
    assert!(resp.container_responses[0].devices.is_empty(), "{resp:?}");
}

#[test]
fn a_telemetry_resource_that_is_no_extended_resource_name_stops_the_plugin_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_actk-device-plugin"))
        .args(["--root", "/", "--socket-dir"])
        .arg(dir.path())
        .args(["--telemetry-resource", "telemetry"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("\"telemetry\"") && err.contains("actk.dev/telemetry"), "{err}");
}

/// Waits up to 5 s for `path` to appear.
fn appears(path: &Path) -> bool {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(5) {
        if path.exists() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

#[test]
fn socket_dir_flag_beats_env_which_beats_file() {
    let Some(f) = prepare("gaudi2") else { return };
    let tmp = tempfile::tempdir().unwrap();
    let [file_dir, env_dir, flag_dir] = ["file", "env", "flag"].map(|n| tmp.path().join(n));
    let config = tmp.path().join("dp.toml");
    std::fs::write(&config, format!("socket_dir = {:?}\nstrategies = [\"envvar\"]\n", file_dir.display().to_string()))
        .unwrap();
    std::fs::create_dir_all(tmp.path().join("profiles.d")).unwrap();
    let start = |env: Option<&Path>, flag: Option<&Path>| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_actk-device-plugin"));
        cmd.arg("--config")
            .arg(&config)
            .arg("--root")
            .arg(&f.root)
            .arg("--profiles-dir")
            .arg(tmp.path().join("profiles.d"));
        cmd.env_remove("ACTK_DEVICE_PLUGIN_SOCKET_DIR").env("ACTK_LOG", "warn").stdin(Stdio::null());
        if let Some(e) = env {
            cmd.env("ACTK_DEVICE_PLUGIN_SOCKET_DIR", e);
        }
        if let Some(d) = flag {
            cmd.arg("--socket-dir").arg(d);
        }
        PluginProcess { child: cmd.spawn().unwrap(), _config: tempfile::tempdir().unwrap() }
    };
    let sock = "actk-habana_ai_gaudi.sock";
    {
        let _p = start(Some(&env_dir), Some(&flag_dir));
        assert!(appears(&flag_dir.join(sock)), "the flag wins");
        assert!(!env_dir.join(sock).exists() && !file_dir.join(sock).exists());
    }
    {
        let _p = start(Some(&env_dir), None);
        assert!(appears(&env_dir.join(sock)), "the env variable beats the file");
        assert!(!file_dir.join(sock).exists());
    }
    {
        let _p = start(None, None);
        assert!(appears(&file_dir.join(sock)), "the file's value is used when nothing else is given");
    }
    // A bad value in the file stops the plugin with a message naming the file and the key.
    std::fs::write(&config, "strategies = [\"cdi\"]\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_actk-device-plugin")).arg("--config").arg(&config).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&config.display().to_string()) && err.contains("strategies = \"cdi\""), "{err}");
}

fn preferred_req(available: Vec<String>, size: i32) -> PreferredAllocationRequest {
    PreferredAllocationRequest {
        container_requests: vec![ContainerPreferredAllocationRequest {
            available_device_i_ds: available,
            must_include_device_i_ds: vec![],
            allocation_size: size,
        }],
    }
}

#[tokio::test]
async fn f09_trainium_over_grpc_seven_is_answered_with_a_warning_or_refused_when_strict() {
    let Some(f) = prepare("aws-trn1-32xlarge") else { return };
    let all: Vec<String> = (0..16).map(|d| d.to_string()).collect();
    for strict in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let mut kubelet = Emulator::new(dir.path());
        kubelet.start();
        let mut args = vec!["--device-ids", "index", "--resources", "aws.amazon.com/neuron"];
        if strict {
            args.push("--strict-topology");
        }
        let _plugin = PluginProcess::start(&f.root, dir.path(), &args);
        let reg = kubelet.next_register(Duration::from_secs(10)).await;
        let mut client = kubelet.dial(&reg).await;
        let four = client.get_preferred_allocation(preferred_req(all.clone(), 4)).await.unwrap().into_inner();
        assert_eq!(four.container_responses[0].device_i_ds.len(), 4, "a 4-block is always fine");
        let seven = client.get_preferred_allocation(preferred_req(all.clone(), 7)).await;
        if strict {
            let err = seven.unwrap_err();
            assert_eq!(err.code(), tonic::Code::FailedPrecondition);
            assert!(
                err.message().contains("7 devices cannot be placed well") && err.message().contains("1, 4, 8, 16"),
                "{}",
                err.message()
            );
        } else {
            assert_eq!(seven.unwrap().into_inner().container_responses[0].device_i_ds.len(), 7);
        }
        let bad = client.get_preferred_allocation(preferred_req(vec!["0".into(), "99".into()], 1)).await.unwrap_err();
        assert_eq!(bad.code(), tonic::Code::InvalidArgument);
        assert!(bad.message().contains("99"), "{}", bad.message());
    }
}

#[tokio::test]
async fn devices_that_appear_after_start_are_served_without_a_restart() {
    // A node whose driver is loaded after the plugin started (a driver container): at first
    // the Neuron nodes are missing, then they appear.
    let Some(f) = prepare("aws-inf2-48xlarge") else { return };
    let hidden = f.root.join("dev-hidden");
    std::fs::create_dir(&hidden).unwrap();
    for i in 0..12 {
        std::fs::rename(f.path(&format!("dev/neuron{i}")), hidden.join(format!("neuron{i}"))).unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let mut kubelet = Emulator::new(dir.path());
    kubelet.start();
    let mut plugin = PluginProcess::start(&f.root, dir.path(), &["--resources", "aws.amazon.com/neuron"]);
    kubelet.assert_no_register(Duration::from_secs(2)).await;
    plugin.assert_running();
    for i in 0..12 {
        std::fs::rename(hidden.join(format!("neuron{i}")), f.path(&format!("dev/neuron{i}"))).unwrap();
    }
    let reg = kubelet.next_register(Duration::from_secs(8)).await;
    assert_eq!(reg.resource_name, "aws.amazon.com/neuron");
    let mut s = kubelet.dial(&reg).await.list_and_watch(Empty {}).await.unwrap().into_inner();
    assert_eq!(next_list(&mut s, Duration::from_secs(5)).await.devices.len(), 12);
}

// ---------------------------------------------------------------------------------------------
// MIG, time-slicing, Xid health and NVLink peers, with the NVML test double of the fixtures.

use actk_testsupport::nvml_double::{self, State};

/// Every RegisterRequest within `limit` after the first, keyed by resource name.
async fn registrations(kubelet: &mut Emulator, first: Duration) -> std::collections::BTreeMap<String, RegisterRequest> {
    let mut out = std::collections::BTreeMap::new();
    let r = kubelet.next_register(first).await;
    out.insert(r.resource_name.clone(), r);
    while let Ok(Some(r)) = tokio::time::timeout(Duration::from_millis(1500), kubelet.registered.recv()).await {
        out.insert(r.resource_name.clone(), r);
    }
    out
}

/// Asserts that no ListAndWatch update arrives within `quiet`.
async fn no_update(stream: &mut Streaming<ListAndWatchResponse>, quiet: Duration, why: &str) {
    if let Ok(Ok(Some(l))) = tokio::time::timeout(quiet, stream.message()).await {
        panic!("unexpected ListAndWatch update ({why}): {:?}", l.devices);
    }
}

#[tokio::test]
async fn mig_mixed_strategy_serves_nvidias_resource_names_and_allocates_a_mig_device() {
    if !actk_testsupport::engines::require_root() {
        return;
    }
    let Some(f) = prepare("nvidia-dgx-a100") else { return };
    let state = State::of(&f.root).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut kubelet = Emulator::new(dir.path());
    kubelet.start();
    let _plugin = PluginProcess::start(
        &f.root,
        dir.path(),
        &["--mig-strategy", "mixed", "--strategies", "cdi-cri,envvar,device-specs"],
    );
    let regs = registrations(&mut kubelet, Duration::from_secs(10)).await;
    // Expected units per resource, from the double's state: whole GPUs with MIG off, and one
    // resource per MIG profile (`+` as `.`).
    let mut want: std::collections::BTreeMap<String, Vec<String>> = std::collections::BTreeMap::new();
    for g in state.gpus() {
        if g.get("mig") != "enabled" {
            want.entry("nvidia.com/gpu".into()).or_default().push(g.get("uuid").into());
        }
        for m in state.migs(g.num("index")) {
            want.entry(format!("nvidia.com/mig-{}", m.get("profile").replace('+', ".")))
                .or_default()
                .push(m.get("uuid").into());
        }
    }
    assert_eq!(regs.keys().collect::<Vec<_>>(), want.keys().collect::<Vec<_>>());
    assert!(want.contains_key("nvidia.com/mig-1g.10gb.me") && want.contains_key("nvidia.com/mig-1c.3g.40gb"));
    for (name, ids) in &want {
        let mut s = kubelet.dial(&regs[name]).await.list_and_watch(Empty {}).await.unwrap().into_inner();
        let list = next_list(&mut s, Duration::from_secs(5)).await;
        let got: Vec<String> = list.devices.iter().map(|d| d.id.clone()).collect();
        assert_eq!(&got, ids, "{name}");
    }
    // A 1g.10gb MIG device of GPU 1 (its MIG device 4).
    let m = state.migs(1)[4];
    let mut client = kubelet.dial(&regs["nvidia.com/mig-1g.10gb"]).await;
    let resp = client.allocate(one(&[m.get("uuid")])).await.unwrap().into_inner();
    let c = &resp.container_responses[0];
    assert_eq!(c.cdi_devices.iter().map(|d| d.name.as_str()).collect::<Vec<_>>(), ["nvidia.com/gpu=1:4"]);
    assert_eq!(c.envs["NVIDIA_VISIBLE_DEVICES"], m.get("uuid"));
    let caps = |file: String| {
        let t = std::fs::read_to_string(f.path(&format!("proc/driver/nvidia/capabilities/gpu1/mig/{file}"))).unwrap();
        format!("/dev/nvidia-caps/nvidia-cap{}", t.lines().next().unwrap().split_whitespace().nth(1).unwrap())
    };
    let (gi, ci) = (m.num("gi"), m.num("ci"));
    let mut nodes: Vec<&str> = c.devices.iter().map(|d| d.container_path.as_str()).collect();
    nodes.retain(|p| {
        *p == "/dev/nvidia1"
            || p.starts_with("/dev/nvidia-caps/")
            || p.starts_with("/dev/nvidia0")
            || p.starts_with("/dev/nvidia2")
    });
    assert_eq!(
        nodes,
        ["/dev/nvidia1", caps(format!("gi{gi}/access")).as_str(), caps(format!("gi{gi}/ci{ci}/access")).as_str()]
    );

    // The kubelet's device specs start a runc container that sees the parent and its caps only.
    let bundle = actk_testsupport::engines::Bundle::busybox(
        &["sh", "-c", "for f in /dev/nvidia* /dev/nvidia-caps/*; do [ -c \"$f\" ] && echo $f; done; true"],
        &[],
    )
    .unwrap();
    bundle
        .edit(|cfg| {
            use std::os::unix::fs::MetadataExt;
            for d in &c.devices {
                let rdev = std::fs::metadata(&d.host_path).unwrap().rdev();
                let (major, minor) = ((rdev >> 8) & 0xfff, (rdev & 0xff) | ((rdev >> 12) & 0xfff00));
                if cfg["linux"]["devices"].is_null() {
                    cfg["linux"]["devices"] = serde_json::json!([]);
                }
                cfg["linux"]["devices"].as_array_mut().unwrap().push(serde_json::json!({"path": d.container_path, "type": "c", "major": major, "minor": minor, "fileMode": 0o666}));
                cfg["linux"]["resources"]["devices"].as_array_mut().unwrap().push(serde_json::json!({"allow": true, "type": "c", "major": major, "minor": minor, "access": d.permissions}));
            }
        })
        .unwrap();
    let out = run_bundle(&bundle, "dp-mig");
    let seen: std::collections::BTreeSet<&str> =
        out.lines().filter(|l| !l.contains("nvidia-uvm") && !l.ends_with("ctl") && !l.ends_with("modeset")).collect();
    let want: std::collections::BTreeSet<String> =
        ["/dev/nvidia1".to_string(), caps(format!("gi{gi}/access")), caps(format!("gi{gi}/ci{ci}/access"))].into();
    assert_eq!(seen, want.iter().map(String::as_str).collect(), "{out}");
}

#[tokio::test]
async fn mig_single_strategy_refuses_a_mixed_layout_without_exiting() {
    let Some(f) = prepare("nvidia-dgx-a100") else { return };
    let dir = tempfile::tempdir().unwrap();
    let mut kubelet = Emulator::new(dir.path());
    kubelet.start();
    let mut plugin = PluginProcess::start(&f.root, dir.path(), &["--mig-strategy", "single"]);
    // Nothing fits the single strategy here (MIG off on GPUs 4-7, five profiles): nothing is
    // registered, and the plugin keeps running (it looks again every 5 s).
    kubelet.assert_no_register(Duration::from_secs(3)).await;
    plugin.assert_running();
}

#[tokio::test]
async fn f20_time_slicing_4_replicas_on_the_8_gpu_dgx_gives_32_and_two_pods_share_gpu_0() {
    if !actk_testsupport::engines::require_root() {
        return;
    }
    let Some(f) = prepare("nvidia-dgx-h100") else { return };
    let uuids = gpu_uuids(&f.root);
    let dir = tempfile::tempdir().unwrap();
    let mut kubelet = Emulator::new(dir.path());
    kubelet.start();
    let ts = "[[sharing.time_slicing.resources]]\nname = \"nvidia.com/gpu\"\nreplicas = 4\n";
    let _plugin = PluginProcess::start_with_config(&f.root, dir.path(), ts, &["--strategies", "cdi-cri,device-specs"]);
    let reg = kubelet.next_register(Duration::from_secs(10)).await;
    assert_eq!(reg.resource_name, "nvidia.com/gpu", "not renamed unless asked");
    let mut client = kubelet.dial(&reg).await;
    let mut stream = client.list_and_watch(Empty {}).await.unwrap().into_inner();
    let list = next_list(&mut stream, Duration::from_secs(5)).await;
    assert_eq!(list.devices.len(), 32, "allocatable nvidia.com/gpu = 8 GPUs x 4 replicas");
    let ids: Vec<String> = list.devices.iter().map(|d| d.id.clone()).collect();
    assert_eq!(ids[..4], [0, 1, 2, 3].map(|r| format!("{}::{r}", uuids[0])));
    // Spread before stacking: two replicas from a free node come from two GPUs.
    let pref = client.get_preferred_allocation(preferred_req(ids.clone(), 2)).await.unwrap().into_inner();
    let picked = &pref.container_responses[0].device_i_ds;
    let gpu_of = |id: &str| id.split("::").next().unwrap().to_string();
    assert_ne!(gpu_of(&picked[0]), gpu_of(&picked[1]), "{picked:?}");
    // With GPU 0's replica 0 taken, a single replica goes to an idle GPU, not to GPU 0 again.
    let rest: Vec<String> = ids.iter().filter(|i| **i != ids[0]).cloned().collect();
    let pref = client.get_preferred_allocation(preferred_req(rest, 1)).await.unwrap().into_inner();
    assert_ne!(gpu_of(&pref.container_responses[0].device_i_ds[0]), uuids[0]);
    // Two pods, each given one replica of GPU 0, both get GPU 0.
    let mut answers = Vec::new();
    for r in 0..2 {
        let resp = client.allocate(one(&[&format!("{}::{r}", uuids[0])])).await.unwrap().into_inner();
        let c = resp.container_responses[0].clone();
        assert_eq!(c.cdi_devices.iter().map(|d| d.name.as_str()).collect::<Vec<_>>(), ["nvidia.com/gpu=0"]);
        answers.push(c);
    }
    // Two replicas of GPU 0 for one container while other GPUs have free replicas: refused, the
    // container would see one GPU for two (issue 28 item 9).
    let stacked = [format!("{}::1", uuids[0]), format!("{}::3", uuids[0])];
    let err = client.allocate(one(&[&stacked[0], &stacked[1]])).await.unwrap_err();
    assert!(
        err.message().contains("request for 2 nvidia.com/gpu names 1 device(s) (0)")
            && err.message().contains("were free"),
        "{}",
        err.message()
    );
    // With every replica of GPUs 1-7 held by pods (the kubelet's PodResources), stacking is all
    // the node can give: two replicas of one GPU in one container are that GPU once.
    let others: Vec<String> = ids.iter().filter(|i| !i.starts_with(&uuids[0])).cloned().collect();
    let others: Vec<&str> = others.iter().map(String::as_str).collect();
    kubelet.pods.set(&[("nvidia.com/gpu", &others)]);
    let resp = loop {
        match client.allocate(one(&[&stacked[0], &stacked[1]])).await {
            Ok(r) => break r.into_inner(),
            Err(e) if e.message().contains("were free") => tokio::time::sleep(Duration::from_millis(200)).await,
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!(resp.container_responses[0].cdi_devices.len(), 1);
    // Both pods' containers run at the same time with /dev/nvidia0 (real runc, from the device specs).
    let script = "for f in /dev/nvidia*; do [ -c \"$f\" ] && echo $f; done; sleep 1";
    let handles: Vec<_> = answers
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            std::thread::spawn(move || {
                let b = actk_testsupport::engines::Bundle::busybox(&["sh", "-c", script], &[]).unwrap();
                b.edit(|cfg| {
                    use std::os::unix::fs::MetadataExt;
                    cfg["linux"]["devices"] = serde_json::json!([]);
                    for d in &c.devices {
                        let rdev = std::fs::metadata(&d.host_path).unwrap().rdev();
                        let (major, minor) = ((rdev >> 8) & 0xfff, (rdev & 0xff) | ((rdev >> 12) & 0xfff00));
                        cfg["linux"]["devices"].as_array_mut().unwrap().push(serde_json::json!({"path": d.container_path, "type": "c", "major": major, "minor": minor, "fileMode": 0o666}));
                        cfg["linux"]["resources"]["devices"].as_array_mut().unwrap().push(serde_json::json!({"allow": true, "type": "c", "major": major, "minor": minor, "access": d.permissions}));
                    }
                })
                .unwrap();
                let t = Instant::now();
                let out = run_bundle(&b, &format!("f20-pod{i}"));
                (out, t, Instant::now())
            })
        })
        .collect();
    let results: Vec<(String, Instant, Instant)> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    for (out, _, _) in &results {
        let gpus: Vec<&str> =
            out.lines().filter(|l| l.trim_start_matches("/dev/nvidia").parse::<u32>().is_ok()).collect();
        assert_eq!(gpus, ["/dev/nvidia0"], "{out}");
    }
    // They overlapped in time: each started before the other ended.
    assert!(results[0].1 < results[1].2 && results[1].1 < results[0].2, "the two pods ran at the same time");
}

#[tokio::test]
async fn time_sliced_resources_rename_and_refuse_more_than_one_replica() {
    let Some(f) = prepare("amd-mi300x") else { return };
    let dir = tempfile::tempdir().unwrap();
    let mut kubelet = Emulator::new(dir.path());
    kubelet.start();
    let ts = "[sharing.time_slicing]\nrename_by_default = true\nfail_requests_greater_than_one = true\n[[sharing.time_slicing.resources]]\nname = \"amd.com/gpu\"\nreplicas = 2\n";
    let _plugin = PluginProcess::start_with_config(&f.root, dir.path(), ts, &["--device-ids", "index"]);
    let reg = kubelet.next_register(Duration::from_secs(10)).await;
    assert_eq!(reg.resource_name, "amd.com/gpu.shared");
    let mut client = kubelet.dial(&reg).await;
    let mut s = client.list_and_watch(Empty {}).await.unwrap().into_inner();
    assert_eq!(next_list(&mut s, Duration::from_secs(5)).await.devices.len(), 16, "every vendor: 8 MI300X x 2");
    let ok = client.allocate(one(&["3::1"])).await.unwrap().into_inner();
    assert_eq!(ok.container_responses[0].cdi_devices[0].name, "amd.com/gpu=3");
    let err = client.allocate(one(&["3::0", "4::0"])).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("request for 2 amd.com/gpu.shared is too large"), "{}", err.message());
}

#[test]
fn bad_replicas_stop_the_plugin_naming_the_value_and_the_range() {
    let Some(f) = prepare("nvidia-dgx-h100") else { return };
    for replicas in ["0", "1000000"] {
        let tmp = tempfile::tempdir().unwrap();
        let cfg = tmp.path().join("dp.toml");
        std::fs::write(
            &cfg,
            format!("[[sharing.time_slicing.resources]]\nname = \"nvidia.com/gpu\"\nreplicas = {replicas}\n"),
        )
        .unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_actk-device-plugin"))
            .arg("--config")
            .arg(&cfg)
            .arg("--root")
            .arg(&f.root)
            .arg("--socket-dir")
            .arg(tmp.path())
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!("sharing.time_slicing.resources[0].replicas = \"{replicas}\": 1 to 1024 replicas"))
                && err.contains(&cfg.display().to_string()),
            "{err}"
        );
    }
}

#[tokio::test]
async fn an_xid_raised_in_the_double_turns_the_gpu_unhealthy_within_2s_and_it_recovers() {
    let Some(f) = prepare("nvidia-dgx-h100") else { return };
    let state = State::of(&f.root).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut kubelet = Emulator::new(dir.path());
    kubelet.start();
    let _plugin = PluginProcess::start_with_config(
        &f.root,
        dir.path(),
        "[health]\nxid_recovery_ms = 1500\n",
        &["--device-ids", "index"],
    );
    let reg = kubelet.next_register(Duration::from_secs(10)).await;
    let mut stream = kubelet.dial(&reg).await.list_and_watch(Empty {}).await.unwrap().into_inner();
    assert!(next_list(&mut stream, Duration::from_secs(5)).await.devices.iter().all(|d| d.health == "Healthy"));
    // Give the Xid watch time to register its event set (events before it are not delivered).
    tokio::time::sleep(Duration::from_millis(500)).await;

    // An application Xid (13, graphics engine exception) is ignored, as NVIDIA's plugin does.
    nvml_double::raise_xid(&f.root, &state.gpu_uuid(1), 13).unwrap();
    no_update(&mut stream, Duration::from_millis(1500), "Xid 13 is an application error").await;

    // Xid 79 (fallen off the bus) on GPU 3.
    nvml_double::raise_xid(&f.root, &state.gpu_uuid(3), 79).unwrap();
    let t = Instant::now();
    let update = next_list(&mut stream, Duration::from_secs(2)).await;
    assert_eq!(health_of(&update, "3"), "Unhealthy", "after {:?}", t.elapsed());
    assert!(t.elapsed() < Duration::from_secs(2));
    assert_eq!(update.devices.iter().filter(|d| d.health == "Unhealthy").count(), 1);
    // Healthy again after 1.5 s without a new critical Xid, the GPU answering NVML.
    let back = next_list(&mut stream, Duration::from_secs(4)).await;
    assert_eq!(health_of(&back, "3"), "Healthy");
    assert!(t.elapsed() >= Duration::from_millis(1400), "recovered after {:?}", t.elapsed());

    // A GPU NVML cannot reach is Unhealthy while that lasts, and back as soon as it answers.
    nvml_double::lose_gpu(&f.root, &state.gpu_uuid(5)).unwrap();
    let update = next_list(&mut stream, Duration::from_secs(2)).await;
    assert_eq!(health_of(&update, "5"), "Unhealthy");
    nvml_double::recover_gpu(&f.root, &state.gpu_uuid(5)).unwrap();
    let back = next_list(&mut stream, Duration::from_secs(2)).await;
    assert_eq!(health_of(&back, "5"), "Healthy");
}

/// The real path of host path `path` in fixture `f` (links resolved inside the root, so a
/// write never leaves it).
fn real(f: &Fixture, path: &str) -> PathBuf {
    let host = actk_core::discover::HostRoot::new(&f.root);
    host.host_path(host.resolve(path).unwrap())
}

/// ListAndWatch health comes from actk-node's engine for every vendor: an AMD GPU whose RAS
/// `ue` count rises is Unhealthy within 2 s and healthy again after the quiet time
/// (`health.xid_recovery_ms`); a Neuron device's uncorrectable HBM ECC count and a Gaudi's hard
/// reset count do the same.
#[tokio::test]
async fn vendor_error_counters_turn_devices_unhealthy_in_list_and_watch() {
    // The resource is named: the inf2 node also serves neuroncore (whose id "4" is a core of
    // another device) and neurondevice, and registers the three in no fixed order.
    for (fixture, resource, path, id, text) in [
        ("amd-mi300x", "amd.com/gpu", "/sys/class/drm/card2/device/ras/umc_err_count", "1", "ue: 1\nce: 0\nde: 0\n"),
        (
            "aws-inf2-48xlarge",
            "aws.amazon.com/neuron",
            "/sys/class/neuron_device/neuron4/stats/hardware/mem_ecc_uncorrected",
            "4",
            "3\n",
        ),
        ("gaudi2", "habana.ai/gaudi", "/sys/class/accel/accel7/device/hard_reset_cnt", "7", "1\n"),
    ] {
        let Some(f) = prepare(fixture) else { return };
        let dir = tempfile::tempdir().unwrap();
        let mut kubelet = Emulator::new(dir.path());
        kubelet.start();
        let _plugin = PluginProcess::start_with_config(
            &f.root,
            dir.path(),
            "[health]\nxid_recovery_ms = 1500\n",
            &["--device-ids", "index"],
        );
        let reg = kubelet.next_register_of(resource, Duration::from_secs(10)).await;
        let mut stream = kubelet.dial(&reg).await.list_and_watch(Empty {}).await.unwrap().into_inner();
        let first = next_list(&mut stream, Duration::from_secs(5)).await;
        assert!(first.devices.iter().all(|d| d.health == "Healthy"), "{fixture}: {first:?}");
        std::fs::write(real(&f, path), text).unwrap();
        let t = Instant::now();
        // The change must show within 2 s, not necessarily in the very next list (a list sent
        // before the counter was read may come first).
        let mut update = next_list(&mut stream, Duration::from_secs(2)).await;
        while health_of(&update, id) != "Unhealthy" && t.elapsed() < Duration::from_secs(2) {
            update = next_list(&mut stream, Duration::from_secs(2) - t.elapsed().min(Duration::from_secs(2))).await;
        }
        assert_eq!(health_of(&update, id), "Unhealthy", "{fixture}: after {:?}", t.elapsed());
        assert_eq!(update.devices.iter().filter(|d| d.health == "Unhealthy").count(), 1, "{fixture}");
        let back = next_list(&mut stream, Duration::from_secs(4)).await;
        assert_eq!(health_of(&back, id), "Healthy", "{fixture}: healthy after the quiet time");
        assert!(t.elapsed() >= Duration::from_millis(1400), "{fixture}: recovered after {:?}", t.elapsed());
    }
}

#[tokio::test]
async fn an_xid_on_a_mig_device_marks_only_that_mig_device() {
    let Some(f) = prepare("nvidia-dgx-a100") else { return };
    let state = State::of(&f.root).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut kubelet = Emulator::new(dir.path());
    kubelet.start();
    let _plugin = PluginProcess::start(
        &f.root,
        dir.path(),
        &["--mig-strategy", "mixed", "--resources", "nvidia.com/mig-1g.10gb"],
    );
    let reg = kubelet.next_register(Duration::from_secs(10)).await;
    let mut stream = kubelet.dial(&reg).await.list_and_watch(Empty {}).await.unwrap().into_inner();
    let first = next_list(&mut stream, Duration::from_secs(5)).await;
    assert_eq!(first.devices.len(), 9);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let hit = state.migs(1)[2].get("uuid").to_string();
    nvml_double::raise_xid(&f.root, &hit, 48).unwrap();
    let update = next_list(&mut stream, Duration::from_secs(2)).await;
    let bad: Vec<&str> = update.devices.iter().filter(|d| d.health == "Unhealthy").map(|d| d.id.as_str()).collect();
    assert_eq!(bad, [hit.as_str()], "only the MIG device the Xid names");
}

#[tokio::test]
async fn nvlink_peers_from_nvml_decide_the_preferred_pair() {
    // H200 NVL: GPUs 0-1, 2-3, ... on 2-way bridges, 0-3 on NUMA node 0. With GPU 0 taken, a
    // pair from {1,2,3} is the bridged 2,3, not the lowest 1,2.
    let Some(f) = prepare("nvidia-h200-nvl") else { return };
    let dir = tempfile::tempdir().unwrap();
    let mut kubelet = Emulator::new(dir.path());
    kubelet.start();
    let plugin = PluginProcess::start(&f.root, dir.path(), &["--device-ids", "index"]);
    let reg = kubelet.next_register(Duration::from_secs(10)).await;
    let mut client = kubelet.dial(&reg).await;
    let avail: Vec<String> = ["1", "2", "3"].map(String::from).to_vec();
    let r = client.get_preferred_allocation(preferred_req(avail, 2)).await.unwrap().into_inner();
    assert_eq!(r.container_responses[0].device_i_ds, ["2", "3"]);
    drop(plugin);

    // DGX H100: every GPU reaches every other over the NVSwitches, except that GPU 2's NVLinks
    // are down (state edited before the plugin starts): from {1,2,3} the pair is 1,3.
    let Some(f) = prepare("nvidia-dgx-h100") else { return };
    let p = nvml_double::state_dir(&f.root).join("state.tsv");
    let text = std::fs::read_to_string(&p).unwrap();
    let edited: String = text
        .lines()
        .map(|l| if l.starts_with("nvlink\tgpu=2\t") { l.replace("state=active", "state=inactive") } else { l.to_string() } + "\n")
        .collect();
    assert_ne!(edited, text);
    std::fs::write(&p, edited).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut kubelet = Emulator::new(dir.path());
    kubelet.start();
    let _plugin = PluginProcess::start(&f.root, dir.path(), &["--device-ids", "index"]);
    let reg = kubelet.next_register(Duration::from_secs(10)).await;
    let mut client = kubelet.dial(&reg).await;
    let avail: Vec<String> = ["1", "2", "3"].map(String::from).to_vec();
    let r = client.get_preferred_allocation(preferred_req(avail, 2)).await.unwrap().into_inner();
    assert_eq!(r.container_responses[0].device_i_ds, ["1", "3"]);
}

#[tokio::test]
async fn amd_cpx_partitions_are_served_per_partition_mode_and_kept_on_one_gpu() {
    let Some(f) = prepare("amd-mi300x-cpx") else { return };
    let dir = tempfile::tempdir().unwrap();
    let mut kubelet = Emulator::new(dir.path());
    kubelet.start();
    let _plugin = PluginProcess::start(
        &f.root,
        dir.path(),
        &["--resource-naming-strategy", "mixed", "--device-ids", "index", "--strategies", "cdi-cri,device-specs"],
    );
    let reg = kubelet.next_register(Duration::from_secs(10)).await;
    assert_eq!(reg.resource_name, "amd.com/cpx_nps4", "ROCm's mixed name for CPX/NPS4 partitions");
    kubelet.assert_no_register(Duration::from_secs(1)).await;
    let mut client = kubelet.dial(&reg).await;
    let mut s = client.list_and_watch(Empty {}).await.unwrap().into_inner();
    let list = next_list(&mut s, Duration::from_secs(5)).await;
    assert_eq!(list.devices.len(), 64, "8 MI300X x 8 partitions");
    // GPU 0's partitions 0-5 taken: 4 partitions come from one other GPU, not 2 + 2.
    let avail: Vec<String> = (6..64).map(|i| i.to_string()).collect();
    let r = client.get_preferred_allocation(preferred_req(avail, 4)).await.unwrap().into_inner();
    let ids: Vec<u32> = r.container_responses[0].device_i_ds.iter().map(|i| i.parse().unwrap()).collect();
    let gpus: std::collections::BTreeSet<u32> = ids.iter().map(|i| i / 8).collect();
    assert_eq!(gpus.len(), 1, "{ids:?} span GPUs {gpus:?}");
    // Allocate of one partition: its render node and /dev/kfd.
    let resp = client.allocate(one(&["9"])).await.unwrap().into_inner();
    let c = &resp.container_responses[0];
    assert_eq!(c.cdi_devices[0].name, "amd.com/gpu=9");
    let paths: Vec<&str> = c.devices.iter().map(|d| d.container_path.as_str()).collect();
    assert_eq!(paths, ["/dev/kfd", "/dev/dri/renderD137"]);
}

#[tokio::test]
async fn neuron_logical_cores_follow_the_plugins_lnc() {
    // NEURON_LOGICAL_NC_CONFIG=2 for the plugin: inf2's 2 physical cores per device are 1
    // logical core, so 12 neuroncores, and the container is told the same LNC.
    let Some(f) = prepare("aws-inf2-48xlarge") else { return };
    let dir = tempfile::tempdir().unwrap();
    let mut kubelet = Emulator::new(dir.path());
    kubelet.start();
    let config = tempfile::tempdir().unwrap();
    std::fs::write(config.path().join("dp.toml"), "health_interval_ms = 100\n").unwrap();
    // The node's CDI specs, which the default cdi-cri strategy names devices from (F18).
    let spec_dir = config.path().join("cdi");
    write_specs(&f.root, &spec_dir, actk_core::cdi::DeviceNameStrategy::Both);
    let child = Command::new(env!("CARGO_BIN_EXE_actk-device-plugin"))
        .arg("--config")
        .arg(config.path().join("dp.toml"))
        .arg("--root")
        .arg(&f.root)
        .arg("--socket-dir")
        .arg(dir.path())
        .arg("--spec-dirs")
        .arg(&spec_dir)
        .args(["--resources", "aws.amazon.com/neuroncore"])
        .arg("--pod-resources-socket")
        .arg(pod_resources_socket(dir.path()))
        .env("NEURON_LOGICAL_NC_CONFIG", "2")
        .env("ACTK_PROFILES_DIR", config.path().join("none"))
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let _plugin = PluginProcess { child, _config: config };
    let reg = kubelet.next_register(Duration::from_secs(10)).await;
    let mut client = kubelet.dial(&reg).await;
    let mut s = client.list_and_watch(Empty {}).await.unwrap().into_inner();
    assert_eq!(next_list(&mut s, Duration::from_secs(5)).await.devices.len(), 12, "12 devices x 2 cores / LNC 2");
    let c = client.allocate(one(&["4", "5"])).await.unwrap().into_inner().container_responses.remove(0);
    assert_eq!(c.envs["NEURON_RT_VISIBLE_CORES"], "4,5");
    assert_eq!(c.envs["NEURON_LOGICAL_NC_CONFIG"], "2");
    assert_eq!(
        c.cdi_devices.iter().map(|d| d.name.as_str()).collect::<Vec<_>>(),
        ["aws.amazon.com/neuron=4", "aws.amazon.com/neuron=5"]
    );
}

#[tokio::test]
async fn mps_shares_gpus_through_the_nodes_mps_daemon() {
    let Some(f) = prepare("nvidia-dgx-h100") else { return };
    let uuids = gpu_uuids(&f.root);
    let mps = tempfile::tempdir().unwrap();
    let (pipe, shm) = (mps.path().join("pipe"), mps.path().join("shm"));
    std::fs::create_dir_all(&pipe).unwrap();
    std::fs::create_dir_all(&shm).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut kubelet = Emulator::new(dir.path());
    kubelet.start();
    let cfg = format!(
        "[sharing.mps]\npipe_directory = {:?}\nshm_directory = {:?}\n[[sharing.mps.resources]]\nname = \"nvidia.com/gpu\"\nreplicas = 2\n",
        pipe.display().to_string(),
        shm.display().to_string()
    );
    let _plugin = PluginProcess::start_with_config(&f.root, dir.path(), &cfg, &["--strategies", "cdi-cri"]);
    let reg = kubelet.next_register(Duration::from_secs(10)).await;
    let mut client = kubelet.dial(&reg).await;
    let mut stream = client.list_and_watch(Empty {}).await.unwrap().into_inner();
    let list = next_list(&mut stream, Duration::from_secs(5)).await;
    assert_eq!(list.devices.len(), 16, "8 GPUs x 2 MPS replicas");
    assert!(list.devices.iter().all(|d| d.health == "Unhealthy"), "no MPS control daemon yet");
    // The daemon starts: its control FIFO appears in the pipe directory.
    let st = Command::new("mkfifo").arg(pipe.join("control")).status().unwrap();
    assert!(st.success());
    let up = next_list(&mut stream, Duration::from_secs(2)).await;
    assert!(up.devices.iter().all(|d| d.health == "Healthy"));
    let c =
        client.allocate(one(&[&format!("{}::1", uuids[2])])).await.unwrap().into_inner().container_responses.remove(0);
    assert_eq!(c.cdi_devices[0].name, "nvidia.com/gpu=2");
    assert_eq!(c.envs["CUDA_MPS_PIPE_DIRECTORY"], "/tmp/nvidia-mps");
    assert_eq!(c.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], "50");
    // Half of the H100's 81559 MiB, as NVML reports it.
    assert_eq!(c.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], format!("{}=40779M", uuids[2]));
    let mounts: Vec<(&str, &str, bool)> =
        c.mounts.iter().map(|m| (m.container_path.as_str(), m.host_path.as_str(), m.read_only)).collect();
    assert!(mounts.contains(&("/tmp/nvidia-mps", pipe.to_str().unwrap(), false)), "{mounts:?}");
    assert!(mounts.contains(&("/dev/shm", shm.to_str().unwrap(), false)), "{mounts:?}");
    // One replica per container, as NVIDIA's MPS sharing requires.
    let err = client.allocate(one(&[&format!("{}::0", uuids[2]), &format!("{}::0", uuids[3])])).await.unwrap_err();
    assert!(err.message().contains("too large"), "{}", err.message());
}

/// ListAndWatch updates of `stream` until one satisfies `ok`, within `limit`.
async fn until(
    stream: &mut Streaming<ListAndWatchResponse>,
    limit: Duration,
    what: &str,
    ok: impl Fn(&ListAndWatchResponse) -> bool,
) -> ListAndWatchResponse {
    let deadline = Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, stream.message()).await {
            Ok(Ok(Some(l))) if ok(&l) => return l,
            Ok(Ok(Some(_))) => {}
            other => panic!("{what}: not within {limit:?} ({other:?})"),
        }
    }
}

fn unhealthy(list: &ListAndWatchResponse) -> Vec<String> {
    list.devices.iter().filter(|d| d.health != "Healthy").map(|d| d.id.clone()).collect()
}

/// Issue 28 item 1, on the inf2.48xlarge fixture: `aws.amazon.com/neuron`,
/// `aws.amazon.com/neurondevice` and `aws.amazon.com/neuroncore` cover the same 12 devices. A
/// unit handed out through one is withdrawn (Unhealthy) from the others while a pod holds it,
/// an Allocate that still names it is refused naming the holder, the preferred allocation avoids
/// it, and it comes back when the kubelet's PodResources no longer list it; a restarted plugin
/// learns what is held from PodResources before it lists anything.
#[tokio::test]
async fn neuron_devices_and_their_cores_are_never_handed_out_twice() {
    const DEV: &str = "aws.amazon.com/neuron";
    const CORE: &str = "aws.amazon.com/neuroncore";
    const ALIAS: &str = "aws.amazon.com/neurondevice";
    let Some(f) = prepare("aws-inf2-48xlarge") else { return };
    let dir = tempfile::tempdir().unwrap();
    let mut kubelet = Emulator::new(dir.path());
    kubelet.start();
    let plugin = PluginProcess::start(&f.root, dir.path(), &["--strategies", "envvar"]);
    let regs = registrations(&mut kubelet, Duration::from_secs(10)).await;
    assert_eq!(regs.keys().collect::<Vec<_>>(), [DEV, CORE, ALIAS]);
    let mut clients = std::collections::BTreeMap::new();
    let mut streams = std::collections::BTreeMap::new();
    let mut ids = std::collections::BTreeMap::new();
    for name in [DEV, CORE, ALIAS] {
        let mut c = kubelet.dial(&regs[name]).await;
        let mut s = c.list_and_watch(Empty {}).await.unwrap().into_inner();
        let l = next_list(&mut s, Duration::from_secs(5)).await;
        assert!(unhealthy(&l).is_empty(), "{name}: {l:?}");
        ids.insert(name, l.devices.iter().map(|d| d.id.clone()).collect::<Vec<_>>());
        clients.insert(name, c);
        streams.insert(name, s);
    }
    assert_eq!((ids[DEV].len(), ids[CORE].len(), ids[ALIAS].len()), (12, 24, 12));
    assert_eq!(ids[DEV], ids[ALIAS], "two names for the same devices (serial numbers)");
    let (dev0, dev1) = (ids[DEV][0].clone(), ids[DEV][1].clone());

    // A neuroncore pod gets cores 0 and 1: device 0 leaves neuron and neurondevice.
    let c = clients.get_mut(CORE).unwrap().allocate(one(&["0", "1"])).await.unwrap().into_inner();
    assert_eq!(c.container_responses[0].envs["NEURON_RT_VISIBLE_CORES"], "0,1");
    for name in [DEV, ALIAS] {
        let l = until(streams.get_mut(name).unwrap(), Duration::from_secs(2), name, |l| !unhealthy(l).is_empty()).await;
        assert_eq!(unhealthy(&l), std::slice::from_ref(&dev0), "{name}");
    }
    // The kubelet had not seen that yet and offers device 0: the preference avoids it.
    let pref =
        clients.get_mut(DEV).unwrap().get_preferred_allocation(preferred_req(ids[DEV].clone(), 1)).await.unwrap();
    assert_ne!(pref.into_inner().container_responses[0].device_i_ds, std::slice::from_ref(&dev0));
    // ... and an Allocate that names it anyway is refused, naming what holds it.
    let err = clients.get_mut(DEV).unwrap().allocate(one(&[&dev0])).await.unwrap_err();
    assert!(err.message().contains(&format!("in use through {CORE} (device 0)")), "{}", err.message());
    // A neurondevice pod gets device 1: its cores and its neuron twin leave.
    clients.get_mut(ALIAS).unwrap().allocate(one(&[&dev1])).await.unwrap();
    let l = until(streams.get_mut(CORE).unwrap(), Duration::from_secs(2), CORE, |l| unhealthy(l).len() == 2).await;
    assert_eq!(unhealthy(&l), ["2", "3"]);
    let l = until(streams.get_mut(DEV).unwrap(), Duration::from_secs(2), DEV, |l| unhealthy(l).len() == 2).await;
    assert_eq!(unhealthy(&l), [dev0.clone(), dev1.clone()]);
    // Cores of a free device are still handed out.
    clients.get_mut(CORE).unwrap().allocate(one(&["4"])).await.unwrap();

    // The kubelet lists both pods: they stay held after the Allocate records age out.
    kubelet.pods.set(&[(CORE, &["0", "1"]), (ALIAS, &[&dev1]), (CORE, &["4"])]);
    tokio::time::sleep(actk_device_plugin::held::GRACE + actk_device_plugin::held::RECONCILE).await;
    no_update(streams.get_mut(CORE).unwrap(), Duration::from_millis(100), "still held").await;
    // The neuroncore pod goes: device 0 is handed out again.
    kubelet.pods.set(&[(ALIAS, &[&dev1]), (CORE, &["4"])]);
    let l = until(streams.get_mut(DEV).unwrap(), Duration::from_secs(6), DEV, |l| unhealthy(l).len() == 2).await;
    assert_eq!(unhealthy(&l), [dev1.clone(), ids[DEV][2].clone()], "device 0 back, device 2 withdrawn for core 4");
    clients.get_mut(DEV).unwrap().allocate(one(&[&dev0])).await.unwrap();

    // A restarted plugin knows what pods hold before its first device list.
    drop(streams);
    drop(plugin);
    kubelet.pods.set(&[(ALIAS, &[&dev1])]);
    let _plugin = PluginProcess::start(&f.root, dir.path(), &["--strategies", "envvar"]);
    let regs = registrations(&mut kubelet, Duration::from_secs(10)).await;
    let mut s = kubelet.dial(&regs[CORE]).await.list_and_watch(Empty {}).await.unwrap().into_inner();
    assert_eq!(unhealthy(&next_list(&mut s, Duration::from_secs(5)).await), ["2", "3"]);
}

/// Issue 28 item 10: with the envvar strategy, a container asking for two MIG profiles
/// (`nvidia.com/mig-1g.10gb` and `nvidia.com/mig-2g.20gb`, mixed strategy) gets both MIG
/// devices. Both answers set NVIDIA_VISIBLE_DEVICES and the kubelet keeps one (in no fixed
/// order: both orders are tried); each answer is also in its resource's own variable, and
/// actk-runtime with the real runc gives the container the union.
#[tokio::test]
async fn two_mig_profiles_with_envvar_compose_through_actk_runtime() {
    if !actk_testsupport::engines::require_root() {
        return;
    }
    let Some(f) = prepare("nvidia-dgx-a100") else { return };
    let state = State::of(&f.root).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut kubelet = Emulator::new(dir.path());
    kubelet.start();
    let _plugin = PluginProcess::start(&f.root, dir.path(), &["--mig-strategy", "mixed", "--strategies", "envvar"]);
    let regs = registrations(&mut kubelet, Duration::from_secs(10)).await;
    let small = state.migs(1)[4];
    let big = state.migs(0)[1];
    assert_eq!((small.get("profile"), big.get("profile")), ("1g.10gb", "2g.20gb"));
    let mut answers = Vec::new();
    for (res, m) in [("nvidia.com/mig-1g.10gb", small), ("nvidia.com/mig-2g.20gb", big)] {
        let mut c = kubelet.dial(&regs[res]).await;
        let r = c.allocate(one(&[m.get("uuid")])).await.unwrap().into_inner().container_responses.remove(0);
        assert_eq!(r.envs["NVIDIA_VISIBLE_DEVICES"], m.get("uuid"));
        let own = actk_core::request::per_resource_variable("NVIDIA_VISIBLE_DEVICES", res);
        assert_eq!(r.envs[&own], m.get("uuid"), "{own}");
        answers.push(r.envs);
    }
    let cap = |gpu: u64, file: String| {
        let t =
            std::fs::read_to_string(f.path(&format!("proc/driver/nvidia/capabilities/gpu{gpu}/mig/{file}"))).unwrap();
        format!("/dev/nvidia-caps/nvidia-cap{}", t.lines().next().unwrap().split_whitespace().nth(1).unwrap())
    };
    let mut want: std::collections::BTreeSet<String> = ["/dev/nvidia0".to_string(), "/dev/nvidia1".to_string()].into();
    for (gpu, m) in [(1, small), (0, big)] {
        want.insert(cap(gpu, format!("gi{}/access", m.num("gi"))));
        want.insert(cap(gpu, format!("gi{}/ci{}/access", m.num("gi"), m.num("ci"))));
    }
    let config = actk_testsupport::engines::ActkConfig::new(&f.root).unwrap();
    let cfg = config.write().unwrap();
    for order in [[0, 1], [1, 0]] {
        // The kubelet merges the answers' envs into one map: the later answer's value wins.
        let mut env = std::collections::BTreeMap::new();
        for i in order {
            env.extend(answers[i].clone());
        }
        let env: Vec<String> = env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let env: Vec<&str> = env.iter().map(String::as_str).collect();
        let script = "for f in /dev/nvidia* /dev/nvidia-caps/*; do [ -c \"$f\" ] && echo $f; done; true";
        let bundle = actk_testsupport::engines::Bundle::busybox(&["sh", "-c", script], &env).unwrap();
        let id = actk_testsupport::engines::unique_name("dp-two-migs");
        let o =
            actk_testsupport::engines::actk_runtime(&cfg, &["run", "--bundle", bundle.path().to_str().unwrap(), &id]);
        let out = actk_testsupport::engines::expect_success("actk-runtime run", &o);
        let seen: std::collections::BTreeSet<String> = out
            .lines()
            .map(str::trim)
            .filter(|l| {
                l.starts_with("/dev/nvidia-caps/") || l.trim_start_matches("/dev/nvidia").parse::<u32>().is_ok()
            })
            .map(String::from)
            .collect();
        assert_eq!(seen, want, "order {order:?}, env {env:?}:\n{out}");
    }
}

/// A rolling update with surge (issue 28 item 6): the new pod's plugin registers while the old
/// one still runs. The old one stands down instead of taking the socket back (they would take
/// turns every 100 ms), the old one's exit leaves the new one's socket, and when the new one dies
/// first the old one serves again. The readiness file (the chart's exec probe,
/// `--check-ready`) appears once every resource registered.
#[tokio::test]
async fn a_second_instance_takes_over_and_the_first_stands_down() {
    let Some(f) = prepare("nvidia-dgx-h100") else { return };
    let dir = tempfile::tempdir().unwrap();
    let mut kubelet = Emulator::new(dir.path());
    kubelet.start();
    let ready = |p: &Path| {
        Command::new(env!("CARGO_BIN_EXE_actk-device-plugin")).arg("--check-ready").arg(p).status().unwrap().success()
    };
    let (ready_old, ready_new) =
        (dir.path().join("pod-resources/ready-old"), dir.path().join("pod-resources/ready-new"));
    let args = |file: &Path| vec!["--ready-file".to_string(), file.display().to_string()];
    let a = args(&ready_old);
    let mut old = PluginProcess::start(&f.root, dir.path(), &a.iter().map(String::as_str).collect::<Vec<_>>());
    let reg = kubelet.next_register(Duration::from_secs(10)).await;
    assert_eq!(reg.resource_name, "nvidia.com/gpu");
    let t = Instant::now();
    while !ready(&ready_old) && t.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ready(&ready_old), "ready once nvidia.com/gpu registered");
    let a = args(&ready_new);
    let new = PluginProcess::start(&f.root, dir.path(), &a.iter().map(String::as_str).collect::<Vec<_>>());
    kubelet.next_register(Duration::from_secs(10)).await;
    // No tug of war: the old one does not register again while the new one serves.
    kubelet.assert_no_register(Duration::from_secs(3)).await;
    assert!(ready(&ready_new));
    let sock = dir.path().join(&reg.endpoint);
    // The new pod dies (SIGKILL: its socket file stays, answering nothing): the old one serves again.
    drop(new);
    let again = kubelet.next_register(Duration::from_secs(10)).await;
    assert_eq!(again.resource_name, "nvidia.com/gpu");
    old.assert_running();
    // A third one takes over, and the old one's orderly exit (SIGTERM) leaves its socket.
    let third = PluginProcess::start(&f.root, dir.path(), &[]);
    kubelet.next_register(Duration::from_secs(10)).await;
    let third_socket = std::fs::metadata(&sock).map(|m| std::os::unix::fs::MetadataExt::ino(&m)).unwrap();
    rustix::process::kill_process(rustix::process::Pid::from_child(&old.child), rustix::process::Signal::TERM).unwrap();
    let _ = old.child.wait();
    assert_eq!(
        std::fs::metadata(&sock).map(|m| std::os::unix::fs::MetadataExt::ino(&m)).ok(),
        Some(third_socket),
        "the old plugin's exit must leave the new plugin's socket"
    );
    drop(third);
}

/// Issue 26, found by `benches/k8s-bench.sh dra`: when the DRA driver takes a kind over on this
/// node (its servers file names the profile), the kubelet's ListAndWatch stream of the resource
/// ends within one rediscovery (5 s), which is what makes the kubelet mark its devices
/// unhealthy and drop them from allocatable at once. Before, the stream of the aborted
/// manager stayed open and the node kept advertising `nvidia.com/gpu: 8` for the kubelet's
/// 5-minute grace, so the driver would not publish the GPUs (one kind, one server).
#[tokio::test]
async fn handing_a_kind_to_the_dra_driver_ends_the_kubelets_stream() {
    let Some(f) = prepare("nvidia-dgx-h100") else { return };
    let dir = tempfile::tempdir().unwrap();
    let servers = dir.path().join("servers.json");
    std::fs::write(&servers, r#"{"node": "n1", "dra": []}"#).unwrap();
    let mut kubelet = Emulator::new(dir.path());
    kubelet.start();
    let _plugin = PluginProcess::start(&f.root, dir.path(), &["--dra-servers-file", servers.to_str().unwrap()]);
    let reg = kubelet.next_register(Duration::from_secs(10)).await;
    assert_eq!(reg.resource_name, "nvidia.com/gpu");
    let mut client = kubelet.dial(&reg).await;
    let mut stream = client.list_and_watch(Empty {}).await.unwrap().into_inner();
    let first = next_list(&mut stream, Duration::from_secs(5)).await;
    assert_eq!(first.devices.len(), 8);

    std::fs::write(&servers, r#"{"node": "n1", "dra": ["nvidia"]}"#).unwrap();
    let t = Instant::now();
    let ended =
        tokio::time::timeout(Duration::from_secs(15), async { while let Ok(Some(_)) = stream.message().await {} })
            .await;
    assert!(ended.is_ok(), "the kubelet's ListAndWatch stream still open 15 s after the DRA driver took nvidia over");
    eprintln!("stream ended {:?} after the hand-over", t.elapsed());
}
