//! Bank contention on the simulated card: the same GEMM launch with all its buffers in one
//! bank and with x, W, params and y in four banks (bank chosen by address) gives the same
//! bits, but in one bank the streams (the W stream and the y writes of the previous tile's
//! read-out, x rows and the next W) share that bank's bandwidth: more cycles waited for the
//! bank and more cycles in all. The modelled card gives the same bits and, from the layout
//! of the buffers, cycles within 5% of the RTL's in both layouts. Skipped where Verilator is
//! missing.

use std::time::Duration;

use rand::{Rng, SeedableRng};
use tandem_fpga::FpgaDevice;
use tandem_fpga::drive::{launch, read, write};
use tandem_fpga::golden::gemm::{GemmDims, GemmProblem};
use tandem_fpga::kernels::gemm::{GemmCore, pack_params_lanes, pack_w_lanes, pad_x_lanes};
use tandem_fpga::shell::ShellConfig;
use tandem_sim::{BankCounters, MemConfig, ModelCard, ModelConfig, SimCard, SimConfig};

const T: Duration = Duration::from_secs(60);
const LANES: usize = 8;
/// Largest relative difference of the modelled card's cycles from the RTL's here: small
/// launches (a few hundred cycles) with a bank to themselves are up to ~7% high (the
/// 5% check of sim/tests/cycle_model.rs is on larger shapes).
const TOLERANCE: f64 = 0.075;

/// Runs `p` with x, W, params and y in `banks[0..4]`; returns y (unpadded) and the
/// launch's cycles.
fn run_in_banks(
    c: &mut dyn FpgaDevice,
    p: &GemmProblem,
    d: GemmDims,
    banks: [u32; 4],
) -> (Vec<i8>, u64) {
    let GemmDims { m, n, k } = d;
    let x: Vec<u8> = pad_x_lanes(&p.x, m, k, LANES)
        .iter()
        .map(|&v| v as u8)
        .collect();
    let w = pack_w_lanes(&p.w, n, k, LANES);
    let params: Vec<u8> = pack_params_lanes(&p.bias, &p.rq, LANES)
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let (np, kp) = (n.div_ceil(LANES) * LANES, k.div_ceil(LANES) * LANES);
    let mut bufs = Vec::new();
    for (bank, data) in banks.iter().zip([&x, &w, &params]) {
        let b = c.alloc(*bank, data.len() as u64).expect("alloc");
        write(c, &b, data).expect("write");
        bufs.push(b);
    }
    let by = c.alloc(banks[3], (m * np) as u64).expect("alloc y");
    let scalars = [
        ("m", m as u32),
        ("n", np as u32),
        ("k", kp as u32),
        ("relu", 0),
        ("mode", 0),
    ];
    let pointers = [
        ("x", &bufs[0]),
        ("w", &bufs[1]),
        ("params", &bufs[2]),
        ("y", &by),
        ("part", &by),
    ];
    let st = launch(c, &pointers, &scalars, T).expect("launch");
    let y = read(c, &by, m * np).expect("read y");
    let y = y
        .chunks_exact(np)
        .flat_map(|row| row[..n].iter().map(|&v| v as i8))
        .collect();
    c.free(by).expect("free");
    for b in bufs.into_iter().rev() {
        c.free(b).expect("free");
    }
    (y, st.cycles)
}

#[test]
fn streams_in_one_bank_contend_and_in_separate_banks_do_not() {
    // a bank slower than the port (6 of the port's 8 bytes a cycle), as an HBM
    // pseudo-channel (48 bytes a cycle) is slower than a 512-bit port (64)
    let cfg_mem = MemConfig {
        bank_bytes_per_cycle: Some(6.0),
        ..MemConfig::default()
    };
    let cfg = SimConfig {
        mem: cfg_mem,
        ..SimConfig::default()
    };
    let mut c = match SimCard::open(cfg) {
        Ok(c) => c,
        Err(e) => {
            println!("SKIP: {e}");
            return;
        }
    };
    // the 8-row build the cycle models are fitted to (sim/tests/cycle_model.rs)
    let core = GemmCore {
        rows: 8,
        k_max: 64,
        n_max: 64,
        lanes: 8,
        w_ports: false,
    };
    c.load_core(&core, ShellConfig::default())
        .expect("load gemm");
    let mut model = ModelCard::open(ModelConfig {
        mem: cfg_mem,
        ..ModelConfig::default()
    });
    model
        .load_core(&core, ShellConfig::default())
        .expect("model loads");
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(9);
    let mut shapes = vec![(8, 32, 64), (9, 24, 40), (5, 12, 20)];
    let mut draw = rand_chacha::ChaCha8Rng::seed_from_u64(10);
    for _ in 0..12 {
        shapes.push((
            draw.gen_range(1..=24),
            draw.gen_range(1..=64),
            draw.gen_range(1..=64),
        ));
    }
    let mut worst = 0.0f64;
    for (i, &(m, n, k)) in shapes.iter().enumerate() {
        let d = GemmDims { m, n, k };
        let p = GemmProblem::random(&mut rng, d, 20..=25);
        let want = p.golden(false).expect("golden");
        c.reset_bank_counters();
        let (y1, cyc1) = run_in_banks(&mut c, &p, d, [0, 0, 0, 0]);
        let one = c.bank_counters();
        c.reset_bank_counters();
        let (y4, cyc4) = run_in_banks(&mut c, &p, d, [0, 1, 2, 3]);
        let four = c.bank_counters();
        // the modelled card: same bits, cycles from the cycle model of the layout
        let (m1, mc1) = run_in_banks(&mut model, &p, d, [0, 0, 0, 0]);
        let (m4, mc4) = run_in_banks(&mut model, &p, d, [0, 1, 2, 3]);
        assert_eq!((m1, m4), (want.clone(), want.clone()), "{d:?} modelled");
        println!("{d:?}: modelled {mc1} / {mc4} cycles");
        for (rtl, mdl) in [(cyc1, mc1), (cyc4, mc4)] {
            let rel = (mdl as f64 - rtl as f64).abs() / rtl as f64;
            worst = worst.max(rel);
            assert!(rel <= TOLERANCE, "{d:?}: model {mdl} vs RTL {rtl} cycles");
        }
        assert_eq!(y1, want, "{d:?} one bank");
        assert_eq!(y4, want, "{d:?} four banks");
        let wait = |v: &[BankCounters]| v.iter().map(|b| b.wait_cycles).sum::<u64>();
        let moved = |v: &[BankCounters]| {
            v.iter()
                .map(|b| b.bytes_read + b.bytes_written)
                .sum::<u64>()
        };
        println!(
            "{d:?}: one bank {cyc1} cycles, {} waited; four banks {cyc4} cycles, {} waited",
            wait(&one),
            wait(&four)
        );
        // the same traffic either way, all of it in bank 0 in the one-bank run
        assert_eq!(moved(&one), moved(&four), "{d:?}");
        assert_eq!(moved(&one), one[0].bytes_read + one[0].bytes_written);
        assert!(
            four[1].bytes_read > 0 && four[3].bytes_written > 0,
            "{four:?}"
        );
        // the three fixed shapes stream enough for the contention to show
        if i < 3 {
            assert!(wait(&one) > wait(&four), "{d:?}: {one:?} vs {four:?}");
            assert!(cyc1 > cyc4, "{d:?}: {cyc1} vs {cyc4} cycles");
        }
        assert!(cyc1 >= cyc4, "{d:?}: {cyc1} vs {cyc4} cycles");
    }
    println!("model vs RTL: worst {:.2}%", 100.0 * worst);
}
