//! The streaming attention kernel's driver: all heads of one op, one launch per query head,
//! each kv head's K and V written to the card once and shared by its query group (semantics
//! of one launch: [`crate::golden::attention::attention`]). The head dimension is zero padded
//! to a multiple of 8 here (a zero column changes no score and gives a zero output column,
//! dropped on the way back).

use std::time::Duration;

use super::{Scratch, bad, bytes_of, launch, read, u32_of, with_scratch};
use crate::device::{FpgaDevice, FpgaError, RunStats};
use crate::golden::attention::{AttentionConfig, AttentionOut};
use crate::kernels::gemm::{pad_x, pad8};

const KERNEL: &str = "attention";

/// The sizes every head of an attention op shares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionDims {
    /// Query rows.
    pub nq: usize,
    /// Key/value rows.
    pub nkv: usize,
    /// Head dimension (unpadded).
    pub d: usize,
    /// Apply the bottom-right causal mask.
    pub causal: bool,
}

/// K and V of one kv head, int8 `[Nkv, D]` each.
#[derive(Debug, Clone, Copy)]
pub struct KvHead<'a> {
    /// Keys.
    pub k: &'a [i8],
    /// Values.
    pub v: &'a [i8],
}

/// One query head: int8 `q [Nq, D]`, the kv head it attends to and its score multiplier
/// ([`AttentionConfig::score_multiplier`]).
#[derive(Debug, Clone, Copy)]
pub struct QueryHead<'a> {
    /// Queries.
    pub q: &'a [i8],
    /// Index into the kv heads.
    pub kv: usize,
    /// Score multiplier (unsigned 16 bit).
    pub score_mult: u16,
    /// Score shift.
    pub score_shift: u8,
}

/// Runs every query head on `dev` (which must have the attention kernel loaded), one launch
/// after another, all within `timeout`; K and V of each kv head are written once. Returns each head's output (o
/// `[Nq, D]`, per row e and l) in the order of `heads`, and the counters with `cycles` and
/// `wall` summed over the launches.
pub fn run_attention(
    dev: &mut dyn FpgaDevice,
    dims: AttentionDims,
    kv: &[KvHead<'_>],
    heads: &[QueryHead<'_>],
    timeout: Duration,
) -> Result<(Vec<AttentionOut>, RunStats), FpgaError> {
    let AttentionDims { nq, nkv, d, causal } = dims;
    if nq == 0 || nkv == 0 || d == 0 {
        return Err(bad(KERNEL, format!("zero-sized {dims:?}")));
    }
    if let Some(i) = kv
        .iter()
        .position(|h| h.k.len() != nkv * d || h.v.len() != nkv * d)
    {
        return Err(bad(
            KERNEL,
            format!("kv head {i}: lengths do not match {dims:?}"),
        ));
    }
    if let Some(i) = heads
        .iter()
        .position(|h| h.q.len() != nq * d || h.kv >= kv.len())
    {
        return Err(bad(
            KERNEL,
            format!(
                "query head {i}: q length or kv head index does not match {dims:?} and {} kv \
                 heads",
                kv.len()
            ),
        ));
    }
    let dp = pad8(d);
    let sizes = [
        ("nq", u32_of(KERNEL, "nq", nq)?),
        ("nkv", u32_of(KERNEL, "nkv", nkv)?),
        ("d", u32_of(KERNEL, "d", dp)?),
        ("causal", u32::from(causal)),
    ];
    let (obytes, sbytes) = (nq * dp * 2, nq * 8);
    with_scratch(dev, |dev, s: &mut Scratch| {
        let mut kvb = Vec::with_capacity(kv.len());
        for h in kv {
            let kb = s.upload(dev, &bytes_of(&pad_x(h.k, nkv, d)))?;
            let vb = s.upload(dev, &bytes_of(&pad_x(h.v, nkv, d)))?;
            kvb.push((kb, vb));
        }
        let qb = s.alloc(dev, nq * dp)?;
        let ob = s.alloc(dev, obytes)?;
        let sb = s.alloc(dev, sbytes)?;
        // One deadline for all the launches of the op.
        let deadline = std::time::Instant::now().checked_add(timeout);
        let mut outs = Vec::with_capacity(heads.len());
        let mut total = RunStats::default();
        for h in heads {
            let (kb, vb) = &kvb[h.kv];
            super::write(dev, &qb, &bytes_of(&pad_x(h.q, nq, d)))?;
            let pointers = [("q", &qb), ("k", kb), ("v", vb), ("o", &ob), ("stats", &sb)];
            let mut scalars = sizes.to_vec();
            scalars.push(("score_mult", u32::from(h.score_mult)));
            scalars.push(("score_shift", u32::from(h.score_shift)));
            let left = deadline.map_or(timeout, |d| {
                d.saturating_duration_since(std::time::Instant::now())
            });
            let st = launch(dev, &pointers, &scalars, left)?;
            total = RunStats {
                cycles: total.cycles + st.cycles,
                total_cycles: st.total_cycles,
                wall: total.wall + st.wall,
            };
            let o = read(dev, &ob, obytes)?;
            let stats = read(dev, &sb, sbytes)?;
            outs.push(unpack(&o, &stats, d, dp));
        }
        Ok((outs, total))
    })
}

/// Runs one head (the arguments of [`crate::golden::attention::attention`]) on `dev`, which
/// must have the attention kernel loaded with `kv_tile == cfg.kv_tile`.
pub fn run_attention_head(
    dev: &mut dyn FpgaDevice,
    q: &[i8],
    k: &[i8],
    v: &[i8],
    cfg: &AttentionConfig,
    timeout: Duration,
) -> Result<(AttentionOut, RunStats), FpgaError> {
    let dims = AttentionDims {
        nq: cfg.nq,
        nkv: cfg.nkv,
        d: cfg.d,
        causal: cfg.causal,
    };
    let head = QueryHead {
        q,
        kv: 0,
        score_mult: cfg.score_mult,
        score_shift: cfg.score_shift,
    };
    let (mut outs, st) = run_attention(dev, dims, &[KvHead { k, v }], &[head], timeout)?;
    let out = outs
        .pop()
        .ok_or_else(|| bad(KERNEL, "no output for the head".into()))?;
    Ok((out, st))
}

/// One head's output from the kernel's o rows (`[Nq][dp]` int16) and stats words (per row,
/// e in the low and l in the high 32 bits).
fn unpack(o: &[u8], stats: &[u8], d: usize, dp: usize) -> AttentionOut {
    let mut out = AttentionOut {
        o: Vec::with_capacity(o.len() / (2 * dp) * d),
        e: Vec::with_capacity(stats.len() / 8),
        l: Vec::with_capacity(stats.len() / 8),
    };
    for row in o.chunks_exact(dp * 2) {
        out.o.extend(
            row.chunks_exact(2)
                .take(d)
                .map(|c| i16::from_le_bytes([c[0], c[1]])),
        );
    }
    for w in stats.chunks_exact(8) {
        out.e.push(i32::from_le_bytes([w[0], w[1], w[2], w[3]]));
        out.l.push(u32::from_le_bytes([w[4], w[5], w[6], w[7]]));
    }
    out
}
