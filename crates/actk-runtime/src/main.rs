//! actk-runtime: an OCI runtime shim. Engines call it exactly like runc (dockerd through
//! containerd's runc shim, podman through conmon, CRI-O, containerd with `BinaryName`).
//!
//! Every call execs the configured low-level runtime (config `runtimes`, first found) with the
//! argv unchanged. Only `create` and `run` do more first: read the bundle's config.json, plan the
//! CDI edits its requests need (env variables, `cdi.k8s.io/` annotations), apply them, merge the
//! oci-hooks(5) hooks.d files, and write config.json back atomically. Any failure before the
//! exec exits 1 with the message on stderr and, when `--log FILE` was given, in runc's log
//! format in that file (containerd shows its last error line to the Docker user); config.json
//! is then untouched.
// std's `main` wrapper is left out (see `main` below); unit tests keep the test harness's.
#![cfg_attr(not(test), no_main)]

mod args;
mod bundle;
mod features;
mod log;
// The static musl build's memcpy, memmove, memcmp and bcmp (x86_64: musl's copy with rep movsq
// and compare a byte at a time; see the module).
#[cfg(any(test, all(target_env = "musl", target_arch = "x86_64")))]
mod mem;

use actk_core::bench_stage::reached;
use actk_core::config::Config;
use actk_core::plan::{PlanContext, PlanOptions, plan_with};
use actk_core::{edits, hooksd};
use anyhow::{Context, Result, anyhow};
use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

/// The allocator of the static musl release build (scripts/build-release.sh): musl's own
/// malloc (mallocng) costs a create 0.5 ms more CPU than glibc's on the DGX fixture, dlmalloc
/// 0.2 ms less (docs/architecture.md, "Build").
#[cfg(target_env = "musl")]
#[global_allocator]
static ALLOC: heap::SpinDlmalloc = heap::SpinDlmalloc::new();

/// dlmalloc behind a spin lock (issue 31). The `dlmalloc` crate's own global allocator takes a
/// pthread mutex around every call: two locked instructions and two calls into musl per
/// allocation, a tenth of a create's instructions (about 10 000 allocations on the DGX
/// fixture). This process has one thread, so the lock is never contended: one
/// compare-and-swap to take it, a plain store to give it back. Still a lock, so that a thread
/// (none today) could not corrupt the heap.
#[cfg(target_env = "musl")]
#[allow(unsafe_code)]
mod heap {
    use std::alloc::{GlobalAlloc, Layout};
    use std::cell::UnsafeCell;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// The heap and its lock; see the module docs.
    pub struct SpinDlmalloc {
        locked: AtomicBool,
        heap: UnsafeCell<dlmalloc::Dlmalloc>,
    }

    // SAFETY: `heap` is only reached through `with`, which holds `locked` meanwhile, so no two
    // threads ever hold a reference to it at once.
    unsafe impl Sync for SpinDlmalloc {}

    impl SpinDlmalloc {
        /// An empty heap, unlocked.
        pub const fn new() -> Self {
            let mut heap = dlmalloc::Dlmalloc::new();
            // The heap grows by mappings of at least 1 MiB instead of dlmalloc's 64 KiB: a
            // create's heap (about 0.3 MiB at its peak) is one mmap(2) instead of seven. Pages
            // are faulted in as they are first written either way (issue 31).
            assert!(heap.set_granularity(1 << 20), "a power of two, above dlmalloc's minimum");
            SpinDlmalloc { locked: AtomicBool::new(false), heap: UnsafeCell::new(heap) }
        }

