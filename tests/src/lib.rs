//! Shared helpers for tandem's cross-backend integration tests: reading the PyTorch reference
//! vectors, seeded random data, error measures and error-kind assertions.
//! Benchmarks of tandem live in `benches/benches`; PyTorch peers in `benches/peers`.

pub mod cuda;
pub mod decode;
pub mod fp8;
pub mod skip;

pub use skip::{Need, skip};

use std::collections::HashMap;
use std::path::Path;

use ndarray::{ArrayD, IxDyn};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use safetensors::{Dtype, SafeTensors};
use tandem::{ErrorKind, Tensor};

/// Boxed error for `?` in tests.
pub type TestError = Box<dyn std::error::Error>;
/// Result of a test or helper.
pub type TestResult<T = ()> = Result<T, TestError>;

/// Folder of the PyTorch reference vectors, relative to the crate folder (the working
/// directory of `cargo test`, and of test binaries run from a copy of the tree).
pub const REFERENCE_DIR: &str = "data/reference";

/// Every tensor of `data/reference/{name}.safetensors`, as f64 (F64 kept, I64 converted).
pub fn load_reference(name: &str) -> TestResult<HashMap<String, ArrayD<f64>>> {
    let path = Path::new(REFERENCE_DIR).join(format!("{name}.safetensors"));
    let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let st = SafeTensors::deserialize(&bytes)?;
    let mut out = HashMap::new();
    for (key, view) in st.tensors() {
        let data = view.data();
        let values: Vec<f64> = match view.dtype() {
            Dtype::F64 => data
                .chunks_exact(8)
                .map(|c| f64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
                .collect(),
            Dtype::I64 => data
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().unwrap_or([0; 8])) as f64)
                .collect(),
            other => return Err(format!("{name}/{key}: unexpected dtype {other:?}").into()),
        };
        out.insert(key, ArrayD::from_shape_vec(IxDyn(view.shape()), values)?);
    }
    Ok(out)
}

/// The tensor `key` of a loaded reference file.
pub fn get<'a>(file: &'a HashMap<String, ArrayD<f64>>, key: &str) -> TestResult<&'a ArrayD<f64>> {
    file.get(key)
        .ok_or_else(|| format!("reference file lacks tensor '{key}'").into())
}

/// The case `name` of `data/reference/index.json`.
pub fn reference_case(name: &str) -> TestResult<serde_json::Value> {
    let path = Path::new(REFERENCE_DIR).join("index.json");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let index: serde_json::Value = serde_json::from_str(&text)?;
    index["cases"]
        .as_array()
        .and_then(|cases| cases.iter().find(|c| c["name"] == name))
        .cloned()
        .ok_or_else(|| format!("index.json has no case '{name}'").into())
}

/// A seeded generator, so every failing case can be replayed.
pub fn rng(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed)
}

/// Values uniform in [-scale, scale), rounded to f32, of the given shape.
pub fn uniform(rng: &mut ChaCha8Rng, shape: &[usize], scale: f32) -> ArrayD<f32> {
    ArrayD::from_shape_simple_fn(IxDyn(shape), || rng.gen_range(-scale..scale))
}

/// Values drawn from a small set of integers (-2..=2), so ties are common.
pub fn small_ints(rng: &mut ChaCha8Rng, shape: &[usize]) -> ArrayD<f32> {
    ArrayD::from_shape_simple_fn(IxDyn(shape), || rng.gen_range(-2i32..=2) as f32)
}

/// An f64 array as an f32 tensor (rounding).
pub fn f32_tensor(a: &ArrayD<f64>) -> Tensor {
    Tensor::from_f32(a.mapv(|v| v as f32))
}

/// An f64 array of integral values as an i32 tensor.
pub fn i32_tensor(a: &ArrayD<f64>) -> Tensor {
    Tensor::from_i32(a.mapv(|v| v as i32))
}

/// ||out - ref|| / ||ref|| (absolute when ref is all zero; NaN on shape mismatch or NaN).
pub fn rel_err(out: &ArrayD<f64>, reference: &ArrayD<f64>) -> f64 {
    tandem::tensor::rel_error(out, reference)
}

