"""cuda_bench on the CPU backend, as tests/gpu/run.sh runs it on a GPU: a model with random bf16
weights from tests/gpu/tiny_llama_config.json (the path that measures Llama-3.1-8B's shape
without its weights) and the default model. The JSON must carry every number asked for, finite
and positive; the random model's resident weight bytes must equal the shape's bf16 matrices
and f32 vectors summed here from the config; bad flags exit 2 with one line.
"""

import json
import math
import os
import subprocess
import sys

BIN = os.path.join(os.environ["RIDGESERVE_BIN"], "cuda_bench")
HERE = os.path.dirname(os.path.abspath(__file__))
TINY = os.path.join(HERE, "tiny_llama_config.json")
MODEL = os.environ.get("RIDGESERVE_DEFAULT_MODEL", "")

failures = []


def expect(ok, what):
    print(("ok    " if ok else "FAIL  ") + what)
    if not ok:
        failures.append(what)


def bench(*args):
    p = subprocess.run([BIN, "--backend", "cpu", "--threads", "2", *args], capture_output=True,
                       text=True, timeout=600)
    print(f"$ cuda_bench {' '.join(args)} -> exit {p.returncode}\n{p.stdout}{p.stderr[-600:]}")
    return p


def result(p):
    """The JSON object: the last line of stdout that starts with "{" (logs may come before)."""
    lines = [x for x in p.stdout.splitlines() if x.startswith("{")]
    return json.loads(lines[-1]) if p.returncode == 0 and lines else {}


def positive(result, key):
    v = result.get(key)
    expect(isinstance(v, (int, float)) and math.isfinite(v) and v > 0, f"{key} = {v}")


# The tiny random model: prefill with MFU, RidgeFill at half depth, decode at two batch sizes.
p = bench("--random_config", TINY, "--prefill_tokens", "96,160", "--chunk", "64",
          "--decode_batches", "1,3", "--decode_tokens", "4", "--decode_context", "16",
          "--ridgefill_depths", "0.5", "--exact_tail_tokens", "32", "--repeats", "1",
          "--peak_tflops", "1", "--peak_hbm_gbps", "10", "--attention_tokens", "40,300",
          "--attention_f16_up_to", "40", "--selection_tokens", "200,300",
          "--selection_budget", "40")
expect(p.returncode == 0, "random model: exit 0")
r = result(p)
for n in (96, 160):
    for suffix in ("tokens_per_s", "seconds", "mfu"):
        positive(r, f"prefill_{n}_{suffix}")
    positive(r, f"ridgefill_{n}_split3_seconds")
    positive(r, f"ridgefill_{n}_split3_speedup")
for b in (1, 3):
    positive(r, f"decode_b{b}_tokens_per_s")
    positive(r, f"decode_b{b}_hbm_share")
# Attention alone on the CPU's default cache (f16); f16 again is not asked for twice.
for n in (40, 300):
    positive(r, f"attention_{n}_f16_seconds")
    positive(r, f"attention_{n}_f16_tflops")
expect(not any(k.startswith("attention_") and "bf16" in k for k in r),
       "no bf16 attention keys on the CPU backend")
# SpecKV's selection of one layer, and the model's layers' worth of it.
for n in (200, 300):
    for part in ("scores", "compact", "all_layers"):
        positive(r, f"selection_{n}_{part}_seconds")

with open(TINY) as f:
    c = json.load(f)
h, L, ff, vocab = c["hidden_size"], c["num_hidden_layers"], c["intermediate_size"], c["vocab_size"]
hd = h // c["num_attention_heads"]
q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
matrices = 2 * vocab * h + L * (h * (q + 2 * kv) + h * q + 3 * ff * h)
vectors = h + L * 2 * h + hd // 2  # final norm, two norms a layer, RoPE's inverse frequencies
expect(r.get("weight_bytes") == 2 * matrices + 4 * vectors,
       f"random model weight bytes {r.get('weight_bytes')} == {2 * matrices + 4 * vectors} "
       "(bf16 matrices, f32 vectors of the config's shape)")

# The default model, as run.sh measures it.
if MODEL and os.path.exists(MODEL):
    p = bench("--model", MODEL, "--prefill_tokens", "64", "--decode_batches", "2",
              "--decode_tokens", "4", "--decode_context", "16", "--repeats", "1")
    expect(p.returncode == 0, "default model: exit 0")
    r = result(p)
    positive(r, "prefill_64_tokens_per_s")
    positive(r, "decode_b2_tokens_per_s")

# 0.9 of 6 layers is split 5, past the last split a map file allows (layers - 3).
for bad in (["--ridgefill_depths", "1.5"], ["--ridgefill_depths", "0.9"], ["--decode_batches", "x"],
            ["--attention_tokens", "0"], ["--selection_tokens", "100"]):
    p = bench("--random_config", TINY, *bad)
    lines = [x for x in (p.stdout + p.stderr).splitlines() if x.strip()]
    expect(p.returncode == 2 and len(lines) == 1 and bad[0][2:] in lines[0],
           f"{' '.join(bad)}: exit 2 and one line naming the flag")

if failures:
    print(f"{len(failures)} check(s) FAILED")
    sys.exit(1)
print("all checks passed")
