"""Independent NumPy (float64) SpecKV: the draft's lookahead, the per-layer / per-KV-head kept
prompt entries, and greedy decoding over them.

The definition (DESIGN.md "SpecPC and SpecKV"; engine/draft/spec_kv.h's file comment), written
out here from that text and not from the C++ (engine/draft/spec_kv.cc):

Draft. The target's first K layers + final norm + LM head ("self:K"), or a separate model with
the same tokenizer (all its layers). It decodes greedily after the prompt: the first token from
the prompt's last logits, each next one after feeding the previous one, up to L =
lookahead_tokens tokens, stopping after an end-of-generation token (which is included).

Target prefill of prompt + lookahead (P + L' rows, every lookahead token fed, L' <= L the
lookahead actually generated); post-RoPE queries of the rows at positions r >= P - W (the last
W = 32 prompt rows and every lookahead row) and keys of every row are captured at every layer.

Scores, per layer l and KV head g, for prompt keys j < P - W:
  score[j] = max over the query heads h of g's group and the captured rows r of
             softmax_{k <= r}(q_{l,h,r} . K_{l,g,k} / sqrt(d))[j]
(each row's softmax over all keys 0..r, prompt and lookahead, then read at j).

Selection (budget C < P): pooled = centred max-pool of score[0 .. P-W-1] with kernel k (7):
pooled[i] = max(score[i - (k-1)//2 .. i + k-1-(k-1)//2]) within [0, P-W) (zero padding; the
scores are > 0 so the zeros never win); top = the C - W positions of largest pooled, ties by
lower position; kept = sorted(top + [P-W .. P-1]). Every layer and KV head keeps C entries, its
own. C >= P keeps every entry.

Decoding. The first token is the argmax of the prefill's exact logits at the last prompt row.
Token t_i (i = 0, 1, ...) is fed at RoPE position P + i; at layer l its query head h attends to
exactly KV head g(h)'s kept prompt entries (K/V as computed in the prefill, at their original
RoPE positions), then the K/V of t_0 .. t_i. The lookahead's K/V are dropped.

Usage:
  target = llama_numpy.load_model(path)
  res = speckv(target, draft, draft_layers, prompt, budget, lookahead, stop_ids)
  res.kept[l][g]       sorted kept positions
  tokens, _, margins = decode_over_kept(target, len(prompt), res.prefill, res.kept, max_new)
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional, Sequence

import numpy as np

from llama_numpy import apply_rope, rms_norm, rope_angles, round_to_kv_dtype, silu

WINDOW = 32
KERNEL = 7


# ----------------------------------------------------------------------------------------------
# A forward pass that keeps Q, K and V per layer (prefill), and a decode step over explicit
# per-KV-head caches. Written out here (not llama_numpy.Model.forward) so that V and arbitrary
# key sets are available; prefill_forward's logits are checked against Model.forward in tests.


def _qkv(model, layer, x: np.ndarray, positions: np.ndarray, kv_dtype: str):
    cfg = model.cfg
    n = x.shape[0]
    h = rms_norm(x, layer.attn_norm, cfg.rms_eps)
    q, k, v = h @ layer.wq.T, h @ layer.wk.T, h @ layer.wv.T
    if layer.bq is not None:
        q = q + layer.bq
    if layer.bk is not None:
        k = k + layer.bk
    if layer.bv is not None:
        v = v + layer.bv
    q = q.reshape(n, cfg.num_heads, cfg.head_dim)
    k = k.reshape(n, cfg.num_kv_heads, cfg.head_dim)
    v = v.reshape(n, cfg.num_kv_heads, cfg.head_dim)
    if layer.q_norm is not None:
        q = rms_norm(q, layer.q_norm, cfg.rms_eps)
    if layer.k_norm is not None:
        k = rms_norm(k, layer.k_norm, cfg.rms_eps)
    cos, sin = rope_angles(cfg, positions, x.dtype)
    q = apply_rope(q, cos, sin, cfg.rope_mode)
    k = round_to_kv_dtype(apply_rope(k, cos, sin, cfg.rope_mode), kv_dtype)
    v = round_to_kv_dtype(v, kv_dtype)
    return q, k, v


def _finish_layer(model, layer, x: np.ndarray, attn: np.ndarray) -> np.ndarray:
    """attn [n, heads * head_dim] -> output projection, residual, FFN, residual."""
    o = attn @ layer.wo.T
    if layer.bo is not None:
        o = o + layer.bo
    x = x + o
    h = rms_norm(x, layer.ffn_norm, model.cfg.rms_eps)
    return x + (silu(h @ layer.w_gate.T) * (h @ layer.w_up.T)) @ layer.w_down.T


def _softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=-1, keepdims=True)
    p = np.exp(z)
    return p / p.sum(axis=-1, keepdims=True)


@dataclasses.dataclass
class Prefill:
    logits: np.ndarray  # [n, vocab]
    q: list  # per layer [n, heads, d] after RoPE
    k: list  # per layer [n, kv_heads, d] after RoPE (and kv_dtype rounding)
    v: list  # per layer [n, kv_heads, d]


def prefill_forward(model, token_ids: Sequence[int], num_layers: Optional[int] = None,
                    kv_dtype: str = "f32") -> Prefill:
    """Causal forward of token_ids at positions 0..n-1 through the first num_layers layers."""
    cfg = model.cfg
    ids = np.asarray(token_ids, dtype=np.int64)
    n = ids.size
    group = cfg.num_heads // cfg.num_kv_heads
    scale = 1.0 / math.sqrt(cfg.head_dim)
    causal = np.tril(np.ones((n, n), dtype=bool))
    x = model.tok_embd[ids].copy()
    qs, ks, vs = [], [], []
    layers = model.layers if num_layers is None else model.layers[:num_layers]
    for layer in layers:
        q, k, v = _qkv(model, layer, x, np.arange(n), kv_dtype)
        qs.append(q)
        ks.append(k)
        vs.append(v)
        out = np.empty((n, cfg.num_heads, cfg.head_dim), dtype=x.dtype)
        for h in range(cfg.num_heads):
            g = h // group
            s = np.where(causal, (q[:, h] @ k[:, g].T) * scale, -np.inf)
            out[:, h] = _softmax(s) @ v[:, g]
        x = _finish_layer(model, layer, x, out.reshape(n, -1))
    logits = rms_norm(x, model.out_norm, cfg.rms_eps) @ model.lm_head.T
    return Prefill(logits, qs, ks, vs)


def decode_step(model, token: int, position: int, cache_k: list, cache_v: list,
                kv_dtype: str = "f32") -> np.ndarray:
    """Feeds one token at RoPE `position`. cache_k[l][g] / cache_v[l][g] ([entries, d]) are the
    keys/values KV head g of layer l attends to; the token's own K/V are appended to them (the
    lists are updated in place). Returns the logits [vocab]."""
    cfg = model.cfg
    group = cfg.num_heads // cfg.num_kv_heads
    scale = 1.0 / math.sqrt(cfg.head_dim)
    x = model.tok_embd[np.array([token])].copy()
    for l, layer in enumerate(model.layers):
        q, k, v = _qkv(model, layer, x, np.array([position]), kv_dtype)
        out = np.empty((1, cfg.num_heads, cfg.head_dim), dtype=x.dtype)
        for g in range(cfg.num_kv_heads):
            cache_k[l][g] = np.concatenate([cache_k[l][g], k[:, g]], axis=0)
            cache_v[l][g] = np.concatenate([cache_v[l][g], v[:, g]], axis=0)
        for h in range(cfg.num_heads):
            g = h // group
            p = _softmax((q[0, h] @ cache_k[l][g].T) * scale)
            out[0, h] = p @ cache_v[l][g]
        x = _finish_layer(model, layer, x, out.reshape(1, -1))
    return (rms_norm(x, model.out_norm, cfg.rms_eps) @ model.lm_head.T)[0]


def top2_margin(logits: np.ndarray) -> float:
    top2 = np.sort(logits)[-2:]
    return float(top2[1] - top2[0])


# ----------------------------------------------------------------------------------------------
# Draft lookahead


def greedy_lookahead(draft, prompt: Sequence[int], draft_layers: Optional[int],
                     lookahead_tokens: int, stop_ids: Sequence[int], kv_dtype: str = "f32",
                     forced: Optional[Sequence[int]] = None) -> tuple[list[int], list[float]]:
    """The draft's greedy continuation (stops after a stop id, included) and each step's top-2
    logit margin. With `forced`, those ids are taken instead of the argmax (and the length is
    len(forced)); the margins are still the draft's own."""
    seq = [int(t) for t in prompt]
    ids, margins = [], []
    steps = lookahead_tokens if forced is None else len(forced)
    for step in range(steps):
        # A full causal forward of the sequence so far: its last row is the decode step's.
        last = prefill_forward(draft, seq, draft_layers, kv_dtype).logits[-1]
        margins.append(top2_margin(last))
        tok = int(np.argmax(last)) if forced is None else int(forced[step])
        ids.append(tok)
        seq.append(tok)
        if forced is None and tok in stop_ids:
            break
    return ids, margins


