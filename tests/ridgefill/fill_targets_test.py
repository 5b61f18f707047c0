"""RidgeFill map targets (pre_norm, post_norm, kv) with the key-scale correction, on a tiny model,
against an independent NumPy float64 reference (tests/reference/llama_numpy.py).

tiny_llama3 (3 layers, HF directory, llama3 RoPE scaling), split 0, one target layer (2). For
each --map_target, with --key_scale on and a fixed λ:
  1. calibration: the map file's W and b equal the NumPy ridge solve of that target
     (pre_norm: the residual entering layer 2; post_norm: its RMSNorm · attn_norm; kv: K|V of
     layer 2 before RoPE) on the same rows (sinks out, last window held out for the attention
     cosine, every 10th row held out); the key scale per KV head equals
     mean ‖K‖ / mean ‖K̂‖ on the held-out rows; attn_cos equals the NumPy attention-output
     cosine on the held-out window (definition in engine/tools/calibrate_main.cc).
  2. fill path (ridgefill_check --dump_kv on a GPL-3 prompt): the K/V the engine cached for the
     filled rows at layer 2 equal the map applied to the NumPy h_0 (folded for post_norm and
     kv), with the key scale and RoPE; exact rows are bitwise those of the plain path, alone
     and beside filled rows.
Exits nonzero on failure.
"""

import os
import sys
import tempfile

import numpy as np

sys.dont_write_bytecode = True
from rf_testlib import (BIN, SOURCE_DIR, expect, finish, last_json, run,  # noqa: E402
                        tiny_llama3_with_text)

sys.path.insert(0, os.path.join(SOURCE_DIR, "tests", "reference"))
import llama_numpy  # noqa: E402
from calibrate_test import parse_map_file  # noqa: E402

PROMPT_TEXT = "/usr/share/common-licenses/GPL-3"
WINDOW, SINK, MAX_TOKENS, EVERY = 128, 4, 1280, 10
# Engine float32 (F16 weights) against NumPy float64 on the same weights: relative errors of a
# few 1e-6 on W (measured); a wrong target, row set or fold gives errors of order 1.
MAX_W_ERR = 1e-4
MAX_SCALE_ERR = 1e-4
MAX_ATTN_COS_ERR = 1e-4
MAX_KV_ERR = 1e-4  # fill path, max |diff| / max |value|
# An f32 KV cache on the C++ side: the NumPy reference runs unrounded, and these bounds are at
# float32 rounding (an f16 cache moves the statistics by ~3e-4 here).
KV = "f32"


def target_values(kind, layer, h, eps):
    """What a map of `kind` predicts, from residual rows h entering `layer`."""
    if kind == "pre_norm":
        return h
    xn = llama_numpy.rms_norm(h, layer.attn_norm, eps)
    if kind == "post_norm":
        return xn
    return np.concatenate([xn @ layer.wk.T, xn @ layer.wv.T], axis=1)


def to_kv(kind, layer, y, eps):
    """Target values of `kind` → K|V before RoPE (tiny_llama3: no bias, no QK-norm)."""
    if kind == "kv":
        return y
    xn = llama_numpy.rms_norm(y, layer.attn_norm, eps) if kind == "pre_norm" else y
    return np.concatenate([xn @ layer.wk.T, xn @ layer.wv.T], axis=1)


def scale_keys(kv, scale, head_dim):
    out = kv.copy()
    for h, g in enumerate(scale):
        out[:, h * head_dim : (h + 1) * head_dim] *= g
    return out


def rope(x, positions, cfg, heads):
    cos, sin = llama_numpy.rope_angles(cfg, np.asarray(positions), np.float64)
    n = x.shape[0]
    return llama_numpy.apply_rope(x.reshape(n, heads, cfg.head_dim), cos, sin,
                                  cfg.rope_mode).reshape(n, heads * cfg.head_dim)


def attention_cosine(cfg, q, kv_exact, kv_pred):
    """calibrate_main.cc's AttentionCosine: queries at positions >= n/2, causal, sinks exact."""
    n, kvd, hd = q.shape[0], cfg.num_kv_heads * cfg.head_dim, cfg.head_dim
    kv_pred = kv_pred.copy()
    kv_pred[:SINK] = kv_exact[:SINK]
    pos = np.arange(n)
    q = rope(q, pos, cfg, cfg.num_heads)
    ke, kp = rope(kv_exact[:, :kvd], pos, cfg, cfg.num_kv_heads), rope(kv_pred[:, :kvd], pos, cfg,
                                                                       cfg.num_kv_heads)
    ve, vp = kv_exact[:, kvd:], kv_pred[:, kvd:]
    q0, group = n // 2, cfg.num_heads // cfg.num_kv_heads
    mask = np.triu(np.full((n - q0, n), -np.inf), k=q0 + 1)
    cosines = []
    for h in range(cfg.num_heads):
        kh = h // group
        qh = q[q0:, h * hd : (h + 1) * hd]
        outs = []
        for k, v in ((ke, ve), (kp, vp)):
            s = qh @ k[:, kh * hd : (kh + 1) * hd].T / np.sqrt(hd) + mask
            p = np.exp(s - s.max(1, keepdims=True))
            p /= p.sum(1, keepdims=True)
            outs.append(p @ v[:, kh * hd : (kh + 1) * hd])
        a, b = outs
        cosines.append((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1))
    return float(np.mean(cosines))


