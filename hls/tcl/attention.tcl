# Vitis HLS: streaming attention (one head per call) for the Alveo U55C.
# Run from hls/:  vitis_hls -f tcl/attention.tcl
set top attention_kernel
open_project -reset build/attention
set_top $top
add_files src/attention.cpp -cflags "-Isrc -std=c++14"
add_files -tb tb/attention_tb.cpp -cflags "-Isrc -Itb -std=c++14"
open_solution -reset solution1 -flow_target vitis
set_part xcu55c-fsvh2892-2L-e
create_clock -period 3.33 -name default
config_interface -m_axi_addr64
csim_design
csynth_design
export_design -format xo -output build/attention_kernel.xo
exit
