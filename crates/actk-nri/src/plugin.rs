//! The NRI plugin's side of the protocol (containerd/nri `pkg/stub`, written for actk): connect
//! to the NRI socket (or use the socket the runtime handed over in `NRI_PLUGIN_SOCKET` when it
//! launched the plugin itself), multiplex it ([`crate::mux`]), call `Runtime.RegisterPlugin` on
//! connection 2, then serve the `Plugin` service on connection 1: `Configure` (subscribe to
//! CreateContainer), `Synchronize` (nothing to change in running containers), and
//! `CreateContainer`, answered with the adjustment for the container's requests through the
//! same planning path as actk-runtime ([`crate::planner`]). Each request is handled in its own
//! task; planning runs on the blocking pool.
//!
//! Synchronize may come in parts: when the runtime's pods and containers exceed a ttrpc
//! message (4 MiB: many pods with large annotations), NRI 0.8+ (containerd/nri#111, containerd
//! 2.1) sends several requests with `more: true` on all but the last, and drops a plugin that
//! does not answer each with `more: true` and no updates ("plugin does not handle split sync
//! requests"). [`Sync`] collects the parts. Once the last part is in, containers that ask for
//! devices but were not served (created while the plugin was away, with no gate) are logged at
//! warn level, naming pod and container.
//!
//! A container that carries the gate ([`crate::gate`]) gets the gate's mount removed, so it
//! starts only when this plugin served it.

use crate::adjust;
use crate::events::Notifier;
use crate::gate;
use crate::mux::{self, Demux, PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN};
use crate::planner::Planner;
use crate::proto::nri;
use crate::ttrpc::{self, Decoder, Frame, Status, code};
use anyhow::{Context, Result, bail};
use prost::Message;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::sync::mpsc;

/// The `Plugin` service's name on the wire.
pub const PLUGIN_SERVICE: &str = "nri.pkg.api.v1alpha1.Plugin";
/// The `Runtime` service's name on the wire.
pub const RUNTIME_SERVICE: &str = "nri.pkg.api.v1alpha1.Runtime";

/// How the plugin registers.
#[derive(Debug, Clone)]
pub struct Registration {
    /// Plugin name (`actk`).
    pub name: String,
    /// Invocation index, two digits (`10`): plugins are called in ascending order.
    pub idx: String,
}

impl Registration {
    /// The name NRI knows the plugin by: `IDX-NAME` (`10-actk`).
    pub fn id(&self) -> String {
        format!("{}-{}", self.idx, self.name)
    }
}

/// The parts of a split Synchronize received so far on one connection.
#[derive(Debug, Default)]
pub struct Sync {
    parts: usize,
    pods: Vec<nri::PodSandbox>,
    containers: Vec<nri::Container>,
}

/// A whole Synchronize: every part's pods and containers.
#[derive(Debug, Default)]
pub struct Synced {
    /// How many requests it came in.
    pub parts: usize,
    /// Every pod the runtime knows.
    pub pods: Vec<nri::PodSandbox>,
    /// Every container the runtime knows.
    pub containers: Vec<nri::Container>,
}

impl Sync {
    /// Takes one Synchronize request and returns the answer, and the whole synchronization once
    /// `req` was its last part. Every part is answered with no updates (this plugin changes
    /// nothing in running containers) and with `more` as the request says, as NRI requires.
    pub fn part(&mut self, req: nri::SynchronizeRequest) -> (nri::SynchronizeResponse, Option<Synced>) {
        self.parts += 1;
        self.pods.extend(req.pods);
        self.containers.extend(req.containers);
        let answer = nri::SynchronizeResponse { update: Vec::new(), more: req.more };
        if req.more {
            return (answer, None);
        }
        let all = std::mem::take(self);
        (answer, Some(Synced { parts: all.parts, pods: all.pods, containers: all.containers }))
    }
}

/// Events this plugin subscribes to: CreateContainer only (bit `1 << (event - 1)`, NRI api
/// `EventMask`).
pub fn event_mask() -> i32 {
    1 << (nri::Event::CreateContainer as i32 - 1)
}

