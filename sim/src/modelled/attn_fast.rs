//! The attention kernel's results (`tandem_fpga::golden::attention::attention_skip`, every
//! head of a GQA group) bit for bit, with AVX-512 VNNI.
//!
//! The golden model walks each row's keys one at a time. Here the scores of a block of rows
//! are one int8 GEMM against the packed K (`super::sums`: exact, `|s| <= 2^22` cannot wrap),
//! the per-tile online softmax is the golden model's own scalar steps (`logit`, `weight`,
//! `rescale`, `normalise`: the same functions), and `p v` is `vpdpbusd` over 4 keys at a
//! time: `p <= 2^15` split into its low byte and its high byte (`<= 128`), both unsigned, with
//! V (signed) packed as `[key / 4][d][4]`, so `p v = 256 (p_hi v) + p_lo v`. These int32
//! partial sums are exact (at most 256 keys between flushes: `256 (2^15 2^7) = 2^30`), and
//! are added to the 48-bit accumulators before every rescale and at the row's end, so each
//! accumulator holds the golden model's value at every rescale: the same bits.

use std::sync::atomic::{AtomicUsize, Ordering};

use tandem_fpga::golden::attention::{
    AttentionConfig, AttentionOut, FRAC, LUT_SIZE, exp2_lut, logit, normalise, rescale, weight,
};

use super::sums;

/// Query rows a score block.
const ROWS: usize = 32;
/// Keys between flushes of the int32 partial sums into the accumulators.
const FLUSH_KEYS: usize = 256;

/// Every head of a group: `q` holds `heads` heads of `nq` rows of `d` (int8 as the card's
/// bytes), `k` and `v` `nkv` rows of `d`; one [`AttentionOut`] per head. `None` where the CPU
/// lacks AVX-512 VNNI, or the configuration is not one this path takes (`kv_tile` not a
/// multiple of 4, `d` not a multiple of 4, lengths off): the caller runs the golden model.
pub(super) fn attention_group(
    q: &[u8],
    k: &[u8],
    v: &[u8],
    cfg: &AttentionConfig,
    kv_skip: usize,
    heads: usize,
) -> Option<Vec<AttentionOut>> {
    let (nq, nkv, d) = (cfg.nq, cfg.nkv, cfg.d);
    if !sums::has_vnni()
        || !has_dq_vl()
        || cfg.kv_tile == 0
        || !cfg.kv_tile.is_multiple_of(4)
        || d == 0
        || !d.is_multiple_of(4)
        || d > tandem_fpga::golden::attention::MAX_D
        || nkv == 0
        || nkv > tandem_fpga::golden::attention::MAX_NKV
        || q.len() != heads * nq * d
        || k.len() != nkv * d
        || v.len() != nkv * d
    {
        return None;
    }
    // K as the sums' packed W (n = nkv columns of d); V as [key / 4][d16][4]
    let mut kp = Vec::new();
    sums::pack_stream(
        &mut kp,
        &sums::WStream {
            even: k,
            odd: None,
            stripe: 1,
            lanes: 1,
            np: nkv,
            kp: d,
        },
    );
    let d16 = d.div_ceil(16) * 16;
    let quads = nkv.div_ceil(4);
    let mut vp = vec![0u8; quads * d16 * 4];
    for (j, row) in v.chunks_exact(d).enumerate() {
        let base = (j / 4) * d16 * 4 + j % 4;
        for (c, &b) in row.iter().enumerate() {
            vp[base + c * 4] = b;
        }
    }
    let lut = exp2_lut();
    let ctx = Ctx {
        q,
        kp: &kp,
        vp: &vp,
        cfg,
        kv_skip,
        lut: &lut,
        d16,
    };
    let blocks = nq.div_ceil(ROWS);
    let items = heads * blocks;
    let next = AtomicUsize::new(0);
    let threads = std::thread::available_parallelism().map_or(1, |t| t.get());
    let mut outs: Vec<AttentionOut> = (0..heads)
        .map(|_| AttentionOut {
            o: vec![0; nq * d],
            e: vec![i32::MIN; nq],
            l: vec![0; nq],
        })
        .collect();
    // items from the last block of each head down (the causal rows' work grows with the row
    // index), taken by whichever thread is free
    let order = |i: usize| (i % heads, blocks - 1 - i / heads);
    let done: Vec<Vec<(usize, usize, Block)>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads.min(items).max(1))
            .map(|_| {
                let (ctx, next) = (&ctx, &next);
                s.spawn(move || {
                    let mut mine = Vec::new();
                    let mut scratch = Scratch::default();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= items {
                            break;
                        }
                        let (h, b) = order(i);
                        // SAFETY: the CPU has AVX-512 F/BW/DQ/VL and VNNI (checked on entry).
                        mine.push((h, b, unsafe { ctx.block_avx512(h, b, &mut scratch) }));
                    }
                    mine
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_default())
            .collect()
    });
    let mut seen = 0;
    for (h, b, blk) in done.into_iter().flatten() {
        let r0 = b * ROWS;
        let rows = blk.e.len();
        let out = &mut outs[h];
        out.o[r0 * d..(r0 + rows) * d].copy_from_slice(&blk.o);
        out.e[r0..r0 + rows].copy_from_slice(&blk.e);
        out.l[r0..r0 + rows].copy_from_slice(&blk.l);
        seen += 1;
    }
    // a worker that panicked left its blocks out: let the golden model answer
    (seen == items).then_some(outs)
}

