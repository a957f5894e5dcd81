//! `tandem run --decode T`: a decode step of one attention block (T new tokens per sequence
//! against a KV cache of up to --context tokens, `tandem::workload::decode`) instead of the
//! Mixtral layer, so the planner places decode attention like any other op.

use anyhow::bail;
use clap::Args;
use tandem::workload::decode::{DecodeStep, decode_layer};
use tandem::workload::{MixtralConfig, WorkloadFile};

use super::run::WorkloadArgs;

/// The decode step's flags.
#[derive(Debug, Args, Default)]
pub struct DecodeArgs {
    /// Run a decode step instead of the Mixtral layer: this many new tokens (1..=16) per
    /// sequence through RMSNorm, q_proj, RoPE, decode attention against a KV cache, o_proj.
    /// Batch, d_model, heads and kv_heads come from the usual flags or the workload file.
    #[arg(long, value_name = "T")]
    pub decode: Option<usize>,
    /// With --decode: tokens of the longest sequence's KV cache, the new ones included (the
    /// others' lengths vary down to about half of it).
    #[arg(long, value_name = "N", default_value_t = 1024, requires = "decode")]
    pub context: usize,
    /// With --decode: a paged KV cache with blocks of this many tokens (default: contiguous).
    #[arg(long, value_name = "TOKENS", requires = "decode")]
    pub kv_block_size: Option<usize>,
}

/// The decode step's graph, the config its sizes came from (seq_len = T) and its label.
pub fn build(
    args: &WorkloadArgs,
    new_tokens: usize,
    limits: &tandem::limits::Limits,
) -> anyhow::Result<(tandem::graph::Graph, MixtralConfig, String)> {
    if args.weights.is_some() {
        bail!("--decode generates its weights and cache: --weights is not taken with it");
    }
    let (mut c, name) = match &args.workload {
        Some(p) => {
            let w = WorkloadFile::load(p)?;
            let name = w.name.clone().unwrap_or_else(|| p.display().to_string());
            (w.mixtral, name)
        }
        None => (MixtralConfig::default(), "decode step".to_string()),
    };
    args.sizes.apply(&mut c);
    c.seq_len = new_tokens;
    let step = DecodeStep {
        new_tokens,
        context: args.decode.context,
        block_size: args.decode.kv_block_size,
    };
    let g = decode_layer(&c, &step, limits)?;
    let cache = match step.block_size {
        Some(bs) => format!("paged KV cache (blocks of {bs})"),
        None => "contiguous KV cache".into(),
    };
    let label = format!(
        "{name}: B={} new tokens={} context<={} ({cache}) d_model={} heads={}/{} head_dim={} \
         seed={} {}",
        c.batch,
        new_tokens,
        step.context,
        c.d_model,
        c.heads,
        c.kv_heads,
        c.head_dim(),
        c.seed,
        c.dtype
    );
    Ok((g, c, label))
}
