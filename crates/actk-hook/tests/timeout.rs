//! Issue 29, finding 3: a hook run without a `timeout` from its caller (Docker's `--gpus`
//! prestart hook) still ends. The hook is started with a stdin that never ends, so it waits for
//! the OCI state forever; it must give up after HOOK_TIMEOUT_S seconds with a message naming
//! the limit, and fail (exit status 1), so the runtime fails the start instead of hanging.

use std::io::Read;
use std::process::{Command, Stdio};

#[test]
fn a_hook_that_cannot_finish_gives_up_after_its_time_limit() {
    let limit = actk_core::cdi::generate::HOOK_TIMEOUT_S;
    let stages = [&["prestart"][..], &["update-ldcache", "--folder", "/usr/lib"][..]];
    // Both at once: each waits the whole limit.
    let children: Vec<_> = stages
        .iter()
        .map(|args| {
            let mut child = Command::new(env!("CARGO_BIN_EXE_actk-hook"))
                .args(*args)
                .env("ACTK_CONFIG", "/nonexistent/never-read.toml")
                .stdin(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            // Kept open: the hook never sees the end of its input.
            let stdin = child.stdin.take();
            (args, child, stdin)
        })
        .collect();
    for (args, mut child, _stdin) in children {
        let mut err = String::new();
        child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
        let st = child.wait().unwrap();
        assert_eq!(st.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(&format!("did not finish within {limit} s (the hook's time limit)")), "{args:?}: {err}");
    }
}
