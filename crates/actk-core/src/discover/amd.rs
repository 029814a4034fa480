//! AMD enricher: GPUs from the KFD topology (`/sys/class/kfd/kfd/topology/nodes/N/properties`,
//! `key value` lines; amdkfd's kfd_topology.c). GPU nodes are those with `simd_count` > 0 (CPU
//! nodes have 0); index = their order by KFD node number, as ROCm numbers GPUs. Per GPU:
//! `drm_render_minor` gives `/dev/dri/renderD<minor>`, the matching `/dev/dri/cardN` is found
//! through `/sys/class/drm/renderD<minor>/device/drm/`, `location_id` (bus << 8 | devfn) and
//! `domain` give the PCI id, `unique_id` the UUID, io_links of type 11 (XGMI) the peers.
//!
//! Partitioned GPUs (MI300X in DPX/QPX/CPX compute mode): every partition is a KFD node of its
//! own, with its own render node, and is one device here ("one device per partition", as ROCm
//! counts them). Partitions of one GPU share its PCI address (their `location_id` carries the
//! partition number where the function would be) and `unique_id`; partitions past the first
//! are amdgpu_xcp platform devices with a render node only. Each gets the GPU's modes as
//! attributes `compute_partition` / `memory_partition` (lower case, from the PCI function's
//! current_compute_partition / current_memory_partition, as ROCm's device plugin reads them)
//! and `partition` (its number on the GPU); its UUID is left out (the GPU's unique_id is not
//! unique per partition; it is kept as attribute `unique_id`). A GPU's links are its XGMI
//! peers of the lowest weight: every other GPU of the hive when unpartitioned, the partitions
//! of the same GPU when partitioned (weight 13 there, 41 to other GPUs).

use super::{DiscoverOptions, HostRoot, Warnings, normalize_pci, parse_numa, vendor_for};
use crate::inventory::{Device, VendorInventory};
use crate::profile::Profile;
use std::collections::BTreeMap;

const TOPOLOGY: &str = "/sys/class/kfd/kfd/topology/nodes";
/// io_link `type` of an XGMI link (kfd_crat.h CRAT_IOLINK_TYPE_XGMI).
const IOLINK_XGMI: &str = "11";

