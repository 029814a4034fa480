//! The DevicePlugin gRPC service of one resource (kubelet device plugin API v1beta1).

use crate::allocate::{AllocateError, AllocateOptions, CdiNames, check_replica_spread, container_response};
use crate::api::device_plugin_server::DevicePlugin;
use crate::api::{
    self, AllocateRequest, AllocateResponse, ContainerPreferredAllocationResponse, DevicePluginOptions, Empty,
    ListAndWatchResponse, NumaNode, PreStartContainerRequest, PreStartContainerResponse, PreferredAllocationRequest,
    PreferredAllocationResponse, TopologyInfo,
};
use crate::health::HealthMap;
use crate::held::Ledger;
use crate::metrics::Metrics;
use crate::resources::Resource;
use crate::topology::{self, Node};
use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{Notify, mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

/// The service: a resource, the health channel of its vendor, the ledger of what is held, and
/// how to answer.
pub struct Plugin {
    res: Arc<Resource>,
    ledger: Arc<Ledger>,
    health: watch::Receiver<HealthMap>,
    opts: Arc<AllocateOptions>,
    strict_topology: bool,
    metrics: Arc<Metrics>,
    stream_ended: Arc<Notify>,
    cdi: Arc<CdiCache>,
    /// Closed (its sender dropped) when the manager serving this plugin stops: every
    /// ListAndWatch stream then ends ([`Plugin::until`]).
    alive: Option<watch::Receiver<()>>,
}

/// The CDI names last read, with the stamp of the spec directories they were read from.
type CdiCache = Mutex<Option<(SpecDirsStamp, Arc<CdiNames>)>>;

/// What the spec directories hold, cheaply: every spec file's name, inode, size and mtime.
/// Another stamp means the CDI names are read again.
type SpecDirsStamp = Vec<(PathBuf, u64, u64, i64, i64)>;

fn spec_dirs_stamp(dirs: &[PathBuf]) -> SpecDirsStamp {
    let mut out = Vec::new();
    for d in dirs {
        let Ok(rd) = std::fs::read_dir(d) else { continue };
        for e in rd.flatten() {
            if let Ok(m) = e.metadata() {
                out.push((e.path(), m.ino(), m.size(), m.mtime(), m.mtime_nsec()));
            }
        }
    }
    out.sort();
    out
}

impl Plugin {
    /// A service for `res`. `stream_ended` is notified when a ListAndWatch stream ends (the
    /// kubelet went away), which the manager takes as a sign to re-register. `ledger` is shared
    /// by every resource's service.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        res: Arc<Resource>,
        ledger: Arc<Ledger>,
        health: watch::Receiver<HealthMap>,
        opts: Arc<AllocateOptions>,
        strict_topology: bool,
        metrics: Arc<Metrics>,
        stream_ended: Arc<Notify>,
    ) -> Plugin {
        Plugin {
            res,
            ledger,
            health,
            opts,
            strict_topology,
            metrics,
            stream_ended,
            cdi: Arc::new(Mutex::new(None)),
            alive: None,
        }
    }

    /// Ends every ListAndWatch stream once `alive`'s sender is dropped. The manager holds the
    /// sender while it serves: when it stops serving the resource (the DRA driver took the kind
    /// over, the devices changed) its task is aborted, and a server task aborted that way leaves
    /// the connections it accepted running, so without this the kubelet's stream stays open,
    /// the kubelet never marks the resource's devices unhealthy and keeps them allocatable
    /// (until its 5-minute grace for a vanished plugin). The stream's end is what makes it mark
    /// them at once (kubelet devicemanager: PluginDisconnected).
    pub fn until(mut self, alive: watch::Receiver<()>) -> Plugin {
        self.alive = Some(alive);
        self
    }

    /// The CDI names of the node's specs as they are now: read again when a spec file changed
    /// (the CDI generator rewrites them when a device appears or the driver changes).
    fn cdi_names(&self) -> Arc<CdiNames> {
        cdi_names(&self.res, &self.opts.spec_dirs, &self.cdi)
    }
}

/// The CDI names of `res` in the spec directories `dirs`, from `cache` while no spec file
/// changed.
fn cdi_names(res: &Resource, dirs: &[PathBuf], cache: &CdiCache) -> Arc<CdiNames> {
    let stamp = spec_dirs_stamp(dirs);
    let mut cached = cache.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((s, names)) = cached.as_ref()
        && *s == stamp
    {
        return names.clone();
    }
    let names = Arc::new(CdiNames::load(res, dirs));
    *cached = Some((stamp, names.clone()));
    names
}

