//! Discovery over the repository's fixture host roots (fixtures/, prepared with real device
//! nodes and ld.so.cache by actk-testsupport; skipped with a message when not root).
//! Expected values are cross-checked against the fixture's own files (procfs/sysfs text), so
//! the tests say "discovery reports what the host says", not "the output is what it was".

use actk_core::discover::discover;
use actk_core::inventory::{HostFileKind, Inventory, VendorInventory};
use actk_core::profile;
use actk_testsupport::fixture::{self, Fixture};
use std::collections::BTreeSet;

fn scan(name: &str) -> Option<(Fixture, Inventory)> {
    let f = fixture::prepare(name).expect("fixture prepares")?;
    let inv = discover(&f.root, &profile::builtin());
    Some((f, inv))
}

fn links_symmetric(v: &VendorInventory) {
    for d in &v.devices {
        for &peer in &d.links {
            let p = &v.devices[peer as usize];
            assert!(p.links.contains(&d.index), "{} links {} but not back", d.index, peer);
        }
    }
}

#[test]
fn dgx_h100_eight_gpus_in_pci_order_with_identity_from_procfs() {
    let Some((f, inv)) = scan("nvidia-dgx-h100") else { return };
    assert!(inv.warnings.is_empty(), "{:#?}", inv.warnings);
    assert_eq!(inv.vendors.len(), 1);
    let v = &inv.vendors[0];
    assert_eq!((v.kind.as_str(), v.driver_version.as_deref()), ("nvidia.com/gpu", Some("580.95.05")));
    assert_eq!(v.devices.len(), 8);
    let buses: Vec<&str> = v.devices.iter().map(|d| d.pci_bus_id.as_deref().unwrap()).collect();
    let mut sorted = buses.clone();
    sorted.sort();
    assert_eq!(buses, sorted, "index order is PCI bus order");
    for (i, d) in v.devices.iter().enumerate() {
        assert_eq!(d.index as usize, i);
        let info =
            std::fs::read_to_string(f.path(&format!("/proc/driver/nvidia/gpus/{}/information", buses[i]))).unwrap();
        let uuid = d.uuid.as_deref().unwrap();
        assert!(uuid.starts_with("GPU-") && info.contains(uuid), "{uuid} not in {}'s information", buses[i]);
        let minor = info.lines().find_map(|l| l.strip_prefix("Device Minor:")).unwrap().trim();
        assert_eq!(d.nodes.len(), 1);
        assert_eq!(d.nodes[0].path, format!("/dev/nvidia{minor}"));
        assert_eq!((d.nodes[0].major, d.nodes[0].minor.to_string()), (195, minor.to_string()));
        let numa = std::fs::read_to_string(f.path(&format!("/sys/bus/pci/devices/{}/numa_node", buses[i]))).unwrap();
        assert_eq!(d.numa_node.map(|n| n.to_string()), Some(numa.trim().to_string()));
    }
    let shared: Vec<&str> = v.shared_nodes.iter().map(|n| n.path.as_str()).collect();
    // The NVSwitch nodes the DGX has are shared nodes too; only the `fabric` capability gets them.
    assert_eq!(
        shared,
        [
            "/dev/nvidiactl",
            "/dev/nvidia-uvm",
            "/dev/nvidia-uvm-tools",
            "/dev/nvidia-modeset",
            "/dev/nvidia-nvswitchctl",
            "/dev/nvidia-nvswitch0",
            "/dev/nvidia-nvswitch1",
            "/dev/nvidia-nvswitch2",
            "/dev/nvidia-nvswitch3"
        ]
    );
    let has = |cap: &str, path: &str, kind: HostFileKind| {
        v.host_files.iter().any(|h| h.capability == cap && h.container_path == path && h.kind == kind)
    };
    assert!(has("compute", "/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05", HostFileKind::Library));
    assert!(has("compute", "/usr/lib/x86_64-linux-gnu/libcuda.so.1", HostFileKind::Library));
    assert!(has("utility", "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.95.05", HostFileKind::Library));
    assert!(has("utility", "/usr/bin/nvidia-smi", HostFileKind::Binary));
    // Issue 13 item 7: graphics gets the Vulkan ICD, its layer and the EGL vendor/platform files.
    for json in [
        "/usr/share/vulkan/icd.d/nvidia_icd.json",
        "/usr/share/vulkan/implicit_layer.d/nvidia_layers.json",
        "/usr/share/glvnd/egl_vendor.d/10_nvidia.json",
        "/usr/share/egl/egl_external_platform.d/15_nvidia_gbm.json",
        "/usr/share/egl/egl_external_platform.d/10_nvidia_wayland.json",
    ] {
        assert!(has("graphics", json, HostFileKind::File), "{json} not a graphics host file");
    }
    assert!(has("base", "/usr/lib/firmware/nvidia/580.95.05/gsp_ga10x.bin", HostFileKind::Firmware));
    for h in &v.host_files {
        assert!(h.host_path.starts_with(&f.root), "{} outside the root", h.host_path.display());
        assert!(h.host_path.is_file(), "{} is not a file", h.host_path.display());
        if h.kind == HostFileKind::Library {
            assert!(h.host_path.to_string_lossy().ends_with(".so.580.95.05"), "{}", h.host_path.display());
        }
    }
}

