// SpecKV's compaction on the device (Backend::CompactKv): a sequence's kept K/V entries, per KV
// head, gathered into scratch and written back to the sequence's first places (bits unchanged).
#ifndef RIDGESERVE_KERNELS_CUDA_COMPACT_KV_H_
#define RIDGESERVE_KERNELS_CUDA_COMPACT_KV_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace ridgeserve::cuda {

struct CompactKvParams {
  uint8_t* k = nullptr;  // the layer's K and V caches, [slots, num_kv_heads, head_dim]
  uint8_t* v = nullptr;
  int32_t element_bytes = 0;  // 2 or 4
  int32_t block_size = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  const int32_t* blocks = nullptr;  // the sequence's block table
  const int32_t* from = nullptr;    // [num_kv_heads, n]
  int32_t n = 0;
  uint16_t* moved = nullptr;  // scratch: CompactKvScratchBytes
};

// The scratch LaunchCompactKv needs: both caches' moved entries.
constexpr size_t CompactKvScratchBytes(int32_t element_bytes, int32_t num_kv_heads,
                                       int32_t head_dim, int32_t n) {
  return size_t{2} * element_bytes * num_kv_heads * head_dim * static_cast<size_t>(n);
}

void LaunchCompactKv(const CompactKvParams& p, cudaStream_t stream);

}  // namespace ridgeserve::cuda

#endif  // RIDGESERVE_KERNELS_CUDA_COMPACT_KV_H_
