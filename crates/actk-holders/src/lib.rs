//! Which pod, container or plain container holds each accelerator of a node (`actk who`).
//!
//! Two sources, each authoritative for its own part:
//! - the kubelet's PodResources API ([`podresources`], `List` on
//!   `/var/lib/kubelet/pod-resources/kubelet.sock`): what the kubelet allocated to each pod's
//!   containers, from device plugins (resource name and device IDs) and from DRA drivers
//!   (claims, with driver, pool and device names). This is the allocation, whether or not the
//!   container runs yet.
//! - the OCI runtimes' state ([`runtime_state`]): every running container of runc (and crun)
//!   under the state roots docker, containerd, CRI-O and podman use, with its bundle's
//!   config.json: actk's applied-devices annotation (`io.actk.applied`, which actk-runtime and
//!   the NRI plugin write), the device nodes in `linux.devices` (whatever put them there: an
//!   engine's own CDI, a device plugin's device specs), and, for a container whose devices the
//!   OCI hook injected live (`docker run --gpus`), the hook's request planned again from the
//!   config.json the hook read. This is what running containers have, Kubernetes or not.
//!
//! [`attribute`] joins both with the node's [`Inventory`] into one [`DeviceHolders`] per device
//! and vendor; a CRI container that is also a kubelet allocation is one holder. The join is pure
//! (plain data in, plain data out) and tested without a node.

pub mod podresources;
pub mod runtime_state;

use actk_core::inventory::{Device, Inventory, VendorInventory};
use serde::Serialize;
use std::collections::BTreeMap;

/// One device of the node and who holds it (`actk who --json` prints a list of these).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct DeviceHolders {
    /// CDI kind (`nvidia.com/gpu`).
    pub kind: String,
    /// Index as the vendor's tools number it.
    pub index: u32,
    /// The device's UUID or serial, when it has one.
    pub uuid: Option<String>,
    /// Model name, when known.
    pub model: Option<String>,
    /// Everyone holding the device or a part of it; empty: free.
    pub holders: Vec<Holder>,
}

/// A holder of a device: a pod's container (kubelet allocation, or a CRI container) or a plain
/// container of an engine.
#[derive(Debug, Clone, Serialize, PartialEq, Eq, PartialOrd, Ord)]
pub struct Holder {
    /// Pod namespace (Kubernetes only).
    pub namespace: Option<String>,
    /// Pod name (Kubernetes only).
    pub pod: Option<String>,
    /// Container name: the pod's container, or the engine's name for it (docker's `--name`).
    pub container: Option<String>,
    /// The runtime's container id, when the container runs.
    pub container_id: Option<String>,
    /// Who started it: `docker`, `podman`, `containerd`, `cri-o`, `runc` (a bundle run by hand),
    /// or `kubelet` for an allocation whose container is not running here.
    pub engine: String,
    /// How the device came to it: `device plugin nvidia.com/gpu`, `DRA claim ns/name
    /// (actk.dev)`, `NVIDIA_VISIBLE_DEVICES (actk-runtime)`, `device node /dev/nvidia1`, ...
    pub via: String,
    /// The part of the device held, when not the whole device: `MIG 0:1`, `core 3`, `replica 2`.
    pub part: Option<String>,
}

/// A kubelet allocation of one device (or part) to one pod container, from PodResources `List`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocation {
    /// Pod namespace.
    pub namespace: String,
    /// Pod name.
    pub pod: String,
    /// Container name.
    pub container: String,
    /// What was allocated.
    pub what: Allocated,
}

