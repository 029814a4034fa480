//! The DevicePlugin gRPC service of one resource (kubelet device plugin API v1beta1).

use crate::allocate::{AllocateOptions, CdiNames, container_response};
use crate::api::device_plugin_server::DevicePlugin;
use crate::api::{
    self, AllocateRequest, AllocateResponse, ContainerPreferredAllocationResponse, DevicePluginOptions, Empty,
    ListAndWatchResponse, NumaNode, PreStartContainerRequest, PreStartContainerResponse, PreferredAllocationRequest,
    PreferredAllocationResponse, TopologyInfo,
};
use crate::health::HealthMap;
use crate::metrics::Metrics;
use crate::resources::Resource;
use crate::topology::{self, Node};
use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use tokio::sync::{Notify, mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

/// The service: a resource, the health channel of its vendor, and how to answer.
pub struct Plugin {
    res: Arc<Resource>,
    health: watch::Receiver<HealthMap>,
    opts: Arc<AllocateOptions>,
    strict_topology: bool,
    metrics: Arc<Metrics>,
    stream_ended: Arc<Notify>,
    cdi: Mutex<Option<(SpecDirsStamp, Arc<CdiNames>)>>,
}

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
    /// kubelet went away), which the manager takes as a sign to re-register.
    pub fn new(
        res: Arc<Resource>,
        health: watch::Receiver<HealthMap>,
        opts: Arc<AllocateOptions>,
        strict_topology: bool,
        metrics: Arc<Metrics>,
        stream_ended: Arc<Notify>,
    ) -> Plugin {
        Plugin { res, health, opts, strict_topology, metrics, stream_ended, cdi: Mutex::new(None) }
    }

    /// The CDI names of the node's specs as they are now: read again when a spec file changed
    /// (the CDI generator rewrites them when a device appears or the driver changes).
    fn cdi_names(&self) -> Arc<CdiNames> {
        let stamp = spec_dirs_stamp(&self.opts.spec_dirs);
        let mut cached = self.cdi.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((s, names)) = cached.as_ref()
            && *s == stamp
        {
            return names.clone();
        }
        let names = Arc::new(CdiNames::load(&self.res, &self.opts.spec_dirs));
        *cached = Some((stamp, names.clone()));
        names
    }
}

/// The ListAndWatch device list of `res` under `health`: every unit with its health and its
/// NUMA node (no topology when unknown).
pub fn device_list(res: &Resource, health: &HealthMap) -> Vec<api::Device> {
    res.units
        .iter()
        .map(|u| api::Device {
            id: u.id.clone(),
            health: if health.get(&u.device).is_some_and(Option::is_some) { api::UNHEALTHY } else { api::HEALTHY }
                .to_string(),
            topology: u.numa.map(|n| TopologyInfo { nodes: vec![NumaNode { id: i64::from(n) }] }),
        })
        .collect()
}

fn count_health(list: &[api::Device]) -> (u64, u64) {
    let healthy = list.iter().filter(|d| d.health == api::HEALTHY).count() as u64;
    (healthy, list.len() as u64 - healthy)
}

impl Plugin {
    fn ids_to_numbers(&self, ids: &[String], what: &str) -> Result<Vec<u32>, Status> {
        let mut out = Vec::new();
        let mut unknown = Vec::new();
        for id in ids {
            match self.res.unit(id) {
                Some(u) => out.push(u.core.unwrap_or(u.device)),
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

    fn number_to_id(&self, n: u32) -> Option<String> {
        self.res.units.iter().find(|u| u.core.unwrap_or(u.device) == n).map(|u| u.id.clone())
    }
}

#[tonic::async_trait]
impl DevicePlugin for Plugin {
    async fn get_device_plugin_options(&self, _: Request<Empty>) -> Result<Response<DevicePluginOptions>, Status> {
        Ok(Response::new(DevicePluginOptions { pre_start_required: false, get_preferred_allocation_available: true }))
    }

    type ListAndWatchStream = ReceiverStream<Result<ListAndWatchResponse, Status>>;

    async fn list_and_watch(&self, _: Request<Empty>) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let (tx, rx) = mpsc::channel(4);
        let res = self.res.clone();
        let mut health = self.health.clone();
        let metrics = self.metrics.clone();
        let ended = self.stream_ended.clone();
        tokio::spawn(async move {
            let mut last: Option<Vec<api::Device>> = None;
            loop {
                let list = device_list(&res, &health.borrow_and_update());
                if last.as_ref() != Some(&list) {
                    let (h, u) = count_health(&list);
                    metrics.update(&res.name, |m| (m.healthy, m.unhealthy) = (h, u));
                    if tx.send(Ok(ListAndWatchResponse { devices: list.clone() })).await.is_err() {
                        break;
                    }
                    last = Some(list);
                }
                tokio::select! {
                    changed = health.changed() => if changed.is_err() { break },
                    _ = tx.closed() => break,
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
        for c in req.into_inner().container_requests {
            let avail = self.ids_to_numbers(&c.available_device_i_ds, "available")?;
            let must = self.ids_to_numbers(&c.must_include_device_i_ds, "must-include")?;
            let size = usize::try_from(c.allocation_size).map_err(|_| {
                Status::invalid_argument(format!(
                    "{}: allocation_size {} is negative",
                    self.res.name, c.allocation_size
                ))
            })?;
            let choice = if self.res.per_core {
                let cores: BTreeMap<u32, u32> =
                    self.res.units.iter().filter_map(|u| Some((u.core?, u.device))).collect();
                topology::preferred_cores(&cores, &avail, &must, size)
            } else {
                let nodes: Vec<Node> = self
                    .res
                    .vendor
                    .devices
                    .iter()
                    .map(|d| Node { index: d.index, numa: d.numa_node, links: d.links.clone() })
                    .collect();
                topology::preferred(&nodes, &avail, &must, size)
            }
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
            let ids = choice.devices.iter().filter_map(|n| self.number_to_id(*n)).collect();
            out.container_responses.push(ContainerPreferredAllocationResponse { device_i_ds: ids });
        }
        Ok(Response::new(out))
    }

    async fn allocate(&self, req: Request<AllocateRequest>) -> Result<Response<AllocateResponse>, Status> {
        let mut out = AllocateResponse::default();
        let cdi = if self.opts.names_cdi_devices() { self.cdi_names() } else { Arc::new(CdiNames::default()) };
        for c in req.into_inner().container_requests {
            match container_response(&self.res, &c.devices_ids, &self.opts, &cdi) {
                Ok(r) => {
                    self.metrics.update(&self.res.name, |m| m.allocations += 1);
                    out.container_responses.push(r);
                }
                Err(e) => {
                    self.metrics.update(&self.res.name, |m| m.allocate_errors += 1);
                    return Err(Status::invalid_argument(e.to_string()));
                }
            }
        }
        Ok(Response::new(out))
    }

    async fn pre_start_container(
        &self,
        _: Request<PreStartContainerRequest>,
    ) -> Result<Response<PreStartContainerResponse>, Status> {
        Ok(Response::new(PreStartContainerResponse {}))
    }
}
