//! `docker run --runtime actk ...` with the real dockerd 20.10 (issue 3, item 4), on fixture
//! host roots.
//!
//! How a test's actk config reaches the runtime: dockerd starts runtimes through containerd's
//! runc shim with dockerd's own environment, so `ACTK_CONFIG` cannot be passed per container.
//! - The test of the default name `actk` installs its config as /etc/actk/config.toml (where a
//!   user's config lives), serialised with every other test touching that file, and restores it.
//! - The other tests register a wrapper script (`ACTK_CONFIG=... exec actk-runtime "$@"`) under a
//!   unique runtime name with `actk runtime configure --runtime docker --name N --path WRAPPER`
//!   ([`DockerRuntime`]), so they run in parallel; `--remove` takes the entry out again.
//!
//! Every change of /etc/docker/daemon.json holds one lock and is followed by SIGHUP.

use actk_testsupport::engines::{
    self, ActkConfig, DAEMON_JSON, DockerRuntime, FileRestore, actk, docker, expect_success, names, text, unique_name,
};
use actk_testsupport::fixture;
use anyhow::{Context, Result};
use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::path::Path;
use std::sync::{Arc, Barrier};

/// `docker run --rm --network none --runtime RUNTIME -e ENV... actk-busybox ls -1 /dev`;
/// returns the names in the container's /dev.
fn ls_dev(runtime: &str, env: &[&str]) -> Result<BTreeSet<String>> {
    let image = engines::docker_busybox_image()?;
    let name = unique_name("e2e-docker");
    let mut args = vec!["run", "--rm", "--network", "none", "--name", &name, "--runtime", runtime];
    for e in env {
        args.extend(["-e", e]);
    }
    args.extend([image, "ls", "-1", "/dev"]);
    let o = docker(&args);
    Ok(names(&expect_success(&format!("docker {}", args.join(" ")), &o)))
}

/// The accelerator nodes among /dev names: nvidia*, neuron*.
fn accel(dev: &BTreeSet<String>) -> BTreeSet<&str> {
    dev.iter().map(String::as_str).filter(|n| n.starts_with("nvidia") || n.starts_with("neuron")).collect()
}

fn hetero() -> Result<Option<fixture::Fixture>> {
    fixture::prepare("hetero-nvidia-neuron")
}

#[test]
fn actk_runtime_configure_registers_actk_and_docker_run_runtime_actk_sees_gpus_0_and_1() -> Result<()> {
    if !engines::require_root_and_engines() {
        return Ok(());
    }
    let Some(fx) = hetero()? else { return Ok(()) };
    let cfg = ActkConfig::new(&fx.root)?;
    let runtime_bin = engines::bin("actk-runtime");
    let dev = engines::with_lock_at(&engines::daemon_json_lock(), || {
        let saved = FileRestore::save(Path::new(DAEMON_JSON));
        let result = engines::with_global_actk_config(&cfg, || {
            let args = ["runtime", "configure", "--runtime", "docker", "--path"].map(OsStr::new);
            let o = actk(None, &[&args[..], &[runtime_bin.as_os_str()]].concat());
            expect_success("actk runtime configure --runtime docker", &o);
            let daemon: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(DAEMON_JSON)?)
                .with_context(|| format!("{DAEMON_JSON} is not JSON after actk runtime configure"))?;
            assert_eq!(
                daemon["runtimes"]["actk"]["path"].as_str(),
                Some(runtime_bin.to_str().unwrap_or_default()),
                "daemon.json after configure: {daemon:#}"
            );
            engines::reload_dockerd()?;
            engines::wait_for_docker_runtime("actk", true)?;
            ls_dev("actk", &["NVIDIA_VISIBLE_DEVICES=0,1"])
        });
        drop(saved);
        engines::reload_dockerd()?;
        result
    })?;
    let got = accel(&dev);
    for want in ["nvidia0", "nvidia1", "nvidiactl"] {
        assert!(got.contains(want), "/dev/{want} missing with NVIDIA_VISIBLE_DEVICES=0,1: {dev:?}");
    }
    assert!(!got.iter().any(|n| n.starts_with("neuron")), "Neuron devices were not asked for: {got:?}");
    Ok(())
}

