"""ridgeserve-eval `splice` and `pareto` on the default model, small and fast.

Calibrates split-14 and split-22 maps on ~2K KJV tokens, then on the GPL-3 (a different text):
  1. splice at 512 tokens, tail 64: the filled rows' layer s + 1 K/V equal the exact prefill's
     (the premise of the splice); splicing BOTH exact K and V into layers s + 2.. reproduces the
     exact NLL (max per-token difference <= 1e-6, gap closed = 1); the exact and plain
     RidgeFill NLLs equal distant-loss's (an independent code path: one Append per mode, no
     cache copies); RidgeFill differs from exact (the fill really ran).
  2. pareto at 512 tokens, tails 64 and 256: one point per (split, tail) with the documented
     keys, and its Pareto and target marks equal a NumPy-free recomputation from the points;
     --plot without gnuplot on PATH says so and still prints the JSON.
  3. pareto with SpecPC and SpecKV at 600 tokens, tail 128, split 22 and draft self:8 with
     budgets 128 and 600 (SpecKV 64 and 600): their points beside the RidgeFill one with the
     documented keys; the same exact numbers as RidgeFill's (the same prompts); kept tokens = min(budget, prompt); KV bytes =
     kept tokens x the model's bytes per token (from its architecture), the draft's = its 8
     layers' over the prompt; speedup = exact / (draft + target); budget >= prompt reproduces
     exact needle and NLL numbers, a smaller one changes the NLL (SpecKV likewise, its KV bytes
     min(budget, prompt) entries); Pareto marks over the three methods;
     --plot with a stand-in gnuplot writes one marker per method and setting in two panels.
Exits nonzero on failure.
"""

import glob
import json
import math
import os
import subprocess
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


# SpecPC run (3): SmolLM2-135M has 30 layers, 3 KV heads of 64 dimensions; the CPU's default KV
# cache is f16. K and V: 2 x 2 bytes per element.
SPEC_LENGTH, SPEC_TAIL, SPEC_SPLIT, SPEC_BUDGETS = 600, 128, 22, (128, 600)
SPEC_KV_BUDGETS = (64, 600)
KV_BYTES_PER_LAYER = 2 * 2 * 3 * 64
TARGET_KV_BYTES, DRAFT_KV_BYTES = 30 * KV_BYTES_PER_LAYER, 8 * KV_BYTES_PER_LAYER


def run_env(args, path):
    """Runs a tool that must succeed with PATH=path; returns (stdout, stderr)."""
    print("$ PATH=" + path + " " + " ".join(args), flush=True)
    done = subprocess.run(args, capture_output=True, text=True, env={**os.environ, "PATH": path})
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-4000:])
        raise SystemExit(f"command failed with {done.returncode}: {args[:2]}")
    return done.stdout, done.stderr


def dominated(p, q):
    """True when q dominates p: no worse on every objective and better on one."""
    inf = float("inf")
    pd = inf if p["distant_nll_increase"] is None else p["distant_nll_increase"]
    qd = inf if q["distant_nll_increase"] is None else q["distant_nll_increase"]
    p_drop = p["needle_exact_accuracy"] - p[f"needle_{p['method']}_accuracy"]
    q_drop = q["needle_exact_accuracy"] - q[f"needle_{q['method']}_accuracy"]
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


def fake_gnuplot(tmp):
    """A folder with a stand-in `gnuplot` that copies its script's folder to tmp/plot."""
    bindir, copy = os.path.join(tmp, "fakebin"), os.path.join(tmp, "plot")
    os.makedirs(bindir)
    os.makedirs(copy)
    with open(os.path.join(bindir, "gnuplot"), "w") as f:
        f.write(f'#!/bin/sh\ncp "$(dirname "$1")"/* {copy}/\n')
    os.chmod(os.path.join(bindir, "gnuplot"), 0o755)
    return bindir, copy


def check_draft_quality(q, rf, method, name):
    """A SpecPC / SpecKV point's quality numbers: the same exact ones as the RidgeFill point rf
    (the same prompts); a budget >= the prompt reproduces exact, a smaller one changes the NLL."""
    expect(all(q[k] == rf[k] for k in ("needle_trials", "needle_exact_accuracy",
                                       "distant_tokens", "distant_exact_nll", "all_exact_nll")),
           f"{name}: the same exact needle and NLL numbers as RidgeFill's (same prompts)")
    same = (q[f"needle_{method}_accuracy"] == q["needle_exact_accuracy"]
            and q[f"distant_{method}_nll"] == q["distant_exact_nll"]
            and q[f"all_{method}_nll"] == q["all_exact_nll"])
    if q["budget"] >= SPEC_LENGTH:
        expect(same, f"{name}: budget >= prompt gives exact's needle and NLL numbers")
    else:
        expect(abs(q[f"all_{method}_nll"] - q["all_exact_nll"]) > 1e-4,
               f"{name}: the compressed context or kept entries change the tail's NLL")


