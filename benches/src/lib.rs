//! Benchmarks of tandem live in `benches/benches` (criterion: `cpu_ops` times the CPU
//! reference path; `backend_ops` times every device kind found through `tandem::bench`, the
//! harness `tandem bench` uses); PyTorch peers in `benches/peers`.