/// Discover AMD GPUs; `None` when there is no KFD topology under this root. XGMI links are read
/// only with [`DiscoverOptions::topology`].
pub fn discover(
    host: &HostRoot,
    profile: &Profile,
    opts: &DiscoverOptions,
    warnings: &mut Warnings,
) -> Option<VendorInventory> {
    // The topology directory, resolved once: /sys/class/kfd is a symlink into
    // /sys/devices/virtual/kfd, and a path through it was walked name by name for every node
    // (two handles and memo entries per node; issue 31). Below the resolved one, each file is
    // opened in one openat2 that refuses symlinks.
    let resolved = host.resolve_dir(TOPOLOGY).ok()?;
    let topology = resolved.to_str().unwrap_or(TOPOLOGY);
    let mut nodes: Vec<(u32, String)> =
        host.list_dir(topology).ok()?.into_iter().filter_map(|n| Some((n.parse::<u32>().ok()?, n))).collect();
    nodes.sort();
    let mut vendor = vendor_for(profile);
    vendor.driver_version = host.read_to_string("/sys/module/amdgpu/version").ok().map(|v| v.trim().to_string());
    // KFD node id -> GPU index, for links.
    let mut gpu_index: BTreeMap<u32, u32> = BTreeMap::new();
    let mut links_by_node: Vec<Vec<u32>> = Vec::new();
    // Every node is read for the numbering (GPU or CPU, and its PCI function for partitions),
    // parsed only as far as that needs; a GPU asked for is parsed whole below (issue 31: 66
    // files on a CPX node, most of whose lines no start needs).
    let mut gpu_nodes: Vec<(u32, String, String, KfdProps)> = Vec::new();
    for (node_id, name) in nodes {
        let props_path = format!("{topology}/{name}/properties");
        let text = match host.read_to_string(&props_path) {
            Ok(t) => t,
            Err(e) => {
                warnings.add(host, &props_path, format!("KFD node skipped: {e}"));
                continue;
            }
        };
        let props = KfdProps::numbering(&text);
        if props.get("simd_count").is_none_or(|&n| n == 0) {
            continue; // a CPU node
        }
        gpu_nodes.push((node_id, name, text, props));
    }
    // The PCI function of a KFD node: its location_id without the function (partition) bits.
    let pci_of = |p: &KfdProps| -> Option<(u64, u64, u64)> {
        let loc = *p.get("location_id")?;
        Some((p.get("domain").copied().unwrap_or(0), (loc >> 8) & 0xff, (loc >> 3) & 0x1f))
    };
    let mut per_pci: BTreeMap<(u64, u64, u64), u32> = BTreeMap::new();
    for (_, _, _, p) in &gpu_nodes {
        if let Some(k) = pci_of(p) {
            *per_pci.entry(k).or_default() += 1;
        }
    }
    let mut seen_on_pci: BTreeMap<(u64, u64, u64), u32> = BTreeMap::new();
    let mut functions: BTreeMap<String, PciFunction> = BTreeMap::new();
    for (position, (node_id, name, text, numbering)) in gpu_nodes.into_iter().enumerate() {
        let index = position as u32;
        gpu_index.insert(node_id, index);
        let pci_key = pci_of(&numbering);
        let partitioned = pci_key.is_some_and(|k| per_pci[&k] > 1);
        let partition = pci_key.map(|k| {
            let e = seen_on_pci.entry(k).or_default();
            *e += 1;
            *e - 1
        });
        // Every node's properties give the numbering; a device not asked for is not read further.
        if opts.wanted(profile).is_some_and(|w| !w.contains(&index)) {
            continue;
        }
        let props = KfdProps::parse(&text);
        let mut dev = Device { index, ..Default::default() };
        if let Some(&uid) = props.get("unique_id").filter(|&&u| u != 0) {
            if partitioned {
                dev.attributes.insert("unique_id".into(), hex(uid, 16));
            } else {
                dev.uuid = Some(hex(uid, 16));
            }
        }
        if let Some(&loc) = props.get("location_id") {
            let domain = props.get("domain").copied().unwrap_or(0);
            // A partition's location_id carries its number where the function would be.
            let func = if partitioned { 0 } else { loc & 7 };
            dev.pci_bus_id =
                normalize_pci(&format!("{domain:04x}:{:02x}:{:02x}.{func:x}", (loc >> 8) & 0xff, (loc >> 3) & 0x1f,));
        }
        if partitioned && let Some(p) = partition {
            dev.attributes.insert("partition".into(), p.to_string());
        }
        for key in ["gfx_target_version", "device_id", "vendor_id"] {
            if let Some(v) = props.get(key) {
                dev.attributes.insert(key.into(), if key == "gfx_target_version" { v.to_string() } else { hex(*v, 4) });
            }
        }
        dev.attributes.insert("kfd_node".into(), node_id.to_string());
        // GPUs of one XGMI hive share this id (kfd_topology.c); 0 means the GPU is in no hive.
        if let Some(&hive) = props.get("hive_id").filter(|&&h| h != 0) {
            dev.attributes.insert("hive_id".into(), hex(hive, 16));
        }
        if let Some(bus) = &dev.pci_bus_id {
            // Read once per PCI function: the partitions of a GPU share it (issue 31: 64 CPX
            // partitions read the same three files of 8 functions 8 times each).
            let f = functions.entry(bus.clone()).or_insert_with(|| PciFunction::read(host, bus, opts, warnings));
            dev.numa_node = f.numa_node;
            dev.model = f.model.clone();
            for (key, v) in &f.partitions {
                dev.attributes.insert((*key).into(), v.clone());
            }
        }
        if dev.model.is_none() {
            dev.model = props.get("device_id").and_then(|&id| model_name(id)).map(str::to_string);
        }
        match props.get("drm_render_minor") {
            Some(&minor) => {
                let render = format!("/dev/dri/renderD{minor}");
                match host.device_node(&render) {
                    Ok(n) => dev.nodes.push(n),
                    Err(e) => warnings.add(host, &render, format!("render node of GPU {index} unusable: {e}")),
                }
                let drm = format!("/sys/class/drm/renderD{minor}/device/drm");
                // Partitions past the first are amdgpu_xcp devices with a render node only: their
                // DRM directory is not listed (a walk of two sysfs links per partition).
                let past_first = partitioned && partition != Some(0);
                let cards: Vec<String> = if past_first { Vec::new() } else { host.list_dir(&drm).unwrap_or_default() }
                    .into_iter()
                    .filter(|n| {
                        n.strip_prefix("card").is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
                    })
                    .collect();
                match cards.first() {
                    Some(card) => match host.device_node(&format!("/dev/dri/{card}")) {
                        Ok(n) => dev.nodes.push(n),
                        Err(e) => warnings.add(
                            host,
                            format!("/dev/dri/{card}"),
                            format!("card node of GPU {index} unusable: {e}"),
                        ),
                    },
                    // Partitions past the first (amdgpu_xcp devices) have a render node only.
                    None if past_first => {}
                    None => warnings.add(
                        host,
                        &drm,
                        format!("no cardN entry for GPU {index}; only its render node is used"),
                    ),
                }
            }
            None => warnings.add(
                host,
                format!("{topology}/{name}/properties"),
                "GPU node without drm_render_minor; no device node",
            ),
        }
        dev.attributes
            .insert("render_minor".into(), props.get("drm_render_minor").map(u64::to_string).unwrap_or_default());
        let links_dir = format!("{topology}/{name}/io_links");
        let mut xgmi: Vec<(u32, u64)> = Vec::new();
        let links = if opts.topology { host.list_dir(&links_dir).unwrap_or_default() } else { Vec::new() };
        for l in links {
            if let Ok(t) = host.read_to_string(format!("{links_dir}/{l}/properties"))
                && property(&t, "type") == Some(IOLINK_XGMI)
                && let Some(to) = property(&t, "node_to").and_then(|v| v.parse::<u32>().ok())
            {
                xgmi.push((to, property(&t, "weight").and_then(|w| w.parse().ok()).unwrap_or(0)));
            }
        }
        // The closest XGMI peers (lowest weight): within a partitioned GPU, its own partitions.
        let min = xgmi.iter().map(|(_, w)| *w).min();
        links_by_node.push(xgmi.into_iter().filter(|(_, w)| Some(*w) == min).map(|(to, _)| to).collect());
        vendor.devices.push(dev);
    }
    for (dev, peers) in vendor.devices.iter_mut().zip(links_by_node) {
        let mut l: Vec<u32> =
            peers.iter().filter_map(|p| gpu_index.get(p).copied()).filter(|&i| i != dev.index).collect();
        l.sort_unstable();
        l.dedup();
        dev.links = l;
    }
    Some(vendor)
}

