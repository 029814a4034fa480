//! actk-inject: the privileged part of actk (DESIGN.md "Crates"): applying CDI container edits
//! to a live container from an OCI hook.
//!
//! Everything inside the container goes through [`root::ContainerRoot`] (openat2
//! `RESOLVE_IN_ROOT`), mounts are cloned from the host driver root and attached by fd in the
//! container's mount namespace ([`mounts`]), device access is granted in the container's device
//! cgroup ([`cgroup`], [`bpf`]), and the injected library directories are added to the
//! container's ld.so.cache by actk itself, through the same resolver ([`ldcache`]: no ldconfig
//! runs). Every exec gets [`env::minimal_env`].
//!
//! Entry point: [`inject`].

pub mod bpf;
pub mod budget;
pub mod cgroup;
pub mod compat;
pub mod env;
pub mod error;
pub mod ldcache;
pub mod mounts;
pub mod nodes;
pub mod root;

pub use error::{InjectError, Result};

use actk_core::cdi::ContainerEdits;
use bpf::DeviceRule;
use std::path::{Path, PathBuf};

/// The live container to inject into.
#[derive(Debug)]
pub struct Target {
    /// The container's init pid on the host (OCI state `pid`), used for its cgroup; 0 = the
    /// caller's own cgroup ([`Target::current`]).
    pub pid: i32,
    /// The container's root filesystem as its mount namespace sees it.
    pub root: root::ContainerRoot,
    /// `/proc/PID/ns/mnt`, or `None` to attach mounts in the caller's own namespace.
    pub mnt_ns: Option<rustix::fd::OwnedFd>,
    /// When the container has its own user namespace (podman rootless and `--uidmap`, Docker
    /// userns-remap, Kubernetes `hostUsers: false`): the uid and gid of its root as this process
    /// sees them (the host ids from outside, 0 and 0 from inside). Device nodes are then
    /// bind-mounted from the host, as runc does, and files on the container's own /dev are
    /// created as its root.
    pub userns: Option<(u32, u32)>,
}

impl Target {
    /// The target for a container of the OCI state `pid` whose bundle rootfs is `rootfs`
    /// (absolute host path), for hooks the runtime runs in its own namespaces (prestart,
    /// createRuntime).
    ///
    /// Errors: the root cannot be opened, or it is the caller's own root directory (a `pid`
    /// that is not the container's, e.g. a pid of another pid namespace: never inject into the host).
    ///
    /// Also refused: a `pid` whose mount namespace is the caller's own or the host's (pid 1's):
    /// that is a host process, not a container (a forged or stale OCI state), and injecting
    /// would bind-mount into the host and grant that process devices.
    pub fn for_pid(pid: i32, rootfs: &Path) -> Result<Target> {
        let mnt_ns = mounts::open_mnt_ns(pid)?;
        refuse_shared_mnt_ns(pid, &mnt_ns)?;
        let root = root::ContainerRoot::for_pid(pid, rootfs)?;
        refuse_own_root(&root)?;
        let userns = root_ids(&format!("/proc/{pid}/uid_map"), &format!("/proc/{pid}/gid_map"))?;
        Ok(Target { pid, root, mnt_ns: Some(mnt_ns), userns })
    }

    /// The target for a hook that runs inside the container's mount and pid namespaces before
    /// pivot_root (runc runs createContainer hooks there, and the state's `pid` is then the
    /// container-namespace pid, useless against the host's /proc): the rootfs is opened in the
    /// caller's own mount namespace, mounts are attached there, and the device cgroup is the
    /// caller's (a hook is a child of the container's init, in its cgroup). `pid` is 0.
    ///
    /// Refused when the caller's mount namespace is the host's (pid 1's): a container without
    /// its own mount namespace would have its mounts attached to the host.
    pub fn current(rootfs: &Path) -> Result<Target> {
        let own = mounts::open_mnt_ns_path("/proc/thread-self/ns/mnt")?;
        if host_mnt_ns().is_some_and(|host| ns_id(&own, "/proc/thread-self/ns/mnt").ok() == Some(host)) {
            return Err(InjectError::HostRefused {
                path: "/proc/thread-self/ns/mnt".into(),
                reason: "this hook runs in the host's mount namespace, not a container's; refusing to inject (does the container have a mount namespace?)".into(),
            });
        }
        let root = root::ContainerRoot::open(rootfs)?;
        refuse_own_root(&root)?;
        let userns = in_child_user_namespace()?.then_some((0, 0));
        Ok(Target { pid: 0, root, mnt_ns: None, userns })
    }
}

