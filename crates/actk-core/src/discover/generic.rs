//! Profile-driven discovery: a vendor whose devices are character nodes with sysfs attributes
//! needs only a profile file (`discovery = "generic"`).
//!
//! Devices are the nodes matching `devices.node` (`/dev/npu{index}`: `{index}` is a decimal
//! number), checked against `devices.major` or the `/proc/devices` entry
//! `devices.proc_devices_name`; identity comes from the files named in `devices.attributes`
//! under `devices.sysfs`. Well-known attribute names fill the [`Device`] fields (`uuid`,
//! `model`, `pci_bus_id`, `numa_node`, `cores`, `links`); any other name lands in
//! `Device::attributes`.

use super::{DiscoverOptions, HostRoot, Warnings, normalize_pci, parse_numa, vendor_for};
use crate::inventory::{Device, VendorInventory};
use crate::profile::Profile;

/// Discover the devices of a generic profile. `None` when the profile names no node pattern.
pub fn discover(
    host: &HostRoot,
    profile: &Profile,
    all: &[Profile],
    opts: &DiscoverOptions,
    warnings: &mut Warnings,
) -> Option<VendorInventory> {
    profile.devices.node.as_ref()?;
    let mut vendor = vendor_for(profile);
    vendor.devices = devices(host, profile, all, opts, warnings);
    Some(vendor)
}

