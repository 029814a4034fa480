//! Running containers from the OCI runtimes' state directories, and what each was given.
//!
//! Why the runtimes' state and not each engine's API: every engine on a node ends in runc (or
//! crun), which keeps one directory per container under its `--root`; reading those covers
//! docker, podman, containerd (Kubernetes included), CRI-O and bundles run by hand, with no
//! engine's socket, client library or database (podman's is BoltDB or SQLite). The state roots
//! ([`default_roots`]):
//! - `/run/runc` (runc's default: podman, CRI-O, `runc run`), `/run/crun` (crun's);
//! - `/run/docker/runtime-*/moby` (dockerd's runtimes, `runc` and any registered one such as
//!   `actk`);
//! - `/run/containerd/runc/*` (containerd's runc shim, one directory per namespace: `k8s.io`
//!   for Kubernetes, `moby` for Docker 23+).
//!
//! runc's `<root>/<id>/state.json` gives the init process (pid and start time, so a pid reused
//! after the container died is not taken for it) and the bundle (its config's labels carry
//! `bundle=<dir>` and each annotation as `key=value`); crun's `<root>/<id>/status` gives pid and
//! bundle. What the container was given is read from the bundle's config.json, written by the
//! engine and edited by actk-runtime before runc created the container: the `io.actk.applied`
//! annotation, `linux.devices`, the CRI annotations naming pod and container, and Docker's
//! `--gpus` hook. When config.json is gone, runc's own copy (labels, devices) stands in.
//! Everything read is root-owned state of the host, never a file of a container's image.

use crate::{RunningContainer, Served, parse_applied};
use actk_core::edits::{APPLIED_ANNOTATION, LEGACY_NVIDIA_HOOK};
use actk_core::plan::PlanContext;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The state roots looked at by default, with globs expanded (those that exist).
pub fn default_roots() -> Vec<PathBuf> {
    let mut roots = vec![PathBuf::from("/run/runc"), PathBuf::from("/run/crun")];
    for (parent, leaf) in [("/run/docker", Some("moby")), ("/run/containerd/runc", None)] {
        let Ok(rd) = std::fs::read_dir(parent) else { continue };
        let mut found: Vec<PathBuf> = rd
            .flatten()
            .map(|e| e.path())
            .filter(|p| match leaf {
                // Only dockerd's runtime roots, not its other state (containerd/, netns, ...).
                Some(l) => {
                    p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("runtime-")) && p.join(l).is_dir()
                }
                None => p.is_dir(),
            })
            .map(|p| match leaf {
                Some(l) => p.join(l),
                None => p,
            })
            .collect();
        found.sort();
        roots.extend(found);
    }
    roots.retain(|r| r.is_dir());
    roots
}

/// Options of [`scan`].
#[derive(Default)]
pub struct ScanOptions<'a> {
    /// Docker's data root, for container names (`<root>/containers/<id>/config.v2.json`);
    /// default `/var/lib/docker`.
    pub docker_root: Option<PathBuf>,
    /// The planning context of the node (its config): with it, a container whose devices the
    /// OCI hook injected (`docker run --gpus`, which leaves no annotation, since runc had read
    /// config.json before the hook ran) gets the hook's request planned again from the
    /// config.json the hook read, with the same code (`actk_core::plan`). Without it such
    /// containers show only what `linux.devices` names.
    pub plan: Option<&'a PlanContext>,
}

/// Every running container under `roots`, and notes on what could not be read (one line each,
/// naming the file). A directory that is not a container's, a stopped container (its init
/// process gone, or its pid now another process) and a pod sandbox are skipped silently.
pub fn scan(roots: &[PathBuf], opts: &ScanOptions<'_>) -> (Vec<RunningContainer>, Vec<String>) {
    let mut out = Vec::new();
    let mut notes = Vec::new();
    for root in roots {
        let Ok(rd) = std::fs::read_dir(root) else { continue };
        let mut dirs: Vec<PathBuf> = rd.flatten().map(|e| e.path()).filter(|p| p.is_dir()).collect();
        dirs.sort();
        for dir in dirs {
            match read_container(root, &dir, opts) {
                Ok(Some(c)) => out.push(c),
                Ok(None) => {}
                Err(e) => notes.push(e),
            }
        }
    }
    (out, notes)
}

/// What runc (or crun) records of one container: id, init pid, bundle, and its own copy of the
/// config's labels and devices.
struct Recorded {
    id: String,
    pid: i32,
    start: Option<u64>,
    bundle: Option<PathBuf>,
    labels: BTreeMap<String, String>,
    devices: Vec<(char, u32, u32, String)>,
}

