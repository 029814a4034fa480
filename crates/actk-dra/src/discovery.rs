//! What the API server serves, found at start, so that one driver binary (built with
//! k8s-openapi's newest types, `v1_37`) works with every Kubernetes from 1.34 on: the server's
//! version, the `resource.k8s.io` versions it serves (the driver needs `v1`, Kubernetes 1.34+),
//! and whether it keeps fields that only some versions and feature gates have.
//!
//! Fields are found by asking, not from the version number (an admin can turn a gate off, or
//! on): a server-side apply of a probe ResourceSlice with `dryRun=All` (nothing is stored), and
//! the server's answer shows what it kept. A field a feature gate turns off is dropped from the
//! answer. The probe slice is one of this node's (`spec.nodeName` is the node), so the chart's
//! node-scoped write policy lets it through.
//!
//! Probed: `devices[].taints` (DRADeviceTaints, KEP-5055: alpha in 1.33, beta and on by default
//! in 1.36, GA in 1.37) and `sharedCounters` (DRAPartitionableDevices, KEP-4815: alpha in 1.33,
//! beta and on by default in 1.36; used by dynamic MIG, [`crate::mig`]). Everything else
//! the driver writes is in `resource.k8s.io/v1` as 1.34 serves it.

use crate::slice::DRIVER;
use k8s_openapi::api::resource::v1::{
    Counter, CounterSet, Device, DeviceTaint, ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, Patch, PatchParams};

/// The API group of DRA.
pub const GROUP: &str = "resource.k8s.io";

/// What the API server serves.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ApiFeatures {
    /// `gitVersion` of `/version` (`v1.37.2`).
    pub server_version: String,
    /// `(major, minor)` of the server, when it says.
    pub minor: Option<(u32, u32)>,
    /// Versions of `resource.k8s.io` served (`v1`, `v1beta2`, ...), preferred first.
    pub resource_versions: Vec<String>,
    /// Whether the server keeps device taints in ResourceSlices; `None` when the probe failed.
    pub device_taints: Option<bool>,
    /// Whether the server keeps shared counters in ResourceSlices (DRAPartitionableDevices,
    /// KEP-4815: alpha in 1.33, beta and on by default from 1.36); `None` when the probe failed
    /// or was not made.
    pub partitionable_devices: Option<bool>,
}

/// Why the driver cannot work with this API server.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DiscoveryError {
    /// `resource.k8s.io/v1` is not served.
    #[error(
        "the API server ({server}) serves {GROUP} {served}, not v1: actk-dra-driver needs resource.k8s.io/v1, Kubernetes 1.34 or newer (on 1.32 and 1.33 it is off by default; upgrade the control plane)"
    )]
    NoV1 {
        /// The server's version.
        server: String,
        /// What it serves instead (`none` when the group is not served at all).
        served: String,
    },
}

impl ApiFeatures {
    /// Checks that the driver can work with this server ([`DiscoveryError::NoV1`]).
    pub fn check(&self) -> Result<(), DiscoveryError> {
        if self.resource_versions.iter().any(|v| v == "v1") {
            return Ok(());
        }
        Err(DiscoveryError::NoV1 {
            server: self.server_version.clone(),
            served: if self.resource_versions.is_empty() { "none".into() } else { self.resource_versions.join(", ") },
        })
    }

    /// One line for the log.
    pub fn summary(&self) -> String {
        let taints = match self.device_taints {
            Some(true) => "kept",
            Some(false) => "dropped (DRADeviceTaints off)",
            None => "not probed",
        };
        let counters = match self.partitionable_devices {
            Some(true) => "kept",
            Some(false) => "dropped (DRAPartitionableDevices off)",
            None => "not probed",
        };
        format!(
            "API server {}: {GROUP} {}; device taints in ResourceSlices {taints}; shared counters {counters}",
            self.server_version,
            self.resource_versions.join(", ")
        )
    }
}

