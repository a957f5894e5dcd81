//! The streaming vector core `vecops`: elementwise add, RMSNorm (+ residual), RoPE
//! (rotate-half) and SiLU(gate) x up on rows of int16 elements, one op per launch chosen by
//! the `op` register. Semantics: [`crate::golden::vecops`].
//!
//! Dataflow (one 64-bit word = 4 int16 lanes per cycle):
//! - *requests*: a generator runs ahead of the data: the weight row (RMSNorm), then per row the
//!   `a` row and the `b` row (add, RMSNorm + residual, silu_mul) or the row's cos/sin row
//!   (RoPE, `i mod period`). The shell serves them in order, so the read latency is paid once.
//! - *consumer*, per row: the `a` words into the row bank (RMSNorm: sum of squares on the
//!   way); then the `b` words: add and silu_mul compute their result into the row bank, RMSNorm +
//!   residual stores `t = sat16(a + b)` and accumulates `t^2`, RoPE stores the cos/sin row in
//!   the table bank.
//! - *norm* (RMSNorm): `m = (ss * inv_n) >> 32` and `v`; the leading-one position; the
//!   normalising shift and the rsqrt LUT: three cycles.
//! - *write-out*: one request and `words` data words for `y` (computed from the banks as the
//!   words go out: 4 lanes of `t * w * R` and a rounding shift; RoPE's two products per lane),
//!   then (RMSNorm + residual) the `s` row.
//!
//! Arguments: `a` (ptr0), `b` (ptr1), `p` (ptr2: the weight row or the cos/sin rows), `y`
//! (ptr3), `s` (ptr4), `op` (arg0), `rows` (arg1), `n` (arg2), `shift` (arg3), `c0` (arg4), `c1`
//! (arg5). Arguments the golden model's [`crate::golden::vecops::VecArgs::valid`] refuses
//! finish at once without touching memory.

use std::fmt::Write as _;

use crate::core::{CoreError, KernelCore, clog2};
use crate::golden::vecops::{rsqrt_lut, sigmoid_lut};
use crate::regmap::{ArgDesc, KernelDesc};

/// Build parameters of the vecops core.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VecopsCore {
    /// Longest row in elements (a multiple of 8, 8..=65536): the depth of the on-chip row,
    /// table and weight banks (`n_max / 4` words each).
    pub n_max: u32,
}

impl Default for VecopsCore {
    fn default() -> Self {
        Self { n_max: 4096 }
    }
}

impl VecopsCore {
    /// Checks the parameters.
    pub fn validate(&self) -> Result<(), CoreError> {
        if self.n_max < 8 || !self.n_max.is_multiple_of(8) || self.n_max > 65536 {
            return Err(CoreError::Param {
                kernel: "vecops".into(),
                msg: format!(
                    "n_max = {} must be a multiple of 8 in 8..=65536",
                    self.n_max
                ),
            });
        }
        Ok(())
    }
}

impl KernelCore for VecopsCore {
    fn name(&self) -> &str {
        "vecops"
    }

    fn desc(&self) -> KernelDesc {
        KernelDesc {
            name: "vecops".into(),
            args: vec![
                ArgDesc::pointer("a", "short*"),
                ArgDesc::pointer("b", "short*"),
                ArgDesc::pointer("p", "short*"),
                ArgDesc::pointer("y", "short*"),
                ArgDesc::pointer("s", "short*"),
                ArgDesc::scalar("op"),
                ArgDesc::scalar("rows"),
                ArgDesc::scalar("n"),
                ArgDesc::scalar("shift"),
                ArgDesc::scalar("c0"),
                ArgDesc::scalar("c1"),
            ],
        }
    }

    fn params(&self) -> Vec<(String, i64)> {
        vec![("n_max".into(), i64::from(self.n_max))]
    }

    fn core_verilog(&self) -> Result<String, CoreError> {
        self.validate()?;
        Ok(vecops_verilog(self))
    }
}

