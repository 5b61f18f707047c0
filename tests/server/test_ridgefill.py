"""RidgeFill served per request: the real ridgeserve with the default model and its maps.

Checks, each against the server's own exact path or the map file's contents:
  * RIDGEFILL with exact_tail_tokens >= the prompt length is token-identical to EXACT and
    fills nothing;
  * RIDGEFILL requests fill exactly the rows the definition says (prompt minus tail minus the
    4 sink rows minus exact_spans) and report a positive estimated TTFT saved;
  * RidgeFill (two split layers) and exact requests sent at once, batched and chunked
    (--max_batch_tokens 256, prefix cache off so every prompt is computed), each give the
    tokens they give alone;
  * (with the prefix cache on) the prefix cache never serves RidgeFill's approximate blocks to an exact request (and the
    reverse), but repeats of the same RidgeFill request do hit it;
  * bad RidgeFill parameters: unknown split → FAILED_PRECONDITION naming it; a span past the
    prompt → INVALID_ARGUMENT naming the field; a server without maps → FAILED_PRECONDITION;
  * leverage-based row selection: a threshold below every row's leverage gives exact tokens
    with nothing filled; a moderate one fills only part of the planned rows;
  * a truncated map file stops the server at start with one line naming the file;
  * afterwards every KV block is free again.
"""

import os
import shutil
import subprocess
import tempfile

from rs_testlib import (MAPS, MODEL, SC, SERVER_BIN, Checks, Server, expect, expect_eq,
                        greedy_request, in_threads, license_text, run_unary)

SINKS = 4
NEW_TOKENS = 12


def ridgefill_request(token_ids, tail, split=None, spans=()):
    req = greedy_request(token_ids=token_ids, max_new_tokens=NEW_TOKENS, ignore_eos=True)
    req.prefill.mode = req.prefill.RIDGEFILL
    req.prefill.ridgefill.exact_tail_tokens = tail
    if split is not None:
        req.prefill.ridgefill.split_layer = split
    for begin, end in spans:
        req.prefill.ridgefill.exact_spans.add(begin=begin, end=end)
    return req


def exact_request(token_ids):
    return greedy_request(token_ids=token_ids, max_new_tokens=NEW_TOKENS, ignore_eos=True)


def ok(server, req):
    resp, code, details = run_unary(server.stub, req)
    expect(code == SC.OK, f"request failed: {code} {details}")
    return resp


def check_prefix_cache(srv, p, q, split):
    """RidgeFill repeats hit the cache; exact requests never get RidgeFill's blocks."""
    exact_first = ok(srv, exact_request(p))
    rf = ok(srv, ridgefill_request(p, 48, split))
    rf_again = ok(srv, ridgefill_request(p, 48, split))
    expect(rf_again.usage.cached_prompt_tokens > 0, "RidgeFill repeat missed the cache")
    expect_eq(list(rf_again.token_ids), list(rf.token_ids), "RidgeFill repeat tokens")
    exact_again = ok(srv, exact_request(p))
    expect_eq(list(exact_again.token_ids), list(exact_first.token_ids), "exact tokens")
    expect(exact_again.usage.cached_prompt_tokens > 0, "exact repeat missed the cache")
    # A fresh prompt: RidgeFill first, then exact must not reuse its blocks.
    ok(srv, ridgefill_request(q, 32, split))
    e = ok(srv, exact_request(q))
    expect_eq(e.usage.cached_prompt_tokens, 0, "exact request reused RidgeFill blocks")


LEVERAGE_SWEEP = (0.2, 0.05, 0.02, 0.01, 0.005)


