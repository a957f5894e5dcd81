//! Vitis HLS C++ sources of tandem's FPGA kernels and their C-simulation harness.
//!
//! The C++ in `src/*.cpp` is real Vitis HLS (m_axi / s_axilite interfaces, PIPELINE,
//! ARRAY_PARTITION, DATAFLOW; `tcl/*.tcl` run csim, csynth and export an `.xo` for the U55C).
//! It uses plain integer types only, so `build.rs` compiles it with the host g++ and this crate
//! calls its `extern "C"` top functions, the way `csim_design` runs a testbench. The tests check
//! the results bit for bit against [`tandem_fpga::golden`].

use tandem_fpga::golden::attention::{AttentionConfig, AttentionOut};
use tandem_fpga::golden::gemm::{GemmDims, Requant};
use tandem_fpga::golden::router::{self as grouter, RouterOut};
use thiserror::Error;

mod ffi {
    unsafe extern "C" {
        pub fn gemm_kernel(
            x: *const i8,
            w: *const i8,
            bias: *const i32,
            mult: *const u16,
            shift: *const u8,
            y: *mut i8,
            m: i32,
            n: i32,
            k: i32,
            relu: i32,
        ) -> i32;
        pub fn gemm_kernel_pass(
            x: *const i8,
            w: *const i8,
            bias: *const i32,
            mult: *const u16,
            shift: *const u8,
            y: *mut i8,
            part: *mut i32,
            m: i32,
            n: i32,
            k: i32,
            relu: i32,
            mode: i32,
        ) -> i32;
        pub fn gemm_kernel_pass_wide(
            x: *const i8,
            w: *const i8,
            bias: *const i32,
            mult: *const u16,
            shift: *const u8,
            y: *mut i8,
            part: *mut i32,
            m: i32,
            n: i32,
            k: i32,
            relu: i32,
            mode: i32,
        ) -> i32;
        pub fn attention_kernel(
            q: *const i8,
            k: *const i8,
            v: *const i8,
            o: *mut i16,
            e_out: *mut i32,
            l_out: *mut u32,
            nq: i32,
            nkv: i32,
            d: i32,
            causal: i32,
            score_mult: i32,
            score_shift: i32,
        ) -> i32;
        pub fn attention_kernel_group(
            q: *const i8,
            k: *const i8,
            v: *const i8,
            o: *mut i16,
            e_out: *mut i32,
            l_out: *mut u32,
            nq: i32,
            nkv: i32,
            d: i32,
            causal: i32,
            score_mult: i32,
            score_shift: i32,
            heads: i32,
            kv_skip: i32,
        ) -> i32;
        pub fn router_kernel_lanes(
            logits: *const i16,
            routes: *mut u32,
            hist: *mut u32,
            tokens: i32,
            experts: i32,
            top_k: i32,
            renormalize: i32,
            lanes: i32,
        ) -> i32;
        pub fn vecops_kernel(
            a: *const i16,
            b: *const i16,
            p: *const i16,
            y: *mut i16,
            s: *mut i16,
            op: i32,
            rows: i32,
            n: i32,
            shift: i32,
            c0: u32,
            c1: u32,
            n_max: i32,
        ) -> i32;
        pub fn attention_kv_tile() -> i32;
        pub fn gemm_max_k() -> i32;
    }
}

/// Errors of the HLS C entry points.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum HlsError {
    /// A buffer does not match the dimensions.
    #[error("hls {kernel}: {what} has {got} elements, expected {expected}")]
    Length {
        /// Kernel name.
        kernel: &'static str,
        /// Argument.
        what: &'static str,
        /// Its length.
        got: usize,
        /// Expected length.
        expected: usize,
    },
    /// The C kernel refused the dimensions.
    #[error("hls {kernel}: dimensions out of the kernel's range ({dims})")]
    Range {
        /// Kernel name.
        kernel: &'static str,
        /// The dimensions given.
        dims: String,
    },
}

fn check(
    kernel: &'static str,
    what: &'static str,
    got: usize,
    expected: usize,
) -> Result<(), HlsError> {
    if got == expected {
        Ok(())
    } else {
        Err(HlsError::Length {
            kernel,
            what,
            got,
            expected,
        })
    }
}

fn dim(kernel: &'static str, v: usize, dims: &str) -> Result<i32, HlsError> {
    i32::try_from(v).map_err(|_| HlsError::Range {
        kernel,
        dims: dims.to_string(),
    })
}

/// The KV tile the HLS attention is compiled with (`ATT_KV_TILE`).
pub fn attention_kv_tile() -> usize {
    // SAFETY: a pure function of the C library without arguments.
    usize::try_from(unsafe { ffi::attention_kv_tile() }).unwrap_or(0)
}

