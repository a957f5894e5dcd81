//! The streaming attention core (one head per launch): int8 `Q K^T` on a `d_max`-lane MAC
//! array, fixed-point online softmax (log2 domain, power-of-two running exponent, exp2 by
//! shift + 256-entry LUT), `P V` on a second `d_max`-lane MAC array, final normalisation by
//! per-lane restoring dividers. Semantics: [`crate::golden::attention`] with
//! `kv_tile` = the core's `kv_tile`.
//!
//! Dataflow:
//! - *load*: K and V (`[Nkv][d]` int8) are read once into on-chip banks (one 64-bit bank per
//!   8 lanes), then Q rows stream into a one-row prefetch buffer. A run with `d < d_max`
//!   loads only the first `d / 8` banks; the others read as zero (`bank_on`), not as what the
//!   RAM held, so no unknown value reaches a score (in a 4-state simulator an unloaded lane
//!   is X, and X x 0 is X).
//! - *score stage*: one key per cycle for the current query row, pipelined so that no
//!   register is fed by more than a few LUT levels (for a 300 MHz clock): A the bank read, B
//!   `d_max` 8x8 multipliers, C an adder tree per bank of 8 lanes, D the tree over the banks
//!   (int32 score), E the 32x16 score multiplier, F the round-half-up shift (the log2-domain
//!   logit `t`, 48 bit), G the tile maximum and the push of `t` into a FIFO; at the end of
//!   each KV tile the tile's exponent `ceil(max t / 256)` goes into a tile FIFO. Causal rows
//!   stop at their last visible key; rows without one pass as a single empty slot.
//! - *softmax/PV stage*, one tile behind: once a tile's exponent is known its logits become
//!   Q1.15 weights (`LUT[u & 255] >> (u >> 8)`, `u = 256 e - t`; `u & 255 = (-t) & 255`, so
//!   the table is read from the popped logit as `e` is updated, and shifted a cycle later),
//!   the running sum and the 48-bit accumulators are rescaled by an exact power of two when
//!   the exponent grows, and each weight meets the V row in `d_max` 16x8 multipliers. The two
//!   stages overlap, one key per cycle each.
//! - *finaliser*, overlapping the next rows: `d_max` restoring dividers compute
//!   `floor((512 acc + l) / 2l)` in 17 steps (the shifted divisor a register, the quotient
//!   shifting in); the int16 row and the row's (e, l) are written.
//!
//! The read requests are registered outputs (loaded at start and at each handshake).
//!
//! Arguments: `q` (ptr0), `k` (ptr1), `v` (ptr2), `o` (ptr3, int16 `[Nq][d]`), `stats` (ptr4,
//! one 64-bit word per row: e in bits 31:0, l in 63:32), `nq` (arg0), `nkv` (arg1), `d`
//! (arg2, a multiple of 8; the host pads), `causal` (arg3), `score_mult` (arg4),
//! `score_shift` (arg5), `heads` (arg6: query heads of one GQA group sharing this K/V, their
//! `[Nq][d]` planes one after another in `q`, `o` and `stats`; 0 counts as 1), `kv_skip`
//! (arg7: keys of the sequence after this launch's K/V, for the causal mask when K/V is split
//! over launches; 0 for a whole sequence). Out-of-range arguments finish at once without
//! touching memory.

mod rows;

use std::fmt::Write as _;

use crate::core::{CoreError, KernelCore, clog2};
use crate::golden::attention::exp2_lut;
use crate::regmap::{ArgDesc, KernelDesc};

/// Build parameters of the attention core.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionCore {
    /// MAC lanes of each array = largest head dimension (multiple of 8, 8..=256).
    pub d_max: u32,
    /// Largest key/value length held on chip.
    pub nkv_max: u32,
    /// Keys per online-softmax tile (2..=64).
    pub kv_tile: u32,
    /// Query rows processed together (1..=16): each K row read from the banks meets
    /// `q_rows` query rows, so the arrays hold `q_rows x d_max` MACs each. 1 is the
    /// one-row core (its RTL and cycles unchanged); see [`rows`].
    pub q_rows: u32,
}

impl Default for AttentionCore {
    fn default() -> Self {
        Self {
            d_max: 16,
            nkv_max: 256,
            kv_tile: 8,
            q_rows: 1,
        }
    }
}

impl AttentionCore {
    /// A U55C-sized configuration: 128 + 128 MAC lanes (d up to 128), 4096 keys on chip.
    pub fn u55c() -> Self {
        Self {
            d_max: 128,
            nkv_max: 4096,
            kv_tile: 16,
            q_rows: 1,
        }
    }

    /// The card-sized query-parallel build: 8 query rows x 128 lanes in each array (1,024 +
    /// 1,024 MACs, head dims up to 128), 4096 keys on chip.
    pub fn u55c_rows() -> Self {
        Self {
            q_rows: 8,
            ..Self::u55c()
        }
    }

    /// MACs of the two arrays together (`2 q_rows d_max`).
    pub fn macs(&self) -> u32 {
        2 * self.q_rows * self.d_max
    }

