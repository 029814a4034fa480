//! Device health in DRA: actk-node's engine (the one the device plugin's ListAndWatch uses)
//! judged per slice device, and what the driver does with it.
//!
//! - **Device taints** (KEP-5055, `resource.k8s.io/v1` `devices[].taints`, where the API server
//!   keeps them: [`crate::discovery::ApiFeatures::device_taints`], beta and on by default from
//!   1.36): an unhealthy device stays in the ResourceSlice with one taint, key [`TAINT_KEY`]
//!   (`actk.dev/unhealthy`), value the problem's code (`xid-79`, `ras-umc-ue`,
//!   `device-node-gone`, ...), effect `NoSchedule` (the scheduler places no new claim on it
//!   unless the claim tolerates it); a lost device (its node or PCI function gone, NVML lost
//!   it) gets `NoExecute` instead where the admin opts in (`--taint-lost-no-execute`), which
//!   makes the scheduler's eviction controller delete the pods using it. Recovery removes the
//!   taint. Where the server drops taints (1.34 without the DRADeviceTaints gate) the device
//!   leaves the slice while it is unhealthy and comes back on recovery ([`TaintMode::Withdraw`]).
//! - **The kubelet's DRAResourceHealth stream** (KEP-4680; gRPC `v1alpha1.DRAResourceHealth`
//!   from kubelet 1.34 with gate ResourceHealthStatus, `v1.DRAResourceHealth` from 1.37, both
//!   served on the DRA socket, [`HealthService`]): every published device's status, sent at
//!   once, on every change and every [`HEARTBEAT`] (the kubelet takes a status older than 30 s
//!   as Unknown). The kubelet shows it in `status.containerStatuses[].allocatedResourcesStatus`
//!   of the pods whose claims hold the device.

use crate::api::{health_v1, health_v1alpha1};
use actk_core::inventory::Inventory;
use actk_core::profile::Profile;
use actk_node::health::{HealthMap, HealthOptions, Monitor, Problem, ProblemKind, XidPolicy};
use k8s_openapi::api::resource::v1::DeviceTaint;
use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use crate::slice::device_name;

/// The key of the driver's device taints.
pub const TAINT_KEY: &str = "actk.dev/unhealthy";

/// How often the health stream repeats every device's status without a change, below the
/// kubelet's 30 s timeout (k8s.io/kubernetes pkg/kubelet/cm/dra/healthinfo.go `healthTimeout`).
pub const HEARTBEAT: Duration = Duration::from_secs(10);

/// The gRPC service names of the health API, as listed in `PluginInfo.supported_versions`
/// (a 1.37 kubelet uses the first it knows; a 1.34 kubelet skips names it does not know).
pub const HEALTH_SERVICES: &[&str] = &["v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"];

/// What an unhealthy device becomes in the ResourceSlice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TaintMode {
    /// It leaves the slice (the API server drops device taints).
    #[default]
    Withdraw,
    /// It stays, with a device taint.
    Taint {
        /// Lost devices get effect NoExecute instead of NoSchedule (the admin's opt-in).
        lost_no_execute: bool,
    },
}

impl TaintMode {
    /// The mode for a server that keeps device taints (`Some(true)`) or not (`Some(false)`, or
    /// `None` when that could not be found out, as safe as before: withdraw).
    pub fn for_server(device_taints: Option<bool>, lost_no_execute: bool) -> TaintMode {
        match device_taints {
            Some(true) => TaintMode::Taint { lost_no_execute },
            _ => TaintMode::Withdraw,
        }
    }
}

/// The device taint for `problem`: key [`TAINT_KEY`], value the problem's code, effect
/// `NoSchedule`, or `NoExecute` for a [`ProblemKind::Lost`] device with `lost_no_execute`.
/// `timeAdded` is left to the API server (it sets it on create).
pub fn taint(problem: &Problem, lost_no_execute: bool) -> DeviceTaint {
    let effect = if lost_no_execute && problem.kind == ProblemKind::Lost { "NoExecute" } else { "NoSchedule" };
    DeviceTaint {
        key: TAINT_KEY.into(),
        value: Some(problem.code.clone()),
        effect: effect.into(),
        ..Default::default()
    }
}

