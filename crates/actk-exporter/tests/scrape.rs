//! The exporter binary scraped over HTTP, as Prometheus does, on the fixture roots (issue 30):
//! a DGX H100 (NVML double), an MI300X node (amdgpu sysfs) and a Trn1 (Neuron sysfs), with the
//! kubelet's PodResources API played by a server on a temporary socket (no kubelet can run
//! here) answering with a device plugin allocation and a DRA claim. Each test reads the page a
//! scraper gets and checks the series a user would query: the value the device reports, under
//! the labels of the pod holding it.

use actk_holders::podresources::api::pod_resources_lister_server::{PodResourcesLister, PodResourcesListerServer};
use actk_holders::podresources::api::{
    ClaimResource, ContainerDevices, ContainerResources, DynamicResource, ListPodResourcesRequest,
    ListPodResourcesResponse, PodResources,
};
use actk_testsupport::fixture;
use actk_testsupport::nvml_double::State;
use std::io::{Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tonic::{Request, Response, Status};

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

fn plugin_pod(ns: &str, name: &str, container: &str, resource: &str, id: &str) -> PodResources {
    PodResources {
        name: name.into(),
        namespace: ns.into(),
        containers: vec![ContainerResources {
            name: container.into(),
            devices: vec![ContainerDevices { resource_name: resource.into(), device_ids: vec![id.into()] }],
            dynamic_resources: vec![],
        }],
    }
}

fn claim_pod(ns: &str, name: &str, container: &str, claim: &str, device: &str) -> PodResources {
    PodResources {
        name: name.into(),
        namespace: ns.into(),
        containers: vec![ContainerResources {
            name: container.into(),
            devices: vec![],
            dynamic_resources: vec![DynamicResource {
                claim_name: claim.into(),
                claim_namespace: ns.into(),
                claim_resources: vec![ClaimResource {
                    cdi_devices: vec![],
                    driver_name: "actk.dev".into(),
                    pool_name: "node-a".into(),
                    device_name: device.into(),
                }],
            }],
        }],
    }
}

/// The exporter binary, killed on drop.
pub struct Exporter {
    child: Child,
    /// Its address.
    pub addr: String,
}

impl Drop for Exporter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(root: &Path, sock: &str) -> Exporter {
    start_named(root, sock, "node-a")
}

fn start_named(root: &Path, sock: &str, node: &str) -> Exporter {
    // A port the kernel just handed out and released: free unless another process races for it.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr = format!("127.0.0.1:{port}");
    let child = Command::new(env!("CARGO_BIN_EXE_actk-exporter"))
        .args(["--root", &root.display().to_string(), "--listen", &addr, "--pod-resources", sock])
        .args(["--node-name", node])
        .env("ACTK_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(&addr).is_err() {
        assert!(Instant::now() < deadline, "actk-exporter did not listen on {addr} within 20 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    Exporter { child, addr }
}

/// `GET path` over HTTP/1.0 (no chunked answers to decode): (status line, Content-Type, body).
fn get(addr: &str, path: &str) -> (String, String, String) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").expect("an HTTP response");
    let status = head.lines().next().unwrap_or_default().to_string();
    let ctype = head
        .lines()
        .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-type:").map(|v| v.trim().to_string()))
        .unwrap_or_default();
    (status, ctype, body.to_string())
}

/// The value of the one series of `name` whose labels include every `key="value"` of `want`.
fn value(page: &str, name: &str, want: &[(&str, &str)]) -> Option<f64> {
    let found: Vec<f64> = page
        .lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .filter(|l| want.iter().all(|(k, v)| l.contains(&format!("{k}=\"{v}\""))))
        .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
        .collect();
    assert!(found.len() <= 1, "{name} {want:?} matches {} series:\n{page}", found.len());
    found.first().copied()
}

#[test]
fn nvidia_gpus_report_nvml_readings_labelled_with_the_device_plugin_pod_and_the_dra_claim_pod() {
    let Some(fx) = fixture::prepare("nvidia-dgx-h100").unwrap() else { return };
    let nvml = State::of(&fx.root).unwrap();
    let gpus = nvml.gpus();
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("kubelet.sock");
    serve_kubelet(
        &sock,
        ListPodResourcesResponse {
            pod_resources: vec![
                plugin_pod("ml", "train-0", "trainer", "nvidia.com/gpu", gpus[0].get("uuid")),
                claim_pod("ml", "infer-0", "server", "gpu", "nvidia-1"),
            ],
        },
    );
    let ex = start(&fx.root, &sock.display().to_string());
    let (status, ctype, page) = get(&ex.addr, "/metrics");
    assert!(status.contains("200"), "{status}\n{page}");
    assert!(ctype.starts_with("application/openmetrics-text"), "{ctype}");
    assert!(page.ends_with("# EOF\n"), "{page}");

    let holders = [("ml", "train-0", "trainer"), ("ml", "infer-0", "server")];
    for (i, (ns, pod, container)) in holders.iter().enumerate() {
        let g = gpus[i];
        let l = [
            ("node", "node-a"),
            ("kind", "nvidia.com/gpu"),
            ("index", &i.to_string()),
            ("uuid", g.get("uuid")),
            ("namespace", ns),
            ("pod", pod),
            ("container", container),
        ];
        assert_eq!(value(&page, "actk_device_utilization_percent", &l), Some(g.num("util_gpu") as f64), "{page}");
        assert_eq!(
            value(&page, "actk_device_memory_used_bytes", &l),
            Some((g.num("mem_used_mib") << 20) as f64),
            "{page}"
        );
        assert_eq!(value(&page, "actk_device_memory_total_bytes", &l), Some((g.num("memory_mib") << 20) as f64));
        assert_eq!(value(&page, "actk_device_power_watts", &l), Some(g.num("power_mw") as f64 / 1000.0));
        assert_eq!(value(&page, "actk_device_power_limit_watts", &l), Some(700.0));
        let mut t = l.to_vec();
        t.push(("sensor", "gpu"));
        assert_eq!(value(&page, "actk_device_temperature_celsius", &t), Some(g.num("temp_c") as f64));
        assert_eq!(value(&page, "actk_device_healthy", &l), Some(1.0));
    }
    // A free GPU: its readings with empty holder labels, and no pod anywhere on it.
    let free = [("index", "5"), ("pod", "")];
    assert_eq!(value(&page, "actk_device_utilization_percent", &free), Some(0.0), "{page}");
    assert!(!page.lines().any(|l| l.contains("index=\"5\"") && l.contains("pod=\"train-0\"")));
    assert_eq!(
        value(
            &page,
            "actk_device_info",
            &[("index", "0"), ("model", "NVIDIA H100 80GB HBM3"), ("driver_version", "580.95.05")]
        ),
        Some(1.0),
        "{page}"
    );
    assert_eq!(pod_resources_up(&page), Some(1.0));
    // Eight GPUs, one info series each.
    assert_eq!(page.lines().filter(|l| l.starts_with("actk_device_info{")).count(), 8);

    let ue = |page: &str, i: &str| {
        value(
            page,
            "actk_device_errors_total",
            &[("index", i), ("source", "ecc_volatile"), ("severity", "uncorrected")],
        )
    };
    assert_eq!(ue(&page, "3"), Some(0.0), "{page}");
    // Uncorrectable ECC errors on GPU 3: counted, and the health engine marks it unhealthy
    // (once its NVML watch has read the baseline on its first 2 s tick).
    std::thread::sleep(Duration::from_millis(2500));
    actk_testsupport::nvml_double::set_uncorrected_ecc(&fx.root, gpus[3].get("uuid"), 2).unwrap();
    let (_, _, page) = get(&ex.addr, "/metrics");
    assert_eq!(ue(&page, "3"), Some(2.0), "{page}");
    let line = healthy_line_until(&ex.addr, "3", |l| l.ends_with(" 0.0"));
    assert!(line.contains("ECC") || line.contains("ecc"), "{line}");

    // A GPU that falls off the bus: unhealthy, with NVML's reason, on the next scrape.
    std::fs::write(fx.path("nvml-double/lost"), format!("{}\n", gpus[2].get("uuid"))).unwrap();
    let (_, _, page) = get(&ex.addr, "/metrics");
    let line = page.lines().find(|l| l.starts_with("actk_device_healthy{") && l.contains("index=\"2\"")).unwrap();
    assert!(line.ends_with(" 0.0") && line.contains("fell off the bus"), "{line}");
    assert_eq!(value(&page, "actk_device_utilization_percent", &[("index", "2")]), None, "{page}");

    let (status, _, _) = get(&ex.addr, "/other");
    assert!(status.contains("404"), "{status}");
}

/// The `actk_device_healthy` line of device `index`, scraped again until `done` holds (20 s).
fn healthy_line_until(addr: &str, index: &str, done: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, _, page) = get(addr, "/metrics");
        let line = page
            .lines()
            .find(|l| l.starts_with("actk_device_healthy{") && l.contains(&format!("index=\"{index}\"")))
            .unwrap_or_default()
            .to_string();
        if done(&line) || Instant::now() > deadline {
            return line;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// `actk_exporter_pod_resources_up` has no labels: its line is `name value`.
fn pod_resources_up(page: &str) -> Option<f64> {
    page.lines().find_map(|l| l.strip_prefix("actk_exporter_pod_resources_up ")).map(|v| v.parse().unwrap())
}

#[test]
fn amd_gpus_report_amdgpu_sysfs_readings_in_watts_degrees_and_bytes() {
    let Some(fx) = fixture::prepare("amd-mi300x").unwrap() else { return };
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("kubelet.sock");
    serve_kubelet(
        &sock,
        ListPodResourcesResponse { pod_resources: vec![plugin_pod("rocm", "bench", "main", "amd.com/gpu", "0")] },
    );
    let ex = start(&fx.root, &sock.display().to_string());
    let (_, _, page) = get(&ex.addr, "/metrics");
    let l = [("kind", "amd.com/gpu"), ("index", "0"), ("namespace", "rocm"), ("pod", "bench"), ("container", "main")];
    // fixtures/amd-mi300x: gpu_busy_percent 87, mem_info_vram_used 68719476736 of 205822885888,
    // power1_input 512000000 uW of a 750000000 uW cap, junction 61000 / mem 49000 millidegrees.
    assert_eq!(value(&page, "actk_device_utilization_percent", &l), Some(87.0), "{page}");
    assert_eq!(value(&page, "actk_device_memory_used_bytes", &l), Some(68719476736.0));
    assert_eq!(value(&page, "actk_device_memory_total_bytes", &l), Some(205822885888.0));
    assert_eq!(value(&page, "actk_device_power_watts", &l), Some(512.0));
    assert_eq!(value(&page, "actk_device_power_limit_watts", &l), Some(750.0));
    let sensor = |s| [l.as_slice(), &[("sensor", s)]].concat();
    assert_eq!(value(&page, "actk_device_temperature_celsius", &sensor("junction")), Some(61.0));
    assert_eq!(value(&page, "actk_device_temperature_celsius", &sensor("mem")), Some(49.0));
    assert_eq!(value(&page, "actk_device_utilization_percent", &[("index", "3"), ("pod", "")]), Some(0.0));
    assert_eq!(value(&page, "actk_device_power_watts", &[("index", "3")]), Some(140.0));
    // amdgpu RAS counters, per block and severity (fixtures: all 0 on a healthy node).
    let ras = |b| [l.as_slice(), &[("source", b), ("severity", "uncorrected")]].concat();
    assert_eq!(value(&page, "actk_device_errors_total", &ras("umc")), Some(0.0), "{page}");
    assert_eq!(value(&page, "actk_device_errors_total", &ras("xgmi_wafl")), Some(0.0));

    // A GPU whose PCI function disappears (hot-unplug): unhealthy, and no stale readings.
    let bdf = amd_bdf(&fx.root, 3);
    std::fs::remove_file(fx.path("sys/bus/pci/devices").join(&bdf)).unwrap();
    let (_, _, page) = get(&ex.addr, "/metrics");
    let line = page.lines().find(|l| l.starts_with("actk_device_healthy{") && l.contains("index=\"3\"")).unwrap();
    assert!(line.contains("gone from sysfs"), "{line}");
    assert_eq!(value(&page, "actk_device_power_watts", &[("index", "3")]), None, "{page}");
}

/// The PCI address of AMD GPU `index` as discovery finds it under `root`.
fn amd_bdf(root: &Path, index: u32) -> String {
    let inv = actk_core::discover::discover(root, &actk_core::profile::builtin());
    let amd = inv.vendor_by_kind("amd.com/gpu").expect("AMD GPUs in the fixture");
    amd.devices.iter().find(|d| d.index == index).and_then(|d| d.pci_bus_id.clone()).expect("a PCI address")
}

#[test]
fn neuron_devices_report_memory_busy_time_and_utilization_per_pod() {
    let Some(fx) = fixture::prepare("aws-trn1-32xlarge").unwrap() else { return };
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("kubelet.sock");
    serve_kubelet(
        &sock,
        ListPodResourcesResponse {
            pod_resources: vec![plugin_pod("llm", "serve", "neuron", "aws.amazon.com/neuron", "0")],
        },
    );
    let ex = start(&fx.root, &sock.display().to_string());
    let (_, _, first) = get(&ex.addr, "/metrics");
    let l = [("kind", "aws.amazon.com/neuron"), ("index", "0"), ("namespace", "llm"), ("pod", "serve")];
    // Two NeuronCore-v2 per Trainium device, each with 6 GiB in use and 81.234567 s busy.
    assert_eq!(value(&first, "actk_device_memory_used_bytes", &l), Some(2.0 * 6442450944.0), "{first}");
    assert_eq!(value(&first, "actk_device_busy_seconds_total", &l), Some(2.0 * 81.234567), "{first}");
    assert_eq!(value(&first, "actk_device_power_budget_percent", &l), Some(40.75));
    assert_eq!(
        value(&first, "actk_device_errors_total", &[l.as_slice(), &[("source", "mem_ecc")]].concat()),
        Some(0.0)
    );
    // Utilization is the busy time's rate: known from the second scrape on; the fixture's
    // counters stand still, so the cores were idle in between.
    assert_eq!(value(&first, "actk_device_utilization_percent", &l), None);
    std::thread::sleep(Duration::from_millis(200));
    let (_, _, second) = get(&ex.addr, "/metrics");
    assert_eq!(value(&second, "actk_device_utilization_percent", &l), Some(0.0), "{second}");
}

#[test]
fn without_a_kubelet_devices_are_listed_unattributed_and_the_page_says_so() {
    let Some(fx) = fixture::prepare("amd-mi300x").unwrap() else { return };
    let ex = start(&fx.root, "/nonexistent/kubelet.sock");
    let (_, _, page) = get(&ex.addr, "/metrics");
    assert_eq!(pod_resources_up(&page), Some(0.0), "{page}");
    assert_eq!(value(&page, "actk_device_utilization_percent", &[("index", "0"), ("pod", "")]), Some(87.0));
}

/// Percent-encodes `s` for a URL query value.
fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// An instant query against Prometheus's HTTP API: the `data.result` list.
fn query(prom: &str, expr: &str) -> Vec<serde_json::Value> {
    let (status, _, body) = get(prom, &format!("/api/v1/query?query={}", urlencode(expr)));
    assert!(status.contains("200"), "{expr}: {status}\n{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v["data"]["result"].as_array().cloned().unwrap_or_default()
}

/// Debian's Prometheus, killed on drop.
struct Prometheus(Child);
impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The real Prometheus (Debian's package) scrapes three exporters (a DGX H100, an MI300X node, a
/// Trn1) every second; the queries users run and every query of the Grafana dashboard in
/// deploy/grafana return data: utilization of the GPU a device plugin pod holds and of the GPU a
/// DRA claim pod holds, labelled with those pods, and of an AMD and a Neuron device.
#[test]
fn prometheus_scrapes_the_exporters_and_every_dashboard_query_returns_data() {
    let prometheus = Path::new("/usr/bin/prometheus");
    if !prometheus.exists() {
        actk_testsupport::engines::skip_or_fail(
            "Install Debian's prometheus package (scripts/install-deps.sh does).",
            "/usr/bin/prometheus is missing",
        );
        return;
    }
    let Some(h100) = fixture::prepare("nvidia-dgx-h100").unwrap() else { return };
    let Some(mi300x) = fixture::prepare("amd-mi300x").unwrap() else { return };
    let Some(trn1) = fixture::prepare("aws-trn1-32xlarge").unwrap() else { return };
    let gpus = State::of(&h100.root).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("kubelet.sock");
    // One kubelet answer for the three nodes (each exporter keeps what matches its devices).
    serve_kubelet(
        &sock,
        ListPodResourcesResponse {
            pod_resources: vec![
                plugin_pod("ml", "train-0", "trainer", "nvidia.com/gpu", gpus.gpus()[0].get("uuid")),
                claim_pod("ml", "infer-0", "server", "gpu", "nvidia-1"),
                plugin_pod("rocm", "bench", "main", "amd.com/gpu", "0"),
                plugin_pod("llm", "serve", "neuron", "aws.amazon.com/neuron", "0"),
            ],
        },
    );
    let s = sock.display().to_string();
    let exporters =
        [start(&h100.root, &s), start_named(&mi300x.root, &s, "node-b"), start_named(&trn1.root, &s, "node-c")];

    let data = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let prom = format!("127.0.0.1:{port}");
    let targets: Vec<String> = exporters.iter().map(|e| format!("'{}'", e.addr)).collect();
    let config = data.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: actk\n    static_configs:\n      - targets: [{}]\n",
            targets.join(", ")
        ),
    )
    .unwrap();
    let child = Command::new(prometheus)
        .arg(format!("--config.file={}", config.display()))
        .arg(format!("--storage.tsdb.path={}", data.path().join("tsdb").display()))
        .arg(format!("--web.listen-address={prom}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _p = Prometheus(child);
    // Ready when every target was scraped twice (rates need two samples): 8 + 8 + 16 devices.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ready = std::net::TcpStream::connect(&prom).is_ok()
            && query(&prom, "count(count_over_time(actk_device_info[1m]) >= 2)")
                .first()
                .and_then(|r| r["value"][1].as_str().map(|v| v == "32"))
                .unwrap_or(false);
        if ready {
            break;
        }
        assert!(Instant::now() < deadline, "Prometheus did not scrape the three exporters within 60 s");
        std::thread::sleep(Duration::from_millis(500));
    }

    // Utilization per pod, as a user queries it.
    let util = |sel: &str| -> Vec<f64> {
        query(&prom, &format!("actk_device_utilization_percent{{{sel}}}"))
            .iter()
            .map(|r| r["value"][1].as_str().unwrap().parse().unwrap())
            .collect()
    };
    assert_eq!(util(r#"namespace="ml",pod="train-0",container="trainer",index="0""#), [18.0]);
    assert_eq!(util(r#"namespace="ml",pod="infer-0",container="server",index="1""#), [34.0]);
    assert_eq!(util(r#"namespace="rocm",pod="bench",kind="amd.com/gpu",index="0""#), [87.0]);
    assert_eq!(util(r#"namespace="llm",pod="serve",kind="aws.amazon.com/neuron",index="0""#), [0.0]);

    // Every query of the dashboard, with its node variable at All.
    let dash: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/grafana/actk-devices.json"))
            .unwrap(),
    )
    .unwrap();
    let panels = dash["panels"].as_array().unwrap();
    assert!(panels.len() >= 8);
    for p in panels {
        for t in p["targets"].as_array().unwrap() {
            let expr = t["expr"].as_str().unwrap().replace("$node", ".*");
            let got = query(&prom, &expr);
            assert!(!got.is_empty(), "dashboard panel {:?}: {expr} returned no data", p["title"]);
        }
    }
    // The node variable's own query.
    let nodes = query(&prom, "count by (node) (actk_device_info)");
    assert_eq!(nodes.len(), 3, "one node per exporter: {nodes:?}");
}
