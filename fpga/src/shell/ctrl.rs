//! AXI4-Lite slave `s_axi_control` with the ap_ctrl_hs register map and the argument
//! registers of one kernel, decoded at the offsets its [`KernelDesc`] gives.

use std::fmt::Write as _;

use rust_hdl::prelude::*;

use crate::core::{NUM_POINTERS, NUM_SCALARS};
use crate::regmap::{ArgKind, DescError, KernelDesc};

/// Control register file: AXI4-Lite slave, ap_ctrl_hs state machine, arguments, interrupt.
#[derive(LogicBlock)]
pub struct ControlRegs {
    /// Clock.
    pub clock: Signal<In, Clock>,
    /// Synchronous active-high reset.
    pub reset: Signal<In, Bit>,
    /// AW valid.
    pub awvalid: Signal<In, Bit>,
    /// AW ready.
    pub awready: Signal<Out, Bit>,
    /// AW address.
    pub awaddr: Signal<In, Bits<12>>,
    /// W valid.
    pub wvalid: Signal<In, Bit>,
    /// W ready.
    pub wready: Signal<Out, Bit>,
    /// W data.
    pub wdata: Signal<In, Bits<32>>,
    /// W strobes.
    pub wstrb: Signal<In, Bits<4>>,
    /// B valid.
    pub bvalid: Signal<Out, Bit>,
    /// B ready.
    pub bready: Signal<In, Bit>,
    /// B response.
    pub bresp: Signal<Out, Bits<2>>,
    /// AR valid.
    pub arvalid: Signal<In, Bit>,
    /// AR ready.
    pub arready: Signal<Out, Bit>,
    /// AR address.
    pub araddr: Signal<In, Bits<12>>,
    /// R valid.
    pub rvalid: Signal<Out, Bit>,
    /// R ready.
    pub rready: Signal<In, Bit>,
    /// R data.
    pub rdata: Signal<Out, Bits<32>>,
    /// R response.
    pub rresp: Signal<Out, Bits<2>>,
    /// Interrupt line.
    pub interrupt: Signal<Out, Bit>,
    /// Start pulse to the core.
    pub core_start: Signal<Out, Bit>,
    /// Done pulse from the core.
    pub core_done: Signal<In, Bit>,
    /// The write master has nothing in flight.
    pub wr_idle: Signal<In, Bit>,
    /// The core is busy (informational).
    pub core_busy: Signal<In, Bit>,
    /// Scalar arguments.
    pub arg0: Signal<Out, Bits<32>>,
    /// Scalar argument 1.
    pub arg1: Signal<Out, Bits<32>>,
    /// Scalar argument 2.
    pub arg2: Signal<Out, Bits<32>>,
    /// Scalar argument 3.
    pub arg3: Signal<Out, Bits<32>>,
    /// Scalar argument 4.
    pub arg4: Signal<Out, Bits<32>>,
    /// Scalar argument 5.
    pub arg5: Signal<Out, Bits<32>>,
    /// Scalar argument 6.
    pub arg6: Signal<Out, Bits<32>>,
    /// Scalar argument 7.
    pub arg7: Signal<Out, Bits<32>>,
    /// Pointer argument 0.
    pub ptr0: Signal<Out, Bits<64>>,
    /// Pointer argument 1.
    pub ptr1: Signal<Out, Bits<64>>,
    /// Pointer argument 2.
    pub ptr2: Signal<Out, Bits<64>>,
    /// Pointer argument 3.
    pub ptr3: Signal<Out, Bits<64>>,
    /// Pointer argument 4.
    pub ptr4: Signal<Out, Bits<64>>,
    /// Pointer argument 5.
    pub ptr5: Signal<Out, Bits<64>>,
    /// Pointer argument 6.
    pub ptr6: Signal<Out, Bits<64>>,
    /// Pointer argument 7.
    pub ptr7: Signal<Out, Bits<64>>,
    _body: String,
}

