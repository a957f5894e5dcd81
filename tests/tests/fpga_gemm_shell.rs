//! The GEMM and attention cores inside the Vitis RTL shell, on the simulated card (AXI4-Lite
//! control, AXI4 bursts to simulated memory banks): bit-exact against the golden models, and
//! the cycle counts through the shell. Prints "skipped: <reason>" where Verilator is missing.

use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tandem_fpga::FpgaDevice;
use tandem_fpga::golden::attention::{self as gatt, AttentionConfig};
use tandem_fpga::golden::gemm::{self as ggemm, GemmDims, Requant};
use tandem_fpga::kernels::attention::AttentionCore;
use tandem_fpga::kernels::gemm::{GemmCore, pack_params, pack_w, pad_x, pad8};
use tandem_fpga::shell::ShellConfig;
use tandem_sim::{SimCard, SimConfig};

const T: Duration = Duration::from_secs(120);

fn card(core: &dyn tandem_fpga::core::KernelCore) -> Option<SimCard> {
    match SimCard::open(SimConfig::default()) {
        Ok(mut c) => {
            c.load_core(core, ShellConfig { max_burst: 16 })
                .expect("load core");
            Some(c)
        }
        Err(e) => {
            println!("skipped: {e}");
            None
        }
    }
}

fn words(v: &[u64]) -> Vec<u8> {
    v.iter().flat_map(|w| w.to_le_bytes()).collect()
}

