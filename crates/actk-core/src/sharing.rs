//! Sharing one device between containers: the parts the device plugin (time-slicing and MPS
//! replicas, core resources) and the DRA driver (claims that consume part of a device's
//! capacity, KEP-5075) both use, so that a container gets the same cores and the same MPS
//! limits whichever of them served it.
//!
//! - Core numbering: the Neuron runtime numbers NeuronCores globally in
//!   `NEURON_RT_VISIBLE_CORES`, device 0's cores first, in units of the logical core size
//!   (`NEURON_LOGICAL_NC_CONFIG`, 1 or 2 physical cores); [`core_numbers`] gives each device's
//!   range and [`pick_cores`] the lowest free cores of one device.
//! - MPS clients: what a CUDA process needs to run as a client of the node's MPS control daemon
//!   with a share of the GPU ([`mps_client_env`]): the pipe directory at CUDA's default
//!   ([`MPS_CONTAINER_PIPE_DIR`]), `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` and
//!   `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` (`<uuid>=<MiB>M`, comma separated), as NVIDIA's MPS
//!   documentation (section "Environment variables") and its device plugin set them.

use crate::inventory::VendorInventory;
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;

/// Where an MPS client container finds the daemon's pipes: CUDA's default
/// `CUDA_MPS_PIPE_DIRECTORY`, so images need no setting of their own.
pub const MPS_CONTAINER_PIPE_DIR: &str = "/tmp/nvidia-mps";

/// The global core numbers of each device of `vendor` (by device index), in units of `lnc`
/// physical cores (0 is taken as 1): device order, device 0's cores first, as
/// `NEURON_RT_VISIBLE_CORES` counts them. `None` when a device does not report a core count or
/// its count does not divide into cores of `lnc`.
pub fn core_numbers(vendor: &VendorInventory, lnc: u32) -> Option<BTreeMap<u32, Range<u32>>> {
    let lnc = lnc.max(1);
    let mut out = BTreeMap::new();
    let mut next = 0u32;
    for d in &vendor.devices {
        let physical = d.cores?;
        if physical % lnc != 0 {
            return None;
        }
        let n = physical / lnc;
        out.insert(d.index, next..next + n);
        next += n;
    }
    Some(out)
}

/// The `n` lowest cores of `range` that are not in `taken`; `None` when fewer are free (or `n`
/// is 0).
pub fn pick_cores(range: Range<u32>, taken: &BTreeSet<u32>, n: u32) -> Option<Vec<u32>> {
    pick_core_groups(range, taken, n, 1)
}

/// The lowest `groups` free groups of `size` consecutive cores of `range`, each group aligned to
/// `size` from `range.start` (a logical NeuronCore of `size` physical ones), as the cores they
/// hold in ascending order; `None` when fewer whole groups are free (or `groups` or `size` is
/// 0).
pub fn pick_core_groups(range: Range<u32>, taken: &BTreeSet<u32>, groups: u32, size: u32) -> Option<Vec<u32>> {
    if groups == 0 || size == 0 {
        return None;
    }
    let mut out = Vec::new();
    let mut start = range.start;
    while start + size <= range.end && out.len() < (groups * size) as usize {
        if (start..start + size).all(|c| !taken.contains(&c)) {
            out.extend(start..start + size);
        }
        start += size;
    }
    (out.len() == (groups * size) as usize).then_some(out)
}

/// Cores as `NEURON_RT_VISIBLE_CORES` takes them: ascending, comma separated (`0,1,4`), as the
/// device plugin's core resources and AWS's Neuron device plugin write it.
pub fn core_list(cores: &[u32]) -> String {
    let mut sorted = cores.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    sorted.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

/// The environment of an MPS client container: `CUDA_MPS_PIPE_DIRECTORY` (the container's
/// [`MPS_CONTAINER_PIPE_DIR`]), `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` = `percent` (clamped to
/// 1..=100), and `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` from `limits` (`(GPU UUID, MiB)` pairs,
/// `<uuid>=<MiB>M` joined by commas; left out when empty). In that order.
pub fn mps_client_env(percent: u32, limits: &[(String, u64)]) -> Vec<(String, String)> {
    let mut env = vec![
        ("CUDA_MPS_PIPE_DIRECTORY".to_string(), MPS_CONTAINER_PIPE_DIR.to_string()),
        ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE".to_string(), percent.clamp(1, 100).to_string()),
    ];
    if !limits.is_empty() {
        let v: Vec<String> = limits.iter().map(|(uuid, mib)| format!("{uuid}={mib}M")).collect();
        env.push(("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT".to_string(), v.join(",")));
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::Device;

    fn neuron(cores: &[Option<u32>]) -> VendorInventory {
        VendorInventory {
            profile: "neuron".into(),
            kind: "aws.amazon.com/neuron".into(),
            devices: cores
                .iter()
                .enumerate()
                .map(|(i, c)| Device { index: i as u32, cores: *c, ..Default::default() })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn cores_are_numbered_across_devices_in_logical_units() {
        let v = neuron(&[Some(8), Some(8)]);
        let n = core_numbers(&v, 1).unwrap();
        assert_eq!(n[&0], 0..8);
        assert_eq!(n[&1], 8..16);
        let n = core_numbers(&v, 2).unwrap();
        assert_eq!(n[&1], 4..8);
        assert_eq!(core_numbers(&v, 3), None);
        assert_eq!(core_numbers(&neuron(&[Some(2), None]), 1), None);
    }

    #[test]
    fn the_lowest_free_cores_are_picked() {
        let taken: BTreeSet<u32> = [8, 9, 11].into();
        assert_eq!(pick_cores(8..16, &taken, 2), Some(vec![10, 12]));
        assert_eq!(pick_cores(8..16, &taken, 5), Some(vec![10, 12, 13, 14, 15]));
        assert_eq!(pick_cores(8..16, &taken, 6), None);
        assert_eq!(pick_cores(8..16, &taken, 0), None);
    }

    #[test]
    fn logical_cores_are_aligned_groups_of_free_physical_cores() {
        // 9 is taken: the pair 8-9 is not free, 10-11 is.
        let taken: BTreeSet<u32> = [9].into();
        assert_eq!(pick_core_groups(8..16, &taken, 2, 2), Some(vec![10, 11, 12, 13]));
        assert_eq!(pick_core_groups(8..16, &taken, 3, 2), Some(vec![10, 11, 12, 13, 14, 15]));
        assert_eq!(pick_core_groups(8..16, &taken, 4, 2), None);
        assert_eq!(pick_core_groups(8..16, &taken, 1, 0), None);
    }

    #[test]
    fn core_lists_are_sorted_and_comma_separated() {
        assert_eq!(core_list(&[5, 0, 1, 2, 5]), "0,1,2,5");
        assert_eq!(core_list(&[3]), "3");
        assert_eq!(core_list(&[]), "");
    }

    #[test]
    fn mps_env_has_the_limits_of_each_gpu() {
        let env = mps_client_env(250, &[("GPU-a".into(), 20480), ("GPU-b".into(), 1024)]);
        assert_eq!(
            env,
            vec![
                ("CUDA_MPS_PIPE_DIRECTORY".into(), "/tmp/nvidia-mps".into()),
                ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE".into(), "100".into()),
                ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT".into(), "GPU-a=20480M,GPU-b=1024M".into()),
            ]
        );
        assert_eq!(mps_client_env(0, &[]).len(), 2);
    }
}
