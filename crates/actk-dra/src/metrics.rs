//! The driver's Prometheus metrics (OpenMetrics text, prometheus-client) on `GET /metrics`,
//! served by the node layer's endpoint (`actk_node::metrics_http`: hyper's HTTP/1.1 server, as
//! the device plugin's and the exporter's) on `--metrics-address` (the chart's `dra.metrics`).
//!
//! | metric | type | labels | meaning |
//! |---|---|---|---|
//! | `actk_dra_requests_total` | counter | `method` (`NodePrepareResources`, `NodeUnprepareResources`) | kubelet calls |
//! | `actk_dra_request_duration_seconds` | histogram | `method` | time to answer one call (its claims, the API read included) |
//! | `actk_dra_claims_total` | counter | `operation` (`prepare`, `unprepare`), `result` (`ok`, `error`) | claims in those calls |
//! | `actk_dra_prepared_claims` | gauge | | claims prepared on the node (the checkpoint) |
//! | `actk_dra_published_devices` | gauge | `profile` | devices in the published pool |
//! | `actk_dra_unhealthy_devices` | gauge | `profile` | devices left out as unhealthy |
//! | `actk_dra_pool_generation` | gauge | | generation of the published pool |
//! | `actk_dra_registered` | gauge | | 1 once the kubelet registered this process |
//! | `actk_dra_publisher` | gauge | | 1 while this process publishes the pool (one per node; a rolling update's new pod waits) |
//! | `actk_dra_api_info` | gauge (1) | `server_version`, `resource_versions`, `device_taints` | what the API server serves ([`crate::discovery`]) |
//!
//! A port another process holds (the old pod of a rolling update on the host network) is tried
//! again every 2 s until it is free.

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// Label set: `(name, value)` pairs.
type Labels = Vec<(String, String)>;

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// The driver's metrics; cheap to clone (every field is shared).
#[derive(Clone)]
pub struct DraMetrics {
    requests: Family<Labels, Counter>,
    duration: Family<Labels, Histogram, fn() -> Histogram>,
    claims: Family<Labels, Counter>,
    prepared: Gauge,
    published: Family<Labels, Gauge>,
    unhealthy: Family<Labels, Gauge>,
    generation: Gauge,
    registered: Gauge,
    publisher: Gauge,
    api_info: Family<Labels, Gauge>,
    registry: Arc<Registry>,
    profiles: Arc<std::sync::Mutex<std::collections::BTreeSet<String>>>,
}

fn duration_histogram() -> Histogram {
    // 250 us .. ~8 s: a prepare is a few file writes plus one API read.
    Histogram::new(exponential_buckets(0.00025, 2.0, 16))
}

impl std::fmt::Debug for DraMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DraMetrics")
    }
}

impl Default for DraMetrics {
    fn default() -> Self {
        DraMetrics::new()
    }
}

impl DraMetrics {
    /// Every metric, registered under the prefix `actk_dra`.
    pub fn new() -> DraMetrics {
        let mut r = Registry::with_prefix("actk_dra");
        let requests = Family::<Labels, Counter>::default();
        let duration = Family::<Labels, Histogram, fn() -> Histogram>::new_with_constructor(duration_histogram as _);
        let claims = Family::<Labels, Counter>::default();
        let prepared = Gauge::default();
        let published = Family::<Labels, Gauge>::default();
        let unhealthy = Family::<Labels, Gauge>::default();
        let generation = Gauge::default();
        let registered = Gauge::default();
        let publisher = Gauge::default();
        let api_info = Family::<Labels, Gauge>::default();
        r.register("requests", "kubelet calls (NodePrepareResources, NodeUnprepareResources)", requests.clone());
        r.register("request_duration_seconds", "time to answer one kubelet call", duration.clone());
        r.register("claims", "claims prepared or unprepared, by result", claims.clone());
        r.register("prepared_claims", "claims prepared on this node (the checkpoint)", prepared.clone());
        r.register("published_devices", "devices in the published pool, by profile", published.clone());
        r.register("unhealthy_devices", "devices left out of the pool as unhealthy, by profile", unhealthy.clone());
        r.register("pool_generation", "generation of the published pool", generation.clone());
        r.register("registered", "1 once the kubelet registered this driver process", registered.clone());
        r.register("publisher", "1 while this process publishes the node's pool", publisher.clone());
        r.register("api_info", "what the API server serves, as labels (value 1)", api_info.clone());
        DraMetrics {
            requests,
            duration,
            claims,
            prepared,
            published,
            unhealthy,
            generation,
            registered,
            publisher,
            api_info,
            registry: Arc::new(r),
            profiles: Default::default(),
        }
    }

    /// One kubelet call of `method` that took `took`.
    pub fn request(&self, method: &str, took: Duration) {
        let l = labels(&[("method", method)]);
        self.requests.get_or_create(&l).inc();
        self.duration.get_or_create(&l).observe(took.as_secs_f64());
    }

