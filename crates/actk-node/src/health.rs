//! Device health, one engine for every vendor: presence probes over the host root, each
//! vendor's error counters, NVIDIA's Xid and ECC reports through the NVML seam, and a polling
//! loop that publishes every change. The device plugin turns it into ListAndWatch health, the
//! DRA driver into device taints and the kubelet's DRAResourceHealth stream.
//!
//! What makes a device unhealthy, and of which [`ProblemKind`]:
//! - **Lost** (the device cannot be used at all): one of its device nodes is gone or has
//!   another device number than discovery saw (driver unloaded, device removed), discovery
//!   found no usable node for it, its PCI function has left sysfs (fell off the bus,
//!   hot-unplug), NVML cannot reach the GPU (`NVML_ERROR_GPU_IS_LOST`), or habanalabs says the
//!   device is `Disabled`. Healthy again as soon as the probe passes, so a reset or re-plugged
//!   device comes back without restarting anything.
//! - **Faulty** (the device is there but reported errors): a critical Xid (see [`XidPolicy`]),
//!   and an **increase of an uncorrectable error counter** since the previous poll:
//!   NVIDIA volatile uncorrected ECC (`nvmlDeviceGetTotalEccErrors`); AMD `ue` of any amdgpu RAS
//!   block (`<pci>/ras/<block>_err_count`, lines `ue: N` / `ce: N` / `de: N`, kernel
//!   drivers/gpu/drm/amd/amdgpu/amdgpu_ras.c "AMDGPU RAS sysfs Error Count Interface"); AWS
//!   Neuron `stats/hardware/{mem_ecc_uncorrected,sram_ecc_uncorrected,
//!   mem_ecc_repairable_uncorrected}` of the neuron class device (aws-neuron-driver
//!   neuron_sysfs_metrics.c, one `%u` each); Intel Gaudi `hard_reset_cnt` of the PCI function
//!   (habanalabs sysfs.c; the driver hard-resets the device on fatal errors: it exposes no ECC
//!   counter in sysfs, ECC and RAZWI events reach only its INFO ioctl). Such a device is
//!   Healthy again when no further increase came for [`XidPolicy::recovery`] (zero: never).
//!   Also Faulty while it lasts: amdgpu answers `Query currently inaccessible` (RAS error
//!   handling or a GPU reset in progress), habanalabs `status` is `In reset`, `Needs reset` or
//!   `In reset after device release`.
//!
//! Correctable counts (`ce`, Neuron has none in sysfs, NVIDIA's corrected ECC) and AMD's
//! deferred errors (`de`) never make a device unhealthy: they are corrected or contained by the
//! hardware. A counter's first reading is its baseline: errors counted before the engine
//! started are history, not news; a counter that goes down (driver reload, GPU reset) is
//! re-based.
//!
//! Polling, not inotify: /dev and /sys seen through hostPath mounts do not reliably deliver
//! inotify events for sysfs attributes, and a stat of a few nodes and a read of a few counters
//! every few hundred ms (the front ends' `health_interval`) is cheap.

use actk_core::discover::HostRoot;
use actk_core::inventory::VendorInventory;
use actk_core::profile::Profile;
use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// What a health state is about: a device (`mig: None`) or one MIG device of a GPU.
pub type HealthKey = (u32, Option<u32>);

/// How bad a problem is for the workloads on the device. Ordered: `Lost` is worse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ProblemKind {
    /// The device is there but reported errors (an Xid, an uncorrectable error count that
    /// rose, a reset in progress).
    Faulty,
    /// The device cannot be used at all (its node or PCI function is gone, NVML lost it).
    Lost,
}

/// Why a device is unhealthy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// Lost or faulty.
    pub kind: ProblemKind,
    /// A short machine-readable cause, a valid Kubernetes label value (at most 63 characters
    /// of `[a-z0-9-]`): `device-node-gone`, `pci-gone`, `xid-79`, `ecc-uncorrected`,
    /// `ras-umc-ue`, `mem-ecc-uncorrected`, `hard-reset`, ...; the DRA driver uses it as the
    /// value of its device taints.
    pub code: String,
    /// What happened, for people (names the path or the counter and its values).
    pub reason: String,
}

impl Problem {
    /// A problem of `kind`; `code` must be a valid label value (see [`Problem::code`]).
    pub fn new(kind: ProblemKind, code: impl Into<String>, reason: impl Into<String>) -> Problem {
        Problem { kind, code: code.into(), reason: reason.into() }
    }
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.reason)
    }
}

