//! Faults (issue 6, item 3), on fixture host roots with the real runc:
//! - actk-hook killed with SIGKILL at spread-out points of its injection: the container fails
//!   cleanly (runc reports the hook, no container is left) and no mount is left on the host;
//! - `actk cdi generate` into a full (small tmpfs) or read-only (read-only bind mount) spec
//!   directory: a clear error naming the directory and the cause, and the old spec kept byte for
//!   byte, with no temporary file left;
//! - a device node removed between discovery and the container's start: a clear error naming
//!   the node (actk-runtime with a CDI spec, actk-hook with its edits);
//! - the low-level runtime crashing (SIGSEGV, exit 139): the user sees the runtime's own message
//!   and status, not an actk error;
//! - actk-runtime SIGKILLed at spread-out points of its work: config.json is always the original
//!   or the fully edited file (atomic rename), never half-written;
//! - the hook's state JSON on stdin: any bytes give exit 1 with a message, never a panic.
//!
//! Tests here mount tmpfs and bind mounts in temporary directories, which a [`HostGuard`] of a
//! test running beside them would see: they run one at a time ([`serial`]).
//! With `ACTK_VERIFY_COUNTS=FILE` each test appends `what number` lines for scripts/verify.sh.

use actk_testsupport::engines::{
    self, ActkConfig, Bundle, actk, actk_runtime, bin, expect_success, names, runc, text, unique_name,
};
use actk_testsupport::fixture;
use actk_testsupport::hostcheck::HostGuard;
use anyhow::{Context, Result};
use serde_json::json;
use std::ffi::OsString;
use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, MutexGuard};

fn report(what: &str, n: u64) {
    if let Some(path) = std::env::var_os("ACTK_VERIFY_COUNTS")
        && let Ok(mut f) = fs::OpenOptions::new().create(true).append(true).open(path)
    {
        let _ = writeln!(f, "{what} {n}");
    }
}

/// One fault test at a time (their mounts would show in each other's host snapshots).
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// A mount made by the test, unmounted (lazily, so a busy one cannot stay) on drop.
struct Mounted(PathBuf);

impl Mounted {
    fn tmpfs(dir: &Path, size: &str) -> Result<Mounted> {
        let o = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size},mode=0755"), "actk-faults"])
            .arg(dir)
            .output()?;
        expect_success(&format!("mount tmpfs on {}", dir.display()), &o);
        Ok(Mounted(dir.to_path_buf()))
    }

    /// `dir` bind-mounted on itself, then made read-only.
    fn read_only(dir: &Path) -> Result<Mounted> {
        let o = Command::new("mount").arg("--bind").arg(dir).arg(dir).output()?;
        expect_success("mount --bind", &o);
        let m = Mounted(dir.to_path_buf());
        let o = Command::new("mount").args(["-o", "remount,bind,ro"]).arg(dir).output()?;
        expect_success("mount -o remount,bind,ro", &o);
        Ok(m)
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Every file in `dir`: name -> content.
fn contents(dir: &Path) -> Result<Vec<(String, Vec<u8>)>> {
    let mut v = Vec::new();
    for e in fs::read_dir(dir)? {
        let e = e?;
        v.push((e.file_name().to_string_lossy().into_owned(), fs::read(e.path())?));
    }
    v.sort();
    Ok(v)
}

fn generate(root: &Path, out: &Path) -> std::process::Output {
    let args: Vec<OsString> =
        vec!["cdi".into(), "generate".into(), "--root".into(), root.into(), "--output".into(), out.into()];
    actk(None, &args)
}

/// A spread of delays in microseconds over the hook's run, with jitter from the clock so runs
/// hit different points: from before it reads its state to after it has mounted.
fn kill_points(n: usize, span_us: u64) -> Vec<u64> {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() as u64)
        .unwrap_or(7);
    (0..n as u64)
        .map(|i| {
            let base = span_us * i / n as u64;
            let jitter = (seed.wrapping_mul(6364136223846793005).wrapping_add(i.wrapping_mul(1442695040888963407))
                >> 33)
                % (span_us / n as u64 + 1);
            base + jitter
        })
        .collect()
}

