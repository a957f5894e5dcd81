//! The GEMM core inside the Vitis shell on the simulated card: bit-exact against the golden
//! model through AXI4-Lite and AXI4 bursts. Skipped where Verilator is missing.

use std::time::Duration;

use rand::{Rng, SeedableRng};
use tandem_fpga::golden::gemm::{GemmDims, Requant, gemm};
use tandem_fpga::kernels::gemm::GemmCore;
use tandem_fpga::shell::ShellConfig;
use tandem_fpga::FpgaDevice;
use tandem_fpga::drive::run_gemm;
use tandem_sim::{SimCard, SimConfig};

#[test]
fn gemm_through_the_shell_matches_golden() {
    let mut c = match SimCard::open(SimConfig::default()) {
        Ok(c) => c,
        Err(e) => {
            println!("skipped: {e}");
            return;
        }
    };
    let core = GemmCore {
        rows: 4,
        k_max: 64,
        n_max: 32,
    };
    c.load_core(&core, ShellConfig { max_burst: 16 })
        .expect("load gemm");
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(21);
    for &(m, n, k, relu) in &[
        (5, 12, 20, false),
        (8, 32, 64, true),
        (1, 3, 7, false),
        (9, 16, 40, true),
    ] {
        let d = GemmDims { m, n, k };
        let x: Vec<i8> = (0..m * k).map(|_| rng.r#gen()).collect();
        let w: Vec<i8> = (0..n * k).map(|_| rng.r#gen()).collect();
        let bias: Vec<i32> = (0..n).map(|_| rng.gen_range(-5000..5000)).collect();
        let rq: Vec<Requant> = (0..n)
            .map(|_| Requant {
                mult: rng.r#gen(),
                shift: rng.gen_range(20..26),
            })
            .collect();
        let want = gemm(&x, &w, &bias, &rq, relu, d).expect("golden");
        let (got, st) =
            run_gemm(&mut c, &x, &w, &bias, &rq, relu, d, Duration::from_secs(60)).expect("run");
        assert_eq!(got, want, "{d:?} relu={relu}");
        println!("gemm {d:?}: {} cycles", st.cycles);
    }
}
