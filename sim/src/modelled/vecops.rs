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
