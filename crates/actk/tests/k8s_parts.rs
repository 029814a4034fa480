//! The parts the Helm chart runs on a Kubernetes node, as the chart runs them (from a pod that
//! sees the node's `/` under a host mount), on fixture roots: `actk cdi generate --host-mount
//! --watch` (the CDI spec generator) and `actk node setup|teardown` (the node setup).

use actk_testsupport::fixture;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn actk(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_actk")).args(args).env("ACTK_LOG", "error").output().expect("run actk")
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

fn wait_for(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn spec_names(file: &Path) -> Option<Vec<String>> {
    let v: Value = serde_json::from_str(&std::fs::read_to_string(file).ok()?).ok()?;
    Some(v["devices"].as_array()?.iter().filter_map(|d| d["name"].as_str().map(str::to_string)).collect())
}

/// A "node" directory with the fixture at `<node>/fx` (the fixture's root as a node path is
/// `/fx`): what a pod sees under /host.
fn node_with_fixture(name: &str) -> Option<(tempfile::TempDir, PathBuf)> {
    let node = tempfile::tempdir().unwrap();
    let root = node.path().join("fx");
    if !fixture::prepare_at(name, &root).unwrap() {
        eprintln!("skipping: fixture {name} needs root for mknod");
        return None;
    }
    Some((node, root))
}

#[test]
fn generate_with_host_mount_writes_node_paths() {
    let Some((node, root)) = node_with_fixture("nvidia-dgx-h100") else { return };
    let m = node.path().display().to_string();
    let o = actk(&["cdi", "generate", "--root", root.to_str().unwrap(), "--host-mount", &m, "--ldcache-hook", "none"]);
    assert!(o.status.success(), "{}", text(&o));
    let spec: Value = serde_json::from_slice(&o.stdout).unwrap();
    let node0 = &spec["devices"][0]["containerEdits"]["deviceNodes"][0];
    assert_eq!(node0["hostPath"], "/fx/dev/nvidia0", "the host mount is not part of a node path");
    let mounts = spec["containerEdits"]["mounts"].as_array().unwrap();
    assert!(mounts.iter().all(|m| m["hostPath"].as_str().unwrap().starts_with("/fx/")), "{mounts:?}");

    // A hook that is not on the node (under the mount) is left out until it is.
    let o = actk(&[
        "cdi",
        "generate",
        "--root",
        root.to_str().unwrap(),
        "--host-mount",
        &m,
        "--ldcache-hook",
        "/opt/actk/actk-hook",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let spec: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(spec["containerEdits"]["hooks"].is_null(), "{}", spec["containerEdits"]);
    std::fs::create_dir_all(node.path().join("opt/actk")).unwrap();
    std::fs::copy("/bin/true", node.path().join("opt/actk/actk-hook")).unwrap();
    let o = actk(&[
        "cdi",
        "generate",
        "--root",
        root.to_str().unwrap(),
        "--host-mount",
        &m,
        "--ldcache-hook",
        "/opt/actk/actk-hook",
    ]);
    let spec: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(spec["containerEdits"]["hooks"][0]["path"], "/opt/actk/actk-hook");

    let o = actk(&["cdi", "generate", "--root", "/nonexistent/actk-root"]);
    assert!(!o.status.success());
    assert!(text(&o).contains("host root /nonexistent/actk-root does not exist"), "{}", text(&o));
}

struct Watcher(Child);

impl Drop for Watcher {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `actk cdi generate --watch SECS --ldcache-hook none --root ROOT --output OUT`, then `extra`.
fn watcher(secs: &str, root: &Path, out: &Path, extra: &[&std::ffi::OsStr]) -> Watcher {
    Watcher(
        Command::new(env!("CARGO_BIN_EXE_actk"))
            .args(["cdi", "generate", "--watch", secs, "--ldcache-hook", "none", "--root"])
            .arg(root)
            .arg("--output")
            .arg(out)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    )
}

/// The chart's generator: specs at start, rewritten when a device appears or goes and when the
/// driver's files change, and every spec removed on SIGTERM.
#[test]
fn watch_refreshes_specs_and_removes_them_on_sigterm() {
    let Some((node, root)) = node_with_fixture("nvidia-dgx-h100") else { return };
    let out = node.path().join("var/run/cdi");
    let mut w = watcher("1", &root, &out, &["--host-mount".as_ref(), node.path().as_os_str()]);
    let file = out.join("nvidia.com-gpu.json");
    wait_for("the spec", Duration::from_secs(20), || spec_names(&file).is_some_and(|n| n.contains(&"7".to_string())));
    let before = std::fs::metadata(&file).unwrap().modified().unwrap();
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(std::fs::metadata(&file).unwrap().modified().unwrap(), before, "an unchanged spec is not rewritten");

    std::fs::remove_file(root.join("dev/nvidia7")).unwrap();
    wait_for("GPU 7 dropped", Duration::from_secs(10), || {
        spec_names(&file).is_some_and(|n| !n.contains(&"7".to_string()))
    });
    let ok = Command::new("mknod").arg(root.join("dev/nvidia7")).args(["c", "195", "7"]).status().unwrap().success();
    assert!(ok);
    wait_for("GPU 7 back", Duration::from_secs(10), || spec_names(&file).is_some_and(|n| n.contains(&"7".to_string())));

    // A driver upgrade changes the driver's files: the spec follows (here a library goes).
    let lib = root.join("usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.95.05");
    let mounts_lib = |f: &Path| std::fs::read_to_string(f).is_ok_and(|t| t.contains("libnvidia-ml.so.580.95.05"));
    assert!(mounts_lib(&file));
    std::fs::remove_file(&lib).unwrap();
    wait_for("the spec without the removed library", Duration::from_secs(10), || file.exists() && !mounts_lib(&file));

    let pid = rustix::process::Pid::from_child(&w.0);
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let status = w.0.wait().unwrap();
    assert!(status.success(), "SIGTERM ends the watch cleanly: {status}");
    assert!(!file.exists(), "the spec it wrote is removed when it stops");
    assert!(std::fs::read_dir(&out).unwrap().next().is_none(), "nothing else left in {}", out.display());

    let o = actk(&["cdi", "generate", "--watch", "1", "--root", root.to_str().unwrap()]);
    assert!(!o.status.success() && text(&o).contains("--watch needs --output DIR"), "{}", text(&o));
}

/// A rolling update of the generator (a DaemonSet's old pod stops after the new one started):
/// the old one's SIGTERM cleanup leaves the spec the new one wrote, so the device plugin never
/// sees the node without its spec; the last generator to stop removes it.
#[test]
fn watch_rolling_update_keeps_the_new_generators_spec() {
    let Some((node, root)) = node_with_fixture("nvidia-dgx-h100") else { return };
    let out = node.path().join("var/run/cdi");
    let start = || watcher("60", &root, &out, &[]);
    let term = |w: &mut Watcher| {
        let pid = rustix::process::Pid::from_child(&w.0);
        rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
        assert!(w.0.wait().unwrap().success());
    };
    let file = out.join("nvidia.com-gpu.json");
    let ino = || std::fs::metadata(&file).ok().map(|m| std::os::unix::fs::MetadataExt::ino(&m));
    let mut old = start();
    wait_for("the old generator's spec", Duration::from_secs(20), || ino().is_some());
    let first = ino();
    let mut new = start();
    wait_for("the new generator's own write", Duration::from_secs(20), || ino().is_some_and(|i| Some(i) != first));
    term(&mut old);
    assert!(file.exists(), "the old generator must not remove the spec the new one wrote");
    term(&mut new);
    assert!(!file.exists(), "the last generator removes its spec");
}

/// A rolling update that changes what the spec says (another root here; a values change in a
/// chart upgrade): the old generator, still running its passes beside the new one, neither
/// writes its older spec back over the new one's nor removes the new one's when it stops. Before,
/// it did both, and the node was left without a spec until the new generator's next pass (the
/// sharing cluster test's CPX pod failed Allocate in that gap: "no healthy devices").
#[test]
fn watch_rolling_update_with_other_content_leaves_the_new_spec_alone() {
    let Some((node, old_root)) = node_with_fixture("nvidia-dgx-h100") else { return };
    let Some((_node2, new_root)) = node_with_fixture("nvidia-dgx-h100") else { return };
    std::fs::remove_file(new_root.join("dev/nvidia7")).unwrap();
    let out = node.path().join("var/run/cdi");
    let start = |root: &Path| watcher("1", root, &out, &[]);
    let file = out.join("nvidia.com-gpu.json");
    let has7 = || spec_names(&file).map(|n| n.contains(&"7".to_string()));
    let mut old = start(&old_root);
    wait_for("the old generator's spec (8 GPUs)", Duration::from_secs(20), || has7() == Some(true));
    let _new = start(&new_root);
    wait_for("the new generator's spec (7 GPUs)", Duration::from_secs(20), || has7() == Some(false));
    // The old one makes three more passes (1 s apart) while both run; the spec stays the new
    // one's throughout (sampled every 100 ms).
    for _ in 0..35 {
        assert_eq!(has7(), Some(false), "the old generator wrote its spec back over the new one's");
        std::thread::sleep(Duration::from_millis(100));
    }
    let pid = rustix::process::Pid::from_child(&old.0);
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    assert!(old.0.wait().unwrap().success());
    assert_eq!(has7(), Some(false), "the old generator removed or replaced the new one's spec when it stopped");
}

/// Two installations (two chart releases) on one node, one spec directory (issue 28 item 6):
/// each names its files after itself, the second leaves a kind the first's spec defines alone
/// (two specs of one kind in one directory make its devices unresolvable), and when the first
/// goes its spec goes with it and the second writes its own.
#[test]
fn watch_owners_never_share_or_remove_each_others_spec() {
    let Some((node, root)) = node_with_fixture("nvidia-dgx-h100") else { return };
    let out = node.path().join("var/run/cdi");
    let start = |owner: &str| {
        Watcher(
            Command::new(env!("CARGO_BIN_EXE_actk"))
                .args(["cdi", "generate", "--watch", "1", "--ldcache-hook", "none", "--owner", owner, "--root"])
                .arg(&root)
                .arg("--output")
                .arg(&out)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap(),
        )
    };
    let term = |w: &mut Watcher| {
        let pid = rustix::process::Pid::from_child(&w.0);
        rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
        assert!(w.0.wait().unwrap().success());
    };
    let (a_file, b_file) = (out.join("gpus.nvidia.com-gpu.json"), out.join("other.nvidia.com-gpu.json"));
    let mut a = start("gpus");
    wait_for("the first release's spec", Duration::from_secs(20), || spec_names(&a_file).is_some());
    let mut b = start("other");
    std::thread::sleep(Duration::from_millis(2500));
    assert!(!b_file.exists(), "the second release leaves the kind to the first");
    term(&mut a);
    assert!(!a_file.exists(), "the first release's spec goes with it");
    wait_for("the second release's own spec", Duration::from_secs(10), || spec_names(&b_file).is_some());
    // A spec another tool wrote for the kind is left alone too, and this one's is removed.
    std::fs::write(out.join("nvidia.yaml"), std::fs::read_to_string(&b_file).unwrap()).unwrap();
    std::fs::rename(out.join("nvidia.yaml"), out.join("a-tool.json")).unwrap();
    wait_for("the release yielding to the other tool", Duration::from_secs(10), || !b_file.exists());
    term(&mut b);
    let mut err = String::new();
    std::io::Read::read_to_string(b.0.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(err.contains("defines nvidia.com/gpu already"), "{err}");
    assert!(out.join("a-tool.json").exists(), "another tool's spec is never removed");
    let o = actk(&["cdi", "generate", "--owner", "x/y", "--watch", "1", "--output", "/tmp"]);
    assert!(!o.status.success() && text(&o).contains("a Helm release name"), "{}", text(&o));
}

const CONTAINERD: &str =
    "# the node's containerd 2 config\nversion = 3\n\n[plugins.'io.containerd.cri.v1.runtime']\n  enable_cdi = true\n";

/// `actk node setup` installs actk-runtime, actk-hook and actk with their config beside them,
/// and registers the runtime; teardown gives containerd's config back byte for byte and removes
/// what it installed.
#[test]
fn node_setup_installs_registers_and_teardown_restores() {
    let node = tempfile::tempdir().unwrap();
    let n = node.path();
    std::fs::create_dir_all(n.join("etc/containerd")).unwrap();
    std::fs::write(n.join("etc/containerd/config.toml"), CONTAINERD).unwrap();
    let common = [
        "--host-mount",
        n.to_str().unwrap(),
        "--install-dir",
        "/opt/actk",
        "--root",
        "/run/nvidia/driver",
        "--spec-dirs",
        "/var/run/cdi",
        "--restart",
        "none",
    ];
    // actk-runtime and actk-hook are looked for next to actk (cargo builds them into the same
    // directory); a test binary of this crate can only be sure of actk itself.
    let here = Path::new(env!("CARGO_BIN_EXE_actk")).parent().unwrap();
    if !here.join("actk-runtime").is_file() || !here.join("actk-hook").is_file() {
        eprintln!("skipping: build actk-runtime and actk-hook first (cargo build --workspace --bins)");
        return;
    }
    let mut args = vec!["node", "setup"];
    args.extend(common);
    let o = actk(&args);
    assert!(o.status.success(), "{}", text(&o));
    let dir = n.join("opt/actk");
    for f in ["actk-runtime", "actk-hook", "actk"] {
        let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(dir.join(f)).unwrap().permissions());
        assert_eq!(mode & 0o777, 0o755, "{f}");
        assert!(
            std::fs::read(dir.join(f)).unwrap() == std::fs::read(here.join(f)).unwrap(),
            "{f} is a copy, not a wrapper"
        );
    }
    let cfg_text = std::fs::read_to_string(dir.join("actk.toml")).unwrap();
    let cfg: toml::Table = cfg_text.parse().unwrap();
    assert_eq!(cfg["root"].as_str(), Some("/run/nvidia/driver"));
    assert_eq!(cfg["spec_dirs"].as_array().unwrap()[0].as_str(), Some("/var/run/cdi"));
    assert_eq!(cfg["hook_path"].as_str(), Some("/opt/actk/actk-hook"));
    // The Kubernetes node's trust policy (SECURITY.md), unless the flags say otherwise.
    let policy = cfg["policy"].as_table().expect("a [policy] table");
    for (k, v) in [
        ("env_requests", "privileged"),
        ("annotation_requests", "privileged"),
        ("mount_requests", "always"),
        ("on_refused", "warn"),
        ("privileged_means", "privileged-flag"),
    ] {
        assert_eq!(policy[k].as_str(), Some(v), "policy.{k}: {policy:?}");
    }
    // The installed binaries find that config beside themselves, with no ACTK_CONFIG (an
    // engine runs the runtime with its own environment): the installed actk shows it, and
    // the installed actk-runtime execs the low-level runtime it names.
    let shown = Command::new(dir.join("actk")).args(["config", "show"]).env_remove("ACTK_CONFIG").output().unwrap();
    assert!(shown.status.success() && text(&shown).contains("/run/nvidia/driver"), "{}", text(&shown));
    let echo = which_echo();
    let with_echo: String = cfg_text
        .lines()
        .map(|l| if l.starts_with("runtimes = ") { format!("runtimes = [{echo:?}]\n") } else { format!("{l}\n") })
        .collect();
    assert_ne!(with_echo, cfg_text, "the installed config names the runtimes: {cfg_text}");
    std::fs::write(dir.join("actk.toml"), with_echo).unwrap();
    let o = Command::new(dir.join("actk-runtime")).args(["state", "ctr-1"]).env_remove("ACTK_CONFIG").output().unwrap();
    assert!(o.status.success() && String::from_utf8_lossy(&o.stdout) == "state ctr-1\n", "{}", text(&o));
    std::fs::write(dir.join("actk.toml"), &cfg_text).unwrap();
    let containerd: toml::Table =
        std::fs::read_to_string(n.join("etc/containerd/config.toml")).unwrap().parse().unwrap();
    let rt = &containerd["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]["actk"];
    assert_eq!(rt["options"]["BinaryName"].as_str(), Some("/opt/actk/actk-runtime"), "the node path, not the mount's");

    // What an older node setup installed (binaries in bin/, config.toml) goes too.
    std::fs::create_dir(dir.join("bin")).unwrap();
    // So does what a setup stopped half-way leaves (each file's own temporary name).
    for f in ["bin/actk-runtime", "bin/actk-hook", "config.toml", "actk.actk-tmp", "actk.toml.actk-tmp"] {
        std::fs::write(dir.join(f), "old").unwrap();
    }
    let mut args = vec!["node", "teardown"];
    args.extend(common);
    let o = actk(&args);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(std::fs::read_to_string(n.join("etc/containerd/config.toml")).unwrap(), CONTAINERD);
    assert!(!dir.exists(), "the install dir is removed when empty");

    // The policy flags (chart: nodeSetup.policy) reach the installed config; a bad value is
    // named with the values there are, and nothing is installed.
    let mut args =
        vec!["node", "setup", "--env-requests", "never", "--on-refused", "fail", "--privileged-means", "cap-sys-admin"];
    args.extend(common);
    let o = actk(&args);
    assert!(o.status.success(), "{}", text(&o));
    let cfg: toml::Table = std::fs::read_to_string(dir.join("actk.toml")).unwrap().parse().unwrap();
    assert_eq!(cfg["policy"]["env_requests"].as_str(), Some("never"));
    assert_eq!(cfg["policy"]["on_refused"].as_str(), Some("fail"));
    assert_eq!(cfg["policy"]["privileged_means"].as_str(), Some("cap-sys-admin"));
    assert_eq!(cfg["policy"]["annotation_requests"].as_str(), Some("privileged"));
    let mut args = vec!["node", "teardown"];
    args.extend(common);
    assert!(actk(&args).status.success());
    let mut args = vec!["node", "setup", "--annotation-requests", "sometimes"];
    args.extend(common);
    let o = actk(&args);
    assert!(
        !o.status.success() && text(&o).contains("\"sometimes\"") && text(&o).contains("always, privileged, never"),
        "{}",
        text(&o)
    );
    assert!(!dir.exists());

    // A node without the config: a clear error, nothing installed.
    std::fs::remove_file(n.join("etc/containerd/config.toml")).unwrap();
    let mut args = vec!["node", "setup"];
    args.extend(common);
    let o = actk(&args);
    assert!(!o.status.success() && text(&o).contains("nodeSetup.containerd.config"), "{}", text(&o));
    assert!(!dir.exists());
}

/// `echo`'s absolute path (the low-level runtime of the installed runtime's test).
fn which_echo() -> String {
    ["/usr/bin/echo", "/bin/echo"].into_iter().find(|p| Path::new(p).is_file()).unwrap_or("/bin/echo").to_string()
}
