//! Golden models: the exact fixed-point semantics of each kernel in plain Rust. The RTL
//! (Verilator), the HLS C++ (csim) and these models agree bit for bit.

pub mod attention;
pub mod experts;
pub mod gemm;
pub mod router;
pub mod vecops;
