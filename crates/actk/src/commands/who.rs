//! `actk who`: which pod, container or plain container holds each accelerator of this node, for
//! every vendor (crates/actk-holders): the kubelet's PodResources allocations (device plugin and
//! DRA) when the node runs a kubelet, and the running containers of the OCI runtimes' state
//! directories (actk's applied-devices annotation, device nodes, Docker's `--gpus` hook).

use actk_core::config::Config;
use actk_core::plan::PlanContext;
use actk_holders::{DeviceHolders, podresources, runtime_state};
use anyhow::{Context, bail};
use std::path::PathBuf;

/// Arguments of `actk who`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Host root whose devices are listed; default: `root` of the config file, else `/`.
    #[arg(long, env = "ACTK_ROOT")]
    pub root: Option<PathBuf>,
    /// The kubelet's PodResources socket. When it does not exist (no kubelet) or does not answer
    /// (a warning says so), only running containers are shown; `none`: do not ask the kubelet.
    #[arg(long, default_value = podresources::DEFAULT_SOCKET)]
    pub pod_resources: String,
    /// OCI runtime state root to read containers from (runc's or crun's `--root`), repeatable;
    /// default: /run/runc, /run/crun, /run/docker/runtime-*/moby, /run/containerd/runc/*.
    #[arg(long = "state-root")]
    pub state_roots: Vec<PathBuf>,
    /// Docker's data root, for container names.
    #[arg(long, default_value = "/var/lib/docker")]
    pub docker_root: PathBuf,
    /// Print JSON (one object per device: kind, index, uuid, model, holders) instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Runs `actk who`. Errors: the config or profiles cannot be read, the host root is missing. A
/// kubelet socket that does not answer `List` is a warning: running containers are still shown.
pub fn run(a: Args) -> anyhow::Result<()> {
    let config_path = Config::path();
    let mut config =
        Config::load_default().with_context(|| format!("loading the actk config file {}", config_path.display()))?;
    if let Some(r) = a.root {
        config.driver_root = None;
        config.root = r;
    }
    if !config.root.is_dir() {
        bail!(
            "host root {} does not exist or is not a directory (--root / ACTK_ROOT / root in the config file)",
            config.root.display()
        );
    }
    let mut ctx = PlanContext::from_config(&config).context("loading vendor profiles")?;
    let inventory = actk_core::discover::discover_roots(&config.root, config.driver_root(), &ctx.profiles);
    ctx.inventory = Some(inventory.clone());

    let socket = PathBuf::from(&a.pod_resources);
    let allocations = if a.pod_resources == "none" || !socket.exists() {
        Vec::new()
    } else {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting tokio")?;
        let listed = rt.block_on(async {
            tokio::time::timeout(std::time::Duration::from_secs(10), podresources::list(&socket)).await
        });
        // A stopped kubelet leaves its socket behind: what the runtimes show is still worth
        // seeing, so the kubelet's part is reported missing rather than failing the command.
        match listed {
            Ok(Ok(a)) => a,
            Ok(Err(e)) => {
                eprintln!("actk: warning: {e}; kubelet allocations are not shown");
                Vec::new()
            }
            Err(_) => {
                eprintln!(
                    "actk: warning: the kubelet did not answer PodResources List on {} within 10 s; kubelet allocations are not shown",
                    socket.display()
                );
                Vec::new()
            }
        }
    };
    let roots = if a.state_roots.is_empty() { runtime_state::default_roots() } else { a.state_roots };
    let opts = runtime_state::ScanOptions { docker_root: Some(a.docker_root), plan: Some(&ctx) };
    let (containers, notes) = runtime_state::scan(&roots, &opts);
    for n in &notes {
        tracing::warn!("{n}");
    }
    let devices = actk_holders::attribute(&inventory, &allocations, &containers);
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&devices)?)?;
        return Ok(());
    }
    print_table(&devices)
}

/// One line per holder (a free device gets one line with `-`): KIND INDEX UUID HOLDER VIA.
fn print_table(devices: &[DeviceHolders]) -> anyhow::Result<()> {
    if devices.is_empty() {
        eprintln!("actk: no accelerator devices found");
        return Ok(());
    }
    let mut rows = vec![["KIND".to_string(), "INDEX".into(), "UUID".into(), "HOLDER".into(), "VIA".into()]];
    for d in devices {
        let uuid = d.uuid.clone().unwrap_or_else(|| "-".into());
        if d.holders.is_empty() {
            rows.push([d.kind.clone(), d.index.to_string(), uuid.clone(), "-".into(), String::new()]);
        }
        for h in &d.holders {
            let mut who = match (&h.namespace, &h.pod) {
                (Some(ns), Some(pod)) => format!("pod {ns}/{pod} container {}", h.container.as_deref().unwrap_or("?")),
                _ => {
                    let id = h.container_id.as_deref().map(|i| &i[..i.len().min(12)]).unwrap_or("?");
                    match &h.container {
                        Some(n) => format!("{} {n} ({id})", h.engine),
                        None => format!("{} {id}", h.engine),
                    }
                }
            };
            if let (Some(_), Some(id)) = (&h.pod, &h.container_id) {
                who.push_str(&format!(" ({} {})", h.engine, &id[..id.len().min(12)]));
            }
            if let Some(p) = &h.part {
                who.push_str(&format!(" [{p}]"));
            }
            rows.push([d.kind.clone(), d.index.to_string(), uuid.clone(), who, h.via.clone()]);
        }
    }
    let width = |c: usize| rows.iter().map(|r| r[c].len()).max().unwrap_or(0);
    let w = [width(0), width(1), width(2), width(3)];
    for r in &rows {
        let line = format!(
            "{:<w0$}  {:<w1$}  {:<w2$}  {:<w3$}  {}",
            r[0],
            r[1],
            r[2],
            r[3],
            r[4],
            w0 = w[0],
            w1 = w[1],
            w2 = w[2],
            w3 = w[3]
        );
        outln!("{}", line.trim_end())?;
    }
    Ok(())
}
