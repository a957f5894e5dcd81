//! The query-parallel attention core (`q_rows` = 2 and 4, small `d_max`) under Verilator
//! against fpga::golden::attention_skip, bit for bit, row by row: random shapes, causal and
//! not, Nq not a multiple of q_rows, Nq < Nkv and Nq > Nkv (rows without keys), GQA groups
//! (heads > 1, rows of two heads in one group), kv_skip != 0, wild score scales, AXI stalls,
//! outputs poisoned before the run. Prints "skipped: <reason>" where Verilator is missing.

use std::sync::OnceLock;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tandem_fpga::core::KernelCore;
use tandem_fpga::golden::attention::{self as golden, AttentionConfig};
use tandem_fpga::kernels::attention::AttentionCore;
use tandem_fpga::kernels::gemm::pad8;
use tandem_sim::Toolchain;
use tandem_sim::core_sim::{CoreJob, CoreSim, MemModel};

const R2: AttentionCore = AttentionCore {
    d_max: 16,
    nkv_max: 64,
    kv_tile: 4,
    q_rows: 2,
};
const R4: AttentionCore = AttentionCore {
    d_max: 8,
    nkv_max: 64,
    kv_tile: 8,
    q_rows: 4,
};

fn build(
    core: &AttentionCore,
    cell: &'static OnceLock<Option<CoreSim>>,
) -> Option<&'static CoreSim> {
    cell.get_or_init(|| {
        if let Err(e) = tandem_sim::available() {
            println!("skipped: {e}");
            return None;
        }
        let v = core.core_verilog().expect("verilog");
        Some(CoreSim::build(&Toolchain::default(), &v, "attention_core").expect("verilator build"))
    })
    .as_ref()
}

fn sim2() -> Option<&'static CoreSim> {
    static SIM: OnceLock<Option<CoreSim>> = OnceLock::new();
    build(&R2, &SIM)
}

fn sim4() -> Option<&'static CoreSim> {
    static SIM: OnceLock<Option<CoreSim>> = OnceLock::new();
    build(&R4, &SIM)
}

