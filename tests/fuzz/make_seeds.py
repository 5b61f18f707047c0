#!/usr/bin/env python3
"""Writes the seed corpora into OUT_DIR/<target>/ (generated at test time, never committed).

Seeds come from real files where they are small: the tiny test models' tokenizer.json and
tokenizer_config.json (tests/reference/tiny_models.py), RidgeFill maps calibrated on one of
them by ridgeserve-calibrate, and hand-made files written here from the format specs (GGUF
with one tensor of every stored type, safetensors single and sharded, RidgeFill calibration
statistics), plus truncations and small hand-made inputs for the text targets. Regression
inputs for crashes that are found go in tests/fuzz/regressions/<target>/ by hand
(run_fuzzers.sh runs them too).

usage: .venv/bin/python tests/fuzz/make_seeds.py BIN_DIR OUT_DIR
       (BIN_DIR holds ridgeserve-calibrate)
"""

import json
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "tests", "fuzz", "data")

# ------------------------------------------------------------------------------------------
# GGUF (spec: github.com/ggml-org/ggml docs/gguf.md)

U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
# type id: (block elements, block bytes)
GGML_TYPES = {
    0: (1, 4),  # F32
    1: (1, 2),  # F16
    30: (1, 2),  # BF16
    2: (32, 18),  # Q4_0
    3: (32, 20),  # Q4_1
    6: (32, 22),  # Q5_0
    7: (32, 24),  # Q5_1
    8: (32, 34),  # Q8_0
    10: (256, 84),  # Q2_K
    11: (256, 110),  # Q3_K
    12: (256, 144),  # Q4_K
    13: (256, 176),  # Q5_K
    14: (256, 210),  # Q6_K
}


def gstr(s):
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def gvalue(vtype, v):
    fmt = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f",
           BOOL: "<?", U64: "<Q", I64: "<q", F64: "<d"}
    if vtype == STRING:
        return gstr(v)
    if vtype == ARRAY:
        etype, items = v
        return struct.pack("<IQ", etype, len(items)) + b"".join(gvalue(etype, x) for x in items)
    return struct.pack(fmt[vtype], v)


