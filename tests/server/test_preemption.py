"""Preemption by recompute keeps greedy outputs unchanged.

The server gets a KV cache far too small for 32 requests at once (--kv_cache_tokens 1024 = 64
blocks of 16; each request here needs up to ~14 blocks) and a small step budget
(--max_batch_tokens 256). Checks:
  * each of 32 requests run alone (unary, one after another) gives a baseline;
  * all 32 sent at once as streams complete, token-identical to their baselines;
  * GetModelInfo stats.num_preemptions grew (the cache really ran out), and afterwards every
    KV block is free.
"""

import random
import time

from rs_testlib import (SC, Checks, FinishReason, Server, consume_stream, expect, expect_eq,
                        finish_name, greedy_request, in_threads, license_text, run_unary)


def main():
    checks = Checks("test_preemption")
    text = license_text()
    with Server("--kv_cache_tokens=1024", "--max_batch_tokens=256", "--max_running_requests=64",
                name="preemption") as srv:
        idle = srv.stats()
        expect_eq(idle.kv_cache_blocks_free, idle.kv_cache_blocks_total, "free blocks at idle")
        print(f"KV: {idle.kv_cache_blocks_total} blocks of {idle.kv_cache_block_size}")
        expect(idle.kv_cache_blocks_total * idle.kv_cache_block_size <= 1024 + 16,
               f"--kv_cache_tokens 1024 gave {idle.kv_cache_blocks_total} blocks")

        rng = random.Random(7)
        corpus = srv.tokenize(text[20000:50000])
        reqs = []
        for i in range(32):
            n = rng.randint(16, 160)
            start = rng.randrange(0, len(corpus) - n)
            # ignore_eos: every request decodes its full length, so KV demand keeps growing;
            # 2-4 block boundaries per decode make running out of blocks a certainty rather than
            # a matter of timing (admission fills the cache with prompts first).
            reqs.append((f"r{i}_p{n}", dict(token_ids=corpus[start:start + n],
                                            max_new_tokens=rng.randint(32, 64), ignore_eos=True)))
        baselines = {}

        def alone():
            for name, kw in reqs:
                resp, code, details = run_unary(srv.stub, greedy_request(**kw))
                expect(code == SC.OK, f"{name}: alone Generate failed: {code.name} {details}")
                expect_eq(finish_name(resp.finish_reason), "LENGTH", f"{name}: finish_reason")
                expect_eq(len(resp.token_ids), kw["max_new_tokens"], f"{name}: completion ids")
                baselines[name] = resp

        checks.run("32 requests alone (baselines)", alone)

        def batched():
            expect(len(baselines) == 32, "no baselines")
            p0 = srv.stats().num_preemptions
            t0 = time.monotonic()
            results = in_threads([
                (lambda kw=kw: consume_stream(srv.stub.GenerateStream(greedy_request(**kw),
                                                                      timeout=600)))
                for _, kw in reqs])
            preemptions = srv.stats().num_preemptions - p0
            print(f"32 streams in {time.monotonic() - t0:.1f} s; preemptions {preemptions}")
            bad = []
            for (name, _), r in zip(reqs, results):
                want = baselines[name]
                if r.code != SC.OK or r.final is None:
                    bad.append(f"{name}: {r.describe()}")
                elif r.token_ids != list(want.token_ids) or r.text != want.text:
                    first = next((i for i, (a, b) in enumerate(zip(r.token_ids, want.token_ids))
                                  if a != b), min(len(r.token_ids), len(want.token_ids)))
                    bad.append(f"{name}: differs from alone at token {first}: "
                               f"{r.text!r} vs {want.text!r}")
                elif r.final.finish_reason != FinishReason.LENGTH:
                    bad.append(f"{name}: finish {finish_name(r.final.finish_reason)}")
            expect(not bad, f"{len(bad)} of 32 wrong:\n  " + "\n  ".join(bad))
            expect(preemptions > 0, "no preemption happened with a 64-block KV cache "
                                    "(stats.num_preemptions unchanged)")

        checks.run("32 concurrent streams with preemption == alone", batched)
        checks.run("KV blocks all free after", srv.wait_idle, idle.kv_cache_blocks_free, 30,
                   "after preemption run")
    checks.finish()


if __name__ == "__main__":
    main()
