//! One way of finding and running Verilator and the C++ compiler, and of caching what they
//! build: the card's models ([`crate::model`]) and the bare-core harness
//! ([`crate::core_sim`]) both go through a [`Toolchain`].
//!
//! A build lands in `<cache_dir>/<name>-<key>`, where the key hashes the build's inputs and
//! the Verilator version. It is made in a private folder and renamed into place, so
//! concurrent builds (threads or processes) of the same inputs cannot collide. Beside the
//! artifact the build records its SHA-256 (`<artifact>.sha256`, written before the rename);
//! the cache hands out an artifact only after checking it against that hash, so a truncated
//! or damaged library (a full disk, a killed copy) is rebuilt with a warning instead of being
//! loaded (a truncated shared library kills the process with SIGBUS on first use).
//!
//! Each build also records the hash of its inputs alone (`inputs.key`) and the Verilator that
//! made it (`verilator.version`). Where Verilator is not installed (a GPU machine the cache was
//! carried to), [`Toolchain::cached`] hands out a *prebuilt* model whose inputs match, made by
//! any supported Verilator, instead of failing; builds that are not in the cache still need
//! Verilator, and the error says so.

use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

use crate::SimError;

/// Oldest Verilator release tandem supports.
pub const MIN_VERILATOR: (u32, u32) = (5, 6);

/// Install hint shown when Verilator is missing.
pub const INSTALL_HINT: &str =
    "install Verilator >= 5.006 (Debian/Ubuntu: apt-get install verilator) and a C++ compiler";

/// The Verilator executable.
const VERILATOR: &str = "verilator";

/// Lines of a failed command's output kept in the error.
const LOG_TAIL: usize = 40;

/// How Verilator builds are made and where they are kept. The host fills it from its options
/// (`TANDEM_SIM_CACHE_DIR`, `CXX`); nothing here reads the environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Toolchain {
    /// Folder the builds are cached in.
    pub cache_dir: PathBuf,
    /// The C++ compiler: links the card's models, and is handed to Verilator's make as `CXX`.
    pub cxx: String,
}

impl Default for Toolchain {
    /// A cache in the temp folder (`tandem-sim`) and `g++`.
    fn default() -> Self {
        Self {
            cache_dir: std::env::temp_dir().join("tandem-sim"),
            cxx: "g++".into(),
        }
    }
}

impl Toolchain {
    /// A `verilator` command whose make uses this toolchain's C++ compiler.
    pub fn verilator(&self) -> Command {
        let mut c = Command::new(VERILATOR);
        c.env("CXX", &self.cxx);
        c
    }

    /// A command running the C++ compiler.
    pub fn cxx(&self) -> Command {
        Command::new(&self.cxx)
    }

    /// Verilator's install folder (its `include/` holds the runtime sources).
    pub fn verilator_root(&self) -> String {
        Command::new(VERILATOR)
            .arg("--getenv")
            .arg("VERILATOR_ROOT")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_else(|_| "/usr/share/verilator".into())
    }

