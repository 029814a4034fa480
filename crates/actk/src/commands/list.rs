//! `actk list`: one line per accelerator device, like `nvidia-smi -L` or `neuron-ls`.

use actk_core::discover::discover_roots;
use actk_core::inventory::{Device, Inventory, MigDevice};
use actk_core::profile::{self, Profile};
use anyhow::Context;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Where to discover and with which profiles; shared by `actk list` and `actk info`.
#[derive(clap::Args, Debug, Clone)]
pub struct Source {
    /// Host root to discover devices under: `/`, a driver container's root such as
    /// /run/nvidia/driver, or a fixture directory.
    #[arg(long, env = "ACTK_ROOT", default_value = "/")]
    pub root: PathBuf,
    /// Where the driver's libraries, tools and firmware are when apart from --root (the GPU
    /// Operator's driver container: `--root / --driver-root /run/nvidia/driver`); default: --root.
    #[arg(long, env = "ACTK_DRIVER_ROOT")]
    pub driver_root: Option<PathBuf>,
    /// Directory of user vendor profiles (`*.toml`); a missing directory means built-ins only.
    #[arg(long, env = "ACTK_PROFILES_DIR", default_value = profile::DEFAULT_PROFILES_DIR)]
    pub profiles_dir: PathBuf,
}

impl Source {
    /// Load the profiles and discover the host. Warnings are printed to stderr, one per line
    /// (`actk: warning: PATH: MESSAGE`). Errors: a profile file that does not load.
    pub fn inventory(&self) -> anyhow::Result<(Vec<Profile>, Inventory)> {
        let profiles = profile::load(Some(&self.profiles_dir))
            .with_context(|| format!("loading vendor profiles from {}", self.profiles_dir.display()))?;
        let inv = discover_roots(&self.root, self.driver_root.as_deref().unwrap_or(&self.root), &profiles);
        print_warnings(&inv);
        Ok((profiles, inv))
    }
}

/// Print discovery warnings to stderr.
pub fn print_warnings(inv: &Inventory) {
    let mut err = std::io::stderr().lock();
    for w in &inv.warnings {
        let _ = writeln!(err, "actk: warning: {w}");
    }
}

/// Arguments of `actk list`.
#[derive(clap::Args, Debug)]
#[command(after_long_help = "\
Output: one line per device, vendors in profile order, devices in index order:
  KIND INDEX: MODEL (UUID: ID) bus PCI-BUS-ID numa NODE [cores N] nodes DEVICE-NODES [mig on|off]
and under a GPU with MIG on, one line per MIG device as nvidia-smi -L prints them:
    MIG PROFILE Device N: (UUID: MIG-ID) gi G ci C placement START+SIZE nodes CAP-NODES
Parts the host does not report are left out. A host without accelerators prints nothing and
exits 0. Discovery warnings (odd host state) go to stderr.

--json prints the inventory as one JSON object (documented in docs/inventory-json.md):
  {root, vendors: [{profile, kind, driver_version, devices: [{index, model, uuid,
   pci_bus_id, numa_node, nodes: [{path, host_path, node_type, major, minor, file_mode, gid}],
   links, cores, attributes, mig: {enabled, devices: [{index, uuid, gpu_instance,
   compute_instance, profile, gi_profile_id, placement: {start, size}, memory_mib,
   multiprocessors, nodes}]}}], shared_nodes, host_files: [{capability, kind, host_path,
   container_path}], mig_capabilities: {config, monitor}}], warnings: [{path, message}]}
Field names are stable; new fields may be added.")]
pub struct Args {
    /// Print the whole inventory as JSON instead of one line per device.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub source: Source,
}

/// Run `actk list`.
pub fn run(a: Args) -> anyhow::Result<()> {
    let (_, inv) = a.source.inventory()?;
    let mut out = std::io::stdout().lock();
    if a.json {
        serde_json::to_writer_pretty(&mut out, &inv).context("writing JSON")?;
        writeln!(out)?;
    } else {
        for v in &inv.vendors {
            for d in &v.devices {
                writeln!(out, "{}", device_line(&v.kind, d))?;
                for m in d.mig.iter().flat_map(|m| &m.devices) {
                    writeln!(out, "{}", mig_line(m))?;
                }
            }
        }
    }
    Ok(())
}

/// One `actk list` line for device `d` of kind `kind`.
pub fn device_line(kind: &str, d: &Device) -> String {
    let mut s = format!("{kind} {}: {}", d.index, d.model.as_deref().unwrap_or("(unknown model)"));
    if let Some(u) = &d.uuid {
        s.push_str(&format!(" (UUID: {u})"));
    }
    if let Some(b) = &d.pci_bus_id {
        s.push_str(&format!(" bus {b}"));
    }
    if let Some(n) = d.numa_node {
        s.push_str(&format!(" numa {n}"));
    }
    if let Some(c) = d.cores {
        s.push_str(&format!(" cores {c}"));
    }
    if !d.nodes.is_empty() {
        let nodes: Vec<&str> = d.nodes.iter().map(|n| n.path.as_str()).collect();
        s.push_str(&format!(" nodes {}", nodes.join(" ")));
    }
    if let Some(m) = &d.mig {
        s.push_str(if m.enabled { " mig on" } else { " mig off" });
    }
    // A partition of a partitioned GPU (AMD CPX/DPX/QPX): its number and the GPU's modes.
    if let Some(p) = d.attributes.get("partition") {
        let mode = |k: &str| d.attributes.get(k).map(String::as_str).unwrap_or("?");
        s.push_str(&format!(" partition {p} ({}, {})", mode("compute_partition"), mode("memory_partition")));
    }
    s
}

/// The `actk list` line of a MIG device, indented under its GPU as `nvidia-smi -L` does:
/// `  MIG 3g.40gb Device 0: (UUID: MIG-…) gi 2 ci 0 placement 4+4 nodes /dev/nvidia-caps/…`.
pub fn mig_line(m: &MigDevice) -> String {
    let mut s = format!(
        "  MIG {} Device {}: (UUID: {}) gi {} ci {} placement {}+{}",
        m.profile, m.index, m.uuid, m.gpu_instance, m.compute_instance, m.placement.start, m.placement.size
    );
    if !m.nodes.is_empty() {
        let nodes: Vec<&str> = m.nodes.iter().map(|n| n.path.as_str()).collect();
        s.push_str(&format!(" nodes {}", nodes.join(" ")));
    }
    s
}

/// The root as given, for messages.
pub fn show_root(root: &Path) -> String {
    root.display().to_string()
}
