//! CDI spec version rules: which `cdiVersion` a spec's fields require, and whether a spec's
//! declared version is known and high enough.
//!
//! Source: CNCF container-device-interface SPEC.md "Released versions" and specs-go/version.go
//! (v1.1.0). The rules, newest first:
//! - 1.1.0: `netDevices`, or `intelRdt` with `schemata` or `enableMonitoring: true`;
//! - 1.0.0, 0.8.0: no field changes (API-only releases);
//! - 0.7.0: `intelRdt`, `additionalGids` (spec or device level);
//! - 0.6.0: `annotations` (spec or device level), a dot in the kind's class;
//! - 0.5.0: `hostPath` on a device node, a device name starting with a digit;
//! - 0.4.0: `type` on a mount;
//! - 0.3.0: the base (0.1.0 and 0.2.0 are known but nothing requires them).
//!
//! Engines reject a spec whose declared version is below what its fields need, or a version
//! they do not know (podman 4.3 vendors CDI 0.5.x: it knows 0.1.0..0.5.0 only, and rejects
//! unknown fields such as `annotations`). actk therefore always declares the minimum.

use super::CdiError;
use super::spec::{ContainerEdits, Device, Spec};

/// The released CDI spec versions, oldest first.
pub const KNOWN_VERSIONS: &[&str] =
    &["0.1.0", "0.2.0", "0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0"];

/// The version a spec that uses no versioned field needs.
pub const BASE_VERSION: &str = "0.3.0";

/// The newest version actk knows.
pub const CURRENT_VERSION: &str = "1.1.0";

/// Position of a version in [`KNOWN_VERSIONS`] (a leading `v` is accepted, as version.go does);
/// `None` for an unknown version.
pub fn version_index(version: &str) -> Option<usize> {
    let v = version.strip_prefix('v').unwrap_or(version);
    KNOWN_VERSIONS.iter().position(|k| *k == v)
}

/// The parts of a spec whose version is judged together: the whole spec, its spec-level part
/// alone, or one device alone (a device that needs a newer version than the file declares is
/// refused by itself, see [`super::validate`]).
struct Parts<'a> {
    kind: &'a str,
    annotations: Option<&'a std::collections::BTreeMap<String, String>>,
    edits: Option<&'a ContainerEdits>,
    /// Devices with their index in the spec's `devices`.
    devices: Vec<(usize, &'a Device)>,
}

