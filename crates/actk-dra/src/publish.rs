//! Keeping the node's pool current: discovery every `rediscover` interval (devices appearing,
//! a driver loaded late), device health every `health` interval (actk-node's engine: a node
//! gone or replaced, a PCI function gone, NVML Xids and ECC, the vendors' error counters), and a
//! new pool generation published whenever the devices change. An unhealthy device stays in the
//! slice with a device taint where the API server keeps taints, else it leaves the slice, and
//! either way the kubelet's health stream reports it ([`crate::health`]); recovery undoes it.
//! The driver prepares only what the published inventory holds.
//!
//! Registration before publication: nothing is published until the kubelet has registered the
//! driver (its NotifyRegistrationStatus said `plugin_registered: true`, see
//! [`crate::service::Registrar`]): a pool published earlier lets the scheduler bind a pod that
//! the kubelet then cannot prepare ("driver not registered"). The inventory is handed to the
//! driver before that, so claims prepared by an earlier driver process are answered as soon as
//! the kubelet asks. The driver withdraws the pool before it stops ([`crate::kube::withdraw`]).
//!
//! One publisher per node: during a rolling update two driver processes run on the node (the
//! kubelet calls either, [`crate::driver`]), but only the one holding the publisher lock
//! ([`PUBLISH_LOCK`], a flock in the plugin directory, held for the process's life) publishes;
//! the other discovers, hands its driver the inventory and prepares claims, and takes over the
//! pool (at a generation above the last published one) once the lock is free. A driver of an
//! earlier release (no lock, the fixed socket name) is waited for the same way: while its
//! registration socket answers ([`PublishConfig::defer_to`]).
//!
//! The published pool is checked at each discovery and published again (at a new generation)
//! when it is gone or changed: the kubelet deletes the node's slices when it starts, and a
//! driver's slices when the driver was unregistered for 30 s.
//!
//! One kind, one server: a profile whose Kubernetes resource (`nvidia.com/gpu`, ...) a device
//! plugin advertises on this node (Node allocatable above zero) is not published, with a warning
//! naming the resource, unless `allow_device_plugin_overlap` is set; the chart's values decide
//! which kinds each serves, and this check catches a second installation (another vendor's
//! device plugin) doing the same. With the per-node choice on ([`NodeChoice`],
//! [`crate::servers`]) the Node's labels decide which served profiles the driver takes on this
//! node, and the servers file tells the device plugin.

use actk_core::inventory::{Device, Inventory};
use actk_core::profile::Profile;
use actk_node::health::{HealthOptions, Problem, ProblemKind};
use k8s_openapi::api::resource::v1::Device as SliceDevice;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

use crate::events::{PoolState, ProfileState};
use crate::health::{Monitors, Reporter, TaintMode};
use crate::servers::{self, Server, ServersFile};
use crate::slice::{self, NodeRef, Pool, device_name};

/// What the publisher needs.
#[derive(Debug, Clone)]
pub struct PublishConfig {
    /// Host root to discover in.
    pub root: PathBuf,
    /// The profiles.
    pub profiles: Vec<Profile>,
    /// Profiles to serve; `None`: every profile.
    pub served: Option<BTreeSet<String>>,
    /// Health probe period.
    pub health: Duration,
    /// Discovery period.
    pub rediscover: Duration,
    /// Publish kinds a device plugin also serves on this node.
    pub allow_device_plugin_overlap: bool,
    /// Where the pool's state goes after each round, for the events ([`crate::events`]).
    pub state: Option<Arc<watch::Sender<Arc<PoolState>>>>,
    /// The per-node choice of server ([`crate::servers`]); `None`: the driver serves `served`
    /// wherever it runs (the chart's default).
    pub node_choice: Option<NodeChoice>,
    /// The node's publisher lock ([`PUBLISH_LOCK`] in the plugin directory); `None`: publish
    /// without one (a single process).
    pub publish_lock: Option<PathBuf>,
    /// A registration socket of an earlier driver release (which takes no lock): while it
    /// answers, that process publishes and this one waits.
    pub defer_to: Option<PathBuf>,
    /// Where the pool's figures go.
    pub metrics: Option<crate::metrics::DraMetrics>,
    /// How device health is judged and acted on.
    pub health_engine: HealthConfig,
    /// Dynamic MIG ([`crate::mig`]); `None`: off (the default), MIG devices are published as
    /// they exist.
    pub dynamic_mig: Option<DynamicMigConfig>,
}

/// What the publisher needs for dynamic MIG.
#[derive(Debug, Clone)]
pub struct DynamicMigConfig {
    /// The node's name, as the driver's checkpoint records it.
    pub node: String,
    /// The driver's checkpoint: the MIG devices it made for prepared claims
    /// ([`crate::checkpoint::Made`]), which are not published again.
    pub checkpoint: PathBuf,
    /// Where the placements offered go, for the driver to make them at prepare.
    pub placements: Arc<watch::Sender<Arc<crate::mig::Placements>>>,
}

