"""A full waiting queue answers RESOURCE_EXHAUSTED; what was admitted still finishes.

Server: --max_running_requests 1 --max_queued_requests 2. Twelve requests (half unary, half
streams) arrive at once, each decoding 24 tokens (ignore_eos), so at most 1 runs and 2 wait.
Checks:
  * every call ends either OK or RESOURCE_EXHAUSTED (nothing else), at least one of each, and
    at least 2 OK (the queue's capacity; a third when one already runs);
  * every admitted request's output equals its alone baseline;
  * stats never showed more than 1 running or 2 waiting;
  * afterwards the queue is empty, every KV block free, and a normal request is served.
"""

import threading
import time

from rs_testlib import (SC, Checks, FinishReason, Server, consume_stream, expect, expect_eq,
                        greedy_request, in_threads, license_text, run_unary)

N = 12


def main():
    checks = Checks("test_queue_overflow")
    text = license_text()
    with Server("--max_running_requests=1", "--max_queued_requests=2", name="queue") as srv:
        idle = srv.stats()
        free0 = idle.kv_cache_blocks_free
        prompts = [text[200:500], text[7000:7400], "Once upon a time, in a small village,"]
        kws = [dict(text=prompts[i % 3], max_new_tokens=24, ignore_eos=True) for i in range(N)]
        baselines = []

        def alone():
            for i in range(3):
                resp, code, details = run_unary(srv.stub, greedy_request(**kws[i]))
                expect(code == SC.OK, f"baseline {i}: {code.name} {details}")
                baselines.append(resp)

        checks.run("baselines alone", alone)

        def flood():
            expect(len(baselines) == 3, "no baselines")
            peak = {"running": 0, "waiting": 0}
            stop = threading.Event()

            def poll():
                while not stop.is_set():
                    try:
                        s = srv.stats()
                        peak["running"] = max(peak["running"], s.num_requests_running)
                        peak["waiting"] = max(peak["waiting"], s.num_requests_waiting)
                    except Exception:  # noqa: BLE001 — polling only
                        pass
                    time.sleep(0.05)

            def call(i):
                req = greedy_request(**kws[i])
                if i % 2 == 0:
                    resp, code, details = run_unary(srv.stub, req, timeout=300)
                    if resp is None:
                        return code, details, None, None
                    return code, details, list(resp.token_ids), resp.text
                r = consume_stream(srv.stub.GenerateStream(req, timeout=300))
                return r.code, r.details, r.token_ids, r.text

            poller = threading.Thread(target=poll, daemon=True)
            poller.start()
            try:
                results = in_threads([(lambda i=i: call(i)) for i in range(N)])
            finally:
                stop.set()
                poller.join()
            codes = [c.name for c, _, _, _ in results]
            print(f"codes: {codes}; peak running {peak['running']} waiting {peak['waiting']}")
            for i, (code, details, ids, txt) in enumerate(results):
                expect(code in (SC.OK, SC.RESOURCE_EXHAUSTED),
                       f"request {i}: unexpected {code.name}: {details}")
                if code == SC.RESOURCE_EXHAUSTED:
                    expect(details, f"request {i}: RESOURCE_EXHAUSTED without a message")
                else:
                    expect_eq(ids, list(baselines[i % 3].token_ids), f"request {i}: ids")
                    expect_eq(txt, baselines[i % 3].text, f"request {i}: text")
            n_ok = codes.count("OK")
            n_rej = codes.count("RESOURCE_EXHAUSTED")
            expect(n_rej >= 1, "no request was rejected with a queue of 2")
            # A burst can arrive before the engine moves one into the running set: >= 2 admitted.
            expect(n_ok >= 2, f"only {n_ok} admitted with a queue of 2")
            expect(peak["running"] <= 1, f"{peak['running']} running with --max_running_requests 1")
            expect(peak["waiting"] <= 2, f"{peak['waiting']} waiting with --max_queued_requests 2")

        checks.run("flood: RESOURCE_EXHAUSTED and admitted ones finish", flood)
        checks.run("queue drained, KV blocks free", srv.wait_idle, free0, 30, "after flood")

        def still_serving():
            resp, code, details = run_unary(srv.stub, greedy_request(**kws[2]))
            expect(code == SC.OK, f"{code.name} {details}")
            expect_eq(list(resp.token_ids), list(baselines[2].token_ids), "ids")
            expect(resp.finish_reason == FinishReason.LENGTH, "finish")

        checks.run("server still serves", still_serving)
    checks.finish()


if __name__ == "__main__":
    main()