def gguf(kvs, tensors, version=3, alignment=32, rng=None):
    """kvs: [(key, type, value)]; tensors: [(name, dims (ggml order, innermost first), type)]."""
    rng = rng or random.Random(0)
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs))
    for key, vtype, v in kvs:
        out += gstr(key) + struct.pack("<I", vtype) + gvalue(vtype, v)
    datas, offset = [], 0
    for name, dims, ttype in tensors:
        n = 1
        for d in dims:
            n *= d
        block, nbytes = GGML_TYPES[ttype]
        size = n // block * nbytes
        if ttype in (1, 30):  # finite f16 / bf16 values
            data = b"".join(struct.pack("<H", rng.randrange(0x3000, 0x3c00)) for _ in range(n))
        elif ttype == 0:
            data = b"".join(struct.pack("<f", rng.uniform(-1, 1)) for _ in range(n))
        else:  # quantized blocks: random integers, small finite f16 scales in front
            data = bytearray(rng.randbytes(size))
            for b in range(0, size, nbytes):
                data[b:b + 2] = struct.pack("<H", rng.randrange(0x2000, 0x3000))
            data = bytes(data)
        out += gstr(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", ttype, offset)
        datas.append(data)
        offset += size
        offset += (-offset) % alignment
    out += b"\0" * ((-len(out)) % alignment)
    for i, data in enumerate(datas):
        out += data
        if i + 1 < len(datas):
            out += b"\0" * ((-len(out)) % alignment)
    return out


def tokenizer_kvs(model_dir):
    tj = json.load(open(os.path.join(model_dir, "tokenizer.json")))
    vocab = sorted(tj["model"]["vocab"].items(), key=lambda kv: kv[1])
    tokens = [t for t, _ in vocab]
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
    special = {a["content"] for a in tj["added_tokens"]}
    types = [3 if t in special else 1 for t in tokens]
    return [
        ("tokenizer.ggml.model", STRING, "gpt2"),
        ("tokenizer.ggml.pre", STRING, "smollm"),
        ("tokenizer.ggml.tokens", ARRAY, (STRING, tokens)),
        ("tokenizer.ggml.token_type", ARRAY, (I32, types)),
        ("tokenizer.ggml.merges", ARRAY, (STRING, merges)),
        ("tokenizer.ggml.bos_token_id", U32, 0),
        ("tokenizer.ggml.eos_token_id", U32, 2),
        ("tokenizer.ggml.add_bos_token", BOOL, False),
        ("tokenizer.chat_template", STRING,
         "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
         "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"),
    ]


def gguf_seeds(out):
    arch = [("general.architecture", STRING, "llama"), ("general.name", STRING, "seed"),
            ("llama.block_count", U32, 2), ("llama.context_length", U32, 256),
            ("llama.embedding_length", U32, 64), ("llama.rope.freq_base", F32, 10000.0),
            ("llama.attention.layer_norm_rms_epsilon", F32, 1e-5)]
    every_value = [("v.u8", U8, 7), ("v.i8", I8, -7), ("v.u16", U16, 700), ("v.i16", I16, -700),
                   ("v.u32", U32, 70000), ("v.i32", I32, -70000), ("v.f32", F32, 0.5),
                   ("v.bool", BOOL, True), ("v.u64", U64, 2**63 + 5), ("v.i64", I64, -2**40),
                   ("v.f64", F64, 0.25), ("v.ints", ARRAY, (I32, [1, -2, 3])),
                   ("v.floats", ARRAY, (F32, [0.5, -1.5])), ("v.strs", ARRAY, (STRING, ["a", "b"])),
                   ("v.nested", ARRAY, (ARRAY, [(U8, [1, 2]), (U8, [])]))]
    tensors = [(f"t.{ttype}", [GGML_TYPES[ttype][0] * (2 if GGML_TYPES[ttype][0] == 1 else 1), 2],
                ttype) for ttype in GGML_TYPES]
    seeds = {
        "every_type.gguf": gguf(arch + every_value, tensors),
        "v2_align64.gguf": gguf([("general.alignment", U32, 64)] + arch,
                                [("a", [8, 3], 0), ("b", [32], 8), ("c", [4, 2, 2, 2], 1)],
                                version=2, alignment=64),
        "tokenizer.gguf": gguf(arch + tokenizer_kvs(os.path.join(DATA, "tiny_llama3")),
                               [("token_embd.weight", [32, 4], 8)]),
        "empty.gguf": gguf([], []),
        "1d_3d.gguf": gguf(arch, [("x", [256], 12), ("y", [32, 2, 3], 2), ("z", [5], 0)]),
    }
    big = seeds["every_type.gguf"]
    for cut in (4, 8, 16, 24, 40, 100, 300, len(big) // 2, len(big) - 1):
        seeds[f"every_type.cut{cut}.gguf"] = big[:cut]
    for name, data in seeds.items():
        write(out, name, data)


# ------------------------------------------------------------------------------------------
# safetensors (spec: github.com/huggingface/safetensors README, "Format")

def safetensors(tensors, metadata=None, rng=None):
    """tensors: [(name, dtype, shape)]"""
    rng = rng or random.Random(0)
    size = {"F32": 4, "F16": 2, "BF16": 2}
    header, data = {}, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape in tensors:
        n = 1
        for d in shape:
            n *= d
        if dtype == "F32":
            blob = b"".join(struct.pack("<f", rng.uniform(-1, 1)) for _ in range(n))
        else:
            blob = b"".join(struct.pack("<H", rng.randrange(0x3000, 0x3c00)) for _ in range(n))
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(blob)]}
        data += blob
        assert len(blob) == n * size[dtype]
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((-len(h)) % 8)
    return struct.pack("<Q", len(h)) + h + data


def safetensors_seeds(out):
    single = safetensors([("model.embed_tokens.weight", "F32", [4, 8]), ("a.bias", "F16", [8]),
                          ("b", "BF16", [2, 2, 2]), ("scalar", "F32", [])], {"format": "pt"})
    write(out, "single.safetensors", single)
    write(out, "empty_header.safetensors", safetensors([]))
    write(out, "single.cut12.safetensors", single[:12])
    s1 = safetensors([("x", "F32", [2, 3]), ("y", "F16", [4])])
    s2 = safetensors([("z", "BF16", [3, 2])])
    index = json.dumps({"metadata": {"total_size": 44},
                        "weight_map": {"x": "shard-1.safetensors", "y": "shard-1.safetensors",
                                       "z": "shard-2.safetensors"}}, indent=1).encode()
    sep = b"\n--shard--\n"
    write(out, "sharded.input", index + sep + s1 + sep + s2)
    bad = json.dumps({"weight_map": {"x": "../shard-1.safetensors"}}).encode()
    write(out, "sharded_traversal.input", bad + sep + s1)


# ------------------------------------------------------------------------------------------
# Text targets

