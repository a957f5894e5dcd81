//! Golden model of the MoE router kernel: the exact fixed-point semantics, bit for bit what
//! the RTL computes.
//!
//! Per token `t` with logits `x[t][0..E]`:
//! 1. Quantisation (host side): `q = clamp(round_half_away(x * 2^8), -32768, 32767)` (int16,
//!    Q7.8: 8 fractional bits, range [-128, 128)).
//! 2. Top-k: the k largest `q`, ordered by value descending, equal values by lower expert
//!    index first (the insertion network keeps an earlier entry ahead of an equal newcomer).
//! 3. Softmax over the selected k, with `m = q[top_0]`, for each selected j:
//!    `d = m - q_j` (0..=65535), `u = (d * 23637) >> 14` (d * log2(e) in units of 2^-8;
//!    23637 / 2^14 = 1.442688), `e_j = LUT[u & 255] >> (u >> 8)` (0 when `u >> 8 >= 16`)
//!    with `LUT[f] = round(2^15 * 2^(-f/256))` (so `e_0 = 32768` = 1.0 in Q0.15);
//!    `S = sum e_j` (>= 32768); `r = floor(2^30 / S)`; `w_j = (e_j * r + 2^14) >> 15`
//!    (Q0.15 weight, 32768 = 1.0). With `renormalize = false` (the softmax over all experts,
//!    of which the k chosen are reported) `S` sums `e_i` over *every* expert of the row,
//!    each computed as above from `d = m - q_i` (`S` <= E * 32768); the rest is the same.
//!    The result does not depend on the kernel's lane count.
//! 4. Histogram: `hist[id] += 1` for every selected id of every token (u32).
//!
//! Memory layout the kernel reads and writes (little endian):
//! in words of the build's data port, `W` = 64 (the default of [`logit_row_words`] and its
//! siblings), 128 or 256 bits ([`logit_row_beats`], [`route_row_beats`], [`hist_beats`]):
//! - logits: int16 `[T, Epad]`, `Epad = ceil(E/(W/16))*(W/16)` (each row starts on a word;
//!   padding is ignored);
//! - routes: u32 `[T, Kpad]`, `Kpad = ceil(k/(W/32))*(W/32)`, slot `j` =
//!   `weight_q15 << 16 | id` (padding slots are 0);
//! - hist: u32 `[Hpad]`, `Hpad = ceil(E/(W/32))*(W/32)` (padding 0).

/// Fractional bits of the int16 logits.
pub const LOGIT_FRAC_BITS: u32 = 8;
/// log2(e) in Q1.14.
pub const LOG2E_Q14: u32 = 23637;
/// Fractional bits of the weights (Q0.15).
pub const WEIGHT_FRAC_BITS: u32 = 15;

/// Errors of the golden router.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouterError {
    /// The problem's sizes are out of range.
    #[error("router: {0}")]
    Shape(String),
}

/// The exp2 table: `LUT[f] = round(2^15 * 2^(-f/256))`, f in 0..256.
pub fn exp2_lut() -> [u32; 256] {
    let mut t = [0u32; 256];
    for (f, v) in t.iter_mut().enumerate() {
        *v = (32768.0 * (-(f as f64) / 256.0).exp2()).round() as u32;
    }
    t
}

/// Quantises one logit to Q7.8 int16 (round half away from zero, saturating).
pub fn quantize_logit(x: f32) -> i16 {
    let v = (x as f64 * f64::from(1u32 << LOGIT_FRAC_BITS)).round();
    if v.is_nan() {
        0
    } else {
        v.clamp(-32768.0, 32767.0) as i16
    }
}

/// `exp(-d / 256)` in Q0.15 as the kernel computes it (`d` = max - logit, >= 0).
pub fn exp_neg(d: u32, lut: &[u32; 256]) -> u32 {
    let u = (d * LOG2E_Q14) >> 14;
    let sh = u >> 8;
    if sh >= 16 {
        0
    } else {
        lut[(u & 255) as usize] >> sh
    }
}

/// Result of routing T tokens.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RouterOut {
    /// Selected expert ids, `[T, k]`.
    pub ids: Vec<u16>,
    /// Their weights in Q0.15, `[T, k]`.
    pub weights: Vec<u16>,
    /// Per-expert counts over all T*k slots, `[E]`.
    pub hist: Vec<u32>,
}

/// Routes `tokens` rows of `experts` int16 logits (row-major, unpadded) to `k` experts each,
/// the weights renormalised over the k chosen (`route_with(.., true)`).
pub fn route(
    logits: &[i16],
    tokens: usize,
    experts: usize,
    k: usize,
) -> Result<RouterOut, RouterError> {
    route_with(logits, tokens, experts, k, true)
}

