//! config.json as actk-runtime edits it (actk_core::edits): any JSON document, the edits of a
//! two-GPU request. Checks: no panic; applying twice equals applying once; every top-level key
//! of the document survives in order.
#![no_main]

use actk_core::cdi::{CdiDeviceNode, CdiHook, CdiMount, ContainerEdits};
use actk_core::edits;
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fn gpu_edits() -> ContainerEdits {
    ContainerEdits {
        env: vec!["NVIDIA_VISIBLE_DEVICES=void".into()],
        device_nodes: ["/dev/nvidia0", "/dev/nvidiactl"]
            .iter()
            .enumerate()
            .map(|(i, p)| CdiDeviceNode {
                path: p.to_string(),
                major: Some(195),
                minor: Some(i as i64),
                ..Default::default()
            })
            .collect(),
        mounts: vec![CdiMount {
            host_path: "/usr/lib/x86_64-linux-gnu/libcuda.so.1".into(),
            container_path: "/usr/lib/x86_64-linux-gnu/libcuda.so.1".into(),
            mount_type: None,
            options: vec!["ro".into(), "nosuid".into()],
        }],
        hooks: vec![CdiHook {
            hook_name: "createContainer".into(),
            path: "/usr/bin/actk-hook".into(),
            ..Default::default()
        }],
        additional_gids: vec![44],
        ..Default::default()
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(doc) = serde_json::from_slice::<Value>(data) else { return };
    let e = gpu_edits();
    let mut once = doc.clone();
    if edits::apply(&mut once, &e).is_err() {
        return;
    }
    let mut twice = once.clone();
    edits::apply(&mut twice, &e).expect("edits that applied once apply again");
    assert_eq!(twice, once);
    let keys = |v: &Value| v.as_object().map(|m| m.keys().cloned().collect::<Vec<_>>()).unwrap_or_default();
    let (before, after) = (keys(&doc), keys(&once));
    assert!(before.iter().all(|k| after.contains(k)), "{before:?} -> {after:?}");
    let _ = edits::remove_legacy_nvidia_hook(&mut once);
});