/// The largest K the HLS GEMM holds on chip (`GEMM_MAX_K`).
pub fn gemm_max_k() -> usize {
    // SAFETY: a pure function of the C library without arguments.
    usize::try_from(unsafe { ffi::gemm_max_k() }).unwrap_or(0)
}

/// Runs the HLS GEMM (`gemm_kernel`) on the host: same arguments as
/// [`tandem_fpga::golden::gemm::gemm`].
pub fn gemm(
    x: &[i8],
    w: &[i8],
    bias: &[i32],
    rq: &[Requant],
    relu: bool,
    d: GemmDims,
) -> Result<Vec<i8>, HlsError> {
    let k = "gemm";
    check(k, "x", x.len(), d.m * d.k)?;
    check(k, "w", w.len(), d.n * d.k)?;
    check(k, "bias", bias.len(), d.n)?;
    check(k, "requant", rq.len(), d.n)?;
    let dims = format!("{d:?}");
    let (m, n, kk) = (
        dim(k, d.m, &dims)?,
        dim(k, d.n, &dims)?,
        dim(k, d.k, &dims)?,
    );
    let mult: Vec<u16> = rq.iter().map(|r| r.mult).collect();
    let shift: Vec<u8> = rq.iter().map(|r| r.shift).collect();
    let mut y = vec![0i8; d.m * d.n];
    // SAFETY: every pointer covers the length the dimensions imply (checked above) and the C
    // function reads and writes only within those bounds.
    let rc = unsafe {
        ffi::gemm_kernel(
            x.as_ptr(),
            w.as_ptr(),
            bias.as_ptr(),
            mult.as_ptr(),
            shift.as_ptr(),
            y.as_mut_ptr(),
            m,
            n,
            kk,
            i32::from(relu),
        )
    };
    if rc != 0 {
        return Err(HlsError::Range { kernel: k, dims });
    }
    Ok(y)
}

/// Runs the HLS GEMM for any K, as passes of at most [`gemm_max_k`] (`gemm_kernel_pass`: the
/// int32 partials of the earlier passes kept in one buffer, bias, ReLU and requantisation on
/// the last pass); same arguments and result as [`tandem_fpga::golden::gemm::gemm`].
pub fn gemm_split(
    x: &[i8],
    w: &[i8],
    bias: &[i32],
    rq: &[Requant],
    relu: bool,
    d: GemmDims,
    k_max: usize,
) -> Result<Vec<i8>, HlsError> {
    gemm_split_lanes(8, x, w, bias, rq, relu, d, k_max)
}

/// Lanes (output columns per tile) of the HLS GEMM's wide build, `gemm_kernel_pass_wide`:
/// the int8 of one 512-bit beat (`GEMM_TN_WIDE`).
pub const GEMM_LANES_WIDE: usize = 64;

/// [`gemm_split`] on the HLS GEMM with `lanes` output columns per tile: 8
/// (`gemm_kernel_pass`, the 64-bit build) or [`GEMM_LANES_WIDE`] (`gemm_kernel_pass_wide`,
/// the 512-bit build); other counts are refused.
#[allow(clippy::too_many_arguments)]
pub fn gemm_split_lanes(
    lanes: usize,
    x: &[i8],
    w: &[i8],
    bias: &[i32],
    rq: &[Requant],
    relu: bool,
    d: GemmDims,
    k_max: usize,
) -> Result<Vec<i8>, HlsError> {
    let kn = "gemm";
    let pass = match lanes {
        8 => ffi::gemm_kernel_pass,
        GEMM_LANES_WIDE => ffi::gemm_kernel_pass_wide,
        _ => {
            return Err(HlsError::Range {
                kernel: kn,
                dims: format!("lanes {lanes} (built: 8 and {GEMM_LANES_WIDE})"),
            });
        }
    };
    check(kn, "x", x.len(), d.m * d.k)?;
    check(kn, "w", w.len(), d.n * d.k)?;
    check(kn, "bias", bias.len(), d.n)?;
    check(kn, "requant", rq.len(), d.n)?;
    let dims = format!("{d:?} in passes of {k_max}");
    let (m, n) = (dim(kn, d.m, &dims)?, dim(kn, d.n, &dims)?);
    let mult: Vec<u16> = rq.iter().map(|r| r.mult).collect();
    let shift: Vec<u8> = rq.iter().map(|r| r.shift).collect();
    let mut y = vec![0i8; d.m * d.n];
    let mut part = vec![0i32; d.m * d.n];
    let passes = tandem_fpga::golden::gemm::k_passes(d.k, k_max);
    for (i, r) in passes.iter().enumerate() {
        let xs = tandem_fpga::golden::gemm::k_slice(x, d.k, r.clone());
        let ws = tandem_fpga::golden::gemm::k_slice(w, d.k, r.clone());
        let kk = dim(kn, r.len(), &dims)?;
        let mode = i32::from(i > 0) | if i + 1 < passes.len() { 2 } else { 0 };
        // SAFETY: x, w are [m][kk] and [n][kk], bias/mult/shift [n], y and part [m][n]; the C
        // function reads and writes only within those bounds.
        let rc = unsafe {
            pass(
                xs.as_ptr(),
                ws.as_ptr(),
                bias.as_ptr(),
                mult.as_ptr(),
                shift.as_ptr(),
                y.as_mut_ptr(),
                part.as_mut_ptr(),
                m,
                n,
                kk,
                i32::from(relu),
                mode,
            )
        };
        if rc != 0 {
            return Err(HlsError::Range { kernel: kn, dims });
        }
    }
    Ok(y)
}

