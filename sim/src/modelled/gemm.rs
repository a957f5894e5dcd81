//! The GEMM on the modelled card: x rows, the packed W stream and the parameter words in, y
//! rows out; with `mode` (ACC_IN, PART_OUT) the int32 partials of a K split in and out.

use tandem_fpga::FpgaError;
use tandem_fpga::golden::gemm::{MAX_SHIFT, Requant, postprocess};
use tandem_fpga::kernels::gemm::{
    GemmCore, MODE_ACC_IN, MODE_PART_OUT, W_STRIPE_BYTES, unstripe_w,
};
use tandem_fpga::regmap::KernelDesc;
use tandem_fpga::timing::{self, MemTiming, WPlacement};

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
    let mode = card.scalar(desc, "mode")?;
    let (acc_in, part_out) = (mode & MODE_ACC_IN != 0, mode & MODE_PART_OUT != 0);
    // The RTL's args_ok: anything else finishes at once without touching memory.
    let l = c.lanes.max(1);
    let ok = m != 0
        && np != 0
        && np % l == 0
        && np <= c.n_max
        && kp != 0
        && kp % l == 0
        && kp <= c.k_max;
    if !ok {
        return Ok(timing::REFUSED_RUN_CYCLES);
    }
    let (m, np, kp) = (m as usize, np as usize, kp as usize);
    let lanes = l as usize;
    let (x_addr, w_addr) = (card.pointer(desc, "x")?, card.pointer(desc, "w")?);
    // `w_odd` set: the stream's stripes alternate between the two buffers (the RTL's reads)
    let w_odd = match desc.slot("w_odd") {
        Ok(_) => card.pointer(desc, "w_odd")?,
        Err(_) => 0,
    };
    let mut sc = std::mem::take(&mut card.scratch);
    let vnni = super::sums::has_vnni();
    // the old int16 path's widened operands (x, W), or the VNNI path's packed W in `sc.w`
    let mut wide = None;
    if vnni {
        // x is read in place below; W packed for vpdpbusd (no copy of an unstriped stream)
        card.view(x_addr, m * kp)?;
        let stream = |even, odd| super::sums::WStream {
            even,
            odd,
            stripe: W_STRIPE_BYTES,
            lanes,
            np,
            kp,
        };
        if w_odd == 0 {
            let w = card.view(w_addr, np * kp)?;
            super::sums::pack_stream(&mut sc.w, &stream(w, None));
        } else {
            let (ne, no) = stripe_lens(np * kp);
            card.fetch_into(w_odd, no, &mut sc.odd)?;
            let even = card.view(w_addr, ne)?;
            if W_STRIPE_BYTES.is_multiple_of(lanes) {
                super::sums::pack_stream(&mut sc.w, &stream(even, Some(&sc.odd)));
            } else {
                let whole = unstripe_w(even, &sc.odd, np * kp);
                super::sums::pack_stream(&mut sc.w, &stream(&whole, None));
            }
        }
    } else {
        // x and the unpacked W as int16 rows of `kp16` (the sums' layout), read in place
        let kp16 = super::sums::row_len(kp);
        let xw = super::sums::widen(card.view(x_addr, m * kp)?, m, kp, kp16);
        // The packed stream: for each tile of `lanes` columns and each k, one beat whose
        // byte c is w[n0 + c][k].
        let ww = if w_odd == 0 {
            super::sums::unpack_w(card.view(w_addr, np * kp)?, lanes, kp, kp16)
        } else {
            let len = np * kp;
            let (ne, no) = stripe_lens(len);
            let even = card.fetch(w_addr, ne)?;
            let odd = card.fetch(w_odd, no)?;
            super::sums::unpack_w(&unstripe_w(&even, &odd, len), lanes, kp, kp16)
        };
        wide = Some((xw, ww));
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
    if let Some((col, r)) = rq.iter().enumerate().find(|(_, r)| r.shift > MAX_SHIFT) {
        return Err(FpgaError::Device {
            device: card.name_of(),
            msg: format!("column {col}: requant shift {} > {MAX_SHIFT}", r.shift),
        });
    }
    let part_addr = if acc_in || part_out {
        card.pointer(desc, "part")?
    } else {
        0
    };
    let dims = (m, np, kp);
    match wide {
        None => {
            // x in place where its rows are whole quads, else padded into `sc.x`
            let k4 = super::sums::quad_len(kp);
            let stride = if kp == k4 {
                kp
            } else {
                let x = card.view(x_addr, m * kp)?;
                sc.x.clear();
                sc.x.resize(m * k4, 0);
                for (d, s) in sc.x.chunks_exact_mut(k4).zip(x.chunks_exact(kp)) {
                    d[..kp].copy_from_slice(s);
                }
                k4
            };
            let rs = if stride == kp {
                super::sums::row_sums(card.view(x_addr, m * kp)?, kp, m, kp)
            } else {
                super::sums::row_sums(&sc.x, stride, m, kp)
            };
            let part = if acc_in {
                Some(card.view(part_addr, m * np * 4)?)
            } else {
                None
            };
            super::sums::start_y(&mut sc.y, part, &rs, np);
            let x = if stride == kp {
                card.view(x_addr, m * kp)?
            } else {
                &sc.x
            };
            if !super::sums::sums_packed(x, stride, &sc.w, &mut sc.y, dims) {
                return Err(FpgaError::Device {
                    device: card.name_of(),
                    msg: "the VNNI sums ran on a CPU without AVX-512 VNNI".into(),
                });
            }
        }
        Some((xw, ww)) => {
            let part_in: Option<Vec<i32>> = if acc_in {
                let raw = card.view(part_addr, m * np * 4)?;
                Some(
                    raw.chunks_exact(4)
                        .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                        .collect(),
                )
            } else {
                None
            };
            sc.y = super::sums::sums_wide(&xw, &ww, part_in.as_deref(), dims);
        }
    }
    if part_out {
        let out = card.view_mut(part_addr, m * np * 4)?;
        for (o, v) in out.chunks_exact_mut(4).zip(&sc.y) {
            o.copy_from_slice(&v.to_le_bytes());
        }
    } else {
        let out = card.view_mut(card.pointer(desc, "y")?, m * np)?;
        let threads = std::thread::available_parallelism().map_or(1, |t| t.get());
        let rows = m.div_ceil(threads).max(1);
        let (bias, rq) = (&bias, &rq);
        std::thread::scope(|s| {
            for (o, y) in out.chunks_mut(rows * np).zip(sc.y.chunks(rows * np)) {
                s.spawn(move || {
                    for (orow, yrow) in o.chunks_exact_mut(np).zip(y.chunks_exact(np)) {
                        for (j, (ov, &a)) in orow.iter_mut().zip(yrow).enumerate() {
                            *ov = postprocess(a, bias[j], relu, rq[j]) as u8;
                        }
                    }
                });
            }
        });
    }
    card.scratch = sc;
    // The cycle model's shared bank: the W stream shares its bank with the writes (y, or the
    // partials of a PART_OUT pass) only when they are in one bank.
    let bank_of = |addr: u64| card.mem.locate(addr).map(|(b, _)| b);
    let w_bank = bank_of(card.pointer(desc, "w")?);
    let odd_bank = if w_odd == 0 { w_bank } else { bank_of(w_odd) };
    let mut others = vec![card.pointer(desc, "x")?, card.pointer(desc, "params")?];
    others.push(card.pointer(desc, if part_out { "part" } else { "y" })?);
    if acc_in {
        others.push(card.pointer(desc, "part")?);
    }
    let (m, np, kp) = (m as u64, np as u64, kp as u64);
    let alone = |b| others.iter().all(|&a| bank_of(a) != b);
    let placement = match card.cfg.mem.bank_bytes_per_cycle {
        // the W stream has its bank(s) to itself: the port at its own rate, W at the bank's,
        // or at two banks' when its stripes alternate between two
        Some(bank) if alone(w_bank) && alone(odd_bank) => WPlacement::OwnBank {
            port_bytes_per_cycle: card.cfg.mem.bytes_per_cycle,
            // (a stream of one stripe lies in the first buffer only)
            bank_bytes_per_cycle: if odd_bank != w_bank && np * kp > W_STRIPE_BYTES as u64 {
                2.0 * bank
            } else {
                bank
            },
        },
        _ => WPlacement::Shared,
    };
    Ok(placement.gemm_cycles(c, (m, np, kp), mode, t))
}

/// Bytes of the even and the odd stripe buffers of a `len`-byte striped W stream.
fn stripe_lens(len: usize) -> (usize, usize) {
    let sb = W_STRIPE_BYTES;
    let (full, rest) = (len / sb, len % sb);
    let even = full.div_ceil(2) * sb + if full % 2 == 0 { rest } else { 0 };
    let odd = full / 2 * sb + if full % 2 == 1 { rest } else { 0 };
    (even, odd)
}

#[cfg(test)]
mod tests {
    #[test]
    fn stripe_lengths_match_the_packing() {
        for len in [0, 1, 4095, 4096, 4097, 8192, 12288 + 5, 3 * 4096] {
            let data: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
            let (e, o) = tandem_fpga::kernels::gemm::stripe_w(&data);
            assert_eq!(super::stripe_lens(len), (e.len(), o.len()), "{len}");
            assert_eq!(tandem_fpga::kernels::gemm::unstripe_w(&e, &o, len), data);
        }
    }
}
