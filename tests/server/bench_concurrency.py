"""Decode throughput and TTFT of ridgeserve at concurrency 1, 4 and 16 (benchmark, not a test).

Closed loop: at concurrency C, C client threads each send GenerateStream requests one after
another until `--requests_per_level` (default 2*C, at least 8) have completed. Every request:
a `--prompt_tokens`-token prompt (distinct windows of license text, so no prefix-cache hits),
`--new_tokens` new tokens, greedy, ignore_eos (every request generates the full length).

Per level it reports:
  throughput_tok_s   generated tokens / wall time of the level (aggregate decode throughput)
  ttft_p50_s/p90     time from sending a request to its first token (client side)
  tpot_mean_s        mean per-request (e2e - ttft) / (tokens - 1): time per output token
  e2e_p50_s          request latency
Prints one JSON object (and a table on stderr).

Usage:
  .venv/bin/python tests/server/bench_concurrency.py                 # starts its own server
  .venv/bin/python tests/server/bench_concurrency.py --target H:P    # an already running one
Options: --levels 1,4,16 --prompt_tokens 32 --new_tokens 64 --threads 0 (server threads,
0 = all cores) --server_args "--max_batch_tokens=2048".
"""

import argparse
import json
import statistics
import sys
import threading
import time

import grpc

import rs_testlib as lib


def percentile(xs, q):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    i = min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))
    return xs[i]


def run_level(stub, prompts, concurrency, n_requests, new_tokens):
    lock = threading.Lock()
    next_i = [0]
    records = []
    errors = []

    def worker():
        while True:
            with lock:
                i = next_i[0]
                if i >= n_requests:
                    return
                next_i[0] += 1
            req = lib.greedy_request(token_ids=prompts[i % len(prompts)],
                                     max_new_tokens=new_tokens, ignore_eos=True)
            t0 = time.monotonic()
            r = lib.consume_stream(stub.GenerateStream(req, timeout=900))
            if r.code != grpc.StatusCode.OK or r.first_token_time is None:
                with lock:
                    errors.append(r.code.name)
                continue
            n = len(r.token_ids)
            e2e = r.end_time - t0
            ttft = r.first_token_time - t0
            with lock:
                records.append({"ttft": ttft, "e2e": e2e, "tokens": n,
                                "tpot": (e2e - ttft) / (n - 1) if n > 1 else 0.0})

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    tokens = sum(r["tokens"] for r in records)
    return {
        "concurrency": concurrency,
        "requests": len(records),
        "errors": errors,
        "wall_s": round(wall, 3),
        "generated_tokens": tokens,
        "throughput_tok_s": round(tokens / wall, 2) if wall > 0 else 0.0,
        "ttft_p50_s": round(percentile([r["ttft"] for r in records], 0.5), 4),
        "ttft_p90_s": round(percentile([r["ttft"] for r in records], 0.9), 4),
        "tpot_mean_s": round(statistics.fmean(r["tpot"] for r in records), 4) if records else None,
        "e2e_p50_s": round(percentile([r["e2e"] for r in records], 0.5), 3),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="", help="HOST:PORT of a running server")
    ap.add_argument("--levels", default="1,4,16")
    ap.add_argument("--prompt_tokens", type=int, default=32)
    ap.add_argument("--new_tokens", type=int, default=64)
    ap.add_argument("--requests_per_level", type=int, default=0, help="0: max(8, 2*C)")
    ap.add_argument("--threads", type=int, default=0, help="server --threads (own server)")
    ap.add_argument("--server_args", default="", help="extra flags for the own server")
    args = ap.parse_args()

    server = None
    if args.target:
        channel = grpc.insecure_channel(args.target)
        stub = lib.pb_grpc.InferenceStub(channel)
    else:
        server = lib.Server(*args.server_args.split(), threads=args.threads, name="bench")
        server.start()
        stub = server.stub
    try:
        info = stub.GetModelInfo(lib.pb.GetModelInfoRequest(), timeout=10)
        ids = lib.pb.TokenizeRequest(text=lib.license_text(120000))
        corpus = list(stub.Tokenize(ids, timeout=60).token_ids)
        p = args.prompt_tokens
        prompts = [corpus[i * p:(i + 1) * p] for i in range(len(corpus) // p)]
        # Warm-up: one request, not measured.
        lib.consume_stream(stub.GenerateStream(
            lib.greedy_request(token_ids=prompts[-1], max_new_tokens=4), timeout=300))
        levels = []
        offset = 0
        for c in [int(x) for x in args.levels.split(",")]:
            n = args.requests_per_level or max(8, 2 * c)
            # Distinct prompts per level: no prefix-cache hits between levels.
            level_prompts = prompts[offset:offset + n]
            offset += n
            res = run_level(stub, level_prompts, c, n, args.new_tokens)
            levels.append(res)
            print(f"concurrency {c:3d}: {res['throughput_tok_s']:8.1f} tok/s  "
                  f"TTFT p50 {res['ttft_p50_s'] * 1000:8.1f} ms  p90 "
                  f"{res['ttft_p90_s'] * 1000:8.1f} ms  TPOT {res['tpot_mean_s'] * 1000:7.1f} ms  "
                  f"({res['requests']} requests, {res['wall_s']:.1f} s, errors {res['errors']})",
                  file=sys.stderr, flush=True)
        out = {
            "model": info.model_name,
            "backend": info.backend,
            "prompt_tokens": p,
            "new_tokens": args.new_tokens,
            "server_threads": args.threads if server else None,
            "levels": levels,
        }
        print(json.dumps(out, indent=2))
    finally:
        if server is not None:
            server.stop()
            server.remove_log()


if __name__ == "__main__":
    main()
