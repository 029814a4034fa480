//! ld.so.cache (actk_core::ldcache): the host's, read during discovery, and a container image's,
//! read by actk-inject. Checks: no panic; every string of a parsed entry is NUL-terminated inside
//! the file; the bounded reader (issue 29, finding 2) stays within its limits, hands out slices
//! of the input, and agrees with the copying reader.
#![no_main]

use actk_core::ldcache::{self, Limits};
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
    // Small limits, taken from the input's length, so that fuzzed inputs reach each of them.
    let limits = Limits { max_entries: 1 + data.len() % 64, max_string: 1 + data.len() % 61, max_output: data.len() * 2 };
    if let Ok(entries) = ldcache::parse_borrowed(data, &limits) {
        assert!(entries.len() <= limits.max_entries);
        let range = data.as_ptr_range();
        let mut total = 0;
        for e in &entries {
            for s in [e.key, e.path].into_iter().chain(e.hwcaps) {
                assert!(s.len() <= limits.max_string && (s.is_empty() || range.contains(&s.as_ptr())), "{s:?}");
                total += s.len();
            }
        }
        assert!(total <= limits.max_output, "{total}");
        let owned = ldcache::parse_entries(data).expect("within smaller limits, so within the defaults");
        assert_eq!(entries.iter().map(|e| e.owned()).collect::<Vec<_>>(), owned);
    }
});
