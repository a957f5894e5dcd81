//! The HLS C++ vector ops (`src/vecops.cpp`) against `tandem_fpga::golden::vecops`, bit for
//! bit: random shapes of every op (odd lengths, saturation, refused arguments), the LUT include
//! files equal to the golden tables, and the csim testbench `tb/vecops_tb.cpp` over vectors the
//! golden model writes for every op, the int8 ones (silu_mul8, combine) included
//! (`TANDEM_BLESS=1` rewrites `tb/vecops_vectors.h`).

use std::fmt::Write as _;
use std::process::Command;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tandem_fpga::golden::vecops::{self as gv, LANES, VecArgs, words};

const N_MAX: usize = 512;

fn case(rng: &mut ChaCha8Rng, op: u32, big: bool) -> (VecArgs, Vec<i16>, Vec<i16>, Vec<i16>) {
    let rows = rng.gen_range(1..=5);
    let n = if op == gv::OP_ROPE {
        8 * rng.gen_range(1..=N_MAX / 8)
    } else {
        rng.gen_range(1..=N_MAX)
    };
    let np = LANES * words(n);
    let lim = if big { i16::MAX } else { 3000 };
    let mut r16 =
        |len: usize| -> Vec<i16> { (0..len).map(|_| rng.gen_range(-lim..=lim)).collect() };
    let a = gv::pad_rows(&r16(rows * n), rows, n);
    let mut args = VecArgs {
        op,
        rows,
        n,
        ..VecArgs::default()
    };
    let (mut b, mut p) = (Vec::new(), Vec::new());
    match op {
        gv::OP_RMSNORM | gv::OP_RMSNORM_RES => {
            args.shift = if big { 3 } else { 19 };
            args.c0 = 77;
            args.c1 = ((1u64 << 32) / n as u64).min(u64::from(u32::MAX)) as u32;
            p = gv::pad_rows(&r16(n), 1, n);
        }
        gv::OP_ROPE => {
            args.c0 = 3;
            p = r16(3 * np);
        }
        gv::OP_SILU_MUL => {
            args.shift = if big { 4 } else { 26 };
            args.c0 = 50_000;
            args.c1 = 17;
        }
        _ => {}
    }
    if args.reads_b() {
        b = gv::pad_rows(&r16(rows * n), rows, n);
    }
    (args, a, b, p)
}

#[test]
fn hls_vecops_matches_golden() {
    let mut rng = ChaCha8Rng::seed_from_u64(0x415);
    for i in 0..60u32 {
        let (args, a, b, p) = case(&mut rng, i % 5, i % 4 == 3);
        let want = gv::run(&args, N_MAX, &a, &b, &p).expect("golden");
        let got = tandem_hls::vecops(&args, N_MAX, &a, &b, &p).expect("hls");
        assert_eq!(got, want, "{args:?}");
    }
    let refused = VecArgs {
        op: gv::OP_ROPE,
        rows: 1,
        n: 12,
        c0: 1,
        ..VecArgs::default()
    };
    let np = LANES * words(12);
    assert!(tandem_hls::vecops(&refused, N_MAX, &vec![0; np], &[], &vec![0; np]).is_err());
}

/// The int8 ops (silu_mul8, combine) of the HLS C++ against the golden model, bit for bit.
#[test]
fn hls_int8_ops_match_golden() {
    let mut rng = ChaCha8Rng::seed_from_u64(0x418);
    for i in 0..40 {
        let rows = rng.gen_range(1..=5usize);
        let n = rng.gen_range(1..=N_MAX);
        let (args, a, b, table) = int8_inputs(&mut rng, i % 2 == 0, rows, n, 6);
        if args.op == gv::OP_SILU_MUL8 {
            let want = gv::silu_mul8(&args, N_MAX, &a, &b).expect("golden");
            assert_eq!(
                tandem_hls::silu_mul8(&args, N_MAX, &a, &b).expect("hls"),
                want,
                "{args:?}"
            );
        } else {
            let want = gv::combine(&args, N_MAX, &b, &table).expect("golden");
            assert_eq!(
                tandem_hls::combine(&args, N_MAX, &b, &table).expect("hls"),
                want,
                "{args:?}"
            );
        }
    }
    let refused = VecArgs {
        op: gv::OP_COMBINE,
        rows: N_MAX / 4 + 1,
        n: 8,
        c0: 1,
        ..VecArgs::default()
    };
    assert!(tandem_hls::combine(&refused, N_MAX, &[0; 8], &vec![0; N_MAX / 4 + 1]).is_err());
}

fn table(path: &str) -> Vec<u16> {
    std::fs::read_to_string(path)
        .expect("LUT include")
        .lines()
        .filter(|l| !l.starts_with("//"))
        .flat_map(|l| {
            l.split(',')
                .map(str::trim)
                .filter(|x| !x.is_empty())
                .map(String::from)
                .collect::<Vec<_>>()
        })
        .map(|x| x.parse().expect("LUT entry"))
        .collect()
}

