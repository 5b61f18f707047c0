"""Independent NumPy (float64) SpecPC: draft scoring, greedy lookahead and token selection.

The definition (DESIGN.md "SpecPC and SpecKV"; arXiv 2506.08373's reference implementation,
furiosa-ai/draft-based-approx-llm draft_approx_llm/specpc/), written out here from that text and
not from the C++ (engine/draft/spec_pc.*):

Draft. The target's first K layers + final norm + LM head ("self:K"), or a separate model with
the same tokenizer (all its layers). It prefills the P prompt tokens and generates
`lookahead_tokens` = L tokens greedily: the first from the prefill's last logits, each next one
after feeding the previous one, so L - 1 decode steps and the last generated token is never fed.

Scores, for every prompt position j < P:
  score[j] = max over scored layers l (first_layer <= l < draft layers), query heads h and
             captured query rows r of
             w(r) * softmax_{k <= r}(q_{l,h,r} . K_{l,kv(h),k} / sqrt(d))[j]
  captured rows: the last W = window prompt rows r = P-W .. P-1, weighted w = linspace(0, 1, W)
  (row P-W weight 0, row P-1 weight 1), and the L - 1 decode rows r = P .. P+L-2 (weight 1);
  each row's softmax runs over all keys 0..r (prompt and lookahead keys) and is then cut to the
  first P. q, K after RoPE; GQA: query head h reads KV head h // (heads / kv_heads). With
  kv_dtype "f16"/"bf16" the keys (and values) are rounded as the draft's KV cache holds them.
Params: window 64, kernel 64 for Qwen-family targets and 32 otherwise, first_layer =
draft_layers // 2 (the reference's layer 8 of 16 scaled to the draft's depth).

Selection (budget C, kernel k, window W), for C < P (C >= P keeps everything):
  pooled = max_pool1d(scores, k, stride 1) centred: zero padding (k-1)//2 left, k-1-(k-1)//2
           right, so pooled[i] = max(scores[i-(k-1)//2 .. i+k-1-(k-1)//2]) within the prompt
           (scores are > 0, so the zeros never win);
  top    = the C positions of largest pooled, descending, ties by lower position first;
  each top index i, in that order, expands to i + o for o in 0, -1, +1, -2, +2, ... over
           o in [-(k-1)//2, k-1-(k-1)//2], clamped to [0, P-1], duplicates dropped (first kept);
  kept   = sorted(first C of unique([P-W .. P-1] + expanded)).

Usage:
  draft = llama_numpy.load_model(path)
  params = default_params(target_arch, draft_layers, budget, lookahead)
  res = specpc_scores(draft, ids, draft_layers, params)  # .scores [P], .lookahead_ids [L]
  kept = specpc_select(res.scores, budget, params.kernel, params.window)
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional, Sequence

import numpy as np

WINDOW = 64
QWEN_ARCHS = ("qwen2", "qwen3")


@dataclasses.dataclass
class SpecPcParams:
    budget: int
    lookahead_tokens: int = 1
    window: int = WINDOW
    kernel: int = 32
    first_layer: int = 0
    num_layers: int = 0


def default_params(target_arch: str, draft_layers: int, budget: int,
                   lookahead_tokens: int = 1) -> SpecPcParams:
    """The reference's parameters for a draft of `draft_layers` layers of a `target_arch` model."""
    return SpecPcParams(
        budget=budget,
        lookahead_tokens=lookahead_tokens,
        window=WINDOW,
        kernel=64 if target_arch in QWEN_ARCHS else 32,
        first_layer=draft_layers // 2,
        num_layers=draft_layers,
    )


@dataclasses.dataclass
class SpecPcScores:
    scores: np.ndarray  # [P] float64
    lookahead_ids: list[int]  # the L tokens the draft generated (or was forced to)
    # top-1 minus top-2 logit of the draft at each lookahead step (how decisive greedy was)
    lookahead_margins: list[float]
    layers: list[int]  # scored draft layers


