//! Host tensors: a shape, a dtype and data held in an ndarray.

use half::{bf16, f16};
use ndarray::{ArrayD, IxDyn};
use serde::{Deserialize, Serialize};

use crate::dtype::DType;
use crate::error::{Error, Result};

/// Extents of a tensor's dimensions, outermost first: up to four held inline (no allocation),
/// so that the metas the planner and executor copy per op cost no heap traffic.
pub type Shape = smallvec::SmallVec<[usize; 4]>;

/// Shape and dtype of a tensor, without its data.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TensorMeta {
    /// Extent of each dimension, outermost first.
    pub shape: Shape,
    /// Element type.
    pub dtype: DType,
}

impl TensorMeta {
    /// A meta from a shape and dtype.
    pub fn new(shape: impl AsRef<[usize]>, dtype: DType) -> Self {
        Self {
            shape: Shape::from_slice(shape.as_ref()),
            dtype,
        }
    }

    /// Number of elements (saturating at `usize::MAX`; [`crate::limits::numel`] says when
    /// a shape overflows).
    pub fn numel(&self) -> usize {
        self.shape
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .unwrap_or(usize::MAX)
    }

    /// Bytes of data (saturating).
    pub fn bytes(&self) -> usize {
        self.numel().saturating_mul(self.dtype.size())
    }
}

impl std::fmt::Display for TensorMeta {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}{:?}", self.dtype, self.shape)
    }
}

/// Host data of a tensor, one variant per dtype.
#[derive(Debug, Clone, PartialEq)]
pub enum HostData {
    /// f32 data.
    F32(ArrayD<f32>),
    /// f16 data.
    F16(ArrayD<f16>),
    /// bf16 data.
    BF16(ArrayD<bf16>),
    /// i8 data.
    I8(ArrayD<i8>),
    /// i32 data.
    I32(ArrayD<i32>),
}

/// The index of element `flat` (row-major) of an array of `shape`.
pub fn unravel(mut flat: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for (i, &d) in shape.iter().enumerate().rev() {
        if d > 0 {
            idx[i] = flat % d;
            flat /= d;
        }
    }
    idx
}

/// A tensor in host memory.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    data: HostData,
}

macro_rules! each {
    ($data:expr, $a:ident => $body:expr) => {
        match $data {
            HostData::F32($a) => $body,
            HostData::F16($a) => $body,
            HostData::BF16($a) => $body,
            HostData::I8($a) => $body,
            HostData::I32($a) => $body,
        }
    };
}

impl Tensor {
    /// Wraps host data.
    pub fn new(data: HostData) -> Self {
        Self { data }
    }

    /// An f32 tensor from an array.
    pub fn from_f32(a: ArrayD<f32>) -> Self {
        Self::new(HostData::F32(a))
    }

    /// An i32 tensor from an array.
    pub fn from_i32(a: ArrayD<i32>) -> Self {
        Self::new(HostData::I32(a))
    }

    /// An f32 tensor of a shape from row-major values.
    pub fn from_vec_f32(shape: &[usize], v: Vec<f32>) -> Result<Self> {
        ArrayD::from_shape_vec(IxDyn(shape), v)
            .map(Self::from_f32)
            .map_err(|e| Error::invalid("tensor", format!("shape {shape:?}: {e}")))
    }

    /// An i32 tensor of a shape from row-major values.
    pub fn from_vec_i32(shape: &[usize], v: Vec<i32>) -> Result<Self> {
        ArrayD::from_shape_vec(IxDyn(shape), v)
            .map(Self::from_i32)
            .map_err(|e| Error::invalid("tensor", format!("shape {shape:?}: {e}")))
    }

    /// A tensor of zeros.
    pub fn zeros(meta: &TensorMeta) -> Self {
        let s = IxDyn(&meta.shape);
        Self::new(match meta.dtype {
            DType::F32 => HostData::F32(ArrayD::zeros(s)),
            DType::F16 => HostData::F16(ArrayD::from_elem(s, f16::ZERO)),
            DType::BF16 => HostData::BF16(ArrayD::from_elem(s, bf16::ZERO)),
            DType::I8 => HostData::I8(ArrayD::zeros(s)),
            DType::I32 => HostData::I32(ArrayD::zeros(s)),
        })
    }

