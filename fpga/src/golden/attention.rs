//! Golden model of the streaming attention kernel (one head): int8 `Q K^T`, fixed-point online
//! softmax in the log2 domain, `P V` accumulation, final normalisation.
//!
//! Widths and steps (shared bit for bit by the rust-hdl core, the HLS C++ and this model):
//!
//! 1. Score `s = sum_d q[i][d] * k[j][d]`: int32 (`|s| <= 2^14 D`).
//! 2. Log2-domain logit with [`FRAC`] = 8 fractional bits:
//!    `t = (s * score_mult + 2^(score_shift-1)) >> score_shift` (round half up, 48-bit signed),
//!    where `score_mult / 2^score_shift ~= 256 * scale * sq * sk * log2(e)`.
//! 3. Causal mask, bottom-right aligned: query `i` sees key `j` iff `j <= i + Nkv - Nq`.
//! 4. Keys are taken in tiles of `kv_tile` (a kernel parameter; the last tile may be short).
//!    Per tile, over its visible keys: `tmax = max t`, `e_t = ceil(tmax / 256)` (an integer
//!    exponent). The running exponent `e` only grows; when `e_t > e` the running sum `l` and the
//!    accumulators are rescaled by an exact power of two, `x -> (x + 2^(s-1)) >> s` with
//!    `s = e_t - e` (`0` once `s >= 40`). A tile with no visible key changes nothing.
//! 5. Weights `p = exp2((t - 256 e) / 256)`: with `u = 256 e - t >= 0`, `n = u >> 8`,
//!    `f = u & 255`, `p = LUT[f] >> n` (`0` when `n >= 16`), `LUT[f] = round(2^15 * 2^(-f/256))`
//!    (256 entries, 16-bit unsigned, `LUT[0] = 32768`). So `p` is unsigned Q1.15, `p <= 2^15`.
//! 6. `l += p` (32-bit unsigned; `Nkv <= 65_536`), `acc[d] += p * v[j][d]` (48-bit signed).
//! 7. Output `o[d] = floor((512 acc[d] + l) / (2 l))` = `round_half_up(256 acc[d] / l)`,
//!    saturated to int16: o is in units of `sv / 256`. A row with no visible key gets `o = 0`,
//!    `l = 0` and `e = i32::MIN`.
//!
//! The log-sum-exp of the row, in natural-log units of the scaled logits, is
//! `ln 2 * (e + log2(l / 2^15))` (see [`AttentionOut::lse`]).

use thiserror::Error;

/// Fractional bits of the log2-domain logits.
pub const FRAC: u32 = 8;
/// Entries of the exp2 LUT (one per fractional step).
pub const LUT_SIZE: usize = 1 << FRAC;
/// Fractional bits of the softmax weights (`p <= 2^P_FRAC`).
pub const P_FRAC: u32 = 15;
/// Largest key/value length the 32-bit running sum allows.
pub const MAX_NKV: usize = 65_536;
/// Rescale shifts at or beyond this give zero (accumulators fit in 40 bits).
pub const SHIFT_ZERO: u32 = 40;
/// Largest head dimension (keeps `|s| < 2^22` and the 48-bit product exact).
pub const MAX_D: usize = 256;

/// `LUT[f] = round(2^15 * 2^(-f/256))`.
pub fn exp2_lut() -> [u16; LUT_SIZE] {
    let mut lut = [0u16; LUT_SIZE];
    for (f, e) in lut.iter_mut().enumerate() {
        *e = (32768.0 * (-(f as f64) / LUT_SIZE as f64).exp2()).round() as u16;
    }
    lut
}

/// Errors of the golden attention.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum AttentionError {
    /// A buffer does not have the length the dimensions imply.
    #[error("attention: {what} has {got} elements, expected {expected}")]
    Length {
        /// Which argument.
        what: &'static str,
        /// Its length.
        got: usize,
        /// The length the dimensions imply.
        expected: usize,
    },
    /// A dimension is out of the kernel's range.
    #[error("attention: {what} = {value} out of range (1..={max})")]
    Range {
        /// Which dimension.
        what: &'static str,
        /// Its value.
        value: usize,
        /// Its largest allowed value.
        max: usize,
    },
    /// The score scale cannot be represented.
    #[error("attention: score multiplier {0} cannot be represented")]
    Multiplier(f64),
}

