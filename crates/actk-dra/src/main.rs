//! actk-dra-driver: the DRA driver of actk (driver name `actk.dev`, resource.k8s.io/v1,
//! Kubernetes 1.34+). On each node it publishes the node's accelerators of every served profile
//! as one ResourceSlice pool, keeps it current, and prepares allocated claims as transient CDI
//! specs for the kubelet. Runs until SIGTERM/SIGINT.
//!
//! On SIGTERM it withdraws the pool, unless another process of the driver runs on the node (the
//! new pod of a rolling update, [`actk_dra::plugin::others_alive`]): that one takes the pool
//! over, and the running claims, the checkpoint and the specs stay as they are.

use actk_dra::claim::SpecOptions;
use actk_dra::driver::Driver;
use actk_dra::plugin::{self, Socket, Sockets};
use actk_dra::publish::{self, ApiSink, NodeChoice, PublishConfig};
use actk_dra::servers::Server;
use actk_dra::service::{DraService, Registrar};
use actk_dra::slice::DRIVER;
use anyhow::{Context, Result};
use clap::Parser;
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{oneshot, watch};

#[derive(Debug, Parser)]
#[command(name = "actk-dra-driver", version = actk_version::LONG, about = "Kubernetes DRA driver (actk.dev) for every accelerator vendor actk knows")]
struct Cli {
    /// This node's name (the pool name); the chart sets it from spec.nodeName.
    #[arg(long, env = "NODE_NAME", required_unless_present = "check_ready", default_value = "")]
    node_name: String,
    /// Host root to discover devices in (where the node's / is visible).
    #[arg(long, env = "ACTK_ROOT", default_value = "/")]
    root: PathBuf,
    /// Where the node's / is mounted in this container; removed from host paths in CDI specs.
    #[arg(long, env = "ACTK_DRA_HOST_MOUNT", default_value = "/")]
    host_mount: PathBuf,
    /// Directory of user vendor profiles.
    #[arg(long, env = "ACTK_PROFILES_DIR")]
    profiles_dir: Option<PathBuf>,
    /// Serve only these profiles (comma-separated, e.g. nvidia,neuron); default: every profile.
    #[arg(long, env = "ACTK_DRA_PROFILES", value_delimiter = ',')]
    profiles: Option<Vec<String>>,
    /// Directory of the transient CDI specs (the node's /var/run/cdi).
    #[arg(long, env = "ACTK_DRA_CDI_DIR", default_value = "/var/run/cdi")]
    cdi_dir: PathBuf,
    /// Directory of the DRA socket and the checkpoint (same path on the node).
    #[arg(long, env = "ACTK_DRA_PLUGIN_DIR", default_value = plugin::DEFAULT_PLUGIN_DIR)]
    plugin_dir: PathBuf,
    /// The kubelet's plugin registration directory.
    #[arg(long, env = "ACTK_DRA_REGISTRY_DIR", default_value = plugin::DEFAULT_REGISTRY_DIR)]
    registry_dir: PathBuf,
    /// Kubeconfig file; default: in-cluster config, then $KUBECONFIG.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Capabilities whose driver files the claim specs mount (comma-separated); default: every
    /// capability whose files exist.
    #[arg(long, env = "ACTK_DRA_CAPABILITIES", value_delimiter = ',')]
    capabilities: Option<Vec<String>>,
    /// Absolute path on the node of actk-hook, for the ld.so.cache createContainer hook; none by default.
    #[arg(long, env = "ACTK_DRA_LDCACHE_HOOK")]
    ldcache_hook: Option<String>,
    /// Health probe period in milliseconds.
    #[arg(long, env = "ACTK_DRA_HEALTH_INTERVAL_MS", default_value_t = 500)]
    health_interval_ms: u64,
    /// Discovery period in milliseconds.
    /// How long after its last error event (a critical Xid, a rise of an uncorrectable error
    /// counter) a present device is healthy again, in milliseconds; 0: until the driver
    /// restarts (NVIDIA's behaviour for Xids).
    #[arg(long, env = "ACTK_DRA_HEALTH_RECOVERY_MS", default_value_t = 60_000)]
    health_recovery_ms: u64,
    /// Taint lost devices (node or PCI function gone, NVML lost the GPU) NoExecute instead of
    /// NoSchedule: the pods using them are evicted (KEP-5055), where the API server keeps
    /// device taints.
    #[arg(long, env = "ACTK_DRA_TAINT_LOST_NO_EXECUTE")]
    taint_lost_no_execute: bool,
    #[arg(long, env = "ACTK_DRA_REDISCOVER_INTERVAL_MS", default_value_t = 5000)]
    rediscover_interval_ms: u64,
    /// Publish kinds that a device plugin also advertises on this node (off: they are left out).
    #[arg(long, env = "ACTK_DRA_ALLOW_DEVICE_PLUGIN_OVERLAP")]
    allow_device_plugin_overlap: bool,
    /// Consumable capacity (KEP-5075: `allowMultipleAllocations`, capacity `requestPolicy`) on
    /// the devices of profiles that share: `auto` where the API server is 1.35 or newer (1.34's
    /// allocator stops at the first partly allocated device, kubernetes/kubernetes#133705, so
    /// even whole-device claims would wait there once the gate is on), `on` always (1.34 with
    /// DRAConsumableCapacity, claims pinned to one device), `off` never.
    #[arg(long, env = "ACTK_DRA_SHARING", default_value = "auto", value_parser = ["auto", "on", "off"])]
    sharing: String,
    /// Dynamic MIG: on GPUs in MIG mode, publish every placement of every MIG profile as a
    /// device that consumes the GPU's memory slices (KEP-4815 shared counters, kept by the API
    /// server where DRAPartitionableDevices is on: beta and on by default from 1.36), make the
    /// MIG device at NodePrepareResources and destroy it at NodeUnprepareResources. Off by
    /// default: it changes the GPUs' MIG layout (never the MIG mode).
    #[arg(long, env = "ACTK_DRA_DYNAMIC_MIG")]
    dynamic_mig: bool,
    /// Host path of the node's CUDA MPS control daemon's pipe directory, for claims whose
    /// DeviceConfig asks for `sharing.strategy: MPS` (unset: such claims are refused).
    #[arg(long, env = "ACTK_DRA_MPS_PIPE_DIRECTORY")]
    mps_pipe_directory: Option<PathBuf>,
    /// Host directory the MPS daemon's processes share as /dev/shm, mounted there in MPS
    /// clients (unset: not mounted; such pods need hostIPC).
    #[arg(long, env = "ACTK_DRA_MPS_SHM_DIRECTORY", requires = "mps_pipe_directory")]
    mps_shm_directory: Option<PathBuf>,
    /// The per-node choice: the Node's labels `actk.dev/<profile>.server=dra|device-plugin`
    /// decide which of the served profiles this driver takes on the node.
    #[arg(long, env = "ACTK_DRA_SERVER_LABELS")]
    server_labels: bool,
    /// With --server-labels: what serves a profile on a node without its label (dra or
    /// device-plugin).
    #[arg(long, env = "ACTK_DRA_DEFAULT_SERVER", default_value = "dra", value_parser = parse_server)]
    default_server: Server,
    /// With --server-labels: the file telling the device plugin which profiles this driver
    /// serves on the node (its --dra-servers-file).
    #[arg(long, env = "ACTK_DRA_SERVERS_FILE")]
    servers_file: Option<PathBuf>,
    /// The pod's UID (metadata.uid): per-pod socket names, so that the old and the new pod of a
    /// rolling update are both registered (kubelet 1.33+). Unset: the fixed names.
    #[arg(long, env = "POD_UID")]
    pod_uid: Option<String>,
    /// `host:port` of a Prometheus /metrics endpoint; none by default.
    #[arg(long, env = "ACTK_DRA_METRICS_ADDRESS")]
    metrics_address: Option<std::net::SocketAddr>,
    /// Keep this file while the kubelet has the driver registered (a readiness probe's file).
    #[arg(long, env = "ACTK_DRA_READY_FILE")]
    ready_file: Option<PathBuf>,
    /// Exit 0 when FILE exists, 1 when not, and do nothing else: the exec readiness probe of an
    /// image without a shell.
    #[arg(long, value_name = "FILE")]
    check_ready: Option<PathBuf>,
}

