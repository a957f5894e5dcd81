#!/bin/sh
# Remakes gemm_u55c.xclbin and xclbinutil's own reading of it (the .txt/.json files beside
# it), which fpga/tests/xclbin.rs compares tandem's reader against. Needs a working
# xclbinutil (XRT 2.13; see docs/FPGA.md on Debian's libxrt-utils). Run from this folder.
# The sections are what `tandem fpga package --kernel gemm --platform u55c` asks v++ for:
# gemm_1 at 0x800000, its four buffer arguments on HBM[0] (one bank per AXI port), the
# U55C's 32 HBM pseudo-channels of 512 MiB, DATA_CLK 300 MHz; gemm_kernel.xml is
# `tandem fpga emit --kernel gemm`'s kernel.xml.
set -e
rm -f gemm_u55c.xclbin
xclbinutil --quiet \
  --add-section IP_LAYOUT:JSON:ip.json \
  --add-section MEM_TOPOLOGY:JSON:mem.json \
  --add-section CONNECTIVITY:JSON:conn.json \
  --add-section EMBEDDED_METADATA:RAW:gemm_kernel.xml \
  --add-section CLOCK_FREQ_TOPOLOGY:JSON:clk.json \
  --key-value SYS:PlatformVBNV:xilinx_u55c_gen3x16_xdma_3_202210_1 \
  --output gemm_u55c.xclbin
test -f gemm_u55c.xclbin
xclbinutil --quiet --input gemm_u55c.xclbin --info gemm_u55c.info.txt
for s in IP_LAYOUT MEM_TOPOLOGY CONNECTIVITY CLOCK_FREQ_TOPOLOGY; do
  rm -f "gemm_u55c.$s.json"
  xclbinutil --quiet --input gemm_u55c.xclbin --dump-section "$s:JSON:gemm_u55c.$s.json"
done
