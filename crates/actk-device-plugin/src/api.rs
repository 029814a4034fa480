//! The kubelet device plugin API v1beta1 (proto/v1beta1/api.proto, compiled by build.rs) and
//! its constants (k8s.io/kubelet pkg/apis/deviceplugin/v1beta1 constants.go).

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
