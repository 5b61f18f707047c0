"""ridgeserve's Prometheus metrics, as a real Prometheus server scrapes and queries them.

Starts the real `ridgeserve` (default model, RidgeFill maps) and the Debian `prometheus` binary
(temp dir, scrape interval 1 s, the rules in deploy/prometheus/rules loaded), both on loopback.
Every request's prompt is sent as token ids, so prompt lengths are known exactly.
Checks, each against Prometheus' HTTP API after a scrape that saw the test's last call:
  * exact phase (unary and streams, finish LENGTH): requests_total{finish_reason="length",
    prefill_mode="exact"}, the TTFT/E2E/queue/prefill histogram _count, prompt and generation
    token counters and the ITL _count equal what the test sent and received; the RidgeFill
    saved-seconds histogram is still 0;
  * RidgeFill phase (exact_tail_tokens 16 on a few hundred tokens): the same by
    prefill_mode="ridgefill"; ridgeserve_ridgefill_ttft_saved_seconds _count equals the
    RidgeFill requests and _sum > 0; filled tokens equal the responses' usage.filled_prompt_tokens;
    every RidgeFill request is shadowed (--ridgefill_shadow_fraction=1) and its shadow is
    compared or counted as dropped;
  * concurrent mixed good and bad calls (INVALID_ARGUMENT, OUT_OF_RANGE, FAILED_PRECONDITION,
    a stop string, a stream cancelled by the client): every counter equals the outcomes the
    client saw (errors by code, requests by finish reason and mode, TTFT counts);
  * engine gauges (running seen > 0 under load, 0 when idle; KV usage and preemptions equal
    GetModelInfo's stats), build info labels;
  * online calibration (on, --ridgefill_online_resolve_rows=ONLINE_RESOLVE_ROWS, exact
    requests of fresh text added when the phases above offered fewer rows): every offered row
    reached the statistics or the dropped count, a re-solve was swapped in (a map reload, a
    last re-solve duration > 0) and none failed;
  * recording rules per prefill mode and per split layer (shadow quality), and every Grafana
    panel query returns data (the online calibration panels' after the re-solve);
  * `promtool check metrics` is clean on the /metrics text.

Environment: PROMETHEUS_BIN, PROMTOOL_BIN (default: on PATH); the maps are rs_testlib.MAPS
(RIDGESERVE_DEFAULT_MAPS).
"""

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.parse
import urllib.request

from rs_testlib import (MAPS, SC, SOURCE_DIR, Checks, FinishReason, Server, consume_stream,
                        expect, expect_eq, free_port, greedy_request, in_threads, license_text,
                        pb, run_unary)

PROMETHEUS = os.environ.get("PROMETHEUS_BIN") or shutil.which("prometheus") or "prometheus"
PROMTOOL = os.environ.get("PROMTOOL_BIN") or shutil.which("promtool") or "promtool"
RULES_DIR = os.path.join(SOURCE_DIR, "deploy", "prometheus", "rules")
DASHBOARD = os.path.join(SOURCE_DIR, "deploy", "grafana", "ridgeserve.json")
NEW_TOKENS = 8
TAIL = 16
# Online calibration re-solves after this many served rows (the exact prefills' prompt rows,
# every 4th position), so that one re-solve runs while the test does.
ONLINE_RESOLVE_ROWS = 256


