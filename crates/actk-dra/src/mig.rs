//! Dynamic MIG: every placement a MIG-mode GPU can give a MIG device, published as a device of
//! its own that consumes the GPU's shared counters (KEP-4815 partitionable devices,
//! resource.k8s.io/v1 `sharedCounters` / `consumesCounters`, beta and on by default from
//! Kubernetes 1.36), so that the scheduler picks one placement and never two that overlap; the
//! MIG device is made at NodePrepareResources and destroyed at NodeUnprepareResources
//! ([`crate::driver`], through actk-core's NVML seam `discover::nvml::dynamic`). Opt-in
//! (`--dynamic-mig`, chart `dra.dynamicMig`), never by default: making and destroying MIG
//! instances changes the node.
//!
//! Per GPU in MIG mode (NVML `nvmlDeviceGetMigMode` current = enabled) whose GPU instance
//! profiles NVML lists ([`Layout`]):
//! - one counter set, [`counter_set_name`] (`nvidia-0-slices`), with a counter
//!   `memory-slice-K` of value 1 for each of the GPU's memory slices (8 on A100 and H100), and
//!   `gi-profile-<id>` for each profile that allows fewer instances than it has placements
//!   (A100's `1g.10gb+me`: one instance, seven placements), valued what is left of that limit;
//! - one device per placement, [`placement_name`] (`nvidia-0-mig-3g-40gb-4`: profile
//!   `3g.40gb` at memory slice 4), consuming the memory slices the placement covers (and one of
//!   its profile's instance counter where there is one), with the attributes of a MIG device
//!   that a placement already has (`migProfile`, `parentUUID`, `parentIndex`,
//!   `placementStart`, `placementSize`, `kind`, `profile`, `vendor`, `driverVersion`,
//!   `model`, the NUMA node), `dynamicMig: true`, and the profile's capacities (`memory`,
//!   `multiprocessors`, the engines), as NVML reports them (`nvmlDeviceGetGpuInstanceProfileInfo`).
//!   The chart's `actk-nvidia-mig` class selects them as it selects MIG devices that exist.
//!
//! MIG devices that already exist on such a GPU:
//! - one that the driver made for a prepared claim ([`crate::checkpoint::Made`]), or is making
//!   ([`crate::checkpoint::Checkpoint::making`]), is not published again: its placement device
//!   is the claim's allocation and stays;
//! - any other (made by the admin, mig-parted) stays published as the static MIG device it is
//!   ([`crate::slice::mig_slice_device`]); the placements that overlap it are left out (NVML
//!   would refuse them) and its profile's instance counter counts it.

use actk_core::discover::nvml::dynamic::GiProfile;
use actk_core::inventory::Inventory;
use k8s_openapi::api::resource::v1::{
    Counter, CounterSet, Device as SliceDevice, DeviceAttribute, DeviceCounterConsumption,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use std::collections::{BTreeMap, BTreeSet};

use crate::slice::device_name;

/// Where a placement device's MIG device is made: the GPU, the GPU instance profile (by its
/// NVML index, `NVML_GPU_INSTANCE_PROFILE_*`) and the memory slices.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Placement {
    /// The GPU's index (NVML, `nvidia-smi`).
    pub gpu_index: u32,
    /// The GPU's UUID (`GPU-...`): what NVML is asked by.
    pub gpu_uuid: String,
    /// GPU instance profile index.
    pub profile_index: u32,
    /// The profile's name (`3g.40gb`).
    pub mig_profile: String,
    /// First memory slice.
    pub start: u32,
    /// Memory slices.
    pub size: u32,
}

/// Placement devices by slice device name: what the publisher offers and the driver makes.
pub type Placements = BTreeMap<String, Placement>;

/// The profiles NVML lists for one GPU in MIG mode, by GPU UUID.
pub type Layouts = BTreeMap<String, Vec<GiProfile>>;

