"""Continuous batching keeps every request's greedy output unchanged (batch invariance).

Starts the real ridgeserve on loopback and checks:
  * 32 requests (prompts of 5..400 tokens of real license text, as text, token ids and chat,
    some non-ASCII; max_new_tokens 4..32; a group sharing a ~250-token prefix) run one at a
    time with unary Generate give the baselines;
  * the same 32 sent at once as GenerateStream all complete, the server really batched them
    (num_requests_running seen well above 1), and each stream is token-identical to its
    baseline: deltas concatenated == unary text, ids == unary ids, same finish reason/usage;
  * the shared-prefix group hit the prefix cache (usage.cached_prompt_tokens and
    stats.num_prefix_cache_hit_tokens), and still matches;
  * an independent run of a few prompts through the offline `ridgeserve-eval generate` (no
    server, no scheduler, no prefix cache) gives the same text and ids;
  * afterwards every KV block is free again.
"""

import json
import os
import random
import subprocess
import threading
import time

from rs_testlib import (EVAL_BIN, MODEL, SC, Checks, FinishReason, Server, consume_stream, expect,
                        expect_eq, finish_name, greedy_request, in_threads, license_text,
                        run_unary)



def build_requests(server, text):
    """32 (name, request kwargs, eval args or None) with mixed lengths and kinds."""
    rng = random.Random(20261129)
    corpus_ids = server.tokenize(text[:60000])
    expect(len(corpus_ids) > 9000, f"corpus tokenized to only {len(corpus_ids)} tokens")
    reqs = []

    # Token-id prompts of exact lengths spread over 5..400.
    id_lengths = [5, 9, 17, 33, 64, 100, 150, 210, 280, 400, 7, 48, 120, 333, 12, 75]
    for i, n in enumerate(id_lengths):
        start = rng.randrange(0, len(corpus_ids) - n)
        reqs.append((f"ids{n}", dict(token_ids=corpus_ids[start:start + n],
                                     max_new_tokens=rng.randint(4, 32)), None))

    # Text prompts cut by characters (~4.6 chars/token): roughly 6..400 tokens.
    for n_chars in [25, 90, 300, 700, 1200, 1800]:
        start = rng.randrange(0, len(text) - n_chars)
        reqs.append((f"text{n_chars}", dict(text=text[start:start + n_chars],
                                            max_new_tokens=rng.randint(4, 32)), None))

    # Shared prefix (~250 tokens), distinct suffixes: prefix-cache hits under batching.
    prefix = text[5000:6150]
    suffixes = ["\nIn short, this means", "\nSummary of the section above:",
                "\nQuestion: who may copy the program?\nAnswer:", "\nThe key word here is",
                "\nTranslate the first sentence into plain English:",
                "\nList three obligations of the licensee:\n1."]
    for i, suffix in enumerate(suffixes):
        kw = dict(text=prefix + suffix, max_new_tokens=[12, 20, 32, 8, 24, 16][i])
        reqs.append((f"prefix{i}", kw, ["--prompt", kw["text"]] if i == 1 else None))

    # Non-ASCII prompts: the streamed deltas must never split a UTF-8 character.
    reqs.append(("utf8_fr", dict(text="Écris une phrase en français sur le café, la crème "
                                      "brûlée et les élèves:", max_new_tokens=24), None))
    cjk = "日本の首都は東京です。中国の首都は 🙂🚀 "
    reqs.append(("utf8_emoji", dict(text=cjk, max_new_tokens=20), ["--prompt", cjk]))
    reqs.append(("utf8_mixed", dict(text="Ünïcödé — “quotes” and emoji 🎉: ",
                                    max_new_tokens=16), None))

    # Chat (template applied by the server); greedy SmolLM2 answers with Paris and stops.
    question = "What is the capital of France?"
    reqs.append(("chat", dict(chat=[("user", question)], max_new_tokens=32),
                 ["--chat", "--prompt", question]))

    expect_eq(len(reqs), 32, "number of requests")
    return reqs


def compare(name, got_ids, got_text, got_final, want):
    expect_eq(got_ids, list(want.token_ids), f"{name}: token ids vs alone")
    expect_eq(got_text, want.text, f"{name}: text vs alone")
    expect_eq(finish_name(got_final.finish_reason), finish_name(want.finish_reason),
              f"{name}: finish_reason vs alone")
    expect_eq(got_final.usage.prompt_tokens, want.usage.prompt_tokens, f"{name}: prompt_tokens")
    expect_eq(got_final.usage.completion_tokens, want.usage.completion_tokens,
              f"{name}: completion_tokens")


SERVER_FLAGS = ("--max_running_requests=64", "--max_batch_tokens=512")


def run_batch(srv, reqs, baselines, label):
    """All requests at once as streams on `srv`; each must equal its baseline."""
    expect(len(baselines) == 32, "no baselines")
    max_running = [0]
    stop_poll = threading.Event()

    def poll():
        while not stop_poll.is_set():
            try:
                max_running[0] = max(max_running[0], srv.stats().num_requests_running)
            except Exception:  # noqa: BLE001 — polling only
                pass
            time.sleep(0.05)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    t0 = time.monotonic()
    try:
        results = in_threads([
            (lambda kw=kw: consume_stream(srv.stub.GenerateStream(greedy_request(**kw),
                                                                  timeout=600)))
            for _, kw, _ in reqs])
    finally:
        stop_poll.set()
        poller.join()
    print(f"{label}: 32 streams in {time.monotonic() - t0:.1f} s; max num_requests_running "
          f"{max_running[0]}")
    bad = []
    for (name, _, _), r in zip(reqs, results):
        try:
            expect(r.code == SC.OK, f"{name}: stream failed: {r.describe()}")
            expect(r.final is not None, f"{name}: no final message")
            expect_eq(r.messages_after_final, 0, f"{name}: messages after the final one")
            compare(name, r.token_ids, r.text, r.final, baselines[name])
        except AssertionError as e:
            bad.append(str(e))
    expect(not bad, f"{len(bad)} of 32 differ from alone:\n  " + "\n  ".join(bad))
    expect(max_running[0] >= 8,
           f"requests were not batched: max num_requests_running {max_running[0]}")


