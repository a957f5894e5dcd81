//! `tandem model`: model folders (config.json + safetensors, as transformers saves them):
//! `make-test` writes a small one of seeded random weights, `show` describes one; and the
//! graph `tandem run --weights DIR` builds from one.

use std::path::{Path, PathBuf};

use anyhow::bail;
use clap::{Args, Subcommand};
use tandem::DType;
use tandem::graph::Graph;
use tandem::limits::{self, Limits};
use tandem::workload::checkpoint::{INDEX_FILE, SINGLE_FILE};
use tandem::workload::{self, Checkpoint, MixtralConfig, ModelSizes, SaveOptions};

use super::run::WorkloadArgs;

/// `tandem model ...`.
#[derive(Debug, Subcommand)]
pub enum ModelCmd {
    /// Write a small Mixtral model folder of seeded random weights (config.json, bf16
    /// safetensors under transformers' names, sharded with an index when --shards > 1).
    MakeTest(MakeTestArgs),
    /// Describe a model folder: its sizes, files and layers.
    Show(ShowArgs),
}

/// Options of `tandem model make-test`.
#[derive(Debug, Args)]
pub struct MakeTestArgs {
    /// The folder to write (created if missing).
    #[arg(long)]
    pub out: PathBuf,
    /// Decoder layers.
    #[arg(long, default_value_t = 3)]
    pub layers: usize,
    /// Weight files: 1 writes model.safetensors; more write model-0000K-of-0000N.safetensors
    /// and model.safetensors.index.json (at most the layer count).
    #[arg(long, default_value_t = 2)]
    pub shards: usize,
    /// Tie the LM head to the embedding matrix (config.json `tie_word_embeddings: true`, no
    /// `lm_head.weight` written).
    #[arg(long)]
    pub tie_word_embeddings: bool,
    /// hidden_size.
    #[arg(long, default_value_t = 32)]
    pub hidden: usize,
    /// num_attention_heads.
    #[arg(long, default_value_t = 4)]
    pub heads: usize,
    /// num_key_value_heads.
    #[arg(long, default_value_t = 2)]
    pub kv_heads: usize,
    /// num_local_experts.
    #[arg(long, default_value_t = 4)]
    pub experts: usize,
    /// num_experts_per_tok.
    #[arg(long, default_value_t = 2)]
    pub top_k: usize,
    /// intermediate_size (one expert's FFN size).
    #[arg(long, default_value_t = 64)]
    pub ffn: usize,
    /// vocab_size.
    #[arg(long, default_value_t = 128)]
    pub vocab: usize,
    /// Seed of the weights.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Stored dtype: bf16, f16, f32.
    #[arg(long, default_value = "bf16", ignore_case = true, value_parser = super::float_dtype_parser())]
    pub dtype: DType,
    /// Replace the model files already in --out (config.json, model*.safetensors, the index).
    #[arg(long)]
    pub force: bool,
}

/// Options of `tandem model show`.
#[derive(Debug, Args)]
pub struct ShowArgs {
    /// The model folder.
    pub dir: PathBuf,
}

/// Runs a `tandem model` subcommand (no devices needed).
pub fn run(cmd: &ModelCmd) -> anyhow::Result<()> {
    match cmd {
        ModelCmd::MakeTest(a) => make_test(a),
        ModelCmd::Show(a) => show(a),
    }
}

