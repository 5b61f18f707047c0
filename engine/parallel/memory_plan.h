// Device memory of a tensor-parallel plan (DESIGN.md, "Scale"): for a model's architecture
// alone (no weights needed), a TP size, the memory of one device and the weight and KV
// element types, what each rank holds and how many tokens of KV cache fit. Refuses a plan
// that does not fit, naming the shortfall. `ridgeserve-plan` prints it.
#ifndef RIDGESERVE_ENGINE_PARALLEL_MEMORY_PLAN_H_
#define RIDGESERVE_ENGINE_PARALLEL_MEMORY_PLAN_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "engine/model/config.h"
#include "engine/model/shard.h"
#include "kernels/backend.h"
#include "kernels/dtype.h"

namespace ridgeserve {

struct MemoryPlanRequest {
  int32_t tensor_parallel = 1;
  double device_bytes = 0;            // one device's memory
  double memory_utilization = 0.90;   // share of it the server may use
  DType weight_dtype = DType::kBF16;  // what the backend keeps (CUDA: bf16)
  DType kv_dtype = DType::kBF16;      // --kv_cache_dtype
  int32_t max_batch_tokens = 2048;    // rows of one step (activation workspace)
  int32_t max_running_requests = 64;  // logit rows of one step
  // Fixed per-rank reserve for what the plan does not model: CUDA context, cuBLASLt
  // workspace, NCCL buffers, allocator slack (an estimate, stated in the printout).
  double reserve_bytes = 1.5e9;
  // The KV cache must hold at least this many tokens (0: one full context of the model).
  int64_t min_kv_tokens = 0;
};

struct MemoryPlan {
  ShardLayout shard;        // rank 0's (every rank holds the same amounts)
  double params = 0;        // the whole model's parameters
  double weight_bytes = 0;  // per rank
  double workspace_bytes = 0;
  double reserve_bytes = 0;
  double usable_bytes = 0;        // device_bytes × utilization
  double kv_bytes_per_token = 0;  // per rank, all layers, K and V
  int64_t kv_tokens = 0;          // KV capacity per rank (whole 16-token blocks)
  int64_t min_kv_tokens = 0;

  std::string Describe(const ModelConfig& config, const MemoryPlanRequest& request) const;
};

// InvalidArgument when TP does not divide the model (PlanShard's message); ResourceExhausted
// naming the shortfall in bytes when the weights, workspace and reserve leave less than
// min_kv_tokens of KV cache.
absl::StatusOr<MemoryPlan> PlanMemory(const ModelConfig& config, const MemoryPlanRequest& request);

// What a draft model (SpecPC / SpecKV, tensor parallel 1) still allocates on the target's
// device when the engine starts, for a server planned with `request`: its KV cache of
// `kv_tokens` (whole blocks) over the `draft_layers` it runs and, when it has weights of its own,
// its model's step workspace, and the backend's sampling and ops' scratch beyond the target's
// (the two share them: each grows to the larger need). InvalidArgument as PlanMemory.
absl::StatusOr<double> PlanDraftBytes(const ModelConfig& target, const ModelConfig& draft,
                                      int32_t draft_layers, int64_t kv_tokens, bool own_weights,
                                      const MemoryPlanRequest& request);

// A server on a device (--gpu_memory_utilization, --kv_cache_tokens) may use total × utilization
// of its memory, less what is in use when `memory` was read. request.device_bytes is ignored;
// request.min_kv_tokens (0: one full context) is the least KV cache it accepts.
//
// Before the model loads: OK when that budget holds the plan's weights, workspace, reserve and
// min_kv_tokens of KV; else ResourceExhausted with PlanMemory's line and the device's free,
// total and used bytes.
absl::Status CheckDeviceFit(const ModelConfig& config, MemoryPlanRequest request,
                            const DeviceMemory& before_load);
// After this process has loaded its weights (they are in use now): the KV cache tokens, whole
// blocks, that the budget leaves after the plan's workspace, the reserve and `other_bytes` (what
// the server will still allocate: RidgeFill maps), capped at `max_tokens` when > 0.
// ResourceExhausted naming the numbers when that is below min_kv_tokens.
absl::StatusOr<int64_t> DeviceKvTokens(const ModelConfig& config, MemoryPlanRequest request,
                                       const DeviceMemory& after_load, double other_bytes,
                                       int64_t max_tokens);

}  // namespace ridgeserve

#endif  // RIDGESERVE_ENGINE_PARALLEL_MEMORY_PLAN_H_
