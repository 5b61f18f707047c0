"""Runs `ridgeserve-eval logits` and reads back its logits; shared by the model-level tests."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import tempfile
from typing import Optional, Sequence

import numpy as np


class EvalError(RuntimeError):
    pass


@dataclasses.dataclass
class EvalLogits:
    logits: np.ndarray  # float32 [tokens, vocab_size]
    token_ids: list[int]
    vocab_size: int
    seconds: float


def eval_binary() -> str:
    bin_dir = os.environ.get("RIDGESERVE_BIN")
    if not bin_dir:
        raise EvalError("RIDGESERVE_BIN is not set (run through ctest)")
    path = os.path.join(bin_dir, "ridgeserve-eval")
    if not os.access(path, os.X_OK):
        raise EvalError(f"{path} is missing or not executable")
    return path


def _parse_json(stdout: str) -> dict:
    try:
        return json.loads(stdout)
    except json.JSONDecodeError:
        pass
    # Tolerate log lines around the JSON object: take the last line that parses.
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    raise EvalError(f"no JSON object on stdout: {stdout[-500:]!r}")


def run_logits(
    model: str,
    token_ids: Optional[Sequence[int]] = None,
    text_file: Optional[str] = None,
    chunk: Optional[int] = None,
    timeout_s: float = 600.0,
    activations: Optional[str] = None,
    kv_cache_dtype: Optional[str] = None,
    tensor_parallel: Optional[int] = None,
) -> EvalLogits:
    """ridgeserve-eval logits on token ids or a text file; checks the output's shape.
    `activations` is the CPU Linear arithmetic (--cpu_activations: "f32", the default, or
    "int8"); `kv_cache_dtype` is --kv_cache_dtype (the binary's default, f16 on the CPU, when
    None); `tensor_parallel` shards the model over that many ranks (--tensor_parallel)."""
    import time

    if (token_ids is None) == (text_file is None):
        raise ValueError("give exactly one of token_ids and text_file")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "logits.f32")
        cmd = [eval_binary(), "logits", "--model", model, "--out", out]
        if token_ids is not None:
            cmd += ["--token_ids", ",".join(str(int(t)) for t in token_ids)]
        else:
            cmd += ["--text", text_file]
        if chunk is not None:
            cmd += ["--chunk", str(chunk)]
        if activations is not None:
            cmd += ["--cpu_activations", activations]
        if kv_cache_dtype is not None:
            cmd += ["--kv_cache_dtype", kv_cache_dtype]
        if tensor_parallel is not None:
            cmd += ["--tensor_parallel", str(tensor_parallel)]
        start = time.monotonic()
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        seconds = time.monotonic() - start
        if proc.returncode != 0:
            raise EvalError(
                f"{' '.join(cmd[:6])} ... exited {proc.returncode}: {proc.stderr.strip()[-1000:]}"
            )
        info = _parse_json(proc.stdout)
        n, vocab = int(info["tokens"]), int(info["vocab_size"])
        ids = [int(t) for t in info.get("token_ids", [])]
        raw = np.fromfile(out, dtype="<f4")
    if raw.size != n * vocab:
        raise EvalError(f"logits file has {raw.size} floats, expected {n} x {vocab}")
    if token_ids is not None and ids and ids != [int(t) for t in token_ids]:
        raise EvalError("token_ids in the JSON differ from the ones passed with --token_ids")
    return EvalLogits(raw.reshape(n, vocab), ids, vocab, seconds)


def compare(name: str, got: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
    """Prints and returns (max |d|, mean |d|) between two logit matrices of equal shape."""
    if got.shape != ref.shape:
        raise EvalError(f"{name}: shape {got.shape} != reference {ref.shape}")
    d = np.abs(got.astype(np.float64) - ref.astype(np.float64))
    worst = np.unravel_index(int(d.argmax()), d.shape)
    print(
        f"{name}: max|d|={d.max():.3g} (position {worst[0]}, token {worst[1]}) "
        f"mean|d|={d.mean():.3g} over {got.shape[0]} positions x {got.shape[1]} logits"
    )
    return float(d.max()), float(d.mean())
