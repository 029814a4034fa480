//! Device telemetry for every vendor (DESIGN.md "Crates": the node layer's device telemetry):
//! utilization, memory, temperature, power and error counters of each device the inventory
//! lists, read the way each vendor's own tools read them.
//!
//! - NVIDIA: NVML through actk-core's seam ([`actk_core::discover::nvml::Telemetry`]), the
//!   readings `nvidia-smi` and dcgm-exporter show.
//! - AMD: amdgpu's sysfs attributes of the PCI function (kernel `amdgpu_pm.c`,
//!   `amdgpu_vram_mgr.c`, `amdgpu_ras.c`; what `rocm-smi` and AMD's device-metrics-exporter
//!   read): `gpu_busy_percent` (%), `mem_info_vram_used` / `_total` (bytes), the `amdgpu` hwmon
//!   device's `temp*_input` (millidegrees C, labelled by `temp*_label`) and `power1_average` or
//!   `power1_input` (microwatts) and `power1_cap`, and `ras/<block>_err_count` (`ue: N` /
//!   `ce: N` lines).
//! - AWS Neuron: the Neuron driver's sysfs metrics under
//!   `/sys/devices/virtual/neuron_device/neuron<N>` (aws-neuron-driver `neuron_sysfs_metrics.c`,
//!   what neuron-monitor reports): per core `stats/memory_usage/device_mem/present` (bytes) and
//!   `stats/other_info/nc_time_in_use/total` (microseconds busy, cumulative: utilization is its
//!   rate between two reads), per device `stats/power/utilization` (percent of the device's
//!   power budget) and `stats/hardware/*_ecc_uncorrected`.
//!
//! Every read goes through [`HostRoot`] (symlinks resolved inside the host root). A value a
//! device does not report is `None`, never 0; a read that fails entirely is
//! [`Reading::problem`].

use actk_core::discover::HostRoot;
use actk_core::discover::nvml::Telemetry as NvmlTelemetry;
use actk_core::inventory::{Device, Inventory, VendorInventory};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The readings of one device at one moment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Reading {
    /// CDI kind (`nvidia.com/gpu`).
    pub kind: String,
    /// Vendor profile name (`nvidia`, `amd`, `neuron`).
    pub vendor: String,
    /// Index as the vendor's tools number it.
    pub index: u32,
    /// UUID or serial, when the device has one.
    pub uuid: Option<String>,
    /// Model name, when known.
    pub model: Option<String>,
    /// Busy share of the last sample period, percent (0-100).
    pub utilization_percent: Option<f64>,
    /// Device memory in use, bytes.
    pub memory_used_bytes: Option<u64>,
    /// Device memory, bytes.
    pub memory_total_bytes: Option<u64>,
    /// Temperatures, degrees Celsius, by sensor (`gpu` for NVML; amdgpu's hwmon labels
    /// `edge`, `junction`, `mem`).
    pub temperatures: Vec<(String, f64)>,
    /// Power draw, watts.
    pub power_watts: Option<f64>,
    /// Enforced power limit (cap), watts.
    pub power_limit_watts: Option<f64>,
    /// Power draw as a percent of the device's power budget (Neuron reports only this).
    pub power_budget_percent: Option<f64>,
    /// Cumulative busy time of the device's cores, seconds (Neuron).
    pub busy_seconds: Option<f64>,
    /// Error counters (ECC, RAS blocks).
    pub errors: Vec<ErrorCount>,
    /// Why the device could not be read at all (lost GPU, driver library missing); the other
    /// fields are then `None`.
    pub problem: Option<String>,
}

/// One error counter of a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorCount {
    /// Where it is counted: `ecc_volatile` / `ecc_aggregate` (NVML), an amdgpu RAS block
    /// (`umc`, `gfx`, `xgmi_wafl`, ...), `sram_ecc` / `mem_ecc` (Neuron).
    pub source: String,
    /// `corrected` or `uncorrected` (amdgpu also `deferred`).
    pub severity: String,
    /// The count since the driver loaded (or over the board's life for `ecc_aggregate`).
    pub count: u64,
}

