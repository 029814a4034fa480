//! actk-exporter: serves every accelerator's telemetry of this node on `GET /metrics`
//! (crate docs list the metrics), each device labelled with the pod that holds it.

use actk_exporter::Exporter;
use actk_holders::podresources;
use anyhow::{Context, Result};
use clap::Parser;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, Parser)]
#[command(name = "actk-exporter", version = actk_version::LONG, about = "Device telemetry of every accelerator vendor, per pod, for Prometheus")]
struct Cli {
    /// Host root to discover and read devices in (where the node's / is visible).
    #[arg(long, env = "ACTK_ROOT", default_value = "/")]
    root: PathBuf,
    /// Where the driver's files are (a driver container's root); default: the host root.
    #[arg(long, env = "ACTK_DRIVER_ROOT")]
    driver_root: Option<PathBuf>,
    /// Directory of user vendor profiles.
    #[arg(long, env = "ACTK_PROFILES_DIR")]
    profiles_dir: Option<PathBuf>,
    /// host:port to serve /metrics on.
    #[arg(long, env = "ACTK_EXPORTER_ADDRESS", default_value = "0.0.0.0:9500")]
    listen: SocketAddr,
    /// The kubelet's PodResources socket (`none`: do not attribute devices to pods).
    #[arg(long, env = "ACTK_POD_RESOURCES_SOCKET", default_value = podresources::DEFAULT_SOCKET)]
    pod_resources: String,
    /// Node name for the `node` label; default: the host name.
    #[arg(long, env = "NODE_NAME")]
    node_name: Option<String>,
    /// Seconds between discoveries (devices added or removed show up within this).
    #[arg(long, env = "ACTK_EXPORTER_REDISCOVER", default_value_t = 30)]
    rediscover: u64,
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("ACTK_LOG").unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        // Plain text in `kubectl logs` (issue 28 item 6), colour only on a terminal.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    anyhow::ensure!(
        cli.root.is_dir(),
        "host root {} does not exist or is not a directory (--root / ACTK_ROOT)",
        cli.root.display()
    );
    let profiles = actk_core::profile::load(cli.profiles_dir.as_deref()).context("loading vendor profiles")?;
    let node = cli.node_name.clone().unwrap_or_else(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname").map(|s| s.trim().to_string()).unwrap_or_default()
    });
    let driver_root = cli.driver_root.clone().unwrap_or_else(|| cli.root.clone());
    let exporter =
        Arc::new(Exporter::new(&cli.root, &driver_root, profiles, node, Duration::from_secs(cli.rediscover)));
    let socket = (cli.pod_resources != "none").then(|| PathBuf::from(&cli.pod_resources));
    // One thread drives the sockets; a scrape renders on a blocking thread, which waits for the
    // kubelet's answer through the runtime's handle while the main thread drives the IO.
    let rt = tokio::runtime::Builder::new_current_thread()
        .max_blocking_threads(2)
        .enable_all()
        .build()
        .context("starting tokio")?;
    let handle = rt.handle().clone();
    let warned = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let render: actk_node::metrics_http::Render = Arc::new(move || {
        let allocations = socket.as_ref().and_then(|s| {
            let listed =
                handle.block_on(async { tokio::time::timeout(Duration::from_secs(5), podresources::list(s)).await });
            let err = match listed {
                Ok(Ok(a)) => {
                    warned.store(false, std::sync::atomic::Ordering::Relaxed);
                    return Some(a);
                }
                Ok(Err(e)) => e.to_string(),
                Err(_) => format!("the kubelet did not answer PodResources List on {} within 5 s", s.display()),
            };
            // Said once until it answers again: a node without a kubelet scrapes every 15 s.
            if !warned.swap(true, std::sync::atomic::Ordering::Relaxed) {
                tracing::warn!("{err}; devices are not attributed to pods");
            }
            None
        });
        Ok(exporter.scrape(allocations.as_deref()))
    });
    rt.block_on(async move {
        let listener = actk_node::metrics_http::bind(cli.listen).await?;
        tracing::info!("metrics on http://{}/metrics", listener.local_addr()?);
        tokio::select! {
            () = actk_node::metrics_http::serve(listener, render) => {}
            _ = tokio::signal::ctrl_c() => tracing::info!("stopping"),
        }
        Ok(())
    })
}
