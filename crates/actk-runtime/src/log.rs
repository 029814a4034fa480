//! Logging: the config's `log_file` through tracing, and runc-format error lines in the engine's
//! `--log` file.
//!
//! containerd's runc shim reads the runtime's `--log` file (`--log-format json`) when the runtime
//! fails and shows the last `"level":"error"` message to the user, so a failure before the exec
//! is written there in runc's own shape: `{"level":"error","msg":"...","time":"RFC 3339"}`.

use actk_core::config::Config;
use std::io::Write;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

/// Sends tracing events to `config.log_file` (appended) at `config.log_level`; nothing when
/// unset. A log file that cannot be opened is reported on stderr and otherwise ignored: logging
/// must never stop a container.
pub fn init(config: &Config) {
    INITIALIZED.store(true, std::sync::atomic::Ordering::Relaxed);
    let Some(path) = &config.log_file else { return };
    let file = match std::fs::OpenOptions::new().create(true).append(true).open(path) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("actk-runtime: warning: cannot open log file {}: {e}", path.display());
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

static INITIALIZED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether [`init`] ran (the fast path of calls other than create/run skips it).
pub fn initialized() -> bool {
    INITIALIZED.load(std::sync::atomic::Ordering::Relaxed)
}

/// A warning the user must be able to find (a request the trust policy refused, an untrusted
/// spec file): on stderr, in the log file, and as a `warning` line in the engine's runc log
/// (`--log`, kept by containerd in the task directory) when one was given.
pub fn warn(runc_log: Option<&Path>, format: Option<&str>, msg: &str) {
    eprintln!("actk-runtime: warning: {msg}");
    tracing::warn!("{msg}");
    if let Some(path) = runc_log {
        append_runc_log_level(path, format, "warning", &format!("actk-runtime: {msg}"));
    }
}

/// Appends `msg` as an error line to the runc log `path`, as JSON when `format` is `json`, else
/// in runc's text form (`time="..." level=error msg="..."`). Failures are ignored (stderr has it).
pub fn append_runc_log(path: &Path, format: Option<&str>, msg: &str) {
    append_runc_log_level(path, format, "error", msg);
}

/// [`append_runc_log`] at `level` (`error`, `warning`).
pub fn append_runc_log_level(path: &Path, format: Option<&str>, level: &str, msg: &str) {
    let time = rfc3339_now();
    let line = if format == Some("json") {
        serde_json::json!({"level": level, "msg": msg, "time": time}).to_string()
    } else {
        format!("time={} level={level} msg={}", serde_json::Value::from(time), serde_json::Value::from(msg))
    };
    if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
        let _ = writeln!(f, "{line}");
    }
}

/// The current UTC time as RFC 3339 with nanoseconds (`2026-11-30T10:31:02.123456789Z`).
pub fn rfc3339_now() -> String {
    let d = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    rfc3339(d.as_secs(), d.subsec_nanos())
}

fn rfc3339(secs: u64, nanos: u32) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (proleptic Gregorian, H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{nanos:09}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_known_instants() {
        assert_eq!(rfc3339(0, 0), "1970-01-01T00:00:00.000000000Z");
        // 2024-02-29T12:34:56Z (a leap day).
        assert_eq!(rfc3339(1_709_210_096, 5), "2024-02-29T12:34:56.000000005Z");
    }

    #[test]
    fn json_error_line_in_runc_shape() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("log.json");
        std::fs::write(&p, "{\"level\":\"info\",\"msg\":\"before\"}\n").unwrap();
        append_runc_log(&p, Some("json"), "NVIDIA_VISIBLE_DEVICES=7: no such device");
        let text = std::fs::read_to_string(&p).unwrap();
        let last: serde_json::Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
        assert_eq!(last["level"], "error");
        assert_eq!(last["msg"], "NVIDIA_VISIBLE_DEVICES=7: no such device");
        assert!(last["time"].as_str().unwrap().ends_with('Z'));
    }
}
