//! Device health: a probe per device over the host root, and a polling loop that publishes
//! every change so that ListAndWatch re-sends the device list.
//!
//! A device is Unhealthy when one of its device nodes is gone or has another device number
//! than discovery saw (driver unloaded, device removed), when discovery found no usable node
//! for it at all, or when its PCI function has left sysfs (fell off the bus, hot-unplug). It is Healthy again as soon as the probe passes, so
//! a reset or re-plugged device comes back without restarting the plugin.
//!
//! Polling, not inotify: /dev and /sys seen through hostPath mounts do not reliably deliver
//! inotify events for sysfs attributes, and a stat of a few nodes every
//! [`crate::config::DEFAULT_HEALTH_INTERVAL_MS`] ms is cheap. NVML Xid events are not read yet.

use actk_core::inventory::VendorInventory;
use std::collections::BTreeMap;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::sync::watch;

/// Health of each device of a vendor by index: `None` when healthy, else the reason.
pub type HealthMap = BTreeMap<u32, Option<String>>;

/// What to check for one device.
#[derive(Debug, Clone)]
pub struct Probe {
    /// Device index.
    pub index: u32,
    /// Device nodes: container path, host path, major, minor.
    pub nodes: Vec<(String, PathBuf, u32, u32)>,
    /// sysfs directory of the PCI function, when it existed at discovery.
    pub pci: Option<PathBuf>,
    /// Discovery found the device but no usable node for it (discovery warned why): not
    /// usable until a later discovery finds one (the plugin looks again every few seconds).
    pub no_node: bool,
}

/// Probes for every device of `vendor`, with sysfs paths under host root `root`.
pub fn probes(root: &Path, vendor: &VendorInventory) -> Vec<Probe> {
    vendor
        .devices
        .iter()
        .map(|d| Probe {
            index: d.index,
            nodes: d.nodes.iter().map(|n| (n.path.clone(), n.host_path.clone(), n.major, n.minor)).collect(),
            pci: d.pci_bus_id.as_ref().map(|b| root.join("sys/bus/pci/devices").join(b)).filter(|p| p.exists()),
            no_node: d.nodes.is_empty(),
        })
        .collect()
}

/// Linux device number (major, minor) of `rdev`, as glibc's gnu_dev_major/minor.
fn major_minor(rdev: u64) -> (u64, u64) {
    (((rdev >> 32) & 0xffff_f000) | ((rdev >> 8) & 0xfff), ((rdev >> 12) & 0xffff_ff00) | (rdev & 0xff))
}

/// `None` when the device looks usable, else why not (naming the path).
pub fn check(p: &Probe) -> Option<String> {
    if p.no_node {
        return Some("discovery found no usable device node for it".into());
    }
    for (path, host, major, minor) in &p.nodes {
        match std::fs::metadata(host) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Some(format!("device node {path} is gone ({})", host.display()));
            }
            Err(e) => return Some(format!("device node {path} cannot be checked: {e}")),
            Ok(md) if !md.file_type().is_char_device() && !md.file_type().is_block_device() => {
                return Some(format!("{path} is no longer a device node"));
            }
            Ok(md) => {
                let (ma, mi) = major_minor(md.rdev());
                if (ma, mi) != (u64::from(*major), u64::from(*minor)) {
                    return Some(format!("device node {path} is now {ma}:{mi}, discovery saw {major}:{minor}"));
                }
            }
        }
    }
    if let Some(pci) = &p.pci
        && !pci.exists()
    {
        return Some(format!("PCI function {} is gone from sysfs", pci.display()));
    }
    None
}

/// Health of every probed device now.
pub fn check_all(probes: &[Probe]) -> HealthMap {
    probes.iter().map(|p| (p.index, check(p))).collect()
}

/// Starts the polling loop for one vendor on the current tokio runtime and returns the channel
/// carrying the latest [`HealthMap`]; a new value is sent only when some device changed, and
/// each change is logged. The loop ends when every receiver is dropped.
pub fn spawn(name: String, probes: Vec<Probe>, interval: Duration) -> watch::Receiver<HealthMap> {
    let (tx, rx) = watch::channel(check_all(&probes));
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = tx.closed() => break,
            }
            let now = check_all(&probes);
            let old = tx.borrow().clone();
            if now != old {
                for (idx, state) in &now {
                    if old.get(idx) != Some(state) {
                        match state {
                            Some(why) => tracing::warn!("{name} device {idx} is unhealthy: {why}"),
                            None => tracing::info!("{name} device {idx} is healthy again"),
                        }
                    }
                }
                let _ = tx.send(now);
            }
        }
    });
    rx
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    fn mknod(p: &Path, major: u32, minor: u32) -> bool {
        Command::new("mknod")
            .arg(p)
            .arg("c")
            .arg(major.to_string())
            .arg(minor.to_string())
            .status()
            .is_ok_and(|s| s.success())
    }

    #[test]
    fn missing_replaced_and_unplugged_devices_are_named() {
        let tmp = tempfile::tempdir().unwrap();
        let node = tmp.path().join("npu0");
        if !mknod(&node, 240, 0) {
            eprintln!("skipping: mknod needs root");
            return;
        }
        let pci = tmp.path().join("0000:18:00.0");
        std::fs::create_dir(&pci).unwrap();
        let p = Probe {
            index: 0,
            nodes: vec![("/dev/npu0".into(), node.clone(), 240, 0)],
            pci: Some(pci.clone()),
            no_node: false,
        };
        assert_eq!(check(&p), None);
        let none = Probe { nodes: vec![], no_node: true, ..p.clone() };
        assert!(check(&none).unwrap().contains("no usable device node"));
        std::fs::remove_dir(&pci).unwrap();
        assert!(check(&p).unwrap().contains("PCI function"), "{:?}", check(&p));
        std::fs::create_dir(&pci).unwrap();
        std::fs::remove_file(&node).unwrap();
        assert_eq!(check(&p).unwrap(), format!("device node /dev/npu0 is gone ({})", node.display()));
        assert!(mknod(&node, 240, 1));
        assert_eq!(check(&p).unwrap(), "device node /dev/npu0 is now 240:1, discovery saw 240:0");
        std::fs::remove_file(&node).unwrap();
        std::fs::write(&node, "").unwrap();
        assert_eq!(check(&p).unwrap(), "/dev/npu0 is no longer a device node");
    }
}
