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
//!
//! A socket replaced by one that answers is another instance serving the resource (the new pod
//! of a rolling update with surge, which registers while this one still runs): this one stands
//! down, serving and registering nothing, until that socket is gone or stops answering (the new
//! pod failed), and then serves again. It removes only a socket file it bound itself, so the
//! old pod's exit never takes the new pod's socket.
//!
//! [`Readiness`]: the pod's readiness file, present once every resource of the set being served
//! has registered (a node without devices is ready once discovery ran), for an exec readiness
//! probe (`--check-ready`): Helm's `--wait` and a surge rollout then wait for a plugin that
//! really serves.

use crate::allocate::AllocateOptions;
use crate::api::device_plugin_server::DevicePluginServer;
use crate::api::registration_client::RegistrationClient;
use crate::api::{DevicePluginOptions, RegisterRequest, VERSION};
use crate::health::HealthMap;
use crate::held::Ledger;
use crate::metrics::Metrics;
use crate::resources::Resource;
use crate::service::Plugin;
use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{Notify, oneshot, watch};

/// How often the socket files are checked.
pub const POLL: Duration = Duration::from_millis(100);
/// Longest wait between two registration attempts.
pub const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// Time limit of one connect or Register call.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(3);

/// Where a served resource's socket lives and whom it registers with (kubelet device plugin
/// API v1beta1, Registration): what [`serve_socket`] needs of any DevicePlugin service.
#[derive(Debug, Clone)]
pub struct Sockets {
    /// Directory of the plugin sockets (the kubelet's `/var/lib/kubelet/device-plugins`).
    pub socket_dir: PathBuf,
    /// The kubelet's Registration socket (`kubelet.sock` in that directory).
    pub kubelet_socket: PathBuf,
    /// The pod's readiness file, told of each registration.
    pub readiness: Arc<Readiness>,
}

/// What every device resource's manager shares: its sockets and how it allocates.
#[derive(Debug, Clone)]
pub struct ManagerConfig {
    /// Sockets and registration.
    pub sockets: Sockets,
    /// Allocate answers.
    pub allocate: Arc<AllocateOptions>,
    /// Whether a poor placement is an error.
    pub strict_topology: bool,
    /// What is held, shared by every resource (crate::held).
    pub ledger: Arc<Ledger>,
}

/// Whether every resource being served has registered, kept in a file for an exec readiness
/// probe (see the module docs).
#[derive(Debug, Default)]
pub struct Readiness {
    file: Option<PathBuf>,
    /// (resources being served, those that registered since).
    state: Mutex<(BTreeSet<String>, BTreeSet<String>)>,
}

impl Readiness {
    /// Readiness kept in `file` (none: nothing written). A file left by an earlier run of the
    /// container (the directory outlives it) is removed at once.
    pub fn new(file: Option<PathBuf>) -> Readiness {
        if let Some(f) = &file {
            let _ = std::fs::remove_file(f);
        }
        Readiness { file, state: Mutex::new(Default::default()) }
    }

    /// A new set of resources is served (empty: none found): ready once each registered.
    pub fn serving(&self, names: impl IntoIterator<Item = String>) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        *s = (names.into_iter().collect(), BTreeSet::new());
        self.write(&s);
    }

    /// `name` registered with the kubelet.
    pub fn registered(&self, name: &str) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.1.insert(name.to_string());
        self.write(&s);
    }

    /// Whether every resource served has registered.
    pub fn is_ready(&self) -> bool {
        let s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.0.is_subset(&s.1)
    }

    fn write(&self, s: &(BTreeSet<String>, BTreeSet<String>)) {
        let Some(f) = &self.file else { return };
        let ready = s.0.is_subset(&s.1);
        let done = if ready {
            std::fs::write(f, format!("serving {}\n", s.0.iter().cloned().collect::<Vec<_>>().join(", ")))
        } else {
            match std::fs::remove_file(f) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            }
        };
        if let Err(e) = done {
            tracing::warn!("readiness file {}: {e}", f.display());
        }
    }
}

/// Whether a device plugin answers on socket `p` (another instance of this plugin).
async fn answers(p: &Path) -> bool {
    let call = async {
        let ch = crate::uds::connect(p).await.ok()?;
        crate::api::device_plugin_client::DevicePluginClient::new(ch)
            .get_device_plugin_options(crate::api::Empty {})
            .await
            .ok()
    };
    tokio::time::timeout(CALL_TIMEOUT, call).await.ok().flatten().is_some()
}

/// Removes the socket file it guards when dropped, if it is still the one this process bound.
struct OwnSocket {
    path: PathBuf,
    id: Option<(u64, u64)>,
}

