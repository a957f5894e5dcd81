#!/usr/bin/env python3
"""Runs a model folder with transformers' MixtralForCausalLM on the token ids of a
`tandem run --weights DIR --save OUT` and compares its logits with tandem's.

    tandem run --weights tests/data/models/mixtral-tiny --seq-len 16 --save /tmp/tiny.safetensors
    python3 tests/data/models/compare_transformers.py tests/data/models/mixtral-tiny /tmp/tiny.safetensors

Needs torch and transformers (not installed on the build machine: run it where they are).
Prints the relative error ||tandem - transformers|| / ||transformers|| (float64 model) and
exits 1 above 1e-4.
"""
import json
import struct
import sys

import numpy as np
import torch
from transformers import MixtralForCausalLM

DTYPES = {"F32": np.float32, "I32": np.int32, "F16": np.float16, "I64": np.int64}


def read_safetensors(path):
    """The tensors of a safetensors file as numpy arrays (f32, f16, i32, i64)."""
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        raw = data[8 + n + a : 8 + n + b]
        out[name] = np.frombuffer(raw, dtype=DTYPES[info["dtype"]]).reshape(info["shape"])
    return out


def main():
    folder, saved = sys.argv[1], sys.argv[2]
    t = read_safetensors(saved)
    ids = torch.from_numpy(t["input_ids"].astype(np.int64))
    ours = t["output"].astype(np.float64)  # [B, T, V]
    b, s, _ = ours.shape
    model = MixtralForCausalLM.from_pretrained(folder, torch_dtype=torch.float64).eval()
    with torch.no_grad():
        ref = model(ids.reshape(b, s)).logits.numpy()
    err = np.linalg.norm(ours - ref) / np.linalg.norm(ref)
    print(f"logits [{b}, {s}, {ref.shape[-1]}]: tandem vs transformers rel. error {err:.3e}")
    sys.exit(0 if err < 1e-4 else 1)


if __name__ == "__main__":
    main()
