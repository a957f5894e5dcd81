//! Golden model of the streaming vector kernel `vecops`: elementwise add, RMSNorm (with the
//! fused residual add), RoPE (rotate-half) and SiLU(gate) x up, on rows of int16 elements.
//!
//! Data: every operand is a matrix of `rows` rows of `n` int16 elements, stored as rows of
//! `words(n) = ceil(n / 4)` little-endian 64-bit words (4 elements each; the host pads a row
//! with zeros to `npad = 4 words(n)` elements). The model works on those padded rows, as the
//! RTL does. Shared steps (bit for bit the RTL and the HLS C++):
//!
//! - `sat16(v) = clamp(v, -32768, 32767)`;
//! - `rs(p, s) = (p + 2^(s-1)) >> s` (arithmetic: **round half up**), `rs(p, 0) = p`, in i64.
//!
//! Ops (`op` register):
//!
//! | op | name | inputs | outputs |
//! | --- | --- | --- | --- |
//! | 0 | add | a, b | `y = sat16(a + b)` |
//! | 1 | rmsnorm | a, p = w (one row) | `y` (below, `t = a`) |
//! | 2 | rmsnorm + residual | a, b, p = w | `s = t = sat16(a + b)`, `y` |
//! | 3 | rope | a, p = cos/sin rows | `y` (below) |
//! | 4 | silu_mul | a (gate), b (up) | `y` (below) |
//! | 5 | silu_mul8 | a (gate), b (up), int8 rows | `y` int8 rows (below) |
//! | 6 | combine | p = (row, weight) table, b = int8 rows | `y` (below) |
//!
//! **RMSNorm**: `ss = sum t^2` (u64) over the padded row; `m = (ss * inv_n) >> 32` (`inv_n` =
//! `c1`, the host's `round(2^32 / n)`); `v = max(1, min(m + eps_q, 2^32 - 1))` (`eps_q` = `c0`,
//! the host's `eps / s^2` for the operands' scale `s`); with `p` the position of v's leading
//! one, `q = p & !1`, `k = q / 2`, the 9 bits of v from bit `q + 1` down
//! (`idx = (v << 7 >> q) & 511`, in 128..512) pick `R = RSQ[idx]` with
//! `RSQ[i] = round(2^15 / sqrt((i + 0.5) / 128))`, so `R 2^-(15 + k) ~ 1 / sqrt(v)` (relative
//! error at most 2^-9 + 2^-15); `y = sat16(rs(t * w * R, shift + k))`.
//!
//! **RoPE** (rotate-half): a row is two halves of `h = npad / 2` elements (`h` a multiple of 4,
//! the driver pads each half); row `i` uses row `i mod period` of `p` (`period` = `c0`), whose
//! first `h` elements are `cos` and next `h` are `sin`, Q1.14 (16384 = 1.0):
//! `y[j] = sat16(rs(x[j] c[j] - x[j+h] s[j], 14))`, `y[j+h] = sat16(rs(x[j+h] c[j] + x[j] s[j], 14))`.
//!
//! **SiLU(a) x b**: `z = rs(a * c0, c1)` (the gate in units of 1/64), `sig = 32768` for
//! `z >= 512`, `0` for `z < -512`, else `SIG[z + 512]` with
//! `SIG[i] = round(32768 sigmoid((i - 512) / 64))`; `y = sat16(rs(a * sig * b, shift))`.
//!
//! **int8 rows** (ops 5 and 6): a row of `n` int8 elements is `words8(n) = ceil(n / 8)` words
//! (8 elements each; padded to `8 words8(n)`), the layout the GEMM kernel reads `x` and writes
//! `y` in, so these ops work on the GEMM's buffers in card memory.
//!
//! **SiLU(a) x b on int8** (op 5): as op 4 with `sig` from `z = rs(a * c0, c1 & 63)`, then
//! `y = sat8(rs(a * sig * b * m, shift))` with `m = c1 >> 16` (the output multiplier;
//! `c1 & 0xffff` at most 47).
//!
//! **Weighted gather-combine** (op 6): `p` is a table of `rows * c0` 64-bit entries, entry
//! `r c0 + j` = `row | weight << 32` (`row`: bits 0..32, an int8 row of `b`; `weight`: bits
//! 32..48, signed). Output row `r` (int16, `4 words(n)` elements as every int16 op):
//! `acc[i] = sum over j of weight_j * b[row_j][i]` (exact; at most 2^37), `y[i] =
//! sat16(rs(acc[i], shift))`. `rows * c0` is at most the table bank (`n_max / 4` entries).

