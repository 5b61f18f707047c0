#include "engine/parallel/memory_plan.h"

#include <algorithm>
#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/common/status_macros.h"
#include "engine/model/llama.h"
#include "kernels/cuda/op_scratch.h"
#include "kernels/cuda/sample_plan.h"

namespace ridgeserve {
namespace {

constexpr int32_t kBlockTokens = 16;

std::string Gb(double bytes) { return absl::StrFormat("%.2f GB", bytes / 1e9); }

// A rank's step workspace on the device, in the parts a draft model shares or not.
struct Workspace {
  // The model's own (LlamaModel's): f32 activations of one step, its logit rows (local; at
  // TP > 1 also gathered, and whole on rank 0), its metadata (every sequence's block table as
  // long as the context) and, at TP > 1, the all-reduce's gather of every rank's rows.
  double model = 0;
  double sampling = 0;  // the backend's sampling scratch (on rank 0 only; counted on every rank)
  double ops = 0;       // the backend's ops' scratch (Backend::ReserveOps)
  double total() const { return model + sampling + ops; }
};

absl::StatusOr<Workspace> PlanWorkspace(const ModelConfig& c, const MemoryPlanRequest& request) {
  RS_ASSIGN_OR_RETURN(const ShardLayout s, PlanShard(c, 0, request.tensor_parallel));
  const double h = c.hidden, hd = c.head_dim;
  const double q = s.num_heads * hd, kv = s.num_kv_heads * hd, ff = s.ffn;
  const double rows = request.max_batch_tokens;
  const double seqs = request.max_running_requests;
  const bool tp = request.tensor_parallel > 1;
  Workspace w;
  w.model = sizeof(float) * (rows * (4 * h + (q + 2 * kv) + q + 3 * ff) +
                             seqs * s.vocab_stride * (1 + (tp ? s.size : 0)) +
                             (tp ? seqs * c.vocab_size : 0) + (tp ? rows * h * s.size : 0)) +
            sizeof(int32_t) * static_cast<double>(LlamaModel::StepMetaInts(
                                  request.max_batch_tokens, request.max_running_requests,
                                  int64_t{request.max_running_requests} *
                                      ((c.context_length + kBlockTokens - 1) / kBlockTokens)));
  w.sampling = static_cast<double>(
      cuda::SampleScratchBytes(request.max_running_requests, c.vocab_size,
                               int64_t{request.max_running_requests} * c.context_length));
  // The ops' scratch (Linear's bf16 input and padded output, Attention's workspace), the most
  // of any rank's: the last rank's vocabulary slice can be shorter than rank 0's.
  for (const int32_t rank : {0, request.tensor_parallel - 1}) {
    RS_ASSIGN_OR_RETURN(const ShardLayout shard, PlanShard(c, rank, request.tensor_parallel));
    const absl::StatusOr<cuda::OpScratch> scratch =
        cuda::PlanOpScratch(StepOpShapes(c, shard, request.max_batch_tokens, request.kv_dtype));
    if (!scratch.ok()) {
      return absl::Status(
          scratch.status().code(),
          absl::StrCat(c.name, " cannot run on the CUDA backend: ", scratch.status().message()));
    }
    w.ops = std::max(w.ops, static_cast<double>(scratch->total()));
  }
  return w;
}

// What a plan needs of the shape alone: the rank's shard, weight, workspace and reserve bytes,
// KV bytes a token and the least KV cache (no device memory yet).
absl::StatusOr<MemoryPlan> PlanShape(const ModelConfig& c, const MemoryPlanRequest& request) {
  MemoryPlan p;
  RS_ASSIGN_OR_RETURN(p.shard, PlanShard(c, 0, request.tensor_parallel));
  const ShardLayout& s = p.shard;
  const double h = c.hidden, hd = c.head_dim;
  const double q = s.num_heads * hd, kv = s.num_kv_heads * hd, ff = s.ffn;
  const double vocab = s.vocab_stride;
  // Matrices the rank holds (its slices) and vectors (norms replicated, biases sliced).
  const double layer_matrices = (q + 2 * kv) * h + h * q + 2 * ff * h + h * ff;
  double layer_vectors = 2 * h + (c.qk_norm ? 2 * hd : 0) + (c.qkv_bias ? q + 2 * kv : 0);
  const double embeddings = vocab * h * (c.tied_embeddings ? 1 : 2);
  const double matrices = embeddings + c.num_layers * layer_matrices;
  const double vectors = h + c.num_layers * layer_vectors + hd / 2;  // + final norm, rope
  p.weight_bytes = matrices * ElementBytes(request.weight_dtype) + vectors * sizeof(float);
  // The whole model, for the printout: every matrix unsliced.
  const double full_q = c.num_heads * hd, full_kv = c.num_kv_heads * hd;
  p.params = double(c.vocab_size) * h * (c.tied_embeddings ? 1 : 2) + h +
             c.num_layers * ((full_q + 2 * full_kv) * h + h * full_q + 3.0 * c.ffn * h + 2 * h +
                             (c.qk_norm ? 2 * hd : 0) + (c.qkv_bias ? full_q + 2 * full_kv : 0));
  RS_ASSIGN_OR_RETURN(const Workspace workspace, PlanWorkspace(c, request));
  p.workspace_bytes = workspace.total();
  p.reserve_bytes = request.reserve_bytes;
  p.kv_bytes_per_token = 2.0 * c.num_layers * kv * ElementBytes(request.kv_dtype);
  p.min_kv_tokens = request.min_kv_tokens > 0 ? request.min_kv_tokens : c.context_length;
  return p;
}

// Whole blocks of KV cache in `bytes`.
int64_t KvTokensIn(double bytes, const MemoryPlan& p) {
  return bytes <= 0
             ? 0
             : static_cast<int64_t>(bytes / p.kv_bytes_per_token) / kBlockTokens * kBlockTokens;
}

absl::Status CheckUtilization(const MemoryPlanRequest& request) {
  if (request.memory_utilization > 0 && request.memory_utilization <= 1) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("memory utilization ", request.memory_utilization, " outside (0, 1]"));
}

// What a device server may use: total × utilization less what is in use (`in_use` names it).
absl::StatusOr<double> DeviceBudget(const MemoryPlanRequest& request, const DeviceMemory& memory,
                                    const char* in_use, std::string& device) {
  RS_RETURN_IF_ERROR(CheckUtilization(request));
  const double total = static_cast<double>(memory.total_bytes);
  const double used = total - static_cast<double>(memory.free_bytes);
  const double budget = total * request.memory_utilization - used;
  device = absl::StrCat("the device has ", Gb(memory.free_bytes), " of ", Gb(total), " free (",
                        in_use, " ", Gb(used), "); at memory utilization ",
                        request.memory_utilization, " this server may use ", Gb(budget));
  if (budget <= 0) return absl::ResourceExhaustedError(device);
  return budget;
}

}  // namespace

