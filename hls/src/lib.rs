//! Vitis HLS C++ sources of tandem's FPGA kernels and their C-simulation tests.