/// Routes as [`route`]; with `renormalize = false` the weights are the softmax over all
/// `experts` of the k chosen (they sum to at most 1).
pub fn route_with(
    logits: &[i16],
    tokens: usize,
    experts: usize,
    k: usize,
    renormalize: bool,
) -> Result<RouterOut, RouterError> {
    if experts == 0 || k == 0 || k > experts || experts > 65536 {
        return Err(RouterError::Shape(format!(
            "need 1 <= k ({k}) <= E ({experts}) <= 65536"
        )));
    }
    if logits.len() != tokens * experts {
        return Err(RouterError::Shape(format!(
            "{} logits for T = {tokens}, E = {experts}",
            logits.len()
        )));
    }
    let lut = exp2_lut();
    let mut out = RouterOut {
        ids: Vec::with_capacity(tokens * k),
        weights: Vec::with_capacity(tokens * k),
        hist: vec![0; experts],
    };
    let mut order: Vec<usize> = Vec::with_capacity(experts);
    for row in logits.chunks(experts) {
        order.clear();
        order.extend(0..experts);
        // Stable: equal values keep the lower index first.
        order.sort_by(|&a, &b| row[b].cmp(&row[a]));
        let top = &order[..k];
        let m = i32::from(row[top[0]]);
        let e: Vec<u32> = top
            .iter()
            .map(|&i| exp_neg((m - i32::from(row[i])) as u32, &lut))
            .collect();
        let s: u64 = if renormalize {
            e.iter().map(|&v| u64::from(v)).sum()
        } else {
            row.iter()
                .map(|&q| u64::from(exp_neg((m - i32::from(q)) as u32, &lut)))
                .sum()
        };
        let r = (1u64 << 30) / s;
        for (&i, &ej) in top.iter().zip(&e) {
            let w = (u64::from(ej) * r + (1 << 14)) >> 15;
            out.ids.push(i as u16);
            out.weights.push(w as u16);
            out.hist[i] += 1;
        }
    }
    Ok(out)
}

/// Data-port widths (bits) a router build may read and write with: the words of every
/// layout below are this wide.
pub const ROUTER_DATA_BITS: [u32; 3] = [64, 128, 256];

/// int16 logits in one `data_bits`-bit word (4, 8 or 16).
pub fn logits_per_word(data_bits: u32) -> usize {
    (data_bits / 16).max(1) as usize
}

/// u32 slots (routes or histogram counts) in one `data_bits`-bit word (2, 4 or 8).
pub fn slots_per_word(data_bits: u32) -> usize {
    (data_bits / 32).max(1) as usize
}

/// `data_bits`-bit words per logits row: `ceil(E / (data_bits / 16))` (each row starts on a
/// word; the padding logits are ignored).
pub fn logit_row_beats(experts: usize, data_bits: u32) -> usize {
    experts.div_ceil(logits_per_word(data_bits))
}

/// `data_bits`-bit words per token of the routes output: `ceil(k / (data_bits / 32))` (each
/// token's row starts on a word; the padding slots are 0).
pub fn route_row_beats(k: usize, data_bits: u32) -> usize {
    k.div_ceil(slots_per_word(data_bits))
}

/// `data_bits`-bit words of the histogram output: `ceil(E / (data_bits / 32))` (padding 0).
pub fn hist_beats(experts: usize, data_bits: u32) -> usize {
    experts.div_ceil(slots_per_word(data_bits))
}

/// Words (64-bit) per logits row ([`logit_row_beats`] at 64 bits).
pub fn logit_row_words(experts: usize) -> usize {
    logit_row_beats(experts, 64)
}

/// Words (64-bit) per token of the routes output ([`route_row_beats`] at 64 bits).
pub fn route_row_words(k: usize) -> usize {
    route_row_beats(k, 64)
}

/// Words (64-bit) of the histogram output ([`hist_beats`] at 64 bits).
pub fn hist_words(experts: usize) -> usize {
    hist_beats(experts, 64)
}

/// Lays logits out as the kernel reads them (rows padded to 64-bit words).
pub fn pack_logits(logits: &[i16], tokens: usize, experts: usize) -> Vec<u8> {
    pack_logits_w(logits, tokens, experts, 64)
}

