//! Finding the external tools and running the flow's commands, each with its output in a log
//! file.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::FlowError;
use super::command::ToolCommand;

/// Where `program` is on the PATH, asking the shell (`command -v`), or `None`.
pub fn find_tool(program: &str) -> Option<PathBuf> {
    let out = Command::new("sh")
        .args(["-c", "command -v \"$0\"", program])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    let p = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (out.status.success() && !p.is_empty()).then(|| PathBuf::from(p))
}

/// The programs of `cmds` that are not on the PATH, each once, in order.
pub fn missing_tools(cmds: &[ToolCommand]) -> Vec<String> {
    let mut missing: Vec<String> = Vec::new();
    for c in cmds {
        if !missing.contains(&c.program) && find_tool(&c.program).is_none() {
            missing.push(c.program.clone());
        }
    }
    missing
}

/// Runs `cmds` in order, each with stdout and stderr in `<log_dir>/<step>.log`; stops at the
/// first that fails.
pub fn run_all(cmds: &[ToolCommand], log_dir: &Path) -> Result<(), FlowError> {
    for c in cmds {
        let log = log_dir.join(format!("{}.log", c.step));
        let io = |source| FlowError::Io {
            path: log.clone(),
            source,
        };
        let out = std::fs::File::create(&log).map_err(io)?;
        let err = out.try_clone().map_err(io)?;
        tracing::info!(step = c.step, cmd = %c.shell(), log = %log.display(), "running");
        let status = Command::new(&c.program)
            .args(&c.args)
            .current_dir(&c.cwd)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .status()
            .map_err(|source| FlowError::Io {
                path: PathBuf::from(&c.program),
                source,
            })?;
        if !status.success() {
            return Err(FlowError::ToolFailed {
                step: c.step,
                command: c.shell(),
                status: status.to_string(),
                log,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_sh_and_not_a_made_up_tool() {
        assert!(find_tool("sh").is_some());
        assert!(find_tool("tandem-no-such-tool-xyz").is_none());
        let c = |p: &str| ToolCommand {
            step: "s",
            program: p.into(),
            args: vec![],
            cwd: ".".into(),
        };
        assert_eq!(
            missing_tools(&[
                c("sh"),
                c("tandem-no-such-tool-xyz"),
                c("tandem-no-such-tool-xyz")
            ]),
            ["tandem-no-such-tool-xyz"]
        );
    }

    #[test]
    fn a_failing_step_names_its_log() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ok = ToolCommand {
            step: "first",
            program: "sh".into(),
            args: vec!["-c".into(), "echo hello".into()],
            cwd: dir.path().into(),
        };
        let bad = ToolCommand {
            step: "second",
            program: "sh".into(),
            args: vec!["-c".into(), "echo broke >&2; exit 3".into()],
            cwd: dir.path().into(),
        };
        let e = run_all(&[ok, bad], dir.path())
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("second failed (exit status: 3)"), "{e}");
        let first = std::fs::read_to_string(dir.path().join("first.log")).unwrap_or_default();
        let second = std::fs::read_to_string(dir.path().join("second.log")).unwrap_or_default();
        assert_eq!((first.as_str(), second.as_str()), ("hello\n", "broke\n"));
    }
}
