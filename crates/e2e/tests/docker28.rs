//! Docker 28.5 (Debian forky, started on its own socket and state beside the system's dockerd
//! 20.10) with its native CDI (issue 14):
//! - `actk runtime configure --runtime docker --cdi-only` turns CDI on in a daemon.json that
//!   dockerd 28 then starts with; `docker run --device nvidia.com/gpu=1` with the spec `actk cdi
//!   generate` wrote gives exactly that GPU, its control nodes and the driver libraries, and
//!   `docker info` lists the spec's device names (indexes, UUIDs and `all`);
//! - what Docker 28 does with `--gpus` when CDI is on: it still uses its NVIDIA device driver,
//!   which exists only when dockerd found `nvidia-container-runtime-hook` on its PATH at start
//!   and sets NVIDIA_VISIBLE_DEVICES plus a prestart hook; it does not turn `--gpus` into CDI
//!   names. With actk-hook installed under that name `--gpus device=2` gives GPU 2 with CDI on;
//!   without it dockerd refuses `--gpus` ("could not select device driver"), and the CDI names of
//!   actk's specs (`nvidia.com/gpu=all`, indexes, UUIDs) are the way in.

use actk_testsupport::engines::{self, ActkConfig, Docker28, bin, expect_success, text};
use actk_testsupport::fixture;
use anyhow::Result;
use std::fs;

const IMAGE: &str = "actk-busybox:28";
const PROBE: &str = "ls /dev; echo ---; grep -o '[^ ]*libcuda[^ ]*' /proc/self/mountinfo | sort -u; echo ---; env | grep ^NVIDIA_ | sort";

fn nvidia_nodes(out: &str) -> Vec<&str> {
    out.split("---")
        .next()
        .unwrap_or_default()
        .lines()
        .filter(|d| d.starts_with("nvidia") && !d.starts_with("nvidia-"))
        .collect()
}

/// The spec of the DGX fixture as `actk cdi generate` writes it, in `cfg`'s spec dir.
fn generate_spec(cfg: &ActkConfig, root: &std::path::Path) -> Result<()> {
    let config = cfg.write()?;
    let o = engines::actk(
        Some(&config),
        &[
            "cdi",
            "generate",
            "--root",
            root.to_str().unwrap_or_default(),
            "--vendor",
            "nvidia",
            "--ldcache-hook",
            "none",
        ],
    );
    fs::write(cfg.spec_dir().join("nvidia.com-gpu.json"), expect_success("actk cdi generate", &o))?;
    Ok(())
}

#[test]
fn docker_28_runs_cdi_devices_of_actk_specs_after_runtime_configure_turned_cdi_on() -> Result<()> {
    let Some(fx) = fixture::prepare("nvidia-dgx-h100")? else { return Ok(()) };
    let cfg = ActkConfig::new(&fx.root)?;
    generate_spec(&cfg, &fx.root)?;
    let daemon_json = cfg.dir().join("daemon.json");
    fs::write(&daemon_json, "{\n  \"log-level\": \"info\"\n}\n")?;
    let spec_dir = cfg.spec_dir().to_str().unwrap_or_default().to_string();
    let o = engines::actk(
        None,
        &[
            "runtime",
            "configure",
            "--runtime",
            "docker",
            "--config",
            daemon_json.to_str().unwrap_or_default(),
            "--cdi-only",
            "--cdi-spec-dirs",
            &spec_dir,
        ],
    );
    expect_success("actk runtime configure --cdi-only", &o);
    let written: serde_json::Value = serde_json::from_str(&fs::read_to_string(&daemon_json)?)?;
    assert_eq!(written["features"]["cdi"], true, "{written}");
    assert_eq!(written["log-level"], "info", "other keys kept: {written}");
    let Some(d) = Docker28::start(written, None, &[])? else { return Ok(()) };
    d.import_busybox(IMAGE)?;

    let info = expect_success("docker info", &d.docker(&["info"]));
    for name in ["nvidia.com/gpu=1", "nvidia.com/gpu=all", "nvidia.com/gpu=GPU-"] {
        assert!(info.contains(name), "docker info lists {name}:\n{info}");
    }
    let o = d.docker(&["run", "--rm", "--network", "none", "--device", "nvidia.com/gpu=1", IMAGE, "sh", "-c", PROBE]);
    let out = expect_success("docker run --device nvidia.com/gpu=1", &o);
    assert_eq!(nvidia_nodes(&out), ["nvidia1", "nvidiactl"], "{out}");
    assert!(out.split("---").nth(1).is_some_and(|l| l.contains("libcuda")), "driver libraries mounted: {out}");

    // Without nvidia-container-runtime-hook on its PATH, dockerd 28 offers no --gpus, CDI or not.
    let (_, err) = text(&d.docker(&["run", "--rm", "--network", "none", "--gpus", "all", IMAGE, "true"]));
    assert!(err.contains("could not select device driver"), "{err}");
    Ok(())
}

#[test]
fn docker_28_gpus_flag_is_served_by_actk_hook_with_cdi_on() -> Result<()> {
    let Some(fx) = fixture::prepare("nvidia-dgx-h100")? else { return Ok(()) };
    let cfg = ActkConfig::new(&fx.root)?;
    generate_spec(&cfg, &fx.root)?;
    let config = cfg.write()?;
    // dockerd finds the hook by this name on its PATH; the hook gets dockerd's environment.
    let hooks = tempfile::tempdir()?;
    std::os::unix::fs::symlink(bin("actk-hook"), hooks.path().join("nvidia-container-runtime-hook"))?;
    let daemon = serde_json::json!({"features": {"cdi": true}, "cdi-spec-dirs": [cfg.spec_dir()]});
    let Some(d) = Docker28::start(daemon, Some(hooks.path()), &[("ACTK_CONFIG", config.as_os_str())])? else {
        return Ok(());
    };
    d.import_busybox(IMAGE)?;
    let o = d.docker(&["run", "--rm", "--network", "none", "--gpus", "device=2", IMAGE, "sh", "-c", PROBE]);
    let out = expect_success("docker run --gpus device=2", &o);
    assert_eq!(nvidia_nodes(&out), ["nvidia2", "nvidiactl"], "{out}\n{}", d.log());
    assert!(out.contains("NVIDIA_VISIBLE_DEVICES=2"), "dockerd's NVIDIA driver set the variable: {out}");
    // --gpus and a CDI name together: each device once.
    let o = d.docker(&[
        "run",
        "--rm",
        "--network",
        "none",
        "--gpus",
        "device=2",
        "--device",
        "nvidia.com/gpu=3",
        IMAGE,
        "sh",
        "-c",
        PROBE,
    ]);
    let out = expect_success("docker run --gpus device=2 --device nvidia.com/gpu=3", &o);
    assert_eq!(nvidia_nodes(&out), ["nvidia2", "nvidia3", "nvidiactl"], "{out}");
    Ok(())
}
