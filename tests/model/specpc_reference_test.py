"""ridgeserve-eval spec-pc (SpecPC draft scores and kept tokens) vs the NumPy float64 reference.

The reference (tests/reference/specpc_numpy.py) re-implements SpecPC from its definition
(DESIGN.md "SpecPC and SpecKV"): the draft's greedy lookahead, the attention scores of the last
64 prompt queries (weighted linspace(0, 1, 64)) and of the lookahead decode queries over the
prompt keys, max over heads, queries and scored layers, and the max-pool / top-C / neighbour
expansion / window selection. Tiny random-weight models (tests/reference/tiny_models.py):
  tiny_llama GGUF with draft self:1, tiny_llama3 (llama3 rope, untied, BOS model) self:2,
  tiny_qwen2 (q/k/v bias, kernel 64) self:1, tiny_qwen3 (q/k norm, head_dim 24) self:1, and
  tiny_llama with the separate 1-layer draft tiny_llama_draft (other shapes: 2 heads / 1 KV
  head, hidden 32);
prompts of 150 and 197 random token ids; lookahead 1 and 4; kernel the default and 7; budgets
80, 128 and one >= the prompt. For every run:
  * the JSON: prompt_tokens, params (window 64, kernel, first_layer = draft layers // 2,
    num_layers), draft_queries_layers, P scores, L lookahead ids, kept sorted and unique;
  * lookahead_ids equal the reference's greedy ids (wherever the draft's top-2 logit margin
    exceeds LOGIT_MARGIN; past a near-tie the reference is fed the C++'s ids);
  * scores within SCORE_TOL (f32 KV cache) / SCORE_TOL_F16 (default f16 cache, against the
    reference with K/V rounded to f16) of the reference;
  * kept == specpc_select(C++ scores) exactly: the selection of the same scores;
  * kept == specpc_select(reference scores) wherever the reference's selection margin
    (specpc_numpy.selection_margin: how far the scores may move before the selection could
    change) exceeds twice the measured score difference of that run; at least MIN_COMPARED of
    the runs with budget < P must be compared this way;
  * budget >= P keeps every position;
  * the scores of one (model, prompt, lookahead) are bitwise the same whatever the budget and
    kernel (they do not depend on them).
First, checks of the reference itself: hand-worked selections (neighbour order -1 before +1,
ties by lower position, window first, the cut), two formulations of the selection agreeing on
random scores, the vectorised scores against a per-row loop, and the forward hook (capture,
num_layers) leaving the logits unchanged.
Prints every number it checked; exits nonzero on failure.
"""

import json
import math
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
import specpc_numpy as sp  # noqa: E402
import tiny_models  # noqa: E402

# Scores are attention probabilities in (0, 1) (max ~0.7 on these models).
# f32 KV cache: float32 forward and softmax against float64. Measured max|d| 2.0e-6 over all
# runs (printed at the end as "scores vs reference (f32 KV)"); the bound (10x) leaves room for
# another summation order, while a wrong window weight (linspace over W+1 rows: 7.5e-3; no
# weight: 0.48) or dropped lookahead rows (0.17) move the scores by far more.
SCORE_TOL = 2e-5
# f16 KV cache against the reference with K/V rounded to f16: elements near a rounding boundary
# round differently on the two sides, which moves a peaked softmax: measured max|d| 2.5e-4
# (tiny_llama, P 150; most runs 1e-6 .. 2e-5). This bound (4x) still catches the semantic slips
# above, but not a cache that skipped the f16 rounding (the reference's own f16-vs-f32
# difference is ~6e-4): the f32-cache runs are the tight check.
SCORE_TOL_F16 = 1e-3
# Greedy lookahead ids are compared where the draft's top-2 logit margin exceeds this
# (float32 logits of these models differ from float64 by ~3e-5, tiny_models_test.py).
LOGIT_MARGIN = 1e-3
MIN_COMPARED = 0.75  # fraction of budget < P runs whose kept set is compared with the reference

