#!/usr/bin/env python3
"""Side-by-side CPU benchmark: this checkout against an older commit, in one run, on the
default model, with the same threads (a benchmark, not a test).

    scripts/bench_cpu.py [--base REV] [--threads 2] [--isas avx2,avx512,amx] [--head_build DIR]
                         [--rounds 2] [--json out.json]

Builds REV (default: a4038c3, the last commit with OpenBLAS in the forward pass) in a git
worktree under build-bench/ (git-ignored), and this checkout's tools in build-bench/head, then
measures each build alternately: single-stream decode (ridgeserve-eval generate, greedy, 128
tokens), prefill at 512 and 2048 tokens (bench-prefill), peak RSS of the decode run, and for
this checkout also decode at 1 and 16 streams (bench-decode, int8 and f32 activations),
prefill with int8 activations, the resident weight bytes it logs, memory read bandwidth and
peak FMA throughput (bench_kernels).
Prints a Markdown table and the decode bandwidth bound: weight bytes read per token divided by
the measured bandwidth. Each number is the best of --rounds alternating rounds (the machine's
peaks too, measured once a round). Set OPENBLAS_CORETYPE to force the base build's OpenBLAS
kernel.

--isas avx2,avx512,amx measures this checkout once per CPU kernel path (RIDGESERVE_CPU_ISA), in
the same alternation, so a new path is compared with the one it replaces on the same machine;
the ratio column is the last path against the base.
"""

import argparse
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
PROMPT = "The history of the Roman empire"


def run(cmd, env=None, cwd=ROOT):
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return proc