        /// Runs `f` on the heap with the lock held. `f` is one dlmalloc call, which never
        /// unwinds (it returns null when out of memory), so the lock is always given back.
        fn with<T>(&self, f: impl FnOnce(&mut dlmalloc::Dlmalloc) -> T) -> T {
            while self.locked.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
                std::hint::spin_loop();
            }
            // SAFETY: the lock is held, so this is the only reference to the heap.
            let r = f(unsafe { &mut *self.heap.get() });
            self.locked.store(false, Ordering::Release);
            r
        }
    }

    // SAFETY: each method hands the caller's layout to the dlmalloc call GlobalDlmalloc makes
    // for it (dlmalloc's contracts are GlobalAlloc's), with the heap locked as GlobalDlmalloc
    // locks it.
    unsafe impl GlobalAlloc for SpinDlmalloc {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            // SAFETY: as GlobalAlloc::alloc (a layout of non-zero size).
            self.with(|h| unsafe { h.malloc(layout.size(), layout.align()) })
        }

        unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
            // SAFETY: as GlobalAlloc::alloc_zeroed.
            self.with(|h| unsafe { h.calloc(layout.size(), layout.align()) })
        }

        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            // SAFETY: `ptr` came from this allocator with `layout` (GlobalAlloc::dealloc).
            self.with(|h| unsafe { h.free(ptr, layout.size(), layout.align()) })
        }

        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            // SAFETY: `ptr` came from this allocator with `layout` (GlobalAlloc::realloc).
            self.with(|h| unsafe { h.realloc(ptr, layout.size(), layout.align(), new_size) })
        }
    }
}

