//! `tandem fpga hls`: the HLS C++ version of a kernel through Vitis HLS (`vitis_hls -f
//! tcl/<kernel>.tcl` in hls/: C simulation against the golden vectors, synthesis, and export
//! of `build/<kernel>_kernel.xo`).

use std::path::Path;

use super::FlowError;
use super::command::ToolCommand;

/// The `vitis_hls` command of `kernel`, run in `hls_dir` (the repository's `hls/`); its Tcl
/// script must exist.
pub fn hls_command(hls_dir: &Path, kernel: &str) -> Result<ToolCommand, FlowError> {
    let tcl = hls_dir.join("tcl").join(format!("{kernel}.tcl"));
    if !tcl.is_file() {
        return Err(FlowError::Config {
            msg: format!(
                "{} does not exist: no HLS script for kernel `{kernel}` (run from the repository root or pass --hls-dir)",
                tcl.display()
            ),
        });
    }
    let dir = std::fs::canonicalize(hls_dir).map_err(|source| FlowError::Io {
        path: hls_dir.to_path_buf(),
        source,
    })?;
    Ok(ToolCommand {
        step: "vitis_hls",
        program: "vitis_hls".into(),
        args: vec!["-f".into(), format!("tcl/{kernel}.tcl")],
        cwd: dir,
    })
}

/// Runs `cmd` (from [`hls_command`]), or fails with [`FlowError::ToolsMissing`] when
/// `vitis_hls` is not on the PATH. Output goes to `<hls>/build/vitis_hls.log`.
pub fn run_hls(cmd: &ToolCommand) -> Result<(), FlowError> {
    let missing = super::tools::missing_tools(std::slice::from_ref(cmd));
    if !missing.is_empty() {
        return Err(FlowError::ToolsMissing {
            missing,
            needs: "AMD Vitis HLS (2022.1 or later)".into(),
            script: None,
        });
    }
    let log_dir = cmd.cwd.join("build");
    std::fs::create_dir_all(&log_dir).map_err(|source| FlowError::Io {
        path: log_dir.clone(),
        source,
    })?;
    super::tools::run_all(std::slice::from_ref(cmd), &log_dir)
}

/// Where the script exports the kernel's `.xo`, relative to the hls folder.
pub fn hls_xo(kernel: &str) -> String {
    format!("build/{kernel}_kernel.xo")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_runs_the_kernels_tcl_in_hls() {
        let hls = Path::new(env!("CARGO_MANIFEST_DIR")).join("../hls");
        let c = hls_command(&hls, "gemm").expect("gemm.tcl exists");
        assert_eq!(c.line(), "vitis_hls -f tcl/gemm.tcl");
        assert!(c.cwd.ends_with("hls"));
        let e = hls_command(&hls, "nope")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("tcl/nope.tcl does not exist"), "{e}");
    }
}
