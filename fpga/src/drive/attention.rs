//! The streaming attention kernel's driver: all heads of one op, one launch per GQA group
//! (the query heads that share a kv head and a score multiplier: the kernel's `heads`
//! register), each kv head's K and V written to the card once (semantics per head:
//! [`crate::golden::attention::attention`]); with [`run_attention_split`] any number of keys,
//! K/V split into ranges of at most `nkv_max` keys whose parts are merged per row
//! ([`crate::golden::attention::attention_chunked`]). The head dimension is zero padded
//! to a multiple of 8 here (a zero column changes no score and gives a zero output column,
//! dropped on the way back).

use std::time::Duration;

use super::{Scratch, bad, bytes_of, launch, read, u32_of, with_scratch};
use crate::device::{DeviceBuffer, FpgaDevice, FpgaError, RunStats};
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

/// Most query heads one launch takes (the kernel's `heads` register allows 1024).
pub const MAX_GROUP: usize = 64;

/// Runs every query head on `dev` (which must have the attention kernel loaded), all within
/// `timeout`: the query heads that share a kv head and a score multiplier run in one launch
/// (the kernel's `heads` register, at most [`MAX_GROUP`]), so each kv head's K and V are
/// written once and read once per group. Returns each head's output (o `[Nq, D]`, per row e
/// and l) in the order of `heads`, and the counters with `cycles` and `wall` summed over the
/// launches.
pub fn run_attention(
    dev: &mut dyn FpgaDevice,
    dims: AttentionDims,
    kv: &[KvHead<'_>],
    heads: &[QueryHead<'_>],
    timeout: Duration,
) -> Result<(Vec<AttentionOut>, RunStats), FpgaError> {
    run_attention_split(dev, usize::MAX, dims, kv, heads, timeout)
}

/// [`run_attention`] for any number of keys: K/V in ranges of at most `nkv_max` keys (the
/// build's), one launch per (group, range) with the range's `kv_skip` for the causal mask,
/// the parts merged per row by [`crate::golden::attention::merge_parts`] (bit for bit
/// [`crate::golden::attention::attention_chunked`]).
pub fn run_attention_split(
    dev: &mut dyn FpgaDevice,
    nkv_max: usize,
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
    // groups: heads with the same kv head and score multiplier, in order of appearance
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for (i, h) in heads.iter().enumerate() {
        let same = |g: &Vec<usize>| {
            let f = &heads[g[0]];
            g.len() < MAX_GROUP
                && f.kv == h.kv
                && f.score_mult == h.score_mult
                && f.score_shift == h.score_shift
        };
        match groups.iter_mut().find(|g| same(g)) {
            Some(g) => g.push(i),
            None => groups.push(vec![i]),
        }
    }
    let gmax = groups.iter().map(Vec::len).max().unwrap_or(1);
    let ranges = crate::golden::attention::kv_chunks(nkv, nkv_max);
    with_scratch(dev, |dev, s: &mut Scratch| {
        let mut kvb = Vec::with_capacity(kv.len());
        for h in kv {
            let kb = s.upload(dev, &bytes_of(&pad_x(h.k, nkv, d)))?;
            let vb = s.upload(dev, &bytes_of(&pad_x(h.v, nkv, d)))?;
            kvb.push((kb, vb));
        }
        let qb = s.alloc(dev, gmax * nq * dp)?;
        let (obytes, sbytes) = (gmax * nq * dp * 2, gmax * nq * 8);
        let ob = s.alloc(dev, obytes)?;
        let sb = s.alloc(dev, sbytes)?;
        // One deadline for all the launches of the op.
        let deadline = std::time::Instant::now().checked_add(timeout);
        let mut outs: Vec<Option<AttentionOut>> = vec![None; heads.len()];
        let mut total = RunStats::default();
        for g in &groups {
            let first = &heads[g[0]];
            let (kb, vb) = &kvb[first.kv];
            let qs: Vec<u8> = g
                .iter()
                .flat_map(|&i| bytes_of(&pad_x(heads[i].q, nq, d)))
                .collect();
            super::write(dev, &qb, &qs)?;
            let (go, gs) = (g.len() * nq * dp * 2, g.len() * nq * 8);
            let mut parts: Vec<Vec<AttentionOut>> = vec![Vec::new(); g.len()];
            for r in &ranges {
                let at = |b: &DeviceBuffer| DeviceBuffer {
                    addr: b.addr + (r.start * dp) as u64,
                    len: (r.len() * dp) as u64,
                    ..*b
                };
                let (kr, vr) = (at(kb), at(vb));
                let pointers = [
                    ("q", &qb),
                    ("k", &kr),
                    ("v", &vr),
                    ("o", &ob),
                    ("stats", &sb),
                ];
                let scalars = [
                    ("nq", u32_of(KERNEL, "nq", nq)?),
                    ("nkv", u32_of(KERNEL, "nkv", r.len())?),
                    ("d", u32_of(KERNEL, "d", dp)?),
                    ("causal", u32::from(causal)),
                    ("score_mult", u32::from(first.score_mult)),
                    ("score_shift", u32::from(first.score_shift)),
                    ("heads", u32_of(KERNEL, "heads", g.len())?),
                    ("kv_skip", u32_of(KERNEL, "kv_skip", nkv - r.end)?),
                ];
                let left = deadline.map_or(timeout, |d| {
                    d.saturating_duration_since(std::time::Instant::now())
                });
                let st = launch(dev, &pointers, &scalars, left)?;
                total = RunStats {
                    cycles: total.cycles + st.cycles,
                    total_cycles: st.total_cycles,
                    wall: total.wall + st.wall,
                };
                let o = read(dev, &ob, go)?;
                let stats = read(dev, &sb, gs)?;
                for (h, part) in parts.iter_mut().enumerate() {
                    part.push(unpack(
                        &o[h * nq * dp * 2..(h + 1) * nq * dp * 2],
                        &stats[h * nq * 8..(h + 1) * nq * 8],
                        d,
                        dp,
                    ));
                }
            }
            for (&i, mut p) in g.iter().zip(parts) {
                outs[i] = Some(if p.len() == 1 {
                    p.pop().ok_or_else(|| bad(KERNEL, "no output".into()))?
                } else {
                    crate::golden::attention::merge_parts(&p, nq, d)
                });
            }
        }
        let outs = outs
            .into_iter()
            .map(|o| o.ok_or_else(|| bad(KERNEL, "a head without output".into())))
            .collect::<Result<Vec<_>, _>>()?;
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
