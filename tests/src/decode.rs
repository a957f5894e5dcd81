//! Decode-attention test data: a batch of sequences of their own lengths in a contiguous KV
//! cache, the same data scattered into a paged cache through a shuffled block table, and the
//! prefill problem of one sequence whose last rows a decode step must reproduce.
//!
//! Cache rows past a sequence's length, and blocks no sequence uses, hold NaN: a kernel that
//! reads them shows it in its output.

use ndarray::{ArrayD, IxDyn, s};
use rand::Rng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;
use tandem::ops::{AttentionDecodeParams, AttentionParams};
use tandem::{Op, Tensor};

/// A decode problem's sizes: `lens[b]` is sequence b's length (new tokens included), `nmax`
/// the contiguous cache's capacity.
#[derive(Debug, Clone, PartialEq)]
pub struct DecodeCase {
    /// Query heads.
    pub hq: usize,
    /// Key/value heads.
    pub hkv: usize,
    /// New queries per sequence.
    pub nq: usize,
    /// Head dimension.
    pub d: usize,
    /// Length of each sequence.
    pub lens: Vec<usize>,
    /// Capacity of the contiguous cache.
    pub nmax: usize,
}

impl DecodeCase {
    /// Sequences.
    pub fn b(&self) -> usize {
        self.lens.len()
    }

    /// The contiguous op.
    pub fn op(&self) -> Op {
        Op::AttentionDecode(AttentionDecodeParams::default())
    }

    /// The paged op with blocks of `bs` tokens.
    pub fn paged_op(&self, bs: usize) -> Op {
        Op::AttentionDecode(AttentionDecodeParams {
            scale: None,
            block_size: Some(bs),
        })
    }
}

/// Random inputs of the contiguous op: q and the caches uniform in [-1, 1) passed through
/// `round` (the storage precision under test), cache rows past each length NaN.
pub fn contiguous(c: &DecodeCase, r: &mut ChaCha8Rng, round: impl Fn(f32) -> f32) -> Vec<Tensor> {
    let mut rand = |shape: &[usize]| {
        ArrayD::from_shape_simple_fn(IxDyn(shape), || round(r.gen_range(-1.0f32..1.0)))
    };
    let q = rand(&[c.b(), c.hq, c.nq, c.d]);
    let mut k = rand(&[c.b(), c.hkv, c.nmax, c.d]);
    let mut v = rand(&[c.b(), c.hkv, c.nmax, c.d]);
    for (b, &l) in c.lens.iter().enumerate() {
        k.slice_mut(s![b, .., l.., ..]).fill(f32::NAN);
        v.slice_mut(s![b, .., l.., ..]).fill(f32::NAN);
    }
    let lens: Vec<i32> = c.lens.iter().map(|&l| l as i32).collect();
    vec![
        Tensor::from_f32(q),
        Tensor::from_f32(k),
        Tensor::from_f32(v),
        Tensor::from_vec_i32(&[c.b()], lens).expect("lens"),
    ]
}

/// The contiguous inputs' data in a paged cache of `bs`-token blocks: each sequence's blocks
/// at shuffled places among `spare` more blocks than needed (NaN, as are rows past a length),
/// block-table entries past a sequence's last block -1.
pub fn paged(
    c: &DecodeCase,
    contiguous: &[Tensor],
    bs: usize,
    spare: usize,
    r: &mut ChaCha8Rng,
) -> Vec<Tensor> {
    let per: Vec<usize> = c.lens.iter().map(|l| l.div_ceil(bs)).collect();
    let max_blocks = c.nmax.div_ceil(bs);
    let used: usize = per.iter().sum();
    let nb = used + spare;
    let mut ids: Vec<usize> = (0..nb).collect();
    ids.shuffle(r);
    let mut table = vec![-1i32; c.b() * max_blocks];
    let shape = [nb, c.hkv, bs, c.d];
    let mut kc = ArrayD::from_elem(IxDyn(&shape), f32::NAN);
    let mut vc = ArrayD::from_elem(IxDyn(&shape), f32::NAN);
    let (k, v) = (
        contiguous[1].as_f32().expect("k"),
        contiguous[2].as_f32().expect("v"),
    );
    let mut next = ids.into_iter();
    for (b, &l) in c.lens.iter().enumerate() {
        for j in 0..per[b] {
            let blk = next.next().expect("enough blocks");
            table[b * max_blocks + j] = blk as i32;
            for t in j * bs..((j + 1) * bs).min(l) {
                for g in 0..c.hkv {
                    for e in 0..c.d {
                        kc[[blk, g, t - j * bs, e]] = k[[b, g, t, e]];
                        vc[[blk, g, t - j * bs, e]] = v[[b, g, t, e]];
                    }
                }
            }
        }
    }
    vec![
        contiguous[0].clone(),
        Tensor::from_f32(kc),
        Tensor::from_f32(vc),
        contiguous[3].clone(),
        Tensor::from_vec_i32(&[c.b(), max_blocks], table).expect("table"),
    ]
}

/// Sequence `b` as a prefill problem: the attention op (bottom-right causal) and its inputs,
/// q [1, Hq, L, D] with the decode queries as its last Nq rows (random rows before), K and V
/// [1, Hkv, L, D] the sequence's cache rows. Its last Nq output rows are what decode computes.
pub fn prefill(
    c: &DecodeCase,
    contiguous: &[Tensor],
    b: usize,
    r: &mut ChaCha8Rng,
) -> (Op, Vec<Tensor>) {
    let l = c.lens[b];
    let (q, k, v) = (
        contiguous[0].as_f32().expect("q"),
        contiguous[1].as_f32().expect("k"),
        contiguous[2].as_f32().expect("v"),
    );
    let mut qf =
        ArrayD::from_shape_simple_fn(IxDyn(&[1, c.hq, l, c.d]), || r.gen_range(-1.0f32..1.0));
    qf.slice_mut(s![0, .., l - c.nq.., ..])
        .assign(&q.slice(s![b, .., .., ..]));
    let cut = |a: &ArrayD<f32>| a.slice(s![b..b + 1, .., ..l, ..]).to_owned().into_dyn();
    let op = Op::Attention(AttentionParams {
        causal: true,
        scale: None,
    });
    (
        op,
        vec![
            Tensor::from_f32(qf),
            Tensor::from_f32(cut(k)),
            Tensor::from_f32(cut(v)),
        ],
    )
}

/// The last `nq` rows of a prefill output ([1, H, L, D] or [1, H, L]), as decode lays out
/// sequence b's rows ([H, Nq, D] or [H, Nq]).
pub fn last_rows(out: &ArrayD<f64>, nq: usize) -> ArrayD<f64> {
    let l = out.shape()[2];
    match out.ndim() {
        4 => out.slice(s![0, .., l - nq.., ..]).to_owned().into_dyn(),
        _ => out.slice(s![0, .., l - nq..]).to_owned().into_dyn(),
    }
}

/// Sequence b's rows of a decode output ([B, H, Nq, D] or [B, H, Nq]).
pub fn sequence_rows(out: &ArrayD<f64>, b: usize) -> ArrayD<f64> {
    out.index_axis(ndarray::Axis(0), b).to_owned()
}