/// Reads the devices of an inventory, keeping what repeated reads need: an open NVML and the
/// previous Neuron busy-time sample (for utilization as a rate). One reader per process; not
/// shared between threads at once (wrap it in a mutex).
pub struct Reader {
    root: HostRoot,
    nvml: Option<Result<NvmlTelemetry, String>>,
    neuron_busy: BTreeMap<u32, (Instant, f64)>,
}

impl std::fmt::Debug for Reader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reader").field("root", &self.root.root()).finish_non_exhaustive()
    }
}

impl Reader {
    /// A reader of the devices under host root `root` (`/` on a node, the driver container's
    /// mount of it, a fixture root in tests). NVML is opened at the first NVIDIA read.
    pub fn new(root: &Path) -> Reader {
        Reader { root: HostRoot::new(root), nvml: None, neuron_busy: BTreeMap::new() }
    }

    /// Readings of every device of `inventory` of the vendors actk reads telemetry for
    /// (NVIDIA, AMD, Neuron), in inventory order. Devices of other vendors are listed with
    /// identity only (every reading `None`), so their health and holders still show.
    pub fn read(&mut self, inventory: &Inventory) -> Vec<Reading> {
        let mut out = Vec::new();
        for v in &inventory.vendors {
            for d in &v.devices {
                let mut r = Reading {
                    kind: v.kind.clone(),
                    vendor: v.profile.clone(),
                    index: d.index,
                    uuid: d.uuid.clone(),
                    model: d.model.clone(),
                    ..Default::default()
                };
                match v.profile.as_str() {
                    "nvidia" => self.read_nvidia(d, &mut r),
                    "amd" => self.read_amd(d, &mut r),
                    "neuron" => self.read_neuron(v, d, &mut r),
                    _ => {}
                }
                out.push(r);
            }
        }
        out
    }

    fn read_nvidia(&mut self, d: &Device, r: &mut Reading) {
        let Some(uuid) = d.uuid.as_deref() else {
            r.problem = Some("no UUID to ask NVML about".into());
            return;
        };
        let root = &self.root;
        let nvml = self.nvml.get_or_insert_with(|| NvmlTelemetry::open(root).map_err(|e| e.to_string()));
        let t = match nvml {
            Ok(t) => t,
            Err(e) => {
                r.problem = Some(format!("NVML: {e}"));
                return;
            }
        };
        match t.read(uuid) {
            Err(e) => r.problem = Some(format!("NVML: {e}")),
            Ok(g) => {
                r.utilization_percent = g.utilization_percent.map(f64::from);
                r.memory_used_bytes = g.memory_used_bytes;
                r.memory_total_bytes = g.memory_total_bytes;
                r.temperatures = g.temperature_c.map(|c| ("gpu".to_string(), f64::from(c))).into_iter().collect();
                r.power_watts = g.power_mw.map(|mw| f64::from(mw) / 1000.0);
                r.power_limit_watts = g.power_limit_mw.map(|mw| f64::from(mw) / 1000.0);
                r.errors = g
                    .ecc
                    .iter()
                    .map(|e| ErrorCount {
                        source: format!("ecc_{}", e.counter),
                        severity: e.kind.to_string(),
                        count: e.count,
                    })
                    .collect();
            }
        }
    }