/// What discovery reads of a GPU's PCI function (shared by its partitions), from
/// `/sys/bus/pci/devices/<bus>/`: `numa_node` (with [`DiscoverOptions::topology`]),
/// `product_name` and the current compute and memory partition modes (lower case).
struct PciFunction {
    numa_node: Option<u32>,
    model: Option<String>,
    partitions: Vec<(&'static str, String)>,
}

impl PciFunction {
    fn read(host: &HostRoot, bus: &str, opts: &DiscoverOptions, warnings: &mut Warnings) -> PciFunction {
        let pci = format!("/sys/bus/pci/devices/{bus}");
        let mut numa_node = None;
        match opts.topology.then(|| host.read_to_string(format!("{pci}/numa_node"))) {
            None => {}
            Some(Ok(t)) => match parse_numa(&t) {
                Ok(n) => numa_node = n,
                Err(why) => warnings.add(host, format!("{pci}/numa_node"), why),
            },
            Some(Err(e)) => {
                warnings.add(host, format!("{pci}/numa_node"), format!("no PCI sysfs entry for GPU {bus}: {e}"))
            }
        }
        let model = host
            .read_to_string(format!("{pci}/product_name"))
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty());
        let mut partitions = Vec::new();
        for (file, key) in
            [("current_compute_partition", "compute_partition"), ("current_memory_partition", "memory_partition")]
        {
            if let Ok(v) = host.read_to_string(format!("{pci}/{file}")) {
                let v = v.trim().to_ascii_lowercase();
                if !v.is_empty() {
                    partitions.push((key, v));
                }
            }
        }
        PciFunction { numa_node, model, partitions }
    }
}

