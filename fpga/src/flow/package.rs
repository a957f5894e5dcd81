//! `tandem fpga package`: an RTL kernel to an xclbin. Emits the kernel ([`crate::emit`]) into
//! `<dir>/rtl`, writes `package_xo.tcl`, the link configuration ([`super::link_config`]) and
//! `build.sh` into `<dir>`, then runs Vivado's `package_xo` and `v++ --link` there, checks the
//! xclbin that comes out and records it in the bitstream manifest.
//!
//! Layout of `<dir>`: `rtl/` (Verilog, kernel.xml, manifest.json), `package_xo.tcl`,
//! `link.cfg`, `build.sh`, `<kernel>.xo`, `<kernel>_<platform>.xclbin`, `*.log`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::FlowError;
use super::command::{ToolCommand, script};
use super::link_config::link_config;
use super::tools::{missing_tools, run_all};
use crate::core::KernelCore;
use crate::emit::{Emitted, emit};
use crate::platform::Platform;
use crate::shell::ShellConfig;
use crate::xclbin::manifest::sha256_hex;
use crate::xclbin::{BitstreamManifest, ManifestEntry, Xclbin, metadata};

/// The Tcl script that packages an emitted kernel as a `.xo` (bitstreams/package_xo.tcl).
pub const PACKAGE_XO_TCL: &str = include_str!("../../../bitstreams/package_xo.tcl");

/// What to package.
#[derive(Clone, Copy)]
pub struct PackageRequest<'a> {
    /// The kernel core and its build parameters.
    pub core: &'a dyn KernelCore,
    /// Shell options.
    pub shell: ShellConfig,
    /// Target platform.
    pub platform: &'static Platform,
    /// The clock to ask v++ for, MHz.
    pub clock_mhz: u32,
}

/// File names of a package folder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackageFiles {
    /// `<kernel>.xo`.
    pub xo: String,
    /// `<kernel>_<platform key>.xclbin`.
    pub xclbin: String,
}

impl PackageFiles {
    /// The names for `kernel` on `platform`.
    pub fn new(kernel: &str, platform: &Platform) -> Self {
        Self {
            xo: format!("{kernel}.xo"),
            xclbin: format!("{kernel}_{}.xclbin", platform.key),
        }
    }
}

/// The two commands of a package, run in `dir`: Vivado batch `package_xo` on `rtl/`, then
/// `v++ --link` with `link.cfg`.
pub fn package_commands(
    dir: &Path,
    kernel: &str,
    platform: &Platform,
    clock_mhz: u32,
) -> Vec<ToolCommand> {
    let f = PackageFiles::new(kernel, platform);
    let s = |x: &str| x.to_string();
    vec![
        ToolCommand {
            step: "package_xo",
            program: s("vivado"),
            args: vec![
                s("-mode"),
                s("batch"),
                s("-nojournal"),
                s("-nolog"),
                s("-notrace"),
                s("-source"),
                s("package_xo.tcl"),
                s("-tclargs"),
                s("rtl"),
                s(kernel),
                f.xo.clone(),
                s(platform.part),
            ],
            cwd: dir.to_path_buf(),
        },
        ToolCommand {
            step: "vpp_link",
            program: s("v++"),
            args: vec![
                s("--link"),
                s("--target"),
                s("hw"),
                s("--platform"),
                s(platform.vbnv),
                s("--kernel_frequency"),
                clock_mhz.to_string(),
                s("--config"),
                s("link.cfg"),
                s("--temp_dir"),
                s("_x"),
                s("--log_dir"),
                s("logs"),
                s("--report_dir"),
                s("reports"),
                s("--output"),
                f.xclbin,
                f.xo,
            ],
            cwd: dir.to_path_buf(),
        },
    ]
}

