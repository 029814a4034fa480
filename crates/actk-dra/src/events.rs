//! Failures where the user looks: Events on claims and their pods, and device conditions in the
//! claim's status, for what this node's driver knows and the scheduler cannot say ("cannot
//! allocate all claims" is all it says).
//!
//! The driver of each node judges the claims that ask for a DeviceClass of the chart (label
//! `actk.dev/profile`, [`PROFILE_LABEL`]) against this node's pool ([`PoolState`], kept by the
//! publisher):
//! - an unallocated claim whose class's profile this node cannot serve at all gets a Warning
//!   event, on the claim and on the pod that owns it (a claim made from a template), with the
//!   reason: [`SERVED_BY_DEVICE_PLUGIN`] (one kind, one server: the device plugin advertises
//!   the kind here), [`NOT_SERVED`] (the driver's profiles leave it out), [`NO_DEVICES`],
//!   [`DEVICES_UNHEALTHY`], [`MIG_ENABLED`] (fewer free GPUs outside MIG mode than the request
//!   asks for, while GPUs in MIG mode, which the classes do not match, are there). Plain
//!   contention (every device allocated) is left to the scheduler's message;
//! - an allocated device of this pool that turns unhealthy or disappears gets a Warning event on
//!   the claim and on every pod the claim is reserved for ([`DEVICE_UNHEALTHY`],
//!   [`DEVICE_GONE`]), and the condition `Ready=False` with that reason on the device in the
//!   claim's `status.devices` (resource.k8s.io/v1 AllocatedDeviceStatus, KEP-4817, on by default
//!   since 1.33), which `kubectl describe resourceclaim` shows; `Ready=True` once it is back.
//!
//! Each (object, reason, message) is posted once per driver process. The judging is pure
//! ([`notices`]); [`crate::kube`] lists and posts.

use crate::slice::DRIVER;
use k8s_openapi::api::resource::v1::ResourceClaim;
use std::collections::{BTreeMap, BTreeSet};

/// Label of the chart's DeviceClasses naming the profile they select.
pub const PROFILE_LABEL: &str = "actk.dev/profile";

/// Reason: a device plugin serves the class's kind on this node.
pub const SERVED_BY_DEVICE_PLUGIN: &str = "ServedByDevicePlugin";
/// Reason: the driver on this node does not serve the class's profile.
pub const NOT_SERVED: &str = "ProfileNotServed";
/// Reason: this node has no device of the class's profile.
pub const NO_DEVICES: &str = "NoDevices";
/// Reason: every device of the profile on this node is unhealthy.
pub const DEVICES_UNHEALTHY: &str = "DevicesUnhealthy";
/// Reason: every device of the profile on this node is a GPU in MIG mode.
pub const MIG_ENABLED: &str = "MigEnabled";
/// Reason: an allocated device is unhealthy.
pub const DEVICE_UNHEALTHY: &str = "DeviceUnhealthy";
/// Reason: an allocated device is no longer on the node.
pub const DEVICE_GONE: &str = "DeviceGone";
/// Reason of `Ready=True` once an allocated device is healthy again.
pub const DEVICE_HEALTHY: &str = "DeviceHealthy";

/// What one profile is on this node, as the publisher last saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProfileState {
    /// Published: healthy devices (slice device names), whole ones and GPUs in MIG mode (which
    /// the classes do not match), and how many were left out as unhealthy.
    Published {
        /// Healthy devices not in MIG mode.
        whole: BTreeSet<String>,
        /// Healthy GPUs in MIG mode.
        mig: BTreeSet<String>,
        /// Devices left out as unhealthy.
        unhealthy: usize,
    },
    /// Left out: a device plugin advertises this resource on the node.
    DevicePlugin(String),
    /// Left out: the per-node choice gives it to the device plugin here (the label, or the
    /// default, as `crate::servers::Choice::by_label` says it).
    NodeLabel(String),
    /// Left out: the driver's profiles (`--profiles`) do not include it.
    NotServed,
}

/// This node's pool as the publisher last saw it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolState {
    /// Whether the pool is published (the kubelet registered the driver).
    pub published: bool,
    /// Every profile with devices on the node (discovered), by name.
    pub profiles: BTreeMap<String, ProfileState>,
    /// Published devices (slice device names).
    pub devices: BTreeSet<String>,
    /// Unhealthy devices (slice device names) and why.
    pub unhealthy: BTreeMap<String, String>,
    /// Profiles the driver serves (`None`: every profile).
    pub served: Option<BTreeSet<String>>,
}

