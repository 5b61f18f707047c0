# The README's two commands: `make serve` and `make test`. Both install what is missing.
BUILD_DIR ?= build
MODEL := models/SmolLM2-135M-Instruct.Q4_1.gguf
MAPS := models/SmolLM2-135M-Instruct.Q4_1.rfmap
JOBS ?= $(shell nproc)

.PHONY: all deps build model maps serve test format clean
.PHONY: test-hardening test-fuzz test-sanitize

all: build

deps:
	scripts/install_deps.sh
	scripts/python_env.sh

build: deps
	cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=Release
	cmake --build $(BUILD_DIR) -j $(JOBS)

model: deps
	scripts/fetch_model.sh

# RidgeFill maps for the default model, calibrated once (about 3.5 minutes here) and cached.
maps: build model
	scripts/make_maps.sh $(BUILD_DIR) $(MODEL) $(MAPS)

# The gRPC server on the default model; try it with build/bin/ridgeserve-cli (README). It
# serves exact requests at once; without maps yet, they are calibrated in the background
# (progress in $(MAPS).progress) and the server loads them when the file appears.
serve: build model
	@if [ ! -s $(MAPS) ]; then scripts/make_maps.sh $(BUILD_DIR) $(MODEL) $(MAPS) & fi; \
	$(BUILD_DIR)/bin/ridgeserve --model $(MODEL) --ridgefill_maps $(MAPS) --host 127.0.0.1 \
	  --port 50051

test: maps
	ctest --test-dir $(BUILD_DIR) --output-on-failure -j $(JOBS)

# Hardening (README "Reliability"), after `make test` in CI, in a build dir of its own.
# test-fuzz: the libFuzzer targets (clang 14: coverage + ASan + UBSan) on seed corpora
#   generated here (tests/fuzz/make_seeds.py, into build-fuzz/fuzz-seeds/; the map-file seeds
#   come from $(BUILD_DIR)'s ridgeserve-calibrate), then FUZZ_SECONDS of fuzzing each.
FUZZ_SECONDS ?= 20
# The fuzzers at -O2, where executions per second count.
FUZZ_CMAKE := -G Ninja -DRIDGESERVE_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 -g1"
FUZZ_FLAGS := -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined \
  -fno-omit-frame-pointer

test-hardening: test-fuzz test-sanitize

test-fuzz: build model
	CC=clang-14 CXX=clang++-14 cmake -S . -B build-fuzz $(FUZZ_CMAKE) -DRIDGESERVE_FUZZ=ON \
	  -DCMAKE_C_FLAGS="$(FUZZ_FLAGS)" -DCMAKE_CXX_FLAGS="$(FUZZ_FLAGS)" \
	  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined"
	cmake --build build-fuzz --target fuzzers -j $(JOBS)
	.venv/bin/python tests/fuzz/make_seeds.py $(BUILD_DIR)/bin build-fuzz/fuzz-seeds
	tests/fuzz/run_fuzzers.sh build-fuzz $(FUZZ_SECONDS)

# test-sanitize: the C++ unit tests and the tiny-model checks under ASan + UBSan (build-asan),
#   the tests that start threads under TSan (build-tsan); gcc 12 (clang 14 does not build
#   kernels/cpu/cpu_features.cc: no "f16c" in __builtin_cpu_supports), CPU only, -O1 with
#   assertions on. What runs and what is left out: tests/sanitize/run_tests.sh and README
#   "Sanitizers".
SAN_CMAKE := -G Ninja -DRIDGESERVE_CUDA=OFF -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g1" -DCMAKE_C_FLAGS_DEBUG="-O1 -g1"
ASAN_FLAGS := -fsanitize=address,undefined -fno-sanitize-recover=undefined \
  -fno-omit-frame-pointer
TSAN_FLAGS := -fsanitize=thread -fno-omit-frame-pointer
# Every gtest binary but the AVX-512-off copy of kernels_test (kernels_test already runs every
# Linear path this CPU has; the copy only recompiles the compile-time SIMD width), the CUDA ones and server_metrics_test (it links all of rs_server, the
# gRPC reactors, for metrics.cc), plus the tools the tiny-model checks run.
ASAN_TARGETS := formats_tensor_dump gguf_reader_test safetensors_reader_test tokenizer_test \
  kernels_test cuda_attention_plan_test sampler_test kv_test sched_test forward_test \
  engine_test spec_pc_engine_test ridgefill_plan_test ridgefill_test ridgefill_maps_test \
  tensor_parallel_test server_unit_test loadtest_core_test ridgeserve-eval \
  ridgeserve-calibrate ridgefill_check
# The binaries of the TSan tests.
TSAN_TARGETS := spec_pc_engine_test tensor_parallel_test server_unit_test ridgefill_maps_test \
  engine_test

test-sanitize: model
	cmake -S . -B build-asan $(SAN_CMAKE) \
	  -DCMAKE_C_FLAGS="$(ASAN_FLAGS)" -DCMAKE_CXX_FLAGS="$(ASAN_FLAGS)"
	cmake --build build-asan --target $(ASAN_TARGETS) -j $(JOBS)
	tests/sanitize/run_tests.sh build-asan asan
	cmake -S . -B build-tsan $(SAN_CMAKE) \
	  -DCMAKE_C_FLAGS="$(TSAN_FLAGS)" -DCMAKE_CXX_FLAGS="$(TSAN_FLAGS)"
	cmake --build build-tsan --target $(TSAN_TARGETS) -j $(JOBS)
	tests/sanitize/run_tests.sh build-tsan tsan

format:
	git ls-files '*.h' '*.cc' '*.cu' | xargs clang-format -i

clean:
	rm -rf $(BUILD_DIR)
