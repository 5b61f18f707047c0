#include "engine/tools/eval_spec_pc.h"

#include <algorithm>
#include <limits>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/common/status_macros.h"
#include "engine/draft/spec_pc.h"
#include "engine/kv/paged_kv_cache.h"
#include "engine/tools/eval_drafts.h"
#include "engine/tools/eval_scoring.h"
#include "engine/tools/tool_util.h"
#include "spdlog/spdlog.h"

namespace ridgeserve {
namespace {

using Json = nlohmann::json;

using Setting = DraftSetting;

absl::StatusOr<std::vector<Setting>> Settings(const SpecPcEvalOptions& o) {
  if (o.kernel < 0) return absl::InvalidArgumentError("SpecPC: the kernel must be >= 0");
  return DraftSettings("SpecPC", o.drafts, o.budgets, kSpecPcMinBudget, o.lookahead_tokens);
}

SpecPcParams Params(const Model& model, const SpecPcEvalOptions& o, const Setting& s) {
  SpecPcParams p =
      DefaultSpecPcParams(model.config, s.draft->num_layers, s.budget, o.lookahead_tokens);
  if (o.kernel > 0) p.kernel = o.kernel;
  return p;
}

// The draft phase of `prompt` for one setting.
absl::StatusOr<SpecPcDraftResult> DraftPhase(Model& model, const SpecPcEvalOptions& o,
                                             const Setting& s, std::span<const int32_t> prompt,
                                             int32_t chunk) {
  return RunSpecPcDraft(*s.draft->llama, Params(model, o, s), prompt, chunk,
                        model.llama->kv_cache_dtype());
}

// prompt[kept[0]], prompt[kept[1]], ...: the compressed prompt.
std::vector<int32_t> Gather(std::span<const int32_t> prompt, const std::vector<int32_t>& kept) {
  std::vector<int32_t> out;
  out.reserve(kept.size());
  for (int32_t i : kept) out.push_back(prompt[i]);
  return out;
}

// The kept tokens' RoPE positions for SequenceRunner::SetRopePositions: their prompt
// positions with original_positions, else none (renumbered).
std::span<const int32_t> RopePositions(const SpecPcEvalOptions& o, const SpecPcDraftResult& phase) {
  if (!o.original_positions) return {};
  return phase.kept;
}

}  // namespace

size_t KvBytesPerToken(const ModelConfig& c, int32_t layers, DType dtype) {
  return KvCacheShape{layers, c.num_kv_heads, c.head_dim, 16, 0, dtype}.BytesPerToken();
}

absl::StatusOr<Json> RunSpecPcTtft(Model& model, const SpecPcEvalOptions& sp, const TtftSetup& o) {
  RS_ASSIGN_OR_RETURN(const std::vector<Setting> settings, Settings(sp));
  if (o.repetitions < 1 || o.chunk < 1) {
    return absl::InvalidArgumentError("need --repetitions >= 1, --chunk >= 1");
  }
  const DType kv_dtype = model.llama->kv_cache_dtype();
  const size_t target_bytes = KvBytesPerToken(model.config, model.config.num_layers, kv_dtype);
  Json results = Json::array();
  for (int32_t length : o.prompt_tokens) {
    RS_ASSIGN_OR_RETURN(const std::vector<int32_t> tokens,
                        TtftPrompt(model.config, length, o.prompt_source));
    PrefillTimer timer(model, length, o.chunk);
    for (const Setting& s : settings) {
      double exact = std::numeric_limits<double>::infinity();
      double draft = 0, target = std::numeric_limits<double>::infinity();
      SpecPcDraftResult phase;
      for (int32_t r = 0; r < o.repetitions; ++r) {  // alternated, so drift hits both alike
        RS_ASSIGN_OR_RETURN(const double e, timer.Time(tokens));
        exact = std::min(exact, e);
        const auto start = ToolClock::now();
        RS_ASSIGN_OR_RETURN(phase, DraftPhase(model, sp, s, tokens, o.chunk));
        const double d = SecondsSince(start);
        RS_ASSIGN_OR_RETURN(const double t, timer.Time(Gather(tokens, phase.kept)));
        if (d + t < draft + target) {
          draft = d;
          target = t;
        }
      }
      const int32_t kept = static_cast<int32_t>(phase.kept.size());
      const size_t draft_rows =
          phase.lookahead_ids.empty() ? 0 : length + phase.lookahead_ids.size() - 1;
      spdlog::info(
          "spec-pc ttft: {} tokens, {}, budget {}: exact {:.3f} s, draft {:.3f} s + "
          "target {:.3f} s ({} tokens)",
          length, s.draft->name, s.budget, exact, draft, target, kept);
      Json row = s.Describe();
      row.update({{"prompt_tokens", length},
                  {"original_positions", sp.original_positions},
                  {"kept_tokens", kept},
                  {"exact_seconds", exact},
                  {"draft_seconds", draft},
                  {"target_prefill_seconds", target},
                  {"spec_pc_seconds", draft + target},
                  {"speedup", exact / (draft + target)},
                  {"kv_bytes", kept * target_bytes},
                  {"exact_kv_bytes", length * target_bytes},
                  {"draft_kv_bytes", draft_rows * KvBytesPerToken(s.draft->config(),
                                                                  s.draft->num_layers, kv_dtype)}});
      results.push_back(row);
    }
  }
  return Json{{"results", results},
              {"chunk", o.chunk},
              {"repetitions", o.repetitions},
              {"lookahead_tokens", sp.lookahead_tokens},
              {"prompt", o.prompt_source.empty() ? "random" : "text"}};
}

absl::StatusOr<Json> RunSpecPcNeedle(Model& model, const SpecPcEvalOptions& sp,
                                     const NeedleSetup& o) {
  RS_ASSIGN_OR_RETURN(const std::vector<Setting> settings, Settings(sp));
  std::vector<NeedleVariant> variants;
  for (const Setting& s : settings) {
    Json fields = s.Describe();
    fields["original_positions"] = sp.original_positions;
    variants.push_back({fields, absl::StrCat("spec_pc_", s.draft->name, "_", s.budget)});
  }
  RS_ASSIGN_OR_RETURN(
      const Json results,
      RunNeedleTrials(model, o, variants, "spec_pc",
                      [&](size_t v, const NeedlePrompt& prompt) -> absl::StatusOr<std::string> {
                        RS_ASSIGN_OR_RETURN(
                            const SpecPcDraftResult phase,
                            DraftPhase(model, sp, settings[v], prompt.tokens, o.chunk));
                        return GreedyAnswer(model, Gather(prompt.tokens, phase.kept), nullptr,
                                            o.new_tokens, o.chunk, RopePositions(sp, phase));
                      }));
  return Json{{"results", results}, {"new_tokens", o.new_tokens}};
}

absl::StatusOr<Json> RunSpecPcDistantLoss(Model& model, const SpecPcEvalOptions& sp,
                                          const DistantLossSetup& o) {
  RS_ASSIGN_OR_RETURN(const std::vector<Setting> settings, Settings(sp));
  RS_ASSIGN_OR_RETURN(const std::vector<std::vector<int32_t>> windows, MakeWindows(model, o));
  const int32_t p = o.prompt_tokens;
  const int32_t f = std::max(0, p - o.exact_tail_tokens);  // the compressed context prefix
  DistantLossTally tally(settings.size(), o.distant_threshold_nats);
  std::vector<int32_t> kept(settings.size(), 0);  // min(budget, f) for every window
  for (int32_t w = 0; w < o.windows; ++w) {
    const std::span<const int32_t> window = windows[w];
    RS_RETURN_IF_ERROR(tally.AddWindow(model, window, f, o.chunk));
    for (size_t s = 0; s < settings.size(); ++s) {
      RS_ASSIGN_OR_RETURN(const SpecPcDraftResult phase,
                          DraftPhase(model, sp, settings[s], window.first(f), o.chunk));
      std::vector<int32_t> seq = Gather(window, phase.kept);
      const int32_t c = static_cast<int32_t>(seq.size());
      seq.insert(seq.end(), window.begin() + f, window.end());
      // Row c holds window[f]: the targets are window[f + 1 ..], as for exact.
      RS_ASSIGN_OR_RETURN(const std::vector<double> nll,
                          ScoreFrom(model, seq, c, nullptr, o.chunk, RopePositions(sp, phase)));
      tally.AddVariant(s, nll);
      kept[s] = c;
    }
    spdlog::info("spec-pc distant-loss: window {}/{} done ({} distant tokens so far)", w + 1,
                 o.windows, tally.distant_count());
  }
  Json results = Json::array();
  for (size_t s = 0; s < settings.size(); ++s) {
    Json row = tally.Summary(s, "spec_pc_nll");
    row.update(settings[s].Describe());
    row["kept_tokens"] = kept[s];
    row["original_positions"] = sp.original_positions;
    results.push_back(row);
  }
  return Json{{"results", results},
              {"prompt_tokens", p},
              {"exact_tail_tokens", std::min(o.exact_tail_tokens, p)},
              {"prefix_tokens", f},
              {"windows", o.windows},
              {"distant_threshold_nats", o.distant_threshold_nats}};
}

}  // namespace ridgeserve