def check_spec_kv_points(pts, rf):
    """SpecKV's pareto points (run 3): the documented keys and numbers; returns them."""
    skv = [q for q in pts if q["method"] == "spec_kv"]
    expect(sorted(q["budget"] for q in skv) == list(SPEC_KV_BUDGETS)
           and all(q["draft_model"] == "self:8" for q in skv), "spec-kv pareto: one point each")
    keys = ("prompt_tokens", "exact_tail_tokens", "budget", "draft_model", "lookahead_tokens",
            "speedup", "exact_seconds", "spec_kv_seconds", "kv_bytes", "exact_kv_bytes",
            "needle_trials", "needle_exact_accuracy", "needle_spec_kv_accuracy",
            "distant_tokens", "distant_exact_nll", "distant_spec_kv_nll", "distant_nll_increase",
            "all_exact_nll", "all_spec_kv_nll", "all_nll_increase", "meets_target",
            "pareto_optimal")
    if not all(all(k in q for k in keys) for q in skv):
        expect(False, f"spec-kv pareto: every point has {keys}")
        return skv
    for q in skv:
        name = f"spec-kv pareto, budget {q['budget']}"
        kept = min(q["budget"], SPEC_LENGTH)
        expect(q["kv_bytes"] == kept * TARGET_KV_BYTES
               and q["exact_kv_bytes"] == SPEC_LENGTH * TARGET_KV_BYTES,
               f"{name}: KV bytes = min(budget, prompt) entries x bytes per token")
        expect(q["speedup"] > 0 and abs(q["speedup"] - q["exact_seconds"] / q["spec_kv_seconds"])
               < 1e-9, f"{name}: speedup = exact / SpecKV's prefill")
        check_draft_quality(q, rf, "spec_kv", name)
    return skv


