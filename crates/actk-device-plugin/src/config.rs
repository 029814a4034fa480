//! Configuration of the device plugin: a TOML file, environment variables and flags, in that
//! order of increasing precedence (flag > env > file > built-in default).
//!
//! The file (default [`DEFAULT_CONFIG`], or `--config` / `ACTK_DEVICE_PLUGIN_CONFIG`) has the
//! keys of [`FileConfig`]; a missing default file is not an error, a missing named file is.
//! Flags and their environment variables are declared in the binary (clap, `env` feature);
//! [`Settings::merge`] takes the value given on the command line or in the environment first,
//! then the file's, then the default.

use crate::allocate::Strategy;
use crate::resources::DeviceIds;
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
    /// Read `path`. With `required == false` a missing file gives the empty config.
    pub fn load(path: &Path, required: bool) -> Result<FileConfig, ConfigError> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if !required && e.kind() == std::io::ErrorKind::NotFound => return Ok(FileConfig::default()),
            Err(source) => return Err(ConfigError::Read { path: path.to_path_buf(), source }),
        };
        toml::from_str(&text)
            .map_err(|e| ConfigError::Parse { path: path.to_path_buf(), message: e.to_string().trim().to_string() })
    }
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
        Ok(Settings {
            spec_dirs,
            root: o.root.or(f.root).unwrap_or_else(|| PathBuf::from("/")),
            host_mount: o.host_mount.or(f.host_mount).unwrap_or_else(|| PathBuf::from("/")),
            profiles_dir: o.profiles_dir.or(f.profiles_dir),
            socket_dir,
            kubelet_socket,
            strategies: parsed,
            resources: o.resources.or(f.resources),
            device_ids,
            capabilities: o.capabilities.or(f.capabilities),
            health_interval: Duration::from_millis(interval),
            metrics_address,
            strict_topology: o.strict_topology.or(f.strict_topology).unwrap_or(false),
        })
    }
}

#[cfg(test)]
mod tests {
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
    fn unknown_file_key_is_named() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("dp.toml");
        std::fs::write(&p, "socket_dir = \"/x\"\nstrategy = [\"envvar\"]\n").unwrap();
        let err = FileConfig::load(&p, true).unwrap_err().to_string();
        assert!(err.contains("dp.toml") && err.contains("strategy"), "{err}");
        assert_eq!(FileConfig::load(&tmp.path().join("absent.toml"), false).unwrap(), FileConfig::default());
        assert!(FileConfig::load(&tmp.path().join("absent.toml"), true).is_err());
    }
}
