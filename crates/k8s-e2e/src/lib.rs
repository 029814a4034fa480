//! End-to-end tests on the real single-node Kubernetes cluster live in tests/; this library is
//! empty. Every test is `#[ignore]`d so that `cargo test --workspace` does not start a cluster
//! next to the other end-to-end tests: `make test` runs them as their own step, one at a time
//! (`cargo test -p actk-k8s-e2e -- --ignored --test-threads=1`), after the others. See
//! docs/kubernetes.md for how a test uses the cluster.