    /// The data.
    pub fn data(&self) -> &HostData {
        &self.data
    }

    /// The data, mutable (its shape and dtype stay as they are).
    pub fn data_mut(&mut self) -> &mut HostData {
        &mut self.data
    }

    /// Consumes the tensor, returning its data.
    pub fn into_data(self) -> HostData {
        self.data
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        match &self.data {
            HostData::F32(_) => DType::F32,
            HostData::F16(_) => DType::F16,
            HostData::BF16(_) => DType::BF16,
            HostData::I8(_) => DType::I8,
            HostData::I32(_) => DType::I32,
        }
    }

    /// Shape.
    pub fn shape(&self) -> &[usize] {
        each!(&self.data, a => a.shape())
    }

    /// Shape and dtype.
    pub fn meta(&self) -> TensorMeta {
        TensorMeta::new(self.shape(), self.dtype())
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.meta().numel()
    }

    /// The first element (in row-major order) that is NaN or infinite, with its index and
    /// value; `None` for integer tensors and finite data.
    pub fn first_non_finite(&self) -> Option<(Vec<usize>, f64)> {
        self.first_non_finite_but(false)
    }

    /// As [`Tensor::first_non_finite`], letting -inf pass where `neg_inf_ok` (an output
    /// whose -inf is a correct value: [`crate::Op::output_may_be_neg_inf`]); NaN and +inf
    /// are still found.
    pub fn first_non_finite_but(&self, neg_inf_ok: bool) -> Option<(Vec<usize>, f64)> {
        fn find<T: Copy>(a: &ArrayD<T>, bad: impl Fn(T) -> bool) -> Option<(usize, T)> {
            a.iter()
                .enumerate()
                .find(|&(_, &x)| bad(x))
                .map(|(i, &x)| (i, x))
        }
        let bad = |x: f64| !(x.is_finite() || (neg_inf_ok && x == f64::NEG_INFINITY));
        let (flat, v) = match &self.data {
            HostData::F32(a) => find(a, |x: f32| bad(f64::from(x))).map(|(i, v)| (i, f64::from(v))),
            HostData::F16(a) => find(a, |x: f16| bad(f64::from(x))).map(|(i, v)| (i, f64::from(v))),
            HostData::BF16(a) => {
                find(a, |x: bf16| bad(f64::from(x))).map(|(i, v)| (i, f64::from(v)))
            }
            HostData::I8(_) | HostData::I32(_) => None,
        }?;
        Some((unravel(flat, self.shape()), v))
    }

    /// The f32 array, if this is an f32 tensor.
    pub fn as_f32(&self) -> Result<&ArrayD<f32>> {
        match &self.data {
            HostData::F32(a) => Ok(a),
            _ => Err(Error::invalid(
                "tensor",
                format!("expected f32 data, found {}", self.dtype()),
            )),
        }
    }

    /// The i32 array, if this is an i32 tensor.
    pub fn as_i32(&self) -> Result<&ArrayD<i32>> {
        match &self.data {
            HostData::I32(a) => Ok(a),
            _ => Err(Error::invalid(
                "tensor",
                format!("expected i32 data, found {}", self.dtype()),
            )),
        }
    }

    /// The i8 array, if this is an i8 tensor.
    pub fn as_i8(&self) -> Result<&ArrayD<i8>> {
        match &self.data {
            HostData::I8(a) => Ok(a),
            _ => Err(Error::invalid(
                "tensor",
                format!("expected i8 data, found {}", self.dtype()),
            )),
        }
    }

    /// The values as f32 (converting; integers are converted by value).
    pub fn to_f32(&self) -> ArrayD<f32> {
        match &self.data {
            HostData::F32(a) => a.clone(),
            HostData::F16(a) => a.mapv(f32::from),
            HostData::BF16(a) => a.mapv(f32::from),
            HostData::I8(a) => a.mapv(f32::from),
            HostData::I32(a) => a.mapv(|x| x as f32),
        }
    }

