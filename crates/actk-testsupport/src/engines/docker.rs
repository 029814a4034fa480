//! dockerd: the `docker` CLI, /etc/docker/daemon.json and actk-runtime registered as a Docker runtime
//! for one test ([`DockerRuntime`]).

use super::*;
use anyhow::{Context, Result, bail};
use serde_json::Value;
use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// `docker ARGS` (the docker CLI against the running dockerd).
pub fn docker<S: AsRef<OsStr>>(args: &[S]) -> Output {
    command_output("docker", args, &[])
}

/// Where dockerd reads its configuration.
pub const DAEMON_JSON: &str = "/etc/docker/daemon.json";

/// Lock that serialises every change of /etc/docker/daemon.json made by tests.
pub fn daemon_json_lock() -> PathBuf {
    // Not under target/: two checkouts on one machine share the one daemon.json.
    PathBuf::from("/run/lock/actk-e2e-daemon-json.lock")
}

/// actk-runtime registered with dockerd for one test: `actk runtime configure --runtime docker
/// --name NAME --path WRAPPER` (WRAPPER = [`ActkConfig::write_wrapper`]), dockerd reloaded with
/// SIGHUP, and on drop `--remove` plus SIGHUP again. Names are unique per test, so tests run in
/// parallel; daemon.json edits are serialised by [`daemon_json_lock`].
pub struct DockerRuntime {
    /// The runtime name for `docker run --runtime NAME`.
    pub name: String,
}

impl DockerRuntime {
    /// Register `path` (an OCI runtime executable) as a unique runtime name.
    pub fn register(path: &Path) -> Result<DockerRuntime> {
        let name = unique_name("actk-e2e");
        with_lock_at(&daemon_json_lock(), || {
            let o = actk(
                None,
                &[
                    OsStr::new("runtime"),
                    OsStr::new("configure"),
                    OsStr::new("--runtime"),
                    OsStr::new("docker"),
                    OsStr::new("--name"),
                    OsStr::new(&name),
                    OsStr::new("--path"),
                    path.as_os_str(),
                ],
            );
            let (out, err) = text(&o);
            if !o.status.success() {
                bail!("actk runtime configure --runtime docker --name {name} failed:\n{out}\n{err}");
            }
            reload_dockerd()?;
            wait_for_docker_runtime(&name, true)
        })?;
        Ok(DockerRuntime { name })
    }
}

impl Drop for DockerRuntime {
    fn drop(&mut self) {
        let name = self.name.clone();
        let r = with_lock_at(&daemon_json_lock(), || {
            let o = actk(None, &["runtime", "configure", "--runtime", "docker", "--name", &name, "--remove"]);
            if !o.status.success() {
                bail!("actk runtime configure --remove --name {name} failed: {}", text(&o).1);
            }
            reload_dockerd()
        });
        if let Err(e) = r {
            eprintln!("warning: could not unregister docker runtime {}: {e:#}", self.name);
        }
    }
}

/// Send SIGHUP to dockerd so it re-reads the `runtimes` of daemon.json.
pub fn reload_dockerd() -> Result<()> {
    let pid = fs::read_to_string("/var/run/docker.pid").context("reading /var/run/docker.pid (is dockerd running?)")?;
    let o = Command::new("kill").args(["-HUP", pid.trim()]).output()?;
    if !o.status.success() {
        bail!("kill -HUP {} failed: {}", pid.trim(), text(&o).1);
    }
    Ok(())
}

/// Wait (up to 20 s) until `docker info` lists (or, with `present = false`, no longer lists)
/// the runtime `name`.
pub fn wait_for_docker_runtime(name: &str, present: bool) -> Result<()> {
    let mut last = String::new();
    for _ in 0..100 {
        let o = Command::new("docker").args(["info", "--format", "{{json .Runtimes}}"]).output()?;
        last = String::from_utf8_lossy(&o.stdout).into_owned();
        let listed = serde_json::from_str::<Value>(&last)
            .ok()
            .and_then(|v| v.as_object().map(|m| m.contains_key(name)))
            .unwrap_or(false);
        if listed == present {
            return Ok(());
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    bail!(
        "dockerd did not {} runtime {name} after SIGHUP within 20 s; runtimes now: {last}; daemon.json: {}",
        if present { "register" } else { "drop" },
        fs::read_to_string(DAEMON_JSON).unwrap_or_default()
    )
}
