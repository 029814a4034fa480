//! Container images, OCI bundles and the real engines (runc, dockerd, podman) for end-to-end tests.
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
//! - [`require_root`], [`require_root_and_engines`]: skip (or, under `CI=true` or `ACTK_E2E_STRICT=1`, fail) when the
//!   machine cannot run the tests.
//!
//! Everything that is shared between tests running in parallel (the cached rootfs, the imported
//! images, /etc/docker/daemon.json) is guarded by a file lock (`flock(2)` through
//! [`std::fs::File::lock`]), which also excludes threads of the same process since each caller
//! opens its own file description.

use anyhow::{Context, Result, anyhow, bail};
use serde_json::Value;
use std::ffi::OsStr;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

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

fn skip_or_fail(test_needs: &str, why: &str) -> bool {
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

/// `docker ARGS` (the docker CLI against the running dockerd).
pub fn docker<S: AsRef<OsStr>>(args: &[S]) -> Output {
    command_output("docker", args, &[])
}

/// `podman ARGS` with the flags this machine needs (ENVIRONMENT.md): for `run` and `create`,
/// `--runtime runc` unless the caller gives `--runtime`, and
/// `--ulimit nofile=1024:1024 --ulimit nproc=4096:4096` (podman's default rlimits exceed this
/// machine's hard limits).
pub fn podman<S: AsRef<OsStr>>(args: &[S]) -> Output {
    podman_with_env(args, &[])
}

/// [`podman`] with extra environment variables for podman (and so for conmon and the runtime).
pub fn podman_with_env<S: AsRef<OsStr>>(args: &[S], env: &[(&str, &OsStr)]) -> Output {
    command_output("podman", &podman_args(args), env)
}

/// The argument list [`podman`] runs: for `run` and `create` (the first such word), `--runtime
/// runc` unless `--runtime` is given, and the `--ulimit` flags, inserted after that word.
pub fn podman_args<S: AsRef<OsStr>>(args: &[S]) -> Vec<std::ffi::OsString> {
    let args: Vec<&OsStr> = args.iter().map(|a| a.as_ref()).collect();
    let Some(pos) = args.iter().position(|a| *a == "run" || *a == "create") else {
        return args.iter().map(|a| a.to_os_string()).collect();
    };
    let mut full: Vec<&OsStr> = args[..=pos].to_vec();
    if !args.iter().any(|a| *a == "--runtime" || a.to_string_lossy().starts_with("--runtime=")) {
        full.extend([OsStr::new("--runtime"), OsStr::new("runc")]);
    }
    full.extend(["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096"].map(OsStr::new));
    full.extend(&args[pos + 1..]);
    full.into_iter().map(|a| a.to_os_string()).collect()
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

/// The busybox rootfs (built once, cached at `target/actk-e2e/busybox-rootfs`): /bin/busybox
/// from the host's busybox-static, every applet as a symlink at its usual path
/// (`busybox --list-full`), /etc/passwd and /etc/group with root and nobody, and empty /dev,
/// /proc, /sys, /tmp, /root. Treat it as read-only; [`Bundle`] copies it.
pub fn busybox_rootfs() -> Result<PathBuf> {
    let dest = cache_dir().join("busybox-rootfs");
    with_lock("busybox-rootfs", || {
        if dest.join("bin/busybox").is_file() {
            return Ok(dest.clone());
        }
        let busybox = ["/bin/busybox", "/usr/bin/busybox"]
            .into_iter()
            .map(Path::new)
            .find(|p| p.is_file())
            .ok_or_else(|| anyhow!("no /bin/busybox: install busybox-static (scripts/install-deps.sh)"))?;
        // Build in a fresh directory and rename, so a crash never leaves a half rootfs behind.
        let tmp = cache_dir().join(unique_name("busybox-rootfs.tmp"));
        let _ = fs::remove_dir_all(&tmp);
        for d in ["bin", "sbin", "usr/bin", "usr/sbin", "etc", "dev", "proc", "sys", "tmp", "root", "var", "run"] {
            fs::create_dir_all(tmp.join(d))?;
        }
        fs::set_permissions(tmp.join("tmp"), fs::Permissions::from_mode(0o1777))?;
        fs::copy(busybox, tmp.join("bin/busybox")).with_context(|| format!("copying {}", busybox.display()))?;
        fs::set_permissions(tmp.join("bin/busybox"), fs::Permissions::from_mode(0o755))?;
        let list = Command::new(busybox).arg("--list-full").output().context("busybox --list-full")?;
        if !list.status.success() {
            bail!("{} --list-full failed; is it busybox-static?", busybox.display());
        }
        for applet in String::from_utf8_lossy(&list.stdout).lines() {
            let applet = applet.trim().trim_start_matches('/');
            if applet.is_empty() || applet == "bin/busybox" {
                continue;
            }
            let link = tmp.join(applet);
            if let Some(parent) = link.parent() {
                fs::create_dir_all(parent)?;
            }
            if link.symlink_metadata().is_err() {
                std::os::unix::fs::symlink("/bin/busybox", &link)
                    .with_context(|| format!("linking {}", link.display()))?;
            }
        }
        fs::write(
            tmp.join("etc/passwd"),
            "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
        )?;
        fs::write(tmp.join("etc/group"), "root:x:0:\nvideo:x:44:\nnogroup:x:65534:\n")?;
        let _ = fs::remove_dir_all(&dest);
        fs::rename(&tmp, &dest).with_context(|| format!("renaming {} to {}", tmp.display(), dest.display()))?;
        Ok(dest.clone())
    })
}

/// The glibc rootfs (Debian bookworm, `debootstrap --variant=minbase`), for tests that need
/// `ldconfig -p`. Built once into `target/actk-e2e/glibc-rootfs` (minutes; needs the Debian
/// mirror, `$ACTK_DEBIAN_MIRROR` or deb.debian.org).
pub fn glibc_rootfs() -> Result<PathBuf> {
    let dest = cache_dir().join("glibc-rootfs");
    with_lock("glibc-rootfs", || {
        if dest.join("sbin/ldconfig").exists() && dest.join("etc/debian_version").is_file() {
            return Ok(dest.clone());
        }
        if which("debootstrap").is_none() {
            bail!("debootstrap is not installed (scripts/install-deps.sh installs it)");
        }
        let mirror = std::env::var("ACTK_DEBIAN_MIRROR").unwrap_or_else(|_| "http://deb.debian.org/debian".into());
        let tmp = cache_dir().join(unique_name("glibc-rootfs.tmp"));
        let _ = fs::remove_dir_all(&tmp);
        let o = Command::new("debootstrap")
            .args(["--variant=minbase", "bookworm"])
            .arg(&tmp)
            .arg(&mirror)
            .stdin(Stdio::null())
            .output()
            .context("running debootstrap")?;
        if !o.status.success() {
            let (out, err) = text(&o);
            let _ = fs::remove_dir_all(&tmp);
            bail!("debootstrap --variant=minbase bookworm {} {mirror} failed:\n{out}\n{err}", tmp.display());
        }
        let _ = fs::remove_dir_all(&dest);
        fs::rename(&tmp, &dest)?;
        Ok(dest.clone())
    })
}

/// Import `rootfs` into `engine` (`docker` or `podman`) as `image`, once: nothing happens when the
/// image is already there. Serialised by a lock, so parallel tests import it once.
pub fn import_image(engine: &str, rootfs: &Path, image: &str) -> Result<()> {
    with_lock(&format!("import-{engine}"), || {
        let present = Command::new(engine)
            .args(["image", "inspect", image])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if present {
            return Ok(());
        }
        let mut tar = Command::new("tar")
            .arg("-C")
            .arg(rootfs)
            .args(["-c", "."])
            .stdout(Stdio::piped())
            .spawn()
            .context("starting tar")?;
        let tar_out = tar.stdout.take().ok_or_else(|| anyhow!("tar has no stdout"))?;
        let o = Command::new(engine)
            .args(["import", "-", image])
            .stdin(tar_out)
            .output()
            .with_context(|| format!("starting {engine} import"))?;
        let tar_status = tar.wait()?;
        if !tar_status.success() || !o.status.success() {
            let (out, err) = text(&o);
            bail!(
                "tar -C {} -c . | {engine} import - {image} failed ({tar_status}, {}):\n{out}\n{err}",
                rootfs.display(),
                o.status
            );
        }
        Ok(())
    })
}

/// [`BUSYBOX_IMAGE`] in docker, imported when absent. Returns the image name.
pub fn docker_busybox_image() -> Result<&'static str> {
    import_image("docker", &busybox_rootfs()?, BUSYBOX_IMAGE)?;
    Ok(BUSYBOX_IMAGE)
}

/// [`BUSYBOX_IMAGE`] in podman, imported when absent. Returns the image name.
pub fn podman_busybox_image() -> Result<&'static str> {
    import_image("podman", &busybox_rootfs()?, BUSYBOX_IMAGE)?;
    Ok(BUSYBOX_IMAGE)
}