def greedy_lookahead(model, token_ids: Sequence[int], draft_layers: int, lookahead_tokens: int,
                     kv_dtype: str = "f32",
                     forced: Optional[Sequence[int]] = None) -> tuple[list[int], list[float]]:
    """The draft's greedy continuation of token_ids (lookahead_tokens ids) and each step's
    top-2 logit margin. With `forced`, those ids are fed instead of the argmax (the margins are
    still the draft's own); the returned ids are then `forced`."""
    seq = [int(t) for t in token_ids]
    ids, margins = [], []
    for step in range(lookahead_tokens):
        # A full causal forward of the sequence so far: its last row equals an incremental
        # decode step's (the reference needs no KV cache to be right).
        last = model.forward(seq, num_layers=draft_layers, kv_dtype=kv_dtype)[-1]
        top2 = np.sort(last)[-2:]
        margins.append(float(top2[1] - top2[0]))
        tok = int(np.argmax(last)) if forced is None else int(forced[step])
        ids.append(tok)
        seq.append(tok)
    return ids, margins


def score_from_qk(qs: Sequence[np.ndarray], ks: Sequence[np.ndarray], prompt_tokens: int,
                  window: int) -> np.ndarray:
    """score[j < P] from per-layer post-RoPE q [N, heads, d] and k [N, kv_heads, d] of the draft
    over the sequence prompt + fed lookahead (N = P + L - 1); see the module comment."""
    p = prompt_tokens
    best = np.zeros(p, dtype=np.float64)
    for q, k in zip(qs, ks):
        n, heads, d = q.shape
        group = heads // k.shape[1]
        if k.shape[0] != n or p < window or n < p:
            raise ValueError(f"shapes q {q.shape} k {k.shape}, P {p}, window {window}")
        rows = np.arange(p - window, n)  # captured query positions
        weight = np.concatenate([np.linspace(0.0, 1.0, window), np.ones(n - p)])
        qr = q[rows].astype(np.float64)  # [R, heads, d]
        kh = np.repeat(k.astype(np.float64), group, axis=1)  # [N, heads, d]
        logits = np.einsum("rhd,nhd->hrn", qr, kh) / math.sqrt(d)  # [heads, R, N]
        logits = np.where(np.arange(n)[None, None, :] <= rows[None, :, None], logits, -np.inf)
        logits -= logits.max(axis=-1, keepdims=True)
        prob = np.exp(logits)
        prob /= prob.sum(axis=-1, keepdims=True)
        prob *= weight[None, :, None]
        best = np.maximum(best, prob[:, :, :p].max(axis=(0, 1)))
    return best


def specpc_scores(model, token_ids: Sequence[int], draft_layers: int, params: SpecPcParams,
                  kv_dtype: str = "f32",
                  forced_lookahead: Optional[Sequence[int]] = None) -> SpecPcScores:
    """The draft's SpecPC scores of the prompt `token_ids` and its greedy lookahead.

    `model` is the draft's llama_numpy.Model (the target itself for self:K, with
    draft_layers = K; a separate draft with draft_layers = its layer count). kv_dtype rounds
    K/V as the draft's cache would. forced_lookahead feeds those ids instead of the greedy ones
    (to score what another implementation generated when greedy was a near-tie)."""
    p = len(token_ids)
    if p <= params.window:
        raise ValueError(f"prompt of {p} tokens: SpecPC scores need more than {params.window}")
    if not 0 <= params.first_layer < draft_layers:
        raise ValueError(f"first_layer {params.first_layer} of a {draft_layers}-layer draft")
    ids, margins = greedy_lookahead(model, token_ids, draft_layers, params.lookahead_tokens,
                                    kv_dtype, forced_lookahead)
    seq = [int(t) for t in token_ids] + ids[:-1]  # the last lookahead token is never fed
    capture: list = []
    model.forward(seq, num_layers=draft_layers, kv_dtype=kv_dtype, capture=capture)
    layers = list(range(params.first_layer, draft_layers))
    scores = score_from_qk([capture[l]["q"] for l in layers], [capture[l]["k"] for l in layers],
                           p, params.window)
    return SpecPcScores(scores, ids, margins, layers)


# ----------------------------------------------------------------------------------------------
# Selection


def max_pool_centred(scores: np.ndarray, kernel: int) -> np.ndarray:
    """torch max_pool1d(kernel, stride 1) over zero padding (k-1)//2 left, k-1-(k-1)//2 right."""
    left = (kernel - 1) // 2
    right = kernel - 1 - left
    s = np.asarray(scores, dtype=np.float64)
    padded = np.concatenate([np.zeros(left), s, np.zeros(right)])
    return np.array([padded[i:i + kernel].max() for i in range(s.size)])


