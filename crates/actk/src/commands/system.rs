//! `actk system create-dev-char-symlinks`: /dev/char/MAJOR:MINOR links for the accelerator
//! nodes, so device rules handed to systemd survive `systemctl daemon-reload`
//! (actk_core::devchar; NVIDIA's `nvidia-ctk system create-dev-char-symlinks --create-all`).
//! `actk system nvml-snapshot`: NVML's view of the node as JSON, for the static actk-runtime.

use super::list::Source;
use std::path::PathBuf;

/// `actk system` subcommands.
#[derive(clap::Subcommand, Debug)]
pub enum Command {
    /// Create /dev/char/MAJOR:MINOR symlinks for every accelerator character node the host has
    /// (existing links are kept). Needed on systemd hosts: systemd drops a container's
    /// DeviceAllow rule for a node it cannot find under /dev/char, and `daemon-reload` then
    /// takes the GPU away from running containers. Run once at boot (and after the driver
    /// creates its nodes); actk-runtime also makes them for the nodes it injects when called
    /// with --systemd-cgroup.
    CreateDevCharSymlinks(DevCharArgs),
    /// Print what the root's NVML (its libnvidia-ml.so.1) says about the GPUs as one line of
    /// JSON: `{"Ok": snapshot}` (driver version, GPUs, MIG devices, NVLinks, failed calls) or
    /// `{"Err": why}`. The statically linked actk-runtime, which cannot load a library, runs
    /// the `actk` next to it with this command when a container asks for a MIG device and no
    /// CDI spec lists it.
    NvmlSnapshot(NvmlArgs),
}

/// Arguments of `actk system nvml-snapshot`.
#[derive(clap::Args, Debug)]
pub struct NvmlArgs {
    /// Host root whose NVML is loaded (resolved inside it: its ld.so.cache, then the driver's
    /// library directories).
    #[arg(long, default_value = "/")]
    pub root: PathBuf,
}

/// Arguments of `actk system create-dev-char-symlinks`.
#[derive(clap::Args, Debug)]
pub struct DevCharArgs {
    #[command(flatten)]
    pub source: Source,
    /// Directory of the links; default: `<root>/dev/char`.
    #[arg(long)]
    pub dev_char: Option<PathBuf>,
    /// Print the links that would be made, make none.
    #[arg(long)]
    pub dry_run: bool,
}

/// Runs an `actk system` subcommand.
pub fn run(c: Command) -> anyhow::Result<()> {
    match c {
        Command::CreateDevCharSymlinks(a) => {
            let (_, inv) = a.source.inventory()?;
            let nodes: Vec<_> = inv
                .vendors
                .iter()
                .flat_map(|v| v.devices.iter().flat_map(|d| d.nodes.iter()).chain(v.shared_nodes.iter()))
                .cloned()
                .collect();
            let dir = a.dev_char.clone().unwrap_or_else(|| inv.root.join("dev/char"));
            let links = if a.dry_run {
                actk_core::devchar::missing_links(&dir, &nodes)
            } else {
                actk_core::devchar::create_links(&dir, &nodes)?
            };
            for l in links {
                outln!("{} -> {}", l.link.display(), l.target.display())?;
            }
            Ok(())
        }
        Command::NvmlSnapshot(a) => {
            let host = actk_core::discover::HostRoot::new(a.root);
            let answer = actk_core::discover::nvml::read_here(&host);
            outln!("{}", serde_json::to_string(&answer)?)?;
            Ok(())
        }
    }
}