/// [`GLIBC_IMAGE`] in docker, built (debootstrap) and imported when absent.
pub fn docker_glibc_image() -> Result<&'static str> {
    import_image("docker", &glibc_rootfs()?, GLIBC_IMAGE)?;
    Ok(GLIBC_IMAGE)
}

/// [`GLIBC_IMAGE`] in podman, built (debootstrap) and imported when absent.
pub fn podman_glibc_image() -> Result<&'static str> {
    import_image("podman", &glibc_rootfs()?, GLIBC_IMAGE)?;
    Ok(GLIBC_IMAGE)
}

/// Copy a tree with `cp -a` (keeps symlinks, modes and device nodes).
pub fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    let o = Command::new("cp").arg("-a").arg(from).arg(to).output().context("running cp -a")?;
    if !o.status.success() {
        bail!("cp -a {} {} failed: {}", from.display(), to.display(), text(&o).1);
    }
    Ok(())
}

/// An OCI bundle in a temporary directory: `config.json` from `runc spec`, and `rootfs/`, a
/// private copy of a rootfs (runc creates mount points in it, so bundles never share one).
///
/// The config is edited to what a test needs: `process.args`, `process.env` (PATH plus the
/// given entries), `process.terminal = false`, `root.path = "rootfs"` (a real directory, as runc
/// requires) and `root.readonly = false`, like Docker's.
pub struct Bundle {
    dir: tempfile::TempDir,
}