#[test]
fn lut_includes_equal_the_golden_tables() {
    assert_eq!(table("src/vecops_rsqrt_lut.inc"), gv::rsqrt_lut().to_vec());
    assert_eq!(table("src/vecops_sigmoid_lut.inc"), gv::sigmoid_lut());
}

/// Cases of the int8 ops (silu_mul8, combine) in the csim vectors.
const INT8_CASES: usize = 4;

/// One int8-op case of the csim vectors, every buffer as the int16 words the testbench holds.
struct Int8Case {
    args: VecArgs,
    a: Vec<i16>,
    b: Vec<i16>,
    p: Vec<i16>,
    y: Vec<i16>,
}

/// Bytes as little-endian int16 words (a last odd byte padded with 0).
fn pack16(bytes: impl IntoIterator<Item = u8>) -> Vec<i16> {
    let v: Vec<u8> = bytes.into_iter().collect();
    v.chunks(2)
        .map(|c| i16::from_le_bytes([c[0], c.get(1).copied().unwrap_or(0)]))
        .collect()
}

/// Random arguments and inputs of silu_mul8 (`silu`: padded int8 rows `a` and `b`) or combine
/// (`b`: 1..=`yrows_max` padded int8 rows the table's entries point into; `a` empty), as the
/// golden model takes them.
fn int8_inputs(
    rng: &mut ChaCha8Rng,
    silu: bool,
    rows: usize,
    n: usize,
    yrows_max: usize,
) -> (VecArgs, Vec<i8>, Vec<i8>, Vec<u64>) {
    let r8 = |rng: &mut ChaCha8Rng, len: usize| -> Vec<i8> {
        (0..len)
            .map(|_| rng.gen_range(-128i16..=127) as i8)
            .collect()
    };
    if silu {
        let args = VecArgs {
            op: gv::OP_SILU_MUL8,
            rows,
            n,
            shift: rng.gen_range(10..=34),
            c0: rng.gen_range(1..=65535),
            c1: (rng.gen_range(1u32..=65535) << 16) | rng.gen_range(6..=20),
        };
        let a = gv::pad_rows8(&r8(rng, rows * n), rows, n);
        let b = gv::pad_rows8(&r8(rng, rows * n), rows, n);
        (args, a, b, Vec::new())
    } else {
        let k = rng.gen_range(1..=4usize);
        let yrows = rng.gen_range(1..=yrows_max);
        let args = VecArgs {
            op: gv::OP_COMBINE,
            rows,
            n,
            shift: rng.gen_range(0..=16),
            c0: k as u32,
            c1: 0,
        };
        let y8 = r8(rng, yrows * gv::LANES8 * gv::words8(n));
        let table: Vec<u64> = (0..rows * k)
            .map(|_| {
                gv::table_entry(
                    rng.gen_range(0..yrows as u32),
                    rng.gen_range(-32768i32..=32767) as i16,
                )
            })
            .collect();
        (args, Vec::new(), y8, table)
    }
}

/// A random silu_mul8 (`silu`) or combine case, small enough for the header.
fn int8_case(rng: &mut ChaCha8Rng, silu: bool) -> Int8Case {
    let rows = rng.gen_range(1..=2usize);
    let n = rng.gen_range(1..=200usize);
    let (args, a, b, table) = int8_inputs(rng, silu, rows, n, 4);
    let bytes = |v: &[i8]| v.iter().map(|&x| x as u8).collect::<Vec<u8>>();
    let y = if silu {
        pack16(bytes(
            &gv::silu_mul8(&args, N_MAX, &a, &b).expect("golden silu_mul8"),
        ))
    } else {
        gv::combine(&args, N_MAX, &b, &table).expect("golden combine")
    };
    Int8Case {
        args,
        a: pack16(bytes(&a)),
        b: pack16(bytes(&b)),
        p: pack16(table.iter().flat_map(|w| w.to_le_bytes())),
        y,
    }
}

fn array<T: std::fmt::Display>(out: &mut String, ty: &str, name: &str, v: &[T]) {
    let _ = write!(
        out,
        "alignas(8) static const {ty} {name}[{}] = {{",
        v.len().max(1)
    );
    for (i, x) in v.iter().enumerate() {
        if i % 16 == 0 {
            out.push_str("\n    ");
        }
        let _ = write!(out, "{x}, ");
    }
    if v.is_empty() {
        out.push('0');
    }
    out.push_str("\n};\n");
}

