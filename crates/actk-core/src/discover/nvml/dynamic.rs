//! MIG devices made and removed on demand through NVML (dynamic MIG): what `nvidia-smi mig -lgipp`,
//! `-cgi PROFILE:START -C`, `-dci` and `-dgi` do, for a DRA driver that creates the MIG device a
//! claim asks for at NodePrepareResources and destroys it at NodeUnprepareResources.
//!
//! A MIG device is one compute instance (CI) of one GPU instance (GI). [`create`] makes a GI of a
//! profile at a placement and one CI spanning it, so the MIG device has the whole GI, as
//! `nvidia-smi mig -cgi P:START -C` does; [`destroy`] removes the CI and then the GI. The GPU
//! must already be in MIG mode (`nvidia-smi -i N -mig 1`, an administrator's step that needs a GPU
//! reset). Callers open NVML with [`super::open`]; the NVML calls made are listed in [`super`].

use super::{GI_PROFILE_INDEXES, engines, profile_name, raw};
use crate::inventory::MigPlacement;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};
use std::collections::BTreeMap;

/// NVML_ERROR_INSUFFICIENT_RESOURCES, which nvml-wrapper 0.13 has no variant for.
const INSUFFICIENT_RESOURCES: u32 = 23;

/// NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE ..= _6_SLICE: the compute instance profile indexes.
const CI_PROFILE_INDEXES: std::ops::Range<u32> = 0..7;

/// A GPU instance profile a GPU offers, with every placement it can have
/// (`nvidia-smi mig -lgip` and `-lgipp`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GiProfile {
    /// Profile index, `NVML_GPU_INSTANCE_PROFILE_*` of nvml.h (0 = 1 slice, 7 = 1 slice REV1 (`+me`), ...).
    pub index: u32,
    /// Profile id (`nvidia-smi mig -lgip` ID column, what NVML creates instances by).
    pub id: u32,
    /// The name NVIDIA's tools give it: `3g.40gb`, `1g.10gb+me` ([`super::profile_name`]).
    pub name: String,
    /// Compute slices.
    pub slices: u32,
    /// Most instances of this profile the GPU holds at once.
    pub instances: u32,
    /// Memory of an instance, MiB.
    pub memory_mib: u64,
    /// Streaming multiprocessors of an instance.
    pub multiprocessors: u32,
    /// Engines of an instance by name, as in [`super::MigInfo::engines`], zero counts left out.
    pub engines: BTreeMap<String, u32>,
    /// Every placement it can have on the GPU, free or taken, in NVML's order
    /// (`nvmlDeviceGetGpuInstancePossiblePlacements_v2`): first memory slice and memory slices.
    pub placements: Vec<MigPlacement>,
}

/// The MIG device [`create`] made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreatedMig {
    /// `MIG-xxxxxxxx-...`, as NVML and `nvidia-smi -L` give it.
    pub uuid: String,
    /// MIG device index on its GPU (`nvmlDeviceGetMigDeviceHandleByIndex`).
    pub index: u32,
    /// GPU instance id.
    pub gpu_instance: u32,
    /// Compute instance id within the GPU instance.
    pub compute_instance: u32,
}

/// Why a MIG device could not be listed, made or removed. Each names the GPU by UUID.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MigAdminError {
    /// The GPU has MIG off, or no MIG at all (nvmlDeviceGetMigMode).
    #[error(
        "GPU {gpu} is not in MIG mode: MIG devices can be made only on a GPU an administrator switched to MIG mode (`nvidia-smi -i <index> -mig 1`, then a GPU reset)"
    )]
    NotMigMode {
        /// GPU UUID.
        gpu: String,
    },
    /// The profile index is not one the GPU offers, or the start not one of its placements.
    #[error(
        "GPU {gpu}: MIG profile {profile} cannot start at memory slice {start} (its placements start at {possible:?}); choose one of those"
    )]
    NoSuchPlacement {
        /// GPU UUID.
        gpu: String,
        /// Profile name, or `index N` when the GPU has no such profile.
        profile: String,
        /// The start asked for.
        start: u32,
        /// The starts the profile can have (empty: no such profile).
        possible: Vec<u32>,
    },
    /// The placement overlaps an existing GPU instance, or the profile's instance count is
    /// reached (NVML_ERROR_INSUFFICIENT_RESOURCES).
    #[error(
        "GPU {gpu}: no room for MIG profile {profile} at memory slice {start} (NVML: insufficient resources): another GPU instance holds those slices or the profile's instance limit is reached; use another placement or GPU, or destroy the instance there"
    )]
    Occupied {
        /// GPU UUID.
        gpu: String,
        /// Profile name.
        profile: String,
        /// The start asked for.
        start: u32,
    },
    /// NVML refused to destroy an instance a process still uses (NVML_ERROR_IN_USE).
    #[error(
        "GPU {gpu}: MIG GPU instance {gpu_instance} is in use ({call} answered NVML_ERROR_IN_USE); stop the processes on it and retry"
    )]
    InUse {
        /// GPU UUID.
        gpu: String,
        /// GPU instance id.
        gpu_instance: u32,
        /// The NVML call that refused.
        call: &'static str,
    },
    /// Any other NVML failure.
    #[error("GPU {gpu}: {call} failed: {message}")]
    Nvml {
        /// GPU UUID.
        gpu: String,
        /// The NVML call.
        call: &'static str,
        /// NVML's message.
        message: String,
    },
}

