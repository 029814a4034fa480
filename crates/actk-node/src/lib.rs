//! actk-node: the node layer below actk's Kubernetes front ends (DESIGN.md "Crates"). The device
//! plugin and the DRA driver both build on it and never on each other; each translates what it
//! finds into its own API (ListAndWatch health, ResourceSlices).
//!
//! - [`health`]: the health engine: device-node and PCI probes over the host root, the NVML Xid
//!   watch, and the polling loop that publishes every change;
//! - [`topology`]: pure choices over the link graph and NUMA nodes (preferred allocation, the
//!   recognised shape that DRA's link-group attributes come from);
//! - [`labels`]: node labels from discovery (actk.dev/, GFD's and AMD's labeller's names);
//! - [`telemetry`]: device readings for every vendor (NVML, amdgpu and Neuron sysfs);
//! - [`metrics_http`]: the Prometheus scrape endpoint (hyper) the front ends serve metrics on;
//! - [`uds`]: gRPC clients over unix sockets (the kubelet's sockets, the tests' emulators).

pub mod health;
pub mod labels;
pub mod metrics_http;
pub mod telemetry;
pub mod topology;
pub mod uds;