TEXTS = [
    b"Hello world", b"The capital of France is Paris.", b"<|im_start|>user\nHi!<|im_end|>\n",
    b"<|im_star <|im_end| <|<|im_end|>|> <|endoftext|><|endoftext|", b"<|im_start|><|im_start|>",
    b"\xc3\x28 \xa0\xa1 \xe2\x28\xa1 \xf0\x28\x8c\xbc \xff\xfe \xc0\xaf \xed\xa0\x80 \xf4\x90\x80\x80",
    "naïve café — 東京 😀👍🏽 ｆｕｌｌ".encode(), b"1234567890 3.14159 0x1F", b"   \t\n\n  \r\n x",
    b"don't I'll we've THEY'RE", b"a" * 300, b"\x00\x01\x02\x7f", b"",
]


def tokenizer_seeds(out):
    for i, text in enumerate(TEXTS):
        for control in (0, 1, 2, 0x10, 0x31, 0x72):
            if i % 3 == control % 3 or control in (0x10, 0x31):
                write(out, f"text{i:02d}_{control:02x}", bytes([control]) + text)


def tokenizer_json_seeds(out):
    sep = b"\n--config--\n"
    for name in ("tiny_llama3", "tiny_qwen3"):
        tj = open(os.path.join(DATA, name, "tokenizer.json"), "rb").read()
        cfg = open(os.path.join(DATA, name, "tokenizer_config.json"), "rb").read()
        write(out, f"{name}.json", tj)
        write(out, f"{name}_with_config.input", tj + sep + cfg)
    write(out, "minimal.json", json.dumps({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2},
                                                     "merges": ["a b"]}}).encode())
    write(out, "empty.json", b"{}")


def stop_matcher_seeds(out):
    cases = [(["</s>"], ["Hello", " wor", "ld</", "s> after"]),
             (["ab", "b"], ["a", "b", "c"]),
             (["stop", "top"], ["s", "t", "o", "p"]),
             (["\n\n", "User:"], ["line\n", "\nUser", ":"]),
             (["aaa"], ["aa", "aa", "a"]),
             ([], ["no", "stops"]),
             (["é"], ["caf", "é!"]),
             (["xyz", "", "yz"], ["wx", "y", "z"])]
    for i, (stops, pieces) in enumerate(cases):
        data = bytes([len(stops)]) + b"\0".join(s.encode() for s in stops + pieces)
        write(out, f"case{i}", data)


def request_seeds(out):
    """GenerateRequest / TokenizeRequest wire bytes, encoded by hand from the .proto."""
    def field(num, wire, payload):
        key = bytes(varint(num << 3 | wire))
        if wire == 2:
            return key + bytes(varint(len(payload))) + payload
        return key + payload

    def varint(v):
        out = []
        v &= (1 << 64) - 1
        while True:
            b = v & 0x7f
            v >>= 7
            out.append(b | (0x80 if v else 0))
            if not v:
                return out

    def fixed32f(x):
        return struct.pack("<f", x)

    # SamplingParams: 1 temperature f, 2 top_p f, 3 top_k i32, 4 min_p f, 5 repetition_penalty
    # f, 6 seed u64, 7 max_new_tokens i32, 8 stop rep string, 9 stop_token_ids rep i32, ...
    # (proto/ridgeserve/v1/ridgeserve.proto); unknown numbers are harmless for the fuzzer.
    seeds = {
        "text": field(2, 2, b"Hello world"),
        "text_id": field(1, 2, b"req-1") + field(2, 2, b"<|im_start|>user\nHi<|im_end|>"),
        "token_ids": field(3, 2, field(1, 2, bytes(varint(5) + varint(17) + varint(299)))),
        "bad_token": field(3, 2, field(1, 2, bytes(varint(5) + varint(100000)))),
        "chat": field(4, 2, field(1, 2, field(1, 2, b"user") + field(2, 2, b"What is 2+2?"))),
        "empty": b"",
        "not_proto": b"\xff\xff\xff",
    }
    for name, data in list(seeds.items()):
        if name in ("text", "chat"):
            seeds[name + "_sampling"] = data + field(5, 2, field(1, 5, fixed32f(0.7)) +
                                                     field(2, 5, fixed32f(0.9)) +
                                                     field(7, 0, bytes(varint(16))) +
                                                     field(8, 2, b"</s>"))
            seeds[name + "_bad_top_p"] = data + field(5, 2, field(2, 5, fixed32f(1.5)))
            seeds[name + "_ridgefill"] = data + field(6, 2, field(1, 0, bytes(varint(1))))
            rf = (field(1, 0, bytes(varint(8))) + field(2, 0, bytes(varint(2))) +
                  field(3, 2, field(1, 0, bytes(varint(1))) + field(2, 0, bytes(varint(3)))))
            seeds[name + "_ridgefill_opts"] = data + field(6, 2, field(1, 0, bytes(varint(1))) +
                                                           field(2, 2, rf))
            seeds[name + "_negative_tail"] = data + field(6, 2, field(1, 0, bytes(varint(1))) +
                                                          field(2, 2, field(1, 0, bytes(varint(-5)))))
    for name, data in seeds.items():
        write(out, name, data)


