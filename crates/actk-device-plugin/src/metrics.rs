//! Prometheus metrics in the text exposition format (version 0.0.4), served on an optional
//! TCP address by a minimal HTTP/1.1 responder: one GET /metrics page, nothing else. No HTTP
//! framework: the plugin stays small and the endpoint has nothing to configure.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Counters and gauges of one resource.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResourceMetrics {
    /// Successful Allocate calls (per container request).
    pub allocations: u64,
    /// Allocate container requests refused (unknown IDs).
    pub allocate_errors: u64,
    /// GetPreferredAllocation answers.
    pub preferred: u64,
    /// GetPreferredAllocation answers that came with a placement note (poor placement).
    pub poor_placements: u64,
    /// Successful registrations with the kubelet.
    pub registrations: u64,
    /// Devices (units) currently healthy.
    pub healthy: u64,
    /// Devices (units) currently unhealthy.
    pub unhealthy: u64,
}

/// All metrics of the process, by resource name.
#[derive(Debug, Default)]
pub struct Metrics {
    by_resource: Mutex<BTreeMap<String, ResourceMetrics>>,
}

impl Metrics {
    /// Applies `f` to the metrics of `resource`.
    pub fn update(&self, resource: &str, f: impl FnOnce(&mut ResourceMetrics)) {
        // A poisoned lock only means another update panicked; the counters are still usable.
        let mut m = self.by_resource.lock().unwrap_or_else(|e| e.into_inner());
        f(m.entry(resource.to_string()).or_default());
    }

    /// A copy of the metrics of `resource`.
    pub fn get(&self, resource: &str) -> ResourceMetrics {
        self.by_resource.lock().unwrap_or_else(|e| e.into_inner()).get(resource).cloned().unwrap_or_default()
    }

    /// The exposition text.
    pub fn render(&self) -> String {
        let m = self.by_resource.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let mut out = String::new();
        // (metric name, type, help text, the field it shows)
        type Family = (&'static str, &'static str, &'static str, fn(&ResourceMetrics) -> u64);
        let families: [Family; 5] = [
            ("actk_device_plugin_allocations_total", "counter", "Container allocations answered.", |r| r.allocations),
            (
                "actk_device_plugin_allocate_errors_total",
                "counter",
                "Container allocations refused (unknown device IDs).",
                |r| r.allocate_errors,
            ),
            ("actk_device_plugin_preferred_allocations_total", "counter", "Preferred allocations answered.", |r| {
                r.preferred
            }),
            (
                "actk_device_plugin_poor_placements_total",
                "counter",
                "Preferred allocations that could not be placed well on the topology.",
                |r| r.poor_placements,
            ),
            ("actk_device_plugin_registrations_total", "counter", "Successful registrations with the kubelet.", |r| {
                r.registrations
            }),
        ];
        for (name, kind, help, get) in families {
            out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
            for (res, r) in &m {
                out.push_str(&format!("{name}{{resource=\"{res}\"}} {}\n", get(r)));
            }
        }
        out.push_str("# HELP actk_device_plugin_devices Devices advertised, by health.\n# TYPE actk_device_plugin_devices gauge\n");
        for (res, r) in &m {
            out.push_str(&format!(
                "actk_device_plugin_devices{{resource=\"{res}\",health=\"Healthy\"}} {}\n",
                r.healthy
            ));
            out.push_str(&format!(
                "actk_device_plugin_devices{{resource=\"{res}\",health=\"Unhealthy\"}} {}\n",
                r.unhealthy
            ));
        }
        out
    }
}

/// Serves `GET /metrics` on `addr` until the task is dropped. Errors: the address cannot be
/// bound (named in the message).
pub async fn serve(addr: SocketAddr, metrics: Arc<Metrics>) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| std::io::Error::new(e.kind(), format!("metrics address {addr}: {e}")))?;
    tracing::info!("metrics on http://{}/metrics", listener.local_addr()?);
    loop {
        let (mut conn, _) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("metrics accept: {e}");
                continue;
            }
        };
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 2048];
            let mut len = 0;
            // Read the request head only (bounded); a scraper sends no body with GET.
            while len < buf.len() {
                match tokio::time::timeout(std::time::Duration::from_secs(5), conn.read(&mut buf[len..])).await {
                    Ok(Ok(0)) | Err(_) | Ok(Err(_)) => break,
                    Ok(Ok(n)) => len += n,
                }
                if buf[..len].windows(4).any(|w| w == b"\r\n\r\n") {
                    break;
                }
            }
            let head = String::from_utf8_lossy(&buf[..len]);
            let (status, body, ctype) = if head.starts_with("GET /metrics ") || head.starts_with("GET /metrics?") {
                ("200 OK", metrics.render(), "text/plain; version=0.0.4")
            } else {
                ("404 Not Found", "only /metrics is served here\n".to_string(), "text/plain")
            };
            let resp = format!(
                "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = conn.write_all(resp.as_bytes()).await;
            let _ = conn.shutdown().await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_has_help_type_and_one_line_per_resource() {
        let m = Metrics::default();
        m.update("nvidia.com/gpu", |r| {
            r.allocations += 3;
            r.healthy = 7;
            r.unhealthy = 1;
        });
        m.update("amd.com/gpu", |r| r.poor_placements += 1);
        let text = m.render();
        assert!(text.contains("# TYPE actk_device_plugin_allocations_total counter\n"));
        assert!(text.contains("actk_device_plugin_allocations_total{resource=\"nvidia.com/gpu\"} 3\n"));
        assert!(text.contains("actk_device_plugin_allocations_total{resource=\"amd.com/gpu\"} 0\n"));
        assert!(text.contains("actk_device_plugin_poor_placements_total{resource=\"amd.com/gpu\"} 1\n"));
        assert!(text.contains("actk_device_plugin_devices{resource=\"nvidia.com/gpu\",health=\"Unhealthy\"} 1\n"));
        assert_eq!(m.get("nvidia.com/gpu").healthy, 7);
    }
}
