//! `part_in + x w^T` over int8 operands: the GEMM kernel's int32 sums (`tandem_fpga::golden::
//! gemm::gemm_pass`), bit for bit, at host speed.
//!
//! int32 sums that wrap are the same in any order (addition modulo 2^32), so the work is cut
//! any way that is fast. Three paths, picked at run time:
//!
//! - AVX-512 VNNI (`vpdpbusd`: 4 unsigned x signed byte products summed into each int32 lane,
//!   64 multiply-adds an instruction, no saturation): W is packed once per launch as
//!   `w + 128` (unsigned bytes) in panels of 64 columns, 4 consecutive k of a column in each
//!   int32 lane ([`pack_stream`]); x is read in place from card memory, 4 bytes of a row
//!   broadcast to every lane. So the lanes sum `x (w + 128)`, and the result takes off `128
//!   sum_k x` per row: `x w = x (w + 128) - 128 sum_k x`, exact modulo 2^32. Each lane adds
//!   at most 4 products of magnitude `<= 255 * 128` per instruction, wrapping (the sums are
//!   modulo 2^32 anyway). 6 x 64 register blocks (24 accumulators) over K blocks of 1024.
//! - AVX2: operands widened to int16, a 2 x 4 register block of `vpmaddwd` (16 multiply-adds
//!   per instruction, each pair sum at most 2 * 128^2, so no lane can overflow before the
//!   wrapping add into the output).
//! - Elsewhere a portable loop the compiler vectorises.

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

/// Buffers a card keeps between GEMM launches (no fresh pages, so no page faults, per
/// launch).
#[derive(Debug, Default)]
pub(super) struct Scratch {
    /// The packed W ([`pack_stream`]).
    pub w: Vec<u8>,
    /// x rows padded to whole quads, where the card's rows are not.
    pub x: Vec<u8>,
    /// The odd stripes of a striped W stream.
    pub odd: Vec<u8>,
    /// The int32 sums.
    pub y: Vec<i32>,
}

/// Starts the VNNI path's sums: `y = part_in - 128 sum_k x` (`part_le`: `m n` int32, little
/// endian; `rs`: the row sums of x, one per row), wrapping.
pub(super) fn start_y(y: &mut Vec<i32>, part_le: Option<&[u8]>, rs: &[i32], n: usize) {
    let m = rs.len();
    y.clear();
    y.resize(m * n, 0);
    for (r, (yr, &s)) in y.chunks_exact_mut(n.max(1)).zip(rs).enumerate() {
        let off = s.wrapping_mul(-128);
        match part_le {
            Some(p) => {
                let pr = &p[r * n * 4..(r + 1) * n * 4];
                for (v, b) in yr.iter_mut().zip(pr.chunks_exact(4)) {
                    *v = i32::from_le_bytes([b[0], b[1], b[2], b[3]]).wrapping_add(off);
                }
            }
            None => yr.iter_mut().for_each(|v| *v = off),
        }
    }
}

/// Columns of a panel of the packed W (four 16-lane vectors).
const NR: usize = 64;
/// x rows of a register block of the VNNI path.
const MR: usize = 6;
/// k quads (4 values) per K block of the VNNI path: a panel's block of W is 64 KiB.
const KQ_BLOCK: usize = 256;

/// Whether this CPU takes the AVX-512 VNNI path ([`pack_stream`], [`sums_packed`]).
pub(super) fn has_vnni() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The K length of the packed layout: `k` rounded up to 4 (whole int32 lanes).
pub(super) fn quad_len(k: usize) -> usize {
    k.div_ceil(4) * 4
}

/// Bytes of W packed by [`pack_stream`] for `n` columns of `k` values.
pub(super) fn packed_len(n: usize, k: usize) -> usize {
    n.div_ceil(16) * 16 * quad_len(k)
}

