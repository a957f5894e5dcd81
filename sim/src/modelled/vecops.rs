//! The vecops kernel on the modelled card: int16 rows in (`a`, `b`, `p`), `y` (and `s`) out.

use tandem_fpga::FpgaError;
use tandem_fpga::golden::vecops::{self, LANES, VecArgs, words};
use tandem_fpga::kernels::vecops::VecopsCore;
use tandem_fpga::regmap::KernelDesc;
use tandem_fpga::timing::{self, MemTiming};

use super::ModelCard;

fn elems(b: &[u8]) -> Vec<i16> {
    b.chunks_exact(2)
        .map(|c| i16::from_le_bytes([c[0], c[1]]))
        .collect()
}

fn bytes(v: &[i16]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub(super) fn run(
    card: &mut ModelCard,
    c: &VecopsCore,
    desc: &KernelDesc,
    t: &MemTiming,
) -> Result<u64, FpgaError> {
    let args = VecArgs {
        op: card.scalar(desc, "op")?,
        rows: card.scalar(desc, "rows")? as usize,
        n: card.scalar(desc, "n")? as usize,
        shift: card.scalar(desc, "shift")?,
        c0: card.scalar(desc, "c0")?,
        c1: card.scalar(desc, "c1")?,
    };
    // The RTL's args_ok: anything else finishes at once without touching memory.
    if !args.valid(c.n_max as usize) {
        return Ok(timing::REFUSED_RUN_CYCLES);
    }
    match args.op {
        vecops::OP_SILU_MUL8 => return silu_mul8(card, c, desc, t, &args),
        vecops::OP_COMBINE => return combine(card, c, desc, t, &args),
        _ => {}
    }
    let row = LANES * words(args.n) * 2;
    let a = elems(&card.fetch(card.pointer(desc, "a")?, args.rows * row)?);
    let b = if args.reads_b() {
        elems(&card.fetch(card.pointer(desc, "b")?, args.rows * row)?)
    } else {
        Vec::new()
    };
    let p = elems(&card.fetch(card.pointer(desc, "p")?, args.p_rows() * row)?);
    let out = vecops::run(&args, c.n_max as usize, &a, &b, &p).map_err(|e| FpgaError::Device {
        device: card.name_of(),
        msg: e.to_string(),
    })?;
    card.store(card.pointer(desc, "y")?, &bytes(&out.y))?;
    if args.writes_s() {
        card.store(card.pointer(desc, "s")?, &bytes(&out.s))?;
    }
    Ok(timing::vecops_cycles(c, &args, t))
}

fn dev_err(card: &ModelCard, e: vecops::VecError) -> FpgaError {
    FpgaError::Device {
        device: card.name_of(),
        msg: e.to_string(),
    }
}

/// Op 5: int8 rows `a`, `b` in, int8 rows `y` out.
fn silu_mul8(
    card: &mut ModelCard,
    c: &VecopsCore,
    desc: &KernelDesc,
    t: &MemTiming,
    args: &VecArgs,
) -> Result<u64, FpgaError> {
    let len = args.rows * vecops::LANES8 * vecops::words8(args.n);
    let i8s = |b: Vec<u8>| -> Vec<i8> { b.into_iter().map(|v| v as i8).collect() };
    let a = i8s(card.fetch(card.pointer(desc, "a")?, len)?);
    let b = i8s(card.fetch(card.pointer(desc, "b")?, len)?);
    let y = vecops::silu_mul8(args, c.n_max as usize, &a, &b).map_err(|e| dev_err(card, e))?;
    let out: Vec<u8> = y.iter().map(|&v| v as u8).collect();
    card.store(card.pointer(desc, "y")?, &out)?;
    Ok(timing::vecops_cycles(c, args, t))
}

/// Op 6: the table in `p`, the int8 rows it names gathered from `b`, int16 rows `y` out.
fn combine(
    card: &mut ModelCard,
    c: &VecopsCore,
    desc: &KernelDesc,
    t: &MemTiming,
    args: &VecArgs,
) -> Result<u64, FpgaError> {
    let tb = card.fetch(card.pointer(desc, "p")?, args.table_len() * 8)?;
    let table: Vec<u64> = tb
        .chunks_exact(8)
        .map(|w| u64::from_le_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]))
        .collect();
    let np8 = vecops::LANES8 * vecops::words8(args.n);
    // only the rows the table names are read; gather them into a compact matrix
    let base = card.pointer(desc, "b")?;
    let mut rows = Vec::with_capacity(table.len() * np8);
    let mut compact = Vec::with_capacity(table.len());
    for (i, &e) in table.iter().enumerate() {
        let row = e & 0xffff_ffff;
        let addr = base
            .checked_add(row * np8 as u64)
            .ok_or_else(|| FpgaError::Device {
                device: card.name_of(),
                msg: format!("combine: table row {row} lies past the address space"),
            })?;
        let bytes = card.fetch(addr, np8)?;
        rows.extend(bytes.into_iter().map(|v| v as i8));
        compact.push((e & !0xffff_ffff) | i as u64);
    }
    let y =
        vecops::combine(args, c.n_max as usize, &rows, &compact).map_err(|e| dev_err(card, e))?;
    card.store(card.pointer(desc, "y")?, &bytes(&y))?;
    Ok(timing::vecops_cycles(c, args, t))
}
