"""RidgeFill online calibration (--ridgefill_online_calibration) on the real ridgeserve.

Checks:
  * refused at start, with one line naming what is wrong: no base statistics (naming the file
    it looked for), a share outside [0, 1] (naming the flag), a corrupt checkpoint (naming it);
  * exact requests' prompt rows are taken, each position >= the sink tokens once
    (online rows + dropped rows == sum of (prompt - 4) over the exact prompts, prefix cache
    off), a RIDGEFILL request's rows are not; after
    --ridgefill_online_resolve_rows rows the maps are re-solved and swapped in: GetModelInfo's
    maps version goes up, its path is the online maps file, /metrics counts the re-solve, the
    checkpoint is written, RIDGEFILL is served on the new maps, and their checksum differs from
    the shipped maps';
  * SIGTERM checkpoints the rows taken since the last re-solve; a restart restores them
    (same row count), re-solves at once, and serves the re-solved maps.
"""

import os
import shutil
import signal
import subprocess
import tempfile

from rs_testlib import (MAPS, MODEL, SC, SERVER_BIN, Checks, Server, expect, expect_eq,
                        greedy_request, license_text, run_unary, scrape_metrics,
                        wait_for)

SINK = 4
RESOLVE_ROWS = 1024
SPLIT = 16


class State:
    tmp = tempfile.mkdtemp(prefix="rs_rf_online_")
    live = os.path.join(tmp, "live.rfmap")
    stats = os.path.join(tmp, "live.rfstats")
    online_dir = live + ".online"
    prompts: list[list[int]] = []
    rows_at_stop = 0


def online_args(*extra):
    return (f"--ridgefill_maps={State.live}", "--ridgefill_online_calibration",
            f"--ridgefill_online_resolve_rows={RESOLVE_ROWS}", "--ridgefill_online_row_stride=1",
            "--enable_prefix_caching=false", "--max_batch_tokens=256", *extra)


def ok(srv, req):
    resp, code, details = run_unary(srv.stub, req)
    expect(code == SC.OK, f"request failed: {code} {details}")
    return resp


def rows_and_dropped(srv):
    m = scrape_metrics(srv)
    return (m["ridgeserve_ridgefill_online_rows"],
            m["ridgeserve_ridgefill_online_dropped_rows_total"])


def offered(srv):
    """Rows the engine handed over: counted on the engine thread before a request's answer."""
    return scrape_metrics(srv)["ridgeserve_ridgefill_online_offered_rows_total"]


def drained(srv):
    """Rows accumulated + dropped once the queue is empty (== offered)."""
    want = offered(srv)
    wait_for("the queue to drain", lambda: sum(rows_and_dropped(srv)) == want, 120)
    return rows_and_dropped(srv)


def start_fails(*args):
    """Runs the server with `args`; returns its output after it exits nonzero."""
    p = subprocess.run([SERVER_BIN, f"--model={MODEL}", "--port=0", "--metrics_port=-1", *args],
                       capture_output=True, text=True, timeout=120)
    expect(p.returncode != 0, f"server started with {args}")
    return p.stdout + p.stderr


def check_refused_at_start():
    st = State
    out = start_fails(*online_args("--ridgefill_base_stats=" + st.tmp + "/missing.rfstats"))
    expect("missing.rfstats" in out, f"no line names the missing statistics: {out[-500:]!r}")
    out = start_fails(*online_args("--ridgefill_online_share=1.5"))
    expect("--ridgefill_online_share must be in [0, 1]" in out, f"output: {out[-500:]!r}")
    bad_dir = os.path.join(st.tmp, "bad_online")
    os.makedirs(bad_dir)
    with open(os.path.join(bad_dir, "stats.rfstats"), "wb") as f:
        f.write(b"RFSTATS\0" + b"\x01" * 100)
    out = start_fails(*online_args(f"--ridgefill_online_dir={bad_dir}"))
    expect(os.path.join(bad_dir, "stats.rfstats") in out,
           f"no line names the corrupt checkpoint: {out[-500:]!r}")


