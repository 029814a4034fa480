//! The pure part of the NRI plugin: an NRI `Container` as the piece of an OCI runtime spec that
//! planning reads, and a plan's CDI container edits as NRI's `ContainerAdjustment`.
//!
//! Edits map onto NRI as containerd applies them (nri `pkg/runtime-tools/generate`): env entries
//! become `KeyValue`s (set, replacing the same name), device nodes `LinuxDevice`s (containerd adds
//! the node and a device cgroup allow rule for it), mounts `Mount`s, hooks go to their stage.
//! NRI 0.9 has no field for CDI's `additionalGids`, `intelRdt` or `netDevices`: edits that hold
//! them are refused with the field named (never silently dropped, field case F17), unless the
//! caller hands the CDI names to containerd instead ([`cdi_devices`]).

use crate::proto::nri;
use actk_core::cdi::spec::{ContainerEdits, Hook};
use serde_json::{Map, Value, json};

/// Annotation set on an adjusted container, as actk-runtime sets it on a spec it edited, so that
/// actk-runtime or actk-hook, if also in the path, do nothing more.
pub use actk_core::edits::APPLIED_ANNOTATION;

/// What planning reads from a container, shaped as in config.json (OCI runtime spec
/// config.md): `process.env`, `annotations` and `mounts` (the kubelet's device list arrives as
/// mounts). NRI 0.9 does not carry the container's capabilities, so the container is never
/// taken for privileged here: a policy that trusts an input only for privileged containers
/// refuses it on this path (it never widens what a container gets).
pub fn container_spec(c: &nri::Container) -> Value {
    let annotations: Map<String, Value> =
        c.annotations.iter().map(|(k, v)| (k.clone(), Value::String(v.clone()))).collect();
    let mounts: Vec<Value> = c
        .mounts
        .iter()
        .map(|m| json!({"destination": m.destination, "type": m.r#type, "source": m.source, "options": m.options}))
        .collect();
    json!({"process": {"env": c.env}, "annotations": annotations, "mounts": mounts})
}

/// Edits NRI cannot carry.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "the CDI edits for this container use {field}, which NRI cannot carry; use RuntimeClass actk (actk-runtime) or a CDI device name for it"
)]
pub struct Unsupported {
    /// `additionalGids`, `intelRdt` or `netDevices`.
    pub field: &'static str,
}

/// The adjustment that applies `edits`, plus the [`APPLIED_ANNOTATION`] `summary`.
pub fn adjustment(edits: &ContainerEdits, summary: &str) -> Result<nri::ContainerAdjustment, Unsupported> {
    if !edits.additional_gids.is_empty() {
        return Err(Unsupported { field: "additionalGids" });
    }
    if edits.intel_rdt.is_some() {
        return Err(Unsupported { field: "intelRdt" });
    }
    if !edits.net_devices.is_empty() {
        return Err(Unsupported { field: "netDevices" });
    }
    let env = edits
        .env
        .iter()
        .map(|e| {
            let (k, v) = e.split_once('=').unwrap_or((e.as_str(), ""));
            nri::KeyValue { key: k.into(), value: v.into() }
        })
        .collect();
    let devices = edits
        .device_nodes
        .iter()
        .map(|n| nri::LinuxDevice {
            path: n.path.clone(),
            r#type: n.node_type.clone().unwrap_or_else(|| "c".into()),
            major: n.major.unwrap_or(0),
            minor: n.minor.unwrap_or(0),
            file_mode: n.file_mode.map(|value| nri::OptionalFileMode { value }),
            uid: n.uid.map(|value| nri::OptionalUInt32 { value }),
            gid: n.gid.map(|value| nri::OptionalUInt32 { value }),
        })
        .collect();
    let mounts = edits
        .mounts
        .iter()
        .map(|m| nri::Mount {
            destination: m.container_path.clone(),
            r#type: m.mount_type.clone().unwrap_or_else(|| "bind".into()),
            source: m.host_path.clone(),
            options: m.options.clone(),
        })
        .collect();
    let mut hooks = nri::Hooks::default();
    for h in &edits.hooks {
        let stage = match h.hook_name.as_str() {
            "prestart" => &mut hooks.prestart,
            "createRuntime" => &mut hooks.create_runtime,
            "createContainer" => &mut hooks.create_container,
            "startContainer" => &mut hooks.start_container,
            "poststart" => &mut hooks.poststart,
            "poststop" => &mut hooks.poststop,
            // Planning validated the stage (edits::HOOK_STAGES); nothing else gets here.
            _ => continue,
        };
        stage.push(hook(h));
    }
    let has_hooks = !edits.hooks.is_empty();
    Ok(nri::ContainerAdjustment {
        annotations: [(APPLIED_ANNOTATION.to_string(), summary.to_string())].into(),
        mounts,
        env,
        hooks: has_hooks.then_some(hooks),
        linux: Some(nri::LinuxContainerAdjustment { devices }),
        cdi_devices: Vec::new(),
    })
}

/// An adjustment that names CDI devices for containerd (2.1+) to resolve from its own CDI spec
/// directories, for edits [`adjustment`] cannot carry.
pub fn cdi_devices(names: &[String], summary: &str) -> nri::ContainerAdjustment {
    nri::ContainerAdjustment {
        annotations: [(APPLIED_ANNOTATION.to_string(), summary.to_string())].into(),
        cdi_devices: names.iter().map(|n| nri::CdiDevice { name: n.clone() }).collect(),
        ..Default::default()
    }
}

fn hook(h: &Hook) -> nri::Hook {
    // A hook must never inherit the runtime's environment (edits::apply does the same).
    let env = if h.env.is_empty() { vec![actk_core::edits::HOOK_DEFAULT_PATH.to_string()] } else { h.env.clone() };
    nri::Hook {
        path: h.path.clone(),
        args: h.args.clone(),
        env,
        timeout: h.timeout.map(|value| nri::OptionalInt { value }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use actk_core::cdi::spec::{DeviceNode, Mount};

    #[test]
    fn container_env_and_annotations_become_the_spec_planning_reads() {
        let c = nri::Container {
            env: vec!["PATH=/bin".into(), "NVIDIA_VISIBLE_DEVICES=1".into()],
            annotations: [("cdi.k8s.io/x".to_string(), "nvidia.com/gpu=0".to_string())].into(),
            ..Default::default()
        };
        let c = nri::Container {
            mounts: vec![nri::Mount {
                destination: "/var/run/actk/devices/nvidia.com/gpu/0".into(),
                source: "/dev/null".into(),
                r#type: "bind".into(),
                options: vec!["ro".into()],
            }],
            ..c
        };
        let v = container_spec(&c);
        assert_eq!(v["process"]["env"][1], "NVIDIA_VISIBLE_DEVICES=1");
        assert_eq!(v["mounts"][0]["destination"], "/var/run/actk/devices/nvidia.com/gpu/0");
        assert!(v["process"].get("capabilities").is_none(), "never privileged on this path");
        assert_eq!(v["annotations"]["cdi.k8s.io/x"], "nvidia.com/gpu=0");
    }

    #[test]
    fn every_edit_lands_in_its_nri_field() {
        let e = ContainerEdits {
            env: vec!["NVIDIA_VISIBLE_DEVICES=void".into(), "EMPTY=".into()],
            device_nodes: vec![DeviceNode {
                path: "/dev/nvidia0".into(),
                node_type: Some("c".into()),
                major: Some(195),
                minor: Some(0),
                file_mode: Some(0o666),
                ..Default::default()
            }],
            mounts: vec![Mount {
                host_path: "/usr/lib/libcuda.so.1".into(),
                container_path: "/usr/lib/libcuda.so.1".into(),
                options: vec!["ro".into(), "bind".into()],
                ..Default::default()
            }],
            hooks: vec![Hook {
                hook_name: "createContainer".into(),
                path: "/usr/bin/actk-hook".into(),
                args: vec!["actk-hook".into(), "update-ldcache".into()],
                ..Default::default()
            }],
            ..Default::default()
        };
        let a = adjustment(&e, "nvidia.com/gpu=0 (NVIDIA_VISIBLE_DEVICES, spec)").unwrap();
        assert_eq!(a.env[0], nri::KeyValue { key: "NVIDIA_VISIBLE_DEVICES".into(), value: "void".into() });
        assert_eq!(a.env[1].value, "");
        let d = &a.linux.as_ref().unwrap().devices[0];
        assert_eq!((d.path.as_str(), d.r#type.as_str(), d.major, d.minor), ("/dev/nvidia0", "c", 195, 0));
        assert_eq!(d.file_mode.as_ref().map(|m| m.value), Some(0o666));
        assert_eq!(a.mounts[0].r#type, "bind");
        let h = &a.hooks.as_ref().unwrap().create_container[0];
        assert_eq!(h.env, [actk_core::edits::HOOK_DEFAULT_PATH], "a hook gets an explicit minimal env");
        assert!(a.annotations[APPLIED_ANNOTATION].starts_with("nvidia.com/gpu=0"));
    }

    #[test]
    fn f17_edits_nri_cannot_carry_are_refused_by_name() {
        let e = ContainerEdits { additional_gids: vec![44], ..Default::default() };
        assert_eq!(adjustment(&e, "").unwrap_err().field, "additionalGids");
        let e = ContainerEdits {
            net_devices: vec![json!({"hostInterfaceName": "eth1", "name": "e"})],
            ..Default::default()
        };
        assert!(adjustment(&e, "").unwrap_err().to_string().contains("netDevices"));
        let a = cdi_devices(&["example.com/net=0".into()], "s");
        assert_eq!(a.cdi_devices[0].name, "example.com/net=0");
    }
}
