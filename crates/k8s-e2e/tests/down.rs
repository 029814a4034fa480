//! `scripts/k8s-node.sh down` stops everything of the test cluster and leaves no process, mount,
//! cgroup, socket or CDI spec behind, even with pods running and the node setup done.
//! `make test` runs this last, after the other cluster tests (it ends the cluster they share).

use actk_testsupport::cluster::{Cluster, PodSpec};
use anyhow::Result;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Processes whose command line names one of `needles`: `pid cmdline` lines.
fn processes_naming(needles: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
        if pid == std::process::id() {
            continue;
        }
        let Ok(raw) = std::fs::read(e.path().join("cmdline")) else { continue };
        let cmd = String::from_utf8_lossy(&raw).replace('\0', " ");
        if needles.iter().any(|n| cmd.contains(n)) {
            out.push(format!("{pid} {cmd}"));
        }
    }
    out
}

fn mounts_under(dirs: &[&str]) -> Vec<String> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    text.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| dirs.iter().any(|d| m == d || m.starts_with(&format!("{d}/"))))
        .map(str::to_string)
        .collect()
}

fn sockets_under(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let Ok(ft) = e.file_type() else { continue };
        if ft.is_dir() {
            sockets_under(&e.path(), out);
        } else if std::os::unix::fs::FileTypeExt::is_socket(&ft) {
            out.push(e.path());
        }
    }
}

#[test]
#[ignore = "needs the test cluster: make test runs it alone, last"]
fn k8s_node_down_leaves_nothing_behind() -> Result<()> {
    let Some(dgx) = actk_testsupport::fixture::prepare("nvidia-dgx-h100")? else { return Ok(()) };
    let Some(c) = Cluster::start(&Default::default())? else { return Ok(()) };
    c.install(&dgx.root, "config:\n  strategies: [cdi-cri]\nnodeSetup:\n  enabled: true\n")?;
    c.wait_allocatable("nvidia.com/gpu", 8)?;
    c.wait_until("node setup done", Duration::from_secs(120), || {
        Ok(c.kubectl(&["get", "runtimeclass", "actk"]).status.success().then_some(()))
    })?;
    c.create_pod(&PodSpec::new("down-sleeper", "exec sleep 3600").limit("nvidia.com/gpu", 2))?;
    c.wait_pod_phase("down-sleeper", &["Running"], Duration::from_secs(120))
        .map_err(|e| anyhow::anyhow!("{e}; plugin log:\n{}", c.plugin_logs()))?;

    let state = c.env("STATE_DIR").to_string();
    let run = c.env("RUN_DIR").to_string();
    let cdi = c.env("CDI_DIR").to_string();
    let kube_bin = Path::new(c.env("KUBECTL")).parent().unwrap().display().to_string();
    let cgroup = c.env("CGROUP_ROOT").to_string();
    assert!(!processes_naming(&[&state, &run]).is_empty(), "the cluster runs before down");
    assert!(std::fs::read_dir(&cdi)?.next().is_some(), "a spec is written before down");

    c.down()?;

    let procs = processes_naming(&[&state, &run, &kube_bin]);
    assert!(procs.is_empty(), "processes left: {procs:#?}");
    let shims =
        processes_naming(&["containerd-shim-runc-v2"]).into_iter().filter(|p| p.contains(&run)).collect::<Vec<_>>();
    assert!(shims.is_empty(), "shims left: {shims:#?}");
    let m = mounts_under(&[&state, &run]);
    assert!(m.is_empty(), "mounts left: {m:#?}");
    let cgroups: Vec<String> = std::fs::read_dir("/sys/fs/cgroup")?
        .flatten()
        .map(|h| h.path().join(cgroup.trim_start_matches('/')))
        .filter(|p| p.exists())
        .map(|p| p.display().to_string())
        .collect();
    assert!(cgroups.is_empty(), "cgroups left: {cgroups:?}");
    let mut socks = Vec::new();
    sockets_under(Path::new(&state), &mut socks);
    sockets_under(Path::new(&run), &mut socks);
    assert!(socks.is_empty(), "sockets left: {socks:?}");
    assert!(!Path::new(&run).exists(), "{run} (sockets, pids, CDI specs) is removed");
    assert!(!Path::new(&cdi).exists(), "no CDI spec left in {cdi}");
    assert!(dgx.path("/dev/nvidia0").exists(), "the fixture root is the test's, untouched");
    Ok(())
}
