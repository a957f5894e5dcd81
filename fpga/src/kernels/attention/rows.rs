//! The query-parallel attention core (`q_rows = R > 1`): R query rows of the launch's
//! `[heads x Nq]` rows go through the key loop together. Same arguments, same semantics
//! ([`crate::golden::attention`], per row, bit for bit) and the same banks as the one-row core;
//! what changes:
//! - *Q prefetch*: R rows (`qn_r_*`) load while the previous group runs; each row's key count
//!   (`jend`, the causal mask) is computed as it loads.
//! - *score stage*: one key slot per cycle for the group, keys `0 .. max_r jend_r` (at least
//!   one slot). The K row read from the banks meets the R query rows in R x `d_max` 8x8
//!   multipliers (R adder trees, R score multipliers; the one-row core's stages A-G). A key
//!   masked for row r is not pushed for that row: it enters neither the row's tile maximum
//!   nor its sums (p = 0); a row without keys is pushed once, at slot 0, as the empty slot.
//!   Tiles are by key index, so a row's tiles are the one-row core's.
//! - *one FIFO slot per key* holds the R logits and per-row flags (pushed, empty, last
//!   key);
//!   the tile FIFO holds R exponents, pushed at the group's tile end.
//! - *softmax/PV stage*: the R rows pop in lockstep, so one V row read serves them all
//!   (broadcast to R x `d_max` 16x8 multipliers); each row keeps its own running (e, l) and
//!   48-bit accumulators and skips slots it was not pushed.
//! - *finaliser*: one set of `d_max` dividers shared by the rows: a row's last key parks its
//!   accumulators and (e, l) in a per-row hold (`fa_r_*`), the finaliser drains the holds one
//!   row at a time, and a row's next last key waits until its hold is free.

use std::fmt::Write as _;

use super::{AttentionCore, divider_lane, fifo_depth, lutn_cases, score_tree};
use crate::core::clog2;