/// The allocated thing of an [`Allocation`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Allocated {
    /// A device plugin's device: extended resource name and the plugin's device ID (actk's
    /// plugin: a UUID, an index, a MIG UUID or `G:M`, a Neuron core number, each optionally
    /// `<id>::<replica>` under time-slicing; NVIDIA's plugin: UUIDs).
    DevicePlugin {
        /// `nvidia.com/gpu`, `nvidia.com/mig-1g.10gb`, `aws.amazon.com/neuroncore`, ...
        resource: String,
        /// The device ID.
        id: String,
    },
    /// A DRA device of a resource claim.
    Dra {
        /// Claim namespace.
        claim_namespace: String,
        /// Claim name.
        claim_name: String,
        /// DRA driver (`actk.dev`).
        driver: String,
        /// Pool (actk: the node name).
        pool: String,
        /// Device name in the pool's ResourceSlices (actk: `<profile>-<index>`).
        device: String,
    },
}

/// A running container and what it was given, from an OCI runtime's state ([`runtime_state`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunningContainer {
    /// The runtime's container id.
    pub id: String,
    /// `docker`, `podman`, `containerd`, `cri-o` or `runc`.
    pub engine: String,
    /// A name for it, when the engine keeps one where actk can read it (docker's config.v2.json;
    /// a CRI container's name annotation).
    pub name: Option<String>,
    /// Pod namespace and name from the CRI annotations (containerd, CRI-O).
    pub pod: Option<(String, String)>,
    /// Device names per kind that actk served it: from the `io.actk.applied` annotation, or
    /// planned again for a container whose devices the hook injected. Each with how it was asked.
    pub served: Vec<Served>,
    /// Device nodes in config.json's `linux.devices`: (type `c`/`b`, major, minor, path).
    pub device_nodes: Vec<(char, u32, u32, String)>,
}

/// One kind's devices actk served a container (one `kind=names (source, ...)` of the annotation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Served {
    /// CDI kind.
    pub kind: String,
    /// Device names as the request named them: indexes, UUIDs, `G:M` MIG devices, `all`.
    pub names: Vec<String>,
    /// How: `NVIDIA_VISIBLE_DEVICES (actk-runtime)`, `annotation cdi.k8s.io/x (actk-runtime)`,
    /// `NVIDIA_VISIBLE_DEVICES (hook)`.
    pub via: String,
}

/// Parses the `io.actk.applied` annotation (`actk_core::plan::Plan::summary`):
/// `nvidia.com/gpu=1,3 (NVIDIA_VISIBLE_DEVICES, generated); example.com/accel=0 (annotation
/// cdi.k8s.io/x, spec)`. `who` names the writer (`actk-runtime`). Parts that do not have that
/// shape are skipped; driver-only requests (`none`) serve no device.
pub fn parse_applied(value: &str, who: &str) -> Vec<Served> {
    let mut out = Vec::new();
    for part in value.split("; ") {
        let Some((kind, rest)) = part.split_once('=') else { continue };
        let (names, how) = match rest.split_once(" (") {
            Some((n, h)) => (n, h.trim_end_matches(')')),
            None => (rest, ""),
        };
        let source = how.rsplit_once(", ").map_or(how, |(s, _)| s);
        let names: Vec<String> =
            names.split(',').filter(|n| !n.is_empty() && *n != "none").map(str::to_string).collect();
        if names.is_empty() {
            continue;
        }
        let via = if source.is_empty() { who.to_string() } else { format!("{source} ({who})") };
        out.push(Served { kind: kind.trim().to_string(), names, via });
    }
    out
}

