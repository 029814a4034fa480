//! The NVML seam: what only the NVIDIA driver knows (MIG instances and their UUIDs, NVLink
//! peers, Xid events, UUIDs when procfs lacks them), read through NVML (nvml-wrapper) loaded at
//! run time from the host root being discovered.
//!
//! The library is the root's own `libnvidia-ml.so.1`, found as the root's dynamic linker would
//! find it (its /etc/ld.so.cache, then the usual driver directories) and resolved inside the
//! root: on a real node the driver's library, in a driver container root (/run/nvidia/driver)
//! that root's, and in a fixture root actk's NVML test double (fixtures/nvml-double), which
//! answers from a state file modelled on a real node. Nothing is loaded at build time and
//! nothing when no caller asks: discovery reads NVML only when [`super::DiscoverOptions::nvml`]
//! is set (the CLI, CDI generation, the device plugin, and a container start that asks for a
//! MIG device), so an ordinary container start never dlopens it.
//!
//! NVML calls made (the double implements exactly these): nvmlInit_v2, nvmlShutdown,
//! nvmlSystemGetDriverVersion, nvmlDeviceGetCount_v2, nvmlDeviceGetHandleByIndex_v2,
//! nvmlDeviceGetHandleByUUID, nvmlDeviceGetUUID, nvmlDeviceGetName, nvmlDeviceGetPciInfo_v3,
//! nvmlDeviceGetMinorNumber, nvmlDeviceGetMemoryInfo_v2, nvmlDeviceGetMigMode,
//! nvmlDeviceGetMaxMigDeviceCount, nvmlDeviceGetMigDeviceHandleByIndex,
//! nvmlDeviceGetGpuInstanceId, nvmlDeviceGetComputeInstanceId, nvmlDeviceGetAttributes_v2,
//! nvmlDeviceGetGpuInstanceProfileInfo, nvmlDeviceGetGpuInstanceById, nvmlGpuInstanceGetInfo,
//! nvmlDeviceGetNvLinkState, nvmlDeviceGetNvLinkRemotePciInfo_v2,
//! nvmlDeviceGetNvLinkRemoteDeviceType, nvmlEventSetCreate, nvmlDeviceRegisterEvents,
//! nvmlEventSetWait_v2, nvmlEventSetFree, nvmlSystemGetCudaDriverVersion_v2,
//! nvmlDeviceGetCudaComputeCapability; and for the telemetry exporter ([`Telemetry`]):
//! nvmlDeviceGetUtilizationRates, nvmlDeviceGetTemperature, nvmlDeviceGetPowerUsage,
//! nvmlDeviceGetEnforcedPowerLimit, nvmlDeviceGetTotalEccErrors; and to make and remove MIG
//! instances on demand ([`dynamic`]): nvmlDeviceGetGpuInstancePossiblePlacements_v2,
//! nvmlDeviceCreateGpuInstanceWithPlacement, nvmlGpuInstanceDestroy,
//! nvmlGpuInstanceGetComputeInstanceProfileInfo, nvmlGpuInstanceCreateComputeInstance,
//! nvmlGpuInstanceGetComputeInstanceById, nvmlComputeInstanceGetInfo_v2,
//! nvmlComputeInstanceDestroy.

pub mod dynamic;
mod raw;

use super::{HostRoot, normalize_pci};
use nvml_wrapper::Nvml;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError};
use nvml_wrapper::error::NvmlError;
use std::ffi::OsStr;
use std::path::PathBuf;
use std::time::Duration;

/// The soname NVML is loaded by.
pub const LIBRARY: &str = "libnvidia-ml.so.1";

/// Directories searched when the root's ld.so.cache has no entry (x86-64 and arm64 layouts).
const LIB_DIRS: &[&str] =
    &["/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/lib64", "/usr/lib"];

/// Most NVLinks a GPU has (NVML_NVLINK_MAX_LINKS, 18 since Hopper).
pub const MAX_NVLINKS: u32 = 18;

/// GPU instance profile indexes of nvml.h (`NVML_GPU_INSTANCE_PROFILE_*`) asked for when
/// mapping a GI's profile id back to its index (the index tells `+me` and other variants).
const GI_PROFILE_INDEXES: std::ops::Range<u32> = 0..17;

