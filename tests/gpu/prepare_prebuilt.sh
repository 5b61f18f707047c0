#!/usr/bin/env bash
# Run on a development machine (CUDA toolkit, no GPU needed) before a GPU session. For an image
# that lacks the project's libraries it builds the GPU test binaries, cuda_bench, the server and
# its CLI in build-cuda and copies them, with the shared libraries they need except glibc's and
# CUDA's own (the GPU image has those), into gpu-prebuilt/ (git-ignored through
# .git/info/exclude). Carry
# gpu-prebuilt to the GPU machine; tests/gpu/run.sh uses it when it cannot build there. It also
# splits the default model into gpu-model/ (see run.sh's header for the two-call transfer).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build-cuda}
TARGETS=(cuda_attention_plan_test backend_registry_test cuda_ops_test nccl_communicator_test
         cuda_model_test cuda_bench ridgeserve ridgeserve-cli ridgeserve-loadtest rs_backend_cuda)
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DRIDGESERVE_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DRIDGESERVE_NATIVE=OFF >/dev/null
cmake --build "$BUILD" -j "$(nproc)" --target "${TARGETS[@]}"
grep -qx '/gpu-prebuilt/' .git/info/exclude 2>/dev/null || echo '/gpu-prebuilt/' >>.git/info/exclude
rm -rf gpu-prebuilt
mkdir -p gpu-prebuilt/bin gpu-prebuilt/lib
for t in "${TARGETS[@]}"; do
  [ "$t" = rs_backend_cuda ] && t=rs_backend_cuda.so  # the module the registry loads
  cp "$BUILD/bin/$t" gpu-prebuilt/bin/
  ldd "$BUILD/bin/$t" | awk '/=> \// {print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libcuda.so*|\
      libcublas*|libnccl.so*) ;;
      *) cp -n "$lib" gpu-prebuilt/lib/ ;;
    esac
  done
done
strip gpu-prebuilt/bin/* 2>/dev/null || true
du -sh gpu-prebuilt
# The default model in two parts under the 64 MiB per-call transfer (run.sh joins them).
MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf
if [ -f "$MODEL" ]; then
  grep -qx '/gpu-model/' .git/info/exclude || echo '/gpu-model/' >>.git/info/exclude
  rm -rf gpu-model && mkdir -p gpu-model
  split -b 50M "$MODEL" gpu-model/part.
  sha256sum "$MODEL" >gpu-model/model.sha256
  ls -la gpu-model
fi
