#!/usr/bin/env bash
# Host time per decode step at batch 64 (issue #11's report), as tests/gpu/run.sh measures it on
# a GPU (ctest host_time_cpu runs it on the CPU): 64 requests of 64 prompt tokens, decoding
# OUTPUT tokens each at once (ridgeserve-loadtest, closed loop), and two scrapes of
# ridgeserve_engine_step_seconds_total WINDOW seconds apart while all 64 decode: the engine
# thread's own time a step (part="host": scheduling, the batch, handing tokens to their calls)
# against the forward passes' (part="forward", sampling included).
#   tests/gpu/host_time.sh BIN_DIR BACKEND MODEL [OUT_DIR ("": a temporary one)] [OUTPUT_TOKENS]
#     [WINDOW_S]
# Prints one summary line; exit 0 when the window held decode steps of 64 rows.
set -uo pipefail
BIN=$1 BACKEND=$2 MODEL=$3 OUT=${4:-} OUTPUT=${5:-2048} WINDOW=${6:-1}
[ -n "$OUT" ] || OUT=$(mktemp -d)
mkdir -p "$OUT"
# The prompts' text: real prose (the README where the image has no license texts).
TEXT=/usr/share/common-licenses/GPL-3
[ -f "$TEXT" ] || TEXT="$(dirname "$0")/../../README.md"
# shellcheck source=tests/gpu/server_lib.sh
source "$(dirname "$0")/server_lib.sh"
start_server "$BIN" "$BACKEND" "$MODEL" "$OUT/host_time_$BACKEND.log" \
  --max_running_requests 64 --max_batch_tokens 4096
"$BIN/ridgeserve-loadtest" --target "127.0.0.1:$PORT" --concurrency 64 --num_requests 64 \
  --warmup_requests 0 --prompt_tokens fixed:64 --output_tokens "fixed:$OUTPUT" --text "$TEXT" \
  >"$OUT/host_time_loadtest.txt" 2>&1 &
LOADTEST=$!
scrape() {  # steps, rows, host seconds, forward seconds, running: one engine snapshot
  metrics ridgeserve_engine_steps_total ridgeserve_engine_step_rows_total \
    'ridgeserve_engine_step_seconds_total{part="host"}' \
    'ridgeserve_engine_step_seconds_total{part="forward"}' ridgeserve_num_requests_running
}
# The window opens once all 64 requests run and the engine's steps are 64 rows each, over two
# steps at least: 64 decode rows (a prompt's prefill also takes 64 rows, but not with the other
# 63 running) ...
for _ in $(seq 300); do
  read -r s_a r_a _ _ n_a <<<"$(scrape)"
  sleep 0.2
  read -r s_b r_b _ _ n_b <<<"$(scrape)"
  awk -v s="$s_a" -v t="$s_b" -v r="$r_a" -v q="$r_b" -v m="$n_a" -v n="$n_b" \
    'BEGIN { exit (m + 0 == 64 && n + 0 == 64 && t - s >= 2 && q - r == 64 * (t - s)) ? 0 : 1 }' &&
    break
  kill -0 $LOADTEST 2>/dev/null || break
done
read -r steps0 rows0 host0 forward0 running0 <<<"$(scrape)"
sleep "$WINDOW"
# ... and closes with all 64 still decoding.
read -r steps1 rows1 host1 forward1 running1 <<<"$(scrape)"
wait $LOADTEST
awk -v b="$BACKEND" -v s0="$steps0" -v s1="$steps1" -v r0="$rows0" -v r1="$rows1" \
  -v h0="$host0" -v h1="$host1" -v f0="$forward0" -v f1="$forward1" \
  -v a="${running0:-0}" -v z="${running1:-0}" 'BEGIN {
  steps = s1 - s0
  if (steps < 1 || a + 0 != 64 || z + 0 != 64) {
    printf "host time %s: no window of 64 decoding requests (%d steps, running %s then %s)\n",
      b, steps, a, z
    exit 1
  }
  rows = (r1 - r0) / steps
  printf "host time %s at batch 64: %.3f ms a step (forward %.3f ms), %.1f rows a step, %d steps\n",
    b, 1000 * (h1 - h0) / steps, 1000 * (f1 - f0) / steps, rows, steps
  exit rows == 64 ? 0 : 1
}'
