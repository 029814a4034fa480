//! Where actk-hook's warnings and decisions go: stderr, and the config's `log_file` (appended,
//! in actk-runtime's format) when one is set. A hook's stderr reaches the user only when the
//! hook fails: runc discards it when a hook succeeds, and Docker's `--gpus` hook runs with
//! nobody reading it, so a warning that lets the container start (`--gpus all` on a node
//! without GPUs, a read-only /etc) is found only in the log file.

use actk_core::config::Config;

/// Sends this process's tracing events (its `info`/`warn` lines and actk-core's) to
/// `config.log_file` at `config.log_level`; nothing when unset. A log file that cannot be
/// opened is said on stderr and otherwise ignored: logging must never fail a hook.
pub fn init(config: &Config) {
    let Some(path) = &config.log_file else { return };
    let file = match std::fs::OpenOptions::new().create(true).append(true).open(path) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("actk-hook: warning: cannot open log file {}: {e}", path.display());
            return;
        }
    };
    let filter = tracing_subscriber::EnvFilter::try_new(&config.log_level)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::sync::Mutex::new(file))
        .with_ansi(false)
        .with_target(false)
        .try_init();
}

/// Loads the config (as [`Config::load_default`]) and starts logging to its `log_file`. A
/// config that cannot be loaded is returned as the error; the caller decides whether the hook
/// needs it (planning does; `update-ldcache` does not and goes on logging to stderr only).
pub fn init_default() -> Result<Config, actk_core::config::ConfigError> {
    let config = Config::load_default()?;
    init(&config);
    Ok(config)
}

/// A warning: on stderr and in the log file.
pub fn warn(msg: &str) {
    eprintln!("actk-hook: warning: {msg}");
    tracing::warn!("actk-hook: {msg}");
}

/// A decision (what was injected, what was skipped and why): in the log file only, as
/// actk-runtime logs what it served.
pub fn info(msg: &str) {
    tracing::info!("actk-hook: {msg}");
}

/// The error that fails the hook: on stderr (runc shows it) and in the log file.
pub fn error(msg: &str) {
    eprintln!("actk-hook: {msg}");
    tracing::error!("actk-hook: {msg}");
}
