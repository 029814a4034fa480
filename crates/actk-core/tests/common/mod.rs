//! Shared by the property tests (`prop_*.rs`): run a proptest strategy and report how many
//! inputs were tried (for `make verify`, which sets `ACTK_VERIFY_COUNTS` to a report file).

use proptest::strategy::Strategy;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use std::sync::atomic::{AtomicU64, Ordering};

/// Runs `test` on `strategy`'s values (case count from `PROPTEST_CASES`, no persisted failure
/// files) and reports the count under `parser`. Panics with the minimal failing input.
pub fn check<S: Strategy>(parser: &str, strategy: S, test: impl Fn(S::Value) -> Result<(), TestCaseError>) {
    let config = Config { failure_persistence: None, ..Config::default() };
    let tried = AtomicU64::new(0);
    let result = TestRunner::new(config).run(&strategy, |v| {
        tried.fetch_add(1, Ordering::Relaxed);
        test(v)
    });
    if let Err(e) = result {
        panic!("{parser}: {e}");
    }
    report(parser, tried.load(Ordering::Relaxed));
}

/// Appends `parser count` to the file named by `ACTK_VERIFY_COUNTS`, when set.
pub fn report(parser: &str, count: u64) {
    if let Some(path) = std::env::var_os("ACTK_VERIFY_COUNTS") {
        use std::io::Write;
        if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
            let _ = writeln!(f, "{parser} {count}");
        }
    }
}
