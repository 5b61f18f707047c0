#include "engine/tools/eval_scoring.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "engine/common/status_macros.h"
#include "engine/sampling/sampler.h"
#include "engine/tools/tool_util.h"
#include "spdlog/spdlog.h"

namespace ridgeserve {
namespace {

using Json = nlohmann::json;

// -log softmax(logits)[target], in double.
double Nll(const float* logits, int32_t vocab, int32_t target) {
  return -LogSoftmaxAt(std::span(logits, vocab), target);
}

}  // namespace

absl::StatusOr<double> PrefillTimer::Time(std::span<const int32_t> prompt,
                                          const RidgeFillRun* fill) {
  runner_.Reset();
  const auto start = ToolClock::now();
  RS_RETURN_IF_ERROR(runner_.Append(prompt, chunk_, /*all_logits=*/false, logits_, fill));
  return SecondsSince(start);
}

absl::StatusOr<std::string> GreedyAnswer(Model& model, std::span<const int32_t> prompt,
                                         const RidgeFillRun* fill, int32_t new_tokens,
                                         int32_t chunk, std::span<const int32_t> rope_positions) {
  SequenceRunner runner(*model.llama, static_cast<int32_t>(prompt.size()) + new_tokens);
  runner.SetRopePositions({rope_positions.begin(), rope_positions.end()});
  std::vector<float> logits;
  RS_RETURN_IF_ERROR(runner.Append(prompt, chunk, /*all_logits=*/false, logits, fill));
  std::vector<int32_t> out;
  for (int32_t i = 0; i < new_tokens; ++i) {
    out.push_back(Argmax(logits));
    if (i + 1 < new_tokens) {
      RS_RETURN_IF_ERROR(runner.Append(std::span(&out.back(), 1), 1, false, logits));
    }
  }
  return model.tokenizer->Decode(out, /*skip_special=*/true);
}

absl::Status AppendScored(Model& model, SequenceRunner& runner, std::span<const int32_t> seq,
                          int32_t end, int32_t chunk, std::vector<double>& nll) {
  const int32_t vocab = model.config.vocab_size;
  std::vector<float> logits;
  for (int32_t begin = runner.length(); begin < end; begin += chunk) {
    const int32_t count = std::min(chunk, end - begin);
    RS_RETURN_IF_ERROR(
        runner.Append(seq.subspan(begin, count), chunk, /*all_logits=*/true, logits));
    for (int32_t i = 0; i < count; ++i) {
      nll.push_back(Nll(&logits[static_cast<size_t>(i) * vocab], vocab, seq[begin + i + 1]));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<double>> ScoreFrom(Model& model, std::span<const int32_t> seq, int32_t r,
                                              const RidgeFillRun* fill, int32_t chunk,
                                              std::span<const int32_t> rope_positions) {
  const int32_t n = static_cast<int32_t>(seq.size());
  SequenceRunner runner(*model.llama, n);
  runner.SetRopePositions({rope_positions.begin(), rope_positions.end()});
  std::vector<float> logits;
  RS_RETURN_IF_ERROR(runner.Append(seq.subspan(0, r + 1), chunk, false, logits, fill));
  std::vector<double> nll = {Nll(logits.data(), model.config.vocab_size, seq[r + 1])};
  RS_RETURN_IF_ERROR(AppendScored(model, runner, seq, n - 1, chunk, nll));
  return nll;
}

absl::StatusOr<std::vector<double>> TailOnlyNll(Model& model, std::span<const int32_t> window,
                                                int32_t f, const std::vector<double>& exact,
                                                int32_t chunk) {
  if (f == 0) return exact;
  std::vector<int32_t> seq = BosPrefix(*model.tokenizer);
  const int32_t head = static_cast<int32_t>(seq.size());
  seq.insert(seq.end(), window.begin() + f, window.end());
  return ScoreFrom(model, seq, head, nullptr, chunk);
}

std::vector<bool> DistantMask(const std::vector<double>& exact,
                              const std::vector<double>& tail_only, double threshold) {
  std::vector<bool> is_distant(exact.size());
  for (size_t i = 0; i < exact.size(); ++i) is_distant[i] = tail_only[i] - exact[i] > threshold;
  return is_distant;
}

Json MeanOrNull(double sum, int64_t count) {
  return count == 0 ? Json(nullptr) : Json(sum / count);
}

absl::StatusOr<Json> RunNeedleTrials(Model& model, const NeedleSetup& o,
                                     const std::vector<NeedleVariant>& variants,
                                     const std::string& method, const NeedleAnswer& answer) {
  if (o.trials < 1 || o.exact_tail_tokens < 1 || o.new_tokens < 1 || o.chunk < 1) {
    return absl::InvalidArgumentError(
        "need --trials >= 1, --exact_tail_tokens >= 1, new tokens >= 1, --chunk >= 1");
  }
  RS_ASSIGN_OR_RETURN(const NeedlePrompts prompts, NeedlePrompts::Create(model, o.haystack_text));
  Json results = Json::array();
  for (int32_t length : o.lengths) {
    for (double depth : o.depths) {
      std::vector<int32_t> exact_hits(variants.size(), 0), hits(variants.size(), 0);
      bool in_filled_region = true;
      Json samples = Json::array();
      for (int32_t trial = 0; trial < o.trials; ++trial) {
        RS_ASSIGN_OR_RETURN(const NeedlePrompt prompt, prompts.Make(o, length, depth, trial));
        in_filled_region = prompt.in_filled_region;
        RS_ASSIGN_OR_RETURN(std::string exact,
                            GreedyAnswer(model, prompt.tokens, nullptr, o.new_tokens, o.chunk));
        const bool exact_hit = exact.find(prompt.number) != std::string::npos;
        Json sample = {{"number", prompt.number},
                       {"needle_position", prompt.needle_position},
                       {"exact", exact}};
        for (size_t v = 0; v < variants.size(); ++v) {
          RS_ASSIGN_OR_RETURN(std::string a, answer(v, prompt));
          exact_hits[v] += exact_hit;
          hits[v] += a.find(prompt.number) != std::string::npos;
          sample[variants[v].name] = a;
        }
        spdlog::info("needle: {} tokens, depth {}, trial {}: {}", length, depth, trial,
                     sample.dump());
        if (trial < 2) samples.push_back(sample);
      }
      for (size_t v = 0; v < variants.size(); ++v) {
        Json row = variants[v].fields;
        row.update({{"prompt_tokens", length},
                    {"depth", depth},
                    {"exact_tail_tokens", o.exact_tail_tokens},
                    {"needle_in_filled_region", in_filled_region},
                    {"trials", o.trials},
                    {"exact_accuracy", static_cast<double>(exact_hits[v]) / o.trials},
                    {absl::StrCat(method, "_accuracy"), static_cast<double>(hits[v]) / o.trials},
                    {"samples", samples}});
        results.push_back(row);
      }
    }
  }
  return results;
}

DistantLossTally::DistantLossTally(size_t variants, double threshold_nats)
    : threshold_nats_(threshold_nats),
      variant_all_(variants, 0.0),
      variant_distant_(variants, 0.0) {}

absl::Status DistantLossTally::AddWindow(Model& model, std::span<const int32_t> window, int32_t f,
                                         int32_t chunk) {
  RS_ASSIGN_OR_RETURN(std::vector<double> exact, ScoreFrom(model, window, f, nullptr, chunk));
  RS_ASSIGN_OR_RETURN(std::vector<double> tail_only, TailOnlyNll(model, window, f, exact, chunk));
  is_distant_ = DistantMask(exact, tail_only, threshold_nats_);
  for (size_t i = 0; i < exact.size(); ++i) {
    auto add = [&](Sums& s) {
      s.exact += exact[i];
      s.tail_only += tail_only[i];
      ++s.count;
    };
    add(all_);
    if (is_distant_[i]) add(distant_);
  }
  return absl::OkStatus();
}

void DistantLossTally::AddVariant(size_t v, const std::vector<double>& nll) {
  for (size_t i = 0; i < nll.size(); ++i) {
    variant_all_[v] += nll[i];
    if (is_distant_[i]) variant_distant_[v] += nll[i];
  }
}

Json DistantLossTally::Summary(size_t v, const std::string& nll_key) const {
  auto summary = [&](const Sums& s, double variant) -> Json {
    return {{"count", s.count},
            {"exact_nll", MeanOrNull(s.exact, s.count)},
            {nll_key, MeanOrNull(variant, s.count)},
            {"tail_only_nll", MeanOrNull(s.tail_only, s.count)},
            {"relative_increase",
             s.count == 0 || s.exact == 0 ? Json(nullptr) : Json((variant - s.exact) / s.exact)}};
  };
  return {{"all_tokens", summary(all_, variant_all_[v])},
          {"distant_tokens", summary(distant_, variant_distant_[v])}};
}

}  // namespace ridgeserve
