//! The MoE router core: streams int16 logits `lanes` per cycle, keeps the top-k of each token
//! in one register insertion network per lane, merges the lanes' lists, computes a
//! fixed-point softmax (over the k selected, or over every expert with `renormalize = 0`)
//! in a fully pipelined datapath, and writes (id, weight) routes and the per-expert
//! histogram. Semantics: [`crate::golden::router`] (they do not depend on the lane count or
//! the port width).
//!
//! Pipeline (`L = lanes` logits per cycle in steady state; one token per
//! `max(ceil(E/L), k, ceil(k/2) + 1)` cycles):
//! 1. *stream*: one `data_bits`-bit word holds `P = data_bits / 16` logits (4, 8 or 16);
//!    `L` (1, 2, 4, 8 or 16, at most `P`) of them per cycle, the next word accepted in the
//!    cycle the current one is used up; lane `l` takes the logits `l, l + L, ...` of a row
//!    into its own `k_max`-entry insertion network (a newcomer goes after every entry `>=`
//!    itself, so equal values keep the lower index first); a running row maximum (up to 4
//!    lanes); the words of a row also go to a two-bank row buffer (for the sum over all
//!    experts);
//! 2. *merge* (L > 1): the lanes' lists handed over at the row's end and merged, one entry
//!    per cycle (the best lane head: larger value, then lower index), k cycles; with one lane
//!    the list is already merged. Up to 4 lanes a tournament of the lane heads picks it; from
//!    8 lanes a registered matrix of the heads' pairwise compares does (the winner's row is
//!    all ones; a pop replaces the winner's row and column by the compares of its next
//!    entry, made beside the pick), so the pick stays one AND and one one-hot mux deep; those
//!    builds hand the lists over in the cycle after the row's last group (the matrix starts
//!    from the compares of the lane registers), while the lanes start on the next row, and
//!    take the row's maximum from the first entry merged;
//! 3. *all-expert sum* (`renormalize = 0` only), beside the merge: the row read back from the
//!    row buffer `L` logits per cycle, `exp(-(m - q))` of each (subtract, multiply, LUT and
//!    shift, accumulate: 4 pipeline stages), the row's sum queued for the softmax;
//! 4. *softmax*, one token per cycle: copy, `d = m - q_j`, `d * log2 e`, LUT + shift (all k
//!    slots in parallel), the sum (or the queued all-expert sum), then a restoring divider
//!    `2^30 / S` of 8 stages, 2 quotient bits each (no variable shifts);
//! 5. *normalise*, two slots per cycle: `(e_j r + 2^14) >> 15`, one pair of output slots
//!    (`data_bits / 64` pairs fill an output word; a token's last pair closes it), two
//!    histogram increments into a queue that a one-port LUTRAM histogram drains;
//! 6. *write-out*: routes as they are produced, then the histogram (`data_bits / 32` counts
//!    a word).
//!
//! Arguments: `logits` (ptr0), `routes` (ptr1), `hist` (ptr2), `tokens` (arg0),
//! `experts` (arg1), `top_k` (arg2), `renormalize` (arg3: 1 over the k chosen, 0 over all
//! experts). Invalid values (E = 0 or > e_max, k = 0 or > k_max or > E, renormalize > 1)
//! finish at once without touching memory; the host validates first.

use std::fmt::Write as _;

use crate::core::{CoreError, KernelCore};
use crate::golden::router::{LOG2E_Q14, exp2_lut};
use crate::regmap::{ArgDesc, KernelDesc};

/// Lane counts a router build may have: the logits of one data word (4 at 64 bits, 8 at 128,
/// 16 at 256) split evenly, so a lane count must not exceed the logits of one word.
pub const ROUTER_LANES: [u32; 5] = [1, 2, 4, 8, 16];

/// Build parameters of the router.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouterCore {
    /// Most experts per token (power of two, 2..=4096): histogram size.
    pub e_max: u32,
    /// Most experts selected per token (1..=32): size of each lane's insertion network.
    pub k_max: u32,
    /// Logits taken per cycle (one of [`ROUTER_LANES`], at most `data_bits / 16`).
    pub lanes: u32,
    /// Width of the read and write ports in bits (one of
    /// [`crate::golden::router::ROUTER_DATA_BITS`]): a word holds `data_bits / 16` logits,
    /// and every memory layout is in words of this width
    /// ([`crate::golden::router::logit_row_beats`] and its siblings).
    pub data_bits: u32,
}

impl Default for RouterCore {
    /// The card-sized build: DeepSeek-V3's 256 experts, top-8, and 8 lanes on a 128-bit port,
    /// which take a whole word of 8 logits per cycle.
    fn default() -> Self {
        Self {
            e_max: 256,
            k_max: 8,
            lanes: 8,
            data_bits: 128,
        }
    }
}

impl RouterCore {
    /// The narrowest data port that holds `lanes` logits in a word (64 bits up to 4 lanes,
    /// 128 for 8, 256 for 16): the width a build takes when only its lanes are given.
    pub fn data_bits_for(lanes: u32) -> u32 {
        (lanes.saturating_mul(16)).next_power_of_two().max(64)
    }

    /// A build with `lanes` lanes on the narrowest port that holds them
    /// ([`RouterCore::data_bits_for`]).
    pub fn with_lanes(e_max: u32, k_max: u32, lanes: u32) -> Self {
        Self {
            e_max,
            k_max,
            lanes,
            data_bits: Self::data_bits_for(lanes),
        }
    }

    /// Logits in one data word (`data_bits / 16`).
    pub fn logits_per_word(&self) -> u32 {
        self.data_bits / 16
    }

    /// Whether the lanes' lists are merged through the registered comparison matrix (8 or
    /// more lanes) instead of a tournament of the lane heads (2 or 4 lanes).
    pub fn matrix_merge(&self) -> bool {
        self.lanes >= 8
    }

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
        if !crate::golden::router::ROUTER_DATA_BITS.contains(&self.data_bits) {
            return bad(format!(
                "data_bits = {} must be one of {:?}",
                self.data_bits,
                crate::golden::router::ROUTER_DATA_BITS
            ));
        }
        if !ROUTER_LANES.contains(&self.lanes) || self.lanes > self.logits_per_word() {
            return bad(format!(
                "lanes = {} must be one of {ROUTER_LANES:?} and at most the {} logits of a \
                 {}-bit word",
                self.lanes,
                self.logits_per_word(),
                self.data_bits
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
                ArgDesc::scalar("renormalize"),
            ],
        }
    }

    fn params(&self) -> Vec<(String, i64)> {
        vec![
            ("e_max".into(), i64::from(self.e_max)),
            ("k_max".into(), i64::from(self.k_max)),
            ("lanes".into(), i64::from(self.lanes)),
            ("data_bits".into(), i64::from(self.data_bits)),
        ]
    }

    fn core_verilog(&self) -> Result<String, CoreError> {
        self.validate()?;
        Ok(router_verilog(self))
    }

    fn data_bits(&self) -> u32 {
        self.data_bits
    }
}

/// Divider stages: 2 quotient bits each, 16 bits in all.
pub const DIV_STAGES: usize = 8;
/// Softmax stages before the divider (copy, subtract, multiply, LUT, sum).
pub const SOFTMAX_STAGES: usize = 5;

/// `t_0 + t_1 + ...` as a balanced tree of additions.
fn balanced_sum(terms: &[String]) -> String {
    match terms.len() {
        0 => "0".into(),
        1 => terms[0].clone(),
        n => format!(
            "({} + {})",
            balanced_sum(&terms[..n / 2]),
            balanced_sum(&terms[n / 2..])
        ),
    }
}

