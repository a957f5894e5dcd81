//! Memory budgets and transfer accounting, on a device that keeps its data in host memory
//! and computes with the CPU backend (so they run without a GPU or a simulator).

use std::sync::Arc;

use crate::backend::cpu::CpuBackend;
use crate::backend::{
    Backend, DeviceId, DeviceInfo, DeviceKind, DeviceRegistry, DeviceStorage, Launch, Support,
};
use crate::dtype::DType;
use crate::error::{ErrorKind, Result};
use crate::exec::{ExecOptions, Executor, fetch};
use crate::graph::Graph;
use crate::ops::{Activation, LinearParams, MoeExpertsParams, Op, RmsNormParams};
use crate::options::MemoryLimits;
use crate::plan::{BackendChoice, plan};
use crate::tensor::{Tensor, TensorMeta};

/// A device of its own id whose storage is host tensors and whose ops the CPU computes: fast
/// on paper, so auto placement prefers it. It says it keeps `derived` bytes beside each of
/// the MoE experts' weights (`gate_up`, `down`), as the CUDA backend does under FP8 experts.
#[derive(Debug)]
struct HostDevice {
    info: DeviceInfo,
    cpu: CpuBackend,
    derived: u64,
}

const DEV: DeviceId = DeviceId {
    kind: DeviceKind::FpgaXrt,
    index: 0,
};

impl Backend for HostDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }
    fn supports(&self, op: &Op, inputs: &[TensorMeta]) -> Support {
        self.cpu.supports(op, inputs)
    }
    fn derived_weight_bytes(&self, op: &Op, _inputs: &[TensorMeta], input: usize) -> u64 {
        match op {
            Op::MoeExperts(_) if input == 5 || input == 6 => self.derived,
            _ => 0,
        }
    }
    fn upload(&self, host: &Tensor) -> Result<DeviceStorage> {
        Ok(DeviceStorage::new(self.id(), host.meta(), host.clone()))
    }
    fn download(&self, storage: &DeviceStorage) -> Result<Tensor> {
        storage.host_tensor("host device").cloned()
    }
    fn launch(&self, op: &Op, inputs: &[&DeviceStorage]) -> Result<Launch> {
        let mut l = self.cpu.launch(op, inputs)?;
        l.outputs = l
            .outputs
            .iter()
            .map(|o| {
                Ok(DeviceStorage::new(
                    self.id(),
                    o.meta.clone(),
                    o.host_tensor("CPU")?.clone(),
                ))
            })
            .collect::<Result<_>>()?;
        Ok(l)
    }
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }
}

fn registry(limits: &str) -> Result<DeviceRegistry> {
    registry_of(1, limits)
}

/// The CPU and `n` host devices (`fpga:0`, `fpga:1`, ...), with `limits`.
fn registry_of(n: usize, limits: &str) -> Result<DeviceRegistry> {
    registry_derived(&vec![0; n], limits)
}

/// The CPU and a host device per entry of `derived` (`fpga:0`, `fpga:1`, ...), each keeping
/// that many bytes beside each MoE expert weight, with `limits`.
fn registry_derived(derived: &[u64], limits: &str) -> Result<DeviceRegistry> {
    let mut r = DeviceRegistry::cpu_only();
    for (index, &derived) in derived.iter().enumerate() {
        r.add(Arc::new(HostDevice {
            info: DeviceInfo {
                id: DeviceId { index, ..DEV },
                name: "host device".into(),
                memory_bytes: 1 << 40,
                peak_flops: 1e18,
                peak_bandwidth: 1e15,
                compute_dtype: DType::F32,
                details: Vec::new(),
            },
            cpu: CpuBackend::new(),
            derived,
        }));
    }
    r.set_memory_limits(MemoryLimits::parse(limits, "--memory-limit")?);
    Ok(r)
}

/// Deterministic values in [-1, 1) (a 64-bit LCG), different per `seed`.
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// Side of the square tensors: each f32 tensor is `U` bytes.
const N: usize = 256;
const U: u64 = (N * N * 4) as u64;

