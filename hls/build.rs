//! Builds the HLS C++ kernels with the host C++ compiler (as Vitis HLS csim would), so the
//! tests can call them through their `extern "C"` entry points.

fn main() {
    let sources = [
        "src/gemm.cpp",
        "src/attention.cpp",
        "src/router.cpp",
        "src/vecops.cpp",
    ];
    for s in sources.iter().chain(&[
        "src/tandem_hls.h",
        "src/exp2_lut.inc",
        "src/vecops_rsqrt_lut.inc",
        "src/vecops_sigmoid_lut.inc",
    ]) {
        println!("cargo:rerun-if-changed={s}");
    }
    cc::Build::new()
        .cpp(true)
        .files(sources)
        .include("src")
        .flag_if_supported("-std=c++14")
        .flag_if_supported("-Wno-unknown-pragmas")
        .flag_if_supported("-Wno-unused-label")
        .flag_if_supported("-Wall")
        .flag_if_supported("-Wextra")
        .opt_level(2)
        .compile("tandem_hls_kernels");
}