/// Serves one connection until the runtime closes it. Errors: the registration failed or the
/// byte stream broke.
pub async fn serve(
    stream: UnixStream,
    reg: &Registration,
    planner: Arc<Planner>,
    notifier: Option<Arc<Notifier>>,
) -> Result<()> {
    let (mut rd, mut wr) = stream.into_split();
    // Everything written goes through one task, so frames never interleave.
    let (tx, mut rx) = mpsc::unbounded_channel::<Vec<u8>>();
    let writer = tokio::spawn(async move {
        while let Some(bytes) = rx.recv().await {
            if wr.write_all(&bytes).await.is_err() {
                break;
            }
        }
    });
    let register = nri::RegisterPluginRequest { plugin_name: reg.name.clone(), plugin_idx: reg.idx.clone() };
    let req = Frame::request(1, RUNTIME_SERVICE, "RegisterPlugin", register.encode_to_vec(), 0);
    tx.send(mux::encode(RUNTIME_SERVICE_CONN, &req.encode())).ok();

    let mut demux = Demux::default();
    let (mut plugin_conn, mut runtime_conn) = (Decoder::default(), Decoder::default());
    let mut registered = false;
    let sync = Arc::new(Mutex::new(Sync::default()));
    let id = reg.id();
    let mut buf = vec![0u8; 64 * 1024];
    let result = loop {
        let n = match rd.read(&mut buf).await {
            Ok(0) => break Ok(()),
            Ok(n) => n,
            Err(e) => break Err(anyhow::Error::from(e).context("reading the NRI socket")),
        };
        demux.push(&buf[..n]);
        let mut fail = None;
        while let Some((conn, bytes)) = demux.next_frame().context("NRI multiplexer")? {
            match conn {
                PLUGIN_SERVICE_CONN => plugin_conn.push(&bytes),
                RUNTIME_SERVICE_CONN => runtime_conn.push(&bytes),
                _ => {} // a connection nobody opened (as NRI's multiplexer drops them)
            }
        }
        loop {
            let f = match runtime_conn.next_frame() {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!("NRI runtime connection: {e}; discarded");
                    continue;
                }
            };
            let r = ttrpc::Response::decode(f.payload.as_slice()).context("RegisterPlugin response")?;
            match r.status {
                Some(s) if s.code != code::OK => {
                    fail = Some(anyhow::anyhow!("NRI refused the registration of {id}: {}", s.message))
                }
                _ => {
                    registered = true;
                    tracing::info!("registered with NRI as {id}");
                }
            }
        }
        if let Some(e) = fail {
            break Err(e);
        }
        loop {
            let f = match plugin_conn.next_frame() {
                Ok(Some(f)) => f,
                Ok(None) => break,
                // What ttrpc's server does with such a request: an error for its stream, and on.
                Err(ttrpc::FrameError::TooLong { stream, kind, len }) => {
                    tracing::warn!(
                        "NRI sent a message of {len} bytes on stream {stream}, over ttrpc's 4 MiB; discarded"
                    );
                    if kind == ttrpc::TYPE_REQUEST {
                        let msg =
                            format!("message length {len} exceeds maximum message size of {}", ttrpc::MAX_PAYLOAD);
                        let resp = Frame::response(stream, status(code::RESOURCE_EXHAUSTED, msg), Vec::new());
                        tx.send(mux::encode(PLUGIN_SERVICE_CONN, &resp.encode())).ok();
                    }
                    continue;
                }
            };
            if f.kind != ttrpc::TYPE_REQUEST {
                continue;
            }
            let tx = tx.clone();
            let ctx = Ctx { planner: planner.clone(), sync: sync.clone(), id: id.clone(), notifier: notifier.clone() };
            tokio::spawn(async move {
                let (status, payload) = match ttrpc::Request::decode(f.payload.as_slice()) {
                    Ok(req) => {
                        tracing::debug!("stream {}: {} ({} bytes)", f.stream, req.method, req.payload.len());
                        handle(req, ctx).await
                    }
                    Err(e) => (status(code::INTERNAL, format!("bad ttrpc request: {e}")), Vec::new()),
                };
                tracing::debug!("stream {}: status {} ({} bytes)", f.stream, status.code, payload.len());
                let resp = Frame::response(f.stream, status, payload);
                tx.send(mux::encode(PLUGIN_SERVICE_CONN, &resp.encode())).ok();
            });
        }
    };
    drop(tx);
    let _ = writer.await;
    if !registered && result.is_ok() {
        bail!("the runtime closed the NRI connection before the registration was answered");
    }
    result
}

/// What a request handler needs of its connection.
struct Ctx {
    planner: Arc<Planner>,
    sync: Arc<Mutex<Sync>>,
    id: String,
    notifier: Option<Arc<Notifier>>,
}

fn status(code: i32, message: String) -> Status {
    Status { code, message }
}

