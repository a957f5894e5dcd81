//! The f64 references of the dense ops, written from their textbook definitions as plain
//! loops. They share no code with the fast paths (no GEMM, no tables, no helpers of
//! `elementwise`), so a per-node error measures the fast path against an independent oracle,
//! not its own arithmetic at another precision. Inputs are validated by the caller.

use ndarray::{ArrayD, IxDyn};

use super::linear::Activation;
use crate::error::{Error, Result};

fn shaped(shape: &[usize], v: Vec<f64>, op: &str) -> Result<ArrayD<f64>> {
    ArrayD::from_shape_vec(IxDyn(shape), v).map_err(|e| Error::Internal(format!("{op}: {e}")))
}

/// act(z) by definition: max(z, 0); 0.5 z (1 + tanh(sqrt(2/pi) (z + 0.044715 z^3))); z / (1 + e^-z).
fn activation(act: Activation, z: f64) -> f64 {
    match act {
        Activation::None => z,
        Activation::Relu => {
            if z > 0.0 {
                z
            } else {
                0.0
            }
        }
        Activation::Gelu => {
            let c = (2.0 / std::f64::consts::PI).sqrt();
            0.5 * z * (1.0 + (c * (z + 0.044715 * z.powi(3))).tanh())
        }
        Activation::Silu => z / (1.0 + (-z).exp()),
    }
}

/// y[m, n] = act(sum_k x[m, k] w[n, k] + b[n]); x `[..., K]`, w `[N, K]`.
pub fn linear(
    x: &ArrayD<f64>,
    w: &ArrayD<f64>,
    b: Option<&ArrayD<f64>>,
    act: Activation,
) -> Result<ArrayD<f64>> {
    let (n, k) = (w.shape()[0], w.shape()[1]);
    let xs: Vec<f64> = x.iter().copied().collect();
    let ws: Vec<f64> = w.iter().copied().collect();
    let bs: Option<Vec<f64>> = b.map(|b| b.iter().copied().collect());
    let m = xs.len() / k;
    let mut y = Vec::with_capacity(m * n);
    for row in 0..m {
        for col in 0..n {
            let mut acc = 0.0f64;
            for i in 0..k {
                acc += xs[row * k + i] * ws[col * k + i];
            }
            if let Some(b) = &bs {
                acc += b[col];
            }
            y.push(activation(act, acc));
        }
    }
    let mut shape = x.shape().to_vec();
    if let Some(last) = shape.last_mut() {
        *last = n;
    }
    shaped(&shape, y, "linear")
}

/// t = x (+ residual); y = t / sqrt(mean(t^2) + eps) * w over the last dim. Returns y, and t
/// when a residual is given.
pub fn rmsnorm(
    x: &ArrayD<f64>,
    w: &ArrayD<f64>,
    residual: Option<&ArrayD<f64>>,
    eps: f64,
) -> Result<Vec<ArrayD<f64>>> {
    let h = w.len();
    let mut t: Vec<f64> = x.iter().copied().collect();
    if let Some(r) = residual {
        for (a, b) in t.iter_mut().zip(r.iter()) {
            *a += *b;
        }
    }
    let ws: Vec<f64> = w.iter().copied().collect();
    let mut y = vec![0.0f64; t.len()];
    for row in 0..t.len() / h {
        let v = &t[row * h..(row + 1) * h];
        let mean_sq = v.iter().map(|a| a * a).sum::<f64>() / h as f64;
        let inv = 1.0 / (mean_sq + eps).sqrt();
        for i in 0..h {
            y[row * h + i] = v[i] * inv * ws[i];
        }
    }
    let mut out = vec![shaped(x.shape(), y, "rmsnorm")?];
    if residual.is_some() {
        out.push(shaped(x.shape(), t, "rmsnorm")?);
    }
    Ok(out)
}

/// Rotate-half RoPE of x `[B, H, T, D]`: for i < D/2 and angle a = (offset + t) base^(-2i/D),
/// y_i = x_i cos a - x_{i+D/2} sin a and y_{i+D/2} = x_{i+D/2} cos a + x_i sin a.
pub fn rope(x: &ArrayD<f64>, base: f64, offset: usize) -> Result<ArrayD<f64>> {
    let s = x.shape();
    let (t, d) = (s[2], s[3]);
    let half = d / 2;
    let xs: Vec<f64> = x.iter().copied().collect();
    let mut y = vec![0.0f64; xs.len()];
    for (r, (yr, xr)) in y.chunks_mut(d).zip(xs.chunks(d)).enumerate() {
        let pos = (offset + r % t) as f64;
        for i in 0..half {
            let a = pos * base.powf(-2.0 * i as f64 / d as f64);
            let (sin, cos) = a.sin_cos();
            yr[i] = xr[i] * cos - xr[i + half] * sin;
            yr[i + half] = xr[i + half] * cos + xr[i] * sin;
        }
    }
    shaped(s, y, "rope")
}