/// How long Allocate waits for the node's CDI specs to define a device before refusing it.
pub const SPEC_WAIT: Duration = Duration::from_secs(15);

/// How often ListAndWatch looks at the spec directories (a directory listing and a `stat` per
/// file; the specs are parsed again only when one changed).
pub const SPEC_POLL: Duration = Duration::from_secs(1);

/// The ListAndWatch device list of `res` under `health`: every unit with its health (a
/// device's state covers its MIG devices and replicas) and its NUMA node (no topology when
/// unknown).
///
/// `withdrawn`: IDs whose hardware is held through another resource (crate::held): Unhealthy,
/// so the kubelet neither counts nor hands them out while that lasts.
///
/// `cdi`: the CDI names of the node's specs, when Allocate answers with CDI names (the
/// `cdi-cri` and `cdi-annotations` strategies). A whole device that no spec names is reported
/// Unhealthy, since Allocate cannot answer for it: the kubelet then neither counts it as
/// allocatable nor admits a pod onto it, until the node's CDI generator has written the spec
/// (right after the chart's pod starts, or when the generator stopped).
pub fn device_list(
    res: &Resource,
    health: &HealthMap,
    cdi: Option<&CdiNames>,
    withdrawn: &BTreeSet<String>,
) -> Vec<api::Device> {
    // An MPS resource is usable only while the node's MPS control daemon runs.
    let mps_down = res.mps.as_ref().is_some_and(|m| !mps_daemon_running(&m.pipe_directory));
    res.units
        .iter()
        .map(|u| {
            let unnamed = u.mig.is_none() && cdi.is_some_and(|c| c.get(u.device).is_none());
            api::Device {
                id: u.id.clone(),
                health: if mps_down
                    || unnamed
                    || withdrawn.contains(&u.id)
                    || crate::health::unhealthy(health, u.target()).is_some()
                {
                    api::UNHEALTHY
                } else {
                    api::HEALTHY
                }
                .to_string(),
                topology: u.numa.map(|n| TopologyInfo { nodes: vec![NumaNode { id: i64::from(n) }] }),
            }
        })
        .collect()
}

/// Whether an MPS control daemon serves `pipe_dir`: its `control` FIFO is there.
pub fn mps_daemon_running(pipe_dir: &std::path::Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::metadata(pipe_dir.join("control")).is_ok_and(|m| m.file_type().is_fifo())
}

fn count_health(list: &[api::Device]) -> (u64, u64) {
    let healthy = list.iter().filter(|d| d.health == api::HEALTHY).count() as u64;
    (healthy, list.len() as u64 - healthy)
}

impl Plugin {
    /// Kubelet IDs to unit positions in `res.units` (what the topology code numbers).
    fn ids_to_positions(&self, ids: &[String], what: &str) -> Result<Vec<u32>, Status> {
        let mut out = Vec::new();
        let mut unknown = Vec::new();
        for id in ids {
            match self.res.units.iter().position(|u| u.id == *id) {
                Some(p) => out.push(p as u32),
                None => unknown.push(id.as_str()),
            }
        }
        if unknown.is_empty() {
            Ok(out)
        } else {
            Err(Status::invalid_argument(format!(
                "{}: unknown {what} device ID(s): {}",
                self.res.name,
                unknown.join(", ")
            )))
        }
    }

    /// The preferred units (positions) for one container request.
    fn choose(&self, avail: &[u32], must: &[u32], size: usize) -> Result<topology::Choice, topology::TopologyError> {
        let units = &self.res.units;
        if self.res.replicas > 1 {
            let targets: Vec<(u32, Option<u32>)> = units.iter().map(|u| u.target()).collect();
            return topology::preferred_replicas(&targets, avail, must, size);
        }
        if self.res.per_core {
            // Cores are numbered as the runtime counts them; positions map 1:1 onto them.
            let core_of = |p: &u32| units[*p as usize].core.unwrap_or(*p);
            let cores: BTreeMap<u32, u32> = units.iter().filter_map(|u| Some((u.core?, u.device))).collect();
            let a: Vec<u32> = avail.iter().map(core_of).collect();
            let m: Vec<u32> = must.iter().map(core_of).collect();
            let links: BTreeMap<u32, Vec<u32>> =
                self.res.vendor.devices.iter().map(|d| (d.index, d.links.clone())).collect();
            let mut c = topology::preferred_cores(&cores, &links, &a, &m, size)?;
            c.devices = c
                .devices
                .iter()
                .filter_map(|core| units.iter().position(|u| u.core == Some(*core)).map(|p| p as u32))
                .collect();
            return Ok(c);
        }
        // Whole or MIG devices: one node per unit; whole devices keep their device's links.
        let nodes: Vec<Node> = units
            .iter()
            .enumerate()
            .map(|(p, u)| {
                let links = match u.mig {
                    Some(_) => vec![],
                    None => {
                        let peers = self
                            .res
                            .vendor
                            .devices
                            .iter()
                            .find(|d| d.index == u.device)
                            .map(|d| d.links.clone())
                            .unwrap_or_default();
                        units
                            .iter()
                            .enumerate()
                            .filter(|(_, x)| x.mig.is_none() && peers.contains(&x.device))
                            .map(|(q, _)| q as u32)
                            .collect()
                    }
                };
                Node { index: p as u32, numa: u.numa, links }
            })
            .collect();
        topology::preferred(&nodes, avail, must, size)
    }
}

