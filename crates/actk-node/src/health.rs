//! Device health: a probe per device over the host root, NVIDIA Xid events through the NVML
//! seam, and a polling loop that publishes every change so that ListAndWatch re-sends the
//! device list.
//!
//! A device is Unhealthy when one of its device nodes is gone or has another device number
//! than discovery saw (driver unloaded, device removed), when discovery found no usable node
//! for it at all, or when its PCI function has left sysfs (fell off the bus, hot-unplug). It is Healthy again as soon as the probe passes, so
//! a reset or re-plugged device comes back without restarting the plugin.
//!
//! NVIDIA GPUs are also watched through NVML ([`actk_core::discover::nvml::watch_xids`], in a
//! thread of its own): a critical Xid event makes the GPU Unhealthy (or only the MIG device,
//! when the driver names its GPU and compute instance), except the Xids of [`XidPolicy`]'s
//! ignore list, which are application errors by default as in NVIDIA's device plugin (13, 31,
//! 43, 45, 68, 109; `DP_DISABLE_HEALTHCHECKS` / `DP_ENABLE_HEALTHCHECKS` are honoured as there).
//! A GPU that NVML cannot reach (GPU_IS_LOST) is Unhealthy while that lasts. Unlike NVIDIA's
//! plugin, an Xid is not forever: the device is Healthy again when NVML answers for it and no
//! critical Xid came for [`XidPolicy::recovery`] (0: never).
//!
//! Polling, not inotify: /dev and /sys seen through hostPath mounts do not reliably deliver
//! inotify events for sysfs attributes, and a stat of a few nodes every
//! few hundred ms (the front ends' `health_interval`) is cheap.

use actk_core::inventory::VendorInventory;
use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// What a health state is about: a device (`mig: None`) or one MIG device of a GPU.
pub type HealthKey = (u32, Option<u32>);

/// Health by [`HealthKey`]: `None` when healthy, else the reason. A device-level entry applies
/// to every MIG device of that GPU too.
pub type HealthMap = BTreeMap<HealthKey, Option<String>>;

/// Whether the unit for `target` (device, MIG index) is unhealthy in `health`, and why.
pub fn unhealthy(health: &HealthMap, target: HealthKey) -> Option<&str> {
    let device = health.get(&(target.0, None)).and_then(Option::as_deref);
    let mig = target.1.and_then(|m| health.get(&(target.0, Some(m))).and_then(Option::as_deref));
    device.or(mig)
}

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
    probes.iter().map(|p| ((p.index, None), check(p))).collect()
}

/// Application Xids that say nothing about the GPU's health (NVIDIA device plugin
/// `internal/rm/health.go`): 13 graphics engine exception, 31 GPU memory page fault, 43 GPU
/// stopped processing, 45 preemptive cleanup, 68 video processor exception, 109 context switch
/// timeout.
pub const APPLICATION_XIDS: &[u64] = &[13, 31, 43, 45, 68, 109];

/// Which Xids make a GPU Unhealthy, and for how long.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XidPolicy {
    /// Xid health checks off altogether (`DP_DISABLE_HEALTHCHECKS=all` or `xids`).
    pub disabled: bool,
    /// Xids that are ignored: [`APPLICATION_XIDS`] plus the configured ones, minus the ones
    /// explicitly enabled.
    pub ignored: BTreeSet<u64>,
    /// With every Xid disabled but some explicitly enabled: only those are critical.
    pub only: Option<BTreeSet<u64>>,
    /// How long after its last critical Xid a GPU that answers NVML is Healthy again; zero:
    /// never (NVIDIA's plugin behaviour).
    pub recovery: Duration,
}

