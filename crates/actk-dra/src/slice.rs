//! From the inventory to ResourceSlices (resource.k8s.io/v1, Kubernetes 1.34): pure functions.
//!
//! One pool per node, named after the node, published by driver [`DRIVER`] (`actk.dev`). Every
//! device of every served profile is one slice device named `<profile>-<index>`
//! ([`device_name`]), with these attributes under the driver's domain (unqualified names in the
//! API, `device.attributes["actk.dev"].NAME` in CEL):
//!
//! | attribute | type | from |
//! |---|---|---|
//! | `kind` | string | CDI kind (`nvidia.com/gpu`), what the DeviceClasses select on |
//! | `profile` | string | actk profile (`nvidia`, `neuron`, ...) |
//! | `vendor` | string | the kind's vendor (`nvidia.com`, `aws.amazon.com`, ...) |
//! | `index` | int | index as the vendor tools number devices |
//! | `uuid`, `model`, `pciBusID` | string | inventory, when known |
//! | `driverVersion` | version | the kind's driver version as semver 2.0 ([`semver_of`]: `580.95.05` -> `580.95.5`, `2.24.7.0` -> `2.24.7+0`), for CEL `isGreaterThan(semver("570.0.0"))` |
//! | `numaNode` | int | sysfs `numa_node`, when known |
//! | `architecture` | string | Neuron `info/architecture/arch_type` |
//! | `instanceType` | string | Neuron devices on EC2: the instance type (`trn1.32xlarge`, DMI `product_name` where `sys_vendor` is `Amazon EC2`) |
//! | `hiveID` | string | AMD XGMI hive (KFD `hive_id`): GPUs with one value are XGMI-connected |
//! | `computePartition`, `memoryPartition`, `partitionProfile` | string | AMD partition modes (`cpx`, `nps4`) and their profile `cpx_nps4` (the name ROCm's device plugin gives the resource) |
//! | `ringPosition` | int | position in a link ring (Inferentia2 NeuronLink) |
//! | `torusRow`, `torusColumn` | int | position in a `side x side` link torus (Trainium NeuronLink) |
//! | `linkGroup2`, `linkGroup4`, `linkGroup8`, `linkGroup16` | int | id of the aligned, connected group of that size holding the device |
//! | `migMode` | string | NVIDIA MIG mode, `enabled` or `disabled` (NVML `nvmlDeviceGetMigMode`, current; `nvidia-smi --query-gpu=mig.mode.current`), on GPUs that support MIG |
//!
//! plus the standard attributes of k8s.io/dynamic-resource-allocation/deviceattribute (1.37):
//! `resource.kubernetes.io/pciBusID` (`0000:1b:00.0`), `resource.kubernetes.io/pcieRoot`
//! (`pci0000:17`, where the PCI function's sysfs path names its root complex) and
//! `resource.kubernetes.io/numaNode` (int, the scalar form; left out without NUMA affinity).
//! They are plain qualified names, so a 1.34 API server takes them as well. Capacities:
//! `memory` (NVIDIA, when NVML reported it: attribute `memory_bytes`) and `cores` (Neuron core
//! count); the publisher makes devices of profiles that share ([`share`]) multi-allocatable with
//! a request policy on the profile's shared capacity (`shares`, 100 per device, where the
//! device reports neither).
//!
//! A GPU in MIG mode is published as itself with `migMode: enabled` so that CEL can tell it
//! apart: a CUDA process cannot use such a GPU whole, only its MIG devices, which follow it as
//! devices of their own ([`mig_slice_device`], `<gpu>-mig-<GI>-<CI>`, attribute `migProfile`).
//! The chart's profile DeviceClasses match only devices whose `migMode` is absent or not
//! `enabled` and that are not MIG devices ([`NOT_MIG_ENABLED`]); class `actk-nvidia-mig`
//! matches the MIG devices ([`IS_MIG_DEVICE`]).
//!
//! `linkGroupK` makes "K linked devices" a `matchAttribute` constraint: on a ring of N devices
//! (K dividing N) group `g` is the arc at ring positions `g*K .. g*K+K-1`; on a torus, K below
//! the side is an aligned run of one row, K a multiple of the side is that many whole rows (each
//! row is a NeuronLink ring, adjacent rows are linked column-wise). The groups come from the link
//! graph's recognised shape (actk-node's topology), not the vendor's name.

