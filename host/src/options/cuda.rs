//! Options of the CUDA backend (filled by [`super::Options`]).

use super::Env;
use crate::error::Result;

/// Options of the CUDA backend.
#[derive(Debug, Clone, Default)]
pub struct CudaOptions {}

impl CudaOptions {
    /// Options from `env` (`TANDEM_CUDA_*`, `TANDEM_ATTN_VARIANT`, `TANDEM_MOE_*`, ...).
    pub fn from_source(_env: &dyn Env) -> Result<Self> {
        Ok(Self {})
    }
}
