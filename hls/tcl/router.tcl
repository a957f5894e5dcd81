# Vitis HLS: MoE router (top-k + softmax over the selected + expert histogram), Alveo U55C.
# Run from hls/:  vitis_hls -f tcl/router.tcl
set top router_kernel
open_project -reset build/router
set_top $top
add_files src/router.cpp -cflags "-Isrc -std=c++14"
add_files -tb tb/router_tb.cpp -cflags "-Isrc -Itb -std=c++14"
open_solution -reset solution1 -flow_target vitis
set_part xcu55c-fsvh2892-2L-e
create_clock -period 3.33 -name default
config_interface -m_axi_addr64
csim_design
csynth_design
export_design -format xo -output build/router_kernel.xo
exit
