"""Soak under faults: minutes of mixed load on the real server, then a drain under that load.

Client threads send, for a bounded time, a seeded random mix of: greedy exact and RidgeFill
requests and seeded sampling (unary and streams), streams the client cancels after a few
tokens, short deadlines, connections closed under a running stream, Abort(request_id),
prompts over --max_prompt_tokens and bad sampling parameters. The KV cache is small enough
that the engine preempts. The run has two halves with the same mix; then a third part is cut
short by SIGTERM. Checks:
  * every call ended with exactly one of: a complete response (unary, or a stream whose last
    message, and only that one, carries finish_reason) or a status with a message; each kind
    with what it should get (complete / CANCELLED / DEADLINE_EXCEEDED / finish ABORTED /
    OUT_OF_RANGE naming --max_prompt_tokens / INVALID_ARGUMENT naming the field);
  * every complete response equals the same request run alone on a fresh server, and what a
    request ended early streamed is a prefix of that;
  * after each half nothing runs and every KV block is free; the engine preempted;
  * the server's RSS after the second half is within RSS_GROWTH_BOUND of after the first;
  * /metrics counts equal what the clients saw (calls, errors by code, finish reasons);
  * SIGTERM during load: no request in flight at the signal is lost (each completes as it
    would have), later calls get UNAVAILABLE, and the process exits 0.

RIDGESERVE_SOAK_SECONDS (default 120) is the length of the two halves together; a longer run
by hand (README "Reliability") sets it, e.g. to 1800.
"""

import collections
import os
import random
import signal
import threading
import time

import grpc

from rs_testlib import (MAPS, SC, Checks, Server, StreamResult, consume_stream, expect,
                        expect_eq, finish_name, greedy_request, license_text, pb, run_unary,
                        scrape_metrics)

SOAK_SECONDS = float(os.environ.get("RIDGESERVE_SOAK_SECONDS", "120"))
THREADS = 6
MAX_PROMPT_TOKENS = 1024
# RSS after the second half may exceed RSS after the first by at most this (allocator caches
# and gRPC's per-connection buffers settle during the first half; a leak of a request's
# buffers grows with the request count).
RSS_GROWTH_BOUND = 24 << 20
SERVER_ARGS = (
    f"--ridgefill_maps={MAPS}",
    "--kv_cache_tokens=2048",  # three prompts of ~700 tokens do not fit: preemption
    "--max_running_requests=16",
    "--max_batch_tokens=512",
    f"--max_prompt_tokens={MAX_PROMPT_TOKENS}",
    "--shutdown_timeout_s=120",
)

# kind: (weight, what the client does)
KINDS = {
    "exact": 22,
    "ridgefill": 12,
    "sampled": 8,
    "cancel": 10,
    "deadline": 8,
    "disconnect": 6,
    "abort": 6,
    "oversize": 4,
    "bad_param": 4,
}
# Kinds whose calls run to completion unless the server is draining; the others end early.
COMPLETE_KINDS = ("exact", "ridgefill", "sampled")


class Pool:
    """The distinct requests the soak draws from: one reference each, run alone."""

    def __init__(self, srv, text):
        rng = random.Random(7)
        self.entries = []  # (kind, GenerateRequest)
        for i in range(10):
            chars = rng.choice([300, 1500, 3000, 4500])
            start = rng.randrange(0, len(text) - chars)
            ids = srv.tokenize(text[start:start + chars])[:MAX_PROMPT_TOKENS - 64]
            self.entries.append(("exact", greedy_request(
                token_ids=ids, max_new_tokens=rng.choice([16, 32, 48]), ignore_eos=True)))
        for i in range(5):
            start = rng.randrange(0, len(text) - 3000)
            ids = srv.tokenize(text[start:start + 3000])[:700]
            req = greedy_request(token_ids=ids, max_new_tokens=24, ignore_eos=True)
            req.prefill.mode = req.prefill.RIDGEFILL
            req.prefill.ridgefill.exact_tail_tokens = 64
            self.entries.append(("ridgefill", req))
        for i in range(4):
            start = rng.randrange(0, len(text) - 1500)
            ids = srv.tokenize(text[start:start + 1500])
            self.entries.append(("sampled", greedy_request(
                token_ids=ids, max_new_tokens=32, ignore_eos=True, temperature=0.8, top_p=0.95,
                seed=1000 + i)))
        oversize = srv.tokenize(text[:8000])
        expect(len(oversize) > MAX_PROMPT_TOKENS, f"oversize prompt has {len(oversize)} tokens")
        self.oversize = greedy_request(token_ids=oversize, max_new_tokens=8)
        self.references = []

    def make_references(self, srv):
        for kind, req in self.entries:
            resp, code, details = run_unary(srv.stub, req)
            expect(code == SC.OK, f"reference ({kind}): {code.name} {details}")
            self.references.append(list(resp.token_ids))