    /// The values as f64 (converting).
    pub fn to_f64(&self) -> ArrayD<f64> {
        match &self.data {
            HostData::F32(a) => a.mapv(f64::from),
            HostData::F16(a) => a.mapv(f64::from),
            HostData::BF16(a) => a.mapv(f64::from),
            HostData::I8(a) => a.mapv(f64::from),
            HostData::I32(a) => a.mapv(f64::from),
        }
    }

    /// This tensor converted to another dtype (round to nearest even for floats; saturating
    /// round for integers).
    pub fn cast(&self, dtype: DType) -> Tensor {
        if dtype == self.dtype() {
            return self.clone();
        }
        let f = self.to_f32();
        Tensor::new(match dtype {
            DType::F32 => HostData::F32(f),
            DType::F16 => HostData::F16(f.mapv(f16::from_f32)),
            DType::BF16 => HostData::BF16(f.mapv(bf16::from_f32)),
            DType::I8 => HostData::I8(f.mapv(|x| x.round().clamp(-128.0, 127.0) as i8)),
            DType::I32 => HostData::I32(f.mapv(|x| x.round() as i32)),
        })
    }

    /// The raw little-endian bytes of the data in row-major order.
    pub fn to_bytes(&self) -> Vec<u8> {
        fn b<T: bytemuck::Pod>(a: &ArrayD<T>) -> Vec<u8> {
            let v: Vec<T> = a.iter().copied().collect();
            bytemuck::cast_slice(&v).to_vec()
        }
        each!(&self.data, a => b(a))
    }

    /// A tensor from raw little-endian row-major bytes.
    pub fn from_bytes(meta: &TensorMeta, bytes: &[u8]) -> Result<Tensor> {
        if bytes.len() != meta.bytes() {
            return Err(Error::invalid(
                "tensor",
                format!(
                    "{} bytes given for {meta}, which needs {}",
                    bytes.len(),
                    meta.bytes()
                ),
            ));
        }
        fn a<T: bytemuck::Pod>(shape: &[usize], bytes: &[u8]) -> Result<ArrayD<T>> {
            let v: Vec<T> = bytemuck::pod_collect_to_vec(bytes);
            ArrayD::from_shape_vec(IxDyn(shape), v)
                .map_err(|e| Error::Internal(format!("from_bytes: {e}")))
        }
        let s = &meta.shape;
        Ok(Tensor::new(match meta.dtype {
            DType::F32 => HostData::F32(a(s, bytes)?),
            DType::F16 => HostData::F16(a(s, bytes)?),
            DType::BF16 => HostData::BF16(a(s, bytes)?),
            DType::I8 => HostData::I8(a(s, bytes)?),
            DType::I32 => HostData::I32(a(s, bytes)?),
        }))
    }
}

/// ||out - ref|| / ||ref|| (Frobenius norms). When the reference is all zeros, the absolute
/// norm of the difference. NaN anywhere gives NaN, so it never passes a threshold.
pub fn rel_error(out: &ArrayD<f64>, reference: &ArrayD<f64>) -> f64 {
    if out.shape() != reference.shape() {
        return f64::NAN;
    }
    let mut num = 0.0f64;
    let mut den = 0.0f64;
    for (&o, &r) in out.iter().zip(reference.iter()) {
        if o == r {
            // Equal values (the same infinity too: an lse of -inf for a row that sees no
            // key) add nothing to the error; only finite ones add to the norm.
            if r.is_finite() {
                den += r * r;
            }
            continue;
        }
        if !o.is_finite() || !r.is_finite() {
            // A NaN anywhere, or an infinity where the other side differs: no finite
            // error describes it.
            return f64::NAN;
        }
        num += (o - r) * (o - r);
        den += r * r;
    }
    if den == 0.0 {
        num.sqrt()
    } else {
        (num / den).sqrt()
    }
}