/// x [N, N] through `layers` linears `layers.{i}.lin` with weights [N, N].
fn chain(layers: usize) -> Result<Graph> {
    chain_rows(layers, N)
}

/// [`chain`] with `rows` tokens: activations of `rows x N`, weights of `N x N` (`U`).
fn chain_rows(layers: usize, rows: usize) -> Result<Graph> {
    let mut g = Graph::default();
    g.constant("x", Tensor::from_vec_f32(&[rows, N], values(rows * N, 1))?);
    let mut prev = "x".to_string();
    for i in 0..layers {
        let w = format!("model.layers.{i}.w");
        g.param(
            &w,
            Tensor::from_vec_f32(&[N, N], values(N * N, 10 + i as u64))?,
        );
        let lin = Op::Linear(LinearParams {
            act: Activation::None,
            bias: false,
            f32_out: false,
        });
        prev = g.add(&format!("layers.{i}.lin"), lin, &[&prev, &w])[0].clone();
    }
    g.outputs = vec![prev];
    Ok(g)
}

fn cpu_result(g: &Graph) -> Result<Vec<Tensor>> {
    let reg = DeviceRegistry::cpu_only();
    let p = plan(g, &reg, BackendChoice::Only(DeviceKind::Cpu))?;
    let e = Executor::new().execute(g, &p, &reg, &ExecOptions::default())?;
    fetch(&e, &reg, &g.outputs)
}

fn bits(t: &[Tensor]) -> Vec<Vec<u32>> {
    t.iter()
        .map(|t| t.to_f64().iter().map(|&v| (v as f32).to_bits()).collect())
        .collect()
}

#[test]
fn eviction_under_a_tight_limit_keeps_results_correct() -> Result<()> {
    let g = chain(4)?;
    let want = bits(&cpu_result(&g)?);
    // Room for five tensors: the four outputs the device keeps and one fetched weight or
    // input at a time, so the weights cannot all stay resident.
    let reg = registry(&format!("fpga:0={}", 5 * U))?;
    let p = plan(&g, &reg, BackendChoice::Only(DeviceKind::FpgaXrt))?;
    assert!(p.placements.iter().all(|p| p.device == DEV));
    let ex = Executor::new();
    for round in 0..3 {
        let e = ex.execute(&g, &p, &reg, &ExecOptions::default())?;
        assert_eq!(bits(&fetch(&e, &reg, &g.outputs)?), want, "round {round}");
        let u = reg.memory().usage(DEV);
        assert!(u.peak <= 5 * U, "round {round}: peak {} > limit", u.peak);
        // Later rounds fetch again the weights evicted before.
        if round > 0 {
            assert!(
                e.resident_bytes() >= U,
                "round {round}: nothing fetched again"
            );
        }
        drop(e);
        reg.memory().reset_peaks();
    }
    let u = reg.memory().usage(DEV);
    assert!(u.evictions >= 3, "{u:?}");
    assert_eq!(u.evicted_bytes, u.evictions * U);
    // Whatever stays resident is within the limit; the run's outputs are gone.
    assert!(u.used <= 5 * U, "{u:?}");
    Ok(())
}

#[test]
fn a_limit_below_one_ops_working_set_is_an_error_naming_it() -> Result<()> {
    let g = chain(2)?;
    let reg = registry(&format!("fpga:0={}", 2 * U))?;
    let e = plan(&g, &reg, BackendChoice::Only(DeviceKind::FpgaXrt)).expect_err("too small");
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    let m = e.to_string();
    for want in [
        "node 'layers.0.lin' (linear)",
        "on fpga:0 it needs 768.0 KiB",
        "786432 bytes",
        "limit of 512.0 KiB (524288 bytes)",
        "--memory-limit",
    ] {
        assert!(m.contains(want), "{want:?} not in: {m}");
    }
    // In auto placement the CPU (no limit) takes it instead.
    let p = plan(&g, &reg, BackendChoice::Auto)?;
    assert!(p.placements.iter().all(|p| p.device == DeviceId::CPU));
    // With the CPU limited too, no device fits: the error names both.
    let reg = registry(&format!("fpga:0={},cpu={}", 2 * U, U))?;
    let m = plan(&g, &reg, BackendChoice::Auto)
        .expect_err("nowhere")
        .to_string();
    assert!(
        m.contains("on cpu it needs") && m.contains("on fpga:0 it needs"),
        "{m}"
    );
    Ok(())
}

