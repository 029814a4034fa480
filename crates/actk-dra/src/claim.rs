//! From an allocated ResourceClaim to its transient CDI spec and the NodePrepareResources answer:
//! pure functions over the claim (as the API server returned it), the node's inventory and the
//! profiles.
//!
//! The spec of claim `U` (its UID) has kind [`CLAIM_KIND`] (`actk.dev/claim`) and lives in
//! `<cdi dir>/actk.dev-claim_U.json` ([`spec_file_name`]). It is self-contained: it does not
//! name or need any other CDI spec on the node, so what the claim prepared is exactly what a
//! container of the claim gets. Its devices:
//! - `U-<device>` for each allocated device (`U-nvidia-0`): the device's own nodes;
//! - `U-<profile>-common` for each profile in the claim: the control nodes its devices need
//!   (never a node reserved to a capability, such as the NVSwitch nodes of `fabric`: the claim
//!   did not allocate them, whatever the driver's `--capabilities` says), driver files (every
//!   capability whose files exist, as `actk cdi generate` writes them), the
//!   ld.so.cache hook, the profile's env, and each of the profile's selection variables set to
//!   `void` (`NVIDIA_VISIBLE_DEVICES=void`). CDI env edits come after the image's and the pod's
//!   env and the last duplicate wins, so an image's `NVIDIA_VISIBLE_DEVICES=all` cannot make
//!   actk-runtime, actk-hook or another toolkit's hook add devices the claim did not allocate.
//!
//! Each allocated device answers with its own CDI name and, for the first device of each
//! (request, profile), the profile's common device, so a container that uses one request of
//! the claim gets the control nodes and driver files once.

use actk_core::cdi::generate::{DeviceNameStrategy, GenerateOptions, generate, reserved_to_capabilities};
use actk_core::cdi::spec::{ContainerEdits, Device as CdiDevice, Spec};
use actk_core::cdi::version::minimum_version;
use actk_core::inventory::{DeviceNode, HostFile, Inventory, VendorInventory};
use actk_core::profile::Profile;
use k8s_openapi::api::resource::v1::{DeviceAllocationConfiguration, DeviceRequestAllocationResult, ResourceClaim};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::slice::{DRIVER, device_name};

/// CDI kind of the transient claim specs.
pub const CLAIM_KIND: &str = "actk.dev/claim";

/// The claim as the kubelet names it in NodePrepareResources / NodeUnprepareResources. The three
/// fields together are its identity: the driver checks all of them against its checkpoint and
/// the API server, and [`check_uid`] before the UID becomes part of a file name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ClaimRef {
    /// metadata.namespace.
    pub namespace: String,
    /// metadata.uid.
    pub uid: String,
    /// metadata.name.
    pub name: String,
}

impl std::fmt::Display for ClaimRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{} (uid {})", self.namespace, self.name, self.uid)
    }
}

/// One prepared device, as NodePrepareResources answers it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreparedDevice {
    /// The claim's request this device was allocated for (without a `/subrequest` part).
    pub request: String,
    /// Pool name (the node's name).
    pub pool: String,
    /// Device name in the pool (`nvidia-0`).
    pub device: String,
    /// Qualified CDI names that give the device to a container.
    pub cdi_ids: Vec<String>,
}

/// A claim prepared in memory: its answer and its spec (not yet written).
#[derive(Debug, Clone, PartialEq)]
pub struct Prepared {
    /// The claim.
    pub claim: ClaimRef,
    /// Devices in allocation order.
    pub devices: Vec<PreparedDevice>,
    /// The transient spec; `None` when the claim has no device of this driver on this node.
    pub spec: Option<Spec>,
    /// Cores this claim holds of each device it shares (slice device name -> cores numbered
    /// within the device, 0 first), for devices whose profile shares `cores`: kept in the
    /// checkpoint so that the next claim on the device gets other cores.
    pub cores: BTreeMap<String, Vec<u32>>,
}

