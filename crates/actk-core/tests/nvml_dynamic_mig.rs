//! MIG devices made and removed on demand through the NVML seam (`nvml::dynamic`), on the
//! fixture roots' NVML test double, which models the placement rules of the A100 and H100 and
//! keeps its instances in the root as the driver keeps them on a node. What is checked is what
//! a user sees afterwards: discovery's MIG devices (as `actk list` shows them), the capability
//! access files under /proc/driver/nvidia/capabilities, and the double's state file.

use actk_core::discover::nvml::{self, dynamic};
use actk_core::discover::{HostRoot, discover};
use actk_core::inventory::{Inventory, MigDevice, MigPlacement};
use actk_core::profile;
use actk_testsupport::fixture::{self, Fixture};
use actk_testsupport::nvml_double::{self, State};
use dynamic::MigAdminError;
use std::path::Path;

/// nvml.h GPU instance profile indexes.
const GI_1_SLICE: u32 = 0;
const GI_3_SLICE: u32 = 2;
const GI_4_SLICE: u32 = 3;
const GI_7_SLICE: u32 = 4;
const GI_1_SLICE_REV1: u32 = 7;

fn prepare(name: &str) -> Option<Fixture> {
    fixture::prepare(name).expect("fixture prepares")
}

fn scan(root: &Path) -> Inventory {
    let inv = discover(root, &profile::builtin());
    assert!(inv.warnings.is_empty(), "{:#?}", inv.warnings);
    inv
}

/// The MIG devices discovery lists under GPU `gpu`.
fn migs(root: &Path, gpu: u32) -> Vec<MigDevice> {
    let inv = scan(root);
    let dev = &inv.vendor("nvidia").expect("nvidia vendor").devices[gpu as usize];
    let mig = dev.mig.as_ref().unwrap_or_else(|| panic!("GPU {gpu} is MIG capable"));
    assert!(mig.enabled, "GPU {gpu} is in MIG mode");
    mig.devices.clone()
}

fn gpu_uuid(f: &Fixture, gpu: u64) -> String {
    State::of(&f.root).unwrap().gpu_uuid(gpu)
}

fn state_text(f: &Fixture) -> String {
    std::fs::read_to_string(f.path("nvml-double/state.tsv")).unwrap()
}

/// `proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<G>[/ci<C>]` of the fixture.
fn cap_dir(gpu_minor: u32, gi: u32, ci: Option<u32>) -> String {
    let gi = format!("proc/driver/nvidia/capabilities/gpu{gpu_minor}/mig/gi{gi}");
    ci.map_or(gi.clone(), |c| format!("{gi}/ci{c}"))
}

/// `DeviceFileMinor` of an access file, and that its text is the driver's form.
fn access_minor(f: &Fixture, dir: &str) -> u32 {
    let text = std::fs::read_to_string(f.path(&format!("{dir}/access"))).unwrap_or_else(|e| panic!("{dir}: {e}"));
    let minor = text.lines().find_map(|l| l.strip_prefix("DeviceFileMinor: ")).unwrap().parse().unwrap();
    assert_eq!(text, format!("DeviceFileMinor: {minor}\nDeviceFileMode: 292\nDeviceFileModify: 1\n"), "{dir}");
    minor
}

/// The minor /proc/driver/nvidia-caps/mig-minors gives `gpu<N>/gi<G>[/ci<C>]/access`.
fn table_minor(f: &Fixture, key: &str) -> u32 {
    let text = std::fs::read_to_string(f.path("proc/driver/nvidia-caps/mig-minors")).unwrap();
    let want = format!("{key}/access");
    text.lines().find_map(|l| l.strip_prefix(&want)?.trim().parse().ok()).unwrap_or_else(|| panic!("{want}"))
}

fn open(f: &Fixture) -> nvml_wrapper::Nvml {
    nvml::open(&HostRoot::new(&f.root)).expect("the double loads")
}