impl Bundle {
    /// A bundle over the busybox rootfs running `args` with `env` (`KEY=VALUE` entries).
    pub fn busybox(args: &[&str], env: &[&str]) -> Result<Bundle> {
        Self::new(&busybox_rootfs()?, args, env)
    }

    /// A bundle over the glibc rootfs (see [`glibc_rootfs`]).
    pub fn glibc(args: &[&str], env: &[&str]) -> Result<Bundle> {
        Self::new(&glibc_rootfs()?, args, env)
    }

    /// A bundle over a copy of `rootfs`.
    pub fn new(rootfs: &Path, args: &[&str], env: &[&str]) -> Result<Bundle> {
        let dir = tempfile::Builder::new().prefix("actk-bundle-").tempdir()?;
        let o =
            Command::new("runc").args(["spec", "--bundle"]).arg(dir.path()).output().context("running runc spec")?;
        if !o.status.success() {
            bail!("runc spec --bundle {} failed: {}", dir.path().display(), text(&o).1);
        }
        copy_tree(rootfs, &dir.path().join("rootfs"))?;
        let b = Bundle { dir };
        let mut env_v = vec![Value::from("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")];
        env_v.extend(env.iter().map(|e| Value::from(*e)));
        let args_v: Vec<Value> = args.iter().map(|a| Value::from(*a)).collect();
        b.edit(|c| {
            c["process"]["terminal"] = Value::Bool(false);
            c["process"]["args"] = Value::Array(args_v);
            c["process"]["env"] = Value::Array(env_v);
            c["root"]["path"] = Value::from("rootfs");
            c["root"]["readonly"] = Value::Bool(false);
        })?;
        Ok(b)
    }

