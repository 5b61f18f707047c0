// ridgeserve-plan: the device memory plan of a model at a tensor-parallel size, from its
// architecture alone (a GGUF file, a Hugging Face directory or its config.json; no weights are
// read): weight bytes, KV bytes per token and KV capacity per rank. Exit 0 when it fits
// (the plan on stdout), 1 when it does not (one line naming the shortfall), 2 for bad input.
//   ridgeserve-plan --model config.json --tensor_parallel 2 --device_memory 80GB
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "engine/parallel/memory_plan.h"

ABSL_FLAG(std::string, model, "", "GGUF file, Hugging Face directory or config.json");
ABSL_FLAG(int32_t, tensor_parallel, 1, "ranks (GPUs) the model is sharded over");
ABSL_FLAG(std::string, device_memory, "", "memory of one device: e.g. 141GB, 80GB, 48GiB");
ABSL_FLAG(double, gpu_memory_utilization, 0.90, "share of device memory the server may use");
ABSL_FLAG(std::string, weight_dtype, "bf16", "weights on the device: bf16, f16 or f32");
ABSL_FLAG(std::string, kv_cache_dtype, "bf16", "KV cache element type: bf16, f16 or f32");
ABSL_FLAG(int64_t, min_kv_tokens, 0, "KV tokens the plan must hold (0: one full context)");
ABSL_FLAG(int32_t, max_batch_tokens, 2048, "token budget of one engine step");
ABSL_FLAG(int32_t, max_running_requests, 64, "requests decoding at once");

namespace ridgeserve {
namespace {

// "141GB", "80 GB", "48GiB", "512MiB" or plain bytes.
absl::StatusOr<double> ParseBytes(std::string text) {
  text = std::string(absl::StripAsciiWhitespace(text));
  const std::pair<const char*, double> units[] = {
      {"GiB", 1024.0 * 1024 * 1024}, {"MiB", 1024.0 * 1024}, {"GB", 1e9}, {"MB", 1e6}};
  double scale = 1;
  for (const auto& [suffix, factor] : units) {
    if (absl::EndsWith(text, suffix)) {
      text = std::string(absl::StripAsciiWhitespace(text.substr(0, text.size() - strlen(suffix))));
      scale = factor;
      break;
    }
  }
  double value = 0;
  if (!absl::SimpleAtod(text, &value) || !(value > 0)) {
    return absl::InvalidArgumentError("--device_memory: want a size such as 80GB or 48GiB");
  }
  return value * scale;
}

int Run() {
  const std::string path = absl::GetFlag(FLAGS_model);
  absl::StatusOr<ModelConfig> config =
      path.empty() ? absl::InvalidArgumentError("--model is required") : ReadModelConfig(path);
  absl::StatusOr<double> bytes = ParseBytes(absl::GetFlag(FLAGS_device_memory));
  absl::StatusOr<DType> weights = ParseKvCacheDType(absl::GetFlag(FLAGS_weight_dtype));
  absl::StatusOr<DType> kv = ParseKvCacheDType(absl::GetFlag(FLAGS_kv_cache_dtype));
  for (const absl::Status& s : {config.status(), bytes.status(), weights.status(), kv.status()}) {
    if (!s.ok()) {
      std::fprintf(stderr, "ridgeserve-plan: %s\n", std::string(s.message()).c_str());
      return 2;
    }
  }
  MemoryPlanRequest request;
  request.tensor_parallel = absl::GetFlag(FLAGS_tensor_parallel);
  request.device_bytes = *bytes;
  request.memory_utilization = absl::GetFlag(FLAGS_gpu_memory_utilization);
  request.weight_dtype = *weights;
  request.kv_dtype = *kv;
  request.min_kv_tokens = absl::GetFlag(FLAGS_min_kv_tokens);
  request.max_batch_tokens = absl::GetFlag(FLAGS_max_batch_tokens);
  request.max_running_requests = absl::GetFlag(FLAGS_max_running_requests);
  absl::StatusOr<MemoryPlan> plan = PlanMemory(*config, request);
  if (!plan.ok()) {
    std::fprintf(stderr, "ridgeserve-plan: %s\n", std::string(plan.status().message()).c_str());
    return plan.status().code() == absl::StatusCode::kResourceExhausted ? 1 : 2;
  }
  std::fputs(plan->Describe(*config, request).c_str(), stdout);
  return 0;
}

}  // namespace
}  // namespace ridgeserve

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "ridgeserve-plan --model M --tensor_parallel N --device_memory 80GB [flags]");
  absl::ParseCommandLine(argc, argv);
  return ridgeserve::Run();
}
