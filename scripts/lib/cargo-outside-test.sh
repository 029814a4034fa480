# Sourced (bash) by the scripts that run cargo builds: scripts/build-release.sh and
# scripts/k8s/actk-image.sh. A cargo test that runs them (the cluster harness builds the image
# through them, crates/actk-testsupport/src/cluster.rs) hands on what Cargo sets for a test:
# CARGO_MANIFEST_DIR, CARGO_PKG_*, CARGO_CRATE_NAME and the like. Build scripts that read those
# (ring's reads CARGO_MANIFEST_DIR) then see a value their last run did not, run again, and
# everything above them is rebuilt: ring, rustls, kube and the four binaries that use kube, ten
# minutes of a CI run (stop 38) for a build `make test` had just done. Without them, the build
# is the one a shell would run, and finds nothing to do.
for _v in $(compgen -e); do
  case $_v in
    CARGO_MANIFEST_DIR | CARGO_MANIFEST_PATH | CARGO_MANIFEST_LINKS | CARGO_PKG_* | CARGO_CRATE_NAME | \
      CARGO_PRIMARY_PACKAGE | CARGO_BIN_NAME | CARGO_BIN_EXE_* | CARGO_TARGET_TMPDIR | OUT_DIR)
      unset "$_v" ;;
  esac
done
unset _v
