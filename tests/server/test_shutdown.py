"""Graceful shutdown: SIGTERM drains in-flight requests, SIGINT with a short timeout aborts.

Case 1 (--shutdown_timeout_s 120): four streams are decoding when SIGTERM arrives.
  * while the process is still alive, health reports NOT_SERVING and a new Generate and a new
    GenerateStream get UNAVAILABLE;
  * the four streams finish normally (LENGTH, not ABORTED) with exactly their alone output;
  * the process exits 0, within the timeout.
Case 2 (--shutdown_timeout_s 1): one stream that would decode for minutes, then SIGINT.
  * the stream ends with a final ABORTED message; the process exits 0 within a few seconds.
"""

import signal
import threading
import time

import grpc
from grpc_health.v1 import health_pb2

from rs_testlib import (SC, Checks, Server, StreamResult, consume_stream, expect, expect_eq,
                        finish_name, greedy_request, license_text, run_unary)


def drain_case(checks, text):
    srv = Server("--shutdown_timeout_s=120", name="drain")
    try:
        if not checks.run("start (drain case)", srv.start):
            return
        # Long enough that the drain outlasts the checks made during it (seconds, not the
        # tenth of a second they take), on a loaded machine too.
        kws = [dict(text=text[i * 900:i * 900 + 400], max_new_tokens=128, ignore_eos=True)
               for i in range(4)]
        baselines = []

        def alone():
            for i, kw in enumerate(kws):
                resp, code, details = run_unary(srv.stub, greedy_request(**kw))
                expect(code == SC.OK, f"baseline {i}: {code.name} {details}")
                baselines.append(resp)

        if not checks.run("baselines alone", alone):
            return
        results = [StreamResult() for _ in kws]
        started = [threading.Event() for _ in kws]
        calls = [srv.stub.GenerateStream(greedy_request(**kw), timeout=300) for kw in kws]
        threads = [
            threading.Thread(
                target=lambda i=i: consume_stream(
                    calls[i], results[i],
                    lambda r, i=i: started[i].set() if len(r.token_ids) >= 2 else None),
                daemon=True)
            for i in range(len(kws))]
        for t in threads:
            t.start()

        def sigterm_during_streams():
            for i, e in enumerate(started):
                expect(e.wait(120), f"stream {i} produced no tokens: {results[i].describe()}")
            in_flight = sum(1 for r in results if r.final is None)
            expect(in_flight == len(kws), f"only {in_flight} streams still running at SIGTERM")
            t_sig = time.monotonic()
            srv.send_signal(signal.SIGTERM)
            srv.t_sig = t_sig

            # Health: NOT_SERVING promptly, asked while the process is alive.
            status = None
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and srv.alive():
                try:
                    status = srv.health.Check(health_pb2.HealthCheckRequest(service=""),
                                              timeout=2).status
                    if status == health_pb2.HealthCheckResponse.NOT_SERVING:
                        break
                except grpc.RpcError as e:
                    status = e.code().name
                time.sleep(0.05)
            expect(srv.alive(), "process exited before health could be checked")
            expect(status == health_pb2.HealthCheckResponse.NOT_SERVING,
                   f"health during drain: {status}")

            # New calls: UNAVAILABLE while the process is alive.
            resp, code, details = run_unary(srv.stub, greedy_request(text="hi", max_new_tokens=4),
                                            timeout=10)
            alive = srv.alive()
            expect(alive, "process exited before a new call could be made during the drain")
            expect_eq(code, SC.UNAVAILABLE, f"new Generate during drain ({details})")
            r = consume_stream(srv.stub.GenerateStream(
                greedy_request(text="hi", max_new_tokens=4), timeout=10))
            expect_eq(r.code, SC.UNAVAILABLE, f"new GenerateStream during drain ({r.details})")
            still_running = sum(1 for x in results if x.final is None)
            print(f"drain: NOT_SERVING and UNAVAILABLE seen with {still_running} streams in flight")

        checks.run("SIGTERM: NOT_SERVING, new calls UNAVAILABLE", sigterm_during_streams)

        def in_flight_finish():
            for t in threads:
                t.join(300)
            for i, r in enumerate(results):
                expect(r.code == SC.OK and r.final is not None, f"stream {i}: {r.describe()}")
                expect_eq(finish_name(r.final.finish_reason), "LENGTH", f"stream {i} finish")
                expect_eq(r.token_ids, list(baselines[i].token_ids), f"stream {i} ids")
                expect_eq(r.text, baselines[i].text, f"stream {i} text")

        checks.run("in-flight streams finish normally", in_flight_finish)

        def exits_zero():
            code = srv.wait_exit(120 + 15)
            expect(code is not None, "process still running 135 s after SIGTERM")
            took = time.monotonic() - getattr(srv, "t_sig", time.monotonic())
            print(f"exit code {code}, {took:.1f} s after SIGTERM")
            expect_eq(code, 0, "exit code after SIGTERM")

        checks.run("process exits 0 after the drain", exits_zero)
    finally:
        srv.kill()
        srv.stop()


def timeout_case(checks, text):
    srv = Server("--shutdown_timeout_s=1", name="abort_on_timeout")
    try:
        if not checks.run("start (timeout case)", srv.start):
            return
        victim = StreamResult()
        started = threading.Event()
        call = srv.stub.GenerateStream(
            greedy_request(text=text[:400], max_new_tokens=4000, ignore_eos=True), timeout=300)
        t = threading.Thread(target=lambda: consume_stream(
            call, victim, lambda r: started.set() if len(r.token_ids) >= 2 else None), daemon=True)
        t.start()

        def sigint_aborts():
            expect(started.wait(120), f"stream produced no tokens: {victim.describe()}")
            t0 = time.monotonic()
            srv.send_signal(signal.SIGINT)
            code = srv.wait_exit(20)
            took = time.monotonic() - t0
            expect(code is not None, "process still running 20 s after SIGINT with a 1 s timeout")
            print(f"exit code {code}, {took:.1f} s after SIGINT")
            expect_eq(code, 0, "exit code")
            t.join(20)
            expect(not t.is_alive(), "stream did not end")
            expect(victim.code == SC.OK and victim.final is not None,
                   f"stream should end with a final ABORTED message: {victim.describe()}")
            expect_eq(finish_name(victim.final.finish_reason), "ABORTED", "finish_reason")
            expect(len(victim.token_ids) < 4000, "stream was not cut short")

        checks.run("SIGINT with --shutdown_timeout_s 1 aborts the stream, exits 0", sigint_aborts)
    finally:
        srv.kill()
        srv.stop()


def main():
    checks = Checks("test_shutdown")
    text = license_text()
    drain_case(checks, text)
    timeout_case(checks, text)
    checks.finish()


if __name__ == "__main__":
    main()
