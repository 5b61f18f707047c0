"""ridgeserve-eval logits on the default model vs the independent NumPy reference.

At every position of >= 512 tokens of fixed English text (Apache-2.0 licence text):
  * with --cpu_activations f32, max |d| and mean |d| between the C++ logits (float32) and the
    float64 reference computed from the same dequantized weights stay under MAX_ABS_DIFF /
    MEAN_ABS_DIFF;
  * with --cpu_activations int8, the top-1 token agrees with the reference wherever its
    top-2 margin exceeds INT8_MARGIN, and perplexity is within INT8_PPL_REL of the f32 path's;
  * for both, the top-1 token agrees wherever the reference's top-2 margin exceeds MARGIN
    (f32) and prefilling in chunks of 100 tokens gives bitwise the same logits (batch
    invariance);
  * those two run with --kv_cache_dtype f32; with the default KV cache (f16) and f32
    activations, the logits stay within KV16_MAX_ABS_DIFF / KV16_MEAN_ABS_DIFF of the
    reference with K and V rounded to f16 as the cache holds them, top-1 agrees wherever the
    margin exceeds KV16_MARGIN, perplexity is within KV16_PPL_REL of the f32 cache's, and
    chunked prefill is bitwise the same too;
  * the token ids ridgeserve-eval produced from --text equal those of an independent tokenizer
    (HF `tokenizers` BPE built from the GGUF's vocabulary and merges).
Prints the numbers it checked; exits nonzero on failure.
"""

import os
import sys
import tempfile
import time

import numpy as np

SOURCE_DIR = os.environ.get(
    "RIDGESERVE_SOURCE_DIR", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
)
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.join(SOURCE_DIR, "tests", "reference"))

import eval_cli  # noqa: E402
import gguf_tokenizer  # noqa: E402
import llama_numpy  # noqa: E402

TEXT_FILES = ["/usr/share/common-licenses/Apache-2.0", "/usr/share/common-licenses/GPL-3"]
TEXT_CHARS = 3000  # ~585 SmolLM2 tokens of the Apache licence
MIN_TOKENS = 512

# Bounds. Both sides use the same dequantized weights, so the difference is float32 rounding
# in the C++ forward pass against a float64 reference. Measured on this text: the same NumPy
# forward in float32 (BLAS sums) gives max|d| 7.8e-5, mean 7e-6 (printed below as a
# calibration line); ridgeserve-eval's CPU path gave max 1.35e-4, mean 1e-5. Logits reach ~40
# in magnitude. The bounds leave ~15x room for another summation order, FMA or a polynomial
# exp, and still catch small semantic slips: RMSNorm eps 1e-6 instead of 1e-5 moves the
# logits by max 0.068 / mean 2.1e-3, rounding the LM head to f16 by max 0.023 / mean 2.1e-3;
# a wrong rope pair, skipped bias or off-by-one position is O(1). Kernels that quantize
# activations (ggml's q8_1 dot products) fail on purpose: this path is float32 math on exact
# dequantized weights.
MAX_ABS_DIFF = 2e-3
MEAN_ABS_DIFF = 2e-4
MARGIN = 1e-3
# int8 activations move logits by about 0.1 (measured max and mean printed below): top-1 is
# checked where the reference's margin is clearly above that, and perplexity against f32's.
INT8_MARGIN = 0.5
INT8_PPL_REL = 0.005
# An f16 cache rounds each K/V element by up to 2^-11 of itself. The C++ and NumPy forwards
# differ by float32 rounding before that step, so elements near a rounding boundary round
# differently on the two sides, and the differences compound over 30 layers: measured max|d|
# 0.029, mean 1.8e-3 against the reference with f16 K/V (0.067 / 3.1e-3 against the plain
# reference), perplexity 15.666 against 15.668. Bounds ~3x that still catch a stored value
# read from the wrong slot, type or half (O(1)); the kernel tests hold the f16 cache bitwise
# to an f32 cache of the rounded values.
KV16_MAX_ABS_DIFF = 0.1
KV16_MEAN_ABS_DIFF = 6e-3
KV16_MARGIN = 0.2
KV16_PPL_REL = 1e-3
CHUNK = 100
# --chunk for "one prefill": larger than any input here (the tool's default is 512 rows).
ONE_PREFILL = 1 << 20


