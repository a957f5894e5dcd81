//! Resources and logic depth per pipeline stage of a kernel build (the router unless a kernel
//! is named first), from yosys: the whole kernel
//! (shell + core) through `synth_xilinx -family xcup -flatten`, its cell counts (`stat`), the
//! longest path (`ltp -noff`), and for every group of registers (a pipeline stage: `p2d_*`,
//! `d3*`, `tv_*`, ...) the deepest combinational cone that feeds it, counted in cells on the
//! path (LUT, MUXF, CARRY8, DSP48E2, LUTRAM read; what `ltp` counts) and in LUT levels (LUT and
//! MUXF only: a CARRY8 adds ~0.1 ns, a LUT level with its routing ~0.4-0.5 ns on an UltraScale+
//! -2 part). Registers and block RAM end a path; a LUTRAM's read is combinational from its
//! address, its write ends a path.
//! `cargo run --release -p tandem-fpga --example router_depth -- e_max=256,k_max=8,lanes=4`
//! `cargo run -p tandem-fpga --example router_depth -- gemm rows=1,lanes=64,k_max=4096,n_max=4096`
//!
//! `TRACE=core.g_st` (a stage name as the table prints it) also prints the deepest-in-LUTs
//! path into that stage, net by net from the register back to where it starts; `KEEP=1` keeps
//! the emitted Verilog and the netlist.

use std::collections::HashMap;
use std::process::Command;

use serde_json::Value;
use tandem_fpga::kernels::{core_for, parse_params};
use tandem_fpga::shell::ShellConfig;

/// Depth of a net: cells on the longest path and LUT levels on the deepest-in-LUTs path.
#[derive(Debug, Clone, Copy, Default)]
struct Depth {
    cells: u32,
    luts: u32,
}

fn is_ff(t: &str) -> bool {
    t.starts_with("FD")
}

fn is_bram(t: &str) -> bool {
    t.starts_with("RAMB") || t.starts_with("URAM")
}

fn is_lutram(t: &str) -> bool {
    t.starts_with("RAM") && !is_bram(t)
}

/// Whether input `pin` of a LUTRAM cell reaches its outputs combinationally (an address).
fn lutram_read_pin(pin: &str) -> bool {
    pin.starts_with("ADDR") || pin.starts_with("DPRA") || pin.starts_with('A')
}

/// The memory a RAM cell implements, from yosys' cell name (`$\\core.ab$...` -> `core.ab`).
fn memory_of(cell: &str) -> String {
    let s = cell.trim_start_matches('$').trim_start_matches('\\');
    s.split('$').next().unwrap_or(s).to_string()
}

/// The stage a register belongs to: its name without indices and lane/slot numbers, the
/// divider stages by their number (`d3r`, `d3q`, `d3e_0` -> `d3`).
fn stage_of(name: &str) -> String {
    let base = name.trim_start_matches('\\');
    let base = base.split(' ').next().unwrap_or(base);
    let base = base.split('[').next().unwrap_or(base);
    let mut s: &str = base;
    while let Some(i) = s.rfind('_') {
        if s[i + 1..].chars().all(|c| c.is_ascii_digit()) && i + 1 < s.len() {
            s = &s[..i];
        } else {
            break;
        }
    }
    let b = s.as_bytes();
    if b.len() >= 3 && b[0] == b'd' && b[1].is_ascii_digit() {
        let n: String = s[1..].chars().take_while(|c| c.is_ascii_digit()).collect();
        return format!("d{n} (divider)");
    }
    s.to_string()
}

