//! The plugin's Prometheus metrics, encoded by the Prometheus project's client library
//! (`prometheus-client`, OpenMetrics text) and served by the node layer's hyper endpoint
//! ([`actk_node::metrics_http`]) on an optional TCP address: one GET /metrics page.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

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

    /// The page, in the OpenMetrics text format (counters end in `_total`, the page in `# EOF`).
    pub fn render(&self) -> String {
        let m = self.by_resource.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let mut reg = Registry::default();
        // (metric name without `_total`, help text, the field it shows)
        type CounterDef = (&'static str, &'static str, fn(&ResourceMetrics) -> u64);
        let counters: [CounterDef; 5] = [
            ("actk_device_plugin_allocations", "Container allocations answered", |r| r.allocations),
            ("actk_device_plugin_allocate_errors", "Container allocations refused (unknown device IDs)", |r| {
                r.allocate_errors
            }),
            ("actk_device_plugin_preferred_allocations", "Preferred allocations answered", |r| r.preferred),
            (
                "actk_device_plugin_poor_placements",
                "Preferred allocations that could not be placed well on the topology",
                |r| r.poor_placements,
            ),
            ("actk_device_plugin_registrations", "Successful registrations with the kubelet", |r| r.registrations),
        ];
        for (name, help, get) in counters {
            let f = Family::<Vec<(&'static str, String)>, Counter>::default();
            for (res, r) in &m {
                f.get_or_create(&vec![("resource", res.clone())]).inc_by(get(r));
            }
            reg.register(name, help, f);
        }
        let devices = Family::<Vec<(&'static str, String)>, Gauge>::default();
        for (res, r) in &m {
            for (health, n) in [("Healthy", r.healthy), ("Unhealthy", r.unhealthy)] {
                devices
                    .get_or_create(&vec![("resource", res.clone()), ("health", health.to_string())])
                    .set(i64::try_from(n).unwrap_or(i64::MAX));
            }
        }
        reg.register("actk_device_plugin_devices", "Devices advertised, by health", devices);
        let mut out = String::new();
        // Writing into a String cannot fail.
        prometheus_client::encoding::text::encode(&mut out, &reg).expect("encoding into a String");
        out
    }
}

/// Serves `GET /metrics` on `addr` until the task is dropped. Errors: the address cannot be
/// bound (named in the message).
pub async fn serve(addr: SocketAddr, metrics: Arc<Metrics>) -> std::io::Result<()> {
    let listener = actk_node::metrics_http::bind(addr).await?;
    tracing::info!("metrics on http://{}/metrics", listener.local_addr()?);
    actk_node::metrics_http::serve(listener, Arc::new(move || Ok(metrics.render()))).await;
    Ok(())
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
        assert!(text.contains("# TYPE actk_device_plugin_allocations counter\n"), "{text}");
        assert!(text.ends_with("# EOF\n"));
        assert!(text.contains("actk_device_plugin_allocations_total{resource=\"nvidia.com/gpu\"} 3\n"));
        assert!(text.contains("actk_device_plugin_allocations_total{resource=\"amd.com/gpu\"} 0\n"));
        assert!(text.contains("actk_device_plugin_poor_placements_total{resource=\"amd.com/gpu\"} 1\n"));
        assert!(text.contains("actk_device_plugin_devices{resource=\"nvidia.com/gpu\",health=\"Unhealthy\"} 1\n"));
        assert_eq!(m.get("nvidia.com/gpu").healthy, 7);
    }
}
