//! From the inventory to kubelet resources: one [`Resource`] per extended resource name a
//! vendor profile lists under `[kubernetes] resources`, holding the device IDs the kubelet sees.
//!
//! Two kinds of units:
//! - whole devices (`nvidia.com/gpu`, `aws.amazon.com/neuron`, ...): the ID is the device's
//!   UUID/serial ([`DeviceIds::Uuid`], the default: stable across reboots, as the kubelet's
//!   checkpoint of assigned IDs needs) or its index;
//! - cores (a resource whose class ends in `core`, e.g. `aws.amazon.com/neuroncore`), for
//!   devices that report a core count: the ID is the global core number as the Neuron runtime
//!   counts in NEURON_RT_VISIBLE_CORES (device 0's cores first), e.g. `5`.

use actk_core::inventory::{Inventory, VendorInventory};
use actk_core::profile::Profile;
use serde::Deserialize;

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

impl std::str::FromStr for DeviceIds {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "uuid" => Ok(DeviceIds::Uuid),
            "index" => Ok(DeviceIds::Index),
            other => Err(format!("unknown device id scheme {other:?}: use uuid or index")),
        }
    }
}

/// Longest device ID the kubelet accepts (api.proto `Device.ID`).
pub const MAX_ID_LEN: usize = 63;

/// One kubelet device: a whole device or one core of a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unit {
    /// Kubelet device ID.
    pub id: String,
    /// Index of the device (the unit itself, or the device holding the core).
    pub device: u32,
    /// Global core number, for core units.
    pub core: Option<u32>,
    /// NUMA node of the device, when known.
    pub numa: Option<u32>,
}

/// One extended resource served by one plugin socket.
#[derive(Debug, Clone)]
pub struct Resource {
    /// Extended resource name (`aws.amazon.com/neuroncore`).
    pub name: String,
    /// The vendor profile.
    pub profile: Profile,
    /// What discovery found for that profile.
    pub vendor: VendorInventory,
    /// Whether units are cores rather than devices.
    pub per_core: bool,
    /// Units in device (then core) order.
    pub units: Vec<Unit>,
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

/// The resources of every vendor in `inventory` whose profile is in `profiles`, in inventory
/// order then in the order the profile lists them; `filter` keeps only the named resources.
/// A core resource whose devices do not report cores is skipped with a warning, as is a
/// resource name served by an earlier vendor (the kubelet allows one plugin per name).
pub fn build(inventory: &Inventory, profiles: &[Profile], ids: DeviceIds, filter: Option<&[String]>) -> Vec<Resource> {
    let mut out: Vec<Resource> = Vec::new();
    for vendor in &inventory.vendors {
        let Some(profile) = profiles.iter().find(|p| p.name == vendor.profile) else {
            tracing::warn!("vendor {} has no loaded profile; not served", vendor.profile);
            continue;
        };
        for name in &profile.kubernetes.resources {
            if filter.is_some_and(|f| !f.iter().any(|n| n == name)) {
                continue;
            }
            if out.iter().any(|r| &r.name == name) {
                tracing::warn!(
                    "resource {name} of profile {} is already served by profile {}; skipped",
                    profile.name,
                    vendor.profile
                );
                continue;
            }
            let per_core = is_core_resource(name);
            let units = if per_core { core_units(vendor) } else { device_units(vendor, ids) };
            let Some(units) = units else {
                tracing::warn!("resource {name}: devices of {} do not report a core count; not served", profile.name);
                continue;
            };
            out.push(Resource {
                name: name.clone(),
                profile: profile.clone(),
                vendor: vendor.clone(),
                per_core,
                units,
            });
        }
    }
    out
}

fn device_units(vendor: &VendorInventory, ids: DeviceIds) -> Option<Vec<Unit>> {
    let mut units: Vec<Unit> = Vec::new();
    for d in &vendor.devices {
        let by_uuid = d.uuid.as_deref().filter(|u| {
            ids == DeviceIds::Uuid && !u.is_empty() && u.len() <= MAX_ID_LEN && !units.iter().any(|x| x.id == *u)
        });
        let id = by_uuid.map(str::to_string).unwrap_or_else(|| d.index.to_string());
        units.push(Unit { id, device: d.index, core: None, numa: d.numa_node });
    }
    Some(units)
}

fn core_units(vendor: &VendorInventory) -> Option<Vec<Unit>> {
    let mut units = Vec::new();
    let mut next = 0u32;
    for d in &vendor.devices {
        let n = d.cores?;
        for c in next..next + n {
            units.push(Unit { id: c.to_string(), device: d.index, core: Some(c), numa: d.numa_node });
        }
        next += n;
    }
    Some(units)
}

#[cfg(test)]
mod tests {
    use super::*;
    use actk_core::inventory::Device;

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

    #[test]
    fn neuron_gives_device_and_core_resources() {
        let profiles = actk_core::profile::builtin();
        let inv = Inventory { vendors: vec![vendor(3, Some(2))], ..Default::default() };
        let res = build(&inv, &profiles, DeviceIds::Uuid, None);
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
        let res = build(&inv, &profiles, DeviceIds::Index, Some(&["aws.amazon.com/neuron".to_string()]));
        assert_eq!(res.len(), 1);
        assert_eq!(res[0].units.iter().map(|u| u.id.as_str()).collect::<Vec<_>>(), ["0", "1", "2"]);
    }

    #[test]
    fn core_resource_without_core_counts_is_skipped() {
        let profiles = actk_core::profile::builtin();
        let inv = Inventory { vendors: vec![vendor(2, None)], ..Default::default() };
        let names: Vec<String> = build(&inv, &profiles, DeviceIds::Uuid, None).into_iter().map(|r| r.name).collect();
        assert_eq!(names, ["aws.amazon.com/neuron", "aws.amazon.com/neurondevice"]);
    }
}
