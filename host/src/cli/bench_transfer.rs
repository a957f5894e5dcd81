//! `tandem bench transfer`: host<->device copy bandwidth of each CUDA device (tandem's upload
//! and download, pinned staging and dtype conversion, beside the raw pinned and pageable
//! copies) and of the simulated FPGA card (its buffer writes and reads, and the int8
//! activation path, beside one memcpy), measured in the same run. With two or more GPUs, also
//! the direct copy between the first two (`copy_peer`, each direction).

use tandem::DeviceRegistry;
use tandem::backend::{Backend, DeviceKind};

use tandem::bench::transfer::TransferFigure;

use super::render::{self, Format};

/// Bytes per copy unless `--bytes` says otherwise: 256 MiB, well past where the link reaches
/// its rate.
pub const DEFAULT_BYTES: usize = 256 << 20;

/// Measures every CUDA device of `reg` (opened again with the registry's options) and the
/// simulated FPGA card, and prints the figures.
pub fn run(
    reg: &DeviceRegistry,
    bytes: Option<usize>,
    iters: Option<usize>,
    format: Format,
) -> anyhow::Result<()> {
    let bytes = bytes.unwrap_or(DEFAULT_BYTES);
    let iters = iters.unwrap_or(10);
    let mut all: Vec<(String, String, Vec<TransferFigure>)> = Vec::new();
    let mut skipped = Vec::new();
    measure_cuda(reg, bytes, iters, &mut all, &mut skipped)?;
    if reg.of_kind(DeviceKind::FpgaSim).is_empty() {
        skipped.push(format!(
            "fpga-sim: {}",
            why_missing(reg, DeviceKind::FpgaSim)
        ));
    } else {
        match tandem::backend::fpga::simulated(&reg.options().fpga) {
            Ok(b) => {
                let figures = b.measure_transfers(bytes, iters)?;
                all.push((b.id().to_string(), b.info().name.clone(), figures));
            }
            Err(why) => skipped.push(format!("fpga-sim: {why}")),
        }
    }
    if !reg.of_kind(DeviceKind::FpgaXrt).is_empty() {
        skipped.push("fpga (board): not measured by this bench yet".into());
    }
    for s in &skipped {
        eprintln!("tandem: bench transfer: skipped {s}");
    }
    if all.is_empty() {
        anyhow::bail!(
            "bench transfer found no device to measure ({})",
            skipped.join("; ")
        );
    }
    match format {
        Format::Json => {
            let mut v = render::envelope("bench-transfer");
            v.insert("devices".into(), render::devices_json(reg));
            v.insert("bytes".into(), bytes.into());
            v.insert("iters".into(), iters.into());
            let per: Vec<serde_json::Value> = all
                .iter()
                .map(
                    |(id, name, f)| serde_json::json!({"device": id, "name": name, "transfers": f}),
                )
                .collect();
            v.insert("results".into(), per.into());
            v.insert("skipped".into(), skipped.into());
            render::print_json(&serde_json::Value::Object(v))?;
        }
        _ => {
            for (id, name, figures) in &all {
                println!(
                    "{id} ({name}): {:.1} MiB per copy, median of {iters}",
                    bytes as f64 / (1u64 << 20) as f64
                );
                println!(
                    "{:<44} {:>4} {:>10} {:>10} {:>10} {:>9}",
                    "path", "dir", "ms", "host GB/s", "link GB/s", "of raw"
                );
                for f in figures {
                    let share = if f.of_pinned_ceiling.is_finite() {
                        format!("{:.0}%", f.of_pinned_ceiling * 100.0)
                    } else {
                        "-".into()
                    };
                    println!(
                        "{:<44} {:>4} {:>10.3} {:>10.2} {:>10.2} {:>9}",
                        f.path,
                        f.direction,
                        f.median_s * 1e3,
                        f.host_gbps,
                        f.link_gbps,
                        share
                    );
                }
                println!(
                    "host GB/s: the f32 tensor's bytes per second; link GB/s: the bytes that \
                     reached device memory (16-bit storage halves them, int8 quarters them); \
                     of raw: host GB/s against the raw copy (pinned on a GPU, one memcpy on \
                     a simulated card) of the same direction"
                );
            }
        }
    }
    Ok(())
}

fn why_missing(reg: &DeviceRegistry, kind: DeviceKind) -> String {
    reg.missing()
        .iter()
        .find(|m| m.kind == kind)
        .map_or_else(|| "not found".to_string(), |m| m.reason.clone())
}

#[cfg(feature = "cuda")]
fn measure_cuda(
    reg: &DeviceRegistry,
    bytes: usize,
    iters: usize,
    all: &mut Vec<(String, String, Vec<TransferFigure>)>,
    skipped: &mut Vec<String>,
) -> anyhow::Result<()> {
    use tandem::backend::cuda::CudaBackend;
    let devices = reg.of_kind(DeviceKind::Cuda);
    if devices.is_empty() {
        skipped.push(format!("cuda: {}", why_missing(reg, DeviceKind::Cuda)));
    }
    let mut opened = Vec::new();
    for d in devices {
        let be = CudaBackend::open(d.id().index, reg.options().cuda.clone())?;
        let figures = be.measure_transfers(bytes, iters)?;
        all.push((d.id().to_string(), d.info().name.clone(), figures));
        opened.push(be);
    }
    match opened.as_slice() {
        [a, b, ..] => {
            for (src, dst) in [(a, b), (b, a)] {
                match measure_peer(src, dst, bytes, iters)? {
                    Some(f) => all.push((
                        format!("{} -> {}", src.id(), dst.id()),
                        format!("{} -> {}", src.info().name, dst.info().name),
                        vec![f],
                    )),
                    None => skipped.push(format!(
                        "peer copy {} -> {}: the two GPUs cannot access each other",
                        src.id(),
                        dst.id()
                    )),
                }
            }
        }
        _ => skipped.push("peer copy: needs two GPUs".into()),
    }
    Ok(())
}

/// The direct copy of `bytes` bytes (an i32 tensor: stored as is, no conversion) from `src`
/// to `dst` (`copy_peer`, which returns once the copy completed): median of `iters` after one
/// untimed copy; `None` when the GPUs have no peer path. The figure's ceiling is unknown
/// (no raw peer copy is timed apart from this one), so its share is NaN.
#[cfg(feature = "cuda")]
fn measure_peer(
    src: &tandem::backend::cuda::CudaBackend,
    dst: &tandem::backend::cuda::CudaBackend,
    bytes: usize,
    iters: usize,
) -> anyhow::Result<Option<TransferFigure>> {
    let n = (bytes / 4).max(1);
    let t = tandem::Tensor::from_vec_i32(&[n], vec![7; n])?;
    let st = src.upload(&t)?;
    if dst.copy_peer(&st)?.is_none() {
        return Ok(None);
    }
    let secs = tandem::bench::transfer::median_time(iters, || dst.copy_peer(&st).map(drop))?;
    Ok(Some(TransferFigure::new(
        "tandem copy_peer (cuMemcpyPeerAsync)",
        "p2p",
        n * 4,
        n * 4,
        secs,
        f64::NAN,
    )))
}

/// Without the `cuda` feature there is no GPU to measure.
#[cfg(not(feature = "cuda"))]
fn measure_cuda(
    _reg: &DeviceRegistry,
    _bytes: usize,
    _iters: usize,
    _all: &mut Vec<(String, String, Vec<TransferFigure>)>,
    skipped: &mut Vec<String>,
) -> anyhow::Result<()> {
    skipped.push("cuda: tandem was built without the `cuda` feature".into());
    Ok(())
}
