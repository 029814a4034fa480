//! The NVML calls nvml-wrapper 0.13 does not wrap (or wraps wrongly), made through the symbol
//! table it already loaded (`Nvml::lib()`, nvml-wrapper-sys bindings of nvml.h).
//!
//! This is the only unsafe code outside actk-inject: C calls with out-parameters. Each
//! function passes a valid device handle borrowed from a live `Device` (or a GPU / compute
//! instance handle the library returned for one, held with the `Nvml` it came from) and plain
//! stack out-parameters, and checks the symbol was found before calling it.
//! - `nvmlDeviceGetGpuInstanceId`, `nvmlDeviceGetComputeInstanceId`: the GI and CI of a MIG
//!   device, which name its /proc/driver/nvidia/capabilities/gpuN/mig/giX/ciY access files;
//! - `nvmlDeviceGetGpuInstanceById` + `nvmlGpuInstanceGetInfo`: the GI's profile id and
//!   placement (the MIG profile name and where it sits on the GPU);
//! - `nvmlDeviceGetNvLinkRemoteDeviceType`: wrapped, but nvml-wrapper 0.13 passes a pointer
//!   to a temporary and always returns `Unknown`;
//! - `nvmlEventSetWait_v2`: nvml-wrapper drops the event's GPU and compute instance ids, which
//!   say which MIG device an Xid hit.
//! - MIG administration, which nvml-wrapper 0.13 does not wrap (for [`super::dynamic`]):
//!   `nvmlDeviceGetGpuInstancePossiblePlacements_v2`, `nvmlDeviceCreateGpuInstanceWithPlacement`,
//!   `nvmlGpuInstanceDestroy`, `nvmlGpuInstanceGetComputeInstanceProfileInfo`,
//!   `nvmlGpuInstanceCreateComputeInstance`, `nvmlGpuInstanceGetComputeInstanceById`,
//!   `nvmlComputeInstanceGetInfo_v2`, `nvmlComputeInstanceDestroy`.
#![allow(unsafe_code)]

use nvml_wrapper::error::{NvmlError, nvml_sym, nvml_try};
use nvml_wrapper::event::EventSet;
use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings::{
    nvmlComputeInstance_t, nvmlComputeInstanceInfo_t, nvmlComputeInstanceProfileInfo_t, nvmlEventData_t,
    nvmlGpuInstance_t, nvmlGpuInstanceInfo_t, nvmlGpuInstancePlacement_t, nvmlIntNvLinkDeviceType_t,
    nvmlReturn_enum_NVML_SUCCESS,
};

/// GPU instance id of MIG device `dev` (`nvmlDeviceGetGpuInstanceId`).
pub fn gpu_instance_id(dev: &Device<'_>) -> Result<u32, NvmlError> {
    let sym = nvml_sym(dev.nvml().lib().nvmlDeviceGetGpuInstanceId.as_ref())?;
    let mut id: u32 = 0;
    // SAFETY: `dev` is a live handle of this library; `id` outlives the call.
    nvml_try(unsafe { sym(dev.handle(), &mut id) })?;
    Ok(id)
}

/// Compute instance id of MIG device `dev` (`nvmlDeviceGetComputeInstanceId`).
pub fn compute_instance_id(dev: &Device<'_>) -> Result<u32, NvmlError> {
    let sym = nvml_sym(dev.nvml().lib().nvmlDeviceGetComputeInstanceId.as_ref())?;
    let mut id: u32 = 0;
    // SAFETY: as above.
    nvml_try(unsafe { sym(dev.handle(), &mut id) })?;
    Ok(id)
}

/// What `nvmlGpuInstanceGetInfo` says about a GPU instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuInstanceInfo {
    /// GPU instance id.
    pub id: u32,
    /// GPU instance profile id (`nvidia-smi mig -lgip` ID column).
    pub profile_id: u32,
    /// First memory slice the instance occupies.
    pub start: u32,
    /// Number of memory slices.
    pub size: u32,
}

/// Profile and placement of GPU instance `gi` of GPU `parent`.
pub fn gpu_instance_info(parent: &Device<'_>, gi: u32) -> Result<GpuInstanceInfo, NvmlError> {
    gpu_instance(parent, gi)?.info()
}

/// `nvmlDeviceGetNvLinkRemoteDeviceType` of link `link`: 0 GPU, 1 IBM NPU, 2 NVSwitch.
pub fn nvlink_remote_type(dev: &Device<'_>, link: u32) -> Result<u32, NvmlError> {
    let sym = nvml_sym(dev.nvml().lib().nvmlDeviceGetNvLinkRemoteDeviceType.as_ref())?;
    let mut t: nvmlIntNvLinkDeviceType_t = 0;
    // SAFETY: as above.
    nvml_try(unsafe { sym(dev.handle(), link, &mut t) })?;
    Ok(t as u32)
}

