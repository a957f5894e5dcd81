//! Skipping a test honestly: a test that cannot run here says why (printed, and appended to
//! the skip log that `.ci/run` and `.gpu/run` summarise), and on a machine that must run the
//! GPU tests (`TANDEM_REQUIRE_GPU=1`) a GPU skip is a failure instead.
//!
//! Settings come through `tandem::options`' environment source, the one place that reads the
//! process environment:
//! - `TANDEM_REQUIRE_GPU=1`: every GPU skip panics (the GPU machine sets it);
//! - `TANDEM_SEED=N`: the seed of the clock-seeded generators ([`crate::cuda::clock_rng`]), to
//!   replay a failure;
//! - `TANDEM_SKIP_LOG=FILE`: each skip appends `test-binary test<TAB>reason` to FILE.

use std::io::Write as _;
use std::sync::OnceLock;

use tandem::options::{Env, ProcessEnv};

/// What a skipped test lacked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// A CUDA GPU with its driver and libraries.
    Gpu,
    /// A second CUDA GPU (peer copies, multi-GPU splits): skipped, not failed, on a one-GPU
    /// machine even with `TANDEM_REQUIRE_GPU=1`.
    SecondGpu,
    /// Verilator, yosys or another tool of the FPGA flow.
    FpgaTool,
}

/// The test settings of this process.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    /// GPU skips fail.
    pub require_gpu: bool,
    /// Seed of the clock-seeded generators, when set.
    pub seed: Option<u64>,
    /// Where skips are logged.
    pub skip_log: Option<std::path::PathBuf>,
}

impl Settings {
    /// Reads the settings from `env`; a value that is set but not accepted panics with the
    /// variable, the value and what is accepted (a test setting, so a panic is the report).
    pub fn from_source(env: &dyn Env) -> Self {
        let text = |name: &str| env.text(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        let require_gpu = match text("TANDEM_REQUIRE_GPU").as_deref() {
            None | Some("0" | "off" | "false") => false,
            Some("1" | "on" | "true") => true,
            Some(v) => {
                panic!("TANDEM_REQUIRE_GPU: '{v}' is not accepted (1/on/true or 0/off/false)")
            }
        };
        let seed = text("TANDEM_SEED").map(|v| {
            v.parse::<u64>()
                .unwrap_or_else(|_| panic!("TANDEM_SEED: '{v}' is not an unsigned 64-bit integer"))
        });
        Self {
            require_gpu,
            seed,
            skip_log: env.path("TANDEM_SKIP_LOG"),
        }
    }
}

/// The settings of this test process (read once).
pub fn settings() -> &'static Settings {
    static S: OnceLock<Settings> = OnceLock::new();
    S.get_or_init(|| Settings::from_source(&ProcessEnv))
}

/// Skips the calling test: prints `skipped: {why}` and logs it; panics instead when the test
/// needs a GPU and `TANDEM_REQUIRE_GPU=1`.
pub fn skip(need: Need, why: &str) {
    if need == Need::Gpu && settings().require_gpu {
        panic!("TANDEM_REQUIRE_GPU=1 but the GPU test cannot run: {why}");
    }
    println!("skipped: {why}");
    if let Some(path) = &settings().skip_log {
        let exe = std::env::current_exe()
            .ok()
            .and_then(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
            .unwrap_or_default();
        let test = std::thread::current().name().unwrap_or("?").to_string();
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            // One write of the whole line: appends of a short line do not interleave.
            let line = format!("{exe} {test}\t{why}\n");
            let _ = f.write_all(line.as_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_parse() {
        let s = Settings::from_source(&[("TANDEM_REQUIRE_GPU", "1"), ("TANDEM_SEED", "42")]);
        assert!(s.require_gpu);
        assert_eq!(s.seed, Some(42));
        let s = Settings::from_source(&[("TANDEM_REQUIRE_GPU", "off")]);
        assert!(!s.require_gpu);
        assert_eq!(s.seed, None);
    }

    #[test]
    #[should_panic(expected = "TANDEM_SEED: 'x1' is not an unsigned 64-bit integer")]
    fn a_bad_seed_is_reported() {
        Settings::from_source(&[("TANDEM_SEED", "x1")]);
    }
}
