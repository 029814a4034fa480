//! The telemetry grant (issue 30): one extended resource (the chart names it `actk.dev/telemetry`)
//! whose one device gives a container the device nodes that NVML opens to read every NVIDIA GPU
//! of the node: `/dev/nvidiactl`, each GPU's `/dev/nvidiaN` and each MIG device's capability
//! nodes. It is how the chart's exporter reads NVIDIA GPUs without running privileged: a pod can
//! be given device nodes it did not ask the kubelet for only by running privileged, and this is
//! the kubelet's own way of asking (device plugin API v1beta1 `DeviceSpec`s, which the kubelet
//! hands to the runtime as CRI devices, whatever runtime and strategies the node uses).
//!
//! What it hands out is every GPU's control path, so it is an authority like a GPU itself: the
//! chart serves it only together with its ValidatingAdmissionPolicy, which refuses every pod
//! that asks for it unless it runs in the release's namespace under the exporter's service
//! account (deploy/helm templates/exporter.yaml, docs/telemetry.md). The grant holds no GPU: it
//! never enters the ledger of held units (crate::held), and the exporter's attribution skips
//! it, as no vendor's kind is in its domain (actk-holders `vendors_of`).
//!
//! Served on every node the plugin runs on, whether or not the node has NVIDIA GPUs (the
//! exporter's DaemonSet asks for it on every node): on a node without them the answer is
//! empty. The answer is computed from a discovery at Allocate time, so it names the GPUs the
//! node has when the exporter's pod is admitted. The kubelet calls Allocate once per pod and
//! keeps the answer for its containers' restarts: a GPU (or a driver) that comes later reaches
//! the exporter with its next pod (docs/telemetry.md).

