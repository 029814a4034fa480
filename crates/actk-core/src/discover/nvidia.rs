//! NVIDIA enricher: GPUs from the nvidia kernel module's procfs (`/proc/driver/nvidia/version`
//! and `/proc/driver/nvidia/gpus/<bus>/information`), NUMA nodes from PCI sysfs, and, only on
//! the running system's own root, NVLink peers from NVML (nvml-wrapper dlopens
//! libnvidia-ml.so.1; when that fails discovery goes on without links).
//!
//! Index order is PCI bus order, which is how NVML and nvidia-smi number GPUs
//! (CUDA_DEVICE_ORDER=PCI_BUS_ID).

use super::{HostRoot, Warnings, normalize_pci, parse_numa, vendor_for};
use crate::inventory::{Device, VendorInventory};
use crate::profile::Profile;
use std::collections::BTreeMap;

const PROC: &str = "/proc/driver/nvidia";

/// Discover NVIDIA GPUs. `None` when the driver is not loaded under this root (no
/// `/proc/driver/nvidia`).
pub fn discover(host: &HostRoot, profile: &Profile, warnings: &mut Warnings) -> Option<VendorInventory> {
    if !host.exists(PROC) {
        let stray = super::generic::node_indexes(host, "/dev/nvidia{index}");
        if !stray.is_empty() {
            warnings.add(
                host,
                PROC,
                format!(
                    "{} /dev/nvidiaN node(s) but no {PROC}: the nvidia driver is not loaded; GPUs skipped",
                    stray.len()
                ),
            );
        }
        return None;
    }
    let mut vendor = vendor_for(profile);
    let version_path = format!("{PROC}/version");
    match host.read_to_string(&version_path) {
        Ok(text) => match parse_version(&text) {
            Some(v) => vendor.driver_version = Some(v),
            None => warnings.add(host, &version_path, "no driver version found in the NVRM version line"),
        },
        Err(e) => warnings.add(host, &version_path, format!("unreadable: {e}")),
    }
    let gpus_dir = format!("{PROC}/gpus");
    let mut texts: Vec<(String, String)> = Vec::new();
    for bus in host.list_dir(&gpus_dir).unwrap_or_default() {
        let info_path = format!("{gpus_dir}/{bus}/information");
        match host.read_to_string(&info_path) {
            Ok(text) => texts.push((bus, text)),
            Err(e) => warnings.add(host, &info_path, format!("GPU skipped, information unreadable: {e}")),
        }
    }
    // PCI bus order: the normalised long form sorts numerically.
    let mut keyed: Vec<(String, BTreeMap<&str, &str>)> = texts
        .iter()
        .map(|(dir, text)| {
            let info = parse_information(text);
            let bus = info
                .get("Bus Location")
                .and_then(|b| normalize_pci(b))
                .or_else(|| normalize_pci(dir))
                .unwrap_or_else(|| dir.clone());
            (bus, info)
        })
        .collect();
    keyed.sort_by(|a, b| a.0.cmp(&b.0));
    let want_major = profile.devices.major.unwrap_or(195);
    for (index, (bus, info)) in keyed.into_iter().enumerate() {
        let mut dev = Device {
            index: index as u32,
            model: info.get("Model").map(|s| s.to_string()),
            uuid: info.get("GPU UUID").map(|s| s.to_string()),
            pci_bus_id: Some(bus.clone()),
            ..Default::default()
        };
        if let Some(v) = info.get("Video BIOS") {
            dev.attributes.insert("video_bios".into(), v.to_string());
        }
        match info.get("Device Minor").map(|m| m.parse::<u32>()) {
            Some(Ok(minor)) => {
                dev.attributes.insert("minor".into(), minor.to_string());
                let path = profile
                    .devices
                    .node
                    .as_deref()
                    .unwrap_or("/dev/nvidia{index}")
                    .replace("{index}", &minor.to_string());
                match host.device_node(&path) {
                    Ok(n) if n.major == want_major && n.minor == minor => dev.nodes.push(n),
                    Ok(n) => warnings.add(
                        host,
                        &path,
                        format!(
                            "node is {}:{}, expected {want_major}:{minor} for GPU {bus}; not used",
                            n.major, n.minor
                        ),
                    ),
                    Err(e) => warnings.add(host, &path, format!("device node of GPU {bus} unusable: {e}")),
                }
            }
            _ => warnings.add(
                host,
                format!("{PROC}/gpus/{bus}/information"),
                "no usable `Device Minor` line; GPU has no device node",
            ),
        }
        let numa_path = format!("/sys/bus/pci/devices/{bus}/numa_node");
        match host.read_to_string(&numa_path) {
            Ok(t) => match parse_numa(&t) {
                Ok(n) => dev.numa_node = n,
                Err(why) => warnings.add(host, &numa_path, why),
            },
            Err(e) => warnings.add(host, &numa_path, format!("no PCI sysfs entry for GPU {bus}: {e}")),
        }
        vendor.devices.push(dev);
    }
    if host.is_system_root() {
        nvml_links(&mut vendor);
    }
    Some(vendor)
}

/// The driver version from the NVRM line of /proc/driver/nvidia/version: the first token
/// made of digits and dots with at least one dot (`580.95.05`), for both the proprietary
/// ("Kernel Module  580.95.05") and open ("Open Kernel Module for x86_64  580.95.05") forms.
pub(crate) fn parse_version(text: &str) -> Option<String> {
    let line = text.lines().find(|l| l.starts_with("NVRM version:"))?;
    line.split_whitespace()
        .find(|t| t.contains('.') && t.split('.').all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit())))
        .map(str::to_string)
}