/// PATH searched when the environment has none (the usual default of execvp-like lookups).
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The C entry point, in place of std's `main` wrapper (issue 14): that wrapper's start-up (a
/// stack-guard probe that reads /proc/self/maps, the SIGPIPE and signal-stack set-up) costs
/// about 0.07 ms and 5 page faults per call, and an engine calls this process four times per
/// container. std works without it on Linux (glibc hands argv to std's own init hook); what
/// is lost is the message on a stack overflow (a plain SIGSEGV instead), and SIGPIPE keeps the
/// default action that the low-level runtime gets anyway.
///
/// The arguments are taken from `argv` here, not from `std::env::args_os`: std learns them in
/// its `main` wrapper or, on glibc only, from an `.init_array` hook; with musl (the release
/// build, scripts/build-release.sh) `args_os` is empty without the wrapper.
#[cfg(not(test))]
#[allow(unsafe_code)]
#[unsafe(no_mangle)]
extern "C" fn main(argc: std::ffi::c_int, argv: *const *const std::ffi::c_char) -> std::ffi::c_int {
    use std::os::unix::ffi::OsStrExt;
    let n = usize::try_from(argc).unwrap_or(0);
    let mut args = Vec::with_capacity(n);
    for i in 0..n {
        // SAFETY: the C start files pass `argc` valid pointers to NUL-terminated strings in
        // `argv` (C11 5.1.2.2.1), alive for the whole process; a null entry ends the list early.
        let p = unsafe { *argv.add(i) };
        if p.is_null() {
            break;
        }
        // SAFETY: `p` is one of those strings (non-null, NUL-terminated, never freed).
        let bytes = unsafe { std::ffi::CStr::from_ptr(p) }.to_bytes();
        args.push(OsString::from(std::ffi::OsStr::from_bytes(bytes)));
    }
    actk_main(args);
    1
}

/// `argv`: the process's arguments, the program name first.
#[cfg_attr(test, allow(dead_code))]
fn actk_main(argv: Vec<OsString>) {
    let rest = argv.get(1..).unwrap_or_default().to_vec();
    let inv = args::parse(&rest);
    // `--version` / `-v` as the only argument: our line first, then the low-level runtime's own
    // (exec'd below with the arguments unchanged), as nvidia-container-runtime does.
    if inv.subcommand.is_none() && matches!(rest.as_slice(), [a] if a == "--version" || a == "-v") {
        println!("{}", actk_version::line("actk-runtime"));
    }
    let err = match run(&rest, &inv) {
        // `run` only returns on failure: success replaces this process.
        Ok(never) => match never {},
        Err(e) => e,
    };
    let msg = format!("actk-runtime: {err:#}");
    eprintln!("{msg}");
    // Calls other than create/run do not load the config before the exec; their rare failure
    // still goes to the configured log.
    if !log::initialized()
        && let Ok(c) = Config::load_default()
    {
        log::init(&c);
    }
    tracing::error!("{msg}");
    if let Some(path) = &inv.log {
        log::append_runc_log(path, inv.log_format.as_deref(), &msg);
    }
    std::process::exit(1);
}

enum Never {}

fn run(rest: &[OsString], inv: &args::Invocation) -> Result<Never> {
    reached("start");
    // The fast path (issue 14): every call but create/run only needs the low-level runtime's
    // name, read without parsing the rest of the config (Config::load_runtimes).
    let config = if inv.creates() {
        let c = Config::load_default()?;
        log::init(&c);
        reached("config");
        Some(c)
    } else {
        None
    };
    let runtimes = match &config {
        Some(c) => c.runtimes.clone(),
        None => Config::load_runtimes()?,
    };
    let runtime = find_runtime(&runtimes)?;
    if let Some(config) = &config {
        let bundle = match &inv.bundle {
            Some(b) => b.clone(),
            None => std::env::current_dir()
                .context("cannot read the working directory (the bundle when no --bundle is given)")?,
        };
        prepare_bundle(&bundle, config, &runtime, inv)?;
    }
    let arg0 = runtime.file_name().map(OsString::from).unwrap_or_else(|| runtime.clone().into_os_string());
    let e = std::process::Command::new(&runtime).arg0(arg0).args(rest).exec();
    Err(anyhow!("cannot execute the low-level runtime {}: {e}", runtime.display()))
}

/// Plans and applies the edits for the bundle's config.json, merges hooks.d, and writes the file
/// back when anything changed. Warnings (requests the trust policy refused, untrusted spec and
/// hooks files) go to stderr, the log file and the engine's `--log` file.
fn prepare_bundle(bundle: &Path, config: &Config, runtime: &Path, inv: &args::Invocation) -> Result<()> {
    let warn = |msg: &str| log::warn(inv.log.as_deref(), inv.log_format.as_deref(), msg);
    let config_json = bundle.join("config.json");
    let text = match actk_core::rawfile::read(&config_json) {
        Ok(t) => t,
        // Nothing to edit: the low-level runtime says what is missing, in its own words (as a
        // caller of runc expects them).
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            tracing::debug!("{}: no config.json; passed on unchanged", bundle.display());
            return Ok(());
        }
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", config_json.display())),
    };
    // No copy of the spec to compare with (issue 14): what changes it says so. An error below
    // returns before the write, so a partly edited spec is never written.
    let mut spec: serde_json::Value =
        serde_json::from_slice(&text).with_context(|| format!("{} is not valid JSON", config_json.display()))?;
    let mut changed = false;
    let mut deferred = None;
    reached("parse");

    let ctx = PlanContext::from_config(config).context("cannot load vendor profiles")?;
    reached("profiles");
    let p = plan_with(&spec, &ctx, &PlanOptions { ldcache_hook: hook_path(config), process_ends: true })?;
    reached("plan");
    for w in &p.warnings {
        warn(w);
    }
    if !p.is_empty() {
        if !p.edits.net_devices.is_empty() || p.edits.intel_rdt.is_some() {
            // Edits an old runtime would silently ignore are refused, naming the field.
            let name = runtime.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            let refused =
                edits::unsupported_by_runtime(&p.edits, &name, features::of(runtime).as_ref(), features::has_resctrl());
            if !refused.is_empty() {
                anyhow::bail!("{}: {}", p.summary(), refused.join("; "));
            }
        }
        // The added mounts and device entries are written straight from the edits (issue 31).
        deferred = Some(
            edits::apply_deferred(&mut spec, &p.edits, in_user_namespace())
                .with_context(|| format!("cannot apply device edits to {}", config_json.display()))?,
        );
        if p.serves_nvidia() {
            let n = edits::remove_legacy_nvidia_hook(&mut spec);
            if n > 0 {
                tracing::info!("removed {n} {} prestart hook(s): actk served the request", edits::LEGACY_NVIDIA_HOOK);
            }
        }
        if inv.systemd_cgroup {
            // systemd keeps a DeviceAllow rule only for a node it finds under /dev/char
            // (actk_core::devchar): without the link the GPU is gone after a daemon-reload.
            let dir = config.root.join("dev/char");
            match actk_core::devchar::create_links(&dir, &actk_core::devchar::nodes_of_edits(&p.edits)) {
                Ok(made) if !made.is_empty() => tracing::info!("created {} link(s) in {}", made.len(), dir.display()),
                Ok(_) => {}
                Err(e) => tracing::warn!(
                    "cannot create /dev/char links (device access may not survive systemctl daemon-reload): {e}"
                ),
            }
        }
        edits::mark_applied(&mut spec, &p.summary())?;
        tracing::info!("{}: {}", bundle.display(), p.summary());
        changed = true;
    }

    reached("apply");
    let hooks = hooksd::load_with_skipped(&config.hooks_dirs)?;
    for u in &hooks.skipped {
        warn(&format!("hooks file skipped: {u}"));
    }
    if !hooks.hooks.is_empty()
        && let Some(d) = deferred.take()
    {
        // A hooks.d condition (`hasBindMounts`) reads the mounts as they will be written.
        d.write_into(&mut spec);
    }
    let added = hooksd::merge(&mut spec, &hooks.hooks)?;
    for f in &added {
        tracing::info!("{}: hooks from {}", bundle.display(), f.display());
    }
    changed |= !added.is_empty();
    reached("hooks");

    if changed {
        match &deferred {
            Some(d) => bundle::write_atomic(&config_json, &d.with(&spec))?,
            None => bundle::write_atomic(&config_json, &spec)?,
        }
    }
    reached("write");
    // The process execs the low-level runtime next, which discards all memory at once: freeing
    // the spec, the plan and the profiles piece by piece first is work for nothing (a tenth of
    // a container start's instructions; issue 14).
    std::mem::forget(deferred);
    std::mem::forget((spec, p, ctx, hooks));
    Ok(())
}