/// Indexes of the host's nodes matching `pattern` (`/dev/neuron{index}`), ascending.
pub(crate) fn node_indexes(host: &HostRoot, pattern: &str) -> Vec<u32> {
    let Some((dir, last)) = pattern.rsplit_once('/') else { return vec![] };
    let Some((pre, post)) = last.split_once("{index}") else { return vec![] };
    let mut out: Vec<u32> = host
        .list_dir(if dir.is_empty() { "/" } else { dir })
        .unwrap_or_default()
        .iter()
        .filter_map(|n| n.strip_prefix(pre)?.strip_suffix(post).map(str::to_string))
        .filter(|mid| !mid.is_empty() && mid.bytes().all(|b| b.is_ascii_digit()))
        .filter_map(|mid| mid.parse().ok())
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// The devices of `profile` found by its node pattern and sysfs attributes, in index order.
/// Devices bound to a kernel driver that another profile claims (`devices.driver`) are left
/// to that profile; a profile that claims a driver takes only that driver's devices.
pub(crate) fn devices(
    host: &HostRoot,
    profile: &Profile,
    all: &[Profile],
    opts: &DiscoverOptions,
    warnings: &mut Warnings,
) -> Vec<Device> {
    let t = &profile.devices;
    let Some(pattern) = &t.node else { return vec![] };
    let mut indexes = node_indexes(host, pattern);
    if let Some(wanted) = opts.wanted(profile) {
        // A device's index is its node's number: the others need not be looked at.
        indexes.retain(|i| wanted.contains(i));
    }
    if indexes.is_empty() {
        return vec![];
    }
    let claimed_elsewhere: Vec<&str> =
        all.iter().filter(|p| p.name != profile.name).filter_map(|p| p.devices.driver.as_deref()).collect();
    let proc_major = t.proc_devices_name.as_deref().and_then(|name| match host.proc_devices_major(name) {
        Ok(Some(m)) => Some(m),
        Ok(None) => {
            warnings.add(
                host,
                "/proc/devices",
                format!("no character device entry {name:?}; the {} driver may not be loaded", profile.name),
            );
            None
        }
        Err(e) => {
            warnings.add(host, "/proc/devices", format!("unreadable: {e}"));
            None
        }
    });
    let mut out = Vec::new();
    for index in indexes {
        let idx = index.to_string();
        let path = super::fill_index(pattern, &idx);
        let node = match host.device_node(&path) {
            Ok(n) => n,
            Err(e) => {
                warnings.add(host, &path, format!("skipped: {e}"));
                continue;
            }
        };
        if let Some(want) = t.major.filter(|&m| m != node.major) {
            warnings.add(
                host,
                &path,
                format!("skipped: major {} is not the {} driver's major {want}", node.major, profile.name),
            );
            continue;
        }
        if let Some(m) = proc_major.filter(|&m| m != node.major) {
            warnings.add(
                host,
                &path,
                format!(
                    "major {} differs from /proc/devices {:?} = {m}; the node may be stale",
                    node.major,
                    t.proc_devices_name.as_deref().unwrap_or_default()
                ),
            );
        }
        let sysfs = t.sysfs.as_ref().map(|s| super::fill_index(s, &idx));
        // The `device` directory first: where it is there (a PCI device's), the entry is too,
        // and its handle, kept, serves the driver link and the attributes below it (one system
        // call a device fewer than asking for the entry first; issue 31). A device without one
        // (a Neuron device is virtual) pays one more: the entry is then asked for after it.
        let device_dir = sysfs.as_ref().map(|s| super::join_str(s, "device"));
        let has_device = device_dir.as_ref().is_some_and(|d| host.is_dir(d));
        let sysfs_present = has_device || sysfs.as_ref().is_some_and(|s| host.is_dir(s));
        let driver = device_dir.filter(|_| has_device).and_then(|d| host.link_name(super::join_str(&d, "driver")).ok());
        match (&t.driver, &driver) {
            (Some(want), Some(got)) if want != got => continue,
            (Some(want), None) => {
                // Without the driver link we cannot tell whose device this is: leave it.
                warnings.add(
                    host,
                    sysfs.as_deref().unwrap_or(&path),
                    format!("no device/driver link; cannot tell whether {path} belongs to {want}"),
                );
                continue;
            }
            (None, Some(got)) if claimed_elsewhere.contains(&got.as_str()) => continue,
            _ => {}
        }
        let mut dev = Device { index, nodes: vec![node], ..Default::default() };
        match &sysfs {
            Some(s) if sysfs_present => read_attributes(host, profile, s, opts, &mut dev, warnings),
            Some(s) => warnings.add(host, s, format!("no sysfs entry for {path}; identity attributes unknown")),
            None => {}
        }
        for extra in t.extra_nodes.iter().filter(|_| opts.attributes_only.is_none()) {
            let p = super::fill_index(extra, &idx);
            match host.device_node(&p) {
                Ok(n) => dev.nodes.push(n),
                Err(e) => warnings.add(host, &p, format!("per-device node of {path} missing: {e}")),
            }
        }
        out.push(dev);
    }
    out
}

/// Read `profile.devices.attributes` under sysfs directory `dir` into `dev`; `numa_node` and
/// `links` only with [`DiscoverOptions::topology`], and only `uuid` and the names
/// [`DiscoverOptions::attributes_only`] lists when it is set.
pub(crate) fn read_attributes(
    host: &HostRoot,
    profile: &Profile,
    dir: &str,
    opts: &DiscoverOptions,
    dev: &mut Device,
    warnings: &mut Warnings,
) {
    for (name, rel) in &profile.devices.attributes {
        if !opts.topology && matches!(name.as_str(), "numa_node" | "links") {
            continue;
        }
        // `uuid` always: a spec may name the devices by it, and names are matched on it.
        if opts.attributes_only.as_ref().is_some_and(|only| !only.contains(name)) && name != "uuid" {
            continue;
        }
        let (is_link, rel) = match rel.strip_prefix('@') {
            Some(r) => (true, r),
            None => (false, rel.as_str()),
        };
        let path = super::join_str(dir, rel);
        let value =
            if is_link { host.link_name(&path) } else { host.read_to_string(&path).map(|s| s.trim().to_string()) };
        match value {
            Ok(v) => {
                if let Err(why) = set_attribute(dev, name, &v) {
                    warnings.add(host, &path, why);
                }
            }
            Err(e) => warnings.add(host, &path, format!("attribute {name} unreadable: {e}")),
        }
    }
}

/// Store attribute `name` = `value` in the matching [`Device`] field. Errors: a value that
/// does not parse for a typed field, as a sentence naming it.
pub(crate) fn set_attribute(dev: &mut Device, name: &str, value: &str) -> Result<(), String> {
    match name {
        "uuid" => dev.uuid = Some(value.to_string()),
        "model" => dev.model = Some(value.to_string()),
        "pci_bus_id" => {
            dev.pci_bus_id = Some(
                normalize_pci(value)
                    .ok_or_else(|| format!("pci_bus_id {value:?} is not a PCI address like 0000:18:00.0"))?,
            )
        }
        "numa_node" => dev.numa_node = parse_numa(value)?,
        "cores" => dev.cores = Some(value.parse().map_err(|_| format!("cores {value:?} is not a number"))?),
        "links" => {
            dev.links = parse_links(value).ok_or_else(|| format!("links {value:?} is not a list of device indexes"))?
        }
        other => {
            dev.attributes.insert(other.to_string(), value.to_string());
        }
    }
    Ok(())
}

/// Parse a list of device indexes separated by commas and/or whitespace (`1, 3` or `1 3`);
/// sorted and de-duplicated. None if a piece is not a number.
pub(crate) fn parse_links(text: &str) -> Option<Vec<u32>> {
    let mut v: Vec<u32> = text
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().ok())
        .collect::<Option<_>>()?;
    v.sort_unstable();
    v.dedup();
    Some(v)
}

