//! `part_in + x w^T` over int8 operands: the GEMM kernel's int32 sums (`tandem_fpga::golden::
//! gemm::gemm_pass`), bit for bit, at host speed.
//!
//! int32 sums that wrap are the same in any order (addition modulo 2^32), so the work is cut
//! any way that is fast: rows over threads, K in blocks that keep a panel of W in the core's
//! L2, and on x86-64 with AVX2 a 2 x 4 register block of `vpmaddwd` on operands widened to
//! int16 (16 multiply-adds per instruction, each pair sum at most 2 * 128^2, so no lane can
//! overflow before the wrapping add into the output). Elsewhere a portable loop the compiler
//! vectorises.

/// K elements per block: a panel of [`N_BLOCK`] int16 rows of W is 256 KiB.
const K_BLOCK: usize = 1024;
/// W rows per panel.
const N_BLOCK: usize = 128;

/// `part_in + x w^T` for `x [m, k]`, `w [n, k]` (row-major int8), `part_in [m, n]`, as int32
/// sums that wrap.
#[cfg(test)]
pub(super) fn sums(
    x: &[i8],
    w: &[i8],
    part_in: Option<&[i32]>,
    (m, n, k): (usize, usize, usize),
) -> Vec<i32> {
    let kp = row_len(k);
    let (xw, ww) = (widen(&bytes(x), m, k, kp), widen(&bytes(w), n, k, kp));
    sums_wide(&xw, &ww, part_in, (m, n, k))
}

/// int8 values as the card's bytes.
#[cfg(test)]
fn bytes(a: &[i8]) -> Vec<u8> {
    a.iter().map(|&v| v as u8).collect()
}

/// The int16 row length the sums take for rows of `k` int8 values: `k` rounded up to 16.
pub(super) fn row_len(k: usize) -> usize {
    k.div_ceil(16) * 16
}

/// [`sums`] of operands already widened ([`widen`], [`unpack_w`]: rows of [`row_len`]`(k)`).
pub(super) fn sums_wide(
    xw: &[i16],
    ww: &[i16],
    part_in: Option<&[i32]>,
    (m, n, k): (usize, usize, usize),
) -> Vec<i32> {
    let mut y = match part_in {
        Some(p) => p[..m * n].to_vec(),
        None => vec![0i32; m * n],
    };
    if m == 0 || n == 0 || k == 0 {
        return y;
    }
    let kp = row_len(k);
    let threads = std::thread::available_parallelism().map_or(1, |t| t.get());
    // an even number of rows per thread, so that only the last chunk has an odd row
    let rows = m.div_ceil(threads).max(1).div_ceil(2) * 2;
    std::thread::scope(|s| {
        for (xs, ys) in xw.chunks(rows * kp).zip(y.chunks_mut(rows * n)) {
            s.spawn(move || add_block(xs, ww, ys, n, kp));
        }
    });
    y
}

/// int8 rows of `k` (as the card's bytes) -> int16 rows of `kp` (zero padded).
pub(super) fn widen(a: &[u8], rows: usize, k: usize, kp: usize) -> Vec<i16> {
    let mut out = vec![0i16; rows * kp];
    for (o, i) in out.chunks_exact_mut(kp).zip(a.chunks_exact(k.max(1))) {
        for (d, &s) in o.iter_mut().zip(i) {
            *d = i16::from(s as i8);
        }
    }
    out
}

/// The GEMM's packed W stream (for each tile of `lanes` rows and each k < `kp`, one beat
/// whose byte c is `w[tile lanes + c][k]`) -> int16 rows of `kp16`, tiles over threads.
pub(super) fn unpack_w(packed: &[u8], lanes: usize, kp: usize, kp16: usize) -> Vec<i16> {
    let tile_in = (lanes * kp).max(1);
    let tiles = packed.len() / tile_in;
    let tile_out = lanes * kp16;
    let mut w = vec![0i16; tiles * tile_out];
    let threads = std::thread::available_parallelism().map_or(1, |t| t.get());
    let per = tiles.div_ceil(threads).max(1);
    std::thread::scope(|s| {
        for (src, dst) in packed
            .chunks(per * tile_in)
            .zip(w.chunks_mut(per * tile_out))
        {
            s.spawn(move || {
                for (tin, tout) in src
                    .chunks_exact(tile_in)
                    .zip(dst.chunks_exact_mut(tile_out))
                {
                    for (kk, beat) in tin.chunks_exact(lanes).enumerate() {
                        for (c, &b) in beat.iter().enumerate() {
                            tout[c * kp16 + kk] = i16::from(b as i8);
                        }
                    }
                }
            });
        }
    });
    w
}

