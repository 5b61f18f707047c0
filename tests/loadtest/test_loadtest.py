"""ridgeserve-loadtest against the real server on loopback, in every arrival mode.

One server (default model, RidgeFill maps, the self:8 SpecPC / SpecKV draft) runs closed,
poisson, gamma, a 2-rate sweep, a RidgeFill mix (--ridgefill_share) and a four-mode mix
(--mode_share); a second one with a queue of 1 takes a burst. Each run's JSON is checked:
  * the request count is what was configured, every prompt has the asked length (token_ids
    slices of real text) and every output the asked length (ignore_eos);
  * TTFT, TPOT, ITL and E2E percentiles are positive and ordered (p50 <= p90 <= p95 <= p99);
  * the server's Prometheus counters moved by exactly what the load test reports
    (ridgeserve_requests_total for successes, ridgeserve_request_errors_total{code} for
    rejections): the client and server agree on every call;
  * under a burst the rejections are reported by code (RESOURCE_EXHAUSTED);
  * the prefill mix sends both modes, half each, and RIDGEFILL requests filled prompt rows;
    exact=0.4,ridgefill=0.2,spec_pc=0.2,spec_kv=0.2 sends 4, 2, 2 and 2 of 10, SPEC_PC
    requests kept --spec_pc_budget tokens, SPEC_KV ones --spec_kv_budget KV entries, and the
    server counted each mode so;
  * CSV has one row per request; --plot never fails the run; a remote target is refused.
"""

import csv
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "server"))
from rs_testlib import BIN_DIR, MODEL, SOURCE_DIR, Checks, Server, expect, expect_eq  # noqa: E402

LOADTEST = os.path.join(BIN_DIR, "ridgeserve-loadtest")
CALIBRATE = os.path.join(BIN_DIR, "ridgeserve-calibrate")
TEXT = "/usr/share/common-licenses/GPL-3"
MAPS = os.environ.get("RIDGESERVE_DEFAULT_MAPS") or os.path.join(
    SOURCE_DIR, "models", "SmolLM2-135M-Instruct.Q4_1.rfmap")
SHORT = ["--prompt_tokens", "uniform:32:64", "--output_tokens", "fixed:8", "--text", TEXT,
         "--timeout_s", "60", "--seed", "3"]


