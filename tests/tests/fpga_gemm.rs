//! GEMM core RTL (Verilator) against fpga::golden::gemm, bit for bit: random shapes, edge
//! cases (saturation, wrapping bias, sizes off the tile), back-to-back jobs, memory stalls,
//! reset in the middle of a run; and the array's utilisation on a problem of many tiles.
//! Prints "skipped: <reason>" where Verilator is missing.

use std::sync::OnceLock;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tandem_fpga::core::KernelCore;
use tandem_fpga::golden::gemm::{self as golden, GemmDims, Requant};
use tandem_fpga::kernels::gemm::{GemmCore, pack_params, pack_w, pad_x, pad8};
use tandem_sim::Toolchain;
use tandem_sim::core_sim::{CoreJob, CoreSim, MemModel};

const CORE: GemmCore = GemmCore {
    rows: 4,
    k_max: 256,
    n_max: 64,
    lanes: 8,
    w_ports: false,
};

fn sim() -> Option<&'static CoreSim> {
    static SIM: OnceLock<Option<CoreSim>> = OnceLock::new();
    SIM.get_or_init(|| {
        if let Err(e) = tandem_sim::available() {
            println!("skipped: {e}");
            return None;
        }
        let v = CORE.core_verilog().expect("verilog");
        Some(CoreSim::build(&Toolchain::default(), &v, "gemm_core").expect("verilator build"))
    })
    .as_ref()
}

/// One problem laid out in a memory image.
struct Problem {
    d: GemmDims,
    relu: bool,
    x: Vec<i8>,
    w: Vec<i8>,
    bias: Vec<i32>,
    rq: Vec<Requant>,
    y_at: usize,
}

