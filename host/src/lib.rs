//! tandem: runs transformer work (attention, MoE routing and experts, fused linear and norm
//! ops) across the CPU, NVIDIA GPUs and AMD/Xilinx Alveo FPGAs (or their Verilator
//! simulation), moving buffers between devices through one memory abstraction.
//!
//! The layers, bottom up: [`dtype`] and [`tensor`] (host data), [`ops`] (validation, CPU and
//! f64 reference of each op), [`backend`] (one module per device kind behind the
//! [`backend::Backend`] trait), [`memory`] (buffers with per-device replicas), [`graph`] and
//! [`workload`] (the DAG of ops), [`plan`] (where each op runs), [`exec`] (running the plan;
//! [`resident`] keeps weights on the devices between runs), [`verify`] (errors against the
//! f64 reference) and [`report`]. [`bench`](mod@bench) times one op on one backend (`tandem bench`
//! and the criterion benches).
//!
//! Features: `cuda` (default) builds the CUDA backend; `cli` (default) adds what the
//! `tandem` binary needs (clap's `ValueEnum` on [`DeviceKind`] and [`OpKind`]; clap, anyhow
//! and tracing-subscriber). Library users can take `default-features = false`.

pub mod backend;
pub mod baseline;
pub mod bench;
pub mod dtype;
pub mod error;
pub mod exec;
pub mod files;
pub mod graph;
pub mod io;
pub mod limits;
pub mod memory;
pub mod ops;
pub mod options;
pub mod plan;
pub mod progress;
pub mod report;
pub mod resident;
pub mod run;
pub mod serve;
pub mod sync;
pub mod tensor;
pub mod verify;
pub mod workload;

pub use backend::{Backend, DeviceId, DeviceKind, DeviceRegistry};
pub use dtype::DType;
pub use error::{Error, ErrorKind, Result};
pub use ops::{Op, OpKind};
pub use tensor::{Tensor, TensorMeta};
