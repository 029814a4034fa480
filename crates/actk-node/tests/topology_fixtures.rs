//! Preferred allocation on the topology of the repository's fixture hosts (fixtures/, real
//! sysfs layouts; prepared with device nodes, so these need root and are skipped otherwise).
//! The links and NUMA nodes come from discovery; the assertions check the chosen sets against
//! the fixture's own `connected_devices` files, not against remembered answers only.

use actk_core::discover::discover;
use actk_core::inventory::VendorInventory;
use actk_core::profile;
use actk_node::topology::{Choice, Node, Shape, preferred, shape};
use actk_testsupport::fixture::{self, Fixture};
use std::collections::BTreeSet;

fn vendor(name: &str, kind: &str) -> Option<(Fixture, VendorInventory)> {
    let f = fixture::prepare(name).expect("fixture prepares")?;
    let inv = discover(&f.root, &profile::builtin());
    let v = inv.vendor_by_kind(kind).unwrap_or_else(|| panic!("{name}: no {kind} found")).clone();
    Some((f, v))
}

fn nodes(v: &VendorInventory) -> Vec<Node> {
    v.devices.iter().map(|d| Node { index: d.index, numa: d.numa_node, links: d.links.clone() }).collect()
}

/// Peers of neuron device `i` as the fixture's sysfs prints them.
fn sysfs_links(f: &Fixture, i: u32) -> BTreeSet<u32> {
    std::fs::read_to_string(f.path(&format!("sys/class/neuron_device/neuron{i}/connected_devices")))
        .unwrap()
        .trim()
        .split(", ")
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().unwrap())
        .collect()
}

/// Whether `set` is connected through the fixture's links.
fn connected(f: &Fixture, set: &[u32]) -> bool {
    let mut seen = BTreeSet::from([set[0]]);
    let mut todo = vec![set[0]];
    while let Some(d) = todo.pop() {
        for p in sysfs_links(f, d) {
            if set.contains(&p) && seen.insert(p) {
                todo.push(p);
            }
        }
    }
    seen.len() == set.len()
}

#[test]
fn f10_inferentia_ring_two_of_ten_free_is_a_contiguous_pair() {
    let Some((f, v)) = vendor("aws-inf2-48xlarge", "aws.amazon.com/neuron") else { return };
    let n = nodes(&v);
    assert_eq!(shape(&n), Shape::Ring((0..12).collect()), "inf2.48xlarge's 12 devices form one ring");
    let available: Vec<u32> = (0..12).filter(|d| *d != 1 && *d != 2).collect();
    let Choice { devices, note } = preferred(&n, &available, &[], 2).unwrap();
    assert_eq!(devices, [3, 4], "devices 1 and 2 are taken: the pair next to them keeps the longest free run");
    assert!(sysfs_links(&f, 3).contains(&4), "3 and 4 are neighbours in sysfs");
    assert_eq!(note, None);
    // Never the non-adjacent 0 and 3 that index order would give.
    assert_ne!(devices, [0, 3]);
    // Four among the same free devices: a contiguous arc as well.
    let four = preferred(&n, &available, &[], 4).unwrap().devices;
    assert!(connected(&f, &four) && four.windows(2).all(|w| w[1] == w[0] + 1), "{four:?}");
    // A must-include device pulls the arc to it.
    let with9 = preferred(&n, &available, &[9], 2).unwrap().devices;
    assert!(with9.contains(&9) && connected(&f, &with9), "{with9:?}");
}

#[test]
fn f10_inferentia_ring_without_a_free_pair_says_so() {
    let Some((_f, v)) = vendor("aws-inf2-48xlarge", "aws.amazon.com/neuron") else { return };
    let n = nodes(&v);
    let choice = preferred(&n, &[0, 2, 4, 6], &[], 2).unwrap();
    assert_eq!(choice.devices.len(), 2);
    let note = choice.note.expect("a non-contiguous pair comes with a note");
    assert!(note.contains("no 2 contiguous free devices"), "{note}");
}

#[test]
fn f09_trainium_torus_seven_is_explained_and_four_is_a_connected_block() {
    let Some((f, v)) = vendor("aws-trn1-32xlarge", "aws.amazon.com/neuron") else { return };
    let n = nodes(&v);
    assert_eq!(shape(&n), Shape::Torus { side: 4 });
    let all: Vec<u32> = (0..16).collect();

    let seven = preferred(&n, &all, &[], 7).unwrap();
    assert_eq!(seven.devices.len(), 7);
    let note = seven.note.expect("7 devices on a trn1 torus must come with the reason");
    assert!(note.contains("7 devices cannot be placed well"), "{note}");
    assert!(note.contains("1, 4, 8, 16"), "the note names the valid block sizes: {note}");
    assert!(note.contains("ask for 8 or 4"), "{note}");
    assert!(connected(&f, &seven.devices), "even the poor placement stays connected: {:?}", seven.devices);

    let four = preferred(&n, &all, &[], 4).unwrap();
    assert_eq!(four.note, None);
    assert_eq!(four.devices.len(), 4);
    assert!(connected(&f, &four.devices), "{:?}", four.devices);
    // A block is a ring: every member has exactly two peers inside it.
    for d in &four.devices {
        let inside = sysfs_links(&f, *d).iter().filter(|p| four.devices.contains(p)).count();
        assert_eq!(inside, 2, "device {d} in {:?}", four.devices);
    }

    // With devices 0 and 5 taken, a block of 4 avoids their rows and keeps 8-blocks whole where it can.
    let avail: Vec<u32> = all.iter().copied().filter(|d| *d != 0 && *d != 5).collect();
    let four = preferred(&n, &avail, &[], 4).unwrap();
    assert!(four.note.is_none() && connected(&f, &four.devices), "{four:?}");
    assert!(four.devices.iter().all(|d| *d >= 8), "rows 0 and 1 are broken, so the block comes from 8-15: {four:?}");

    let eight = preferred(&n, &all, &[], 8).unwrap();
    assert_eq!(eight.note, None);
    assert!(connected(&f, &eight.devices));
}

