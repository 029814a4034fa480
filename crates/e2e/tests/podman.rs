//! `podman run --runtime <actk-runtime>` with the real podman 4.3 (issue 3, item 4), on the
//! heterogeneous fixture. (podman with CDI, `--device nvidia.com/gpu=0`, is in cdi_podman.rs.)
//!
//! podman starts the runtime through conmon, which does not pass podman's environment on
//! (checked on this machine: a variable set for podman is absent in the runtime's env), so the
//! test's config travels in a wrapper script (`ACTK_CONFIG=... exec actk-runtime "$@"`) given
//! as `--runtime`. The engines helper adds `--ulimit` flags this machine needs.

use actk_testsupport::engines::{self, ActkConfig, expect_success, names, podman, unique_name};
use actk_testsupport::fixture;
use anyhow::Result;
use std::collections::BTreeSet;

#[test]
fn podman_run_with_runtime_actk_runtime_sees_the_requested_gpu_and_neuron_device_only() -> Result<()> {
    if !engines::require_root_and_engines() {
        return Ok(());
    }
    let Some(fx) = fixture::prepare("hetero-nvidia-neuron")? else { return Ok(()) };
    let cfg = ActkConfig::new(&fx.root)?;
    let wrapper = cfg.write_wrapper()?;
    let image = engines::podman_busybox_image()?;
    let name = unique_name("e2e-podman");
    let runtime = wrapper.display().to_string();
    let o = podman(&[
        "run",
        "--rm",
        "--network",
        "none",
        "--name",
        &name,
        "--runtime",
        &runtime,
        "-e",
        "NVIDIA_VISIBLE_DEVICES=1",
        "-e",
        "AWS_NEURON_VISIBLE_DEVICES=1",
        image,
        "ls",
        "-1",
        "/dev",
    ]);
    let dev = names(&expect_success("podman run --runtime actk-runtime", &o));
    let got: BTreeSet<&str> =
        dev.iter().map(String::as_str).filter(|n| n.starts_with("nvidia") || n.starts_with("neuron")).collect();
    // GPU index 1 is the second in PCI bus order; on this fixture its node is /dev/nvidia0.
    let gpus = engines::fixture_gpus(&fx.root);
    let (second, first) = (gpus[1].node(), gpus[0].node());
    for want in [second.as_str(), "nvidiactl", "neuron1"] {
        assert!(got.contains(want), "/dev/{want} missing: {dev:?}");
    }
    for unwanted in [first.as_str(), "neuron0"] {
        assert!(!got.contains(unwanted), "/dev/{unwanted} was not asked for: {dev:?}");
    }
    Ok(())
}

#[test]
fn podman_annotation_cdi_k8s_io_through_actk_runtime_applies_that_cdi_device() -> Result<()> {
    if !engines::require_root_and_engines() {
        return Ok(());
    }
    let host = tempfile::tempdir()?;
    let cfg = ActkConfig::new(host.path())?;
    // A device defined only by a CDI spec in actk's spec dir (not podman's): only actk-runtime
    // can have applied it.
    let kind_file = cfg.spec_dir().join(format!("{}.json", unique_name("e2e-example")));
    std::fs::write(
        &kind_file,
        serde_json::json!({
            "cdiVersion": "0.3.0",
            "kind": "example.com/accel",
            "devices": [{ "name": "e2e", "containerEdits": { "env": ["EXAMPLE_ACCEL=e2e"] } }]
        })
        .to_string(),
    )?;
    let wrapper = cfg.write_wrapper()?;
    let image = engines::podman_busybox_image()?;
    let name = unique_name("e2e-podman-cdi-annotation");
    let runtime = wrapper.display().to_string();
    let o = podman(&[
        "run",
        "--rm",
        "--network",
        "none",
        "--name",
        &name,
        "--runtime",
        &runtime,
        "--annotation",
        "cdi.k8s.io/e2e=example.com/accel=e2e",
        image,
        "env",
    ]);
    let env = expect_success("podman run --annotation cdi.k8s.io/...", &o);
    assert!(env.lines().any(|l| l == "EXAMPLE_ACCEL=e2e"), "the annotated CDI device was not applied: {env}");
    Ok(())
}
