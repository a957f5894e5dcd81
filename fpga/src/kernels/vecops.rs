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
    let mut lanes = String::new();
    for l in 0..4 {
        let o = 16 * l;
        let _ = writeln!(
            lanes,
            r#"// lane {l}
wire signed [15:0] d_{l} = rd_data[{o} +: 16];
wire signed [15:0] ab_{l} = ab_rd[{o} +: 16];
wire signed [63:0] sum_{l} = ab_{l} + d_{l};
wire signed [15:0] t_{l} = sat16(sum_{l});
wire signed [15:0] tt_{l} = (op_q == 3'd1) ? d_{l} : t_{l};
wire signed [63:0] sq_{l} = tt_{l} * tt_{l};
wire signed [63:0] zp_{l} = ab_{l} * $signed({{1'b0, c0_q}});
wire signed [63:0] z_{l} = rsh(zp_{l}, {{1'b0, c1_q[5:0]}});
wire [16:0] sg_{l} = (z_{l} >= 64'sd512) ? 17'd32768 : ((z_{l} < -64'sd512) ? 17'd0 : sig(z_{l}[9:0] ^ 10'h200));
wire signed [63:0] sm_{l} = ab_{l} * $signed(sg_{l}) * d_{l};
wire signed [15:0] si_{l} = sat16(rsh(sm_{l}, {{1'b0, shift_q}}));
// write-out lane: rmsnorm y from the row bank and the weights
wire signed [15:0] ot_{l} = o_ab[{o} +: 16];
wire signed [15:0] ow_{l} = o_wb[{o} +: 16];
wire signed [63:0] np_{l} = ot_{l} * ow_{l} * $signed({{1'b0, rr_q}});
wire signed [15:0] ny_{l} = sat16(rsh(np_{l}, {{1'b0, shift_q}} + {{3'd0, kk_q}}));
// rope lane
wire signed [15:0] x1_{l} = r_x1[{o} +: 16];
wire signed [15:0] x2_{l} = r_x2[{o} +: 16];
wire signed [15:0] rc_{l} = r_c[{o} +: 16];
wire signed [15:0] rsn_{l} = r_s[{o} +: 16];
wire signed [63:0] rlo_{l} = x1_{l} * rc_{l} - x2_{l} * rsn_{l};
wire signed [63:0] rhi_{l} = x2_{l} * rc_{l} + x1_{l} * rsn_{l};
wire signed [15:0] ry_{l} = sat16(rsh(o_first_half ? rlo_{l} : rhi_{l}, 7'd14));"#
        );
    }
    let mut lanes8 = String::new();
    for l in 0..8 {
        let o = 8 * l;
        let _ = writeln!(
            lanes8,
            r#"// int8 lane {l}: silu_mul8 (gate from the row bank, up from the data) and combine
wire signed [7:0] g8_{l} = ab_rd[{o} +: 8];
wire signed [7:0] u8_{l} = rd_data[{o} +: 8];
wire signed [63:0] z8p_{l} = g8_{l} * $signed({{1'b0, c0_q}});
wire signed [63:0] z8_{l} = rsh(z8p_{l}, {{1'b0, c1_q[5:0]}});
wire [16:0] sg8_{l} = (z8_{l} >= 64'sd512) ? 17'd32768 : ((z8_{l} < -64'sd512) ? 17'd0 : sig(z8_{l}[9:0] ^ 10'h200));
wire signed [63:0] sm8_{l} = g8_{l} * $signed(sg8_{l}) * u8_{l} * $signed({{1'b0, c1_q[31:16]}});
wire [7:0] s8_{l} = sat8(rsh(sm8_{l}, {{1'b0, shift_q}}));
wire signed [47:0] ca_{l} = acc_rd[{ao} +: 48];
wire signed [47:0] cn_{l} = ((c_j == 32'd0) ? 48'sd0 : ca_{l}) + cw * u8_{l};"#,
            ao = 48 * l
        );
    }
    let mut ylanes = String::new();
    for i in 0..4 {
        let (lo, hi) = (48 * i, 48 * (i + 4));
        let _ = writeln!(
            ylanes,
            "wire signed [47:0] oa_{i} = o_half ? o_acc[{hi} +: 48] : o_acc[{lo} +: 48];"
        );
        let _ = writeln!(
            ylanes,
            "wire [15:0] cy_{i} = sat16(rsh(oa_{i}, {{1'b0, shift_q}}));"
        );
    }
    format!(
        r#"
// vecops core (tandem-fpga): n_max = {n_max} elements ({nw} words per bank).
// Semantics: fpga::golden::vecops.
/* verilator lint_off UNUSED */
/* verilator lint_off WIDTH */
{header}
localparam [31:0] N_MAX = 32'd{n_max};
localparam [3:0] C_IDLE = 4'd0, C_W = 4'd1, C_A = 4'd2, C_B = 4'd3, C_N1 = 4'd4, C_N2 = 4'd5,
                 C_YREQ = 4'd6, C_YDAT = 4'd7, C_SREQ = 4'd8, C_SDAT = 4'd9, C_N3 = 4'd10;
localparam [1:0] G_P = 2'd0, G_A = 2'd1, G_B = 2'd2, G_DONE = 2'd3;

function signed [15:0] sat16;
    input signed [63:0] v;
    sat16 = (v > 64'sd32767) ? 16'sh7fff : ((v < -64'sd32768) ? 16'sh8000 : v[15:0]);
endfunction

function signed [7:0] sat8;
    input signed [63:0] v;
    sat8 = (v > 64'sd127) ? 8'sh7f : ((v < -64'sd128) ? 8'sh80 : v[7:0]);
endfunction

function signed [63:0] rsh;
    input signed [63:0] v;
    input [6:0] s;
    rsh = (s == 7'd0) ? v : ((v + (64'sd1 <<< (s - 7'd1))) >>> s);
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

// ---- run control and arguments ----
reg running;
reg [2:0] op_q;
reg [31:0] rows_q, c0_q, c1_q;
reg [{awh}:0] nw_q, h4_q, n8_q, tl_q;
// counter ends prepared at start: `x + 1 == n` is `x == n - 1` (mod the width)
reg [31:0] rows_m1_q, c0_m1_q;
reg [{awh}:0] nw_m1_q, n8_m1_q, tl_m1_q;
reg [5:0] shift_q;
reg [63:0] pa_q, pb_q, pp_q, py_q, ps_q;
assign busy = running;
wire [31:0] nw_arg = (arg2 + 32'd3) >> 2;
wire [31:0] n8_arg = (arg2 + 32'd7) >> 3;
wire [63:0] tl_arg = {{32'd0, arg1}} * {{32'd0, arg4}};
wire op_norm = (arg0 == 32'd1) || (arg0 == 32'd2);
wire op_tab = (arg0 == 32'd6);
wire args_ok_w = (arg0 <= 32'd6) && (arg1 != 32'd0) && (arg2 != 32'd0) && (arg2 <= N_MAX)
            && (!op_norm || (arg3 >= 32'd1 && arg3 <= 32'd47))
            && (arg0 != 32'd3 || (arg2[2:0] == 3'd0 && arg4 != 32'd0))
            && (arg0 != 32'd4 || (arg3 <= 32'd47 && arg5 <= 32'd47))
            && (arg0 != 32'd5 || (arg3 <= 32'd47 && arg5[15:0] <= 16'd47))
            && (arg0 != 32'd6 || (arg3 <= 32'd47 && arg4 != 32'd0 && tl_arg <= {{32'd0, N_MAX >> 2}}));
// registered (as the router's): the arguments are written before the transaction that sets
// ap_start, so the checks stay out of the run-start path
reg args_ok;
always @(posedge clock) args_ok <= !reset && args_ok_w;
wire q_norm = (op_q == 3'd1) || (op_q == 3'd2);
wire q_has_b = (op_q != 3'd1);  // a second stream per row: b, or the rope table
wire q_tab = (op_q == 3'd6);    // combine: the table, then k gathered int8 rows per row
wire q_i8 = (op_q == 3'd5) || (op_q == 3'd6);
wire [{awh}:0] nwr = q_i8 ? n8_q : nw_q;               // words read per data row
wire [{awh}:0] nwo = (op_q == 3'd5) ? n8_q : nw_q;     // words written per row
wire [{awh}:0] nwr_m1 = q_i8 ? n8_m1_q : nw_m1_q;
wire [{awh}:0] nwo_m1 = (op_q == 3'd5) ? n8_m1_q : nw_m1_q;

// ---- banks ----
reg [63:0] ab [0:{nwl}];   // the row (a, t, or the add/silu result)
reg [63:0] bb [0:{nwl}];   // the rope cos/sin row
reg [63:0] wb [0:{nwl}];   // the rmsnorm weights, or the combine table
reg [383:0] acc [0:{n8l}]; // combine: 8 lanes of 48-bit sums per int8 word

// ---- read requests, ahead of the data ----
reg [1:0] g_st;
reg [31:0] g_row, g_prow;
reg [63:0] g_off, g_poff;
reg [31:0] g_j, g_ent;
wire [63:0] row_bytes = {{{padb}'d0, nwr, 3'd0}};
wire [63:0] out_bytes = {{{padb}'d0, nwo, 3'd0}};
wire [63:0] row8_bytes = {{{padb}'d0, n8_q, 3'd0}};
wire [63:0] g_idx = {{32'd0, wb[g_ent[{awh}:0]][31:0]}};
// combine: the gathers wait until the whole table is in
wire g_wait = q_tab && (g_st == G_B) && (c_st == C_W);
always @* begin
    rd_req_valid = running && (g_st != G_DONE) && !g_wait;
    rd_req_len = (g_st == G_P) ? (q_tab ? {{{padw}'d0, tl_q}} : {{{padw}'d0, nw_q}}) : {{{padw}'d0, nwr}};
    case (g_st)
        G_P: rd_req_addr = pp_q;
        G_A: rd_req_addr = pa_q + g_off;
        default: rd_req_addr = (op_q == 3'd3) ? (pp_q + g_poff)
                             : (q_tab ? (pb_q + g_idx * row8_bytes) : (pb_q + g_off));
    endcase
end

// ---- consumer and write-out ----
reg [3:0] c_st;
reg [{awh}:0] c_w;       // word within the row (consume) / out word (write)
reg [31:0] c_row, c_j, c_ent;
reg [63:0] o_off;
reg [63:0] ss;
reg [31:0] mv_q;
reg [15:0] rr_q;
reg [3:0] kk_q;
reg [4:0] qe_q;  // the even leading-one position of mv_q (norm stage 2)
wire [63:0] ab_rd = ab[c_w];
wire [383:0] acc_rd = acc[c_w];
wire signed [15:0] cw = wb[c_ent[{awh}:0]][47:32];
always @* rd_data_ready = running && (c_st == C_W || c_st == C_A || c_st == C_B);
wire c_take = rd_data_valid && rd_data_ready;
wire [{awh}:0] c_len_m1 = (c_st == C_W) ? (q_tab ? tl_m1_q : nw_m1_q)
                     : ((c_st == C_YDAT || c_st == C_SDAT) ? nwo_m1 : nwr_m1);
wire c_last = (c_w == c_len_m1);
// out word sources
wire [63:0] o_ab = ab[c_w];
wire [383:0] o_acc = acc[c_w >> 1];
wire o_half = c_w[0];
wire [63:0] o_wb = wb[c_w];
wire o_first_half = (c_w < h4_q);
wire [{awh}:0] o_lo = o_first_half ? c_w : (c_w - h4_q);
wire [{awh}:0] o_hi = o_lo + h4_q;
wire [63:0] r_x1 = ab[o_lo];
wire [63:0] r_x2 = ab[o_hi];
wire [63:0] r_c = bb[o_lo];
wire [63:0] r_s = bb[o_hi];
{lanes}
{lanes8}
{ylanes}
wire [63:0] sq_sum = sq_0 + sq_1 + sq_2 + sq_3;
wire [63:0] b_word = (op_q == 3'd0) ? {{t_3, t_2, t_1, t_0}} : ((op_q == 3'd2) ? {{t_3, t_2, t_1, t_0}}
                   : ((op_q == 3'd5) ? {{s8_7, s8_6, s8_5, s8_4, s8_3, s8_2, s8_1, s8_0}} : {{si_3, si_2, si_1, si_0}}));
wire [383:0] c_word = {{cn_7, cn_6, cn_5, cn_4, cn_3, cn_2, cn_1, cn_0}};
// norm: m = (ss * inv_n) >> 32, v = max(1, min(m + eps_q, 2^32 - 1))
wire [95:0] m_prod = ss * {{32'd0, c1_q}};
wire [64:0] m_sum = {{1'b0, m_prod[95:32]}} + {{33'd0, c0_q}};
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

always @(posedge clock) begin
    if (c_take && c_st == C_W) wb[c_w] <= rd_data;
    if (c_take && c_st == C_A) ab[c_w] <= rd_data;
    if (c_take && c_st == C_B) begin
        if (op_q == 3'd3) bb[c_w] <= rd_data;
        else if (q_tab) acc[c_w] <= c_word;
        else ab[c_w] <= b_word;
    end
end

always @* begin
    wr_req_valid = running && (c_st == C_YREQ || c_st == C_SREQ);
    wr_req_addr = ((c_st == C_SREQ) ? ps_q : py_q) + o_off;
    wr_req_len = {{{padw}'d0, nwo}};
    wr_data_valid = running && (c_st == C_YDAT || c_st == C_SDAT);
    wr_strb = 8'hFF;
    if (c_st == C_SDAT || op_q == 3'd0 || op_q == 3'd4 || op_q == 3'd5) wr_data = o_ab;
    else if (q_tab) wr_data = {{cy_3, cy_2, cy_1, cy_0}};
    else if (op_q == 3'd3) wr_data = {{ry_3, ry_2, ry_1, ry_0}};
    else wr_data = {{ny_3, ny_2, ny_1, ny_0}};
end

always @(posedge clock) begin
    done <= 1'b0;
    if (reset) begin
        running <= 1'b0; g_st <= G_DONE; c_st <= C_IDLE;
    end else begin
        if (start && !running) begin
            if (args_ok) begin
                running <= 1'b1;
                op_q <= arg0[2:0]; rows_q <= arg1; nw_q <= nw_arg[{awh}:0]; h4_q <= nw_arg[{aw}:1];
                n8_q <= n8_arg[{awh}:0]; tl_q <= tl_arg[{awh}:0];
                rows_m1_q <= arg1 - 32'd1; c0_m1_q <= arg4 - 32'd1;
                nw_m1_q <= nw_arg[{awh}:0] - 1'b1; n8_m1_q <= n8_arg[{awh}:0] - 1'b1;
                tl_m1_q <= tl_arg[{awh}:0] - 1'b1;
                g_j <= 32'd0; g_ent <= 32'd0; c_j <= 32'd0; c_ent <= 32'd0;
                shift_q <= arg3[5:0]; c0_q <= arg4; c1_q <= arg5;
                pa_q <= ptr0; pb_q <= ptr1; pp_q <= ptr2; py_q <= ptr3; ps_q <= ptr4;
                g_st <= (op_norm || op_tab) ? G_P : G_A; g_row <= 32'd0; g_prow <= 32'd0; g_off <= 64'd0; g_poff <= 64'd0;
                c_st <= (op_norm || op_tab) ? C_W : C_A; c_w <= 0; c_row <= 32'd0; o_off <= 64'd0; ss <= 64'd0;
            end else done <= 1'b1;
        end
        // request generator
        if (rd_req_valid && rd_req_ready) begin
            case (g_st)
                G_P: g_st <= q_tab ? G_B : G_A;
                G_A: if (q_has_b) g_st <= G_B;
                     else begin
                         g_off <= g_off + row_bytes; g_row <= g_row + 32'd1;
                         if (g_row == rows_m1_q) g_st <= G_DONE;
                     end
                default: if (q_tab) begin
                    g_ent <= g_ent + 32'd1;
                    if (g_j == c0_m1_q) begin
                        g_j <= 32'd0; g_row <= g_row + 32'd1;
                        if (g_row == rows_m1_q) g_st <= G_DONE;
                    end else g_j <= g_j + 32'd1;
                end else begin
                    g_off <= g_off + row_bytes; g_row <= g_row + 32'd1;
                    if (g_prow == c0_m1_q) begin g_prow <= 32'd0; g_poff <= 64'd0; end
                    else begin g_prow <= g_prow + 32'd1; g_poff <= g_poff + row_bytes; end
                    g_st <= (g_row == rows_m1_q) ? G_DONE : G_A;
                end
            endcase
        end
        // consumer / write-out
        case (c_st)
            C_W: if (c_take) begin
                if (c_last) begin c_w <= 0; c_st <= q_tab ? C_B : C_A; end else c_w <= c_w + 1'b1;
            end
            C_A: if (c_take) begin
                if (op_q == 3'd1) ss <= ss + sq_sum;
                if (c_last) begin c_w <= 0; c_st <= q_has_b ? C_B : C_N1; end else c_w <= c_w + 1'b1;
            end
            C_B: if (c_take) begin
                if (op_q == 3'd2) ss <= ss + sq_sum;
                if (c_last) begin
                    c_w <= 0;
                    if (q_tab) begin
                        c_ent <= c_ent + 32'd1;
                        if (c_j == c0_m1_q) begin c_j <= 32'd0; c_st <= C_YREQ; end
                        else c_j <= c_j + 32'd1;
                    end else c_st <= q_norm ? C_N1 : C_YREQ;
                end else c_w <= c_w + 1'b1;
            end
            C_N1: begin mv_q <= v_c; c_st <= C_N2; end
            C_N2: begin qe_q <= q_even; c_st <= C_N3; end
            C_N3: begin rr_q <= rsq(v_idx[8:0]); kk_q <= qe_q[4:1]; c_st <= C_YREQ; end
            C_YREQ: if (wr_req_ready) c_st <= C_YDAT;
            C_YDAT: if (wr_data_ready) begin
                if (c_last) begin
                    c_w <= 0;
                    if (op_q == 3'd2) c_st <= C_SREQ;
                    else begin
                        c_st <= q_tab ? C_B : C_A; ss <= 64'd0; o_off <= o_off + out_bytes; c_row <= c_row + 32'd1;
                        if (c_row == rows_m1_q) begin c_st <= C_IDLE; running <= 1'b0; done <= 1'b1; g_st <= G_DONE; end
                    end
                end else c_w <= c_w + 1'b1;
            end
            C_SREQ: if (wr_req_ready) c_st <= C_SDAT;
            C_SDAT: if (wr_data_ready) begin
                if (c_last) begin
                    c_w <= 0; c_st <= C_A; ss <= 64'd0; o_off <= o_off + out_bytes; c_row <= c_row + 32'd1;
                    if (c_row == rows_m1_q) begin c_st <= C_IDLE; running <= 1'b0; done <= 1'b1; g_st <= G_DONE; end
                end else c_w <= c_w + 1'b1;
            end
            default: ;
        endcase
    end
end

endmodule // vecops_core
/* verilator lint_on WIDTH */
/* verilator lint_on UNUSED */
"#,
        header = crate::core::core_header("vecops_core", &["busy"]),
        n_max = p.n_max,
        nw = nw,
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
