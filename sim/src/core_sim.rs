//! A Verilator harness for a bare kernel core (the port contract of `tandem_fpga::core`),
//! used to check the GEMM and attention cores bit for bit against the golden models without
//! the shell: a C++ testbench plays the shell's side of the read/write channels over a flat
//! memory image, with configurable latency and random stalls, runs jobs back to back (and can
//! reset a job midway), and reports cycles and simulation speed. Built through the same
//! [`Toolchain`] (Verilator check, compiler, cache) as the card's models.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::Command;

use crate::SimError;
use crate::verilator::{Toolchain, io, jobs, run};

/// One kernel launch: scalar and pointer arguments, optionally reset after some cycles.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CoreJob {
    /// `arg0..arg7`.
    pub args: [u32; 8],
    /// `ptr0..ptr7` (byte addresses into the memory image).
    pub ptrs: [u64; 8],
    /// Assert `reset` this many cycles after `start` (the job is abandoned).
    pub reset_after: Option<u64>,
}

/// Behaviour of the simulated memory side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemModel {
    /// Cycles from accepting a read request to its first word.
    pub latency: u32,
    /// Percent of cycles in which each channel stalls (0 = always ready).
    pub stall_pct: u32,
    /// Seed of the stall pattern.
    pub seed: u64,
    /// Read requests the memory accepts before their data has been returned.
    pub outstanding: u32,
}

impl Default for MemModel {
    fn default() -> Self {
        Self {
            latency: 8,
            stall_pct: 0,
            seed: 1,
            outstanding: 4,
        }
    }
}

/// Result of one job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobStats {
    /// Cycles from `start` to `done` (or to the reset).
    pub cycles: u64,
    /// Whether `done` was seen.
    pub done: bool,
}

/// Result of one harness run.
#[derive(Debug, Clone, PartialEq)]
pub struct SimRun {
    /// Per job.
    pub jobs: Vec<JobStats>,
    /// Simulated cycles per second of wall time.
    pub cycles_per_sec: f64,
}

/// A Verilator model of one core, built once (cached by the toolchain) and run many times.
#[derive(Debug)]
pub struct CoreSim {
    exe: PathBuf,
    dir: PathBuf,
}

/// Verilator's flags for the harness build.
const FLAGS: &[&str] = &[
    "--cc",
    "--exe",
    "--build",
    "-O3",
    "--x-assign",
    "0",
    "--x-initial",
    "0",
    "-Wno-fatal",
    "-Wno-lint",
    "-Wno-style",
    "--prefix",
    "Vcore",
    "-CFLAGS",
    "-O1",
];

/// The harness executable in a build folder.
const EXE: &str = "vcore";

impl CoreSim {
    /// Verilates `verilog` (top `module`) with the harness and builds it, or finds the build
    /// in `tc`'s cache.
    pub fn build(tc: &Toolchain, verilog: &str, module: &str) -> Result<Self, SimError> {
        let flags = FLAGS.join(" ");
        let inputs: [&[u8]; 4] = [
            verilog.as_bytes(),
            HARNESS.as_bytes(),
            module.as_bytes(),
            flags.as_bytes(),
        ];
        let dir = tc.cached(&format!("core-{module}"), &inputs, EXE, |tmp| {
            let v = tmp.join(format!("{module}.v"));
            std::fs::write(&v, verilog).map_err(io(&v))?;
            let cpp = tmp.join("harness.cpp");
            std::fs::write(&cpp, HARNESS).map_err(io(&cpp))?;
            let obj = tmp.join("obj");
            run(
                tc.verilator()
                    .args(FLAGS)
                    .args(["--top-module", module, "-o", EXE, "-j"])
                    .arg(jobs(2).to_string())
                    .arg("--Mdir")
                    .arg(&obj)
                    .arg(&v)
                    .arg(&cpp),
                &format!("verilator build of {module}"),
            )?;
            let built = obj.join(EXE);
            let exe = tmp.join(EXE);
            std::fs::rename(&built, &exe).map_err(io(&built))?;
            let _ = std::fs::remove_dir_all(&obj);
            Ok(())
        })?;
        Ok(Self {
            exe: dir.join(EXE),
            dir,
        })
    }

