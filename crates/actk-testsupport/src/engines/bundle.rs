//! OCI bundles for runc and actk-runtime: `runc spec`, edited, over a private copy of the busybox rootfs.

use super::*;
use anyhow::{Context, Result, bail};
use serde_json::Value;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// An OCI bundle in a temporary directory: `config.json` from `runc spec`, and `rootfs/`, a
/// private copy of a rootfs (runc creates mount points in it, so bundles never share one).
///
/// The config is edited to what a test needs: `process.args`, `process.env` (PATH plus the
/// given entries), `process.terminal = false`, `root.path = "rootfs"` (a real directory, as runc
/// requires) and `root.readonly = false`, like Docker's.
pub struct Bundle {
    dir: tempfile::TempDir,
}

impl Bundle {
    /// A bundle over the busybox rootfs running `args` with `env` (`KEY=VALUE` entries).
    pub fn busybox(args: &[&str], env: &[&str]) -> Result<Bundle> {
        Self::new(&busybox_rootfs()?, args, env)
    }

    /// A bundle over the glibc rootfs (see [`glibc_rootfs`]).
    pub fn glibc(args: &[&str], env: &[&str]) -> Result<Bundle> {
        Self::new(&glibc_rootfs()?, args, env)
    }

    /// A bundle over a copy of `rootfs`.
    pub fn new(rootfs: &Path, args: &[&str], env: &[&str]) -> Result<Bundle> {
        let dir = tempfile::Builder::new().prefix("actk-bundle-").tempdir()?;
        let o =
            Command::new("runc").args(["spec", "--bundle"]).arg(dir.path()).output().context("running runc spec")?;
        if !o.status.success() {
            bail!("runc spec --bundle {} failed: {}", dir.path().display(), text(&o).1);
        }
        copy_tree(rootfs, &dir.path().join("rootfs"))?;
        let b = Bundle { dir };
        let mut env_v = vec![Value::from("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")];
        env_v.extend(env.iter().map(|e| Value::from(*e)));
        let args_v: Vec<Value> = args.iter().map(|a| Value::from(*a)).collect();
        b.edit(|c| {
            c["process"]["terminal"] = Value::Bool(false);
            c["process"]["args"] = Value::Array(args_v);
            c["process"]["env"] = Value::Array(env_v);
            c["root"]["path"] = Value::from("rootfs");
            c["root"]["readonly"] = Value::Bool(false);
        })?;
        Ok(b)
    }

    /// The bundle directory.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The rootfs directory of the bundle.
    pub fn rootfs(&self) -> PathBuf {
        self.dir.path().join("rootfs")
    }

    /// Path of config.json.
    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("config.json")
    }

    /// config.json as JSON (key order kept).
    pub fn config(&self) -> Result<Value> {
        let p = self.config_path();
        let s = fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
        serde_json::from_str(&s).with_context(|| format!("parsing {}", p.display()))
    }

    /// Replace config.json.
    pub fn write_config(&self, v: &Value) -> Result<()> {
        fs::write(self.config_path(), serde_json::to_vec_pretty(v)?)?;
        Ok(())
    }

    /// Edit config.json in place.
    pub fn edit(&self, f: impl FnOnce(&mut Value)) -> Result<()> {
        let mut v = self.config()?;
        f(&mut v);
        self.write_config(&v)
    }
}
