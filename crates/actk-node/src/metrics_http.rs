//! A Prometheus scrape endpoint: `GET /metrics` answered by hyper (the HTTP stack already under
//! tonic) with the page a render function gives, in the OpenMetrics text format
//! (`application/openmetrics-text; version=1.0.0`) that `prometheus-client` encodes; Prometheus
//! negotiates it by default. Every other path is 404. Shared by the front ends that expose
//! metrics (the device plugin, the telemetry exporter).

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

/// The Content-Type of an OpenMetrics text page (OpenMetrics 1.0, "Overall structure").
pub const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Renders the metrics page; called once per scrape, on a blocking thread (it may read sysfs
/// or NVML). Errors become a 500 with the message.
pub type Render = Arc<dyn Fn() -> Result<String, String> + Send + Sync>;

/// Binds `addr`. Errors: the address cannot be bound (the message names it).
pub async fn bind(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| std::io::Error::new(e.kind(), format!("metrics address {addr}: {e}")))
}

/// Serves `GET /metrics` on `listener` until the task is dropped.
pub async fn serve(listener: tokio::net::TcpListener, render: Render) {
    loop {
        let (conn, _) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("metrics accept: {e}");
                continue;
            }
        };
        let render = render.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                let render = render.clone();
                async move { Ok::<_, Infallible>(answer(req, render).await) }
            });
            // A scraper that stalls is cut off by hyper's header read timeout.
            let mut b = hyper::server::conn::http1::Builder::new();
            b.timer(hyper_util::rt::TokioTimer::new()).header_read_timeout(std::time::Duration::from_secs(10));
            if let Err(e) = b.serve_connection(TokioIo::new(conn), svc).await {
                tracing::debug!("metrics connection: {e}");
            }
        });
    }
}

async fn answer(req: Request<Incoming>, render: Render) -> Response<Full<Bytes>> {
    let reply = |status: StatusCode, ctype: &str, body: String| {
        let mut r = Response::new(Full::new(Bytes::from(body)));
        *r.status_mut() = status;
        r.headers_mut()
            .insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_str(ctype).expect("static"));
        r
    };
    if req.uri().path() != "/metrics" {
        return reply(StatusCode::NOT_FOUND, "text/plain", "only /metrics is served here\n".into());
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return reply(StatusCode::METHOD_NOT_ALLOWED, "text/plain", "GET /metrics\n".into());
    }
    match tokio::task::spawn_blocking(move || render()).await {
        Ok(Ok(page)) => reply(StatusCode::OK, OPENMETRICS_CONTENT_TYPE, page),
        Ok(Err(e)) => reply(StatusCode::INTERNAL_SERVER_ERROR, "text/plain", format!("{e}\n")),
        Err(e) => reply(StatusCode::INTERNAL_SERVER_ERROR, "text/plain", format!("rendering failed: {e}\n")),
    }
}