/// The `Key: value` lines of a GPU's procfs `information` file, values trimmed, borrowed from
/// `text`.
pub(crate) fn parse_information(text: &str) -> BTreeMap<&str, &str> {
    text.lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim(), v.trim()))
        .filter(|(k, v)| !k.is_empty() && !v.is_empty())
        .collect()
}

/// Add NVLink peers from NVML. Loading failure is normal on hosts without the driver's
/// user-space library and only logged at debug level.
fn nvml_links(vendor: &mut VendorInventory) {
    use nvml_wrapper::Nvml;
    let nvml = match Nvml::init() {
        Ok(n) => n,
        Err(e) => {
            tracing::debug!("NVML not available, no NVLink topology: {e}");
            return;
        }
    };
    let by_bus: BTreeMap<String, u32> =
        vendor.devices.iter().filter_map(|d| Some((d.pci_bus_id.clone()?, d.index))).collect();
    // NVML_NVLINK_MAX_LINKS is 18 for Hopper; asking past a GPU's count just errors.
    const MAX_LINKS: u32 = 18;
    for dev in &mut vendor.devices {
        let Some(uuid) = dev.uuid.clone() else { continue };
        let Ok(gpu) = nvml.device_by_uuid(uuid.as_str()) else { continue };
        let mut peers = Vec::new();
        for link in 0..MAX_LINKS {
            let l = gpu.link_wrapper_for(link);
            if !matches!(l.is_active(), Ok(true)) {
                continue;
            }
            if let Ok(pci) = l.remote_pci_info()
                && let Some(&peer) = normalize_pci(&pci.bus_id).and_then(|b| by_bus.get(&b))
                && peer != dev.index
            {
                peers.push(peer);
            }
        }
        peers.sort_unstable();
        peers.dedup();
        dev.links = peers;
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use super::*;

    #[test]
    fn version_line_forms() {
        let open = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  (dvs-builder@U22)  Tue Sep 23 2025\nGCC version:  gcc version 12.3.0\n";
        let prop = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\n";
        assert_eq!(parse_version(open).as_deref(), Some("580.95.05"));
        assert_eq!(parse_version(prop).as_deref(), Some("535.104.05"));
        assert_eq!(parse_version("GCC version: 12.3.0\n"), None);
    }

    /// GPUs are indexed in PCI bus order whatever the directory or minor order.
    #[test]
    fn gpus_in_pci_order_with_minor_nodes_and_numa() {
        let tmp = tempfile::tempdir().unwrap();
        let r = tmp.path();
        if !(node(r, "/dev/nvidia0", 195, 0) && node(r, "/dev/nvidia1", 195, 1) && node(r, "/dev/nvidiactl", 195, 255))
        {
            return;
        }
        file(r, "/proc/driver/nvidia/version", "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.95.05  Tue\n");
        // Minor 0 sits on the higher bus: index must follow the bus, not the minor.
        for (bus, minor, uuid) in [("0000:9d:00.0", 0, "GPU-b"), ("0000:1b:00.0", 1, "GPU-a")] {
            file(
                r,
                &format!("/proc/driver/nvidia/gpus/{bus}/information"),
                &format!(
                    "Model: \t\t NVIDIA H100 80GB HBM3\nGPU UUID: \t {uuid}\nBus Location: \t {bus}\nDevice Minor: \t {minor}\n"
                ),
            );
        }
        file(r, "/sys/bus/pci/devices/0000:1b:00.0/numa_node", "0\n");
        file(r, "/sys/bus/pci/devices/0000:9d:00.0/numa_node", "-1\n");
        let profiles = crate::profile::builtin();
        let inv = super::super::discover(r, &profiles);
        let v = inv.vendor("nvidia").expect("nvidia found");
        assert_eq!(v.driver_version.as_deref(), Some("580.95.05"));
        let summary: Vec<(u32, &str, &str, Option<u32>, &str)> = v
            .devices
            .iter()
            .map(|d| {
                (
                    d.index,
                    d.uuid.as_deref().unwrap(),
                    d.pci_bus_id.as_deref().unwrap(),
                    d.numa_node,
                    d.nodes[0].path.as_str(),
                )
            })
            .collect();
        assert_eq!(
            summary,
            [(0, "GPU-a", "0000:1b:00.0", Some(0), "/dev/nvidia1"), (1, "GPU-b", "0000:9d:00.0", None, "/dev/nvidia0")]
        );
        assert_eq!(v.shared_nodes.iter().map(|n| n.path.as_str()).collect::<Vec<_>>(), ["/dev/nvidiactl"]);
        assert_eq!(v.devices[0].model.as_deref(), Some("NVIDIA H100 80GB HBM3"));
    }

    #[test]
    fn gpu_without_node_or_sysfs_warns() {
        let tmp = tempfile::tempdir().unwrap();
        let r = tmp.path();
        file(r, "/proc/driver/nvidia/version", "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.95.05  Tue\n");
        file(
            r,
            "/proc/driver/nvidia/gpus/0000:18:00.0/information",
            "Model: X\nBus Location: 0000:18:00.0\nDevice Minor: 0\n",
        );
        let inv = super::super::discover(r, &crate::profile::builtin());
        let paths: Vec<_> = inv.warnings.iter().map(|w| w.path.clone()).collect();
        assert!(paths.contains(&r.join("dev/nvidia0")), "{paths:?}");
        assert!(paths.contains(&r.join("sys/bus/pci/devices/0000:18:00.0/numa_node")), "{paths:?}");
    }
}
