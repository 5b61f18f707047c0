"""GGUF metadata and tensor tables written by gguf.GGUFWriter, read by the C++ reader.

Every GGUF value type (scalars, strings, arrays of strings / ints / floats / bools, a nested
array) is written by the reference writer; each key is then read through every typed getter
of GgufFile (via formats_tensor_dump --key) and the result compared with what was written and
with the getter contract in gguf.h (integers of any width -> int64, floats and integers ->
double, other combinations InvalidArgument, absent keys NotFound). The tensor table is
compared with gguf.GGUFReader. The same file patched to version 2 (same layout on
little-endian files) must read identically; versions 1 and 4 must be refused. A file with
general.alignment = 64 must yield the same tensor values as the reference reader.
"""

import os
import tempfile

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader, GGUFValueType as V, GGUFWriter
from gguf.quants import dequantize, quantize

from formats_testlib import Checker, dump, read_f32

INTS = {V.UINT8, V.INT8, V.UINT16, V.INT16, V.UINT32, V.INT32, V.UINT64, V.INT64}
FLOATS = {V.FLOAT32, V.FLOAT64}

# key -> (value, type, array element type)
ENTRIES = {
    "t.u8": (255, V.UINT8, None),
    "t.i8": (-128, V.INT8, None),
    "t.u16": (65535, V.UINT16, None),
    "t.i16": (-32768, V.INT16, None),
    "t.u32": (4294967295, V.UINT32, None),
    "t.i32": (-2147483648, V.INT32, None),
    "t.u64": (2**63 - 1, V.UINT64, None),
    "t.i64": (-(2**63), V.INT64, None),
    "t.f32": (0.1, V.FLOAT32, None),
    "t.f64": (-2.5e-300, V.FLOAT64, None),
    "t.true": (True, V.BOOL, None),
    "t.false": (False, V.BOOL, None),
    "t.string": ("Grüße, 世界 <|im_end|>", V.STRING, None),
    "t.strings": (["<|endoftext|>", "", "Ġthe", "日本"], V.ARRAY, V.STRING),
    "t.i32s": ([1, -2, 2**31 - 1], V.ARRAY, V.INT32),
    "t.u64s": ([0, 2**40, 2**63 - 1], V.ARRAY, V.UINT64),
    "t.i16s": ([-5, 7], V.ARRAY, V.INT16),
    "t.u8s": ([0, 200, 255], V.ARRAY, V.UINT8),
    "t.f32s": ([0.5, -1.25, 3.0e-3], V.ARRAY, V.FLOAT32),
    "t.f64s": ([1e-300, 2.0], V.ARRAY, V.FLOAT64),
    "t.bools": ([True, False, True], V.ARRAY, V.BOOL),
    "t.nested": ([[1, 2], [3]], V.ARRAY, V.ARRAY),
}


ERROR = "<InvalidArgument>"  # marks a getter that must fail with INVALID_ARGUMENT


def same(got, want):
    """Equal in value and JSON type (so 1 is not 1.0 and True is not 1)."""
    if isinstance(want, list):
        return isinstance(got, list) and len(got) == len(want) and all(
            same(g, w) for g, w in zip(got, want))
    return type(got) is type(want) and got == want


def as_f32(x):
    return float(np.float32(x))


def expected_getters(value, vtype, sub):
    """What each getter should return: a value, or the error code."""
    want = {k: ERROR for k in
            ("int", "float", "bool", "string", "string_array", "int_array", "float_array")}
    if vtype in INTS:
        want["int"] = value
        want["float"] = float(value)
    elif vtype == V.FLOAT32:
        want["float"] = as_f32(value)
    elif vtype == V.FLOAT64:
        want["float"] = value
    elif vtype == V.BOOL:
        want["bool"] = value
    elif vtype == V.STRING:
        want["string"] = value
    elif sub == V.STRING:
        want["string_array"] = value
    elif sub in INTS:
        want["int_array"] = value
        want["float_array"] = [float(v) for v in value]
    elif sub == V.FLOAT32:
        want["float_array"] = [as_f32(v) for v in value]
    elif sub == V.FLOAT64:
        want["float_array"] = value
    return want