/// One `Plugin` method call: (status, encoded response).
async fn handle(req: ttrpc::Request, ctx: Ctx) -> (Status, Vec<u8>) {
    if req.service != PLUGIN_SERVICE {
        return (status(code::UNIMPLEMENTED, format!("service {} is not served here", req.service)), Vec::new());
    }
    let decode_err =
        |what: &str, e: prost::DecodeError| (status(code::INTERNAL, format!("bad {what}: {e}")), Vec::new());
    match req.method.as_str() {
        "Configure" => {
            let c = match nri::ConfigureRequest::decode(req.payload.as_slice()) {
                Ok(c) => c,
                Err(e) => return decode_err("ConfigureRequest", e),
            };
            tracing::info!("configured by {} {}", c.runtime_name, c.runtime_version);
            (ttrpc::ok(), nri::ConfigureResponse { events: event_mask() }.encode_to_vec())
        }
        "Synchronize" => {
            let r = match nri::SynchronizeRequest::decode(req.payload.as_slice()) {
                Ok(r) => r,
                Err(e) => return decode_err("SynchronizeRequest", e),
            };
            let (answer, done) = ctx.sync.lock().unwrap_or_else(|e| e.into_inner()).part(r);
            if let Some(all) = done {
                tracing::info!(
                    "synchronized with the runtime: {} pod(s), {} container(s) in {} message(s)",
                    all.pods.len(),
                    all.containers.len(),
                    all.parts
                );
                // After the answer: the runtime waits for it under its request timeout.
                let (planner, notifier) = (ctx.planner.clone(), ctx.notifier.clone());
                tokio::spawn(async move {
                    let Ok(found) = tokio::task::spawn_blocking(move || unserved(&planner, &all)).await else {
                        return;
                    };
                    for u in &found {
                        tracing::warn!("{}", u.warning());
                    }
                    if let Some(n) = notifier {
                        n.post(&found).await;
                    }
                });
            }
            (ttrpc::ok(), answer.encode_to_vec())
        }
        "CreateContainer" => {
            let r = match nri::CreateContainerRequest::decode(req.payload.as_slice()) {
                Ok(r) => r,
                Err(e) => return decode_err("CreateContainerRequest", e),
            };
            let (planner, id) = (ctx.planner.clone(), ctx.id.clone());
            let answer = tokio::task::spawn_blocking(move || create_container(&planner, &id, &r)).await;
            match answer {
                Ok(Ok(resp)) => (ttrpc::ok(), resp.encode_to_vec()),
                Ok(Err(msg)) => (status(code::INVALID_ARGUMENT, msg), Vec::new()),
                Err(e) => (status(code::INTERNAL, format!("planning failed: {e}")), Vec::new()),
            }
        }
        "UpdateContainer" => (ttrpc::ok(), nri::UpdateContainerResponse::default().encode_to_vec()),
        "StopContainer" => (ttrpc::ok(), nri::StopContainerResponse::default().encode_to_vec()),
        "StateChange" => (ttrpc::ok(), nri::Empty::default().encode_to_vec()),
        "Shutdown" => {
            tracing::warn!(
                "the runtime shuts this plugin down; containers created until it is back get no devices from it"
            );
            (ttrpc::ok(), nri::Empty::default().encode_to_vec())
        }
        m => (status(code::UNIMPLEMENTED, format!("method {m} is not served here")), Vec::new()),
    }
}

/// Who a container is, for messages: `namespace/pod container name` (as [`Unserved::who`]).
fn who(pod: Option<&nri::PodSandbox>, c: &nri::Container) -> String {
    match pod {
        Some(p) => format!("{}/{} container {}", p.namespace, p.name, c.name),
        None => format!("container {}", c.name),
    }
}

/// A running container that asks for devices this plugin would give but that no actk path
/// served: created while the plugin was not connected, it runs without its devices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unserved {
    /// The container's ID (the runtime's), which tells one report from another.
    pub container_id: String,
    /// The container's name.
    pub container: String,
    /// Its pod as the runtime knows it (`None`: the synchronization did not list the pod).
    pub pod: Option<PodRef>,
    /// What it asks for ([`actk_core::plan`]'s summary: `nvidia.com/gpu=2`).
    pub asks: String,
    /// The device nodes the plan gives that the container lacks.
    pub missing: Vec<String>,
}

/// A pod as NRI names it (its PodSandbox): enough to post an Event about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRef {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID (empty when the runtime gave none).
    pub uid: String,
}