#[test]
fn hetero_node_lists_both_vendors() {
    let Some((_f, inv)) = scan("hetero-nvidia-neuron") else { return };
    let kinds: Vec<(&str, usize)> = inv.vendors.iter().map(|v| (v.kind.as_str(), v.devices.len())).collect();
    assert_eq!(kinds, [("nvidia.com/gpu", 2), ("aws.amazon.com/neuron", 2)]);
}

#[test]
fn inf2_twelve_devices_numbered_by_node_with_ring_links() {
    let Some((f, inv)) = scan("aws-inf2-48xlarge") else { return };
    assert!(inv.warnings.is_empty(), "{:#?}", inv.warnings);
    let v = inv.vendor("neuron").expect("neuron found");
    assert_eq!(v.devices.len(), 12);
    let version = std::fs::read_to_string(f.path("/sys/module/neuron/version")).unwrap();
    assert_eq!(v.driver_version.as_deref(), Some(version.trim()));
    for d in &v.devices {
        assert_eq!(d.nodes[0].path, format!("/dev/neuron{}", d.index));
        assert_eq!(d.cores, Some(2));
        assert_eq!(d.links.len(), 2, "ring: two neighbours for {}", d.index);
        assert_eq!(d.model.as_deref(), Some("Inferentia2"));
        let serial =
            std::fs::read_to_string(f.path(&format!("/sys/class/neuron_device/neuron{}/info/serial_number", d.index)))
                .unwrap();
        assert_eq!(d.uuid.as_deref(), Some(serial.trim()));
    }
    links_symmetric(v);
    let tools: Vec<(&str, &str)> =
        v.host_files.iter().map(|h| (h.capability.as_str(), h.container_path.as_str())).collect();
    assert_eq!(tools, [("utility", "/opt/aws/neuron/bin/neuron-ls"), ("utility", "/opt/aws/neuron/bin/neuron-top")]);
    assert!(v.host_files.iter().all(|h| h.kind == HostFileKind::Binary && h.host_path.starts_with(&f.root)));
}

#[test]
fn trn1_sixteen_devices_in_a_torus() {
    let Some((_f, inv)) = scan("aws-trn1-32xlarge") else { return };
    let v = inv.vendor("neuron").expect("neuron found");
    assert_eq!(v.devices.len(), 16);
    assert!(v.devices.iter().all(|d| d.links.len() == 4), "2D torus: four neighbours each");
    links_symmetric(v);
}