/// The GEMM's W stream (for each tile of `lanes` columns and each k < `kp`, one beat whose
/// byte c is `w[tile lanes + c][k]`), possibly striped: stripes of `stripe` bytes alternate
/// between `even` and `odd` (`odd` `None`: one buffer). `np` is a multiple of `lanes`; with
/// `odd`, `stripe` is a multiple of `lanes`.
#[derive(Debug, Clone, Copy)]
pub(super) struct WStream<'a> {
    /// The stream, or its even stripes.
    pub even: &'a [u8],
    /// The odd stripes, if striped.
    pub odd: Option<&'a [u8]>,
    /// Stripe bytes.
    pub stripe: usize,
    /// Columns per tile.
    pub lanes: usize,
    /// Columns (a multiple of `lanes`).
    pub np: usize,
    /// k values per column.
    pub kp: usize,
}

impl WStream<'_> {
    /// `len` stream bytes from offset `o` (within one beat, so within one stripe).
    fn bytes(&self, o: usize, len: usize) -> &[u8] {
        match self.odd {
            None => &self.even[o..o + len],
            Some(odd) => {
                let (s, r) = (o / self.stripe, o % self.stripe);
                let at = s / 2 * self.stripe + r;
                if s % 2 == 0 {
                    &self.even[at..at + len]
                } else {
                    &odd[at..at + len]
                }
            }
        }
    }
}

/// Packs W for [`sums_packed`] into `dst` (resized to [`packed_len`]): panels of [`NR`]
/// columns (the last one `n` rounded up to 16 wide), each `[k / 4][width][4]` bytes of `w +
/// 128` (`w ^ 0x80`), panels over threads. Padding (columns past `np`, k past `kp`) is 0x80 or
/// 0: x is zero there or the column is never stored.
pub(super) fn pack_stream(dst: &mut Vec<u8>, s: &WStream<'_>) {
    let (np, kp, lanes) = (s.np, s.kp, s.lanes.max(1));
    let k4 = quad_len(kp);
    let len = packed_len(np, kp);
    dst.clear();
    dst.resize(len, 0);
    if len == 0 {
        return;
    }
    let panel = NR * k4;
    let panels = len.div_ceil(panel);
    let threads = std::thread::available_parallelism().map_or(1, |t| t.get());
    let per = panels.div_ceil(threads).max(1);
    let zero = [0u8; NR];
    std::thread::scope(|sc| {
        for (ci, chunk) in dst.chunks_mut(per * panel).enumerate() {
            sc.spawn(move || {
                for (pi, out) in chunk.chunks_mut(panel).enumerate() {
                    let n0 = (ci * per + pi) * NR;
                    let width = out.len() / k4;
                    let n1 = (n0 + width).min(np);
                    for (q, oq) in out.chunks_exact_mut(width * 4).enumerate() {
                        // segments of the panel's columns that lie in one tile
                        let mut c0 = n0;
                        while c0 < n1 {
                            let tile = c0 / lanes;
                            let c1 = ((tile + 1) * lanes).min(n1);
                            let seg = c1 - c0;
                            let base = tile * lanes * kp + c0 % lanes;
                            let src: [&[u8]; 4] = std::array::from_fn(|j| {
                                let k = 4 * q + j;
                                if k < kp {
                                    s.bytes(base + k * lanes, seg)
                                } else {
                                    &zero[..seg]
                                }
                            });
                            let o = &mut oq[(c0 - n0) * 4..(c1 - n0) * 4];
                            for (i, d) in o.chunks_exact_mut(4).enumerate() {
                                let v = u32::from_le_bytes([
                                    src[0][i], src[1][i], src[2][i], src[3][i],
                                ]) ^ 0x8080_8080;
                                d.copy_from_slice(&v.to_le_bytes());
                            }
                            c0 = c1;
                        }
                    }
                }
            });
        }
    });
}