    /// The bundle directory.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The rootfs directory of the bundle.
    pub fn rootfs(&self) -> PathBuf {
        self.dir.path().join("rootfs")
    }

    /// Path of config.json.
    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("config.json")
    }

    /// config.json as JSON (key order kept).
    pub fn config(&self) -> Result<Value> {
        let p = self.config_path();
        let s = fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
        serde_json::from_str(&s).with_context(|| format!("parsing {}", p.display()))
    }

    /// Replace config.json.
    pub fn write_config(&self, v: &Value) -> Result<()> {
        fs::write(self.config_path(), serde_json::to_vec_pretty(v)?)?;
        Ok(())
    }

    /// Edit config.json in place.
    pub fn edit(&self, f: impl FnOnce(&mut Value)) -> Result<()> {
        let mut v = self.config()?;
        f(&mut v);
        self.write_config(&v)
    }
}

/// An actk config file (TOML, read through `ACTK_CONFIG`) for one test, with the keys the
/// runtime shim knows (actk_core::config): `root` (host root, a fixture), `runtimes`,
/// `spec_dirs`, `hooks_dirs`, `profiles_dir`.
///
/// `spec_dirs`, `hooks_dirs` and `profiles_dir` default to empty private directories, so a test
/// never sees the machine's /etc/cdi, /var/run/cdi, hooks.d or profiles.d files.
pub struct ActkConfig {
    dir: tempfile::TempDir,
    /// Host root that discovery scans.
    pub root: PathBuf,
    /// Low-level runtimes, first found wins (`["runc"]`).
    pub runtimes: Vec<String>,
    /// Directories with CDI specs.
    pub spec_dirs: Vec<PathBuf>,
    /// Directories with oci-hooks(5) JSON files.
    pub hooks_dirs: Vec<PathBuf>,
    /// Directory of user vendor profiles.
    pub profiles_dir: PathBuf,
    /// Extra TOML lines appended verbatim (for tests of bad config files).
    pub extra: String,
}

impl ActkConfig {
    /// A config with `root`, `runtimes = ["runc"]`, and empty private spec and hooks dirs
    /// (`<dir>/cdi`, `<dir>/hooks.d`).
    pub fn new(root: &Path) -> Result<ActkConfig> {
        let dir = tempfile::Builder::new().prefix("actk-config-").tempdir()?;
        let cdi = dir.path().join("cdi");
        let hooks = dir.path().join("hooks.d");
        fs::create_dir_all(&cdi)?;
        fs::create_dir_all(&hooks)?;
        let profiles = dir.path().join("profiles.d");
        fs::create_dir_all(&profiles)?;
        Ok(ActkConfig {
            dir,
            root: root.to_path_buf(),
            runtimes: vec!["runc".into()],
            spec_dirs: vec![cdi],
            hooks_dirs: vec![hooks],
            profiles_dir: profiles,
            extra: String::new(),
        })
    }

    /// The private directory of this config (holds `cdi/`, `hooks.d/`, `config.toml`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The first spec dir (where a test drops CDI specs).
    pub fn spec_dir(&self) -> &Path {
        &self.spec_dirs[0]
    }

    /// The first hooks dir (where a test drops hooks.d files).
    pub fn hooks_dir(&self) -> &Path {
        &self.hooks_dirs[0]
    }

    /// The TOML text of this config.
    pub fn toml(&self) -> String {
        fn s(p: impl AsRef<OsStr>) -> String {
            // A JSON string is a valid TOML basic string for these paths.
            Value::from(p.as_ref().to_string_lossy().into_owned()).to_string()
        }
        fn list<T: AsRef<OsStr>>(v: &[T]) -> String {
            format!("[{}]", v.iter().map(s).collect::<Vec<_>>().join(", "))
        }
        format!(
            "root = {}\nprofiles_dir = {}\nruntimes = {}\nspec_dirs = {}\nhooks_dirs = {}\n{}",
            s(&self.root),
            s(&self.profiles_dir),
            list(&self.runtimes),
            list(&self.spec_dirs),
            list(&self.hooks_dirs),
            self.extra
        )
    }