def check_leverage(p, split):
    """Leverage-based row selection: a threshold below every row's leverage runs every filled
    row exactly (tokens equal exact, nothing filled); a moderate one runs only some of them."""
    with Server("--ridgefill_maps", MAPS, "--ridgefill_max_leverage=1e-30",
                "--enable_prefix_caching=false", name="leverage_all") as srv:
        exact = ok(srv, exact_request(p))
        r = ok(srv, ridgefill_request(p, 48, split))
        expect_eq(list(r.token_ids), list(exact.token_ids), "every row promoted: tokens")
        expect_eq(r.usage.filled_prompt_tokens, 0, "every row promoted: filled rows")
    # Leverage scales with the calibration text, so no single threshold is "moderate" for every
    # map file: sweep down and require fewer filled rows at each step, some strictly between.
    planned = len(p) - 48 - SINKS
    filled = []
    for threshold in LEVERAGE_SWEEP:
        with Server("--ridgefill_maps", MAPS, f"--ridgefill_max_leverage={threshold}",
                    "--enable_prefix_caching=false", name="leverage_some") as srv:
            r = ok(srv, ridgefill_request(p, 48, split))
        filled.append(r.usage.filled_prompt_tokens)
        expect(0 <= filled[-1] <= planned, f"leverage {threshold}: {filled[-1]} of {planned}")
        if 0 < filled[-1] < planned:
            expect(r.timing.estimated_ttft_saved_seconds > 0, f"leverage {threshold}: saved")
    print(f"leverage {list(LEVERAGE_SWEEP)}: filled {filled} of {planned} rows")
    expect(filled == sorted(filled, reverse=True), f"a lower threshold filled more: {filled}")
    expect(any(0 < f < planned for f in filled), f"no threshold promoted only some: {filled}")


