//! Golden model of the fused GEMM + bias + activation kernel, and the int8 quantisation helpers.
//!
//! Semantics (shared bit for bit by the rust-hdl core, the HLS C++ and this model):
//!
//! * `x` is int8 `[M, K]` row-major, `w` is int8 `[N, K]` row-major (PyTorch's `[out, in]`).
//! * `acc[m][n] = bias[n] + sum_k x[m][k] * w[n][k]` in int32 with wrapping (two's complement)
//!   adds. It never wraps while `K <= 131_072` and `|bias| < 2^30`.
//! * ReLU (optional): `acc = max(acc, 0)`.
//! * Requantisation per output column `n` with [`Requant`] `{ mult: u16, shift: u8 }`:
//!   `p = acc * mult` (49-bit signed product), `r = (p + 2^(shift-1)) >> shift` (arithmetic shift:
//!   round half up, towards +inf) for `shift >= 1`, `r = p` for `shift == 0`; then saturation to
//!   `[-128, 127]`. `shift <= 47`.
//!
//! Quantisation helpers map f32 data to int8 with per-tensor or per-row scales (symmetric,
//! `q = clamp(round_half_away(x / s), -127, 127)`, `s = max|x| / 127`).

use thiserror::Error;

/// Largest shift a [`Requant`] may use.
pub const MAX_SHIFT: u8 = 47;

/// Errors of the golden GEMM and the quantisation helpers.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum GemmError {
    /// A buffer does not have the length the dimensions imply.
    #[error("gemm: {what} has {got} elements, expected {expected}")]
    Length {
        /// Which argument.
        what: &'static str,
        /// Its length.
        got: usize,
        /// The length M, N, K imply.
        expected: usize,
    },
    /// A requantisation shift is out of range.
    #[error("gemm: requant shift {shift} of column {col} exceeds {MAX_SHIFT}")]
    Shift {
        /// Output column.
        col: usize,
        /// The shift given.
        shift: u8,
    },
    /// A real multiplier cannot be represented (not finite, negative, or too large).
    #[error("gemm: real multiplier {0} cannot be represented as mult * 2^-shift")]
    Multiplier(f64),
    /// A dimension is zero.
    #[error("gemm: zero-sized dimension M={m} N={n} K={k}")]
    Empty {
        /// Rows of x.
        m: usize,
        /// Rows of w.
        n: usize,
        /// Inner dimension.
        k: usize,
    },
}

/// Per-column requantisation: `y = sat8(round_half_up(acc * mult / 2^shift))`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Requant {
    /// Unsigned 16-bit multiplier.
    pub mult: u16,
    /// Right shift, `0..=47`.
    pub shift: u8,
}

impl Requant {
    /// The multiplier/shift pair closest to `real` (`mult` normalised into `[2^15, 2^16)` where
    /// the shift allows), so that `mult / 2^shift ~= real` within a relative `2^-16`.
    pub fn from_real(real: f64) -> Result<Self, GemmError> {
        if !real.is_finite() || !(0.0..65535.5).contains(&real) {
            return Err(GemmError::Multiplier(real));
        }
        if real == 0.0 {
            return Ok(Self { mult: 0, shift: 0 });
        }
        let mut shift = 0u8;
        while shift < MAX_SHIFT && real * 2f64.powi(i32::from(shift) + 1) < 65535.5 {
            shift += 1;
        }
        let mult = (real * 2f64.powi(i32::from(shift))).round();
        Ok(Self {
            mult: mult as u16,
            shift,
        })
    }

    /// The real value `mult / 2^shift`.
    pub fn to_real(self) -> f64 {
        f64::from(self.mult) / 2f64.powi(i32::from(self.shift))
    }
}

/// Arithmetic right shift with round half up (towards +inf); `shift == 0` returns `v`.
pub fn shift_round_half_up(v: i64, shift: u32) -> i64 {
    if shift == 0 {
        v
    } else if shift >= 63 {
        0
    } else {
        (v + (1i64 << (shift - 1))) >> shift
    }
}

/// Bias add, optional ReLU and requantisation of one int32 accumulator (wrapping bias add).
pub fn postprocess(acc: i32, bias: i32, relu: bool, rq: Requant) -> i8 {
    let mut v = acc.wrapping_add(bias);
    if relu && v < 0 {
        v = 0;
    }
    let p = i64::from(v) * i64::from(rq.mult);
    let r = shift_round_half_up(p, u32::from(rq.shift));
    r.clamp(-128, 127) as i8
}