#[test]
fn gemm_through_the_shell_matches_golden() {
    let core = GemmCore {
        rows: 4,
        k_max: 256,
        n_max: 64,
    };
    let Some(mut c) = card(&core) else { return };
    let mut rng = ChaCha8Rng::seed_from_u64(31);
    for &(m, n, k, relu) in &[(9, 20, 70, true), (16, 64, 256, false)] {
        let x: Vec<i8> = (0..m * k).map(|_| rng.r#gen()).collect();
        let w: Vec<i8> = (0..n * k).map(|_| rng.r#gen()).collect();
        let bias: Vec<i32> = (0..n).map(|_| rng.gen_range(-5000..5000)).collect();
        let rq: Vec<Requant> = (0..n)
            .map(|_| Requant {
                mult: rng.r#gen(),
                shift: rng.gen_range(22..=26),
            })
            .collect();
        let (np, kp) = (pad8(n), pad8(k));
        let xb = c.alloc(0, (m * kp) as u64).expect("alloc");
        let wb = c.alloc(0, (np * kp) as u64).expect("alloc");
        let pb = c.alloc(0, (np * 8) as u64).expect("alloc");
        let yb = c.alloc(0, (m * np) as u64).expect("alloc");
        let xp: Vec<u8> = pad_x(&x, m, k).iter().map(|&v| v as u8).collect();
        c.write(&xb, 0, &xp).expect("write");
        c.write(&wb, 0, &words(&pack_w(&w, n, k))).expect("write");
        c.write(&pb, 0, &words(&pack_params(&bias, &rq)))
            .expect("write");
        for (name, b) in [("x", &xb), ("w", &wb), ("params", &pb), ("y", &yb)] {
            c.set_pointer(name, b).expect("pointer");
        }
        for (name, v) in [("m", m), ("n", np), ("k", kp), ("relu", usize::from(relu))] {
            c.set_scalar(name, v as u32).expect("scalar");
        }
        c.start().expect("start");
        let st = c.wait(T).expect("wait");
        let mut y = vec![0u8; m * np];
        c.read(&yb, 0, &mut y).expect("read");
        let want = ggemm::gemm(&x, &w, &bias, &rq, relu, GemmDims { m, n, k }).expect("golden");
        for i in 0..m {
            for j in 0..n {
                assert_eq!(
                    y[i * np + j] as i8,
                    want[i * n + j],
                    "M={m} N={n} K={k} y[{i}][{j}]"
                );
            }
        }
        let ideal = core.ideal_cycles(m, np, kp);
        println!(
            "gemm through the shell M={m} N={np} K={kp}: {} cycles, ideal {ideal}, busy {:.1}%",
            st.cycles,
            100.0 * ideal as f64 / st.cycles as f64
        );
        for b in [yb, pb, wb, xb] {
            c.free(b).expect("free");
        }
    }
}

#[test]
fn attention_through_the_shell_matches_golden() {
    let core = AttentionCore {
        d_max: 16,
        nkv_max: 256,
        kv_tile: 8,
    };
    let Some(mut c) = card(&core) else { return };
    let mut rng = ChaCha8Rng::seed_from_u64(32);
    for &(nq, nkv, causal) in &[(13, 29, true), (48, 192, false)] {
        let d = 16;
        let mut g = |n: usize| -> Vec<i8> { (0..n).map(|_| rng.r#gen()).collect() };
        let (q, k, v) = (g(nq * d), g(nkv * d), g(nkv * d));
        let (score_mult, score_shift) =
            AttentionConfig::score_multiplier(0.25, 0.02, 0.02).expect("scale");
        let cfg = AttentionConfig {
            nq,
            nkv,
            d,
            kv_tile: 8,
            causal,
            score_mult,
            score_shift,
        };
        let bytes = |x: &[i8]| x.iter().map(|&b| b as u8).collect::<Vec<u8>>();
        let qb = c.alloc(0, (nq * d) as u64).expect("alloc");
        let kb = c.alloc(0, (nkv * d) as u64).expect("alloc");
        let vb = c.alloc(0, (nkv * d) as u64).expect("alloc");
        let ob = c.alloc(0, (nq * d * 2) as u64).expect("alloc");
        let sb = c.alloc(0, (nq * 8) as u64).expect("alloc");
        c.write(&qb, 0, &bytes(&q)).expect("write");
        c.write(&kb, 0, &bytes(&k)).expect("write");
        c.write(&vb, 0, &bytes(&v)).expect("write");
        for (name, b) in [
            ("q", &qb),
            ("k", &kb),
            ("v", &vb),
            ("o", &ob),
            ("stats", &sb),
        ] {
            c.set_pointer(name, b).expect("pointer");
        }
        let args = [
            ("nq", nq as u32),
            ("nkv", nkv as u32),
            ("d", d as u32),
            ("causal", u32::from(causal)),
            ("score_mult", u32::from(score_mult)),
            ("score_shift", u32::from(score_shift)),
        ];
        for (name, val) in args {
            c.set_scalar(name, val).expect("scalar");
        }
        c.start().expect("start");
        let st = c.wait(T).expect("wait");
        let mut o = vec![0u8; nq * d * 2];
        c.read(&ob, 0, &mut o).expect("read");
        let mut s = vec![0u8; nq * 8];
        c.read(&sb, 0, &mut s).expect("read");
        let want = gatt::attention(&q, &k, &v, &cfg).expect("golden");
        let got: Vec<i16> = o
            .chunks_exact(2)
            .map(|b| i16::from_le_bytes([b[0], b[1]]))
            .collect();
        assert_eq!(got, want.o, "{cfg:?}");
        for i in 0..nq {
            let e = i32::from_le_bytes(s[8 * i..8 * i + 4].try_into().expect("4"));
            let l = u32::from_le_bytes(s[8 * i + 4..8 * i + 8].try_into().expect("4"));
            assert_eq!((e, l), (want.e[i], want.l[i]), "{cfg:?} row {i}");
        }
        let pairs: usize = (0..nq)
            .map(|i| (0..nkv).filter(|&j| cfg.visible(i, j)).count())
            .sum();
        println!(
            "attention through the shell Nq={nq} Nkv={nkv} causal={causal}: {} cycles, {pairs} pairs, busy {:.1}%",
            st.cycles,
            100.0 * pairs as f64 / st.cycles as f64
        );
        for b in [sb, ob, vb, kb, qb] {
            c.free(b).expect("free");
        }
    }
}