impl Unserved {
    /// `namespace/pod container name`, as the plugin's messages name a container.
    pub fn who(&self) -> String {
        match &self.pod {
            Some(p) => format!("{}/{} container {}", p.namespace, p.name, self.container),
            None => format!("container {}", self.container),
        }
    }

    /// The warn log line.
    pub fn warning(&self) -> String {
        format!(
            "{} was created while this NRI plugin was not serving: it asks for {} but runs without {}; delete its pod to recreate it (the device plugin's NRI gate makes such containers fail instead)",
            self.who(),
            self.asks,
            self.missing.join(", ")
        )
    }
}

/// The containers of `all` that ask for devices this plugin would give but that no actk path
/// served (no [`adjust::APPLIED_ANNOTATION`]) and that lack device nodes the plan gives:
/// created while the plugin was not connected, they run without their devices. Stopped
/// containers, and containers whose nodes came another way (containerd's own CDI), are left out.
pub fn unserved(planner: &Planner, all: &Synced) -> Vec<Unserved> {
    let mut out = Vec::new();
    for c in &all.containers {
        if c.state == nri::ContainerState::ContainerStopped as i32
            || c.annotations.contains_key(adjust::APPLIED_ANNOTATION)
        {
            continue;
        }
        let Ok(plan) = planner.plan(&adjust::container_spec(c)) else { continue };
        if plan.is_empty() {
            continue;
        }
        // Served another way (containerd applied the CDI names itself): its nodes are there.
        let have: std::collections::BTreeSet<&str> =
            c.linux.iter().flat_map(|l| l.devices.iter().map(|d| d.path.as_str())).collect();
        let missing: Vec<String> = plan
            .edits
            .device_nodes
            .iter()
            .map(|n| n.path.as_str())
            .filter(|p| !have.contains(p))
            .map(String::from)
            .collect();
        if missing.is_empty() {
            continue;
        }
        let pod = all.pods.iter().find(|p| p.id == c.pod_sandbox_id).map(|p| PodRef {
            namespace: p.namespace.clone(),
            name: p.name.clone(),
            uid: p.uid.clone(),
        });
        out.push(Unserved {
            container_id: c.id.clone(),
            container: c.name.clone(),
            pod,
            asks: plan.summary(),
            missing,
        });
    }
    out
}

/// The answer to CreateContainer: the adjustment for the container's requests (none when it
/// asks for nothing), and the gate's removal when it carries the gate ([`gate`]). `plugin` is
/// the plugin's NRI name (`10-actk`), which error messages start with.
///
/// Errors: the message the user sees, as actk-runtime would print it, after the plugin's name.
pub fn create_container(
    planner: &Planner,
    plugin: &str,
    r: &nri::CreateContainerRequest,
) -> Result<nri::CreateContainerResponse, String> {
    let Some(c) = &r.container else { return Ok(Default::default()) };
    let who = who(r.pod.as_ref(), c);
    let plan = planner.plan(&adjust::container_spec(c)).map_err(|e| format!("actk NRI plugin {plugin}: {who}: {e}"))?;
    for w in &plan.warnings {
        tracing::warn!("{who}: {w}");
    }
    let gated = gate::present(c);
    if plan.is_empty() {
        if !gated {
            return Ok(Default::default());
        }
        let mut adjust = nri::ContainerAdjustment::default();
        gate::remove(&mut adjust);
        return Ok(nri::CreateContainerResponse { adjust: Some(adjust), update: Vec::new() });
    }
    let summary = plan.summary();
    let mut adjust = match adjust::adjustment(&plan.edits, &summary) {
        Ok(a) => a,
        // Edits NRI cannot carry: containerd resolves CDI names itself when every request was
        // served by spec files.
        Err(e) if plan.served.iter().all(|s| s.from_spec) => {
            let names: Vec<String> =
                plan.served.iter().flat_map(|s| s.devices.iter().map(move |d| format!("{}={d}", s.kind))).collect();
            tracing::info!("{who}: {e}; handing containerd the CDI names {}", names.join(","));
            adjust::cdi_devices(&names, &summary)
        }
        Err(e) => return Err(format!("actk NRI plugin {plugin}: {who}: {e}")),
    };
    if gated {
        gate::remove(&mut adjust);
    }
    tracing::info!("{who}: {summary}");
    Ok(nri::CreateContainerResponse { adjust: Some(adjust), update: Vec::new() })
}