use actk_core::inventory::{Device, Inventory, VendorInventory};
use actk_node::topology::{self, Node, Shape};
use k8s_openapi::api::resource::v1::{
    CounterSet, Device as SliceDevice, DeviceAttribute, DeviceCapacity, ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The driver name: the domain of the attributes, `spec.driver` of slices and of allocations.
pub const DRIVER: &str = "actk.dev";

/// The standard attribute naming a device's PCIe root complex (KEP-5316; `pci<domain>:<bus>`).
pub const PCIE_ROOT: &str = "resource.kubernetes.io/pcieRoot";

/// The standard attribute holding a PCI device's address in extended BDF notation
/// (`0000:1b:00.0`; deviceattribute `StandardDeviceAttributePCIBusID`).
pub const PCI_BUS_ID: &str = "resource.kubernetes.io/pciBusID";

/// The standard attribute holding a device's NUMA node (int; deviceattribute
/// `StandardDeviceAttributeNUMANode`, Kubernetes 1.37). Devices without NUMA affinity have none.
pub const NUMA_NODE: &str = "resource.kubernetes.io/numaNode";

/// The CEL condition of the chart's DeviceClasses that leaves out GPUs in MIG mode (a device
/// without the attribute is not one).
pub const NOT_MIG_ENABLED: &str = r#"(!("migMode" in device.attributes["actk.dev"]) || device.attributes["actk.dev"].migMode != "enabled") && !("migProfile" in device.attributes["actk.dev"])"#;

/// The CEL condition of the chart's DeviceClass `actk-nvidia-mig`: MIG devices
/// ([`mig_slice_device`]).
pub const IS_MIG_DEVICE: &str = r#""migProfile" in device.attributes["actk.dev"]"#;

/// Most devices one ResourceSlice may hold (resource.k8s.io/v1 `ResourceSliceMaxDevices`).
pub const MAX_DEVICES_PER_SLICE: usize = 128;

/// Group sizes published as `linkGroupK`.
pub const LINK_GROUP_SIZES: &[u32] = &[2, 4, 8, 16];

/// The slice device name of device `index` of profile `profile`: `<profile>-<index>`, made a
/// DNS label (lower case, other characters `-`, at most 63 characters).
pub fn device_name(profile: &str, index: u32) -> String {
    let mut p: String = profile
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' })
        .collect::<String>()
        .trim_matches('-')
        .to_string();
    if p.is_empty() {
        p = "dev".into();
    }
    let suffix = format!("-{index}");
    p.truncate(63 - suffix.len());
    format!("{}{suffix}", p.trim_end_matches('-'))
}

fn string(v: impl Into<String>) -> DeviceAttribute {
    DeviceAttribute { string: Some(v.into()), ..Default::default() }
}

fn int(v: i64) -> DeviceAttribute {
    DeviceAttribute { int: Some(v), ..Default::default() }
}

fn version(v: impl Into<String>) -> DeviceAttribute {
    DeviceAttribute { version: Some(v.into()), ..Default::default() }
}

/// A driver version as semver 2.0, the form the API server accepts for a `version` attribute
/// (its `semverRe`: `MAJOR.MINOR.PATCH` without leading zeros, then optional pre-release and
/// build parts): the leading numeric components with leading zeros dropped, padded to three
/// (`560.35` -> `560.35.0`); further components and any suffix become build metadata, which
/// comparisons ignore (`2.24.7.0` -> `2.24.7+0`, Gaudi's `1.18.0-ee698fb` -> `1.18.0+ee698fb`:
/// that suffix is a build, not a pre-release). `None` when it does not start with a number or
/// the result is longer than 64 characters (the API's limit).
pub fn semver_of(raw: &str) -> Option<String> {
    let raw = raw.trim();
    let split = raw.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(raw.len());
    let (numeric, suffix) = raw.split_at(split);
    let parts: Vec<&str> = numeric.split('.').filter(|p| !p.is_empty()).collect();
    if parts.is_empty() || !numeric.starts_with(|c: char| c.is_ascii_digit()) {
        return None;
    }
    let norm = |p: &str| -> Option<String> { p.parse::<u64>().ok().map(|n| n.to_string()) };
    let mut core: Vec<String> = parts.iter().take(3).map(|p| norm(p)).collect::<Option<_>>()?;
    while core.len() < 3 {
        core.push("0".into());
    }
    let mut build: Vec<String> = parts.iter().skip(3).map(|p| p.to_string()).collect();
    // The suffix's identifiers ([0-9A-Za-z-]+, dot-separated); other characters split them.
    build.extend(
        suffix
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
            .map(|p| p.trim_matches('-'))
            .filter(|p| !p.is_empty())
            .map(str::to_string),
    );
    let mut out = core.join(".");
    if !build.is_empty() {
        out.push('+');
        out.push_str(&build.join("."));
    }
    (out.len() <= 64).then_some(out)
}

/// Whether `s` is a PCI address in extended BDF notation, `DDDD:BB:DD.F` in hexadecimal (what
/// deviceattribute's `verifyPCIBDFFormat` accepts for the standard `pciBusID`).
pub fn is_pci_bdf(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 12
        && b[4] == b':'
        && b[7] == b':'
        && b[10] == b'.'
        && b.iter().enumerate().all(|(i, c)| matches!(i, 4 | 7 | 10) || c.is_ascii_hexdigit())
}

/// Facts of the node rather than of one device, read from the host root once per publication.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeFacts {
    /// The EC2 instance type (`trn1.32xlarge`): DMI `product_name` where `sys_vendor` is
    /// `Amazon EC2` (Nitro instances report their type there, as `dmidecode -s
    /// system-product-name` shows).
    pub instance_type: Option<String>,
}

impl NodeFacts {
    /// The facts of the node whose `/` is `root`; missing files leave a fact out.
    pub fn read(root: &Path) -> NodeFacts {
        let dmi = root.join("sys/class/dmi/id");
        let read = |f: &str| std::fs::read_to_string(dmi.join(f)).ok().map(|s| s.trim().to_string());
        let instance_type = (read("sys_vendor").as_deref() == Some("Amazon EC2"))
            .then(|| read("product_name"))
            .flatten()
            .filter(|t| !t.is_empty() && t.len() <= 64);
        NodeFacts { instance_type }
    }
}

/// The PCIe root complex of PCI function `bus` (`0000:18:00.0`) under host root `root`: the
/// `pciDDDD:BB` component of the function's sysfs path (`/sys/devices/pci0000:17/.../0000:18:00.0`),
/// `None` when the function or its link is not there.
pub fn pcie_root(root: &Path, bus: &str) -> Option<String> {
    let link = std::fs::read_link(root.join("sys/bus/pci/devices").join(bus)).ok()?;
    link.components().filter_map(|c| c.as_os_str().to_str()).find(|c| is_pci_root(c)).map(str::to_string)
}

fn is_pci_root(c: &str) -> bool {
    // pci<4 hex>:<2 hex>, e.g. pci0000:00
    let Some(rest) = c.strip_prefix("pci") else { return false };
    let b = rest.as_bytes();
    b.len() == 7 && b[4] == b':' && rest.bytes().enumerate().all(|(i, x)| i == 4 || x.is_ascii_hexdigit())
}

