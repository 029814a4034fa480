//! AWS Neuron enricher: the profile-driven reader (nodes `/dev/neuronN`, checked against the
//! dynamic major in /proc/devices; `core_count`, `connected_devices`, `info/serial_number`,
//! `info/architecture/device_name`) plus what a profile cannot say: the rest of
//! `info/architecture/*` as attributes, the PCI function when the driver links it, and the
//! driver version from /sys/module/neuron/version.
//!
//! Device ids are the driver's (`/dev/neuronN`, as neuron-ls numbers them); on v2 hardware they
//! are not in PCI order, so nothing here sorts by bus id.

use super::{DiscoverOptions, HostRoot, Warnings, generic, normalize_pci, parse_numa, vendor_for};
use crate::inventory::VendorInventory;
use crate::profile::Profile;

/// Discover Neuron devices; `None` when the profile has no node pattern.
pub fn discover(
    host: &HostRoot,
    profile: &Profile,
    opts: &DiscoverOptions,
    warnings: &mut Warnings,
) -> Option<VendorInventory> {
    profile.devices.node.as_ref()?;
    let mut vendor = vendor_for(profile);
    vendor.devices = generic::devices(host, profile, std::slice::from_ref(profile), opts, warnings);
    if vendor.devices.is_empty() {
        return Some(vendor);
    }
    vendor.driver_version = host.read_to_string("/sys/module/neuron/version").ok().map(|v| v.trim().to_string());
    let Some(sysfs) = &profile.devices.sysfs else { return Some(vendor) };
    for dev in &mut vendor.devices {
        let dir = super::fill_index(sysfs, &dev.index.to_string());
        let arch_dir = super::join_str(&dir, "info/architecture");
        for name in host.list_dir(&arch_dir).unwrap_or_default() {
            if let Ok(v) = host.read_to_string(super::join_str(&arch_dir, &name)) {
                let key = if name == "arch_type" { "architecture".to_string() } else { name };
                dev.attributes.entry(key).or_insert_with(|| v.trim().to_string());
            }
        }
        dev.attributes.remove("device_name"); // already the model
        if dev.pci_bus_id.is_none()
            && let Ok(bus) = host.link_name(super::join_str(&dir, "device"))
        {
            dev.pci_bus_id = normalize_pci(&bus);
            if opts.topology
                && let Ok(t) = host.read_to_string(format!("{dir}/device/numa_node"))
            {
                match parse_numa(&t) {
                    Ok(n) => dev.numa_node = n,
                    Err(why) => warnings.add(host, format!("{dir}/device/numa_node"), why),
                }
            }
        }
    }
    Some(vendor)
}
