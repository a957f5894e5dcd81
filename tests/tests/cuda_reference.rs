//! The CUDA backend against the reference vectors PyTorch and transformers made in float64
//! (tests/data/reference, read relative to this crate's folder), in both storage precisions
//! (each test loops over bf16 and f16). Attention: o and lse within the precision's tolerance
//! (bf16 1e-2, f16 5e-3). Routing: ids, counts and weights against the file where rounding the
//! logits to the storage (what the GPU sees) keeps the file's choice, losses within 1e-2.
//! Without a usable GPU each test prints "skipped: <reason>" and returns.

use std::path::Path;
use std::time::Duration;

use ndarray::{ArrayD, IxDyn};
use safetensors::{Dtype, SafeTensors};
use tandem::backend::cuda::{CudaBackend, CudaDType, unavailable_reason};
use tandem::backend::{Backend, DeviceStorage};
use tandem::ops::{AttentionParams, MoeRouteParams};
use tandem::tensor::rel_error;
use tandem::{Op, Tensor};

/// Device 0 once per storage precision, outputs poisoned.
fn gpus() -> Vec<(CudaDType, CudaBackend)> {
    if let Some(r) = unavailable_reason(&tandem_tests::cuda::options(CudaDType::default())) {
        tandem_tests::skip(tandem_tests::Need::Gpu, &r);
        return Vec::new();
    }
    CudaDType::ALL
        .into_iter()
        .map(|dtype| {
            let opts = tandem_tests::cuda::options(dtype);
            (dtype, CudaBackend::open(0, opts).expect("device 0 opens"))
        })
        .collect()
}

fn load(name: &str) -> Vec<u8> {
    let p = Path::new("data/reference").join(format!("{name}.safetensors"));
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn f64_of(st: &SafeTensors<'_>, name: &str) -> ArrayD<f64> {
    let t = st.tensor(name).unwrap_or_else(|e| panic!("{name}: {e}"));
    let v: Vec<f64> = match t.dtype() {
        Dtype::F64 => bytemuck_f64(t.data()),
        Dtype::I64 => t
            .data()
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")) as f64)
            .collect(),
        Dtype::F32 => t
            .data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")) as f64)
            .collect(),
        d => panic!("{name}: unexpected dtype {d:?}"),
    };
    ArrayD::from_shape_vec(IxDyn(t.shape()), v).expect("shape")
}

fn bytemuck_f64(b: &[u8]) -> Vec<f64> {
    b.chunks_exact(8)
        .map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect()
}

fn run(be: &CudaBackend, op: &Op, ins: &[Tensor]) -> Vec<Tensor> {
    let st: Vec<DeviceStorage> = ins.iter().map(|t| be.upload(t).expect("upload")).collect();
    let refs: Vec<&DeviceStorage> = st.iter().collect();
    let l = be.launch(op, &refs).expect("launch");
    l.done
        .wait(Duration::from_secs(60), op.name())
        .expect("done");
    l.outputs
        .iter()
        .map(|s| be.download(s).expect("download"))
        .collect()
}

#[test]
fn cuda_attention_matches_reference_files() {
    for (dt, be) in gpus() {
        attention_files(&be, dt);
    }
}

fn attention_files(be: &CudaBackend, dt: CudaDType) {
    for (i, causal) in [(0, true), (1, false), (2, true)] {
        let bytes = load(&format!("attention_{i}"));
        let st = SafeTensors::deserialize(&bytes).expect("safetensors");
        let q = f64_of(&st, "q");
        let k = f64_of(&st, "k");
        let v = f64_of(&st, "v");
        let o = f64_of(&st, "o");
        let lse = f64_of(&st, "lse");
        let t = |a: &ArrayD<f64>| Tensor::from_f32(a.mapv(|x| x as f32));
        let op = Op::Attention(AttentionParams {
            causal,
            scale: None,
        });
        let out = run(be, &op, &[t(&q), t(&k), t(&v)]);
        let eo = rel_error(&out[0].to_f64(), &o);
        let el = rel_error(&out[1].to_f64(), &lse);
        println!("{dt} attention_{i}: o rel err {eo:.2e}, lse rel err {el:.2e}");
        let tol = dt.tolerance();
        assert!(
            eo < tol && el < tol,
            "{dt} attention_{i}: o {eo:.2e} lse {el:.2e} (tolerance {tol:.0e})"
        );
    }
}

#[test]
fn cuda_routing_matches_reference_files() {
    for (dt, be) in gpus() {
        routing_files(&be, dt);
    }
}

fn routing_files(be: &CudaBackend, dt: CudaDType) {
    for i in 0..2 {
        let bytes = load(&format!("moe_route_{i}"));
        let st = SafeTensors::deserialize(&bytes).expect("safetensors");
        let logits = f64_of(&st, "logits");
        let ids = f64_of(&st, "topk_ids");
        let w = f64_of(&st, "topk_weights_renorm");
        let counts = f64_of(&st, "expert_counts");
        let aux = f64_of(&st, "aux_loss");
        let z = f64_of(&st, "z_loss");
        let k = ids.shape()[1];
        let op = Op::MoeRoute(MoeRouteParams {
            top_k: k,
            renormalize: true,
            block_size: 16,
        });
        let lt = Tensor::from_f32(logits.mapv(|x| x as f32));
        // What the GPU sees: logits in its storage. Where that keeps the file's choice, ids
        // must match.
        let rounded = Tensor::from_f32(logits.mapv(|x| match dt {
            CudaDType::Bf16 => half::bf16::from_f64(x).to_f32(),
            CudaDType::F16 => half::f16::from_f64(x).to_f32(),
        }));
        let ref_rounded = op.reference(&[rounded.to_f64()]).expect("reference");
        let out = run(be, &op, &[lt]);
        assert_eq!(
            out[0].to_f64(),
            ref_rounded[0],
            "{dt} moe_route_{i}: ids vs the reference on {dt} logits"
        );
        if ref_rounded[0] == ids {
            assert_eq!(out[0].to_f64(), ids, "moe_route_{i}: ids vs file");
            assert_eq!(out[2].to_f64(), counts, "moe_route_{i}: counts vs file");
            let ew = rel_error(&out[1].to_f64(), &w);
            println!("moe_route_{i}: weights rel err {ew:.2e}");
            assert!(ew < 1e-2);
        } else {
            println!(
                "{dt} moe_route_{i}: rounding to {dt} changes the file's choice; ids checked against the rounded reference"
            );
        }
        let ea = rel_error(&out[5].to_f64(), &aux);
        let ez = rel_error(&out[6].to_f64(), &z);
        println!("moe_route_{i}: aux rel err {ea:.2e}, z rel err {ez:.2e}");
        assert!(ea < 1e-2 && ez < 1e-2);
    }
}
