//! Allocate answers as pure functions: from a resource and the kubelet device IDs of one
//! container to a `ContainerAllocateResponse`, per combinable [`Strategy`]:
//!
//! - `cdi-cri`: `cdi_devices` with the qualified CDI names (`nvidia.com/gpu=0`), which the
//!   kubelet passes to the runtime through CRI (kubelet 1.28+, containerd 1.7+, CRI-O 1.23+);
//!   the names are those the node's spec files define ([`CdiNames`], field case F18: a spec
//!   with UUID names only gets UUID names, never an index name it does not have);
//! - `cdi-annotations`: the same names in the annotation `cdi.k8s.io/actk_<resource>` (CDI
//!   SPEC.md annotation form `cdi.k8s.io/<plugin>_<id>`), for runtimes that read CDI
//!   annotations but not the CRI field;
//! - `envvar`: the vendor's selection variable (`NVIDIA_VISIBLE_DEVICES=<UUIDs>`,
//!   `AWS_NEURON_VISIBLE_DEVICES=<ids>`), for actk-runtime or a vendor runtime/hook, and the same
//!   value in the resource's own variable (actk_core::request::per_resource_variable), since the
//!   kubelet keeps one value of a variable that two resources of a container set: actk-runtime,
//!   actk-hook and actk-nri take the union, so two MIG profiles in one container compose;
//! - `device-specs`: kubelet DeviceSpecs, mounts and env taken from the CDI container edits
//!   actk generates (actk_core::cdi::edits_for), which work with any runtime;
//! - `volume-mounts`: the device list, a read-only mount of `/dev/null` at
//!   `/var/run/actk/devices/<vendor>/<class>/<index>` per device (actk_core::policy
//!   `DEVICE_LIST_DIR`), which actk-runtime (and actk-hook) serve as the kubelet's allocation. No
//!   image and no pod without a `hostPath` volume can make such a mount, so on a node whose trust
//!   policy refuses env and annotation requests from unprivileged containers this is the strategy
//!   that cannot be widened (what NVIDIA's `volume-mounts` device list strategy does).
//!
//! A core resource (`aws.amazon.com/neuroncore`) always sets the cores variable
//! (`NEURON_RT_VISIBLE_CORES`): no CDI name or device node can select part of a device, so
//! without it the container would use every core of the devices it gets.

use crate::api::{CdiDevice, ContainerAllocateResponse, DeviceSpec, Mount};
use crate::resources::Resource;
use actk_core::cdi::{QualifiedName, Registry};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// Prefix of the CDI annotation keys (CDI SPEC.md "annotations").
pub const CDI_ANNOTATION_PREFIX: &str = "cdi.k8s.io/";

/// One way of telling the runtime which devices a container gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Strategy {
    /// `cdi_devices` in the response.
    CdiCri,
    /// `cdi.k8s.io/...` annotations.
    CdiAnnotations,
    /// The vendor's selection variable.
    EnvVar,
    /// Device specs, mounts and env from the CDI edits.
    DeviceSpecs,
    /// The device list: `/dev/null` mounted under `DEVICE_LIST_DIR`.
    VolumeMounts,
}

impl FromStr for Strategy {
    type Err = String;
    /// Parses `cdi-cri`, `cdi-annotations`, `envvar`, `device-specs` or `volume-mounts`.
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "cdi-cri" => Ok(Strategy::CdiCri),
            "cdi-annotations" => Ok(Strategy::CdiAnnotations),
            "envvar" => Ok(Strategy::EnvVar),
            "device-specs" => Ok(Strategy::DeviceSpecs),
            "volume-mounts" => Ok(Strategy::VolumeMounts),
            other => Err(format!("unknown allocate strategy {other:?}: use one or more of {STRATEGY_NAMES}")),
        }
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Strategy::CdiCri => "cdi-cri",
            Strategy::CdiAnnotations => "cdi-annotations",
            Strategy::EnvVar => "envvar",
            Strategy::DeviceSpecs => "device-specs",
            Strategy::VolumeMounts => "volume-mounts",
        })
    }
}

/// Every strategy name, for messages.
pub const STRATEGY_NAMES: &str = "cdi-cri, cdi-annotations, envvar, device-specs, volume-mounts";

/// Options of [`container_response`].
#[derive(Debug, Clone)]
pub struct AllocateOptions {
    /// Strategies, all applied.
    pub strategies: Vec<Strategy>,
    /// Where the node's `/` is mounted for the plugin: removed from host paths in device specs
    /// and mounts, since the kubelet reads them on the node (`/` when the plugin sees the node's
    /// root as its own).
    pub host_mount: PathBuf,
    /// Capabilities whose host files device specs mount (`None`: the profile's defaults, or
    /// every capability when the profile has none).
    pub capabilities: Option<Vec<String>>,
    /// Physical cores per logical core the core resources count in (Neuron LNC; 0/1: physical).
    pub logical_core_size: u32,
    /// The node runtime's CDI spec directories as this process sees them (under the host
    /// mount), lowest priority first: the CDI strategies name devices these specs define.
    pub spec_dirs: Vec<PathBuf>,
    /// Name the NRI gate's CDI device ([`actk_core::policy::NRI_GATE_CDI_NAME`]) in every
    /// answer's `cdi_devices`, whatever the strategies: actk-nri removes its mount from every
    /// container it serves, so one it did not serve fails naming the plugin.
    pub nri_gate: bool,
}

