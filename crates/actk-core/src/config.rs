//! The actk configuration file, `/etc/actk/config.toml`; `actk.toml` next to the executable
//! takes its place in an installation that keeps binaries and config together (`actk node
//! setup`), and `ACTK_CONFIG` overrides both ([`Config::path`]).
//!
//! Shape (TOML, every key optional; a missing file means all defaults):
//!
//! ```toml
//! runtimes = ["runc", "crun"]          # low-level OCI runtimes: bare names searched on PATH, or absolute paths
//! spec_dirs = ["/etc/cdi", "/var/run/cdi"]   # CDI spec directories, later ones win on the same device
//! hooks_dirs = ["/usr/share/containers/oci/hooks.d", "/etc/containers/oci/hooks.d", "/etc/actk/hooks.d"]
//! root = "/"                           # host root that discovery reads (a driver container: /run/nvidia/driver)
//! driver_root = "/run/nvidia/driver"   # unset: root; where the driver's libraries are when not in root
//! profiles_dir = "/etc/actk/profiles.d"
//! log_file = "/var/log/actk-runtime.log"   # unset: no log file (actk-runtime and actk-hook say only errors, on stderr)
//! log_level = "info"
//! hook_path = "/usr/bin/actk-hook"     # unset: the actk-hook next to actk-runtime
//! [nvidia]
//! default_capabilities = ["utility", "compute"]
//! [policy]                             # who may ask for devices (crate::policy); defaults: docker/podman hosts
//! env_requests = "always"              # selection variables and capabilities that add nodes: "always", "privileged" or "never"
//! annotation_requests = "always"       # cdi.k8s.io/* annotations: the same values
//! mount_requests = "always"            # the device list (/dev/null mounts under /var/run/actk/devices)
//! on_refused = "fail"                  # a refused request fails the container ("fail") or is dropped with a warning ("warn")
//! privileged_means = "cap-sys-admin"   # "privileged": CAP_SYS_ADMIN, or "privileged-flag" (privileged: true only)
//! ```
//!
//! Unknown keys are errors (`deny_unknown_fields`): a typo must not silently fall back to a
//! default. The error names the file, the line and column, and the key.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Default location of the configuration file.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/actk/config.toml";
/// Environment variable that overrides [`DEFAULT_CONFIG_PATH`] and [`INSTALLED_CONFIG_NAME`].
pub const CONFIG_ENV: &str = "ACTK_CONFIG";
/// File name of the config of an installation that keeps it beside its binaries:
/// `INSTALL_DIR/actk.toml` for `INSTALL_DIR/actk-runtime` (what `actk node setup` writes).
pub const INSTALLED_CONFIG_NAME: &str = "actk.toml";

/// The effective configuration. [`Config::default`] is what a missing file means.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Low-level OCI runtimes in order of preference; the first one found is exec'd by
    /// actk-runtime. A bare name is searched on `PATH`; a name with a `/` is used as is.
    pub runtimes: Vec<String>,
    /// CDI spec directories (CDI SPEC.md: /etc/cdi, then /var/run/cdi, which has priority).
    pub spec_dirs: Vec<PathBuf>,
    /// oci-hooks(5) directories in increasing precedence: a file name in a later directory masks
    /// the same name in an earlier one.
    pub hooks_dirs: Vec<PathBuf>,
    /// Host root for discovery (`/`; a fixture or a driver container's root otherwise): the
    /// device root, where /dev, /proc and /sys are read.
    pub root: PathBuf,
    /// Where the driver's files (ld.so.cache, libraries, tools, firmware) are read, when not in
    /// `root`: the driver container's root on a GPU Operator node (`/run/nvidia/driver`) while the
    /// devices are the host's. `None`: `root`.
    pub driver_root: Option<PathBuf>,
    /// Directory of user vendor profiles (`*.toml`).
    pub profiles_dir: PathBuf,
    /// File actk-runtime, actk-hook and actk-nri append their log to (warnings and what they
    /// served: a hook's stderr is discarded by runc when the hook succeeds, so this is where a
    /// warning of `docker run --gpus` is found); `None`: no log file.
    pub log_file: Option<PathBuf>,
    /// tracing level filter (`error`, `warn`, `info`, `debug`, `trace`).
    pub log_level: String,
    /// actk-hook executable, used for the ld.so.cache refresh hook of generated edits;
    /// `None`: the `actk-hook` next to actk-runtime, else none (then no refresh).
    pub hook_path: Option<PathBuf>,
    /// NVIDIA-specific settings.
    pub nvidia: VendorConfig,
    /// The node's trust policy: which inputs may ask for devices ([`crate::policy`]).
    pub policy: crate::policy::Policy,
}

