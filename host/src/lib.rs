//! tandem: runs transformer work (attention, MoE routing and experts, fused linear and norm
//! ops) across the CPU, NVIDIA GPUs and AMD/Xilinx Alveo FPGAs (or their Verilator
//! simulation), moving buffers between devices through one memory abstraction.
//!
//! The layers, bottom up: [`dtype`] and [`tensor`] (host data), [`ops`] (validation, CPU and
//! f64 reference of each op), [`backend`] (one module per device kind behind the
//! [`backend::Backend`] trait), [`memory`] (buffers with per-device replicas), [`graph`] and
//! [`workload`] (the DAG of ops), [`plan`] (where each op runs), [`exec`] (running the plan),
//! and [`report`].

pub mod backend;
pub mod dtype;
pub mod error;
pub mod memory;
pub mod ops;
pub mod sync;
pub mod tensor;

pub use backend::{Backend, DeviceId, DeviceKind, DeviceRegistry};
pub use dtype::DType;
pub use error::{Error, ErrorKind, Result};
pub use ops::Op;
pub use tensor::{Tensor, TensorMeta};