/// Why NVML could not be used under a root.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum NvmlLoadError {
    /// No libnvidia-ml.so.1 under the root.
    #[error("no {LIBRARY} under {root} (looked in its /etc/ld.so.cache and {dirs})", dirs = LIB_DIRS.join(", "))]
    NotFound {
        /// The host root.
        root: String,
    },
    /// The library is there but could not be loaded or initialised.
    #[error("NVML at {library} could not be initialised: {message}")]
    Init {
        /// The library's path on this machine.
        library: String,
        /// nvml-wrapper's message (missing driver, symbol, permission).
        message: String,
    },
    /// This executable cannot load a shared library (a static musl build: the release
    /// actk-runtime) and the `actk` that reads NVML for it ([`read`]) could not.
    #[error(
        "this program is statically linked and cannot load NVML itself; reading NVML through {helper} failed: {message} (install actk next to it, or use a CDI spec from `actk cdi generate`, which lists MIG devices without NVML at container start)"
    )]
    Helper {
        /// The `actk` asked to read NVML.
        helper: String,
        /// What went wrong.
        message: String,
    },
}

/// Whether a GPU supports MIG and whether it is on (`nvmlDeviceGetMigMode` current mode).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub enum MigMode {
    /// The GPU has no MIG (NOT_SUPPORTED), or NVML could not say.
    #[default]
    Unsupported,
    /// MIG capable, off.
    Disabled,
    /// MIG on: the GPU is used through its MIG devices.
    Enabled,
}

/// A MIG device (one compute instance of one GPU instance) as NVML describes it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MigInfo {
    /// MIG device index on its GPU (`nvmlDeviceGetMigDeviceHandleByIndex`, `nvidia-smi -L` "Device N").
    pub index: u32,
    /// `MIG-xxxxxxxx-...`.
    pub uuid: String,
    /// GPU instance id.
    pub gpu_instance: u32,
    /// Compute instance id within the GPU instance.
    pub compute_instance: u32,
    /// GPU instance profile id (`nvidia-smi mig -lgip` ID).
    pub gi_profile_id: u32,
    /// The profile name, as NVIDIA's tools derive it (`3g.40gb`, `1c.3g.40gb`, `1g.10gb+me`).
    pub profile: String,
    /// First memory slice of the GPU instance.
    pub placement_start: u32,
    /// Memory slices of the GPU instance.
    pub placement_size: u32,
    /// Memory of the GPU instance in MiB.
    pub memory_mib: u64,
    /// Streaming multiprocessors of the compute instance.
    pub multiprocessors: u32,
    /// Engines of the GPU instance by name (`copyEngines`, `decoders`, `encoders`,
    /// `jpegEngines`, `ofaEngines`; nvmlDeviceAttributes_t `shared*Count`), zero counts left out.
    pub engines: std::collections::BTreeMap<String, u32>,
}

/// Where one NVLink leads.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum LinkPeer {
    /// Another GPU, by its PCI bus id (long form).
    Gpu(String),
    /// An NVSwitch, by its PCI bus id: every GPU on the same switches is a peer.
    Switch(String),
}

/// One GPU as NVML describes it.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct GpuInfo {
    /// NVML index (PCI bus order).
    pub index: u32,
    /// `GPU-...`.
    pub uuid: Option<String>,
    /// PCI bus id, long lower-case form `0000:07:00.0`.
    pub pci_bus_id: Option<String>,
    /// Product name.
    pub name: Option<String>,
    /// Minor of /dev/nvidiaN.
    pub minor: Option<u32>,
    /// Total memory in MiB.
    pub memory_mib: Option<u64>,
    /// MIG mode.
    pub mig: MigMode,
    /// MIG devices in index order (empty unless MIG is on).
    pub mig_devices: Vec<MigInfo>,
    /// Active NVLinks: (link number, where it leads).
    pub nvlinks: Vec<(u32, LinkPeer)>,
    /// CUDA compute capability (major, minor): `9.0` for Hopper (nvmlDeviceGetCudaComputeCapability).
    #[serde(default)]
    pub compute_capability: Option<(u32, u32)>,
}