/// Per-vendor settings.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct VendorConfig {
    /// Driver capabilities used when the container does not set the capabilities variable;
    /// `None`: the profile's default (`utility`, `compute` for NVIDIA).
    pub default_capabilities: Option<Vec<String>>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            runtimes: vec!["runc".into(), "crun".into()],
            spec_dirs: vec!["/etc/cdi".into(), "/var/run/cdi".into()],
            hooks_dirs: vec![
                "/usr/share/containers/oci/hooks.d".into(),
                "/etc/containers/oci/hooks.d".into(),
                "/etc/actk/hooks.d".into(),
            ],
            root: "/".into(),
            driver_root: None,
            profiles_dir: "/etc/actk/profiles.d".into(),
            log_file: None,
            log_level: "info".into(),
            hook_path: None,
            nvidia: VendorConfig::default(),
            policy: crate::policy::Policy::default(),
        }
    }
}

/// Errors reading the configuration file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file exists but cannot be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file is not valid TOML or has an unknown key or a wrong type. `message` comes from
    /// the TOML parser and names the line, column and key.
    #[error("config file {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// Parser message (line, column, offending key, expected keys).
        message: String,
    },
    /// `$ACTK_CONFIG` names a file that does not exist. Only the default path may be absent:
    /// an explicit path that is missing is a typo, and silently using the defaults (root `/`)
    /// would inject the real host's devices instead of the ones the user configured.
    #[error("{CONFIG_ENV}={path}: no such file; create it (`actk config default > {path}`) or unset {CONFIG_ENV}")]
    Missing {
        /// The file named by the variable.
        path: PathBuf,
    },
    /// The installation's config beside the executable ([`INSTALLED_CONFIG_NAME`]) was there
    /// when it was looked for and is gone when read: the installation is being removed (`actk
    /// node teardown`). Its policy must not silently become /etc/actk's or the defaults.
    #[error(
        "{path}: the config of this installation is gone (removed while this process started: `actk node teardown`?); install it again with `actk node setup`"
    )]
    InstalledMissing {
        /// The installed config file.
        path: PathBuf,
    },
}

impl Config {
    /// The config path, the first of:
    /// 1. `$ACTK_CONFIG` when set and non-empty;
    /// 2. [`INSTALLED_CONFIG_NAME`] in the directory of the running executable, when that file
    ///    exists: an installation that keeps its binaries and config together, as `actk node
    ///    setup` writes one on a Kubernetes node. An engine runs actk-runtime with the engine's
    ///    environment (containerd's runc shim cannot add a variable), so this is how the
    ///    installed runtime finds its config without a `/bin/sh` wrapper, which would cost one
    ///    more exec per call, four per container (issue 14). The directory comes from
    ///    `/proc/self/exe`, which the caller does not control; a binary replaced while it runs
    ///    (`path (deleted)`) still has the same directory;
    /// 3. [`DEFAULT_CONFIG_PATH`].
    ///
    /// Looked up once per process (the loaders and the planner's policy origin all ask).
    pub fn path() -> PathBuf {
        located().path.clone()
    }