    /// Write `<dir>/config.toml` and return its path.
    pub fn write(&self) -> Result<PathBuf> {
        let p = self.dir.path().join("config.toml");
        fs::write(&p, self.toml())?;
        Ok(p)
    }

    /// Write an executable wrapper `<dir>/actk-runtime` that runs the built actk-runtime with
    /// `ACTK_CONFIG` set to this config. Engines (dockerd via containerd's shim, podman via conmon)
    /// start the runtime with their own environment, so a per-test config travels this way.
    pub fn write_wrapper(&self) -> Result<PathBuf> {
        let cfg = self.write()?;
        let p = self.dir.path().join("actk-runtime");
        let mut f = fs::File::create(&p)?;
        writeln!(f, "#!/bin/sh")?;
        writeln!(f, "# Test wrapper: actk-runtime with this test's config.")?;
        writeln!(f, "ACTK_CONFIG='{}' exec '{}' \"$@\"", cfg.display(), bin("actk-runtime").display())?;
        drop(f);
        fs::set_permissions(&p, fs::Permissions::from_mode(0o755))?;
        Ok(p)
    }
}

/// Where dockerd reads its configuration.
pub const DAEMON_JSON: &str = "/etc/docker/daemon.json";

/// Lock that serialises every change of /etc/docker/daemon.json made by tests.
pub fn daemon_json_lock() -> PathBuf {
    // Not under target/: two checkouts on one machine share the one daemon.json.
    PathBuf::from("/run/lock/actk-e2e-daemon-json.lock")
}

/// actk-runtime registered with dockerd for one test: `actk runtime configure --runtime docker
/// --name NAME --path WRAPPER` (WRAPPER = [`ActkConfig::write_wrapper`]), dockerd reloaded with
/// SIGHUP, and on drop `--remove` plus SIGHUP again. Names are unique per test, so tests run in
/// parallel; daemon.json edits are serialised by [`daemon_json_lock`].
pub struct DockerRuntime {
    /// The runtime name for `docker run --runtime NAME`.
    pub name: String,
}

impl DockerRuntime {
    /// Register `path` (an OCI runtime executable) as a unique runtime name.
    pub fn register(path: &Path) -> Result<DockerRuntime> {
        let name = unique_name("actk-e2e");
        with_lock_at(&daemon_json_lock(), || {
            let o = actk(
                None,
                &[
                    OsStr::new("runtime"),
                    OsStr::new("configure"),
                    OsStr::new("--runtime"),
                    OsStr::new("docker"),
                    OsStr::new("--name"),
                    OsStr::new(&name),
                    OsStr::new("--path"),
                    path.as_os_str(),
                ],
            );
            let (out, err) = text(&o);
            if !o.status.success() {
                bail!("actk runtime configure --runtime docker --name {name} failed:\n{out}\n{err}");
            }
            reload_dockerd()?;
            wait_for_docker_runtime(&name, true)
        })?;
        Ok(DockerRuntime { name })
    }
}

impl Drop for DockerRuntime {
    fn drop(&mut self) {
        let name = self.name.clone();
        let r = with_lock_at(&daemon_json_lock(), || {
            let o = actk(None, &["runtime", "configure", "--runtime", "docker", "--name", &name, "--remove"]);
            if !o.status.success() {
                bail!("actk runtime configure --remove --name {name} failed: {}", text(&o).1);
            }
            reload_dockerd()
        });
        if let Err(e) = r {
            eprintln!("warning: could not unregister docker runtime {}: {e:#}", self.name);
        }
    }
}

/// Send SIGHUP to dockerd so it re-reads the `runtimes` of daemon.json.
pub fn reload_dockerd() -> Result<()> {
    let pid = fs::read_to_string("/var/run/docker.pid").context("reading /var/run/docker.pid (is dockerd running?)")?;
    let o = Command::new("kill").args(["-HUP", pid.trim()]).output()?;
    if !o.status.success() {
        bail!("kill -HUP {} failed: {}", pid.trim(), text(&o).1);
    }
    Ok(())
}