/// Topology attributes of each device of `vendor`, by index, from its link graph's shape.
pub fn link_attributes(vendor: &VendorInventory) -> BTreeMap<u32, BTreeMap<String, DeviceAttribute>> {
    let nodes: Vec<Node> =
        vendor.devices.iter().map(|d| Node { index: d.index, numa: d.numa_node, links: d.links.clone() }).collect();
    let mut out: BTreeMap<u32, BTreeMap<String, DeviceAttribute>> = BTreeMap::new();
    if nodes.iter().all(|n| n.links.is_empty()) {
        return out;
    }
    match topology::shape(&nodes) {
        Shape::Ring(order) => {
            let n = order.len() as u32;
            for (pos, idx) in order.iter().enumerate() {
                let pos = pos as u32;
                let a = out.entry(*idx).or_default();
                a.insert("ringPosition".into(), int(i64::from(pos)));
                for &k in LINK_GROUP_SIZES {
                    if k <= n && n.is_multiple_of(k) {
                        a.insert(format!("linkGroup{k}"), int(i64::from(pos / k)));
                    }
                }
            }
        }
        Shape::Torus { side } => {
            for i in 0..side * side {
                let (r, c) = (i / side, i % side);
                let a = out.entry(i).or_default();
                a.insert("torusRow".into(), int(i64::from(r)));
                a.insert("torusColumn".into(), int(i64::from(c)));
                for &k in LINK_GROUP_SIZES {
                    let group = if k < side && side.is_multiple_of(k) {
                        Some(r * (side / k) + c / k)
                    } else if k.is_multiple_of(side) && side.is_multiple_of(k / side) && k <= side * side {
                        Some(r / (k / side))
                    } else {
                        None
                    };
                    if let Some(g) = group {
                        a.insert(format!("linkGroup{k}"), int(i64::from(g)));
                    }
                }
            }
        }
        Shape::Links => {}
    }
    out
}

/// Quantity text for a byte count: `NMi` when it is whole mebibytes, else bytes.
fn bytes_quantity(b: u64) -> Quantity {
    const MI: u64 = 1 << 20;
    Quantity(if b.is_multiple_of(MI) { format!("{}Mi", b / MI) } else { b.to_string() })
}