    /// Loads the file named by [`Config::path`]. Errors as [`Config::load`], plus
    /// [`ConfigError::Missing`] when `$ACTK_CONFIG` names no file and
    /// [`ConfigError::InstalledMissing`] when the installation's config went away after it was
    /// found (only an absent default file gives the defaults).
    pub fn load_default() -> Result<Config, ConfigError> {
        let l = located();
        match crate::rawfile::read_to_string(&l.path) {
            Ok(text) => Config::parse(&text, &l.path),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => l.absent(),
            Err(source) => Err(ConfigError::Read { path: l.path.clone(), source }),
        }
    }

    /// Only `runtimes` of the file named by [`Config::path`], for actk-runtime's calls
    /// other than `create` and `run`, which exec the low-level runtime at once and need nothing
    /// else (issue 14: no config parse before that exec). The TOML parser is skipped when the
    /// file does not mention `runtimes` (the defaults then) or sets it on one top-level line in
    /// the plain form `runtimes = ["a", "b"]` (what `actk config default` writes); any other
    /// form is parsed in full, with [`Config::load`]'s errors. Other keys are not checked here:
    /// a mistake in them fails the next `create`, not the `delete` of a running container.
    /// Errors: [`ConfigError::Missing`], [`ConfigError::Read`], and parse errors of the full path.
    pub fn load_runtimes() -> Result<Vec<String>, ConfigError> {
        let l = located();
        let text = match crate::rawfile::read_to_string(&l.path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return l.absent().map(|c| c.runtimes),
            Err(source) => return Err(ConfigError::Read { path: l.path.clone(), source }),
        };
        match plain_runtimes(&text) {
            Some(r) => Ok(r),
            None => Ok(Config::parse(&text, &l.path)?.runtimes),
        }
    }

    /// Loads `path`; a missing file gives [`Config::default`]. Errors: unreadable file,
    /// invalid TOML, unknown key, wrong type (each naming `path`, line and column).
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        match crate::rawfile::read_to_string(path) {
            Ok(text) => Config::parse(&text, path),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Config::default()),
            Err(source) => Err(ConfigError::Read { path: path.to_owned(), source }),
        }
    }

    /// Parses TOML text; `path` is only used in error messages. Errors also for a relative
    /// `root` or `driver_root` (relative to what? the runtime's working directory is the bundle).
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        let c: Config = toml::from_str(text)
            .map_err(|e| ConfigError::Parse { path: path.to_owned(), message: e.to_string().trim_end().to_string() })?;
        for (key, p) in [("root", Some(&c.root)), ("driver_root", c.driver_root.as_ref())] {
            if let Some(p) = p.filter(|p| !p.is_absolute()) {
                return Err(ConfigError::Parse {
                    path: path.to_owned(),
                    message: format!("{key} = {:?}: must be an absolute path", p.display().to_string()),
                });
            }
        }
        Ok(c)
    }

    /// The driver root: `driver_root`, else `root`.
    pub fn driver_root(&self) -> &Path {
        self.driver_root.as_deref().unwrap_or(&self.root)
    }

    /// The effective configuration as TOML (`actk config show`).
    pub fn to_toml(&self) -> String {
        // Serialising plain strings, paths and lists cannot fail; fall back to Debug form rather
        // than panic if a future field ever makes it fail.
        toml::to_string(self).unwrap_or_else(|e| format!("# cannot render config as TOML: {e}\n# {self:?}\n"))
    }
}

/// Where the config of this process is ([`Config::path`]) and what its absence means.
#[derive(Debug, Clone, PartialEq)]
struct Located {
    path: PathBuf,
    source: Source,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Source {
    /// `$ACTK_CONFIG`: must exist.
    Env,
    /// [`INSTALLED_CONFIG_NAME`] beside the executable: existed when looked for, so must exist.
    Installed,
    /// [`DEFAULT_CONFIG_PATH`]: absent means the defaults.
    Default,
}

impl Located {
    /// What reading a file that is not there gives.
    fn absent(&self) -> Result<Config, ConfigError> {
        match self.source {
            Source::Env => Err(ConfigError::Missing { path: self.path.clone() }),
            Source::Installed => Err(ConfigError::InstalledMissing { path: self.path.clone() }),
            Source::Default => Ok(Config::default()),
        }
    }
}

/// This process's [`Located`], looked up once: `$ACTK_CONFIG`, then the running executable's
/// directory (one readlink of `/proc/self/exe` and one stat).
fn located() -> &'static Located {
    static LOCATED: std::sync::OnceLock<Located> = std::sync::OnceLock::new();
    LOCATED.get_or_init(|| locate(std::env::var_os(CONFIG_ENV), || std::env::current_exe().ok()))
}

