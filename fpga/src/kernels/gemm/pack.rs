//! The data layouts the GEMM core reads (x rows zero padded to a multiple of the build's
//! lanes, the packed W stream, the per-column parameter words), shared by the host drivers
//! ([`crate::drive`]) and the tests. The `*_lanes` functions serve a build of any lane count
//! (`lanes` int8 per read beat); the others are the 8-lane (64-bit port) layouts.

use crate::golden::gemm::Requant;

/// `n` rounded up to a multiple of 8.
pub fn pad8(n: usize) -> usize {
    n.div_ceil(8) * 8
}

/// `n` rounded up to a multiple of `lanes` (at least 1).
pub fn pad_lanes(n: usize, lanes: usize) -> usize {
    n.div_ceil(lanes.max(1)) * lanes.max(1)
}

/// x `[M][K]` -> `[M][pad8(K)]` with zero columns.
pub fn pad_x(x: &[i8], m: usize, k: usize) -> Vec<i8> {
    pad_x_lanes(x, m, k, 8)
}

/// x `[M][K]` -> `[M][pad_lanes(K, lanes)]` with zero columns.
pub fn pad_x_lanes(x: &[i8], m: usize, k: usize, lanes: usize) -> Vec<i8> {
    let kp = pad_lanes(k, lanes);
    let mut out = vec![0i8; m * kp];
    for (o, i) in out.chunks_exact_mut(kp).zip(x.chunks_exact(k.max(1))) {
        o[..k].copy_from_slice(i);
    }
    out
}

/// w `[N][K]` -> the packed stream: for each tile of 8 rows of w and each k, one 64-bit word
/// whose byte c is `w[n0+c][k]` (zero padded to `pad8(N)` x `pad8(K)`).
pub fn pack_w(w: &[i8], n: usize, k: usize) -> Vec<u64> {
    let (np, kp) = (pad8(n), pad8(k));
    let mut out = vec![0u64; np / 8 * kp];
    for n0 in (0..np).step_by(8) {
        for kk in 0..k {
            let mut word = 0u64;
            for c in 0..8 {
                let row = n0 + c;
                if row < n {
                    word |= u64::from(w[row * k + kk] as u8) << (8 * c);
                }
            }
            out[n0 / 8 * kp + kk] = word;
        }
    }
    out
}

/// The packed W stream of a build with `lanes` lanes, as bytes: for each tile of `lanes`
/// rows of w (`n0`) and each k, one beat of `lanes` bytes whose byte c is `w[n0+c][k]`
/// (zero padded to `pad_lanes(N)` x `pad_lanes(K)`). With 8 lanes, the bytes of
/// [`pack_w`]'s words.
pub fn pack_w_lanes(w: &[i8], n: usize, k: usize, lanes: usize) -> Vec<u8> {
    let (np, kp) = (pad_lanes(n, lanes), pad_lanes(k, lanes));
    let mut out = vec![0u8; np * kp];
    let lanes = lanes.max(1);
    let tile_bytes = kp * lanes;
    if tile_bytes == 0 {
        return out;
    }
    // one tile of `lanes` rows of w -> `kp` beats; tiles over threads for large matrices
    let tile = |t: usize, dst: &mut [u8]| {
        for c in 0..lanes.min(n.saturating_sub(t * lanes)) {
            let row = &w[(t * lanes + c) * k..(t * lanes + c + 1) * k];
            for (kk, &v) in row.iter().enumerate() {
                dst[kk * lanes + c] = v as u8;
            }
        }
    };
    let threads = if n * k < 1 << 20 {
        1
    } else {
        std::thread::available_parallelism().map_or(1, |t| t.get())
    };
    let tiles = np / lanes;
    let per = tiles.div_ceil(threads).max(1);
    std::thread::scope(|s| {
        for (b, block) in out.chunks_mut(per * tile_bytes).enumerate() {
            s.spawn(move || {
                for (i, dst) in block.chunks_exact_mut(tile_bytes).enumerate() {
                    tile(b * per + i, dst);
                }
            });
        }
    });
    out
}

/// Per-column parameter words: bits 31:0 bias, 47:32 mult, 53:48 shift (zero padded to
/// `pad8(N)` columns).
pub fn pack_params(bias: &[i32], rq: &[Requant]) -> Vec<u64> {
    pack_params_lanes(bias, rq, 8)
}

/// [`pack_params`] zero padded to `pad_lanes(N, lanes)` columns (a beat of the build's port
/// holds `lanes / 8` of them, column order).
pub fn pack_params_lanes(bias: &[i32], rq: &[Requant], lanes: usize) -> Vec<u64> {
    let np = pad_lanes(bias.len(), lanes);
    (0..np)
        .map(|i| match (bias.get(i), rq.get(i)) {
            (Some(&b), Some(r)) => {
                u64::from(b as u32) | (u64::from(r.mult) << 32) | (u64::from(r.shift & 63) << 48)
            }
            _ => 0,
        })
        .collect()
}

