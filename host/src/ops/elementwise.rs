//! Elementwise ops, and the scalar numerics the other op families share (activations,
//! log-sum-exp), written once for f32 (the CPU fast path) and f64 (the references).

use crate::ops::OutputMetas;
use ndarray::ArrayD;
use smallvec::smallvec;

use super::{CPU_PAR_MIN, expect_inputs, metas, reference_metas};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::{Tensor, TensorMeta};

/// The float types the CPU ops compute in: f32 for the fast path, f64 for the references.
pub trait Real: ndarray::NdFloat + std::iter::Sum {
    /// `x` rounded to this type.
    fn of(x: f64) -> Self;
    /// This value widened (or kept) as f64.
    fn widen(self) -> f64;
}

impl Real for f32 {
    fn of(x: f64) -> Self {
        x as f32
    }
    fn widen(self) -> f64 {
        f64::from(self)
    }
}

impl Real for f64 {
    fn of(x: f64) -> Self {
        x
    }
    fn widen(self) -> f64 {
        self
    }
}

/// max(x, 0).
pub fn relu<T: Real>(x: T) -> T {
    if x > T::zero() { x } else { T::zero() }
}

/// x * sigmoid(x), written as x / (1 + exp(-x)) (-> -0 for very negative x, no NaN).
pub fn silu<T: Real>(x: T) -> T {
    x / (T::one() + (-x).exp())
}

/// GELU, tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
pub fn gelu_tanh<T: Real>(x: T) -> T {
    let c = T::of((2.0 / std::f64::consts::PI).sqrt());
    let inner = c * (x + T::of(0.044715) * x * x * x);
    T::of(0.5) * x * (T::one() + inner.tanh())
}

/// The largest value of a slice: -inf when empty, NaN when any value is NaN (so a NaN input
/// shows in the result instead of being skipped).
pub fn max_of<T: Real>(xs: &[T]) -> T {
    xs.iter().fold(
        T::neg_infinity(),
        |m, &x| if x > m || x.is_nan() { x } else { m },
    )
}

/// Writes exp(x - max) into `out` and returns (max, sum of `out`): the pieces of a stable
/// softmax (out / sum) and log-sum-exp (max + ln sum). `x` must be non-empty and finite.
pub fn exp_shifted<T: Real>(x: &[T], out: &mut [T]) -> (T, T) {
    let m = max_of(x);
    let mut sum = T::zero();
    for (o, &v) in out.iter_mut().zip(x) {
        *o = (v - m).exp();
        sum += *o;
    }
    (m, sum)
}

/// a + b: same shape, f32.
pub fn validate_add(inputs: &[TensorMeta]) -> Result<OutputMetas> {
    expect_inputs("add", inputs.len(), &["a", "b"])?;
    let (a, b) = (&inputs[0], &inputs[1]);
    if a.dtype != DType::F32 || b.dtype != DType::F32 {
        return Err(Error::invalid(
            "add",
            format!("inputs are {} and {}, expected f32", a.dtype, b.dtype),
        ));
    }
    if a.shape != b.shape {
        return Err(Error::invalid(
            "add",
            format!("shapes {:?} and {:?} differ", a.shape, b.shape),
        ));
    }
    Ok(smallvec![a.clone()])
}

/// CPU a + b.
pub fn cpu_add(inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
    validate_add(&metas(inputs))?;
    let a = inputs[0].as_f32()?;
    let b = inputs[1].as_f32()?;
    if a.len() < CPU_PAR_MIN {
        return Ok(vec![Tensor::from_f32(a + b)]);
    }
    let mut y = ArrayD::<f32>::zeros(a.raw_dim());
    ndarray::Zip::from(&mut y)
        .and(a)
        .and(b)
        .par_for_each(|y, &a, &b| *y = a + b);
    Ok(vec![Tensor::from_f32(y)])
}

/// f64 a + b.
pub fn reference_add(inputs: &[ArrayD<f64>]) -> Result<Vec<ArrayD<f64>>> {
    validate_add(&reference_metas(inputs, &[]))?;
    Ok(vec![&inputs[0] + &inputs[1]])
}