/// The slice device for inventory device `d` of `vendor`; `root` is the host root (for the PCIe
/// root), `facts` the node's ([`NodeFacts::read`]), `links` what [`link_attributes`] gave for
/// the device.
pub fn slice_device(
    root: &Path,
    facts: &NodeFacts,
    vendor: &VendorInventory,
    d: &Device,
    links: Option<&BTreeMap<String, DeviceAttribute>>,
) -> SliceDevice {
    let mut attrs: BTreeMap<String, DeviceAttribute> = BTreeMap::new();
    attrs.insert("kind".into(), string(&vendor.kind));
    attrs.insert("profile".into(), string(&vendor.profile));
    attrs.insert("vendor".into(), string(vendor.kind.split('/').next().unwrap_or_default()));
    attrs.insert("index".into(), int(i64::from(d.index)));
    if let Some(u) = &d.uuid {
        attrs.insert("uuid".into(), string(u));
    }
    if let Some(m) = &d.model {
        attrs.insert("model".into(), string(m));
    }
    if let Some(b) = &d.pci_bus_id {
        attrs.insert("pciBusID".into(), string(b));
        if is_pci_bdf(b) {
            attrs.insert(PCI_BUS_ID.into(), string(b));
        }
        if let Some(r) = pcie_root(root, b) {
            attrs.insert(PCIE_ROOT.into(), string(r));
        }
    }
    if let Some(n) = d.numa_node {
        attrs.insert("numaNode".into(), int(i64::from(n)));
        attrs.insert(NUMA_NODE.into(), int(i64::from(n)));
    }
    if let Some(v) = vendor.driver_version.as_deref().and_then(semver_of) {
        attrs.insert("driverVersion".into(), version(v));
    }
    if let Some(a) = d.attributes.get("architecture") {
        attrs.insert("architecture".into(), string(a));
    }
    if vendor.profile == "neuron"
        && let Some(t) = &facts.instance_type
    {
        attrs.insert("instanceType".into(), string(t));
    }
    if let Some(h) = d.attributes.get("hive_id") {
        attrs.insert("hiveID".into(), string(h));
    }
    let compute = d.attributes.get("compute_partition");
    let memory = d.attributes.get("memory_partition");
    if let Some(c) = compute {
        attrs.insert("computePartition".into(), string(c));
    }
    if let Some(m) = memory {
        attrs.insert("memoryPartition".into(), string(m));
    }
    if let (Some(c), Some(m)) = (compute, memory) {
        attrs.insert("partitionProfile".into(), string(format!("{c}_{m}")));
    }
    if let Some(m) = &d.mig {
        attrs.insert("migMode".into(), string(if m.enabled { "enabled" } else { "disabled" }));
    }
    if let Some(l) = links {
        attrs.extend(l.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    let mut capacity: BTreeMap<String, DeviceCapacity> = BTreeMap::new();
    if let Some(b) = d.attributes.get("memory_bytes").and_then(|m| m.parse::<u64>().ok()) {
        capacity.insert("memory".into(), DeviceCapacity { value: bytes_quantity(b), ..Default::default() });
    }
    if let Some(c) = d.cores {
        capacity.insert("cores".into(), DeviceCapacity { value: Quantity(c.to_string()), ..Default::default() });
    }
    SliceDevice {
        name: device_name(&vendor.profile, d.index),
        attributes: Some(attrs),
        capacity: (!capacity.is_empty()).then_some(capacity),
        ..Default::default()
    }
}

/// Capacity published on shareable devices that report neither memory nor cores: this many
/// shares per device (a claim for 25 of them holds a quarter of the device's time slices).
pub const SHARES_PER_DEVICE: u32 = 100;

/// Makes the devices of profiles with a `kubernetes.shared_capacity` shareable between claims
/// (KEP-5075 consumable capacity, resource.k8s.io/v1 with feature gate `DRAConsumableCapacity`,
/// alpha in 1.34, beta in 1.36): `allowMultipleAllocations: true`, and the named capacity
/// (`memory`, `cores`; `shares` = [`SHARES_PER_DEVICE`], added where the device reports
/// neither) gets a `requestPolicy` whose `default` is the whole capacity, so that a claim
/// that names no capacity still gets the device to itself, and whose `validRange` starts at
/// one unit (`1Mi` of memory, one core, one share) in steps of one unit.
///
/// An API server that does not serve the gate drops both fields when the slice is written
/// (its strategy's dropDisabledFields), so the same slice is a pool of whole devices there.
/// GPUs in MIG mode are never shared whole (a CUDA process cannot use them), nor are MIG
/// devices (each is a partition already).
pub fn share(devices: &mut [SliceDevice], profiles: &[actk_core::profile::Profile]) {
    use k8s_openapi::api::resource::v1::{CapacityRequestPolicy, CapacityRequestPolicyRange};
    for d in devices {
        let attrs = d.attributes.as_ref();
        let profile = attrs.and_then(|a| a.get("profile")).and_then(|p| p.string.as_deref());
        let Some(wanted) = profiles
            .iter()
            .find(|p| Some(p.name.as_str()) == profile)
            .and_then(|p| p.kubernetes.shared_capacity.clone())
        else {
            continue;
        };
        if attrs.and_then(|a| a.get("migMode")).and_then(|m| m.string.as_deref()) == Some("enabled")
            || attrs.is_some_and(|a| a.contains_key("migProfile"))
        {
            continue;
        }
        let capacity = d.capacity.get_or_insert_with(BTreeMap::new);
        let name = if capacity.contains_key(&wanted) { wanted } else { "shares".to_string() };
        let cap = capacity
            .entry(name.clone())
            .or_insert_with(|| DeviceCapacity { value: Quantity(SHARES_PER_DEVICE.to_string()), ..Default::default() });
        // Steps of 1Mi only where the total is whole mebibytes: the default (the total) must be
        // a valid request itself.
        let unit = if name == "memory" && cap.value.0.ends_with("Mi") { "1Mi" } else { "1" };
        // The API server refuses a range whose first step passes the value (min + step <=
        // value): a device of less than two units (one NeuronCore, no memory) cannot be split,
        // and its policy would get the whole slice refused. It stays a whole device.
        let units = crate::config::quantity_bytes(&cap.value.0)
            .zip(crate::config::quantity_bytes(unit))
            .map_or(0, |(v, u)| v / u);
        if units < 2 {
            continue;
        }
        cap.request_policy = Some(CapacityRequestPolicy {
            default: Some(cap.value.clone()),
            valid_range: Some(CapacityRequestPolicyRange {
                min: Quantity(unit.into()),
                max: Some(cap.value.clone()),
                step: Some(Quantity(unit.into())),
            }),
            valid_values: None,
        });
        d.allow_multiple_allocations = Some(true);
    }
}

/// The slice device name of MIG device `m` of GPU `gpu` of profile `profile`:
/// `<profile>-<gpu>-mig-<GI id>-<CI id>` (`nvidia-0-mig-2-0`).
pub fn mig_device_name(profile: &str, gpu: u32, m: &actk_core::inventory::MigDevice) -> String {
    format!("{}-mig-{}-{}", device_name(profile, gpu), m.gpu_instance, m.compute_instance)
}

/// The slice device of MIG device `m` of GPU `d` (a GPU in MIG mode): attributes `kind`,
/// `profile`, `vendor`, `driverVersion` as the GPU's, `model` of the parent, and
/// `migProfile` (`3g.40gb`), `uuid` (`MIG-...`), `parentUUID`, `parentIndex`, `migIndex`
/// (`nvidia-smi -L`'s), `gpuInstance`, `computeInstance`, `placementStart`, `placementSize`
/// (memory slices); capacities `memory` (the GPU instance's, bytes), `multiprocessors` and the
/// engines (`copyEngines`, `decoders`, `encoders`, `jpegEngines`, `ofaEngines`), as NVML
/// reports them. The chart's DeviceClass `actk-nvidia-mig` selects these (`migProfile` set);
/// `actk-nvidia` leaves them out.
pub fn mig_slice_device(vendor: &VendorInventory, d: &Device, m: &actk_core::inventory::MigDevice) -> SliceDevice {
    let mut attrs = mig_attributes(vendor, d, &m.profile, m.placement.start, m.placement.size);
    attrs.insert("uuid".into(), string(&m.uuid));
    attrs.insert("migIndex".into(), int(i64::from(m.index)));
    attrs.insert("gpuInstance".into(), int(i64::from(m.gpu_instance)));
    attrs.insert("computeInstance".into(), int(i64::from(m.compute_instance)));
    let capacity = mig_capacity(m.memory_mib, m.multiprocessors, &m.engines);
    SliceDevice {
        name: mig_device_name(&vendor.profile, d.index, m),
        attributes: Some(attrs),
        capacity: (!capacity.is_empty()).then_some(capacity),
        ..Default::default()
    }
}

/// The attributes a MIG device of GPU `d` has once its profile and placement are known: `kind`,
/// `profile`, `vendor`, `driverVersion` as the GPU's, `model` and the NUMA node of the parent,
/// `parentUUID`, `parentIndex`, `migProfile`, `placementStart`, `placementSize`. Shared by the
/// MIG devices that exist ([`mig_slice_device`]) and the placements of dynamic MIG
/// ([`crate::mig`]).
pub(crate) fn mig_attributes(
    vendor: &VendorInventory,
    d: &Device,
    mig_profile: &str,
    start: u32,
    size: u32,
) -> BTreeMap<String, DeviceAttribute> {
    let mut attrs: BTreeMap<String, DeviceAttribute> = BTreeMap::new();
    attrs.insert("kind".into(), string(&vendor.kind));
    attrs.insert("profile".into(), string(&vendor.profile));
    attrs.insert("vendor".into(), string(vendor.kind.split('/').next().unwrap_or_default()));
    if let Some(v) = vendor.driver_version.as_deref().and_then(semver_of) {
        attrs.insert("driverVersion".into(), version(v));
    }
    if let Some(model) = &d.model {
        attrs.insert("model".into(), string(model));
    }
    if let Some(u) = &d.uuid {
        attrs.insert("parentUUID".into(), string(u));
    }
    attrs.insert("parentIndex".into(), int(i64::from(d.index)));
    attrs.insert("migProfile".into(), string(mig_profile));
    attrs.insert("placementStart".into(), int(i64::from(start)));
    attrs.insert("placementSize".into(), int(i64::from(size)));
    if let Some(n) = d.numa_node {
        attrs.insert(NUMA_NODE.into(), int(i64::from(n)));
    }
    attrs
}

/// A MIG device's capacities: `memory` (the GPU instance's, `<MiB>Mi`), `multiprocessors` and
/// the engines, as NVML reports them; zero values left out.
pub(crate) fn mig_capacity(
    memory_mib: u64,
    multiprocessors: u32,
    engines: &BTreeMap<String, u32>,
) -> BTreeMap<String, DeviceCapacity> {
    let cap = |v: String| DeviceCapacity { value: Quantity(v), ..Default::default() };
    let mut capacity: BTreeMap<String, DeviceCapacity> = BTreeMap::new();
    if memory_mib > 0 {
        capacity.insert("memory".into(), cap(format!("{memory_mib}Mi")));
    }
    if multiprocessors > 0 {
        capacity.insert("multiprocessors".into(), cap(multiprocessors.to_string()));
    }
    for (k, n) in engines {
        capacity.insert(k.clone(), cap(n.to_string()));
    }
    capacity
}

/// Slice devices of every vendor in `inventory` whose profile is in `profiles` (all when
/// `None`), leaving out devices without a usable node (nothing could be prepared for them) and
/// those `excluded` names (unhealthy ones), in inventory order.
pub fn devices(
    inventory: &Inventory,
    profiles: Option<&BTreeSet<String>>,
    excluded: &BTreeSet<String>,
) -> Vec<SliceDevice> {
    let mut out = Vec::new();
    let facts = NodeFacts::read(&inventory.root);
    for v in &inventory.vendors {
        if profiles.is_some_and(|p| !p.contains(&v.profile)) {
            continue;
        }
        let links = link_attributes(v);
        for d in &v.devices {
            let name = device_name(&v.profile, d.index);
            if d.nodes.is_empty() || excluded.contains(&name) {
                continue;
            }
            out.push(slice_device(&inventory.root, &facts, v, d, links.get(&d.index)));
            if let Some(m) = d.mig.as_ref().filter(|m| m.enabled) {
                out.extend(m.devices.iter().map(|m| mig_slice_device(v, d, m)));
            }
        }
    }
    out
}

/// Where the slices are published: the node, and its UID for the owner reference (so that the
/// garbage collector removes them with the Node).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRef {
    /// Node name (also the pool name).
    pub name: String,
    /// Node metadata.uid; `None`: no owner reference.
    pub uid: Option<String>,
}

/// Name of slice `i` of `node`'s pool: `<node>-actk.dev-<i>`.
pub fn slice_name(node: &str, i: usize) -> String {
    format!("{node}-{DRIVER}-{i}")
}

/// What a pool publishes: its devices and the counter sets its partitionable devices consume
/// (KEP-4815; empty without dynamic MIG, [`crate::mig`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Pool {
    /// The devices.
    pub devices: Vec<SliceDevice>,
    /// The shared counter sets.
    pub counter_sets: Vec<CounterSet>,
}

