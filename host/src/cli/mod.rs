//! The `tandem` subcommands, one file each.

pub mod bench;
pub mod compare;
pub mod devices;
pub mod fpga;
pub mod op;
pub mod run;

use std::sync::{Arc, Mutex};

use tandem::backend::CudaDType;
use tandem::plan::History;

/// The parser of `--cuda-dtype`: `bf16` or `f16`; anything else is a usage error that lists
/// the accepted values.
pub fn cuda_dtype_parser() -> impl clap::builder::TypedValueParser<Value = CudaDType> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(CudaDType::ALL.map(|d| d.name()))
        .try_map(|s| s.parse::<CudaDType>())
}

/// The op-time history the planner learns from: the user's cache file, or none when
/// `TANDEM_HISTORY=off`.
pub fn history() -> Arc<Mutex<History>> {
    let h = match std::env::var("TANDEM_HISTORY").as_deref() {
        Ok("off") | Ok("0") => History::in_memory(),
        _ => History::user_default(),
    };
    Arc::new(Mutex::new(h))
}