/// What NVML said about a node.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Snapshot {
    /// The library that answered (a path on this machine).
    pub library: PathBuf,
    /// `nvmlSystemGetDriverVersion`.
    pub driver_version: Option<String>,
    /// The CUDA version the driver supports, as NVML encodes it (`13000` = 13.0;
    /// `nvmlSystemGetCudaDriverVersion_v2`, nvidia-smi's "CUDA Version").
    #[serde(default)]
    pub cuda_driver_version: Option<i32>,
    /// GPUs in NVML index order.
    pub gpus: Vec<GpuInfo>,
    /// Calls that failed, one sentence each (a lost GPU, an unsupported query).
    pub problems: Vec<String>,
}

/// The root's libnvidia-ml.so.1 as a path on this machine (resolved inside the root), or `None`.
pub fn library_path(host: &HostRoot) -> Option<PathBuf> {
    let from_cache = host.read("/etc/ld.so.cache").ok().and_then(|b| crate::ldcache::parse(&b).ok()).and_then(|c| {
        c.into_iter().find(|e| e.key == LIBRARY && e.arch() != crate::ldcache::LibArch::I386).map(|e| e.path)
    });
    let candidates = from_cache.into_iter().chain(LIB_DIRS.iter().map(|d| format!("{d}/{LIBRARY}")));
    for c in candidates {
        if let Ok(real) = host.resolve(&c) {
            let p = host.host_path(&real);
            if p.is_file() {
                return Some(p);
            }
        }
    }
    None
}

/// Load and initialise the root's NVML. Errors: no library under the root, or it does not
/// initialise (no driver loaded, symbols missing).
pub fn open(host: &HostRoot) -> Result<Nvml, NvmlLoadError> {
    let lib = library_path(host).ok_or_else(|| NvmlLoadError::NotFound { root: host.root().display().to_string() })?;
    Nvml::builder()
        .lib_path(OsStr::new(&lib))
        .init()
        .map_err(|e| NvmlLoadError::Init { library: lib.display().to_string(), message: e.to_string() })
}

/// Read every GPU, its MIG devices and NVLinks from `nvml`. Never fails: a query that fails is
/// recorded in [`Snapshot::problems`] and the rest goes on.
pub fn snapshot(nvml: &Nvml, library: PathBuf) -> Snapshot {
    let mut s = Snapshot {
        library,
        driver_version: nvml.sys_driver_version().ok(),
        cuda_driver_version: nvml.sys_cuda_driver_version().ok(),
        ..Default::default()
    };
    let count = match nvml.device_count() {
        Ok(c) => c,
        Err(e) => {
            s.problems.push(format!("nvmlDeviceGetCount: {e}"));
            return s;
        }
    };
    for index in 0..count {
        let dev = match nvml.device_by_index(index) {
            Ok(d) => d,
            Err(e) => {
                s.problems.push(format!("GPU {index}: {e}"));
                s.gpus.push(GpuInfo { index, ..Default::default() });
                continue;
            }
        };
        let mut g = GpuInfo {
            index,
            uuid: dev.uuid().ok(),
            pci_bus_id: dev.pci_info().ok().and_then(|p| normalize_pci(&p.bus_id)),
            name: dev.name().ok(),
            minor: dev.minor_number().ok(),
            memory_mib: dev.memory_info().ok().map(|m| m.total >> 20),
            compute_capability: dev
                .cuda_compute_capability()
                .ok()
                .and_then(|c| Some((u32::try_from(c.major).ok()?, u32::try_from(c.minor).ok()?))),
            ..Default::default()
        };
        g.mig = match dev.mig_mode() {
            Ok(m) if m.current == 1 => MigMode::Enabled,
            Ok(_) => MigMode::Disabled,
            Err(_) => MigMode::Unsupported,
        };
        if g.mig == MigMode::Enabled {
            g.mig_devices = mig_devices(&dev, g.memory_mib, &mut s.problems);
        }
        g.nvlinks = nvlinks(&dev);
        s.gpus.push(g);
    }
    s
}

