//! From the inventory to kubelet resources: one [`Resource`] per extended resource name a
//! vendor profile lists under `[kubernetes] resources`, holding the device IDs the kubelet sees.
//!
//! Kinds of units (kubelet devices):
//! - whole devices (`nvidia.com/gpu`, `aws.amazon.com/neuron`, ...): the ID is the device's
//!   UUID/serial ([`DeviceIds::Uuid`], the default: stable across reboots, as the kubelet's
//!   checkpoint of assigned IDs needs) or its index;
//! - cores (a resource whose class ends in `core`, e.g. `aws.amazon.com/neuroncore`), for
//!   devices that report a core count: the ID is the global core number as the Neuron runtime
//!   counts in NEURON_RT_VISIBLE_CORES (device 0's cores first), e.g. `5`;
//! - MIG devices (NVIDIA), per [`MigStrategy`] as NVIDIA's device plugin names them: `single`
//!   serves them as `nvidia.com/gpu`, `mixed` as `nvidia.com/mig-<profile>` (`mig-1g.10gb`;
//!   the `+` of a media-extension profile, not allowed in a resource name, becomes `.`:
//!   `mig-1g.10gb.me`) next to `nvidia.com/gpu` for the GPUs with MIG off. IDs: the MIG UUID, or
//!   `GPU:MIG` with index IDs.
//!
//! Time-slicing ([`TimeSlicing`], NVIDIA's `sharing.timeSlicing`, for every vendor): a resource
//! with `replicas = N` lists each unit N times as `<id>::<n>` (NVIDIA's annotated IDs), all of
//! which map back to the unit; renamed to `<resource>.shared` when asked.

use actk_core::inventory::{Inventory, VendorInventory};
use actk_core::profile::Profile;
use serde::Deserialize;
use std::fmt;
use std::str::FromStr;

/// How kubelet device IDs are formed for whole devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeviceIds {
    /// The device's UUID or serial when it has one (stable across reboots, as the kubelet's
    /// checkpoint needs), else its index.
    #[default]
    Uuid,
    /// The index as the vendor tools number devices (`0`, `1`, ...).
    Index,
}

impl FromStr for DeviceIds {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "uuid" => Ok(DeviceIds::Uuid),
            "index" => Ok(DeviceIds::Index),
            other => Err(format!("unknown device id scheme {other:?}: use uuid or index")),
        }
    }
}

/// How MIG devices are served (NVIDIA k8s-device-plugin `--mig-strategy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MigStrategy {
    /// MIG is ignored: every GPU is one `nvidia.com/gpu`, whatever its MIG mode.
    #[default]
    None,
    /// Every GPU has MIG on with one profile: the MIG devices are `nvidia.com/gpu`. A node with
    /// MIG off everywhere falls back to whole GPUs; any other layout serves nothing (logged).
    Single,
    /// `nvidia.com/gpu` for the GPUs with MIG off, `nvidia.com/mig-<profile>` per profile.
    Mixed,
}

impl FromStr for MigStrategy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(MigStrategy::None),
            "single" => Ok(MigStrategy::Single),
            "mixed" => Ok(MigStrategy::Mixed),
            other => Err(format!("unknown MIG strategy {other:?}: use none, single or mixed")),
        }
    }
}

impl fmt::Display for MigStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MigStrategy::None => "none",
            MigStrategy::Single => "single",
            MigStrategy::Mixed => "mixed",
        })
    }
}

/// How partitioned AMD GPUs are named (ROCm k8s-device-plugin `--resource_naming_strategy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ResourceNaming {
    /// Every GPU or partition is `amd.com/gpu`; a node whose GPUs are partitioned in different
    /// modes is not served (logged), as ROCm's plugin refuses it.
    #[default]
    Single,
    /// Partitions are `amd.com/<compute>_<memory>` (`amd.com/cpx_nps4`, `amd.com/spx_nps1`);
    /// GPUs that cannot be partitioned stay `amd.com/gpu`.
    Mixed,
}

impl FromStr for ResourceNaming {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "single" => Ok(ResourceNaming::Single),
            "mixed" => Ok(ResourceNaming::Mixed),
            other => Err(format!("unknown resource naming strategy {other:?}: use single or mixed")),
        }
    }
}

/// Most replicas of one unit: each replica is a kubelet device ID, and the kubelet sends the
/// whole list in every ListAndWatch update.
pub const MAX_REPLICAS: u32 = 1024;

/// Separator of NVIDIA's annotated replica IDs: `<device id>::<replica>`.
pub const REPLICA_SEPARATOR: &str = "::";