# ----------------------------------------------------------------------------------------------
# Scores and selection


def speckv_scores(q: np.ndarray, k: np.ndarray, prompt_tokens: int,
                  window: int = WINDOW) -> np.ndarray:
    """score [kv_heads, P - window] of one layer from post-RoPE q [N, heads, d] and k
    [N, kv_heads, d] over prompt + lookahead (N >= P); see the module comment."""
    n, heads, d = q.shape
    kv_heads = k.shape[1]
    group = heads // kv_heads
    p = prompt_tokens
    rows = np.arange(p - window, n)
    out = np.zeros((kv_heads, p - window))
    for g in range(kv_heads):
        for h in range(g * group, (g + 1) * group):
            s = (q[rows, h] @ k[:, g].T) / math.sqrt(d)  # [R, N]
            s = np.where(np.arange(n)[None, :] <= rows[:, None], s, -np.inf)
            prob = _softmax(s)
            out[g] = np.maximum(out[g], prob[:, :p - window].max(axis=0))
    return out


def max_pool_centred(scores: np.ndarray, kernel: int = KERNEL) -> np.ndarray:
    """pooled[i] = max(scores[i - (k-1)//2 .. i + k-1-(k-1)//2]) within the array."""
    left = (kernel - 1) // 2
    right = kernel - 1 - left
    s = np.asarray(scores, dtype=np.float64)
    return np.array([s[max(0, i - left):i + right + 1].max() for i in range(s.size)])


