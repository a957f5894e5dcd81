//! The packaged top: Vitis port names outside, control block, burst engines and the core
//! inside, wired in rust-hdl.

use rust_hdl::prelude::*;

use super::axi_read::ReadMaster;
use super::axi_write::WriteMaster;
use super::ctrl::ControlRegs;
use super::read_fanout::ReadFanout;
use super::socket::CoreSocket;

/// Defines a Vitis shell struct: the ports and blocks every kernel has (control, the
/// read/write master of `m_axi_gmem`, the core), plus the `extra` fields and `wiring` of a
/// variant. Each variant writes its own `update` (rust-hdl's `hdl_gen` cannot take a
/// `self` handed through a macro).
macro_rules! vitis_shell {
    (
        $(#[$doc:meta])*
        $name:ident($mb:ident) {
            extra { $( $(#[$fdoc:meta])* $field:ident : $fty:ty = $finit:expr ),* $(,)? }
        }
    ) => {
        $(#[$doc])*
        #[derive(LogicBlock)]
        pub struct $name<const W: usize, const S: usize> {
            /// Kernel clock.
            pub ap_clk: Signal<In, Clock>,
            /// Active-low synchronous reset.
            pub ap_rst_n: Signal<In, Bit>,
            /// AXI4-Lite `awvalid`.
            pub s_axi_control_awvalid: Signal<In, Bit>,
            /// AXI4-Lite `awready`.
            pub s_axi_control_awready: Signal<Out, Bit>,
            /// AXI4-Lite `awaddr`.
            pub s_axi_control_awaddr: Signal<In, Bits<12>>,
            /// AXI4-Lite `wvalid`.
            pub s_axi_control_wvalid: Signal<In, Bit>,
            /// AXI4-Lite `wready`.
            pub s_axi_control_wready: Signal<Out, Bit>,
            /// AXI4-Lite `wdata`.
            pub s_axi_control_wdata: Signal<In, Bits<32>>,
            /// AXI4-Lite `wstrb`.
            pub s_axi_control_wstrb: Signal<In, Bits<4>>,
            /// AXI4-Lite `bvalid`.
            pub s_axi_control_bvalid: Signal<Out, Bit>,
            /// AXI4-Lite `bready`.
            pub s_axi_control_bready: Signal<In, Bit>,
            /// AXI4-Lite `bresp`.
            pub s_axi_control_bresp: Signal<Out, Bits<2>>,
            /// AXI4-Lite `arvalid`.
            pub s_axi_control_arvalid: Signal<In, Bit>,
            /// AXI4-Lite `arready`.
            pub s_axi_control_arready: Signal<Out, Bit>,
            /// AXI4-Lite `araddr`.
            pub s_axi_control_araddr: Signal<In, Bits<12>>,
            /// AXI4-Lite `rvalid`.
            pub s_axi_control_rvalid: Signal<Out, Bit>,
            /// AXI4-Lite `rready`.
            pub s_axi_control_rready: Signal<In, Bit>,
            /// AXI4-Lite `rdata`.
            pub s_axi_control_rdata: Signal<Out, Bits<32>>,
            /// AXI4-Lite `rresp`.
            pub s_axi_control_rresp: Signal<Out, Bits<2>>,
            /// AXI4 master `awvalid`.
            pub m_axi_gmem_awvalid: Signal<Out, Bit>,
            /// AXI4 master `awready`.
            pub m_axi_gmem_awready: Signal<In, Bit>,
            /// AXI4 master `awaddr`.
            pub m_axi_gmem_awaddr: Signal<Out, Bits<64>>,
            /// AXI4 master `awlen`.
            pub m_axi_gmem_awlen: Signal<Out, Bits<8>>,
            /// AXI4 master `awsize`.
            pub m_axi_gmem_awsize: Signal<Out, Bits<3>>,
            /// AXI4 master `awburst`.
            pub m_axi_gmem_awburst: Signal<Out, Bits<2>>,
            /// AXI4 master `wvalid`.
            pub m_axi_gmem_wvalid: Signal<Out, Bit>,
            /// AXI4 master `wready`.
            pub m_axi_gmem_wready: Signal<In, Bit>,
            /// AXI4 master `wdata`.
            pub m_axi_gmem_wdata: Signal<Out, Bits<W>>,
            /// AXI4 master `wstrb`.
            pub m_axi_gmem_wstrb: Signal<Out, Bits<S>>,
            /// AXI4 master `wlast`.
            pub m_axi_gmem_wlast: Signal<Out, Bit>,
            /// AXI4 master `bvalid`.
            pub m_axi_gmem_bvalid: Signal<In, Bit>,
            /// AXI4 master `bready`.
            pub m_axi_gmem_bready: Signal<Out, Bit>,
            /// AXI4 master `bresp`.
            pub m_axi_gmem_bresp: Signal<In, Bits<2>>,
            /// AXI4 master `arvalid`.
            pub m_axi_gmem_arvalid: Signal<Out, Bit>,
            /// AXI4 master `arready`.
            pub m_axi_gmem_arready: Signal<In, Bit>,
            /// AXI4 master `araddr`.
            pub m_axi_gmem_araddr: Signal<Out, Bits<64>>,
            /// AXI4 master `arlen`.
            pub m_axi_gmem_arlen: Signal<Out, Bits<8>>,
            /// AXI4 master `arsize`.
            pub m_axi_gmem_arsize: Signal<Out, Bits<3>>,
            /// AXI4 master `arburst`.
            pub m_axi_gmem_arburst: Signal<Out, Bits<2>>,
            /// AXI4 master `rvalid`.
            pub m_axi_gmem_rvalid: Signal<In, Bit>,
            /// AXI4 master `rready`.
            pub m_axi_gmem_rready: Signal<Out, Bit>,
            /// AXI4 master `rdata`.
            pub m_axi_gmem_rdata: Signal<In, Bits<W>>,
            /// AXI4 master `rlast`.
            pub m_axi_gmem_rlast: Signal<In, Bit>,
            /// AXI4 master `rresp`.
            pub m_axi_gmem_rresp: Signal<In, Bits<2>>,
            /// Interrupt (level, active high).
            pub interrupt: Signal<Out, Bit>,
            $( $(#[$fdoc])* pub $field: $fty, )*
            ctrl: ControlRegs,
            rd: ReadMaster<W>,
            wr: WriteMaster<W, S>,
            core: CoreSocket<W, S>,
        }

        impl<const W: usize, const S: usize> $name<W, S> {
            /// The shell around `core`, with `ctrl` decoding its arguments; `W`-bit AXI data
            /// (`S = W / 8` strobes), bursts of at most `max_burst` beats.
            pub fn new(ctrl: ControlRegs, core: CoreSocket<W, S>, $mb: u32) -> Self {
                Self {
                ap_clk: Default::default(),
                ap_rst_n: Default::default(),
                s_axi_control_awvalid: Default::default(),
                s_axi_control_awready: Default::default(),
                s_axi_control_awaddr: Default::default(),
                s_axi_control_wvalid: Default::default(),
                s_axi_control_wready: Default::default(),
                s_axi_control_wdata: Default::default(),
                s_axi_control_wstrb: Default::default(),
                s_axi_control_bvalid: Default::default(),
                s_axi_control_bready: Default::default(),
                s_axi_control_bresp: Default::default(),
                s_axi_control_arvalid: Default::default(),
                s_axi_control_arready: Default::default(),
                s_axi_control_araddr: Default::default(),
                s_axi_control_rvalid: Default::default(),
                s_axi_control_rready: Default::default(),
                s_axi_control_rdata: Default::default(),
                s_axi_control_rresp: Default::default(),
                m_axi_gmem_awvalid: Default::default(),
                m_axi_gmem_awready: Default::default(),
                m_axi_gmem_awaddr: Default::default(),
                m_axi_gmem_awlen: Default::default(),
                m_axi_gmem_awsize: Default::default(),
                m_axi_gmem_awburst: Default::default(),
                m_axi_gmem_wvalid: Default::default(),
                m_axi_gmem_wready: Default::default(),
                m_axi_gmem_wdata: Default::default(),
                m_axi_gmem_wstrb: Default::default(),
                m_axi_gmem_wlast: Default::default(),
                m_axi_gmem_bvalid: Default::default(),
                m_axi_gmem_bready: Default::default(),
                m_axi_gmem_bresp: Default::default(),
                m_axi_gmem_arvalid: Default::default(),
                m_axi_gmem_arready: Default::default(),
                m_axi_gmem_araddr: Default::default(),
                m_axi_gmem_arlen: Default::default(),
                m_axi_gmem_arsize: Default::default(),
                m_axi_gmem_arburst: Default::default(),
                m_axi_gmem_rvalid: Default::default(),
                m_axi_gmem_rready: Default::default(),
                m_axi_gmem_rdata: Default::default(),
                m_axi_gmem_rlast: Default::default(),
                m_axi_gmem_rresp: Default::default(),
                interrupt: Default::default(),
                    $( $field: $finit, )*
                    ctrl,
                    rd: ReadMaster::new($mb),
                    wr: WriteMaster::new($mb),
                    core,
                }
            }
        }
    };
}

vitis_shell! {
    /// The Vitis RTL kernel with `W`-bit `m_axi_gmem` data (`S = W / 8` strobes): `ap_clk`,
    /// `ap_rst_n`, `s_axi_control_*`, `m_axi_gmem_*`, `interrupt`; the core's read port is
    /// `m_axi_gmem`'s read engine.
    VitisShell(max_burst) {
        extra {}
    }
}

impl<const W: usize, const S: usize> Logic for VitisShell<W, S> {
    #[hdl_gen]
    fn update(&mut self) {
        self.ctrl.clock.next = self.ap_clk.val();
        self.ctrl.reset.next = !self.ap_rst_n.val();
        self.rd.clock.next = self.ap_clk.val();
        self.rd.reset.next = !self.ap_rst_n.val();
        self.wr.clock.next = self.ap_clk.val();
        self.wr.reset.next = !self.ap_rst_n.val();
        self.core.clock.next = self.ap_clk.val();
        self.core.reset.next = !self.ap_rst_n.val();
        self.ctrl.awvalid.next = self.s_axi_control_awvalid.val();
        self.s_axi_control_awready.next = self.ctrl.awready.val();
        self.ctrl.awaddr.next = self.s_axi_control_awaddr.val();
        self.ctrl.wvalid.next = self.s_axi_control_wvalid.val();
        self.s_axi_control_wready.next = self.ctrl.wready.val();
        self.ctrl.wdata.next = self.s_axi_control_wdata.val();
        self.ctrl.wstrb.next = self.s_axi_control_wstrb.val();
        self.s_axi_control_bvalid.next = self.ctrl.bvalid.val();
        self.ctrl.bready.next = self.s_axi_control_bready.val();
        self.s_axi_control_bresp.next = self.ctrl.bresp.val();
        self.ctrl.arvalid.next = self.s_axi_control_arvalid.val();
        self.s_axi_control_arready.next = self.ctrl.arready.val();
        self.ctrl.araddr.next = self.s_axi_control_araddr.val();
        self.s_axi_control_rvalid.next = self.ctrl.rvalid.val();
        self.ctrl.rready.next = self.s_axi_control_rready.val();
        self.s_axi_control_rdata.next = self.ctrl.rdata.val();
        self.s_axi_control_rresp.next = self.ctrl.rresp.val();
        self.interrupt.next = self.ctrl.interrupt.val();
        self.m_axi_gmem_arvalid.next = self.rd.arvalid.val();
        self.rd.arready.next = self.m_axi_gmem_arready.val();
        self.m_axi_gmem_araddr.next = self.rd.araddr.val();
        self.m_axi_gmem_arlen.next = self.rd.arlen.val();
        self.m_axi_gmem_arsize.next = self.rd.arsize.val();
        self.m_axi_gmem_arburst.next = self.rd.arburst.val();
        self.rd.rvalid.next = self.m_axi_gmem_rvalid.val();
        self.m_axi_gmem_rready.next = self.rd.rready.val();
        self.rd.rdata.next = self.m_axi_gmem_rdata.val();
        self.rd.rlast.next = self.m_axi_gmem_rlast.val();
        self.rd.rresp.next = self.m_axi_gmem_rresp.val();
        self.m_axi_gmem_awvalid.next = self.wr.awvalid.val();
        self.wr.awready.next = self.m_axi_gmem_awready.val();
        self.m_axi_gmem_awaddr.next = self.wr.awaddr.val();
        self.m_axi_gmem_awlen.next = self.wr.awlen.val();
        self.m_axi_gmem_awsize.next = self.wr.awsize.val();
        self.m_axi_gmem_awburst.next = self.wr.awburst.val();
        self.m_axi_gmem_wvalid.next = self.wr.wvalid.val();
        self.wr.wready.next = self.m_axi_gmem_wready.val();
        self.m_axi_gmem_wdata.next = self.wr.wdata.val();
        self.m_axi_gmem_wstrb.next = self.wr.wstrb.val();
        self.m_axi_gmem_wlast.next = self.wr.wlast.val();
        self.wr.bvalid.next = self.m_axi_gmem_bvalid.val();
        self.m_axi_gmem_bready.next = self.wr.bready.val();
        self.wr.bresp.next = self.m_axi_gmem_bresp.val();
        self.core.start.next = self.ctrl.core_start.val();
        self.ctrl.core_done.next = self.core.done.val();
        self.ctrl.wr_idle.next = self.wr.idle.val();
        self.ctrl.core_busy.next = self.core.busy.val();
        self.core.arg0.next = self.ctrl.arg0.val();
        self.core.arg1.next = self.ctrl.arg1.val();
        self.core.arg2.next = self.ctrl.arg2.val();
        self.core.arg3.next = self.ctrl.arg3.val();
        self.core.arg4.next = self.ctrl.arg4.val();
        self.core.arg5.next = self.ctrl.arg5.val();
        self.core.arg6.next = self.ctrl.arg6.val();
        self.core.arg7.next = self.ctrl.arg7.val();
        self.core.ptr0.next = self.ctrl.ptr0.val();
        self.core.ptr1.next = self.ctrl.ptr1.val();
        self.core.ptr2.next = self.ctrl.ptr2.val();
        self.core.ptr3.next = self.ctrl.ptr3.val();
        self.core.ptr4.next = self.ctrl.ptr4.val();
        self.core.ptr5.next = self.ctrl.ptr5.val();
        self.core.ptr6.next = self.ctrl.ptr6.val();
        self.core.ptr7.next = self.ctrl.ptr7.val();
        // the core's read port is m_axi_gmem's read engine
        self.rd.req_valid.next = self.core.rd_req_valid.val();
        self.rd.req_addr.next = self.core.rd_req_addr.val();
        self.rd.req_len.next = self.core.rd_req_len.val();
        self.rd.data_ready.next = self.core.rd_data_ready.val();
        self.core.rd_req_ready.next = self.rd.req_ready.val();
        self.core.rd_data_valid.next = self.rd.data_valid.val();
        self.core.rd_data.next = self.rd.data.val();
        self.wr.req_valid.next = self.core.wr_req_valid.val();
        self.wr.req_addr.next = self.core.wr_req_addr.val();
        self.wr.req_len.next = self.core.wr_req_len.val();
        self.wr.data_valid.next = self.core.wr_data_valid.val();
        self.wr.data.next = self.core.wr_data.val();
        self.wr.strb.next = self.core.wr_strb.val();
        self.core.wr_req_ready.next = self.wr.req_ready.val();
        self.core.wr_data_ready.next = self.wr.data_ready.val();
    }
}

vitis_shell! {
    /// The Vitis RTL kernel of a core that reads through three AXI4 masters: everything
    /// [`VitisShell`] has, plus the read-only `m_axi_gmem1_*` and `m_axi_gmem2_*` (AR and R
    /// channels), each with its own read engine; the core names a request's master in bits
    /// 63:62 of its address ([`ReadFanout`]). Writes go through `m_axi_gmem`.
    VitisShellMulti(max_burst) {
        extra {
            /// Read-only AXI4 master 1: AR valid.
            m_axi_gmem1_arvalid: Signal<Out, Bit> = Default::default(),
            /// Read-only AXI4 master 1: AR ready.
            m_axi_gmem1_arready: Signal<In, Bit> = Default::default(),
            /// Read-only AXI4 master 1: AR address.
            m_axi_gmem1_araddr: Signal<Out, Bits<64>> = Default::default(),
            /// Read-only AXI4 master 1: AR burst length - 1.
            m_axi_gmem1_arlen: Signal<Out, Bits<8>> = Default::default(),
            /// Read-only AXI4 master 1: AR beat size.
            m_axi_gmem1_arsize: Signal<Out, Bits<3>> = Default::default(),
            /// Read-only AXI4 master 1: AR burst type.
            m_axi_gmem1_arburst: Signal<Out, Bits<2>> = Default::default(),
            /// Read-only AXI4 master 1: R valid.
            m_axi_gmem1_rvalid: Signal<In, Bit> = Default::default(),
            /// Read-only AXI4 master 1: R ready.
            m_axi_gmem1_rready: Signal<Out, Bit> = Default::default(),
            /// Read-only AXI4 master 1: R data.
            m_axi_gmem1_rdata: Signal<In, Bits<W>> = Default::default(),
            /// Read-only AXI4 master 1: R last.
            m_axi_gmem1_rlast: Signal<In, Bit> = Default::default(),
            /// Read-only AXI4 master 1: R response.
            m_axi_gmem1_rresp: Signal<In, Bits<2>> = Default::default(),
            /// Read-only AXI4 master 2: AR valid.
            m_axi_gmem2_arvalid: Signal<Out, Bit> = Default::default(),
            /// Read-only AXI4 master 2: AR ready.
            m_axi_gmem2_arready: Signal<In, Bit> = Default::default(),
            /// Read-only AXI4 master 2: AR address.
            m_axi_gmem2_araddr: Signal<Out, Bits<64>> = Default::default(),
            /// Read-only AXI4 master 2: AR burst length - 1.
            m_axi_gmem2_arlen: Signal<Out, Bits<8>> = Default::default(),
            /// Read-only AXI4 master 2: AR beat size.
            m_axi_gmem2_arsize: Signal<Out, Bits<3>> = Default::default(),
            /// Read-only AXI4 master 2: AR burst type.
            m_axi_gmem2_arburst: Signal<Out, Bits<2>> = Default::default(),
            /// Read-only AXI4 master 2: R valid.
            m_axi_gmem2_rvalid: Signal<In, Bit> = Default::default(),
            /// Read-only AXI4 master 2: R ready.
            m_axi_gmem2_rready: Signal<Out, Bit> = Default::default(),
            /// Read-only AXI4 master 2: R data.
            m_axi_gmem2_rdata: Signal<In, Bits<W>> = Default::default(),
            /// Read-only AXI4 master 2: R last.
            m_axi_gmem2_rlast: Signal<In, Bit> = Default::default(),
            /// Read-only AXI4 master 2: R response.
            m_axi_gmem2_rresp: Signal<In, Bits<2>> = Default::default(),
            /// The read fan-out over the three read engines.
            fan: ReadFanout<W> = ReadFanout::default(),
            /// The read engine of `m_axi_gmem1`.
            rd1: ReadMaster<W> = ReadMaster::new(max_burst),
            /// The read engine of `m_axi_gmem2`.
            rd2: ReadMaster<W> = ReadMaster::new(max_burst),
        }
    }
}

impl<const W: usize, const S: usize> Logic for VitisShellMulti<W, S> {
    #[hdl_gen]
    fn update(&mut self) {
        self.ctrl.clock.next = self.ap_clk.val();
        self.ctrl.reset.next = !self.ap_rst_n.val();
        self.rd.clock.next = self.ap_clk.val();
        self.rd.reset.next = !self.ap_rst_n.val();
        self.wr.clock.next = self.ap_clk.val();
        self.wr.reset.next = !self.ap_rst_n.val();
        self.core.clock.next = self.ap_clk.val();
        self.core.reset.next = !self.ap_rst_n.val();
        self.ctrl.awvalid.next = self.s_axi_control_awvalid.val();
        self.s_axi_control_awready.next = self.ctrl.awready.val();
        self.ctrl.awaddr.next = self.s_axi_control_awaddr.val();
        self.ctrl.wvalid.next = self.s_axi_control_wvalid.val();
        self.s_axi_control_wready.next = self.ctrl.wready.val();
        self.ctrl.wdata.next = self.s_axi_control_wdata.val();
        self.ctrl.wstrb.next = self.s_axi_control_wstrb.val();
        self.s_axi_control_bvalid.next = self.ctrl.bvalid.val();
        self.ctrl.bready.next = self.s_axi_control_bready.val();
        self.s_axi_control_bresp.next = self.ctrl.bresp.val();
        self.ctrl.arvalid.next = self.s_axi_control_arvalid.val();
        self.s_axi_control_arready.next = self.ctrl.arready.val();
        self.ctrl.araddr.next = self.s_axi_control_araddr.val();
        self.s_axi_control_rvalid.next = self.ctrl.rvalid.val();
        self.ctrl.rready.next = self.s_axi_control_rready.val();
        self.s_axi_control_rdata.next = self.ctrl.rdata.val();
        self.s_axi_control_rresp.next = self.ctrl.rresp.val();
        self.interrupt.next = self.ctrl.interrupt.val();
        self.m_axi_gmem_arvalid.next = self.rd.arvalid.val();
        self.rd.arready.next = self.m_axi_gmem_arready.val();
        self.m_axi_gmem_araddr.next = self.rd.araddr.val();
        self.m_axi_gmem_arlen.next = self.rd.arlen.val();
        self.m_axi_gmem_arsize.next = self.rd.arsize.val();
        self.m_axi_gmem_arburst.next = self.rd.arburst.val();
        self.rd.rvalid.next = self.m_axi_gmem_rvalid.val();
        self.m_axi_gmem_rready.next = self.rd.rready.val();
        self.rd.rdata.next = self.m_axi_gmem_rdata.val();
        self.rd.rlast.next = self.m_axi_gmem_rlast.val();
        self.rd.rresp.next = self.m_axi_gmem_rresp.val();
        self.m_axi_gmem_awvalid.next = self.wr.awvalid.val();
        self.wr.awready.next = self.m_axi_gmem_awready.val();
        self.m_axi_gmem_awaddr.next = self.wr.awaddr.val();
        self.m_axi_gmem_awlen.next = self.wr.awlen.val();
        self.m_axi_gmem_awsize.next = self.wr.awsize.val();
        self.m_axi_gmem_awburst.next = self.wr.awburst.val();
        self.m_axi_gmem_wvalid.next = self.wr.wvalid.val();
        self.wr.wready.next = self.m_axi_gmem_wready.val();
        self.m_axi_gmem_wdata.next = self.wr.wdata.val();
        self.m_axi_gmem_wstrb.next = self.wr.wstrb.val();
        self.m_axi_gmem_wlast.next = self.wr.wlast.val();
        self.wr.bvalid.next = self.m_axi_gmem_bvalid.val();
        self.m_axi_gmem_bready.next = self.wr.bready.val();
        self.wr.bresp.next = self.m_axi_gmem_bresp.val();
        self.core.start.next = self.ctrl.core_start.val();
        self.ctrl.core_done.next = self.core.done.val();
        self.ctrl.wr_idle.next = self.wr.idle.val();
        self.ctrl.core_busy.next = self.core.busy.val();
        self.core.arg0.next = self.ctrl.arg0.val();
        self.core.arg1.next = self.ctrl.arg1.val();
        self.core.arg2.next = self.ctrl.arg2.val();
        self.core.arg3.next = self.ctrl.arg3.val();
        self.core.arg4.next = self.ctrl.arg4.val();
        self.core.arg5.next = self.ctrl.arg5.val();
        self.core.arg6.next = self.ctrl.arg6.val();
        self.core.arg7.next = self.ctrl.arg7.val();
        self.core.ptr0.next = self.ctrl.ptr0.val();
        self.core.ptr1.next = self.ctrl.ptr1.val();
        self.core.ptr2.next = self.ctrl.ptr2.val();
        self.core.ptr3.next = self.ctrl.ptr3.val();
        self.core.ptr4.next = self.ctrl.ptr4.val();
        self.core.ptr5.next = self.ctrl.ptr5.val();
        self.core.ptr6.next = self.ctrl.ptr6.val();
        self.core.ptr7.next = self.ctrl.ptr7.val();
        // the core's read port reaches the three read engines through the fan-out
        self.fan.clock.next = self.ap_clk.val();
        self.fan.reset.next = !self.ap_rst_n.val();
        self.fan.req_valid.next = self.core.rd_req_valid.val();
        self.fan.req_addr.next = self.core.rd_req_addr.val();
        self.fan.req_len.next = self.core.rd_req_len.val();
        self.fan.data_ready.next = self.core.rd_data_ready.val();
        self.core.rd_req_ready.next = self.fan.req_ready.val();
        self.core.rd_data_valid.next = self.fan.data_valid.val();
        self.core.rd_data.next = self.fan.data.val();
        self.rd.req_valid.next = self.fan.m0_req_valid.val();
        self.rd.req_addr.next = self.fan.m_req_addr.val();
        self.rd.req_len.next = self.fan.m_req_len.val();
        self.rd.data_ready.next = self.fan.m0_data_ready.val();
        self.fan.m0_req_ready.next = self.rd.req_ready.val();
        self.fan.m0_data_valid.next = self.rd.data_valid.val();
        self.fan.m0_data.next = self.rd.data.val();
        self.rd1.clock.next = self.ap_clk.val();
        self.rd1.reset.next = !self.ap_rst_n.val();
        self.rd1.req_valid.next = self.fan.m1_req_valid.val();
        self.rd1.req_addr.next = self.fan.m_req_addr.val();
        self.rd1.req_len.next = self.fan.m_req_len.val();
        self.rd1.data_ready.next = self.fan.m1_data_ready.val();
        self.fan.m1_req_ready.next = self.rd1.req_ready.val();
        self.fan.m1_data_valid.next = self.rd1.data_valid.val();
        self.fan.m1_data.next = self.rd1.data.val();
        self.m_axi_gmem1_arvalid.next = self.rd1.arvalid.val();
        self.rd1.arready.next = self.m_axi_gmem1_arready.val();
        self.m_axi_gmem1_araddr.next = self.rd1.araddr.val();
        self.m_axi_gmem1_arlen.next = self.rd1.arlen.val();
        self.m_axi_gmem1_arsize.next = self.rd1.arsize.val();
        self.m_axi_gmem1_arburst.next = self.rd1.arburst.val();
        self.rd1.rvalid.next = self.m_axi_gmem1_rvalid.val();
        self.m_axi_gmem1_rready.next = self.rd1.rready.val();
        self.rd1.rdata.next = self.m_axi_gmem1_rdata.val();
        self.rd1.rlast.next = self.m_axi_gmem1_rlast.val();
        self.rd1.rresp.next = self.m_axi_gmem1_rresp.val();
        self.rd2.clock.next = self.ap_clk.val();
        self.rd2.reset.next = !self.ap_rst_n.val();
        self.rd2.req_valid.next = self.fan.m2_req_valid.val();
        self.rd2.req_addr.next = self.fan.m_req_addr.val();
        self.rd2.req_len.next = self.fan.m_req_len.val();
        self.rd2.data_ready.next = self.fan.m2_data_ready.val();
        self.fan.m2_req_ready.next = self.rd2.req_ready.val();
        self.fan.m2_data_valid.next = self.rd2.data_valid.val();
        self.fan.m2_data.next = self.rd2.data.val();
        self.m_axi_gmem2_arvalid.next = self.rd2.arvalid.val();
        self.rd2.arready.next = self.m_axi_gmem2_arready.val();
        self.m_axi_gmem2_araddr.next = self.rd2.araddr.val();
        self.m_axi_gmem2_arlen.next = self.rd2.arlen.val();
        self.m_axi_gmem2_arsize.next = self.rd2.arsize.val();
        self.m_axi_gmem2_arburst.next = self.rd2.arburst.val();
        self.rd2.rvalid.next = self.m_axi_gmem2_rvalid.val();
        self.m_axi_gmem2_rready.next = self.rd2.rready.val();
        self.rd2.rdata.next = self.m_axi_gmem2_rdata.val();
        self.rd2.rlast.next = self.m_axi_gmem2_rlast.val();
        self.rd2.rresp.next = self.m_axi_gmem2_rresp.val();
        self.wr.req_valid.next = self.core.wr_req_valid.val();
        self.wr.req_addr.next = self.core.wr_req_addr.val();
        self.wr.req_len.next = self.core.wr_req_len.val();
        self.wr.data_valid.next = self.core.wr_data_valid.val();
        self.wr.data.next = self.core.wr_data.val();
        self.wr.strb.next = self.core.wr_strb.val();
        self.core.wr_req_ready.next = self.wr.req_ready.val();
        self.core.wr_data_ready.next = self.wr.data_ready.val();
    }
}
