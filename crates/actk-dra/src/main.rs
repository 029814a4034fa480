//! actk-dra-driver: the DRA driver of actk (driver name `actk.dev`, resource.k8s.io/v1,
//! Kubernetes 1.34+). On each node it publishes the node's accelerators of every served profile
//! as one ResourceSlice pool, keeps it current, and prepares allocated claims as transient CDI
//! specs for the kubelet. Runs until SIGTERM/SIGINT.

use actk_dra::claim::SpecOptions;
use actk_dra::driver::Driver;
use actk_dra::plugin::{self, Socket};
use actk_dra::publish::{self, ApiSink, PublishConfig};
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
    #[arg(long, env = "NODE_NAME")]
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
    #[arg(long, env = "ACTK_DRA_REDISCOVER_INTERVAL_MS", default_value_t = 5000)]
    rediscover_interval_ms: u64,
    /// Publish kinds that a device plugin also advertises on this node (off: they are left out).
    #[arg(long, env = "ACTK_DRA_ALLOW_DEVICE_PLUGIN_OVERLAP")]
    allow_device_plugin_overlap: bool,
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("ACTK_LOG").unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        // Colour only on a terminal: `kubectl logs` of the pod must be plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
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
    let profiles = actk_core::profile::load(cli.profiles_dir.as_deref()).context("loading vendor profiles")?;
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
    let driver = Arc::new(Driver::new(
        node.name.clone(),
        profiles.clone(),
        cli.cdi_dir.clone(),
        cli.plugin_dir.join(actk_dra::checkpoint::FILE_NAME),
        SpecOptions {
            host_mount: cli.host_mount.clone(),
            capabilities: cli.capabilities.clone(),
            ldcache_hook: cli.ldcache_hook.clone(),
        },
        inv_rx.clone(),
        Arc::new(actk_dra::kube::ApiClaims(client.clone())),
    )?);
    driver.remove_orphan_specs().await;
    let cfg = PublishConfig {
        root: cli.root.clone(),
        profiles,
        served,
        health: Duration::from_millis(cli.health_interval_ms),
        rediscover: Duration::from_millis(cli.rediscover_interval_ms),
        allow_device_plugin_overlap: cli.allow_device_plugin_overlap,
    };
    tokio::spawn(publish::run(cfg, ApiSink { client: client.clone(), node: node.clone() }, first_generation, inv_tx));
    // Serve the DRA socket once the first inventory is there, then announce it to the kubelet.
    let mut first = inv_rx.clone();
    let _ = first.wait_for(|i| !i.root.as_os_str().is_empty()).await;
    let dra_sock = cli.plugin_dir.join("dra.sock");
    let (ready_tx, ready_rx) = oneshot::channel();
    tokio::spawn(plugin::serve(dra_sock.clone(), Socket::Dra(DraService(driver.clone())), Some(ready_tx)));
    let _ = ready_rx.await;
    let (status_tx, _status_rx) = watch::channel(None);
    let registrar = Arc::new(Registrar { name: DRIVER.into(), endpoint: dra_sock.clone(), status: status_tx });
    let reg_sock = cli.registry_dir.join(plugin::registration_socket_name(DRIVER));
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
    // The kubelet deregisters the driver when its registration socket goes; specs and the
    // checkpoint stay for the next driver process (running containers keep their devices).
    let _ = std::fs::remove_file(&reg_sock);
    let _ = std::fs::remove_file(&dra_sock);
    tracing::info!("stopped");
    Ok(())
}