#[test]
fn trainium_blocks_prefer_one_numa_node_over_low_indexes() {
    let Some((_f, v)) = vendor("aws-trn1-32xlarge", "aws.amazon.com/neuron") else { return };
    // The neuron class devices have no PCI link, so discovery leaves NUMA unknown; give the
    // torus a layout where the lowest 8-block (0-7) spans two nodes and 8-15 lies on one.
    let mut n = nodes(&v);
    for d in &mut n {
        d.numa = Some(u32::from(d.index >= 4));
    }
    let all: Vec<u32> = (0..16).collect();
    let eight = preferred(&n, &all, &[], 8).unwrap();
    assert_eq!(eight.devices, (8..16).collect::<Vec<_>>(), "NUMA-local block first");
    assert_eq!(eight.note, None);
}

#[test]
fn dgx_h100_pair_is_numa_local() {
    let Some((_f, v)) = vendor("nvidia-dgx-h100", "nvidia.com/gpu") else { return };
    let n = nodes(&v);
    let numa_of = |d: u32| n[d as usize].numa;
    // With 0-2 taken, index order would pair 3 (socket 0) with 4 (socket 1); NUMA first must not.
    assert_ne!(numa_of(3), numa_of(4), "the fixture puts GPUs 0-3 and 4-7 on different sockets");
    let available: Vec<u32> = (3..8).collect();
    let pair = preferred(&n, &available, &[], 2).unwrap().devices;
    assert_eq!(numa_of(pair[0]), numa_of(pair[1]), "{pair:?}");
    assert_eq!(pair, [4, 5]);
    let four = preferred(&n, &(0..8).collect::<Vec<_>>(), &[], 4).unwrap().devices;
    let numas: BTreeSet<_> = four.iter().map(|d| numa_of(*d)).collect();
    assert_eq!(numas.len(), 1, "four GPUs of one socket: {four:?}");
}

#[test]
fn amd_mi300x_xgmi_set_is_numa_local() {
    let Some((_f, v)) = vendor("amd-mi300x", "amd.com/gpu") else { return };
    let n = nodes(&v);
    assert!(n.iter().all(|d| d.links.len() == 7), "every MI300X has XGMI to the 7 others");
    let avail: Vec<u32> = n.iter().map(|d| d.index).filter(|d| *d != 0).collect();
    let two = preferred(&n, &avail, &[], 2).unwrap().devices;
    let numas: BTreeSet<_> = two.iter().map(|d| n.iter().find(|x| x.index == *d).unwrap().numa).collect();
    assert_eq!(numas.len(), 1, "{two:?}");
}

/// NeuronCore groups on trn1.32xlarge (2 cores per device, 4x4 torus): consecutive cores stay
/// within a device and, across devices, on devices the torus links. Devices 0-2 taken: 4 cores
/// are not 6-9 (devices 3 and 4, which are not neighbours: 3's peers are 15, 2, 7, 0) but 8-11
/// (devices 4 and 5, neighbours in sysfs).
#[test]
fn neuroncores_stay_on_linked_devices_of_the_trn1_torus() {
    use actk_node::topology::preferred_cores;
    use std::collections::BTreeMap;
    let Some((f, v)) = vendor("aws-trn1-32xlarge", "aws.amazon.com/neuron") else { return };
    let cores: BTreeMap<u32, u32> = (0..32).map(|c| (c, c / 2)).collect();
    let links: BTreeMap<u32, Vec<u32>> = v.devices.iter().map(|d| (d.index, d.links.clone())).collect();
    assert!(!sysfs_links(&f, 3).contains(&4) && sysfs_links(&f, 4).contains(&5));
    let avail: Vec<u32> = (6..32).collect();
    let c = preferred_cores(&cores, &links, &avail, &[], 4).unwrap();
    assert_eq!((c.devices.as_slice(), c.note.as_deref()), (&[8, 9, 10, 11][..], None));
    // Within one device when it fits: a pair is a whole device.
    let c = preferred_cores(&cores, &links, &[7, 8, 9, 10], &[], 2).unwrap();
    assert_eq!(c.devices, [8, 9]);
}
