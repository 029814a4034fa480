//! The kubelet plugin's sockets: the DRA socket (`<plugin dir>/dra.sock`, both service
//! versions) and the registration socket (`<registry dir>/actk.dev-reg.sock`), served until
//! the process ends. Each is bound afresh (a stale file from an earlier run is removed first)
//! and bound again when its file disappears or is replaced, checked every [`POLL`]. The kubelet
//! finds the registration socket by watching the registry directory, also after it restarts.

use crate::api::registration::registration_server::RegistrationServer;
use crate::api::{v1, v1beta1};
use crate::service::{DraService, Registrar};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::UnixListener;
use tokio::sync::oneshot;

/// How often the socket files are checked.
pub const POLL: Duration = Duration::from_millis(500);

/// Default directory of the kubelet's plugin registration sockets.
pub const DEFAULT_REGISTRY_DIR: &str = "/var/lib/kubelet/plugins_registry";
/// Default directory of this driver's own files (DRA socket, checkpoint).
pub const DEFAULT_PLUGIN_DIR: &str = "/var/lib/kubelet/plugins/actk.dev";

/// File name of the registration socket for driver `name`.
pub fn registration_socket_name(name: &str) -> String {
    format!("{name}-reg.sock")
}

fn file_id(p: &Path) -> Option<(u64, u64)> {
    std::fs::symlink_metadata(p).ok().map(|m| (m.dev(), m.ino()))
}

fn bind(path: &Path) -> std::io::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    UnixListener::bind(path)
}

/// Which service a socket serves.
#[derive(Clone)]
pub enum Socket {
    /// The DRA service (v1 and v1beta1).
    Dra(DraService),
    /// The Registration service, with the `:authority` fix.
    Registration(Arc<Registrar>),
}

/// Serves `what` on `path` forever (see the module docs). `ready` is sent once, when the
/// socket is first bound.
pub async fn serve(path: PathBuf, what: Socket, ready: Option<oneshot::Sender<()>>) {
    let mut ready = ready;
    loop {
        let listener = match bind(&path) {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!("cannot listen on {}: {e}; retrying", path.display());
                tokio::time::sleep(POLL * 4).await;
                continue;
            }
        };
        let own = file_id(&path);
        if let Some(r) = ready.take() {
            let _ = r.send(());
        }
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let stop = async {
            let _ = stop_rx.await;
        };
        let server = match what.clone() {
            Socket::Dra(svc) => tokio::spawn(
                tonic::transport::Server::builder()
                    .add_service(v1::dra_plugin_server::DraPluginServer::new(svc.clone()))
                    .add_service(v1beta1::dra_plugin_server::DraPluginServer::new(svc))
                    .serve_with_incoming_shutdown(tokio_stream::wrappers::UnixListenerStream::new(listener), stop),
            ),
            Socket::Registration(reg) => {
                let incoming = async_stream(listener);
                tokio::spawn(
                    tonic::transport::Server::builder()
                        .add_service(RegistrationServer::from_arc(reg))
                        .serve_with_incoming_shutdown(incoming, stop),
                )
            }
        };
        while file_id(&path) == own {
            tokio::time::sleep(POLL).await;
        }
        tracing::info!("socket {} was removed or replaced; serving it again", path.display());
        let _ = stop_tx.send(());
        let _ = tokio::time::timeout(Duration::from_millis(500), server).await;
    }
}

/// Accepted connections of `listener`, each behind the `:authority` fix.
fn async_stream(
    listener: UnixListener,
) -> impl tokio_stream::Stream<Item = std::io::Result<crate::authority::Fixed>> + Send + 'static {
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    tokio::spawn(async move {
        loop {
            let r = listener.accept().await.map(|(s, _)| crate::authority::fix(s));
            let failed = r.is_err();
            if tx.send(r).await.is_err() || failed {
                break;
            }
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}
