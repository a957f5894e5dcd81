//! yosys `synth_xilinx` resources of the router at a few build sizes.
//! `cargo run -p tandem-fpga --example router_synth -- e_max=256,k_max=8`

use tandem_fpga::kernels::{core_for, parse_params};
use tandem_fpga::shell::ShellConfig;

#[allow(clippy::disallowed_methods)] // KEEP is this example's own switch, not a run option
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let arg = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "e_max=256,k_max=8".into());
    let core = core_for("router", &parse_params(&arg)?)?;
    let dir = std::env::temp_dir().join(format!("tandem-router-synth-{}", std::process::id()));
    let e = tandem_fpga::emit::emit(core.as_ref(), ShellConfig::default(), &dir)?;
    let t0 = std::time::Instant::now();
    let r = tandem_fpga::synth::synth(&e.verilog, core.name())?;
    println!(
        "{:?}: {r:?} ({:.0} s)",
        core.params(),
        t0.elapsed().as_secs_f64()
    );
    if std::env::var_os("KEEP").is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    } else {
        println!("kept {}", dir.display());
    }
    Ok(())
}