/// Kernel configuration of one attention launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionConfig {
    /// Query rows.
    pub nq: usize,
    /// Key/value rows.
    pub nkv: usize,
    /// Head dimension.
    pub d: usize,
    /// Keys per online-softmax tile (the kernel's KV tile).
    pub kv_tile: usize,
    /// Apply the bottom-right causal mask.
    pub causal: bool,
    /// Score multiplier (unsigned 16 bit).
    pub score_mult: u16,
    /// Score shift, `0..=47`.
    pub score_shift: u8,
}

impl AttentionConfig {
    /// `score_mult / 2^score_shift` closest to `256 * scale * sq * sk * log2(e)`, normalised.
    pub fn score_multiplier(scale: f64, sq: f64, sk: f64) -> Result<(u16, u8), AttentionError> {
        let real = 256.0 * scale * sq * sk * std::f64::consts::LOG2_E;
        if !real.is_finite() || real <= 0.0 || real >= 65535.5 {
            return Err(AttentionError::Multiplier(real));
        }
        let mut shift = 0u8;
        while shift < 47 && real * 2f64.powi(i32::from(shift) + 1) < 65535.5 {
            shift += 1;
        }
        Ok(((real * 2f64.powi(i32::from(shift))).round() as u16, shift))
    }

    /// Whether query `i` sees key `j`.
    pub fn visible(&self, i: usize, j: usize) -> bool {
        !self.causal || j + self.nq <= i + self.nkv
    }

    fn check(&self) -> Result<(), AttentionError> {
        let range = |what, value, max| {
            if value == 0 || value > max {
                Err(AttentionError::Range { what, value, max })
            } else {
                Ok(())
            }
        };
        range("nkv", self.nkv, MAX_NKV)?;
        range("d", self.d, MAX_D)?;
        range("kv_tile", self.kv_tile, MAX_NKV)?;
        range("score_shift + 1", usize::from(self.score_shift) + 1, 48)
    }
}

/// Output of one attention head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttentionOut {
    /// `[Nq, D]` int16 in units of `sv / 256`.
    pub o: Vec<i16>,
    /// Per row: the final exponent `e` (`i32::MIN` for a row with no visible key).
    pub e: Vec<i32>,
    /// Per row: the running sum `l` (Q1.15 weights summed; 0 for a row with no visible key).
    pub l: Vec<u32>,
}

impl AttentionOut {
    /// Log-sum-exp of row `i` in natural-log units of `scale * q.k` (-inf without visible keys).
    pub fn lse(&self, i: usize) -> f64 {
        if self.l[i] == 0 {
            return f64::NEG_INFINITY;
        }
        std::f64::consts::LN_2
            * (f64::from(self.e[i]) + (f64::from(self.l[i]) / f64::from(1u32 << P_FRAC)).log2())
    }
}

/// `(v + 2^(s-1)) >> s`, zero for `s >= SHIFT_ZERO`.
pub fn rescale(v: i64, s: u32) -> i64 {
    if s == 0 {
        v
    } else if s >= SHIFT_ZERO {
        0
    } else {
        (v + (1i64 << (s - 1))) >> s
    }
}

/// Log2-domain logit of a score.
pub fn logit(s: i32, mult: u16, shift: u8) -> i64 {
    super::gemm::shift_round_half_up(i64::from(s) * i64::from(mult), u32::from(shift))
}

/// `p = exp2((t - 256 e) / 256)` in Q1.15 from `u = 256 e - t >= 0`.
pub fn weight(u: i64, lut: &[u16; LUT_SIZE]) -> u32 {
    let n = u >> FRAC;
    if n >= 16 {
        0
    } else {
        u32::from(lut[(u & (LUT_SIZE as i64 - 1)) as usize]) >> n
    }
}

/// `round_half_up(256 acc / l)` saturated to int16, for `l > 0`.
pub fn normalise(acc: i64, l: u32) -> i16 {
    let num = 512 * acc + i64::from(l);
    let den = 2 * i64::from(l);
    num.div_euclid(den).clamp(-32768, 32767) as i16
}

/// Runs one head: `q [Nq, D]`, `k` and `v [Nkv, D]`, all int8 row-major.
pub fn attention(
    q: &[i8],
    k: &[i8],
    v: &[i8],
    cfg: &AttentionConfig,
) -> Result<AttentionOut, AttentionError> {
    attention_skip(q, k, v, cfg, 0)
}

