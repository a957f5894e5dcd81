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

/// `v` into `out` as little-endian int16.
fn put(out: &mut [u8], v: &[i16]) {
    for (o, x) in out.chunks_exact_mut(2).zip(v) {
        o.copy_from_slice(&x.to_le_bytes());
    }
}

/// Rows per thread for `rows` rows: whole periods of `period` rows (rope's table), so that
/// each chunk's rows see the rows of the table the whole run's would.
fn chunk_rows(rows: usize, period: usize) -> usize {
    let threads = std::thread::available_parallelism().map_or(1, |t| t.get());
    let period = period.max(1);
    rows.div_ceil(threads).div_ceil(period).max(1) * period
}

/// `f` over chunks of `chunk` rows (of `a_row` elements of `a` and `b`, `b` empty where the
/// op reads none) on threads, the outputs in row order; the first error wins.
fn over_rows<T: Send, A: Sync, E: Send>(
    a: &[A],
    b: &[A],
    (rows, chunk, a_row): (usize, usize, usize),
    f: impl Fn(usize, &[A], &[A]) -> Result<T, E> + Sync,
) -> Result<Vec<T>, E> {
    let f = &f;
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..rows)
            .step_by(chunk.max(1))
            .map(|r0| {
                let r1 = (r0 + chunk).min(rows);
                let ac = &a[r0 * a_row..r1 * a_row];
                let bc = if b.is_empty() {
                    b
                } else {
                    &b[r0 * a_row..r1 * a_row]
                };
                s.spawn(move || f(r1 - r0, ac, bc))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| match h.join() {
                Ok(r) => r,
                Err(p) => std::panic::resume_unwind(p),
            })
            .collect()
    })
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
    let np = LANES * words(args.n);
    let a = elems(card.view(card.pointer(desc, "a")?, args.rows * np * 2)?);
    let b = if args.reads_b() {
        elems(card.view(card.pointer(desc, "b")?, args.rows * np * 2)?)
    } else {
        Vec::new()
    };
    let p = elems(card.view(card.pointer(desc, "p")?, args.p_rows() * np * 2)?);
    // rows are independent (rope's row r reads table row r mod c0): chunks of rows over
    // threads, each run by the golden model
    let period = if args.op == vecops::OP_ROPE {
        args.c0 as usize
    } else {
        1
    };
    let n_max = c.n_max as usize;
    let outs = over_rows(
        &a,
        &b,
        (args.rows, chunk_rows(args.rows, period), np),
        |rows, ac, bc| vecops::run(&VecArgs { rows, ..args }, n_max, ac, bc, &p),
    )
    .map_err(|e| dev_err(card, e))?;
    let y = card.view_mut(card.pointer(desc, "y")?, args.rows * np * 2)?;
    let mut at = 0;
    for o in &outs {
        put(&mut y[at..at + o.y.len() * 2], &o.y);
        at += o.y.len() * 2;
    }
    if args.writes_s() {
        let s = card.view_mut(card.pointer(desc, "s")?, args.rows * np * 2)?;
        let mut at = 0;
        for o in &outs {
            put(&mut s[at..at + o.s.len() * 2], &o.s);
            at += o.s.len() * 2;
        }
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
    let np8 = vecops::LANES8 * vecops::words8(args.n);
    let len = args.rows * np8;
    let i8s = |b: &[u8]| -> Vec<i8> { b.iter().map(|&v| v as i8).collect() };
    let a = i8s(card.view(card.pointer(desc, "a")?, len)?);
    let b = i8s(card.view(card.pointer(desc, "b")?, len)?);
    let n_max = c.n_max as usize;
    let outs = over_rows(
        &a,
        &b,
        (args.rows, chunk_rows(args.rows, 1), np8),
        |rows, ac, bc| vecops::silu_mul8(&VecArgs { rows, ..*args }, n_max, ac, bc),
    )
    .map_err(|e| dev_err(card, e))?;
    let y = card.view_mut(card.pointer(desc, "y")?, len)?;
    for (o, v) in y.iter_mut().zip(outs.iter().flatten()) {
        *o = *v as u8;
    }
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
        rows.extend(card.view(addr, np8)?.iter().map(|&v| v as i8));
        compact.push((e & !0xffff_ffff) | i as u64);
    }
    let y =
        vecops::combine(args, c.n_max as usize, &rows, &compact).map_err(|e| dev_err(card, e))?;
    put(card.view_mut(card.pointer(desc, "y")?, y.len() * 2)?, &y);
    Ok(timing::vecops_cycles(c, args, t))
}