impl Target {
    /// The container of OCI state `pid` and bundle rootfs `rootfs` for an OCI hook, whichever
    /// stage runs it and however the container shares namespaces with the host (issue 25 item
    /// 1). Where the hook runs decides, judged by mount namespace, not PID namespace alone:
    /// - in a PID namespace below /proc's (runc's createContainer of a container with its own
    ///   PID namespace: the state's pid is the container's pid 1, meaningless here) it runs
    ///   inside the container: [`Target::current`];
    /// - in /proc's PID namespace, the state's pid is valid here; when its mount namespace is
    ///   this hook's own, the hook runs inside the container's mount namespace (createContainer
    ///   of a container without its own PID namespace: `docker run --pid=host`, Kubernetes
    ///   `hostPID: true`): [`Target::current`], which still refuses the host's mount namespace;
    /// - otherwise the hook runs in the runtime's namespaces (prestart, createRuntime):
    ///   [`Target::for_pid`].
    ///
    /// Errors: those of [`Target::current`] and [`Target::for_pid`]; and, when the pid shares
    /// this hook's mount namespace but the host's cannot be read to tell it apart, a
    /// refusal: without that check a forged state naming a host process would have the hook
    /// inject into the host.
    pub fn for_hook(pid: i32, rootfs: &Path) -> Result<Target> {
        if in_child_pid_namespace()? {
            return Target::current(rootfs);
        }
        let theirs = mounts::open_mnt_ns(pid)?;
        let own = mounts::open_mnt_ns_path("/proc/thread-self/ns/mnt")?;
        let own_id = ns_id(&own, "/proc/thread-self/ns/mnt")?;
        if ns_id(&theirs, &format!("/proc/{pid}/ns/mnt"))? != own_id {
            return Target::for_pid(pid, rootfs);
        }
        let why = match host_mnt_ns() {
            None => "and the host's (pid 1's or kthreadd's) cannot be read to tell whether that is a container's",
            Some(host) if host == own_id => {
                "which is the host's: it is not a container's process (a forged or stale state?)"
            }
            Some(_) => return Target::current(rootfs),
        };
        Err(InjectError::HostRefused {
            path: format!("/proc/{pid}/ns/mnt").into(),
            reason: format!(
                "pid {pid} of the OCI state shares this hook's own mount namespace, {why}; refusing to inject"
            ),
        })
    }
}

/// The ids that user namespace maps to 0 inside, from `uid_map`/`gid_map` (`inside outside
/// count` lines; proc(5) user_namespaces). `None` for the initial namespace (`0 0 4294967295`).
fn root_ids(uid_map: &str, gid_map: &str) -> Result<Option<(u32, u32)>> {
    let read = |p: &str| std::fs::read_to_string(p).map_err(|e| InjectError::host("read", p, e));
    let (u, g) = (read(uid_map)?, read(gid_map)?);
    if is_identity_map(&u) {
        return Ok(None);
    }
    let zero = |map: &str| {
        map.lines().find_map(|l| {
            let v: Vec<u64> = l.split_whitespace().filter_map(|x| x.parse().ok()).collect();
            match v[..] {
                [inside, outside, count] if inside == 0 && count > 0 => u32::try_from(outside).ok(),
                _ => None,
            }
        })
    };
    // A namespace that does not map 0 has no root: its files are created by nobody we can be.
    Ok(Some((zero(&u).unwrap_or(0), zero(&g).unwrap_or(0))))
}

fn is_identity_map(map: &str) -> bool {
    let lines: Vec<Vec<&str>> = map.lines().map(|l| l.split_whitespace().collect()).collect();
    matches!(lines.as_slice(), [l] if l.as_slice() == ["0", "0", "4294967295"])
}

/// True when this process runs in a user namespace below the initial one (its uid_map is not
/// the identity): a hook run inside the container (runc's createContainer) of a container with
/// its own user namespace.
pub fn in_child_user_namespace() -> Result<bool> {
    let map = std::fs::read_to_string("/proc/self/uid_map")
        .map_err(|e| InjectError::host("read", "/proc/self/uid_map", e))?;
    Ok(!is_identity_map(&map))
}

/// True when the caller runs in a pid namespace below that of the mounted /proc: its pid as
/// /proc names it (`/proc/self`) differs from getpid(). That is the case of a hook run inside
/// the container (createContainer with runc).
pub fn in_child_pid_namespace() -> Result<bool> {
    let link = std::fs::read_link("/proc/self").map_err(|e| InjectError::host("readlink", "/proc/self", e))?;
    let procs_pid: i32 = link.to_string_lossy().parse().map_err(|_| InjectError::HostRefused {
        path: "/proc/self".into(),
        reason: format!("points to {link:?}, not a pid; is /proc a procfs?"),
    })?;
    Ok(procs_pid != rustix::process::getpid().as_raw_nonzero().get())
}

