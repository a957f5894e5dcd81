//! Bank contention on the simulated card: the same GEMM launch with all its buffers in one
//! bank and with x, W, params and y in four banks (bank chosen by address) gives the same
//! bits, but in one bank the streams (the W stream and the y writes of the previous tile's
//! read-out, x rows and the next W) share that bank's bandwidth: more cycles waited for the
//! bank and more cycles in all. Skipped where Verilator is missing.

use std::time::Duration;

use rand::SeedableRng;
use tandem_fpga::FpgaDevice;
use tandem_fpga::drive::{launch, read, write};
use tandem_fpga::golden::gemm::{GemmDims, GemmProblem};
use tandem_fpga::kernels::gemm::{GemmCore, pack_params_lanes, pack_w_lanes, pad_x_lanes};
use tandem_fpga::shell::ShellConfig;
use tandem_sim::{BankCounters, MemConfig, SimCard, SimConfig};

const T: Duration = Duration::from_secs(60);
const LANES: usize = 8;

/// Runs `p` with x, W, params and y in `banks[0..4]`; returns y (unpadded), the launch's
/// cycles and the bank counters of the launch.
fn run_in_banks(
    c: &mut SimCard,
    p: &GemmProblem,
    d: GemmDims,
    banks: [u32; 4],
) -> (Vec<i8>, u64, Vec<BankCounters>) {
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
    c.reset_bank_counters();
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
    let counters = c.bank_counters();
    let y = read(c, &by, m * np).expect("read y");
    let y = y
        .chunks_exact(np)
        .flat_map(|row| row[..n].iter().map(|&v| v as i8))
        .collect();
    c.free(by).expect("free");
    for b in bufs.into_iter().rev() {
        c.free(b).expect("free");
    }
    (y, st.cycles, counters)
}

#[test]
fn streams_in_one_bank_contend_and_in_separate_banks_do_not() {
    // a bank slower than the port (6 of the port's 8 bytes a cycle), as an HBM
    // pseudo-channel (48 bytes a cycle) is slower than a 512-bit port (64)
    let cfg = SimConfig {
        mem: MemConfig {
            bank_bytes_per_cycle: Some(6.0),
            ..MemConfig::default()
        },
        ..SimConfig::default()
    };
    let mut c = match SimCard::open(cfg) {
        Ok(c) => c,
        Err(e) => {
            println!("SKIP: {e}");
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
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(9);
    for &(m, n, k) in &[(8, 32, 64), (9, 24, 40), (5, 12, 20)] {
        let d = GemmDims { m, n, k };
        let p = GemmProblem::random(&mut rng, d, 20..=25);
        let want = p.golden(false).expect("golden");
        let (y1, cyc1, one) = run_in_banks(&mut c, &p, d, [0, 0, 0, 0]);
        let (y4, cyc4, four) = run_in_banks(&mut c, &p, d, [0, 1, 2, 3]);
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
        assert!(wait(&one) > wait(&four), "{d:?}: {one:?} vs {four:?}");
        assert!(cyc1 > cyc4, "{d:?}: {cyc1} vs {cyc4} cycles");
    }
}