class Record:
    def __init__(self, kind, entry, stream):
        self.kind = kind
        self.entry = entry  # index into Pool.entries, or -1
        self.stream = stream
        self.t_start = time.monotonic()
        self.t_end = None
        self.code = SC.OK
        self.details = ""
        self.token_ids = []
        self.finish = None  # finish_reason name of the complete response, if any
        self.filled = 0  # usage.filled_prompt_tokens of the complete response
        self.violation = None  # a stream message after the final one, etc.
        self.abort_code = None  # the Abort call's status, for kind "abort"
        self.details_field = None  # the field a bad_param request got wrong


class Soak:
    def __init__(self, srv, pool, seed):
        self.srv = srv
        self.pool = pool
        self.seed = seed
        self.records = []
        self.active = set()  # records of the calls in flight
        self.lock = threading.Lock()
        self.ids = 0

    def _next_id(self):
        with self.lock:
            self.ids += 1
            return f"soak-{self.seed}-{self.ids}"

    def _stream(self, rec, req, stub=None, on_message=None, timeout=300.0):
        r = StreamResult()
        consume_stream((stub or self.srv.stub).GenerateStream(req, timeout=timeout), r,
                       on_message)
        rec.code, rec.details, rec.token_ids = r.code, r.details, r.token_ids
        if r.final is not None:
            rec.finish = finish_name(r.final.finish_reason)
            rec.filled = r.final.usage.filled_prompt_tokens
        if r.messages_after_final:
            rec.violation = f"{r.messages_after_final} messages after the final one"
        if (r.final is None) == (r.code == SC.OK):
            rec.violation = f"final message {r.final is not None} with status {r.code.name}"

    def _unary(self, rec, req, timeout=300.0):
        resp, rec.code, rec.details = run_unary(self.srv.stub, req, timeout=timeout)
        if resp is not None:
            rec.token_ids = list(resp.token_ids)
            rec.finish = finish_name(resp.finish_reason)
            rec.filled = resp.usage.filled_prompt_tokens

    def one(self, rng):
        kind = rng.choices(list(KINDS), weights=list(KINDS.values()))[0]
        stream = rng.random() < 0.5
        if kind in COMPLETE_KINDS:
            entry = rng.choice([i for i, (k, _) in enumerate(self.pool.entries) if k == kind])
        elif kind in ("oversize", "bad_param"):
            entry = -1
        else:
            entry = rng.choice([i for i, (k, _) in enumerate(self.pool.entries) if k == "exact"])
        rec = Record(kind, entry, stream)
        with self.lock:
            self.active.add(rec)
        req = pb.GenerateRequest()
        if entry >= 0:
            req.CopyFrom(self.pool.entries[entry][1])
        if kind in COMPLETE_KINDS:
            self._stream(rec, req) if stream else self._unary(rec, req)
        elif kind == "cancel":
            rec.stream = True
            after = rng.randint(1, 5)
            holder = {}

            def cancel_after(r):
                if len(r.token_ids) >= after:
                    holder["call"].cancel()

            holder["call"] = self.srv.stub.GenerateStream(req, timeout=300)
            r = StreamResult()
            consume_stream(holder["call"], r, cancel_after)
            rec.code, rec.details, rec.token_ids = r.code, r.details, r.token_ids
            if r.final is not None:
                rec.finish = finish_name(r.final.finish_reason)
                rec.filled = r.final.usage.filled_prompt_tokens
        elif kind == "deadline":
            timeout = rng.uniform(0.2, 1.5)
            self._stream(rec, req, timeout=timeout) if stream else self._unary(rec, req, timeout)
        elif kind == "disconnect":
            rec.stream = True
            channel = self.srv.new_channel()
            stub = self.srv.stub.__class__(channel)
            after = rng.randint(1, 4)
            self._stream(rec, req, stub=stub, on_message=lambda r: channel.close()
                         if len(r.token_ids) >= after else None)
            channel.close()
        elif kind == "abort":
            rec.stream = True
            req.request_id = self._next_id()
            req.sampling.max_new_tokens = 200  # long enough to be running when aborted
            aborted = threading.Event()

            def abort_after(r):
                if len(r.token_ids) >= 2 and not aborted.is_set():
                    aborted.set()
                    try:
                        self.srv.stub.Abort(pb.AbortRequest(request_id=req.request_id),
                                            timeout=10)
                        rec.abort_code = SC.OK
                    except grpc.RpcError as e:  # e.g. UNAVAILABLE during the drain
                        rec.abort_code = e.code()

            self._stream(rec, req, on_message=abort_after)
        elif kind == "oversize":
            req.CopyFrom(self.pool.oversize)
            self._stream(rec, req) if stream else self._unary(rec, req)
        else:  # bad_param
            req.CopyFrom(greedy_request(text="Hello there", max_new_tokens=8))
            field, value = rng.choice([("temperature", -1.0), ("top_p", 1.5), ("top_k", -3)])
            setattr(req.sampling, field, value)
            rec.details_field = field
            self._stream(rec, req) if stream else self._unary(rec, req)
        with self.lock:  # ended and out of `active` at once (complete_kind_in_flight_since)
            rec.t_end = time.monotonic()
            self.active.discard(rec)
            self.records.append(rec)
        return rec.code

    def complete_kind_in_flight_since(self, t):
        """Whether a complete-kind call sent before `t` is still in flight."""
        with self.lock:
            return any(r.kind in COMPLETE_KINDS and r.t_start < t for r in self.active)

    def run(self, seconds, stop_event=None):
        """THREADS workers draw requests until `seconds` pass (or stop_event is set)."""
        t_stop = time.monotonic() + seconds

        def worker(i):
            rng = random.Random(self.seed * 100 + i)
            while time.monotonic() < t_stop and not (stop_event and stop_event.is_set()):
                if self.one(rng) == SC.UNAVAILABLE:
                    time.sleep(0.05)  # draining: keep knocking, without a busy loop

        threads = [threading.Thread(target=worker, args=(i,), daemon=True)
                   for i in range(THREADS)]
        for t in threads:
            t.start()
        return threads