/// Joins the inventory with the kubelet's allocations and the running containers: one entry per
/// device of every vendor, in inventory order, each with its holders sorted. A running CRI
/// container whose pod and container name match an allocation adds its id to that holder
/// instead of being a second one. Allocations or container devices that match no device of the
/// inventory are left out (another node's pool, a device that is gone).
pub fn attribute(
    inventory: &Inventory,
    allocations: &[Allocation],
    containers: &[RunningContainer],
) -> Vec<DeviceHolders> {
    let mut out: Vec<DeviceHolders> = Vec::new();
    let mut at: BTreeMap<(String, u32), usize> = BTreeMap::new();
    for v in &inventory.vendors {
        for d in &v.devices {
            at.insert((v.kind.clone(), d.index), out.len());
            out.push(DeviceHolders {
                kind: v.kind.clone(),
                index: d.index,
                uuid: d.uuid.clone(),
                model: d.model.clone(),
                holders: Vec::new(),
            });
        }
    }
    let mut push = |kind: &str, index: u32, h: Holder| {
        if let Some(&i) = at.get(&(kind.to_string(), index))
            && !out[i].holders.contains(&h)
        {
            out[i].holders.push(h);
        }
    };
    for a in allocations {
        for (v, d, part, via) in resolve_allocation(inventory, &a.what) {
            push(
                &v.kind,
                d.index,
                Holder {
                    namespace: Some(a.namespace.clone()),
                    pod: Some(a.pod.clone()),
                    container: Some(a.container.clone()),
                    container_id: None,
                    engine: "kubelet".into(),
                    via,
                    part,
                },
            );
        }
    }
    for c in containers {
        let (namespace, pod) = match &c.pod {
            Some((n, p)) => (Some(n.clone()), Some(p.clone())),
            None => (None, None),
        };
        let holder = |via: String, part: Option<String>| Holder {
            namespace: namespace.clone(),
            pod: pod.clone(),
            container: c.name.clone(),
            container_id: Some(c.id.clone()),
            engine: c.engine.clone(),
            via,
            part,
        };
        let mut named: Vec<(String, u32)> = Vec::new();
        for s in &c.served {
            let Some(v) = inventory.vendors.iter().find(|v| v.kind == s.kind) else { continue };
            for name in &s.names {
                for (d, part) in resolve_name(v, name) {
                    named.push((v.kind.clone(), d.index));
                    push(&v.kind, d.index, holder(s.via.clone(), part));
                }
            }
        }
        // Device nodes catch what no annotation names (an engine's own CDI, device specs);
        // a device already attributed by name is not listed twice.
        for (ty, major, minor, path) in &c.device_nodes {
            for v in &inventory.vendors {
                for d in &v.devices {
                    let hit = d.nodes.iter().any(|n| n.node_type == *ty && n.major == *major && n.minor == *minor);
                    if hit && !named.contains(&(v.kind.clone(), d.index)) {
                        named.push((v.kind.clone(), d.index));
                        push(&v.kind, d.index, holder(format!("device node {path}"), None));
                    }
                }
            }
        }
    }
    for d in &mut out {
        merge_cri(&mut d.holders);
        d.holders.sort();
    }
    out
}

/// A kubelet holder and a running container of the same pod container are one: the running
/// one's id (and, when the kubelet's `via` says less, nothing else) joins the kubelet's entry.
fn merge_cri(holders: &mut Vec<Holder>) {
    let mut i = 0;
    while i < holders.len() {
        let h = &holders[i];
        let twin = (h.engine != "kubelet" && h.pod.is_some())
            .then(|| {
                holders.iter().position(|k| {
                    k.engine == "kubelet"
                        && k.container_id.is_none()
                        && k.namespace == h.namespace
                        && k.pod == h.pod
                        && k.container == h.container
                })
            })
            .flatten();
        match twin {
            Some(k) => {
                let running = holders.remove(i);
                let k = if k > i { k - 1 } else { k };
                holders[k].container_id = running.container_id;
                holders[k].engine = running.engine;
            }
            None => i += 1,
        }
    }
}

/// The vendor whose resources a Kubernetes resource or driver name belongs to: the profile
/// whose kind has the same vendor domain (`nvidia.com/mig-1g.10gb` and `gpu.nvidia.com` both
/// belong to `nvidia.com/gpu`'s vendor).
fn vendors_of<'a>(inventory: &'a Inventory, name: &str) -> impl Iterator<Item = &'a VendorInventory> {
    let domain = name.split('/').next().unwrap_or(name).to_string();
    inventory.vendors.iter().filter(move |v| {
        let vendor = v.kind.split('/').next().unwrap_or("");
        domain == vendor || domain.ends_with(&format!(".{vendor}"))
    })
}