#[test]
fn mi300x_eight_gpus_fully_xgmi_linked() {
    let Some((_f, inv)) = scan("amd-mi300x") else { return };
    assert!(inv.warnings.is_empty(), "{:#?}", inv.warnings);
    let v = inv.vendor("amd").expect("amd found");
    assert_eq!(v.devices.len(), 8);
    for d in &v.devices {
        let others: Vec<u32> = (0..8).filter(|&i| i != d.index).collect();
        assert_eq!(d.links, others, "GPU {} XGMI peers", d.index);
        assert_eq!(d.nodes[0].path, format!("/dev/dri/renderD{}", 128 + d.index));
        assert!(d.nodes.iter().any(|n| n.path.starts_with("/dev/dri/card")));
        assert!(d.pci_bus_id.is_some() && d.uuid.is_some());
    }
    assert_eq!(v.shared_nodes.iter().map(|n| n.path.as_str()).collect::<Vec<_>>(), ["/dev/kfd"]);
    // Issue 25 item 2: the host nodes' owners, as Ubuntu's udev rules make them (fixtures/
    // amd-mi300x/SOURCES.md), are what discovery reports and generated specs carry.
    let render = &v.devices[0].nodes[0];
    assert_eq!((render.file_mode, render.gid), (Some(0o660), Some(109)), "renderD128 is 0660 root:render");
    let card = v.devices[0].nodes.iter().find(|n| n.path.starts_with("/dev/dri/card")).unwrap();
    assert_eq!((card.file_mode, card.gid), (Some(0o660), Some(44)), "card1 is 0660 root:video");
    assert_eq!((v.shared_nodes[0].file_mode, v.shared_nodes[0].gid), (Some(0o660), Some(109)), "/dev/kfd");
}

#[test]
fn gaudi2_devices_claimed_by_gaudi_not_generic_accel() {
    let Some((f, inv)) = scan("gaudi2") else { return };
    assert!(inv.warnings.is_empty(), "{:#?}", inv.warnings);
    assert!(inv.vendor("accel").is_none(), "habanalabs devices must not also appear as kernel.org/accel");
    let v = inv.vendor("gaudi").expect("gaudi found");
    assert_eq!(v.devices.len(), 8);
    for d in &v.devices {
        let paths: Vec<&str> = d.nodes.iter().map(|n| n.path.as_str()).collect();
        assert_eq!(paths, [format!("/dev/accel/accel{}", d.index), format!("/dev/accel/accel_controlD{}", d.index)]);
        assert_eq!(d.nodes[0].major, 261);
        let dir = f.path(&format!("/sys/class/accel/accel{}/device", d.index));
        let read = |a: &str| std::fs::read_to_string(dir.join(a)).unwrap().trim().to_string();
        assert_eq!(d.pci_bus_id.as_deref(), Some(read("pci_addr").as_str()));
        assert_eq!(d.attributes.get("module_id"), Some(&read("module_id")));
        assert_eq!(d.model.as_deref(), Some(read("device_type").as_str()));
    }
}

#[test]
fn empty_host_has_no_vendors_and_no_warnings() {
    let Some((_f, inv)) = scan("empty") else { return };
    assert!(inv.vendors.is_empty(), "{:#?}", inv.vendors);
    assert!(inv.warnings.is_empty(), "{:#?}", inv.warnings);
}

