//! Concurrency (issue 6, item 2), with the real engines on fixture host roots:
//! - 32 container starts at once through actk-runtime (runc bundles, and `docker run --runtime`)
//!   and through actk-hook (`docker run --gpus 1` with plain runc): all succeed with their devices;
//! - `actk cdi generate` rewriting the spec in a loop while containers that ask for a CDI name
//!   start and a reader validates every read: never a half-written spec;
//! - `actk runtime configure` racing with itself on one daemon.json: valid JSON with every entry.
//!
//! Every test runs under a [`HostGuard`]: nothing may be left on the host. With
//! `ACTK_VERIFY_COUNTS=FILE`, each test appends `what number` lines for scripts/verify.sh.

use actk_testsupport::engines::{
    self, ActkConfig, Bundle, DockerRuntime, actk, actk_runtime, docker, expect_success, names, text, unique_name,
    with_global_actk_config,
};
use actk_testsupport::fixture;
use actk_testsupport::hostcheck::HostGuard;
use anyhow::{Context, Result, bail};
use serde_json::Value;
use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;

/// Containers started at once in each test.
const AT_ONCE: usize = 32;

/// Appends `what n` to `$ACTK_VERIFY_COUNTS` (scripts/verify.sh prints them).
fn report(what: &str, n: u64) {
    if let Some(path) = std::env::var_os("ACTK_VERIFY_COUNTS") {
        use std::io::Write;
        if let Ok(mut f) = fs::OpenOptions::new().create(true).append(true).open(path) {
            let _ = writeln!(f, "{what} {n}");
        }
    }
}

