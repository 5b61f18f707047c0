"""RidgeFill maps that arrive and change while the real ridgeserve serves (--ridgefill_maps).

Checks:
  * serve first, calibrate beside it: a server whose map file is not there yet serves exact
    requests; RIDGEFILL gets FAILED_PRECONDITION saying the maps are being calibrated with the
    progress from FILE.progress (hand-written first, then the real scripts/make_maps.sh
    running beside the server); GetModelInfo and /metrics say "calibrating"; when the script
    renames the file into place the server loads it and the same request succeeds;
  * SIGHUP with a new valid file bumps the version in GetModelInfo and /metrics; a request in
    flight across the swap completes, with the tokens it gives on the old maps alone;
  * SIGHUP with a corrupt file: one log line, version unchanged, RIDGEFILL still served with
    the maps in use (same tokens as before);
  * Admin.ReloadRidgeFillMaps (--admin_token_file): answers when the reload is done, with the
    new version and checksum in the response; a corrupt file gets FAILED_PRECONDITION with the
    log's one line, the maps in use kept; no token: UNAUTHENTICATED;
  * the prefix cache: a prompt filled under version A is not reused under version B (its
    repeat under B is).
Map B is the one make_maps.sh calibrates here on few tokens (other maps than the default A).
"""

import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.request

from rs_testlib import (BIN_DIR, MAPS, MODEL, SC, SOURCE_DIR, Checks, Server, call_code,
                        consume_stream, expect, expect_eq, greedy_request, license_text, pb,
                        pb_grpc, run_unary, wait_for)

ADMIN_TOKEN = "rs-test-admin-reload-0123456789"
SPLIT = 16  # in the default maps and in map B
B_SPLITS = "16,22"
B_TOKENS = 2048


def ridgefill_request(token_ids, tail=32, new_tokens=12):
    req = greedy_request(token_ids=token_ids, max_new_tokens=new_tokens, ignore_eos=True)
    req.prefill.mode = req.prefill.RIDGEFILL
    req.prefill.ridgefill.exact_tail_tokens = tail
    req.prefill.ridgefill.split_layer = SPLIT
    return req


def ok(srv, req):
    resp, code, details = run_unary(srv.stub, req)
    expect(code == SC.OK, f"request failed: {code} {details}")
    return resp


def metrics(srv) -> str:
    url = f"http://127.0.0.1:{srv.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


def metric(text: str, name: str, labels: str = "") -> float:
    m = re.search(rf"^{re.escape(name + labels)} (\S+)$", text, re.M)
    expect(m is not None, f"/metrics has no {name}{labels}")
    return float(m.group(1))


def maps_info(srv):
    return srv.info().ridgefill_maps


def replace_file(src, dst):
    """As a deploy would: write beside, then rename over (atomic)."""
    tmp = dst + ".new"
    shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


def log_lines(srv, pattern):
    with open(srv.log.name, encoding="utf-8", errors="replace") as f:
        return [line for line in f if pattern in line]


class State:
    tmp = tempfile.mkdtemp(prefix="rs_rf_reload_")
    maps_b = os.path.join(tmp, "calibrated", "maps.rfmap")
    prompt: list[int] = []