impl From<Vec<SliceDevice>> for Pool {
    fn from(devices: Vec<SliceDevice>) -> Pool {
        Pool { devices, counter_sets: Vec::new() }
    }
}

/// Most devices one ResourceSlice may hold when any of them has a taint or consumes counters
/// (resource.k8s.io/v1 `ResourceSliceMaxDevicesWithAdvancedFeatures`, 1.35+).
pub const MAX_ADVANCED_DEVICES_PER_SLICE: usize = 64;

/// Most counter sets one ResourceSlice may hold (`ResourceSliceMaxCounterSets`).
pub const MAX_COUNTER_SETS_PER_SLICE: usize = 8;

/// The ResourceSlices of `node`'s pool at `generation` holding `pool`: first the counter sets,
/// at most [`MAX_COUNTER_SETS_PER_SLICE`] a slice and no devices beside them (1.37's validation:
/// "only one of devices and sharedCounters"), then the devices, at most
/// [`MAX_DEVICES_PER_SLICE`] each ([`MAX_ADVANCED_DEVICES_PER_SLICE`] when any device has a
/// taint or consumes counters); one slice without devices when there is nothing (so that the
/// scheduler sees the pool is empty rather than unknown).
pub fn slices(node: &NodeRef, generation: i64, pool: Pool) -> Vec<ResourceSlice> {
    let Pool { devices, counter_sets } = pool;
    let advanced = devices.iter().any(|d| d.taints.is_some() || d.consumes_counters.is_some());
    let per = if advanced { MAX_ADVANCED_DEVICES_PER_SLICE } else { MAX_DEVICES_PER_SLICE };
    // Each slice: its counter sets or its devices.
    type Chunk = (Option<Vec<CounterSet>>, Option<Vec<SliceDevice>>);
    let mut chunks: Vec<Chunk> =
        counter_sets.chunks(MAX_COUNTER_SETS_PER_SLICE).map(|c| (Some(c.to_vec()), None)).collect();
    if devices.is_empty() {
        if chunks.is_empty() {
            chunks.push((None, Some(Vec::new())));
        }
    } else {
        chunks.extend(devices.chunks(per).map(|d| (None, Some(d.to_vec()))));
    }
    let count = chunks.len() as i64;
    let owner = node.uid.as_ref().map(|uid| {
        vec![OwnerReference {
            api_version: "v1".into(),
            kind: "Node".into(),
            name: node.name.clone(),
            uid: uid.clone(),
            controller: Some(true),
            ..Default::default()
        }]
    });
    chunks
        .into_iter()
        .enumerate()
        .map(|(i, (shared_counters, devs))| ResourceSlice {
            metadata: ObjectMeta {
                name: Some(slice_name(&node.name, i)),
                owner_references: owner.clone(),
                ..Default::default()
            },
            spec: ResourceSliceSpec {
                driver: DRIVER.into(),
                node_name: Some(node.name.clone()),
                pool: ResourcePool { name: node.name.clone(), generation, resource_slice_count: count },
                devices: devs,
                shared_counters,
                ..Default::default()
            },
        })
        .collect()
}