/// Runs the HLS attention for the query heads of one GQA group in one call
/// (`attention_kernel_group`: `q` holds `heads` planes `[Nq, D]` one after another) over a
/// K/V range whose sequence has `kv_skip` more keys after it; returns one output per head.
pub fn attention_group(
    q: &[i8],
    k: &[i8],
    v: &[i8],
    cfg: &AttentionConfig,
    heads: usize,
    kv_skip: usize,
) -> Result<Vec<AttentionOut>, HlsError> {
    let kn = "attention";
    let g = heads.max(1);
    check(kn, "q", q.len(), g * cfg.nq * cfg.d)?;
    check(kn, "k", k.len(), cfg.nkv * cfg.d)?;
    check(kn, "v", v.len(), cfg.nkv * cfg.d)?;
    let dims = format!("{cfg:?} heads {heads} kv_skip {kv_skip}");
    let (nq, nkv, d, hh, skip) = (
        dim(kn, cfg.nq, &dims)?,
        dim(kn, cfg.nkv, &dims)?,
        dim(kn, cfg.d, &dims)?,
        dim(kn, heads, &dims)?,
        dim(kn, kv_skip, &dims)?,
    );
    let rows = g * cfg.nq;
    let mut o = vec![0i16; rows * cfg.d];
    let mut e = vec![0i32; rows];
    let mut l = vec![0u32; rows];
    // SAFETY: q holds heads x nq rows of d, k and v nkv rows of d, the outputs heads x nq rows
    // (checked above and allocated here); the C function stays within them.
    let rc = unsafe {
        ffi::attention_kernel_group(
            q.as_ptr(),
            k.as_ptr(),
            v.as_ptr(),
            o.as_mut_ptr(),
            e.as_mut_ptr(),
            l.as_mut_ptr(),
            nq,
            nkv,
            d,
            i32::from(cfg.causal),
            i32::from(cfg.score_mult),
            i32::from(cfg.score_shift),
            hh,
            skip,
        )
    };
    if rc != 0 {
        return Err(HlsError::Range { kernel: kn, dims });
    }
    let per = cfg.nq * cfg.d;
    Ok((0..g)
        .map(|h| AttentionOut {
            o: o[h * per..(h + 1) * per].to_vec(),
            e: e[h * cfg.nq..(h + 1) * cfg.nq].to_vec(),
            l: l[h * cfg.nq..(h + 1) * cfg.nq].to_vec(),
        })
        .collect())
}

/// Runs the HLS attention (`attention_kernel`) on the host. `cfg.kv_tile` is ignored: the C++
/// is compiled with [`attention_kv_tile`].
pub fn attention(
    q: &[i8],
    k: &[i8],
    v: &[i8],
    cfg: &AttentionConfig,
) -> Result<AttentionOut, HlsError> {
    let kn = "attention";
    check(kn, "q", q.len(), cfg.nq * cfg.d)?;
    check(kn, "k", k.len(), cfg.nkv * cfg.d)?;
    check(kn, "v", v.len(), cfg.nkv * cfg.d)?;
    let dims = format!("{cfg:?}");
    let (nq, nkv, d) = (
        dim(kn, cfg.nq, &dims)?,
        dim(kn, cfg.nkv, &dims)?,
        dim(kn, cfg.d, &dims)?,
    );
    let mut out = AttentionOut {
        o: vec![0; cfg.nq * cfg.d],
        e: vec![0; cfg.nq],
        l: vec![0; cfg.nq],
    };
    // SAFETY: q, k, v and the outputs cover the lengths the dimensions imply (checked above and
    // allocated here); the C function stays within them.
    let rc = unsafe {
        ffi::attention_kernel(
            q.as_ptr(),
            k.as_ptr(),
            v.as_ptr(),
            out.o.as_mut_ptr(),
            out.e.as_mut_ptr(),
            out.l.as_mut_ptr(),
            nq,
            nkv,
            d,
            i32::from(cfg.causal),
            i32::from(cfg.score_mult),
            i32::from(cfg.score_shift),
        )
    };
    if rc != 0 {
        return Err(HlsError::Range { kernel: kn, dims });
    }
    Ok(out)
}

