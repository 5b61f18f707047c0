"""ridgeserve-eval `splice` and `pareto` on the default model, small and fast.

Calibrates split-14 and split-22 maps on ~2K KJV tokens, then on the GPL-3 (a different text):
  1. splice at 512 tokens, tail 64: the filled rows' layer s + 1 K/V equal the exact prefill's
     (the premise of the splice); splicing BOTH exact K and V into layers s + 2.. reproduces the
     exact NLL (max per-token difference <= 1e-6, gap closed = 1); the exact and plain
     RidgeFill NLLs equal distant-loss's (an independent code path: one Append per mode, no
     cache copies); RidgeFill differs from exact (the fill really ran).
  2. pareto at 512 tokens, tails 64 and 256: one point per (split, tail) with the documented
     keys, and its Pareto and target marks equal a NumPy-free recomputation from the points.
Exits nonzero on failure.
"""

import json
import math
import os
import sys
import tempfile

sys.dont_write_bytecode = True
from rf_testlib import (BIN, MODEL, calibrate_genesis_maps, expect, finish,  # noqa: E402
                        last_json, run)

TEXT = "/usr/share/common-licenses/GPL-3"
SPLITS = (14, 22)
LENGTH = 512
TAIL = 64
VARIANTS = ("ridgefill", "exact_k", "exact_v", "exact_kv", "exact_key_norm")


def dominated(p, q):
    """True when q dominates p: no worse on every objective and better on one."""
    inf = float("inf")
    pd = inf if p["distant_nll_increase"] is None else p["distant_nll_increase"]
    qd = inf if q["distant_nll_increase"] is None else q["distant_nll_increase"]
    p_drop = p["needle_exact_accuracy"] - p["needle_ridgefill_accuracy"]
    q_drop = q["needle_exact_accuracy"] - q["needle_ridgefill_accuracy"]
    no_worse = q["speedup"] >= p["speedup"] and q_drop <= p_drop and qd <= pd
    better = q["speedup"] > p["speedup"] or q_drop < p_drop or qd < pd
    return no_worse and better


def check_splice(evalbin, common):
    out = last_json(run([evalbin, "splice", *common, "--text", TEXT, "--prompt_tokens",
                         str(LENGTH), "--exact_tail_tokens", str(TAIL)]))
    print(json.dumps(out)[:1500])
    expect(out["filled_tokens"] == LENGTH - TAIL and out["all_tokens"] == TAIL - 1,
           "splice: filled rows and scored tail tokens counted")
    expect([s["split_layer"] for s in out["splits"]] == list(SPLITS), "splice: one entry per split")
    exact = out["exact"]["all_nll"]
    for s in out["splits"]:
        v = s["variants"]
        name = f"splice split {s['split_layer']}"
        expect(sorted(v) == sorted(VARIANTS), f"{name}: variants {VARIANTS}")
        expect(s["layer_s_plus_1_max_abs_diff"] == 0,
               f"{name}: layer s+1 K/V of filled rows equal the exact prefill's")
        expect(s["exact_kv_max_abs_nll_diff"] <= 1e-6,
               f"{name}: exact K and V spliced -> per-token NLL equals exact "
               f"(max diff {s['exact_kv_max_abs_nll_diff']})")
        expect(abs(v["exact_kv"]["all_gap_closed"] - 1) < 1e-6,
               f"{name}: exact K and V close the whole gap")
        expect(abs(v["ridgefill"]["all_nll"] - exact) > 1e-4 and v["ridgefill"]["all_gap_closed"] == 0,
               f"{name}: RidgeFill NLL differs from exact")
        expect(all(math.isfinite(v[k]["all_nll"]) for k in VARIANTS),
               f"{name}: every variant's NLL finite")
    return out


def main():
    with tempfile.TemporaryDirectory() as tmp:
        maps = calibrate_genesis_maps(tmp, SPLITS)
        evalbin = os.path.join(BIN, "ridgeserve-eval")
        common = ["--model", MODEL, "--maps", maps]

        splice = check_splice(evalbin, common)
        d = last_json(run([evalbin, "distant-loss", *common, "--text", TEXT, "--prompt_tokens",
                           str(LENGTH), "--exact_tail_tokens", str(TAIL)]))
        for s, ds in zip(splice["splits"], d["splits"]):
            a = ds["all_tokens"]
            expect(abs(a["exact_nll"] - splice["exact"]["all_nll"]) <= 1e-9,
                   "splice exact NLL equals distant-loss's")
            expect(abs(a["ridgefill_nll"] - s["variants"]["ridgefill"]["all_nll"]) <= 1e-9,
                   f"splice RidgeFill NLL (cache copied out and back) equals distant-loss's, "
                   f"split {s['split_layer']}")

        p = last_json(run([evalbin, "pareto", *common, "--text", TEXT, "--haystack", TEXT,
                           "--lengths", str(LENGTH), "--tails", "64,256", "--depths", "0.5",
                           "--trials", "1", "--repetitions", "1"]))
        print(json.dumps(p)[:1500])
        pts = p["points"]
        keys = ("prompt_tokens", "split_layer", "exact_tail_tokens", "speedup", "exact_seconds",
                "ridgefill_seconds", "measured_saved_seconds", "estimated_saved_seconds",
                "needle_exact_accuracy", "needle_ridgefill_accuracy", "distant_exact_nll",
                "distant_ridgefill_nll", "distant_nll_increase", "all_exact_nll",
                "all_ridgefill_nll", "meets_target", "pareto_optimal")
        expect(sorted((q["split_layer"], q["exact_tail_tokens"]) for q in pts)
               == sorted((s, t) for s in SPLITS for t in (64, 256)),
               "pareto: one point per (split, tail)")
        expect(all(all(k in q for k in keys) for q in pts), f"pareto: every point has {keys}")
        expect(all(q["speedup"] > 0 and q["estimated_saved_seconds"] > 0 for q in pts),
               "pareto: speedups and in-pass saved estimates positive")
        expect(all(q["pareto_optimal"] == (not any(dominated(q, o) for o in pts)) for q in pts),
               "pareto: pareto_optimal equals an independent dominance check")
        expect(any(q["pareto_optimal"] for q in pts), "pareto: the front is not empty")
        t = p["target"]
        expect(all(q["meets_target"] == (
            q["speedup"] >= t["min_speedup"]
            and q["needle_exact_accuracy"] - q["needle_ridgefill_accuracy"] <= t["max_needle_drop"]
            and q["distant_nll_increase"] is not None
            and q["distant_nll_increase"] <= t["max_distant_nll_increase"]) for q in pts),
            "pareto: meets_target follows the target thresholds")
        # The same numbers as distant-loss at tail 64 (same code path, same windows).
        for q in pts:
            if q["exact_tail_tokens"] == TAIL:
                ds = d["splits"][SPLITS.index(q["split_layer"])]["all_tokens"]
                expect(q["all_ridgefill_nll"] == ds["ridgefill_nll"],
                       f"pareto: split {q['split_layer']} all-token NLL equals distant-loss's")
    sys.exit(finish())


if __name__ == "__main__":
    main()
