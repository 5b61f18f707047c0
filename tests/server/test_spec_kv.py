"""SpecKV served per request: the real ridgeserve with the default model and `--draft_model
self:8` (its own first 8 layers as the draft).

Checks, each against the server's own exact path, the request's budget or the client's ledger:
  * SPEC_KV requests report usage.kept_kv_tokens = their budget (128 of a ~600-token prompt;
    --spec_kv_budget, 192 here, when the request names none), prompt_tokens and
    kept_prompt_tokens the full count (SpecKV prefills the whole prompt and drops KV after it),
    timing.draft_seconds > 0 and no estimated TTFT saved; budget 128 changes the 600-token
    prompt's tokens, else the next check proves nothing about the kept entries;
  * batch invariance: those two SPEC_KV requests, three EXACT and two SPEC_PC ones sent at once
    (chunked prefill with --max_batch_tokens 512, prefix cache off so every prompt is computed;
    one SPEC_KV and one EXACT as streams) each give the tokens they gave alone;
  * a budget >= the prompt is token-identical to EXACT, keeps every entry and runs no draft;
  * bad requests: budget 20 → INVALID_ARGUMENT naming prefill.spec_kv.budget, lookahead 0 and
    65 → INVALID_ARGUMENT naming prefill.spec_kv.lookahead_tokens (a server without a draft
    refusing SPEC_KV is test_validation.py's);
  * /metrics: requests_total{prefill_mode="spec_kv"}, its TTFT count, the kept- and
    dropped-KV-entry counters and the draft-time histogram grew by exactly what the responses
    say; budgets >= the prompt counted as exact;
  * afterwards every KV block is free again;
  * --spec_kv_budget 32 and --spec_kv_lookahead_tokens 65 stop the server at start with exit
    code 2 and one line naming the flag."""

import subprocess

from rs_testlib import (MODEL, SC, SERVER_BIN, Checks, Server, expect, expect_eq, greedy_request,
                        in_threads, license_text, run_ok, run_stream_ok, run_unary,
                        scrape_metrics)

# Also the SpecKV lookahead: min(--spec_kv_lookahead_tokens, max_new_tokens) draft tokens.
NEW_TOKENS = 16
DRAFT = "self:8"
DEFAULT_BUDGET = 192


def spec_kv_request(token_ids, budget=None, lookahead=None):
    req = greedy_request(token_ids=token_ids, max_new_tokens=NEW_TOKENS, ignore_eos=True)
    req.prefill.mode = req.prefill.SPEC_KV
    if budget is not None:
        req.prefill.spec_kv.budget = budget
    if lookahead is not None:
        req.prefill.spec_kv.lookahead_tokens = lookahead
    return req


def spec_pc_request(token_ids, budget):
    req = greedy_request(token_ids=token_ids, max_new_tokens=NEW_TOKENS, ignore_eos=True)
    req.prefill.mode = req.prefill.SPEC_PC
    req.prefill.spec_pc.budget = budget
    return req


def exact_request(token_ids):
    return greedy_request(token_ids=token_ids, max_new_tokens=NEW_TOKENS, ignore_eos=True)


class Ledger:
    """What the responses say the metrics must have grown by (filled on the main thread)."""

    def __init__(self):
        self.spec_kv = 0  # requests run with SpecKV (budget < prompt), all finish LENGTH
        self.exact = 0  # requests run exactly: EXACT ones and SPEC_KV with a budget over the prompt
        self.spec_pc = 0
        self.kept = 0
        self.dropped = 0
        self.draft_seconds = 0.0

    def add(self, kind, resp):
        if kind == "exact":
            self.exact += 1
        elif kind == "spec_pc":
            self.spec_pc += 1
        elif kind == "spec_kv":
            self.spec_kv += 1
            self.kept += resp.usage.kept_kv_tokens
            self.dropped += resp.usage.prompt_tokens - resp.usage.kept_kv_tokens
            self.draft_seconds += resp.timing.draft_seconds