/// Health by [`HealthKey`]: `None` when healthy, else the problem. A device-level entry applies
/// to every MIG device of that GPU too.
pub type HealthMap = BTreeMap<HealthKey, Option<Problem>>;

/// Whether the unit for `target` (device, MIG index) is unhealthy in `health`, and why.
pub fn unhealthy(health: &HealthMap, target: HealthKey) -> Option<&Problem> {
    let device = health.get(&(target.0, None)).and_then(Option::as_ref);
    let mig = target.1.and_then(|m| health.get(&(target.0, Some(m))).and_then(Option::as_ref));
    device.or(mig)
}

/// A vendor error signal of one device: a sysfs file and how to read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signal {
    /// The file's real path (resolved inside the host root once, when the probe is built).
    pub path: PathBuf,
    /// What the file holds.
    pub source: Source,
}

/// What a [`Signal`]'s file holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// An amdgpu RAS block's `<block>_err_count`: `ue: N` and `ce: N` lines (and `de: N` for
    /// UMC on newer kernels), or `Query currently inaccessible`; `ue` is watched.
    AmdRas {
        /// The RAS block (`umc`, `gfx`, `sdma`, `mmhub`, `xgmi_wafl`, ...).
        block: String,
    },
    /// A single decimal count of uncorrectable errors (or of hard resets) that is watched
    /// for increases.
    Count {
        /// [`Problem::code`] of an increase.
        code: String,
        /// What it counts, for the reason (`HBM uncorrectable ECC errors`).
        what: String,
    },
    /// habanalabs' `status` of the PCI function (`Operational`, `In reset`, `Disabled`,
    /// `Needs reset`, `In device creation`, `In reset after device release`).
    HabanaStatus,
}

/// What to check for one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    /// Device index.
    pub index: u32,
    /// Device nodes: container path, host path, major, minor.
    pub nodes: Vec<(String, PathBuf, u32, u32)>,
    /// sysfs directory of the PCI function, when it existed at discovery.
    pub pci: Option<PathBuf>,
    /// Discovery found the device but no usable node for it (discovery warned why): not
    /// usable until a later discovery finds one (the front ends look again every few seconds).
    pub no_node: bool,
    /// The vendor's error signals of this device (see the module docs), those that exist.
    pub signals: Vec<Signal>,
}

/// The RAS counter files of amdgpu (`<block>_err_count`) in the PCI function's `ras` directory.
const AMD_RAS_SUFFIX: &str = "_err_count";

/// Neuron's uncorrectable ECC counters under the class device's `stats/hardware` (name, code,
/// what they count), aws-neuron-driver neuron_sysfs_metrics.c `ecc_attrs_info_tbl`.
const NEURON_ECC: &[(&str, &str, &str)] = &[
    ("mem_ecc_uncorrected", "mem-ecc-uncorrected", "HBM uncorrectable ECC errors"),
    ("sram_ecc_uncorrected", "sram-ecc-uncorrected", "SRAM uncorrectable ECC errors"),
    ("mem_ecc_repairable_uncorrected", "mem-ecc-repairable-uncorrected", "repairable HBM uncorrectable ECC errors"),
];

/// The error signals of device `index` (PCI function `pci_bus_id`) of a vendor read by
/// discovery `discovery` (`amd`, `neuron`, `gaudi`; others have none in sysfs), whose class
/// device is `sysfs` (`/sys/class/neuron_device/neuron{index}`), under `host`.
fn signals(host: &HostRoot, discovery: &str, sysfs: Option<&str>, index: u32, pci_bus_id: Option<&str>) -> Vec<Signal> {
    let resolved = |p: &str| host.resolve(p).ok().map(|r| host.host_path(r));
    let class_dir = sysfs.map(|s| s.replace("{index}", &index.to_string()));
    let mut out = Vec::new();
    match discovery {
        "amd" => {
            let Some(bus) = pci_bus_id else { return out };
            let dir = format!("/sys/bus/pci/devices/{bus}/ras");
            let mut names = host.list_dir_matching(&dir, |n| n.ends_with(AMD_RAS_SUFFIX)).unwrap_or_default();
            names.sort();
            for n in names {
                if let Some(path) = resolved(&format!("{dir}/{n}")) {
                    let block = n.trim_end_matches(AMD_RAS_SUFFIX).to_string();
                    out.push(Signal { path, source: Source::AmdRas { block } });
                }
            }
        }
        "neuron" => {
            let Some(dir) = class_dir else { return out };
            for (name, code, what) in NEURON_ECC {
                if let Some(path) = resolved(&format!("{dir}/stats/hardware/{name}")) {
                    out.push(Signal { path, source: Source::Count { code: (*code).into(), what: (*what).into() } });
                }
            }
        }
        "gaudi" => {
            let Some(dir) = class_dir else { return out };
            if let Some(path) = resolved(&format!("{dir}/device/status")) {
                out.push(Signal { path, source: Source::HabanaStatus });
            }
            if let Some(path) = resolved(&format!("{dir}/device/hard_reset_cnt")) {
                out.push(Signal {
                    path,
                    source: Source::Count { code: "hard-reset".into(), what: "hard resets (fatal errors)".into() },
                });
            }
        }
        _ => {}
    }
    out
}