impl Drop for OwnSocket {
    fn drop(&mut self) {
        if self.id.is_some() && file_id(&self.path) == self.id {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Identity of a file: (device, inode); `None` when absent.
fn file_id(p: &Path) -> Option<(u64, u64)> {
    std::fs::symlink_metadata(p).ok().map(|m| (m.dev(), m.ino()))
}

/// The options every service of this plugin registers with and answers GetDevicePluginOptions
/// with: no PreStartContainer, GetPreferredAllocation answered.
pub fn options() -> DevicePluginOptions {
    DevicePluginOptions { pre_start_required: false, get_preferred_allocation_available: true }
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
        options: Some(options()),
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
    let make = {
        let (res, cfg, metrics) = (res.clone(), cfg.clone(), metrics.clone());
        move |ended: Arc<Notify>, alive: watch::Receiver<()>| {
            Plugin::new(
                res.clone(),
                cfg.ledger.clone(),
                health.clone(),
                cfg.allocate.clone(),
                cfg.strict_topology,
                metrics.clone(),
                ended,
            )
            .until(alive)
        }
    };
    serve_socket(&res.name, &res.socket_name(), res.units.len(), &cfg.sockets, &metrics, make).await
}

/// Serves the DevicePlugin service that `make` builds for resource `name` on socket file
/// `endpoint` of the socket directory and registers it, forever (see the module docs); `units`
/// is only logged. `make` gets the notifier to call when a ListAndWatch stream ends and the
/// receiver whose sender is dropped when this session ends ([`Plugin::until`]). Returns only
/// if the tokio runtime shuts down.
pub async fn serve_socket<P, F>(name: &str, endpoint: &str, units: usize, cfg: &Sockets, metrics: &Metrics, make: F)
where
    P: crate::api::device_plugin_server::DevicePlugin,
    F: Fn(Arc<Notify>, watch::Receiver<()>) -> P,
{
    let sock = cfg.socket_dir.join(endpoint);
    let mut logged_wait = false;
    loop {
        if let Err(e) = std::fs::create_dir_all(&cfg.socket_dir) {
            tracing::warn!("{name}: cannot create {}: {e}; retrying", cfg.socket_dir.display());
            tokio::time::sleep(MAX_BACKOFF).await;
            continue;
        }
        let _ = std::fs::remove_file(&sock); // a stale socket from an earlier run
        let listener = match tokio::net::UnixListener::bind(&sock) {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!("{name}: cannot listen on {}: {e}; retrying", sock.display());
                tokio::time::sleep(MAX_BACKOFF).await;
                continue;
            }
        };
        let own = file_id(&sock);
        let _guard = OwnSocket { path: sock.clone(), id: own };
        let ended = Arc::new(Notify::new());
        // Dropped with this iteration or with the task (aborted when the resource is no longer
        // served): the kubelet's ListAndWatch streams end then (Plugin::until).
        let (_alive, alive) = watch::channel(());
        let plugin = make(ended.clone(), alive);
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        // Aborted with this task (the plugin serves a new set of devices): no server outlives it.
        let mut server = AbortOnDrop(tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(DevicePluginServer::new(plugin))
                .serve_with_incoming_shutdown(tokio_stream::wrappers::UnixListenerStream::new(listener), async {
                    let _ = stop_rx.await;
                }),
        ));
        let reason = session(name, units, cfg, &sock, own, endpoint, &ended, metrics, &mut logged_wait).await;
        let _ = stop_tx.send(());
        // Streams to a dead kubelet may hold a graceful shutdown open forever: cut them off.
        if tokio::time::timeout(Duration::from_millis(500), &mut server.0).await.is_err() {
            server.0.abort();
        }
        if file_id(&sock).is_some_and(|id| Some(id) != own) && answers(&sock).await {
            tracing::info!(
                "{name}: another instance serves {} now (a rolling update's new pod): standing down while it does",
                sock.display()
            );
            while file_id(&sock).is_some() && answers(&sock).await {
                tokio::time::sleep(STAND_DOWN_POLL).await;
            }
            tracing::info!("{name}: {} is no longer served: serving it again", sock.display());
            continue;
        }
        tracing::info!("{name}: {reason}; serving {} again and re-registering", sock.display());
    }
}

/// How often a stood-down instance looks whether the other one still serves.
pub const STAND_DOWN_POLL: Duration = Duration::from_secs(1);

/// A task that is aborted when this handle is dropped.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[allow(clippy::too_many_arguments)]
async fn session(
    name: &str,
    units: usize,
    cfg: &Sockets,
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
            tracing::info!("{}: waiting for the kubelet socket {}", name, cfg.kubelet_socket.display());
            *logged_wait = true;
        }
        tokio::time::sleep(POLL).await;
    };
    let mut delay = POLL;
    loop {
        match register(&cfg.kubelet_socket, endpoint, name).await {
            Ok(()) => break,
            Err(e) => {
                tracing::warn!("{name}: {e}; retrying in {} ms", delay.as_millis());
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
    metrics.update(name, |m| m.registrations += 1);
    cfg.readiness.registered(name);
    tracing::info!("{name}: registered with the kubelet as {endpoint} ({units} devices)");
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
