//! The profile model: the types a profile document deserialises into. A file of its own, with
//! nothing but serde and std, because build.rs compiles it too: it reads the built-in TOML
//! profiles into these types and embeds them in postcard's binary form (see
//! [`super::builtin`]).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One vendor profile. See `profiles/*.toml` for commented examples.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    /// Short name (`nvidia`, `neuron`, ...). Unique; a user profile with a built-in's name replaces it.
    pub name: String,
    /// CDI kind `vendor/class` (`nvidia.com/gpu`).
    pub kind: String,
    /// Free text shown by `actk info`.
    #[serde(default)]
    pub description: String,
    /// Which discovery code reads the host: `generic` (profile-driven char nodes + sysfs) or a
    /// vendor enricher (`nvidia`, `neuron`, `amd`, `gaudi`, `accel`).
    #[serde(default = "default_discovery")]
    pub discovery: String,
    /// How containers select devices of this vendor.
    #[serde(default)]
    pub selection: Selection,
    /// Per-device nodes and identity attributes.
    #[serde(default)]
    pub devices: DeviceTemplate,
    /// Shared/control nodes every container using this vendor gets (only those present).
    #[serde(default)]
    pub control_nodes: Vec<ControlNode>,
    /// Host files to mount, per capability name (`utility`, `compute`, ..., `base` = always).
    #[serde(default)]
    pub capabilities: BTreeMap<String, CapabilityFiles>,
    /// Env entries (`NAME=value`) added to every container that gets a device of this vendor.
    #[serde(default)]
    pub env: Vec<String>,
    /// Kubernetes extended resource names (`nvidia.com/gpu`).
    #[serde(default)]
    pub kubernetes: Kubernetes,
    /// Forward-compatibility libraries an image may ship (CUDA's /usr/local/cuda/compat): with
    /// the ld.so.cache hook, generated edits also get `actk-hook enable-cuda-compat`, which puts
    /// them first when they are of a newer driver than the host's.
    #[serde(default)]
    pub forward_compat: Option<ForwardCompat>,
}

/// [`Profile::forward_compat`].
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ForwardCompat {
    /// Absolute container directory (`/usr/local/cuda/compat`).
    pub dir: String,
    /// Library name without version (`libcuda.so`); its versioned file names the driver.
    pub library: String,
}

fn default_discovery() -> String {
    "generic".into()
}

/// Selection variables and their syntax.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Selection {
    /// Env variables that select devices (`NVIDIA_VISIBLE_DEVICES`). The first is canonical.
    #[serde(default)]
    pub env: Vec<String>,
    /// Env variable listing driver capabilities (`NVIDIA_DRIVER_CAPABILITIES`), if any.
    #[serde(default)]
    pub capabilities_env: Option<String>,
    /// Capabilities used when the capabilities variable is unset (`["utility", "compute"]`).
    #[serde(default)]
    pub default_capabilities: Vec<String>,
    /// Env variable selecting cores rather than devices (`NEURON_RT_VISIBLE_CORES`), if any.
    #[serde(default)]
    pub cores_env: Option<String>,
    /// Env variable saying how many physical cores make one core of `cores_env` (AWS Neuron's
    /// logical NeuronCore configuration, `NEURON_LOGICAL_NC_CONFIG`: 2 on Trainium2 groups two
    /// physical NeuronCores into one), if the vendor has one.
    #[serde(default)]
    pub logical_core_size_env: Option<String>,
    /// Whether `a-b` ranges are accepted in lists (Neuron and AMD: yes).
    #[serde(default)]
    pub ranges: bool,
    /// Env variables listing an attribute of the selected devices, comma-separated in device
    /// order (`HABANA_VISIBLE_MODULES` = their `module_id`s, as Habana's runtime sets it): added
    /// when the container does not set the variable; when it does, every value must belong to a
    /// selected device (the vendor's user space narrows to them).
    #[serde(default)]
    pub device_env: Vec<DeviceEnv>,
    /// Check the image's `NVIDIA_REQUIRE_*` constraints (cuda, driver, arch, brand) against
    /// this vendor's driver before injecting ([`crate::require`]; `NVIDIA_DISABLE_REQUIRE`).
    #[serde(default)]
    pub nvidia_require: bool,
}