def build(src, build_dir, targets):
    run(["cmake", "-S", src, "-B", build_dir, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release"])
    run(["cmake", "--build", build_dir, "--target", *targets])
    return os.path.join(build_dir, "bin")


def eval_json(bin_dir, args, env):
    """ridgeserve-eval under /usr/bin/time -v: (json, peak RSS bytes, stderr)."""
    cmd = ["/usr/bin/time", "-v", os.path.join(bin_dir, "ridgeserve-eval"), *args,
           "--model", MODEL]
    proc = run(cmd, env=env)
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr)
    return json.loads(proc.stdout.strip().splitlines()[-1]), int(rss.group(1)) * 1024, proc.stderr


def measure(bin_dir, threads, env):
    t = ["--threads", str(threads)]
    out = {}
    gen, rss, log = eval_json(bin_dir, ["generate", "--prompt", PROMPT, "--max_new_tokens",
                                        "128", *t], env)
    out["decode_tokens_per_s"] = gen["tokens_per_second"]
    out["peak_rss_bytes"] = rss
    m = re.search(r"weights: ([\d.]+) MB resident", log)
    if m:
        out["resident_weight_bytes"] = float(m.group(1)) * 1e6
    pre, _, _ = eval_json(bin_dir, ["bench-prefill", "--lengths", "512,2048", *t], env)
    for r in pre["results"]:
        out[f"prefill_{r['prompt_tokens']}_tokens_per_s"] = r["tokens_per_second"]
        out[f"prefill_{r['prompt_tokens']}_gflop_per_s"] = r["gflop_per_second"]
    return out


def isa_env(env, isa):
    if isa is None:
        return env
    return {**env, "RIDGESERVE_CPU_ISA": isa}


def kernel_peaks(bin_dir, env):
    proc = run([os.path.join(bin_dir, "bench_kernels"), "--benchmark_filter=MemoryRead/2|PeakFma/2",
                "--benchmark_format=json"], env=env)
    peaks = {}
    for b in json.loads(proc.stdout)["benchmarks"]:
        if "MemoryRead" in b["name"]:
            peaks["memory_read_bytes_per_s"] = b["bytes_per_s"]
        else:
            peaks["fma_peak_flop_per_s"] = b["FLOPS"]
    return peaks


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", default="a4038c3")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--isas", help="comma-separated RIDGESERVE_CPU_ISA values for this checkout")
    ap.add_argument("--head_build", help="build directory for this checkout (default "
                    "build-bench/head; `build` reuses the README's build)")
    ap.add_argument("--rounds", type=int, default=2,
                    help="alternating rounds; each number is the best of them")
    ap.add_argument("--json")
    args = ap.parse_args()
    if not os.path.exists(MODEL):
        sys.exit(f"{MODEL} missing: run `make model` first")
    env = dict(os.environ)
    bench = os.path.join(ROOT, "build-bench")
    base_src = os.path.join(bench, "base-src")
    if not os.path.isdir(base_src):
        run(["git", "worktree", "add", "--detach", base_src, args.base])
    else:
        run(["git", "checkout", "--detach", args.base], cwd=base_src)
    base_bin = build(base_src, os.path.join(bench, "base"), ["ridgeserve-eval"])
    head_bin = build(ROOT, args.head_build or os.path.join(bench, "head"),
                     ["ridgeserve-eval", "bench_kernels"])

    # (name, binaries, RIDGESERVE_CPU_ISA or None for the build's default)
    isas = args.isas.split(",") if args.isas else [None]
    runs = [("base", base_bin, None)] + [(f"head {i}" if i else "head", head_bin, i) for i in isas]
    results = {name: {} for name, _, _ in runs}

    def keep_best(name, r):
        for k, v in r.items():
            best = results[name].get(k)
            if best is None or (v < best if k.endswith("bytes") else v > best):
                results[name][k] = v

    # Alternate the builds so that drift on a shared machine hits each; every measurement,
    # the machine's peaks included, is the best of the rounds.
    for _ in range(args.rounds):
        for name, bin_dir, isa in runs:
            keep_best(name, measure(bin_dir, args.threads, isa_env(env, isa)))
            if bin_dir != head_bin:
                continue
            for act in ("int8", "f32"):
                dec, _, _ = eval_json(head_bin, ["bench-decode", "--streams", "1,16", "--threads",
                                                 str(args.threads), "--cpu_activations", act],
                                      isa_env(env, isa))
                keep_best(name, {f"decode_{act}_{r['streams']}_streams_tokens_per_s":
                                 r["tokens_per_second"] for r in dec["results"]})
            pre, _, _ = eval_json(head_bin, ["bench-prefill", "--lengths", "512,2048", "--threads",
                                             str(args.threads), "--cpu_activations", "int8"],
                                  isa_env(env, isa))
            keep_best(name, {f"prefill_int8_{r['prompt_tokens']}_tokens_per_s":
                             r["tokens_per_second"] for r in pre["results"]})
        keep_best(runs[-1][0], kernel_peaks(head_bin, env))
    last = runs[-1][0]
    head = results[last]
    results["base"]["rev"] = args.base

    def row(label, key, fmt="{:.1f}", scale=1.0):
        cell = lambda v: "—" if v is None else fmt.format(v * scale)
        b, h = results["base"].get(key), head.get(key)
        ratio = f"{h / b:.2f}x" if b and h else ""
        cells = " | ".join(cell(results[name].get(key)) for name, _, _ in runs)
        print(f"| {label} | {cells} | {ratio} |")

    print(f"| {args.threads} threads | {args.base} | "
          + " | ".join(name for name, _, _ in runs[1:]) + f" | {last} / base |")
    print("|---" * (len(runs) + 2) + "|")
    row("decode, 1 stream (tokens/s)", "decode_tokens_per_s")
    row("prefill 512 (tokens/s)", "prefill_512_tokens_per_s", "{:.0f}")
    row("prefill 2048 (tokens/s)", "prefill_2048_tokens_per_s", "{:.0f}")
    row("prefill 512 (GFLOP/s)", "prefill_512_gflop_per_s")
    row("prefill 512, int8 activations (tokens/s)", "prefill_int8_512_tokens_per_s", "{:.0f}")
    row("prefill 2048, int8 activations (tokens/s)", "prefill_int8_2048_tokens_per_s", "{:.0f}")
    row("peak RSS, decode run (MB)", "peak_rss_bytes", "{:.0f}", 1e-6)
    for name, _, _ in runs[1:]:
        for act in ("int8", "f32"):
            one = results[name][f"decode_{act}_1_streams_tokens_per_s"]
            many = results[name][f"decode_{act}_16_streams_tokens_per_s"]
            print(f"{name}, {act}: bench-decode 1 stream {one:.1f} tokens/s, 16 streams "
                  f"{many:.1f} tokens/s ({many / one:.2f}x)")
    weights = head.get("resident_weight_bytes")
    bw = head["memory_read_bytes_per_s"]
    if weights:
        bound = bw / weights
        print(f"resident weights {weights / 1e6:.1f} MB; memory read {bw / 1e9:.1f} GB/s -> "
              f"decode bound {bound:.0f} tokens/s; {last} single stream: " + ", ".join(
                  f"{act} {head[f'decode_{act}_1_streams_tokens_per_s']:.1f} tokens/s "
                  f"({100 * head[f'decode_{act}_1_streams_tokens_per_s'] / bound:.0f}%)"
                  for act in ("f32", "int8")))
    print(f"FMA peak {head['fma_peak_flop_per_s'] / 1e9:.0f} GFLOP/s; prefill 512 at "
          f"{100 * head['prefill_512_gflop_per_s'] * 1e9 / head['fma_peak_flop_per_s']:.0f}%")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