/// Whether this process runs in a user namespace below the initial one (its uid_map is not the
/// identity `0 0 4294967295`): rootless podman starts the runtime inside its own namespace.
fn in_user_namespace() -> bool {
    actk_core::rawfile::read_to_string(Path::new("/proc/self/uid_map")).is_ok_and(|m| {
        let lines: Vec<Vec<&str>> = m.lines().map(|l| l.split_whitespace().collect()).collect();
        !matches!(lines.as_slice(), [l] if l.as_slice() == ["0", "0", "4294967295"])
    })
}

/// actk-hook for the ld.so.cache hook: the config's `hook_path`, else the `actk-hook` installed
/// next to this executable; `None` (with a debug note) when there is none.
fn hook_path(config: &Config) -> Option<String> {
    let p = match &config.hook_path {
        Some(p) => p.clone(),
        None => std::env::current_exe().ok()?.parent()?.join("actk-hook"),
    };
    if p.is_absolute() && is_executable(&p) {
        p.to_str().map(str::to_string)
    } else {
        tracing::debug!(
            "no actk-hook at {}: injected libraries are not added to the container's ld.so.cache",
            p.display()
        );
        None
    }
}

/// The first of `runtimes` that exists: an absolute (or relative with `/`) path as is, a bare
/// name searched on `PATH`. This executable itself is skipped (a `runc` symlink to actk-runtime
/// would otherwise exec itself forever). Error (field case F02): the names and the PATH searched.
fn find_runtime(runtimes: &[String]) -> Result<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let path_var = std::env::var("PATH").ok().filter(|p| !p.is_empty());
    let path = path_var.as_deref().unwrap_or(DEFAULT_PATH);
    // This executable by device and inode (one stat instead of resolving every path component).
    let me = std::fs::metadata("/proc/self/exe").ok().map(|m| (m.dev(), m.ino()));
    let usable = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|m| executable(&m) && (me.is_none() || Some((m.dev(), m.ino())) != me))
    };
    for name in runtimes {
        if name.contains('/') {
            let p = PathBuf::from(name);
            if usable(&p) {
                return Ok(p);
            }
            continue;
        }
        for dir in path.split(':').filter(|d| !d.is_empty()) {
            let p = Path::new(dir).join(name);
            if usable(&p) {
                return Ok(p);
            }
        }
    }
    if runtimes.is_empty() {
        return Err(anyhow!(
            "no low-level runtime configured: set runtimes = [\"runc\"] in {}",
            Config::path().display()
        ));
    }
    Err(anyhow!(
        "low-level runtime not found: looked for {} in PATH={path}{}; install runc or crun, or set runtimes in {} to an absolute path",
        runtimes.join(", "),
        if path_var.is_none() { " (PATH unset, default used)" } else { "" },
        Config::path().display()
    ))
}

fn is_executable(p: &Path) -> bool {
    std::fs::metadata(p).is_ok_and(|m| executable(&m))
}

fn executable(m: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::PermissionsExt;
    m.is_file() && m.permissions().mode() & 0o111 != 0
}
