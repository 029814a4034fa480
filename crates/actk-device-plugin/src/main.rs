//! actk-device-plugin: the Kubernetes device plugin of actk. Discovers the node's accelerators
//! with the vendor profiles, serves one kubelet device plugin socket per extended resource
//! (`nvidia.com/gpu`, `aws.amazon.com/neuron`, `aws.amazon.com/neuroncore`, `amd.com/gpu`,
//! `habana.ai/gaudi`, ...), and keeps serving across kubelet restarts until SIGTERM/SIGINT.
//!
//! Configuration: flags > environment variables > config file > defaults (see `--help`).

use actk_core::inventory::{Inventory, VendorInventory};
use actk_device_plugin::allocate::{AllocateOptions, Strategy};
use actk_device_plugin::config::{DEFAULT_CONFIG, FileConfig, Overrides, Settings};
use actk_device_plugin::dra_servers::DraServers;
use actk_device_plugin::held::{self, Ledger};
use actk_device_plugin::manager::{self, ManagerConfig};
use actk_device_plugin::metrics::{self, Metrics};
use actk_device_plugin::node_config::{self, Decision, NodeSource};
use actk_device_plugin::telemetry_grant::TelemetryGrant;
use actk_device_plugin::{health, resources};
use anyhow::{Context, Result};
use clap::Parser;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, Clone, Parser)]
#[command(
    name = "actk-device-plugin",
    version = actk_version::LONG,
    about = "Kubernetes device plugin for every accelerator vendor actk knows"
)]
struct Cli {
    /// Config file (TOML); default /etc/actk/device-plugin.toml when it exists.
    #[arg(long, env = "ACTK_DEVICE_PLUGIN_CONFIG")]
    config: Option<PathBuf>,
    /// Host root to discover devices in (where the node's / is visible).
    #[arg(long, env = "ACTK_ROOT")]
    root: Option<PathBuf>,
    /// Where the node's / is mounted in this container; removed from host paths sent to the kubelet.
    #[arg(long, env = "ACTK_DEVICE_PLUGIN_HOST_MOUNT")]
    host_mount: Option<PathBuf>,
    /// Directory of user vendor profiles.
    #[arg(long, env = "ACTK_PROFILES_DIR")]
    profiles_dir: Option<PathBuf>,
    /// Device plugin socket directory.
    #[arg(long, env = "ACTK_DEVICE_PLUGIN_SOCKET_DIR")]
    socket_dir: Option<PathBuf>,
    /// The kubelet's Registration socket (default <socket-dir>/kubelet.sock).
    #[arg(long, env = "ACTK_DEVICE_PLUGIN_KUBELET_SOCKET")]
    kubelet_socket: Option<PathBuf>,
    /// The kubelet's PodResources socket (default /var/lib/kubelet/pod-resources/kubelet.sock):
    /// which devices the node's pods hold, so that hardware held through one resource
    /// (aws.amazon.com/neuroncore) is withdrawn from the others over it (aws.amazon.com/neuron).
    #[arg(long, env = "ACTK_DEVICE_PLUGIN_POD_RESOURCES_SOCKET")]
    pod_resources_socket: Option<PathBuf>,
    /// Allocate strategies, comma-separated: cdi-cri, cdi-annotations, envvar, device-specs, volume-mounts.
    #[arg(long, env = "ACTK_DEVICE_PLUGIN_STRATEGIES", value_delimiter = ',')]
    strategies: Option<Vec<String>>,
    /// Only serve these resource names (comma-separated).
    #[arg(long, env = "ACTK_DEVICE_PLUGIN_RESOURCES", value_delimiter = ',')]
    resources: Option<Vec<String>>,
    /// The DRA driver's servers file: the profiles it serves on this node, whose resources this
    /// plugin leaves alone (one kind, one server; the node label actk.dev/<profile>.server).
    #[arg(long, env = "ACTK_DEVICE_PLUGIN_DRA_SERVERS_FILE")]
    dra_servers_file: Option<PathBuf>,
    /// Profiles the DRA driver serves while its servers file is not there (comma-separated).
    #[arg(long, env = "ACTK_DEVICE_PLUGIN_DRA_DEFAULT_PROFILES", value_delimiter = ',')]
    dra_default_profiles: Option<Vec<String>>,
    /// Kubelet device IDs: uuid (default; stable across reboots) or index.
    #[arg(long, env = "ACTK_DEVICE_PLUGIN_DEVICE_IDS")]
    device_ids: Option<String>,
    /// Driver capabilities whose files device specs mount (comma-separated).
    #[arg(long, env = "ACTK_DEVICE_PLUGIN_CAPABILITIES", value_delimiter = ',')]
    capabilities: Option<Vec<String>>,
    /// Health poll interval in milliseconds (10-1500).
    #[arg(long, env = "ACTK_DEVICE_PLUGIN_HEALTH_INTERVAL_MS")]
    health_interval_ms: Option<u64>,
    /// Serve Prometheus metrics on host:port (e.g. 0.0.0.0:9400).
    #[arg(long, env = "ACTK_DEVICE_PLUGIN_METRICS_ADDRESS")]
    metrics_address: Option<String>,
    /// Refuse GetPreferredAllocation sizes that cannot be placed well instead of warning.
    #[arg(long, env = "ACTK_DEVICE_PLUGIN_STRICT_TOPOLOGY", num_args = 0..=1, default_missing_value = "true")]
    strict_topology: Option<bool>,
    /// CDI spec directories the node's runtime reads (node paths, comma-separated; default
    /// /etc/cdi,/var/run/cdi), read under --host-mount: CDI strategies name only devices they define.
    #[arg(long, env = "ACTK_DEVICE_PLUGIN_SPEC_DIRS", value_delimiter = ',')]
    spec_dirs: Option<Vec<PathBuf>>,
    /// How NVIDIA MIG devices are served: none (whole GPUs), single (MIG devices as
    /// nvidia.com/gpu), mixed (nvidia.com/mig-<profile> next to nvidia.com/gpu).
    #[arg(long, env = "ACTK_DEVICE_PLUGIN_MIG_STRATEGY")]
    mig_strategy: Option<String>,
    /// How partitioned AMD GPUs are named: single (amd.com/gpu) or mixed (amd.com/cpx_nps4, ...).
    #[arg(long, env = "ACTK_DEVICE_PLUGIN_RESOURCE_NAMING_STRATEGY")]
    resource_naming_strategy: Option<String>,
    /// Add the NRI gate's CDI device (actk.dev/nri-plugin=required) to every allocation, so a
    /// container that actk-nri (run with --gate-spec-dir) did not serve fails naming it instead
    /// of starting without its devices.
    #[arg(long, env = "ACTK_DEVICE_PLUGIN_NRI_GATE", num_args = 0..=1, default_missing_value = "true")]
    nri_gate: Option<bool>,
    /// Keep this file while the plugin is ready: every resource it serves has registered with
    /// the kubelet (a node without devices: once discovery ran). For a readiness probe.
    #[arg(long, env = "ACTK_DEVICE_PLUGIN_READY_FILE")]
    ready_file: Option<PathBuf>,
    /// Exit 0 when FILE (a --ready-file) exists, 1 when not, and do nothing else (every other
    /// setting is ignored): the exec readiness probe of an image without a shell, which runs in
    /// the plugin's container with its environment.
    #[arg(long, value_name = "FILE")]
    check_ready: Option<PathBuf>,
    /// Serve the named config that this node's label actk.dev/config (else NVIDIA's
    /// nvidia.com/device-plugin.config) names, of the config file's nvidia_config directory, and
    /// restart in place when the label names another (read every 10 s from the API server:
    /// needs --node-name and a service account that may get the Node and create Events).
    #[arg(long, env = "ACTK_DEVICE_PLUGIN_NODE_CONFIG", num_args = 0..=1, default_missing_value = "true")]
    node_config: Option<bool>,
    /// This node's name (the downward API's spec.nodeName), for --node-config.
    #[arg(long, env = "NODE_NAME")]
    node_name: Option<String>,
    /// Also serve the telemetry grant under this extended resource name (the chart:
    /// actk.dev/telemetry): one device, on every node, whose Allocate gives the device nodes
    /// NVML opens for every NVIDIA GPU (/dev/nvidiactl, /dev/nvidiaN, MIG capability nodes), so
    /// that the telemetry exporter reads them unprivileged. It is every GPU's control path:
    /// serve it only where an admission policy limits who may ask for it (the chart's does).
    #[arg(long, env = "ACTK_DEVICE_PLUGIN_TELEMETRY_RESOURCE", value_name = "RESOURCE")]
    telemetry_resource: Option<String>,
}