/// Wait (up to 20 s) until `docker info` lists (or, with `present = false`, no longer lists)
/// the runtime `name`.
pub fn wait_for_docker_runtime(name: &str, present: bool) -> Result<()> {
    let mut last = String::new();
    for _ in 0..100 {
        let o = Command::new("docker").args(["info", "--format", "{{json .Runtimes}}"]).output()?;
        last = String::from_utf8_lossy(&o.stdout).into_owned();
        let listed = serde_json::from_str::<Value>(&last)
            .ok()
            .and_then(|v| v.as_object().map(|m| m.contains_key(name)))
            .unwrap_or(false);
        if listed == present {
            return Ok(());
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    bail!(
        "dockerd did not {} runtime {name} after SIGHUP within 20 s; runtimes now: {last}; daemon.json: {}",
        if present { "register" } else { "drop" },
        fs::read_to_string(DAEMON_JSON).unwrap_or_default()
    )
}

/// Saves a global file's content (or its absence) and puts it back on drop: for tests that edit
/// /etc/docker/daemon.json or /etc/actk/config.toml.
pub struct FileRestore {
    path: PathBuf,
    saved: Option<Vec<u8>>,
}

impl FileRestore {
    /// Remember `path`'s current content.
    pub fn save(path: &Path) -> FileRestore {
        FileRestore { path: path.to_path_buf(), saved: fs::read(path).ok() }
    }
}

impl Drop for FileRestore {
    fn drop(&mut self) {
        let r = match &self.saved {
            Some(bytes) => fs::write(&self.path, bytes),
            None => match fs::remove_file(&self.path) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                r => r,
            },
        };
        if let Err(e) = r {
            eprintln!("warning: could not restore {}: {e}", self.path.display());
        }
    }
}

/// Path of actk's global configuration file, read by every actk binary when `ACTK_CONFIG` is
/// not set (dockerd's `--gpus` hook and `--runtime actk` registered without a wrapper read it).
pub const GLOBAL_CONFIG: &str = "/etc/actk/config.toml";

/// Run `f` with `config`'s TOML installed as /etc/actk/config.toml, holding a lock that
/// serialises all tests touching that file, and put the previous file (or its absence) back
/// afterwards, also when `f` fails or panics.
pub fn with_global_actk_config<T>(config: &ActkConfig, f: impl FnOnce() -> Result<T>) -> Result<T> {
    with_lock_at(Path::new("/run/lock/actk-e2e-global-config.lock"), || {
        fs::create_dir_all("/etc/actk")?;
        let _restore = FileRestore::save(Path::new(GLOBAL_CONFIG));
        fs::write(GLOBAL_CONFIG, config.toml()).with_context(|| format!("writing {GLOBAL_CONFIG}"))?;
        f()
    })
}

/// The names in a `ls -1 /dev`-style listing (one per line, surrounding space trimmed).
pub fn names(listing: &str) -> std::collections::BTreeSet<String> {
    listing.lines().map(str::trim).filter(|l| !l.is_empty()).map(String::from).collect()
}

/// Assert that an error message names `var`, the bad `value`, and the NVIDIA devices that exist
/// on `root`: every index `0..N` as a word, or every UUID (N and the UUIDs from the fixture's
/// /proc/driver/nvidia/gpus/*/information).
pub fn assert_names_unknown_device(err: &str, var: &str, value: &str, root: &Path) {
    use std::collections::BTreeSet;
    let line = err.lines().filter(|l| l.contains(var)).collect::<Vec<_>>().join("\n");
    assert!(!line.is_empty(), "the error must name the variable {var}: {err}");
    let words: BTreeSet<&str> = line.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-')).collect();
    assert!(words.contains(value), "the error must name the bad value {value}: {line}");
    let uuids = fixture_gpu_uuids(root);
    assert!(!uuids.is_empty(), "no GPUs in the fixture at {}", root.display());
    let by_index = (0..uuids.len()).all(|i| words.contains(i.to_string().as_str()));
    let by_uuid = uuids.iter().all(|u| line.contains(u.as_str()));
    assert!(
        by_index || by_uuid,
        "the error must list the {} devices that exist (indexes 0..{} or {uuids:?}): {line}",
        uuids.len(),
        uuids.len()
    );
}

/// One NVIDIA GPU as a fixture's /proc/driver/nvidia/gpus/<bus>/information describes it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct FixtureGpu {
    /// `Bus Location`, e.g. `0000:18:00.0`.
    pub bus: String,
    /// `GPU UUID`.
    pub uuid: String,
    /// `Device Minor`: the GPU's node is `/dev/nvidia<minor>`.
    pub minor: u32,
}

