//! Options of the FPGA backend (filled by [`super::Options`]).

use super::Env;
use crate::error::Result;

/// Options of the FPGA backend.
#[derive(Debug, Clone, Default)]
pub struct FpgaOptions {}

impl FpgaOptions {
    /// Options from `env` (`TANDEM_FPGA_*`, `TANDEM_SIM_CACHE`, ...).
    pub fn from_source(_env: &dyn Env) -> Result<Self> {
        Ok(Self {})
    }
}