/// The settings from `cli`, its config file and, with `name` (the node's config label), the
/// config of that name.
fn settings(cli: Cli, name: Option<&str>) -> Result<(Settings, Option<PathBuf>)> {
    let (file, origin) = match &cli.config {
        Some(p) => (FileConfig::load_named(p, true, name)?, p.display().to_string()),
        None => {
            (FileConfig::load_named(std::path::Path::new(DEFAULT_CONFIG), false, name)?, DEFAULT_CONFIG.to_string())
        }
    };
    let o = Overrides {
        root: cli.root,
        host_mount: cli.host_mount,
        profiles_dir: cli.profiles_dir,
        socket_dir: cli.socket_dir,
        kubelet_socket: cli.kubelet_socket,
        pod_resources_socket: cli.pod_resources_socket,
        strategies: cli.strategies,
        resources: cli.resources,
        device_ids: cli.device_ids,
        capabilities: cli.capabilities,
        health_interval_ms: cli.health_interval_ms,
        metrics_address: cli.metrics_address,
        strict_topology: cli.strict_topology,
        spec_dirs: cli.spec_dirs,
        mig_strategy: cli.mig_strategy,
        resource_naming_strategy: cli.resource_naming_strategy,
        nri_gate: cli.nri_gate,
        logical_core_size: std::env::var("NEURON_LOGICAL_NC_CONFIG").ok(),
    };
    Ok((Settings::merge(o, file, &origin)?, cli.ready_file))
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("ACTK_LOG").unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        // Colour only on a terminal: `kubectl logs` of the pod must be plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    if let Some(f) = &cli.check_ready {
        std::process::exit(if f.exists() { 0 } else { 1 });
    }
    // One thread: the work is a few sockets and a stat loop; a thread pool would only cost memory.
    let rt =
        tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the tokio runtime")?;
    let exit = rt.block_on(start(cli))?;
    // Every task (sockets, the metrics listener) ends with the runtime, before the new image.
    drop(rt);
    match exit {
        Exit::Stopped => Ok(()),
        Exit::Reconfigure => Err(restart_in_place()),
    }
}