#[test]
fn hook_killed_with_sigkill_during_injection_leaves_no_mount_and_the_container_fails_cleanly() -> Result<()> {
    if !engines::require_root() {
        return Ok(());
    }
    let _serial = serial();
    let Some(fx) = fixture::prepare("nvidia-dgx-h100")? else { return Ok(()) };
    let guard = HostGuard::new("actk-hook killed during injection")?;
    let cfg = ActkConfig::new(&fx.root)?;
    let cfg_path = cfg.write()?;
    let work = tempfile::tempdir()?;
    let killed_log = work.path().join("killed");
    let time_file = work.path().join("hook-us");
    // The hook runs under a wrapper that SIGKILLs it after $1 microseconds, or (`time`) runs it
    // to the end and records how long it took. A kill counts only when the hook died of it
    // (status 137): `kill` also succeeds on a hook that has already exited but is not reaped.
    let wrapper = work.path().join("kill-hook.sh");
    fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nexec 3<&0\nif [ \"$1\" = time ]; then\n  s=$(date +%s%N); '{hook}' prestart <&3; st=$?; e=$(date +%s%N)\n  echo $(( (e - s) / 1000 )) > '{time}'; exit $st\nfi\n'{hook}' prestart <&3 &\npid=$!\nsleep \"$(printf '0.%06d' \"$1\")\"\nkill -KILL \"$pid\" 2>/dev/null\nwait \"$pid\"\nst=$?\n[ \"$st\" = 137 ] && echo \"$1\" >> '{log}'\nexit \"$st\"\n",
            hook = bin("actk-hook").display(),
            time = time_file.display(),
            log = killed_log.display()
        ),
    )?;
    fs::set_permissions(&wrapper, fs::Permissions::from_mode(0o755))?;

    let start_with = |arg: String| -> Result<(std::process::Output, String)> {
        let b = Bundle::busybox(&["ls", "-1", "/dev"], &["NVIDIA_VISIBLE_DEVICES=all"])?;
        let env = format!("ACTK_CONFIG={}", cfg_path.display());
        b.edit(|c| {
            c["hooks"] = json!({"prestart": [{"path": wrapper.to_string_lossy(), "args": ["kill-hook.sh", arg], "env": [env, "PATH=/usr/sbin:/usr/bin:/sbin:/bin"]}]});
        })?;
        let id = unique_name("e2e-fault-kill");
        let o = runc(&["run".as_ref(), "--bundle".as_ref(), b.path().as_os_str(), id.as_ref()]);
        Ok((o, id))
    };
    // How long an undisturbed hook takes here, so that the kill points cover its whole run: the
    // shortest of three runs (the first one, with cold caches, can take several times longer,
    // and kill points spread over that would mostly land after the hook is done).
    let mut hook_us = u64::MAX;
    for _ in 0..3 {
        let (o, _) = start_with("time".into())?;
        let dev = names(&expect_success("runc run with an undisturbed actk-hook", &o));
        assert!(dev.contains("nvidia7"), "the hook did not inject: {dev:?}");
        let us: u64 = fs::read_to_string(&time_file)?.trim().parse().context("hook duration")?;
        hook_us = hook_us.min(us);
    }
    // The kill lands after `sleep` has started (about a millisecond): spread over the run.
    let span = (hook_us * 4 / 5).clamp(5_000, 400_000);
    let points = kill_points(24, span);
    let mut killed = 0u64;
    for us in &points {
        let before = fs::read_to_string(&killed_log).unwrap_or_default().lines().count();
        let (o, id) = start_with(us.to_string())?;
        let was_killed = fs::read_to_string(&killed_log).unwrap_or_default().lines().count() > before;
        let (out, err) = text(&o);
        if was_killed {
            killed += 1;
            assert!(!o.status.success(), "killed at {us} us, the container still ran: {out}");
            assert!(
                err.contains("hook") && (err.contains("signal: killed") || err.contains("exit status 137")),
                "killed at {us} us: runc must name the failed hook: {err}"
            );
        } else {
            let dev = names(&out);
            assert!(
                o.status.success() && dev.contains("nvidia7"),
                "the hook finished before {us} us, so the container must have its devices: {err}"
            );
        }
        // The failed container is gone: runc deleted it.
        let state = runc(&["state", id.as_str()]);
        assert!(
            !state.status.success(),
            "container {id} left after the hook was killed at {us} us: {}",
            text(&state).0
        );
        // No mount of a fixture file (the hook's sources) in the host's mount table.
        let root = fx.root.display().to_string();
        let left: Vec<String> = fs::read_to_string("/proc/self/mountinfo")?
            .lines()
            .filter(|l| l.contains(&root))
            .map(String::from)
            .collect();
        assert!(left.is_empty(), "killed at {us} us: mounts left on the host: {left:?}");
    }
    assert!(
        killed >= points.len() as u64 / 3,
        "only {killed} of {} runs were killed mid-way (span {span} us)",
        points.len()
    );
    eprintln!("actk-hook runs {hook_us} us undisturbed; killed {killed} of {} runs at {points:?} us", points.len());
    report("faults-hook-sigkill", killed);
    guard.finish()
}