def check_outcomes(records, pool, draining_since=None):
    """Each record ended as its kind should; complete responses equal the references."""
    counts = collections.Counter()
    t0 = draining_since or min(r.t_start for r in records)
    for rec in records:
        ref = pool.references[rec.entry] if rec.entry >= 0 else None
        what = (f"{rec.kind} ({'stream' if rec.stream else 'unary'}, entry {rec.entry}, "
                f"{rec.code.name} {rec.details!r}, sent {rec.t_start - t0:.2f} s and ended "
                f"{rec.t_end - t0:.2f} s after {'SIGTERM' if draining_since else 'the start'})")
        expect(rec.violation is None, f"{what}: {rec.violation}")
        if rec.code != SC.OK:
            expect(rec.details, f"{what}: status {rec.code.name} without a message")
        if (draining_since is not None and rec.t_start >= draining_since - 1.0
                and rec.code in (SC.UNAVAILABLE, SC.CANCELLED) and not rec.token_ids):
            # Refused: UNAVAILABLE while the server drains (or once it is gone); CANCELLED from
            # gRPC's transport for a call that reached the socket as the server shut its
            # listener after the drain.
            counts[f"refused in the drain: {rec.code.name}"] += 1
            continue
        if rec.kind in COMPLETE_KINDS:
            expect(rec.code == SC.OK, f"{what}: {rec.code.name} {rec.details}")
            expect_eq(rec.finish, "LENGTH", f"{what}: finish")
            expect_eq(rec.token_ids, ref, f"{what}: tokens against the request alone")
            expect((rec.filled > 0) == (rec.kind == "ridgefill"),
                   f"{what}: {rec.filled} prompt rows filled")
        elif rec.kind == "oversize":
            expect_eq(rec.code, SC.OUT_OF_RANGE, f"{what}: code")
            expect("--max_prompt_tokens" in rec.details, f"{what}: {rec.details}")
        elif rec.kind == "bad_param":
            expect_eq(rec.code, SC.INVALID_ARGUMENT, f"{what}: code")
            expect(rec.details_field in rec.details, f"{what}: {rec.details}")
        else:
            ended_early = {"cancel": (SC.CANCELLED,), "deadline": (SC.DEADLINE_EXCEEDED,),
                           "disconnect": (SC.CANCELLED, SC.UNAVAILABLE), "abort": ()}[rec.kind]
            if rec.code == SC.OK:
                if rec.finish == "ABORTED":
                    expect(rec.kind == "abort" or draining_since is not None,
                           f"{what}: finish ABORTED")
                else:
                    # Finished before the client ended it (a short prompt, a slow client).
                    expect_eq(rec.finish, "LENGTH", f"{what}: finish")
                    expect(rec.kind != "abort" or rec.abort_code != SC.OK,
                           f"{what}: ran to the end after Abort")
            else:
                expect(rec.code in ended_early, f"{what}: {rec.code.name} {rec.details}")
            expect_eq(rec.token_ids, ref[:len(rec.token_ids)],
                      f"{what}: streamed tokens against the request alone")
            if rec.finish == "LENGTH":
                expect_eq(rec.token_ids, ref, f"{what}: tokens against the request alone")
        counts[f"{rec.kind} {rec.code.name}{' ' + rec.finish if rec.finish else ''}"] += 1
    return counts