/// Why the plugin stopped serving.
enum Exit {
    /// SIGTERM or SIGINT.
    Stopped,
    /// The node's config label names another config: start again with it.
    Reconfigure,
}

/// Executes this binary again with the same arguments and environment (same pid, so the
/// container keeps running and the kubelet's restart back-off never applies); returns only
/// the error of a failed exec.
fn restart_in_place() -> anyhow::Error {
    use std::os::unix::process::CommandExt;
    let mut args = std::env::args_os();
    let arg0 = args.next().unwrap_or_default();
    let err = std::process::Command::new("/proc/self/exe").arg0(arg0).args(args).exec();
    anyhow::Error::new(err).context("restarting in place with the node's new config (exec /proc/self/exe)")
}

/// Chooses the config (the node's label with --node-config, else the file's), then serves it.
async fn start(cli: Cli) -> Result<Exit> {
    let dra = DraServers {
        file: cli.dra_servers_file.clone(),
        default: cli.dra_default_profiles.iter().flatten().filter(|p| !p.is_empty()).cloned().collect(),
    };
    let grant = cli.telemetry_resource.clone().filter(|r| !r.is_empty());
    if !cli.node_config.unwrap_or(false) {
        let (s, ready_file) = settings(cli, None)?;
        return run(s, ready_file, dra, None, grant).await;
    }
    let node = cli.node_name.clone().filter(|n| !n.is_empty()).context(
        "--node-config / ACTK_DEVICE_PLUGIN_NODE_CONFIG needs this node's name: --node-name / NODE_NAME \
         (the downward API's spec.nodeName)",
    )?;
    // Not ready while no config is chosen: a ready file of an earlier run of the container goes.
    if let Some(f) = &cli.ready_file {
        let _ = std::fs::remove_file(f);
    }
    let src = NodeSource::connect(node).await?;
    let check = {
        let cli = cli.clone();
        move |n: Option<&str>| settings(cli.clone(), n).map(|_| ()).map_err(|e| format!("{e:#}"))
    };
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    // The first config: the label's, if it loads; else nothing is served (there is no last good
    // config to keep) until the label changes.
    let mut told: Option<Option<String>> = None;
    let name = loop {
        match src.labels().await {
            Ok((labels, uid)) => {
                let req = node_config::requested(&labels);
                let label = req.as_ref().map(|(l, _)| *l);
                let name = req.map(|(_, n)| n);
                match check(name.as_deref()) {
                    Ok(()) => break name,
                    Err(why) if told.as_ref() != Some(&name) => {
                        let m = node_config::refusal_message(name.as_deref(), label, &why, None);
                        tracing::error!("{m}");
                        if let Err(e) = src.refused(uid, &m).await {
                            tracing::warn!("{e}");
                        }
                        told = Some(name);
                    }
                    Err(_) => {}
                }
            }
            Err(e) => tracing::warn!("{e}; looking again in {} s", node_config::POLL.as_secs()),
        }
        tokio::select! {
            _ = tokio::time::sleep(node_config::POLL) => {}
            _ = term.recv() => return Ok(Exit::Stopped),
            _ = tokio::signal::ctrl_c() => return Ok(Exit::Stopped),
        }
    };
    tracing::info!(
        "node {}: serving config {} (node label {}, else {}, else the default)",
        src.node(),
        name.as_deref().map(|n| format!("{n:?}")).unwrap_or_else(|| "the default".into()),
        node_config::CONFIG_LABEL,
        node_config::NVIDIA_CONFIG_LABEL
    );
    let (s, ready_file) = settings(cli, name.as_deref())?;
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let watch = tokio::spawn(watch_node(src, name, check, tx));
    let exit = run(s, ready_file, dra, Some(rx), grant).await;
    watch.abort();
    exit
}