    /// Runs `jobs` back to back on `mem` (updated in place with what the core wrote).
    pub fn run(
        &self,
        mem: &mut [u8],
        jobs: &[CoreJob],
        model: MemModel,
        max_cycles: u64,
    ) -> Result<SimRun, SimError> {
        static RUNS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tag = format!("{}-{n}", std::process::id());
        let min = self.dir.join(format!("mem_in_{tag}.bin"));
        let mout = self.dir.join(format!("mem_out_{tag}.bin"));
        let jf = self.dir.join(format!("jobs_{tag}.txt"));
        std::fs::write(&min, &*mem).map_err(io(&min))?;
        let mut text = String::new();
        for j in jobs {
            for a in j.args {
                let _ = write!(text, "{a} ");
            }
            for p in j.ptrs {
                let _ = write!(text, "{p} ");
            }
            let _ = writeln!(text, "{}", j.reset_after.unwrap_or(0));
        }
        let mut f = std::fs::File::create(&jf).map_err(io(&jf))?;
        f.write_all(text.as_bytes()).map_err(io(&jf))?;
        drop(f);
        let out = Command::new(&self.exe)
            .arg(&min)
            .arg(&mout)
            .arg(&jf)
            .arg(model.latency.to_string())
            .arg(model.stall_pct.to_string())
            .arg(model.seed.to_string())
            .arg(model.outstanding.max(1).to_string())
            .arg(max_cycles.to_string())
            .output()
            .map_err(io(&self.exe))?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() {
            return Err(SimError::Run(format!(
                "harness exited with {}: {stdout}{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        let data = std::fs::read(&mout).map_err(io(&mout))?;
        if data.len() != mem.len() {
            return Err(SimError::Run("memory image changed size".into()));
        }
        mem.copy_from_slice(&data);
        let _ = std::fs::remove_file(&min);
        let _ = std::fs::remove_file(&mout);
        let _ = std::fs::remove_file(&jf);
        let mut stats = Vec::new();
        let mut speed = 0.0;
        for line in stdout.lines() {
            let w: Vec<&str> = line.split_whitespace().collect();
            match w.as_slice() {
                ["job", _, "cycles", c, "done", d] => stats.push(JobStats {
                    cycles: c.parse().map_err(|_| SimError::Run(line.into()))?,
                    done: *d == "1",
                }),
                ["speed", s] => speed = s.parse().unwrap_or(0.0),
                _ => {}
            }
        }
        if stats.len() != jobs.len() {
            return Err(SimError::Run(format!(
                "unexpected harness output: {stdout}"
            )));
        }
        Ok(SimRun {
            jobs: stats,
            cycles_per_sec: speed,
        })
    }
}

/// The C++ testbench: the shell's side of the core contract over a flat memory image.
const HARNESS: &str = r#"
#include "Vcore.h"
#include "verilated.h"
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <vector>

struct Req { uint64_t addr; uint64_t len; uint64_t ready_at; };
static uint64_t rng_state;
static uint32_t rnd() {
    rng_state ^= rng_state << 13; rng_state ^= rng_state >> 7; rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 11);
}

int main(int argc, char **argv) {
    if (argc < 9) { fprintf(stderr, "usage: vcore mem_in mem_out jobs latency stall seed outstanding max_cycles\n"); return 2; }
    std::ifstream fin(argv[1], std::ios::binary);
    std::vector<uint8_t> mem((std::istreambuf_iterator<char>(fin)), std::istreambuf_iterator<char>());
    uint64_t latency = strtoull(argv[4], 0, 10), stall = strtoull(argv[5], 0, 10);
    rng_state = strtoull(argv[6], 0, 10) * 2654435761ull + 88172645463325252ull;
    uint64_t outstanding = strtoull(argv[7], 0, 10), max_cycles = strtoull(argv[8], 0, 10);
    std::ifstream jf(argv[3]);
    VerilatedContext ctx;
    Vcore *top = new Vcore{&ctx};
    uint64_t cycle = 0, total = 0;
    auto t0 = std::chrono::steady_clock::now();
    std::deque<Req> rq, wq;
    auto stalled = [&]() { return stall > 0 && (rnd() % 100) < stall; };
    auto tick = [&](bool start, bool reset) {
        top->start = start; top->reset = reset;
        top->rd_req_ready = !reset && rq.size() < outstanding && !stalled();
        bool have = !rq.empty() && rq.front().ready_at <= cycle;
        bool dv = have && !reset && !stalled();
        top->rd_data_valid = dv;
        uint64_t word = 0;
        if (have) {
            uint64_t a = rq.front().addr;
            for (int b = 0; b < 8; b++) if (a + b < mem.size()) word |= (uint64_t)mem[a + b] << (8 * b);
        }
        top->rd_data = word;
        top->wr_req_ready = !reset && !stalled();
        top->wr_data_ready = !reset && !wq.empty() && !stalled();
        top->clock = 0; top->eval();
        bool rq_hs = top->rd_req_valid && top->rd_req_ready;
        bool rd_hs = top->rd_data_valid && top->rd_data_ready;
        bool wq_hs = top->wr_req_valid && top->wr_req_ready;
        bool wd_hs = top->wr_data_valid && top->wr_data_ready;
        uint64_t ra = top->rd_req_addr, rl = top->rd_req_len, wa = top->wr_req_addr, wl = top->wr_req_len;
        uint64_t wdat = top->wr_data; unsigned strb = top->wr_strb;
        top->clock = 1; top->eval();
        cycle++; total++;
        if (rd_hs) { rq.front().addr += 8; if (--rq.front().len == 0) rq.pop_front(); }
        if (rq_hs) rq.push_back(Req{ra, rl, cycle + latency});
        if (wd_hs) {
            Req &w = wq.front();
            for (int b = 0; b < 8; b++)
                if (((strb >> b) & 1) && w.addr + b < mem.size()) mem[w.addr + b] = (uint8_t)(wdat >> (8 * b));
            w.addr += 8; if (--w.len == 0) wq.pop_front();
        }
        if (wq_hs) wq.push_back(Req{wa, wl, 0});
        if (reset) { rq.clear(); wq.clear(); }
    };
    for (int i = 0; i < 4; i++) tick(false, true);
    uint64_t a[8], p[8], reset_after; int job = 0;
    while (true) {
        bool ok = true;
        for (int i = 0; i < 8 && ok; i++) ok = (bool)(jf >> a[i]);
        for (int i = 0; i < 8 && ok; i++) ok = (bool)(jf >> p[i]);
        if (!ok || !(jf >> reset_after)) break;
        top->arg0 = a[0]; top->arg1 = a[1]; top->arg2 = a[2]; top->arg3 = a[3];
        top->arg4 = a[4]; top->arg5 = a[5]; top->arg6 = a[6]; top->arg7 = a[7];
        top->ptr0 = p[0]; top->ptr1 = p[1]; top->ptr2 = p[2]; top->ptr3 = p[3];
        top->ptr4 = p[4]; top->ptr5 = p[5]; top->ptr6 = p[6]; top->ptr7 = p[7];
        // the arguments are stable a cycle before start, as the shell's registers are
        tick(false, false);
        cycle = 0;
        tick(true, false);
        bool done = top->done;
        while (!done && cycle < max_cycles) {
            if (reset_after && cycle >= reset_after) break;
            tick(false, false);
            done = top->done;
        }
        uint64_t c = cycle;
        if (!done) for (int i = 0; i < 4; i++) tick(false, true);
        else tick(false, false);
        printf("job %d cycles %llu done %d\n", job++, (unsigned long long)c, done ? 1 : 0);
    }
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    printf("speed %.0f\n", secs > 0 ? total / secs : 0.0);
    std::ofstream fout(argv[2], std::ios::binary);
    fout.write((const char *)mem.data(), mem.size());
    top->final();
    delete top;
    return 0;
}
"#;
