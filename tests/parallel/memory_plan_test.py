"""ridgeserve-plan on a ~27B Qwen3-style config.json (../shared/MODEL_NOTES.md's shape: hidden
5120, 60 layers, 40 heads / 8 KV heads, head_dim 128, FFN 24576, vocab 151936, untied, QK-norm;
no weights): it must fit at TP=1 on one 141 GB H200 and at TP=2 on two 80 GB GPUs, and be
refused at TP=1 on one 48 GB GPU, naming the shortfall. The parameter count, weight bytes and
KV bytes per token are checked against sums written out here from the shape, independently
of the planner's code. Also: a TP size that does not divide the heads is refused (exit 2).
"""

import json
import os
import re
import subprocess
import sys

BIN = os.path.join(os.environ["RIDGESERVE_BIN"], "ridgeserve-plan")
CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "qwen3_27b_config.json")

failures = []


def expect(ok, what):
    print(("ok    " if ok else "FAIL  ") + what)
    if not ok:
        failures.append(what)


def plan(*args):
    proc = subprocess.run([BIN, "--model", CONFIG, *args], capture_output=True, text=True,
                          timeout=60)
    print(f"$ ridgeserve-plan {' '.join(args)}  -> exit {proc.returncode}")
    print((proc.stdout + proc.stderr).rstrip())
    return proc


with open(CONFIG) as f:
    c = json.load(f)
h, L, nh, nkv, hd = (c["hidden_size"], c["num_hidden_layers"], c["num_attention_heads"],
                     c["num_key_value_heads"], c["head_dim"])
ff, vocab = c["intermediate_size"], c["vocab_size"]


def params_per_rank(tp):
    q, kv = nh * hd // tp, max(1, nkv // tp) * hd
    vocab_rows = -(-vocab // tp)
    matrices = 2 * vocab_rows * h + L * ((q + 2 * kv) * h + h * q + 3 * (ff // tp) * h)
    vectors = h + L * (2 * h + 2 * hd) + hd // 2
    return matrices, vectors


total = 2 * vocab * h + h + L * ((nh * hd + 2 * nkv * hd) * h + h * nh * hd + 3 * ff * h
                                 + 2 * h + 2 * hd)
print(f"parameters from the shape: {total / 1e9:.3f}B")
expect(27.5e9 < total < 28.5e9, "the config is the ~27.9B shape of MODEL_NOTES.md")

for tp, memory, fits in ((1, "141GB", True), (2, "80GB", True), (1, "48GB", False)):
    proc = plan("--tensor_parallel", str(tp), "--device_memory", memory)
    out = proc.stdout
    if not fits:
        expect(proc.returncode == 1, f"TP={tp} on {memory}: refused with exit 1")
        m = re.search(r"short by ([0-9.]+) GB", proc.stderr)
        expect(m is not None and float(m.group(1)) > 10,
               f"TP={tp} on {memory}: the refusal names a shortfall of more than 10 GB")
        continue
    expect(proc.returncode == 0, f"TP={tp} on {memory}: fits (exit 0)")
    m = re.search(r"([0-9.]+)B parameters", out)
    expect(m is not None and abs(float(m.group(1)) * 1e9 - total) < 0.01e9,
           f"TP={tp}: parameter count {m.group(1) if m else '?'}B equals the shape's")
    matrices, vectors = params_per_rank(tp)
    want_weights = (2 * matrices + 4 * vectors) / 1e9
    m = re.search(r"weights ([0-9.]+) GB \(bf16\)", out)
    expect(m is not None and abs(float(m.group(1)) - want_weights) < 0.01,
           f"TP={tp}: bf16 weights per rank {m.group(1) if m else '?'} GB = {want_weights:.2f}")
    kv_kib = 2 * L * (nkv // tp) * hd * 2 / 1024
    m = re.search(r"KV cache: ([0-9.]+) KiB per token per rank", out)
    expect(m is not None and abs(float(m.group(1)) - kv_kib) < 0.05,
           f"TP={tp}: KV {m.group(1) if m else '?'} KiB a token per rank = {kv_kib}")
    m = re.search(r"capacity (\d+) tokens per rank", out)
    expect(m is not None and int(m.group(1)) >= c["max_position_embeddings"],
           f"TP={tp}: KV capacity holds at least one full context")

proc = plan("--tensor_parallel", "3", "--device_memory", "80GB")
expect(proc.returncode == 2 and "does not divide" in proc.stderr and "40 attention heads"
       in proc.stderr, "TP=3: refused naming the 40 heads, exit 2")

print("PASS" if not failures else f"FAILED ({len(failures)} checks)")
sys.exit(1 if failures else 0)