/// Whether the driver publishes consumable capacity, for `--sharing` `setting` (`auto`, `on`,
/// `off`) and the server's `(major, minor)`, with the reason for the log. `auto` is on from
/// Kubernetes 1.35: 1.34's allocator does not go on to the next matching device once one is
/// partly allocated (kubernetes/kubernetes#133705, fixed in 1.35 by #133706), so with
/// DRAConsumableCapacity on there a second claim for "any GPU" would wait, whole-device claims
/// too. Where the server does not serve the gate it drops the fields itself.
pub fn sharing(setting: &str, minor: Option<(u32, u32)>) -> (bool, String) {
    match setting {
        "on" => (true, "published (--sharing on)".into()),
        "off" => (false, "not published (--sharing off): every claim gets whole devices".into()),
        _ => match minor {
            Some(v) if v >= (1, 35) => (
                true,
                "published (--sharing auto, Kubernetes 1.35+; kept where DRAConsumableCapacity is on, beta and on by default from 1.36)".into(),
            ),
            _ => (
                false,
                "not published (--sharing auto on Kubernetes 1.34: its allocator stops at the first partly allocated device, kubernetes/kubernetes#133705; --sharing on to publish it anyway)".into(),
            ),
        },
    }
}

/// `(major, minor)` of a `/version` answer's fields (`minor` may carry a `+`, as on some
/// managed clusters: `"34+"`).
pub fn parse_version(major: &str, minor: &str) -> Option<(u32, u32)> {
    let digits = |s: &str| s.chars().take_while(char::is_ascii_digit).collect::<String>().parse().ok();
    Some((digits(major)?, digits(minor)?))
}

/// Asks the API server what it serves (see the module docs); `node` is this node (the probe
/// slice is one of its pool).
///
/// Errors: the version or group list cannot be read (the message names the call). A failed
/// probe is not an error: its field is `None`.
pub async fn discover(client: &kube::Client, node: &str) -> Result<ApiFeatures, String> {
    let info = client.apiserver_version().await.map_err(|e| format!("reading the API server's /version: {e}"))?;
    let groups = client.list_api_groups().await.map_err(|e| format!("listing the API server's groups: {e}"))?;
    let mut versions: Vec<String> = Vec::new();
    if let Some(g) = groups.groups.iter().find(|g| g.name == GROUP) {
        if let Some(p) = &g.preferred_version {
            versions.push(p.version.clone());
        }
        for v in &g.versions {
            if !versions.contains(&v.version) {
                versions.push(v.version.clone());
            }
        }
    }
    let mut f = ApiFeatures {
        server_version: info.git_version.clone(),
        minor: parse_version(&info.major, &info.minor),
        resource_versions: versions,
        device_taints: None,
        partitionable_devices: None,
    };
    if f.check().is_ok() {
        f.device_taints = match probe_taints(client, node).await {
            Ok(kept) => Some(kept),
            Err(e) => {
                tracing::warn!("cannot probe whether the API server keeps device taints: {e}");
                None
            }
        };
        f.partitionable_devices = match probe_counters(client, node).await {
            Ok(kept) => Some(kept),
            Err(e) => {
                tracing::warn!("cannot probe whether the API server keeps shared counters: {e}");
                None
            }
        };
    }
    Ok(f)
}

/// A probe slice of `node`'s pool named `<node>-actk.dev-<suffix>` holding `spec`'s
/// devices or counter sets, never stored (dry run).
fn probe(node: &str, suffix: &str, spec: ResourceSliceSpec) -> ResourceSlice {
    ResourceSlice {
        metadata: ObjectMeta { name: Some(format!("{node}-{DRIVER}-{suffix}")), ..Default::default() },
        spec: ResourceSliceSpec {
            driver: DRIVER.into(),
            node_name: Some(node.into()),
            pool: ResourcePool { name: node.into(), generation: 0, resource_slice_count: 1 },
            ..spec
        },
    }
}

/// The probe slice of taints: one device with one taint.
pub fn probe_slice(node: &str) -> ResourceSlice {
    let device = Device {
        name: "probe-0".into(),
        taints: Some(vec![DeviceTaint {
            key: format!("{DRIVER}/probe"),
            effect: "NoSchedule".into(),
            ..Default::default()
        }]),
        ..Default::default()
    };
    probe(node, "probe", ResourceSliceSpec { devices: Some(vec![device]), ..Default::default() })
}

