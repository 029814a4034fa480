//! ResourceSlices built from every fixture host root (real node layouts, fixtures/*/SOURCES.md):
//! device names, the attributes users select on, capacities, the PCIe root, and link groups
//! that really are connected in the inventory's link graph (so a `matchAttribute` on
//! `linkGroupK` gives linked devices).

use actk_dra::slice::{self, DRIVER, NUMA_NODE, NodeRef, PCI_BUS_ID, PCIE_ROOT};
use actk_testsupport::fixture;
use k8s_openapi::api::resource::v1::Device;
use std::collections::{BTreeMap, BTreeSet};

fn devices_of(name: &str) -> Option<(actk_core::inventory::Inventory, Vec<Device>)> {
    let f = fixture::prepare(name).expect("fixture prepares")?;
    let inv = actk_core::discover::discover(&f.root, &actk_core::profile::builtin());
    let devs = slice::devices(&inv, None, &BTreeSet::new());
    // the fixture directory goes away with `f`; the values stay
    Some((inv, devs))
}

fn s<'a>(d: &'a Device, k: &str) -> Option<&'a str> {
    d.attributes.as_ref()?.get(k)?.string.as_deref()
}

fn i(d: &Device, k: &str) -> Option<i64> {
    d.attributes.as_ref()?.get(k)?.int
}

fn ver<'a>(d: &'a Device, k: &str) -> Option<&'a str> {
    d.attributes.as_ref()?.get(k)?.version.as_deref()
}

fn names(devs: &[Device]) -> Vec<&str> {
    devs.iter().map(|d| d.name.as_str()).collect()
}

/// Groups of device indexes by the value of integer attribute `k`.
fn groups(devs: &[Device], k: &str) -> BTreeMap<i64, Vec<u32>> {
    let mut g: BTreeMap<i64, Vec<u32>> = BTreeMap::new();
    for d in devs {
        if let Some(v) = i(d, k) {
            g.entry(v).or_default().push(i(d, "index").unwrap() as u32);
        }
    }
    g
}

/// Whether `members` form a connected subgraph of the links of `vendor`.
fn connected(vendor: &actk_core::inventory::VendorInventory, members: &[u32]) -> bool {
    let set: BTreeSet<u32> = members.iter().copied().collect();
    let mut seen = BTreeSet::from([members[0]]);
    let mut todo = vec![members[0]];
    while let Some(x) = todo.pop() {
        let d = vendor.devices.iter().find(|d| d.index == x).unwrap();
        for l in &d.links {
            if set.contains(l) && seen.insert(*l) {
                todo.push(*l);
            }
        }
    }
    seen == set
}

#[test]
fn dgx_h100_gpus_with_identity_numa_and_pcie_root() {
    let Some((_, devs)) = devices_of("nvidia-dgx-h100") else { return };
    assert_eq!(names(&devs), (0..8).map(|i| format!("nvidia-{i}")).collect::<Vec<_>>());
    for d in &devs {
        assert_eq!(s(d, "kind"), Some("nvidia.com/gpu"));
        assert_eq!(s(d, "vendor"), Some("nvidia.com"));
        assert_eq!(s(d, "profile"), Some("nvidia"));
        assert_eq!(s(d, "model"), Some("NVIDIA H100 80GB HBM3"));
        // nvidia-smi's 580.95.05 as semver 2.0 (no leading zero), a `version` attribute.
        assert_eq!(ver(d, "driverVersion"), Some("580.95.5"));
        assert_eq!(s(d, "driverVersion"), None, "a version, not a string");
        assert_eq!(s(d, PCI_BUS_ID), s(d, "pciBusID"), "the standard pciBusID");
        assert_eq!(i(d, NUMA_NODE), i(d, "numaNode"), "the standard numaNode");
        assert_eq!(s(d, "migMode"), Some("disabled"), "MIG-capable, MIG off (the fixture's NVML)");
        assert!(s(d, "uuid").unwrap().starts_with("GPU-"), "{:?}", s(d, "uuid"));
        assert!(i(d, "numaNode").is_some());
        let root = s(d, PCIE_ROOT).expect("pcieRoot");
        assert!(root.starts_with("pci0000:"), "{root}");
    }
    assert_eq!(s(&devs[0], "pciBusID"), Some("0000:1b:00.0"));
    assert_eq!(s(&devs[0], PCIE_ROOT), Some("pci0000:00"));
    // GPUs on the two sockets have different roots; all attribute names are API-valid.
    let roots: BTreeSet<&str> = devs.iter().filter_map(|d| s(d, PCIE_ROOT)).collect();
    assert!(roots.len() > 1, "{roots:?}");
    for d in &devs {
        for k in d.attributes.as_ref().unwrap().keys() {
            let id = k.rsplit('/').next().unwrap();
            assert!(id.len() <= 32 && id.chars().next().unwrap().is_ascii_alphabetic(), "{k}");
            assert!(id.chars().all(|c| c.is_ascii_alphanumeric()), "{k}");
        }
    }
}