def neighbour_offsets(kernel: int) -> list[int]:
    """arange(-((k-1)//2), k-1-(k-1)//2 + 1) ordered by |o|, -o before +o (0 first)."""
    left = (kernel - 1) // 2
    right = kernel - 1 - left
    return sorted(range(-left, right + 1), key=lambda o: (abs(o), o > 0))


def top_order(pooled: np.ndarray) -> np.ndarray:
    """All positions by pooled descending, ties by lower position first."""
    return np.lexsort((np.arange(pooled.size), -pooled))


def _expanded_until_budget(order: np.ndarray, p: int, budget: int, kernel: int,
                           window: int) -> tuple[list[int], int]:
    """unique(window + expansion of order[0], order[1], ...)'s first `budget` entries, and how
    many top indices were consumed to get there (the rest of the top-C cannot matter)."""
    offsets = neighbour_offsets(kernel)
    out = list(range(p - window, p))
    seen = set(out)
    used = 0
    for i in order[:budget]:
        if len(out) >= budget:
            break
        used += 1
        for o in offsets:
            j = min(max(int(i) + o, 0), p - 1)
            if j not in seen:
                seen.add(j)
                out.append(j)
    return out[:budget], used


def specpc_select(scores: Sequence[float], budget: int, kernel: int, window: int) -> list[int]:
    """The kept prompt positions, sorted (see the module comment)."""
    s = np.asarray(scores, dtype=np.float64)
    p = s.size
    if budget >= p:
        return list(range(p))
    if budget < window:
        raise ValueError(f"budget {budget} < window {window}")
    # Written in the reference's shape: topk(C), expand all, then unique / cut. Only the first
    # entries survive the cut, so this equals _expanded_until_budget's shortcut.
    top = top_order(max_pool_centred(s, kernel))[:budget]
    offsets = np.array(neighbour_offsets(kernel))
    expanded = np.clip((top[:, None] + offsets[None, :]).reshape(-1), 0, p - 1)
    expanded = _unique_first(expanded)
    kept = _unique_first(np.concatenate([np.arange(p - window, p), expanded]))[:budget]
    return sorted(int(j) for j in kept)


def _unique_first(a: np.ndarray) -> np.ndarray:
    _, first = np.unique(a, return_index=True)
    return a[np.sort(first)]


def selection_margin(scores: Sequence[float], budget: int, kernel: int, window: int) -> float:
    """How much the scores may move before the selection could change: any perturbation of
    every score by less than half of this gives the same kept positions.

    The kept set depends only on the positions at pooled ranks 1 .. used + 1, `used` being the
    number of top indices consumed before the budget fills (see _expanded_until_budget). Let
    d_1 > ... > d_t be the distinct pooled values at those ranks; each is some position's raw
    score. If every other raw score stays on the same side of every d_s, each position whose
    pooled value is some d_s keeps that same source as its window maximum, the plateaus keep
    their order, and within a plateau the position tie-break is the same in any implementation;
    so ranks 1 .. used + 1 are unchanged. Returns min over s and over raw scores y != d_s of
    |d_s - y| (0 when a d_s occurs twice among the raw scores; inf when budget >= P)."""
    s = np.asarray(scores, dtype=np.float64)
    p = s.size
    if budget >= p:
        return math.inf
    pooled = max_pool_centred(s, kernel)
    order = top_order(pooled)
    _, used = _expanded_until_budget(order, p, budget, kernel, window)
    margin = math.inf
    for d in np.unique(pooled[order[:used + 1]]):
        if np.count_nonzero(s == d) > 1:
            return 0.0
        others = s[s != d]
        if others.size:
            margin = min(margin, float(np.abs(others - d).min()))
    return margin


def specpc_select_fast(scores: Sequence[float], budget: int, kernel: int,
                       window: int) -> list[int]:
    """specpc_select by the early-stopping loop (a second formulation, cross-checked in tests)."""
    s = np.asarray(scores, dtype=np.float64)
    p = s.size
    if budget >= p:
        return list(range(p))
    out, _ = _expanded_until_budget(top_order(max_pool_centred(s, kernel)), p, budget, kernel,
                                    window)
    return sorted(out)