/// The name of GPU `gpu`'s counter set: `<profile>-<gpu>-slices` (`nvidia-0-slices`).
pub fn counter_set_name(profile: &str, gpu: u32) -> String {
    format!("{}-slices", device_name(profile, gpu))
}

/// The slice device name of the placement of MIG profile `mig_profile` at memory slice
/// `start` of GPU `gpu`: `<profile>-<gpu>-mig-<mig profile>-<start>`, the MIG profile in lower
/// case with every other character `-` (`nvidia-0-mig-1g-10gb-me-6` for `1g.10gb+me` at 6).
pub fn placement_name(profile: &str, gpu: u32, mig_profile: &str, start: u32) -> String {
    let slug: String =
        mig_profile.to_ascii_lowercase().chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).collect();
    format!("{}-mig-{}-{start}", device_name(profile, gpu), slug.trim_matches('-'))
}

/// What dynamic MIG adds to the pool.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    /// One counter set per dynamic GPU.
    pub counter_sets: Vec<CounterSet>,
    /// The placement devices, GPU by GPU, profile by profile, placement by placement.
    pub devices: Vec<SliceDevice>,
    /// The placements by device name (the driver's).
    pub placements: Placements,
    /// UUIDs of MIG devices the driver made, which are not published as static MIG devices.
    pub hidden: BTreeSet<String>,
    /// The GPU device name (`nvidia-0`) of each placement device, for the GPU's health.
    pub parent: BTreeMap<String, String>,
}

/// Reads, through the root's NVML, the GPU instance profiles of every GPU in MIG mode of
/// `inventory` that `cache` lacks (once per GPU: a board's profiles do not change), and drops
/// the GPUs no longer in MIG mode. A GPU NVML cannot answer for is left out (no placements,
/// logged) and asked again at the next discovery.
pub fn read_layouts(root: &std::path::Path, inventory: &Inventory, cache: &mut Layouts) {
    let in_mig: BTreeSet<&str> = inventory
        .vendors
        .iter()
        .flat_map(|v| &v.devices)
        .filter(|d| d.mig.as_ref().is_some_and(|m| m.enabled))
        .filter_map(|d| d.uuid.as_deref())
        .collect();
    cache.retain(|uuid, _| in_mig.contains(uuid.as_str()));
    let missing: Vec<&str> = in_mig.iter().copied().filter(|u| !cache.contains_key(*u)).collect();
    if missing.is_empty() {
        return;
    }
    let host = actk_core::discover::HostRoot::new(root);
    let nvml = match actk_core::discover::nvml::open(&host) {
        Ok(n) => n,
        Err(e) => {
            tracing::warn!("dynamic MIG: {e}; no placements offered until NVML answers");
            return;
        }
    };
    for uuid in missing {
        match actk_core::discover::nvml::dynamic::gi_profiles(&nvml, uuid) {
            Ok(p) => {
                tracing::info!(
                    "dynamic MIG: GPU {uuid} offers {}",
                    p.iter().map(|p| format!("{} x{}", p.name, p.placements.len())).collect::<Vec<_>>().join(", ")
                );
                cache.insert(uuid.to_string(), p);
            }
            Err(e) => tracing::warn!("dynamic MIG: GPU {uuid}: {e}; no placements offered for it"),
        }
    }
}

/// The GPU instances the driver made for prepared claims or is making, as (GPU UUID, first
/// memory slice), from its checkpoint at `path` for node `node` (missing: none; unreadable:
/// none, logged).
pub fn owned(path: &std::path::Path, node: &str) -> BTreeSet<(String, u32)> {
    match crate::checkpoint::Checkpoint::load(path, node) {
        Ok(cp) => cp
            .claims
            .values()
            .flat_map(|e| &e.made)
            .map(|m| (m.gpu_uuid.clone(), m.start))
            .chain(cp.making.values().flatten().map(|p| (p.gpu_uuid.clone(), p.start)))
            .collect(),
        Err(e) => {
            tracing::warn!("dynamic MIG: {e}; the MIG devices it made are published as static ones");
            BTreeSet::new()
        }
    }
}