/// Probes for every device of `vendor` (discovered with `profile`), with sysfs paths under host
/// root `root`.
pub fn probes(root: &Path, profile: &Profile, vendor: &VendorInventory) -> Vec<Probe> {
    let host = HostRoot::new(root);
    vendor
        .devices
        .iter()
        .map(|d| Probe {
            index: d.index,
            nodes: d.nodes.iter().map(|n| (n.path.clone(), n.host_path.clone(), n.major, n.minor)).collect(),
            pci: d.pci_bus_id.as_ref().map(|b| root.join("sys/bus/pci/devices").join(b)).filter(|p| p.exists()),
            no_node: d.nodes.is_empty(),
            signals: signals(
                &host,
                &profile.discovery,
                profile.devices.sysfs.as_deref(),
                d.index,
                d.pci_bus_id.as_deref(),
            ),
        })
        .collect()
}

/// Linux device number (major, minor) of `rdev`, as glibc's gnu_dev_major/minor.
fn major_minor(rdev: u64) -> (u64, u64) {
    (((rdev >> 32) & 0xffff_f000) | ((rdev >> 8) & 0xfff), ((rdev >> 12) & 0xffff_ff00) | (rdev & 0xff))
}

/// Whether the device of `p` is present: `None` when its nodes and PCI function are as
/// discovery saw them, else the [`ProblemKind::Lost`] problem (naming the path).
pub fn check(p: &Probe) -> Option<Problem> {
    let lost = |code: &str, reason: String| Some(Problem::new(ProblemKind::Lost, code, reason));
    if p.no_node {
        return lost("no-device-node", "discovery found no usable device node for it".into());
    }
    for (path, host, major, minor) in &p.nodes {
        match std::fs::metadata(host) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return lost("device-node-gone", format!("device node {path} is gone ({})", host.display()));
            }
            Err(e) => return lost("device-node-unreadable", format!("device node {path} cannot be checked: {e}")),
            Ok(md) if !md.file_type().is_char_device() && !md.file_type().is_block_device() => {
                return lost("not-a-device-node", format!("{path} is no longer a device node"));
            }
            Ok(md) => {
                let (ma, mi) = major_minor(md.rdev());
                if (ma, mi) != (u64::from(*major), u64::from(*minor)) {
                    return lost(
                        "device-node-changed",
                        format!("device node {path} is now {ma}:{mi}, discovery saw {major}:{minor}"),
                    );
                }
            }
        }
    }
    if let Some(pci) = &p.pci
        && !pci.exists()
    {
        return lost("pci-gone", format!("PCI function {} is gone from sysfs", pci.display()));
    }
    None
}

/// One reading of a [`Signal`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reading {
    /// The watched count (amdgpu `ue`, a Neuron ECC count, `hard_reset_cnt`).
    Count(u64),
    /// A state that is a problem while it lasts (amdgpu `Query currently inaccessible`,
    /// habanalabs not operational), `None` for a good state.
    State(Option<Problem>),
}

/// Parses an amdgpu RAS `<block>_err_count` file: the `ue` count, or `None` for
/// `Query currently inaccessible` (the driver is handling a RAS error or resetting the GPU).
///
/// Errors: a file with neither, naming what it holds.
pub fn parse_ras(text: &str) -> Result<Option<u64>, String> {
    if text.trim_start().starts_with("Query currently inaccessible") {
        return Ok(None);
    }
    for line in text.lines() {
        if let Some((k, v)) = line.split_once(':')
            && k.trim() == "ue"
        {
            return v.trim().parse().map(Some).map_err(|_| format!("`ue` is not a count: {line:?}"));
        }
    }
    Err(format!("no `ue:` line in {:?}", text.chars().take(80).collect::<String>()))
}

