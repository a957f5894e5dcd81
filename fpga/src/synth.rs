//! Synthesis estimates: runs yosys `synth_xilinx` on an emitted kernel and reads its
//! LUT / FF / DSP / BRAM counts.

use std::path::Path;
use std::process::Command;

use serde::Serialize;

/// Errors of the synthesis runner.
#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    /// yosys is not installed.
    #[error("yosys not found ({0}); install it (Debian/Ubuntu: apt-get install yosys)")]
    NotFound(String),
    /// yosys failed.
    #[error("yosys failed (exit {code:?}): {tail}")]
    Failed {
        /// Exit code.
        code: Option<i32>,
        /// Last lines of its output.
        tail: String,
    },
}

/// Resources of a synthesised design (7-series/UltraScale cells as yosys maps them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Resources {
    /// LUT1..LUT6 cells.
    pub lut: u64,
    /// Flip-flops (FDRE/FDSE/FDCE/FDPE).
    pub ff: u64,
    /// DSP48E1/DSP48E2 slices.
    pub dsp: u64,
    /// RAMB18/RAMB36 blocks (a RAMB36 counts as 2 RAMB18).
    pub bram18: u64,
    /// Distributed RAM cells (RAM32M, RAM64M, RAM128X1D, RAM256X1S, ...).
    pub lutram: u64,
    /// Carry chain cells.
    pub carry: u64,
}

/// Runs `yosys synth_xilinx -family xcup -top <top>` on `verilog` (flattened).
pub fn synth(verilog: &Path, top: &str) -> Result<Resources, SynthError> {
    let script = format!(
        "read_verilog -sv {}; synth_xilinx -family xcup -flatten -top {top}; stat",
        verilog.display()
    );
    let out = Command::new("yosys")
        .args(["-p", &script])
        .output()
        .map_err(|e| SynthError::NotFound(e.to_string()))?;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = text.lines().chain(err.lines()).collect();
        let n = tail.len();
        return Err(SynthError::Failed {
            code: out.status.code(),
            tail: tail[n.saturating_sub(15)..].join("\n"),
        });
    }
    let last = text
        .rfind("Printing statistics")
        .map_or(&text[..], |i| &text[i..]);
    Ok(parse_stat(last))
}

/// Reads the cell counts of yosys's `stat` output.
pub fn parse_stat(text: &str) -> Resources {
    let mut r = Resources::default();
    for line in text.lines() {
        let mut w = line.split_whitespace();
        let (Some(cell), Some(n)) = (w.next(), w.next()) else {
            continue;
        };
        let Ok(n) = n.parse::<u64>() else { continue };
        match cell {
            c if c.starts_with("LUT") && c.len() == 4 => r.lut += n,
            "FDRE" | "FDSE" | "FDCE" | "FDPE" => r.ff += n,
            c if c.starts_with("DSP48") => r.dsp += n,
            c if c.starts_with("RAMB18") => r.bram18 += n,
            c if c.starts_with("RAMB36") => r.bram18 += 2 * n,
            c if c.starts_with("RAM") && c[3..].starts_with(|ch: char| ch.is_ascii_digit()) => {
                r.lutram += n
            }
            c if c.starts_with("CARRY") => r.carry += n,
            _ => {}
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_lines() {
        let s = "   Number of cells: 10\n     CARRY4   3\n     FDRE    120\n     LUT2   5\n     LUT6   7\n     DSP48E2   2\n     RAMB36E2  1\n     RAM64M  4\n     RAM256X1S  2\n";
        let r = parse_stat(s);
        assert_eq!(
            r,
            Resources {
                lut: 12,
                ff: 120,
                dsp: 2,
                bram18: 2,
                lutram: 6,
                carry: 3
            }
        );
    }
}
