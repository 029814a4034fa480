//! gRPC clients over unix sockets: tonic dials TCP URIs, so the connector ignores the URI and
//! opens the socket file instead (the kubelet does the same with its `unix://` targets).

use hyper_util::rt::TokioIo;
use std::path::{Path, PathBuf};
use tonic::transport::{Channel, Endpoint, Uri};

/// A channel to the gRPC server listening on unix socket `path`.
///
/// Errors: the socket is missing or refuses the connection (the error names nothing; callers
/// add the path).
pub async fn connect(path: &Path) -> Result<Channel, tonic::transport::Error> {
    let path: PathBuf = path.to_path_buf();
    // The authority is never used for a unix socket, but the URI must parse.
    Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(path).await?)) }
        }))
        .await
}
