#!/usr/bin/env python3
"""RidgeFill online calibration: what it buys on text the shipped maps never saw, and what it
costs the requests being served (a benchmark, not a test).

    scripts/bench_online.py shift [--rows 8192,32768] [--share 0.5] [--json out.json]
    scripts/bench_online.py cost [--rounds 2] [--rate 0.5] [--json out.json]

shift: a software manual the maps never saw (the vim user manual; the shipped maps are fitted
on the KJV and the Jargon File) in two halves. For each N in --rows, the real ridgeserve with
--ridgefill_online_calibration (stride 1, re-solve after N rows, served share --share) serves
exact 1024-token requests cut from one half (chapters usr_20 to usr_90), waiting for each
request's rows to be accumulated so none are dropped, until the re-solve swaps in maps learned
from N rows. Then ridgeserve-eval measures the shipped and each online map file on the other
half (the GPL-3 and chapters usr_01 to usr_12: README's other.txt): needle accuracy at 8192
tokens (depths 0.25, 0.75, 2 trials) and distant-token NLL at 4096 tokens (2 windows), exact
tail 1024, at splits --splits.

cost: the same seeded Poisson arrivals of exact 1024-token requests (ridgeserve-loadtest) with
online calibration off and on at its defaults (stride 4, re-solve every 8192 rows), arms
alternated per round; reports the client-side TTFT, E2E and throughput of each and on/off
ratios, with the rows accumulated and dropped and the server's peak RSS. Use a quiet machine:
arms run one after another.
"""

import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "server"))

from rs_testlib import (BIN_DIR, MAPS, MODEL, Server, greedy_request, run_unary,  # noqa: E402
                        scrape_metrics)

VIM_DOC = "/usr/share/vim/vim90/doc"
GPL = "/usr/share/common-licenses/GPL-3"


def concat(paths, out):
    with open(out, "w", encoding="utf-8") as f:
        for p in paths:
            with open(p, encoding="utf-8", errors="replace") as src:
                f.write(src.read())


def texts(tmp):
    """(served half, evaluation half) of the vim user manual, as files."""
    served = os.path.join(tmp, "served.txt")
    concat(sorted(glob.glob(f"{VIM_DOC}/usr_[2-9]*.txt")), served)
    other = os.path.join(tmp, "other.txt")
    concat([GPL] + sorted(glob.glob(f"{VIM_DOC}/usr_0[1-9]*.txt"))
           + sorted(glob.glob(f"{VIM_DOC}/usr_1*.txt")), other)
    return served, other


def online_counts(srv):
    m = scrape_metrics(srv)
    return (m["ridgeserve_ridgefill_online_rows"],
            m["ridgeserve_ridgefill_online_dropped_rows_total"], m)


def learn(rows, share, served_text, tmp):
    """Serves exact requests from `served_text` until the maps are re-solved from `rows` rows;
    returns the online map file and what the server measured."""
    live = os.path.join(tmp, f"live_{rows}.rfmap")
    shutil.copyfile(MAPS, live)
    shutil.copyfile(os.path.splitext(MAPS)[0] + ".rfstats", os.path.splitext(live)[0] + ".rfstats")
    with Server(f"--ridgefill_maps={live}", "--ridgefill_online_calibration",
                f"--ridgefill_online_resolve_rows={rows}", "--ridgefill_online_row_stride=1",
                f"--ridgefill_online_share={share}", "--enable_prefix_caching=false",
                name=f"learn_{rows}") as srv:
        with open(served_text, encoding="utf-8") as f:
            ids = srv.tokenize(f.read(), add_special_tokens=True)
        taken = 0
        t0 = time.monotonic()
        for start in range(0, len(ids) - 1024, 1024):
            req = greedy_request(token_ids=ids[start:start + 1024], max_new_tokens=1,
                                 ignore_eos=True)
            _, code, details = run_unary(srv.stub, req)
            if code.name != "OK":
                sys.exit(f"request failed: {code} {details}")
            taken += 1024 - 4
            while sum(online_counts(srv)[:2]) < taken:
                time.sleep(0.2)
            if online_counts(srv)[0] >= rows:
                break
        else:
            sys.exit(f"the served half has fewer than {rows} rows")
        while srv.info().ridgefill_maps.version < 2:
            time.sleep(0.5)
        got, dropped, m = online_counts(srv)
        out = os.path.join(tmp, f"online_{rows}.rfmap")
        shutil.copyfile(os.path.join(live + ".online", "maps.rfmap"), out)
        return out, {"rows": got, "dropped_rows": dropped, "serve_seconds": time.monotonic() - t0,
                     "accumulate_seconds": m["ridgeserve_ridgefill_online_accumulate_seconds_total"],
                     "resolve_seconds": m["ridgeserve_ridgefill_online_last_resolve_seconds"]}