fn nvml_err(gpu: &str, call: &'static str, e: NvmlError) -> MigAdminError {
    MigAdminError::Nvml { gpu: gpu.to_string(), call, message: e.to_string() }
}

/// The GPU with UUID `uuid`, and whether it is in MIG mode (`Err(NotMigMode)` when it has no MIG).
fn gpu<'n>(nvml: &'n Nvml, uuid: &str) -> Result<(Device<'n>, bool), MigAdminError> {
    let dev = nvml.device_by_uuid(uuid).map_err(|e| nvml_err(uuid, "nvmlDeviceGetHandleByUUID", e))?;
    match dev.mig_mode() {
        Ok(m) => Ok((dev, m.current == 1)),
        Err(NvmlError::NotSupported) => Err(MigAdminError::NotMigMode { gpu: uuid.to_string() }),
        Err(e) => Err(nvml_err(uuid, "nvmlDeviceGetMigMode", e)),
    }
}

/// The GPU with UUID `uuid`, which must be in MIG mode.
fn mig_gpu<'n>(nvml: &'n Nvml, uuid: &str) -> Result<Device<'n>, MigAdminError> {
    match gpu(nvml, uuid)? {
        (dev, true) => Ok(dev),
        (_, false) => Err(MigAdminError::NotMigMode { gpu: uuid.to_string() }),
    }
}

/// Profile `index` of `dev` with its placements; `None` when the GPU does not offer it.
fn gi_profile(dev: &Device<'_>, uuid: &str, index: u32, total_mib: u64) -> Result<Option<GiProfile>, MigAdminError> {
    let p = match dev.profile_info(index) {
        Ok(p) => p,
        Err(NvmlError::NotSupported | NvmlError::InvalidArg) => return Ok(None),
        Err(e) => return Err(nvml_err(uuid, "nvmlDeviceGetGpuInstanceProfileInfo", e)),
    };
    let placements = raw::possible_placements(dev, p.id)
        .map_err(|e| nvml_err(uuid, "nvmlDeviceGetGpuInstancePossiblePlacements_v2", e))?
        .into_iter()
        .map(|(start, size)| MigPlacement { start, size })
        .collect();
    Ok(Some(GiProfile {
        index,
        id: p.id,
        name: profile_name(Some(index), p.slice_count, p.slice_count, p.memory_size_mb, total_mib),
        slices: p.slice_count,
        instances: p.instance_count,
        memory_mib: p.memory_size_mb,
        multiprocessors: p.multiprocessor_count,
        engines: engines(p.copy_engine_count, p.decoder_count, p.encoder_count, p.jpeg_count, p.ofa_count),
        placements,
    }))
}

fn total_mib(dev: &Device<'_>, uuid: &str) -> Result<u64, MigAdminError> {
    Ok(dev.memory_info().map_err(|e| nvml_err(uuid, "nvmlDeviceGetMemoryInfo_v2", e))?.total >> 20)
}

/// Every GPU instance profile GPU `gpu_uuid` offers (profile indexes 0..17 that NVML answers),
/// sorted by index, each with all its placements.
///
/// Errors: [`MigAdminError::NotMigMode`] when the GPU is not in MIG mode; `Nvml` when the GPU
/// is not found or a query fails.
pub fn gi_profiles(nvml: &Nvml, gpu_uuid: &str) -> Result<Vec<GiProfile>, MigAdminError> {
    let dev = mig_gpu(nvml, gpu_uuid)?;
    let total = total_mib(&dev, gpu_uuid)?;
    let mut out = Vec::new();
    for index in GI_PROFILE_INDEXES {
        out.extend(gi_profile(&dev, gpu_uuid, index, total)?);
    }
    Ok(out)
}