    /// Checks the parameters.
    pub fn validate(&self) -> Result<(), CoreError> {
        let bad = |msg: String| {
            Err(CoreError::Param {
                kernel: "attention".into(),
                msg,
            })
        };
        if self.d_max < 8 || !self.d_max.is_multiple_of(8) || self.d_max > 256 {
            return bad(format!(
                "d_max = {} must be a multiple of 8 in 8..=256",
                self.d_max
            ));
        }
        if !(2..=65536).contains(&self.nkv_max) {
            return bad(format!("nkv_max = {} must be in 2..=65536", self.nkv_max));
        }
        if !(2..=64).contains(&self.kv_tile) {
            return bad(format!("kv_tile = {} must be in 2..=64", self.kv_tile));
        }
        if !(1..=16).contains(&self.q_rows) {
            return bad(format!("q_rows = {} must be in 1..=16", self.q_rows));
        }
        Ok(())
    }
}

impl KernelCore for AttentionCore {
    fn name(&self) -> &str {
        "attention"
    }

    fn desc(&self) -> KernelDesc {
        KernelDesc {
            name: "attention".into(),
            args: vec![
                ArgDesc::pointer("q", "char*"),
                ArgDesc::pointer("k", "char*"),
                ArgDesc::pointer("v", "char*"),
                ArgDesc::pointer("o", "short*"),
                ArgDesc::pointer("stats", "ulong*"),
                ArgDesc::scalar("nq"),
                ArgDesc::scalar("nkv"),
                ArgDesc::scalar("d"),
                ArgDesc::scalar("causal"),
                ArgDesc::scalar("score_mult"),
                ArgDesc::scalar("score_shift"),
                ArgDesc::scalar("heads"),
                ArgDesc::scalar("kv_skip"),
            ],
        }
    }

    fn params(&self) -> Vec<(String, i64)> {
        let mut v = vec![
            ("d_max".into(), i64::from(self.d_max)),
            ("nkv_max".into(), i64::from(self.nkv_max)),
            ("kv_tile".into(), i64::from(self.kv_tile)),
        ];
        if self.q_rows != 1 {
            v.push(("q_rows".into(), i64::from(self.q_rows)));
        }
        v
    }

    fn core_verilog(&self) -> Result<String, CoreError> {
        self.validate()?;
        if self.q_rows == 1 {
            Ok(attention_verilog(self))
        } else {
            Ok(rows::attention_rows_verilog(self))
        }
    }
}

/// The exp2 LUT indexed by a logit's low byte, as the cases of a Verilog `case` on `f`:
/// `lutn(f) = LUT[(256 - f) & 255]`. A weight's table index is `u & 255` with `u = 256 e - t`,
/// which is `(-t) & 255` whatever the exponent `e`, so the softmax stage reads the table
/// straight from the popped logit (in P0, beside the exponent update) and only shifts in P1.
/// (Looked up from a register, as it was, yosys folds that register into the table as a
/// synchronous ROM's address register and moves it past the table, which puts the lookup
/// behind the whole computation of `u`.)
fn lutn_cases() -> String {
    let lut = exp2_lut();
    let mut cases = String::new();
    for f in 0..256usize {
        let v = lut[(256 - f) & 255];
        let _ = writeln!(cases, "        8'd{f}: lutn = 16'd{v};");
    }
    cases
}

/// The score adder tree over one query row's `d_max` products `prods` (`sp_*`, int16), in two
/// register stages: stage C sums each bank's 8 products (`sc_p{row}_{b}`, 19 bit), stage D
/// the banks' sums (`sd_s{row}`, int32). Both are balanced trees of two-input adders (3 and
/// `ceil(log2(d_max / 8))` adders deep, see [`adder_tree`]). `row` is `""` or `"_{r}"`.
fn score_tree(decl: &mut String, st: &mut String, prods: &[String], row: &str) {
    let mut banks = Vec::new();
    for (b, bank) in prods.chunks(8).enumerate() {
        let terms = bank.iter().map(|p| (p.clone(), 16)).collect();
        let (root, w) = adder_tree(decl, &format!("sc_a{row}_{b}"), terms);
        let _ = writeln!(decl, "reg [{}:0] sc_p{row}_{b};", w - 1);
        let _ = writeln!(st, "        sc_p{row}_{b} <= {root};");
        banks.push((format!("sc_p{row}_{b}"), w));
    }
    let (root, w) = adder_tree(decl, &format!("sd_a{row}"), banks);
    let _ = writeln!(decl, "reg signed [31:0] sd_s{row};");
    let _ = writeln!(st, "        sd_s{row} <= {};", sext(&root, w, 32));
}

/// `x` (`w` bits, two's complement) sign-extended to `to` bits by concatenation.
fn sext(x: &str, w: u32, to: u32) -> String {
    if to <= w {
        x.to_string()
    } else {
        format!("{{{{{}{{{x}[{}]}}}}, {x}}}", to - w, w - 1)
    }
}

