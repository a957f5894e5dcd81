//! The host's share of moving activations to and from the card, on the rayon threads: the
//! per-tensor int8 scale, quantisation and dequantisation of large tensors, bit for bit the
//! golden model's serial functions (`tandem_fpga::golden::gemm::{scale_of, quantize_value}`):
//! a maximum is the same whichever order it is taken in, and every element is converted on
//! its own.

use rayon::prelude::*;
use tandem_fpga::golden::gemm as gq;

/// Elements per rayon task (below it, one thread does it all).
const GRAIN: usize = 1 << 15;

/// `gq::scale_of(x)`, in parallel.
pub(super) fn scale_of(x: &[f32]) -> f32 {
    if x.len() <= GRAIN {
        return gq::scale_of(x);
    }
    let m = x
        .par_chunks(GRAIN)
        .map(|c| c.iter().fold(0f32, |a, v| a.max(v.abs())))
        .reduce(|| 0f32, f32::max);
    gq::scale_from_max(m)
}

/// `x` quantised with `scale` (`gq::quantize_value` per element), in parallel.
pub(super) fn quantize(x: &[f32], scale: f32) -> Vec<i8> {
    let mut q = vec![0i8; x.len()];
    if scale <= 0.0 || !scale.is_finite() {
        // `quantize_value`'s rule for an unusable scale: every value 0.
        return q;
    }
    q.par_chunks_mut(GRAIN)
        .zip(x.par_chunks(GRAIN))
        .for_each(|(q, x)| {
            for (q, &v) in q.iter_mut().zip(x) {
                *q = round_saturate(v / scale);
            }
        });
    q
}

/// `t.round().clamp(-127.0, 127.0) as i8` (round half away from zero, NaN to 0) without
/// `roundf`: the baseline x86-64 target has no rounding instruction, so `f32::round` is a
/// library call per element, most of the quantiser's time. The truncation and the exact
/// difference `a - trunc(a)` (exact for `a <= 128`) decide the rounding instead.
#[inline]
fn round_saturate(t: f32) -> i8 {
    if t.is_nan() {
        return 0;
    }
    let a = t.abs().min(128.0);
    let i = a as i32;
    let r = if a - i as f32 >= 0.5 { i + 1 } else { i }.min(127);
    if t < 0.0 { -r as i8 } else { r as i8 }
}

/// `q * scale` as f32, in parallel.
pub(super) fn dequantize(q: &[i8], scale: f32) -> Vec<f32> {
    let mut y = vec![0f32; q.len()];
    y.par_chunks_mut(GRAIN)
        .zip(q.par_chunks(GRAIN))
        .for_each(|(y, q)| {
            for (y, &v) in y.iter_mut().zip(q) {
                *y = f32::from(v) * scale;
            }
        });
    y
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parallel_quantisation_is_the_golden_models_bit_for_bit() {
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            (rng >> 40) as f32 / (1u64 << 24) as f32 * 8.0 - 4.0
        };
        for n in [0, 1, 7, GRAIN - 1, GRAIN, GRAIN + 1, 5 * GRAIN + 3] {
            let mut x: Vec<f32> = (0..n).map(|_| next()).collect();
            if n > 3 {
                // Edge values: a tie at .5, the saturating extremes, NaN (ignored by the
                // maximum, quantised to 0) and an infinity (not finite: scale 1).
                x[0] = 0.5;
                x[1] = f32::NAN;
                x[n - 1] = -1e30;
            }
            let s = scale_of(&x);
            assert_eq!(s.to_bits(), gq::scale_of(&x).to_bits(), "scale, n {n}");
            let q = quantize(&x, s);
            let golden: Vec<i8> = x.iter().map(|&v| gq::quantize_value(v, s)).collect();
            assert_eq!(q, golden, "quantised, n {n}");
            let y = dequantize(&q, s);
            assert!(
                y.iter()
                    .zip(&q)
                    .all(|(y, &v)| y.to_bits() == (f32::from(v) * s).to_bits()),
                "dequantised, n {n}"
            );
        }
        // Rounding and saturation at every boundary, against the golden rule.
        for t in [
            0.0f32,
            -0.0,
            0.49999997,
            0.5,
            -0.5,
            1.5,
            -2.5,
            126.5,
            126.49999,
            -126.5,
            127.0,
            127.49999,
            127.5,
            -127.5,
            128.0,
            1e30,
            -1e30,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            f32::MIN_POSITIVE / 2.0,
            8388607.5,
        ] {
            assert_eq!(round_saturate(t), gq::quantize_value(t, 1.0), "t = {t}");
        }
        assert!(quantize(&[1.0, 2.0], 0.0).iter().all(|&q| q == 0));
        assert!(quantize(&[1.0, 2.0], f32::NAN).iter().all(|&q| q == 0));
        let inf = vec![1.0, f32::INFINITY, -2.0];
        assert_eq!(scale_of(&inf).to_bits(), gq::scale_of(&inf).to_bits());
        let zeros = vec![0f32; 3 * GRAIN];
        assert_eq!(scale_of(&zeros), 1.0);
    }
}
