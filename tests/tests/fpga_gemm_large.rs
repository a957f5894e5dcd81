//! Larger core configurations than the default suite simulates, for the utilisation numbers
//! of docs/FPGA.md: a 16 x 8 GEMM array and 64 + 64 attention lanes, bit-exact against the
//! golden models. Ignored by default (a few minutes of Verilator build on 2 cores):
//! `cargo test -p tandem-tests --test fpga_gemm_large -- --ignored --nocapture`.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tandem_fpga::core::KernelCore;
use tandem_fpga::golden::attention::{self as gatt, AttentionConfig};
use tandem_fpga::golden::gemm::{self as ggemm, GemmDims, GemmProblem};
use tandem_fpga::kernels::attention::AttentionCore;
use tandem_fpga::kernels::gemm::{GemmCore, pack_params, pack_w};
use tandem_sim::Toolchain;
use tandem_sim::core_sim::{CoreJob, CoreSim, MemModel};

fn push(mem: &mut Vec<u8>, bytes: &[u8]) -> u64 {
    mem.resize(mem.len().div_ceil(64) * 64, 0);
    let at = mem.len() as u64;
    mem.extend_from_slice(bytes);
    at
}

#[test]
#[ignore = "larger configuration: minutes of Verilator build"]
fn gemm_16x8_array_utilisation() {
    let core = GemmCore {
        rows: 16,
        k_max: 1024,
        n_max: 512,
        lanes: 8,
        w_ports: false,
    };
    gemm_utilisation(core, &[(64, 512, 512)], 0.90);
}

#[test]
#[ignore = "U55C-sized array: many minutes of Verilator build"]
fn gemm_64x8_u55c_array_utilisation() {
    gemm_utilisation(
        GemmCore::u55c(),
        &[(128, 1024, 1024), (128, 1024, 256)],
        0.90,
    );
}

fn gemm_utilisation(core: GemmCore, problems: &[(usize, usize, usize)], min_busy: f64) {
    if let Err(e) = tandem_sim::available() {
        println!("skipped: {e}");
        return;
    }
    let v = core.core_verilog().expect("verilog");
    let s = CoreSim::build(&Toolchain::default(), &v, "gemm_core").expect("build");
    let mut rng = ChaCha8Rng::seed_from_u64(41);
    for &(m, n, k) in problems {
        let GemmProblem { x, w, bias, rq, .. } =
            GemmProblem::random(&mut rng, GemmDims { m, n, k }, 23..=27);
        let mut mem = Vec::new();
        let px = push(&mut mem, &x.iter().map(|&v| v as u8).collect::<Vec<_>>());
        let pw = push(
            &mut mem,
            &pack_w(&w, n, k)
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect::<Vec<_>>(),
        );
        let pp = push(
            &mut mem,
            &pack_params(&bias, &rq)
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect::<Vec<_>>(),
        );
        let py = push(&mut mem, &vec![0u8; m * n]);
        let mut job = CoreJob::default();
        job.ptrs[..4].copy_from_slice(&[px, pw, pp, py]);
        job.args[..4].copy_from_slice(&[m as u32, n as u32, k as u32, 1]);
        let r = s
            .run(
                &mut mem,
                &[job],
                MemModel {
                    latency: 30,
                    ..MemModel::default()
                },
                10_000_000,
            )
            .expect("run");
        assert!(r.jobs[0].done);
        let want = ggemm::gemm(&x, &w, &bias, &rq, true, GemmDims { m, n, k }).expect("golden");
        let got: Vec<i8> = mem[py as usize..py as usize + m * n]
            .iter()
            .map(|&b| b as i8)
            .collect();
        assert_eq!(got, want);
        let ideal = core.ideal_cycles(m, n, k);
        let util = ideal as f64 / r.jobs[0].cycles as f64;
        println!(
            "gemm rows={} M={m} N={n} K={k}: {} cycles, ideal {ideal}, busy {:.1}%, {:.0} cycles/s",
            core.rows,
            r.jobs[0].cycles,
            util * 100.0,
            r.cycles_per_sec
        );
        assert!(util >= min_busy, "busy {:.1}%", util * 100.0);
    }
}

#[test]
#[ignore = "larger configuration: minutes of Verilator build"]
fn attention_64_lanes_utilisation() {
    if let Err(e) = tandem_sim::available() {
        println!("skipped: {e}");
        return;
    }
    let core = AttentionCore {
        d_max: 64,
        nkv_max: 1024,
        kv_tile: 16,
        q_rows: 1,
    };
    let v = core.core_verilog().expect("verilog");
    let s = CoreSim::build(&Toolchain::default(), &v, "attention_core").expect("build");
    let mut rng = ChaCha8Rng::seed_from_u64(42);
    // (nq, nkv, causal, least busy fraction the cycle model predicts: K/V load amortised over
    // Nq rows, the bottom-right triangle when causal).
    for &(nq, nkv, causal, min_busy) in &[
        (256, 512, false, 0.90),
        (384, 384, true, 0.85),
        (64, 512, false, 0.75),
    ] {
        let d = 64;
        let mut g = |n: usize| -> Vec<i8> { (0..n).map(|_| rng.r#gen()).collect() };
        let (q, k, v) = (g(nq * d), g(nkv * d), g(nkv * d));
        let (score_mult, score_shift) =
            AttentionConfig::score_multiplier(0.125, 0.02, 0.02).expect("scale");
        let cfg = AttentionConfig {
            nq,
            nkv,
            d,
            kv_tile: 16,
            causal,
            score_mult,
            score_shift,
        };
        let b = |x: &[i8]| x.iter().map(|&v| v as u8).collect::<Vec<u8>>();
        let mut mem = Vec::new();
        let (pq, pk, pv) = (
            push(&mut mem, &b(&q)),
            push(&mut mem, &b(&k)),
            push(&mut mem, &b(&v)),
        );
        let po = push(&mut mem, &vec![0u8; nq * d * 2]);
        let ps = push(&mut mem, &vec![0u8; nq * 8]);
        let mut job = CoreJob::default();
        job.ptrs[..5].copy_from_slice(&[pq, pk, pv, po, ps]);
        job.args[..6].copy_from_slice(&[
            nq as u32,
            nkv as u32,
            d as u32,
            u32::from(causal),
            u32::from(score_mult),
            u32::from(score_shift),
        ]);
        let r = s
            .run(
                &mut mem,
                &[job],
                MemModel {
                    latency: 30,
                    ..MemModel::default()
                },
                10_000_000,
            )
            .expect("run");
        assert!(r.jobs[0].done);
        let want = gatt::attention(&q, &k, &v, &cfg).expect("golden");
        let o: Vec<i16> = mem[po as usize..po as usize + nq * d * 2]
            .chunks_exact(2)
            .map(|c| i16::from_le_bytes([c[0], c[1]]))
            .collect();
        assert_eq!(o, want.o, "{cfg:?}");
        let pairs: usize = (0..nq)
            .map(|i| (0..nkv).filter(|&j| cfg.visible(i, j)).count())
            .sum();
        let util = pairs as f64 / r.jobs[0].cycles as f64;
        println!(
            "attention d=64 Nq={nq} Nkv={nkv} causal={causal}: {} cycles, {pairs} pairs, busy {:.1}%, {:.0} cycles/s",
            r.jobs[0].cycles,
            util * 100.0,
            r.cycles_per_sec
        );
        assert!(util >= min_busy, "busy {:.1}%", util * 100.0);
    }
}
