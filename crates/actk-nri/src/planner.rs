//! Planning for the NRI plugin: the same [`actk_core::plan`] path as actk-runtime and actk-hook
//! (request semantics, the node's policy from the config file), with the inventory and the CDI
//! registry held in memory and refreshed when they change:
//! - the registry is reloaded when a spec directory or a spec file in it changes (device, inode,
//!   size, mtime of each; a few `stat`s per container);
//! - the inventory is rediscovered (every profile, every capability: a request then picks its
//!   capabilities from it) when the host root's device directories or `/etc/ld.so.cache` change
//!   (a device node appears or goes, a driver upgrade), and every `rediscover` interval anyway.

use actk_core::cdi::Registry;
use actk_core::config::Config;
use actk_core::inventory::Inventory;
use actk_core::plan::{Plan, PlanContext, PlanError, PlanOptions, plan_with};
use serde_json::Value;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

/// Identity of a set of files: (path, device, inode, size, mtime in ns) of each that exists.
type Stamp = Vec<(PathBuf, u64, u64, u64, i128)>;

fn stamp_of(paths: impl IntoIterator<Item = PathBuf>) -> Stamp {
    paths
        .into_iter()
        .filter_map(|p| {
            let m = std::fs::metadata(&p).ok()?;
            let mtime = i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec());
            Some((p, m.dev(), m.ino(), m.size(), mtime))
        })
        .collect()
}

/// The spec directories and the spec files in them (what [`Registry::load`] reads).
fn spec_stamp(dirs: &[PathBuf]) -> Stamp {
    let mut paths = Vec::new();
    for d in dirs {
        paths.push(d.clone());
        if let Ok(rd) = std::fs::read_dir(d) {
            let mut files: Vec<PathBuf> = rd
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("json" | "yaml")))
                .collect();
            files.sort();
            paths.extend(files);
        }
    }
    stamp_of(paths)
}

/// What a change of the node's devices or driver touches.
fn host_stamp(root: &Path) -> Stamp {
    let r = |p: &str| root.join(p);
    stamp_of([r("dev"), r("dev/dri"), r("dev/accel"), r("dev/nvidia-caps"), r("etc/ld.so.cache")])
}

struct Loaded {
    ctx: PlanContext,
    /// Where the node's `/` is mounted in this process's view (a DaemonSet pod), if anywhere.
    host_mount: Option<PathBuf>,
    spec_stamp: Stamp,
    host_stamp: Stamp,
    discovered: Instant,
}

/// The plugin's planner: shared by the connection's request handlers.
pub struct Planner {
    loaded: RwLock<Loaded>,
    opts: PlanOptions,
    rediscover: Duration,
}

impl Planner {
    /// Builds the planning context from `config` ([`PlanContext::from_config`], as actk-runtime
    /// does), loads the registry and discovers the host; `rediscover`: the longest time a
    /// discovery is used for. Errors: bad profile files.
    /// `host_mount`: the node's `/` as mounted in a containerised plugin (`/host`), taken off
    /// the host paths discovery reports, since containerd applies the adjustment on the node.
    pub fn new(
        config: &Config,
        rediscover: Duration,
        host_mount: Option<PathBuf>,
    ) -> Result<Planner, actk_core::profile::ProfileError> {
        let mut ctx = PlanContext::from_config(config)?;
        let spec_stamp = spec_stamp(&ctx.spec_dirs);
        let host_stamp = host_stamp(&ctx.root);
        ctx.registry = Some(Arc::new(Registry::load(&ctx.spec_dirs)));
        ctx.inventory = Some(discover_all(&ctx, host_mount.as_deref()));
        // The hook runs on the node. A plugin installed there uses the configured hook, else the
        // actk-hook next to it, as actk-runtime does; a containerised one (`host_mount`) only
        // the configured one, a node path: the one next to it is the image's.
        let hook = match (&config.hook_path, &host_mount) {
            (Some(p), _) => p.to_str().map(str::to_string),
            (None, Some(_)) => None,
            (None, None) => std::env::current_exe()
                .ok()
                .and_then(|e| e.parent().map(|d| d.join("actk-hook")))
                .filter(|p| p.is_file())
                .and_then(|p| p.to_str().map(str::to_string)),
        };
        Ok(Planner {
            loaded: RwLock::new(Loaded { ctx, host_mount, spec_stamp, host_stamp, discovered: Instant::now() }),
            opts: PlanOptions { ldcache_hook: hook, ..Default::default() },
            rediscover,
        })
    }

    /// Plans the edits for `spec` (the container as [`crate::adjust::container_spec`] shapes
    /// it), refreshing the registry or inventory first when they changed.
    /// A containerised plugin leaves the ld.so.cache hook out while the node has no file at
    /// its path (seen under the host mount): the chart's node setup installs it beside the
    /// plugin's start, and a hook that does not exist would fail every container it is given to.
    pub fn plan(&self, spec: &Value) -> Result<Plan, PlanError> {
        self.refresh(false);
        let loaded = self.loaded.read().unwrap_or_else(|e| e.into_inner());
        if let (Some(m), Some(h)) = (&loaded.host_mount, &self.opts.ldcache_hook)
            && !m.join(h.trim_start_matches('/')).is_file()
        {
            tracing::warn!("ld.so.cache hook {h} is not on the node (yet): left out of this container's edits");
            return plan_with(spec, &loaded.ctx, &PlanOptions::default());
        }
        plan_with(spec, &loaded.ctx, &self.opts)
    }

    /// Reloads what changed (everything with `force`). Called before each plan and by the
    /// periodic refresh.
    pub fn refresh(&self, force: bool) {
        let (dirs, root, stale) = {
            let l = self.loaded.read().unwrap_or_else(|e| e.into_inner());
            (l.ctx.spec_dirs.clone(), l.ctx.root.clone(), l.discovered.elapsed() >= self.rediscover)
        };
        let specs = spec_stamp(&dirs);
        let host = host_stamp(&root);
        {
            let l = self.loaded.read().unwrap_or_else(|e| e.into_inner());
            if !force && !stale && specs == l.spec_stamp && host == l.host_stamp {
                return;
            }
        }
        let mut l = self.loaded.write().unwrap_or_else(|e| e.into_inner());
        if force || specs != l.spec_stamp {
            l.ctx.registry = Some(Arc::new(Registry::load(&dirs)));
            l.spec_stamp = specs;
            tracing::info!("CDI specs reloaded from {}", show(&dirs));
        }
        if force || stale || host != l.host_stamp {
            let inv = discover_all(&l.ctx, l.host_mount.as_deref());
            l.ctx.inventory = Some(inv);
            l.host_stamp = host;
            l.discovered = Instant::now();
            tracing::debug!("host {} rediscovered", root.display());
        }
    }
}

fn discover_all(ctx: &PlanContext, host_mount: Option<&Path>) -> Inventory {
    let mut inv = actk_core::discover::discover(&ctx.root, &ctx.profiles);
    if let Some(m) = host_mount {
        inv.strip_host_mount(m);
    }
    for w in &inv.warnings {
        tracing::warn!("discovery: {w}");
    }
    inv
}

fn show(dirs: &[PathBuf]) -> String {
    dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", ")
}
