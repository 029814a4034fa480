//! NVIDIA enricher: GPUs from the nvidia kernel module's procfs (`/proc/driver/nvidia/version`
//! and `/proc/driver/nvidia/gpus/<bus>/information`), NUMA nodes from PCI sysfs, the MIG
//! management capabilities from /proc/driver/nvidia/capabilities/mig/, and, when
//! [`DiscoverOptions::nvml`] is set, what only NVML knows (the [`super::nvml`] seam, loaded from
//! this root): MIG devices with their UUIDs, profiles and capability nodes, NVLink peers, and
//! UUIDs procfs lacks. Without NVML (not loadable, or not asked for) discovery goes on with
//! procfs alone.
//!
//! Index order is PCI bus order, which is how NVML and nvidia-smi number GPUs
//! (CUDA_DEVICE_ORDER=PCI_BUS_ID).

use super::nvml::{self, LinkPeer, MigMode};
use super::{ByteFinder, DiscoverOptions, HostRoot, Warnings, normalize_pci, parse_numa, vendor_for};
use crate::inventory::{Device, DeviceNode, Mig, MigDevice, MigPlacement, VendorInventory};
use crate::profile::Profile;
use std::collections::{BTreeMap, BTreeSet};

const PROC: &str = "/proc/driver/nvidia";
/// Capability access files (`DeviceFileMinor:` / `DeviceFileMode:` lines), per MIG instance
/// under `gpu<minor>/mig/gi<G>[/ci<C>]/access` and for management under `mig/{config,monitor}`.
pub const CAPABILITIES: &str = "/proc/driver/nvidia/capabilities";

/// A GPU's bus id: its `Bus Location`, else its procfs directory's name, in the normalised long
/// form (which sorts in PCI bus order).
fn bus_of(dir: &str, info: &Information<'_>) -> String {
    info.get("Bus Location").and_then(normalize_pci).or_else(|| normalize_pci(dir)).unwrap_or_else(|| dir.to_string())
}

/// `(index, directory, information text)` of the GPUs of `wanted` only, numbered by the sorted
/// listing of their procfs directories (each named by its bus id), without reading the others;
/// `None` (read every GPU) when a directory's name is not a bus id, or a file read does not name
/// the bus its directory does or cannot be read: then only a full pass numbers the GPUs as
/// always (an unreadable GPU is skipped there, which shifts the indexes after it).
fn information_of_wanted(
    host: &HostRoot,
    gpus_dir: &str,
    listed: &[String],
    wanted: &BTreeSet<u32>,
) -> Option<Vec<(u32, String, String)>> {
    let mut keyed: Vec<(String, &String)> =
        listed.iter().map(|dir| Some((normalize_pci(dir)?, dir))).collect::<Option<_>>()?;
    keyed.sort();
    let mut out = Vec::new();
    for (index, (bus, dir)) in keyed.into_iter().enumerate() {
        let index = u32::try_from(index).ok()?;
        if !wanted.contains(&index) {
            continue;
        }
        let text = host.read_to_string([gpus_dir, "/", dir, "/information"].concat()).ok()?;
        if bus_of(dir, &parse_information(&text)) != bus {
            return None;
        }
        out.push((index, dir.clone(), text));
    }
    Some(out)
}

