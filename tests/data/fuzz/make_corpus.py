#!/usr/bin/env python3
"""Writes the seed corpus of tests/tests/fuzz_corpus.rs (run from this folder; standard library
only). Each file is one input of the kinds that broke or strained tandem (issue 12): huge and
zero dims, tiny files asking for unbounded work, NaN/Inf values, out-of-range history entries,
truncated and garbled files. Files are written once; add new cases below (or drop a file found
by the proptest harnesses into the target's folder) and commit them."""

import json
import math
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
REF = os.path.join(HERE, "..", "reference")


def put(target, name, data):
    d = os.path.join(HERE, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# ---- safetensors --------------------------------------------------------------------------

SIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I8": 1}


def st(tensors, raw_header=None):
    """tensors: list of (name, dtype, shape, data bytes or None: zeros of the right size)."""
    header, blob = {}, b""
    for name, dtype, shape, data in tensors:
        if data is None:
            n = 1
            for s in shape:
                n *= s
            data = bytes(n * SIZE[dtype])
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(blob), len(blob) + len(data)]}
        blob += data
    h = raw_header if raw_header is not None else json.dumps(header, separators=(",", ":"))
    hb = h.encode()
    hb += b" " * (-len(hb) % 8)
    return struct.pack("<Q", len(hb)) + hb + blob


def raw(header_obj, blob=b""):
    return st([], raw_header=json.dumps(header_obj))


def f32s(vals):
    return struct.pack("<%df" % len(vals), *vals)


def t(name, dtype, shape, offsets):
    return {name: {"dtype": dtype, "shape": shape, "data_offsets": offsets}}


S = "safetensors"
big = 9223372036854775807
# huge dims, no data
put(S, "huge_dim_i64max.safetensors", raw(t("x", "F32", [big, 1], [0, 0])))
put(S, "huge_dims_2x2p32.safetensors", raw(t("x", "F32", [4294967296, 4294967296], [0, 0])))
put(S, "huge_dims_product_wraps.safetensors", raw(t("x", "F32", [4294967296, 4294967296, 16], [0, 0])))
# zero dims with huge others (valid files: zero elements)
put(S, "zero_dim_huge_other.safetensors", st([("x", "F32", [0, big], b"")]))
planes = 2 ** 40
put(S, "attention_2p40_1_0_16.safetensors", st([
    ("q", "F32", [planes, 1, 0, 16], b""),
    ("k", "F32", [planes, 1, 0, 16], b""),
    ("v", "F32", [planes, 1, 0, 16], b""),
]))
put(S, "attention_zero_keys.safetensors", st([
    ("q", "F32", [1, 2, 4, 8], None),
    ("k", "F32", [1, 2, 0, 8], b""),
    ("v", "F32", [1, 2, 0, 8], b""),
]))
put(S, "routing_logits_0x2p26.safetensors", st([("logits", "F32", [0, 2 ** 26], b"")]))
put(S, "routing_logits_1x2p26.safetensors", raw(t("logits", "F32", [1, 2 ** 26], [0, 4])))
# non-finite values
nan, inf = float("nan"), float("inf")
qkv = [0.1 * (i % 7) for i in range(1 * 2 * 4 * 8)]
for label, bad in [("nan", nan), ("inf", inf), ("3e38", 3e38)]:
    q = list(qkv)
    q[5] = bad
    put(S, "attention_q_%s.safetensors" % label, st([
        ("q", "F32", [1, 2, 4, 8], f32s(q)),
        ("k", "F32", [1, 2, 4, 8], f32s(qkv)),
        ("v", "F32", [1, 2, 4, 8], f32s(qkv)),
    ]))
logits = [0.01 * i for i in range(4 * 8)]
for label, bad in [("nan", nan), ("neginf", -inf), ("3e38", 3e38)]:
    lg = list(logits)
    lg[3] = bad
    put(S, "routing_logits_%s.safetensors" % label, st([("logits", "F32", [4, 8], f32s(lg))]))