/// How the publisher judges device health and what it does with an unhealthy device.
#[derive(Debug, Clone, Default)]
pub struct HealthConfig {
    /// The engine's judgement; `None`: [`crate::health::default_options`] with a minute's
    /// recovery, polled every `health` period.
    pub options: Option<HealthOptions>,
    /// Taint or withdraw ([`TaintMode::for_server`]).
    pub taints: TaintMode,
    /// Where each device's health goes for the kubelet ([`crate::health::HealthService`]), with
    /// the pool's name.
    pub report: Option<(Reporter, String)>,
}

/// File name of the node's publisher lock in the plugin directory.
pub const PUBLISH_LOCK: &str = "publish.lock";

/// Takes the publisher lock at `lock` when it is free and no earlier driver (`defer_to`
/// answering) publishes: `Some(file)` holds it until dropped, `None` means another process
/// publishes.
///
/// Errors: the lock file cannot be opened or locked for another reason than being held.
pub fn try_lead(lock: &Path, defer_to: Option<&Path>) -> std::io::Result<Option<std::fs::File>> {
    if let Some(sock) = defer_to
        && std::os::unix::net::UnixStream::connect(sock).is_ok()
    {
        return Ok(None);
    }
    if let Some(dir) = lock.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let f = std::fs::File::options().create(true).truncate(false).write(true).open(lock)?;
    match f.try_lock() {
        Ok(()) => Ok(Some(f)),
        Err(std::fs::TryLockError::WouldBlock) => Ok(None),
        Err(std::fs::TryLockError::Error(e)) => Err(e),
    }
}

/// The per-node choice between the DRA driver and the device plugin ([`crate::servers`]).
#[derive(Debug, Clone)]
pub struct NodeChoice {
    /// What serves a profile of `served` on a node without its label.
    pub default: Server,
    /// Where the choice is written for the device plugin ([`ServersFile`]); `None`: nowhere.
    pub file: Option<PathBuf>,
    /// This node's name (written into the file).
    pub node: String,
}

/// What the publisher reads of its Node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeView {
    /// `status.allocatable` (`nvidia.com/gpu` -> `8`).
    pub allocatable: BTreeMap<String, String>,
    /// `metadata.labels`.
    pub labels: BTreeMap<String, String>,
}

/// The pool's state for the events: every discovered profile (`found`) as published, left to
/// a device plugin (`overlap`) or not served; `inv` is the served inventory.
#[allow(clippy::too_many_arguments)]
pub fn pool_state(
    found: &Inventory,
    inv: &Inventory,
    served: Option<&BTreeSet<String>>,
    overlap: &BTreeMap<String, String>,
    by_label: &BTreeMap<String, String>,
    unhealthy: &BTreeMap<String, String>,
    published: bool,
) -> PoolState {
    let mut profiles = BTreeMap::new();
    for v in found.vendors.iter().filter(|v| !v.devices.is_empty()) {
        let state = if let Some(r) = overlap.get(&v.profile) {
            ProfileState::DevicePlugin(r.clone())
        } else if let Some(why) = by_label.get(&v.profile) {
            ProfileState::NodeLabel(why.clone())
        } else if served.is_some_and(|s| !s.contains(&v.profile)) {
            ProfileState::NotServed
        } else {
            let devs = inv.vendor(&v.profile).map(|v| v.devices.as_slice()).unwrap_or_default();
            let (mut whole, mut mig, mut sick) = (BTreeSet::new(), BTreeSet::new(), 0);
            for d in devs.iter().filter(|d| !d.nodes.is_empty()) {
                let name = device_name(&v.profile, d.index);
                if unhealthy.contains_key(&name) {
                    sick += 1;
                } else if d.mig.as_ref().is_some_and(|m| m.enabled) {
                    mig.insert(name);
                } else {
                    whole.insert(name);
                }
            }
            ProfileState::Published { whole, mig, unhealthy: sick }
        };
        profiles.insert(v.profile.clone(), state);
    }
    let devices = slice::devices(inv, None, &unhealthy.keys().cloned().collect()).into_iter().map(|d| d.name).collect();
    PoolState { published, profiles, devices, unhealthy: unhealthy.clone(), served: served.cloned() }
}

/// The inventory of `inv`'s vendors that are served: in `served` (all when `None`) and not in
/// `excluded`.
pub fn served(inv: &Inventory, served: Option<&BTreeSet<String>>, excluded: &BTreeSet<String>) -> Inventory {
    let mut out = inv.clone();
    out.vendors.retain(|v| served.is_none_or(|s| s.contains(&v.profile)) && !excluded.contains(&v.profile));
    out
}

/// Profiles of `inv` whose Kubernetes resources a device plugin advertises in `allocatable`,
/// with the resource that shows it.
pub fn device_plugin_profiles(
    inv: &Inventory,
    profiles: &[Profile],
    allocatable: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for v in &inv.vendors {
        let Some(p) = profiles.iter().find(|p| p.name == v.profile) else { continue };
        if let Some(r) = p.kubernetes.resources.iter().find(|r| allocatable.get(*r).is_some_and(|q| q != "0")) {
            out.insert(v.profile.clone(), r.clone());
        }
    }
    out
}