/// The devices (with the part held and how) that one allocation names.
fn resolve_allocation<'a>(
    inventory: &'a Inventory,
    what: &Allocated,
) -> Vec<(&'a VendorInventory, &'a Device, Option<String>, String)> {
    let mut out = Vec::new();
    match what {
        Allocated::DevicePlugin { resource, id } => {
            let (base, replica) = match id.rsplit_once("::") {
                Some((b, r)) => (b, Some(r)),
                None => (id.as_str(), None),
            };
            let via = format!("device plugin {resource}");
            for v in vendors_of(inventory, resource) {
                let found: Vec<(&Device, Option<String>)> = if resource.ends_with("core") {
                    // Neuron cores are numbered across devices in index order (actk's plugin).
                    base.parse::<u32>().ok().and_then(|c| core_device(v, c)).into_iter().collect()
                } else {
                    resolve_name(v, base)
                };
                for (d, part) in found {
                    let part = match (part, replica) {
                        (p, None) => p,
                        (None, Some(r)) => Some(format!("replica {r}")),
                        (Some(p), Some(r)) => Some(format!("{p}, replica {r}")),
                    };
                    out.push((v, d, part, via.clone()));
                }
            }
        }
        Allocated::Dra { claim_namespace, claim_name, driver, device, .. } => {
            let via = format!("DRA claim {claim_namespace}/{claim_name} ({driver})");
            if driver == "actk.dev" {
                // actk's DRA driver names a device `<profile>-<index>` (crates/actk-dra slice.rs).
                for v in &inventory.vendors {
                    for d in &v.devices {
                        if dra_device_name(&v.profile, d.index) == *device {
                            out.push((v, d, None, via.clone()));
                        }
                    }
                }
            } else if let Some(index) = device.rsplit_once('-').and_then(|(p, i)| {
                p.chars().all(|c| c.is_ascii_lowercase()).then_some(i).and_then(|i| i.parse::<u32>().ok())
            }) {
                // Another vendor's driver (NVIDIA's gpu.nvidia.com names `gpu-0`): its domain
                // picks the vendor, the number the index.
                for v in vendors_of(inventory, driver) {
                    if let Some(d) = v.devices.iter().find(|d| d.index == index) {
                        out.push((v, d, None, via.clone()));
                    }
                }
            }
        }
    }
    out
}

/// actk's DRA device name of device `index` of `profile` (the rule of crates/actk-dra
/// `slice::device_name`: the profile as a DNS label, `-<index>`).
fn dra_device_name(profile: &str, index: u32) -> String {
    let mut p: String = profile
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' })
        .collect::<String>()
        .trim_matches('-')
        .to_string();
    if p.is_empty() {
        p = "dev".into();
    }
    let suffix = format!("-{index}");
    p.truncate(63 - suffix.len());
    format!("{}{suffix}", p.trim_end_matches('-'))
}

/// The device holding global core `core` (cores counted across devices in index order).
fn core_device(v: &VendorInventory, core: u32) -> Option<(&Device, Option<String>)> {
    let mut next = 0u32;
    for d in &v.devices {
        let n = d.cores?;
        if core < next + n {
            return Some((d, Some(format!("core {core}"))));
        }
        next += n;
    }
    None
}

