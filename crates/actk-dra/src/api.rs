//! The kubelet APIs the DRA driver speaks, compiled from proto/ by build.rs.

#![allow(missing_docs, unused_qualifications, clippy::all)]

/// Plugin registration (`pluginregistration.Registration`).
pub mod registration {
    tonic::include_proto!("pluginregistration");
}
/// DRA service version v1 (`k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin`).
pub mod v1 {
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
}
/// DRA service version v1beta1 (same messages as v1).
pub mod v1beta1 {
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1beta1");
}
