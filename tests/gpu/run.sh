#!/usr/bin/env bash
# The GPU session's one script (a lent H200: 16 cores, ~139 GiB, no network; < 8 minutes).
# From the repository root:  tests/gpu/run.sh [OUT_DIR]   (default: $OUT, else /tmp/ridgeserve-gpu-out)
#
#  1. Build. Configure build-gpu with CUDA (Release, CMAKE_CUDA_ARCHITECTURES=90) and build only
#     the GPU tests and cuda_bench with -j16. If the machine's image lacks the project's
#     libraries (absl, GTest, OpenBLAS, ...: the configure fails), the binaries prebuilt on a
#     development machine by tests/gpu/prepare_prebuilt.sh are used from gpu-prebuilt/ (carry
#     that folder) with its libraries on LD_LIBRARY_PATH; USE_PREBUILT=1 goes there directly.
#  2. Tests: every GPU test binary (ops vs CPU, batch invariance, the default model vs CPU, NCCL
#     with one rank, the registry, the planner), each binary whole, again past a test that ends
#     its process (a device fault: that test runs once more alone with
#     RIDGESERVE_CUDA_SYNC_LAUNCHES=1, naming the kernel) or hangs; pass / fail / skip counts per
#     binary. If the tensor-core attention's tests fail, what follows runs with
#     RIDGESERVE_CUDA_ATTENTION=rows (the f32 rows kernels) and the summary says so. Then the
#     server on --backend cuda (tests/gpu/server_check.sh): six greedy answers sent at once equal
#     the same sent one at a time, and /metrics counts the tokens.
#     Then the host time per decode step at batch 64 (tests/gpu/host_time.sh): the engine
#     thread's own time a step against the forward passes', 64 requests decoding at once.
#  3. Speed: prefill tokens/s at 512 and 2048 and single-stream decode tokens/s of the default
#     model on CUDA and on the CPU (16 threads), in this same run.
#  4. Speed of a Llama-3.1-8B shape with random bf16 weights (tests/gpu/llama31_8b_config.json,
#     no file): prefill tokens/s and MFU at 8K and 32K (bf16 dense peak 989 TFLOP/s), decode
#     tokens/s at batch 1, 16 and 64 with the share of HBM bandwidth (4.8 TB/s) the step's reads
#     take, and RidgeFill prefill time against exact at splits of 1/2 and 2/3 depth (exact tail
#     1024), and attention alone at 2K, 8K and 32K tokens (TFLOP/s; at 2K also on an f16 cache:
#     the tensor-core tiles against the f32 rows kernels), and SpecKV's selection of one layer at
#     8K and 32K (the backend's scores and compaction), if the run has the time left.
#  5. If the run has the time left, the same 8B shape's decode at batch 1, 16 and 64 and prefill
#     at 8K with cuBLASLt's algorithms chosen at a 16-row reference batch
#     (RIDGESERVE_CUDA_GEMM_REFERENCE_N=16: smaller tiles, more CTAs at decode) beside step 4's
#     default of 256 (kernels/cuda/linear_plan.h). Each bench's stderr names the algorithm per k.
#  6. A summary (also OUT_DIR/summary.txt).
# The default model must be at $MODEL (default models/SmolLM2-135M-Instruct.Q4_1.gguf); without
# it the model test skips and the speed step says "not measured". The model (98 MB) and the
# prebuilt binaries are over the device tool's 64 MiB per-call transfer together, so the run is
# two calls on one warm machine (its image lacks the project's libraries: no build there).
# tests/gpu/prepare_prebuilt.sh makes gpu-pack/ (the binaries as prebuilt.tar.xz, the model's
# first 42 MB as part.aa) and gpu-model/ (part.ab, model.sha256). Then, with carry [gpu-pack]:
#   mkdir -p /tmp/rs-model && cp gpu-pack/part.aa /tmp/rs-model/ && python3 -c "import tarfile;
#   tarfile.open('gpu-pack/prebuilt.tar.xz').extractall('.')" && PHASE=1 USE_PREBUILT=1
#   BUDGET=320 tests/gpu/run.sh /tmp/gout; tar czf $OUT/phase1.tgz -C /tmp gout
# and at once (the machine stays warm 30 s; /tmp and gpu-prebuilt/ stay), with carry [gpu-model]:
#   PHASE=2 USE_PREBUILT=1 BUDGET=320 tests/gpu/run.sh /tmp/gout2; tar czf $OUT/phase2.tgz ...
# (timeout_s 360 each: the budget keeps each step inside it, and the summary is always written).
# PHASE=1 runs what needs no model (step 2 without the model test, steps 4 and 5); PHASE=2
# joins the parts in /tmp/rs-model, checks the sum and runs the model test, the server, host
# time and step 3. PHASE=all (the default) runs everything where the model is already there.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
OUT_DIR=${1:-${OUT:-/tmp/ridgeserve-gpu-out}}
mkdir -p "$OUT_DIR"
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
BUILD=${BUILD:-build-gpu}
JOBS=${JOBS:-16}
START=$(date +%s)
PHASE=${PHASE:-all}
STATE=/tmp/rs-model  # what phase 1 leaves for phase 2 on the same machine
mkdir -p "$STATE"
cp -n gpu-model/part.* "$STATE/" 2>/dev/null || true
if [ "$PHASE" != 1 ] && [ ! -f "$MODEL" ] && ls "$STATE"/part.* >/dev/null 2>&1; then
  cat "$STATE"/part.* >"$STATE/model.gguf"
  MODEL=$STATE/model.gguf
  if [ -f gpu-model/model.sha256 ] &&
     [ "$(sha256sum "$MODEL" | cut -d' ' -f1)" != "$(cut -d' ' -f1 gpu-model/model.sha256)" ]; then
    echo "model parts joined to a file with the wrong sha256: not used"
    MODEL=/nonexistent
  fi
