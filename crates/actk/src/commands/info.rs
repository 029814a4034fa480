//! `actk info`: driver versions, CDI kinds, and what a request for each device would inject.

use super::list::{Source, show_root};
use actk_core::inventory::{DeviceNode, HostFile};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Arguments of `actk info`.
#[derive(clap::Args, Debug)]
#[command(after_long_help = "\
For each vendor found: its CDI kind, driver version, how containers select its devices, the
shared nodes every request gets, the host files mounted per capability, and per device the
qualified CDI name and its own device nodes. A request for a device injects its nodes, the
shared nodes, and the mounts of the requested capabilities (plus `base`).")]
pub struct Args {
    #[command(flatten)]
    pub source: Source,
}

fn node_text(n: &DeviceNode) -> String {
    format!("{} ({} {}:{})", n.path, n.node_type, n.major, n.minor)
}

/// Run `actk info`.
pub fn run(a: Args) -> anyhow::Result<()> {
    let (profiles, inv) = a.source.inventory()?;
    let mut s = String::new();
    writeln!(s, "root: {}", show_root(&inv.root))?;
    if inv.vendors.is_empty() {
        writeln!(s, "no accelerators found")?;
    }
    for v in &inv.vendors {
        let p = profiles.iter().find(|p| p.name == v.profile);
        writeln!(s, "\n{} (profile {})", v.kind, v.profile)?;
        writeln!(s, "  driver version: {}", v.driver_version.as_deref().unwrap_or("unknown"))?;
        writeln!(s, "  devices: {}", v.devices.len())?;
        if let Some(p) = p {
            if !p.selection.env.is_empty() {
                writeln!(s, "  selected by: {}", p.selection.env.join(", "))?;
            }
            if let Some(c) = &p.selection.capabilities_env {
                writeln!(s, "  capabilities from: {c} (default {})", p.selection.default_capabilities.join(","))?;
            }
            if let Some(c) = &p.selection.cores_env {
                writeln!(s, "  cores selected by: {c}")?;
            }
            if !p.kubernetes.resources.is_empty() {
                writeln!(s, "  kubernetes resources: {}", p.kubernetes.resources.join(", "))?;
            }
        }
        writeln!(s, "  shared nodes (every request):")?;
        if v.shared_nodes.is_empty() {
            writeln!(s, "    (none)")?;
        }
        for n in &v.shared_nodes {
            writeln!(s, "    {}", node_text(n))?;
        }
        let mut by_cap: BTreeMap<&str, Vec<&HostFile>> = BTreeMap::new();
        for f in &v.host_files {
            by_cap.entry(f.capability.as_str()).or_default().push(f);
        }
        writeln!(s, "  mounts by capability (read-only bind mounts):")?;
        if by_cap.is_empty() {
            writeln!(s, "    (none)")?;
        }
        for (cap, files) in &by_cap {
            writeln!(s, "    {cap}:")?;
            for f in files {
                let kind = format!("{:?}", f.kind).to_lowercase();
                if f.host_path.ends_with(f.container_path.trim_start_matches('/'))
                    && f.container_path.rsplit('/').next() == f.host_path.file_name().and_then(|n| n.to_str())
                {
                    writeln!(s, "      {} [{kind}]", f.container_path)?;
                } else {
                    writeln!(s, "      {} [{kind}] from {}", f.container_path, f.host_path.display())?;
                }
            }
        }
        writeln!(s, "  per device (plus the shared nodes and mounts above):")?;
        for d in &v.devices {
            let id = d.uuid.as_deref().map(|u| format!(" {u}")).unwrap_or_default();
            let nodes: Vec<String> = d.nodes.iter().map(node_text).collect();
            let nodes = if nodes.is_empty() { "(no device node)".to_string() } else { nodes.join(", ") };
            writeln!(s, "    {}={}{id}: {nodes}", v.kind, d.index)?;
        }
    }
    out!("{s}")?;
    Ok(())
}
