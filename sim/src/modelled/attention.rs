//! Streaming attention on the modelled card: the q rows of the launch's query heads (one GQA
//! group), one K/V range in, o rows and the per-row (e, l) statistics out.

use tandem_fpga::FpgaError;
use tandem_fpga::golden::attention::{AttentionConfig, attention_skip};
use tandem_fpga::kernels::attention::AttentionCore;
use tandem_fpga::regmap::KernelDesc;
use tandem_fpga::timing::{self, MemTiming};

use super::ModelCard;

pub(super) fn run(
    card: &mut ModelCard,
    c: &AttentionCore,
    desc: &KernelDesc,
    t: &MemTiming,
) -> Result<u64, FpgaError> {
    let nq = card.scalar(desc, "nq")?;
    let nkv = card.scalar(desc, "nkv")?;
    let dp = card.scalar(desc, "d")?;
    let causal = card.scalar(desc, "causal")? & 1 == 1;
    let mult = card.scalar(desc, "score_mult")?;
    let shift = card.scalar(desc, "score_shift")?;
    let heads = card.scalar(desc, "heads")?;
    let kv_skip = card.scalar(desc, "kv_skip")?;
    let g = u64::from(heads.max(1));
    // The RTL's args_ok: anything else finishes at once without touching memory.
    let ok = nq != 0
        && nkv != 0
        && nkv <= c.nkv_max
        && dp != 0
        && dp % 8 == 0
        && dp <= c.d_max
        && mult <= 65535
        && shift <= 47
        && heads <= 1024
        && kv_skip <= 0x4000_0000
        && u64::from(nq) * g <= 0x4000_0000;
    if !ok {
        return Ok(timing::REFUSED_RUN_CYCLES);
    }
    let (nq, nkv, dp, g) = (nq as usize, nkv as usize, dp as usize, g as usize);
    let qall = card.fetch(card.pointer(desc, "q")?, g * nq * dp)?;
    let k = card.fetch(card.pointer(desc, "k")?, nkv * dp)?;
    let v = card.fetch(card.pointer(desc, "v")?, nkv * dp)?;
    let cfg = AttentionConfig {
        nq,
        nkv,
        d: dp,
        kv_tile: c.kv_tile as usize,
        causal,
        score_mult: mult as u16,
        score_shift: shift as u8,
    };
    // every head at once with AVX-512 VNNI (the same bits), else head by head
    let outs = match super::attn_fast::attention_group(&qall, &k, &v, &cfg, kv_skip as usize, g) {
        Some(outs) => outs,
        None => {
            let int8 = |b: &[u8]| -> Vec<i8> { b.iter().map(|&v| v as i8).collect() };
            let (k, v) = (int8(&k), int8(&v));
            let mut outs = Vec::with_capacity(g);
            for q in qall.chunks_exact(nq * dp) {
                outs.push(
                    attention_skip(&int8(q), &k, &v, &cfg, kv_skip as usize).map_err(|err| {
                        FpgaError::Device {
                            device: card.name_of(),
                            msg: err.to_string(),
                        }
                    })?,
                );
            }
            outs
        }
    };
    let (mut o, mut stats) = (
        Vec::with_capacity(g * nq * dp * 2),
        Vec::with_capacity(g * nq * 8),
    );
    for out in &outs {
        o.extend(out.o.iter().flat_map(|x| x.to_le_bytes()));
        stats.extend(
            out.e
                .iter()
                .zip(&out.l)
                .flat_map(|(&e, &l)| (u64::from(l) << 32 | u64::from(e as u32)).to_le_bytes()),
        );
    }
    card.store(card.pointer(desc, "o")?, &o)?;
    card.store(card.pointer(desc, "stats")?, &stats)?;
    Ok(timing::attention_group_cycles(
        c,
        nq as u64,
        nkv as u64,
        dp as u64,
        causal,
        g as u64,
        u64::from(kv_skip),
        t,
    ))
}
