//! What the tests of the `tandem` binary share: the binary under test, a command line to run
//! it with a quiet, history-free environment, and its output as text.

// Each test file uses its own subset.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Output};

/// A test's result.
pub type TestResult = Result<(), Box<dyn std::error::Error>>;

/// The binary under test: `TANDEM_BIN` if set, else the one cargo built beside this test.
// The test harness's own setting, read before any tandem code runs (not a tandem option).
#[allow(clippy::disallowed_methods)]
pub fn bin() -> PathBuf {
    std::env::var_os("TANDEM_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_tandem")))
}

/// `tandem ARGS` logging at `log`, without the op-time history, calibration or colour, with
/// `env` on top.
pub fn command(args: &[&str], log: &str, env: &[(&str, &str)]) -> Command {
    let mut c = Command::new(bin());
    c.args(args)
        .env("TANDEM_LOG", log)
        .env("TANDEM_HISTORY", "off")
        .env("TANDEM_CALIBRATION", "off")
        .env("NO_COLOR", "1")
        .envs(env.iter().copied());
    c
}

/// Runs [`command`] to completion.
pub fn output(args: &[&str], log: &str, env: &[(&str, &str)]) -> Output {
    command(args, log, env)
        .output()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin().display()))
}

/// stdout and stderr as text.
pub fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}