use crate::allocate::node_path;
use crate::api::device_plugin_server::DevicePlugin;
use crate::api::{
    self, AllocateRequest, AllocateResponse, ContainerAllocateResponse, ContainerPreferredAllocationResponse,
    DevicePluginOptions, DeviceSpec, Empty, ListAndWatchResponse, PreStartContainerRequest, PreStartContainerResponse,
    PreferredAllocationRequest, PreferredAllocationResponse,
};
use actk_core::inventory::Inventory;
use actk_core::profile::Profile;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::sync::{Notify, mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

/// The kubelet device ID of the grant's one device.
pub const GRANT_DEVICE_ID: &str = "telemetry";

/// The control node NVML opens before any GPU (nvidia-smi and NVML fail with "Driver Not
/// Loaded" without it). The other shared nodes (`/dev/nvidia-uvm`, `-uvm-tools`, `-modeset`)
/// are CUDA's and the display driver's: NVML reads without them, so the grant leaves them out.
pub const NVML_CONTROL_NODE: &str = "/dev/nvidiactl";

/// The Allocate answer of the grant on a node with `inventory`: a `DeviceSpec` (`rw`: NVML opens
/// them read-write; the host path with `host_mount` removed, the inventory's container path)
/// for each node NVML opens, of every vendor whose profile discovers through NVML
/// (`discovery = "nvidia"`): [`NVML_CONTROL_NODE`], every GPU's nodes, the MIG `monitor`
/// capability (/proc/driver/nvidia/capabilities/mig/monitor, which lets NVML read every MIG
/// device, as dcgm-exporter's pod gets it) and every MIG device's own capability nodes. No
/// mounts and no env: the exporter loads the driver's NVML from the host root it reads. Nodes
/// that are not character devices under the root are left out. Empty on a node without such
/// devices.
pub fn grant_response(inventory: &Inventory, profiles: &[Profile], host_mount: &Path) -> ContainerAllocateResponse {
    let mut resp = ContainerAllocateResponse::default();
    for vendor in &inventory.vendors {
        if !profiles.iter().any(|p| p.name == vendor.profile && p.discovery == "nvidia") || vendor.devices.is_empty() {
            continue;
        }
        let control = vendor.shared_nodes.iter().filter(|n| n.path == NVML_CONTROL_NODE);
        let gpus = vendor.devices.iter().flat_map(|d| &d.nodes);
        let monitor = vendor.mig_capabilities.get("monitor");
        let migs = vendor.devices.iter().flat_map(|d| d.mig.iter().flat_map(|m| &m.devices)).flat_map(|m| &m.nodes);
        for n in control.chain(gpus).chain(monitor).chain(migs) {
            // Only nodes the node has: discovery names capability nodes from the driver's
            // tables, which may not be made yet (`nvidia-modprobe -f` makes them on demand),
            // and a device spec whose host path is missing fails the container's creation.
            if resp.devices.iter().any(|d| d.container_path == n.path) || !is_char_device(&n.host_path) {
                continue;
            }
            resp.devices.push(DeviceSpec {
                container_path: n.path.clone(),
                host_path: node_path(host_mount, &n.host_path),
                permissions: "rw".into(),
            });
        }
    }
    resp
}

/// Checks `name` as the grant's resource name (`--telemetry-resource`): an extended resource
/// name (`<domain>/<name>`, crate::config::extended_resource_name_ok) that the kubelet takes
/// from a device plugin (not in `kubernetes.io` or a subdomain of it, no `requests.` prefix:
/// Kubernetes `IsExtendedResourceName`), and none that a profile in `profiles` serves, nor
/// such a name's time-slicing rename (`<name>.shared`), since the grant would then take that
/// resource's place at the kubelet. The error names the value and the fix.
pub fn check_resource_name(name: &str, profiles: &[Profile]) -> Result<(), String> {
    let fix = "use a name of its own such as actk.dev/telemetry (the chart's)";
    let domain = name.split_once('/').map(|(d, _)| d).unwrap_or_default();
    if !crate::config::extended_resource_name_ok(name)
        || domain == "kubernetes.io"
        || domain.ends_with(".kubernetes.io")
        || name.starts_with("requests.")
    {
        return Err(format!(
            "--telemetry-resource / ACTK_DEVICE_PLUGIN_TELEMETRY_RESOURCE {name:?} is not an extended resource \
             name the kubelet takes from a device plugin (<domain>/<name>, the domain outside kubernetes.io): {fix}"
        ));
    }
    let served = profiles.iter().flat_map(|p| &p.kubernetes.resources).find(|r| {
        name == r.as_str() || name.strip_suffix(".shared") == Some(r.as_str()) || name.starts_with(&format!("{r}."))
    });
    if let Some(r) = served {
        return Err(format!(
            "--telemetry-resource / ACTK_DEVICE_PLUGIN_TELEMETRY_RESOURCE {name:?} is (a variant of) {r}, which this \
             plugin serves for devices: {fix}"
        ));
    }
    Ok(())
}

fn is_char_device(p: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::metadata(p).is_ok_and(|m| m.file_type().is_char_device())
}

/// The grant's DevicePlugin service: one device, always Healthy; Allocate answers
/// [`grant_response`] of a discovery under `root` for each container.
pub struct TelemetryGrant {
    name: String,
    root: PathBuf,
    host_mount: PathBuf,
    profiles: Arc<Vec<Profile>>,
    stream_ended: Arc<Notify>,
    alive: watch::Receiver<()>,
}

impl TelemetryGrant {
    /// The service of resource `name` on the node whose root is `root` (as this process sees
    /// it, with the node's `/` at `host_mount`). `stream_ended` and `alive` as for
    /// [`crate::service::Plugin`].
    pub fn new(
        name: String,
        root: PathBuf,
        host_mount: PathBuf,
        profiles: Arc<Vec<Profile>>,
        stream_ended: Arc<Notify>,
        alive: watch::Receiver<()>,
    ) -> TelemetryGrant {
        TelemetryGrant { name, root, host_mount, profiles, stream_ended, alive }
    }
}

#[tonic::async_trait]
impl DevicePlugin for TelemetryGrant {
    async fn get_device_plugin_options(&self, _: Request<Empty>) -> Result<Response<DevicePluginOptions>, Status> {
        Ok(Response::new(crate::manager::options()))
    }

    type ListAndWatchStream = ReceiverStream<Result<ListAndWatchResponse, Status>>;

    async fn list_and_watch(&self, _: Request<Empty>) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let (tx, rx) = mpsc::channel(1);
        let ended = self.stream_ended.clone();
        let mut alive = self.alive.clone();
        tokio::spawn(async move {
            let one = api::Device { id: GRANT_DEVICE_ID.into(), health: api::HEALTHY.into(), topology: None };
            if tx.send(Ok(ListAndWatchResponse { devices: vec![one] })).await.is_ok() {
                tokio::select! {
                    _ = tx.closed() => {}
                    // Nothing is ever sent: only the manager's end (the sender dropped) wakes this.
                    _ = async { while alive.changed().await.is_ok() {} } => {}
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
            let size = usize::try_from(c.allocation_size).unwrap_or(0);
            // The must-include IDs first; the available list holds them too (device plugin API).
            let mut ids: Vec<String> = c.must_include_device_i_ds.clone();
            ids.extend(c.available_device_i_ds.iter().filter(|id| !c.must_include_device_i_ds.contains(id)).cloned());
            ids.truncate(size);
            out.container_responses.push(ContainerPreferredAllocationResponse { device_i_ds: ids });
        }
        Ok(Response::new(out))
    }

    async fn allocate(&self, req: Request<AllocateRequest>) -> Result<Response<AllocateResponse>, Status> {
        let containers = req.into_inner().container_requests;
        if let Some(bad) = containers.iter().flat_map(|c| &c.devices_ids).find(|id| *id != GRANT_DEVICE_ID) {
            return Err(Status::invalid_argument(format!(
                "unknown device ID {bad:?} for {}: it has one device, {GRANT_DEVICE_ID:?}",
                self.name
            )));
        }
        let (root, profiles) = (self.root.clone(), self.profiles.clone());
        let inventory = tokio::task::spawn_blocking(move || actk_core::discover::discover(&root, &profiles))
            .await
            .map_err(|e| Status::internal(format!("{}: discovery failed: {e}", self.name)))?;
        let one = grant_response(&inventory, &self.profiles, &self.host_mount);
        tracing::info!(
            "{}: granted {} device node(s) to {} container(s): {}",
            self.name,
            one.devices.len(),
            containers.len(),
            one.devices.iter().map(|d| d.container_path.as_str()).collect::<Vec<_>>().join(", ")
        );
        Ok(Response::new(AllocateResponse { container_responses: vec![one; containers.len()] }))
    }

    async fn pre_start_container(
        &self,
        _: Request<PreStartContainerRequest>,
    ) -> Result<Response<PreStartContainerResponse>, Status> {
        Ok(Response::new(PreStartContainerResponse {}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dgx_grant_is_nvidiactl_and_every_gpu_node_and_nothing_else() {
        let Some(f) = actk_testsupport::fixture::prepare("nvidia-dgx-h100").unwrap() else { return };
        let profiles = actk_core::profile::builtin();
        let inv = actk_core::discover::discover(&f.root, &profiles);
        let r = grant_response(&inv, &profiles, &f.root);
        let mut paths: Vec<&str> = r.devices.iter().map(|d| d.container_path.as_str()).collect();
        paths.sort();
        // The control node, the eight GPUs, the MIG monitor capability (the fixture's
        // /proc/driver/nvidia/capabilities/mig/monitor, nvidia-cap2); not CUDA's
        // /dev/nvidia-uvm, -uvm-tools nor -modeset, not the MIG config capability (nvidia-cap1).
        let mut want = vec!["/dev/nvidia-caps/nvidia-cap2".to_string(), "/dev/nvidiactl".into()];
        want.extend((0..8).map(|i| format!("/dev/nvidia{i}")));
        want.sort();
        assert_eq!(paths, want);
        for d in &r.devices {
            assert_eq!(d.host_path, d.container_path, "the node's path, the fixture root removed");
            assert_eq!(d.permissions, "rw");
        }
        assert!(r.mounts.is_empty() && r.envs.is_empty() && r.cdi_devices.is_empty(), "{r:?}");

        // A capability node the driver lists but nobody made yet is left out (a device spec
        // whose host path is missing would fail the exporter's container).
        std::fs::remove_file(f.path("/dev/nvidia-caps/nvidia-cap2")).unwrap();
        let r = grant_response(&inv, &profiles, &f.root);
        assert!(r.devices.iter().all(|d| !d.container_path.contains("nvidia-cap")), "{r:?}");
        assert_eq!(r.devices.len(), 9);
    }

    #[test]
    fn resource_names_that_are_not_the_grants_own_are_refused() {
        let profiles = actk_core::profile::builtin();
        assert_eq!(check_resource_name("actk.dev/telemetry", &profiles), Ok(()));
        assert_eq!(check_resource_name("example.com/nvml", &profiles), Ok(()));
        for bad in [
            "telemetry",
            "kubernetes.io/telemetry",
            "foo.kubernetes.io/telemetry",
            "requests.actk.dev/telemetry",
            "nvidia.com/gpu",
            "nvidia.com/gpu.shared",
            "aws.amazon.com/neuroncore",
            "amd.com/gpu",
        ] {
            let e = check_resource_name(bad, &profiles).unwrap_err();
            assert!(e.contains(&format!("{bad:?}")) && e.contains("actk.dev/telemetry"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_node_without_nvidia_gpus_is_granted_nothing() {
        for name in ["aws-inf2-48xlarge", "amd-mi300x"] {
            let Some(f) = actk_testsupport::fixture::prepare(name).unwrap() else { return };
            let profiles = actk_core::profile::builtin();
            let inv = actk_core::discover::discover(&f.root, &profiles);
            assert!(!inv.vendors.is_empty(), "{name} has devices");
            let r = grant_response(&inv, &profiles, &f.root);
            assert!(r.devices.is_empty(), "{name}: {r:?}");
        }
    }
}
