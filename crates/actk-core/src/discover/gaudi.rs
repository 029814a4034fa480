//! Intel Gaudi enricher: the profile-driven reader does the work (`/dev/accel/accelN` plus the
//! per-device `/dev/accel/accel_controlDN`, identity from the PCI device's habanalabs sysfs
//! attributes `serial_number`, `device_type`, `pci_addr`, `module_id`); only devices bound to
//! the `habanalabs` driver are taken, so other DRM accel drivers stay with the `accel`
//! profile. This adds the driver version from /sys/module/habanalabs/version.

use super::{DiscoverOptions, HostRoot, Warnings, generic};
use crate::inventory::VendorInventory;
use crate::profile::Profile;

/// Discover Gaudi devices; `None` when the profile has no node pattern.
pub fn discover(
    host: &HostRoot,
    profile: &Profile,
    all: &[Profile],
    opts: &DiscoverOptions,
    warnings: &mut Warnings,
) -> Option<VendorInventory> {
    let mut vendor = generic::discover(host, profile, all, opts, warnings)?;
    if !vendor.devices.is_empty() && opts.attributes_only.is_none() {
        let driver = profile.devices.driver.as_deref().unwrap_or("habanalabs");
        vendor.driver_version =
            host.read_to_string(format!("/sys/module/{driver}/version")).ok().map(|v| v.trim().to_string());
    }
    Some(vendor)
}
