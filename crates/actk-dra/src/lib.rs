//! actk-dra: one Kubernetes DRA driver (resource.k8s.io/v1, driver `actk.dev`) for every vendor
//! profile actk knows (DESIGN.md "Crates"; docs/architecture.md).
//!
//! Data flow, functional core first:
//! - [`slice`]: the inventory (actk-core discovery) becomes the node's ResourceSlices: one pool
//!   named after the node, one device per accelerator with its attributes and capacities;
//! - [`claim`]: an allocated ResourceClaim becomes one transient CDI spec and the
//!   NodePrepareResources answer (qualified CDI names);
//! - [`checkpoint`]: what was prepared, on disk, for a restarted driver;
//! - the imperative shell: [`driver`] (prepare/unprepare with the CDI directory and the
//!   checkpoint), [`service`] (the gRPC services), [`plugin`] (the sockets), [`authority`]
//!   (the registration socket's `:authority` fix), [`publish`] (discovery, health and the
//!   ResourceSlice publisher), [`health`] (device taints and the kubelet's health stream), [`events`] (what a user sees when a claim cannot be served),
//!   [`kube`] (the API server client), [`discovery`] (what the API server serves),
//!   [`servers`] (the per-node choice between the driver and the device plugin), [`metrics`]
//!   (Prometheus).

pub mod api;
pub mod authority;
pub mod checkpoint;
pub mod claim;
pub mod config;
pub mod discovery;
pub mod driver;
pub mod events;
pub mod health;
pub mod kube;
pub mod metrics;
pub mod mig;
pub mod plugin;
pub mod publish;
pub mod servers;
pub mod service;
pub mod slice;