fn read_recorded(dir: &Path) -> Result<Option<Recorded>, String> {
    let runc = dir.join("state.json");
    let crun = dir.join("status");
    let (path, crun_format) = if runc.is_file() {
        (runc, false)
    } else if crun.is_file() {
        (crun, true)
    } else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let v: Value = serde_json::from_str(&text).map_err(|e| format!("{}: not JSON: {e}", path.display()))?;
    let id = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    if crun_format {
        let pid = v.get("pid").and_then(Value::as_i64).unwrap_or(0) as i32;
        let bundle = v.get("bundle").and_then(Value::as_str).map(PathBuf::from);
        return Ok(Some(Recorded { id, pid, start: None, bundle, labels: BTreeMap::new(), devices: Vec::new() }));
    }
    let pid = v.get("init_process_pid").and_then(Value::as_i64).unwrap_or(0) as i32;
    let start = v.get("init_process_start").and_then(|s| s.as_u64().or_else(|| s.as_str()?.parse().ok()));
    let mut labels = BTreeMap::new();
    for l in v.pointer("/config/labels").and_then(Value::as_array).into_iter().flatten() {
        if let Some((k, val)) = l.as_str().and_then(|l| l.split_once('=')) {
            labels.insert(k.to_string(), val.to_string());
        }
    }
    let bundle = labels.remove("bundle").map(PathBuf::from);
    let devices = v
        .pointer("/config/devices")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|d| {
                    // runc records the type as a rune: 99 'c', 98 'b'.
                    let ty = char::from_u32(d.get("type")?.as_u64()? as u32)?;
                    Some((
                        ty,
                        d.get("major")?.as_u64()? as u32,
                        d.get("minor")?.as_u64()? as u32,
                        d.get("path")?.as_str()?.to_string(),
                    ))
                })
                .collect()
        })
        .unwrap_or_default();
    let id = v.get("id").and_then(Value::as_str).map(str::to_string).unwrap_or(id);
    Ok(Some(Recorded { id, pid, start, bundle, labels, devices }))
}

/// Whether `pid` is running (not a zombie) and (when runc recorded it) started at `start` clock ticks after
/// boot (field 22 of /proc/PID/stat), so a reused pid is not taken for the container.
fn alive(pid: i32, start: Option<u64>) -> bool {
    if pid <= 0 {
        return false;
    }
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    // The command name (field 2) may hold spaces and parentheses: count from its last ')'.
    let fields: Vec<&str> =
        stat.rsplit_once(')').map(|(_, rest)| rest.split_whitespace().collect()).unwrap_or_default();
    // An exited init not yet reaped (state Z or X) holds nothing any more.
    if matches!(fields.first(), Some(&"Z") | Some(&"X")) {
        return false;
    }
    let Some(start) = start else { return true };
    fields.get(19).and_then(|s| s.parse::<u64>().ok()) == Some(start)
}

fn read_container(root: &Path, dir: &Path, opts: &ScanOptions<'_>) -> Result<Option<RunningContainer>, String> {
    let Some(rec) = read_recorded(dir)? else { return Ok(None) };
    if !alive(rec.pid, rec.start) {
        return Ok(None);
    }
    let config: Option<Value> = rec.bundle.as_ref().and_then(|b| {
        let text = std::fs::read_to_string(b.join("config.json")).ok()?;
        serde_json::from_str(&text).ok()
    });
    let annotations: BTreeMap<String, String> = match &config {
        Some(c) => c
            .get("annotations")
            .and_then(Value::as_object)
            .map(|o| o.iter().filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string()))).collect())
            .unwrap_or_default(),
        None => rec.labels.clone(),
    };
    let a = |k: &str| annotations.get(k).cloned();
    if a("io.kubernetes.cri.container-type").as_deref() == Some("sandbox")
        || a("io.kubernetes.cri-o.ContainerType").as_deref() == Some("sandbox")
    {
        return Ok(None);
    }
    let device_nodes: Vec<(char, u32, u32, String)> = match &config {
        Some(c) => c
            .pointer("/linux/devices")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|d| {
                        let ty = d.get("type")?.as_str()?.chars().next()?;
                        Some((
                            ty,
                            d.get("major")?.as_u64()? as u32,
                            d.get("minor")?.as_u64()? as u32,
                            d.get("path")?.as_str()?.to_string(),
                        ))
                    })
                    .collect()
            })
            .unwrap_or_default(),
        None => rec.devices.clone(),
    };
    let root_s = root.to_string_lossy();
    let crio = a("io.kubernetes.cri-o.ContainerID").is_some();
    let engine = if root_s.starts_with("/run/docker/") || root_s.ends_with("/moby") {
        "docker"
    } else if crio {
        "cri-o"
    } else if root_s.starts_with("/run/containerd/") {
        "containerd"
    } else if a("io.container.manager").as_deref() == Some("libpod") {
        "podman"
    } else {
        "runc"
    };
    let (name, pod) = if crio {
        (a("io.kubernetes.container.name"), a("io.kubernetes.pod.namespace").zip(a("io.kubernetes.pod.name")))
    } else if let Some(n) = a("io.kubernetes.cri.container-name") {
        (Some(n), a("io.kubernetes.cri.sandbox-namespace").zip(a("io.kubernetes.cri.sandbox-name")))
    } else if engine == "docker" {
        (docker_name(opts.docker_root.as_deref().unwrap_or(Path::new("/var/lib/docker")), &rec.id), None)
    } else {
        (None, None)
    };
    let mut served = match annotations.get(APPLIED_ANNOTATION) {
        Some(v) => parse_applied(v, "actk-runtime"),
        None => Vec::new(),
    };
    if served.is_empty()
        && let (Some(c), Some(ctx)) = (&config, opts.plan)
        && has_legacy_hook(c)
    {
        match actk_core::plan::plan(c, ctx) {
            Ok(p) => served.extend(p.served.into_iter().map(|s| Served {
                kind: s.kind,
                names: s.devices,
                via: format!("{} (hook)", s.source),
            })),
            Err(e) => {
                return Err(format!(
                    "container {}: its hook's request, planned again from {}/config.json: {e}",
                    rec.id,
                    rec.bundle.as_deref().unwrap_or(Path::new("?")).display()
                ));
            }
        }
    }
    Ok(Some(RunningContainer { id: rec.id, engine: engine.into(), name, pod, served, device_nodes }))
}

