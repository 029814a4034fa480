//! Device cgroup access for injected nodes (OCI runtime-spec "Device allowlist").
//!
//! - cgroup v1: one `TYPE MAJOR:MINOR ACCESS` line per write to `devices.allow` of the container's
//!   devices cgroup: the cgroup path from `/proc/PID/cgroup` joined to the devices hierarchy's
//!   mount point from `/proc/self/mountinfo` (minus that mount's root).
//! - cgroup v2: an eBPF `BPF_PROG_TYPE_CGROUP_DEVICE` program, see [`crate::bpf`].

use crate::bpf::{self, DeviceRule};
use crate::error::{InjectError, Result};
use rustix::fs::{Mode, OFlags, ResolveFlags};
use std::path::PathBuf;

/// Which device controller governs a process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceController {
    /// cgroup v1: the directory of the process's devices cgroup on the host.
    V1(PathBuf),
    /// cgroup v2 (unified): the directory of the process's cgroup on the host.
    V2(PathBuf),
}

/// Parses `/proc/PID/cgroup` and `/proc/self/mountinfo` texts into the process's device controller.
/// A v1 `devices` line wins over the v2 `0::` line (hybrid hosts enforce through v1).
///
/// Errors: a message naming what was missing (no devices line, no mount of that hierarchy).
pub fn find_controller(proc_cgroup: &str, mountinfo: &str) -> std::result::Result<DeviceController, String> {
    let mut v1 = None;
    let mut v2 = None;
    for line in proc_cgroup.lines() {
        let mut it = line.splitn(3, ':');
        let (Some(_id), Some(ctrls), Some(path)) = (it.next(), it.next(), it.next()) else { continue };
        if ctrls.split(',').any(|c| c == "devices") {
            v1 = Some(path.to_string());
        } else if ctrls.is_empty() {
            v2 = Some(path.to_string());
        }
    }
    let mounts: Vec<(String, String, String, String)> = mountinfo
        .lines()
        .filter_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            let f: Vec<&str> = pre.split(' ').collect();
            let p: Vec<&str> = post.split(' ').collect();
            Some((
                unescape(f.get(3)?),
                unescape(f.get(4)?),
                p.first()?.to_string(),
                p.get(2).unwrap_or(&"").to_string(),
            ))
        })
        .collect();
    let join = |root: &str, mp: &str, path: &str| -> Option<PathBuf> {
        let rel = if root == "/" { path } else { path.strip_prefix(root)? };
        Some(PathBuf::from(mp).join(rel.trim_start_matches('/')))
    };
    if let Some(path) = v1 {
        for (root, mp, fstype, opts) in &mounts {
            if fstype == "cgroup"
                && opts.split(',').any(|o| o == "devices")
                && let Some(p) = join(root, mp, &path)
            {
                return Ok(DeviceController::V1(p));
            }
        }
        return Err(format!(
            "the devices cgroup {path} is not under any mounted v1 devices hierarchy in /proc/self/mountinfo"
        ));
    }
    if let Some(path) = v2 {
        for (root, mp, fstype, _) in &mounts {
            if fstype == "cgroup2"
                && let Some(p) = join(root, mp, &path)
            {
                return Ok(DeviceController::V2(p));
            }
        }
        return Err(format!("the cgroup2 path {path} is not under any mounted cgroup2 in /proc/self/mountinfo"));
    }
    Err("no devices (v1) or unified (v2) entry in /proc/PID/cgroup".into())
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Allows `rules` (allow rules only) for the container process `pid` (0: the caller's own cgroup).
///
/// `existing` are the container's own rules (config.json `linux.resources.devices`, in order):
/// on cgroup v2 they are kept in the replacement program together with
/// [`bpf::runtime_default_rules`], which makes it a superset of the runtime's; on v1 they are
/// already in force and only the new lines are appended.
///
/// Errors: [`InjectError::Cgroup`] naming the file or what was not found.
pub fn allow(pid: i32, existing: &[DeviceRule], rules: &[DeviceRule]) -> Result<DeviceController> {
    let err = |reason: String| InjectError::Cgroup { pid, reason };
    let proc_cgroup = if pid == 0 { "/proc/self/cgroup".to_string() } else { format!("/proc/{pid}/cgroup") };
    let pc = std::fs::read_to_string(&proc_cgroup).map_err(|e| err(format!("read {proc_cgroup}: {e}")))?;
    let mi =
        std::fs::read_to_string("/proc/self/mountinfo").map_err(|e| err(format!("read /proc/self/mountinfo: {e}")))?;
    let ctl = find_controller(&pc, &mi).map_err(err)?;
    match &ctl {
        DeviceController::V1(dir) => write_v1(dir, rules).map_err(err)?,
        DeviceController::V2(dir) => {
            // The runtime's program = the spec's rules followed by its defaults; ours come last.
            let mut all = existing.to_vec();
            all.extend(bpf::runtime_default_rules());
            all.extend_from_slice(rules);
            bpf::replace_program(dir, &all).map_err(err)?;
        }
    }
    Ok(ctl)
}

/// Appends one line per rule to `<dir>/devices.allow`, opening it beneath the cgroup directory
/// without following any symlink.
pub fn write_v1(dir: &std::path::Path, rules: &[DeviceRule]) -> std::result::Result<(), String> {
    let d = rustix::fs::open(dir, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
        .map_err(|e| format!("open {}: {e}", dir.display()))?;
    let f = rustix::fs::openat2(
        &d,
        "devices.allow",
        OFlags::WRONLY | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_XDEV,
    )
    .map_err(|e| format!("open {}/devices.allow: {e}", dir.display()))?;
    for r in rules.iter().filter(|r| r.allow) {
        let line = r.v1_line();
        // The kernel parses exactly one rule per write(2).
        rustix::io::write(&f, line.as_bytes())
            .map_err(|e| format!("write {line:?} to {}/devices.allow: {e}", dir.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MI: &str = "36 31 0:33 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices\n\
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n\
50 31 0:40 /docker /sys/fs/cgroup/my\\040devs rw - cgroup cgroup rw,devices\n";

    #[test]
    fn v1_devices_line_joined_to_mount_point() {
        let pc = "12:devices:/docker/abc\n0::/docker/abc\n";
        assert_eq!(find_controller(pc, MI).unwrap(), DeviceController::V1("/sys/fs/cgroup/devices/docker/abc".into()));
    }

    #[test]
    fn v2_only_uses_cgroup2_mount() {
        assert_eq!(
            find_controller("0::/x/y\n", MI).unwrap(),
            DeviceController::V2("/sys/fs/cgroup/unified/x/y".into())
        );
    }

    #[test]
    fn mount_root_is_stripped_and_escapes_decoded() {
        let mi = "50 31 0:40 /docker /sys/fs/cgroup/my\\040devs rw - cgroup cgroup rw,devices\n";
        assert_eq!(
            find_controller("3:devices:/docker/c1\n", mi).unwrap(),
            DeviceController::V1("/sys/fs/cgroup/my devs/c1".into())
        );
    }

    #[test]
    fn missing_hierarchy_is_a_clear_error() {
        let e = find_controller("3:devices:/x\n", "1 0 0:1 / / rw - ext4 /dev/sda rw\n").unwrap_err();
        assert!(e.contains("/x") && e.contains("devices"), "{e}");
    }

    #[test]
    fn v1_allow_writes_into_a_real_devices_cgroup() {
        let base = std::path::Path::new("/sys/fs/cgroup/devices");
        if !base.join("devices.allow").exists() {
            eprintln!("no cgroup v1 devices hierarchy here; skipped");
            return;
        }
        let dir = base.join(format!("actk-test-{}", std::process::id()));
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("devices.deny"), "a").unwrap();
        let rule = DeviceRule { allow: true, kind: 'c', major: Some(195), minor: Some(7), access: "rw".into() };
        let r = write_v1(&dir, &[rule]);
        let list = std::fs::read_to_string(dir.join("devices.list")).unwrap();
        std::fs::remove_dir(&dir).unwrap();
        r.unwrap();
        assert_eq!(list.trim(), "c 195:7 rw");
    }
}