def check_metrics(srv, records):
    """/metrics against the client's view of the same calls."""
    m = scrape_metrics(srv)
    total = sum(v for k, v in m.items() if k.startswith("ridgeserve_requests_total{"))
    errors = {k: v for k, v in m.items() if k.startswith("ridgeserve_request_errors_total{")}
    expect_eq(int(total + sum(errors.values())), len(records), "calls in /metrics")
    for code in (SC.OUT_OF_RANGE, SC.INVALID_ARGUMENT):
        want = sum(1 for r in records if r.code == code)
        expect_eq(int(errors.get(f'ridgeserve_request_errors_total{{code="{code.name}"}}', 0)),
                  want, f"errors_total {code.name}")

    def served(finish):
        return sum(v for k, v in m.items()
                   if k.startswith("ridgeserve_requests_total{") and f'finish_reason="{finish}"' in k)

    # A call the client ended (cancel, deadline, disconnect) can still have finished on the
    # server first, at the same moment: it counts as "length" there. Otherwise as "aborted".
    length = sum(1 for r in records if r.finish == "LENGTH")
    ended = sum(1 for r in records if r.code in (SC.CANCELLED, SC.DEADLINE_EXCEEDED,
                                                  SC.UNAVAILABLE))
    aborted = sum(1 for r in records if r.finish == "ABORTED")
    expect(length <= served("length") <= length + ended,
           f"length in /metrics {served('length')}, clients saw {length} (+{ended} ended early)")
    expect_eq(int(served("length") + served("aborted")), length + ended + aborted,
              "length + aborted in /metrics")
    rf = sum(1 for r in records if r.finish == "LENGTH" and r.filled > 0)
    got_rf = m.get('ridgeserve_requests_total{finish_reason="length",prefill_mode="ridgefill"}',
                   0)
    expect_eq(int(got_rf), rf, "RidgeFill requests (finish length) in /metrics")
    return {"calls": len(records), "length": served("length"), "aborted": served("aborted"),
            "errors": {k.split('"')[1]: int(v) for k, v in errors.items() if v}}