impl AllocateOptions {
    /// Whether a strategy hands out CDI names (then [`CdiNames`] are needed).
    pub fn names_cdi_devices(&self) -> bool {
        self.strategies.iter().any(|s| matches!(s, Strategy::CdiCri | Strategy::CdiAnnotations))
    }
}

/// Why an Allocate cannot be answered; the gRPC layer maps it to `InvalidArgument`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocateError {
    /// Device IDs the resource does not have.
    #[error("unknown device ID(s) for {resource}: {}; this node has {known}", .ids.join(", "))]
    UnknownIds {
        /// The resource name.
        resource: String,
        /// The IDs not found, as given.
        ids: Vec<String>,
        /// The IDs the resource has (abbreviated when long).
        known: String,
    },
    /// An empty request.
    #[error("allocate request for {0} names no device IDs")]
    Empty(String),
    /// More than one replica of a time-sliced resource that refuses that
    /// (`fail_requests_greater_than_one`, NVIDIA's `failRequestsGreaterThanOne`).
    #[error(
        "request for {count} {resource} is too large: {resource} is time-sliced ({replicas} replicas per device) with fail_requests_greater_than_one, so a container may ask for 1 (more replicas of one device would not add compute)"
    )]
    TooManyReplicas {
        /// The resource name.
        resource: String,
        /// IDs asked for.
        count: usize,
        /// Replicas per device.
        replicas: u32,
    },
    /// Replicas of a time-sliced resource that name fewer devices than replicas while replicas
    /// of other devices were free (issue 28 item 9): the container would see fewer devices than
    /// it asked for although the node had them (the kubelet did not follow the preferred
    /// allocation, which spreads before stacking).
    #[error(
        "request for {count} {resource} names {devices} device(s) ({named}) although replicas of {free} were free: a \
         container sees a device once however many of its replicas it holds, so it would get {devices} for {count}; \
         the kubelet did not follow the preferred allocation (which spreads replicas over devices), so create the pod \
         again"
    )]
    StackedReplicas {
        /// The resource name.
        resource: String,
        /// IDs asked for.
        count: usize,
        /// Distinct devices they name.
        devices: usize,
        /// Those devices (`0`, `1:4` for a MIG device).
        named: String,
        /// Devices with a free replica the request could have had instead (abbreviated).
        free: String,
    },
    /// A CDI strategy is on, but no spec in the node's spec directories defines the device
    /// (F18): handing out a name anyway would fail the container later as `unresolvable`.
    #[error(
        "{resource}: no CDI spec in {dirs} defines device {device}{uuid} ({defined}); write the node's specs \
         with `actk cdi generate --output DIR` (the chart's CDI generator does) or use the envvar or \
         device-specs strategy"
    )]
    NoCdiName {
        /// The resource name.
        resource: String,
        /// Index of the device.
        device: u32,
        /// ` (UUID)` when the device has one, else empty.
        uuid: String,
        /// The spec directories read.
        dirs: String,
        /// What the specs define for the kind.
        defined: String,
    },
}

/// The qualified CDI name the node's specs define for each device of a resource (F18).
///
/// A name is taken for a device when resolving it gives every device node of that device and
/// none of another device's (so `all`, or an index name that some other tool numbered
/// differently, is never taken for one device). Tried in order: the index (`nvidia.com/gpu=0`),
/// the UUID (`nvidia.com/gpu=GPU-…`), then every other name of the kind, sorted.
#[derive(Debug, Clone, Default)]
pub struct CdiNames {
    names: BTreeMap<u32, String>,
    dirs: String,
    defined: String,
}