/// The worst problem of device `index` in `map` (the device itself or any of its MIG devices:
/// the slice publishes the whole GPU).
pub fn device_problem(map: &HealthMap, index: u32) -> Option<&Problem> {
    map.range((index, None)..=(index, Some(u32::MAX))).filter_map(|(_, p)| p.as_ref()).max_by_key(|p| p.kind)
}

/// The health engines of the served vendors, kept across rediscoveries (an error counter's
/// baseline and a recent fault survive them) and rebuilt for a vendor whose devices changed.
#[derive(Debug, Default)]
pub struct Monitors {
    by_profile: BTreeMap<String, Monitor>,
}

impl Monitors {
    /// Follows `inv` (discovered with `profiles`): a vendor whose probes changed gets a new
    /// engine, a vendor no longer served loses its own.
    pub fn update(&mut self, inv: &Inventory, profiles: &[Profile], opts: &HealthOptions) {
        self.by_profile.retain(|p, _| inv.vendor(p).is_some());
        for v in &inv.vendors {
            let Some(p) = profiles.iter().find(|p| p.name == v.profile) else { continue };
            let fresh = actk_node::health::probes(&inv.root, p, v);
            if self.by_profile.get(&v.profile).is_some_and(|m| m.probes() == fresh.as_slice()) {
                continue;
            }
            self.by_profile.insert(v.profile.clone(), Monitor::new(&inv.root, p, v, opts));
        }
    }

    /// Every watched device's problem now, by slice device name (healthy devices: `None`).
    pub fn check(&mut self) -> BTreeMap<String, Option<Problem>> {
        let mut out = BTreeMap::new();
        for (profile, m) in &mut self.by_profile {
            let map = m.check();
            let indexes: Vec<u32> = m.probes().iter().map(|p| p.index).collect();
            for i in indexes {
                out.insert(device_name(profile, i), device_problem(&map, i).cloned());
            }
        }
        out
    }
}

/// The default judgement of the DRA driver: NVIDIA's Xid policy with the environment's
/// `DP_DISABLE_HEALTHCHECKS`/`DP_ENABLE_HEALTHCHECKS` (as the device plugin reads them), a
/// minute's quiet after an error event, polled every `poll`.
pub fn default_options(recovery: Duration, poll: Duration) -> HealthOptions {
    let policy = XidPolicy::new(
        &[],
        recovery,
        std::env::var("DP_DISABLE_HEALTHCHECKS").ok().as_deref(),
        std::env::var("DP_ENABLE_HEALTHCHECKS").ok().as_deref(),
    );
    HealthOptions { policy, poll }
}

/// What the kubelet is told: the pool and each published device's problem (`None`: healthy).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HealthReport {
    /// The pool (the node's name).
    pub pool: String,
    /// Device name -> problem.
    pub devices: BTreeMap<String, Option<Problem>>,
}

/// How the publisher reports health: the channel the [`HealthService`] streams from.
pub type Reporter = Arc<watch::Sender<Arc<HealthReport>>>;

/// The kubelet's health messages are at most this long (the kubelet truncates longer ones).
const MAX_MESSAGE: usize = 1024;

fn message(p: &Problem) -> String {
    let text = format!("{} [{}]", p.reason, p.code);
    if text.len() <= MAX_MESSAGE {
        return text;
    }
    let mut cut = MAX_MESSAGE - 3;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}...", &text[..cut])
}

/// The DRAResourceHealth service (v1 and v1alpha1) over the publisher's reports.
#[derive(Clone)]
pub struct HealthService {
    /// The latest report.
    pub reports: watch::Receiver<Arc<HealthReport>>,
    /// The repeat period ([`HEARTBEAT`]).
    pub heartbeat: Duration,
}

fn unix_now() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0)
}

