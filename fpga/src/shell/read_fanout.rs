//! The read side of a kernel with several AXI4 masters: sends each of the core's read
//! requests to the read engine of the master it names and hands the words back to the core in
//! request order, whichever master they arrive on.
//!
//! A core of a kernel with several masters ([`crate::regmap::KernelDesc::axi_ports`]) names the
//! master of a read request in bits 63:62 of `rd_req_addr` (0: `m_axi_gmem`, 1:
//! `m_axi_gmem1`, 2: `m_axi_gmem2`); the fan-out clears those bits before the address reaches
//! the master. A FIFO of (master, beats - 1) per accepted request ([`FANOUT_DEPTH`] deep) tells
//! the data side whose beats come next, so the masters fetch in parallel (each with its own
//! bursts in flight) while the core still sees one stream in request order. A master whose
//! words are not yet wanted holds its R channel (AXI back pressure).

use rust_hdl::prelude::*;

/// Requests the fan-out keeps track of at once: the core waits with the next one while this
/// many have words still to come.
pub const FANOUT_DEPTH: usize = 64;

/// Read fan-out over three read engines (Verilog body generated from its width).
#[derive(LogicBlock)]
pub struct ReadFanout<const W: usize> {
    /// Clock.
    pub clock: Signal<In, Clock>,
    /// Synchronous active-high reset.
    pub reset: Signal<In, Bit>,
    /// Core request valid.
    pub req_valid: Signal<In, Bit>,
    /// Core request ready.
    pub req_ready: Signal<Out, Bit>,
    /// Core request address; bits 63:62 name the master.
    pub req_addr: Signal<In, Bits<64>>,
    /// Core request length in beats.
    pub req_len: Signal<In, Bits<32>>,
    /// Words to the core: valid.
    pub data_valid: Signal<Out, Bit>,
    /// Words to the core: ready.
    pub data_ready: Signal<In, Bit>,
    /// Words to the core.
    pub data: Signal<Out, Bits<W>>,
    /// Address to the engines (bits 63:62 cleared).
    pub m_req_addr: Signal<Out, Bits<64>>,
    /// Length to the engines.
    pub m_req_len: Signal<Out, Bits<32>>,
    /// Engine 0 request valid.
    pub m0_req_valid: Signal<Out, Bit>,
    /// Engine 0 request ready.
    pub m0_req_ready: Signal<In, Bit>,
    /// Engine 0 data valid.
    pub m0_data_valid: Signal<In, Bit>,
    /// Engine 0 data ready.
    pub m0_data_ready: Signal<Out, Bit>,
    /// Engine 0 data.
    pub m0_data: Signal<In, Bits<W>>,
    /// Engine 1 request valid.
    pub m1_req_valid: Signal<Out, Bit>,
    /// Engine 1 request ready.
    pub m1_req_ready: Signal<In, Bit>,
    /// Engine 1 data valid.
    pub m1_data_valid: Signal<In, Bit>,
    /// Engine 1 data ready.
    pub m1_data_ready: Signal<Out, Bit>,
    /// Engine 1 data.
    pub m1_data: Signal<In, Bits<W>>,
    /// Engine 2 request valid.
    pub m2_req_valid: Signal<Out, Bit>,
    /// Engine 2 request ready.
    pub m2_req_ready: Signal<In, Bit>,
    /// Engine 2 data valid.
    pub m2_data_valid: Signal<In, Bit>,
    /// Engine 2 data ready.
    pub m2_data_ready: Signal<Out, Bit>,
    /// Engine 2 data.
    pub m2_data: Signal<In, Bits<W>>,
}

impl<const W: usize> Default for ReadFanout<W> {
    fn default() -> Self {
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
            m_req_addr: Default::default(),
            m_req_len: Default::default(),
            m0_req_valid: Default::default(),
            m0_req_ready: Default::default(),
            m0_data_valid: Default::default(),
            m0_data_ready: Default::default(),
            m0_data: Default::default(),
            m1_req_valid: Default::default(),
            m1_req_ready: Default::default(),
            m1_data_valid: Default::default(),
            m1_data_ready: Default::default(),
            m1_data: Default::default(),
            m2_req_valid: Default::default(),
            m2_req_ready: Default::default(),
            m2_data_valid: Default::default(),
            m2_data_ready: Default::default(),
            m2_data: Default::default(),
        }
    }
}

impl<const W: usize> Logic for ReadFanout<W> {
    fn update(&mut self) {}

    fn connect(&mut self) {
        self.req_ready.connect();
        self.data_valid.connect();
        self.data.connect();
        self.m_req_addr.connect();
        self.m_req_len.connect();
        self.m0_req_valid.connect();
        self.m0_data_ready.connect();
        self.m1_req_valid.connect();
        self.m1_data_ready.connect();
        self.m2_req_valid.connect();
        self.m2_data_ready.connect();
    }

    fn hdl(&self) -> Verilog {
        let lg = FANOUT_DEPTH.trailing_zeros();
        Verilog::Custom(format!(
            r#"
// {depth} requests in flight: (master, beats - 1) of each, in request order
reg [1:0]  tag_p [0:{depth_m1}];
reg [31:0] tag_l [0:{depth_m1}];
reg [{lg_m1}:0] wp, rp;
reg [{lg}:0] count;
reg [31:0] got;  // beats of the head request handed to the core
wire [1:0] port = req_addr[63:62];
wire full = count[{lg}];
wire empty = count == {lgp1}'d0;
wire [1:0] hp = tag_p[rp];
wire head_last = got == tag_l[rp];
wire take = req_valid && req_ready && req_len != 32'd0;
wire give = data_valid && data_ready;
always @(*) begin
    m_req_addr = {{2'b00, req_addr[61:0]}};
    m_req_len = req_len;
    m0_req_valid = req_valid && !full && port == 2'd0;
    m1_req_valid = req_valid && !full && port == 2'd1;
    m2_req_valid = req_valid && !full && port == 2'd2;
    req_ready = !full && (port == 2'd0 ? m0_req_ready : port == 2'd1 ? m1_req_ready : port == 2'd2 ? m2_req_ready : 1'b0);
    data_valid = !empty && (hp == 2'd0 ? m0_data_valid : hp == 2'd1 ? m1_data_valid : m2_data_valid);
    data = hp == 2'd0 ? m0_data : hp == 2'd1 ? m1_data : m2_data;
    m0_data_ready = data_ready && !empty && hp == 2'd0;
    m1_data_ready = data_ready && !empty && hp == 2'd1;
    m2_data_ready = data_ready && !empty && hp == 2'd2;
end
always @(posedge clock) begin
    if (take) begin
        tag_p[wp] <= port;
        tag_l[wp] <= req_len - 32'd1;
    end
    if (reset) begin
        wp <= {lg}'d0;
        rp <= {lg}'d0;
        count <= {lgp1}'d0;
        got <= 32'd0;
    end else begin
        if (take) wp <= wp + 1'b1;
        if (give) begin
            got <= head_last ? 32'd0 : got + 32'd1;
            if (head_last) rp <= rp + 1'b1;
        end
        count <= count + {{{lg}'d0, take}} - {{{lg}'d0, give && head_last}};
    end
end
"#,
            depth = FANOUT_DEPTH,
            depth_m1 = FANOUT_DEPTH - 1,
            lg = lg,
            lg_m1 = lg - 1,
            lgp1 = lg + 1,
        ))
    }
}
