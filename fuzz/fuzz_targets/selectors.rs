//! Selection variables and `cdi.k8s.io/` annotations (actk_core::request), as a container sets
//! them. Input: lines; `@KEY=VALUE` is an annotation, any other line an env entry
//! (`NVIDIA_VISIBLE_DEVICES=0,1`). Checks: no panic; an error names the variable and its value;
//! a resolution against a 12-device node is sorted, unique and inside the node.
#![no_main]

use actk_core::inventory::{Device, VendorInventory};
use actk_core::profile::{self, Profile};
use actk_core::request;
use libfuzzer_sys::fuzz_target;
use std::collections::BTreeMap;
use std::sync::OnceLock;

fn profiles() -> &'static [Profile] {
    static P: OnceLock<Vec<Profile>> = OnceLock::new();
    P.get_or_init(profile::builtin)
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let mut env = Vec::new();
    let mut ann = BTreeMap::new();
    for line in text.lines() {
        match line.strip_prefix('@').and_then(|l| l.split_once('=')) {
            Some((k, v)) => {
                ann.insert(k.to_string(), v.to_string());
            }
            None => env.push(line.to_string()),
        }
    }
    match request::collect(&env, &ann, profiles(), &BTreeMap::new()) {
        // Values over 256 bytes are shown shortened (request::shorten), still naming the variable.
        Err(e) => assert!(e.to_string().starts_with(&format!("{}={}: ", e.variable, request::shorten(&e.value)))),
        Ok(req) => {
            for v in &req.vendors {
                let p = profiles().iter().find(|p| p.name == v.profile).expect("known profile");
                let inv = VendorInventory {
                    profile: p.name.clone(),
                    kind: p.kind.clone(),
                    devices: (0..12)
                        .map(|i| Device {
                            index: i,
                            uuid: Some(format!("GPU-{i:02}ab-1111")),
                            cores: Some(2),
                            ..Default::default()
                        })
                        .collect(),
                    ..Default::default()
                };
                match v.resolve(Some(&inv)) {
                    Ok(idx) => assert!(idx.windows(2).all(|w| w[0] < w[1]) && idx.iter().all(|i| *i < 12), "{idx:?}"),
                    Err(e) => assert!(e.variable == v.variable && e.value == v.value, "{e}"),
                }
            }
        }
    }
});