def check_learns_and_swaps(srv):
    st = State
    info = srv.info().ridgefill_maps
    expect_eq(info.version, 1, "version at start (the shipped maps)")
    expect_eq(info.path, st.live, "maps path at start")
    # The warm-up request (a few tokens) is the only exact request so far.
    warm_up = offered(srv)
    expect(warm_up <= 8, f"{warm_up} rows at start")
    text = license_text(60_000)
    ids = srv.tokenize(text, add_special_tokens=True)
    # A RIDGEFILL request first: none of its rows are taken.
    rf = greedy_request(token_ids=ids[:700], max_new_tokens=4, ignore_eos=True)
    rf.prefill.mode = rf.prefill.RIDGEFILL
    rf.prefill.ridgefill.split_layer = SPLIT
    rf.prefill.ridgefill.exact_tail_tokens = 64
    resp = ok(srv, rf)
    expect(resp.usage.filled_prompt_tokens > 0, "RIDGEFILL filled no rows")
    expect_eq(offered(srv), warm_up, "rows taken from a RIDGEFILL request")
    # Exact requests: every prompt position >= SINK once, until a re-solve.
    expected = warm_up
    for i in range(3):
        prompt = ids[i * 500:i * 500 + 480]
        st.prompts.append(prompt)
        ok(srv, greedy_request(token_ids=prompt, max_new_tokens=4, ignore_eos=True))
        expected += len(prompt) - SINK
        expect_eq(offered(srv), expected, f"rows offered after exact request {i}")
        # Nothing is lost between the queue and the statistics.
        expect_eq(sum(drained(srv)), expected, f"rows + dropped after exact request {i}")
    rows, dropped = rows_and_dropped(srv)
    print(f"online rows {rows:.0f}, dropped {dropped:.0f} of {expected}", flush=True)
    expect(rows >= RESOLVE_ROWS, f"only {rows} rows accumulated; the test needs a re-solve")
    # A re-solve swaps its maps in (version 2), then counts itself: wait for the count.
    wait_for("the re-solve counted",
             lambda: sum(scrape_metrics(srv).get(
                 f'ridgeserve_ridgefill_online_resolves_total{{result="{r}"}}', 0)
                 for r in ("ok", "failed")) >= 1, 180)
    info = srv.info().ridgefill_maps
    expect_eq(info.version, 2, "maps version after the re-solve")
    expect_eq(info.path, os.path.join(st.online_dir, "maps.rfmap"), "maps path after re-solve")
    m = scrape_metrics(srv)
    expect_eq(m['ridgeserve_ridgefill_online_resolves_total{result="ok"}'], 1, "resolves ok")
    expect_eq(m['ridgeserve_ridgefill_online_resolves_total{result="failed"}'], 0, "failed")
    expect_eq(m["ridgeserve_ridgefill_maps_version"], 2, "version gauge")
    expect(os.path.getsize(os.path.join(st.online_dir, "stats.rfstats")) > 0, "no checkpoint")
    resp = ok(srv, rf)
    expect(resp.usage.filled_prompt_tokens > 0, "RIDGEFILL on the re-solved maps filled no rows")
    print(f"re-solve took {m['ridgeserve_ridgefill_online_last_resolve_seconds']:.2f} s, "
          f"accumulating {m['ridgeserve_ridgefill_online_accumulate_seconds_total']:.2f} s "
          f"for {rows:.0f} rows", flush=True)
    # One more exact request after the re-solve: rows kept for the checkpoint at exit.
    prompt = ids[2000:2300]
    ok(srv, greedy_request(token_ids=prompt, max_new_tokens=4, ignore_eos=True))
    expected += len(prompt) - SINK
    expect_eq(offered(srv), expected, "rows offered after the last request")
    st.rows_at_stop = drained(srv)[0]


def check_checksum_differs(shipped_checksum, online_checksum):
    expect(shipped_checksum != online_checksum,
           "the re-solved maps have the shipped maps' checksum")


def check_restart_restores(srv):
    st = State
    wait_for("the restored rows' re-solve", lambda: srv.info().ridgefill_maps.version == 2, 180)
    rows, _ = rows_and_dropped(srv)
    # The restored rows, and this server's warm-up request's.
    expect(st.rows_at_stop <= rows <= st.rows_at_stop + 8,
           f"online rows after the restart: {rows}, {st.rows_at_stop} at the stop")
    info = srv.info().ridgefill_maps
    expect_eq(info.path, os.path.join(st.online_dir, "maps.rfmap"), "maps path after restart")
    with open(srv.log.name, encoding="utf-8", errors="replace") as f:
        log = f.read()
    expect(f"restored {int(st.rows_at_stop)} served rows" in log, "no 'restored' log line")


def main():
    st = State
    checks = Checks("ridgefill_online")
    base_stats = os.path.splitext(MAPS)[0] + ".rfstats"
    shutil.copyfile(MAPS, st.live)
    shutil.copyfile(base_stats, st.stats)
    checks.run("refused at start: missing statistics, bad share, corrupt checkpoint",
               check_refused_at_start)
    with Server(*online_args(), name="online") as srv:
        shipped = srv.info().ridgefill_maps.checksum
        if checks.run("exact rows taken once each, RIDGEFILL's not; re-solved and swapped in",
                      check_learns_and_swaps, srv):
            checks.run("the re-solved maps are not the shipped ones", check_checksum_differs,
                       shipped, srv.info().ridgefill_maps.checksum)
        srv.send_signal(signal.SIGTERM)
        expect_eq(srv.wait_exit(60), 0, "exit code after SIGTERM")
    with Server(*online_args(), name="restart") as srv:
        checks.run("restart: checkpointed rows restored and re-solved", check_restart_restores,
                   srv)
    shutil.rmtree(st.tmp, ignore_errors=True)
    checks.finish()


if __name__ == "__main__":
    main()
