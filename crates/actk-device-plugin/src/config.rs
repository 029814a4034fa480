//! Configuration of the device plugin: a TOML file, environment variables and flags, in that
//! order of increasing precedence (flag > env > file > built-in default).
//!
//! The file (default [`DEFAULT_CONFIG`], or `--config` / `ACTK_DEVICE_PLUGIN_CONFIG`) has the
//! keys of [`FileConfig`]; a missing default file is not an error, a missing named file is. A
//! file ending in `.yaml`/`.yml` is read as NVIDIA k8s-device-plugin's config (`version: v1`,
//! `flags.migStrategy`, `sharing.timeSlicing`, `sharing.mps`), so a ConfigMap written for NVIDIA's
//! plugin keeps working; its other keys are named in a warning and not used. A TOML file can also
//! name such a file, or a directory of them (a mounted ConfigMap of NVIDIA's chart, one config
//! per key), with `nvidia_config` (and `nvidia_config_name`): its MIG strategy and sharing are
//! then taken from there.
//! Flags and their environment variables are declared in the binary (clap, `env` feature);
//! [`Settings::merge`] takes the value given on the command line or in the environment first,
//! then the file's, then the default.

use crate::allocate::Strategy;
use crate::resources::{DeviceIds, MAX_REPLICAS, MigStrategy, Mps, ResourceNaming, SharedResource, TimeSlicing};
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Config file read when none is named and it exists.
pub const DEFAULT_CONFIG: &str = "/etc/actk/device-plugin.toml";

/// Poll interval of the health loop when none is configured: well under the 2 s within which a
/// failed device must show as Unhealthy.
pub const DEFAULT_HEALTH_INTERVAL_MS: u64 = 500;

/// The config file's shape. Every key is optional; unknown keys are errors naming the key.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub struct FileConfig {
    /// Host root discovery reads (`/`, or where the host is mounted in the plugin's container).
    pub root: Option<PathBuf>,
    /// Where the node's `/` is mounted in the plugin's container: this prefix is removed from
    /// host paths sent to the kubelet in device specs and mounts (default `/`: nothing removed).
    pub host_mount: Option<PathBuf>,
    /// Directory of user vendor profiles.
    pub profiles_dir: Option<PathBuf>,
    /// Directory for the plugin sockets and the kubelet's socket.
    pub socket_dir: Option<PathBuf>,
    /// The kubelet's Registration socket (default `<socket_dir>/kubelet.sock`).
    pub kubelet_socket: Option<PathBuf>,
    /// The kubelet's PodResources socket (default
    /// [`crate::api::podresources::DEFAULT_SOCKET`]): which devices the node's pods hold, so
    /// that hardware held through one resource is withdrawn from the others (crate::held).
    pub pod_resources_socket: Option<PathBuf>,
    /// Allocate strategies, combined (`cdi-cri`, `cdi-annotations`, `envvar`, `device-specs`, `volume-mounts`).
    pub strategies: Option<Vec<String>>,
    /// Only these resource names are served (default: every resource of every vendor found).
    pub resources: Option<Vec<String>>,
    /// `uuid` or `index`.
    pub device_ids: Option<String>,
    /// Driver capabilities whose files device specs mount (default: the profile's defaults).
    pub capabilities: Option<Vec<String>>,
    /// Health poll interval in milliseconds.
    pub health_interval_ms: Option<u64>,
    /// `host:port` of the Prometheus `/metrics` endpoint; absent: no endpoint.
    pub metrics_address: Option<String>,
    /// Fail GetPreferredAllocation (instead of warning) when the size cannot be placed well.
    pub strict_topology: Option<bool>,
    /// The CDI spec directories the node's container runtime reads, as node paths (default
    /// [`actk_core::cdi::DEFAULT_SPEC_DIRS`]); read under `host_mount`. The CDI strategies hand
    /// out only names a spec there defines (field case F18).
    pub spec_dirs: Option<Vec<PathBuf>>,
    /// MIG strategy for NVIDIA GPUs: `none`, `single` or `mixed`.
    pub mig_strategy: Option<String>,
    /// How partitioned AMD GPUs are named: `single` or `mixed`.
    pub resource_naming_strategy: Option<String>,
    /// Physical cores per logical core for core resources (Neuron LNC: 1, or 2 on Trainium2);
    /// the plugin's own `NEURON_LOGICAL_NC_CONFIG` is used when this is unset.
    pub logical_core_size: Option<u32>,
    /// Sharing of devices between containers.
    pub sharing: Option<SharingFile>,
    /// Health checks.
    pub health: Option<HealthFile>,
    /// A config file in NVIDIA k8s-device-plugin's format (`version: v1`), or a directory of
    /// them (a ConfigMap mounted as a volume: one file per key), whose `flags.migStrategy`,
    /// `sharing.timeSlicing` and `sharing.mps` are used as this file's `mig_strategy` and
    /// `[sharing]` (giving one in both places is an error).
    pub nvidia_config: Option<PathBuf>,
    /// Which file of the `nvidia_config` directory (NVIDIA's chart `config.default`); without
    /// it the directory must hold exactly one (NVIDIA's `single` fallback).
    pub nvidia_config_name: Option<String>,
    /// Add the NRI gate's CDI device ([`actk_core::policy::NRI_GATE_CDI_NAME`]) to every
    /// allocation: the node's containers get their devices from actk-nri, and one it did not
    /// serve (its pod not running: a rollout, a crash, a dropped connection) must fail naming it
    /// rather than start without devices. Needs actk-nri with `--gate-spec-dir` on the node
    /// (the chart's `nri.gate`) and a kubelet that passes `cdi_devices` on (1.28+).
    pub nri_gate: Option<bool>,
}

/// `[sharing]`: how devices are shared.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub struct SharingFile {
    /// `[sharing.time_slicing]` (NVIDIA's `sharing.timeSlicing`).
    pub time_slicing: Option<TimeSlicingFile>,
    /// `[sharing.mps]` (NVIDIA's `sharing.mps`).
    pub mps: Option<MpsFile>,
}

/// `[sharing.mps]`: GPUs shared through the node's CUDA MPS control daemon.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub struct MpsFile {
    /// Host directory of the daemon's pipes (default [`DEFAULT_MPS_PIPE_DIRECTORY`]).
    pub pipe_directory: Option<PathBuf>,
    /// Host directory mounted as the containers' /dev/shm (the daemon's shared memory).
    pub shm_directory: Option<PathBuf>,
    /// `[[sharing.mps.resources]]`: name, replicas (rename is not offered: MPS replicas are the resource).
    #[serde(default)]
    pub resources: Vec<SharedResourceFile>,
}