def main():
    checks = Checks("test_batching")
    text = license_text()
    baselines = {}
    hits = []
    reqs = []

    # Baselines on their own server, one request at a time (the shared-prefix group hits the
    # prefix cache here, one after another).
    with Server(*SERVER_FLAGS, name="alone") as srv:
        reqs.extend(build_requests(srv, text))

        def alone():
            hits0 = srv.stats().num_prefix_cache_hit_tokens
            for name, kw, _ in reqs:
                resp, code, details = run_unary(srv.stub, greedy_request(**kw))
                expect(code == SC.OK, f"{name}: alone Generate failed: {code.name} {details}")
                expect(resp.finish_reason in (FinishReason.STOP, FinishReason.LENGTH),
                       f"{name}: alone finish_reason {finish_name(resp.finish_reason)}")
                expect_eq(resp.usage.completion_tokens, len(resp.token_ids),
                          f"{name}: usage.completion_tokens vs ids")
                if resp.finish_reason == FinishReason.LENGTH:
                    expect_eq(len(resp.token_ids), kw["max_new_tokens"], f"{name}: LENGTH ids")
                baselines[name] = resp
            hits.append(srv.stats().num_prefix_cache_hit_tokens - hits0)

        checks.run("32 requests alone (baselines, unary)", alone)

        def prefix_cache():
            expect(hits and len(baselines) == 32, "no baselines")
            cached = {n: baselines[n].usage.cached_prompt_tokens for n in baselines
                      if n.startswith("prefix")}
            print(f"alone: prefix-cache hit tokens {hits[0]}; cached_prompt_tokens {cached}")
            # prefix1..5 follow prefix0 with the same ~250-token prefix: >= 12 full blocks each.
            expect(hits[0] >= 5 * 192, f"prefix cache hit only {hits[0]} tokens for the shared "
                                       "prefix (stats.num_prefix_cache_hit_tokens)")
            expect(all(cached[f"prefix{i}"] >= 192 for i in range(1, 6)),
                   f"usage.cached_prompt_tokens too small: {cached}")

        checks.run("shared prefix hits the prefix cache", prefix_cache)

        def utf8_outputs():
            # Otherwise "deltas never split a character" would be checked on ASCII only.
            texts = {n: baselines[n].text for n in ("utf8_fr", "utf8_emoji") if n in baselines}
            print(f"non-ASCII outputs: {texts}")
            expect(len(texts) == 2 and all(not t.isascii() for t in texts.values()),
                   f"expected multi-byte characters in the outputs: {texts}")

        checks.run("non-ASCII outputs to stream", utf8_outputs)

    # The batch on a fresh server: an empty prefix cache, so every prompt is prefilled in
    # chunks (--max_batch_tokens 512) next to the decodes of the others.
    with Server(*SERVER_FLAGS, name="batch") as srv:
        idle = srv.stats()
        expect_eq(idle.kv_cache_blocks_free, idle.kv_cache_blocks_total, "free blocks at idle")
        checks.run("32 concurrent streams == alone (cold cache, chunked prefill)", run_batch, srv,
                   reqs, baselines, "cold")
        checks.run("KV blocks all free after", srv.wait_idle, idle.kv_cache_blocks_free, 30,
                   "after batching")
        # Again: now every prompt's full blocks come from the prefix cache.
        checks.run("32 concurrent streams == alone (warm prefix cache)", run_batch, srv, reqs,
                   baselines, "warm")
        checks.run("KV blocks all free after the second batch", srv.wait_idle,
                   idle.kv_cache_blocks_free, 30, "after the second batch")

    def offline_reference():
        expect(os.path.exists(EVAL_BIN), f"{EVAL_BIN} not built")
        for name, kw, eval_args in reqs:
            if eval_args is None:
                continue
            out = subprocess.run(
                [EVAL_BIN, "generate", f"--model={MODEL}", "--threads=2", "--temperature=0",
                 f"--max_new_tokens={kw['max_new_tokens']}", *eval_args],
                capture_output=True, text=True, timeout=300)
            expect(out.returncode == 0, f"{name}: ridgeserve-eval failed: {out.stderr[-500:]}")
            ref = json.loads(out.stdout.strip().splitlines()[-1])
            want = baselines[name]
            expect_eq(ref["prompt_tokens"], want.usage.prompt_tokens,
                      f"{name}: prompt tokens, server vs ridgeserve-eval")
            ids = list(want.token_ids)
            # The offline tool leaves the end-of-generation token out of its ids.
            if want.finish_reason == FinishReason.STOP and len(ids) == len(ref["token_ids"]) + 1:
                ids = ids[:-1]
            expect_eq(ids, ref["token_ids"], f"{name}: ids, server vs ridgeserve-eval")
            expect_eq(want.text, ref["text"], f"{name}: text, server vs ridgeserve-eval")

    checks.run("server == offline ridgeserve-eval (independent path)", offline_reference)
    checks.finish()


if __name__ == "__main__":
    main()
