//! The kubelet's PodResources API v1 (`k8s.io/kubelet/pkg/apis/podresources/v1`), `List` only:
//! every pod's containers with the device plugin devices and the DRA devices the kubelet
//! allocated them. The kubelet serves it on [`DEFAULT_SOCKET`] (root only, mode 0700 directory).
//! DRA allocations appear when the kubelet's `KubeletPodResourcesDynamicResources` feature is on
//! (beta, on by default, since Kubernetes 1.34); before that `dynamic_resources` is empty.

use crate::{Allocated, Allocation};
use hyper_util::rt::TokioIo;
use std::path::{Path, PathBuf};
use tonic::transport::{Channel, Endpoint, Uri};

/// The generated PodResources v1 messages, client and (for tests emulating the kubelet) server.
#[allow(missing_docs, unused_qualifications)]
pub mod api {
    tonic::include_proto!("v1");
}

/// Where the kubelet serves PodResources.
pub const DEFAULT_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";

/// A failed `List`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The socket is missing or refuses connections (no kubelet on this node, or not root).
    #[error("cannot connect to the kubelet's PodResources socket {path}: {source}")]
    Connect {
        /// The socket.
        path: PathBuf,
        /// The transport error.
        source: tonic::transport::Error,
    },
    /// The kubelet answered `List` with an error status.
    #[error("PodResources List on {path}: {status}")]
    List {
        /// The socket.
        path: PathBuf,
        /// The gRPC status.
        status: Box<tonic::Status>,
    },
}

/// A channel to the gRPC server on unix socket `path` (tonic dials URIs; the connector ignores
/// the URI and opens the socket, as the kubelet's own clients do with `unix://`).
pub async fn connect(path: &Path) -> Result<Channel, Error> {
    let p = path.to_path_buf();
    Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let p = p.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(p).await?)) }
        }))
        .await
        .map_err(|source| Error::Connect { path: path.to_path_buf(), source })
}

/// Calls `List` on the PodResources socket `path` and flattens the answer ([`allocations`]).
pub async fn list(path: &Path) -> Result<Vec<Allocation>, Error> {
    let ch = connect(path).await?;
    let resp = api::pod_resources_lister_client::PodResourcesListerClient::new(ch)
        .list(api::ListPodResourcesRequest {})
        .await
        .map_err(|status| Error::List { path: path.to_path_buf(), status: Box::new(status) })?;
    Ok(allocations(resp.into_inner()))
}

/// One [`Allocation`] per device ID (device plugins) and per claim device (DRA) of every pod
/// container, in the answer's order.
pub fn allocations(resp: api::ListPodResourcesResponse) -> Vec<Allocation> {
    let mut out = Vec::new();
    for pod in resp.pod_resources {
        for c in pod.containers {
            let mut push = |what| {
                out.push(Allocation {
                    namespace: pod.namespace.clone(),
                    pod: pod.name.clone(),
                    container: c.name.clone(),
                    what,
                })
            };
            for d in &c.devices {
                for id in &d.device_ids {
                    push(Allocated::DevicePlugin { resource: d.resource_name.clone(), id: id.clone() });
                }
            }
            for r in &c.dynamic_resources {
                for cr in &r.claim_resources {
                    push(Allocated::Dra {
                        claim_namespace: r.claim_namespace.clone(),
                        claim_name: r.claim_name.clone(),
                        driver: cr.driver_name.clone(),
                        pool: cr.pool_name.clone(),
                        device: cr.device_name.clone(),
                    });
                }
            }
        }
    }
    out
}
