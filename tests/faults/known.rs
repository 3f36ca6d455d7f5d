//! Tests that fail on the current code, each for a diagnosed bug described in
//! `docs/reliability.md`. Empty since every fix landed; a new fault test that
//! shows a bug before its fix goes here until the fix lands.
//!
//! A listed test is not run by `make test` (it prints a loud `KNOWN FAILURE`
//! line instead, on the terminal, past libtest's capture). `make faults`
//! (`ATTACHER_FAULTS=1`) runs it: a failure is reported as a known failure;
//! a pass fails the test with `FIXED:` so that the name leaves this list.

use std::future::Future;
use std::io::Write;

use futures::FutureExt;

/// Names of the tests (scenarios of `tests/faults/faults.rs`, regressions of
/// `tests/faults/regressions.rs`) that fail on the current code.
pub(crate) const KNOWN_FAILING: &[&str] = &[];

/// Whether `make faults` runs this process (it sets `ATTACHER_FAULTS=1`).
pub(crate) fn faults_run() -> bool {
    std::env::var_os("ATTACHER_FAULTS").is_some_and(|v| v == "1")
}

/// Writes a line straight to the terminal's stderr (libtest captures only
/// `print!`/`eprint!`, so this shows even for passing tests).
pub(crate) fn loud(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// Runs `body` as test `name` under the known-failure rules above.
pub(crate) async fn gate(name: &str, body: impl Future<Output = ()>) {
    let known = KNOWN_FAILING.contains(&name);
    if !known {
        body.await;
        return;
    }
    if !faults_run() {
        loud(&format!(
            "KNOWN FAILURE (not run here; `make faults` runs it, docs/reliability.md explains it): {name}"
        ));
        return;
    }
    match std::panic::AssertUnwindSafe(body).catch_unwind().await {
        Ok(()) => panic!(
            "FIXED: {name} passes now; remove it from KNOWN_FAILING in tests/faults/known.rs"
        ),
        Err(payload) => {
            loud(&format!("KNOWN FAILURE (still failing): {name}"));
            std::panic::resume_unwind(payload);
        }
    }
}