/// Runs the HLS router on the host (4 lanes, renormalised over the k chosen): `logits` int16
/// `[tokens, experts]` row-major and unpadded, as [`tandem_fpga::golden::router::route`]
/// takes them.
pub fn router(
    logits: &[i16],
    tokens: usize,
    experts: usize,
    k: usize,
) -> Result<RouterOut, HlsError> {
    router_with(logits, tokens, experts, k, true, 4)
}

/// Runs the HLS router (`router_kernel_lanes`) with `lanes` (1, 2, 4 or 8) logits per cycle;
/// with `renormalize = false` the weights are the softmax over all experts
/// ([`tandem_fpga::golden::router::route_with`]).
pub fn router_with(
    logits: &[i16],
    tokens: usize,
    experts: usize,
    k: usize,
    renormalize: bool,
    lanes: usize,
) -> Result<RouterOut, HlsError> {
    let kn = "router";
    check(kn, "logits", logits.len(), tokens * experts)?;
    let dims = format!("tokens {tokens}, experts {experts}, k {k}, lanes {lanes}");
    let (t, e, kk, nl) = (
        dim(kn, tokens, &dims)?,
        dim(kn, experts, &dims)?,
        dim(kn, k, &dims)?,
        dim(kn, lanes, &dims)?,
    );
    let epad = grouter::logit_row_words(experts) * 4;
    let kpad = grouter::route_row_words(k) * 2;
    let hpad = grouter::hist_words(experts) * 2;
    let mut padded = vec![0i16; tokens * epad];
    for (dst, src) in padded
        .chunks_exact_mut(epad.max(1))
        .zip(logits.chunks_exact(experts.max(1)))
    {
        dst[..experts].copy_from_slice(src);
    }
    let mut routes = vec![0u32; tokens * kpad];
    let mut hist = vec![0u32; hpad];
    // SAFETY: `padded`, `routes` and `hist` have the padded sizes the C kernel indexes (rows of
    // ceil(E/4)*4, ceil(k/2)*2 and ceil(E/2)*2 entries); it writes nothing else.
    let rc = unsafe {
        ffi::router_kernel_lanes(
            padded.as_ptr(),
            routes.as_mut_ptr(),
            hist.as_mut_ptr(),
            t,
            e,
            kk,
            i32::from(renormalize),
            nl,
        )
    };
    if rc != 0 {
        return Err(HlsError::Range { kernel: kn, dims });
    }
    let bytes: Vec<u8> = routes.iter().flat_map(|v| v.to_le_bytes()).collect();
    let (ids, weights) = grouter::unpack_routes(&bytes, tokens, k);
    let hbytes: Vec<u8> = hist.iter().flat_map(|v| v.to_le_bytes()).collect();
    Ok(RouterOut {
        ids,
        weights,
        hist: grouter::unpack_hist(&hbytes, experts),
    })
}

/// Runs the HLS vector ops (`vecops_kernel`) on the host: same arguments as
/// [`tandem_fpga::golden::vecops::run`] (padded rows).
pub fn vecops(
    args: &tandem_fpga::golden::vecops::VecArgs,
    n_max: usize,
    a: &[i16],
    b: &[i16],
    p: &[i16],
) -> Result<tandem_fpga::golden::vecops::VecOut, HlsError> {
    use tandem_fpga::golden::vecops::{LANES, VecOut, words};
    let k = "vecops";
    let np = LANES * words(args.n);
    check(k, "a", a.len(), args.rows * np)?;
    if args.reads_b() {
        check(k, "b", b.len(), args.rows * np)?;
    }
    check(k, "p", p.len(), args.p_rows() * np)?;
    let dims = format!("{args:?}");
    let (rows, n, nm) = (
        dim(k, args.rows, &dims)?,
        dim(k, args.n, &dims)?,
        dim(k, n_max, &dims)?,
    );
    let shift = i32::try_from(args.shift).map_err(|_| HlsError::Range {
        kernel: k,
        dims: dims.clone(),
    })?;
    let mut y = vec![0i16; a.len()];
    let mut s = vec![0i16; if args.writes_s() { a.len() } else { 0 }];
    let bp = if b.is_empty() {
        std::ptr::null()
    } else {
        b.as_ptr()
    };
    let pp = if p.is_empty() {
        std::ptr::null()
    } else {
        p.as_ptr()
    };
    let sp = if s.is_empty() {
        std::ptr::null_mut()
    } else {
        s.as_mut_ptr()
    };
    // SAFETY: every buffer has the length the arguments imply (checked above); the kernel
    // reads b only for ops that take it, p only for its rows, and writes s only for op 2.
    let rc = unsafe {
        ffi::vecops_kernel(
            a.as_ptr(),
            bp,
            pp,
            y.as_mut_ptr(),
            sp,
            args.op as i32,
            rows,
            n,
            shift,
            args.c0,
            args.c1,
            nm,
        )
    };
    if rc != 0 {
        return Err(HlsError::Range { kernel: k, dims });
    }
    Ok(VecOut { y, s })
}