/// Lays logits out as a kernel with `data_bits`-bit ports reads them (rows padded to whole
/// words of [`logit_row_beats`]).
pub fn pack_logits_w(logits: &[i16], tokens: usize, experts: usize, data_bits: u32) -> Vec<u8> {
    let row = logit_row_beats(experts, data_bits) * (data_bits as usize / 8);
    let mut b = vec![0u8; tokens * row];
    for (t, r) in logits.chunks(experts).enumerate().take(tokens) {
        for (i, v) in r.iter().enumerate() {
            b[t * row + 2 * i..t * row + 2 * i + 2].copy_from_slice(&v.to_le_bytes());
        }
    }
    b
}

/// Reads the kernel's routes output back into ids and weights (`[T, k]`).
pub fn unpack_routes(bytes: &[u8], tokens: usize, k: usize) -> (Vec<u16>, Vec<u16>) {
    unpack_routes_w(bytes, tokens, k, 64)
}

/// Reads the routes output of a kernel with `data_bits`-bit ports (rows of
/// [`route_row_beats`] words) back into ids and weights (`[T, k]`).
pub fn unpack_routes_w(
    bytes: &[u8],
    tokens: usize,
    k: usize,
    data_bits: u32,
) -> (Vec<u16>, Vec<u16>) {
    let row = route_row_beats(k, data_bits) * (data_bits as usize / 8);
    let mut ids = Vec::with_capacity(tokens * k);
    let mut w = Vec::with_capacity(tokens * k);
    for t in 0..tokens {
        for j in 0..k {
            let o = t * row + 4 * j;
            let Some(s) = bytes.get(o..o + 4) else {
                break;
            };
            let v = u32::from_le_bytes([s[0], s[1], s[2], s[3]]);
            ids.push(v as u16);
            w.push((v >> 16) as u16);
        }
    }
    (ids, w)
}

/// Lays routes out as a kernel with `data_bits`-bit ports writes them (the modelled card's
/// output): rows of [`route_row_beats`] words, slot `j` = `weight << 16 | id`.
pub fn pack_routes_w(out: &RouterOut, tokens: usize, k: usize, data_bits: u32) -> Vec<u8> {
    let row = route_row_beats(k, data_bits) * (data_bits as usize / 8);
    let mut b = vec![0u8; tokens * row];
    for (t, (ids, ws)) in out.ids.chunks(k).zip(out.weights.chunks(k)).enumerate() {
        for (j, (&id, &w)) in ids.iter().zip(ws).enumerate() {
            let v = u32::from(w) << 16 | u32::from(id);
            let o = t * row + 4 * j;
            if let Some(s) = b.get_mut(o..o + 4) {
                s.copy_from_slice(&v.to_le_bytes());
            }
        }
    }
    b
}

