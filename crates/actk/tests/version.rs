//! `--version` of every actk binary: the workspace version and the git commit it was built from
//! (issue 15), so a bug report names the exact build. actk-runtime then hands over to the
//! low-level runtime, whose own version lines follow (as nvidia-container-runtime does).

use actk_testsupport::engines::{bin, text, which};
use std::process::Command;

/// The commit this checkout is at (12 hex digits), as the build recorded it.
fn head_commit() -> String {
    let out = Command::new("git").args(["rev-parse", "--short=12", "HEAD"]).output().expect("git");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn every_binary_reports_the_workspace_version_and_the_git_commit() {
    let want_prefix = format!("{} (commit ", env!("CARGO_PKG_VERSION"));
    let head = head_commit();
    for name in ["actk", "actk-runtime", "actk-hook", "actk-device-plugin"] {
        // actk-runtime reads its config only to find runc: give it one that names no file.
        let out = Command::new(bin(name)).arg("--version").env("ACTK_CONFIG", "/dev/null").output().unwrap();
        let (stdout, stderr) = text(&out);
        let first = stdout.lines().next().unwrap_or_default();
        assert!(first.starts_with(&format!("{name} {want_prefix}")), "{name} --version: {stdout:?} {stderr}");
        // A build from this checkout names its HEAD (the binaries are built before the tests).
        assert!(head.is_empty() || first.contains(&head), "{name} --version names {first:?}, HEAD is {head}");
        if name == "actk-runtime" && which("runc").is_some() {
            assert!(out.status.success(), "{stderr}");
            assert!(stdout.contains("runc version"), "actk-runtime hands --version to runc: {stdout}");
        }
    }
}

/// The image and the chart carry the version the binaries report (issue 15): the chart's
/// `version` and `appVersion` (the image tag it defaults to), and the Containerfile's label.
#[test]
fn chart_and_image_carry_the_workspace_version() {
    let version = env!("CARGO_PKG_VERSION");
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let chart = std::fs::read_to_string(repo.join("deploy/helm/actk-device-plugin/Chart.yaml")).unwrap();
    let field = |k: &str| {
        chart.lines().find_map(|l| l.strip_prefix(&format!("{k}:"))).map(|v| v.trim().trim_matches('"').to_string())
    };
    assert_eq!(field("version").as_deref(), Some(version), "Chart.yaml version");
    assert_eq!(field("appVersion").as_deref(), Some(version), "Chart.yaml appVersion");
    let containerfile = std::fs::read_to_string(repo.join("Containerfile")).unwrap();
    assert!(containerfile.contains(&format!("ARG ACTK_VERSION={version}\n")), "Containerfile ACTK_VERSION");
    let script = std::fs::read_to_string(repo.join("scripts/k8s/actk-image.sh")).unwrap();
    assert!(script.contains("org.opencontainers.image.version=$version"), "actk-image.sh labels the version");
}
