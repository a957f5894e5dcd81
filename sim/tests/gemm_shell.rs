//! The GEMM core inside the Vitis shell on the simulated card: bit-exact against the golden
//! model through AXI4-Lite and AXI4 bursts. Skipped where Verilator is missing.

use std::time::Duration;

use rand::SeedableRng;
use tandem_fpga::FpgaDevice;
use tandem_fpga::drive::run_gemm;
use tandem_fpga::golden::gemm::{GemmDims, GemmProblem};
use tandem_fpga::kernels::gemm::GemmCore;
use tandem_fpga::shell::ShellConfig;
use tandem_sim::{SimCard, SimConfig};

const T: Duration = Duration::from_secs(60);

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
        lanes: 8,
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
        let p = GemmProblem::random(&mut rng, d, 20..=25);
        let want = p.golden(relu).expect("golden");
        let (got, st) = run_gemm(&mut c, &p.x, &p.w, &p.bias, &p.rq, relu, d, T).expect("run");
        assert_eq!(got, want, "{d:?} relu={relu}");
        println!("gemm {d:?}: {} cycles", st.cycles);
    }
}

/// A 512-bit build (64 lanes: 64 int8 per beat, 32 packed multipliers per row) through the
/// shell on the simulated card, whose memory serves 64-byte beats: bit-exact against golden on
/// random shapes with odd M, N and K, N over several column tiles and chunks, and K split over
/// passes (int32 partials in card memory).
#[test]
fn wide_gemm_through_the_shell_matches_golden() {
    use tandem_fpga::drive::run_gemm_split;
    use tandem_sim::memory::MemConfig;
    let cfg = SimConfig {
        mem: MemConfig {
            bytes_per_cycle: 64.0,
            ..MemConfig::default()
        },
        ..SimConfig::default()
    };
    let mut c = match SimCard::open(cfg) {
        Ok(c) => c,
        Err(e) => {
            println!("skipped: {e}");
            return;
        }
    };
    let core = GemmCore {
        rows: 4,
        k_max: 128,
        n_max: 128,
        lanes: 64,
    };
    c.load_core(&core, ShellConfig { max_burst: 16 })
        .expect("load wide gemm");
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(64);
    for &(m, n, k, relu) in &[
        (5, 12, 20, false),
        (1, 1, 1, true),
        (9, 67, 131, true),
        (4, 128, 128, false),
        (7, 200, 77, false),
        (3, 65, 300, true),
        (11, 131, 257, false),
    ] {
        let d = GemmDims { m, n, k };
        let p = GemmProblem::random(&mut rng, d, 20..=25);
        let want = p.golden(relu).expect("golden");
        let (got, st) =
            run_gemm_split(&mut c, &core, &p.x, &p.w, &p.bias, &p.rq, relu, d, T).expect("run");
        assert_eq!(got, want, "{d:?} relu={relu}");
        println!("wide gemm {d:?}: {} cycles", st.cycles);
    }
}
