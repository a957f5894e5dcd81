//! HLS C++ (compiled with g++) against the golden models, bit for bit.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tandem_fpga::golden::attention::{self as gatt, AttentionConfig};
use tandem_fpga::golden::gemm::{self as ggemm, GemmDims, Requant};
use tandem_fpga::golden::router as grouter;

fn rand_i8(rng: &mut ChaCha8Rng, n: usize, full: bool) -> Vec<i8> {
    (0..n)
        .map(|_| {
            if full {
                rng.r#gen::<i8>()
            } else {
                rng.gen_range(-40..=40)
            }
        })
        .collect()
}

fn gemm_case(rng: &mut ChaCha8Rng, d: GemmDims, relu: bool, extreme: bool) {
    let x = rand_i8(rng, d.m * d.k, true);
    let w = rand_i8(rng, d.n * d.k, true);
    let bias: Vec<i32> = (0..d.n)
        .map(|_| {
            if extreme {
                rng.r#gen::<i32>()
            } else {
                rng.gen_range(-5_000..5_000)
            }
        })
        .collect();
    let rq: Vec<Requant> = (0..d.n)
        .map(|_| Requant {
            mult: rng.r#gen(),
            shift: if extreme {
                rng.gen_range(0..=47)
            } else {
                // Centre the outputs in int8 range: |acc| ~ 5500 sqrt(K), mult ~ 2^15.
                let c = 20 + (usize::BITS - d.k.leading_zeros()) as u8 / 2;
                rng.gen_range(c - 2..=c + 2)
            },
        })
        .collect();
    let want = ggemm::gemm(&x, &w, &bias, &rq, relu, d).expect("golden");
    let got = tandem_hls::gemm(&x, &w, &bias, &rq, relu, d).expect("hls");
    assert_eq!(got, want, "{d:?} relu={relu} extreme={extreme}");
    if !extreme && d.m * d.n >= 8 {
        // The case must exercise saturation and the interior alike, or it proves little.
        assert!(
            want.iter().any(|&v| v != 127 && v != -128 && v != 0),
            "{d:?}"
        );
    }
}

#[test]
fn gemm_matches_golden_on_random_and_edge_shapes() {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let shapes = [
        (1, 1, 1),
        (8, 8, 8),
        (3, 5, 7),
        (9, 17, 33),
        (16, 8, 100),
        (13, 29, 257),
        (2, 3, 4096),
    ];
    for &(m, n, k) in &shapes {
        for relu in [false, true] {
            gemm_case(&mut rng, GemmDims { m, n, k }, relu, false);
            gemm_case(&mut rng, GemmDims { m, n, k }, relu, true);
        }
    }
}

#[test]
fn gemm_saturates_and_wraps_like_golden() {
    let d = GemmDims { m: 4, n: 9, k: 64 };
    let x = vec![-128i8; d.m * d.k];
    let w = vec![-128i8; d.n * d.k];
    let bias: Vec<i32> = (0..d.n as i32).map(|i| i32::MAX - i * 1000).collect();
    let rq = vec![
        Requant {
            mult: 65535,
            shift: 20
        };
        d.n
    ];
    let want = ggemm::gemm(&x, &w, &bias, &rq, false, d).expect("golden");
    assert!(want.contains(&-128), "bias add must wrap to negative");
    assert_eq!(
        tandem_hls::gemm(&x, &w, &bias, &rq, false, d).expect("hls"),
        want
    );
}

#[test]
fn gemm_rejects_k_beyond_buffer() {
    let k = tandem_hls::gemm_max_k() + 1;
    let d = GemmDims { m: 1, n: 1, k };
    let r = tandem_hls::gemm(
        &vec![0; k],
        &vec![0; k],
        &[0],
        &[Requant::default()],
        false,
        d,
    );
    assert!(r.is_err());
}

