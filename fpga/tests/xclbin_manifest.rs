//! The loader-side check of an xclbin against its bitstream manifest entry
//! (`check_against_manifest`), on the committed xclbinutil-made fixture and copies of it that
//! are wrong in one way each, and the manifest `tandem fpga package` records.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use tandem_fpga::platform::{U55C, U250};
use tandem_fpga::xclbin::manifest::{check_board_platform, sha256_hex};
use tandem_fpga::xclbin::{
    BitstreamManifest, ManifestEntry, ManifestError, check_against_manifest,
};

fn fixture_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/xclbin/gemm_u55c.xclbin")
}

/// The entry `tandem fpga package` would record for the fixture.
fn entry(bytes: &[u8]) -> ManifestEntry {
    ManifestEntry {
        name: "gemm_u55c".into(),
        path: "gemm_u55c.xclbin".into(),
        platform: U55C.vbnv.into(),
        kernels: vec!["gemm".into()],
        clock_mhz: 300,
        sha256: sha256_hex(bytes),
        uuid: None,
        verilog_sha256: None,
        params: BTreeMap::new(),
    }
}

fn msg(r: Result<impl std::fmt::Debug, ManifestError>) -> String {
    match r {
        Ok(v) => panic!("accepted: {v:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn the_fixture_passes_its_entry() {
    let bytes = std::fs::read(fixture_path()).expect("fixture");
    let mut e = entry(&bytes);
    let x = check_against_manifest(&fixture_path(), &e).expect("matches");
    e.uuid = Some(x.uuid().to_string().to_uppercase());
    check_against_manifest(&fixture_path(), &e).expect("UUIDs compare without case");
    check_board_platform(&x, &fixture_path(), U55C.vbnv).expect("same VBNV");
    check_board_platform(&x, &fixture_path(), U55C.base_shell).expect("the U55C's base shell");
    let m = msg(check_board_platform(&x, &fixture_path(), U250.base_shell));
    assert!(
        m.ends_with(&format!(
            "built for platform {}, the board runs {}",
            U55C.vbnv, U250.base_shell
        )),
        "{m}"
    );
}

#[test]
fn each_mismatch_is_a_clear_error() {
    let path = fixture_path();
    let bytes = std::fs::read(&path).expect("fixture");
    let good = entry(&bytes);
    let with = |f: &dyn Fn(&mut ManifestEntry)| {
        let mut e = good.clone();
        f(&mut e);
        msg(check_against_manifest(&path, &e))
    };
    let m = with(&|e| e.sha256 = "0".repeat(64));
    assert!(
        m.contains(&format!(
            "SHA-256 is {}, the manifest entry `gemm_u55c` says {}",
            sha256_hex(&bytes),
            "0".repeat(64)
        )),
        "{m}"
    );
    let m = with(&|e| e.platform = U250.vbnv.into());
    assert!(
        m.contains(&format!(
            "built for platform {}, the manifest entry `gemm_u55c` says {}",
            U55C.vbnv, U250.vbnv
        )),
        "{m}"
    );
    let m = with(&|e| e.kernels.push("router".into()));
    assert!(
        m.contains(
            "no kernel `router` (the manifest entry `gemm_u55c` lists it; the file has: gemm)"
        ),
        "{m}"
    );
    let m = with(&|e| e.clock_mhz = 250);
    assert!(
        m.contains(
            "kernel clock (DATA_CLK) is 300 MHz, the manifest entry `gemm_u55c` says 250 MHz"
        ),
        "{m}"
    );
    let m = with(&|e| e.uuid = Some("00000000-0000-0000-0000-000000000000".into()));
    assert!(
        m.contains("UUID is ") && m.contains("says 00000000-0000"),
        "{m}"
    );
    let m = with(&|e| e.sha256 = "xyz".into());
    assert!(
        m.contains("manifest entry `gemm_u55c`: sha256 = \"xyz\" is not 64 hex digits"),
        "{m}"
    );
}

#[test]
fn truncated_corrupt_and_absent_files_fail_before_the_hash() {
    let bytes = std::fs::read(fixture_path()).expect("fixture");
    let e = entry(&bytes);
    let dir = tempfile::tempdir().expect("tempdir");
    let write = |name: &str, b: &[u8]| {
        let p = dir.path().join(name);
        std::fs::write(&p, b).expect("write");
        p
    };
    let cut = write("cut.xclbin", &bytes[..bytes.len() / 2]);
    let m = msg(check_against_manifest(&cut, &e));
    assert!(
        m.starts_with(&format!(
            "{}: corrupt m_length: the header says the file is {} bytes, it has {}: truncated",
            cut.display(),
            bytes.len(),
            bytes.len() / 2
        )),
        "{m}"
    );
    let stub = write("stub.xclbin", &bytes[..100]);
    let m = msg(check_against_manifest(&stub, &e));
    assert!(
        m.contains("truncated: axlf_header needs file bytes 0..456, only 100 are there"),
        "{m}"
    );
    let mut bad = bytes.clone();
    bad[0] = b'X';
    let m = msg(check_against_manifest(&write("bad.xclbin", &bad), &e));
    assert!(
        m.contains("not an xclbin: the file starts with \"Xclbin2\\0\""),
        "{m}"
    );
    // A flipped bit in a name keeps the structure: the hash catches it.
    let mut flipped = bytes.clone();
    let vbnv_at = 304 + 48;
    flipped[vbnv_at + 3] ^= 0x20;
    let m = msg(check_against_manifest(
        &write("flipped.xclbin", &flipped),
        &e,
    ));
    assert!(m.contains("SHA-256 is "), "{m}");
    let m = msg(check_against_manifest(
        &dir.path().join("absent.xclbin"),
        &e,
    ));
    assert!(m.contains("absent.xclbin: No such file"), "{m}");
    let m = msg(check_against_manifest(dir.path(), &e));
    assert!(m.ends_with("not a regular file"), "{m}");
}

#[test]
fn the_manifest_file_round_trips_an_entry() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("manifest.toml");
    let bytes = std::fs::read(fixture_path()).expect("fixture");
    let mut m = BitstreamManifest::load_or_empty(&path).expect("empty");
    assert!(m.entries.is_empty());
    m.upsert(entry(&bytes)).expect("upsert");
    m.write(&path).expect("write");
    let back = BitstreamManifest::load(&path).expect("load");
    let e = back
        .find("gemm", "u55c")
        .expect("found by kernel and platform key");
    std::fs::copy(fixture_path(), e.file_in(dir.path())).expect("copy");
    check_against_manifest(&e.file_in(dir.path()), e).expect("the recorded entry checks");
}

#[test]
fn package_records_what_v_plus_plus_wrote() {
    use tandem_fpga::flow::{FlowError, PackageRequest, prepare, tools::find_tool};
    let core = tandem_fpga::kernels::core_for("gemm", &[]).expect("core");
    let dir = tempfile::tempdir().expect("tempdir");
    let req = PackageRequest {
        core: core.as_ref(),
        shell: tandem_fpga::shell::ShellConfig::default(),
        platform: &U55C,
        clock_mhz: 300,
    };
    let plan = prepare(req, &dir.path().join("build")).expect("prepare");
    if find_tool("vivado").is_none() || find_tool("v++").is_none() {
        match plan.run() {
            Err(FlowError::ToolsMissing {
                missing, script, ..
            }) => {
                assert!(!missing.is_empty());
                assert_eq!(script.as_deref(), Some(plan.script.as_path()));
            }
            other => panic!("without Vivado/Vitis: {other:?}"),
        }
    } else {
        println!("SKIP (the missing-tools path): Vivado and v++ are installed here");
    }
    // Stand in for v++'s output with the xclbinutil-made fixture of the same kernel.
    std::fs::copy(fixture_path(), &plan.xclbin).expect("copy");
    let manifest = dir.path().join("bitstreams").join("manifest.toml");
    std::fs::create_dir_all(manifest.parent().expect("parent")).expect("mkdir");
    let e = plan.record(&manifest).expect("record");
    assert_eq!(e.name, "gemm_u55c");
    assert_eq!(e.path, PathBuf::from("gemm_u55c.xclbin"));
    assert_eq!((e.platform.as_str(), e.clock_mhz), (U55C.vbnv, 300));
    assert_eq!(
        e.verilog_sha256.as_deref(),
        Some(plan.emitted.manifest.verilog_sha256.as_str())
    );
    assert_eq!(e.params.len(), plan.params.len());
    let m = BitstreamManifest::load(&manifest).expect("written");
    assert_eq!(m.entries, vec![e.clone()]);
    let installed = e.file_in(manifest.parent().expect("dir"));
    check_against_manifest(&installed, &e).expect("the installed copy checks");
    // A second record replaces the entry instead of adding one.
    plan.record(&manifest).expect("again");
    assert_eq!(
        BitstreamManifest::load(&manifest)
            .expect("load")
            .entries
            .len(),
        1
    );
    // An xclbin for another platform is refused.
    let u250 = prepare(
        PackageRequest {
            platform: &U250,
            ..req
        },
        &dir.path().join("u250"),
    )
    .expect("prepare");
    std::fs::copy(fixture_path(), &u250.xclbin).expect("copy");
    let err = u250
        .record(&manifest)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        err.ends_with(&format!("built for {}, expected {}", U55C.vbnv, U250.vbnv)),
        "{err}"
    );
}
