//! `actk-hook update-ldcache --folder DIR...`: a CDI createContainer hook that adds DIRs to the
//! container's ld.so.cache with the host's verified ldconfig (actk_inject::ldcache).

use crate::state;
use actk_inject::ldcache::{self, HostLdconfig};
use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};

/// Runs the subcommand; `args` follow `update-ldcache`.
pub fn run(args: &[String]) -> Result<()> {
    let mut folders = Vec::new();
    let mut ldconfig = PathBuf::from("/sbin/ldconfig");
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--folder" => folders.push(it.next().context("--folder needs a directory")?.clone()),
            "--ldconfig-path" => ldconfig = PathBuf::from(it.next().context("--ldconfig-path needs a path")?),
            s if s.starts_with("--folder=") => folders.push(s["--folder=".len()..].to_string()),
            other => bail!("update-ldcache: unknown argument {other:?} (expected --folder DIR)"),
        }
    }
    for f in &folders {
        if !f.starts_with('/') {
            bail!("update-ldcache: --folder {f:?} must be an absolute container path");
        }
    }
    let st = state::read_stdin()?;
    let rootfs = crate::prestart::container_rootfs(&st)?;
    let target = crate::prestart::target_for(&st, &rootfs)?;
    let root = &target.root;
    if !root.exists("/etc/ld.so.conf") {
        // No glibc loader configuration in the image (busybox, musl): no cache to refresh, and
        // no host ldconfig to vet.
        return Ok(());
    }
    let ld = HostLdconfig::open(Path::new(&ldconfig))?;
    ldcache::update(root, &ld, &folders, ldcache::DEFAULT_TIMEOUT)?;
    Ok(())
}