/// Discover NVIDIA GPUs. `None` when the driver is not loaded under this root (no
/// `/proc/driver/nvidia`).
pub fn discover(
    host: &HostRoot,
    profile: &Profile,
    opts: &DiscoverOptions,
    warnings: &mut Warnings,
) -> Option<VendorInventory> {
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
    let listed = host.list_dir(&gpus_dir).unwrap_or_default();
    let texts = match opts.wanted(profile).and_then(|w| information_of_wanted(host, &gpus_dir, &listed, w)) {
        Some(t) => t,
        None => {
            let mut texts: Vec<(String, String)> = Vec::new();
            for bus in listed {
                let info_path = [gpus_dir.as_str(), "/", bus.as_str(), "/information"].concat();
                match host.read_to_string(&info_path) {
                    Ok(text) => texts.push((bus, text)),
                    Err(e) => warnings.add(host, &info_path, format!("GPU skipped, information unreadable: {e}")),
                }
            }
            // PCI bus order: the normalised long form sorts numerically.
            let mut keyed: Vec<(String, String, String)> =
                texts.into_iter().map(|(dir, text)| (bus_of(&dir, &parse_information(&text)), dir, text)).collect();
            keyed.sort_by(|a, b| a.0.cmp(&b.0));
            keyed.into_iter().enumerate().map(|(i, (_, dir, text))| (i as u32, dir, text)).collect()
        }
    };
    let want_major = profile.devices.major.unwrap_or(195);
    for (index, dir, text) in &texts {
        let index = *index;
        let info = parse_information(text);
        let bus = bus_of(dir, &info);
        let mut dev = Device {
            index,
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
        // The path only made when read (a container start asks no topology).
        if opts.topology {
            let numa_path = ["/sys/bus/pci/devices/", bus.as_str(), "/numa_node"].concat();
            match host.read_to_string(&numa_path) {
                Ok(t) => match parse_numa(&t) {
                    Ok(n) => dev.numa_node = n,
                    Err(why) => warnings.add(host, &numa_path, why),
                },
                Err(e) => warnings.add(host, &numa_path, format!("no PCI sysfs entry for GPU {bus}: {e}")),
            }
        }
        vendor.devices.push(dev);
    }
    let caps_major = host.proc_devices_major("nvidia-caps").ok().flatten();
    for name in ["config", "monitor"] {
        let file = format!("{CAPABILITIES}/mig/{name}");
        if host.exists(&file)
            && let Some(n) = cap_node(host, caps_major, &file, warnings)
        {
            vendor.mig_capabilities.insert(name.to_string(), n);
        }
    }
    if opts.nvml {
        enrich_from_nvml(host, &mut vendor, caps_major, warnings);
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
pub(crate) fn parse_information(text: &str) -> Information<'_> {
    // By bytes, one pass per line (issue 31: `lines`, `split_once` and `trim` cost a discovery
    // 0.1 M instructions on eight GPUs, mostly the set-up of each search). The files are ASCII;
    // keys and values are trimmed of ASCII whitespace.
    let b = text.as_bytes();
    // `text[from..to]` with ASCII whitespace trimmed from both ends (empty when all of it is).
    let trimmed = |mut from: usize, mut to: usize| {
        while from < to && b[from].is_ascii_whitespace() {
            from += 1;
        }
        while to > from && b[to - 1].is_ascii_whitespace() {
            to -= 1;
        }
        // Both ends are next to an ASCII byte (or the text's ends), so on char boundaries.
        text.get(from..to).unwrap_or_default()
    };
    let mut fields = Vec::with_capacity(16);
    let (newline, colon_at) = (ByteFinder::new(b'\n'), ByteFinder::new(b':'));
    let mut start = 0;
    while start < b.len() {
        let end = newline.find(&b[start..]).map_or(b.len(), |i| start + i);
        if let Some(colon) = colon_at.find(&b[start..end]).map(|i| start + i) {
            let (k, v) = (trimmed(start, colon), trimmed(colon + 1, end));
            if !k.is_empty() && !v.is_empty() {
                fields.push((k, v));
            }
        }
        start = end + 1;
    }
    Information(fields)
}

/// The `Key: value` lines of a procfs information file ([`parse_information`]), in file order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Information<'a>(Vec<(&'a str, &'a str)>);

impl<'a> Information<'a> {
    /// The value of `key`; the last one when the file repeats it.
    pub(crate) fn get(&self, key: &str) -> Option<&'a str> {
        self.0.iter().rev().find(|(k, _)| *k == key).map(|(_, v)| *v)
    }
}

/// `DeviceFileMinor` and `DeviceFileMode` (decimal) of a capability access file.
pub(crate) fn parse_cap_file(text: &str) -> Option<(u32, u32)> {
    let info = parse_information(text);
    let minor = info.get("DeviceFileMinor")?.parse().ok()?;
    let mode = info.get("DeviceFileMode").and_then(|m| m.parse().ok()).unwrap_or(0o444);
    Some((minor, mode))
}

/// The `/dev/nvidia-caps/nvidia-capN` node a capability access file grants. The host node is
/// used when it exists with those numbers; otherwise the node is described by its numbers
/// alone (nvidia-container-toolkit likewise creates these nodes only in the container).
fn cap_node(host: &HostRoot, caps_major: Option<u32>, file: &str, warnings: &mut Warnings) -> Option<DeviceNode> {
    let (minor, mode) = match host.read_to_string(file).map(|t| parse_cap_file(&t)) {
        Ok(Some(v)) => v,
        Ok(None) => {
            warnings.add(host, file, "no DeviceFileMinor line; capability not usable");
            return None;
        }
        Err(e) => {
            warnings.add(host, file, format!("unreadable: {e}"));
            return None;
        }
    };
    let Some(major) = caps_major else {
        warnings.add(host, "/proc/devices", "no nvidia-caps major; MIG capability nodes cannot be described");
        return None;
    };
    let path = format!("/dev/nvidia-caps/nvidia-cap{minor}");
    match host.device_node(&path) {
        Ok(n) if n.major == major && n.minor == minor => Some(n),
        Ok(n) => {
            warnings.add(
                host,
                &path,
                format!("node is {}:{}, {file} says {major}:{minor}; using the numbers", n.major, n.minor),
            );
            Some(DeviceNode { file_mode: Some(mode), major, minor, ..n })
        }
        Err(_) => Some(DeviceNode {
            path: path.clone(),
            host_path: host.host_path(&path),
            node_type: 'c',
            major,
            minor,
            file_mode: Some(mode),
            gid: None,
        }),
    }
}

/// The end of the discovery warning for MIG instances that NVML could not list; the planner
/// adds that warning to the error of a MIG request that then finds no MIG device.
pub(crate) const MIG_UNLISTED: &str = "MIG devices are not listed";

/// Whether procfs shows MIG GPU instances (a `gi<N>` directory under some GPU's capabilities).
fn procfs_has_mig_instances(host: &HostRoot) -> bool {
    host.list_dir(CAPABILITIES).unwrap_or_default().iter().filter(|g| g.starts_with("gpu")).any(|g| {
        host.list_dir(format!("{CAPABILITIES}/{g}/mig")).unwrap_or_default().iter().any(|e| e.starts_with("gi"))
    })
}

/// Add what NVML knows: UUIDs and models procfs lacks, MIG devices, NVLink peers. NVML that
/// cannot be loaded is normal on hosts without the driver's user-space library (debug log),
/// but a warning when procfs shows MIG instances that then cannot be listed.
fn enrich_from_nvml(host: &HostRoot, vendor: &mut VendorInventory, caps_major: Option<u32>, warnings: &mut Warnings) {
    let snap = match nvml::read(host) {
        Ok(s) => s,
        Err(e) => {
            tracing::debug!("NVML not used: {e}");
            if procfs_has_mig_instances(host) {
                warnings.add(host, CAPABILITIES, format!("MIG instances exist but {e}; {MIG_UNLISTED}"));
            }
            return;
        }
    };
    for p in &snap.problems {
        warnings.add_real(snap.library.clone(), format!("NVML: {p}"));
    }
    let by_bus: BTreeMap<&str, &nvml::GpuInfo> =
        snap.gpus.iter().filter_map(|g| Some((g.pci_bus_id.as_deref()?, g))).collect();
    let index_by_bus: BTreeMap<String, u32> =
        vendor.devices.iter().filter_map(|d| Some((d.pci_bus_id.clone()?, d.index))).collect();
    // NVSwitches each GPU reaches: GPUs on a common switch are all peers (nvidia-smi topo: NV#).
    let mut switches: BTreeMap<u32, BTreeSet<String>> = BTreeMap::new();
    let mut direct: BTreeMap<u32, BTreeSet<u32>> = BTreeMap::new();
    for dev in &mut vendor.devices {
        let Some(g) = dev.pci_bus_id.as_deref().and_then(|b| by_bus.get(b)) else {
            warnings.add_real(
                snap.library.clone(),
                format!("NVML does not list GPU {} ({})", dev.index, dev.pci_bus_id.as_deref().unwrap_or("?")),
            );
            continue;
        };
        if dev.uuid.is_none() {
            dev.uuid = g.uuid.clone();
        }
        if dev.model.is_none() {
            dev.model = g.name.clone();
        }
        if let Some((major, minor)) = g.compute_capability {
            // What GPU Feature Discovery labels (nvidia.com/gpu.compute.major/minor).
            dev.attributes.insert("compute_capability".into(), format!("{major}.{minor}"));
        }
        if let Some(v) = snap.cuda_driver_version {
            // nvidia-smi's "CUDA Version" (13000 -> 13.0), GFD's nvidia.com/cuda.runtime-version.
            dev.attributes.insert("cuda_driver_version".into(), format!("{}.{}", v / 1000, v % 1000 / 10));
        }
        if let Some(m) = g.memory_mib {
            dev.attributes.insert("memory_mib".into(), m.to_string());
            // In bytes too: the DRA driver publishes it as the device's `memory` capacity.
            dev.attributes.insert("memory_bytes".into(), (m * 1024 * 1024).to_string());
        }
        let minor = dev.attributes.get("minor").and_then(|m| m.parse().ok()).or(g.minor);
        dev.mig = match g.mig {
            MigMode::Unsupported => None,
            MigMode::Disabled => Some(Mig { enabled: false, devices: vec![] }),
            MigMode::Enabled => Some(Mig {
                enabled: true,
                devices: g.mig_devices.iter().map(|m| mig_device(host, minor, caps_major, m, warnings)).collect(),
            }),
        };
        for (_, peer) in &g.nvlinks {
            match peer {
                LinkPeer::Gpu(bus) => {
                    if let Some(&p) = index_by_bus.get(bus) {
                        direct.entry(dev.index).or_default().insert(p);
                    }
                }
                LinkPeer::Switch(bus) => {
                    switches.entry(dev.index).or_default().insert(bus.clone());
                }
            }
        }
    }
    for dev in &mut vendor.devices {
        let mut peers: BTreeSet<u32> = direct.get(&dev.index).cloned().unwrap_or_default();
        if let Some(mine) = switches.get(&dev.index) {
            for (other, theirs) in &switches {
                if *other != dev.index && !mine.is_disjoint(theirs) {
                    peers.insert(*other);
                }
            }
        }
        peers.remove(&dev.index);
        if !peers.is_empty() {
            dev.links = peers.into_iter().collect();
        }
    }
}

/// An inventory MIG device from NVML's description and the capability files of its instances.
fn mig_device(
    host: &HostRoot,
    gpu_minor: Option<u32>,
    caps_major: Option<u32>,
    m: &nvml::MigInfo,
    warnings: &mut Warnings,
) -> MigDevice {
    let mut nodes = Vec::new();
    match gpu_minor {
        Some(minor) => {
            let gi = format!("{CAPABILITIES}/gpu{minor}/mig/gi{}", m.gpu_instance);
            for file in [format!("{gi}/access"), format!("{gi}/ci{}/access", m.compute_instance)] {
                if let Some(n) = cap_node(host, caps_major, &file, warnings) {
                    nodes.push(n);
                }
            }
        }
        None => warnings.add(host, CAPABILITIES, format!("MIG device {}: parent GPU minor unknown", m.uuid)),
    }
    MigDevice {
        index: m.index,
        uuid: m.uuid.clone(),
        gpu_instance: m.gpu_instance,
        compute_instance: m.compute_instance,
        profile: m.profile.clone(),
        gi_profile_id: m.gi_profile_id,
        placement: MigPlacement { start: m.placement_start, size: m.placement_size },
        memory_mib: m.memory_mib,
        multiprocessors: m.multiprocessors,
        engines: m.engines.clone(),
        nodes,
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use super::*;

    /// A real H200 NVL node's /proc/driver/nvidia/gpus/0000:ce:00.0/information (driver
    /// 580.95.05; fixtures/nvidia-h200-nvl), with a CRLF line, a repeated key, an empty value
    /// and a line without a colon added.
    #[test]
    fn information_lines_are_read_as_the_driver_writes_them() {
        let text = "Model: \t\t NVIDIA H200 NVL\nIRQ:   \t\t 164\nGPU UUID: \t GPU-fb98cd99-f575-79ea-883f-c793e3ff91ae\n\
                    Bus Location: \t 0000:ce:00.0\r\nDevice Minor: \t 7\nGPU Excluded:\t No\nIRQ: 165\nEmpty:  \n\
                    no colon here\n:  no key\n";
        let info = parse_information(text);
        assert_eq!(info.get("Model"), Some("NVIDIA H200 NVL"));
        assert_eq!(info.get("GPU UUID"), Some("GPU-fb98cd99-f575-79ea-883f-c793e3ff91ae"));
        assert_eq!(info.get("Bus Location"), Some("0000:ce:00.0"), "split at the first colon, CR trimmed");
        assert_eq!(info.get("Device Minor"), Some("7"));
        assert_eq!(info.get("IRQ"), Some("165"), "the last of a repeated key");
        assert_eq!(info.get("Empty"), None);
        assert_eq!(info.get(""), None);
        assert_eq!(info.get("no colon here"), None);
        assert_eq!(bus_of("0000:CE:00.0", &info), "0000:ce:00.0");
    }

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
