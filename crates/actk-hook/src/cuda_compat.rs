//! `actk-hook enable-cuda-compat --host-driver-version V [--compat-dir DIR] [--library LIB]`: a
//! CDI createContainer hook (before `update-ldcache`) that lists an image's CUDA
//! forward-compatibility directory first in its loader configuration when the compat libcuda is
//! of a newer driver than the host's (actk_inject::compat; nvidia-cdi-hook enable-cuda-compat).

use crate::state;
use actk_core::cdi::ContainerEdits;
use actk_inject::compat::{self, CompatOutcome};
use anyhow::{Context, Result, bail};

/// The arguments of the hook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Args {
    /// The host driver version (`580.95.05`).
    pub host_driver_version: String,
    /// The compat directory in the image.
    pub dir: String,
    /// The library whose versioned file names the compat driver.
    pub library: String,
}

/// Parses the arguments after `enable-cuda-compat` (`--name VALUE` or `--name=VALUE`).
pub fn parse(args: &[String]) -> Result<Args> {
    let mut a = Args {
        host_driver_version: String::new(),
        dir: compat::DEFAULT_COMPAT_DIR.into(),
        library: "libcuda.so".into(),
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) => (n, Some(v.to_string())),
            None => (arg.as_str(), None),
        };
        let mut value =
            || inline.clone().or_else(|| it.next().cloned()).with_context(|| format!("{name} needs a value"));
        match name {
            "--host-driver-version" => a.host_driver_version = value()?,
            "--compat-dir" => a.dir = value()?,
            "--library" => a.library = value()?,
            other => bail!("enable-cuda-compat: unknown argument {other:?} (expected --host-driver-version V)"),
        }
    }
    if !a.dir.starts_with('/') {
        bail!("enable-cuda-compat: --compat-dir {:?} must be an absolute container path", a.dir);
    }
    Ok(a)
}

/// Runs the hook on the container of the OCI state on stdin. Without a host driver version it
/// does nothing (as nvidia-cdi-hook).
pub fn run(args: &[String]) -> Result<()> {
    let a = parse(args)?;
    if a.host_driver_version.is_empty() {
        return Ok(());
    }
    let st = state::read_stdin()?;
    let rootfs = crate::prestart::container_rootfs(&st)?;
    let target = crate::prestart::target_for(&st, &rootfs)?;
    report(compat::enable(&target.root, &a.host_driver_version, &a.dir, &a.library)?);
    Ok(())
}

/// For the live-injection path: applies the enable-cuda-compat hooks found in `edits` (the hook
/// cannot add hooks to a running container, so it does their work before refreshing the cache).
pub fn apply_from_edits(root: &actk_inject::root::ContainerRoot, edits: &ContainerEdits) -> Result<()> {
    for h in &edits.hooks {
        if h.args.get(1).map(String::as_str) != Some("enable-cuda-compat") {
            continue;
        }
        let a = parse(&h.args[2..])?;
        if !a.host_driver_version.is_empty() {
            report(compat::enable(root, &a.host_driver_version, &a.dir, &a.library)?);
        }
    }
    Ok(())
}

fn report(out: CompatOutcome) {
    match out {
        CompatOutcome::Enabled(dir, v) => {
            crate::log::info(&format!("CUDA forward compatibility: {dir} (driver {v}) first"))
        }
        CompatOutcome::NotNeeded(_) => {}
        CompatOutcome::NotWritten(why) => crate::log::warn(&why),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_in_both_forms_with_defaults() {
        let v = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let a = parse(&v(&["--host-driver-version", "580.95.05"])).unwrap();
        assert_eq!(
            (a.host_driver_version.as_str(), a.dir.as_str(), a.library.as_str()),
            ("580.95.05", "/usr/local/cuda/compat", "libcuda.so")
        );
        let a = parse(&v(&["--host-driver-version=535.1", "--compat-dir=/opt/compat"])).unwrap();
        assert_eq!(a.dir, "/opt/compat");
        assert!(parse(&v(&["--compat-dir", "rel"])).is_err());
        assert!(parse(&v(&["--bogus"])).is_err());
    }
}
