//! Projected cycles, time and throughput at the target clock from the analytic cycle models
//! (`tandem_fpga::timing`, within 5% of the RTL on the shapes `sim/tests/cycle_model.rs`
//! checks) for the U55C-sized builds: GEMM T4096 x 4096 x 4096 (the 64-bit build and the
//! card-sized 512-bit one) and attention N 4096, d 128,
//! causal and not, one head, and a GQA group of 4 heads, on the one-row build and the
//! query-parallel card build (`AttentionCore::u55c_rows`), the card GEMM on the U55C's HBM with
//! W placed as the drivers place it. `cargo run -p tandem-fpga --example project_cycles`.

use tandem_fpga::DEFAULT_CLOCK_MHZ;
use tandem_fpga::kernels::attention::AttentionCore;
use tandem_fpga::kernels::gemm::GemmCore;
use tandem_fpga::timing::{self, MemTiming};

fn line(what: &str, cycles: u64, ops: f64) {
    let secs = cycles as f64 / (DEFAULT_CLOCK_MHZ * 1e6);
    println!(
        "{what}: {cycles} cycles, {:.2} ms at {DEFAULT_CLOCK_MHZ} MHz, {:.1} GOPS",
        secs * 1e3,
        ops / secs / 1e9
    );
}

fn main() {
    let mem = MemTiming::default();
    let g = GemmCore::u55c();
    let (m, n, k) = (4096u64, 4096u64, 4096u64);
    let c = timing::gemm_split_cycles(&g, m, n, k, &mem);
    line(
        &format!("GEMM {m}x{n}x{k} on rows {} (k_max {})", g.rows, g.k_max),
        c,
        2.0 * (m * n * k) as f64,
    );
    let c = timing::gemm_split_cycles(&g, m, n, 14336, &mem);
    line(
        &format!("GEMM {m}x{n}x14336 (K split into passes of {})", g.k_max),
        c,
        2.0 * (m * n * 14336) as f64,
    );
    // the card-sized GEMM: 64 x 64 lanes on a 512-bit port, memory serving a beat a cycle
    let wide = GemmCore::u55c_wide();
    let wmem = MemTiming {
        bytes_per_cycle: 64.0,
        ..MemTiming::default()
    };
    for kk in [4096u64, 14336] {
        let c = timing::gemm_split_cycles(&wide, m, n, kk, &wmem);
        let ideal = m.div_ceil(u64::from(wide.rows)) * n.div_ceil(u64::from(wide.lanes)) * kk;
        line(
            &format!(
                "GEMM {m}x{n}x{kk} on the card build rows {} x lanes {} ({} MACs, 512-bit port; \
                 array busy {:.1}%)",
                wide.rows,
                wide.lanes,
                wide.macs(),
                100.0 * ideal as f64 / c as f64
            ),
            c,
            2.0 * (m * n * kk) as f64,
        );
    }
    // the same build on the U55C's HBM at the target clock: one 512-bit port, every buffer
    // of a launch in one pseudo-channel of 48 bytes a cycle (reads and writes together)
    let p = &tandem_fpga::platform::U55C;
    let bank = p.bank_bytes_per_cycle(DEFAULT_CLOCK_MHZ);
    let hbm = MemTiming {
        read_latency: p.bank_read_latency_cycles(DEFAULT_CLOCK_MHZ),
        bytes_per_cycle: bank.min(64.0),
        bank_bytes_per_cycle: Some(bank),
        ..MemTiming::default()
    };
    for kk in [4096u64, 14336] {
        let c = timing::gemm_split_cycles(&wide, m, n, kk, &hbm);
        let ideal = m.div_ceil(u64::from(wide.rows)) * n.div_ceil(u64::from(wide.lanes)) * kk;
        line(
            &format!(
                "GEMM {m}x{n}x{kk} on the card build, one port, buffers in one HBM bank of \
                 {bank:.0} B/cycle (array busy {:.1}%)",
                100.0 * ideal as f64 / c as f64
            ),
            c,
            2.0 * (m * n * kk) as f64,
        );
    }
    // what the drivers do on the U55C (`drive::w_stripe_banks`): x, the parameters and y in
    // bank 0, W in a bank of its own (a card of two banks) or striped over banks 1 and 2
    for (what, w_rate) in [
        ("W in its own bank", bank),
        ("W striped over two banks", 2.0 * bank),
    ] {
        let w = timing::WPlacement::OwnBank {
            port_bytes_per_cycle: 64.0,
            bank_bytes_per_cycle: w_rate,
        };
        for kk in [4096u64, 14336] {
            let c = timing::gemm_split_cycles_placed(&wide, m, n, kk, &hbm, w);
            let ideal = m.div_ceil(u64::from(wide.rows)) * n.div_ceil(u64::from(wide.lanes)) * kk;
            line(
                &format!(
                    "GEMM {m}x{n}x{kk} on the card build, U55C HBM, {what} (array busy {:.1}%)",
                    100.0 * ideal as f64 / c as f64
                ),
                c,
                2.0 * (m * n * kk) as f64,
            );
        }
    }
    let (nq, d) = (4096u64, 128u64);
    for a in [AttentionCore::u55c(), AttentionCore::u55c_rows()] {
        for causal in [false, true] {
            let pairs = timing::visible_pairs(causal, nq, nq) as f64;
            for heads in [1u64, 4] {
                let c = timing::attention_split_cycles(&a, nq, nq, d, causal, 1, heads, &mem);
                line(
                    &format!(
                        "attention N {nq} d {d} causal {causal}, {heads} head(s) of a group on d_max {} \
                         q_rows {} ({} MACs) nkv_max {}",
                        a.d_max,
                        a.q_rows,
                        a.macs(),
                        a.nkv_max
                    ),
                    c,
                    4.0 * (d as f64) * pairs * heads as f64,
                );
            }
        }
    }
}