/// Reads the node's labels every [`node_config::POLL`]: a name that loads and differs from
/// `current` is sent on `tx` (and the watch ends); one that does not is told once (log, Event).
async fn watch_node(
    src: NodeSource,
    current: Option<String>,
    check: impl Fn(Option<&str>) -> Result<(), String>,
    tx: tokio::sync::mpsc::Sender<()>,
) {
    let mut told: Option<Option<String>> = None;
    let mut unreachable = false;
    loop {
        tokio::time::sleep(node_config::POLL).await;
        let (labels, uid) = match src.labels().await {
            Ok(l) => {
                unreachable = false;
                l
            }
            Err(e) => {
                // Once per outage: the config in use stays.
                if !unreachable {
                    tracing::warn!("{e}; keeping the config in use");
                }
                unreachable = true;
                continue;
            }
        };
        match node_config::decide(current.as_deref(), &labels, &check) {
            Decision::Keep => told = None,
            Decision::Switch(n) => {
                tracing::info!(
                    "node {}: its label now names config {}; restarting in place to serve it",
                    src.node(),
                    n.as_deref().map(|n| format!("{n:?}")).unwrap_or_else(|| "the default".into())
                );
                let _ = tx.send(()).await;
                return;
            }
            Decision::Refuse { name, label, why } => {
                if told.as_ref() != Some(&name) {
                    let m = node_config::refusal_message(name.as_deref(), label, &why, Some(current.as_deref()));
                    tracing::error!("{m}");
                    if let Err(e) = src.refused(uid, &m).await {
                        tracing::warn!("{e}");
                    }
                    told = Some(name);
                }
            }
        }
    }
}

/// Waits for a reconfiguration on `rx`; never, without one.
async fn reconfigured(rx: &mut Option<tokio::sync::mpsc::Receiver<()>>) {
    if let Some(r) = rx
        && r.recv().await.is_some()
    {
        return;
    }
    std::future::pending().await
}