/// MoE experts by definition: slot s = t k + j of token t is kept when it appears in its
/// expert's segment `sorted[offsets[e]..offsets[e + 1]]` (e = ids[s]; anything else is the
/// sentinel or dropped), and y[t] = sum_j kept(s) w[s] down_e (silu(gate_e x_t) * (up_e x_t)),
/// with gate_e / up_e the first / last F rows of `gate_up[e]` `[2F, H]` and `down[e]` `[H, F]`.
/// `ids`, `sorted` and `offsets` hold validated integer values.
#[allow(clippy::too_many_arguments)]
pub fn moe_experts(
    x: &ArrayD<f64>,
    ids: &[i64],
    w: &ArrayD<f64>,
    sorted: &[i64],
    offsets: &[i64],
    gate_up: &ArrayD<f64>,
    down: &ArrayD<f64>,
) -> Result<ArrayD<f64>> {
    let (t, h) = (x.shape()[0], x.shape()[1]);
    let (e_count, f) = (gate_up.shape()[0], gate_up.shape()[1] / 2);
    let k = ids.len().checked_div(t).unwrap_or(0);
    let xs: Vec<f64> = x.iter().copied().collect();
    let ws: Vec<f64> = w.iter().copied().collect();
    let gu: Vec<f64> = gate_up.iter().copied().collect();
    let dn: Vec<f64> = down.iter().copied().collect();
    let mut kept = vec![false; t * k];
    for e in 0..e_count {
        for &s in &sorted[offsets[e] as usize..offsets[e + 1] as usize] {
            if s >= 0 && (s as usize) < t * k && ids[s as usize] == e as i64 {
                kept[s as usize] = true;
            }
        }
    }
    let mut y = vec![0.0f64; t * h];
    for tok in 0..t {
        let xt = &xs[tok * h..(tok + 1) * h];
        for j in 0..k {
            let slot = tok * k + j;
            if !kept[slot] {
                continue;
            }
            let e = ids[slot] as usize;
            let gu_e = &gu[e * 2 * f * h..(e + 1) * 2 * f * h];
            let dn_e = &dn[e * h * f..(e + 1) * h * f];
            let mut act = vec![0.0f64; f];
            for (i, a) in act.iter_mut().enumerate() {
                let mut gate = 0.0f64;
                let mut up = 0.0f64;
                for c in 0..h {
                    gate += gu_e[i * h + c] * xt[c];
                    up += gu_e[(f + i) * h + c] * xt[c];
                }
                *a = gate / (1.0 + (-gate).exp()) * up;
            }
            for r in 0..h {
                let mut o = 0.0f64;
                for i in 0..f {
                    o += dn_e[r * f + i] * act[i];
                }
                y[tok * h + r] += ws[slot] * o;
            }
        }
    }
    shaped(&[t, h], y, "moe_experts")
}

/// Everything MoE routing produces, by definition, in f64.
#[derive(Debug, Clone, PartialEq)]
pub struct Routing {
    /// `[T, k]` expert ids, largest logit first, ties to the lower index.
    pub ids: Vec<i64>,
    /// `[T, k]` their softmax probabilities (renormalised over the k when asked).
    pub weights: Vec<f64>,
    /// `[E]` slots per expert.
    pub counts: Vec<i64>,
    /// The permutation: per expert (ascending) its slots (ascending), padded with the
    /// sentinel T k to a multiple of the block; the tail up to `len` is the sentinel.
    pub sorted: Vec<i64>,
    /// `[E + 1]` segment starts.
    pub offsets: Vec<i64>,
    /// E sum_i (count_i / T) mean_t p[t, i].
    pub aux_loss: f64,
    /// mean_t logsumexp(logits_t)^2.
    pub z_loss: f64,
}