fn make_test(a: &MakeTestArgs) -> anyhow::Result<()> {
    let sizes = ModelSizes {
        hidden: a.hidden,
        heads: a.heads,
        kv_heads: a.kv_heads,
        ffn: a.ffn,
        experts: a.experts,
        top_k: a.top_k,
        layers: a.layers,
        vocab: a.vocab,
        ..workload::test_model_sizes()
    };
    if a.layers == 0 || a.vocab == 0 {
        bail!("--layers and --vocab must be at least 1");
    }
    let c = sizes.layer_config(&MixtralConfig::default());
    c.check()?;
    let bytes = limits::sum([
        c.weight_bytes()
            .and_then(|b| b.checked_mul(a.layers as u64)),
        (a.vocab as u64).checked_mul(a.hidden as u64 * 8),
    ]);
    Limits::host().admit("model make-test", bytes)?;
    let old = model_files(&a.out)?;
    if !old.is_empty() && !a.force {
        bail!(
            "{} already holds model files ({}); pass --force to replace them",
            a.out.display(),
            old.iter()
                .filter_map(|p| p.file_name())
                .map(|n| n.to_string_lossy())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    for p in &old {
        std::fs::remove_file(p)
            .map_err(|e| anyhow::anyhow!("{}: cannot remove: {e}", p.display()))?;
    }
    let files = workload::make_test_model(
        &a.out,
        &sizes,
        a.seed,
        SaveOptions {
            shards: a.shards,
            dtype: a.dtype,
            tie_word_embeddings: a.tie_word_embeddings,
        },
    )?;
    for f in files {
        let len = std::fs::metadata(&f).map(|m| m.len()).unwrap_or(0);
        println!("wrote {} ({})", f.display(), limits::human_bytes(len));
    }
    Ok(())
}

/// The model files in `dir` (config.json, the index, model*.safetensors); none if it does not
/// exist.
fn model_files(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => bail!("{}: cannot read: {e}", dir.display()),
    };
    let mut v = Vec::new();
    for entry in rd {
        let entry = entry.map_err(|e| anyhow::anyhow!("{}: cannot read: {e}", dir.display()))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let ours = name == workload::HfConfig::FILE_NAME
            || name == INDEX_FILE
            || name == SINGLE_FILE
            || (name.starts_with("model-") && name.ends_with(".safetensors"));
        if ours {
            v.push(entry.path());
        }
    }
    v.sort();
    Ok(v)
}

fn show(a: &ShowArgs) -> anyhow::Result<()> {
    let ck = Checkpoint::open(&a.dir)?;
    let s = &ck.sizes;
    println!("model: {}", a.dir.display());
    println!(
        "sizes: hidden_size={} heads={}/{} head_dim={} intermediate_size={} experts={} top-{} \
         layers={} vocab_size={} rms_norm_eps={} rope_theta={}",
        s.hidden,
        s.heads,
        s.kv_heads,
        s.hidden / s.heads.max(1),
        s.ffn,
        s.experts,
        s.top_k,
        s.layers,
        s.vocab,
        s.rms_eps,
        s.rope_theta
    );
    println!("listed by: {}", ck.listing.display());
    println!(
        "files: {}",
        ck.files().into_iter().collect::<Vec<_>>().join(", ")
    );
    println!("layers in the files: {}", ck.layers_listed().len());
    for (name, what) in [
        (workload::model::EMBED, "embedding (token ids in)"),
        (workload::model::FINAL_NORM, "final norm"),
        (workload::model::LM_HEAD, "LM head (logits out)"),
    ] {
        let has = if ck.has(name) { "yes" } else { "no" };
        println!("{what}: {has}");
    }
    Ok(())
}

/// The graph of `tandem run --weights DIR`: the folder's first `--layers` layers (default:
/// all), its embedding and head where present; batch, sequence length, seed, precision and
/// experts per token from the flags, every other size from config.json (a flag that
/// disagrees is an error naming both).
pub fn build_from_folder(
    args: &WorkloadArgs,
    dir: &Path,
    base: MixtralConfig,
    layers: Option<usize>,
    limits: &Limits,
) -> anyhow::Result<(Graph, MixtralConfig, String)> {
    if let Some(n) = args.layer {
        bail!(
            "--layer {n} picks one layer of a safetensors file; with a model folder pass \
             --layers N (its first N layers)"
        );
    }
    let ck = Checkpoint::open(dir)?;
    let s = ck.sizes.clone();
    let cfg = ck.config_path.display();
    for (flag, given, key, value) in [
        ("--d-model", args.sizes.d_model, "hidden_size", s.hidden),
        ("--heads", args.sizes.heads, "num_attention_heads", s.heads),
        (
            "--kv-heads",
            args.sizes.kv_heads,
            "num_key_value_heads",
            s.kv_heads,
        ),
        (
            "--experts",
            args.sizes.experts,
            "num_local_experts",
            s.experts,
        ),
        ("--ffn", args.sizes.ffn, "intermediate_size", s.ffn),
    ] {
        if let Some(v) = given
            && v != value
        {
            bail!("{flag} {v} disagrees with {cfg}: {key} = {value} (leave the flag out)");
        }
    }
    let mut c = s.layer_config(&base);
    args.sizes.apply(&mut c);
    c.check()?;
    let layers = layers.unwrap_or(s.layers);
    if layers > s.layers {
        bail!(
            "--layers {layers} is more than the model's num_hidden_layers = {} ({cfg})",
            s.layers
        );
    }
    let extra = [
        workload::model::EMBED,
        workload::model::FINAL_NORM,
        workload::model::LM_HEAD,
    ]
    .iter()
    .filter(|n| ck.has(n))
    .count() as u64;
    let need = limits::sum([
        c.weight_bytes().and_then(|b| b.checked_mul(layers as u64)),
        (s.vocab as u64)
            .checked_mul(s.hidden as u64)
            .and_then(|b| b.checked_mul(4 * extra)),
        c.input_bytes(),
    ]);
    limits.admit("workload", need)?;
    let weights = ck.load(layers)?;
    let mut parts = Vec::new();
    if weights.embed.is_some() {
        parts.push(format!("embedding (vocab {})", s.vocab));
    }
    if weights.lm_head.is_some() {
        parts.push("final norm + LM head".to_string());
    } else if weights.final_norm.is_some() {
        parts.push("final norm".to_string());
    }
    let g = workload::model_graph(&c, layers, Some(weights), None, limits)?;
    let label = format!(
        "model {}, layers {layers} of {}{}{}: {} seed={} {}",
        dir.display(),
        s.layers,
        if parts.is_empty() { "" } else { ", " },
        parts.join(", "),
        super::run::layer_sizes(&c),
        c.seed,
        c.dtype
    );
    Ok((g, c, label))
}