#[cfg(test)]
mod tests {
    use super::super::discover;
    use super::super::testutil::*;
    use super::*;
    use crate::profile;

    const NPU: &str = r#"
name = "npu"
kind = "example.com/npu"
[devices]
node = "/dev/npu{index}"
sysfs = "/sys/class/npu/npu{index}"
proc_devices_name = "npu"
[devices.attributes]
uuid = "serial"
numa_node = "numa_node"
pci_bus_id = "@device"
firmware = "fw_version"
[[control_nodes]]
path = "/dev/npu_ctl"
"#;

    /// An invented vendor added by one profile file in a profiles directory, nothing else.
    #[test]
    fn invented_vendor_needs_only_a_profile_file() {
        let tmp = tempfile::tempdir().unwrap();
        let r = tmp.path().join("root");
        let ok = (0..2).all(|i| node(&r, &format!("/dev/npu{i}"), 240, i)) && node(&r, "/dev/npu_ctl", 240, 255);
        if !ok {
            return;
        }
        file(&r, "/proc/devices", "Character devices:\n  1 mem\n240 npu\n\nBlock devices:\n");
        for (i, bus) in [(0, "0000:3b:00.0"), (1, "0000:5e:00.0")] {
            file(&r, &format!("/sys/devices/pci0000:00/{bus}/numa_node"), &format!("{i}\n"));
            link(&r, &format!("/sys/class/npu/npu{i}/device"), &format!("../../../devices/pci0000:00/{bus}"));
            file(&r, &format!("/sys/class/npu/npu{i}/serial"), &format!("NPU-SERIAL-{i}\n"));
            file(&r, &format!("/sys/class/npu/npu{i}/numa_node"), &format!("{i}\n"));
            file(&r, &format!("/sys/class/npu/npu{i}/fw_version"), "1.2.3\n");
        }
        let dir = tmp.path().join("profiles.d");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("npu.toml"), NPU).unwrap();
        let profiles = profile::load(Some(&dir)).unwrap();
        let inv = discover(&r, &profiles);
        assert!(inv.warnings.is_empty(), "{:?}", inv.warnings);
        assert_eq!(inv.vendors.len(), 1);
        let v = &inv.vendors[0];
        assert_eq!((v.profile.as_str(), v.kind.as_str()), ("npu", "example.com/npu"));
        assert_eq!(v.devices.len(), 2);
        let d1 = &v.devices[1];
        assert_eq!(d1.index, 1);
        assert_eq!(d1.uuid.as_deref(), Some("NPU-SERIAL-1"));
        assert_eq!(d1.pci_bus_id.as_deref(), Some("0000:5e:00.0"));
        assert_eq!(d1.numa_node, Some(1));
        assert_eq!(d1.attributes.get("firmware").map(String::as_str), Some("1.2.3"));
        assert_eq!(d1.nodes.len(), 1);
        assert_eq!((d1.nodes[0].path.as_str(), d1.nodes[0].major, d1.nodes[0].minor), ("/dev/npu1", 240, 1));
        assert_eq!(d1.nodes[0].host_path, r.join("dev/npu1"));
        assert_eq!(v.shared_nodes.iter().map(|n| n.path.as_str()).collect::<Vec<_>>(), ["/dev/npu_ctl"]);
    }

    /// Odd hosts: a node with no sysfs entry, an unreadable attribute, a wrong-major node and a
    /// missing /proc/devices entry each give a warning naming the path; nothing panics.
    #[test]
    fn odd_host_gives_warnings_naming_paths() {
        let tmp = tempfile::tempdir().unwrap();
        let r = tmp.path();
        if !(node(r, "/dev/npu0", 240, 0) && node(r, "/dev/npu1", 240, 1) && node(r, "/dev/npu2", 240, 2)) {
            return;
        }
        file(r, "/dev/npu3", "a regular file, not a node");
        file(r, "/proc/devices", "Character devices:\n  1 mem\n\nBlock devices:\n");
        file(r, "/sys/class/npu/npu0/serial", "S0\n");
        file(r, "/sys/class/npu/npu0/numa_node", "minus one\n");
        std::fs::create_dir_all(r.join("sys/class/npu/npu2/serial")).unwrap(); // a directory: read fails
        let p = profile::parse(std::path::Path::new("npu.toml"), NPU).unwrap();
        let inv = discover(r, &[p]);
        let msgs: Vec<String> = inv.warnings.iter().map(|w| w.to_string()).collect();
        let has = |path: &str, word: &str| {
            let full = r.join(path.trim_start_matches('/'));
            inv.warnings.iter().any(|w| w.path == full && w.message.contains(word))
        };
        assert!(has("/proc/devices", "npu"), "{msgs:#?}");
        assert!(has("/sys/class/npu/npu0/numa_node", "numa_node"), "{msgs:#?}");
        assert!(has("/sys/class/npu/npu1", "no sysfs entry"), "{msgs:#?}");
        assert!(has("/sys/class/npu/npu2/serial", "unreadable"), "{msgs:#?}");
        assert!(has("/dev/npu3", "not a device node"), "{msgs:#?}");
        let v = &inv.vendors[0];
        assert_eq!(v.devices.iter().map(|d| d.index).collect::<Vec<_>>(), [0, 1, 2]);
        assert_eq!(v.devices[0].uuid.as_deref(), Some("S0"));
    }

    /// A DRM accel node of a driver no profile claims goes to the generic `accel` profile;
    /// one bound to habanalabs goes to `gaudi` only.
    #[test]
    fn accel_devices_split_by_claimed_driver() {
        let tmp = tempfile::tempdir().unwrap();
        let r = tmp.path();
        if !(node(r, "/dev/accel/accel0", 261, 0)
            && node(r, "/dev/accel/accel_controlD0", 239, 0)
            && node(r, "/dev/accel/accel1", 261, 1))
        {
            return;
        }
        for (i, bus, driver) in [(0, "0000:33:00.0", "habanalabs"), (1, "0000:00:0b.0", "intel_vpu")] {
            let dev = format!("/sys/devices/pci0000:00/{bus}");
            file(r, &format!("{dev}/numa_node"), "0\n");
            file(r, &format!("/sys/bus/pci/drivers/{driver}/.keep"), "");
            link(r, &format!("{dev}/driver"), &format!("../../../bus/pci/drivers/{driver}"));
            link(r, &format!("/sys/class/accel/accel{i}/device"), &format!("../../../devices/pci0000:00/{bus}"));
        }
        let hl = "/sys/devices/pci0000:00/0000:33:00.0";
        file(r, &format!("{hl}/device_type"), "GAUDI2\n");
        file(r, &format!("{hl}/pci_addr"), "0000:33:00.0\n");
        file(r, &format!("{hl}/module_id"), "3\n");
        let inv = discover(r, &profile::builtin());
        assert!(inv.warnings.is_empty(), "{:#?}", inv.warnings);
        let kinds: Vec<(&str, Vec<u32>)> =
            inv.vendors.iter().map(|v| (v.kind.as_str(), v.devices.iter().map(|d| d.index).collect())).collect();
        assert_eq!(kinds, [("habana.ai/gaudi", vec![0]), ("kernel.org/accel", vec![1])]);
        let vpu = &inv.vendor("accel").unwrap().devices[0];
        assert_eq!(vpu.attributes.get("driver").map(String::as_str), Some("intel_vpu"));
        assert_eq!(vpu.pci_bus_id.as_deref(), Some("0000:00:0b.0"));
        assert_eq!(vpu.nodes.iter().map(|n| n.path.as_str()).collect::<Vec<_>>(), ["/dev/accel/accel1"]);
        let hl = &inv.vendor("gaudi").unwrap().devices[0];
        assert_eq!(
            hl.nodes.iter().map(|n| n.path.as_str()).collect::<Vec<_>>(),
            ["/dev/accel/accel0", "/dev/accel/accel_controlD0"]
        );
        assert_eq!(hl.attributes.get("module_id").map(String::as_str), Some("3"));
    }

    #[test]
    fn links_lists() {
        assert_eq!(parse_links("3, 1"), Some(vec![1, 3]));
        assert_eq!(parse_links("4 12\n"), Some(vec![4, 12]));
        assert_eq!(parse_links(""), Some(vec![]));
        assert_eq!(parse_links("a,b"), None);
    }
}
