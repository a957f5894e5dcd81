//! Bench inputs: seeded random values (never zeros, which flatter some devices), made in
//! parallel chunks so large problems are quick to set up.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;

use super::problem::MOE_BLOCK;
use crate::error::{Error, Result};
use crate::ops::{MoeRouteParams, Op};
use crate::tensor::{Tensor, TensorMeta};

/// A random f32 tensor uniform in [-scale, scale); the same `seed` gives the same values.
pub fn random_tensor(shape: &[usize], scale: f32, seed: u64) -> Result<Tensor> {
    let n: usize = shape.iter().product();
    let mut v = vec![0f32; n];
    v.par_chunks_mut(1 << 16).enumerate().for_each(|(c, ch)| {
        let mut r = ChaCha8Rng::seed_from_u64(seed ^ c as u64);
        for x in ch {
            *x = r.gen_range(-1.0f32..1.0) * scale;
        }
    });
    Tensor::from_vec_f32(shape, v)
}

/// One set of inputs of `op` on inputs shaped `metas` (validated first): floats uniform in
/// [-1, 1), matrix operands scaled by 1/sqrt of the reduced size, router logits by 3. The
/// experts' routing inputs (ids, weights, sorted ids, offsets) come from routing random
/// logits on the host with block size [`MOE_BLOCK`].
pub fn make_inputs(op: &Op, metas: &[TensorMeta], seed: u64) -> Result<Vec<Tensor>> {
    op.validate(metas)?;
    let seed_of = |i: usize| seed ^ ((i as u64) << 40);
    if let Op::MoeExperts(_) = op {
        return moe_experts_inputs(metas, seed_of);
    }
    if let Op::AttentionDecode(p) = op {
        return decode_inputs(p, metas, seed);
    }
    metas
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let scale = match (op, i) {
                (Op::Linear(_), 1) => 1.0 / (m.shape[1] as f32).sqrt(),
                (Op::MoeRoute(_), _) => 3.0,
                _ => 1.0,
            };
            random_tensor(&m.shape, scale, seed_of(i))
        })
        .collect()
}

/// Decode attention's inputs: q and the caches uniform in [-1, 1), every sequence full (its
/// length the cache's capacity), and, paged, each sequence's blocks a seeded shuffle of the
/// cache's blocks (so neighbouring tokens are not neighbours in memory).
fn decode_inputs(
    p: &crate::ops::AttentionDecodeParams,
    metas: &[TensorMeta],
    seed: u64,
) -> Result<Vec<Tensor>> {
    use rand::seq::SliceRandom;
    let s = p.shape(metas)?;
    let mut v = Vec::with_capacity(metas.len());
    for (i, m) in metas.iter().take(3).enumerate() {
        v.push(random_tensor(&m.shape, 1.0, seed ^ ((i as u64) << 40))?);
    }
    let len = i32::try_from(s.capacity)
        .map_err(|_| Error::invalid("attention_decode", "cache capacity exceeds i32"))?;
    v.push(Tensor::from_vec_i32(&[s.b], vec![len; s.b])?);
    if let Some(nb) = s.num_blocks {
        let mut ids: Vec<i32> = (0..nb.min(i32::MAX as usize) as i32).collect();
        ids.shuffle(&mut ChaCha8Rng::seed_from_u64(seed ^ 0xb10c));
        let need = s.b * s.max_blocks;
        if ids.len() < need {
            return Err(Error::invalid(
                "attention_decode",
                format!(
                    "{} cache blocks, {need} needed for full sequences",
                    ids.len()
                ),
            ));
        }
        ids.truncate(need);
        v.push(Tensor::from_vec_i32(&[s.b, s.max_blocks], ids)?);
    }
    Ok(v)
}

/// The experts' inputs: x, then routing of random logits, then the two weight stacks.
fn moe_experts_inputs(metas: &[TensorMeta], seed_of: impl Fn(usize) -> u64) -> Result<Vec<Tensor>> {
    let shape = |i: usize| -> Result<&[usize]> {
        metas
            .get(i)
            .map(|m| m.shape.as_slice())
            .ok_or_else(|| Error::Internal(format!("moe_experts bench: no input {i}")))
    };
    let (t, k) = (shape(1)?[0], shape(1)?[1]);
    let e = shape(5)?[0];
    let route = MoeRouteParams {
        top_k: k,
        renormalize: true,
        block_size: MOE_BLOCK,
    };
    let logits = random_tensor(&[t, e], 3.0, seed_of(9))?;
    let r = Op::MoeRoute(route).run_cpu(&[&logits])?;
    let (h, f) = (shape(0)?[1], shape(6)?[2]);
    Ok(vec![
        random_tensor(shape(0)?, 1.0, seed_of(0))?,
        r[0].clone(),
        r[1].clone(),
        r[3].clone(),
        r[4].clone(),
        random_tensor(shape(5)?, 1.0 / (h as f32).sqrt(), seed_of(5))?,
        random_tensor(shape(6)?, 1.0 / (f as f32).sqrt(), seed_of(6))?,
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::BenchShape;
    use crate::ops::OpKind;

    #[test]
    fn inputs_are_seeded_and_match_the_shapes() -> Result<()> {
        let a = random_tensor(&[3, 70_000], 2.0, 7)?;
        let b = random_tensor(&[3, 70_000], 2.0, 7)?;
        assert_eq!(a.to_f32(), b.to_f32());
        assert!(a.to_f32().iter().all(|x| (-2.0..2.0).contains(x)));
        assert!(a.to_f32().iter().any(|x| *x != 0.0));
        let s = BenchShape {
            tokens: Some(9),
            experts: Some(4),
            top_k: Some(2),
            hidden: 8,
            ffn: 4,
            ..BenchShape::DEFAULT
        };
        let p = s.problem(OpKind::MoeExperts)?;
        let inputs = make_inputs(&p.op, &p.inputs, 1)?;
        let metas: Vec<TensorMeta> = inputs.iter().map(Tensor::meta).collect();
        assert_eq!(metas, p.inputs);
        Ok(())
    }

    #[test]
    fn bad_shapes_are_rejected_before_any_input_is_made() {
        let op = Op::MoeExperts(crate::ops::MoeExpertsParams {});
        let e = make_inputs(&op, &[], 0).expect_err("no inputs");
        assert!(e.to_string().contains("moe_experts"), "{e}");
    }
}
