//! The NVML calls nvml-wrapper 0.13 does not wrap (or wraps wrongly), made through the symbol
//! table it already loaded (`Nvml::lib()`, nvml-wrapper-sys bindings of nvml.h).
//!
//! This is the only unsafe code outside actk-inject: five C calls with out-parameters. Each
//! function passes a valid device handle borrowed from a live `Device` (so the library stays
//! loaded and initialised for the call) and plain stack out-parameters, and checks the symbol
//! was found before calling it.
//! - `nvmlDeviceGetGpuInstanceId`, `nvmlDeviceGetComputeInstanceId`: the GI and CI of a MIG
//!   device, which name its /proc/driver/nvidia/capabilities/gpuN/mig/giX/ciY access files;
//! - `nvmlDeviceGetGpuInstanceById` + `nvmlGpuInstanceGetInfo`: the GI's profile id and
//!   placement (the MIG profile name and where it sits on the GPU);
//! - `nvmlDeviceGetNvLinkRemoteDeviceType`: wrapped, but nvml-wrapper 0.13 passes a pointer
//!   to a temporary and always returns `Unknown`;
//! - `nvmlEventSetWait_v2`: nvml-wrapper drops the event's GPU and compute instance ids, which
//!   say which MIG device an Xid hit.
#![allow(unsafe_code)]

use nvml_wrapper::Device;
use nvml_wrapper::error::{NvmlError, nvml_sym, nvml_try};
use nvml_wrapper::event::EventSet;
use nvml_wrapper_sys::bindings::{
    nvmlEventData_t, nvmlGpuInstance_t, nvmlGpuInstanceInfo_t, nvmlIntNvLinkDeviceType_t,
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
    /// GPU instance profile id (`nvidia-smi mig -lgip` ID column).
    pub profile_id: u32,
    /// First memory slice the instance occupies.
    pub start: u32,
    /// Number of memory slices.
    pub size: u32,
}

/// Profile and placement of GPU instance `gi` of GPU `parent`.
pub fn gpu_instance_info(parent: &Device<'_>, gi: u32) -> Result<GpuInstanceInfo, NvmlError> {
    let lib = parent.nvml().lib();
    let by_id = nvml_sym(lib.nvmlDeviceGetGpuInstanceById.as_ref())?;
    let get_info = nvml_sym(lib.nvmlGpuInstanceGetInfo.as_ref())?;
    let mut handle: nvmlGpuInstance_t = std::ptr::null_mut();
    // SAFETY: `parent` is a live handle; `handle` outlives the call.
    nvml_try(unsafe { by_id(parent.handle(), gi, &mut handle) })?;
    // SAFETY: zeroed is a valid nvmlGpuInstanceInfo_t (integers and a null pointer).
    let mut info: nvmlGpuInstanceInfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: `handle` was just returned by the library for this parent; `info` outlives the call.
    nvml_try(unsafe { get_info(handle, &mut info) })?;
    Ok(GpuInstanceInfo { profile_id: info.profileId, start: info.placement.start, size: info.placement.size })
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