/// An object an event is about.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Object {
    /// `v1` or `resource.k8s.io/v1`.
    pub api_version: String,
    /// `Pod` or `ResourceClaim`.
    pub kind: String,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID.
    pub uid: String,
}

/// One thing to tell the user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    /// The claim, then the pods (owner, or those it is reserved for).
    pub objects: Vec<Object>,
    /// Event reason (CamelCase).
    pub reason: &'static str,
    /// What happened, where, and what to do.
    pub message: String,
    /// For an allocated device: its entry of the claim's `status.devices`.
    pub device: Option<DeviceStatus>,
}

/// An allocated device's entry in the claim's `status.devices` (resource.k8s.io/v1
/// AllocatedDeviceStatus): the API server keys it by driver, pool, device and `shareID`, and
/// refuses an entry that matches no allocation result, so a share of a device allocated with
/// consumable capacity (KEP-5075, a result with `shareID`) must name its share.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceStatus {
    /// The device's name in the pool.
    pub device: String,
    /// The allocation result's `shareID`, when it has one.
    pub share_id: Option<String>,
    /// Whether its condition `Ready` is True.
    pub ready: bool,
}

fn claim_object(c: &ResourceClaim) -> Object {
    Object {
        api_version: "resource.k8s.io/v1".into(),
        kind: "ResourceClaim".into(),
        namespace: c.metadata.namespace.clone().unwrap_or_default(),
        name: c.metadata.name.clone().unwrap_or_default(),
        uid: c.metadata.uid.clone().unwrap_or_default(),
    }
}

fn pod_object(namespace: &str, name: &str, uid: &str) -> Object {
    Object {
        api_version: "v1".into(),
        kind: "Pod".into(),
        namespace: namespace.into(),
        name: name.into(),
        uid: uid.into(),
    }
}

/// Why a request for `count` devices (`None`: all) of a profile cannot be served on this node
/// now: (reason, message), `None` when it can, or when it waits for devices other claims hold.
/// `allocated`: the pool's devices allocated to claims.
fn unservable(
    node: &str,
    profile: &str,
    class: &str,
    count: Option<i64>,
    state: &PoolState,
    allocated: &BTreeSet<&str>,
) -> Option<(&'static str, String)> {
    if state.served.as_ref().is_some_and(|s| !s.contains(profile)) {
        let list = state.served.iter().flatten().cloned().collect::<Vec<_>>().join(", ");
        return Some((
            NOT_SERVED,
            format!(
                "node {node}: the actk DRA driver here serves profiles {list}, not {profile}, so no {class} device can be allocated on it (chart: dra.profiles)"
            ),
        ));
    }
    match state.profiles.get(profile) {
        None => Some((NO_DEVICES, format!("node {node} has no {profile} device for class {class}"))),
        Some(ProfileState::NotServed) => Some((
            NOT_SERVED,
            format!("node {node}: the actk DRA driver here does not serve profile {profile} (chart: dra.profiles)"),
        )),
        Some(ProfileState::NodeLabel(why)) => Some((
            SERVED_BY_DEVICE_PLUGIN,
            format!(
                "node {node}: the device plugin serves {profile} there ({why}), so actk.dev publishes no {profile} devices for class {class} (one kind, one server); ask for the kind's extended resource in resources.limits on that node, or label it {}={}",
                crate::servers::label(profile),
                crate::servers::DRA
            ),
        )),
        Some(ProfileState::DevicePlugin(r)) => Some((
            SERVED_BY_DEVICE_PLUGIN,
            format!(
                "node {node}: the device plugin serves {r} there (Node allocatable), so actk.dev publishes no {profile} devices for class {class} (one kind, one server); ask for {r} in resources.limits on that node, or let DRA serve it (leave {r} out of the device plugin's config.resources)"
            ),
        )),
        Some(ProfileState::Published { whole, mig, unhealthy }) => {
            if whole.is_empty() && mig.is_empty() {
                return Some(if *unhealthy > 0 {
                    (
                        DEVICES_UNHEALTHY,
                        format!(
                            "node {node}: all {unhealthy} {profile} device(s) are unhealthy (the driver's log says why)"
                        ),
                    )
                } else {
                    (NO_DEVICES, format!("node {node} has no {profile} device for class {class}"))
                });
            }
            let free = whole.iter().filter(|d| !allocated.contains(d.as_str())).count();
            let want = count.unwrap_or((whole.len() + mig.len()) as i64);
            if mig.is_empty() || want <= free as i64 {
                return None;
            }
            Some((
                MIG_ENABLED,
                format!(
                    "node {node}: {free} of its {} whole {profile} GPU(s) are free for a request of {want}; {} more are in MIG mode, which class {class} does not match (a CUDA process cannot use a MIG-mode GPU whole; claim its MIG devices with class actk-nvidia-mig); turn MIG off on a GPU to serve it whole",
                    whole.len(),
                    mig.len()
                ),
            ))
        }
    }
}

