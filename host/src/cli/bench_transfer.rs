//! `tandem bench transfer`: host<->GPU copy bandwidth of each CUDA device, tandem's upload and
//! download (pinned staging, dtype conversion) beside the raw pinned and pageable copies
//! measured in the same run.

use tandem::DeviceRegistry;
use tandem::backend::DeviceKind;

use super::render::{self, Format};

/// Bytes per copy unless `--bytes` says otherwise: 256 MiB, well past where the link reaches
/// its rate.
pub const DEFAULT_BYTES: usize = 256 << 20;

/// Measures every CUDA device of `reg` (opened again with the registry's options) and prints
/// the figures.
#[cfg(feature = "cuda")]
pub fn run(
    reg: &DeviceRegistry,
    bytes: Option<usize>,
    iters: Option<usize>,
    format: Format,
) -> anyhow::Result<()> {
    use tandem::backend::cuda::CudaBackend;
    let devices = reg.of_kind(DeviceKind::Cuda);
    if devices.is_empty() {
        let why = reg
            .missing()
            .iter()
            .find(|m| m.kind == DeviceKind::Cuda)
            .map_or_else(|| "not found".to_string(), |m| m.reason.clone());
        anyhow::bail!("bench transfer measures CUDA devices, and none is available: {why}");
    }
    let bytes = bytes.unwrap_or(DEFAULT_BYTES);
    let iters = iters.unwrap_or(10);
    let mut all = Vec::new();
    for d in devices {
        let be = CudaBackend::open(d.id().index, reg.options().cuda.clone())?;
        let figures = be.measure_transfers(bytes, iters)?;
        all.push((d.id(), d.info().name.clone(), figures));
    }
    match format {
        Format::Json => {
            let mut v = render::envelope("bench-transfer");
            v.insert("devices".into(), render::devices_json(reg));
            v.insert("bytes".into(), bytes.into());
            v.insert("iters".into(), iters.into());
            let per: Vec<serde_json::Value> = all
                .iter()
                .map(|(id, name, f)| {
                    serde_json::json!({"device": id.to_string(), "name": name, "transfers": f})
                })
                .collect();
            v.insert("results".into(), per.into());
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
                    "path", "dir", "ms", "host GB/s", "link GB/s", "of pinned"
                );
                for f in figures {
                    println!(
                        "{:<44} {:>4} {:>10.3} {:>10.2} {:>10.2} {:>8.0}%",
                        f.path,
                        f.direction,
                        f.median_s * 1e3,
                        f.host_gbps,
                        f.link_gbps,
                        f.of_pinned_ceiling * 100.0
                    );
                }
                println!(
                    "host GB/s: the f32 tensor's bytes per second; link GB/s: the bytes that \
                     crossed the link (16-bit storage halves them)"
                );
            }
        }
    }
    Ok(())
}

/// Without the `cuda` feature there is nothing to measure.
#[cfg(not(feature = "cuda"))]
pub fn run(
    _reg: &DeviceRegistry,
    _bytes: Option<usize>,
    _iters: Option<usize>,
    _format: Format,
) -> anyhow::Result<()> {
    anyhow::bail!(
        "bench transfer measures CUDA devices; tandem was built without the `cuda` feature"
    )
}