/// One event of an event set: the GPU it happened on (a handle of this library), its Xid, and
/// the GPU / compute instance ids when the driver attributed it to a MIG device.
pub struct RawEvent<'nvml> {
    /// The GPU (a full-GPU handle).
    pub device: Device<'nvml>,
    /// Event type bits (`nvmlEventTypeXidCriticalError` = 8).
    pub event_type: u64,
    /// The Xid for Xid events.
    pub data: u64,
    /// GPU instance id, `None` when not a MIG event (NVML says 0xFFFFFFFF).
    pub gpu_instance: Option<u32>,
    /// Compute instance id, as above.
    pub compute_instance: Option<u32>,
}

/// Wait up to `timeout_ms` for the next event of `set` (`nvmlEventSetWait_v2`); `Timeout` when none.
pub fn wait<'nvml>(set: &EventSet<'nvml>, timeout_ms: u32) -> Result<RawEvent<'nvml>, NvmlError> {
    let sym = nvml_sym(set.nvml.lib().nvmlEventSetWait_v2.as_ref())?;
    // SAFETY: zeroed is a valid nvmlEventData_t (integers and a null pointer).
    let mut data: nvmlEventData_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a live event set of this library; `data` outlives the call.
    nvml_try(unsafe { sym(set.handle(), &mut data, timeout_ms) })?;
    let some = |v: u32| (v != u32::MAX).then_some(v);
    Ok(RawEvent {
        // SAFETY: the library returned this handle for a device of this (live) library.
        device: unsafe { Device::new(data.device, set.nvml) },
        event_type: data.eventType,
        data: data.eventData,
        gpu_instance: some(data.gpuInstanceId),
        compute_instance: some(data.computeInstanceId),
    })
}

/// Every placement GPU instance profile `profile_id` (the profile's *id*, not its index) can
/// have on GPU `dev`, occupied or not, as (first memory slice, memory slices)
/// (`nvmlDeviceGetGpuInstancePossiblePlacements_v2`, `nvidia-smi mig -lgipp`).
pub fn possible_placements(dev: &Device<'_>, profile_id: u32) -> Result<Vec<(u32, u32)>, NvmlError> {
    let sym = nvml_sym(dev.nvml().lib().nvmlDeviceGetGpuInstancePossiblePlacements_v2.as_ref())?;
    let mut count: u32 = 0;
    // SAFETY: `dev` is a live handle; a null array asks for the count alone; `count` outlives the call.
    nvml_try(unsafe { sym(dev.handle(), profile_id, std::ptr::null_mut(), &mut count) })?;
    let mut buf = vec![nvmlGpuInstancePlacement_t { start: 0, size: 0 }; count as usize];
    // SAFETY: `buf` holds `count` placements, as `count` tells the library; both outlive the call.
    let r = unsafe { sym(dev.handle(), profile_id, buf.as_mut_ptr(), &mut count) };
    // nvml_try takes INSUFFICIENT_SIZE (the placements changed in between) for success.
    if r != nvmlReturn_enum_NVML_SUCCESS {
        return Err(NvmlError::from(r));
    }
    buf.truncate(count as usize);
    Ok(buf.into_iter().map(|p| (p.start, p.size)).collect())
}

/// A GPU instance of a GPU, by the handle the library returned for it.
pub struct GpuInstance<'nvml> {
    handle: nvmlGpuInstance_t,
    nvml: &'nvml Nvml,
}

/// GPU instance `id` of GPU `dev` (`nvmlDeviceGetGpuInstanceById`); `NotFound` when none.
pub fn gpu_instance<'nvml>(dev: &Device<'nvml>, id: u32) -> Result<GpuInstance<'nvml>, NvmlError> {
    let sym = nvml_sym(dev.nvml().lib().nvmlDeviceGetGpuInstanceById.as_ref())?;
    let mut handle: nvmlGpuInstance_t = std::ptr::null_mut();
    // SAFETY: `dev` is a live handle; `handle` outlives the call.
    nvml_try(unsafe { sym(dev.handle(), id, &mut handle) })?;
    Ok(GpuInstance { handle, nvml: dev.nvml() })
}

/// Create a GPU instance of profile `profile_id` (the profile's *id*) on GPU `dev` at
/// `start`/`size` memory slices (`nvmlDeviceCreateGpuInstanceWithPlacement`). NVML answers
/// `UnexpectedVariant(23)` (INSUFFICIENT_RESOURCES) when the placement is taken.
pub fn create_gpu_instance<'nvml>(
    dev: &Device<'nvml>,
    profile_id: u32,
    start: u32,
    size: u32,
) -> Result<GpuInstance<'nvml>, NvmlError> {
    let sym = nvml_sym(dev.nvml().lib().nvmlDeviceCreateGpuInstanceWithPlacement.as_ref())?;
    let placement = nvmlGpuInstancePlacement_t { start, size };
    let mut handle: nvmlGpuInstance_t = std::ptr::null_mut();
    // SAFETY: `dev` is a live handle; `placement` and `handle` outlive the call.
    nvml_try(unsafe { sym(dev.handle(), profile_id, &placement, &mut handle) })?;
    Ok(GpuInstance { handle, nvml: dev.nvml() })
}