use thiserror::Error;

/// Elements per 64-bit word.
pub const LANES: usize = 4;
/// Op code: `y = sat16(a + b)`.
pub const OP_ADD: u32 = 0;
/// Op code: RMSNorm of `a` with weight `p`.
pub const OP_RMSNORM: u32 = 1;
/// Op code: RMSNorm of `a + b` (the sum also written to `s`).
pub const OP_RMSNORM_RES: u32 = 2;
/// Op code: RoPE of `a` with the cos/sin rows `p`.
pub const OP_ROPE: u32 = 3;
/// Op code: `silu(a) * b`.
pub const OP_SILU_MUL: u32 = 4;
/// Op code: `silu(a) * b` on int8 rows, int8 out.
pub const OP_SILU_MUL8: u32 = 5;
/// Op code: weighted gather of int8 rows of `b` by the table `p`, int16 out.
pub const OP_COMBINE: u32 = 6;
/// Largest valid op code.
pub const OP_MAX: u32 = 6;
/// int8 elements per 64-bit word.
pub const LANES8: usize = 8;
/// Entries of the rsqrt table (9-bit index; entries below 128 are never used).
pub const RSQ_SIZE: usize = 512;
/// Fractional bits of the sigmoid's input.
pub const SIG_FRAC: u32 = 6;
/// Half the range of the sigmoid table (inputs in `[-8, 8)`, `8 * 64`).
pub const SIG_HALF: i64 = 512;
/// Fractional bits of the RoPE tables (Q1.14).
pub const ROPE_FRAC: u32 = 14;
/// Largest `shift` register value.
pub const MAX_SHIFT: u32 = 47;

/// The rsqrt table: `RSQ[i] = round(2^15 / sqrt((i + 0.5) / 128))` for `i >= 128`, else 0.
pub fn rsqrt_lut() -> [u16; RSQ_SIZE] {
    let mut t = [0u16; RSQ_SIZE];
    for (i, e) in t.iter_mut().enumerate().skip(128) {
        *e = (32768.0 / ((i as f64 + 0.5) / 128.0).sqrt()).round() as u16;
    }
    t
}

/// The sigmoid table: `SIG[i] = round(32768 sigmoid((i - 512) / 64))`, 1024 entries.
pub fn sigmoid_lut() -> Vec<u16> {
    (0..2 * SIG_HALF)
        .map(|i| {
            let x = (i - SIG_HALF) as f64 / f64::from(1u32 << SIG_FRAC);
            (32768.0 / (1.0 + (-x).exp())).round() as u16
        })
        .collect()
}

/// Words of a row of `n` elements.
pub fn words(n: usize) -> usize {
    n.div_ceil(LANES)
}

/// Words of a row of `n` int8 elements.
pub fn words8(n: usize) -> usize {
    n.div_ceil(LANES8)
}

/// `clamp(v, -128, 127)`.
pub fn sat8(v: i64) -> i8 {
    v.clamp(i64::from(i8::MIN), i64::from(i8::MAX)) as i8
}

/// A combine table entry: int8 row `row` of `b`, times `weight`.
pub fn table_entry(row: u32, weight: i16) -> u64 {
    u64::from(row) | (u64::from(weight as u16) << 32)
}