impl CdiNames {
    /// Names for `res` from the specs in `registry`.
    pub fn from_registry(res: &Resource, registry: &Registry) -> CdiNames {
        let kind = &res.vendor.kind;
        let of_kind: Vec<QualifiedName> =
            registry.device_names().into_iter().filter(|n| &n.kind_string() == kind).collect();
        let node_paths = |d: &actk_core::inventory::Device| d.nodes.iter().map(|n| n.path.clone()).collect::<Vec<_>>();
        let mut names = BTreeMap::new();
        for d in &res.vendor.devices {
            let own = node_paths(d);
            if own.is_empty() {
                continue;
            }
            let others: BTreeSet<String> =
                res.vendor.devices.iter().filter(|o| o.index != d.index).flat_map(node_paths).collect();
            let fits = |name: &QualifiedName| match registry.resolve(std::slice::from_ref(name)) {
                Ok(edits) => {
                    let paths: BTreeSet<&str> = edits.device_nodes.iter().map(|n| n.path.as_str()).collect();
                    own.iter().all(|p| paths.contains(p.as_str())) && !paths.iter().any(|p| others.contains(*p))
                }
                Err(_) => false,
            };
            let mut candidates: Vec<String> = vec![d.index.to_string()];
            candidates.extend(d.uuid.clone());
            let preferred =
                candidates.iter().filter_map(|c| of_kind.iter().find(|n| n.to_string() == format!("{kind}={c}")));
            if let Some(n) = preferred.chain(of_kind.iter()).find(|n| fits(n)) {
                names.insert(d.index, n.to_string());
            }
        }
        let defined = if of_kind.is_empty() {
            format!("no spec there has kind {kind}")
        } else {
            let list: Vec<String> = of_kind.iter().map(|n| n.to_string()).collect();
            if list.len() > 6 {
                format!("they define {} names: {}, ..., {}", list.len(), list[..4].join(", "), list[list.len() - 1])
            } else {
                format!("they define {}", list.join(", "))
            }
        };
        let dirs = registry.dirs().iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", ");
        CdiNames { names, dirs, defined }
    }

    /// Names for `res` read now from the spec directories `dirs`.
    pub fn load(res: &Resource, dirs: &[PathBuf]) -> CdiNames {
        CdiNames::from_registry(res, &Registry::load(dirs))
    }

    /// Why a device has no name: the directories read and what their specs define for the kind.
    pub fn why_unnamed(&self) -> String {
        format!("{}; read {}", self.defined, self.dirs)
    }

    /// The qualified name for device `index`, if a spec defines one.
    pub fn get(&self, index: u32) -> Option<&str> {
        self.names.get(&index).map(String::as_str)
    }
}

fn known_ids(res: &Resource) -> String {
    let ids: Vec<&str> = res.units.iter().map(|u| u.id.as_str()).collect();
    if ids.len() > 8 {
        format!("{} IDs: {}, ..., {}", ids.len(), ids[..4].join(", "), ids[ids.len() - 1])
    } else if ids.is_empty() {
        "no devices".into()
    } else {
        ids.join(", ")
    }
}

/// The annotation key for a resource's CDI names: `cdi.k8s.io/actk_<resource>` with `/`
/// replaced by `_` (an annotation name allows letters, digits, `-`, `_`, `.`).
pub fn annotation_key(resource: &str) -> String {
    let name: String =
        resource.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '.' { c } else { '_' }).collect();
    format!("{CDI_ANNOTATION_PREFIX}actk_{name}")
}

/// Removes `host_mount` from the front of `p` (`/host/dev/nvidia0` -> `/dev/nvidia0`).
pub fn node_path(host_mount: &Path, p: &Path) -> String {
    match p.strip_prefix(host_mount) {
        Ok(rel) if host_mount != Path::new("/") => format!("/{}", rel.display()),
        _ => p.display().to_string(),
    }
}

