//! Which of the two front ends serves a kind on this node: the DRA driver or the device plugin,
//! never both (one kind, one server). The chart's `dra.profiles` are the profiles the DRA
//! driver may serve (a DeviceClass exists for each); with the per-node choice on
//! (`dra.perNodeServer.enabled`), a node label [`label`] `actk.dev/<profile>.server` set to
//! `dra` or `device-plugin` decides it for that node, and nodes without the label get the
//! chart's default (`dra.perNodeServer.default`).
//!
//! The driver decides ([`choose`]) and writes what it takes to the servers file
//! ([`ServersFile`], a small JSON file in a host directory that the device plugin's pod mounts
//! read-only): the device plugin leaves those profiles' resources alone on this node (its
//! `--dra-servers-file`). So the device plugin needs no API access, and the decision is made in
//! one place. The driver publishes a profile only once the device plugin no longer advertises
//! it (the allocatable check of [`crate::publish`]), so a node that changes hands never has
//! both serve one kind.
//!
//! A pod asking for `resources.limits: {nvidia.com/gpu: 2}` then gets its GPUs from whichever
//! serves the kind on the node the scheduler picks: the device plugin where the Node advertises
//! `nvidia.com/gpu`, the DRA driver (through the DeviceClass's `extendedResourceName`,
//! KEP-5004, Kubernetes 1.36+) where it does not.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Value of [`label`] that gives a profile to the DRA driver.
pub const DRA: &str = "dra";
/// Value of [`label`] that gives a profile to the device plugin.
pub const DEVICE_PLUGIN: &str = "device-plugin";

/// The node label that chooses what serves `profile` on a node: `actk.dev/<profile>.server`.
pub fn label(profile: &str) -> String {
    format!("{}/{profile}.server", crate::slice::DRIVER)
}

/// What serves a profile on a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Server {
    /// The DRA driver (`dra`).
    Dra,
    /// The device plugin (`device-plugin`).
    DevicePlugin,
}

impl std::str::FromStr for Server {
    type Err = String;
    fn from_str(s: &str) -> Result<Server, String> {
        match s {
            DRA => Ok(Server::Dra),
            DEVICE_PLUGIN => Ok(Server::DevicePlugin),
            other => Err(format!("{other:?} is neither {DRA} nor {DEVICE_PLUGIN}")),
        }
    }
}

/// The choice on one node ([`choose`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Choice {
    /// Profiles the DRA driver serves here.
    pub dra: BTreeSet<String>,
    /// Profiles of `may_serve` that the node's label gives to the device plugin: profile -> the
    /// label as `key=value`, for the events and the log.
    pub by_label: BTreeMap<String, String>,
    /// Labels that name a profile the driver cannot serve, or have a value it does not know:
    /// `key=value` -> why; logged, otherwise ignored.
    pub ignored: BTreeMap<String, String>,
}

/// Decides which of `may_serve` (the chart's `dra.profiles`) the DRA driver serves on a node
/// with `labels`: a profile whose [`label`] says `dra` or `device-plugin` goes there, others go
/// to `default`. A label naming a profile outside `may_serve` with `dra` is ignored (no
/// DeviceClass selects it), as is one with another value.
pub fn choose(may_serve: &BTreeSet<String>, labels: &BTreeMap<String, String>, default: Server) -> Choice {
    let mut out = Choice::default();
    let prefix = format!("{}/", crate::slice::DRIVER);
    for (k, v) in labels {
        let Some(profile) = k.strip_prefix(&prefix).and_then(|r| r.strip_suffix(".server")) else { continue };
        match v.parse::<Server>() {
            Err(e) => {
                out.ignored.insert(format!("{k}={v}"), e);
            }
            Ok(Server::Dra) if !may_serve.contains(profile) => {
                out.ignored.insert(
                    format!("{k}={v}"),
                    format!("profile {profile} is not one the DRA driver serves (chart: dra.profiles), so no DeviceClass selects it"),
                );
            }
            Ok(_) => {}
        }
    }
    for p in may_serve {
        let key = label(p);
        let server = labels.get(&key).and_then(|v| v.parse::<Server>().ok()).unwrap_or(default);
        match server {
            Server::Dra => {
                out.dra.insert(p.clone());
            }
            Server::DevicePlugin => {
                let why = labels.get(&key).map_or_else(
                    || format!("dra.perNodeServer.default={DEVICE_PLUGIN} and no {key} label"),
                    |v| format!("{key}={v}"),
                );
                out.by_label.insert(p.clone(), why);
            }
        }
    }
    out
}

/// The servers file: the profiles the DRA driver serves on this node, which the device plugin
/// leaves alone. JSON: `{"node": "n1", "dra": ["nvidia"]}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServersFile {
    /// The node it was written for.
    pub node: String,
    /// Profiles the DRA driver serves there.
    pub dra: BTreeSet<String>,
}

impl ServersFile {
    /// Writes the file at `path` atomically (a temporary file in its directory renamed over it),
    /// creating the directory.
    ///
    /// Errors: the I/O error, naming the path.
    pub fn write(&self, path: &Path) -> Result<(), String> {
        let dir = path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let tmp = dir.join(format!(".{}.tmp", path.file_name().and_then(|n| n.to_str()).unwrap_or("servers")));
        let text = serde_json::to_string(self).map_err(|e| e.to_string())?;
        std::fs::write(&tmp, text).map_err(|e| format!("writing {}: {e}", tmp.display()))?;
        std::fs::rename(&tmp, path).map_err(|e| format!("renaming {} to {}: {e}", tmp.display(), path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(v: &[&str]) -> BTreeSet<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    fn labels(v: &[(&str, &str)]) -> BTreeMap<String, String> {
        v.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn labels_override_the_default_per_profile() {
        let may = set(&["nvidia", "neuron"]);
        let c = choose(&may, &labels(&[]), Server::Dra);
        assert_eq!(c.dra, may);
        assert!(c.by_label.is_empty());
        let c = choose(&may, &labels(&[("actk.dev/nvidia.server", "device-plugin")]), Server::Dra);
        assert_eq!(c.dra, set(&["neuron"]));
        assert_eq!(c.by_label["nvidia"], "actk.dev/nvidia.server=device-plugin");
        let c = choose(&may, &labels(&[("actk.dev/neuron.server", "dra")]), Server::DevicePlugin);
        assert_eq!(c.dra, set(&["neuron"]));
        assert!(c.by_label["nvidia"].contains("dra.perNodeServer.default=device-plugin"), "{:?}", c.by_label);
    }

    #[test]
    fn unknown_values_and_profiles_are_ignored_and_said() {
        let may = set(&["nvidia"]);
        let c = choose(
            &may,
            &labels(&[("actk.dev/nvidia.server", "both"), ("actk.dev/gaudi.server", "dra"), ("other/x.server", "dra")]),
            Server::Dra,
        );
        assert_eq!(c.dra, may, "an unknown value leaves the default");
        assert_eq!(c.ignored.len(), 2, "{:?}", c.ignored);
        assert!(c.ignored["actk.dev/gaudi.server=dra"].contains("dra.profiles"));
        assert!(c.ignored["actk.dev/nvidia.server=both"].contains("neither dra nor device-plugin"));
    }

    #[test]
    fn the_file_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("sub/servers.json");
        let f = ServersFile { node: "n1".into(), dra: set(&["nvidia"]) };
        f.write(&p).unwrap();
        let back: ServersFile = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        assert_eq!(back, f);
        assert_eq!(std::fs::read_to_string(&p).unwrap(), r#"{"node":"n1","dra":["nvidia"]}"#);
    }
}
