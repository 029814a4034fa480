//! `actk node setup` / `actk node teardown`: make a Kubernetes node run containers through
//! actk-runtime, from a pod that sees the node's `/` under `--host-mount` (the Helm chart's
//! node-setup DaemonSet), or on the node itself (`--host-mount /`).
//!
//! setup, in this order (teardown: unregister, restart containerd, and only then remove the
//! files, so that containerd no longer runs the runtime when its config, the node's policy,
//! goes):
//! 1. install their config `INSTALL_DIR/actk.toml`, then `actk-hook`, `actk` and `actk-runtime`
//!    (copied from next to this `actk`) into `INSTALL_DIR` (config: host root, CDI spec directories,
//!    hook path, and the node's trust policy `[policy]`: by default env and annotation requests
//!    only for privileged containers, the device list always, refusals as warnings, as
//!    SECURITY.md describes a Kubernetes node). The binaries find that config beside
//!    themselves (`actk_core::config::Config::path`), so nothing of the node's own /etc/actk
//!    is touched and the engine runs `INSTALL_DIR/actk-runtime` itself, not a `/bin/sh`
//!    wrapper that sets `ACTK_CONFIG` (one exec less per call, four per container). `actk`
//!    is there for the static actk-runtime's one use of it: reading NVML for a MIG device that
//!    no CDI spec names (`actk system nvml-snapshot`);
//! 2. register it with containerd: `actk runtime configure --runtime containerd` on the node's
//!    config file (a `.bak` keeps the original; teardown restores it byte for byte);
//! 3. restart containerd so it reads the file: SIGTERM to the process serving the containerd
//!    socket (found with SO_PEERCRED, so the pod needs `hostPID`), which its service manager
//!    starts again (systemd's containerd.service has `Restart=always`); running containers keep
//!    running (their shims stay). `--restart none` leaves the restart to the admin.
//!
//! With `--wait`, setup stays until SIGTERM or SIGINT and then tears down: a DaemonSet pod that
//! is deleted (`helm uninstall`) leaves the node as it found it.

use actk_core::policy::{OnRefused, Policy, PrivilegedMeans, Trust};
use anyhow::{Context, Result, bail};
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command as Process;
use std::time::{Duration, Instant};

/// What setup copies into the install directory from next to this `actk`, in the order it
/// copies them: actk-runtime last, so that a runtime already registered (setup run again, or
/// over an older layout) never runs before the hook and helper its config names are in place.
const INSTALLED_BINARIES: [&str; 3] = ["actk-hook", "actk", "actk-runtime"];

/// Suffix of the temporary file each installed file is written to before its rename.
const TMP_SUFFIX: &str = ".actk-tmp";

/// What an earlier layout installed (binaries in `bin/`, `config.toml`, and a `/bin/sh`
/// wrapper as `actk-runtime`): teardown removes these too, so a node set up by an older chart
/// is left clean.
const LEGACY_FILES: &[&str] = &["config.toml", "bin/actk-runtime", "bin/actk-hook"];

/// `actk node` subcommands.
#[derive(clap::Subcommand, Debug)]
pub enum Command {
    /// Install actk-runtime on the node and register it with containerd.
    Setup(Args),
    /// Undo `setup`: unregister, remove the installed files, restart containerd.
    Teardown(Args),
    /// Print or write the node labels discovery gives (actk.dev/, GFD's, AMD's labeller's).
    Labels(super::labels::Args),
}

/// How containerd learns about the changed config.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Restart {
    /// SIGTERM to containerd (its service manager starts it again).
    Signal,
    /// Nothing: restart containerd yourself.
    None,
}

