//! Shared by the property tests (`prop_*.rs`): run a proptest strategy and report how many
//! inputs were tried (for `make verify` and `make robustness`, which set `ACTK_VERIFY_COUNTS`
//! to a report file).
//!
//! A property reports its own count whether it holds or not (a failing property says how many
//! inputs it tried before the failure and is marked `failed`), so the report never shows a
//! failure as "0 inputs tried" and one failure never hides the figures of the others.

use proptest::strategy::Strategy;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use std::sync::atomic::{AtomicU64, Ordering};

/// Runs `test` on `strategy`'s values (case count from `PROPTEST_CASES`, no persisted failure
/// files) and reports the count under `parser` (`parser N`, or `parser N failed` when the
/// property does not hold). Panics with the minimal failing input.
pub fn check<S: Strategy>(parser: &str, strategy: S, test: impl Fn(S::Value) -> Result<(), TestCaseError>) {
    let config = Config { failure_persistence: None, ..Config::default() };
    let tried = AtomicU64::new(0);
    let result = TestRunner::new(config).run(&strategy, |v| {
        tried.fetch_add(1, Ordering::Relaxed);
        test(v)
    });
    let n = tried.load(Ordering::Relaxed);
    if let Err(e) = result {
        report_status(parser, n, false);
        panic!("{parser}: failed after {n} inputs: {e}");
    }
    report_status(parser, n, true);
}

/// Appends `parser count` to the file named by `ACTK_VERIFY_COUNTS`, when set.
#[allow(dead_code)] // not every prop_*.rs reports by hand
pub fn report(parser: &str, count: u64) {
    report_status(parser, count, true);
}

/// Appends `parser count` (or `parser count failed`) to `$ACTK_VERIFY_COUNTS`, when set.
fn report_status(parser: &str, count: u64, held: bool) {
    if let Some(path) = std::env::var_os("ACTK_VERIFY_COUNTS") {
        use std::io::Write;
        if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
            let _ = writeln!(f, "{parser} {count}{}", if held { "" } else { " failed" });
        }
    }
}
