//! The MoE router core: streams int16 logits, keeps the top-k of each token in a register
//! insertion network, computes a fixed-point softmax over the k selected logits, and writes
//! (id, weight) routes and the per-expert histogram. Semantics: [`crate::golden::router`].
//!
//! Pipeline (one logit per cycle in steady state):
//! 1. *unpack*: one 64-bit word holds 4 logits; the word is consumed one logit per cycle and
//!    the next word is accepted in the cycle the last logit of the current one is used;
//! 2. *insert*: `k_max` (value, index) registers kept sorted; a newcomer goes after every
//!    entry `>=` itself (ties: lower index first), shifting the rest down, in one cycle;
//!    the last logit of a row hands the finished list to the softmax stage and empties the
//!    network in the same cycle;
//! 3. *softmax* (while the next row streams), two slots per cycle: ceil(k/2) cycles of exp
//!    (shift + LUT), 4 cycles of a restoring divider for `2^30 / S` (4 quotient bits per
//!    cycle), ceil(k/2) cycles of normalise, pack (one output word) and histogram update.
//!    The stream stalls only if a row is shorter than this (E < k + 6 or so).
//! 4. *write-out*: routes (2 slots per word) as they are produced, then the histogram.
//!
//! Arguments: `logits` (ptr0), `routes` (ptr1), `hist` (ptr2), `tokens` (arg0),
//! `experts` (arg1), `top_k` (arg2). Invalid sizes (E = 0 or > e_max, k = 0 or > k_max or
//! > E) finish at once without touching memory; the host validates first.

use std::fmt::Write as _;

use crate::core::{CoreError, KernelCore};
use crate::golden::router::{LOG2E_Q14, exp2_lut};
use crate::regmap::{ArgDesc, KernelDesc};

/// Build parameters of the router.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouterCore {
    /// Most experts per token (power of two, 2..=4096): histogram size.
    pub e_max: u32,
    /// Most experts selected per token (1..=32): size of the insertion network.
    pub k_max: u32,
}

impl Default for RouterCore {
    fn default() -> Self {
        Self {
            e_max: 256,
            k_max: 8,
        }
    }
}

impl RouterCore {
    /// Checks the parameters.
    pub fn validate(&self) -> Result<(), CoreError> {
        let bad = |msg: String| {
            Err(CoreError::Param {
                kernel: "router".into(),
                msg,
            })
        };
        if !(2..=4096).contains(&self.e_max) || !self.e_max.is_power_of_two() {
            return bad(format!(
                "e_max = {} must be a power of two in 2..=4096",
                self.e_max
            ));
        }
        if !(1..=32).contains(&self.k_max) || self.k_max > self.e_max {
            return bad(format!(
                "k_max = {} must be in 1..=min(32, e_max)",
                self.k_max
            ));
        }
        Ok(())
    }
}

impl KernelCore for RouterCore {
    fn name(&self) -> &str {
        "router"
    }

    fn desc(&self) -> KernelDesc {
        KernelDesc {
            name: "router".into(),
            args: vec![
                ArgDesc::pointer("logits", "short*"),
                ArgDesc::pointer("routes", "uint*"),
                ArgDesc::pointer("hist", "uint*"),
                ArgDesc::scalar("tokens"),
                ArgDesc::scalar("experts"),
                ArgDesc::scalar("top_k"),
            ],
        }
    }

    fn params(&self) -> Vec<(String, i64)> {
        vec![
            ("e_max".into(), i64::from(self.e_max)),
            ("k_max".into(), i64::from(self.k_max)),
        ]
    }

    fn core_verilog(&self) -> Result<String, CoreError> {
        self.validate()?;
        Ok(router_verilog(self))
    }
}

