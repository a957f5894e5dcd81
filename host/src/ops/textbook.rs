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
    fn rope_by_hand() {
        // D = 2, one row at position 1: angle 1 rad.
        let y = rope(&a(&[1, 1, 1, 2], &[1.0, 0.0]), 10000.0, 1).expect("rope");
        assert!((y[[0, 0, 0, 0]] - 1f64.cos()).abs() < 1e-15);
        assert!((y[[0, 0, 0, 1]] - 1f64.sin()).abs() < 1e-15);
    }
}