put(S, "i64_out_of_i32.safetensors", st([("ids", "I64", [2], struct.pack("<2q", 1, 2 ** 40))]))
# malformed headers
put(S, "header_len_u64max.safetensors", struct.pack("<Q", 2 ** 64 - 1) + b"{}")
put(S, "header_len_past_end.safetensors", struct.pack("<Q", 1000) + b"{}      ")
put(S, "header_not_json.safetensors", st([], raw_header="{not json"))
put(S, "header_not_object.safetensors", st([], raw_header="[1,2,3]"))
put(S, "negative_dim.safetensors", raw(t("x", "F32", [-1, 4], [0, 16])))
put(S, "float_dim.safetensors", raw(t("x", "F32", [2.5, 4], [0, 40])))
put(S, "offsets_past_end.safetensors", raw(t("x", "F32", [4], [0, 16])))
put(S, "offsets_reversed.safetensors", st([("x", "F32", [1], f32s([1.0]))],
    raw_header=json.dumps(t("x", "F32", [1], [4, 0]))) + f32s([1.0]))
put(S, "offsets_huge.safetensors", raw(t("x", "F32", [1], [big, big + 4])))
put(S, "unknown_dtype.safetensors", raw(t("x", "F128", [1], [0, 16])))
put(S, "dtype_bool.safetensors", st([("x", "I8", [4], bytes(4))],
    raw_header=json.dumps(t("x", "BOOL", [4], [0, 4]))) + bytes(4))
put(S, "empty_file.safetensors", b"")
put(S, "seven_bytes.safetensors", b"\x10\x00\x00\x00\x00\x00\x00")
# truncated copies of a real file
with open(os.path.join(REF, "moe_route_0.safetensors"), "rb") as f:
    good = f.read()
