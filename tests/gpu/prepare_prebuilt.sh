#!/usr/bin/env bash
# Run on a development machine (CUDA toolkit, no GPU needed) before a GPU session. For an image
# that lacks the project's libraries it builds the GPU test binaries, cuda_bench, the server and
# its CLI in build-cuda and copies them, with the shared libraries they need except glibc's and
# CUDA's own (the GPU image has those), into gpu-prebuilt/ (git-ignored through
# .git/info/exclude). Carry
# gpu-prebuilt to the GPU machine; tests/gpu/run.sh uses it when it cannot build there. It also
# packs it and splits the default model into gpu-pack/ and gpu-model/ (see run.sh's header for
# the two-call transfer).
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
cp /usr/share/common-licenses/Apache-2.0 gpu-prebuilt/  # the model test's prompt (run.sh)
du -sh gpu-prebuilt
# The device tool sends at most 64 MiB a call (the working tree, ~8 MB, included): the binaries
# packed with xz (~14 MB) travel in call 1 with the model's first 42 MB (gpu-pack/), the model's
# other 56 MB in call 2 (gpu-model/). run.sh's header has the two calls.
MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf
for d in gpu-pack gpu-model; do
  grep -qx "/$d/" .git/info/exclude || echo "/$d/" >>.git/info/exclude
  rm -rf "$d" && mkdir -p "$d"
done
tar cf - gpu-prebuilt | xz -9 -T"$(nproc)" >gpu-pack/prebuilt.tar.xz
if [ -f "$MODEL" ]; then
  head -c 42000000 "$MODEL" >gpu-pack/part.aa
  tail -c +42000001 "$MODEL" >gpu-model/part.ab
  sha256sum "$MODEL" >gpu-model/model.sha256
fi
du -sb gpu-pack gpu-model