/// [`Config::path`]'s rule for the variable's value `env` and the executable `exe` (asked
/// only when the variable is unset or empty).
fn locate(env: Option<std::ffi::OsString>, exe: impl FnOnce() -> Option<PathBuf>) -> Located {
    if let Some(p) = env.filter(|p| !p.is_empty()) {
        return Located { path: PathBuf::from(p), source: Source::Env };
    }
    if let Some(dir) = exe().as_deref().and_then(Path::parent) {
        let p = dir.join(INSTALLED_CONFIG_NAME);
        if p.is_file() {
            return Located { path: p, source: Source::Installed };
        }
    }
    Located { path: PathBuf::from(DEFAULT_CONFIG_PATH), source: Source::Default }
}

/// `runtimes` read without the TOML parser when that is certain to give the parser's answer:
/// `Some(defaults)` when the text does not contain `runtimes` at all, `Some(list)` for one
/// top-level line `runtimes = ["a", "b"]` (strings without escapes, optional trailing comma and
/// comment), `None` (parse in full) for anything else.
fn plain_runtimes(text: &str) -> Option<Vec<String>> {
    if !text.contains("runtimes") {
        return Some(Config::default().runtimes);
    }
    if text.contains("\"\"\"") || text.contains("'''") {
        return None; // a multi-line string could hold a line that looks like the key
    }
    let mut found = None;
    for line in text.lines() {
        let l = line.trim_start();
        if l.starts_with('[') {
            break;
        }
        let Some(rest) = l.strip_prefix("runtimes") else { continue };
        if found.is_some() {
            return None; // twice: the parser's error
        }
        let rest = rest.trim_start().strip_prefix('=')?.trim_start().strip_prefix('[')?;
        let (items, after) = rest.split_once(']')?;
        let after = after.trim();
        if !(after.is_empty() || after.starts_with('#')) {
            return None;
        }
        let mut list = Vec::new();
        let parts: Vec<&str> = items.split(',').map(str::trim).collect();
        for (i, part) in parts.iter().enumerate() {
            if part.is_empty() && i + 1 == parts.len() && i > 0 {
                continue; // trailing comma
            }
            let s = part.strip_prefix('"')?.strip_suffix('"')?;
            if s.contains(['"', '\\']) || s.chars().any(char::is_control) {
                return None;
            }
            list.push(s.to_string());
        }
        if items.trim().is_empty() {
            list.clear();
        }
        found = Some(list);
    }
    found
}

