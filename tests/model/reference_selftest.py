"""Checks of the NumPy reference itself (no C++ needed), so the C++ tests stand on solid ground.

  * Tiny models: the reference on the HF directory, the sharded directory and the GGUF agree
    (the GGUF side uses llama.cpp's Q/K permutation, adjacent-pair RoPE for llama and the
    converter's per-pair llama3 rope factors; the HF side half-split RoPE and transformers'
    llama3 formula), and flipping the rope mode on the llama GGUF breaks the agreement (the
    check can fail).
  * Tokenizers: the GGUF-vocabulary tokenizer (gguf_tokenizer.py) encodes like tokenizer.json.
  * Real SmolLM2 GGUF: greedy continuation of "The capital of France is" starts with " Paris",
    perplexity on licence text lies in [5, 30], and the wrong rope mode makes it far worse.
Prints what it checked; exits nonzero on failure.
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

import gguf_tokenizer  # noqa: E402
import llama_numpy  # noqa: E402
import tiny_models  # noqa: E402

TEXT = "<|im_start|>user\nHello 2025 world, doesn't it?  Ünïcödé 日本語\t!<|im_end|>\n"
LICENSE = "/usr/share/common-licenses/Apache-2.0"


def main() -> int:
    failures = []

    def expect(ok, what):
        print(("ok:   " if ok else "FAIL: ") + what)
        if not ok:
            failures.append(what)

    with tempfile.TemporaryDirectory() as tmp:
        written = tiny_models.write_all(tmp)
        expect(tiny_models.check(written), "tiny models: reference agrees on every copy (1e-5)")
        from tokenizers import Tokenizer

        for m in written:
            hf = Tokenizer.from_file(os.path.join(m.hf_dir, "tokenizer.json")).encode(TEXT).ids
            meta = llama_numpy.load_model(m.gguf_path).metadata
            expect(gguf_tokenizer.encode(meta, TEXT) == hf,
                   f"{m.spec.name}: GGUF-vocabulary tokenizer == tokenizer.json ({len(hf)} ids)")
        llama = next(m for m in written if m.spec.name == "tiny_llama")
        ids = tiny_models.sample_token_ids(llama.spec, 64)
        good = llama_numpy.load_model(llama.hf_dir).forward(ids)
        wrong = llama_numpy.load_model(llama.gguf_path)
        wrong.cfg.rope_mode = "neox"
        diff = float(np.abs(wrong.forward(ids) - good).max())
        expect(diff > 0.1, f"tiny_llama GGUF with half-split rope differs from HF by {diff:.3g}")

    model_path = os.environ.get("RIDGESERVE_DEFAULT_MODEL")
    if not model_path or not os.path.exists(model_path):
        expect(False, f"default model {model_path!r} exists")
    else:
        # float32 is plenty for these coarse checks and twice as fast.
        m = llama_numpy.load_model(model_path, dtype=np.float32)
        ids = gguf_tokenizer.encode(m.metadata, "The capital of France is")
        for _ in range(3):
            ids.append(int(m.forward(ids)[-1].argmax()))
        text = gguf_tokenizer.tokenizer_from_gguf_metadata(m.metadata).decode(ids)
        expect(text.startswith("The capital of France is Paris"), f"greedy: {text!r}")
        with open(LICENSE, encoding="utf-8") as f:
            ids = gguf_tokenizer.encode(m.metadata, f.read()[:2500])
        ppl = llama_numpy.perplexity(m.forward(ids), ids)
        expect(5.0 <= ppl <= 30.0, f"perplexity {ppl:.2f} over {len(ids)} tokens of {LICENSE}")
        m.cfg.rope_mode = "neox"
        bad = llama_numpy.perplexity(m.forward(ids), ids)
        expect(bad > 3 * ppl, f"half-split rope on the GGUF gives perplexity {bad:.1f}")

    print("PASS" if not failures else f"FAILED ({len(failures)})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
