#include "server/warm_up.h"

#include <condition_variable>
#include <memory>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace ridgeserve {

absl::Status WarmUp(Engine& engine, const Model& model, absl::Duration timeout) {
  // Shared with the engine callback, which may outlive this function on timeout.
  struct Result {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    absl::Status status;
    int32_t tokens = 0;
  };
  auto result = std::make_shared<Result>();

  EngineRequest request;
  request.prompt = model.tokenizer->Encode("The capital of France is", /*add_bos=*/true,
                                           /*parse_special=*/false);
  request.sampling.temperature = 0.0f;
  request.sampling.ignore_eos = true;  // always exercise a few decode steps
  request.max_new_tokens = 4;
  request.on_event = [result](const TokenEvent& event) {
    std::lock_guard<std::mutex> lock(result->mu);
    result->tokens += static_cast<int32_t>(event.tokens.size());
    if (event.finished) {
      result->done = true;
      result->status = event.status;
      result->cv.notify_all();
    }
  };
  const absl::Time start = absl::Now();
  absl::StatusOr<uint64_t> id = engine.Submit(std::move(request));
  if (!id.ok()) return id.status();

  std::unique_lock<std::mutex> lock(result->mu);
  if (!result->cv.wait_for(lock, absl::ToChronoMilliseconds(timeout),
                           [&] { return result->done; })) {
    engine.Abort(*id);
    return absl::DeadlineExceededError(
        absl::StrCat("warm-up generation did not finish within ", absl::FormatDuration(timeout)));
  }
  if (!result->status.ok()) return result->status;
  spdlog::info("warm-up: {} tokens in {:.3f} s", result->tokens,
               absl::ToDoubleSeconds(absl::Now() - start));
  return absl::OkStatus();
}

}  // namespace ridgeserve