    /// One claim of `operation` (`prepare`, `unprepare`) with its result.
    pub fn claim(&self, operation: &str, ok: bool) {
        self.claims
            .get_or_create(&labels(&[("operation", operation), ("result", if ok { "ok" } else { "error" })]))
            .inc();
    }

    /// Claims in the checkpoint now.
    pub fn prepared_claims(&self, n: usize) {
        self.prepared.set(n as i64);
    }

    /// The published pool: its generation and devices per profile (`profile` -> count), and
    /// the unhealthy ones left out; a profile counted before and missing now reads 0.
    pub fn pool(&self, generation: i64, per_profile: &BTreeMap<String, usize>, unhealthy: &BTreeMap<String, usize>) {
        self.generation.set(generation);
        let mut seen = self.profiles.lock().unwrap_or_else(|e| e.into_inner());
        seen.extend(per_profile.keys().chain(unhealthy.keys()).cloned());
        for p in seen.iter() {
            let l = labels(&[("profile", p)]);
            self.published.get_or_create(&l).set(per_profile.get(p).copied().unwrap_or(0) as i64);
            self.unhealthy.get_or_create(&l).set(unhealthy.get(p).copied().unwrap_or(0) as i64);
        }
    }

    /// Whether the kubelet registered this process.
    pub fn set_registered(&self, yes: bool) {
        self.registered.set(i64::from(yes));
    }

    /// Whether this process publishes the pool.
    pub fn set_publisher(&self, yes: bool) {
        self.publisher.set(i64::from(yes));
    }

    /// What the API server serves ([`crate::discovery::ApiFeatures`]).
    pub fn api(&self, f: &crate::discovery::ApiFeatures) {
        let taints = match f.device_taints {
            Some(true) => "true",
            Some(false) => "false",
            None => "unknown",
        };
        self.api_info
            .get_or_create(&labels(&[
                ("server_version", &f.server_version),
                ("resource_versions", &f.resource_versions.join(",")),
                ("device_taints", taints),
            ]))
            .set(1);
    }

    /// The exposition text (OpenMetrics).
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

/// Serves `GET /metrics` on `addr` until the process ends, with the node layer's endpoint
/// ([`actk_node::metrics_http`], as the device plugin and the exporter); a port in use (the old
/// pod of a surge rollout on the host network still holds it) is tried again every 2 s (logged
/// once).
pub async fn serve(addr: SocketAddr, metrics: DraMetrics) {
    let mut said = false;
    let listener = loop {
        match actk_node::metrics_http::bind(addr).await {
            Ok(l) => break l,
            Err(e) => {
                if !said {
                    tracing::warn!("{e}; trying again every 2 s");
                    said = true;
                }
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
        }
    };
    tracing::info!("metrics on http://{addr}/metrics");
    actk_node::metrics_http::serve(listener, Arc::new(move || Ok(metrics.render()))).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_names_every_family() {
        let m = DraMetrics::new();
        m.request("NodePrepareResources", Duration::from_millis(3));
        m.claim("prepare", true);
        m.claim("prepare", false);
        m.pool(4, &BTreeMap::from([("nvidia".to_string(), 8)]), &BTreeMap::new());
        m.pool(5, &BTreeMap::from([("nvidia".to_string(), 7)]), &BTreeMap::from([("nvidia".to_string(), 1)]));
        let t = m.render();
        for want in [
            r#"actk_dra_requests_total{method="NodePrepareResources"} 1"#,
            r#"actk_dra_claims_total{operation="prepare",result="ok"} 1"#,
            r#"actk_dra_claims_total{operation="prepare",result="error"} 1"#,
            r#"actk_dra_request_duration_seconds_bucket{le="0.004",method="NodePrepareResources"} 1"#,
            r#"actk_dra_published_devices{profile="nvidia"} 7"#,
            r#"actk_dra_unhealthy_devices{profile="nvidia"} 1"#,
            "actk_dra_pool_generation 5",
            "# EOF",
        ] {
            assert!(t.contains(want), "{want} missing:\n{t}");
        }
    }

    #[tokio::test]
    async fn served_over_http() {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = probe.local_addr().unwrap();
        drop(probe);
        let m = DraMetrics::new();
        m.set_registered(true);
        tokio::spawn(serve(addr, m));
        let text = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                if let Ok(mut s) = tokio::net::TcpStream::connect(addr).await {
                    use tokio::io::{AsyncReadExt, AsyncWriteExt};
                    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.unwrap();
                    let mut out = String::new();
                    s.read_to_string(&mut out).await.unwrap();
                    return out;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await
        .unwrap();
        assert!(text.starts_with("HTTP/1.1 200"), "{text}");
        assert!(text.contains("application/openmetrics-text"), "{text}");
        assert!(text.contains("actk_dra_registered 1"), "{text}");
    }
}