#[allow(clippy::disallowed_methods)] // KEEP is this example's own switch, not a run option
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (kernel, arg) = match args.first() {
        Some(a) if !a.contains('=') => (a.clone(), args.get(1).cloned().unwrap_or_default()),
        Some(a) => ("router".to_string(), a.clone()),
        None => (
            "router".to_string(),
            "e_max=256,k_max=8,lanes=4".to_string(),
        ),
    };
    let core = core_for(&kernel, &parse_params(&arg)?)?;
    let dir = std::env::temp_dir().join(format!("tandem-{kernel}-depth-{}", std::process::id()));
    let e = tandem_fpga::emit::emit(core.as_ref(), ShellConfig::default(), &dir)?;
    let json = dir.join(format!("{kernel}.json"));
    let script = format!(
        "read_verilog -sv {}; synth_xilinx -family xcup -flatten -top {kernel}; stat; ltp -noff; write_json {}",
        e.verilog.display(),
        json.display()
    );
    let t0 = std::time::Instant::now();
    let out = Command::new("yosys").args(["-p", &script]).output()?;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    if !out.status.success() {
        return Err(format!("yosys failed: {}", String::from_utf8_lossy(&out.stderr)).into());
    }
    let secs = t0.elapsed().as_secs_f64();
    let stat = text
        .rfind("Number of cells")
        .map_or(&text[..], |i| &text[i..]);
    let r = tandem_fpga::synth::parse_stat(stat);
    println!("{kernel} {:?}: {r:?} ({secs:.0} s of yosys)", core.params());
    for l in text
        .lines()
        .filter(|l| l.contains("Longest topological path"))
    {
        println!("yosys ltp -noff: {}", l.trim());
    }

    let netlist: Value = serde_json::from_str(&std::fs::read_to_string(&json)?)?;
    let m = &netlist["modules"][kernel.as_str()];
    // names of nets, preferring the ones the designer wrote
    let mut name_of: HashMap<u64, (bool, String)> = HashMap::new();
    if let Some(nets) = m["netnames"].as_object() {
        for (n, v) in nets {
            let hidden = v["hide_name"].as_u64() == Some(1);
            for b in v["bits"].as_array().into_iter().flatten() {
                if let Some(b) = b.as_u64() {
                    let better = name_of.get(&b).is_none_or(|(h, _)| *h && !hidden);
                    if better {
                        name_of.insert(b, (hidden, n.clone()));
                    }
                }
            }
        }
    }
    // driver of each bit: (cell, its combinational inputs)
    struct Cell {
        ty: String,
        comb_in: Vec<u64>,
        outs: Vec<u64>,
        ends: Vec<u64>,
    }
    let mut cells = Vec::new();
    let mut cell_names = Vec::new();
    for (cname, c) in m["cells"].as_object().into_iter().flatten() {
        cell_names.push(cname.clone());
        let ty = c["type"].as_str().unwrap_or("").to_string();
        let dirs = &c["port_directions"];
        let mut cell = Cell {
            ty: ty.clone(),
            comb_in: Vec::new(),
            outs: Vec::new(),
            ends: Vec::new(),
        };
        for (pin, bits) in c["connections"].as_object().into_iter().flatten() {
            let bits: Vec<u64> = bits
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_u64)
                .collect();
            let output = dirs[pin].as_str() == Some("output");
            if output {
                cell.outs.extend(bits);
            } else if is_ff(&ty) || is_bram(&ty) || (is_lutram(&ty) && !lutram_read_pin(pin)) {
                cell.ends.extend(bits);
            } else {
                cell.comb_in.extend(bits);
            }
        }
        cells.push(cell);
    }
    let mut driver: HashMap<u64, usize> = HashMap::new();
    for (i, c) in cells.iter().enumerate() {
        if !(is_ff(&c.ty) || is_bram(&c.ty)) {
            for &b in &c.outs {
                driver.insert(b, i);
            }
        }
    }
    // longest paths by memoised depth-first search (the netlist is acyclic between registers)
    fn depth(
        b: u64,
        cells: &[Cell],
        driver: &HashMap<u64, usize>,
        memo: &mut HashMap<u64, Depth>,
    ) -> Depth {
        if let Some(d) = memo.get(&b) {
            return *d;
        }
        memo.insert(b, Depth::default()); // breaks a loop, should one exist
        let d = match driver.get(&b) {
            None => Depth::default(),
            Some(&i) => {
                let c = &cells[i];
                let mut d = Depth::default();
                for &x in &c.comb_in {
                    let e = depth(x, cells, driver, memo);
                    d.cells = d.cells.max(e.cells);
                    d.luts = d.luts.max(e.luts);
                }
                d.cells += 1;
                if c.ty.starts_with("LUT") || c.ty.starts_with("MUXF") {
                    d.luts += 1;
                }
                d
            }
        };
        memo.insert(b, d);
        d
    }
    let mut memo = HashMap::new();
    let trace: Vec<String> = std::env::var("TRACE")
        .map(|t| t.split(',').map(str::to_string).collect())
        .unwrap_or_default();
    let mut traced: HashMap<String, (u32, u64, u64)> = HashMap::new();
    let mut stages: HashMap<String, (Depth, u32)> = HashMap::new();
    for c in cells.iter().filter(|c| is_ff(&c.ty)) {
        let q = c.outs.first().copied().unwrap_or(0);
        let stage = name_of
            .get(&q)
            .map_or_else(|| "?".to_string(), |(_, n)| stage_of(n));
        let mut d = Depth::default();
        for &b in &c.ends {
            let e = depth(b, &cells, &driver, &mut memo);
            d.cells = d.cells.max(e.cells);
            d.luts = d.luts.max(e.luts);
            if trace.contains(&stage) && traced.get(&stage).is_none_or(|t| e.luts > t.0) {
                traced.insert(stage.clone(), (e.luts, q, b));
            }
        }
        let s = stages.entry(stage).or_default();
        s.0.cells = s.0.cells.max(d.cells);
        s.0.luts = s.0.luts.max(d.luts);
        s.1 += 1;
    }
    // memory inputs end paths too: one row per memory, its write address, data and enable
    // together (for block RAM also the read address and enable, which the RAM registers;
    // a LUTRAM's read address is combinational and counted through its read instead)
    for (c, name) in cells.iter().zip(&cell_names) {
        if !(is_bram(&c.ty) || is_lutram(&c.ty)) {
            continue;
        }
        let mut d = Depth::default();
        for &b in &c.ends {
            let e = depth(b, &cells, &driver, &mut memo);
            d.cells = d.cells.max(e.cells);
            d.luts = d.luts.max(e.luts);
        }
        let stage = format!("{} (write)", memory_of(name));
        for &b in &c.ends {
            let l = memo.get(&b).map_or(0, |e| e.luts);
            if trace.contains(&stage) && traced.get(&stage).is_none_or(|t| l > t.0) {
                traced.insert(stage.clone(), (l, b, b));
            }
        }
        let s = stages.entry(stage).or_default();
        s.0.cells = s.0.cells.max(d.cells);
        s.0.luts = s.0.luts.max(d.luts);
        s.1 += 1;
    }
    // the kernel's output ports (m_axi, s_axi_control) end paths at the card's interconnect
    for (pname, port) in m["ports"].as_object().into_iter().flatten() {
        if port["direction"].as_str() != Some("output") {
            continue;
        }
        let mut d = Depth::default();
        for b in port["bits"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_u64)
        {
            let e = depth(b, &cells, &driver, &mut memo);
            d.cells = d.cells.max(e.cells);
            d.luts = d.luts.max(e.luts);
        }
        let stage = format!("{pname} (output)");
        for b in port["bits"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_u64)
        {
            let l = memo.get(&b).map_or(0, |e| e.luts);
            if trace.contains(&stage) && traced.get(&stage).is_none_or(|t| l > t.0) {
                traced.insert(stage.clone(), (l, b, b));
            }
        }
        let s = stages.entry(stage).or_default();
        s.0 = d;
        s.1 += 1;
    }
    let mut rows: Vec<_> = stages.into_iter().collect();
    rows.sort_by(|a, b| b.1.0.cells.cmp(&a.1.0.cells).then(a.0.cmp(&b.0)));
    println!(
        "| registers (stage) | flip-flops | cells on the deepest path into them | LUT levels |"
    );
    println!("| --- | --- | --- | --- |");
    for (s, (d, n)) in rows {
        println!("| `{s}` | {n} | {} | {} |", d.cells, d.luts);
    }
    let net = |b: u64| {
        name_of
            .get(&b)
            .map_or_else(|| format!("#{b}"), |(_, n)| n.clone())
    };
    for (stage, (luts, q, start)) in traced {
        // walk back along the deepest-in-LUTs input of each cell
        println!("deepest path into {stage} ({luts} LUT levels), register first:");
        println!("  {} <- D/CE/R {}", net(q), net(start));
        let mut b = start;
        while let Some(&i) = driver.get(&b) {
            let c = &cells[i];
            let Some(&next) = c
                .comb_in
                .iter()
                .max_by_key(|&&x| memo.get(&x).map_or(0, |d| d.luts))
            else {
                break;
            };
            println!("  [{}] <- {}", c.ty, net(next));
            b = next;
        }
    }
    if std::env::var_os("KEEP").is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    } else {
        println!("kept {}", dir.display());
    }
    Ok(())
}