absl::StatusOr<MemoryPlan> PlanMemory(const ModelConfig& c, const MemoryPlanRequest& request) {
  if (request.device_bytes <= 0) {
    return absl::InvalidArgumentError("device memory must be given and > 0");
  }
  RS_RETURN_IF_ERROR(CheckUtilization(request));
  RS_ASSIGN_OR_RETURN(MemoryPlan p, PlanShape(c, request));
  p.usable_bytes = request.device_bytes * request.memory_utilization;
  p.kv_tokens =
      KvTokensIn(p.usable_bytes - p.weight_bytes - p.workspace_bytes - p.reserve_bytes, p);
  if (p.kv_tokens < p.min_kv_tokens) {
    const double need = p.weight_bytes + p.workspace_bytes + p.reserve_bytes +
                        p.min_kv_tokens * p.kv_bytes_per_token;
    return absl::ResourceExhaustedError(absl::StrCat(
        c.name, " at tensor parallel ", request.tensor_parallel, " does not fit: each rank needs ",
        Gb(need), " (weights ", Gb(p.weight_bytes), ", workspace ", Gb(p.workspace_bytes),
        ", reserve ", Gb(p.reserve_bytes), ", KV for ", p.min_kv_tokens, " tokens ",
        Gb(p.min_kv_tokens * p.kv_bytes_per_token), ") but may use ", Gb(p.usable_bytes),
        ": short by ", Gb(need - p.usable_bytes)));
  }
  return p;
}

