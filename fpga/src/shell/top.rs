//! The packaged top: Vitis port names outside, control block, burst engines and the core
//! inside, wired in rust-hdl.

use rust_hdl::prelude::*;

use super::axi_read::ReadMaster;
use super::axi_write::WriteMaster;
use super::ctrl::ControlRegs;
use super::socket::CoreSocket;

/// The Vitis RTL kernel with `W`-bit `m_axi_gmem` data (`S = W / 8` strobes): `ap_clk`, `ap_rst_n`, `s_axi_control_*`, `m_axi_gmem_*`, `interrupt`.
#[derive(LogicBlock)]
pub struct VitisShell<const W: usize, const S: usize> {
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
    ctrl: ControlRegs,
    rd: ReadMaster<W>,
    wr: WriteMaster<W, S>,
    core: CoreSocket<W, S>,
}

impl<const W: usize, const S: usize> VitisShell<W, S> {
    /// The shell around `core`, with `ctrl` decoding its arguments; `W`-bit AXI data
    /// (`S = W / 8` strobes), bursts of at most `max_burst` beats.
    pub fn new(ctrl: ControlRegs, core: CoreSocket<W, S>, max_burst: u32) -> Self {
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
            ctrl,
            rd: ReadMaster::new(max_burst),
            wr: WriteMaster::new(max_burst),
            core,
        }
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