/// AVX-512 DQ and VL (besides [`sums::has_vnni`]'s), for [`Ctx::block_avx512`].
fn has_dq_vl() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512dq")
            && std::arch::is_x86_feature_detected!("avx512vl")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// One block's rows: o, e, l.
#[derive(Debug, Default)]
struct Block {
    o: Vec<i16>,
    e: Vec<i32>,
    l: Vec<u32>,
}

/// A worker's buffers.
#[derive(Debug, Default)]
struct Scratch {
    s: Vec<i32>,
    rs: Vec<i32>,
    t: Vec<i64>,
    p: Vec<u32>,
    words: Vec<(u32, u32)>,
    lo: Vec<i32>,
    hi: Vec<i32>,
    acc: Vec<i64>,
}

/// What every block reads.
struct Ctx<'a> {
    q: &'a [u8],
    kp: &'a [u8],
    vp: &'a [u8],
    cfg: &'a AttentionConfig,
    kv_skip: usize,
    lut: &'a [u16; LUT_SIZE],
    d16: usize,
}

impl Ctx<'_> {
    /// Keys row `i` sees: `0..end`.
    fn end(&self, i: usize) -> usize {
        let c = self.cfg;
        if c.causal {
            (i + c.nkv + self.kv_skip + 1)
                .saturating_sub(c.nq)
                .min(c.nkv)
        } else {
            c.nkv
        }
    }

    /// [`Ctx::block`] compiled for AVX-512 (the row loops vectorise).
    ///
    /// # Safety
    /// The CPU has AVX-512 F, BW, DQ, VL and VNNI.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")]
    unsafe fn block_avx512(&self, h: usize, b: usize, sc: &mut Scratch) -> Block {
        self.block(h, b, sc)
    }

    /// [`Ctx::block`] (no AVX-512 off x86-64; not reached: [`sums::has_vnni`] is false).
    ///
    /// # Safety
    /// None needed.
    #[cfg(not(target_arch = "x86_64"))]
    unsafe fn block_avx512(&self, h: usize, b: usize, sc: &mut Scratch) -> Block {
        self.block(h, b, sc)
    }

    /// Rows `b ROWS..` of head `h`.
    #[inline(always)]
    fn block(&self, h: usize, b: usize, sc: &mut Scratch) -> Block {
        let (nq, nkv, d) = (self.cfg.nq, self.cfg.nkv, self.cfg.d);
        let r0 = b * ROWS;
        let rows = ROWS.min(nq - r0);
        let mut out = Block {
            o: vec![0; rows * d],
            e: vec![i32::MIN; rows],
            l: vec![0; rows],
        };
        // the scores of every key any row of the block sees (whole 64-key panels)
        let keys = self.end(r0 + rows - 1);
        if keys == 0 {
            return out;
        }
        let n = if keys.div_ceil(64) * 64 >= nkv {
            nkv
        } else {
            keys.div_ceil(64) * 64
        };
        let x = &self.q[(h * nq + r0) * d..(h * nq + r0 + rows) * d];
        sc.rs = sums::row_sums(x, d, rows, d);
        sums::start_y(&mut sc.s, None, &sc.rs, n);
        if !sums::sums_packed_serial(x, d, self.kp, &mut sc.s, (rows, n, d)) {
            return out;
        }
        let scores = std::mem::take(&mut sc.s);
        for r in 0..rows {
            let end = self.end(r0 + r);
            if let Some((e, l)) = self.row(&scores[r * n..r * n + end], sc) {
                out.e[r] = e;
                out.l[r] = l;
                for (o, &a) in out.o[r * d..(r + 1) * d].iter_mut().zip(&sc.acc) {
                    *o = normalise(a, l);
                }
            }
        }
        sc.s = scores;
        out
    }

    /// One row over its visible scores `s`: (e, l), `sc.acc` left holding its accumulators.
    #[inline(always)]
    fn row(&self, s: &[i32], sc: &mut Scratch) -> Option<(i32, u32)> {
        let cfg = self.cfg;
        let (d16, tile) = (self.d16, cfg.kv_tile);
        sc.acc.clear();
        sc.acc.resize(d16, 0);
        sc.lo.clear();
        sc.lo.resize(d16, 0);
        sc.hi.clear();
        sc.hi.resize(d16, 0);
        // every visible key's log2-domain logit (the golden model's `logit`), in one loop
        sc.t.clear();
        sc.t.extend(
            s.iter()
                .map(|&sj| logit(sj, cfg.score_mult, cfg.score_shift)),
        );
        let mut pending = 0usize;
        let mut e: Option<i64> = None;
        let mut l: u32 = 0;
        for j0 in (0..s.len()).step_by(tile) {
            let j1 = (j0 + tile).min(s.len());
            let tmax = sc.t[j0..j1].iter().copied().fold(i64::MIN, i64::max);
            let et = (tmax + 255) >> FRAC;
            match e {
                None => e = Some(et),
                Some(eo) if et > eo => {
                    let sh = u32::try_from(et - eo).unwrap_or(u32::MAX);
                    flush(sc);
                    pending = 0;
                    l = rescale(i64::from(l), sh) as u32;
                    sc.acc.iter_mut().for_each(|a| *a = rescale(*a, sh));
                    e = Some(et);
                }
                Some(_) => {}
            }
            if pending + (j1 - j0) > FLUSH_KEYS {
                flush(sc);
                pending = 0;
            }
            pending += j1 - j0;
            let ecur = e.unwrap_or(et);
            // the tile's weights (zero past its end, to a whole quad: j0 is a multiple of 4),
            // then 4 keys a word: low and high bytes
            sc.p.clear();
            sc.p.extend(
                sc.t[j0..j1]
                    .iter()
                    .map(|&t| weight((ecur << FRAC) - t, self.lut)),
            );
            l += sc.p.iter().sum::<u32>();
            sc.p.resize((j1 - j0).div_ceil(4) * 4, 0);
            sc.words.clear();
            sc.words.extend(sc.p.chunks_exact(4).map(|q| {
                let lo = (q[0] & 255) | (q[1] & 255) << 8 | (q[2] & 255) << 16 | (q[3] & 255) << 24;
                let hi = (q[0] >> 8) | (q[1] >> 8) << 8 | (q[2] >> 8) << 16 | (q[3] >> 8) << 24;
                (lo, hi)
            }));
            let vq = &self.vp[j0 / 4 * d16 * 4..];
            pv(&mut sc.lo, &mut sc.hi, &sc.words, vq, d16);
        }
        flush(sc);
        e.map(|ev| {
            (
                ev.clamp(i64::from(i32::MIN) + 1, i64::from(i32::MAX)) as i32,
                l,
            )
        })
    }
}

