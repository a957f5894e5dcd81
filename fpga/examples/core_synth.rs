//! yosys `synth_xilinx` resources of one kernel core alone (no shell), the figures of
//! docs/FPGA.md's resource table.
//! `cargo run --release -p tandem-fpga --example core_synth -- gemm rows=16,k_max=1024,n_max=1024`

use tandem_fpga::kernels::{core_for, parse_params};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let kernel = args.next().unwrap_or_else(|| "gemm".into());
    let params = args.next().unwrap_or_default();
    let core = core_for(&kernel, &parse_params(&params)?)?;
    let dir = std::env::temp_dir().join(format!("tandem-core-synth-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let top = format!("{}_core", core.name());
    let path = dir.join(format!("{top}.v"));
    std::fs::write(&path, core.core_verilog()?)?;
    let t0 = std::time::Instant::now();
    let r = tandem_fpga::synth::synth(&path, &top);
    let _ = std::fs::remove_dir_all(&dir);
    println!(
        "{kernel} {:?}: {:?} ({:.0} s of yosys)",
        core.params(),
        r?,
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}