/// Time-slicing (NVIDIA device plugin `sharing.timeSlicing`): which resources are shared and how.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TimeSlicing {
    /// Rename every shared resource to `<resource>.shared` unless it names its own `rename`.
    pub rename_by_default: bool,
    /// Refuse an Allocate of more than one replica (a container asking for 2 would get one
    /// device twice, not twice the compute).
    pub fail_requests_greater_than_one: bool,
    /// The shared resources.
    pub resources: Vec<SharedResource>,
}

/// One time-sliced resource (NVIDIA's `sharing.timeSlicing.resources[]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedResource {
    /// The resource as it would be served unshared (`nvidia.com/gpu`, `amd.com/gpu`, `nvidia.com/mig-1g.10gb`).
    pub name: String,
    /// Replicas per unit, 1 to [`MAX_REPLICAS`].
    pub replicas: u32,
    /// Serve it under this name instead.
    pub rename: Option<String>,
    /// Only these devices of the resource (NVIDIA's `devices` list: device indexes `0`, MIG
    /// indexes `0:1`, or UUIDs `GPU-...`/`MIG-...`/serials); `None`: every device (`all`). Devices
    /// no entry lists stay under the resource's own name, unshared, unless an entry keeps that
    /// name, which then serves them once each next to its replicas.
    pub devices: Option<Vec<String>>,
}

/// CUDA MPS (NVIDIA device plugin `sharing.mps`): GPUs shared through an MPS control daemon
/// that the node runs (`nvidia-cuda-mps-control -d` with its pipe directory on the host).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Mps {
    /// Host directory of the daemon's pipes (`CUDA_MPS_PIPE_DIRECTORY` of the daemon); holds
    /// its `control` FIFO while it runs.
    pub pipe_directory: std::path::PathBuf,
    /// Host directory the daemon's processes share as /dev/shm, mounted there in the
    /// container (MPS clients and server talk through shared memory); `None`: not mounted
    /// (the pods then need hostIPC).
    pub shm_directory: Option<std::path::PathBuf>,
    /// The shared resources (replicas each; requests are limited to one replica, as NVIDIA does).
    pub resources: Vec<SharedResource>,
}

pub use actk_core::sharing::MPS_CONTAINER_PIPE_DIR;

/// Longest device ID the kubelet accepts (api.proto `Device.ID`).
pub const MAX_ID_LEN: usize = 63;

/// One kubelet device: a whole device, a MIG device, one core of a device, or a replica of one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unit {
    /// Kubelet device ID.
    pub id: String,
    /// Index of the device (the unit itself, the GPU holding the MIG device, or the device holding the core).
    pub device: u32,
    /// MIG index on `device`, for MIG units.
    pub mig: Option<u32>,
    /// Global core number, for core units.
    pub core: Option<u32>,
    /// NUMA node of the device, when known.
    pub numa: Option<u32>,
    /// Replica number, for time-sliced resources.
    pub replica: Option<u32>,
}

impl Unit {
    /// What a container gets for this unit: `(device, MIG index)`.
    pub fn target(&self) -> (u32, Option<u32>) {
        (self.device, self.mig)
    }
}

/// One extended resource served by one plugin socket.
#[derive(Debug, Clone)]
pub struct Resource {
    /// Extended resource name (`aws.amazon.com/neuroncore`, `nvidia.com/mig-1g.10gb`, `nvidia.com/gpu.shared`).
    pub name: String,
    /// The vendor profile.
    pub profile: Profile,
    /// What discovery found for that profile.
    pub vendor: VendorInventory,
    /// Whether units are cores rather than devices.
    pub per_core: bool,
    /// Units in device (then core, MIG, replica) order.
    pub units: Vec<Unit>,
    /// Replicas per unit (1: not shared).
    pub replicas: u32,
    /// Refuse an Allocate of more than one ID (time-slicing `failRequestsGreaterThanOne`).
    pub fail_requests_greater_than_one: bool,
    /// Shared through CUDA MPS.
    pub mps: Option<Mps>,
}

impl Resource {
    /// The unit with kubelet ID `id`.
    pub fn unit(&self, id: &str) -> Option<&Unit> {
        self.units.iter().find(|u| u.id == id)
    }

    /// Socket file name for this resource in the device-plugins directory:
    /// `actk-<vendor>_<class>.sock` with `/` and `.` made `_` and `-` (a file name, short).
    pub fn socket_name(&self) -> String {
        let safe: String =
            self.name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).collect();
        format!("actk-{safe}.sock")
    }
}

/// Whether resource name `name` counts cores (its class, after `/`, ends in `core`).
pub fn is_core_resource(name: &str) -> bool {
    name.rsplit('/').next().is_some_and(|class| class.ends_with("core"))
}