/// `clamp(v, -32768, 32767)`.
pub fn sat16(v: i64) -> i16 {
    v.clamp(i64::from(i16::MIN), i64::from(i16::MAX)) as i16
}

/// `(p + 2^(s-1)) >> s`, round half up; `p` when `s = 0`.
pub fn rs(p: i64, s: u32) -> i64 {
    if s == 0 {
        p
    } else if s >= 63 {
        // (only reachable through the i128 path below; kept total)
        if p >= 0 { 0 } else { -1 }
    } else {
        p.wrapping_add(1i64 << (s - 1)) >> s
    }
}

/// The register values of one run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct VecArgs {
    /// Op code (`OP_*`).
    pub op: u32,
    /// Rows.
    pub rows: usize,
    /// Elements per row (the kernel streams `words(n)` words per row).
    pub n: usize,
    /// Output shift (rmsnorm, silu_mul; 0..=47).
    pub shift: u32,
    /// rmsnorm: `eps_q`; rope: the table's period (rows); silu_mul: the gate multiplier.
    pub c0: u32,
    /// rmsnorm: `inv_n`; silu_mul: the gate shift (0..=47).
    pub c1: u32,
}

impl VecArgs {
    /// Whether the kernel takes these arguments (else it finishes at once, touching nothing).
    /// `n_max` is the build's longest row.
    pub fn valid(&self, n_max: usize) -> bool {
        let base = self.op <= OP_MAX && self.rows != 0 && self.n != 0 && self.n <= n_max;
        base && match self.op {
            OP_RMSNORM | OP_RMSNORM_RES => (1..=MAX_SHIFT).contains(&self.shift),
            OP_ROPE => self.n.is_multiple_of(2 * LANES) && self.c0 != 0,
            OP_SILU_MUL => self.shift <= MAX_SHIFT && self.c1 <= MAX_SHIFT,
            OP_SILU_MUL8 => self.shift <= MAX_SHIFT && (self.c1 & 0xffff) <= MAX_SHIFT,
            OP_COMBINE => {
                self.shift <= MAX_SHIFT
                    && self.c0 != 0
                    && (self.rows as u64).saturating_mul(u64::from(self.c0))
                        <= (n_max / LANES) as u64
            }
            _ => true,
        }
    }

    /// Whether the op reads `b` (one row per row of `a`).
    pub fn reads_b(&self) -> bool {
        matches!(
            self.op,
            OP_ADD | OP_RMSNORM_RES | OP_SILU_MUL | OP_SILU_MUL8
        )
    }

    /// Entries of the combine table (op 6), else 0.
    pub fn table_len(&self) -> usize {
        if self.op == OP_COMBINE {
            self.rows * self.c0 as usize
        } else {
            0
        }
    }

    /// Rows of `p` the op reads: the weight row, the period's cos/sin rows, or none.
    pub fn p_rows(&self) -> usize {
        match self.op {
            OP_RMSNORM | OP_RMSNORM_RES => 1,
            OP_ROPE => self.c0 as usize,
            _ => 0,
        }
    }

    /// Whether the op writes `s` (the residual sum).
    pub fn writes_s(&self) -> bool {
        self.op == OP_RMSNORM_RES
    }
}

/// Errors of the golden model.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum VecError {
    /// The kernel refuses these arguments.
    #[error("vecops: arguments {0:?} are refused (n_max {1})")]
    Refused(VecArgs, usize),
    /// A buffer has the wrong length.
    #[error("vecops: {what} has {got} elements, expected {expected}")]
    Length {
        /// Which operand.
        what: &'static str,
        /// Its length.
        got: usize,
        /// What the arguments imply.
        expected: usize,
    },
}

/// Outputs of a run: `y` and (rmsnorm + residual) `s`, padded rows like the inputs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VecOut {
    /// The result rows.
    pub y: Vec<i16>,
    /// The residual sum rows (empty unless op 2).
    pub s: Vec<i16>,
}