fn parse_server(s: &str) -> Result<Server, String> {
    s.parse()
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
    if !(10..=60_000).contains(&cli.health_interval_ms) || !(100..=600_000).contains(&cli.rediscover_interval_ms) {
        anyhow::bail!(
            "--health-interval-ms must be 10..=60000 and --rediscover-interval-ms 100..=600000 (got {} and {})",
            cli.health_interval_ms,
            cli.rediscover_interval_ms
        );
    }
    let rt =
        tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the tokio runtime")?;
    rt.block_on(run(cli))
}

async fn run(cli: Cli) -> Result<()> {
    let mut profiles = actk_core::profile::load(cli.profiles_dir.as_deref()).context("loading vendor profiles")?;
    let served: Option<BTreeSet<String>> = cli.profiles.as_ref().map(|p| p.iter().cloned().collect());
    if let Some(s) = &served
        && let Some(bad) = s.iter().find(|n| !profiles.iter().any(|p| &p.name == *n))
    {
        anyhow::bail!(
            "--profiles names {bad:?}, which is no loaded profile (known: {})",
            profiles.iter().map(|p| p.name.as_str()).collect::<Vec<_>>().join(", ")
        );
    }
    if !cli.root.is_dir() {
        anyhow::bail!(
            "--root {}: not a directory; give the directory where the node's / is visible",
            cli.root.display()
        );
    }
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    let client = actk_dra::kube::client(cli.kubeconfig.as_deref()).await?;
    let metrics = actk_dra::metrics::DraMetrics::new();
    if let Some(addr) = cli.metrics_address {
        tokio::spawn(actk_dra::metrics::serve(addr, metrics.clone()));
    }
    // What the API server serves: resource.k8s.io/v1 is required; the rest is used where kept.
    let api = loop {
        match actk_dra::discovery::discover(&client, &cli.node_name).await {
            Ok(f) => break f,
            Err(e) => {
                tracing::warn!("{e}; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(2)) => {}
                    _ = term.recv() => return Ok(()),
                }
            }
        }
    };
    api.check()?;
    tracing::info!("{}", api.summary());
    let (share, why) = actk_dra::discovery::sharing(&cli.sharing, api.minor);
    tracing::info!("consumable capacity: {}", why);
    if !share {
        for p in &mut profiles {
            p.kubernetes.shared_capacity = None;
        }
    }
    metrics.api(&api);
    // The Node must exist (the kubelet registers it) before slices can name it as owner.
    let node = loop {
        match actk_dra::kube::node(&client, &cli.node_name).await {
            Ok((n, _)) => break n,
            Err(e) => {
                tracing::warn!("{e}; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(2)) => {}
                    _ = term.recv() => return Ok(()),
                }
            }
        }
    };
    let first_generation = match actk_dra::kube::current_slices(&client, &node.name).await {
        Ok(s) => s.iter().map(|s| s.spec.pool.generation).max().unwrap_or(0) + 1,
        Err(e) => {
            tracing::warn!("{e}; starting at pool generation 1");
            1
        }
    };
    let (inv_tx, inv_rx) = watch::channel(Arc::new(actk_core::inventory::Inventory::default()));
    let sockets =
        Sockets::new(DRIVER, &cli.registry_dir, &cli.plugin_dir, cli.pod_uid.as_deref()).map_err(anyhow::Error::msg)?;
    for gone in plugin::remove_stale(&[&cli.registry_dir, &cli.plugin_dir], DRIVER, &sockets) {
        tracing::info!("removed {}: its driver process is gone", gone.display());
    }
    // Dynamic MIG where asked for and the API server keeps shared counters.
    let (placements_tx, placements_rx) = watch::channel(Arc::new(actk_dra::mig::Placements::new()));
    let dynamic_mig = match (cli.dynamic_mig, api.partitionable_devices) {
        (false, _) => None,
        (true, Some(true)) => {
            tracing::info!("dynamic MIG: MIG placements are published and made at prepare");
            Some(publish::DynamicMigConfig {
                node: node.name.clone(),
                checkpoint: cli.plugin_dir.join(actk_dra::checkpoint::FILE_NAME),
                placements: Arc::new(placements_tx),
            })
        }
        (true, kept) => {
            tracing::warn!(
                "--dynamic-mig is set but the API server {} shared counters (DRAPartitionableDevices: beta and on by default from Kubernetes 1.36); MIG devices are published as they exist",
                if kept == Some(false) { "drops" } else { "could not be asked whether it keeps" }
            );
            None
        }
    };
    let driver = Driver::new(
        node.name.clone(),
        profiles.clone(),
        cli.cdi_dir.clone(),
        cli.plugin_dir.join(actk_dra::checkpoint::FILE_NAME),
        SpecOptions {
            host_mount: cli.host_mount.clone(),
            capabilities: cli.capabilities.clone(),
            ldcache_hook: cli.ldcache_hook.clone(),
            mps: cli.mps_pipe_directory.clone().map(|pipe_directory| actk_dra::claim::MpsNode {
                pipe_directory,
                shm_directory: cli.mps_shm_directory.clone(),
            }),
        },
        inv_rx.clone(),
        Arc::new(actk_dra::kube::ApiClaims(client.clone())),
    )?
    .with_metrics(metrics.clone());
    // Always: with --dynamic-mig off (or no placement offered) nothing is made, but MIG devices
    // made earlier for claims still prepared are destroyed at their unprepare.
    let driver = Arc::new(driver.with_dynamic_mig(cli.root.clone(), placements_rx));
    driver.remove_orphan_specs().await;
    let (state_tx, state_rx) = watch::channel(Arc::new(actk_dra::events::PoolState::default()));
    // Why a claim cannot be served here, as Events and claim conditions (actk_dra::events).
    tokio::spawn(actk_dra::kube::report(
        client.clone(),
        node.name.clone(),
        state_rx,
        Duration::from_millis(cli.rediscover_interval_ms),
    ));
    // Unhealthy devices: tainted where the API server keeps device taints, else withdrawn;
    // reported to the kubelet either way (actk_dra::health).
    let taint_mode = actk_dra::health::TaintMode::for_server(api.device_taints, cli.taint_lost_no_execute);
    tracing::info!(
        "unhealthy devices: {}",
        match taint_mode {
            actk_dra::health::TaintMode::Withdraw => "leave the ResourceSlice (the API server drops device taints)",
            actk_dra::health::TaintMode::Taint { lost_no_execute: true } =>
                "tainted actk.dev/unhealthy, NoSchedule (lost devices NoExecute)",
            actk_dra::health::TaintMode::Taint { lost_no_execute: false } => "tainted actk.dev/unhealthy, NoSchedule",
        }
    );
    let (health_tx, health_rx) = watch::channel(Arc::new(actk_dra::health::HealthReport::default()));
    let cfg = PublishConfig {
        root: cli.root.clone(),
        profiles,
        served,
        health: Duration::from_millis(cli.health_interval_ms),
        rediscover: Duration::from_millis(cli.rediscover_interval_ms),
        allow_device_plugin_overlap: cli.allow_device_plugin_overlap,
        state: Some(Arc::new(state_tx)),
        node_choice: cli.server_labels.then(|| NodeChoice {
            default: cli.default_server,
            file: cli.servers_file.clone(),
            node: node.name.clone(),
        }),
        publish_lock: Some(cli.plugin_dir.join(publish::PUBLISH_LOCK)),
        // A driver of an earlier release (fixed socket names, no lock) publishes until it is gone.
        defer_to: sockets.per_pod.then(|| cli.registry_dir.join(plugin::registration_socket_name(DRIVER))),
        metrics: Some(metrics.clone()),
        health_engine: publish::HealthConfig {
            options: Some(actk_dra::health::default_options(
                Duration::from_millis(cli.health_recovery_ms),
                Duration::from_millis(cli.health_interval_ms),
            )),
            taints: taint_mode,
            report: Some((Arc::new(health_tx), node.name.clone())),
        },
        dynamic_mig,
    };
    // Registration before publication: the publisher discovers and hands the driver its
    // inventory at once, but publishes only once the kubelet has registered the driver.
    let (status_tx, status_rx) = watch::channel(None);
    let publisher = tokio::spawn(publish::run(
        cfg,
        ApiSink { client: client.clone(), node: node.clone() },
        first_generation,
        inv_tx,
        status_rx,
    ));
    // Serve the DRA socket once the first inventory is there, then announce it to the kubelet.
    let mut first = inv_rx.clone();
    let _ = first.wait_for(|i| !i.root.as_os_str().is_empty()).await;
    let dra_sock = sockets.dra.clone();
    let (ready_tx, ready_rx) = oneshot::channel();
    let health = actk_dra::health::HealthService { reports: health_rx, heartbeat: actk_dra::health::HEARTBEAT };
    tokio::spawn(plugin::serve(
        dra_sock.clone(),
        Socket::DraWithHealth(DraService(driver.clone()), health),
        Some(ready_tx),
    ));
    let _ = ready_rx.await;
    let mut registered = status_tx.subscribe();
    let registrar = Arc::new(Registrar { name: DRIVER.into(), endpoint: dra_sock.clone(), status: status_tx });
    let reg_sock = sockets.registration.clone();
    // Ready (the readiness probe's file) while the kubelet has this process registered: a
    // rolling update stops the old pod only then.
    {
        let metrics = metrics.clone();
        let ready_file = cli.ready_file.clone();
        tokio::spawn(async move {
            loop {
                let yes = publish::is_registered(&registered.borrow_and_update());
                metrics.set_registered(yes);
                if let Some(f) = &ready_file {
                    let r = if yes { std::fs::write(f, b"registered\n") } else { remove_if_there(f) };
                    if let Err(e) = r {
                        tracing::warn!("readiness file {}: {e}", f.display());
                    }
                }
                if registered.changed().await.is_err() {
                    return;
                }
            }
        });
    }
    tokio::spawn(plugin::serve(reg_sock.clone(), Socket::Registration(registrar), None));
    tracing::info!(
        "DRA driver {DRIVER} for node {}: serving {} and {}",
        node.name,
        dra_sock.display(),
        reg_sock.display()
    );
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    // Slices first, while the kubelet can still prepare what was allocated: once they are gone
    // the scheduler binds no more claims here; the next driver process publishes again after
    // its own registration. Then the kubelet deregisters the driver when its registration
    // socket goes. Specs and the checkpoint stay for the next driver process (running
    // containers keep their devices).
    publisher.abort();
    if let Some(f) = &cli.ready_file {
        let _ = remove_if_there(f);
    }
    let others = plugin::others_alive(&cli.registry_dir, DRIVER, &reg_sock);
    if !others.is_empty() {
        // A rolling update: the newer process takes the pool over (it waits for the publisher
        // lock this one held), and keeps the servers file as it is.
        tracing::info!(
            "another driver process serves this node ({}); leaving the pool to it",
            others.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
        );
        let _ = std::fs::remove_file(&reg_sock);
        let _ = std::fs::remove_file(&dra_sock);
        tracing::info!("stopped");
        return Ok(());
    }
    if let Some(f) = &cli.servers_file {
        // Nothing of the driver serves the node any more: the device plugin may serve it all.
        let _ = remove_if_there(f);
    }
    match tokio::time::timeout(Duration::from_secs(10), actk_dra::kube::withdraw(&client, &node.name)).await {
        Ok(Ok(n)) => tracing::info!("withdrew the pool's {n} ResourceSlice(s)"),
        Ok(Err(e)) => tracing::warn!(
            "cannot withdraw the ResourceSlices: {e}; the kubelet removes them 30 s after the driver is gone"
        ),
        Err(_) => tracing::warn!(
            "withdrawing the ResourceSlices timed out; the kubelet removes them 30 s after the driver is gone"
        ),
    }
    let _ = std::fs::remove_file(&reg_sock);
    let _ = std::fs::remove_file(&dra_sock);
    tracing::info!("stopped");
    Ok(())
}

/// Removes `f`; a file that is not there is fine.
fn remove_if_there(f: &std::path::Path) -> std::io::Result<()> {
    match std::fs::remove_file(f) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}
