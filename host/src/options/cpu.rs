//! Options of the CPU backend (filled by [`super::Options`]): which BLAS library its matrix
//! products go through, and how many threads it computes with.

use std::path::PathBuf;

use super::Env;
use crate::error::{Error, Result};

/// The environment variable that picks the CPU's BLAS ([`CpuBlas`]).
pub const BLAS_VAR: &str = "TANDEM_CPU_BLAS";
/// The environment variable that sets the CPU backend's thread count.
pub const THREADS_VAR: &str = "TANDEM_CPU_THREADS";
/// Largest accepted [`THREADS_VAR`].
pub const MAX_THREADS: usize = 1024;

/// Which BLAS library the CPU backend multiplies matrices with.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum CpuBlas {
    /// Look for OpenBLAS (then MKL, then a `libblas.so.3` that is one of them) in the
    /// system's library path; without one, the portable GEMM (matrixmultiply).
    #[default]
    Auto,
    /// The portable GEMM only.
    Off,
    /// This CBLAS library file (it must export `cblas_sgemm`).
    Library(PathBuf),
}

/// Options of the CPU backend.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CpuOptions {
    /// The BLAS (`TANDEM_CPU_BLAS`: `auto` (the default), `off`, or the path of a library).
    pub blas: CpuBlas,
    /// Threads the CPU backend computes with (`TANDEM_CPU_THREADS`); `None`: the planner's
    /// view of the machine, the cores less those a simulated FPGA card keeps busy
    /// ([`crate::backend::cpu::planned_threads`]).
    pub threads: Option<usize>,
}

impl CpuOptions {
    /// Options from any [`Env`]; a value that is set but not accepted is an error naming the
    /// variable, the value and what is accepted.
    pub fn from_source(env: &dyn Env) -> Result<Self> {
        let blas = match env.text(BLAS_VAR)? {
            None => CpuBlas::Auto,
            Some(t) => match t.to_ascii_lowercase().as_str() {
                "auto" | "on" | "1" | "true" => CpuBlas::Auto,
                "off" | "0" | "false" | "none" => CpuBlas::Off,
                _ => {
                    let p = PathBuf::from(&t);
                    if !p.is_file() {
                        return Err(Error::invalid(
                            BLAS_VAR,
                            format!(
                                "{t:?} is not accepted: auto, off, or the path of a CBLAS \
                                 library file (e.g. /usr/lib/x86_64-linux-gnu/libopenblas.so.0); \
                                 no file is there"
                            ),
                        ));
                    }
                    CpuBlas::Library(p)
                }
            },
        };
        let threads = match env.text(THREADS_VAR)? {
            None => None,
            Some(t) => Some(
                t.parse::<usize>()
                    .ok()
                    .filter(|n| (1..=MAX_THREADS).contains(n))
                    .ok_or_else(|| {
                        Error::invalid(
                            THREADS_VAR,
                            format!(
                                "{t:?} is not accepted: a whole number from 1 to {MAX_THREADS}"
                            ),
                        )
                    })?,
            ),
        };
        Ok(Self { blas, threads })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blas_and_threads_parse_or_name_the_variable() -> Result<()> {
        let none: [(&str, &str); 0] = [];
        assert_eq!(CpuOptions::from_source(&none)?, CpuOptions::default());
        assert_eq!(
            CpuOptions::from_source(&[(BLAS_VAR, "OFF")])?.blas,
            CpuBlas::Off
        );
        assert_eq!(
            CpuOptions::from_source(&[(BLAS_VAR, "auto")])?.blas,
            CpuBlas::Auto
        );
        let dir = std::env::temp_dir();
        let file = dir.join(format!("tandem-blas-opt-{}", std::process::id()));
        std::fs::write(&file, b"x").map_err(|e| Error::file(&file, e.to_string()))?;
        let text = file.display().to_string();
        let o = CpuOptions::from_source(&[(BLAS_VAR, text.as_str())]);
        std::fs::remove_file(&file).map_err(|e| Error::file(&file, e.to_string()))?;
        assert_eq!(o?.blas, CpuBlas::Library(file.clone()));
        let e = CpuOptions::from_source(&[(BLAS_VAR, "/no/such/libblas.so")])
            .expect_err("no such file");
        assert!(e.to_string().contains(BLAS_VAR) && e.to_string().contains("/no/such"));
        assert_eq!(
            CpuOptions::from_source(&[(THREADS_VAR, "3")])?.threads,
            Some(3)
        );
        for bad in ["0", "-1", "many", "100000"] {
            let e = CpuOptions::from_source(&[(THREADS_VAR, bad)]).expect_err(bad);
            assert!(e.to_string().contains(THREADS_VAR), "{e}");
        }
        Ok(())
    }
}