/// One launch over a part of the keys: as [`attention`], with the causal mask of a sequence
/// that has `kv_skip` more keys after these (row i sees key j iff `j + Nq <= i + Nkv +
/// kv_skip`): the kernel's `kv_skip` register.
pub fn attention_skip(
    q: &[i8],
    k: &[i8],
    v: &[i8],
    cfg: &AttentionConfig,
    kv_skip: usize,
) -> Result<AttentionOut, AttentionError> {
    cfg.check()?;
    let (nq, nkv, d) = (cfg.nq, cfg.nkv, cfg.d);
    for (what, buf, rows) in [("q", q, nq), ("k", k, nkv), ("v", v, nkv)] {
        if buf.len() != rows * d {
            return Err(AttentionError::Length {
                what,
                got: buf.len(),
                expected: rows * d,
            });
        }
    }
    let lut = exp2_lut();
    let mut out = AttentionOut {
        o: vec![0; nq * d],
        e: vec![i32::MIN; nq],
        l: vec![0; nq],
    };
    // Rows are independent: blocks of rows go to threads round robin (a causal row's work
    // grows with its index), each row computed exactly as the kernel does.
    let work = nq * nkv * d;
    let threads = if work < 1 << 22 {
        1
    } else {
        std::thread::available_parallelism().map_or(1, |t| t.get())
    };
    let block = 32usize;
    let mut jobs: Vec<Vec<RowBlock<'_>>> = (0..threads).map(|_| Vec::new()).collect();
    let blocks = out
        .o
        .chunks_mut(block * d)
        .zip(out.e.chunks_mut(block))
        .zip(out.l.chunks_mut(block));
    for (b, ((o, e), l)) in blocks.enumerate() {
        jobs[b % threads].push(RowBlock {
            first: b * block,
            o,
            e,
            l,
        });
    }
    let ctx = RowCtx {
        q,
        k,
        v,
        cfg,
        kv_skip,
        lut: &lut,
    };
    if threads == 1 {
        jobs.into_iter().flatten().for_each(|b| ctx.run(b));
    } else {
        std::thread::scope(|s| {
            for list in jobs {
                let ctx = &ctx;
                s.spawn(move || list.into_iter().for_each(|b| ctx.run(b)));
            }
        });
    }
    Ok(out)
}

/// Output rows `first..` of one head: their slices of `o`, `e` and `l`.
struct RowBlock<'a> {
    first: usize,
    o: &'a mut [i16],
    e: &'a mut [i32],
    l: &'a mut [u32],
}

/// What every row of [`attention_skip`] reads.
struct RowCtx<'a> {
    q: &'a [i8],
    k: &'a [i8],
    v: &'a [i8],
    cfg: &'a AttentionConfig,
    kv_skip: usize,
    lut: &'a [u16; LUT_SIZE],
}

/// Keys whose `p * v` products (each `|p v| <= 2^22`) an int32 partial sums exactly before it
/// is added to the 48-bit accumulator: the same sums, in an order that vectorises.
const SUB_TILE: usize = 256;