/// What [`keep_lost`] made of a rediscovery: the inventory to publish, and the problem of each
/// device it kept although discovery lost it, by slice device name.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Kept {
    /// The rediscovery with the lost devices kept.
    pub inventory: Inventory,
    /// Each kept device's problem ([`ProblemKind::Lost`]: `device-node-gone` when discovery
    /// found it without a usable node, `device-gone` when it no longer found it at all).
    pub lost: BTreeMap<String, Problem>,
}

/// Whether `a` and `b` are the same device: the same UUID where both have one, else the same
/// PCI function, else the same index. Indexes are positions (NVIDIA numbers the GPUs in
/// /proc/driver/nvidia/gpus order), so one that left shifts the others' indexes.
fn same_device(a: &Device, b: &Device) -> bool {
    match (&a.uuid, &b.uuid, &a.pci_bus_id, &b.pci_bus_id) {
        (Some(x), Some(y), _, _) => x == y,
        (_, _, Some(x), Some(y)) => x == y,
        _ => a.index == b.index,
    }
}

/// `found`, a rediscovery, with every device of `before` (the previous discovery, kept devices
/// included) that had device nodes and now has none or is gone, as `before` had it (its nodes,
/// attributes and MIG devices), so that it stays in the pool tainted and the kubelet hears it
/// is unhealthy, rather than leaving the pool untold. Devices are matched by identity
/// ([`same_device`]): one found without nodes keeps its entry under its new index; one gone
/// keeps its old index unless another device holds that index now (it is then dropped, and
/// logged). A vendor `found` lacks altogether (its driver unloaded) keeps its `before` entry.
/// Each kept device is lost explicitly ([`Kept::lost`]): its node may still be there (NVIDIA's
/// are static), so the health probe alone would call it healthy. Once discovery finds it with
/// nodes again, the new entry is used. Vendors stay in the order of `profiles`. Used where the
/// server keeps device taints; where it drops them, a lost device leaves the pool anyway.
pub fn keep_lost(before: &Inventory, mut found: Inventory, profiles: &[Profile]) -> Kept {
    let mut lost = BTreeMap::new();
    let gone = |p: &str, d: &Device, why: &str| {
        let id = d.uuid.as_deref().or(d.pci_bus_id.as_deref()).unwrap_or("no id");
        Problem::new(ProblemKind::Lost, "device-gone", format!("{} ({id}) {why}", device_name(p, d.index)))
    };
    for old in &before.vendors {
        let had: Vec<&Device> = old.devices.iter().filter(|d| !d.nodes.is_empty()).collect();
        let Some(new) = found.vendors.iter_mut().find(|v| v.profile == old.profile) else {
            if !had.is_empty() {
                for d in &had {
                    let why = format!("is no longer found: discovery finds no {} device", old.kind);
                    lost.insert(device_name(&old.profile, d.index), gone(&old.profile, d, &why));
                }
                let mut v = old.clone();
                v.devices.retain(|d| !d.nodes.is_empty());
                found.vendors.push(v);
            }
            continue;
        };
        for d in had {
            let index_taken = new.devices.iter().any(|n| n.index == d.index);
            match new.devices.iter_mut().find(|n| same_device(n, d)) {
                Some(n) if n.nodes.is_empty() => {
                    let paths: Vec<&str> = d.nodes.iter().map(|x| x.path.as_str()).collect();
                    let p = Problem::new(
                        ProblemKind::Lost,
                        "device-node-gone",
                        format!("discovery finds it without a usable device node (it had {})", paths.join(", ")),
                    );
                    lost.insert(device_name(&old.profile, n.index), p);
                    *n = Device { index: n.index, ..d.clone() };
                }
                Some(_) => {}
                None if index_taken => tracing::warn!(
                    "device {} is gone and its name is another device's now; it leaves the pool",
                    device_name(&old.profile, d.index)
                ),
                None => {
                    lost.insert(device_name(&old.profile, d.index), gone(&old.profile, d, "is no longer found"));
                    new.devices.push(d.clone());
                }
            }
        }
        new.devices.sort_by_key(|d| d.index);
    }
    let rank = |name: &str| profiles.iter().position(|p| p.name == name).unwrap_or(usize::MAX);
    found.vendors.sort_by_key(|v| rank(&v.profile));
    Kept { inventory: found, lost }
}

/// `inv` without the devices in `unhealthy` (slice device names).
pub fn without(inv: &Inventory, unhealthy: &BTreeSet<String>) -> Inventory {
    let mut out = inv.clone();
    for v in &mut out.vendors {
        let p = v.profile.clone();
        v.devices.retain(|d| !unhealthy.contains(&device_name(&p, d.index)));
    }
    out
}

/// `inv` without the MIG devices whose UUIDs are in `hidden`.
pub fn without_migs(mut inv: Inventory, hidden: &BTreeSet<String>) -> Inventory {
    if !hidden.is_empty() {
        for m in inv.vendors.iter_mut().flat_map(|v| &mut v.devices).filter_map(|d| d.mig.as_mut()) {
            m.devices.retain(|x| !hidden.contains(&x.uuid));
        }
    }
    inv
}