fn mig_devices(gpu: &nvml_wrapper::Device<'_>, total_mib: Option<u64>, problems: &mut Vec<String>) -> Vec<MigInfo> {
    let max = gpu.mig_device_count().unwrap_or(7);
    // GI profile id -> profile index (what tells 1g.10gb from 1g.10gb+me).
    let profiles: Vec<(u32, u32)> =
        GI_PROFILE_INDEXES.filter_map(|i| gpu.profile_info(i).ok().map(|p| (p.id, i))).collect();
    let mut out = Vec::new();
    for index in 0..max {
        let mig = match gpu.mig_device_by_index(index) {
            Ok(m) => m,
            Err(NvmlError::NotFound) => continue,
            Err(e) => {
                problems.push(format!("MIG device {index}: {e}"));
                continue;
            }
        };
        let (Ok(uuid), Ok(gi), Ok(ci)) = (mig.uuid(), raw::gpu_instance_id(&mig), raw::compute_instance_id(&mig))
        else {
            problems.push(format!("MIG device {index}: UUID or instance ids unreadable"));
            continue;
        };
        let attrs = mig.attributes().ok();
        let info = raw::gpu_instance_info(gpu, gi).ok();
        let gi_slices = attrs.as_ref().map_or(0, |a| a.gpu_instance_slice_count);
        let ci_slices = attrs.as_ref().map_or(0, |a| a.compute_instance_slice_count);
        let memory_mib = attrs.as_ref().map_or(0, |a| a.memory_size_mb);
        let gi_profile_id = info.map_or(u32::MAX, |i| i.profile_id);
        let profile_index = profiles.iter().find(|(id, _)| *id == gi_profile_id).map(|(_, i)| *i);
        let profile = match total_mib {
            Some(total) if gi_slices > 0 => profile_name(profile_index, gi_slices, ci_slices, memory_mib, total),
            _ => String::new(),
        };
        out.push(MigInfo {
            index,
            uuid,
            gpu_instance: gi,
            compute_instance: ci,
            gi_profile_id,
            profile,
            placement_start: info.map_or(0, |i| i.start),
            placement_size: info.map_or(0, |i| i.size),
            memory_mib,
            multiprocessors: attrs.as_ref().map_or(0, |a| a.multiprocessor_count),
            engines: attrs
                .as_ref()
                .map(|a| {
                    engines(
                        a.shared_copy_engine_count,
                        a.shared_decoder_count,
                        a.shared_encoder_count,
                        a.shared_jpeg_count,
                        a.shared_ofa_count,
                    )
                })
                .unwrap_or_default(),
        });
    }
    out
}

/// Engine counts by name as [`MigInfo::engines`] has them (`copyEngines`, `decoders`,
/// `encoders`, `jpegEngines`, `ofaEngines`), zero counts left out.
fn engines(copy: u32, dec: u32, enc: u32, jpeg: u32, ofa: u32) -> std::collections::BTreeMap<String, u32> {
    [("copyEngines", copy), ("decoders", dec), ("encoders", enc), ("jpegEngines", jpeg), ("ofaEngines", ofa)]
        .into_iter()
        .filter(|(_, n)| *n > 0)
        .map(|(k, n)| (k.to_string(), n))
        .collect()
}

fn nvlinks(gpu: &nvml_wrapper::Device<'_>) -> Vec<(u32, LinkPeer)> {
    let mut out = Vec::new();
    for link in 0..MAX_NVLINKS {
        let l = gpu.link_wrapper_for(link);
        if !matches!(l.is_active(), Ok(true)) {
            continue;
        }
        let Some(bus) = l.remote_pci_info().ok().and_then(|p| normalize_pci(&p.bus_id)) else { continue };
        const SWITCH: u32 = 2; // NVML_NVLINK_DEVICE_TYPE_SWITCH
        let peer = match raw::nvlink_remote_type(gpu, link) {
            Ok(SWITCH) => LinkPeer::Switch(bus),
            _ => LinkPeer::Gpu(bus),
        };
        out.push((link, peer));
    }
    out
}