/// [`Problem`] of habanalabs status `status` (as sysfs prints it, `Operational\n`), `None` when
/// the device is usable (`Operational`, or `In device creation`, which the driver counts as
/// operational).
pub fn habana_status(status: &str) -> Option<Problem> {
    let s = status.trim();
    let code = format!(
        "status-{}",
        s.to_ascii_lowercase().chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).collect::<String>()
    );
    let code: String = code.chars().take(63).collect::<String>().trim_end_matches('-').to_string();
    match s.to_ascii_lowercase().as_str() {
        "operational" | "in device creation" => None,
        "disabled" | "malfunction" => Some(Problem::new(
            ProblemKind::Lost,
            code,
            format!("habanalabs reports the device {s:?}: it failed and stays unusable until it is reset"),
        )),
        _ => Some(Problem::new(ProblemKind::Faulty, code, format!("habanalabs reports the device {s:?}"))),
    }
}

/// Reads `signal` now.
///
/// Errors: the file cannot be read or does not parse (the message names the path).
pub fn read(signal: &Signal) -> Result<Reading, String> {
    let text = std::fs::read_to_string(&signal.path).map_err(|e| format!("{}: {e}", signal.path.display()))?;
    match &signal.source {
        Source::AmdRas { block } => match parse_ras(&text).map_err(|e| format!("{}: {e}", signal.path.display()))? {
            Some(ue) => Ok(Reading::Count(ue)),
            None => Ok(Reading::State(Some(Problem::new(
                ProblemKind::Faulty,
                "ras-inaccessible",
                format!(
                    "amdgpu RAS block {block}: \"Query currently inaccessible\" (a RAS error is being handled or the GPU is resetting)"
                ),
            )))),
        },
        Source::Count { .. } => text
            .trim()
            .parse()
            .map(Reading::Count)
            .map_err(|_| format!("{}: not a count: {:?}", signal.path.display(), text.trim())),
        Source::HabanaStatus => Ok(Reading::State(habana_status(&text))),
    }
}

/// The error counters of a set of probes across polls: each counter's last value and each
/// device's last increase (see the module docs for the policy).
#[derive(Debug, Default)]
pub struct Counters {
    last: BTreeMap<(u32, usize), u64>,
    hits: BTreeMap<u32, (Problem, Instant)>,
    warned: BTreeSet<(u32, usize)>,
}

impl Counters {
    /// Reads every signal of `probes` at `now`: the [`ProblemKind::Faulty`] problem of each
    /// device whose uncorrectable count rose within `recovery` (zero: ever) or whose state is
    /// bad now.
    pub fn observe(&mut self, probes: &[Probe], recovery: Duration, now: Instant) -> BTreeMap<u32, Problem> {
        let mut out = BTreeMap::new();
        for p in probes {
            for (i, s) in p.signals.iter().enumerate() {
                let key = (p.index, i);
                match read(s) {
                    Err(e) => {
                        // Transient (a reset rewrites the file) or gone with the device, which
                        // the presence probe reports; said once.
                        if self.warned.insert(key) {
                            tracing::debug!("device {}: error counter not read: {e}", p.index);
                        }
                    }
                    Ok(Reading::State(state)) => {
                        if let Some(problem) = state {
                            out.entry(p.index).or_insert(problem);
                        }
                    }
                    Ok(Reading::Count(v)) => {
                        self.warned.remove(&key);
                        let before = self.last.insert(key, v);
                        if let Some(b) = before
                            && v > b
                        {
                            let (code, what) = match &s.source {
                                Source::AmdRas { block } => (
                                    format!("ras-{}-ue", block.replace('_', "-")),
                                    format!("amdgpu RAS {block} uncorrectable errors"),
                                ),
                                Source::Count { code, what } => (code.clone(), what.clone()),
                                Source::HabanaStatus => continue,
                            };
                            let problem = Problem::new(
                                ProblemKind::Faulty,
                                code,
                                format!("{what} rose from {b} to {v} ({})", s.path.display()),
                            );
                            self.hits.insert(p.index, (problem, now));
                        }
                    }
                }
            }
        }
        self.hits.retain(|_, (_, t)| recovery.is_zero() || now.saturating_duration_since(*t) < recovery);
        for (index, (problem, _)) in &self.hits {
            out.entry(*index).or_insert_with(|| problem.clone());
        }
        out
    }
}

/// Application Xids that say nothing about the GPU's health (NVIDIA device plugin
/// `internal/rm/health.go`): 13 graphics engine exception, 31 GPU memory page fault, 43 GPU
/// stopped processing, 45 preemptive cleanup, 68 video processor exception, 109 context switch
/// timeout.
pub const APPLICATION_XIDS: &[u64] = &[13, 31, 43, 45, 68, 109];