#[test]
fn a_model_too_big_for_one_device_is_split_by_layer() -> Result<()> {
    let g = chain(4)?;
    let want = bits(&cpu_result(&g)?);
    // Unlimited: every layer on the fast device.
    let p = plan(&g, &registry("")?, BackendChoice::Auto)?;
    assert!(p.placements.iter().all(|p| p.device == DEV));
    // Room for the outputs of two layers beside one fetched weight and input.
    let reg = registry(&format!("fpga:0={}", 7 * U / 2))?;
    let p = plan(&g, &reg, BackendChoice::Auto)?;
    let on: Vec<String> = p.placements.iter().map(|p| p.device.to_string()).collect();
    assert_eq!(on, ["fpga:0", "fpga:0", "cpu", "cpu"]);
    let note = p
        .warnings
        .iter()
        .find(|w| w.contains("split across devices"))
        .expect("the plan says it split");
    assert!(note.contains("fpga:0 (limit 896.0 KiB)"), "{note}");
    assert!(
        note.contains("layers 2, 3 (2 nodes) placed on cpu"),
        "{note}"
    );
    let planned = p.memory.iter().find(|m| m.device == DEV).expect("planned");
    assert!(planned.peak_bytes <= planned.limit_bytes);
    let e = Executor::new().execute(&g, &p, &reg, &ExecOptions::default())?;
    assert_eq!(bits(&fetch(&e, &reg, &g.outputs)?), want);
    assert!(reg.memory().usage(DEV).peak <= 7 * U / 2);
    Ok(())
}

#[test]
fn weights_that_would_evict_go_to_a_second_device_with_room() -> Result<()> {
    // 16-token activations (U / 16) through 4 layers of U-byte weights; each device holds 2.5 U:
    // two layers' weights stay resident on one, so layers 2 and 3 go to the second device
    // instead of evicting layers 0 and 1 there on every run.
    let g = chain_rows(4, 16)?;
    let want = bits(&cpu_result(&g)?);
    let dev1 = DeviceId { index: 1, ..DEV };
    let limit = 5 * U / 2;
    let reg = registry_of(2, &format!("fpga:0={limit},fpga:1={limit}"))?;
    let only = BackendChoice::Only(DeviceKind::FpgaXrt);
    let p = plan(&g, &reg, only)?;
    let on: Vec<String> = p.placements.iter().map(|p| p.device.to_string()).collect();
    assert_eq!(on, ["fpga:0", "fpga:0", "fpga:1", "fpga:1"]);
    let why = p.placements[2].reason.to_string();
    assert!(
        why.contains("fpga:0: evicts (layer 2's weights (256.0 KiB) would not stay resident"),
        "{why}"
    );
    assert!(
        p.warnings
            .iter()
            .any(|w| w.contains("split across devices")),
        "{:?}",
        p.warnings
    );
    assert!(
        p.warnings
            .iter()
            .any(|w| w == "memory: layers by device: fpga:0 0-1, fpga:1 2-3"),
        "{:?}",
        p.warnings
    );
    let ex = Executor::new();
    for _ in 0..2 {
        let e = ex.execute(&g, &p, &reg, &ExecOptions::default())?;
        assert_eq!(bits(&fetch(&e, &reg, &g.outputs)?), want);
    }
    for d in [DEV, dev1] {
        let u = reg.memory().usage(d);
        assert_eq!(u.evictions, 0, "{d}: {u:?}");
        assert!(u.peak <= limit, "{d}: {u:?}");
    }
    // One device of that kind: evicting is the only way, and the plan takes it.
    let reg = registry_of(1, &format!("fpga:0={limit}"))?;
    let p = plan(&g, &reg, only)?;
    assert!(p.placements.iter().all(|p| p.device == DEV));
    let ex = Executor::new();
    for _ in 0..2 {
        let e = ex.execute(&g, &p, &reg, &ExecOptions::default())?;
        assert_eq!(bits(&fetch(&e, &reg, &g.outputs)?), want);
    }
    assert!(reg.memory().usage(DEV).evictions > 0);
    Ok(())
}

