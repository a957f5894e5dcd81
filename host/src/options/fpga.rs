//! Options of the FPGA backend (filled by [`super::Options`]).

use std::ops::RangeInclusive;
use std::path::PathBuf;

use super::Env;
use crate::error::{Error, Result};

/// The variable naming the simulator's cache folder.
pub const SIM_CACHE_VAR: &str = "TANDEM_SIM_CACHE_DIR";

/// Options of the FPGA backend: the clock device time is computed at, where the simulator
/// caches its builds, the C++ compiler of those builds, the simulated memory, and where XRT
/// and the boards' xclbins are.
#[derive(Debug, Clone, PartialEq)]
pub struct FpgaOptions {
    /// Kernel clock in MHz (`TANDEM_FPGA_CLOCK_MHZ`); `None`: each build's target clock
    /// (`tandem_fpga::DEFAULT_CLOCK_MHZ`, recorded in its manifest).
    pub clock_mhz: Option<f64>,
    /// Where the simulator caches emitted kernels and Verilator builds:
    /// `TANDEM_SIM_CACHE_DIR` (or its former name `TANDEM_SIM_CACHE`), else
    /// [`super::user_cache_dir`]`/sim` (`$TANDEM_CACHE_DIR/sim`, `$XDG_CACHE_HOME/tandem/sim`,
    /// `$HOME/.cache/tandem/sim`), else the temp folder's `tandem-sim`.
    pub sim_cache: PathBuf,
    /// C++ compiler of the Verilator builds (`CXX`, else `g++`).
    pub cxx: String,
    /// Simulated memory read latency in cycles (`tandem fpga sim --read-latency`); `None`: the
    /// simulator's default.
    pub sim_read_latency: Option<u64>,
    /// Simulated memory bandwidth in bytes per cycle (`tandem fpga sim --bytes-per-cycle`);
    /// `None`: the simulator's default.
    pub sim_bytes_per_cycle: Option<f64>,
    /// Write a VCD trace of every signal of the simulated card here (`tandem fpga sim --vcd`).
    pub sim_vcd: Option<PathBuf>,
    /// How the simulated card runs a kernel (`TANDEM_FPGA_SIM_MODE`, `--fpga-sim-mode`): the
    /// RTL under Verilator, the modelled card, or chosen per launch by size (the default).
    pub sim_mode: SimMode,
    /// Which builds the simulated card runs (`TANDEM_FPGA_SIM_PROFILE`): the small builds
    /// CI's Verilator runs keep fast (the default), or the card-sized ones of a U55C.
    pub sim_profile: SimProfile,
    /// XRT's install prefix (`XILINX_XRT`): its `lib/` is searched first for
    /// libxrt_coreutil, and XRT itself needs it set to reach a board.
    pub xilinx_xrt: Option<PathBuf>,
    /// Look for libxrt_coreutil.so.2 in this folder only (`TANDEM_XRT_LIB`); `None`:
    /// `$XILINX_XRT/lib`, `/opt/xilinx/xrt/lib`, then the system's library folders.
    pub xrt_lib: Option<PathBuf>,
    /// Folder of the boards' xclbins, one per kernel, `<kernel>.xclbin` (`TANDEM_XCLBIN_DIR`).
    pub xclbin_dir: Option<PathBuf>,
    /// `XCL_EMULATION_MODE` (XRT's emulation: `sw_emu`, `hw_emu`), as XRT will read it.
    pub xrt_emulation: Option<String>,
    /// `XILINX_VITIS` (XRT's emulation runs Vitis's device process from there).
    pub xilinx_vitis: Option<PathBuf>,
    /// The program whose `__xrt-probe` command lists boards in a child process (XRT can end
    /// the process it runs in): the `tandem` binary sets itself here; `None` (a library user,
    /// a test) lists no boards and says so.
    pub xrt_probe: Option<PathBuf>,
}

impl Default for FpgaOptions {
    /// The build's clock, a cache in the temp folder, `g++`, the simulator's memory.
    fn default() -> Self {
        Self {
            clock_mhz: None,
            sim_cache: std::env::temp_dir().join("tandem-sim"),
            cxx: "g++".into(),
            sim_read_latency: None,
            sim_bytes_per_cycle: None,
            sim_vcd: None,
            sim_mode: SimMode::Auto,
            sim_profile: SimProfile::Ci,
            xilinx_xrt: None,
            xrt_lib: None,
            xclbin_dir: None,
            xrt_emulation: None,
            xilinx_vitis: None,
            xrt_probe: None,
        }
    }
}