/// Verilog of the query-parallel core (`p.q_rows > 1`; the parameters are validated).
pub(super) fn attention_rows_verilog(p: &AttentionCore) -> String {
    let lanes = p.d_max as usize;
    let rr = p.q_rows as usize;
    let dw = lanes / 8;
    let aj = clog2(p.nkv_max);
    let td = fifo_depth(p.kv_tile);
    let atd = clog2(td);
    let adw = clog2(dw as u32);
    let afw = clog2((lanes / 4) as u32);
    let mut decl = String::new();
    let mut seq = String::new();
    let mut st = String::new(); // statements inside the main always block
    // ---- banks: K and V, one 64-bit bank per 8 lanes (shared by the rows) ----
    for b in 0..dw {
        let _ = writeln!(
            decl,
            "reg [63:0] kb_{b} [0:{last}];\nreg [63:0] vb_{b} [0:{last}];\nreg [63:0] kr_{b}, vr_{b};",
            last = p.nkv_max - 1
        );
        let _ = writeln!(
            seq,
            "always @(posedge clock) begin\n\
             \x20   if (kv_we && !c_isv && c_b == {adw}'d{b}) kb_{b}[c_row[{ajh}:0]] <= rd_data;\n\
             \x20   if (kv_we && c_isv && c_b == {adw}'d{b}) vb_{b}[c_row[{ajh}:0]] <= rd_data;\n\
             \x20   if (s_issue) kr_{b} <= bank_on[{b}] ? kb_{b}[s_jcur[{ajh}:0]] : 64'd0;\n\
             \x20   if (p_pop) vr_{b} <= bank_on[{b}] ? vb_{b}[tf_j[{ajh}:0]] : 64'd0;\n\
             end",
            ajh = aj - 1
        );
    }
    // ---- shared V lanes ----
    for l in 0..lanes {
        let (b, o) = (l / 8, 8 * (l % 8));
        let _ = writeln!(
            decl,
            "wire signed [7:0] kl_{l} = kr_{b}[{o} +: 8];\nreg signed [7:0] pv_v_{l};\nwire signed [7:0] vl_{l} = vr_{b}[{o} +: 8];"
        );
        let _ = writeln!(st, "        if (p0_v) pv_v_{l} <= vl_{l};");
    }
    // ---- per row: Q buffers, score lanes, softmax state, PV accumulators, hold ----
    let mut ok_terms = Vec::new();
    let mut fp_bits = Vec::new();
    for r in 0..rr {
        for b in 0..dw {
            let _ = writeln!(decl, "reg [63:0] qn_{r}_{b}, qc_{r}_{b};");
            let _ = writeln!(
                st,
                "        if (q_we && c_qr == 8'd{r} && c_b == {adw}'d{b}) qn_{r}_{b} <= rd_data;\n\
                 \x20       else if (q_clear) qn_{r}_{b} <= 64'd0;\n\
                 \x20       if (s_issue && s_rowstart) qc_{r}_{b} <= qn_{r}_{b};"
            );
        }
        let mut prods = Vec::new();
        let mut lane_decl = String::new();
        for l in 0..lanes {
            let (b, o) = (l / 8, 8 * (l % 8));
            let _ = writeln!(
                lane_decl,
                "reg signed [15:0] sp_{r}_{l};\nwire signed [7:0] ql_{r}_{l} = qc_{r}_{b}[{o} +: 8];\n\
                 reg signed [47:0] acc_{r}_{l}, fa_{r}_{l};\n\
                 wire [63:0] ax_{r}_{l} = {{{{16{{acc_{r}_{l}[47]}}}}, acc_{r}_{l}}};\n\
                 wire rb_{r}_{l} = !p1_reset_{r} && (p1_sh_{r} != 6'd0) && (p1_sh_{r} < 6'd40) && ax_{r}_{l}[p1_sh_{r} - 6'd1];\n\
                 wire signed [47:0] base_{r}_{l} = (p1_reset_{r} || p1_sh_{r} >= 6'd40) ? 48'sd0 : (acc_{r}_{l} >>> p1_sh_{r});\n\
                 wire signed [24:0] pp_{r}_{l} = $signed({{1'b0, p1_p_{r}}}) * pv_v_{l};\n\
                 wire signed [47:0] an_{r}_{l} = base_{r}_{l} + {{{{23{{pp_{r}_{l}[24]}}}}, pp_{r}_{l}}} + {{47'd0, rb_{r}_{l}}};"
            );
            let _ = writeln!(
                st,
                "        sp_{r}_{l} <= ql_{r}_{l} * kl_{l};\n\
                 \x20       if (p1_v_{r}) begin if (p1_g_{r}[2]) begin fa_{r}_{l} <= an_{r}_{l}; acc_{r}_{l} <= 48'sd0; end else acc_{r}_{l} <= an_{r}_{l}; end"
            );
            prods.push(format!("sp_{r}_{l}"));
        }
        let _ = writeln!(
            decl,
            r#"// row {r}: key count, slot flags (0 pushed, 1 empty row, 2 last key of the row)
// (in the group, registered as the slot advances: g_em the row has no key, g_lt slot s_j is
// below its key count, g_eq slot s_j is its last key)
reg [31:0] qn_jend_{r}, g_jend_{r};
reg qn_val_{r}, g_val_{r}, g_em_{r}, g_lt_{r}, g_eq_{r};
wire s_em_{r} = s_rowstart ? (qn_jend_{r} == 32'd0) : g_em_{r};
wire s_push_{r} = s_rowstart ? qn_val_{r} : (g_val_{r} && !g_em_{r} && g_lt_{r});
wire s_rl_{r} = s_rowstart ? (qn_jend_{r} <= 32'd1) : (g_em_{r} || g_eq_{r});
// the same tests for the next slot (s_jcur + 1)
wire s_lt_n_{r} = s_rowstart ? (qn_jend_{r} > 32'd1) : (s_j + 32'd1 < g_jend_{r});
wire s_eq_n_{r} = s_rowstart ? (qn_jend_{r} == 32'd2) : (s_j + 32'd2 == g_jend_{r});
reg [2:0] sa_g_{r}, sb_g_{r}, sc_g_{r}, sd_g_{r}, se_g_{r}, sf_g_{r};
reg signed [48:0] se_m_{r};
wire [63:0] sx_{r} = {{{{15{{se_m_{r}[48]}}}}, se_m_{r}}};
wire signed [48:0] se_q_{r} = se_m_{r} >>> shift_q;
wire signed [48:0] se_t_{r} = se_q_{r} + {{48'd0, (shift_q != 6'd0) && sx_{r}[shift_q - 6'd1]}};
reg signed [47:0] sf_t_{r};
reg signed [47:0] tmax_{r};
wire signed [47:0] tmax_n_{r} = sf_g_{r}[0] ? (sf_f[0] ? sf_t_{r} : ((sf_t_{r} > tmax_{r}) ? sf_t_{r} : tmax_{r})) : tmax_{r};
wire signed [47:0] et_n_{r} = (tmax_n_{r} + 48'sd255) >>> 8;
reg [47:0] tf_t_{r} [0:{tdl}];
reg [2:0] tf_gg_{r} [0:{tdl}];
reg [47:0] xf_e_{r} [0:{tdl}];
wire [47:0] tf_th_{r} = tf_t_{r}[tf_rp];
wire [2:0] tf_g_{r} = tf_gg_{r}[tf_rp];
wire signed [47:0] xf_h_{r} = xf_e_{r}[xf_rp];
always @(posedge clock) begin
    if (sf_v) begin tf_t_{r}[tf_wp] <= sf_t_{r}; tf_gg_{r}[tf_wp] <= sf_g_{r}; end
    if (sf_v && sf_f[1]) xf_e_{r}[xf_wp] <= sf_g_{r}[1] ? 48'sd0 : et_n_{r};
end
// row {r}: softmax
reg signed [47:0] e_run_{r};
reg [31:0] l_run_{r};
reg p0_v_{r}, p1_v_{r};
reg [2:0] p0_g_{r}, p1_g_{r};
reg signed [47:0] p0_e_{r}, p1_e_{r};
reg [5:0] p0_sh_{r}, p1_sh_{r};
reg p0_big_{r};
reg [15:0] p0_lv_{r};
reg [3:0] p0_n_{r};
reg [15:0] p1_p_{r};
wire p1_reset_{r} = p1_f[2] || p1_g_{r}[1];
wire row_busy_{r} = (p0_v_{r} && p0_g_{r}[2]) || (p1_v_{r} && p1_g_{r}[2]);
wire rst_{r} = tf_f[2] || tf_g_{r}[1];
wire signed [47:0] e_new_{r} = (tf_f[0] && rst_{r}) ? xf_h_{r} : ((tf_f[0] && xf_h_{r} > e_run_{r}) ? xf_h_{r} : e_run_{r});
// rescale shift at a tile start: e_new - e_run = max(xf_h - e_run, 0), capped at 40 (one
// subtract in front of the compares, not the exponent's select)
wire signed [48:0] e_up_{r} = {{xf_h_{r}[47], xf_h_{r}}} - {{e_run_{r}[47], e_run_{r}}};
wire [5:0] sh_new_{r} = (tf_f[0] && !rst_{r} && e_up_{r} > 49'sd0) ? ((e_up_{r} >= 49'sd40) ? 6'd40 : e_up_{r}[5:0]) : 6'd0;
wire signed [48:0] u_new_{r} = {{e_new_{r}[47], e_new_{r}}} * 49'sd256 - {{tf_th_{r}[47], tf_th_{r}}};
wire [63:0] lx_{r} = {{32'd0, l_run_{r}}};
wire lb_{r} = !p1_reset_{r} && (p1_sh_{r} != 6'd0) && (p1_sh_{r} < 6'd40) && lx_{r}[p1_sh_{r} - 6'd1];
wire [31:0] l_base_{r} = (p1_reset_{r} || p1_sh_{r} >= 6'd40) ? 32'd0 : (l_run_{r} >> p1_sh_{r});
wire [31:0] l_next_{r} = l_base_{r} + {{16'd0, p1_p_{r}}} + {{31'd0, lb_{r}}};
// row {r}: hold for the finaliser
reg fp_{r};
reg [31:0] fl_{r}, fi_{r};
reg signed [47:0] fe_{r};
"#,
            tdl = td - 1,
        );
        decl.push_str(&lane_decl);
        score_tree(&mut decl, &mut st, &prods, &format!("_{r}"));
        let _ = writeln!(
            st,
            r#"        if (s_issue) begin
            if (s_rowstart) begin g_jend_{r} <= qn_jend_{r}; g_val_{r} <= qn_val_{r}; qn_val_{r} <= 1'b0; g_em_{r} <= (qn_jend_{r} == 32'd0); end
            if (!s_last) begin g_lt_{r} <= s_lt_n_{r}; g_eq_{r} <= s_eq_n_{r}; end
            sa_g_{r} <= {{s_rl_{r}, s_em_{r}, s_push_{r}}};
        end
        if (q_we && q_rowdone && c_qr == 8'd{r}) begin qn_jend_{r} <= jend_q; qn_val_{r} <= 1'b1; end
        sb_g_{r} <= sa_g_{r}; sc_g_{r} <= sb_g_{r}; sd_g_{r} <= sc_g_{r}; se_g_{r} <= sd_g_{r}; sf_g_{r} <= se_g_{r};
        se_m_{r} <= sd_s_{r} * $signed({{1'b0, mult_q[15:0]}});
        sf_t_{r} <= se_t_{r}[47:0];
        if (sf_v) tmax_{r} <= tmax_n_{r};
        p0_v_{r} <= p_pop && tf_g_{r}[0];
        if (p_pop && tf_g_{r}[0]) begin
            e_run_{r} <= e_new_{r};
            p0_g_{r} <= tf_g_{r}; p0_e_{r} <= e_new_{r}; p0_sh_{r} <= sh_new_{r};
            p0_big_{r} <= (u_new_{r} >>> 8) >= 49'sd16;
            p0_n_{r} <= u_new_{r}[11:8];
            p0_lv_{r} <= lutn(tf_th_{r}[7:0]);
        end
        p1_v_{r} <= p0_v_{r}; p1_g_{r} <= p0_g_{r}; p1_e_{r} <= p0_e_{r}; p1_sh_{r} <= p0_sh_{r};
        p1_p_{r} <= p0_big_{r} ? 16'd0 : (p0_lv_{r} >> p0_n_{r});
        if (f_st == F_PREP && f_r == 8'd{r}) fp_{r} <= 1'b0;
        if (p1_v_{r}) begin
            if (p1_g_{r}[2]) begin
                l_run_{r} <= 32'd0;
                fl_{r} <= p1_g_{r}[1] ? 32'd0 : l_next_{r}; fi_{r} <= p1_i + 32'd{r}; fe_{r} <= p1_e_{r};
                fp_{r} <= 1'b1;
            end else l_run_{r} <= l_next_{r};
        end"#
        );
        ok_terms.push(format!(
            "(!(tf_g_{r}[0] && tf_g_{r}[2]) || (!fp_{r} && !row_busy_{r}))"
        ));
        fp_bits.push(format!("fp_{r}"));
    }
    // ---- shared finaliser: the dividers, fed from the hold of row f_r ----
    let sel = |by: &str, what: &str, l: Option<usize>| -> String {
        let mut e = String::new();
        for r in 0..rr - 1 {
            let name = match l {
                Some(l) => format!("{what}_{r}_{l}"),
                None => format!("{what}_{r}"),
            };
            let _ = write!(e, "({by} == 8'd{r}) ? {name} : ");
        }
        e.push_str(&match l {
            Some(l) => format!("{what}_{}_{l}", rr - 1),
            None => format!("{what}_{}", rr - 1),
        });
        e
    };
    let mut pick = String::from("8'd0");
    for r in (0..rr).rev() {
        pick = format!("fp_{r} ? 8'd{r} : ({pick})");
    }
    // the lowest row with a full hold (fp_0 first)
    let _ = writeln!(decl, "wire [7:0] f_pick = {pick};");
    for l in 0..lanes {
        let _ = writeln!(
            decl,
            "wire signed [47:0] fas_{l} = {fas};",
            fas = sel("f_r", "fa", Some(l))
        );
        divider_lane(&mut decl, &mut st, l, &format!("fas_{l}"));
    }
    let mut omux = String::from("always @* begin\n    f_word = 64'd0;\n    case (f_w)\n");
    for w in 0..lanes / 4 {
        let _ = writeln!(
            omux,
            "        {afw}'d{w}: f_word = {{fo_{}, fo_{}, fo_{}, fo_{}}};",
            4 * w + 3,
            4 * w + 2,
            4 * w + 1,
            4 * w
        );
    }
    omux.push_str("        default: ;\n    endcase\nend\n");
    let bank_on_init = format!(
        "{{{}}}",
        (0..dw)
            .rev()
            .map(|b| format!("(arg2[31:3] > 29'd{b})"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let p_ok = ok_terms.join(" && ");
    let fp_any = fp_bits.join(" || ");
    let fl_sel = sel("f_pick", "fl", None);
    let fe_sel = sel("f_pick", "fe", None);
    let fi_sel = sel("f_pick", "fi", None);
    format!(
        r#"
// Attention core (tandem-fpga), query-parallel: q_rows = {rr}, d_max = {lanes} lanes,
// nkv_max = {nkv_max}, kv_tile = {tile}. Semantics: fpga::golden::attention (per row).
/* verilator lint_off UNUSED */
/* verilator lint_off WIDTH */
{header}
localparam [31:0] D_MAX = 32'd{lanes};
localparam [31:0] NKV_MAX = 32'd{nkv_max};
localparam [31:0] TILE = 32'd{tile};
localparam [31:0] TD = 32'd{td};
localparam [31:0] Q_ROWS = 32'd{rr};
localparam [2:0] F_IDLE = 3'd0, F_PREP = 3'd1, F_DIV = 3'd2, F_FIX = 3'd3, F_WREQ = 3'd4, F_WDAT = 3'd5, F_SREQ = 3'd6, F_SDAT = 3'd7;

// exp2 LUT by the logit's low byte: LUT[(-t) & 255] (= LUT[u & 255], u = 256 e - t)
function [15:0] lutn;
    input [7:0] f;
    case (f)
{lut_cases}        default: lutn = 16'd0;
    endcase
endfunction

// ---- run control and arguments ----
reg running;
reg [31:0] nq_q, nqt_q, nkv_q, nv_q, d_q, d_words, mult_q;
reg [5:0] shift_q;
reg causal_q;
reg [63:0] pq_q, pk_q, pv_q, po_q, ps_q;
reg [{dwh}:0] bank_on;
assign busy = running;
wire args_ok_w = (arg0 != 32'd0) && (arg1 != 32'd0) && (arg1 <= NKV_MAX) && (arg2 != 32'd0)
            && (arg2[2:0] == 3'd0) && (arg2 <= D_MAX) && (arg4 <= 32'd65535) && (arg5 <= 32'd47)
            && (arg6 <= 32'd1024) && (arg7 <= 32'h40000000) && (arg0 * heads_a <= 64'h40000000);
// registered (as the router's): the arguments are written before the transaction that sets
// ap_start, so the checks stay out of the run-start path
reg args_ok;
always @(posedge clock) args_ok <= !reset && args_ok_w;
wire [63:0] heads_a = (arg6 == 32'd0) ? 64'd1 : {{32'd0, arg6}};

// ---- read requests: all of K, all of V, all of Q ----
// registered outputs (the shell takes them into its burst splitter combinationally): the K
// request is loaded at start, the next at each handshake, so they go out when they did
reg [1:0] g_ph;
reg [31:0] g_qlen;
// K and V lengths from the arguments (nkv <= NKV_MAX < 2^17, d / 8 <= 32 once args_ok)
wire [31:0] kv_len_a = arg1[16:0] * arg2[8:3];

// ---- data consumer: K banks, V banks, then R query rows into the prefetch buffer ----
reg [1:0] c_ph;          // 0 K, 1 V, 2 Q, 3 done
reg [31:0] c_row, c_qrows, c_ih;
reg [7:0] c_qr;          // row of the prefetch group being loaded
reg [{adwh}:0] c_b;
reg qn_full;
reg [31:0] qn_jmax;
wire c_isv = (c_ph == 2'd1);
wire kv_we = running && (c_ph == 2'd0 || c_ph == 2'd1) && rd_data_valid;
wire q_we = running && c_ph == 2'd2 && !qn_full && rd_data_valid;
wire q_rowdone = ({{{pad_dw}'d0, c_b}} + 32'd1 == d_words);
always @* rd_data_ready = running && ((c_ph == 2'd0) || (c_ph == 2'd1) || (c_ph == 2'd2 && !qn_full));
reg q_clear;
// causal: row c_ih of its head sees key j iff j + nq <= c_ih + nkv + kv_skip
wire [31:0] jend_q = causal_q ? ((c_ih + nv_q >= nq_q) ? (((c_ih + nv_q - nq_q + 32'd1) < nkv_q) ? (c_ih + nv_q - nq_q + 32'd1) : nkv_q) : 32'd0) : nkv_q;

// ---- score stage: one key slot per cycle for the group ----
reg s_run, s_alldone, s_inrow;
reg [31:0] s_i, s_j, s_jt, g_jmax;
// registered look-ahead for the slot loop's end tests (no adder in front of a compare on the
// issue path): s_inext = s_i + Q_ROWS; s_jnl: the slot s_j is the group's last
reg [31:0] s_inext;
reg s_jnl;
reg [{atdh}:0] tf_wp, tf_rp, xf_wp, xf_rp;
reg [{atd}:0] tf_cnt, xf_cnt;
// room for every slot in flight (stages A-F and the one issued) and two to spare
wire s_room = (tf_cnt + {atd1}'d8 < TD);
wire s_rowstart = !s_inrow;
wire s_issue = running && s_run && !s_alldone && s_room && (s_inrow || qn_full);
wire [31:0] s_jcur = s_rowstart ? 32'd0 : s_j;
// the group's first slot is its last when it has at most one key; slot j + 1 is the last when
// j + 2 equals the group's key count
wire s_last = s_rowstart ? (qn_jmax <= 32'd1) : s_jnl;
wire s_jnl_n = s_rowstart ? (qn_jmax == 32'd2) : (s_j + 32'd2 == g_jmax);
wire s_tfirst = s_rowstart || (s_jt == 32'd0);
wire s_tlast = s_last || (s_jt == TILE - 32'd1);
// pipeline: A (bank read) -> B (products) -> C (bank sums) -> D (score sums) -> E (score
// multiplies) -> F (round) -> G (tile max, push)
reg sa_v, sb_v, sc_v, sd_v, se_v, sf_v;
reg [2:0] sa_f, sb_f, sc_f, sd_f, se_f, sf_f;  // group flags: 0 tile first, 1 tile last, 2 group's first slot
reg [31:0] sa_j, sb_j, sc_j, sd_j, se_j, sf_j, sa_i, sb_i, sc_i, sd_i, se_i, sf_i;
reg [2:0] tf_fl [0:{tdl}];
reg [31:0] tf_jj [0:{tdl}];
reg [31:0] tf_ii [0:{tdl}];
wire [2:0] tf_f = tf_fl[tf_rp];
wire [31:0] tf_j = tf_jj[tf_rp];
wire [31:0] tf_i = tf_ii[tf_rp];

// ---- softmax/PV stage (rows in lockstep) ----
reg p0_v, p1_v;
reg [2:0] p0_f, p1_f;
reg [31:0] p0_i, p1_i;
wire tf_ne = (tf_cnt != {atd1}'d0);
wire xf_ne = (xf_cnt != {atd1}'d0);
reg [2:0] f_st;
reg [7:0] f_r;

// ---- finaliser ----
reg [31:0] f_l, f_i;
reg signed [47:0] f_e;
reg [4:0] f_bit;
reg [50:0] f_den;        // the divisor 2 l << f_bit, shifted down a bit per step
reg [{afwh}:0] f_w;
reg [63:0] f_word;
{decl}
wire p_pop = running && tf_ne && (!tf_f[0] || xf_ne) && {p_ok};
wire fp_any = {fp_any};
{omux}
{seq}
always @(posedge clock) begin
    if (sf_v) begin
        tf_fl[tf_wp] <= sf_f;
        tf_jj[tf_wp] <= sf_j;
        tf_ii[tf_wp] <= sf_i;
    end
end

always @(posedge clock) begin
    done <= 1'b0;
    q_clear <= 1'b0;
    if (reset) begin
        running <= 1'b0; g_ph <= 2'd3; c_ph <= 2'd3; s_run <= 1'b0;
        sa_v <= 1'b0; sb_v <= 1'b0; sc_v <= 1'b0; sd_v <= 1'b0; se_v <= 1'b0; sf_v <= 1'b0;
        p0_v <= 1'b0; p1_v <= 1'b0; f_st <= F_IDLE;
        tf_cnt <= 0; xf_cnt <= 0; tf_wp <= 0; tf_rp <= 0; xf_wp <= 0; xf_rp <= 0;
        rd_req_valid <= 1'b0; wr_req_valid <= 1'b0; wr_data_valid <= 1'b0; qn_full <= 1'b0;
        {fp_clear}
    end else begin
        if (start && !running) begin
            if (args_ok) begin
                running <= 1'b1;
                nq_q <= arg0; nkv_q <= arg1; d_q <= arg2; d_words <= arg2 >> 3; causal_q <= arg3[0];
                nqt_q <= arg0 * heads_a[31:0]; nv_q <= arg1 + arg7;
                bank_on <= {bank_on_init};
                mult_q <= arg4; shift_q <= arg5[5:0];
                pq_q <= ptr0; pk_q <= ptr1; pv_q <= ptr2; po_q <= ptr3; ps_q <= ptr4;
                g_ph <= 2'd0; c_ph <= 2'd0; c_row <= 32'd0; c_b <= 0; c_qrows <= 32'd0; c_qr <= 8'd0; c_ih <= 32'd0;
                rd_req_valid <= 1'b1; rd_req_addr <= ptr1; rd_req_len <= kv_len_a;
                qn_full <= 1'b0; q_clear <= 1'b1; qn_jmax <= 32'd0;
                s_run <= 1'b0; s_alldone <= 1'b0; s_inrow <= 1'b0; s_i <= 32'd0; s_j <= 32'd0; s_jt <= 32'd0;
                s_inext <= Q_ROWS; s_jnl <= 1'b0;
                tf_cnt <= 0; xf_cnt <= 0; tf_wp <= 0; tf_rp <= 0; xf_wp <= 0; xf_rp <= 0;
                sa_v <= 1'b0; sb_v <= 1'b0; sc_v <= 1'b0; sd_v <= 1'b0; se_v <= 1'b0; sf_v <= 1'b0;
                p0_v <= 1'b0; p1_v <= 1'b0; f_st <= F_IDLE;
                {fp_clear}
            end else done <= 1'b1;
        end
        // requests: K (loaded at start), V, Q
        g_qlen <= nqt_q * d_words[5:0];
        if (rd_req_valid && rd_req_ready) begin
            g_ph <= g_ph + 2'd1;
            if (g_ph == 2'd0) rd_req_addr <= pv_q;
            else begin rd_req_addr <= pq_q; rd_req_len <= g_qlen; end
            if (g_ph == 2'd2) rd_req_valid <= 1'b0;
        end
        // data
        if (kv_we) begin
            if (q_rowdone) begin
                c_b <= 0;
                if (c_row + 32'd1 == nkv_q) begin c_row <= 32'd0; c_ph <= c_ph + 2'd1; if (c_ph == 2'd1) s_run <= 1'b1; end
                else c_row <= c_row + 32'd1;
            end else c_b <= c_b + 1'b1;
        end
        if (q_we) begin
            if (q_rowdone) begin
                c_b <= 0;
                qn_jmax <= (c_qr == 8'd0 || jend_q > qn_jmax) ? jend_q : qn_jmax;
                c_ih <= (c_ih + 32'd1 == nq_q) ? 32'd0 : c_ih + 32'd1;
                if (c_qrows + 32'd1 == nqt_q) begin c_ph <= 2'd3; qn_full <= 1'b1; end
                if (c_qr + 8'd1 == Q_ROWS[7:0]) begin c_qr <= 8'd0; qn_full <= 1'b1; end
                else c_qr <= c_qr + 8'd1;
                c_qrows <= c_qrows + 32'd1;
            end else c_b <= c_b + 1'b1;
        end
{st}
        // score stage issue
        if (s_issue) begin
            if (s_rowstart) begin qn_full <= 1'b0; q_clear <= 1'b1; g_jmax <= qn_jmax; c_qr <= 8'd0; end
            sa_v <= 1'b1;
            sa_f <= {{s_rowstart, s_tlast, s_tfirst}};
            sa_j <= s_jcur; sa_i <= s_i;
            if (s_last) begin
                s_inrow <= 1'b0; s_j <= 32'd0; s_jt <= 32'd0;
                if (s_inext >= nqt_q) s_alldone <= 1'b1;
                s_i <= s_inext; s_inext <= s_inext + Q_ROWS;
            end else begin
                s_inrow <= 1'b1; s_j <= s_jcur + 32'd1; s_jnl <= s_jnl_n;
                s_jt <= s_tlast ? 32'd0 : s_jt + 32'd1;
            end
        end else sa_v <= 1'b0;
        sb_v <= sa_v; sb_f <= sa_f; sb_j <= sa_j; sb_i <= sa_i;
        sc_v <= sb_v; sc_f <= sb_f; sc_j <= sb_j; sc_i <= sb_i;
        sd_v <= sc_v; sd_f <= sc_f; sd_j <= sc_j; sd_i <= sc_i;
        se_v <= sd_v; se_f <= sd_f; se_j <= sd_j; se_i <= sd_i;
        sf_v <= se_v; sf_f <= se_f; sf_j <= se_j; sf_i <= se_i;
        if (sf_v) begin
            tf_wp <= tf_wp + 1'b1;
            if (sf_f[1]) xf_wp <= xf_wp + 1'b1;
        end
        tf_cnt <= tf_cnt + (sf_v ? 1'b1 : 1'b0) - (p_pop ? 1'b1 : 1'b0);
        xf_cnt <= xf_cnt + ((sf_v && sf_f[1]) ? 1'b1 : 1'b0) - ((p_pop && tf_f[0]) ? 1'b1 : 1'b0);
        // softmax/PV: P0 pop (the rows' parts are in the statements above)
        p0_v <= p_pop;
        if (p_pop) begin
            tf_rp <= tf_rp + 1'b1;
            if (tf_f[0]) xf_rp <= xf_rp + 1'b1;
            p0_f <= tf_f; p0_i <= tf_i;
        end
        p1_v <= p0_v; p1_f <= p0_f; p1_i <= p0_i;
        // finaliser: take the lowest full hold, divide, write the row and its (e, l)
        case (f_st)
            F_IDLE: if (fp_any) begin
                f_r <= f_pick; f_l <= {fl_sel}; f_e <= {fe_sel}; f_i <= {fi_sel}; f_st <= F_PREP;
            end
            F_PREP: begin f_st <= F_DIV; f_bit <= 5'd17; f_den <= {{1'b0, f_l, 18'd0}}; end
            F_DIV: begin f_den <= f_den >> 1; if (f_bit == 5'd0) f_st <= F_FIX; else f_bit <= f_bit - 5'd1; end
            F_FIX: begin f_st <= F_WREQ; wr_req_valid <= 1'b1; f_w <= 0; end
            F_WREQ: if (wr_req_ready) begin wr_req_valid <= 1'b0; wr_data_valid <= 1'b1; f_st <= F_WDAT; end
            F_WDAT: if (wr_data_ready) begin
                if ({{{pad_fw}'d0, f_w}} + 32'd1 == (d_q >> 2)) begin wr_data_valid <= 1'b0; wr_req_valid <= 1'b1; f_st <= F_SREQ; end
                else f_w <= f_w + 1'b1;
            end
            F_SREQ: if (wr_req_ready) begin wr_req_valid <= 1'b0; wr_data_valid <= 1'b1; f_st <= F_SDAT; end
            F_SDAT: if (wr_data_ready) begin wr_data_valid <= 1'b0; f_st <= F_IDLE; end
            default: ;
        endcase
        if (running && s_alldone && !sa_v && !sb_v && !sc_v && !sd_v && !se_v && !sf_v && !tf_ne && !p0_v && !p1_v
            && f_st == F_IDLE && !fp_any && !wr_req_valid && !wr_data_valid && !s_issue) begin
            running <= 1'b0; done <= 1'b1; s_run <= 1'b0; g_ph <= 2'd3; c_ph <= 2'd3; rd_req_valid <= 1'b0;
        end
    end
end

// the row's exponent as int32 (golden clamps to [i32::MIN + 1, i32::MAX]); l = 0 marks an empty row
wire [31:0] f_e32 = (f_l == 32'd0) ? 32'h80000000 : ((f_e > 48'sd2147483647) ? 32'h7fffffff : ((f_e < -48'sd2147483647) ? 32'h80000001 : f_e[31:0]));
always @* begin
    wr_req_addr = (f_st == F_SREQ || f_st == F_SDAT) ? (ps_q + {{29'd0, f_i, 3'd0}}) : (po_q + f_i * (d_q << 1));
    wr_req_len = (f_st == F_SREQ || f_st == F_SDAT) ? 32'd1 : (d_q >> 2);
    wr_data = (f_st == F_SDAT) ? {{f_l, f_e32}} : f_word;
    wr_strb = 8'hFF;
end

endmodule // attention_core
/* verilator lint_on WIDTH */
/* verilator lint_on UNUSED */
"#,
        header = crate::core::core_header("attention_core", &["busy"]),
        nkv_max = p.nkv_max,
        tile = p.kv_tile,
        lut_cases = lutn_cases(),
        adwh = adw - 1,
        atdh = atd - 1,
        atd1 = atd + 1,
        tdl = td - 1,
        afwh = afw - 1,
        pad_dw = 32 - adw,
        pad_fw = 32 - afw,
        dwh = dw - 1,
        fp_clear = (0..rr)
            .map(|r| format!("fp_{r} <= 1'b0; p0_v_{r} <= 1'b0; p1_v_{r} <= 1'b0;"))
            .collect::<Vec<_>>()
            .join(" "),
    )
}
