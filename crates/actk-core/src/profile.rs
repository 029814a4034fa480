//! Vendor profiles: a vendor is data, not a code fork (DESIGN.md "Vendor profiles").
//!
//! A profile is a TOML document. Built-in profiles ship in the binary (`profiles/*.toml` in
//! this crate); users add or override profiles as `*.toml` files in a directory (default
//! `/etc/actk/profiles.d`). A user file whose `name` equals a built-in replaces it.
//!
//! OWNERSHIP NOTE (build phase): the struct shape below is the contract between discovery,
//! CDI generation and request parsing. Extend it by adding fields with serde defaults.

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
    /// Whether `a-b` ranges are accepted in lists (Neuron: yes).
    #[serde(default)]
    pub ranges: bool,
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
    /// Other absolute paths (may contain `{driver_version}`), mounted when present.
    #[serde(default)]
    pub files: Vec<String>,
}

/// Kubernetes resources this vendor is advertised as.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Kubernetes {
    /// Extended resource names (`aws.amazon.com/neuron`, `aws.amazon.com/neuroncore`).
    #[serde(default)]
    pub resources: Vec<String>,
}
