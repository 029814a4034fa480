//! The inventory: what discovery found on a host root, as plain data.
//!
//! Shape: one [`Inventory`] per host, holding one [`VendorInventory`] per profile that found at
//! least one device (a heterogeneous node has several). Each device carries the identity
//! attributes `actk list` prints and the device nodes a container needs for it; shared (control)
//! nodes and host files to mount are per vendor. Paths are the paths *as a container sees them*
//! (`/dev/nvidia0`) plus the host path under the discovery root (`<root>/dev/nvidia0`).
//!
//! The JSON form (`actk list --json`) is this structure serialised with serde; field names are
//! stable (snake_case) and new fields are only ever added.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Everything discovery found under one host root.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Inventory {
    /// The host root that was scanned (`/` on a real node, a fixture directory in tests).
    pub root: PathBuf,
    /// One entry per vendor profile that found devices, in profile order.
    pub vendors: Vec<VendorInventory>,
    /// Odd things seen on the host (missing sysfs entry, unreadable attribute, library of another
    /// driver version). Discovery never fails for these; it records them here.
    pub warnings: Vec<Warning>,
}

/// A non-fatal observation made during discovery, naming the path it concerns.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Warning {
    /// The path (under the host root) the warning is about.
    pub path: PathBuf,
    /// What was wrong, in one sentence.
    pub message: String,
}

impl std::fmt::Display for Warning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.path.display(), self.message)
    }
}

/// Devices of one vendor profile (one CDI kind) on the host.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct VendorInventory {
    /// Profile name (`nvidia`, `neuron`, `amd`, `gaudi`, `accel`, or a user profile's name).
    pub profile: String,
    /// CDI kind, `vendor/class` (`nvidia.com/gpu`), see CDI SPEC.md "Kind".
    pub kind: String,
    /// Kernel driver version when the vendor exposes one (`580.95.05` from
    /// /proc/driver/nvidia/version, `2.19.64.0` from the neuron module's sysfs version).
    pub driver_version: Option<String>,
    /// Devices in index order (PCI bus order for NVIDIA, as NVML numbers them).
    pub devices: Vec<Device>,
    /// Shared/control nodes every container using this vendor needs (`/dev/nvidiactl`,
    /// `/dev/nvidia-uvm`, `/dev/kfd`, ...), only those that exist on the host.
    pub shared_nodes: Vec<DeviceNode>,
    /// Host files (driver libraries, tools, firmware) to bind-mount, tagged with the capability
    /// that asks for them (`compute`, `utility`, ...; `base` for always-mounted files).
    pub host_files: Vec<HostFile>,
    /// NVIDIA's MIG management capabilities by name (`config`, `monitor`): the
    /// `/dev/nvidia-caps/nvidia-capN` nodes that let a (privileged) container create MIG
    /// instances or monitor all of them (/proc/driver/nvidia/capabilities/mig/{config,monitor}).
    #[serde(default)]
    pub mig_capabilities: BTreeMap<String, DeviceNode>,
}

/// One accelerator device.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Device {
    /// Index as the vendor tools number it (nvidia-smi index, neuron-ls id, ...).
    pub index: u32,
    /// Marketing/model name (`NVIDIA H100 80GB HBM3`, `Inferentia2`, `AMD Instinct MI300X`).
    pub model: Option<String>,
    /// Stable unique id: `GPU-xxxxxxxx-...` for NVIDIA, serial number for Neuron/Gaudi, unique_id for AMD.
    pub uuid: Option<String>,
    /// PCI bus id in the long form `0000:18:00.0` (lower-case hex).
    pub pci_bus_id: Option<String>,
    /// NUMA node from sysfs `numa_node` (`-1` on a single-node host is reported as `None`).
    pub numa_node: Option<u32>,
    /// Device nodes this device needs in the container (per-device only; shared nodes are in
    /// [`VendorInventory::shared_nodes`]).
    pub nodes: Vec<DeviceNode>,
    /// Indexes of devices directly linked to this one (NVLink, NeuronLink, XGMI), ascending.
    pub links: Vec<u32>,
    /// Number of cores the device exposes to the runtime (NeuronCores), when the vendor has them.
    pub cores: Option<u32>,
    /// Other vendor attributes (`minor`, `architecture`, `module_id`, `render_minor`, ...).
    pub attributes: BTreeMap<String, String>,
    /// NVIDIA Multi-Instance GPU state, from NVML: `None` when the GPU has no MIG, or NVML was
    /// not read (a container start that asked for no MIG device does not load it).
    #[serde(default)]
    pub mig: Option<Mig>,
}