def metrics(srv):
    """{(name, frozenset(labels)): value} of the ridgeserve_*_total counters on /metrics."""
    url = f"http://127.0.0.1:{srv.metrics_port}/metrics"
    body = urllib.request.urlopen(url, timeout=10).read().decode()
    out = {}
    for line in body.splitlines():
        m = re.match(r"^(ridgeserve_[a-z_]+_total)(?:\{(.*)\})? ([0-9.eE+-]+)$", line)
        if m:
            labels = frozenset(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
            out[(m.group(1), labels)] = float(m.group(3))
    return out


def counter_delta(before, after, name, **labels):
    """Sum over series of `name` whose labels include `labels`, after minus before."""
    want = set(labels.items())

    def total(snap):
        return sum(v for (n, ls), v in snap.items() if n == name and want <= set(ls))

    return total(after) - total(before)


def run_loadtest(srv, tmp, name, *args, expect_rc=0):
    json_path = os.path.join(tmp, f"{name}.json")
    csv_path = os.path.join(tmp, f"{name}.csv")
    cmd = [LOADTEST, f"--target={srv.target}", f"--json={json_path}", f"--csv={csv_path}",
           *args]
    print("$ " + " ".join(cmd), flush=True)
    t0 = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    print(done.stdout)
    print(done.stderr[-3000:], flush=True)
    print(f"({time.monotonic() - t0:.1f} s)")
    expect_eq(done.returncode, expect_rc, f"{name}: exit code")
    with open(json_path) as f:
        report = json.load(f)
    with open(csv_path) as f:
        rows = list(csv.DictReader(f))
    expect_eq(len(rows), len(report["requests"]), f"{name}: CSV rows")
    return report, done


def check_ordered(summary, what):
    for metric in ("ttft_seconds", "tpot_seconds", "itl_seconds", "e2e_seconds"):
        s = summary[metric]
        expect(s["count"] > 0, f"{what} {metric}: no values")
        p = [s["p50"], s["p90"], s["p95"], s["p99"]]
        expect(all(v > 0 for v in p) and s["mean"] > 0, f"{what} {metric}: not positive: {s}")
        expect(p == sorted(p), f"{what} {metric}: percentiles not ordered: {p}")
    expect(summary["ttft_seconds"]["p50"] <= summary["e2e_seconds"]["p50"],
           f"{what}: TTFT p50 above E2E p50")


def check_requests(report, want, what, output_tokens=8):
    reqs = report["requests"]
    expect_eq(len(reqs), want, f"{what}: measured requests")
    expect_eq(report["summary"]["all"]["num_requests"], want, f"{what}: summary num_requests")
    for r in reqs:
        if r["status"] != "OK":
            continue
        expect_eq(r["server_prompt_tokens"], r["prompt_tokens"], f"{what}: prompt length")
        expect(32 <= r["prompt_tokens"] <= 64, f"{what}: prompt length {r['prompt_tokens']}")
        expect_eq(r["output_tokens"], output_tokens, f"{what}: output tokens")
        expect_eq(r["finish_reason"], "LENGTH", f"{what}: finish_reason")
        expect(0 < r["ttft_s"] <= r["e2e_s"], f"{what}: ttft {r['ttft_s']} e2e {r['e2e_s']}")


def check_server_counted(before, after, report, what):
    """Every call the load test made (warm-up included) is counted once by the server."""
    ok = sum(1 for r in report["requests"] if r["status"] == "OK")
    warm = report["warmup"]["num_requests"]
    expect_eq(report["warmup"]["num_errors"], 0, f"{what}: warm-up errors")
    served = counter_delta(before, after, "ridgeserve_requests_total")
    errors = counter_delta(before, after, "ridgeserve_request_errors_total")
    expect_eq(served + errors, report["num_requests_sent"],
              f"{what}: requests the server counted (requests_total + request_errors_total)")
    expect_eq(served, ok + warm, f"{what}: ridgeserve_requests_total vs OK requests")
    for code, n in report["summary"]["all"]["errors"].items():
        expect_eq(counter_delta(before, after, "ridgeserve_request_errors_total", code=code), n,
                  f"{what}: ridgeserve_request_errors_total{{code={code}}}")


def maps_file(tmp):
    """`make maps`' file when present, else small maps from ~2K KJV tokens (split 22)."""
    if os.path.exists(MAPS):
        return MAPS
    kjv = os.path.join(tmp, "kjv.txt")
    with open(kjv, "w") as f:
        subprocess.run(["bible", "-p", "/usr/lib", "gen1:1-gen10:32"], stdout=f, check=True)
    out = os.path.join(tmp, "lt.rfmap")
    subprocess.run([CALIBRATE, "--model", MODEL, "--text", kjv, "--split_layers", "22", "--out",
                    out, "--max_tokens", "2048", "--window", "1024"], check=True,
                   capture_output=True, timeout=300)
    return out


def main():
    checks = Checks("test_loadtest")
    with tempfile.TemporaryDirectory() as tmp:
        maps = maps_file(tmp)
        with Server(f"--ridgefill_maps={maps}", "--draft_model=self:8",
                    name="loadtest") as srv:

            def measured(name, want, *args):
                before = metrics(srv)
                report, done = run_loadtest(srv, tmp, name, *SHORT, *args)
                after = metrics(srv)
                check_requests(report, want, name)
                expect_eq(report["summary"]["all"]["num_errors"], 0, f"{name}: errors")
                check_ordered(report["summary"]["all"], name)
                check_server_counted(before, after, report, name)
                return report, done

            def closed():
                report, _ = measured("closed", 6, "--arrival=closed", "--concurrency=2",
                                     "--num_requests=6", "--warmup_requests=1")
                expect_eq(report["warmup"]["num_requests"], 1, "closed: warm-up requests")
                # 2 in flight at most: no request was sent before one of two earlier ones ended.
                reqs = sorted(report["requests"], key=lambda r: r["sent_at_s"])
                for i in range(2, len(reqs)):
                    ends = sorted(r["sent_at_s"] + r["e2e_s"] for r in reqs[:i])
                    expect(reqs[i]["sent_at_s"] >= ends[i - 2] - 1e-3,
                           f"closed: request {i} sent with 2 others in flight")

            def poisson():
                report, _ = measured("poisson", 10, "--arrival=poisson", "--rate=5",
                                     "--num_requests=10", "--warmup_requests=0")
                sched = [r["scheduled_at_s"] for r in report["requests"]]
                expect(len(set(sched)) == len(sched), "poisson: arrivals at distinct times")

            def gamma():
                # No --arrival: --rate with --burstiness != 1 means gamma (DESIGN.md's flags).
                report, _ = measured("gamma", 10, "--rate=5", "--burstiness=0.5",
                                     "--num_requests=10", "--warmup_requests=0")
                expect_eq(report["phases"][0]["burstiness"], 0.5, "gamma: burstiness")
                expect_eq(report["config"]["arrival"], "gamma", "gamma: arrival inferred")

            def sweep():
                png = os.path.join(tmp, "sweep.png")
                report, done = measured("sweep", 12, "--arrival=poisson", "--sweep_rates=2,8",
                                        "--num_requests=6", "--warmup_requests=0",
                                        f"--plot={png}")
                if shutil.which("gnuplot"):
                    with open(png, "rb") as f:
                        expect(f.read(8) == b"\x89PNG\r\n\x1a\n", "sweep: plot is not a PNG")
                else:
                    expect("gnuplot is not installed" in done.stderr, "sweep: no plot message")
                expect_eq([p["rate"] for p in report["phases"]], [2.0, 8.0], "sweep: rates")
                for i, p in enumerate(report["phases"]):
                    expect_eq(p["summary"]["all"]["num_requests"], 6, f"sweep: phase {i} count")
                    check_ordered(p["summary"]["all"], f"sweep phase {i}")

            def duration_bound():
                # 1 req/s for 2 s sends 2 or 3 requests, far fewer than the count limit.
                report, _ = run_loadtest(srv, tmp, "duration", *SHORT, "--arrival=poisson",
                                         "--rate=1", "--duration_s=2", "--num_requests=50",
                                         "--warmup_requests=0")
                n = len(report["requests"])
                expect(1 <= n <= 6, f"duration: {n} requests in a 2 s phase at 1 req/s")
                expect(max(r["sent_at_s"] for r in report["requests"])
                       - report["phases"][0]["started_at_s"] < 2.0,
                       "duration: a request sent after --duration_s")

            def ridgefill_mix():
                before = metrics(srv)
                report, _ = run_loadtest(srv, tmp, "mix", "--text", TEXT, "--prompt_tokens=128",
                                         "--output_tokens=8", "--arrival=closed",
                                         "--concurrency=2", "--num_requests=6",
                                         "--ridgefill_share=0.5", "--exact_tail_tokens=16",
                                         "--warmup_requests=1", "--seed=5")
                after = metrics(srv)
                summary = report["summary"]
                expect_eq(summary["all"]["num_errors"], 0, "mix: errors")
                # Share 0.5 is balanced in pairs, from the phase's first request (not the warm-up).
                expect_eq(summary["exact"]["num_requests"], 3, "mix: exact requests")
                expect_eq(summary["ridgefill"]["num_requests"], 3, "mix: ridgefill requests")
                check_ordered(summary["exact"], "mix exact")
                check_ordered(summary["ridgefill"], "mix ridgefill")
                for r in report["requests"]:
                    expect_eq(r["server_prompt_tokens"], 128, "mix: prompt length")
                    filled = r["server_filled_prompt_tokens"]
                    if r["mode"] == "ridgefill":
                        expect(filled > 0, f"mix: ridgefill request filled no rows: {r}")
                    else:
                        expect_eq(filled, 0, "mix: exact request filled rows")
                check_server_counted(before, after, report, "mix")
                # 3 + 3 measured; the warm-up request is one more of either mode.
                rf = counter_delta(before, after, "ridgeserve_requests_total",
                                   prefill_mode="ridgefill")
                ex = counter_delta(before, after, "ridgeserve_requests_total",
                                   prefill_mode="exact")
                expect(sorted([rf, ex]) == [3, 4],
                       f"mix: server counted {rf} ridgefill and {ex} exact requests")

            def four_mode_mix():
                before = metrics(srv)
                report, _ = run_loadtest(srv, tmp, "modes", "--text", TEXT,
                                         "--prompt_tokens=256", "--output_tokens=8",
                                         "--arrival=closed", "--concurrency=2",
                                         "--num_requests=10",
                                         "--mode_share=exact=0.4,ridgefill=0.2,spec_pc=0.2,"
                                         "spec_kv=0.2", "--exact_tail_tokens=16",
                                         "--spec_pc_budget=96", "--spec_kv_budget=64",
                                         "--warmup_requests=0", "--seed=3")
                after = metrics(srv)
                summary = report["summary"]
                expect_eq(summary["all"]["num_errors"], 0, "modes: errors")
                expect_eq(report["config"]["mode_share"],
                          {"exact": 0.4, "ridgefill": 0.2, "spec_pc": 0.2, "spec_kv": 0.2},
                          "modes: config")
                expect_eq(report["config"]["spec_kv_budget"], 64, "modes: config budget")
                want = {"exact": 4, "ridgefill": 2, "spec_pc": 2, "spec_kv": 2}
                for mode, n in want.items():
                    expect_eq(summary[mode]["num_requests"], n, f"modes: {mode} requests")
                    check_ordered(summary[mode], f"modes {mode}")
                    expect_eq(counter_delta(before, after, "ridgeserve_requests_total",
                                            prefill_mode=mode), n, f"modes: server's {mode}")
                for r in report["requests"]:
                    expect_eq(r["server_prompt_tokens"], 256, "modes: prompt length")
                    kept = {"spec_pc": 96}.get(r["mode"], 256)
                    expect_eq(r["server_kept_prompt_tokens"], kept, f"modes: {r['mode']} kept")
                    kept_kv = {"spec_kv": 64}.get(r["mode"], 256)
                    expect_eq(r["server_kept_kv_tokens"], kept_kv,
                              f"modes: {r['mode']} kept KV entries")
                    expect_eq(r["server_filled_prompt_tokens"] > 0, r["mode"] == "ridgefill",
                              f"modes: {r['mode']} filled rows")
                check_server_counted(before, after, report, "modes")

            def remote_refused():
                done = subprocess.run([LOADTEST, "--target=10.1.2.3:50051", "--text", TEXT],
                                      capture_output=True, text=True, timeout=30)
                expect_eq(done.returncode, 3, "remote target: exit code (INVALID_ARGUMENT)")
                expect("--allow_remote" in done.stderr, f"remote target: {done.stderr!r}")

            checks.run("closed loop, concurrency 2", closed)
            checks.run("poisson arrivals", poisson)
            checks.run("gamma arrivals", gamma)
            checks.run("sweep over 2 rates, plot", sweep)
            checks.run("duration bound", duration_bound)
            checks.run("prefill mix exact/ridgefill", ridgefill_mix)
            checks.run("prefill mix exact/ridgefill/spec_pc/spec_kv", four_mode_mix)
            checks.run("non-loopback target refused", remote_refused)

        with Server("--max_running_requests=1", "--max_queued_requests=1",
                    name="loadtest-queue") as srv:

            def burst():
                before = metrics(srv)
                report, _ = run_loadtest(srv, tmp, "burst", *SHORT, "--output_tokens=fixed:16",
                                         "--arrival=gamma", "--rate=400", "--burstiness=0.25",
                                         "--num_requests=12", "--warmup_requests=0")
                after = metrics(srv)
                all_ = report["summary"]["all"]
                codes = all_["errors"]
                print(f"burst: ok {all_['num_ok']} errors {codes}")
                expect_eq(all_["num_ok"] + all_["num_errors"], 12, "burst: every request ended")
                expect(set(codes) == {"RESOURCE_EXHAUSTED"}, f"burst: error codes {codes}")
                expect(codes.get("RESOURCE_EXHAUSTED", 0) >= 1, "burst: nothing rejected")
                expect(all_["num_ok"] >= 2, f"burst: only {all_['num_ok']} admitted")
                check_requests(report, 12, "burst", output_tokens=16)
                check_server_counted(before, after, report, "burst")

            checks.run("burst over a queue of 1: RESOURCE_EXHAUSTED by code", burst)
    checks.finish()


if __name__ == "__main__":
    main()