/// `y += x w^T` for int16 rows of `kp` (a multiple of 16), `y` row-major with `n` columns.
fn add_block(x: &[i16], w: &[i16], y: &mut [i32], n: usize, kp: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked just above).
            unsafe { avx2::add_block(x, w, y, n, kp) };
            return;
        }
    }
    add_block_portable(x, w, y, n, kp);
}

/// [`add_block`] without target features.
fn add_block_portable(x: &[i16], w: &[i16], y: &mut [i32], n: usize, kp: usize) {
    for k0 in (0..kp).step_by(K_BLOCK) {
        let k1 = (k0 + K_BLOCK).min(kp);
        for n0 in (0..n).step_by(N_BLOCK) {
            let n1 = (n0 + N_BLOCK).min(n);
            for (xr, yr) in x.chunks_exact(kp).zip(y.chunks_exact_mut(n)) {
                let xs = &xr[k0..k1];
                for (j, yv) in yr.iter_mut().enumerate().take(n1).skip(n0) {
                    let ws = &w[j * kp + k0..j * kp + k1];
                    *yv = yv.wrapping_add(dot(xs, ws));
                }
            }
        }
    }
}

/// Dot product of two int16 rows (of int8 values) of a multiple of 16 elements.
fn dot(a: &[i16], b: &[i16]) -> i32 {
    let mut acc = [0i32; 16];
    for (pa, pb) in a.chunks_exact(16).zip(b.chunks_exact(16)) {
        for i in 0..16 {
            acc[i] = acc[i].wrapping_add(i32::from(pa[i]) * i32::from(pb[i]));
        }
    }
    acc.iter().fold(0i32, |t, &v| t.wrapping_add(v))
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::{
        __m256i, _mm_add_epi32, _mm_cvtsi128_si32, _mm_hadd_epi32, _mm256_add_epi32,
        _mm256_castsi256_si128, _mm256_extracti128_si256, _mm256_loadu_si256, _mm256_madd_epi16,
        _mm256_setzero_si256,
    };

    use super::{K_BLOCK, N_BLOCK};

    /// Sum of the eight int32 lanes (wrapping).
    #[target_feature(enable = "avx2")]
    fn hsum(v: __m256i) -> i32 {
        let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
        let s = _mm_hadd_epi32(s, s);
        _mm_cvtsi128_si32(_mm_hadd_epi32(s, s))
    }

    /// 16 int16 elements at `p`.
    ///
    /// # Safety
    /// `p` points at 16 readable int16 values.
    #[target_feature(enable = "avx2")]
    unsafe fn load(p: *const i16) -> __m256i {
        // SAFETY: the caller's promise; unaligned loads are allowed.
        unsafe { _mm256_loadu_si256(p.cast()) }
    }

    /// Dot products of `R` rows of x with `C` rows of w over `len` (a multiple of 16)
    /// elements: `out[r][c]`.
    ///
    /// # Safety
    /// Every `xs[r]` and `ws[c]` points at `len` readable int16 values.
    #[target_feature(enable = "avx2")]
    unsafe fn micro<const R: usize, const C: usize>(
        xs: [*const i16; R],
        ws: [*const i16; C],
        len: usize,
    ) -> [[i32; C]; R] {
        let mut acc = [[_mm256_setzero_si256(); C]; R];
        let mut off = 0;
        while off < len {
            // SAFETY: off + 16 <= len, within every row (the caller's promise).
            let wv: [__m256i; C] = std::array::from_fn(|c| unsafe { load(ws[c].add(off)) });
            for r in 0..R {
                // SAFETY: as above.
                let xv = unsafe { load(xs[r].add(off)) };
                for c in 0..C {
                    acc[r][c] = _mm256_add_epi32(acc[r][c], _mm256_madd_epi16(xv, wv[c]));
                }
            }
            off += 16;
        }
        let mut out = [[0i32; C]; R];
        for r in 0..R {
            for c in 0..C {
                out[r][c] = hsum(acc[r][c]);
            }
        }
        out
    }

    /// `y[rows] += x[rows] w[n0..n1]^T` over `k0..k1`, `R` rows and up to 4 columns at a time.
    ///
    /// # Safety
    /// `x` holds `rows.end` rows of `kp`, `w` holds `n1` rows of `kp`, `k1 <= kp`, and `k1 -
    /// k0` is a multiple of 16.
    #[target_feature(enable = "avx2")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn rows<const R: usize>(
        x: &[i16],
        w: &[i16],
        y: &mut [i32],
        (n, kp): (usize, usize),
        r0: usize,
        (k0, k1): (usize, usize),
        (n0, n1): (usize, usize),
    ) {
        let len = k1 - k0;
        let xs: [*const i16; R] = std::array::from_fn(|r| x[(r0 + r) * kp + k0..].as_ptr());
        let wp = |j: usize| w[j * kp + k0..].as_ptr();
        let mut j = n0;
        while j + 4 <= n1 {
            // SAFETY: rows r0..r0+R of x and j..j+4 of w have `len` values from k0 on.
            let s = unsafe { micro::<R, 4>(xs, [wp(j), wp(j + 1), wp(j + 2), wp(j + 3)], len) };
            for (r, sr) in s.iter().enumerate() {
                let yr = &mut y[(r0 + r) * n + j..(r0 + r) * n + j + 4];
                for (yv, &v) in yr.iter_mut().zip(sr) {
                    *yv = yv.wrapping_add(v);
                }
            }
            j += 4;
        }
        while j < n1 {
            // SAFETY: as above, one row of w.
            let s = unsafe { micro::<R, 1>(xs, [wp(j)], len) };
            for (r, sr) in s.iter().enumerate() {
                let yv = &mut y[(r0 + r) * n + j];
                *yv = yv.wrapping_add(sr[0]);
            }
            j += 1;
        }
    }

    /// [`super::add_block`] with AVX2.
    ///
    /// # Safety
    /// The CPU has AVX2; `x` holds whole rows of `kp` (a multiple of 16), `w` holds `n` rows
    /// of `kp`, `y` has `n` columns per row of `x`.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn add_block(x: &[i16], w: &[i16], y: &mut [i32], n: usize, kp: usize) {
        let m = x.len() / kp;
        for k0 in (0..kp).step_by(K_BLOCK) {
            let k1 = (k0 + K_BLOCK).min(kp);
            for n0 in (0..n).step_by(N_BLOCK) {
                let n1 = (n0 + N_BLOCK).min(n);
                let mut r = 0;
                while r + 2 <= m {
                    // SAFETY: rows r, r+1 < m; w rows < n1 <= n; k1 <= kp, k1 - k0 % 16 == 0.
                    unsafe { rows::<2>(x, w, y, (n, kp), r, (k0, k1), (n0, n1)) };
                    r += 2;
                }
                if r < m {
                    // SAFETY: as above, one row.
                    unsafe { rows::<1>(x, w, y, (n, kp), r, (k0, k1), (n0, n1)) };
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(
        x: &[i8],
        w: &[i8],
        p: Option<&[i32]>,
        (m, n, k): (usize, usize, usize),
    ) -> Vec<i32> {
        let mut y = vec![0i32; m * n];
        for i in 0..m {
            for j in 0..n {
                let mut s = p.map_or(0, |p| p[i * n + j]);
                for kk in 0..k {
                    s = s.wrapping_add(i32::from(x[i * k + kk]) * i32::from(w[j * k + kk]));
                }
                y[i * n + j] = s;
            }
        }
        y
    }

    /// A deterministic stream of int8 values (xorshift), extremes included.
    fn values(len: usize, seed: u64) -> Vec<i8> {
        let mut s = seed | 1;
        (0..len)
            .map(|i| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                match i % 29 {
                    0 => -128,
                    1 => 127,
                    _ => (s >> 24) as i8,
                }
            })
            .collect()
    }

    #[test]
    fn equals_the_plain_loop_on_odd_shapes() {
        // odd m (a single-row tail), n off the 4-column block and the panel, k off 16 and
        // past one K block, partials that wrap
        for (m, n, k) in [
            (1, 1, 1),
            (3, 5, 17),
            (7, 131, 1030),
            (2, 4, 16),
            (5, 259, 2050),
            (33, 9, 3),
        ] {
            let x = values(m * k, (m * 31 + k) as u64);
            let w = values(n * k, (n * 17 + k) as u64);
            let p: Vec<i32> = (0..m * n)
                .map(|i| {
                    if i % 3 == 0 {
                        i32::MAX - i as i32
                    } else {
                        -(i as i32)
                    }
                })
                .collect();
            assert_eq!(
                sums(&x, &w, None, (m, n, k)),
                reference(&x, &w, None, (m, n, k))
            );
            assert_eq!(
                sums(&x, &w, Some(&p), (m, n, k)),
                reference(&x, &w, Some(&p), (m, n, k)),
                "m {m} n {n} k {k}"
            );
            let kp = k.div_ceil(16) * 16;
            let mut y = vec![0i32; m * n];
            add_block_portable(
                &widen(&bytes(&x), m, k, kp),
                &widen(&bytes(&w), n, k, kp),
                &mut y,
                n,
                kp,
            );
            assert_eq!(y, reference(&x, &w, None, (m, n, k)), "portable");
        }
    }

    #[test]
    fn all_minus_128_does_not_overflow_a_lane() {
        let (m, n, k) = (2, 4, 4096);
        let x = vec![-128i8; m * k];
        let w = vec![-128i8; n * k];
        assert_eq!(sums(&x, &w, None, (m, n, k)), vec![4096 * 16384; m * n]);
    }
}
