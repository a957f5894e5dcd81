//! The `tandem` subcommands, one file each.

pub mod bench;
pub mod compare;
pub mod devices;
pub mod fpga;
pub mod history;
pub mod op;
pub mod placement;
pub mod run;

use std::sync::{Arc, Mutex};

use clap::ValueEnum;
use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
use tandem::backend::CudaDType;
use tandem::plan::{BackendChoice, History};
use tandem::{DType, DeviceKind};

/// The parser of `--cuda-dtype`: `bf16` or `f16`; anything else is a usage error that lists
/// the accepted values.
pub fn cuda_dtype_parser() -> impl TypedValueParser<Value = CudaDType> {
    PossibleValuesParser::new(CudaDType::ALL.map(|d| d.name())).try_map(|s| s.parse::<CudaDType>())
}

/// The parser of `--backend` where the planner may choose: `auto` or a [`DeviceKind`] (names
/// and aliases); anything else is a usage error that lists the accepted values.
pub fn backend_choice_parser() -> impl TypedValueParser<Value = BackendChoice> {
    let auto = PossibleValue::new("auto").help("The planner picks a device per op");
    let kinds = DeviceKind::value_variants()
        .iter()
        .filter_map(ValueEnum::to_possible_value);
    PossibleValuesParser::new(std::iter::once(auto).chain(kinds))
        .try_map(|s| s.parse::<BackendChoice>())
}

/// The parser of `--dtype` (the precision a workload's inputs and weights are rounded to):
/// one of the float dtypes; anything else is a usage error that lists them.
pub fn float_dtype_parser() -> impl TypedValueParser<Value = DType> {
    let floats = DType::ALL.into_iter().filter(|d| d.is_float());
    PossibleValuesParser::new(floats.map(|d| d.name())).try_map(|s| s.parse::<DType>())
}

/// The op-time history the planner learns from: the file `options` name (the user's cache,
/// unless `TANDEM_HISTORY=off`), else kept in memory only.
pub fn history(options: &tandem::options::Options) -> Arc<Mutex<History>> {
    Arc::new(Mutex::new(History::at(options.history.as_deref())))
}