/// Issue 28, item 2: the DGX A100 fixture runs GPUs 0-3 in MIG mode and 4-7 without (its
/// SOURCES.md); the slice says which, so the default class can leave the MIG-mode ones out.
#[test]
fn dgx_a100_gpus_in_mig_mode_say_so() {
    let Some((_, all)) = devices_of("nvidia-dgx-a100") else { return };
    let devs: Vec<&Device> = all.iter().filter(|d| s(d, "migProfile").is_none()).collect();
    assert_eq!(devs.len(), 8);
    let modes: Vec<(&str, Option<&str>)> = devs.iter().map(|d| (d.name.as_str(), s(d, "migMode"))).collect();
    let want: Vec<(String, Option<&str>)> =
        (0..8).map(|i| (format!("nvidia-{i}"), Some(if i < 4 { "enabled" } else { "disabled" }))).collect();
    assert_eq!(modes, want.iter().map(|(n, m)| (n.as_str(), *m)).collect::<Vec<_>>());
}

/// Issue 27, partitionable devices: each MIG device of a GPU in MIG mode is a slice device of its
/// own, after its GPU, with the profile, parent and instances as attributes and what NVML
/// reports of the GPU instance as capacities (fixtures/nvidia-dgx-a100/nvml.tsv follows
/// `nvidia-smi mig -lgip` and `-lgi` of an A100-SXM4-80GB: 3g.40gb is GI profile 9, 4 memory
/// slices from 4, 42 SMs, 3 copy engines, 2 decoders).
#[test]
fn dgx_a100_mig_devices_are_devices_with_their_capacities() {
    let Some((_, all)) = devices_of("nvidia-dgx-a100") else { return };
    let migs: Vec<&Device> = all.iter().filter(|d| s(d, "migProfile").is_some()).collect();
    let names: Vec<&str> = migs.iter().take(4).map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["nvidia-0-mig-2-0", "nvidia-0-mig-3-0", "nvidia-0-mig-9-0", "nvidia-0-mig-10-0"]);
    let pos = |n: &str| all.iter().position(|d| d.name == n).unwrap();
    assert_eq!(pos("nvidia-0-mig-2-0"), pos("nvidia-0") + 1, "after its GPU");
    let m = migs[0];
    assert_eq!(s(m, "migProfile"), Some("3g.40gb"));
    assert_eq!(s(m, "uuid"), Some("MIG-04e85a7c-8a74-584e-9f3f-bd495ea55d15"));
    assert_eq!(s(m, "parentUUID"), Some("GPU-ba6c9fc3-5c92-bdf4-90af-b063445c61e5"));
    assert_eq!(s(m, "kind"), Some("nvidia.com/gpu"));
    assert_eq!(s(m, "model"), Some("NVIDIA A100-SXM4-80GB"));
    for (k, v) in [("parentIndex", 0), ("migIndex", 0), ("gpuInstance", 2), ("computeInstance", 0)] {
        assert_eq!(i(m, k), Some(v), "{k}");
    }
    assert_eq!((i(m, "placementStart"), i(m, "placementSize")), (Some(4), Some(4)));
    let cap: Vec<(String, String)> =
        m.capacity.as_ref().unwrap().iter().map(|(k, v)| (k.clone(), v.value.0.clone())).collect();
    let want = [("copyEngines", "3"), ("decoders", "2"), ("memory", "40192Mi"), ("multiprocessors", "42")];
    assert_eq!(cap, want.map(|(k, v)| (k.to_string(), v.to_string())));
    // GPUs 4-7 are not in MIG mode: no MIG devices.
    assert!(migs.iter().all(|d| i(d, "parentIndex").is_some_and(|p| p < 4)));
    // The class conditions: a MIG device is never a whole GPU, and only it is a MIG device.
    assert!(slice::NOT_MIG_ENABLED.contains(r#"!("migProfile" in device.attributes["actk.dev"])"#));
    assert!(m.allow_multiple_allocations.is_none());
}

#[test]
fn inf2_ring_pairs_and_quads_are_linked_and_cores_are_capacity() {
    let Some((inv, devs)) = devices_of("aws-inf2-48xlarge") else { return };
    let v = inv.vendor("neuron").unwrap();
    assert_eq!(devs.len(), 12);
    for d in &devs {
        assert_eq!(s(d, "kind"), Some("aws.amazon.com/neuron"));
        assert_eq!(s(d, "model"), Some("Inferentia2"));
        assert_eq!(d.capacity.as_ref().unwrap()["cores"].value.0, "2");
        assert!(i(d, "ringPosition").is_some());
    }
    let pairs = groups(&devs, "linkGroup2");
    assert_eq!(pairs.len(), 6);
    for (g, m) in &pairs {
        assert_eq!(m.len(), 2, "group {g}");
        assert!(connected(v, m), "pair {m:?} is not linked");
    }
    let quads = groups(&devs, "linkGroup4");
    assert_eq!(quads.len(), 3);
    assert!(quads.values().all(|m| m.len() == 4 && connected(v, m)), "{quads:?}");
    assert!(groups(&devs, "linkGroup8").is_empty(), "8 does not divide a ring of 12");
    assert!(groups(&devs, "linkGroup16").is_empty(), "a ring of 12 has no 16");
    for d in &devs {
        assert_eq!(s(d, "instanceType"), Some("inf2.48xlarge"), "{}", d.name);
        assert_eq!(ver(d, "driverVersion"), Some("2.24.7+0"), "{}: aws-neuronx-dkms 2.24.7.0", d.name);
    }
}

#[test]
fn trn1_torus_rows_are_connected_blocks_of_four() {
    let Some((inv, devs)) = devices_of("aws-trn1-32xlarge") else { return };
    let v = inv.vendor("neuron").unwrap();
    assert_eq!(devs.len(), 16);
    let rows = groups(&devs, "linkGroup4");
    assert_eq!(rows.len(), 4);
    for m in rows.values() {
        assert_eq!(m.len(), 4);
        assert!(connected(v, m), "{m:?}");
        // a NeuronLink ring: every member has two links inside the block
        for x in m {
            let d = v.devices.iter().find(|d| d.index == *x).unwrap();
            assert_eq!(d.links.iter().filter(|l| m.contains(l)).count(), 2, "device {x} in {m:?}");
        }
    }
    let eights = groups(&devs, "linkGroup8");
    assert_eq!(eights.len(), 2);
    assert!(eights.values().all(|m| m.len() == 8 && connected(v, m)));
    assert!(groups(&devs, "linkGroup2").values().all(|m| m.len() == 2 && connected(v, m)));
    assert_eq!((i(&devs[6], "torusRow"), i(&devs[6], "torusColumn")), (Some(1), Some(2)));
    // The whole 4x4 torus is the one group of 16 (AWS's devicegroup16), and the instance type
    // comes from the node's DMI.
    let sixteen = groups(&devs, "linkGroup16");
    assert_eq!(sixteen.len(), 1, "{sixteen:?}");
    assert!(sixteen.values().all(|m| m.len() == 16 && connected(v, m)));
    assert!(devs.iter().all(|d| s(d, "instanceType") == Some("trn1.32xlarge")));
}

#[test]
fn mi300x_one_xgmi_hive() {
    let Some((_, devs)) = devices_of("amd-mi300x") else { return };
    assert_eq!(devs.len(), 8);
    let hives: BTreeSet<&str> = devs.iter().map(|d| s(d, "hiveID").expect("hiveID")).collect();
    assert_eq!(hives.len(), 1, "{hives:?}");
    for d in &devs {
        assert_eq!(s(d, "kind"), Some("amd.com/gpu"));
        assert_eq!(s(d, "model"), Some("AMD Instinct MI300X OAM"));
        assert!(s(d, PCIE_ROOT).is_some(), "{}", d.name);
    }
}

/// AMD MI300X in CPX/NPS4: every partition says its modes and their profile.
#[test]
fn mi300x_cpx_partitions_carry_their_profile() {
    let Some((_, devs)) = devices_of("amd-mi300x-cpx") else { return };
    assert!(!devs.is_empty());
    for d in &devs {
        assert_eq!(s(d, "computePartition"), Some("cpx"), "{}", d.name);
        assert_eq!(s(d, "memoryPartition"), Some("nps4"), "{}", d.name);
        assert_eq!(s(d, "partitionProfile"), Some("cpx_nps4"), "{}", d.name);
    }
    // The unpartitioned node has none of them.
    let Some((_, whole)) = devices_of("amd-mi300x") else { return };
    assert!(whole.iter().all(|d| s(d, "partitionProfile").is_none() || s(d, "partitionProfile") == Some("spx_nps1")));
}

/// Every device of every fixture stays within the API's limits (resource.k8s.io/v1 validation:
/// at most 32 attributes and capacities, identifiers of at most 32 characters, values of at most
/// 64), standard attributes in their documented forms, and versions are semver 2.0.
#[test]
fn every_fixture_device_fits_the_api() {
    let root = actk_testsupport::engines::workspace_root().join("fixtures");
    let mut seen = 0;
    for e in std::fs::read_dir(&root).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !e.path().join("root").is_dir() {
            continue;
        }
        let Some((_, devs)) = devices_of(&name) else { return };
        for d in &devs {
            seen += 1;
            let attrs = d.attributes.clone().unwrap_or_default();
            let caps = d.capacity.clone().unwrap_or_default();
            assert!(
                attrs.len() + caps.len() <= 32,
                "{name}/{}: {} attributes and capacities",
                d.name,
                attrs.len() + caps.len()
            );
            for (k, a) in &attrs {
                let set = [a.bool.is_some(), a.int.is_some(), a.string.is_some(), a.version.is_some()];
                assert_eq!(set.iter().filter(|x| **x).count(), 1, "{name}/{}: {k} has one value", d.name);
                for v in [&a.string, &a.version].into_iter().flatten() {
                    assert!(v.len() <= 64, "{name}/{}: {k} = {v:?} is longer than 64", d.name);
                }
                if let Some(v) = &a.version {
                    let (core, _) = v.split_once('+').unwrap_or((v, ""));
                    let nums: Vec<&str> = core.split('.').collect();
                    assert!(
                        nums.len() == 3 && nums.iter().all(|n| n.parse::<u64>().is_ok_and(|x| x.to_string() == *n)),
                        "{name}/{}: {k} = {v:?} is not semver",
                        d.name
                    );
                }
            }
            if let Some(b) = s(d, PCI_BUS_ID) {
                assert!(slice::is_pci_bdf(b), "{name}/{}: {b}", d.name);
            }
            if let Some(r) = s(d, PCIE_ROOT) {
                assert!(r.starts_with("pci") && r.len() == 10, "{name}/{}: {r}", d.name);
            }
        }
    }
    assert!(seen > 50, "the fixtures were read ({seen} devices)");
}