/// Generates the DGX spec into `dir`, applies `fault` to it, generates again from a fixture with
/// one GPU fewer (so the new spec differs): the second run must fail naming `dir` and `cause`, and
/// leave exactly the old files.
fn generate_under_fault(fault: impl FnOnce(&Path) -> Result<Option<Mounted>>, cause: &str) -> Result<()> {
    let Some(fx) = fixture::prepare("nvidia-dgx-h100")? else { return Ok(()) };
    let work = tempfile::tempdir()?;
    let dir = work.path().join("cdi");
    fs::create_dir_all(&dir)?;
    let mount = Mounted::tmpfs(&dir, "256k")?;
    expect_success("actk cdi generate (the old spec)", &generate(&fx.root, &dir));
    let old = contents(&dir)?;
    assert!(!old.is_empty());
    // The new spec differs: GPU 7's node is gone.
    fs::remove_file(fx.root.join("dev/nvidia7"))?;
    let fault_mount = fault(&dir)?;
    let o = generate(&fx.root, &dir);
    let (out, err) = text(&o);
    assert!(!o.status.success(), "actk cdi generate succeeded into a faulty dir: {out}{err}");
    assert!(
        err.contains(&dir.display().to_string()) && err.contains(cause),
        "the error must name {} and say {cause:?}: {err}",
        dir.display()
    );
    assert!(!err.contains("panicked"), "{err}");
    drop(fault_mount);
    let filler = dir.join("filler");
    let _ = fs::remove_file(&filler);
    assert_eq!(contents(&dir)?, old, "the old spec must be kept, byte for byte, and no temporary file left");
    drop(mount);
    Ok(())
}

#[test]
fn cdi_generate_into_a_full_spec_dir_fails_clearly_and_keeps_the_old_spec() -> Result<()> {
    if !engines::require_root() {
        return Ok(());
    }
    let _serial = serial();
    let guard = HostGuard::new("actk cdi generate into a full dir")?;
    generate_under_fault(
        |dir| {
            // Fill the tmpfs to the last block.
            let mut f = fs::File::create(dir.join("filler"))?;
            let block = vec![0u8; 4096];
            while f.write_all(&block).is_ok() {}
            let _ = f.sync_all();
            Ok(None)
        },
        "No space left on device",
    )?;
    report("faults-spec-dir-full", 1);
    guard.finish()
}

#[test]
fn cdi_generate_into_a_read_only_spec_dir_fails_clearly_and_keeps_the_old_spec() -> Result<()> {
    if !engines::require_root() {
        return Ok(());
    }
    let _serial = serial();
    let guard = HostGuard::new("actk cdi generate into a read-only dir")?;
    generate_under_fault(|dir| Mounted::read_only(dir).map(Some), "Read-only file system")?;
    report("faults-spec-dir-read-only", 1);
    guard.finish()
}