fi
SUMMARY="$OUT_DIR/summary.txt"
: >"$SUMMARY"
say() { echo "$*" | tee -a "$SUMMARY"; }
elapsed() { echo $(($(date +%s) - START)); }
# The run's budget in seconds (BUDGET; the phases' calls give 320): each step gets at most its
# own limit and what the budget leaves, less 10 s for the summary, under `timeout -k 10` (a
# process that ignores SIGTERM inside the driver is killed 10 s later).
BUDGET=${BUDGET:-470}
cap() {
  local left=$((BUDGET - $(elapsed) - 10))
  echo $((left < $1 ? left : $1))
}
# run_for LIMIT COMMAND...: COMMAND under the cap; 124 without running it under 5 s.
run_for() {
  local s
  s=$(cap "$1")
  shift
  [ "$s" -ge 5 ] || return 124
  timeout -k 10 "$s" "$@"
}

case "$PHASE" in
  1) TESTS=(cuda_attention_plan_test backend_registry_test cuda_ops_test nccl_communicator_test) ;;
  2) TESTS=(cuda_model_test) ;;
  *) TESTS=(cuda_attention_plan_test backend_registry_test cuda_ops_test nccl_communicator_test
            cuda_model_test) ;;
esac
say "== ridgeserve GPU run (phase $PHASE) $(date -u +%FT%TZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | sed 's/^/gpu: /' | tee -a "$SUMMARY"

# --- 1. build -------------------------------------------------------------------------------
BIN=""
if [ "${USE_PREBUILT:-0}" = 1 ]; then
  say "build: skipped (USE_PREBUILT=1)"
elif run_for 120 cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DRIDGESERVE_CUDA=ON \
     -DCMAKE_CUDA_ARCHITECTURES=90 >"$OUT_DIR/configure.log" 2>&1; then
  if run_for 300 cmake --build "$BUILD" -j "$JOBS" --target "${TESTS[@]}" cuda_bench ridgeserve ridgeserve-cli ridgeserve-loadtest \
       >"$OUT_DIR/build.log" 2>&1; then
    BIN="$BUILD/bin"
    say "build: built here in $(elapsed) s"
  else
    say "build: FAILED after $(elapsed) s (tail of $OUT_DIR/build.log:)"
    grep -E "error|FAILED" "$OUT_DIR/build.log" | head -20 | tee -a "$SUMMARY"
  fi
