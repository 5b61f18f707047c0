#!/usr/bin/env bash
# The server on one backend, as tests/gpu/run.sh checks it on a GPU (ctest server_check_cpu runs
# it on the CPU): greedy answers to six prompts sent one at a time, then all six at once, must be
# the same (batch invariance through the real server), the six at once must have run batched
# (fewer engine steps than twice one request's), and /metrics must count exactly the tokens
# served.
#   tests/gpu/server_check.sh BIN_DIR BACKEND MODEL [OUT_DIR]
# Prints one summary line; exit 0 when every check holds.
set -uo pipefail
BIN=$1 BACKEND=$2 MODEL=$3 OUT=${4:-$(mktemp -d)}
mkdir -p "$OUT"
LOG="$OUT/server_$BACKEND.log"
# Ports the system picks (0), read back from the server's log: no clash with other servers.
"$BIN/ridgeserve" --backend "$BACKEND" --model "$MODEL" --host 127.0.0.1 --port 0 \
  --metrics_port 0 --max_running_requests 8 >"$LOG" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null' EXIT
PORT="" METRICS=""
cli() { "$BIN/ridgeserve-cli" --target "127.0.0.1:$PORT" "$@"; }
for _ in $(seq 120); do
  PORT=$(sed -n 's/.*listening on 127\.0\.0\.1:\([0-9]*\).*/\1/p' "$LOG" | head -1)
  METRICS=$(sed -n 's|.*metrics on http://127\.0\.0\.1:\([0-9]*\)/metrics.*|\1|p' "$LOG" | head -1)
  [ -n "$PORT" ] && cli health >/dev/null 2>&1 && break
  kill -0 $SERVER 2>/dev/null || { echo "server $BACKEND: did not start: $(tail -1 "$LOG")"; exit 1; }
  sleep 1
done
cli health >/dev/null 2>&1 || { echo "server $BACKEND: not healthy after 120 s"; exit 1; }
PROMPTS=("The capital of France is" "List three prime numbers:" "Once upon a time, in a small"
         "The GNU General Public License is" "def fibonacci(n):" "Water boils at")
answer() { cli generate --temperature 0 --max_new_tokens 40 --ignore_eos --prompt "$1"; }
# One value of /metrics, read over bash's /dev/tcp (no curl on every image).
metric() {
  timeout 10 bash -c "exec 3<>/dev/tcp/127.0.0.1/$METRICS &&
    printf 'GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3 && cat <&3" |
    awk -v name="$1" '$1 == name {print int($2)}'
}
for i in "${!PROMPTS[@]}"; do answer "${PROMPTS[$i]}" >"$OUT/solo_$i.txt" 2>"$OUT/solo_$i.err"; done
steps_before=$(metric ridgeserve_engine_steps_total)
clients=()
for i in "${!PROMPTS[@]}"; do
  answer "${PROMPTS[$i]}" >"$OUT/batched_$i.txt" 2>"$OUT/batched_$i.err" &
  clients+=($!)
done
wait "${clients[@]}"
steps=$(($(metric ridgeserve_engine_steps_total) - ${steps_before:-0}))
same=0
for i in "${!PROMPTS[@]}"; do
  if [ -s "$OUT/solo_$i.txt" ] && cmp -s "$OUT/solo_$i.txt" "$OUT/batched_$i.txt"; then
    same=$((same + 1))
  else
    echo "  prompt $i: solo '$(head -c 120 "$OUT/solo_$i.txt")' vs batched '$(head -c 120 "$OUT/batched_$i.txt")'"
  fi
done
tokens=$(metric ridgeserve_generation_tokens_total)  # 12 requests x 40 (warm-up is not counted)
want=$((2 * ${#PROMPTS[@]} * 40))
echo "server $BACKEND: $same/${#PROMPTS[@]} batched answers equal the solo ones, in $steps engine" \
  "steps (one request alone takes 41); /metrics counts ${tokens:-no} generated tokens (want $want)"
[ "$same" -eq "${#PROMPTS[@]}" ] && [ "$steps" -lt 82 ] && [ "${tokens:-0}" -eq "$want" ]