def check_spec_pc_pareto(evalbin, common, tmp):
    bindir, copy = fake_gnuplot(tmp)
    png = os.path.join(tmp, "front.png")
    stdout, _ = run_env([evalbin, "pareto", *common, "--text", TEXT, "--haystack", TEXT,
                         "--lengths", str(SPEC_LENGTH), "--tails", str(SPEC_TAIL), "--split_layer",
                         str(SPEC_SPLIT), "--draft_model", "self:8", "--spec_pc_budgets",
                         ",".join(map(str, SPEC_BUDGETS)), "--spec_kv_budgets",
                         ",".join(map(str, SPEC_KV_BUDGETS)), "--depths", "0.5", "--trials", "1",
                         "--repetitions", "1", "--plot", png], bindir + ":" + os.environ["PATH"])
    pts = last_json(stdout)["points"]
    print(json.dumps(pts)[:3000])
    rf = [q for q in pts if q["method"] == "ridgefill"]
    spc = [q for q in pts if q["method"] == "spec_pc"]
    expect(len(rf) == 1 and rf[0]["split_layer"] == SPEC_SPLIT and len(spc) == len(SPEC_BUDGETS)
           and sorted(q["budget"] for q in spc) == list(SPEC_BUDGETS)
           and all(q["draft_model"] == "self:8" for q in spc), "spec-pc pareto: one point each")
    keys = ("prompt_tokens", "exact_tail_tokens", "budget", "draft_model", "lookahead_tokens",
            "kept_tokens", "speedup", "exact_seconds", "spec_pc_seconds", "draft_seconds",
            "target_prefill_seconds", "kv_bytes", "exact_kv_bytes", "draft_kv_bytes",
            "needle_trials", "needle_exact_accuracy", "needle_spec_pc_accuracy",
            "distant_tokens", "distant_exact_nll", "distant_spec_pc_nll", "distant_nll_increase",
            "all_exact_nll", "all_spec_pc_nll", "all_nll_increase", "meets_target",
            "pareto_optimal", "original_positions")
    expect(all(all(k in q for k in keys) for q in spc), f"spec-pc pareto: every point has {keys}")
    expect(all(q.get("original_positions") is False for q in spc),
           "spec-pc pareto: renumbered positions unless --spec_pc_original_positions")
    if not rf or len(spc) != len(SPEC_BUDGETS) or not all(all(k in q for k in keys) for q in spc):
        return
    for q in spc:
        name = f"spec-pc pareto, budget {q['budget']}"
        kept = min(q["budget"], SPEC_LENGTH)
        expect(q["kept_tokens"] == kept, f"{name}: kept tokens = min(budget, prompt)")
        expect(q["kv_bytes"] == kept * TARGET_KV_BYTES
               and q["exact_kv_bytes"] == SPEC_LENGTH * TARGET_KV_BYTES
               and abs(q["kv_bytes"] / q["exact_kv_bytes"] - kept / SPEC_LENGTH) < 1e-12,
               f"{name}: KV bytes = kept tokens x bytes per token, ratio kept / prompt")
        expect(q["draft_kv_bytes"] == (SPEC_LENGTH * DRAFT_KV_BYTES if kept < SPEC_LENGTH else 0),
               f"{name}: the draft's KV covers the prompt (none when everything is kept)")
        expect(q["speedup"] > 0 and q["draft_seconds"] >= 0 and q["target_prefill_seconds"] > 0
               and abs(q["spec_pc_seconds"] - q["draft_seconds"] - q["target_prefill_seconds"])
               < 1e-9 and abs(q["speedup"] - q["exact_seconds"] / q["spec_pc_seconds"]) < 1e-9,
               f"{name}: speedup = exact / (draft + target prefill) > 0")
        check_draft_quality(q, rf[0], "spec_pc", name)
    skv = check_spec_kv_points(pts, rf[0])
    expect(all(q["pareto_optimal"] == (not any(dominated(q, o) for o in pts)) for q in pts),
           "spec-pc pareto: pareto_optimal over the three methods equals an independent check")

    with open(os.path.join(copy, "plot.gp")) as f:
        script = f.read()
    titles = {"exact", f"RidgeFill split {SPEC_SPLIT}, tail {SPEC_TAIL}",
              *(f"SpecPC self:8, C = {b}" for b in SPEC_BUDGETS),
              *(f"SpecKV self:8, C = {b}" for b in SPEC_KV_BUDGETS)}
    plots = [line for line in script.splitlines() if line.startswith("plot ")]
    expect(f"set output '{png}'" in script and "set multiplot layout 1,2" in script
           and len(plots) == 2 and all(line.count(" title ") == len(titles) for line in plots)
           and all(all(f"title '{t}'" in line for t in titles) for line in plots),
           "spec-pc pareto --plot: two panels, one marker per method and setting")
    markers = []
    paths = glob.glob(os.path.join(copy, "marker_*.dat"))
    for path in sorted(paths, key=lambda x: int(x.rsplit("_", 1)[1].split(".")[0])):
        with open(path) as f:
            markers.append(tuple(float(x) for x in f.read().split()))
    want = [(1.0, rf[0]["needle_exact_accuracy"], rf[0]["distant_exact_nll"]),
            (rf[0]["speedup"], rf[0]["needle_ridgefill_accuracy"], rf[0]["distant_ridgefill_nll"])]
    want += [(q["speedup"], q["needle_spec_pc_accuracy"], q["distant_spec_pc_nll"]) for q in spc]
    want += [(q["speedup"], q["needle_spec_kv_accuracy"], q["distant_spec_kv_nll"]) for q in skv]
    expect(len(markers) == len(want) and all(
        all(math.isclose(a, b, rel_tol=1e-5) for a, b in zip(m, w))
        for m, w in zip(markers, want)),
        "spec-pc pareto --plot: markers at (speedup, needle accuracy, distant-token NLL)")


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

        empty_dir = os.path.join(tmp, "no-gnuplot")
        os.mkdir(empty_dir)
        stdout, stderr = run_env([evalbin, "pareto", *common, "--text", TEXT, "--haystack", TEXT,
                                  "--lengths", str(LENGTH), "--tails", "64,256", "--depths",
                                  "0.5", "--trials", "1", "--repetitions", "1", "--plot",
                                  os.path.join(tmp, "p.png")], empty_dir)
        p = last_json(stdout)
        print(json.dumps(p)[:1500])
        expect("plot: FAILED_PRECONDITION: gnuplot is not installed" in stderr,
               "pareto --plot without gnuplot: FailedPrecondition on stderr, JSON on stdout")
        expect(all(q["method"] == "ridgefill" and q["kv_bytes"] == q["exact_kv_bytes"]
                   == LENGTH * TARGET_KV_BYTES for q in p["points"]),
               "pareto without drafts: RidgeFill points only, KV bytes of the whole prompt")
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
        check_spec_pc_pareto(evalbin, common, tmp)
    sys.exit(finish())


if __name__ == "__main__":
    main()