/// `(st_dev, st_ino)` of a namespace file: equal pairs are the same namespace (namespaces(7)).
fn ns_id(fd: &rustix::fd::OwnedFd, shown: &str) -> Result<(u64, u64)> {
    let st = rustix::fs::fstat(fd).map_err(|e| InjectError::host("stat", shown, e))?;
    Ok((st.st_dev, st.st_ino))
}

/// The host's mount namespace, when it can be read: pid 1's; else, when pid 1 hides it (an init
/// that is not dumpable, such as some VM agents, hides its namespace files even from root), that
/// of kthreadd, pid 2 of the initial PID namespace (the one process with `Name: kthreadd` and
/// `PPid: 0`), whose kernel threads live in the initial mount namespace. `None` when neither
/// can be read: then only the comparison with the caller's own namespace is made.
fn host_mnt_ns() -> Option<(u64, u64)> {
    if let Ok(init) = mounts::open_mnt_ns(1) {
        return ns_id(&init, "/proc/1/ns/mnt").ok();
    }
    let status = std::fs::read_to_string("/proc/2/status").ok()?;
    let field = |k: &str| status.lines().find_map(|l| l.strip_prefix(k)).map(str::trim);
    if field("Name:") != Some("kthreadd") || field("PPid:") != Some("0") {
        return None;
    }
    let kthreadd = mounts::open_mnt_ns(2).ok()?;
    ns_id(&kthreadd, "/proc/2/ns/mnt").ok()
}

/// Refuses a target whose mount namespace (`ns`, opened from `/proc/PID/ns/mnt` and kept for the
/// injection, so the check holds for the namespace actually entered) is the caller's or pid 1's.
fn refuse_shared_mnt_ns(pid: i32, ns: &rustix::fd::OwnedFd) -> Result<()> {
    let theirs = ns_id(ns, &format!("/proc/{pid}/ns/mnt"))?;
    let own = mounts::open_mnt_ns_path("/proc/thread-self/ns/mnt")?;
    let whose = if theirs == ns_id(&own, "/proc/thread-self/ns/mnt")? {
        "this hook's own"
    } else if host_mnt_ns() == Some(theirs) {
        "the host's (pid 1's)"
    } else {
        return Ok(());
    };
    Err(InjectError::HostRefused {
        path: format!("/proc/{pid}/ns/mnt").into(),
        reason: format!(
            "pid {pid} of the OCI state shares {whose} mount namespace: it is not a container's process (a forged or stale state?); refusing to inject"
        ),
    })
}

fn refuse_own_root(root: &root::ContainerRoot) -> Result<()> {
    let mine = rustix::fs::stat("/").map_err(|e| InjectError::host("stat", "/", e))?;
    let theirs = rustix::fs::fstat(root.as_fd()).map_err(|e| InjectError::host("stat", root.shown(), e))?;
    if (mine.st_dev, mine.st_ino) == (theirs.st_dev, theirs.st_ino) {
        return Err(InjectError::Refused {
            path: "/".into(),
            root: root.shown().to_path_buf(),
            reason: "the container root is this process's own root directory; refusing to inject into the host (wrong pid in the OCI state?)".into(),
        });
    }
    Ok(())
}

/// How to inject.
#[derive(Debug, Clone)]
pub struct Options {
    /// Host root: device nodes without numbers are stat'ed under it, and mount sources must be
    /// under it unless `driver_root` is set (`/` on a node).
    pub host_root: PathBuf,
    /// Whether to add the injected library directories to the container's ld.so.cache.
    pub ldcache: bool,
    /// Root of the driver's files when apart from `host_root` (a GPU Operator driver container,
    /// `/run/nvidia/driver`): mount sources must be under it.
    pub driver_root: Option<PathBuf>,
    /// Whether to add device cgroup rules (false for tests that inject into a plain directory).
    pub cgroup: bool,
    /// The container's own device rules (config.json `linux.resources.devices`), kept in a
    /// cgroup v2 replacement program.
    pub existing_device_rules: Vec<DeviceRule>,
    /// The container user's uid and gid (config.json `process.user`, each `None` when 0): a
    /// node whose edit names no owner is made theirs, as the runtime path does
    /// (actk_core::edits::node_owner), so a non-root container can open a 0660 node.
    pub owner: (Option<u32>, Option<u32>),
}