/// `1 / sqrt(v)` as `(R, k)`: `R 2^-(15 + k)`.
pub fn rsqrt_parts(v: u64, lut: &[u16; RSQ_SIZE]) -> (u16, u32) {
    let v = v.clamp(1, u64::from(u32::MAX));
    let p = 63 - v.leading_zeros();
    let q = p & !1;
    let idx = ((v << 7) >> q) as usize & (RSQ_SIZE - 1);
    (lut[idx], q / 2)
}

/// The sigmoid weight (Q1.15) of gate value `a`.
pub fn sigmoid_q(a: i16, mult: u32, shift: u32, lut: &[u16]) -> u16 {
    let z = rs(i64::from(a) * i64::from(mult), shift);
    if z >= SIG_HALF {
        32768
    } else if z < -SIG_HALF {
        0
    } else {
        lut[(z + SIG_HALF) as usize]
    }
}

/// One run of the kernel on padded rows (`rows * 4 words(n)` elements each; `p` as
/// [`VecArgs::p_rows`] rows).
pub fn run(
    args: &VecArgs,
    n_max: usize,
    a: &[i16],
    b: &[i16],
    p: &[i16],
) -> Result<VecOut, VecError> {
    if !args.valid(n_max) || args.op >= OP_SILU_MUL8 {
        return Err(VecError::Refused(*args, n_max));
    }
    let np = LANES * words(args.n);
    let len = |what, got: usize, expected| {
        if got == expected {
            Ok(())
        } else {
            Err(VecError::Length {
                what,
                got,
                expected,
            })
        }
    };
    len("a", a.len(), args.rows * np)?;
    if args.reads_b() {
        len("b", b.len(), args.rows * np)?;
    }
    len("p", p.len(), args.p_rows() * np)?;
    let mut y = vec![0i16; args.rows * np];
    let mut s = Vec::new();
    let rsq = rsqrt_lut();
    let sig = sigmoid_lut();
    for r in 0..args.rows {
        let ar = &a[r * np..(r + 1) * np];
        let yr = &mut y[r * np..(r + 1) * np];
        match args.op {
            OP_ADD => {
                let br = &b[r * np..(r + 1) * np];
                for ((o, &x), &z) in yr.iter_mut().zip(ar).zip(br) {
                    *o = sat16(i64::from(x) + i64::from(z));
                }
            }
            OP_RMSNORM | OP_RMSNORM_RES => {
                let t: Vec<i16> = if args.op == OP_RMSNORM_RES {
                    let br = &b[r * np..(r + 1) * np];
                    ar.iter()
                        .zip(br)
                        .map(|(&x, &z)| sat16(i64::from(x) + i64::from(z)))
                        .collect()
                } else {
                    ar.to_vec()
                };
                let ss: u64 = t
                    .iter()
                    .map(|&v| (i64::from(v) * i64::from(v)) as u64)
                    .sum();
                let m = ((u128::from(ss) * u128::from(args.c1)) >> 32) as u64;
                let (rr, k) = rsqrt_parts(m + u64::from(args.c0), &rsq);
                for ((o, &tv), &w) in yr.iter_mut().zip(&t).zip(p) {
                    let prod = i64::from(tv) * i64::from(w) * i64::from(rr);
                    *o = sat16(rs(prod, args.shift + k));
                }
                if args.op == OP_RMSNORM_RES {
                    s.extend_from_slice(&t);
                }
            }
            OP_ROPE => {
                let h = np / 2;
                let pr = (r % args.c0 as usize) * np;
                let (c, sn) = (&p[pr..pr + h], &p[pr + h..pr + np]);
                for j in 0..h {
                    let (x1, x2) = (i64::from(ar[j]), i64::from(ar[j + h]));
                    let (cj, sj) = (i64::from(c[j]), i64::from(sn[j]));
                    yr[j] = sat16(rs(x1 * cj - x2 * sj, ROPE_FRAC));
                    yr[j + h] = sat16(rs(x2 * cj + x1 * sj, ROPE_FRAC));
                }
            }
            _ => {
                let br = &b[r * np..(r + 1) * np];
                for ((o, &g), &u) in yr.iter_mut().zip(ar).zip(br) {
                    let sg = sigmoid_q(g, args.c0, args.c1, &sig);
                    let prod = i64::from(g) * i64::from(sg) * i64::from(u);
                    *o = sat16(rs(prod, args.shift));
                }
            }
        }
    }
    Ok(VecOut { y, s })
}

