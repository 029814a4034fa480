//! `actk-hook update-ldcache --folder DIR...`: a CDI hook that adds DIRs to the container's
//! ld.so.cache (actk_inject::ldcache: written by actk through the container-root resolver, no
//! ldconfig is run).
//!
//! `--ldconfig-path PATH` (what NVIDIA's `nvidia-cdi-hook update-ldcache` takes) is accepted and
//! ignored, so specs written for that hook work unchanged.

use crate::state;
use actk_inject::ldcache::{self, LdcacheOutcome};
use anyhow::{Context, Result, bail};

/// Runs the subcommand; `args` follow `update-ldcache`.
pub fn run(args: &[String]) -> Result<()> {
    let mut folders = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--folder" => folders.push(it.next().context("--folder needs a directory")?.clone()),
            "--ldconfig-path" => {
                it.next().context("--ldconfig-path needs a path")?;
            }
            s if s.starts_with("--folder=") => folders.push(s["--folder=".len()..].to_string()),
            s if s.starts_with("--ldconfig-path=") => {}
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
    let outcome = ldcache::update(&target.root, &folders)?;
    match &outcome {
        LdcacheOutcome::Updated(notes) => {
            crate::log::info(&format!("container {}: ld.so.cache lists {}", st.id, folders.join(", ")));
            if !notes.is_empty() {
                crate::log::warn(&format!("container {}: update-ldcache: {}", st.id, notes.replace('\n', "; ")));
            }
        }
        LdcacheOutcome::NotWritten(_) => {
            if let Some(w) = outcome.warning(&folders) {
                crate::log::warn(&format!("container {}: {w}", st.id));
            }
        }
        LdcacheOutcome::NoLoaderConfig | LdcacheOutcome::NothingToDo => {}
    }
    Ok(())
}