/// The numeric properties of a KFD node that discovery uses, from its `properties` file
/// (`name value` lines, decimal, as kfd_topology.c prints them): one pass, no map of the file's
/// dozens of other lines (issue 31: a host reads one file per KFD node, 66 on a CPX node).
struct KfdProps([Option<u64>; KFD_KEYS.len()]);

/// The properties [`KfdProps`] keeps.
const KFD_KEYS: [&str; 9] = [
    "simd_count",
    "location_id",
    "domain",
    "unique_id",
    "hive_id",
    "drm_render_minor",
    "gfx_target_version",
    "device_id",
    "vendor_id",
];

/// The properties that number the GPUs of a node (which nodes are GPUs, and which share a
/// PCI function): what every KFD node is read for, with the `name ` each line starts with.
const NUMBERING_KEYS: [(usize, &str); 3] = [(0, "simd_count "), (1, "location_id "), (2, "domain ")];

/// The position of property `name` in [`KFD_KEYS`] (a `match`: one length switch and one
/// compare per line of a properties file, not nine).
fn kfd_key(name: &str) -> Option<usize> {
    Some(match name {
        "simd_count" => 0,
        "location_id" => 1,
        "domain" => 2,
        "unique_id" => 3,
        "hive_id" => 4,
        "drm_render_minor" => 5,
        "gfx_target_version" => 6,
        "device_id" => 7,
        "vendor_id" => 8,
        _ => return None,
    })
}

impl KfdProps {
    /// Parse `text` for every property of [`KFD_KEYS`], stopping once each has been seen, or at
    /// `simd_count 0` (a CPU node: nothing else is read of it). The first line of a name counts;
    /// a value that is not a decimal u64 is left out, as a missing line is.
    fn parse(text: &str) -> KfdProps {
        let mut values = [None; KFD_KEYS.len()];
        let mut left: u16 = (1 << KFD_KEYS.len()) - 1;
        for (k, v) in lines(text) {
            let Some(i) = kfd_key(k) else { continue };
            if left & (1 << i) == 0 {
                continue;
            }
            let Ok(n) = v.parse::<u64>() else { continue };
            values[i] = Some(n);
            left &= !(1 << i);
            if left == 0 || (i == 0 && n == 0) {
                break;
            }
        }
        KfdProps(values)
    }

    /// Only the [`NUMBERING_KEYS`] of `text`, each found by searching for its line (memchr's
    /// memmem) rather than by splitting every line before it: every KFD node is read for these,
    /// and location_id is the 22nd line of a real node's file (issue 31). Nothing past
    /// `simd_count` is read of a CPU node. Same values as [`KfdProps::parse`] on files as
    /// kfd_topology.c prints them (`name value`, one space).
    fn numbering(text: &str) -> KfdProps {
        let mut values = [None; KFD_KEYS.len()];
        for (i, name) in NUMBERING_KEYS {
            values[i] = line_value(text.as_bytes(), name);
            if i == 0 && values[0].is_none_or(|n| n == 0) {
                break;
            }
        }
        KfdProps(values)
    }

