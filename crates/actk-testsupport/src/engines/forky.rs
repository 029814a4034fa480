//! The newer engines from Debian forky (containerd 2.1, Docker 28.5), extracted into a project
//! prefix by `scripts/k8s/fetch-forky.sh` (KUBERNETES.md), each started by a test on its own
//! sockets and state directories under a temporary directory, so that Debian's dockerd 20.10
//! and its containerd keep serving the other tests. They run on bookworm's libc with bookworm's
//! runc 1.1.5.
//!
//! - [`Containerd2`]: containerd 2 with the CRI plugin (CDI on, NRI on its own socket, runc with
//!   cgroupfs and `restrict_oom_score_adj` since root here lacks CAP_SYS_RESOURCE, a
//!   loopback-only CNI config, so pods use the host network) and the pause and busybox images
//!   imported; driven with crictl ([`crictl_path`], `scripts/fetch-crictl.sh`).
//! - [`Docker28`]: dockerd 28 with CDI on, `bridge: none`, vfs storage, its own containerd, and
//!   a PATH holding `nvidia-container-runtime-hook` (so `--gpus` is offered).
//!
//! Both stop their processes (and what they started) and remove their directories on drop.

use super::{skip_or_fail, workspace_root};
use anyhow::{Context, Result, bail};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The forky prefix (`.../root` holds usr/bin/containerd, usr/sbin/dockerd, ...), fetched or
/// reused by `scripts/k8s/fetch-forky.sh`; `None` when it cannot be had.
pub fn forky_root() -> Option<PathBuf> {
    static ROOT: OnceLock<Option<PathBuf>> = OnceLock::new();
    ROOT.get_or_init(|| {
        let o =
            Command::new(workspace_root().join("scripts/k8s/fetch-forky.sh")).stderr(Stdio::inherit()).output().ok()?;
        let prefix = String::from_utf8_lossy(&o.stdout).lines().last()?.trim().to_string();
        let root = Path::new(&prefix).join("root");
        (o.status.success() && root.join("usr/bin/containerd").is_file()).then_some(root)
    })
    .clone()
}

/// crictl, built once by `scripts/fetch-crictl.sh`; `None` when it cannot be built.
pub fn crictl_path() -> Option<PathBuf> {
    static P: OnceLock<Option<PathBuf>> = OnceLock::new();
    P.get_or_init(|| {
        let o =
            Command::new(workspace_root().join("scripts/fetch-crictl.sh")).stderr(Stdio::inherit()).output().ok()?;
        let p = PathBuf::from(String::from_utf8_lossy(&o.stdout).lines().last()?.trim());
        (o.status.success() && p.is_file()).then_some(p)
    })
    .clone()
}

/// Root, forky's engines and crictl: else skip (or fail under CI / `ACTK_E2E_STRICT=1`).
pub fn require_forky(with_crictl: bool) -> Option<(PathBuf, Option<PathBuf>)> {
    if !super::require_root() {
        return None;
    }
    let Some(root) = forky_root() else {
        skip_or_fail("Run scripts/k8s/fetch-forky.sh.", "Debian forky's containerd 2 and Docker 28 are not extracted");
        return None;
    };
    let crictl = if with_crictl {
        match crictl_path() {
            Some(c) => Some(c),
            None => {
                skip_or_fail("Run scripts/fetch-crictl.sh (needs Go).", "crictl is not built");
                return None;
            }
        }
    } else {
        None
    };
    Some((root, crictl))
}

fn wait_for(what: &str, limit: Duration, mut ok: impl FnMut() -> bool) -> Result<()> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!("{what} not ready after {}s", limit.as_secs())
}