fn vecops_verilog(p: &VecopsCore) -> String {
    let nw = p.n_max / 4;
    let aw = clog2(nw + 1); // word index width (holds nw itself)
    let mut rsq_cases = String::new();
    for (i, v) in rsqrt_lut().iter().enumerate().skip(128) {
        let _ = writeln!(rsq_cases, "        9'd{i}: rsq = 16'd{v};");
    }
    let mut sig_cases = String::new();
    for (i, v) in sigmoid_lut().iter().enumerate() {
        let _ = writeln!(sig_cases, "        10'd{i}: sig = 17'd{v};");
    }
    format!(
        r#"
// vecops core (tandem-fpga): n_max = {n_max} elements ({nw} words per bank).
// Semantics: fpga::golden::vecops.
/* verilator lint_off UNUSED */
/* verilator lint_off WIDTH */
{header}
localparam [31:0] N_MAX = 32'd{n_max};
localparam [3:0] C_IDLE = 4'd0, C_W = 4'd1, C_A = 4'd2, C_B = 4'd3, C_DR = 4'd4, C_N = 4'd5,
                 C_YREQ = 4'd6, C_YDAT = 4'd7, C_SREQ = 4'd8, C_SDAT = 4'd9;
localparam [1:0] G_P = 2'd0, G_A = 2'd1, G_B = 2'd2, G_DONE = 2'd3;

function signed [15:0] sat16;
    input signed [63:0] v;
    sat16 = (v > 64'sd32767) ? 16'sh7fff : ((v < -64'sd32768) ? 16'sh8000 : v[15:0]);
endfunction

function signed [7:0] sat8;
    input signed [63:0] v;
    sat8 = (v > 64'sd127) ? 8'sh7f : ((v < -64'sd128) ? 8'sh80 : v[7:0]);
endfunction

// the rounding constant of a right shift by s: 2^(s-1), 0 for s = 0
function signed [63:0] rnd_of;
    input [6:0] s;
    rnd_of = (s == 7'd0) ? 64'sd0 : (64'sd1 <<< (s - 7'd1));
endfunction

function [15:0] rsq;
    input [8:0] i;
    case (i)
{rsq_cases}        default: rsq = 16'd0;
    endcase
endfunction

function [16:0] sig;
    input [9:0] i;
    case (i)
{sig_cases}        default: sig = 17'd0;
    endcase
endfunction

{body}
endmodule // vecops_core
/* verilator lint_on WIDTH */
/* verilator lint_on UNUSED */
"#,
        header = crate::core::core_header("vecops_core", &["busy"]),
        n_max = p.n_max,
        nw = nw,
        body = vecops_body(p, aw),
    )
}

/// The core's logic below the functions: run control and arguments, the banks, the request
/// generator, the consumer with its compute pipeline (`b1..b9`) and sum-of-squares pipeline
/// (`s1..s3`), the norm steps and the write-out pipeline (`o1..o5`).
fn vecops_body(p: &VecopsCore, aw: u32) -> String {
    let nw = p.n_max / 4;
    let mut b_lanes = String::new();
    let mut o_lanes = String::new();
    for l in 0..4 {
        let o = 16 * l;
        let _ = writeln!(
            b_lanes,
            r#"// b lane {l} (16-bit: add, rmsnorm + residual, silu_mul)
wire signed [15:0] a1_{l} = ab_q[{o} +: 16];
wire signed [15:0] d1_{l} = b1_d[{o} +: 16];
wire signed [15:0] a2_{l} = b2_a[{o} +: 16];
wire signed [15:0] d5_{l} = b5_d[{o} +: 16];
reg signed [15:0] b2_t_{l};
reg signed [48:0] b2_zp_{l};
reg signed [63:0] b3_z_{l};
reg [16:0] b4_sg_{l};
reg signed [33:0] b5_m_{l};
reg signed [49:0] b6_m_{l}, b7_m_{l};
reg signed [63:0] b8_r_{l};
always @(posedge clock) begin
    b2_t_{l} <= sat16(a1_{l} + d1_{l});
    b2_zp_{l} <= a1_{l} * $signed({{1'b0, c0_q}});
    b3_z_{l} <= ($signed(b2_zp_{l}) + rnd1_q) >>> c1s_q;
    b4_sg_{l} <= (b3_z_{l} >= 64'sd512) ? 17'd32768
        : ((b3_z_{l} < -64'sd512) ? 17'd0 : sig(b3_z_{l}[9:0] ^ 10'h200));
    b5_m_{l} <= $signed(b4_a[{o} +: 16]) * $signed(b4_sg_{l});
    b6_m_{l} <= b5_m_{l} * d5_{l};
    b7_m_{l} <= b6_m_{l};
    b8_r_{l} <= ($signed(b7_m_{l}) + rnd_s_q) >>> shift_q;
end"#
        );
        let _ = writeln!(
            o_lanes,
            r#"// out lane {l}
reg signed [31:0] o2_p_{l}, o2_q1_{l}, o2_q2_{l}, o2_q3_{l}, o2_q4_{l};
reg signed [47:0] o2_oa_{l};
reg signed [63:0] o3_e_{l}, o4_f_{l};
always @(posedge clock) if (o_en) begin
    o2_p_{l} <= $signed(ab_q[{o} +: 16]) * $signed(wb_q[{o} +: 16]);
    o2_q1_{l} <= $signed(x1_q[{o} +: 16]) * $signed(cs_c_q[{o} +: 16]);
    o2_q2_{l} <= $signed(x2_q[{o} +: 16]) * $signed(cs_s_q[{o} +: 16]);
    o2_q3_{l} <= $signed(x2_q[{o} +: 16]) * $signed(cs_c_q[{o} +: 16]);
    o2_q4_{l} <= $signed(x1_q[{o} +: 16]) * $signed(cs_s_q[{o} +: 16]);
    o2_oa_{l} <= o1_half ? acc_q[{hi} +: 48] : acc_q[{lo} +: 48];
    o3_e_{l} <= (op_q == 3'd3) ? (o2_fh ? (o2_q1_{l} - o2_q2_{l}) : (o2_q3_{l} + o2_q4_{l}))
              : (q_tab ? o2_oa_{l} : (o2_p_{l} * $signed({{1'b0, rr_q}})));
    o4_f_{l} <= (o3_e_{l} + rnd_o_q) >>> sh_o_q;
end"#,
            hi = 48 * (l + 4),
            lo = 48 * l,
        );
    }
    let mut b8_lanes = String::new();
    for l in 0..8 {
        let o = 8 * l;
        let _ = writeln!(
            b8_lanes,
            r#"// b lane {l} (int8: silu_mul8)
wire signed [7:0] g81_{l} = ab_q[{o} +: 8];
reg signed [40:0] b2_zp8_{l};
reg signed [63:0] b3_z8_{l};
reg [16:0] b4_sg8_{l};
reg signed [25:0] b5_m8_{l};
reg signed [33:0] b6_m8_{l};
reg signed [50:0] b7_m8_{l};
reg signed [63:0] b8_r8_{l};
always @(posedge clock) begin
    b2_zp8_{l} <= g81_{l} * $signed({{1'b0, c0_q}});
    b3_z8_{l} <= ($signed(b2_zp8_{l}) + rnd1_q) >>> c1s_q;
    b4_sg8_{l} <= (b3_z8_{l} >= 64'sd512) ? 17'd32768
        : ((b3_z8_{l} < -64'sd512) ? 17'd0 : sig(b3_z8_{l}[9:0] ^ 10'h200));
    b5_m8_{l} <= $signed(b4_a[{o} +: 8]) * $signed(b4_sg8_{l});
    b6_m8_{l} <= b5_m8_{l} * $signed(b5_d[{o} +: 8]);
    b7_m8_{l} <= b6_m8_{l} * $signed({{1'b0, c1_q[31:16]}});
    b8_r8_{l} <= ($signed(b7_m8_{l}) + rnd_s_q) >>> shift_q;
end"#
        );
    }
    let mut c_lanes = String::new();
    for l in 0..8 {
        let (o, ao) = (8 * l, 48 * l);
        let _ = writeln!(
            c_lanes,
            "wire signed [47:0] cn_{l} = (c_j0 ? 48'sd0 : $signed(acc_rd[{ao} +: 48])) + cw * $signed(rd_data[{o} +: 8]);"
        );
    }
    format!(
        r#"// ---- run control and arguments ----
reg running;
reg [2:0] op_q;
reg [31:0] c0_q, c1_q;
reg [5:0] shift_q;
reg [63:0] pa_q, pb_q, pp_q, py_q, ps_q;
assign busy = running;
wire [31:0] nw_arg = (arg2 + 32'd3) >> 2;
wire [31:0] n8_arg = (arg2 + 32'd7) >> 3;
wire [63:0] tl_arg = {{32'd0, arg1}} * {{32'd0, arg4}};
wire op_norm = (arg0 == 32'd1) || (arg0 == 32'd2);
wire op_tab = (arg0 == 32'd6);
wire op_i8 = (arg0 == 32'd5) || (arg0 == 32'd6);
wire args_ok_w = (arg0 <= 32'd6) && (arg1 != 32'd0) && (arg2 != 32'd0) && (arg2 <= N_MAX)
            && (!op_norm || (arg3 >= 32'd1 && arg3 <= 32'd47))
            && (arg0 != 32'd3 || (arg2[2:0] == 3'd0 && arg4 != 32'd0))
            && (arg0 != 32'd4 || (arg3 <= 32'd47 && arg5 <= 32'd47))
            && (arg0 != 32'd5 || (arg3 <= 32'd47 && arg5[15:0] <= 16'd47))
            && (arg0 != 32'd6 || (arg3 <= 32'd47 && arg4 != 32'd0 && tl_arg <= {{32'd0, N_MAX >> 2}}));
// registered (as the router's): the arguments are written before the transaction that sets
// ap_start, so the checks and the sizes derived from them stay out of the run-start path
reg args_ok;
reg [{awh}:0] ar_nw, ar_h4, ar_n8, ar_tl;
reg [{awh}:0] ar_nwr, ar_nwr_m1, ar_nwo, ar_nwo_m1, ar_rem0;
reg [31:0] ar_rows_m2, ar_c0_m2;
reg ar_rows1, ar_c01;
always @(posedge clock) begin
    args_ok <= !reset && args_ok_w;
    ar_nw <= nw_arg[{awh}:0]; ar_h4 <= nw_arg[{aw}:1]; ar_n8 <= n8_arg[{awh}:0]; ar_tl <= tl_arg[{awh}:0];
    ar_nwr <= op_i8 ? n8_arg[{awh}:0] : nw_arg[{awh}:0];
    ar_nwr_m1 <= (op_i8 ? n8_arg[{awh}:0] : nw_arg[{awh}:0]) - 1'b1;
    ar_nwo <= (arg0 == 32'd5) ? n8_arg[{awh}:0] : nw_arg[{awh}:0];
    ar_nwo_m1 <= ((arg0 == 32'd5) ? n8_arg[{awh}:0] : nw_arg[{awh}:0]) - 1'b1;
    // the first phase's words - 1: the weights or the table, else the a row
    ar_rem0 <= (op_tab ? tl_arg[{awh}:0] : (op_norm ? nw_arg[{awh}:0] : (op_i8 ? n8_arg[{awh}:0] : nw_arg[{awh}:0]))) - 1'b1;
    ar_rows_m2 <= arg1 - 32'd2; ar_c0_m2 <= arg4 - 32'd2;
    ar_rows1 <= (arg1 == 32'd1); ar_c01 <= (arg4 == 32'd1);
end
wire q_norm = (op_q == 3'd1) || (op_q == 3'd2);
wire q_has_b = (op_q != 3'd1);  // a second stream per row: b, or the rope table
wire q_tab = (op_q == 3'd6);    // combine: the table, then k gathered int8 rows per row
// the b-stream results that go through the compute pipeline (the rest are stored as read)
wire q_bpipe = (op_q == 3'd0) || (op_q == 3'd2) || (op_q == 3'd4) || (op_q == 3'd5);
// launch constants, registered at start from the ar_* registers
reg [{awh}:0] nw_q, h4_q, tl_q;
reg [{awh}:0] nwr_q, nwr_m1_q, nwo_q, nwo_m1_q;
reg [63:0] row_bytes_q, out_bytes_q, row8_bytes_q;
reg [31:0] rows_m2_q, c0_m2_q;
reg c01_q;
// the norm's results (declared here for the write-out's shift below)
reg [15:0] rr_q;
reg [3:0] kk_q;
// shifts and rounding constants, registered from the launch constants and kk_q (used from
// the b pipeline's third stage and the write-out's fourth, well after they settle)
reg [5:0] c1s_q;
reg signed [63:0] rnd1_q, rnd_s_q, rnd_o_q;
reg [6:0] sh_o_q;
always @(posedge clock) begin
    c1s_q <= c1_q[5:0];
    rnd1_q <= rnd_of({{1'b0, c1s_q}});
    rnd_s_q <= rnd_of({{1'b0, shift_q}});
    // the write-out's shift: rmsnorm shift + the rsqrt exponent, rope 14, combine shift
    sh_o_q <= (op_q == 3'd3) ? 7'd14 : ({{1'b0, shift_q}} + (q_norm ? {{3'd0, kk_q}} : 7'd0));
    rnd_o_q <= rnd_of(sh_o_q);
end
// the consumer's state, ahead of its use by the request generator
reg [3:0] c_st;

// ---- banks ----
reg [63:0] ab [0:{nwl}];   // the row (a, t, or the add/silu result)
reg [63:0] bb [0:{nwl}];   // the rope cos/sin row
reg [63:0] wb [0:{nwl}];   // the rmsnorm weights, or the combine table
reg [383:0] acc [0:{n8l}]; // combine: 8 lanes of 48-bit sums per int8 word

// ---- read requests, ahead of the data ----
reg [1:0] g_st;
reg [31:0] g_row, g_prow;
reg g_rlast, g_plast, g_jlast;  // g_row, g_prow, g_j at their last value
reg [63:0] g_off, g_poff;
reg [31:0] g_j, g_ent;
wire [63:0] g_idx = {{32'd0, wb[g_ent[{awh}:0]][31:0]}};
// combine: the gathers wait until the whole table is in
wire g_wait = q_tab && (g_st == G_B) && (c_st == C_W);
always @* begin
    rd_req_valid = running && (g_st != G_DONE) && !g_wait;
    rd_req_len = (g_st == G_P) ? (q_tab ? {{{padw}'d0, tl_q}} : {{{padw}'d0, nw_q}}) : {{{padw}'d0, nwr_q}};
    case (g_st)
        G_P: rd_req_addr = pp_q;
        G_A: rd_req_addr = pa_q + g_off;
        default: rd_req_addr = (op_q == 3'd3) ? (pp_q + g_poff)
                             : (q_tab ? (pb_q + g_idx * row8_bytes_q) : (pb_q + g_off));
    endcase
end

// ---- consumer ----
reg [{awh}:0] c_w;       // word within the row (consume) / next out word to issue (write)
reg [{awh}:0] c_rem;     // words after c_w in this phase: c_w is the last when c_rem == 0
reg [31:0] c_row, c_j, c_ent;
reg c_rlast, c_jlast, c_j0;
reg [63:0] o_off;
reg [63:0] ss;
reg [31:0] mv_q;
reg [95:0] mp_q; // ss * inv_n (norm step 0)
reg [4:0] qe_q;  // the even leading-one position of mv_q (norm step 2)
reg [1:0] n_k;   // norm step
always @* rd_data_ready = running && (c_st == C_W || c_st == C_A || c_st == C_B);
wire c_take = rd_data_valid && rd_data_ready;
wire c_last = (c_rem == {aw}'d0);
wire signed [15:0] cw = wb[c_ent[{awh}:0]][47:32];
wire [383:0] acc_rd = acc[c_w];
{c_lanes}
wire [383:0] c_word = {{cn_7, cn_6, cn_5, cn_4, cn_3, cn_2, cn_1, cn_0}};

// ---- compute pipeline of the b stream: b1 (the a word read beside the b word) .. b9, then
// the bank write; sum-of-squares pipeline s1 .. s3, then ss ----
reg bv1, bv2, bv3, bv4, bv5, bv6, bv7, bv8, bv9;
reg [{awh}:0] b1_w, b2_w, b3_w, b4_w, b5_w, b6_w, b7_w, b8_w, b9_w;
reg [63:0] b1_d, b2_a, b2_d, b3_a, b3_d, b4_a, b4_d, b5_d;
reg [63:0] b3_t, b4_t, b5_t, b6_t, b7_t, b8_t, b9_word;
reg [63:0] ab_q;  // ab[c_w], read at a b take or as the write-out's o1
reg ov1, ov2, ov3, ov4, ov5, ol1, ol2, ol3, ol4, ol5;
wire o_en = !ov5 || wr_data_ready;  // the write-out pipeline moves unless its word waits
wire ab_ren = (c_st == C_B) ? c_take : o_en;
always @(posedge clock) if (ab_ren) ab_q <= ab[c_w];
{b_lanes}
{b8_lanes}
wire [63:0] b2_t = {{b2_t_3, b2_t_2, b2_t_1, b2_t_0}};
always @(posedge clock) begin
    if (reset) begin
        bv1 <= 1'b0; bv2 <= 1'b0; bv3 <= 1'b0; bv4 <= 1'b0; bv5 <= 1'b0; bv6 <= 1'b0; bv7 <= 1'b0;
        bv8 <= 1'b0; bv9 <= 1'b0;
    end else begin
        bv1 <= running && c_take && (c_st == C_B) && q_bpipe;
        bv2 <= bv1; bv3 <= bv2; bv4 <= bv3; bv5 <= bv4; bv6 <= bv5; bv7 <= bv6; bv8 <= bv7; bv9 <= bv8;
    end
    b1_w <= c_w; b2_w <= b1_w; b3_w <= b2_w; b4_w <= b3_w; b5_w <= b4_w; b6_w <= b5_w;
    b7_w <= b6_w; b8_w <= b7_w; b9_w <= b8_w;
    b1_d <= rd_data; b2_a <= ab_q; b2_d <= b1_d; b3_a <= b2_a; b3_d <= b2_d; b4_a <= b3_a;
    b4_d <= b3_d; b5_d <= b4_d;
    b3_t <= b2_t; b4_t <= b3_t; b5_t <= b4_t; b6_t <= b5_t; b7_t <= b6_t; b8_t <= b7_t;
    case (op_q)
        3'd4: b9_word <= {{sat16(b8_r_3), sat16(b8_r_2), sat16(b8_r_1), sat16(b8_r_0)}};
        3'd5: b9_word <= {{sat8(b8_r8_7), sat8(b8_r8_6), sat8(b8_r8_5), sat8(b8_r8_4),
                          sat8(b8_r8_3), sat8(b8_r8_2), sat8(b8_r8_1), sat8(b8_r8_0)}};
        default: b9_word <= b8_t;
    endcase
end
reg sv1, sv2, sv3;
reg [63:0] s1_x;
reg [31:0] s2_q0, s2_q1, s2_q2, s2_q3;
reg [33:0] s3_sum;
always @(posedge clock) begin
    if (reset) begin
        sv1 <= 1'b0; sv2 <= 1'b0; sv3 <= 1'b0;
    end else begin
        sv1 <= running && (((op_q == 3'd1) && c_take && (c_st == C_A)) || ((op_q == 3'd2) && bv2));
        sv2 <= sv1; sv3 <= sv2;
    end
    s1_x <= (op_q == 3'd1) ? rd_data : b2_t;
    s2_q0 <= $signed(s1_x[15:0]) * $signed(s1_x[15:0]);
    s2_q1 <= $signed(s1_x[31:16]) * $signed(s1_x[31:16]);
    s2_q2 <= $signed(s1_x[47:32]) * $signed(s1_x[47:32]);
    s2_q3 <= $signed(s1_x[63:48]) * $signed(s1_x[63:48]);
    s3_sum <= ({{2'd0, s2_q0}} + {{2'd0, s2_q1}}) + ({{2'd0, s2_q2}} + {{2'd0, s2_q3}});
end
wire pipe_busy = bv1 || bv2 || bv3 || bv4 || bv5 || bv6 || bv7 || bv8 || bv9 || sv1 || sv2 || sv3;

// the banks' one write port each
wire ab_we = bv9 || (c_take && c_st == C_A);
wire [{awh}:0] ab_wa = bv9 ? b9_w : c_w;
wire [63:0] ab_wd = bv9 ? b9_word : rd_data;
always @(posedge clock) begin
    if (c_take && c_st == C_W) wb[c_w] <= rd_data;
    if (ab_we) ab[ab_wa] <= ab_wd;
    if (c_take && c_st == C_B && op_q == 3'd3) bb[c_w] <= rd_data;
    if (c_take && c_st == C_B && q_tab) acc[c_w] <= c_word;
end

// ---- norm: m = (ss * inv_n) >> 32, v = max(1, min(m + eps_q, 2^32 - 1)) ----
wire [95:0] m_prod = ss * {{32'd0, c1_q}};
wire [64:0] m_sum = {{1'b0, mp_q[95:32]}} + {{33'd0, c0_q}};
wire [31:0] v_c = (m_sum > 65'h0ffffffff) ? 32'hffffffff : ((m_sum == 65'd0) ? 32'd1 : m_sum[31:0]);
reg [4:0] lead;
integer li;
always @* begin
    lead = 5'd0;
    for (li = 0; li < 32; li = li + 1) if (mv_q[li]) lead = li[4:0];
end
wire [4:0] q_even = {{lead[4:1], 1'b0}};
wire [39:0] v_sh = {{8'd0, mv_q}} << 7;
wire [39:0] v_idx = v_sh >> qe_q;

// ---- write-out pipeline: o1 (bank reads) .. o5 (the word on wr_data), held while the shell
// does not take the word ----
reg o_all;  // every word of this phase issued
reg [63:0] wb_q, x1_q, x2_q, cs_c_q, cs_s_q, o2_ab, o3_ab, o4_ab, wr_q;
reg [383:0] acc_q;
reg o1_half, o1_fh, o2_fh;
wire o_phase = (c_st == C_YDAT) || (c_st == C_SDAT);
wire o_go = o_phase && !o_all;
wire o_first_half = (c_w < h4_q);
wire [{awh}:0] o_lo = o_first_half ? c_w : (c_w - h4_q);
wire [{awh}:0] o_hi = o_lo + h4_q;
wire o_pass = (c_st == C_SDAT) || (op_q == 3'd0) || (op_q == 3'd4) || (op_q == 3'd5);
wire o_done = ov5 && ol5 && wr_data_ready;
{o_lanes}
always @(posedge clock) if (o_en) begin
    wb_q <= wb[c_w]; x1_q <= ab[o_lo]; x2_q <= ab[o_hi]; cs_c_q <= bb[o_lo]; cs_s_q <= bb[o_hi];
    acc_q <= acc[c_w >> 1]; o1_half <= c_w[0]; o1_fh <= o_first_half; o2_fh <= o1_fh;
    o2_ab <= ab_q; o3_ab <= o2_ab; o4_ab <= o3_ab;
    wr_q <= o_pass ? o4_ab : {{sat16(o4_f_3), sat16(o4_f_2), sat16(o4_f_1), sat16(o4_f_0)}};
end
always @(posedge clock) begin
    if (reset || !running) begin
        ov1 <= 1'b0; ov2 <= 1'b0; ov3 <= 1'b0; ov4 <= 1'b0; ov5 <= 1'b0;
        ol1 <= 1'b0; ol2 <= 1'b0; ol3 <= 1'b0; ol4 <= 1'b0; ol5 <= 1'b0;
    end else if (o_en) begin
        ov1 <= o_go; ol1 <= o_go && c_last;
        ov2 <= ov1; ov3 <= ov2; ov4 <= ov3; ov5 <= ov4;
        ol2 <= ol1; ol3 <= ol2; ol4 <= ol3; ol5 <= ol4;
    end
end

always @* begin
    wr_req_valid = running && (c_st == C_YREQ || c_st == C_SREQ);
    wr_req_addr = ((c_st == C_SREQ) ? ps_q : py_q) + o_off;
    wr_req_len = {{{padw}'d0, nwo_q}};
    wr_data_valid = ov5;
    wr_strb = 8'hFF;
    wr_data = wr_q;
end

always @(posedge clock) begin
    done <= 1'b0;
    if (reset) begin
        running <= 1'b0; g_st <= G_DONE; c_st <= C_IDLE;
    end else begin
        if (start && !running) begin
            if (args_ok) begin
                running <= 1'b1;
                op_q <= arg0[2:0]; nw_q <= ar_nw; h4_q <= ar_h4; tl_q <= ar_tl;
                nwr_q <= ar_nwr; nwr_m1_q <= ar_nwr_m1; nwo_q <= ar_nwo; nwo_m1_q <= ar_nwo_m1;
                row_bytes_q <= {{{padb}'d0, ar_nwr, 3'd0}}; out_bytes_q <= {{{padb}'d0, ar_nwo, 3'd0}};
                row8_bytes_q <= {{{padb}'d0, ar_n8, 3'd0}};
                rows_m2_q <= ar_rows_m2; c0_m2_q <= ar_c0_m2; c01_q <= ar_c01;
                g_rlast <= ar_rows1; g_plast <= ar_c01; g_jlast <= ar_c01;
                c_rlast <= ar_rows1; c_jlast <= ar_c01;
                g_j <= 32'd0; g_ent <= 32'd0; c_j <= 32'd0; c_j0 <= 1'b1; c_ent <= 32'd0;
                shift_q <= arg3[5:0]; c0_q <= arg4; c1_q <= arg5;
                pa_q <= ptr0; pb_q <= ptr1; pp_q <= ptr2; py_q <= ptr3; ps_q <= ptr4;
                g_st <= (op_norm || op_tab) ? G_P : G_A; g_row <= 32'd0; g_prow <= 32'd0; g_off <= 64'd0; g_poff <= 64'd0;
                c_st <= (op_norm || op_tab) ? C_W : C_A; c_w <= 0; c_rem <= ar_rem0;
                c_row <= 32'd0; o_off <= 64'd0; ss <= 64'd0; o_all <= 1'b0;
            end else done <= 1'b1;
        end
        // request generator
        if (rd_req_valid && rd_req_ready) begin
            case (g_st)
                G_P: g_st <= q_tab ? G_B : G_A;
                G_A: if (q_has_b) g_st <= G_B;
                     else begin
                         g_off <= g_off + row_bytes_q; g_row <= g_row + 32'd1; g_rlast <= (g_row == rows_m2_q);
                         if (g_rlast) g_st <= G_DONE;
                     end
                default: if (q_tab) begin
                    g_ent <= g_ent + 32'd1;
                    if (g_jlast) begin
                        g_j <= 32'd0; g_jlast <= c01_q;
                        g_row <= g_row + 32'd1; g_rlast <= (g_row == rows_m2_q);
                        if (g_rlast) g_st <= G_DONE;
                    end else begin g_j <= g_j + 32'd1; g_jlast <= (g_j == c0_m2_q); end
                end else begin
                    g_off <= g_off + row_bytes_q; g_row <= g_row + 32'd1; g_rlast <= (g_row == rows_m2_q);
                    if (g_plast) begin g_prow <= 32'd0; g_poff <= 64'd0; g_plast <= c01_q; end
                    else begin g_prow <= g_prow + 32'd1; g_poff <= g_poff + row_bytes_q; g_plast <= (g_prow == c0_m2_q); end
                    g_st <= g_rlast ? G_DONE : G_A;
                end
            endcase
        end
        // consumer, norm steps and write-out
        if (sv3) ss <= ss + {{30'd0, s3_sum}};
        case (c_st)
            C_W: if (c_take) begin
                if (c_last) begin c_w <= 0; c_rem <= nwr_m1_q; c_st <= q_tab ? C_B : C_A; end
                else begin c_w <= c_w + 1'b1; c_rem <= c_rem - 1'b1; end
            end
            C_A: if (c_take) begin
                if (c_last) begin c_w <= 0; c_rem <= nwr_m1_q; c_st <= q_has_b ? C_B : C_DR; end
                else begin c_w <= c_w + 1'b1; c_rem <= c_rem - 1'b1; end
            end
            C_B: if (c_take) begin
                if (c_last) begin
                    c_w <= 0; c_rem <= nwr_m1_q;
                    if (q_tab) begin
                        c_ent <= c_ent + 32'd1;
                        if (c_jlast) begin c_j <= 32'd0; c_j0 <= 1'b1; c_jlast <= c01_q; c_st <= C_YREQ; end
                        else begin c_j <= c_j + 32'd1; c_j0 <= 1'b0; c_jlast <= (c_j == c0_m2_q); end
                    end else c_st <= C_DR;
                end else begin c_w <= c_w + 1'b1; c_rem <= c_rem - 1'b1; end
            end
            C_DR: if (!pipe_busy) begin c_st <= q_norm ? C_N : C_YREQ; n_k <= 2'd0; end
            C_N: begin
                n_k <= n_k + 2'd1;
                case (n_k)
                    2'd0: mp_q <= m_prod;
                    2'd1: mv_q <= v_c;
                    2'd2: qe_q <= q_even;
                    default: begin rr_q <= rsq(v_idx[8:0]); kk_q <= qe_q[4:1]; c_st <= C_YREQ; end
                endcase
            end
            C_YREQ: if (wr_req_ready) begin c_st <= C_YDAT; c_w <= 0; c_rem <= nwo_m1_q; o_all <= 1'b0; end
            C_YDAT, C_SDAT: begin
                if (o_go && o_en) begin
                    if (c_last) o_all <= 1'b1; else begin c_w <= c_w + 1'b1; c_rem <= c_rem - 1'b1; end
                end
                if (o_done) begin
                    c_w <= 0; c_rem <= nwr_m1_q;
                    if (c_st == C_YDAT && op_q == 3'd2) c_st <= C_SREQ;
                    else begin
                        c_st <= q_tab ? C_B : C_A; ss <= 64'd0; o_off <= o_off + out_bytes_q;
                        c_row <= c_row + 32'd1; c_rlast <= (c_row == rows_m2_q);
                        if (c_rlast) begin c_st <= C_IDLE; running <= 1'b0; done <= 1'b1; g_st <= G_DONE; end
                    end
                end
            end
            C_SREQ: if (wr_req_ready) begin c_st <= C_SDAT; c_w <= 0; c_rem <= nwo_m1_q; o_all <= 1'b0; end
            default: ;
        endcase
    end
end
"#,
        nwl = nw - 1,
        n8l = (p.n_max / 8).max(1) - 1,
        awh = aw - 1,
        padb = 64 - 3 - aw,
        padw = 32 - aw,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::check_core_ports;

    #[test]
    fn verilog_has_the_contract_ports() {
        for n_max in [8, 64, 4096] {
            let v = VecopsCore { n_max }.core_verilog().expect("verilog");
            check_core_ports(&v, "vecops_core").expect("ports");
        }
    }

    #[test]
    fn register_offsets_as_documented() {
        let slots = VecopsCore::default().desc().slots().expect("slots");
        let offs: Vec<u32> = slots.iter().map(|s| s.offset).collect();
        let want: Vec<u32> = (0..11).map(|i| 0x10 + 8 * i).collect();
        assert_eq!(offs, want);
        assert_eq!(slots[5].arg.name, "op");
        assert_eq!(slots[10].arg.name, "c1");
    }

    #[test]
    fn bad_parameters_are_refused() {
        for n_max in [0, 4, 12, 65544] {
            assert!(VecopsCore { n_max }.core_verilog().is_err(), "{n_max}");
        }
    }
}
