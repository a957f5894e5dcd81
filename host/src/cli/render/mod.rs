//! How the binary shows what the library reports: tables (comfy-table) in the four
//! `--format`s, the JSON envelope every JSON output shares, the HTML page of `compare`, and
//! progress on stderr.

pub mod html;
pub mod progress;
mod reports;

pub use reports::{
    bench_grid, compare_grid, plan_json, plan_tables, print_run_header, run_tables, workload_json,
};

use std::io::IsTerminal;
use std::time::{SystemTime, UNIX_EPOCH};

use clap::{Args, ValueEnum};
use comfy_table::{CellAlignment, ContentArrangement, Table};
use serde_json::{Value, json};

/// Version of the JSON documents `tandem` prints (`schema_version`); raised when a key
/// changes meaning or goes away.
pub const SCHEMA_VERSION: u32 = 2;

/// The commit the binary was built from (`unknown` outside git).
pub const GIT_COMMIT: &str = env!("TANDEM_GIT_COMMIT");

/// How a report is printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// Aligned columns for people.
    Table,
    /// One JSON document (schema_version, tool, created, then the report).
    Json,
    /// GitHub-flavoured Markdown tables.
    Markdown,
    /// Comma-separated values, one header row (the node or result table only).
    Csv,
}

/// `--format` and its alias `--json`.
#[derive(Debug, Clone, Args)]
pub struct FormatArgs {
    /// Output format.
    #[arg(long, value_enum, default_value = "table")]
    pub format: Format,
    /// Same as `--format json`.
    #[arg(long, conflicts_with = "format")]
    pub json: bool,
}

impl FormatArgs {
    /// The format asked for.
    pub fn get(&self) -> Format {
        if self.json { Format::Json } else { self.format }
    }
}

/// A table of text cells, rendered in any [`Format`] but JSON.
#[derive(Debug, Clone, Default)]
pub struct Grid {
    /// Column names.
    pub header: Vec<String>,
    /// Rows, as many cells as the header.
    pub rows: Vec<Vec<String>>,
    /// Columns aligned right (numbers).
    pub right: Vec<usize>,
}

/// No borders, a rule under the header, columns two spaces apart: rows start with their
/// first cell, so `grep '^attention'` finds them.
const PLAIN: &str = "     -             ";

impl Grid {
    /// A grid with `header`; columns listed in `right` are aligned right.
    pub fn new(header: &[&str], right: &[usize]) -> Self {
        Self {
            header: header.iter().map(|s| s.to_string()).collect(),
            rows: Vec::new(),
            right: right.to_vec(),
        }
    }

    /// The grid as `format` (JSON is not a grid's: it gives the table).
    pub fn render(&self, format: Format) -> anyhow::Result<String> {
        match format {
            Format::Csv => {
                let mut w = csv::Writer::from_writer(Vec::new());
                w.write_record(&self.header)?;
                for r in &self.rows {
                    w.write_record(r)?;
                }
                Ok(String::from_utf8(w.into_inner()?)?)
            }
            Format::Markdown => {
                let esc = |c: &str| c.replace('|', "\\|");
                let mut s = format!(
                    "| {} |\n|",
                    self.header
                        .iter()
                        .map(|h| esc(h))
                        .collect::<Vec<_>>()
                        .join(" | ")
                );
                for i in 0..self.header.len() {
                    s.push_str(if self.right.contains(&i) {
                        " ---: |"
                    } else {
                        " --- |"
                    });
                }
                s.push('\n');
                for r in &self.rows {
                    let cells: Vec<String> = r.iter().map(|c| esc(c)).collect();
                    s.push_str(&format!("| {} |\n", cells.join(" | ")));
                }
                Ok(s)
            }
            Format::Table | Format::Json => {
                let mut t = Table::new();
                t.load_preset(PLAIN)
                    .set_content_arrangement(ContentArrangement::Disabled)
                    .set_header(self.header.clone());
                for r in &self.rows {
                    t.add_row(r.clone());
                }
                let n = self.header.len();
                for i in 0..n {
                    if let Some(c) = t.column_mut(i) {
                        c.set_padding((0, if i + 1 == n { 0 } else { 2 }));
                        if self.right.contains(&i) {
                            c.set_cell_alignment(CellAlignment::Right);
                        }
                    }
                }
                let text: String = t.lines().map(|l| format!("{}\n", l.trim_end())).collect();
                Ok(text)
            }
        }
    }
}

