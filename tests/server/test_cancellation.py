"""A request that ends early on the client side frees its KV blocks; the others don't notice.

For each way a request can end early — the client cancels the stream, its deadline expires, the
client's connection goes away, a router calls Abort(request_id) — a "victim" request that
would otherwise decode for minutes (max_new_tokens 4000, ignore_eos) runs next to three
ordinary requests. Checks per case:
  * the victim held KV blocks while running (stats.kv_cache_blocks_free dropped);
  * the client sees what it should (CANCELLED / DEADLINE_EXCEEDED / a final ABORTED message);
  * the others finish with exactly their alone output;
  * within a bounded time nothing runs or waits and every KV block is free again — impossible
    unless the engine dropped the victim (it would otherwise decode for minutes).
Also: Abort of an unknown request_id is NOT_FOUND.
"""

import threading
import time

import grpc

from rs_testlib import (SC, Checks, FinishReason, Server, StreamResult, consume_stream, expect,
                        expect_eq, finish_name, greedy_request, license_text, pb, run_unary)

VICTIM_TOKENS = 4000


def main():
    checks = Checks("test_cancellation")
    text = license_text()
    with Server("--max_running_requests=16", name="cancellation") as srv:
        idle = srv.stats()
        expect_eq(idle.kv_cache_blocks_free, idle.kv_cache_blocks_total, "free blocks at idle")
        free0 = idle.kv_cache_blocks_free
        others = [
            dict(text=text[100:600], max_new_tokens=24, ignore_eos=True),
            dict(text=text[3000:3200], max_new_tokens=20, ignore_eos=True),
            dict(text="The quick brown fox", max_new_tokens=16, ignore_eos=True),
        ]
        baselines = []

        def alone():
            for i, kw in enumerate(others):
                resp, code, details = run_unary(srv.stub, greedy_request(**kw))
                expect(code == SC.OK, f"other{i}: {code.name} {details}")
                baselines.append(resp)

        checks.run("baselines alone", alone)

        def with_victim(case, start_victim, end_victim, expect_victim):
            """Runs the others next to a victim; end_victim(handle) once it streamed tokens."""
            expect(len(baselines) == len(others), "no baselines")
            results = [None] * len(others)

            def run_other(i):
                results[i] = consume_stream(
                    srv.stub.GenerateStream(greedy_request(**others[i]), timeout=300))

            victim = StreamResult()
            got_tokens = threading.Event()

            def on_msg(r):
                if len(r.token_ids) >= 3:
                    got_tokens.set()

            handle = start_victim()
            vt = threading.Thread(target=lambda: consume_stream(handle["call"], victim, on_msg),
                                  daemon=True)
            vt.start()
            expect(got_tokens.wait(120), f"{case}: victim produced no tokens: {victim.describe()}")
            busy = srv.stats()
            expect(busy.kv_cache_blocks_free < free0,
                   f"{case}: victim running but all blocks free ({busy.kv_cache_blocks_free})")
            threads = [threading.Thread(target=run_other, args=(i,), daemon=True)
                       for i in range(len(others))]
            for t in threads:
                t.start()
            time.sleep(0.3)  # the others are admitted and share steps with the victim
            t_end = time.monotonic()
            end_victim(handle)
            vt.join(60)
            expect(not vt.is_alive(), f"{case}: victim stream did not end within 60 s")
            expect_victim(victim)
            print(f"{case}: victim ended after {len(victim.token_ids)} tokens "
                  f"({victim.end_time - t_end:.2f} s after ending it): {victim.describe()}")
            for t in threads:
                t.join(300)
            for i, r in enumerate(results):
                expect(r is not None and r.code == SC.OK, f"{case}: other{i} failed: "
                       f"{r.describe() if r else 'no result'}")
                expect_eq(r.token_ids, list(baselines[i].token_ids), f"{case}: other{i} ids")
                expect_eq(r.text, baselines[i].text, f"{case}: other{i} text")
            s = srv.wait_idle(free0, 20, case)
            expect_eq(s.kv_cache_blocks_free, free0, f"{case}: free blocks")

        victim_prompt = text[8000:8500]  # ~110 tokens: quick first tokens

        def victim_req(**extra):
            return greedy_request(text=victim_prompt, max_new_tokens=VICTIM_TOKENS,
                                  ignore_eos=True, **extra)

        # 1. Client cancels the stream.
        def cancel_case():
            with_victim(
                "cancel",
                lambda: {"call": srv.stub.GenerateStream(victim_req(), timeout=600)},
                lambda h: h["call"].cancel(),
                lambda v: expect_eq(v.code, SC.CANCELLED, "cancelled victim code"))

        checks.run("cancelled stream frees its blocks", cancel_case)

        # 2. Deadline expires (the grpc client sends grpc-timeout; the server sees it too).
        def deadline_case():
            deadline_s = 6.0

            def start():
                return {"call": srv.stub.GenerateStream(victim_req(), timeout=deadline_s),
                        "t0": time.monotonic()}

            def wait_for_deadline(h):
                left = h["t0"] + deadline_s - time.monotonic()
                expect(left > 0, "deadline expired before the victim produced 3 tokens; "
                                 "the machine is too slow for this check")
                time.sleep(left + 0.1)

            with_victim("deadline", start, wait_for_deadline,
                        lambda v: expect_eq(v.code, SC.DEADLINE_EXCEEDED, "victim code"))

        checks.run("expired deadline frees its blocks", deadline_case)

        # 3. The client goes away: its channel closes under a running stream.
        def disconnect_case():
            def start():
                ch = srv.new_channel()
                stub = srv.stub.__class__(ch)
                return {"call": stub.GenerateStream(victim_req(), timeout=600), "channel": ch}

            with_victim("disconnect", start, lambda h: h["channel"].close(),
                        lambda v: expect(v.code in (SC.CANCELLED, SC.UNAVAILABLE),
                                         f"victim code {v.code.name}"))

        checks.run("client disconnect frees its blocks", disconnect_case)

        # 4. A router aborts by request_id: the stream ends normally with finish ABORTED.
        def abort_case():
            rid = "cancellation-test-abort-me"

            def do_abort(_):
                srv.stub.Abort(pb.AbortRequest(request_id=rid), timeout=10)

            def check(v):
                expect_eq(v.code, SC.OK, f"aborted victim status ({v.details})")
                expect(v.final is not None, "aborted victim: no final message")
                expect_eq(finish_name(v.final.finish_reason), "ABORTED", "victim finish")
                expect_eq(v.final.request_id, rid, "final message request_id")

            with_victim("abort",
                        lambda: {"call": srv.stub.GenerateStream(victim_req(request_id=rid),
                                                                 timeout=600)},
                        do_abort, check)

        checks.run("Abort(request_id) frees its blocks", abort_case)

        def abort_unknown():
            try:
                srv.stub.Abort(pb.AbortRequest(request_id="no-such-request"), timeout=10)
            except grpc.RpcError as e:
                expect_eq(e.code(), SC.NOT_FOUND, "Abort of an unknown id")
                return
            raise AssertionError("Abort of an unknown request_id returned OK")

        checks.run("Abort of an unknown request_id -> NOT_FOUND", abort_unknown)

        def unary_deadline():
            # Unary Generate too: the deadline ends it and the blocks come back.
            resp, code, _ = run_unary(srv.stub, victim_req(), timeout=2.0)
            expect_eq(code, SC.DEADLINE_EXCEEDED, "unary victim code")
            srv.wait_idle(free0, 20, "unary deadline")

        checks.run("unary Generate deadline frees its blocks", unary_deadline)

        def still_serving():
            resp, code, details = run_unary(srv.stub, greedy_request(**others[2]))
            expect(code == SC.OK, f"{code.name} {details}")
            expect_eq(list(resp.token_ids), list(baselines[2].token_ids), "ids after all that")
            expect(resp.finish_reason == FinishReason.LENGTH, "finish")

        checks.run("server still serves", still_serving)
    checks.finish()


if __name__ == "__main__":
    main()
