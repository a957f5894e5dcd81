//! A decode step of one attention block, so the planner sees decode attention: T new tokens
//! per sequence against a KV cache of up to `context` tokens.
//!
//! x [B*T, H] -> RMSNorm -> q_proj -> heads -> RoPE (positions of the new tokens) ->
//! attention_decode (the KV cache, contiguous or paged, holds each sequence's earlier tokens
//! *and* the T new ones, appended before the step) -> merge heads -> o_proj -> + x.
//! Sequence lengths vary over the batch (between `context` and about half of it, never below
//! T), so one batch mixes lengths; a paged cache gets a shuffled block table. The cache is a
//! graph parameter (resident on a device across runs, as a serving cache is), the lengths and
//! the block table constants. Sizes other than T, `context` and the block size come from a
//! [`MixtralConfig`] (batch, d_model, heads, kv_heads, rope_theta, rms_eps, seed, dtype).

use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Normal};

use super::MixtralConfig;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::graph::Graph;
use crate::limits::{self, Limits};
use crate::ops::attention_decode::{HEAD_DIMS, MAX_BLOCK_SIZE, MAX_NEW_TOKENS};
use crate::ops::{
    Activation, AttentionDecodeParams, LinearParams, Op, RmsNormParams, RopeParams,
    SplitHeadsParams,
};
use crate::tensor::Tensor;

/// The graph's output: the block's output [B*T, H].
pub const DECODE_OUTPUT: &str = "out.y";

/// A decode step's own sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeStep {
    /// New tokens per sequence (1..=16).
    pub new_tokens: usize,
    /// Tokens the longest sequence holds, the new ones included (the cache's capacity).
    pub context: usize,
    /// Tokens per block of a paged cache (`None`: contiguous).
    pub block_size: Option<usize>,
}

impl DecodeStep {
    /// Each sequence's length: the context, less up to about half of it, never below T.
    pub fn lengths(&self, batch: usize) -> Vec<usize> {
        (0..batch)
            .map(|b| {
                let cut = (b * 7919) % (self.context / 2 + 1);
                (self.context - cut).max(self.new_tokens)
            })
            .collect()
    }

    /// Checks the sizes against the layer's; errors name the setting and what is accepted.
    pub fn check(&self, c: &MixtralConfig) -> Result<()> {
        let bad = |msg: String| Err(Error::invalid("decode workload", msg));
        if !(1..=MAX_NEW_TOKENS).contains(&self.new_tokens) {
            return bad(format!(
                "--decode {} (accepted: 1..={MAX_NEW_TOKENS} new tokens)",
                self.new_tokens
            ));
        }
        if self.context < self.new_tokens {
            return bad(format!(
                "--context {} is shorter than the {} new tokens it includes",
                self.context, self.new_tokens
            ));
        }
        if let Some(bs) = self.block_size
            && (!bs.is_power_of_two() || bs > MAX_BLOCK_SIZE)
        {
            return bad(format!(
                "--block-size {bs} (accepted: a power of two, 1..={MAX_BLOCK_SIZE})"
            ));
        }
        if c.heads == 0 || c.d_model % c.heads != 0 || !HEAD_DIMS.contains(&c.head_dim()) {
            return bad(format!(
                "d_model {} / heads {} gives head dim {} (accepted: 64, 128, 256)",
                c.d_model,
                c.heads,
                c.d_model.checked_div(c.heads).unwrap_or(0)
            ));
        }
        if c.kv_heads == 0 || c.heads % c.kv_heads != 0 || c.batch == 0 {
            return bad(format!(
                "batch {}, heads {}, kv_heads {}: batch and kv_heads > 0, heads a multiple of \
                 kv_heads",
                c.batch, c.heads, c.kv_heads
            ));
        }
        Ok(())
    }

    /// Cache blocks per sequence (paged) or the cache's rows per sequence (contiguous).
    fn slots(&self) -> usize {
        match self.block_size {
            Some(bs) => self.context.div_ceil(bs),
            None => self.context,
        }
    }

    /// Host bytes of the step's tensors (f32), or `None` when they overflow.
    pub fn host_bytes(&self, c: &MixtralConfig) -> Option<u64> {
        let d = c.head_dim();
        let rows = limits::numel(&[c.batch, self.slots(), self.block_size.unwrap_or(1)])?;
        let cache = rows.checked_mul(limits::numel(&[2, c.kv_heads, d, 4])?)?;
        let t = limits::numel(&[c.batch, self.new_tokens, c.d_model])?;
        limits::sum([
            Some(cache),
            limits::numel(&[2, c.d_model, c.d_model, 4]),
            t.checked_mul(4 * 4),
        ])
    }
}

fn normal(rng: &mut ChaCha8Rng, shape: &[usize], std: f32) -> Result<Tensor> {
    let n: usize = shape.iter().product();
    let dist = Normal::new(0.0f32, std)
        .map_err(|e| Error::Internal(format!("normal distribution: {e}")))?;
    Tensor::from_vec_f32(shape, (0..n).map(|_| dist.sample(rng)).collect())
}

