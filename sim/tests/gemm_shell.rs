//! The GEMM core inside the Vitis shell on the simulated card: bit-exact against the golden
//! model through AXI4-Lite and AXI4 bursts. Skipped where Verilator is missing.

use std::time::Duration;

use rand::SeedableRng;
use tandem_fpga::FpgaDevice;
use tandem_fpga::drive::{run_gemm, run_gemm_split};
use tandem_fpga::golden::gemm::{GemmDims, GemmProblem};
use tandem_fpga::kernels::gemm::GemmCore;
use tandem_fpga::shell::ShellConfig;
use tandem_sim::memory::MemConfig;
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
        w_ports: false,
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
        w_ports: false,
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

#[test]
fn w_on_masters_of_its_own_matches_golden_and_uses_them() {
    // The card build's memory system at test size: W's even stripes through the read-only
    // `m_axi_gmem1`, its odd stripes through `m_axi_gmem2` (the drivers stripe W over banks
    // 1 and 2 of the four-bank card), x, parameters and y through `m_axi_gmem`; the fan-out
    // hands the three masters' words to the core in request order.
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
        w_ports: true,
    };
    c.load_core(&core, ShellConfig { max_burst: 16 })
        .expect("load wide gemm with three masters");
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(643);
    for &(m, n, k, relu, stripes) in &[
        // (M, N, K, relu, W stripes of one M tile's stream: 4 KiB = 64 beats each)
        (1, 1, 1, true, 1),
        (5, 12, 20, false, 1),
        (9, 67, 131, true, 2),
        (4, 128, 128, false, 2),
        (7, 200, 77, false, 8),
        (3, 65, 300, true, 2),
        (11, 131, 257, false, 3),
    ] {
        let d = GemmDims { m, n, k };
        let p = GemmProblem::random(&mut rng, d, 20..=25);
        let want = p.golden(relu).expect("golden");
        c.reset_bank_counters();
        let (got, st) =
            run_gemm_split(&mut c, &core, &p.x, &p.w, &p.bias, &p.rq, relu, d, T).expect("run");
        assert_eq!(got, want, "{d:?} relu={relu}");
        let [x, even, odd] = c.port_read_bursts();
        println!(
            "three masters {d:?}: {} cycles; read bursts gmem {x}, gmem1 {even}, gmem2 {odd}",
            st.cycles
        );
        assert!(x > 0 && even > 0, "{d:?}: bursts {x} {even} {odd}");
        assert_eq!(odd > 0, stripes > 1, "{d:?}: bursts {x} {even} {odd}");
        let banks = c.bank_counters();
        assert_eq!(banks[0].read_bursts, x, "{d:?}: x and parameters in bank 0");
        assert_eq!(banks[1].read_bursts + banks[2].read_bursts, even + odd);
    }
}

#[test]
fn one_master_builds_read_through_m_axi_gmem_only() {
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
        w_ports: false,
    };
    c.load_core(&core, ShellConfig { max_burst: 16 })
        .expect("load gemm");
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
    let d = GemmDims { m: 6, n: 20, k: 40 };
    let p = GemmProblem::random(&mut rng, d, 20..=25);
    let (got, _) = run_gemm(&mut c, &p.x, &p.w, &p.bias, &p.rq, true, d, T).expect("run");
    assert_eq!(got, p.golden(true).expect("golden"));
    let [x, even, odd] = c.port_read_bursts();
    assert!(x > 0 && even == 0 && odd == 0, "bursts {x} {even} {odd}");
}
