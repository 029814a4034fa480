//! The text files actk reads at each container start: config.toml (actk_core::config), hooks.d
//! JSON (actk_core::hooksd) and profiles (actk_core::profile). The first byte picks the parser.
//! Checks: no panic; errors name the file.
#![no_main]

use actk_core::config::Config;
use actk_core::{hooksd, profile};
use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else { return };
    let Ok(text) = std::str::from_utf8(rest) else { return };
    match which % 3 {
        0 => {
            if let Err(e) = Config::parse(text, Path::new("/etc/actk/config.toml")) {
                assert!(e.to_string().contains("/etc/actk/config.toml"), "{e}");
            }
        }
        1 => match hooksd::parse(text, Path::new("/etc/actk/hooks.d/f.json")) {
            Err(e) => assert!(e.to_string().contains("/etc/actk/hooks.d/f.json"), "{e}"),
            Ok(h) => {
                let _ = h.matches(&serde_json::json!({"annotations": {"a": "b"}, "process": {"args": ["sh"]}}));
            }
        },
        _ => {
            if let Err(e) = profile::parse(Path::new("/etc/actk/profiles.d/f.toml"), text) {
                assert!(e.to_string().contains("/etc/actk/profiles.d/f.toml"), "{e}");
            }
        }
    }
});