#[test]
fn transfer_accounting_is_exact() -> Result<()> {
    // x -> lin0 (device) -> norm (CPU) -> lin1 (device): x and w0 go up, lin0's output comes
    // down, the norm's output and w1 go up. Sizes differ so a wrong tensor would show.
    let (t, d) = (48usize, 80usize);
    let f = 4u64;
    let mut g = Graph::default();
    g.constant("x", Tensor::from_vec_f32(&[t, d], values(t * d, 1))?);
    g.param("w0", Tensor::from_vec_f32(&[N, d], values(N * d, 2))?);
    g.param("w1", Tensor::from_vec_f32(&[d, N], values(N * d, 3))?);
    g.param("g", Tensor::from_vec_f32(&[N], values(N, 4))?);
    let lin = || {
        Op::Linear(LinearParams {
            act: Activation::None,
            bias: false,
            f32_out: false,
        })
    };
    let a = g.add("lin0", lin(), &["x", "w0"]);
    let n = g.add("norm", Op::RmsNorm(RmsNormParams::default()), &[&a[0], "g"]);
    let b = g.add("lin1", lin(), &[&n[0], "w1"]);
    g.outputs = b.clone();
    let reg = registry("")?;
    let mut p = plan(&g, &reg, BackendChoice::Only(DeviceKind::FpgaXrt))?;
    p.placements[1].device = DeviceId::CPU;
    let ex = Executor::new();
    let e = ex.execute(&g, &p, &reg, &ExecOptions::default())?;
    let bytes: Vec<(u64, u64)> = e
        .runs
        .iter()
        .map(|r| (r.transfer_bytes, r.resident_bytes))
        .collect();
    let (xb, w0b, ab, nb, w1b) = (
        t as u64 * d as u64 * f,
        N as u64 * d as u64 * f,
        t as u64 * N as u64 * f,
        t as u64 * N as u64 * f,
        d as u64 * N as u64 * f,
    );
    // The CPU's gamma is on the host already: nothing moved for it.
    assert_eq!(bytes, [(xb, w0b), (ab, 0), (nb, w1b)]);
    let u = reg.memory().usage(DEV);
    assert_eq!(
        (u.uploaded, u.downloaded, u.peer),
        (xb + w0b + nb + w1b, ab, 0)
    );
    // The device holds what it was sent and wrote (x, w0, lin0's output, norm's output, w1,
    // lin1's output), each charged at its size.
    let out = t as u64 * d as u64 * f;
    assert_eq!(u.used, xb + w0b + ab + nb + w1b + out);
    assert_eq!(u.peak, u.used);
    // The run's buffers go with the execution; the resident weights stay.
    drop(e);
    assert_eq!(reg.memory().usage(DEV).used, w0b + w1b);
    // A second execution moves the inputs again but not the weights.
    let e = ex.execute(&g, &p, &reg, &ExecOptions::default())?;
    let again: Vec<(u64, u64)> = e
        .runs
        .iter()
        .map(|r| (r.transfer_bytes, r.resident_bytes))
        .collect();
    assert_eq!(again, [(xb, 0), (ab, 0), (nb, 0)]);
    Ok(())
}