    /// The value of property `name` (one of [`KFD_KEYS`]).
    fn get(&self, name: &str) -> Option<&u64> {
        kfd_key(name).and_then(|i| self.0[i].as_ref())
    }
}

/// The decimal value of the first line of `text` that starts with `name_sp` (a name and one
/// space), if there is one and it parses.
fn line_value(text: &[u8], name_sp: &str) -> Option<u64> {
    let mut from = 0;
    let start = loop {
        let at = from + memchr::memmem::find(&text[from..], name_sp.as_bytes())?;
        if at == 0 || text[at - 1] == b'\n' {
            break at + name_sp.len();
        }
        from = at + 1;
    };
    let end = memchr::memchr(b'\n', &text[start..]).map_or(text.len(), |e| start + e);
    std::str::from_utf8(&text[start..end]).ok()?.trim_ascii().parse().ok()
}

/// The value of `name` in a KFD properties file, if present.
fn property<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    lines(text).find(|(k, _)| *k == name).map(|(_, v)| v)
}

/// The `name value` lines of a KFD properties file; names and values are ASCII (kfd_topology.c
/// prints `%s %llu`), so only ASCII whitespace separates them.
fn lines(text: &str) -> impl Iterator<Item = (&str, &str)> {
    text.split('\n').filter_map(|l| {
        let l = l.trim_ascii();
        let sp = l.bytes().position(|b| b.is_ascii_whitespace())?;
        Some((&l[..sp], l[sp + 1..].trim_ascii_start()))
    })
}

/// Marketing names of Instinct parts by PCI device id (amdgpu_drv.c ids; used only when the
/// board's FRU `product_name` is not in sysfs).
fn model_name(device_id: u64) -> Option<&'static str> {
    Some(match device_id {
        0x74a1 => "AMD Instinct MI300X",
        0x74a0 => "AMD Instinct MI300A",
        0x74a5 => "AMD Instinct MI325X",
        0x740c => "AMD Instinct MI250X/MI250",
        0x740f => "AMD Instinct MI210",
        0x738c => "AMD Instinct MI100",
        _ => return None,
    })
}

/// `format!("0x{v:0width$x}")` without the formatting machinery: a KFD node's ids are five
/// such strings, 800 instructions each formatted, 320 of them in a create asking for a CPX
/// node's 64 partitions (issue 31). The digits are [`super::hex`]'s, as PCI ids have them.
fn hex(v: u64, width: usize) -> String {
    let mut out = String::with_capacity(2 + width.max(16));
    out.push_str("0x");
    super::hex(&mut out, v, width);
    out
}

#[cfg(test)]
mod tests {
    proptest::proptest! {
        #[test]
        fn hex_is_the_format(v in proptest::num::u64::ANY, width in 0usize..20) {
            proptest::prop_assert_eq!(hex(v, width), format!("0x{v:0width$x}"));
        }
    }

    use super::super::testutil::*;
    use super::*;

