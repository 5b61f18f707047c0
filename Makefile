# The README's two commands: `make serve` and `make test`. Both install what is missing.
BUILD_DIR ?= build
MODEL := models/SmolLM2-135M-Instruct.Q4_1.gguf
MAPS := models/SmolLM2-135M-Instruct.Q4_1.rfmap
JOBS ?= $(shell nproc)

.PHONY: all deps build model maps serve test format clean
.PHONY: test-hardening test-fuzz

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

test-hardening: test-fuzz

test-fuzz: build model
	CC=clang-14 CXX=clang++-14 cmake -S . -B build-fuzz $(FUZZ_CMAKE) -DRIDGESERVE_FUZZ=ON \
	  -DCMAKE_C_FLAGS="$(FUZZ_FLAGS)" -DCMAKE_CXX_FLAGS="$(FUZZ_FLAGS)" \
	  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined"
	cmake --build build-fuzz --target fuzzers -j $(JOBS)
	.venv/bin/python tests/fuzz/make_seeds.py $(BUILD_DIR)/bin build-fuzz/fuzz-seeds
	tests/fuzz/run_fuzzers.sh build-fuzz $(FUZZ_SECONDS)

format:
	git ls-files '*.h' '*.cc' '*.cu' | xargs clang-format -i

clean:
	rm -rf $(BUILD_DIR)
