//! The emitted kernels (router, GEMM, attention: shell + core) in Icarus Verilog, a 4-state
//! simulator, through `tandem_sim::IcarusCard`: the host drivers of `tandem_fpga::drive` run
//! them over `s_axi_control`, the testbench serves `m_axi_gmem` with random stalls on every
//! channel and checks the AXI rules each cycle, memory the kernel never wrote reads back as X,
//! and every output must equal the golden model bit for bit. Random shapes per kernel,
//! including attention with head dims below the build's `d_max` as the first launch (the
//! unloaded K/V lanes used to turn every score into X) and GQA groups sharing K/V. Every data
//! width the kernels are built at runs: 64 bits, the router's 128 and 256, the GEMM's 512 (one
//! master, and W on masters of its own).
//! Prints `SKIP: <reason>` and returns where Icarus Verilog is missing.

use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tandem_fpga::FpgaDevice;
use tandem_fpga::core::KernelCore;
use tandem_fpga::drive::{self, AttentionDims, KvHead, QueryHead};
use tandem_fpga::golden::attention::{self as gatt, AttentionConfig};
use tandem_fpga::golden::gemm::{GemmDims, GemmProblem};
use tandem_fpga::golden::router as grouter;
use tandem_fpga::kernels::attention::AttentionCore;
use tandem_fpga::kernels::gemm::GemmCore;
use tandem_fpga::kernels::router::RouterCore;
use tandem_fpga::shell::ShellConfig;
use tandem_sim::{IcarusCard, IcarusConfig, SimError};

const T: Duration = Duration::from_secs(120);

/// A card with `core` loaded (bursts of at most 8 beats, so bursts split and pages are
/// crossed), or `None` after printing why the test is skipped.
fn card(core: &dyn KernelCore, seed: u32) -> Option<IcarusCard> {
    card_of(core, seed, 1)
}

/// [`card`] with memory in `banks` banks.
fn card_of(core: &dyn KernelCore, seed: u32, banks: u32) -> Option<IcarusCard> {
    let cfg = IcarusConfig {
        seed,
        stall_percent: 35,
        banks,
        ..IcarusConfig::default()
    };
    let mut c = open(cfg)?;
    c.load_core(core, ShellConfig { max_burst: 8 })
        .expect("iverilog build");
    Some(c)
}

/// The Icarus card of `cfg`, or `None` after printing why the test is skipped (no iverilog).
fn open(cfg: IcarusConfig) -> Option<IcarusCard> {
    match IcarusCard::open(cfg) {
        Ok(c) => Some(c),
        Err(SimError::Unavailable(why)) => {
            println!("SKIP: {why}");
            None
        }
        Err(e) => panic!("opening the Icarus card: {e}"),
    }
}