def top_order(pooled: np.ndarray) -> np.ndarray:
    """Positions by pooled descending, ties by lower position first."""
    return np.lexsort((np.arange(pooled.size), -pooled))


def select_head(scores: np.ndarray, prompt_tokens: int, budget: int, kernel: int = KERNEL,
                window: int = WINDOW) -> list[int]:
    """One KV head's kept positions, sorted, from its scores [P - window]."""
    p = prompt_tokens
    if budget >= p:
        return list(range(p))
    top = top_order(max_pool_centred(scores, kernel))[:budget - window]
    return sorted([int(j) for j in top] + list(range(p - window, p)))


def selection_margin(scores: np.ndarray, budget: int, kernel: int = KERNEL,
                     window: int = WINDOW) -> float:
    """How far the raw scores may move before select_head could change: every perturbation of
    each score by less than half of this keeps the kept set.

    With d_in = the last pooled value taken and d_out = the first left out: if d_in > d_out the
    pooled values (1-Lipschitz in the scores) keep every taken one above every other while each
    moves by < (d_in - d_out) / 2. If d_in == d_out a plateau of one source value d straddles the
    cut (decided by position, the same everywhere) and stays one plateau while no other raw
    score is within the margin min |s - d| of d (0 when d occurs twice among the raw scores)."""
    s = np.asarray(scores, dtype=np.float64)
    n_top = budget - window
    if n_top >= s.size:
        return math.inf
    pooled = max_pool_centred(s, kernel)
    order = top_order(pooled)
    d_in, d_out = pooled[order[n_top - 1]], pooled[order[n_top]]
    if d_in > d_out:
        return float(d_in - d_out)
    if np.count_nonzero(s == d_in) > 1:
        return 0.0
    others = s[s != d_in]
    return float(np.abs(others - d_in).min()) if others.size else math.inf


@dataclasses.dataclass
class SpecKvResult:
    lookahead_ids: list[int]
    lookahead_margins: list[float]
    scores: list  # [layer] -> [kv_heads, P - window] (empty when budget >= P)
    kept: list  # [layer][kv_head] -> sorted positions
    margins: list  # [layer][kv_head] -> selection_margin
    prefill: Prefill  # the target's prefill of prompt + lookahead


