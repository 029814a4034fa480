//! Container images, OCI bundles and the real engines (runc, dockerd, podman) for end-to-end tests.
//!
//! One module per engine or concern (as the CLI has one file per subcommand), all re-exported
//! here: `images`, `bundle` (runc bundles), `docker`, `podman`, `config` (actk config files),
//! `assert`; paths, locks, requirement checks and the command runners are in this file.
//!
//! What lives here and why:
//! - [`busybox_rootfs`]: a tiny rootfs made of the host's static busybox (ENVIRONMENT.md), built
//!   once per target directory under `target/actk-e2e/` and imported once as
//!   [`BUSYBOX_IMAGE`] into docker and podman ([`docker_busybox_image`], [`podman_busybox_image`]).
//! - [`glibc_rootfs`]: a Debian bookworm minbase rootfs from debootstrap (slow, cached), for tests
//!   that need `ldconfig`.
//! - [`Bundle`]: an OCI bundle (`runc spec`, then edited) over a private copy of the busybox rootfs.
//! - [`docker`], [`podman`], [`runc`], [`actk_runtime`]: run a command with a time limit.
//! - [`DockerRuntime`]: registers actk-runtime with dockerd under a unique name for one test,
//!   through `actk runtime configure --runtime docker`, and removes it again on drop.
//! - [`Containerd2`], [`Docker28`] (module `forky`): containerd 2.1 and Docker 28.5 from Debian
//!   forky, each started by a test on its own sockets beside the system's dockerd 20.10.
//! - [`require_root`], [`require_root_and_engines`]: skip (or, under `CI=true` or `ACTK_E2E_STRICT=1`, fail) when the
//!   machine cannot run the tests.
//!
//! Everything that is shared between tests running in parallel (the cached rootfs, the imported
//! images, /etc/docker/daemon.json) is guarded by a file lock (`flock(2)` through
//! [`std::fs::File::lock`]), which also excludes threads of the same process since each caller
//! opens its own file description.

use anyhow::{Context, Result};
use std::ffi::OsStr;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

mod assert;
mod bundle;
mod config;
mod docker;
mod forky;
mod images;
mod podman;

pub use assert::*;
pub use bundle::*;
pub use config::*;
pub use docker::*;
pub use forky::*;
pub use images::*;
pub use podman::*;

/// Name under which the busybox rootfs is imported into docker and podman.
pub const BUSYBOX_IMAGE: &str = "actk-busybox:latest";

/// Name under which the glibc (Debian bookworm minbase) rootfs is imported.
pub const GLIBC_IMAGE: &str = "actk-glibc:latest";

/// Time limit for one engine command, in seconds; a hung engine fails the test instead of CI.
pub const COMMAND_TIMEOUT_S: u32 = 180;

/// The workspace root (the directory holding the root Cargo.toml).
pub fn workspace_root() -> PathBuf {
    // This crate lives in <root>/crates/actk-testsupport.
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap_or_else(|_| Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."))
}

/// Cargo's target directory: `$CARGO_TARGET_DIR` (relative to the workspace root when relative),
/// else `<workspace>/target`.
pub fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(d) if !d.is_empty() => {
            let d = PathBuf::from(d);
            if d.is_absolute() { d } else { workspace_root().join(d) }
        }
        _ => workspace_root().join("target"),
    }
}

/// A binary of this workspace (`actk`, `actk-runtime`, `actk-hook`), built by
/// `cargo build --workspace --bins` (the Makefile's `test` target does that before testing).
///
/// Looks next to the running test executable first (`target/<profile>/deps/..`, so the same
/// profile is used), then in `target/debug`.
///
/// Panics with the command to run when the binary is not built: a test cannot go on without it.
pub fn bin(name: &str) -> PathBuf {
    let mut candidates = Vec::new();
    if let Ok(exe) = std::env::current_exe() {
        // target/<profile>/deps/<test>-<hash> -> target/<profile>/<name>
        if let Some(profile_dir) = exe.parent().and_then(Path::parent) {
            candidates.push(profile_dir.join(name));
        }
    }
    candidates.push(target_dir().join("debug").join(name));
    for c in &candidates {
        if c.is_file() {
            warn_if_stale(c);
            return c.clone();
        }
    }
    panic!(
        "binary {name} not found (looked at {candidates:?}); build it first with \
         `cargo build --workspace --bins` (`make test` does this)"
    );
}