impl ControlRegs {
    /// The control block of the kernel `desc`.
    pub fn new(desc: &KernelDesc) -> Result<Self, DescError> {
        Ok(Self {
            clock: Default::default(),
            reset: Default::default(),
            awvalid: Default::default(),
            awready: Default::default(),
            awaddr: Default::default(),
            wvalid: Default::default(),
            wready: Default::default(),
            wdata: Default::default(),
            wstrb: Default::default(),
            bvalid: Default::default(),
            bready: Default::default(),
            bresp: Default::default(),
            arvalid: Default::default(),
            arready: Default::default(),
            araddr: Default::default(),
            rvalid: Default::default(),
            rready: Default::default(),
            rdata: Default::default(),
            rresp: Default::default(),
            interrupt: Default::default(),
            core_start: Default::default(),
            core_done: Default::default(),
            wr_idle: Default::default(),
            core_busy: Default::default(),
            arg0: Default::default(),
            arg1: Default::default(),
            arg2: Default::default(),
            arg3: Default::default(),
            arg4: Default::default(),
            arg5: Default::default(),
            arg6: Default::default(),
            arg7: Default::default(),
            ptr0: Default::default(),
            ptr1: Default::default(),
            ptr2: Default::default(),
            ptr3: Default::default(),
            ptr4: Default::default(),
            ptr5: Default::default(),
            ptr6: Default::default(),
            ptr7: Default::default(),
            _body: ctrl_body(desc)?,
        })
    }
}

impl Logic for ControlRegs {
    fn update(&mut self) {}

    fn connect(&mut self) {
        self.awready.connect();
        self.wready.connect();
        self.bvalid.connect();
        self.bresp.connect();
        self.arready.connect();
        self.rvalid.connect();
        self.rdata.connect();
        self.rresp.connect();
        self.interrupt.connect();
        self.core_start.connect();
        self.arg0.connect();
        self.arg1.connect();
        self.arg2.connect();
        self.arg3.connect();
        self.arg4.connect();
        self.arg5.connect();
        self.arg6.connect();
        self.arg7.connect();
        self.ptr0.connect();
        self.ptr1.connect();
        self.ptr2.connect();
        self.ptr3.connect();
        self.ptr4.connect();
        self.ptr5.connect();
        self.ptr6.connect();
        self.ptr7.connect();
    }

    fn hdl(&self) -> Verilog {
        Verilog::Custom(self._body.clone())
    }
}

/// The Verilog body of the control block: fixed ap_ctrl_hs part plus one decode per argument.
fn ctrl_body(desc: &KernelDesc) -> Result<String, DescError> {
    let slots = desc.slots()?;
    let mut regs = String::new();
    let mut writes = String::new();
    let mut reads = String::new();
    let mut resets = String::new();
    let mut used_s = [false; NUM_SCALARS];
    let mut used_p = [false; NUM_POINTERS];
    for s in &slots {
        let r = format!("a_{}", s.port);
        let strb = |lo: u32| {
            (0..4)
                .map(|b| {
                    format!(
                        "            if (w_strb_q[{b}]) {r}[{hi}:{lo}] <= w_data_q[{bh}:{bl}];\n",
                        hi = lo + 8 * b + 7,
                        lo = lo + 8 * b,
                        bh = 8 * b + 7,
                        bl = 8 * b
                    )
                })
                .collect::<String>()
        };
        match s.arg.kind {
            ArgKind::Scalar => {
                used_s[s.port[3..].parse::<usize>().unwrap_or(0)] = true;
                let _ = writeln!(regs, "reg [31:0] {r}; // {} @ {:#x}", s.arg.name, s.offset);
                let _ = writeln!(resets, "        {r} <= 32'd0;");
                let _ = write!(
                    writes,
                    "        12'h{:03x}: begin\n{}        end\n",
                    s.offset,
                    strb(0)
                );
                let _ = writeln!(reads, "        12'h{:03x}: rd_mux = {r};", s.offset);
            }
            ArgKind::Pointer => {
                used_p[s.port[3..].parse::<usize>().unwrap_or(0)] = true;
                let _ = writeln!(regs, "reg [63:0] {r}; // {} @ {:#x}", s.arg.name, s.offset);
                let _ = writeln!(resets, "        {r} <= 64'd0;");
                let _ = write!(
                    writes,
                    "        12'h{:03x}: begin\n{}        end\n        12'h{:03x}: begin\n{}        end\n",
                    s.offset,
                    strb(0),
                    s.offset + 4,
                    strb(32)
                );
                let _ = writeln!(reads, "        12'h{:03x}: rd_mux = {r}[31:0];", s.offset);
                let _ = writeln!(
                    reads,
                    "        12'h{:03x}: rd_mux = {r}[63:32];",
                    s.offset + 4
                );
            }
        }
    }
    let mut outs = String::new();
    for (i, u) in used_s.iter().enumerate() {
        let v = if *u {
            format!("a_arg{i}")
        } else {
            "32'd0".into()
        };
        let _ = writeln!(outs, "    arg{i} = {v};");
    }
    for (i, u) in used_p.iter().enumerate() {
        let v = if *u {
            format!("a_ptr{i}")
        } else {
            "64'd0".into()
        };
        let _ = writeln!(outs, "    ptr{i} = {v};");
    }
    Ok(format!(
        r#"
// ap_ctrl_hs control of kernel `{name}`, generated from its KernelDesc.
localparam [1:0] R_IDLE = 2'd0, R_RUN = 2'd1, R_DRAIN = 2'd2;
reg [1:0] run_st;
reg ap_start_q, ap_done_q, ap_ready_q, auto_restart_q, gie_q;
reg [1:0] ier_q, isr_q;
reg aw_have, w_have;
reg [11:0] aw_addr_q;
reg [31:0] w_data_q;
reg [3:0] w_strb_q;
{regs}
wire ap_idle = (run_st == R_IDLE);
wire finish = (run_st == R_DRAIN) && wr_idle;
wire do_write = aw_have && w_have && !bvalid;
wire rd_fire = arvalid && arready;
reg [31:0] rd_mux;
always @(*) begin
    case (araddr)
        12'h000: rd_mux = {{24'd0, auto_restart_q, 3'd0, ap_ready_q, ap_idle, ap_done_q, ap_start_q}};
        12'h004: rd_mux = {{31'd0, gie_q}};
        12'h008: rd_mux = {{30'd0, ier_q}};
        12'h00c: rd_mux = {{30'd0, isr_q}};
{reads}        default: rd_mux = 32'd0;
    endcase