fn check_len(what: &'static str, got: usize, expected: usize) -> Result<(), VecError> {
    if got == expected {
        Ok(())
    } else {
        Err(VecError::Length {
            what,
            got,
            expected,
        })
    }
}

/// Op 5 (`silu_mul8`) on padded int8 rows (`rows * 8 words8(n)` elements each): `y`, padded
/// int8 rows.
pub fn silu_mul8(args: &VecArgs, n_max: usize, a: &[i8], b: &[i8]) -> Result<Vec<i8>, VecError> {
    if args.op != OP_SILU_MUL8 || !args.valid(n_max) {
        return Err(VecError::Refused(*args, n_max));
    }
    let np = LANES8 * words8(args.n);
    check_len("a", a.len(), args.rows * np)?;
    check_len("b", b.len(), args.rows * np)?;
    let sig = sigmoid_lut();
    let m = i64::from(args.c1 >> 16);
    Ok(a.iter()
        .zip(b)
        .map(|(&g, &u)| {
            let sg = sigmoid_q(i16::from(g), args.c0, args.c1 & 0xffff, &sig);
            let prod = i64::from(g) * i64::from(sg) * i64::from(u) * m;
            sat8(rs(prod, args.shift))
        })
        .collect())
}

/// Op 6 (`combine`): the table `p` (`rows * c0` entries) over the padded int8 rows `b`
/// (`8 words8(n)` elements each, any number of rows); `y`, padded int16 rows
/// (`rows * 4 words(n)`).
pub fn combine(
    args: &VecArgs,
    n_max: usize,
    b: &[i8],
    table: &[u64],
) -> Result<Vec<i16>, VecError> {
    if args.op != OP_COMBINE || !args.valid(n_max) {
        return Err(VecError::Refused(*args, n_max));
    }
    check_len("p", table.len(), args.table_len())?;
    let (np8, np) = (LANES8 * words8(args.n), LANES * words(args.n));
    let b_rows = b.len() / np8;
    let mut y = vec![0i16; args.rows * np];
    let k = args.c0 as usize;
    for (r, yr) in y.chunks_exact_mut(np).enumerate() {
        let mut acc = vec![0i64; np];
        for &e in &table[r * k..(r + 1) * k] {
            let row = (e & 0xffff_ffff) as usize;
            let w = i64::from((e >> 32) as u16 as i16);
            if row >= b_rows {
                return Err(VecError::Length {
                    what: "b (a table row past its end)",
                    got: b.len(),
                    expected: (row + 1) * np8,
                });
            }
            let src = &b[row * np8..row * np8 + np];
            for (a, &v) in acc.iter_mut().zip(src) {
                *a += w * i64::from(v);
            }
        }
        for (o, &a) in yr.iter_mut().zip(&acc) {
            *o = sat16(rs(a, args.shift));
        }
    }
    Ok(y)
}

/// Pads `rows` rows of `n` int8 elements to rows of `8 words8(n)` (zeros).
pub fn pad_rows8(x: &[i8], rows: usize, n: usize) -> Vec<i8> {
    let np = LANES8 * words8(n);
    let mut out = vec![0i8; rows * np];
    for (o, i) in out.chunks_exact_mut(np).zip(x.chunks_exact(n.max(1))) {
        o[..n].copy_from_slice(i);
    }
    out
}