/// Whether `n` is a Kubernetes extended resource name `<domain>/<name>`: the domain as a CDI
/// vendor, the name a qualified name (1 to 63 letters, digits, `-`, `_`, `.`, starting and ending
/// with a letter or digit; Kubernetes `IsQualifiedName`), so `nvidia.com/gpu.shared` (NVIDIA's
/// documented rename) and `nvidia.com/mig-1g.10gb` pass, unlike a CDI kind's class.
pub fn extended_resource_name_ok(n: &str) -> bool {
    let Some((domain, name)) = n.split_once('/') else { return false };
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    actk_core::profile::check_kind(&format!("{domain}/x")).is_ok()
        && (1..=63).contains(&name.len())
        && edge(name.chars().next())
        && edge(name.chars().last())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// Default MPS pipe directory on the host.
pub const DEFAULT_MPS_PIPE_DIRECTORY: &str = "/run/nvidia/mps";

/// `[sharing.time_slicing]`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub struct TimeSlicingFile {
    /// Serve shared resources as `<resource>.shared` unless they name a `rename`.
    pub rename_by_default: Option<bool>,
    /// Refuse Allocate requests for more than one replica.
    pub fail_requests_greater_than_one: Option<bool>,
    /// `[[sharing.time_slicing.resources]]`.
    #[serde(default)]
    pub resources: Vec<SharedResourceFile>,
}

/// One `[[sharing.time_slicing.resources]]` entry.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub struct SharedResourceFile {
    /// The resource to share (`nvidia.com/gpu`).
    pub name: String,
    /// Replicas per device, 1 to [`MAX_REPLICAS`] (wide type so that a huge value is named, not a parse error).
    pub replicas: i64,
    /// Serve it under this name instead.
    pub rename: Option<String>,
    /// Which devices (NVIDIA's `devices`): `"all"` (the default), or a list of device indexes,
    /// `GPU:MIG` indexes and UUIDs.
    pub devices: Option<DevicesFile>,
}

/// NVIDIA's `devices` of a shared resource: `all`, a count, or a list.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum DevicesFile {
    /// `all` (another word is an error).
    Word(String),
    /// A device count (NVIDIA's form; refused with the fix: list the devices).
    Count(i64),
    /// Device indexes (numbers or strings), `GPU:MIG` indexes, UUIDs.
    List(Vec<DeviceRefFile>),
}

/// One entry of a `devices` list: YAML writes `[0, 1]` as numbers.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum DeviceRefFile {
    /// A device index.
    Index(u64),
    /// An index as text, `GPU:MIG`, or a UUID.
    Text(String),
}

impl DeviceRefFile {
    fn text(&self) -> String {
        match self {
            DeviceRefFile::Index(i) => i.to_string(),
            DeviceRefFile::Text(t) => t.trim().to_string(),
        }
    }
}

/// `[health]`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub struct HealthFile {
    /// Xids ignored on top of NVIDIA's application Xids (13, 31, 43, 45, 68, 109).
    pub ignored_xids: Option<Vec<u64>>,
    /// How long after its last critical Xid (or rise of an uncorrectable error counter, of any
    /// vendor: actk-node's health engine) a device is Healthy again, in milliseconds; 0 keeps
    /// it Unhealthy until the plugin restarts (NVIDIA's behaviour for Xids).
    pub xid_recovery_ms: Option<u64>,
}

/// Why the configuration is unusable. Each names the file, key or value at fault.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The named config file cannot be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid TOML of the expected shape.
    #[error("config file {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The TOML parser's message (line, column, key).
        message: String,
    },
    /// A value is not acceptable.
    #[error("{origin}: {key} = {value:?}: {expected}")]
    Invalid {
        /// `--flag / ENV` or the file path.
        origin: String,
        /// The key.
        key: String,
        /// The rejected value.
        value: String,
        /// What is accepted.
        expected: String,
    },
}

impl FileConfig {
    /// Read `path` (TOML; NVIDIA's YAML for `.yaml`/`.yml`). With `required == false` a missing
    /// file gives the empty config.
    pub fn load(path: &Path, required: bool) -> Result<FileConfig, ConfigError> {
        FileConfig::load_named(path, required, None)
    }

    /// As [`FileConfig::load`], with `name` (the value of the node's label
    /// [`crate::node_config::CONFIG_LABEL`]) choosing the config of the `nvidia_config`
    /// directory instead of the file's `nvidia_config_name`.
    ///
    /// Errors: as [`FileConfig::load`]; `name` names no config of the directory (the message
    /// lists those it has), or there is no `nvidia_config` to choose from.
    pub fn load_named(path: &Path, required: bool, name: Option<&str>) -> Result<FileConfig, ConfigError> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if !required && e.kind() == std::io::ErrorKind::NotFound => return Ok(FileConfig::default()),
            Err(source) => return Err(ConfigError::Read { path: path.to_path_buf(), source }),
        };
        if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            return nvidia_yaml(path, &text);
        }
        let mut f: FileConfig = toml::from_str(&text)
            .map_err(|e| ConfigError::Parse { path: path.to_path_buf(), message: e.to_string().trim().to_string() })?;
        if let Some(name) = name {
            if f.nvidia_config.is_none() {
                return Err(ConfigError::Invalid {
                    origin: path.display().to_string(),
                    key: "nvidia_config".into(),
                    value: String::new(),
                    expected: format!(
                        "a directory of named configs for the node's config name {name:?} to choose from \
                         (the chart's config.map or config.name)"
                    ),
                });
            }
            f.nvidia_config_name = Some(name.to_string());
        }
        if let Some(n) = f.nvidia_config.clone() {
            let file = nvidia_config_file(&n, f.nvidia_config_name.as_deref(), path)?;
            let text =
                std::fs::read_to_string(&file).map_err(|source| ConfigError::Read { path: file.clone(), source })?;
            f.take_nvidia(nvidia_yaml(&file, &text)?, path, &file)?;
        }
        Ok(f)
    }

    /// Takes the MIG strategy and sharing of NVIDIA's config `nv` (read from `nv_path`, named by
    /// this file `path`); a value set in both is an error naming both.
    fn take_nvidia(&mut self, nv: FileConfig, path: &Path, nv_path: &Path) -> Result<(), ConfigError> {
        let both = |key: &str, ours: String| ConfigError::Invalid {
            origin: path.display().to_string(),
            key: key.into(),
            value: ours,
            expected: format!("set in one place only: {} (nvidia_config) sets it too", nv_path.display()),
        };
        if let Some(m) = nv.mig_strategy {
            if let Some(ours) = &self.mig_strategy
                && *ours != m
            {
                return Err(both("mig_strategy", ours.clone()));
            }
            self.mig_strategy = Some(m);
        }
        let nv_sharing = nv.sharing.unwrap_or_default();
        let sharing = self.sharing.get_or_insert_with(Default::default);
        if let Some(t) = nv_sharing.time_slicing {
            if sharing.time_slicing.as_ref().is_some_and(|x| !x.resources.is_empty()) {
                return Err(both("sharing.time_slicing", "its resources".into()));
            }
            sharing.time_slicing = Some(t);
        }
        if let Some(m) = nv_sharing.mps {
            match &mut sharing.mps {
                Some(ours) if !ours.resources.is_empty() => return Err(both("sharing.mps", "its resources".into())),
                // This file keeps the host directories, NVIDIA's gives the resources.
                Some(ours) => ours.resources = m.resources,
                None => sharing.mps = Some(m),
            }
        }
        if sharing.time_slicing.is_none() && sharing.mps.is_none() {
            self.sharing = None;
        }
        Ok(())
    }
}