/// Problem description of one GEMM launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GemmDims {
    /// Rows of x and y.
    pub m: usize,
    /// Rows of w, columns of y.
    pub n: usize,
    /// Inner dimension.
    pub k: usize,
}

/// A random GEMM problem: int8 x and w, bias in `-5000..5000`, random requant multipliers with
/// shifts in `shifts` (drawn in that order). For the bit-exact tests and `tandem fpga sim`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GemmProblem {
    /// Sizes.
    pub d: GemmDims,
    /// int8 `[M, K]`.
    pub x: Vec<i8>,
    /// int8 `[N, K]`.
    pub w: Vec<i8>,
    /// int32 `[N]`.
    pub bias: Vec<i32>,
    /// Per output column.
    pub rq: Vec<Requant>,
}

impl GemmProblem {
    /// Draws a problem of size `d` from `rng`.
    pub fn random(
        rng: &mut impl rand::Rng,
        d: GemmDims,
        shifts: std::ops::RangeInclusive<u8>,
    ) -> Self {
        let GemmDims { m, n, k } = d;
        let x = (0..m * k).map(|_| rng.r#gen()).collect();
        let w = (0..n * k).map(|_| rng.r#gen()).collect();
        let bias = (0..n).map(|_| rng.gen_range(-5000..5000)).collect();
        let rq = (0..n)
            .map(|_| Requant {
                mult: rng.r#gen(),
                shift: rng.gen_range(shifts.clone()),
            })
            .collect();
        Self { d, x, w, bias, rq }
    }

    /// The golden model's y.
    pub fn golden(&self, relu: bool) -> Result<Vec<i8>, GemmError> {
        gemm(&self.x, &self.w, &self.bias, &self.rq, relu, self.d)
    }
}

fn check_len(what: &'static str, got: usize, expected: usize) -> Result<(), GemmError> {
    if got == expected {
        Ok(())
    } else {
        Err(GemmError::Length {
            what,
            got,
            expected,
        })
    }
}

/// int32 accumulators `x W^T` (wrapping), `[M, N]` row-major, without bias.
pub fn accumulate(x: &[i8], w: &[i8], d: GemmDims) -> Result<Vec<i32>, GemmError> {
    let GemmDims { m, n, k } = d;
    if m == 0 || n == 0 || k == 0 {
        return Err(GemmError::Empty { m, n, k });
    }
    check_len("x", x.len(), m * k)?;
    check_len("w", w.len(), n * k)?;
    let mut out = vec![0i32; m * n];
    for (i, row) in x.chunks_exact(k).enumerate() {
        for (j, wrow) in w.chunks_exact(k).enumerate() {
            out[i * n + j] = row.iter().zip(wrow).fold(0i32, |a, (&p, &q)| {
                a.wrapping_add(i32::from(p) * i32::from(q))
            });
        }
    }
    Ok(out)
}

/// Two int8 products sharing the operand `a` from one multiplication, as the GEMM core's
/// PEs compute them on one DSP48E2 (27 x 18): `p = a * (b_hi * 2^18 + b_lo)` (the packed
/// operand needs 27 bits signed: `-128 * 2^18 - 128` is below the 26-bit range; `p` 35), `lo = p[15:0]` as a signed 16-bit value, `hi = p[33:18] + p[17]`, 16-bit
/// wrapping: the floor shift `p >> 18` is `a * b_hi - 1` exactly when `a * b_lo` is
/// negative, which bit 17 of `p` shows (|a * b_lo| <= 2^14 < 2^17). Returns
/// `(a * b_hi, a * b_lo)` bit for bit; `tests::packed_products_are_exact` checks all
/// 2^24 operand triples.
pub fn mul2_packed(a: i8, b_hi: i8, b_lo: i8) -> (i16, i16) {
    // the packed operand: 27 bits signed (the pre-adder's output)
    let packed = (i64::from(b_hi) << 18) + i64::from(b_lo);
    debug_assert!((-(1i64 << 26)..(1i64 << 26)).contains(&packed));
    let p = i64::from(a) * packed; // 34 bits signed
    let lo = (p & 0xFFFF) as u16 as i16;
    let hi = ((p >> 18) as u16).wrapping_add(((p >> 17) & 1) as u16) as i16;
    (hi, lo)
}

/// The full kernel: `y[m][n] = sat8(requant_n(act(x[m] . w[n] + bias[n])))`, int8 `[M, N]`.
pub fn gemm(
    x: &[i8],
    w: &[i8],
    bias: &[i32],
    rq: &[Requant],
    relu: bool,
    d: GemmDims,
) -> Result<Vec<i8>, GemmError> {
    check_len("bias", bias.len(), d.n)?;
    check_len("requant", rq.len(), d.n)?;
    if let Some((col, r)) = rq.iter().enumerate().find(|(_, r)| r.shift > MAX_SHIFT) {
        return Err(GemmError::Shift {
            col,
            shift: r.shift,
        });
    }
    let acc = accumulate(x, w, d)?;
    Ok(acc
        .iter()
        .enumerate()
        .map(|(i, &a)| {
            let c = i % d.n;
            postprocess(a, bias[c], relu, rq[c])
        })
        .collect())
}

/// The K range of each pass when K is split into passes of at most `k_max` (a positive multiple
/// of 8): every pass but the last is exactly `k_max` long. One pass when `k <= k_max`.
pub fn k_passes(k: usize, k_max: usize) -> Vec<std::ops::Range<usize>> {
    let step = k_max.max(8) / 8 * 8;
    (0..k.max(1))
        .step_by(step)
        .map(|k0| k0..(k0 + step).min(k))
        .collect()
}

/// One pass of a K-split GEMM: int32 `[M, N]` partial sums `part_in + x w^T` (wrapping), where
/// x and w hold this pass's K columns only. This is what the kernel writes to `part` with
/// `mode` bit 1 (PART_OUT); bias, ReLU and requantisation are left to the last pass.
pub fn gemm_pass(
    x: &[i8],
    w: &[i8],
    d: GemmDims,
    part_in: Option<&[i32]>,
) -> Result<Vec<i32>, GemmError> {
    let mut acc = accumulate(x, w, d)?;
    if let Some(p) = part_in {
        check_len("part", p.len(), d.m * d.n)?;
        for (a, &b) in acc.iter_mut().zip(p) {
            *a = a.wrapping_add(b);
        }
    }
    Ok(acc)
}

/// The last pass of a K-split GEMM: `y = sat8(requant(act(part_in + x w^T + bias)))` (the
/// kernel with `mode` bit 0, ACC_IN). Since int32 adds wrap, a GEMM split into passes over K
/// gives exactly [`gemm`]'s y.
#[allow(clippy::too_many_arguments)]
pub fn gemm_last_pass(
    x: &[i8],
    w: &[i8],
    bias: &[i32],
    rq: &[Requant],
    relu: bool,
    d: GemmDims,
    part_in: Option<&[i32]>,
) -> Result<Vec<i8>, GemmError> {
    check_len("bias", bias.len(), d.n)?;
    check_len("requant", rq.len(), d.n)?;
    if let Some((col, r)) = rq.iter().enumerate().find(|(_, r)| r.shift > MAX_SHIFT) {
        return Err(GemmError::Shift {
            col,
            shift: r.shift,
        });
    }
    let acc = gemm_pass(x, w, d, part_in)?;
    Ok(acc
        .iter()
        .enumerate()
        .map(|(i, &a)| {
            let c = i % d.n;
            postprocess(a, bias[c], relu, rq[c])
        })
        .collect())
}

/// Columns `r` of a row-major `[rows, k]` int8 matrix, as a `[rows, r.len()]` matrix.
pub fn k_slice(a: &[i8], k: usize, r: std::ops::Range<usize>) -> Vec<i8> {
    a.chunks_exact(k.max(1))
        .flat_map(|row| row[r.clone()].iter().copied())
        .collect()
}

/// Rounds half away from zero and saturates to `[-127, 127]` (symmetric int8).
pub fn quantize_value(v: f32, scale: f32) -> i8 {
    if scale <= 0.0 || !scale.is_finite() {
        return 0;
    }
    (v / scale).round().clamp(-127.0, 127.0) as i8
}

/// Symmetric scale of a slice: `max|x| / 127` (1.0 for an all-zero slice).
pub fn scale_of(x: &[f32]) -> f32 {
    scale_from_max(x.iter().fold(0f32, |a, v| a.max(v.abs())))
}

/// The symmetric scale for a slice whose largest magnitude is `m` (NaNs skipped):
/// `m / 127`, or 1.0 when `m` is zero or not finite ([`scale_of`]'s rule, for callers that
/// take the maximum themselves, e.g. in parallel).
pub fn scale_from_max(m: f32) -> f32 {
    if m > 0.0 && m.is_finite() {
        m / 127.0
    } else {
        1.0
    }
}

/// Quantises a tensor with one scale: returns `(q, scale)`.
pub fn quantize_per_tensor(x: &[f32]) -> (Vec<i8>, f32) {
    let s = scale_of(x);
    (x.iter().map(|&v| quantize_value(v, s)).collect(), s)
}

/// Quantises a `[rows, cols]` row-major matrix with one scale per row: returns `(q, scales)`.
pub fn quantize_per_row(x: &[f32], cols: usize) -> (Vec<i8>, Vec<f32>) {
    if cols == 0 {
        return (Vec::new(), Vec::new());
    }
    let mut q = vec![0i8; x.len()];
    let mut scales = vec![0f32; x.len().div_ceil(cols)];
    // rows are independent: blocks of rows over threads for large matrices
    let threads = if x.len() < 1 << 20 {
        1
    } else {
        std::thread::available_parallelism().map_or(1, |t| t.get())
    };
    let per = scales.len().div_ceil(threads).max(1);
    let rows = |xs: &[f32], qs: &mut [i8], ss: &mut [f32]| {
        for ((row, qr), s) in xs.chunks(cols).zip(qs.chunks_mut(cols)).zip(ss) {
            *s = scale_of(row);
            for (d, &v) in qr.iter_mut().zip(row) {
                *d = quantize_value(v, *s);
            }
        }
    };
    std::thread::scope(|sc| {
        let blocks = x
            .chunks(per * cols)
            .zip(q.chunks_mut(per * cols))
            .zip(scales.chunks_mut(per));
        for ((xs, qs), ss) in blocks {
            sc.spawn(move || rows(xs, qs, ss));
        }
    });
    (q, scales)
}

/// `q * scale` for every element.
pub fn dequantize_per_tensor(q: &[i8], scale: f32) -> Vec<f32> {
    q.iter().map(|&v| f32::from(v) * scale).collect()
}

/// `q[r][c] * scales[r]` for a `[rows, cols]` row-major matrix.
pub fn dequantize_per_row(q: &[i8], scales: &[f32], cols: usize) -> Vec<f32> {
    q.iter()
        .enumerate()
        .map(|(i, &v)| f32::from(v) * scales.get(i / cols.max(1)).copied().unwrap_or(0.0))
        .collect()
}

/// A linear layer `y = act(x W^T + b)` mapped onto the int8 kernel.
///
/// x is quantised per tensor (`sx`), W per output channel (`sw[n]`), the bias to int32 at the
/// accumulator scale `sx * sw[n]`, and y per tensor at `sy`; the per-column requantisation is
/// `sx * sw[n] / sy`. The host dequantises `y_q * sy`.
#[derive(Debug, Clone, PartialEq)]
pub struct QuantLinear {
    /// Quantised weights `[N, K]`.
    pub w: Vec<i8>,
    /// Per-output-channel weight scales.
    pub w_scales: Vec<f32>,
    /// Quantised bias `[N]` (zeros without bias).
    pub bias: Vec<i32>,
    /// Per-column requantisation.
    pub requant: Vec<Requant>,
    /// Input scale.
    pub x_scale: f32,
    /// Output scale.
    pub y_scale: f32,
}

impl QuantLinear {
    /// Quantises the weights and bias for inputs of scale `x_scale` and outputs of scale
    /// `y_scale` (pick it from calibration, e.g. [`QuantLinear::calibrate_y_scale`]).
    pub fn new(
        w: &[f32],
        bias: Option<&[f32]>,
        n: usize,
        k: usize,
        x_scale: f32,
        y_scale: f32,
    ) -> Result<Self, GemmError> {
        check_len("w", w.len(), n * k)?;
        if let Some(b) = bias {
            check_len("bias", b.len(), n)?;
        }
        let (wq, w_scales) = quantize_per_row(w, k);
        let mut bq = Vec::with_capacity(n);
        let mut requant = Vec::with_capacity(n);
        for (j, &sw) in w_scales.iter().enumerate() {
            let acc_scale = f64::from(x_scale) * f64::from(sw);
            let b = bias.map_or(0.0, |b| f64::from(b[j]));
            bq.push(
                (b / acc_scale)
                    .round()
                    .clamp(-(2f64.powi(30)), 2f64.powi(30)) as i32,
            );
            requant.push(Requant::from_real(acc_scale / f64::from(y_scale))?);
        }
        Ok(Self {
            w: wq,
            w_scales,
            bias: bq,
            requant,
            x_scale,
            y_scale,
        })
    }

    /// An output scale from the exact f64 outputs of a few sample rows of x: `max|y| / 127`
    /// with a 25% margin.
    pub fn calibrate_y_scale(
        x_rows: &[f32],
        w: &[f32],
        bias: Option<&[f32]>,
        n: usize,
        k: usize,
        relu: bool,
    ) -> f32 {
        let mut m = 0f64;
        for row in x_rows.chunks_exact(k.max(1)) {
            for (j, wr) in w.chunks_exact(k.max(1)).take(n).enumerate() {
                let mut y: f64 = row
                    .iter()
                    .zip(wr)
                    .map(|(&a, &b)| f64::from(a) * f64::from(b))
                    .sum();
                y += bias.and_then(|b| b.get(j)).map_or(0.0, |&b| f64::from(b));
                if relu {
                    y = y.max(0.0);
                }
                m = m.max(y.abs());
            }
        }
        if m > 0.0 {
            (1.25 * m / 127.0) as f32
        } else {
            1.0
        }
    }

    /// Runs the golden kernel on f32 inputs `[M, K]` (quantised at `x_scale`), returning f32 `[M, N]`.
    pub fn forward(&self, x: &[f32], m: usize, relu: bool) -> Result<Vec<f32>, GemmError> {
        let n = self.bias.len();
        let k = self.w.len().checked_div(n).unwrap_or(0);
        let xq: Vec<i8> = x.iter().map(|&v| quantize_value(v, self.x_scale)).collect();
        let y = gemm(
            &xq,
            &self.w,
            &self.bias,
            &self.requant,
            relu,
            GemmDims { m, n, k },
        )?;
        Ok(dequantize_per_tensor(&y, self.y_scale))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn packed_products_are_exact() {
        // every int8 x int8 x int8 triple: 2^24 cases
        for a in i8::MIN..=i8::MAX {
            for hi in i8::MIN..=i8::MAX {
                for lo in i8::MIN..=i8::MAX {
                    let want = (i16::from(a) * i16::from(hi), i16::from(a) * i16::from(lo));
                    let got = super::mul2_packed(a, hi, lo);
                    if got != want {
                        panic!("a {a} hi {hi} lo {lo}: got {got:?}, want {want:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn k_split_passes_give_the_same_y() {
        use rand::SeedableRng;
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(77);
        for &(m, n, k, k_max) in &[
            (3, 5, 40, 16),
            (2, 9, 17, 8),
            (4, 3, 24, 24),
            (1, 1, 100, 32),
        ] {
            let d = GemmDims { m, n, k };
            // wide bias and large sums so that wrapping and saturation both show
            let p = GemmProblem::random(&mut rng, d, 0..=20);
            for relu in [false, true] {
                let want = p.golden(relu).expect("golden");
                let passes = k_passes(k, k_max);
                assert!(passes.iter().all(|r| r.len() <= k_max && !r.is_empty()));
                assert_eq!(passes.last().map(|r| r.end), Some(k));
                let mut part: Option<Vec<i32>> = None;
                let mut got = Vec::new();
                for (i, r) in passes.iter().enumerate() {
                    let dd = GemmDims { m, n, k: r.len() };
                    let (xs, ws) = (k_slice(&p.x, k, r.clone()), k_slice(&p.w, k, r.clone()));
                    if i + 1 == passes.len() {
                        got = gemm_last_pass(&xs, &ws, &p.bias, &p.rq, relu, dd, part.as_deref())
                            .expect("last");
                    } else {
                        part = Some(gemm_pass(&xs, &ws, dd, part.as_deref()).expect("pass"));
                    }
                }
                assert_eq!(got, want, "{d:?} k_max {k_max} relu {relu}");
            }
        }
        assert_eq!(k_passes(5000, 4096), vec![0..4096, 4096..5000]);
    }

    use super::*;

    /// SplitMix64: a tiny deterministic generator so the golden tests need no dependencies.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }
        fn unit(&mut self) -> f32 {
            (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        }
    }

    #[test]
    fn requant_rounds_half_up_and_saturates() {
        let rq = Requant { mult: 1, shift: 1 };
        assert_eq!(postprocess(3, 0, false, rq), 2); // 1.5 -> 2
        assert_eq!(postprocess(-3, 0, false, rq), -1); // -1.5 -> -1
        assert_eq!(postprocess(-5, 0, false, rq), -2); // -2.5 -> -2
        assert_eq!(postprocess(1000, 0, false, rq), 127);
        assert_eq!(postprocess(-1000, 0, false, rq), -128);
        assert_eq!(postprocess(-1000, 0, true, rq), 0);
        assert_eq!(
            postprocess(i32::MAX, 1, false, Requant { mult: 1, shift: 0 }),
            -128
        );
        let big = Requant {
            mult: 65535,
            shift: 47,
        };
        assert_eq!(postprocess(i32::MIN, 0, false, big), -1);
        assert_eq!(postprocess(i32::MAX, 0, false, big), 1);
    }

    #[test]
    fn from_real_is_close() {
        for &r in &[1e-9, 3.3e-5, 0.0123, 0.5, 1.0, 7.77, 1000.0] {
            let q = Requant::from_real(r).expect("representable");
            let rel = ((q.to_real() - r) / r).abs();
            assert!(rel < 2f64.powi(-15), "{r}: {q:?} rel {rel}");
        }
        assert!(Requant::from_real(-1.0).is_err());
        assert!(Requant::from_real(f64::NAN).is_err());
    }

    #[test]
    fn rejects_bad_lengths() {
        let d = GemmDims { m: 2, n: 2, k: 2 };
        assert!(
            gemm(
                &[0; 3],
                &[0; 4],
                &[0; 2],
                &[Requant::default(); 2],
                false,
                d
            )
            .is_err()
        );
        let rq = [Requant { mult: 1, shift: 48 }; 2];
        assert!(matches!(
            gemm(&[0; 4], &[0; 4], &[0; 2], &rq, false, d),
            Err(GemmError::Shift { .. })
        ));
    }

    /// Golden f32 -> int8 -> f32 linear against the f64 reference of `act(x W^T + b)`, per
    /// element within the bound derived in docs/FPGA.md.
    #[test]
    fn quant_linear_within_bound_of_f64() {
        let mut rng = Rng(7);
        for &(m, n, k, relu) in &[(5, 7, 33, false), (16, 9, 256, true), (3, 40, 1000, false)] {
            let x: Vec<f32> = (0..m * k).map(|_| rng.unit()).collect();
            let w: Vec<f32> = (0..n * k).map(|_| rng.unit() * 0.2).collect();
            let b: Vec<f32> = (0..n).map(|_| rng.unit()).collect();
            let (_, sx) = quantize_per_tensor(&x);
            let sy = QuantLinear::calibrate_y_scale(&x, &w, Some(&b), n, k, relu);
            let ql = QuantLinear::new(&w, Some(&b), n, k, sx, sy).expect("quantise");
            let y = ql.forward(&x, m, relu).expect("forward");
            let mut err2 = 0f64;
            let mut ref2 = 0f64;
            for i in 0..m {
                for j in 0..n {
                    let (xr, wr) = (&x[i * k..(i + 1) * k], &w[j * k..(j + 1) * k]);
                    let sw = f64::from(ql.w_scales[j]);
                    let sxd = f64::from(sx);
                    let mut r = f64::from(b[j]);
                    let mut bound = 0.5 * f64::from(sy) + 0.5 * sxd * sw;
                    for (&a, &c) in xr.iter().zip(wr) {
                        r += f64::from(a) * f64::from(c);
                        bound += 0.5 * (f64::from(a.abs()) * sw + f64::from(c.abs()) * sxd)
                            + 0.25 * sxd * sw;
                    }
                    if relu {
                        r = r.max(0.0);
                    }
                    bound += r.abs() * 2f64.powi(-14) + 1e-6;
                    let got = f64::from(y[i * n + j]);
                    assert!(
                        (got - r).abs() <= bound,
                        "({i},{j}) got {got} ref {r} bound {bound}"
                    );
                    err2 += (got - r).powi(2);
                    ref2 += r * r;
                }
            }
            let rel = (err2 / ref2).sqrt();
            assert!(rel < 0.03, "m={m} n={n} k={k}: relative error {rel}");
        }
    }
}