/// How the simulated card (`fpga-sim`) runs kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SimMode {
    /// The RTL under Verilator for launches of up to `AUTO_MODEL_CYCLES` estimated cycles
    /// (seconds of simulation), the modelled card above.
    #[default]
    Auto,
    /// Always the RTL under Verilator: exact cycles, the real pipeline (slow at model size).
    Rtl,
    /// Always the modelled card: the golden models' results (the same bits as the RTL) and
    /// the analytic cycle models of `tandem_fpga::timing` (within 5% of the RTL's cycles).
    Model,
}

impl SimMode {
    /// The environment variable that sets it.
    pub const ENV: &'static str = "TANDEM_FPGA_SIM_MODE";
    /// Every mode.
    pub const ALL: [SimMode; 3] = [SimMode::Auto, SimMode::Rtl, SimMode::Model];

    /// Its name (`auto`, `rtl`, `model`).
    pub fn name(self) -> &'static str {
        match self {
            SimMode::Auto => "auto",
            SimMode::Rtl => "rtl",
            SimMode::Model => "model",
        }
    }
}

impl std::str::FromStr for SimMode {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        SimMode::ALL
            .into_iter()
            .find(|m| m.name().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| format!("`{s}` is not accepted; expected one of auto, rtl, model"))
    }
}

/// The board profile of the simulated card (`fpga-sim`): which kernel builds it loads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SimProfile {
    /// The small builds (an 8-row, 8-lane GEMM on a 64-bit port, ...): seconds of Verilator
    /// per launch, what CI runs.
    #[default]
    Ci,
    /// The U55C's card-sized builds: the GEMM of 64 rows x 64 lanes (4,096 int8 MACs a
    /// cycle) on a 512-bit port, the simulated memory serving a 64-byte beat a cycle (unless
    /// `--bytes-per-cycle` says otherwise). Slow under Verilator: the modelled card (same
    /// bits, cycles within 5%) is what `auto` picks for anything but small launches.
    U55c,
}

impl SimProfile {
    /// The environment variable that sets it.
    pub const ENV: &'static str = "TANDEM_FPGA_SIM_PROFILE";
    /// Every profile.
    pub const ALL: [SimProfile; 2] = [SimProfile::Ci, SimProfile::U55c];

    /// Its name (`ci`, `u55c`).
    pub fn name(self) -> &'static str {
        match self {
            SimProfile::Ci => "ci",
            SimProfile::U55c => "u55c",
        }
    }
}

impl std::str::FromStr for SimProfile {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        SimProfile::ALL
            .into_iter()
            .find(|m| m.name().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| format!("`{s}` is not accepted; expected one of ci, u55c"))
    }
}

/// Accepted kernel clocks in MHz (`TANDEM_FPGA_CLOCK_MHZ`): Alveo kernels close timing between
/// a few tens and a few hundreds of MHz; outside this range a device time would be meaningless.
pub const CLOCK_MHZ_RANGE: RangeInclusive<f64> = 1.0..=1000.0;
/// Accepted simulated memory read latencies in cycles (`--read-latency`).
pub const READ_LATENCY_RANGE: RangeInclusive<u64> = 0..=100_000;
/// Accepted simulated memory bandwidths in bytes per cycle (`--bytes-per-cycle`): below it a
/// simulation would crawl (one 8-byte beat every 800 cycles at the floor); the simulated memory
/// delivers at most 64 bytes of credit a cycle.
pub const BYTES_PER_CYCLE_RANGE: RangeInclusive<f64> = 0.01..=64.0;

/// Accepted values of `TANDEM_FPGA_CLOCK_MHZ`.
const CLOCK_ACCEPTS: &str = "a number of MHz from 1 to 1000, e.g. 300 or 250.5";

/// `value` (of `what`) if it is a finite number in `range`, else an error naming `what`, the
/// value and the range.
fn in_range(what: &str, value: f64, range: &RangeInclusive<f64>, unit: &str) -> Result<f64> {
    if value.is_finite() && range.contains(&value) {
        Ok(value)
    } else {
        Err(Error::invalid(
            what,
            format!(
                "`{value:?}` is not accepted; expected a number of {unit} from {} to {}",
                range.start(),
                range.end()
            ),
        ))
    }
}

impl FpgaOptions {
    /// Options from the process environment (see [`FpgaOptions::from_source`]).
    pub fn from_env() -> Result<Self> {
        Self::from_source(&super::ProcessEnv)
    }