/// The answer for one container asking for `ids` of `res`; `cdi` gives the CDI names (only
/// read when a CDI strategy is on).
///
/// Devices are de-duplicated and taken in inventory order (so the same IDs in another order
/// give the same answer). Errors: [`AllocateError::UnknownIds`] naming every unknown ID and
/// the IDs that exist; [`AllocateError::Empty`]; [`AllocateError::NoCdiName`] when a CDI
/// strategy is on and no spec defines one of the devices.
pub fn container_response(
    res: &Resource,
    ids: &[String],
    opts: &AllocateOptions,
    cdi: &CdiNames,
) -> Result<ContainerAllocateResponse, AllocateError> {
    if ids.is_empty() {
        return Err(AllocateError::Empty(res.name.clone()));
    }
    let unknown: Vec<String> = ids.iter().filter(|id| res.unit(id).is_none()).cloned().collect();
    if !unknown.is_empty() {
        return Err(AllocateError::UnknownIds { resource: res.name.clone(), ids: unknown, known: known_ids(res) });
    }
    let wanted: BTreeSet<&str> = ids.iter().map(String::as_str).collect();
    if res.fail_requests_greater_than_one && res.replicas > 1 && wanted.len() > 1 {
        return Err(AllocateError::TooManyReplicas {
            resource: res.name.clone(),
            count: wanted.len(),
            replicas: res.replicas,
        });
    }
    let units: Vec<_> = res.units.iter().filter(|u| wanted.contains(u.id.as_str())).collect();
    // What the container gets: whole devices and MIG devices, each once (two replicas of one
    // device are one device).
    let mut targets: Vec<(u32, Option<u32>)> = Vec::new();
    for u in &units {
        if !targets.contains(&u.target()) {
            targets.push(u.target());
        }
    }
    let devices: Vec<u32> = targets.iter().filter(|(_, m)| m.is_none()).map(|(d, _)| *d).collect();
    let migs: Vec<(u32, u32)> = targets.iter().filter_map(|(d, m)| Some((*d, (*m)?))).collect();
    let mut resp = ContainerAllocateResponse::default();
    let mut names: Vec<String> = Vec::new();
    if opts.names_cdi_devices() {
        for (d, m) in &targets {
            if let Some(m) = m {
                // MIG devices by their `GPU:MIG` index name, which `actk cdi generate` writes.
                names.push(format!("{}={d}:{m}", res.vendor.kind));
                continue;
            }
            match cdi.get(*d) {
                Some(n) => names.push(n.to_string()),
                None => {
                    let uuid = res.vendor.devices.iter().find(|x| x.index == *d).and_then(|x| x.uuid.clone());
                    return Err(AllocateError::NoCdiName {
                        resource: res.name.clone(),
                        device: *d,
                        uuid: uuid.map(|u| format!(" ({u})")).unwrap_or_default(),
                        dirs: cdi.dirs.clone(),
                        defined: cdi.defined.clone(),
                    });
                }
            }
        }
    }
    let sel = &res.profile.selection;
    if res.per_core
        && let Some(var) = &sel.cores_env
    {
        let mut cores: Vec<u32> = units.iter().filter_map(|u| u.core).collect();
        cores.dedup();
        resp.envs.insert(var.clone(), cores.iter().map(u32::to_string).collect::<Vec<_>>().join(","));
        // Logical cores (LNC > 1): the runtime must count them the same way.
        if let Some(lnc_var) = &sel.logical_core_size_env
            && opts.logical_core_size > 1
        {
            resp.envs.insert(lnc_var.clone(), opts.logical_core_size.to_string());
        }
    }
    if let Some(mps) = &res.mps {
        mps_edits(res, mps, &devices, &mut resp);
    }
    // The devices as the vendor's software names them (HABANA_VISIBLE_MODULES = their module
    // ids), whatever strategy names the devices: as Habana's device plugin answers.
    for (name, value) in res.profile.device_env_for(&res.vendor, &devices) {
        resp.envs.insert(name, value);
    }
    for s in &opts.strategies {
        match s {
            Strategy::CdiCri => resp.cdi_devices.extend(names.iter().map(|n| CdiDevice { name: n.clone() })),
            Strategy::CdiAnnotations => {
                resp.annotations.insert(annotation_key(&res.name), names.join(","));
            }
            Strategy::EnvVar => {
                if let Some(var) = sel.env.first() {
                    let value = env_value(res, &targets);
                    // The kubelet keeps one value of `var` when several resources of the vendor
                    // answer one container; the runtime takes the union of these (issue 28 item 10).
                    resp.envs.insert(actk_core::request::per_resource_variable(var, &res.name), value.clone());
                    resp.envs.insert(var.clone(), value);
                }
            }
            Strategy::DeviceSpecs => device_specs(res, &devices, &migs, opts, &mut resp),
            Strategy::VolumeMounts => {
                for (d, m) in &targets {
                    let name = match m {
                        Some(m) => format!("{d}:{m}"),
                        None => d.to_string(),
                    };
                    resp.mounts.push(Mount {
                        container_path: format!("{}/{}/{name}", actk_core::policy::DEVICE_LIST_DIR, res.vendor.kind),
                        host_path: actk_core::policy::DEVICE_LIST_SOURCE.into(),
                        read_only: true,
                    });
                }
            }
        }
    }
    // Devices handed out only as CDI names: each of the profile's selection variables is set to
    // `void`, as the DRA driver's claim specs set them (crates/actk-dra/src/claim.rs) and as
    // NVIDIA's stack does on both of its paths (the common edits of `nvidia-ctk cdi generate`
    // that its device plugin's CDI answers use, and its DRA driver's claim specs): the kubelet's
    // env overrides the image's, so a CUDA image's NVIDIA_VISIBLE_DEVICES=all cannot make a
    // legacy hook on the node add GPUs the kubelet did not allocate. Where another strategy
    // speaks through the env or the device list, that strategy's answer stands.
    if opts.strategies.iter().all(|s| matches!(s, Strategy::CdiCri | Strategy::CdiAnnotations)) {
        for var in &sel.env {
            resp.envs.entry(var.clone()).or_insert_with(|| "void".into());
        }
    }
    if opts.nri_gate {
        // The CRI field (kubelet 1.28+), which containerd and CRI-O resolve as CDI devices
        // whatever strategies hand out the devices themselves.
        resp.cdi_devices.push(CdiDevice { name: actk_core::policy::NRI_GATE_CDI_NAME.into() });
    }
    Ok(resp)
}