else
  say "build: configure failed here (see $OUT_DIR/configure.log: $(grep -m1 -E 'Could not find|CMake Error' "$OUT_DIR/configure.log"))"
fi
if [ -z "$BIN" ] && [ -d gpu-prebuilt/bin ]; then
  BIN=gpu-prebuilt/bin
  # The prebuilt folder holds the project's non-CUDA libraries; CUDA's come from this image
  # (or its pip wheels: Python's site-packages folders, split into find's paths on purpose).
  # shellcheck disable=SC2046
  lib=$(find /usr/local/cuda*/lib64 /usr/local/cuda*/lib /usr/lib/x86_64-linux-gnu \
    $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null) \
    -name 'libcublasLt.so.13*' 2>/dev/null | head -1)
  CUDA_LIBS=${lib:+$(dirname "$lib")}
  # shellcheck disable=SC2046
  lib=$(find /usr/local/cuda*/lib* /usr/lib/x86_64-linux-gnu \
    $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null) \
    -name 'libnccl.so.2*' 2>/dev/null | head -1)
  NCCL_LIBS=${lib:+$(dirname "$lib")}
  export LD_LIBRARY_PATH="$PWD/gpu-prebuilt/lib:${CUDA_LIBS}:${NCCL_LIBS}:${LD_LIBRARY_PATH:-}"
  say "build: using prebuilt binaries from gpu-prebuilt/ (CUDA libraries from ${CUDA_LIBS:-?})"
fi
if [ -z "$BIN" ]; then
  say "RESULT: nothing to run (no build, no gpu-prebuilt/)"
  exit 1
fi

# --- 2. tests -------------------------------------------------------------------------------
# Each binary runs whole (one device start, not one a test). A device fault aborts the process
# (CUDA_CHECK) and a hang meets the timeout: the test that was running counts as failed and the
# binary runs again without the tests already reported, until every test has its result.
export RIDGESERVE_MODEL="$MODEL"
# A GPU test that finds no device fails here (it skips elsewhere), naming why (an old driver...).
export RIDGESERVE_REQUIRE_GPU=1
# The model test's prompt text, carried in gpu-prebuilt/ for an image without it.
if [ ! -f /usr/share/common-licenses/Apache-2.0 ] && [ -f gpu-prebuilt/Apache-2.0 ]; then
  export RIDGESERVE_REFERENCE_TEXT=$PWD/gpu-prebuilt/Apache-2.0