impl XidPolicy {
    /// The policy from the configured extra ignores, the recovery time, and NVIDIA's
    /// environment variables `DP_DISABLE_HEALTHCHECKS` (`all`/`xids`, or Xids to ignore) and
    /// `DP_ENABLE_HEALTHCHECKS` (Xids to check even if ignored). Malformed entries of those
    /// variables are logged and skipped, as NVIDIA's plugin does.
    pub fn new(
        extra_ignored: &[u64],
        recovery: Duration,
        disable_env: Option<&str>,
        enable_env: Option<&str>,
    ) -> XidPolicy {
        let mut ignored: BTreeSet<u64> =
            APPLICATION_XIDS.iter().copied().chain(extra_ignored.iter().copied()).collect();
        let parse = |v: Option<&str>, what: &str| -> (bool, Vec<u64>) {
            let mut all = false;
            let mut ids = Vec::new();
            for item in v.unwrap_or("").split(',').map(|s| s.trim().to_ascii_lowercase()).filter(|s| !s.is_empty()) {
                if item == "all" || item == "xids" {
                    all = true;
                } else {
                    match item.parse() {
                        Ok(n) => ids.push(n),
                        Err(_) => tracing::warn!("{what}: ignoring malformed Xid {item:?}"),
                    }
                }
            }
            (all, ids)
        };
        let (all_off, off) = parse(disable_env, "DP_DISABLE_HEALTHCHECKS");
        let (_, on) = parse(enable_env, "DP_ENABLE_HEALTHCHECKS");
        ignored.extend(off);
        for x in &on {
            ignored.remove(x);
        }
        let only = (all_off && !on.is_empty()).then(|| on.iter().copied().collect());
        XidPolicy { disabled: all_off && on.is_empty(), ignored, only, recovery }
    }

    /// Whether Xid `xid` makes a device Unhealthy.
    pub fn is_critical(&self, xid: u64) -> bool {
        match &self.only {
            _ if self.disabled => false,
            Some(only) => only.contains(&xid),
            None => !self.ignored.contains(&xid),
        }
    }
}

/// What the NVML watch found: key -> (reason, when the last critical Xid came; `None` for a
/// GPU that does not answer NVML).
type XidState = Arc<Mutex<BTreeMap<HealthKey, (String, Option<Instant>)>>>;

/// A GPU the Xid watch covers: its index, UUID, and its MIG devices (index, GI, CI).
#[derive(Debug, Clone)]
pub struct WatchedGpu {
    /// GPU index.
    pub index: u32,
    /// `GPU-...`.
    pub uuid: String,
    /// MIG devices as (MIG index, GPU instance id, compute instance id).
    pub migs: Vec<(u32, u32, u32)>,
}

/// The GPUs of an NVIDIA vendor, for [`spawn_xid_watch`].
pub fn watched_gpus(vendor: &VendorInventory) -> Vec<WatchedGpu> {
    vendor
        .devices
        .iter()
        .filter_map(|d| {
            Some(WatchedGpu {
                index: d.index,
                uuid: d.uuid.clone()?,
                migs: d
                    .mig
                    .iter()
                    .flat_map(|m| &m.devices)
                    .map(|m| (m.index, m.gpu_instance, m.compute_instance))
                    .collect(),
            })
        })
        .collect()
}

/// Start the NVML Xid watch of `gpus` under `root` in a thread; its findings are merged into
/// the [`HealthMap`] the polling loop publishes. `None` when the policy disables it or there
/// is nothing to watch. NVML that cannot be loaded is logged and leaves health to the probes.
pub fn spawn_xid_watch(root: &Path, gpus: Vec<WatchedGpu>, policy: XidPolicy, poll: Duration) -> Option<XidState> {
    if policy.disabled || gpus.is_empty() {
        if policy.disabled {
            tracing::info!("Xid health checks disabled (DP_DISABLE_HEALTHCHECKS)");
        }
        return None;
    }
    let state: XidState = Arc::new(Mutex::new(BTreeMap::new()));
    let shared = state.clone();
    let root = root.to_path_buf();
    let spawned = std::thread::Builder::new().name("xid-watch".into()).spawn(move || {
        let host = actk_core::discover::HostRoot::new(&root);
        let uuids: Vec<String> = gpus.iter().map(|g| g.uuid.clone()).collect();
        tracing::info!("Xid watch: {} GPU(s), ignoring Xids {:?}", uuids.len(), policy.ignored);
        let mut on_event = |ev: actk_core::discover::nvml::XidEvent| {
            let Some(g) = gpus.iter().find(|g| g.uuid == ev.gpu_uuid) else { return };
            if !policy.is_critical(ev.xid) {
                tracing::info!("Xid {} on GPU {} ignored (not critical under the configured policy)", ev.xid, g.index);
                return;
            }
            let mig = match (ev.gpu_instance, ev.compute_instance) {
                (Some(gi), Some(ci)) => g.migs.iter().find(|(_, a, b)| *a == gi && *b == ci).map(|(m, _, _)| *m),
                _ => None,
            };
            let what = match mig {
                Some(m) => format!("MIG device {}:{m}", g.index),
                None => format!("GPU {}", g.index),
            };
            tracing::warn!("critical Xid {} on {what}: marking it unhealthy", ev.xid);
            if let Ok(mut s) = shared.lock() {
                s.insert((g.index, mig), (format!("Xid {} (critical) reported by NVML", ev.xid), Some(Instant::now())));
            }
        };
        let mut on_tick = |probe: actk_core::discover::nvml::Probe<'_>| {
            let Ok(mut s) = shared.lock() else { return };
            for g in &gpus {
                match probe(&g.uuid) {
                    Err(why) => {
                        s.entry((g.index, None)).or_insert_with(|| (format!("NVML cannot reach the GPU: {why}"), None));
                    }
                    Ok(()) => {
                        // Reachable again: a lost GPU recovers at once, an Xid after the quiet time.
                        s.retain(|(dev, _), (_, since)| {
                            *dev != g.index
                                || since.is_some_and(|t| policy.recovery.is_zero() || t.elapsed() < policy.recovery)
                        });
                    }
                }
            }
        };
        let stop = || false;
        if let Err(e) = actk_core::discover::nvml::watch_xids(&host, &uuids, poll, &stop, &mut on_event, &mut on_tick) {
            tracing::warn!("Xid watch not running: {e}; GPU health comes from device nodes and sysfs only");
        }
    });
    if let Err(e) = spawned {
        tracing::warn!("Xid watch thread not started: {e}");
        return None;
    }
    Some(state)
}