    #[test]
    fn numbering_reads_the_first_line_of_each_key() {
        let loc = |text: &str| KfdProps::numbering(text).get("location_id").copied();
        let head = "simd_count 4\n";
        assert_eq!(
            loc(&format!("{head}xlocation_id 1\nlocation_id_x 2\n location_id 3\nlocation_id 4\nlocation_id 5\n")),
            Some(4),
            "a line's start, the first such line"
        );
        assert_eq!(loc(&format!("{head}location_id 6")), Some(6), "a last line without newline");
        assert_eq!(loc(&format!("\n\nlocation_id  7 \n{head}")), Some(7), "empty lines, spaces, any order");
        assert_eq!(loc(&format!("{head}location_id x\nlocation_id 8\n")), None, "the first line decides");
        assert_eq!(loc("location_id 9\nsimd_count 0\n"), None, "a CPU node: nothing but simd_count");
        assert_eq!(loc("location_id 9\n"), None, "no simd_count: nothing");
        assert_eq!(KfdProps::numbering("location_id 9\nsimd_count 0\n").get("simd_count"), Some(&0));
        assert_eq!(loc(""), None);
        // What KfdProps::parse reads, on every prefix of a real node's file and of a CPU node's.
        for node in [
            "cpu_cores_count 0\nsimd_count 1216\nmem_banks_count 1\nlocation_id 1280\ndomain 0\nhive_id 0\n",
            "cpu_cores_count 96\nsimd_count 0\nmem_banks_count 1\nlocation_id 0\ndomain 0\n",
        ] {
            for end in 0..=node.len() {
                let part = &node[..end];
                let (all, some) = (KfdProps::parse(part), KfdProps::numbering(part));
                let cpu_or_none = all.get("simd_count").is_none_or(|n| *n == 0);
                for key in ["simd_count", "location_id", "domain"] {
                    let want = if cpu_or_none && key != "simd_count" { None } else { all.get(key) };
                    assert_eq!(some.get(key), want, "{key} in {part:?}");
                }
                assert_eq!(some.get("hive_id"), None, "only the numbering keys");
            }
        }
    }

    #[test]
    fn kfd_properties_parse_as_far_as_asked() {
        for (i, k) in KFD_KEYS.iter().enumerate() {
            assert_eq!(kfd_key(k), Some(i), "{k}");
        }
        // The order and spacing of a real MI300X node (fixtures/amd-mi300x, nodes/2).
        let text = "cpu_cores_count 0\nsimd_count 1216\nmem_banks_count 1\nlocation_id 1280\ndomain 0\n\
                    drm_render_minor 128\nhive_id 0\nunique_id  11586028110763218670 \ndevice_id x\n";
        let all = KfdProps::parse(text);
        assert_eq!(all.get("simd_count"), Some(&1216));
        assert_eq!(all.get("location_id"), Some(&1280));
        assert_eq!(all.get("unique_id"), Some(&11586028110763218670), "extra spaces around a value");
        assert_eq!(all.get("hive_id"), Some(&0));
        assert_eq!(all.get("device_id"), None, "not a number: left out");
        let numbering = KfdProps::numbering(text);
        assert_eq!(
            (numbering.get("simd_count"), numbering.get("location_id"), numbering.get("domain")),
            (Some(&1216), Some(&1280), Some(&0))
        );
        assert_eq!(numbering.get("drm_render_minor"), None, "only the numbering keys are read");
        for cpu in
            [KfdProps::parse("simd_count 0\nlocation_id 7\n"), KfdProps::numbering("simd_count 0\nlocation_id 7\n")]
        {
            assert_eq!(
                (cpu.get("simd_count"), cpu.get("location_id")),
                (Some(&0), None),
                "a CPU node stops at simd_count 0"
            );
        }
        // A name inside another line's name or value is not that line; the first line counts.
        let tricky = "xdomain 5\nsimd_count 4\nfw_domain 9\nsimd_count 8\ndomain 3";
        let (p, n) = (KfdProps::parse(tricky), KfdProps::numbering(tricky));
        assert_eq!((p.get("simd_count"), p.get("domain")), (Some(&4), Some(&3)));
        assert_eq!((n.get("simd_count"), n.get("domain")), (Some(&4), Some(&3)));
        assert_eq!(KfdProps::numbering("location_id 1\nsimd_count 2\n").get("location_id"), Some(&1), "first line");
        // Both agree on every KFD node of the fixtures (copies of real MI300X/MI250 nodes).
        let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures");
        let mut checked = 0;
        for f in std::fs::read_dir(&fixtures).unwrap().flatten() {
            let topology = f.path().join("root/sys/devices/virtual/kfd/kfd/topology/nodes");
            for n in std::fs::read_dir(topology).into_iter().flatten().flatten() {
                let text = std::fs::read_to_string(n.path().join("properties")).unwrap();
                let (p, q) = (KfdProps::parse(&text), KfdProps::numbering(&text));
                for (_, name) in NUMBERING_KEYS {
                    let name = name.trim_end();
                    if p.get("simd_count").is_some_and(|&s| s > 0) || name == "simd_count" {
                        assert_eq!(p.get(name), q.get(name), "{name} of {}", n.path().display());
                    }
                }
                checked += 1;
            }
        }
        assert!(checked >= 8, "KFD fixtures found: {checked}");
    }

