#!/usr/bin/env bash
# Runs every fuzz target: first each seed file once (regressions: any crash fails),
# then a short fuzzing run from the corpus (new inputs go to BUILD/fuzz-corpus/<target>, never
# into the seeds; crashes to BUILD/fuzz-artifacts/).
#
# usage: tests/fuzz/run_fuzzers.sh BUILD_DIR [SECONDS_PER_TARGET (default 20)] [TARGET...]
set -euo pipefail
cd "$(dirname "$0")/../.."
build=$1
seconds=${2:-20}
shift $(($# < 2 ? $# : 2))
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(gguf safetensors tokenizer_json tokenizer map_file stats_file request_validation
    stop_matcher)
fi
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
mkdir -p "$build/fuzz-artifacts"
for t in "${targets[@]}"; do
  bin="$build/bin/${t}_fuzzer"
  # Seeds made by tests/fuzz/make_seeds.py (make test-fuzz writes them to BUILD/fuzz-seeds).
  corpus="$build/fuzz-seeds/$t"
  # Inputs of crashes found and fixed, kept by hand.
  if [ -d "tests/fuzz/regressions/$t" ]; then cp tests/fuzz/regressions/"$t"/* "$corpus"/; fi
  work="$build/fuzz-corpus/$t"
  mkdir -p "$work"
  start=$(date +%s)
  # Regressions: every seed once.
  "$bin" -runs=1 "$corpus"/* > "$build/fuzz-artifacts/$t.regressions.log" 2>&1 ||
    { tail -50 "$build/fuzz-artifacts/$t.regressions.log"; echo "FAIL: $t regressions"; exit 1; }
  # A short run from the corpus; -timeout and -rss_limit_mb turn hangs and blow-ups into
  # failures too.
  if [ "$seconds" -gt 0 ]; then
    "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
      -artifact_prefix="$build/fuzz-artifacts/$t-" "$work" "$corpus" \
      > "$build/fuzz-artifacts/$t.log" 2>&1 ||
      { tail -60 "$build/fuzz-artifacts/$t.log"; echo "FAIL: $t (crash input in $build/fuzz-artifacts/)"; exit 1; }
  fi
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$build/fuzz-artifacts/$t.log" 2>/dev/null | grep -o '[0-9]*$' || echo 0)
  cov=$(grep -o 'cov: [0-9]*' "$build/fuzz-artifacts/$t.log" 2>/dev/null | tail -1 || true)
  echo "fuzz $t: $(ls "$corpus" | wc -l) seeds ok, ${execs} executions in ${seconds} s, ${cov:-cov: n/a}, $(($(date +%s) - start)) s"
done
