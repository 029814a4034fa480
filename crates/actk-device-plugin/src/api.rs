//! The kubelet device plugin API v1beta1 (proto/v1beta1/api.proto, compiled by build.rs) and
//! its constants (k8s.io/kubelet pkg/apis/deviceplugin/v1beta1 constants.go); the kubelet's
//! PodResources API v1 in [`podresources`].

#![allow(missing_docs, unused_qualifications, clippy::all)]

tonic::include_proto!("v1beta1");

/// API version sent in `RegisterRequest.version`.
pub const VERSION: &str = "v1beta1";
/// `Device.health` of a usable device.
pub const HEALTHY: &str = "Healthy";
/// `Device.health` of a device the kubelet must not hand out.
pub const UNHEALTHY: &str = "Unhealthy";
/// Directory where the kubelet and device plugins put their sockets.
pub const DEFAULT_SOCKET_DIR: &str = "/var/lib/kubelet/device-plugins";
/// File name of the kubelet's Registration socket in that directory.
pub const KUBELET_SOCKET: &str = "kubelet.sock";

/// The kubelet's PodResources API v1 (proto/podresources/v1/api.proto): which devices the
/// kubelet has assigned to the containers of the node's pods.
pub mod podresources {
    #![allow(missing_docs, unused_qualifications, clippy::all)]
    tonic::include_proto!("v1");

    /// Where the kubelet serves it, under its root directory (`--root-dir`, default
    /// /var/lib/kubelet): `pod-resources/kubelet.sock`.
    pub const DEFAULT_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";
}
