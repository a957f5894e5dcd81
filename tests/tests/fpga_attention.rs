//! Attention core RTL (Verilator) against fpga::golden::attention, bit for bit: random shapes,
//! causal with Nq != Nkv (rows without keys), Nkv not a multiple of the tile, head dims off
//! the lane count, extreme score scales, back-to-back jobs, stalls, reset in the middle; and the
//! MAC arrays' utilisation on a problem of many tiles. Prints "skipped: <reason>" where
//! Verilator is missing.

use std::sync::OnceLock;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tandem_fpga::core::KernelCore;
use tandem_fpga::golden::attention::{self as golden, AttentionConfig};
use tandem_fpga::kernels::attention::AttentionCore;
use tandem_fpga::kernels::gemm::pad8;
use tandem_sim::Toolchain;
use tandem_sim::core_sim::{CoreJob, CoreSim, MemModel};

const CORE: AttentionCore = AttentionCore {
    d_max: 16,
    nkv_max: 256,
    kv_tile: 8,
    q_rows: 1,
};

fn sim() -> Option<&'static CoreSim> {
    static SIM: OnceLock<Option<CoreSim>> = OnceLock::new();
    SIM.get_or_init(|| {
        if let Err(e) = tandem_sim::available() {
            println!("skipped: {e}");
            return None;
        }
        let v = CORE.core_verilog().expect("verilog");
        Some(CoreSim::build(&Toolchain::default(), &v, "attention_core").expect("verilator build"))
    })
    .as_ref()
}

struct Problem {
    cfg: AttentionConfig,
    q: Vec<i8>,
    k: Vec<i8>,
    v: Vec<i8>,
    o_at: usize,
    s_at: usize,
}

fn pad_rows(x: &[i8], rows: usize, d: usize) -> Vec<u8> {
    let dp = pad8(d);
    let mut out = vec![0u8; rows * dp];
    for r in 0..rows {
        for c in 0..d {
            out[r * dp + c] = x[r * d + c] as u8;
        }
    }
    out
}