/// The packed W stream (`packed`, [`pack_w_lanes`]) split into the two buffers of a striped
/// launch (`w_odd` set): stripes of [`super::W_STRIPE_BYTES`] bytes alternate, the even ones
/// (0, 2, ...) in the first buffer and the odd ones in the second, each buffer holding its
/// stripes back to back (the last stripe may be short). The kernel reads stripe `s` at
/// `(s / 2) * W_STRIPE_BYTES` into buffer `s % 2`.
pub fn stripe_w(packed: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let sb = super::W_STRIPE_BYTES;
    let mut even = Vec::with_capacity(packed.len().div_ceil(2) + sb);
    let mut odd = Vec::with_capacity(packed.len() / 2 + sb);
    for (i, chunk) in packed.chunks(sb).enumerate() {
        if i.is_multiple_of(2) {
            even.extend_from_slice(chunk);
        } else {
            odd.extend_from_slice(chunk);
        }
    }
    (even, odd)
}

/// The packed W stream again from its two stripe buffers ([`stripe_w`]'s inverse), `len`
/// bytes in all.
pub fn unstripe_w(even: &[u8], odd: &[u8], len: usize) -> Vec<u8> {
    let sb = super::W_STRIPE_BYTES;
    let mut out = Vec::with_capacity(len);
    let (mut e, mut o) = (even.chunks(sb), odd.chunks(sb));
    while out.len() < len {
        let next = if (out.len() / sb).is_multiple_of(2) {
            e.next()
        } else {
            o.next()
        };
        match next {
            Some(c) => out.extend_from_slice(&c[..c.len().min(len - out.len())]),
            None => break,
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packing_layouts() {
        // w [N=3][K=2]: tile 0, k 0 holds w[0][0], w[1][0], w[2][0] in bytes 0..3
        let w = [1i8, 2, 3, 4, -1, 6];
        let p = pack_w(&w, 3, 2);
        assert_eq!(p.len(), 8);
        assert_eq!(p[0] & 0xFF_FFFF, 0xFF_0301);
        assert_eq!(p[1] & 0xFF_FFFF, 0x06_0402);
        assert_eq!(p[2], 0);
        let q = pack_params(&[-2], &[Requant { mult: 7, shift: 9 }]);
        assert_eq!(q.len(), 8);
        assert_eq!(q[0], 0xFFFF_FFFE | (7 << 32) | (9 << 48));
        assert_eq!(pad_x(&[5, 6, 7], 1, 3), vec![5, 6, 7, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn wide_layouts_extend_the_8_lane_ones() {
        // random-ish w [N=21][K=13]
        let (n, k) = (21, 13);
        let w: Vec<i8> = (0..n * k).map(|i| (i * 37 % 251) as i8).collect();
        let narrow: Vec<u8> = pack_w(&w, n, k)
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert_eq!(pack_w_lanes(&w, n, k, 8), narrow);
        for lanes in [16, 32, 64] {
            let p = pack_w_lanes(&w, n, k, lanes);
            let (np, kp) = (pad_lanes(n, lanes), pad_lanes(k, lanes));
            assert_eq!(p.len(), np * kp);
            for row in 0..np {
                for kk in 0..kp {
                    let want = if row < n && kk < k {
                        w[row * k + kk] as u8
                    } else {
                        0
                    };
                    assert_eq!(p[((row / lanes) * kp + kk) * lanes + row % lanes], want);
                }
            }
            assert_eq!(
                pack_params_lanes(&[1; 3], &[Requant { mult: 1, shift: 0 }; 3], lanes).len(),
                lanes
            );
            assert_eq!(pad_x_lanes(&[1, 2], 1, 2, lanes).len(), lanes);
        }
    }

    #[test]
    fn stripes_alternate_and_come_back() {
        let sb = crate::kernels::gemm::W_STRIPE_BYTES;
        let data: Vec<u8> = (0..3 * sb + 5).map(|i| (i % 251) as u8).collect();
        let (even, odd) = stripe_w(&data);
        // stripes 0 and 2 in the first buffer, 1 and the short 3 in the second
        assert_eq!((even.len(), odd.len()), (2 * sb, sb + 5));
        assert_eq!(&even[..sb], &data[..sb]);
        assert_eq!(&even[sb..], &data[2 * sb..3 * sb]);
        assert_eq!(&odd[..sb], &data[sb..2 * sb]);
        assert_eq!(&odd[sb..], &data[3 * sb..]);
        assert_eq!(unstripe_w(&even, &odd, data.len()), data);
        assert_eq!(stripe_w(&[]), (Vec::new(), Vec::new()));
    }
}