/// Relative error over the finite entries, after checking that `out` and `reference` are
/// -inf at exactly the same places (rows of attention that see no key).
pub fn rel_err_neg_inf(out: &ArrayD<f64>, reference: &ArrayD<f64>) -> TestResult<f64> {
    if out.shape() != reference.shape() {
        return Err(format!("shapes {:?} vs {:?}", out.shape(), reference.shape()).into());
    }
    let mut o = Vec::new();
    let mut r = Vec::new();
    for (i, (&a, &b)) in out.iter().zip(reference.iter()).enumerate() {
        match (a == f64::NEG_INFINITY, b == f64::NEG_INFINITY) {
            (true, true) => {}
            (false, false) => {
                o.push(a);
                r.push(b);
            }
            _ => return Err(format!("element {i}: {a} vs {b} (-inf must match)").into()),
        }
    }
    let n = o.len();
    Ok(rel_err(
        &ArrayD::from_shape_vec(IxDyn(&[n]), o)?,
        &ArrayD::from_shape_vec(IxDyn(&[n]), r)?,
    ))
}

/// Asserts `result` is an InvalidArgument error whose message contains each of `needles`.
pub fn assert_invalid<T: std::fmt::Debug>(result: tandem::Result<T>, needles: &[&str]) {
    match result {
        Ok(v) => panic!("expected InvalidArgument mentioning {needles:?}, got Ok({v:?})"),
        Err(e) => {
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
            let msg = e.to_string();
            for n in needles {
                assert!(msg.contains(n), "message '{msg}' lacks '{n}'");
            }
        }
    }
}

/// The options devices are opened with in tests: the defaults, with the CUDA libraries and
/// the kernel cache where this machine keeps them ([`tandem::options::CudaOptions::machine`]);
/// no setting is read from the environment. CUDA stores in `dtype`.
pub fn options(dtype: tandem::backend::CudaDType) -> tandem::options::Options {
    tandem::options::Options {
        cuda: tandem::options::CudaOptions {
            dtype,
            ..tandem::options::CudaOptions::machine(&tandem::options::ProcessEnv)
        },
        fpga: board_options(),
        ..tandem::options::Options::default()
    }
}

/// FPGA options with what reaching an Alveo board needs: XRT's settings from the environment
/// (`XILINX_XRT`, `TANDEM_XRT_LIB`, `TANDEM_XCLBIN_DIR`, `XCL_EMULATION_MODE`,
/// `XILINX_VITIS`) and the `tandem` binary cargo built beside this test as the board probe
/// (without it, boards are not listed and the board cases say so).
pub fn board_options() -> tandem::options::FpgaOptions {
    let d = tandem::options::FpgaOptions::default();
    let Ok(env) = tandem::options::FpgaOptions::from_source(&tandem::options::ProcessEnv) else {
        return d;
    };
    let probe = std::env::current_exe()
        .ok()
        .and_then(|p| Some(p.parent()?.parent()?.join("tandem")))
        .filter(|p| p.is_file());
    tandem::options::FpgaOptions {
        xilinx_xrt: env.xilinx_xrt,
        xrt_lib: env.xrt_lib,
        xclbin_dir: env.xclbin_dir,
        xrt_emulation: env.xrt_emulation,
        xilinx_vitis: env.xilinx_vitis,
        xrt_probe: probe,
        ..d
    }
}

/// Every device on this machine, discovered once per test binary with [`options`] (bf16).
pub fn registry() -> &'static tandem::DeviceRegistry {
    static REG: std::sync::OnceLock<tandem::DeviceRegistry> = std::sync::OnceLock::new();
    REG.get_or_init(|| {
        tandem::DeviceRegistry::discover_with(tandem::backend::Probe {
            options: options(tandem::backend::CudaDType::default()),
            ..tandem::backend::Probe::default()
        })
    })
}

