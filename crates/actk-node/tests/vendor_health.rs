//! The health engine over the repository's fixture hosts (real sysfs layouts, prepared with
//! device nodes: these need root and are skipped otherwise): each vendor's error signals are
//! found where its driver puts them, and a device turns unhealthy when its driver says so
//! (a raised AMD RAS `ue` count, a Neuron ECC count, habanalabs' status and hard resets,
//! NVIDIA Xids, ECC counts and lost GPUs through the NVML double), and healthy again.

use actk_core::discover::{DiscoverOptions, HostRoot, discover_with};
use actk_core::profile::{self, Profile};
use actk_node::health::{HealthMap, HealthOptions, Monitor, ProblemKind, XidPolicy};
use actk_testsupport::fixture::{self, Fixture};
use actk_testsupport::nvml_double;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The monitor of the fixture's vendor of discovery `kind`, with error recovery `recovery`.
fn monitor(f: &Fixture, kind: &str, recovery: Duration) -> Monitor {
    let profiles = profile::builtin();
    let opts = DiscoverOptions::default();
    let inv = discover_with(&f.root, &profiles, &opts);
    let p: &Profile = profiles.iter().find(|p| p.discovery == kind).unwrap();
    let v = inv.vendor(&p.name).unwrap_or_else(|| panic!("{kind}: no devices"));
    let opts = HealthOptions { policy: XidPolicy::new(&[], recovery, None, None), poll: Duration::from_millis(100) };
    Monitor::new(&f.root, p, v, &opts)
}

/// The real path of host path `path` of the fixture (its links resolved inside the root, so
/// a write never leaves it).
fn real(f: &Fixture, path: &str) -> PathBuf {
    let host = HostRoot::new(&f.root);
    host.host_path(host.resolve(path).unwrap_or_else(|e| panic!("{path}: {e}")))
}

/// Unhealthy devices of `h`: (index, kind, code).
fn sick(h: &HealthMap) -> Vec<(u32, ProblemKind, String)> {
    h.iter().filter_map(|((i, _), p)| p.as_ref().map(|p| (*i, p.kind, p.code.clone()))).collect()
}

