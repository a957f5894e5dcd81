//! AXI4 read master: turns the core's (address, length) read requests into INCR bursts on
//! `m_axi_gmem` AR and passes the R beats back as a word stream.

use rust_hdl::prelude::*;

/// AXI4 read burst engine (Verilog body generated from its parameters).
#[derive(LogicBlock)]
pub struct ReadMaster<const W: usize> {
    /// Clock.
    pub clock: Signal<In, Clock>,
    /// Synchronous active-high reset.
    pub reset: Signal<In, Bit>,
    /// Core request valid.
    pub req_valid: Signal<In, Bit>,
    /// Core request ready.
    pub req_ready: Signal<Out, Bit>,
    /// Byte address.
    pub req_addr: Signal<In, Bits<64>>,
    /// Beats (W-bit words).
    pub req_len: Signal<In, Bits<32>>,
    /// Data to the core: valid.
    pub data_valid: Signal<Out, Bit>,
    /// Data to the core: ready.
    pub data_ready: Signal<In, Bit>,
    /// Data to the core.
    pub data: Signal<Out, Bits<W>>,
    /// AR valid.
    pub arvalid: Signal<Out, Bit>,
    /// AR ready.
    pub arready: Signal<In, Bit>,
    /// AR address.
    pub araddr: Signal<Out, Bits<64>>,
    /// AR burst length - 1.
    pub arlen: Signal<Out, Bits<8>>,
    /// AR beat size (log2 of the W/8 bytes of a beat).
    pub arsize: Signal<Out, Bits<3>>,
    /// AR burst type (1: INCR).
    pub arburst: Signal<Out, Bits<2>>,
    /// R valid.
    pub rvalid: Signal<In, Bit>,
    /// R ready.
    pub rready: Signal<Out, Bit>,
    /// R data.
    pub rdata: Signal<In, Bits<W>>,
    /// R last.
    pub rlast: Signal<In, Bit>,
    /// R response.
    pub rresp: Signal<In, Bits<2>>,
    _max_burst: u32,
}

impl<const W: usize> ReadMaster<W> {
    /// A read engine of `W`-bit beats issuing bursts of at most `max_burst` beats (a power
    /// of two, 2..=256, with `max_burst * W / 8 <= 4096`).
    pub fn new(max_burst: u32) -> Self {
        Self {
            clock: Default::default(),
            reset: Default::default(),
            req_valid: Default::default(),
            req_ready: Default::default(),
            req_addr: Default::default(),
            req_len: Default::default(),
            data_valid: Default::default(),
            data_ready: Default::default(),
            data: Default::default(),
            arvalid: Default::default(),
            arready: Default::default(),
            araddr: Default::default(),
            arlen: Default::default(),
            arsize: Default::default(),
            arburst: Default::default(),
            rvalid: Default::default(),
            rready: Default::default(),
            rdata: Default::default(),
            rlast: Default::default(),
            rresp: Default::default(),
            _max_burst: max_burst,
        }
    }
}

impl<const W: usize> Logic for ReadMaster<W> {
    fn update(&mut self) {}

    fn connect(&mut self) {
        self.req_ready.connect();
        self.data_valid.connect();
        self.data.connect();
        self.arvalid.connect();
        self.araddr.connect();
        self.arlen.connect();
        self.arsize.connect();
        self.arburst.connect();
        self.rready.connect();
    }

    fn hdl(&self) -> Verilog {
        Verilog::Custom(format!(
            r#"
// {w}-bit beats; bursts never cross a MAXB*{bytes}-byte boundary (so never 4 KiB).
localparam [31:0] MAXB = 32'd{maxb};
reg        busy_q;
reg [63:0] addr_q;
reg [31:0] left_q;
wire [31:0] room = MAXB - ({{{lg}'b0, addr_q[31:{lg}]}} & (MAXB - 32'd1));
wire [31:0] beats = (left_q < room) ? left_q : room;
always @(*) begin
    req_ready = !busy_q;
    arvalid = busy_q;
    araddr = addr_q;
    arlen = beats[7:0] - 8'd1;
    arsize = 3'd{lg};
    arburst = 2'd1;
    data_valid = rvalid;
    data = rdata;
    rready = data_ready;
end
always @(posedge clock) begin
    if (reset) begin
        busy_q <= 1'b0;
        addr_q <= 64'd0;
        left_q <= 32'd0;
    end else if (!busy_q) begin
        if (req_valid && req_len != 32'd0) begin
            busy_q <= 1'b1;
            addr_q <= req_addr;
            left_q <= req_len;
        end
    end else if (arready) begin
        addr_q <= addr_q + {{{hi}'d0, beats, {lg}'d0}};
        left_q <= left_q - beats;
        if (left_q == beats) busy_q <= 1'b0;
    end
end
// rlast and rresp are not needed: beats are counted by the core.
wire _unused_ok = &{{1'b0, rlast, rresp, 1'b0}};
"#,
            maxb = self._max_burst,
            w = W,
            bytes = W / 8,
            lg = (W / 8).trailing_zeros(),
            hi = 32 - (W / 8).trailing_zeros(),
        ))
    }
}