/// `acc += 256 hi + lo`, then `lo = hi = 0`.
fn flush(sc: &mut Scratch) {
    for ((a, lo), hi) in sc.acc.iter_mut().zip(&mut sc.lo).zip(&mut sc.hi) {
        *a += i64::from(*hi) * 256 + i64::from(*lo);
        (*lo, *hi) = (0, 0);
    }
}

/// `lo[c] += sum_a sum_j wl[a][j] v[4a + j][c]`, `hi` alike with the high bytes, over the
/// quads of `words` (V packed from `vq` on, `d16 4` bytes a quad).
fn pv(lo: &mut [i32], hi: &mut [i32], words: &[(u32, u32)], vq: &[u8], d16: usize) {
    assert!(
        vq.len() >= words.len() * d16 * 4 && lo.len() >= d16 && hi.len() >= d16,
        "pv: operands too short"
    );
    #[cfg(target_arch = "x86_64")]
    if sums::has_vnni() {
        // SAFETY: the CPU has AVX-512 F/BW/VNNI; `vq` holds `words.len()` quads of `d16 4`
        // bytes, `lo` and `hi` `d16` values (the assert above).
        unsafe { vnni_pv::pv(lo, hi, words, vq, d16) };
        return;
    }
    for (a, &(wl, wh)) in words.iter().enumerate() {
        let (wl, wh) = (wl.to_le_bytes(), wh.to_le_bytes());
        for c in 0..d16 {
            for j in 0..4 {
                let v = i32::from(vq[a * d16 * 4 + c * 4 + j] as i8);
                lo[c] += i32::from(wl[j]) * v;
                hi[c] += i32::from(wh[j]) * v;
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod vnni_pv {
    use std::arch::x86_64::{
        __m512i, _mm512_dpbusd_epi32, _mm512_loadu_si512, _mm512_set1_epi32, _mm512_storeu_si512,
    };

    /// `C` vectors of 16 lanes of `lo` and `hi` from lane `c0`.
    ///
    /// # Safety
    /// AVX-512 F/BW/VNNI; `lo`, `hi` have `c0 + 16 C` values; `vq` holds `words.len()` quads
    /// of `stride` bytes, each with `64 (c0 / 16 + C)` bytes.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn chunk<const C: usize>(
        lo: *mut i32,
        hi: *mut i32,
        words: &[(u32, u32)],
        vq: *const u8,
        stride: usize,
    ) {
        // SAFETY: C vectors of lo and hi from here (the caller's promise).
        let mut al: [__m512i; C] =
            std::array::from_fn(|c| unsafe { _mm512_loadu_si512(lo.add(16 * c).cast()) });
        // SAFETY: as above.
        let mut ah: [__m512i; C] =
            std::array::from_fn(|c| unsafe { _mm512_loadu_si512(hi.add(16 * c).cast()) });
        for (a, &(wl, wh)) in words.iter().enumerate() {
            let (bl, bh) = (_mm512_set1_epi32(wl as i32), _mm512_set1_epi32(wh as i32));
            for c in 0..C {
                // SAFETY: quad a's vector c (the caller's promise).
                let v = unsafe { _mm512_loadu_si512(vq.add(a * stride + 64 * c).cast()) };
                al[c] = _mm512_dpbusd_epi32(al[c], bl, v);
                ah[c] = _mm512_dpbusd_epi32(ah[c], bh, v);
            }
        }
        for c in 0..C {
            // SAFETY: as for the loads.
            unsafe {
                _mm512_storeu_si512(lo.add(16 * c).cast(), al[c]);
                _mm512_storeu_si512(hi.add(16 * c).cast(), ah[c]);
            }
        }
    }

    /// [`super::pv`] with AVX-512 VNNI, up to 8 vectors of `lo` and `hi` at a time.
    ///
    /// # Safety
    /// AVX-512 F/BW/VNNI; `lo`, `hi` have `d16` values (a multiple of 16); `vq` holds
    /// `words.len()` quads of `4 d16` bytes.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub(super) unsafe fn pv(
        lo: &mut [i32],
        hi: &mut [i32],
        words: &[(u32, u32)],
        vq: &[u8],
        d16: usize,
    ) {
        let stride = d16 * 4;
        let vecs = d16 / 16;
        let mut c0 = 0;
        while c0 < vecs {
            let n = (vecs - c0).min(8);
            // SAFETY: vectors c0..c0+n of lo, hi and of every quad (the caller's promise).
            unsafe {
                let (l, h, v) = (
                    lo.as_mut_ptr().add(16 * c0),
                    hi.as_mut_ptr().add(16 * c0),
                    vq.as_ptr().add(64 * c0),
                );
                match n {
                    8 => chunk::<8>(l, h, words, v, stride),
                    7 => chunk::<7>(l, h, words, v, stride),
                    6 => chunk::<6>(l, h, words, v, stride),
                    5 => chunk::<5>(l, h, words, v, stride),
                    4 => chunk::<4>(l, h, words, v, stride),
                    3 => chunk::<3>(l, h, words, v, stride),
                    2 => chunk::<2>(l, h, words, v, stride),
                    _ => chunk::<1>(l, h, words, v, stride),
                }
            }
            c0 += n;
        }
    }
}

#[cfg(test)]
mod tests {
    use tandem_fpga::golden::attention::{AttentionConfig, attention_skip};

    use crate::modelled::sums::tests::values;

    fn bytes(a: &[i8]) -> Vec<u8> {
        a.iter().map(|&v| v as u8).collect()
    }

    #[test]
    fn equals_the_golden_model() {
        if !super::sums::has_vnni() {
            eprintln!("no AVX-512 VNNI: the golden model answers");
            return;
        }
        // (heads, nq, nkv, d, kv_tile, causal, kv_skip, mult, shift): odd rows and keys,
        // d off 16, short tiles, rescales (large and small score scales), rows without a
        // visible key (kv_skip 0 with nq > nkv), and a range of a longer sequence
        for (i, &(heads, nq, nkv, d, tile, causal, skip, mult, shift)) in [
            (1, 1, 1, 8, 4, false, 0, 40000u16, 20u8),
            (2, 37, 53, 24, 8, true, 0, 50000, 18),
            (4, 70, 300, 128, 16, true, 0, 60000, 22),
            (1, 100, 40, 64, 16, true, 0, 65535, 10),
            (3, 33, 129, 40, 12, true, 500, 30000, 19),
            (2, 65, 700, 16, 16, false, 0, 65535, 14),
            (1, 9, 1030, 256, 16, true, 3, 20000, 20),
            (2, 50, 260, 128, 4, true, 0, 1, 0),
        ]
        .iter()
        .enumerate()
        {
            let q = values(heads * nq * d, 3 + i as u64);
            let k = values(nkv * d, 5 + i as u64);
            let v = values(nkv * d, 7 + i as u64);
            let cfg = AttentionConfig {
                nq,
                nkv,
                d,
                kv_tile: tile,
                causal,
                score_mult: mult,
                score_shift: shift,
            };
            let got = super::attention_group(&bytes(&q), &bytes(&k), &bytes(&v), &cfg, skip, heads)
                .expect("the VNNI path takes it");
            for (h, g) in got.iter().enumerate() {
                let want = attention_skip(&q[h * nq * d..(h + 1) * nq * d], &k, &v, &cfg, skip)
                    .expect("golden");
                assert_eq!(g, &want, "case {i} head {h}");
            }
        }
    }
}