impl Problem {
    fn random(
        rng: &mut ChaCha8Rng,
        nq: usize,
        nkv: usize,
        d: usize,
        causal: bool,
        wild: bool,
    ) -> Self {
        let mut g = |n: usize| -> Vec<i8> { (0..n).map(|_| rng.r#gen()).collect() };
        let (q, k, v) = (g(nq * d), g(nkv * d), g(nkv * d));
        let (score_mult, score_shift) = if wild {
            (rng.r#gen::<u16>(), rng.gen_range(8..=30))
        } else {
            AttentionConfig::score_multiplier(1.0 / (d as f64).sqrt(), 0.02, 0.02).expect("scale")
        };
        let cfg = AttentionConfig {
            nq,
            nkv,
            d,
            kv_tile: CORE.kv_tile as usize,
            causal,
            score_mult,
            score_shift,
        };
        Self {
            cfg,
            q,
            k,
            v,
            o_at: 0,
            s_at: 0,
        }
    }

    fn place(&mut self, mem: &mut Vec<u8>) -> CoreJob {
        let c = self.cfg;
        let dp = pad8(c.d);
        let align = |mem: &mut Vec<u8>| mem.resize(mem.len().div_ceil(64) * 64 + 64, 0);
        align(mem);
        let pq = mem.len();
        mem.extend(pad_rows(&self.q, c.nq, c.d));
        align(mem);
        let pk = mem.len();
        mem.extend(pad_rows(&self.k, c.nkv, c.d));
        align(mem);
        let pv = mem.len();
        mem.extend(pad_rows(&self.v, c.nkv, c.d));
        align(mem);
        self.o_at = mem.len();
        mem.extend(std::iter::repeat_n(0xA5, c.nq * dp * 2));
        align(mem);
        self.s_at = mem.len();
        mem.extend(std::iter::repeat_n(0xA5, c.nq * 8));
        align(mem);
        let mut job = CoreJob::default();
        job.ptrs[..5].copy_from_slice(&[pq, pk, pv, self.o_at, self.s_at].map(|p| p as u64));
        job.args[..6].copy_from_slice(&[
            c.nq as u32,
            c.nkv as u32,
            dp as u32,
            u32::from(c.causal),
            u32::from(c.score_mult),
            u32::from(c.score_shift),
        ]);
        job
    }

    fn check(&self, mem: &[u8], what: &str) {
        let c = self.cfg;
        let dp = pad8(c.d);
        let want = golden::attention(&self.q, &self.k, &self.v, &c).expect("golden");
        for i in 0..c.nq {
            let s = self.s_at + 8 * i;
            let e = i32::from_le_bytes(mem[s..s + 4].try_into().expect("4 bytes"));
            let l = u32::from_le_bytes(mem[s + 4..s + 8].try_into().expect("4 bytes"));
            assert_eq!(
                (e, l),
                (want.e[i], want.l[i]),
                "{what}: {c:?} row {i} (e, l)"
            );
            for j in 0..c.d {
                let a = self.o_at + 2 * (i * dp + j);
                let got = i16::from_le_bytes([mem[a], mem[a + 1]]);
                assert_eq!(got, want.o[i * c.d + j], "{what}: {c:?} o[{i}][{j}]");
            }
        }
    }
}

fn run_one(s: &CoreSim, p: &mut Problem, model: MemModel, what: &str) -> u64 {
    let mut mem = Vec::new();
    let job = p.place(&mut mem);
    let r = s.run(&mut mem, &[job], model, 2_000_000).expect("sim run");
    assert!(r.jobs[0].done, "{what}: {:?} no done", p.cfg);
    p.check(&mem, what);
    r.jobs[0].cycles
}

#[test]
fn attention_rtl_matches_golden_random_and_edges() {
    let Some(s) = sim() else { return };
    let mut rng = ChaCha8Rng::seed_from_u64(21);
    let shapes = [
        (1, 1, 8, false),
        (4, 8, 16, false),
        (5, 13, 16, true),
        (13, 5, 16, true),
        (7, 7, 3, true),
        (3, 37, 11, false),
        (9, 40, 16, true),
    ];
    for (n, &(nq, nkv, d, causal)) in shapes.iter().enumerate() {
        let mut p = Problem::random(&mut rng, nq, nkv, d, causal, false);
        run_one(s, &mut p, MemModel::default(), "tame");
        let mut p = Problem::random(&mut rng, nq, nkv, d, causal, true);
        let model = MemModel {
            latency: 5,
            stall_pct: 25,
            seed: n as u64 + 3,
            outstanding: 2,
        };
        run_one(s, &mut p, model, "wild scale + stalls");
    }
}

#[test]
fn attention_rtl_growing_scores_rescale_every_tile() {
    let Some(s) = sim() else { return };
    let (nkv, d) = (61, 16);
    let mut p = Problem {
        cfg: AttentionConfig {
            nq: 2,
            nkv,
            d,
            kv_tile: CORE.kv_tile as usize,
            causal: false,
            score_mult: 65535,
            score_shift: 12,
        },
        q: vec![1; 2 * d],
        k: (0..nkv * d)
            .map(|i| ((i / d) as i32 * 4 - 120).clamp(-128, 127) as i8)
            .collect(),
        v: (0..nkv * d).map(|i| (i % 251) as i8).collect(),
        o_at: 0,
        s_at: 0,
    };
    run_one(s, &mut p, MemModel::default(), "growing");
}

#[test]
fn attention_rtl_back_to_back_and_reset_midway() {
    let Some(s) = sim() else { return };
    let mut rng = ChaCha8Rng::seed_from_u64(22);
    let mut a = Problem::random(&mut rng, 6, 30, 16, true, false);
    let mut b = Problem::random(&mut rng, 11, 17, 8, false, true);
    let mut mem = Vec::new();
    let ja = a.place(&mut mem);
    let jb = b.place(&mut mem);
    let aborted = CoreJob {
        reset_after: Some(120),
        ..ja
    };
    let mut bad = jb;
    bad.args[2] = 12; // d not a multiple of 8
    let r = s
        .run(
            &mut mem,
            &[jb, aborted, bad, ja],
            MemModel::default(),
            2_000_000,
        )
        .expect("sim run");
    assert!(
        r.jobs[0].done && !r.jobs[1].done && r.jobs[2].done && r.jobs[3].done,
        "{:?}",
        r.jobs
    );
    assert!(
        r.jobs[2].cycles <= 2,
        "bad args must finish at once: {:?}",
        r.jobs[2]
    );
    a.check(&mem, "after reset a");
    b.check(&mem, "back-to-back b");
}

#[test]
fn attention_rtl_utilisation_on_many_tiles() {
    let Some(s) = sim() else { return };
    let mut rng = ChaCha8Rng::seed_from_u64(23);
    for &(nq, nkv, causal) in &[(48, 192, false), (96, 96, true)] {
        let mut p = Problem::random(&mut rng, nq, nkv, CORE.d_max as usize, causal, false);
        let mut mem = Vec::new();
        let job = p.place(&mut mem);
        let model = MemModel {
            latency: 20,
            stall_pct: 0,
            seed: 4,
            outstanding: 4,
        };
        let r = s.run(&mut mem, &[job], model, 5_000_000).expect("sim run");
        assert!(r.jobs[0].done);
        p.check(&mem, "utilisation");
        let pairs: usize = (0..nq)
            .map(|i| (0..nkv).filter(|&j| p.cfg.visible(i, j)).count())
            .sum();
        let util = pairs as f64 / r.jobs[0].cycles as f64;
        println!(
            "attention d={} Nq={nq} Nkv={nkv} causal={causal}: {} cycles for {pairs} (q, k) pairs, MAC arrays busy {:.1}%, {:.0} cycles/s simulated",
            CORE.d_max,
            r.jobs[0].cycles,
            util * 100.0,
            r.cycles_per_sec
        );
        assert!(util >= 0.80, "MAC arrays busy {:.1}% < 80%", util * 100.0);
    }
}

/// `verilator --lint-only -Wall` is clean (in-file waivers: UNUSED, WIDTH) and yosys
/// `synth_xilinx` maps a small build.
#[test]
fn attention_core_lints_and_synthesizes() {
    let small = AttentionCore {
        d_max: 8,
        nkv_max: 32,
        kv_tile: 4,
        q_rows: 1,
    };
    let verilog = small.core_verilog().expect("verilog");
    if let Some(r) =
        tandem_tests::lint_and_synth(&verilog, "attention_core").expect("lint and synthesis")
    {
        println!("attention d_max=8: {r:?}");
        assert!(r.dsp >= 8 && r.ff > 500 && r.lut > 500, "{r:?}");
    }
}