/// Arguments of `actk node setup|teardown`. Paths are as on the node; this process reaches
/// them under `--host-mount`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Where the node's `/` is visible to this process (`/host` in the chart's pod).
    #[arg(long, default_value = "/")]
    pub host_mount: PathBuf,
    /// Directory on the node for actk-runtime, actk-hook, actk and their config (actk.toml): a
    /// directory of their own (teardown removes those names from it, and every actk binary
    /// there reads that actk.toml).
    #[arg(long, default_value = "/usr/local/actk")]
    pub install_dir: PathBuf,
    /// containerd's config file on the node.
    #[arg(long, default_value = "/etc/containerd/config.toml")]
    pub config: PathBuf,
    /// containerd's socket on the node.
    #[arg(long, default_value = "/run/containerd/containerd.sock")]
    pub socket: PathBuf,
    /// Runtime name to register (pods select it with a RuntimeClass whose handler is this name).
    #[arg(long, default_value = "actk")]
    pub name: String,
    /// Host root actk-runtime discovers devices in (`/`, or a driver container's root).
    #[arg(long, default_value = "/")]
    pub root: PathBuf,
    /// CDI spec directories actk-runtime reads (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "/etc/cdi,/var/run/cdi")]
    pub spec_dirs: Vec<PathBuf>,
    /// How containerd is made to read the changed config.
    #[arg(long, value_enum, default_value = "signal")]
    pub restart: Restart,
    /// setup only: stay until SIGTERM/SIGINT, then tear down.
    #[arg(long)]
    pub wait: bool,
    /// `policy.env_requests` of the installed config: `always`, `privileged` or `never`
    /// (SECURITY.md; chart: nodeSetup.policy.envRequests).
    #[arg(long, value_parser = parse_trust, default_value = "privileged")]
    pub env_requests: Trust,
    /// `policy.annotation_requests` (`cdi.k8s.io/*` annotations): `always`, `privileged` or `never`.
    #[arg(long, value_parser = parse_trust, default_value = "privileged")]
    pub annotation_requests: Trust,
    /// `policy.mount_requests` (the device plugin's `volume-mounts` device list).
    #[arg(long, value_parser = parse_trust, default_value = "always")]
    pub mount_requests: Trust,
    /// `policy.on_refused`: `warn` (drop the refused request, start the container) or `fail`.
    #[arg(long, value_parser = parse_on_refused, default_value = "warn")]
    pub on_refused: OnRefused,
    /// `policy.privileged_means`: which containers `privileged` trusts: `privileged-flag` (only
    /// `privileged: true`: CAP_SYS_ADMIN and a device cgroup allowing every device) or
    /// `cap-sys-admin` (also `capabilities.add: [SYS_ADMIN]`).
    #[arg(long, value_parser = parse_privileged_means, default_value = "privileged-flag")]
    pub privileged_means: PrivilegedMeans,
}

/// A `[policy]` value as config.toml spells it (serde's names, so the flag and the file agree).
fn parse_policy_value<T: serde::de::DeserializeOwned>(s: &str, allowed: &str) -> Result<T, String> {
    serde_json::from_value(serde_json::Value::String(s.to_string()))
        .map_err(|_| format!("{s:?} is not a policy value; use one of {allowed}"))
}

fn parse_trust(s: &str) -> Result<Trust, String> {
    parse_policy_value(s, "always, privileged, never")
}

fn parse_on_refused(s: &str) -> Result<OnRefused, String> {
    parse_policy_value(s, "warn, fail")
}

fn parse_privileged_means(s: &str) -> Result<PrivilegedMeans, String> {
    parse_policy_value(s, "privileged-flag, cap-sys-admin")
}

/// Runs an `actk node` subcommand.
pub fn run(c: Command) -> Result<()> {
    match c {
        Command::Setup(a) => {
            // Handlers first: a pod deleted while setup runs must still be torn down.
            let stop = super::Stop::install()?;
            setup(&a)?;
            if a.wait {
                println!("actk node setup: done; waiting for SIGTERM to tear down");
                while !stop.wait(Duration::from_secs(3600)) {}
                teardown(&a)?;
            }
            Ok(())
        }
        Command::Teardown(a) => teardown(&a),
        Command::Labels(a) => super::labels::run(a),
    }
}

/// `p` (a node path) as this process reaches it.
fn on_node(a: &Args, p: &Path) -> PathBuf {
    a.host_mount.join(p.strip_prefix("/").unwrap_or(p))
}

fn check(a: &Args) -> Result<()> {
    for (flag, p) in [("--install-dir", &a.install_dir), ("--config", &a.config), ("--socket", &a.socket)] {
        if !p.is_absolute() {
            bail!("{flag} {}: give the absolute path on the node", p.display());
        }
    }
    if !a.host_mount.is_dir() {
        bail!("--host-mount {}: not a directory (where the node's / is mounted)", a.host_mount.display());
    }
    Ok(())
}

/// `to` with [`TMP_SUFFIX`] appended (actk and actk.toml must not share one).
fn tmp_of(to: &Path) -> PathBuf {
    let mut t = to.as_os_str().to_owned();
    t.push(TMP_SUFFIX);
    PathBuf::from(t)
}

fn copy_exe(from: &Path, to: &Path) -> Result<()> {
    let tmp = tmp_of(to);
    std::fs::copy(from, &tmp).with_context(|| format!("copying {} to {}", from.display(), tmp.display()))?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))?;
    std::fs::rename(&tmp, to).with_context(|| format!("installing {}", to.display()))
}

fn write_file(to: &Path, text: &str, mode: u32) -> Result<()> {
    let tmp = tmp_of(to);
    let mut f = std::fs::File::create(&tmp).with_context(|| format!("writing {}", tmp.display()))?;
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode))?;
    std::fs::rename(&tmp, to).with_context(|| format!("installing {}", to.display()))
}

/// The runtime config actk-runtime gets on the node (a TOML document of actk-core's Config).
fn runtime_config(a: &Args) -> Result<String> {
    let hook = a.install_dir.join("actk-hook");
    let cfg = actk_core::config::Config {
        root: a.root.clone(),
        spec_dirs: a.spec_dirs.clone(),
        hook_path: Some(hook),
        policy: Policy {
            env_requests: a.env_requests,
            annotation_requests: a.annotation_requests,
            mount_requests: a.mount_requests,
            on_refused: a.on_refused,
            privileged_means: a.privileged_means,
        },
        ..Default::default()
    };
    let body = toml::to_string(&cfg).context("serialising the runtime config")?;
    Ok(format!("# Written by `actk node setup`; removed by `actk node teardown`.\n{body}"))
}

