//! The router on the modelled card: int16 logit rows in, routes and histogram out.

use tandem_fpga::FpgaError;
use tandem_fpga::golden::router::{hist_beats, logit_row_beats, pack_routes_w, route_with};
use tandem_fpga::kernels::router::RouterCore;
use tandem_fpga::regmap::KernelDesc;
use tandem_fpga::timing::{self, MemTiming};

use super::ModelCard;

pub(super) fn run(
    card: &mut ModelCard,
    c: &RouterCore,
    desc: &KernelDesc,
    t: &MemTiming,
) -> Result<u64, FpgaError> {
    let tokens = card.scalar(desc, "tokens")? as usize;
    let experts = card.scalar(desc, "experts")?;
    let k = card.scalar(desc, "top_k")?;
    let renormalize = card.scalar(desc, "renormalize")?;
    // The RTL's args_ok: anything else finishes at once without touching memory.
    if experts == 0 || experts > c.e_max || k == 0 || k > c.k_max || k > experts || renormalize > 1
    {
        return Ok(timing::REFUSED_RUN_CYCLES);
    }
    let (e, k) = (experts as usize, k as usize);
    // the build's memory layouts: rows and outputs in words of its data port
    let bits = c.data_bits;
    let beat = bits as usize / 8;
    let row = logit_row_beats(e, bits) * beat;
    let bytes = card.fetch(card.pointer(desc, "logits")?, tokens * row)?;
    let logits: Vec<i16> = bytes
        .chunks_exact(row)
        .flat_map(|r| {
            r.chunks_exact(2)
                .take(e)
                .map(|b| i16::from_le_bytes([b[0], b[1]]))
        })
        .collect();
    let out =
        route_with(&logits, tokens, e, k, renormalize == 1).map_err(|err| FpgaError::Device {
            device: card.name_of(),
            msg: err.to_string(),
        })?;
    let routes = pack_routes_w(&out, tokens, k, bits);
    card.store(card.pointer(desc, "routes")?, &routes)?;
    let mut hist = vec![0u8; hist_beats(e, bits) * beat];
    for (i, h) in out.hist.iter().enumerate() {
        hist[4 * i..4 * i + 4].copy_from_slice(&h.to_le_bytes());
    }
    card.store(card.pointer(desc, "hist")?, &hist)?;
    Ok(timing::router_cycles_with(
        c,
        tokens as u64,
        e as u64,
        k as u64,
        renormalize == 1,
        t,
    ))
}