fn stop(child: &mut Child) {
    let pid = rustix::process::Pid::from_raw(child.id() as i32);
    if let Some(pid) = pid {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
    }
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(20) {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// The images every CRI test needs (`scripts/k8s/base-images.sh`, cached in target/actk-e2e):
/// (reference, tar) of the pause image and of busybox.
pub fn base_images() -> Result<Vec<(String, PathBuf)>> {
    let out = super::cache_dir().join("images");
    super::with_lock("base-images", || {
        let o = Command::new(workspace_root().join("scripts/k8s/base-images.sh"))
            .arg(&out)
            .stderr(Stdio::inherit())
            .output()
            .context("running scripts/k8s/base-images.sh")?;
        if !o.status.success() {
            bail!("scripts/k8s/base-images.sh failed");
        }
        Ok(String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter_map(|l| l.split_once(' ').map(|(r, t)| (r.to_string(), PathBuf::from(t))))
            .collect())
    })
}

/// Options of [`Containerd2::start`].
#[derive(Debug, Clone, Default)]
pub struct Containerd2Options {
    /// CDI spec directories for the CRI plugin's own CDI (empty: one empty dir of its own).
    pub cdi_spec_dirs: Vec<PathBuf>,
    /// A runtime handler `actk` whose runc shim runs this binary as runc (RuntimeClass actk).
    pub actk_runtime: Option<PathBuf>,
}

/// A containerd 2 of one test (see the module docs).
pub struct Containerd2 {
    child: Option<Child>,
    dir: tempfile::TempDir,
    crictl: PathBuf,
    /// The CRI/containerd socket.
    pub socket: PathBuf,
    /// The NRI socket plugins connect to.
    pub nri_socket: PathBuf,
    /// The image reference of the pause (sandbox) image.
    pub pause_image: String,
    /// The busybox image reference.
    pub busybox_image: String,
    bin: PathBuf,
}

impl Containerd2 {
    /// Starts containerd 2 and imports the base images; `None` when the machine cannot (after
    /// printing why, or panicking under CI). Errors: it did not come up (its log in the message).
    pub fn start(opts: &Containerd2Options) -> Result<Option<Containerd2>> {
        let Some((root, crictl)) = require_forky(true) else { return Ok(None) };
        let crictl = crictl.expect("asked for crictl");
        let images = base_images()?;
        let image = |name: &str| {
            images.iter().find(|(r, _)| r.contains(name)).cloned().with_context(|| format!("no {name} image"))
        };
        let (pause_image, pause_tar) = image("pause")?;
        let (busybox_image, busybox_tar) = image("busybox")?;
        // Short paths: unix socket paths are limited to 108 bytes.
        let dir = tempfile::Builder::new().prefix("actk-c2-").tempdir_in("/tmp")?;
        let d = |p: &str| dir.path().join(p);
        for p in ["cni", "cdi", "nri-plugins", "nri-conf", "opt"] {
            fs::create_dir_all(d(p))?;
        }
        fs::write(
            d("cni/10-loopback.conflist"),
            r#"{"cniVersion": "1.0.0", "name": "actk-test", "plugins": [{"type": "loopback"}]}"#,
        )?;
        let cdi_dirs: Vec<PathBuf> =
            if opts.cdi_spec_dirs.is_empty() { vec![d("cdi")] } else { opts.cdi_spec_dirs.clone() };
        let toml_list =
            |v: &[PathBuf]| v.iter().map(|p| format!("{:?}", p.display().to_string())).collect::<Vec<_>>().join(", ");
        let runc = super::which("runc").context("runc not on PATH")?;
        let actk_rt = match &opts.actk_runtime {
            Some(p) => format!(
                "\n  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.actk]\n    runtime_type = 'io.containerd.runc.v2'\n    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.actk.options]\n      BinaryName = {:?}\n      SystemdCgroup = false\n",
                p.display().to_string()
            ),
            None => String::new(),
        };
        let config = format!(
            r#"version = 3
root = {root:?}
state = {state:?}
[grpc]
  address = {sock:?}
[ttrpc]
  address = {ttrpc:?}
[debug]
  address = {debug:?}
[plugins.'io.containerd.internal.v1.opt']
  path = {opt:?}
[plugins.'io.containerd.cri.v1.images']
  snapshotter = 'overlayfs'
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = {pause:?}
[plugins.'io.containerd.cri.v1.runtime']
  # Root here lacks CAP_SYS_RESOURCE: runc cannot lower oom_score_adj below its own.
  restrict_oom_score_adj = true
  enable_cdi = true
  cdi_spec_dirs = [{cdi}]
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ['/usr/lib/cni']
    conf_dir = {cni:?}
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = 'runc'
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
    runtime_type = 'io.containerd.runc.v2'
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
      BinaryName = {runc:?}
      SystemdCgroup = false
{actk_rt}
[plugins.'io.containerd.nri.v1.nri']
  disable = false
  socket_path = {nri:?}
  plugin_path = {nri_plugins:?}
  plugin_config_path = {nri_conf:?}
  plugin_registration_timeout = '10s'
  plugin_request_timeout = '5s'
"#,
            root = d("root").display().to_string(),
            state = d("state").display().to_string(),
            sock = d("c.sock").display().to_string(),
            ttrpc = d("c.sock.ttrpc").display().to_string(),
            debug = d("debug.sock").display().to_string(),
            opt = d("opt").display().to_string(),
            pause = pause_image,
            cdi = toml_list(&cdi_dirs),
            cni = d("cni").display().to_string(),
            runc = runc.display().to_string(),
            nri = d("nri.sock").display().to_string(),
            nri_plugins = d("nri-plugins").display().to_string(),
            nri_conf = d("nri-conf").display().to_string(),
        );
        fs::write(d("config.toml"), config)?;
        let bin = root.join("usr/bin");
        let log = fs::File::create(d("containerd.log"))?;
        let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
        let child = Command::new(bin.join("containerd"))
            .args(["--config", d("config.toml").to_str().unwrap_or_default()])
            .env("PATH", &path)
            .stdout(log.try_clone()?)
            .stderr(log)
            .stdin(Stdio::null())
            .spawn()
            .context("starting containerd 2")?;
        let c = Containerd2 {
            child: Some(child),
            socket: d("c.sock"),
            nri_socket: d("nri.sock"),
            dir,
            crictl,
            pause_image,
            busybox_image,
            bin,
        };
        if let Err(e) = wait_for("containerd 2", Duration::from_secs(60), || c.crictl(&["info"]).status.success()) {
            bail!("{e}; its log:\n{}", c.log());
        }
        for tar in [&pause_tar, &busybox_tar] {
            let o = c.ctr(&["-n", "k8s.io", "images", "import", "--local", tar.to_str().unwrap_or_default()]);
            if !o.status.success() {
                bail!("ctr images import {}: {}", tar.display(), String::from_utf8_lossy(&o.stderr));
            }
        }
        Ok(Some(c))
    }

    /// The test's own directory (config, logs, CDI dir `cdi/`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// containerd's log so far.
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.path().join("containerd.log")).unwrap_or_default()
    }

    /// `crictl ARGS` against this containerd.
    pub fn crictl(&self, args: &[&str]) -> Output {
        let ep = format!("unix://{}", self.socket.display());
        let mut all = vec!["--runtime-endpoint", ep.as_str(), "--image-endpoint", ep.as_str(), "--timeout", "60s"];
        all.extend_from_slice(args);
        super::command_output(&self.crictl, &all, &[])
    }

    /// `ctr --address SOCKET ARGS`.
    pub fn ctr(&self, args: &[&str]) -> Output {
        let sock = self.socket.display().to_string();
        let mut all = vec!["--address", sock.as_str()];
        all.extend_from_slice(args);
        super::command_output(self.bin.join("ctr"), &all, &[])
    }

    /// Writes `json` to a file in the test directory and returns its path (crictl reads pod and
    /// container configs from files).
    pub fn write_json(&self, name: &str, json: &serde_json::Value) -> Result<PathBuf> {
        let p = self.dir.path().join(name);
        fs::write(&p, serde_json::to_vec_pretty(json)?)?;
        Ok(p)
    }

    /// A host-network pod sandbox config (a loopback-only CNI cannot give pods a network).
    pub fn pod_config(&self, name: &str) -> serde_json::Value {
        serde_json::json!({
            "metadata": {"name": name, "namespace": "default", "uid": super::unique_name(name), "attempt": 0},
            "log_directory": self.dir.path().join("logs").join(name).display().to_string(),
            "linux": {"security_context": {"namespace_options": {"network": 2}}}
        })
    }

    /// Runs one container in a new pod and returns (exit code, its output); the pod is removed
    /// again. `container` gets `image` (busybox) and a log path filled in.
    pub fn run_pod(
        &self,
        name: &str,
        container: serde_json::Value,
        runtime_handler: Option<&str>,
    ) -> Result<(i32, String)> {
        let pod = self.pod_config(name);
        let pod_file = self.write_json(&format!("{name}-pod.json"), &pod)?;
        let mut ctr = container;
        ctr["image"] = serde_json::json!({"image": self.busybox_image});
        ctr["log_path"] = serde_json::json!(format!("{name}.log"));
        ctr["metadata"] = serde_json::json!({"name": name});
        let ctr_file = self.write_json(&format!("{name}-ctr.json"), &ctr)?;
        let mut runp = vec!["runp"];
        if let Some(h) = runtime_handler {
            runp.extend(["--runtime", h]);
        }
        runp.push(pod_file.to_str().unwrap_or_default());
        let out = self.crictl(&runp);
        if !out.status.success() {
            bail!("crictl runp: {}\n{}", String::from_utf8_lossy(&out.stderr), self.log());
        }
        let pod_id = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let result = (|| {
            let out = self.crictl(&[
                "create",
                &pod_id,
                ctr_file.to_str().unwrap_or_default(),
                pod_file.to_str().unwrap_or_default(),
            ]);
            if !out.status.success() {
                bail!("crictl create: {}", String::from_utf8_lossy(&out.stderr));
            }
            let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
            let out = self.crictl(&["start", &id]);
            if !out.status.success() {
                bail!("crictl start: {}", String::from_utf8_lossy(&out.stderr));
            }
            let mut code = None;
            wait_for("the container to exit", Duration::from_secs(60), || {
                let o = self.crictl(&["inspect", &id]);
                let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
                if v["status"]["state"] == "CONTAINER_EXITED" {
                    code = v["status"]["exitCode"].as_i64();
                    true
                } else {
                    false
                }
            })?;
            let logs = self.crictl(&["logs", &id]);
            let text = format!("{}{}", String::from_utf8_lossy(&logs.stdout), String::from_utf8_lossy(&logs.stderr));
            Ok((code.unwrap_or(-1) as i32, text))
        })();
        let _ = self.crictl(&["stopp", &pod_id]);
        let _ = self.crictl(&["rmp", "-f", &pod_id]);
        result
    }
}