    /// Options from `env` (`TANDEM_FPGA_CLOCK_MHZ`, `TANDEM_SIM_CACHE_DIR`, `TANDEM_CACHE_DIR`, `XDG_CACHE_HOME`,
    /// `HOME`, `CXX`, `XILINX_XRT`, `TANDEM_XRT_LIB`, `TANDEM_XCLBIN_DIR`, `XCL_EMULATION_MODE`,
    /// `XILINX_VITIS`); a clock that is not a positive number is an error naming the variable,
    /// the value and what is accepted.
    pub fn from_source(env: &dyn Env) -> Result<Self> {
        let d = Self::default();
        let clock_mhz = match env.text("TANDEM_FPGA_CLOCK_MHZ")? {
            None => None,
            Some(s) => match s.parse::<f64>() {
                Ok(v) if v.is_finite() && CLOCK_MHZ_RANGE.contains(&v) => Some(v),
                _ => {
                    return Err(Error::invalid(
                        "TANDEM_FPGA_CLOCK_MHZ",
                        format!("`{s}` is not accepted; expected {CLOCK_ACCEPTS}"),
                    ));
                }
            },
        };
        let path = |name: &str| env.get(name).filter(|v| !v.is_empty()).map(PathBuf::from);
        // TANDEM_SIM_CACHE_DIR (TANDEM_SIM_CACHE, its former name, still read), else the
        // user's cache folder's sim/ (TANDEM_CACHE_DIR, XDG_CACHE_HOME, HOME).
        let sim_cache = path(SIM_CACHE_VAR)
            .or_else(|| path("TANDEM_SIM_CACHE"))
            .or_else(|| super::user_cache_dir(env).map(|p| p.join("sim")))
            .unwrap_or(d.sim_cache);
        let cxx = env.text("CXX")?.unwrap_or(d.cxx);
        let sim_mode = match env.text(SimMode::ENV)? {
            None => SimMode::Auto,
            Some(s) => s
                .parse()
                .map_err(|e: String| Error::invalid(SimMode::ENV, e))?,
        };
        let sim_profile = match env.text(SimProfile::ENV)? {
            None => SimProfile::Ci,
            Some(s) => s
                .parse()
                .map_err(|e: String| Error::invalid(SimProfile::ENV, e))?,
        };
        let o = Self {
            clock_mhz,
            sim_cache,
            cxx,
            sim_mode,
            sim_profile,
            xilinx_xrt: path("XILINX_XRT"),
            xrt_lib: path("TANDEM_XRT_LIB"),
            xclbin_dir: path("TANDEM_XCLBIN_DIR"),
            xrt_emulation: env.text("XCL_EMULATION_MODE")?,
            xilinx_vitis: path("XILINX_VITIS"),
            ..Self::default()
        };
        o.validate()?;
        Ok(o)
    }