def check_serve_first(srv):
    st = State
    info = maps_info(srv)
    expect_eq(pb.RidgeFillMapsInfo.State.Name(info.state), "CALIBRATING", "state")
    expect_eq(info.version, 0, "version before any maps")
    expect_eq(list(srv.info().ridgefill_split_layers), [], "split layers before any maps")
    _, code, details = run_unary(srv.stub, ridgefill_request(st.prompt))
    expect_eq(code, SC.FAILED_PRECONDITION, "RIDGEFILL before the maps")
    expect("waiting for" in details and st.maps_b in details, f"message: {details!r}")
    exact = ok(srv, greedy_request(token_ids=st.prompt, max_new_tokens=8, ignore_eos=True))
    expect_eq(len(exact.token_ids), 8, "exact request served while waiting")

    # Progress, as the calibrator writes it.
    with open(st.maps_b + ".progress", "w") as f:
        f.write("make_maps: calibrating\ncalibrate: 1024/4096 tokens, 150.0 tokens/s, 7 s\n")
    def refusal_with_progress():
        _, code, details = run_unary(srv.stub, ridgefill_request(st.prompt))
        return details if code == SC.FAILED_PRECONDITION and "1024/4096" in details else None

    details = wait_for("progress in the message", refusal_with_progress, timeout_s=10)
    expect("being calibrated" in details and "(25%)" in details, f"message: {details!r}")
    m = metrics(srv)
    expect_eq(metric(m, "ridgeserve_ridgefill_maps_state", '{state="calibrating"}'), 1, "gauge")
    expect_eq(metric(m, "ridgeserve_ridgefill_maps_state", '{state="loaded"}'), 0, "gauge")
    expect_eq(metric(m, "ridgeserve_ridgefill_calibration_progress_ratio"), 0.25, "progress")
    info = maps_info(srv)
    expect_eq((info.calibrated_tokens, info.calibration_tokens), (1024, 4096), "info progress")

    # The real script beside the server: progress from the calibrator, then the file.
    script = os.path.join(SOURCE_DIR, "scripts", "make_maps.sh")
    build_dir = os.path.dirname(BIN_DIR)
    proc = subprocess.Popen([script, build_dir, MODEL, st.maps_b, B_SPLITS, str(B_TOKENS)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = []
    t0 = time.monotonic()
    while proc.poll() is None or maps_info(srv).state != pb.RidgeFillMapsInfo.LOADED:
        expect(time.monotonic() - t0 < 600, "calibration took over 600 s")
        resp, code, details = run_unary(srv.stub, ridgefill_request(st.prompt))
        if code == SC.OK:
            break
        expect_eq(code, SC.FAILED_PRECONDITION, f"RIDGEFILL while calibrating ({details})")
        if f"/{B_TOKENS} tokens" in details:
            seen.append(details)
        if proc.poll() is not None and proc.returncode != 0:
            raise AssertionError(f"make_maps.sh failed: {proc.stdout.read()}")
        time.sleep(0.3)
    proc.wait()
    expect_eq(proc.returncode, 0, "make_maps.sh")
    print(f"calibration beside the server: {time.monotonic() - t0:.1f} s; "
          f"{len(seen)} progress message(s), e.g. {seen[:1]}", flush=True)
    expect(seen, f"no RIDGEFILL refusal showed the calibrator's /{B_TOKENS} progress")
    expect(not os.path.exists(st.maps_b + ".progress"), "progress file left after success")
    wait_for("maps loaded", lambda: maps_info(srv).state == pb.RidgeFillMapsInfo.LOADED, 30)
    info = maps_info(srv)
    expect_eq(info.version, 1, "version after the file appeared")
    expect(len(info.checksum) == 16, f"checksum {info.checksum!r}")
    resp = ok(srv, ridgefill_request(st.prompt))
    expect(resp.usage.filled_prompt_tokens > 0, "RIDGEFILL after the maps appeared fills rows")
    m = metrics(srv)
    expect_eq(metric(m, "ridgeserve_ridgefill_maps_state", '{state="loaded"}'), 1, "gauge")
    expect_eq(metric(m, "ridgeserve_ridgefill_maps_version"), 1, "version gauge")


def check_hot_reload(srv, live):
    st = State
    expect(os.path.exists(st.maps_b), "map B was not calibrated (previous check failed)")
    info = maps_info(srv)
    expect_eq(info.version, 1, "start version")
    checksum_a = info.checksum
    long_req = ridgefill_request(st.prompt, tail=32, new_tokens=48)
    ref = ok(srv, long_req)
    expect(ref.usage.filled_prompt_tokens > 0, "reference fills rows")

    # A request in flight (prefilling in small chunks) while the maps are swapped.
    result = {}

    def stream():
        result["r"] = consume_stream(srv.stub.GenerateStream(long_req, timeout=300))

    # The reference request out of the engine's stats first, then the in-flight one in them.
    wait_for("the reference request done",
             lambda: (lambda s: s.num_requests_running + s.num_requests_waiting == 0)(srv.stats()),
             60, 0.01)
    t = threading.Thread(target=stream)
    t.start()
    # The server took its maps when it accepted the call, before the engine counts it.
    wait_for("the request in the engine",
             lambda: (lambda s: s.num_requests_running + s.num_requests_waiting >= 1)(srv.stats()),
             60, 0.01)
    replace_file(st.maps_b, live)
    t_signal = time.monotonic()
    srv.send_signal(signal.SIGHUP)
    wait_for("version 2", lambda: maps_info(srv).version == 2, 60, 0.05)
    t_swapped = time.monotonic()
    t.join(300)
    r = result["r"]
    expect_eq(r.code, SC.OK, f"in-flight request: {r.describe()}")
    expect_eq(pb.FinishReason.Name(r.finish_reason), "LENGTH", "in-flight finish")
    expect_eq(r.token_ids, list(ref.token_ids), "in-flight request's tokens (old maps)")
    first = r.first_token_time
    print(f"swap {t_swapped - t_signal:.2f} s after SIGHUP; the in-flight request's first token "
          f"came {'after' if first and first > t_swapped else 'before'} the swap", flush=True)
    info = maps_info(srv)
    expect(info.checksum != checksum_a, "checksum did not change")
    expect_eq(info.reloads_ok, 1, "reloads_ok")
    under_b = ok(srv, long_req)
    differ = list(under_b.token_ids) != list(ref.token_ids)
    print(f"same request under B: tokens {'differ' if differ else 'equal'}", flush=True)

    # A corrupt file: refused in one line, B stays.
    lines_before = len(log_lines(srv, "reload refused"))
    with open(st.maps_b, "rb") as f:
        data = bytearray(f.read())
    data[len(data) // 2] ^= 0xFF
    bad = os.path.join(st.tmp, "bad.rfmap")
    with open(bad, "wb") as f:
        f.write(data)
    replace_file(bad, live)
    srv.send_signal(signal.SIGHUP)
    wait_for("reload refused", lambda: maps_info(srv).reloads_refused == 1, 30)
    time.sleep(0.3)
    lines = log_lines(srv, "reload refused")
    expect_eq(len(lines) - lines_before, 1, f"log lines for the refused file: {lines}")
    expect("checksum mismatch" in lines[-1] and live in lines[-1], f"log line: {lines[-1]!r}")
    info = maps_info(srv)
    expect_eq((info.version, pb.RidgeFillMapsInfo.State.Name(info.state)), (2, "LOADED"),
              "after the refused file")
    again = ok(srv, long_req)
    expect_eq(list(again.token_ids), list(under_b.token_ids), "RIDGEFILL on the kept maps")
    m = metrics(srv)
    expect_eq(metric(m, "ridgeserve_ridgefill_maps_version"), 2, "version gauge")
    expect_eq(metric(m, "ridgeserve_ridgefill_maps_reloads_total", '{result="ok"}'), 1, "ok")
    expect_eq(metric(m, "ridgeserve_ridgefill_maps_reloads_total", '{result="refused"}'), 1,
              "refused")


def check_admin_reload(srv, live):
    st = State
    admin = pb_grpc.AdminStub(srv.channel)

    def reload(metadata=(("authorization", f"Bearer {ADMIN_TOKEN}"),)):
        return admin.ReloadRidgeFillMaps(pb.ReloadRidgeFillMapsRequest(), timeout=60,
                                         metadata=metadata)

    before = maps_info(srv)
    expect_eq((before.version, pb.RidgeFillMapsInfo.State.Name(before.state)), (2, "LOADED"),
              "start (after the SIGHUP checks)")
    code, details = call_code(lambda: reload(()))
    expect(code == SC.UNAUTHENTICATED and "--admin_token_file" in details,
           f"without a token: {code.name} {details!r}")
    # `live` is still the corrupt file: refused, with the log's line, and B stays.
    lines_before = len(log_lines(srv, "reload refused"))
    code, details = call_code(reload)
    expect_eq(code, SC.FAILED_PRECONDITION, f"corrupt file: {details!r}")
    expect("reload refused, keeping version 2" in details and "checksum mismatch" in details,
           f"corrupt file's message: {details!r}")
    time.sleep(0.3)
    lines = log_lines(srv, "reload refused")
    expect_eq(len(lines) - lines_before, 1, f"log lines for the refused file: {lines}")
    expect_eq(maps_info(srv).version, 2, "version after the refused file")
    # A good file: the answer comes when the maps are in use, no polling.
    replace_file(MAPS, live)
    t0 = time.monotonic()
    info = reload()
    elapsed = time.monotonic() - t0
    expect_eq((info.version, pb.RidgeFillMapsInfo.State.Name(info.state)), (3, "LOADED"),
              "the reload's answer")
    expect(info.checksum != before.checksum, "checksum did not change")
    expect_eq(maps_info(srv).checksum, info.checksum, "GetModelInfo right after the answer")
    expect_eq((info.reloads_ok, info.reloads_refused), (before.reloads_ok + 1,
              before.reloads_refused + 1), "reload counts")
    resp = ok(srv, ridgefill_request(st.prompt, tail=32, new_tokens=4))
    expect(resp.usage.filled_prompt_tokens > 0, "RIDGEFILL on the reloaded maps fills rows")
    print(f"Admin.ReloadRidgeFillMaps answered in {elapsed:.2f} s with version {info.version}",
          flush=True)


def check_prefix_cache_versions(srv, live):
    st = State
    expect(os.path.exists(st.maps_b), "map B was not calibrated (previous check failed)")
    req = ridgefill_request(st.prompt, tail=32, new_tokens=4)
    ok(srv, req)
    a_again = ok(srv, req)
    expect(a_again.usage.cached_prompt_tokens > 0, "repeat under A missed the cache (control)")
    replace_file(st.maps_b, live)
    srv.send_signal(signal.SIGHUP)
    wait_for("version 2", lambda: maps_info(srv).version == 2, 60, 0.05)
    b = ok(srv, req)
    expect_eq(b.usage.cached_prompt_tokens, 0, "request under B reused blocks filled under A")
    b_again = ok(srv, req)
    expect(b_again.usage.cached_prompt_tokens > 0, "repeat under B missed the cache")


def main():
    st = State
    checks = Checks("ridgefill_reload")
    os.makedirs(os.path.dirname(st.maps_b))
    text = license_text(20_000)
    with Server(f"--ridgefill_maps={st.maps_b}", "--max_batch_tokens=128",
                "--enable_prefix_caching=false", name="calibrating") as srv:
        st.prompt = srv.tokenize(text, add_special_tokens=True)[:900]
        checks.run("serve first: exact now, RIDGEFILL with progress, then loaded",
                   check_serve_first, srv)

    live = os.path.join(st.tmp, "live.rfmap")
    shutil.copyfile(MAPS, live)
    admin_tokens = os.path.join(st.tmp, "admin.tokens")
    with open(admin_tokens, "w") as f:
        f.write(ADMIN_TOKEN + "\n")
    with Server(f"--ridgefill_maps={live}", "--max_batch_tokens=64",
                "--enable_prefix_caching=false", f"--admin_token_file={admin_tokens}",
                name="reload") as srv:
        checks.run("SIGHUP: new version, in-flight request done on the old maps, bad file refused",
                   check_hot_reload, srv, live)
        checks.run("Admin.ReloadRidgeFillMaps: answers with the new version, refuses a bad file",
                   check_admin_reload, srv, live)

    shutil.copyfile(MAPS, live)
    with Server(f"--ridgefill_maps={live}", name="prefix") as srv:
        checks.run("prefix cache: A's filled blocks are not reused under B",
                   check_prefix_cache_versions, srv, live)
    shutil.rmtree(st.tmp, ignore_errors=True)
    checks.finish()


if __name__ == "__main__":
    main()