impl Drop for Containerd2 {
    fn drop(&mut self) {
        // Pods first, so their shims and mounts go with them.
        let o = self.crictl(&["pods", "-q"]);
        for id in String::from_utf8_lossy(&o.stdout).lines() {
            let _ = self.crictl(&["stopp", id]);
            let _ = self.crictl(&["rmp", "-f", id]);
        }
        if let Some(mut c) = self.child.take() {
            stop(&mut c);
        }
        // Overlay snapshots and shm mounts of pods live under the directory.
        if let Ok(mounts) = fs::read_to_string("/proc/self/mounts") {
            let mut ours: Vec<&str> = mounts
                .lines()
                .filter_map(|l| l.split(' ').nth(1))
                .filter(|m| Path::new(m).starts_with(self.dir.path()))
                .collect();
            ours.sort_by_key(|m| std::cmp::Reverse(m.len()));
            for m in ours {
                let _ = rustix::mount::unmount(m, rustix::mount::UnmountFlags::DETACH);
            }
        }
    }
}

/// A dockerd 28 of one test (see the module docs).
pub struct Docker28 {
    child: Option<Child>,
    dir: tempfile::TempDir,
    bin: PathBuf,
    /// The daemon socket (`DOCKER_HOST=unix://...`).
    pub socket: PathBuf,
}

