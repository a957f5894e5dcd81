//! The modelled card against the RTL: on random shapes of every kernel, both cards run the same
//! problem through the same drivers; the outputs must be equal bit for bit, and the modelled
//! cycles (`tandem_fpga::timing`) within 5% of the RTL's simulated cycles. Also: both cards
//! refuse the same arguments with the same message. Skipped (with the reason) where
//! Verilator is missing.

use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tandem_fpga::core::KernelCore;
use tandem_fpga::drive::{
    AttentionDims, KvHead, QueryHead, run_attention, run_attention_split, run_gemm, run_gemm_split,
    run_router_with,
};
use tandem_fpga::golden::gemm::{GemmDims, GemmProblem};
use tandem_fpga::kernels::attention::AttentionCore;
use tandem_fpga::kernels::gemm::GemmCore;
use tandem_fpga::kernels::router::RouterCore;
use tandem_fpga::shell::ShellConfig;
use tandem_fpga::{FpgaDevice, RunStats};
use tandem_sim::{ModelCard, ModelConfig, SimCard, SimConfig};

const T: Duration = Duration::from_secs(300);
/// Shapes per kernel.
const SHAPES: usize = 32;
/// Largest relative difference of modelled and simulated cycles.
const TOLERANCE: f64 = 0.05;

fn cards(core: &dyn KernelCore) -> Option<(SimCard, ModelCard)> {
    cards_with(core, tandem_sim::MemConfig::default())
}

/// Both cards with the memory `mem` (latency, bandwidth).
fn cards_with(core: &dyn KernelCore, mem: tandem_sim::MemConfig) -> Option<(SimCard, ModelCard)> {
    let mut rtl = match SimCard::open(SimConfig {
        mem,
        ..SimConfig::default()
    }) {
        Ok(c) => c,
        Err(e) => {
            println!("SKIP: {e}");
            return None;
        }
    };
    rtl.load_core(core, ShellConfig::default())
        .expect("RTL build loads");
    let mut model = ModelCard::open(ModelConfig {
        mem,
        ..ModelConfig::default()
    });
    model
        .load_core(core, ShellConfig::default())
        .expect("model loads");
    Some((rtl, model))
}

/// Records one shape's cycles; returns the relative difference.
fn compare(what: &str, rtl: &RunStats, model: &RunStats, worst: &mut Vec<(f64, String)>) {
    let rel = (model.cycles as f64 - rtl.cycles as f64).abs() / rtl.cycles.max(1) as f64;
    println!(
        "{what}: RTL {} cycles, model {} ({:+.2}%)",
        rtl.cycles,
        model.cycles,
        100.0 * (model.cycles as f64 / rtl.cycles.max(1) as f64 - 1.0)
    );
    worst.push((rel, what.to_string()));
}

fn verdict(kernel: &str, mut diffs: Vec<(f64, String)>) {
    diffs.sort_by(|a, b| b.0.total_cmp(&a.0));
    assert!(diffs.len() >= 30, "{kernel}: only {} shapes", diffs.len());
    let (rel, what) = &diffs[0];
    println!("{kernel}: worst {:.2}% at {what}", 100.0 * rel);
    let bad: Vec<_> = diffs.iter().filter(|(r, _)| *r > TOLERANCE).collect();
    assert!(bad.is_empty(), "{kernel}: beyond 5%: {bad:?}");
}