    /// The cache folder of the build `name` whose inputs are `inputs` (hashed in order, then
    /// the Verilator version): if it does not hold `artifact` yet, `build` makes it in a
    /// private folder that is then renamed into place. Returns the folder.
    pub fn cached(
        &self,
        name: &str,
        inputs: &[&[u8]],
        artifact: &str,
        build: impl FnOnce(&Path) -> Result<(), SimError>,
    ) -> Result<PathBuf, SimError> {
        let inputs_key = key_of(inputs, None);
        let (maj, min) = match version() {
            Ok(v) => v,
            Err(missing) => {
                return match self.prebuilt(name, &inputs_key, artifact) {
                    Some((dir, made_by)) => {
                        tracing::info!(
                            name, dir = %dir.display(), made_by = %made_by,
                            "Verilator not installed; using the prebuilt model from the cache"
                        );
                        Ok(dir)
                    }
                    None => Err(SimError::Unavailable(format!(
                        "{missing}; and {} holds no prebuilt `{name}` model for these inputs \
                         (build it where Verilator is installed with the same cache folder, \
                         TANDEM_SIM_CACHE_DIR, and carry the folder)",
                        self.cache_dir.display()
                    ))),
                };
            }
        };
        let version_text = format!("{maj}.{min}");
        let key = key_of(inputs, Some(&version_text));
        let dir = self.cache_dir.join(format!("{name}-{key}"));
        if verify(&dir, artifact) == Cached::Good {
            if !dir.join(INPUTS_KEY).exists() {
                // A build of an older tandem: record what a prebuilt lookup needs (best effort).
                let _ = record_inputs(&dir, &inputs_key, &version_text);
            }
            return Ok(dir);
        }
        // One build at a time in this process; other processes build in their own folder.
        static BUILD: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _guard = BUILD.lock().unwrap_or_else(|e| e.into_inner());
        match verify(&dir, artifact) {
            Cached::Good => return Ok(dir),
            Cached::Absent => {}
            Cached::Bad(why) => tracing::warn!(
                "cached simulator build {}: {why}; not loading it, rebuilding",
                dir.join(artifact).display()
            ),
        }
        remove_dead_builds(&self.cache_dir, &format!(".{name}-{key}-"));
        let tmp = self
            .cache_dir
            .join(format!(".{name}-{key}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp).map_err(io(&tmp))?;
        let t0 = std::time::Instant::now();
        let task = format!("verilator:{name}");
        let what = format!("building the {name} kernel with Verilator (first use, cached after)");
        crate::card::progress(&task, "start", 0, "", t0.elapsed(), &what);
        let built = build(&tmp)
            .and_then(|()| record_hash(&tmp, artifact))
            .and_then(|()| record_inputs(&tmp, &inputs_key, &version_text));
        crate::card::progress(&task, "finish", 0, "", t0.elapsed(), &what);
        if let Err(e) = built {
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(e);
        }
        place(&tmp, &dir, artifact);
        tracing::info!(name, dir = %dir.display(), secs = t0.elapsed().as_secs_f64(), "built with Verilator");
        match verify(&dir, artifact) {
            Cached::Good => Ok(dir),
            Cached::Absent => Err(SimError::Build(format!(
                "{} missing after the build",
                dir.join(artifact).display()
            ))),
            Cached::Bad(why) => Err(SimError::Build(format!(
                "{} after the build: {why}",
                dir.join(artifact).display()
            ))),
        }
    }
}

/// The first 12 bytes of the SHA-256 of `inputs` (in order) and, if given, the Verilator
/// version, in hex: the cache key of a build.
fn key_of(inputs: &[&[u8]], version: Option<&str>) -> String {
    let mut h = Sha256::new();
    for i in inputs {
        h.update(i);
    }
    if let Some(v) = version {
        h.update(v.as_bytes());
    }
    h.finalize()
        .iter()
        .take(12)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// File of a build folder holding the hash of the build's inputs alone.
const INPUTS_KEY: &str = "inputs.key";
/// File of a build folder naming the Verilator version that made it.
const MADE_BY: &str = "verilator.version";

/// Records, in the private build folder `dir`, the inputs-only key and the Verilator version.
fn record_inputs(dir: &Path, inputs_key: &str, version: &str) -> Result<(), SimError> {
    let k = dir.join(INPUTS_KEY);
    std::fs::write(&k, inputs_key).map_err(io(&k))?;
    let v = dir.join(MADE_BY);
    std::fs::write(&v, version).map_err(io(&v))
}

impl Toolchain {
    /// A finished build `<name>-*` in the cache whose inputs hash to `inputs_key` and whose
    /// artifact checks against its recorded hash, with the Verilator version that made it.
    fn prebuilt(&self, name: &str, inputs_key: &str, artifact: &str) -> Option<(PathBuf, String)> {
        let prefix = format!("{name}-");
        let entries = std::fs::read_dir(&self.cache_dir).ok()?;
        entries.flatten().find_map(|e| {
            let dir = e.path();
            let file = e.file_name();
            let fname = file.to_string_lossy();
            let rest = fname.strip_prefix(&prefix)?;
            // `<name>-<24 hex>` only: another build whose name starts with `<name>-` differs.
            if rest.len() != 24 || !rest.bytes().all(|b| b.is_ascii_hexdigit()) {
                return None;
            }
            let key = std::fs::read_to_string(dir.join(INPUTS_KEY)).ok()?;
            if key.trim() != inputs_key || verify(&dir, artifact) != Cached::Good {
                return None;
            }
            let made_by = std::fs::read_to_string(dir.join(MADE_BY))
                .map(|v| format!("Verilator {}", v.trim()))
                .unwrap_or_else(|_| "an unknown Verilator".into());
            Some((dir, made_by))
        })
    }

    /// How many prebuilt models the cache holds (finished builds that recorded their inputs).
    pub fn prebuilt_count(&self) -> usize {
        std::fs::read_dir(&self.cache_dir)
            .map(|rd| {
                rd.flatten()
                    .filter(|e| e.path().join(INPUTS_KEY).is_file())
                    .count()
            })
            .unwrap_or(0)
    }
}

/// Removes the private build folders `<prefix><pid>` in `dir` of processes that no longer run
/// (a build killed half-way leaves its folder behind). Does nothing where `/proc` is missing.
fn remove_dead_builds(dir: &Path, prefix: &str) {
    let proc = Path::new("/proc");
    if !proc.join("self").exists() {
        return;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(prefix))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !proc.join(pid.to_string()).exists() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// What the cache holds for one build.
#[derive(Debug, PartialEq, Eq)]
enum Cached {
    /// Nothing yet.
    Absent,
    /// The artifact and its recorded hash agree.
    Good,
    /// The artifact is there but cannot be trusted: why.
    Bad(String),
}

/// The file beside `artifact` that holds its SHA-256 (lower-case hex).
fn hash_file(dir: &Path, artifact: &str) -> PathBuf {
    dir.join(format!("{artifact}.sha256"))
}

/// SHA-256 of the file at `path`, in lower-case hex.
fn sha256_of(path: &Path) -> std::io::Result<String> {
    let mut f = std::fs::File::open(path)?;
    let mut h = Sha256::new();
    std::io::copy(&mut f, &mut h)?;
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// Records the hash of the freshly built `artifact` in the private folder `dir`.
fn record_hash(dir: &Path, artifact: &str) -> Result<(), SimError> {
    let a = dir.join(artifact);
    let sum = sha256_of(&a).map_err(io(&a))?;
    let h = hash_file(dir, artifact);
    std::fs::write(&h, sum).map_err(io(&h))
}

/// Checks the cached `artifact` in `dir` against its recorded hash.
fn verify(dir: &Path, artifact: &str) -> Cached {
    let a = dir.join(artifact);
    if !a.exists() {
        return Cached::Absent;
    }
    let want = match std::fs::read_to_string(hash_file(dir, artifact)) {
        Ok(w) => w.trim().to_string(),
        Err(_) => {
            return Cached::Bad("no recorded content hash (an older or interrupted build)".into());
        }
    };
    match sha256_of(&a) {
        Ok(got) if got == want => Cached::Good,
        Ok(got) => Cached::Bad(format!(
            "content hash {got} differs from the recorded {want} (truncated or damaged)"
        )),
        Err(e) => Cached::Bad(format!("cannot be read ({e})")),
    }
}

/// Moves the finished build `tmp` to `dir`: a rename when `dir` is free; when `dir` holds a
/// build that does not verify, that one is moved aside and removed first. A good build
/// another process placed first is kept (and `tmp` removed).
fn place(tmp: &Path, dir: &Path, artifact: &str) {
    for _ in 0..3 {
        if std::fs::rename(tmp, dir).is_ok() {
            return;
        }
        if verify(dir, artifact) == Cached::Good {
            break;
        }
        // A bad build: move it aside (atomically; a process that loaded it keeps its copy)
        // and try again. Another process doing the same at once only makes one rename fail.
        let aside = dir.with_file_name(format!(
            ".{}-bad-{}",
            dir.file_name()
                .map(|n| n.to_string_lossy())
                .unwrap_or_default(),
            std::process::id()
        ));
        if std::fs::rename(dir, &aside).is_ok() {
            let _ = std::fs::remove_dir_all(&aside);
        }
    }
    let _ = std::fs::remove_dir_all(tmp);
}

/// The installed Verilator's version, or why it cannot be used (with an install hint).
pub fn version() -> Result<(u32, u32), SimError> {
    verilator_version_of(VERILATOR)
}

/// The version of the Verilator at `bin`, or why it cannot be used.
pub fn verilator_version_of(bin: &str) -> Result<(u32, u32), SimError> {
    let out = Command::new(bin)
        .arg("--version")
        .output()
        .map_err(|e| SimError::Unavailable(format!("verilator not found ({e}); {INSTALL_HINT}")))?;
    let s = String::from_utf8_lossy(&out.stdout);
    // "Verilator 5.006 2023-01-22 rev ..."
    let v = s
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.split_once('.'))
        .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)))
        .ok_or_else(|| {
            SimError::Unavailable(format!(
                "cannot read the Verilator version from `{}`",
                s.trim()
            ))
        })?;
    if v < MIN_VERILATOR {
        return Err(SimError::Unavailable(format!(
            "Verilator {}.{:03} is older than 5.006; {INSTALL_HINT}",
            v.0, v.1
        )));
    }
    Ok(v)
}

/// Runs `cmd` (`what` names it in errors); a failure keeps the tail of its error output.
pub fn run(cmd: &mut Command, what: &str) -> Result<(), SimError> {
    let out = cmd
        .output()
        .map_err(|e| SimError::Build(format!("{what}: cannot run: {e}")))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let lines: Vec<&str> = err.lines().collect();
        return Err(SimError::Build(format!(
            "{what} failed:\n{}",
            lines[lines.len().saturating_sub(LOG_TAIL)..].join("\n")
        )));
    }
    Ok(())
}