/// The operand lengths [`sums_packed`] and [`sums_packed_serial`] need (a caller's bug
/// otherwise: the card's own buffers are sized by the launch).
fn check_packed(
    what: &str,
    x: &[u8],
    xstride: usize,
    wp: &[u8],
    y: &[i32],
    (m, n, kp): (usize, usize, usize),
) {
    let k4 = quad_len(kp);
    assert!(
        xstride.is_multiple_of(4)
            && xstride >= k4
            && x.len() >= m.saturating_sub(1) * xstride + k4
            && wp.len() >= packed_len(n, kp)
            && y.len() >= m * n,
        "{what}: operands too short"
    );
}

/// `y += x w^T` over W packed by [`pack_stream`] (`n` columns, `kp` values each): `x` holds
/// `m` rows of `xstride` bytes (int8, `kp` values then anything, `xstride` a multiple of 4
/// and at least [`quad_len`]`(kp)`, the bytes from `kp` to `quad_len(kp)` zero), `y` `m` rows
/// of `n`. Returns `false` (and does nothing) where the CPU lacks AVX-512 VNNI.
pub(super) fn sums_packed(
    x: &[u8],
    xstride: usize,
    wp: &[u8],
    y: &mut [i32],
    (m, n, kp): (usize, usize, usize),
) -> bool {
    if !has_vnni() {
        return false;
    }
    check_packed("sums_packed", x, xstride, wp, y, (m, n, kp));
    let k4 = quad_len(kp);
    if m == 0 || n == 0 || kp == 0 {
        return true;
    }
    // chunks of rows (whole MR blocks, about 4 a thread) taken by whichever thread is free:
    // a thread that the OS holds back (another process on the core) takes fewer
    let threads = std::thread::available_parallelism().map_or(1, |t| t.get());
    let rows = m.div_ceil(threads * 4).max(96).div_ceil(MR) * MR;
    let chunks = std::sync::Mutex::new(y[..m * n].chunks_mut(rows * n).enumerate());
    std::thread::scope(|s| {
        for _ in 0..threads.min(m.div_ceil(rows)) {
            let chunks = &chunks;
            s.spawn(move || {
                loop {
                    let next = match chunks.lock() {
                        Ok(mut it) => it.next(),
                        Err(_) => None,
                    };
                    let Some((t, ys)) = next else {
                        break;
                    };
                    let xs = &x[t * rows * xstride..];
                    #[cfg(target_arch = "x86_64")]
                    // SAFETY: the CPU has AVX-512 F, BW and VNNI (has_vnni above); `xs` holds
                    // the chunk's rows of `xstride` (>= k4) bytes, `wp` the packed panels,
                    // `ys` the chunk's rows of `n` (the assert above).
                    unsafe {
                        vnni::add_rows(xs, xstride, wp, ys, n, k4)
                    };
                    #[cfg(not(target_arch = "x86_64"))]
                    let _ = (xs, ys);
                }
            });
        }
    });
    true
}

/// [`sums_packed`] on the calling thread: for callers that spread their own work over
/// threads. `n` is the packed W's column count, or a multiple of 64 below it (whole panels).
/// Returns `false` (and does nothing) where the CPU lacks AVX-512 VNNI.
pub(super) fn sums_packed_serial(
    x: &[u8],
    xstride: usize,
    wp: &[u8],
    y: &mut [i32],
    (m, n, kp): (usize, usize, usize),
) -> bool {
    if !has_vnni() {
        return false;
    }
    check_packed("sums_packed_serial", x, xstride, wp, y, (m, n, kp));
    let k4 = quad_len(kp);
    if m == 0 || n == 0 || kp == 0 {
        return true;
    }
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the CPU has AVX-512 F, BW and VNNI (has_vnni above); the operand lengths were
    // checked just above.
    unsafe {
        vnni::add_rows(x, xstride, wp, &mut y[..m * n], n, k4)
    };
    true
}