/// Why a claim cannot be prepared. Every message names the claim; the kubelet shows it in the
/// pod's events.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClaimError {
    /// The claim was not found in the API server.
    #[error("claim {claim}: not found in the API server: {message}")]
    NotFound {
        /// The claim.
        claim: ClaimRef,
        /// What the API server said.
        message: String,
    },
    /// The UID is not a UID in the RFC 4122 textual form (the API server's `metadata.uid`):
    /// refused before it names any file.
    #[error(
        "claim {}/{}: uid {} is not a UID (RFC 4122 form: 8-4-4-4-12 hexadecimal digits, as the API server assigns them); nothing was prepared or removed",
        .namespace, .name, .uid
    )]
    NotAUid {
        /// metadata.namespace as asked.
        namespace: String,
        /// metadata.name as asked.
        name: String,
        /// The UID as asked, quoted and shortened.
        uid: String,
    },
    /// The UID belongs to another claim: the checkpoint prepared it under another namespace or
    /// name, or the API server's object has another namespace or name.
    #[error("claim {claim}: uid {} belongs to another claim ({where_}); a claim's namespace, name and uid are checked together, nothing was prepared or removed", .claim.uid)]
    OtherClaim {
        /// The claim as asked.
        claim: ClaimRef,
        /// Where the other claim was seen (`the checkpoint`, `the API server`).
        where_: String,
    },
    /// The API server has another object under that name (deleted and created again).
    #[error("claim {claim}: the API server's claim of that name has uid {found}; it was deleted and created again")]
    UidMismatch {
        /// The claim.
        claim: ClaimRef,
        /// UID the API server has.
        found: String,
    },
    /// The claim has no allocation.
    #[error("claim {claim}: it is not allocated (status.allocation is empty)")]
    NotAllocated {
        /// The claim.
        claim: ClaimRef,
    },
    /// An allocated device of this driver is in another node's pool.
    #[error("claim {claim}: device {device} is in pool {pool}, not in this node's pool {node}")]
    OtherPool {
        /// The claim.
        claim: ClaimRef,
        /// Device name.
        device: String,
        /// Its pool.
        pool: String,
        /// This node.
        node: String,
    },
    /// An allocated device is not (or no longer) on this node.
    #[error("claim {claim}: device {device} is not on this node (it has {known}); nothing was prepared")]
    UnknownDevice {
        /// The claim.
        claim: ClaimRef,
        /// Device name.
        device: String,
        /// The devices this node has.
        known: String,
    },
    /// Configuration for this driver that it does not understand.
    #[error("claim {claim}: {message}")]
    Config {
        /// The claim.
        claim: ClaimRef,
        /// What is wrong and how to fix it.
        message: String,
    },
    /// Building the CDI spec failed.
    #[error("claim {claim}: cannot build its CDI spec: {message}")]
    Spec {
        /// The claim.
        claim: ClaimRef,
        /// Why.
        message: String,
    },
}

/// How claim specs are built.
#[derive(Debug, Clone, Default)]
pub struct SpecOptions {
    /// Where the node's `/` is mounted in the driver's container; removed from host paths in
    /// specs, which the node's container runtime reads (`/` when the driver sees the node's root
    /// as its own, or a simulated node's files are at the same path on the node).
    pub host_mount: PathBuf,
    /// Capabilities whose driver files the common devices mount (`None`: every capability whose
    /// files exist, as `actk cdi generate` does).
    pub capabilities: Option<Vec<String>>,
    /// Absolute path (on the node) of actk-hook for the ld.so.cache createContainer hook.
    pub ldcache_hook: Option<String>,
    /// The node's CUDA MPS control daemon, for claims whose DeviceConfig asks for MPS; `None`:
    /// such claims are refused (the node runs no MPS daemon the driver knows of).
    pub mps: Option<MpsNode>,
}

/// Where the node's MPS control daemon is (node paths, as the container runtime reads them).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MpsNode {
    /// The daemon's pipe directory (its `CUDA_MPS_PIPE_DIRECTORY`), mounted at
    /// [`actk_core::sharing::MPS_CONTAINER_PIPE_DIR`].
    pub pipe_directory: PathBuf,
    /// The directory its processes share as /dev/shm; `None`: not mounted (pods then need
    /// hostIPC).
    pub shm_directory: Option<PathBuf>,
}

/// Checks that `want.uid` is a UID in the RFC 4122 textual form (`8-4-4-4-12` hexadecimal
/// digits, either case), the form of every `metadata.uid` the API server assigns. A UID names the
/// claim's spec file ([`spec_file_name`]), so anything else (`x/../victim`, an empty string) is
/// refused before it can name a path.
///
/// Errors: [`ClaimError::NotAUid`] with the UID quoted and shortened.
#[allow(clippy::result_large_err)]
pub fn check_uid(want: &ClaimRef) -> Result<(), ClaimError> {
    let b = want.uid.as_bytes();
    let ok = b.len() == 36
        && b.iter().enumerate().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => *c == b'-',
            _ => c.is_ascii_hexdigit(),
        });
    if ok {
        return Ok(());
    }
    let short = |s: &str| actk_core::request::shorten(s);
    Err(ClaimError::NotAUid {
        namespace: short(&want.namespace),
        name: short(&want.name),
        uid: format!("{:?}", short(&want.uid)),
    })
}

/// File name of claim `uid`'s spec: `actk.dev-claim_<uid>.json`. Callers pass only UIDs that
/// passed [`check_uid`].
pub fn spec_file_name(uid: &str) -> String {
    format!("actk.dev-claim_{uid}.json")
}