def evaluate(maps, other, splits):
    """{split: {needle, distant NLL vs exact}} of one map file on the evaluation half."""
    base = [os.path.join(BIN_DIR, "ridgeserve-eval")]
    common = ["--model", MODEL, "--maps", maps, "--exact_tail_tokens", "1024"]
    out = {}
    for s in splits:
        needle = json.loads(subprocess.run(
            base + ["needle"] + common + ["--haystack", other, "--lengths", "8192", "--depths",
                                          "0.25,0.75", "--trials", "2", "--split_layer", str(s)],
            check=True, capture_output=True, text=True).stdout)
        distant = json.loads(subprocess.run(
            base + ["distant-loss"] + common + ["--text", other, "--prompt_tokens", "4096",
                                                "--windows", "2", "--split_layer", str(s)],
            check=True, capture_output=True, text=True).stdout)
        out[str(s)] = {"needle": needle, "distant": distant}  # str: as in the JSON file
    return out


def shift(args):
    tmp = tempfile.mkdtemp(prefix="rs_bench_online_")
    served, other = texts(tmp)
    splits = [int(s) for s in args.splits.split(",")]
    results = {"share": args.share, "maps": {}}
    print(f"shipped maps {MAPS}: evaluating", flush=True)
    results["maps"]["shipped"] = {"eval": evaluate(MAPS, other, splits)}
    for rows in [int(r) for r in args.rows.split(",")]:
        maps, learned = learn(rows, args.share, served, tmp)
        print(f"online maps from {rows} rows: {learned}; evaluating", flush=True)
        results["maps"][f"online_{rows}"] = {"learned": learned,
                                            "eval": evaluate(maps, other, splits)}
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=2)
    shutil.rmtree(tmp, ignore_errors=True)
    print_shift(results, splits)


def print_shift(results, splits):
    print("\nmaps | split | needle RidgeFill (exact) | distant-token NLL vs exact | all tail tokens")
    for name, r in results["maps"].items():
        for s in splits:
            e = r["eval"][str(s)]
            nd = e["needle"]["results"]
            n = sum(x["trials"] for x in nd)
            rf = round(sum(x["ridgefill_accuracy"] * x["trials"] for x in nd))
            ex = round(sum(x["exact_accuracy"] * x["trials"] for x in nd))
            d = e["distant"]["splits"][0]
            dist, every = d["distant_tokens"], d["all_tokens"]
            print(f"{name} | {s} | {rf}/{n} ({ex}/{n}) | {dist['ridgefill_nll']:.3f} "
                  f"({100 * dist['relative_increase']:+.1f}%, exact {dist['exact_nll']:.3f}, "
                  f"{dist['count']} tokens) | {100 * every['relative_increase']:+.1f}%")