/// Which Xids make a GPU Unhealthy, and for how long any error event (an Xid or a rise of an
/// uncorrectable error counter, of every vendor) keeps a device Unhealthy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XidPolicy {
    /// Xid health checks off altogether (`DP_DISABLE_HEALTHCHECKS=all` or `xids`).
    pub disabled: bool,
    /// Xids that are ignored: [`APPLICATION_XIDS`] plus the configured ones, minus the ones
    /// explicitly enabled.
    pub ignored: BTreeSet<u64>,
    /// With every Xid disabled but some explicitly enabled: only those are critical.
    pub only: Option<BTreeSet<u64>>,
    /// How long after its last error event a device that is present (and, for a GPU, answers
    /// NVML) is Healthy again; zero: never (NVIDIA's plugin behaviour for Xids).
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

/// What the NVML watch found: key -> (problem, when the last error event came; `None` for a
/// GPU that does not answer NVML).
type XidState = Arc<Mutex<BTreeMap<HealthKey, (Problem, Option<Instant>)>>>;

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

/// A running NVML watch (Xids, ECC counts, reachability) of one set of GPUs; the thread ends
/// within one poll after this is dropped.
#[derive(Debug)]
pub struct XidWatch {
    state: XidState,
    stop: Arc<AtomicBool>,
}

impl Drop for XidWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The longest [`spawn_xid_watch`] waits for its NVML event set to be registered: nvmlInit
/// on an 8-GPU node without persistence mode takes seconds (each GPU is initialised).
pub const XID_ARM_WAIT: Duration = Duration::from_secs(10);

/// Start the NVML watch of `gpus` under `root` in a thread: critical Xids, rises of the
/// volatile uncorrected ECC count, GPUs NVML cannot reach; its findings are merged into the
/// [`HealthMap`] of a [`Monitor`]. `None` when the policy disables Xid checks or there is
/// nothing to watch. NVML that cannot be loaded is logged and leaves health to the probes.
///
/// Returns once the watch is armed (its NVML event set registered; NVML drops Xids raised
/// before that), once it failed, or after [`XID_ARM_WAIT`], whichever is first: a device the
/// caller then reports healthy is watched from that moment on.
pub fn spawn_xid_watch(root: &Path, gpus: Vec<WatchedGpu>, policy: XidPolicy, poll: Duration) -> Option<XidWatch> {
    if policy.disabled || gpus.is_empty() {
        if policy.disabled {
            tracing::info!("Xid health checks disabled (DP_DISABLE_HEALTHCHECKS)");
        }
        return None;
    }
    let state: XidState = Arc::new(Mutex::new(BTreeMap::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let (shared, stopped) = (state.clone(), stop.clone());
    let root = root.to_path_buf();
    let (armed_tx, armed_rx) = std::sync::mpsc::sync_channel::<()>(1);
    let spawned = std::thread::Builder::new().name("xid-watch".into()).spawn(move || {
        let host = HostRoot::new(&root);
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
                let problem = Problem::new(
                    ProblemKind::Faulty,
                    format!("xid-{}", ev.xid),
                    format!("Xid {} (critical) reported by NVML", ev.xid),
                );
                s.insert((g.index, mig), (problem, Some(Instant::now())));
            }
        };
        let mut ecc: BTreeMap<u32, u64> = BTreeMap::new();
        let mut on_tick = |probe: actk_core::discover::nvml::Probe<'_>| {
            let Ok(mut s) = shared.lock() else { return };
            for g in &gpus {
                match probe(&g.uuid) {
                    Err(why) => {
                        s.entry((g.index, None)).or_insert_with(|| {
                            let p = Problem::new(
                                ProblemKind::Lost,
                                "nvml-unreachable",
                                format!("NVML cannot reach the GPU: {why}"),
                            );
                            (p, None)
                        });
                    }
                    Ok(now) => {
                        // Reachable again: a lost GPU recovers at once, an error event after
                        // the quiet time.
                        s.retain(|(dev, _), (_, since)| {
                            *dev != g.index
                                || since.is_some_and(|t| policy.recovery.is_zero() || t.elapsed() < policy.recovery)
                        });
                        let Some(count) = now.uncorrected_ecc else { continue };
                        if let Some(before) = ecc.insert(g.index, count)
                            && count > before
                        {
                            tracing::warn!(
                                "GPU {}: uncorrected ECC errors rose from {before} to {count}: marking it unhealthy",
                                g.index
                            );
                            let p = Problem::new(
                                ProblemKind::Faulty,
                                "ecc-uncorrected",
                                format!("NVML: volatile uncorrected ECC errors rose from {before} to {count}"),
                            );
                            s.insert((g.index, None), (p, Some(Instant::now())));
                        }
                    }
                }
            }
        };
        let stop = || stopped.load(Ordering::Relaxed);
        let mut armed = || {
            let _ = armed_tx.try_send(());
        };
        let watched =
            actk_core::discover::nvml::watch_xids(&host, &uuids, poll, &stop, &mut armed, &mut on_event, &mut on_tick);
        if let Err(e) = watched {
            tracing::warn!("Xid watch not running: {e}; GPU health comes from device nodes and sysfs only");
        }
    });
    if let Err(e) = spawned {
        tracing::warn!("Xid watch thread not started: {e}");
        return None;
    }
    // Ok: armed; Disconnected: the watch failed (and said why); Timeout: NVML is slow to load.
    if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = armed_rx.recv_timeout(XID_ARM_WAIT) {
        tracing::warn!(
            "Xid watch not armed after {XID_ARM_WAIT:?} (NVML slow to initialise?); Xids raised before it is are not seen"
        );
    }
    Some(XidWatch { state, stop })
}