/// One launch: `heads` query heads of `nq` rows each over one K/V of `nkv` keys.
struct Launch {
    cfg: AttentionConfig,
    heads: usize,
    kv_skip: usize,
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

impl Launch {
    #[allow(clippy::too_many_arguments)]
    fn random(
        rng: &mut ChaCha8Rng,
        core: &AttentionCore,
        nq: usize,
        nkv: usize,
        d: usize,
        causal: bool,
        heads: usize,
        kv_skip: usize,
        wild: bool,
    ) -> Self {
        let mut g = |n: usize| -> Vec<i8> { (0..n).map(|_| rng.r#gen()).collect() };
        let (q, k, v) = (g(heads * nq * d), g(nkv * d), g(nkv * d));
        let (score_mult, score_shift) = if wild {
            (rng.r#gen::<u16>(), rng.gen_range(8..=30))
        } else {
            AttentionConfig::score_multiplier(1.0 / (d as f64).sqrt(), 0.02, 0.02).expect("scale")
        };
        let cfg = AttentionConfig {
            nq,
            nkv,
            d,
            kv_tile: core.kv_tile as usize,
            causal,
            score_mult,
            score_shift,
        };
        Self {
            cfg,
            heads,
            kv_skip,
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
        let rows = self.heads * c.nq;
        let align = |mem: &mut Vec<u8>| mem.resize(mem.len().div_ceil(64) * 64 + 64, 0);
        align(mem);
        let pq = mem.len();
        mem.extend(pad_rows(&self.q, rows, c.d));
        align(mem);
        let pk = mem.len();
        mem.extend(pad_rows(&self.k, c.nkv, c.d));
        align(mem);
        let pv = mem.len();
        mem.extend(pad_rows(&self.v, c.nkv, c.d));
        align(mem);
        // poison: every output byte 0xA5 until the kernel writes it
        self.o_at = mem.len();
        mem.extend(std::iter::repeat_n(0xA5, rows * dp * 2));
        align(mem);
        self.s_at = mem.len();
        mem.extend(std::iter::repeat_n(0xA5, rows * 8));
        align(mem);
        let mut job = CoreJob::default();
        job.ptrs[..5].copy_from_slice(&[pq, pk, pv, self.o_at, self.s_at].map(|p| p as u64));
        job.args[..8].copy_from_slice(&[
            c.nq as u32,
            c.nkv as u32,
            dp as u32,
            u32::from(c.causal),
            u32::from(c.score_mult),
            u32::from(c.score_shift),
            self.heads as u32,
            self.kv_skip as u32,
        ]);
        job
    }

    fn check(&self, mem: &[u8], what: &str) {
        let c = self.cfg;
        let dp = pad8(c.d);
        for h in 0..self.heads {
            let q = &self.q[h * c.nq * c.d..(h + 1) * c.nq * c.d];
            let want =
                golden::attention_skip(q, &self.k, &self.v, &c, self.kv_skip).expect("golden");
            for i in 0..c.nq {
                let row = h * c.nq + i;
                let s = self.s_at + 8 * row;
                let e = i32::from_le_bytes(mem[s..s + 4].try_into().expect("4 bytes"));
                let l = u32::from_le_bytes(mem[s + 4..s + 8].try_into().expect("4 bytes"));
                assert_eq!(
                    (e, l),
                    (want.e[i], want.l[i]),
                    "{what}: {c:?} heads {} kv_skip {} head {h} row {i} (e, l)",
                    self.heads,
                    self.kv_skip
                );
                for j in 0..c.d {
                    let a = self.o_at + 2 * (row * dp + j);
                    let got = i16::from_le_bytes([mem[a], mem[a + 1]]);
                    assert_eq!(
                        got,
                        want.o[i * c.d + j],
                        "{what}: {c:?} heads {} kv_skip {} head {h} o[{i}][{j}]",
                        self.heads,
                        self.kv_skip
                    );
                }
            }
        }
    }
}

fn run_one(s: &CoreSim, p: &mut Launch, model: MemModel, what: &str) -> u64 {
    let mut mem = Vec::new();
    let job = p.place(&mut mem);
    let r = s.run(&mut mem, &[job], model, 2_000_000).expect("sim run");
    assert!(r.jobs[0].done, "{what}: {:?} no done", p.cfg);
    p.check(&mem, what);
    r.jobs[0].cycles
}

/// Fixed edge shapes, then random ones, on one build.
fn sweep(s: &CoreSim, core: &AttentionCore, seed: u64, randoms: usize) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let r = core.q_rows as usize;
    let dm = core.d_max as usize;
    // (nq, nkv, d, causal, heads, kv_skip)
    let mut shapes = vec![
        (1, 1, 8, false, 1, 0),
        (r + 1, 9, dm, false, 1, 0),
        (2 * r - 1, 13, dm, true, 1, 0),
        (3 * r + 1, 5, dm, true, 1, 0), // Nq > Nkv: the first rows see no key
        (r - 1, 21, dm - 3, true, 1, 0), // Nq < Nkv, one partial group
        (3, 7, 8, true, r, 0),          // GQA: groups span heads
        (5, 11, dm, true, 2, 4),        // kv_skip
        (7, 3, dm, true, 3, 0),
        (1, 17, dm, true, r + 1, 2),
    ];
    for _ in 0..randoms {
        shapes.push((
            rng.gen_range(1..=3 * r + 2),
            rng.gen_range(1..=40),
            rng.gen_range(1..=dm),
            rng.r#gen(),
            rng.gen_range(1..=3),
            if rng.gen_bool(0.3) {
                rng.gen_range(1..=6)
            } else {
                0
            },
        ));
    }
    for (n, &(nq, nkv, d, causal, heads, kv_skip)) in shapes.iter().enumerate() {
        let wild = n % 3 == 2;
        let mut p = Launch::random(&mut rng, core, nq, nkv, d, causal, heads, kv_skip, wild);
        let model = if n % 2 == 0 {
            MemModel::default()
        } else {
            MemModel {
                latency: 5,
                stall_pct: 25,
                seed: n as u64 + 3,
                outstanding: 2,
            }
        };
        run_one(s, &mut p, model, &format!("q_rows {r} shape {n}"));
    }
}

#[test]
fn attention_rows2_matches_golden() {
    let Some(s) = sim2() else { return };
    sweep(s, &R2, 31, 14);
}

#[test]
fn attention_rows4_matches_golden() {
    let Some(s) = sim4() else { return };
    sweep(s, &R4, 32, 14);
}

#[test]
fn attention_rows_growing_scores_back_to_back_and_reset_midway() {
    let Some(s) = sim4() else { return };
    let mut rng = ChaCha8Rng::seed_from_u64(33);
    // scores that grow key by key: every tile raises every row's exponent
    let (nkv, d) = (45, 8);
    let mut g = Launch::random(&mut rng, &R4, 6, nkv, d, false, 1, 0, false);
    g.cfg.score_mult = 65535;
    g.cfg.score_shift = 12;
    g.q = (0..6 * d).map(|i| (i / d) as i8 + 1).collect();
    g.k = (0..nkv * d)
        .map(|i| ((i / d) as i32 * 4 - 120).clamp(-128, 127) as i8)
        .collect();
    run_one(s, &mut g, MemModel::default(), "growing");
    // two launches back to back, a refused one between them
    let mut a = Launch::random(&mut rng, &R4, 9, 30, 8, true, 2, 1, false);
    let mut b = Launch::random(&mut rng, &R4, 5, 17, 5, false, 1, 0, true);
    let mut mem = Vec::new();
    let ja = a.place(&mut mem);
    let jb = b.place(&mut mem);
    let mut bad = jb;
    bad.args[2] = 16; // d above this build's d_max
    // a launch reset midway (rows parked for the finaliser must not leak into the next)
    let aborted = CoreJob {
        reset_after: Some(150),
        ..ja
    };
    let r = s
        .run(
            &mut mem,
            &[aborted, ja, bad, jb],
            MemModel::default(),
            2_000_000,
        )
        .expect("sim run");
    assert!(
        !r.jobs[0].done && r.jobs[1].done && r.jobs[2].done && r.jobs[3].done,
        "{:?}",
        r.jobs
    );
    assert!(
        r.jobs[2].cycles <= 2,
        "bad args must finish at once: {:?}",
        r.jobs[2]
    );
    a.check(&mem, "back-to-back a");
    b.check(&mem, "back-to-back b");
}

/// `verilator --lint-only -Wall` is clean (in-file waivers: UNUSED, WIDTH) and yosys
/// `synth_xilinx` maps a small query-parallel build.
#[test]
fn attention_rows_core_lints_and_synthesizes() {
    let small = AttentionCore {
        d_max: 8,
        nkv_max: 32,
        kv_tile: 4,
        q_rows: 2,
    };
    let verilog = small.core_verilog().expect("verilog");
    if let Some(r) =
        tandem_tests::lint_and_synth(&verilog, "attention_core").expect("lint and synthesis")
    {
        println!("attention d_max=8 q_rows=2: {r:?}");
        assert!(r.dsp >= 16 && r.ff > 1000 && r.lut > 1000, "{r:?}");
    }
}

/// The card build (`AttentionCore::u55c_rows`: q_rows 8 x d_max 128, 2,048 MACs) lints clean
/// under `verilator --lint-only -Wall` (its synthesis is a slice, docs/FPGA.md).
#[test]
fn attention_rows_card_build_lints() {
    let verilog = AttentionCore::u55c_rows().core_verilog().expect("verilog");
    let dir = std::env::temp_dir().join(format!("tandem-lint-rows-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("attention_core.v");
    std::fs::write(&path, verilog).expect("write verilog");
    match std::process::Command::new("verilator")
        .args(["--lint-only", "-Wall", "--top-module", "attention_core"])
        .arg(&path)
        .output()
    {
        Ok(out) => {
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(
                out.status.success() && !err.contains("%Warning"),
                "verilator lint of the card build: {err}"
            );
        }
        Err(e) => println!("skipped: verilator not found ({e})"),
    }
    std::fs::remove_dir_all(&dir).ok();
}