/// Create a MIG device on GPU `gpu_uuid`: a GPU instance of profile index `profile_index`
/// (`NVML_GPU_INSTANCE_PROFILE_*`, [`GiProfile::index`]) at memory slice `placement_start`
/// (one of [`GiProfile::placements`]), then one compute instance spanning it
/// (nvmlDeviceCreateGpuInstanceWithPlacement, nvmlGpuInstanceCreateComputeInstance). Nothing is
/// left half-made: when the compute instance fails, the GPU instance is destroyed again. The
/// MIG device's UUID and index come from the GPU's MIG device handles, found by GI and CI id.
///
/// Errors: `NotMigMode`; `NoSuchPlacement` (no such profile, or not a placement of it);
/// `Occupied` (the slices are taken or the profile's instance limit is reached; nothing changed);
/// `Nvml` for any other failure.
pub fn create(
    nvml: &Nvml,
    gpu_uuid: &str,
    profile_index: u32,
    placement_start: u32,
) -> Result<CreatedMig, MigAdminError> {
    let dev = mig_gpu(nvml, gpu_uuid)?;
    let total = total_mib(&dev, gpu_uuid)?;
    let Some(profile) = gi_profile(&dev, gpu_uuid, profile_index, total)? else {
        return Err(MigAdminError::NoSuchPlacement {
            gpu: gpu_uuid.to_string(),
            profile: format!("index {profile_index}"),
            start: placement_start,
            possible: Vec::new(),
        });
    };
    let Some(placement) = profile.placements.iter().find(|p| p.start == placement_start) else {
        return Err(MigAdminError::NoSuchPlacement {
            gpu: gpu_uuid.to_string(),
            profile: profile.name,
            start: placement_start,
            possible: profile.placements.iter().map(|p| p.start).collect(),
        });
    };
    let gi = match raw::create_gpu_instance(&dev, profile.id, placement.start, placement.size) {
        Ok(gi) => gi,
        Err(NvmlError::UnexpectedVariant(INSUFFICIENT_RESOURCES)) => {
            return Err(MigAdminError::Occupied {
                gpu: gpu_uuid.to_string(),
                profile: profile.name,
                start: placement_start,
            });
        }
        Err(e) => return Err(nvml_err(gpu_uuid, "nvmlDeviceCreateGpuInstanceWithPlacement", e)),
    };
    // From here on a failure destroys what was made, and says so when that fails too.
    let undo = |gi: raw::GpuInstance<'_>, ci: Option<raw::ComputeInstance<'_>>, err: MigAdminError| {
        let ci_left = ci.map(|c| c.destroy()).and_then(Result::err);
        match (ci_left, gi.destroy()) {
            (None, Ok(())) => err,
            (ci_left, gi_left) => {
                let left = ci_left.map(|e| format!("the compute instance: {e}")).into_iter();
                let left: Vec<String> = left.chain(gi_left.err().map(|e| format!("the GPU instance: {e}"))).collect();
                match err {
                    MigAdminError::Nvml { gpu, call, message } => MigAdminError::Nvml {
                        gpu,
                        call,
                        message: format!("{message}; and destroying what was made failed: {}", left.join(", ")),
                    },
                    other => other,
                }
            }
        }
    };
    let gi_id = match gi.info() {
        Ok(i) => i.id,
        Err(e) => return Err(undo(gi, None, nvml_err(gpu_uuid, "nvmlGpuInstanceGetInfo", e))),
    };
    // The compute instance profile that spans the GPU instance.
    let ci_profile = CI_PROFILE_INDEXES.filter_map(|i| gi.compute_profile(i).ok()).find(|c| c.slices == profile.slices);
    let Some(ci_profile) = ci_profile else {
        let e = nvml_err(gpu_uuid, "nvmlGpuInstanceGetComputeInstanceProfileInfo", NvmlError::NotSupported);
        return Err(undo(gi, None, e));
    };
    let ci = match gi.create_compute_instance(ci_profile.id) {
        Ok(ci) => ci,
        Err(e) => return Err(undo(gi, None, nvml_err(gpu_uuid, "nvmlGpuInstanceCreateComputeInstance", e))),
    };
    let ci_id = match ci.id() {
        Ok(id) => id,
        Err(e) => return Err(undo(gi, Some(ci), nvml_err(gpu_uuid, "nvmlComputeInstanceGetInfo_v2", e))),
    };
    match find_mig(&dev, gi_id, ci_id) {
        Some((index, uuid)) => Ok(CreatedMig { uuid, index, gpu_instance: gi_id, compute_instance: ci_id }),
        None => {
            let e = MigAdminError::Nvml {
                gpu: gpu_uuid.to_string(),
                call: "nvmlDeviceGetMigDeviceHandleByIndex",
                message: format!("no MIG device has GPU instance {gi_id} and compute instance {ci_id}"),
            };
            Err(undo(gi, Some(ci), e))
        }
    }
}