/// How a [`Monitor`] judges.
#[derive(Debug, Clone)]
pub struct HealthOptions {
    /// Which Xids count, and the recovery time of every error event.
    pub policy: XidPolicy,
    /// Poll period of the NVML watch (the front end's health interval).
    pub poll: Duration,
}

/// The health engine of one vendor's devices: presence probes, error counters, and (NVIDIA)
/// the NVML watch, judged together on each [`Monitor::check`].
#[derive(Debug)]
pub struct Monitor {
    probes: Vec<Probe>,
    counters: Counters,
    xids: Option<XidWatch>,
    recovery: Duration,
}

impl Monitor {
    /// The engine for `vendor` (discovered with `profile`) under host root `root`; starts the
    /// NVML watch for a vendor of discovery `nvidia`.
    pub fn new(root: &Path, profile: &Profile, vendor: &VendorInventory, opts: &HealthOptions) -> Monitor {
        let probes = probes(root, profile, vendor);
        let signals: usize = probes.iter().map(|p| p.signals.len()).sum();
        if signals > 0 {
            tracing::info!("{}: watching {signals} error counter(s) of {} device(s)", vendor.kind, probes.len());
        }
        let xids = (profile.discovery == "nvidia")
            .then(|| spawn_xid_watch(root, watched_gpus(vendor), opts.policy.clone(), opts.poll))
            .flatten();
        Monitor::from_parts(probes, xids, opts.policy.recovery)
    }

    /// An engine over given probes (no NVML watch unless `xids`), for tests and benches.
    pub fn from_parts(probes: Vec<Probe>, xids: Option<XidWatch>, recovery: Duration) -> Monitor {
        Monitor { probes, counters: Counters::default(), xids, recovery }
    }

    /// The probes.
    pub fn probes(&self) -> &[Probe] {
        &self.probes
    }

    /// Health of every device (and of MIG devices the NVML watch named) now.
    pub fn check(&mut self) -> HealthMap {
        self.check_at(Instant::now())
    }

    /// [`Monitor::check`] as of `now` (error events older than the recovery time are over).
    pub fn check_at(&mut self, now: Instant) -> HealthMap {
        let faults = self.counters.observe(&self.probes, self.recovery, now);
        let mut m: HealthMap =
            self.probes.iter().map(|p| ((p.index, None), check(p).or_else(|| faults.get(&p.index).cloned()))).collect();
        if let Some(x) = &self.xids
            && let Ok(x) = x.state.lock()
        {
            for (key, (problem, _)) in x.iter() {
                let e = m.entry(*key).or_insert(None);
                if e.as_ref().is_none_or(|old| old.kind < problem.kind) {
                    *e = Some(problem.clone());
                }
            }
        }
        m
    }
}

/// Starts the polling loop of `monitor` on the current tokio runtime and returns the channel
/// carrying the latest [`HealthMap`]; a new value is sent only when some device changed, and
/// each change is logged with `name` (the vendor's kind). The loop ends when every receiver is
/// dropped.
pub fn spawn(name: String, mut monitor: Monitor, interval: Duration) -> watch::Receiver<HealthMap> {
    let (tx, rx) = watch::channel(monitor.check());
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = tx.closed() => break,
            }
            let mut now = monitor.check();
            let old = tx.borrow().clone();
            // A MIG entry that went away is healthy now: keep it as None so the change is seen.
            for key in old.keys() {
                now.entry(*key).or_insert(None);
            }
            if now != old {
                log_changes(&name, &old, &now);
                let _ = tx.send(now);
            }
        }
    });
    rx
}