/// One [`Selection::device_env`] entry.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DeviceEnv {
    /// The variable (`HABANA_VISIBLE_MODULES`).
    pub name: String,
    /// The device attribute it lists (`module_id`, a key of the device's attributes).
    pub attribute: String,
}

/// How to find per-device nodes and attributes.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DeviceTemplate {
    /// Container path pattern of the per-device node with `{index}` (`/dev/neuron{index}`).
    #[serde(default)]
    pub node: Option<String>,
    /// sysfs directory of a device with `{index}` (`/sys/class/neuron_device/neuron{index}`).
    #[serde(default)]
    pub sysfs: Option<String>,
    /// Identity attributes: name (`uuid`, `model`, `pci_bus_id`, `numa_node`, `cores`, or any
    /// other) to a path relative to the sysfs directory. A value starting with `@` means "the
    /// basename of the symlink target" (`@device` gives the PCI bus id).
    #[serde(default)]
    pub attributes: BTreeMap<String, String>,
    /// Name in /proc/devices of the driver's dynamic major, to check the node against.
    #[serde(default)]
    pub proc_devices_name: Option<String>,
    /// Fixed major number the per-device nodes must have (`195` for NVIDIA, `261` for DRM
    /// accel); a node with another major is skipped with a warning.
    #[serde(default)]
    pub major: Option<u32>,
    /// Kernel driver (basename of the sysfs `device/driver` link) whose devices this profile
    /// claims (`habanalabs`). With it, only devices bound to that driver are taken; profiles
    /// without it skip devices whose driver another profile claims.
    #[serde(default)]
    pub driver: Option<String>,
    /// More per-device nodes, container path patterns with `{index}`
    /// (`/dev/accel/accel_controlD{index}`); taken when present.
    #[serde(default)]
    pub extra_nodes: Vec<String>,
}

/// A shared/control device node.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ControlNode {
    /// Container path (`/dev/nvidiactl`); may be a glob over the last component (`/dev/nvidia-caps/*`).
    pub path: String,
    /// Only for these capabilities (empty: always).
    #[serde(default)]
    pub capabilities: Vec<String>,
}

/// Host files one capability mounts.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CapabilityFiles {
    /// Library sonames without version (`libcuda.so`): found through ld.so.cache, versioned
    /// files matching the driver version only.
    #[serde(default)]
    pub libraries: Vec<String>,
    /// Executables looked up in the standard bin directories (`nvidia-smi`).
    #[serde(default)]
    pub binaries: Vec<String>,
    /// Other absolute paths (may contain `{driver_version}`; `*` allowed in the last
    /// component), mounted when present: regular files, unix sockets (a daemon's socket such
    /// as /run/nvidia-persistenced/socket) and directories (/tmp/nvidia-mps), not device nodes.
    #[serde(default)]
    pub files: Vec<String>,
    /// Firmware paths, same syntax as `files` (`/lib/firmware/nvidia/{driver_version}/*`).
    #[serde(default)]
    pub firmware: Vec<String>,
    /// Architecture of the libraries. Unset: the host's own (x86-64 or aarch64, from its kernel:
    /// /proc/sys/kernel/arch, uname). `compat32` or `i386`: the 32-bit copies next to them (i386
    /// on x86-64, none on aarch64). `x86_64` / `aarch64`: only on a host of that architecture.
    /// Matched against the ld.so.cache entry flags, and the ELF header when scanning directories.
    #[serde(default)]
    pub arch: Option<String>,
}

/// Kubernetes resources this vendor is advertised as.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Kubernetes {
    /// Extended resource names (`aws.amazon.com/neuron`, `aws.amazon.com/neuroncore`).
    #[serde(default)]
    pub resources: Vec<String>,
    /// The capacity a DRA claim consumes when it shares one of these devices with other claims
    /// (KEP-5075 consumable capacity): `memory` (bytes, the device's total), `cores` (the
    /// device's core count) or `shares` (100 per device, time-slicing). A device that does
    /// not report the named capacity is shared in `shares`. `None`: devices are never shared
    /// through DRA (each claim gets whole devices).
    #[serde(default)]
    pub shared_capacity: Option<String>,
}
