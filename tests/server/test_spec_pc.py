"""SpecPC served per request: the real ridgeserve with the default model and `--draft_model
self:8` (its own first 8 layers as the draft), RidgeFill maps loaded beside it.

Checks, each against the server's own exact path, the request's budget or the client's ledger:
  * SPEC_PC requests report usage.kept_prompt_tokens = their budget (128 of a ~600-token
    prompt; --spec_pc_budget, 256 here, when the request names none; 64 with lookahead 4),
    prompt_tokens the full count, exact_prompt_tokens the kept count and timing.draft_seconds
    > 0; SpecPC changes the tokens of at least one prompt, else the next check proves nothing;
  * batch invariance: those three SPEC_PC, four EXACT and two RIDGEFILL requests sent at once
    (chunked prefill with --max_batch_tokens 512, prefix cache off so every prompt is
    computed; one SPEC_PC and one EXACT as streams) each give the tokens they gave alone;
  * a budget >= the prompt is token-identical to EXACT, keeps every token and runs no draft;
  * bad requests: budget 10 → INVALID_ARGUMENT naming prefill.spec_pc.budget, lookahead 0 and
    65 → INVALID_ARGUMENT naming prefill.spec_pc.lookahead_tokens (a server without a draft
    refusing SPEC_PC is test_validation.py's; SPEC_KV is test_spec_kv.py's);
  * /metrics: requests_total{prefill_mode="spec_pc"}, its TTFT count, the dropped-prompt-token
    counter and the draft-time and TTFT-saved histograms grew by exactly what the responses
    say; budgets >= the prompt counted as exact;
  * afterwards every KV block is free again;
  * bad --draft_model values (self:0, a missing file) and --draft_model with
    --tensor_parallel 2 stop the server at start with exit code 2 and one line naming the flag."""

import os
import subprocess

from rs_testlib import (MAPS, MODEL, SC, SERVER_BIN, Checks, Server, expect, expect_eq,
                        greedy_request, in_threads, license_text, run_ok, run_stream_ok,
                        run_unary, scrape_metrics)

NEW_TOKENS = 8
DRAFT = "self:8"
DEFAULT_BUDGET = 256


def spec_pc_request(token_ids, budget=None, lookahead=None):
    req = greedy_request(token_ids=token_ids, max_new_tokens=NEW_TOKENS, ignore_eos=True)
    req.prefill.mode = req.prefill.SPEC_PC
    if budget is not None:
        req.prefill.spec_pc.budget = budget
    if lookahead is not None:
        req.prefill.spec_pc.lookahead_tokens = lookahead
    return req


def exact_request(token_ids):
    return greedy_request(token_ids=token_ids, max_new_tokens=NEW_TOKENS, ignore_eos=True)


def ridgefill_request(token_ids, tail):
    req = exact_request(token_ids)
    req.prefill.mode = req.prefill.RIDGEFILL
    req.prefill.ridgefill.exact_tail_tokens = tail
    return req


class Ledger:
    """What the responses say the metrics must have grown by (filled on the main thread)."""

    def __init__(self):
        self.spec_pc = 0  # requests run with SpecPC (budget < prompt), all finish LENGTH
        self.spec_pc_exact = 0  # SPEC_PC requests whose budget covered the prompt
        self.exact = 0  # EXACT requests
        self.dropped = 0
        self.draft_seconds = 0.0

    def add(self, resp, budget_covers_prompt=False):
        if budget_covers_prompt:
            self.spec_pc_exact += 1
            return
        self.spec_pc += 1
        self.dropped += resp.usage.prompt_tokens - resp.usage.kept_prompt_tokens
        self.draft_seconds += resp.timing.draft_seconds


