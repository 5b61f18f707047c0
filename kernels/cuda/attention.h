// Paged causal attention with GQA on the device (Backend::Attention). The arithmetic tree
// (partitions, slots, merges) and the choice of kernel are in attention_plan.h.
#ifndef RIDGESERVE_KERNELS_CUDA_ATTENTION_H_
#define RIDGESERVE_KERNELS_CUDA_ATTENTION_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/attention_plan.h"

namespace ridgeserve::cuda {

// Device pointers of one call (the fields of KvLayerView and AttentionRows).
struct AttentionParams {
  const float* q = nullptr;  // [num_rows, ld]
  int32_t ld = 0;
  int32_t num_heads = 0;
  const void* k = nullptr;  // [num_blocks, block_size, num_kv_heads, head_dim] of dtype_code
  const void* v = nullptr;
  int dtype_code = 0;  // 0 = F32, 1 = F16, 2 = BF16
  int32_t block_size = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t num_rows = 0;
  const int32_t* positions = nullptr;
  const int32_t* seq = nullptr;
  const int32_t* block_table_offsets = nullptr;
  const int32_t* block_tables = nullptr;
  float scale = 1.0f;
  uint16_t* out = nullptr;  // [num_rows, num_heads * head_dim] bf16 bits (the o_proj input)
};

// Lifts the kernels' dynamic shared memory limit to what kMaxHeadDim and kMaxGroup (rows) and,
// with `tiles`, the tiles' head dims need; once per device before the first launch.
cudaError_t PrepareAttentionKernels(bool tiles);

// Runs `plan` (PlanAttention of the same shape and cache). `workspace` holds
// plan.workspace_bytes, 16-byte aligned.
void LaunchAttention(const AttentionParams& p, const AttentionPlan& plan, void* workspace,
                     cudaStream_t stream);

}  // namespace ridgeserve::cuda

#endif  // RIDGESERVE_KERNELS_CUDA_ATTENTION_H_
