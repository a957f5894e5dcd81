//! `tandem devices`: every backend found or not, with details, and why a missing one is missing.

use clap::Args;
use serde_json::json;
use tandem::DeviceRegistry;
use tandem::backend::CudaDType;

/// Options of `tandem devices`.
#[derive(Debug, Args)]
pub struct DevicesArgs {
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// Precision CUDA devices store tensors in (shown as their storage); default:
    /// $TANDEM_CUDA_DTYPE, else bf16.
    #[arg(long, value_name = "DTYPE", value_parser = super::cuda_dtype_parser())]
    pub cuda_dtype: Option<CudaDType>,
}

/// Lists devices.
pub fn run(args: &DevicesArgs, reg: &DeviceRegistry) -> anyhow::Result<()> {
    if args.json {
        let found: Vec<_> = reg.backends().iter().map(|b| b.info().clone()).collect();
        let mut v = super::render::envelope("devices");
        v.insert("devices".into(), json!(found));
        v.insert("missing".into(), json!(reg.missing()));
        v.insert("compiled_in".into(), json!(super::compiled_device_kinds()));
        return super::render::print_json(&serde_json::Value::Object(v));
    }
    for b in reg.backends() {
        let i = b.info();
        println!("{:<10} {}", i.id.to_string(), i.name);
        println!(
            "           memory {:.1} GiB, peak {:.1} TFLOP/s ({}), {:.0} GB/s",
            i.memory_bytes as f64 / (1u64 << 30) as f64,
            i.peak_flops / 1e12,
            i.compute_dtype,
            i.peak_bandwidth / 1e9
        );
        for (k, v) in &i.details {
            println!("           {k}: {v}");
        }
    }
    for m in reg.missing() {
        println!("{:<10} unavailable: {}", m.kind.name(), m.reason);
    }
    Ok(())
}