#[test]
fn a_derived_form_is_charged_evicts_for_room_and_is_given_back() -> Result<()> {
    let g = chain(4)?;
    let reg = registry(&format!("fpga:0={}", 5 * U))?;
    let p = plan(&g, &reg, BackendChoice::Only(DeviceKind::FpgaXrt))?;
    // The run's replicas stay while `_e` lives; the weights' can be evicted.
    let _e = Executor::new().execute(&g, &p, &reg, &ExecOptions::default())?;
    let before = reg.memory().usage(DEV);
    assert!(before.used > 0, "{before:?}");
    // A form as large as what is free plus one replica: a weight goes to make room.
    let mem = reg.memory().clone();
    let c = mem.charge_derived(DEV, 1 << 40, 5 * U - before.used + U, "a test form")?;
    let during = reg.memory().usage(DEV);
    assert!(during.used <= 5 * U, "{during:?}");
    assert!(during.evictions > before.evictions, "{during:?}");
    // Past the limit even with nothing left to evict: an error naming the form and the limit.
    let err = mem
        .charge_derived(DEV, 1 << 40, 5 * U, "a second test form")
        .expect_err("over the limit");
    assert_eq!(err.kind(), ErrorKind::ResourceExhausted);
    let msg = err.to_string();
    assert!(msg.contains("a second test form"), "{msg}");
    assert!(msg.contains("limit"), "{msg}");
    let held = reg.memory().usage(DEV).used;
    drop(c);
    assert_eq!(
        reg.memory().usage(DEV).used,
        held - (5 * U - before.used + U)
    );
    Ok(())
}

/// MoE sizes of [`moe_layers`]: tokens, hidden, experts, top-k, ffn.
const MT: usize = 4;
const MH: usize = 64;
const ME: usize = 4;
const MK: usize = 2;
const MF: usize = 32;
/// Bytes of one layer's expert weights: gate_up [E, 2F, H] and down [E, H, F] in f32.
const MW: u64 = (ME * 2 * MF * MH * 4 + ME * MH * MF * 4) as u64;
/// Bytes of one experts output [T, H] in f32.
const MY: u64 = (MT * MH * 4) as u64;
/// Bytes the test device derives from each expert weight (its "FP8 copies").
const MD: u64 = 16 << 10;

/// `layers` MoE layers `layers.{i}.experts{j}`, `per_layer` experts nodes a layer chained
/// through their outputs, the nodes of a layer reading the same weights
/// (`model.layers.{i}.gate_up`, `.down`); the routing is constants shared by all.
fn moe_layers(layers: usize, per_layer: usize) -> Result<Graph> {
    let mut g = Graph::default();
    g.constant("x", Tensor::from_vec_f32(&[MT, MH], values(MT * MH, 1))?);
    let ids: Vec<i32> = (0..MT * MK).map(|i| (i % ME) as i32).collect();
    g.constant("ids", Tensor::from_vec_i32(&[MT, MK], ids)?);
    g.constant("w", Tensor::from_vec_f32(&[MT, MK], vec![0.5; MT * MK])?);
    g.constant(
        "sorted",
        Tensor::from_vec_i32(&[MT * MK], (0..(MT * MK) as i32).collect())?,
    );
    let offsets: Vec<i32> = (0..=ME).map(|e| (e * MT * MK / ME) as i32).collect();
    g.constant("offsets", Tensor::from_vec_i32(&[ME + 1], offsets)?);
    let mut prev = "x".to_string();
    for i in 0..layers {
        let (up, down) = (
            format!("model.layers.{i}.gate_up"),
            format!("model.layers.{i}.down"),
        );
        g.param(
            &up,
            Tensor::from_vec_f32(&[ME, 2 * MF, MH], values(ME * 2 * MF * MH, 20 + i as u64))?,
        );
        g.param(
            &down,
            Tensor::from_vec_f32(&[ME, MH, MF], values(ME * MH * MF, 40 + i as u64))?,
        );
        for j in 0..per_layer {
            let ins = [prev.as_str(), "ids", "w", "sorted", "offsets", &up, &down];
            let op = Op::MoeExperts(MoeExpertsParams {});
            prev = g.add(&format!("layers.{i}.experts{j}"), op, &ins)[0].clone();
        }
    }
    g.outputs = vec![prev];
    Ok(g)
}