/// Every lane count of the router (1, 2, 4 on 64 bits, 8 on 128, 16 on 256), 32 shapes
/// each, renormalize on and off.
#[test]
fn router_model_matches_the_rtl() {
    for lanes in tandem_fpga::kernels::router::ROUTER_LANES {
        // each lane count on the narrowest port that holds it (1, 2, 4: 64 bits; 8: 128; 16:
        // 256)
        let core = RouterCore::with_lanes(256, 8, lanes);
        let Some((mut rtl, mut model)) = cards(&core) else {
            return;
        };
        let mut rng = ChaCha8Rng::seed_from_u64(0x70c + u64::from(lanes));
        let mut diffs = Vec::new();
        // Mixtral's and DeepSeek's shapes, rows shorter than the merge, T = 1; then random
        let fixed = [
            (512, 8, 2),
            (64, 256, 8),
            (300, 3, 3),
            (200, 5, 1),
            (1, 64, 8),
        ];
        for i in 0..SHAPES {
            let (t, e, k) = match fixed.get(i) {
                Some(&s) => s,
                None => {
                    let e = rng.gen_range(1..=core.e_max as usize);
                    let k = rng.gen_range(1..=e.min(core.k_max as usize));
                    (rng.gen_range(1..=4096 / e.max(8)), e, k)
                }
            };
            let rn = i % 2 == 0;
            let logits: Vec<i16> = (0..t * e).map(|_| rng.gen_range(-3000..3000)).collect();
            let (a, sa) =
                run_router_with(&mut rtl, &core, &logits, t, e, k, rn, T).expect("RTL run");
            let (b, sb) =
                run_router_with(&mut model, &core, &logits, t, e, k, rn, T).expect("model run");
            let what = format!("router lanes {lanes} T={t} E={e} k={k} renormalize={rn}");
            assert_eq!(a, b, "{what}: outputs differ");
            compare(&what, &sa, &sb, &mut diffs);
        }
        verdict(&format!("router lanes {lanes}"), diffs);
        // renormalize = 2 is refused by both cards alike: done at once, nothing written
        for dev in [&mut rtl as &mut dyn FpgaDevice, &mut model] {
            let (lb, rb, hb) = (
                dev.alloc(0, 64).expect("alloc"),
                dev.alloc(0, 64).expect("alloc"),
                dev.alloc(0, 64).expect("alloc"),
            );
            dev.write(&rb, 0, &[0xa5; 64]).expect("write");
            for (n, b) in [("logits", &lb), ("routes", &rb), ("hist", &hb)] {
                dev.set_pointer(n, b).expect("pointer");
            }
            for (n, v) in [
                ("tokens", 2),
                ("experts", 8),
                ("top_k", 2),
                ("renormalize", 2),
            ] {
                dev.set_scalar(n, v).expect("scalar");
            }
            dev.start().expect("start");
            let st = dev.wait(T).expect("refused runs finish");
            assert!(st.cycles < 20, "lanes {lanes}: {} cycles", st.cycles);
            let mut back = [0u8; 64];
            dev.read(&rb, 0, &mut back).expect("read");
            assert_eq!(back, [0xa5; 64], "lanes {lanes}: routes untouched");
        }
    }
}

#[test]
fn gemm_model_matches_the_rtl() {
    let core = GemmCore {
        rows: 8,
        k_max: 4096,
        n_max: 4096,
        lanes: 8,
        w_ports: false,
    };
    let Some((mut rtl, mut model)) = cards(&core) else {
        return;
    };
    let mut rng = ChaCha8Rng::seed_from_u64(0x6e33);
    let mut diffs = Vec::new();
    for _ in 0..SHAPES {
        let m = rng.gen_range(1..=48);
        let n = rng.gen_range(1..=256);
        let k = rng.gen_range(1..=512);
        let d = GemmDims { m, n, k };
        let p = GemmProblem::random(&mut rng, d, 20..=25);
        let relu = rng.gen_bool(0.5);
        let (a, sa) = run_gemm(&mut rtl, &p.x, &p.w, &p.bias, &p.rq, relu, d, T).expect("RTL");
        let (b, sb) = run_gemm(&mut model, &p.x, &p.w, &p.bias, &p.rq, relu, d, T).expect("model");
        assert_eq!(a, b, "gemm {d:?}: outputs differ");
        compare(&format!("gemm M={m} N={n} K={k}"), &sa, &sb, &mut diffs);
    }
    verdict("gemm", diffs);
}

#[test]
fn wide_gemm_model_matches_the_rtl() {
    // The 512-bit build (64 lanes, one beat of 64 bytes a cycle from memory): single launches
    // and, with K past k_max, passes with int32 partials.
    let mem = tandem_sim::MemConfig {
        bytes_per_cycle: 64.0,
        ..tandem_sim::MemConfig::default()
    };
    wide_gemm_on(mem, false, "wide gemm", 0x6464);
}

