//! Regenerates `fpga/src/xrt/ffi.rs` from the installed XRT headers:
//! `cargo run -p tandem-fpga --example xrt_bindgen`. Needs libclang (Debian: libclang-dev) and
//! the XRT headers (libxrt-dev).

#[path = "../tests/support/xrt_bindgen.rs"]
mod xrt_bindgen;

use std::path::Path;
use std::process::ExitCode;

fn main() -> ExitCode {
    let Some(include) = xrt_bindgen::include_dir() else {
        eprintln!("xrt_bindgen: no XRT headers (install libxrt-dev, or XRT in /opt/xilinx/xrt)");
        return ExitCode::FAILURE;
    };
    let text = match xrt_bindgen::generate(&include) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("xrt_bindgen: {e}");
            return ExitCode::FAILURE;
        }
    };
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(xrt_bindgen::BINDINGS);
    if let Err(e) = std::fs::write(&path, text) {
        eprintln!("xrt_bindgen: {}: {e}", path.display());
        return ExitCode::FAILURE;
    }
    println!("wrote {}", path.display());
    ExitCode::SUCCESS
}