/// Starts the polling loop for one vendor on the current tokio runtime and returns the channel
/// carrying the latest [`HealthMap`] (probes, and the Xid watch's findings when given); a new
/// value is sent only when some device changed, and each change is logged. The loop ends when
/// every receiver is dropped.
pub fn spawn(
    name: String,
    probes: Vec<Probe>,
    xids: Option<XidState>,
    interval: Duration,
) -> watch::Receiver<HealthMap> {
    let merged = move |probes: &[Probe]| -> HealthMap {
        let mut m = check_all(probes);
        if let Some(x) = &xids
            && let Ok(x) = x.lock()
        {
            for (key, (why, _)) in x.iter() {
                let e = m.entry(*key).or_insert(None);
                if e.is_none() {
                    *e = Some(why.clone());
                }
            }
        }
        m
    };
    let (tx, rx) = watch::channel(merged(&probes));
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = tx.closed() => break,
            }
            let mut now = merged(&probes);
            let old = tx.borrow().clone();
            // A MIG entry that went away is healthy now: keep it as None so the change is seen.
            for key in old.keys() {
                now.entry(*key).or_insert(None);
            }
            if now != old {
                for (key, state) in &now {
                    if old.get(key).cloned().flatten() != state.clone() {
                        let what = match key.1 {
                            Some(m) => format!("MIG device {}:{m}", key.0),
                            None => format!("device {}", key.0),
                        };
                        match state {
                            Some(why) => tracing::warn!("{name} {what} is unhealthy: {why}"),
                            None => tracing::info!("{name} {what} is healthy again"),
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

    #[test]
    fn xid_policy_follows_nvidias_plugin() {
        let p = XidPolicy::new(&[], Duration::from_secs(60), None, None);
        assert!(!p.is_critical(13) && !p.is_critical(109), "application errors are ignored");
        assert!(p.is_critical(79) && p.is_critical(48));
        let p = XidPolicy::new(&[94], Duration::ZERO, Some("79, x"), Some("13"));
        assert!(!p.is_critical(94) && !p.is_critical(79), "configured and DP_DISABLE_HEALTHCHECKS ignores");
        assert!(p.is_critical(13), "DP_ENABLE_HEALTHCHECKS re-enables an ignored Xid");
        let p = XidPolicy::new(&[], Duration::ZERO, Some("all"), None);
        assert!(p.disabled && !p.is_critical(79));
        let p = XidPolicy::new(&[], Duration::ZERO, Some("xids"), Some("48"));
        assert!(!p.disabled && p.is_critical(48) && !p.is_critical(79), "all off but 48 explicitly on");
    }

    #[test]
    fn device_level_health_covers_its_mig_devices() {
        let mut h = HealthMap::new();
        h.insert((0, None), None);
        h.insert((0, Some(1)), Some("Xid 48".into()));
        assert_eq!(unhealthy(&h, (0, Some(1))), Some("Xid 48"));
        assert_eq!(unhealthy(&h, (0, Some(0))), None);
        h.insert((0, None), Some("node gone".into()));
        assert_eq!(unhealthy(&h, (0, Some(0))), Some("node gone"));
    }
}