/// An odd DGX: one GPU's PCI sysfs entry gone, one GPU's NUMA attribute unreadable (a
/// directory), and libcuda.so.1 pointing at a library of another driver version. Each gives a
/// warning naming the path; the GPUs are still listed; nothing panics.
#[test]
fn odd_dgx_warns_with_paths() {
    let Some(f) = fixture::prepare("nvidia-dgx-h100").unwrap() else { return };
    let inv = discover(&f.root, &profile::builtin());
    let buses: Vec<String> = inv.vendors[0].devices.iter().map(|d| d.pci_bus_id.clone().unwrap()).collect();
    // The bus link (sys/bus/pci/devices/BDF) of GPU 0 and the numa_node of GPU 1.
    std::fs::remove_file(f.path(&format!("/sys/bus/pci/devices/{}", buses[0]))).unwrap();
    let numa1 = f.path(&format!("/sys/bus/pci/devices/{}/numa_node", buses[1]));
    let numa1 = numa1.canonicalize().unwrap();
    std::fs::remove_file(&numa1).unwrap();
    std::fs::create_dir(&numa1).unwrap();
    let lib = f.path("/usr/lib/x86_64-linux-gnu");
    std::fs::copy(lib.join("libcuda.so.580.95.05"), lib.join("libcuda.so.535.104.05")).unwrap();
    std::fs::remove_file(lib.join("libcuda.so.1")).unwrap();
    std::os::unix::fs::symlink("libcuda.so.535.104.05", lib.join("libcuda.so.1")).unwrap();
    let inv = discover(&f.root, &profile::builtin());
    let warned = |p: std::path::PathBuf| inv.warnings.iter().any(|w| w.path == p);
    assert!(warned(f.path(&format!("/sys/bus/pci/devices/{}/numa_node", buses[0]))), "{:#?}", inv.warnings);
    assert!(warned(f.path(&format!("/sys/bus/pci/devices/{}/numa_node", buses[1]))), "{:#?}", inv.warnings);
    assert!(warned(lib.join("libcuda.so.535.104.05")), "{:#?}", inv.warnings);
    let v = &inv.vendors[0];
    assert_eq!(v.devices.len(), 8);
    assert_eq!(v.devices[0].numa_node, None);
    assert!(!v.host_files.iter().any(|h| h.host_path.to_string_lossy().contains("535.104.05")));
    assert!(
        !v.host_files.iter().any(|h| h.container_path.ends_with("libcuda.so.1")),
        "stale soname link must not be mounted"
    );
}

/// Discovery of a driver-container root never reads outside it: an absolute symlink to the
/// host's /usr/bin/nvidia-smi location resolves inside the fixture.
#[test]
fn absolute_links_resolve_inside_the_root() {
    let Some(f) = fixture::prepare("nvidia-dgx-h100").unwrap() else { return };
    let bin = f.path("/usr/bin/nvidia-smi");
    std::fs::remove_file(&bin).unwrap();
    std::os::unix::fs::symlink("/opt/drv/nvidia-smi", &bin).unwrap();
    let inv = discover(&f.root, &profile::builtin());
    let files: BTreeSet<String> = inv.vendors[0].host_files.iter().map(|h| h.container_path.clone()).collect();
    assert!(!files.contains("/usr/bin/nvidia-smi"), "dangling inside the root: must not be found on the host");
    std::fs::create_dir_all(f.path("/opt/drv")).unwrap();
    std::fs::write(f.path("/opt/drv/nvidia-smi"), "bin").unwrap();
    let inv = discover(&f.root, &profile::builtin());
    let smi = inv.vendors[0]
        .host_files
        .iter()
        .find(|h| h.container_path == "/usr/bin/nvidia-smi")
        .expect("found via in-root link");
    assert_eq!(smi.host_path, f.path("/opt/drv/nvidia-smi"));
}