/// What `nvmlGpuInstanceGetComputeInstanceProfileInfo` says about a compute instance profile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ComputeProfileInfo {
    /// The profile id to create it with.
    pub id: u32,
    /// Compute slices.
    pub slices: u32,
}

impl<'nvml> GpuInstance<'nvml> {
    /// Id, profile and placement (`nvmlGpuInstanceGetInfo`).
    pub fn info(&self) -> Result<GpuInstanceInfo, NvmlError> {
        let sym = nvml_sym(self.nvml.lib().nvmlGpuInstanceGetInfo.as_ref())?;
        // SAFETY: zeroed is a valid nvmlGpuInstanceInfo_t (integers and a null pointer).
        let mut info: nvmlGpuInstanceInfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: `handle` came from this live library; `info` outlives the call.
        nvml_try(unsafe { sym(self.handle, &mut info) })?;
        Ok(GpuInstanceInfo {
            id: info.id,
            profile_id: info.profileId,
            start: info.placement.start,
            size: info.placement.size,
        })
    }

    /// Compute instance profile `profile` (NVML_COMPUTE_INSTANCE_PROFILE_*), shared engines
    /// (`nvmlGpuInstanceGetComputeInstanceProfileInfo`); `NotSupported` when this GI cannot
    /// hold it.
    pub fn compute_profile(&self, profile: u32) -> Result<ComputeProfileInfo, NvmlError> {
        let sym = nvml_sym(self.nvml.lib().nvmlGpuInstanceGetComputeInstanceProfileInfo.as_ref())?;
        // SAFETY: zeroed is a valid nvmlComputeInstanceProfileInfo_t (integers).
        let mut info: nvmlComputeInstanceProfileInfo_t = unsafe { std::mem::zeroed() };
        const SHARED: u32 = 0; // NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
        // SAFETY: `handle` came from this live library; `info` outlives the call.
        nvml_try(unsafe { sym(self.handle, profile, SHARED, &mut info) })?;
        Ok(ComputeProfileInfo { id: info.id, slices: info.sliceCount })
    }

    /// Create a compute instance of profile id `profile_id` (`nvmlGpuInstanceCreateComputeInstance`).
    pub fn create_compute_instance(&self, profile_id: u32) -> Result<ComputeInstance<'nvml>, NvmlError> {
        let sym = nvml_sym(self.nvml.lib().nvmlGpuInstanceCreateComputeInstance.as_ref())?;
        let mut handle: nvmlComputeInstance_t = std::ptr::null_mut();
        // SAFETY: `self.handle` came from this live library; `handle` outlives the call.
        nvml_try(unsafe { sym(self.handle, profile_id, &mut handle) })?;
        Ok(ComputeInstance { handle, nvml: self.nvml })
    }

    /// Compute instance `id` of this GI (`nvmlGpuInstanceGetComputeInstanceById`); `NotFound` when none.
    pub fn compute_instance(&self, id: u32) -> Result<ComputeInstance<'nvml>, NvmlError> {
        let sym = nvml_sym(self.nvml.lib().nvmlGpuInstanceGetComputeInstanceById.as_ref())?;
        let mut handle: nvmlComputeInstance_t = std::ptr::null_mut();
        // SAFETY: as above.
        nvml_try(unsafe { sym(self.handle, id, &mut handle) })?;
        Ok(ComputeInstance { handle, nvml: self.nvml })
    }

    /// Destroy this GI (`nvmlGpuInstanceDestroy`); `InUse` while it has a compute instance.
    pub fn destroy(self) -> Result<(), NvmlError> {
        let sym = nvml_sym(self.nvml.lib().nvmlGpuInstanceDestroy.as_ref())?;
        // SAFETY: `self.handle` came from this live library and is not used after.
        nvml_try(unsafe { sym(self.handle) })
    }
}

/// A compute instance of a GPU instance, by the handle the library returned for it.
pub struct ComputeInstance<'nvml> {
    handle: nvmlComputeInstance_t,
    nvml: &'nvml Nvml,
}

impl ComputeInstance<'_> {
    /// The CI's id within its GI (`nvmlComputeInstanceGetInfo_v2`).
    pub fn id(&self) -> Result<u32, NvmlError> {
        let sym = nvml_sym(self.nvml.lib().nvmlComputeInstanceGetInfo_v2.as_ref())?;
        // SAFETY: zeroed is a valid nvmlComputeInstanceInfo_t (integers and null pointers).
        let mut info: nvmlComputeInstanceInfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: `self.handle` came from this live library; `info` outlives the call.
        nvml_try(unsafe { sym(self.handle, &mut info) })?;
        Ok(info.id)
    }

    /// Destroy this CI, and with it its MIG device (`nvmlComputeInstanceDestroy`).
    pub fn destroy(self) -> Result<(), NvmlError> {
        let sym = nvml_sym(self.nvml.lib().nvmlComputeInstanceDestroy.as_ref())?;
        // SAFETY: `self.handle` came from this live library and is not used after.
        nvml_try(unsafe { sym(self.handle) })
    }
}