/// Text lines as Markdown (each line a paragraph line, kept apart by a hard break).
pub fn markdown_lines(text: &str) -> String {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| format!("{l}  \n"))
        .collect()
}

/// Now, as RFC 3339 UTC (`2026-11-23T10:04:05Z`).
pub fn timestamp() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Howard Hinnant's civil_from_days.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// The fields every JSON document starts with: `schema_version`, `kind` (the command),
/// `tool` (name, version, commit), `created`.
pub fn envelope(kind: &str) -> serde_json::Map<String, Value> {
    let mut m = serde_json::Map::new();
    m.insert("schema_version".into(), SCHEMA_VERSION.into());
    m.insert("kind".into(), kind.into());
    m.insert(
        "tool".into(),
        json!({"name": "tandem", "version": env!("CARGO_PKG_VERSION"), "commit": GIT_COMMIT}),
    );
    m.insert("created".into(), timestamp().into());
    m
}

/// The devices of `reg` as objects: those found (id, name, memory, peaks, details) and
/// those missing with the reason.
pub fn devices_json(reg: &tandem::DeviceRegistry) -> Value {
    let found: Vec<_> = reg
        .backends()
        .iter()
        .map(|b| {
            let i = b.info();
            let mut v = serde_json::to_value(i).unwrap_or(Value::Null);
            if let Some(m) = v.as_object_mut() {
                m.insert("name_id".into(), i.id.to_string().into());
            }
            v
        })
        .collect();
    json!({ "found": found, "missing": reg.missing() })
}

/// Adds the keys of object `report` to `v`, keeping those `v` has (the envelope's, and the
/// structured workload and devices over the report's labels).
pub fn merge(v: &mut serde_json::Map<String, Value>, report: Value) {
    if let Value::Object(m) = report {
        for (k, x) in m {
            v.entry(k).or_insert(x);
        }
    }
}

/// Prints `v` pretty on stdout.
pub fn print_json(v: &Value) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

/// Whether stderr is a terminal (bars and colour there, plain lines otherwise).
pub fn stderr_is_terminal() -> bool {
    std::io::stderr().is_terminal()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grid() -> Grid {
        let mut g = Grid::new(&["node", "time ms"], &[1]);
        g.rows.push(vec!["attention".into(), "1.500".into()]);
        g.rows.push(vec!["a|b, \"c\"".into(), "12.000".into()]);
        g
    }

    #[test]
    fn a_grid_in_every_format() -> anyhow::Result<()> {
        let t = grid().render(Format::Table)?;
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].starts_with("node"), "{t}");
        assert!(lines[1].starts_with("---"), "{t}");
        assert!(lines[2].starts_with("attention"), "{t}");
        assert!(lines[2].ends_with(" 1.500"), "{t}");
        let m = grid().render(Format::Markdown)?;
        assert_eq!(
            m,
            "| node | time ms |\n| --- | ---: |\n| attention | 1.500 |\n| a\\|b, \"c\" | 12.000 |\n"
        );
        let c = grid().render(Format::Csv)?;
        assert_eq!(
            c,
            "node,time ms\nattention,1.500\n\"a|b, \"\"c\"\"\",12.000\n"
        );
        Ok(())
    }

    #[test]
    fn timestamps_are_rfc3339() {
        let t = timestamp();
        assert_eq!(t.len(), 20, "{t}");
        assert!(
            t.starts_with("20") && t.ends_with('Z') && &t[10..11] == "T",
            "{t}"
        );
    }
}