/// The MIG profile name NVIDIA's tools (go-nvlib `MigProfileInfo.String`, nvidia-smi) give a
/// MIG device: `<g>g.<gb>gb` when the compute instance spans the GPU instance, else
/// `<c>c.<g>g.<gb>gb`, with the variant of the GI profile index as suffix (`+me` for the
/// REV1 media-extension profiles, `+gfx`, `-me`, `+me.all` on newer boards). `gb` is the GI
/// memory as a fraction of the GPU's, rounded up to eighths, times the GPU's memory in whole
/// GiB (go-nvlib `getMigMemorySizeGB`), so a 9856 MiB instance of an 81920 MiB A100 is `10gb`.
pub fn profile_name(
    gi_profile_index: Option<u32>,
    gi_slices: u32,
    ci_slices: u32,
    mig_mib: u64,
    total_mib: u64,
) -> String {
    let suffix = match gi_profile_index {
        Some(7 | 8) => "+me",
        Some(10..=12) => "+gfx",
        Some(13 | 14) => "-me",
        Some(15 | 16) => "+me.all",
        _ => "",
    };
    let total_gib = total_mib.div_ceil(1024) as f64;
    let frac = if total_mib == 0 { 0.0 } else { mig_mib as f64 / total_mib as f64 };
    let frac = (frac * 8.0).ceil() / 8.0;
    let gb = (frac * total_gib).round() as u64;
    if ci_slices == gi_slices || ci_slices == 0 {
        format!("{gi_slices}g.{gb}gb{suffix}")
    } else {
        format!("{ci_slices}c.{gi_slices}g.{gb}gb{suffix}")
    }
}

/// Whether this executable can load a shared library. musl's `dlopen` in a statically linked
/// program always fails ("Dynamic loading not supported"), and the release actk-runtime and
/// actk-hook are static musl builds (scripts/build-release.sh).
pub const CAN_LOAD_LIBRARIES: bool = !cfg!(all(target_env = "musl", target_feature = "crt-static"));

/// Read a root's NVML: in this process ([`read_here`]) when it can load libraries, else through
/// the `actk` installed next to this executable ([`read_through`]), which prints what
/// [`read_here`] answers there as JSON (`actk system nvml-snapshot`).
pub fn read(host: &HostRoot) -> Result<Snapshot, NvmlLoadError> {
    if CAN_LOAD_LIBRARIES {
        return read_here(host);
    }
    let helper = std::env::current_exe().ok().and_then(|e| Some(e.parent()?.join("actk"))).unwrap_or_default();
    read_through(&helper, host)
}

/// Read a root's NVML in this process: [`open`] then [`snapshot`].
pub fn read_here(host: &HostRoot) -> Result<Snapshot, NvmlLoadError> {
    let nvml = open(host)?;
    let lib = library_path(host).unwrap_or_default();
    Ok(snapshot(&nvml, lib))
}

/// Read a root's NVML through `actk` at `helper`: `actk system nvml-snapshot --root ROOT`,
/// run with an empty environment but for a fixed `PATH` (nothing of this process's environment
/// reaches it), no stdin, its stdout the JSON of [`read_here`]'s `Result` there. Errors: that
/// answer's own error, or [`NvmlLoadError::Helper`] when the helper is missing, fails or
/// answers something else.
pub fn read_through(helper: &std::path::Path, host: &HostRoot) -> Result<Snapshot, NvmlLoadError> {
    let fail = |message: String| NvmlLoadError::Helper { helper: helper.display().to_string(), message };
    let out = std::process::Command::new(helper)
        .args(["--log-level", "error", "system", "nvml-snapshot", "--root"])
        .arg(host.root())
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| fail(format!("cannot run it: {e}")))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(fail(format!("it exited with {}: {}", out.status, err.trim())));
    }
    serde_json::from_slice::<Result<Snapshot, NvmlLoadError>>(&out.stdout)
        .map_err(|e| fail(format!("its answer is not an NVML snapshot: {e}")))?
}

/// What the tick of [`watch_xids`] learns of one GPU that answers NVML.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GpuState {
    /// Uncorrected ECC errors of the GPU's memory since the driver loaded or the GPU was reset
    /// (`nvmlDeviceGetTotalEccErrors(NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC)`,
    /// `nvidia-smi -q -d ECC` "Volatile ... Uncorrectable"); `None` where ECC is off or
    /// the GPU does not count them (NVML_ERROR_NOT_SUPPORTED).
    pub uncorrected_ecc: Option<u64>,
}

/// Says whether the GPU with a UUID answers NVML, and its [`GpuState`] (`Err(why)` when it is
/// lost); given to the tick callback of [`watch_xids`].
pub type Probe<'a> = &'a dyn Fn(&str) -> Result<GpuState, String>;