/// The file of NVIDIA's config `p`: `p` itself, or in a directory (a ConfigMap volume: one
/// file per key, beside Kubernetes' `..data` entries) the one named `name`, else the one named
/// `default`, else the only one (NVIDIA's fallback strategies `named` and `single`).
fn nvidia_config_file(p: &Path, name: Option<&str>, origin: &Path) -> Result<PathBuf, ConfigError> {
    let invalid = |value: String, expected: String| ConfigError::Invalid {
        origin: origin.display().to_string(),
        key: "nvidia_config".into(),
        value,
        expected,
    };
    if !p.is_dir() {
        return Ok(p.to_path_buf());
    }
    let mut keys: Vec<String> = std::fs::read_dir(p)
        .map_err(|source| ConfigError::Read { path: p.to_path_buf(), source })?
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| !n.starts_with('.'))
        .collect();
    keys.sort();
    match name {
        Some(n) if keys.iter().any(|k| k == n) => Ok(p.join(n)),
        Some(n) => Err(invalid(
            format!("{} (nvidia_config_name {n:?})", p.display()),
            format!(
                "a config named {n:?} in the ConfigMap; it has {} (the node label actk.dev/config or the chart's \
                 config.default names one of them)",
                if keys.is_empty() { "none".to_string() } else { keys.join(", ") }
            ),
        )),
        None if keys.iter().any(|k| k == "default") => Ok(p.join("default")),
        None if keys.len() == 1 => Ok(p.join(&keys[0])),
        None => Err(invalid(
            p.display().to_string(),
            format!(
                "one config, one named `default`, or a name for this node: the node label actk.dev/config, \
                 else nvidia_config_name (the chart's config.default); the ConfigMap has {}",
                if keys.is_empty() { "none".to_string() } else { keys.join(", ") }
            ),
        )),
    }
}