/// The first device of `kind`, or `None` after printing why the test is skipped.
pub fn device_or_skip(kind: tandem::DeviceKind) -> Option<std::sync::Arc<dyn tandem::Backend>> {
    let reg = registry();
    if let Some(b) = reg.of_kind(kind).into_iter().next() {
        return Some(b);
    }
    let why = reg
        .missing()
        .iter()
        .find(|m| m.kind == kind)
        .map_or_else(|| "not found".to_string(), |m| m.reason.clone());
    let need = if kind == tandem::DeviceKind::Cuda {
        Need::Gpu
    } else {
        Need::FpgaTool
    };
    skip(need, &format!("{} is unavailable: {why}", kind.name()));
    None
}

/// The devices of this machine with CUDA storing in `dtype` (the FPGA kinds not probed),
/// discovered once per test binary and precision.
pub fn cuda_registry(dtype: tandem::backend::CudaDType) -> &'static tandem::DeviceRegistry {
    use std::sync::OnceLock;
    static REGS: [OnceLock<tandem::DeviceRegistry>; 2] = [OnceLock::new(), OnceLock::new()];
    let i = tandem::backend::CudaDType::ALL
        .iter()
        .position(|&d| d == dtype)
        .unwrap_or(0);
    REGS[i].get_or_init(|| {
        tandem::DeviceRegistry::discover_with(tandem::backend::Probe {
            cuda: true,
            fpga: false,
            options: options(dtype),
        })
    })
}

/// The first CUDA device, storing in `dtype`, or `None` after printing why the test is skipped.
pub fn cuda_or_skip(
    dtype: tandem::backend::CudaDType,
) -> Option<std::sync::Arc<dyn tandem::Backend>> {
    let reg = cuda_registry(dtype);
    if let Some(b) = reg.of_kind(tandem::DeviceKind::Cuda).into_iter().next() {
        return Some(b);
    }
    let why = reg
        .missing()
        .iter()
        .find(|m| m.kind == tandem::DeviceKind::Cuda)
        .map_or_else(|| "not found".to_string(), |m| m.reason.clone());
    skip(Need::Gpu, &format!("cuda ({dtype}) is unavailable: {why}"));
    None
}

/// `verilator --lint-only -Wall` of `verilog` (top module `top`) must be clean, and yosys
/// `synth_xilinx` must map it; returns the resource counts (`None`, printed, where yosys is
/// missing). Lint is skipped, printed, where verilator is missing.
pub fn lint_and_synth(
    verilog: &str,
    top: &str,
) -> TestResult<Option<tandem_fpga::synth::Resources>> {
    let dir = std::env::temp_dir().join(format!("tandem-lint-{top}-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let path = dir.join(format!("{top}.v"));
    std::fs::write(&path, verilog)?;
    match std::process::Command::new("verilator")
        .args(["--lint-only", "-Wall", "--top-module", top])
        .arg(&path)
        .output()
    {
        Ok(out) => {
            let err = String::from_utf8_lossy(&out.stderr);
            if !out.status.success() || err.contains("%Warning") {
                return Err(format!("verilator lint of {top}: {err}").into());
            }
        }
        Err(e) => skip(Need::FpgaTool, &format!("lint: verilator not found ({e})")),
    }
    let r = match tandem_fpga::synth::synth(&path, top) {
        Ok(r) => Some(r),
        Err(tandem_fpga::synth::SynthError::NotFound(e)) => {
            skip(Need::FpgaTool, &format!("synthesis: yosys not found ({e})"));
            None
        }
        Err(e) => return Err(format!("yosys failed on {top}: {e}").into()),
    };
    std::fs::remove_dir_all(&dir).ok();
    Ok(r)
}

/// The clock of an FPGA backend's cards in MHz, as it reports it (its `clock` detail,
/// "300 MHz"): what `LaunchInfo::device_time` is computed at.
pub fn fpga_clock_mhz(b: &dyn tandem::Backend) -> f64 {
    b.info()
        .details
        .iter()
        .find(|(k, _)| k == "clock")
        .and_then(|(_, v)| v.trim_end_matches(" MHz").parse().ok())
        .unwrap_or_else(|| panic!("no clock in {:?}", b.info().details))
}
