//! The FPGA builds the backend ships, bit for bit: for each build `tandem::backend::fpga` loads
//! (the router, the 8-row GEMM with K and N up to 4096, the attention builds with d_max 64 and
//! 128 and 16-key tiles), the RTL on the simulated card (through the Vitis shell and
//! `tandem_fpga::drive`, as the backend runs it), the golden model and the HLS C++ agree on the
//! same random vectors. Shapes are picked to cross tiles and padding while keeping each
//! simulation to a fraction of a second. Prints "skipped: <reason>" where Verilator is missing.

use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tandem::backend::fpga::{attention::builds, gemm_build};
use tandem_fpga::core::KernelCore;
use tandem_fpga::golden::attention::{self as gatt, AttentionConfig};
use tandem_fpga::golden::gemm::{GemmDims, GemmProblem};
use tandem_fpga::golden::router as grouter;
use tandem_fpga::kernels::router::RouterCore;
use tandem_fpga::shell::ShellConfig;
use tandem_fpga::{FpgaDevice, drive};
use tandem_sim::{SimCard, SimConfig};
use tandem_tests::{Need, skip};

const T: Duration = Duration::from_secs(300);

/// A simulated card with `core` loaded in the shell configuration the backend uses.
fn card(core: &dyn KernelCore) -> Option<SimCard> {
    match SimCard::open(SimConfig::default()) {
        Ok(mut c) => {
            c.load_core(core, ShellConfig::default())
                .unwrap_or_else(|e| panic!("loading {}: {e}", core.name()));
            Some(c)
        }
        Err(e) => {
            skip(Need::FpgaTool, &e.to_string());
            None
        }
    }
}

