//! The fused GEMM + bias + activation core: an int8 output-stationary systolic array of
//! `rows x L` MACs (`L` = [`GemmCore::lanes`], the int8 of one read beat: 8 on a 64-bit port,
//! 64 on a 512-bit one) with per-column bias, ReLU and requantisation. Semantics:
//! [`crate::golden::gemm`].
//!
//! Dataflow (L columns, one beat of W per cycle):
//! - *params*: one 64-bit word per output column (bias, mult, shift; [`pack_params_lanes`]),
//!   `L / 8` per beat, is read once into `L` column banks.
//! - per M tile of `rows` rows: the x rows are read into `rows` on-chip banks (K bytes each);
//!   then, for each N tile of `L` columns, the packed W stream ([`pack_w_lanes`]: for every k
//!   one beat holding `w[n0..n0+L][k]`) flows through the array at one k per cycle. A PE holds
//!   two lanes of one row on one multiplier (`x * (w_hi * 2^18 + w_lo)`, the shared-operand
//!   packing of [`crate::golden::gemm::mul2_packed`]). x enters from the left (row r delayed
//!   r cycles) and moves one PE a cycle, the packed w from the top (PE column q delayed q
//!   cycles); lane c of row r accumulates `x[m0+r][k] * w[n0+c][k]` in int32. A *first* flag
//!   travelling with x makes each PE move its finished sums into shadow registers and
//!   restart, so tiles follow each other without a bubble.
//! - *read-out*, while the next tile streams: row by row, the `L` shadows get bias, ReLU and
//!   requantisation (a 4-stage pipeline: add, multiply, round/shift, saturate; one row per
//!   stage) and are written as one beat of y (a request and a data handshake per row).
//!
//! Arguments: `x` (ptr0, int8 `[M][K]`), `w` (ptr1, packed), `params` (ptr2, packed), `y`
//! (ptr3, int8 `[M][N]`), `m` (arg0), `n` (arg1, a multiple of L), `k` (arg2, a multiple of
//! L), `relu` (arg3), `part` (ptr4), `mode` (arg4), `w_odd` (ptr5: 0, or W striped over
//! two buffers, [`W_STRIPE_BYTES`] stripes alternating between `w` and `w_odd`, so the W
//! stream reads two memory banks at once; [`pack::stripe_w`]). The host pads N and K with zeros
//! ([`pack_w_lanes`], [`pad_x_lanes`]). Out-of-range sizes (m = 0, n or k not a positive
//! multiple of L or beyond `n_max` / `k_max`) finish at once without touching memory.
//!
//! Cycle count ([`crate::timing::gemm_cycles`]): `N/L * K` array cycles per M tile plus
//! `rows * K / L` cycles to read its x rows, `8 N / L` cycles of params, and a drain of about
//! `rows + L/2 + 2 rows` cycles. The read-out (about 3 cycles per row) hides behind the next
//! tile when `K >= ~3 rows + L/2 + 14`.

use std::fmt::Write as _;

use crate::core::{CoreError, KernelCore, clog2, core_header_w};
use crate::regmap::{ArgDesc, KernelDesc};

pub mod pack;

pub use pack::{
    pack_params, pack_params_lanes, pack_w, pack_w_lanes, pad_lanes, pad_x, pad_x_lanes, pad8,
    stripe_w, unstripe_w,
};

/// `mode` bit 0, ACC_IN: the int32 partial sums in `part` (`[M][Np]`, row-major, little
/// endian) are added to the tile's sums before the epilogue (or before PART_OUT).
pub const MODE_ACC_IN: u32 = 1;
/// `mode` bit 1, PART_OUT: the tile's int32 sums (plus the partials read in with ACC_IN) are
/// written to `part` instead of y; no bias, ReLU or requantisation (a pass that is not a
/// K split's last).
pub const MODE_PART_OUT: u32 = 2;

/// Bytes of one W stripe when W is split over two buffers (`w_odd` set): the packed stream's
/// stripes alternate between `w` (even) and `w_odd` (odd), so a W stream in two HBM
/// pseudo-channels reads both at once ([`crate::kernels::gemm::pack::stripe_w`]).
pub const W_STRIPE_BYTES: usize = 4096;

/// Beats of one W stripe on a build of `lanes` lanes (a beat holds `lanes` bytes).
pub fn w_stripe_beats(lanes: usize) -> usize {
    W_STRIPE_BYTES / lanes.max(1)
}

/// Columns of the default (64-bit port) array: the 8 int8 weights of one 64-bit read word.
/// A build's column count is its [`GemmCore::lanes`].
pub const COLS: usize = 8;

/// Lane counts a build may have: the int8 weights of one read beat of a 64-, 128-, 256- or
/// 512-bit port ([`crate::core::DATA_BITS`]).
pub const GEMM_LANES: [u32; 4] = [8, 16, 32, 64];

/// Build parameters of the GEMM core.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GemmCore {
    /// Rows of the systolic array (M tile), 1..=128.
    pub rows: u32,
    /// Largest K (multiple of 8): depth of the x row banks.
    pub k_max: u32,
    /// Largest N (multiple of 8): depth of the parameter banks.
    pub n_max: u32,
    /// Columns of the array (N tile) = int8 weights per read beat: 8 (64-bit port), 16, 32
    /// or 64 (512-bit port). The port is `8 * lanes` bits wide; `n`, `k`, `k_max` and
    /// `n_max` are multiples of `lanes`. MACs per cycle: `rows * lanes`, packed two per
    /// multiplier ([`crate::golden::gemm::mul2_packed`]).
    pub lanes: u32,
    /// W streams through AXI4 masters of its own: `w` through the read-only `m_axi_gmem1`,
    /// `w_odd` through `m_axi_gmem2` (each bound to its own memory bank in the link), x, the
    /// parameters, the partials and y through `m_axi_gmem`. `false`: everything through
    /// `m_axi_gmem`.
    pub w_ports: bool,
}

