//! The committed XRT bindings (`src/xrt/ffi.rs`) are what bindgen makes from the installed
//! headers today; regenerate with `cargo run -p tandem-fpga --example xrt_bindgen`.

mod support;

use support::xrt_bindgen;

#[test]
fn committed_bindings_match_the_installed_headers() {
    let Some(include) = xrt_bindgen::include_dir() else {
        println!(
            "SKIP: no XRT headers (/usr/include/xrt from libxrt-dev, or /opt/xilinx/xrt/include)"
        );
        return;
    };
    // bindgen panics when it cannot load libclang; that is a missing tool, not a stale file.
    let generated = match std::panic::catch_unwind(|| xrt_bindgen::generate(&include)) {
        Ok(r) => r.expect("bindgen over the XRT headers"),
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            assert!(msg.contains("libclang"), "bindgen panicked: {msg}");
            println!("SKIP: bindgen cannot load libclang (install libclang-dev): {msg}");
            return;
        }
    };
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(xrt_bindgen::BINDINGS);
    let committed = std::fs::read_to_string(&path).expect("committed bindings");
    assert!(
        committed == generated,
        "{} is stale against the headers in {}: run `cargo run -p tandem-fpga --example xrt_bindgen` and commit the result",
        path.display(),
        include.display()
    );
}

#[test]
fn every_bound_function_is_exported_by_the_library() {
    // The bindings load with `dynamic_link_require_all`: a missing symbol fails the load.
    let search = tandem_fpga::xrt::XrtSearch::default();
    let Ok(install) = tandem_fpga::xrt::XrtInstall::find(&search) else {
        println!("SKIP: XRT is not installed");
        return;
    };
    // Loading runs no XRT code that needs XILINX_XRT (only the calls do).
    let api = unsafe { tandem_fpga::xrt::ffi::XrtApi::new(&install.library) };
    match api {
        // Never unloaded: XRT's static destructors are not meant to run mid-process.
        Ok(api) => std::mem::forget(api),
        Err(e) => panic!("{}: {e}", install.library.display()),
    }
}
