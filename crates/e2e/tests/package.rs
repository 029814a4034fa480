//! The .deb on a fresh Debian 12 root, as an admin installs it (issue 30, "OS packages"):
//! `make deb` builds target/debian/actk_*.deb; this test installs it with dpkg on an overlay of a
//! debootstrap'd bookworm root that has Debian's docker.io, podman and systemd
//! (actk_testsupport::debroot, cached in /var/cache/actk/pkgtest), then:
//! 1. boots the root with systemd as PID 1 (systemd-nspawn, private network): the package
//!    enabled actk-cdi-refresh.service and .path, the service wrote the CDI spec of the
//!    simulated DGX H100 at boot; a GPU whose device node goes away leaves the spec when the
//!    udev rule's command runs the service again; a driver (re)install, seen by the path unit
//!    as a rewritten modules.dep, brings it back; an edit of config.toml (a root without devices)
//!    makes the path unit refresh and the spec go (`--prune`), and come back with the old config;
//!    `systemd-analyze verify` accepts the units;
//! 2. in the same root without systemd (chroot in its own mount, network and PID namespaces,
//!    /run a fresh tmpfs): the unit's ExecStart writes the specs, `docker run --gpus 1`
//!    (Docker 20.10 through the packaged nvidia-container-runtime-hook) and `podman run --device
//!    nvidia.com/gpu=0` (the spec) get their GPU with nothing else set up; engine registrations
//!    happen only when /etc/default/actk (or the environment) asks; `actk who` names the
//!    containers holding GPUs; `dpkg --purge` removes the registrations and the specs;
//! 3. compares the root before the install and after the purge: nothing of the package is
//!    left (only state the engines and the boot write themselves differs, each path named).
//!
//! What this cannot test here: udev itself (no udevd in a container; the rule's command is run
//! as udev would run it, and the rule's syntax is not checked by any tool of systemd 252), the
//! real boot ordering against docker.service (docker cannot run inside systemd-nspawn on this
//! machine's read-only cgroup v1 mounts, so the engines run in the chroot; the ordering is
//! checked as the unit's Before= list), and a driver package's depmod (simulated by writing
//! modules.dep).

use actk_testsupport::debroot::Overlay;
use actk_testsupport::engines::{self, busybox_rootfs, expect_success, require_root, skip_or_fail, text, which};
use std::collections::BTreeMap;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const NODE: &str = "var/lib/actk/simulated-node";

/// The newest target/debian/actk_*.deb.
fn deb() -> Option<PathBuf> {
    newest("debian", "actk_", "deb")
}

/// The newest target/generate-rpm/actk-*.rpm.
fn rpm() -> Option<PathBuf> {
    newest("generate-rpm", "actk-", "rpm")
}

/// The newest file `target/<dir>/<prefix>*.<ext>`.
fn newest(dir: &str, prefix: &str, ext: &str) -> Option<PathBuf> {
    let dir = engines::target_dir().join(dir);
    let mut found: Vec<(std::time::SystemTime, PathBuf)> = std::fs::read_dir(&dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name().is_some_and(|n| n.to_string_lossy().starts_with(prefix))
                && p.extension().is_some_and(|e| e == ext)
        })
        .filter_map(|p| Some((p.metadata().ok()?.modified().ok()?, p)))
        .collect();
    found.sort();
    found.pop().map(|(_, p)| p)
}

/// `sh -c script` on the host; panics with the output unless it succeeds. Returns stdout.
fn sh(what: &str, script: &str) -> String {
    let o = Command::new("sh").arg("-c").arg(script).stdin(Stdio::null()).output().unwrap();
    expect_success(what, &o)
}

