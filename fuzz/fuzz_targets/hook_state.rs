//! The OCI state actk-hook reads on stdin (crates/actk-hook/src/state.rs, compiled in here as is:
//! the hook is a binary crate). Checks: no panic; a parsed state has a positive pid and an
//! absolute bundle.
#![no_main]

#[allow(dead_code)]
#[path = "../../crates/actk-hook/src/state.rs"]
mod state;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = state::parse(data) {
        assert!(s.pid > 0 && s.bundle.is_absolute(), "{s:?}");
    }
});