/// The decode step's graph (see the module docs), its inputs and weights seeded by `c.seed`
/// and rounded to `c.dtype`, after checking the sizes and that the tensors fit `limits`.
pub fn decode_layer(c: &MixtralConfig, step: &DecodeStep, limits: &Limits) -> Result<Graph> {
    step.check(c)?;
    limits.admit("decode workload", step.host_bytes(c))?;
    let (b, t, h, d) = (c.batch, step.new_tokens, c.d_model, c.head_dim());
    let mut rng = ChaCha8Rng::seed_from_u64(c.seed);
    let round = |x: Tensor| x.cast(c.dtype).cast(DType::F32);
    let s = |n: usize| 1.0 / (n as f32).sqrt();
    let mut g = Graph::default();
    g.constant("x", round(normal(&mut rng, &[b * t, h], 1.0)?));
    let ln1 = normal(&mut rng, &[h], 0.1)?.to_f32().mapv(|x| 1.0 + x);
    g.param("ln1", round(Tensor::from_f32(ln1)));
    g.param("wq", round(normal(&mut rng, &[h, h], s(h))?));
    g.param("wo", round(normal(&mut rng, &[h, h], s(h))?));
    let lens = step.lengths(b);
    let cache_shape = match step.block_size {
        Some(bs) => vec![b * step.slots(), c.kv_heads, bs, d],
        None => vec![b, c.kv_heads, step.context, d],
    };
    g.param("k_cache", round(normal(&mut rng, &cache_shape, 1.0)?));
    g.param("v_cache", round(normal(&mut rng, &cache_shape, 1.0)?));
    let to_i32 = |x: usize| {
        i32::try_from(x).map_err(|_| Error::invalid("decode workload", format!("{x} exceeds i32")))
    };
    let lens_i32 = lens
        .iter()
        .map(|&l| to_i32(l))
        .collect::<Result<Vec<_>>>()?;
    g.constant("seq_lens", Tensor::from_vec_i32(&[b], lens_i32)?);
    let mut att_inputs = vec!["q_rope.y", "k_cache", "v_cache", "seq_lens"];
    if step.block_size.is_some() {
        let per = step.slots();
        let mut ids = (0..b * per).map(to_i32).collect::<Result<Vec<i32>>>()?;
        ids.shuffle(&mut rng);
        g.constant("block_table", Tensor::from_vec_i32(&[b, per], ids)?);
        att_inputs.push("block_table");
    }
    let lin = Op::Linear(LinearParams {
        act: Activation::None,
        bias: false,
        f32_out: false,
    });
    let h1 = g.add(
        "input_norm",
        Op::RmsNorm(RmsNormParams {
            eps: c.rms_eps,
            residual: false,
        }),
        &["x", "ln1"],
    );
    let q = g.add("q_proj", lin.clone(), &[&h1[0], "wq"]);
    let q4 = g.add(
        "q_heads",
        Op::SplitHeads(SplitHeadsParams {
            batch: b,
            heads: c.heads,
        }),
        &[&q[0]],
    );
    // the new tokens of the longest sequence sit at context - T .. context (the others' are
    // earlier, which RoPE would place per sequence; one offset keeps the graph one op)
    let qr = g.add(
        "q_rope",
        Op::Rope(RopeParams {
            base: c.rope_theta,
            position_offset: step.context - t,
        }),
        &[&q4[0]],
    );
    debug_assert_eq!(qr[0], att_inputs[0]);
    let att = g.add(
        "attention_decode",
        Op::AttentionDecode(AttentionDecodeParams {
            scale: None,
            block_size: step.block_size,
        }),
        &att_inputs,
    );
    let merged = g.add("merge_heads", Op::MergeHeads, &[&att[0]]);
    let o = g.add("o_proj", lin, &[&merged[0], "wo"]);
    let out = g.add("out", Op::Add, &[&o[0], "x"]);
    debug_assert_eq!(out[0], DECODE_OUTPUT);
    g.outputs = vec![out[0].clone()];
    g.validate()?;
    Ok(g)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> MixtralConfig {
        MixtralConfig {
            batch: 3,
            d_model: 128,
            heads: 2,
            kv_heads: 1,
            ..MixtralConfig::default()
        }
    }

    #[test]
    fn the_step_builds_with_varied_lengths_contiguous_and_paged() -> Result<()> {
        for block_size in [None, Some(16)] {
            let step = DecodeStep {
                new_tokens: 2,
                context: 70,
                block_size,
            };
            let lens = step.lengths(3);
            assert!(lens.iter().all(|&l| (2..=70).contains(&l)), "{lens:?}");
            assert!(lens.windows(2).any(|w| w[0] != w[1]), "{lens:?}");
            let g = decode_layer(&small(), &step, &Limits::host())?;
            let metas = g.validate()?;
            assert_eq!(metas[DECODE_OUTPUT].shape.to_vec(), vec![6, 128]);
            let node = g
                .nodes
                .iter()
                .find(|n| n.op.kind() == crate::ops::OpKind::AttentionDecode)
                .ok_or_else(|| Error::Internal("no decode node".into()))?;
            assert_eq!(node.inputs.len(), 4 + usize::from(block_size.is_some()));
        }
        Ok(())
    }

    #[test]
    fn bad_sizes_name_the_setting() {
        let step = |t, ctx, bs| DecodeStep {
            new_tokens: t,
            context: ctx,
            block_size: bs,
        };
        let l = Limits::host();
        for (s, c, want) in [
            (step(17, 100, None), small(), "accepted: 1..=16"),
            (step(4, 3, None), small(), "--context 3"),
            (step(1, 100, Some(24)), small(), "--block-size 24"),
            (
                step(1, 100, None),
                MixtralConfig {
                    d_model: 96,
                    ..small()
                },
                "head dim 48",
            ),
        ] {
            let e = decode_layer(&c, &s, &l).expect_err(want).to_string();
            assert!(e.contains(want), "{e}");
        }
    }
}
