//! A command line of an external tool (vivado, v++, vitis_hls): program, arguments and the
//! folder it runs in, printable as the exact shell line a user can paste.

use std::path::PathBuf;

/// One command of the flow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCommand {
    /// What it does, for messages (`package_xo`).
    pub step: &'static str,
    /// The program (`vivado`).
    pub program: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// The folder it runs in.
    pub cwd: PathBuf,
}

/// `s` quoted for a POSIX shell where it needs it.
pub fn shell_quote(s: &str) -> String {
    let plain = !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./=:+,@%[]".contains(&b));
    if plain {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

impl ToolCommand {
    /// The command line without the folder (`vivado -mode batch ...`).
    pub fn line(&self) -> String {
        std::iter::once(&self.program)
            .chain(&self.args)
            .map(|a| shell_quote(a))
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// The command as one shell line that runs it in its folder:
    /// `(cd DIR && vivado -mode batch ...)`.
    pub fn shell(&self) -> String {
        format!(
            "(cd {} && {})",
            shell_quote(&self.cwd.to_string_lossy()),
            self.line()
        )
    }
}

/// A shell script that runs `cmds` in order and stops at the first failure.
pub fn script(title: &str, cmds: &[ToolCommand]) -> String {
    let mut s = format!(
        "#!/bin/sh\n# {title}\n# Written by tandem; needs Vivado/Vitis on PATH (source <Vitis>/settings64.sh).\nset -e\n"
    );
    for c in cmds {
        s.push_str(&format!("# {}\n{}\n", c.step, c.shell()));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_and_lines() {
        assert_eq!(shell_quote("HBM[0]"), "HBM[0]");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote(""), "''");
        let c = ToolCommand {
            step: "x",
            program: "v++".into(),
            args: vec!["--link".into(), "my file.xo".into()],
            cwd: "/tmp/b d".into(),
        };
        assert_eq!(c.shell(), "(cd '/tmp/b d' && v++ --link 'my file.xo')");
    }
}
