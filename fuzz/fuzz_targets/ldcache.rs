//! The host's ld.so.cache (actk_core::ldcache), read during discovery. Checks: no panic; every
//! string of a parsed entry is NUL-terminated inside the file.
#![no_main]

use actk_core::ldcache;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(entries) = ldcache::parse(data) {
        assert!(entries.len() <= data.len() / 12, "{} entries from {} bytes", entries.len(), data.len());
        for e in entries.iter().take(4) {
            for s in [&e.key, &e.path] {
                let needle: Vec<u8> = s.bytes().chain([0]).collect();
                assert!(data.windows(needle.len()).any(|w| w == needle.as_slice()), "{s:?}");
            }
        }
    }
});