/// Declares a balanced tree of two-input adders over `terms` (signals and their widths in
/// bits, two's complement): one wire per adder, `{name}_{level}_{k}`, one bit wider than its
/// wider input, the inputs sign-extended by concatenation. Returns the root and its width.
/// (Written as one expression, or with equal widths throughout, yosys's `alumacc` merges the
/// adds into one multi-operand adder and maps it as a carry-save tree: 7 LUT levels for 8
/// terms and 13 for 16 where this tree has 3 and 4.)
fn adder_tree(decl: &mut String, name: &str, mut terms: Vec<(String, u32)>) -> (String, u32) {
    let mut level = 0;
    while terms.len() > 1 {
        let mut next = Vec::with_capacity(terms.len().div_ceil(2));
        for (k, pair) in terms.chunks(2).enumerate() {
            if let [(a, wa), (b, wb)] = pair {
                let w = wa.max(wb) + 1;
                let node = format!("{name}_{level}_{k}");
                let _ = writeln!(
                    decl,
                    "wire [{}:0] {node} = {} + {};",
                    w - 1,
                    sext(a, *wa, w),
                    sext(b, *wb, w)
                );
                next.push((node, w));
            } else {
                next.push(pair[0].clone());
            }
        }
        terms = next;
        level += 1;
    }
    terms.pop().unwrap_or_else(|| ("1'b0".into(), 1))
}

/// One lane of the finaliser, a restoring divider: `fo = floor((512 num + l) / 2l)`
/// saturated to int16, from the 48-bit accumulator `num`. The divisor's shifted copy is the
/// shared register `f_den` (`2 l << f_bit`, one bit lower every step), the quotient shifts in
/// from the bottom: a step is a compare and a subtract, no barrel shift or bit decode. The
/// fix-up of a negative quotient, `-(q + (rem != 0))` saturated at -32768, is written without
/// the adder in front of the compare (`q + 1 > 32768` is a test of `q`'s top bits and
/// `-(q + 1)` is `~q`), and takes two cycles that were there already: `F_FIX` registers the
/// remainder's test for zero in 6-bit parts, `F_WREQ` (waiting for the write request's
/// handshake, before the first word goes out) computes the int16 output.
fn divider_lane(decl: &mut String, st: &mut String, l: usize, num: &str) {
    let _ = writeln!(
        decl,
        "reg fneg_{l}, fsat_{l};\nreg [50:0] frem_{l};\nreg [16:0] fq_{l};\nreg [15:0] fo_{l};\n\
         wire signed [50:0] fnum_{l} = {{{num}, 9'd0}} + {{19'd0, f_l}};\n\
         reg [8:0] fnzp_{l};\n\
         wire fnz_{l} = (fnzp_{l} != 9'd0);\n\
         wire fovn_{l} = fq_{l}[16] || (fq_{l}[15] && (fnz_{l} || (fq_{l}[14:0] != 15'd0)));\n\
         wire [15:0] fnv_{l} = fnz_{l} ? ~fq_{l}[15:0] : (16'd0 - fq_{l}[15:0]);"
    );
    let _ = writeln!(
        st,
        "        if (f_st == F_PREP) begin\n\
         \x20           fneg_{l} <= fnum_{l}[50];\n\
         \x20           frem_{l} <= fnum_{l}[50] ? (~fnum_{l} + 51'd1) : fnum_{l};\n\
         \x20           fq_{l} <= 17'd0;\n\
         \x20       end\n\
         \x20       if (f_st == F_DIV) begin\n\
         \x20           if (f_bit == 5'd17) fsat_{l} <= (frem_{l} >= f_den);\n\
         \x20           else begin\n\
         \x20               fq_{l} <= {{fq_{l}[15:0], frem_{l} >= f_den}};\n\
         \x20               if (frem_{l} >= f_den) frem_{l} <= frem_{l} - f_den;\n\
         \x20           end\n\
         \x20       end\n\
         \x20       if (f_st == F_FIX) fnzp_{l} <= {{|frem_{l}[50:48], |frem_{l}[47:42], |frem_{l}[41:36], |frem_{l}[35:30], |frem_{l}[29:24], |frem_{l}[23:18], |frem_{l}[17:12], |frem_{l}[11:6], |frem_{l}[5:0]}};\n\
         \x20       if (f_st == F_WREQ) begin\n\
         \x20           if (f_l == 32'd0) fo_{l} <= 16'd0;\n\
         \x20           else if (fsat_{l}) fo_{l} <= fneg_{l} ? 16'h8000 : 16'h7fff;\n\
         \x20           else if (fneg_{l}) fo_{l} <= fovn_{l} ? 16'h8000 : fnv_{l};\n\
         \x20           else fo_{l} <= (fq_{l}[16] || fq_{l}[15]) ? 16'h7fff : fq_{l}[15:0];\n\
         \x20       end"
    );
}

/// FIFO depth between the stages: a whole tile plus the score pipeline, rounded to 2^n.
fn fifo_depth(kv_tile: u32) -> u32 {
    (2 * kv_tile + 8).next_power_of_two()
}

