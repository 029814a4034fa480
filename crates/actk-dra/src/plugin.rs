//! The kubelet plugin's sockets: the DRA socket (`<plugin dir>/dra.sock`, both service
//! versions) and the registration socket (`<registry dir>/actk.dev-reg.sock`), served until
//! the process ends. Each is bound afresh (a stale file from an earlier run is removed first)
//! and bound again when its file disappears or is replaced, checked every [`POLL`]. The kubelet
//! finds the registration socket by watching the registry directory, also after it restarts.
//!
//! Rolling updates (kubelet 1.33+): with its pod's UID ([`Sockets::new`]) a driver process
//! names its sockets `actk.dev-<uid>-reg.sock` and `dra-<uid>.sock`, as
//! k8s.io/dynamic-resource-allocation's kubeletplugin helper does, so the old pod and the new
//! one of a DaemonSet update are both registered for the driver; the kubelet prefers the newest
//! connected one and falls back to the other. Sockets of processes that are gone (a killed pod
//! leaves its files) are removed at start when they refuse connections ([`remove_stale`]).

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

/// The socket paths of one driver process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sockets {
    /// The registration socket in the kubelet's registry directory.
    pub registration: PathBuf,
    /// The DRA socket in the plugin directory.
    pub dra: PathBuf,
    /// Whether the names carry a pod UID (rolling updates).
    pub per_pod: bool,
}

impl Sockets {
    /// The sockets of driver `name` in `registry_dir` and `plugin_dir`: with `pod_uid`,
    /// `<name>-<uid>-reg.sock` and `dra-<uid>.sock`; without, the fixed `<name>-reg.sock` and
    /// `dra.sock` (one process per node).
    ///
    /// Errors: `pod_uid` is not a UID (8-4-4-4-12 hexadecimal digits, the form of
    /// `metadata.uid`), which would name another file.
    pub fn new(name: &str, registry_dir: &Path, plugin_dir: &Path, pod_uid: Option<&str>) -> Result<Sockets, String> {
        match pod_uid {
            None => Ok(Sockets {
                registration: registry_dir.join(registration_socket_name(name)),
                dra: plugin_dir.join("dra.sock"),
                per_pod: false,
            }),
            Some(uid) => {
                let probe = crate::claim::ClaimRef { namespace: String::new(), uid: uid.into(), name: String::new() };
                if crate::claim::check_uid(&probe).is_err() {
                    return Err(format!(
                        "pod UID {:?} is not a UID (8-4-4-4-12 hexadecimal digits); the chart sets POD_UID from metadata.uid",
                        actk_core::request::shorten(uid)
                    ));
                }
                let uid = uid.to_ascii_lowercase();
                Ok(Sockets {
                    registration: registry_dir.join(format!("{name}-{uid}-reg.sock")),
                    dra: plugin_dir.join(format!("dra-{uid}.sock")),
                    per_pod: true,
                })
            }
        }
    }
}

/// Whether `p` is a socket file of driver `name`: `<name>-reg.sock`, `<name>-<uid>-reg.sock`
/// (registry directory) or `dra.sock`, `dra-<uid>.sock` (plugin directory).
fn is_driver_socket(file: &str, name: &str) -> bool {
    let reg = file
        .strip_prefix(name)
        .and_then(|r| r.strip_suffix("-reg.sock"))
        .is_some_and(|mid| mid.is_empty() || mid.starts_with('-'));
    let dra = file == "dra.sock" || (file.starts_with("dra-") && file.ends_with(".sock"));
    reg || dra
}

/// Whether the socket at `p` accepts a connection (a process serves it).
pub fn answers(p: &Path) -> bool {
    std::os::unix::net::UnixStream::connect(p).is_ok()
}

/// Removes socket files of driver `name` in `dirs` that refuse connections (their process is
/// gone), except `own`; returns what was removed. A socket that answers, or fails otherwise, is
/// left alone.
pub fn remove_stale(dirs: &[&Path], name: &str, own: &Sockets) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(dir) else { continue };
        for e in entries.flatten() {
            let p = e.path();
            let file = e.file_name().to_string_lossy().into_owned();
            if p == own.registration || p == own.dra || !is_driver_socket(&file, name) {
                continue;
            }
            let refused = matches!(std::os::unix::net::UnixStream::connect(&p),
                Err(err) if err.kind() == std::io::ErrorKind::ConnectionRefused);
            if refused && std::fs::remove_file(&p).is_ok() {
                out.push(p);
            }
        }
    }
    out
}

/// Registration sockets of driver `name` in `registry_dir`, other than `own`, that answer: the
/// other processes of the driver on this node (the other pod of a rolling update).
pub fn others_alive(registry_dir: &Path, name: &str, own: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(registry_dir) else { return Vec::new() };
    entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p != own)
        .filter(|p| {
            p.file_name()
                .and_then(|f| f.to_str())
                .is_some_and(|f| is_driver_socket(f, name) && f.ends_with("-reg.sock"))
        })
        .filter(|p| answers(p))
        .collect()
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

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "0b6f3c1e-1111-4c2a-9d7e-2f5a6b7c8d9e";

    #[test]
    fn per_pod_names_follow_the_kubeletplugin_helper() {
        let s = Sockets::new("actk.dev", Path::new("/r"), Path::new("/p"), Some(UID)).unwrap();
        assert_eq!(s.registration, Path::new(&format!("/r/actk.dev-{UID}-reg.sock")));
        assert_eq!(s.dra, Path::new(&format!("/p/dra-{UID}.sock")));
        let s = Sockets::new("actk.dev", Path::new("/r"), Path::new("/p"), None).unwrap();
        assert_eq!(
            (s.registration.as_path(), s.dra.as_path()),
            (Path::new("/r/actk.dev-reg.sock"), Path::new("/p/dra.sock"))
        );
        let e = Sockets::new("actk.dev", Path::new("/r"), Path::new("/p"), Some("../../x")).unwrap_err();
        assert!(e.contains("not a UID"), "{e}");
        for (f, want) in [
            ("actk.dev-reg.sock", true),
            (&format!("actk.dev-{UID}-reg.sock") as &str, true),
            ("actk.devices-reg.sock", false),
            ("other.dev-reg.sock", false),
            ("dra.sock", true),
            (&format!("dra-{UID}.sock"), true),
            ("checkpoint.json", false),
        ] {
            assert_eq!(is_driver_socket(f, "actk.dev"), want, "{f}");
        }
    }

    #[tokio::test]
    async fn stale_sockets_go_live_ones_stay() {
        let dir = tempfile::tempdir().unwrap();
        let own = Sockets::new("actk.dev", dir.path(), dir.path(), Some(UID)).unwrap();
        let other = UID.replace("1111", "2222");
        let gone = UID.replace("1111", "3333");
        let live = dir.path().join(format!("actk.dev-{other}-reg.sock"));
        let _l = std::os::unix::net::UnixListener::bind(&live).unwrap();
        let stale = dir.path().join(format!("actk.dev-{gone}-reg.sock"));
        drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
        let stale_dra = dir.path().join(format!("dra-{gone}.sock"));
        drop(std::os::unix::net::UnixListener::bind(&stale_dra).unwrap());
        let _own = std::os::unix::net::UnixListener::bind(&own.registration).unwrap();
        let mut removed = remove_stale(&[dir.path()], "actk.dev", &own);
        removed.sort();
        let mut want = vec![stale.clone(), stale_dra.clone()];
        want.sort();
        assert_eq!(removed, want);
        assert!(live.exists() && own.registration.exists());
        assert_eq!(others_alive(dir.path(), "actk.dev", &own.registration), [live]);
    }
}
