//! Container images, OCI bundles and engines for end-to-end tests (owner: e2e helper).