/// Runs `f(i)` for `0..n` on n threads released together by a barrier; returns the results in
/// order.
fn at_once<T: Send + 'static>(n: usize, f: impl Fn(usize) -> T + Send + Sync + 'static) -> Vec<T> {
    let barrier = Arc::new(Barrier::new(n));
    let f = Arc::new(f);
    let handles: Vec<_> = (0..n)
        .map(|i| {
            let (b, f) = (barrier.clone(), f.clone());
            thread::spawn(move || {
                b.wait();
                f(i)
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().expect("starter thread panicked")).collect()
}

fn run_bundle(cfg: &Path, bundle: &Bundle, id: &str) -> std::process::Output {
    let args: Vec<OsString> = vec!["run".into(), "--bundle".into(), bundle.path().into(), id.into()];
    actk_runtime(cfg, &args)
}

#[test]
fn thirty_two_runc_bundles_start_at_once_through_actk_runtime_each_with_its_gpus() -> Result<()> {
    if !engines::require_root() {
        return Ok(());
    }
    let Some(fx) = fixture::prepare("nvidia-dgx-h100")? else { return Ok(()) };
    let guard = HostGuard::new("32 runc starts through actk-runtime")?;
    let cfg = ActkConfig::new(&fx.root)?;
    let cfg_path = cfg.write()?;
    // Half ask for every GPU (F07: both at the same moment), half for GPU i % 8 alone.
    let bundles: Vec<(Bundle, Vec<String>)> = (0..AT_ONCE)
        .map(|i| {
            let (value, want): (String, Vec<String>) = if i % 2 == 0 {
                ("all".into(), (0..8).map(|g| format!("nvidia{g}")).collect())
            } else {
                ((i % 8).to_string(), vec![format!("nvidia{}", i % 8)])
            };
            let env = format!("NVIDIA_VISIBLE_DEVICES={value}");
            Ok((Bundle::busybox(&["ls", "-1", "/dev"], &[env.as_str()])?, want))
        })
        .collect::<Result<_>>()?;
    let bundles = Arc::new(bundles);
    let cfg_path = Arc::new(cfg_path);
    let b2 = bundles.clone();
    let outputs = at_once(AT_ONCE, move |i| run_bundle(&cfg_path, &b2[i].0, &unique_name("e2e-conc-runc")));
    for (i, o) in outputs.iter().enumerate() {
        let dev = names(&expect_success(&format!("container #{i} of {AT_ONCE} started at once"), o));
        let gpus: Vec<&String> =
            dev.iter().filter(|n| n.strip_prefix("nvidia").is_some_and(|d| d.parse::<u32>().is_ok())).collect();
        let want = &bundles[i].1;
        assert_eq!(gpus, want.iter().collect::<Vec<_>>(), "container #{i}: /dev has {dev:?}");
        assert!(dev.contains("nvidiactl"), "container #{i}: no nvidiactl in {dev:?}");
    }
    report("containers-at-once-runc-actk-runtime", AT_ONCE as u64);
    guard.finish()
}

#[test]
fn thirty_two_docker_runs_at_once_with_runtime_actk_all_start() -> Result<()> {
    if !engines::require_root_and_engines() {
        return Ok(());
    }
    let Some(fx) = fixture::prepare("nvidia-dgx-h100")? else { return Ok(()) };
    let image = engines::docker_busybox_image()?;
    let guard = HostGuard::new("32 docker runs with --runtime actk")?;
    let cfg = ActkConfig::new(&fx.root)?;
    let rt = DockerRuntime::register(&cfg.write_wrapper()?)?;
    let runtime = rt.name.clone();
    let outputs = at_once(AT_ONCE, move |i| {
        let name = unique_name("e2e-conc-docker");
        let gpu = format!("NVIDIA_VISIBLE_DEVICES={}", i % 8);
        docker(&[
            "run",
            "--rm",
            "--network",
            "none",
            "--name",
            &name,
            "--runtime",
            &runtime,
            "-e",
            &gpu,
            image,
            "ls",
            "-1",
            "/dev",
        ])
    });
    for (i, o) in outputs.iter().enumerate() {
        let dev = names(&expect_success(&format!("docker run --runtime actk #{i} of {AT_ONCE}"), o));
        assert!(dev.contains(&format!("nvidia{}", i % 8)) && dev.contains("nvidiactl"), "#{i}: {dev:?}");
    }
    drop(rt);
    report("containers-at-once-docker-runtime", AT_ONCE as u64);
    guard.finish()
}

#[test]
fn thirty_two_docker_runs_at_once_with_gpus_through_actk_hook_all_start() -> Result<()> {
    if !engines::require_root_and_engines() {
        return Ok(());
    }
    let Some(fx) = fixture::prepare("nvidia-dgx-h100")? else { return Ok(()) };
    let image = engines::docker_busybox_image()?;
    let guard = HostGuard::new("32 docker runs with --gpus 1")?;
    let cfg = ActkConfig::new(&fx.root)?;
    let outputs = with_global_actk_config(&cfg, || {
        Ok(at_once(AT_ONCE, move |_| {
            docker(&[
                "run",
                "--rm",
                "--network",
                "none",
                "--gpus",
                "1",
                image,
                "ls",
                "-1",
                "/dev",
                "/usr/lib/x86_64-linux-gnu",
            ])
        }))
    })?;
    for (i, o) in outputs.iter().enumerate() {
        let (_, err) = text(o);
        assert!(
            !err.contains("could not select device driver"),
            "dockerd has no --gpus driver (run scripts/start-dockerd.sh): {err}"
        );
        let out = expect_success(&format!("docker run --gpus 1 #{i} of {AT_ONCE}"), o);
        let listed = names(&out);
        assert!(listed.contains("nvidia0") && !listed.contains("nvidia1"), "#{i}: {listed:?}");
        assert!(listed.contains("libcuda.so.1"), "#{i}: libcuda.so.1 not mounted: {listed:?}");
    }
    // No mount of a fixture file may remain on the host (the hook mounts inside containers only).
    let root = fx.root.display().to_string();
    let left: Vec<String> =
        fs::read_to_string("/proc/self/mountinfo")?.lines().filter(|l| l.contains(&root)).map(String::from).collect();
    assert!(left.is_empty(), "mounts of the fixture left on the host: {left:?}");
    report("containers-at-once-docker-gpus-hook", AT_ONCE as u64);
    guard.finish()
}

/// What a reader sees in a spec file: a whole spec (JSON object with cdiVersion, kind and at
/// least one device) or the problem.
fn whole_spec(path: &Path) -> Result<(), String> {
    let text = fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let v: Value = serde_json::from_str(&text)
        .map_err(|e| format!("{}: half-written? {e} ({} bytes)", path.display(), text.len()))?;
    let ok =
        v["cdiVersion"].is_string() && v["kind"].is_string() && v["devices"].as_array().is_some_and(|d| !d.is_empty());
    if ok { Ok(()) } else { Err(format!("{}: not a whole spec: {text}", path.display())) }
}

#[test]
fn cdi_spec_regenerated_in_a_loop_is_never_half_written_while_containers_start() -> Result<()> {
    if !engines::require_root() {
        return Ok(());
    }
    let Some(fx) = fixture::prepare("nvidia-dgx-h100")? else { return Ok(()) };
    let guard = HostGuard::new("CDI spec regeneration while containers start")?;
    let cfg = ActkConfig::new(&fx.root)?;
    let cfg_path = cfg.write()?;
    let spec_dir = cfg.spec_dir().to_path_buf();
    let generate = |dir: &Path| {
        let args: Vec<OsString> = vec![
            "cdi".into(),
            "generate".into(),
            "--root".into(),
            fx.root.clone().into(),
            "--output".into(),
            dir.into(),
        ];
        actk(None, &args)
    };
    expect_success("actk cdi generate (first)", &generate(&spec_dir));
    let spec_file = spec_dir.join("nvidia.com-gpu.json");
    whole_spec(&spec_file).map_err(anyhow::Error::msg)?;

    let done = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicU64::new(0));
    // Reader: every read of every file in the spec directory must be a whole spec.
    let reader = {
        let (done, reads, dir) = (done.clone(), reads.clone(), spec_dir.clone());
        thread::spawn(move || -> Result<(), String> {
            while !done.load(Ordering::Relaxed) {
                let entries = fs::read_dir(&dir).map_err(|e| e.to_string())?;
                for e in entries.flatten() {
                    let p = e.path();
                    if p.extension().is_some_and(|x| x == "json" || x == "yaml") {
                        whole_spec(&p)?;
                        reads.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            Ok(())
        })
    };
    // Containers asking for a CDI name resolved through that directory, while it is rewritten.
    let starter = {
        let (cfg_path, done) = (cfg_path.clone(), done.clone());
        thread::spawn(move || -> Result<u64> {
            let mut started = 0;
            for i in 0..12 {
                let gpu = i % 8;
                let env = format!("NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu={gpu}");
                let b = Bundle::busybox(&["ls", "-1", "/dev"], &[env.as_str()])?;
                let o = run_bundle(&cfg_path, &b, &unique_name("e2e-conc-cdi"));
                let dev = names(&expect_success(
                    &format!("container #{i} asking nvidia.com/gpu={gpu} during regeneration"),
                    &o,
                ));
                if !dev.contains(&format!("nvidia{gpu}")) {
                    bail!("container #{i}: /dev/nvidia{gpu} missing: {dev:?}");
                }
                started += 1;
            }
            done.store(true, Ordering::Relaxed);
            Ok(started)
        })
    };
    let mut generations = 0u64;
    while !done.load(Ordering::Relaxed) {
        expect_success("actk cdi generate (loop)", &generate(&spec_dir));
        generations += 1;
    }
    let started = starter.join().expect("starter thread").context("starting containers during regeneration")?;
    reader.join().expect("reader thread").map_err(|e| anyhow::anyhow!("a reader saw a broken spec: {e}"))?;
    let reads = reads.load(Ordering::Relaxed);
    assert!(generations >= 2 && reads > 0, "the loop did not overlap: {generations} generations, {reads} reads");
    // No temporary file of the atomic writes is left behind.
    let left: Vec<PathBuf> = fs::read_dir(&spec_dir)?.flatten().map(|e| e.path()).filter(|p| p != &spec_file).collect();
    assert!(left.is_empty(), "files left in the spec dir: {left:?}");
    report("cdi-regenerations-during-starts", generations);
    report("cdi-spec-reads-validated", reads);
    report("containers-started-during-regeneration", started);
    guard.finish()
}

#[test]
fn runtime_configure_racing_with_itself_leaves_valid_daemon_json_with_every_entry() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let daemon = dir.path().join("daemon.json");
    let original = r#"{"log-driver": "json-file", "log-opts": {"max-size": "10m"}, "runtimes": {"other": {"path": "/usr/bin/other"}}}"#;
    let runtime_bin = engines::bin("actk-runtime");
    for round in 0..3 {
        fs::write(&daemon, original)?;
        let _ = fs::remove_file(dir.path().join("daemon.json.bak"));
        // Half the racers register the same name, the others each their own.
        let (d, bin) = (daemon.clone(), runtime_bin.clone());
        let outputs = at_once(16, move |i| {
            let name = if i % 2 == 0 { "actk".to_string() } else { format!("actk-{i}") };
            let args: Vec<OsString> = vec![
                "runtime".into(),
                "configure".into(),
                "--runtime".into(),
                "docker".into(),
                "--config".into(),
                d.clone().into(),
                "--name".into(),
                name.into(),
                "--path".into(),
                bin.clone().into(),
            ];
            actk(None, &args)
        });
        for (i, o) in outputs.iter().enumerate() {
            expect_success(&format!("round {round}: racing actk runtime configure #{i}"), o);
        }
        let text = fs::read_to_string(&daemon)?;
        let v: Value = serde_json::from_str(&text)
            .with_context(|| format!("round {round}: daemon.json is not JSON after the race:\n{text}"))?;
        assert_eq!(v["log-opts"]["max-size"], "10m", "round {round}: {text}");
        assert_eq!(v["runtimes"]["other"]["path"], "/usr/bin/other", "round {round}: {text}");
        let mut missing = Vec::new();
        for i in 0..16 {
            let name = if i % 2 == 0 { "actk".to_string() } else { format!("actk-{i}") };
            if v["runtimes"][&name]["path"] != runtime_bin.to_string_lossy().as_ref() {
                missing.push(name);
            }
        }
        assert!(missing.is_empty(), "round {round}: racing configures lost the entries {missing:?}:\n{text}");
        // The backup is the file as it was before any racer wrote it.
        let bak = fs::read_to_string(dir.path().join("daemon.json.bak"))?;
        assert_eq!(bak, original, "round {round}: daemon.json.bak is not the original");
        let left: Vec<_> = fs::read_dir(dir.path())?
            .flatten()
            .map(|e| e.file_name())
            .filter(|n| n.to_string_lossy().starts_with('.'))
            .collect();
        assert!(left.is_empty(), "round {round}: temporary files left: {left:?}");
    }
    report("runtime-configure-racers", 48);
    Ok(())
}