#[test]
fn wide_gemm_model_matches_the_rtl_on_u55c_banks() {
    // The same build on the U55C's HBM at 300 MHz: 32 banks of 48 bytes a cycle (a
    // 512-bit beat every 4/3 cycles), 33 cycles of read latency; the driver stripes the W
    // stream over banks 1 and 2 (`drive::w_stripe_banks`: 4 KiB stripes through `w` and
    // `w_odd`), the x rows, parameters and y in bank 0, so W runs at two banks' rate, above
    // the port's (`timing::gemm_cycles_w_own_bank` at twice the bank rate).
    let mem = tandem_sim::MemConfig::for_platform(&tandem_fpga::platform::U55C, 300.0, 64);
    wide_gemm_on(mem, false, "wide gemm on u55c banks", 0x55c);
}

#[test]
fn wide_gemm_with_w_on_its_own_masters_matches_the_model_on_u55c_banks() {
    // The card build's memory system: W's two stripe buffers read through the read-only
    // `m_axi_gmem1` and `m_axi_gmem2` (banks 1 and 2), x, parameters and y through `m_axi_gmem`
    // (bank 0); the same model, which already times W at two banks' rate, on the same 32
    // shapes as the one-master build above (same seed).
    let mem = tandem_sim::MemConfig::for_platform(&tandem_fpga::platform::U55C, 300.0, 64);
    wide_gemm_on(
        mem,
        true,
        "wide gemm, W on its own masters, u55c banks",
        0x55c,
    );
}

#[test]
fn wide_gemm_model_matches_the_rtl_on_two_u55c_banks() {
    // A card of two such banks: W whole in bank 1 (`drive::stream_bank`), at one bank's rate.
    let mem = tandem_sim::MemConfig {
        banks: 2,
        ..tandem_sim::MemConfig::for_platform(&tandem_fpga::platform::U55C, 300.0, 64)
    };
    wide_gemm_on(mem, false, "wide gemm on two u55c banks", 0x55c2);
}

/// The 512-bit 8 x 64 build (W on masters of its own with `w_ports`) on memory `mem`, 32
/// random shapes (`name` in the report).
fn wide_gemm_on(mem: tandem_sim::MemConfig, w_ports: bool, name: &str, seed: u64) {
    let core = GemmCore {
        rows: 8,
        k_max: 512,
        n_max: 512,
        lanes: 64,
        w_ports,
    };
    let Some((mut rtl, mut model)) = cards_with(&core, mem) else {
        return;
    };
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut diffs = Vec::new();
    for _ in 0..SHAPES {
        let m = rng.gen_range(1..=48);
        let n = rng.gen_range(1..=300);
        let k = rng.gen_range(1..=700);
        let d = GemmDims { m, n, k };
        let p = GemmProblem::random(&mut rng, d, 20..=25);
        let relu = rng.gen_bool(0.5);
        let run = |c: &mut dyn FpgaDevice| {
            run_gemm_split(c, &core, &p.x, &p.w, &p.bias, &p.rq, relu, d, T)
        };
        let (a, sa) = run(&mut rtl).expect("RTL");
        let (b, sb) = run(&mut model).expect("model");
        assert_eq!(a, b, "{name} {d:?}: outputs differ");
        assert_eq!(a, p.golden(relu).expect("golden"), "{name} {d:?}");
        compare(&format!("{name} M={m} N={n} K={k}"), &sa, &sb, &mut diffs);
    }
    verdict(name, diffs);
}