#[test]
fn placements_match_the_mig_user_guide_table_on_a100_and_h100() {
    // nvidia-smi mig -lgipp of an A100 / H100 80GB: the same table, 8 memory slices.
    let table: &[(u32, &str, &[u32], u32)] = &[
        (GI_1_SLICE, "1g.10gb", &[0, 1, 2, 3, 4, 5, 6], 1),
        (1, "2g.20gb", &[0, 2, 4], 2),
        (GI_3_SLICE, "3g.40gb", &[0, 4], 4),
        (GI_4_SLICE, "4g.40gb", &[0], 4),
        (GI_7_SLICE, "7g.80gb", &[0], 8),
        (GI_1_SLICE_REV1, "1g.10gb+me", &[0, 1, 2, 3, 4, 5, 6], 1),
        (9, "1g.20gb", &[0, 2, 4, 6], 2),
    ];
    for (name, gpu) in [("nvidia-dgx-a100", 0), ("nvidia-dgx-h100", 3)] {
        let Some(f) = prepare(name) else { return };
        let uuid = gpu_uuid(&f, gpu);
        if name == "nvidia-dgx-h100" {
            // MIG is off on this node: the administrator's step comes first.
            let e = dynamic::gi_profiles(&open(&f), &uuid).unwrap_err();
            assert_eq!(e, MigAdminError::NotMigMode { gpu: uuid.clone() });
            assert!(e.to_string().contains("nvidia-smi -i <index> -mig 1"), "{e}");
            nvml_double::enable_mig(&f.root, gpu as u32).unwrap();
        }
        // Placements are listed whether taken or not (the A100's GPU 0 has four instances).
        let profiles = dynamic::gi_profiles(&open(&f), &uuid).unwrap();
        let got: Vec<(u32, String, Vec<u32>, Vec<u32>)> = profiles
            .iter()
            .map(|p| {
                let sizes = p.placements.iter().map(|x| x.size).collect();
                (p.index, p.name.clone(), p.placements.iter().map(|x| x.start).collect(), sizes)
            })
            .collect();
        let mut want: Vec<(u32, String, Vec<u32>, Vec<u32>)> = table
            .iter()
            .map(|(i, n, starts, size)| (*i, n.to_string(), starts.to_vec(), vec![*size; starts.len()]))
            .collect();
        want.sort();
        assert_eq!(got, want, "{name}");
        let three = profiles.iter().find(|p| p.name == "3g.40gb").unwrap();
        assert_eq!((three.id, three.slices, three.instances), (9, 3, 2), "{name}");
    }
}