/// Runs the HLS `silu_mul8` (op 5 of `vecops_kernel`) on the host: same arguments as
/// [`tandem_fpga::golden::vecops::silu_mul8`] (padded int8 rows).
pub fn silu_mul8(
    args: &tandem_fpga::golden::vecops::VecArgs,
    n_max: usize,
    a: &[i8],
    b: &[i8],
) -> Result<Vec<i8>, HlsError> {
    use tandem_fpga::golden::vecops::{LANES8, words8};
    let k = "vecops";
    let len = args.rows * LANES8 * words8(args.n);
    check(k, "a", a.len(), len)?;
    check(k, "b", b.len(), len)?;
    let dims = format!("{args:?}");
    let (rows, n, nm) = (
        dim(k, args.rows, &dims)?,
        dim(k, args.n, &dims)?,
        dim(k, n_max, &dims)?,
    );
    let shift = i32::try_from(args.shift).map_err(|_| HlsError::Range {
        kernel: k,
        dims: dims.clone(),
    })?;
    // (at least 2 bytes: the port is int16_t*)
    let mut y = vec![0i8; len.max(2)];
    // SAFETY: a, b and y hold `len` bytes, what op 5 reads and writes; p and s are unused.
    let rc = unsafe {
        ffi::vecops_kernel(
            a.as_ptr().cast(),
            b.as_ptr().cast(),
            std::ptr::null(),
            y.as_mut_ptr().cast(),
            std::ptr::null_mut(),
            args.op as i32,
            rows,
            n,
            shift,
            args.c0,
            args.c1,
            nm,
        )
    };
    if rc != 0 {
        return Err(HlsError::Range { kernel: k, dims });
    }
    y.truncate(len);
    Ok(y)
}

/// Runs the HLS `combine` (op 6 of `vecops_kernel`) on the host: same arguments as
/// [`tandem_fpga::golden::vecops::combine`] (padded int8 rows `b`, the table).
pub fn combine(
    args: &tandem_fpga::golden::vecops::VecArgs,
    n_max: usize,
    b: &[i8],
    table: &[u64],
) -> Result<Vec<i16>, HlsError> {
    use tandem_fpga::golden::vecops::{LANES, LANES8, words, words8};
    let k = "vecops";
    check(k, "p", table.len(), args.table_len())?;
    let np8 = LANES8 * words8(args.n);
    let dims = format!("{args:?}");
    if table
        .iter()
        .any(|&e| ((e & 0xffff_ffff) as usize + 1) * np8 > b.len())
    {
        return Err(HlsError::Range { kernel: k, dims });
    }
    let (rows, n, nm) = (
        dim(k, args.rows, &dims)?,
        dim(k, args.n, &dims)?,
        dim(k, n_max, &dims)?,
    );
    let shift = i32::try_from(args.shift).map_err(|_| HlsError::Range {
        kernel: k,
        dims: dims.clone(),
    })?;
    let mut y = vec![0i16; args.rows * LANES * words(args.n)];
    // SAFETY: every table row lies inside b (checked above), the table has rows * c0 entries,
    // y holds the rows op 6 writes; a and s are unused.
    let rc = unsafe {
        ffi::vecops_kernel(
            std::ptr::null(),
            b.as_ptr().cast(),
            table.as_ptr().cast(),
            y.as_mut_ptr(),
            std::ptr::null_mut(),
            args.op as i32,
            rows,
            n,
            shift,
            args.c0,
            args.c1,
            nm,
        )
    };
    if rc != 0 {
        return Err(HlsError::Range { kernel: k, dims });
    }
    Ok(y)
}