#[test]
fn attention_model_matches_the_rtl() {
    let core = AttentionCore {
        d_max: 64,
        nkv_max: 512,
        kv_tile: 16,
        q_rows: 1,
    };
    let Some((mut rtl, mut model)) = cards(&core) else {
        return;
    };
    let mut rng = ChaCha8Rng::seed_from_u64(0xa77);
    let mut diffs = Vec::new();
    for _ in 0..SHAPES {
        let nq = rng.gen_range(1..=160);
        let nkv = rng.gen_range(1..=512);
        let d = rng.gen_range(1..=64);
        let causal = rng.gen_bool(0.5);
        let draw = |rng: &mut ChaCha8Rng, n: usize| -> Vec<i8> {
            (0..n).map(|_| rng.gen_range(-60..60)).collect()
        };
        let (q, k, v) = (
            draw(&mut rng, nq * d),
            draw(&mut rng, nkv * d),
            draw(&mut rng, nkv * d),
        );
        let dims = AttentionDims { nq, nkv, d, causal };
        let head = QueryHead {
            q: &q,
            kv: 0,
            score_mult: rng.gen_range(20000..65000),
            score_shift: rng.gen_range(14..22),
        };
        let kv = [KvHead { k: &k, v: &v }];
        let (a, sa) = run_attention(&mut rtl, dims, &kv, &[head], T).expect("RTL");
        let (b, sb) = run_attention(&mut model, dims, &kv, &[head], T).expect("model");
        assert_eq!(a, b, "attention {dims:?}: outputs differ");
        compare(
            &format!("attention Nq={nq} Nkv={nkv} d={d} causal={causal}"),
            &sa,
            &sb,
            &mut diffs,
        );
    }
    verdict("attention", diffs);
}

#[test]
fn gemm_split_model_matches_the_rtl() {
    // K past k_max (passes with int32 partials: PART_OUT, ACC_IN, both) and N past n_max
    // (column chunks): the cycles of all launches of a shape, model against RTL.
    let core = GemmCore {
        rows: 8,
        k_max: 64,
        n_max: 64,
        lanes: 8,
        w_ports: false,
    };
    let Some((mut rtl, mut model)) = cards(&core) else {
        return;
    };
    let mut rng = ChaCha8Rng::seed_from_u64(0x5b17);
    let mut diffs = Vec::new();
    for _ in 0..SHAPES {
        let m = rng.gen_range(1..=40);
        let n = rng.gen_range(1..=150);
        let k = rng.gen_range(65..=300);
        let d = GemmDims { m, n, k };
        let p = GemmProblem::random(&mut rng, d, 20..=25);
        let relu = rng.gen_bool(0.5);
        let run = |c: &mut dyn FpgaDevice| {
            run_gemm_split(c, &core, &p.x, &p.w, &p.bias, &p.rq, relu, d, T)
        };
        let (a, sa) = run(&mut rtl).expect("RTL");
        let (b, sb) = run(&mut model).expect("model");
        assert_eq!(a, b, "gemm split {d:?}: outputs differ");
        assert_eq!(a, p.golden(relu).expect("golden"), "gemm split {d:?}");
        let predicted = tandem_fpga::timing::gemm_split_cycles(
            &core,
            m as u64,
            n as u64,
            k as u64,
            &tandem_fpga::timing::MemTiming::default(),
        );
        assert_eq!(
            predicted, sb.cycles,
            "the planner's estimate is the modelled card's"
        );
        compare(
            &format!("gemm split M={m} N={n} K={k}"),
            &sa,
            &sb,
            &mut diffs,
        );
    }
    verdict("gemm split", diffs);
}