fi
FAILED=0
SKIPPED_TOTAL=0
FAILED_TESTS=()
result_names() {  # the tests whose result line is in $1, for tag $2 (OK, FAILED, SKIPPED)
  sed -n "s/^\[ *$2 *\] \([A-Za-z0-9_/.]*\) (.*ms)\$/\1/p" "$1"
}
for t in "${TESTS[@]}"; do
  log="$OUT_DIR/$t.log"
  : >"$log"
  if [ ! -x "$BIN/$t" ]; then
    say "test $t: MISSING binary"
    FAILED=1
    continue
  fi
  total=$(run_for 60 "$BIN/$t" --gtest_list_tests 2>>"$log" | grep -c '^  ')
  if [ "$total" -eq 0 ]; then  # it did not start (a missing library...) or lists nothing
    say "test $t: FAILED to list its tests ($(tail -1 "$log"))"
    FAILED=1
    continue
  fi
  passed=0; failed=0; skipped=0; done_names=()
  for attempt in $(seq 1 "$((total + 1))"); do
    one="$OUT_DIR/$t.attempt.log"
    exclude=$(IFS=:; echo "${done_names[*]+${done_names[*]}}")
    run_for 240 "$BIN/$t" --gtest_color=no --gtest_filter="*${exclude:+-$exclude}" >"$one" 2>&1
    rc=$?
    cat "$one" >>"$log"
    grep -E '^\[ measured \]' "$one" | tee -a "$SUMMARY"
    while read -r name; do
      [ -n "$name" ] || continue
      passed=$((passed + 1)); done_names+=("$name")
    done < <(result_names "$one" OK)
    while read -r name; do
      [ -n "$name" ] || continue
      skipped=$((skipped + 1)); done_names+=("$name")
    done < <(result_names "$one" SKIPPED)
    while read -r name; do
      [ -n "$name" ] || continue
      failed=$((failed + 1)); done_names+=("$name"); FAILED_TESTS+=("$name")
      say "  FAILED $t $name"
      awk -v n="$name" 'index($0, "[ RUN      ] " n) == 1 {on = 1; next}
        on && index($0, "[  FAILED  ]") == 1 {exit} on {print; if (++k == 12) exit}' "$one" |
        tee -a "$SUMMARY"
    done < <(result_names "$one" FAILED)
    crashed=$(sed -n 's/^\[ RUN      \] \(.*\)$/\1/p' "$one" | tail -1)
    if [ -n "$crashed" ] && [[ " ${done_names[*]+${done_names[*]}} " != *" $crashed "* ]]; then
      failed=$((failed + 1)); done_names+=("$crashed"); FAILED_TESTS+=("$crashed")
      say "  FAILED $t $crashed: the process ended inside it (rc $rc)"
      tail -6 "$one" | tee -a "$SUMMARY"
      # Once more alone, waiting after every launch: a fault inside a kernel then names the
      # launcher's line instead of the next wait's.
      run_for 60 env RIDGESERVE_CUDA_SYNC_LAUNCHES=1 "$BIN/$t" --gtest_color=no \
        --gtest_filter="$crashed" >"$one.sync" 2>&1
      say "  $crashed alone with RIDGESERVE_CUDA_SYNC_LAUNCHES=1:"
      grep -m 3 -E 'fatal CUDA error|Failure' "$one.sync" | tee -a "$SUMMARY"
      cat "$one.sync" >>"$log"
      rm -f "$one.sync"
      continue
    fi
    break
  done
  rm -f "$OUT_DIR/$t.attempt.log"
  if [ "$((passed + failed + skipped))" -ne "$total" ]; then
    say "  $t: $total tests listed, $((passed + failed + skipped)) reported (rc $rc)"
    failed=$((failed + 1))
  elif [ "$failed" -eq 0 ] && [ "$rc" -ne 0 ]; then  # a fault after the last test, at teardown
    say "  $t: every test passed or skipped, but the process exited $rc"
    failed=1
  fi
  SKIPPED_TOTAL=$((SKIPPED_TOTAL + skipped))
  say "test $t: $total tests, $passed passed, $failed failed, $skipped SKIPPED"
  [ "$failed" -eq 0 ] || FAILED=1
done
say "tests done at $(elapsed) s"
# The tensor-core attention is the newest kernel: when an attention op test fails (either family;
# the rows kernels have run nowhere either), the server check and the speed steps run on the rows
# kernels (RIDGESERVE_CUDA_ATTENTION=rows), so they still measure.
# Phase 1 leaves the choice in $STATE for phase 2.
for name in ${FAILED_TESTS[@]+"${FAILED_TESTS[@]}"}; do
  case "$name" in
    CudaOpsTest.Attention*)
      echo "$name" >"$STATE/attention_rows"
      break ;;
  esac
done
if [ -f "$STATE/attention_rows" ]; then
  export RIDGESERVE_CUDA_ATTENTION=rows
  say "an attention test FAILED ($(cat "$STATE/attention_rows")): the rest uses RIDGESERVE_CUDA_ATTENTION=rows"
fi

# --- 2b. the server on --backend cuda ---------------------------------------------------------
if [ -f "$MODEL" ] && [ -x "$BIN/ridgeserve" ] && [ -x "$BIN/ridgeserve-cli" ]; then
  run_for 100 tests/gpu/server_check.sh "$BIN" cuda "$MODEL" "$OUT_DIR/server" | tee -a "$SUMMARY"
  [ "${PIPESTATUS[0]}" -eq 0 ] || FAILED=1
else
  say "server cuda: not checked (no model or no server binaries)"
fi

# --- 2c. host time per decode step at batch 64 on --backend cuda ------------------------------
if [ -f "$MODEL" ] && [ -x "$BIN/ridgeserve" ] && [ -x "$BIN/ridgeserve-loadtest" ]; then
  run_for 60 tests/gpu/host_time.sh "$BIN" cuda "$MODEL" "$OUT_DIR/host_time" | tee -a "$SUMMARY"
  rc=${PIPESTATUS[0]}
  [ "$rc" -eq 0 ] || say "host time cuda: FAILED or timed out (exit $rc; $OUT_DIR/host_time)"