PROMPT_LENGTHS = (150, 197)  # + lookahead 4 - 1 <= 200 < context 256
LOOKAHEADS = (1, 4)
ODD_KERNEL = 7
WINDOW = 64


class Checker:
    def __init__(self):
        self.failures = []

    def expect(self, ok: bool, what: str) -> bool:
        if not ok:
            self.failures.append(what)
            print("  FAIL:", what)
        return ok


# ----------------------------------------------------------------------------------------------
# The reference itself


def check_reference(c: Checker, models_dir: str):
    print("reference self-checks")
    # Hand-worked: P 10, window 2 (positions 8, 9), kernel 3 (offsets 0, -1, +1), budget 4.
    # pooled = [.2 .2 .2 .3 .9 .9 .9 .2 .1 .1]: top = 4, 5, 6 (ties: lower first), 3, ...
    # window [8, 9] + expand(4) = [8, 9, 4, 3, 5] -> first 4 -> [3, 4, 8, 9].
    # (+1 before -1 would give [4, 5, 8, 9]; higher position first on ties [5, 6, 8, 9].)
    s = [.1, .2, .1, .1, .3, .9, .2, .1, .1, .1]
    got = sp.specpc_select(s, 4, 3, 2)
    c.expect(got == [3, 4, 8, 9], f"hand example 1: specpc_select gave {got}, want [3, 4, 8, 9]")
    # Kernel 4: padding 1 left / 2 right, offsets 0, -1, +1, +2. scores peak at 0 (1.0) and 6.
    # pooled[i] = max(s[i-1 .. i+2]) = [1 1 .5 .5 .8 .8 .8 .8 .2 .2]; top 0, 1, 4, 5, ...;
    # window [8, 9] + expand(0) = 0, (-1 -> 0), 1, 2 + expand(1) = 3 -> first 6 = [8 9 0 1 2 3].
    s = [1.0, .1, .1, .5, .1, .1, .8, .1, .1, .2]
    got = sp.specpc_select(s, 6, 4, 2)
    c.expect(got == [0, 1, 2, 3, 8, 9], f"hand example 2 (even kernel, clamp): {got}")
    c.expect(sp.neighbour_offsets(4) == [0, -1, 1, 2] and sp.neighbour_offsets(7) ==
             [0, -1, 1, -2, 2, -3, 3] and sp.neighbour_offsets(32)[-3:] == [-15, 15, 16],
             f"neighbour offsets: k=4 {sp.neighbour_offsets(4)}, k=7 {sp.neighbour_offsets(7)}, "
             f"k=32 ends {sp.neighbour_offsets(32)[-3:]}")
    c.expect(sp.specpc_select(s, 10, 4, 2) == list(range(10)), "budget == P keeps all")
    print("  hand-worked selections: checked")

    # Two formulations (topk + expand all + unique, vs stop when the budget fills) agree on
    # random scores, with plateaus (rounded scores) and without; the margin is positive.
    rng = np.random.default_rng(5)
    n_cases = 0
    for trial in range(300):
        p = int(rng.integers(70, 260))
        scores = rng.random(p) ** 3
        if trial % 3 == 0:
            scores = np.round(scores, 2)  # exact ties between different sources
        budget = int(rng.integers(WINDOW, p + 1))
        kernel = int(rng.choice([1, 2, 3, 7, 8, 32, 64]))
        a = sp.specpc_select(scores, budget, kernel, WINDOW)
        b = sp.specpc_select_fast(scores, budget, kernel, WINDOW)
        ok = (a == b and len(a) == min(budget, p) and a == sorted(set(a))
              and set(range(p - WINDOW, p)) <= set(a))
        n_cases += 1
        if not c.expect(ok, f"random selection {trial}: P {p} budget {budget} kernel {kernel}"):
            break
    # The margin is the perturbation bound it claims: moving every score by < margin / 2
    # never changes the selection.
    bad = 0
    for trial in range(200):
        p = int(rng.integers(70, 200))
        scores = rng.random(p) ** 3
        budget, kernel = int(rng.integers(WINDOW, p)), int(rng.choice([3, 7, 32]))
        m = sp.selection_margin(scores, budget, kernel, WINDOW)
        base = sp.specpc_select(scores, budget, kernel, WINDOW)
        for _ in range(5):
            moved = scores + rng.uniform(-0.49, 0.49, p) * m
            bad += sp.specpc_select(moved, budget, kernel, WINDOW) != base
    c.expect(bad == 0, f"selection changed under perturbations < margin / 2 in {bad} cases")
    print(f"  specpc_select vs specpc_select_fast: {n_cases} random cases; selection_margin "
          f"bound held in 1000 perturbations")

    # The vectorised scores against a per-row, per-head loop, on tiny_llama3 (GQA 2, 3 layers).
    model = llama_numpy.load_model(os.path.join(models_dir, "tiny_llama3", "hf"))
    ids = tiny_models.sample_token_ids(tiny_models.get_spec("tiny_llama3"), 90, seed=3)
    params = sp.default_params("llama", 3, 80, 3)
    res = sp.specpc_scores(model, ids, 3, params)
    cap = []
    model.forward(ids + res.lookahead_ids[:-1], num_layers=3, capture=cap)
    p, heads, d = len(ids), model.cfg.num_heads, model.cfg.head_dim
    group = heads // model.cfg.num_kv_heads
    loop = np.zeros(p)
    for layer in res.layers:
        q, k = cap[layer]["q"], cap[layer]["k"]
        for r in range(p - WINDOW, p + 2):
            w = (r - (p - WINDOW)) / (WINDOW - 1) if r < p else 1.0
            for h in range(heads):
                logit = np.array([q[r, h] @ k[j, h // group] for j in range(r + 1)]) / math.sqrt(d)
                prob = np.exp(logit - logit.max())
                prob /= prob.sum()
                row = np.zeros(p)
                row[:min(r + 1, p)] = prob[:p]
                loop = np.maximum(loop, w * row)
    diff = float(np.abs(loop - res.scores).max())
    c.expect(res.layers == [1, 2] and diff < 1e-12,
             f"vectorised scores vs loop: max|d| {diff:.3g}, layers {res.layers}")
    print(f"  scores vs a per-row loop (tiny_llama3, layers {res.layers}): max|d| {diff:.3g}")
    # forced_lookahead (used past a greedy near-tie): forcing the greedy ids changes nothing,
    # forcing others scores those.
    same = sp.specpc_scores(model, ids, 3, params, forced_lookahead=res.lookahead_ids)
    other_ids = [(t + 1) % 300 for t in res.lookahead_ids]
    other = sp.specpc_scores(model, ids, 3, params, forced_lookahead=other_ids)
    c.expect(np.array_equal(same.scores, res.scores) and other.lookahead_ids == other_ids
             and not np.array_equal(other.scores, res.scores),
             "forced_lookahead: greedy ids must reproduce the scores, other ids must change them")
    # The forward hook changes nothing: capture and num_layers = all give the same logits.
    plain = model.forward(ids)
    hooked = model.forward(ids, num_layers=3, capture=[])
    c.expect(np.array_equal(plain, hooked), "forward(capture=..., num_layers=all) changed logits")
    # num_layers=K is the first K layers + final norm + LM head: the same as a model whose
    # layer list is cut to K.
    cut = llama_numpy.Model(model.cfg, model.tok_embd, model.layers[:2], model.out_norm,
                            model.lm_head, model.metadata)
    c.expect(np.array_equal(model.forward(ids, num_layers=2), cut.forward(ids)),
             "forward(num_layers=2) differs from a 2-layer copy")
    print("  forward hook: logits unchanged, num_layers=2 == a 2-layer copy")


# ----------------------------------------------------------------------------------------------
# ridgeserve-eval spec-pc


def run_spec_pc(model: str, draft: str, ids, budget: int, lookahead: int,
                kernel=None, kv_cache_dtype=None) -> dict:
    cmd = [eval_cli.eval_binary(), "spec-pc", "--model", model, "--draft_model", draft,
           "--token_ids", ",".join(str(int(t)) for t in ids), "--budget", str(budget),
           "--lookahead_tokens", str(lookahead)]
    if kernel is not None:
        cmd += ["--spec_kernel", str(kernel)]
    if kv_cache_dtype is not None:
        cmd += ["--kv_cache_dtype", kv_cache_dtype]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise eval_cli.EvalError(
            f"{' '.join(cmd[:6])} --budget {budget} --lookahead_tokens {lookahead} "
            f"--spec_kernel {kernel} exited {proc.returncode}: {proc.stderr.strip()[-1000:]}")
    return eval_cli._parse_json(proc.stdout)


def eval_supports_kv_dtype() -> bool:
    proc = subprocess.run([eval_cli.eval_binary(), "--helpfull"], capture_output=True, text=True,
                          timeout=60)
    return "kv_cache_dtype" in proc.stdout + proc.stderr


class Stats:
    def __init__(self):
        self.max_score_diff = {}  # kv dtype -> max |d|
        self.compared = 0
        self.skipped = 0
        self.runs = 0
        self.lookahead_steps = 0
        self.lookahead_forced = 0
        self.exact_without_draft = 0  # budget >= P runs that skipped the draft


def check_case(c: Checker, st: Stats, case: dict, models_dir: str, kv_dtypes):
    name = case["name"]
    target_path = case["target"](models_dir)
    draft_arg = case["draft"](models_dir)
    ref_model = llama_numpy.load_model(case["ref_model"](models_dir))
    draft_layers = case["draft_layers"]
    arch = case["target_arch"]
    print(f"{name}: --model {os.path.relpath(target_path, models_dir)} --draft_model "
          f"{os.path.relpath(draft_arg, models_dir) if os.sep in draft_arg else draft_arg}")
    for pi, plen in enumerate(PROMPT_LENGTHS):
        ids = tiny_models.sample_token_ids(tiny_models.get_spec(case["spec"]), plen, seed=11 + pi)
        budgets = (80, 128, plen if pi == 0 else 255)
        for lookahead in LOOKAHEADS:
            expected = sp.default_params(arch, draft_layers, 0, lookahead)
            for kv in kv_dtypes:
                # kv None: the binary's default cache, f16 on the CPU.
                ref_kv = kv or "f16"
                tol = SCORE_TOL if ref_kv == "f32" else SCORE_TOL_F16
                ref = sp.specpc_scores(ref_model, ids, draft_layers, expected, kv_dtype=ref_kv)
                first_scores = None
                for kernel in (None, ODD_KERNEL):
                    k_used = expected.kernel if kernel is None else kernel
                    for budget in budgets:
                        label = (f"{name} P={plen} L={lookahead} kv={kv or 'default'} "
                                 f"kernel={k_used} budget={budget}")
                        try:
                            out = run_spec_pc(target_path, draft_arg, ids, budget, lookahead,
                                              kernel, kv)
                        except eval_cli.EvalError as e:
                            c.expect(False, f"{label}: {e}")
                            continue
                        st.runs += 1
                        first_scores = check_run(c, st, label, out, ids, ref, ref_model,
                                                 draft_layers, expected, k_used, budget,
                                                 lookahead, ref_kv, tol, kv, first_scores)


def check_run(c, st, label, out, ids, ref, ref_model, draft_layers, expected, kernel, budget,
              lookahead, ref_kv, tol, kv, first_scores):
    p = len(ids)
    want_params = {"budget": budget, "lookahead_tokens": lookahead, "window": WINDOW,
                   "kernel": kernel, "first_layer": expected.first_layer,
                   "num_layers": draft_layers}
    got_params = out.get("params", {})
    c.expect(out.get("prompt_tokens") == p, f"{label}: prompt_tokens {out.get('prompt_tokens')}")
    c.expect({k: got_params.get(k) for k in want_params} == want_params,
             f"{label}: params {got_params}, want {want_params}")
    c.expect(out.get("draft_queries_layers") == list(range(expected.first_layer, draft_layers)),
             f"{label}: draft_queries_layers {out.get('draft_queries_layers')}, want "
             f"{list(range(expected.first_layer, draft_layers))}")
    scores = np.asarray(out.get("scores", []), dtype=np.float64)
    kept = [int(j) for j in out.get("kept", [])]
    la = [int(t) for t in out.get("lookahead_ids", [])]
    if budget >= p and scores.size == 0:
        # The exact path: the draft need not run (no scores, no lookahead), everything kept.
        st.exact_without_draft += 1
        c.expect(not la, f"{label}: lookahead ids {la} without scores")
        c.expect(kept == list(range(p)), f"{label}: budget {budget} >= P {p} must keep all "
                                         f"(kept {len(kept)})")
        return first_scores
    if not c.expect(scores.shape == (p,), f"{label}: {scores.size} scores, want {p}"):
        return first_scores
    if not c.expect(len(la) == lookahead, f"{label}: {len(la)} lookahead ids, want {lookahead}"):
        return first_scores

    # Lookahead: equal to greedy wherever greedy is decisive; past a near-tie, score what the
    # C++ generated.
    decided_ok = True
    for step, (a, b, m) in enumerate(zip(la, ref.lookahead_ids, ref.lookahead_margins)):
        st.lookahead_steps += 1
        if m > LOGIT_MARGIN:
            decided_ok &= c.expect(a == b, f"{label}: lookahead id {step} is {a}, the "
                                           f"reference's greedy id {b} (margin {m:.3g})")
        elif a != b:
            break
    if not decided_ok:
        return first_scores
    if la != ref.lookahead_ids:
        st.lookahead_forced += 1
        print(f"  {label}: greedy near-tie, reference fed the C++ ids {la} (its own "
              f"{ref.lookahead_ids}, margins {ref.lookahead_margins})")
        ref = sp.specpc_scores(ref_model, ids, draft_layers, expected, kv_dtype=ref_kv,
                               forced_lookahead=la)

    diff = float(np.abs(scores - ref.scores).max())
    key = kv or "default"
    st.max_score_diff[key] = max(st.max_score_diff.get(key, 0.0), diff)
    c.expect(diff <= tol, f"{label}: scores max|d| {diff:.3g} > {tol} from the reference "
                          f"(at position {int(np.abs(scores - ref.scores).argmax())})")
    if first_scores is None:
        print(f"  {label.rsplit(' kernel=', 1)[0]}: scores max|d| {diff:.3g} (tolerance {tol}), "
              f"lookahead {la}")
    if first_scores is not None:
        c.expect(np.array_equal(scores.astype(np.float32), first_scores),
                 f"{label}: scores differ from the same prompt's with another budget / kernel "
                 f"(max|d| {np.abs(scores - first_scores).max():.3g})")
    else:
        first_scores = scores.astype(np.float32)

    # Kept: structure, then the selection of the C++'s own scores, exactly.
    c.expect(kept == sorted(set(kept)) and len(kept) == min(budget, p)
             and all(0 <= j < p for j in kept),
             f"{label}: kept is not {min(budget, p)} sorted unique positions (got {len(kept)})")
    if budget >= p:
        c.expect(kept == list(range(p)), f"{label}: budget {budget} >= P {p} must keep all")
        return first_scores
    c.expect(set(range(p - WINDOW, p)) <= set(kept), f"{label}: window positions not all kept")
    own = sp.specpc_select(scores, budget, kernel, WINDOW)
    c.expect(kept == own, f"{label}: kept != specpc_select(the C++'s own scores): "
                          f"only C++ {sorted(set(kept) - set(own))}, only reference "
                          f"{sorted(set(own) - set(kept))}")
    # ... and the reference's selection of its own scores, where the margin allows.
    margin = sp.selection_margin(ref.scores, budget, kernel, WINDOW)
    if margin > 2 * max(diff, 1e-12):
        st.compared += 1
        ref_kept = sp.specpc_select(ref.scores, budget, kernel, WINDOW)
        c.expect(kept == ref_kept, f"{label}: kept != specpc_select(reference scores) although "
                                   f"the selection margin {margin:.3g} > 2 x score |d| {diff:.3g}:"
                                   f" only C++ {sorted(set(kept) - set(ref_kept))}, only "
                                   f"reference {sorted(set(ref_kept) - set(kept))}")
    else:
        st.skipped += 1
        print(f"  {label}: selection margin {margin:.3g} <= 2 x score |d| {diff:.3g}: kept not "
              f"compared with the reference's selection (near-tie)")
    return first_scores


CASES = [
    dict(name="tiny_llama self:1", spec="tiny_llama", target_arch="llama", draft_layers=1,
         target=lambda d: os.path.join(d, "tiny_llama.gguf"), draft=lambda d: "self:1",
         ref_model=lambda d: os.path.join(d, "tiny_llama", "hf")),
    dict(name="tiny_llama3 self:2", spec="tiny_llama3", target_arch="llama", draft_layers=2,
         target=lambda d: os.path.join(d, "tiny_llama3", "hf"), draft=lambda d: "self:2",
         ref_model=lambda d: os.path.join(d, "tiny_llama3", "hf")),
    dict(name="tiny_qwen2 self:1", spec="tiny_qwen2", target_arch="qwen2", draft_layers=1,
         target=lambda d: os.path.join(d, "tiny_qwen2", "hf"), draft=lambda d: "self:1",
         ref_model=lambda d: os.path.join(d, "tiny_qwen2", "hf")),
    dict(name="tiny_qwen3 self:1", spec="tiny_qwen3", target_arch="qwen3", draft_layers=1,
         target=lambda d: os.path.join(d, "tiny_qwen3", "hf"), draft=lambda d: "self:1",
         ref_model=lambda d: os.path.join(d, "tiny_qwen3", "hf")),
    dict(name="tiny_llama + tiny_llama_draft", spec="tiny_llama", target_arch="llama",
         draft_layers=1, target=lambda d: os.path.join(d, "tiny_llama", "hf"),
         draft=lambda d: os.path.join(d, "tiny_llama_draft.gguf"),
         ref_model=lambda d: os.path.join(d, "tiny_llama_draft", "hf")),
]


def main() -> int:
    c = Checker()
    st = Stats()
    with tempfile.TemporaryDirectory() as tmp:
        models_dir = os.path.join(tmp, "models")
        tiny_models.write_all(models_dir, drafts=True)
        check_reference(c, models_dir)
        kv_dtypes = ["f32", None] if eval_supports_kv_dtype() else [None]
        if kv_dtypes == [None]:
            print("ridgeserve-eval has no --kv_cache_dtype: default cache only")
        for case in CASES:
            check_case(c, st, case, models_dir, kv_dtypes)
    for key, d in st.max_score_diff.items():
        print(f"scores vs reference ({key} KV): max|d| {d:.3g} over all runs")
    total = st.compared + st.skipped
    print(f"{st.runs} ridgeserve-eval runs; kept compared with the reference's selection in "
          f"{st.compared} of {total} runs with budget < P ({st.skipped} near-ties skipped); "
          f"lookahead: {st.lookahead_steps} steps, {st.lookahead_forced} runs fed C++ ids; "
          f"{st.exact_without_draft} runs with budget >= P skipped the draft (no scores)")
    c.expect(st.runs > 0, "no ridgeserve-eval run completed")
    c.expect(total > 0 and st.compared >= MIN_COMPARED * total,
             f"only {st.compared} of {total} selections compared with the reference "
             f"(want >= {MIN_COMPARED:.0%})")
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