def check_kind(kind, tmp, written, ref, ids, text_path):
    print(f"{kind}: calibration and fill path against NumPy")
    cfg, eps, hd = ref.cfg, ref.cfg.rms_eps, ref.cfg.head_dim
    layer2 = ref.layers[2]
    windows = [ids[b : b + WINDOW] for b in range(0, len(ids), WINDOW)]
    xs, ys = [], []
    for w in windows[:-1]:  # the last window measures the attention cosine
        _, hidden = ref.forward(w, return_hidden=True)
        xs.append(hidden[0][SINK:])  # leaving layer 0
        ys.append(target_values(kind, layer2, hidden[1][SINK:], eps))  # entering layer 2
    x, y = np.concatenate(xs), np.concatenate(ys)
    held = (np.arange(len(x)) + 1) % EVERY == 0
    xt, yt = x[~held], y[~held]
    xm, ym = xt.mean(0), yt.mean(0)
    g = (xt - xm).T @ (xt - xm)
    lam = 0.01 * np.trace(g) / g.shape[0]
    w_ref = (yt - ym).T @ (xt - xm) @ np.linalg.inv(g + lam * np.eye(g.shape[0]))
    b_ref = ym - w_ref @ xm
    kv_held = to_kv(kind, layer2, y[held], eps)
    kv_hat = to_kv(kind, layer2, x[held] @ w_ref.T + b_ref, eps)
    heads = cfg.num_kv_heads
    scale_ref = np.array([
        np.linalg.norm(kv_held[:, h * hd : (h + 1) * hd], axis=1).sum()
        / np.linalg.norm(kv_hat[:, h * hd : (h + 1) * hd], axis=1).sum() for h in range(heads)])

    out = os.path.join(tmp, f"{kind}.rfmap")
    run([os.path.join(BIN, "ridgeserve-calibrate"), "--model", written.hf_dir, "--text", text_path,
         "--split_layers", "0", "--window", str(WINDOW), "--sink_tokens", str(SINK),
         "--max_tokens", str(MAX_TOKENS), "--lambda", repr(float(lam)), "--chunk", "50",
         "--holdout_every", str(EVERY), "--max_holdout_rows", "100000", "--map_target", kind,
         "--key_scale", "on", "--kv_cache_dtype", KV, "--out", out])
    m = parse_map_file(out)
    expect(m["kind"] == {"pre_norm": 0, "post_norm": 1, "kv": 2}[kind], f"{kind}: kind stored")
    t = m["splits"][0]["targets"][0]
    w_err = np.linalg.norm(t["W"] - w_ref) / np.linalg.norm(w_ref)
    b_err = np.linalg.norm(t["b"] - b_ref) / np.linalg.norm(b_ref)
    expect(w_err < MAX_W_ERR and b_err < MAX_W_ERR,
           f"{kind}: W, b relative error vs NumPy {w_err:.2e}, {b_err:.2e} < {MAX_W_ERR}")
    scale = t["key_scale"]
    s_err = np.abs(scale - scale_ref).max() if scale is not None else np.inf
    expect(s_err < MAX_SCALE_ERR,
           f"{kind}: key scale {scale} vs NumPy {scale_ref} (max diff {s_err:.2e})")

    # Attention-output cosine on the held-out window.
    _, hidden = ref.forward(windows[-1], return_hidden=True)
    h2 = hidden[1]
    xn = llama_numpy.rms_norm(h2, layer2.attn_norm, eps)
    kv_exact = to_kv(kind, layer2, target_values(kind, layer2, h2, eps), eps)
    kv_pred = scale_keys(to_kv(kind, layer2, hidden[0] @ w_ref.T + b_ref, eps), scale_ref, hd)
    attn_ref = attention_cosine(cfg, xn @ layer2.wq.T, kv_exact, kv_pred)
    expect(abs(t["attn_cos"] - attn_ref) < MAX_ATTN_COS_ERR,
           f"{kind}: attn_cos {t['attn_cos']:.6f} vs NumPy {attn_ref:.6f}")

    # The fill path with this map file: layer 2's K/V of the filled rows.
    n, tail = 200, 50
    r = last_json(run([os.path.join(BIN, "ridgefill_check"), "--model", written.hf_dir,
                       "--maps", out, "--text", PROMPT_TEXT, "--tokens", str(n), "--split", "0",
                       "--tail", str(tail), "--chunk", "64", "--kv_cache_dtype", KV,
                       "--dump_kv"]))
    expect(r["no_fill_bitwise"], f"{kind}: no filled rows: logits bitwise the plain path's")
    expect(r["mixed_bitwise"], f"{kind}: exact sequence beside filled rows: bitwise as alone")
    _, hidden = ref.forward(r["tokens"], return_hidden=True)
    rows = np.arange(SINK, n - tail)
    # The map exactly as stored (float32), applied in float64.
    w32, b32 = t["W"].astype(np.float64), t["b"].astype(np.float64)
    kv = scale_keys(to_kv(kind, layer2, hidden[0][rows] @ w32.T + b32, eps), scale, hd)
    kvd = heads * hd
    kv[:, :kvd] = rope(kv[:, :kvd], rows, cfg, heads)
    got = np.asarray(r["kv_fill"], dtype=np.float64).reshape(len(rows), 2 * kvd)
    err = np.abs(got - kv).max() / np.abs(kv).max()
    expect(err < MAX_KV_ERR, f"{kind}: filled K/V at layer 2 == NumPy map + scale + RoPE "
                             f"(max rel diff {err:.2e} < {MAX_KV_ERR})")
    print(f"  info KL(exact || RidgeFill) {r['kl']:.4g}, broken map {r['kl_broken']:.4g}")


def main():
    with tempfile.TemporaryDirectory() as tmp:
        written, text_path, ids = tiny_llama3_with_text(tmp)
        ids = ids[:MAX_TOKENS]
        assert len(ids) == MAX_TOKENS, len(ids)
        ref = llama_numpy.load_model(written.hf_dir)
        for kind in ("pre_norm", "post_norm", "kv"):
            check_kind(kind, tmp, written, ref, ids, text_path)
    sys.exit(finish())


if __name__ == "__main__":
    main()