#[test]
fn derived_weight_copies_are_counted_once_with_the_resident_weights() -> Result<()> {
    // One layer, two experts nodes reading the same weights: the copies the device derives
    // from them are resident once, and in the peak (one node's inputs) once.
    let g = moe_layers(1, 2)?;
    let only = BackendChoice::Only(DeviceKind::FpgaXrt);
    let planned = |derived: u64| -> Result<crate::plan::PlannedMemory> {
        let p = plan(&g, &registry_derived(&[derived], "")?, only)?;
        assert!(p.placements.iter().all(|p| p.device == DEV));
        p.memory
            .into_iter()
            .find(|m| m.device == DEV)
            .ok_or_else(|| crate::error::Error::Internal("no planned memory".into()))
    };
    let without = planned(0)?;
    assert_eq!((without.resident_bytes, without.derived_bytes), (MW, 0));
    let with = planned(MD)?;
    assert_eq!(with.resident_bytes, MW + 2 * MD);
    assert_eq!(with.derived_bytes, 2 * MD);
    assert_eq!(with.peak_bytes, without.peak_bytes + 2 * MD);
    // The peak: both outputs held, the second node's inputs (x's successor is held already)
    // fetched with the copies.
    let routing = (MT * MK * 4 * 3 + (ME + 1) * 4) as u64;
    assert_eq!(with.peak_bytes, 2 * MY + routing + MW + 2 * MD);
    Ok(())
}

#[test]
fn weights_that_fit_only_without_their_derived_copies_go_elsewhere() -> Result<()> {
    // Two layers; fpga:0 derives MD bytes beside each expert weight, fpga:1 nothing. The
    // limit holds both layers' weights but not their copies too.
    let limit = 2 * MY + 2 * MW + 3 * MD;
    let limits = format!("fpga:0={limit},fpga:1={limit}");
    let g = moe_layers(2, 1)?;
    let only = BackendChoice::Only(DeviceKind::FpgaXrt);
    let on = |p: &crate::plan::Plan| -> Vec<String> {
        p.placements.iter().map(|p| p.device.to_string()).collect()
    };
    // Without copies both layers stay on fpga:0.
    let p = plan(&g, &registry_derived(&[0, 0], &limits)?, only)?;
    assert_eq!(on(&p), ["fpga:0", "fpga:0"]);
    // With them, layer 1 goes to fpga:1, and the reason says the copies are what did not fit.
    let p = plan(&g, &registry_derived(&[MD, 0], &limits)?, only)?;
    assert_eq!(on(&p), ["fpga:0", "fpga:1"]);
    let why = p.placements[1].reason.to_string();
    for want in [
        "fpga:0: evicts (layer 1's weights (128.0 KiB, of which 32.0 KiB are derived copies \
         such as FP8 expert weights) would not stay resident",
        "the derived copies are what does not fit (the weights alone would)",
    ] {
        assert!(why.contains(want), "{want:?} not in: {why}");
    }
    let m0 = p.memory.iter().find(|m| m.device == DEV).expect("fpga:0");
    assert_eq!((m0.resident_bytes, m0.derived_bytes), (MW + 2 * MD, 2 * MD));
    assert!(m0.peak_bytes <= m0.limit_bytes);
    Ok(())
}

#[test]
fn a_limit_under_the_working_set_with_its_derived_copies_is_an_error_naming_them() -> Result<()> {
    // The node's inputs and outputs fit the limit; with the copies derived from its weights
    // they do not.
    let g = moe_layers(1, 1)?;
    let only = BackendChoice::Only(DeviceKind::FpgaXrt);
    let limit = MY + MW + 20 * 1024;
    let limits = format!("fpga:0={limit}");
    let p = plan(&g, &registry_derived(&[0], &limits)?, only)?;
    assert!(p.placements.iter().all(|p| p.device == DEV));
    let e = plan(&g, &registry_derived(&[MD], &limits)?, only).expect_err("too big");
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    let m = e.to_string();
    // x, the routing, the weights and their copies, the output.
    let routing = (MT * MK * 4 * 3 + (ME + 1) * 4) as u64;
    let need = 2 * MY + routing + MW + 2 * MD;
    for want in [
        "node 'layers.0.experts0' (moe_experts)".to_string(),
        format!(
            "on fpga:0 it needs 130.1 KiB (inputs + outputs, {need} bytes, of which 32.0 KiB are \
             derived copies such as FP8 expert weights), over the limit of 117.0 KiB"
        ),
        "--memory-limit".to_string(),
    ] {
        assert!(m.contains(&want), "{want:?} not in: {m}");
    }
    Ok(())
}