/// How often discovery runs again: while no device has been found (a driver container often
/// loads the driver after the plugin started, and a DaemonSet pod must not crash-loop
/// meanwhile), and while serving, to serve what changed (a device whose node appeared late, a
/// device gone, a driver upgrade with other files for device-specs).
const REDISCOVER: Duration = Duration::from_secs(5);

async fn run(
    s: Settings,
    ready_file: Option<PathBuf>,
    dra: DraServers,
    mut reconfigure: Option<tokio::sync::mpsc::Receiver<()>>,
    grant: Option<String>,
) -> Result<Exit> {
    // A root that is not there is a configuration error, unlike a root without devices (a driver
    // may load later): say so and stop, so a pod shows it in its status.
    if !s.root.is_dir() {
        anyhow::bail!(
            "host root {} does not exist or is not a directory (--root / ACTK_ROOT / root in the config file; \
             the Helm chart's hostRoot): point it at the directory holding the node's dev/ and sys/",
            s.root.display()
        );
    }
    let profiles = actk_core::profile::load(s.profiles_dir.as_deref()).context("loading vendor profiles")?;
    if let Some(name) = &grant {
        actk_device_plugin::telemetry_grant::check_resource_name(name, &profiles).map_err(anyhow::Error::msg)?;
    }
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    let metrics = Arc::new(Metrics::default());
    if let Some(addr) = s.metrics_address {
        let m = metrics.clone();
        tokio::spawn(async move {
            if let Err(e) = metrics::serve(addr, m).await {
                tracing::error!("metrics endpoint disabled: {e}");
            }
        });
    }
    // One ledger for the life of the process: what pods hold outlives a new set of devices (a
    // GPU held whole while its MIG mode changed stays withdrawn from its MIG resources).
    let readiness = Arc::new(manager::Readiness::new(ready_file));
    let ledger = Arc::new(Ledger::default());
    // What the node's pods hold before anything is served, so a restarted plugin never lists a
    // held unit as free (the loop below logs when the socket does not answer).
    if let Ok(listed) = held::list_assignments(&s.pod_resources_socket).await {
        ledger.reconcile(listed);
    }
    let mut always = vec![tokio::spawn(held::reconcile_loop(ledger.clone(), s.pod_resources_socket.clone()))];
    // The telemetry grant, served whatever the node's devices (and outside the readiness set,
    // which follows the devices' resources).
    if let Some(name) = grant {
        always.push(serve_grant(&s, name, Arc::new(profiles.clone()), &metrics));
    }
    let _always = Tasks(always);
    let mut first = true;
    let mut left_before: Option<std::collections::BTreeSet<String>> = None;
    // One pass per set of devices: serve it until discovery sees another (a device that got its
    // node late, one that went, a driver upgrade with other files), then serve the new one.
    loop {
        let (inventory, res) = loop {
            let inventory = discover_off_thread(&s.root, &profiles).await;
            let build = resources::BuildOptions {
                ids: s.device_ids,
                filter: s.resources.as_deref(),
                mig_strategy: s.mig_strategy,
                time_slicing: s.time_slicing.as_ref(),
                amd_naming: s.amd_naming,
                mps: s.mps.as_ref(),
                logical_core_size: s.logical_core_size,
            };
            let mut res = resources::build(&inventory, &profiles, &build);
            // One kind, one server: what the DRA driver serves on this node is left to it.
            let (left, from) = dra.profiles();
            if dra.enabled() && left_before.as_ref() != Some(&left) {
                let names: Vec<&str> = left.iter().map(String::as_str).collect();
                tracing::info!(
                    "profiles the DRA driver serves on this node (from {from}): {}",
                    if names.is_empty() { "none".to_string() } else { names.join(", ") }
                );
                left_before = Some(left.clone());
            }
            res.retain(|r| !left.contains(&r.profile.name));
            if first || !res.is_empty() {
                for w in &inventory.warnings {
                    tracing::warn!("discovery: {w}");
                }
            }
            if !res.is_empty() {
                break (inventory, res);
            }
            if first {
                tracing::warn!(
                    "no accelerators found under {} (or none selected); looking again every {} s",
                    s.root.display(),
                    REDISCOVER.as_secs()
                );
                first = false;
                // Nothing to serve is a working plugin on a node without accelerators.
                readiness.serving([]);
            }
            tokio::select! {
                _ = tokio::time::sleep(REDISCOVER) => {}
                _ = term.recv() => return Ok(Exit::Stopped),
                _ = tokio::signal::ctrl_c() => return Ok(Exit::Stopped),
                _ = reconfigured(&mut reconfigure) => return Ok(Exit::Reconfigure),
            }
        };
        let seen = fingerprint(&inventory);
        let left_seen = dra.profiles().0;
        ledger.learn(&res);
        readiness.serving(res.iter().map(|r| r.name.clone()));
        let tasks = serve(&s, res, &metrics, &ledger, &readiness).await;
        let changed = loop {
            tokio::select! {
                _ = tokio::time::sleep(REDISCOVER) => {
                    if fingerprint(&discover_off_thread(&s.root, &profiles).await) != seen {
                        break None;
                    }
                    if dra.profiles().0 != left_seen {
                        tracing::info!("what the DRA driver serves on this node changed; serving the rest again");
                        break None;
                    }
                }
                _ = term.recv() => break Some(Exit::Stopped),
                _ = tokio::signal::ctrl_c() => break Some(Exit::Stopped),
                _ = reconfigured(&mut reconfigure) => break Some(Exit::Reconfigure),
            }
        };
        // Each manager removes the socket it bound (not one a newer pod bound since) when its
        // task is dropped.
        drop(tasks);
        if let Some(exit) = changed {
            if matches!(exit, Exit::Reconfigure) {
                tracing::info!("stopped serving for the new config");
                return Ok(exit);
            }
            break;
        }
        tracing::info!("the devices under {} changed; serving them again", s.root.display());
        first = true;
    }
    tracing::info!("stopped");
    Ok(Exit::Stopped)
}