/// The commented default configuration (`actk config default`); parses to [`Config::default`].
pub fn default_toml() -> String {
    let d = Config::default();
    let list = |v: &[String]| v.iter().map(|s| format!("{s:?}")).collect::<Vec<_>>().join(", ");
    let paths =
        |v: &[PathBuf]| v.iter().map(|p| format!("{:?}", p.display().to_string())).collect::<Vec<_>>().join(", ");
    format!(
        r#"# actk configuration (/etc/actk/config.toml; another path with ACTK_CONFIG=FILE).
# Every key is optional; the values below are the defaults. Unknown keys are errors.

# Low-level OCI runtimes actk-runtime passes containers on to, first found wins.
# A bare name is searched on PATH; an absolute path is used as is.
runtimes = [{runtimes}]

# CDI spec directories (CDI SPEC.md); a device defined in a later directory wins.
spec_dirs = [{spec_dirs}]

# oci-hooks(5) directories; a file in a later directory masks the same file name in an earlier one.
hooks_dirs = [{hooks_dirs}]

# Host root that discovery reads: "/" on a node, the driver root when the driver runs in a
# container (e.g. "/run/nvidia/driver").
root = {root:?}

# Where the driver's files (ld.so.cache, libraries, tools, firmware) are, when apart from the
# devices in `root`: the GPU Operator's driver container root, with root = "/" (unset: root).
# driver_root = "/run/nvidia/driver"

# Directory of user vendor profiles (*.toml); a profile named like a built-in replaces it.
profiles_dir = {profiles_dir:?}

# File actk-runtime, actk-hook and actk-nri append their log to: warnings and what they served
# (unset: no log file; errors still go to stderr).
# log_file = "/var/log/actk-runtime.log"

# Log level: error, warn, info, debug or trace.
log_level = {log_level:?}

# actk-hook, run as a createContainer hook to add the mounted driver libraries to the
# container's ld.so.cache (unset: the actk-hook next to actk-runtime).
# hook_path = "/usr/bin/actk-hook"

[nvidia]
# Driver capabilities when a container does not set NVIDIA_DRIVER_CAPABILITIES
# (unset: the profile's default, utility and compute).
# default_capabilities = ["utility", "compute"]

[policy]
# Who may ask for devices (see SECURITY.md). Each input is trusted "always", only for
# "privileged" containers (privileged_means below), or "never". The defaults suit docker and
# podman hosts, where whoever runs the container is the authority. A Kubernetes node sets
# env_requests and annotation_requests to "privileged", on_refused to "warn" and
# privileged_means to "privileged-flag", and lets the device plugin's volume-mounts strategy
# (the device list) say what a container gets.
# Selection variables in the container's env (NVIDIA_VISIBLE_DEVICES, ..., docker run --gpus),
# NVIDIA_MIG_*_DEVICES, and capabilities that add device nodes (NVIDIA_DRIVER_CAPABILITIES=fabric):
env_requests = {env:?}
# cdi.k8s.io/* annotations:
annotation_requests = {annotations:?}
# The device list: /dev/null bind mounts at /var/run/actk/devices/<vendor>/<class>/<device>:
mount_requests = {mounts:?}
# A refused request fails the container ("fail") or is dropped with a warning ("warn"):
on_refused = {on_refused:?}
# Which containers "privileged" trusts: "cap-sys-admin" (CAP_SYS_ADMIN in the bounding set, as
# the NVIDIA Container Toolkit decides it) or "privileged-flag" (CAP_SYS_ADMIN and a device
# cgroup that allows every device: only privileged: true / --privileged, not capabilities.add):
privileged_means = {privileged_means:?}
"#,
        runtimes = list(&d.runtimes),
        spec_dirs = paths(&d.spec_dirs),
        hooks_dirs = paths(&d.hooks_dirs),
        root = d.root.display().to_string(),
        profiles_dir = d.profiles_dir.display().to_string(),
        log_level = d.log_level,
        env = d.policy.env_requests.as_str(),
        annotations = d.policy.annotation_requests.as_str(),
        mounts = d.policy.mount_requests.as_str(),
        on_refused = d.policy.on_refused.as_str(),
        privileged_means = d.policy.privileged_means.as_str(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_toml_parses_back_to_defaults() {
        let parsed = Config::parse(&default_toml(), Path::new("default")).unwrap();
        assert_eq!(parsed, Config::default());
    }

    #[test]
    fn show_output_parses_back() {
        let c = Config {
            log_file: Some("/var/log/a.log".into()),
            nvidia: VendorConfig { default_capabilities: Some(vec!["all".into()]) },
            ..Config::default()
        };
        assert_eq!(Config::parse(&c.to_toml(), Path::new("x")).unwrap(), c);
    }

    /// The config is `$ACTK_CONFIG`, else the installation's `actk.toml` beside the executable
    /// (also after the executable was replaced while running: `/proc/self/exe` then ends in
    /// ` (deleted)`), else the default path; a directory named actk.toml is not a config.
    /// An installed config that is gone when read is an error, never the defaults.
    #[test]
    fn installed_config_is_the_one_beside_the_executable() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let default = Located { path: DEFAULT_CONFIG_PATH.into(), source: Source::Default };
        assert_eq!(locate(None, || Some(d.join("actk-runtime"))), default);
        assert_eq!(locate(Some("".into()), || None), default);
        std::fs::create_dir(d.join(INSTALLED_CONFIG_NAME)).unwrap();
        assert_eq!(locate(None, || Some(d.join("actk-runtime"))), default, "a directory is not a config");
        let sub = d.join("sub");
        std::fs::create_dir(&sub).unwrap();
        std::fs::write(sub.join(INSTALLED_CONFIG_NAME), "root = \"/x\"\n").unwrap();
        let installed = Located { path: sub.join(INSTALLED_CONFIG_NAME), source: Source::Installed };
        assert_eq!(locate(None, || Some(sub.join("actk-runtime"))), installed);
        assert_eq!(locate(None, || Some(sub.join("actk-runtime (deleted)"))), installed);
        let env = locate(Some("/etc/other.toml".into()), || panic!("the executable is not asked for"));
        assert_eq!(env, Located { path: "/etc/other.toml".into(), source: Source::Env });

        assert_eq!(default.absent().unwrap(), Config::default());
        assert!(matches!(env.absent(), Err(ConfigError::Missing { .. })));
        std::fs::remove_file(sub.join(INSTALLED_CONFIG_NAME)).unwrap();
        let err = installed.absent().unwrap_err();
        assert!(matches!(err, ConfigError::InstalledMissing { .. }), "{err}");
        assert!(err.to_string().contains("actk node setup"), "{err}");
    }

    #[test]
    fn missing_file_gives_defaults() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(Config::load(&dir.path().join("nope.toml")).unwrap(), Config::default());
    }

    #[test]
    fn partial_file_keeps_other_defaults() {
        let c = Config::parse(
            "runtimes = [\"/usr/bin/crun\"]\n[nvidia]\ndefault_capabilities = [\"all\"]\n",
            Path::new("c"),
        )
        .unwrap();
        assert_eq!(c.runtimes, vec!["/usr/bin/crun"]);
        assert_eq!(c.spec_dirs, Config::default().spec_dirs);
        assert_eq!(c.nvidia.default_capabilities, Some(vec!["all".to_string()]));
    }

    #[test]
    fn unknown_key_is_named_with_file_and_line() {
        let text = "root = \"/\"\nruntime = [\"runc\"]\n";
        let err = Config::parse(text, Path::new("/etc/actk/config.toml")).unwrap_err().to_string();
        assert!(err.contains("/etc/actk/config.toml"), "{err}");
        assert!(err.contains("line 2"), "{err}");
        assert!(err.contains("`runtime`"), "{err}");
    }

    #[test]
    fn unknown_key_in_section_is_named() {
        let err = Config::parse("[nvidia]\ndefault_caps = []\n", Path::new("c.toml")).unwrap_err().to_string();
        assert!(err.contains("default_caps") && err.contains("line 2"), "{err}");
    }

    /// Issue 13 items 3 and 4: driver_root apart from root; relative roots are refused naming the key.
    #[test]
    fn item3_driver_root_and_relative_roots() {
        let c = Config::parse("root = \"/\"\ndriver_root = \"/run/nvidia/driver\"\n", Path::new("c.toml")).unwrap();
        assert_eq!(c.driver_root(), Path::new("/run/nvidia/driver"));
        assert_eq!(Config::default().driver_root(), Path::new("/"));
        let e = Config::parse("root = \"fixture\"\n", Path::new("c.toml")).unwrap_err().to_string();
        assert_eq!(e, "config file c.toml: root = \"fixture\": must be an absolute path");
        let e = Config::parse("driver_root = \"d\"\n", Path::new("c.toml")).unwrap_err().to_string();
        assert!(e.contains("driver_root = \"d\""), "{e}");
    }

    #[test]
    fn policy_section_parses_and_bad_values_are_named() {
        use crate::policy::{OnRefused, Trust};
        let c = Config::parse(
            "[policy]\nenv_requests = \"privileged\"\nannotation_requests = \"never\"\non_refused = \"warn\"\n",
            Path::new("c.toml"),
        )
        .unwrap();
        assert_eq!(c.policy.env_requests, Trust::Privileged);
        assert_eq!(c.policy.annotation_requests, Trust::Never);
        assert_eq!(c.policy.mount_requests, Trust::Always);
        assert_eq!(c.policy.on_refused, OnRefused::Warn);
        assert_eq!(c.policy.privileged_means, crate::policy::PrivilegedMeans::CapSysAdmin);
        let c = Config::parse("[policy]\nprivileged_means = \"privileged-flag\"\n", Path::new("c.toml")).unwrap();
        assert_eq!(c.policy.privileged_means, crate::policy::PrivilegedMeans::PrivilegedFlag);
        let err = Config::parse("[policy]\nprivileged_means = \"sys-admin\"\n", Path::new("c.toml")).unwrap_err();
        assert!(err.to_string().contains("privileged_means") || err.to_string().contains("cap-sys-admin"), "{err}");
        let err = Config::parse("[policy]\nenv_requests = \"sometimes\"\n", Path::new("c.toml")).unwrap_err();
        let err = err.to_string();
        assert!(err.contains("c.toml") && err.contains("line 2") && err.contains("sometimes"), "{err}");
        assert!(err.contains("always") && err.contains("privileged") && err.contains("never"), "{err}");
        let err = Config::parse("[policy]\nenv = \"never\"\n", Path::new("c.toml")).unwrap_err().to_string();
        assert!(err.contains("`env`") && err.contains("env_requests"), "{err}");
    }

    #[test]
    fn runtimes_without_the_parser_agree_with_the_parser() {
        let cases = [
            "",
            "root = \"/\"\n",
            "runtimes = [\"runc\"]\n",
            "# c\nruntimes = [ \"/usr/bin/crun\" , \"runc\", ] # fallback\nroot = \"/x\"\n[nvidia]\n",
            "runtimes = []\n",
            "runtimes=[\"a b\"]\n",
            &default_toml(),
            // Forms only the parser reads: every one must give the parser's answer or error.
            "runtimes = [\n  \"runc\",\n]\n",
            "runtimes = ['runc']\n",
            "runtimes = [\"r\\u0075nc\"]\n",
            "\"runtimes\" = [\"x\"]\n",
            "runtimes = [\"a\"]\nruntimes = [\"b\"]\n",
            "runtimes = [\"a\"] x\n",
            "[nvidia]\nruntimes = [\"x\"]\n",
            "# runtimes are the default\n",
            "root = \"\"\"\nruntimes = [\"x\"]\n\"\"\"\n",
        ];
        for text in cases {
            let parsed = Config::parse(text, Path::new("c")).map(|c| c.runtimes).ok();
            if let Some(fast) = plain_runtimes(text) {
                assert_eq!(Some(fast), parsed, "fast path disagrees on {text:?}");
            }
        }
        assert_eq!(plain_runtimes("runtimes = [\"/usr/bin/crun\", \"runc\",]\n").unwrap(), ["/usr/bin/crun", "runc"]);
        assert!(plain_runtimes("runtimes = [\n\"runc\"]\n").is_none(), "multi-line goes to the parser");
    }

    #[test]
    fn wrong_type_is_an_error() {
        let err = Config::parse("runtimes = \"runc\"\n", Path::new("c.toml")).unwrap_err().to_string();
        assert!(err.contains("c.toml") && err.contains("line 1"), "{err}");
    }
}