fn rand_i8(rng: &mut ChaCha8Rng, n: usize) -> Vec<i8> {
    (0..n).map(|_| rng.r#gen()).collect()
}

/// Every lane count of the 64-bit builds (1, 2, 4) and the wide ones (8 lanes on a 128-bit
/// `m_axi_gmem`, the default build; 16 on 256 bits), renormalize on and off.
#[test]
fn router_4state_matches_golden_under_stalls() {
    for lanes in [1, 2, 4, 8, 16] {
        let core = RouterCore::with_lanes(64, 8, lanes);
        let Some(mut c) = card(&core, 11 + lanes) else {
            return;
        };
        let mut rng = ChaCha8Rng::seed_from_u64(0x4e0 + u64::from(lanes));
        let mut shapes = vec![
            (7, 10, 3),
            (3, 64, 8),
            (4, 6, 6),
            (9, 8, 1),
            (5, 5, 2),
            (1, 3, 2),
        ];
        for _ in 0..6 {
            let e = rng.gen_range(2..=64);
            shapes.push((rng.gen_range(1..=8), e, rng.gen_range(1..=e.min(8))));
        }
        for (i, &(t, e, k)) in shapes.iter().enumerate() {
            // every other shape with a narrow range of logits: many ties
            let span = if i % 2 == 0 { 32767 } else { 4 };
            let x: Vec<i16> = (0..t * e).map(|_| rng.gen_range(-span..=span)).collect();
            let rn = i % 3 != 1;
            let want = grouter::route_with(&x, t, e, k, rn).expect("golden");
            let what = format!("router lanes {lanes} T {t} E {e} k {k} renormalize {rn}");
            let (got, st) = drive::run_router_with(&mut c, &core, &x, t, e, k, rn, T)
                .unwrap_or_else(|err| panic!("{what}: {err}"));
            assert_eq!(got, want, "{what}");
            println!("{what}: bit-exact, {} cycles", st.cycles);
        }
        assert!(c.violations().is_empty(), "{:?}", c.violations());
    }
}

#[test]
fn gemm_4state_matches_golden_under_stalls() {
    let core = GemmCore {
        rows: 4,
        k_max: 64,
        n_max: 32,
        lanes: 8,
        w_ports: false,
    };
    let Some(mut c) = card(&core, 22) else {
        return;
    };
    let mut rng = ChaCha8Rng::seed_from_u64(0x9e3);
    let mut shapes = vec![(5, 12, 20, false), (1, 3, 7, true), (9, 16, 40, true)];
    for _ in 0..6 {
        shapes.push((
            rng.gen_range(1..=9),
            rng.gen_range(1..=32),
            rng.gen_range(1..=64),
            rng.r#gen(),
        ));
    }
    check_gemms(&mut c, &core, &mut rng, &shapes, "gemm");
}

/// The 512-bit build (64 lanes, the card's width): every beat 8 memory words, all 64 strobes;
/// N over two and three column chunks and K over two and three passes (int32 partials in card
/// memory written, then read back by the next pass), odd M, N and K.
#[test]
fn wide_gemm_4state_matches_golden_under_stalls() {
    let core = GemmCore {
        rows: 4,
        k_max: 64,
        n_max: 64,
        lanes: 64,
        w_ports: false,
    };
    let Some(mut c) = card(&core, 24) else {
        return;
    };
    let mut rng = ChaCha8Rng::seed_from_u64(0x512);
    let shapes = [
        (5, 12, 20, false),
        (1, 1, 1, true),
        (3, 70, 100, true),
        (6, 64, 64, false),
        (7, 131, 150, false),
    ];
    check_gemms(&mut c, &core, &mut rng, &shapes, "512-bit gemm");
}

/// The three-master shell in 4-state: W's even and odd stripes through `m_axi_gmem1` and
/// `m_axi_gmem2` (the card split into four banks, so the driver stripes W over banks 1 and 2),
/// each master stalled at random on its own, the fan-out handing the words back in order.
#[test]
fn gemm_with_w_on_its_own_masters_4state_matches_golden_under_stalls() {
    let core = GemmCore {
        rows: 4,
        k_max: 256,
        n_max: 64,
        lanes: 8,
        w_ports: true,
    };
    let Some(mut c) = card_of(&core, 23, 4) else {
        return;
    };
    let mut rng = ChaCha8Rng::seed_from_u64(0x3a);
    // W per M tile: N/8 tiles x K beats, 512 beats a stripe: one stripe, then two to four
    let shapes = [(3, 20, 40, true), (5, 64, 256, false), (6, 41, 200, true)];
    check_gemms(&mut c, &core, &mut rng, &shapes, "three-master gemm");
}

/// The card's GEMM build in 4-state: 512 bits, W's stripes (4 KiB, 64 beats) through the
/// 512-bit read-only `m_axi_gmem1` and `m_axi_gmem2` of a four-bank card, K over two passes.
#[test]
fn wide_gemm_with_w_on_its_own_masters_4state_matches_golden_under_stalls() {
    let core = GemmCore {
        rows: 4,
        k_max: 128,
        n_max: 128,
        lanes: 64,
        w_ports: true,
    };
    let Some(mut c) = card_of(&core, 25, 4) else {
        return;
    };
    let mut rng = ChaCha8Rng::seed_from_u64(0x5123);
    // W per M tile: N/64 tiles x K beats: one stripe, then two or more
    let shapes = [(3, 20, 40, true), (5, 128, 128, false), (2, 65, 200, true)];
    check_gemms(
        &mut c,
        &core,
        &mut rng,
        &shapes,
        "512-bit three-master gemm",
    );
}

/// Runs each GEMM shape (M, N, K, relu) on `c` through the driver (N and K split over launches
/// where the build needs it), bit for bit against the golden model, then checks that the card
/// saw no AXI breach.
fn check_gemms(
    c: &mut IcarusCard,
    core: &GemmCore,
    rng: &mut ChaCha8Rng,
    shapes: &[(usize, usize, usize, bool)],
    what: &str,
) {
    for &(m, n, k, relu) in shapes {
        let d = GemmDims { m, n, k };
        let p = GemmProblem::random(rng, d, 14..=22);
        let want = p.golden(relu).expect("golden");
        let (got, st) = drive::run_gemm_split(c, core, &p.x, &p.w, &p.bias, &p.rq, relu, d, T)
            .unwrap_or_else(|err| panic!("{what} {d:?}: {err}"));
        assert_eq!(got, want, "{what} {d:?} relu={relu}");
        println!("{what} {d:?} relu={relu}: bit-exact, {} cycles", st.cycles);
    }
    assert!(c.violations().is_empty(), "{:?}", c.violations());
}

/// One attention launch through the driver against the golden model.
fn check_attention(c: &mut IcarusCard, rng: &mut ChaCha8Rng, core: &AttentionCore, p: AttCase) {
    let AttCase {
        nq,
        nkv,
        d,
        causal,
        wild,
    } = p;
    let (q, k, v) = (
        rand_i8(rng, nq * d),
        rand_i8(rng, nkv * d),
        rand_i8(rng, nkv * d),
    );
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
    let want = gatt::attention(&q, &k, &v, &cfg).expect("golden");
    let (got, st) = drive::run_attention_head(c, &q, &k, &v, &cfg, T)
        .unwrap_or_else(|err| panic!("attention {p:?} (d_max {}): {err}", core.d_max));
    assert_eq!(got, want, "attention {p:?} (d_max {})", core.d_max);
    println!("attention {p:?}: bit-exact, {} cycles", st.cycles);
}

#[derive(Debug, Clone, Copy)]
struct AttCase {
    nq: usize,
    nkv: usize,
    d: usize,
    causal: bool,
    wild: bool,
}

#[test]
fn attention_4state_matches_golden_under_stalls() {
    let core = AttentionCore {
        d_max: 24,
        nkv_max: 64,
        kv_tile: 8,
        q_rows: 1,
    };
    let Some(mut c) = card(&core, 33) else {
        return;
    };
    let mut rng = ChaCha8Rng::seed_from_u64(0xa77);
    let case = |nq, nkv, d, causal, wild| AttCase {
        nq,
        nkv,
        d,
        causal,
        wild,
    };
    // The first launch after loading has d < d_max: lanes 8..24 of the K/V banks were never
    // loaded (X in a 4-state simulator).
    let mut cases = vec![
        case(5, 13, 8, false, false),
        case(9, 20, 13, true, false),
        case(12, 7, 24, true, true),
        case(3, 64, 20, false, true),
    ];
    for _ in 0..6 {
        cases.push(case(
            rng.gen_range(1..=12),
            rng.gen_range(1..=64),
            rng.gen_range(1..=24),
            rng.r#gen(),
            rng.r#gen(),
        ));
    }
    for p in cases {
        check_attention(&mut c, &mut rng, &core, p);
    }
    // GQA: 4 query heads over 2 kv heads, each kv head's K and V written once and shared by
    // its group's launches; head dim below d_max.
    let dims = AttentionDims {
        nq: 6,
        nkv: 17,
        d: 16,
        causal: true,
    };
    let kvs: Vec<(Vec<i8>, Vec<i8>)> = (0..2)
        .map(|_| (rand_i8(&mut rng, 17 * 16), rand_i8(&mut rng, 17 * 16)))
        .collect();
    let qs: Vec<Vec<i8>> = (0..4).map(|_| rand_i8(&mut rng, 6 * 16)).collect();
    let (mult, shift) = AttentionConfig::score_multiplier(0.25, 0.02, 0.02).expect("scale");
    let kv: Vec<KvHead<'_>> = kvs.iter().map(|(k, v)| KvHead { k, v }).collect();
    let heads: Vec<QueryHead<'_>> = qs
        .iter()
        .enumerate()
        .map(|(h, q)| QueryHead {
            q,
            kv: h / 2,
            score_mult: mult,
            score_shift: shift,
        })
        .collect();
    let (outs, st) = drive::run_attention(&mut c, dims, &kv, &heads, T).expect("gqa run");
    for (h, out) in outs.iter().enumerate() {
        let cfg = AttentionConfig {
            nq: dims.nq,
            nkv: dims.nkv,
            d: dims.d,
            kv_tile: core.kv_tile as usize,
            causal: dims.causal,
            score_mult: mult,
            score_shift: shift,
        };
        let (k, v) = &kvs[h / 2];
        let want = gatt::attention(&qs[h], k, v, &cfg).expect("golden");
        assert_eq!(*out, want, "GQA head {h}");
    }
    println!(
        "attention GQA 4 heads / 2 kv heads: bit-exact, {} cycles",
        st.cycles
    );
    assert!(c.violations().is_empty(), "{:?}", c.violations());
}

/// The query-parallel core (q_rows 2) in the 4-state simulator: the first launch has d below
/// d_max; causal rows without keys, Nq not a multiple of q_rows, a GQA group of 3 heads in one
/// launch (a row group crossing heads); no X reaches an output, no AXI rule is broken.
#[test]
fn attention_rows_4state_matches_golden_under_stalls() {
    let core = AttentionCore {
        d_max: 16,
        nkv_max: 64,
        kv_tile: 4,
        q_rows: 2,
    };
    let Some(mut c) = card(&core, 35) else {
        return;
    };
    let mut rng = ChaCha8Rng::seed_from_u64(0x4a77);
    let case = |nq, nkv, d, causal, wild| AttCase {
        nq,
        nkv,
        d,
        causal,
        wild,
    };
    for p in [
        case(5, 13, 8, false, false),
        case(9, 6, 13, true, false),
        case(3, 21, 16, true, true),
    ] {
        check_attention(&mut c, &mut rng, &core, p);
    }
    let dims = AttentionDims {
        nq: 5,
        nkv: 11,
        d: 16,
        causal: true,
    };
    let (k, v) = (rand_i8(&mut rng, 11 * 16), rand_i8(&mut rng, 11 * 16));
    let qs: Vec<Vec<i8>> = (0..3).map(|_| rand_i8(&mut rng, 5 * 16)).collect();
    let (mult, shift) = AttentionConfig::score_multiplier(0.25, 0.02, 0.02).expect("scale");
    let kv = [KvHead { k: &k, v: &v }];
    let heads: Vec<QueryHead<'_>> = qs
        .iter()
        .map(|q| QueryHead {
            q,
            kv: 0,
            score_mult: mult,
            score_shift: shift,
        })
        .collect();
    let (outs, st) = drive::run_attention(&mut c, dims, &kv, &heads, T).expect("gqa run");
    for (h, out) in outs.iter().enumerate() {
        let cfg = AttentionConfig {
            nq: dims.nq,
            nkv: dims.nkv,
            d: dims.d,
            kv_tile: core.kv_tile as usize,
            causal: dims.causal,
            score_mult: mult,
            score_shift: shift,
        };
        let want = gatt::attention(&qs[h], &k, &v, &cfg).expect("golden");
        assert_eq!(*out, want, "q_rows 2, GQA head {h}");
    }
    println!(
        "attention q_rows 2, GQA 3 heads: bit-exact, {} cycles",
        st.cycles
    );
    assert!(c.violations().is_empty(), "{:?}", c.violations());
}

/// The checks can fail: a buffer the kernel never writes reads back as X and is refused.
#[test]
fn unwritten_memory_reads_back_as_x() {
    let core = RouterCore::with_lanes(16, 4, 4);
    let Some(mut c) = card(&core, 44) else {
        return;
    };
    let b = c.alloc(0, 64).expect("alloc");
    drive::write(&mut c, &b, &[7u8; 16]).expect("sync");
    let mut head = [0u8; 16];
    drive::read(&mut c, &b, 0)
        .and_then(|_| c.read(&b, 0, &mut head))
        .expect("the written bytes read back");
    assert_eq!(head, [7u8; 16]);
    let mut tail = [0u8; 8];
    let err = c.read(&b, 16, &mut tail).expect_err("X bytes refused");
    assert!(err.to_string().contains("are X"), "{err}");
    c.free(b).expect("free");
}

/// A kernel that breaks the AXI rules on purpose (an AR burst across a 4 KiB page whose address
/// changes while stalled, a W beat with no AW, X on wdata): the testbench reports each breach
/// and the device call that ran those cycles fails, so the checks above can fail.
const RULE_BREAKER: &str = r#"
`timescale 1ns/1ps
module breaker (
    input ap_clk, input ap_rst_n,
    input s_axi_control_awvalid, output s_axi_control_awready, input [11:0] s_axi_control_awaddr,
    input s_axi_control_wvalid, output s_axi_control_wready, input [31:0] s_axi_control_wdata,
    input [3:0] s_axi_control_wstrb,
    output reg s_axi_control_bvalid, input s_axi_control_bready, output [1:0] s_axi_control_bresp,
    input s_axi_control_arvalid, output s_axi_control_arready, input [11:0] s_axi_control_araddr,
    output reg s_axi_control_rvalid, input s_axi_control_rready, output [31:0] s_axi_control_rdata,
    output [1:0] s_axi_control_rresp,
    output m_axi_gmem_awvalid, input m_axi_gmem_awready, output [63:0] m_axi_gmem_awaddr,
    output [7:0] m_axi_gmem_awlen, output [2:0] m_axi_gmem_awsize, output [1:0] m_axi_gmem_awburst,
    output reg m_axi_gmem_wvalid, input m_axi_gmem_wready, output [63:0] m_axi_gmem_wdata,
    output [7:0] m_axi_gmem_wstrb, output m_axi_gmem_wlast,
    input m_axi_gmem_bvalid, output m_axi_gmem_bready, input [1:0] m_axi_gmem_bresp,
    output reg m_axi_gmem_arvalid, input m_axi_gmem_arready, output reg [63:0] m_axi_gmem_araddr,
    output [7:0] m_axi_gmem_arlen, output [2:0] m_axi_gmem_arsize, output [1:0] m_axi_gmem_arburst,
    input m_axi_gmem_rvalid, output m_axi_gmem_rready, input [63:0] m_axi_gmem_rdata,
    input m_axi_gmem_rlast, input [1:0] m_axi_gmem_rresp,
    output interrupt
);
    assign s_axi_control_awready = 1'b1;
    assign s_axi_control_wready = 1'b1;
    assign s_axi_control_arready = 1'b1;
    assign s_axi_control_bresp = 2'd0;
    assign s_axi_control_rresp = 2'd0;
    assign s_axi_control_rdata = 32'd4;
    always @(posedge ap_clk) begin
        s_axi_control_bvalid <= ap_rst_n && s_axi_control_wvalid;
        s_axi_control_rvalid <= ap_rst_n && s_axi_control_arvalid;
    end
    assign m_axi_gmem_awvalid = 1'b0;
    assign m_axi_gmem_awaddr = 64'd0;
    assign m_axi_gmem_awlen = 8'd0;
    assign m_axi_gmem_awsize = 3'd3;
    assign m_axi_gmem_awburst = 2'd1;
    assign m_axi_gmem_wdata = 64'bx;
    assign m_axi_gmem_wstrb = 8'hff;
    assign m_axi_gmem_wlast = 1'b1;
    assign m_axi_gmem_bready = 1'b1;
    assign m_axi_gmem_arlen = 8'd3;
    assign m_axi_gmem_arsize = 3'd3;
    assign m_axi_gmem_arburst = 2'd1;
    assign m_axi_gmem_rready = 1'b1;
    assign interrupt = 1'b0;
    reg w_sent;
    reg [7:0] n, moved;
    always @(posedge ap_clk) begin
        if (!ap_rst_n) begin
            m_axi_gmem_arvalid <= 1'b0; m_axi_gmem_wvalid <= 1'b0; w_sent <= 1'b0;
            m_axi_gmem_araddr <= 64'h4_0000_0ff0; n <= 8'd0; moved <= 8'd0;
        end else begin
            if (n != 8'hff) n <= n + 8'd1;
            // from cycle 20: AR bursts over a page boundary, the address moved (3 times) while
            // stalled; one W beat with no AW before it
            m_axi_gmem_arvalid <= n >= 8'd20;
            if (m_axi_gmem_arvalid && !m_axi_gmem_arready && moved < 8'd3) begin
                m_axi_gmem_araddr <= m_axi_gmem_araddr + 64'd8;
                moved <= moved + 8'd1;
            end
            m_axi_gmem_wvalid <= n >= 8'd20 && !w_sent && !(m_axi_gmem_wvalid && m_axi_gmem_wready);
            if (m_axi_gmem_wvalid && m_axi_gmem_wready) w_sent <= 1'b1;
        end
    end
endmodule
"#;

#[test]
fn axi_rule_breaches_are_reported() {
    let cfg = IcarusConfig {
        seed: 5,
        stall_percent: 50,
        ..IcarusConfig::default()
    };
    let Some(mut c) = open(cfg.clone()) else {
        return;
    };
    let dir = cfg.work_dir.join(format!("breaker-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    std::fs::write(dir.join("breaker.v"), RULE_BREAKER).expect("verilog");
    std::fs::write(
        dir.join("manifest.json"),
        r#"{"kernel":"breaker","params":[],"shell":{"max_burst":8},"clock_mhz":300.0,"args":[],"verilog_sha256":"-","verilog":"breaker.v"}"#,
    )
    .expect("manifest");
    let desc = tandem_fpga::regmap::KernelDesc {
        name: "breaker".into(),
        args: vec![],
    };
    c.load(&tandem_fpga::KernelBuild::Simulated {
        dir: dir.clone(),
        desc,
    })
    .expect("load the rule breaker");
    let err = c
        .run_until_done(Duration::from_secs(10))
        .expect_err("breaches fail the call");
    let msg = err.to_string();
    println!("{msg}");
    for what in [
        "within one 4 KiB page",
        "AR changed or dropped while stalled",
        "W beat before the AW",
        "X on wdata",
    ] {
        assert!(msg.contains(what), "no `{what}` in: {msg}");
    }
    drop(c);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn vecops_4state_matches_golden_under_stalls() {
    use tandem_fpga::golden::vecops::{self as gv, LANES, VecArgs, words};
    use tandem_fpga::kernels::vecops::VecopsCore;
    let core = VecopsCore { n_max: 64 };
    let Some(mut c) = card(&core, 17) else {
        return;
    };
    let mut rng = ChaCha8Rng::seed_from_u64(0x7ec);
    for i in 0..10u32 {
        let op = i % 5;
        let rows = rng.gen_range(1..=3);
        let n = if op == gv::OP_ROPE {
            8 * rng.gen_range(1..=8)
        } else {
            rng.gen_range(1..=64)
        };
        let np = LANES * words(n);
        let lim = if i >= 5 { i16::MAX } else { 2000 };
        let mut r16 =
            |len: usize| -> Vec<i16> { (0..len).map(|_| rng.gen_range(-lim..=lim)).collect() };
        let a = gv::pad_rows(&r16(rows * n), rows, n);
        let mut args = VecArgs {
            op,
            rows,
            n,
            ..VecArgs::default()
        };
        let (mut b, mut p) = (Vec::new(), Vec::new());
        match op {
            gv::OP_RMSNORM | gv::OP_RMSNORM_RES => {
                args.shift = 17;
                args.c0 = 100;
                args.c1 = ((1u64 << 32) / n as u64) as u32;
                p = gv::pad_rows(&r16(n), 1, n);
                if op == gv::OP_RMSNORM_RES {
                    b = gv::pad_rows(&r16(rows * n), rows, n);
                }
            }
            gv::OP_ROPE => {
                args.c0 = 2;
                p = r16(2 * np);
            }
            gv::OP_SILU_MUL => {
                args.shift = 22;
                args.c0 = 40000;
                args.c1 = 16;
                b = gv::pad_rows(&r16(rows * n), rows, n);
            }
            _ => b = gv::pad_rows(&r16(rows * n), rows, n),
        }
        let want = gv::run(&args, 64, &a, &b, &p).expect("golden");
        let (got, st) = drive::run_vecops(&mut c, &args, &a, &b, &p, T)
            .unwrap_or_else(|err| panic!("vecops {args:?}: {err}"));
        assert_eq!(got, want, "vecops {args:?}");
        println!("vecops {args:?}: bit-exact, {} cycles", st.cycles);
    }
    // the int8 ops of the MoE experts: silu_mul8, and combine (whose accumulator bank is never
    // read before its first write of a row)
    for i in 0..4u32 {
        let rows = rng.gen_range(1..=3usize);
        let n = rng.gen_range(1..=64usize);
        let np8 = gv::LANES8 * gv::words8(n);
        let r8 = |rng: &mut ChaCha8Rng, len: usize| -> Vec<i8> {
            (0..len)
                .map(|_| rng.gen_range(-128i16..=127) as i8)
                .collect()
        };
        if i % 2 == 0 {
            let args = VecArgs {
                op: gv::OP_SILU_MUL8,
                rows,
                n,
                shift: 30,
                c0: 40000,
                c1: (30000 << 16) | 12,
            };
            let a = gv::pad_rows8(&r8(&mut rng, rows * n), rows, n);
            let b = gv::pad_rows8(&r8(&mut rng, rows * n), rows, n);
            let want = gv::silu_mul8(&args, 64, &a, &b).expect("golden");
            let (got, _) = drive::run_silu_mul8(&mut c, &args, &a, &b, T)
                .unwrap_or_else(|err| panic!("vecops {args:?}: {err}"));
            assert_eq!(got, want, "vecops {args:?}");
        } else {
            let k = 2usize;
            let args = VecArgs {
                op: gv::OP_COMBINE,
                rows,
                n,
                shift: 10,
                c0: k as u32,
                c1: 0,
            };
            let y8 = r8(&mut rng, 4 * np8);
            let table: Vec<u64> = (0..rows * k)
                .map(|_| gv::table_entry(rng.gen_range(0..4), rng.gen_range(-20000..20000)))
                .collect();
            let want = gv::combine(&args, 64, &y8, &table).expect("golden");
            let (got, _) = drive::run_combine(&mut c, &args, &y8, &table, T)
                .unwrap_or_else(|err| panic!("vecops {args:?}: {err}"));
            assert_eq!(got, want, "vecops {args:?}");
        }
        println!("vecops int8 op {}: bit-exact", 5 + i % 2);
    }
    assert!(c.violations().is_empty(), "{:?}", c.violations());
}