/// The claim UID a spec file name belongs to, for specs this driver wrote.
pub fn uid_of_spec_file(name: &str) -> Option<&str> {
    name.strip_prefix("actk.dev-claim_")?.strip_suffix(".json")
}

/// Removes `host_mount` from the front of `p` (`/host/dev/nvidia0` -> `/dev/nvidia0`).
fn node_path(host_mount: &Path, p: &Path) -> PathBuf {
    match p.strip_prefix(host_mount) {
        Ok(rel) if host_mount != Path::new("/") && !host_mount.as_os_str().is_empty() => Path::new("/").join(rel),
        _ => p.to_path_buf(),
    }
}

/// `vendor` with host paths seen from the node and only the devices in `indexes`.
fn node_view(vendor: &VendorInventory, indexes: &BTreeSet<u32>, host_mount: &Path) -> VendorInventory {
    let fix_node = |n: &DeviceNode| DeviceNode { host_path: node_path(host_mount, &n.host_path), ..n.clone() };
    let mut v = vendor.clone();
    v.devices.retain(|d| indexes.contains(&d.index));
    for d in &mut v.devices {
        d.nodes = d.nodes.iter().map(fix_node).collect();
        for m in d.mig.iter_mut().flat_map(|m| m.devices.iter_mut()) {
            m.nodes = m.nodes.iter().map(fix_node).collect();
        }
    }
    v.shared_nodes = v.shared_nodes.iter().map(fix_node).collect();
    v.host_files =
        v.host_files.iter().map(|f| HostFile { host_path: node_path(host_mount, &f.host_path), ..f.clone() }).collect();
    v
}

/// The base request name of an allocation result's request (`gpu/large` -> `gpu`), which is
/// what containers name in `resources.claims[].request`.
pub fn base_request(request: &str) -> &str {
    request.split_once('/').map_or(request, |(base, _)| base)
}

