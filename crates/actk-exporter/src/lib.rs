//! actk-exporter: one device telemetry exporter for every vendor actk knows, in the Prometheus
//! (OpenMetrics text) format, with each device's series labelled by the pod and container that
//! hold it. A front end over the node layer (DESIGN.md "Crates"): readings from
//! [`actk_node::telemetry`], health from [`actk_node::health`], holders from the kubelet's
//! PodResources API through [`actk_holders`] (device plugin and DRA allocations both), encoded
//! with the Prometheus project's `prometheus-client` and served by
//! [`actk_node::metrics_http`].
//!
//! # Metrics (docs/telemetry.md lists them with their sources)
//! Every device series carries `node`, `kind` (CDI kind), `vendor`, `index`, `uuid`, and
//! `namespace`, `pod`, `container` of its holder (empty when the device is free). A device
//! with several holders (time-slicing replicas, MIG or core partitions) has one series per
//! holder, each with the device's value, as dcgm-exporter does for shared GPUs.
//!
//! | name | type | unit |
//! |---|---|---|
//! | `actk_device_info` | gauge (1) | also `model`, `driver_version` |
//! | `actk_device_healthy` | gauge | 1 healthy, 0 not (`reason` label says why) |
//! | `actk_device_utilization_percent` | gauge | percent |
//! | `actk_device_memory_used_bytes`, `actk_device_memory_total_bytes` | gauge | bytes |
//! | `actk_device_temperature_celsius` | gauge | degrees C, `sensor` label |
//! | `actk_device_power_watts`, `actk_device_power_limit_watts` | gauge | watts |
//! | `actk_device_power_budget_percent` | gauge | percent of the power budget (Neuron) |
//! | `actk_device_busy_seconds_total` | counter | seconds (Neuron core busy time) |
//! | `actk_device_errors_total` | counter | `source` (ECC counter, RAS block), `severity` |
//! | `actk_exporter_pod_resources_up` | gauge | 1 when the kubelet answered `List` |

use actk_core::inventory::Inventory;
use actk_core::profile::Profile;
use actk_holders::{Allocation, DeviceHolders, Holder};
use actk_node::health::{HealthOptions, Monitor, XidPolicy};
use actk_node::telemetry::{Reader, Reading};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

type Labels = Vec<(String, String)>;
type GaugeF = Family<Labels, Gauge<f64, AtomicU64>>;

/// The exporter's state: the host root, the vendor profiles, the last inventory (discovered
/// again every `rediscover`), and the telemetry reader.
#[derive(Debug)]
pub struct Exporter {
    root: PathBuf,
    driver_root: PathBuf,
    profiles: Vec<Profile>,
    node: String,
    rediscover: Duration,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    reader: Reader,
    inventory: Option<(Instant, Inventory)>,
    /// The health engine of each vendor (kind, engine), as the device plugin runs it: presence,
    /// error counters that rise, NVML Xids. Rebuilt only when the devices change, so the
    /// counters' baselines and the Xid watch survive rediscovery.
    monitors: Vec<(String, Monitor)>,
    devices_seen: Vec<(String, u32, Option<String>)>,
}

impl Exporter {
    /// An exporter of the devices under host root `root` (driver files under `driver_root`,
    /// the same path unless a driver container holds them), found with `profiles`, labelled
    /// with node name `node`; discovery runs again when the last one is older than
    /// `rediscover` (a removed or added device shows up within that).
    pub fn new(
        root: &Path,
        driver_root: &Path,
        profiles: Vec<Profile>,
        node: String,
        rediscover: Duration,
    ) -> Exporter {
        Exporter {
            root: root.to_path_buf(),
            driver_root: driver_root.to_path_buf(),
            profiles,
            node,
            rediscover,
            state: Mutex::new(State {
                reader: Reader::new(root),
                inventory: None,
                monitors: Vec::new(),
                devices_seen: Vec::new(),
            }),
        }
    }

