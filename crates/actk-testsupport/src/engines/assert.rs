//! Assertions on what a container shows, and the GPUs a fixture root describes.

use std::fs;
use std::path::Path;

/// The names in a `ls -1 /dev`-style listing (one per line, surrounding space trimmed).
pub fn names(listing: &str) -> std::collections::BTreeSet<String> {
    listing.lines().map(str::trim).filter(|l| !l.is_empty()).map(String::from).collect()
}

/// Assert that an error message names `var`, the bad `value`, and the NVIDIA devices that exist
/// on `root`: every index `0..N` as a word, or every UUID (N and the UUIDs from the fixture's
/// /proc/driver/nvidia/gpus/*/information).
pub fn assert_names_unknown_device(err: &str, var: &str, value: &str, root: &Path) {
    use std::collections::BTreeSet;
    let line = err.lines().filter(|l| l.contains(var)).collect::<Vec<_>>().join("\n");
    assert!(!line.is_empty(), "the error must name the variable {var}: {err}");
    let words: BTreeSet<&str> = line.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-')).collect();
    assert!(words.contains(value), "the error must name the bad value {value}: {line}");
    let uuids = fixture_gpu_uuids(root);
    assert!(!uuids.is_empty(), "no GPUs in the fixture at {}", root.display());
    let by_index = (0..uuids.len()).all(|i| words.contains(i.to_string().as_str()));
    let by_uuid = uuids.iter().all(|u| line.contains(u.as_str()));
    assert!(
        by_index || by_uuid,
        "the error must list the {} devices that exist (indexes 0..{} or {uuids:?}): {line}",
        uuids.len(),
        uuids.len()
    );
}

/// One NVIDIA GPU as a fixture's /proc/driver/nvidia/gpus/<bus>/information describes it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct FixtureGpu {
    /// `Bus Location`, e.g. `0000:18:00.0`.
    pub bus: String,
    /// `GPU UUID`.
    pub uuid: String,
    /// `Device Minor`: the GPU's node is `/dev/nvidia<minor>`.
    pub minor: u32,
}

impl FixtureGpu {
    /// The device node name in /dev (`nvidia<minor>`).
    pub fn node(&self) -> String {
        format!("nvidia{}", self.minor)
    }
}

/// The NVIDIA GPUs of a fixture root in index order: PCI bus order, as NVML and
/// `NVIDIA_VISIBLE_DEVICES` number them. Index `i` is not always `/dev/nvidia<i>` (the
/// heterogeneous fixture has its minors out of bus order).
pub fn fixture_gpus(root: &Path) -> Vec<FixtureGpu> {
    let mut v = Vec::new();
    if let Ok(rd) = fs::read_dir(root.join("proc/driver/nvidia/gpus")) {
        for e in rd.flatten() {
            let Ok(info) = fs::read_to_string(e.path().join("information")) else { continue };
            let field = |name: &str| {
                info.lines()
                    .filter_map(|l| l.split_once(':'))
                    .find(|(k, _)| k.trim() == name)
                    .map(|(_, val)| val.trim().to_string())
            };
            v.push(FixtureGpu {
                bus: field("Bus Location")
                    .unwrap_or_else(|| e.file_name().to_string_lossy().into_owned())
                    .to_lowercase(),
                uuid: field("GPU UUID").unwrap_or_default(),
                minor: field("Device Minor").and_then(|m| m.parse().ok()).unwrap_or(u32::MAX),
            });
        }
    }
    v.sort();
    v
}

/// GPU UUIDs of a fixture root in index order (see [`fixture_gpus`]).
pub fn fixture_gpu_uuids(root: &Path) -> Vec<String> {
    fixture_gpus(root).into_iter().map(|g| g.uuid).collect()
}