def speckv(target, draft, draft_layers: Optional[int], prompt: Sequence[int], budget: int,
           lookahead_tokens: int, stop_ids: Sequence[int], kernel: int = KERNEL,
           window: int = WINDOW, kv_dtype: str = "f32",
           forced_lookahead: Optional[Sequence[int]] = None) -> SpecKvResult:
    """SpecKV's lookahead, target prefill and per-layer / per-KV-head selection of `prompt`.
    draft_layers: K for a self:K draft (draft is the target), None for a separate draft.
    budget >= P keeps everything (the draft does not run; the prefill is the prompt's)."""
    p = len(prompt)
    cfg = target.cfg
    if budget >= p:
        pre = prefill_forward(target, prompt, None, kv_dtype)
        kept = [[list(range(p))] * cfg.num_kv_heads for _ in range(cfg.num_layers)]
        return SpecKvResult([], [], [], kept, [], pre)
    if budget <= window:
        raise ValueError(f"budget {budget} <= window {window}")
    ids, margins = greedy_lookahead(draft, prompt, draft_layers, lookahead_tokens, stop_ids,
                                    kv_dtype, forced_lookahead)
    pre = prefill_forward(target, list(prompt) + ids, None, kv_dtype)
    scores, kept, sel_margins = [], [], []
    for l in range(cfg.num_layers):
        sc = speckv_scores(pre.q[l], pre.k[l], p, window)
        scores.append(sc)
        kept.append([select_head(sc[g], p, budget, kernel, window) for g in range(sc.shape[0])])
        sel_margins.append([selection_margin(sc[g], budget, kernel, window)
                            for g in range(sc.shape[0])])
    return SpecKvResult(ids, margins, scores, kept, sel_margins, pre)


# ----------------------------------------------------------------------------------------------
# Decoding


def decode_over_kept(target, prompt_tokens: int, pre: Prefill, kept: list, max_new_tokens: int,
                     kv_dtype: str = "f32", forced: Optional[Sequence[int]] = None,
                     position_offset: int = 0) -> tuple[list[int], list[int], list[float]]:
    """Greedy decoding over the kept entries (kept[l][g]: rows of the prefill `pre`, prompt
    positions < P): (tokens fed, the reference's argmax at each step, its top-2 logit margin).
    The first token comes from pre's logits at row P - 1; token i is fed at RoPE position P + i
    (+ position_offset, for negative checks). With `forced`, those tokens are fed instead of the
    argmax (the argmaxes and margins are still our own, after the forced prefix)."""
    p = prompt_tokens
    cfg = target.cfg
    cache_k = [[pre.k[l][np.asarray(kept[l][g], dtype=np.int64), g]
                for g in range(cfg.num_kv_heads)] for l in range(cfg.num_layers)]
    cache_v = [[pre.v[l][np.asarray(kept[l][g], dtype=np.int64), g]
                for g in range(cfg.num_kv_heads)] for l in range(cfg.num_layers)]
    logits = pre.logits[p - 1]
    fed, picks, margins = [], [], []
    for i in range(max_new_tokens):
        margins.append(top2_margin(logits))
        picks.append(int(np.argmax(logits)))
        fed.append(picks[-1] if forced is None else int(forced[i]))
        if i + 1 == max_new_tokens:
            break
        logits = decode_step(target, fed[-1], p + i + position_offset, cache_k, cache_v,
                             kv_dtype)
    return fed, picks, margins


def plain_greedy(model, prompt: Sequence[int], max_new_tokens: int,
                 forced: Optional[Sequence[int]] = None
                 ) -> tuple[list[int], list[int], list[float]]:
    """Greedy decoding of the full prompt by llama_numpy.Model.forward (full causal forwards,
    no cache), the exact baseline: (tokens fed, argmax at each step, top-2 margin), as
    decode_over_kept."""
    seq = [int(t) for t in prompt]
    fed, picks, margins = [], [], []
    for i in range(max_new_tokens):
        last = model.forward(seq)[-1]
        margins.append(top2_margin(last))
        picks.append(int(np.argmax(last)))
        fed.append(picks[-1] if forced is None else int(forced[i]))
        seq.append(fed[-1])
    return fed, picks, margins
