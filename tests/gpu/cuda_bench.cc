// Prefill and single-stream decode speed of a model on one backend, for tests/gpu/run.sh (not a
// test). One JSON object on stdout:
//   cuda_bench --backend cuda --model models/SmolLM2-135M-Instruct.Q4_1.gguf
//   {"backend": "cuda", "prefill_512_tokens_per_s": ..., "prefill_2048_tokens_per_s": ...,
//    "decode_tokens_per_s": ..., "decode_context": 512}
// Prefill: one forward pass of N prompt rows (one chunk), timed after one untimed warm-up pass
// of the same length, best of --repeats. Decode: greedy, one token a step after a 512-token
// prompt, --decode_tokens steps; each step copies its logits to the host, as serving does.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "engine/model/model.h"
#include "engine/tools/sequence_runner.h"
#include "kernels/backend_registry.h"

ABSL_FLAG(std::string, backend, "cuda", "cpu or cuda");
ABSL_FLAG(std::string, model, "", "GGUF file or Hugging Face directory");
ABSL_FLAG(std::string, prefill_tokens, "512,2048", "prompt lengths to time, comma separated");
ABSL_FLAG(int32_t, decode_tokens, 128, "decode steps to time");
ABSL_FLAG(int32_t, decode_context, 512, "prompt length before the decode steps");
ABSL_FLAG(int32_t, repeats, 3, "timed prefill passes per length (best is reported)");
ABSL_FLAG(int32_t, threads, 0, "cpu backend threads (0: all)");

namespace ridgeserve {
namespace {

using Clock = std::chrono::steady_clock;

std::vector<int32_t> RandomTokens(int32_t n, int32_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> pick(256, vocab - 1);
  std::vector<int32_t> t(n);
  for (int32_t& x : t) x = pick(rng);
  return t;
}

int Run() {
  absl::StatusOr<std::unique_ptr<Backend>> backend =
      CreateBackend(absl::GetFlag(FLAGS_backend), {.num_threads = absl::GetFlag(FLAGS_threads)});
  if (!backend.ok()) {
    std::fprintf(stderr, "cuda_bench: %s\n", std::string(backend.status().message()).c_str());
    return 2;
  }
  absl::StatusOr<std::unique_ptr<Model>> model = LoadModel(absl::GetFlag(FLAGS_model), **backend);
  if (!model.ok()) {
    std::fprintf(stderr, "cuda_bench: %s\n", std::string(model.status().message()).c_str());
    return 1;
  }
  LlamaModel& llama = *(*model)->llama;
  llama.SetKvCacheDType((*backend)->DefaultKvCacheDType());
  const int32_t vocab = (*model)->config.vocab_size;
  std::string json = "{\"backend\": \"" + absl::GetFlag(FLAGS_backend) + "\"";
  std::vector<float> logits;

  for (absl::string_view piece : absl::StrSplit(absl::GetFlag(FLAGS_prefill_tokens), ',')) {
    int32_t n = 0;
    if (!absl::SimpleAtoi(piece, &n) || n <= 0) {
      std::fprintf(stderr, "cuda_bench: bad --prefill_tokens entry '%s'\n",
                   std::string(piece).c_str());
      return 2;
    }
    const std::vector<int32_t> tokens = RandomTokens(n, vocab, 1);
    double best = 1e30;
    for (int rep = 0; rep <= absl::GetFlag(FLAGS_repeats); ++rep) {
      SequenceRunner runner(llama, n);
      const auto start = Clock::now();
      const absl::Status s = runner.Append(tokens, n, /*all_logits=*/false, logits);
      const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
      if (!s.ok()) {
        std::fprintf(stderr, "cuda_bench: prefill %d: %s\n", n, std::string(s.message()).c_str());
        return 1;
      }
      if (rep > 0) best = std::min(best, seconds);  // rep 0 warms up
    }
    json += ", \"prefill_" + std::to_string(n) + "_tokens_per_s\": " + std::to_string(n / best);
  }

  const int32_t context = absl::GetFlag(FLAGS_decode_context);
  const int32_t steps = absl::GetFlag(FLAGS_decode_tokens);
  SequenceRunner runner(llama, context + steps + 1);
  if (absl::Status s = runner.Append(RandomTokens(context, vocab, 2), context, false, logits);
      !s.ok()) {
    std::fprintf(stderr, "cuda_bench: decode prompt: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  const auto start = Clock::now();
  for (int32_t i = 0; i < steps; ++i) {
    const int32_t next =
        static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    const int32_t one[] = {next};
    if (absl::Status s = runner.Append(one, 1, false, logits); !s.ok()) {
      std::fprintf(stderr, "cuda_bench: decode: %s\n", std::string(s.message()).c_str());
      return 1;
    }
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  json += ", \"decode_tokens_per_s\": " + std::to_string(steps / seconds) +
          ", \"decode_context\": " + std::to_string(context) + "}";
  std::printf("%s\n", json.c_str());
  return 0;
}

}  // namespace
}  // namespace ridgeserve

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return ridgeserve::Run();
}