def write_file(path, alignment=None):
    writer = GGUFWriter(path, "llama")
    if alignment is not None:
        writer.add_custom_alignment(alignment)
    for key, (value, vtype, sub) in ENTRIES.items():
        writer.add_key_value(key, value, vtype, sub_type=sub)
    rng = np.random.default_rng(7)
    writer.add_tensor("w.f32", rng.standard_normal((3, 5)).astype(np.float32))
    writer.add_tensor("w.f16", rng.standard_normal((2, 3, 4)).astype(np.float16))
    q = quantize(rng.standard_normal((4, 64)).astype(np.float32), T.Q4_1)
    writer.add_tensor("w.q4_1", q, raw_dtype=T.Q4_1)
    writer.add_tensor("w.last", rng.standard_normal(7).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def check_file(c, path, version, tmp):
    reader = GGUFReader(path)
    # GGUFReader also lists the header as pseudo-fields "GGUF.version" etc.
    fields = [f.name for f in reader.fields.values() if not f.name.startswith("GGUF.")]
    keys = list(ENTRIES) + ["no.such.key"] + fields
    out = os.path.join(tmp, f"out_v{version}_{os.path.basename(path)}")
    os.makedirs(out, exist_ok=True)
    result = dump(path, out_dir=out, keys=keys)
    if not c.check("error" not in result, f"{path}: open failed: {result.get('error')}"):
        return
    c.check(result["version"] == version, f"version {result['version']} == {version}")
    got_keys = result["keys"]
    for name in fields:
        c.check(got_keys[name]["has"], f"v{version}: reader sees key {name}")
    c.check(got_keys["general.architecture"]["string"] == "llama", "general.architecture")

    for key, (value, vtype, sub) in ENTRIES.items():
        want = expected_getters(value, vtype, sub)
        got = got_keys[key]
        for getter, w in want.items():
            g = got[getter]
            if w is ERROR:
                ok = isinstance(g, dict) and g.get("error", {}).get("code") == "INVALID_ARGUMENT"
            else:
                ok = same(g, w)
            c.check(ok, f"v{version} {key} {getter}: got {g!r}, want {w!r}")
    missing = got_keys["no.such.key"]
    c.check(not missing["has"], "absent key: has() is false")
    c.check(all(missing[g]["error"]["code"] == "NOT_FOUND"
                for g in missing if g != "has"), "absent key: every getter NOT_FOUND")
    message = missing["int"]["error"]["message"]
    c.check(message == f"{path}: metadata: not found (key no.such.key)",
            f"absent key message {message!r}")

    # Tensor table and values against GGUFReader.
    tensors = {t["name"]: t for t in result["tensors"]}
    c.check(list(tensors) == [t.name for t in reader.tensors], "tensor order matches the file")
    for t in reader.tensors:
        entry = tensors[t.name]
        c.check(entry["type"] == t.tensor_type.name, f"{t.name}: type {entry['type']}")
        c.check(entry["shape"] == [int(d) for d in reversed(t.shape)],
                f"{t.name}: shape {entry['shape']} vs ne {list(t.shape)}")
        want = dequantize(t.data, t.tensor_type).astype(np.float32).reshape(entry["shape"])
        got = read_f32(out, entry)
        c.check(np.array_equal(got.view(np.uint32), want.view(np.uint32)),
                f"v{version} {t.name}: values equal GGUFReader's")


def main():
    c = Checker()
    with tempfile.TemporaryDirectory() as tmp:
        v3 = os.path.join(tmp, "meta_v3.gguf")
        write_file(v3)
        check_file(c, v3, 3, tmp)

        data = bytearray(open(v3, "rb").read())
        data[4:8] = (2).to_bytes(4, "little")
        v2 = os.path.join(tmp, "meta_v2.gguf")
        open(v2, "wb").write(data)
        check_file(c, v2, 2, tmp)

        for bad in (1, 4):
            data[4:8] = bad.to_bytes(4, "little")
            path = os.path.join(tmp, f"meta_v{bad}.gguf")
            open(path, "wb").write(data)
            err = dump(path).get("error", {})
            c.check(err.get("code") == "UNIMPLEMENTED" and
                    err.get("message", "").startswith(f"{path}: header: unsupported version {bad}"),
                    f"version {bad} refused: {err}")

        aligned = os.path.join(tmp, "meta_align64.gguf")
        write_file(aligned, alignment=64)
        result = dump(aligned, keys=["general.alignment"])
        c.check(result["keys"]["general.alignment"]["int"] == 64, "general.alignment == 64")
        check_file(c, aligned, 3, tmp)
    c.finish()


if __name__ == "__main__":
    main()
