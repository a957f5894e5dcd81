//! The `tandem` subcommands, one file each.

pub mod baselines;
pub mod bench;
pub mod calibrate;
pub mod compare;
pub mod decode;
pub mod devices;
pub mod fpga;
pub mod history;
pub mod model;
pub mod op;
pub mod overhead;
pub mod placement;
pub mod render;
pub mod run;
pub mod serve_bench;

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

/// The device kinds this binary can drive (`--version`, `devices --json`): the CPU, CUDA
/// where built with the `cuda` feature, the Verilator simulation and XRT boards (both found
/// at run time).
pub fn compiled_device_kinds() -> Vec<&'static str> {
    DeviceKind::ALL
        .into_iter()
        .filter(|k| cfg!(feature = "cuda") || *k != DeviceKind::Cuda)
        .map(DeviceKind::name)
        .collect()
}

/// The environment variables tandem reads, for `--help`.
pub const ENVIRONMENT_HELP: &str = "\
Environment:
  TANDEM_LOG             log filter (tracing's EnvFilter: error, warn, info, debug, tandem=debug); default warn
  TANDEM_HISTORY         off/0/false: do not learn op times across runs (default on)
  TANDEM_CALIBRATION     off/0: do not use `tandem calibrate`'s measurements; or the file to use
                         (default <cache>/calibration/<host name>.json)
  TANDEM_MAX_MEMORY      host memory a run may allocate (bytes, or with K/M/G/T)
  TANDEM_MEMORY_LIMIT    memory per device, e.g. cuda:0=8GiB,fpga-sim:0=2GiB,cpu=32G (flag --memory-limit)
  TANDEM_CACHE_DIR       tandem's cache folder: cuda/ (CUBINs), sim/ (Verilator builds), baselines/,
                         history.json; default $XDG_CACHE_HOME/tandem, else ~/.cache/tandem
  TANDEM_SIM_CACHE_DIR   the simulator's builds only (default $TANDEM_CACHE_DIR/sim)
  TANDEM_CUDA_DTYPE      GPU storage precision: bf16 (default) or f16 (flag --cuda-dtype)
  TANDEM_KERNEL_DIR      CUDA kernel sources to use instead of the embedded ones
  TANDEM_ATTN_VARIANT, TANDEM_MOE_EXPERTS, TANDEM_MOE_TILE
                         CUDA kernel choices (see docs/gpu-notes.md)
  CUDA_HOME, CUDA_PATH   CUDA toolkit folders (NVRTC, headers)
  TANDEM_FPGA_CLOCK_MHZ  FPGA kernel clock for device time (default: each build's target)
  TANDEM_FPGA_SIM_MODE   fpga-sim: auto (default: RTL up to 2^22 cycles, modelled above), rtl, model
  TANDEM_CPU_BLAS        CPU matrix products: auto (OpenBLAS/MKL if found), off, or a library path
  TANDEM_CPU_THREADS     CPU threads (default: the cores, one fewer while a simulated card runs)
  CXX                    C++ compiler of the Verilator builds (default g++)
  XILINX_XRT, TANDEM_XRT_LIB, TANDEM_XCLBIN_DIR, XCL_EMULATION_MODE
                         XRT install, its library folder, the boards' xclbins, XRT emulation
Progress goes to stderr: bars on a terminal, plain 'tandem: ...' lines otherwise.";