/// Pads `rows` rows of `n` elements to rows of `4 words(n)` (zeros).
pub fn pad_rows(x: &[i16], rows: usize, n: usize) -> Vec<i16> {
    let np = LANES * words(n);
    let mut out = vec![0i16; rows * np];
    for (o, i) in out.chunks_exact_mut(np).zip(x.chunks_exact(n.max(1))) {
        o[..n].copy_from_slice(i);
    }
    out
}

/// Drops the padding of rows of `4 words(n)` elements.
pub fn unpad_rows(x: &[i16], n: usize) -> Vec<i16> {
    let np = LANES * words(n);
    x.chunks_exact(np.max(1))
        .flat_map(|r| r[..n].iter().copied())
        .collect()
}

/// Host-side quantisation helpers of the vector ops.
pub mod quant {
    /// Symmetric int16 quantisation at scale `s`: `clamp(round(x / s), -32767, 32767)`.
    pub fn quantize(x: &[f32], s: f64) -> Vec<i16> {
        x.iter()
            .map(|&v| (f64::from(v) / s).round().clamp(-32767.0, 32767.0) as i16)
            .collect()
    }

    /// The scale that maps `max |x| * headroom` to 32767 (at least `floor`).
    pub fn scale_for(max_abs: f64, headroom: f64, floor: f64) -> f64 {
        (max_abs * headroom / 32767.0)
            .max(floor)
            .max(f64::MIN_POSITIVE)
    }

    /// The largest `|x|` (0 for an empty slice).
    pub fn max_abs(x: &[f32]) -> f64 {
        x.iter().fold(0.0f64, |m, &v| m.max(f64::from(v).abs()))
    }

    /// `(mult, shift)` with `mult` in `[2^15, 2^16)` and `mult 2^-shift ~ r` (0 for r <= 0);
    /// shift at most 47 (smaller ratios give a smaller `mult`).
    pub fn mult_shift(r: f64) -> (u32, u32) {
        if r.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater) {
            return (0, 0);
        }
        let mut shift = 0u32;
        let mut m = r;
        while m < 32768.0 && shift < 47 {
            m *= 2.0;
            shift += 1;
        }
        while m >= 65536.0 && shift > 0 {
            m /= 2.0;
            shift -= 1;
        }
        (m.round().min(65535.0) as u32, shift)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_as_documented() {
        let r = rsqrt_lut();
        assert_eq!(r[127], 0);
        assert_eq!(r[128], 32704);
        assert_eq!(r[511], 16392);
        let s = sigmoid_lut();
        assert_eq!(s.len(), 1024);
        assert_eq!(s[512], 16384);
        assert!(s[0] < 12 && s[1023] > 32756);
    }

    #[test]
    fn rsqrt_is_within_its_bound() {
        let lut = rsqrt_lut();
        for v in (1u64..5000).chain([65_535, 1 << 20, 123_456_789, u64::from(u32::MAX)]) {
            let (r, k) = rsqrt_parts(v, &lut);
            let got = f64::from(r) * (-(15.0 + f64::from(k))).exp2();
            let want = 1.0 / (v as f64).sqrt();
            assert!(
                (got / want - 1.0).abs() <= 1.0 / 512.0 + 1.0 / 32768.0,
                "v {v}: {got} vs {want}"
            );
        }
    }

    #[test]
    fn rmsnorm_matches_float() {
        let n = 37usize;
        let x: Vec<i16> = (0..n).map(|i| ((i * 977) % 2001) as i16 - 1000).collect();
        let w: Vec<i16> = (0..n).map(|i| 16000 + (i as i16) * 100).collect();
        let args = VecArgs {
            op: OP_RMSNORM,
            rows: 1,
            n,
            shift: 18,
            c0: 0,
            c1: ((1u64 << 32) as f64 / n as f64).round() as u32,
        };
        let out = run(&args, 64, &pad_rows(&x, 1, n), &[], &pad_rows(&w, 1, n)).expect("run");
        let ms: f64 = x.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / n as f64;
        for j in 0..n {
            let want = f64::from(x[j]) * f64::from(w[j]) / ms.sqrt() / 8.0;
            assert!((f64::from(out.y[j]) - want).abs() <= 1.0 + want.abs() * 3e-3);
        }
    }