#[test]
fn device_node_removed_between_discovery_and_start_gives_a_clear_error() -> Result<()> {
    if !engines::require_root() {
        return Ok(());
    }
    let _serial = serial();
    let Some(fx) = fixture::prepare("nvidia-dgx-h100")? else { return Ok(()) };
    let guard = HostGuard::new("device node removed before start")?;
    let cfg = ActkConfig::new(&fx.root)?;
    let cfg_path = cfg.write()?;
    // Discovery: the spec as `actk cdi generate` writes it, then one with only the node paths
    // (CDI lets a spec leave type and numbers to the host node, as nvidia-ctk's specs do).
    expect_success("actk cdi generate", &generate(&fx.root, cfg.spec_dir()));
    let spec_file = cfg.spec_dir().join("nvidia.com-gpu.json");
    let mut spec: serde_json::Value = serde_json::from_str(&fs::read_to_string(&spec_file)?)?;
    for d in spec["devices"].as_array_mut().context("devices")? {
        for n in d["containerEdits"]["deviceNodes"].as_array_mut().into_iter().flatten() {
            let n = n.as_object_mut().context("device node")?;
            for k in ["type", "major", "minor"] {
                n.remove(k);
            }
        }
    }
    fs::write(&spec_file, serde_json::to_string_pretty(&spec)?)?;
    // The GPU falls off the bus: its node goes.
    let gone = fx.root.join("dev/nvidia1");
    fs::remove_file(&gone)?;

    // actk-runtime, asked for that device through the spec.
    let b = Bundle::busybox(&["ls", "/dev"], &["NVIDIA_VISIBLE_DEVICES=1"])?;
    let before = fs::read(b.config_path())?;
    let args: Vec<OsString> =
        vec!["run".into(), "--bundle".into(), b.path().into(), unique_name("e2e-fault-node").into()];
    let o = actk_runtime(&cfg_path, &args);
    let (out, err) = text(&o);
    assert!(!o.status.success(), "the container started without its device: {out}");
    assert!(
        err.contains("/dev/nvidia1") && err.contains(&gone.display().to_string()) && err.contains("No such file"),
        "the error must name the node and the host path: {err}"
    );
    assert!(err.starts_with("actk-runtime: "), "{err}");
    assert_eq!(fs::read(b.config_path())?, before, "config.json must be untouched on failure");

    // actk-runtime without a spec: discovery at the start finds the GPU without its node.
    let no_spec = ActkConfig::new(&fx.root)?;
    let no_spec_path = no_spec.write()?;
    let b = Bundle::busybox(&["ls", "/dev"], &["NVIDIA_VISIBLE_DEVICES=1"])?;
    let args: Vec<OsString> =
        vec!["run".into(), "--bundle".into(), b.path().into(), unique_name("e2e-fault-node").into()];
    let o = actk_runtime(&no_spec_path, &args);
    let (out, err) = text(&o);
    assert!(!o.status.success(), "the container started without the device it asked for: {out}");
    assert!(
        err.contains("NVIDIA_VISIBLE_DEVICES=1") && err.contains("/dev/nvidia1"),
        "the error must name the request and the node: {err}"
    );

    // actk-hook, given edits made before the node went (the `--edits FILE` path of a CDI hook).
    let edits = json!({"deviceNodes": [{"path": "/dev/nvidia1", "hostPath": gone.to_string_lossy()}]});
    let edits_file = cfg.dir().join("edits.json");
    fs::write(&edits_file, edits.to_string())?;
    let b = Bundle::busybox(&["ls", "/dev"], &[])?;
    let env = format!("ACTK_CONFIG={}", cfg_path.display());
    b.edit(|c| {
        c["hooks"] = json!({"prestart": [{"path": bin("actk-hook").to_string_lossy(), "args": ["actk-hook", "prestart", "--edits", edits_file.to_string_lossy()], "env": [env]}]});
    })?;
    let id = unique_name("e2e-fault-node-hook");
    let o = runc(&["run".as_ref(), "--bundle".as_ref(), b.path().as_os_str(), id.as_ref()]);
    let (out, err) = text(&o);
    assert!(!o.status.success(), "the hook injected a node that is gone: {out}");
    assert!(err.contains("nvidia1"), "the error must name the node: {err}");
    assert!(!err.contains("panicked"), "{err}");
    report("faults-device-node-removed", 3);
    guard.finish()
}

