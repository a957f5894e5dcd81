# Packages an emitted tandem kernel (tandem fpga emit --kernel NAME --out DIR) as a Vitis .xo.
# Usage: vivado -mode batch -source package_xo.tcl -tclargs <emit dir> <kernel name> <out.xo> <part>
# e.g.   vivado -mode batch -source package_xo.tcl -tclargs build/router router router.xo xcu55c-fsvh2892-2L-e
# The port names (ap_clk, ap_rst_n, s_axi_control_*, m_axi_gmem_*, interrupt) follow Vitis
# conventions, so IP packager infers the interfaces; kernel.xml comes from the same Rust
# description as the register decode.
set dir    [lindex $argv 0]
set kernel [lindex $argv 1]
set xo     [lindex $argv 2]
set part   [lindex $argv 3]
set ipdir  [file join $dir ip]

create_project -force kpkg [file join $dir kpkg] -part $part
add_files -norecurse [file join $dir ${kernel}.v]
set_property top $kernel [current_fileset]
update_compile_order -fileset sources_1
ipx::package_project -root_dir $ipdir -vendor tandem -library kernel -taxonomy /KernelIP -import_files -set_current false
ipx::unload_core [file join $ipdir component.xml]
ipx::edit_ip_in_project -upgrade true -name tmp_edit -directory $ipdir [file join $ipdir component.xml]
set core [ipx::current_core]
set_property core_revision 1 $core
foreach up [ipx::get_user_parameters] { ipx::remove_user_parameter [get_property NAME $up] $core }
ipx::associate_bus_interfaces -busif s_axi_control -clock ap_clk $core
# Every AXI master (m_axi_gmem, m_axi_gmem0, ...) runs on ap_clk.
foreach busif [ipx::get_bus_interfaces -of_objects $core m_axi_*] {
  ipx::associate_bus_interfaces -busif [get_property NAME $busif] -clock ap_clk $core
}
set_property sdx_kernel true $core
set_property sdx_kernel_type rtl $core
set_property ipi_drc {ignore_freq_hz true} $core
set_property vitis_drc {ctrl_protocol ap_ctrl_hs} $core
ipx::create_xgui_files $core
ipx::update_checksums $core
ipx::check_integrity -kernel $core
ipx::save_core $core
close_project -delete
package_xo -force -xo_path $xo -kernel_name $kernel -ip_directory $ipdir -kernel_xml [file join $dir kernel.xml]