#[test]
fn attention_groups_and_kv_ranges_model_matches_the_rtl() {
    // GQA groups in one launch and K/V past nkv_max (ranges with kv_skip, merged): the
    // cycles of all launches of a shape, model against RTL.
    let core = AttentionCore {
        d_max: 16,
        nkv_max: 64,
        kv_tile: 8,
        q_rows: 1,
    };
    let Some((mut rtl, mut model)) = cards(&core) else {
        return;
    };
    let mut rng = ChaCha8Rng::seed_from_u64(0x6a7);
    let mut diffs = Vec::new();
    for _ in 0..SHAPES {
        let nq = rng.gen_range(1..=48);
        let nkv = rng.gen_range(1..=200);
        let d = rng.gen_range(1..=16);
        let causal = rng.gen_bool(0.5);
        let hkv = rng.gen_range(1..=2);
        let hq = hkv * rng.gen_range(1..=4);
        let draw = |rng: &mut ChaCha8Rng, n: usize| -> Vec<i8> {
            (0..n).map(|_| rng.gen_range(-60..60)).collect()
        };
        let qs: Vec<Vec<i8>> = (0..hq).map(|_| draw(&mut rng, nq * d)).collect();
        let kvs: Vec<(Vec<i8>, Vec<i8>)> = (0..hkv)
            .map(|_| (draw(&mut rng, nkv * d), draw(&mut rng, nkv * d)))
            .collect();
        let (score_mult, score_shift) = (rng.gen_range(20000..65000), rng.gen_range(14..22));
        let dims = AttentionDims { nq, nkv, d, causal };
        let kv: Vec<KvHead<'_>> = kvs.iter().map(|(k, v)| KvHead { k, v }).collect();
        let heads: Vec<QueryHead<'_>> = qs
            .iter()
            .enumerate()
            .map(|(h, q)| QueryHead {
                q,
                kv: h / (hq / hkv),
                score_mult,
                score_shift,
            })
            .collect();
        let chunk = core.nkv_max as usize;
        let (a, sa) = run_attention_split(&mut rtl, chunk, dims, &kv, &heads, T).expect("RTL");
        let (b, sb) = run_attention_split(&mut model, chunk, dims, &kv, &heads, T).expect("model");
        assert_eq!(a, b, "attention {dims:?} Hq {hq} Hkv {hkv}: outputs differ");
        let predicted = tandem_fpga::timing::attention_split_cycles(
            &core,
            nq as u64,
            nkv as u64,
            d.div_ceil(8) as u64 * 8,
            causal,
            hkv as u64,
            (hq / hkv) as u64,
            &tandem_fpga::timing::MemTiming::default(),
        );
        assert_eq!(
            predicted, sb.cycles,
            "the planner's estimate is the modelled card's"
        );
        compare(
            &format!("attention Hq={hq} Hkv={hkv} Nq={nq} Nkv={nkv} d={d} causal={causal}"),
            &sa,
            &sb,
            &mut diffs,
        );
    }
    verdict("attention groups", diffs);
}

#[test]
fn attention_rows_model_matches_the_rtl() {
    // The query-parallel core (q_rows 4): GQA groups in one launch and K/V past nkv_max,
    // the cycles of all launches of a shape, model against RTL.
    let core = AttentionCore {
        d_max: 16,
        nkv_max: 256,
        kv_tile: 8,
        q_rows: 4,
    };
    let Some((mut rtl, mut model)) = cards(&core) else {
        return;
    };
    let mut rng = ChaCha8Rng::seed_from_u64(0x4a7);
    let mut diffs = Vec::new();
    for _ in 0..SHAPES {
        let nq = rng.gen_range(1..=48);
        let nkv = rng.gen_range(1..=600);
        let d = rng.gen_range(1..=16);
        let causal = rng.gen_bool(0.5);
        let hkv = rng.gen_range(1..=2);
        let hq = hkv * rng.gen_range(1..=4);
        let draw = |rng: &mut ChaCha8Rng, n: usize| -> Vec<i8> {
            (0..n).map(|_| rng.gen_range(-60..60)).collect()
        };
        let qs: Vec<Vec<i8>> = (0..hq).map(|_| draw(&mut rng, nq * d)).collect();
        let kvs: Vec<(Vec<i8>, Vec<i8>)> = (0..hkv)
            .map(|_| (draw(&mut rng, nkv * d), draw(&mut rng, nkv * d)))
            .collect();
        let (score_mult, score_shift) = (rng.gen_range(20000..65000), rng.gen_range(14..22));
        let dims = AttentionDims { nq, nkv, d, causal };
        let kv: Vec<KvHead<'_>> = kvs.iter().map(|(k, v)| KvHead { k, v }).collect();
        let heads: Vec<QueryHead<'_>> = qs
            .iter()
            .enumerate()
            .map(|(h, q)| QueryHead {
                q,
                kv: h / (hq / hkv),
                score_mult,
                score_shift,
            })
            .collect();
        let chunk = core.nkv_max as usize;
        let (a, sa) = run_attention_split(&mut rtl, chunk, dims, &kv, &heads, T).expect("RTL");
        let (b, sb) = run_attention_split(&mut model, chunk, dims, &kv, &heads, T).expect("model");
        assert_eq!(a, b, "attention {dims:?} Hq {hq} Hkv {hkv}: outputs differ");
        let predicted = tandem_fpga::timing::attention_split_cycles(
            &core,
            nq as u64,
            nkv as u64,
            d.div_ceil(8) as u64 * 8,
            causal,
            hkv as u64,
            (hq / hkv) as u64,
            &tandem_fpga::timing::MemTiming::default(),
        );
        assert_eq!(
            predicted, sb.cycles,
            "the planner's estimate is the modelled card's"
        );
        compare(
            &format!("attention R4 Hq={hq} Hkv={hkv} Nq={nq} Nkv={nkv} d={d} causal={causal}"),
            &sa,
            &sb,
            &mut diffs,
        );
    }
    verdict("attention q_rows 4", diffs);
}

