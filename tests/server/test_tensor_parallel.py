"""The server with --tensor_parallel 3 on the CPU backend (SmolLM2's 9 heads / 3 KV heads over
3 ranks, threads of one process) behaves as at TP=1.

Server A: --tensor_parallel 3, default RidgeFill maps, a KV cache too small for the load
(--kv_cache_tokens 1024, --max_batch_tokens 256) so requests are preempted and recomputed:
  * GetModelInfo reports tensor_parallel 3;
  * 12 requests alone (unary) give baselines; the same 12 at once as streams complete
    token-identical to them (batch invariance holds within one TP size), with preemptions;
  * a RIDGEFILL request fills rows (filled_prompt_tokens > 0) and gives the same tokens alone
    and while other streams run;
  * a stream cancelled after its first token ends, and every KV block comes back;
  * /metrics answers from the server process with the requests counted;
  * SIGTERM while streams decode: they finish normally, the process exits 0.
Server B: RIDGESERVE_TEST_TP_FAULT=1:6 (rank 1 fails the engine's sixth step: the warm-up
request takes steps 1-4, so the first request here decodes in it): that request gets INTERNAL
naming rank 1, and the server keeps serving correct answers afterwards.
Server C: RIDGESERVE_TEST_TP_FAULT=1:6:unrecoverable (the group is then not reset, as an NCCL
group cannot be): that request gets UNAVAILABLE naming rank 1's error (the engine can run no
more steps: a client may retry elsewhere), the gRPC health service turns NOT_SERVING (so
Kubernetes' probes restart the server), and later requests get UNAVAILABLE at once.
Server D: --step_timeout_s=1 and a 3000-token prompt in one step (many seconds here): the
watchdog stalls the engine while the step runs and aborts the group's collectives, so the
ranks leave the step at their next all-reduce; that request gets UNAVAILABLE naming the step
timeout, /metrics says ridgeserve_engine_broken 1, health turns NOT_SERVING, and a later
request is refused UNAVAILABLE at once.
"""

import contextlib
import os
import random
import signal
import threading
import time
import urllib.request

from rs_testlib import (MAPS, SC, Checks, Server, consume_stream, expect, expect_eq,
                        finish_name, greedy_request, health_pb2, in_threads, license_text,
                        run_stream, run_unary)

TP = 3


@contextlib.contextmanager
def server_with_fault(spec, name):
    """A --tensor_parallel server whose rank fails as RIDGESERVE_TEST_TP_FAULT=spec says (read
    when the server starts)."""
    os.environ["RIDGESERVE_TEST_TP_FAULT"] = spec
    try:
        with Server(f"--tensor_parallel={TP}", name=name, port0=True) as srv:
            del os.environ["RIDGESERVE_TEST_TP_FAULT"]
            yield srv
    finally:
        os.environ.pop("RIDGESERVE_TEST_TP_FAULT", None)


def ridgefill_request(ids, tail=64, max_new_tokens=12):
    req = greedy_request(token_ids=ids, max_new_tokens=max_new_tokens)
    req.prefill.mode = req.prefill.RIDGEFILL
    req.prefill.ridgefill.exact_tail_tokens = tail
    return req


