//! Files and caches under faults, through the `tandem` binary: a corrupt op-time history, an
//! out-of-range setting, a damaged cached simulator library, concurrent saves and history
//! updates, a full disk, an unwritable output path and a save killed half-way.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output, Stdio};

mod support;

use support::{TestResult, text};

fn command(args: &[&str], env: &[(&str, &str)]) -> Command {
    support::command(args, "warn", env)
}

fn tandem(args: &[&str], env: &[(&str, &str)]) -> Output {
    command(args, env)
        .output()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", support::bin().display()))
}

/// A reference input file of the tests crate.
fn reference(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/data/reference")
        .join(name)
        .display()
        .to_string()
}

/// The names in `dir` that are tandem's temporary files.
fn temps(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|r| {
            r.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(tandem::files::TEMP_SUFFIX) || n.ends_with(".partial"))
                .collect()
        })
        .unwrap_or_default()
}

fn path_str(p: &Path) -> Result<&str, Box<dyn std::error::Error>> {
    p.to_str()
        .ok_or_else(|| format!("{} is not UTF-8", p.display()).into())
}

/// `tandem op attention` on a reference file on the CPU, saving to `save`.
fn op_attention(save: &Path, causal: bool) -> Result<Command, Box<dyn std::error::Error>> {
    let input = reference("attention_2.safetensors");
    let mut args = vec![
        "op",
        "attention",
        "--backend",
        "cpu",
        "--inputs",
        &input,
        "--save",
        path_str(save)?,
    ];
    if causal {
        args.push("--causal");
    }
    let mut c = command(&args, &[]);
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    Ok(c)
}

/// The history file of a cache folder, as JSON.
fn history_json(cache: &Path) -> Result<serde_json::Value, Box<dyn std::error::Error>> {
    let text = std::fs::read_to_string(cache.join("tandem/history.json"))?;
    Ok(serde_json::from_str(&text)?)
}

/// The samples of every key of a history file.
fn samples(h: &serde_json::Value) -> Vec<u64> {
    h["entries"]
        .as_object()
        .map(|m| m.values().filter_map(|s| s["n"].as_u64()).collect())
        .unwrap_or_default()
}

/// `tandem op attention` with the history kept in `cache`.
fn op_with_history(cache: &Path) -> Result<Output, Box<dyn std::error::Error>> {
    let input = reference("attention_2.safetensors");
    let mut c = command(
        &["op", "attention", "--backend", "cpu", "--inputs", &input],
        &[("XDG_CACHE_HOME", path_str(cache)?)],
    );
    c.env_remove("TANDEM_HISTORY");
    Ok(c.output()?)
}

#[test]
fn a_corrupt_history_is_cleaned_or_set_aside_and_the_run_succeeds() -> TestResult {
    let cache = tempfile::tempdir()?;
    let file = cache.path().join("tandem/history.json");
    // A first run writes the file; its keys are the ones the planner looks up.
    let o = op_with_history(cache.path())?;
    assert!(o.status.success(), "{}", text(&o).1);
    let good = history_json(cache.path())?;
    assert_eq!(samples(&good), vec![1]);
    // Every entry's mean made unusable: each is dropped with a warning, the run goes on and
    // records a fresh sample.
    for bad in ["1e300", "1.5e19", "-1"] {
        let mut h = good.clone();
        for s in h["entries"].as_object_mut().ok_or("entries")?.values_mut() {
            s["mean_s"] = serde_json::from_str(bad)?;
        }
        std::fs::write(&file, serde_json::to_string(&h)?)?;
        let o = op_with_history(cache.path())?;
        let (_, err) = text(&o);
        assert!(o.status.success(), "mean_s {bad}: {err}");
        assert!(!err.contains("panicked"), "{err}");
        assert!(
            err.contains("entry dropped") && err.contains("mean_s"),
            "{bad}: {err}"
        );
        let after = history_json(cache.path())?;
        assert_eq!(
            samples(&after),
            vec![1],
            "{bad}: only the new sample is kept"
        );
    }
    // Files that are not a history of this version: set aside, the run goes on.
    let old_format = {
        let mut h = good.clone();
        h.as_object_mut().ok_or("object")?.remove("version");
        serde_json::to_string(&h)?.replace(r#""mean_s":"#, r#""mean_s":1e300,"x":"#)
    };
    for (what, content) in [
        ("garbage", "\u{0}\u{1}not json at all".to_string()),
        (
            "NaN",
            r#"{"version": 2, "entries": {"k": {"n": 1, "mean_s": NaN}}}"#.into(),
        ),
        ("truncated", serde_json::to_string(&good)?[..20].to_string()),
        ("unversioned", old_format),
    ] {
        for e in std::fs::read_dir(cache.path().join("tandem"))?.flatten() {
            if e.file_name().to_string_lossy().contains(".bad-") {
                std::fs::remove_file(e.path())?;
            }
        }
        std::fs::write(&file, &content)?;
        let o = op_with_history(cache.path())?;
        let (_, err) = text(&o);
        assert!(o.status.success(), "{what}: {err}");
        assert!(err.contains("set aside"), "{what}: {err}");
        let aside: Vec<_> = std::fs::read_dir(cache.path().join("tandem"))?
            .flatten()
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with("history.json.bad-")
            })
            .collect();
        assert_eq!(aside.len(), 1, "{what}");
        assert_eq!(
            std::fs::read_to_string(aside[0].path())?,
            content,
            "{what}: kept as it was"
        );
        assert_eq!(samples(&history_json(cache.path())?), vec![1], "{what}");
    }
    Ok(())
}

