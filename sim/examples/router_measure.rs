//! Measures the router on the Verilator card: cycles, logits per cycle, projected throughput
//! at the build's clock (`tandem_fpga::DEFAULT_CLOCK_MHZ`) and simulator speed, for a few MoE
//! shapes. `cargo run --release -p tandem-sim
//! --example router_measure -- LANES RENORMALIZE [DATA_BITS]` (default: the default build, 8
//! lanes on 128 bits, renormalize 1); the memory delivers one word of the build's port a cycle
//! (8 bytes at 64 bits, 16 at 128) after 40 cycles of latency.

use std::time::Duration;

use rand::{Rng, SeedableRng};
use tandem_fpga::FpgaDevice;
use tandem_fpga::drive::run_router_with;
use tandem_fpga::golden::router::route_with;
use tandem_fpga::kernels::router::RouterCore;
use tandem_fpga::shell::ShellConfig;
use tandem_sim::{MemConfig, SimCard, SimConfig};

/// Arguments: lanes (default 8), renormalize (1 or 0, default 1) and the port's width in bits
/// (default: the narrowest that holds the lanes).
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let lanes: u32 = args.get(1).map_or(Ok(8), |a| a.parse())?;
    let rn = args.get(2).is_none_or(|a| a != "0");
    let bits: u32 = args
        .get(3)
        .map_or(Ok(RouterCore::data_bits_for(lanes)), |a| a.parse())?;
    let core = RouterCore {
        e_max: 256,
        k_max: 8,
        lanes,
        data_bits: bits,
    };
    core.validate()?;
    println!(
        "router e_max 256, k_max 8, lanes {lanes}, {bits}-bit port, renormalize {rn}, memory {} B/cycle",
        bits / 8
    );
    let mut card = SimCard::open(SimConfig::default())?;
    card.load_core(&core, ShellConfig::default())?;
    card.set_mem_config(MemConfig {
        bytes_per_cycle: f64::from(bits / 8),
        ..MemConfig::default()
    });
    let clock = card.clock_hz();
    println!(
        "| T | E | k | cycles | logits/cycle | projected @{:.0} MHz | M logits/s | sim cycles/s |",
        clock / 1e6
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
    for &(t, e, k) in &[
        (4096, 8, 2),
        (4096, 16, 4),
        (2048, 64, 8),
        (1024, 128, 8),
        (1024, 256, 8),
        (4096, 256, 8),
    ] {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(9);
        let x: Vec<i16> = (0..t * e).map(|_| rng.gen_range(-2048..2048)).collect();
        let want = route_with(&x, t, e, k, rn)?;
        let (c0, w0) = (card.stats().total_cycles, card.sim_wall());
        let (got, st) =
            run_router_with(&mut card, &core, &x, t, e, k, rn, Duration::from_secs(600))?;
        assert_eq!(got, want, "bit-exact");
        let sim_c = card.stats().total_cycles - c0;
        let sim_s = (card.sim_wall() - w0).as_secs_f64();
        let secs = st.cycles as f64 / clock;
        println!(
            "| {t} | {e} | {k} | {} | {:.3} | {:.1} us | {:.0} | {:.2e} |",
            st.cycles,
            (t * e) as f64 / st.cycles as f64,
            secs * 1e6,
            (t * e) as f64 / secs / 1e6,
            sim_c as f64 / sim_s
        );
    }
    Ok(())
}
