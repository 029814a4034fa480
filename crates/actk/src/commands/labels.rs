//! `actk node labels`: the node labels discovery gives (crates/actk-node `labels`): per vendor
//! count, product, memory, driver, architecture, partitioning, sharing and NUMA layout under
//! `actk.dev/`, and the labels NVIDIA's GPU Feature Discovery and AMD's node labeller publish.
//! Printed as `key=value` lines, or written to a node-feature-discovery local feature file
//! (`/etc/kubernetes/node-feature-discovery/features.d/actk`), whose worker publishes exactly
//! the file's labels on the Node: a rewrite without a key removes that label. With `--watch`
//! it stays and rewrites the file whenever discovery's answer changes (a GPU removed, a
//! partition mode changed).

use actk_node::labels::{LabelOptions, feature_file, labels};
use anyhow::{Context, Result, bail};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Arguments of `actk node labels`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Host root to discover devices in.
    #[arg(long, env = "ACTK_ROOT", default_value = "/")]
    pub root: PathBuf,
    /// Write the labels to this NFD feature file (atomically) instead of printing them.
    #[arg(long)]
    pub output: Option<PathBuf>,
    /// NVIDIA MIG strategy the device plugin runs with: none, single or mixed.
    #[arg(long, env = "ACTK_MIG_STRATEGY")]
    pub mig_strategy: Option<String>,
    /// Time-slicing replicas of a kind, `KIND=N` (repeatable): `nvidia.com/gpu=4`.
    #[arg(long = "replicas", value_parser = parse_replicas)]
    pub replicas: Vec<(String, u32)>,
    /// The named config this node runs (echoed as actk.dev/config.applied).
    #[arg(long, env = "ACTK_CONFIG_NAME")]
    pub config_name: Option<String>,
    /// Stay and discover again every this many seconds, rewriting `--output` on a change.
    #[arg(long, requires = "output")]
    pub watch: Option<u64>,
}

fn parse_replicas(s: &str) -> Result<(String, u32), String> {
    let (k, n) = s.split_once('=').ok_or_else(|| format!("{s:?}: expected KIND=N, e.g. nvidia.com/gpu=4"))?;
    let n: u32 = n.parse().map_err(|_| format!("{s:?}: the replica count {n:?} is not a number"))?;
    if n == 0 {
        return Err(format!("{s:?}: replicas must be at least 1"));
    }
    Ok((k.to_string(), n))
}

/// Runs `actk node labels`. Errors: no host root, profiles unreadable, the file unwritable.
pub fn run(a: Args) -> Result<()> {
    if !a.root.is_dir() {
        bail!("host root {} does not exist or is not a directory (--root / ACTK_ROOT)", a.root.display());
    }
    if let Some(s) = &a.mig_strategy
        && !["none", "single", "mixed"].contains(&s.as_str())
    {
        bail!("--mig-strategy {s:?}: expected none, single or mixed");
    }
    let profiles = actk_core::profile::load(None).context("loading vendor profiles")?;
    let opts = LabelOptions {
        mig_strategy: a.mig_strategy.clone(),
        replicas: a.replicas.iter().cloned().collect(),
        config: a.config_name.clone(),
    };
    let mut last: Option<BTreeMap<String, String>> = None;
    loop {
        let inv = actk_core::discover::discover(&a.root, &profiles);
        let now = labels(&inv, &opts);
        if last.as_ref() != Some(&now) {
            match &a.output {
                Some(path) => {
                    write_atomic(path, &feature_file(&now))?;
                    tracing::info!("wrote {} labels to {}", now.len(), path.display());
                }
                None => {
                    let mut out = std::io::stdout().lock();
                    out.write_all(feature_file(&now).as_bytes())?;
                }
            }
            last = Some(now);
        }
        match a.watch {
            Some(s) => std::thread::sleep(Duration::from_secs(s.max(1))),
            None => return Ok(()),
        }
    }
}

/// Writes `text` to `path` through a temporary file in its directory and a rename, so NFD's
/// worker never reads half a file.
fn write_atomic(path: &Path, text: &str) -> Result<()> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut tmp = tempfile::NamedTempFile::new_in(dir).with_context(|| format!("writing into {}", dir.display()))?;
    tmp.write_all(text.as_bytes())?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).with_context(|| format!("replacing {}", path.display()))?;
    Ok(())
}