/// The devices a device name of `v` names, with the part: an index, a UUID, `all`, a MIG
/// device as `G:M` or by its UUID.
pub fn resolve_name<'a>(v: &'a VendorInventory, name: &str) -> Vec<(&'a Device, Option<String>)> {
    if name == "all" {
        return v.devices.iter().map(|d| (d, None)).collect();
    }
    if let Ok(i) = name.parse::<u32>() {
        return v.devices.iter().filter(|d| d.index == i).map(|d| (d, None)).collect();
    }
    if let Some(d) = v.devices.iter().find(|d| d.uuid.as_deref() == Some(name)) {
        return vec![(d, None)];
    }
    if let Some((g, m)) = name.split_once(':')
        && let (Ok(g), Ok(m)) = (g.parse::<u32>(), m.parse::<u32>())
        && let Some(d) = v.devices.iter().find(|d| d.index == g)
    {
        return vec![(d, Some(format!("MIG {g}:{m}")))];
    }
    for d in &v.devices {
        if let Some(m) = d.mig.as_ref().and_then(|mig| mig.devices.iter().find(|m| m.uuid == name)) {
            return vec![(d, Some(format!("MIG {}:{} {}", d.index, m.index, m.profile)))];
        }
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;
    use actk_core::inventory::{DeviceNode, Mig, MigDevice};

    fn node(path: &str, major: u32, minor: u32) -> DeviceNode {
        DeviceNode {
            path: path.into(),
            host_path: path.into(),
            node_type: 'c',
            major,
            minor,
            file_mode: None,
            gid: None,
        }
    }

    fn inventory() -> Inventory {
        let gpu = |i: u32| Device {
            index: i,
            uuid: Some(format!("GPU-{i}")),
            nodes: vec![node(&format!("/dev/nvidia{i}"), 195, i)],
            ..Default::default()
        };
        let mut g1 = gpu(1);
        g1.mig = Some(Mig {
            enabled: true,
            devices: vec![MigDevice {
                index: 0,
                uuid: "MIG-a".into(),
                profile: "1g.10gb".into(),
                ..Default::default()
            }],
        });
        let neuron = |i: u32| Device {
            index: i,
            uuid: Some(format!("serial{i}")),
            cores: Some(2),
            nodes: vec![node(&format!("/dev/neuron{i}"), 240, i)],
            ..Default::default()
        };
        Inventory {
            vendors: vec![
                VendorInventory {
                    profile: "nvidia".into(),
                    kind: "nvidia.com/gpu".into(),
                    devices: vec![gpu(0), g1, gpu(2), gpu(3)],
                    ..Default::default()
                },
                VendorInventory {
                    profile: "neuron".into(),
                    kind: "aws.amazon.com/neuron".into(),
                    devices: vec![neuron(0), neuron(1)],
                    ..Default::default()
                },
            ],
            ..Default::default()
        }
    }

    fn holders_of(out: &[DeviceHolders], kind: &str, index: u32) -> Vec<Holder> {
        out.iter().find(|d| d.kind == kind && d.index == index).map(|d| d.holders.clone()).unwrap()
    }

    #[test]
    fn applied_annotation_parses_into_kinds_names_and_sources() {
        let s = parse_applied(
            "nvidia.com/gpu=1,3 (NVIDIA_VISIBLE_DEVICES, generated); example.com/accel=0 (annotation cdi.k8s.io/x, spec); nvidia.com/gpu=none (NVIDIA_VISIBLE_DEVICES, generated)",
            "actk-runtime",
        );
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].kind, "nvidia.com/gpu");
        assert_eq!(s[0].names, ["1", "3"]);
        assert_eq!(s[0].via, "NVIDIA_VISIBLE_DEVICES (actk-runtime)");
        assert_eq!(s[1].via, "annotation cdi.k8s.io/x (actk-runtime)");
        assert!(parse_applied("garbage", "x").is_empty());
    }

    #[test]
    fn device_plugin_ids_map_to_devices_migs_cores_and_replicas() {
        let inv = inventory();
        let alloc = |resource: &str, id: &str| Allocation {
            namespace: "ns".into(),
            pod: "p".into(),
            container: "c".into(),
            what: Allocated::DevicePlugin { resource: resource.into(), id: id.into() },
        };
        let out = attribute(
            &inv,
            &[
                alloc("nvidia.com/gpu", "GPU-0"),
                alloc("nvidia.com/gpu.shared", "GPU-2::3"),
                alloc("nvidia.com/mig-1g.10gb", "MIG-a"),
                alloc("aws.amazon.com/neuroncore", "3"),
                alloc("nvidia.com/gpu", "GPU-unknown"),
                // The exporter's telemetry grant (actk-device-plugin telemetry_grant) reaches
                // every GPU's nodes but holds none of them.
                alloc("actk.dev/telemetry", "telemetry"),
            ],
            &[],
        );
        assert_eq!(holders_of(&out, "nvidia.com/gpu", 0)[0].via, "device plugin nvidia.com/gpu");
        assert_eq!(holders_of(&out, "nvidia.com/gpu", 2)[0].part.as_deref(), Some("replica 3"));
        assert_eq!(holders_of(&out, "nvidia.com/gpu", 1)[0].part.as_deref(), Some("MIG 1:0 1g.10gb"));
        assert_eq!(holders_of(&out, "aws.amazon.com/neuron", 1)[0].part.as_deref(), Some("core 3"));
        assert!(holders_of(&out, "nvidia.com/gpu", 3).is_empty());
        assert!(out.iter().flat_map(|d| &d.holders).all(|h| !h.via.contains("telemetry")), "{out:?}");
        assert!(holders_of(&out, "aws.amazon.com/neuron", 0).is_empty());
    }

    #[test]
    fn dra_devices_map_by_actk_names_and_other_drivers_by_domain() {
        let inv = inventory();
        let dra = |driver: &str, device: &str| Allocation {
            namespace: "ns".into(),
            pod: "p".into(),
            container: "c".into(),
            what: Allocated::Dra {
                claim_namespace: "ns".into(),
                claim_name: "claim".into(),
                driver: driver.into(),
                pool: "node".into(),
                device: device.into(),
            },
        };
        let out = attribute(&inv, &[dra("actk.dev", "neuron-1"), dra("gpu.nvidia.com", "gpu-2")], &[]);
        assert_eq!(holders_of(&out, "aws.amazon.com/neuron", 1)[0].via, "DRA claim ns/claim (actk.dev)");
        assert_eq!(holders_of(&out, "nvidia.com/gpu", 2)[0].via, "DRA claim ns/claim (gpu.nvidia.com)");
    }

    #[test]
    fn running_containers_by_annotation_and_by_device_node_and_cri_twins_merge() {
        let inv = inventory();
        let plain = RunningContainer {
            id: "abc".into(),
            engine: "docker".into(),
            name: Some("train".into()),
            served: parse_applied("nvidia.com/gpu=1 (NVIDIA_VISIBLE_DEVICES, generated)", "actk-runtime"),
            // Its own node of GPU 1 is not listed twice; GPU 3 comes only from a node.
            device_nodes: vec![('c', 195, 1, "/dev/nvidia1".into()), ('c', 195, 3, "/dev/nvidia3".into())],
            ..Default::default()
        };
        let cri = RunningContainer {
            id: "def".into(),
            engine: "containerd".into(),
            name: Some("main".into()),
            pod: Some(("ns".into(), "p".into())),
            device_nodes: vec![('c', 195, 0, "/dev/nvidia0".into())],
            ..Default::default()
        };
        let alloc = Allocation {
            namespace: "ns".into(),
            pod: "p".into(),
            container: "main".into(),
            what: Allocated::DevicePlugin { resource: "nvidia.com/gpu".into(), id: "GPU-0".into() },
        };
        let out = attribute(&inv, &[alloc], &[plain, cri]);
        let g1 = holders_of(&out, "nvidia.com/gpu", 1);
        assert_eq!(g1.len(), 1);
        assert_eq!(g1[0].via, "NVIDIA_VISIBLE_DEVICES (actk-runtime)");
        assert_eq!(holders_of(&out, "nvidia.com/gpu", 3)[0].via, "device node /dev/nvidia3");
        let g0 = holders_of(&out, "nvidia.com/gpu", 0);
        assert_eq!(g0.len(), 1, "{g0:?}");
        assert_eq!(g0[0].container_id.as_deref(), Some("def"));
        assert_eq!(g0[0].engine, "containerd");
        assert_eq!(g0[0].via, "device plugin nvidia.com/gpu");
    }
}
