//! Writing files so that no reader ever sees half of one: every file tandem writes (saved
//! outputs, traces, the op-time history) goes through [`write_atomic`].
//!
//! A write goes to a temporary file of a name unique to the process and the call
//! (`.<name>.<pid>-<n>-<random>.tandem-tmp`, in the target's folder, so the rename cannot cross
//! file systems), is flushed to disk, then renamed over the target: a reader sees the old file
//! or the new one. The temporary file is removed on every error path (a guard removes it when
//! the write unwinds or returns early). Only a killed process leaves one behind; the next write
//! to the same target removes such leftovers ([`remove_stale_temps`]). [`check_writable`]
//! checks an output path before a run, so a bad path is found before the work, not after it.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::error::{Error, Result};

/// The suffix of every temporary file tandem writes.
pub const TEMP_SUFFIX: &str = ".tandem-tmp";

/// A leftover temporary file this old is removed even when the process that named it seems to
/// run (its pid may have been reused).
pub const STALE_AFTER: Duration = Duration::from_secs(30 * 60);

/// A temporary name in `dir` for writing the file `name`, unique to this process and call.
fn temp_path(dir: &Path, name: &str) -> PathBuf {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let n = SEQ.fetch_add(1, Ordering::Relaxed);
    let r: u32 = rand::random();
    dir.join(format!(
        ".{name}.{}-{n}-{r:08x}{TEMP_SUFFIX}",
        std::process::id()
    ))
}

/// Removes the file it names when dropped, unless [`TempFile::keep`] was called.
struct TempFile {
    path: PathBuf,
    armed: bool,
}