impl<'a> Parts<'a> {
    fn whole(spec: &'a Spec) -> Parts<'a> {
        Parts {
            kind: &spec.kind,
            annotations: Some(&spec.annotations),
            edits: Some(&spec.container_edits),
            devices: spec.devices.iter().enumerate().collect(),
        }
    }

    /// The edits of these parts: the spec-level ones, then each device's.
    fn all_edits(&self) -> impl Iterator<Item = (String, &'a ContainerEdits)> + '_ {
        self.edits.map(|e| ("containerEdits".to_string(), e)).into_iter().chain(
            self.devices.iter().map(|(i, d)| (format!("devices[{i}] ({}) containerEdits", d.name), &d.container_edits)),
        )
    }
}

/// The first feature of the parts that needs `version`, in words (e.g. `additionalGids (at
/// containerEdits)`), or `None` when they use nothing of that version.
fn feature_needing(parts: &Parts<'_>, version: &str) -> Option<String> {
    match version {
        "1.1.0" => parts.all_edits().find_map(|(at, e)| {
            if !e.net_devices.is_empty() {
                return Some(format!("netDevices (at {at})"));
            }
            let rdt = e.intel_rdt.as_ref()?;
            let schemata = rdt.get("schemata").is_some_and(|s| !s.is_null());
            let monitoring = rdt.get("enableMonitoring").and_then(|m| m.as_bool()).unwrap_or(false);
            (schemata || monitoring).then(|| format!("intelRdt.schemata or intelRdt.enableMonitoring (at {at})"))
        }),
        "0.7.0" => parts.all_edits().find_map(|(at, e)| {
            if e.intel_rdt.is_some() {
                Some(format!("intelRdt (at {at})"))
            } else if !e.additional_gids.is_empty() {
                Some(format!("additionalGids (at {at})"))
            } else {
                None
            }
        }),
        "0.6.0" => {
            if parts.annotations.is_some_and(|a| !a.is_empty()) {
                return Some("annotations (at the spec level)".into());
            }
            if let Some((i, d)) = parts.devices.iter().find(|(_, d)| !d.annotations.is_empty()) {
                return Some(format!("annotations (at devices[{i}] ({}))", d.name));
            }
            let class = parts.kind.split_once('/').map(|(_, c)| c).unwrap_or("");
            class.contains('.').then(|| format!("a dot in the kind's class ({:?})", parts.kind))
        }
        "0.5.0" => {
            if let Some((_, d)) =
                parts.devices.iter().find(|(_, d)| d.name.as_bytes().first().is_some_and(|b| b.is_ascii_digit()))
            {
                return Some(format!("a device name starting with a digit ({:?})", d.name));
            }
            parts.all_edits().find_map(|(at, e)| {
                e.device_nodes
                    .iter()
                    .find(|n| n.host_path.as_deref().is_some_and(|h| !h.is_empty()))
                    .map(|n| format!("hostPath on device node {} (at {at})", n.path))
            })
        }
        "0.4.0" => parts.all_edits().find_map(|(at, e)| {
            e.mounts
                .iter()
                .find(|m| m.mount_type.as_deref().is_some_and(|t| !t.is_empty()))
                .map(|m| format!("type on mount {} (at {at})", m.container_path))
        }),
        _ => None,
    }
}

fn required_by(parts: &Parts<'_>) -> (&'static str, Option<String>) {
    for v in KNOWN_VERSIONS.iter().rev() {
        if let Some(feature) = feature_needing(parts, v) {
            return (v, Some(feature));
        }
    }
    (BASE_VERSION, None)
}

/// The minimum version the spec's fields require and the feature that requires it (`None` for
/// the base version 0.3.0).
pub fn required(spec: &Spec) -> (&'static str, Option<String>) {
    required_by(&Parts::whole(spec))
}

/// The minimum `cdiVersion` the spec's fields require (`0.3.0` .. `1.1.0`), per version.go.
pub fn minimum_version(spec: &Spec) -> &'static str {
    required(spec).0
}

fn check_parts(declared_version: &str, parts: &Parts<'_>) -> Result<(), CdiError> {
    let Some(declared) = version_index(declared_version) else {
        return Err(CdiError::UnknownVersion {
            version: declared_version.to_string(),
            known: KNOWN_VERSIONS.join(", "),
        });
    };
    let (minimum, feature) = required_by(parts);
    let needed = version_index(minimum).unwrap_or(0);
    if declared < needed {
        return Err(CdiError::VersionTooLow {
            field: feature.unwrap_or_default(),
            declared: declared_version.to_string(),
            minimum: minimum.to_string(),
        });
    }
    Ok(())
}

/// Checks the declared `cdiVersion`: it must be a known version and at least what the fields
/// require. Errors: [`CdiError::UnknownVersion`]; [`CdiError::VersionTooLow`] naming the field
/// and the minimum version (case F06: `additionalGids` with 0.5.0 needs 0.7.0).
pub fn check_declared(spec: &Spec) -> Result<(), CdiError> {
    check_parts(&spec.cdi_version, &Parts::whole(spec))
}

/// [`check_declared`] for the spec-level part alone (kind, annotations, spec-level edits).
pub fn check_spec_level(spec: &Spec) -> Result<(), CdiError> {
    let parts = Parts {
        kind: &spec.kind,
        annotations: Some(&spec.annotations),
        edits: Some(&spec.container_edits),
        devices: Vec::new(),
    };
    check_parts(&spec.cdi_version, &parts)
}

/// [`check_declared`] for one device alone (`index` is its place in the spec's `devices`, for
/// the message): its name, annotations and edits against the declared `cdi_version`.
pub fn check_device(cdi_version: &str, index: usize, device: &Device) -> Result<(), CdiError> {
    let parts = Parts { kind: "", annotations: None, edits: None, devices: vec![(index, device)] };
    check_parts(cdi_version, &parts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cdi::spec::{DeviceNode, Mount};

    fn base() -> Spec {
        Spec {
            cdi_version: "0.3.0".into(),
            kind: "vendor.com/dev".into(),
            devices: vec![Device {
                name: "dev0".into(),
                container_edits: ContainerEdits {
                    device_nodes: vec![DeviceNode { path: "/dev/dev0".into(), ..Default::default() }],
                    ..Default::default()
                },
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn base_spec_needs_0_3_0() {
        assert_eq!(minimum_version(&base()), "0.3.0");
        check_declared(&base()).unwrap();
    }

    #[test]
    fn mount_type_needs_0_4_0() {
        let mut s = base();
        s.container_edits.mounts.push(Mount {
            host_path: "/a".into(),
            container_path: "/a".into(),
            mount_type: Some("bind".into()),
            options: vec![],
        });
        assert_eq!(minimum_version(&s), "0.4.0");
        let mut s2 = base();
        s2.container_edits.mounts.push(Mount {
            host_path: "/a".into(),
            container_path: "/a".into(),
            mount_type: None,
            options: vec!["bind".into()],
        });
        assert_eq!(minimum_version(&s2), "0.3.0");
    }

    #[test]
    fn host_path_and_digit_names_need_0_5_0() {
        let mut s = base();
        s.devices[0].container_edits.device_nodes[0].host_path = Some("/root/dev/dev0".into());
        assert_eq!(minimum_version(&s), "0.5.0");
        let mut s = base();
        s.devices[0].name = "0".into();
        assert_eq!(minimum_version(&s), "0.5.0");
        let err = check_declared(&s).unwrap_err().to_string();
        assert!(err.contains("a device name starting with a digit (\"0\")") && err.contains(">= 0.5.0"), "{err}");
    }

    #[test]
    fn annotations_and_class_dots_need_0_6_0() {
        let mut s = base();
        s.annotations.insert("a".into(), "b".into());
        assert_eq!(minimum_version(&s), "0.6.0");
        let mut s = base();
        s.devices[0].annotations.insert("a".into(), "b".into());
        assert_eq!(minimum_version(&s), "0.6.0");
        let mut s = base();
        s.kind = "vendor.com/dev.x".into();
        assert_eq!(minimum_version(&s), "0.6.0");
        // dots in the vendor part need nothing
        let mut s = base();
        s.kind = "a.b.vendor.com/dev".into();
        assert_eq!(minimum_version(&s), "0.3.0");
    }

    #[test]
    fn intel_rdt_and_additional_gids_need_0_7_0() {
        let mut s = base();
        s.devices[0].container_edits.intel_rdt = Some(serde_json::json!({"closID": "x"}));
        assert_eq!(minimum_version(&s), "0.7.0");
        let mut s = base();
        s.container_edits.additional_gids = vec![44];
        assert_eq!(minimum_version(&s), "0.7.0");
    }

    #[test]
    fn net_devices_and_rdt_schemata_need_1_1_0() {
        let mut s = base();
        s.container_edits.net_devices = vec![serde_json::json!({"hostInterfaceName": "eth1", "name": "eth1"})];
        assert_eq!(minimum_version(&s), "1.1.0");
        let mut s = base();
        s.container_edits.intel_rdt = Some(serde_json::json!({"enableMonitoring": true}));
        assert_eq!(minimum_version(&s), "1.1.0");
        let mut s = base();
        s.container_edits.intel_rdt = Some(serde_json::json!({"schemata": ["L3:0=f"]}));
        assert_eq!(minimum_version(&s), "1.1.0");
    }

    #[test]
    fn f06_additional_gids_with_0_5_0_is_rejected_naming_field_and_minimum() {
        let mut s = base();
        s.cdi_version = "0.5.0".into();
        s.devices[0].container_edits.additional_gids = vec![44];
        let err = check_declared(&s).unwrap_err().to_string();
        assert!(err.contains("uses additionalGids"), "{err}");
        assert!(err.contains("which needs cdiVersion >= 0.7.0"), "{err}");
        assert!(err.contains("declares cdiVersion 0.5.0"), "{err}");
        s.cdi_version = "0.7.0".into();
        check_declared(&s).unwrap();
    }

    #[test]
    fn unknown_versions_are_rejected() {
        for v in ["0.9.0", "2.0.0", "", "latest", "0.5"] {
            let mut s = base();
            s.cdi_version = v.into();
            let err = check_declared(&s).unwrap_err().to_string();
            assert!(err.contains(&format!("unknown cdiVersion {v:?}")), "{err}");
        }
        let mut s = base();
        s.cdi_version = "v0.6.0".into();
        check_declared(&s).unwrap();
    }
}