/// The mixed-strategy resource of MIG profile `profile` in `vendor_domain` (`nvidia.com`):
/// `nvidia.com/mig-3g.40gb`; `+` (media extensions) becomes `.`, which resource names allow.
pub fn mig_resource_name(vendor_domain: &str, profile: &str) -> String {
    format!("{vendor_domain}/mig-{}", profile.replace('+', "."))
}

/// What [`build`] needs besides the inventory and the profiles.
#[derive(Debug, Clone, Default)]
pub struct BuildOptions<'a> {
    /// Whole-device ID scheme.
    pub ids: DeviceIds,
    /// Only these resource names (before any time-slicing rename).
    pub filter: Option<&'a [String]>,
    /// How NVIDIA MIG devices are served.
    pub mig_strategy: MigStrategy,
    /// Time-slicing.
    pub time_slicing: Option<&'a TimeSlicing>,
    /// How partitioned AMD GPUs are named.
    pub amd_naming: ResourceNaming,
    /// CUDA MPS sharing.
    pub mps: Option<&'a Mps>,
    /// Physical cores per logical core for the core resources of profiles that have a
    /// `logical_core_size_env` (Neuron LNC); 0 or 1: physical cores.
    pub logical_core_size: u32,
}

/// The resources of every vendor in `inventory` whose profile is in `profiles`, in inventory
/// order then in the order the profile lists them; see the module docs for MIG and
/// time-slicing. A core resource whose devices do not report cores is skipped with a warning,
/// as is a resource name served by an earlier vendor (the kubelet allows one plugin per name),
/// a MIG layout the `single` strategy cannot serve, and a time-slicing entry for a resource
/// this node does not serve.
pub fn build(inventory: &Inventory, profiles: &[Profile], opts: &BuildOptions<'_>) -> Vec<Resource> {
    let mut out: Vec<Resource> = Vec::new();
    for vendor in &inventory.vendors {
        let Some(profile) = profiles.iter().find(|p| p.name == vendor.profile) else {
            tracing::warn!("vendor {} has no loaded profile; not served", vendor.profile);
            continue;
        };
        for name in &profile.kubernetes.resources {
            let per_core = is_core_resource(name);
            let mut made: Vec<(String, Vec<Unit>)> = Vec::new();
            if per_core {
                let lnc =
                    if profile.selection.logical_core_size_env.is_some() { opts.logical_core_size.max(1) } else { 1 };
                match core_units(vendor, lnc) {
                    Some(u) => made.push((name.clone(), u)),
                    None => {
                        tracing::warn!(
                            "resource {name}: devices of {} do not report a core count (or it does not divide into logical cores of {lnc}); not served",
                            profile.name
                        );
                        continue;
                    }
                }
            } else if profile.discovery == "nvidia" && *name == profile.kind {
                made.extend(nvidia_units(name, vendor, opts));
            } else if profile.discovery == "amd" && *name == profile.kind {
                made.extend(amd_units(name, vendor, opts));
            } else {
                made.push((name.clone(), device_units(vendor, opts.ids, |_| true)));
            }
            for (rname, units) in made {
                if opts.filter.is_some_and(|f| !f.contains(&rname)) {
                    continue;
                }
                if out.iter().any(|r| r.name == rname) {
                    tracing::warn!(
                        "resource {rname} of profile {} is already served by an earlier profile; skipped",
                        profile.name
                    );
                    continue;
                }
                out.push(Resource {
                    name: rname,
                    profile: profile.clone(),
                    vendor: vendor.clone(),
                    per_core,
                    units,
                    replicas: 1,
                    fail_requests_greater_than_one: false,
                    mps: None,
                });
            }
        }
    }
    if let Some(ts) = opts.time_slicing {
        apply_time_slicing(&mut out, ts, None);
    }
    if let Some(mps) = opts.mps {
        // MPS: replicas as time-slicing does, one replica per request (NVIDIA's rule), and
        // only for GPUs (an MPS daemon serves CUDA devices).
        let ts = TimeSlicing {
            rename_by_default: false,
            fail_requests_greater_than_one: true,
            resources: mps.resources.clone(),
        };
        apply_time_slicing(&mut out, &ts, Some(mps));
    }
    out
}