fn attention_case(rng: &mut ChaCha8Rng, nq: usize, nkv: usize, d: usize, causal: bool, full: bool) {
    let q = rand_i8(rng, nq * d, full);
    let k = rand_i8(rng, nkv * d, full);
    let v = rand_i8(rng, nkv * d, true);
    let (score_mult, score_shift) = if full {
        (rng.r#gen::<u16>(), rng.gen_range(10..=30))
    } else {
        AttentionConfig::score_multiplier(1.0 / (d as f64).sqrt(), 0.02, 0.02).expect("scale")
    };
    let cfg = AttentionConfig {
        nq,
        nkv,
        d,
        kv_tile: tandem_hls::attention_kv_tile(),
        causal,
        score_mult,
        score_shift,
    };
    let want = gatt::attention(&q, &k, &v, &cfg).expect("golden");
    let got = tandem_hls::attention(&q, &k, &v, &cfg).expect("hls");
    assert_eq!(got, want, "{cfg:?}");
}

#[test]
fn attention_matches_golden_on_random_and_edge_shapes() {
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    assert_eq!(tandem_hls::attention_kv_tile(), 16);
    let shapes = [
        (1, 1, 1),
        (4, 16, 8),
        (7, 7, 16),
        (5, 37, 32),
        (37, 5, 8),
        (16, 33, 64),
        (3, 100, 24),
        (2, 17, 256),
    ];
    for &(nq, nkv, d) in &shapes {
        for causal in [false, true] {
            attention_case(&mut rng, nq, nkv, d, causal, false);
            attention_case(&mut rng, nq, nkv, d, causal, true);
        }
    }
}

#[test]
fn attention_rows_without_keys_and_growing_max() {
    // Nq > Nkv causal: the first Nq - Nkv rows see no key.
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let (nq, nkv, d) = (20, 6, 8);
    let q = rand_i8(&mut rng, nq * d, true);
    let k = rand_i8(&mut rng, nkv * d, true);
    let v = rand_i8(&mut rng, nkv * d, true);
    let cfg = AttentionConfig {
        nq,
        nkv,
        d,
        kv_tile: tandem_hls::attention_kv_tile(),
        causal: true,
        score_mult: 40000,
        score_shift: 16,
    };
    let want = gatt::attention(&q, &k, &v, &cfg).expect("golden");
    assert_eq!(want.l.iter().filter(|&&l| l == 0).count(), nq - nkv);
    assert_eq!(tandem_hls::attention(&q, &k, &v, &cfg).expect("hls"), want);
    // Keys whose scores grow along the sequence force a rescale in every tile.
    let nkv = 80;
    let q = vec![1i8; d];
    let k: Vec<i8> = (0..nkv * d)
        .map(|i| ((i / d) as i32 - 40).clamp(-127, 127) as i8)
        .collect();
    let v: Vec<i8> = (0..nkv * d).map(|i| (i % 251) as i8).collect();
    let cfg = AttentionConfig {
        nq: 1,
        nkv,
        causal: false,
        score_mult: 65535,
        score_shift: 12,
        ..cfg
    };
    let want = gatt::attention(&q, &k, &v, &cfg).expect("golden");
    assert_eq!(tandem_hls::attention(&q, &k, &v, &cfg).expect("hls"), want);
}

/// Every lane count (1, 2, 4, 8) and both renormalize modes against the golden model.
fn router_case(logits: &[i16], tokens: usize, experts: usize, k: usize, what: &str) {
    let want = grouter::route(logits, tokens, experts, k).expect("golden");
    let got = tandem_hls::router(logits, tokens, experts, k).expect("hls");
    assert_eq!(got, want, "{what}: T={tokens} E={experts} k={k}");
    for rn in [true, false] {
        let want = grouter::route_with(logits, tokens, experts, k, rn).expect("golden");
        for lanes in [1, 2, 4, 8] {
            let got = tandem_hls::router_with(logits, tokens, experts, k, rn, lanes).expect("hls");
            assert_eq!(
                got, want,
                "{what}: T={tokens} E={experts} k={k} renormalize={rn} lanes={lanes}"
            );
        }
    }
}

/// Random shapes (E off a multiple of every lane count, k 1..=8, odd T, T = 1), ties and
/// saturation, each through every lane count and both renormalize modes.
#[test]
fn router_lanes_and_renormalize_match_golden() {
    let mut rng = ChaCha8Rng::seed_from_u64(0x1a4e);
    for i in 0..40 {
        let e = rng.gen_range(1..=300);
        let k = rng.gen_range(1..=e.min(8));
        let t = if i % 5 == 0 {
            1
        } else {
            2 * rng.gen_range(0..6) + 1
        };
        let x: Vec<i16> = match i % 3 {
            0 => (0..t * e).map(|_| rng.r#gen()).collect(),
            1 => (0..t * e).map(|_| rng.gen_range(-1..=1) * 512).collect(),
            _ => (0..t * e)
                .map(|_| [i16::MIN, i16::MAX, 0, i16::MIN + 1][rng.gen_range(0..4)])
                .collect(),
        };
        router_case(&x, t, e, k, "random");
    }
    assert!(
        tandem_hls::router_with(&[0; 4], 1, 4, 2, true, 3).is_err(),
        "3 lanes must be refused"
    );
}

#[test]
fn router_matches_golden_random_ties_and_edges() {
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    for &(t, e, k) in &[
        (1, 1, 1),
        (5, 8, 2),
        (7, 13, 4),
        (3, 64, 8),
        (4, 6, 6),
        (2, 257, 32),
        (9, 32, 32),
    ] {
        let wide: Vec<i16> = (0..t * e).map(|_| rng.r#gen()).collect();
        router_case(&wide, t, e, k, "full range");
        // few distinct values: many ties, broken by the lower index
        let ties: Vec<i16> = (0..t * e).map(|_| rng.gen_range(-2..=2) * 300).collect();
        router_case(&ties, t, e, k, "ties");
    }
    let equal = vec![1234i16; 3 * 16];
    router_case(&equal, 3, 16, 5, "all equal");
    let extreme: Vec<i16> = (0..2 * 10)
        .map(|i| if i % 3 == 0 { i16::MAX } else { i16::MIN })
        .collect();
    router_case(&extreme, 2, 10, 4, "extremes");
    assert!(
        tandem_hls::router(&[0; 4], 1, 4, 5).is_err(),
        "k > E must be refused"
    );
}

#[test]
fn gemm_k_split_passes_match_golden() {
    // K beyond the C++ build's GEMM_MAX_K, and small passes that split K many times, with
    // wrapping biases and every shift: the partials stay int32 (wrapping) across passes.
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let max_k = tandem_hls::gemm_max_k();
    for &(m, n, k, pass) in &[
        (3, 10, max_k + 904, max_k),
        (9, 17, 100, 16),
        (5, 3, 64, 8),
        (1, 8, 41, 24),
    ] {
        let d = GemmDims { m, n, k };
        for (relu, extreme) in [(false, false), (true, true)] {
            let x = rand_i8(&mut rng, m * k, true);
            let w = rand_i8(&mut rng, n * k, true);
            let bias: Vec<i32> = (0..n)
                .map(|_| {
                    if extreme {
                        rng.r#gen()
                    } else {
                        rng.gen_range(-5_000..5_000)
                    }
                })
                .collect();
            let rq: Vec<Requant> = (0..n)
                .map(|_| Requant {
                    mult: rng.r#gen(),
                    shift: if extreme {
                        rng.gen_range(0..=47)
                    } else {
                        rng.gen_range(24..=28)
                    },
                })
                .collect();
            let want = ggemm::gemm(&x, &w, &bias, &rq, relu, d).expect("golden");
            let got = tandem_hls::gemm_split(&x, &w, &bias, &rq, relu, d, pass).expect("hls");
            assert_eq!(got, want, "{d:?} passes of {pass} relu={relu}");
        }
    }
    // a single launch still refuses K beyond the build
    let d = GemmDims {
        m: 1,
        n: 1,
        k: max_k + 8,
    };
    let r = tandem_hls::gemm(
        &vec![1; d.k],
        &vec![1; d.k],
        &[0],
        &[Requant::default()],
        false,
        d,
    );
    assert!(r.is_err());
}

#[test]
fn attention_gqa_groups_and_kv_ranges_match_golden() {
    // the query heads of a group in one call, K/V split into ranges with kv_skip and merged,
    // head dims 64, 128 and 256: bit for bit golden's attention_chunked per head
    let mut rng = ChaCha8Rng::seed_from_u64(12);
    let tile = tandem_hls::attention_kv_tile();
    for &(nq, nkv, d, heads, chunk, causal) in &[
        (9, 70, 64, 4, 32, true),
        (20, 45, 128, 2, 16, false),
        (3, 40, 256, 3, 17, true),
        (30, 12, 8, 2, 5, true),
    ] {
        let q = rand_i8(&mut rng, heads * nq * d, false);
        let k = rand_i8(&mut rng, nkv * d, false);
        let v = rand_i8(&mut rng, nkv * d, true);
        let cfg = AttentionConfig {
            nq,
            nkv,
            d,
            kv_tile: tile,
            causal,
            score_mult: rng.gen_range(20_000..60_000),
            score_shift: 14,
        };
        let ranges = gatt::kv_chunks(nkv, chunk);
        let mut parts: Vec<Vec<gatt::AttentionOut>> = vec![Vec::new(); heads];
        for r in &ranges {
            let c = AttentionConfig {
                nkv: r.len(),
                ..cfg
            };
            let (ks, vs) = (&k[r.start * d..r.end * d], &v[r.start * d..r.end * d]);
            let outs =
                tandem_hls::attention_group(&q, ks, vs, &c, heads, nkv - r.end).expect("hls");
            for (p, o) in parts.iter_mut().zip(outs) {
                p.push(o);
            }
        }
        for (h, p) in parts.iter().enumerate() {
            let got = gatt::merge_parts(p, nq, d);
            let qh = &q[h * nq * d..(h + 1) * nq * d];
            let want = gatt::attention_chunked(qh, &k, &v, &cfg, chunk).expect("golden");
            assert_eq!(got, want, "{cfg:?} head {h} chunk {chunk}");
            assert!(want.l.iter().any(|&l| l > 0));
        }
    }
}

#[test]
fn wide_gemm_matches_golden() {
    // The 512-bit build's 64 lanes (gemm_kernel_pass_wide): N over several 64-column tiles
    // and odd, K split over passes, extreme operands (-128 x -128 on both products of a
    // multiplier) and wrapping biases.
    let mut rng = ChaCha8Rng::seed_from_u64(64);
    let lanes = tandem_hls::GEMM_LANES_WIDE;
    for &(m, n, k, pass) in &[
        (1, 1, 1, 4096),
        (9, 67, 131, 4096),
        (10, 130, 300, 64),
        (3, 64, 64, 16),
        (17, 200, 77, 40),
    ] {
        let d = GemmDims { m, n, k };
        for (relu, extreme) in [(false, false), (true, true)] {
            let x = rand_i8(&mut rng, m * k, true);
            let w = rand_i8(&mut rng, n * k, true);
            let bias: Vec<i32> = (0..n)
                .map(|_| {
                    if extreme {
                        rng.r#gen()
                    } else {
                        rng.gen_range(-5_000..5_000)
                    }
                })
                .collect();
            let rq: Vec<Requant> = (0..n)
                .map(|_| Requant {
                    mult: rng.r#gen(),
                    shift: if extreme {
                        rng.gen_range(0..=47)
                    } else {
                        rng.gen_range(22..=28)
                    },
                })
                .collect();
            let want = ggemm::gemm(&x, &w, &bias, &rq, relu, d).expect("golden");
            let got = tandem_hls::gemm_split_lanes(lanes, &x, &w, &bias, &rq, relu, d, pass)
                .expect("hls wide");
            assert_eq!(got, want, "{d:?} passes of {pass} relu={relu}");
        }
    }
    // every operand -128: both packed products at their extreme
    let d = GemmDims { m: 4, n: 70, k: 64 };
    let (x, w) = (vec![-128i8; d.m * d.k], vec![-128i8; d.n * d.k]);
    let bias: Vec<i32> = (0..d.n as i32).map(|i| i32::MAX - i * 1000).collect();
    let rq = vec![
        Requant {
            mult: 65535,
            shift: 20
        };
        d.n
    ];
    let want = ggemm::gemm(&x, &w, &bias, &rq, false, d).expect("golden");
    let got =
        tandem_hls::gemm_split_lanes(lanes, &x, &w, &bias, &rq, false, d, 4096).expect("hls wide");
    assert_eq!(got, want);
    assert!(tandem_hls::gemm_split_lanes(12, &x, &w, &bias, &rq, false, d, 4096).is_err());
}