/// A prepared package: the files are written, the commands not run yet.
#[derive(Debug, Clone)]
pub struct PackagePlan {
    /// Kernel name.
    pub kernel: String,
    /// Build parameters of the core.
    pub params: Vec<(String, i64)>,
    /// Target platform.
    pub platform: &'static Platform,
    /// The requested clock, MHz.
    pub clock_mhz: u32,
    /// The package folder.
    pub dir: PathBuf,
    /// The emitted kernel (in `<dir>/rtl`).
    pub emitted: Emitted,
    /// The link configuration written.
    pub link_cfg: PathBuf,
    /// `build.sh`: the commands, runnable by hand.
    pub script: PathBuf,
    /// Where v++ writes the xclbin.
    pub xclbin: PathBuf,
    /// The commands.
    pub commands: Vec<ToolCommand>,
}

/// Emits the kernel into `<dir>/rtl` and writes `package_xo.tcl`, `link.cfg` and `build.sh`
/// into `dir` (created; made absolute so the printed commands run from anywhere).
pub fn prepare(req: PackageRequest<'_>, dir: &Path) -> Result<PackagePlan, FlowError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| FlowError::Io { path, source }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let dir = std::fs::canonicalize(dir).map_err(io(dir))?;
    let emitted = emit(req.core, req.shell, &dir.join("rtl"))?;
    let xml = std::fs::read(&emitted.kernel_xml).map_err(io(&emitted.kernel_xml))?;
    let kernel = metadata::parse_kernels(&xml)?
        .into_iter()
        .find(|k| k.name == req.core.name())
        .ok_or_else(|| FlowError::Config {
            msg: format!(
                "{}: no kernel `{}`",
                emitted.kernel_xml.display(),
                req.core.name()
            ),
        })?;
    let cfg = link_config(&kernel, req.platform)?;
    let link_cfg = dir.join("link.cfg");
    std::fs::write(&link_cfg, cfg).map_err(io(&link_cfg))?;
    let tcl = dir.join("package_xo.tcl");
    std::fs::write(&tcl, PACKAGE_XO_TCL).map_err(io(&tcl))?;
    let commands = package_commands(&dir, &kernel.name, req.platform, req.clock_mhz);
    let script_path = dir.join("build.sh");
    let title = format!(
        "Builds {} for the {} ({}).",
        PackageFiles::new(&kernel.name, req.platform).xclbin,
        req.platform.board,
        req.platform.vbnv
    );
    std::fs::write(&script_path, script(&title, &commands)).map_err(io(&script_path))?;
    Ok(PackagePlan {
        kernel: kernel.name.clone(),
        params: req.core.params(),
        platform: req.platform,
        clock_mhz: req.clock_mhz,
        xclbin: dir.join(PackageFiles::new(&kernel.name, req.platform).xclbin),
        dir,
        emitted,
        link_cfg,
        script: script_path,
        commands,
    })
}

impl PackagePlan {
    /// Runs the commands, or fails with [`FlowError::ToolsMissing`] before starting any if a
    /// tool is not on the PATH. Returns the xclbin's path.
    pub fn run(&self) -> Result<&Path, FlowError> {
        let missing = missing_tools(&self.commands);
        if !missing.is_empty() {
            return Err(FlowError::ToolsMissing {
                missing,
                needs: format!(
                    "AMD Vivado and Vitis (2022.1 or later) with the {} platform installed",
                    self.platform.vbnv
                ),
                script: Some(self.script.clone()),
            });
        }
        run_all(&self.commands, &self.dir)?;
        Ok(&self.xclbin)
    }