    /// One scrape: discovery when due, every device's readings and health, joined with the
    /// kubelet's `allocations` (`None`: the kubelet did not answer or there is none; devices
    /// are then unattributed and `actk_exporter_pod_resources_up` is 0). Returns the page.
    pub fn scrape(&self, allocations: Option<&[Allocation]>) -> String {
        // A poisoned lock only means an earlier scrape panicked; the state is still usable.
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let due = st.inventory.as_ref().is_none_or(|(at, _)| at.elapsed() >= self.rediscover);
        if due {
            let inv = actk_core::discover::discover_roots(&self.root, &self.driver_root, &self.profiles);
            let seen: Vec<_> = inv
                .vendors
                .iter()
                .flat_map(|v| v.devices.iter().map(|d| (v.kind.clone(), d.index, d.uuid.clone())))
                .collect();
            if seen != st.devices_seen || st.monitors.is_empty() {
                let opts = HealthOptions {
                    policy: XidPolicy::new(&[], Duration::from_secs(300), None, None),
                    // The NVML watch's tick: how soon an ECC rise or a lost GPU shows.
                    poll: Duration::from_secs(2),
                };
                st.monitors = inv
                    .vendors
                    .iter()
                    .filter_map(|v| {
                        let p = self.profiles.iter().find(|p| p.name == v.profile)?;
                        Some((v.kind.clone(), Monitor::new(&self.root, p, v, &opts)))
                    })
                    .collect();
                st.devices_seen = seen;
            }
            st.inventory = Some((Instant::now(), inv));
        }
        let State { reader, inventory, monitors, .. } = &mut *st;
        let inv = &inventory.as_ref().expect("set above").1;
        let readings = reader.read(inv);
        let holders = actk_holders::attribute(inv, allocations.unwrap_or_default(), &[]);
        let mut health = BTreeMap::new();
        for (kind, m) in monitors.iter_mut() {
            for ((index, mig), problem) in m.check() {
                // A device's own entry; a MIG device's problem is its GPU's too.
                let e = health.entry((kind.clone(), index)).or_insert(None);
                if e.is_none() && (mig.is_none() || problem.is_some()) {
                    *e = problem.map(|p| p.reason);
                }
            }
        }
        let drivers: BTreeMap<_, _> =
            inv.vendors.iter().map(|v| (v.kind.clone(), v.driver_version.clone().unwrap_or_default())).collect();
        render(&Page {
            node: &self.node,
            readings: &readings,
            holders: &holders,
            health: &health,
            drivers: &drivers,
            pod_resources_up: allocations.is_some(),
        })
    }
}

/// What one page shows (the pure part of a scrape, for tests and benches).
#[derive(Debug)]
pub struct Page<'a> {
    /// Node name (`node` label).
    pub node: &'a str,
    /// Every device's readings.
    pub readings: &'a [Reading],
    /// Who holds each device ([`actk_holders::attribute`]).
    pub holders: &'a [DeviceHolders],
    /// Health by (kind, index): `None` healthy, else why not.
    pub health: &'a BTreeMap<(String, u32), Option<String>>,
    /// Driver version by kind.
    pub drivers: &'a BTreeMap<String, String>,
    /// Whether the kubelet answered PodResources `List`.
    pub pod_resources_up: bool,
}