#[test]
fn low_level_runtime_crashing_is_reported_with_its_own_message() -> Result<()> {
    if !engines::require_root() {
        return Ok(());
    }
    let _serial = serial();
    let Some(fx) = fixture::prepare("nvidia-dgx-h100")? else { return Ok(()) };
    let guard = HostGuard::new("low-level runtime crash")?;
    let mut faults = 0;
    for (how, script, want_signal, want_code) in
        [("SIGSEGV", "kill -SEGV $$", Some(11), None), ("exit 139", "exit 139", None, Some(139))]
    {
        let mut cfg = ActkConfig::new(&fx.root)?;
        let fake = cfg.dir().join("fake-runc");
        fs::write(&fake, format!("#!/bin/sh\necho \"fake-runc: crashing in $1 ({how})\" >&2\n{script}\n"))?;
        fs::set_permissions(&fake, fs::Permissions::from_mode(0o755))?;
        cfg.runtimes = vec![fake.to_string_lossy().into_owned()];
        let cfg_path = cfg.write()?;
        let b = Bundle::busybox(&["true"], &["NVIDIA_VISIBLE_DEVICES=0"])?;
        let args: Vec<OsString> =
            vec!["create".into(), "--bundle".into(), b.path().into(), unique_name("e2e-fault-crash").into()];
        let o = actk_runtime(&cfg_path, &args);
        let (_, err) = text(&o);
        assert!(
            err.contains(&format!("fake-runc: crashing in create ({how})")),
            "{how}: the runtime's own message must reach the caller: {err}"
        );
        assert!(!err.contains("actk-runtime:"), "{how}: actk must not claim the runtime's failure: {err}");
        // The caller (dockerd's shim, podman) sees the runtime's own status: actk-runtime execs it.
        assert_eq!(o.status.signal(), want_signal, "{how}: {:?}", o.status);
        if let Some(code) = want_code {
            assert_eq!(o.status.code(), Some(code), "{how}: {:?}", o.status);
        }
        // The edits were made before the exec (the runtime got the devices).
        let c = b.config()?;
        assert!(c.to_string().contains("/dev/nvidia0"), "{how}: config.json lacks the device");
        faults += 1;
    }
    report("faults-runtime-crash", faults);
    guard.finish()
}