def peak_rss(pid):
    """The process's peak resident set (VmHWM), MB."""
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def cost_arm(args, online, text_path, out_dir, tag):
    live = os.path.join(out_dir, f"{tag}.rfmap")
    shutil.copyfile(MAPS, live)
    shutil.copyfile(os.path.splitext(MAPS)[0] + ".rfstats", os.path.splitext(live)[0] + ".rfstats")
    flags = ["--ridgefill_online_calibration"] if online else []
    with Server(f"--ridgefill_maps={live}", *flags, name=f"bench_online_{tag}") as srv:
        out = os.path.join(out_dir, f"{tag}.json")
        cmd = [os.path.join(BIN_DIR, "ridgeserve-loadtest"), "--target", srv.target,
               "--text", text_path, "--prompt_tokens", "fixed:1024", "--output_tokens",
               "fixed:32", "--rate", str(args.rate), "--num_requests", str(args.num_requests),
               "--duration_s", "3600", "--warmup_requests", "1", "--ridgefill_share", "0",
               "--seed", str(args.seed), "--json", out]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"ridgeserve-loadtest failed ({p.returncode}):\n{p.stderr[-2000:]}")
        m = scrape_metrics(srv)
        peak_rss_mb = peak_rss(srv.proc.pid)
    with open(out, encoding="utf-8") as f:
        summary = json.load(f)["summary"]["exact"]
    if summary["num_errors"]:
        sys.exit(f"{tag}: {summary['num_errors']} requests failed: {summary['errors']}")
    return {"online": online,
            "ttft_mean_s": summary["ttft_seconds"]["mean"],
            "ttft_p50_s": summary["ttft_seconds"]["p50"],
            "e2e_mean_s": summary["e2e_seconds"]["mean"],
            "output_tokens_per_s": summary["output_token_throughput"],
            # The engine's own step time per row (prompt and decode rows): the per-step cost,
            # without the queueing that TTFT adds.
            "step_seconds_per_row":
                (m['ridgeserve_engine_step_seconds_total{part="forward"}'] +
                 m['ridgeserve_engine_step_seconds_total{part="host"}']) /
                m["ridgeserve_engine_step_rows_total"],
            "online_rows": m.get("ridgeserve_ridgefill_online_rows", 0),
            "online_dropped_rows": m.get("ridgeserve_ridgefill_online_dropped_rows_total", 0),
            "online_accumulate_seconds":
                m.get("ridgeserve_ridgefill_online_accumulate_seconds_total", 0),
            "online_resolves": m.get('ridgeserve_ridgefill_online_resolves_total{result="ok"}', 0),
            "peak_rss_mb": peak_rss_mb}


RATIOS = ("ttft_mean_s", "ttft_p50_s", "e2e_mean_s", "output_tokens_per_s", "step_seconds_per_row")


def cost(args):
    tmp = tempfile.mkdtemp(prefix="rs_bench_online_cost_")
    served, _ = texts(tmp)
    rounds = []
    for r in range(args.rounds):
        order = [False, True] if r % 2 == 0 else [True, False]
        arms = {on: cost_arm(args, on, served, tmp, f"r{r}_{'on' if on else 'off'}")
                for on in order}
        ratio = {k: arms[True][k] / arms[False][k]
                 for k in RATIOS}
        rounds.append({"off": arms[False], "on": arms[True], "on_over_off": ratio})
        print(json.dumps(rounds[-1], indent=2), flush=True)
    for k in RATIOS:
        print(f"{k}: on/off median over rounds "
              f"{statistics.median(x['on_over_off'][k] for x in rounds):.3f}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(rounds, f, indent=2)
    shutil.rmtree(tmp, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    s = sub.add_parser("shift")
    s.add_argument("--rows", default="8192,32768")
    s.add_argument("--share", type=float, default=0.5)
    s.add_argument("--splits", default="16,18,20")
    s.add_argument("--json")
    c = sub.add_parser("cost")
    c.add_argument("--rounds", type=int, default=2)
    c.add_argument("--rate", type=float, default=0.5)
    c.add_argument("--num_requests", type=int, default=40)
    c.add_argument("--seed", type=int, default=7)
    c.add_argument("--json")
    args = ap.parse_args()
    shift(args) if args.what == "shift" else cost(args)


if __name__ == "__main__":
    main()