fn one() -> Counter {
    Counter { value: Quantity("1".into()) }
}

/// The counter of a profile's instance limit.
fn instance_counter(id: u32) -> String {
    format!("gi-profile-{id}")
}

/// Whether a placement `[start, start+size)` overlaps any of `busy`.
fn overlaps(start: u32, size: u32, busy: &BTreeSet<u32>) -> bool {
    (start..start.saturating_add(size)).any(|s| busy.contains(&s))
}

/// What dynamic MIG publishes for `inventory` (see the module docs): GPUs in MIG mode, with a
/// usable node, whose UUID `layouts` holds; `owned` are the GPU instances the driver made (or
/// is making) for claims, as (GPU UUID, first memory slice).
pub fn plan(inventory: &Inventory, layouts: &Layouts, owned: &BTreeSet<(String, u32)>) -> Plan {
    let mut out = Plan::default();
    for v in &inventory.vendors {
        for d in &v.devices {
            let Some(uuid) = d.uuid.as_deref() else { continue };
            let (Some(mig), Some(profiles)) = (d.mig.as_ref().filter(|m| m.enabled), layouts.get(uuid)) else {
                continue;
            };
            if d.nodes.is_empty() || profiles.is_empty() {
                continue;
            }
            let mut busy: BTreeSet<u32> = BTreeSet::new();
            let mut static_count: BTreeMap<u32, u32> = BTreeMap::new();
            for m in &mig.devices {
                if owned.contains(&(uuid.to_string(), m.placement.start)) {
                    out.hidden.insert(m.uuid.clone());
                } else {
                    busy.extend(m.placement.start..m.placement.start.saturating_add(m.placement.size));
                    *static_count.entry(m.gi_profile_id).or_default() += 1;
                }
            }
            let slices = profiles.iter().flat_map(|p| &p.placements).map(|p| p.start + p.size).max().unwrap_or(0);
            let set = counter_set_name(&v.profile, d.index);
            let mut counters: BTreeMap<String, Counter> =
                (0..slices).map(|k| (format!("memory-slice-{k}"), one())).collect();
            for p in profiles {
                let left = p.instances.saturating_sub(static_count.get(&p.id).copied().unwrap_or(0));
                if (p.instances as usize) < p.placements.len() && left > 0 {
                    counters.insert(instance_counter(p.id), Counter { value: Quantity(left.to_string()) });
                }
                if left == 0 {
                    continue;
                }
                for pl in &p.placements {
                    if overlaps(pl.start, pl.size, &busy) {
                        continue;
                    }
                    let name = placement_name(&v.profile, d.index, &p.name, pl.start);
                    let mut consumed: BTreeMap<String, Counter> =
                        (pl.start..pl.start + pl.size).map(|k| (format!("memory-slice-{k}"), one())).collect();
                    if counters.contains_key(&instance_counter(p.id)) {
                        consumed.insert(instance_counter(p.id), one());
                    }
                    out.devices.push(SliceDevice {
                        name: name.clone(),
                        attributes: Some({
                            let mut a = crate::slice::mig_attributes(v, d, &p.name, pl.start, pl.size);
                            a.insert("dynamicMig".into(), DeviceAttribute { bool: Some(true), ..Default::default() });
                            a
                        }),
                        capacity: Some(crate::slice::mig_capacity(p.memory_mib, p.multiprocessors, &p.engines)),
                        consumes_counters: Some(vec![DeviceCounterConsumption {
                            counter_set: set.clone(),
                            counters: consumed,
                            ..Default::default()
                        }]),
                        ..Default::default()
                    });
                    out.parent.insert(name.clone(), device_name(&v.profile, d.index));
                    out.placements.insert(
                        name,
                        Placement {
                            gpu_index: d.index,
                            gpu_uuid: uuid.to_string(),
                            profile_index: p.index,
                            mig_profile: p.name.clone(),
                            start: pl.start,
                            size: pl.size,
                        },
                    );
                }
            }
            out.counter_sets.push(CounterSet { name: set, counters });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use actk_core::inventory::{Device, DeviceNode, Mig, MigDevice, MigPlacement, VendorInventory};

    /// A100-80GB's GPU instance profiles and placements (`nvidia-smi mig -lgip` / `-lgipp`).
    fn a100() -> Vec<GiProfile> {
        let p = |index, id, name: &str, slices, instances, memory_mib, sm, starts: &[u32], size| GiProfile {
            index,
            id,
            name: name.into(),
            slices,
            instances,
            memory_mib,
            multiprocessors: sm,
            engines: BTreeMap::new(),
            placements: starts.iter().map(|&start| MigPlacement { start, size }).collect(),
        };
        vec![
            p(0, 19, "1g.10gb", 1, 7, 9856, 14, &[0, 1, 2, 3, 4, 5, 6], 1),
            p(1, 14, "2g.20gb", 2, 3, 19968, 28, &[0, 2, 4], 2),
            p(2, 9, "3g.40gb", 3, 2, 40192, 42, &[0, 4], 4),
            p(3, 5, "4g.40gb", 4, 1, 40192, 56, &[0], 4),
            p(4, 0, "7g.80gb", 7, 1, 80384, 98, &[0], 8),
            p(7, 20, "1g.10gb+me", 1, 1, 9856, 14, &[0, 1, 2, 3, 4, 5, 6], 1),
            p(9, 15, "1g.20gb", 1, 4, 19968, 14, &[0, 2, 4, 6], 2),
        ]
    }

    fn gpu(index: u32, migs: Vec<MigDevice>) -> Device {
        Device {
            index,
            uuid: Some(format!("GPU-{index}")),
            nodes: vec![DeviceNode {
                path: format!("/dev/nvidia{index}"),
                host_path: format!("/dev/nvidia{index}").into(),
                node_type: 'c',
                major: 195,
                minor: index,
                file_mode: Some(0o666),
                gid: None,
            }],
            mig: Some(Mig { enabled: true, devices: migs }),
            ..Default::default()
        }
    }

    fn mig(gi: u32, profile_id: u32, start: u32, size: u32) -> MigDevice {
        MigDevice {
            uuid: format!("MIG-{gi}"),
            gpu_instance: gi,
            gi_profile_id: profile_id,
            placement: MigPlacement { start, size },
            ..Default::default()
        }
    }

    fn inv(devices: Vec<Device>) -> Inventory {
        Inventory {
            vendors: vec![VendorInventory {
                profile: "nvidia".into(),
                kind: "nvidia.com/gpu".into(),
                devices,
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    fn consumed(d: &SliceDevice) -> BTreeSet<String> {
        d.consumes_counters.as_ref().unwrap()[0].counters.keys().cloned().collect()
    }

    #[test]
    fn names_are_dns_labels() {
        assert_eq!(placement_name("nvidia", 0, "3g.40gb", 4), "nvidia-0-mig-3g-40gb-4");
        assert_eq!(placement_name("nvidia", 7, "1g.10gb+me", 6), "nvidia-7-mig-1g-10gb-me-6");
        assert_eq!(counter_set_name("nvidia", 3), "nvidia-3-slices");
    }

    #[test]
    fn an_empty_gpu_offers_every_placement_and_counts_its_memory_slices() {
        let layouts = Layouts::from([("GPU-0".to_string(), a100())]);
        let plan = plan(&inv(vec![gpu(0, vec![])]), &layouts, &BTreeSet::new());
        // 7 + 3 + 2 + 1 + 1 + 7 + 4 placements.
        assert_eq!(plan.devices.len(), 25);
        assert_eq!(plan.counter_sets.len(), 1);
        let set = &plan.counter_sets[0];
        assert_eq!(set.name, "nvidia-0-slices");
        let names: Vec<&str> = set.counters.keys().map(String::as_str).collect();
        // 8 memory slices, and the +me profile's one instance (the others' limits are their
        // placements' own).
        assert_eq!(names.len(), 9, "{names:?}");
        assert_eq!(set.counters["gi-profile-20"].value.0, "1");
        let three = plan.devices.iter().find(|d| d.name == "nvidia-0-mig-3g-40gb-4").unwrap();
        assert_eq!(
            consumed(three),
            (4..8).map(|k| format!("memory-slice-{k}")).collect::<BTreeSet<_>>(),
            "3g.40gb at 4 takes memory slices 4-7"
        );
        let attrs = three.attributes.as_ref().unwrap();
        assert_eq!(attrs["migProfile"].string.as_deref(), Some("3g.40gb"));
        assert_eq!(attrs["parentUUID"].string.as_deref(), Some("GPU-0"));
        assert_eq!(attrs["dynamicMig"].bool, Some(true));
        assert_eq!(three.capacity.as_ref().unwrap()["memory"].value.0, "40192Mi");
        let me = plan.devices.iter().find(|d| d.name == "nvidia-0-mig-1g-10gb-me-3").unwrap();
        assert!(consumed(me).contains("gi-profile-20") && consumed(me).contains("memory-slice-3"));
        assert_eq!(
            plan.placements["nvidia-0-mig-7g-80gb-0"],
            Placement {
                gpu_index: 0,
                gpu_uuid: "GPU-0".into(),
                profile_index: 4,
                mig_profile: "7g.80gb".into(),
                start: 0,
                size: 8
            }
        );
        assert_eq!(plan.parent["nvidia-0-mig-7g-80gb-0"], "nvidia-0");
    }

    #[test]
    fn a_static_instance_takes_its_slices_and_one_the_driver_made_does_not() {
        let layouts = Layouts::from([("GPU-0".to_string(), a100())]);
        // The admin's 3g.40gb at 4 (GI 2) and the driver's 1g.10gb+me at 0 (GI 7).
        let gpu0 = gpu(0, vec![mig(2, 9, 4, 4), mig(7, 20, 0, 1)]);
        let plan = plan(&inv(vec![gpu0]), &layouts, &BTreeSet::from([("GPU-0".to_string(), 0)]));
        assert_eq!(plan.hidden, BTreeSet::from(["MIG-7".to_string()]));
        for d in &plan.devices {
            assert!(
                consumed(d).iter().all(|c| !matches!(
                    c.as_str(),
                    "memory-slice-4" | "memory-slice-5" | "memory-slice-6" | "memory-slice-7"
                )),
                "{} overlaps the admin's 3g.40gb",
                d.name
            );
        }
        // The driver's own +me placement is still offered (its claim holds it).
        assert!(plan.placements.contains_key("nvidia-0-mig-1g-10gb-me-0"));
        assert!(!plan.placements.contains_key("nvidia-0-mig-7g-80gb-0"));
        assert!(plan.placements.contains_key("nvidia-0-mig-4g-40gb-0"));
    }

    #[test]
    fn a_static_instance_uses_up_its_profiles_limit() {
        let layouts = Layouts::from([("GPU-0".to_string(), a100())]);
        let plan = plan(&inv(vec![gpu(0, vec![mig(13, 20, 6, 1)])]), &layouts, &BTreeSet::new());
        assert!(!plan.placements.keys().any(|n| n.contains("1g-10gb-me")), "{:?}", plan.placements.keys());
        assert!(!plan.counter_sets[0].counters.contains_key("gi-profile-20"));
    }

    #[test]
    fn gpus_without_mig_mode_a_layout_or_a_node_offer_nothing() {
        let layouts = Layouts::from([("GPU-0".to_string(), a100()), ("GPU-1".to_string(), a100())]);
        let mut off = gpu(0, vec![]);
        off.mig = Some(Mig { enabled: false, devices: vec![] });
        let mut nodeless = gpu(1, vec![]);
        nodeless.nodes.clear();
        let unknown = gpu(2, vec![]);
        let plan = plan(&inv(vec![off, nodeless, unknown]), &layouts, &BTreeSet::new());
        assert_eq!(plan, Plan::default());
    }
}