/// Print a warning (shown with a failing test's output) when a product source file under
/// crates/*/src is newer than the binary `exe`: `cargo test` does not rebuild other crates'
/// binaries, so a test may be exercising yesterday's code.
fn warn_if_stale(exe: &Path) {
    fn newest(dir: &Path, best: &mut Option<(std::time::SystemTime, PathBuf)>) {
        let Ok(rd) = fs::read_dir(dir) else { return };
        for e in rd.flatten() {
            let p = e.path();
            let Ok(m) = e.metadata() else { continue };
            if m.is_dir() {
                newest(&p, best);
            } else if let Ok(t) = m.modified()
                && best.as_ref().is_none_or(|(b, _)| t > *b)
            {
                *best = Some((t, p));
            }
        }
    }
    let Ok(built) = fs::metadata(exe).and_then(|m| m.modified()) else { return };
    let mut best = None;
    if let Ok(rd) = fs::read_dir(workspace_root().join("crates")) {
        for e in rd.flatten() {
            let name = e.file_name();
            // Test-only crates do not go into the binaries.
            if name != "actk-testsupport" && name != "e2e" {
                newest(&e.path().join("src"), &mut best);
            }
        }
    }
    if let Some((t, src)) = best
        && t > built
    {
        eprintln!(
            "warning: {} is older than {}; run `cargo build --workspace --bins` (make test does)",
            exe.display(),
            src.display()
        );
    }
}

/// The directory that caches rootfs trees and lock files between test runs: `target/actk-e2e`.
pub fn cache_dir() -> PathBuf {
    let d = target_dir().join("actk-e2e");
    let _ = fs::create_dir_all(&d);
    d
}

/// Run `f` while holding an exclusive `flock` on `<cache_dir>/<name>.lock` (a resource of this
/// checkout's target dir, such as a cached rootfs).
pub fn with_lock<T>(name: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    with_lock_at(&cache_dir().join(format!("{name}.lock")), f)
}

/// The lock file guarding a resource of the whole machine (`/var/run/cdi`, daemon.json):
/// `/run/lock/actk-e2e-<name>.lock`, shared by every checkout and worktree that runs tests here.
pub fn machine_lock_path(name: &str) -> PathBuf {
    PathBuf::from(format!("/run/lock/actk-e2e-{name}.lock"))
}

