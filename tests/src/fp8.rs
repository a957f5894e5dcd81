//! A host model of the CUDA backend's FP8 MoE experts (`TANDEM_MOE_FP8`, host
//! `backend::cuda::ops::moe_fp8`): the same row-wise e4m3 quantization, byte for byte, and the
//! experts computed in f64 on the quantized operands, so a GPU result can be held to the
//! storage precision's tolerance against what FP8 is meant to compute.

use float8::F8E4M3;
use ndarray::{ArrayD, IxDyn};

/// The largest finite e4m3 value: a row's largest magnitude is scaled to it.
pub const E4M3_MAX: f32 = 448.0;

/// `row` quantized as the device does: `scale = amax / 448`, `q = e4m3_rn_satfinite(v *
/// (448 / amax))` in f32 (0 where amax is 0); returns the e4m3 codes and the scale.
pub fn quantize_row(row: &[f32]) -> (Vec<F8E4M3>, f32) {
    let amax = row.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let inv = if amax > 0.0 { E4M3_MAX / amax } else { 0.0 };
    let q = row.iter().map(|&v| F8E4M3::from_f32(v * inv)).collect();
    (q, amax / E4M3_MAX)
}

/// `row` quantized and dequantized (each code times the row's scale, in f64).
pub fn fake_quant_row(row: &[f32]) -> Vec<f64> {
    let (q, s) = quantize_row(row);
    q.iter().map(|c| c.to_f32() as f64 * s as f64).collect()
}

/// Every row (last axis) of `a` fake-quantized.
fn fake_quant_rows(a: &[f32], cols: usize) -> Vec<f64> {
    a.chunks(cols.max(1)).flat_map(fake_quant_row).collect()
}

/// The inputs of the experts op the model reads.
pub struct ExpertsInputs<'a> {
    /// x [T, H], as the device stores it (already rounded to the storage precision).
    pub x: &'a [f32],
    /// topk_ids [T, k].
    pub ids: &'a [i32],
    /// topk_weights [T, k] as the device stores them.
    pub weights: &'a [f32],
    /// The slots (t * k + j) present in sorted_token_ids: the others add nothing.
    pub present: &'a [bool],
    /// gate_up [E, 2F, H] (gate rows first), rounded to the storage precision.
    pub gate_up: &'a [f32],
    /// down [E, H, F], rounded to the storage precision.
    pub down: &'a [f32],
    /// T, H, E, k, F.
    pub dims: (usize, usize, usize, usize, usize),
}

/// y [T, H] of the FP8 experts in f64: x rows, weight rows (output channels) and h rows
/// fake-quantized as the device quantizes them, h = silu(gate) * up rounded by `store` (the
/// storage precision the device writes h in) before its quantization, the combine in slot
/// order.
pub fn experts(i: &ExpertsInputs<'_>, store: impl Fn(f64) -> f32) -> ArrayD<f64> {
    let (t, h, e, k, f) = i.dims;
    let xq = fake_quant_rows(i.x, h);
    let wu = fake_quant_rows(i.gate_up, h);
    let wd = fake_quant_rows(i.down, f);
    let mut y = vec![0.0f64; t * h];
    for tok in 0..t {
        let xr = &xq[tok * h..(tok + 1) * h];
        for j in 0..k {
            let slot = tok * k + j;
            let ex = i.ids[slot];
            if !i.present[slot] || ex < 0 || ex as usize >= e {
                continue;
            }
            let ex = ex as usize;
            let dot = |w: &[f64]| w.iter().zip(xr).map(|(a, b)| a * b).sum::<f64>();
            let act: Vec<f32> = (0..f)
                .map(|n| {
                    let g = dot(&wu[((ex * 2 * f) + n) * h..][..h]);
                    let u = dot(&wu[((ex * 2 * f) + f + n) * h..][..h]);
                    store(g / (1.0 + (-g).exp()) * u)
                })
                .collect();
            let hq = fake_quant_row(&act);
            let wt = i.weights[slot] as f64;
            for n in 0..h {
                let d: f64 = wd[(ex * h + n) * f..][..f]
                    .iter()
                    .zip(&hq)
                    .map(|(a, b)| a * b)
                    .sum();
                y[tok * h + n] += wt * d;
            }
        }
    }
    ArrayD::from_shape_vec(IxDyn(&[t, h]), y).unwrap_or_else(|_| ArrayD::zeros(IxDyn(&[0])))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// Every finite e4m3 value, with its code, ascending.
    fn table() -> Vec<(f32, u8)> {
        let mut v: Vec<(f32, u8)> = (0..=255u8)
            .map(|b| (F8E4M3::from_bits(b).to_f32(), b))
            .filter(|(x, _)| x.is_finite())
            .collect();
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
        v
    }

    /// Round to nearest, ties to the even code, saturating to +-448: by search of the table.
    fn nearest_even(x: f32, t: &[(f32, u8)]) -> f32 {
        let x = x.clamp(-E4M3_MAX, E4M3_MAX);
        let mut best = t[0];
        for &c in t {
            let (d, db) = ((c.0 - x).abs(), (best.0 - x).abs());
            if d < db || (d == db && c.1 & 1 == 0 && best.1 & 1 == 1) {
                best = c;
            }
        }
        best.0
    }

    #[test]
    fn e4m3_rounds_to_nearest_even_and_saturates() {
        let t = table();
        assert_eq!(t.len(), 254, "256 codes less the two NaNs (0x7f, 0xff)");
        assert_eq!(t.last().map(|c| c.0), Some(E4M3_MAX));
        let mut r = rand_chacha::ChaCha8Rng::seed_from_u64(8);
        let mut xs: Vec<f32> = (0..20_000)
            .map(|_| r.gen_range(-1.0f32..1.0) * 10f32.powi(r.gen_range(-4..3)))
            .collect();
        // every midpoint between neighbours (the ties), and values past the largest finite
        xs.extend(t.windows(2).map(|w| (w[0].0 + w[1].0) / 2.0));
        xs.extend([448.0, 460.0, 463.9, 464.0, 500.0, 1e6, -1e6, 0.0, -0.0]);
        for x in xs {
            let got = F8E4M3::from_f32(x).to_f32();
            let want = nearest_even(x, &t);
            assert!(
                got == want || (got == 0.0 && want == 0.0),
                "e4m3({x}) = {got}, nearest-even {want}"
            );
        }
    }

    #[test]
    fn rows_scale_to_448_and_zero_rows_stay_zero() {
        let (q, s) = quantize_row(&[1.0, -3.5, 0.25, 7.0]);
        assert_eq!(q[3].to_f32(), E4M3_MAX);
        assert_eq!(s, 7.0 / E4M3_MAX);
        let back = fake_quant_row(&[1.0, -3.5, 0.25, 7.0]);
        for (b, w) in back.iter().zip([1.0, -3.5, 0.25, 7.0]) {
            assert!((b - w).abs() <= w.abs() / 16.0 + 1e-12, "{b} vs {w}");
        }
        assert_eq!(fake_quant_row(&[0.0; 5]), vec![0.0; 5]);
    }
}
