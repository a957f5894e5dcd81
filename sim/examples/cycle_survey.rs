//! Measures the simulated cycles of the shipped kernel builds over a grid of shapes and prints
//! one CSV line per run (`kernel,a,b,c,flag,cycles`): the data the analytic cycle models in
//! `tandem_fpga::timing` were fitted to. `cargo run --release -p tandem-sim --example
//! cycle_survey > survey.csv`.

use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tandem_fpga::FpgaDevice;
use tandem_fpga::drive::{AttentionDims, KvHead, QueryHead, run_attention, run_gemm, run_router};
use tandem_fpga::golden::gemm::{GemmDims, GemmProblem};
use tandem_fpga::kernels::attention::AttentionCore;
use tandem_fpga::kernels::gemm::GemmCore;
use tandem_fpga::kernels::router::RouterCore;
use tandem_fpga::shell::ShellConfig;
use tandem_sim::{SimCard, SimConfig};

const T: Duration = Duration::from_secs(600);

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let which: Vec<String> = std::env::args().skip(1).collect();
    let want = |k: &str| which.is_empty() || which.iter().any(|w| w == k);
    if want("router") {
        let mut c = SimCard::open(SimConfig::default())?;
        c.load_core(&RouterCore::default(), ShellConfig::default())?;
        for &t in &[1usize, 5, 64, 300] {
            for &e in &[2usize, 4, 7, 8, 13, 64, 256] {
                for &k in &[1usize, 2, 8] {
                    if k > e {
                        continue;
                    }
                    let logits: Vec<i16> = (0..t * e).map(|_| rng.gen_range(-3000..3000)).collect();
                    let (_, st) = run_router(&mut c, &RouterCore::default(), &logits, t, e, k, T)?;
                    println!("router,{t},{e},{k},0,{}", st.cycles);
                }
            }
        }
    }
    if want("gemm") {
        let mut c = SimCard::open(SimConfig::default())?;
        let core = GemmCore {
            rows: 8,
            k_max: 4096,
            n_max: 4096,
            lanes: 8,
            w_ports: false,
        };
        c.load_core(&core, ShellConfig::default())?;
        for &m in &[1usize, 8, 13, 40] {
            for &n in &[8usize, 24, 64, 200] {
                for &k in &[8usize, 40, 256, 600] {
                    let d = GemmDims { m, n, k };
                    let p = GemmProblem::random(&mut rng, d, 20..=25);
                    let (_, st) = run_gemm(&mut c, &p.x, &p.w, &p.bias, &p.rq, false, d, T)?;
                    println!("gemm,{m},{n},{k},0,{}", st.cycles);
                }
            }
        }
    }
    if want("attention") {
        let mut c = SimCard::open(SimConfig::default())?;
        let core = AttentionCore {
            d_max: 64,
            nkv_max: 512,
            kv_tile: 16,
            q_rows: 1,
        };
        c.load_core(&core, ShellConfig::default())?;
        for &nq in &[1usize, 5, 33, 128] {
            for &nkv in &[1usize, 17, 128, 300] {
                for &d in &[8usize, 40, 64] {
                    for causal in [false, true] {
                        let q: Vec<i8> = (0..nq * d).map(|_| rng.gen_range(-60..60)).collect();
                        let k: Vec<i8> = (0..nkv * d).map(|_| rng.gen_range(-60..60)).collect();
                        let v: Vec<i8> = (0..nkv * d).map(|_| rng.gen_range(-60..60)).collect();
                        let dims = AttentionDims { nq, nkv, d, causal };
                        let head = QueryHead {
                            q: &q,
                            kv: 0,
                            score_mult: 40000,
                            score_shift: 20,
                        };
                        let (_, st) =
                            run_attention(&mut c, dims, &[KvHead { k: &k, v: &v }], &[head], T)?;
                        println!(
                            "attention,{nq},{nkv},{d},{},{}",
                            u8::from(causal),
                            st.cycles
                        );
                    }
                }
            }
        }
    }
    Ok(())
}
