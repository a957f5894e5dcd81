//! The xclbin reader against files XRT's own `xclbinutil` made: the committed fixture
//! (tests/data/xclbin, compared with xclbinutil's `--info` and `--dump-section` output
//! committed beside it), files built here from the kernels' emitted kernel.xml for the U55C
//! and the U250 (skipped, with the reason, where xclbinutil does not run), the same files
//! with sections removed, and thousands of truncated and mutated copies of the fixture.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{Value, json};
use tandem_fpga::flow::link_config::{cu_name, port_banks};
use tandem_fpga::platform::{MemoryKind, Platform, U55C, U250};
use tandem_fpga::shell::ShellConfig;
use tandem_fpga::xclbin::{KernelMeta, SectionKind, Xclbin, metadata};

fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/xclbin")
}

fn fixture() -> Vec<u8> {
    std::fs::read(data_dir().join("gemm_u55c.xclbin")).expect("tests/data/xclbin/gemm_u55c.xclbin")
}

/// Whether xclbinutil runs here (Debian's libxrt-utils 2.13 installs only a wrapper script
/// whose program, /usr/bin/unwrapped/xclbinutil, is missing), else why not.
fn xclbinutil() -> Result<(), String> {
    match Command::new("xclbinutil").arg("--version").output() {
        Err(e) => Err(format!("xclbinutil is not installed ({e})")),
        Ok(o) => {
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
            if text.contains("XRT Build Version") {
                Ok(())
            } else {
                Err(format!("xclbinutil does not run: {}", text.trim()))
            }
        }
    }
}