/// Reads the kernel's histogram output (`[E]`).
pub fn unpack_hist(bytes: &[u8], experts: usize) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .take(experts)
        .map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn lut_end_points() {
        let l = exp2_lut();
        assert_eq!(l[0], 32768);
        assert_eq!(l[128], 23170); // 2^15 / sqrt(2) = 23170.475
        assert_eq!(l[255], 16428); // 2^15 * 2^(-255/256) = 16428.43
    }

    #[test]
    fn quantize_rounds_half_away_and_saturates() {
        assert_eq!(quantize_logit(1.0), 256);
        assert_eq!(quantize_logit(-0.5 / 256.0), -1);
        assert_eq!(quantize_logit(0.5 / 256.0), 1);
        assert_eq!(quantize_logit(1000.0), 32767);
        assert_eq!(quantize_logit(-1000.0), -32768);
    }

    #[test]
    fn ties_go_to_lower_index_and_all_equal_is_uniform() {
        let r = route(&[5, 7, 7, 7, 1, 1, 1, 1], 2, 4, 2).expect("route");
        assert_eq!(&r.ids[..2], &[1, 2]);
        assert_eq!(&r.ids[2..], &[0, 1]);
        assert_eq!(r.weights, vec![16384; 4]);
        assert_eq!(r.hist, vec![1, 2, 1, 0]);
    }

    /// Error bound vs the f64 reference (softmax over all experts, top-k, renormalised):
    /// ids agree whenever the k-th and (k+1)-th logits differ by more than 2^-7 (two
    /// quantisation steps), and every weight is within 4e-3 of the f64 weight.
    #[test]
    fn matches_f64_reference_within_bounds() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let (t, e, k) = (200, 16, 4);
        let x: Vec<f32> = (0..t * e).map(|_| rng.gen_range(-6.0f32..6.0)).collect();
        let q: Vec<i16> = x.iter().map(|&v| quantize_logit(v)).collect();
        let out = route(&q, t, e, k).expect("route");
        let mut worst = 0.0f64;
        let mut checked = 0;
        for tok in 0..t {
            let row: Vec<f64> = x[tok * e..(tok + 1) * e]
                .iter()
                .map(|&v| v as f64)
                .collect();
            let mut ord: Vec<usize> = (0..e).collect();
            ord.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
            if row[ord[k - 1]] - row[ord[k]] <= 2.0 / 256.0 {
                continue;
            }
            checked += 1;
            let m = row[ord[0]];
            let s: f64 = ord[..k].iter().map(|&i| (row[i] - m).exp()).sum();
            for j in 0..k {
                assert_eq!(out.ids[tok * k + j] as usize, ord[j], "token {tok}");
                let w = (row[ord[j]] - m).exp() / s;
                let got = f64::from(out.weights[tok * k + j]) / 32768.0;
                worst = worst.max((got - w).abs());
            }
        }
        assert!(checked > 150);
        assert!(worst < 4e-3, "worst weight error {worst}");
    }

    /// renormalize = false: the weights are the softmax over every expert (f64 reference:
    /// exp(x_i - m) / sum over all experts), within 4e-3; the ids equal the renormalised
    /// routing's.
    #[test]
    fn without_renormalising_matches_the_full_softmax() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(8);
        for &(t, e, k) in &[(100, 8, 2), (40, 64, 8), (10, 256, 8), (5, 3, 3)] {
            let x: Vec<f32> = (0..t * e).map(|_| rng.gen_range(-6.0f32..6.0)).collect();
            let q: Vec<i16> = x.iter().map(|&v| quantize_logit(v)).collect();
            let a = route_with(&q, t, e, k, false).expect("route");
            let b = route(&q, t, e, k).expect("route");
            assert_eq!(a.ids, b.ids);
            assert_eq!(a.hist, b.hist);
            let mut worst = 0.0f64;
            for tok in 0..t {
                let row: Vec<f64> = x[tok * e..(tok + 1) * e]
                    .iter()
                    .map(|&v| f64::from(v))
                    .collect();
                let m = row.iter().copied().fold(f64::MIN, f64::max);
                let s: f64 = row.iter().map(|&v| (v - m).exp()).sum();
                for j in 0..k {
                    let i = usize::from(a.ids[tok * k + j]);
                    let w = (row[i] - m).exp() / s;
                    let got = f64::from(a.weights[tok * k + j]) / 32768.0;
                    worst = worst.max((got - w).abs());
                }
            }
            assert!(
                worst < 4e-3,
                "T {t} E {e} k {k}: worst weight error {worst}"
            );
        }
        // k = E: both modes are the same softmax
        let q: Vec<i16> = (0..24).map(|_| rng.gen_range(-900..900)).collect();
        assert_eq!(route_with(&q, 4, 6, 6, false), route(&q, 4, 6, 6));
    }

    #[test]
    fn pack_unpack_round_trip() {
        let b = pack_logits(&[1, -2, 3, 4, 5, 6], 2, 3);
        assert_eq!(b.len(), 16);
        assert_eq!(i16::from_le_bytes([b[8], b[9]]), 4);
        let mut r = vec![0u8; 8];
        r[..4].copy_from_slice(&(7u32 | (100 << 16)).to_le_bytes());
        assert_eq!(unpack_routes(&r, 1, 1), (vec![7], vec![100]));
    }

    #[test]
    fn wide_layouts_pad_rows_to_whole_words() {
        assert_eq!(logit_row_beats(9, 128), 2);
        assert_eq!(logit_row_beats(8, 128), 1);
        assert_eq!(logit_row_beats(17, 256), 2);
        assert_eq!(route_row_beats(5, 128), 2);
        assert_eq!(route_row_beats(2, 128), 1);
        assert_eq!(hist_beats(6, 128), 2);
        assert_eq!(hist_beats(6, 64), 3);
        let x: Vec<i16> = (1..=18).collect();
        let b = pack_logits_w(&x, 2, 9, 128);
        assert_eq!(b.len(), 64);
        // the second row starts at the third 16-byte word
        assert_eq!(i16::from_le_bytes([b[32], b[33]]), 10);
        assert_eq!(i16::from_le_bytes([b[16], b[17]]), 9);
        assert_eq!(i16::from_le_bytes([b[18], b[19]]), 0);
        let out = route(&x, 2, 9, 3).expect("route");
        let r = pack_routes_w(&out, 2, 3, 128);
        assert_eq!(r.len(), 32);
        assert_eq!(unpack_routes_w(&r, 2, 3, 128), (out.ids, out.weights));
        assert_eq!(u32::from_le_bytes([r[12], r[13], r[14], r[15]]), 0);
    }
}