/// Serves the telemetry grant `name` (actk_device_plugin::telemetry_grant) until the task is
/// aborted.
fn serve_grant(
    s: &Settings,
    name: String,
    profiles: Arc<Vec<actk_core::profile::Profile>>,
    metrics: &Arc<Metrics>,
) -> tokio::task::JoinHandle<()> {
    let cfg = manager::Sockets {
        socket_dir: s.socket_dir.clone(),
        kubelet_socket: s.kubelet_socket.clone(),
        // Its own readiness, never written: the plugin's follows the devices' resources.
        readiness: Arc::new(manager::Readiness::new(None)),
    };
    let (root, host_mount, metrics) = (s.root.clone(), s.host_mount.clone(), metrics.clone());
    tracing::info!("serving the telemetry grant {name} (NVIDIA device nodes for the exporter)");
    tokio::spawn(async move {
        let endpoint = format!("actk-telemetry-{}.sock", name.replace(['/', '.'], "_"));
        let make = |ended, alive| {
            TelemetryGrant::new(name.clone(), root.clone(), host_mount.clone(), profiles.clone(), ended, alive)
        };
        manager::serve_socket(&name, &endpoint, 1, &cfg, &metrics, make).await
    })
}

/// What discovery found, as text: devices, their nodes, shared nodes, host files.
fn fingerprint(inventory: &Inventory) -> String {
    serde_json::to_string(&inventory.vendors).unwrap_or_default()
}

/// Tasks that are aborted when dropped.
struct Tasks(Vec<tokio::task::JoinHandle<()>>);

impl Drop for Tasks {
    fn drop(&mut self) {
        for t in &self.0 {
            t.abort();
        }
    }
}

/// Discovery under `root`, on tokio's blocking pool: it loads NVML (seconds in nvmlInit on a
/// node without persistence mode), and the kubelet's calls to the resources already served
/// wait on the runtime's thread meanwhile.
async fn discover_off_thread(root: &std::path::Path, profiles: &[actk_core::profile::Profile]) -> Inventory {
    let (root, profiles) = (root.to_path_buf(), profiles.to_vec());
    let (r, p) = (root.clone(), profiles.clone());
    match tokio::task::spawn_blocking(move || actk_core::discover::discover(&r, &p)).await {
        Ok(inv) => inv,
        Err(e) => {
            tracing::warn!("discovery on the blocking pool failed ({e}); discovering here");
            actk_core::discover::discover(&root, &profiles)
        }
    }
}

