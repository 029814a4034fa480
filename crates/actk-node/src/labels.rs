//! Node labels from discovery (issue 30), for steering workloads to hardware: per vendor the
//! count, product, memory, driver version, architecture, partition capability and strategy,
//! sharing and NUMA layout under `actk.dev/`, plus the labels NVIDIA's GPU Feature Discovery
//! and AMD's node labeller publish, so that existing nodeSelectors keep working
//! (`nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3`, `nvidia.com/gpu.count=8`, ...).
//!
//! Label values follow the Kubernetes label syntax (at most 63 characters of `[A-Za-z0-9._-]`,
//! alphanumeric at both ends): model names get `-` for spaces, as GFD writes them.
//! [`stale`] says which labels a labeller set before and must remove now (a GPU removed, a
//! config changed): every key under the prefixes it owns ([`OWNED_PREFIXES`]) that the new set
//! lacks.

use actk_core::inventory::{Inventory, VendorInventory};
use std::collections::{BTreeMap, BTreeSet};

/// The label key prefixes actk's labeller owns: keys under them that it no longer computes are
/// removed. (GFD's and AMD's labeller's keys are owned only where actk computes them: a node
/// that runs GFD too keeps GFD's other labels.)
pub const OWNED_PREFIXES: &[&str] = &["actk.dev/"];

/// The Node annotation where the labeller keeps the keys it set (comma-separated), so that its
/// next pass knows which GFD-/AMD-compatible keys are its own to remove (as NFD keeps
/// `nfd.node.kubernetes.io/feature-labels`).
pub const OWNED_ANNOTATION: &str = "actk.dev/labels";

/// Whether `key` is a label the admin sets for actk to read (the node's config name
/// `actk.dev/config`, the DRA server choice `actk.dev/<profile>.server`): never the labeller's
/// to remove, although under [`OWNED_PREFIXES`].
pub fn admin_input(key: &str) -> bool {
    key == "actk.dev/config" || (key.starts_with("actk.dev/") && key.ends_with(".server"))
}

/// How the node is configured, which discovery cannot see (the device plugin's settings).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelOptions {
    /// NVIDIA MIG strategy: `none`, `single` or `mixed` (GFD's `nvidia.com/mig.strategy`).
    pub mig_strategy: Option<String>,
    /// Time-slicing replicas per kind (`nvidia.com/gpu` -> 4); absent or 1: not shared.
    pub replicas: BTreeMap<String, u32>,
    /// Kinds whose time-sliced replicas are served under another name (an entry's `rename`,
    /// or `renameByDefault`): GFD then leaves `-SHARED` off the product label.
    pub renamed: BTreeSet<String>,
    /// CUDA MPS replicas per kind (`sharing.mps`); time-slicing of the same kind wins.
    pub mps: BTreeMap<String, u32>,
    /// The named config the node runs (`actk.dev/config` selects it; echoed as
    /// `actk.dev/config.applied`).
    pub config: Option<String>,
}

/// A label value: `[A-Za-z0-9._-]`, others become `-`, at most 63 characters, alphanumeric
/// at both ends; `None` when nothing is left.
pub fn label_value(s: &str) -> Option<String> {
    let v: String =
        s.trim().chars().map(|c| if c.is_ascii_alphanumeric() || "._-".contains(c) { c } else { '-' }).collect();
    let v: String = v.chars().take(63).collect();
    let v = v.trim_matches(|c: char| !c.is_ascii_alphanumeric()).to_string();
    (!v.is_empty()).then_some(v)
}

/// NVIDIA's architecture family for a CUDA compute capability, as GFD names it
/// (`nvidia.com/gpu.family`).
fn nvidia_family(major: u32, minor: u32) -> Option<&'static str> {
    Some(match (major, minor) {
        (3, _) => "kepler",
        (5, _) => "maxwell",
        (6, _) => "pascal",
        (7, 0..=4) => "volta",
        (7, _) => "turing",
        (8, 9) => "ada-lovelace",
        (8, _) => "ampere",
        (9, _) => "hopper",
        (10 | 12, _) => "blackwell",
        _ => return None,
    })
}