/// Issue 13 item 2: on the Grace Hopper (arm64) node, libraries are found by the host's
/// architecture: the aarch64 entries of its ld.so.cache (written by aarch64 ldconfig), in the
/// aarch64 multiarch directory; no 32-bit copies are looked for.
#[test]
fn item2_gh200_arm64_libraries_by_the_hosts_architecture() {
    let Some(f) = fixture::prepare("nvidia-gh200").unwrap() else { return };
    let inv = discover(&f.root, &profile::builtin());
    assert!(inv.warnings.is_empty(), "{:?}", inv.warnings);
    let v = inv.vendor("nvidia").expect("nvidia found");
    assert_eq!(v.devices.len(), 1);
    assert_eq!(v.devices[0].model.as_deref(), Some("NVIDIA GH200 480GB"));
    assert_eq!(v.devices[0].pci_bus_id.as_deref(), Some("0009:01:00.0"));
    let libs: Vec<&str> =
        v.host_files.iter().filter(|h| h.kind == HostFileKind::Library).map(|h| h.container_path.as_str()).collect();
    for want in [
        "/usr/lib/aarch64-linux-gnu/libcuda.so.580.95.05",
        "/usr/lib/aarch64-linux-gnu/libcuda.so.1",
        "/usr/lib/aarch64-linux-gnu/libnvidia-ml.so.580.95.05",
        "/usr/lib/aarch64-linux-gnu/libnvidia-ml.so.1",
    ] {
        assert!(libs.contains(&want), "{want} not found: {libs:?}");
    }
    assert!(libs.iter().all(|l| l.starts_with("/usr/lib/aarch64-linux-gnu/")), "{libs:?}");
    assert!(!v.host_files.iter().any(|h| h.capability == "compat32"), "no 32-bit copies on arm64");
    // The cache really is an arm64 one.
    let cache = actk_core::ldcache::parse(&std::fs::read(f.path("/etc/ld.so.cache")).unwrap()).unwrap();
    assert!(cache.iter().all(|e| e.arch() == actk_core::ldcache::LibArch::Aarch64), "{cache:?}");
}

/// AMD MI300X in CPX/NPS4 mode (modelled on ROCm k8s-device-plugin's topo-mi300-cpx capture):
/// one device per partition, each with the render node its KFD node names, the GPU's PCI
/// address and modes, and the other partitions of its GPU as closest peers.
#[test]
fn mi300x_cpx_partitions_are_one_device_each() {
    let Some((f, inv)) = scan("amd-mi300x-cpx") else { return };
    assert!(inv.warnings.is_empty(), "{:#?}", inv.warnings);
    let v = inv.vendor("amd").expect("amd");
    assert_eq!(v.devices.len(), 64, "8 GPUs x 8 CPX partitions");
    let nodes = f.path("sys/class/kfd/kfd/topology/nodes");
    for d in &v.devices {
        let kfd = &d.attributes["kfd_node"];
        let props = std::fs::read_to_string(nodes.join(kfd).join("properties")).unwrap();
        let get =
            |k: &str| -> u64 { props.lines().find_map(|l| l.strip_prefix(&format!("{k} "))).unwrap().parse().unwrap() };
        assert_eq!(d.nodes[0].path, format!("/dev/dri/renderD{}", get("drm_render_minor")), "device {}", d.index);
        let loc = get("location_id");
        assert_eq!(d.pci_bus_id.as_deref(), Some(format!("0000:{:02x}:00.0", loc >> 8).as_str()));
        assert_eq!(d.attributes["partition"], (loc & 7).to_string());
        assert_eq!(
            (d.attributes["compute_partition"].as_str(), d.attributes["memory_partition"].as_str()),
            ("cpx", "nps4")
        );
        assert_eq!(d.attributes["unique_id"], format!("0x{:016x}", get("unique_id")));
        assert!(d.uuid.is_none(), "the GPU's unique_id is not unique per partition");
        // The first partition is the PCI function with the GPU's card node; the rest render only.
        assert_eq!(d.nodes.len(), if d.attributes["partition"] == "0" { 2 } else { 1 });
        let gpu = d.index / 8;
        let same: Vec<u32> = (gpu * 8..gpu * 8 + 8).filter(|i| *i != d.index).collect();
        assert_eq!(d.links, same, "closest XGMI peers are the GPU's own partitions");
    }
    // The unpartitioned MI300X fixture keeps one device per GPU with every other GPU as peer.
    let Some((_, inv)) = scan("amd-mi300x") else { return };
    let v = inv.vendor("amd").unwrap();
    assert_eq!(v.devices.len(), 8);
    assert!(v.devices.iter().all(|d| d.links.len() == 7
        && d.attributes["compute_partition"] == "spx"
        && !d.attributes.contains_key("partition")));
}