/// Serves `res` (a manager per resource, a health loop per vendor); returns the tasks, which
/// stop when dropped.
async fn serve(
    s: &Settings,
    res: Vec<resources::Resource>,
    metrics: &Arc<Metrics>,
    ledger: &Arc<Ledger>,
    readiness: &Arc<manager::Readiness>,
) -> Tasks {
    // CDI strategies hand out names that the runtime must find in the node's spec directories.
    let spec_dirs: Vec<PathBuf> =
        s.spec_dirs.iter().map(|d| s.host_mount.join(d.strip_prefix("/").unwrap_or(d))).collect();
    if s.strategies.iter().any(|st| matches!(st, Strategy::CdiCri | Strategy::CdiAnnotations)) {
        let registry = actk_core::cdi::Registry::load(&spec_dirs);
        for r in &res {
            if !registry.has_kind(&r.vendor.kind) {
                tracing::warn!(
                    "{}: no CDI spec for {} in {} yet; Allocate fails until one defines the devices (actk cdi generate)",
                    r.name,
                    r.vendor.kind,
                    spec_dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", ")
                );
            }
        }
    }
    let cfg = Arc::new(ManagerConfig {
        sockets: manager::Sockets {
            socket_dir: s.socket_dir.clone(),
            kubelet_socket: s.kubelet_socket.clone(),
            readiness: readiness.clone(),
        },
        allocate: Arc::new(AllocateOptions {
            strategies: s.strategies.clone(),
            host_mount: s.host_mount.clone(),
            capabilities: s.capabilities.clone(),
            spec_dirs,
            logical_core_size: s.logical_core_size,
            nri_gate: s.nri_gate,
        }),
        strict_topology: s.strict_topology,
        ledger: ledger.clone(),
    });
    // One health loop per vendor, shared by its resources (neuron and neuroncore; nvidia.com/gpu
    // and the MIG resources): actk-node's engine, with the NVML watch for NVIDIA GPUs and the
    // vendor's error counters.
    // The engines are made on tokio's blocking pool: an NVIDIA engine returns once its NVML Xid
    // watch is armed (nvmlInit: seconds without persistence mode).
    let policy = health::XidPolicy::new(
        &s.ignored_xids,
        s.xid_recovery,
        std::env::var("DP_DISABLE_HEALTHCHECKS").ok().as_deref(),
        std::env::var("DP_ENABLE_HEALTHCHECKS").ok().as_deref(),
    );
    let opts = health::HealthOptions { policy, poll: s.health_interval };
    let mut vendors: BTreeMap<String, (actk_core::profile::Profile, VendorInventory)> = BTreeMap::new();
    for r in &res {
        vendors.entry(r.vendor.profile.clone()).or_insert_with(|| (r.profile.clone(), r.vendor.clone()));
    }
    let make = {
        let root = s.root.clone();
        move |vendors: BTreeMap<String, (actk_core::profile::Profile, VendorInventory)>| {
            vendors
                .into_iter()
                .map(|(name, (profile, vendor))| {
                    let m = health::Monitor::new(&root, &profile, &vendor, &opts);
                    (name, (vendor.kind.clone(), m))
                })
                .collect::<BTreeMap<_, _>>()
        }
    };
    let monitors = match tokio::task::spawn_blocking({
        let (make, vendors) = (make.clone(), vendors.clone());
        move || make(vendors)
    })
    .await
    {
        Ok(m) => m,
        Err(e) => {
            tracing::warn!("starting the health engines on the blocking pool failed ({e}); starting them here");
            make(vendors)
        }
    };
    let health_rx: BTreeMap<String, _> =
        monitors.into_iter().map(|(name, (kind, m))| (name, health::spawn(kind, m, s.health_interval))).collect();
    let mut tasks = Vec::new();
    for r in res {
        let Some(rx) = health_rx.get(&r.vendor.profile).cloned() else { continue };
        tracing::info!(
            "serving {} ({} devices) on {}",
            r.name,
            r.units.len(),
            s.socket_dir.join(r.socket_name()).display()
        );
        tasks.push(tokio::spawn(manager::run(Arc::new(r), rx, cfg.clone(), metrics.clone())));
    }
    Tasks(tasks)
}
