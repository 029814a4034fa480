//! `actk-hook prestart` (and createRuntime / createContainer): plan and inject.

use crate::state;
use actk_core::config::Config;
use actk_core::plan::{PlanContext, PlanOptions, plan_with};
use actk_core::{cdi::ContainerEdits, edits};
use actk_inject::bpf::DeviceRule;
use actk_inject::{Options, Target, inject};
use anyhow::{Context, Result, bail};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// Runs the stage `stage`; `args` follow it (`--edits FILE`).
pub fn run(stage: &str, args: &[String]) -> Result<()> {
    let mut edits_file = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--edits" => edits_file = Some(PathBuf::from(it.next().context("--edits needs a file")?)),
            other => bail!("{stage}: unknown argument {other:?} (expected --edits FILE)"),
        }
    }
    let st = state::read_stdin()?;
    let spec = read_config(&st.bundle)?;
    if edits::is_applied(&spec) {
        // actk-runtime already put everything into config.json: injecting again would double it.
        return Ok(());
    }
    let config = Config::load_default()?;
    crate::log::init(&config);
    let container_edits: ContainerEdits = match &edits_file {
        Some(f) => {
            let text = std::fs::read(f).with_context(|| format!("cannot read the edits file {}", f.display()))?;
            serde_json::from_slice(&text).with_context(|| {
                format!("{} is not CDI container edits JSON (CDI SPEC.md \"containerEdits\")", f.display())
            })?
        }
        None => {
            let ctx = PlanContext::from_config(&config).context("cannot load vendor profiles")?;
            // With this executable as the ld.so.cache hook, the edits carry the hooks a CDI spec
            // would (enable-cuda-compat, update-ldcache); a live container cannot take hooks, so
            // their work is done here (cuda_compat::apply_from_edits, inject's cache refresh).
            let me = std::env::current_exe().ok().and_then(|p| p.to_str().map(str::to_string));
            let p = plan_with(&spec, &ctx, &PlanOptions { ldcache_hook: me })
                .with_context(|| format!("container {}", st.id))?;
            for w in &p.warnings {
                crate::log::warn(&format!("container {}: {w}", st.id));
            }
            if !p.is_empty() {
                crate::log::info(&format!("container {}: {}", st.id, p.summary()));
            }
            p.edits
        }
    };
    actk_inject::refuse_runtime_only(&container_edits).with_context(|| format!("container {}", st.id))?;
    if container_edits.device_nodes.is_empty() && container_edits.mounts.is_empty() {
        return Ok(());
    }
    let rootfs = rootfs_of(&spec, &st.bundle)?;
    let target = target_for(&st, &rootfs)?;
    crate::cuda_compat::apply_from_edits(&target.root, &container_edits)
        .with_context(|| format!("container {}", st.id))?;
    let existing: Vec<DeviceRule> = spec
        .pointer("/linux/resources/devices")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(DeviceRule::from_oci).collect())
        .unwrap_or_default();
    let opts = Options {
        host_root: config.root.clone(),
        driver_root: config.driver_root.clone(),
        existing_device_rules: existing,
        owner: edits::node_owner(&spec),
        ..Options::default()
    };
    let report = inject(&target, &container_edits, &opts)
        .with_context(|| format!("cannot inject devices into container {}", st.id))?;
    crate::log::info(&format!(
        "container {}: injected {} device node(s) and {} mount(s)",
        st.id,
        report.nodes.len(),
        report.mounts.len()
    ));
    let dirs = actk_inject::lib_dirs(&container_edits);
    if let Some(w) = report.ldcache.as_ref().and_then(|o| o.warning(&dirs)) {
        crate::log::warn(&format!("container {}: {w}", st.id));
    }
    // What the ld.so.cache step skipped of the image (files that are not regular, a spent budget).
    if let Some(actk_inject::ldcache::LdcacheOutcome::Updated(notes)) = &report.ldcache
        && !notes.is_empty()
    {
        crate::log::warn(&format!("container {}: ld.so.cache: {}", st.id, notes.replace('\n', "; ")));
    }
    Ok(())
}

/// Reads `<bundle>/config.json`. Errors: unreadable (inside a container's user namespace, with
/// what to do: the request is in config.json, so planning hooks belong to the prestart or
/// createRuntime stage, which run in the runtime's namespaces), or not JSON.
pub fn read_config(bundle: &Path) -> Result<Value> {
    read_config_raw(bundle).map_err(|e| {
        if is_permission_denied(&e) && actk_inject::in_child_user_namespace().unwrap_or(false) {
            e.context(
                "the hook runs inside the container's user namespace (a createContainer hook), where the bundle cannot be read; run `actk-hook prestart` or `createRuntime` instead, which run in the runtime's namespaces",
            )
        } else {
            e
        }
    })
}

/// The rootfs of the container of state `st`: config.json's `root.path` ([`rootfs_of`]).
///
/// A createContainer hook of a container with its own user namespace runs inside it, where the
/// bundle's config.json (host root's, mode 0600 as engines write it) cannot be read: there the
/// rootfs is the working directory, which runc and crun set to the rootfs before running these
/// hooks (runtime-spec: createContainer hooks run "after the root filesystem is prepared,
/// before pivot_root"). Errors: config.json unreadable otherwise, or no such working directory.
pub fn container_rootfs(st: &state::State) -> Result<PathBuf> {
    match read_config_raw(&st.bundle) {
        Ok(spec) => rootfs_of(&spec, &st.bundle),
        Err(e) if is_permission_denied(&e) && actk_inject::in_child_user_namespace().unwrap_or(false) => {
            let cwd = std::env::current_dir().context("cannot read the working directory (the container's rootfs)")?;
            if cwd == Path::new("/") {
                bail!(
                    "{e:#}; in the container's user namespace the rootfs is taken from the working directory, which is /: refusing (the runtime did not chdir to the rootfs)"
                );
            }
            Ok(cwd)
        }
        Err(e) => Err(e),
    }
}

fn is_permission_denied(e: &anyhow::Error) -> bool {
    e.chain()
        .any(|c| c.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::PermissionDenied))
}

fn read_config_raw(bundle: &Path) -> Result<Value> {
    let p = bundle.join("config.json");
    let text = std::fs::read(&p).with_context(|| format!("cannot read {}", p.display()))?;
    serde_json::from_slice(&text).with_context(|| format!("{} is not valid JSON", p.display()))
}

/// The container's rootfs as an absolute host path: `root.path`, relative to the bundle unless
/// absolute (runtime-spec "Root").
pub fn rootfs_of(spec: &Value, bundle: &Path) -> Result<PathBuf> {
    let Some(p) = spec.pointer("/root/path").and_then(Value::as_str) else {
        bail!("{}/config.json has no root.path", bundle.display());
    };
    Ok(if p.starts_with('/') { PathBuf::from(p) } else { bundle.join(p) })
}

/// The container to inject into: from the host side by its pid (prestart, createRuntime), or
/// the caller's own namespaces when the hook runs inside the container's mount namespace
/// (runc's createContainer, whether or not the container has its own PID namespace:
/// [`Target::for_hook`] decides by mount namespace). Every stage and subcommand goes through here.
pub fn target_for(st: &state::State, rootfs: &Path) -> Result<Target> {
    Target::for_hook(st.pid, rootfs).with_context(|| format!("container {} (pid {})", st.id, st.pid))
}