/// Index and UUID of the MIG device of GI `gi` / CI `ci` among `gpu`'s MIG device handles.
fn find_mig(gpu: &Device<'_>, gi: u32, ci: u32) -> Option<(u32, String)> {
    (0..gpu.mig_device_count().unwrap_or(7)).find_map(|index| {
        let m = gpu.mig_device_by_index(index).ok()?;
        let ids = (raw::gpu_instance_id(&m).ok()?, raw::compute_instance_id(&m).ok()?);
        (ids == (gi, ci)).then(|| m.uuid().ok().map(|u| (index, u)))?
    })
}

/// Destroy MIG device `mig_uuid` of GPU `gpu_uuid`, found by its UUID among the GPU's MIG
/// devices (so that an id NVML has since given to another instance is never destroyed), as
/// [`destroy`] does. `Ok(false)` when there is nothing to destroy: no such MIG device any more,
/// the GPU's MIG mode off, or the GPU itself gone (not found, or lost: its instances went
/// with it). `Ok(true)` when it was destroyed.
///
/// Errors: as [`destroy`].
pub fn destroy_by_uuid(nvml: &Nvml, gpu_uuid: &str, mig_uuid: &str) -> Result<bool, MigAdminError> {
    let dev = match nvml.device_by_uuid(gpu_uuid) {
        Ok(d) => d,
        Err(NvmlError::NotFound | NvmlError::GpuLost) => return Ok(false),
        Err(e) => return Err(nvml_err(gpu_uuid, "nvmlDeviceGetHandleByUUID", e)),
    };
    if !matches!(dev.mig_mode(), Ok(m) if m.current == 1) {
        return Ok(false);
    }
    let found = (0..dev.mig_device_count().unwrap_or(7)).find_map(|index| {
        let m = dev.mig_device_by_index(index).ok()?;
        (m.uuid().ok()? == mig_uuid)
            .then(|| Some((raw::gpu_instance_id(&m).ok()?, raw::compute_instance_id(&m).ok()?)))?
    });
    match found {
        Some((gi, ci)) => destroy(nvml, gpu_uuid, gi, ci).map(|()| true),
        None => Ok(false),
    }
}

/// Whether some MIG device of `gpu` still belongs to GPU instance `gi`.
fn gi_has_migs(gpu: &Device<'_>, gi: u32) -> bool {
    (0..gpu.mig_device_count().unwrap_or(7))
        .filter_map(|index| gpu.mig_device_by_index(index).ok())
        .any(|m| raw::gpu_instance_id(&m).ok() == Some(gi))
}

/// Destroy MIG device `gpu_instance`/`compute_instance` of GPU `gpu_uuid`: the compute instance
/// (nvmlComputeInstanceDestroy), then the GPU instance (nvmlGpuInstanceDestroy) unless other
/// compute instances of it remain. Idempotent, as NodeUnprepareResources may be retried: an
/// instance already gone is `Ok`, and so is a GPU whose MIG mode is now off (no instance exists).
///
/// Errors: `NotMigMode` for a GPU without MIG; `InUse` when NVML refuses because a process
/// still uses the instance; `Nvml` for any other failure.
pub fn destroy(nvml: &Nvml, gpu_uuid: &str, gpu_instance: u32, compute_instance: u32) -> Result<(), MigAdminError> {
    let (dev, mig_on) = gpu(nvml, gpu_uuid)?;
    if !mig_on {
        return Ok(());
    }
    let gi = match raw::gpu_instance(&dev, gpu_instance) {
        Ok(gi) => gi,
        Err(NvmlError::NotFound) => return Ok(()),
        Err(e) => return Err(nvml_err(gpu_uuid, "nvmlDeviceGetGpuInstanceById", e)),
    };
    let in_use = |call| MigAdminError::InUse { gpu: gpu_uuid.to_string(), gpu_instance, call };
    match gi.compute_instance(compute_instance) {
        Ok(ci) => match ci.destroy() {
            Ok(()) => {}
            Err(NvmlError::InUse) => return Err(in_use("nvmlComputeInstanceDestroy")),
            Err(e) => return Err(nvml_err(gpu_uuid, "nvmlComputeInstanceDestroy", e)),
        },
        Err(NvmlError::NotFound) => {}
        Err(e) => return Err(nvml_err(gpu_uuid, "nvmlGpuInstanceGetComputeInstanceById", e)),
    }
    if gi_has_migs(&dev, gpu_instance) {
        return Ok(());
    }
    match gi.destroy() {
        Ok(()) => Ok(()),
        Err(NvmlError::InUse) => Err(in_use("nvmlGpuInstanceDestroy")),
        Err(e) => Err(nvml_err(gpu_uuid, "nvmlGpuInstanceDestroy", e)),
    }
}
