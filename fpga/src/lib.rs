//! FPGA kernels of tandem: rust-hdl pipelines, golden fixed-point models, the `FpgaDevice` trait.
