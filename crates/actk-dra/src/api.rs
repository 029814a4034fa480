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
/// DRA resource health service version v1 (`v1.DRAResourceHealth`, kubelet 1.37).
pub mod health_v1 {
    tonic::include_proto!("v1");
}
/// DRA resource health service version v1alpha1 (`v1alpha1.DRAResourceHealth`, kubelet 1.34;
/// same messages as v1).
pub mod health_v1alpha1 {
    tonic::include_proto!("v1alpha1");
}
