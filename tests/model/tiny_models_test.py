"""ridgeserve-eval logits on tiny random-weight models, HF directory vs GGUF vs NumPy reference.

The models (tests/reference/tiny_models.py) cover llama with tied embeddings, llama with an
untied lm_head + llama3 rope scaling + BOS + F16 + a sharded HF copy, qwen2 with q/k/v bias and
a padded vocabulary, and qwen3 with QK-norm, head_dim != hidden/heads and BF16. For each:
  * the reference gives the same logits from the HF directory and the GGUF (checks the fixture:
    Q/K permutation and rope modes);
  * ridgeserve-eval on the HF dir and on the GGUF each match the reference (<= REF_TOL) and
    each other (<= CROSS_TOL); the sharded copy gives bitwise the same logits as the single file;
  * --chunk 7 gives bitwise the same logits as a single prefill;
  * sharded over 2 ranks (KV heads split) and 4 ranks (KV heads replicated: 4 heads / 2 KV
    heads), --tensor_parallel gives logits that match the reference (<= REF_TOL) and TP=1
    (<= TP_TOL: the row-parallel sums add in another order), the same greedy token wherever
    TP=1's top-2 margin exceeds twice that, and --chunk 7 bitwise equal to one prefill at the
    same TP size;
  * --text (plain text, no special-token strings): token ids equal the HF `tokenizers`
    encoding of tokenizer.json (BOS where the model adds one) for both copies, and those
    logits match the reference too.
Prints every number it checked; exits nonzero on failure.
"""

import os
import sys
import tempfile

import numpy as np

SOURCE_DIR = os.environ.get(
    "RIDGESERVE_SOURCE_DIR", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
)
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.join(SOURCE_DIR, "tests", "reference"))

import eval_cli  # noqa: E402
import llama_numpy  # noqa: E402
import tiny_models  # noqa: E402

NUM_TOKENS = 200  # positions up to 199: past the llama3 model's original context of 64
# Logits here have std 2-4 and reach ~20. The NumPy forward in float32 lands at max|d| up to
# ~3e-5 from float64 on these models (printed per model as "calibration"); 1e-4 leaves room
# for another summation order, while a wrong rope pair, bias, norm or position is O(1).
REF_TOL = 1e-4
# The HF and GGUF copies hold identical values. For qwen2/qwen3 the layouts are identical too,
# so float32 results may match exactly; for llama the Q/K rows are permuted, which reorders the
# q.k sums (NumPy float32: ~2e-5 between the copies), and llama3's GGUF carries theta divisors
# rounded to float32 (~1e-6 in the logits).
CROSS_TOL = 5e-5
# The reference itself on the two copies: exact up to float64 rounding except the llama3
# float32 divisors above.
FIXTURE_TOL = 1e-5
CHUNK = 7
# TP vs TP=1: the same float32 math with the attention/MLP output projections summed in a
# different order (partial sums per rank, then in rank order): rounding-level differences.
TP_TOL = 5e-5
TP_SIZES = (2, 4)
# An f32 KV cache: these bounds hold the kernels' float32 math to the reference; the default f16
# cache rounds K/V (reference_logits_test.py checks it on the default model).
KV = "f32"
ONE_PREFILL = 1 << 20  # --chunk larger than any input: the whole sequence in one pass
# Plain text only: whether --text parses special-token strings is a tokenizer option, not
# what this test is about.
TEXT = (
    "user: The quick brown fox jumps over the lazy dog 1234 times, doesn't it?"
    "  Tabs\tand  spaces,\n\nnew lines; Ünïcödé & 日本語!\nassistant:\n"
)


class Checker:
    def __init__(self):
        self.failures = []

    def expect(self, ok: bool, what: str):
        if not ok:
            self.failures.append(what)
            print("  FAIL:", what)

    def within(self, name: str, got: np.ndarray, ref: np.ndarray, tol: float):
        try:
            max_d, _ = eval_cli.compare("  " + name, got, ref)
        except eval_cli.EvalError as e:
            self.expect(False, str(e))
            return
        self.expect(max_d <= tol, f"{name}: max|d| {max_d:.3g} > {tol}")

    def identical(self, name: str, got: np.ndarray, ref: np.ndarray):
        same = got.shape == ref.shape and np.array_equal(got.view(np.uint32), ref.view(np.uint32))
        detail = "" if got.shape != ref.shape else f" (max|d| {np.abs(got - ref).max():.3g})"
        print(f"  {name}: {'bitwise identical' if same else 'DIFFERENT' + detail}")
        self.expect(same, f"{name}: not bitwise identical{detail}")


