//! Discovery through the NVML seam on the fixture roots, each carrying actk's NVML test double
//! (fixtures/nvml-double) with a state file modelled on a real node. Expected values come from
//! that state file and the fixture's procfs, read independently of the code under test, so a
//! test says "discovery reports what the node says".

use actk_core::discover::{DiscoverOptions, discover, discover_with};
use actk_core::inventory::{Inventory, VendorInventory};
use actk_core::profile;
use actk_testsupport::fixture::{self, Fixture};
use actk_testsupport::nvml_double::State;

fn scan(name: &str) -> Option<(Fixture, Inventory)> {
    let f = fixture::prepare(name).expect("fixture prepares")?;
    let inv = discover(&f.root, &profile::builtin());
    Some((f, inv))
}

fn nvidia(inv: &Inventory) -> &VendorInventory {
    inv.vendor("nvidia").expect("nvidia vendor")
}

/// `DeviceFileMinor` of a capability access file of the fixture.
fn cap_minor(f: &Fixture, rel: &str) -> u32 {
    let text = std::fs::read_to_string(f.path(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"));
    text.lines().find_map(|l| l.strip_prefix("DeviceFileMinor:")).unwrap().trim().parse().unwrap()
}

#[test]
fn mig_discovery_matches_the_double_state_on_the_dgx_a100() {
    let Some((f, inv)) = scan("nvidia-dgx-a100") else { return };
    assert!(inv.warnings.is_empty(), "{:#?}", inv.warnings);
    let state = State::of(&f.root).unwrap();
    let v = nvidia(&inv);
    assert_eq!(v.devices.len(), state.gpus().len());
    let caps_major = {
        let text = std::fs::read_to_string(f.path("proc/devices")).unwrap();
        text.lines().find_map(|l| l.trim().strip_suffix(" nvidia-caps")).unwrap().trim().parse::<u32>().unwrap()
    };
    let mut total = 0;
    for g in state.gpus() {
        let i = g.num("index");
        let dev = &v.devices[i as usize];
        assert_eq!(dev.uuid.as_deref(), Some(g.get("uuid")), "GPU {i}");
        let mig = dev.mig.as_ref().unwrap_or_else(|| panic!("GPU {i} is MIG capable"));
        assert_eq!(mig.enabled, g.get("mig") == "enabled", "GPU {i}");
        let want = state.migs(i);
        assert_eq!(mig.devices.len(), want.len(), "GPU {i}: {:#?}", mig.devices);
        for (m, r) in mig.devices.iter().zip(&want) {
            total += 1;
            assert_eq!(u64::from(m.index), r.num("index"));
            assert_eq!(m.uuid, r.get("uuid"));
            assert_eq!((u64::from(m.gpu_instance), u64::from(m.compute_instance)), (r.num("gi"), r.num("ci")));
            assert_eq!(m.profile, r.get("profile"), "GPU {i} MIG {}", m.index);
            let gi = state.gi(i, r.num("gi")).expect("gi record");
            assert_eq!((u64::from(m.placement.start), u64::from(m.placement.size)), (gi.num("start"), gi.num("size")));
            assert_eq!(u64::from(m.gi_profile_id), gi.num("profile_id"));
            assert_eq!(u64::from(m.multiprocessors), r.num("sm"));
            // The GI and CI access files of the parent's minor name the capability nodes.
            let minor = dev.attributes["minor"].clone();
            let base = format!("proc/driver/nvidia/capabilities/gpu{minor}/mig/gi{}", m.gpu_instance);
            let gi_minor = cap_minor(&f, &format!("{base}/access"));
            let ci_minor = cap_minor(&f, &format!("{base}/ci{}/access", m.compute_instance));
            let nodes: Vec<(String, u32, u32)> = m.nodes.iter().map(|n| (n.path.clone(), n.major, n.minor)).collect();
            assert_eq!(
                nodes,
                [
                    (format!("/dev/nvidia-caps/nvidia-cap{gi_minor}"), caps_major, gi_minor),
                    (format!("/dev/nvidia-caps/nvidia-cap{ci_minor}"), caps_major, ci_minor)
                ]
            );
            assert_eq!(m.nodes[0].file_mode, Some(0o444));
        }
    }
    assert_eq!(total, 4 + 7 + 2 + 4, "every MIG device of the state file");
    // Profiles the layouts use, including a split GPU instance and a media-extension one.
    let profiles: std::collections::BTreeSet<&str> = inv.mig_devices().map(|(_, m)| m.profile.as_str()).collect();
    assert_eq!(profiles, ["1c.3g.40gb", "1g.10gb", "1g.10gb+me", "2g.20gb", "3g.40gb"].into());
    // The management capabilities exist on every MIG-capable node.
    assert_eq!(v.mig_capabilities["config"].path, "/dev/nvidia-caps/nvidia-cap1");
    assert_eq!(v.mig_capabilities["monitor"].path, "/dev/nvidia-caps/nvidia-cap2");
    assert_eq!(v.mig_capabilities["config"].file_mode, Some(0o400));
}

#[test]
fn nvswitch_and_bridge_nvlink_peers_come_from_nvml() {
    for (name, expect_pairs) in [("nvidia-dgx-a100", false), ("nvidia-dgx-h100", false), ("nvidia-h200-nvl", true)] {
        let Some((f, inv)) = scan(name) else { return };
        assert!(inv.warnings.is_empty(), "{name}: {:#?}", inv.warnings);
        let state = State::of(&f.root).unwrap();
        let v = nvidia(&inv);
        for d in &v.devices {
            let want: Vec<u32> = if expect_pairs {
                vec![d.index ^ 1] // the other GPU on its NVLink bridge
            } else {
                (0..8).filter(|j| *j != d.index).collect() // every GPU on the NVSwitches
            };
            assert_eq!(d.links, want, "{name} GPU {}", d.index);
        }
        if expect_pairs {
            // The bridge peer is the GPU whose bus the double's NVLink records name.
            let g0 = state.all("nvlink").find(|r| r.num("gpu") == 0).unwrap();
            assert_eq!(v.devices[1].pci_bus_id.as_deref(), Some(g0.get("remote_bus")));
        }
    }
}

#[test]
fn gpus_without_mig_and_without_nvml() {
    // A10G: no MIG (NVML answers NOT_SUPPORTED).
    let Some((_f, inv)) = scan("hetero-nvidia-neuron") else { return };
    assert!(nvidia(&inv).devices.iter().all(|d| d.mig.is_none()), "{:#?}", nvidia(&inv).devices);
    // H100 with MIG capable but off.
    let Some((_f, inv)) = scan("nvidia-dgx-h100") else { return };
    assert!(nvidia(&inv).devices.iter().all(|d| d.mig.as_ref().is_some_and(|m| !m.enabled && m.devices.is_empty())));
    // NVML not asked for: procfs only, so no MIG state and no NVLink peers.
    let f = fixture::prepare("nvidia-dgx-a100").unwrap().unwrap();
    let inv = discover_with(&f.root, &profile::builtin(), &DiscoverOptions { nvml: false, ..Default::default() });
    assert!(nvidia(&inv).devices.iter().all(|d| d.mig.is_none() && d.links.is_empty()));
    assert!(inv.warnings.is_empty(), "{:#?}", inv.warnings);
}

#[test]
fn mig_instances_without_a_loadable_nvml_are_warned_about() {
    let Some(f) = fixture::prepare("nvidia-dgx-a100").unwrap() else { return };
    std::fs::remove_file(f.path("usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.95.05")).unwrap();
    let inv = discover(&f.root, &profile::builtin());
    let w: Vec<String> = inv.warnings.iter().map(|w| w.to_string()).collect();
    assert!(w.iter().any(|w| w.contains("MIG instances exist") && w.contains("libnvidia-ml.so.1")), "{w:#?}");
    // GPUs are still found from procfs.
    assert_eq!(nvidia(&inv).devices.len(), 8);
}

#[test]
fn a_gpu_nvml_does_not_list_is_warned_at_the_library_path() {
    // procfs shows one more GPU than the NVML double's state: discovery says so, naming the
    // library that answered by its real path (once joined to the root, not twice).
    let Some(f) = fixture::prepare("nvidia-dgx-h100").expect("fixture prepares") else { return };
    let gpus = f.path("proc/driver/nvidia/gpus");
    let first = std::fs::read_dir(&gpus).unwrap().filter_map(|e| e.ok()).map(|e| e.path()).min().unwrap();
    let info = std::fs::read_to_string(first.join("information")).unwrap();
    let extra = gpus.join("0001:1b:00.0");
    std::fs::create_dir_all(&extra).unwrap();
    let info: String =
        info.lines()
            .map(|l| {
                if l.starts_with("Bus Location:") { "Bus Location: \t 0001:1b:00.0".to_string() } else { l.to_string() }
            })
            .map(|l| l + "\n")
            .collect();
    std::fs::write(extra.join("information"), info).unwrap();
    let inv = discover(&f.root, &profile::builtin());
    let w = inv
        .warnings
        .iter()
        .find(|w| w.message.starts_with("NVML does not list GPU"))
        .unwrap_or_else(|| panic!("no NVML warning: {:#?}", inv.warnings));
    assert!(w.path.exists(), "{} is a real path", w.path.display());
    assert!(w.path.starts_with(&f.root));
    let once = w.path.strip_prefix(&f.root).unwrap();
    assert!(!once.starts_with(f.root.strip_prefix("/").unwrap()), "root joined twice: {}", w.path.display());
}