/// NVIDIA k8s-device-plugin's config file (api/config/v1), the keys actk uses.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct NvidiaYaml {
    version: Option<String>,
    #[serde(default)]
    flags: NvidiaFlags,
    #[serde(default)]
    sharing: NvidiaSharing,
    #[serde(flatten)]
    other: std::collections::BTreeMap<String, serde::de::IgnoredAny>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct NvidiaFlags {
    mig_strategy: Option<String>,
    #[serde(flatten)]
    other: std::collections::BTreeMap<String, serde::de::IgnoredAny>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct NvidiaSharing {
    time_slicing: Option<NvidiaTimeSlicing>,
    mps: Option<NvidiaTimeSlicing>,
    #[serde(flatten)]
    other: std::collections::BTreeMap<String, serde::de::IgnoredAny>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct NvidiaTimeSlicing {
    rename_by_default: Option<bool>,
    fail_requests_greater_than_one: Option<bool>,
    #[serde(default)]
    resources: Vec<NvidiaSharedResource>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct NvidiaSharedResource {
    name: String,
    replicas: i64,
    rename: Option<String>,
    devices: Option<DevicesFile>,
}

fn nvidia_yaml(path: &Path, text: &str) -> Result<FileConfig, ConfigError> {
    let y: NvidiaYaml = serde_saphyr::from_str(text)
        .map_err(|e| ConfigError::Parse { path: path.to_path_buf(), message: e.to_string().trim().to_string() })?;
    if let Some(v) = y.version.as_deref().filter(|v| *v != "v1") {
        return Err(ConfigError::Invalid {
            origin: path.display().to_string(),
            key: "version".into(),
            value: v.into(),
            expected: "v1 (NVIDIA k8s-device-plugin config format)".into(),
        });
    }
    let mut unused: Vec<String> = y.other.keys().cloned().collect();
    unused.extend(y.flags.other.keys().map(|k| format!("flags.{k}")));
    unused.extend(y.sharing.other.keys().map(|k| format!("sharing.{k}")));
    let time_slicing = y.sharing.time_slicing.map(|t| TimeSlicingFile {
        rename_by_default: t.rename_by_default,
        fail_requests_greater_than_one: t.fail_requests_greater_than_one,
        resources: t
            .resources
            .into_iter()
            .map(|r| SharedResourceFile { name: r.name, replicas: r.replicas, rename: r.rename, devices: r.devices })
            .collect(),
    });
    let mps = y.sharing.mps.map(|m| MpsFile {
        resources: m
            .resources
            .into_iter()
            .map(|r| SharedResourceFile { name: r.name, replicas: r.replicas, rename: r.rename, devices: r.devices })
            .collect(),
        ..Default::default()
    });
    if !unused.is_empty() {
        tracing::warn!("{}: NVIDIA device plugin keys not used by actk: {}", path.display(), unused.join(", "));
    }
    let sharing = (time_slicing.is_some() || mps.is_some()).then_some(SharingFile { time_slicing, mps });
    Ok(FileConfig { mig_strategy: y.flags.mig_strategy, sharing, ..Default::default() })
}

/// What the node labeller publishes of the plugin's config file `path` with the node's config
/// `name` chosen as the plugin chooses it ([`FileConfig::load_named`]; `None`: the default):
/// the MIG strategy, time-slicing and MPS replicas per resource (an entry limited to some
/// `devices` counts too, as GFD counts it), the resources served under another name, and the
/// named config applied (the `nvidia_config` directory's key, `None` without one). Flags and
/// environment of the plugin's container (the chart's extraArgs/extraEnv) are not seen.
///
/// Errors: as [`FileConfig::load_named`] and [`Settings::merge`]: a config the plugin would
/// refuse is refused here too.
pub fn label_options(path: &Path, name: Option<&str>) -> Result<actk_node::labels::LabelOptions, ConfigError> {
    let f = FileConfig::load_named(path, true, name)?;
    let applied = match &f.nvidia_config {
        Some(dir) if dir.is_dir() => nvidia_config_file(dir, f.nvidia_config_name.as_deref(), path)?
            .file_name()
            .map(|n| n.to_string_lossy().into_owned()),
        _ => None,
    };
    let s = Settings::merge(Overrides::default(), f, &path.display().to_string())?;
    let mut o = actk_node::labels::LabelOptions {
        mig_strategy: Some(s.mig_strategy.to_string()),
        config: applied,
        ..Default::default()
    };
    if let Some(t) = &s.time_slicing {
        for r in &t.resources {
            o.replicas.insert(r.name.clone(), r.replicas);
            if r.rename.is_some() || t.rename_by_default {
                o.renamed.insert(r.name.clone());
            }
        }
    }
    if let Some(m) = &s.mps {
        for r in &m.resources {
            o.mps.insert(r.name.clone(), r.replicas);
        }
    }
    Ok(o)
}

/// Values given on the command line or in the environment (clap fills both), each optional.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// `--root` / `ACTK_ROOT`.
    pub root: Option<PathBuf>,
    /// `--host-mount` / `ACTK_DEVICE_PLUGIN_HOST_MOUNT`.
    pub host_mount: Option<PathBuf>,
    /// `--profiles-dir` / `ACTK_PROFILES_DIR`.
    pub profiles_dir: Option<PathBuf>,
    /// `--socket-dir` / `ACTK_DEVICE_PLUGIN_SOCKET_DIR`.
    pub socket_dir: Option<PathBuf>,
    /// `--kubelet-socket` / `ACTK_DEVICE_PLUGIN_KUBELET_SOCKET`.
    pub kubelet_socket: Option<PathBuf>,
    /// `--pod-resources-socket` / `ACTK_DEVICE_PLUGIN_POD_RESOURCES_SOCKET`.
    pub pod_resources_socket: Option<PathBuf>,
    /// `--strategies` / `ACTK_DEVICE_PLUGIN_STRATEGIES` (comma-separated).
    pub strategies: Option<Vec<String>>,
    /// `--resources` / `ACTK_DEVICE_PLUGIN_RESOURCES` (comma-separated).
    pub resources: Option<Vec<String>>,
    /// `--device-ids` / `ACTK_DEVICE_PLUGIN_DEVICE_IDS`.
    pub device_ids: Option<String>,
    /// `--capabilities` / `ACTK_DEVICE_PLUGIN_CAPABILITIES`.
    pub capabilities: Option<Vec<String>>,
    /// `--health-interval-ms` / `ACTK_DEVICE_PLUGIN_HEALTH_INTERVAL_MS`.
    pub health_interval_ms: Option<u64>,
    /// `--metrics-address` / `ACTK_DEVICE_PLUGIN_METRICS_ADDRESS`.
    pub metrics_address: Option<String>,
    /// `--strict-topology` / `ACTK_DEVICE_PLUGIN_STRICT_TOPOLOGY`.
    pub strict_topology: Option<bool>,
    /// `--spec-dirs` / `ACTK_DEVICE_PLUGIN_SPEC_DIRS` (comma-separated).
    pub spec_dirs: Option<Vec<PathBuf>>,
    /// `--mig-strategy` / `ACTK_DEVICE_PLUGIN_MIG_STRATEGY`.
    pub mig_strategy: Option<String>,
    /// `--resource-naming-strategy` / `ACTK_DEVICE_PLUGIN_RESOURCE_NAMING_STRATEGY`.
    pub resource_naming_strategy: Option<String>,
    /// `--nri-gate` / `ACTK_DEVICE_PLUGIN_NRI_GATE`.
    pub nri_gate: Option<bool>,
    /// `NEURON_LOGICAL_NC_CONFIG` of the plugin's environment (as the Neuron runtime reads it).
    pub logical_core_size: Option<String>,
}

/// The effective settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// Host root for discovery and health probes.
    pub root: PathBuf,
    /// Prefix removed from host paths sent to the kubelet.
    pub host_mount: PathBuf,
    /// User profiles directory (`None`: actk-core's default).
    pub profiles_dir: Option<PathBuf>,
    /// Socket directory.
    pub socket_dir: PathBuf,
    /// Kubelet Registration socket.
    pub kubelet_socket: PathBuf,
    /// Kubelet PodResources socket.
    pub pod_resources_socket: PathBuf,
    /// Allocate strategies, in the order given, without duplicates.
    pub strategies: Vec<Strategy>,
    /// Resource name filter (`None`: all).
    pub resources: Option<Vec<String>>,
    /// Device ID scheme.
    pub device_ids: DeviceIds,
    /// Capabilities for device-spec mounts (`None`: profile defaults).
    pub capabilities: Option<Vec<String>>,
    /// Health poll interval.
    pub health_interval: Duration,
    /// Metrics endpoint address.
    pub metrics_address: Option<SocketAddr>,
    /// Whether a poorly placeable preferred allocation is an error.
    pub strict_topology: bool,
    /// CDI spec directories of the node's runtime, node paths in priority order (lowest first).
    pub spec_dirs: Vec<PathBuf>,
    /// How NVIDIA MIG devices are served.
    pub mig_strategy: MigStrategy,
    /// How partitioned AMD GPUs are named.
    pub amd_naming: ResourceNaming,
    /// Physical cores per logical core (Neuron LNC), 1 to 8.
    pub logical_core_size: u32,
    /// Time-slicing, when configured.
    pub time_slicing: Option<TimeSlicing>,
    /// CUDA MPS sharing, when configured.
    pub mps: Option<Mps>,
    /// Xids ignored on top of the application ones.
    pub ignored_xids: Vec<u64>,
    /// Quiet time after which an Xid-unhealthy GPU that answers NVML is Healthy again (zero: never).
    pub xid_recovery: Duration,
    /// Whether every allocation names the NRI gate's CDI device (`nri_gate`).
    pub nri_gate: bool,
}

/// Default of `health.xid_recovery_ms`: a minute without a critical Xid.
pub const DEFAULT_XID_RECOVERY_MS: u64 = 60_000;

/// Checks `[sharing.time_slicing]`: resource names, replicas in range, no name twice.
fn check_time_slicing(t: &TimeSlicingFile, origin: &str) -> Result<TimeSlicing, ConfigError> {
    let mut out = TimeSlicing {
        rename_by_default: t.rename_by_default.unwrap_or(false),
        fail_requests_greater_than_one: t.fail_requests_greater_than_one.unwrap_or(false),
        resources: Vec::new(),
    };
    for (i, r) in t.resources.iter().enumerate() {
        let bad = |key: &str, value: String, expected: String| ConfigError::Invalid {
            origin: origin.to_string(),
            key: format!("sharing.time_slicing.resources[{i}].{key}"),
            value,
            expected,
        };
        let name_ok = extended_resource_name_ok;
        if !name_ok(&r.name) {
            return Err(bad("name", r.name.clone(), "an extended resource name such as nvidia.com/gpu".into()));
        }
        let replicas = u32::try_from(r.replicas).ok().filter(|n| (1..=MAX_REPLICAS).contains(n)).ok_or_else(|| {
            bad(
                "replicas",
                r.replicas.to_string(),
                format!(
                    "1 to {MAX_REPLICAS} replicas of each {} device (each replica is one kubelet device ID, listed in every ListAndWatch update)",
                    r.name
                ),
            )
        })?;
        if let Some(n) = &r.rename
            && !name_ok(n)
        {
            return Err(bad("rename", n.clone(), "an extended resource name such as nvidia.com/gpu.shared".into()));
        }
        let devices = match &r.devices {
            None => None,
            Some(DevicesFile::Word(w)) if w.trim().eq_ignore_ascii_case("all") => None,
            Some(DevicesFile::Word(w)) => {
                return Err(bad(
                    "devices",
                    w.clone(),
                    "all, or a list of device indexes, GPU:MIG indexes or UUIDs".into(),
                ));
            }
            Some(DevicesFile::Count(n)) => {
                return Err(bad(
                    "devices",
                    n.to_string(),
                    "all, or a list of the devices to share (indexes, GPU:MIG indexes or UUIDs): a device count is not supported"
                        .into(),
                ));
            }
            Some(DevicesFile::List(l)) if l.is_empty() => {
                return Err(bad("devices", "[]".into(), "all, or at least one device".into()));
            }
            Some(DevicesFile::List(l)) => Some(l.iter().map(DeviceRefFile::text).collect::<Vec<_>>()),
        };
        for x in out.resources.iter().filter(|x: &&SharedResource| x.name == r.name) {
            // One resource split by device (NVIDIA's per-device entries): lists, disjoint.
            let (Some(a), Some(b)) = (&x.devices, &devices) else {
                return Err(bad(
                    "name",
                    r.name.clone(),
                    "each resource once, or several entries each with its own devices list".into(),
                ));
            };
            if let Some(d) = b.iter().find(|d| a.contains(d)) {
                return Err(bad("devices", d.clone(), format!("a device in one entry of {} only", r.name)));
            }
        }
        out.resources.push(SharedResource { name: r.name.clone(), replicas, rename: r.rename.clone(), devices });
    }
    Ok(out)
}

impl Settings {
    /// Merge flags/env over the file over defaults, and check every value. `file_origin` names
    /// the file in errors.
    pub fn merge(o: Overrides, f: FileConfig, file_origin: &str) -> Result<Settings, ConfigError> {
        let socket_dir = o.socket_dir.or(f.socket_dir).unwrap_or_else(|| PathBuf::from(crate::api::DEFAULT_SOCKET_DIR));
        let kubelet_socket =
            o.kubelet_socket.or(f.kubelet_socket).unwrap_or_else(|| socket_dir.join(crate::api::KUBELET_SOCKET));
        let (strategies, origin) = match (o.strategies, f.strategies) {
            (Some(s), _) => (s, "--strategies / ACTK_DEVICE_PLUGIN_STRATEGIES".to_string()),
            (None, Some(s)) => (s, file_origin.to_string()),
            (None, None) => (vec![Strategy::CdiCri.to_string()], String::new()),
        };
        let mut parsed = Vec::new();
        for s in strategies.iter().map(|s| s.trim()).filter(|s| !s.is_empty()) {
            let st: Strategy = s.parse().map_err(|expected| ConfigError::Invalid {
                origin: origin.clone(),
                key: "strategies".into(),
                value: s.to_string(),
                expected,
            })?;
            if !parsed.contains(&st) {
                parsed.push(st);
            }
        }
        if parsed.is_empty() {
            return Err(ConfigError::Invalid {
                origin,
                key: "strategies".into(),
                value: strategies.join(","),
                expected: format!("at least one of {}", crate::allocate::STRATEGY_NAMES),
            });
        }
        let device_ids = match (o.device_ids, f.device_ids) {
            (Some(v), _) => v.parse().map_err(|expected| ConfigError::Invalid {
                origin: "--device-ids / ACTK_DEVICE_PLUGIN_DEVICE_IDS".into(),
                key: "device_ids".into(),
                value: v.clone(),
                expected,
            })?,
            (None, Some(v)) => v.parse().map_err(|expected| ConfigError::Invalid {
                origin: file_origin.into(),
                key: "device_ids".into(),
                value: v.clone(),
                expected,
            })?,
            (None, None) => DeviceIds::default(),
        };
        let interval = o.health_interval_ms.or(f.health_interval_ms).unwrap_or(DEFAULT_HEALTH_INTERVAL_MS);
        if !(10..=1500).contains(&interval) {
            return Err(ConfigError::Invalid {
                origin: "health_interval_ms".into(),
                key: "health_interval_ms".into(),
                value: interval.to_string(),
                expected: "10 to 1500 milliseconds (an unhealthy device must show within 2 s)".into(),
            });
        }
        let metrics_address = match o.metrics_address.or(f.metrics_address).filter(|a| !a.is_empty()) {
            None => None,
            Some(a) => Some(a.parse::<SocketAddr>().map_err(|e| ConfigError::Invalid {
                origin: "metrics_address".into(),
                key: "metrics_address".into(),
                value: a.clone(),
                expected: format!("host:port such as 0.0.0.0:9400 ({e})"),
            })?),
        };
        let spec_dirs = o
            .spec_dirs
            .or(f.spec_dirs)
            .unwrap_or_else(|| actk_core::cdi::DEFAULT_SPEC_DIRS.iter().map(PathBuf::from).collect::<Vec<_>>());
        if let Some(bad) = spec_dirs.iter().find(|d| !d.is_absolute()) {
            return Err(ConfigError::Invalid {
                origin: "spec_dirs".into(),
                key: "spec_dirs".into(),
                value: bad.display().to_string(),
                expected: "absolute paths of CDI spec directories on the node, such as /var/run/cdi".into(),
            });
        }
        let (mig_value, mig_origin) = match (o.mig_strategy, f.mig_strategy) {
            (Some(v), _) => (Some(v), "--mig-strategy / ACTK_DEVICE_PLUGIN_MIG_STRATEGY".to_string()),
            (None, Some(v)) => (Some(v), file_origin.to_string()),
            (None, None) => (None, String::new()),
        };
        let mig_strategy = match mig_value {
            Some(v) => v.parse().map_err(|expected| ConfigError::Invalid {
                origin: mig_origin,
                key: "mig_strategy".into(),
                value: v.clone(),
                expected,
            })?,
            None => MigStrategy::default(),
        };
        let amd_naming = match (o.resource_naming_strategy, f.resource_naming_strategy) {
            (Some(v), _) => v.parse().map_err(|expected| ConfigError::Invalid {
                origin: "--resource-naming-strategy / ACTK_DEVICE_PLUGIN_RESOURCE_NAMING_STRATEGY".into(),
                key: "resource_naming_strategy".into(),
                value: v.clone(),
                expected,
            })?,
            (None, Some(v)) => v.parse().map_err(|expected| ConfigError::Invalid {
                origin: file_origin.into(),
                key: "resource_naming_strategy".into(),
                value: v.clone(),
                expected,
            })?,
            (None, None) => ResourceNaming::default(),
        };
        let (lnc_value, lnc_origin) = match (o.logical_core_size, f.logical_core_size) {
            (Some(v), _) => (v, "NEURON_LOGICAL_NC_CONFIG".to_string()),
            (None, Some(n)) => (n.to_string(), file_origin.to_string()),
            (None, None) => ("1".to_string(), String::new()),
        };
        let logical_core_size = match lnc_value.trim().parse::<u32>() {
            Ok(n @ 1..=8) => (n, lnc_origin),
            _ => {
                return Err(ConfigError::Invalid {
                    origin: lnc_origin,
                    key: "logical_core_size".into(),
                    value: lnc_value,
                    expected: "physical NeuronCores per logical core, 1 to 8 (Trainium2: 2)".into(),
                });
            }
        };
        let time_slicing = match f.sharing.as_ref().and_then(|s| s.time_slicing.as_ref()) {
            Some(t) => Some(check_time_slicing(t, file_origin)?),
            None => None,
        };
        let mps = match f.sharing.as_ref().and_then(|s| s.mps.as_ref()) {
            Some(m) => {
                let as_ts = TimeSlicingFile { resources: m.resources.clone(), ..Default::default() };
                let checked = check_time_slicing(&as_ts, file_origin)
                    .map_err(|e| match e {
                        ConfigError::Invalid { origin, key, value, expected } => ConfigError::Invalid {
                            origin,
                            key: key.replace("sharing.time_slicing", "sharing.mps"),
                            value,
                            expected,
                        },
                        other => other,
                    })?
                    .resources;
                for r in &checked {
                    if time_slicing.as_ref().is_some_and(|t| t.resources.iter().any(|x| x.name == r.name)) {
                        return Err(ConfigError::Invalid {
                            origin: file_origin.into(),
                            key: "sharing.mps.resources.name".into(),
                            value: r.name.clone(),
                            expected: "a resource shared by MPS or by time-slicing, not both".into(),
                        });
                    }
                    if r.rename.is_some() {
                        return Err(ConfigError::Invalid {
                            origin: file_origin.into(),
                            key: "sharing.mps.resources.rename".into(),
                            value: r.rename.clone().unwrap_or_default(),
                            expected: "no rename for MPS resources".into(),
                        });
                    }
                    if let Some(d) = &r.devices {
                        return Err(ConfigError::Invalid {
                            origin: file_origin.into(),
                            key: "sharing.mps.resources.devices".into(),
                            value: d.join(","),
                            expected: "all: an MPS resource shares every device of the resource (it keeps its name, \
                                       so devices left out would not be served)"
                                .into(),
                        });
                    }
                }
                Some(Mps {
                    pipe_directory: m
                        .pipe_directory
                        .clone()
                        .unwrap_or_else(|| PathBuf::from(DEFAULT_MPS_PIPE_DIRECTORY)),
                    shm_directory: m.shm_directory.clone(),
                    resources: checked,
                })
            }
            None => None,
        };
        let health = f.health.clone().unwrap_or_default();
        Ok(Settings {
            spec_dirs,
            root: o.root.or(f.root).unwrap_or_else(|| PathBuf::from("/")),
            host_mount: o.host_mount.or(f.host_mount).unwrap_or_else(|| PathBuf::from("/")),
            profiles_dir: o.profiles_dir.or(f.profiles_dir),
            socket_dir,
            kubelet_socket,
            pod_resources_socket: o
                .pod_resources_socket
                .or(f.pod_resources_socket)
                .unwrap_or_else(|| PathBuf::from(crate::api::podresources::DEFAULT_SOCKET)),
            strategies: parsed,
            resources: o.resources.or(f.resources),
            device_ids,
            capabilities: o.capabilities.or(f.capabilities),
            health_interval: Duration::from_millis(interval),
            metrics_address,
            strict_topology: o.strict_topology.or(f.strict_topology).unwrap_or(false),
            mig_strategy,
            amd_naming,
            logical_core_size: logical_core_size.0,
            time_slicing,
            mps,
            ignored_xids: health.ignored_xids.unwrap_or_default(),
            xid_recovery: Duration::from_millis(health.xid_recovery_ms.unwrap_or(DEFAULT_XID_RECOVERY_MS)),
            nri_gate: o.nri_gate.or(f.nri_gate).unwrap_or(false),
        })
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn extended_resource_names_allow_dots_in_the_name() {
        for ok in ["nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-1g.10gb", "amd.com/gpu_cpx"] {
            assert!(extended_resource_name_ok(ok), "{ok}");
        }
        for bad in [
            "gpu",
            "nvidia.com/",
            "nvidia.com/.shared",
            "nvidia.com/gpu.",
            "/gpu",
            "nvidia.com/a/b",
            "nvidia.com/gpu shared",
        ] {
            assert!(!extended_resource_name_ok(bad), "{bad}");
        }
        let toml = "[sharing.time_slicing]\n[[sharing.time_slicing.resources]]\nname = \"nvidia.com/gpu\"\nreplicas = 2\nrename = \"nvidia.com/gpu.shared\"\n";
        let file: FileConfig = toml::from_str(toml).unwrap();
        Settings::merge(Default::default(), file, "test").expect("NVIDIA's documented rename is accepted");
    }

    use super::*;

    #[test]
    fn flag_or_env_beats_file_which_beats_default() {
        let file: FileConfig = toml::from_str(
            "socket_dir = \"/file/dp\"\nstrategies = [\"envvar\"]\nhealth_interval_ms = 200\ndevice_ids = \"index\"\n",
        )
        .unwrap();
        let o = Overrides {
            strategies: Some(vec!["device-specs".into(), "cdi-cri".into(), "device-specs".into()]),
            ..Default::default()
        };
        let s = Settings::merge(o, file.clone(), "f.toml").unwrap();
        assert_eq!(s.strategies, [Strategy::DeviceSpecs, Strategy::CdiCri]);
        assert_eq!(s.socket_dir, Path::new("/file/dp"));
        assert_eq!(s.kubelet_socket, Path::new("/file/dp/kubelet.sock"));
        assert_eq!(s.health_interval, Duration::from_millis(200));
        assert_eq!(s.device_ids, DeviceIds::Index);
        let s = Settings::merge(Overrides::default(), FileConfig::default(), "f.toml").unwrap();
        assert_eq!(s.strategies, [Strategy::CdiCri]);
        assert_eq!(s.socket_dir, Path::new("/var/lib/kubelet/device-plugins"));
        assert_eq!(s.root, Path::new("/"));
        assert_eq!(s.metrics_address, None);
        assert_eq!(s.spec_dirs, [Path::new("/etc/cdi"), Path::new("/var/run/cdi")]);
        let o = Overrides { spec_dirs: Some(vec!["cdi".into()]), ..Default::default() };
        let err = Settings::merge(o, FileConfig::default(), "f").unwrap_err().to_string();
        assert!(err.contains("spec_dirs = \"cdi\"") && err.contains("absolute"), "{err}");
    }

    #[test]
    fn bad_values_name_origin_key_and_value() {
        let file: FileConfig = toml::from_str("strategies = [\"cdi\"]\n").unwrap();
        let err = Settings::merge(Overrides::default(), file, "/etc/actk/device-plugin.toml").unwrap_err().to_string();
        assert!(err.starts_with("/etc/actk/device-plugin.toml: strategies = \"cdi\":"), "{err}");
        assert!(err.contains("cdi-cri, cdi-annotations, envvar, device-specs, volume-mounts"), "{err}");
        let o = Overrides { metrics_address: Some("9400".into()), ..Default::default() };
        let err = Settings::merge(o, FileConfig::default(), "f").unwrap_err().to_string();
        assert!(err.contains("metrics_address = \"9400\"") && err.contains("host:port"), "{err}");
    }

    #[test]
    fn time_slicing_and_mig_strategy_are_checked() {
        let file: FileConfig = toml::from_str(
            "mig_strategy = \"mixed\"\n[sharing.time_slicing]\nrename_by_default = true\n[[sharing.time_slicing.resources]]\nname = \"nvidia.com/gpu\"\nreplicas = 4\n",
        )
        .unwrap();
        let s = Settings::merge(Overrides::default(), file, "dp.toml").unwrap();
        assert_eq!(s.mig_strategy, MigStrategy::Mixed);
        let t = s.time_slicing.unwrap();
        assert!(t.rename_by_default);
        assert_eq!(
            t.resources,
            [SharedResource { name: "nvidia.com/gpu".into(), replicas: 4, rename: None, devices: None }]
        );
        for (replicas, shown) in [("0", "0"), ("1000000", "1000000"), ("-3", "-3")] {
            let file: FileConfig = toml::from_str(&format!(
                "[[sharing.time_slicing.resources]]\nname = \"amd.com/gpu\"\nreplicas = {replicas}\n"
            ))
            .unwrap();
            let err = Settings::merge(Overrides::default(), file, "dp.toml").unwrap_err().to_string();
            assert!(
                err.starts_with(&format!("dp.toml: sharing.time_slicing.resources[0].replicas = \"{shown}\": 1 to 1024 replicas of each amd.com/gpu device")),
                "{err}"
            );
        }
        let o = Overrides { mig_strategy: Some("mixd".into()), ..Default::default() };
        let err = Settings::merge(o, FileConfig::default(), "f").unwrap_err().to_string();
        assert!(err.contains("mig_strategy = \"mixd\"") && err.contains("none, single or mixed"), "{err}");
    }

    #[test]
    fn nvidia_device_plugin_yaml_is_read() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("config.yaml");
        std::fs::write(
            &p,
            "version: v1\nflags:\n  migStrategy: mixed\n  failOnInitError: true\nsharing:\n  timeSlicing:\n    failRequestsGreaterThanOne: true\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n",
        )
        .unwrap();
        let f = FileConfig::load(&p, true).unwrap();
        let s = Settings::merge(Overrides::default(), f, "config.yaml").unwrap();
        assert_eq!(s.mig_strategy, MigStrategy::Mixed);
        let t = s.time_slicing.unwrap();
        assert!(t.fail_requests_greater_than_one && !t.rename_by_default);
        assert_eq!(t.resources[0].replicas, 4);
        std::fs::write(&p, "version: v2\n").unwrap();
        assert!(FileConfig::load(&p, true).unwrap_err().to_string().contains("version = \"v2\""));
    }

    /// NVIDIA's `devices` lists split a resource (issue 28 item 3); a count, an empty list, an
    /// overlap and a list for MPS are refused naming the key and the fix.
    #[test]
    fn nvidia_device_lists_are_read_and_checked() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("config.yaml");
        let yaml = |entries: &str| format!("version: v1\nsharing:\n  timeSlicing:\n    resources:\n{entries}");
        std::fs::write(
            &p,
            yaml("    - name: nvidia.com/gpu\n      rename: nvidia.com/gpu-light\n      devices: [0, \"GPU-1\"]\n      replicas: 2\n    - name: nvidia.com/gpu\n      rename: nvidia.com/gpu-heavy\n      devices: [\"2\"]\n      replicas: 4\n    - name: amd.com/gpu\n      devices: all\n      replicas: 3\n"),
        )
        .unwrap();
        let s = Settings::merge(Overrides::default(), FileConfig::load(&p, true).unwrap(), "config.yaml").unwrap();
        let r = &s.time_slicing.unwrap().resources;
        assert_eq!(r[0].devices.as_deref(), Some(&["0".to_string(), "GPU-1".to_string()][..]));
        assert_eq!(r[1].devices.as_deref(), Some(&["2".to_string()][..]));
        assert_eq!(r[2].devices, None, "all");
        for (entries, words) in [
            (
                "    - name: nvidia.com/gpu\n      devices: 2\n      replicas: 2\n",
                &["devices = \"2\"", "a device count is not supported"][..],
            ),
            ("    - name: nvidia.com/gpu\n      devices: []\n      replicas: 2\n", &["at least one device"][..]),
            (
                "    - name: nvidia.com/gpu\n      devices: [0]\n      replicas: 2\n    - name: nvidia.com/gpu\n      rename: x.com/y\n      devices: [0]\n      replicas: 2\n",
                &["resources[1].devices = \"0\"", "one entry of nvidia.com/gpu only"][..],
            ),
            (
                "    - name: nvidia.com/gpu\n      replicas: 2\n    - name: nvidia.com/gpu\n      devices: [1]\n      replicas: 2\n",
                &["each resource once, or several entries each with its own devices list"][..],
            ),
        ] {
            std::fs::write(&p, yaml(entries)).unwrap();
            let err = Settings::merge(Overrides::default(), FileConfig::load(&p, true).unwrap(), "config.yaml")
                .unwrap_err()
                .to_string();
            for w in words {
                assert!(err.contains(w), "{entries}: {err}");
            }
        }
        std::fs::write(&p, "version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      devices: [0]\n      replicas: 2\n").unwrap();
        let err =
            Settings::merge(Overrides::default(), FileConfig::load(&p, true).unwrap(), "c").unwrap_err().to_string();
        assert!(err.contains("sharing.mps.resources.devices") && err.contains("every device"), "{err}");
    }

    /// A ConfigMap of NVIDIA's chart mounted as a directory (`config.name`/`config.map`): the
    /// config named by `nvidia_config_name` (`config.default`), else the only one; its MIG
    /// strategy and sharing are the plugin's, and one set in both places is an error.
    #[test]
    fn nvidia_configmap_directory_is_read_by_name_or_alone() {
        let tmp = tempfile::tempdir().unwrap();
        let cm = tmp.path().join("nvidia");
        std::fs::create_dir_all(cm.join("..2026_12_03_10_00_00.1")).unwrap();
        std::fs::write(cm.join("mig-mixed"), "version: v1\nflags:\n  migStrategy: mixed\n").unwrap();
        let toml_path = tmp.path().join("dp.toml");
        let load = |toml: &str| {
            std::fs::write(&toml_path, toml).unwrap();
            FileConfig::load(&toml_path, true).and_then(|f| Settings::merge(Overrides::default(), f, "dp.toml"))
        };
        let dir = format!("nvidia_config = {:?}\n", cm.display().to_string());
        assert_eq!(load(&dir).unwrap().mig_strategy, MigStrategy::Mixed, "the only config");
        std::fs::write(
            cm.join("shared"),
            "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n",
        )
        .unwrap();
        let err = load(&dir).unwrap_err().to_string();
        assert!(err.contains("the ConfigMap has mig-mixed, shared") && err.contains("config.default"), "{err}");
        let s = load(&format!("{dir}nvidia_config_name = \"shared\"\n")).unwrap();
        assert_eq!(s.time_slicing.unwrap().resources[0].replicas, 4);
        assert_eq!(s.mig_strategy, MigStrategy::None);
        let err = load(&format!("{dir}nvidia_config_name = \"gone\"\n")).unwrap_err().to_string();
        assert!(err.contains("a config named \"gone\""), "{err}");
        // MIG strategy in both places, differently: refused naming both.
        let err = load(&format!("{dir}nvidia_config_name = \"mig-mixed\"\nmig_strategy = \"single\"\n"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("mig_strategy") && err.contains("mig-mixed (nvidia_config) sets it too"), "{err}");
        // This file's MPS directories with NVIDIA's MPS resources.
        std::fs::write(
            cm.join("mps"),
            "version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2\n",
        )
        .unwrap();
        let s = load(&format!("{dir}nvidia_config_name = \"mps\"\n[sharing.mps]\npipe_directory = \"/run/mps\"\n"))
            .unwrap();
        let m = s.mps.unwrap();
        assert_eq!((m.pipe_directory.as_path(), m.resources[0].replicas), (Path::new("/run/mps"), 2));
    }

    /// Per-node named configs: the node label's name (load_named) wins over the file's
    /// nvidia_config_name; without either a key `default` is NVIDIA's `named` fallback; an
    /// unknown name is refused listing the configs there are.
    #[test]
    fn node_label_name_chooses_the_config_over_the_default() {
        let tmp = tempfile::tempdir().unwrap();
        let cm = tmp.path().join("nvidia");
        std::fs::create_dir_all(&cm).unwrap();
        std::fs::write(cm.join("default"), "version: v1\n").unwrap();
        std::fs::write(
            cm.join("ts2"),
            "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2\n",
        )
        .unwrap();
        let toml_path = tmp.path().join("dp.toml");
        std::fs::write(&toml_path, format!("nvidia_config = {:?}\n", cm.display().to_string())).unwrap();
        let load = |name: Option<&str>| {
            FileConfig::load_named(&toml_path, true, name).and_then(|f| Settings::merge(Overrides::default(), f, "c"))
        };
        assert!(load(None).unwrap().time_slicing.is_none(), "the key `default`");
        assert_eq!(load(Some("ts2")).unwrap().time_slicing.unwrap().resources[0].replicas, 2);
        let err = load(Some("ts4")).unwrap_err().to_string();
        assert!(err.contains("a config named \"ts4\"") && err.contains("it has default, ts2"), "{err}");
        // The label's name beats the file's.
        std::fs::write(
            &toml_path,
            format!("nvidia_config = {:?}\nnvidia_config_name = \"ts2\"\n", cm.display().to_string()),
        )
        .unwrap();
        assert!(load(None).unwrap().time_slicing.is_some());
        assert!(load(Some("default")).unwrap().time_slicing.is_none());
        // A name with nothing to choose from.
        std::fs::write(&toml_path, "").unwrap();
        let err = load(Some("ts2")).unwrap_err().to_string();
        assert!(err.contains("nvidia_config") && err.contains("config.map"), "{err}");
    }

    #[test]
    fn unknown_file_key_is_named() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("dp.toml");
        std::fs::write(&p, "socket_dir = \"/x\"\nstrategy = [\"envvar\"]\n").unwrap();
        let err = FileConfig::load(&p, true).unwrap_err().to_string();
        assert!(err.contains("dp.toml") && err.contains("strategy"), "{err}");
        assert_eq!(FileConfig::load(&tmp.path().join("absent.toml"), false).unwrap(), FileConfig::default());
        assert!(FileConfig::load(&tmp.path().join("absent.toml"), true).is_err());
    }

    /// The labeller's view of a named config: the one the node's name picks (else the
    /// default key), its MIG strategy, time-slicing replicas and renaming, and its name; a name
    /// the plugin would refuse is refused.
    #[test]
    fn label_options_follow_the_named_config_the_plugin_would_serve() {
        let tmp = tempfile::tempdir().unwrap();
        let cm = tmp.path().join("nvidia");
        std::fs::create_dir_all(&cm).unwrap();
        std::fs::write(cm.join("default"), "version: v1\nflags:\n  migStrategy: single\n").unwrap();
        std::fs::write(
            cm.join("ts4"),
            "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n",
        )
        .unwrap();
        std::fs::write(
            cm.join("ts2-renamed"),
            "version: v1\nsharing:\n  timeSlicing:\n    renameByDefault: true\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2\n",
        )
        .unwrap();
        let toml_path = tmp.path().join("dp.toml");
        std::fs::write(&toml_path, format!("nvidia_config = {:?}\n", cm.display().to_string())).unwrap();
        let d = label_options(&toml_path, None).unwrap();
        assert_eq!((d.config.as_deref(), d.mig_strategy.as_deref()), (Some("default"), Some("single")));
        assert!(d.replicas.is_empty() && d.renamed.is_empty());
        let t = label_options(&toml_path, Some("ts4")).unwrap();
        assert_eq!((t.config.as_deref(), t.mig_strategy.as_deref()), (Some("ts4"), Some("none")));
        assert_eq!(t.replicas.get("nvidia.com/gpu"), Some(&4));
        assert!(t.renamed.is_empty());
        let r = label_options(&toml_path, Some("ts2-renamed")).unwrap();
        assert!(r.renamed.contains("nvidia.com/gpu"), "{r:?}");
        let err = label_options(&toml_path, Some("gone")).unwrap_err().to_string();
        assert!(err.contains("a config named \"gone\""), "{err}");
        // Without named configs: the file's own strategy and sharing, no name.
        std::fs::write(&toml_path, "mig_strategy = \"mixed\"\n").unwrap();
        let p = label_options(&toml_path, None).unwrap();
        assert_eq!((p.config, p.mig_strategy.as_deref()), (None, Some("mixed")));
    }
}