impl Default for Options {
    fn default() -> Self {
        Options {
            host_root: PathBuf::from("/"),
            driver_root: None,
            ldcache: true,
            cgroup: true,
            existing_device_rules: Vec::new(),
            owner: (None, None),
        }
    }
}

/// What [`inject`] did, for logs and tests.
#[derive(Debug, Default)]
pub struct Report {
    /// Device nodes by container path and what happened.
    pub nodes: Vec<(String, nodes::NodeOutcome)>,
    /// Container paths bind-mounted.
    pub mounts: Vec<String>,
    /// The device controller written, when cgroup rules were added.
    pub cgroup: Option<cgroup::DeviceController>,
    /// The ld.so.cache step.
    pub ldcache: Option<ldcache::LdcacheOutcome>,
    /// Edits a live container cannot take (env, additional GIDs, hooks), one line each.
    pub not_applicable: Vec<String>,
}

/// Applies `edits` to the live container `target`.
///
/// Order: everything that reads the host happens first (node numbers, mount sources cloned),
/// then the container is changed: nodes, mount targets, mounts, cgroup rules, ld.so.cache. Env, hooks and additional GIDs cannot change in a created container; they
/// are listed in [`Report::not_applicable`] (actk-runtime applies them to config.json instead).
///
/// Errors: the first [`InjectError`]; nothing is rolled back (all changes are inside the
/// container and go away with it). `netDevices` and `intelRdt` edits are refused before anything
/// changes ([`InjectError::NotInjectable`]).
pub fn inject(target: &Target, edits: &ContainerEdits, opts: &Options) -> Result<Report> {
    let mut report = Report::default();
    refuse_runtime_only(edits)?;
    let specs: Vec<nodes::NodeSpec> = edits
        .device_nodes
        .iter()
        .map(|n| {
            let mut s = nodes::NodeSpec::from_cdi(n, &opts.host_root)?;
            s.uid = s.uid.or(opts.owner.0);
            s.gid = s.gid.or(opts.owner.1);
            Ok(s)
        })
        .collect::<Result<_>>()?;
    let mut prepared = Vec::new();
    let mount_root = opts.driver_root.as_deref().unwrap_or(&opts.host_root);
    let host_root = if edits.mounts.is_empty() { None } else { Some(mounts::HostRoot::open(mount_root)?) };
    for m in &edits.mounts {
        let t = m.mount_type.as_deref().unwrap_or("bind");
        if t != "bind" && t != "rbind" && !m.options.iter().any(|o| o == "bind" || o == "rbind") {
            return Err(InjectError::HostRefused {
                path: m.host_path.clone().into(),
                reason: format!("mount type {t:?} cannot be injected by a hook; only bind mounts of host files"),
            });
        }
        let Some(hr) = &host_root else { break };
        prepared.push(mounts::PreparedMount::new(hr, Path::new(&m.host_path), &m.container_path)?);
    }

    // A container with its own user namespace gets the host's nodes bind-mounted (runc's way:
    // it cannot mknod, and its /dev is nodev); the others get nodes made with mknod.
    if target.userns.is_some() && !specs.is_empty() {
        let dev_root = mounts::HostRoot::open(&opts.host_root)?;
        for (s, n) in specs.iter().zip(&edits.device_nodes) {
            let source = match &n.host_path {
                Some(h) => PathBuf::from(h),
                None => opts.host_root.join(n.path.trim_start_matches('/')),
            };
            prepared.push(mounts::PreparedMount::device(&dev_root, &source, &s.path)?);
            report.nodes.push((s.path.clone(), nodes::NodeOutcome::BindMounted));
        }
    } else {
        for s in &specs {
            report.nodes.push((s.path.clone(), nodes::create_node(&target.root, s)?));
        }
    }
    for p in &mut prepared {
        p.create_target_as(&target.root, target.userns)?;
    }
    mounts::attach(target.mnt_ns.as_ref().map(rustix::fd::AsFd::as_fd), target.pid, &prepared)?;
    report.mounts = prepared.iter().map(|p| p.target.clone()).collect();
    if opts.cgroup && !specs.is_empty() {
        let rules: Vec<DeviceRule> =
            specs.iter().map(|s| DeviceRule::allow_node(s.kind, s.major, s.minor, &s.permissions)).collect();
        report.cgroup = Some(cgroup::allow(target.pid, &opts.existing_device_rules, &rules)?);
    }
    let dirs = lib_dirs(edits);
    if opts.ldcache && !dirs.is_empty() {
        report.ldcache = Some(ldcache::update(&target.root, &dirs)?);
    }
    for e in &edits.env {
        report.not_applicable.push(format!("env {e}"));
    }
    for g in &edits.additional_gids {
        report.not_applicable.push(format!("additional GID {g}"));
    }
    for h in &edits.hooks {
        report.not_applicable.push(format!("{} hook {}", h.hook_name, h.path));
    }
    Ok(report)
}