/// An Xid error event (`nvmlEventTypeXidCriticalError`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XidEvent {
    /// UUID of the GPU it happened on.
    pub gpu_uuid: String,
    /// The Xid (NVIDIA's Xid catalogue: 79 = fallen off the bus, 48 = double-bit ECC, ...).
    pub xid: u64,
    /// GPU instance id when the driver attributed it to a MIG device.
    pub gpu_instance: Option<u32>,
    /// Compute instance id, likewise.
    pub compute_instance: Option<u32>,
}

/// Watch Xid events of the GPUs with UUIDs `gpus` under `host` until `stop()` is true, calling
/// `armed` once the event set is registered (NVML delivers only events raised after that, so a
/// caller that must not miss one waits for it), `on_event` for each event, and `on_tick` after
/// every wait (about every `poll`) with a probe function that says whether a GPU answers NVML
/// and what its ECC counters say (`Err(why)` when lost). Blocks the calling thread; meant for
/// a thread of its own.
///
/// Errors: NVML cannot be loaded or no GPU accepts event registration.
pub fn watch_xids(
    host: &HostRoot,
    gpus: &[String],
    poll: Duration,
    stop: &dyn Fn() -> bool,
    armed: &mut dyn FnMut(),
    on_event: &mut dyn FnMut(XidEvent),
    on_tick: &mut dyn FnMut(Probe<'_>),
) -> Result<(), String> {
    let nvml = open(host).map_err(|e| e.to_string())?;
    let new_set = || nvml.create_event_set().map_err(|e| format!("nvmlEventSetCreate: {e}"));
    let mut set = new_set()?;
    // GPUs registered in `set` so far.
    let mut watched: Vec<&str> = Vec::new();
    for uuid in gpus {
        let dev = match nvml.device_by_uuid(uuid.as_str()) {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!("Xid watch: GPU {uuid}: {e}");
                continue;
            }
        };
        set = match dev.register_events(EventTypes::CRITICAL_XID_ERROR, set) {
            Ok(s) => {
                watched.push(uuid);
                s
            }
            Err(e) => {
                // A GPU without Xid events (NOT_SUPPORTED: a vGPU, an old board) is left out, as
                // NVIDIA's device plugin leaves it out. nvml-wrapper frees the set on every
                // error, so the GPUs registered before it go into a new one.
                tracing::warn!(
                    "Xid watch: GPU {uuid} does not report Xid events: {e}; its health comes from its nodes"
                );
                let mut again = new_set()?;
                for w in &watched {
                    let d = nvml.device_by_uuid(*w).map_err(|e| format!("Xid watch: GPU {w}: {e}"))?;
                    again = d
                        .register_events(EventTypes::CRITICAL_XID_ERROR, again)
                        .map_err(|e| format!("Xid watch: registering GPU {w} again: {e}"))?;
                }
                again
            }
        };
    }
    if watched.is_empty() {
        return Err("no GPU accepted Xid event registration".into());
    }
    armed();
    let probe = |uuid: &str| -> Result<GpuState, String> {
        let dev = nvml.device_by_uuid(uuid).map_err(|e| e.to_string())?;
        dev.pci_info().map_err(|e| e.to_string())?;
        let uncorrected_ecc = match dev.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile) {
            Ok(n) => Some(n),
            Err(NvmlError::GpuLost) => return Err(NvmlError::GpuLost.to_string()),
            Err(_) => None,
        };
        Ok(GpuState { uncorrected_ecc })
    };
    let timeout = u32::try_from(poll.as_millis()).unwrap_or(u32::MAX).max(1);
    while !stop() {
        match raw::wait(&set, timeout) {
            Ok(ev) if ev.event_type & EventTypes::CRITICAL_XID_ERROR.bits() != 0 => {
                if let Ok(gpu_uuid) = ev.device.uuid() {
                    on_event(XidEvent {
                        gpu_uuid,
                        xid: ev.data,
                        gpu_instance: ev.gpu_instance,
                        compute_instance: ev.compute_instance,
                    });
                }
            }
            Ok(_) | Err(NvmlError::Timeout) => {}
            Err(e) => {
                tracing::debug!("Xid watch: nvmlEventSetWait: {e}");
                std::thread::sleep(poll);
            }
        }
        on_tick(&probe);
    }
    Ok(())
}