#[test]
fn actk_runtime_killed_at_random_points_leaves_config_json_whole() -> Result<()> {
    if !engines::require_root() {
        return Ok(());
    }
    let _serial = serial();
    let Some(fx) = fixture::prepare("nvidia-dgx-h100")? else { return Ok(()) };
    let guard = HostGuard::new("actk-runtime killed while editing config.json")?;
    let mut cfg = ActkConfig::new(&fx.root)?;
    // The low-level runtime does nothing: only the shim's own work is under test.
    let fake = cfg.dir().join("fake-runc");
    fs::write(&fake, "#!/bin/sh\nexit 0\n")?;
    fs::set_permissions(&fake, fs::Permissions::from_mode(0o755))?;
    cfg.runtimes = vec![fake.to_string_lossy().into_owned()];
    let cfg_path = cfg.write()?;
    let b = Bundle::busybox(&["true"], &["NVIDIA_VISIBLE_DEVICES=all"])?;
    let original = fs::read(b.config_path())?;
    let shim = |b: &Bundle| {
        Command::new(bin("actk-runtime"))
            .args(["create", "--bundle"])
            .arg(b.path())
            .arg(unique_name("e2e-fault-shim"))
            .env("ACTK_CONFIG", &cfg_path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
    };
    // How long the shim takes undisturbed.
    let start = std::time::Instant::now();
    let st = shim(&b)?.wait()?;
    let full = start.elapsed().as_micros() as u64;
    assert!(st.success(), "actk-runtime create with a fake runtime failed: {st:?}");
    let edited = fs::read(b.config_path())?;
    assert_ne!(edited, original, "the shim did not edit config.json");

    let mut killed = 0u64;
    let mut temp_left = 0usize;
    for us in kill_points(24, full.max(2_000)) {
        fs::write(b.config_path(), &original)?;
        let mut child = shim(&b)?;
        std::thread::sleep(std::time::Duration::from_micros(us));
        let _ = child.kill();
        let st = child.wait()?;
        if st.signal() == Some(9) {
            killed += 1;
        }
        let now = fs::read(b.config_path())?;
        let v: serde_json::Value = serde_json::from_slice(&now)
            .map_err(|e| anyhow::anyhow!("killed at {us} us: config.json is not whole JSON: {e}"))?;
        assert!(
            now == original || now == edited,
            "killed at {us} us: config.json is neither the original nor the edited file: {v}"
        );
        for e in fs::read_dir(b.path())? {
            let name = e?.file_name().to_string_lossy().into_owned();
            if name.starts_with(".config.json.actk-") {
                // SIGKILL leaves no chance to clean up; the bundle goes with the container.
                temp_left += 1;
                fs::remove_file(b.path().join(&name))?;
            }
        }
    }
    eprintln!(
        "actk-runtime runs {full} us; killed {killed} of 24 runs; {temp_left} temporary files left in the bundle"
    );
    assert!(killed > 0, "no run was killed mid-way");
    report("faults-runtime-sigkill", killed);
    guard.finish()
}

#[test]
fn hook_state_on_stdin_any_bytes_exit_1_with_a_message_never_a_panic() -> Result<()> {
    let hook = bin("actk-hook");
    let mut inputs: Vec<Vec<u8>> = vec![
        b"".to_vec(),
        b"{".to_vec(),
        b"null".to_vec(),
        b"[]".to_vec(),
        br#"{"pid": -1, "bundle": "/x"}"#.to_vec(),
        br#"{"pid": 99999999999, "bundle": "/x"}"#.to_vec(),
        br#"{"pid": 1.5, "bundle": "/x"}"#.to_vec(),
        br#"{"pid": 1, "bundle": 7}"#.to_vec(),
        br#"{"pid": 1, "bundle": "relative"}"#.to_vec(),
        br#"{"pid": 1, "bundle": "/nonexistent/bundle"}"#.to_vec(),
        br#"{"pid": 1, "bundle": "/proc/self"}"#.to_vec(),
        vec![0xff; 64],
        vec![b'['; 100_000],
        vec![b' '; 2 << 20],
    ];
    // Pseudo-random bytes and JSON-ish mixtures, deterministic.
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for n in 0..48 {
        let mut v = Vec::new();
        for _ in 0..(n * 7 % 200) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let pieces: [&[u8]; 8] =
                [b"{", b"}", b"\"pid\":", b"\"bundle\":", b"\"/tmp\"", b"42", b",", &[(x >> 24) as u8]];
            v.extend_from_slice(pieces[(x % 8) as usize]);
        }
        inputs.push(v);
    }
    let dir = tempfile::tempdir()?;
    let cfg = dir.path().join("absent.toml");
    for (i, input) in inputs.iter().enumerate() {
        let mut child = Command::new(&hook)
            .arg("prestart")
            .env_clear()
            .env("ACTK_CONFIG", &cfg)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        let mut stdin = child.stdin.take().context("stdin")?;
        let data = input.clone();
        let writer = std::thread::spawn(move || {
            let _ = stdin.write_all(&data);
        });
        let o = child.wait_with_output()?;
        let _ = writer.join();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "input #{i}: {:?}: {err}", o.status);
        assert!(err.starts_with("actk-hook: ") && !err.contains("panicked"), "input #{i}: {err}");
    }
    report("hook-state-inputs", inputs.len() as u64);
    Ok(())
}