/// Checks that `claim` (from the API server) is the one `want` names and prepares it on node
/// `node` (its pool) from `inventory`. `taken_cores` are the cores other prepared claims hold
/// of devices shared in `cores` (slice device name -> cores numbered within the device); a claim that consumed N cores of a
/// device gets its N lowest cores not taken, in `NEURON_RT_VISIBLE_CORES` ([`sharing_edits`]).
/// `made` maps each placement device of the claim (dynamic MIG, [`crate::mig`]) to the slice
/// device name of the MIG device made for it, which `inventory` holds; the answer keeps the
/// placement's name.
///
/// Errors: [`ClaimError::UidMismatch`], [`ClaimError::NotAllocated`], [`ClaimError::OtherPool`],
/// [`ClaimError::UnknownDevice`] (naming every such device and the node's devices),
/// [`ClaimError::Config`] (a DeviceConfig that is not valid, or asks for what the device or
/// node cannot do: MPS on a device that is not an NVIDIA GPU or on a node without an MPS
/// daemon, more cores than the device has free; a section of an entry for every request is
/// left out for a device it is not for when another device of the claim takes it,
/// [`crate::config::Skip`]),
/// [`ClaimError::Spec`].
// The error names the claim and the devices; it is built once per failed claim, so its size
// does not matter.
#[allow(clippy::result_large_err, clippy::too_many_arguments)]
pub fn prepare(
    want: &ClaimRef,
    claim: &ResourceClaim,
    node: &str,
    inventory: &Inventory,
    profiles: &[Profile],
    taken_cores: &BTreeMap<String, BTreeSet<u32>>,
    made: &BTreeMap<String, String>,
    opts: &SpecOptions,
) -> Result<Prepared, ClaimError> {
    check_uid(want)?;
    let meta = &claim.metadata;
    if meta.namespace.as_deref() != Some(want.namespace.as_str()) || meta.name.as_deref() != Some(want.name.as_str()) {
        return Err(ClaimError::OtherClaim { claim: want.clone(), where_: "the API server".into() });
    }
    let found = meta.uid.clone().unwrap_or_default();
    if found != want.uid {
        return Err(ClaimError::UidMismatch { claim: want.clone(), found });
    }
    let alloc = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .ok_or_else(|| ClaimError::NotAllocated { claim: want.clone() })?;
    let devices_alloc = alloc.devices.as_ref();
    let configs: &[DeviceAllocationConfiguration] = devices_alloc.and_then(|d| d.config.as_deref()).unwrap_or(&[]);
    let results: Vec<_> =
        devices_alloc.and_then(|d| d.results.as_ref()).into_iter().flatten().filter(|r| r.driver == DRIVER).collect();
    // slice device name -> (vendor position, device index, MIG device index)
    let mut by_name: BTreeMap<String, (usize, u32, Option<u32>)> = BTreeMap::new();
    for (vi, v) in inventory.vendors.iter().enumerate() {
        for d in v.devices.iter().filter(|d| !d.nodes.is_empty()) {
            by_name.insert(device_name(&v.profile, d.index), (vi, d.index, None));
            for m in d.mig.iter().filter(|m| m.enabled).flat_map(|m| &m.devices) {
                by_name.insert(crate::slice::mig_device_name(&v.profile, d.index, m), (vi, d.index, Some(m.index)));
            }
        }
    }
    let mut unknown = Vec::new();
    // request, device, vendor, index, MIG index
    let mut picked: Vec<(&str, &str, usize, u32, Option<u32>)> = Vec::new();
    // Which claim-wide DeviceConfig sections each result's device is for (config::Skip).
    let mut fits: Vec<(&DeviceRequestAllocationResult, crate::config::Skip)> = Vec::new();
    for r in &results {
        if r.pool != node {
            return Err(ClaimError::OtherPool {
                claim: want.clone(),
                device: r.device.clone(),
                pool: r.pool.clone(),
                node: node.to_string(),
            });
        }
        match by_name.get(made.get(&r.device).unwrap_or(&r.device)) {
            Some(&(vi, idx, mig)) => {
                picked.push((base_request(&r.request), &r.device, vi, idx, mig));
                let profile = profiles.iter().find(|p| p.name == inventory.vendors[vi].profile);
                fits.push((
                    r,
                    crate::config::Skip {
                        // A MIG device counts as taking MPS, so that a section for every
                        // request is refused on it rather than silently left out: MPS on MIG
                        // is not supported, and a container of both requests would be an MPS
                        // client of its MIG device too.
                        mps: profile.is_some_and(|p| p.discovery == "nvidia"),
                        neuron: profile.is_some_and(|p| p.selection.logical_core_size_env.is_some()),
                    },
                ));
            }
            None => unknown.push(r.device.clone()),
        }
    }
    // A claim-wide section is left out for a device it is not for only when another device of
    // the claim takes it; one that no device takes stays, and is refused naming the device.
    let any_mps = fits.iter().any(|(_, f)| f.mps);
    let any_neuron = fits.iter().any(|(_, f)| f.neuron);
    let mut shares: Vec<Share<'_>> = Vec::new();
    for (r, f) in &fits {
        let skip = crate::config::Skip { mps: any_mps && !f.mps, neuron: any_neuron && !f.neuron };
        let cfg = crate::config::for_request(configs, &r.request, skip)
            .map_err(|message| ClaimError::Config { claim: want.clone(), message })?;
        let &(vi, idx, mig) = &by_name[made.get(&r.device).unwrap_or(&r.device)];
        shares.push(Share { result: r, vendor: vi, index: idx, mig: mig.is_some(), config: cfg });
    }
    if !unknown.is_empty() {
        let known = if by_name.is_empty() {
            "no devices".to_string()
        } else {
            by_name.keys().cloned().collect::<Vec<_>>().join(", ")
        };
        return Err(ClaimError::UnknownDevice { claim: want.clone(), device: unknown.join(", "), known });
    }
    if picked.is_empty() {
        return Ok(Prepared { claim: want.clone(), devices: Vec::new(), spec: None, cores: BTreeMap::new() });
    }
    let spec_err = |message: String| ClaimError::Spec { claim: want.clone(), message };
    // One generated per-kind spec per vendor, restricted to the claim's devices.
    let mut per_vendor: BTreeMap<usize, BTreeSet<u32>> = BTreeMap::new();
    for (_, _, vi, idx, _) in &picked {
        per_vendor.entry(*vi).or_default().insert(*idx);
    }
    let gen_opts = GenerateOptions {
        device_name_strategy: DeviceNameStrategy::Index,
        capabilities: opts.capabilities.clone(),
        ldcache_hook: opts.ldcache_hook.clone(),
        // Claim specs are read by DRA's runtimes (containerd 2, CRI-O), which read CDI 0.7.0: a
        // non-root pod gets the group of a node only that group may open (an AMD render node).
        additional_gids: true,
    };
    let mut generated: BTreeMap<usize, Spec> = BTreeMap::new();
    for (vi, idxs) in &per_vendor {
        let v = &inventory.vendors[*vi];
        let profile = profiles
            .iter()
            .find(|p| p.name == v.profile)
            .ok_or_else(|| spec_err(format!("no profile named {:?} is loaded", v.profile)))?;
        let view = node_view(v, idxs, &opts.host_mount);
        let mut spec = generate(profile, &view, &gen_opts).map_err(|e| spec_err(e.to_string()))?;
        // Only the nodes the allocated devices need: a capability (`fabric`, or `all` in
        // --capabilities) chooses files here, never nodes the claim did not allocate.
        spec.container_edits.device_nodes.retain(|n| !reserved_to_capabilities(profile, &n.path));
        for var in &profile.selection.env {
            spec.container_edits.env.push(format!("{var}=void"));
        }
        // The claim's devices as the vendor's software names them (HABANA_VISIBLE_MODULES).
        let idxs: Vec<u32> = idxs.iter().copied().collect();
        for (name, value) in profile.device_env_for(v, &idxs) {
            spec.container_edits.env.push(format!("{name}={value}"));
        }
        generated.insert(*vi, spec);
    }
    let sharing = sharing_edits(want, &shares, inventory, profiles, taken_cores, opts)?;
    let mut cdi_devices: Vec<CdiDevice> = Vec::new();
    for (vi, spec) in &generated {
        let mut edits = spec.container_edits.clone();
        if let Some(extra) = sharing.edits.get(vi) {
            edits.env.extend(extra.env.iter().cloned());
            edits.mounts.extend(extra.mounts.iter().cloned());
        }
        cdi_devices.push(CdiDevice {
            name: common_name(&want.uid, &inventory.vendors[*vi].profile),
            container_edits: edits,
            ..Default::default()
        });
        // MPS edits on a device of their own, given only with the requests that asked for MPS:
        // a container of another request of the claim is no MPS client.
        if let Some(mps) = sharing.mps.get(vi) {
            cdi_devices.push(CdiDevice {
                name: mps_name(&want.uid, &inventory.vendors[*vi].profile),
                container_edits: mps.clone(),
                ..Default::default()
            });
        }
    }
    let mut prepared = Vec::new();
    let mut common_given: BTreeSet<(&str, usize)> = BTreeSet::new();
    let mut mps_given: BTreeSet<(&str, usize)> = BTreeSet::new();
    for (request, device, vi, idx, mig) in &picked {
        let spec = &generated[vi];
        let edits: ContainerEdits = match mig {
            // The parent GPU's node and the instance's capability nodes, as
            // nvidia-container-toolkit injects a MIG device.
            Some(m) => {
                let view = node_view(&inventory.vendors[*vi], &BTreeSet::from([*idx]), &opts.host_mount);
                let e = actk_core::cdi::generate::mig_edits(&view, &[(*idx, *m)]);
                if e.device_nodes.is_empty() {
                    return Err(spec_err(format!("MIG device {device} has no usable device node")));
                }
                e
            }
            None => spec
                .devices
                .iter()
                .find(|d| d.name == idx.to_string())
                .map(|d| d.container_edits.clone())
                .ok_or_else(|| spec_err(format!("device {device} has no usable device node")))?,
        };
        let name = format!("{}-{device}", want.uid);
        if !cdi_devices.iter().any(|d| d.name == name) {
            cdi_devices.push(CdiDevice { name: name.clone(), container_edits: edits, ..Default::default() });
        }
        let mut ids = Vec::new();
        if common_given.insert((request, *vi)) {
            ids.push(format!("{CLAIM_KIND}={}", common_name(&want.uid, &inventory.vendors[*vi].profile)));
        }
        if sharing.mps.contains_key(vi)
            && sharing.mps_requests.contains(&(request.to_string(), *vi))
            && mps_given.insert((request, *vi))
        {
            ids.push(format!("{CLAIM_KIND}={}", mps_name(&want.uid, &inventory.vendors[*vi].profile)));
        }
        ids.push(format!("{CLAIM_KIND}={name}"));
        prepared.push(PreparedDevice {
            request: request.to_string(),
            pool: node.to_string(),
            device: device.to_string(),
            cdi_ids: ids,
        });
    }
    let mut spec = Spec {
        cdi_version: String::new(),
        kind: CLAIM_KIND.into(),
        devices: cdi_devices,
        container_edits: ContainerEdits::default(),
        ..Default::default()
    };
    spec.cdi_version = minimum_version(&spec).to_string();
    Ok(Prepared { claim: want.clone(), devices: prepared, spec: Some(spec), cores: sharing.cores })
}