/// The labels for `inventory` configured as `opts`: key -> value, sorted.
pub fn labels(inventory: &Inventory, opts: &LabelOptions) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut put = |k: String, v: &str| {
        if let Some(v) = label_value(v) {
            out.insert(k, v);
        }
    };
    if let Some(c) = &opts.config {
        put("actk.dev/config.applied".into(), c);
    }
    for v in &inventory.vendors {
        // Only devices a container can be given count: discovery lists a GPU whose device
        // node is gone (with a warning), but no allocation can use it.
        let v = &VendorInventory {
            devices: v.devices.iter().filter(|d| !d.nodes.is_empty()).cloned().collect(),
            ..v.clone()
        };
        if v.devices.is_empty() {
            continue;
        }
        let p = format!("actk.dev/{}", v.profile);
        let first = &v.devices[0];
        let count = v.devices.len().to_string();
        put(format!("{p}.present"), "true");
        put(format!("{p}.count"), &count);
        if let Some(m) = &first.model {
            put(format!("{p}.product"), m);
        }
        let mem_mib = first.attributes.get("memory_mib").cloned();
        if let Some(m) = &mem_mib {
            put(format!("{p}.memory-mib"), m);
        }
        if let Some(d) = &v.driver_version {
            put(format!("{p}.driver-version"), d);
        }
        let numa: BTreeSet<u32> = v.devices.iter().filter_map(|d| d.numa_node).collect();
        if !numa.is_empty() {
            put(format!("{p}.numa-nodes"), &numa.len().to_string());
        }
        let cores: u32 = v.devices.iter().filter_map(|d| d.cores).sum();
        if cores > 0 {
            put(format!("{p}.cores"), &cores.to_string());
        }
        let sharing = Sharing::of(opts, &v.kind);
        put(format!("{p}.sharing"), sharing.strategy());
        put(format!("{p}.replicas"), &sharing.replicas().to_string());
        match v.profile.as_str() {
            "nvidia" => nvidia(v, opts, &sharing, &mut put),
            "amd" => amd(v, &mut put),
            _ => {}
        }
    }
    out
}

/// How a kind is shared on the node, from [`LabelOptions`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sharing {
    None,
    /// Time-sliced into this many replicas (> 1); `renamed`: served under another name.
    TimeSlicing {
        replicas: u32,
        renamed: bool,
    },
    /// Shared through CUDA MPS, this many replicas (> 1).
    Mps(u32),
}

impl Sharing {
    fn of(opts: &LabelOptions, kind: &str) -> Sharing {
        match (opts.replicas.get(kind).copied().unwrap_or(1), opts.mps.get(kind).copied().unwrap_or(1)) {
            (r, _) if r > 1 => Sharing::TimeSlicing { replicas: r, renamed: opts.renamed.contains(kind) },
            (_, m) if m > 1 => Sharing::Mps(m),
            _ => Sharing::None,
        }
    }

    /// The strategy as GFD's `nvidia.com/gpu.sharing-strategy` names it.
    fn strategy(self) -> &'static str {
        match self {
            Sharing::None => "none",
            Sharing::TimeSlicing { .. } => "time-slicing",
            Sharing::Mps(_) => "mps",
        }
    }

    fn replicas(self) -> u32 {
        match self {
            Sharing::None => 1,
            Sharing::TimeSlicing { replicas, .. } | Sharing::Mps(replicas) => replicas,
        }
    }
}