/// MIG (NVIDIA Multi-Instance GPU) state of one GPU (NVIDIA MIG User Guide).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Mig {
    /// Whether MIG mode is on (`nvidia-smi --query-gpu=mig.mode.current`).
    pub enabled: bool,
    /// MIG devices in NVML index order (what `nvidia-smi -L` lists under the GPU).
    pub devices: Vec<MigDevice>,
}

/// One MIG device: a compute instance of a GPU instance of its parent GPU.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct MigDevice {
    /// Index on the parent GPU (`nvidia-smi -L` "MIG 3g.40gb Device 0"; `NVIDIA_VISIBLE_DEVICES=<gpu>:<index>`).
    pub index: u32,
    /// `MIG-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
    pub uuid: String,
    /// GPU instance id (`nvidia-smi mig -lgi` GI ID).
    pub gpu_instance: u32,
    /// Compute instance id within the GPU instance (`nvidia-smi mig -lci` CI ID).
    pub compute_instance: u32,
    /// Profile name as NVIDIA's tools print it (`1g.10gb`, `3g.40gb`, `1c.3g.40gb`, `1g.10gb+me`).
    pub profile: String,
    /// GPU instance profile id (`nvidia-smi mig -lgip` ID column: 19 = 1g.10gb on A100).
    pub gi_profile_id: u32,
    /// Where the GPU instance sits on the GPU, in memory slices.
    pub placement: MigPlacement,
    /// Memory of the GPU instance, MiB.
    pub memory_mib: u64,
    /// Streaming multiprocessors of the compute instance.
    pub multiprocessors: u32,
    /// Engines of the GPU instance by name, as NVML counts them (nvmlDeviceGetAttributes_v2
    /// `shared*Count`): `copyEngines`, `decoders`, `encoders`, `jpegEngines`, `ofaEngines`;
    /// zero counts are left out.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub engines: BTreeMap<String, u32>,
    /// The capability nodes that grant access to this instance: `/dev/nvidia-caps/nvidia-capN`
    /// of the GPU instance and of the compute instance (minors from
    /// /proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<G>[/ci<C>]/access). A container also
    /// needs the parent GPU's node ([`Device::nodes`]).
    pub nodes: Vec<DeviceNode>,
}

/// A GPU instance's placement: first memory slice and number of slices (nvmlGpuInstancePlacement_t).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct MigPlacement {
    /// First memory slice.
    pub start: u32,
    /// Number of memory slices.
    pub size: u32,
}

/// A character (or block) device node as a container must see it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
pub struct DeviceNode {
    /// Path inside the container (`/dev/nvidia0`).
    pub path: String,
    /// Path on the host, under the discovery root (`/run/nvidia/driver/dev/nvidia0`).
    pub host_path: PathBuf,
    /// `c` for a character device, `b` for a block device.
    pub node_type: char,
    /// Major number, read from the node itself (stat) or /proc/devices.
    pub major: u32,
    /// Minor number.
    pub minor: u32,
    /// Permission bits of the host node (`0o666`), when known.
    pub file_mode: Option<u32>,
    /// Group of the host node (`render`'s gid for an AMD render node), when known. Generated
    /// specs carry it when it is not root's, so the node keeps its group in the container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gid: Option<u32>,
}

/// What a host file is, which decides where it is mounted and whether ldconfig must see it.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum HostFileKind {
    /// A shared library; mounted at the same path, its directory added to the container's ld.so.cache.
    Library,
    /// An executable (nvidia-smi, neuron-ls).
    Binary,
    /// Firmware (e.g. GSP firmware under /lib/firmware/nvidia/<version>/).
    Firmware,
    /// Any other file or directory (configs, IPC sockets).
    File,
}

