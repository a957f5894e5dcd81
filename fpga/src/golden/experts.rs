//! Golden model of the MoE experts as the card runs them: a sequence of GEMM and vecops
//! launches whose intermediates stay in card memory (`crate::drive::experts`).
//!
//! Per expert `e` with `M_e` routed slots (`x_e`: the slots' token rows, int8 `[M_e, H]`):
//! `gate = gemm(x_e, Wg)`, `up = gemm(x_e, Wu)` (int8 `[M_e, F]`, per-channel requantisation,
//! [`crate::golden::gemm::gemm`]), `act = silu_mul8(gate, up)` (int8, op 5 of
//! [`crate::golden::vecops`]), `y_e = gemm(act, Wd)` (int8 `[M_e, H]`), stacked into `Y`
//! (expert after expert, rows of `pad8(H)` bytes). Then `out = combine(Y, table)` (op 6):
//! int16 `[T, 4 words(H)]`, `out[t] = sat16(rs(sum_j w_tj Y[row_tj], shift))`. On the card F is
//! cut into chunks of at most the builds' `n_max` / `k_max` (gate/up column chunks, one silu
//! launch each, the down GEMM's K passes over the same chunks) and T into combine launches of
//! at most `n_max / 4 / k` tokens; neither changes a bit (int32 sums are exact, the other
//! steps are elementwise or per row).

use thiserror::Error;

use super::gemm::{GemmDims, GemmError, Requant, gemm};
use super::vecops::{self, OP_COMBINE, OP_SILU_MUL8, VecArgs, VecError};

/// An int8 linear layer as the GEMM kernel takes it: weights `[N, K]`, int32 bias and
/// per-column requantisation (`N` entries each).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Linear8 {
    /// Weights, `[N, K]` row-major.
    pub w: Vec<i8>,
    /// Bias per output column.
    pub bias: Vec<i32>,
    /// Requantisation per output column.
    pub rq: Vec<Requant>,
}

/// One expert's work: its slots' token rows and its three projections.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Expert8 {
    /// Rows (`M_e`, at least 1: experts without slots are left out).
    pub rows: usize,
    /// The slots' token rows, int8 `[M_e, H]`.
    pub x: Vec<i8>,
    /// Gate projection `[F, H]`.
    pub gate: Linear8,
    /// Up projection `[F, H]`.
    pub up: Linear8,
    /// SiLU x up: the gate multiplier and shift (`c0`, `c1 & 63`), output multiplier
    /// (`c1 >> 16`) and shift, as op 5 takes them.
    pub silu: (u32, u32, u32),
    /// Down projection `[H, F]`.
    pub down: Linear8,
}

/// The experts op, quantised.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Experts8 {
    /// Hidden size.
    pub h: usize,
    /// FFN size.
    pub f: usize,
    /// The experts that got slots, in the order their rows are stacked in `Y`.
    pub experts: Vec<Expert8>,
    /// Tokens (output rows).
    pub tokens: usize,
    /// Table entries per token.
    pub k: usize,
    /// `tokens * k` entries ([`vecops::table_entry`]): a row of `Y` and its weight.
    pub table: Vec<u64>,
    /// The combine's output shift.
    pub shift: u32,
}

