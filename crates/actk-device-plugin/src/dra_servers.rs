//! One kind, one server, per node: the profiles whose devices the DRA driver (actk.dev) serves
//! on this node, which the device plugin then leaves alone (every resource built from them:
//! `nvidia.com/gpu` and the MIG resources for `nvidia`, and so on).
//!
//! The DRA driver decides, from its Node's label `actk.dev/<profile>.server=dra|device-plugin`
//! and the chart's default, and writes the decision to the servers file (JSON
//! `{"node": "n1", "dra": ["nvidia"]}`, crates/actk-dra/src/servers.rs), in a host directory
//! this plugin's pod mounts read-only. The plugin reads it at every discovery; while there is
//! none (the driver has not written it yet, or is not deployed on the node), the chart's default
//! list applies (`--dra-default-profiles`). The plugin needs no API access for this.

use serde::Deserialize;
use std::collections::BTreeSet;
use std::path::PathBuf;

/// Where the plugin learns what the DRA driver serves on this node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DraServers {
    /// The servers file; `None`: only `default` counts.
    pub file: Option<PathBuf>,
    /// Profiles the DRA driver serves while there is no file.
    pub default: BTreeSet<String>,
}

#[derive(Deserialize)]
struct ServersFile {
    dra: BTreeSet<String>,
}

impl DraServers {
    /// Whether anything is left to the DRA driver at all (no file and no default: nothing).
    pub fn enabled(&self) -> bool {
        self.file.is_some() || !self.default.is_empty()
    }

    /// The profiles the DRA driver serves on this node now, and where that came from (for the
    /// log): the file's list, or the default when the file is not there. A file that cannot be
    /// parsed counts as not there, and says so.
    pub fn profiles(&self) -> (BTreeSet<String>, String) {
        let Some(f) = &self.file else { return (self.default.clone(), "the chart's default".into()) };
        match std::fs::read_to_string(f) {
            Ok(text) => match serde_json::from_str::<ServersFile>(&text) {
                Ok(s) => (s.dra, format!("the DRA driver's {}", f.display())),
                Err(e) => (self.default.clone(), format!("the chart's default ({} is not valid: {e})", f.display())),
            },
            Err(_) => (self.default.clone(), format!("the chart's default (no {} yet)", f.display())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_wins_over_the_default() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("servers.json");
        let s = DraServers { file: Some(f.clone()), default: ["nvidia".to_string()].into() };
        assert!(s.enabled());
        let (p, from) = s.profiles();
        assert_eq!(p, BTreeSet::from(["nvidia".to_string()]));
        assert!(from.contains("no ") && from.contains("default"), "{from}");
        std::fs::write(&f, r#"{"node":"n1","dra":["neuron"]}"#).unwrap();
        assert_eq!(s.profiles().0, BTreeSet::from(["neuron".to_string()]));
        std::fs::write(&f, r#"{"node":"n1","dra":[]}"#).unwrap();
        assert!(s.profiles().0.is_empty(), "the driver serves nothing here: the plugin serves all");
        std::fs::write(&f, "{").unwrap();
        let (p, from) = s.profiles();
        assert_eq!(p, BTreeSet::from(["nvidia".to_string()]));
        assert!(from.contains("is not valid"), "{from}");
        assert!(!DraServers::default().enabled());
    }
}