/// Whether two slice lists publish the same thing (metadata other than the name, and the
/// pool generation, ignored): the publisher bumps the generation only when this is false.
pub fn same_content(a: &[ResourceSlice], b: &[ResourceSlice]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| {
            x.metadata.name == y.metadata.name
                && x.spec.devices == y.spec.devices
                && x.spec.shared_counters == y.spec.shared_counters
                && x.spec.node_name == y.spec.node_name
                && x.spec.driver == y.spec.driver
                && x.spec.pool.resource_slice_count == y.spec.pool.resource_slice_count
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_names_are_dns_labels() {
        assert_eq!(device_name("nvidia", 3), "nvidia-3");
        assert_eq!(device_name("My_Profile.x", 0), "my-profile-x-0");
        assert_eq!(device_name("__", 1), "dev-1");
        let long = device_name(&"a".repeat(100), 12345);
        assert_eq!(long.len(), 63);
        assert!(long.ends_with("-12345"));
    }

    #[test]
    fn pci_root_component() {
        assert!(is_pci_root("pci0000:17"));
        assert!(!is_pci_root("pci0000:1"));
        assert!(!is_pci_root("0000:17:00.0"));
        assert!(!is_pci_root("pcixxxx:17"));
    }

    #[test]
    fn torus_groups_are_rows_and_aligned_runs() {
        // 4x4 torus, row-major: each device linked to its 4 neighbours.
        let side = 4u32;
        let devices = (0..16)
            .map(|i| {
                let (r, c) = (i / side, i % side);
                let mut links: Vec<u32> = vec![
                    r * side + (c + 1) % side,
                    r * side + (c + side - 1) % side,
                    ((r + 1) % side) * side + c,
                    ((r + side - 1) % side) * side + c,
                ];
                links.sort();
                Device { index: i, links, ..Default::default() }
            })
            .collect();
        let v = VendorInventory { devices, ..Default::default() };
        let a = link_attributes(&v);
        let get = |i: u32, k: &str| a[&i][k].int.unwrap();
        assert_eq!((get(6, "torusRow"), get(6, "torusColumn")), (1, 2));
        assert_eq!(get(6, "linkGroup4"), 1);
        assert_eq!(get(6, "linkGroup2"), 3);
        assert_eq!(get(6, "linkGroup8"), 0);
        assert_eq!(get(9, "linkGroup8"), 1);
    }

    #[test]
    fn memory_and_cores_are_capacities() {
        let mut d = Device { index: 0, cores: Some(2), ..Default::default() };
        d.attributes.insert("memory_bytes".into(), (81559u64 << 20).to_string());
        let v = VendorInventory { profile: "nvidia".into(), kind: "nvidia.com/gpu".into(), ..Default::default() };
        let s = slice_device(Path::new("/nonexistent"), &NodeFacts::default(), &v, &d, None);
        let cap = s.capacity.unwrap();
        assert_eq!(cap["memory"].value.0, "81559Mi");
        assert_eq!(cap["cores"].value.0, "2");
        assert_eq!(bytes_quantity(1000).0, "1000");
        let a = s.attributes.unwrap();
        assert_eq!(a["vendor"].string.as_deref(), Some("nvidia.com"));
        assert!(!a.contains_key(PCIE_ROOT) && !a.contains_key("uuid"), "unknown facts are left out");
    }

    #[test]
    fn shareable_devices_get_consumable_capacity_whose_default_is_the_whole_device() {
        let profiles = actk_core::profile::builtin();
        let dev = |profile: &str, kind: &str, attrs: &[(&str, &str)], cores: Option<u32>, mig: Option<bool>| {
            let v = VendorInventory { profile: profile.into(), kind: kind.into(), ..Default::default() };
            let d = Device {
                index: 0,
                cores,
                attributes: attrs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
                mig: mig.map(|enabled| actk_core::inventory::Mig { enabled, devices: vec![] }),
                ..Default::default()
            };
            slice_device(Path::new("/nonexistent"), &NodeFacts::default(), &v, &d, None)
        };
        let mut devs = vec![
            dev("nvidia", "nvidia.com/gpu", &[("memory_bytes", "85520809984")], None, Some(false)),
            dev("neuron", "aws.amazon.com/neuron", &[], Some(8), None),
            dev("amd", "amd.com/gpu", &[], None, None),
            dev("nvidia", "nvidia.com/gpu", &[("memory_bytes", "85520809984")], None, Some(true)),
            dev("nvidia", "nvidia.com/gpu", &[], None, None),
            dev("nvidia-imex", "nvidia.com/imex-channel", &[], None, None),
            dev("nvidia", "nvidia.com/gpu", &[("memory_bytes", "1000")], None, None),
        ];
        share(&mut devs, &profiles);
        let policy = |d: &SliceDevice, cap: &str| {
            let c = &d.capacity.as_ref().unwrap()[cap];
            let p = c.request_policy.as_ref().unwrap();
            let r = p.valid_range.as_ref().unwrap();
            (
                c.value.0.clone(),
                p.default.as_ref().unwrap().0.clone(),
                r.min.0.clone(),
                r.step.as_ref().unwrap().0.clone(),
                r.max.as_ref().unwrap().0.clone(),
            )
        };
        let whole =
            |v: &str, unit: &str| (v.to_string(), v.to_string(), unit.to_string(), unit.to_string(), v.to_string());
        assert_eq!(policy(&devs[0], "memory"), whole("81559Mi", "1Mi"));
        assert_eq!(policy(&devs[1], "cores"), whole("8", "1"));
        assert_eq!(policy(&devs[2], "shares"), whole("100", "1"));
        for i in [0, 1, 2, 4, 6] {
            assert_eq!(devs[i].allow_multiple_allocations, Some(true), "{}", devs[i].name);
        }
        // A GPU in MIG mode is not shared whole; IMEX channels are not shared by capacity.
        assert_eq!(devs[3].allow_multiple_allocations, None);
        assert!(devs[3].capacity.as_ref().unwrap()["memory"].request_policy.is_none());
        assert_eq!(devs[5].allow_multiple_allocations, None);
        assert!(devs[5].capacity.is_none());
        // A GPU whose memory NVML did not report is shared in shares.
        assert_eq!(policy(&devs[4], "shares"), whole("100", "1"));
        // A total that is not whole mebibytes steps in bytes, so that the default is valid.
        assert_eq!(policy(&devs[6], "memory"), whole("1000", "1"));
    }

    /// The API server's rules for a range request policy (k8s.io/kubernetes
    /// pkg/apis/resource/validation, validateRequestPolicyRange): min <= value, default >= min,
    /// max <= value, default <= max, min + step <= value, (default - min) and (max - min)
    /// multiples of step. Values in the driver's own forms (plain or `Mi`).
    fn policy_errors(c: &DeviceCapacity) -> Vec<String> {
        let q = |x: &Quantity| crate::config::quantity_bytes(&x.0).unwrap();
        let Some(p) = &c.request_policy else { return vec![] };
        let (value, default) = (q(&c.value), q(p.default.as_ref().unwrap()));
        let r = p.valid_range.as_ref().unwrap();
        let (min, max, step) = (q(&r.min), r.max.as_ref().map(q), r.step.as_ref().map(q));
        let mut e = vec![];
        if min > value {
            e.push("min is larger than capacity value".to_string());
        }
        if default < min {
            e.push("default is less than min".into());
        }
        if let Some(max) = max
            && (max > value || default > max || min > max)
        {
            e.push("max".into());
        }
        if let Some(step) = step {
            if min + step > value {
                e.push("one step is larger than capacity value".into());
            }
            if (default - min) % step != 0 || max.is_some_and(|m| (m - min) % step != 0) {
                e.push("not a multiple of step".into());
            }
        }
        e
    }

    #[test]
    fn request_policies_pass_the_api_servers_validation_even_for_one_unit_devices() {
        let profiles = actk_core::profile::builtin();
        let dev = |profile: &str, kind: &str, attrs: &[(&str, &str)], cores: Option<u32>| {
            let v = VendorInventory { profile: profile.into(), kind: kind.into(), ..Default::default() };
            let d = Device {
                index: 0,
                cores,
                attributes: attrs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
                ..Default::default()
            };
            slice_device(Path::new("/nonexistent"), &NodeFacts::default(), &v, &d, None)
        };
        let mut devs = vec![
            dev("neuron", "aws.amazon.com/neuron", &[], Some(1)),
            dev("neuron", "aws.amazon.com/neuron", &[], Some(0)),
            dev("neuron", "aws.amazon.com/neuron", &[], Some(2)),
            dev("nvidia", "nvidia.com/gpu", &[("memory_bytes", "1048576")], None),
            dev("nvidia", "nvidia.com/gpu", &[("memory_bytes", "1")], None),
            dev("nvidia", "nvidia.com/gpu", &[("memory_bytes", "0")], None),
            dev("nvidia", "nvidia.com/gpu", &[("memory_bytes", "85520809984")], None),
        ];
        share(&mut devs, &profiles);
        for d in &devs {
            for (name, c) in d.capacity.iter().flatten() {
                let e = policy_errors(c);
                assert!(e.is_empty(), "{} {name} {:?}: {e:?}", d.name, c);
                if c.request_policy.is_some() {
                    assert_eq!(d.allow_multiple_allocations, Some(true));
                }
            }
        }
        // Devices that can be split still are.
        assert_eq!(devs[2].allow_multiple_allocations, Some(true));
        assert_eq!(devs[6].allow_multiple_allocations, Some(true));
    }

    #[test]
    fn mig_mode_is_an_attribute_when_the_gpu_supports_mig() {
        let v = VendorInventory { profile: "nvidia".into(), kind: "nvidia.com/gpu".into(), ..Default::default() };
        let mode = |mig: Option<bool>| {
            let d = Device {
                index: 0,
                mig: mig.map(|enabled| actk_core::inventory::Mig { enabled, devices: vec![] }),
                ..Default::default()
            };
            slice_device(Path::new("/nonexistent"), &NodeFacts::default(), &v, &d, None)
                .attributes
                .unwrap()
                .get("migMode")
                .and_then(|a| a.string.clone())
        };
        assert_eq!(mode(Some(true)).as_deref(), Some("enabled"));
        assert_eq!(mode(Some(false)).as_deref(), Some("disabled"));
        assert_eq!(mode(None), None, "no MIG support (or NVML not read): no attribute");
    }

    #[test]
    fn driver_versions_become_semver_the_api_server_accepts() {
        for (raw, want) in [
            ("580.95.05", Some("580.95.5")),
            ("570.133.20", Some("570.133.20")),
            ("560.35", Some("560.35.0")),
            ("2.24.7.0", Some("2.24.7+0")),
            ("2.19.64.0\n", Some("2.19.64+0")),
            ("1.18.0-ee698fb", Some("1.18.0+ee698fb")),
            ("6.10.5", Some("6.10.5")),
            ("6.8.5 (rocm)", Some("6.8.5+rocm")),
            ("", None),
            ("v1.2.3", None),
            ("beta", None),
        ] {
            assert_eq!(semver_of(raw).as_deref(), want, "{raw:?}");
        }
        // The API server's pattern (k8s.io/kubernetes pkg/apis/resource/validation semverRe).
        let re = regex_lite_semver();
        for raw in ["580.95.05", "2.24.7.0", "1.18.0-ee698fb", "007.0", "1.2.3.4.5-x_y"] {
            let v = semver_of(raw).unwrap();
            assert!(re(&v), "{raw:?} -> {v:?} is not semver 2.0");
        }
    }

    /// A small checker of the API server's semver pattern (numeric identifiers without leading
    /// zeros, build identifiers `[0-9A-Za-z-]+`); pre-releases are never produced here.
    fn regex_lite_semver() -> impl Fn(&str) -> bool {
        |v: &str| {
            let (core, build) = v.split_once('+').map_or((v, None), |(c, b)| (c, Some(b)));
            let nums: Vec<&str> = core.split('.').collect();
            nums.len() == 3
                && nums.iter().all(|n| {
                    !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) && (n.len() == 1 || !n.starts_with('0'))
                })
                && build.is_none_or(|b| {
                    b.split('.').all(|id| !id.is_empty() && id.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-'))
                })
        }
    }

    #[test]
    fn pci_bdf_is_the_extended_form_only() {
        assert!(is_pci_bdf("0000:1b:00.0"));
        assert!(is_pci_bdf("0001:C1:1F.7"));
        assert!(!is_pci_bdf("1b:00.0"));
        assert!(!is_pci_bdf("0000:1b:00:0"));
        assert!(!is_pci_bdf("0000:1g:00.0"));
    }

    #[test]
    fn instance_type_only_from_an_ec2_dmi() {
        let dir = tempfile::tempdir().unwrap();
        let dmi = dir.path().join("sys/class/dmi/id");
        std::fs::create_dir_all(&dmi).unwrap();
        std::fs::write(dmi.join("product_name"), "trn1.32xlarge\n").unwrap();
        std::fs::write(dmi.join("sys_vendor"), "Dell Inc.\n").unwrap();
        assert_eq!(NodeFacts::read(dir.path()).instance_type, None, "not EC2: a product name is no instance type");
        std::fs::write(dmi.join("sys_vendor"), "Amazon EC2\n").unwrap();
        assert_eq!(NodeFacts::read(dir.path()).instance_type.as_deref(), Some("trn1.32xlarge"));
    }

    #[test]
    fn many_devices_split_into_slices_with_one_count() {
        let devs: Vec<SliceDevice> =
            (0..130).map(|i| SliceDevice { name: device_name("x", i), ..Default::default() }).collect();
        let node = NodeRef { name: "n1".into(), uid: Some("u".into()) };
        let s = slices(&node, 7, devs.into());
        assert_eq!(s.len(), 2);
        assert!(s.iter().all(|x| x.spec.pool.resource_slice_count == 2 && x.spec.pool.generation == 7));
        assert_eq!(s[1].spec.devices.as_ref().unwrap().len(), 2);
        assert_eq!(s[0].metadata.name.as_deref(), Some("n1-actk.dev-0"));
        assert_eq!(s[0].metadata.owner_references.as_ref().unwrap()[0].kind, "Node");
        let empty = slices(&node, 1, Pool::default());
        assert_eq!(empty.len(), 1);
        assert_eq!(empty[0].spec.devices.as_deref(), Some(&[][..]));
    }

    #[test]
    fn counter_sets_go_in_slices_of_their_own_and_advanced_devices_64_a_slice() {
        use k8s_openapi::api::resource::v1::DeviceCounterConsumption;
        let sets: Vec<CounterSet> =
            (0..9).map(|i| CounterSet { name: format!("nvidia-{i}-slices"), ..Default::default() }).collect();
        let devs: Vec<SliceDevice> = (0..65)
            .map(|i| SliceDevice {
                name: device_name("x", i),
                consumes_counters: Some(vec![DeviceCounterConsumption {
                    counter_set: "nvidia-0-slices".into(),
                    ..Default::default()
                }]),
                ..Default::default()
            })
            .collect();
        let node = NodeRef { name: "n1".into(), uid: None };
        let s = slices(&node, 3, Pool { devices: devs, counter_sets: sets });
        // 8 + 1 counter sets, then 64 + 1 devices.
        assert_eq!(s.len(), 4);
        assert!(s.iter().all(|x| x.spec.pool.resource_slice_count == 4));
        assert_eq!(s[0].spec.shared_counters.as_ref().unwrap().len(), 8);
        assert_eq!(s[1].spec.shared_counters.as_ref().unwrap().len(), 1);
        assert!(s[..2].iter().all(|x| x.spec.devices.is_none()), "no devices beside counter sets (1.37)");
        assert!(s[2..].iter().all(|x| x.spec.shared_counters.is_none()));
        assert_eq!(s[2].spec.devices.as_ref().unwrap().len(), 64);
        // Only counter sets: no empty device slice beside them.
        let only = slices(&node, 1, Pool { devices: vec![], counter_sets: vec![CounterSet::default()] });
        assert_eq!(only.len(), 1);
    }
}