/// The NVIDIA GPU resource under `strategy`: `(name, units)` pairs.
fn nvidia_units(name: &str, vendor: &VendorInventory, opts: &BuildOptions<'_>) -> Vec<(String, Vec<Unit>)> {
    let mig_on = |d: &actk_core::inventory::Device| d.mig.as_ref().is_some_and(|m| m.enabled);
    let domain = name.split_once('/').map(|(d, _)| d).unwrap_or(name);
    match opts.mig_strategy {
        MigStrategy::None => vec![(name.to_string(), device_units(vendor, opts.ids, |_| true))],
        MigStrategy::Single => {
            let enabled = vendor.devices.iter().filter(|d| mig_on(d)).count();
            if enabled == 0 {
                return vec![(name.to_string(), device_units(vendor, opts.ids, |_| true))];
            }
            let profiles: std::collections::BTreeSet<&str> =
                vendor.mig_devices().map(|(_, m)| m.profile.as_str()).collect();
            if enabled != vendor.devices.len() || profiles.len() != 1 {
                let off: Vec<String> =
                    vendor.devices.iter().filter(|d| !mig_on(d)).map(|d| d.index.to_string()).collect();
                tracing::error!(
                    "MIG strategy single needs every GPU in MIG mode with one profile; this node has MIG off on GPU(s) [{}] and profiles [{}]: {name} is not served (use the mixed strategy)",
                    off.join(","),
                    profiles.into_iter().collect::<Vec<_>>().join(", ")
                );
                return vec![];
            }
            vec![(name.to_string(), mig_units(vendor, opts.ids, |_| true))]
        }
        MigStrategy::Mixed => {
            let mut out = vec![(name.to_string(), device_units(vendor, opts.ids, |d| !mig_on(d)))];
            let mut profiles: Vec<&str> = vendor.mig_devices().map(|(_, m)| m.profile.as_str()).collect();
            profiles.sort_unstable();
            profiles.dedup();
            for p in profiles {
                out.push((mig_resource_name(domain, p), mig_units(vendor, opts.ids, |m| m.profile == p)));
            }
            out
        }
    }
}

/// AMD GPUs and partitions under the naming strategy: `(name, units)` pairs.
fn amd_units(name: &str, vendor: &VendorInventory, opts: &BuildOptions<'_>) -> Vec<(String, Vec<Unit>)> {
    let mode = |d: &actk_core::inventory::Device| -> Option<String> {
        Some(format!("{}_{}", d.attributes.get("compute_partition")?, d.attributes.get("memory_partition")?))
    };
    let domain = name.split_once('/').map(|(d, _)| d).unwrap_or(name);
    let mut modes: Vec<String> = vendor.devices.iter().filter_map(mode).collect();
    modes.sort();
    modes.dedup();
    match opts.amd_naming {
        ResourceNaming::Single if modes.len() > 1 => {
            tracing::error!(
                "resource naming strategy single needs every GPU in one partition mode; this node has {}: {name} is not served (use the mixed strategy)",
                modes.join(", ")
            );
            vec![]
        }
        ResourceNaming::Single => vec![(name.to_string(), device_units(vendor, opts.ids, |_| true))],
        ResourceNaming::Mixed => {
            let mut out = Vec::new();
            if vendor.devices.iter().any(|d| mode(d).is_none()) {
                out.push((name.to_string(), device_units(vendor, opts.ids, |d| mode(d).is_none())));
            }
            for m in modes {
                out.push((
                    format!("{domain}/{m}"),
                    device_units(vendor, opts.ids, |d| mode(d).as_deref() == Some(m.as_str())),
                ));
            }
            out
        }
    }
}

fn device_units(
    vendor: &VendorInventory,
    ids: DeviceIds,
    keep: impl Fn(&actk_core::inventory::Device) -> bool,
) -> Vec<Unit> {
    let mut units: Vec<Unit> = Vec::new();
    for d in vendor.devices.iter().filter(|d| keep(d)) {
        let by_uuid = d.uuid.as_deref().filter(|u| {
            ids == DeviceIds::Uuid && !u.is_empty() && u.len() <= MAX_ID_LEN && !units.iter().any(|x| x.id == *u)
        });
        let id = by_uuid.map(str::to_string).unwrap_or_else(|| d.index.to_string());
        units.push(Unit { id, device: d.index, mig: None, core: None, numa: d.numa_node, replica: None });
    }
    units
}

fn mig_units(
    vendor: &VendorInventory,
    ids: DeviceIds,
    keep: impl Fn(&actk_core::inventory::MigDevice) -> bool,
) -> Vec<Unit> {
    vendor
        .mig_devices()
        .filter(|(_, m)| keep(m))
        .map(|(d, m)| {
            let id = if ids == DeviceIds::Uuid && m.uuid.len() <= MAX_ID_LEN {
                m.uuid.clone()
            } else {
                format!("{}:{}", d.index, m.index)
            };
            Unit { id, device: d.index, mig: Some(m.index), core: None, numa: d.numa_node, replica: None }
        })
        .collect()
}