/// Whether config.json runs NVIDIA's hook name at prestart (what `docker run --gpus` adds: path
/// to an executable named `nvidia-container-runtime-hook`, args `[name, "prestart"]`), which on
/// an actk host is actk-hook.
fn has_legacy_hook(config: &Value) -> bool {
    config.pointer("/hooks/prestart").and_then(Value::as_array).is_some_and(|hooks| {
        hooks.iter().any(|h| {
            let path = h.get("path").and_then(Value::as_str).unwrap_or("");
            let arg0 = h.pointer("/args/0").and_then(Value::as_str).unwrap_or("");
            Path::new(path).file_name().is_some_and(|n| n == LEGACY_NVIDIA_HOOK) || arg0 == LEGACY_NVIDIA_HOOK
        })
    })
}

/// Docker's name of container `id` (`"Name": "/train"` in config.v2.json), without the slash.
fn docker_name(docker_root: &Path, id: &str) -> Option<String> {
    let text = std::fs::read_to_string(docker_root.join("containers").join(id).join("config.v2.json")).ok()?;
    let v: Value = serde_json::from_str(&text).ok()?;
    Some(v.get("Name")?.as_str()?.trim_start_matches('/').to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dead_init_process_or_a_reused_pid_is_not_a_running_container() {
        let me = std::process::id() as i32;
        assert!(alive(me, None));
        assert!(!alive(0, None));
        let stat = std::fs::read_to_string(format!("/proc/{me}/stat")).unwrap();
        let start: u64 = stat.rsplit_once(')').unwrap().1.split_whitespace().nth(19).unwrap().parse().unwrap();
        assert!(alive(me, Some(start)));
        assert!(!alive(me, Some(start + 1)));
    }

    #[test]
    fn docker_gpus_hook_is_recognised_by_name_or_argv0() {
        let by_path = serde_json::json!({"hooks": {"prestart": [{"path": "/usr/bin/nvidia-container-runtime-hook", "args": ["x", "prestart"]}]}});
        let by_arg = serde_json::json!({"hooks": {"prestart": [{"path": "/usr/bin/actk-hook", "args": ["nvidia-container-runtime-hook", "prestart"]}]}});
        let other = serde_json::json!({"hooks": {"prestart": [{"path": "/usr/bin/other", "args": ["other"]}]}});
        assert!(has_legacy_hook(&by_path));
        assert!(has_legacy_hook(&by_arg));
        assert!(!has_legacy_hook(&other));
        assert!(!has_legacy_hook(&serde_json::json!({})));
    }

    #[test]
    fn runc_state_gives_bundle_annotations_and_devices_when_config_json_is_gone() {
        let dir = tempfile::tempdir().unwrap();
        let c = dir.path().join("abc");
        std::fs::create_dir(&c).unwrap();
        std::fs::write(
            c.join("state.json"),
            r#"{"id":"abc","init_process_pid":1,"init_process_start":5,"config":{"labels":["io.actk.applied=nvidia.com/gpu=0 (NVIDIA_VISIBLE_DEVICES, generated)","bundle=/nonexistent/bundle"],"devices":[{"type":99,"major":195,"minor":0,"path":"/dev/nvidia0"}]}}"#,
        )
        .unwrap();
        let r = read_recorded(&c).unwrap().unwrap();
        assert_eq!(r.id, "abc");
        assert_eq!(r.pid, 1);
        assert_eq!(r.start, Some(5));
        assert_eq!(r.bundle.as_deref(), Some(Path::new("/nonexistent/bundle")));
        assert_eq!(r.labels[APPLIED_ANNOTATION], "nvidia.com/gpu=0 (NVIDIA_VISIBLE_DEVICES, generated)");
        assert_eq!(r.devices, vec![('c', 195, 0, "/dev/nvidia0".to_string())]);
        assert!(read_recorded(dir.path()).unwrap().is_none(), "a directory without state is no container");
    }
}