fn chroot(root: &Path, args: &[&str]) -> std::process::Output {
    Command::new("chroot")
        .arg(root)
        .args(args)
        .env_clear()
        .env("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
        .env("DEBIAN_FRONTEND", "noninteractive")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// The root booted by systemd-nspawn; powered off (or killed) on drop.
struct Boot {
    nspawn: Child,
    pid1: i32,
}

impl Boot {
    fn start(root: &Path, log: &Path) -> Boot {
        let log = std::fs::File::create(log).unwrap();
        let nspawn = Command::new("systemd-nspawn")
            .arg("-D")
            .arg(root)
            .args(["--register=no", "--keep-unit", "--private-network", "--boot", "--console=passive"])
            // The engines are not run under nspawn (see the module docs): masked, so the boot
            // is not spent on their failures.
            .args([
                "--",
                "systemd.mask=docker.service",
                "systemd.mask=docker.socket",
                "systemd.mask=containerd.service",
            ])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("starting systemd-nspawn");
        let me = nspawn.id() as i32;
        // Held from here, so a failure below still stops the container (Drop).
        let mut boot = Boot { nspawn, pid1: 0 };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(pid1) = find_container_init(me) {
                boot.pid1 = pid1;
                return boot;
            }
            assert!(Instant::now() < deadline, "systemd-nspawn started no systemd within 30 s");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A command inside the booted container (all its namespaces), with its output.
    fn exec(&self, args: &[&str]) -> std::process::Output {
        Command::new("nsenter")
            .args(["-t", &self.pid1.to_string(), "-a"])
            .args(args)
            .env_clear()
            .env("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    fn show(&self, unit: &str, prop: &str) -> String {
        text(&self.exec(&["systemctl", "show", "--value", "-p", prop, unit])).0.trim().to_string()
    }

    /// Waits until the refresh service ran again after `previous` (its InvocationID) and ended.
    fn wait_refresh_after(&self, previous: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let id = self.show("actk-cdi-refresh.service", "InvocationID");
            let state = self.show("actk-cdi-refresh.service", "ActiveState");
            if id != previous && !id.is_empty() && state == "inactive" {
                return id;
            }
            assert!(
                Instant::now() < deadline,
                "actk-cdi-refresh.service did not run again within 30 s (state {state})"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn poweroff(mut self) {
        let _ = self.exec(&["systemctl", "poweroff", "--no-block"]);
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.nspawn.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        let _ = self.nspawn.kill();
        let _ = self.nspawn.wait();
    }
}

impl Drop for Boot {
    fn drop(&mut self) {
        if let Ok(None) = self.nspawn.try_wait() {
            let _ = self.nspawn.kill();
            let _ = self.nspawn.wait();
        }
    }
}

/// The container's systemd: a descendant of systemd-nspawn `nspawn` (at most three levels down)
/// named `systemd`.
fn find_container_init(nspawn: i32) -> Option<i32> {
    let mut parent: BTreeMap<i32, (i32, String)> = BTreeMap::new();
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        let Some((head, rest)) = stat.rsplit_once(')') else { continue };
        let comm = head.split_once('(').map(|(_, c)| c.to_string()).unwrap_or_default();
        let ppid = rest.split_whitespace().nth(1).and_then(|p| p.parse().ok()).unwrap_or(0);
        parent.insert(pid, (ppid, comm));
    }
    parent.iter().find_map(|(pid, (_, comm))| {
        let mut p = *pid;
        for _ in 0..3 {
            p = parent.get(&p)?.0;
            if p == nspawn {
                return (comm == "systemd").then_some(*pid);
            }
        }
        None
    })
}

/// Removes the cgroup parent the chroot's dockerd put its containers under
/// (`/sys/fs/cgroup/*/actk-pkgtest`, emptied by docker as its containers go): the host's
/// hierarchies are shared with the chroot.
struct CgroupParent;

impl Drop for CgroupParent {
    fn drop(&mut self) {
        let _ = Command::new("sh")
            .arg("-c")
            .arg("for d in /sys/fs/cgroup/*/actk-pkgtest; do [ -d \"$d\" ] && find \"$d\" -depth -type d -exec rmdir {} \\; ; done; true")
            .status();
    }
}

/// One entry of a root's snapshot: type, mode, owner, and what identifies the content (a
/// file's bytes for small files, else size and mtime; a link's target; a node's numbers).
type Snapshot = BTreeMap<String, String>;

/// Paths whose contents the boot and the engines write on their own, never the package: left
/// out of the before/after comparison (each asserted separately where the package could leave
/// something there: dpkg's database, the units' enablement state, /run's specs).
const NOT_COMPARED: &[&str] = &[
    "proc",
    "sys",
    "dev",
    "run",
    "tmp",
    "var/tmp",
    // the engines' state and logs; dockerd writes its identity key at its first start,
    // containerd its plugin directories, podman its short-name alias cache
    "etc/docker/key.json",
    "opt/containerd",
    "var/cache/containers",
    "var/lib/docker",
    "var/lib/containerd",
    "var/lib/containers",
    "var/lib/cni",
    "etc/cni/net.d",
    "var/log",
    // dpkg's and debconf's own records of the install (checked: dpkg forgets actk)
    "var/lib/dpkg",
    "var/cache/debconf",
    // the boot: the journal, random seed, timers, the container's machine id
    "var/lib/systemd",
    "etc/machine-id",
    "var/lib/dbus",
    // the simulated driver install of the path unit check
    "lib/modules",
    "usr/lib/modules",
];

fn snapshot(root: &Path) -> Snapshot {
    let mut out = Snapshot::new();
    fn walk(root: &Path, rel: &str, out: &mut Snapshot) {
        let dir = if rel.is_empty() { root.to_path_buf() } else { root.join(rel) };
        let Ok(rd) = std::fs::read_dir(&dir) else { return };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let r = if rel.is_empty() { name } else { format!("{rel}/{name}") };
            if NOT_COMPARED.contains(&r.as_str()) {
                continue;
            }
            let Ok(m) = std::fs::symlink_metadata(e.path()) else { continue };
            let ft = m.file_type();
            let owner = format!("{:o} {}:{}", m.mode() & 0o7777, m.uid(), m.gid());
            let what = if ft.is_dir() {
                format!("dir {owner}")
            } else if ft.is_symlink() {
                format!("link -> {}", std::fs::read_link(e.path()).map(|t| t.display().to_string()).unwrap_or_default())
            } else if ft.is_char_device() || ft.is_block_device() {
                format!("node {owner} {:x}", m.rdev())
            } else if m.len() <= 1 << 20 {
                let bytes = std::fs::read(e.path()).unwrap_or_default();
                // FNV-1a: enough to see a change, no extra crate.
                let h =
                    bytes.iter().fold(0xcbf29ce484222325u64, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x100000001b3));
                format!("file {owner} {} {h:016x}", m.len())
            } else {
                format!("file {owner} {} {}", m.len(), m.mtime())
            };
            out.insert(r.clone(), what);
            if ft.is_dir() {
                walk(root, &r, out);
            }
        }
    }
    walk(root, "", &mut out);
    out
}

fn diff(before: &Snapshot, after: &Snapshot) -> Vec<String> {
    let mut d = Vec::new();
    for (p, b) in before {
        match after.get(p) {
            None => d.push(format!("gone: /{p} ({b})")),
            Some(a) if a != b => d.push(format!("changed: /{p}: {b} -> {a}")),
            _ => {}
        }
    }
    for (p, a) in after {
        if !before.contains_key(p) {
            d.push(format!("left: /{p} ({a})"));
        }
    }
    d
}

/// The `@@key=value` lines of engines.sh.
fn results(out: &str) -> BTreeMap<String, String> {
    out.lines()
        .filter_map(|l| l.strip_prefix("@@")?.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())))
        .collect()
}

#[test]
fn deb_on_a_fresh_debian_root_refreshes_specs_serves_docker_and_podman_and_purges_clean() {
    if !require_root() {
        return;
    }
    let Some(deb) = deb() else {
        skip_or_fail("Run `make deb` (make test does).", "target/debian has no actk_*.deb");
        return;
    };
    for tool in ["systemd-nspawn", "debootstrap", "unshare", "nsenter"] {
        if which(tool).is_none() {
            skip_or_fail(
                "Run scripts/install-deps.sh (systemd-container, debootstrap).",
                &format!("{tool} is not installed"),
            );
            return;
        }
    }
    let t0 = Instant::now();
    let ov = Overlay::new(&engines::cache_dir()).expect("a fresh Debian 12 root");
    let root = ov.root.clone();
    let work = ov.upper().parent().unwrap().to_path_buf();
    let fresh = t0.elapsed();

    // The simulated node and the image the engines run; then the root as it is before the install.
    let node = root.join(NODE);
    sh(
        "preparing the simulated node",
        &format!("{}/fixtures/prepare.sh nvidia-dgx-h100 {}", engines::workspace_root().display(), node.display()),
    );
    sh(
        "busybox image",
        &format!("tar -C {} -cf {}/var/tmp/busybox.tar .", busybox_rootfs().unwrap().display(), root.display()),
    );
    std::fs::copy(&deb, root.join("var/tmp/actk.deb")).unwrap();
    std::fs::create_dir_all(root.join("var/lib/actk/no-devices")).unwrap();
    let before = snapshot(&root);

    // 1. dpkg -i, nothing else asked.
    let o = chroot(&root, &["dpkg", "-i", "/var/tmp/actk.deb"]);
    expect_success("dpkg -i actk.deb", &o);
    assert!(!root.join("etc/docker/daemon.json").exists(), "the install registered a runtime with docker unasked");
    assert!(
        !root.join("etc/containers/containers.conf").exists(),
        "the install registered a runtime with podman unasked"
    );
    for unit in ["actk-cdi-refresh.service", "actk-cdi-refresh.path"] {
        let link = root.join("etc/systemd/system/multi-user.target.wants").join(unit);
        assert!(link.symlink_metadata().is_ok(), "{unit} is not enabled: no {}", link.display());
    }
    assert_eq!(std::fs::read_link(root.join("usr/bin/nvidia-container-runtime-hook")).unwrap(), Path::new("actk-hook"));
    let file =
        sh("file", &format!("file -b {}/usr/bin/actk-runtime {}/usr/bin/actk-hook", root.display(), root.display()));
    assert_eq!(
        file.matches("statically linked").count(),
        2,
        "the package's shims are not the static release builds: {file}"
    );
    let default = expect_success("actk config default", &chroot(&root, &["actk", "config", "default"]));
    assert_eq!(std::fs::read_to_string(root.join("etc/actk/config.toml")).unwrap(), default);

    // The admin points the config at the simulated node (on a host with accelerators: nothing).
    let config = root.join("etc/actk/config.toml");
    let text_ = std::fs::read_to_string(&config).unwrap().replace("root = \"/\"", &format!("root = \"/{NODE}\""));
    std::fs::write(&config, text_).unwrap();

    // 2. Boot: the units at work.
    let t_boot = Instant::now();
    let boot = Boot::start(&root, &work.join("nspawn.log"));
    // systemctl answers once systemd listens on its private socket: until then, ask again. It
    // says "offline" while the container's systemd has not yet created /run/systemd/system (a
    // CI run entered the container that early): not an answer either.
    let deadline = Instant::now() + Duration::from_secs(90);
    let state = loop {
        let (o, e) = text(&boot.exec(&["systemctl", "is-system-running", "--wait"]));
        if !matches!(o.trim(), "" | "offline") || Instant::now() > deadline {
            break format!("{o}{e}");
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(
        matches!(state.trim(), "running" | "degraded"),
        "boot ended {state:?}; failed units: {}",
        text(&boot.exec(&["systemctl", "--failed", "--no-pager"])).0
    );
    assert_eq!(boot.show("actk-cdi-refresh.service", "Result"), "success");
    assert_eq!(boot.show("actk-cdi-refresh.service", "ExecMainStatus"), "0");
    assert_eq!(boot.show("actk-cdi-refresh.path", "ActiveState"), "active");
    let before_list = boot.show("actk-cdi-refresh.service", "Before");
    for engine in ["docker.service", "containerd.service"] {
        assert!(before_list.contains(engine), "the refresh is not ordered before {engine}: {before_list}");
    }
    let all: Vec<String> = (0..8).map(|i| i.to_string()).collect();
    // /run is the container's own tmpfs: the spec is read through the container.
    let spec = |b: &Boot| -> Vec<String> {
        let o = b.exec(&["cat", "/run/cdi/nvidia.com-gpu.json"]);
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
        v["devices"].as_array().into_iter().flatten().filter_map(|d| d["name"].as_str().map(str::to_string)).collect()
    };
    let at_boot = spec(&boot);
    for i in &all {
        assert!(at_boot.contains(i), "the spec written at boot lacks GPU {i}: {at_boot:?}");
    }

    // A GPU goes away (its device node, as when it falls off the bus): udev runs the rule's
    // command, the service generates again, and the GPU leaves the spec.
    let rule = std::fs::read_to_string(root.join("usr/lib/udev/rules.d/70-actk-cdi-refresh.rules")).unwrap();
    let run = rule
        .lines()
        .find(|l| l.starts_with("ACTION==\"add|remove\""))
        .and_then(|l| l.split("RUN+=\"").nth(1))
        .and_then(|r| r.strip_suffix('"'))
        .expect("the rule for device nodes coming and going");
    let id = boot.show("actk-cdi-refresh.service", "InvocationID");
    std::fs::remove_file(node.join("dev/nvidia3")).unwrap();
    let argv: Vec<&str> = run.split_whitespace().collect();
    expect_success("the udev rule's command", &boot.exec(&argv));
    let id = boot.wait_refresh_after(&id);
    let without3 = spec(&boot);
    assert!(
        !without3.contains(&"3".to_string()) && without3.contains(&"2".to_string()),
        "GPU 3 is still in the spec: {without3:?}"
    );

    // The driver is installed again (its package runs depmod): the path unit starts the refresh.
    sh("mknod", &format!("mknod {}/dev/nvidia3 c 195 3 && chmod 666 {}/dev/nvidia3", node.display(), node.display()));
    let depmod = "mkdir -p /lib/modules/$(uname -r) && echo '# depmod' >/lib/modules/$(uname -r)/modules.dep";
    expect_success("writing modules.dep", &boot.exec(&["sh", "-c", depmod]));
    let id = boot.wait_refresh_after(&id);
    assert!(spec(&boot).contains(&"3".to_string()), "GPU 3 did not come back after the driver's modules.dep changed");

    // The admin edits config.toml (here: a root without devices): the path unit runs the
    // refresh, and --prune removes the spec of a kind with no devices left. Then back.
    let edit = |from: &str, to: &str| {
        let t = std::fs::read_to_string(&config).unwrap().replace(from, to);
        std::fs::write(&config, t).unwrap();
    };
    edit(&format!("root = \"/{NODE}\""), "root = \"/var/lib/actk/no-devices\"");
    let id = boot.wait_refresh_after(&id);
    let ls = text(&boot.exec(&["ls", "/run/cdi"])).0;
    assert!(!ls.contains("nvidia.com-gpu.json"), "the spec of a kind with no devices left stays: {ls}");
    edit("root = \"/var/lib/actk/no-devices\"", &format!("root = \"/{NODE}\""));
    boot.wait_refresh_after(&id);
    assert_eq!(spec(&boot).len(), at_boot.len(), "the spec did not come back after the config was restored");

    let verify = boot.exec(&[
        "systemd-analyze",
        "verify",
        "/usr/lib/systemd/system/actk-cdi-refresh.service",
        "/usr/lib/systemd/system/actk-cdi-refresh.path",
    ]);
    let (vo, ve) = text(&verify);
    assert!(verify.status.success() && !ve.contains("actk"), "systemd-analyze verify: {vo}{ve}");
    boot.poweroff();
    let booted = t_boot.elapsed();

    // 3. The engines, in a chroot (own namespaces, /run a tmpfs); the unit's ExecStart first.
    let unit = std::fs::read_to_string(root.join("usr/lib/systemd/system/actk-cdi-refresh.service")).unwrap();
    let execstart = unit.lines().find_map(|l| l.strip_prefix("ExecStart=")).unwrap().to_string();
    std::fs::copy(
        engines::workspace_root().join("crates/e2e/tests/data/package/engines.sh"),
        root.join("var/tmp/engines.sh"),
    )
    .unwrap();
    for d in ["docker", "containers"] {
        std::fs::create_dir_all(work.join(d)).unwrap();
    }
    let r = root.display();
    let w = work.display();
    let script = format!(
        "set -e; mount --make-rprivate /; mount -t proc proc {r}/proc; mount --rbind /sys {r}/sys; mount --rbind /dev {r}/dev; \
         mount -t tmpfs tmpfs {r}/run; mkdir -p {r}/run/lock {r}/var/lib/docker {r}/var/lib/containers; mount --bind {w}/docker {r}/var/lib/docker; \
         mount --bind {w}/containers {r}/var/lib/containers; \
         exec chroot {r} /usr/bin/env -i /bin/sh /var/tmp/engines.sh \"$1\""
    );
    let _cgroups = CgroupParent;
    let t_engines = Instant::now();
    let o = Command::new("timeout")
        .args(["300", "unshare", "--mount", "--net", "--pid", "--fork", "sh", "-c", &script, "sh", &execstart])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let engines_took = t_engines.elapsed();
    let (out, err) = text(&o);
    let logs = || {
        ["refresh.log", "reconfigure.log", "dockerd.log", "who.err", "purge.log"]
            .iter()
            .map(|f| format!("--- {f}\n{}", std::fs::read_to_string(root.join("var/tmp").join(f)).unwrap_or_default()))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let res = results(&out);
    let get = |k: &str| {
        res.get(k).cloned().unwrap_or_else(|| panic!("engines.sh said nothing of {k}:\n{out}\n{err}\n{}", logs()))
    };
    let ctx = format!("\n--- engines.sh\n{out}\n{err}\n{}", logs());
    assert_eq!(get("refresh_rc"), "0", "{ctx}");
    assert!(get("spec").contains("nvidia.com-gpu.json"), "{ctx}");
    assert_eq!(get("gpus1"), "nvidia0", "docker run --gpus 1: {ctx}");
    assert_eq!(get("runtime_actk"), "nvidia1 nvidia3", "docker run --runtime actk: {ctx}");
    assert_eq!(get("podman_cdi"), "nvidia0", "podman run --device nvidia.com/gpu=0: {ctx}");
    assert_eq!(get("reconfigure_docker_rc"), "0", "{ctx}");
    assert_eq!(get("reconfigure_podman_rc"), "0", "{ctx}");
    assert!(get("daemon_json").contains("/usr/bin/actk-runtime"), "{ctx}");
    assert!(get("containers_conf").contains("/usr/bin/actk-runtime"), "{ctx}");
    assert_eq!(get("registrations"), "docker podman", "{ctx}");

    // actk who on the node: the --gpus container holds GPU 2 through the hook, the
    // actk-runtime one GPU 5 through its annotation; docker's names are shown.
    assert_eq!(get("who_rc"), "0", "{ctx}");
    let who: serde_json::Value = serde_json::from_str(&get("who")).unwrap_or_else(|e| panic!("who --json: {e}{ctx}"));
    let holders = |i: u64| {
        who.as_array().unwrap().iter().find(|d| d["kind"] == "nvidia.com/gpu" && d["index"] == i).unwrap()["holders"]
            .clone()
    };
    assert_eq!(holders(2)[0]["container"], "who-hook", "{ctx}");
    assert_eq!(holders(2)[0]["engine"], "docker", "{ctx}");
    assert_eq!(holders(2)[0]["via"], "NVIDIA_VISIBLE_DEVICES (hook)", "{ctx}");
    assert_eq!(holders(5)[0]["container"], "who-shim", "{ctx}");
    assert_eq!(holders(5)[0]["via"], "NVIDIA_VISIBLE_DEVICES (actk-runtime)", "{ctx}");
    assert_eq!(holders(0).as_array().unwrap().len(), 0, "GPU 0 is free: {ctx}");
    assert!(get("who_table").contains("docker who-hook"), "{ctx}");

    // 4. Purge: no registration, no spec, nothing of the package in the root.
    assert_eq!(get("purge_rc"), "0", "{ctx}");
    assert!(!get("spec_after_purge").contains("nvidia.com-gpu.json"), "{ctx}");
    assert!(get("daemon_json_after_purge").contains("No such file"), "{ctx}");
    let status = chroot(&root, &["dpkg", "-s", "actk"]);
    assert!(!status.status.success(), "dpkg still knows actk after the purge: {}", text(&status).0);
    let info: Vec<String> = std::fs::read_dir(root.join("var/lib/dpkg/info"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("actk."))
        .collect();
    assert!(info.is_empty(), "dpkg's records of actk remain: {info:?}");
    for d in ["deb-systemd-helper-enabled", "deb-systemd-helper-masked"] {
        let left =
            sh("find", &format!("find {}/var/lib/systemd/{d} -name 'actk*' 2>/dev/null || true", root.display()));
        assert!(left.trim().is_empty(), "the units' enablement state remains: {left}");
    }
    for f in ["busybox.tar", "actk.deb", "engines.sh"] {
        let _ = std::fs::remove_file(root.join("var/tmp").join(f));
    }
    let after = snapshot(&root);
    let d = diff(&before, &after);
    assert!(d.is_empty(), "the purge left the root changed:\n{}", d.join("\n"));
    eprintln!(
        "package test: fresh root {:.1} s, boot phase {:.1} s, engines phase {:.1} s, total {:.1} s",
        fresh.as_secs_f64(),
        booted.as_secs_f64(),
        engines_took.as_secs_f64(),
        t0.elapsed().as_secs_f64()
    );
}

/// The package's regular files and links as `path -> (kind, mode)`, from `rpm -qp` or `dpkg-deb
/// -c` (kind `-` a file, `l` a link; mode the permission bits), directories left out (dpkg lists
/// every parent, rpm only those it owns).
type Listing = BTreeMap<String, (char, String)>;

fn rpm_listing(rpm: &Path) -> Listing {
    let out = sh(
        "rpm -qp (file list)",
        &format!("rpm -qp --qf '[%{{FILEMODES:perms}} %{{FILENAMES}}\\n]' '{}'", rpm.display()),
    );
    out.lines()
        .filter_map(|l| l.split_once(' '))
        .filter(|(m, _)| !m.starts_with('d'))
        .map(|(m, p)| (p.to_string(), (m.chars().next().unwrap_or('?'), m[1..].to_string())))
        .collect()
}

fn deb_listing(deb: &Path) -> Listing {
    let out = sh("dpkg-deb -c", &format!("dpkg-deb -c '{}'", deb.display()));
    out.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (m, p) = (f.first()?, f.get(5)?);
            let kind = m.chars().next()?;
            (kind != 'd').then(|| (p.trim_start_matches('.').to_string(), (kind, m[1..].to_string())))
        })
        .collect()
}

/// Issue 30, "an .rpm where the tooling allows": the .rpm that `make rpm` builds (make test
/// does) carries what the .deb carries, at the same paths with the same modes, with the same
/// maintainer scripts' work; rpm itself installs it into an empty root (`--root`, rpm's own
/// database there) with the very binaries of target/dist, the packaged `actk` writes the
/// simulated DGX H100's CDI spec from there, and `rpm -e` leaves none of its files.
///
/// Differences allowed, each for a reason: cargo-generate-rpm packages no symlinks, so
/// `nvidia-container-runtime-hook` is a copy of actk-hook (a file) where the .deb has a link;
/// the .deb carries Debian's `copyright` and `changelog.Debian.gz`, which rpm keeps in its
/// header instead. The scriptlets are not run here: an empty root has no shell or systemd (the
/// .deb test runs its maintainer scripts on a booted Debian root); they are checked to be the
/// deploy/rpm scripts and to do what the deb's do (enable the units, register nothing unless
/// asked, remove registrations and specs on erase).
#[test]
fn rpm_carries_what_the_deb_carries_and_installs_and_erases_with_rpm() {
    if !require_root() {
        return;
    }
    let (Some(rpm), Some(deb)) = (rpm(), deb()) else {
        skip_or_fail(
            "Run `make rpm` and `make deb` (make test does).",
            "target/generate-rpm has no actk-*.rpm or target/debian no actk_*.deb",
        );
        return;
    };
    if which("rpm").is_none() || which("dpkg-deb").is_none() {
        skip_or_fail("Run scripts/install-deps.sh (rpm).", "rpm or dpkg-deb is not installed");
        return;
    }

    // 1. The same files, modes and kinds, but for the differences above.
    let mut from_rpm = rpm_listing(&rpm);
    let mut from_deb = deb_listing(&deb);
    let hook = "/usr/bin/nvidia-container-runtime-hook";
    assert_eq!(from_deb.remove(hook).map(|k| k.0), Some('l'), "the .deb's {hook} is a link");
    assert_eq!(from_rpm.remove(hook), Some(('-', "rwxr-xr-x".to_string())), "the .rpm's {hook} is a copy");
    for debian_only in ["/usr/share/doc/actk/copyright", "/usr/share/doc/actk/changelog.Debian.gz"] {
        from_deb.remove(debian_only);
    }
    assert!(from_rpm.contains_key("/usr/bin/actk-runtime"), "rpm lists no actk-runtime: {from_rpm:?}");
    assert_eq!(from_rpm, from_deb, "the .rpm's files (left) and the .deb's (right)");

    // The scriptlets are deploy/rpm's, and each does the work of the .deb's script that runs at
    // the same point (its control files as dpkg-deb extracts them).
    let scripts = sh("rpm -qp --scripts", &format!("rpm -qp --scripts '{}'", rpm.display()));
    let control = tempfile::tempdir().unwrap();
    sh("dpkg-deb -e", &format!("dpkg-deb -e '{}' '{}'", deb.display(), control.path().display()));
    let here = engines::workspace_root().join("deploy/rpm");
    for (name, deb_script, work) in [
        ("post.sh", "postinst", &["/usr/lib/actk/runtime-registrations add", "enable actk-cdi-refresh"][..]),
        (
            "preun.sh",
            "prerm",
            &["/usr/lib/actk/runtime-registrations remove", "/usr/bin/actk cdi clean --output /var/run/cdi"][..],
        ),
        ("postun.sh", "postrm", &["rm -f /var/lib/actk/runtime-registrations"][..]),
    ] {
        let text = std::fs::read_to_string(here.join(name)).unwrap();
        assert!(scripts.contains(text.trim()), "rpm's scriptlets do not hold deploy/rpm/{name}:\n{scripts}");
        let theirs = std::fs::read_to_string(control.path().join(deb_script)).unwrap();
        for w in work {
            assert!(text.contains(w), "deploy/rpm/{name} does not run `{w}`");
            let w = w.replace("enable actk-cdi-refresh", "actk-cdi-refresh.path");
            assert!(theirs.contains(&w), "the .deb's {deb_script} does not run `{w}`:\n{theirs}");
        }
        sh(&format!("sh -n deploy/rpm/{name}"), &format!("sh -n '{}'", here.join(name).display()));
    }

    // 2. rpm installs it into an empty root.
    let work = tempfile::tempdir().unwrap();
    let root = work.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    let r = root.display();
    sh("rpm --initdb", &format!("rpm --root '{r}' --initdb"));
    sh("rpm -i", &format!("rpm --root '{r}' -i --nodeps --noscripts --nosignature '{}'", rpm.display()));
    let listed = sh("rpm -q", &format!("rpm --root '{r}' -q actk"));
    assert!(listed.starts_with("actk-"), "rpm -q after the install: {listed}");
    for b in ["actk", "actk-runtime", "actk-hook"] {
        let installed = std::fs::read(root.join("usr/bin").join(b)).unwrap();
        let built = std::fs::read(engines::target_dir().join("dist").join(b)).unwrap();
        assert!(installed == built, "/usr/bin/{b} from the .rpm is not target/dist/{b}");
    }
    let conf = std::fs::read_to_string(root.join("etc/actk/config.toml")).unwrap();
    assert!(conf.contains("spec_dirs"), "the packaged config.toml: {conf}");

    // The packaged actk writes the simulated node's spec.
    let node = work.path().join("node");
    sh(
        "fixtures/prepare.sh",
        &format!("{}/fixtures/prepare.sh nvidia-dgx-h100 '{}'", engines::workspace_root().display(), node.display()),
    );
    let specs = work.path().join("cdi");
    sh(
        "actk cdi generate (from the .rpm)",
        &format!(
            "'{r}/usr/bin/actk' cdi generate --root '{}' --vendor nvidia --output '{}'",
            node.display(),
            specs.display()
        ),
    );
    let spec = std::fs::read_to_string(specs.join("nvidia.com-gpu.json"))
        .or_else(|_| std::fs::read_to_string(specs.join("nvidia.com-gpu.yaml")))
        .expect("the generated spec");
    for i in 0..8 {
        assert!(spec.contains(&format!("/dev/nvidia{i}")), "the spec lacks /dev/nvidia{i}");
    }

    // 3. rpm -e leaves none of the package's files.
    sh("rpm -e", &format!("rpm --root '{r}' -e --nodeps --noscripts actk"));
    let files = rpm_listing(&rpm);
    let left: Vec<&String> = files.keys().filter(|p| root.join(p.trim_start_matches('/')).exists()).collect();
    assert!(left.is_empty(), "rpm -e left {left:?}");
    let gone = Command::new("rpm").args(["--root", &r.to_string(), "-q", "actk"]).output().unwrap();
    assert!(!gone.status.success(), "rpm still lists actk after rpm -e");
}