    /// Checks the xclbin v++ wrote (platform, kernel, clock), copies it next to the manifest
    /// at `manifest_path` and adds or replaces its entry there. Returns the entry.
    pub fn record(&self, manifest_path: &Path) -> Result<ManifestEntry, FlowError> {
        let x = Xclbin::read(&self.xclbin)?;
        if x.platform() != self.platform.vbnv {
            return Err(FlowError::Output {
                msg: format!(
                    "{}: built for {}, expected {}",
                    self.xclbin.display(),
                    x.platform(),
                    self.platform.vbnv
                ),
            });
        }
        if x.kernel(&self.kernel).is_none() {
            return Err(FlowError::Output {
                msg: format!("{}: no kernel `{}`", self.xclbin.display(), self.kernel),
            });
        }
        let clock_mhz = x
            .kernel_clock_mhz()
            .map(u32::from)
            .ok_or_else(|| FlowError::Output {
                msg: format!(
                    "{}: no DATA clock in CLOCK_FREQ_TOPOLOGY",
                    self.xclbin.display()
                ),
            })?;
        if clock_mhz != self.clock_mhz {
            tracing::warn!(
                requested = self.clock_mhz,
                reached = clock_mhz,
                "v++ scaled the kernel clock to meet timing"
            );
        }
        let manifest_dir = manifest_path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let name = format!("{}_{}", self.kernel, self.platform.key);
        let file_name = PackageFiles::new(&self.kernel, self.platform).xclbin;
        let dest = manifest_dir.join(&file_name);
        let bytes = std::fs::read(&self.xclbin).map_err(|source| FlowError::Io {
            path: self.xclbin.clone(),
            source,
        })?;
        std::fs::write(&dest, &bytes).map_err(|source| FlowError::Io {
            path: dest.clone(),
            source,
        })?;
        let entry = ManifestEntry {
            name,
            path: PathBuf::from(file_name),
            platform: x.platform().to_string(),
            kernels: vec![self.kernel.clone()],
            clock_mhz,
            sha256: sha256_hex(&bytes),
            uuid: Some(x.uuid().to_string()),
            verilog_sha256: Some(self.emitted.manifest.verilog_sha256.clone()),
            params: self.params.iter().cloned().collect::<BTreeMap<_, _>>(),
        };
        let mut m = BitstreamManifest::load_or_empty(manifest_path)?;
        m.upsert(entry.clone())?;
        m.write(manifest_path)?;
        Ok(entry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::platform::{U55C, U250};

    #[test]
    fn the_commands_are_exact() {
        let cmds = package_commands(Path::new("/b/gemm_u55c"), "gemm", &U55C, 300);
        let lines: Vec<String> = cmds.iter().map(ToolCommand::shell).collect();
        assert_eq!(
            lines,
            [
                "(cd /b/gemm_u55c && vivado -mode batch -nojournal -nolog -notrace -source package_xo.tcl -tclargs rtl gemm gemm.xo xcu55c-fsvh2892-2L-e)",
                "(cd /b/gemm_u55c && v++ --link --target hw --platform xilinx_u55c_gen3x16_xdma_3_202210_1 --kernel_frequency 300 --config link.cfg --temp_dir _x --log_dir logs --report_dir reports --output gemm_u55c.xclbin gemm.xo)",
            ]
        );
        let u250 = package_commands(Path::new("/b"), "router", &U250, 250);
        assert_eq!(u250[0].args[11], "xcu250-figd2104-2L-e");
        assert_eq!(
            u250[1].line(),
            "v++ --link --target hw --platform xilinx_u250_gen3x16_xdma_4_1_202210_1 --kernel_frequency 250 --config link.cfg --temp_dir _x --log_dir logs --report_dir reports --output router_u250.xclbin router.xo"
        );
    }

    #[test]
    fn prepare_writes_the_files_the_commands_name() {
        let core = crate::kernels::core_for("router", &[]).expect("core");
        let dir = tempfile::tempdir().expect("tempdir");
        let req = PackageRequest {
            core: core.as_ref(),
            shell: ShellConfig::default(),
            platform: &U55C,
            clock_mhz: 300,
        };
        let plan = prepare(req, dir.path()).expect("prepare");
        for f in [
            "rtl/router.v",
            "rtl/kernel.xml",
            "package_xo.tcl",
            "link.cfg",
            "build.sh",
        ] {
            assert!(plan.dir.join(f).is_file(), "{f} missing");
        }
        let cfg = std::fs::read_to_string(&plan.link_cfg).expect("cfg");
        assert!(
            cfg.contains("nk=router:1:router_1\nsp=router_1.m_axi_gmem:HBM[0]\n"),
            "{cfg}"
        );
        let sh = std::fs::read_to_string(&plan.script).expect("script");
        for c in &plan.commands {
            assert!(sh.contains(&c.shell()), "{sh}");
        }
    }
}
