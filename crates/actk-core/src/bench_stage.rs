//! Where a container start's time goes, stage by stage (issue 31; `benches/runtime-bench.sh
//! stages`). With the cargo feature `bench-stages`, a process whose environment has
//! `ACTK_BENCH_STAGE=NAME` ends (exit status 0, nothing written, nothing exec'd) when it reaches
//! the stage NAME; the bench runs one create per stage in the same rounds and reads each stage's
//! cost as the paired difference between a stage and the one before it. Without the feature
//! (every build that ships: `scripts/build-release.sh` passes no features), [`reached`] is an
//! empty function the compiler removes, and the environment is never read.
//!
//! The stages of actk-runtime's create, in order: `start` (arguments parsed), `config`
//! (config.toml read, logging set up), `parse` (config.json read and parsed), `profiles` (vendor
//! profiles loaded), `requests` (the container's requests collected), `registry` (CDI spec
//! directories read), then inside discovery `ldcache` (the driver root's ld.so.cache read; a
//! pass for the devices' identity alone reads none and passes it at once), `devices` (the first
//! vendor's devices described), `control` (its control nodes found), and `inventory` (host
//! discovered: its host files found), then `plan` (edits planned), `apply` (edits applied),
//! `hooks` (hooks.d merged), `write` (config.json written). A start that needs no
//! registry or no inventory never reaches that stage.

/// Ends the process when `stage` is the one named by `ACTK_BENCH_STAGE` (feature
/// `bench-stages` only; otherwise does nothing). `stage`: one of the names in the module docs.
#[cfg(feature = "bench-stages")]
pub fn reached(stage: &str) {
    static WANTED: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    if WANTED.get_or_init(|| std::env::var("ACTK_BENCH_STAGE").ok()).as_deref() == Some(stage) {
        std::process::exit(0);
    }
}

/// Ends the process when `stage` is the one named by `ACTK_BENCH_STAGE` (feature
/// `bench-stages` only; this build has it off, so this does nothing).
#[cfg(not(feature = "bench-stages"))]
#[inline(always)]
pub fn reached(_stage: &str) {}
