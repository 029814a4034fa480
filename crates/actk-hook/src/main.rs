//! actk-hook: an OCI hook (runtime-spec "POSIX-platform Hooks") that injects requested
//! accelerators into a live container.
//!
//! Invocations (argv[0] may be `actk-hook` or `nvidia-container-runtime-hook`: Docker's
//! `--gpus` runs the executable of that name with args `["nvidia-container-runtime-hook",
//! "prestart"]`):
//! - `prestart` | `createRuntime` | `createContainer` `[--edits FILE]`: reads the OCI state from
//!   stdin, plans the container's requests with the same code as actk-runtime
//!   (`actk_core::plan`) or takes the CDI container edits in FILE, and injects them
//!   ([`actk_inject::inject`]). Does nothing when actk-runtime already applied the edits
//!   (annotation `io.actk.applied`).
//! - `poststart` | `poststop` | `startContainer`: nothing to do; exits 0 (old configs call the
//!   NVIDIA hook at these stages too).
//! - `update-ldcache --folder DIR...`: a CDI createContainer hook that refreshes the container's
//!   ld.so.cache with the host's ldconfig.
//! - `enable-cuda-compat --host-driver-version V`: a CDI createContainer hook (before
//!   update-ldcache) that puts an image's newer CUDA forward-compat libraries first.
//!
//! Errors go to stderr with exit status 1; runc shows them to the user. Errors, warnings and
//! what was injected also go to the config's `log_file` ([`log`]), since runc discards a
//! hook's stderr when it succeeds.
//!
//! Every stage that acts on a container ends within [`HOOK_TIMEOUT_S`] seconds, whether or not
//! its caller gives a `timeout` (actk's own specs and edits do; Docker's `--gpus` does not): a
//! watchdog thread ends the process with an error naming the limit (issue 29, finding 3).

mod cuda_compat;
mod log;
// actk-runtime's memcpy, memmove, memcmp and bcmp for the static musl build (musl's copy with rep
// movsq and compare a byte at a time; issue 31).
#[cfg(all(target_env = "musl", target_arch = "x86_64"))]
#[path = "../../actk-runtime/src/mem.rs"]
mod mem;
mod prestart;
mod state;
mod update_ldcache;

use actk_core::cdi::generate::HOOK_TIMEOUT_S;
use anyhow::{Result, bail};

/// The allocator of the static musl release build (scripts/build-release.sh), as in actk-runtime.
#[cfg(target_env = "musl")]
#[global_allocator]
static ALLOC: dlmalloc::GlobalDlmalloc = dlmalloc::GlobalDlmalloc;

const USAGE: &str = "usage: actk-hook prestart|createRuntime|createContainer [--edits FILE]\n       actk-hook update-ldcache --folder DIR [--folder DIR...]\n       actk-hook enable-cuda-compat --host-driver-version V [--compat-dir DIR] [--library LIB]\n(the OCI state JSON is read from stdin)";

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Err(e) = run(&args) {
        log::error(&format!("{e:#}"));
        std::process::exit(1);
    }
}

/// Ends the process with an error after [`HOOK_TIMEOUT_S`] (a thread sleeping beside the work,
/// since a hook blocked in a system call cannot check a clock itself). The runtime sees a failed
/// hook and fails the start, as it does when it enforces a `timeout` itself.
fn arm_timeout(stage: &str) {
    let stage = stage.to_string();
    std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_secs(HOOK_TIMEOUT_S.unsigned_abs()));
        eprintln!("actk-hook: {stage}: did not finish within {HOOK_TIMEOUT_S} s (the hook's time limit); giving up");
        std::process::exit(1);
    });
}

fn run(args: &[String]) -> Result<()> {
    // Leading `-x` flags of NVIDIA's hook (`-debug`, `-config=FILE`) are accepted and ignored:
    // configs written for it keep working.
    let mut rest = args.iter().skip_while(|a| a.starts_with('-') && !a.starts_with("--"));
    let Some(cmd) = rest.next() else { bail!("no hook stage given\n{USAGE}") };
    let rest: Vec<String> = rest.cloned().collect();
    if matches!(
        cmd.as_str(),
        "prestart" | "createRuntime" | "createContainer" | "update-ldcache" | "enable-cuda-compat"
    ) {
        arm_timeout(cmd);
    }
    match cmd.as_str() {
        "prestart" | "createRuntime" | "createContainer" => prestart::run(cmd, &rest),
        "poststart" | "poststop" | "startContainer" => Ok(()),
        "update-ldcache" => {
            start_log();
            update_ldcache::run(&rest)
        }
        "--version" | "version" => {
            println!("{}", actk_version::line("actk-hook"));
            Ok(())
        }
        "enable-cuda-compat" => {
            start_log();
            cuda_compat::run(&rest)
        }
        "-h" | "--help" | "help" => {
            println!("{USAGE}");
            Ok(())
        }
        other => bail!("unknown hook stage {other:?}\n{USAGE}"),
    }
}

/// Logging for the CDI hooks, which need nothing else from the config: one that cannot be
/// loaded is said on stderr, and the hook does its work without a log file.
fn start_log() {
    if let Err(e) = log::init_default() {
        eprintln!("actk-hook: warning: {e}; logging to stderr only");
    }
}
