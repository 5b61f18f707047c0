"""The default model (SmolLM2-135M-Instruct Q4_1) read by the C++ reader vs gguf.GGUFReader.

Checks the whole tensor table (272 names, types, shapes), every metadata key through the
getter its type calls for (including the 49152 tokens and 48900 merges), the facts the engine
relies on (token_embd.weight Q8_0 {49152, 576}, llama.block_count 30), and the values of four
tensors (Q8_0 embedding, two Q4_1 matrices, an F32 norm) bit for bit against
gguf.quants.dequantize.
"""

import os
import sys
import tempfile

import numpy as np
from gguf import GGUFReader, GGUFValueType as V
from gguf.quants import dequantize

from formats_testlib import Checker, dump, read_f32

MODEL = os.environ.get("RIDGESERVE_DEFAULT_MODEL", "models/SmolLM2-135M-Instruct.Q4_1.gguf")
VALUE_TENSORS = ["token_embd.weight", "blk.0.attn_q.weight", "blk.29.ffn_down.weight",
                 "output_norm.weight"]
INTS = {V.UINT8, V.INT8, V.UINT16, V.INT16, V.UINT32, V.INT32, V.UINT64, V.INT64}


def getter_for(field):
    """(getter name in the dump, expected value) for one GGUFReader field."""
    main = field.types[0]
    value = field.contents()
    if main == V.ARRAY:
        sub = field.types[-1]
        if sub == V.STRING:
            return "string_array", value
        if sub in INTS:
            return "int_array", [int(v) for v in value]
        return "float_array", [float(np.float32(v)) for v in value]
    if main == V.STRING:
        return "string", value
    if main == V.BOOL:
        return "bool", bool(value)
    if main in INTS:
        return "int", int(value)
    return "float", float(np.float32(value)) if main == V.FLOAT32 else float(value)


def main():
    if not os.path.exists(MODEL):
        print(f"{MODEL} is missing: run `make model`")
        sys.exit(1)
    c = Checker()
    reader = GGUFReader(MODEL)
    fields = [f for f in reader.fields.values() if not f.name.startswith("GGUF.")]
    with tempfile.TemporaryDirectory() as out:
        result = dump(MODEL, out_dir=out, tensors=VALUE_TENSORS, keys=[f.name for f in fields])
        if not c.check("error" not in result, f"open failed: {result.get('error')}"):
            c.finish()
        tensors = result["tensors"]
        c.check(len(tensors) == 272, f"{len(tensors)} tensors == 272")
        c.check([t["name"] for t in tensors] == [t.name for t in reader.tensors],
                "tensor names and order match GGUFReader")
        by_name = {t["name"]: t for t in tensors}
        for t in reader.tensors:
            entry = by_name.get(t.name, {})
            c.check(entry.get("type") == t.tensor_type.name and
                    entry.get("shape") == [int(d) for d in reversed(t.shape)],
                    f"{t.name}: {entry.get('type')} {entry.get('shape')} vs "
                    f"{t.tensor_type.name} ne {list(t.shape)}")
        embd = by_name["token_embd.weight"]
        c.check(embd["type"] == "Q8_0" and embd["shape"] == [49152, 576],
                f"token_embd.weight is Q8_0 [49152, 576]: {embd['type']} {embd['shape']}")

        keys = result["keys"]
        c.check(keys["llama.block_count"]["int"] == 30, "llama.block_count == 30")
        for field in fields:
            getter, want = getter_for(field)
            got = keys[field.name][getter]
            shown = f"{len(want)} items" if isinstance(want, list) else repr(want)[:60]
            c.check(got == want, f"{field.name} via {getter}: want {shown}")
        print(f"compared {len(fields)} metadata keys, "
              f"{len(keys['tokenizer.ggml.tokens']['string_array'])} tokens, "
              f"{len(keys['tokenizer.ggml.merges']['string_array'])} merges")

        reader_tensors = {t.name: t for t in reader.tensors}
        for name in VALUE_TENSORS:
            t = reader_tensors[name]
            want = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
            got = read_f32(out, by_name[name])
            want = want.reshape(got.shape)
            c.check(np.array_equal(got.view(np.uint32), want.view(np.uint32)),
                    f"{name} ({t.tensor_type.name}, {got.size} values): bit-identical to "
                    "gguf.quants.dequantize")
            print(f"{name}: {t.tensor_type.name} {list(got.shape)} compared")
    c.finish()


if __name__ == "__main__":
    main()