impl TempFile {
    fn keep(mut self) {
        self.armed = false;
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if self.armed {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// The folder and file name of `path` (the folder is `.` for a bare file name).
fn split(path: &Path) -> Result<(PathBuf, String)> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .ok_or_else(|| Error::file(path, "is not a file path (it has no file name)"))?;
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    Ok((dir, name))
}

/// Writes `bytes` to `path` atomically (see the module documentation).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    write_atomic_with(path, |w| w.write_all(bytes))
}

/// Writes what `write` produces to `path` atomically: a temporary file in the same folder,
/// flushed and synced, then renamed into place. On any error the temporary file is removed and
/// the target is left as it was; the error names the path and the cause (a full disk, a
/// read-only folder).
pub fn write_atomic_with(
    path: &Path,
    write: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> Result<()> {
    if path.is_dir() {
        return Err(Error::file(path, "is a folder (expected a file path)"));
    }
    let (dir, name) = split(path)?;
    remove_stale_temps(&dir, &name);
    let tmp = temp_path(&dir, &name);
    let cannot = |e: std::io::Error| Error::file(path, format!("cannot write: {e}"));
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .map_err(cannot)?;
    let guard = TempFile {
        path: tmp.clone(),
        armed: true,
    };
    let mut out = std::io::BufWriter::new(file);
    write(&mut out).map_err(cannot)?;
    let file = out.into_inner().map_err(|e| cannot(e.into_error()))?;
    file.sync_all().map_err(cannot)?;
    drop(file);
    std::fs::rename(&tmp, path).map_err(cannot)?;
    guard.keep();
    // The rename itself reaches the disk with the folder; best effort (not every file system
    // lets a folder be opened and synced).
    if let Ok(d) = std::fs::File::open(&dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Checks, before any work, that a file can be written at `path`: it is not a folder, its
/// folder exists and is a folder, and a file can be created there (one is created and
/// removed). The error says which of these failed.
pub fn check_writable(path: &Path) -> Result<()> {
    if path.is_dir() {
        return Err(Error::file(path, "is a folder (expected a file path)"));
    }
    let (dir, name) = split(path)?;
    match std::fs::metadata(&dir) {
        Err(e) => {
            return Err(Error::file(
                path,
                format!("cannot write here: folder {} ({e})", dir.display()),
            ));
        }
        Ok(m) if !m.is_dir() => {
            return Err(Error::file(
                path,
                format!("cannot write here: {} is not a folder", dir.display()),
            ));
        }
        Ok(_) => {}
    }
    let probe = temp_path(&dir, &name);
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
    {
        Ok(f) => {
            drop(f);
            let _ = std::fs::remove_file(&probe);
            Ok(())
        }
        Err(e) => Err(Error::file(
            path,
            format!(
                "cannot write here: cannot create a file in {} ({e})",
                dir.display()
            ),
        )),
    }
}

/// Whether process `pid` runs, where the system says (`/proc`); `None` where it cannot tell.
fn process_runs(pid: u32) -> Option<bool> {
    let proc = Path::new("/proc");
    if !proc.join("self").exists() {
        return None;
    }
    Some(proc.join(pid.to_string()).exists())
}

/// The pid in a temporary name `.<name>.<pid>-<n>-<random>.tandem-tmp`.
fn temp_pid(file: &str, name: &str) -> Option<u32> {
    let rest = file
        .strip_prefix('.')?
        .strip_prefix(name)?
        .strip_prefix('.')?
        .strip_suffix(TEMP_SUFFIX)?;
    let mut parts = rest.split('-');
    let pid = parts.next()?.parse().ok()?;
    let _n: u64 = parts.next()?.parse().ok()?;
    let r = parts.next()?;
    (r.len() == 8 && r.bytes().all(|b| b.is_ascii_hexdigit()) && parts.next().is_none())
        .then_some(pid)
}

/// Removes the temporary files that writes of `name` in `dir` left behind when their process
/// was killed: those whose process no longer runs, and any older than [`STALE_AFTER`]. This
/// process's own are kept. Returns how many were removed.
pub fn remove_stale_temps(dir: &Path, name: &str) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let me = std::process::id();
    let mut removed = 0;
    for e in entries.flatten() {
        let file = e.file_name();
        let Some(pid) = file.to_str().and_then(|f| temp_pid(f, name)) else {
            continue;
        };
        if pid == me {
            continue;
        }
        let old = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > STALE_AFTER);
        if (old || process_runs(pid) == Some(false)) && std::fs::remove_file(e.path()).is_ok() {
            tracing::info!(file = %e.path().display(), "removed a temporary file a killed run left behind");
            removed += 1;
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmpdir() -> tempfile::TempDir {
        tempfile::tempdir().expect("temp dir")
    }

    fn leftovers(dir: &Path) -> Vec<String> {
        std::fs::read_dir(dir)
            .expect("read dir")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(TEMP_SUFFIX))
            .collect()
    }

    #[test]
    fn writes_replace_and_leave_no_temp() -> Result<()> {
        let d = tmpdir();
        let p = d.path().join("out.bin");
        write_atomic(&p, b"first")?;
        write_atomic(&p, b"second")?;
        assert_eq!(
            std::fs::read(&p).map_err(|e| Error::file(&p, e.to_string()))?,
            b"second"
        );
        assert!(leftovers(d.path()).is_empty());
        Ok(())
    }

    #[test]
    fn a_failing_writer_leaves_the_target_and_no_temp() -> Result<()> {
        let d = tmpdir();
        let p = d.path().join("out.bin");
        write_atomic(&p, b"kept")?;
        let e = write_atomic_with(&p, |w| {
            w.write_all(b"half")?;
            Err(std::io::Error::other("disk on fire"))
        })
        .expect_err("the writer failed");
        assert!(e.to_string().contains("disk on fire"), "{e}");
        assert!(e.to_string().contains("out.bin"), "{e}");
        assert_eq!(
            std::fs::read(&p).map_err(|e| Error::file(&p, e.to_string()))?,
            b"kept"
        );
        assert!(leftovers(d.path()).is_empty());
        Ok(())
    }

    #[test]
    fn a_panicking_writer_leaves_no_temp() {
        let d = tmpdir();
        let p = d.path().join("out.bin");
        let r = std::panic::catch_unwind(|| {
            let _ = write_atomic_with(&p, |_| panic!("writer panicked"));
        });
        assert!(r.is_err());
        assert!(leftovers(d.path()).is_empty());
        assert!(!p.exists());
    }

    #[test]
    fn folders_and_missing_parents_are_refused() {
        let d = tmpdir();
        let e = write_atomic(d.path(), b"x").expect_err("a folder");
        assert!(e.to_string().contains("is a folder"), "{e}");
        let e = check_writable(d.path()).expect_err("a folder");
        assert!(e.to_string().contains("is a folder"), "{e}");
        let missing = d.path().join("no/such/dir/out.bin");
        let e = check_writable(&missing).expect_err("missing folder");
        assert!(e.to_string().contains("no/such/dir"), "{e}");
        let file = d.path().join("plain");
        std::fs::write(&file, b"").expect("write");
        let e = check_writable(&file.join("out.bin")).expect_err("parent is a file");
        assert!(e.to_string().contains("not a folder"), "{e}");
        check_writable(&d.path().join("fine.bin")).expect("writable");
        assert!(leftovers(d.path()).is_empty());
        assert!(check_writable(Path::new("relative-name.bin")).is_ok());
    }

    #[test]
    fn temp_names_parse_only_for_their_target() {
        let d = Path::new("/x");
        let t = temp_path(d, "out.safetensors");
        let f = t.file_name().and_then(|f| f.to_str()).expect("name");
        assert_eq!(temp_pid(f, "out.safetensors"), Some(std::process::id()));
        assert_eq!(temp_pid(f, "out"), None);
        assert_eq!(
            temp_pid(".out.safetensors.partial", "out.safetensors"),
            None
        );
        assert_eq!(temp_pid(".out.12-x-0000abcd.tandem-tmp", "out"), None);
    }

    #[test]
    fn leftovers_of_dead_processes_are_removed_live_ones_kept() -> Result<()> {
        let d = tmpdir();
        // A pid that ran and is gone.
        let mut child = std::process::Command::new("true")
            .spawn()
            .map_err(|e| Error::Internal(e.to_string()))?;
        let dead = child.id();
        child.wait().map_err(|e| Error::Internal(e.to_string()))?;
        let stale = d
            .path()
            .join(format!(".out.bin.{dead}-0-0000abcd{TEMP_SUFFIX}"));
        let mine = d.path().join(format!(
            ".out.bin.{}-0-0000abcd{TEMP_SUFFIX}",
            std::process::id()
        ));
        let other = d
            .path()
            .join(format!(".other.bin.{dead}-0-0000abcd{TEMP_SUFFIX}"));
        for p in [&stale, &mine, &other] {
            std::fs::write(p, b"half").map_err(|e| Error::file(p, e.to_string()))?;
        }
        if process_runs(dead) == Some(false) {
            write_atomic(&d.path().join("out.bin"), b"x")?;
            assert!(!stale.exists(), "the dead process's temp is removed");
        } else {
            println!("SKIP: cannot tell whether pid {dead} runs (no /proc)");
        }
        assert!(mine.exists(), "this process's own temp is kept");
        assert!(other.exists(), "another target's temp is not touched");
        Ok(())
    }
}
