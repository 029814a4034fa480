//! The life of one resource's plugin: serve the DevicePlugin service on its socket, register
//! with the kubelet, and start over whenever the kubelet restarts (F12).
//!
//! One session: bind `<socket_dir>/<resource socket>` and serve it (so the socket answers
//! before Register is sent, as the kubelet dials back at once), wait calmly for the kubelet's
//! socket, register (retrying with a bounded backoff), then watch every [`POLL`] for the
//! signs of a kubelet restart:
//! - our socket file is gone or replaced (the kubelet wipes the directory when it starts);
//! - kubelet.sock is gone or re-created (another inode);
//! - the kubelet closed the ListAndWatch stream.
//!
//! Any of these ends the session and a new one starts at once, so re-registration happens
//! well within 5 s. Nothing here exits the process: every failure is logged and retried.

use crate::allocate::AllocateOptions;
use crate::api::device_plugin_server::DevicePluginServer;
use crate::api::registration_client::RegistrationClient;
use crate::api::{DevicePluginOptions, RegisterRequest, VERSION};
use crate::health::HealthMap;
use crate::held::Ledger;
use crate::metrics::Metrics;
use crate::resources::Resource;
use crate::service::Plugin;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Notify, oneshot, watch};

/// How often the socket files are checked.
pub const POLL: Duration = Duration::from_millis(100);
/// Longest wait between two registration attempts.
pub const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// Time limit of one connect or Register call.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(3);

/// What every resource's manager shares.
#[derive(Debug, Clone)]
pub struct ManagerConfig {
    /// Directory of the plugin sockets.
    pub socket_dir: PathBuf,
    /// The kubelet's Registration socket.
    pub kubelet_socket: PathBuf,
    /// Allocate answers.
    pub allocate: Arc<AllocateOptions>,
    /// Whether a poor placement is an error.
    pub strict_topology: bool,
    /// What is held, shared by every resource (crate::held).
    pub ledger: Arc<Ledger>,
}

/// Identity of a file: (device, inode); `None` when absent.
fn file_id(p: &Path) -> Option<(u64, u64)> {
    std::fs::symlink_metadata(p).ok().map(|m| (m.dev(), m.ino()))
}

/// Register `resource` served on socket file `endpoint` with the kubelet at `kubelet`.
///
/// Errors: the kubelet cannot be reached or refuses (its message is kept), or a timeout.
pub async fn register(kubelet: &Path, endpoint: &str, resource: &str) -> Result<(), String> {
    let channel = match tokio::time::timeout(CALL_TIMEOUT, crate::uds::connect(kubelet)).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => return Err(format!("cannot connect to the kubelet at {}: {e}", kubelet.display())),
        Err(_) => return Err(format!("connecting to the kubelet at {} timed out", kubelet.display())),
    };
    let req = RegisterRequest {
        version: VERSION.into(),
        endpoint: endpoint.into(),
        resource_name: resource.into(),
        options: Some(DevicePluginOptions { pre_start_required: false, get_preferred_allocation_available: true }),
    };
    match tokio::time::timeout(CALL_TIMEOUT, RegistrationClient::new(channel).register(req)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(status)) => {
            Err(format!("the kubelet at {} refused {resource}: {}", kubelet.display(), status.message()))
        }
        Err(_) => Err(format!("Register with the kubelet at {} timed out", kubelet.display())),
    }
}

/// Serves and registers `res` forever (see the module docs). Returns only if the tokio runtime
/// shuts down.
pub async fn run(
    res: Arc<Resource>,
    health: watch::Receiver<HealthMap>,
    cfg: Arc<ManagerConfig>,
    metrics: Arc<Metrics>,
) {
    let endpoint = res.socket_name();
    let sock = cfg.socket_dir.join(&endpoint);
    let mut logged_wait = false;
    loop {
        if let Err(e) = std::fs::create_dir_all(&cfg.socket_dir) {
            tracing::warn!("{}: cannot create {}: {e}; retrying", res.name, cfg.socket_dir.display());
            tokio::time::sleep(MAX_BACKOFF).await;
            continue;
        }
        let _ = std::fs::remove_file(&sock); // a stale socket from an earlier run
        let listener = match tokio::net::UnixListener::bind(&sock) {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!("{}: cannot listen on {}: {e}; retrying", res.name, sock.display());
                tokio::time::sleep(MAX_BACKOFF).await;
                continue;
            }
        };
        let own = file_id(&sock);
        let ended = Arc::new(Notify::new());
        let plugin = Plugin::new(
            res.clone(),
            cfg.ledger.clone(),
            health.clone(),
            cfg.allocate.clone(),
            cfg.strict_topology,
            metrics.clone(),
            ended.clone(),
        );
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        // Aborted with this task (the plugin serves a new set of devices): no server outlives it.
        let mut server = AbortOnDrop(tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(DevicePluginServer::new(plugin))
                .serve_with_incoming_shutdown(tokio_stream::wrappers::UnixListenerStream::new(listener), async {
                    let _ = stop_rx.await;
                }),
        ));
        let reason = session(&res, &cfg, &sock, own, &endpoint, &ended, &metrics, &mut logged_wait).await;
        tracing::info!("{}: {reason}; serving {} again and re-registering", res.name, sock.display());
        let _ = stop_tx.send(());
        // Streams to a dead kubelet may hold a graceful shutdown open forever: cut them off.
        if tokio::time::timeout(Duration::from_millis(500), &mut server.0).await.is_err() {
            server.0.abort();
        }
    }
}

/// A task that is aborted when this handle is dropped.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[allow(clippy::too_many_arguments)]
async fn session(
    res: &Resource,
    cfg: &ManagerConfig,
    sock: &Path,
    own: Option<(u64, u64)>,
    endpoint: &str,
    ended: &Notify,
    metrics: &Metrics,
    logged_wait: &mut bool,
) -> &'static str {
    let mut kubelet = loop {
        if let Some(id) = file_id(&cfg.kubelet_socket) {
            break id;
        }
        if file_id(sock) != own {
            return "our socket was removed while waiting for the kubelet";
        }
        if !*logged_wait {
            tracing::info!("{}: waiting for the kubelet socket {}", res.name, cfg.kubelet_socket.display());
            *logged_wait = true;
        }
        tokio::time::sleep(POLL).await;
    };
    let mut delay = POLL;
    loop {
        match register(&cfg.kubelet_socket, endpoint, &res.name).await {
            Ok(()) => break,
            Err(e) => {
                tracing::warn!("{}: {e}; retrying in {} ms", res.name, delay.as_millis());
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(MAX_BACKOFF);
                if file_id(sock) != own {
                    return "our socket was removed";
                }
                match file_id(&cfg.kubelet_socket) {
                    Some(id) => kubelet = id,
                    None => return "the kubelet socket went away before registration",
                }
            }
        }
    }
    *logged_wait = false;
    metrics.update(&res.name, |m| m.registrations += 1);
    tracing::info!("{}: registered with the kubelet as {endpoint} ({} devices)", res.name, res.units.len());
    loop {
        tokio::select! {
            _ = tokio::time::sleep(POLL) => {}
            _ = ended.notified() => return "the kubelet closed the ListAndWatch stream",
        }
        if file_id(sock) != own {
            return "our socket was removed (kubelet restart)";
        }
        match file_id(&cfg.kubelet_socket) {
            None => return "the kubelet socket is gone (kubelet stopped)",
            Some(id) if id != kubelet => return "the kubelet socket was re-created (kubelet restart)",
            Some(_) => {}
        }
    }
}