impl Default for GemmCore {
    fn default() -> Self {
        Self {
            rows: 4,
            k_max: 512,
            n_max: 256,
            lanes: 8,
            w_ports: false,
        }
    }
}

impl GemmCore {
    /// The U55C-sized configuration of a 64-bit port: 64 x 8 PEs (512 MACs/cycle), K and N
    /// up to 4096.
    pub fn u55c() -> Self {
        Self {
            rows: 64,
            k_max: 4096,
            n_max: 4096,
            lanes: 8,
            w_ports: false,
        }
    }

    /// The card-sized configuration of 512-bit ports (Vitis' default `m_axi` width):
    /// 64 rows x 64 lanes = 4,096 int8 MACs per cycle on 2,048 packed multipliers
    /// (2.46 TOPS at 300 MHz), K and N up to 4096, the two W stripes on masters of their own.
    pub fn u55c_wide() -> Self {
        Self {
            rows: 64,
            k_max: 4096,
            n_max: 4096,
            lanes: 64,
            w_ports: true,
        }
    }

    /// Int8 multiply-accumulates per cycle: `rows * lanes`.
    pub fn macs(&self) -> u64 {
        u64::from(self.rows) * u64::from(self.lanes)
    }

    /// `n` (a K or N extent) rounded up to a multiple of the build's lanes: the padding the
    /// core needs ([`pad_lanes`]).
    pub fn pad(&self, n: usize) -> usize {
        pad_lanes(n, self.lanes as usize)
    }

    /// Checks the parameters.
    pub fn validate(&self) -> Result<(), CoreError> {
        let bad = |msg: String| {
            Err(CoreError::Param {
                kernel: "gemm".into(),
                msg,
            })
        };
        if !(1..=128).contains(&self.rows) {
            return bad(format!("rows = {} must be in 1..=128", self.rows));
        }
        if !GEMM_LANES.contains(&self.lanes) {
            return bad(format!(
                "lanes = {} must be one of {GEMM_LANES:?} (a 64..512-bit port)",
                self.lanes
            ));
        }
        let l = self.lanes;
        if self.k_max < l || !self.k_max.is_multiple_of(l) || self.k_max > 65536 {
            return bad(format!(
                "k_max = {} must be a multiple of lanes = {l} in {l}..=65536",
                self.k_max
            ));
        }
        if self.n_max < l || !self.n_max.is_multiple_of(l) || self.n_max > 65536 {
            return bad(format!(
                "n_max = {} must be a multiple of lanes = {l} in {l}..=65536",
                self.n_max
            ));
        }
        Ok(())
    }

    /// The AXI4 master of W stripe buffer `port` (1: `w`, 2: `w_odd`): that master with
    /// [`GemmCore::w_ports`], else `m_axi_gmem` (0).
    pub fn w_port(&self, port: u8) -> u8 {
        if self.w_ports { port } else { 0 }
    }

    /// Array cycles of an ideal run: one k step per cycle per (M tile, N tile).
    pub fn ideal_cycles(&self, m: usize, n_padded: usize, k_padded: usize) -> u64 {
        let tiles_m = m.div_ceil(self.rows as usize) as u64;
        tiles_m * (n_padded / self.lanes as usize) as u64 * k_padded as u64
    }
}

impl KernelCore for GemmCore {
    fn name(&self) -> &str {
        "gemm"
    }

    fn desc(&self) -> KernelDesc {
        KernelDesc {
            name: "gemm".into(),
            args: vec![
                ArgDesc::pointer("x", "char*"),
                ArgDesc::pointer("w", "char*").on_port(self.w_port(1)),
                ArgDesc::pointer("params", "ulong*"),
                ArgDesc::pointer("y", "char*"),
                ArgDesc::scalar("m"),
                ArgDesc::scalar("n"),
                ArgDesc::scalar("k"),
                ArgDesc::scalar("relu"),
                ArgDesc::pointer("part", "int*"),
                ArgDesc::scalar("mode"),
                ArgDesc::pointer("w_odd", "char*").on_port(self.w_port(2)),
            ],
        }
    }

    fn params(&self) -> Vec<(String, i64)> {
        vec![
            ("rows".into(), i64::from(self.rows)),
            ("k_max".into(), i64::from(self.k_max)),
            ("n_max".into(), i64::from(self.n_max)),
            ("lanes".into(), i64::from(self.lanes)),
            ("w_ports".into(), i64::from(self.w_ports)),
        ]
    }

    fn core_verilog(&self) -> Result<String, CoreError> {
        self.validate()?;
        Ok(gemm_verilog(self))
    }

    fn data_bits(&self) -> u32 {
        8 * self.lanes
    }
}

