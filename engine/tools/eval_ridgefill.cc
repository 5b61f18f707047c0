#include "engine/tools/eval_ridgefill.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/common/status_macros.h"
#include "engine/ridgefill/ridgefill_maps.h"
#include "engine/tools/sequence_runner.h"
#include "engine/tools/tool_util.h"
#include "spdlog/spdlog.h"

namespace ridgeserve {
namespace {

using Json = nlohmann::json;

// RidgeFillRun's default: rows at positions < 4 stay exact (attention sinks).
constexpr int32_t kSinkTokens = RidgeFillRun{}.sink_tokens;

// -log softmax(logits)[target], in double.
double Nll(const float* logits, int32_t vocab, int32_t target) {
  double max = logits[0];
  for (int32_t i = 1; i < vocab; ++i) max = std::max<double>(max, logits[i]);
  double sum = 0;
  for (int32_t i = 0; i < vocab; ++i) sum += std::exp(logits[i] - max);
  return -(logits[target] - max - std::log(sum));
}

int32_t ArgMax(const std::vector<float>& logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

// The model's BOS prefix ([] when it wants none).
std::vector<int32_t> BosPrefix(const Tokenizer& tok) {
  return tok.Encode("", /*add_bos=*/true, /*parse_special=*/false);
}

absl::Status CheckSplits(const Model& model, const std::vector<int32_t>& splits) {
  if (splits.empty()) return absl::InvalidArgumentError("no split layers to evaluate");
  const RidgeFillMaps* maps = model.llama->ridgefill_maps();
  for (int32_t s : splits) {
    if (maps == nullptr || maps->FindSplit(s) == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("no RidgeFill maps for split layer ", s));
    }
  }
  return absl::OkStatus();
}

// Prefills `prompt` (RidgeFill when `fill`) and greedily decodes `new_tokens` exact tokens.
absl::StatusOr<std::string> GreedyAnswer(Model& model, std::span<const int32_t> prompt,
                                         const RidgeFillRun* fill, int32_t new_tokens,
                                         int32_t chunk) {
  SequenceRunner runner(*model.llama, static_cast<int32_t>(prompt.size()) + new_tokens);
  std::vector<float> logits;
  RS_RETURN_IF_ERROR(runner.Append(prompt, chunk, /*all_logits=*/false, logits, fill));
  std::vector<int32_t> out;
  for (int32_t i = 0; i < new_tokens; ++i) {
    out.push_back(ArgMax(logits));
    if (i + 1 < new_tokens) {
      RS_RETURN_IF_ERROR(runner.Append(std::span(&out.back(), 1), 1, false, logits));
    }
  }
  return model.tokenizer->Decode(out, /*skip_special=*/true);
}

// Next-token NLLs of seq[r + 1 ..] given seq[.. r], ..., i.e. from rows r .. size - 2. Row r
// and everything before it is one Append (RidgeFill when `fill`; row r itself must be exact),
// the rest exact in pieces of `chunk` rows so the logits stay small ([chunk, vocab]).
absl::StatusOr<std::vector<double>> ScoreFrom(Model& model, std::span<const int32_t> seq, int32_t r,
                                              const RidgeFillRun* fill, int32_t chunk) {
  const int32_t vocab = model.config.vocab_size;
  const int32_t n = static_cast<int32_t>(seq.size());
  SequenceRunner runner(*model.llama, n);
  std::vector<float> logits;
  std::vector<double> nll;
  RS_RETURN_IF_ERROR(runner.Append(seq.subspan(0, r + 1), chunk, false, logits, fill));
  nll.push_back(Nll(logits.data(), vocab, seq[r + 1]));
  // Rows r + 1 .. n - 2 predict seq[r + 2 .. n - 1]; the last row predicts nothing.
  for (int32_t begin = r + 1; begin < n - 1; begin += chunk) {
    const int32_t count = std::min(chunk, n - 1 - begin);
    RS_RETURN_IF_ERROR(
        runner.Append(seq.subspan(begin, count), chunk, /*all_logits=*/true, logits));
    for (int32_t i = 0; i < count; ++i) {
      nll.push_back(Nll(&logits[static_cast<size_t>(i) * vocab], vocab, seq[begin + i + 1]));
    }
  }
  return nll;
}

}  // namespace

absl::StatusOr<Json> RunNeedle(Model& model, const NeedleOptions& o) {
  RS_RETURN_IF_ERROR(CheckSplits(model, o.splits));
  if (o.trials < 1 || o.exact_tail_tokens < 1 || o.new_tokens < 1 || o.chunk < 1) {
    return absl::InvalidArgumentError(
        "need --trials >= 1, --exact_tail_tokens >= 1, new tokens >= 1, --chunk >= 1");
  }
  const Tokenizer& tok = *model.tokenizer;
  const std::vector<int32_t> hay = tok.Encode(o.haystack_text, false, false);
  if (hay.empty()) return absl::InvalidArgumentError("--haystack has no tokens");
  const std::vector<int32_t> bos = BosPrefix(tok);
  // Plain completion (no chat template): the question ends in the needle's own wording so
  // that the answer is the next tokens.
  const std::vector<int32_t> question =
      tok.Encode("\n\nWhat is the secret passphrase? The secret passphrase is", false, false);
  Json results = Json::array();
  for (int32_t length : o.lengths) {
    for (double depth : o.depths) {
      if (depth < 0 || depth > 1) {
        return absl::InvalidArgumentError(absl::StrCat("--depths: ", depth, " is outside [0, 1]"));
      }
      std::vector<int32_t> exact_hits(o.splits.size(), 0), fill_hits(o.splits.size(), 0);
      int32_t exact_total = 0;
      bool in_filled_region = true;
      Json samples = Json::array();
      for (int32_t trial = 0; trial < o.trials; ++trial) {
        // Different number and haystack offset per trial, reproducible per (length, depth).
        std::mt19937_64 rng(o.seed * 1000003 + length * 101 + static_cast<int>(depth * 1000) +
                            trial * 7919);
        const std::string number =
            std::to_string(std::uniform_int_distribution<int32_t>(10000, 99999)(rng));
        const std::vector<int32_t> needle =
            tok.Encode(absl::StrCat("\nThe secret passphrase is ", number, ".\n"), false, false);
        const int32_t n = static_cast<int32_t>(needle.size());
        const int32_t head = static_cast<int32_t>(bos.size());
        const int32_t q = static_cast<int32_t>(question.size());
        if (length > model.config.context_length || length < head + n + q + 1) {
          return absl::InvalidArgumentError(
              absl::StrCat("--lengths: ", length, " cannot hold BOS, needle and question"));
        }
        const int32_t filled = std::max(0, length - o.exact_tail_tokens);
        // Needle start position: inside [sink, filled) when it fits, else anywhere before
        // the question.
        int32_t lo = std::max(kSinkTokens, head), hi = filled - n;
        if (hi < lo) {
          in_filled_region = false;
          lo = head;
          hi = length - q - n;
        }
        const int32_t pos = lo + static_cast<int32_t>(std::lround(depth * (hi - lo)));
        size_t h = std::uniform_int_distribution<size_t>(0, hay.size() - 1)(rng);
        std::vector<int32_t> prompt = bos;
        while (static_cast<int32_t>(prompt.size()) < pos) prompt.push_back(hay[h++ % hay.size()]);
        prompt.insert(prompt.end(), needle.begin(), needle.end());
        while (static_cast<int32_t>(prompt.size()) < length - q) {
          prompt.push_back(hay[h++ % hay.size()]);
        }
        prompt.insert(prompt.end(), question.begin(), question.end());

        RS_ASSIGN_OR_RETURN(std::string exact,
                            GreedyAnswer(model, prompt, nullptr, o.new_tokens, o.chunk));
        const bool exact_hit = exact.find(number) != std::string::npos;
        ++exact_total;
        Json sample = {{"number", number}, {"needle_position", pos}, {"exact", exact}};
        for (size_t s = 0; s < o.splits.size(); ++s) {
          RidgeFillRun fill;
          fill.split_layer = o.splits[s];
          fill.filled_tokens = filled;
          RS_ASSIGN_OR_RETURN(std::string answer,
                              GreedyAnswer(model, prompt, &fill, o.new_tokens, o.chunk));
          exact_hits[s] += exact_hit;
          fill_hits[s] += answer.find(number) != std::string::npos;
          sample[absl::StrCat("ridgefill_", o.splits[s])] = answer;
        }
        spdlog::info("needle: {} tokens, depth {}, trial {}: {}", length, depth, trial,
                     sample.dump());
        if (trial < 2) samples.push_back(sample);
      }
      for (size_t s = 0; s < o.splits.size(); ++s) {
        results.push_back({{"prompt_tokens", length},
                           {"depth", depth},
                           {"split_layer", o.splits[s]},
                           {"exact_tail_tokens", o.exact_tail_tokens},
                           {"filled_tokens", std::max(0, length - o.exact_tail_tokens)},
                           {"needle_in_filled_region", in_filled_region},
                           {"trials", exact_total},
                           {"exact_accuracy", static_cast<double>(exact_hits[s]) / exact_total},
                           {"ridgefill_accuracy", static_cast<double>(fill_hits[s]) / exact_total},
                           {"samples", samples}});
      }
    }
  }
  return Json{{"results", results}, {"new_tokens", o.new_tokens}, {"sink_tokens", kSinkTokens}};
}

absl::StatusOr<Json> RunDistantLoss(Model& model, const DistantLossOptions& o) {
  RS_RETURN_IF_ERROR(CheckSplits(model, o.splits));
  const int32_t p = o.prompt_tokens;
  if (p < 3 || p > model.config.context_length || o.exact_tail_tokens < 2 || o.windows < 1 ||
      o.chunk < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("need 3 <= --prompt_tokens <= ", model.config.context_length,
                     ", --exact_tail_tokens >= 2, --windows >= 1, --chunk >= 1"));
  }
  const Tokenizer& tok = *model.tokenizer;
  const std::vector<int32_t> bos = BosPrefix(tok);
  const std::vector<int32_t> text = tok.Encode(o.text, false, false);
  const int32_t body = p - static_cast<int32_t>(bos.size());
  if (static_cast<int64_t>(text.size()) < static_cast<int64_t>(body) * o.windows) {
    return absl::InvalidArgumentError(absl::StrCat("--text has ", text.size(), " tokens; ",
                                                   o.windows, " windows of ", p, " need ",
                                                   static_cast<int64_t>(body) * o.windows));
  }
  // Window layout: [BOS] text[w * body ..], prefix rows 0 .. f - 1, tail rows f .. p - 1.
  // Scored: targets window[f + 1 .. p - 1] (the first tail token's predictor, row f - 1,
  // is filled under RidgeFill, so it is left out for every mode alike).
  const int32_t f = std::max(0, p - o.exact_tail_tokens);
  struct Sums {
    double exact = 0, fill = 0, tail_only = 0;
    int64_t count = 0;
  };
  Sums all;
  std::vector<Sums> fill_all(o.splits.size()), fill_distant(o.splits.size());
  Sums distant;
  for (int32_t w = 0; w < o.windows; ++w) {
    std::vector<int32_t> window = bos;
    window.insert(window.end(), text.begin() + static_cast<int64_t>(w) * body,
                  text.begin() + static_cast<int64_t>(w + 1) * body);
    RS_ASSIGN_OR_RETURN(std::vector<double> exact, ScoreFrom(model, window, f, nullptr, o.chunk));
    // The tail alone, behind the same BOS (without it the first rows lack their attention
    // sink and would look "distant-dependent" for the wrong reason).
    std::vector<double> tail_only;
    if (f == 0) {
      tail_only = exact;
    } else {
      std::vector<int32_t> seq = bos;
      seq.insert(seq.end(), window.begin() + f, window.end());
      RS_ASSIGN_OR_RETURN(
          tail_only, ScoreFrom(model, seq, static_cast<int32_t>(bos.size()), nullptr, o.chunk));
    }
    std::vector<bool> is_distant(exact.size());
    for (size_t i = 0; i < exact.size(); ++i) {
      is_distant[i] = tail_only[i] - exact[i] > o.distant_threshold_nats;
      all.exact += exact[i];
      all.tail_only += tail_only[i];
      ++all.count;
      if (is_distant[i]) {
        distant.exact += exact[i];
        distant.tail_only += tail_only[i];
        ++distant.count;
      }
    }
    for (size_t s = 0; s < o.splits.size(); ++s) {
      RidgeFillRun fill;
      fill.split_layer = o.splits[s];
      fill.filled_tokens = f;
      RS_ASSIGN_OR_RETURN(std::vector<double> rf, ScoreFrom(model, window, f, &fill, o.chunk));
      for (size_t i = 0; i < rf.size(); ++i) {
        fill_all[s].fill += rf[i];
        if (is_distant[i]) fill_distant[s].fill += rf[i];
      }
    }
    spdlog::info("distant-loss: window {}/{} done ({} distant tokens so far)", w + 1, o.windows,
                 distant.count);
  }
  auto mean = [](double sum, int64_t count) -> Json {
    return count == 0 ? Json(nullptr) : Json(sum / count);
  };
  auto increase = [](double exact, double fill, int64_t count) -> Json {
    return count == 0 || exact == 0 ? Json(nullptr) : Json((fill - exact) / exact);
  };
  Json splits = Json::array();
  for (size_t s = 0; s < o.splits.size(); ++s) {
    splits.push_back(
        {{"split_layer", o.splits[s]},
         {"all_tokens",
          {{"count", all.count},
           {"exact_nll", mean(all.exact, all.count)},
           {"ridgefill_nll", mean(fill_all[s].fill, all.count)},
           {"tail_only_nll", mean(all.tail_only, all.count)},
           {"relative_increase", increase(all.exact, fill_all[s].fill, all.count)}}},
         {"distant_tokens",
          {{"count", distant.count},
           {"exact_nll", mean(distant.exact, distant.count)},
           {"ridgefill_nll", mean(fill_distant[s].fill, distant.count)},
           {"tail_only_nll", mean(distant.tail_only, distant.count)},
           {"relative_increase", increase(distant.exact, fill_distant[s].fill, distant.count)}}}});
  }
  Json out = {{"prompt_tokens", p},
              {"exact_tail_tokens", std::min(o.exact_tail_tokens, p)},
              {"filled_tokens", f},
              {"windows", o.windows},
              {"distant_threshold_nats", o.distant_threshold_nats},
              {"splits", splits}};
  if (splits.size() == 1) {
    for (const auto& [key, value] : splits[0].items()) out[key] = value;
  }
  return out;
}

}  // namespace ridgeserve