/// The probe slice of shared counters: one counter set and no devices (1.37 refuses both in
/// one slice).
pub fn probe_counters_slice(node: &str) -> ResourceSlice {
    let set = CounterSet {
        name: "probe".into(),
        counters: [("probe".to_string(), Counter { value: Quantity("1".into()) })].into(),
    };
    probe(node, "probe-counters", ResourceSliceSpec { shared_counters: Some(vec![set]), ..Default::default() })
}

/// What the API server makes of `slice` on a dry-run server-side apply (nothing is stored).
async fn dry_run(client: &kube::Client, slice: &ResourceSlice) -> Result<ResourceSlice, String> {
    let name = slice.metadata.name.clone().unwrap_or_default();
    let pp = PatchParams::apply(crate::kube::FIELD_MANAGER).force().dry_run();
    Api::<ResourceSlice>::all(client.clone())
        .patch(&name, &pp, &Patch::Apply(slice))
        .await
        .map_err(|e| format!("dry-run apply of ResourceSlice {name}: {e}"))
}

/// Whether the server kept the probe slice's counter set.
async fn probe_counters(client: &kube::Client, node: &str) -> Result<bool, String> {
    let back = dry_run(client, &probe_counters_slice(node)).await?;
    Ok(back.spec.shared_counters.is_some_and(|c| !c.is_empty()))
}

/// Whether the server kept the probe slice's taint.
async fn probe_taints(client: &kube::Client, node: &str) -> Result<bool, String> {
    let back = dry_run(client, &probe_slice(node)).await?;
    Ok(back.spec.devices.iter().flatten().any(|d| d.taints.as_ref().is_some_and(|t| !t.is_empty())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_and_the_v1_requirement() {
        assert_eq!(parse_version("1", "37"), Some((1, 37)));
        assert_eq!(parse_version("1", "34+"), Some((1, 34)));
        assert_eq!(parse_version("", "34"), None);
        let mut f = ApiFeatures {
            server_version: "v1.33.4".into(),
            resource_versions: vec!["v1beta2".into(), "v1beta1".into()],
            ..Default::default()
        };
        let e = f.check().unwrap_err().to_string();
        assert!(e.contains("v1.33.4") && e.contains("v1beta2, v1beta1") && e.contains("1.34 or newer"), "{e}");
        f.resource_versions.clear();
        assert!(f.check().unwrap_err().to_string().contains("serves resource.k8s.io none"));
        f.resource_versions = vec!["v1".into(), "v1beta2".into()];
        assert!(f.check().is_ok());
        assert!(f.summary().contains("not probed"));
    }

    #[test]
    fn consumable_capacity_from_1_35_unless_told() {
        assert!(!sharing("auto", Some((1, 34))).0);
        assert!(sharing("auto", Some((1, 34))).1.contains("#133705"));
        assert!(!sharing("auto", None).0);
        assert!(sharing("auto", Some((1, 35))).0);
        assert!(sharing("auto", Some((1, 37))).0);
        assert!(sharing("on", Some((1, 34))).0);
        assert!(!sharing("off", Some((1, 37))).0);
    }

    #[test]
    fn the_probe_is_one_of_this_nodes_slices() {
        let s = probe_slice("n1");
        assert_eq!(s.spec.node_name.as_deref(), Some("n1"));
        assert_eq!(s.spec.pool.name, "n1");
        let j = serde_json::to_value(&s).unwrap();
        assert_eq!(j["spec"]["devices"][0]["taints"][0]["effect"], "NoSchedule");
        // The counters' probe: its own name, a counter set and no devices beside it (1.37).
        let c = serde_json::to_value(probe_counters_slice("n1")).unwrap();
        assert_eq!(c["metadata"]["name"], "n1-actk.dev-probe-counters");
        assert_eq!((&c["spec"]["nodeName"], &c["spec"]["pool"]["name"]), (&"n1".into(), &"n1".into()));
        assert_eq!(c["spec"]["sharedCounters"][0]["counters"]["probe"]["value"], "1");
        assert!(c["spec"]["devices"].is_null(), "{c}");
    }
}
