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
//!
//! With `--plugin-config` (the chart's labeller) the MIG strategy, sharing and config name come
//! from the device plugin's own config file, the named config chosen as the plugin chooses it
//! (actk-device-plugin `node_config::requested`: the Node's `actk.dev/config`, else
//! `nvidia.com/device-plugin.config`, else the default), read again on every pass: relabelling
//! the node changes the sharing labels as it changes the plugin. A name that does not load keeps
//! the last good config's labels (logged, as the plugin keeps serving it).

use actk_device_plugin::node_config::requested;
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
    /// The device plugin's config file (its `--config`, with the chart's named configs under
    /// `nvidia_config`): MIG strategy, sharing and config name come from the config it serves on
    /// this node (with --node: the one the Node's label names; else --config-name's, else the
    /// default) instead of --replicas; --mig-strategy is then used only until a config loads.
    #[arg(long, conflicts_with_all = ["replicas"])]
    pub plugin_config: Option<PathBuf>,
    /// With --node: the Node's label `actk.dev/config` (else `nvidia.com/device-plugin.config`)
    /// names the config of --plugin-config, as for the plugin's --node-config (the chart sets
    /// both where it has named configs); without it the label is not the labeller's input.
    #[arg(long, requires = "plugin_config")]
    pub node_config: bool,
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
        ..Default::default()
    };
    // Until a config of the plugin's file loads, --mig-strategy's labels and no config name
    // (--config-name then only names the config to read).
    let mut plugin =
        a.plugin_config.clone().map(|p| PluginConfig::new(p, LabelOptions { config: None, ..opts.clone() }));
    if a.watch.is_some() && a.output.is_none() && a.node.is_none() {
        bail!("--watch needs --output FILE or --node NAME: where the labels go on each change");
    }
    if let Some(node) = &a.node {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting tokio")?;
        return rt.block_on(label_node(&a, node, &profiles, opts, plugin));
    }
    let mut last: Option<BTreeMap<String, String>> = None;
    loop {
        let inv = actk_core::discover::discover(&a.root, &profiles);
        let opts = match &mut plugin {
            Some(p) => p.options(a.config_name.as_deref()).clone(),
            None => opts.clone(),
        };
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
async fn label_node(
    a: &Args,
    node: &str,
    profiles: &[actk_core::profile::Profile],
    opts: LabelOptions,
    mut plugin: Option<PluginConfig>,
) -> Result<()> {
    let config = kube::Config::infer().await.context("finding the API server (in-cluster config or KUBECONFIG)")?;
    let client = kube::Client::try_from(config).context("building the API client")?;
    let api = kube::Api::<k8s_openapi::api::core::v1::Node>::all(client);
    loop {
        let pass = async {
            let n = api.get(node).await.with_context(|| format!("reading node {node}"))?;
            let opts = match &mut plugin {
                Some(p) if a.node_config => {
                    let label = n.metadata.labels.as_ref().and_then(|l| requested(l)).map(|(_, name)| name);
                    p.options(label.as_deref()).clone()
                }
                Some(p) => p.options(a.config_name.as_deref()).clone(),
                None => opts.clone(),
            };
            let now = labels(&actk_core::discover::discover(&a.root, profiles), &opts);
            patch_node(&api, node, n, &now).await
        };
        match pass.await {
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

/// The device plugin's config file as the labeller reads it: the options of the named config the
/// node asks for, else the last good ones (`fallback` until one loads), each refusal logged once.
struct PluginConfig {
    path: PathBuf,
    good: LabelOptions,
    told: Option<String>,
    /// The name `good` was loaded for: reading it again on the next pass is quiet (the
    /// loader's warnings, such as NVIDIA keys actk does not use, were logged the first time).
    loaded: Option<Option<String>>,
}

impl PluginConfig {
    fn new(path: PathBuf, fallback: LabelOptions) -> PluginConfig {
        PluginConfig { path, good: fallback, told: None, loaded: None }
    }

    /// The options for config `name` (`None`: the default), read from the file now.
    fn options(&mut self, name: Option<&str>) -> &LabelOptions {
        let load = || actk_device_plugin::config::label_options(&self.path, name);
        let again = self.loaded.as_ref().is_some_and(|l| l.as_deref() == name);
        let r = if again {
            tracing::subscriber::with_default(tracing::subscriber::NoSubscriber::default(), load)
        } else {
            load()
        };
        match r {
            Ok(o) => {
                self.good = o;
                self.told = None;
                self.loaded = Some(name.map(str::to_string));
            }
            Err(e) => {
                let m = format!(
                    "config {} of {}: {e}; labelling with the last good config ({})",
                    name.map(|n| format!("{n:?}")).unwrap_or_else(|| "the default".into()),
                    self.path.display(),
                    self.good.config.as_deref().unwrap_or("none")
                );
                if self.told.as_ref() != Some(&m) {
                    tracing::error!("{m}");
                    self.told = Some(m);
                }
            }
        }
        &self.good
    }
}

/// One JSON merge patch of Node `node`: `new` set, the stale keys removed, the owned-keys
/// annotation rewritten; `None` when the Node has them all already.
async fn patch_node(
    api: &kube::Api<k8s_openapi::api::core::v1::Node>,
    node: &str,
    n: k8s_openapi::api::core::v1::Node,
    new: &BTreeMap<String, String>,
) -> Result<Option<(usize, Vec<String>)>> {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A name that stops loading keeps the labels of the last config that did (as the plugin
    /// keeps serving it), and the next good name replaces them.
    #[test]
    fn a_refused_name_keeps_the_last_good_config() {
        let dir = tempfile::tempdir().unwrap();
        let cm = dir.path().join("nvidia");
        std::fs::create_dir_all(&cm).unwrap();
        std::fs::write(cm.join("default"), "version: v1\n").unwrap();
        std::fs::write(
            cm.join("ts2"),
            "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2\n",
        )
        .unwrap();
        let toml = dir.path().join("device-plugin.toml");
        std::fs::write(&toml, format!("nvidia_config = {:?}\n", cm.display().to_string())).unwrap();
        let fallback = LabelOptions { mig_strategy: Some("mixed".into()), ..Default::default() };
        let mut p = PluginConfig::new(toml, fallback.clone());
        assert_eq!(p.options(Some("gone")), &fallback, "nothing loaded yet: the fallback");
        let ts2 = p.options(Some("ts2")).clone();
        assert_eq!((ts2.config.as_deref(), ts2.replicas.get("nvidia.com/gpu")), (Some("ts2"), Some(&2)));
        assert_eq!(p.options(Some("gone")), &ts2, "the last good config stays");
        assert!(p.told.as_deref().is_some_and(|m| m.contains("last good config (ts2)")), "{:?}", p.told);
        assert_eq!(p.options(None).config.as_deref(), Some("default"));
        assert_eq!(p.told, None);
    }
}
