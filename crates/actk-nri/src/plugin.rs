//! The NRI plugin's side of the protocol (containerd/nri `pkg/stub`, written for actk): connect
//! to the NRI socket (or use the socket the runtime handed over in `NRI_PLUGIN_SOCKET` when it
//! launched the plugin itself), multiplex it ([`crate::mux`]), call `Runtime.RegisterPlugin` on
//! connection 2, then serve the `Plugin` service on connection 1: `Configure` (subscribe to
//! CreateContainer), `Synchronize` (nothing to change in running containers), and
//! `CreateContainer`, answered with the adjustment for the container's requests through the
//! same planning path as actk-runtime ([`crate::planner`]). Each request is handled in its own
//! task; planning runs on the blocking pool.

use crate::adjust;
use crate::mux::{self, Demux, PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN};
use crate::planner::Planner;
use crate::proto::nri;
use crate::ttrpc::{self, Decoder, Frame, Status, code};
use anyhow::{Context, Result, bail};
use prost::Message;
use std::sync::Arc;
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

/// Events this plugin subscribes to: CreateContainer only (bit `1 << (event - 1)`, NRI api
/// `EventMask`).
pub fn event_mask() -> i32 {
    1 << (nri::Event::CreateContainer as i32 - 1)
}

/// Serves one connection until the runtime closes it. Errors: the registration failed or the
/// byte stream broke.
pub async fn serve(stream: UnixStream, reg: &Registration, planner: Arc<Planner>) -> Result<()> {
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
        while let Some(f) = runtime_conn.next_frame()? {
            let r = ttrpc::Response::decode(f.payload.as_slice()).context("RegisterPlugin response")?;
            match r.status {
                Some(s) if s.code != code::OK => {
                    fail = Some(anyhow::anyhow!("NRI refused the registration of {}: {}", reg.name, s.message))
                }
                _ => {
                    registered = true;
                    tracing::info!("registered with NRI as {}-{}", reg.idx, reg.name);
                }
            }
        }
        if let Some(e) = fail {
            break Err(e);
        }
        while let Some(f) = plugin_conn.next_frame()? {
            if f.kind != ttrpc::TYPE_REQUEST {
                continue;
            }
            let tx = tx.clone();
            let planner = planner.clone();
            tokio::spawn(async move {
                let (status, payload) = match ttrpc::Request::decode(f.payload.as_slice()) {
                    Ok(req) => {
                        tracing::debug!("stream {}: {} ({} bytes)", f.stream, req.method, req.payload.len());
                        handle(req, planner).await
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

fn status(code: i32, message: String) -> Status {
    Status { code, message }
}

/// One `Plugin` method call: (status, encoded response).
async fn handle(req: ttrpc::Request, planner: Arc<Planner>) -> (Status, Vec<u8>) {
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
        // Running containers keep what they have.
        "Synchronize" => (ttrpc::ok(), nri::SynchronizeResponse::default().encode_to_vec()),
        "CreateContainer" => {
            let r = match nri::CreateContainerRequest::decode(req.payload.as_slice()) {
                Ok(r) => r,
                Err(e) => return decode_err("CreateContainerRequest", e),
            };
            let answer = tokio::task::spawn_blocking(move || create_container(&planner, &r)).await;
            match answer {
                Ok(Ok(resp)) => (ttrpc::ok(), resp.encode_to_vec()),
                Ok(Err(msg)) => (status(code::INVALID_ARGUMENT, msg), Vec::new()),
                Err(e) => (status(code::INTERNAL, format!("planning failed: {e}")), Vec::new()),
            }
        }
        "UpdateContainer" => (ttrpc::ok(), nri::UpdateContainerResponse::default().encode_to_vec()),
        "StopContainer" => (ttrpc::ok(), nri::StopContainerResponse::default().encode_to_vec()),
        "StateChange" | "Shutdown" => (ttrpc::ok(), nri::Empty::default().encode_to_vec()),
        m => (status(code::UNIMPLEMENTED, format!("method {m} is not served here")), Vec::new()),
    }
}

/// The answer to CreateContainer: the adjustment for the container's requests (none when it
/// asks for nothing). Errors: the message the user sees, as actk-runtime would print it.
pub fn create_container(
    planner: &Planner,
    r: &nri::CreateContainerRequest,
) -> Result<nri::CreateContainerResponse, String> {
    let Some(c) = &r.container else { return Ok(Default::default()) };
    let who = match &r.pod {
        Some(p) => format!("{}/{} container {}", p.namespace, p.name, c.name),
        None => format!("container {}", c.name),
    };
    let plan = planner.plan(&adjust::container_spec(c)).map_err(|e| format!("actk: {who}: {e}"))?;
    for w in &plan.warnings {
        tracing::warn!("{who}: {w}");
    }
    if plan.is_empty() {
        return Ok(Default::default());
    }
    let summary = plan.summary();
    let adjust = match adjust::adjustment(&plan.edits, &summary) {
        Ok(a) => a,
        // Edits NRI cannot carry: containerd resolves CDI names itself when every request was
        // served by spec files.
        Err(e) if plan.served.iter().all(|s| s.from_spec) => {
            let names: Vec<String> =
                plan.served.iter().flat_map(|s| s.devices.iter().map(move |d| format!("{}={d}", s.kind))).collect();
            tracing::info!("{who}: {e}; handing containerd the CDI names {}", names.join(","));
            adjust::cdi_devices(&names, &summary)
        }
        Err(e) => return Err(format!("actk: {who}: {e}")),
    };
    tracing::info!("{who}: {summary}");
    Ok(nri::CreateContainerResponse { adjust: Some(adjust), update: Vec::new() })
}

/// Connects (or takes the runtime's pre-connected socket) and serves until `stop`; reconnects
/// with a pause when the runtime goes away (a containerd restart), as a DaemonSet plugin must.
pub async fn run(socket: &std::path::Path, reg: Registration, planner: Arc<Planner>) -> Result<()> {
    if let Some(fd) = std::env::var("NRI_PLUGIN_SOCKET").ok().filter(|s| !s.is_empty()) {
        // Launched by the runtime from its plugin directory: one connection, then exit.
        let fd: i32 = fd.parse().with_context(|| format!("NRI_PLUGIN_SOCKET={fd} is not a file descriptor"))?;
        let stream = from_fd(fd)?;
        return serve(stream, &reg, planner).await;
    }
    loop {
        match UnixStream::connect(socket).await {
            Ok(s) => match serve(s, &reg, planner.clone()).await {
                Ok(()) => tracing::info!("NRI connection closed by the runtime; reconnecting"),
                Err(e) => tracing::warn!("NRI connection: {e:#}; reconnecting"),
            },
            Err(e) => tracing::debug!("cannot connect to {}: {e}", socket.display()),
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