/// A file on the host to bind-mount read-only into containers.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
pub struct HostFile {
    /// Capability that asks for this file (`utility`, `compute`, `video`, `graphics`, `display`,
    /// `compat32`, `ngx`, or `base` for always).
    pub capability: String,
    /// Kind of file.
    pub kind: HostFileKind,
    /// Path on the host, under the discovery root (symlinks resolved *within* the root).
    pub host_path: PathBuf,
    /// Path inside the container (the file's path relative to the root, made absolute).
    pub container_path: String,
}

impl Inventory {
    /// Host paths as the node sees them when discovery ran in a container that has the node's
    /// `/` mounted at `host_mount` (`/host`): that prefix is taken off every device node's and
    /// host file's `host_path` (others are left alone). Container paths are not touched.
    pub fn strip_host_mount(&mut self, host_mount: &std::path::Path) {
        let strip = |p: &mut PathBuf| {
            if let Ok(rest) = p.strip_prefix(host_mount) {
                *p = std::path::Path::new("/").join(rest);
            }
        };
        for v in &mut self.vendors {
            for d in &mut v.devices {
                let mig = d.mig.iter_mut().flat_map(|m| m.devices.iter_mut()).flat_map(|m| m.nodes.iter_mut());
                for n in d.nodes.iter_mut().chain(mig) {
                    strip(&mut n.host_path);
                }
            }
            for n in v.shared_nodes.iter_mut().chain(v.mig_capabilities.values_mut()) {
                strip(&mut n.host_path);
            }
            for f in &mut v.host_files {
                strip(&mut f.host_path);
            }
        }
    }

    /// The vendor entry for a CDI kind, if that vendor was found.
    pub fn vendor_by_kind(&self, kind: &str) -> Option<&VendorInventory> {
        self.vendors.iter().find(|v| v.kind == kind)
    }

    /// The vendor entry for a profile name, if that vendor was found.
    pub fn vendor(&self, profile: &str) -> Option<&VendorInventory> {
        self.vendors.iter().find(|v| v.profile == profile)
    }

    /// MIG devices of the vendor as (parent GPU, MIG device), in GPU then MIG index order.
    pub fn mig_devices(&self) -> impl Iterator<Item = (&Device, &MigDevice)> {
        self.vendors.iter().flat_map(|v| v.mig_devices())
    }

    /// Total number of devices of all vendors.
    pub fn device_count(&self) -> usize {
        self.vendors.iter().map(|v| v.devices.len()).sum()
    }
}

impl VendorInventory {
    /// This vendor's MIG devices as (parent GPU, MIG device), in GPU then MIG index order.
    pub fn mig_devices(&self) -> impl Iterator<Item = (&Device, &MigDevice)> {
        self.devices.iter().flat_map(|d| d.mig.iter().flat_map(move |m| m.devices.iter().map(move |x| (d, x))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_mount_comes_off_host_paths_only() {
        let node = |p: &str| DeviceNode {
            path: "/dev/nvidia0".into(),
            host_path: p.into(),
            node_type: 'c',
            major: 195,
            minor: 0,
            file_mode: None,
            gid: None,
        };
        let mut inv = Inventory {
            vendors: vec![VendorInventory {
                devices: vec![Device { nodes: vec![node("/host/dev/nvidia0")], ..Default::default() }],
                shared_nodes: vec![node("/other/dev/nvidiactl")],
                host_files: vec![HostFile {
                    capability: "compute".into(),
                    kind: HostFileKind::Library,
                    host_path: "/host/usr/lib/libcuda.so.1".into(),
                    container_path: "/host/usr/lib/libcuda.so.1".into(),
                }],
                ..Default::default()
            }],
            ..Default::default()
        };
        inv.strip_host_mount(std::path::Path::new("/host"));
        let v = &inv.vendors[0];
        assert_eq!(v.devices[0].nodes[0].host_path, PathBuf::from("/dev/nvidia0"));
        assert_eq!(v.shared_nodes[0].host_path, PathBuf::from("/other/dev/nvidiactl"), "not under the mount");
        assert_eq!(v.host_files[0].host_path, PathBuf::from("/usr/lib/libcuda.so.1"));
        assert_eq!(v.host_files[0].container_path, "/host/usr/lib/libcuda.so.1", "container paths untouched");
    }
}