/// The row sums `sum_k x[r][k]` of `m` rows of `xstride` bytes (the first `kp` of each).
pub(super) fn row_sums(x: &[u8], xstride: usize, m: usize, kp: usize) -> Vec<i32> {
    x.chunks(xstride.max(1))
        .take(m)
        .map(|r| r[..kp].iter().map(|&b| i32::from(b as i8)).sum())
        .collect()
}

/// [`sums_packed`] without target features (the tests' check of the packing and the offset).
#[cfg(test)]
fn sums_packed_portable(
    x: &[u8],
    xstride: usize,
    wp: &[u8],
    y: &mut [i32],
    (m, n, kp): (usize, usize, usize),
) {
    let k4 = quad_len(kp);
    for j in 0..n {
        let (p, c) = (j / NR, j % NR);
        let width = (n.div_ceil(16) * 16 - p * NR).min(NR);
        let panel = &wp[p * NR * k4..];
        for r in 0..m {
            let mut acc = 0i32;
            for q in 0..k4 / 4 {
                for i in 0..4 {
                    let wv = i32::from(panel[q * width * 4 + c * 4 + i]);
                    let xv = i32::from(x[r * xstride + 4 * q + i] as i8);
                    acc = acc.wrapping_add(wv * xv);
                }
            }
            y[r * n + j] = y[r * n + j].wrapping_add(acc);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod vnni {
    use std::arch::x86_64::{
        __m512i, _mm512_add_epi32, _mm512_dpbusd_epi32, _mm512_loadu_si512,
        _mm512_mask_storeu_epi32, _mm512_maskz_loadu_epi32, _mm512_set1_epi32,
        _mm512_setzero_si512, _mm512_storeu_si512,
    };

    use super::{KQ_BLOCK, MR, NR};

    /// `y[r][0..cols] += sum over `nq` quads of x rows (`R` of them, `xs` bytes apart) times
    /// a panel block of `C` 16-column vectors (`C * 64` bytes a quad).
    ///
    /// # Safety
    /// The CPU has AVX-512 F/BW/VNNI; `x + r xs` has `4 nq` readable bytes for r < R; `w`
    /// has `nq C 64` readable bytes; `y + r ys` has `cols <= 16 C` writable int32 for r < R.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn micro<const R: usize, const C: usize>(
        x: *const u8,
        xs: usize,
        w: *const u8,
        nq: usize,
        (y, ys, cols): (*mut i32, usize, usize),
    ) {
        let mut acc = [[_mm512_setzero_si512(); C]; R];
        for q in 0..nq {
            // SAFETY: quad q of the block lies within the panel block (the caller's promise).
            let wv: [__m512i; C] = std::array::from_fn(|c| unsafe {
                _mm512_loadu_si512(w.add((q * C + c) * 64).cast())
            });
            for (r, ar) in acc.iter_mut().enumerate() {
                // SAFETY: 4 bytes of row r at quad q (the caller's promise); unaligned read.
                let xv = unsafe { x.add(r * xs + 4 * q).cast::<i32>().read_unaligned() };
                let xb = _mm512_set1_epi32(xv);
                for (a, &wc) in ar.iter_mut().zip(&wv) {
                    *a = _mm512_dpbusd_epi32(*a, wc, xb);
                }
            }
        }
        for (r, ar) in acc.iter().enumerate() {
            for (c, &a) in ar.iter().enumerate() {
                let valid = cols.saturating_sub(c * 16).min(16);
                // SAFETY: row r's columns 16c.. (fewer than `cols`) are writable (the
                // caller's promise); the masked forms touch only the first `valid`.
                unsafe {
                    let p = y.add(r * ys + c * 16);
                    if valid == 16 {
                        let s = _mm512_add_epi32(_mm512_loadu_si512(p.cast()), a);
                        _mm512_storeu_si512(p.cast(), s);
                    } else if valid > 0 {
                        let mask = ((1u32 << valid) - 1) as u16;
                        let s = _mm512_add_epi32(_mm512_maskz_loadu_epi32(mask, p), a);
                        _mm512_mask_storeu_epi32(p, mask, s);
                    }
                }
            }
        }
    }

    /// [`micro`] for `rows <= MR` rows.
    ///
    /// # Safety
    /// As [`micro`], with `R = rows`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn micro_rows<const C: usize>(
        rows: usize,
        x: *const u8,
        xs: usize,
        w: *const u8,
        nq: usize,
        yc: (*mut i32, usize, usize),
    ) {
        // SAFETY: the caller's promise, with R = rows.
        unsafe {
            match rows {
                6 => micro::<6, C>(x, xs, w, nq, yc),
                5 => micro::<5, C>(x, xs, w, nq, yc),
                4 => micro::<4, C>(x, xs, w, nq, yc),
                3 => micro::<3, C>(x, xs, w, nq, yc),
                2 => micro::<2, C>(x, xs, w, nq, yc),
                1 => micro::<1, C>(x, xs, w, nq, yc),
                _ => {}
            }
        }
    }

    /// `y += x w^T` for the rows of `x` (`xs` bytes a row, `k4` used) and `y` (`n` a row)
    /// over the packed panels `wp`.
    ///
    /// # Safety
    /// The CPU has AVX-512 F/BW/VNNI; `x` holds `y.len() / n` rows of `xs >= k4` bytes (the
    /// last at least `k4`), `wp` the packed panels of `n` columns and `k4 / 4` quads.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub(super) unsafe fn add_rows(
        x: &[u8],
        xs: usize,
        wp: &[u8],
        y: &mut [i32],
        n: usize,
        k4: usize,
    ) {
        let m = y.len() / n;
        let nq_all = k4 / 4;
        let n16 = n.div_ceil(16) * 16;
        let (xp, yp, wpp) = (x.as_ptr(), y.as_mut_ptr(), wp.as_ptr());
        for q0 in (0..nq_all).step_by(KQ_BLOCK) {
            let nq = KQ_BLOCK.min(nq_all - q0);
            for p0 in (0..n16).step_by(NR) {
                let width = NR.min(n16 - p0);
                let cols = NR.min(n - p0);
                // SAFETY: panel p0 / NR starts at p0 k4 bytes, its quad q0 at q0 width 4.
                let w = unsafe { wpp.add(p0 * k4 + q0 * width * 4) };
                for r0 in (0..m).step_by(MR) {
                    let rows = MR.min(m - r0);
                    // SAFETY: rows r0.. of x from quad q0 on, rows r0.. of y from column p0
                    // on: within the operands (the caller's promise).
                    unsafe {
                        let xr = xp.add(r0 * xs + 4 * q0);
                        let yc = (yp.add(r0 * n + p0), n, cols);
                        match width / 16 {
                            4 => micro_rows::<4>(rows, xr, xs, w, nq, yc),
                            3 => micro_rows::<3>(rows, xr, xs, w, nq, yc),
                            2 => micro_rows::<2>(rows, xr, xs, w, nq, yc),
                            _ => micro_rows::<1>(rows, xr, xs, w, nq, yc),
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
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

    /// A deterministic stream of int8 values (xorshift), extremes included (the attention
    /// tests use it too).
    pub(in crate::modelled) fn values(len: usize, seed: u64) -> Vec<i8> {
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

    /// W rows `[n][k]` as the GEMM's stream of `lanes`-column tiles (`n` a multiple of
    /// `lanes`), striped by `stripe` bytes into (even, odd) or whole.
    fn stream(
        w: &[i8],
        (n, k): (usize, usize),
        lanes: usize,
        stripe: Option<usize>,
    ) -> (Vec<u8>, Vec<u8>) {
        let mut s = vec![0u8; n * k];
        for c in 0..n {
            for kk in 0..k {
                s[(c / lanes) * lanes * k + kk * lanes + c % lanes] = w[c * k + kk] as u8;
            }
        }
        let Some(sb) = stripe else {
            return (s, Vec::new());
        };
        let (mut even, mut odd) = (Vec::new(), Vec::new());
        for (i, ch) in s.chunks(sb).enumerate() {
            if i % 2 == 0 {
                even.extend_from_slice(ch);
            } else {
                odd.extend_from_slice(ch);
            }
        }
        (even, odd)
    }

    /// The VNNI path's sums (or its portable twin), as gemm.rs runs them: x rows of
    /// `quad_len(k) + pad` bytes, W through the stream.
    #[allow(clippy::too_many_arguments)]
    fn packed(
        x: &[i8],
        w: &[i8],
        p: Option<&[i32]>,
        (m, n, k): (usize, usize, usize),
        lanes: usize,
        stripe: Option<usize>,
        pad: usize,
        vnni: bool,
    ) -> Vec<i32> {
        let stride = quad_len(k) + pad;
        let mut xb = vec![0u8; m * stride];
        for (d, s) in xb.chunks_exact_mut(stride).zip(x.chunks_exact(k)) {
            for (dv, &sv) in d.iter_mut().zip(s) {
                *dv = sv as u8;
            }
        }
        let rs = row_sums(&xb, stride, m, k);
        let part: Option<Vec<u8>> = p.map(|p| p.iter().flat_map(|v| v.to_le_bytes()).collect());
        let mut y = Vec::new();
        start_y(&mut y, part.as_deref(), &rs, n);
        let (even, odd) = stream(w, (n, k), lanes, stripe);
        let ws = WStream {
            even: &even,
            odd: stripe.map(|_| &odd[..]),
            stripe: stripe.unwrap_or(1),
            lanes,
            np: n,
            kp: k,
        };
        let mut wp = Vec::new();
        pack_stream(&mut wp, &ws);
        assert_eq!(wp.len(), packed_len(n, k));
        if vnni {
            assert!(sums_packed(&xb, stride, &wp, &mut y, (m, n, k)));
        } else {
            sums_packed_portable(&xb, stride, &wp, &mut y, (m, n, k));
        }
        y
    }

    #[test]
    fn packed_paths_equal_the_plain_loop() {
        // rows off the 6-row block, columns off 16 and the 64-column panel, k off 4 and past
        // a K block, partials that wrap; tiles of 8, 16 and 64 lanes, striped or not
        let paths: &[bool] = if has_vnni() { &[false, true] } else { &[false] };
        for (m, n, k) in [
            (1usize, 1usize, 1usize),
            (3, 5, 17),
            (7, 131, 1030),
            (13, 64, 16),
            (6, 70, 4),
            (5, 259, 2050),
            (33, 9, 3),
            (20, 200, 1027),
        ] {
            for (lanes, stripe) in [(8, None), (16, Some(64)), (64, None), (64, Some(128))] {
                let n = n.div_ceil(lanes) * lanes;
                let x = values(m * k, (m * 31 + k) as u64);
                let w = values(n * k, (n * 17 + k + lanes) as u64);
                let p: Vec<i32> = (0..m * n)
                    .map(|i| {
                        if i % 3 == 0 {
                            i32::MAX - i as i32
                        } else {
                            -(i as i32)
                        }
                    })
                    .collect();
                let want = reference(&x, &w, Some(&p), (m, n, k));
                let want0 = reference(&x, &w, None, (m, n, k));
                for &v in paths {
                    for pad in [0, 8] {
                        let what = format!(
                            "m {m} n {n} k {k} lanes {lanes} {stripe:?} pad {pad} vnni {v}"
                        );
                        let got = packed(&x, &w, Some(&p), (m, n, k), lanes, stripe, pad, v);
                        assert_eq!(got, want, "{what}");
                        let got = packed(&x, &w, None, (m, n, k), lanes, stripe, pad, v);
                        assert_eq!(got, want0, "{what}");
                    }
                }
            }
        }
    }

    #[test]
    fn packed_paths_on_extreme_operands() {
        // all -128 (x (w + 128) is 0, the offset alone gives the sum), all 127 against -128,
        // and 127 against 127 (w + 128 = 255: the largest unsigned byte)
        let paths: &[bool] = if has_vnni() { &[false, true] } else { &[false] };
        let (m, n, k) = (7, 128, 4100);
        for (xv, wv) in [(-128i8, -128i8), (127, -128), (-128, 127), (127, 127)] {
            let x = vec![xv; m * k];
            let w = vec![wv; n * k];
            let want = vec![(k as i32) * i32::from(xv) * i32::from(wv); m * n];
            for &v in paths {
                assert_eq!(
                    packed(&x, &w, None, (m, n, k), 64, None, 0, v),
                    want,
                    "{xv} {wv} {v}"
                );
            }
        }
    }

    #[test]
    fn every_path_on_random_operands() {
        // the old int16 paths (portable, AVX2) and the packed ones (portable, VNNI) on one
        // random problem whose sums wrap
        let (m, n, k) = (45, 192, 3000);
        let x = values(m * k, 7);
        let w = values(n * k, 11);
        let p: Vec<i32> = (0..m * n)
            .map(|i| (i as i32).wrapping_mul(0x3779_b1a9))
            .collect();
        let want = reference(&x, &w, Some(&p), (m, n, k));
        let kp = row_len(k);
        let (xw, ww) = (widen(&bytes(&x), m, k, kp), widen(&bytes(&w), n, k, kp));
        let mut y = p.clone();
        add_block_portable(&xw, &ww, &mut y, n, kp);
        assert_eq!(y, want, "portable int16");
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            let mut y = p.clone();
            // SAFETY: the CPU has AVX2; whole rows of kp, n rows of w, n columns of y.
            unsafe { avx2::add_block(&xw, &ww, &mut y, n, kp) };
            assert_eq!(y, want, "AVX2");
        }
        assert_eq!(
            packed(&x, &w, Some(&p), (m, n, k), 64, Some(4096), 0, false),
            want
        );
        if has_vnni() {
            assert_eq!(
                packed(&x, &w, Some(&p), (m, n, k), 64, Some(4096), 0, true),
                want
            );
        }
    }

    /// Rates of the paths on a q_proj-sized block (`cargo test --release -p tandem-sim --lib
    /// sums_rate -- --ignored --nocapture`).
    #[test]
    #[ignore = "a timing, not a check"]
    fn sums_rate() {
        let (m, n, k) = (1024, 4096, 4096);
        let x = values(m * k, 3);
        let w = values(n * k, 5);
        let macs = (m * n * k) as f64;
        let t = std::time::Instant::now();
        let kp = row_len(k);
        let y0 = sums_wide(
            &widen(&bytes(&x), m, k, kp),
            &widen(&bytes(&w), n, k, kp),
            None,
            (m, n, k),
        );
        let dt = t.elapsed().as_secs_f64();
        eprintln!("int16 path: {dt:.3} s, {:.1} G MAC/s", macs / dt / 1e9);
        if has_vnni() {
            let xb = bytes(&x);
            let (even, odd) = stream(&w, (n, k), 64, Some(4096));
            let ws = WStream {
                even: &even,
                odd: Some(&odd),
                stripe: 4096,
                lanes: 64,
                np: n,
                kp: k,
            };
            let t = std::time::Instant::now();
            let mut wp = Vec::new();
            pack_stream(&mut wp, &ws);
            let dp = t.elapsed().as_secs_f64();
            let t = std::time::Instant::now();
            let rs = row_sums(&xb, k, m, k);
            let mut y1 = Vec::new();
            start_y(&mut y1, None, &rs, n);
            assert!(sums_packed(&xb, k, &wp, &mut y1, (m, n, k)));
            let dt = t.elapsed().as_secs_f64();
            eprintln!(
                "VNNI path: packing {dp:.3} s, sums {dt:.3} s, {:.1} G MAC/s",
                macs / dt / 1e9
            );
            assert_eq!(y0, y1);
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