#[test]
fn a_created_mig_device_is_what_discovery_lists_and_destroy_removes_it() {
    let Some(f) = prepare("nvidia-dgx-a100") else { return };
    // GPU 4: MIG capable, off, no instances; the administrator switches it on.
    let uuid = gpu_uuid(&f, 4);
    assert_eq!(
        dynamic::create(&open(&f), &uuid, GI_3_SLICE, 4).unwrap_err(),
        MigAdminError::NotMigMode { gpu: uuid.clone() }
    );
    nvml_double::enable_mig(&f.root, 4).unwrap();
    assert_eq!(migs(&f.root, 4), vec![]);

    let nvml = open(&f);
    let made = dynamic::create(&nvml, &uuid, GI_3_SLICE, 4).unwrap();
    let listed = migs(&f.root, 4);
    assert_eq!(listed.len(), 1, "{listed:#?}");
    let m = &listed[0];
    assert_eq!(m.uuid, made.uuid);
    assert!(m.uuid.starts_with("MIG-") && m.uuid.len() == 40, "{}", m.uuid);
    assert_eq!((m.index, m.gpu_instance, m.compute_instance), (made.index, made.gpu_instance, made.compute_instance));
    assert_eq!((m.index, m.gpu_instance, m.compute_instance), (0, 2, 0), "the driver's GI id for 3g@4");
    assert_eq!(m.profile, "3g.40gb");
    assert_eq!(m.placement, MigPlacement { start: 4, size: 4 });
    assert_eq!(m.multiprocessors, 42);
    // The capability nodes are those of the access files the instance brought, whose minors
    // are the driver's mig-minors entries.
    let gi_minor = access_minor(&f, &cap_dir(4, 2, None));
    let ci_minor = access_minor(&f, &cap_dir(4, 2, Some(0)));
    assert_eq!((gi_minor, ci_minor), (table_minor(&f, "gpu4/gi2"), table_minor(&f, "gpu4/gi2/ci0")));
    let nodes: Vec<(String, u32)> = m.nodes.iter().map(|n| (n.path.clone(), n.minor)).collect();
    assert_eq!(
        nodes,
        [
            (format!("/dev/nvidia-caps/nvidia-cap{gi_minor}"), gi_minor),
            (format!("/dev/nvidia-caps/nvidia-cap{ci_minor}"), ci_minor)
        ]
    );
    // The same MIG device again, and a 7g over it: taken, and nothing changes.
    let before = state_text(&f);
    for (profile, start, name) in [(GI_3_SLICE, 4, "3g.40gb"), (GI_7_SLICE, 0, "7g.80gb")] {
        let e = dynamic::create(&nvml, &uuid, profile, start).unwrap_err();
        assert_eq!(e, MigAdminError::Occupied { gpu: uuid.clone(), profile: name.into(), start });
        assert!(e.to_string().contains("use another placement"), "{e}");
    }
    assert_eq!(state_text(&f), before);
    assert_eq!(migs(&f.root, 4), listed);
    // A start that is no placement of the profile.
    let e = dynamic::create(&nvml, &uuid, GI_3_SLICE, 2).unwrap_err();
    assert_eq!(
        e,
        MigAdminError::NoSuchPlacement { gpu: uuid.clone(), profile: "3g.40gb".into(), start: 2, possible: vec![0, 4] }
    );
    // One media-extension instance per GPU: the second is refused though its slice is free.
    let me = dynamic::create(&nvml, &uuid, GI_1_SLICE_REV1, 0).unwrap();
    let before = state_text(&f);
    assert_eq!(
        dynamic::create(&nvml, &uuid, GI_1_SLICE_REV1, 1).unwrap_err(),
        MigAdminError::Occupied { gpu: uuid.clone(), profile: "1g.10gb+me".into(), start: 1 }
    );
    assert_eq!(state_text(&f), before);
    let listed = migs(&f.root, 4);
    let profiles: Vec<(u32, &str, u32)> =
        listed.iter().map(|m| (m.index, m.profile.as_str(), m.placement.start)).collect();
    assert_eq!(profiles, [(0, "3g.40gb", 4), (1, "1g.10gb+me", 0)]);
    assert_eq!(listed[1].uuid, me.uuid);
    assert_ne!(me.uuid, made.uuid);

    // Destroy: gone from discovery and procfs; again is fine (NodeUnprepare retried).
    dynamic::destroy(&nvml, &uuid, made.gpu_instance, made.compute_instance).unwrap();
    let listed = migs(&f.root, 4);
    assert_eq!(listed.iter().map(|m| m.uuid.as_str()).collect::<Vec<_>>(), [me.uuid.as_str()]);
    assert!(!f.path(&cap_dir(4, 2, None)).exists(), "GI capability directory removed");
    dynamic::destroy(&nvml, &uuid, made.gpu_instance, made.compute_instance).unwrap();
    dynamic::destroy(&nvml, &uuid, me.gpu_instance, me.compute_instance).unwrap();
    assert_eq!(migs(&f.root, 4), vec![]);
    assert!(!f.path(&cap_dir(4, me.gpu_instance, None)).exists());
    // The slices are free again: a 4g and a 3g side by side fill the GPU.
    let four = dynamic::create(&nvml, &uuid, GI_4_SLICE, 0).unwrap();
    let three = dynamic::create(&nvml, &uuid, GI_3_SLICE, 4).unwrap();
    let listed = migs(&f.root, 4);
    let got: Vec<(&str, &str)> = listed.iter().map(|m| (m.uuid.as_str(), m.profile.as_str())).collect();
    assert_eq!(got, [(four.uuid.as_str(), "4g.40gb"), (three.uuid.as_str(), "3g.40gb")]);
    // The other GPUs are untouched.
    let state = State::of(&f.root).unwrap();
    assert_eq!(state.migs(0).len(), 4);
    assert_eq!(state.migs(1).len(), 7);
}

#[test]
fn the_h100_makes_mig_devices_too() {
    let Some(f) = prepare("nvidia-dgx-h100") else { return };
    let uuid = gpu_uuid(&f, 7);
    nvml_double::enable_mig(&f.root, 7).unwrap();
    let nvml = open(&f);
    let a = dynamic::create(&nvml, &uuid, GI_1_SLICE, 6).unwrap();
    let b = dynamic::create(&nvml, &uuid, 1, 0).unwrap();
    let listed = migs(&f.root, 7);
    let got: Vec<(&str, &str, u32, u32)> =
        listed.iter().map(|m| (m.uuid.as_str(), m.profile.as_str(), m.placement.start, m.multiprocessors)).collect();
    assert_eq!(got, [(a.uuid.as_str(), "1g.10gb", 6, 16), (b.uuid.as_str(), "2g.20gb", 0, 32)]);
    // GI ids as the driver gives them: 1g@6 is 13, 2g@0 is 3.
    assert_eq!((a.gpu_instance, b.gpu_instance), (13, 3));
    assert_eq!(access_minor(&f, &cap_dir(7, 13, Some(0))), table_minor(&f, "gpu7/gi13/ci0"));
    dynamic::destroy(&nvml, &uuid, a.gpu_instance, a.compute_instance).unwrap();
    dynamic::destroy(&nvml, &uuid, b.gpu_instance, b.compute_instance).unwrap();
    assert_eq!(migs(&f.root, 7), vec![]);
    assert!(!f.path(&cap_dir(7, 13, None)).exists() && !f.path(&cap_dir(7, 3, None)).exists());
}