/// Errors of the experts model.
#[derive(Debug, Error)]
pub enum ExpertsError {
    /// A GEMM step refused its operands.
    #[error("experts gemm: {0}")]
    Gemm(#[from] GemmError),
    /// A vecops step refused its operands.
    #[error("experts vecops: {0}")]
    Vecops(#[from] VecError),
    /// The problem is inconsistent.
    #[error("experts: {0}")]
    Shape(String),
}

impl Experts8 {
    /// Rows of `Y` (the slots of all experts; at least 1, so that a table of zero weights
    /// always names a row).
    pub fn y_rows(&self) -> usize {
        self.experts.iter().map(|e| e.rows).sum::<usize>().max(1)
    }

    /// Checks the sizes of every buffer.
    pub fn check(&self) -> Result<(), ExpertsError> {
        let (h, f) = (self.h, self.f);
        let bad = |m: String| Err(ExpertsError::Shape(m));
        if h == 0 || f == 0 || self.k == 0 {
            return bad(format!("H {h}, F {f}, k {} must be positive", self.k));
        }
        if self.table.len() != self.tokens * self.k {
            return bad(format!(
                "table of {} entries for {} tokens x {}",
                self.table.len(),
                self.tokens,
                self.k
            ));
        }
        let rows = self.y_rows() as u64;
        if let Some(e) = self.table.iter().find(|&&e| e & 0xffff_ffff >= rows) {
            return bad(format!("table entry {e:#x} names a row past Y's {rows}"));
        }
        for (i, e) in self.experts.iter().enumerate() {
            let lin = |l: &Linear8, n: usize, k: usize| {
                l.w.len() == n * k && l.bias.len() == n && l.rq.len() == n
            };
            if e.rows == 0
                || e.x.len() != e.rows * h
                || !lin(&e.gate, f, h)
                || !lin(&e.up, f, h)
                || !lin(&e.down, h, f)
            {
                return bad(format!(
                    "expert {i}: buffers do not match M {} H {h} F {f}",
                    e.rows
                ));
            }
        }
        Ok(())
    }

    /// The op 5 arguments of expert `e` on `rows` rows of `n` elements.
    pub fn silu_args(e: &Expert8, n: usize) -> VecArgs {
        let (c0, c1, shift) = e.silu;
        VecArgs {
            op: OP_SILU_MUL8,
            rows: e.rows,
            n,
            shift,
            c0,
            c1,
        }
    }

    /// The op 6 arguments for `rows` tokens.
    pub fn combine_args(&self, rows: usize) -> VecArgs {
        VecArgs {
            op: OP_COMBINE,
            rows,
            n: self.h,
            shift: self.shift,
            c0: self.k as u32,
            c1: 0,
        }
    }
}

/// One expert's rows of `Y`: `[M_e, H]` int8.
pub fn expert_rows(p: &Experts8, e: &Expert8) -> Result<Vec<i8>, ExpertsError> {
    let (h, f, m) = (p.h, p.f, e.rows);
    let dims = GemmDims { m, n: f, k: h };
    let g = gemm(&e.x, &e.gate.w, &e.gate.bias, &e.gate.rq, false, dims)?;
    let u = gemm(&e.x, &e.up.w, &e.up.bias, &e.up.rq, false, dims)?;
    let args = Experts8::silu_args(e, f);
    let act = vecops::silu_mul8(
        &args,
        usize::MAX,
        &vecops::pad_rows8(&g, m, f),
        &vecops::pad_rows8(&u, m, f),
    )?;
    let np = vecops::LANES8 * vecops::words8(f);
    let act: Vec<i8> = act
        .chunks_exact(np)
        .flat_map(|r| r[..f].iter().copied())
        .collect();
    Ok(gemm(
        &act,
        &e.down.w,
        &e.down.bias,
        &e.down.rq,
        false,
        GemmDims { m, n: h, k: f },
    )?)
}

/// The experts op: int16 `[T, 4 words(H)]` padded rows (the combine's output).
pub fn experts(p: &Experts8) -> Result<Vec<i16>, ExpertsError> {
    p.check()?;
    let h = p.h;
    let np8 = vecops::LANES8 * vecops::words8(h);
    let mut y = vec![0i8; p.y_rows() * np8];
    let mut row = 0;
    for e in &p.experts {
        let ye = expert_rows(p, e)?;
        let dst = &mut y[row * np8..(row + e.rows) * np8];
        dst.copy_from_slice(&vecops::pad_rows8(&ye, e.rows, h));
        row += e.rows;
    }
    if p.tokens == 0 {
        return Ok(Vec::new());
    }
    Ok(vecops::combine(
        &p.combine_args(p.tokens),
        usize::MAX,
        &y,
        &p.table,
    )?)
}