/// The slice devices of `inv` with what `problems` says of them: in [`TaintMode::Withdraw`]
/// the unhealthy ones left out, else each with its device taint.
pub fn judged_devices(inv: &Inventory, problems: &BTreeMap<String, Problem>, mode: TaintMode) -> Vec<SliceDevice> {
    match mode {
        TaintMode::Withdraw => slice::devices(inv, None, &problems.keys().cloned().collect()),
        TaintMode::Taint { lost_no_execute } => {
            let mut all = slice::devices(inv, None, &BTreeSet::new());
            for d in &mut all {
                if let Some(p) = problems.get(&d.name) {
                    d.taints = Some(vec![crate::health::taint(p, lost_no_execute)]);
                }
            }
            all
        }
    }
}

/// The pool of `devices` with dynamic MIG's `plan`: the MIG devices the driver made left out
/// (their placement devices stand for them), the placement devices added with their GPU's
/// health (left out in [`TaintMode::Withdraw`], else with its taint), and the counter sets.
pub fn with_placements(
    mut devices: Vec<SliceDevice>,
    plan: &crate::mig::Plan,
    problems: &BTreeMap<String, Problem>,
    mode: TaintMode,
) -> Pool {
    if !plan.hidden.is_empty() {
        devices.retain(|d| {
            let attrs = d.attributes.as_ref();
            let uuid = attrs.and_then(|a| a.get("uuid")).and_then(|u| u.string.as_deref());
            !(attrs.is_some_and(|a| a.contains_key("migProfile")) && uuid.is_some_and(|u| plan.hidden.contains(u)))
        });
    }
    for d in &plan.devices {
        let problem = plan.parent.get(&d.name).and_then(|gpu| problems.get(gpu));
        match (mode, problem) {
            (TaintMode::Withdraw, Some(_)) => continue,
            (TaintMode::Taint { lost_no_execute }, Some(p)) => {
                let mut d = d.clone();
                d.taints = Some(vec![crate::health::taint(p, lost_no_execute)]);
                devices.push(d);
            }
            (_, None) => devices.push(d.clone()),
        }
    }
    Pool { devices, counter_sets: plan.counter_sets.clone() }
}

/// Where the slices go: the API server in the driver, a recorder in tests.
pub trait Sink: Send {
    /// The Node's allocatable resources (what a device plugin serves on it) and labels (the
    /// per-node choice of server).
    fn node(&mut self) -> impl Future<Output = Result<NodeView, String>> + Send;
    /// Whether the pool the API server holds is still the one published at `generation` (the
    /// kubelet deletes a node's slices when it starts, and a driver's after it was away 30 s).
    /// Errors: the API server's message (the pool is then taken as intact).
    fn intact(&mut self, generation: i64) -> impl Future<Output = Result<bool, String>> + Send;
    /// The newest pool generation the API server holds for this node (0: none), so that a
    /// process taking the pool over from another publishes above it. Errors: the API server's
    /// message.
    fn newest_generation(&mut self) -> impl Future<Output = Result<i64, String>> + Send {
        async { Ok(0) }
    }
    /// Publishes the pool at `generation`. Errors: the API server's message.
    fn publish(&mut self, generation: i64, pool: Pool) -> impl Future<Output = Result<(), String>> + Send;
}

/// The API server as a [`Sink`].
pub struct ApiSink {
    /// The client.
    pub client: ::kube::Client,
    /// The node.
    pub node: NodeRef,
}

impl Sink for ApiSink {
    async fn node(&mut self) -> Result<NodeView, String> {
        crate::kube::node_view(&self.client, &self.node.name).await
    }
    async fn intact(&mut self, generation: i64) -> Result<bool, String> {
        let now = crate::kube::current_slices(&self.client, &self.node.name).await?;
        let count = now.first().map_or(0, |s| s.spec.pool.resource_slice_count);
        Ok(!now.is_empty()
            && now.len() as i64 == count
            && now.iter().all(|s| s.spec.pool.generation == generation && s.spec.pool.resource_slice_count == count))
    }
    async fn newest_generation(&mut self) -> Result<i64, String> {
        let now = crate::kube::current_slices(&self.client, &self.node.name).await?;
        Ok(now.iter().map(|s| s.spec.pool.generation).max().unwrap_or(0))
    }
    async fn publish(&mut self, generation: i64, pool: Pool) -> Result<(), String> {
        let slices = slice::slices(&self.node, generation, pool);
        crate::kube::apply_slices(&self.client, &self.node.name, &slices).await
    }
}

/// Whether a registration status says the kubelet registered the driver.
pub fn is_registered(status: &Option<Result<(), String>>) -> bool {
    matches!(status, Some(Ok(())))
}