def check_startup_errors():
    for args, flag in ((["--spec_kv_budget=32"], "--spec_kv_budget"),
                       (["--spec_kv_lookahead_tokens=65"], "--spec_kv_lookahead_tokens")):
        p = subprocess.run([SERVER_BIN, f"--model={MODEL}", "--port=0", "--metrics_port=-1",
                            "--threads=2", f"--draft_model={DRAFT}", *args],
                           capture_output=True, text=True, timeout=120)
        out = p.stdout + p.stderr
        expect_eq(p.returncode, 2, f"exit code with {args}: {out[-800:]}")
        errors = [line for line in out.splitlines() if "[error]" in line]
        expect_eq(len(errors), 1, f"error lines with {args}: {errors}")
        expect(flag in errors[0], f"{args}: error line does not name {flag}: {errors[0]}")
        print(f"    {args}: {errors[0].split('[error] ', 1)[-1]}")


def main():
    checks = Checks("spec_kv serving")
    text = license_text()
    ledger = Ledger()

    with Server("--draft_model", DRAFT, f"--spec_kv_budget={DEFAULT_BUDGET}",
                "--max_batch_tokens", "512", "--enable_prefix_caching=false",
                name="spec_kv") as srv:
        ids = srv.tokenize(text[:30000], add_special_tokens=True)
        expect(len(ids) > 5000, f"license text gave only {len(ids)} tokens")
        prompts = [ids[:600], ids[1500:1900], ids[2500:2800], ids[3500:3800], ids[4500:4800]]
        before = scrape_metrics(srv)
        # (kind, label, prompt, request, sent as a stream); the first is the ~600-token
        # budget-128 one.
        jobs = [("spec_kv", "spec_kv 128", 0, spec_kv_request(prompts[0], 128), True),
                ("spec_kv", "spec_kv default", 1, spec_kv_request(prompts[1]), False)]
        jobs += [("exact", "exact", i, exact_request(prompts[i]), i == 2) for i in (0, 2, 3)]
        jobs += [("spec_pc", "spec_pc 128", 4, spec_pc_request(prompts[4], 128), False),
                 ("spec_pc", "spec_pc 96", 1, spec_pc_request(prompts[1], 96), False)]
        kept = {0: 128, 1: DEFAULT_BUDGET}  # by prompt, for the spec_kv jobs
        alone = {}
        finals = {}

        def run(req, stream):
            if stream:
                r = run_stream_ok(srv.stub, req)
                return r.token_ids, r.final
            resp = run_ok(srv.stub, req)
            return list(resp.token_ids), resp

        def record(kind, label, i, tokens, final):
            ledger.add(kind, final)
            if kind == "spec_kv":
                expect_eq(final.usage.kept_kv_tokens, kept[i], f"{label}: kept KV entries")
                expect_eq(final.usage.prompt_tokens, len(prompts[i]), f"{label}: prompt_tokens")
                expect_eq(final.usage.kept_prompt_tokens, len(prompts[i]),
                          f"{label}: kept prompt tokens")
                expect_eq(final.usage.exact_prompt_tokens, len(prompts[i]),
                          f"{label}: exact rows")
                expect(final.timing.draft_seconds > 0,
                       f"{label}: draft_seconds {final.timing.draft_seconds}")
                expect_eq(final.timing.estimated_ttft_saved_seconds, 0.0, f"{label}: saved")
            elif kind == "exact":
                expect_eq(final.usage.kept_kv_tokens, len(prompts[i]), f"{label}: kept KV")
            expect_eq(len(tokens), NEW_TOKENS, f"{label}: completion tokens")

        def alone_kept_entries_and_draft_time():
            for kind, label, i, req, stream in jobs:
                tokens, final = run(req, stream)
                record(kind, label, i, tokens, final)
                alone[(label, i)] = tokens
                finals[(label, i)] = final
            f = finals[("spec_kv 128", 0)]
            e = finals[("exact", 0)]
            print(f"    kept 128 of {len(prompts[0])} KV entries: draft "
                  f"{f.timing.draft_seconds:.3f} s, ttft {f.timing.ttft_seconds:.3f} s (exact "
                  f"{e.timing.ttft_seconds:.3f} s), e2e {f.timing.e2e_seconds:.3f} s (exact "
                  f"{e.timing.e2e_seconds:.3f} s)")
            expect(alone[("spec_kv 128", 0)] != alone[("exact", 0)],
                   "SpecKV 128 gave the exact tokens on the 600-token prompt: the batched check "
                   "proves nothing about the kept entries")

        def batched_equals_alone():
            expect(alone, "no tokens from the requests alone")
            results = in_threads([lambda j=j: run(j[3], j[4]) for j in jobs])
            for (kind, label, i, _, _), (tokens, final) in zip(jobs, results):
                record(kind, label, i, tokens, final)
                same_as = [key for key, want in alone.items() if want == tokens]
                expect_eq(tokens, alone[(label, i)],
                          f"batched {label} on prompt {i} (same as alone {same_as})")

        def budget_over_prompt_is_exact():
            p = prompts[3]
            exact = alone.get(("exact", 3))
            expect(exact, "no exact tokens for the prompt")
            for budget in (len(p), 1024):
                r = run_ok(srv.stub, spec_kv_request(p, budget))
                ledger.add("exact", r)
                expect_eq(list(r.token_ids), exact, f"tokens with budget {budget}")
                expect_eq(r.usage.kept_kv_tokens, len(p), f"kept with budget {budget}")
                expect_eq(r.timing.draft_seconds, 0.0, f"draft ran with budget {budget}")

        def bad_requests():
            p = prompts[3]
            for req, field in (
                    (spec_kv_request(p, 20), "prefill.spec_kv.budget"),
                    (spec_kv_request(p, 128, 0), "prefill.spec_kv.lookahead_tokens"),
                    (spec_kv_request(p, 128, 65), "prefill.spec_kv.lookahead_tokens")):
                _, got, details = run_unary(srv.stub, req)
                expect_eq(got, SC.INVALID_ARGUMENT, f"{field}: code ({details})")
                expect(field in details, f"{field} not named in {details!r}")

        def metrics():
            after = scrape_metrics(srv)

            def grew(series):
                return after.get(series, 0) - before.get(series, 0)

            for mode, n in (("spec_kv", ledger.spec_kv), ("exact", ledger.exact),
                            ("spec_pc", ledger.spec_pc)):
                expect_eq(grew(f'ridgeserve_requests_total{{finish_reason="length",'
                               f'prefill_mode="{mode}"}}'), n, f"{mode} requests")
            expect_eq(grew('ridgeserve_time_to_first_token_seconds_count{prefill_mode="spec_kv"}'),
                      ledger.spec_kv, "spec_kv TTFT count")
            expect_eq(grew("ridgeserve_spec_kv_kept_kv_tokens_total"), ledger.kept,
                      "kept KV entries")
            expect_eq(grew("ridgeserve_spec_kv_dropped_kv_tokens_total"), ledger.dropped,
                      "dropped KV entries")
            expect_eq(grew("ridgeserve_spec_kv_draft_seconds_count"), ledger.spec_kv,
                      "draft seconds count")
            got = grew("ridgeserve_spec_kv_draft_seconds_sum")
            expect(abs(got - ledger.draft_seconds) < 1e-6 * max(1.0, ledger.draft_seconds),
                   f"draft seconds sum {got}, responses say {ledger.draft_seconds}")
            print(f"    {ledger.spec_kv} spec_kv requests: {ledger.kept} KV entries per layer and "
                  f"head kept, {ledger.dropped} dropped")

        checks.run("alone: kept KV entries and draft time", alone_kept_entries_and_draft_time)
        checks.run("batched equals alone", batched_equals_alone)
        checks.run("budget >= prompt is exact", budget_over_prompt_is_exact)
        checks.run("bad requests", bad_requests)
        checks.run("metrics", metrics)
        checks.run("blocks freed", lambda: srv.wait_idle(srv.stats().kv_cache_blocks_total,
                                                         what="after SpecKV"))

    checks.run("bad SpecKV flags stop the start", check_startup_errors)
    checks.finish()


if __name__ == "__main__":
    main()