/// Encodes `page` in the OpenMetrics text format (ends with `# EOF`).
pub fn render(page: &Page<'_>) -> String {
    let mut reg = Registry::default();
    let info = GaugeF::default();
    let healthy = GaugeF::default();
    let util = GaugeF::default();
    let mem_used = GaugeF::default();
    let mem_total = GaugeF::default();
    let temp = GaugeF::default();
    let power = GaugeF::default();
    let power_limit = GaugeF::default();
    let power_budget = GaugeF::default();
    let busy = Family::<Labels, Counter<f64, AtomicU64>>::default();
    let errors = Family::<Labels, Counter<u64>>::default();
    let up = Gauge::<i64>::default();

    let free = [Holder {
        namespace: None,
        pod: None,
        container: None,
        container_id: None,
        engine: String::new(),
        via: String::new(),
        part: None,
    }];
    for r in page.readings {
        let held = page.holders.iter().find(|h| h.kind == r.kind && h.index == r.index).map(|h| &h.holders[..]);
        let holders = match held {
            Some(h) if !h.is_empty() => h,
            _ => &free[..],
        };
        let base = vec![
            ("node".to_string(), page.node.to_string()),
            ("kind".to_string(), r.kind.clone()),
            ("vendor".to_string(), r.vendor.clone()),
            ("index".to_string(), r.index.to_string()),
            ("uuid".to_string(), r.uuid.clone().unwrap_or_default()),
        ];
        let mut info_labels = base.clone();
        info_labels.push(("model".into(), r.model.clone().unwrap_or_default()));
        info_labels.push(("driver_version".into(), page.drivers.get(&r.kind).cloned().unwrap_or_default()));
        info.get_or_create(&info_labels).set(1.0);
        let why = page.health.get(&(r.kind.clone(), r.index)).cloned().flatten().or_else(|| r.problem.clone());
        // The same holder listed twice (two replicas of one pod's container) is one series.
        let mut seen = std::collections::BTreeSet::new();
        for h in holders {
            let mut l = base.clone();
            l.push(("namespace".into(), h.namespace.clone().unwrap_or_default()));
            l.push(("pod".into(), h.pod.clone().unwrap_or_default()));
            l.push(("container".into(), h.container.clone().unwrap_or_default()));
            if !seen.insert(l.clone()) {
                continue;
            }
            let mut hl = l.clone();
            hl.push(("reason".into(), why.clone().unwrap_or_default()));
            healthy.get_or_create(&hl).set(if why.is_some() { 0.0 } else { 1.0 });
            let set = |f: &GaugeF, v: Option<f64>| {
                if let Some(v) = v {
                    f.get_or_create(&l).set(v);
                }
            };
            set(&util, r.utilization_percent);
            set(&mem_used, r.memory_used_bytes.map(|b| b as f64));
            set(&mem_total, r.memory_total_bytes.map(|b| b as f64));
            set(&power, r.power_watts);
            set(&power_limit, r.power_limit_watts);
            set(&power_budget, r.power_budget_percent);
            for (sensor, c) in &r.temperatures {
                let mut tl = l.clone();
                tl.push(("sensor".into(), sensor.clone()));
                temp.get_or_create(&tl).set(*c);
            }
            if let Some(s) = r.busy_seconds {
                busy.get_or_create(&l).inc_by(s);
            }
            for e in &r.errors {
                let mut el = l.clone();
                el.push(("source".into(), e.source.clone()));
                el.push(("severity".into(), e.severity.clone()));
                errors.get_or_create(&el).inc_by(e.count);
            }
        }
    }
    up.set(i64::from(page.pod_resources_up));
    reg.register("actk_device_info", "A device of the node (value 1), with its model and driver version", info);
    reg.register(
        "actk_device_healthy",
        "1 when the device is usable, 0 when not (reason says why: device node gone, GPU lost, driver error)",
        healthy,
    );
    reg.register(
        "actk_device_utilization_percent",
        "Busy share of the device over the last sample period, percent",
        util,
    );
    reg.register("actk_device_memory_used_bytes", "Device memory in use, bytes", mem_used);
    reg.register("actk_device_memory_total_bytes", "Device memory, bytes", mem_total);
    reg.register("actk_device_temperature_celsius", "Device temperature by sensor, degrees Celsius", temp);
    reg.register("actk_device_power_watts", "Power draw, watts", power);
    reg.register("actk_device_power_limit_watts", "Enforced power limit, watts", power_limit);
    reg.register(
        "actk_device_power_budget_percent",
        "Power draw as a percent of the device's power budget",
        power_budget,
    );
    reg.register("actk_device_busy_seconds", "Time the device's cores were busy, seconds", busy);
    reg.register(
        "actk_device_errors",
        "Hardware error counts since the driver loaded (ECC, RAS blocks), by source and severity",
        errors,
    );
    reg.register(
        "actk_exporter_pod_resources_up",
        "1 when the kubelet's PodResources API answered the last scrape",
        up,
    );
    let mut out = String::new();
    // Writing into a String cannot fail.
    prometheus_client::encoding::text::encode(&mut out, &reg).expect("encoding into a String");
    out
}