#[test]
fn an_fpga_clock_out_of_range_is_a_clear_error() {
    for bad in ["1e-300", "0", "5000", "NaN"] {
        let o = tandem(
            &[
                "run",
                "--backend",
                "cpu",
                "--seq-len",
                "8",
                "--d-model",
                "64",
            ],
            &[("TANDEM_FPGA_CLOCK_MHZ", bad)],
        );
        let (_, err) = text(&o);
        assert_eq!(o.status.code(), Some(1), "{bad}: {err}");
        assert!(err.contains("TANDEM_FPGA_CLOCK_MHZ"), "{err}");
        assert!(err.contains(bad), "{err}");
        assert!(err.contains("from 1 to 1000"), "{err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    let o = tandem(
        &[
            "fpga",
            "sim",
            "--kernel",
            "router",
            "--bytes-per-cycle",
            "0",
        ],
        &[],
    );
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("--bytes-per-cycle") && err.contains("from 0.01 to 64"),
        "{err}"
    );
}

/// Whether Verilator runs here (prints the reason to skip if not).
fn have_verilator() -> bool {
    match tandem_sim::verilator::version() {
        Ok(_) => true,
        Err(e) => {
            println!("SKIP: {e}");
            false
        }
    }
}

#[test]
fn a_truncated_cached_simulator_library_is_rebuilt_not_loaded() -> TestResult {
    if !have_verilator() {
        return Ok(());
    }
    let cache = tempfile::tempdir()?;
    let env = [("TANDEM_SIM_CACHE", path_str(cache.path())?)];
    let args = [
        "fpga",
        "sim",
        "--kernel",
        "router",
        "--tokens",
        "16",
        "--experts",
        "8",
        "--top-k",
        "2",
    ];
    let o = tandem(&args, &env);
    assert!(o.status.success(), "{}", text(&o).1);
    let lib = std::fs::read_dir(cache.path())?
        .flatten()
        .map(|e| e.path().join("libtsim.so"))
        .find(|p| p.exists())
        .ok_or("no libtsim.so in the cache")?;
    let full = std::fs::metadata(&lib)?.len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&lib)?
        .set_len(4096)?;
    let o = tandem(&args, &env);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.contains("bit-exact"), "{out}");
    assert!(
        err.contains("rebuilding") && err.contains("libtsim.so"),
        "{err}"
    );
    assert_eq!(std::fs::metadata(&lib)?.len(), full, "rebuilt in place");
    // The next run uses it without a word.
    let o = tandem(&args, &env);
    assert!(o.status.success());
    assert!(!text(&o).1.contains("rebuilding"), "{}", text(&o).1);
    Ok(())
}

