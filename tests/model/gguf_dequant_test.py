"""Dequantization of every supported GGUF tensor type against gguf.quants.dequantize.

Writes a GGUF (gguf.GGUFWriter, raw_dtype) holding, for each type, tensors of random block
bytes in several ranks and shapes. The f16 scale fields of each block are replaced by finite
values (normals, subnormals and zeros), so the reference has no NaN/Inf to disagree about;
F16, BF16 and F32 tensors are random bit patterns, NaN and Inf included. The C++ reader's
output (formats_tensor_dump) must match the reference bit for bit, NaN payloads included.
"""

import os
import tempfile

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFWriter
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize

from formats_testlib import Checker, dump, read_f32

# Byte offsets of the f16 scale fields inside one block (ggml-common.h).
F16_FIELDS = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
    T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
}
FLOAT_TYPES = [T.F32, T.F16, T.BF16]
SHAPES_32 = [(64,), (3, 64), (2, 3, 96), (2, 1, 2, 32), (16, 1024)]
SHAPES_256 = [(256,), (3, 512), (2, 2, 256), (1, 2, 1, 256), (8, 2048)]
SHAPES_FLOAT = [(7,), (5, 7), (3, 4, 5), (2, 3, 1, 4), (33, 65)]


def sane_f16(rng, n):
    """n finite f16 values: mostly normals in (-2, 2), some subnormals and zeros."""
    values = rng.uniform(-2, 2, n).astype(np.float16).view(np.uint16)
    kind = rng.random(n)
    subnormal = rng.integers(1, 0x400, n, dtype=np.uint16) | (rng.integers(0, 2, n, dtype=np.uint16) << 15)
    values = np.where(kind < 0.05, subnormal, values)
    values = np.where((kind >= 0.05) & (kind < 0.08), np.uint16(0), values)
    return values.astype(np.uint16)


def random_tensor(rng, qtype, shape):
    """Stored bytes for a tensor of `shape` (elements), as a uint8 array (..., row_bytes)."""
    block, type_size = GGML_QUANT_SIZES[qtype]
    rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
    n_blocks = rows * shape[-1] // block
    raw = rng.integers(0, 256, (n_blocks, type_size), dtype=np.uint8)
    for offset in F16_FIELDS.get(qtype, []):
        raw[:, offset:offset + 2] = sane_f16(rng, n_blocks).view(np.uint8).reshape(n_blocks, 2)
    return raw.reshape(*shape[:-1], shape[-1] // block * type_size)


def main():
    rng = np.random.default_rng(20240611)
    c = Checker()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "all_types.gguf")
        writer = GGUFWriter(path, "llama")
        expected = {}
        for qtype in FLOAT_TYPES + list(F16_FIELDS):
            block = GGML_QUANT_SIZES[qtype][0]
            shapes = SHAPES_FLOAT if block == 1 else SHAPES_32 if block == 32 else SHAPES_256
            for i, shape in enumerate(shapes):
                name = f"{qtype.name}.{i}"
                raw = random_tensor(rng, qtype, shape)
                writer.add_tensor(name, raw, raw_dtype=qtype)
                want = np.asarray(dequantize(raw, qtype), dtype=np.float32)
                assert want.shape == shape, (name, want.shape, shape)
                expected[name] = (qtype, want)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()

        out = os.path.join(tmp, "out")
        os.mkdir(out)
        result = dump(path, out_dir=out)
        c.check("error" not in result, f"open failed: {result.get('error')}")
        entries = {t["name"]: t for t in result.get("tensors", [])}
        c.check(set(entries) == set(expected), "tensor names match")
        per_type = {}
        for name, (qtype, want) in expected.items():
            entry = entries.get(name)
            if not c.check(entry is not None, f"{name} present"):
                continue
            c.check(entry["type"] == qtype.name, f"{name}: type {entry['type']} == {qtype.name}")
            c.check(tuple(entry["shape"]) == want.shape,
                    f"{name}: shape {entry['shape']} == {list(want.shape)}")
            got = read_f32(out, entry)
            same_bits = np.array_equal(got.view(np.uint32), want.view(np.uint32))
            if not same_bits:
                bad = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
                first = bad[0] if len(bad) else -1
                print(f"  {name}: {len(bad)} of {want.size} differ; first flat index {first}: "
                      f"got {got.ravel()[first]!r} want {want.ravel()[first]!r} "
                      "(1-ulp differences mean a fused multiply-add: see dequant.cc)")
            c.check(same_bits, f"{name}: bit-identical to gguf.quants.dequantize")
            per_type[qtype.name] = per_type.get(qtype.name, 0) + want.size
        print("elements compared per type:",
              ", ".join(f"{k} {v}" for k, v in sorted(per_type.items())))
        nan_count = sum(int(np.isnan(w).sum()) for _, w in expected.values())
        print(f"({nan_count} NaNs among the random F16/BF16/F32 bit patterns, compared by bits)")
    c.finish()


if __name__ == "__main__":
    main()