/// One GPU's live readings through NVML, as `nvidia-smi` shows them (and dcgm-exporter's
/// DCGM_FI_DEV_GPU_UTIL, _FB_USED, _GPU_TEMP, _POWER_USAGE, _ECC_* fields). `None`: the GPU does
/// not report it (NOT_SUPPORTED: utilization of a GPU in MIG mode, a board without ECC).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuReadings {
    /// GPU utilization over the driver's last sample period, percent (nvmlDeviceGetUtilizationRates `gpu`).
    pub utilization_percent: Option<u32>,
    /// Framebuffer memory in use, bytes (nvmlDeviceGetMemoryInfo_v2 `used`).
    pub memory_used_bytes: Option<u64>,
    /// Framebuffer memory, bytes (`total`).
    pub memory_total_bytes: Option<u64>,
    /// GPU core temperature, degrees Celsius (nvmlDeviceGetTemperature, NVML_TEMPERATURE_GPU).
    pub temperature_c: Option<u32>,
    /// Power draw, milliwatts (nvmlDeviceGetPowerUsage).
    pub power_mw: Option<u32>,
    /// Enforced power limit, milliwatts (nvmlDeviceGetEnforcedPowerLimit).
    pub power_limit_mw: Option<u32>,
    /// ECC error counts (nvmlDeviceGetTotalEccErrors): corrected and uncorrected, since the
    /// driver loaded (volatile) and over the board's life (aggregate).
    pub ecc: Vec<EccCount>,
}

/// One ECC counter of [`GpuReadings::ecc`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EccCount {
    /// `corrected` (single-bit) or `uncorrected` (double-bit).
    pub kind: &'static str,
    /// `volatile` (since the driver loaded) or `aggregate` (lifetime).
    pub counter: &'static str,
    /// The count.
    pub count: u64,
}

/// An open NVML kept for repeated reads (the telemetry exporter reads every scrape; opening NVML
/// each time would cost the driver's initialisation). Not `Sync`: one reader at a time.
pub struct Telemetry {
    nvml: Nvml,
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Telemetry").finish_non_exhaustive()
    }
}

impl Telemetry {
    /// Load and initialise the root's NVML ([`open`]). Errors as [`open`].
    pub fn open(host: &HostRoot) -> Result<Telemetry, NvmlLoadError> {
        Ok(Telemetry { nvml: open(host)? })
    }