/// Run by `a_create_in_another_process_is_seen_at_the_next_nvml_init` in a child process:
/// creates 3g.40gb at 0 on GPU 4 of the root in ACTK_TEST_DYNAMIC_MIG_ROOT and prints its UUID.
#[test]
fn child_creates_a_mig_device() {
    let Some(root) = std::env::var_os("ACTK_TEST_DYNAMIC_MIG_ROOT") else { return };
    let host = HostRoot::new(&root);
    let nvml = nvml::open(&host).unwrap();
    let uuid = State::of(Path::new(&root)).unwrap().gpu_uuid(4);
    let made = dynamic::create(&nvml, &uuid, GI_3_SLICE, 0).unwrap();
    println!("created={}", made.uuid);
}

#[test]
fn a_create_in_another_process_is_seen_at_the_next_nvml_init() {
    let Some(f) = prepare("nvidia-dgx-a100") else { return };
    nvml_double::enable_mig(&f.root, 4).unwrap();
    // This process initialised NVML (and so read the double's state) before the other one
    // creates; it keeps the library loaded, as a long-running device plugin or DRA driver does.
    let early = open(&f);
    let gpu4 = early.device_by_index(4).unwrap();
    assert_eq!(migs(&f.root, 4), vec![]);
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_creates_a_mig_device", "--nocapture", "--test-threads=1"])
        .env("ACTK_TEST_DYNAMIC_MIG_ROOT", &f.root)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    // libtest prints the test's name on the same line as its output.
    let created = stdout.lines().find_map(|l| l.split_once("created=")).map(|(_, u)| u.trim());
    let created = created.expect("the child printed the UUID");
    // A discovery now (a new nvmlInit in this process) sees it.
    let listed = migs(&f.root, 4);
    assert_eq!(
        listed.iter().map(|m| (m.uuid.as_str(), m.profile.as_str())).collect::<Vec<_>>(),
        [(created, "3g.40gb")]
    );
    // The handle taken before still answers, and this process can destroy what the other made.
    assert_eq!(gpu4.uuid().unwrap(), gpu_uuid(&f, 4));
    let m = &listed[0];
    dynamic::destroy(&early, &gpu_uuid(&f, 4), m.gpu_instance, m.compute_instance).unwrap();
    assert_eq!(migs(&f.root, 4), vec![]);
}

#[test]
fn static_instances_of_the_a100_can_be_destroyed() {
    let Some(f) = prepare("nvidia-dgx-a100") else { return };
    let nvml = open(&f);
    // GPU 0 (all-balanced): its 3g.40gb at 4 is GI 2.
    let uuid = gpu_uuid(&f, 0);
    let before = migs(&f.root, 0);
    let three = before.iter().find(|m| m.profile == "3g.40gb").unwrap().clone();
    assert_eq!((three.gpu_instance, three.compute_instance), (2, 0));
    assert!(f.path(&cap_dir(0, 2, Some(0))).join("access").is_file());
    dynamic::destroy(&nvml, &uuid, 2, 0).unwrap();
    let after = migs(&f.root, 0);
    let want: Vec<&str> = before.iter().filter(|m| m.uuid != three.uuid).map(|m| m.uuid.as_str()).collect();
    assert_eq!(after.iter().map(|m| m.uuid.as_str()).collect::<Vec<_>>(), want);
    assert!(!f.path(&cap_dir(0, 2, None)).exists());
    // Its slices can hold a new one, with a UUID of its own.
    let again = dynamic::create(&nvml, &uuid, GI_3_SLICE, 4).unwrap();
    assert_ne!(again.uuid, three.uuid);
    assert_eq!(again.gpu_instance, 2);
    assert!(migs(&f.root, 0).iter().any(|m| m.uuid == again.uuid && m.placement == three.placement));

    // GPU 3: a 3g.40gb split into three compute instances. Destroying one leaves the GPU
    // instance to the other two.
    let uuid3 = gpu_uuid(&f, 3);
    let split: Vec<String> = migs(&f.root, 3).iter().filter(|m| m.gpu_instance == 2).map(|m| m.uuid.clone()).collect();
    assert_eq!(split.len(), 3);
    dynamic::destroy(&nvml, &uuid3, 2, 1).unwrap();
    let left: Vec<String> = migs(&f.root, 3).iter().filter(|m| m.gpu_instance == 2).map(|m| m.uuid.clone()).collect();
    assert_eq!(left, [split[0].clone(), split[2].clone()]);
    assert!(f.path(&cap_dir(3, 2, None)).join("access").is_file());
    assert!(!f.path(&cap_dir(3, 2, Some(1))).exists());
}