#[test]
fn both_cards_refuse_the_same_arguments_alike() {
    let core = GemmCore {
        rows: 8,
        k_max: 4096,
        n_max: 4096,
        lanes: 8,
        w_ports: false,
    };
    let Some((mut rtl, mut model)) = cards(&core) else {
        return;
    };
    // K past the build's k_max: the driver refuses it before either card sees it; and a
    // shift past 47.
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    for d in [
        GemmDims {
            m: 2,
            n: 8,
            k: 5000,
        },
        GemmDims { m: 2, n: 0, k: 8 },
    ] {
        let p = GemmProblem::random(&mut rng, d, 20..=25);
        let a = run_gemm(&mut rtl, &p.x, &p.w, &p.bias, &p.rq, false, d, T);
        let b = run_gemm(&mut model, &p.x, &p.w, &p.bias, &p.rq, false, d, T);
        match (a, b) {
            (Err(x), Err(y)) => assert_eq!(x.to_string(), y.to_string()),
            (Ok((x, _)), Ok((y, _))) => assert_eq!(x, y, "{d:?}"),
            (a, b) => panic!("{d:?}: the cards disagree: {a:?} vs {b:?}"),
        }
    }
}

#[test]
fn vecops_model_matches_the_rtl() {
    use tandem_fpga::drive::run_vecops;
    use tandem_fpga::golden::vecops::{self as gv, LANES, VecArgs, words};
    use tandem_fpga::kernels::vecops::VecopsCore;
    let core = VecopsCore { n_max: 1024 };
    let Some((mut rtl, mut model)) = cards(&core) else {
        return;
    };
    let mut rng = ChaCha8Rng::seed_from_u64(0x7ec5);
    let mut diffs = Vec::new();
    for i in 0..SHAPES {
        let op = (i % 5) as u32;
        let rows = rng.gen_range(1..=24);
        let n = if op == gv::OP_ROPE {
            8 * rng.gen_range(1..=128)
        } else {
            rng.gen_range(1..=1024)
        };
        let np = LANES * words(n);
        let mut r16 =
            |len: usize| -> Vec<i16> { (0..len).map(|_| rng.gen_range(-3000..3000)).collect() };
        let a = r16(rows * np);
        let mut args = VecArgs {
            op,
            rows,
            n,
            ..VecArgs::default()
        };
        let (mut b, mut p) = (Vec::new(), Vec::new());
        match op {
            gv::OP_RMSNORM | gv::OP_RMSNORM_RES => {
                (args.shift, args.c0, args.c1) = (20, 10, ((1u64 << 32) / n as u64) as u32);
                p = r16(np);
            }
            gv::OP_ROPE => {
                args.c0 = rows.div_ceil(2) as u32;
                p = r16(args.c0 as usize * np);
            }
            gv::OP_SILU_MUL => (args.shift, args.c0, args.c1) = (24, 30000, 12),
            _ => {}
        }
        if args.reads_b() {
            b = r16(rows * np);
        }
        let (x, sa) = run_vecops(&mut rtl, &args, &a, &b, &p, T).expect("RTL");
        let (y, sb) = run_vecops(&mut model, &args, &a, &b, &p, T).expect("model");
        assert_eq!(x, y, "vecops {args:?}: outputs differ");
        compare(
            &format!("vecops op={op} rows={rows} n={n}"),
            &sa,
            &sb,
            &mut diffs,
        );
    }
    verdict("vecops", diffs);
}