impl Problem {
    fn random(
        rng: &mut ChaCha8Rng,
        m: usize,
        n: usize,
        k: usize,
        relu: bool,
        extreme: bool,
    ) -> Self {
        let x = (0..m * k).map(|_| rng.r#gen()).collect();
        let w = (0..n * k).map(|_| rng.r#gen()).collect();
        let bias = (0..n)
            .map(|_| {
                if extreme {
                    rng.r#gen()
                } else {
                    rng.gen_range(-5000..5000)
                }
            })
            .collect();
        let centre = 20 + (usize::BITS - k.leading_zeros()) as u8 / 2;
        let rq = (0..n)
            .map(|_| Requant {
                mult: rng.r#gen(),
                shift: if extreme {
                    rng.gen_range(0..=47)
                } else {
                    rng.gen_range(centre - 2..=centre + 2)
                },
            })
            .collect();
        Self {
            d: GemmDims { m, n, k },
            relu,
            x,
            w,
            bias,
            rq,
            y_at: 0,
        }
    }

    /// Appends x, w, params and a y region (filled with 0x5A) to `mem`; returns the job.
    fn place(&mut self, mem: &mut Vec<u8>) -> CoreJob {
        let GemmDims { m, n, k } = self.d;
        let (np, kp) = (pad8(n), pad8(k));
        let align = |mem: &mut Vec<u8>| mem.resize(mem.len().div_ceil(64) * 64 + 64, 0);
        align(mem);
        let px = mem.len();
        mem.extend(pad_x(&self.x, m, k).iter().map(|&v| v as u8));
        align(mem);
        let pw = mem.len();
        for word in pack_w(&self.w, n, k) {
            mem.extend(word.to_le_bytes());
        }
        align(mem);
        let pp = mem.len();
        for word in pack_params(&self.bias, &self.rq) {
            mem.extend(word.to_le_bytes());
        }
        align(mem);
        self.y_at = mem.len();
        mem.extend(std::iter::repeat_n(0x5A, m * np));
        align(mem);
        let mut job = CoreJob::default();
        job.ptrs[..4].copy_from_slice(&[px as u64, pw as u64, pp as u64, self.y_at as u64]);
        job.args[..4].copy_from_slice(&[m as u32, np as u32, kp as u32, u32::from(self.relu)]);
        job
    }

    fn check(&self, mem: &[u8], what: &str) {
        let GemmDims { m, n, .. } = self.d;
        let np = pad8(n);
        let want = golden::gemm(&self.x, &self.w, &self.bias, &self.rq, self.relu, self.d)
            .expect("golden");
        for i in 0..m {
            for j in 0..n {
                let got = mem[self.y_at + i * np + j] as i8;
                assert_eq!(got, want[i * n + j], "{what}: {:?} y[{i}][{j}]", self.d);
            }
        }
    }
}

fn run_one(s: &CoreSim, p: &mut Problem, model: MemModel, what: &str) -> u64 {
    let mut mem = Vec::new();
    let job = p.place(&mut mem);
    let r = s.run(&mut mem, &[job], model, 2_000_000).expect("sim run");
    assert!(r.jobs[0].done, "{what}: no done");
    p.check(&mem, what);
    r.jobs[0].cycles
}

#[test]
fn gemm_rtl_matches_golden_random_and_edges() {
    let Some(s) = sim() else { return };
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let shapes = [
        (1, 1, 1),
        (4, 8, 8),
        (5, 13, 37),
        (3, 64, 256),
        (9, 24, 100),
        (13, 7, 3),
    ];
    for (i, &(m, n, k)) in shapes.iter().enumerate() {
        let relu = i % 2 == 1;
        let mut p = Problem::random(&mut rng, m, n, k, relu, false);
        run_one(s, &mut p, MemModel::default(), "random");
        let mut p = Problem::random(&mut rng, m, n, k, !relu, true);
        run_one(
            s,
            &mut p,
            MemModel {
                latency: 3,
                stall_pct: 30,
                seed: i as u64 + 9,
                outstanding: 2,
            },
            "extreme+stalls",
        );
    }
}

#[test]
fn gemm_rtl_saturation_and_wrapping_bias() {
    let Some(s) = sim() else { return };
    let (m, n, k) = (6, 16, 64);
    let mut p = Problem {
        d: GemmDims { m, n, k },
        relu: false,
        x: vec![-128; m * k],
        // rows of w alternate +127 / -128 in pairs: positive and negative accumulators
        w: (0..n * k)
            .map(|i| if (i / k / 2) % 2 == 0 { 127 } else { -128 })
            .collect(),
        // near i32::MAX the bias add wraps for positive accumulators
        bias: (0..n as i32)
            .map(|i| if i % 2 == 0 { i32::MAX - 10 } else { -1000 })
            .collect(),
        rq: (0..n)
            .map(|i| Requant {
                mult: 65535 - i as u16,
                shift: (i * 3) as u8,
            })
            .collect(),
        y_at: 0,
    };
    let want = golden::gemm(&p.x, &p.w, &p.bias, &p.rq, false, p.d).expect("golden");
    assert!(
        want.contains(&127) && want.contains(&-128),
        "edge case must saturate both ways"
    );
    run_one(s, &mut p, MemModel::default(), "saturation");
}

#[test]
fn gemm_rtl_back_to_back_and_reset_midway() {
    let Some(s) = sim() else { return };
    let mut rng = ChaCha8Rng::seed_from_u64(6);
    let mut a = Problem::random(&mut rng, 7, 20, 48, true, false);
    let mut b = Problem::random(&mut rng, 4, 8, 200, false, false);
    let mut mem = Vec::new();
    let ja = a.place(&mut mem);
    let jb = b.place(&mut mem);
    let aborted = CoreJob {
        reset_after: Some(150),
        ..jb
    };
    // an out-of-range job finishes at once without touching memory
    let mut bad = ja;
    bad.args[2] = 12;
    let r = s
        .run(
            &mut mem,
            &[ja, aborted, bad, jb, ja],
            MemModel::default(),
            2_000_000,
        )
        .expect("sim run");
    assert!(
        r.jobs[0].done && !r.jobs[1].done && r.jobs[2].done && r.jobs[3].done && r.jobs[4].done
    );
    assert!(
        r.jobs[2].cycles <= 2,
        "bad args must finish at once: {:?}",
        r.jobs[2]
    );
    a.check(&mem, "back-to-back a");
    b.check(&mem, "after reset b");
}

#[test]
fn gemm_rtl_utilisation_on_many_tiles() {
    let Some(s) = sim() else { return };
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let (m, n, k) = (16, 64, 256);
    let mut p = Problem::random(&mut rng, m, n, k, false, false);
    let mut mem = Vec::new();
    let job = p.place(&mut mem);
    let r = s
        .run(
            &mut mem,
            &[job],
            MemModel {
                latency: 20,
                stall_pct: 0,
                seed: 3,
                outstanding: 4,
            },
            2_000_000,
        )
        .expect("sim run");
    p.check(&mem, "utilisation");
    let ideal = CORE.ideal_cycles(m, n, k);
    let util = ideal as f64 / r.jobs[0].cycles as f64;
    println!(
        "gemm rows={} M={m} N={n} K={k}: {} cycles, ideal {ideal}, array busy {:.1}%, {:.0} cycles/s simulated",
        CORE.rows,
        r.jobs[0].cycles,
        util * 100.0,
        r.cycles_per_sec
    );
    assert!(util >= 0.90, "array busy {:.1}% < 90%", util * 100.0);
}

/// `verilator --lint-only -Wall` is clean (in-file waivers: UNUSED, WIDTH) and yosys
/// `synth_xilinx` maps a small build to LUTs, FFs and DSPs.
#[test]
fn gemm_core_lints_and_synthesizes() {
    let small = GemmCore {
        rows: 2,
        k_max: 64,
        n_max: 16,
        lanes: 8,
        w_ports: false,
    };
    let verilog = small.core_verilog().expect("verilog");
    if let Some(r) =
        tandem_tests::lint_and_synth(&verilog, "gemm_core").expect("lint and synthesis")
    {
        println!("gemm rows=2: {r:?}");
        assert!(r.dsp >= 16 && r.ff > 500 && r.lut > 500, "{r:?}");
    }
}
