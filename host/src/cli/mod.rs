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

/// The op-time history the planner learns from: the file `options` name (the user's cache,
/// unless `TANDEM_HISTORY=off`), else kept in memory only.
pub fn history(options: &tandem::options::Options) -> Arc<Mutex<History>> {
    Arc::new(Mutex::new(History::at(options.history.as_deref())))
}