else
  say "host time cuda: not measured (no model or no server binaries)"
fi

# --- 3. speed -------------------------------------------------------------------------------
if [ -f "$MODEL" ]; then
  for backend in cuda cpu; do
    if [ "$(cap 60)" -lt 30 ]; then
      say "speed $backend: skipped (the run is at $(elapsed) s of its $BUDGET s)"
      continue
    fi
    if run_for 60 "$BIN/cuda_bench" --backend "$backend" --model "$MODEL" --threads 16 \
         --prefill_tokens 512,2048 --decode_tokens 128 --repeats 2 \
         >"$OUT_DIR/bench_$backend.json" 2>"$OUT_DIR/bench_$backend.err"; then
      say "speed $backend: $(grep '^{' "$OUT_DIR/bench_$backend.json" | tail -1)"
    else
      say "speed $backend: FAILED or timed out ($(tail -1 "$OUT_DIR/bench_$backend.err"))"
    fi
  done
else
  say "speed: not measured ($MODEL is not on this machine)"
fi

# --- 4. speed of an 8B shape ----------------------------------------------------------------
if [ "$PHASE" = 2 ]; then
  say "speed 8B: in phase 1"
elif [ "$(cap 150)" -lt 60 ]; then
  say "speed 8B: skipped (the run is at $(elapsed) s of its $BUDGET s)"
elif run_for 150 "$BIN/cuda_bench" --backend cuda --random_config tests/gpu/llama31_8b_config.json \
     --prefill_tokens 8192,32768 --chunk 8192 --decode_batches 1,16,64 --decode_tokens 32 \
     --decode_context 1024 --ridgefill_depths 0.5,0.667 --exact_tail_tokens 1024 --repeats 1 \
     --peak_tflops 989 --peak_hbm_gbps 4800 --attention_tokens 2048,8192,32768 \
     --attention_f16_up_to 2048 --selection_tokens 8192,32768 \
     >"$OUT_DIR/bench_8b.json" 2>"$OUT_DIR/bench_8b.err"; then
  say "speed 8B: $(grep '^{' "$OUT_DIR/bench_8b.json" | tail -1)"
else
  say "speed 8B: FAILED or timed out ($(tail -1 "$OUT_DIR/bench_8b.err"))"
fi

# --- 5. the GEMM algorithms' reference batch: 16 against step 4's 256 ---------------------------
if [ "$PHASE" = 2 ]; then
  say "speed 8B at GEMM reference batch 16: in phase 1"
elif [ "$(cap 90)" -lt 60 ]; then
  say "speed 8B at GEMM reference batch 16: skipped (the run is at $(elapsed) s of its $BUDGET s)"
elif run_for 90 env RIDGESERVE_CUDA_GEMM_REFERENCE_N=16 "$BIN/cuda_bench" --backend cuda \
     --random_config tests/gpu/llama31_8b_config.json --prefill_tokens 8192 --chunk 8192 \
     --decode_batches 1,16,64 --decode_tokens 32 --decode_context 1024 --repeats 1 \
     --peak_tflops 989 --peak_hbm_gbps 4800 >"$OUT_DIR/bench_8b_ref16.json" \
     2>"$OUT_DIR/bench_8b_ref16.err"; then
  say "speed 8B at GEMM reference batch 16: $(grep '^{' "$OUT_DIR/bench_8b_ref16.json" | tail -1)"
else
  say "speed 8B at GEMM reference batch 16: FAILED or timed out ($(tail -1 "$OUT_DIR/bench_8b_ref16.err"))"
fi

[ "$SKIPPED_TOTAL" -gt 0 ] && say "NOTE: $SKIPPED_TOTAL GPU test(s) SKIPPED, i.e. not run (no device, or no model)"
say "== done in $(elapsed) s; $([ $FAILED -eq 0 ] && echo 'all GPU tests passed or skipped' || echo 'SOME GPU TESTS FAILED')"
exit $FAILED