/// Emits the Verilog of `gemm_core` for `p`.
fn gemm_verilog(p: &GemmCore) -> String {
    let rows = p.rows as usize;
    // a W request's address; with W on masters of its own, bits 63:62 name the master (1: the
    // even stripes or the whole stream, 2: the odd stripes), as the shell's fan-out expects
    let w_addr = if p.w_ports {
        format!(
            "{{(w_striped && g_wb[{lgs}]) ? 2'd2 : 2'd1, (w_striped ? g_wsa[61:0] : g_wa[61:0])}}",
            lgs = w_stripe_beats(p.lanes as usize).trailing_zeros()
        )
    } else {
        "w_striped ? g_wsa : g_wa".to_string()
    };
    let cols = p.lanes as usize; // lanes = int8 per beat
    let pairs = cols / 2; // PEs per row, two lanes on one multiplier each
    let lg = p.lanes.trailing_zeros(); // log2 bytes per beat
    let dw = 8 * cols; // data bits per beat
    let kw = p.k_max / p.lanes; // beats per x bank
    let nt = p.n_max / p.lanes; // N tiles
    let akw = clog2(kw);
    let ant = clog2(nt);
    let ppb = cols / 8; // parameter words per beat
    let ipb = cols / 4; // int32 partials per beat
    let ar = clog2(p.rows.max(2));
    let stripe = w_stripe_beats(p.lanes as usize); // beats per W stripe (a power of two)
    let lgs = stripe.trailing_zeros();
    let mut decl = String::new();
    let mut seq = String::new();
    let mut comb = String::new();
    // ---- x banks, stage 0 ----
    for r in 0..rows {
        let _ = writeln!(
            decl,
            "reg [{dh}:0] xb_{r} [0:{last}];\nreg [{dh}:0] s0x_{r};\nwire signed [7:0] xin_{r} = s0x_{r}[{{s0_sel, 3'b000}} +: 8];",
            last = kw - 1,
            dh = dw - 1
        );
        let _ = writeln!(
            seq,
            "always @(posedge clock) begin\n    if (xb_we && c_r == {ar}'d{r}) xb_{r}[c_widx[{hi}:0]] <= rd_data;\n    if (adv) s0x_{r} <= xb_{r}[c_widx[{hk}:{lg}]];\nend",
            hi = akw - 1,
            hk = akw + lg - 1
        );
    }
    // ---- parameter banks ----
    // a beat holds `ppb` parameter words: 8 beats per N tile, lane c in beat c / ppb
    for c in 0..cols {
        let _ = writeln!(
            decl,
            "reg [53:0] pb_{c} [0:{last}];\nreg [53:0] prm_{c};\nwire signed [7:0] win_{c} = s0w[{lo} +: 8];",
            last = nt - 1,
            lo = 8 * c
        );
        let _ = writeln!(
            seq,
            "always @(posedge clock) begin\n    if (pb_we && c_widx[2:0] == 3'd{b}) pb_{c}[c_widx[{hi}:3]] <= rd_data[{lo} +: 54];\n    if (ro_prm) prm_{c} <= pb_{c}[ro_nt[{hn}:0]];\nend",
            b = c / ppb,
            lo = 64 * (c % ppb),
            hi = ant + 2,
            hn = ant - 1
        );
    }
    // ---- int32 partials read in (ACC_IN), double buffered by tile parity ----
    for c in 0..cols {
        let _ = writeln!(
            decl,
            "reg [31:0] pib_{c} [0:{last}];\nwire [31:0] pin_{c} = acc_in_q ? pib_{c}[{{ro_par, ro_r}}] : 32'd0;",
            last = 2 * (1usize << ar) - 1
        );
        let _ = writeln!(
            seq,
            "always @(posedge clock) if (pi_we && c_widx[1:0] == 2'd{w}) pib_{c}[{{c_tpar, c_r}}] <= rd_data[{lo} +: 32];",
            w = c / ipb,
            lo = 32 * (c % ipb)
        );
    }
    // ---- skew lines: row r's x and flag delayed r steps, column c's w delayed c steps ----
    for r in 0..rows {
        if r == 0 {
            let _ = writeln!(
                decl,
                "wire signed [7:0] xl_0 = xin_0;\nwire fl_0 = s0_flag;"
            );
        } else {
            let _ = writeln!(
                decl,
                "reg signed [7:0] xs_{r} [0:{last}];\nreg fs_{r} [0:{last}];\nwire signed [7:0] xl_{r} = xs_{r}[{last}];\nwire fl_{r} = fs_{r}[{last}];",
                last = r - 1
            );
            let mut body = format!("    xs_{r}[0] <= xin_{r}; fs_{r}[0] <= s0_flag;\n");
            for i in 1..r {
                let _ = writeln!(
                    body,
                    "    xs_{r}[{i}] <= xs_{r}[{p}]; fs_{r}[{i}] <= fs_{r}[{p}];",
                    p = i - 1
                );
            }
            let _ = writeln!(seq, "always @(posedge clock) if (adv) begin\n{body}end");
        }
    }
    // the two weights of lane pair q packed into one multiplier operand
    // (`golden::gemm::mul2_packed`: w_hi * 2^18 + w_lo, 27 bits signed), column pair q
    // delayed q steps
    for q in 0..pairs {
        let _ = writeln!(
            decl,
            "wire signed [26:0] wpk_{q} = ($signed(win_{hi}) <<< 18) + $signed(win_{lo});",
            hi = 2 * q + 1,
            lo = 2 * q
        );
        if q == 0 {
            let _ = writeln!(decl, "wire signed [26:0] wt_0 = wpk_0;");
        } else {
            let _ = writeln!(
                decl,
                "reg signed [26:0] ws_{q} [0:{last}];\nwire signed [26:0] wt_{q} = ws_{q}[{last}];",
                last = q - 1
            );
            let mut body = format!("    ws_{q}[0] <= wpk_{q};\n");
            for i in 1..q {
                let _ = writeln!(body, "    ws_{q}[{i}] <= ws_{q}[{p}];", p = i - 1);
            }
            let _ = writeln!(seq, "always @(posedge clock) if (adv) begin\n{body}end");
        }
    }
    // ---- PEs ----
    // PE (r, q): lanes 2q and 2q+1 of row r on one 8 x 27-bit multiplier (one DSP48E2):
    // p = x * (w_hi * 2^18 + w_lo); lo = p[15:0]; hi = p[33:18] + p[17] (the borrow of a
    // negative lo), bit for bit `golden::gemm::mul2_packed`
    for r in 0..rows {
        for q in 0..pairs {
            let xi = if q == 0 {
                format!("xl_{r}")
            } else {
                format!("xr_{r}_{}", q - 1)
            };
            let fi = if q == 0 {
                format!("fl_{r}")
            } else {
                format!("fr_{r}_{}", q - 1)
            };
            let wi = if r == 0 {
                format!("wt_{q}")
            } else {
                format!("wd_{}_{q}", r - 1)
            };
            let (c0, c1) = (2 * q, 2 * q + 1);
            let _ = writeln!(
                decl,
                "reg signed [7:0] xr_{r}_{q}; reg signed [26:0] wd_{r}_{q}; reg fr_{r}_{q};\n\
                 reg [31:0] acc_{r}_{c0}, sh_{r}_{c0}, acc_{r}_{c1}, sh_{r}_{c1};\n\
                 wire signed [34:0] pp_{r}_{q} = {xi} * {wi};\n\
                 wire [15:0] pr_{r}_{c0} = pp_{r}_{q}[15:0];\n\
                 wire [15:0] pr_{r}_{c1} = pp_{r}_{q}[33:18] + {{15'd0, pp_{r}_{q}[17]}};"
            );
            let mut body =
                format!("    xr_{r}_{q} <= {xi}; wd_{r}_{q} <= {wi}; fr_{r}_{q} <= {fi};\n");
            for c in [c0, c1] {
                let _ = writeln!(
                    body,
                    "    if ({fi}) begin sh_{r}_{c} <= acc_{r}_{c}; acc_{r}_{c} <= {{{{16{{pr_{r}_{c}[15]}}}}, pr_{r}_{c}}}; end\n\
                     \x20   else acc_{r}_{c} <= acc_{r}_{c} + {{{{16{{pr_{r}_{c}[15]}}}}, pr_{r}_{c}}};"
                );
            }
            let _ = writeln!(seq, "always @(posedge clock) if (adv) begin\n{body}end");
        }
    }
    let last_flag = if pairs == 1 {
        format!("fl_{}", rows - 1)
    } else {
        format!("fr_{}_{}", rows - 1, pairs - 2)
    };
    // ---- read-out: row mux of the shadows, requantisation lanes ----
    for c in 0..cols {
        let _ = writeln!(decl, "reg [31:0] shr_{c};");
    }
    let _ = writeln!(comb, "always @* begin");
    for c in 0..cols {
        let _ = writeln!(comb, "    shr_{c} = 32'd0;");
    }
    let _ = writeln!(comb, "    case (ro_r)");
    for r in 0..rows {
        let _ = write!(comb, "        {ar}'d{r}: begin");
        for c in 0..cols {
            let _ = write!(comb, " shr_{c} = sh_{r}_{c};");
        }
        let _ = writeln!(comb, " end");
    }
    let _ = writeln!(comb, "        default: ;\n    endcase\nend");
    let mut lanes = String::new();
    let mut ywords = Vec::new();
    // PART_OUT: a row's `cols` int32 sums in 4 beats of `ipb` each
    let pwords: Vec<String> = (0..4)
        .map(|b| {
            let mut v: Vec<String> = (b * ipb..(b + 1) * ipb)
                .map(|c| format!("vw_{c}"))
                .collect();
            v.reverse();
            format!("{{{}}}", v.join(", "))
        })
        .collect();
    let mut pmux = String::new();
    for (w, word) in pwords.iter().enumerate() {
        let _ = writeln!(pmux, "        2'd{w}: wr_data = {word};");
    }
    for c in 0..cols {
        let _ = writeln!(
            decl,
            "reg signed [31:0] v_{c}, vm_{c}, vs_{c}, vr_{c}, vw_{c}; reg signed [48:0] pm_{c}; reg signed [49:0] rr_{c}; reg [7:0] y_{c};\n\
             wire signed [31:0] vb_{c} = shr_{c} + (part_out_q ? 32'd0 : prm_{c}[31:0]) + pin_{c};\n\
             wire [5:0] sf_{c} = prm_{c}[53:48];\n\
             wire [5:0] sf1_{c} = sf_{c} - 6'd1;\n\
             wire signed [49:0] rd_{c} = (sf_{c} == 6'd0) ? $signed({{pm_{c}, 1'b0}}) : ($signed({{pm_{c}[48], pm_{c}}}) >>> sf1_{c});\n\
             wire ps_{c} = !rr_{c}[49] && ((|rr_{c}[48:8]) || (&rr_{c}[7:0]));\n\
             wire ns_{c} = rr_{c}[49] && (!(&rr_{c}[48:9]) || (!rr_{c}[8] && !(&rr_{c}[7:0])));\n\
             wire [8:0] ri_{c} = rr_{c}[8:0] + 9'd1;"
        );
        let _ = writeln!(
            lanes,
            "            if (ro_issue) v_{c} <= (relu_q && !part_out_q && vb_{c}[31]) ? 32'sd0 : vb_{c};\n\
             \x20           if (pipe_adv) begin vm_{c} <= v_{c}; vs_{c} <= vm_{c}; vr_{c} <= vs_{c}; end\n\
             \x20           if (wb_take) vw_{c} <= vr_{c};\n\
             \x20           if (pipe_adv) pm_{c} <= v_{c} * $signed({{1'b0, prm_{c}[47:32]}});\n\
             \x20           if (pipe_adv) rr_{c} <= rd_{c};\n\
             \x20           if (pipe_adv) y_{c} <= ps_{c} ? 8'd127 : (ns_{c} ? 8'h80 : ri_{c}[8:1]);"
        );
        ywords.push(format!("y_{c}"));
    }
    ywords.reverse();
    let yword = ywords.join(", ");
    format!(
        r#"
// GEMM core (tandem-fpga): {rows} x {cols} output-stationary int8 systolic array
// ({rows} x {pairs} PEs of two lanes on one multiplier), {dw}-bit data port,
// k_max = {k_max}, n_max = {n_max}. Semantics: fpga::golden::gemm.
/* verilator lint_off UNUSED */
/* verilator lint_off WIDTH */
{header}
localparam [31:0] ROWS = 32'd{rows};
localparam [31:0] K_MAX = 32'd{k_max};
localparam [31:0] N_MAX = 32'd{n_max};
localparam [31:0] W_STRIPE = 32'd{stripe};
localparam [2:0] P_PRM = 3'd0, P_X = 3'd1, P_W = 3'd2, P_FLUSH = 3'd3, P_END = 3'd4, P_PI = 3'd5, P_IDLE = 3'd7;
localparam [1:0] W_IDLE = 2'd0, W_REQ = 2'd1, W_DAT = 2'd2;

// ---- run control and arguments ----
// Every compare and count the control needs each cycle is against a register prepared ahead
// (`*m1_q` = value - 1, the `*mleft1` row counts, `*_lastm` flags), so no control register
// sits behind an adder and a compare in one cycle (the 300 MHz logic depth, docs/FPGA.md).
reg running;
reg [31:0] m_q, n_q, k_q, nt_q, kw_q, pw_n_q;
reg [31:0] ntm1_q, kwm1_q, km1_q, ntm2_q;
reg nt1_q, kw1_q, k1_q;
reg [63:0] rown_q, rown4_q;
reg relu_q, acc_in_q, part_out_q;
reg [63:0] px_q, pw_q, pp_q, py_q, pq_q, pwh_q;
// W striped over two buffers (w_odd != 0): stripe s of W_STRIPE beats of the packed stream
// lies in w (s even) or w_odd (s odd), at (s / 2) stripes from its start
reg w_striped;
assign busy = running;
// the arguments are checked a cycle ahead: the host writes them before `ap_start`
reg args_ok;
always @(posedge clock) begin
    args_ok <= (arg0 != 32'd0) && (arg1 != 32'd0) && (arg1[{lgh}:0] == {lg}'d0) && (arg1 <= N_MAX)
            && (arg2 != 32'd0) && (arg2[{lgh}:0] == {lg}'d0) && (arg2 <= K_MAX);
    rown_q <= {{32'd0, n_q}} * ROWS;
    rown4_q <= {{30'd0, n_q, 2'd0}} * ROWS;
    ntm2_q <= nt_q - 32'd2; nt1_q <= nt_q == 32'd1; kw1_q <= kw_q == 32'd1; k1_q <= k_q == 32'd1;
end

// ---- read request generator: params; per M tile the x rows, then one W stream per N tile ----
// Two steps per request: `g_st` 0 works the request out of the generator's registers into
// `q_*`, 1 offers it (`rd_req_*` come straight from registers) and, once taken, moves the
// generator on using the flags worked out with it. The shell takes a request at most every
// second cycle (it is busy for at least the cycle that sends the address), so this costs
// nothing.
reg [2:0] g_ph;
reg g_st;
reg [31:0] g_nt, g_mleft1;  // N tile; rows of the launch from this M tile's first, less one
reg g_lastm;                // this M tile is the last (g_mleft1 < ROWS)
reg [{arh}:0] g_r;
reg [63:0] g_xa, g_wa, g_pa, g_prow;
reg [31:0] g_wb, g_wrem;  // W beat of this M tile's stream, beats left in this N tile
reg q_valid, q_lastrow, q_tend, q_lastnt;
reg [63:0] q_addr, q_pnext;
reg [31:0] q_len;
wire [31:0] g_woff = {{{spad}'d0, g_wb[{lgsh}:0]}};
wire [31:0] g_wroom = W_STRIPE - g_woff;
wire g_wfits = g_wrem <= g_wroom;  // the tile's rest ends in this stripe
wire [63:0] g_wsa = (g_wb[{lgs}] ? pwh_q : pw_q) + {{{sapad}'d0, g_wb[31:{lgs1}], {lgsb}'d0}} + {{{opad}'d0, g_woff[{lgsh}:0], {lg}'d0}};
wire g_last_row = g_lastm ? (g_r == g_mleft1[{arh}:0]) : (g_r == {ar}'d{rlast});
always @* begin
    rd_req_valid = q_valid;
    rd_req_addr = q_addr;
    rd_req_len = q_len;
end

// ---- data consumer ----
reg [2:0] c_ph;
// The beat count `c_widx` (an index into the banks) runs beside a down-count `c_left` of the
// beats after this one, and the ends are flags kept a cycle ahead: `c_end` (c_left == 0),
// `c_ntlast` (the last N tile), `c_lrow` (the M tile's last row).
reg [31:0] c_nt, c_widx, c_mleft1, c_left;
reg c_w0;     // c_widx == 0
reg c_end, c_ntlast, c_lrow;
reg c_lastm;  // this M tile is the last (c_mleft1 < ROWS)
reg [{arh}:0] c_r;
reg [63:0] c_yrow, c_prow;
reg c_tpar;
// the index of this M tile's last row, whether it is row 0, whether the next row is the last
wire [{arh}:0] c_rlast = c_lastm ? c_mleft1[{arh}:0] : {ar}'d{rlast};
wire c_rlast0 = c_lastm ? (c_mleft1[{arh}:0] == {ar}'d0) : ({ar}'d{rlast} == {ar}'d0);
wire c_next_last = c_r + 1'b1 == c_rlast;
// the same for the next M tile
wire c_nlastm = c_mleft1 < 2 * ROWS;
wire [31:0] c_nmleft1 = c_mleft1 - ROWS;
wire c_nrlast0 = c_nlastm ? (c_nmleft1[{arh}:0] == {ar}'d0) : ({ar}'d{rlast} == {ar}'d0);
wire xb_we = running && c_ph == P_X && rd_data_valid;
wire pb_we = running && c_ph == P_PRM && rd_data_valid;
// the first k of a tile (and the flush step) carries the flag; it waits until the previous
// capture has reached the last PE and its read-out is over
reg cap_pending, ro_busy;
wire flag_ok = !cap_pending && !ro_busy;
reg fl_sent;
reg [7:0] fl_cnt;
wire w_take = running && c_ph == P_W && rd_data_valid && (!c_w0 || flag_ok);
wire fl_step = running && c_ph == P_FLUSH && (fl_sent || flag_ok) && (fl_cnt != 8'd0 || !fl_sent);
// a tile shorter than the array's depth: zero steps move the pending flag on (x * 0 adds 0)
wire bubble = running && cap_pending && ((c_ph == P_W && c_w0) || c_ph == P_PI || (c_ph == P_FLUSH && !fl_sent));
wire adv = w_take || fl_step || bubble;
wire flag_now = (w_take && c_w0) || (fl_step && !fl_sent);
always @* rd_data_ready = running && (c_ph == P_PRM || c_ph == P_X || (c_ph == P_PI && pi_ok) || (c_ph == P_W && (!c_w0 || flag_ok)));

// the beat index, the down-count of beats and its end flag, flat: one select after the beat
wire c_beat = running && (((c_ph == P_PRM || c_ph == P_X) && rd_data_valid) || (c_ph == P_PI && pi_we) || (c_ph == P_W && w_take));
reg [31:0] c_lload;
reg c_eload;
always @* begin
    case (c_ph)
        P_PRM: begin c_lload = kwm1_q; c_eload = kw1_q; end
        P_X: begin
            c_lload = !c_lrow ? kwm1_q : (acc_in_q ? 32'd3 : km1_q);
            c_eload = !c_lrow ? kw1_q : (!acc_in_q && k1_q);
        end
        P_PI: begin c_lload = c_lrow ? km1_q : 32'd3; c_eload = c_lrow && k1_q; end
        default: begin
            c_lload = c_ntlast ? kwm1_q : (acc_in_q ? 32'd3 : km1_q);
            c_eload = c_ntlast ? kw1_q : (!acc_in_q && k1_q);
        end
    endcase
end
always @(posedge clock) begin
    if (start && !running) begin
        c_left <= (arg1 >> {lgp}) - 32'd1; c_end <= (arg1 >> {lgp}) == 32'd1;
        c_widx <= 32'd0; c_w0 <= 1'b1;
    end else if (c_beat) begin
        // the beat index restarts after a run's last beat, whatever the phase
        if (c_end) begin c_left <= c_lload; c_end <= c_eload; c_widx <= 32'd0; c_w0 <= 1'b1; end
        else begin
            c_left <= c_left - 32'd1; c_end <= c_left == 32'd1; c_widx <= c_widx + 32'd1; c_w0 <= 1'b0;
        end
    end
end

// partials of the next tile may not overwrite a buffer whose read-out is pending or running
wire pi_ok = !(ro_busy && ro_par == c_tpar) && !(cap_pending && cap_has && cap_par == c_tpar);
wire pi_we = running && c_ph == P_PI && rd_data_valid && pi_ok;
// ---- stage 0: the W word and the x bank words of this k ----
reg [{dh}:0] s0w;
reg s0_flag;
reg [{lgh}:0] s0_sel;

// the capture in flight: which tile the flag's wavefront is collecting
reg has_prev, cap_has, prev_par, cap_par;
reg [31:0] prev_nt, cap_nt;
reg [{arh}:0] prev_rlast, cap_rlast;
reg [63:0] prev_ybase, cap_ybase, prev_pbase, cap_pbase;

// ---- read-out ----
// rows flow through add -> multiply -> round/shift -> saturate (one row per stage), then a one-word writer
reg ro_prm, ro_iss, ro_par;
reg [{arh}:0] ro_r;
reg [31:0] ro_nt;
reg [{arh}:0] ro_rlast;
reg [63:0] ro_addr, ro_paddr, a_addr, m_addr, s_addr, r_addr, w_addr;
reg a_v, m_v, s_v, r_v;
reg [1:0] w_st, w_b;
reg [{dh}:0] w_word;
wire w_lastb = !part_out_q || w_b == 2'd3;
wire wb_take = r_v && (w_st == W_IDLE || (w_st == W_DAT && wr_data_ready && w_lastb));
wire pipe_adv = !r_v || wb_take;
wire ro_issue = ro_busy && !ro_prm && ro_iss && pipe_adv;
wire ro_last = ro_r == ro_rlast;

{decl}
{comb}
{seq}

always @(posedge clock) begin
    if (adv) begin
        s0w <= w_take ? rd_data : {dw}'d0;
        s0_flag <= flag_now;
        s0_sel <= c_widx[{lgh}:0];
    end
end

always @(posedge clock) begin
    done <= 1'b0;
    if (reset) begin
        running <= 1'b0;
        g_ph <= P_IDLE; c_ph <= P_IDLE; ro_prm <= 1'b0; ro_iss <= 1'b0; g_st <= 1'b0; q_valid <= 1'b0;
        cap_pending <= 1'b0; ro_busy <= 1'b0; has_prev <= 1'b0; cap_has <= 1'b0;
        a_v <= 1'b0; m_v <= 1'b0; s_v <= 1'b0; r_v <= 1'b0; w_st <= W_IDLE;
    end else begin
        if (start && !running) begin
            if (args_ok) begin
                running <= 1'b1;
                m_q <= arg0; n_q <= arg1; k_q <= arg2; relu_q <= arg3[0];
                acc_in_q <= arg4[0]; part_out_q <= arg4[1];
                nt_q <= arg1 >> {lg}; kw_q <= arg2 >> {lg}; pw_n_q <= arg1 >> {lgp};
                ntm1_q <= (arg1 >> {lg}) - 32'd1; kwm1_q <= (arg2 >> {lg}) - 32'd1;
                km1_q <= arg2 - 32'd1;
                px_q <= ptr0; pw_q <= ptr1; pp_q <= ptr2; py_q <= ptr3; pq_q <= ptr4; pwh_q <= ptr5;
                w_striped <= ptr5 != 64'd0;
                g_wb <= 32'd0; g_wrem <= arg2;
                g_prow <= ptr4; c_prow <= ptr4; c_tpar <= 1'b0;
                g_ph <= P_PRM; c_ph <= P_PRM; g_st <= 1'b0; q_valid <= 1'b0;
                g_mleft1 <= arg0 - 32'd1; g_lastm <= arg0 <= ROWS;
                g_nt <= 32'd0; g_r <= 0; g_xa <= ptr0; g_wa <= ptr1;
                c_mleft1 <= arg0 - 32'd1; c_lastm <= arg0 <= ROWS;
                c_nt <= 32'd0; c_r <= 0; c_yrow <= ptr3;
                cap_pending <= 1'b0; ro_busy <= 1'b0; has_prev <= 1'b0; cap_has <= 1'b0;
                fl_sent <= 1'b0; fl_cnt <= 8'd0; ro_prm <= 1'b0; ro_iss <= 1'b0;
                a_v <= 1'b0; m_v <= 1'b0; s_v <= 1'b0; r_v <= 1'b0; w_st <= W_IDLE;
            end else begin
                done <= 1'b1;
            end
        end
        // request generator, step 0: the next request and the flags that move on after it
        if (running && !g_st && (g_ph == P_PRM || g_ph == P_X || g_ph == P_W || g_ph == P_PI)) begin
            g_st <= 1'b1; q_valid <= 1'b1;
            q_lastrow <= g_last_row; q_lastnt <= g_nt == ntm1_q;
            q_tend <= !w_striped || g_wfits;
            q_pnext <= g_prow + {{{ppad}'d0, g_nt + 32'd1, {lg2}'d0}};
            case (g_ph)
                P_PRM: begin q_addr <= pp_q; q_len <= pw_n_q; end
                P_X: begin q_addr <= g_xa; q_len <= kw_q; end
                P_PI: begin q_addr <= g_pa; q_len <= 32'd4; end
                // striped: one request per stripe piece, the tile's last one ends it
                default: begin
                    q_addr <= {w_addr};
                    q_len <= !w_striped ? k_q : (g_wfits ? g_wrem : g_wroom);
                end
            endcase
        end
        // step 1: the request taken, the generator moves on
        if (q_valid && rd_req_ready) begin
            q_valid <= 1'b0; g_st <= 1'b0;
            case (g_ph)
                P_PRM: g_ph <= P_X;
                P_X: begin
                    g_xa <= g_xa + {{32'd0, k_q}};
                    if (q_lastrow) begin
                        g_ph <= acc_in_q ? P_PI : P_W; g_nt <= 32'd0; g_wa <= pw_q;
                        g_wb <= 32'd0; g_wrem <= k_q;
                        g_r <= 0; g_pa <= g_prow;
                    end
                    else g_r <= g_r + 1'b1;
                end
                P_PI: begin
                    g_pa <= g_pa + {{30'd0, n_q, 2'd0}};
                    if (q_lastrow) begin g_ph <= P_W; g_r <= 0; end
                    else g_r <= g_r + 1'b1;
                end
                P_W: begin
                    g_wb <= g_wb + q_len;
                    g_wrem <= q_tend ? k_q : g_wrem - q_len;
                    if (q_tend) begin
                        g_wa <= g_wa + {{{wpad}'d0, k_q, {lg}'d0}};
                        g_r <= 0;
                        if (q_lastnt) begin
                            g_nt <= 32'd0;
                            g_prow <= g_prow + rown4_q;
                            if (g_lastm) g_ph <= P_END;
                            else begin
                                g_ph <= P_X; g_mleft1 <= g_mleft1 - ROWS; g_lastm <= g_mleft1 < 2 * ROWS;
                            end
                        end else begin
                            g_nt <= g_nt + 32'd1;
                            if (acc_in_q) begin g_ph <= P_PI; g_pa <= q_pnext; end
                        end
                    end
                end
                default: ;
            endcase
        end
        // data consumer
        if (running) case (c_ph)
            P_PRM: if (rd_data_valid) begin
                if (c_end) begin
                    c_ph <= P_X; c_r <= 0; c_lrow <= c_rlast0;
                end
            end
            P_X: if (rd_data_valid) begin
                if (c_end) begin
                    if (c_lrow) begin
                        c_ph <= acc_in_q ? P_PI : P_W; c_nt <= 32'd0; c_ntlast <= nt1_q;
                        c_r <= 0; c_lrow <= c_rlast0;
                    end else begin
                        c_r <= c_r + 1'b1; c_lrow <= c_next_last;
                    end
                end
            end
            P_PI: if (pi_we) begin
                if (c_end) begin
                    if (c_lrow) begin
                        c_ph <= P_W; c_r <= 0; c_lrow <= c_rlast0;
                    end else begin
                        c_r <= c_r + 1'b1; c_lrow <= c_next_last;
                    end
                end
            end
            P_W: if (w_take) begin
                if (c_end) begin
                    c_tpar <= !c_tpar;
                    if (c_ntlast) begin
                        c_nt <= 32'd0; c_ntlast <= nt1_q; c_r <= 0;
                        if (c_lastm) begin c_ph <= P_FLUSH; fl_sent <= 1'b0; fl_cnt <= 8'd0; end
                        else begin
                            c_ph <= P_X; c_mleft1 <= c_nmleft1; c_lastm <= c_nlastm; c_lrow <= c_nrlast0;
                           
                            c_yrow <= c_yrow + rown_q; c_prow <= c_prow + rown4_q;
                        end
                    end else begin
                        c_nt <= c_nt + 32'd1; c_ntlast <= c_nt == ntm2_q;
                        if (acc_in_q) c_ph <= P_PI;
                    end
                end
            end
            P_FLUSH: begin
                if (fl_step) begin
                    if (!fl_sent) begin fl_sent <= 1'b1; fl_cnt <= 8'd{flush}; end
                    else fl_cnt <= fl_cnt - 8'd1;
                end
                if (fl_sent && fl_cnt == 8'd0 && !cap_pending && !ro_busy) c_ph <= P_END;
            end
            P_END: if (!ro_busy && w_st == W_IDLE) begin
                running <= 1'b0; done <= 1'b1; c_ph <= P_IDLE; g_ph <= P_IDLE;
            end
            default: ;
        endcase
        // flag bookkeeping: a flag collects the tile fed before it
        if (adv && flag_now) begin
            cap_pending <= 1'b1;
            cap_has <= has_prev; cap_rlast <= prev_rlast; cap_nt <= prev_nt; cap_ybase <= prev_ybase;
            cap_par <= prev_par; cap_pbase <= prev_pbase;
            has_prev <= (c_ph == P_W);
            prev_rlast <= c_rlast; prev_nt <= c_nt; prev_ybase <= c_yrow + {{{wpad}'d0, c_nt, {lg}'d0}};
            prev_par <= c_tpar; prev_pbase <= c_prow + {{{ppad}'d0, c_nt, {lg2}'d0}};
        end
        if (adv && {last_flag}) begin
            cap_pending <= 1'b0;
            if (cap_has) begin
                ro_busy <= 1'b1; ro_prm <= 1'b1; ro_iss <= 1'b1; ro_r <= 0;
                ro_rlast <= cap_rlast; ro_nt <= cap_nt; ro_addr <= cap_ybase;
                ro_paddr <= cap_pbase; ro_par <= cap_par;
            end
        end
        // read-out
        if (ro_prm) ro_prm <= 1'b0;
        if (ro_issue) begin
            ro_r <= ro_r + 1'b1;
            ro_addr <= ro_addr + {{32'd0, n_q}};
            ro_paddr <= ro_paddr + {{30'd0, n_q, 2'd0}};
            if (ro_last) ro_iss <= 1'b0;
        end
        if (pipe_adv) begin
            a_v <= ro_issue; a_addr <= part_out_q ? ro_paddr : ro_addr;
            m_v <= a_v; m_addr <= a_addr;
            s_v <= m_v; s_addr <= m_addr;
            r_v <= s_v; r_addr <= s_addr;
        end
        if (wb_take) begin
            w_st <= W_REQ; w_addr <= r_addr; w_word <= {{{yword}}}; w_b <= 2'd0;
        end else if (w_st == W_REQ && wr_req_ready) w_st <= W_DAT;
        else if (w_st == W_DAT && wr_data_ready) begin
            if (w_lastb) w_st <= W_IDLE; else w_b <= w_b + 2'd1;
        end
        if (ro_busy && !ro_prm && !ro_iss && !a_v && !m_v && !s_v && !r_v && w_st == W_IDLE) ro_busy <= 1'b0;
    end
    if (!reset) begin
{lanes}    end
end

always @* begin
    wr_req_valid = (w_st == W_REQ);
    wr_req_addr = w_addr;
    wr_req_len = part_out_q ? 32'd4 : 32'd1;
    wr_data_valid = (w_st == W_DAT);
    wr_data = w_word;
    if (part_out_q) case (w_b)
{pmux}        default: ;
    endcase
    wr_strb = {{{cols}{{1'b1}}}};
end

endmodule // gemm_core
/* verilator lint_on WIDTH */
/* verilator lint_on UNUSED */
"#,
        header = core_header_w("gemm_core", &["busy"], dw),
        w_addr = w_addr,
        dh = dw - 1,
        lgh = lg - 1,
        lgp = lg - 3,
        lg2 = lg + 2,
        wpad = 32 - lg,
        ppad = 30 - lg,
        k_max = p.k_max,
        n_max = p.n_max,
        stripe = stripe,
        lgs = lgs,
        lgsh = lgs - 1,
        lgs1 = lgs + 1,
        lgsb = lgs + lg,
        spad = 32 - lgs,
        sapad = 33 - lg,
        opad = 64 - lgs - lg,
        arh = ar - 1,
        flush = rows + cols + 2,
        last_flag = last_flag,
        rlast = rows - 1,
        pmux = pmux,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::check_core_ports;

    #[test]
    fn verilog_has_the_contract_ports() {
        for c in [GemmCore::default(), GemmCore::u55c()] {
            let v = c.core_verilog().expect("verilog");
            check_core_ports(&v, "gemm_core").expect("ports");
        }
    }

    #[test]
    fn register_offsets_as_documented() {
        let slots = GemmCore::default().desc().slots().expect("slots");
        let offs: Vec<(String, u32)> = slots
            .iter()
            .map(|s| (s.arg.name.clone(), s.offset))
            .collect();
        let want = [
            ("x", 0x10),
            ("w", 0x18),
            ("params", 0x20),
            ("y", 0x28),
            ("m", 0x30),
            ("n", 0x38),
            ("k", 0x40),
            ("relu", 0x48),
            ("part", 0x50),
            ("mode", 0x58),
            ("w_odd", 0x60),
        ];
        assert_eq!(offs, want.map(|(n, o)| (n.to_string(), o)).to_vec());
    }

    #[test]
    fn bad_parameters_are_refused() {
        for c in [
            GemmCore {
                rows: 0,
                ..GemmCore::default()
            },
            GemmCore {
                k_max: 12,
                ..GemmCore::default()
            },
            GemmCore {
                n_max: 0,
                ..GemmCore::default()
            },
        ] {
            assert!(c.core_verilog().is_err(), "{c:?}");
        }
    }
}