    #[test]
    fn kfd_topology_gpus_nodes_and_xgmi_links() {
        let tmp = tempfile::tempdir().unwrap();
        let r = tmp.path();
        if !(node(r, "/dev/kfd", 235, 0)
            && node(r, "/dev/dri/renderD128", 226, 128)
            && node(r, "/dev/dri/card1", 226, 1)
            && node(r, "/dev/dri/renderD129", 226, 129)
            && node(r, "/dev/dri/card2", 226, 2))
        {
            return;
        }
        file(r, &format!("{TOPOLOGY}/0/properties"), "cpu_cores_count 96\nsimd_count 0\n");
        for (n, minor, loc, card) in [(1u32, 128, 0x0c00u32, 1), (2, 129, 0x2200, 2)] {
            file(
                r,
                &format!("{TOPOLOGY}/{n}/properties"),
                &format!(
                    "simd_count 1216\ndrm_render_minor {minor}\nlocation_id {loc}\ndomain 0\ndevice_id 29857\nunique_id {}\nhive_id {}\n",
                    1000 + n,
                    if n == 1 { 0x5b2f_0c3a_11e4_7d21u64 } else { 0 }
                ),
            );
            let bus = format!("0000:{:02x}:00.0", loc >> 8);
            file(r, &format!("/sys/bus/pci/devices/{bus}/numa_node"), "0\n");
            file(r, &format!("/sys/class/drm/renderD{minor}/device/drm/card{card}/dev"), "");
            file(r, &format!("{TOPOLOGY}/{n}/io_links/0/properties"), "type 2\nnode_to 0\n");
            file(r, &format!("{TOPOLOGY}/{n}/io_links/1/properties"), &format!("type 11\nnode_to {}\n", 3 - n));
        }
        let inv = super::super::discover(r, &crate::profile::builtin());
        let v = inv.vendor("amd").expect("amd found");
        assert!(inv.warnings.is_empty(), "{:?}", inv.warnings);
        assert_eq!(v.devices.len(), 2);
        let d = &v.devices[1];
        assert_eq!(d.pci_bus_id.as_deref(), Some("0000:22:00.0"));
        assert_eq!(d.model.as_deref(), Some("AMD Instinct MI300X"));
        assert_eq!(d.links, [0]);
        assert_eq!(v.devices[0].attributes.get("hive_id").map(String::as_str), Some("0x5b2f0c3a11e47d21"));
        assert_eq!(d.attributes.get("hive_id"), None, "hive_id 0 is no hive");
        assert_eq!(
            d.nodes.iter().map(|n| n.path.as_str()).collect::<Vec<_>>(),
            ["/dev/dri/renderD129", "/dev/dri/card2"]
        );
        assert_eq!(v.shared_nodes.iter().map(|n| n.path.as_str()).collect::<Vec<_>>(), ["/dev/kfd"]);
        // Without topology (a container start): the same devices, no peers and no NUMA node.
        let opts = DiscoverOptions { topology: false, ..Default::default() };
        let lean = super::super::discover_with(r, &crate::profile::builtin(), &opts);
        let lv = lean.vendor("amd").expect("amd found");
        assert!(lv.devices.iter().all(|d| d.links.is_empty() && d.numa_node.is_none()));
        assert_eq!(v.devices[0].numa_node, Some(0), "read with topology");
        let strip = |v: &VendorInventory| {
            let mut v = v.clone();
            v.devices.iter_mut().for_each(|d| {
                d.links.clear();
                d.numa_node = None;
            });
            format!("{v:?}")
        };
        assert_eq!(strip(lv), strip(v));
    }
}
