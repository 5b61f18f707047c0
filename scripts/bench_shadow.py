#!/usr/bin/env python3
"""What RidgeFill shadow sampling costs the requests being served (a benchmark, not a test).

    scripts/bench_shadow.py [--fractions 0,0.05,1] [--rounds 2] [--rate 0.25]
                            [--shadow_step_tokens 256] [--json out.json]

For each round and each --ridgefill_shadow_fraction F (the order reversed every other round,
so drift hits every F alike) starts the real ridgeserve (default model and maps, build/bin) and
drives it with ridgeserve-loadtest: the same seeded Poisson arrivals of RIDGEFILL requests cut
from the license texts. Reports per F the client-side TTFT and E2E latency, output tokens/s,
and the shadows the server compared and dropped (its /metrics), and each F's TTFT and E2E
against F = 0 of the same round. Use a quiet machine: the arms run one after another.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "server"))

from rs_testlib import BIN_DIR, MAPS, Server, license_text, scrape_metrics  # noqa: E402


def arm(args, fraction, text_path, out_dir, tag):
    with Server(f"--ridgefill_maps={MAPS}", f"--ridgefill_shadow_fraction={fraction}",
                f"--ridgefill_shadow_step_tokens={args.shadow_step_tokens}",
                threads=args.threads, name=f"bench_shadow_{tag}") as srv:
        out = os.path.join(out_dir, f"{tag}.json")
        cmd = [os.path.join(BIN_DIR, "ridgeserve-loadtest"), "--target", srv.target,
               "--text", text_path, "--prompt_tokens", f"fixed:{args.prompt_tokens}",
               "--output_tokens", f"fixed:{args.output_tokens}", "--rate", str(args.rate),
               "--num_requests", str(args.num_requests), "--duration_s", "3600",
               "--warmup_requests", "1", "--ridgefill_share", "1",
               "--exact_tail_tokens", str(args.exact_tail_tokens), "--seed", str(args.seed),
               "--json", out]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"ridgeserve-loadtest failed ({p.returncode}):\n{p.stderr[-2000:]}")
        m = scrape_metrics(srv)
    with open(out, encoding="utf-8") as f:
        summary = json.load(f)["summary"]["ridgefill"]
    if summary["num_errors"]:
        sys.exit(f"{tag}: {summary['num_errors']} requests failed: {summary['errors']}")
    compared = sum(v for k, v in m.items()
                   if k.startswith("ridgeserve_ridgefill_shadow_samples_total{"))
    dropped = {r: m.get(f'ridgeserve_ridgefill_shadow_dropped_total{{reason="{r}"}}', 0)
               for r in ("queue", "displaced")}
    return {"fraction": fraction,
            "ttft_mean_s": summary["ttft_seconds"]["mean"],
            "ttft_p50_s": summary["ttft_seconds"]["p50"],
            "ttft_p95_s": summary["ttft_seconds"]["p95"],
            "e2e_mean_s": summary["e2e_seconds"]["mean"],
            "e2e_p50_s": summary["e2e_seconds"]["p50"],
            "output_tokens_per_s": summary["output_token_throughput"],
            "shadows_compared": compared, "shadows_dropped": dropped}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fractions", default="0,0.05,1")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--rate", type=float, default=0.25, help="requests per second (Poisson)")
    ap.add_argument("--num_requests", type=int, default=24)
    ap.add_argument("--prompt_tokens", type=int, default=1024)
    ap.add_argument("--exact_tail_tokens", type=int, default=128)
    ap.add_argument("--output_tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--shadow_step_tokens", type=int, default=256,
                    help="the server's --ridgefill_shadow_step_tokens")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    fractions = [float(x) for x in args.fractions.split(",")]
    if fractions[0] != 0:
        sys.exit("--fractions must start with 0 (the baseline)")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_shadow_") as tmp:
        text_path = os.path.join(tmp, "licenses.txt")
        with open(text_path, "w", encoding="utf-8") as f:
            f.write(license_text())
        for r in range(args.rounds):
            order = fractions if r % 2 == 0 else fractions[::-1]
            for fraction in order:
                row = arm(args, fraction, text_path, tmp, f"r{r}_f{fraction}")
                row["round"] = r
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
    base = {row["round"]: row for row in rows if row["fraction"] == 0}
    print(f"{args.num_requests} RIDGEFILL requests per arm, {args.prompt_tokens}-token prompts, "
          f"tail {args.exact_tail_tokens}, {args.output_tokens} output tokens, Poisson "
          f"{args.rate}/s, {args.rounds} rounds, --ridgefill_shadow_step_tokens "
          f"{args.shadow_step_tokens}\n")
    print("| F | TTFT mean | TTFT p50 | TTFT p95 | E2E mean | TTFT mean / F=0 | E2E mean / F=0 "
          "| shadows compared | dropped (queue, displaced) |")
    print("|---|---|---|---|---|---|---|---|---|")
    summary = []
    for fraction in fractions:
        mine = [row for row in rows if row["fraction"] == fraction]
        ttft_ratio = statistics.mean(x["ttft_mean_s"] / base[x["round"]]["ttft_mean_s"]
                                     for x in mine)
        e2e_ratio = statistics.mean(x["e2e_mean_s"] / base[x["round"]]["e2e_mean_s"]
                                    for x in mine)

        def mean(key, rows_=mine):
            return statistics.mean(x[key] for x in rows_)

        compared = sum(x["shadows_compared"] for x in mine)
        queue = sum(x["shadows_dropped"]["queue"] for x in mine)
        displaced = sum(x["shadows_dropped"]["displaced"] for x in mine)
        print(f"| {fraction:g} | {mean('ttft_mean_s'):.3f} s | {mean('ttft_p50_s'):.3f} s | "
              f"{mean('ttft_p95_s'):.3f} s | {mean('e2e_mean_s'):.3f} s | {ttft_ratio:.3f} | "
              f"{e2e_ratio:.3f} | {compared:.0f} | {queue:.0f}, {displaced:.0f} |")
        summary.append({"fraction": fraction, "ttft_mean_ratio": ttft_ratio,
                        "e2e_mean_ratio": e2e_ratio, "shadows_compared": compared,
                        "dropped_queue": queue, "dropped_displaced": displaced})
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"args": vars(args), "arms": rows, "summary": summary}, f, indent=1)


if __name__ == "__main__":
    main()
