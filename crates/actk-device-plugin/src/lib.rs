//! actk-device-plugin: one Kubernetes device plugin (kubelet device plugin API v1beta1) for
//! every vendor profile actk knows (DESIGN.md "Crates", "Compatibility contracts").
//!
//! Data flow, functional core first:
//! - [`resources`]: the inventory (actk-core discovery) becomes one [`resources::Resource`] per
//!   extended resource name (`nvidia.com/gpu`, `aws.amazon.com/neuron`,
//!   `aws.amazon.com/neuroncore`, ...), each a list of kubelet device IDs;
//! - [`topology`]: pure preferred-allocation choices (NUMA, NVLink/XGMI sets, Inferentia rings,
//!   Trainium torus blocks), from the node layer (actk-node);
//! - [`allocate`]: pure Allocate answers built from CDI container edits, per strategy
//!   (`cdi-cri`, `cdi-annotations`, `envvar`, `device-specs`);
//! - [`health`]: the node layer's health engine (actk-node): device probes over the host root,
//!   the NVML Xid watch and the polling loop that publishes changes;
//! - [`held`]: the ledger of units handed out (Allocate answers, reconciled with the kubelet's
//!   PodResources), which withdraws hardware held through one resource from the others over it;
//! - the imperative shell: [`service`] (the gRPC DevicePlugin service), [`manager`] (serve,
//!   register, watch for kubelet restarts), [`metrics`] (Prometheus text endpoint),
//!   [`config`] (file < env < flags), [`uds`] (gRPC over unix sockets, actk-node), [`dra_servers`]
//!   (the kinds the DRA driver serves on this node, left alone), [`node_config`] (the config
//!   the node's label `actk.dev/config` names), [`telemetry_grant`] (the NVIDIA device nodes
//!   the telemetry exporter reads, as one extended resource of its own).

pub mod allocate;
pub mod api;
pub mod config;
pub mod dra_servers;
pub mod held;
pub mod manager;
pub mod metrics;
pub mod node_config;
pub mod resources;
pub mod service;
pub mod telemetry_grant;

// The node layer's modules under the paths the plugin's code (and its tests) use.
pub use actk_node::{health, topology, uds};
