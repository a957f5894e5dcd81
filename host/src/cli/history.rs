//! `tandem history show|reset`: the op-time history the planner learns from, seen and cleared.

use clap::Subcommand;
use tandem::options::Options;
use tandem::plan::{HISTORY_VERSION, History};

/// `tandem history` subcommands.
#[derive(Debug, Subcommand)]
pub enum HistoryCmd {
    /// List what the planner learned: per device, op and shape the samples, the mean time and
    /// the worst error measured, and the file it is kept in.
    Show {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Forget every measured time and error (removes the file).
    Reset,
}

/// Runs a `tandem history` subcommand.
pub fn run(cmd: &HistoryCmd, options: &Options) -> anyhow::Result<()> {
    let path = options.history.as_deref();
    let mut h = History::at(path);
    let where_ = match path {
        Some(p) => p.display().to_string(),
        None => "none (TANDEM_HISTORY=off: nothing is read or recorded)".into(),
    };
    match cmd {
        HistoryCmd::Show { json: true } => {
            let v = serde_json::json!({
                "file": path,
                "version": HISTORY_VERSION,
                "entries": h.list(),
            });
            println!("{}", serde_json::to_string_pretty(&v)?);
        }
        HistoryCmd::Show { json: false } => {
            let list = h.list();
            println!("file: {where_}");
            println!("{} entries", list.len());
            if list.is_empty() {
                return Ok(());
            }
            println!(
                "{:<12} {:>6} {:>12} {:>10}  {:<10} op / input shapes",
                "device", "n", "mean ms", "max err", "flag"
            );
            for e in &list {
                let err = e
                    .max_rel_error
                    .map(|x| format!("{x:.1e}"))
                    .unwrap_or_else(|| "-".into());
                println!(
                    "{:<12} {:>6} {:>12.4} {:>10}  {:<10} {} / {}",
                    e.device,
                    e.n,
                    e.mean_s * 1e3,
                    err,
                    if e.contended { "contended" } else { "" },
                    e.op,
                    e.shapes
                );
            }
            if list.iter().any(|e| e.contended) {
                println!(
                    "contended: CPU times taken while a Verilator simulation shared the cores; not used as estimates"
                );
            }
        }
        HistoryCmd::Reset => {
            let n = h.reset()?;
            println!("reset: {n} entries removed ({where_})");
        }
    }
    Ok(())
}
