//! Verilator simulation of tandem's FPGA kernels behind the `FpgaDevice` trait.