#[test]
fn gaudi2_accelerators() {
    let Some((_, devs)) = devices_of("gaudi2") else { return };
    assert_eq!(names(&devs), (0..8).map(|i| format!("gaudi-{i}")).collect::<Vec<_>>());
    for d in &devs {
        assert_eq!(s(d, "kind"), Some("habana.ai/gaudi"));
        assert!(s(d, "pciBusID").is_some());
        assert!(s(d, "model").is_some());
    }
}

#[test]
fn hetero_node_publishes_both_kinds_in_one_pool() {
    let Some((_, devs)) = devices_of("hetero-nvidia-neuron") else { return };
    assert_eq!(names(&devs), ["nvidia-0", "nvidia-1", "neuron-0", "neuron-1"]);
    let node = NodeRef { name: "node-a".into(), uid: Some("1234".into()) };
    let slices = slice::slices(&node, 3, devs.clone().into());
    assert_eq!(slices.len(), 1);
    let sl = &slices[0];
    assert_eq!(sl.spec.driver, DRIVER);
    assert_eq!(sl.spec.node_name.as_deref(), Some("node-a"));
    assert_eq!((sl.spec.pool.name.as_str(), sl.spec.pool.generation), ("node-a", 3));
    // Only the served profiles when asked.
    let inv = {
        let f = fixture::prepare("hetero-nvidia-neuron").unwrap().unwrap();
        actk_core::discover::discover(&f.root, &actk_core::profile::builtin())
    };
    let only = BTreeSet::from(["neuron".to_string()]);
    assert_eq!(names(&slice::devices(&inv, Some(&only), &BTreeSet::new())), ["neuron-0", "neuron-1"]);
    let gone = BTreeSet::from(["nvidia-1".to_string()]);
    assert_eq!(names(&slice::devices(&inv, None, &gone)), ["nvidia-0", "neuron-0", "neuron-1"]);
    // The slice serialises as the API expects.
    let json = serde_json::to_value(sl).unwrap();
    assert_eq!(json["spec"]["devices"][0]["attributes"]["kind"]["string"], "nvidia.com/gpu");
    assert_eq!(json["spec"]["pool"]["resourceSliceCount"], 1);
}

#[test]
fn empty_node_publishes_an_empty_pool() {
    let Some((_, devs)) = devices_of("empty") else { return };
    assert!(devs.is_empty());
    let s = slice::slices(&NodeRef { name: "n".into(), uid: None }, 1, devs.into());
    assert_eq!(s.len(), 1);
    assert!(s[0].metadata.owner_references.is_none());
}