fn attention_verilog(p: &AttentionCore) -> String {
    let lanes = p.d_max as usize;
    let dw = lanes / 8;
    let aj = clog2(p.nkv_max);
    let td = fifo_depth(p.kv_tile);
    let atd = clog2(td);
    let adw = clog2(dw as u32);
    let mut decl = String::new();
    let mut seq = String::new();
    let mut st = String::new(); // statements inside the main always block
    // ---- banks: K and V, one 64-bit bank per 8 lanes ----
    for b in 0..dw {
        let _ = writeln!(
            decl,
            "reg [63:0] kb_{b} [0:{last}];\nreg [63:0] vb_{b} [0:{last}];\nreg [63:0] kr_{b}, vr_{b};\nreg [63:0] qn_{b}, qc_{b};",
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
        let _ = writeln!(
            st,
            "        if (q_we && c_b == {adw}'d{b}) qn_{b} <= rd_data;\n\
             \x20       if (q_clear && {b} >= d_words) qn_{b} <= 64'd0;\n\
             \x20       if (s_issue && s_rowstart) qc_{b} <= qn_{b};"
        );
    }
    // ---- score lanes, PV lanes, finaliser lanes ----
    let mut prods = Vec::new();
    for l in 0..lanes {
        let (b, o) = (l / 8, 8 * (l % 8));
        let _ = writeln!(
            decl,
            "reg signed [15:0] sp_{l};\nwire signed [7:0] ql_{l} = qc_{b}[{o} +: 8];\nwire signed [7:0] kl_{l} = kr_{b}[{o} +: 8];\n\
             reg signed [7:0] pv_v_{l};\nwire signed [7:0] vl_{l} = vr_{b}[{o} +: 8];\n\
             reg signed [47:0] acc_{l}, fa_{l};\n\
             wire [63:0] ax_{l} = {{{{16{{acc_{l}[47]}}}}, acc_{l}}};\n\
             wire rb_{l} = !p1_reset && (p1_sh != 6'd0) && (p1_sh < 6'd40) && ax_{l}[p1_sh - 6'd1];\n\
             wire signed [47:0] base_{l} = (p1_reset || p1_sh >= 6'd40) ? 48'sd0 : (acc_{l} >>> p1_sh);\n\
             wire signed [24:0] pp_{l} = $signed({{1'b0, p1_p}}) * pv_v_{l};\n\
             wire signed [47:0] an_{l} = base_{l} + {{{{23{{pp_{l}[24]}}}}, pp_{l}}} + {{47'd0, rb_{l}}};"
        );
        let _ = writeln!(
            st,
            "        sp_{l} <= ql_{l} * kl_{l};\n\
             \x20       if (p0_v) pv_v_{l} <= vl_{l};\n\
             \x20       if (p1_v) begin if (p1_rowlast) begin fa_{l} <= an_{l}; acc_{l} <= 48'sd0; end else acc_{l} <= an_{l}; end"
        );
        divider_lane(&mut decl, &mut st, l, &format!("fa_{l}"));
        prods.push(format!("sp_{l}"));
    }
    score_tree(&mut decl, &mut st, &prods, "");
    // ---- output word mux: 4 int16 lanes per word ----
    let mut omux = String::from("always @* begin\n    f_word = 64'd0;\n    case (f_w)\n");
    for w in 0..lanes / 4 {
        let _ = writeln!(
            omux,
            "        {}'d{w}: f_word = {{fo_{}, fo_{}, fo_{}, fo_{}}};",
            clog2((lanes / 4) as u32),
            4 * w + 3,
            4 * w + 2,
            4 * w + 1,
            4 * w
        );
    }
    omux.push_str("        default: ;\n    endcase\nend\n");
    let lut_cases = lutn_cases();
    let tile = p.kv_tile;
    let afw = clog2((lanes / 4) as u32);
    // bank b is on when d_words = arg2 / 8 > b
    let bank_on_init = format!(
        "{{{}}}",
        (0..dw)
            .rev()
            .map(|b| format!("(arg2[31:3] > 29'd{b})"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    format!(
        r#"
// Attention core (tandem-fpga): d_max = {lanes} lanes, nkv_max = {nkv_max}, kv_tile = {tile}.
// Semantics: fpga::golden::attention.
/* verilator lint_off UNUSED */
/* verilator lint_off WIDTH */
{header}
localparam [31:0] D_MAX = 32'd{lanes};
localparam [31:0] NKV_MAX = 32'd{nkv_max};
localparam [31:0] TILE = 32'd{tile};
localparam [31:0] TD = 32'd{td};
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
// banks holding lanes < d: a run loads only those, so the others read as zero (never as
// whatever the unloaded RAM holds: X in a 4-state simulator, X x 0 = X in every score)
reg [{dwh}:0] bank_on;
assign busy = running;
wire args_ok_w = (arg0 != 32'd0) && (arg1 != 32'd0) && (arg1 <= NKV_MAX) && (arg2 != 32'd0)
            && (arg2[2:0] == 3'd0) && (arg2 <= D_MAX) && (arg4 <= 32'd65535) && (arg5 <= 32'd47)
            && (arg6 <= 32'd1024) && (arg7 <= 32'h40000000) && (arg0 * heads_a <= 64'h40000000);
// registered (as the router's): the arguments are written before the transaction that sets
// ap_start, so the checks stay out of the run-start path
reg args_ok;
always @(posedge clock) args_ok <= !reset && args_ok_w;
// query heads of one GQA group in this launch (0 counts as 1): their rows follow each other
wire [63:0] heads_a = (arg6 == 32'd0) ? 64'd1 : {{32'd0, arg6}};

// ---- read requests: all of K, all of V, all of Q ----
// registered outputs (the shell takes them into its burst splitter combinationally): the K
// request is loaded at start, the next at each handshake, so they go out when they did
reg [1:0] g_ph;
reg [31:0] g_qlen;
// K and V lengths from the arguments (nkv <= NKV_MAX < 2^17, d / 8 <= 32 once args_ok)
wire [31:0] kv_len_a = arg1[16:0] * arg2[8:3];

// ---- data consumer: K banks, V banks, then the Q prefetch row ----
reg [1:0] c_ph;          // 0 K, 1 V, 2 Q, 3 done
reg [31:0] c_row, c_qrows;
reg [{adwh}:0] c_b;
reg qn_full;
wire c_isv = (c_ph == 2'd1);
wire kv_we = running && (c_ph == 2'd0 || c_ph == 2'd1) && rd_data_valid;
wire q_we = running && c_ph == 2'd2 && !qn_full && rd_data_valid;
always @* rd_data_ready = running && ((c_ph == 2'd0) || (c_ph == 2'd1) || (c_ph == 2'd2 && !qn_full));
reg q_clear;

// ---- score stage: slot issue ----
reg s_run, s_alldone, s_inrow;
reg [31:0] s_i, s_j, s_jend, s_jt;
reg s_jnl;  // slot s_j + 1 is the row's last (registered look-ahead)
// causal: row ih of its head sees key j iff j + nq <= ih + nkv + kv_skip (kv_skip: keys of the
// sequence after this launch's, when K/V is split over launches), i.e. its key count is
// min(max(ih - D + 1, 0), nkv) with D = nq - nv, nv = nkv + kv_skip. The count of the row whose
// Q is in `qn` (head row `c_ih`, the next row to start) and whether it is 0, <= 1 or 2 are
// registered from `c_ih` against launch constants (`cd_*`, one compare each), so a row start
// uses registers only: `c_ih` moves at a row start, and the next row start is at least a Q
// word later.
reg [31:0] c_ih;
reg [31:0] c_dwm1, c_nkvm1, c_nqtm1;  // d_words - 1, nkv - 1, Nq x heads - 1
reg signed [33:0] cd_d, cd_dp1, cd_dm1, cd_lim;
reg cd_n0, cd_nle1, cd_n2, cd_nge2;
reg [31:0] cj_q;
reg cj0_q, cj1_q, cj2_q;
wire signed [33:0] c_ih_s = {{2'b00, c_ih}};
reg [{atdh}:0] tf_wp, tf_rp, xf_wp, xf_rp;
reg [{atd}:0] tf_cnt, xf_cnt;
// room for every slot in flight (stages A-F and the one issued) and two to spare
wire s_room = (tf_cnt + {atd1}'d8 < TD);
wire s_rowstart = !s_inrow;
wire s_can = running && s_run && !s_alldone && s_room && (s_inrow || qn_full);
wire s_empty_row = s_rowstart && cj0_q;
wire s_issue = s_can;
wire [31:0] s_jcur = s_rowstart ? 32'd0 : s_j;
wire s_last = s_rowstart ? cj1_q : s_jnl;
wire s_jnl_n = s_rowstart ? cj2_q : (s_j + 32'd2 == s_jend);
wire s_tfirst = s_rowstart || (s_jt == 32'd0);
wire s_tlast = s_last || (s_jt == TILE - 32'd1);
// pipeline: A (bank read) -> B (products) -> C (bank sums) -> D (score sum) -> E (score
// multiply) -> F (round) -> G (tile max, push)
reg sa_v, sb_v, sc_v, sd_v, se_v, sf_v;
reg [5:0] sa_f, sb_f, sc_f, sd_f, se_f, sf_f;  // flags: 0 tfirst, 1 tlast, 2 rowfirst, 3 rowlast, 4 empty
reg [31:0] sa_j, sb_j, sc_j, sd_j, se_j, sf_j, sa_i, sb_i, sc_i, sd_i, se_i, sf_i;
reg signed [48:0] se_m;
wire [63:0] sx = {{{{15{{se_m[48]}}}}, se_m}};
wire signed [48:0] se_q = se_m >>> shift_q;
wire signed [48:0] se_t = se_q + {{48'd0, (shift_q != 6'd0) && sx[shift_q - 6'd1]}};
reg signed [47:0] sf_t;
reg signed [47:0] tmax;
wire signed [47:0] tmax_n = sf_f[0] ? sf_t : ((sf_t > tmax) ? sf_t : tmax);
wire signed [47:0] et_n = (tmax_n + 48'sd255) >>> 8;
// FIFOs: logits (t, flags, j, i) and tile exponents
reg [47:0] tf_t [0:{tdl}];
reg [5:0] tf_fl [0:{tdl}];
reg [31:0] tf_jj [0:{tdl}];
reg [31:0] tf_ii [0:{tdl}];
reg [47:0] xf_e [0:{tdl}];
wire [47:0] tf_th = tf_t[tf_rp];
wire [5:0] tf_f = tf_fl[tf_rp];
wire [31:0] tf_j = tf_jj[tf_rp];
wire [31:0] tf_i = tf_ii[tf_rp];
wire signed [47:0] xf_h = xf_e[xf_rp];

// ---- softmax/PV stage ----
reg signed [47:0] e_run;
reg [31:0] l_run;
reg p0_v, p1_v;
reg [5:0] p0_f, p1_f;
reg [31:0] p0_i, p1_i;
reg signed [47:0] p0_e, p1_e;
reg [5:0] p0_sh, p1_sh;
reg p0_big;
reg [15:0] p0_lv;
reg [3:0] p0_n;
reg [15:0] p1_p;
wire p1_reset = p1_f[2] || p1_f[4];
wire p1_rowlast = p1_f[3];
wire tf_ne = (tf_cnt != {atd1}'d0);
wire xf_ne = (xf_cnt != {atd1}'d0);
wire row_in_flight = (p0_v && p0_f[3]) || (p1_v && p1_f[3]);
reg [2:0] f_st;
wire p_pop = running && tf_ne && (!tf_f[0] || xf_ne) && (!tf_f[3] || (f_st == F_IDLE && !row_in_flight));
// exponent update at the first slot of a tile
wire signed [47:0] e_new = (tf_f[0] && (tf_f[2] || tf_f[4])) ? xf_h : ((tf_f[0] && xf_h > e_run) ? xf_h : e_run);
// rescale shift at a tile start: e_new - e_run = max(xf_h - e_run, 0), capped at 40 (one
// subtract in front of the compares, not the exponent's select)
wire signed [48:0] e_up = {{xf_h[47], xf_h}} - {{e_run[47], e_run}};
wire [5:0] sh_new = (tf_f[0] && !(tf_f[2] || tf_f[4]) && e_up > 49'sd0) ? ((e_up >= 49'sd40) ? 6'd40 : e_up[5:0]) : 6'd0;
wire signed [48:0] u_new = {{e_new[47], e_new}} * 49'sd256 - {{tf_th[47], tf_th}};
wire [63:0] lx = {{32'd0, l_run}};
wire lb = !p1_reset && (p1_sh != 6'd0) && (p1_sh < 6'd40) && lx[p1_sh - 6'd1];
wire [31:0] l_base = (p1_reset || p1_sh >= 6'd40) ? 32'd0 : (l_run >> p1_sh);
wire [31:0] l_next = l_base + {{16'd0, p1_p}} + {{31'd0, lb}};

// ---- finaliser ----
reg [31:0] f_l, f_i;
reg signed [47:0] f_e;
reg [4:0] f_bit;
reg [50:0] f_den;        // the divisor 2 l << f_bit, shifted down a bit per step
reg [{afwh}:0] f_w;
reg [63:0] f_word;
{omux}
{decl}
{seq}
always @(posedge clock) begin
    if (sf_v) begin
        tf_t[tf_wp] <= sf_t;
        tf_fl[tf_wp] <= sf_f;
        tf_jj[tf_wp] <= sf_j;
        tf_ii[tf_wp] <= sf_i;
    end
    if (sf_v && sf_f[1]) xf_e[xf_wp] <= sf_f[4] ? 48'sd0 : et_n;
end

always @(posedge clock) begin
    done <= 1'b0;
    q_clear <= 1'b0;
    // the data counters' ends as compares with registers (`x + 1 == n` is `x == n - 1` mod 2^32)
    c_dwm1 <= d_words - 32'd1; c_nkvm1 <= nkv_q - 32'd1; c_nqtm1 <= nqt_q - 32'd1;
    // the causal key count of row c_ih (see c_ih): launch constants, then the row's count
    cd_d <= {{2'b00, nq_q}} - {{2'b00, nv_q}};
    cd_dp1 <= {{2'b00, nq_q}} - {{2'b00, nv_q}} + 34'sd1;
    cd_dm1 <= {{2'b00, nq_q}} - {{2'b00, nv_q}} - 34'sd1;
    cd_lim <= {{2'b00, nkv_q}} + {{2'b00, nq_q}} - {{2'b00, nv_q}} - 34'sd1;
    cd_n0 <= nkv_q == 32'd0; cd_nle1 <= nkv_q <= 32'd1; cd_n2 <= nkv_q == 32'd2; cd_nge2 <= nkv_q >= 32'd2;
    cj_q <= !causal_q ? nkv_q : (c_ih_s < cd_d) ? 32'd0 : (c_ih_s < cd_lim) ? c_ih - cd_dm1[31:0] : nkv_q;
    cj0_q <= causal_q ? (c_ih_s < cd_d || cd_n0) : cd_n0;
    cj1_q <= causal_q ? (c_ih_s < cd_dp1 || cd_nle1) : cd_nle1;
    cj2_q <= causal_q ? ((c_ih_s == cd_dp1 && cd_nge2) || (c_ih_s > cd_dp1 && cd_n2)) : cd_n2;
    if (reset) begin
        running <= 1'b0; g_ph <= 2'd3; c_ph <= 2'd3; s_run <= 1'b0;
        sa_v <= 1'b0; sb_v <= 1'b0; sc_v <= 1'b0; sd_v <= 1'b0; se_v <= 1'b0; sf_v <= 1'b0;
        p0_v <= 1'b0; p1_v <= 1'b0; f_st <= F_IDLE;
        tf_cnt <= 0; xf_cnt <= 0; tf_wp <= 0; tf_rp <= 0; xf_wp <= 0; xf_rp <= 0;
        rd_req_valid <= 1'b0; wr_req_valid <= 1'b0; wr_data_valid <= 1'b0; qn_full <= 1'b0;
    end else begin
        if (start && !running) begin
            if (args_ok) begin
                running <= 1'b1;
                nq_q <= arg0; nkv_q <= arg1; d_q <= arg2; d_words <= arg2 >> 3; causal_q <= arg3[0];
                nqt_q <= arg0 * heads_a[31:0]; nv_q <= arg1 + arg7;
                bank_on <= {bank_on_init};
                mult_q <= arg4; shift_q <= arg5[5:0];
                pq_q <= ptr0; pk_q <= ptr1; pv_q <= ptr2; po_q <= ptr3; ps_q <= ptr4;
                g_ph <= 2'd0; c_ph <= 2'd0; c_row <= 32'd0; c_b <= 0; c_qrows <= 32'd0;
                rd_req_valid <= 1'b1; rd_req_addr <= ptr1; rd_req_len <= kv_len_a;
                qn_full <= 1'b0; q_clear <= 1'b1;
                s_run <= 1'b0; s_alldone <= 1'b0; s_inrow <= 1'b0; s_i <= 32'd0; c_ih <= 32'd0; s_j <= 32'd0; s_jt <= 32'd0; s_jnl <= 1'b0;
                tf_cnt <= 0; xf_cnt <= 0; tf_wp <= 0; tf_rp <= 0; xf_wp <= 0; xf_rp <= 0;
                sa_v <= 1'b0; sb_v <= 1'b0; sc_v <= 1'b0; sd_v <= 1'b0; se_v <= 1'b0; sf_v <= 1'b0;
                p0_v <= 1'b0; p1_v <= 1'b0; f_st <= F_IDLE;
                e_run <= 48'sd0; l_run <= 32'd0;
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
            if ({{{pad_dw}'d0, c_b}} == c_dwm1) begin
                c_b <= 0;
                if (c_row == c_nkvm1) begin c_row <= 32'd0; c_ph <= c_ph + 2'd1; if (c_ph == 2'd1) s_run <= 1'b1; end
                else c_row <= c_row + 32'd1;
            end else c_b <= c_b + 1'b1;
        end
        if (q_we) begin
            if ({{{pad_dw}'d0, c_b}} == c_dwm1) begin
                c_b <= 0; qn_full <= 1'b1;
                if (c_qrows == c_nqtm1) c_ph <= 2'd3;
                c_qrows <= c_qrows + 32'd1;
            end else c_b <= c_b + 1'b1;
        end
{st}
        // score stage issue
        if (s_issue) begin
            if (s_rowstart) begin
                qn_full <= 1'b0; q_clear <= 1'b1;
                c_ih <= (c_ih + 32'd1 == nq_q) ? 32'd0 : c_ih + 32'd1;
            end
            sa_v <= 1'b1;
            sa_f <= {{1'b0, s_empty_row, s_last, s_rowstart, s_tlast, s_tfirst}};
            sa_j <= s_jcur; sa_i <= s_i;
            if (s_last) begin
                s_inrow <= 1'b0; s_j <= 32'd0; s_jt <= 32'd0;
                if (s_i + 32'd1 == nqt_q) s_alldone <= 1'b1;
                s_i <= s_i + 32'd1;
            end else begin
                s_inrow <= 1'b1; s_j <= s_jcur + 32'd1; s_jnl <= s_jnl_n;
                if (s_rowstart) s_jend <= cj_q;
                s_jt <= s_tlast ? 32'd0 : s_jt + 32'd1;
            end
        end else sa_v <= 1'b0;
        // (the bank and score sums sc_p_*, sd_s are in the statements above)
        sb_v <= sa_v; sb_f <= sa_f; sb_j <= sa_j; sb_i <= sa_i;
        sc_v <= sb_v; sc_f <= sb_f; sc_j <= sb_j; sc_i <= sb_i;
        sd_v <= sc_v; sd_f <= sc_f; sd_j <= sc_j; sd_i <= sc_i;
        se_v <= sd_v; se_f <= sd_f; se_j <= sd_j; se_i <= sd_i; se_m <= sd_s * $signed({{1'b0, mult_q[15:0]}});
        sf_v <= se_v; sf_f <= se_f; sf_j <= se_j; sf_i <= se_i; sf_t <= se_t[47:0];
        if (sf_v) begin
            tmax <= tmax_n;
            tf_wp <= tf_wp + 1'b1;
            if (sf_f[1]) xf_wp <= xf_wp + 1'b1;
        end
        // FIFO counts
        tf_cnt <= tf_cnt + (sf_v ? 1'b1 : 1'b0) - (p_pop ? 1'b1 : 1'b0);
        xf_cnt <= xf_cnt + ((sf_v && sf_f[1]) ? 1'b1 : 1'b0) - ((p_pop && tf_f[0]) ? 1'b1 : 1'b0);
        // softmax/PV: P0 pop
        p0_v <= p_pop;
        if (p_pop) begin
            tf_rp <= tf_rp + 1'b1;
            if (tf_f[0]) xf_rp <= xf_rp + 1'b1;
            e_run <= e_new;
            p0_f <= tf_f; p0_i <= tf_i; p0_e <= e_new; p0_sh <= sh_new;
            p0_big <= (u_new >>> 8) >= 49'sd16;
            p0_n <= u_new[11:8];
            p0_lv <= lutn(tf_th[7:0]);
        end
        // P1: weight (the table value was read in P0: LUT[u & 255] = LUT[(-t) & 255])
        p1_v <= p0_v; p1_f <= p0_f; p1_i <= p0_i; p1_e <= p0_e; p1_sh <= p0_sh;
        p1_p <= p0_big ? 16'd0 : (p0_lv >> p0_n);
        // P1 -> accumulate (lanes in the statements above)
        if (p1_v) begin
            if (p1_rowlast) begin
                l_run <= 32'd0;
                f_l <= p1_f[4] ? 32'd0 : l_next; f_i <= p1_i;
                f_e <= p1_e;
                f_st <= F_PREP;
            end else l_run <= l_next;
        end
        // finaliser
        case (f_st)
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
            && f_st == F_IDLE && !wr_req_valid && !wr_data_valid && !s_issue) begin
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
        adwh = adw - 1,
        atdh = atd - 1,
        atd1 = atd + 1,
        tdl = td - 1,
        afwh = afw - 1,
        pad_dw = 32 - adw,
        pad_fw = 32 - afw,
        dwh = dw - 1,
        bank_on_init = bank_on_init,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::check_core_ports;

    #[test]
    fn verilog_has_the_contract_ports() {
        let rows = AttentionCore {
            q_rows: 4,
            ..AttentionCore::default()
        };
        for c in [
            AttentionCore::default(),
            AttentionCore::u55c(),
            rows,
            AttentionCore::u55c_rows(),
        ] {
            let v = c.core_verilog().expect("verilog");
            check_core_ports(&v, "attention_core").expect("ports");
        }
    }

    #[test]
    fn adder_tree_is_balanced_and_widens() {
        let mut decl = String::new();
        let terms = (0..16).map(|i| (format!("x{i}"), 16)).collect();
        let (root, w) = adder_tree(&mut decl, "t", terms);
        // 16 terms: 4 levels of two-input adders (15 of them), 16 + 4 bits
        assert_eq!((root.as_str(), w), ("t_3_0", 20));
        assert_eq!(decl.lines().count(), 15);
        assert!(decl.contains("wire [16:0] t_0_0 = {{1{x0[15]}}, x0} + {{1{x1[15]}}, x1};"));
        // an odd count passes the last term up a level
        let mut decl = String::new();
        let terms = (0..3).map(|i| (format!("y{i}"), 19)).collect();
        let (root, w) = adder_tree(&mut decl, "u", terms);
        assert_eq!((root.as_str(), w), ("u_1_0", 21));
        assert!(decl.contains("wire [20:0] u_1_0 = {{1{u_0_0[19]}}, u_0_0} + {{2{y2[18]}}, y2};"));
    }

    #[test]
    fn lutn_is_the_table_at_minus_the_index() {
        let cases = lutn_cases();
        let lut = exp2_lut();
        // u & 255 = (-t) & 255: t's low byte 0 is LUT[0], 1 is LUT[255], 128 is LUT[128]
        for (f, want) in [(0, lut[0]), (1, lut[255]), (128, lut[128]), (255, lut[1])] {
            let line = format!("8'd{f}: lutn = 16'd{want};");
            assert!(cases.contains(&line), "{line}");
        }
        assert_eq!(cases.lines().count(), 256);
    }

    #[test]
    fn card_build_has_2048_macs() {
        let c = AttentionCore::u55c_rows();
        assert_eq!(c.macs(), 2048);
        assert!(c.validate().is_ok());
        assert_eq!(AttentionCore::u55c().macs(), 256);
    }

    #[test]
    fn register_offsets_as_documented() {
        let slots = AttentionCore::default().desc().slots().expect("slots");
        let offs: Vec<u32> = slots.iter().map(|s| s.offset).collect();
        let want: Vec<u32> = (0..13).map(|i| 0x10 + 8 * i).collect();
        assert_eq!(offs, want);
        assert_eq!(slots[10].arg.name, "score_shift");
        assert_eq!(slots[11].arg.name, "heads");
        assert_eq!(slots[12].arg.name, "kv_skip");
    }

    #[test]
    fn bad_parameters_are_refused() {
        for c in [
            AttentionCore {
                d_max: 12,
                ..AttentionCore::default()
            },
            AttentionCore {
                nkv_max: 1,
                ..AttentionCore::default()
            },
            AttentionCore {
                kv_tile: 65,
                ..AttentionCore::default()
            },
            AttentionCore {
                q_rows: 0,
                ..AttentionCore::default()
            },
        ] {
            assert!(c.core_verilog().is_err(), "{c:?}");
        }
        assert_eq!(fifo_depth(8), 32);
    }
}
