//! The GEMM and attention cores inside the Vitis RTL shell, on the simulated card (AXI4-Lite
//! control, AXI4 bursts to simulated memory banks), driven by `tandem_fpga::drive`: bit-exact
//! against the golden models, and the cycle counts through the shell. Prints
//! "skipped: <reason>" where Verilator is missing.

use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tandem_fpga::golden::attention::{self as gatt, AttentionConfig};
use tandem_fpga::golden::gemm::{GemmDims, GemmProblem};
use tandem_fpga::kernels::attention::AttentionCore;
use tandem_fpga::kernels::gemm::{GemmCore, pad8};
use tandem_fpga::shell::ShellConfig;
use tandem_fpga::{FpgaDevice, drive};
use tandem_sim::{SimCard, SimConfig};

const T: Duration = Duration::from_secs(120);

fn card(core: &dyn tandem_fpga::core::KernelCore) -> Option<SimCard> {
    match SimCard::open(SimConfig::default()) {
        Ok(mut c) => {
            c.load_core(core, ShellConfig { max_burst: 16 })
                .expect("load core");
            Some(c)
        }
        Err(e) => {
            println!("skipped: {e}");
            None
        }
    }
}

#[test]
fn gemm_through_the_shell_matches_golden() {
    let core = GemmCore {
        rows: 4,
        k_max: 256,
        n_max: 64,
        lanes: 8,
        w_ports: false,
    };
    let Some(mut c) = card(&core) else { return };
    let mut rng = ChaCha8Rng::seed_from_u64(31);
    for &(m, n, k, relu) in &[(9, 20, 70, true), (16, 64, 256, false)] {
        let d = GemmDims { m, n, k };
        let p = GemmProblem::random(&mut rng, d, 22..=26);
        let (y, st) = drive::run_gemm(&mut c, &p.x, &p.w, &p.bias, &p.rq, relu, d, T).expect("run");
        let want = p.golden(relu).expect("golden");
        assert_eq!(y, want, "{d:?}");
        let ideal = core.ideal_cycles(m, pad8(n), pad8(k));
        println!(
            "gemm through the shell {d:?}: {} cycles, ideal {ideal}, busy {:.1}%",
            st.cycles,
            100.0 * ideal as f64 / st.cycles as f64
        );
    }
}

