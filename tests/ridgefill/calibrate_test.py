"""ridgeserve-calibrate end to end, on the real default model and on a tiny reference model.

1. Tiny model, exact check: tiny_llama3 (3 layers, HF directory) calibrated at split 0 with a
   fixed λ (Cholesky path). An independent NumPy float64 pass (tests/reference/llama_numpy.py)
   gives h_0 and the residual entering layer 2 for the same windows; the same hold-out rule
   (every 10th accumulated row) and sink exclusion; W = C (G + λI)⁻¹, b = ȳ − W x̄ solved in
   NumPy. The map file, parsed here from its documented layout, must hold that W and b.
2. Default model (SmolLM2-135M) on ~16K tokens of KJV, splits 14 and 22, window 1024, λ auto.
   Every reported value is finite, the map file's fingerprint matches, and at the first
   target layer s + 2 the held-out quality is high (bounds below, set from measurement).
   `--check` accepts the file with the default model and rejects it, with one line naming
   the file, for another model.
Prints the per-layer table. Exits nonzero on failure.
"""

import json
import math
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np

SOURCE_DIR = os.environ.get(
    "RIDGESERVE_SOURCE_DIR", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
)
sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(SOURCE_DIR, "tests", "reference"))

import llama_numpy  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rf_testlib import kjv_text, tiny_llama3_with_text  # noqa: E402

