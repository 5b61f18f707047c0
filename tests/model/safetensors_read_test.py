"""safetensors files written by the safetensors package, read by the C++ reader.

Single files and a two-shard checkpoint with model.safetensors.index.json, F32 / F16 / BF16
tensors of several ranks (random bit patterns for F16 and BF16, NaN and Inf included), plus
__metadata__. Values must equal NumPy's conversion bit for bit; shapes and names must match.
numpy has no bfloat16, so BF16 tensors are saved as U16 by the library and the header's dtype
is then rewritten to BF16 (same bytes); the reference value of bits b is the f32 with bits
b << 16. A tensor of an unsupported dtype (I64) must be refused, naming it.
"""

import json
import os
import struct
import tempfile

import numpy as np
from safetensors.numpy import save_file

from formats_testlib import Checker, dump, read_f32


def retype_to_bf16(path, names):
    """Rewrites the dtype of `names` (saved as U16) to BF16, keeping the data bytes."""
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    for name in names:
        assert header[name]["dtype"] == "U16"
        header[name]["dtype"] = "BF16"
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    open(path, "wb").write(struct.pack("<Q", len(text)) + text + raw[8 + n:])


def reference(kind, array):
    if kind == "F32":
        return array.astype(np.float32)
    if kind == "F16":
        return array.astype(np.float32)
    return (array.astype(np.uint32) << 16).view(np.float32)  # BF16 bits as uint16


def make_tensors(rng, prefix):
    tensors, kinds = {}, {}
    shapes = [(7,), (3, 5), (2, 3, 4), (1, 2, 3, 2), (64, 48)]
    for i, shape in enumerate(shapes):
        tensors[f"{prefix}.f32.{i}"] = rng.standard_normal(shape).astype(np.float32)
        kinds[f"{prefix}.f32.{i}"] = "F32"
        bits = rng.integers(0, 1 << 16, shape, dtype=np.uint16)
        tensors[f"{prefix}.f16.{i}"] = bits.view(np.float16)
        kinds[f"{prefix}.f16.{i}"] = "F16"
        tensors[f"{prefix}.bf16.{i}"] = rng.integers(0, 1 << 16, shape, dtype=np.uint16)
        kinds[f"{prefix}.bf16.{i}"] = "BF16"
    return tensors, kinds


def compare(c, label, result, out, tensors, kinds):
    if not c.check("error" not in result, f"{label}: open failed: {result.get('error')}"):
        return
    got = {t["name"]: t for t in result["tensors"]}
    c.check(set(got) == set(tensors), f"{label}: tensor names match")
    for name, array in tensors.items():
        entry = got.get(name)
        if entry is None:
            continue
        c.check(entry["type"] == kinds[name], f"{label} {name}: type {entry['type']}")
        c.check(tuple(entry["shape"]) == array.shape, f"{label} {name}: shape {entry['shape']}")
        want = reference(kinds[name], array)
        values = read_f32(out, entry)
        c.check(np.array_equal(values.view(np.uint32), want.view(np.uint32)),
                f"{label} {name}: bit-identical to NumPy")


def main():
    c = Checker()
    rng = np.random.default_rng(99)
    with tempfile.TemporaryDirectory() as tmp:
        # Single file.
        single = os.path.join(tmp, "single")
        os.mkdir(single)
        tensors, kinds = make_tensors(rng, "model")
        path = os.path.join(single, "model.safetensors")
        save_file(tensors, path, metadata={"format": "pt", "note": "written by safetensors"})
        retype_to_bf16(path, [n for n, k in kinds.items() if k == "BF16"])
        out = os.path.join(tmp, "out_single")
        os.mkdir(out)
        compare(c, "single", dump(single, out_dir=out), out, tensors, kinds)

        # Two shards + index.
        sharded = os.path.join(tmp, "sharded")
        os.mkdir(sharded)
        shard_tensors = [make_tensors(rng, "layers.0"), make_tensors(rng, "layers.1")]
        weight_map, all_tensors, all_kinds = {}, {}, {}
        for i, (ts, ks) in enumerate(shard_tensors):
            name = f"model-{i + 1:05d}-of-00002.safetensors"
            shard_path = os.path.join(sharded, name)
            save_file(ts, shard_path, metadata={"format": "pt"})
            retype_to_bf16(shard_path, [n for n, k in ks.items() if k == "BF16"])
            weight_map.update({n: name for n in ts})
            all_tensors.update(ts)
            all_kinds.update(ks)
        with open(os.path.join(sharded, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, f)
        out = os.path.join(tmp, "out_sharded")
        os.mkdir(out)
        compare(c, "sharded", dump(sharded, out_dir=out), out, all_tensors, all_kinds)

        # Unsupported dtype, written by the library itself.
        bad = os.path.join(tmp, "bad")
        os.mkdir(bad)
        bad_path = os.path.join(bad, "model.safetensors")
        save_file({"ok": np.zeros(2, np.float32), "ids": np.arange(3, dtype=np.int64)}, bad_path)
        err = dump(bad).get("error", {})
        c.check(err.get("code") == "UNIMPLEMENTED" and err.get("message", "").startswith(bad_path)
                and 'dtype "I64"' in err.get("message", "") and "(tensor ids)" in err["message"],
                f"I64 refused naming file and tensor: {err}")
    c.finish()


if __name__ == "__main__":
    main()