    /// The readings of the GPU with UUID `uuid`. Errors: the GPU is not found or is lost
    /// (`GPU is lost`: it fell off the bus), as NVML says it. A reading the GPU does not report
    /// is `None`, not an error.
    pub fn read(&self, uuid: &str) -> Result<GpuReadings, String> {
        use nvml_wrapper::enum_wrappers::device::TemperatureSensor;
        let dev = self.nvml.device_by_uuid(uuid).map_err(|e| e.to_string())?;
        // A GPU that fell off the bus answers GPU_IS_LOST to everything: say so once.
        let mem = match dev.memory_info() {
            Err(NvmlError::GpuLost) => return Err(NvmlError::GpuLost.to_string()),
            m => m.ok(),
        };
        let mut ecc = Vec::new();
        for (kind, k) in [("corrected", MemoryError::Corrected), ("uncorrected", MemoryError::Uncorrected)] {
            for (counter, c) in [("volatile", EccCounter::Volatile), ("aggregate", EccCounter::Aggregate)] {
                if let Ok(count) = dev.total_ecc_errors(k, c) {
                    ecc.push(EccCount { kind, counter, count });
                }
            }
        }
        Ok(GpuReadings {
            utilization_percent: dev.utilization_rates().ok().map(|u| u.gpu),
            memory_used_bytes: mem.as_ref().map(|m| m.used),
            memory_total_bytes: mem.as_ref().map(|m| m.total),
            temperature_c: dev.temperature(TemperatureSensor::Gpu).ok(),
            power_mw: dev.power_usage().ok(),
            power_limit_mw: dev.enforced_power_limit().ok(),
            ecc,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A helper script at `dir/actk` that prints `body` (after `$1..`: its arguments).
    fn helper(dir: &std::path::Path, body: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let p = dir.join("actk");
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    #[test]
    fn nvml_read_through_a_helper_gets_its_snapshot_and_none_of_this_environment() {
        let dir = tempfile::tempdir().unwrap();
        let snap = Snapshot {
            library: "/r/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.95.05".into(),
            driver_version: Some("580.95.05".into()),
            cuda_driver_version: Some(13000),
            gpus: vec![GpuInfo {
                index: 0,
                uuid: Some("GPU-1".into()),
                mig: MigMode::Enabled,
                mig_devices: vec![MigInfo {
                    index: 0,
                    uuid: "MIG-1".into(),
                    gpu_instance: 1,
                    compute_instance: 0,
                    gi_profile_id: 9,
                    profile: "3g.40gb".into(),
                    placement_start: 0,
                    placement_size: 4,
                    memory_mib: 40192,
                    multiprocessors: 42,
                    engines: Default::default(),
                }],
                nvlinks: vec![(0, LinkPeer::Switch("0000:c1:00.0".into()))],
                ..Default::default()
            }],
            problems: vec![],
        };
        let json = serde_json::to_string(&Ok::<_, NvmlLoadError>(snap.clone())).unwrap();
        // The helper answers only when it got the expected arguments and an environment of PATH
        // alone (no LD_PRELOAD or anything else of the caller's).
        let h = helper(
            dir.path(),
            &format!(
                "[ \"$*\" = \"--log-level error system nvml-snapshot --root /r\" ] || exit 3\n\
                 [ \"$(env | grep -v '^PWD=' | grep -v '^SHLVL=' | grep -v '^_=')\" = \"PATH=/usr/sbin:/usr/bin:/sbin:/bin\" ] || {{ env >&2; exit 4; }}\n\
                 echo '{json}'"
            ),
        );
        let host = HostRoot::new("/r");
        assert_eq!(read_through(&h, &host), Ok(snap));

        let h = helper(dir.path(), r#"echo '{"Err":{"NotFound":{"root":"/r"}}}'"#);
        assert_eq!(read_through(&h, &host), Err(NvmlLoadError::NotFound { root: "/r".into() }));

        for (body, says) in [("echo nonsense", "not an NVML snapshot"), ("echo broken >&2; exit 2", "broken")] {
            let h = helper(dir.path(), body);
            match read_through(&h, &host) {
                Err(NvmlLoadError::Helper { message, .. }) => assert!(message.contains(says), "{message}"),
                other => panic!("{body}: {other:?}"),
            }
        }
        match read_through(&dir.path().join("missing"), &host) {
            Err(e @ NvmlLoadError::Helper { .. }) => assert!(e.to_string().contains("actk cdi generate"), "{e}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn profile_names_follow_nvidias_rule() {
        // A100-SXM4-80GB (81920 MiB): the GI profiles' memory as NVML reports them.
        assert_eq!(profile_name(Some(0), 1, 1, 9856, 81920), "1g.10gb");
        assert_eq!(profile_name(Some(7), 1, 1, 9856, 81920), "1g.10gb+me");
        assert_eq!(profile_name(Some(9), 1, 1, 19968, 81920), "1g.20gb");
        assert_eq!(profile_name(Some(2), 3, 3, 40192, 81920), "3g.40gb");
        assert_eq!(profile_name(Some(2), 3, 1, 40192, 81920), "1c.3g.40gb");
        assert_eq!(profile_name(Some(4), 7, 7, 80384, 81920), "7g.80gb");
        // H100 80GB HBM3 (81559 MiB) and H200 (143771 MiB), `nvidia-smi mig -lgip` memory.
        assert_eq!(profile_name(Some(0), 1, 1, 9984, 81559), "1g.10gb");
        assert_eq!(profile_name(Some(4), 7, 7, 81152, 81559), "7g.80gb");
        assert_eq!(profile_name(Some(0), 1, 1, 16384, 143771), "1g.18gb");
        assert_eq!(profile_name(Some(9), 1, 1, 33024, 143771), "1g.35gb");
        assert_eq!(profile_name(Some(2), 3, 3, 71168, 143771), "3g.71gb");
        assert_eq!(profile_name(Some(4), 7, 7, 143104, 143771), "7g.141gb");
    }
}