end
always @(*) begin
    awready = !aw_have;
    wready = !w_have;
    arready = !rvalid;
    bresp = 2'd0;
    rresp = 2'd0;
{outs}end
always @(posedge clock) begin
    if (reset) begin
        run_st <= R_IDLE;
        ap_start_q <= 1'b0;
        ap_done_q <= 1'b0;
        ap_ready_q <= 1'b0;
        auto_restart_q <= 1'b0;
        gie_q <= 1'b0;
        ier_q <= 2'd0;
        isr_q <= 2'd0;
        aw_have <= 1'b0;
        w_have <= 1'b0;
        aw_addr_q <= 12'd0;
        w_data_q <= 32'd0;
        w_strb_q <= 4'd0;
        bvalid <= 1'b0;
        rvalid <= 1'b0;
        rdata <= 32'd0;
        interrupt <= 1'b0;
        core_start <= 1'b0;
{resets}    end else begin
        core_start <= 1'b0;
        // AXI4-Lite write channel
        if (awvalid && !aw_have) begin aw_have <= 1'b1; aw_addr_q <= awaddr; end
        if (wvalid && !w_have) begin w_have <= 1'b1; w_data_q <= wdata; w_strb_q <= wstrb; end
        if (bvalid && bready) bvalid <= 1'b0;
        // AXI4-Lite read channel
        if (rvalid && rready) rvalid <= 1'b0;
        if (rd_fire) begin
            rvalid <= 1'b1;
            rdata <= rd_mux;
            if (araddr == 12'h000) begin ap_done_q <= 1'b0; ap_ready_q <= 1'b0; end
        end
        // ap_ctrl_hs sequencing
        case (run_st)
            R_IDLE: if (ap_start_q) begin run_st <= R_RUN; core_start <= 1'b1; end
            R_RUN: if (core_done) run_st <= R_DRAIN;
            R_DRAIN: if (wr_idle) run_st <= R_IDLE;
            default: run_st <= R_IDLE;
        endcase
        if (finish) begin
            ap_done_q <= 1'b1;
            ap_ready_q <= 1'b1;
            if (!auto_restart_q) ap_start_q <= 1'b0;
            if (ier_q[0]) isr_q[0] <= 1'b1;
            if (ier_q[1]) isr_q[1] <= 1'b1;
        end
        if (do_write) begin
            aw_have <= 1'b0;
            w_have <= 1'b0;
            bvalid <= 1'b1;
            case (aw_addr_q)
            12'h000: begin
                if (w_strb_q[0] && w_data_q[0]) ap_start_q <= 1'b1;
                if (w_strb_q[0]) auto_restart_q <= w_data_q[7];
            end
            12'h004: if (w_strb_q[0]) gie_q <= w_data_q[0];
            12'h008: if (w_strb_q[0]) ier_q <= w_data_q[1:0];
            12'h00c: if (w_strb_q[0]) isr_q <= isr_q ^ w_data_q[1:0];
{writes}            default: ;
            endcase
        end
        interrupt <= gie_q && ((isr_q & ier_q) != 2'd0);
    end
end
wire _unused_ok = &{{1'b0, core_busy, 1'b0}};
"#,
        name = desc.name
    ))
}