def rss_bytes(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def main():
    checks = Checks("test_soak")
    text = license_text()
    half = SOAK_SECONDS / 2
    srv = Server(*SERVER_ARGS, name="soak")
    state = {}
    try:
        if not checks.run("start", srv.start):
            checks.finish()
        free0 = srv.stats().kv_cache_blocks_total

        def build_pool():
            state["pool"] = Pool(srv, text)

        if not checks.run("request pool", build_pool):
            checks.finish()
        pool = state["pool"]
        ref_srv = Server(*SERVER_ARGS, name="reference")

        def references():
            with ref_srv:
                pool.make_references(ref_srv)

        if not checks.run(f"{len(pool.entries)} references, each alone on a fresh server",
                          references):
            checks.finish()
        records = []
        rss = []
        for part in (1, 2):
            def soak_half(part=part):
                soak = Soak(srv, pool, seed=part)
                for t in soak.run(half):
                    t.join()
                records.extend(soak.records)
                s = srv.wait_idle(free0, 60, f"half {part}")
                rss.append(rss_bytes(srv.proc.pid))
                counts = check_outcomes(soak.records, pool)
                print(f"half {part}: {len(soak.records)} calls in {half:.0f} s, "
                      f"{s.num_preemptions} preemptions so far, RSS {rss[-1] >> 20} MiB")
                for k, v in sorted(counts.items()):
                    print(f"  {v:4d}  {k}")

            checks.run(f"half {part}: {half:.0f} s of mixed load, every call as it should end",
                       soak_half)

        def preempted():
            expect(srv.stats().num_preemptions > 0, "the small KV cache forced no preemption")

        checks.run("the engine preempted", preempted)

        def rss_bound():
            expect(len(rss) == 2, "a half failed")
            grown = rss[1] - rss[0]
            print(f"RSS after half 1 {rss[0] / 2**20:.1f} MiB, after half 2 {rss[1] / 2**20:.1f} "
                  f"MiB ({grown / 2**20:+.1f} MiB)")
            expect(grown <= RSS_GROWTH_BOUND, f"RSS grew {grown >> 20} MiB between the halves")

        checks.run(f"RSS grows at most {RSS_GROWTH_BOUND >> 20} MiB between the halves", rss_bound)

        def metrics():
            print(f"/metrics: {check_metrics(srv, records)}")

        checks.run("/metrics counts equal what the clients saw", metrics)

        def drain():
            soak = Soak(srv, pool, seed=3)
            stop = threading.Event()
            threads = soak.run(300, stop)
            time.sleep(min(10.0, half / 2))
            # SIGTERM while a complete-kind call sent over a second before is in flight (read
            # after the time taken, so it is still in flight at that time).
            deadline = time.monotonic() + 60
            while True:
                t_sig = time.monotonic()
                if soak.complete_kind_in_flight_since(t_sig - 1.0):
                    break
                expect(t_sig < deadline, "no complete-kind call in flight for over a second")
                time.sleep(0.02)
            srv.send_signal(signal.SIGTERM)
            while srv.alive():
                time.sleep(0.1)
            stop.set()
            for t in threads:
                t.join(60)
            code = srv.wait_exit(5)
            print(f"exit code {code}, {time.monotonic() - t_sig:.1f} s after SIGTERM")
            expect_eq(code, 0, "exit code after SIGTERM under load")
            in_flight = [r for r in soak.records if r.t_start < t_sig - 1.0 and r.t_end > t_sig]
            late = [r for r in soak.records if r.t_start > t_sig]
            counts = check_outcomes(soak.records, pool, draining_since=t_sig)
            print(f"drain: {len(soak.records)} calls, {len(in_flight)} in flight at SIGTERM, "
                  f"{len(late)} sent after it")
            for k, v in sorted(counts.items()):
                print(f"  {v:4d}  {k}")
            expect(any(r.kind in COMPLETE_KINDS for r in in_flight),
                   "no complete-kind request was in flight at SIGTERM")
            served = [f"{r.kind} {r.finish}" for r in late if r.code == SC.OK]
            expect(not served, f"calls sent after SIGTERM were served: {served}")
            expect(any(r.code == SC.UNAVAILABLE for r in late),
                   "no call sent after SIGTERM got UNAVAILABLE")

        checks.run("SIGTERM under load: nothing in flight lost, new calls UNAVAILABLE, exit 0",
                   drain)
    finally:
        srv.kill()
        srv.stop()
    checks.finish()


if __name__ == "__main__":
    main()