/// Checks that replicas of a time-sliced resource add up (issue 28 item 9): `ids` asked by one
/// container name as many devices as IDs, unless no replica of another device was free.
/// `unavailable`: IDs of `res` held by other containers or withdrawn (crate::held), which the
/// kubelet could not have given instead. A resource without replicas always passes.
///
/// Errors: [`AllocateError::StackedReplicas`] naming the devices asked for and those that had a
/// free replica.
pub fn check_replica_spread(
    res: &Resource,
    ids: &[String],
    unavailable: &BTreeSet<String>,
) -> Result<(), AllocateError> {
    if res.replicas <= 1 {
        return Ok(());
    }
    let wanted: BTreeSet<&str> = ids.iter().map(String::as_str).collect();
    let mut named: Vec<(u32, Option<u32>)> = Vec::new();
    for u in res.units.iter().filter(|u| wanted.contains(u.id.as_str())) {
        if !named.contains(&u.target()) {
            named.push(u.target());
        }
    }
    if named.len() >= wanted.len() {
        return Ok(());
    }
    let mut free: Vec<(u32, Option<u32>)> = Vec::new();
    for u in &res.units {
        let t = u.target();
        if !wanted.contains(u.id.as_str()) && !unavailable.contains(&u.id) && !named.contains(&t) && !free.contains(&t)
        {
            free.push(t);
        }
    }
    if free.is_empty() {
        return Ok(());
    }
    let show = |t: &[(u32, Option<u32>)]| {
        let mut v: Vec<String> = t
            .iter()
            .map(|(d, m)| match m {
                Some(m) => format!("{d}:{m}"),
                None => d.to_string(),
            })
            .collect();
        if v.len() > 6 {
            let n = v.len();
            v.truncate(4);
            v.push(format!("... {n} in all"));
        }
        v.join(", ")
    };
    Err(AllocateError::StackedReplicas {
        resource: res.name.clone(),
        count: wanted.len(),
        devices: named.len(),
        named: show(&named),
        free: show(&free),
    })
}

