//! CUDA C++ sources of tandem's GPU kernels, embedded at build time, and their catalog.
//!
//! The host's CUDA backend compiles these with NVRTC at first use. Kernel entry points are
//! named `{op}_{precision}[_{dir}]` (for example `mha_bf16_fwd`, `rmsnorm_bf16`).