def check_model(m, tmp: str, c: Checker):
    from tokenizers import Tokenizer

    spec = m.spec
    print(f"{spec.name} ({spec.model_type}, {spec.dtype}, {spec.num_layers} layers, "
          f"vocab rows {spec.vocab_rows})")
    ids = tiny_models.sample_token_ids(spec, NUM_TOKENS)
    ref_hf_model = llama_numpy.load_model(m.hf_dir)
    ref_gguf_model = llama_numpy.load_model(m.gguf_path)
    ref = ref_hf_model.forward(ids)
    eval_cli.compare("  calibration: numpy float32 vs float64",
                     ref_hf_model.astype(np.float32).forward(ids), ref)
    c.within(
        "fixture: reference gguf vs reference hf", ref_gguf_model.forward(ids), ref, FIXTURE_TOL
    )

    copies = {"hf": m.hf_dir, "gguf": m.gguf_path}
    if m.hf_sharded_dir:
        copies["hf_sharded"] = m.hf_sharded_dir
    out = {}
    for label, path in copies.items():
        try:
            out[label] = eval_cli.run_logits(path, token_ids=ids, chunk=ONE_PREFILL,
                                             kv_cache_dtype=KV).logits
        except eval_cli.EvalError as e:
            c.expect(False, f"{spec.name} {label}: {e}")
            continue
        c.within(f"ridgeserve-eval {label} vs reference", out[label], ref, REF_TOL)
    if "hf" in out and "gguf" in out:
        c.within("ridgeserve-eval gguf vs hf", out["gguf"], out["hf"], CROSS_TOL)
    if "hf" in out and "hf_sharded" in out:
        c.identical("ridgeserve-eval hf_sharded vs hf", out["hf_sharded"], out["hf"])
    for label in ("hf", "gguf"):
        if label not in out:
            continue
        try:
            chunked = eval_cli.run_logits(copies[label], token_ids=ids, chunk=CHUNK,
                                          kv_cache_dtype=KV).logits
            c.identical(f"{label} --chunk {CHUNK} vs one prefill", chunked, out[label])
        except eval_cli.EvalError as e:
            c.expect(False, f"{spec.name} {label} --chunk: {e}")

    for label in ("hf", "gguf"):
        if label not in out:
            continue
        top2 = np.sort(out[label], axis=1)[:, -2:]
        decided = top2[:, 1] - top2[:, 0] > 2 * TP_TOL
        for tp in TP_SIZES:
            name = f"{label} --tensor_parallel {tp}"
            try:
                got = eval_cli.run_logits(copies[label], token_ids=ids, chunk=ONE_PREFILL,
                                          kv_cache_dtype=KV, tensor_parallel=tp).logits
                chunked = eval_cli.run_logits(copies[label], token_ids=ids, chunk=CHUNK,
                                              kv_cache_dtype=KV, tensor_parallel=tp).logits
            except eval_cli.EvalError as e:
                c.expect(False, f"{spec.name} {name}: {e}")
                continue
            c.within(f"{name} vs reference", got, ref, REF_TOL)
            c.within(f"{name} vs TP=1", got, out[label], TP_TOL)
            same = got.argmax(axis=1) == out[label].argmax(axis=1)
            print(f"  {name}: greedy token equal to TP=1 at {int(same[decided].sum())} of "
                  f"{int(decided.sum())} positions with margin > {2 * TP_TOL}")
            c.expect(bool(same[decided].all()), f"{spec.name} {name}: greedy token differs")
            c.identical(f"{name} --chunk {CHUNK} vs one prefill", chunked, got)

    # Text: tokenizer.json through HF tokenizers is the reference tokenization.
    text_file = os.path.join(tmp, "text.txt")
    with open(text_file, "w", encoding="utf-8") as f:
        f.write(TEXT)
    want_ids = Tokenizer.from_file(os.path.join(m.hf_dir, "tokenizer.json")).encode(TEXT).ids
    ref_text = ref_hf_model.forward(want_ids)
    for label in ("hf", "gguf"):
        try:
            got = eval_cli.run_logits(copies[label], text_file=text_file, chunk=ONE_PREFILL,
                                      kv_cache_dtype=KV)
        except eval_cli.EvalError as e:
            c.expect(False, f"{spec.name} {label} --text: {e}")
            continue
        same = got.token_ids == want_ids
        print(f"  {label} --text: {len(got.token_ids)} tokens, "
              f"{'ids match HF tokenizers' if same else 'ids DIFFER'}")
        c.expect(same, f"{spec.name} {label} --text ids {got.token_ids[:12]}... != "
                       f"HF tokenizers {want_ids[:12]}...")
        if same:
            c.within(f"{label} --text logits vs reference", got.logits, ref_text, REF_TOL)


def main() -> int:
    c = Checker()
    with tempfile.TemporaryDirectory() as tmp:
        written = tiny_models.write_all(os.path.join(tmp, "models"))
        for m in written:
            check_model(m, tmp, c)
    for f in c.failures:
        print("FAIL:", f)
    print("PASS" if not c.failures else f"FAILED ({len(c.failures)} checks)")
    return 1 if c.failures else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except eval_cli.EvalError as e:
        print("FAIL:", e)
        sys.exit(1)