#[test]
fn attention_through_the_shell_matches_golden() {
    let core = AttentionCore {
        d_max: 16,
        nkv_max: 256,
        kv_tile: 8,
        q_rows: 1,
    };
    let Some(mut c) = card(&core) else { return };
    let mut rng = ChaCha8Rng::seed_from_u64(32);
    for &(nq, nkv, d, causal) in &[(13, 29, 11, true), (48, 192, 16, false)] {
        let mut g = |n: usize| -> Vec<i8> { (0..n).map(|_| rng.r#gen()).collect() };
        let (q, k, v) = (g(nq * d), g(nkv * d), g(nkv * d));
        let (score_mult, score_shift) =
            AttentionConfig::score_multiplier(0.25, 0.02, 0.02).expect("scale");
        let cfg = AttentionConfig {
            nq,
            nkv,
            d,
            kv_tile: core.kv_tile as usize,
            causal,
            score_mult,
            score_shift,
        };
        let (got, st) = drive::run_attention_head(&mut c, &q, &k, &v, &cfg, T).expect("run");
        let want = gatt::attention(&q, &k, &v, &cfg).expect("golden");
        assert_eq!(got, want, "{cfg:?}");
        let pairs: usize = (0..nq)
            .map(|i| (0..nkv).filter(|&j| cfg.visible(i, j)).count())
            .sum();
        println!(
            "attention through the shell Nq={nq} Nkv={nkv} d={d} causal={causal}: {} cycles, {pairs} pairs, busy {:.1}%",
            st.cycles,
            100.0 * pairs as f64 / st.cycles as f64
        );
    }
}

#[test]
fn gemm_k_and_n_split_through_the_shell_matches_golden() {
    // K far past k_max (int32 partials in device memory between passes), N past n_max
    // (column chunks), M off the tile; wrapping biases and every shift on one shape.
    let core = GemmCore {
        rows: 4,
        k_max: 32,
        n_max: 16,
        lanes: 8,
        w_ports: false,
    };
    let Some(mut c) = card(&core) else { return };
    let mut rng = ChaCha8Rng::seed_from_u64(33);
    for (m, n, k, relu, shifts) in [
        (9, 20, 70, true, 20..=24),
        (5, 16, 96, false, 20..=24),
        (3, 40, 33, false, 0..=47),
        (8, 8, 200, true, 21..=25),
    ] {
        let d = GemmDims { m, n, k };
        let mut p = GemmProblem::random(&mut rng, d, shifts);
        if m == 3 {
            p.bias.iter_mut().for_each(|b| *b = rng.r#gen());
        }
        let (y, st) = drive::run_gemm_split(&mut c, &core, &p.x, &p.w, &p.bias, &p.rq, relu, d, T)
            .expect("run");
        let want = p.golden(relu).expect("golden");
        assert_eq!(y, want, "{d:?}");
        let passes = k.div_ceil(core.k_max as usize) * n.div_ceil(core.n_max as usize);
        println!("gemm split {d:?}: {passes} launches, {} cycles", st.cycles);
    }
    // and a single launch on the same card still works (mode 0 after split runs)
    let d = GemmDims { m: 6, n: 16, k: 32 };
    let p = GemmProblem::random(&mut rng, d, 20..=24);
    let (y, _) = drive::run_gemm(&mut c, &p.x, &p.w, &p.bias, &p.rq, true, d, T).expect("run");
    assert_eq!(y, p.golden(true).expect("golden"));
}

#[test]
fn attention_gqa_groups_and_long_kv_through_the_shell_match_golden() {
    // GQA: the query heads of a kv head in one launch sharing one K/V load; Nkv far past
    // nkv_max: K/V ranges with kv_skip, merged per row (golden attention_chunked); causal
    // with Nq < Nkv and Nq > Nkv; a head dim below d_max.
    let core = AttentionCore {
        d_max: 16,
        nkv_max: 32,
        kv_tile: 8,
        q_rows: 1,
    };
    let Some(mut c) = card(&core) else { return };
    let mut rng = ChaCha8Rng::seed_from_u64(34);
    for &(nq, nkv, d, hq, hkv, causal) in &[
        (10, 150, 16, 4, 2, true),
        (40, 70, 11, 3, 1, true),
        (12, 100, 16, 2, 2, false),
        (7, 20, 8, 4, 1, true),
    ] {
        let mut g = |n: usize| -> Vec<i8> { (0..n).map(|_| rng.gen_range(-60..=60)).collect() };
        let qs: Vec<Vec<i8>> = (0..hq).map(|_| g(nq * d)).collect();
        let kvs: Vec<(Vec<i8>, Vec<i8>)> = (0..hkv).map(|_| (g(nkv * d), g(nkv * d))).collect();
        let (score_mult, score_shift) =
            AttentionConfig::score_multiplier(0.25, 0.02, 0.02).expect("scale");
        let dims = drive::AttentionDims { nq, nkv, d, causal };
        let kv: Vec<drive::KvHead<'_>> = kvs.iter().map(|(k, v)| drive::KvHead { k, v }).collect();
        let heads: Vec<drive::QueryHead<'_>> = qs
            .iter()
            .enumerate()
            .map(|(h, q)| drive::QueryHead {
                q,
                kv: h / (hq / hkv),
                score_mult,
                score_shift,
            })
            .collect();
        let (outs, st) =
            drive::run_attention_split(&mut c, core.nkv_max as usize, dims, &kv, &heads, T)
                .expect("run");
        let cfg = AttentionConfig {
            nq,
            nkv,
            d,
            kv_tile: core.kv_tile as usize,
            causal,
            score_mult,
            score_shift,
        };
        for (h, out) in outs.iter().enumerate() {
            let (k, v) = &kvs[h / (hq / hkv)];
            let want =
                gatt::attention_chunked(&qs[h], k, v, &cfg, core.nkv_max as usize).expect("golden");
            assert_eq!(out, &want, "{cfg:?} head {h}");
        }
        let launches = hkv * nkv.div_ceil(core.nkv_max as usize);
        println!(
            "attention GQA Hq {hq} Hkv {hkv} Nq {nq} Nkv {nkv} d {d} causal {causal}: {launches} launches, {} cycles",
            st.cycles
        );
    }
}