def check_bounds(name: str, got: np.ndarray, ref: np.ndarray, max_abs: float, mean_abs: float,
                 margin: float) -> list[str]:
    """max|d| and mean|d| of got against ref, and top-1 agreement where the reference's
    top-2 margin exceeds `margin`; the failures found."""
    failures = []
    max_d, mean_d = eval_cli.compare(name, got, ref)
    per_pos = np.abs(got.astype(np.float64) - ref).max(axis=1)
    bad_pos = np.nonzero(per_pos > max_abs)[0]
    if max_d > max_abs:
        failures.append(
            f"{name}: max|d| {max_d:.3g} > {max_abs} at {bad_pos.size} positions, first "
            f"{bad_pos[:10].tolist()}"
        )
    if mean_d > mean_abs:
        failures.append(f"{name}: mean|d| {mean_d:.3g} > {mean_abs}")
    top2 = np.sort(ref, axis=1)[:, -2:]
    decisive = (top2[:, 1] - top2[:, 0]) > margin
    disagree = np.nonzero(decisive & (got.argmax(axis=1) != ref.argmax(axis=1)))[0]
    print(f"{name}: top-1 checked at {int(decisive.sum())}/{len(ref)} positions "
          f"(top-2 margin > {margin}), disagreements: {disagree.size}")
    if disagree.size:
        failures.append(f"{name}: top-1 differs at positions {disagree[:10].tolist()}")
    return failures


