//! The environment of every process actk executes.
//!
//! A hook inherits dockerd's environment (Docker passes its own env to the `--gpus` hook) and the
//! container's config may carry anything; a variable such as `LD_PRELOAD` or `LD_LIBRARY_PATH`
//! reaching a root process would run code of the image's choosing (CVE-2025-23266). So nothing
//! is inherited: each exec gets exactly this set.

/// PATH given to executed helpers: system directories only, never a container path.
pub const SAFE_PATH: &str = "/usr/sbin:/usr/bin:/sbin:/bin";

/// The complete environment for an exec: `[("PATH", SAFE_PATH)]`.
pub fn minimal_env() -> Vec<(&'static str, &'static str)> {
    vec![("PATH", SAFE_PATH)]
}

/// Variables that change how the dynamic loader or libc behave; used to report (never to
/// pass on) what an untrusted environment carried.
pub const LOADER_VARIABLES: &[&str] = &[
    "LD_PRELOAD",
    "LD_LIBRARY_PATH",
    "LD_AUDIT",
    "LD_DEBUG",
    "LD_PROFILE",
    "GCONV_PATH",
    "MALLOC_CHECK_",
    "HOSTALIASES",
    "LOCALDOMAIN",
    "RES_OPTIONS",
    "TMPDIR",
];
