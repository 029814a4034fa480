//! The NRI gate: a container that needs this plugin fails, naming the plugin, when the plugin
//! did not serve it, instead of starting without its devices.
//!
//! NRI creates a container without asking a plugin that is not connected (a rollout, a crash,
//! a plugin containerd dropped), and containerd goes on without a plugin that timed out. So the
//! container carries its own proof: the CDI device [`CDI_NAME`] (`actk.dev/nri-plugin=required`),
//! which the device plugin adds to every allocation when the node serves devices through this
//! plugin, is one bind mount at [`CONTAINER_PATH`] from a source that cannot exist
//! (`/proc/actk-nri-plugin-<IDX-NAME>-did-not-serve-this-container`: nothing can be created in
//! procfs's root). containerd applies CDI devices while it builds the spec, before NRI is asked;
//! this plugin's adjustment removes the mount ([`remove`]), so a served container never sees it.
//! Unserved, runc fails the create on the missing source and the pod's event names the path,
//! hence the plugin. On a node where the plugin never ran the spec does not exist and the create
//! fails with `unresolvable CDI devices actk.dev/nri-plugin=required`.
//!
//! The plugin writes the spec ([`write`]) when it starts and leaves it in place: it holds no
//! device, and removing it on exit would turn the plugin's absence into a missing-spec error
//! with a vaguer message.

use crate::proto::nri;
use actk_core::cdi::spec::{ContainerEdits, Device, Mount, Spec};
use std::path::{Path, PathBuf};

/// CDI kind of the gate spec.
pub const CDI_KIND: &str = "actk.dev/nri-plugin";
/// The gate device's qualified CDI name, as the device plugin names it.
pub const CDI_NAME: &str = actk_core::policy::NRI_GATE_CDI_NAME;
/// Where the gate mount lands in the container (removed by the plugin).
pub const CONTAINER_PATH: &str = "/run/actk-nri-gate";
/// File name of the gate spec in the CDI directory.
pub const SPEC_FILE: &str = "actk.dev-nri-plugin.json";

/// The mount source that cannot exist, naming the plugin as NRI knows it (`10-actk`).
pub fn source(plugin: &str) -> String {
    format!("/proc/actk-nri-plugin-{plugin}-did-not-serve-this-container")
}

/// The gate spec for plugin `plugin` (`IDX-NAME`).
pub fn spec(plugin: &str) -> Spec {
    let mut spec = Spec {
        kind: CDI_KIND.into(),
        devices: vec![Device {
            name: "required".into(),
            container_edits: ContainerEdits {
                mounts: vec![Mount {
                    host_path: source(plugin),
                    container_path: CONTAINER_PATH.into(),
                    mount_type: Some("bind".into()),
                    options: vec!["bind".into(), "ro".into()],
                }],
                ..Default::default()
            },
            ..Default::default()
        }],
        ..Default::default()
    };
    spec.cdi_version = actk_core::cdi::version::minimum_version(&spec).to_string();
    spec
}

/// Writes the gate spec of `plugin` into `dir` (atomically) and returns its path.
///
/// Errors: the directory is not writable (the message names the file).
pub fn write(dir: &Path, plugin: &str) -> Result<PathBuf, actk_core::cdi::CdiError> {
    let path = dir.join(SPEC_FILE);
    actk_core::cdi::write::write_spec(&spec(plugin), &path, actk_core::cdi::validate::Format::Json)?;
    Ok(path)
}

/// Whether container `c` carries the gate mount.
pub fn present(c: &nri::Container) -> bool {
    c.mounts.iter().any(|m| m.destination == CONTAINER_PATH)
}

/// Adds the gate mount's removal to `adjust` (NRI marks a removed mount's destination with a
/// leading `-`, nri `pkg/api` `MarkForRemoval`).
pub fn remove(adjust: &mut nri::ContainerAdjustment) {
    adjust.mounts.push(nri::Mount { destination: format!("-{CONTAINER_PATH}"), ..Default::default() });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gate_spec_is_valid_cdi_and_names_the_plugin() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), "10-actk").unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let spec: Spec = serde_json::from_str(&text).unwrap();
        assert_eq!(format!("{}={}", spec.kind, spec.devices[0].name), CDI_NAME);
        let m = &spec.devices[0].container_edits.mounts[0];
        assert_eq!(m.host_path, "/proc/actk-nri-plugin-10-actk-did-not-serve-this-container");
        assert!(!Path::new(&m.host_path).exists());
        let reg = actk_core::cdi::Registry::load(&[dir.path().to_path_buf()]);
        assert!(reg.errors().is_empty(), "{:?}", reg.errors());
    }
}