#[test]
fn concurrent_saves_to_one_path_leave_one_complete_output() -> TestResult {
    let dir = tempfile::tempdir()?;
    // What each kind of run writes on its own.
    let mut want = Vec::new();
    for causal in [false, true] {
        let p = dir.path().join(format!("alone-{causal}.safetensors"));
        let o = op_attention(&p, causal)?.output()?;
        assert!(o.status.success(), "{}", text(&o).1);
        want.push(std::fs::read(&p)?);
    }
    assert_ne!(want[0], want[1]);
    let shared = dir.path().join("shared.safetensors");
    for round in 0..2 {
        let children = (0..8)
            .map(|i| {
                op_attention(&shared, i % 2 == 1)?
                    .spawn()
                    .map_err(Into::into)
            })
            .collect::<Result<Vec<_>, Box<dyn std::error::Error>>>()?;
        for c in children {
            let o = c.wait_with_output()?;
            assert!(o.status.success(), "{}", text(&o).1);
        }
        let got = std::fs::read(&shared)?;
        assert!(
            got == want[0] || got == want[1],
            "round {round}: the file is not one run's output ({} bytes)",
            got.len()
        );
        assert!(temps(dir.path()).is_empty(), "{:?}", temps(dir.path()));
    }
    Ok(())
}

#[test]
fn concurrent_runs_keep_every_history_sample() -> TestResult {
    let cache = tempfile::tempdir()?;
    let input = reference("attention_2.safetensors");
    let runs = 8;
    let children = (0..runs)
        .map(|_| {
            let mut c = command(
                &["op", "attention", "--backend", "cpu", "--inputs", &input],
                &[("XDG_CACHE_HOME", path_str(cache.path())?)],
            );
            c.env_remove("TANDEM_HISTORY")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            Ok(c.spawn()?)
        })
        .collect::<Result<Vec<_>, Box<dyn std::error::Error>>>()?;
    for c in children {
        let o = c.wait_with_output()?;
        let (_, err) = text(&o);
        assert!(o.status.success(), "{err}");
        assert!(!err.contains("history"), "{err}");
    }
    assert_eq!(samples(&history_json(cache.path())?), vec![runs]);
    assert!(temps(&cache.path().join("tandem")).is_empty());
    Ok(())
}

/// A 64 KiB tmpfs mounted for the test (root only), unmounted when dropped.
struct SmallDisk {
    dir: tempfile::TempDir,
}

impl SmallDisk {
    fn mount() -> Option<Self> {
        let dir = tempfile::tempdir().ok()?;
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=64k", "tmpfs"])
            .arg(dir.path())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        ok.then_some(Self { dir })
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path()).status();
    }
}

/// A safetensors file with rmsnorm inputs `x` [rows, 256] and `w` [256].
fn rmsnorm_input(path: &Path, rows: usize) -> TestResult {
    let d = 256;
    let x = ndarray::ArrayD::from_shape_fn(ndarray::IxDyn(&[rows, d]), |i| {
        ((i[0] * 7 + i[1] * 13) % 97) as f32 / 97.0 - 0.5
    });
    let w = ndarray::ArrayD::from_elem(ndarray::IxDyn(&[d]), 1.0f32);
    let mut t = BTreeMap::new();
    t.insert(
        "x".to_string(),
        tandem::Tensor::new(tandem::tensor::HostData::F32(x)),
    );
    t.insert(
        "w".to_string(),
        tandem::Tensor::new(tandem::tensor::HostData::F32(w)),
    );
    tandem::io::write_safetensors(path, &t)?;
    Ok(())
}

#[test]
fn a_full_disk_is_a_clear_error_and_leaves_no_temp() -> TestResult {
    let Some(disk) = SmallDisk::mount() else {
        println!("SKIP: cannot mount a small tmpfs here (not root?)");
        return Ok(());
    };
    let work = tempfile::tempdir()?;
    let input = work.path().join("in.safetensors");
    rmsnorm_input(&input, 256)?; // a 256 KiB output
    let save = disk.dir.path().join("out.safetensors");
    let o = tandem(
        &[
            "op",
            "rmsnorm",
            "--backend",
            "cpu",
            "--inputs",
            path_str(&input)?,
            "--save",
            path_str(&save)?,
        ],
        &[],
    );
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("out.safetensors") && err.contains("No space left"),
        "{err}"
    );
    assert!(!save.exists());
    assert!(
        temps(disk.dir.path()).is_empty(),
        "{:?}",
        temps(disk.dir.path())
    );
    // A trace onto a disk with no room left.
    let filler = disk.dir.path().join("filler");
    let _ = std::fs::write(&filler, vec![0u8; 64 * 1024]);
    let trace = disk.dir.path().join("t.json");
    let o = tandem(
        &[
            "run",
            "--backend",
            "cpu",
            "--seq-len",
            "8",
            "--d-model",
            "64",
            "--ffn",
            "32",
            "--trace",
            path_str(&trace)?,
        ],
        &[],
    );
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("t.json") && err.contains("No space left"),
        "{err}"
    );
    assert!(!trace.exists(), "no 0-byte trace");
    assert!(
        temps(disk.dir.path()).is_empty(),
        "{:?}",
        temps(disk.dir.path())
    );
    Ok(())
}

