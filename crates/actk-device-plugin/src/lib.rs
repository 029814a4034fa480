//! actk-device-plugin: one Kubernetes device plugin (kubelet device plugin API v1beta1) for
//! every vendor profile actk knows (DESIGN.md "Crates", "Compatibility contracts").
//!
//! Data flow, functional core first:
//! - [`resources`]: the inventory (actk-core discovery) becomes one [`resources::Resource`] per
//!   extended resource name (`nvidia.com/gpu`, `aws.amazon.com/neuron`,
//!   `aws.amazon.com/neuroncore`, ...), each a list of kubelet device IDs;
//! - [`topology`]: pure preferred-allocation choices (NUMA, NVLink/XGMI sets, Inferentia rings,
//!   Trainium torus blocks);
//! - [`allocate`]: pure Allocate answers built from CDI container edits, per strategy
//!   (`cdi-cri`, `cdi-annotations`, `envvar`, `device-specs`);
//! - [`health`]: device probes over the host root and the polling loop that publishes changes;
//! - the imperative shell: [`service`] (the gRPC DevicePlugin service), [`manager`] (serve,
//!   register, watch for kubelet restarts), [`metrics`] (Prometheus text endpoint),
//!   [`config`] (file < env < flags), [`uds`] (gRPC over unix sockets), [`dra_servers`] (the
//!   kinds the DRA driver serves on this node, left alone).

pub mod allocate;
pub mod api;
pub mod config;
pub mod dra_servers;
pub mod health;
pub mod manager;
pub mod metrics;
pub mod resources;
pub mod service;
pub mod topology;
pub mod uds;
