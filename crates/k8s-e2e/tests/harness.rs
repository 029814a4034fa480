//! The test cluster's script as its users meet it, without a cluster (issue 28 item 6).
//! `#[ignore]`d only because `make test` runs this crate's tests in its cluster step
//! (`make test-k8s`, `--ignored`); they need no cluster and leave a running one alone.

use actk_testsupport::engines::workspace_root;
use std::process::Command;
use std::time::{Duration, Instant};

/// `k8s-node.sh kubectl` (and helm, ctr) on a machine where no cluster runs says so at once,
/// instead of starting a Kubernetes build or a cluster.
#[test]
#[ignore = "runs in make test-k8s, with this crate's other tests"]
fn kubectl_without_a_cluster_says_there_is_none() {
    let tmp = tempfile::tempdir().unwrap();
    for cmd in ["kubectl", "helm", "ctr"] {
        let t = Instant::now();
        let o = Command::new("timeout")
            .arg("60")
            .arg(workspace_root().join("scripts/k8s-node.sh"))
            .args([cmd, "get", "pods"])
            // A state and run directory of its own: the machine's cluster, if one runs, is not this one.
            .env("ACTK_K8S_STATE", tmp.path().join("state"))
            .env("ACTK_K8S_RUN", tmp.path().join("run"))
            .env("ACTK_KUBE_CACHE", tmp.path().join("kube-cache"))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{cmd}: {err}");
        assert!(
            err.contains("no cluster is running on this machine") && err.contains("k8s-node.sh up"),
            "{cmd}: {err}"
        );
        assert!(t.elapsed() < Duration::from_secs(10), "{cmd} answered at once, it built nothing");
        assert!(!tmp.path().join("kube-cache").exists(), "{cmd}: no Kubernetes build started");
    }
}

/// `k8s-node.sh install` builds the image with scripts/k8s/actk-image.sh: a second build of
/// an unchanged checkout rebuilds no binary and gives the same image.
#[test]
#[ignore = "runs in make test-k8s, with this crate's other tests"]
fn the_image_is_not_rebuilt_from_unchanged_sources() {
    let tmp = tempfile::tempdir().unwrap();
    let image = || {
        let o = Command::new(workspace_root().join("scripts/k8s/actk-image.sh"))
            .args(["--profile", "debug", "--out"])
            .arg(tmp.path().join("actk.tar"))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(o.status.success(), "actk-image.sh: {err}");
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        (out.lines().last().unwrap_or_default().to_string(), err)
    };
    let (first, _) = image();
    let (second, err) = image();
    assert_eq!(first, second, "the same image");
    assert!(err.contains("sources unchanged") && !err.contains("Compiling"), "{err}");
}