/// `S << b <= rem` and `S << b` (31 bits) for a sum `s` of `sw` bits and a 31-bit remainder.
fn shifted_sum(s: &str, sw: usize, b: usize) -> (String, String) {
    let hi = 31 - b; // bits of S at or above `hi` shift past bit 30
    let fits_hi = if hi < sw {
        format!("(~|{s}[{}:{hi}])", sw - 1)
    } else {
        "1'b1".to_string()
    };
    let lw = sw.min(hi);
    let mut parts = Vec::new();
    let pad = 31 - lw - b;
    if pad > 0 {
        parts.push(format!("{pad}'d0"));
    }
    parts.push(format!("{s}[{}:0]", lw - 1));
    if b > 0 {
        parts.push(format!("{b}'d0"));
    }
    (fits_hi, format!("{{{}}}", parts.join(", ")))
}

fn router_verilog(p: &RouterCore) -> String {
    let km = p.k_max as usize;
    let nl = p.lanes as usize;
    let mx = p.matrix_merge();
    let db = p.data_bits as usize;
    // logits per word (4, 8, 16) and the bits of a logit offset inside a word
    let lpw = db / 16;
    let pw = lpw.trailing_zeros() as usize;
    // u32 slots per output word (routes, histogram counts) and 64-bit pairs per output word
    let spw = db / 32;
    let npw = db / 64;
    let iw = p.e_max.trailing_zeros() as usize;
    let sw = iw + 16;
    // row buffer: words per row (at least 2 addresses), two banks
    let rwb = ((p.e_max as usize).div_ceil(lpw))
        .next_power_of_two()
        .trailing_zeros()
        .max(1) as usize;
    // Increment queue: 2*k_max entries (at least 4), a power of two.
    let qw = (2 * km).max(4).next_power_of_two().trailing_zeros() as usize;
    let q_depth = format!("{}'d{}", qw + 1, 1usize << qw);
    let mut v = String::new(); // declarations + combinational logic
    let mut rst = String::new(); // reset and run start
    let mut unused: Vec<String> = Vec::new();
    if mx {
        v.push_str("reg hpend;\n");
        // lane 0 always has a logit in a group
        unused.push("ok_0".into());
    }

    // ---------------- stream: lanes, insertion networks, row max, row buffer ----------------
    for l in 0..nl {
        if lpw == nl {
            let _ = writeln!(
                v,
                "wire signed [15:0] v_in_{l} = w_q[{}:{}];",
                16 * l + 15,
                16 * l
            );
        } else {
            let _ = writeln!(
                v,
                "reg signed [15:0] v_in_{l};\nalways @(*) begin\n    case (pos)"
            );
            let mut pp = 0;
            while pp < lpw {
                let s = pp + l;
                let _ = writeln!(
                    v,
                    "        {pw}'d{pp}: v_in_{l} = w_q[{}:{}];",
                    16 * s + 15,
                    16 * s
                );
                pp += nl;
            }
            let _ = writeln!(v, "        default: v_in_{l} = 16'sd0;\n    endcase\nend");
        }
        let _ = writeln!(
            v,
            "wire [15:0] ix_{l} = eidx + 16'd{l};\nwire ok_{l} = (left > 16'd{l});\n\
             wire [IW-1:0] i_in_{l} = ix_{l}[IW-1:0];"
        );
        if !mx {
            let _ = writeln!(v, "wire signed [15:0] vv_{l} = ok_{l} ? v_in_{l} : v_in_0;");
        }
        unused.push(format!("ix_{l}[15:IW]"));
        for j in 0..km {
            let _ = writeln!(
                v,
                "reg signed [15:0] tv_{l}_{j}; reg [IW-1:0] ti_{l}_{j}; reg tk_{l}_{j};\n\
                 wire signed [15:0] nv_{l}_{j}; wire [IW-1:0] ni_{l}_{j}; wire nk_{l}_{j};"
            );
            // The tournament build hands the lists over with the row's last group; the
            // matrix build hands them over one cycle later (`hpend`) and its lanes start the
            // next row in that cycle, with the old entries masked (`tkm`); a lane with no
            // logit in the group (`!ok`) keeps its list as it is.
            let (tkj, tkq) = if mx {
                let _ = writeln!(v, "wire tkm_{l}_{j} = tk_{l}_{j} && !hpend;");
                let skip = if l == 0 {
                    String::new()
                } else {
                    format!(" || !ok_{l}")
                };
                let _ = writeln!(
                    v,
                    "wire ge_{l}_{j} = (tkm_{l}_{j} && (tv_{l}_{j} >= v_in_{l})){skip};"
                );
                (
                    format!("tkm_{l}_{j}"),
                    format!("tkm_{l}_{}", j.saturating_sub(1)),
                )
            } else {
                let _ = writeln!(
                    v,
                    "wire ge_{l}_{j} = tk_{l}_{j} && (tv_{l}_{j} >= v_in_{l});"
                );
                (
                    format!("tk_{l}_{j}"),
                    format!("tk_{l}_{}", j.saturating_sub(1)),
                )
            };
            if j == 0 {
                let _ = writeln!(
                    v,
                    "assign nv_{l}_0 = ge_{l}_0 ? tv_{l}_0 : v_in_{l};\nassign ni_{l}_0 = ge_{l}_0 ? ti_{l}_0 : i_in_{l};\nassign nk_{l}_0 = ge_{l}_0 ? {tkj} : 1'b1;"
                );
            } else {
                let q = j - 1;
                let _ = writeln!(
                    v,
                    "assign nv_{l}_{j} = ge_{l}_{j} ? tv_{l}_{j} : (ge_{l}_{q} ? v_in_{l} : tv_{l}_{q});\n\
                     assign ni_{l}_{j} = ge_{l}_{j} ? ti_{l}_{j} : (ge_{l}_{q} ? i_in_{l} : ti_{l}_{q});\n\
                     assign nk_{l}_{j} = ge_{l}_{j} ? {tkj} : (ge_{l}_{q} ? 1'b1 : {tkq});"
                );
            }
            let _ = writeln!(
                rst,
                "        tk_{l}_{j} <= 1'b0; tv_{l}_{j} <= 16'sd0; ti_{l}_{j} <= {{IW{{1'b0}}}};"
            );
        }
    }
    // group maximum (invalid lanes stand in as lane 0); the matrix build takes the row's
    // maximum from its first merged entry instead
    match nl {
        _ if mx => {}
        1 => v.push_str("wire signed [15:0] gmax = vv_0;\n"),
        2 => v.push_str("wire signed [15:0] gmax = (vv_1 > vv_0) ? vv_1 : vv_0;\n"),
        _ => v.push_str(
            "wire signed [15:0] gm_a = (vv_1 > vv_0) ? vv_1 : vv_0;\n\
             wire signed [15:0] gm_b = (vv_3 > vv_2) ? vv_3 : vv_2;\n\
             wire signed [15:0] gmax = (gm_b > gm_a) ? gm_b : gm_a;\n",
        ),
    }
    // insertion (every lane of a group that is not the row's last is valid) and hand-off
    let mut ins = String::new();
    let mut hand = String::new();
    let mut clear_net = String::new();
    for l in 0..nl {
        for j in 0..km {
            let _ = writeln!(
                ins,
                "                    tv_{l}_{j} <= nv_{l}_{j}; ti_{l}_{j} <= ni_{l}_{j}; tk_{l}_{j} <= nk_{l}_{j};"
            );
            let _ = writeln!(clear_net, "                tk_{l}_{j} <= 1'b0;");
            if nl == 1 {
                let _ = writeln!(
                    hand,
                    "                    sv_{j} <= nv_0_{j}; si_{j} <= ni_0_{j};"
                );
            } else if mx {
                let _ = writeln!(
                    hand,
                    "                mv_{l}_{j} <= tv_{l}_{j}; mi_{l}_{j} <= ti_{l}_{j}; mk_{l}_{j} <= tk_{l}_{j};"
                );
            } else {
                let _ = writeln!(
                    hand,
                    "                    mv_{l}_{j} <= ok_{l} ? nv_{l}_{j} : tv_{l}_{j}; mi_{l}_{j} <= ok_{l} ? ni_{l}_{j} : ti_{l}_{j}; mk_{l}_{j} <= ok_{l} ? nk_{l}_{j} : tk_{l}_{j};"
                );
            }
        }
    }

    // ---------------- merge ----------------
    let mut mrg = String::new();
    for j in 0..km {
        let _ = writeln!(v, "reg signed [15:0] sv_{j}; reg [IW-1:0] si_{j};");
        let _ = writeln!(rst, "        sv_{j} <= 16'sd0; si_{j} <= {{IW{{1'b0}}}};");
    }
    if nl == 1 {
        v.push_str("wire m_ready = mfull;\n");
        unused.push("mcnt".into());
        for j in 0..km {
            let _ = writeln!(
                v,
                "wire signed [15:0] xv_{j} = sv_{j}; wire [IW-1:0] xi_{j} = si_{j};"
            );
        }
    } else if mx {
        // Matrix merge: `c_a_b` (a < b) holds "lane a's head beats lane b's head" (valid,
        // larger value, then lower id); the winner is the lane whose row of the matrix is all
        // ones (exactly one while a valid entry is left). At a pop the winner's row and
        // column take the compares of its next entry against the other heads (`x_a_b`,
        // computed from registers beside the pick), so a pop is one AND and one one-hot
        // mux deep whatever the lane count; at the hand-off the matrix starts from the
        // compares of the lists' heads, made from the lane networks' registers.
        let key = |val: &str, id: &str, k: &str| format!("{{{k}, ~{val}[15], {val}[14:0], ~{id}}}");
        for l in 0..nl {
            for j in 0..km {
                let _ = writeln!(
                    v,
                    "reg signed [15:0] mv_{l}_{j}; reg [IW-1:0] mi_{l}_{j}; reg mk_{l}_{j};"
                );
                let _ = writeln!(
                    rst,
                    "        mv_{l}_{j} <= 16'sd0; mi_{l}_{j} <= {{IW{{1'b0}}}}; mk_{l}_{j} <= 1'b0;"
                );
            }
            let _ = writeln!(
                v,
                "wire [16+IW:0] hkey_{l} = {};\nwire [16+IW:0] tkey_{l} = {};",
                key(
                    &format!("mv_{l}_0"),
                    &format!("mi_{l}_0"),
                    &format!("mk_{l}_0")
                ),
                key(
                    &format!("tv_{l}_0"),
                    &format!("ti_{l}_0"),
                    &format!("tk_{l}_0")
                )
            );
            if km > 1 {
                let _ = writeln!(
                    v,
                    "wire [16+IW:0] nkey_{l} = {};",
                    key(
                        &format!("mv_{l}_1"),
                        &format!("mi_{l}_1"),
                        &format!("mk_{l}_1")
                    )
                );
            } else {
                let _ = writeln!(v, "wire [16+IW:0] nkey_{l} = {{(17+IW){{1'b0}}}};");
            }
        }
        let beat = |a: usize, b: usize| {
            if a < b {
                format!("c_{a}_{b}")
            } else {
                format!("!c_{b}_{a}")
            }
        };
        let mut cpop = String::new();
        let mut chand = String::new();
        for a in 0..nl {
            for b in 0..nl {
                if a != b {
                    let _ = writeln!(v, "wire x_{a}_{b} = nkey_{a} > hkey_{b};");
                }
                if a < b {
                    let _ = writeln!(v, "reg c_{a}_{b};");
                    let _ = writeln!(rst, "        c_{a}_{b} <= 1'b0;");
                    let _ = writeln!(
                        cpop,
                        "                c_{a}_{b} <= win_{a} ? x_{a}_{b} : (win_{b} ? !x_{b}_{a} : c_{a}_{b});"
                    );
                    let _ = writeln!(chand, "                c_{a}_{b} <= tkey_{a} > tkey_{b};");
                }
            }
            let row: Vec<String> = (0..nl).filter(|&b| b != a).map(|b| beat(a, b)).collect();
            let _ = writeln!(v, "wire win_{a} = {};", row.join(" && "));
        }
        let hv: Vec<String> = (0..nl)
            .map(|l| format!("({{16{{win_{l}}}}} & mv_{l}_0)"))
            .collect();
        let hi: Vec<String> = (0..nl)
            .map(|l| format!("({{IW{{win_{l}}}}} & mi_{l}_0)"))
            .collect();
        let _ = writeln!(
            v,
            "wire signed [15:0] hv_w = {};\nwire [IW-1:0] hi_w = {};",
            hv.join(" | "),
            hi.join(" | ")
        );
        v.push_str(
            "wire pop = mfull && (mcnt < k_q);\n\
             wire m_ready = mfull && ((mcnt + 6'd1 == k_q) || (mcnt == k_q));\n",
        );
        for j in 0..km {
            let _ = writeln!(
                v,
                "wire xsel_{j} = pop && (mcnt == 6'd{j});\n\
                 wire signed [15:0] xv_{j} = xsel_{j} ? hv_w : sv_{j}; wire [IW-1:0] xi_{j} = xsel_{j} ? hi_w : si_{j};"
            );
            let _ = writeln!(
                mrg,
                "                if (xsel_{j}) begin sv_{j} <= hv_w; si_{j} <= hi_w; end"
            );
        }
        // the row's maximum (the all-expert sum's m) is the first entry merged
        mrg.push_str("                if (mcnt == 6'd0) s_m <= hv_w;\n");
        mrg.push_str(&cpop);
        for l in 0..nl {
            let _ = writeln!(mrg, "                if (win_{l}) begin");
            for j in 0..km {
                if j + 1 < km {
                    let _ = writeln!(
                        mrg,
                        "                    mv_{l}_{j} <= mv_{l}_{}; mi_{l}_{j} <= mi_{l}_{}; mk_{l}_{j} <= mk_{l}_{};",
                        j + 1,
                        j + 1,
                        j + 1
                    );
                } else {
                    let _ = writeln!(mrg, "                    mk_{l}_{j} <= 1'b0;");
                }
            }
            let _ = writeln!(mrg, "                end");
        }
        hand.push_str(&chand);
    } else {
        for l in 0..nl {
            for j in 0..km {
                let _ = writeln!(
                    v,
                    "reg signed [15:0] mv_{l}_{j}; reg [IW-1:0] mi_{l}_{j}; reg mk_{l}_{j};"
                );
                let _ = writeln!(
                    rst,
                    "        mv_{l}_{j} <= 16'sd0; mi_{l}_{j} <= {{IW{{1'b0}}}}; mk_{l}_{j} <= 1'b0;"
                );
            }
            let _ = writeln!(
                v,
                "wire hk_{l} = mk_{l}_0; wire signed [15:0] hv_{l} = mv_{l}_0; wire [IW-1:0] hi_{l} = mi_{l}_0; wire [1:0] hl_{l} = 2'd{l};"
            );
        }
        // tournament: a beats b when a is valid and (b is not, or larger, or equal and lower
        // id): one unsigned compare of the keys {valid, value with its sign flipped, ~id}
        let pick = |v: &mut String, o: &str, a: &str, b: &str| {
            let _ = writeln!(
                v,
                "wire ab_{o} = {{hk_{a}, ~hv_{a}[15], hv_{a}[14:0], ~hi_{a}}} > {{hk_{b}, ~hv_{b}[15], hv_{b}[14:0], ~hi_{b}}};\n\
                 wire hk_{o} = ab_{o} ? hk_{a} : hk_{b}; wire signed [15:0] hv_{o} = ab_{o} ? hv_{a} : hv_{b};\n\
                 wire [IW-1:0] hi_{o} = ab_{o} ? hi_{a} : hi_{b}; wire [1:0] hl_{o} = ab_{o} ? hl_{a} : hl_{b};"
            );
        };
        if nl == 2 {
            pick(&mut v, "w", "0", "1");
        } else {
            pick(&mut v, "x", "0", "1");
            pick(&mut v, "y", "2", "3");
            pick(&mut v, "w", "x", "y");
        }
        unused.push("hk_w".into());
        v.push_str(
            "wire pop = mfull && (mcnt < k_q);\n\
             wire m_ready = mfull && ((mcnt + 6'd1 == k_q) || (mcnt == k_q));\n",
        );
        for j in 0..km {
            let _ = writeln!(
                v,
                "wire xsel_{j} = pop && (mcnt == 6'd{j});\n\
                 wire signed [15:0] xv_{j} = xsel_{j} ? hv_w : sv_{j}; wire [IW-1:0] xi_{j} = xsel_{j} ? hi_w : si_{j};"
            );
            let _ = writeln!(
                mrg,
                "                if (xsel_{j}) begin sv_{j} <= hv_w; si_{j} <= hi_w; end"
            );
        }
        for l in 0..nl {
            let _ = writeln!(mrg, "                if (hl_w == 2'd{l}) begin");
            for j in 0..km {
                if j + 1 < km {
                    let _ = writeln!(
                        mrg,
                        "                    mv_{l}_{j} <= mv_{l}_{}; mi_{l}_{j} <= mi_{l}_{}; mk_{l}_{j} <= mk_{l}_{};",
                        j + 1,
                        j + 1,
                        j + 1
                    );
                } else {
                    let _ = writeln!(mrg, "                    mk_{l}_{j} <= 1'b0;");
                }
            }
            let _ = writeln!(mrg, "                end");
        }
    }

    // ---------------- softmax pipeline ----------------
    let mut pipe: [String; 6] = Default::default();
    let mut pst = String::new();
    for j in 0..km {
        let _ = writeln!(
            v,
            "reg signed [15:0] p1v_{j}; reg [IW-1:0] p1i_{j};\n\
             reg [16:0] p2d_{j}; reg [IW-1:0] p2i_{j};\n\
             reg [16:0] p3u_{j}; reg [IW-1:0] p3i_{j};\n\
             reg [15:0] p4l_{j}; reg [8:0] p4h_{j}; reg [IW-1:0] p4i_{j};\n\
             reg [15:0] p5e_{j}; reg [IW-1:0] p5i_{j};\n\
             reg [15:0] p6e_{j}; reg [IW-1:0] p6i_{j};\n\
             wire [32:0] p3m_{j} = {{16'd0, p2d_{j}}} * 33'd{log2e};\n\
             reg km_{j};\n\
             wire [15:0] p5k_{j} = km_{j} ? p5e_{j} : 16'd0;",
            log2e = LOG2E_Q14
        );
        unused.push(format!("p3m_{j}[32:31]"));
        unused.push(format!("p3m_{j}[13:0]"));
        let stage_loads = [
            format!("p1v_{j} <= xv_{j}; p1i_{j} <= xi_{j};"),
            format!(
                "p2d_{j} <= {{p1v_0[15], p1v_0}} - {{p1v_{j}[15], p1v_{j}}}; p2i_{j} <= p1i_{j};"
            ),
            format!("p3u_{j} <= p3m_{j}[30:14]; p3i_{j} <= p2i_{j};"),
            format!("p4l_{j} <= lut(p3u_{j}[7:0]); p4h_{j} <= p3u_{j}[16:8]; p4i_{j} <= p3i_{j};"),
            format!("p5e_{j} <= expsh(p4l_{j}, p4h_{j}); p5i_{j} <= p4i_{j};"),
            format!("p6e_{j} <= p5e_{j}; p6i_{j} <= p5i_{j};"),
        ];
        for (st, load) in stage_loads.iter().enumerate() {
            let _ = writeln!(pipe[st], "                {load}");
        }
        let _ = writeln!(
            pst,
            "        p1v_{j} <= 16'sd0; p1i_{j} <= {{IW{{1'b0}}}}; p2d_{j} <= 17'd0; p2i_{j} <= {{IW{{1'b0}}}};\n\
             p3u_{j} <= 17'd0; p3i_{j} <= {{IW{{1'b0}}}}; p4l_{j} <= 16'd0; p4h_{j} <= 9'd0; p4i_{j} <= {{IW{{1'b0}}}};\n\
             p5e_{j} <= 16'd0; p5i_{j} <= {{IW{{1'b0}}}}; p6e_{j} <= 16'd0; p6i_{j} <= {{IW{{1'b0}}}};"
        );
    }
    // the k-slot sum (the exps are at most 2^15 each, 32 of them fit SW >= 17 bits)
    let terms: Vec<String> = (0..km)
        .map(|j| format!("{{{{(SW-16){{1'b0}}}}, p5k_{j}}}"))
        .collect();
    let _ = writeln!(v, "wire [SW-1:0] p5sum = {};", balanced_sum(&terms));
    let mut kmask = String::new();
    for j in 0..km {
        let _ = writeln!(kmask, "                km_{j} <= (32'd{j} < arg2);");
        let _ = writeln!(rst, "        km_{j} <= 1'b0;");
    }
    // divider
    let mut dstg = String::new();
    for s in 1..=DIV_STAGES {
        let b1 = 17 - 2 * s;
        let b0 = 16 - 2 * s;
        let prev_r = if s == 1 {
            "31'd1073741824".to_string()
        } else {
            format!("d{}r", s - 1)
        };
        let prev_s = if s == 1 {
            "p6s".to_string()
        } else {
            format!("d{}s", s - 1)
        };
        let prev_q = if s == 1 {
            "16'd0".to_string()
        } else {
            format!("d{}q", s - 1)
        };
        let (h1, s1) = shifted_sum(&prev_s, sw, b1);
        let (h0, s0) = shifted_sum(&prev_s, sw, b0);
        let _ = writeln!(
            v,
            "reg [30:0] d{s}r; reg [SW-1:0] d{s}s; reg [15:0] d{s}q; reg d{s}v;\n\
             wire [30:0] d{s}a1 = {s1};\n\
             wire [31:0] d{s}t1 = {{1'b0, {prev_r}}} - {{1'b0, d{s}a1}};\n\
             wire d{s}g1 = {h1} && !d{s}t1[31];\n\
             wire [30:0] d{s}r1 = d{s}g1 ? d{s}t1[30:0] : {prev_r};\n\
             wire [30:0] d{s}a0 = {s0};\n\
             wire [31:0] d{s}t0 = {{1'b0, d{s}r1}} - {{1'b0, d{s}a0}};\n\
             wire d{s}g0 = {h0} && !d{s}t0[31];\n\
             wire [30:0] d{s}r0 = d{s}g0 ? d{s}t0[30:0] : d{s}r1;"
        );
        let _ = writeln!(
            dstg,
            "                d{s}r <= d{s}r0; d{s}s <= {prev_s}; d{s}q <= {prev_q} | ({{14'd0, d{s}g1, d{s}g0}} << {b0});"
        );
        let _ = writeln!(
            pst,
            "        d{s}r <= 31'd0; d{s}s <= {{SW{{1'b0}}}}; d{s}q <= 16'd0; d{s}v <= 1'b0;"
        );
        let prev_v = if s == 1 {
            "p6v".to_string()
        } else {
            format!("d{}v", s - 1)
        };
        let _ = writeln!(dstg, "                d{s}v <= {prev_v};");
        for j in 0..km {
            let (pe, pi) = if s == 1 {
                (format!("p6e_{j}"), format!("p6i_{j}"))
            } else {
                (format!("d{}e_{j}", s - 1), format!("d{}i_{j}", s - 1))
            };
            let _ = writeln!(v, "reg [15:0] d{s}e_{j}; reg [IW-1:0] d{s}i_{j};");
            let _ = writeln!(
                dstg,
                "                d{s}e_{j} <= {pe}; d{s}i_{j} <= {pi};"
            );
            let _ = writeln!(
                pst,
                "        d{s}e_{j} <= 16'd0; d{s}i_{j} <= {{IW{{1'b0}}}};"
            );
        }
    }
    let dl = DIV_STAGES;
    unused.push(format!("d{dl}r"));
    unused.push(format!("d{dl}s"));

    // ---------------- normalise ----------------
    let mut sel = String::new();
    let mut nload = String::new();
    for j in 0..km {
        let _ = writeln!(v, "reg [15:0] ne_{j}; reg [IW-1:0] ni_{j};");
        let _ = writeln!(rst, "        ne_{j} <= 16'd0; ni_{j} <= {{IW{{1'b0}}}};");
        let _ = writeln!(
            nload,
            "                ne_{j} <= d{dl}e_{j}; ni_{j} <= d{dl}i_{j};"
        );
        if j % 2 == 0 {
            let (be, bi) = if j + 1 < km {
                (format!("ne_{}", j + 1), format!("ni_{}", j + 1))
            } else {
                ("16'd0".into(), "{IW{1'b0}}".into())
            };
            let _ = writeln!(
                sel,
                "        6'd{j}: begin sa_e = ne_{j}; sa_i = ni_{j}; sb_e = {be}; sb_i = {bi}; end"
            );
        }
    }

    // ---------------- all-expert sum (renormalize = 0) ----------------
    let mut ssel = String::new();
    let mut sstg = String::new();
    for l in 0..nl {
        if lpw == nl {
            let _ = writeln!(
                ssel,
                "wire signed [15:0] sx_{l} = s_word[{}:{}];",
                16 * l + 15,
                16 * l
            );
        } else {
            let _ = writeln!(
                ssel,
                "reg signed [15:0] sx_{l};\nalways @(*) begin\n    case (s_pos)"
            );
            let mut pp = 0;
            while pp < lpw {
                let s = pp + l;
                let _ = writeln!(
                    ssel,
                    "        {pw}'d{pp}: sx_{l} = s_word[{}:{}];",
                    16 * s + 15,
                    16 * s
                );
                pp += nl;
            }
            let _ = writeln!(ssel, "        default: sx_{l} = 16'sd0;\n    endcase\nend");
        }
        let _ = writeln!(
            ssel,
            "wire sok_{l} = (s_left > 16'd{l});\n\
             reg signed [15:0] sx0_{l}; reg sk0_{l}; reg [16:0] sd_{l}; reg sdk_{l}; reg [16:0] su_{l}; reg suk_{l};\n\
             reg [15:0] sl_{l}; reg [8:0] sh_{l}; reg slk_{l}; reg [15:0] se_{l};\n\
             wire [32:0] sm_{l} = {{16'd0, sd_{l}}} * 33'd{log2e};",
            log2e = LOG2E_Q14
        );
        unused.push(format!("sm_{l}[32:31]"));
        unused.push(format!("sm_{l}[13:0]"));
        let _ = writeln!(
            sstg,
            "            sx0_{l} <= sx_{l}; sk0_{l} <= s_busy && sok_{l};\n\
             sd_{l} <= {{s_m[15], s_m}} - {{sx0_{l}[15], sx0_{l}}}; sdk_{l} <= sk0_{l};\n\
             su_{l} <= sm_{l}[30:14]; suk_{l} <= sdk_{l};\n\
             sl_{l} <= lut(su_{l}[7:0]); sh_{l} <= su_{l}[16:8]; slk_{l} <= suk_{l};\n\
             se_{l} <= slk_{l} ? expsh(sl_{l}, sh_{l}) : 16'd0;"
        );
        let _ = writeln!(
            pst,
            "        sx0_{l} <= 16'sd0; sk0_{l} <= 1'b0; sd_{l} <= 17'd0; sdk_{l} <= 1'b0; su_{l} <= 17'd0; suk_{l} <= 1'b0;\n\
             sl_{l} <= 16'd0; sh_{l} <= 9'd0; slk_{l} <= 1'b0; se_{l} <= 16'd0;"
        );
    }
    let se_terms: Vec<String> = (0..nl)
        .map(|l| format!("{{{{(SW-16){{1'b0}}}}, se_{l}}}"))
        .collect();
    let _ = writeln!(ssel, "wire [SW-1:0] se_sum = {};", balanced_sum(&se_terms));
    ssel.push_str("wire [SW-1:0] p6s_nx = rn_q ? p5sum : sfifo[s_rp[2:0]];\n");

    let lut = exp2_lut();
    // one 256-entry constant per output bit, indexed by f
    let mut lut_bits = String::new();
    for b in 0..16 {
        let mut hex = String::new();
        for nib in (0..64).rev() {
            let mut n = 0u32;
            for i in 0..4 {
                n |= ((lut[nib * 4 + i] >> b) & 1) << i;
            }
            let _ = write!(hex, "{n:x}");
        }
        let _ = writeln!(lut_bits, "localparam [255:0] LUTB{b} = 256'h{hex};");
    }
    let lut_cat: Vec<String> = (0..16).rev().map(|b| format!("LUTB{b}[f]")).collect();
    let lut_cat = lut_cat.join(", ");
    unused.push("s_idx".into());
    let unused_list = unused.join(", ");
    let group_last = format!("(left <= 16'd{nl})");
    let s_group_last = format!("(s_left <= 16'd{nl})");
    let word_end = lpw - nl;
    let pos_t = |x: usize| format!("{pw}'d{x}");
    // the row maximum: a group maximum registered, then merged (tournament builds); the
    // matrix build takes it from the merge's first entry
    let (rowmax_decl, rowmax_rst, rowmax_upd) = if mx {
        (String::new(), String::new(), String::new())
    } else {
        (
            "// the row maximum, one cycle behind the stream: the group maximum registered, then merged\n\
             reg signed [15:0] rmax;\n\
             reg gq_v;\n\
             reg signed [15:0] gq;\n\
             reg gq_first, gq_last;\n\
             wire signed [15:0] rmax_nx = gq_first ? gq : ((gq > rmax) ? gq : rmax);\n"
                .to_string(),
            " gq_v <= 1'b0; rmax <= 16'sd0; gq <= 16'sd0; gq_first <= 1'b0; gq_last <= 1'b0;".to_string(),
            "            gq_v <= elem_fire; gq <= gmax; gq_first <= (eidx == 16'd0); gq_last <= last_in_row;\n\
             \x20           if (gq_v) begin\n\
             \x20               rmax <= rmax_nx;\n\
             \x20               if (gq_last) s_m <= rmax_nx;\n\
             \x20           end\n"
                .to_string(),
        )
    };
    // stream hand-shake and the lists' hand-off: with the row's last group (tournament), or
    // in a cycle of its own after it (matrix: `hpend`), in which the lanes may take the
    // next row's first group
    let (fire_decl, stream_upd) = if mx {
        (
            "wire hand = hpend && hand_ok;\nwire elem_fire = w_valid && (!hpend || hand_ok);\n"
                .to_string(),
            format!(
                "            if (hand) begin\n\
                 \x20               hpend <= 1'b0; mfull <= 1'b1; mcnt <= 6'd0;\n\
                 \x20               if (!rn_q) begin\n\
                 \x20                   s_busy <= 1'b1; s_bank <= !wbank; s_idx <= 16'd0; s_pos <= {p0}; s_left <= e_q;\n\
                 \x20               end\n\
                 {hand}            end\n\
                 \x20           if (elem_fire) begin\n\
                 \x20               pos <= pos + {pl};\n\
                 \x20               eidx <= last_in_row ? 16'd0 : eidx + 16'd{nl};\n\
                 \x20               left <= last_in_row ? e_q : left - 16'd{nl};\n\
                 \x20               if (last_in_row) begin\n\
                 \x20                   hpend <= 1'b1; wbank <= !wbank;\n\
                 \x20               end\n\
                 {ins}            end else if (hand) begin\n\
                 {clear_net}            end\n",
                p0 = pos_t(0),
                pl = pos_t(nl % lpw),
            ),
        )
    } else {
        (
            "wire elem_fire = w_valid && (!last_in_row || hand_ok);\n".to_string(),
            format!(
                "            if (elem_fire) begin\n\
                 \x20               pos <= pos + {pl};\n\
                 \x20               eidx <= last_in_row ? 16'd0 : eidx + 16'd{nl};\n\
                 \x20               left <= last_in_row ? e_q : left - 16'd{nl};\n\
                 \x20               if (last_in_row) begin\n\
                 \x20                   mfull <= 1'b1; mcnt <= 6'd0; wbank <= !wbank;\n\
                 \x20                   if (!rn_q) begin\n\
                 \x20                       s_busy <= 1'b1; s_bank <= wbank; s_idx <= 16'd0; s_pos <= {p0}; s_left <= e_q;\n\
                 \x20                   end\n\
                 {hand}{clear_net}                end else begin\n\
                 {ins}                end\n\
                 \x20           end\n",
                p0 = pos_t(0),
                pl = pos_t(nl % lpw),
            ),
        )
    };
    // the output word: `npw` pairs of route slots filled one per normalise step (a token's
    // last pair closes the word), or `spw` histogram counts
    let (out_decl, out_rst, out_pair) = if npw == 1 {
        (
            String::new(),
            String::new(),
            "                ow <= {rec_b, rec_a};\n                ow_valid <= 1'b1;\n"
                .to_string(),
        )
    } else {
        let ob = npw.trailing_zeros() as usize;
        let mut fill = String::new();
        for s in 0..npw {
            let _ = writeln!(
                fill,
                "                ow[{hi}:{lo}] <= (opi == {ob}'d{s}) ? {{rec_b, rec_a}} : ((opi == {ob}'d0) ? 64'd0 : ow[{hi}:{lo}]);",
                hi = 64 * s + 63,
                lo = 64 * s
            );
        }
        let _ = write!(
            fill,
            "                if (last_pair || opi == {ob}'d{last}) begin\n\
             \x20                   ow_valid <= 1'b1; opi <= {ob}'d0;\n\
             \x20               end else opi <= opi + {ob}'d1;\n",
            last = npw - 1
        );
        (
            format!("reg [{}:0] opi;\n", ob - 1),
            format!(" opi <= {ob}'d0;"),
            fill,
        )
    };
    let hb = spw.trailing_zeros() as usize;
    let mut h_decl = String::new();
    let mut h_store = String::new();
    let mut h_rst = String::new();
    for s in 0..spw - 1 {
        let _ = writeln!(h_decl, "reg [31:0] h_b{s};");
        let _ = write!(h_rst, " h_b{s} <= 32'd0;");
        let _ = writeln!(
            h_store,
            "                    if (hsel == {hb}'d{s}) h_b{s} <= h_val;"
        );
    }
    let h_cat: Vec<String> = std::iter::once("h_val".to_string())
        .chain((0..spw - 1).rev().map(|s| format!("h_b{s}")))
        .collect();
    let h_cat = h_cat.join(", ");
    format!(
        r#"
// MoE router core (tandem-fpga): e_max = {e_max}, k_max = {km}, lanes = {nl}, data_bits = {db}. Semantics: fpga::golden::router.
module router_core(
    input wire clock, input wire reset, input wire start,
    output reg done, output reg busy,
    input wire [31:0] arg0, input wire [31:0] arg1, input wire [31:0] arg2, input wire [31:0] arg3,
    input wire [31:0] arg4, input wire [31:0] arg5, input wire [31:0] arg6, input wire [31:0] arg7,
    input wire [63:0] ptr0, input wire [63:0] ptr1, input wire [63:0] ptr2, input wire [63:0] ptr3,
    input wire [63:0] ptr4, input wire [63:0] ptr5, input wire [63:0] ptr6, input wire [63:0] ptr7,
    output reg rd_req_valid, input wire rd_req_ready, output reg [63:0] rd_req_addr, output reg [31:0] rd_req_len,
    input wire rd_data_valid, output reg rd_data_ready, input wire [{dm}:0] rd_data,
    output reg wr_req_valid, input wire wr_req_ready, output reg [63:0] wr_req_addr, output reg [31:0] wr_req_len,
    output reg wr_data_valid, input wire wr_data_ready, output reg [{dm}:0] wr_data, output reg [{sm}:0] wr_strb
);
localparam integer IW = {iw};
localparam integer SW = {sw};
localparam integer RWB = {rwb};
localparam [31:0] E_MAX = 32'd{e_max};
localparam [31:0] K_MAX = 32'd{km};
localparam [1:0] W_ROUTES = 2'd0, W_HREQ = 2'd1, W_HDATA = 2'd2, W_END = 2'd3;

// LUT[f] = round(2^15 2^(-f/256)), bit b of entry f at bit f of LUTB<b> (logic, not a ROM
// a synthesis tool may move registers across)
{lut_bits}function [15:0] lut;
    input [7:0] f;
    lut = {{{lut_cat}}};
endfunction
// exp(-d / 256) in Q0.15 from u = d log2(e) in units of 2^-8 (l = LUT[u & 255], h = u >> 8):
// 0 once h >= 16
function [15:0] expsh;
    input [15:0] l;
    input [8:0] h;
    expsh = (h[8:4] != 5'd0) ? 16'd0 : (l >> h[3:0]);
endfunction

// ---- run control ----
reg running;
reg [31:0] t_q;
reg [15:0] e_q;
reg [5:0] k_q;
reg rn_q;
reg [31:0] rd_len_q, rt_len_q, h_len_q;
reg rd_pend, wr_pend;
reg [1:0] wph;
reg [31:0] tout;
reg [15:0] clr_idx;
reg clr_done;
wire args_ok_w = (arg1 != 32'd0) && (arg1 <= E_MAX) && (arg2 != 32'd0) && (arg2 <= K_MAX) && (arg2 <= arg1) && (arg3 <= 32'd1);
// registered: the arguments are written over s_axi_control transactions before the one that
// sets ap_start, so they are stable for cycles before `start`; the range checks then stay
// out of the run-start clear of every pipeline register
reg args_ok;
always @(posedge clock) args_ok <= !reset && args_ok_w;
wire [31:0] wpr = (arg1 + 32'd{lpw_m1}) >> {pw};
wire [31:0] opt = (arg2 + 32'd{spw_m1}) >> {hb};
wire [63:0] rd_len_w = arg0 * wpr;
wire [63:0] rt_len_w = arg0 * opt;

// ---- stream ----
reg w_valid;
reg [{dm}:0] w_q;
reg [{pw_m1}:0] pos;
reg [15:0] eidx;
reg wbank;
reg [15:0] left;
reg mfull;
reg [5:0] mcnt;
reg p1v, p2v, p3v, p4v, p5v, p6v;
reg [SW-1:0] p6s;
reg nfull;
{v}
wire last_in_row = {group_last};
wire last_in_word = (pos == {pw}'d{word_end}) || last_in_row;
{rowmax_decl}// ---- all-expert sum: row buffer (two banks), L exps per cycle ----
reg [{dm}:0] rowbuf [0:{rb_last}];
reg s_busy;
reg s_bank;
reg signed [15:0] s_m;
reg [15:0] s_idx;
reg [{pw_m1}:0] s_pos;
reg s0v, s0_last, sdv, sd_last, suv, su_last, slv, sl_last, sev, se_last;
reg [SW-1:0] s_acc;
reg [SW-1:0] sfifo [0:7];
reg [3:0] s_wp, s_rp;
wire [3:0] s_cnt = s_wp - s_rp;
wire s_empty = (s_cnt == 4'd0);
wire [{dm}:0] s_word = rowbuf[{{s_bank, s_idx[RWB+{pw_m1}:{pw}]}}];
reg [15:0] s_left;
wire s_last_group = s_busy && {s_group_last};
wire s_free = !s_busy || s_last_group;
{ssel}
// ---- softmax pipeline: p1 copy, p2 d, p3 d log2 e, p4 LUT, p5 shift, p6 sum; d1..d{dl} divider ----
wire join_ok = rn_q || !s_empty;
// p6 and the divider move together (unless the normalise stage is full); p1..p5 close up
// behind a token that waits at p5 for its all-expert sum
wire a_back = !(d{dl}v && nfull);
wire j5 = p5v && a_back && join_ok;
wire a5 = !p5v || j5;
wire a4 = !p4v || a5;
wire a3 = !p3v || a4;
wire a2 = !p2v || a3;
wire a1 = !p1v || a2;
// the merged list moves on only into an empty p1 (a token takes >= 2 cycles in the
// normalise stage anyway), so the stream's hand-off depends on registers alone
wire m_leave = m_ready && !p1v;
wire m_free = !mfull || m_leave;
wire hand_ok = m_free && (rn_q || s_free);
{fire_decl}wire rd_fire = rd_data_valid && rd_data_ready;
wire n_take = d{dl}v && !nfull;

// ---- normalise: two slots per cycle ----
reg [15:0] nr;
reg [5:0] nsj;
reg [15:0] sa_e, sb_e;
reg [IW-1:0] sa_i, sb_i;
always @(*) begin
    sa_e = ne_0; sa_i = ni_0; sb_e = 16'd0; sb_i = {{IW{{1'b0}}}};
    case (nsj)
{sel}        default: ;
    endcase
end
wire b_ok = (nsj + 6'd1 < k_q);
wire last_pair = (nsj + 6'd2 >= k_q);
wire [31:0] wpa = {{16'd0, sa_e}} * {{16'd0, nr}} + 32'd16384;
wire [31:0] wpb = {{16'd0, sb_e}} * {{16'd0, nr}} + 32'd16384;
wire [31:0] rec_a = {{wpa[30:15], {{(16-IW){{1'b0}}}}, sa_i}};
wire [31:0] rec_b = b_ok ? {{wpb[30:15], {{(16-IW){{1'b0}}}}, sb_i}} : 32'd0;
reg [{dm}:0] ow;
reg ow_valid;
{out_decl}
wire wr_fire = ow_valid && wr_data_ready;
wire ow_free = !ow_valid || wr_fire;

// ---- histogram: one LUTRAM port (async read, sync write), fed by a queue of increments ----
localparam integer QW = {qw};
reg [31:0] hist [0:{e_last}];
reg [16:0] hidx;
reg [{hb_m1}:0] hsel;
{h_decl}
reg [IW-1:0] pq [0:{q_last}];
reg [QW:0] q_wp, q_rp;
wire [QW:0] q_cnt = q_wp - q_rp;
// the slot after q_wp, wrapped to QW bits here: an index written `pq[q_wp + 1]` relies on
// the addition wrapping at the index's width, which Icarus Verilog 11 does not do (its #515)
wire [QW-1:0] q_wp1 = q_wp[QW-1:0] + {{{{(QW-1){{1'b0}}}}, 1'b1}};
wire q_room = ({{1'b0, q_cnt}} + {{{{QW{{1'b0}}}}, 2'd2}} <= {{1'b0, {q_depth}}});
wire n_fire = nfull && ow_free && q_room;
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
always @(posedge clock) begin
    if (running && !rn_q && elem_fire && last_in_word) rowbuf[{{wbank, eidx[RWB+{pw_m1}:{pw}]}}] <= w_q;
end

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
    wr_strb = {{{strb_n}{{1'b1}}}};
    busy = running;
end

always @(posedge clock) begin
    if (reset || (start && !running && args_ok)) begin
        w_valid <= 1'b0; pos <= {pw}'d0; eidx <= 16'd0; wbank <= 1'b0; left <= arg1[15:0];
       {rowmax_rst} s_left <= 16'd0;{hpend_rst}
        mfull <= 1'b0; mcnt <= 6'd0;
        s_busy <= 1'b0; s_bank <= 1'b0; s_m <= 16'sd0; s_idx <= 16'd0; s_pos <= {pw}'d0;
        s0v <= 1'b0; s0_last <= 1'b0; sdv <= 1'b0; sd_last <= 1'b0; suv <= 1'b0; su_last <= 1'b0;
        slv <= 1'b0; sl_last <= 1'b0; sev <= 1'b0; se_last <= 1'b0;
        s_acc <= {{SW{{1'b0}}}}; s_wp <= 4'd0; s_rp <= 4'd0;
        p1v <= 1'b0; p2v <= 1'b0; p3v <= 1'b0; p4v <= 1'b0; p5v <= 1'b0; p6v <= 1'b0; p6s <= {{SW{{1'b0}}}};
        nfull <= 1'b0; nr <= 16'd0; nsj <= 6'd0;
        ow <= {db}'d0; ow_valid <= 1'b0; hidx <= 17'd0; hsel <= {hb}'d0;{h_rst}{out_rst}
        q_wp <= {{(QW+1){{1'b0}}}}; q_rp <= {{(QW+1){{1'b0}}}};
{rst}{pst}    end
    if (reset) begin
        running <= 1'b0; done <= 1'b0;
        t_q <= 32'd0; e_q <= 16'd0; k_q <= 6'd0; rn_q <= 1'b0; w_q <= {db}'d0;
        rd_len_q <= 32'd0; rt_len_q <= 32'd0; h_len_q <= 32'd0;
        rd_pend <= 1'b0; wr_pend <= 1'b0; wph <= W_ROUTES; tout <= 32'd0;
        clr_idx <= 16'd0; clr_done <= 1'b0;
    end else begin
        done <= 1'b0;
        if (start && !running) begin
            if (args_ok) begin
                running <= 1'b1;
                t_q <= arg0; e_q <= arg1[15:0]; k_q <= arg2[5:0]; rn_q <= arg3[0];
{kmask}
                rd_len_q <= rd_len_w[31:0]; rt_len_q <= rt_len_w[31:0]; h_len_q <= (arg1 + 32'd{spw_m1}) >> {hb};
                rd_pend <= (arg0 != 32'd0); wr_pend <= (arg0 != 32'd0);
                wph <= W_ROUTES; tout <= 32'd0; clr_idx <= 16'd0; clr_done <= 1'b0;
            end else begin
                done <= 1'b1;
            end
        end
        if (running) begin
            if (rd_pend && rd_req_ready) rd_pend <= 1'b0;
            if (incr) q_rp <= q_rp + {{{{QW{{1'b0}}}}, 1'b1}};
            if (!clr_done) begin
                clr_idx <= clr_idx + 16'd1;
                if (clr_idx == e_q - 16'd1) clr_done <= 1'b1;
            end
            // ---- merge: one entry per cycle ----
            {pop_open}
{mrg}            {pop_close}
            if (m_leave) mfull <= 1'b0;
            // ---- all-expert sum ----
            if (s_busy) begin
                s_idx <= s_idx + 16'd{nl}; s_pos <= s_pos + {pw}'d{nl_mod}; s_left <= s_left - 16'd{nl};
                if ({s_group_last}) s_busy <= 1'b0;
            end
            s0v <= s_busy; s0_last <= s_last_group;
            sdv <= s0v; sd_last <= s0_last;
            suv <= sdv; su_last <= sd_last;
            slv <= suv; sl_last <= su_last;
            sev <= slv; se_last <= sl_last;
{sstg}            if (sev) begin
                if (se_last) begin
                    sfifo[s_wp[2:0]] <= s_acc + se_sum; s_wp <= s_wp + 4'd1; s_acc <= {{SW{{1'b0}}}};
                end else s_acc <= s_acc + se_sum;
            end
            // ---- stream: unpack, insert, hand a finished row over ----
{rowmax_upd}{stream_upd}            if (rd_fire) begin
                w_q <= rd_data; w_valid <= 1'b1; pos <= {pw}'d0;
            end else if (elem_fire && last_in_word) begin
                w_valid <= 1'b0;
            end
            // ---- softmax pipeline ----
            if (a1) begin
                p1v <= m_leave;
{pipe1}            end
            if (a2) begin
                p2v <= p1v;
{pipe2}            end
            if (a3) begin
                p3v <= p2v;
{pipe3}            end
            if (a4) begin
                p4v <= p3v;
{pipe4}            end
            if (a5) begin
                p5v <= p4v;
{pipe5}            end
            if (a_back) begin
                p6v <= j5; p6s <= p6s_nx;
                if (j5 && !rn_q) s_rp <= s_rp + 4'd1;
{pipe6}{dstg}            end
            // ---- normalise ----
            if (wr_fire) ow_valid <= 1'b0;
            if (n_take) begin
                nfull <= 1'b1; nsj <= 6'd0; nr <= d{dl}q;
{nload}            end else if (n_fire) begin
{out_pair}                pq[q_wp[QW-1:0]] <= sa_i;
                if (b_ok) pq[q_wp1] <= sb_i;
                q_wp <= q_wp + (b_ok ? {{{{(QW-1){{1'b0}}}}, 2'd2}} : {{{{QW{{1'b0}}}}, 1'b1}});
                if (last_pair) begin
                    nfull <= 1'b0; tout <= tout + 32'd1;
                end else nsj <= nsj + 6'd2;
            end
            // ---- write-out sequencing ----
            case (wph)
                W_ROUTES: if (tout == t_q && !ow_valid && !nfull && clr_done && q_cnt == {{(QW+1){{1'b0}}}}) begin
                    wph <= W_HREQ; wr_pend <= 1'b1;
                end else if (wr_pend && wr_req_ready) wr_pend <= 1'b0;
                W_HREQ: if (wr_req_ready) begin
                    wr_pend <= 1'b0; wph <= W_HDATA; hidx <= 17'd0; hsel <= {hb}'d0;
                end
                W_HDATA: if (hsel != {hb}'d{spw_m1}) begin
{h_store}                    hidx <= hidx + 17'd1; hsel <= hsel + {hb}'d1;
                end else if (ow_free) begin
                    ow <= {{{h_cat}}};
                    ow_valid <= 1'b1;
                    hidx <= hidx + 17'd1; hsel <= {hb}'d0;
                    if ({{15'd0, hidx}} + 32'd1 >= {{16'd0, e_q}}) wph <= W_END;
                end
                default: if (!ow_valid || wr_fire) begin
                    done <= 1'b1; running <= 1'b0; wph <= W_ROUTES;
                end
            endcase
        end
    end
end
wire _unused_ok = &{{1'b0, arg4, arg5, arg6, arg7, ptr3, ptr4, ptr5, ptr6, ptr7, arg3[31:1],
                    rd_len_w[63:32], rt_len_w[63:32], wpa[31], wpa[14:0], wpb[31], wpb[14:0],
                    {unused_list}, 1'b0}};
endmodule // router_core
"#,
        e_max = p.e_max,
        e_last = p.e_max - 1,
        rb_last = (2usize << rwb) - 1,
        q_last = (1usize << qw) - 1,
        nl_mod = nl % lpw,
        dm = db - 1,
        sm = db / 8 - 1,
        strb_n = db / 8,
        lpw_m1 = lpw - 1,
        spw_m1 = spw - 1,
        pw_m1 = pw - 1,
        hb_m1 = hb - 1,
        hpend_rst = if mx { " hpend <= 1'b0;" } else { "" },
        pipe1 = pipe[0],
        pipe2 = pipe[1],
        pipe3 = pipe[2],
        pipe4 = pipe[3],
        pipe5 = pipe[4],
        pipe6 = pipe[5],
        kmask = kmask,
        pop_open = if nl > 1 {
            "if (pop) begin\n                mcnt <= mcnt + 6'd1;"
        } else {
            ""
        },
        pop_close = if nl > 1 { "end" } else { "" },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verilog_has_the_contract_ports() {
        let v = RouterCore::with_lanes(16, 4, 2)
            .core_verilog()
            .expect("verilog");
        crate::core::check_core_ports(&v, "router_core").expect("ports");
        assert!(v.contains("assign nv_1_3"));
        let narrow = v.replace("output reg [7:0] wr_strb", "output reg [3:0] wr_strb");
        assert!(crate::core::check_core_ports(&narrow, "router_core").is_err());
    }

    #[test]
    fn default_build_is_eight_lanes_on_a_128_bit_port() {
        let c = RouterCore::default();
        assert_eq!((c.lanes, c.data_bits), (8, 128));
        assert_eq!(c.data_bits(), 128);
        assert!(c.matrix_merge());
        let v = c.core_verilog().expect("verilog");
        crate::core::check_core_ports_w(&v, "router_core", 128).expect("128-bit ports");
        assert!(crate::core::check_core_ports(&v, "router_core").is_err());
        // the matrix merge: one compare register per pair of lanes
        assert!(v.contains("reg c_6_7;") && !v.contains("reg c_7_8;"));
        for (lanes, bits) in [(1, 64), (4, 64), (8, 128), (16, 256)] {
            assert_eq!(RouterCore::data_bits_for(lanes), bits);
        }
        let p = RouterCore::with_lanes(256, 8, 16);
        let v = p.core_verilog().expect("verilog");
        crate::core::check_core_ports_w(&v, "router_core", 256).expect("256-bit ports");
    }

    #[test]
    fn bad_params_are_rejected() {
        assert!(RouterCore::with_lanes(12, 4, 1).validate().is_err());
        assert!(RouterCore::with_lanes(16, 0, 1).validate().is_err());
        assert!(RouterCore::with_lanes(4, 8, 1).validate().is_err());
        for lanes in [0, 3, 6, 16, 32] {
            let c = RouterCore {
                lanes,
                ..RouterCore::default()
            };
            assert!(c.validate().is_err(), "lanes = {lanes}");
        }
        // more lanes than the logits of a word; a width the router does not build
        for (lanes, data_bits) in [(8, 64), (16, 128), (4, 512), (4, 32)] {
            let c = RouterCore {
                lanes,
                data_bits,
                ..RouterCore::default()
            };
            assert!(
                c.validate().is_err(),
                "lanes = {lanes}, data_bits = {data_bits}"
            );
        }
        for (lanes, data_bits) in [(8, 128), (4, 128), (16, 256), (1, 256)] {
            let c = RouterCore {
                lanes,
                data_bits,
                ..RouterCore::default()
            };
            assert!(
                c.validate().is_ok(),
                "lanes = {lanes}, data_bits = {data_bits}"
            );
        }
    }
}