impl Docker28 {
    /// Starts dockerd 28 with `daemon_json` (merged over the test defaults: `bridge: none`,
    /// `iptables: false`, vfs), `hook_dir` first on its PATH (where `nvidia-container-runtime-hook`
    /// is: dockerd offers `--gpus` only when it finds one at start) and `env` in its environment
    /// (`docker run --gpus` hands dockerd's environment to that hook); `None` when the machine
    /// cannot. Errors: dockerd did not come up (its log attached).
    pub fn start(
        daemon_json: serde_json::Value,
        hook_dir: Option<&Path>,
        env: &[(&str, &std::ffi::OsStr)],
    ) -> Result<Option<Docker28>> {
        let Some((root, _)) = require_forky(false) else { return Ok(None) };
        let dir = tempfile::Builder::new().prefix("actk-d28-").tempdir_in("/tmp")?;
        let d = |p: &str| dir.path().join(p);
        let mut cfg = serde_json::json!({
            "bridge": "none",
            "iptables": false,
            "ip6tables": false,
            "ip-forward": false,
            "storage-driver": "vfs",
            "userland-proxy": false,
        });
        if let (Some(base), Some(extra)) = (cfg.as_object_mut(), daemon_json.as_object()) {
            for (k, v) in extra {
                base.insert(k.clone(), v.clone());
            }
        }
        fs::write(d("daemon.json"), serde_json::to_vec_pretty(&cfg)?)?;
        let bin = root.join("usr/bin");
        let sbin = root.join("usr/sbin");
        let mut path = format!("{}:{}", bin.display(), sbin.display());
        if let Some(h) = hook_dir {
            path = format!("{}:{path}", h.display());
        }
        path = format!("{path}:{}", std::env::var("PATH").unwrap_or_default());
        let log = fs::File::create(d("dockerd.log"))?;
        let socket = d("docker.sock");
        // In a network namespace of its own: with `bridge: none` dockerd deletes the host's
        // `docker0` at start (moby's removeDefaultBridgeInterface), which breaks the default
        // network of the machine's dockerd 20.10 for every later test. unshare execs dockerd,
        // so the child's pid is dockerd's.
        let child = Command::new("unshare")
            .args(["--net", "--"])
            .arg(sbin.join("dockerd"))
            .arg("--config-file")
            .arg(d("daemon.json"))
            .arg("--data-root")
            .arg(d("data"))
            .arg("--exec-root")
            .arg(d("exec"))
            .arg("--pidfile")
            .arg(d("docker.pid"))
            .arg("-H")
            .arg(format!("unix://{}", socket.display()))
            .envs(env.iter().copied())
            .env("PATH", &path)
            .stdout(log.try_clone()?)
            .stderr(log)
            .stdin(Stdio::null())
            .spawn()
            .context("starting dockerd 28")?;
        let docker = Docker28 { child: Some(child), dir, bin, socket };
        if let Err(e) = wait_for("dockerd 28", Duration::from_secs(90), || docker.docker(&["info"]).status.success()) {
            bail!("{e}; its log:\n{}", docker.log());
        }
        Ok(Some(docker))
    }