/// The notices for `claims` on node `node` with pool `state`; `classes` maps the chart's
/// DeviceClass names to their profile ([`PROFILE_LABEL`]).
pub fn notices(
    node: &str,
    state: &PoolState,
    classes: &BTreeMap<String, String>,
    claims: &[ResourceClaim],
) -> Vec<Notice> {
    let mut out = Vec::new();
    if !state.published {
        return out;
    }
    let allocated: BTreeSet<&str> = claims
        .iter()
        .filter_map(|c| c.status.as_ref()?.allocation.as_ref()?.devices.as_ref()?.results.as_ref())
        .flatten()
        .filter(|r| r.driver == DRIVER && r.pool == node)
        .map(|r| r.device.as_str())
        .collect();
    for c in claims {
        let claim = claim_object(c);
        let alloc = c.status.as_ref().and_then(|s| s.allocation.as_ref());
        match alloc {
            None => {
                let pods: Vec<Object> = c
                    .metadata
                    .owner_references
                    .iter()
                    .flatten()
                    .filter(|o| o.kind == "Pod" && o.api_version == "v1")
                    .map(|o| pod_object(&claim.namespace, &o.name, &o.uid))
                    .collect();
                for r in c
                    .spec
                    .as_ref()
                    .and_then(|s| s.devices.as_ref())
                    .and_then(|d| d.requests.as_ref())
                    .into_iter()
                    .flatten()
                {
                    // (class, count: None for allocationMode All)
                    let wanted = |mode: Option<&String>, count: Option<i64>| match mode.map(String::as_str) {
                        Some("All") => None,
                        _ => Some(count.unwrap_or(1)),
                    };
                    let alternatives: Vec<(&str, Option<i64>)> = match (&r.exactly, &r.first_available) {
                        (Some(e), _) => {
                            vec![(e.device_class_name.as_str(), wanted(e.allocation_mode.as_ref(), e.count))]
                        }
                        (None, Some(subs)) => subs
                            .iter()
                            .map(|s| (s.device_class_name.as_str(), wanted(s.allocation_mode.as_ref(), s.count)))
                            .collect(),
                        (None, None) => vec![],
                    };
                    let judged: Vec<Option<(&'static str, String)>> = alternatives
                        .iter()
                        .map(|(class, n)| {
                            classes.get(*class).and_then(|p| unservable(node, p, class, *n, state, &allocated))
                        })
                        .collect();
                    // Every alternative is a class of ours that this node cannot serve.
                    if judged.is_empty() || judged.iter().any(Option::is_none) {
                        continue;
                    }
                    let Some(Some((reason, why))) = judged.into_iter().next() else { continue };
                    let mut objects = vec![claim.clone()];
                    objects.extend(pods.iter().cloned());
                    out.push(Notice {
                        objects,
                        reason,
                        message: format!("claim {} request {}: {why}", claim.name, r.name),
                        device: None,
                    });
                }
            }
            Some(a) => {
                let reserved: Vec<Object> = c
                    .status
                    .as_ref()
                    .and_then(|s| s.reserved_for.as_ref())
                    .into_iter()
                    .flatten()
                    .filter(|r| r.resource == "pods")
                    .map(|r| pod_object(&claim.namespace, &r.name, &r.uid))
                    .collect();
                let results = a.devices.as_ref().and_then(|d| d.results.as_ref()).into_iter().flatten();
                for r in results.filter(|r| r.driver == DRIVER && r.pool == node) {
                    let (reason, why, ready) = if let Some(why) = state.unhealthy.get(&r.device) {
                        (DEVICE_UNHEALTHY, format!("is unhealthy: {why}"), false)
                    } else if !state.devices.contains(&r.device) {
                        (DEVICE_GONE, "is no longer on the node".to_string(), false)
                    } else {
                        (DEVICE_HEALTHY, String::new(), true)
                    };
                    let mut objects = vec![claim.clone()];
                    objects.extend(reserved.iter().cloned());
                    out.push(Notice {
                        objects,
                        reason,
                        message: if ready {
                            format!("device {} of claim {} on node {node} is healthy", r.device, claim.name)
                        } else {
                            format!(
                                "device {} of claim {} on node {node} {why}; containers that use it may fail; delete the pod to get another device",
                                r.device, claim.name
                            )
                        },
                        device: Some(DeviceStatus { device: r.device.clone(), share_id: r.share_id.clone(), ready }),
                    });
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::resource::v1::{
        AllocationResult, DeviceAllocationResult, DeviceClaim, DeviceRequest, DeviceRequestAllocationResult,
        ExactDeviceRequest, ResourceClaimConsumerReference, ResourceClaimSpec, ResourceClaimStatus,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

    fn pending(class: &str) -> ResourceClaim {
        ResourceClaim {
            metadata: ObjectMeta {
                name: Some("pod-gpu-x1".into()),
                namespace: Some("ns".into()),
                uid: Some("c1".into()),
                owner_references: Some(vec![OwnerReference {
                    api_version: "v1".into(),
                    kind: "Pod".into(),
                    name: "pod".into(),
                    uid: "p1".into(),
                    ..Default::default()
                }]),
                ..Default::default()
            },
            spec: Some(ResourceClaimSpec {
                devices: Some(DeviceClaim {
                    requests: Some(vec![DeviceRequest {
                        name: "gpu".into(),
                        exactly: Some(ExactDeviceRequest { device_class_name: class.into(), ..Default::default() }),
                        ..Default::default()
                    }]),
                    ..Default::default()
                }),
            }),
            status: None,
        }
    }

    fn allocated(device: &str) -> ResourceClaim {
        let mut c = pending("actk-nvidia");
        c.metadata.owner_references = None;
        c.status = Some(ResourceClaimStatus {
            allocation: Some(AllocationResult {
                devices: Some(DeviceAllocationResult {
                    results: Some(vec![DeviceRequestAllocationResult {
                        driver: DRIVER.into(),
                        pool: "n1".into(),
                        device: device.into(),
                        request: "gpu".into(),
                        ..Default::default()
                    }]),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            reserved_for: Some(vec![ResourceClaimConsumerReference {
                resource: "pods".into(),
                name: "user".into(),
                uid: "p2".into(),
                ..Default::default()
            }]),
            ..Default::default()
        });
        c
    }

    fn classes() -> BTreeMap<String, String> {
        [("actk-nvidia".to_string(), "nvidia".to_string()), ("actk-neuron".into(), "neuron".into())].into()
    }

    fn state(nvidia: ProfileState) -> PoolState {
        PoolState {
            published: true,
            profiles: [("nvidia".to_string(), nvidia)].into(),
            devices: ["nvidia-0".to_string()].into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_pending_claim_hears_why_this_node_cannot_serve_its_class() {
        let c = pending("actk-nvidia");
        let n = notices(
            "n1",
            &state(ProfileState::DevicePlugin("nvidia.com/gpu".into())),
            &classes(),
            std::slice::from_ref(&c),
        );
        assert_eq!(n.len(), 1);
        assert_eq!(n[0].reason, SERVED_BY_DEVICE_PLUGIN);
        assert_eq!(n[0].objects.iter().map(|o| o.kind.as_str()).collect::<Vec<_>>(), ["ResourceClaim", "Pod"]);
        assert!(n[0].message.contains("node n1") && n[0].message.contains("nvidia.com/gpu"), "{}", n[0].message);
        let gpus = |r: std::ops::Range<u32>| -> BTreeSet<String> { r.map(|i| format!("nvidia-{i}")).collect() };
        let mig = ProfileState::Published { whole: gpus(0..0), mig: gpus(0..4), unhealthy: 0 };
        assert_eq!(notices("n1", &state(mig), &classes(), std::slice::from_ref(&c))[0].reason, MIG_ENABLED);
        // 8 GPUs, 0-3 in MIG mode: a request for 5 cannot be served, one for 4 can ...
        let half = ProfileState::Published { whole: gpus(4..8), mig: gpus(0..4), unhealthy: 0 };
        let with_count = |n: i64| {
            let mut x = c.clone();
            x.spec.as_mut().unwrap().devices.as_mut().unwrap().requests.as_mut().unwrap()[0]
                .exactly
                .as_mut()
                .unwrap()
                .count = Some(n);
            x
        };
        let n = notices("n1", &state(half.clone()), &classes(), &[with_count(5)]);
        assert_eq!(n[0].reason, MIG_ENABLED);
        assert!(n[0].message.contains("4 of its 4 whole") && n[0].message.contains("request of 5"), "{}", n[0].message);
        assert!(n[0].message.contains("4 more are in MIG mode"), "{}", n[0].message);
        assert!(notices("n1", &state(half.clone()), &classes(), &[with_count(4)]).is_empty());
        // ... until the whole ones are allocated: then the MIG-mode GPUs are the reason.
        let mut held = allocated("nvidia-4");
        let results = (4..8)
            .map(|i| DeviceRequestAllocationResult {
                driver: DRIVER.into(),
                pool: "n1".into(),
                device: format!("nvidia-{i}"),
                request: "gpu".into(),
                ..Default::default()
            })
            .collect();
        held.status.as_mut().unwrap().allocation.as_mut().unwrap().devices.as_mut().unwrap().results = Some(results);
        let n = notices("n1", &state(half), &classes(), &[held, with_count(1)]);
        let waiting: Vec<&Notice> = n.iter().filter(|x| x.device.is_none()).collect();
        assert_eq!(waiting.len(), 1, "{n:?}");
        assert!(waiting[0].message.contains("0 of its 4 whole"), "{}", waiting[0].message);
        let sick = ProfileState::Published { whole: gpus(0..0), mig: gpus(0..0), unhealthy: 2 };
        assert_eq!(notices("n1", &state(sick), &classes(), std::slice::from_ref(&c))[0].reason, DEVICES_UNHEALTHY);
        assert_eq!(
            notices("n1", &state(ProfileState::NotServed), &classes(), std::slice::from_ref(&c))[0].reason,
            NOT_SERVED
        );
        // A node without the kind; another driver's class and a servable node say nothing.
        assert_eq!(
            notices("n1", &state(ProfileState::NotServed), &classes(), &[pending("actk-neuron")])[0].reason,
            NO_DEVICES
        );
        assert!(notices("n1", &state(ProfileState::NotServed), &classes(), &[pending("gpu.example.com")]).is_empty());
        let fine = ProfileState::Published { whole: gpus(0..8), mig: gpus(0..0), unhealthy: 0 };
        assert!(
            notices("n1", &state(fine), &classes(), std::slice::from_ref(&c)).is_empty(),
            "contention is the scheduler's"
        );
        // Nothing before the pool is published.
        let mut s = state(ProfileState::NotServed);
        s.published = false;
        assert!(notices("n1", &s, &classes(), &[c]).is_empty());
    }

    #[test]
    fn an_allocated_device_that_turns_unhealthy_or_goes_is_told_to_claim_and_pods() {
        let fine =
            ProfileState::Published { whole: ["nvidia-0".to_string()].into(), mig: BTreeSet::new(), unhealthy: 0 };
        let mut s = state(fine);
        let n = notices("n1", &s, &classes(), &[allocated("nvidia-0")]);
        let status = |ready| Some(DeviceStatus { device: "nvidia-0".into(), share_id: None, ready });
        assert_eq!((n[0].reason, n[0].device.clone()), (DEVICE_HEALTHY, status(true)));
        s.unhealthy.insert("nvidia-0".into(), "/dev/nvidia0 is gone".into());
        s.devices.clear();
        let n = notices("n1", &s, &classes(), &[allocated("nvidia-0")]);
        assert_eq!(n[0].reason, DEVICE_UNHEALTHY);
        assert!(n[0].message.contains("/dev/nvidia0 is gone"), "{}", n[0].message);
        assert_eq!(n[0].objects[1], pod_object("ns", "user", "p2"));
        assert_eq!(n[0].device, status(false));
        // A share of a device allocated with consumable capacity names its share: the API
        // server keys status.devices by shareID too.
        let mut shared = allocated("nvidia-0");
        let devices = shared.status.as_mut().unwrap().allocation.as_mut().unwrap().devices.as_mut().unwrap();
        devices.results.as_mut().unwrap()[0].share_id = Some("7c5f0a1e-0000-4000-8000-000000000001".into());
        let n = notices("n1", &s, &classes(), &[shared]);
        assert_eq!(n[0].device.as_ref().unwrap().share_id.as_deref(), Some("7c5f0a1e-0000-4000-8000-000000000001"));
        s.unhealthy.clear();
        assert_eq!(notices("n1", &s, &classes(), &[allocated("nvidia-0")])[0].reason, DEVICE_GONE);
        // Devices of another pool are that node's driver's business.
        assert!(notices("n2", &s, &classes(), &[allocated("nvidia-0")]).is_empty());
    }
}