/// The selection variable's value: UUIDs for NVIDIA (NVIDIA_VISIBLE_DEVICES takes GPU UUIDs,
/// which do not change when indexes do), device indexes for others (AWS_NEURON_VISIBLE_DEVICES
/// and the other vendors' variables take indexes, not serial numbers).
fn env_value(res: &Resource, targets: &[(u32, Option<u32>)]) -> String {
    let uuids = res.profile.discovery == "nvidia";
    targets
        .iter()
        .map(|(idx, mig)| {
            let dev = res.vendor.devices.iter().find(|d| d.index == *idx);
            if let Some(m) = mig {
                // MIG devices by their UUID (NVIDIA_VISIBLE_DEVICES=MIG-...), as NVIDIA's plugin does.
                let m = dev.and_then(|d| d.mig.as_ref()).and_then(|x| x.devices.iter().find(|x| x.index == *m));
                return m.map(|m| m.uuid.clone()).unwrap_or_else(|| format!("{idx}:{}", mig.unwrap_or_default()));
            }
            match dev.and_then(|d| d.uuid.clone()).filter(|_| uuids) {
                Some(u) => u,
                None => idx.to_string(),
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// What an MPS client container needs (NVIDIA device plugin's MPS sharing): the daemon's pipe
/// directory at CUDA's default place, its shared memory as /dev/shm, and its share of the GPU:
/// `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` = 100 / replicas and `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`
/// = the GPU's memory / replicas (MiB, from NVML).
fn mps_edits(res: &Resource, mps: &crate::resources::Mps, devices: &[u32], resp: &mut ContainerAllocateResponse) {
    use crate::resources::MPS_CONTAINER_PIPE_DIR;
    let replicas = res.replicas.max(1);
    let limits: Vec<(String, u64)> = devices
        .iter()
        .filter_map(|d| {
            let dev = res.vendor.devices.iter().find(|x| x.index == *d)?;
            let mib: u64 = dev.attributes.get("memory_mib")?.parse().ok()?;
            Some((dev.uuid.clone()?, mib / u64::from(replicas)))
        })
        .collect();
    resp.envs.extend(actk_core::sharing::mps_client_env(100 / replicas, &limits));
    resp.mounts.push(Mount {
        container_path: MPS_CONTAINER_PIPE_DIR.into(),
        host_path: mps.pipe_directory.display().to_string(),
        read_only: false,
    });
    if let Some(shm) = &mps.shm_directory {
        resp.mounts.push(Mount {
            container_path: "/dev/shm".into(),
            host_path: shm.display().to_string(),
            read_only: false,
        });
    }
}

fn device_specs(
    res: &Resource,
    devices: &[u32],
    migs: &[(u32, u32)],
    opts: &AllocateOptions,
    resp: &mut ContainerAllocateResponse,
) {
    let caps: Vec<String> = match &opts.capabilities {
        Some(c) => c.clone(),
        None if !res.profile.selection.default_capabilities.is_empty() => {
            res.profile.selection.default_capabilities.clone()
        }
        None => vec!["all".into()],
    };
    let mut edits = actk_core::cdi::edits_for(&res.profile, &res.vendor, devices, &caps);
    edits.append(&actk_core::cdi::generate::mig_edits(&res.vendor, migs));
    actk_core::cdi::generate::dedup(&mut edits);
    for n in &edits.device_nodes {
        let host = n.host_path.as_deref().unwrap_or(&n.path);
        resp.devices.push(DeviceSpec {
            container_path: n.path.clone(),
            host_path: node_path(&opts.host_mount, Path::new(host)),
            permissions: n.permissions.clone().unwrap_or_else(|| "rw".into()),
        });
    }
    for m in &edits.mounts {
        resp.mounts.push(Mount {
            container_path: m.container_path.clone(),
            host_path: node_path(&opts.host_mount, Path::new(&m.host_path)),
            read_only: m.options.iter().any(|o| o == "ro"),
        });
    }
    for e in &edits.env {
        if let Some((k, v)) = e.split_once('=') {
            resp.envs.entry(k.to_string()).or_insert_with(|| v.to_string());
        }
    }
    if !edits.hooks.is_empty() {
        tracing::debug!(
            "{}: {} CDI hook(s) cannot be expressed as device specs; use a CDI strategy for them",
            res.name,
            edits.hooks.len()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strategies_parse_and_print() {
        for s in ["cdi-cri", "cdi-annotations", "envvar", "device-specs", "volume-mounts"] {
            assert_eq!(s.parse::<Strategy>().unwrap().to_string(), s);
        }
        assert!("cdi".parse::<Strategy>().unwrap_err().contains("\"cdi\""));
    }

    /// A 4-GPU NVIDIA node in memory: /dev/nvidiaN, UUIDs GPU-0000000N-....
    fn gpus() -> Resource {
        use actk_core::inventory::{Device, DeviceNode, Inventory, VendorInventory};
        let node = |p: &str, minor: u32| DeviceNode {
            path: p.into(),
            host_path: p.into(),
            node_type: 'c',
            major: 195,
            minor,
            file_mode: Some(0o666),
            gid: None,
        };
        let vendor = VendorInventory {
            profile: "nvidia".into(),
            kind: "nvidia.com/gpu".into(),
            devices: (0..4)
                .map(|i| Device {
                    index: i,
                    uuid: Some(format!("GPU-0000000{i}-1111-2222-3333-444444444444")),
                    nodes: vec![node(&format!("/dev/nvidia{i}"), i)],
                    ..Default::default()
                })
                .collect(),
            shared_nodes: vec![node("/dev/nvidiactl", 255)],
            ..Default::default()
        };
        let profiles = actk_core::profile::builtin();
        let inv = Inventory { vendors: vec![vendor], ..Default::default() };
        let build = crate::resources::BuildOptions { ids: crate::resources::DeviceIds::Uuid, ..Default::default() };
        crate::resources::build(&inv, &profiles, &build).remove(0)
    }

    fn registry(res: &Resource, names: actk_core::cdi::DeviceNameStrategy) -> Registry {
        let profile = actk_core::profile::builtin().into_iter().find(|p| p.name == "nvidia").unwrap();
        let opts = actk_core::cdi::GenerateOptions { device_name_strategy: names, ..Default::default() };
        let spec = actk_core::cdi::generate(&profile, &res.vendor, &opts).unwrap();
        let mut reg = Registry::default();
        reg.add(spec, "/var/run/cdi/nvidia.com-gpu.json".into(), 0);
        reg
    }

    fn opts(strategies: &str) -> AllocateOptions {
        AllocateOptions {
            strategies: strategies.split(',').map(|s| s.parse().unwrap()).collect(),
            host_mount: "/".into(),
            capabilities: None,
            spec_dirs: vec![],
            logical_core_size: 1,
            nri_gate: false,
        }
    }

    /// F18: a node spec that names GPUs by UUID only gets UUID names from cdi-cri, never
    /// `nvidia.com/gpu=3`; with index names (or both) the index name is used.
    #[test]
    fn f18_cdi_names_are_those_the_node_specs_define() {
        use actk_core::cdi::DeviceNameStrategy;
        let res = gpus();
        let ids = |i: &[usize]| i.iter().map(|&i| res.units[i].id.clone()).collect::<Vec<_>>();
        let names = CdiNames::from_registry(&res, &registry(&res, DeviceNameStrategy::Uuid));
        let r = container_response(&res, &ids(&[3, 1]), &opts("cdi-cri,cdi-annotations"), &names).unwrap();
        let got: Vec<&str> = r.cdi_devices.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(
            got,
            [
                "nvidia.com/gpu=GPU-00000001-1111-2222-3333-444444444444",
                "nvidia.com/gpu=GPU-00000003-1111-2222-3333-444444444444"
            ]
        );
        assert_eq!(r.annotations[&annotation_key("nvidia.com/gpu")], got.join(","));
        for strategy in [DeviceNameStrategy::Index, DeviceNameStrategy::Both] {
            let names = CdiNames::from_registry(&res, &registry(&res, strategy));
            let r = container_response(&res, &ids(&[3]), &opts("cdi-cri"), &names).unwrap();
            assert_eq!(r.cdi_devices[0].name, "nvidia.com/gpu=3", "{strategy}");
        }
    }

    /// A spec whose names follow another numbering is matched by device node, and `all` is never
    /// taken for one device; a device no spec defines is an error naming it and the fix.
    #[test]
    fn f18_names_follow_device_nodes_and_missing_ones_are_errors() {
        use actk_core::cdi::DeviceNameStrategy;
        let res = gpus();
        let mut reg = registry(&res, DeviceNameStrategy::Index);
        // Another tool's spec: the same kind in a higher-priority directory, names 0..3 reversed.
        let mut other = reg.specs()[0].spec.clone();
        for d in other.devices.iter_mut().filter(|d| d.name != "all") {
            let i: u32 = d.name.parse().unwrap();
            d.name = (3 - i).to_string();
        }
        reg.add(other, "/etc/cdi/other.json".into(), 1);
        let names = CdiNames::from_registry(&res, &reg);
        assert_eq!(names.get(0), Some("nvidia.com/gpu=3"), "the name whose edits hold /dev/nvidia0");
        assert_eq!(names.get(3), Some("nvidia.com/gpu=0"));

        let mut only_all = registry(&res, DeviceNameStrategy::Index).specs()[0].spec.clone();
        only_all.devices.retain(|d| d.name == "all" || d.name == "1");
        let mut reg = Registry::load::<&str>(&[]);
        reg.add(only_all, "/run/cdi/nvidia.json".into(), 0);
        let names = CdiNames::from_registry(&res, &reg);
        assert_eq!(names.get(1), Some("nvidia.com/gpu=1"));
        let err = container_response(&res, &[res.units[2].id.clone()], &opts("cdi-cri"), &names).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("device 2 (GPU-00000002") && msg.contains("nvidia.com/gpu=1, nvidia.com/gpu=all"),
            "{msg}"
        );
        assert!(msg.contains("actk cdi generate"), "{msg}");
        let none = CdiNames::from_registry(&res, &Registry::default());
        let msg =
            container_response(&res, &[res.units[0].id.clone()], &opts("cdi-cri"), &none).unwrap_err().to_string();
        assert!(msg.contains("no spec there has kind nvidia.com/gpu"), "{msg}");
        // Strategies without CDI names need no spec.
        container_response(&res, &[res.units[0].id.clone()], &opts("envvar,device-specs"), &none).unwrap();
    }

    /// Issue 25 item 9: Gaudi devices handed out by CDI name get HABANA_VISIBLE_MODULES (their
    /// module ids, in the order given), as Habana's device plugin sets it, with any strategy.
    #[test]
    fn item9_gaudi_answers_carry_habana_visible_modules() {
        use actk_core::inventory::{Device, DeviceNode, Inventory, VendorInventory};
        let modules = [3, 2, 1, 6, 7, 4, 5, 0];
        let vendor = VendorInventory {
            profile: "gaudi".into(),
            kind: "habana.ai/gaudi".into(),
            devices: (0..8u32)
                .map(|i| Device {
                    index: i,
                    nodes: vec![DeviceNode {
                        path: format!("/dev/accel/accel{i}"),
                        host_path: format!("/dev/accel/accel{i}").into(),
                        node_type: 'c',
                        major: 261,
                        minor: i,
                        file_mode: Some(0o666),
                        gid: None,
                    }],
                    attributes: [("module_id".to_string(), modules[i as usize].to_string())].into(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        let inv = Inventory { vendors: vec![vendor], ..Default::default() };
        let res = crate::resources::build(&inv, &actk_core::profile::builtin(), &Default::default()).remove(0);
        let profile = actk_core::profile::builtin().into_iter().find(|p| p.name == "gaudi").unwrap();
        let spec = actk_core::cdi::generate(&profile, &res.vendor, &Default::default()).unwrap();
        let mut reg = Registry::default();
        reg.add(spec, "/var/run/cdi/habana.ai-gaudi.json".into(), 0);
        let names = CdiNames::from_registry(&res, &reg);
        let ids: Vec<String> = [1usize, 7].iter().map(|&i| res.units[i].id.clone()).collect();
        for strategy in ["cdi-cri", "cdi-annotations", "volume-mounts"] {
            let r = container_response(&res, &ids, &opts(strategy), &names).unwrap();
            assert_eq!(r.envs.get("HABANA_VISIBLE_MODULES").map(String::as_str), Some("2,0"), "{strategy}");
        }
    }

    /// Issue 28 item 9: replicas that stack on one device while another device has a free
    /// replica are refused; stacking is accepted when nothing else was free.
    #[test]
    fn stacked_replicas_are_refused_only_when_another_device_was_free() {
        let mut res = gpus();
        res.units = res
            .units
            .iter()
            .flat_map(|u| {
                (0..2).map(move |n| crate::resources::Unit {
                    id: format!("{}::{n}", u.id),
                    replica: Some(n),
                    ..u.clone()
                })
            })
            .collect();
        res.replicas = 2;
        let id = |gpu: usize, r: usize| res.units[gpu * 2 + r].id.clone();
        let none = BTreeSet::new();
        check_replica_spread(&res, &[id(0, 0), id(1, 0)], &none).unwrap();
        let e = check_replica_spread(&res, &[id(0, 0), id(0, 1)], &none).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("request for 2 nvidia.com/gpu names 1 device(s) (0)"), "{msg}");
        assert!(msg.contains("replicas of 1, 2, 3 were free"), "{msg}");
        // Every replica of GPUs 1-3 held or withdrawn: stacking is all the node can give.
        let taken: BTreeSet<String> = (1..4).flat_map(|g| [id(g, 0), id(g, 1)]).collect();
        check_replica_spread(&res, &[id(0, 0), id(0, 1)], &taken).unwrap();
        // A resource without replicas is never checked.
        check_replica_spread(&gpus(), &[gpus().units[0].id.clone()], &none).unwrap();
    }

    /// Under the NRI plugin's gate every answer names the gate's CDI device once, beside what
    /// the strategies give (the env or device list actk-nri serves, or CDI names), and without
    /// `nri_gate` no answer does.
    #[test]
    fn nri_gate_names_its_cdi_device_in_every_answer() {
        use actk_core::cdi::DeviceNameStrategy;
        let res = gpus();
        let ids = vec![res.units[2].id.clone(), res.units[0].id.clone()];
        let names = CdiNames::from_registry(&res, &registry(&res, DeviceNameStrategy::Index));
        let gate = actk_core::policy::NRI_GATE_CDI_NAME;
        for strategies in ["volume-mounts", "envvar", "cdi-cri", "envvar,volume-mounts"] {
            let mut o = opts(strategies);
            let plain = container_response(&res, &ids, &o, &names).unwrap();
            assert!(!plain.cdi_devices.iter().any(|d| d.name == gate), "{strategies}: {plain:?}");
            o.nri_gate = true;
            let r = container_response(&res, &ids, &o, &names).unwrap();
            let got: Vec<&str> = r.cdi_devices.iter().map(|d| d.name.as_str()).collect();
            let mut want: Vec<&str> = plain.cdi_devices.iter().map(|d| d.name.as_str()).collect();
            want.push(gate);
            assert_eq!(got, want, "{strategies}");
            assert_eq!((r.envs, r.mounts, r.devices), (plain.envs, plain.mounts, plain.devices), "{strategies}");
        }
    }

    /// Issue 26: an answer that names devices only by CDI name sets the selection variable to
    /// `void` (as a DRA claim's spec does), so an image's NVIDIA_VISIBLE_DEVICES=all asks a
    /// legacy hook for nothing; with envvar or volume-mounts among the strategies the variable
    /// is theirs and carries no `void`.
    #[test]
    fn cdi_only_answers_set_the_selection_variable_void() {
        use actk_core::cdi::DeviceNameStrategy;
        let res = gpus();
        let ids = vec![res.units[1].id.clone()];
        let names = CdiNames::from_registry(&res, &registry(&res, DeviceNameStrategy::Index));
        for strategies in ["cdi-cri", "cdi-annotations", "cdi-cri,cdi-annotations"] {
            let r = container_response(&res, &ids, &opts(strategies), &names).unwrap();
            assert_eq!(r.envs.get("NVIDIA_VISIBLE_DEVICES").map(String::as_str), Some("void"), "{strategies}");
        }
        for strategies in ["volume-mounts", "cdi-cri,volume-mounts", "device-specs"] {
            let r = container_response(&res, &ids, &opts(strategies), &names).unwrap();
            assert_eq!(r.envs.get("NVIDIA_VISIBLE_DEVICES"), None, "{strategies}: {:?}", r.envs);
        }
        let r = container_response(&res, &ids, &opts("cdi-cri,envvar"), &names).unwrap();
        let uuid = res.vendor.devices[1].uuid.clone().unwrap();
        assert_eq!(r.envs.get("NVIDIA_VISIBLE_DEVICES"), Some(&uuid), "cdi-cri,envvar: {:?}", r.envs);
    }

    #[test]
    fn annotation_keys_and_host_paths() {
        assert_eq!(annotation_key("nvidia.com/gpu"), "cdi.k8s.io/actk_nvidia.com_gpu");
        assert_eq!(node_path(Path::new("/host"), Path::new("/host/dev/nvidia0")), "/dev/nvidia0");
        assert_eq!(node_path(Path::new("/"), Path::new("/fx/dev/nvidia0")), "/fx/dev/nvidia0");
        assert_eq!(node_path(Path::new("/host"), Path::new("/other/dev/x")), "/other/dev/x");
    }
}