    /// dockerd's log so far.
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.path().join("dockerd.log")).unwrap_or_default()
    }

    /// The test's own directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// `docker ARGS` (forky's docker CLI) against this dockerd.
    pub fn docker(&self, args: &[&str]) -> Output {
        let host = format!("unix://{}", self.socket.display());
        super::command_output(self.bin.join("docker"), args, &[("DOCKER_HOST", std::ffi::OsStr::new(&host))])
    }

    /// Imports the busybox rootfs as `name`.
    pub fn import_busybox(&self, name: &str) -> Result<()> {
        let rootfs = super::busybox_rootfs()?;
        let o = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "tar -C {:?} -c . | {:?} import - {name}",
                rootfs.display().to_string(),
                self.bin.join("docker").display().to_string()
            ))
            .env("DOCKER_HOST", format!("unix://{}", self.socket.display()))
            .output()?;
        if !o.status.success() {
            bail!("docker import: {}", String::from_utf8_lossy(&o.stderr));
        }
        Ok(())
    }
}

impl Drop for Docker28 {
    fn drop(&mut self) {
        let o = self.docker(&["ps", "-aq"]);
        for id in String::from_utf8_lossy(&o.stdout).lines() {
            let _ = self.docker(&["rm", "-f", id]);
        }
        if let Some(mut c) = self.child.take() {
            stop(&mut c);
        }
        if let Ok(mounts) = fs::read_to_string("/proc/self/mounts") {
            let mut ours: Vec<&str> = mounts
                .lines()
                .filter_map(|l| l.split(' ').nth(1))
                .filter(|m| Path::new(m).starts_with(self.dir.path()))
                .collect();
            ours.sort_by_key(|m| std::cmp::Reverse(m.len()));
            for m in ours {
                let _ = rustix::mount::unmount(m, rustix::mount::UnmountFlags::DETACH);
            }
        }
    }
}