/// MoE routing of logits `[T, E]` (finite) by definition: softmax per token, the k largest
/// (stable sort: ties to the lower index), the histogram, vLLM's block-aligned permutation of
/// length `len`, and the two losses (0 for T = 0).
pub fn moe_route(
    logits: &ArrayD<f64>,
    k: usize,
    renormalize: bool,
    block: usize,
    len: usize,
) -> Routing {
    let (t, e) = (logits.shape()[0], logits.shape()[1]);
    let l: Vec<f64> = logits.iter().copied().collect();
    let mut ids = Vec::with_capacity(t * k);
    let mut weights = Vec::with_capacity(t * k);
    let mut prob_sum = vec![0.0f64; e];
    let mut z = 0.0f64;
    for row in l.chunks(e.max(1)).take(t) {
        let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let denom: f64 = row.iter().map(|v| (v - max).exp()).sum();
        let p: Vec<f64> = row.iter().map(|v| (v - max).exp() / denom).collect();
        let lse = max + denom.ln();
        z += lse * lse;
        for (acc, pi) in prob_sum.iter_mut().zip(&p) {
            *acc += pi;
        }
        let mut order: Vec<usize> = (0..e).collect();
        order.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
        let top = &order[..k];
        let kept: f64 = top.iter().map(|&i| p[i]).sum();
        for &i in top {
            ids.push(i as i64);
            weights.push(if renormalize { p[i] / kept } else { p[i] });
        }
    }
    let mut counts = vec![0i64; e];
    for &id in &ids {
        counts[id as usize] += 1;
    }
    let sentinel = (t * k) as i64;
    let mut sorted = Vec::with_capacity(len);
    let mut offsets = vec![0i64];
    for ex in 0..e {
        let start = sorted.len();
        for (slot, &id) in ids.iter().enumerate() {
            if id == ex as i64 {
                sorted.push(slot as i64);
            }
        }
        while (sorted.len() - start) % block != 0 {
            sorted.push(sentinel);
        }
        offsets.push(sorted.len() as i64);
    }
    sorted.resize(len.max(sorted.len()), sentinel);
    let (aux_loss, z_loss) = if t == 0 {
        (0.0, 0.0)
    } else {
        let tf = t as f64;
        let aux: f64 = (0..e)
            .map(|i| counts[i] as f64 / tf * (prob_sum[i] / tf))
            .sum();
        (e as f64 * aux, z / tf)
    };
    Routing {
        ids,
        weights,
        counts,
        sorted,
        offsets,
        aux_loss,
        z_loss,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(shape: &[usize], v: &[f64]) -> ArrayD<f64> {
        ArrayD::from_shape_vec(IxDyn(shape), v.to_vec()).expect("shape")
    }

    #[test]
    fn linear_by_hand() {
        // x [1, 2] = [1, 2]; w [[3, 4], [-5, 6]]; b [1, -10]: [12, -3] -> relu [12, 0].
        let y = linear(
            &a(&[1, 2], &[1.0, 2.0]),
            &a(&[2, 2], &[3.0, 4.0, -5.0, 6.0]),
            Some(&a(&[2], &[1.0, -10.0])),
            Activation::Relu,
        )
        .expect("linear");
        assert_eq!(y.iter().copied().collect::<Vec<_>>(), vec![12.0, 0.0]);
    }

    #[test]
    fn rmsnorm_by_hand() {
        // t = [3, 4]: mean square 12.5, eps 0.1 -> 1/sqrt(12.6).
        let y = rmsnorm(&a(&[2], &[3.0, 4.0]), &a(&[2], &[1.0, 2.0]), None, 0.1).expect("rms");
        let inv = 1.0 / 12.6f64.sqrt();
        assert!((y[0][0] - 3.0 * inv).abs() < 1e-15);
        assert!((y[0][1] - 8.0 * inv).abs() < 1e-15);
    }

    #[test]
    fn routing_by_hand() {
        // Two tokens, three experts, k = 1, block 2: token 0 -> expert 2, token 1 ties
        // between 0 and 1 -> expert 0 (the lower index).
        let r = moe_route(&a(&[2, 3], &[0.0, 1.0, 3.0, 2.0, 2.0, 0.0]), 1, true, 2, 8);
        assert_eq!(r.ids, vec![2, 0]);
        assert_eq!(r.weights, vec![1.0, 1.0]);
        assert_eq!(r.counts, vec![1, 0, 1]);
        assert_eq!(r.offsets, vec![0, 2, 2, 4]);
        assert_eq!(r.sorted, vec![1, 2, 0, 2, 2, 2, 2, 2]);
        let softmax = |v: [f64; 3]| {
            let s: f64 = v.iter().map(|x| x.exp()).sum();
            v.map(|x| x.exp() / s)
        };
        let (p0, p1) = (softmax([0.0, 1.0, 3.0]), softmax([2.0, 2.0, 0.0]));
        let aux = 3.0 * (0.5 * (p0[0] + p1[0]) / 2.0 + 0.5 * (p0[2] + p1[2]) / 2.0);
        assert!((r.aux_loss - aux).abs() < 1e-12, "{} vs {aux}", r.aux_loss);
        let lse = |v: [f64; 3]| v.iter().map(|x| x.exp()).sum::<f64>().ln();
        let z = (lse([0.0, 1.0, 3.0]).powi(2) + lse([2.0, 2.0, 0.0]).powi(2)) / 2.0;
        assert!((r.z_loss - z).abs() < 1e-12);
    }

    #[test]
    fn rope_by_hand() {
        // D = 2, one row at position 1: angle 1 rad.
        let y = rope(&a(&[1, 1, 1, 2], &[1.0, 0.0]), 10000.0, 1).expect("rope");
        assert!((y[[0, 0, 0, 0]] - 1f64.cos()).abs() < 1e-15);
        assert!((y[[0, 0, 0, 1]] - 1f64.sin()).abs() < 1e-15);
    }
}
