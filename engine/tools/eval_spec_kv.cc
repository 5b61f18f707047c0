#include "engine/tools/eval_spec_kv.h"

#include <algorithm>
#include <limits>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/common/status_macros.h"
#include "engine/draft/spec_kv.h"
#include "engine/draft/spec_pc.h"
#include "engine/sampling/sampler.h"
#include "engine/tools/eval_drafts.h"
#include "engine/tools/eval_scoring.h"
#include "engine/tools/eval_spec_pc.h"
#include "engine/tools/tool_util.h"
#include "spdlog/spdlog.h"

namespace ridgeserve {
namespace {

using Json = nlohmann::json;

using Setting = DraftSetting;

absl::StatusOr<std::vector<Setting>> Settings(const SpecKvEvalOptions& o) {
  return DraftSettings("SpecKV", o.drafts, o.budgets, kSpecKvMinBudget, o.lookahead_tokens);
}

// `prompt` through SpecKV with a lookahead of at most `lookahead` tokens; `logits` gets the
// first token's.
absl::Status Prefill(Model& model, const Setting& s, int32_t lookahead,
                     std::span<const int32_t> prompt, int32_t chunk, SpecKvSequence& sequence,
                     std::vector<float>& logits) {
  SpecKvParams params;
  params.budget = s.budget;
  params.lookahead_tokens = lookahead;
  return sequence.Prefill(*s.draft->llama, s.draft->num_layers, params, prompt, chunk,
                          model.tokenizer->end_of_generation_ids(), logits);
}

}  // namespace

absl::StatusOr<Json> RunSpecKvTtft(Model& model, const SpecKvEvalOptions& sk, const TtftSetup& o) {
  RS_ASSIGN_OR_RETURN(const std::vector<Setting> settings, Settings(sk));
  if (o.repetitions < 1 || o.chunk < 1) {
    return absl::InvalidArgumentError("need --repetitions >= 1, --chunk >= 1");
  }
  const DType kv_dtype = model.llama->kv_cache_dtype();
  const size_t bytes = KvBytesPerToken(model.config, model.config.num_layers, kv_dtype);
  Json results = Json::array();
  std::vector<float> logits;
  for (int32_t length : o.prompt_tokens) {
    RS_ASSIGN_OR_RETURN(const std::vector<int32_t> tokens,
                        TtftPrompt(model.config, length, o.prompt_source));
    PrefillTimer timer(model, length, o.chunk);
    for (const Setting& s : settings) {
      double exact = std::numeric_limits<double>::infinity();
      double spec = std::numeric_limits<double>::infinity();
      for (int32_t r = 0; r < o.repetitions; ++r) {  // alternated, so drift hits both alike
        RS_ASSIGN_OR_RETURN(const double e, timer.Time(tokens));
        exact = std::min(exact, e);
        SpecKvSequence sequence(*model.llama, length, sk.lookahead_tokens, kv_dtype);
        const auto start = ToolClock::now();
        RS_RETURN_IF_ERROR(
            Prefill(model, s, sk.lookahead_tokens, tokens, o.chunk, sequence, logits));
        spec = std::min(spec, SecondsSince(start));
      }
      const int32_t kept = std::min(s.budget, length);
      spdlog::info("spec-kv ttft: {} tokens, {}, budget {}: exact {:.3f} s, spec-kv {:.3f} s",
                   length, s.draft->name, s.budget, exact, spec);
      Json row = s.Describe();
      row.update({{"prompt_tokens", length},
                  {"exact_seconds", exact},
                  {"spec_kv_seconds", spec},
                  {"speedup", exact / spec},
                  {"kv_bytes", kept * bytes},
                  {"exact_kv_bytes", length * bytes}});
      results.push_back(row);
    }
  }
  return Json{{"results", results},
              {"chunk", o.chunk},
              {"repetitions", o.repetitions},
              {"lookahead_tokens", sk.lookahead_tokens}};
}

absl::StatusOr<Json> RunSpecKvNeedle(Model& model, const SpecKvEvalOptions& sk,
                                     const NeedleSetup& o) {
  RS_ASSIGN_OR_RETURN(const std::vector<Setting> settings, Settings(sk));
  std::vector<NeedleVariant> variants;
  for (const Setting& s : settings) {
    variants.push_back({s.Describe(), absl::StrCat("spec_kv_", s.draft->name, "_", s.budget)});
  }
  const int32_t lookahead = std::min(sk.lookahead_tokens, o.new_tokens);
  RS_ASSIGN_OR_RETURN(
      const Json results,
      RunNeedleTrials(model, o, variants, "spec_kv",
                      [&](size_t v, const NeedlePrompt& prompt) -> absl::StatusOr<std::string> {
                        SpecKvSequence sequence(*model.llama,
                                                static_cast<int32_t>(prompt.tokens.size()),
                                                o.new_tokens, model.llama->kv_cache_dtype());
                        std::vector<float> logits;
                        RS_RETURN_IF_ERROR(Prefill(model, settings[v], lookahead, prompt.tokens,
                                                   o.chunk, sequence, logits));
                        std::vector<int32_t> answer;  // as GreedyAnswer decodes
                        for (int32_t i = 0; i < o.new_tokens; ++i) {
                          answer.push_back(Argmax(logits));
                          if (i + 1 == o.new_tokens) break;
                          const int32_t one[] = {answer.back()};
                          RS_RETURN_IF_ERROR(sequence.Append(one, 1, false, logits));
                        }
                        return model.tokenizer->Decode(answer, /*skip_special=*/true);
                      }));
  return Json{{"results", results}, {"new_tokens", o.new_tokens}};
}

absl::StatusOr<Json> RunSpecKvDistantLoss(Model& model, const SpecKvEvalOptions& sk,
                                          const DistantLossSetup& o) {
  RS_ASSIGN_OR_RETURN(const std::vector<Setting> settings, Settings(sk));
  RS_ASSIGN_OR_RETURN(const std::vector<std::vector<int32_t>> windows, MakeWindows(model, o));
  const int32_t p = o.prompt_tokens;
  const int32_t f = p - o.exact_tail_tokens;  // the context prefix, through SpecKV
  if (f < 1) {
    return absl::InvalidArgumentError("SpecKV distant-loss: the tail must leave a prefix");
  }
  const int32_t vocab = model.config.vocab_size;
  DistantLossTally tally(settings.size(), o.distant_threshold_nats);
  for (int32_t w = 0; w < o.windows; ++w) {
    const std::span<const int32_t> window = windows[w];
    RS_RETURN_IF_ERROR(tally.AddWindow(model, window, f, o.chunk));
    for (size_t s = 0; s < settings.size(); ++s) {
      SpecKvSequence sequence(*model.llama, p, sk.lookahead_tokens, model.llama->kv_cache_dtype());
      std::vector<float> logits;
      RS_RETURN_IF_ERROR(Prefill(model, settings[s], sk.lookahead_tokens, window.first(f), o.chunk,
                                 sequence, logits));
      // The tail after the kept entries; row i (window[f + i]) predicts window[f + i + 1].
      std::vector<double> nll;
      for (int32_t begin = f; begin < p - 1; begin += o.chunk) {
        const int32_t end = std::min(p - 1, begin + o.chunk);
        RS_RETURN_IF_ERROR(
            sequence.Append(window.subspan(begin, end - begin), o.chunk, true, logits));
        for (int32_t i = begin; i < end; ++i) {
          const std::span<const float> row(logits.data() + size_t(i - begin) * vocab, vocab);
          nll.push_back(-LogSoftmaxAt(row, window[i + 1]));
        }
      }
      tally.AddVariant(s, nll);
    }
    spdlog::info("spec-kv distant-loss: window {}/{} done ({} distant tokens so far)", w + 1,
                 o.windows, tally.distant_count());
  }
  Json results = Json::array();
  for (size_t s = 0; s < settings.size(); ++s) {
    Json row = tally.Summary(s, "spec_kv_nll");
    row.update(settings[s].Describe());
    results.push_back(row);
  }
  return Json{{"results", results},
              {"prompt_tokens", p},
              {"exact_tail_tokens", p - f},
              {"prefix_tokens", f},
              {"windows", o.windows},
              {"distant_threshold_nats", o.distant_threshold_nats},
              {"lookahead_tokens", sk.lookahead_tokens}};
}

}  // namespace ridgeserve
