//! `actk node labels`: the node labels discovery gives (crates/actk-node `labels`): per vendor
//! count, product, memory, driver, architecture, partitioning, sharing and NUMA layout under
//! `actk.dev/`, and the labels NVIDIA's GPU Feature Discovery and AMD's node labeller publish.
//! Printed as `key=value` lines, or written to a node-feature-discovery local feature file
//! (`/etc/kubernetes/node-feature-discovery/features.d/actk`), whose worker publishes exactly
//! the file's labels on the Node: a rewrite without a key removes that label. With `--watch`
//! it stays and rewrites the file whenever discovery's answer changes (a GPU removed, a
//! partition mode changed). With `--node NAME` (the chart's labeller DaemonSet) it patches the
//! labels on that Node through the API server instead: keys it set before and no longer
//! computes are removed (it keeps their list in the Node's annotation `actk.dev/labels`), and
//! the admin's inputs (`actk.dev/config`, `actk.dev/<profile>.server`) are never touched.

use actk_node::labels::{LabelOptions, OWNED_ANNOTATION, feature_file, labels, stale};
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
    #[arg(long)]
    pub watch: Option<u64>,
    /// Patch the labels on this Node through the API server (in-cluster service account, else
    /// $KUBECONFIG) instead of printing them: the labeller DaemonSet's mode.
    #[arg(long, conflicts_with = "output")]
    pub node: Option<String>,
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
    if a.watch.is_some() && a.output.is_none() && a.node.is_none() {
        bail!("--watch needs --output FILE or --node NAME: where the labels go on each change");
    }
    if let Some(node) = &a.node {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting tokio")?;
        return rt.block_on(label_node(&a, node, &profiles, &opts));
    }
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

/// `--node`: patches the labels of Node `node` now and, with `--watch`, again every pass on
/// which they differ from the Node's (discovery changed, or someone removed one). An API error
/// while watching is logged and tried again on the next pass.
async fn label_node(a: &Args, node: &str, profiles: &[actk_core::profile::Profile], opts: &LabelOptions) -> Result<()> {
    let config = kube::Config::infer().await.context("finding the API server (in-cluster config or KUBECONFIG)")?;
    let client = kube::Client::try_from(config).context("building the API client")?;
    let api = kube::Api::<k8s_openapi::api::core::v1::Node>::all(client);
    loop {
        let now = labels(&actk_core::discover::discover(&a.root, profiles), opts);
        match patch_node(&api, node, &now).await {
            Ok(Some((set, removed))) => {
                tracing::info!("node {node}: {set} labels set, {} removed ({})", removed.len(), removed.join(", "))
            }
            Ok(None) => {}
            Err(e) if a.watch.is_some() => tracing::warn!("{e:#}; trying again on the next pass"),
            Err(e) => return Err(e),
        }
        match a.watch {
            Some(s) => tokio::time::sleep(Duration::from_secs(s.max(1))).await,
            None => return Ok(()),
        }
    }
}

/// One JSON merge patch of Node `node`: `new` set, the stale keys removed, the owned-keys
/// annotation rewritten; `None` when the Node has them all already.
async fn patch_node(
    api: &kube::Api<k8s_openapi::api::core::v1::Node>,
    node: &str,
    new: &BTreeMap<String, String>,
) -> Result<Option<(usize, Vec<String>)>> {
    let n = api.get(node).await.with_context(|| format!("reading node {node}"))?;
    let current = n.metadata.labels.unwrap_or_default();
    let owned_now = n.metadata.annotations.unwrap_or_default().get(OWNED_ANNOTATION).cloned().unwrap_or_default();
    let before: BTreeMap<String, String> =
        owned_now.split(',').filter(|k| !k.is_empty()).map(|k| (k.to_string(), String::new())).collect();
    let removed = stale(&current, &before, new);
    let owned = new.keys().cloned().collect::<Vec<_>>().join(",");
    if removed.is_empty() && owned == owned_now && new.iter().all(|(k, v)| current.get(k) == Some(v)) {
        return Ok(None);
    }
    let mut l = serde_json::Map::new();
    for (k, v) in new {
        l.insert(k.clone(), v.clone().into());
    }
    for k in &removed {
        l.insert(k.clone(), serde_json::Value::Null);
    }
    let patch = serde_json::json!({"metadata": {"labels": l, "annotations": {OWNED_ANNOTATION: owned}}});
    api.patch(node, &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&patch))
        .await
        .with_context(|| format!("patching the labels of node {node}"))?;
    Ok(Some((new.len(), removed)))
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