/// One allocation result of this driver, with the configuration that applies to its request.
struct Share<'a> {
    result: &'a DeviceRequestAllocationResult,
    vendor: usize,
    index: u32,
    mig: bool,
    config: Option<crate::config::DeviceConfig>,
}

/// What sharing adds to a claim: env for each vendor's common device (its cores), MPS client
/// env and mounts for each vendor's MPS device with the requests that asked for MPS, and the
/// cores the claim now holds.
#[derive(Default)]
struct SharingEdits {
    edits: BTreeMap<usize, ContainerEdits>,
    mps: BTreeMap<usize, ContainerEdits>,
    /// (request, vendor) of every result whose config is `sharing.strategy: MPS`.
    mps_requests: BTreeSet<(String, usize)>,
    cores: BTreeMap<String, Vec<u32>>,
}

/// A vendor's MPS clients in one claim: the largest share of a GPU's memory it holds (percent),
/// each GPU's pinned memory limit (UUID, MiB), and the configured thread percentage.
#[derive(Default)]
struct MpsShare {
    percent: u32,
    limits: Vec<(String, u64)>,
    configured: Option<u32>,
}

/// The consumed amount of capacity `name` of a shared result (`shareID` set), in its unit
/// (bytes for `memory`); `Ok(None)` for a result that is not shared (the whole device).
///
/// Errors: a shared result that names no amount of `name`, or one that is not a whole
/// quantity: the driver cannot tell the claim's part, and the whole device is not the claim's.
fn consumed(r: &DeviceRequestAllocationResult, name: &str) -> Result<Option<u64>, String> {
    if r.share_id.is_none() {
        return Ok(None);
    }
    match r.consumed_capacity.as_ref().and_then(|c| c.get(name)) {
        None => Err(format!(
            "the allocation of device {} is shared but names no consumed {name}; the driver cannot tell the claim's part of the device",
            r.device
        )),
        Some(q) => crate::config::quantity_bytes(&q.0).map(Some).ok_or_else(|| {
            format!("the consumed {name} of device {} is {:?}, which is not a whole quantity", r.device, q.0)
        }),
    }
}

