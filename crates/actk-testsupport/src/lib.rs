//! Test support shared by actk's test suites (never shipped).
//!
//! - [`fixture`]: prepare a fixture host root (fixtures/<name>) in a temporary directory with
//!   real device nodes (mknod, needs root) and a real ld.so.cache.
//! - [`engines`]: busybox/glibc images and OCI bundles, and access to runc, dockerd and podman.
//! - [`cluster`]: the real single-node Kubernetes cluster (scripts/k8s-node.sh) with actk's
//!   chart, for the cluster tests in crates/k8s-e2e.
//! - [`nvml_double`]: the NVML test double of the NVIDIA fixtures: its state, Xid events, lost GPUs, ECC counts.
//! - [`hostcheck`]: snapshots of the host (mount table, /dev, CDI dirs, daemon.json) and a guard
//!   that fails a test which left something behind.
//! - [`hostile`]: the hostile image files of issue 29 (an amplifying ld.so.cache, a crafted ELF,
//!   a flood of compat drop-ins), for tests and benches/hostile-bench.sh.

pub mod cluster;
pub mod debroot;
pub mod engines;
pub mod fixture;
pub mod hostcheck;
pub mod hostile;
pub mod nvml_double;
