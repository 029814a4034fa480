//! `actk system create-dev-char-symlinks`: /dev/char/MAJOR:MINOR links for the accelerator
//! nodes, so device rules handed to systemd survive `systemctl daemon-reload`
//! (actk_core::devchar; NVIDIA's `nvidia-ctk system create-dev-char-symlinks --create-all`).

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
    }
}
