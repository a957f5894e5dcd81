//! AXI4 write master: turns the core's (address, length) write requests and its word stream
//! into AW + W bursts on `m_axi_gmem`, counts outstanding B responses, and reports `idle`
//! once every burst has been answered.

use rust_hdl::prelude::*;

/// AXI4 write burst engine (Verilog body generated from its parameters).
#[derive(LogicBlock)]
pub struct WriteMaster<const W: usize, const S: usize> {
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
    /// Data from the core: valid.
    pub data_valid: Signal<In, Bit>,
    /// Data from the core: ready.
    pub data_ready: Signal<Out, Bit>,
    /// Data from the core.
    pub data: Signal<In, Bits<W>>,
    /// Byte enables from the core.
    pub strb: Signal<In, Bits<S>>,
    /// No request in progress and no B response outstanding.
    pub idle: Signal<Out, Bit>,
    /// AW valid.
    pub awvalid: Signal<Out, Bit>,
    /// AW ready.
    pub awready: Signal<In, Bit>,
    /// AW address.
    pub awaddr: Signal<Out, Bits<64>>,
    /// AW burst length - 1.
    pub awlen: Signal<Out, Bits<8>>,
    /// AW beat size (log2 of the W/8 bytes of a beat).
    pub awsize: Signal<Out, Bits<3>>,
    /// AW burst type (1: INCR).
    pub awburst: Signal<Out, Bits<2>>,
    /// W valid.
    pub wvalid: Signal<Out, Bit>,
    /// W ready.
    pub wready: Signal<In, Bit>,
    /// W data.
    pub wdata: Signal<Out, Bits<W>>,
    /// W strobes.
    pub wstrb: Signal<Out, Bits<S>>,
    /// W last.
    pub wlast: Signal<Out, Bit>,
    /// B valid.
    pub bvalid: Signal<In, Bit>,
    /// B ready.
    pub bready: Signal<Out, Bit>,
    /// B response.
    pub bresp: Signal<In, Bits<2>>,
    _max_burst: u32,
}

impl<const W: usize, const S: usize> WriteMaster<W, S> {
    /// A write engine of `W`-bit beats (`S = W / 8` strobes) issuing bursts of at most
    /// `max_burst` beats (a power of two, 2..=256, with `max_burst * W / 8 <= 4096`).
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
            strb: Default::default(),
            idle: Default::default(),
            awvalid: Default::default(),
            awready: Default::default(),
            awaddr: Default::default(),
            awlen: Default::default(),
            awsize: Default::default(),
            awburst: Default::default(),
            wvalid: Default::default(),
            wready: Default::default(),
            wdata: Default::default(),
            wstrb: Default::default(),
            wlast: Default::default(),
            bvalid: Default::default(),
            bready: Default::default(),
            bresp: Default::default(),
            _max_burst: max_burst,
        }
    }
}

impl<const W: usize, const S: usize> Logic for WriteMaster<W, S> {
    fn update(&mut self) {}

    fn connect(&mut self) {
        self.req_ready.connect();
        self.data_ready.connect();
        self.idle.connect();
        self.awvalid.connect();
        self.awaddr.connect();
        self.awlen.connect();
        self.awsize.connect();
        self.awburst.connect();
        self.wvalid.connect();
        self.wdata.connect();
        self.wstrb.connect();
        self.wlast.connect();
        self.bready.connect();
    }

    fn hdl(&self) -> Verilog {
        Verilog::Custom(format!(
            r#"
// {w}-bit beats; bursts never cross a MAXB*{bytes}-byte boundary (so never 4 KiB).
localparam [31:0] MAXB = 32'd{maxb};
localparam [1:0] S_IDLE = 2'd0, S_AW = 2'd1, S_DATA = 2'd2;
reg [1:0]  st;
reg [63:0] addr_q;
reg [31:0] left_q;
reg [8:0]  beats_q;
reg [8:0]  beat_cnt;
reg [15:0] outstanding;
wire [31:0] room = MAXB - ({{{lg}'b0, addr_q[31:{lg}]}} & (MAXB - 32'd1));
wire [31:0] beats = (left_q < room) ? left_q : room;
wire aw_fire = (st == S_AW) && awready;
wire b_fire = bvalid;
always @(*) begin
    req_ready = (st == S_IDLE);
    awvalid = (st == S_AW);
    awaddr = addr_q;
    awlen = beats[7:0] - 8'd1;
    awsize = 3'd{lg};
    awburst = 2'd1;
    wvalid = (st == S_DATA) && data_valid;
    wdata = data;
    wstrb = strb;
    wlast = (beat_cnt == beats_q - 9'd1);
    data_ready = (st == S_DATA) && wready;
    bready = 1'b1;
    idle = (st == S_IDLE) && (outstanding == 16'd0);
end
always @(posedge clock) begin
    if (reset) begin
        st <= S_IDLE;
        addr_q <= 64'd0;
        left_q <= 32'd0;
        beats_q <= 9'd0;
        beat_cnt <= 9'd0;
        outstanding <= 16'd0;
    end else begin
        case (st)
            S_IDLE: if (req_valid && req_len != 32'd0) begin
                addr_q <= req_addr;
                left_q <= req_len;
                st <= S_AW;
            end
            S_AW: if (awready) begin
                beats_q <= beats[8:0];
                beat_cnt <= 9'd0;
                addr_q <= addr_q + {{{hi}'d0, beats, {lg}'d0}};
                left_q <= left_q - beats;
                st <= S_DATA;
            end
            S_DATA: if (data_valid && wready) begin
                beat_cnt <= beat_cnt + 9'd1;
                if (beat_cnt == beats_q - 9'd1) st <= (left_q == 32'd0) ? S_IDLE : S_AW;
            end
            default: st <= S_IDLE;
        endcase
        outstanding <= outstanding + {{15'd0, aw_fire}} - {{15'd0, b_fire}};
    end
end
wire _unused_ok = &{{1'b0, bresp, 1'b0}};
"#,
            maxb = self._max_burst,
            w = W,
            bytes = W / 8,
            lg = (W / 8).trailing_zeros(),
            hi = 32 - (W / 8).trailing_zeros(),
        ))
    }
}
