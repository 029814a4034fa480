//! actk-nri: the NRI plugin's process (see the library docs). Connects to the runtime's NRI
//! socket, registers as `IDX-NAME`, and serves until stopped; reconnects when the runtime
//! restarts. Configuration: the actk config file (`ACTK_CONFIG`, else `actk.toml` beside this
//! executable, else /etc/actk/config.toml:
//! host root, spec_dirs, profiles, hook_path, log level), as actk-runtime reads it.

use actk_core::config::Config;
use actk_nri::planner::Planner;
use actk_nri::plugin::{self, Registration};
use anyhow::{Context, Result, bail};
use clap::Parser;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// actk NRI plugin: accelerators for containerd 2 / CRI-O containers without a runtime shim.
#[derive(Parser, Debug)]
#[command(version = actk_version::LONG)]
struct Args {
    /// The runtime's NRI socket.
    #[arg(long, env = "NRI_SOCKET_PATH", default_value = "/var/run/nri/nri.sock")]
    socket: PathBuf,
    /// Plugin name to register.
    #[arg(long, env = "NRI_PLUGIN_NAME", default_value = "actk")]
    name: String,
    /// Plugin index, two digits: plugins are called in ascending index order.
    #[arg(long, env = "NRI_PLUGIN_IDX", default_value = "10")]
    idx: String,
    /// Rediscover the host at least this often (seconds), besides on device or driver changes.
    #[arg(long, default_value_t = 60)]
    rediscover_seconds: u64,
    /// Where the node's `/` is mounted in this container (`/host`): taken off the host paths
    /// that discovery of the config's `root` (e.g. `/host`) reports, so the adjustment names
    /// the node's own paths.
    #[arg(long)]
    host_mount: Option<PathBuf>,
    /// Write the NRI gate's CDI spec (actk.dev/nri-plugin=required) into this directory at
    /// start, so that containers the device plugin gated fail, naming this plugin, when it did
    /// not serve them (see actk_nri::gate).
    #[arg(long, env = "ACTK_NRI_GATE_SPEC_DIR")]
    gate_spec_dir: Option<PathBuf>,
    /// Post a Warning Event (reason ActkNriNotServed) on the pod of each running container that
    /// was created while this plugin was not serving and runs without its devices (found when
    /// the plugin connects), through the API server with the pod's service account (events
    /// create). For nodes without the gate (see actk_nri::events).
    #[arg(long, env = "ACTK_NRI_POST_EVENTS")]
    post_events: bool,
    /// This node's name, for the Events' reporting instance (the chart passes spec.nodeName).
    #[arg(long, env = "NODE_NAME", default_value = "")]
    node_name: String,
}

fn main() -> Result<()> {
    let a = Args::parse();
    if a.idx.len() != 2 || !a.idx.bytes().all(|b| b.is_ascii_digit()) {
        bail!("--idx {:?}: NRI plugin indexes are two digits (00-99)", a.idx);
    }
    if a.name.is_empty() || a.name.contains(['/', ' ']) {
        bail!("--name {:?}: a plugin name is a non-empty word", a.name);
    }
    let path = Config::path();
    let config = Config::load_default().with_context(|| format!("loading the actk config {}", path.display()))?;
    let filter = tracing_subscriber::EnvFilter::try_new(&config.log_level)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // stderr (the pod's log), and the config's log_file as well when one is set, as
    // actk-runtime and actk-hook write theirs (issue 25 item 11).
    let log_file = config.log_file.as_ref().and_then(|p| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(p)
            .map_err(|e| eprintln!("actk-nri: warning: cannot open log file {}: {e}", p.display()))
            .ok()
    });
    let fmt = tracing_subscriber::fmt().with_env_filter(filter).with_target(false);
    match log_file {
        Some(f) => {
            use tracing_subscriber::fmt::writer::MakeWriterExt;
            fmt.with_ansi(false).with_writer(std::io::stderr.and(std::sync::Mutex::new(f))).init();
        }
        // Colour only on a terminal: `kubectl logs` of the pod must be plain text.
        None => fmt.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())).init(),
    }
    let rediscover = Duration::from_secs(a.rediscover_seconds.max(1));
    if let Some(m) = a.host_mount.as_ref().filter(|m| !m.is_absolute()) {
        bail!("--host-mount {}: must be absolute", m.display());
    }
    let planner =
        Arc::new(Planner::new(&config, rediscover, a.host_mount.clone()).context("cannot load vendor profiles")?);
    // One thread serves the socket; planning runs on the blocking pool.
    let rt =
        tokio::runtime::Builder::new_current_thread().enable_all().build().context("cannot start the async runtime")?;
    let reg = Registration { name: a.name, idx: a.idx };
    if let Some(dir) = &a.gate_spec_dir {
        let path = actk_nri::gate::write(dir, &reg.id())
            .with_context(|| format!("--gate-spec-dir {}: writing the NRI gate's CDI spec", dir.display()))?;
        tracing::info!("NRI gate {} written to {}", actk_nri::gate::CDI_NAME, path.display());
    }
    rt.block_on(async move {
        let notifier = if a.post_events {
            match actk_nri::events::Notifier::new(a.node_name.clone(), reg.id()).await {
                Ok(n) => Some(Arc::new(n)),
                // Serving devices matters more than telling about the ones missed: go on.
                Err(e) => {
                    tracing::error!("--post-events: {e:#}; unserved containers are only logged");
                    None
                }
            }
        } else {
            None
        };
        let p = planner.clone();
        // Periodic rediscovery, off the request path.
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(rediscover).await;
                let p = p.clone();
                let _ = tokio::task::spawn_blocking(move || p.refresh(false)).await;
            }
        });
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            r = plugin::run(&a.socket, reg, planner, notifier) => r,
            _ = term.recv() => Ok(()),
            _ = tokio::signal::ctrl_c() => Ok(()),
        }
    })
}
