"""ridgeserve-eval spec-kv (SpecKV kept KV entries and decoding) vs the NumPy float64 reference.

The reference (tests/reference/speckv_numpy.py) re-implements SpecKV from its definition
(DESIGN.md "SpecPC and SpecKV", engine/draft/spec_kv.h's file comment): the draft's greedy
lookahead (stopping after an end-of-generation token), the target's prefill of prompt +
lookahead, per layer and KV head the scores of the last 32 prompt queries and every lookahead
query over the prompt keys before the window (max over the group's query heads and the rows),
the centred max-pool (kernel 7), the top (C - 32) plus the window, and greedy decoding at RoPE
positions P, P + 1, ... over exactly each head's kept prompt entries plus the decoded tokens.
Tiny random-weight models (tests/reference/tiny_models.py), every one 4 query heads / 2 KV heads
(GQA groups of 2; the separate draft 2 / 1):
  tiny_llama GGUF self:1, tiny_llama3 GGUF (llama3 rope, untied, F16) self:2, tiny_qwen2 HF
  directory (q/k/v bias) self:1, tiny_qwen3 GGUF (q/k norm, head_dim 24) self:1, and tiny_llama
  with the separate draft tiny_llama_draft.gguf;
prompts of 150 and 197 random ids, and one per model ending in end-of-generation ids so that the
draft stops early; lookahead 4 and 16; budgets 48, 96 and one >= the prompt; max_new_tokens 8;
--kv_cache_dtype f32. For every run:
  * prompt_tokens and params (budget, lookahead_tokens, window 32, kernel 7, draft_layers);
  * lookahead_ids equal the reference's greedy ids wherever the draft's top-2 logit margin
    exceeds LOGIT_MARGIN (past a near-tie the reference is fed the C++'s ids), and stop after an
    end-of-generation id;
  * kv_entries_after_prefill == budget; kept is [layers][kv_heads][budget], sorted, unique,
    < P, containing the window;
  * kept[l][g] equals the reference's selection from its own scores wherever the selection
    margin (speckv_numpy.selection_margin) is >= SELECTION_MARGIN; at least MIN_COMPARED of
    all (run, layer, head) selections must be compared;
  * generated equals the reference's greedy decode over the C++'s kept entries (the
    reference's own where they agree) wherever the top-2 margin exceeds LOGIT_MARGIN;
  * budget >= P: no lookahead, no kept lists, P entries, generated == the reference's plain
    greedy decode of the full prompt;
  * chunked prefill (--chunk 37) gives the same JSON.
Then the same runs are compared with deliberately wrong references: kernel 5, no lookahead
queries, only the group's first query head, a window of 31, pooling across the window boundary,
only the group's last query head; decoding at positions P + i + 1, decoding with the lookahead's
KV kept. Each must disagree with the C++ in some run, so the comparison can fail.
Measured (f32 KV cache, this tree): every selection had a margin >= 8.7e-5 and all were compared
and equal; every generated id had a top-2 margin >= 0.028 and agreed; no lookahead near-ties.
Prints every number it checked; exits nonzero on failure.
"""

import os
import subprocess
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
import speckv_numpy as sk  # noqa: E402
import tiny_models  # noqa: E402

# Greedy ids (lookahead, generated) are compared where the top-2 logit margin exceeds this
# (float32 logits of these models differ from float64 by ~3e-5, tiny_models_test.py).
LOGIT_MARGIN = 1e-3
# Kept sets are compared where the reference's scores could move by SELECTION_MARGIN / 2 without
# changing the selection (scores are probabilities; float32 vs float64 moves them by ~1e-6).
SELECTION_MARGIN = 1e-5
MIN_COMPARED = 0.9  # of all (run, layer, KV head) selections with budget < P
STOP_IDS = (0, 2)  # <|endoftext|> and <|im_end|>: the tiny tokenizer's end-of-generation ids
WINDOW = 32
KERNEL = 7
LOOKAHEADS = (4, 16)
BUDGETS = (48, 96)
MAX_NEW = 8
PROMPT_LENGTHS = (150, 197)  # + lookahead 16 + 8 new <= 221 < context 256


def gguf(name):
    return lambda d: os.path.join(d, name + ".gguf")


def hf(name):
    return lambda d: os.path.join(d, name, "hf")