/// Parallel jobs for a build: the cores, at most `max`.
pub fn jobs(max: usize) -> usize {
    std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(max)
}

/// Maps an I/O error on `path` to a [`SimError::Io`].
pub fn io(path: &Path) -> impl FnOnce(std::io::Error) -> SimError + '_ {
    move |source| SimError::Io {
        path: path.to_path_buf(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A toolchain with its own cache; `cached` with a fake build (no Verilator needed beyond
    /// its version, which the key includes).
    fn fake_build(
        tc: &Toolchain,
        counter: &std::sync::atomic::AtomicUsize,
    ) -> Result<PathBuf, SimError> {
        tc.cached("fake", &[b"inputs"], "lib.so", |tmp| {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            std::fs::write(tmp.join("lib.so"), vec![7u8; 4096]).map_err(io(tmp))
        })
    }

    #[test]
    fn damaged_or_unhashed_builds_are_rebuilt_not_used() -> Result<(), SimError> {
        if let Err(e) = version() {
            println!("SKIP: {e}");
            return Ok(());
        }
        let cache = tempfile::tempdir().map_err(io(Path::new("tempdir")))?;
        let tc = Toolchain {
            cache_dir: cache.path().to_path_buf(),
            cxx: "g++".into(),
        };
        let builds = std::sync::atomic::AtomicUsize::new(0);
        let n = || builds.load(std::sync::atomic::Ordering::SeqCst);
        let dir = fake_build(&tc, &builds)?;
        assert_eq!(n(), 1);
        assert!(hash_file(&dir, "lib.so").exists());
        // A second use finds it.
        assert_eq!(fake_build(&tc, &builds)?, dir);
        assert_eq!(n(), 1);
        let lib = dir.join("lib.so");
        let full = std::fs::read(&lib).map_err(io(&lib))?;
        // Truncated in place.
        std::fs::write(&lib, &full[..100]).map_err(io(&lib))?;
        assert!(matches!(verify(&dir, "lib.so"), Cached::Bad(_)));
        assert_eq!(fake_build(&tc, &builds)?, dir);
        assert_eq!(n(), 2);
        assert_eq!(std::fs::read(&lib).map_err(io(&lib))?, full);
        // The hash file missing (a build of an older tandem).
        std::fs::remove_file(hash_file(&dir, "lib.so")).map_err(io(&dir))?;
        fake_build(&tc, &builds)?;
        assert_eq!(n(), 3);
        assert_eq!(verify(&dir, "lib.so"), Cached::Good);
        // A folder a killed build left behind is removed by the next build of that key.
        let mut gone = std::process::Command::new("true")
            .spawn()
            .map_err(io(&dir))?;
        let pid = gone.id();
        gone.wait().map_err(io(&dir))?;
        let key = dir
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_prefix("fake-"))
            .unwrap_or_default()
            .to_string();
        let dead = cache.path().join(format!(".fake-{key}-{pid}"));
        std::fs::create_dir(&dead).map_err(io(&dead))?;
        std::fs::write(dir.join("lib.so"), b"damaged").map_err(io(&dir))?;
        fake_build(&tc, &builds)?;
        assert_eq!(n(), 4);
        assert!(!dead.exists(), "the killed build's folder is removed");
        // Nothing but the build is left in the cache.
        let names: Vec<String> = std::fs::read_dir(cache.path())
            .map_err(io(cache.path()))?
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
        Ok(())
    }

    /// A finished build as `cached` leaves it: artifact, its hash, the inputs key, the version.
    fn place_build(tc: &Toolchain, name: &str, inputs: &[&[u8]], version: &str) -> PathBuf {
        let dir = tc
            .cache_dir
            .join(format!("{name}-{}", key_of(inputs, Some(version))));
        std::fs::create_dir_all(&dir).expect("build folder");
        std::fs::write(dir.join("lib.so"), [1u8, 2, 3]).expect("artifact");
        record_hash(&dir, "lib.so").expect("hash");
        record_inputs(&dir, &key_of(inputs, None), version).expect("inputs key");
        dir
    }

    #[test]
    fn prebuilt_models_are_found_by_their_inputs_whatever_verilator_made_them() {
        let cache = tempfile::tempdir().expect("tempdir");
        let tc = Toolchain {
            cache_dir: cache.path().to_path_buf(),
            cxx: "g++".into(),
        };
        assert_eq!(tc.prebuilt_count(), 0);
        let dir = place_build(&tc, "gemm", &[b"rtl", b"flags"], "5.6");
        // Another kernel whose name starts with the same word is not taken for it.
        place_build(&tc, "gemm-wide", &[b"rtl", b"flags"], "5.6");
        assert_eq!(tc.prebuilt_count(), 2);
        let found = tc.prebuilt("gemm", &key_of(&[b"rtl", b"flags"], None), "lib.so");
        assert_eq!(found, Some((dir.clone(), "Verilator 5.6".to_string())));
        // Other inputs (changed RTL) have no prebuilt model.
        assert_eq!(
            tc.prebuilt("gemm", &key_of(&[b"rtl2", b"flags"], None), "lib.so"),
            None
        );
        // A damaged artifact is never handed out.
        std::fs::write(dir.join("lib.so"), b"damaged").expect("damage");
        assert_eq!(
            tc.prebuilt("gemm", &key_of(&[b"rtl", b"flags"], None), "lib.so"),
            None
        );
    }

    #[test]
    fn a_missing_verilator_is_unavailable_with_a_hint() {
        let e = verilator_version_of("verilator-that-is-not-installed").expect_err("missing");
        assert!(matches!(e, SimError::Unavailable(_)));
        assert!(e.to_string().contains("apt-get install verilator"), "{e}");
    }
}
