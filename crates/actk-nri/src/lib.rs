//! actk-nri: an NRI plugin (containerd/nri, the Node Resource Interface that containerd 2.x and
//! CRI-O enable by default) that gives containers their accelerators with no runtime shim: a
//! long-running process on the node answers the runtime's CreateContainer with the container
//! adjustment (device nodes, mounts, env, hooks) for the container's requests, planned by the
//! same code as actk-runtime ([`actk_core::plan`]) from an inventory and CDI specs held in
//! memory and refreshed when they change.
//!
//! - [`mux`]: NRI's multiplexing of several connections over one socket;
//! - [`ttrpc`]: ttrpc message framing;
//! - [`adjust`]: NRI container -> what planning reads; CDI edits -> NRI adjustment (pure);
//! - [`planner`]: the planning context kept in memory;
//! - [`gate`]: the CDI device that makes a container fail, naming the plugin, when the plugin
//!   did not serve it;
//! - [`plugin`]: registration and the Plugin service;
//! - [`events`]: Events on the pods of containers the plugin did not serve.
//!
//! No Rust NRI crate exists; the protocol is written here from NRI's published proto
//! (proto/nri/api.proto is actk's own subset, wire compatible with NRI 0.9+).

pub mod adjust;
pub mod events;
pub mod gate;
pub mod mux;
pub mod planner;
pub mod plugin;
pub mod ttrpc;

/// Generated protobuf messages.
#[allow(missing_docs, clippy::all, unused_qualifications)]
pub mod proto {
    /// NRI API (`nri.pkg.api.v1alpha1`).
    pub mod nri {
        include!(concat!(env!("OUT_DIR"), "/nri.pkg.api.v1alpha1.rs"));
    }
    /// ttrpc envelope (`ttrpc`).
    pub mod ttrpc {
        include!(concat!(env!("OUT_DIR"), "/ttrpc.rs"));
    }
}