/// Runs the publisher forever: discovers, publishes at `first_generation` and every change at
/// the next generation, and sends each inventory to publish (served profiles, healthy devices)
/// on `tx` before publishing it. Nothing is published before `registration` says the kubelet
/// registered the driver ([`is_registered`]); a failed publish is retried every health period.
pub async fn run<S: Sink>(
    cfg: PublishConfig,
    mut sink: S,
    first_generation: i64,
    tx: watch::Sender<Arc<Inventory>>,
    mut registration: watch::Receiver<Option<Result<(), String>>>,
) {
    let mut generation = first_generation;
    let mut published: Option<Pool> = None;
    // Dynamic MIG: each GPU's profiles (read once), and what the last discovery offers.
    let mut layouts = crate::mig::Layouts::new();
    let mut plan = crate::mig::Plan::default();
    let mut warned_overlap: BTreeMap<String, String> = BTreeMap::new();
    let mut last_discovery: Option<Instant> = None;
    let mut inv = Inventory::default();
    let mut found = Inventory::default();
    let mut monitors = Monitors::default();
    // Devices keep_lost kept although discovery lost them, with why.
    let mut lost: BTreeMap<String, Problem> = BTreeMap::new();
    let health_opts = cfg
        .health_engine
        .options
        .clone()
        .unwrap_or_else(|| crate::health::default_options(Duration::from_secs(60), cfg.health));
    let mode = cfg.health_engine.taints;
    let mut unhealthy_before: BTreeSet<String> = BTreeSet::new();
    let mut sent: Option<Vec<SliceDevice>> = None;
    let mut said_waiting = false;
    let mut labels: BTreeMap<String, String> = BTreeMap::new();
    let mut by_label: BTreeMap<String, String> = BTreeMap::new();
    let mut said_ignored: BTreeSet<String> = BTreeSet::new();
    let mut written: Option<ServersFile> = None;
    let mut last_dra: Option<BTreeSet<String>> = None;
    // The publisher lock, once held (kept for the life of the task).
    let mut lead: Option<std::fs::File> = None;
    let mut said_follower = false;
    let mut said_lock_error = false;
    loop {
        if last_discovery.is_none_or(|t| t.elapsed() >= cfg.rediscover) {
            // Off the runtime's thread, as the engines' start below: NVML's initialisation takes
            // seconds on a node without persistence mode, and NodePrepareResources waits on it.
            let (root, profiles) = (cfg.root.clone(), cfg.profiles.clone());
            let dynamic = cfg.dynamic_mig.clone();
            let mut known = std::mem::take(&mut layouts);
            let (fresh, owned) = match tokio::task::spawn_blocking(move || {
                // What the driver made, read before and after discovery: a prepare or unprepare
                // between the reads is in one of them, so its MIG device is never taken for
                // one made outside the driver.
                let before = dynamic.as_ref().map(|dm| crate::mig::owned(&dm.checkpoint, &dm.node));
                let inv = actk_core::discover::discover(&root, &profiles);
                let owned = match (&dynamic, before) {
                    (Some(dm), Some(mut owned)) => {
                        crate::mig::read_layouts(&root, &inv, &mut known);
                        owned.extend(crate::mig::owned(&dm.checkpoint, &dm.node));
                        owned
                    }
                    _ => BTreeSet::new(),
                };
                (inv, owned, known)
            })
            .await
            {
                Ok((f, owned, known)) => {
                    layouts = known;
                    (f, owned)
                }
                Err(e) => {
                    tracing::warn!("discovery failed: {e}; keeping what the last one found");
                    (found.clone(), BTreeSet::new())
                }
            };
            // Where taints are kept, a device discovery lost (its node gone, or itself) stays in
            // the pool tainted as lost, not dropped untold.
            found = match mode {
                TaintMode::Taint { .. } if last_discovery.is_some() => {
                    let kept = keep_lost(&found, fresh, &cfg.profiles);
                    for (name, p) in &kept.lost {
                        if !lost.contains_key(name) {
                            tracing::warn!("device {name}: {}", p.reason);
                        }
                    }
                    lost = kept.lost;
                    kept.inventory
                }
                _ => fresh,
            };
            if last_discovery.is_none() {
                for w in &found.warnings {
                    tracing::warn!("discovery: {w}");
                }
            }
            let view = sink.node().await;
            if let Ok(v) = &view {
                labels = v.labels.clone();
            }
            let overlap = if cfg.allow_device_plugin_overlap {
                BTreeMap::new()
            } else {
                match &view {
                    Ok(v) => device_plugin_profiles(&found, &cfg.profiles, &v.allocatable),
                    Err(e) => {
                        tracing::warn!("cannot read the node's allocatable resources: {e}; keeping the last check");
                        warned_overlap.clone()
                    }
                }
            };
            // The per-node choice: which of the served profiles this node gives the driver.
            let here = match &cfg.node_choice {
                None => cfg.served.clone(),
                Some(nc) => {
                    let may: BTreeSet<String> = match &cfg.served {
                        Some(s) => s.clone(),
                        None => cfg.profiles.iter().map(|p| p.name.clone()).collect(),
                    };
                    let choice = servers::choose(&may, &labels, nc.default);
                    for (l, why) in &choice.ignored {
                        if said_ignored.insert(l.clone()) {
                            tracing::warn!("node label {l} is ignored: {why}");
                        }
                    }
                    for (p, why) in &choice.by_label {
                        if by_label.get(p) != Some(why) {
                            tracing::info!("profile {p} is the device plugin's on this node ({why})");
                        }
                    }
                    if last_dra.as_ref() != Some(&choice.dra) {
                        tracing::info!(
                            "profiles the DRA driver serves on this node: {}",
                            choice.dra.iter().cloned().collect::<Vec<_>>().join(", ")
                        );
                        last_dra = Some(choice.dra.clone());
                    }
                    by_label = choice.by_label;
                    let file = ServersFile { node: nc.node.clone(), dra: choice.dra.clone() };
                    if let Some(path) = &nc.file
                        && written.as_ref() != Some(&file)
                    {
                        match file.write(path) {
                            Ok(()) => written = Some(file),
                            Err(e) => tracing::warn!("cannot tell the device plugin what DRA serves here: {e}"),
                        }
                    }
                    Some(choice.dra)
                }
            };
            for (p, r) in &overlap {
                if warned_overlap.get(p) != Some(r) {
                    tracing::warn!(
                        "profile {p}: a device plugin advertises {r} on this node; its devices are not published for DRA (one kind, one server: exclude {r} from the device plugin, or set --allow-device-plugin-overlap)"
                    );
                }
            }
            warned_overlap = overlap;
            let excluded: BTreeSet<String> = warned_overlap.keys().cloned().collect();
            inv = served(&found, here.as_ref(), &excluded);
            if let Some(dm) = &cfg.dynamic_mig {
                plan = crate::mig::plan(&inv, &layouts, &owned);
                let offered = Arc::new(plan.placements.clone());
                dm.placements.send_if_modified(|old| {
                    let changed = **old != *offered;
                    if changed {
                        *old = offered.clone();
                    }
                    changed
                });
            }
            let (m, i, p, o) = (std::mem::take(&mut monitors), inv.clone(), cfg.profiles.clone(), health_opts.clone());
            monitors = match tokio::task::spawn_blocking(move || {
                let mut m = m;
                m.update(&i, &p, &o);
                m
            })
            .await
            {
                Ok(m) => m,
                Err(e) => {
                    tracing::warn!("the health engines could not be started: {e}; starting them again next time");
                    Monitors::default()
                }
            };
            if published.is_some() {
                match sink.intact(generation).await {
                    Ok(true) => {}
                    Ok(false) => {
                        tracing::warn!(
                            "the pool's ResourceSlices were deleted or changed (kubelet restart?); publishing again"
                        );
                        published = None;
                        generation += 1;
                    }
                    Err(e) => tracing::warn!("cannot check the published ResourceSlices: {e}"),
                }
            }
            last_discovery = Some(Instant::now());
        }
        let mut judged = monitors.check();
        for (name, p) in &lost {
            if let Some(j) = judged.get_mut(name)
                && j.as_ref().is_none_or(|q| q.kind < p.kind)
            {
                *j = Some(p.clone());
            }
        }
        let problems: BTreeMap<String, Problem> =
            judged.iter().filter_map(|(n, p)| Some((n.clone(), p.clone()?))).collect();
        for (name, p) in &problems {
            if !unhealthy_before.contains(name) {
                let act = match mode {
                    TaintMode::Withdraw => "it leaves the ResourceSlice".to_string(),
                    TaintMode::Taint { .. } => {
                        let t = crate::health::taint(p, matches!(mode, TaintMode::Taint { lost_no_execute: true }));
                        format!("tainted {}={}:{}", t.key, t.value.unwrap_or_default(), t.effect)
                    }
                };
                tracing::warn!("device {name} is unhealthy: {p} [{}]; {act}", p.code);
            }
        }
        let why: BTreeMap<String, String> = problems.iter().map(|(n, p)| (n.clone(), p.reason.clone())).collect();
        let unhealthy: BTreeSet<String> = why.keys().cloned().collect();
        for name in unhealthy_before.difference(&unhealthy) {
            tracing::info!("device {name} is healthy again");
        }
        unhealthy_before = unhealthy.clone();
        let mut devices = judged_devices(&inv, &problems, mode);
        slice::share(&mut devices, &cfg.profiles);
        let pool = with_placements(devices.clone(), &plan, &problems, mode);
        if let Some((reporter, pool)) = &cfg.health_engine.report {
            // Every device the pool holds or would hold, healthy or not, for the kubelet.
            let report = crate::health::HealthReport {
                pool: pool.clone(),
                devices: inv
                    .vendors
                    .iter()
                    .flat_map(|v| {
                        v.devices.iter().filter(|d| !d.nodes.is_empty()).map(|d| device_name(&v.profile, d.index))
                    })
                    .filter_map(|n| Some((n.clone(), judged.get(&n)?.clone())))
                    .collect(),
            };
            reporter.send_if_modified(|old| {
                let changed = **old != report;
                if changed {
                    *old = Arc::new(report);
                }
                changed
            });
        }
        if published.as_ref() != Some(&pool) {
            if sent.as_ref() != Some(&devices) {
                // A faulty device that is tainted stays preparable: a claim that tolerates the
                // taint is the admin's choice (a diagnostics job). A lost one (its node gone,
                // or itself) is not there to prepare, tolerated or not; withdrawn ones neither.
                let usable = match mode {
                    TaintMode::Withdraw => without(&inv, &unhealthy),
                    TaintMode::Taint { .. } => without(
                        &inv,
                        &problems.iter().filter(|(_, p)| p.kind == ProblemKind::Lost).map(|(n, _)| n.clone()).collect(),
                    ),
                };
                // The MIG devices the driver made are its claims' placements, not devices to
                // prepare by their own names.
                tx.send_replace(Arc::new(without_migs(usable, &plan.hidden)));
                sent = Some(devices.clone());
            }
            if !is_registered(&registration.borrow_and_update()) {
                if !said_waiting {
                    tracing::info!(
                        "{} device(s) found; the ResourceSlices wait until the kubelet has registered the driver",
                        devices.len()
                    );
                    said_waiting = true;
                }
                tokio::select! {
                    changed = registration.changed() => if changed.is_err() { return },
                    _ = tokio::time::sleep(cfg.health) => {}
                }
                continue;
            }
            if let Some(lock) = &cfg.publish_lock
                && lead.is_none()
            {
                match try_lead(lock, cfg.defer_to.as_deref()) {
                    Ok(Some(f)) => {
                        lead = Some(f);
                        match sink.newest_generation().await {
                            Ok(g) if g >= generation => generation = g + 1,
                            Ok(_) => {}
                            Err(e) => tracing::warn!("cannot read the pool's newest generation: {e}"),
                        }
                        if said_follower {
                            tracing::info!("the other driver process is gone; this one publishes the node's pool now");
                        }
                        if let Some(m) = &cfg.metrics {
                            m.set_publisher(true);
                        }
                    }
                    Ok(None) => {
                        if !said_follower {
                            tracing::info!(
                                "another actk-dra-driver process publishes this node's pool (a rolling update); this one prepares claims and publishes once that one is gone"
                            );
                            said_follower = true;
                        }
                        tokio::time::sleep(cfg.health).await;
                        continue;
                    }
                    Err(e) => {
                        // A lock that cannot be taken must not keep the node without a pool.
                        if !said_lock_error {
                            tracing::warn!("publisher lock {}: {e}; publishing without it", lock.display());
                            said_lock_error = true;
                        }
                    }
                }
            }
            if published.is_some() {
                generation += 1;
            }
            match sink.publish(generation, pool.clone()).await {
                Ok(()) => {
                    tracing::info!(
                        "published pool generation {generation}: {} device(s){}{}",
                        pool.devices.len(),
                        if pool.devices.is_empty() {
                            String::new()
                        } else {
                            format!(
                                " ({})",
                                pool.devices.iter().map(|d| d.name.as_str()).collect::<Vec<_>>().join(", ")
                            )
                        },
                        if pool.counter_sets.is_empty() {
                            String::new()
                        } else {
                            format!(", {} counter set(s)", pool.counter_sets.len())
                        }
                    );
                    if let Some(m) = &cfg.metrics {
                        let mut per: BTreeMap<String, usize> = BTreeMap::new();
                        for v in &inv.vendors {
                            let n = v
                                .devices
                                .iter()
                                .filter(|d| devices.iter().any(|x| x.name == device_name(&v.profile, d.index)))
                                .count();
                            per.insert(v.profile.clone(), n);
                        }
                        let mut sick: BTreeMap<String, usize> = BTreeMap::new();
                        for name in &unhealthy {
                            let p = inv
                                .vendors
                                .iter()
                                .find(|v| v.devices.iter().any(|d| device_name(&v.profile, d.index) == *name))
                                .map(|v| v.profile.clone())
                                .unwrap_or_default();
                            *sick.entry(p).or_default() += 1;
                        }
                        m.pool(generation, &per, &sick);
                    }
                    published = Some(pool);
                }
                Err(e) => {
                    tracing::warn!("publishing the ResourceSlices failed: {e}; retrying");
                    // Publish again next tick, at a new generation: part of this one may be applied.
                    published = None;
                    generation += 1;
                }
            }
        }
        if let Some(st) = &cfg.state {
            let now =
                pool_state(&found, &inv, cfg.served.as_ref(), &warned_overlap, &by_label, &why, published.is_some());
            st.send_if_modified(|old| {
                let changed = **old != now;
                if changed {
                    *old = Arc::new(now);
                }
                changed
            });
        }
        tokio::time::sleep(cfg.health).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use actk_core::inventory::{Device, DeviceNode, VendorInventory};

    fn gpu(index: u32, with_node: bool) -> Device {
        let nodes = if with_node {
            vec![DeviceNode {
                path: format!("/dev/nvidia{index}"),
                host_path: format!("/dev/nvidia{index}").into(),
                node_type: 'c',
                major: 195,
                minor: index,
                file_mode: None,
                gid: None,
            }]
        } else {
            vec![]
        };
        Device { index, model: Some(format!("gpu {index} {with_node}")), nodes, ..Default::default() }
    }

    fn vendor(profile: &str, devices: Vec<Device>) -> VendorInventory {
        VendorInventory { profile: profile.into(), kind: format!("{profile}.com/x"), devices, ..Default::default() }
    }

    fn inv(vendors: Vec<VendorInventory>) -> Inventory {
        Inventory { vendors, ..Default::default() }
    }

    #[test]
    fn a_lost_device_keeps_its_last_entry_and_a_found_one_takes_the_new() {
        let profiles = actk_core::profile::builtin();
        let before = inv(vec![
            vendor("nvidia", vec![gpu(0, true), gpu(1, true), gpu(2, true)]),
            vendor("neuron", vec![gpu(0, true)]),
        ]);
        // GPU 0 without its node, GPU 1 found anew, GPU 2 gone; Neuron's driver unloaded.
        let found = inv(vec![vendor("nvidia", vec![gpu(0, false), Device { index: 1, ..gpu(1, true) }])]);
        let mut renamed = found.clone();
        renamed.vendors[0].devices[1].model = Some("new".into());
        let kept = keep_lost(&before, renamed, &profiles);
        let names: Vec<_> = kept.inventory.vendors.iter().map(|v| v.profile.as_str()).collect();
        assert_eq!(names, ["nvidia", "neuron"]);
        let nv = &kept.inventory.vendors[0].devices;
        assert_eq!(nv.iter().map(|d| d.index).collect::<Vec<_>>(), [0, 1, 2]);
        assert_eq!(nv[0], before.vendors[0].devices[0], "node-less: the last entry");
        assert_eq!(nv[1].model.as_deref(), Some("new"), "found with its node: the new entry");
        assert_eq!(nv[2], before.vendors[0].devices[2], "gone: the last entry");
        assert_eq!(kept.inventory.vendors[1], before.vendors[1]);
        let codes: Vec<(&str, &str)> = kept.lost.iter().map(|(n, p)| (n.as_str(), p.code.as_str())).collect();
        assert_eq!(codes, [("neuron-0", "device-gone"), ("nvidia-0", "device-node-gone"), ("nvidia-2", "device-gone")]);
        assert!(kept.lost.values().all(|p| p.kind == ProblemKind::Lost));
        assert!(kept.lost["nvidia-0"].reason.contains("/dev/nvidia0"), "{:?}", kept.lost);
        // A device never seen with a node is not invented.
        let none = keep_lost(&inv(vec![vendor("nvidia", vec![gpu(3, false)])]), found.clone(), &profiles);
        assert_eq!(none, Kept { inventory: found, lost: BTreeMap::new() });
    }

    /// NVIDIA indexes are positions: when a GPU leaves, the next one takes its index. Devices
    /// are matched by UUID, so no GPU is published twice and none under another's name.
    #[test]
    fn devices_are_matched_by_identity_not_by_index() {
        let profiles = actk_core::profile::builtin();
        let with_uuid = |index: u32, uuid: &str, node: bool| Device { uuid: Some(uuid.into()), ..gpu(index, node) };
        let before = inv(vec![vendor(
            "nvidia",
            vec![with_uuid(0, "GPU-a", true), with_uuid(1, "GPU-b", true), with_uuid(2, "GPU-c", true)],
        )]);
        // GPU-b left; GPU-c is index 1 now, and found without its node.
        let found = inv(vec![vendor("nvidia", vec![with_uuid(0, "GPU-a", true), with_uuid(1, "GPU-c", false)])]);
        let kept = keep_lost(&before, found, &profiles);
        let nv = &kept.inventory.vendors[0].devices;
        let ids: Vec<(u32, &str)> = nv.iter().map(|d| (d.index, d.uuid.as_deref().unwrap())).collect();
        // GPU-b's name, nvidia-1, is GPU-c's now: GPU-b is not kept (logged), and GPU-c is not
        // published twice.
        assert_eq!(ids, [(0, "GPU-a"), (1, "GPU-c")]);
        assert_eq!(nv[1].nodes, before.vendors[0].devices[2].nodes, "GPU-c's last nodes, under its new index");
        let codes: Vec<(&str, &str)> = kept.lost.iter().map(|(n, p)| (n.as_str(), p.code.as_str())).collect();
        assert_eq!(codes, [("nvidia-1", "device-node-gone")]);
        // GPU-b left from the end: its name is free, so it is kept, lost.
        let found = inv(vec![vendor("nvidia", vec![with_uuid(0, "GPU-a", true), with_uuid(2, "GPU-c", true)])]);
        let kept = keep_lost(&before, found, &profiles);
        let ids: Vec<(u32, &str)> =
            kept.inventory.vendors[0].devices.iter().map(|d| (d.index, d.uuid.as_deref().unwrap())).collect();
        assert_eq!(ids, [(0, "GPU-a"), (1, "GPU-b"), (2, "GPU-c")]);
        assert_eq!(kept.lost.keys().collect::<Vec<_>>(), ["nvidia-1"]);
        assert!(kept.lost["nvidia-1"].reason.contains("GPU-b"), "{:?}", kept.lost);
    }
}