/// Run `f` while holding an exclusive `flock` on the file `lock` (created if absent).
pub fn with_lock_at<T>(lock: &Path, f: impl FnOnce() -> Result<T>) -> Result<T> {
    if let Some(dir) = lock.parent() {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(lock)
        .with_context(|| format!("opening lock file {}", lock.display()))?;
    file.lock().with_context(|| format!("locking {}", lock.display()))?;
    let r = f();
    let _ = file.unlock();
    r
}

/// A name unique to this process and call, for containers, runtimes and CDI spec files:
/// `<prefix>-<pid>-<counter>`.
pub fn unique_name(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!("{prefix}-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))
}

/// True when the current process runs as root (owner of /proc/self is the effective uid).
pub fn is_root() -> bool {
    fs::metadata("/proc/self").map(|m| m.uid() == 0).unwrap_or(false)
}

/// True when a test must fail rather than skip: under CI (`CI=true`) and under `make test`
/// (`ACTK_E2E_STRICT=1`), so the README's test command never passes by skipping.
fn under_ci() -> bool {
    let set = |k: &str| std::env::var(k).map(|v| v == "true" || v == "1").unwrap_or(false);
    set("CI") || set("ACTK_E2E_STRICT")
}

/// Says why a test cannot run and returns false (the test then returns early), or panics under
/// `CI=true` / `ACTK_E2E_STRICT=1`. `test_needs`: what to do about it, as a sentence.
pub fn skip_or_fail(test_needs: &str, why: &str) -> bool {
    if under_ci() {
        panic!(
            "CI=true or ACTK_E2E_STRICT=1, but this machine cannot run the end-to-end tests: {why}. \
             {test_needs} (`make test` installs the packages and starts dockerd)"
        );
    }
    eprintln!("skipping: {why}. {test_needs}");
    false
}

/// True when the machine can run runc tests: root, and `runc` on PATH.
///
/// Otherwise prints `skipping: ...` and returns false, or panics under `CI=true` or
/// `ACTK_E2E_STRICT=1` (CI and `make test` must not pass by skipping).
pub fn require_root() -> bool {
    if !is_root() {
        return skip_or_fail("Run the tests as root.", "not running as root (mknod, runc need it)");
    }
    if which("runc").is_none() {
        return skip_or_fail("Run scripts/install-deps.sh.", "runc is not on PATH");
    }
    true
}

/// True when the machine can run the engine tests: root, runc and podman on PATH and dockerd
/// answering `docker info`.
///
/// Otherwise prints `skipping: ...` and returns false, or panics under `CI=true` or
/// `ACTK_E2E_STRICT=1`.
pub fn require_root_and_engines() -> bool {
    if !require_root() {
        return false;
    }
    for tool in ["docker", "podman"] {
        if which(tool).is_none() {
            return skip_or_fail("Run scripts/install-deps.sh.", &format!("{tool} is not on PATH"));
        }
    }
    static DOCKERD: OnceLock<bool> = OnceLock::new();
    let up = *DOCKERD.get_or_init(|| {
        Command::new("docker")
            .args(["info", "--format", "{{.ServerVersion}}"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    });
    if !up {
        return skip_or_fail("Start it with scripts/start-dockerd.sh.", "dockerd does not answer `docker info`");
    }
    true
}

/// The first executable called `name` on PATH.
pub fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| fs::metadata(p).map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0).unwrap_or(false))
}

/// Run `program args` under `timeout(1)` ([`COMMAND_TIMEOUT_S`]) with extra `env`, and collect
/// its output. Fails only when the program cannot be started; a non-zero exit is in the Output.
pub fn command_output<S: AsRef<OsStr>>(program: impl AsRef<OsStr>, args: &[S], env: &[(&str, &OsStr)]) -> Output {
    let mut cmd = Command::new("timeout");
    cmd.arg("--kill-after=10").arg(COMMAND_TIMEOUT_S.to_string()).arg(program.as_ref());
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.stdin(Stdio::null());
    cmd.output().unwrap_or_else(|e| panic!("cannot run {:?}: {e}", program.as_ref()))
}

/// `runc ARGS`.
pub fn runc<S: AsRef<OsStr>>(args: &[S]) -> Output {
    command_output("runc", args, &[])
}

/// `actk-runtime ARGS` with `ACTK_CONFIG=config` (the shim called exactly as runc would be).
pub fn actk_runtime<S: AsRef<OsStr>>(config: &Path, args: &[S]) -> Output {
    command_output(bin("actk-runtime"), args, &[("ACTK_CONFIG", config.as_os_str())])
}

/// `actk ARGS` with `ACTK_CONFIG=config` when given.
pub fn actk<S: AsRef<OsStr>>(config: Option<&Path>, args: &[S]) -> Output {
    match config {
        Some(c) => command_output(bin("actk"), args, &[("ACTK_CONFIG", c.as_os_str())]),
        None => command_output(bin("actk"), args, &[]),
    }
}

/// stdout and stderr of an Output as text, for assertions and messages.
pub fn text(o: &Output) -> (String, String) {
    (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
}

/// Panic with the command's status, stdout and stderr unless it succeeded; returns stdout.
pub fn expect_success(what: &str, o: &Output) -> String {
    let (out, err) = text(o);
    assert!(o.status.success(), "{what} failed ({}):\n--- stdout\n{out}\n--- stderr\n{err}", o.status);
    out
}