def main():
    expect(os.path.exists(MAPS), f"{MAPS} is missing: run `make maps` first")
    checks = Checks("ridgefill serving")
    text = license_text()

    # Without the prefix cache, every batched run below computes its prompt again.
    with Server("--ridgefill_maps", MAPS, "--max_batch_tokens", "256",
                "--enable_prefix_caching=false", name="ridgefill") as srv:
        ids = srv.tokenize(text[:70000], add_special_tokens=True)
        expect(len(ids) > 12400, f"license text gave only {len(ids)} tokens")
        prompts = [ids[:700], ids[3000:3650], ids[6000:6500], ids[9000:9800]]
        prompts_for_leverage = [ids[1000:1600]]
        info = srv.info()
        splits = list(info.ridgefill_split_layers)
        state = {}

        def model_info():
            expect(len(splits) >= 2, f"maps list {splits}")
            expect_eq(info.default_exact_tail_tokens, 1024, "default_exact_tail_tokens")

        def full_tail_is_exact():
            p = prompts[0]
            exact = ok(srv, exact_request(p))
            state["exact0"] = list(exact.token_ids)
            for tail in (len(p), len(p) + 50):
                r = ok(srv, ridgefill_request(p, tail, splits[0]))
                expect_eq(list(r.token_ids), state["exact0"], f"tokens with tail {tail}")
                expect_eq(r.usage.filled_prompt_tokens, 0, "filled_prompt_tokens")
                expect_eq(r.usage.exact_prompt_tokens, len(p), "exact_prompt_tokens")
                expect_eq(r.timing.estimated_ttft_saved_seconds, 0.0, "saved seconds")

        def fills_the_defined_rows():
            p = prompts[1]
            tail = 64
            r = ok(srv, ridgefill_request(p, tail, splits[-1]))
            expect_eq(r.usage.filled_prompt_tokens, len(p) - tail - SINKS, "filled rows")
            expect_eq(r.usage.exact_prompt_tokens, tail + SINKS, "exact rows")
            expect(r.timing.estimated_ttft_saved_seconds > 0,
                   f"estimated saved {r.timing.estimated_ttft_saved_seconds}")
            spans = [(100, 200), (150, 260)]  # overlapping: 160 rows exact
            r2 = ok(srv, ridgefill_request(p, tail, splits[-1], spans))
            expect_eq(r2.usage.filled_prompt_tokens, len(p) - tail - SINKS - 160,
                      "filled rows with exact_spans")
            # The default split is the highest, the default tail --default_exact_tail_tokens.
            req = greedy_request(token_ids=p, max_new_tokens=NEW_TOKENS, ignore_eos=True)
            req.prefill.mode = req.prefill.RIDGEFILL
            r3 = ok(srv, req)
            expect_eq(r3.usage.filled_prompt_tokens, 0, "prompt shorter than the default tail")

        def batched_equals_alone():
            # Alone, one at a time (RidgeFill on two splits, plus exact) ...
            jobs = []
            for i, p in enumerate(prompts):
                jobs.append(("exact", i, exact_request(p)))
                jobs.append((f"rf{splits[0]}", i, ridgefill_request(p, 48, splits[0])))
                jobs.append((f"rf{splits[-1]}", i, ridgefill_request(p, 96, splits[-1])))
            alone = {}
            for kind, i, req in jobs:
                alone[(kind, i)] = list(ok(srv, req).token_ids)
            # RidgeFill must change something somewhere, or this test proves nothing.
            differs = sum(alone[(f"rf{splits[0]}", i)] != alone[("exact", i)]
                          for i in range(len(prompts)))
            expect(differs > 0, "split-layer RidgeFill gave exact tokens on every prompt")
            # ... then all at once: prefill chunks of exact rows and of two splits' filled rows
            # share forward passes.
            results = in_threads([lambda r=r: ok(srv, r) for _, _, r in jobs])
            for (kind, i, _), resp in zip(jobs, results):
                got = list(resp.token_ids)
                same_as = [key for key, want in alone.items() if want == got]
                expect_eq(got, alone[(kind, i)],
                          f"batched {kind} on prompt {i} (same as alone {same_as})")

        def prefix_cache_is_separate():
            with Server("--ridgefill_maps", MAPS, name="prefix_cache") as cached:
                check_prefix_cache(cached, prompts[2], ids[12000:12400], splits[0])

        def bad_parameters():
            p = prompts[0]
            _, code, details = run_unary(srv.stub, ridgefill_request(p, 32, 17))
            expect_eq(code, SC.FAILED_PRECONDITION, "unknown split")
            expect("split_layer 17" in details, details)
            _, code, details = run_unary(srv.stub, ridgefill_request(p, 32, None, [(10, 5000)]))
            expect_eq(code, SC.INVALID_ARGUMENT, "span past the prompt")
            expect("exact_spans[0].end" in details, details)
            _, code, details = run_unary(srv.stub, ridgefill_request(p, -1))
            expect_eq(code, SC.INVALID_ARGUMENT, "negative tail")
            expect("exact_tail_tokens" in details, details)
            # The server still serves.
            expect_eq(list(ok(srv, exact_request(p)).token_ids), state["exact0"], "after errors")

        checks.run("model info lists the maps", model_info)
        checks.run("tail >= prompt is exact", full_tail_is_exact)
        checks.run("fills the defined rows", fills_the_defined_rows)
        checks.run("batched equals alone", batched_equals_alone)
        checks.run("prefix cache kept apart", prefix_cache_is_separate)
        checks.run("bad parameters", bad_parameters)
        checks.run("blocks freed", lambda: srv.wait_idle(srv.stats().kv_cache_blocks_total,
                                                         what="after RidgeFill"))

    checks.run("leverage row selection", check_leverage, prompts_for_leverage[0], 14)

    with Server(name="no_maps") as plain:
        def refused_without_maps():
            _, code, details = run_unary(plain.stub, ridgefill_request(list(range(300, 400)), 16))
            expect_eq(code, SC.FAILED_PRECONDITION, "RIDGEFILL without maps")
            expect("--ridgefill_maps" in details, details)

        checks.run("no maps: FAILED_PRECONDITION", refused_without_maps)

    def truncated_maps_refused():
        with tempfile.TemporaryDirectory() as tmp:
            bad = os.path.join(tmp, "truncated.rfmap")
            shutil.copyfile(MAPS, bad)
            with open(bad, "r+b") as f:
                f.truncate(os.path.getsize(MAPS) // 2)
            proc = subprocess.run([SERVER_BIN, f"--model={MODEL}", f"--ridgefill_maps={bad}",
                                   "--port=0", "--metrics_port=-1"],
                                  capture_output=True, text=True, timeout=120)
            expect(proc.returncode != 0, "server started with a truncated map file")
            lines = [l for l in (proc.stdout + proc.stderr).splitlines() if bad in l]
            expect(len(lines) >= 1, f"no line names the file:\n{proc.stderr[-2000:]}")

    checks.run("truncated map file refused at start", truncated_maps_refused)
    checks.finish()


if __name__ == "__main__":
    main()
