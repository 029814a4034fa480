//! The low-level runtime's features document (`runc features`, OCI runtime-spec features.md),
//! read only when a container's edits need a field that old runtimes ignore (CDI `netDevices`,
//! `intelRdt.schemata`): runc 1.1 parses config.json into Go structs and drops what they lack.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Longest wait for `RUNTIME features` (it only prints a constant document).
const TIMEOUT: Duration = Duration::from_secs(5);

/// `RUNTIME features` parsed, or `None` when the runtime has no such command (crun 1.8, runc
/// before 1.1), fails, does not answer within [`TIMEOUT`], or prints something other than JSON.
/// Runs with an empty environment: it is a query, and the engine's environment is not its business.
pub fn of(runtime: &Path) -> Option<serde_json::Value> {
    let mut child = Command::new(runtime)
        .arg("features")
        .env_clear()
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    // Read while it runs, so that a long document cannot fill the pipe and stall it.
    let mut stdout = child.stdout.take()?;
    let reader = std::thread::spawn(move || {
        let mut out = Vec::new();
        let _ = (&mut stdout).take(1 << 20).read_to_end(&mut out);
        out
    });
    let start = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => break,
            Ok(Some(_)) | Err(_) => return None,
            Ok(None) if start.elapsed() > TIMEOUT => {
                let _ = child.kill();
                let _ = child.wait();
                tracing::warn!("{} features did not answer within {TIMEOUT:?}", runtime.display());
                return None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
    serde_json::from_slice(&reader.join().ok()?).ok()
}

/// Whether the host has the resctrl filesystem mounted (Intel RDT / AMD QoS): a `resctrl` line in
/// /proc/self/mountinfo, where runc looks for it.
pub fn has_resctrl() -> bool {
    std::fs::read_to_string("/proc/self/mountinfo").is_ok_and(|m| {
        m.lines().any(|l| l.split_once(" - ").is_some_and(|(_, r)| r.split_whitespace().next() == Some("resctrl")))
    })
}
