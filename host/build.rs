//! Records the git commit the binary is built from (`tandem --version`), as
//! `TANDEM_GIT_COMMIT`: the short hash, `+dirty` when tracked files differ from it, or
//! `unknown` where there is no git (a source tarball, a crates.io package).

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?;
    let s = s.trim();
    (!s.is_empty()).then(|| s.to_string())
}

fn main() {
    // Rebuilt when HEAD moves (a commit, a checkout): the reflog of HEAD changes then.
    for p in ["HEAD", "logs/HEAD"] {
        if let Some(path) = git(&["rev-parse", "--git-path", p]) {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    let commit = match git(&["rev-parse", "--short=12", "HEAD"]) {
        Some(hash) => {
            let dirty = Command::new("git")
                .args(["diff", "--quiet", "HEAD", "--"])
                .status()
                .map(|s| s.code() == Some(1))
                .unwrap_or(false);
            if dirty { format!("{hash}+dirty") } else { hash }
        }
        None => "unknown".to_string(),
    };
    println!("cargo:rustc-env=TANDEM_GIT_COMMIT={commit}");
}
