//! actk configuration files for one test ([`ActkConfig`]) and the machine's global ones
//! (/etc/actk/config.toml, restored afterwards).

use super::*;
use anyhow::{Context, Result};
use serde_json::Value;
use std::ffi::OsStr;
use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// An actk config file (TOML, read through `ACTK_CONFIG`) for one test, with the keys the
/// runtime shim knows (actk_core::config): `root` (host root, a fixture), `runtimes`,
/// `spec_dirs`, `hooks_dirs`, `profiles_dir`.
///
/// `spec_dirs`, `hooks_dirs` and `profiles_dir` default to empty private directories, so a test
/// never sees the machine's /etc/cdi, /var/run/cdi, hooks.d or profiles.d files.
pub struct ActkConfig {
    dir: tempfile::TempDir,
    /// Host root that discovery scans.
    pub root: PathBuf,
    /// Low-level runtimes, first found wins (`["runc"]`).
    pub runtimes: Vec<String>,
    /// Directories with CDI specs.
    pub spec_dirs: Vec<PathBuf>,
    /// Directories with oci-hooks(5) JSON files.
    pub hooks_dirs: Vec<PathBuf>,
    /// Directory of user vendor profiles.
    pub profiles_dir: PathBuf,
    /// Extra TOML lines appended verbatim (for tests of bad config files).
    pub extra: String,
}

impl ActkConfig {
    /// A config with `root`, `runtimes = ["runc"]`, and empty private spec and hooks dirs
    /// (`<dir>/cdi`, `<dir>/hooks.d`).
    pub fn new(root: &Path) -> Result<ActkConfig> {
        let dir = tempfile::Builder::new().prefix("actk-config-").tempdir()?;
        let cdi = dir.path().join("cdi");
        let hooks = dir.path().join("hooks.d");
        fs::create_dir_all(&cdi)?;
        fs::create_dir_all(&hooks)?;
        let profiles = dir.path().join("profiles.d");
        fs::create_dir_all(&profiles)?;
        Ok(ActkConfig {
            dir,
            root: root.to_path_buf(),
            runtimes: vec!["runc".into()],
            spec_dirs: vec![cdi],
            hooks_dirs: vec![hooks],
            profiles_dir: profiles,
            extra: String::new(),
        })
    }

    /// The private directory of this config (holds `cdi/`, `hooks.d/`, `config.toml`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The first spec dir (where a test drops CDI specs).
    pub fn spec_dir(&self) -> &Path {
        &self.spec_dirs[0]
    }

    /// The first hooks dir (where a test drops hooks.d files).
    pub fn hooks_dir(&self) -> &Path {
        &self.hooks_dirs[0]
    }

    /// The TOML text of this config.
    pub fn toml(&self) -> String {
        fn s(p: impl AsRef<OsStr>) -> String {
            // A JSON string is a valid TOML basic string for these paths.
            Value::from(p.as_ref().to_string_lossy().into_owned()).to_string()
        }
        fn list<T: AsRef<OsStr>>(v: &[T]) -> String {
            format!("[{}]", v.iter().map(s).collect::<Vec<_>>().join(", "))
        }
        format!(
            "root = {}\nprofiles_dir = {}\nruntimes = {}\nspec_dirs = {}\nhooks_dirs = {}\n{}",
            s(&self.root),
            s(&self.profiles_dir),
            list(&self.runtimes),
            list(&self.spec_dirs),
            list(&self.hooks_dirs),
            self.extra
        )
    }

    /// Write `<dir>/config.toml` and return its path.
    pub fn write(&self) -> Result<PathBuf> {
        let p = self.dir.path().join("config.toml");
        fs::write(&p, self.toml())?;
        Ok(p)
    }

    /// Write an executable wrapper `<dir>/actk-runtime` that runs the built actk-runtime with
    /// `ACTK_CONFIG` set to this config. Engines (dockerd via containerd's shim, podman via conmon)
    /// start the runtime with their own environment, so a per-test config travels this way.
    pub fn write_wrapper(&self) -> Result<PathBuf> {
        let cfg = self.write()?;
        let p = self.dir.path().join("actk-runtime");
        let mut f = fs::File::create(&p)?;
        writeln!(f, "#!/bin/sh")?;
        writeln!(f, "# Test wrapper: actk-runtime with this test's config.")?;
        writeln!(f, "ACTK_CONFIG='{}' exec '{}' \"$@\"", cfg.display(), bin("actk-runtime").display())?;
        drop(f);
        fs::set_permissions(&p, fs::Permissions::from_mode(0o755))?;
        Ok(p)
    }
}

/// Saves a global file's content (or its absence) and puts it back on drop: for tests that edit
/// /etc/docker/daemon.json or /etc/actk/config.toml.
pub struct FileRestore {
    path: PathBuf,
    saved: Option<Vec<u8>>,
}

impl FileRestore {
    /// Remember `path`'s current content.
    pub fn save(path: &Path) -> FileRestore {
        FileRestore { path: path.to_path_buf(), saved: fs::read(path).ok() }
    }
}

impl Drop for FileRestore {
    fn drop(&mut self) {
        let r = match &self.saved {
            Some(bytes) => fs::write(&self.path, bytes),
            None => match fs::remove_file(&self.path) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                r => r,
            },
        };
        if let Err(e) = r {
            eprintln!("warning: could not restore {}: {e}", self.path.display());
        }
    }
}

/// Path of actk's global configuration file, read by every actk binary when `ACTK_CONFIG` is
/// not set and no `actk.toml` is beside it (dockerd's `--gpus` hook and `--runtime actk`
/// registered without a wrapper read it).
pub const GLOBAL_CONFIG: &str = "/etc/actk/config.toml";

/// Run `f` with `config`'s TOML installed as /etc/actk/config.toml, holding a lock that
/// serialises all tests touching that file, and put the previous file (or its absence) back
/// afterwards, also when `f` fails or panics.
pub fn with_global_actk_config<T>(config: &ActkConfig, f: impl FnOnce() -> Result<T>) -> Result<T> {
    with_lock_at(Path::new("/run/lock/actk-e2e-global-config.lock"), || {
        fs::create_dir_all("/etc/actk")?;
        let _restore = FileRestore::save(Path::new(GLOBAL_CONFIG));
        fs::write(GLOBAL_CONFIG, config.toml()).with_context(|| format!("writing {GLOBAL_CONFIG}"))?;
        f()
    })
}