#[test]
fn docker_run_aws_neuron_visible_devices_0_1_sees_neuron0_and_neuron1_only() -> Result<()> {
    if !engines::require_root_and_engines() {
        return Ok(());
    }
    let Some(fx) = hetero()? else { return Ok(()) };
    let cfg = ActkConfig::new(&fx.root)?;
    let rt = DockerRuntime::register(&cfg.write_wrapper()?)?;
    let dev = ls_dev(&rt.name, &["AWS_NEURON_VISIBLE_DEVICES=0-1"])?;
    let got = accel(&dev);
    assert_eq!(got, BTreeSet::from(["neuron0", "neuron1"]), "AWS_NEURON_VISIBLE_DEVICES=0-1: {dev:?}");
    Ok(())
}

#[test]
fn docker_run_asking_nvidia_and_neuron_at_once_on_heterogeneous_node_sees_both() -> Result<()> {
    if !engines::require_root_and_engines() {
        return Ok(());
    }
    let Some(fx) = hetero()? else { return Ok(()) };
    let cfg = ActkConfig::new(&fx.root)?;
    let rt = DockerRuntime::register(&cfg.write_wrapper()?)?;
    let dev = ls_dev(&rt.name, &["NVIDIA_VISIBLE_DEVICES=1", "AWS_NEURON_VISIBLE_DEVICES=0"])?;
    let got = accel(&dev);
    // GPU index 1 is the second in PCI bus order; on this fixture its node is /dev/nvidia0.
    let gpus = engines::fixture_gpus(&fx.root);
    let (second, first) = (gpus[1].node(), gpus[0].node());
    for want in [second.as_str(), "nvidiactl", "neuron0"] {
        assert!(got.contains(want), "/dev/{want} missing: {dev:?}");
    }
    for unwanted in [first.as_str(), "neuron1"] {
        assert!(!got.contains(unwanted), "/dev/{unwanted} was not asked for: {dev:?}");
    }
    Ok(())
}

#[test]
fn docker_run_unknown_gpu_7_fails_and_shows_actks_message_naming_the_variable_and_existing_gpus() -> Result<()> {
    if !engines::require_root_and_engines() {
        return Ok(());
    }
    let Some(fx) = hetero()? else { return Ok(()) };
    let cfg = ActkConfig::new(&fx.root)?;
    let rt = DockerRuntime::register(&cfg.write_wrapper()?)?;
    let image = engines::docker_busybox_image()?;
    let name = unique_name("e2e-docker-bad");
    let o = docker(&[
        "run",
        "--rm",
        "--network",
        "none",
        "--name",
        &name,
        "--runtime",
        &rt.name,
        "-e",
        "NVIDIA_VISIBLE_DEVICES=7",
        image,
        "echo",
        "container-ran",
    ]);
    let (out, err) = text(&o);
    assert!(!o.status.success(), "docker run must fail for a GPU that does not exist:\n{out}\n{err}");
    assert!(!out.contains("container-ran"), "the container ran: {out}");
    engines::assert_names_unknown_device(&err, "NVIDIA_VISIBLE_DEVICES", "7", &fx.root);
    let _ = docker(&["rm", "-f", &name]);
    Ok(())
}

#[test]
fn two_containers_started_at_the_same_moment_asking_for_all_devices_both_get_all_devices_f07() -> Result<()> {
    if !engines::require_root_and_engines() {
        return Ok(());
    }
    let Some(fx) = hetero()? else { return Ok(()) };
    let cfg = ActkConfig::new(&fx.root)?;
    let rt = DockerRuntime::register(&cfg.write_wrapper()?)?;
    engines::docker_busybox_image()?;
    let barrier = Arc::new(Barrier::new(2));
    let runs: Vec<_> = (0..2)
        .map(|_| {
            let barrier = barrier.clone();
            let runtime = rt.name.clone();
            std::thread::spawn(move || {
                barrier.wait();
                ls_dev(&runtime, &["NVIDIA_VISIBLE_DEVICES=all", "AWS_NEURON_VISIBLE_DEVICES=ALL"])
            })
        })
        .collect();
    for (i, r) in runs.into_iter().enumerate() {
        let dev = r.join().expect("docker run thread panicked")?;
        let got = accel(&dev);
        for want in ["nvidia0", "nvidia1", "nvidiactl", "neuron0", "neuron1"] {
            assert!(got.contains(want), "container {i}: /dev/{want} missing: {dev:?}");
        }
    }
    Ok(())
}