impl RowCtx<'_> {
    fn run(&self, b: RowBlock<'_>) {
        let d = self.cfg.d;
        let mut acc = vec![0i64; d];
        let mut part = vec![0i32; d];
        let mut t = vec![0i64; self.cfg.kv_tile];
        for (r, o) in b.o.chunks_exact_mut(d).enumerate() {
            if let Some((e, l)) = self.row(b.first + r, &mut acc, &mut part, &mut t) {
                b.e[r] = e;
                b.l[r] = l;
                for (o, &a) in o.iter_mut().zip(&acc) {
                    *o = normalise(a, l);
                }
            }
        }
    }

    /// Row `i`: its exponent and running sum (`None` without a visible key), `acc` left
    /// holding its accumulators.
    fn row(
        &self,
        i: usize,
        acc: &mut [i64],
        part: &mut [i32],
        t: &mut [i64],
    ) -> Option<(i32, u32)> {
        let (cfg, d) = (self.cfg, self.cfg.d);
        let qi = &self.q[i * d..(i + 1) * d];
        // Keys past `end` are masked (row i sees key j iff j + Nq <= i + Nkv + kv_skip): a
        // tile with no visible key changes nothing, so they are not visited.
        let end = if cfg.causal {
            (i + cfg.nkv + self.kv_skip + 1)
                .saturating_sub(cfg.nq)
                .min(cfg.nkv)
        } else {
            cfg.nkv
        };
        acc.iter_mut().for_each(|a| *a = 0);
        let mut e: Option<i64> = None;
        let mut l: u32 = 0;
        for j0 in (0..end).step_by(cfg.kv_tile) {
            let j1 = (j0 + cfg.kv_tile).min(end);
            let mut tmax = i64::MIN;
            for j in j0..j1 {
                let kj = &self.k[j * d..(j + 1) * d];
                let s = qi
                    .iter()
                    .zip(kj)
                    .fold(0i32, |a, (&x, &y)| a + i32::from(x) * i32::from(y));
                let tj = logit(s, cfg.score_mult, cfg.score_shift);
                t[j - j0] = tj;
                tmax = tmax.max(tj);
            }
            let et = (tmax + 255) >> FRAC;
            match e {
                None => e = Some(et),
                Some(eo) if et > eo => {
                    let s = u32::try_from(et - eo).unwrap_or(u32::MAX);
                    l = rescale(i64::from(l), s) as u32;
                    acc.iter_mut().for_each(|a| *a = rescale(*a, s));
                    e = Some(et);
                }
                Some(_) => {}
            }
            let ecur = e.unwrap_or(et);
            for s0 in (j0..j1).step_by(SUB_TILE) {
                part.iter_mut().for_each(|a| *a = 0);
                for j in s0..(s0 + SUB_TILE).min(j1) {
                    let p = weight((ecur << FRAC) - t[j - j0], self.lut);
                    l += p;
                    let pi = p as i32;
                    for (a, &vv) in part.iter_mut().zip(&self.v[j * d..(j + 1) * d]) {
                        *a += pi * i32::from(vv);
                    }
                }
                for (a, &pv) in acc.iter_mut().zip(part.iter()) {
                    *a += i64::from(pv);
                }
            }
        }
        e.map(|ev| {
            (
                ev.clamp(i64::from(i32::MIN) + 1, i64::from(i32::MAX)) as i32,
                l,
            )
        })
    }
}

/// The key ranges of a sequence of `nkv` keys split into launches of at most `chunk` keys.
pub fn kv_chunks(nkv: usize, chunk: usize) -> Vec<std::ops::Range<usize>> {
    let step = chunk.max(1);
    (0..nkv.max(1))
        .step_by(step)
        .map(|j0| j0..(j0 + step).min(nkv))
        .collect()
}

/// Merges the outputs of launches over consecutive key ranges of one sequence (each with
/// its `kv_skip`, [`attention_skip`]) into one row result, in integers:
/// per row, `E = max e_c` over the parts that saw a key, `w_c = (l_c << 32) >> (E - e_c)`
/// (0 once the shift reaches 64), `o = floor((2 sum o_c w_c + W) / 2W)` with `W = sum w_c`
/// (round half up of the weighted mean, saturated to int16), `e = E`,
/// `l = min((W + 2^31) >> 32, u32::MAX)`; a row no part saw stays empty.
pub fn merge_parts(parts: &[AttentionOut], nq: usize, d: usize) -> AttentionOut {
    let mut out = AttentionOut {
        o: vec![0; nq * d],
        e: vec![i32::MIN; nq],
        l: vec![0; nq],
    };
    for i in 0..nq {
        let seen: Vec<&AttentionOut> = parts.iter().filter(|p| p.l[i] > 0).collect();
        let Some(emax) = seen.iter().map(|p| p.e[i]).max() else {
            continue;
        };
        let w: Vec<u128> = seen
            .iter()
            .map(|p| {
                let s = (i64::from(emax) - i64::from(p.e[i])) as u64;
                if s >= 64 {
                    0
                } else {
                    (u128::from(p.l[i]) << 32) >> s
                }
            })
            .collect();
        let wsum: u128 = w.iter().sum();
        out.e[i] = emax;
        out.l[i] = ((wsum + (1 << 31)) >> 32).min(u128::from(u32::MAX)) as u32;
        for c in 0..d {
            let num: i128 = seen
                .iter()
                .zip(&w)
                .map(|(p, &wc)| i128::from(p.o[i * d + c]) * wc as i128)
                .sum();
            let den = wsum as i128;
            let o = (2 * num + den).div_euclid(2 * den);
            out.o[i * d + c] = o.clamp(-32768, 32767) as i16;
        }
    }
    out
}