fn vectors() -> String {
    let mut rng = ChaCha8Rng::seed_from_u64(0x7b);
    let (mut all_a, mut all_b, mut all_p, mut all_y, mut all_s) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut cols: [Vec<i64>; 11] = Default::default();
    let mut max_len = 1;
    for i in 0..10u32 {
        let (mut args, a, b, p) = case(&mut rng, i % 5, i >= 5);
        args.rows = args.rows.min(2);
        let np = LANES * words(args.n);
        let (a, b) = (
            a[..args.rows * np].to_vec(),
            b[..b.len().min(args.rows * np)].to_vec(),
        );
        let out = gv::run(&args, N_MAX, &a, &b, &p).expect("golden");
        let row = [
            i64::from(args.op),
            args.rows as i64,
            args.n as i64,
            i64::from(args.shift),
            i64::from(args.c0),
            i64::from(args.c1),
            all_a.len() as i64,
            all_b.len() as i64,
            all_p.len() as i64,
            a.len() as i64,
            0,
        ];
        for (c, v) in cols.iter_mut().zip(row) {
            c.push(v);
        }
        max_len = max_len.max(a.len());
        all_y.extend_from_slice(&out.y);
        let mut s = out.s.clone();
        s.resize(a.len(), 0);
        all_s.extend_from_slice(&s);
        all_a.extend(a);
        all_b.extend(b);
        all_p.extend(p);
    }
    // The int8 ops: their int8 rows (and the combine's 64-bit table) packed little-endian
    // into the int16 arrays the testbench passes (the kernel casts them back); y's segment is
    // as long as a's, whose offset the testbench reads y's golden values at.
    for i in 0..INT8_CASES {
        let c = int8_case(&mut rng, i % 2 == 0);
        // the table is read as 64-bit words: its offset a multiple of 4 int16 (the arrays are
        // 8-byte aligned)
        while all_p.len() % 4 != 0 {
            all_p.push(0);
        }
        let len = c.a.len().max(c.y.len());
        let mut a = c.a.clone();
        a.resize(len, 0);
        let mut y = c.y.clone();
        y.resize(len, 0);
        let row = [
            i64::from(c.args.op),
            c.args.rows as i64,
            c.args.n as i64,
            i64::from(c.args.shift),
            i64::from(c.args.c0),
            i64::from(c.args.c1),
            all_a.len() as i64,
            all_b.len() as i64,
            all_p.len() as i64,
            c.y.len() as i64,
            0,
        ];
        for (col, v) in cols.iter_mut().zip(row) {
            col.push(v);
        }
        max_len = max_len.max(len);
        all_s.extend(std::iter::repeat_n(0, len));
        all_y.extend(y);
        all_a.extend(a);
        all_b.extend(c.b);
        all_p.extend(c.p);
    }
    let mut s = String::from(
        "// Generated by hls/tests/vecops.rs from fpga::golden::vecops. Do not edit.\n",
    );
    let _ = writeln!(
        s,
        "#define TB_CASES {}\n#define TB_N_MAX {N_MAX}\n#define TB_MAX_LEN {max_len}",
        10 + INT8_CASES
    );
    for (name, ty, c) in [
        ("tb_op", "int", 0),
        ("tb_rows", "int", 1),
        ("tb_n", "int", 2),
        ("tb_shift", "int", 3),
        ("tb_c0", "uint32_t", 4),
        ("tb_c1", "uint32_t", 5),
        ("tb_a_off", "int", 6),
        ("tb_b_off", "int", 7),
        ("tb_p_off", "int", 8),
        ("tb_len", "int", 9),
    ] {
        array(&mut s, ty, name, &cols[c]);
    }
    array(&mut s, "int16_t", "tb_a", &all_a);
    array(&mut s, "int16_t", "tb_b", &all_b);
    array(&mut s, "int16_t", "tb_p", &all_p);
    array(&mut s, "int16_t", "tb_y", &all_y);
    array(&mut s, "int16_t", "tb_s", &all_s);
    s
}

#[test]
#[allow(clippy::disallowed_methods)] // TANDEM_BLESS rewrites the vectors; CXX picks the compiler
fn csim_vecops_testbench() {
    let text = vectors();
    let path = "tb/vecops_vectors.h";
    if std::env::var_os("TANDEM_BLESS").is_some() {
        std::fs::write(path, &text).expect("write vectors");
    }
    let on_disk = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        on_disk == text,
        "{path} is stale: rerun with TANDEM_BLESS=1"
    );
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let dir = std::env::temp_dir().join(format!("tandem-hls-csim-{}-vecops", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let exe = dir.join("vecops_tb");
    let Ok(built) = Command::new(&cxx)
        .args([
            "-std=c++14",
            "-O1",
            "-Wno-unknown-pragmas",
            "-Isrc",
            "-Itb",
            "-o",
        ])
        .arg(&exe)
        .args(["tb/vecops_tb.cpp", "src/vecops.cpp"])
        .output()
    else {
        println!("skipped: no C++ compiler (c++ or $CXX) found");
        return;
    };
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let run = Command::new(&exe).output().expect("run testbench");
    let _ = std::fs::remove_dir_all(&dir);
    let out = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "vecops_tb failed:\n{out}");
    let want = format!("0 mismatches over {} cases", 10 + INT8_CASES);
    assert!(out.contains(&want), "{out}");
}
