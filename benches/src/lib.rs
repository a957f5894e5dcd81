//! Benchmarks of tandem live in `benches/benches`; PyTorch peers in `benches/peers`.