/// One head over any number of keys as the driver runs it when `Nkv` exceeds a build's
/// `nkv_max`: launches over key ranges of at most `chunk` ([`kv_chunks`], each with its
/// `kv_skip`), merged by [`merge_parts`]. One range is exactly [`attention`].
pub fn attention_chunked(
    q: &[i8],
    k: &[i8],
    v: &[i8],
    cfg: &AttentionConfig,
    chunk: usize,
) -> Result<AttentionOut, AttentionError> {
    let ranges = kv_chunks(cfg.nkv, chunk);
    if ranges.len() == 1 {
        return attention(q, k, v, cfg);
    }
    let d = cfg.d;
    let mut parts = Vec::with_capacity(ranges.len());
    for r in &ranges {
        let c = AttentionConfig {
            nkv: r.len(),
            ..*cfg
        };
        let (ks, vs) = (&k[r.start * d..r.end * d], &v[r.start * d..r.end * d]);
        parts.push(attention_skip(q, ks, vs, &c, cfg.nkv - r.end)?);
    }
    Ok(merge_parts(&parts, cfg.nq, d))
}

#[cfg(test)]
mod tests {
    use super::super::gemm::{quantize_per_tensor, scale_of};
    use super::*;

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }
        fn normal(&mut self) -> f32 {
            let u1 = ((self.next() >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
            let u2 = (self.next() >> 11) as f64 / (1u64 << 53) as f64;
            ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
        }
    }

    /// f64 attention of one head with the bottom-right causal mask; returns (o, lse).
    #[allow(clippy::too_many_arguments)]
    fn reference(
        q: &[f64],
        k: &[f64],
        v: &[f64],
        nq: usize,
        nkv: usize,
        d: usize,
        scale: f64,
        causal: bool,
    ) -> (Vec<f64>, Vec<f64>) {
        let mut o = vec![0.0; nq * d];
        let mut lse = vec![f64::NEG_INFINITY; nq];
        for i in 0..nq {
            let vis: Vec<usize> = (0..nkv).filter(|&j| !causal || j + nq <= i + nkv).collect();
            if vis.is_empty() {
                continue;
            }
            let s: Vec<f64> = vis
                .iter()
                .map(|&j| (0..d).map(|c| q[i * d + c] * k[j * d + c]).sum::<f64>() * scale)
                .collect();
            let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let w: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
            let sum: f64 = w.iter().sum();
            lse[i] = m + sum.ln();
            for (&j, &wj) in vis.iter().zip(&w) {
                for c in 0..d {
                    o[i * d + c] += wj / sum * v[j * d + c];
                }
            }
        }
        (o, lse)
    }

    #[test]
    fn chunked_keys_match_the_whole_sequence_closely() {
        // K/V split over launches and merged: within a few LSB of one launch over all keys
        // (each part's o is rounded once more), e equal or one apart, lse within 0.01.
        let mut rng = Rng(5);
        for &(nq, nkv, d, chunk, causal) in &[
            (7, 100, 16, 32, false),
            (40, 100, 8, 24, true),
            (130, 60, 24, 16, true),
            (5, 300, 8, 64, true),
        ] {
            let mut g = |n: usize| -> Vec<i8> {
                (0..n)
                    .map(|_| (rng.normal() * 40.0).clamp(-127.0, 127.0) as i8)
                    .collect()
            };
            let (q, k, v) = (g(nq * d), g(nkv * d), g(nkv * d));
            let cfg = AttentionConfig {
                nq,
                nkv,
                d,
                kv_tile: 16,
                causal,
                score_mult: 40000,
                score_shift: 14,
            };
            let whole = attention(&q, &k, &v, &cfg).expect("whole");
            let split = attention_chunked(&q, &k, &v, &cfg, chunk).expect("split");
            let worst = whole
                .o
                .iter()
                .zip(&split.o)
                .map(|(&a, &b)| (i32::from(a) - i32::from(b)).abs())
                .max()
                .unwrap_or(0);
            assert!(worst <= 4, "{cfg:?} chunk {chunk}: o differs by {worst}");
            for (i, (&wl, &sl)) in whole.l.iter().zip(&split.l).enumerate() {
                assert_eq!(wl == 0, sl == 0, "row {i}");
                if wl > 0 {
                    assert!((whole.lse(i) - split.lse(i)).abs() < 0.01, "row {i}");
                }
            }
        }
        assert_eq!(kv_chunks(10, 4), vec![0..4, 4..8, 8..10]);
    }

    #[test]
    fn lut_contents() {
        let lut = exp2_lut();
        assert_eq!(lut[0], 32768);
        assert_eq!(lut[128], 23170);
        assert_eq!(lut[255], 16428);
        assert!(lut.windows(2).all(|w| w[0] > w[1]));
    }

    #[test]
    fn normalise_rounds_half_up() {
        assert_eq!(normalise(1, 512), 1); // 0.5 -> 1
        assert_eq!(normalise(-1, 512), 0); // -0.5 -> 0
        assert_eq!(normalise(-3, 512), -1); // -1.5 -> -1
        assert_eq!(normalise(1 << 40, 1), 32767);
        assert_eq!(normalise(-(1 << 40), 1), -32768);
    }

    #[test]
    fn rejects_bad_config() {
        let cfg = AttentionConfig {
            nq: 1,
            nkv: 1,
            d: 0,
            kv_tile: 4,
            causal: false,
            score_mult: 1,
            score_shift: 0,
        };
        assert!(attention(&[], &[], &[], &cfg).is_err());
        let cfg = AttentionConfig { d: 1, ..cfg };
        assert!(matches!(
            attention(&[0; 2], &[0], &[0], &cfg),
            Err(AttentionError::Length { .. })
        ));
    }

    /// Golden (quantised inputs, fixed-point softmax) against f64 attention of the original f32
    /// inputs: relative Frobenius error of O below 3%, LSE within 0.05 (absolute) per row;
    /// and against f64 attention of the *dequantised* inputs (isolating the fixed-point
    /// softmax): every element within `0.01 max|v| + sv / 256`.
    #[test]
    fn within_bounds_of_f64() {
        let mut rng = Rng(11);
        let cases = [
            (7, 7, 16, 4, true),
            (5, 23, 32, 8, true),
            (23, 5, 8, 4, true),
            (9, 37, 64, 16, false),
            (1, 130, 16, 32, true),
        ];
        for &(nq, nkv, d, tile, causal) in &cases {
            let mk =
                |n: usize, rng: &mut Rng| -> Vec<f32> { (0..n).map(|_| rng.normal()).collect() };
            let (qf, kf, vf) = (
                mk(nq * d, &mut rng),
                mk(nkv * d, &mut rng),
                mk(nkv * d, &mut rng),
            );
            let (qq, sq) = quantize_per_tensor(&qf);
            let (kq, sk) = quantize_per_tensor(&kf);
            let (vq, sv) = quantize_per_tensor(&vf);
            let scale = 1.0 / (d as f64).sqrt();
            let (score_mult, score_shift) =
                AttentionConfig::score_multiplier(scale, f64::from(sq), f64::from(sk))
                    .expect("scale");
            let cfg = AttentionConfig {
                nq,
                nkv,
                d,
                kv_tile: tile,
                causal,
                score_mult,
                score_shift,
            };
            let out = attention(&qq, &kq, &vq, &cfg).expect("attention");
            let got: Vec<f64> = out
                .o
                .iter()
                .map(|&x| f64::from(x) * f64::from(sv) / 256.0)
                .collect();
            let to64 = |x: &[f32]| x.iter().map(|&v| f64::from(v)).collect::<Vec<_>>();
            let (o_ref, lse_ref) = reference(
                &to64(&qf),
                &to64(&kf),
                &to64(&vf),
                nq,
                nkv,
                d,
                scale,
                causal,
            );
            let deq = |x: &[i8], s: f32| {
                x.iter()
                    .map(|&v| f64::from(v) * f64::from(s))
                    .collect::<Vec<_>>()
            };
            let (o_q, _) = reference(
                &deq(&qq, sq),
                &deq(&kq, sk),
                &deq(&vq, sv),
                nq,
                nkv,
                d,
                scale,
                causal,
            );
            let vmax = f64::from(scale_of(&vf)) * 127.0;
            let mut err2 = 0.0;
            let mut ref2 = 0.0;
            for (idx, (&g, (&r, &rq))) in got.iter().zip(o_ref.iter().zip(&o_q)).enumerate() {
                err2 += (g - r).powi(2);
                ref2 += r * r;
                let bound = 0.01 * vmax + f64::from(sv) / 256.0;
                assert!(
                    (g - rq).abs() <= bound,
                    "{cfg:?} elem {idx}: {g} vs {rq} bound {bound}"
                );
            }
            if ref2 > 0.0 {
                let rel = (err2 / ref2).sqrt();
                assert!(rel < 0.03, "{cfg:?}: relative error {rel}");
            }
            for (i, &lr) in lse_ref.iter().enumerate() {
                let lg = out.lse(i);
                if lr.is_infinite() {
                    assert!(lg.is_infinite(), "row {i} should see no key");
                } else {
                    assert!((lg - lr).abs() < 0.05, "{cfg:?} row {i}: lse {lg} vs {lr}");
                }
            }
        }
    }
}
