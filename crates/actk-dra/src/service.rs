//! The gRPC services the kubelet calls: `pluginregistration.Registration` on the registration
//! socket, and the DRA service in versions v1 and v1beta1 (the same messages) on the DRA socket.
//!
//! NodePrepareResources answers every claim of the request: its devices, or its error. A
//! failed claim does not fail the others; the kubelet retries the failed ones.

use crate::api::registration::registration_server::Registration;
use crate::api::registration::{InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse};
use crate::api::{v1, v1beta1};
use crate::claim::ClaimRef;
use crate::driver::Driver;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::sync::watch;
use tonic::{Request, Response, Status};

/// `PluginInfo.type` of a DRA driver.
pub const PLUGIN_TYPE: &str = "DRAPlugin";
/// The DRA service versions this driver serves, newest first, as the kubelet names them.
pub const SUPPORTED_VERSIONS: &[&str] = &["v1.DRAPlugin", "v1beta1.DRAPlugin"];

/// The Registration service: tells the kubelet the driver's name and DRA socket, and records
/// what the kubelet says back.
pub struct Registrar {
    /// Driver name.
    pub name: String,
    /// Absolute path of the DRA socket as the kubelet sees it.
    pub endpoint: PathBuf,
    /// Latest registration status from the kubelet (`Some(Ok(()))` registered, `Some(Err(why))`).
    pub status: watch::Sender<Option<Result<(), String>>>,
}

#[tonic::async_trait]
impl Registration for Registrar {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(PluginInfo {
            r#type: PLUGIN_TYPE.into(),
            name: self.name.clone(),
            endpoint: self.endpoint.display().to_string(),
            // The DRA service first: a kubelet takes the first entry it knows as the DRA
            // service, and from 1.37 the health services it finds as the optional one.
            supported_versions: SUPPORTED_VERSIONS
                .iter()
                .chain(crate::health::HEALTH_SERVICES)
                .map(|s| s.to_string())
                .collect(),
        }))
    }

    async fn notify_registration_status(
        &self,
        req: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let s = req.into_inner();
        if s.plugin_registered {
            tracing::info!("registered with the kubelet as DRA driver {}", self.name);
            self.status.send_replace(Some(Ok(())));
        } else {
            tracing::error!("the kubelet did not register DRA driver {}: {}", self.name, s.error);
            self.status.send_replace(Some(Err(s.error)));
        }
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

/// The DRA service over a [`Driver`]; one value serves both versions.
#[derive(Clone)]
pub struct DraService(pub Arc<Driver>);

macro_rules! dra_version {
    ($v:ident) => {
        #[tonic::async_trait]
        impl $v::dra_plugin_server::DraPlugin for DraService {
            async fn node_prepare_resources(
                &self,
                req: Request<$v::NodePrepareResourcesRequest>,
            ) -> Result<Response<$v::NodePrepareResourcesResponse>, Status> {
                let t = std::time::Instant::now();
                let mut out = $v::NodePrepareResourcesResponse::default();
                for c in req.into_inner().claims {
                    let claim = ClaimRef { namespace: c.namespace, uid: c.uid, name: c.name };
                    // In a task of its own: the kubelet gives up on a call after 45 s, which
                    // drops this future; a prepare that is making MIG devices must still finish
                    // and record them (or undo them), not stop half-way.
                    let (driver, c) = (self.0.clone(), claim.clone());
                    let result = tokio::spawn(async move { driver.prepare(&c).await })
                        .await
                        .unwrap_or_else(|e| Err(format!("claim {claim}: prepare failed: {e}")));
                    if let Some(m) = self.0.metrics() {
                        m.claim("prepare", result.is_ok());
                    }
                    let answer = match result {
                        Ok(devices) => $v::NodePrepareResourceResponse {
                            devices: devices
                                .into_iter()
                                .map(|d| $v::Device {
                                    request_names: vec![d.request],
                                    pool_name: d.pool,
                                    device_name: d.device,
                                    cdi_device_ids: d.cdi_ids,
                                })
                                .collect(),
                            error: String::new(),
                        },
                        Err(e) => {
                            tracing::warn!("NodePrepareResources: {e}");
                            $v::NodePrepareResourceResponse { devices: Vec::new(), error: e }
                        }
                    };
                    out.claims.insert(claim.uid, answer);
                }
                let took = t.elapsed();
                if let Some(m) = self.0.metrics() {
                    m.request("NodePrepareResources", took);
                }
                tracing::info!(
                    "NodePrepareResources: {} claim(s) answered in {:.3} ms",
                    out.claims.len(),
                    took.as_secs_f64() * 1e3
                );
                Ok(Response::new(out))
            }

            async fn node_unprepare_resources(
                &self,
                req: Request<$v::NodeUnprepareResourcesRequest>,
            ) -> Result<Response<$v::NodeUnprepareResourcesResponse>, Status> {
                let t = std::time::Instant::now();
                let mut out = $v::NodeUnprepareResourcesResponse::default();
                for c in req.into_inner().claims {
                    let claim = ClaimRef { namespace: c.namespace, uid: c.uid, name: c.name };
                    // In a task of its own, as prepare: a destroy under way finishes.
                    let (driver, c) = (self.0.clone(), claim.clone());
                    let result = tokio::spawn(async move { driver.unprepare(&c).await })
                        .await
                        .unwrap_or_else(|e| Err(format!("claim {claim}: unprepare failed: {e}")));
                    if let Some(m) = self.0.metrics() {
                        m.claim("unprepare", result.is_ok());
                    }
                    let error = match result {
                        Ok(()) => String::new(),
                        Err(e) => {
                            tracing::warn!("NodeUnprepareResources: {e}");
                            e
                        }
                    };
                    out.claims.insert(claim.uid, $v::NodeUnprepareResourceResponse { error });
                }
                if let Some(m) = self.0.metrics() {
                    m.request("NodeUnprepareResources", t.elapsed());
                }
                Ok(Response::new(out))
            }
        }
    };
}

dra_version!(v1);
dra_version!(v1beta1);