impl FixtureGpu {
    /// The device node name in /dev (`nvidia<minor>`).
    pub fn node(&self) -> String {
        format!("nvidia{}", self.minor)
    }
}

/// The NVIDIA GPUs of a fixture root in index order: PCI bus order, as NVML and
/// `NVIDIA_VISIBLE_DEVICES` number them. Index `i` is not always `/dev/nvidia<i>` (the
/// heterogeneous fixture has its minors out of bus order).
pub fn fixture_gpus(root: &Path) -> Vec<FixtureGpu> {
    let mut v = Vec::new();
    if let Ok(rd) = fs::read_dir(root.join("proc/driver/nvidia/gpus")) {
        for e in rd.flatten() {
            let Ok(info) = fs::read_to_string(e.path().join("information")) else { continue };
            let field = |name: &str| {
                info.lines()
                    .filter_map(|l| l.split_once(':'))
                    .find(|(k, _)| k.trim() == name)
                    .map(|(_, val)| val.trim().to_string())
            };
            v.push(FixtureGpu {
                bus: field("Bus Location")
                    .unwrap_or_else(|| e.file_name().to_string_lossy().into_owned())
                    .to_lowercase(),
                uuid: field("GPU UUID").unwrap_or_default(),
                minor: field("Device Minor").and_then(|m| m.parse().ok()).unwrap_or(u32::MAX),
            });
        }
    }
    v.sort();
    v
}

/// GPU UUIDs of a fixture root in index order (see [`fixture_gpus`]).
pub fn fixture_gpu_uuids(root: &Path) -> Vec<String> {
    fixture_gpus(root).into_iter().map(|g| g.uuid).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strs(v: Vec<std::ffi::OsString>) -> Vec<String> {
        v.into_iter().map(|s| s.to_string_lossy().into_owned()).collect()
    }

    #[test]
    fn podman_run_gets_runc_and_the_ulimits_this_machine_needs() {
        assert_eq!(
            strs(podman_args(&["run", "--rm", "img", "true"])),
            [
                "run",
                "--runtime",
                "runc",
                "--ulimit",
                "nofile=1024:1024",
                "--ulimit",
                "nproc=4096:4096",
                "--rm",
                "img",
                "true"
            ]
        );
    }

    #[test]
    fn podman_keeps_a_given_runtime_and_leaves_other_commands_alone() {
        let a = strs(podman_args(&["run", "--runtime", "/x/actk-runtime", "img"]));
        assert_eq!(a.iter().filter(|s| *s == "--runtime").count(), 1, "{a:?}");
        assert!(a.contains(&"/x/actk-runtime".to_string()) && a.contains(&"nofile=1024:1024".to_string()), "{a:?}");
        assert_eq!(strs(podman_args(&["image", "inspect", "img"])), ["image", "inspect", "img"]);
    }

    #[test]
    fn actk_config_toml_quotes_paths_and_lists() {
        let c = ActkConfig::new(Path::new("/tmp/a \"b\"")).unwrap();
        let t = c.toml();
        assert!(t.starts_with("root = \"/tmp/a \\\"b\\\"\"\n"), "{t}");
        assert!(t.contains("runtimes = [\"runc\"]\n"), "{t}");
    }
}
