# Vitis HLS: fused GEMM + bias + activation for the Alveo U55C.
# Run from hls/:  vitis_hls -f tcl/gemm.tcl
# csim runs tb/gemm_tb.cpp against vectors from the Rust golden model (tb/gemm_vectors.h).
set top gemm_kernel
open_project -reset build/gemm
set_top $top
add_files src/gemm.cpp -cflags "-Isrc -std=c++14"
add_files -tb tb/gemm_tb.cpp -cflags "-Isrc -Itb -std=c++14"
open_solution -reset solution1 -flow_target vitis
set_part xcu55c-fsvh2892-2L-e
create_clock -period 3.33 -name default
config_interface -m_axi_addr64
csim_design
csynth_design
export_design -format xo -output build/gemm_kernel.xo
exit
