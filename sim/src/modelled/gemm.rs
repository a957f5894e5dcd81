//! The GEMM on the modelled card: x rows, the packed W stream and the parameter words in, y
//! rows out.

use tandem_fpga::FpgaError;
use tandem_fpga::golden::gemm::{GemmDims, Requant, gemm};
use tandem_fpga::kernels::gemm::GemmCore;
use tandem_fpga::regmap::KernelDesc;
use tandem_fpga::timing::{self, MemTiming};

use super::ModelCard;

pub(super) fn run(
    card: &mut ModelCard,
    c: &GemmCore,
    desc: &KernelDesc,
    t: &MemTiming,
) -> Result<u64, FpgaError> {
    let m = card.scalar(desc, "m")?;
    let np = card.scalar(desc, "n")?;
    let kp = card.scalar(desc, "k")?;
    let relu = card.scalar(desc, "relu")? & 1 == 1;
    // The RTL's args_ok: anything else finishes at once without touching memory.
    let ok = m != 0
        && np != 0
        && np % 8 == 0
        && np <= c.n_max
        && kp != 0
        && kp % 8 == 0
        && kp <= c.k_max;
    if !ok {
        return Ok(timing::REFUSED_RUN_CYCLES);
    }
    let (m, np, kp) = (m as usize, np as usize, kp as usize);
    let x: Vec<i8> = card
        .fetch(card.pointer(desc, "x")?, m * kp)?
        .into_iter()
        .map(|b| b as i8)
        .collect();
    // The packed stream: for each tile of 8 columns and each k, one word whose byte c is
    // w[n0 + c][k].
    let packed = card.fetch(card.pointer(desc, "w")?, np / 8 * kp * 8)?;
    let mut w = vec![0i8; np * kp];
    for (i, word) in packed.chunks_exact(8).enumerate() {
        let (tile, kk) = (i / kp, i % kp);
        for (cc, &b) in word.iter().enumerate() {
            w[(tile * 8 + cc) * kp + kk] = b as i8;
        }
    }
    let params = card.fetch(card.pointer(desc, "params")?, np * 8)?;
    let (mut bias, mut rq) = (Vec::with_capacity(np), Vec::with_capacity(np));
    for p in params.chunks_exact(8) {
        let v = u64::from_le_bytes([p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7]]);
        bias.push(v as u32 as i32);
        rq.push(Requant {
            mult: (v >> 32) as u16,
            shift: ((v >> 48) & 63) as u8,
        });
    }
    let d = GemmDims { m, n: np, k: kp };
    let y = gemm(&x, &w, &bias, &rq, relu, d).map_err(|err| FpgaError::Device {
        device: card.name_of(),
        msg: err.to_string(),
    })?;
    let bytes: Vec<u8> = y.iter().map(|&v| v as u8).collect();
    card.store(card.pointer(desc, "y")?, &bytes)?;
    Ok(timing::gemm_cycles(c, m as u64, np as u64, kp as u64, t))
}