macro_rules! health_version {
    ($v:ident) => {
        impl HealthService {
            fn $v(r: &HealthReport) -> $v::NodeWatchResourcesResponse {
                let now = unix_now();
                $v::NodeWatchResourcesResponse {
                    devices: r
                        .devices
                        .iter()
                        .map(|(name, p)| $v::DeviceHealth {
                            device: Some($v::DeviceIdentifier { pool_name: r.pool.clone(), device_name: name.clone() }),
                            health: if p.is_some() { $v::HealthStatus::Unhealthy } else { $v::HealthStatus::Healthy }
                                as i32,
                            last_updated_time: now,
                            health_check_timeout_seconds: 0,
                            message: p.as_ref().map(message).unwrap_or_default(),
                        })
                        .collect(),
                }
            }
        }

        #[tonic::async_trait]
        impl $v::dra_resource_health_server::DraResourceHealth for HealthService {
            type NodeWatchResourcesStream = Pin<
                Box<dyn tokio_stream::Stream<Item = Result<$v::NodeWatchResourcesResponse, Status>> + Send + 'static>,
            >;

            async fn node_watch_resources(
                &self,
                _: Request<$v::NodeWatchResourcesRequest>,
            ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
                let (tx, rx) = tokio::sync::mpsc::channel(4);
                let mut reports = self.reports.clone();
                let heartbeat = self.heartbeat;
                tracing::info!(concat!("the kubelet watches device health (", stringify!($v), ")"));
                tokio::spawn(async move {
                    loop {
                        let now = Self::$v(&reports.borrow_and_update());
                        if tx.send(Ok(now)).await.is_err() {
                            return;
                        }
                        tokio::select! {
                            changed = reports.changed() => if changed.is_err() { return },
                            _ = tokio::time::sleep(heartbeat) => {}
                            _ = tx.closed() => return,
                        }
                    }
                });
                Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))))
            }
        }
    };
}

health_version!(health_v1);
health_version!(health_v1alpha1);

#[cfg(test)]
mod tests {
    use super::*;

    fn problem(kind: ProblemKind, code: &str) -> Problem {
        Problem { kind, code: code.into(), reason: format!("{code} happened") }
    }

    #[test]
    fn taints_say_what_and_lost_devices_execute_only_where_opted_in() {
        let t = taint(&problem(ProblemKind::Faulty, "xid-79"), true);
        assert_eq!((t.key.as_str(), t.value.as_deref(), t.effect.as_str()), (TAINT_KEY, Some("xid-79"), "NoSchedule"));
        let lost = problem(ProblemKind::Lost, "device-node-gone");
        assert_eq!(taint(&lost, false).effect, "NoSchedule");
        assert_eq!(taint(&lost, true).effect, "NoExecute");
        assert_eq!(TaintMode::for_server(Some(true), false), TaintMode::Taint { lost_no_execute: false });
        assert_eq!(TaintMode::for_server(Some(false), true), TaintMode::Withdraw);
        assert_eq!(TaintMode::for_server(None, true), TaintMode::Withdraw, "unknown: as safe as before");
    }

    #[test]
    fn a_mig_problem_is_the_whole_gpus_and_lost_is_worst() {
        let mut h = HealthMap::new();
        h.insert((0, None), None);
        h.insert((0, Some(3)), Some(problem(ProblemKind::Faulty, "xid-48")));
        h.insert((1, None), Some(problem(ProblemKind::Faulty, "ecc-uncorrected")));
        h.insert((1, Some(0)), Some(problem(ProblemKind::Lost, "nvml-unreachable")));
        h.insert((2, None), None);
        assert_eq!(device_problem(&h, 0).map(|p| p.code.as_str()), Some("xid-48"));
        assert_eq!(device_problem(&h, 1).map(|p| p.code.as_str()), Some("nvml-unreachable"));
        assert_eq!(device_problem(&h, 2), None);
    }

    #[test]
    fn messages_fit_the_kubelets_limit() {
        let mut p = problem(ProblemKind::Faulty, "ras-umc-ue");
        assert_eq!(message(&p), "ras-umc-ue happened [ras-umc-ue]");
        p.reason = "é".repeat(800);
        let m = message(&p);
        assert!(m.len() <= MAX_MESSAGE && m.ends_with("..."), "{}", m.len());
    }
}