/// Core units of every device: global core numbers as the runtime counts them, in logical
/// cores of `lnc` physical cores each. `None` when a device reports no core count or one that
/// does not divide by `lnc`.
fn core_units(vendor: &VendorInventory, lnc: u32) -> Option<Vec<Unit>> {
    let numbers = actk_core::sharing::core_numbers(vendor, lnc)?;
    let mut units = Vec::new();
    for d in &vendor.devices {
        for c in numbers.get(&d.index).cloned().unwrap_or_default() {
            units.push(Unit {
                id: c.to_string(),
                device: d.index,
                mig: None,
                core: Some(c),
                numa: d.numa_node,
                replica: None,
            });
        }
    }
    Some(units)
}

/// Whether unit `u` of `vendor` is named by `entry` of a shared resource's `devices` list: the
/// device index, the `GPU:MIG` index, or the device's or MIG device's UUID/serial (any case).
fn device_listed(vendor: &VendorInventory, u: &Unit, entry: &str) -> bool {
    let e = entry.trim();
    let dev = vendor.devices.iter().find(|d| d.index == u.device);
    match u.mig {
        Some(m) => {
            let uuid = dev.and_then(|d| d.mig.as_ref()).and_then(|x| x.devices.iter().find(|x| x.index == m));
            e == format!("{}:{m}", u.device) || uuid.is_some_and(|x| x.uuid.eq_ignore_ascii_case(e))
        }
        None => {
            e == u.device.to_string() || dev.and_then(|d| d.uuid.as_deref()).is_some_and(|x| x.eq_ignore_ascii_case(e))
        }
    }
}