def main() -> int:
    model_path = os.environ.get("RIDGESERVE_DEFAULT_MODEL")
    if not model_path or not os.path.exists(model_path):
        print(f"FAIL: RIDGESERVE_DEFAULT_MODEL={model_path!r} does not exist")
        return 1
    text_path = next((p for p in TEXT_FILES if os.path.exists(p)), None)
    if text_path is None:
        print(f"FAIL: none of {TEXT_FILES} exists")
        return 1
    with open(text_path, encoding="utf-8") as f:
        text = f.read()[:TEXT_CHARS]

    start = time.monotonic()
    ref_model = llama_numpy.load_model(model_path)
    ref_ids = gguf_tokenizer.encode(ref_model.metadata, text)
    print(f"text: first {TEXT_CHARS} chars of {text_path} -> {len(ref_ids)} tokens "
          f"(independent tokenizer)")
    if len(ref_ids) < MIN_TOKENS:
        print(f"FAIL: only {len(ref_ids)} tokens, need {MIN_TOKENS}")
        return 1
    ref = ref_model.forward(ref_ids)
    ref32 = ref_model.astype(np.float32).forward(ref_ids)
    print(f"reference: float64 forward in {time.monotonic() - start:.1f}s, "
          f"perplexity {llama_numpy.perplexity(ref, ref_ids):.3f}")
    eval_cli.compare("calibration: numpy float32 vs float64", ref32, ref)
    del ref32

    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        text_file = os.path.join(tmp, "text.txt")
        with open(text_file, "w", encoding="utf-8") as f:
            f.write(text)
        full = eval_cli.run_logits(model_path, text_file=text_file, chunk=ONE_PREFILL,
                                   activations="f32", kv_cache_dtype="f32")
        print(f"ridgeserve-eval --text: {len(full.token_ids)} tokens in {full.seconds:.1f}s")
        if full.token_ids != ref_ids:
            first = next(
                (i for i, (a, b) in enumerate(zip(full.token_ids, ref_ids)) if a != b),
                min(len(full.token_ids), len(ref_ids)),
            )
            failures.append(
                f"token ids differ from the reference tokenizer at index {first}: "
                f"got {full.token_ids[first:first + 8]}, expected {ref_ids[first:first + 8]}"
            )
            # Compare logits on the reference ids anyway, so this test still measures the model.
            full = eval_cli.run_logits(model_path, token_ids=ref_ids, chunk=ONE_PREFILL,
                                       activations="f32", kv_cache_dtype="f32")
            chunk_args = {"token_ids": ref_ids}
        else:
            print("token ids: identical to the reference tokenizer")
            chunk_args = {"text_file": text_file}

        failures += check_bounds("ridgeserve-eval vs reference", full.logits, ref, MAX_ABS_DIFF,
                                 MEAN_ABS_DIFF, MARGIN)
        top2 = np.sort(ref, axis=1)[:, -2:]
        f32_ppl = llama_numpy.perplexity(full.logits, ref_ids)
        print(f"ridgeserve-eval f32 perplexity {f32_ppl:.3f}")

        int8 = eval_cli.run_logits(model_path, chunk=ONE_PREFILL, activations="int8",
                                   kv_cache_dtype="f32", **chunk_args)
        eval_cli.compare("ridgeserve-eval int8 vs reference", int8.logits, ref)
        int8_ppl = llama_numpy.perplexity(int8.logits, ref_ids)
        rel = abs(int8_ppl - f32_ppl) / f32_ppl
        print(f"ridgeserve-eval int8 perplexity {int8_ppl:.3f} ({100 * rel:.2f}% from f32)")
        if rel > INT8_PPL_REL:
            failures.append(f"int8 perplexity {int8_ppl:.3f} is {100 * rel:.2f}% from f32's")
        decisive8 = (top2[:, 1] - top2[:, 0]) > INT8_MARGIN
        disagree8 = np.nonzero(decisive8 & (int8.logits.argmax(axis=1) != ref.argmax(axis=1)))[0]
        agree_all = float(np.mean(int8.logits.argmax(axis=1) == ref.argmax(axis=1)))
        print(f"int8 top-1: checked at {int(decisive8.sum())}/{len(ref_ids)} positions (top-2 "
              f"margin > {INT8_MARGIN}), disagreements: {disagree8.size}; agreement at every "
              f"position {100 * agree_all:.1f}%")
        if disagree8.size:
            failures.append(f"int8 top-1 differs at positions {disagree8[:10].tolist()}")

        # The default KV cache (f16) against the reference with K and V rounded to f16.
        ref16 = ref_model.forward(ref_ids, kv_dtype="f16")
        eval_cli.compare("reference with f16 K/V vs reference", ref16, ref)
        kv16 = eval_cli.run_logits(model_path, chunk=ONE_PREFILL, activations="f32", **chunk_args)
        failures += check_bounds("ridgeserve-eval f16 KV vs reference with f16 K/V", kv16.logits,
                                 ref16, KV16_MAX_ABS_DIFF, KV16_MEAN_ABS_DIFF, KV16_MARGIN)
        kv16_ppl = llama_numpy.perplexity(kv16.logits, ref_ids)
        rel16 = abs(kv16_ppl - f32_ppl) / f32_ppl
        print(f"ridgeserve-eval f16 KV perplexity {kv16_ppl:.3f} ({100 * rel16:.3f}% from the f32 "
              f"cache's)")
        if rel16 > KV16_PPL_REL:
            failures.append(f"f16 KV perplexity {kv16_ppl:.3f} is {100 * rel16:.3f}% from f32's")

        for name, act, kv, one in (("f32", "f32", "f32", full), ("int8", "int8", "f32", int8),
                                   ("f16 KV", "f32", None, kv16)):
            chunked = eval_cli.run_logits(model_path, chunk=CHUNK, activations=act,
                                          kv_cache_dtype=kv, **chunk_args)
            if chunked.logits.shape != one.logits.shape:
                failures.append(f"{name} --chunk {CHUNK}: shape {chunked.logits.shape}")
                continue
            differ = np.nonzero(np.any(chunked.logits.view(np.uint32) !=
                                       one.logits.view(np.uint32), axis=1))[0]
            print(f"{name} --chunk {CHUNK}: {differ.size} positions not bitwise identical to one "
                  f"prefill (max|d| {np.abs(chunked.logits - one.logits).max():.3g})")
            if differ.size:
                failures.append(
                    f"{name} --chunk {CHUNK} changes logits at positions {differ[:10].tolist()}"
                )

    for f in failures:
        print("FAIL:", f)
    print("PASS" if not failures else "FAILED")
    return 1 if failures else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except eval_cli.EvalError as e:
        print("FAIL:", e)
        sys.exit(1)