/// Logs every key whose health differs between `old` and `now`.
pub fn log_changes(name: &str, old: &HealthMap, now: &HealthMap) {
    for (key, state) in now {
        if old.get(key).cloned().flatten() != *state {
            let what = match key.1 {
                Some(m) => format!("MIG device {}:{m}", key.0),
                None => format!("device {}", key.0),
            };
            match state {
                Some(p) => tracing::warn!("{name} {what} is unhealthy: {} [{}]", p.reason, p.code),
                None => tracing::info!("{name} {what} is healthy again"),
            }
        }
    }
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
            signals: vec![],
        };
        let why = |p: &Probe| check(p).map(|x| (x.kind, x.code, x.reason));
        assert_eq!(check(&p), None);
        let none = Probe { nodes: vec![], no_node: true, ..p.clone() };
        assert!(check(&none).unwrap().reason.contains("no usable device node"));
        std::fs::remove_dir(&pci).unwrap();
        let (kind, code, reason) = why(&p).unwrap();
        assert!(kind == ProblemKind::Lost && code == "pci-gone" && reason.contains("PCI function"), "{reason}");
        std::fs::create_dir(&pci).unwrap();
        std::fs::remove_file(&node).unwrap();
        assert_eq!(
            why(&p).unwrap(),
            (
                ProblemKind::Lost,
                "device-node-gone".into(),
                format!("device node /dev/npu0 is gone ({})", node.display())
            )
        );
        assert!(mknod(&node, 240, 1));
        assert_eq!(check(&p).unwrap().reason, "device node /dev/npu0 is now 240:1, discovery saw 240:0");
        std::fs::remove_file(&node).unwrap();
        std::fs::write(&node, "").unwrap();
        assert_eq!(check(&p).unwrap().reason, "/dev/npu0 is no longer a device node");
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
        h.insert((0, Some(1)), Some(Problem::new(ProblemKind::Faulty, "xid-48", "Xid 48")));
        assert_eq!(unhealthy(&h, (0, Some(1))).map(|p| p.reason.as_str()), Some("Xid 48"));
        assert_eq!(unhealthy(&h, (0, Some(0))), None);
        h.insert((0, None), Some(Problem::new(ProblemKind::Lost, "device-node-gone", "node gone")));
        assert_eq!(unhealthy(&h, (0, Some(0))).map(|p| p.reason.as_str()), Some("node gone"));
    }

    #[test]
    fn amdgpu_ras_counts_parse_as_the_kernel_prints_them() {
        // amdgpu_ras_sysfs_read: "%s: %lu\n%s: %lu\n" (ue, ce), UMC with "de" on newer kernels.
        assert_eq!(parse_ras("ue: 0\nce: 1\n"), Ok(Some(0)));
        assert_eq!(parse_ras("ue: 3\nce: 12\nde: 1\n"), Ok(Some(3)));
        assert_eq!(parse_ras("Query currently inaccessible\n"), Ok(None));
        assert!(parse_ras("ce: 1\n").unwrap_err().contains("no `ue:` line"));
        assert!(parse_ras("ue: lots\n").unwrap_err().contains("not a count"));
    }

    #[test]
    fn habanalabs_status_strings_are_judged_as_the_driver_does() {
        // sysfs.c status_show: the driver's lower-case names with the first letter upper-cased.
        assert_eq!(habana_status("Operational\n"), None);
        assert_eq!(habana_status("In device creation\n"), None, "hl_device_operational counts it as operational");
        let p = habana_status("Needs reset\n").unwrap();
        assert_eq!((p.kind, p.code.as_str()), (ProblemKind::Faulty, "status-needs-reset"));
        let p = habana_status("In reset after device release\n").unwrap();
        assert_eq!(p.code, "status-in-reset-after-device-release");
        assert_eq!(habana_status("Disabled\n").unwrap().kind, ProblemKind::Lost);
    }

    /// A probe of device 0 with `signals` (no nodes to check: presence is another test's).
    fn signal_probe(signals: Vec<Signal>) -> Probe {
        Probe { index: 0, nodes: vec![], pci: None, no_node: false, signals }
    }

    #[test]
    fn a_rise_of_an_uncorrectable_count_is_faulty_until_the_quiet_time_passes() {
        let tmp = tempfile::tempdir().unwrap();
        let umc = tmp.path().join("umc_err_count");
        let hbm = tmp.path().join("mem_ecc_uncorrected");
        std::fs::write(&umc, "ue: 2\nce: 7\nde: 0\n").unwrap();
        std::fs::write(&hbm, "0\n").unwrap();
        let probes = vec![signal_probe(vec![
            Signal { path: umc.clone(), source: Source::AmdRas { block: "umc".into() } },
            Signal {
                path: hbm.clone(),
                source: Source::Count {
                    code: "mem-ecc-uncorrected".into(),
                    what: "HBM uncorrectable ECC errors".into(),
                },
            },
        ])];
        let recovery = Duration::from_secs(60);
        let mut m = Monitor::from_parts(probes, None, recovery);
        let t0 = Instant::now();
        assert_eq!(m.check_at(t0)[&(0, None)], None, "errors counted before the start are the baseline");
        std::fs::write(&umc, "ue: 2\nce: 9\nde: 1\n").unwrap();
        assert_eq!(m.check_at(t0 + Duration::from_secs(1))[&(0, None)], None, "correctable and deferred do not count");
        std::fs::write(&umc, "ue: 3\nce: 9\nde: 1\n").unwrap();
        let p = m.check_at(t0 + Duration::from_secs(2))[&(0, None)].clone().unwrap();
        assert_eq!((p.kind, p.code.as_str()), (ProblemKind::Faulty, "ras-umc-ue"));
        assert!(p.reason.contains("rose from 2 to 3") && p.reason.contains("umc_err_count"), "{}", p.reason);
        assert!(m.check_at(t0 + Duration::from_secs(61))[&(0, None)].is_some(), "still within the quiet time");
        assert_eq!(m.check_at(t0 + Duration::from_secs(63))[&(0, None)], None, "quiet for a minute: healthy");
        // A GPU reset clears the counts: re-based, not an error; the next rise is one.
        std::fs::write(&umc, "ue: 0\nce: 0\nde: 0\n").unwrap();
        assert_eq!(m.check_at(t0 + Duration::from_secs(64))[&(0, None)], None);
        std::fs::write(&hbm, "4\n").unwrap();
        let p = m.check_at(t0 + Duration::from_secs(65))[&(0, None)].clone().unwrap();
        assert_eq!(p.code, "mem-ecc-uncorrected");
        // Inaccessible while the driver handles the error: faulty while it lasts.
        std::fs::write(&umc, "Query currently inaccessible\n").unwrap();
        std::fs::write(&hbm, "4\n").unwrap();
        let mut m2 = Monitor::from_parts(m.probes().to_vec(), None, Duration::ZERO);
        assert_eq!(m2.check_at(t0).get(&(0, None)).cloned().flatten().map(|p| p.code), Some("ras-inaccessible".into()));
        std::fs::write(&umc, "ue: 0\nce: 0\n").unwrap();
        assert_eq!(m2.check_at(t0)[&(0, None)], None);
        // Recovery zero: an error is forever (NVIDIA's behaviour).
        std::fs::write(&hbm, "5\n").unwrap();
        assert!(m2.check_at(t0 + Duration::from_secs(3600 * 24))[&(0, None)].is_some());
    }

    #[test]
    fn presence_beats_counters_and_lost_beats_faulty() {
        let tmp = tempfile::tempdir().unwrap();
        let cnt = tmp.path().join("hard_reset_cnt");
        std::fs::write(&cnt, "0\n").unwrap();
        let pci = tmp.path().join("0000:33:00.0");
        std::fs::create_dir(&pci).unwrap();
        let mut probe = signal_probe(vec![Signal {
            path: cnt.clone(),
            source: Source::Count { code: "hard-reset".into(), what: "hard resets".into() },
        }]);
        probe.pci = Some(pci.clone());
        let mut m = Monitor::from_parts(vec![probe], None, Duration::from_secs(60));
        let t0 = Instant::now();
        assert_eq!(m.check_at(t0)[&(0, None)], None);
        std::fs::write(&cnt, "1\n").unwrap();
        assert_eq!(m.check_at(t0)[&(0, None)].as_ref().map(|p| p.kind), Some(ProblemKind::Faulty));
        std::fs::remove_dir(&pci).unwrap();
        assert_eq!(m.check_at(t0)[&(0, None)].as_ref().map(|p| p.code.as_str()), Some("pci-gone"));
    }

    #[test]
    fn problem_codes_are_label_values() {
        let re =
            |s: &str| s.len() <= 63 && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        for s in ["Operational", "In reset", "Disabled", "Needs reset", "In reset after device release", "???"] {
            if let Some(p) = habana_status(s) {
                assert!(re(&p.code), "{}", p.code);
            }
        }
        for (_, code, _) in NEURON_ECC {
            assert!(re(code));
        }
    }
}