def check_startup_errors():
    for args, named in ((["--draft_model=self:0"], "self:0"),
                        (["--draft_model=/nonexistent/draft.gguf"], "/nonexistent/draft.gguf"),
                        (["--draft_model=self:8", "--tensor_parallel=2"], "--tensor_parallel")):
        p = subprocess.run([SERVER_BIN, f"--model={MODEL}", "--port=0", "--metrics_port=-1",
                            "--threads=2", *args], capture_output=True, text=True, timeout=120)
        out = p.stdout + p.stderr
        expect_eq(p.returncode, 2, f"exit code with {args}: {out[-800:]}")
        errors = [line for line in out.splitlines() if "[error]" in line]
        expect_eq(len(errors), 1, f"error lines with {args}: {errors}")
        expect("--draft_model" in errors[0] and named in errors[0],
               f"{args}: error line does not name the flag and value: {errors[0]}")
        print(f"    {args}: {errors[0].split('[error] ', 1)[-1]}")


def main():
    expect(os.path.exists(MAPS), f"{MAPS} is missing: run `make maps` first")
    checks = Checks("spec_pc serving")
    text = license_text()
    ledger = Ledger()

    with Server("--draft_model", DRAFT, f"--spec_pc_budget={DEFAULT_BUDGET}",
                "--ridgefill_maps", MAPS, "--max_batch_tokens", "512",
                "--enable_prefix_caching=false", name="spec_pc") as srv:
        ids = srv.tokenize(text[:40000], add_special_tokens=True)
        expect(len(ids) > 6500, f"license text gave only {len(ids)} tokens")
        prompts = [ids[:600], ids[2000:2400], ids[4000:4400], ids[6000:6300]]
        before = scrape_metrics(srv)
        # (kind, prompt, request, sent as a stream); the first is the ~600-token budget-128 one.
        jobs = [("spec_pc 128", 0, spec_pc_request(prompts[0], 128), True),
                ("spec_pc default", 1, spec_pc_request(prompts[1]), False),
                ("spec_pc 64 lookahead 4", 2, spec_pc_request(prompts[2], 64, 4), False)]
        jobs += [("exact", i, exact_request(p), i == 3) for i, p in enumerate(prompts)]
        jobs += [("ridgefill", 3, ridgefill_request(prompts[3], 48), False),
                 ("ridgefill", 1, ridgefill_request(prompts[1], 96), False)]
        kept = {0: 128, 1: DEFAULT_BUDGET, 2: 64}  # by prompt, for the spec_pc jobs
        alone = {}
        finals = {}

        def run(req, stream):
            if stream:
                r = run_stream_ok(srv.stub, req)
                return r.token_ids, r.final
            resp = run_ok(srv.stub, req)
            return list(resp.token_ids), resp

        def record(kind, i, tokens, final):
            ledger.exact += kind == "exact"
            if kind.startswith("spec_pc"):
                ledger.add(final)
                expect_eq(final.usage.kept_prompt_tokens, kept[i], f"{kind}: kept")
                expect_eq(final.usage.prompt_tokens, len(prompts[i]), f"{kind}: prompt_tokens")
                expect_eq(final.usage.exact_prompt_tokens, kept[i], f"{kind}: exact rows")
                expect(final.timing.draft_seconds > 0,
                       f"{kind}: draft_seconds {final.timing.draft_seconds}")
            expect_eq(len(tokens), NEW_TOKENS, f"{kind}: completion tokens")

        def alone_kept_tokens_and_draft_time():
            for kind, i, req, stream in jobs:
                tokens, final = run(req, stream)
                record(kind, i, tokens, final)
                alone[(kind, i)] = tokens
                finals[(kind, i)] = final
            f = finals[jobs[0][:2]]
            print(f"    kept 128 of {len(prompts[0])}: draft {f.timing.draft_seconds:.3f} s, "
                  f"ttft {f.timing.ttft_seconds:.3f} s (exact "
                  f"{finals[('exact', 0)].timing.ttft_seconds:.3f} s), estimated saved "
                  f"{f.timing.estimated_ttft_saved_seconds:.3f} s")
            differs = [i for i in range(3) if alone[(jobs[i][0], i)] != alone[("exact", i)]]
            expect(differs, "SpecPC gave the exact tokens on every prompt: nothing is tested")
            print(f"    SpecPC tokens differ from exact on prompts {differs}")

        def batched_equals_alone():
            expect(alone, "no tokens from the requests alone")
            results = in_threads([lambda j=j: run(j[2], j[3]) for j in jobs])
            for (kind, i, _, _), (tokens, final) in zip(jobs, results):
                record(kind, i, tokens, final)
                same_as = [key for key, want in alone.items() if want == tokens]
                expect_eq(tokens, alone[(kind, i)],
                          f"batched {kind} on prompt {i} (same as alone {same_as})")

        def budget_over_prompt_is_exact():
            p = prompts[3]
            exact = alone.get(("exact", 3))
            expect(exact, "no exact tokens for the prompt")
            for budget in (len(p), 1024):
                r = run_ok(srv.stub, spec_pc_request(p, budget))
                ledger.add(r, budget_covers_prompt=True)
                expect_eq(list(r.token_ids), exact, f"tokens with budget {budget}")
                expect_eq(r.usage.kept_prompt_tokens, len(p), f"kept with budget {budget}")
                expect_eq(r.usage.exact_prompt_tokens, len(p), f"exact rows, budget {budget}")
                expect_eq(r.timing.draft_seconds, 0.0, f"draft ran with budget {budget}")
                expect_eq(r.timing.estimated_ttft_saved_seconds, 0.0, f"saved, budget {budget}")

        def bad_requests():
            p = prompts[3]
            for req, code, field in (
                    (spec_pc_request(p, 10), SC.INVALID_ARGUMENT, "prefill.spec_pc.budget"),
                    (spec_pc_request(p, 128, 0), SC.INVALID_ARGUMENT,
                     "prefill.spec_pc.lookahead_tokens"),
                    (spec_pc_request(p, 128, 65), SC.INVALID_ARGUMENT,
                     "prefill.spec_pc.lookahead_tokens")):
                _, got, details = run_unary(srv.stub, req)
                expect_eq(got, code, f"{field}: code ({details})")
                expect(field in details, f"{field} not named in {details!r}")

        def metrics():
            after = scrape_metrics(srv)

            def grew(series):
                return after.get(series, 0) - before.get(series, 0)

            expect_eq(grew('ridgeserve_requests_total{finish_reason="length",'
                           'prefill_mode="spec_pc"}'), ledger.spec_pc, "spec_pc requests")
            expect_eq(grew('ridgeserve_time_to_first_token_seconds_count{prefill_mode="spec_pc"}'),
                      ledger.spec_pc, "spec_pc TTFT count")
            expect_eq(grew("ridgeserve_spec_pc_dropped_prompt_tokens_total"), ledger.dropped,
                      "dropped prompt tokens")
            expect_eq(grew("ridgeserve_spec_pc_draft_seconds_count"), ledger.spec_pc,
                      "draft seconds count")
            got = grew("ridgeserve_spec_pc_draft_seconds_sum")
            expect(abs(got - ledger.draft_seconds) < 1e-6 * max(1.0, ledger.draft_seconds),
                   f"draft seconds sum {got}, responses say {ledger.draft_seconds}")
            expect_eq(grew("ridgeserve_spec_pc_ttft_saved_seconds_count"), ledger.spec_pc,
                      "TTFT saved count")
            # Budgets covering the prompt ran exactly and are counted so (the RIDGEFILL
            # requests all fill rows: prefill_mode ridgefill).
            expect_eq(grew('ridgeserve_requests_total{finish_reason="length",'
                           'prefill_mode="exact"}'), ledger.exact + ledger.spec_pc_exact,
                      f"exact requests ({ledger.exact} EXACT, {ledger.spec_pc_exact} SPEC_PC "
                      f"with a budget over the prompt)")
            print(f"    {ledger.spec_pc} spec_pc requests, {ledger.dropped} tokens dropped")

        checks.run("alone: kept tokens and draft time", alone_kept_tokens_and_draft_time)
        checks.run("batched equals alone", batched_equals_alone)
        checks.run("budget >= prompt is exact", budget_over_prompt_is_exact)
        checks.run("bad requests", bad_requests)
        checks.run("metrics", metrics)
        checks.run("blocks freed", lambda: srv.wait_idle(srv.stats().kv_cache_blocks_total,
                                                         what="after SpecPC"))

    checks.run("bad --draft_model stops the start", check_startup_errors)
    checks.finish()


if __name__ == "__main__":
    main()