#[tonic::async_trait]
impl DevicePlugin for Plugin {
    async fn get_device_plugin_options(&self, _: Request<Empty>) -> Result<Response<DevicePluginOptions>, Status> {
        Ok(Response::new(crate::manager::options()))
    }

    type ListAndWatchStream = ReceiverStream<Result<ListAndWatchResponse, Status>>;

    async fn list_and_watch(&self, _: Request<Empty>) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let (tx, rx) = mpsc::channel(4);
        let res = self.res.clone();
        let mut health = self.health.clone();
        let metrics = self.metrics.clone();
        let ended = self.stream_ended.clone();
        let opts = self.opts.clone();
        let cache = self.cdi.clone();
        let ledger = self.ledger.clone();
        let mut held = ledger.subscribe();
        let mut alive = self.alive.clone();
        tokio::spawn(async move {
            let mut last: Option<Vec<api::Device>> = None;
            let mut unnamed_before: Vec<u32> = vec![];
            let mut withdrawn_before: BTreeSet<String> = BTreeSet::new();
            loop {
                held.borrow_and_update();
                let withdrawn = ledger.withdrawn(&res);
                if withdrawn != withdrawn_before {
                    tracing::info!(
                        "{}: {} device(s) withdrawn while their hardware is held through another resource{}",
                        res.name,
                        withdrawn.len(),
                        if withdrawn.is_empty() {
                            String::new()
                        } else {
                            format!(": {}", withdrawn.iter().cloned().collect::<Vec<_>>().join(", "))
                        }
                    );
                    withdrawn_before = withdrawn.clone();
                }
                let cdi = opts.names_cdi_devices().then(|| cdi_names(&res, &opts.spec_dirs, &cache));
                if let Some(c) = &cdi {
                    let unnamed: Vec<u32> =
                        res.vendor.devices.iter().map(|d| d.index).filter(|i| c.get(*i).is_none()).collect();
                    if unnamed != unnamed_before && !unnamed.is_empty() {
                        tracing::warn!(
                            "{}: no CDI spec names device(s) {unnamed:?} yet ({}); reported Unhealthy until one does",
                            res.name,
                            c.why_unnamed()
                        );
                    }
                    unnamed_before = unnamed;
                }
                let list = device_list(&res, &health.borrow_and_update(), cdi.as_deref(), &withdrawn);
                if last.as_ref() != Some(&list) {
                    let (h, u) = count_health(&list);
                    metrics.update(&res.name, |m| (m.healthy, m.unhealthy) = (h, u));
                    if tx.send(Ok(ListAndWatchResponse { devices: list.clone() })).await.is_err() {
                        break;
                    }
                    last = Some(list);
                }
                // An MPS resource also follows its daemon, and CDI names follow the spec files,
                // which no health event reports.
                let recheck = async {
                    if res.mps.is_some() {
                        tokio::time::sleep(Duration::from_millis(500)).await
                    } else if opts.names_cdi_devices() {
                        tokio::time::sleep(SPEC_POLL).await
                    } else {
                        std::future::pending::<()>().await
                    }
                };
                tokio::select! {
                    changed = health.changed() => if changed.is_err() { break },
                    _ = held.changed() => {}
                    _ = recheck => {}
                    _ = tx.closed() => break,
                    // Nothing is ever sent: only the manager's end (the sender dropped) wakes this.
                    _ = async {
                        match alive.as_mut() {
                            Some(a) => while a.changed().await.is_ok() {},
                            None => std::future::pending::<()>().await,
                        }
                    } => break,
                }
            }
            ended.notify_one();
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn get_preferred_allocation(
        &self,
        req: Request<PreferredAllocationRequest>,
    ) -> Result<Response<PreferredAllocationResponse>, Status> {
        let mut out = PreferredAllocationResponse::default();
        let withdrawn = self.ledger.withdrawn(&self.res);
        for c in req.into_inner().container_requests {
            let mut avail = self.ids_to_positions(&c.available_device_i_ds, "available")?;
            let must = self.ids_to_positions(&c.must_include_device_i_ds, "must-include")?;
            let size = usize::try_from(c.allocation_size).map_err(|_| {
                Status::invalid_argument(format!(
                    "{}: allocation_size {} is negative",
                    self.res.name, c.allocation_size
                ))
            })?;
            // Units withdrawn since the kubelet's last device list are not offered, while enough
            // others are (Allocate would refuse them).
            let usable: Vec<u32> = avail
                .iter()
                .copied()
                .filter(|p| must.contains(p) || !withdrawn.contains(&self.res.units[*p as usize].id))
                .collect();
            if usable.len() >= size {
                avail = usable;
            }
            let choice = self
                .choose(&avail, &must, size)
                .map_err(|e| Status::invalid_argument(format!("{}: {e}", self.res.name)))?;
            self.metrics.update(&self.res.name, |m| {
                m.preferred += 1;
                m.poor_placements += u64::from(choice.note.is_some());
            });
            if let Some(note) = &choice.note {
                if self.strict_topology {
                    return Err(Status::failed_precondition(format!("{}: {note}", self.res.name)));
                }
                tracing::warn!("{}: {note}", self.res.name);
            }
            let ids =
                choice.devices.iter().filter_map(|p| self.res.units.get(*p as usize).map(|u| u.id.clone())).collect();
            out.container_responses.push(ContainerPreferredAllocationResponse { device_i_ds: ids });
        }
        Ok(Response::new(out))
    }

    async fn allocate(&self, req: Request<AllocateRequest>) -> Result<Response<AllocateResponse>, Status> {
        let containers = req.into_inner().container_requests;
        // A device no spec defines yet is waited for a while: right after the chart's pod
        // (re)starts, the plugin can be registered before its CDI generator has written the
        // node's specs, and a refused Allocate fails the pod for good (UnexpectedAdmissionError).
        let deadline = tokio::time::Instant::now() + SPEC_WAIT;
        'retry: loop {
            let cdi = if self.opts.names_cdi_devices() { self.cdi_names() } else { Arc::new(CdiNames::default()) };
            let mut out = AllocateResponse::default();
            for c in &containers {
                match container_response(&self.res, &c.devices_ids, &self.opts, &cdi) {
                    Ok(r) => out.container_responses.push(r),
                    Err(AllocateError::NoCdiName { .. }) if tokio::time::Instant::now() < deadline => {
                        tokio::time::sleep(Duration::from_millis(250)).await;
                        continue 'retry;
                    }
                    Err(e) => {
                        self.metrics.update(&self.res.name, |m| m.allocate_errors += 1);
                        return Err(Status::invalid_argument(e.to_string()));
                    }
                }
            }
            // Counts that add up, then no hardware held through another resource (crate::held).
            for c in &containers {
                let mut unavailable = self.ledger.held_ids(&self.res);
                unavailable.extend(self.ledger.withdrawn(&self.res));
                let checked = check_replica_spread(&self.res, &c.devices_ids, &unavailable)
                    .map_err(|e| e.to_string())
                    .and_then(|()| self.ledger.claim(&self.res, &c.devices_ids).map_err(|e| e.to_string()));
                if let Err(e) = checked {
                    self.metrics.update(&self.res.name, |m| m.allocate_errors += 1);
                    tracing::warn!("Allocate refused: {e}");
                    return Err(Status::invalid_argument(e));
                }
                let targets: BTreeSet<(u32, Option<u32>)> =
                    c.devices_ids.iter().filter_map(|id| self.res.unit(id)).map(|u| u.target()).collect();
                if targets.len() < c.devices_ids.len() && self.res.replicas > 1 {
                    tracing::warn!(
                        "{}: a container got {} replicas of {} device(s): no replica of another device was free, \
                         and it sees each device once",
                        self.res.name,
                        c.devices_ids.len(),
                        targets.len()
                    );
                }
            }
            let n = out.container_responses.len() as u64;
            self.metrics.update(&self.res.name, |m| m.allocations += n);
            return Ok(Response::new(out));
        }
    }

    async fn pre_start_container(
        &self,
        _: Request<PreStartContainerRequest>,
    ) -> Result<Response<PreStartContainerResponse>, Status> {
        Ok(Response::new(PreStartContainerResponse {}))
    }
}