def map_file_seeds(out, bin_dir, python):
    tmp = tempfile.mkdtemp()
    try:
        subprocess.run([python, os.path.join(ROOT, "tests", "reference", "tiny_models.py"),
                        "--out", tmp], check=True, capture_output=True)
        text = os.path.join(tmp, "text.txt")
        with open(text, "w") as f:
            f.write(("In the beginning God created the heaven and the earth. " * 40 + "\n") * 4)
        model = os.path.join(tmp, "tiny_llama3.gguf")
        for name, extra in (("pre_norm", []), ("kv_key_scale", ["--map_target", "kv", "--key_scale", "on"])):
            maps = os.path.join(tmp, name + ".rfmap")
            subprocess.run([os.path.join(bin_dir, "ridgeserve-calibrate"), "--model", model, "--text",
                            text, "--split_layers", "0", "--out", maps, "--window", "128",
                            "--threads", "1"] + extra, check=True, capture_output=True)
            data = open(maps, "rb").read()
            # byte 0: the harness's flags (bit 0 fix the size field, bit 1 fix the checksum)
            write(out, name + ".f0", b"\x00" + data)
            write(out, name + ".f3", b"\x03" + data)
            write(out, name + ".cut.f3", b"\x03" + data[:200])
    finally:
        shutil.rmtree(tmp)


# ------------------------------------------------------------------------------------------
# RidgeFill calibration statistics (engine/ridgefill/stats_file.h). ridgeserve-calibrate
# writes them only after a calibration pass, and the server only as a checkpoint, so these
# are written here from the format spec with random values that obey its shape rules (and
# whose hold-out rows are the ones a CalibrationAccumulator would keep, so they also restore).

XXH_P1, XXH_P2, XXH_P3 = 11400714785074694791, 14029467366897019727, 1609587929392839161
XXH_P4, XXH_P5 = 9650029242287828579, 2870177450012600261
M64 = (1 << 64) - 1


def xxh64(data, seed=0):
    """XXH64 (github.com/Cyan4973/xxHash doc/xxhash_spec.md), as engine/ridgefill/xxh64.cc."""
    def rotl(x, r):
        return ((x << r) | (x >> (64 - r))) & M64

    def round_(acc, lane):
        return rotl((acc + lane * XXH_P2) & M64, 31) * XXH_P1 & M64

    n, i = len(data), 0
    if n >= 32:
        acc = [(seed + XXH_P1 + XXH_P2) & M64, (seed + XXH_P2) & M64, seed, (seed - XXH_P1) & M64]
        while i + 32 <= n:
            for k in range(4):
                acc[k] = round_(acc[k], struct.unpack_from("<Q", data, i + 8 * k)[0])
            i += 32
        h = (rotl(acc[0], 1) + rotl(acc[1], 7) + rotl(acc[2], 12) + rotl(acc[3], 18)) & M64
        for a in acc:
            h = ((h ^ round_(0, a)) * XXH_P1 + XXH_P4) & M64
    else:
        h = (seed + XXH_P5) & M64
    h = (h + n) & M64
    while i + 8 <= n:
        h = (rotl(h ^ round_(0, struct.unpack_from("<Q", data, i)[0]), 27) * XXH_P1 + XXH_P4) & M64
        i += 8
    if i + 4 <= n:
        lane = struct.unpack_from("<I", data, i)[0] * XXH_P1 & M64
        h = (rotl(h ^ lane, 23) * XXH_P2 + XXH_P3) & M64
        i += 4
    while i < n:
        h = rotl(h ^ (data[i] * XXH_P5 & M64), 11) * XXH_P1 & M64
        i += 1
    h = (h ^ (h >> 33)) * XXH_P2 & M64
    h = (h ^ (h >> 29)) * XXH_P3 & M64
    return h ^ (h >> 32)


