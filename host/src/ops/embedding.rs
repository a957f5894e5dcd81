//! Embedding lookup (a gather of table rows): ids `[...]` (i32), table `[V, H]` (f32) ->
//! y `[..., H]` with y[i] = table[ids[i]]. An id outside `0..V` is an error naming the id, its
//! position and the vocabulary size; nothing is clamped or wrapped.

use crate::ops::OutputMetas;
use ndarray::{ArrayD, IxDyn};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use smallvec::smallvec;

use super::{CPU_PAR_MIN, expect_inputs, flat, metas, reference_metas};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::{Tensor, TensorMeta};

/// The op's name in errors.
const OP: &str = "embedding";

/// Names of the inputs, in order.
pub const INPUTS: [&str; 2] = ["ids", "table"];

/// The dtypes of the inputs (ids are integers), for validating the f64 reference's inputs.
pub const DTYPES: [DType; 2] = [DType::I32, DType::F32];

/// Parameters of the embedding lookup (none yet: the table's shape says everything).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EmbeddingParams {}

impl EmbeddingParams {
    /// Output meta: ids' shape with the table's row size appended, f32.
    pub fn validate(&self, inputs: &[TensorMeta]) -> Result<OutputMetas> {
        expect_inputs(OP, inputs.len(), &INPUTS)?;
        let (ids, table) = (&inputs[0], &inputs[1]);
        if ids.dtype != DType::I32 {
            return Err(Error::invalid(
                OP,
                format!("ids are {}, expected i32 token ids", ids.dtype),
            ));
        }
        if table.dtype != DType::F32 {
            return Err(Error::invalid(
                OP,
                format!("table is {}, expected f32", table.dtype),
            ));
        }
        let [v, h] = table.shape[..] else {
            return Err(Error::invalid(
                OP,
                format!(
                    "table has shape {:?}, expected [vocab, hidden]",
                    table.shape
                ),
            ));
        };
        if v == 0 || h == 0 {
            return Err(Error::invalid(
                OP,
                format!("table [{v}, {h}] is empty: vocab and hidden must be >= 1"),
            ));
        }
        let mut shape = ids.shape.clone();
        shape.push(h);
        Ok(smallvec![TensorMeta::new(shape, DType::F32)])
    }

    /// CPU f32 implementation: row copies, parallel over blocks of ids for large lookups.
    pub fn cpu(&self, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
        let out = self.validate(&metas(inputs))?.remove(0);
        let ids = inputs[0].as_i32()?.as_standard_layout();
        let table = inputs[1].as_f32()?.as_standard_layout();
        let ids = flat(&ids)?;
        let table = flat(&table)?;
        let h = out.shape.last().copied().unwrap_or(1);
        let vocab = table.len() / h;
        let rows: Vec<usize> = ids
            .iter()
            .enumerate()
            .map(|(i, &id)| row_of(i64::from(id), i, vocab))
            .collect::<Result<_>>()?;
        let mut y = vec![0.0f32; rows.len() * h];
        let copy = |(dst, &r): (&mut [f32], &usize)| {
            dst.copy_from_slice(&table[r * h..(r + 1) * h]);
        };
        if y.len() < CPU_PAR_MIN {
            y.chunks_mut(h).zip(&rows).for_each(copy);
        } else {
            y.par_chunks_mut(h).zip(&rows).for_each(copy);
        }
        let a = ArrayD::from_shape_vec(IxDyn(&out.shape), y)
            .map_err(|e| Error::Internal(format!("{OP}: {e}")))?;
        Ok(vec![Tensor::from_f32(a)])
    }

    /// f64 reference: for each id, its row by index arithmetic over the table's elements.
    pub fn reference(&self, inputs: &[ArrayD<f64>]) -> Result<Vec<ArrayD<f64>>> {
        let out = self.validate(&reference_metas(inputs, &DTYPES))?.remove(0);
        let (v, h) = (inputs[1].shape()[0], inputs[1].shape()[1]);
        let mut y = Vec::with_capacity(inputs[0].len() * h);
        for (i, &id) in inputs[0].iter().enumerate() {
            if id.fract() != 0.0 || !id.is_finite() {
                return Err(Error::invalid(
                    OP,
                    format!("id {id} at position {i} is not a whole number"),
                ));
            }
            let r = row_of(id as i64, i, v)?;
            for c in 0..h {
                y.push(inputs[1][[r, c]]);
            }
        }
        let a = ArrayD::from_shape_vec(IxDyn(&out.shape), y)
            .map_err(|e| Error::Internal(format!("{OP}: {e}")))?;
        Ok(vec![a])
    }