    fn read_amd(&self, d: &Device, r: &mut Reading) {
        let Some(bdf) = d.pci_bus_id.as_deref() else {
            r.problem = Some("no PCI function to read amdgpu's sysfs attributes from".into());
            return;
        };
        let dir = PathBuf::from("/sys/bus/pci/devices").join(bdf);
        if !self.root.exists(&dir) {
            r.problem = Some(format!("PCI function {} is gone from sysfs", dir.display()));
            return;
        }
        r.utilization_percent = self.number(&dir.join("gpu_busy_percent"));
        r.memory_used_bytes = self.number(&dir.join("mem_info_vram_used"));
        r.memory_total_bytes = self.number(&dir.join("mem_info_vram_total"));
        // The amdgpu hwmon device under the function (hwmon/hwmonN, N global to the host).
        let hwmon = dir.join("hwmon");
        for h in self.root.list_dir(&hwmon).unwrap_or_default() {
            let h = hwmon.join(h);
            for name in self.root.list_dir(&h).unwrap_or_default() {
                let Some(n) = name.strip_prefix("temp").and_then(|s| s.strip_suffix("_input")) else { continue };
                let Some(mdeg) = self.number::<f64>(&h.join(&name)) else { continue };
                let label = self
                    .root
                    .read_to_string(h.join(format!("temp{n}_label")))
                    .map(|s| s.trim().to_string())
                    .unwrap_or_else(|_| format!("temp{n}"));
                r.temperatures.push((label, mdeg / 1000.0));
            }
            // power1_average where the SMU averages (most boards), power1_input where it
            // reports only the current draw (SMU 13.0.6: MI300).
            let uw = self.number::<f64>(&h.join("power1_average")).or_else(|| self.number(&h.join("power1_input")));
            if let Some(uw) = uw {
                r.power_watts = Some(uw / 1e6);
            }
            if let Some(uw) = self.number::<f64>(&h.join("power1_cap")) {
                r.power_limit_watts = Some(uw / 1e6);
            }
        }
        r.temperatures.sort_by(|a, b| a.0.cmp(&b.0));
        let ras = dir.join("ras");
        for name in self.root.list_dir(&ras).unwrap_or_default() {
            let Some(block) = name.strip_suffix("_err_count") else { continue };
            let Ok(text) = self.root.read_to_string(ras.join(&name)) else { continue };
            for line in text.lines() {
                let Some((k, v)) = line.split_once(':') else { continue };
                let severity = match k.trim() {
                    "ue" => "uncorrected",
                    "ce" => "corrected",
                    "de" => "deferred",
                    _ => continue,
                };
                if let Ok(count) = v.trim().parse() {
                    r.errors.push(ErrorCount { source: block.to_string(), severity: severity.into(), count });
                }
            }
        }
    }

    fn read_neuron(&mut self, _v: &VendorInventory, d: &Device, r: &mut Reading) {
        let dir = PathBuf::from(format!("/sys/devices/virtual/neuron_device/neuron{}", d.index));
        if !self.root.exists(&dir) {
            r.problem = Some(format!("{} is gone from sysfs", dir.display()));
            return;
        }
        let cores = self.root.list_dir(&dir).unwrap_or_default();
        let cores: Vec<_> = cores.iter().filter(|c| c.starts_with("neuron_core")).collect();
        let mut used = None::<u64>;
        let mut busy_us = None::<f64>;
        for c in &cores {
            let core = dir.join(c);
            if let Some(b) = self.number::<u64>(&core.join("stats/memory_usage/device_mem/present")) {
                used = Some(used.unwrap_or(0) + b);
            }
            if let Some(us) = self.number::<f64>(&core.join("stats/other_info/nc_time_in_use/total")) {
                busy_us = Some(busy_us.unwrap_or(0.0) + us);
            }
        }
        r.memory_used_bytes = used;
        r.memory_total_bytes = d.attributes.get("memory_bytes").and_then(|m| m.parse().ok());
        if let Some(us) = busy_us {
            let secs = us / 1e6;
            r.busy_seconds = Some(secs);
            let now = Instant::now();
            // Utilization: busy time gained since the last read over the wall time, per core.
            if let Some((then, before)) = self.neuron_busy.insert(d.index, (now, secs)) {
                let wall = now.duration_since(then).as_secs_f64() * cores.len().max(1) as f64;
                if wall > 0.0 {
                    r.utilization_percent = Some(((secs - before).max(0.0) / wall * 100.0).min(100.0));
                }
            }
        }
        // "STATUS,unix time,min,max,avg": the average over the driver's sample period.
        if let Ok(text) = self.root.read_to_string(dir.join("stats/power/utilization")) {
            let f: Vec<&str> = text.trim().split(',').collect();
            if f.len() == 5 && f[0] == "POWER_STATUS_VALID" {
                r.power_budget_percent = f[4].parse().ok();
            }
        }
        for (file, source) in [("sram_ecc_uncorrected", "sram_ecc"), ("mem_ecc_uncorrected", "mem_ecc")] {
            if let Some(count) = self.number(&dir.join("stats/hardware").join(file)) {
                r.errors.push(ErrorCount { source: source.into(), severity: "uncorrected".into(), count });
            }
        }
    }

    /// A sysfs attribute holding one number, `None` when absent or not a number.
    fn number<T: std::str::FromStr>(&self, path: &Path) -> Option<T> {
        self.root.read_to_string(path).ok()?.trim().parse().ok()
    }
}