/// Replicate the units of each shared resource and rename it (see [`TimeSlicing`]); entries with
/// a `devices` list take only those devices, the others stay under the resource's own name.
/// With `mps`, the shared resources are marked as served through that MPS daemon.
fn apply_time_slicing(resources: &mut Vec<Resource>, ts: &TimeSlicing, mps: Option<&Mps>) {
    let mut names: Vec<&str> = ts.resources.iter().map(|r| r.name.as_str()).collect();
    names.dedup();
    let mut seen = std::collections::BTreeSet::new();
    for name in names.into_iter().filter(|n| seen.insert(*n)) {
        let Some(pos) = resources.iter().position(|r| r.name == name) else {
            let served: Vec<&str> = resources.iter().map(|r| r.name.as_str()).collect();
            tracing::warn!(
                "time-slicing: {name} is not served on this node (served: {}); its replicas setting is not used here",
                if served.is_empty() { "none".to_string() } else { served.join(", ") }
            );
            continue;
        };
        let base = resources.remove(pos);
        if mps.is_some() && base.profile.discovery != "nvidia" {
            tracing::error!("MPS: {name} is not an NVIDIA resource; it is served without MPS");
            resources.insert(pos, base);
            continue;
        }
        let mut left: Vec<Unit> = base.units.clone();
        let mut made: Vec<Resource> = Vec::new();
        for shared in ts.resources.iter().filter(|r| r.name == name) {
            let units: Vec<Unit> = match &shared.devices {
                None => std::mem::take(&mut left),
                Some(list) => {
                    for e in list {
                        if !base.units.iter().any(|u| device_listed(&base.vendor, u, e)) {
                            tracing::warn!("time-slicing: {name} has no device {e:?} on this node; not shared");
                        }
                    }
                    let (mine, rest): (Vec<Unit>, Vec<Unit>) =
                        left.into_iter().partition(|u| list.iter().any(|e| device_listed(&base.vendor, u, e)));
                    left = rest;
                    mine
                }
            };
            if units.is_empty() {
                continue;
            }
            let mut new_name = match (&shared.rename, ts.rename_by_default) {
                (Some(n), _) => n.clone(),
                (None, true) => format!("{name}.shared"),
                (None, false) => name.to_string(),
            };
            let taken = |n: &str| resources.iter().chain(made.iter()).any(|r| r.name == n);
            if new_name != name && taken(&new_name) {
                tracing::error!(
                    "time-slicing: {name} cannot be renamed to {new_name}: that resource is served already; kept as {name}"
                );
                new_name = name.to_string();
            }
            let units = units
                .iter()
                .flat_map(|u| {
                    (0..shared.replicas).map(move |n| Unit {
                        id: format!("{}{REPLICA_SEPARATOR}{n}", u.id),
                        replica: Some(n),
                        ..u.clone()
                    })
                })
                .collect();
            made.push(Resource {
                name: new_name,
                units,
                replicas: shared.replicas,
                fail_requests_greater_than_one: ts.fail_requests_greater_than_one,
                mps: mps.cloned(),
                ..base.clone()
            });
        }
        if !left.is_empty() {
            // Devices no entry lists: once each, under the resource's own name.
            match made.iter_mut().find(|r| r.name == name) {
                Some(r) if r.mps.is_none() => r.units.extend(left),
                Some(_) => tracing::error!(
                    "MPS: {name} keeps its name for some of its devices only; the others ({}) are not served (rename the MPS entry)",
                    left.iter().map(|u| u.device.to_string()).collect::<Vec<_>>().join(", ")
                ),
                None => made.push(Resource { units: left, ..base.clone() }),
            }
        }
        for (i, r) in made.into_iter().enumerate() {
            if resources.iter().any(|x| x.name == r.name) {
                tracing::error!(
                    "time-slicing: two entries of {name} are both served as {}; the second is not served",
                    r.name
                );
                continue;
            }
            resources.insert((pos + i).min(resources.len()), r);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use actk_core::inventory::{Device, Mig, MigDevice};

    fn vendor(n: u32, cores: Option<u32>) -> VendorInventory {
        VendorInventory {
            profile: "neuron".into(),
            kind: "aws.amazon.com/neuron".into(),
            devices: (0..n)
                .map(|i| Device {
                    index: i,
                    uuid: Some(format!("{i:016x}")),
                    cores,
                    numa_node: Some(i / 2),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    fn opts(ids: DeviceIds) -> BuildOptions<'static> {
        BuildOptions { ids, ..Default::default() }
    }

    #[test]
    fn neuron_gives_device_and_core_resources() {
        let profiles = actk_core::profile::builtin();
        let inv = Inventory { vendors: vec![vendor(3, Some(2))], ..Default::default() };
        let res = build(&inv, &profiles, &opts(DeviceIds::Uuid));
        let names: Vec<&str> = res.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["aws.amazon.com/neuron", "aws.amazon.com/neuroncore", "aws.amazon.com/neurondevice"]);
        assert_eq!(res[0].units[1].id, "0000000000000001");
        let cores = &res[1];
        assert!(cores.per_core);
        assert_eq!(
            cores.units.iter().map(|u| (u.id.as_str(), u.device)).collect::<Vec<_>>(),
            [("0", 0), ("1", 0), ("2", 1), ("3", 1), ("4", 2), ("5", 2)]
        );
        assert_eq!(res[0].socket_name(), "actk-aws_amazon_com_neuron.sock");
        let filter = ["aws.amazon.com/neuron".to_string()];
        let res = build(
            &inv,
            &profiles,
            &BuildOptions { ids: DeviceIds::Index, filter: Some(&filter), ..Default::default() },
        );
        assert_eq!(res.len(), 1);
        assert_eq!(res[0].units.iter().map(|u| u.id.as_str()).collect::<Vec<_>>(), ["0", "1", "2"]);
    }

    #[test]
    fn logical_core_size_groups_neuron_cores() {
        let profiles = actk_core::profile::builtin();
        let inv = Inventory { vendors: vec![vendor(2, Some(8))], ..Default::default() };
        let cores = |lnc| {
            let r = build(&inv, &profiles, &BuildOptions { logical_core_size: lnc, ..Default::default() });
            r.into_iter()
                .find(|r| r.per_core)
                .map(|r| r.units.iter().map(|u| (u.core.unwrap(), u.device)).collect::<Vec<_>>())
        };
        assert_eq!(
            cores(2).unwrap(),
            [(0, 0), (1, 0), (2, 0), (3, 0), (4, 1), (5, 1), (6, 1), (7, 1)],
            "LNC=2: 4 per device"
        );
        assert_eq!(cores(1).unwrap().len(), 16);
        assert_eq!(cores(3), None, "8 does not divide by 3: not served");
    }

    #[test]
    fn core_resource_without_core_counts_is_skipped() {
        let profiles = actk_core::profile::builtin();
        let inv = Inventory { vendors: vec![vendor(2, None)], ..Default::default() };
        let names: Vec<String> = build(&inv, &profiles, &opts(DeviceIds::Uuid)).into_iter().map(|r| r.name).collect();
        assert_eq!(names, ["aws.amazon.com/neuron", "aws.amazon.com/neurondevice"]);
    }

    /// Four GPUs: 0 and 1 with MIG on (profiles from `layouts`), 2 and 3 as `off`.
    fn gpus(layouts: &[&[&str]], off: u32) -> Inventory {
        let mut devices = Vec::new();
        for (i, layout) in layouts.iter().enumerate() {
            let i = i as u32;
            let mig = Mig {
                enabled: true,
                devices: layout
                    .iter()
                    .enumerate()
                    .map(|(j, p)| MigDevice {
                        index: j as u32,
                        uuid: format!("MIG-{i}{j}"),
                        profile: p.to_string(),
                        ..Default::default()
                    })
                    .collect(),
            };
            devices.push(Device { index: i, uuid: Some(format!("GPU-{i}")), mig: Some(mig), ..Default::default() });
        }
        let first = devices.len() as u32;
        for i in first..first + off {
            devices.push(Device {
                index: i,
                uuid: Some(format!("GPU-{i}")),
                mig: Some(Mig::default()),
                ..Default::default()
            });
        }
        Inventory {
            vendors: vec![VendorInventory {
                profile: "nvidia".into(),
                kind: "nvidia.com/gpu".into(),
                devices,
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    fn summary(res: &[Resource]) -> Vec<(String, Vec<String>)> {
        res.iter().map(|r| (r.name.clone(), r.units.iter().map(|u| u.id.clone()).collect())).collect()
    }

    #[test]
    fn mig_strategies_name_resources_as_nvidia_does() {
        let profiles = actk_core::profile::builtin();
        let inv = gpus(&[&["3g.40gb", "1g.10gb+me"], &["1g.10gb"]], 2);
        let none = build(&inv, &profiles, &BuildOptions { mig_strategy: MigStrategy::None, ..Default::default() });
        assert_eq!(
            summary(&none),
            [("nvidia.com/gpu".to_string(), ["GPU-0", "GPU-1", "GPU-2", "GPU-3"].map(String::from).to_vec())]
        );
        let mixed = build(&inv, &profiles, &BuildOptions { mig_strategy: MigStrategy::Mixed, ..Default::default() });
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(
            summary(&mixed),
            [
                ("nvidia.com/gpu".to_string(), s(&["GPU-2", "GPU-3"])),
                ("nvidia.com/mig-1g.10gb".to_string(), s(&["MIG-10"])),
                ("nvidia.com/mig-1g.10gb.me".to_string(), s(&["MIG-01"])),
                ("nvidia.com/mig-3g.40gb".to_string(), s(&["MIG-00"])),
            ]
        );
        assert_eq!(mixed[3].units[0].target(), (0, Some(0)));
        let idx = build(
            &inv,
            &profiles,
            &BuildOptions { mig_strategy: MigStrategy::Mixed, ids: DeviceIds::Index, ..Default::default() },
        );
        assert_eq!(idx[3].units[0].id, "0:0", "index IDs of MIG devices are GPU:MIG");
        // single: refused on a mixed layout, MIG devices on a uniform one, whole GPUs without MIG.
        let single = |inv: &Inventory| {
            summary(&build(inv, &profiles, &BuildOptions { mig_strategy: MigStrategy::Single, ..Default::default() }))
        };
        assert!(single(&inv).is_empty());
        assert_eq!(
            single(&gpus(&[&["1g.10gb", "1g.10gb"], &["1g.10gb"]], 0)),
            [("nvidia.com/gpu".to_string(), s(&["MIG-00", "MIG-01", "MIG-10"]))]
        );
        assert_eq!(single(&gpus(&[], 2)), [("nvidia.com/gpu".to_string(), s(&["GPU-0", "GPU-1"]))]);
    }

    #[test]
    fn amd_partitions_single_or_mixed_as_rocm_names_them() {
        let profiles = actk_core::profile::builtin();
        let dev = |i: u32, modes: Option<(&str, &str)>| {
            let mut d = Device { index: i, ..Default::default() };
            if let Some((c, m)) = modes {
                d.attributes.insert("compute_partition".into(), c.into());
                d.attributes.insert("memory_partition".into(), m.into());
            }
            d
        };
        let inv = |devices: Vec<Device>| Inventory {
            vendors: vec![VendorInventory {
                profile: "amd".into(),
                kind: "amd.com/gpu".into(),
                devices,
                ..Default::default()
            }],
            ..Default::default()
        };
        let names = |i: &Inventory, n: ResourceNaming| -> Vec<(String, usize)> {
            build(i, &profiles, &BuildOptions { amd_naming: n, ids: DeviceIds::Index, ..Default::default() })
                .into_iter()
                .map(|r| (r.name, r.units.len()))
                .collect()
        };
        let cpx = inv((0..64).map(|i| dev(i, Some(("cpx", "nps4")))).collect());
        assert_eq!(names(&cpx, ResourceNaming::Single), [("amd.com/gpu".to_string(), 64)]);
        assert_eq!(names(&cpx, ResourceNaming::Mixed), [("amd.com/cpx_nps4".to_string(), 64)]);
        // ROCm's heterogeneous example: 5 GPUs SPX-NPS1 and 3 in CPX-NPS1 (24 partitions).
        let mut d: Vec<Device> = (0..5).map(|i| dev(i, Some(("spx", "nps1")))).collect();
        d.extend((5..29).map(|i| dev(i, Some(("cpx", "nps1")))));
        let het = inv(d);
        assert_eq!(
            names(&het, ResourceNaming::Mixed),
            [("amd.com/cpx_nps1".to_string(), 24), ("amd.com/spx_nps1".to_string(), 5)]
        );
        assert!(names(&het, ResourceNaming::Single).is_empty(), "single refuses a heterogeneous node");
        // GPUs without partitioning (MI210) stay amd.com/gpu whatever the strategy.
        let mi210 = inv((0..4).map(|i| dev(i, None)).collect());
        assert_eq!(names(&mi210, ResourceNaming::Mixed), [("amd.com/gpu".to_string(), 4)]);
    }

    #[test]
    fn time_slicing_replicates_and_renames() {
        let profiles = actk_core::profile::builtin();
        let inv = gpus(&[], 2);
        let ts = TimeSlicing {
            rename_by_default: true,
            fail_requests_greater_than_one: true,
            resources: vec![SharedResource { name: "nvidia.com/gpu".into(), replicas: 3, rename: None, devices: None }],
        };
        let res = build(&inv, &profiles, &BuildOptions { time_slicing: Some(&ts), ..Default::default() });
        assert_eq!(res[0].name, "nvidia.com/gpu.shared");
        let ids: Vec<&str> = res[0].units.iter().map(|u| u.id.as_str()).collect();
        assert_eq!(ids, ["GPU-0::0", "GPU-0::1", "GPU-0::2", "GPU-1::0", "GPU-1::1", "GPU-1::2"]);
        assert!(res[0].units.iter().all(|u| u.replica.is_some()));
        assert_eq!((res[0].replicas, res[0].fail_requests_greater_than_one), (3, true));
        let ts = TimeSlicing {
            resources: vec![SharedResource {
                name: "nvidia.com/gpu".into(),
                replicas: 2,
                rename: Some("nvidia.com/gpu-small".into()),
                devices: None,
            }],
            ..Default::default()
        };
        let res = build(&inv, &profiles, &BuildOptions { time_slicing: Some(&ts), ..Default::default() });
        assert_eq!((res[0].name.as_str(), res[0].units.len()), ("nvidia.com/gpu-small", 4));
    }

    /// NVIDIA's `devices` lists: one resource split by device into renamed shared resources;
    /// devices no entry lists stay under the resource's own name, once each.
    #[test]
    fn time_slicing_device_lists_split_a_resource() {
        let profiles = actk_core::profile::builtin();
        let inv = gpus(&[], 4);
        let entry = |rename: Option<&str>, replicas, devices: &[&str]| SharedResource {
            name: "nvidia.com/gpu".into(),
            replicas,
            rename: rename.map(String::from),
            devices: Some(devices.iter().map(|d| d.to_string()).collect()),
        };
        let ts = TimeSlicing {
            resources: vec![
                entry(Some("nvidia.com/gpu-light"), 2, &["0"]),
                entry(Some("nvidia.com/gpu-heavy"), 4, &["gpu-1"]),
            ],
            ..Default::default()
        };
        let res = build(&inv, &profiles, &BuildOptions { time_slicing: Some(&ts), ..Default::default() });
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(
            summary(&res),
            [
                ("nvidia.com/gpu-light".to_string(), s(&["GPU-0::0", "GPU-0::1"])),
                ("nvidia.com/gpu-heavy".to_string(), s(&["GPU-1::0", "GPU-1::1", "GPU-1::2", "GPU-1::3"])),
                ("nvidia.com/gpu".to_string(), s(&["GPU-2", "GPU-3"])),
            ]
        );
        assert_eq!((res[0].replicas, res[1].replicas, res[2].replicas), (2, 4, 1));
        // An entry that keeps the name serves the unlisted devices once each next to its replicas.
        let ts = TimeSlicing { resources: vec![entry(None, 2, &["3"])], ..Default::default() };
        let res = build(&inv, &profiles, &BuildOptions { time_slicing: Some(&ts), ..Default::default() });
        assert_eq!(
            summary(&res),
            [("nvidia.com/gpu".to_string(), s(&["GPU-3::0", "GPU-3::1", "GPU-0", "GPU-1", "GPU-2"]))]
        );
    }
}