def main():
    checks = Checks("test_tensor_parallel")
    text = license_text()
    with Server(f"--tensor_parallel={TP}", "--ridgefill_maps", MAPS, "--kv_cache_tokens=1024",
                "--max_batch_tokens=256", "--shutdown_timeout_s=120", name="tp3", port0=True) as srv:
        info = srv.info()
        expect_eq(info.tensor_parallel, TP, "GetModelInfo tensor_parallel")
        idle = srv.stats()
        total_blocks = idle.kv_cache_blocks_total
        corpus = srv.tokenize(text[10000:40000])
        rng = random.Random(3)
        reqs = []
        for i in range(12):
            n = rng.randint(16, 120)
            start = rng.randrange(0, len(corpus) - n)
            reqs.append((f"r{i}_p{n}", dict(token_ids=corpus[start:start + n],
                                            max_new_tokens=rng.randint(24, 48), ignore_eos=True)))
        baselines = {}

        def alone():
            for name, kw in reqs:
                resp, code, details = run_unary(srv.stub, greedy_request(**kw))
                expect(code == SC.OK, f"{name}: {code.name} {details}")
                expect_eq(len(resp.token_ids), kw["max_new_tokens"], f"{name}: completion length")
                baselines[name] = list(resp.token_ids)

        checks.run("12 requests alone at TP=3 (baselines)", alone)

        def concurrent():
            p0 = srv.stats().num_preemptions
            results = in_threads([
                (lambda kw=kw: consume_stream(srv.stub.GenerateStream(greedy_request(**kw),
                                                                      timeout=600)))
                for _, kw in reqs])
            for (name, _), r in zip(reqs, results):
                expect(r.code == SC.OK, f"{name}: {r.describe()}")
                expect_eq(r.token_ids, baselines[name], f"{name}: tokens batched vs alone")
            p1 = srv.stats().num_preemptions
            print(f"  preemptions during the batch: {p1 - p0}")
            expect(p1 > p0, "the small KV cache forced no preemption")
            srv.wait_idle(total_blocks, what="after the batch")

        checks.run("12 at once as streams: identical to alone, with preemption", concurrent)

        long_ids = corpus[1000:1600]

        def ridgefill():
            resp, code, details = run_unary(srv.stub, ridgefill_request(long_ids))
            expect(code == SC.OK, f"RIDGEFILL: {code.name} {details}")
            filled = resp.usage.filled_prompt_tokens
            print(f"  RIDGEFILL at TP=3: {filled} of {len(long_ids)} prompt rows filled")
            expect(filled > 400, f"only {filled} rows filled")
            others = [(lambda kw=kw: run_stream(srv.stub, greedy_request(**kw)))
                      for _, kw in reqs[:4]]
            mixed = in_threads([lambda: run_unary(srv.stub, ridgefill_request(long_ids))] + others)
            again, code2, details2 = mixed[0]
            expect(code2 == SC.OK, f"RIDGEFILL beside streams: {code2.name} {details2}")
            expect_eq(list(again.token_ids), list(resp.token_ids),
                      "RIDGEFILL tokens beside other streams vs alone")
            srv.wait_idle(total_blocks, what="after RIDGEFILL")

        checks.run("RIDGEFILL at TP=3: rows filled, same alone and batched", ridgefill)

        def cancel():
            call = srv.stub.GenerateStream(greedy_request(token_ids=corpus[:50],
                                                          max_new_tokens=400, ignore_eos=True),
                                           timeout=300)
            got = 0
            for _ in call:
                got += 1
                call.cancel()
                break
            expect(got == 1, "no first token before cancelling")
            srv.wait_idle(total_blocks, what="after cancel")

        checks.run("cancel after the first token: every KV block back", cancel)

        def metrics():
            url = f"http://127.0.0.1:{srv.metrics_port}/metrics"
            with urllib.request.urlopen(url, timeout=10) as r:
                body = r.read().decode()
            lines = [l for l in body.splitlines() if l.startswith("ridgeserve_requests_total")]
            total = sum(float(l.rsplit(" ", 1)[1]) for l in lines)
            print(f"  /metrics: {len(body.splitlines())} lines; ridgeserve_requests_total "
                  f"sums to {total:.0f}")
            expect(total >= 2 * len(reqs) + 3, f"requests_total {total} < what was sent")

        checks.run("/metrics from the server process at TP=3", metrics)

        def drain():
            results = [None] * 3
            started = [threading.Event() for _ in range(3)]
            threads = []
            for i in range(3):
                def body(i=i):
                    try:
                        call = srv.stub.GenerateStream(greedy_request(
                            token_ids=corpus[100 * i:100 * i + 40], max_new_tokens=64,
                            ignore_eos=True), timeout=300)
                        results[i] = consume_stream(call, on_message=lambda r: started[i].set())
                    finally:
                        started[i].set()  # a stream that fails says so below, not by a timeout
                threads.append(threading.Thread(target=body))
                threads[-1].start()
            # SIGTERM once every stream is being served (each has a token).
            for i, e in enumerate(started):
                expect(e.wait(120), f"stream {i} had no token after 120 s")
            running = srv.stats().num_requests_running
            srv.send_signal(signal.SIGTERM)
            expect(running >= 1, "no stream was still running at SIGTERM")
            for t in threads:
                t.join(300)
            for i, r in enumerate(results):
                expect(r is not None and r.code == SC.OK and finish_name(r.finish_reason) ==
                       "LENGTH", f"stream {i} under SIGTERM: {r.describe() if r else 'none'}")
            code = srv.wait_exit(120)
            expect_eq(code, 0, "exit code after SIGTERM")

        checks.run("SIGTERM under load: streams finish, exit 0", drain)

    with server_with_fault("1:6", "tp3_fault") as srv:
        ids = srv.tokenize(text[:2000])[:60]

        def fault():
            outcomes = [run_unary(srv.stub, greedy_request(token_ids=ids, max_new_tokens=8))
                        for _ in range(3)]
            codes = [c for _, c, _ in outcomes]
            print("  codes:", [c.name for c in codes])
            failed = [(c, d) for _, c, d in outcomes if c != SC.OK]
            expect(len(failed) == 1, f"want exactly one failed request, got {codes}")
            if failed:
                code, details = failed[0]
                expect_eq(code, SC.INTERNAL, "status of the failed step's request")
                expect("tensor-parallel rank 1 failed" in details, f"details: {details!r}")
            good = [list(r.token_ids) for r, c, _ in outcomes if c == SC.OK]
            expect(len(good) == 2 and good[0] == good[1], "answers after the fault differ")
            srv.wait_idle(srv.stats().kv_cache_blocks_total, what="after the fault")

        checks.run("a rank failing a step: INTERNAL for its requests, then serving", fault)

    with server_with_fault("1:6:unrecoverable", "tp3_broken") as srv:
        ids = srv.tokenize(text[:2000])[:60]

        def broken():
            serving = health_pb2.HealthCheckResponse.SERVING
            expect_eq(srv.health.Check(health_pb2.HealthCheckRequest(service=""),
                                       timeout=5).status, serving, "health before the fault")
            _, code, details = run_unary(srv.stub,
                                         greedy_request(token_ids=ids, max_new_tokens=8))
            expect_eq(code, SC.UNAVAILABLE, f"status of the failed step's request ({details!r})")
            expect("tensor-parallel rank 1 failed: injected fault" in details,
                   f"details: {details!r}")
            status = srv.health.Check(health_pb2.HealthCheckRequest(service=""),
                                      timeout=5).status
            expect_eq(health_pb2.HealthCheckResponse.ServingStatus.Name(status),
                      "NOT_SERVING", "health after the group broke")
            _, code, details = run_unary(srv.stub,
                                         greedy_request(token_ids=ids, max_new_tokens=8))
            expect_eq(code, SC.UNAVAILABLE, f"a request after the group broke ({details!r})")
            expect("tensor-parallel group stopped" in details, f"details: {details!r}")

        checks.run("a group that cannot be reset: UNAVAILABLE, NOT_SERVING", broken)

    with Server(f"--tensor_parallel={TP}", "--step_timeout_s=1", "--max_batch_tokens=4096",
                name="tp3_stalled", port0=True) as srv:
        ids = srv.tokenize(text)[:3000]

        def scrape(name):
            url = f"http://127.0.0.1:{srv.metrics_port}/metrics"
            with urllib.request.urlopen(url, timeout=10) as r:
                for line in r.read().decode().splitlines():
                    if line.startswith(name + " "):
                        return float(line.split()[1])
            return None

        def stalled():
            expect_eq(scrape("ridgeserve_engine_broken"), 0.0, "engine_broken before")
            started = time.monotonic()
            _, code, details = run_unary(srv.stub,
                                         greedy_request(token_ids=ids, max_new_tokens=8))
            print(f"  the 3000-token step's request: {code.name} after "
                  f"{time.monotonic() - started:.1f} s: {details}")
            expect_eq(code, SC.UNAVAILABLE, "status of the stalled step's request")
            expect("past the step timeout of 1 s" in details, f"details: {details!r}")
            expect_eq(scrape("ridgeserve_engine_broken"), 1.0, "engine_broken after")
            # (The reply goes out inside the step: the gauge drops to 0 just after.)
            for _ in range(50):
                if scrape("ridgeserve_engine_step_in_progress_seconds") == 0.0:
                    break
                time.sleep(0.1)
            expect_eq(scrape("ridgeserve_engine_step_in_progress_seconds"), 0.0,
                      "step in progress once the stalled step ended")
            status = srv.health.Check(health_pb2.HealthCheckRequest(service=""),
                                      timeout=5).status
            expect_eq(health_pb2.HealthCheckResponse.ServingStatus.Name(status),
                      "NOT_SERVING", "health after the stall")
            _, code, details = run_unary(srv.stub,
                                         greedy_request(token_ids=ids[:20], max_new_tokens=8))
            expect_eq(code, SC.UNAVAILABLE, f"a request after the stall ({details!r})")
            # The abort reached the ranks inside the step: one of them failed on it.
            log = open(srv.log.name, encoding="utf-8", errors="replace").read()
            expect("tensor-parallel group aborted: an engine step has run for" in log,
                   "no rank left the step through the abort:\n" + srv.log_tail())

        checks.run("a step past --step_timeout_s: aborted, NOT_SERVING, UNAVAILABLE", stalled)
    return checks.finish()


if __name__ == "__main__":
    raise SystemExit(main())
