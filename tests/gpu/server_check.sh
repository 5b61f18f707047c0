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
# shellcheck source=tests/gpu/server_lib.sh
source "$(dirname "$0")/server_lib.sh"
start_server "$BIN" "$BACKEND" "$MODEL" "$OUT/server_$BACKEND.log" --max_running_requests 8
PROMPTS=("The capital of France is" "List three prime numbers:" "Once upon a time, in a small"
         "The GNU General Public License is" "def fibonacci(n):" "Water boils at")
answer() { cli generate --temperature 0 --max_new_tokens 40 --ignore_eos --prompt "$1"; }
for i in "${!PROMPTS[@]}"; do answer "${PROMPTS[$i]}" >"$OUT/solo_$i.txt" 2>"$OUT/solo_$i.err"; done
steps_before=$(metric ridgeserve_engine_steps_total)
clients=()
for i in "${!PROMPTS[@]}"; do
  answer "${PROMPTS[$i]}" >"$OUT/batched_$i.txt" 2>"$OUT/batched_$i.err" &
  clients+=($!)
done
wait "${clients[@]}"
steps_after=$(metric ridgeserve_engine_steps_total)
same=0
for i in "${!PROMPTS[@]}"; do
  if [ -s "$OUT/solo_$i.txt" ] && cmp -s "$OUT/solo_$i.txt" "$OUT/batched_$i.txt"; then
    same=$((same + 1))
  else
    echo "  prompt $i: solo '$(head -c 120 "$OUT/solo_$i.txt")' vs batched '$(head -c 120 "$OUT/batched_$i.txt")'"
  fi
done
tokens=$(metric ridgeserve_generation_tokens_total)  # 12 requests x 40 (warm-up is not counted)
for v in "$steps_before" "$steps_after" "$tokens"; do
  [ "$v" != - ] || { echo "server $BACKEND: /metrics lacks a series it must have"; exit 1; }
done
steps=$((${steps_after%.*} - ${steps_before%.*}))
tokens=${tokens%.*}
want=$((2 * ${#PROMPTS[@]} * 40))
echo "server $BACKEND: $same/${#PROMPTS[@]} batched answers equal the solo ones, in $steps engine" \
  "steps (one request alone takes 41); /metrics counts ${tokens:-no} generated tokens (want $want)"
[ "$same" -eq "${#PROMPTS[@]}" ] && [ "$steps" -gt 0 ] && [ "$steps" -lt 82 ] &&
  [ "$tokens" -eq "$want" ]