fn rand_i8(rng: &mut ChaCha8Rng, n: usize) -> Vec<i8> {
    (0..n).map(|_| rng.r#gen()).collect()
}

#[test]
fn shipped_attention_builds_rtl_golden_hls_agree() {
    // the d_max 256 build takes minutes to build in Verilator: the ignored test below
    check_attention_builds(|d_max| d_max <= 128);
}

/// The d_max 256 build (head dims up to 256):
/// `cargo test -p tandem-tests --test fpga_shipped_bitexact -- --ignored`.
#[test]
#[ignore = "the d_max 256 attention build takes minutes to build and simulate"]
fn shipped_attention_d256_build_rtl_golden_hls_agree() {
    check_attention_builds(|d_max| d_max > 128);
}

fn check_attention_builds(which: impl Fn(usize) -> bool) {
    for (name, core) in builds()
        .into_iter()
        .filter(|(_, c)| which(c.d_max as usize))
    {
        let Some(mut c) = card(&core) else { return };
        assert_eq!(
            core.kv_tile as usize,
            tandem_hls::attention_kv_tile(),
            "the HLS C++ is compiled for the shipped tile"
        );
        let mut rng = ChaCha8Rng::seed_from_u64(u64::from(core.d_max));
        let d_max = core.d_max as usize;
        // (nq, nkv, d, causal): full width, padding (d off 8 and off the build), Nkv past
        // several tiles and off the tile, causal with Nq < Nkv and Nq > Nkv.
        let shapes = [
            (9, 37, d_max, true),
            (16, 50, d_max - 20, false),
            (21, 17, d_max / 2 + 3, true),
            (5, 70, 8, false),
        ];
        for (nq, nkv, d, causal) in shapes {
            let (q, k, v) = (
                rand_i8(&mut rng, nq * d),
                rand_i8(&mut rng, nkv * d),
                rand_i8(&mut rng, nkv * d),
            );
            let (score_mult, score_shift) =
                AttentionConfig::score_multiplier(1.0 / (d as f64).sqrt(), 0.02, 0.02)
                    .expect("scale");
            let cfg = AttentionConfig {
                nq,
                nkv,
                d,
                kv_tile: core.kv_tile as usize,
                causal,
                score_mult,
                score_shift,
            };
            let want = gatt::attention(&q, &k, &v, &cfg).expect("golden");
            let hls = tandem_hls::attention(&q, &k, &v, &cfg).expect("hls");
            assert_eq!(hls, want, "{name} {cfg:?}: HLS vs golden");
            let (rtl, st) = drive::run_attention_head(&mut c, &q, &k, &v, &cfg, T).expect("rtl");
            assert_eq!(rtl, want, "{name} {cfg:?}: RTL vs golden");
            println!(
                "{name} nq {nq} nkv {nkv} d {d} causal {causal}: bit-exact, {} cycles",
                st.cycles
            );
        }
    }
}

#[test]
fn shipped_gemm_build_rtl_golden_hls_agree() {
    let core = gemm_build();
    let Some(mut c) = card(&core) else { return };
    let mut rng = ChaCha8Rng::seed_from_u64(77);
    // Rows off the array height, N and K off 8, and K at the build's k_max.
    for (m, n, k, relu) in [(9, 20, 70, true), (17, 13, 301, false), (2, 16, 4096, true)] {
        let d = GemmDims { m, n, k };
        let p = GemmProblem::random(&mut rng, d, 22..=27);
        let want = p.golden(relu).expect("golden");
        let hls = tandem_hls::gemm(&p.x, &p.w, &p.bias, &p.rq, relu, d).expect("hls");
        assert_eq!(hls, want, "{d:?}: HLS vs golden");
        let (rtl, st) =
            drive::run_gemm(&mut c, &p.x, &p.w, &p.bias, &p.rq, relu, d, T).expect("rtl");
        assert_eq!(rtl, want, "{d:?}: RTL vs golden");
        println!("gemm {d:?} relu {relu}: bit-exact, {} cycles", st.cycles);
    }
    // K past the build's k_max: two passes with int32 partials in device memory
    let d = GemmDims {
        m: 3,
        n: 9,
        k: 4096 + 40,
    };
    let p = GemmProblem::random(&mut rng, d, 22..=27);
    let want = p.golden(true).expect("golden");
    let hls = tandem_hls::gemm_split(&p.x, &p.w, &p.bias, &p.rq, true, d, core.k_max as usize)
        .expect("hls");
    assert_eq!(hls, want, "{d:?}: HLS split vs golden");
    let (rtl, st) =
        drive::run_gemm_split(&mut c, &core, &p.x, &p.w, &p.bias, &p.rq, true, d, T).expect("rtl");
    assert_eq!(rtl, want, "{d:?}: RTL split vs golden");
    println!("gemm {d:?} split: bit-exact, {} cycles", st.cycles);
}

#[test]
fn shipped_router_build_rtl_golden_hls_agree() {
    let core = RouterCore::default();
    let Some(mut c) = card(&core) else { return };
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    // E off a multiple of the lanes and of a word's logits, k = k_max, T = 1
    for (t, e, k) in [(33, 64, 4), (7, 8, 8), (12, 200, 2), (1, 13, 8), (5, 99, 8)] {
        // Small integers: many ties, which must break to the lower index everywhere.
        let x: Vec<i16> = (0..t * e).map(|_| rng.gen_range(-8..8) * 64).collect();
        for rn in [true, false] {
            let want = grouter::route_with(&x, t, e, k, rn).expect("golden");
            let lanes = core.lanes as usize;
            let hls = tandem_hls::router_with(&x, t, e, k, rn, lanes).expect("hls");
            assert_eq!(hls, want, "T {t} E {e} k {k} rn {rn}: HLS vs golden");
            let (rtl, st) = drive::run_router_with(&mut c, &core, &x, t, e, k, rn, T).expect("rtl");
            assert_eq!(rtl, want, "T {t} E {e} k {k} rn {rn}: RTL vs golden");
            println!(
                "router T {t} E {e} k {k} renormalize {rn}: bit-exact, {} cycles",
                st.cycles
            );
        }
    }
    assert!(c.stats().total_cycles > 0);
}