class Prometheus:
    """The real Prometheus server scraping one target every second."""

    def __init__(self, target):
        self.dir = tempfile.mkdtemp(prefix="rs_prom_")
        self.port = free_port()
        rules = [os.path.join(RULES_DIR, f) for f in sorted(os.listdir(RULES_DIR))]
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": rules,
            "scrape_configs": [{"job_name": "ridgeserve",
                                "static_configs": [{"targets": [target]}]}],
        }
        path = os.path.join(self.dir, "prometheus.yml")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(config, f)  # JSON is YAML
        self.log = open(os.path.join(self.dir, "prometheus.log"), "w+", encoding="utf-8")
        self.proc = subprocess.Popen(
            [PROMETHEUS, f"--config.file={path}", f"--storage.tsdb.path={self.dir}/data",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=self.log, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 60
        while True:
            expect(self.proc.poll() is None, f"prometheus exited:\n{self.log_text()}")
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            expect(time.monotonic() < deadline, "prometheus not ready after 60 s")
            time.sleep(0.2)

    def log_text(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read()[-4000:]

    def query(self, expr):
        """Instant query: [(labels, value)]."""
        url = self.url + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.load(r)
        expect(body["status"] == "success", f"query {expr!r}: {body}")
        return [(s["metric"], float(s["value"][1])) for s in body["data"]["result"]]

    def value(self, expr):
        """The single value of `expr`; None when the result is empty."""
        result = self.query(expr)
        expect(len(result) <= 1, f"{expr!r}: more than one series: {result}")
        return result[0][1] if result else None

    def wait_for(self, expr, want, timeout_s=20.0):
        """Polls until `expr` equals `want` (a scrape after the last call has happened)."""
        deadline = time.monotonic() + timeout_s
        got = None
        while time.monotonic() < deadline:
            got = self.value(expr)
            if got == want:
                return
            time.sleep(0.25)
        raise AssertionError(f"{expr} = {got}, want {want} (waited {timeout_s} s)")

    def close(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class Ledger:
    """What the client sent and saw: the counters Prometheus must show."""

    def __init__(self):
        self.lock = threading.Lock()
        self.requests = {}  # (finish_reason, prefill_mode) -> n
        self.errors = {}  # code name -> n
        self.first_tokens = {"exact": 0, "ridgefill": 0}  # requests that got a token
        self.calls = 0

    def ok(self, finish, mode, got_token=True):
        with self.lock:
            key = (finish, mode)
            self.requests[key] = self.requests.get(key, 0) + 1
            self.first_tokens[mode] += 1 if got_token else 0
            self.calls += 1

    def error(self, code):
        with self.lock:
            self.errors[code.name] = self.errors.get(code.name, 0) + 1
            self.calls += 1

    def count(self, mode):
        return sum(n for (_, m), n in self.requests.items() if m == mode)


def request(ids, *, ridgefill=False, max_new_tokens=NEW_TOKENS, **kw):
    req = greedy_request(token_ids=ids, max_new_tokens=max_new_tokens, ignore_eos=True, **kw)
    if ridgefill:
        req.prefill.mode = pb.PrefillOptions.RIDGEFILL
        req.prefill.ridgefill.exact_tail_tokens = TAIL
    return req


def call(stub, req, stream):
    """(status code, final response or None, details)."""
    if stream:
        r = consume_stream(stub.GenerateStream(req, timeout=300))
        return r.code, r.final, r.details
    resp, code, details = run_unary(stub, req)
    return code, resp, details


def finish_label(value):
    return pb.FinishReason.Name(value).lower()


def main():
    checks = Checks("test_metrics")
    expect(os.path.exists(MAPS), f"RidgeFill maps {MAPS} not found (made by `make test`, or "
           "ridgeserve-calibrate; set RIDGESERVE_DEFAULT_MAPS)")
    text = license_text()
    online_dir = tempfile.mkdtemp(prefix="rs_metrics_online_")
    try:
        with Server(f"--ridgefill_maps={MAPS}", "--max_batch_tokens=512",
                    "--ridgefill_shadow_fraction=1", "--ridgefill_online_calibration",
                    f"--ridgefill_online_dir={online_dir}",
                    f"--ridgefill_online_resolve_rows={ONLINE_RESOLVE_ROWS}",
                    name="metrics") as srv:
            info = srv.info()
            expect(len(info.ridgefill_split_layers) > 0,
                   f"the server loaded no RidgeFill maps from {MAPS}")
            prom = Prometheus(f"127.0.0.1:{srv.metrics_port}")
            try:
                run_checks(checks, srv, prom, text)
            finally:
                prom.close()
    finally:
        shutil.rmtree(online_dir, ignore_errors=True)
    checks.finish()


def run_checks(checks, srv, prom, text):
    ledger = Ledger()
    short = [srv.tokenize(text[i * 400:i * 400 + 300]) for i in range(4)]
    long_ids = [srv.tokenize(text[20000 + i * 3000:20000 + i * 3000 + 1500]) for i in range(3)]
    print(f"short prompts {[len(p) for p in short]} tokens, long {[len(p) for p in long_ids]}")
    calls_total = ("sum(ridgeserve_requests_total) + sum(ridgeserve_request_errors_total)")
    sent = {"prompt": 0, "completion": 0, "itl": 0}

    def exact_phase():
        for i, ids in enumerate(short + short[:2]):
            code, resp, details = call(srv.stub, request(ids), stream=i >= 4)
            expect(code == SC.OK, f"exact {i}: {code.name} {details}")
            expect_eq(resp.finish_reason, FinishReason.LENGTH, f"exact {i} finish")
            ledger.ok("length", "exact")
            sent["prompt"] += len(ids)
            sent["completion"] += resp.usage.completion_tokens
            # One event per decode step: gaps = tokens - 1.
            sent["itl"] += resp.usage.completion_tokens - 1
        prom.wait_for(calls_total, ledger.calls)
        n = ledger.count("exact")
        for metric in ("time_to_first_token_seconds", "e2e_request_latency_seconds",
                       "request_queue_time_seconds", "request_prefill_time_seconds"):
            expect_eq(prom.value(f'ridgeserve_{metric}_count{{prefill_mode="exact"}}'), n,
                      f"{metric} count (exact)")
            expect_eq(prom.value(f'ridgeserve_{metric}_count{{prefill_mode="ridgefill"}}'), 0,
                      f"{metric} count (ridgefill)")
        expect_eq(prom.value('ridgeserve_requests_total{finish_reason="length",'
                             'prefill_mode="exact"}'), n, "requests_total length exact")
        expect_eq(prom.value("ridgeserve_prompt_tokens_total"), sent["prompt"], "prompt tokens")
        expect_eq(prom.value("ridgeserve_generation_tokens_total"), sent["completion"],
                  "generation tokens")
        expect_eq(prom.value('ridgeserve_inter_token_latency_seconds_count{prefill_mode="exact"}'),
                  sent["itl"], "ITL count (exact)")
        expect(prom.value('ridgeserve_time_to_first_token_seconds_sum{prefill_mode="exact"}') > 0,
               "TTFT sum is 0")
        # Exact requests save nothing.
        expect_eq(prom.value("ridgeserve_ridgefill_ttft_saved_seconds_count"), 0,
                  "saved seconds count after exact requests")
        expect_eq(prom.value("ridgeserve_ridgefill_ttft_saved_seconds_sum"), 0,
                  "saved seconds sum after exact requests")
        expect_eq(prom.value("ridgeserve_ridgefill_filled_tokens_total"), 0, "filled tokens")

    def ridgefill_phase():
        # shadow_rules_match_totals needs each split's shadow series scraped at 0 before its
        # first comparison: Prometheus's first scrape can come seconds after the server's.
        splits = len(srv.info().ridgefill_split_layers)
        prom.wait_for("count(ridgeserve_ridgefill_shadow_samples_total == 0)", splits)
        filled = 0
        for i, ids in enumerate(long_ids):
            code, resp, details = call(srv.stub, request(ids, ridgefill=True), stream=i == 2)
            expect(code == SC.OK, f"ridgefill {i}: {code.name} {details}")
            expect_eq(resp.finish_reason, FinishReason.LENGTH, f"ridgefill {i} finish")
            expect(resp.usage.filled_prompt_tokens > 0,
                   f"ridgefill {i}: no rows filled ({resp.usage})")
            expect(resp.timing.estimated_ttft_saved_seconds > 0,
                   f"ridgefill {i}: no saved seconds ({resp.timing})")
            ledger.ok("length", "ridgefill")
            filled += resp.usage.filled_prompt_tokens
        prom.wait_for(calls_total, ledger.calls)
        n = ledger.count("ridgefill")
        expect_eq(prom.value('ridgeserve_requests_total{finish_reason="length",'
                             'prefill_mode="ridgefill"}'), n, "requests_total length ridgefill")
        expect_eq(prom.value('ridgeserve_time_to_first_token_seconds_count'
                             '{prefill_mode="ridgefill"}'), n, "TTFT count (ridgefill)")
        expect_eq(prom.value("ridgeserve_ridgefill_ttft_saved_seconds_count"), n,
                  "saved seconds count")
        saved = prom.value("ridgeserve_ridgefill_ttft_saved_seconds_sum")
        print(f"RidgeFill: {filled} rows filled, {saved:.4f} s TTFT saved over {n} requests")
        expect(saved > 0, f"saved seconds sum {saved}")
        expect_eq(prom.value("ridgeserve_ridgefill_filled_tokens_total"), filled, "filled tokens")
        expect(prom.value("ridgeserve_ridgefill_skipped_layer_tokens_total") >= filled,
               "skipped layer-tokens below filled rows")
        # Every one is sampled (--ridgefill_shadow_fraction=1): compared with its exact shadow,
        # or dropped when the next request displaced it; the last one runs on an idle server.
        prom.wait_for("sum(ridgeserve_ridgefill_shadow_samples_total)"
                      " + sum(ridgeserve_ridgefill_shadow_dropped_total)", n, timeout_s=120)
        compared = prom.value("sum(ridgeserve_ridgefill_shadow_samples_total)")
        expect(compared >= 1, "no RIDGEFILL request was compared with its shadow")
        print(f"shadows: {compared:.0f} of {n} compared")

    def mixed_concurrent():
        # The stop string: a word of the greedy continuation of short[0].
        base, code, _ = run_unary(srv.stub, request(short[0], max_new_tokens=16))
        expect(code == SC.OK, "stop-string baseline failed")
        ledger.ok("length", "exact")
        words = re.findall(r"[A-Za-z]{3,}", base.text)
        expect(words, f"no word in the baseline {base.text!r}")
        stop = words[len(words) // 2]
        bad_top_p = request(short[1])
        bad_top_p.sampling.top_p = 1.5
        too_long = request(short[2], max_new_tokens=100_000)
        spec = request(short[3])
        spec.prefill.mode = pb.PrefillOptions.SPEC_KV
        plan = [
            ("exact", request(short[0]), False, SC.OK),
            ("exact", request(short[1]), True, SC.OK),
            ("exact", request(short[2]), False, SC.OK),
            ("exact", request(short[3]), True, SC.OK),
            ("ridgefill", request(long_ids[0], ridgefill=True), False, SC.OK),
            ("ridgefill", request(long_ids[1], ridgefill=True), True, SC.OK),
            ("exact", request(short[0], max_new_tokens=16, stop=[stop]), False, SC.OK),
            (None, bad_top_p, False, SC.INVALID_ARGUMENT),
            (None, bad_top_p, True, SC.INVALID_ARGUMENT),
            (None, too_long, False, SC.OUT_OF_RANGE),
            (None, too_long, True, SC.OUT_OF_RANGE),
            (None, spec, False, SC.FAILED_PRECONDITION),
            (None, spec, True, SC.FAILED_PRECONDITION),
        ]
        cancel_result = {}
        call_ = None

        def cancel_once_scraped(r):
            # Runs while this stream is generating: cancel it once a scrape has seen
            # a running request, so the gauge check below does not race the scrape.
            if not r.token_ids:
                return
            deadline = time.monotonic() + 20.0
            while (time.monotonic() < deadline and
                   (prom.value("max_over_time(ridgeserve_num_requests_running[1m])") or 0) < 1):
                time.sleep(0.2)
            call_.cancel()

        def cancelled_stream():
            # Cancelled by the client after its first token: finish_reason aborted.
            nonlocal call_
            call_ = srv.stub.GenerateStream(request(short[1], max_new_tokens=400), timeout=300)
            r = consume_stream(call_, on_message=cancel_once_scraped)
            cancel_result["code"] = r.code
            cancel_result["tokens"] = len(r.token_ids)

        fns = [(lambda p=p: call(srv.stub, p[1], p[2])) for p in plan]
        results = in_threads(fns + [cancelled_stream])
        for (mode, req, stream, want), (code, resp, details) in zip(plan, results):
            what = f"{mode or 'bad'} {'stream' if stream else 'unary'} want {want.name}"
            expect(code == want, f"{what}: got {code.name} {details}")
            if code == SC.OK:
                ledger.ok(finish_label(resp.finish_reason), mode)
            else:
                ledger.error(code)
        expect_eq(cancel_result.get("code"), SC.CANCELLED, "cancelled stream status")
        expect(cancel_result["tokens"] >= 1, "cancelled stream got no token")
        ledger.ok("aborted", "exact")
        expect(("stop_sequence", "exact") in ledger.requests,
               f"the stop string {stop!r} did not end its request: {ledger.requests}")
        # The cancelled request reaches its final event after the client has gone.
        prom.wait_for(calls_total, ledger.calls)
        for (finish, mode), n in sorted(ledger.requests.items()):
            expect_eq(prom.value(f'ridgeserve_requests_total{{finish_reason="{finish}",'
                                 f'prefill_mode="{mode}"}}'), n, f"requests_total {finish} {mode}")
        expect_eq(prom.value("sum(ridgeserve_requests_total)"), sum(ledger.requests.values()),
                  "requests_total over all labels")
        for mode, n in ledger.first_tokens.items():
            expect_eq(prom.value(f'ridgeserve_time_to_first_token_seconds_count'
                                 f'{{prefill_mode="{mode}"}}'), n, f"TTFT count {mode}")
            expect_eq(prom.value(f'ridgeserve_e2e_request_latency_seconds_count'
                                 f'{{prefill_mode="{mode}"}}'), ledger.count(mode),
                      f"E2E count {mode}")
        errors = {m["code"]: v for m, v in prom.query("ridgeserve_request_errors_total") if v}
        expect_eq(errors, {k: float(v) for k, v in ledger.errors.items()}, "errors by code")
        expect(prom.value("max_over_time(ridgeserve_num_requests_running[1m])") >= 1,
               "the running gauge was never above 0 under load")
        print(f"ledger: {ledger.requests} errors {ledger.errors}")

    def gauges_and_info():
        prom.wait_for("ridgeserve_num_requests_running", 0)
        idle = srv.stats()
        expect_eq(prom.value("ridgeserve_num_requests_waiting"), 0, "waiting when idle")
        used = idle.kv_cache_blocks_total - idle.kv_cache_blocks_free
        kv = prom.value("ridgeserve_kv_cache_usage_ratio")
        expect(abs(kv - used / idle.kv_cache_blocks_total) < 1e-9,
               f"KV usage {kv}, GetModelInfo says {used}/{idle.kv_cache_blocks_total}")
        expect_eq(prom.value("ridgeserve_num_preemptions_total"), idle.num_preemptions,
                  "preemptions")
        # Engine steps: every generated token came from a row of some step's forward pass, and
        # the steps' time (forward + host) fits in the time the server has been up.
        steps = prom.value("ridgeserve_engine_steps_total")
        rows = prom.value("ridgeserve_engine_step_rows_total")
        forward = prom.value('ridgeserve_engine_step_seconds_total{part="forward"}')
        host = prom.value('ridgeserve_engine_step_seconds_total{part="host"}')
        generated = prom.value("ridgeserve_generation_tokens_total")
        expect(steps >= 1 and rows >= generated, f"{steps} steps, {rows} rows for {generated} "
               "generated tokens")
        expect(forward > 0 and host > 0, f"step seconds: forward {forward}, host {host}")
        expect(forward + host <= time.monotonic() - srv.started,
               f"step seconds {forward} + {host} exceed the server's "
               f"{time.monotonic() - srv.started:.1f} s")
        print(f"engine: {steps:.0f} steps, {rows / steps:.1f} rows a step, host "
              f"{1e3 * host / steps:.2f} ms a step, forward {1e3 * forward / steps:.1f} ms")
        info = srv.info()
        labels = prom.query("ridgeserve_build_info")
        expect_eq(len(labels), 1, "build_info series")
        got = {k: v for k, v in labels[0][0].items() if k not in ("__name__", "job", "instance")}
        expect_eq(got["model"], info.model_name, "build_info model")
        expect_eq(got["backend"], info.backend, "build_info backend")
        expect_eq(got["tensor_parallel"], str(info.tensor_parallel), "build_info tensor_parallel")
        expect(re.fullmatch(r"\d+\.\d+\.\d+", got["version"]), f"build_info version {got}")
        expect_eq(labels[0][1], 1.0, "build_info value")

    def online_calibration():
        # Rows are offered on the engine thread before each answer and accumulated by a nice-19
        # thread after it: wait until each offered row is in the statistics or dropped.
        def drained():
            prom.wait_for("ridgeserve_ridgefill_online_offered_rows_total"
                          " - ridgeserve_ridgefill_online_rows"
                          " - ridgeserve_ridgefill_online_dropped_rows_total", 0, timeout_s=120)
            return prom.value("ridgeserve_ridgefill_online_rows")

        # The phases above offer about 330 rows (their shadow-exact prefills most), fewer when
        # shadows were dropped: exact prompts of text not sent before make up the rest.
        rows = drained()
        for i in range(8):
            if rows >= ONLINE_RESOLVE_ROWS:
                break
            ids = srv.tokenize(text[5000 + i * 1600:5000 + i * 1600 + 1500])
            code, _, details = call(srv.stub, request(ids), stream=False)
            expect(code == SC.OK, f"exact top-up {i}: {code.name} {details}")
            ledger.ok("length", "exact")
            rows = drained()
        offered = prom.value("ridgeserve_ridgefill_online_offered_rows_total")
        expect(rows >= ONLINE_RESOLVE_ROWS,
               f"{rows} of {offered} offered rows accumulated, a re-solve needs "
               f"{ONLINE_RESOLVE_ROWS}")
        # The re-solve (seconds at nice 19) starts once its rows are in.
        resolves = 'ridgeserve_ridgefill_online_resolves_total{result="ok"}'
        prom.wait_for(f"count({resolves} >= 1)", 1, timeout_s=120)
        ok = prom.value(resolves)
        expect_eq(prom.value('ridgeserve_ridgefill_online_resolves_total{result="failed"}'), 0,
                  "failed re-solves")
        # Each re-solve swaps its maps in as a map reload (before it counts itself).
        reloads = prom.value('ridgeserve_ridgefill_maps_reloads_total{result="ok"}')
        expect(reloads >= ok, f"{reloads} map reloads after {ok} re-solves")
        last = prom.value("ridgeserve_ridgefill_online_last_resolve_seconds")
        expect(last > 0, "last re-solve duration is 0 after a re-solve")
        expect(prom.value("ridgeserve_ridgefill_online_accumulate_seconds_total") > 0,
               "no accumulate time after accumulating rows")
        print(f"online calibration: {offered:.0f} rows offered, {rows:.0f} accumulated, "
              f"{ok:.0f} re-solve(s), the last {last:.2f} s")

    def shadow_rules_match_totals():
        # Every split's shadow series was scraped at 0 before its first comparison (see
        # ridgefill_phase), so the recording rules' 1 h rates count every comparison: their
        # ratios equal the totals'.
        totals = {}
        for name in ("kl_sum", "kl_count", "samples_total", "top1_agreement_total"):
            for labels, v in prom.query(f"ridgeserve_ridgefill_shadow_{name}"):
                totals.setdefault(labels["split_layer"], {})[name] = v
        want = {}
        for split, t in totals.items():
            if t["samples_total"] > 0:
                expect_eq(t["kl_count"], t["samples_total"], f"KL observations at split {split}")
                want[split] = (t["kl_sum"] / t["kl_count"],
                               t["top1_agreement_total"] / t["samples_total"], t["samples_total"])
        expect(want, f"no split layer was compared: {totals}")
        rules = ("job_split_layer:ridgeserve_ridgefill_shadow_kl:mean1h",
                 "job_split_layer:ridgeserve_ridgefill_shadow_top1_agreement:ratio1h",
                 "job_split_layer:ridgeserve_ridgefill_shadow_samples:increase1h")
        deadline = time.monotonic() + 30
        while True:
            got = {}
            for i, rule in enumerate(rules):
                for labels, v in prom.query(rule):
                    got.setdefault(labels["split_layer"], [None] * len(rules))[i] = v
            # increase() extrapolates to the evaluation time: up to a scrape interval more.
            close = all(split in got and None not in got[split]
                        and abs(got[split][0] - want[split][0]) <= 1e-9
                        and abs(got[split][1] - want[split][1]) <= 1e-9
                        and want[split][2] <= got[split][2] <= 1.1 * want[split][2]
                        for split in want)
            if close:
                break
            expect(time.monotonic() < deadline, f"shadow rules {got}, totals give {want}")
            time.sleep(0.25)
        print(f"shadow rules by split (mean KL, top-1, compared): {want}")

    def rules_and_dashboard():
        for mode in ("exact", "ridgefill"):
            prom.wait_for(f'count(job_prefill_mode:ridgeserve_time_to_first_token_seconds:p50_5m'
                          f'{{prefill_mode="{mode}"}} > 0)', 1)
        shadow_rules_match_totals()
        with open(DASHBOARD, encoding="utf-8") as f:
            dash = json.load(f)
        n = 0
        for p in dash["panels"]:
            for t in p["targets"]:
                expr = t["expr"].replace("$job", "ridgeserve").replace("$__rate_interval", "1m")
                result = prom.query(expr)
                expect(result, f"panel {p['title']!r} {t['refId']}: no data for {expr}")
                n += 1
        print(f"{n} dashboard queries returned data")

    def promtool_check_metrics():
        url = f"http://127.0.0.1:{srv.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as r:
            body = r.read()
        p = subprocess.run([PROMTOOL, "check", "metrics"], input=body, capture_output=True,
                           timeout=60)
        out = (p.stdout + p.stderr).decode()
        expect(p.returncode == 0 and not out.strip(), f"promtool check metrics: {out}")

    checks.run("exact requests counted by mode", exact_phase)
    checks.run("RidgeFill requests counted, saved seconds > 0", ridgefill_phase)
    checks.run("concurrent good and bad calls: every counter", mixed_concurrent)
    checks.run("engine gauges and build info", gauges_and_info)
    checks.run("online calibration: rows offered, accumulated, a re-solve", online_calibration)
    checks.run("recording rules and dashboard queries", rules_and_dashboard)
    checks.run("promtool check metrics", promtool_check_metrics)


if __name__ == "__main__":
    main()