fn router_verilog(p: &RouterCore) -> String {
    let km = p.k_max as usize;
    let iw = p.e_max.trailing_zeros() as usize;
    // Increment queue: 2*k_max entries (at least 4), a power of two.
    let qw = (2 * km).max(4).next_power_of_two().trailing_zeros() as usize;
    let q_depth = format!("{}'d{}", qw + 1, 1usize << qw);
    let mut decl = String::new();
    let mut net = String::new();
    let mut rst = String::new();
    let mut ins = String::new();
    let mut hand = String::new();
    let mut clear_net = String::new();
    let mut sel = String::new();
    let mut ewr = String::new();
    for j in 0..km {
        let _ = writeln!(
            decl,
            "reg signed [15:0] tv_{j}; reg [IW-1:0] ti_{j}; reg tk_{j};\n\
             reg signed [15:0] hv_{j}; reg [IW-1:0] hi_{j}; reg [15:0] ex_{j};\n\
             wire signed [15:0] nv_{j}; wire [IW-1:0] ni_{j}; wire nk_{j}; wire ge_{j};"
        );
        let _ = writeln!(net, "assign ge_{j} = tk_{j} && (tv_{j} >= v_in);");
        if j == 0 {
            let _ = writeln!(
                net,
                "assign nv_0 = ge_0 ? tv_0 : v_in;\nassign ni_0 = ge_0 ? ti_0 : i_in;\nassign nk_0 = ge_0 ? tk_0 : 1'b1;"
            );
        } else {
            let p = j - 1;
            let _ = writeln!(
                net,
                "assign nv_{j} = ge_{j} ? tv_{j} : (ge_{p} ? v_in : tv_{p});\n\
                 assign ni_{j} = ge_{j} ? ti_{j} : (ge_{p} ? i_in : ti_{p});\n\
                 assign nk_{j} = ge_{j} ? tk_{j} : (ge_{p} ? 1'b1 : tk_{p});"
            );
        }
        let _ = writeln!(
            rst,
            "        tk_{j} <= 1'b0; tv_{j} <= 16'sd0; ti_{j} <= {{IW{{1'b0}}}}; hv_{j} <= 16'sd0; hi_{j} <= {{IW{{1'b0}}}}; ex_{j} <= 16'd0;"
        );
        let _ = writeln!(
            ins,
            "                tv_{j} <= nv_{j}; ti_{j} <= ni_{j}; tk_{j} <= nk_{j};"
        );
        let _ = writeln!(hand, "                hv_{j} <= nv_{j}; hi_{j} <= ni_{j};");
        let _ = writeln!(clear_net, "                tk_{j} <= 1'b0;");
        if j % 2 == 0 {
            // Slots j and j+1 are handled together (the second may not exist).
            let (bv, bi, be, bw) = if j + 1 < km {
                (
                    format!("hv_{}", j + 1),
                    format!("hi_{}", j + 1),
                    format!("ex_{}", j + 1),
                    format!(" ex_{} <= eb_new;", j + 1),
                )
            } else {
                (
                    "16'sd0".into(),
                    "{IW{1'b0}}".into(),
                    "16'd0".into(),
                    String::new(),
                )
            };
            let _ = writeln!(
                sel,
                "        6'd{j}: begin sa_v = hv_{j}; sa_i = hi_{j}; sa_e = ex_{j}; sb_v = {bv}; sb_i = {bi}; sb_e = {be}; end"
            );
            let _ = writeln!(
                ewr,
                "                    6'd{j}: begin ex_{j} <= ea_new;{bw} end"
            );
        }
    }
    let lut = exp2_lut();
    let mut lut_cases = String::new();
    for (f, v) in lut.iter().enumerate() {
        let _ = writeln!(lut_cases, "        8'd{f}: lut = 16'd{v};");
    }
    format!(
        r#"
// MoE router core (tandem-fpga): e_max = {e_max}, k_max = {km}. Semantics: fpga::golden::router.
module router_core(
    input wire clock, input wire reset, input wire start,
    output reg done, output reg busy,
    input wire [31:0] arg0, input wire [31:0] arg1, input wire [31:0] arg2, input wire [31:0] arg3,
    input wire [31:0] arg4, input wire [31:0] arg5, input wire [31:0] arg6, input wire [31:0] arg7,
    input wire [63:0] ptr0, input wire [63:0] ptr1, input wire [63:0] ptr2, input wire [63:0] ptr3,
    input wire [63:0] ptr4, input wire [63:0] ptr5, input wire [63:0] ptr6, input wire [63:0] ptr7,
    output reg rd_req_valid, input wire rd_req_ready, output reg [63:0] rd_req_addr, output reg [31:0] rd_req_len,
    input wire rd_data_valid, output reg rd_data_ready, input wire [63:0] rd_data,
    output reg wr_req_valid, input wire wr_req_ready, output reg [63:0] wr_req_addr, output reg [31:0] wr_req_len,
    output reg wr_data_valid, input wire wr_data_ready, output reg [63:0] wr_data, output reg [7:0] wr_strb
);
localparam integer IW = {iw};
localparam [31:0] E_MAX = 32'd{e_max};
localparam [31:0] K_MAX = 32'd{km};
localparam [1:0] P_IDLE = 2'd0, P_EXP = 2'd1, P_DIV = 2'd2, P_NORM = 2'd3;
localparam [1:0] W_ROUTES = 2'd0, W_HREQ = 2'd1, W_HDATA = 2'd2, W_END = 2'd3;

function [15:0] lut;
    input [7:0] f;
    case (f)
{lut_cases}        default: lut = 16'd0;
    endcase
endfunction

// ---- run control ----
reg running;
reg [31:0] t_q;
reg [15:0] e_q;
reg [5:0] k_q;
reg [31:0] rd_len_q, rt_len_q, h_len_q;
reg rd_pend, wr_pend;
reg [1:0] wph;
reg [31:0] tout;
reg [15:0] clr_idx;
reg clr_done;
wire args_ok = (arg1 != 32'd0) && (arg1 <= E_MAX) && (arg2 != 32'd0) && (arg2 <= K_MAX) && (arg2 <= arg1);
wire [31:0] wpr = (arg1 + 32'd3) >> 2;
wire [31:0] opt = (arg2 + 32'd1) >> 1;
wire [63:0] rd_len_w = arg0 * wpr;
wire [63:0] rt_len_w = arg0 * opt;

// ---- unpack ----
reg w_valid;
reg [63:0] w_q;
reg [1:0] pos;
reg [15:0] eidx;
reg hand_full;
reg signed [15:0] v_in;
always @(*) begin
    case (pos)
        2'd0: v_in = w_q[15:0];
        2'd1: v_in = w_q[31:16];
        2'd2: v_in = w_q[47:32];
        default: v_in = w_q[63:48];
    endcase
end
wire [IW-1:0] i_in = eidx[IW-1:0];
wire last_in_row = (eidx == e_q - 16'd1);
wire last_in_word = (pos == 2'd3) || last_in_row;
wire elem_fire = w_valid && !(last_in_row && hand_full);
wire rd_fire = rd_data_valid && rd_data_ready;

// ---- insertion network ----
{decl}
{net}
// ---- softmax ----
reg [1:0] ph;
reg [5:0] sj;
reg [20:0] sum;
reg [35:0] rem;
reg [3:0] bitn;
reg [15:0] q_r;
reg signed [15:0] sa_v, sb_v;
reg [IW-1:0] sa_i, sb_i;
reg [15:0] sa_e, sb_e;
always @(*) begin
    sa_v = hv_0; sa_i = hi_0; sa_e = ex_0; sb_v = 16'sd0; sb_i = {{IW{{1'b0}}}}; sb_e = 16'd0;
    case (sj)
{sel}        default: ;
    endcase
end
// two slots per cycle: a = sj, b = sj + 1 (b exists when sj + 1 < k)
wire b_ok = (sj + 6'd1 < k_q);
wire last_pair = (sj + 6'd2 >= k_q);
wire [16:0] da = {{hv_0[15], hv_0}} - {{sa_v[15], sa_v}};
wire [16:0] db = {{hv_0[15], hv_0}} - {{sb_v[15], sb_v}};
wire [32:0] dla = {{16'd0, da}} * 33'd{log2e};
wire [32:0] dlb = {{16'd0, db}} * 33'd{log2e};
wire [16:0] ua = dla[30:14];
wire [16:0] ub = dlb[30:14];
wire [15:0] ea_new = (ua[16:8] >= 9'd16) ? 16'd0 : (lut(ua[7:0]) >> ua[11:8]);
wire [15:0] eb_new = (!b_ok || ub[16:8] >= 9'd16) ? 16'd0 : (lut(ub[7:0]) >> ub[11:8]);
// restoring division 2^30 / sum, four quotient bits per cycle (bits bitn .. bitn-3)
wire [35:0] sum36 = {{15'd0, sum}};
wire [35:0] s3 = sum36 << bitn;
wire [35:0] s2 = sum36 << (bitn - 4'd1);
wire [35:0] s1 = sum36 << (bitn - 4'd2);
wire [35:0] s0 = sum36 << (bitn - 4'd3);
wire g3 = rem >= s3;
wire [35:0] r3 = g3 ? rem - s3 : rem;
wire g2 = r3 >= s2;
wire [35:0] r2 = g2 ? r3 - s2 : r3;
wire g1 = r2 >= s1;
wire [35:0] r1 = g1 ? r2 - s1 : r2;
wire g0 = r1 >= s0;
wire [35:0] r0 = g0 ? r1 - s0 : r1;
wire [31:0] wpa = {{16'd0, sa_e}} * {{16'd0, q_r}} + 32'd16384;
wire [31:0] wpb = {{16'd0, sb_e}} * {{16'd0, q_r}} + 32'd16384;
wire [31:0] rec_a = {{wpa[30:15], {{(16-IW){{1'b0}}}}, sa_i}};
wire [31:0] rec_b = b_ok ? {{wpb[30:15], {{(16-IW){{1'b0}}}}, sb_i}} : 32'd0;
reg [63:0] ow;
reg ow_valid;
wire wr_fire = ow_valid && wr_data_ready;
wire ow_free = !ow_valid || wr_fire;

// ---- histogram: one LUTRAM port (async read, sync write), fed by a queue of increments ----
localparam integer QW = {qw};
reg [31:0] hist [0:{e_last}];
reg [16:0] hidx;
reg hsel;
reg [31:0] h_lo_q;
reg [IW-1:0] pq [0:{q_last}];
reg [QW:0] q_wp, q_rp;
wire [QW:0] q_cnt = q_wp - q_rp;
// the slot after q_wp, wrapped to QW bits here: an index written `pq[q_wp + 1]` relies on
// the addition wrapping at the index's width, which Icarus Verilog 11 does not do (its #515)
wire [QW-1:0] q_wp1 = q_wp[QW-1:0] + {{{{(QW-1){{1'b0}}}}, 1'b1}};
wire q_room = ({{1'b0, q_cnt}} + {{{{QW{{1'b0}}}}, 2'd2}} <= {{1'b0, {q_depth}}});
wire reading = (wph == W_HDATA);
wire incr = clr_done && !reading && (q_cnt != {{(QW+1){{1'b0}}}});
reg [IW-1:0] h_addr;
always @(*) begin
    if (!clr_done) h_addr = clr_idx[IW-1:0];
    else if (reading) h_addr = hidx[IW-1:0];
    else h_addr = pq[q_rp[QW-1:0]];
end
wire [31:0] h_rd = hist[h_addr];
wire h_we = running && (!clr_done || incr);
wire [31:0] h_wd = clr_done ? h_rd + 32'd1 : 32'd0;
always @(posedge clock) begin
    if (h_we) hist[h_addr] <= h_wd;
end
wire [31:0] h_val = ({{15'd0, hidx}} < {{16'd0, e_q}}) ? h_rd : 32'd0;

always @(*) begin
    rd_req_valid = rd_pend;
    rd_req_addr = ptr0;
    rd_req_len = rd_len_q;
    rd_data_ready = !w_valid || (elem_fire && last_in_word);
    wr_req_valid = wr_pend;
    wr_req_addr = (wph == W_ROUTES) ? ptr1 : ptr2;
    wr_req_len = (wph == W_ROUTES) ? rt_len_q : h_len_q;
    wr_data_valid = ow_valid;
    wr_data = ow;
    wr_strb = 8'hff;
    busy = running;
end

always @(posedge clock) begin
    if (reset) begin
        running <= 1'b0; done <= 1'b0;
        t_q <= 32'd0; e_q <= 16'd0; k_q <= 6'd0;
        rd_len_q <= 32'd0; rt_len_q <= 32'd0; h_len_q <= 32'd0;
        rd_pend <= 1'b0; wr_pend <= 1'b0; wph <= W_ROUTES; tout <= 32'd0;
        clr_idx <= 16'd0; clr_done <= 1'b0;
        w_valid <= 1'b0; w_q <= 64'd0; pos <= 2'd0; eidx <= 16'd0; hand_full <= 1'b0;
        ph <= P_IDLE; sj <= 6'd0; sum <= 21'd0; rem <= 36'd0; bitn <= 4'd0; q_r <= 16'd0;
        ow <= 64'd0; ow_valid <= 1'b0; hidx <= 17'd0; hsel <= 1'b0; h_lo_q <= 32'd0;
        q_wp <= {{(QW+1){{1'b0}}}}; q_rp <= {{(QW+1){{1'b0}}}};
{rst}    end else begin
        done <= 1'b0;
        if (start && !running) begin
            if (args_ok) begin
                running <= 1'b1;
                t_q <= arg0; e_q <= arg1[15:0]; k_q <= arg2[5:0];
                rd_len_q <= rd_len_w[31:0]; rt_len_q <= rt_len_w[31:0]; h_len_q <= (arg1 + 32'd1) >> 1;
                rd_pend <= (arg0 != 32'd0); wr_pend <= (arg0 != 32'd0);
                wph <= W_ROUTES; tout <= 32'd0; clr_idx <= 16'd0; clr_done <= 1'b0;
                w_valid <= 1'b0; pos <= 2'd0; eidx <= 16'd0; hand_full <= 1'b0;
                ph <= P_IDLE; ow_valid <= 1'b0; hidx <= 17'd0; hsel <= 1'b0;
                q_wp <= {{(QW+1){{1'b0}}}}; q_rp <= {{(QW+1){{1'b0}}}};
{clear_net}            end else begin
                done <= 1'b1;
            end
        end
        if (running) begin
            // requests
            if (rd_pend && rd_req_ready) rd_pend <= 1'b0;
            // clear the histogram
            if (incr) q_rp <= q_rp + {{{{QW{{1'b0}}}}, 1'b1}};
            if (!clr_done) begin
                clr_idx <= clr_idx + 16'd1;
                if (clr_idx == e_q - 16'd1) clr_done <= 1'b1;
            end
            // unpack + insert
            if (elem_fire) begin
                pos <= pos + 2'd1;
                eidx <= last_in_row ? 16'd0 : eidx + 16'd1;
                if (last_in_row) begin
                    hand_full <= 1'b1;
{hand}{clear_net}                end else begin
{ins}                end
            end
            if (rd_fire) begin
                w_q <= rd_data; w_valid <= 1'b1; pos <= 2'd0;
            end else if (elem_fire && last_in_word) begin
                w_valid <= 1'b0;
            end
            // output word
            if (wr_fire) ow_valid <= 1'b0;
            // softmax
            case (ph)
                P_IDLE: if (hand_full && clr_done) begin ph <= P_EXP; sj <= 6'd0; sum <= 21'd0; end
                P_EXP: begin
                    case (sj)
{ewr}                        default: ;
                    endcase
                    sum <= sum + {{5'd0, ea_new}} + {{5'd0, eb_new}};
                    if (last_pair) begin
                        ph <= P_DIV; bitn <= 4'd15; rem <= 36'd1 << 30; q_r <= 16'd0;
                    end else sj <= sj + 6'd2;
                end
                P_DIV: begin
                    rem <= r0;
                    q_r[bitn] <= g3; q_r[bitn - 4'd1] <= g2; q_r[bitn - 4'd2] <= g1; q_r[bitn - 4'd3] <= g0;
                    if (bitn == 4'd3) begin ph <= P_NORM; sj <= 6'd0; end
                    else bitn <= bitn - 4'd4;
                end
                default: if (ow_free && q_room) begin
                    ow <= {{rec_b, rec_a}};
                    ow_valid <= 1'b1;
                    pq[q_wp[QW-1:0]] <= sa_i;
                    if (b_ok) pq[q_wp1] <= sb_i;
                    q_wp <= q_wp + (b_ok ? {{{{(QW-1){{1'b0}}}}, 2'd2}} : {{{{QW{{1'b0}}}}, 1'b1}});
                    if (last_pair) begin
                        ph <= P_IDLE; hand_full <= 1'b0; tout <= tout + 32'd1;
                    end else sj <= sj + 6'd2;
                end
            endcase
            // write-out sequencing
            case (wph)
                W_ROUTES: if (tout == t_q && !ow_valid && ph == P_IDLE && clr_done && q_cnt == {{(QW+1){{1'b0}}}}) begin
                    wph <= W_HREQ; wr_pend <= 1'b1;
                end else if (wr_pend && wr_req_ready) wr_pend <= 1'b0;
                W_HREQ: if (wr_req_ready) begin
                    wr_pend <= 1'b0; wph <= W_HDATA; hidx <= 17'd0; hsel <= 1'b0;
                end
                W_HDATA: if (!hsel) begin
                    h_lo_q <= h_val; hidx <= hidx + 17'd1; hsel <= 1'b1;
                end else if (ow_free) begin
                    ow <= {{h_val, h_lo_q}};
                    ow_valid <= 1'b1;
                    hidx <= hidx + 17'd1; hsel <= 1'b0;
                    if ({{15'd0, hidx}} + 32'd1 >= {{16'd0, e_q}}) wph <= W_END;
                end
                default: if (!ow_valid || wr_fire) begin
                    done <= 1'b1; running <= 1'b0; wph <= W_ROUTES;
                end
            endcase
        end
    end
end
wire _unused_ok = &{{1'b0, arg3, arg4, arg5, arg6, arg7, ptr3, ptr4, ptr5, ptr6, ptr7,
                    rd_len_w[63:32], rt_len_w[63:32], dla[32:31], dla[13:0], dlb[32:31], dlb[13:0],
                    wpa[31], wpa[14:0], wpb[31], wpb[14:0], 1'b0}};
endmodule // router_core
"#,
        e_max = p.e_max,
        e_last = p.e_max - 1,
        qw = qw,
        q_last = (1usize << qw) - 1,
        q_depth = q_depth,
        log2e = LOG2E_Q14,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verilog_has_the_contract_ports() {
        let v = RouterCore {
            e_max: 16,
            k_max: 4,
        }
        .core_verilog()
        .expect("verilog");
        crate::core::check_core_ports(&v, "router_core").expect("ports");
        assert!(v.contains("assign nv_3"));
        let narrow = v.replace("output reg [7:0] wr_strb", "output reg [3:0] wr_strb");
        assert!(crate::core::check_core_ports(&narrow, "router_core").is_err());
    }

    #[test]
    fn bad_params_are_rejected() {
        assert!(
            RouterCore {
                e_max: 12,
                k_max: 4
            }
            .validate()
            .is_err()
        );
        assert!(
            RouterCore {
                e_max: 16,
                k_max: 0
            }
            .validate()
            .is_err()
        );
        assert!(RouterCore { e_max: 4, k_max: 8 }.validate().is_err());
    }
}