/// Per-claim edits of shared devices and of configured MPS, by vendor:
/// - a result that consumed `cores` (KEP-5075, `shareID` set) gets that many free cores of its
///   device; the vendor's cores variable (`NEURON_RT_VISIBLE_CORES`) then lists them, with every
///   core of the claim's whole devices of that vendor; with `neuron.logicalCoreSize` L the
///   cores come in aligned groups of L, the variable counts logical cores and the logical core
///   size variable (`NEURON_LOGICAL_NC_CONFIG`) says L;
/// - `sharing.strategy: MPS` (NVIDIA GPUs): the MPS client environment
///   ([`actk_core::sharing::mps_client_env`]) with each GPU's pinned memory limit (the config's
///   `pinnedMemoryLimit`, else the memory the claim consumed, else the GPU's) and active thread
///   percentage (the config's, else the largest share of a GPU's memory the claim holds), and
///   the daemon's pipe directory (and shm) mounted;
/// - time-slicing (the default) adds nothing: the device is the device, as for the device
///   plugin's time-slicing replicas.
#[allow(clippy::result_large_err)]
fn sharing_edits(
    want: &ClaimRef,
    shares: &[Share<'_>],
    inventory: &Inventory,
    profiles: &[Profile],
    taken_cores: &BTreeMap<String, BTreeSet<u32>>,
    opts: &SpecOptions,
) -> Result<SharingEdits, ClaimError> {
    use crate::config::Strategy;
    let config_err = |message: String| ClaimError::Config { claim: want.clone(), message };
    let mut out = SharingEdits::default();
    let mut taken = taken_cores.clone();
    // vendor -> cores the claim's containers see, when any of its devices is shared in cores
    let mut cores_of: BTreeMap<usize, Vec<u32>> = BTreeMap::new();
    let mut whole_cores: BTreeMap<usize, Vec<u32>> = BTreeMap::new();
    // vendor -> logical core size the claim configured
    let mut lnc_of: BTreeMap<usize, u32> = BTreeMap::new();
    let mut mps: BTreeMap<usize, MpsShare> = BTreeMap::new();
    for sh in shares {
        let v = &inventory.vendors[sh.vendor];
        let Some(profile) = profiles.iter().find(|p| p.name == v.profile) else { continue };
        let Some(dev) = v.devices.iter().find(|d| d.index == sh.index) else { continue };
        let r = sh.result;
        let numbers = actk_core::sharing::core_numbers(v, 1);
        let range = numbers.as_ref().and_then(|n| n.get(&sh.index)).cloned();
        // Logical NeuronCores: the claim's setting for this request, one per vendor in a claim.
        let configured_lnc = sh.config.as_ref().and_then(|c| c.neuron.as_ref()).and_then(|n| n.logical_core_size);
        if let Some(l) = configured_lnc {
            let Some(var) = profile.selection.logical_core_size_env.as_deref() else {
                return Err(config_err(format!(
                    "neuron.logicalCoreSize is for Neuron devices; device {} is a {} device",
                    r.device, v.kind
                )));
            };
            match lnc_of.insert(sh.vendor, l) {
                Some(other) if other != l => {
                    return Err(config_err(format!(
                        "neuron.logicalCoreSize is {other} for one request and {l} for another; a container has one {var}"
                    )));
                }
                _ => {}
            }
        }
        let lnc = configured_lnc.unwrap_or(1);
        if profile.selection.cores_env.is_some()
            && let Some(range) = range
        {
            let logical = |cores: &[u32]| cores.iter().step_by(lnc as usize).map(|c| c / lnc).collect::<Vec<u32>>();
            match consumed(r, "cores").map_err(config_err)? {
                Some(n) => {
                    let n = u32::try_from(n).unwrap_or(u32::MAX);
                    if n % lnc != 0 {
                        return Err(config_err(format!(
                            "the claim consumed {n} cores of device {}, which are not whole logical cores of neuron.logicalCoreSize {lnc}; request a multiple of {lnc}",
                            r.device
                        )));
                    }
                    // Held cores are kept by device and core within it, so that a change in the
                    // node's other devices (one gone, global numbers shifted) cannot move them.
                    let held: BTreeSet<u32> =
                        taken.get(&r.device).into_iter().flatten().map(|c| range.start + c).collect();
                    let got = actk_core::sharing::pick_core_groups(range.clone(), &held, n / lnc, lnc)
                        .ok_or_else(|| {
                            config_err(format!(
                                "device {} has {} cores, {} of them held by other claims on this node; this claim consumed {n}{}",
                                r.device,
                                range.len(),
                                held.len(),
                                if lnc > 1 { format!(" in aligned groups of {lnc}") } else { String::new() }
                            ))
                        })?;
                    let local: Vec<u32> = got.iter().map(|c| c - range.start).collect();
                    taken.entry(r.device.clone()).or_default().extend(&local);
                    cores_of.entry(sh.vendor).or_default().extend(logical(&got));
                    // Two results of one claim may share the same device: it holds the cores of both.
                    out.cores.entry(r.device.clone()).or_default().extend(local);
                }
                None => {
                    let all: Vec<u32> = range.collect();
                    whole_cores.entry(sh.vendor).or_default().extend(logical(&all));
                }
            }
        }
        let strategy = sh.config.as_ref().and_then(|c| c.sharing.as_ref()).map(|s| s.strategy).unwrap_or_default();
        if strategy == Strategy::Mps {
            let field = "sharing.strategy: MPS";
            if profile.discovery != "nvidia" {
                return Err(config_err(format!(
                    "{field} is for NVIDIA GPUs; device {} is a {} device: use TimeSlicing",
                    r.device, v.kind
                )));
            }
            if sh.mig {
                return Err(config_err(format!(
                    "{field} on MIG device {} is not supported: a MIG device is a partition already; use TimeSlicing",
                    r.device
                )));
            }
            if opts.mps.is_none() {
                return Err(config_err(format!(
                    "{field}: this node's driver knows no MPS control daemon (the chart's dra.mps.pipeDirectory, flag --mps-pipe-directory); start one and set it, or use TimeSlicing"
                )));
            }
            let Some(uuid) = dev.uuid.clone() else {
                return Err(config_err(format!("{field}: device {} has no UUID to limit", r.device)));
            };
            let total: Option<u64> = dev.attributes.get("memory_bytes").and_then(|m| m.parse().ok());
            // A GPU without a memory capacity is shared in `shares`: no memory is consumed.
            let used = if total.is_some() { consumed(r, "memory").map_err(config_err)? } else { None };
            let m = sh.config.as_ref().and_then(|c| c.sharing.as_ref()).and_then(|s| s.mps.as_ref());
            let limit = m
                .and_then(|m| m.pinned_memory_limit.as_ref())
                .and_then(|q| crate::config::quantity_bytes(&q.0))
                .or(used)
                .or(total)
                // The configured limit narrows the claim's part, never widens it.
                .map(|b| used.or(total).map_or(b, |cap| b.min(cap)));
            let percent = match (used, total) {
                (Some(c), Some(t)) if t > 0 => u32::try_from(c.saturating_mul(100).div_ceil(t)).unwrap_or(100),
                _ => 100,
            };
            out.mps_requests.insert((base_request(&r.request).to_string(), sh.vendor));
            let e = mps.entry(sh.vendor).or_default();
            e.percent = e.percent.max(percent);
            if let Some(p) = m.and_then(|m| m.active_thread_percentage) {
                e.configured = Some(e.configured.map_or(p, |q| q.max(p)));
            }
            if let Some(b) = limit {
                // MiB, never 0 (which MPS could read as no limit at all).
                e.limits.push((uuid, (b >> 20).max(1)));
            }
        }
    }
    for (vi, mut cores) in cores_of {
        let v = &inventory.vendors[vi];
        let Some(var) = profiles.iter().find(|p| p.name == v.profile).and_then(|p| p.selection.cores_env.clone())
        else {
            continue;
        };
        cores.extend(whole_cores.get(&vi).into_iter().flatten());
        out.edits.entry(vi).or_default().env.push(format!("{var}={}", actk_core::sharing::core_list(&cores)));
    }
    for (vi, l) in lnc_of {
        let v = &inventory.vendors[vi];
        if let Some(var) =
            profiles.iter().find(|p| p.name == v.profile).and_then(|p| p.selection.logical_core_size_env.clone())
        {
            out.edits.entry(vi).or_default().env.push(format!("{var}={l}"));
        }
    }
    for (vi, MpsShare { percent, limits, configured }) in mps {
        let Some(node) = opts.mps.as_ref() else { continue };
        let e = out.mps.entry(vi).or_default();
        for (k, v) in actk_core::sharing::mps_client_env(configured.unwrap_or(percent), &limits) {
            e.env.push(format!("{k}={v}"));
        }
        let bind = |host: &Path, container: &str| actk_core::cdi::spec::Mount {
            host_path: node_path(&opts.host_mount, host).display().to_string(),
            container_path: container.to_string(),
            mount_type: Some("bind".into()),
            options: vec!["rbind".into(), "rw".into(), "nosuid".into(), "nodev".into()],
        };
        e.mounts.push(bind(&node.pipe_directory, actk_core::sharing::MPS_CONTAINER_PIPE_DIR));
        if let Some(shm) = &node.shm_directory {
            e.mounts.push(bind(shm, "/dev/shm"));
        }
    }
    Ok(out)
}

/// CDI device name of `profile`'s MPS client edits in claim `uid`'s spec, given with the results
/// of the requests whose config is `sharing.strategy: MPS`.
pub fn mps_name(uid: &str, profile: &str) -> String {
    let p = device_name(profile, 0);
    format!("{uid}-{}-mps", p.trim_end_matches("-0"))
}

/// CDI device name of `profile`'s common edits in claim `uid`'s spec.
pub fn common_name(uid: &str, profile: &str) -> String {
    // device_name(profile, 0) minus "-0": the same DNS-label form as the devices'.
    let p = device_name(profile, 0);
    format!("{uid}-{}-common", p.trim_end_matches("-0"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn want(uid: &str) -> ClaimRef {
        ClaimRef { namespace: "tenant-a".into(), uid: uid.into(), name: "gpus".into() }
    }

    const UID: &str = "0b6f3c1e-1111-4c2a-9d7e-2f5a6b7c8d9e";

    #[test]
    fn uids_are_rfc_4122_text_and_nothing_else() {
        assert!(check_uid(&want(UID)).is_ok());
        assert!(check_uid(&want(&UID.to_ascii_uppercase())).is_ok());
        for bad in [
            "",
            "x/../victim",
            "0b6f3c1e-1111-4c2a-9d7e-2f5a6b7c8d9",
            "0b6f3c1e11114c2a9d7e2f5a6b7c8d9e0000",
            "0b6f3c1e-1111-4c2a-9d7e-2f5a6b7c8d9g",
            "0b6f3c1e-1111-4c2a-9d7e/2f5a6b7c8d9e",
        ] {
            let e = check_uid(&want(bad)).unwrap_err().to_string();
            assert!(e.starts_with(&format!("claim tenant-a/gpus: uid {bad:?} is not a UID")), "{e}");
        }
    }

    /// The API server's object must be the claim asked for in all three fields.
    #[test]
    fn the_api_object_must_have_the_namespace_and_name_asked_for() {
        let obj = |ns: &str, name: &str| -> ResourceClaim {
            serde_json::from_value(serde_json::json!({"metadata": {"namespace": ns, "name": name, "uid": UID},
                "spec": {"devices": {"requests": []}}, "status": {"allocation": {"devices": {"results": []}}}}))
            .unwrap()
        };
        let inv = Inventory::default();
        let opts = SpecOptions::default();
        assert!(
            prepare(
                &want(UID),
                &obj("tenant-a", "gpus"),
                "n",
                &inv,
                &[],
                &Default::default(),
                &Default::default(),
                &opts
            )
            .is_ok()
        );
        for (ns, name) in [("tenant-b", "gpus"), ("tenant-a", "other")] {
            let e =
                prepare(&want(UID), &obj(ns, name), "n", &inv, &[], &Default::default(), &Default::default(), &opts)
                    .unwrap_err();
            assert!(matches!(&e, ClaimError::OtherClaim { where_, .. } if where_ == "the API server"), "{e}");
        }
    }
}