/// Runs xclbinutil in `dir`. Its wrapper exits 0 whatever happened, so success is judged by
/// `expect` (a file it must have written).
fn run_xclbinutil(dir: &Path, args: &[&str], expect: &str) {
    let out = Command::new("xclbinutil")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("xclbinutil runs");
    assert!(
        dir.join(expect).is_file(),
        "xclbinutil {args:?} did not write {expect}:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

// ---- xclbinutil's reading of a file: --info text and --dump-section JSON ----

/// What `xclbinutil --info` reports.
#[derive(Debug, Default)]
struct Info {
    uuid: String,
    platform: String,
    sections: Vec<String>,
    /// (name, type, MHz) of the scalable clocks.
    clocks: Vec<BTreeMap<String, String>>,
    /// name, type, base address, size, used of each memory.
    memories: Vec<BTreeMap<String, String>>,
}

fn parse_info(text: &str) -> Info {
    let mut info = Info::default();
    let mut block = "";
    let mut in_sections = false;
    for line in text.lines() {
        let t = line.trim();
        if ["Scalable Clocks", "System Clocks", "Memory Configuration"].contains(&t)
            || t.starts_with("User Added")
        {
            block = match t {
                "Scalable Clocks" => "clocks",
                "Memory Configuration" => "memories",
                _ => "",
            };
            in_sections = false;
            continue;
        }
        let Some((k, v)) = t.split_once(':') else {
            if in_sections && !t.is_empty() && !t.starts_with('=') {
                info.sections.extend(
                    t.split(',')
                        .map(str::trim)
                        .filter(|s| !s.is_empty())
                        .map(String::from),
                );
            } else {
                in_sections = false;
            }
            continue;
        };
        in_sections = false;
        let (k, v) = (k.trim(), v.trim().to_string());
        match (block, k) {
            (_, "UUID (xclbin)") => info.uuid = v,
            (_, "Platform VBNV") => info.platform = v,
            (_, "Sections") => {
                in_sections = true;
                info.sections.extend(
                    v.split(',')
                        .map(str::trim)
                        .filter(|s| !s.is_empty())
                        .map(String::from),
                );
            }
            ("clocks" | "memories", _) => {
                let list = if block == "clocks" {
                    &mut info.clocks
                } else {
                    &mut info.memories
                };
                if k == "Name" {
                    list.push(BTreeMap::new());
                }
                if let Some(r) = list.last_mut() {
                    r.insert(k.to_string(), v);
                }
            }
            _ => {}
        }
    }
    info
}

fn s(v: &Value) -> &str {
    v.as_str()
        .unwrap_or_else(|| panic!("xclbinutil JSON value {v} is not a string"))
}

/// Checks everything tandem read from `x` against xclbinutil's report of the same file.
fn agree_with_xclbinutil(x: &Xclbin, info_text: &str, dumps: &BTreeMap<String, Value>) {
    let info = parse_info(info_text);
    assert_eq!(x.uuid().to_string(), info.uuid, "UUID");
    assert_eq!(x.platform(), info.platform, "platform");
    let names: Vec<String> = x.sections.iter().map(|s| s.kind.name()).collect();
    assert_eq!(names, info.sections, "sections");

    if let Some(d) = dumps.get("IP_LAYOUT") {
        let ips = x.ip_layout.as_deref().expect("IP_LAYOUT read");
        let want = d["ip_layout"]["m_ip_data"].as_array().expect("m_ip_data");
        assert_eq!(s(&d["ip_layout"]["m_count"]), ips.len().to_string());
        assert_eq!(want.len(), ips.len());
        for (ip, w) in ips.iter().zip(want) {
            assert_eq!(ip.type_name(), s(&w["m_type"]));
            assert_eq!(ip.name, s(&w["m_name"]));
            assert_eq!(format!("{:#x}", ip.base_address), s(&w["m_base_address"]));
            assert_eq!(ip.control_protocol(), s(&w["m_ip_control"]));
            assert_eq!(
                u8::from(ip.interrupt_enabled()).to_string(),
                s(&w["m_int_enable"])
            );
        }
    }
    if let Some(d) = dumps.get("CONNECTIVITY") {
        let cs = x.connectivity.as_deref().expect("CONNECTIVITY read");
        let want = d["connectivity"]["m_connection"]
            .as_array()
            .expect("m_connection");
        assert_eq!(want.len(), cs.len());
        for (c, w) in cs.iter().zip(want) {
            assert_eq!(c.arg_index.to_string(), s(&w["arg_index"]));
            assert_eq!(c.ip_layout_index.to_string(), s(&w["m_ip_layout_index"]));
            assert_eq!(c.mem_data_index.to_string(), s(&w["mem_data_index"]));
        }
    }
    if let Some(d) = dumps.get("MEM_TOPOLOGY") {
        let ms = x.mem_topology.as_deref().expect("MEM_TOPOLOGY read");
        let want = d["mem_topology"]["m_mem_data"]
            .as_array()
            .expect("m_mem_data");
        assert_eq!(want.len(), ms.len());
        for (m, w) in ms.iter().zip(want) {
            assert_eq!(m.type_name(), s(&w["m_type"]));
            assert_eq!(m.tag, s(&w["m_tag"]));
            assert_eq!(u8::from(m.used).to_string(), s(&w["m_used"]));
            assert_eq!(format!("{:#x}", m.size_kib), s(&w["m_sizeKB"]));
            assert_eq!(format!("{:#x}", m.base_address), s(&w["m_base_address"]));
        }
        assert_eq!(info.memories.len(), ms.len(), "--info memories");
        for (m, w) in ms.iter().zip(&info.memories) {
            assert_eq!(w["Name"], m.tag);
            assert_eq!(w["Type"], m.type_name());
            assert_eq!(w["Base Address"], format!("{:#x}", m.base_address));
            assert_eq!(w["Address Size"], format!("{:#x}", m.size_bytes()));
            assert_eq!(w["Bank Used"], if m.used { "Yes" } else { "No" });
        }
    }
    if let Some(d) = dumps.get("CLOCK_FREQ_TOPOLOGY") {
        let cs = x.clocks.as_deref().expect("CLOCK_FREQ_TOPOLOGY read");
        let want = d["clock_freq_topology"]["m_clock_freq"]
            .as_array()
            .expect("m_clock_freq");
        assert_eq!(want.len(), cs.len());
        for (c, w) in cs.iter().zip(want) {
            assert_eq!(c.freq_mhz.to_string(), s(&w["m_freq_Mhz"]));
            assert_eq!(c.type_name(), s(&w["m_type"]));
            assert_eq!(c.name, s(&w["m_name"]));
        }
        let scalable: Vec<_> = cs.iter().filter(|c| c.type_name() != "SYSTEM").collect();
        assert_eq!(info.clocks.len(), scalable.len(), "--info clocks");
        for (c, w) in scalable.iter().zip(&info.clocks) {
            assert_eq!(w["Name"], c.name);
            assert_eq!(w["Type"], c.type_name());
            assert_eq!(w["Frequency"], format!("{} MHz", c.freq_mhz));
        }
    }
}

const DUMPED: [&str; 4] = [
    "IP_LAYOUT",
    "MEM_TOPOLOGY",
    "CONNECTIVITY",
    "CLOCK_FREQ_TOPOLOGY",
];

#[test]
fn the_fixture_reads_as_xclbinutil_reads_it() {
    let dir = data_dir();
    let x = Xclbin::parse(&fixture()).expect("fixture parses");
    let info = std::fs::read_to_string(dir.join("gemm_u55c.info.txt")).expect("info");
    let dumps = DUMPED
        .iter()
        .map(|k| {
            let t = std::fs::read_to_string(dir.join(format!("gemm_u55c.{k}.json"))).expect("dump");
            (
                k.to_string(),
                serde_json::from_str::<Value>(&t).expect("json"),
            )
        })
        .collect();
    agree_with_xclbinutil(&x, &info, &dumps);

    // What the sections say together: gemm's buffers on HBM[0], its scalars on no bank.
    assert_eq!(x.platform(), U55C.vbnv);
    assert_eq!(x.header.version, "2.13.466");
    assert_eq!(x.kernel_clock_mhz(), Some(300));
    let k = x.kernel("gemm").expect("gemm");
    assert_eq!(k.compute_units.len(), 1);
    assert_eq!(
        (
            k.compute_units[0].name.as_str(),
            k.compute_units[0].base_address
        ),
        ("gemm_1", 0x80_0000)
    );
    let xml = std::fs::read(dir.join("gemm_kernel.xml")).expect("kernel.xml");
    let meta = metadata::parse_kernels(&xml).expect("kernel.xml parses");
    assert_eq!(
        k.args.iter().map(|a| &a.meta).collect::<Vec<_>>(),
        meta[0].args.iter().collect::<Vec<_>>()
    );
    for a in &k.args {
        let banks: Vec<&str> = a.banks.iter().map(|b| b.bank.as_str()).collect();
        let want: &[&str] = if a.meta.is_buffer() { &["HBM[0]"] } else { &[] };
        assert_eq!(banks, want, "{}", a.meta.name);
    }
    // The JSON of `tandem fpga inspect --json` carries the same.
    let j = serde_json::to_value(tandem_fpga::xclbin::Summary::of(&x)).expect("json");
    assert_eq!(j["platform"], U55C.vbnv);
    assert_eq!(j["kernels"][0]["args"][0]["banks"][0]["bank"], "HBM[0]");
    assert_eq!(j["clocks"][0]["mhz"], 300);
}

// ---- files built here with xclbinutil ----

/// The sections v++ would write for `kernel` linked with `tandem fpga package`'s
/// connectivity on `p`: one compute unit, each buffer argument on its port's bank.
fn sections_for(kernel: &KernelMeta, p: &Platform) -> [(&'static str, Value); 4] {
    let banks = port_banks(kernel, p).expect("ports fit");
    let bank_of = |port: &str| -> usize {
        let tag = &banks
            .iter()
            .find(|(q, _)| q == port)
            .expect("port has a bank")
            .1;
        (0..p.banks)
            .position(|i| &p.bank_name(i) == tag)
            .expect("bank index")
    };
    let ip = json!({"ip_layout": {"m_count": "1", "m_ip_data": [{
        "m_type": "IP_KERNEL", "m_int_enable": "1", "m_interrupt_id": "0",
        "m_ip_control": "AP_CTRL_HS", "m_base_address": "0x800000",
        "m_name": format!("{}:{}", kernel.name, cu_name(&kernel.name)),
    }]}});
    let mem_type = match p.memory {
        MemoryKind::Hbm => "MEM_DRAM",
        MemoryKind::Ddr => "MEM_DDR4",
    };
    let used: Vec<usize> = banks.iter().map(|(q, _)| bank_of(q)).collect();
    let mems: Vec<Value> = (0..p.banks)
        .map(|i| {
            json!({"m_type": mem_type, "m_used": if used.contains(&(i as usize)) {"1"} else {"0"},
                   "m_sizeKB": format!("{:#x}", p.bank_bytes / 1024),
                   "m_tag": p.bank_name(i),
                   "m_base_address": format!("{:#x}", u64::from(i) * p.bank_bytes)})
        })
        .collect();
    let mem = json!({"mem_topology": {"m_count": mems.len().to_string(), "m_mem_data": mems}});
    let conns: Vec<Value> = kernel
        .args
        .iter()
        .filter(|a| a.is_buffer())
        .map(|a| {
            json!({"arg_index": a.id.to_string(), "m_ip_layout_index": "0",
                        "mem_data_index": bank_of(&a.port).to_string()})
        })
        .collect();
    let conn = json!({"connectivity": {"m_count": conns.len().to_string(), "m_connection": conns}});
    let clk = json!({"clock_freq_topology": {"m_count": "2", "m_clock_freq": [
        {"m_freq_Mhz": "300", "m_type": "DATA", "m_name": "DATA_CLK"},
        {"m_freq_Mhz": "500", "m_type": "KERNEL", "m_name": "KERNEL_CLK"}]}});
    [
        ("IP_LAYOUT", ip),
        ("MEM_TOPOLOGY", mem),
        ("CONNECTIVITY", conn),
        ("CLOCK_FREQ_TOPOLOGY", clk),
    ]
}

/// Emits `kernel`, builds `<kernel>.xclbin` for `p` with xclbinutil in `dir`, dumps its
/// info and sections, and returns (file, emitted kernel metadata, --info text, dumps).
fn build(
    dir: &Path,
    kernel: &str,
    p: &Platform,
) -> (PathBuf, KernelMeta, String, BTreeMap<String, Value>) {
    let core = tandem_fpga::kernels::core_for(kernel, &[]).expect("core");
    let e = tandem_fpga::emit::emit(core.as_ref(), ShellConfig::default(), &dir.join("rtl"))
        .expect("emit");
    let meta = metadata::parse_kernels(&std::fs::read(&e.kernel_xml).expect("xml"))
        .expect("kernel.xml parses")
        .remove(0);
    let mut args: Vec<String> = Vec::new();
    for (name, v) in sections_for(&meta, p) {
        let f = format!("{name}.in.json");
        std::fs::write(dir.join(&f), v.to_string()).expect("write json");
        args.extend(["--add-section".into(), format!("{name}:JSON:{f}")]);
    }
    let xml = e.kernel_xml.to_string_lossy().to_string();
    args.extend([
        "--add-section".into(),
        format!("EMBEDDED_METADATA:RAW:{xml}"),
    ]);
    args.extend(["--key-value".into(), format!("SYS:PlatformVBNV:{}", p.vbnv)]);
    let out = format!("{kernel}.xclbin");
    args.extend(["--quiet".into(), "--output".into(), out.clone()]);
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    run_xclbinutil(dir, &a, &out);
    let (info, dumps) = xclbinutil_reading(dir, &out);
    (dir.join(out), meta, info, dumps)
}

/// xclbinutil's --info text and section dumps of `file` (in `dir`).
fn xclbinutil_reading(dir: &Path, file: &str) -> (String, BTreeMap<String, Value>) {
    let info = format!("{file}.info.txt");
    run_xclbinutil(dir, &["--quiet", "--input", file, "--info", &info], &info);
    let info = std::fs::read_to_string(dir.join(info)).expect("info");
    let mut dumps = BTreeMap::new();
    let x = Xclbin::read(&dir.join(file)).expect("parse");
    for k in DUMPED {
        let kind = (0..32)
            .map(SectionKind)
            .find(|s| s.name() == k)
            .expect("kind");
        if x.section(kind).is_none() {
            continue;
        }
        let f = format!("{file}.{k}.json");
        run_xclbinutil(
            dir,
            &[
                "--quiet",
                "--input",
                file,
                "--dump-section",
                &format!("{k}:JSON:{f}"),
            ],
            &f,
        );
        let t = std::fs::read_to_string(dir.join(&f)).expect("dump");
        dumps.insert(k.to_string(), serde_json::from_str(&t).expect("json"));
    }
    (info, dumps)
}

#[test]
fn files_xclbinutil_builds_for_u55c_and_u250_read_back() {
    if let Err(why) = xclbinutil() {
        println!(
            "SKIP: {why}; the committed fixture is still read (the_fixture_reads_as_xclbinutil_reads_it)"
        );
        return;
    }
    for (kernel, p) in [("gemm", &U55C), ("router", &U250), ("attention", &U55C)] {
        let dir = tempfile::tempdir().expect("tempdir");
        let (file, meta, info, dumps) = build(dir.path(), kernel, p);
        let x = Xclbin::read(&file).expect("reads");
        agree_with_xclbinutil(&x, &info, &dumps);
        assert_eq!(x.platform(), p.vbnv);
        let k = x.kernel(kernel).expect("kernel listed");
        let banks = port_banks(&meta, p).expect("banks");
        assert_eq!(k.args.len(), meta.args.len());
        for a in &k.args {
            let want: Vec<String> = if a.meta.is_buffer() {
                vec![
                    banks
                        .iter()
                        .find(|(q, _)| *q == a.meta.port)
                        .expect("port")
                        .1
                        .clone(),
                ]
            } else {
                vec![]
            };
            let got: Vec<String> = a.banks.iter().map(|b| b.bank.clone()).collect();
            assert_eq!(got, want, "{kernel} {} on {}", a.meta.name, p.key);
            assert!(a.banks.iter().all(|b| b.cu == cu_name(kernel)));
        }
        let prefix = format!("{}[", p.bank_prefix);
        assert!(
            x.mem_topology
                .as_deref()
                .unwrap_or_default()
                .iter()
                .all(|m| m.tag.starts_with(&prefix))
        );
    }
}

#[test]
fn a_removed_section_is_reported_missing() {
    if let Err(why) = xclbinutil() {
        println!("SKIP: {why}");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let (file, _, _, _) = build(dir.path(), "gemm", &U55C);
    let name = file
        .file_name()
        .and_then(|n| n.to_str())
        .expect("name")
        .to_string();
    for k in [
        "CONNECTIVITY",
        "EMBEDDED_METADATA",
        "IP_LAYOUT",
        "MEM_TOPOLOGY",
        "CLOCK_FREQ_TOPOLOGY",
    ] {
        let out = format!("no_{k}.xclbin");
        run_xclbinutil(
            dir.path(),
            &[
                "--quiet",
                "--input",
                &name,
                "--remove-section",
                k,
                "--output",
                &out,
            ],
            &out,
        );
        let x = Xclbin::read(&dir.path().join(&out)).unwrap_or_else(|e| panic!("without {k}: {e}"));
        let (info, dumps) = xclbinutil_reading(dir.path(), &out);
        agree_with_xclbinutil(&x, &info, &dumps);
        let kind = (0..32)
            .map(SectionKind)
            .find(|s| s.name() == k)
            .expect("kind");
        let e = x
            .require(kind)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            e.starts_with(&format!("the xclbin has no {k} section (it has: ")),
            "{e}"
        );
        assert!(
            !e.contains(&format!(" {k},")) && !e.ends_with(&format!("{k})")),
            "{e}"
        );
        let gemm = x.kernel("gemm").expect("gemm is still listed");
        match k {
            "CONNECTIVITY" | "MEM_TOPOLOGY" | "IP_LAYOUT" => {
                assert!(
                    gemm.args.iter().all(|a| a.banks.is_empty()),
                    "{k}: no banks without it"
                )
            }
            "EMBEDDED_METADATA" => {
                assert!(
                    x.metadata.is_none() && gemm.args.is_empty() && gemm.compute_units.len() == 1
                )
            }
            _ => assert_eq!(x.kernel_clock_mhz(), None),
        }
    }
}

// ---- corrupted, truncated and mutated bytes ----

/// Parses `b` and, when it parses, checks that what it says is consistent.
fn parse_consistent(b: &[u8]) -> Result<Xclbin, String> {
    let x = Xclbin::parse(b).map_err(|e| e.to_string())?;
    let mems = x.mem_topology.as_deref().unwrap_or_default();
    for k in &x.kernels {
        for a in &k.args {
            for bank in &a.banks {
                assert_eq!(mems[bank.mem_index].tag, bank.bank);
            }
        }
    }
    Ok(x)
}

#[test]
fn every_truncation_is_an_error_naming_what_is_cut() {
    let f = fixture();
    for n in 0..f.len() {
        let e = parse_consistent(&f[..n])
            .err()
            .unwrap_or_else(|| panic!("{n} bytes parsed"));
        let field_named = ["magic", "axlf_header", "m_length", "truncated"]
            .iter()
            .any(|w| e.contains(w));
        assert!(field_named, "{n} bytes: {e}");
    }
    assert!(parse_consistent(&f).is_ok());
}

fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// An edit of the fixture's bytes.
type Edit<'a> = Box<dyn Fn(&mut Vec<u8>) + 'a>;

#[test]
fn corrupt_fields_are_named() {
    let f = fixture();
    let x = Xclbin::parse(&f).expect("fixture");
    let off = |k: SectionKind| x.section(k).expect("section").offset as usize;
    let err = |edit: &dyn Fn(&mut Vec<u8>)| {
        let mut b = f.clone();
        edit(&mut b);
        parse_consistent(&b)
            .err()
            .unwrap_or_else(|| "parsed".into())
    };
    let cases: Vec<(&str, Edit<'_>)> = vec![
        (
            "not an xclbin: the file starts with \"xclbin1",
            Box::new(|b| b[6] = b'1'),
        ),
        (
            "corrupt m_length: the header says the file is",
            Box::new(|b| put_u64(b, 304, 1 << 40)),
        ),
        ("corrupt m_length", Box::new(|b| put_u64(b, 304, 1000))),
        (
            "corrupt m_numSections: 4294967295 is more than XRT's limit",
            Box::new(|b| put_u32(b, 448, u32::MAX)),
        ),
        (
            "corrupt m_numSections: 1000 section headers end at byte 40456, past m_length",
            Box::new(|b| put_u32(b, 448, 1000)),
        ),
        (
            "corrupt section header 0 (IP_LAYOUT): payload at offset",
            Box::new(|b| put_u64(b, 456 + 24, u64::MAX - 4)),
        ),
        (
            "corrupt IP_LAYOUT m_count: 2147483647 entries of 80 bytes do not fit",
            Box::new(move |b| put_u32(b, off(SectionKind::IP_LAYOUT), i32::MAX as u32)),
        ),
        (
            "corrupt MEM_TOPOLOGY m_count: -1 is negative",
            Box::new(move |b| put_u32(b, off(SectionKind::MEM_TOPOLOGY), u32::MAX)),
        ),
        (
            "corrupt CONNECTIVITY[2].mem_data_index: 99 but MEM_TOPOLOGY has 33 entries",
            Box::new(move |b| put_u32(b, off(SectionKind::CONNECTIVITY) + 4 + 2 * 12 + 8, 99)),
        ),
        (
            "corrupt CONNECTIVITY[0].m_ip_layout_index: 5 but IP_LAYOUT has 1 entries",
            Box::new(move |b| put_u32(b, off(SectionKind::CONNECTIVITY) + 4 + 4, 5)),
        ),
        (
            "corrupt CONNECTIVITY[1].arg_index: 42: kernel `gemm` has no argument with that id",
            Box::new(move |b| put_u32(b, off(SectionKind::CONNECTIVITY) + 4 + 12, 42)),
        ),
        (
            "EMBEDDED_METADATA: not XML",
            Box::new(move |b| b[off(SectionKind::EMBEDDED_METADATA) + 40] = b'<'),
        ),
        (
            "corrupt CLOCK_FREQ_TOPOLOGY m_count: -2 is negative",
            Box::new(move |b| {
                b[off(SectionKind::CLOCK_FREQ_TOPOLOGY)..][..2]
                    .copy_from_slice(&(-2i16).to_le_bytes())
            }),
        ),
    ];
    for (want, edit) in &cases {
        let e = err(edit.as_ref());
        assert!(e.contains(want), "want `{want}`, got `{e}`");
    }
}

#[test]
fn thousands_of_mutations_never_panic() {
    let f = fixture();
    let x = Xclbin::parse(&f).expect("fixture");
    // Where the structure is: header fields, section headers, the counts and entries.
    let mut hot: Vec<usize> = vec![0, 8, 304, 312, 448];
    hot.extend(
        (0..x.sections.len()).flat_map(|i| [456 + 40 * i, 456 + 40 * i + 24, 456 + 40 * i + 32]),
    );
    for s in &x.sections {
        hot.extend(
            (0..64)
                .map(|k| s.offset as usize + 4 * k)
                .filter(|&a| a + 8 <= f.len()),
        );
    }
    let mut rng = ChaCha8Rng::seed_from_u64(0x0c1b_1200);
    let (mut ok, mut err) = (0u32, 0u32);
    for _ in 0..20_000 {
        let mut b = f.clone();
        for _ in 0..rng.gen_range(1..4) {
            match rng.gen_range(0..6) {
                0 => {
                    let i = rng.gen_range(0..b.len());
                    b[i] ^= 1 << rng.gen_range(0..8);
                }
                1 => {
                    let i = rng.gen_range(0..b.len());
                    b[i] = rng.r#gen();
                }
                2 | 3 => {
                    let at = hot[rng.gen_range(0..hot.len())];
                    let v: u64 = match rng.gen_range(0..5) {
                        0 => 0,
                        1 => u64::MAX,
                        2 => i32::MAX as u64,
                        3 => rng.gen_range(0..2 * f.len() as u64),
                        _ => rng.r#gen(),
                    };
                    if at + 8 <= b.len() {
                        if rng.r#gen() {
                            put_u64(&mut b, at, v);
                        } else {
                            put_u32(&mut b, at, v as u32);
                        }
                    }
                }
                4 => {
                    let n = rng.gen_range(0..b.len());
                    b.truncate(n.max(1));
                }
                _ => {
                    let extra = rng.gen_range(1..64);
                    b.extend((0..extra).map(|_| rng.r#gen::<u8>()));
                }
            }
        }
        match parse_consistent(&b) {
            Ok(_) => ok += 1,
            Err(e) => {
                assert!(!e.is_empty());
                err += 1;
            }
        }
    }
    println!("20000 mutations: {ok} parsed, {err} rejected");
    assert!(
        err > 10_000,
        "most mutations of structure must be rejected ({err})"
    );
}