# eog_seed: a prompt of 150 random ids ending in eog_tail copies of eog_id, seed chosen so that
# the draft's greedy lookahead generates an end-of-generation id before 16 tokens.
CASES = [
    dict(name="tiny_llama self:1", target=gguf("tiny_llama"), ref=gguf("tiny_llama"),
         draft="self:1", draft_layers=1, draft_ref=None, eog=(1, 5, 0)),
    dict(name="tiny_llama3 self:2", target=gguf("tiny_llama3"), ref=hf("tiny_llama3"),
         draft="self:2", draft_layers=2, draft_ref=None, eog=(3, 3, 0)),
    dict(name="tiny_qwen2 self:1", target=hf("tiny_qwen2"), ref=gguf("tiny_qwen2"),
         draft="self:1", draft_layers=1, draft_ref=None, eog=(11, 5, 2)),
    dict(name="tiny_qwen3 self:1", target=gguf("tiny_qwen3"), ref=gguf("tiny_qwen3"),
         draft="self:1", draft_layers=1, draft_ref=None, eog=None),
    dict(name="tiny_llama + tiny_llama_draft", target=gguf("tiny_llama"),
         ref=gguf("tiny_llama"), draft=gguf("tiny_llama_draft"), draft_layers=None,
         draft_ref=gguf("tiny_llama_draft"), eog=(13, 5, 0)),
]


class Checker:
    def __init__(self):
        self.failures = []

    def expect(self, ok: bool, what: str) -> bool:
        if not ok:
            self.failures.append(what)
            print("  FAIL:", what)
        return ok