/// Refuses edits only the runtime can apply at create time (`netDevices`, `intelRdt`): moving a
/// network device into the container or setting its resctrl group is not a hook's work, and
/// dropping them quietly would start the container without what it asked for.
pub fn refuse_runtime_only(edits: &ContainerEdits) -> Result<()> {
    let runtime_only = [("netDevices", !edits.net_devices.is_empty()), ("intelRdt", edits.intel_rdt.is_some())];
    match runtime_only.iter().find(|(_, set)| *set) {
        Some((field, _)) => Err(InjectError::NotInjectable {
            field,
            reason: "request the device through actk-runtime (or a CDI-aware engine), which puts it into config.json before the container is created".into(),
        }),
        None => Ok(()),
    }
}

/// Container directories that need an ld.so.cache entry: the parents of mounted shared
/// libraries (`*.so`, `*.so.N...`) and the `--folder` arguments of update-ldcache hooks.
pub fn lib_dirs(edits: &ContainerEdits) -> Vec<String> {
    let mut dirs: Vec<String> = Vec::new();
    let mut add = |d: &str| {
        if !d.is_empty() && !dirs.iter().any(|x| x == d) {
            dirs.push(d.to_string());
        }
    };
    for m in &edits.mounts {
        let p = Path::new(&m.container_path);
        let name = p.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default();
        if (name.ends_with(".so") || name.contains(".so."))
            && let Some(parent) = p.parent()
        {
            add(&parent.to_string_lossy());
        }
    }
    for h in &edits.hooks {
        let mut it = h.args.iter();
        while let Some(a) = it.next() {
            if a == "--folder" {
                if let Some(f) = it.next() {
                    add(f);
                }
            } else if let Some(f) = a.strip_prefix("--folder=") {
                add(f);
            }
        }
    }
    dirs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_process_is_not_a_container() {
        // The test's own pid and pid 1 share the host's mount namespace (or this one's).
        let e = Target::for_pid(std::process::id() as i32, Path::new("/")).unwrap_err().to_string();
        assert!(e.contains("shares this hook's own mount namespace") && e.contains("refusing to inject"), "{e}");
        if mounts::open_mnt_ns(1).is_ok() {
            // pid 1 is readable here: it is the host.
            let e = Target::for_pid(1, Path::new("/")).unwrap_err().to_string();
            assert!(e.contains("mount namespace") && e.contains("refusing to inject"), "{e}");
        }
        if host_mnt_ns().is_some() {
            // The host's namespace is known (pid 1's or kthreadd's), and the caller is in it.
            let e = Target::current(Path::new("/tmp")).unwrap_err().to_string();
            assert!(e.contains("host's mount namespace"), "{e}");
            // Issue 25 item 1: a state naming a host process, seen from the host's mount
            // namespace by a hook of any stage, is still refused (the pid shares the hook's
            // mount namespace, which is the host's).
            let e = Target::for_hook(std::process::id() as i32, Path::new("/tmp")).unwrap_err().to_string();
            assert!(
                e.contains("shares this hook's own mount namespace, which is the host's")
                    && e.contains("refusing to inject"),
                "{e}"
            );
        }
    }
    use actk_core::cdi::{CdiHook, CdiMount};

    #[test]
    fn lib_dirs_from_library_mounts_and_update_ldcache_hooks() {
        let m = |c: &str| CdiMount { host_path: format!("/host{c}"), container_path: c.into(), ..Default::default() };
        let edits = ContainerEdits {
            mounts: vec![
                m("/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
                m("/usr/lib/x86_64-linux-gnu/libcuda.so"),
                m("/usr/bin/nvidia-smi"),
                m("/lib/firmware/nvidia/gsp.bin"),
            ],
            hooks: vec![CdiHook {
                hook_name: "createContainer".into(),
                path: "/usr/bin/actk-hook".into(),
                args: vec![
                    "actk-hook".into(),
                    "update-ldcache".into(),
                    "--folder".into(),
                    "/opt/compat".into(),
                    "--folder=/usr/lib/x86_64-linux-gnu".into(),
                ],
                ..Default::default()
            }],
            ..Default::default()
        };
        assert_eq!(lib_dirs(&edits), vec!["/usr/lib/x86_64-linux-gnu".to_string(), "/opt/compat".to_string()]);
    }
}