BIN = os.environ.get("RIDGESERVE_BIN", os.path.join(SOURCE_DIR, "build", "bin"))
CALIBRATE = os.path.join(BIN, "ridgeserve-calibrate")
DEFAULT_MODEL = os.environ.get(
    "RIDGESERVE_DEFAULT_MODEL",
    os.path.join(SOURCE_DIR, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"),
)

# Measured on SmolLM2-135M-Instruct Q4_1, KJV Genesis 1.. (16384 tokens, window 1024, 2 CPU
# threads): at s + 2, split 14: R² 0.965, K cos 0.995, V cos 0.963; split 22: R² 0.901,
# K cos 0.997, V cos 0.976. The bounds leave room for BLAS/thread-count rounding while still
# failing on a pipeline that pairs the wrong rows or layers (R² then falls well below 0.5).
MIN_R2_FIRST = 0.85
MIN_K_COS_FIRST = 0.97
MIN_V_COS_FIRST = 0.90
# Ridge shrinks ĥ but layer l's RMSNorm renormalises it, so the key norms stay close.
KEY_NORM_RATIO_RANGE = (0.8, 1.25)

failures = []


def expect(ok, what):
    print(("  ok   " if ok else "  FAIL ") + what)
    if not ok:
        failures.append(what)


def run(cmd, timeout=900):
    print("$ " + " ".join(cmd), flush=True)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def parse_map_file(path):
    """The map file per engine/ridgefill/map_file.h (version 1)."""
    data = open(path, "rb").read()
    assert data[:8] == b"RFMAP\0\0\0", "bad magic"
    version, header_size, file_size, meta_off, meta_size, data_off = struct.unpack_from(
        "<IIQQQQ", data, 8
    )
    assert version == 1 and file_size == len(data), (version, file_size, len(data))
    pos = meta_off

    def take(fmt):
        nonlocal pos
        vals = struct.unpack_from("<" + fmt, data, pos)
        pos += struct.calcsize("<" + fmt)
        return vals

    def array():
        off, count = take("QQ")
        return np.frombuffer(data, dtype="<f4", count=count, offset=off) if count else None

    (fp,) = take("Q")
    num_layers, hidden, kv_heads, head_dim, kind, dtype, name_len = take("IIIIIII")
    name = data[pos : pos + name_len].decode()
    pos += name_len
    (num_splits,) = take("I")
    m = {"fingerprint": fp, "num_layers": num_layers, "hidden": hidden, "name": name,
         "kind": kind, "splits": []}
    for _ in range(num_splits):
        split, count, lev_lambda, _zero = take("IIfI")
        lev_inv, _lev_mean = array(), array()
        targets = []
        for _ in range(count):
            layer, out_dim, lam, r2, kc, vc, knr, ac = take("IIffffff")
            w, b, ks = array(), array(), array()
            targets.append({"layer": layer, "lambda": lam, "r2": r2, "k_cos": kc, "v_cos": vc,
                            "key_norm_ratio": knr, "attn_cos": ac,
                            "W": w.reshape(out_dim, hidden), "b": b, "key_scale": ks})
        m["splits"].append({"split": split, "targets": targets, "leverage_inverse": lev_inv})
    return m


def check_tiny(tmp):
    print("tiny_llama3: fixed-λ map against a NumPy float64 ridge solve")
    written, text_path, ids = tiny_llama3_with_text(tmp)
    window, sink, max_tokens, every = 128, 4, 1280, 10
    ids = ids[:max_tokens]
    assert len(ids) == max_tokens, len(ids)
    ref = llama_numpy.load_model(written.hf_dir)
    xs, ys = [], []
    for b in range(0, len(ids), window):
        _, hidden = ref.forward(ids[b : b + window], return_hidden=True)
        xs.append(hidden[0][sink:])  # leaving layer 0
        ys.append(hidden[1][sink:])  # leaving layer 1 = entering layer 2
    x, y = np.concatenate(xs), np.concatenate(ys)
    held = (np.arange(len(x)) + 1) % every == 0
    xt, yt = x[~held], y[~held]
    xm, ym = xt.mean(0), yt.mean(0)
    g = (xt - xm).T @ (xt - xm)
    c = (yt - ym).T @ (xt - xm)
    lam = 0.01 * np.trace(g) / g.shape[0]
    w_ref = c @ np.linalg.inv(g + lam * np.eye(g.shape[0]))
    b_ref = ym - w_ref @ xm

    out = os.path.join(tmp, "tiny.rfmap")
    proc = run([CALIBRATE, "--model", written.hf_dir, "--text", text_path, "--split_layers", "0",
                "--window", str(window), "--sink_tokens", str(sink), "--max_tokens",
                str(max_tokens), "--lambda", repr(float(lam)), "--chunk", "50", "--attn_window=false",
                "--holdout_every", str(every), "--max_holdout_rows", "100000",
                # f32 K/V: the NumPy statistics below come from an unrounded forward pass.
                "--kv_cache_dtype", "f32", "--out", out])
    expect(proc.returncode == 0, f"calibrate tiny exits 0 ({proc.stderr.strip()[-500:]})")
    if proc.returncode != 0:
        return
    summary = json.loads(proc.stdout)
    m = parse_map_file(out)
    t = m["splits"][0]["targets"][0]
    expect(m["splits"][0]["split"] == 0 and t["layer"] == 2, "one map: split 0 → layer 2")
    expect(abs(t["lambda"] - lam) <= 1e-6 * lam, f"λ stored {t['lambda']:.6g} == {lam:.6g}")
    w_err = np.linalg.norm(t["W"] - w_ref) / np.linalg.norm(w_ref)
    b_err = np.linalg.norm(t["b"] - b_ref) / np.linalg.norm(b_ref)
    expect(w_err < 1e-4, f"W relative error vs NumPy {w_err:.2e} < 1e-4")
    expect(b_err < 1e-4, f"b relative error vs NumPy {b_err:.2e} < 1e-4")
    # R² on the held-out rows, from the reference solution.
    pred = x[held] @ w_ref.T + b_ref
    r2_ref = 1 - ((y[held] - pred) ** 2).sum() / ((y[held] - y[held].mean(0)) ** 2).sum()
    r2 = summary["splits"][0]["layers"][0]["r2"]
    expect(abs(r2 - r2_ref) < 1e-3, f"held-out R² {r2:.5f} vs NumPy {r2_ref:.5f}")
    expect(summary["splits"][0]["holdout_rows"] == int(held.sum()),
           f"held-out rows {summary['splits'][0]['holdout_rows']} == {int(held.sum())}")

    bad = run([CALIBRATE, "--model", written.hf_dir, "--text", text_path, "--split_layers", "1",
               "--out", os.path.join(tmp, "bad.rfmap")])
    expect(bad.returncode != 0 and "split_layers" in bad.stderr,
           f"split layer 1 of 3 layers rejected: {bad.stderr.strip()[-200:]}")
    return written


def check_default(tmp, other_model):
    print("default model: KJV, splits 14 and 22")
    if not os.path.exists(DEFAULT_MODEL):
        expect(False, f"default model missing at {DEFAULT_MODEL}")
        return
    text_path = os.path.join(tmp, "kjv.txt")
    with open(text_path, "w") as f:
        f.write(kjv_text(80000))  # ~18K tokens; --max_tokens takes 16384
    out = os.path.join(tmp, "maps.rfmap")
    proc = run([CALIBRATE, "--model", DEFAULT_MODEL, "--text", text_path, "--split_layers",
                "14,22", "--window", "1024", "--max_tokens", "16384", "--out", out])
    sys.stderr.write(proc.stderr[-4000:])
    expect(proc.returncode == 0, "calibrate default model exits 0")
    if proc.returncode != 0:
        return
    summary = json.loads(proc.stdout)
    expect(summary["tokens"] == 16384, f"tokens {summary['tokens']} == 16384")
    print(f"  pass {summary['pass_seconds']:.1f} s ({summary['tokens_per_second']:.0f} tok/s), "
          f"solve {summary['solve_seconds']:.1f} s")
    for split in summary["splits"]:
        s = split["split_layer"]
        layers = split["layers"]
        expect([l["layer"] for l in layers] == list(range(s + 2, 30)),
               f"split {s}: targets {s + 2}..29")
        print(f"  split {s} ({split['train_rows']} train, {split['holdout_rows']} held-out rows)")
        print("    layer      R2   K cos   V cos  |K^|/|K|  attn cos   lambda")
        for l in layers:
            print(f"    {l['layer']:5d}  {l['r2']:.4f}  {l['k_cos']:.4f}  {l['v_cos']:.4f}"
                  f"  {l['key_norm_ratio']:8.4f}  {l['attn_cos']:8.4f}  {l['lambda']:.3g}")
        finite = all(
            isinstance(l[k], float) and math.isfinite(l[k])
            for l in layers for k in ("r2", "k_cos", "v_cos", "key_norm_ratio", "attn_cos", "lambda"))
        expect(finite, f"split {s}: every reported value finite")
        if not finite:
            continue
        lo, hi = KEY_NORM_RATIO_RANGE
        expect(all(lo <= l["key_norm_ratio"] <= hi for l in layers),
               f"split {s}: key-norm ratios in [{lo}, {hi}]")
        first = layers[0]
        expect(first["r2"] > MIN_R2_FIRST, f"split {s}: R² at {s + 2} {first['r2']:.4f} > "
                                           f"{MIN_R2_FIRST}")
        expect(first["k_cos"] > MIN_K_COS_FIRST,
               f"split {s}: K cos at {s + 2} {first['k_cos']:.4f} > {MIN_K_COS_FIRST}")
        expect(first["v_cos"] > MIN_V_COS_FIRST,
               f"split {s}: V cos at {s + 2} {first['v_cos']:.4f} > {MIN_V_COS_FIRST}")

    m = parse_map_file(out)
    expect(f"{m['fingerprint']:016x}" == summary["fingerprint"] and m["num_layers"] == 30,
           f"map file fingerprint {m['fingerprint']:016x} == summary's")
    expect([sp["split"] for sp in m["splits"]] == [14, 22], "map file holds splits 14 and 22")
    expect(all(np.isfinite(t["W"]).all() and np.isfinite(t["b"]).all()
               for sp in m["splits"] for t in sp["targets"]), "every W and b finite")

    ok = run([CALIBRATE, "--check", out, "--model", DEFAULT_MODEL])
    expect(ok.returncode == 0, f"--check with the default model exits 0 ({ok.stderr[-300:]})")
    if ok.returncode == 0:
        checked = json.loads(ok.stdout)
        same = [[l["r2"] for l in sp["layers"]] for sp in checked["splits"]] == [
            [l["r2"] for l in sp["layers"]] for sp in summary["splits"]]
        expect(checked["fingerprint"] == summary["fingerprint"] and same,
               "--check summary matches the calibration's")
    if other_model:
        bad = run([CALIBRATE, "--check", out, "--model", other_model])
        lines = bad.stderr.strip().splitlines()
        expect(bad.returncode != 0 and len(lines) == 1 and out in lines[0],
               f"--check with another model fails with one line naming the file: {lines}")


def main():
    if not os.path.exists(CALIBRATE):
        print(f"FAIL: {CALIBRATE} not built")
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        written = check_tiny(tmp)
        check_default(tmp, written.gguf_path if written else None)
    for f in failures:
        print("FAIL:", f)
    print("PASS" if not failures else f"FAILED ({len(failures)} checks)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