def stats_file(layers, hidden, kind, splits, name=b"seed-model", fingerprint=0x5eed5eed5eed5eed,
               rng=None):
    """kind: 0 pre_norm, 1 post_norm, 2 kv; splits: [(split layer, seen rows, hold-out stride,
    target dim)]. Header, packed metadata, 64-aligned arrays, XXH64 trailer."""
    rng = rng or random.Random(0)
    align = lambda v: (v + 63) // 64 * 64
    meta_size = 8 + 4 * 3 + 4 + len(name) + 4
    meta_size += sum(8 + 4 * 8 + 4 * 16 + (layers - s - 2) * (4 + 3 * 16) for s, *_ in splits)
    data_offset = align(64 + meta_size)
    blobs, end = [], data_offset

    def place(fmt, values):
        nonlocal end
        if not values:
            return struct.pack("<QQ", 0, 0)
        offset = align(end)
        blob = struct.pack(f"<{len(values)}{fmt}", *values)
        blobs.append((offset, blob))
        end = offset + len(blob)
        return struct.pack("<QQ", offset, len(values))

    def values(n):
        return [rng.uniform(-2, 2) for _ in range(n)]

    meta = struct.pack("<QIIII", fingerprint, layers, hidden, kind, len(name)) + name
    meta += struct.pack("<I", len(splits))
    for s, seen, stride, target_dim in splits:
        held = seen // stride if stride else 0
        gram = values(hidden * hidden)
        for i in range(hidden):
            for j in range(i):
                gram[i * hidden + j] = gram[j * hidden + i]
        meta += struct.pack("<IIqqqq", s, layers - s - 2, seen, stride, seen - held, held)
        meta += place("d", values(hidden)) + place("d", gram)
        meta += place("q", [(h + 1) * stride - 1 for h in range(held)])
        meta += place("f", values(held * hidden))
        for _ in range(layers - s - 2):
            meta += struct.pack("<I", target_dim) + place("d", values(target_dim))
            meta += place("d", values(target_dim * hidden)) + place("f", values(held * target_dim))
    assert len(meta) == meta_size
    header = b"RFSTATS\0" + struct.pack("<IIQQQQ", 1, 64, end + 16, 64, meta_size, data_offset)
    body = bytearray(header + b"\0" * 16 + meta)
    for offset, blob in blobs:
        body += b"\0" * (offset - len(body)) + blob
    body += b"\0" * (end - len(body))
    return bytes(body) + struct.pack("<Q", xxh64(bytes(body))) + b"RFSTSEND"


def stats_file_seeds(out):
    # python-xxhash's documented values (tests/ridgefill/xxh64_test.cc)
    assert xxh64(b"") == 0xEF46DB3751D8E999 and xxh64(b"abc") == 0x44BC2CF5AD770999
    assert xxh64(b"Nobody inspects the spammish repetition") == 0xFBCEA83C8A378BF1
    seeds = {
        # 6 layers, hidden 4, K|V of dim 3; split 2 holds no rows out
        "kv": stats_file(6, 4, 2, [(0, 40, 8, 3), (2, 10, 0, 3)]),
        "pre_norm": stats_file(5, 4, 0, [(1, 30, 4, 4)], rng=random.Random(1)),
        "post_norm_thinned": stats_file(4, 2, 1, [(1, 100, 40, 2)], rng=random.Random(2)),
        "no_splits": stats_file(3, 8, 0, []),
    }
    for name, data in seeds.items():
        # byte 0: the harness's flags (bit 0 fix the size field, bit 1 fix the checksum)
        write(out, name + ".f0", b"\x00" + data)
        write(out, name + ".f3", b"\x03" + data)
        write(out, name + ".cut.f3", b"\x03" + data[:len(data) * 2 // 3])


def write(out, name, data):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, name), "wb") as f:
        f.write(data)


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    bin_dir, out = sys.argv[1], sys.argv[2]
    python = os.path.join(ROOT, ".venv", "bin", "python")
    shutil.rmtree(out, ignore_errors=True)
    gguf_seeds(os.path.join(out, "gguf"))
    safetensors_seeds(os.path.join(out, "safetensors"))
    tokenizer_seeds(os.path.join(out, "tokenizer"))
    tokenizer_json_seeds(os.path.join(out, "tokenizer_json"))
    stop_matcher_seeds(os.path.join(out, "stop_matcher"))
    request_seeds(os.path.join(out, "request_validation"))
    map_file_seeds(os.path.join(out, "map_file"), bin_dir, python)
    stats_file_seeds(os.path.join(out, "stats_file"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