put(S, "valid_moe_route_0.safetensors", good)
hlen = struct.unpack("<Q", good[:8])[0]
for label, n in [("in_header", 8 + hlen // 2), ("after_header", 8 + hlen), ("in_data", len(good) - 100)]:
    put(S, "truncated_%s.safetensors" % label, good[:n])

# ---- TOML workloads -----------------------------------------------------------------------

W = "workload"
SMALL = dict(batch=2, seq_len=19, d_model=64, heads=4, kv_heads=2, experts=4, top_k=2, ffn=48, seed=7)


def toml(**over):
    c = dict(SMALL)
    c.update(over)
    body = "\n".join("%s = %s" % (k, json.dumps(v) if isinstance(v, str) else v) for k, v in c.items())
    return 'name = "fuzz"\n\n[mixtral]\n' + body + "\n"


put(W, "valid_small.toml", toml())
put(W, "batch_i64max.toml", toml(batch=big))
put(W, "d_model_2p32.toml", toml(d_model=4294967296))
put(W, "seq_len_1e9.toml", toml(seq_len=1000000000))
put(W, "experts_1e8.toml", toml(experts=100000000, top_k=2))
put(W, "ffn_12345678901.toml", toml(ffn=12345678901))
put(W, "tokens_overflow.toml", toml(batch=4294967296, seq_len=4294967296))
put(W, "heads_i64max.toml", toml(heads=big, kv_heads=1))
put(W, "zero_batch_huge_seq.toml", toml(batch=0, seq_len=big))
put(W, "negative_batch.toml", toml(batch=-1))
put(W, "batch_past_i64.toml", toml().replace("batch = 2", "batch = 18446744073709551616"))
put(W, "heads_zero.toml", toml(heads=0))
put(W, "top_k_over_experts.toml", toml(top_k=9))
put(W, "rope_theta_nan.toml", toml(rope_theta="NAN").replace('"NAN"', "nan"))
put(W, "rms_eps_inf.toml", toml(rms_eps="INF").replace('"INF"', "inf"))
put(W, "dtype_i8.toml", toml(dtype="i8"))
put(W, "unknown_key.toml", toml(layers=32))
put(W, "not_toml.toml", "[mixtral\nbatch = = 2\n")
put(W, "binary.toml", bytes(range(256)))
put(W, "empty.toml", "")

# ---- transformers config.json -------------------------------------------------------------

C = "config_json"
base = {"num_attention_heads": 4, "num_experts_per_tok": 2, "rope_theta": 10000.0, "rms_norm_eps": 1e-5,
        "hidden_size": 64, "num_local_experts": 4}


def cfg(**over):
    c = dict(base)
    c.update(over)
    return json.dumps(c)


put(C, "valid.json", cfg())
put(C, "heads_1e300.json", cfg(num_attention_heads=1e300))
put(C, "heads_2p32.json", cfg(num_attention_heads=4294967296))
put(C, "heads_i64max.json", cfg(num_attention_heads=big))
put(C, "heads_negative.json", cfg(num_attention_heads=-1))
put(C, "heads_string.json", cfg(num_attention_heads="8"))
put(C, "heads_fraction.json", cfg(num_attention_heads=2.5))
put(C, "top_k_zero.json", cfg(num_experts_per_tok=0))
put(C, "top_k_huge.json", cfg(num_experts_per_tok=2 ** 40))
put(C, "rope_theta_half.json", cfg(rope_theta=0.5))
put(C, "rope_theta_1e309.json", cfg().replace("10000.0", "1e309"))
put(C, "rope_theta_nan.json", cfg().replace("10000.0", "NaN"))
put(C, "rope_parameters.json", json.dumps({"rope_parameters": {"rope_theta": -3}}))
put(C, "rms_eps_negative.json", cfg(rms_norm_eps=-1e-5))
put(C, "rms_eps_f32_overflow.json", cfg(rms_norm_eps=1e39))
put(C, "nulls.json", json.dumps({k: None for k in base}))
put(C, "array.json", "[1, 2, 3]")
put(C, "deep_nesting.json", "[" * 100000 + "]" * 100000)
put(C, "truncated.json", cfg()[:30])
put(C, "empty.json", "")

# ---- op-time history ----------------------------------------------------------------------

H = "history"


def hist(entries, version=2):
    d = {"entries": entries}
    if version is not None:
        d["version"] = version
    return json.dumps(d)


put(H, "valid.json", hist({"cpu:0|\"Add\"|f32[4],f32[4]": {"n": 2, "mean_s": 0.001}}))
put(H, "valid_k.json", hist({"k": {"n": 2, "mean_s": 0.001}}))
put(H, "mean_s_max.json", hist({"k": {"n": 1, "mean_s": 100000.0}}))
for label, v in [("1e300", "1e300"), ("1.5e19", "1.5e19"), ("neg1", "-1"), ("1e5_plus", "100000.5")]:
    put(H, "mean_s_%s.json" % label, '{"version": 2, "entries": {"k": {"n": 3, "mean_s": %s}}}' % v)
put(H, "mean_s_nan.json", '{"version": 2, "entries": {"k": {"n": 3, "mean_s": NaN}}}')
put(H, "mean_s_1e400.json", '{"version": 2, "entries": {"k": {"n": 3, "mean_s": 1e400}}}')
put(H, "mean_s_string.json", hist({"k": {"n": 1, "mean_s": "fast"}}))
put(H, "n_zero.json", hist({"k": {"n": 0, "mean_s": 1.0}}))
put(H, "n_u64max.json", '{"version": 2, "entries": {"k": {"n": 18446744073709551615, "mean_s": 1.0}}}')
put(H, "n_negative.json", hist({"k": {"n": -3, "mean_s": 1.0}}))
put(H, "unversioned_1e300.json", hist({"k": {"n": 1, "mean_s": 1e300}}, version=None))
put(H, "version_3.json", hist({}, version=3))
put(H, "version_string.json", hist({}, version="2"))
put(H, "entries_array.json", json.dumps({"version": 2, "entries": [1, 2]}))
put(H, "garbage.json", b"\x00\x01\xff not json")
put(H, "truncated.json", hist({"k": {"n": 1, "mean_s": 0.5}})[:25])
put(H, "empty.json", "")