def run_spec_kv(model, draft, ids, budget, lookahead, max_new=MAX_NEW, chunk=None,
                kv="f32") -> dict:
    cmd = [eval_cli.eval_binary(), "spec-kv", "--model", model, "--draft_model", draft,
           "--token_ids", ",".join(str(int(t)) for t in ids), "--budget", str(budget),
           "--lookahead_tokens", str(lookahead), "--max_new_tokens", str(max_new)]
    if kv is not None:
        cmd += ["--kv_cache_dtype", kv]
    if chunk is not None:
        cmd += ["--chunk", str(chunk)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise eval_cli.EvalError(f"spec-kv --budget {budget} --lookahead_tokens {lookahead} "
                                 f"exited {proc.returncode}: {proc.stderr.strip()[-1000:]}")
    return eval_cli._parse_json(proc.stdout)


def eval_supports_kv_dtype() -> bool:
    proc = subprocess.run([eval_cli.eval_binary(), "--helpfull"], capture_output=True,
                          text=True, timeout=60)
    return "kv_cache_dtype" in proc.stdout + proc.stderr


def prompts_for(case, spec):
    out = []
    for pi, plen in enumerate(PROMPT_LENGTHS):
        out.append((f"P={plen}", tiny_models.sample_token_ids(spec, plen, seed=21 + pi)))
    if case["eog"] is not None:
        seed, tail, eog_id = case["eog"]
        ids = np.random.default_rng(seed).integers(0, 300, 150).tolist()
        ids[150 - tail:] = [eog_id] * tail
        out.append((f"P=150 eog-tail {tail}x{eog_id}", ids))
    return out


class Stats:
    def __init__(self):
        self.runs = 0
        self.selections = 0  # (run, layer, head) with budget < P
        self.compared = 0
        self.compared_equal = 0
        self.ambiguous = 0
        self.ambiguous_differ = 0
        self.min_compared_margin = float("inf")
        self.lookahead_steps = 0
        self.lookahead_forced = 0
        self.lookahead_stopped = 0
        self.generated_compared = 0
        self.generated_skipped = 0
        self.decoded_differs_from_full = 0  # runs where SpecKV changed the greedy output
        self.min_generated_margin = float("inf")


# ----------------------------------------------------------------------------------------------
# The reference itself


def check_reference(c: Checker, models_dir: str):
    print("reference self-checks")
    # Hand-worked selection: P 12, window 4 (8..11), kernel 3, budget 6 -> top 2 of pooled over
    # scores[0..7]; pooled = [.5 .5 .2 .2 .2 .9 .9 .9]: top 5, 6 (tie: lower first; 7 is
    # a tie too) -> [5, 6, 8, 9, 10, 11]. Pooling stays inside [0, P-W): position 7's window
    # is scores[6..8) only.
    s = np.array([.5, .1, .1, .2, .1, .1, .9, .05])
    got = sk.select_head(s, 12, 6, 3, 4)
    c.expect(got == [5, 6, 8, 9, 10, 11], f"hand selection {got}")
    c.expect(list(sk.max_pool_centred(s, 3)) == [.5, .5, .2, .2, .2, .9, .9, .9],
             f"hand pool {list(sk.max_pool_centred(s, 3))}")
    # A plateau straddling the cut: budget 5 takes one of 5, 6, 7 (5); margin = .9 - .5.
    c.expect(sk.select_head(s, 12, 5, 3, 4) == [5, 8, 9, 10, 11], "plateau cut")
    c.expect(abs(sk.selection_margin(s, 5, 3, 4) - 0.4) < 1e-12,
             f"plateau margin {sk.selection_margin(s, 5, 3, 4)}")
    c.expect(abs(sk.selection_margin(s, 6, 3, 4) - 0.4) < 1e-12,
             f"gap margin {sk.selection_margin(s, 6, 3, 4)}")
    # The margin is the bound it claims: perturbing every score by < margin / 2 keeps the set.
    rng = np.random.default_rng(7)
    bad = 0
    for _ in range(300):
        p = int(rng.integers(40, 120))
        sc = rng.random(p - 4) ** 3
        if rng.random() < 0.3:
            sc = np.round(sc, 2)
        budget = int(rng.integers(5, p))
        m = sk.selection_margin(sc, budget, 7, 4)
        base = sk.select_head(sc, p, budget, 7, 4)
        if not (len(base) == budget and base == sorted(set(base))):
            bad += 1
        if m == 0 or m == float("inf"):
            continue
        for _ in range(4):
            moved = sc + rng.uniform(-0.499, 0.499, sc.size) * m
            bad += sk.select_head(moved, p, budget, 7, 4) != base
    c.expect(bad == 0, f"selection_margin perturbation bound broken in {bad} cases")

    # The forward used for prefill and decode vs llama_numpy.Model.forward: the same logits and
    # post-RoPE q/k (capture hook); decoding over every entry == plain greedy decoding; the
    # scores by a per-row loop.
    model = llama_numpy.load_model(os.path.join(models_dir, "tiny_qwen2.gguf"))
    ids = tiny_models.sample_token_ids(tiny_models.get_spec("tiny_qwen2"), 60, seed=3)
    pre = sk.prefill_forward(model, ids)
    capture = []
    ref = model.forward(ids, capture=capture)
    d = max(float(np.abs(pre.logits - ref).max()),
            max(float(np.abs(pre.q[l] - capture[l]["q"]).max()) for l in range(2)),
            max(float(np.abs(pre.k[l] - capture[l]["k"]).max()) for l in range(2)))
    c.expect(d < 1e-12, f"prefill_forward vs Model.forward: max|d| {d:.3g}")
    part = sk.prefill_forward(model, ids, num_layers=1).logits
    d1 = float(np.abs(part - model.forward(ids, num_layers=1)).max())
    c.expect(d1 < 1e-12, f"prefill_forward num_layers=1: max|d| {d1:.3g}")
    full = [[list(range(50))] * 2] * 2
    pre50 = sk.prefill_forward(model, ids[:50])
    a, _, _ = sk.decode_over_kept(model, 50, pre50, full, 6)
    b, _, _ = sk.plain_greedy(model, ids[:50], 6)
    c.expect(a == b, f"decode over every entry {a} vs plain greedy {b}")
    # Decoding step by step over all entries reproduces the full forward's logits.
    cache_k = [[pre50.k[l][:, g] for g in range(2)] for l in range(2)]
    cache_v = [[pre50.v[l][:, g] for g in range(2)] for l in range(2)]
    dd = 0.0
    for i in range(50, 55):
        lg = sk.decode_step(model, ids[i], i, cache_k, cache_v)
        dd = max(dd, float(np.abs(lg - ref[i]).max()))
    c.expect(dd < 1e-10, f"decode_step vs full forward logits: max|d| {dd:.3g}")
    q, k = pre.q[1], pre.k[1]
    p = 40
    sc = sk.speckv_scores(q, k, p, 8)
    loop = np.zeros_like(sc)
    for g in range(2):
        for h in (2 * g, 2 * g + 1):
            for r in range(p - 8, q.shape[0]):
                z = q[r, h] @ k[:r + 1, g].T / np.sqrt(q.shape[2])
                w = np.exp(z - z.max())
                w /= w.sum()
                loop[g] = np.maximum(loop[g], w[:p - 8])
    ds = float(np.abs(sc - loop).max())
    c.expect(ds < 1e-12, f"speckv_scores vs per-row loop: max|d| {ds:.3g}")
    print(f"  hand selections, margin bound (1200 perturbations), forward/decode/scores "
          f"identities (max|d| {max(d, d1, dd, ds):.3g}): checked")


# ----------------------------------------------------------------------------------------------
# Runs


def reference_for(case, target_ref, draft_ref, ids, lookahead, forced=None):
    draft = target_ref if draft_ref is None else draft_ref
    # The budget only enters the selection: the lookahead / prefill / scores run once (budget
    # 48 < P) and each budget selects from the scores.
    return sk.speckv(target_ref, draft, case["draft_layers"], ids, BUDGETS[0], lookahead,
                     STOP_IDS, KERNEL, WINDOW, "f32", forced)


def check_lookahead(c, st, label, la, ref, lookahead):
    """Returns the ids the reference must be fed (None: its own greedy ones agree)."""
    decided = True
    diverged = False
    for step, (a, b, m) in enumerate(zip(la, ref.lookahead_ids, ref.lookahead_margins)):
        st.lookahead_steps += 1
        if a != b:
            if m > LOGIT_MARGIN:
                decided = c.expect(False, f"{label}: lookahead id {step} is {a}, the "
                                          f"reference's greedy id {b} (margin {m:.3g})")
            diverged = True
            break
    if not diverged:
        decided &= c.expect(len(la) == len(ref.lookahead_ids),
                            f"{label}: {len(la)} lookahead ids {la}, the reference's "
                            f"{ref.lookahead_ids}")
    stop = [i for i, t in enumerate(la) if t in STOP_IDS]
    c.expect(len(la) == lookahead if not stop else (stop == [len(la) - 1]),
             f"{label}: lookahead {la}: want {lookahead} ids or a stop id as the last one")
    if stop:
        st.lookahead_stopped += 1
    if diverged and decided:
        st.lookahead_forced += 1
        print(f"  {label}: lookahead diverges at a near-tie: the reference is fed the C++ ids")
        return la
    return None


def check_kept_shape(c, label, kept, cfg, budget, p):
    ok = c.expect(len(kept) == cfg.num_layers and all(len(kl) == cfg.num_kv_heads
                                                      for kl in kept),
                  f"{label}: kept shape {[len(kl) for kl in kept]}, want "
                  f"{cfg.num_layers} x {cfg.num_kv_heads}")
    if not ok:
        return False
    window = set(range(p - WINDOW, p))
    for l, kl in enumerate(kept):
        for g, kg in enumerate(kl):
            ok &= c.expect(len(kg) == budget and kg == sorted(set(kg)) and
                           all(0 <= j < p for j in kg) and window <= set(kg),
                           f"{label}: layer {l} head {g}: kept {kg} is not {budget} sorted "
                           f"unique prompt positions containing the window")
    return ok


def describe_kept_diff(ref, l, g, got, want, p):
    """The positions only one side kept, with the reference's raw and pooled scores."""
    sc = ref.scores[l][g]
    pooled = sk.max_pool_centred(sc, KERNEL)
    only_cpp = sorted(set(got) - set(want))
    only_ref = sorted(set(want) - set(got))
    fmt = lambda js: ", ".join(f"{j}(score {sc[j]:.6g}, pooled {pooled[j]:.6g})" if j < sc.size
                               else f"{j}(window)" for j in js)
    cut = np.sort(pooled)[::-1]
    return (f"only C++: [{fmt(only_cpp)}]; only reference: [{fmt(only_ref)}]; reference "
            f"pooled at the cut: {cut[max(0, len(want) - WINDOW - 2):len(want) - WINDOW + 2]}")


def check_generated(c, st, label, gen, target_ref, p, pre, kept):
    """gen vs the reference's greedy decode over `kept` (fed the C++'s tokens, so that a
    near-tie does not end the comparison); returns the reference's own greedy tokens."""
    own, _, _ = sk.decode_over_kept(target_ref, p, pre, kept, MAX_NEW)
    if not c.expect(len(gen) == MAX_NEW, f"{label}: {len(gen)} generated, want {MAX_NEW}"):
        return own
    _, picks, margins = sk.decode_over_kept(target_ref, p, pre, kept, MAX_NEW, forced=gen)
    for i, (a, b, m) in enumerate(zip(gen, picks, margins)):
        if m > LOGIT_MARGIN:
            st.generated_compared += 1
            st.min_generated_margin = min(st.min_generated_margin, m)
            if not c.expect(a == b, f"{label}: generated[{i}] = {a}, the reference's {b} "
                                    f"(margin {m:.3g}); C++ {gen}, reference {own}"):
                break
        else:
            st.generated_skipped += 1
            print(f"  {label}: generated[{i}] at a near-tie (margin {m:.3g}): C++ {a}, "
                  f"reference {b}")
    return own


# Deliberately wrong references: each must disagree with the C++ in some run.
def _scores_variant(ref, l, p, variant, group):
    q, k = ref.prefill.q[l], ref.prefill.k[l]
    if variant == "no lookahead queries":
        return sk.speckv_scores(q[:p], k[:p], p, WINDOW)
    if variant == "one query head per group":
        return sk.speckv_scores(q[:, ::group], k, p, WINDOW)
    if variant == "window 31":
        return sk.speckv_scores(q, k, p, WINDOW - 1)
    return ref.scores[l]


def mutant_kept(ref, cfg, p, budget, variant):
    group = cfg.num_heads // cfg.num_kv_heads
    out = []
    for l in range(cfg.num_layers):
        sc = _scores_variant(ref, l, p, variant, group)
        heads = []
        for g in range(cfg.num_kv_heads):
            if variant == "kernel 5":
                heads.append(sk.select_head(sc[g], p, budget, 5, WINDOW))
            elif variant == "window 31":
                heads.append(sk.select_head(sc[g], p, budget, KERNEL, WINDOW - 1))
            elif variant == "pool into the window":
                # Scores of every prompt key, pooled over the whole prompt, then the top
                # (C - W) among j < P - W.
                q, k = ref.prefill.q[l], ref.prefill.k[l]
                full = _scores_all_keys(q, k, p, g, group)
                pooled = sk.max_pool_centred(full, KERNEL)[:p - WINDOW]
                top = sk.top_order(pooled)[:budget - WINDOW]
                heads.append(sorted([int(j) for j in top] + list(range(p - WINDOW, p))))
            elif variant == "no GQA max (query head 2g+1 only)":
                q, k = ref.prefill.q[l], ref.prefill.k[l]
                one = sk.speckv_scores(q[:, group - 1::group], k, p, WINDOW)
                heads.append(sk.select_head(one[g], p, budget, KERNEL, WINDOW))
            else:
                heads.append(sk.select_head(sc[g], p, budget, KERNEL, WINDOW))
        out.append(heads)
    return out


def _scores_all_keys(q, k, p, g, group):
    n, _, d = q.shape
    rows = np.arange(p - WINDOW, n)
    best = np.zeros(p)
    for h in range(g * group, (g + 1) * group):
        z = (q[rows, h] @ k[:, g].T) / np.sqrt(d)
        z = np.where(np.arange(n)[None, :] <= rows[:, None], z, -np.inf)
        z = np.exp(z - z.max(axis=1, keepdims=True))
        z /= z.sum(axis=1, keepdims=True)
        best = np.maximum(best, z[:, :p].max(axis=0))
    return best


KEPT_MUTANTS = ("kernel 5", "no lookahead queries", "one query head per group", "window 31",
                "pool into the window", "no GQA max (query head 2g+1 only)")
DECODE_MUTANTS = ("decode at P + i + 1", "decode keeps the lookahead KV")


def run_case(c, st, case, models_dir, kv, mutants):
    name = case["name"]
    target_path = case["target"](models_dir)
    draft_arg = case["draft"](models_dir) if callable(case["draft"]) else case["draft"]
    target_ref = llama_numpy.load_model(case["ref"](models_dir))
    draft_ref = None if case["draft_ref"] is None else llama_numpy.load_model(
        case["draft_ref"](models_dir))
    cfg = target_ref.cfg
    want_draft_layers = (case["draft_layers"] if case["draft_layers"] is not None
                         else draft_ref.cfg.num_layers)
    spec = tiny_models.get_spec(case["name"].split()[0])
    print(f"{name}: --model {os.path.relpath(target_path, models_dir)} --draft_model "
          f"{os.path.relpath(draft_arg, models_dir) if os.sep in draft_arg else draft_arg}")
    for pname, ids in prompts_for(case, spec):
        p = len(ids)
        full_tokens = None
        for lookahead in LOOKAHEADS:
            ref = reference_for(case, target_ref, draft_ref, ids, lookahead)
            for budget in BUDGETS:
                label = f"{name} {pname} L={lookahead} C={budget}"
                try:
                    out = run_spec_kv(target_path, draft_arg, ids, budget, lookahead, kv=kv)
                except eval_cli.EvalError as e:
                    c.expect(False, f"{label}: {e}")
                    continue
                st.runs += 1
                want_params = {"budget": budget, "lookahead_tokens": lookahead, "window": WINDOW,
                               "kernel": KERNEL, "draft_layers": want_draft_layers}
                c.expect(out.get("prompt_tokens") == p,
                         f"{label}: prompt_tokens {out.get('prompt_tokens')}")
                c.expect(out.get("params") == want_params,
                         f"{label}: params {out.get('params')}, want {want_params}")
                la = [int(t) for t in out.get("lookahead_ids", [])]
                forced = check_lookahead(c, st, label, la, ref, lookahead)
                r = ref if forced is None else reference_for(case, target_ref, draft_ref, ids,
                                                             lookahead, forced)
                c.expect(out.get("kv_entries_after_prefill") == budget,
                         f"{label}: kv_entries_after_prefill {out.get('kv_entries_after_prefill')}"
                         f", want {budget}")
                kept = out.get("kept", [])
                if not check_kept_shape(c, label, kept, cfg, budget, p):
                    continue
                agree_all = True
                for l in range(cfg.num_layers):
                    for g in range(cfg.num_kv_heads):
                        st.selections += 1
                        want = sk.select_head(r.scores[l][g], p, budget, KERNEL, WINDOW)
                        m = sk.selection_margin(r.scores[l][g], budget, KERNEL, WINDOW)
                        got = kept[l][g]
                        if m >= SELECTION_MARGIN:
                            st.compared += 1
                            st.min_compared_margin = min(st.min_compared_margin, m)
                            if c.expect(got == want, f"{label}: layer {l} KV head {g}: kept "
                                                     f"differs (selection margin {m:.3g}): "
                                                     + describe_kept_diff(r, l, g, got, want, p)):
                                st.compared_equal += 1
                            else:
                                agree_all = False
                        else:
                            st.ambiguous += 1
                            if got != want:
                                st.ambiguous_differ += 1
                                agree_all = False
                                print(f"  {label}: layer {l} KV head {g}: near-tie at the cut "
                                      f"(margin {m:.3g}), kept differs: "
                                      + describe_kept_diff(r, l, g, got, want, p))
                gen = [int(t) for t in out.get("generated", [])]
                own = check_generated(c, st, label, gen, target_ref, p, r.prefill, kept)
                if full_tokens is None:
                    full_tokens, _, _ = sk.plain_greedy(target_ref, ids, MAX_NEW)
                if own != full_tokens:
                    st.decoded_differs_from_full += 1
                if not agree_all:
                    print(f"  {label}: generated checked over the C++'s kept entries")
                # Mutants: each counts the runs in which it disagrees with the C++.
                for variant in KEPT_MUTANTS:
                    mk = mutant_kept(r, cfg, p, budget, variant)
                    mutants[variant] += int(mk != kept)
                off, _, _ = sk.decode_over_kept(target_ref, p, r.prefill, kept, MAX_NEW,
                                                position_offset=1)
                mutants["decode at P + i + 1"] += int(off != gen)
                n_la = len(r.lookahead_ids)
                with_la = [[kg + list(range(p, p + n_la)) for kg in kl] for kl in kept]
                keep_la, _, _ = sk.decode_over_kept(target_ref, p, r.prefill, with_la, MAX_NEW)
                mutants["decode keeps the lookahead KV"] += int(keep_la != gen)
                print(f"  {label}: lookahead {la}; generated {gen}"
                      f"{'' if own == full_tokens else f' (full-KV greedy {full_tokens})'}")

        # Budget >= P: everything kept, the draft does not run, plain greedy decoding.
        budget = p if pname.endswith(str(PROMPT_LENGTHS[0])) else 255
        label = f"{name} {pname} C={budget} (>= P)"
        try:
            out = run_spec_kv(target_path, draft_arg, ids, budget, LOOKAHEADS[-1], kv=kv)
        except eval_cli.EvalError as e:
            c.expect(False, f"{label}: {e}")
            continue
        st.runs += 1
        c.expect(out.get("lookahead_ids") == [] and out.get("kept") == [] and
                 out.get("kv_entries_after_prefill") == p,
                 f"{label}: lookahead {out.get('lookahead_ids')}, kept "
                 f"{'[]' if not out.get('kept') else '...'}, kv_entries "
                 f"{out.get('kv_entries_after_prefill')}: want [], [], {p}")
        gen = [int(t) for t in out.get("generated", [])]
        if full_tokens is None:
            full_tokens, _, _ = sk.plain_greedy(target_ref, ids, MAX_NEW)
        _, picks, margins = sk.plain_greedy(target_ref, ids, MAX_NEW,
                                            forced=gen if len(gen) == MAX_NEW else None)
        for i, (a, b, m) in enumerate(zip(gen, picks, margins)):
            if m > LOGIT_MARGIN:
                st.generated_compared += 1
                if not c.expect(a == b, f"{label}: generated[{i}] = {a}, plain greedy {b} "
                                        f"(margin {m:.3g}); C++ {gen}, plain {full_tokens}"):
                    break
            else:
                st.generated_skipped += 1
        c.expect(len(gen) == MAX_NEW, f"{label}: {len(gen)} generated")
        print(f"  {label}: generated {gen}, plain greedy {full_tokens}")


def check_chunked(c, models_dir, kv):
    case = CASES[1]
    ids = tiny_models.sample_token_ids(tiny_models.get_spec("tiny_llama3"), PROMPT_LENGTHS[1],
                                       seed=22)
    a = run_spec_kv(case["target"](models_dir), case["draft"], ids, 96, 16, kv=kv)
    b = run_spec_kv(case["target"](models_dir), case["draft"], ids, 96, 16, chunk=37, kv=kv)
    c.expect(a == b, "tiny_llama3 P=197 L=16 C=96: --chunk 37 changed the output")
    print("chunked prefill (--chunk 37) vs one chunk: "
          f"{'identical JSON' if a == b else 'DIFFERENT'}")


def main() -> int:
    c = Checker()
    st = Stats()
    kv = "f32" if eval_supports_kv_dtype() else None
    if kv is None:
        print("ridgeserve-eval has no --kv_cache_dtype: comparing its default cache (f16) with "
              "the float64 reference unrounded")
    mutants = {m: 0 for m in KEPT_MUTANTS + DECODE_MUTANTS}
    with tempfile.TemporaryDirectory() as tmp:
        models_dir = os.path.join(tmp, "models")
        tiny_models.write_all(models_dir, drafts=True)
        check_reference(c, models_dir)
        for case in CASES:
            run_case(c, st, case, models_dir, kv, mutants)
        check_chunked(c, models_dir, kv)
    frac = st.compared / max(1, st.selections)
    print(f"runs: {st.runs}; kept selections (run, layer, KV head): {st.selections}, compared "
          f"{st.compared} ({100 * frac:.1f}%), equal {st.compared_equal}; near-ties at the cut "
          f"(margin < {SELECTION_MARGIN:g}) {st.ambiguous}, of which the C++ chose differently "
          f"{st.ambiguous_differ}; smallest compared margin {st.min_compared_margin:.3g}")
    print(f"lookahead: {st.lookahead_steps} ids compared, {st.lookahead_forced} runs past a "
          f"near-tie, {st.lookahead_stopped} runs stopped at an end-of-generation id")
    print(f"generated: {st.generated_compared} ids compared (smallest margin "
          f"{st.min_generated_margin:.3g}), {st.generated_skipped} near-ties skipped; SpecKV "
          f"changed the greedy output vs the full KV in {st.decoded_differs_from_full} runs")
    c.expect(frac >= MIN_COMPARED, f"only {100 * frac:.1f}% of the selections compared "
                                   f"(want >= {100 * MIN_COMPARED:.0f}%)")
    c.expect(st.lookahead_stopped > 0, "no run stopped its lookahead at an end-of-generation id")
    for variant, n in mutants.items():
        print(f"wrong reference '{variant}': disagrees with the C++ in {n} runs")
        c.expect(n > 0, f"wrong reference '{variant}' agreed with the C++ in every run: the "
                        f"comparison cannot tell it apart")
    if c.failures:
        print(f"{len(c.failures)} FAILURES")
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