    /// FLOPs: none (a copy).
    pub fn flops(&self, _inputs: &[TensorMeta]) -> f64 {
        0.0
    }
}

/// The table row of token `id` (at flat position `pos` of the ids), or an error naming both
/// and the accepted range.
fn row_of(id: i64, pos: usize, vocab: usize) -> Result<usize> {
    usize::try_from(id)
        .ok()
        .filter(|&r| r < vocab)
        .ok_or_else(|| {
            Error::invalid(
                OP,
                format!(
                    "token id {id} at position {pos} is outside the vocabulary of {vocab} tokens \
                     (accepted: 0 to {})",
                    vocab - 1
                ),
            )
        })
}

/// Checks that every id of `ids` is a row of a table of `vocab` rows (the lookup's own check,
/// for callers that want the error before building a graph).
pub fn check_ids(ids: &Tensor, vocab: usize) -> Result<()> {
    let a = ids.as_i32()?;
    for (i, &id) in a.iter().enumerate() {
        row_of(i64::from(id), i, vocab)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(v: usize, h: usize) -> Result<Tensor> {
        Tensor::from_vec_f32(&[v, h], (0..v * h).map(|x| x as f32 * 0.5 - 3.0).collect())
    }

    #[test]
    fn gathers_rows_like_the_reference() -> Result<()> {
        let p = EmbeddingParams {};
        let t = table(7, 3)?;
        let ids = Tensor::from_vec_i32(&[2, 3], vec![0, 6, 3, 3, 1, 0])?;
        let y = p.cpu(&[&ids, &t])?.remove(0);
        assert_eq!(y.shape(), [2, 3, 3]);
        let r = p.reference(&[ids.to_f64(), t.to_f64()])?.remove(0);
        assert_eq!(y.to_f64(), r);
        let tf = t.to_f32();
        let yf = y.to_f32();
        for (i, &id) in [0usize, 6, 3, 3, 1, 0].iter().enumerate() {
            for c in 0..3 {
                assert_eq!(yf[[i / 3, i % 3, c]], tf[[id, c]]);
            }
        }
        // Large enough for the parallel path.
        let big = table(50, 4096)?;
        let ids = Tensor::from_vec_i32(&[64], (0..64).map(|i| (i * 7) % 50).collect())?;
        let y = p.cpu(&[&ids, &big])?.remove(0);
        let r = p.reference(&[ids.to_f64(), big.to_f64()])?.remove(0);
        assert_eq!(y.to_f64(), r);
        Ok(())
    }

    #[test]
    fn an_id_outside_the_vocabulary_is_named() -> Result<()> {
        let p = EmbeddingParams {};
        let t = table(5, 2)?;
        for bad in [5, -1, i32::MAX] {
            let ids = Tensor::from_vec_i32(&[3], vec![0, bad, 1])?;
            let m = p.cpu(&[&ids, &t]).expect_err("out of range").to_string();
            assert!(
                m.contains(&format!("token id {bad} at position 1")) && m.contains("5 tokens"),
                "{m}"
            );
            let m = p
                .reference(&[ids.to_f64(), t.to_f64()])
                .expect_err("out of range")
                .to_string();
            assert!(m.contains(&format!("token id {bad}")), "{m}");
            assert!(check_ids(&ids, 5).is_err());
        }
        Ok(())
    }

    #[test]
    fn wrong_dtypes_and_shapes_are_refused() -> Result<()> {
        let p = EmbeddingParams {};
        let f = |s: &[usize], d| TensorMeta::new(s, d);
        for (ins, want) in [
            (
                vec![f(&[3], DType::F32), f(&[5, 2], DType::F32)],
                "expected i32",
            ),
            (
                vec![f(&[3], DType::I32), f(&[5, 2], DType::I32)],
                "expected f32",
            ),
            (
                vec![f(&[3], DType::I32), f(&[10], DType::F32)],
                "[vocab, hidden]",
            ),
            (
                vec![f(&[3], DType::I32), f(&[0, 2], DType::F32)],
                "is empty",
            ),
            (vec![f(&[3], DType::I32)], "takes 2 inputs"),
        ] {
            let m = p.validate(&ins).expect_err(want).to_string();
            assert!(m.contains(want), "{m}");
        }
        Ok(())
    }
}