    #[test]
    fn saturation_and_refusals() {
        let a = VecArgs {
            op: OP_ADD,
            rows: 1,
            n: 4,
            ..VecArgs::default()
        };
        let out = run(&a, 8, &[32000, -32000, 1, 2], &[1000, -1000, 3, 4], &[]).expect("add");
        assert_eq!(out.y, vec![32767, -32768, 4, 6]);
        assert!(run(&VecArgs { n: 9, ..a }, 8, &[0; 12], &[0; 12], &[]).is_err());
        let rope = VecArgs {
            op: OP_ROPE,
            rows: 1,
            n: 12,
            c0: 1,
            ..VecArgs::default()
        };
        assert!(!rope.valid(64));
        assert!(VecArgs { n: 16, ..rope }.valid(64));
    }

    #[test]
    fn int8_ops_match_float() {
        // silu_mul8: gate and up at 1/16, output at 1/32 -> mult/2^shift = 1/(256 32768) * 32
        let args = VecArgs {
            op: OP_SILU_MUL8,
            rows: 1,
            n: 9,
            shift: 33,
            c0: 1 << 15,
            c1: (1 << 31) | 13, // z = g * 2^15 >> 13 = 4 g: units of 1/64 for a 1/16 gate
        };
        let g: Vec<i8> = vec![-128, -40, -5, 0, 3, 17, 64, 127, 1];
        let u: Vec<i8> = vec![100, -100, 7, 50, -128, 127, 1, 90, -3];
        let y = silu_mul8(&args, 64, &pad_rows8(&g, 1, 9), &pad_rows8(&u, 1, 9)).expect("run");
        for i in 0..9 {
            let (gf, uf) = (f64::from(g[i]) / 16.0, f64::from(u[i]) / 16.0);
            let want = (gf / (1.0 + (-gf).exp()) * uf * 32.0).clamp(-128.0, 127.0);
            assert!(
                (f64::from(y[i]) - want).abs() <= 1.0 + want.abs() * 0.02,
                "{i}: {} vs {want}",
                y[i]
            );
        }
        // combine: two rows gathered with weights 1.0 and -0.5 (Q14), a zero weight, a repeat
        let b: Vec<i8> = pad_rows8(&[10, -20, 30, 127, -128, 1, 2, 3, 4, 5], 2, 5);
        let t = vec![
            table_entry(1, 16384),
            table_entry(0, -8192),
            table_entry(0, 0),
            table_entry(0, 16384),
        ];
        let args = VecArgs {
            op: OP_COMBINE,
            rows: 2,
            n: 5,
            shift: 14,
            c0: 2,
            c1: 0,
        };
        let y = unpad_rows(&combine(&args, 64, &b, &t).expect("run"), 5);
        assert_eq!(y, vec![-4, 12, -12, -59, 69, 10, -20, 30, 127, -128]);
        let bad = [table_entry(2, 1), 0, 0, 0];
        assert!(combine(&args, 64, &b, &bad).is_err(), "a row past b");
        assert!(
            !VecArgs {
                rows: 17,
                c0: 1,
                ..args
            }
            .valid(64),
            "table past the bank"
        );
    }

    #[test]
    fn silu_mul_matches_float() {
        let sig = sigmoid_lut();
        for g in [-30000i16, -4000, -100, 0, 100, 4000, 30000] {
            // gate scale 1/4096: z = g * 64 / 4096 = g >> 6
            let s = sigmoid_q(g, 1, 6, &sig);
            let x = f64::from(g) / 4096.0;
            let want = 32768.0 / (1.0 + (-x).exp());
            assert!((f64::from(s) - want).abs() < 32768.0 * 0.25 / 64.0, "{g}");
        }
    }
}