#[test]
fn an_unwritable_output_path_is_refused_before_the_run() -> TestResult {
    let dir = tempfile::tempdir()?;
    let input = reference("attention_2.safetensors");
    let missing = dir.path().join("no/such/folder/out.safetensors");
    let file = dir.path().join("plain");
    std::fs::write(&file, b"")?;
    let under_file = file.join("out.safetensors");
    for (flag, path, says) in [
        ("--save", missing.as_path(), "no/such/folder"),
        ("--save", dir.path(), "is a folder"),
        ("--save", under_file.as_path(), "not a folder"),
    ] {
        let o = tandem(
            &[
                "op",
                "attention",
                "--backend",
                "cpu",
                "--inputs",
                &input,
                flag,
                path_str(path)?,
            ],
            &[],
        );
        let (out, err) = text(&o);
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert!(err.contains(says), "{says}: {err}");
        assert!(!out.contains("attention"), "refused before the run: {out}");
    }
    let o = tandem(
        &[
            "run",
            "--backend",
            "cpu",
            "--seq-len",
            "8",
            "--d-model",
            "64",
            "--trace",
            path_str(&missing)?,
        ],
        &[],
    );
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("no/such/folder"), "{err}");
    assert!(!out.contains("q_proj"), "refused before the run: {out}");
    Ok(())
}

#[test]
fn a_save_killed_half_way_leaves_no_partial_file_and_the_next_run_cleans_up() -> TestResult {
    let work = tempfile::tempdir()?;
    let input = work.path().join("in.safetensors");
    rmsnorm_input(&input, 64 * 1024)?; // a 64 MiB output
    let out_dir = work.path().join("out");
    std::fs::create_dir(&out_dir)?;
    let save = out_dir.join("big.safetensors");
    let args = [
        "op",
        "rmsnorm",
        "--backend",
        "cpu",
        "--inputs",
        path_str(&input)?,
        "--save",
        path_str(&save)?,
    ];
    // Kill the run as soon as its temporary file has data in it (or when it ends by itself;
    // the empty probe `check_writable` makes before the run does not count).
    let mut child = command(&args, &[])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let mut killed_mid_write = false;
    loop {
        let writing = temps(&out_dir)
            .iter()
            .any(|t| std::fs::metadata(out_dir.join(t)).is_ok_and(|m| m.len() > 0));
        if writing {
            child.kill()?;
            killed_mid_write = true;
            break;
        }
        if child.try_wait()?.is_some() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
    child.wait()?;
    println!(
        "killed while writing: {killed_mid_write}; temps left: {:?}",
        temps(&out_dir)
    );
    // Whatever is at the final path is a complete file.
    if save.exists() {
        tandem::io::read_safetensors(&save)?;
    }
    // A leftover of a process that is gone (the kill above may have left one; this one
    // surely is there).
    let mut gone = Command::new("true").spawn()?;
    let pid = gone.id();
    gone.wait()?;
    let planted = out_dir.join(format!(
        ".big.safetensors.{pid}-0-0000abcd{}",
        tandem::files::TEMP_SUFFIX
    ));
    std::fs::write(&planted, b"half a file")?;
    let o = tandem(&args, &[]);
    assert!(o.status.success(), "{}", text(&o).1);
    tandem::io::read_safetensors(&save)?;
    assert!(temps(&out_dir).is_empty(), "left: {:?}", temps(&out_dir));
    Ok(())
}