fn configure(a: &Args, remove: bool) -> Result<()> {
    let exe = std::env::current_exe().context("finding this actk")?;
    let mut cmd = Process::new(exe);
    cmd.args(["runtime", "configure", "--runtime", "containerd", "--name", &a.name, "--config"]);
    cmd.arg(on_node(a, &a.config));
    if remove {
        cmd.arg("--remove");
    } else {
        cmd.arg("--path").arg(a.install_dir.join("actk-runtime"));
    }
    let out = cmd.output().context("running actk runtime configure")?;
    print!("{}", String::from_utf8_lossy(&out.stdout));
    if !out.status.success() {
        bail!("actk runtime configure failed: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

fn setup(a: &Args) -> Result<()> {
    check(a)?;
    if !on_node(a, &a.config).is_file() {
        bail!(
            "containerd config {} not found on the node (under {}): give --config (chart: nodeSetup.containerd.config)",
            a.config.display(),
            a.host_mount.display()
        );
    }
    let here = std::env::current_exe().context("finding this actk")?;
    let here = here.parent().unwrap_or(Path::new("/"));
    let dir = on_node(a, &a.install_dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    // The config first: a runtime already registered (a setup run again) must never start
    // without it and read the node's /etc/actk instead.
    write_file(&dir.join(actk_core::config::INSTALLED_CONFIG_NAME), &runtime_config(a)?, 0o644)?;
    for b in INSTALLED_BINARIES {
        copy_exe(&here.join(b), &dir.join(b))?;
    }
    println!(
        "installed {} and {} in {}",
        INSTALLED_BINARIES.join(", "),
        actk_core::config::INSTALLED_CONFIG_NAME,
        a.install_dir.display()
    );
    configure(a, false)?;
    restart(a)
}

fn teardown(a: &Args) -> Result<()> {
    check(a)?;
    if on_node(a, &a.config).is_file() {
        configure(a, true)?;
    }
    // containerd first forgets the runtime, then its files go: a container created meanwhile
    // must not meet a runtime whose config (and so the node's policy) is already gone. The
    // runtime goes first, the config last.
    restart(a)?;
    let dir = on_node(a, &a.install_dir);
    let mut files: Vec<String> = INSTALLED_BINARIES.iter().rev().map(|f| f.to_string()).collect();
    files.push(actk_core::config::INSTALLED_CONFIG_NAME.to_string());
    files.extend(LEGACY_FILES.iter().map(|f| f.to_string()));
    // What a setup that was stopped half-way left.
    files.extend(files.iter().map(|f| format!("{f}{TMP_SUFFIX}")).collect::<Vec<_>>());
    for f in &files {
        match std::fs::remove_file(dir.join(f)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("removing {}", dir.join(f).display())),
        }
    }
    for d in [dir.join("bin"), dir.clone()] {
        let _ = std::fs::remove_dir(d); // only when empty: the admin may keep other files there
    }
    println!("removed actk-runtime, actk-hook and actk from {}", a.install_dir.display());
    Ok(())
}

/// The pid of the process serving the unix socket `sock` (SO_PEERCRED on a connection to it;
/// 0 when that process is outside this pid namespace).
fn server_pid(sock: &Path) -> Result<i32> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_io().build().context("starting tokio")?;
    rt.block_on(async {
        let conn =
            tokio::net::UnixStream::connect(sock).await.with_context(|| format!("connecting to {}", sock.display()))?;
        Ok(conn.peer_cred().context("SO_PEERCRED")?.pid().unwrap_or(0))
    })
}

fn restart(a: &Args) -> Result<()> {
    if a.restart == Restart::None {
        println!("restart containerd to apply the change (systemctl restart containerd)");
        return Ok(());
    }
    let sock = on_node(a, &a.socket);
    let pid = match server_pid(&sock) {
        Ok(p) => p,
        Err(e) if format!("{e:#}").contains("Connection refused") || !sock.exists() => {
            println!("containerd does not run (no {}): it reads the config when it starts", a.socket.display());
            return Ok(());
        }
        Err(e) => return Err(e),
    };
    let p = rustix::process::Pid::from_raw(pid)
        .context("the containerd process is not visible in this pid namespace: run the node setup with hostPID")?;
    rustix::process::kill_process(p, rustix::process::Signal::TERM)
        .with_context(|| format!("sending SIGTERM to containerd (pid {pid})"))?;
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(90) {
        std::thread::sleep(Duration::from_millis(250));
        if let Ok(new) = server_pid(&sock)
            && new != pid
        {
            println!("containerd restarted (pid {pid} -> {new})");
            return Ok(());
        }
    }
    bail!(
        "containerd (pid {pid}) was stopped but nothing serves {} again after 90 s: is it run by a service manager that restarts it?",
        a.socket.display()
    )
}
