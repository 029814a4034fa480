//! The OCI state the runtime writes to a hook's stdin (runtime-spec "State"): `ociVersion`,
//! `id`, `status`, `pid`, `bundle`, `annotations`.

use anyhow::{Context, Result, bail};
use serde_json::Value;
use std::io::Read;
use std::path::PathBuf;

/// The fields of the state actk needs.
#[derive(Debug, Clone)]
pub struct State {
    /// Container id.
    pub id: String,
    /// The container's init pid on the host.
    pub pid: i32,
    /// Absolute path of the bundle.
    pub bundle: PathBuf,
}

/// Largest state accepted on stdin (a state is a few hundred bytes; annotations can add some).
const MAX_STATE: u64 = 1 << 20;

/// Reads and parses the state from stdin.
pub fn read_stdin() -> Result<State> {
    let mut buf = Vec::new();
    std::io::stdin().take(MAX_STATE).read_to_end(&mut buf).context("cannot read the OCI state from stdin")?;
    parse(&buf)
}

/// Parses a state document. Errors name the missing or bad field.
pub fn parse(buf: &[u8]) -> Result<State> {
    let v: Value =
        serde_json::from_slice(buf).context("the OCI state on stdin is not JSON (is this running as an OCI hook?)")?;
    let id = v.get("id").and_then(Value::as_str).unwrap_or_default().to_string();
    let pid = match v.get("pid").and_then(Value::as_i64) {
        Some(p) if p > 0 && p <= i32::MAX as i64 => p as i32,
        Some(p) => bail!(
            "the OCI state field \"pid\" is {p}; a running container's pid is needed (hook stage prestart, createRuntime or createContainer)"
        ),
        None => bail!("the OCI state on stdin has no \"pid\" (a hook stage before the container process exists?)"),
    };
    let bundle = match v.get("bundle").and_then(Value::as_str) {
        Some(b) if b.starts_with('/') => PathBuf::from(b),
        Some(b) => bail!("the OCI state field \"bundle\" is {b:?}; the runtime spec requires an absolute path"),
        None => bail!("the OCI state on stdin has no \"bundle\""),
    };
    Ok(State { id, pid, bundle })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docker_state_is_parsed() {
        let s = parse(br#"{"ociVersion":"1.0.2-dev","id":"abc","status":"creating","pid":4242,"bundle":"/run/containerd/io.containerd.runtime.v2.task/moby/abc"}"#).unwrap();
        assert_eq!((s.id.as_str(), s.pid), ("abc", 4242));
        assert_eq!(s.bundle, PathBuf::from("/run/containerd/io.containerd.runtime.v2.task/moby/abc"));
    }

    #[test]
    fn missing_pid_and_relative_bundle_are_named() {
        let e = parse(br#"{"id":"x","bundle":"/b"}"#).unwrap_err();
        assert!(e.to_string().contains("\"pid\""), "{e}");
        let e = parse(br#"{"id":"x","pid":1,"bundle":"b"}"#).unwrap_err();
        assert!(e.to_string().contains("absolute"), "{e}");
        let e = parse(b"not json").unwrap_err();
        assert!(e.to_string().contains("not JSON"), "{e}");
    }
}
