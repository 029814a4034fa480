//! `/dev/char/MAJOR:MINOR` symlinks for the accelerator character nodes, so that device cgroup
//! rules survive `systemctl daemon-reload` on systemd hosts (issue 13 item 7).
//!
//! Why: with the systemd cgroup driver (`runc --systemd-cgroup`, Docker's
//! `native.cgroupdriver=systemd`, podman on systemd), runc hands the container's device rules to
//! systemd as `DeviceAllow=/dev/char/195:0 rwm`. systemd resolves that path; udev creates
//! /dev/char links for the devices it knows, but the NVIDIA driver creates its nodes itself
//! (nvidia-modprobe), so /dev/char/195:0 is missing, systemd drops the rule, and the next
//! `daemon-reload` rewrites the cgroup's device policy without it: the GPU disappears from a
//! running container ("NVML: Unknown Error"). NVIDIA's answer is the same links
//! (`nvidia-ctk system create-dev-char-symlinks --create-all`); actk makes them with
//! `actk system create-dev-char-symlinks` and, for the nodes it injects, in actk-runtime when
//! the runtime is called with `--systemd-cgroup`.
//!
//! What links cannot fix: the hook path (`docker run --gpus`, actk-hook) writes device rules into
//! the cgroup itself, so systemd never knows them and a daemon-reload removes them whatever
//! /dev/char holds. Containers that must survive daemon-reload use the runtime path
//! (`--runtime actk`) or CDI, where runc passes the rules to systemd.
//!
//! Links are relative (`../nvidia0`, as udev makes them) when the node is in the same `dev`
//! directory, absolute otherwise (a driver root's node). An existing entry is left alone (udev's
//! link, or another tool's).

use crate::inventory::DeviceNode;
use std::io;
use std::path::{Path, PathBuf};

/// One link to make: `link` -> `target`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CharLink {
    /// `<dir>/195:0`.
    pub link: PathBuf,
    /// `../nvidia0` or an absolute host path.
    pub target: PathBuf,
}

/// The links `nodes` need in `dir` (`/dev/char` of the device root) that do not exist yet.
/// Only character nodes count (systemd's `DeviceAllow=/dev/char/...`); block devices have
/// /dev/block links from udev.
pub fn missing_links(dir: &Path, nodes: &[DeviceNode]) -> Vec<CharLink> {
    let dev = dir.parent().unwrap_or(Path::new("/"));
    let mut out: Vec<CharLink> = Vec::new();
    for n in nodes.iter().filter(|n| n.node_type == 'c') {
        let link = dir.join(format!("{}:{}", n.major, n.minor));
        if std::fs::symlink_metadata(&link).is_ok() || out.iter().any(|l| l.link == link) {
            continue;
        }
        let target = match n.host_path.strip_prefix(dev) {
            Ok(rel) => Path::new("..").join(rel),
            Err(_) => n.host_path.clone(),
        };
        out.push(CharLink { link, target });
    }
    out
}

/// The inventory form of CDI device node edits (numbers filled, `hostPath` or `path`), for
/// [`create_links`] on what a container is given.
pub fn nodes_of_edits(edits: &crate::cdi::ContainerEdits) -> Vec<DeviceNode> {
    edits
        .device_nodes
        .iter()
        .filter_map(|n| {
            Some(DeviceNode {
                path: n.path.clone(),
                host_path: PathBuf::from(n.host_path.as_deref().unwrap_or(&n.path)),
                node_type: n.node_type.as_deref().unwrap_or("c").chars().next()?,
                major: u32::try_from(n.major?).ok()?,
                minor: u32::try_from(n.minor?).ok()?,
                file_mode: n.file_mode,
                gid: n.gid,
            })
        })
        .collect()
}

/// Creates the [`missing_links`] (and `dir`, mode 0755). Returns the links made. A link that
/// appears meanwhile (a concurrent start, udev) is not an error.
///
/// Errors: `dir` cannot be created or a link cannot be made, with the path named.
pub fn create_links(dir: &Path, nodes: &[DeviceNode]) -> io::Result<Vec<CharLink>> {
    let links = missing_links(dir, nodes);
    if links.is_empty() {
        return Ok(links);
    }
    crate::cdi::write::create_dirs_0755(dir)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", dir.display())))?;
    let mut made = Vec::new();
    for l in links {
        match std::os::unix::fs::symlink(&l.target, &l.link) {
            Ok(()) => made.push(l),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io::Error::new(e.kind(), format!("{}: {e}", l.link.display()))),
        }
    }
    Ok(made)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(host: &Path, path: &str, kind: char, major: u32, minor: u32) -> DeviceNode {
        DeviceNode {
            path: path.into(),
            host_path: host.join(path.trim_start_matches('/')),
            node_type: kind,
            major,
            minor,
            file_mode: Some(0o666),
            gid: None,
        }
    }

    #[test]
    fn item7_char_links_relative_in_dev_absolute_elsewhere_existing_kept() {
        let root = tempfile::tempdir().unwrap();
        let driver = tempfile::tempdir().unwrap();
        let dir = root.path().join("dev/char");
        std::fs::create_dir_all(&dir).unwrap();
        std::os::unix::fs::symlink("../somewhere-udev-chose", dir.join("195:255")).unwrap();
        let nodes = vec![
            node(root.path(), "/dev/nvidia0", 'c', 195, 0),
            node(root.path(), "/dev/nvidiactl", 'c', 195, 255),
            node(root.path(), "/dev/nvidia-caps/nvidia-cap1", 'c', 236, 1),
            node(driver.path(), "/dev/nvidia-uvm", 'c', 510, 0),
            node(root.path(), "/dev/nvme0n1", 'b', 259, 0),
        ];
        let made = create_links(&dir, &nodes).unwrap();
        let got: Vec<(String, String)> = made
            .iter()
            .map(|l| (l.link.file_name().unwrap().to_string_lossy().into_owned(), l.target.display().to_string()))
            .collect();
        assert_eq!(
            got,
            [
                ("195:0".to_string(), "../nvidia0".to_string()),
                ("236:1".to_string(), "../nvidia-caps/nvidia-cap1".to_string()),
                ("510:0".to_string(), driver.path().join("dev/nvidia-uvm").display().to_string()),
            ]
        );
        assert_eq!(std::fs::read_link(dir.join("195:255")).unwrap(), Path::new("../somewhere-udev-chose"));
        assert!(create_links(&dir, &nodes).unwrap().is_empty(), "idempotent");
    }
}