fn nvidia(v: &VendorInventory, opts: &LabelOptions, sharing: &Sharing, put: &mut impl FnMut(String, &str)) {
    let d = &v.devices[0];
    let p = "actk.dev/nvidia";
    // GPU Feature Discovery's names (its README's label list; values as k8s-device-plugin's
    // internal/lm/resource.go computes them).
    put("nvidia.com/gpu.present".into(), "true");
    put("nvidia.com/gpu.count".into(), &v.devices.len().to_string());
    if let Some(m) = &d.model {
        // GFD marks a time-sliced GPU that keeps its resource name: pods selecting the plain
        // product must not land on a share of one by surprise.
        match sharing {
            Sharing::TimeSlicing { renamed: false, .. } => put("nvidia.com/gpu.product".into(), &format!("{m}-SHARED")),
            _ => put("nvidia.com/gpu.product".into(), m),
        }
    }
    if let Some(m) = d.attributes.get("memory_mib") {
        put("nvidia.com/gpu.memory".into(), m);
    }
    if let Some(cc) = d.attributes.get("compute_capability") {
        put(format!("{p}.compute-capability"), cc);
        if let Some((ma, mi)) = cc.split_once('.')
            && let (Ok(ma), Ok(mi)) = (ma.parse::<u32>(), mi.parse::<u32>())
        {
            put("nvidia.com/gpu.compute.major".into(), &ma.to_string());
            put("nvidia.com/gpu.compute.minor".into(), &mi.to_string());
            if let Some(f) = nvidia_family(ma, mi) {
                put("nvidia.com/gpu.family".into(), f);
                put(format!("{p}.architecture"), f);
            }
        }
    }
    if let Some(dv) = &v.driver_version {
        put("nvidia.com/cuda.driver-version.full".into(), dv);
        let parts: Vec<&str> = dv.split('.').collect();
        for (name, part) in ["major", "minor", "revision"].iter().zip(&parts) {
            put(format!("nvidia.com/cuda.driver-version.{name}"), part);
        }
    }
    if let Some(cuda) = d.attributes.get("cuda_driver_version") {
        put("nvidia.com/cuda.runtime-version.full".into(), cuda);
        if let Some((ma, mi)) = cuda.split_once('.') {
            put("nvidia.com/cuda.runtime-version.major".into(), ma);
            put("nvidia.com/cuda.runtime-version.minor".into(), mi);
        }
    }
    let mig_capable = v.devices.iter().any(|d| d.mig.is_some());
    let mig_enabled = v.devices.iter().any(|d| d.mig.as_ref().is_some_and(|m| m.enabled));
    put("nvidia.com/mig.capable".into(), if mig_capable { "true" } else { "false" });
    put(format!("{p}.mig-capable"), if mig_capable { "true" } else { "false" });
    put(format!("{p}.mig-enabled"), if mig_enabled { "true" } else { "false" });
    let strategy = opts.mig_strategy.as_deref().unwrap_or("none");
    put("nvidia.com/mig.strategy".into(), strategy);
    put(format!("{p}.mig-strategy"), strategy);
    // GFD counts time-slicing replicas only (an MPS-shared GPU shows 1).
    let replicas = match sharing {
        Sharing::TimeSlicing { replicas, .. } => *replicas,
        _ => 1,
    };
    put("nvidia.com/gpu.replicas".into(), &replicas.to_string());
    put("nvidia.com/gpu.sharing-strategy".into(), sharing.strategy());
}

fn amd(v: &VendorInventory, put: &mut impl FnMut(String, &str)) {
    let d = &v.devices[0];
    // AMD's node labeller (ROCm k8s-device-plugin cmd/k8s-node-labeller) names.
    if let Some(m) = &d.model {
        put("amd.com/gpu.product-name".into(), m);
    }
    if let Some(dv) = &v.driver_version {
        put("amd.com/gpu.driver-version".into(), dv);
    }
    if let Some(cp) = d.attributes.get("compute_partition") {
        put("amd.com/gpu.compute-partitioning-mode".into(), cp);
        put("actk.dev/amd.compute-partition".into(), cp);
    }
    if let Some(mp) = d.attributes.get("memory_partition") {
        put("amd.com/gpu.memory-partitioning-mode".into(), mp);
        put("actk.dev/amd.memory-partition".into(), mp);
    }
}

