# shellcheck shell=bash
# Helpers for the scripts that start a server on one backend (server_check.sh, host_time.sh);
# sourced, not run. start_server BIN BACKEND MODEL LOG [FLAGS...] starts it on ports the system
# picks (read back from its log: no clash with other servers), waits until it is healthy and
# sets SERVER (its pid), PORT and METRICS; on failure it prints one line and exits 1. The
# server is killed when the script exits.
start_server() {
  local bin=$1 backend=$2 model=$3 log=$4
  shift 4
  BIN=$bin
  "$bin/ridgeserve" --backend "$backend" --model "$model" --host 127.0.0.1 --port 0 \
    --metrics_port 0 "$@" >"$log" 2>&1 &
  SERVER=$!
  trap 'kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null' EXIT
  PORT="" METRICS=""
  for _ in $(seq 120); do
    PORT=$(sed -n 's/.*listening on 127\.0\.0\.1:\([0-9]*\).*/\1/p' "$log" | head -1)
    METRICS=$(sed -n 's|.*metrics on http://127\.0\.0\.1:\([0-9]*\)/metrics.*|\1|p' "$log" | head -1)
    [ -n "$PORT" ] && cli health >/dev/null 2>&1 && return 0
    kill -0 $SERVER 2>/dev/null || { echo "server $backend: did not start: $(tail -1 "$log")"; exit 1; }
    sleep 1
  done
  cli health >/dev/null 2>&1 || { echo "server $backend: not healthy after 120 s"; exit 1; }
}

cli() { "$BIN/ridgeserve-cli" --target "127.0.0.1:$PORT" "$@"; }

# One series of /metrics (`name` or `name{labels}` as printed) in fixed point (six decimals;
# ${value%.*} is its integer part), read over bash's /dev/tcp (no curl on every image); `-` when
# absent.
metric() { metrics "$1"; }

# Several series from ONE scrape (one engine snapshot), space separated in the order given,
# `-` for a series that is absent.
metrics() {
  timeout 10 bash -c "exec 3<>/dev/tcp/127.0.0.1/$METRICS &&
    printf 'GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3 && cat <&3" |
    awk -v names="$*" 'BEGIN { n = split(names, want, " ") }
      { value[$1] = $2 }
      END {
        for (i = 1; i <= n; i++) {
          printf "%s%s", (i > 1 ? " " : ""), (want[i] in value ? sprintf("%.6f", value[want[i]]) : "-")
        }
        printf "\n"
      }'
}