/// Connects (or takes the runtime's pre-connected socket) and serves until `stop`; reconnects
/// with a pause when the runtime goes away (a containerd restart), as a DaemonSet plugin must.
/// `notifier`: where Events on pods of unserved containers go ([`crate::events`]), if anywhere.
pub async fn run(
    socket: &std::path::Path,
    reg: Registration,
    planner: Arc<Planner>,
    notifier: Option<Arc<Notifier>>,
) -> Result<()> {
    if let Some(fd) = std::env::var("NRI_PLUGIN_SOCKET").ok().filter(|s| !s.is_empty()) {
        // Launched by the runtime from its plugin directory: one connection, then exit.
        let fd: i32 = fd.parse().with_context(|| format!("NRI_PLUGIN_SOCKET={fd} is not a file descriptor"))?;
        let stream = from_fd(fd)?;
        return serve(stream, &reg, planner, notifier).await;
    }
    let mut warned = false;
    loop {
        match UnixStream::connect(socket).await {
            Ok(s) => {
                warned = false;
                match serve(s, &reg, planner.clone(), notifier.clone()).await {
                    // The runtime closing the connection is the runtime dropping the plugin:
                    // until it is back, containers are created without it.
                    Ok(()) => tracing::warn!(
                        "the runtime closed the NRI connection (its log says why); until this plugin is registered again, containers with the NRI gate fail and others start without their devices; reconnecting"
                    ),
                    Err(e) => tracing::warn!("NRI connection: {e:#}; reconnecting"),
                }
            }
            Err(e) => {
                if !warned {
                    tracing::warn!("cannot connect to NRI socket {}: {e}; retrying every second", socket.display());
                    warned = true;
                }
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The socket the runtime passed down as descriptor `fd` (NRI_PLUGIN_SOCKET).
#[allow(unsafe_code)]
fn from_fd(fd: i32) -> Result<UnixStream> {
    use std::os::fd::{FromRawFd, OwnedFd};
    use std::os::unix::fs::FileTypeExt;
    let is_socket = std::fs::metadata(format!("/proc/self/fd/{fd}")).is_ok_and(|m| m.file_type().is_socket());
    if fd < 3 || !is_socket {
        bail!("NRI_PLUGIN_SOCKET={fd}: not an open socket of this process");
    }
    // SAFETY: the runtime started this process with `fd` open for it (NRI's plugin launch
    // protocol); it is taken over once, here, and nothing else in the process uses that number.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    let std = std::os::unix::net::UnixStream::from(owned);
    std.set_nonblocking(true)?;
    Ok(UnixStream::from_std(std)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn container(id: &str, pod: &str, env: &[&str]) -> nri::Container {
        nri::Container {
            id: id.into(),
            pod_sandbox_id: pod.into(),
            name: format!("ctr-{id}"),
            state: nri::ContainerState::ContainerRunning as i32,
            env: env.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    fn pod(id: &str) -> nri::PodSandbox {
        nri::PodSandbox {
            id: id.into(),
            name: format!("pod-{id}"),
            namespace: "ns".into(),
            uid: format!("uid-{id}"),
            ..Default::default()
        }
    }

    /// containerd/nri#111: every part but the last is answered `more: true` with no updates,
    /// the last `more: false`; the parts add up to the whole runtime state (issue 28, item 8).
    #[test]
    fn a_split_synchronize_is_answered_more_until_its_last_part() {
        let mut s = Sync::default();
        let parts = [
            nri::SynchronizeRequest { pods: vec![pod("a"), pod("b")], containers: vec![], more: true },
            nri::SynchronizeRequest { pods: vec![pod("c")], containers: vec![container("1", "a", &[])], more: true },
            nri::SynchronizeRequest { pods: vec![], containers: vec![container("2", "c", &[])], more: false },
        ];
        let mut answers = Vec::new();
        let mut done = None;
        for p in parts {
            let (a, d) = s.part(p);
            answers.push((a.more, a.update.len()));
            if d.is_some() {
                done = d;
            }
        }
        assert_eq!(answers, [(true, 0), (true, 0), (false, 0)]);
        let all = done.expect("the last part completes it");
        assert_eq!((all.parts, all.pods.len(), all.containers.len()), (3, 3, 2));
        // The next synchronization (a reconnect) starts afresh.
        let (a, d) = s.part(nri::SynchronizeRequest::default());
        assert_eq!((a.more, d.map(|d| (d.parts, d.pods.len()))), (false, Some((1, 0))));
    }

    fn planner(root: &std::path::Path) -> Planner {
        let cfg = actk_core::config::Config {
            root: root.to_path_buf(),
            spec_dirs: vec![],
            profiles_dir: root.join("nonexistent-profiles.d"),
            ..Default::default()
        };
        Planner::new(&cfg, Duration::from_secs(60), None).unwrap()
    }

    /// A container with the gate loses the gate's mount and keeps its devices; one without
    /// requests but with the gate loses only the mount; one without gate or requests gets
    /// nothing.
    #[test]
    fn the_gate_mount_is_removed_from_every_served_container() {
        let Some(fx) = actk_testsupport::fixture::prepare("nvidia-dgx-h100").unwrap() else { return };
        let p = planner(&fx.root);
        let gate_mount = nri::Mount {
            destination: gate::CONTAINER_PATH.into(),
            source: gate::source("10-actk"),
            r#type: "bind".into(),
            options: vec!["bind".into(), "ro".into()],
        };
        let mut c = container("1", "a", &["NVIDIA_VISIBLE_DEVICES=1"]);
        c.mounts.push(gate_mount.clone());
        let req = nri::CreateContainerRequest { pod: Some(pod("a")), container: Some(c) };
        let a = create_container(&p, "10-actk", &req).unwrap().adjust.unwrap();
        assert!(a.mounts.iter().any(|m| m.destination == "-/run/actk-nri-gate"), "{:?}", a.mounts);
        assert!(a.linux.unwrap().devices.iter().any(|d| d.path == "/dev/nvidia1"));

        let mut c = container("2", "a", &[]);
        c.mounts.push(gate_mount);
        let req = nri::CreateContainerRequest { pod: Some(pod("a")), container: Some(c) };
        let a = create_container(&p, "10-actk", &req).unwrap().adjust.unwrap();
        assert_eq!(a.mounts.len(), 1);
        assert!(a.linux.is_none() && a.env.is_empty());

        let req = nri::CreateContainerRequest { pod: Some(pod("a")), container: Some(container("3", "a", &[])) };
        assert_eq!(create_container(&p, "10-actk", &req).unwrap().adjust, None);

        let req = nri::CreateContainerRequest {
            pod: Some(pod("a")),
            container: Some(container("4", "a", &["NVIDIA_VISIBLE_DEVICES=9"])),
        };
        let err = create_container(&p, "10-actk", &req).unwrap_err();
        assert!(err.starts_with("actk NRI plugin 10-actk: ns/pod-a container ctr-4: "), "{err}");
    }

    /// After a synchronization, running containers that ask for devices but carry no sign of
    /// having been served are named; served, stopped and requestless ones are not.
    #[test]
    fn containers_created_while_the_plugin_was_away_are_named() {
        let Some(fx) = actk_testsupport::fixture::prepare("nvidia-dgx-h100").unwrap() else { return };
        let p = planner(&fx.root);
        let mut served = container("1", "a", &["NVIDIA_VISIBLE_DEVICES=0"]);
        served.annotations.insert(adjust::APPLIED_ANNOTATION.into(), "nvidia.com/gpu=0".into());
        let mut stopped = container("2", "a", &["NVIDIA_VISIBLE_DEVICES=0"]);
        stopped.state = nri::ContainerState::ContainerStopped as i32;
        let missed = container("3", "b", &["NVIDIA_VISIBLE_DEVICES=2"]);
        let plain = container("4", "b", &["PATH=/bin"]);
        let mut via_cdi = container("5", "b", &["NVIDIA_VISIBLE_DEVICES=0"]);
        let nodes =
            ["/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"];
        via_cdi.linux = Some(nri::LinuxContainer {
            devices: nodes.iter().map(|p| nri::LinuxDevice { path: p.to_string(), ..Default::default() }).collect(),
            ..Default::default()
        });
        let all = Synced {
            parts: 1,
            pods: vec![pod("a"), pod("b")],
            containers: vec![served, stopped, missed, plain, via_cdi],
        };
        let found = unserved(&p, &all);
        let w: Vec<String> = found.iter().map(Unserved::warning).collect();
        assert_eq!(w.len(), 1, "{w:?}");
        let pod = found[0].pod.as_ref().expect("its pod, for the Event");
        assert_eq!((pod.namespace.as_str(), pod.name.as_str(), found[0].container_id.as_str()), ("ns", "pod-b", "3"));
        assert!(found[0].missing.iter().any(|n| n == "/dev/nvidia2"), "{:?}", found[0].missing);
        assert!(
            w[0].starts_with("ns/pod-b container ctr-3 was created while this NRI plugin was not serving"),
            "{w:?}"
        );
        assert!(w[0].contains("nvidia.com/gpu=2") && w[0].contains("/dev/nvidia2"), "{w:?}");
    }
}