/// A MIG device made again at the same placement gets the same instance ids and a new UUID (as
/// on a GPU, where MIG UUIDs do not survive re-creation); destroying by the old UUID then
/// leaves the new device alone, so a retried unprepare never takes another claim's device.
#[test]
fn destroy_by_uuid_never_takes_the_device_that_got_the_ids_since() {
    let Some(f) = prepare("nvidia-dgx-a100") else { return };
    nvml_double::enable_mig(&f.root, 4).unwrap();
    let gpu = gpu_uuid(&f, 4);
    let lib = open(&f);
    let first = dynamic::create(&lib, &gpu, GI_3_SLICE, 4).unwrap();
    assert_eq!(dynamic::destroy_by_uuid(&lib, &gpu, &first.uuid), Ok(true));
    assert!(migs(&f.root, 4).is_empty());
    let second = dynamic::create(&lib, &gpu, GI_3_SLICE, 4).unwrap();
    assert_eq!((second.gpu_instance, second.compute_instance), (first.gpu_instance, first.compute_instance));
    assert_ne!(second.uuid, first.uuid, "a new MIG device, a new UUID");
    assert_eq!(dynamic::destroy_by_uuid(&lib, &gpu, &first.uuid), Ok(false), "the old one is gone already");
    assert_eq!(migs(&f.root, 4).iter().map(|m| m.uuid.as_str()).collect::<Vec<_>>(), [second.uuid.as_str()]);
    // A GPU NVML no longer knows has nothing left to destroy.
    assert_eq!(dynamic::destroy_by_uuid(&lib, "GPU-00000000-0000-0000-0000-000000000000", &second.uuid), Ok(false));
}

/// Two nodes' doubles read their state in two threads at once and each keeps answering what its
/// state says. Every fixture root has its own copy of the double, and a test process (a DRA
/// test's publisher and driver, parallel tests) loads several side by side; they share the
/// process's libc. The double once split state.tsv's lines with strtok(3), whose position is
/// one per process: one copy's parse cut the other's lines, and a GPU's 1g.10gb profile went
/// missing from a dynamic-MIG test's first publish (one CI run in about forty).
#[test]
fn two_doubles_read_their_state_in_parallel_alike() {
    let (Some(a), Some(b)) = (prepare("nvidia-dgx-a100"), prepare("nvidia-dgx-a100")) else { return };
    let rounds = |f: &Fixture| {
        let state = f.path("nvml-double/state.tsv");
        let text = std::fs::read(&state).unwrap();
        let uuid = gpu_uuid(f, 0);
        let mut first = None;
        for round in 0..600 {
            // A new file each round (another inode), so that nvmlInit reads it again.
            let tmp = state.with_extension("tsv.new");
            std::fs::write(&tmp, &text).unwrap();
            std::fs::rename(&tmp, &state).unwrap();
            let nvml = open(f);
            let profiles = dynamic::gi_profiles(&nvml, &uuid).unwrap();
            let names: Vec<(String, usize)> = profiles.iter().map(|p| (p.name.clone(), p.placements.len())).collect();
            match &first {
                None => first = Some(names),
                Some(want) => assert_eq!(&names, want, "{}: round {round}", f.root.display()),
            }
        }
        first.unwrap()
    };
    let (x, y) = std::thread::scope(|s| {
        let x = s.spawn(|| rounds(&a));
        let y = s.spawn(|| rounds(&b));
        (x.join().unwrap(), y.join().unwrap())
    });
    assert_eq!(x, y, "the same fixture answers the same profiles");
    assert!(x.iter().any(|(n, _)| n == "1g.10gb"), "{x:?}");
}