absl::StatusOr<double> PlanDraftBytes(const ModelConfig& target, const ModelConfig& draft,
                                      int32_t draft_layers, int64_t kv_tokens, bool own_weights,
                                      const MemoryPlanRequest& request) {
  const int64_t tokens = (kv_tokens + kBlockTokens - 1) / kBlockTokens * kBlockTokens;
  double bytes = static_cast<double>(tokens) * 2.0 * draft_layers * draft.num_kv_heads *
                 draft.head_dim * ElementBytes(request.kv_dtype);
  if (own_weights) {
    RS_ASSIGN_OR_RETURN(const Workspace t, PlanWorkspace(target, request));
    RS_ASSIGN_OR_RETURN(const Workspace d, PlanWorkspace(draft, request));
    bytes += d.model + std::max(0.0, d.ops - t.ops) + std::max(0.0, d.sampling - t.sampling);
  }
  return bytes;
}

std::string MemoryPlan::Describe(const ModelConfig& c, const MemoryPlanRequest& r) const {
  return absl::StrFormat(
      "%s: %.2fB parameters; tensor parallel %d (%d query heads, %d KV heads, %d MLP features, "
      "%d vocabulary rows per rank)\n"
      "per rank: weights %s (%s), workspace %s, reserve %s, of %s usable (%.0f%% of %s)\n"
      "KV cache: %.1f KiB per token per rank (%s), capacity %d tokens per rank "
      "(%.1fx the minimum of %d)\n",
      c.name, params / 1e9, r.tensor_parallel, shard.num_heads, shard.num_kv_heads, shard.ffn,
      shard.vocab_stride, Gb(weight_bytes), std::string(KvCacheDTypeName(r.weight_dtype)),
      Gb(workspace_bytes), Gb(reserve_bytes), Gb(usable_bytes), 100 * r.memory_utilization,
      Gb(r.device_bytes), kv_bytes_per_token / 1024, std::string(KvCacheDTypeName(r.kv_dtype)),
      kv_tokens, double(kv_tokens) / min_kv_tokens, min_kv_tokens);
}

absl::Status CheckDeviceFit(const ModelConfig& config, MemoryPlanRequest request,
                            const DeviceMemory& before_load) {
  std::string device;
  RS_ASSIGN_OR_RETURN(const double budget,
                      DeviceBudget(request, before_load, "others hold", device));
  request.device_bytes = budget;
  request.memory_utilization = 1;
  const absl::StatusOr<MemoryPlan> plan = PlanMemory(config, request);
  if (plan.ok()) return absl::OkStatus();
  return absl::Status(plan.status().code(),
                      absl::StrCat(plan.status().message(), " (", device, ")"));
}

absl::StatusOr<int64_t> DeviceKvTokens(const ModelConfig& config, MemoryPlanRequest request,
                                       const DeviceMemory& after_load, double other_bytes,
                                       int64_t max_tokens) {
  std::string device;
  RS_ASSIGN_OR_RETURN(const double budget,
                      DeviceBudget(request, after_load, "in use, the weights among it", device));
  RS_ASSIGN_OR_RETURN(const MemoryPlan plan, PlanShape(config, request));
  const int64_t tokens =
      KvTokensIn(budget - plan.workspace_bytes - plan.reserve_bytes - other_bytes, plan);
  const int64_t least = plan.min_kv_tokens;
  if (tokens < least) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "room for ", tokens, " KV tokens, need ", least, " (", Gb(least * plan.kv_bytes_per_token),
        "): ", device, ", less workspace ", Gb(plan.workspace_bytes), ", reserve ",
        Gb(plan.reserve_bytes), " and ", Gb(other_bytes), " still to allocate"));
  }
  return max_tokens > 0 ? std::min(tokens, max_tokens) : tokens;
}

}  // namespace ridgeserve