/// The keys of `current` (the node's labels now) that a labeller computing `new` must remove:
/// those under [`OWNED_PREFIXES`] and those GFD-/AMD-compatible keys it set `before` (its
/// previous set) that `new` no longer has; never the admin's inputs ([`admin_input`]).
pub fn stale(
    current: &BTreeMap<String, String>,
    before: &BTreeMap<String, String>,
    new: &BTreeMap<String, String>,
) -> Vec<String> {
    current
        .keys()
        .filter(|k| !new.contains_key(*k))
        .filter(|k| !admin_input(k))
        .filter(|k| OWNED_PREFIXES.iter().any(|p| k.starts_with(p)) || before.contains_key(*k))
        .cloned()
        .collect()
}

/// `labels` in node-feature-discovery's local feature file format (`features.d/`): one
/// `key=value` a line; NFD's worker publishes exactly the file's labels, so a key left out
/// of a rewrite is removed from the Node.
pub fn feature_file(labels: &BTreeMap<String, String>) -> String {
    labels.iter().map(|(k, v)| format!("{k}={v}\n")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_label_syntax() {
        assert_eq!(label_value("NVIDIA H100 80GB HBM3").as_deref(), Some("NVIDIA-H100-80GB-HBM3"));
        assert_eq!(label_value("AMD Instinct MI300X OAM").as_deref(), Some("AMD-Instinct-MI300X-OAM"));
        assert_eq!(label_value(" (x) ").as_deref(), Some("x"));
        assert_eq!(label_value("--").as_deref(), None);
        assert_eq!(label_value(&"a".repeat(80)).map(|s| s.len()), Some(63));
    }

    #[test]
    fn stale_keys_are_ours_that_the_new_set_lacks() {
        let m = |kv: &[(&str, &str)]| kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let current = m(&[("actk.dev/nvidia.count", "8"), ("nvidia.com/gpu.count", "8"), ("nvidia.com/gfd.x", "1")]);
        let before = m(&[("actk.dev/nvidia.count", "8"), ("nvidia.com/gpu.count", "8")]);
        assert_eq!(stale(&current, &before, &m(&[])), ["actk.dev/nvidia.count", "nvidia.com/gpu.count"]);
        assert!(stale(&current, &before, &before).is_empty());
        // The admin's inputs under actk.dev/ stay.
        let current = m(&[("actk.dev/config", "ts2"), ("actk.dev/nvidia.server", "dra"), ("actk.dev/x", "1")]);
        assert_eq!(stale(&current, &m(&[]), &m(&[])), ["actk.dev/x"]);
    }

    /// GFD's sharing labels (k8s-device-plugin internal/lm/resource.go): time-slicing wins over
    /// MPS for a kind; the product gets `-SHARED` only for time-slicing under the plain name.
    #[test]
    fn sharing_follows_gfd() {
        let mut o = LabelOptions::default();
        assert_eq!(Sharing::of(&o, "nvidia.com/gpu"), Sharing::None);
        o.mps.insert("nvidia.com/gpu".into(), 2);
        assert_eq!(Sharing::of(&o, "nvidia.com/gpu"), Sharing::Mps(2));
        assert_eq!((Sharing::Mps(2).strategy(), Sharing::Mps(2).replicas()), ("mps", 2));
        o.replicas.insert("nvidia.com/gpu".into(), 4);
        assert_eq!(Sharing::of(&o, "nvidia.com/gpu"), Sharing::TimeSlicing { replicas: 4, renamed: false });
        o.renamed.insert("nvidia.com/gpu".into());
        assert_eq!(Sharing::of(&o, "nvidia.com/gpu"), Sharing::TimeSlicing { replicas: 4, renamed: true });
        // One replica is no sharing.
        o.replicas.insert("amd.com/gpu".into(), 1);
        assert_eq!(Sharing::of(&o, "amd.com/gpu"), Sharing::None);
    }
}