/// Polls `m` until `want` holds of its health, for up to 10 s.
fn wait(m: &mut Monitor, what: &str, want: impl Fn(&HealthMap) -> bool) -> HealthMap {
    let t = Instant::now();
    loop {
        let h = m.check();
        if want(&h) {
            return h;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "{what}: still {:?}", sick(&h));
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn amd_ras_uncorrectable_counts_make_the_gpu_faulty() {
    let Some(f) = fixture::prepare("amd-mi300x").unwrap() else { return };
    let mut m = monitor(&f, "amd", Duration::from_millis(500));
    assert_eq!(m.probes().len(), 8);
    for p in m.probes() {
        let blocks: Vec<String> =
            p.signals.iter().map(|s| s.path.file_name().unwrap().to_string_lossy().into()).collect();
        assert!(blocks.contains(&"umc_err_count".to_string()) && blocks.len() == 7, "{blocks:?}");
    }
    assert!(sick(&m.check()).is_empty());
    // GPU 2 is 0000:46:00.0 (card3): its UMC counts an uncorrectable error.
    let umc = real(&f, "/sys/class/drm/card3/device/ras/umc_err_count");
    assert!(umc.to_string_lossy().contains("0000:46:00.0"), "{}", umc.display());
    std::fs::write(&umc, "ue: 0\nce: 5\nde: 1\n").unwrap();
    assert!(sick(&m.check()).is_empty(), "correctable and deferred errors are not a fault");
    std::fs::write(&umc, "ue: 1\nce: 5\nde: 1\n").unwrap();
    let h = m.check();
    assert_eq!(sick(&h), [(2, ProblemKind::Faulty, "ras-umc-ue".to_string())]);
    let reason = &h[&(2, None)].as_ref().unwrap().reason;
    assert!(reason.contains("rose from 0 to 1") && reason.contains("umc_err_count"), "{reason}");
    wait(&mut m, "GPU 2 healthy after the quiet time", |h| sick(h).is_empty());
    // A fatal error being handled: every block answers "Query currently inaccessible".
    let gfx = real(&f, "/sys/bus/pci/devices/0000:c6:00.0/ras/gfx_err_count");
    std::fs::write(&gfx, "Query currently inaccessible\n").unwrap();
    assert_eq!(sick(&m.check()), [(6, ProblemKind::Faulty, "ras-inaccessible".to_string())]);
    std::fs::write(&gfx, "ue: 0\nce: 0\n").unwrap();
    assert!(sick(&m.check()).is_empty());
}

#[test]
fn neuron_ecc_counts_make_the_device_faulty() {
    let Some(f) = fixture::prepare("aws-trn1-32xlarge").unwrap() else { return };
    let mut m = monitor(&f, "neuron", Duration::ZERO);
    assert_eq!(m.probes().len(), 16);
    assert!(m.probes().iter().all(|p| p.signals.len() == 3), "mem, sram and repairable mem ECC of every device");
    assert!(sick(&m.check()).is_empty());
    std::fs::write(real(&f, "/sys/class/neuron_device/neuron5/stats/hardware/sram_ecc_uncorrected"), "2\n").unwrap();
    assert_eq!(sick(&m.check()), [(5, ProblemKind::Faulty, "sram-ecc-uncorrected".to_string())]);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(sick(&m.check()).len(), 1, "recovery 0: faulty until restarted");
}

#[test]
fn habanalabs_status_and_hard_resets_make_the_gaudi_unhealthy() {
    let Some(f) = fixture::prepare("gaudi2").unwrap() else { return };
    let mut m = monitor(&f, "gaudi", Duration::from_millis(300));
    assert!(m.probes().iter().all(|p| p.signals.len() == 2), "status and hard_reset_cnt");
    assert!(sick(&m.check()).is_empty());
    let status = real(&f, "/sys/class/accel/accel3/device/status");
    std::fs::write(&status, "Needs reset\n").unwrap();
    assert_eq!(sick(&m.check()), [(3, ProblemKind::Faulty, "status-needs-reset".to_string())]);
    std::fs::write(&status, "Disabled\n").unwrap();
    assert_eq!(sick(&m.check()), [(3, ProblemKind::Lost, "status-disabled".to_string())]);
    std::fs::write(&status, "Operational\n").unwrap();
    assert!(sick(&m.check()).is_empty());
    std::fs::write(real(&f, "/sys/class/accel/accel7/device/hard_reset_cnt"), "1\n").unwrap();
    assert_eq!(sick(&m.check()), [(7, ProblemKind::Faulty, "hard-reset".to_string())]);
    wait(&mut m, "accel7 healthy after the quiet time", |h| sick(h).is_empty());
}

/// NVML delivers only Xids raised after the watch registered its event set; a monitor that
/// exists watches, so an Xid right after it was made is seen (it was lost while the watch's
/// thread was still loading NVML; CI saw the DRA driver miss one that way).
#[test]
fn an_xid_right_after_the_monitor_starts_is_seen() {
    let Some(f) = fixture::prepare("nvidia-dgx-h100").unwrap() else { return };
    let state = nvml_double::State::of(&f.root).unwrap();
    let profiles = profile::builtin();
    let inv = discover_with(&f.root, &profiles, &DiscoverOptions::default());
    let p = profiles.iter().find(|p| p.discovery == "nvidia").unwrap();
    // NVML takes 300 ms to initialise from now on: the watch's thread is still in nvmlInit
    // when a monitor that did not wait for it returns.
    nvml_double::set_init_delay(&f.root, 300).unwrap();
    let opts = HealthOptions {
        policy: XidPolicy::new(&[], Duration::from_secs(60), None, None),
        poll: Duration::from_millis(100),
    };
    let mut m = Monitor::new(&f.root, p, inv.vendor(&p.name).unwrap(), &opts);
    nvml_double::raise_xid(&f.root, &state.gpu_uuid(6), 79).unwrap();
    let h = wait(&mut m, "Xid 79 on GPU 6", |h| !sick(h).is_empty());
    assert_eq!(sick(&h), [(6, ProblemKind::Faulty, "xid-79".to_string())]);
}

/// A GPU that refuses Xid event registration (NOT_SUPPORTED) is left out of the watch, and the
/// GPUs registered before and after it are still watched (nvml-wrapper frees the event set on
/// that error; the whole watch used to stop).
#[test]
fn a_gpu_without_xid_events_leaves_the_others_watched() {
    let Some(f) = fixture::prepare("nvidia-dgx-h100").unwrap() else { return };
    let state = nvml_double::State::of(&f.root).unwrap();
    nvml_double::refuse_events(&f.root, &state.gpu_uuid(2)).unwrap();
    let mut m = monitor(&f, "nvidia", Duration::from_secs(60));
    nvml_double::raise_xid(&f.root, &state.gpu_uuid(1), 79).unwrap();
    nvml_double::raise_xid(&f.root, &state.gpu_uuid(5), 48).unwrap();
    let h = wait(&mut m, "Xids on GPUs 1 and 5", |h| sick(h).len() == 2);
    assert_eq!(
        sick(&h),
        [(1, ProblemKind::Faulty, "xid-79".to_string()), (5, ProblemKind::Faulty, "xid-48".to_string())]
    );
}

#[test]
fn nvidia_xids_ecc_and_lost_gpus_come_through_the_nvml_double() {
    let Some(f) = fixture::prepare("nvidia-dgx-h100").unwrap() else { return };
    let state = nvml_double::State::of(&f.root).unwrap();
    let mut m = monitor(&f, "nvidia", Duration::from_millis(800));
    assert!(sick(&m.check()).is_empty());
    // The watch reads every GPU's ECC count as its baseline on its first tick.
    std::thread::sleep(Duration::from_millis(400));
    nvml_double::set_uncorrected_ecc(&f.root, &state.gpu_uuid(3), 2).unwrap();
    let h = wait(&mut m, "GPU 3 faulty on an ECC rise", |h| !sick(h).is_empty());
    assert_eq!(sick(&h), [(3, ProblemKind::Faulty, "ecc-uncorrected".to_string())]);
    assert!(h[&(3, None)].as_ref().unwrap().reason.contains("rose from 0 to 2"));
    wait(&mut m, "GPU 3 healthy after the quiet time", |h| sick(h).is_empty());
    nvml_double::raise_xid(&f.root, &state.gpu_uuid(1), 79).unwrap();
    let h = wait(&mut m, "Xid 79 on GPU 1", |h| !sick(h).is_empty());
    assert_eq!(sick(&h), [(1, ProblemKind::Faulty, "xid-79".to_string())]);
    nvml_double::raise_xid(&f.root, &state.gpu_uuid(2), 13).unwrap();
    nvml_double::lose_gpu(&f.root, &state.gpu_uuid(5)).unwrap();
    let h = wait(&mut m, "GPU 5 lost", |h| h[&(5, None)].is_some());
    assert_eq!(
        h[&(5, None)].as_ref().map(|p| (p.kind, p.code.as_str())),
        Some((ProblemKind::Lost, "nvml-unreachable"))
    );
    assert!(h[&(2, None)].is_none(), "Xid 13 is an application error");
    nvml_double::recover_gpu(&f.root, &state.gpu_uuid(5)).unwrap();
    wait(&mut m, "every GPU healthy again", |h| sick(h).is_empty());
}