    /// Checks every number against its accepted range ([`CLOCK_MHZ_RANGE`],
    /// [`READ_LATENCY_RANGE`], [`BYTES_PER_CYCLE_RANGE`]); call it after setting fields by
    /// hand (the command line does after its `tandem fpga sim` flags). The error names the
    /// setting, the value and the range.
    pub fn validate(&self) -> Result<()> {
        if let Some(c) = self.clock_mhz {
            in_range("TANDEM_FPGA_CLOCK_MHZ", c, &CLOCK_MHZ_RANGE, "MHz")?;
        }
        if let Some(l) = self.sim_read_latency
            && !READ_LATENCY_RANGE.contains(&l)
        {
            return Err(Error::invalid(
                "--read-latency",
                format!(
                    "`{l}` is not accepted; expected a number of cycles from {} to {}",
                    READ_LATENCY_RANGE.start(),
                    READ_LATENCY_RANGE.end()
                ),
            ));
        }
        if let Some(b) = self.sim_bytes_per_cycle {
            in_range(
                "--bytes-per-cycle",
                b,
                &BYTES_PER_CYCLE_RANGE,
                "bytes per cycle",
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_when_nothing_is_set() {
        let o = FpgaOptions::from_source(&[("UNRELATED", "1")]).expect("options");
        assert_eq!(o.clock_mhz, None);
        assert_eq!(o.cxx, "g++");
        assert_eq!(o.sim_cache, std::env::temp_dir().join("tandem-sim"));
        assert_eq!(o, FpgaOptions::default());
    }

    #[test]
    fn clock_is_read_and_checked() {
        let o = FpgaOptions::from_source(&[("TANDEM_FPGA_CLOCK_MHZ", " 250.5 ")]).expect("ok");
        assert_eq!(o.clock_mhz, Some(250.5));
        for bad in [
            "0", "-300", "fast", "inf", "NaN", "1e-300", "0.5", "1000.1", "1e300",
        ] {
            let e = FpgaOptions::from_source(&[("TANDEM_FPGA_CLOCK_MHZ", bad)])
                .expect_err("not a clock in range");
            let msg = e.to_string();
            assert!(msg.contains("TANDEM_FPGA_CLOCK_MHZ"), "{msg}");
            assert!(msg.contains(bad), "{msg}");
            assert!(msg.contains("from 1 to 1000"), "{msg}");
        }
        for good in ["1", "1000", "300"] {
            FpgaOptions::from_source(&[("TANDEM_FPGA_CLOCK_MHZ", good)]).expect(good);
        }
        // empty counts as unset
        let o = FpgaOptions::from_source(&[("TANDEM_FPGA_CLOCK_MHZ", "")]).expect("ok");
        assert_eq!(o.clock_mhz, None);
    }

    #[test]
    fn simulated_memory_settings_are_range_checked() {
        let ok = FpgaOptions {
            sim_read_latency: Some(40),
            sim_bytes_per_cycle: Some(8.0),
            ..FpgaOptions::default()
        };
        ok.validate().expect("defaults of the flags");
        for (lat, bpc, name, value) in [
            (Some(100_001), None, "--read-latency", "100001"),
            (
                Some(u64::MAX),
                None,
                "--read-latency",
                "18446744073709551615",
            ),
            (None, Some(0.0), "--bytes-per-cycle", "0"),
            (None, Some(1e-300), "--bytes-per-cycle", "1e-300"),
            (None, Some(f64::NAN), "--bytes-per-cycle", "NaN"),
            (None, Some(f64::INFINITY), "--bytes-per-cycle", "inf"),
            (None, Some(65.0), "--bytes-per-cycle", "65"),
        ] {
            let o = FpgaOptions {
                sim_read_latency: lat,
                sim_bytes_per_cycle: bpc,
                ..FpgaOptions::default()
            };
            let msg = o.validate().expect_err(value).to_string();
            assert!(msg.contains(name) && msg.contains(value), "{msg}");
            assert!(msg.contains("from "), "{msg}");
        }
    }

    #[test]
    fn sim_cache_falls_back_in_order() {
        let all = [
            ("TANDEM_SIM_CACHE", "/c/sim"),
            ("XDG_CACHE_HOME", "/x"),
            ("HOME", "/h"),
        ];
        let o = FpgaOptions::from_source(&all).expect("ok");
        assert_eq!(o.sim_cache, PathBuf::from("/c/sim"));
        let o = FpgaOptions::from_source(&[("XDG_CACHE_HOME", "/x"), ("HOME", "/h")]).expect("ok");
        assert_eq!(o.sim_cache, PathBuf::from("/x/tandem/sim"));
        let o = FpgaOptions::from_source(&[("HOME", "/h")]).expect("ok");
        assert_eq!(o.sim_cache, PathBuf::from("/h/.cache/tandem/sim"));
    }

    #[test]
    fn xrt_paths_are_read() {
        let o = FpgaOptions::from_source(&[
            ("XILINX_XRT", "/opt/xilinx/xrt"),
            ("TANDEM_XRT_LIB", "/x/lib"),
            ("TANDEM_XCLBIN_DIR", "/b"),
            ("XCL_EMULATION_MODE", "sw_emu"),
            ("XILINX_VITIS", "/tools/Vitis"),
        ])
        .expect("ok");
        assert_eq!(o.xilinx_xrt, Some(PathBuf::from("/opt/xilinx/xrt")));
        assert_eq!(o.xrt_lib, Some(PathBuf::from("/x/lib")));
        assert_eq!(o.xclbin_dir, Some(PathBuf::from("/b")));
        assert_eq!(o.xrt_emulation.as_deref(), Some("sw_emu"));
        assert_eq!(o.xilinx_vitis, Some(PathBuf::from("/tools/Vitis")));
        assert_eq!(
            o.xrt_probe, None,
            "set by the binary, never from the environment"
        );
        let o = FpgaOptions::from_source(&[("XILINX_XRT", "")]).expect("ok");
        assert_eq!(o.xilinx_xrt, None, "empty counts as unset");
    }

    #[test]
    fn sim_profile_is_read_and_checked() {
        let o = FpgaOptions::from_source(&[("TANDEM_FPGA_SIM_PROFILE", " U55C ")]).expect("ok");
        assert_eq!(o.sim_profile, SimProfile::U55c);
        let o = FpgaOptions::from_source(&[("TANDEM_FPGA_SIM_PROFILE", "ci")]).expect("ok");
        assert_eq!(o.sim_profile, SimProfile::Ci);
        let e = FpgaOptions::from_source(&[("TANDEM_FPGA_SIM_PROFILE", "u280")])
            .expect_err("unknown profile")
            .to_string();
        assert!(
            e.contains("TANDEM_FPGA_SIM_PROFILE") && e.contains("u280") && e.contains("ci, u55c"),
            "{e}"
        );
    }

    #[test]
    fn cxx_is_read() {
        let o = FpgaOptions::from_source(&[("CXX", "clang++")]).expect("ok");
        assert_eq!(o.cxx, "clang++");
    }
}
