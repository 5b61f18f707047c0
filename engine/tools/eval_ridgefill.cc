#include "engine/tools/eval_ridgefill.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/common/status_macros.h"
#include "engine/ridgefill/ridgefill_maps.h"
#include "engine/ridgefill/ridgefill_plan.h"
#include "engine/sampling/sampler.h"
#include "engine/tools/eval_scoring.h"
#include "engine/tools/sequence_runner.h"
#include "spdlog/spdlog.h"

namespace ridgeserve {
namespace {

using Json = nlohmann::json;

// The server's default: rows at positions < 4 stay exact (attention sinks).
constexpr int32_t kSinkTokens = RidgeFillPlanOptions{}.sink_tokens;

// RidgeFill of `tokens` as one Append with the server's planner and its defaults (the sinks,
// the last `exact_tail` rows and special tokens stay exact).
absl::StatusOr<RidgeFillRun> PlanFill(const Model& model, const RidgeFillMaps* maps,
                                      std::span<const int32_t> tokens, int32_t split,
                                      int32_t exact_tail) {
  RidgeFillPlanOptions plan;
  plan.exact_tail_tokens = exact_tail;
  RidgeFillRun fill{split, {}, maps};
  RS_ASSIGN_OR_RETURN(fill.filled_rows, PlanRidgeFillRows(tokens, plan, [&](int32_t t) {
                        return model.tokenizer->IsSpecial(t);
                      }));
  return fill;
}

absl::Status CheckSplits(const RidgeFillMaps* maps, const std::vector<int32_t>& splits) {
  if (splits.empty()) return absl::InvalidArgumentError("no split layers to evaluate");
  for (int32_t s : splits) {
    if (maps == nullptr || maps->FindSplit(s) == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("no RidgeFill maps for split layer ", s));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Json> RunNeedle(Model& model, const NeedleOptions& o) {
  RS_RETURN_IF_ERROR(CheckSplits(o.maps, o.splits));
  std::vector<NeedleVariant> variants;
  for (int32_t split : o.splits) {
    variants.push_back({{{"split_layer", split}}, absl::StrCat("ridgefill_", split)});
  }
  RS_ASSIGN_OR_RETURN(
      Json results,
      RunNeedleTrials(model, o, variants, "ridgefill",
                      [&](size_t v, const NeedlePrompt& prompt) -> absl::StatusOr<std::string> {
                        RS_ASSIGN_OR_RETURN(const RidgeFillRun fill,
                                            PlanFill(model, o.maps, prompt.tokens, o.splits[v],
                                                     o.exact_tail_tokens));
                        return GreedyAnswer(model, prompt.tokens, &fill, o.new_tokens, o.chunk);
                      }));
  for (Json& row : results) {
    row["filled_tokens"] = std::max(0, row["prompt_tokens"].get<int32_t>() - o.exact_tail_tokens);
  }
  return Json{{"results", results}, {"new_tokens", o.new_tokens}, {"sink_tokens", kSinkTokens}};
}

absl::StatusOr<Json> RunDistantLoss(Model& model, const DistantLossOptions& o) {
  RS_RETURN_IF_ERROR(CheckSplits(o.maps, o.splits));
  RS_ASSIGN_OR_RETURN(const std::vector<std::vector<int32_t>> windows, MakeWindows(model, o));
  const int32_t p = o.prompt_tokens;
  // Window layout: prefix rows 0 .. f - 1, tail rows f .. p - 1. Scored: targets
  // window[f + 1 .. p - 1] (the first tail token's predictor, row f - 1, is filled under
  // RidgeFill, so it is left out for every mode alike).
  const int32_t f = std::max(0, p - o.exact_tail_tokens);
  DistantLossTally tally(o.splits.size(), o.distant_threshold_nats);
  for (int32_t w = 0; w < o.windows; ++w) {
    const std::vector<int32_t>& window = windows[w];
    RS_RETURN_IF_ERROR(tally.AddWindow(model, window, f, o.chunk));
    for (size_t s = 0; s < o.splits.size(); ++s) {
      RS_ASSIGN_OR_RETURN(const RidgeFillRun fill,
                          PlanFill(model, o.maps, std::span(window).first(f + 1), o.splits[s], 1));
      RS_ASSIGN_OR_RETURN(std::vector<double> rf, ScoreFrom(model, window, f, &fill, o.chunk));
      tally.AddVariant(s, rf);
    }
    spdlog::info("distant-loss: window {}/{} done ({} distant tokens so far)", w + 1, o.windows,
                 tally.distant_count());
  }
  Json splits = Json::array();
  for (size_t s = 0; s < o.splits.size(); ++s) {
    Json split = tally.Summary(s, "ridgefill_nll");
    split["split_layer"] = o.splits[s];
    splits.push_back(split);
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

absl::StatusOr<Json> RunNextTokenKl(Model& model, const NextTokenKlOptions& o) {
  RS_RETURN_IF_ERROR(CheckSplits(o.maps, o.splits));
  if (o.tokens.empty() || o.exact_tail_tokens < 1 || o.chunk < 1) {
    return absl::InvalidArgumentError(
        "need input tokens, --exact_tail_tokens >= 1 and --chunk >= 1");
  }
  SequenceRunner runner(model, static_cast<int32_t>(o.tokens.size()));
  std::vector<float> logits;
  RS_RETURN_IF_ERROR(runner.Append(o.tokens, o.chunk, /*all_logits=*/false, logits));
  const std::vector<float> exact = LogSoftmax(logits);
  Json splits = Json::array();
  for (int32_t split : o.splits) {
    RS_ASSIGN_OR_RETURN(const RidgeFillRun fill,
                        PlanFill(model, o.maps, o.tokens, split, o.exact_tail_tokens));
    runner.Reset();
    RS_RETURN_IF_ERROR(runner.Append(o.tokens, o.chunk, /*all_logits=*/false, logits, &fill));
    const std::vector<float> filled = LogSoftmax(logits);
    const DistributionGap gap = CompareDistributions(exact, filled);
    splits.push_back({{"split_layer", split},
                      {"filled_tokens", fill.filled()},
                      {"kl", gap.kl},
                      {"top1_agree", gap.top1_agree},
                      {"exact_top1", Argmax(exact)},
                      {"ridgefill_top1", Argmax(filled)}});
    spdlog::info("next-token-kl: split {}, {} rows filled: KL {:.6f}, top-1 {}", split,
                 fill.filled(), gap.kl, gap.top1_agree ? "agrees" : "differs");
  }
  return Json{{"prompt_tokens", o.tokens.size()},
              {"exact_tail_tokens", o.exact_tail_tokens},
              {"splits", splits}};
}

absl::StatusOr<Json> RunTtft(Model& model, const TtftOptions& o) {
  RS_RETURN_IF_ERROR(CheckSplits(o.maps, o.splits));
  const int32_t tail = o.exact_tail_tokens;
  if (tail < 1 || o.repetitions < 1 || o.chunk < 1) {
    return absl::InvalidArgumentError(
        "need --exact_tail_tokens >= 1, --repetitions >= 1, --chunk >= 1");
  }
  Json results = Json::array();
  for (int32_t length : o.prompt_tokens) {
    RS_ASSIGN_OR_RETURN(const std::vector<int32_t> tokens,
                        TtftPrompt(model.config, length, o.prompt_source));
    PrefillTimer timer(model, length, o.chunk);
    for (int32_t split : o.splits) {
      RS_ASSIGN_OR_RETURN(const RidgeFillRun fill, PlanFill(model, o.maps, tokens, split, tail));
      double exact = std::numeric_limits<double>::infinity();
      double ridgefill = std::numeric_limits<double>::infinity();
      double estimated = 0;                          // from the fastest RidgeFill run
      for (int32_t r = 0; r < o.repetitions; ++r) {  // alternated, so drift hits both alike
        RS_ASSIGN_OR_RETURN(double e, timer.Time(tokens));
        RS_ASSIGN_OR_RETURN(double f, timer.Time(tokens, &fill));
        exact = std::min(exact, e);
        if (f < ridgefill) estimated = timer.runner().estimated_saved_seconds();
        ridgefill = std::min(ridgefill, f);
      }
      spdlog::info(
          "ttft: {} tokens, split {}, tail {}: exact {:.3f} s, ridgefill {:.3f} s, "
          "saved {:.3f} s (estimated in-pass {:.3f} s)",
          length, split, tail, exact, ridgefill, exact - ridgefill, estimated);
      results.push_back({{"prompt_tokens", length},
                         {"split_layer", split},
                         {"exact_tail_tokens", tail},
                         {"filled_tokens", fill.filled()},
                         {"exact_seconds", exact},
                         {"ridgefill_seconds", ridgefill},
                         {"speedup", exact / ridgefill},
                         {"measured_saved_seconds", exact - ridgefill},
                         {"estimated_saved_seconds", estimated},
                         {"promoted_rows", timer.runner().promoted_rows()}});
    }
  }
  return Json{{"results", results},
              {"chunk", o.chunk},
              {"repetitions", o.repetitions},
              {"prompt", o.prompt_source.empty() ? "random" : "text"}};
}

namespace {

// K/V of one sequence's positions [0, rows) in layers [first_layer, num_layers), on the host.
struct HostKv {
  int32_t first_layer = 0;
  int32_t rows = 0;
  int32_t kv_dim = 0;
  std::vector<std::vector<float>> k, v;  // per layer from first_layer: [rows, kv_dim]

  float* K(int32_t layer) { return k[layer - first_layer].data(); }
  float* V(int32_t layer) { return v[layer - first_layer].data(); }
  const float* K(int32_t layer) const { return k[layer - first_layer].data(); }
  const float* V(int32_t layer) const { return v[layer - first_layer].data(); }
};

// Copies K/V between a runner's cache slots and `host` (to_host: cache -> host), one run of
// positions within a block at a time (a block's slots are contiguous).
void CopyKv(Backend& backend, SequenceRunner& runner, HostKv& host, bool to_host) {
  PagedKvCache& cache = runner.mutable_cache();
  const int32_t block_size = cache.shape().block_size;
  const size_t row_floats = host.kv_dim;
  for (size_t i = 0; i < host.k.size(); ++i) {
    const int32_t layer = host.first_layer + static_cast<int32_t>(i);
    for (int32_t p = 0; p < host.rows;) {
      const int32_t run = std::min(block_size - p % block_size, host.rows - p);
      const int32_t slot = runner.block_table().Slot(p, block_size);
      float* hk = host.k[i].data() + p * row_floats;
      float* hv = host.v[i].data() + p * row_floats;
      if (to_host) {
        cache.CopyToHost(backend, layer, slot, run, hk, hv);
      } else {
        cache.CopyFromHost(backend, layer, slot, run, hk, hv);
      }
      p += run;
    }
  }
}

HostKv ReadKv(Backend& backend, SequenceRunner& runner, int32_t first_layer, int32_t rows,
              const ModelConfig& c) {
  HostKv host{first_layer, rows, c.kv_dim(), {}, {}};
  const size_t floats = static_cast<size_t>(rows) * c.kv_dim();
  host.k.assign(c.num_layers - first_layer, std::vector<float>(floats));
  host.v.assign(c.num_layers - first_layer, std::vector<float>(floats));
  CopyKv(backend, runner, host, /*to_host=*/true);
  return host;
}

// What a splice variant takes from the exact prefill (A) in a spliced layer; the rest is
// RidgeFill's (B).
struct SpliceVariant {
  std::string name;
  bool exact_k = false;
  bool exact_v = false;
  bool exact_key_norm = false;  // B's key head-vectors rescaled to A's norms
  int32_t only_layer = -1;      // >= 0: splice this layer only
};

// B's K/V with the variant's parts taken from A, for layers [mix.first_layer, num_layers).
void Splice(const SpliceVariant& variant, const HostKv& a, const HostKv& b, int32_t head_dim,
            HostKv& mix) {
  const size_t floats = static_cast<size_t>(mix.rows) * mix.kv_dim;
  for (int32_t l = mix.first_layer; l < mix.first_layer + static_cast<int32_t>(mix.k.size()); ++l) {
    const bool here = variant.only_layer < 0 || variant.only_layer == l;
    std::copy_n(here && variant.exact_k ? a.K(l) : b.K(l), floats, mix.K(l));
    std::copy_n(here && variant.exact_v ? a.V(l) : b.V(l), floats, mix.V(l));
    if (!here || !variant.exact_key_norm) continue;
    const float* ka = a.K(l);
    float* km = mix.K(l);
    for (size_t h = 0; h < floats; h += head_dim) {  // one (row, KV head) vector at a time
      double na = 0, nb = 0;
      for (int32_t d = 0; d < head_dim; ++d) {
        na += static_cast<double>(ka[h + d]) * ka[h + d];
        nb += static_cast<double>(km[h + d]) * km[h + d];
      }
      if (nb == 0) continue;
      const float scale = static_cast<float>(std::sqrt(na / nb));
      for (int32_t d = 0; d < head_dim; ++d) km[h + d] *= scale;
    }
  }
}

}  // namespace

absl::StatusOr<Json> RunSplice(Model& model, const SpliceOptions& options) {
  const DistantLossOptions& o = options.window;
  RS_RETURN_IF_ERROR(CheckSplits(o.maps, o.splits));
  RS_ASSIGN_OR_RETURN(const std::vector<std::vector<int32_t>> windows, MakeWindows(model, o));
  const ModelConfig& c = model.config;
  const int32_t p = o.prompt_tokens;
  const int32_t f = p - o.exact_tail_tokens;
  if (f <= kSinkTokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "splice needs filled rows: --prompt_tokens - --exact_tail_tokens > ", kSinkTokens));
  }
  const int32_t lowest_split = *std::min_element(o.splits.begin(), o.splits.end());
  if (lowest_split + 2 >= c.num_layers) {
    return absl::InvalidArgumentError("splice: no predicted layers above the split");
  }
  Backend& backend = model.llama->backend();

  // Per split: the variants, then (per_layer) exact K and V in one layer at a time.
  std::vector<std::vector<SpliceVariant>> variants(o.splits.size());
  for (size_t s = 0; s < o.splits.size(); ++s) {
    variants[s] = {{"ridgefill", false, false, false, -1},
                   {"exact_k", true, false, false, -1},
                   {"exact_v", false, true, false, -1},
                   {"exact_kv", true, true, false, -1},
                   {"exact_key_norm", false, false, true, -1}};
    if (options.per_layer) {
      for (int32_t l = o.splits[s] + 2; l < c.num_layers; ++l) {
        variants[s].push_back({absl::StrCat("layer_", l), true, true, false, l});
      }
    }
  }
  struct Sums {
    double all = 0, distant = 0;
  };
  Sums exact_sums;
  int64_t all_count = 0, distant_count = 0;
  std::vector<std::vector<Sums>> sums(o.splits.size());
  for (size_t s = 0; s < o.splits.size(); ++s) sums[s].resize(variants[s].size());
  std::vector<double> exact_layer_diff(o.splits.size(), 0.0);  // layer s + 1, A vs B
  std::vector<double> exact_kv_nll_diff(o.splits.size(), 0.0);

  SequenceRunner a(*model.llama, p), b(*model.llama, p);
  std::vector<float> logits;
  for (int32_t w = 0; w < o.windows; ++w) {
    const std::vector<int32_t>& window = windows[w];
    // A: exact prefix, its K/V saved, then the exact tail scored.
    a.Reset();
    RS_RETURN_IF_ERROR(a.Append(std::span(window).subspan(0, f), o.chunk, false, logits));
    HostKv exact_kv = ReadKv(backend, a, lowest_split + 1, f, c);
    std::vector<double> exact;
    RS_RETURN_IF_ERROR(AppendScored(model, a, window, p - 1, o.chunk, exact));
    RS_ASSIGN_OR_RETURN(std::vector<double> tail_only,
                        TailOnlyNll(model, window, f, exact, o.chunk));
    const std::vector<bool> is_distant = DistantMask(exact, tail_only, o.distant_threshold_nats);
    for (size_t i = 0; i < exact.size(); ++i) {
      exact_sums.all += exact[i];
      ++all_count;
      if (is_distant[i]) {
        exact_sums.distant += exact[i];
        ++distant_count;
      }
    }
    for (size_t s = 0; s < o.splits.size(); ++s) {
      const int32_t split = o.splits[s];
      // B: RidgeFill prefix (row f, exact, only closes the Append and is overwritten below).
      RS_ASSIGN_OR_RETURN(const RidgeFillRun fill,
                          PlanFill(model, o.maps, std::span(window).first(f + 1), split, 1));
      b.Reset();
      RS_RETURN_IF_ERROR(
          b.Append(std::span(window).subspan(0, f + 1), o.chunk, false, logits, &fill));
      HostKv fill_kv = ReadKv(backend, b, split + 1, f, c);
      // Layer s + 1 sees the exact h_s: A and B must agree there.
      const std::vector<float>* pairs[][2] = {
          {&exact_kv.k[split + 1 - exact_kv.first_layer], &fill_kv.k[0]},
          {&exact_kv.v[split + 1 - exact_kv.first_layer], &fill_kv.v[0]}};
      for (const auto& [x, y] : pairs) {
        for (size_t i = 0; i < x->size(); ++i) {
          exact_layer_diff[s] = std::max<double>(exact_layer_diff[s], std::abs((*x)[i] - (*y)[i]));
        }
      }
      HostKv mix{split + 2, f, c.kv_dim(), {}, {}};
      mix.k.assign(c.num_layers - mix.first_layer, std::vector<float>(f * c.kv_dim()));
      mix.v = mix.k;
      for (size_t v = 0; v < variants[s].size(); ++v) {
        Splice(variants[s][v], exact_kv, fill_kv, c.head_dim, mix);
        CopyKv(backend, b, mix, /*to_host=*/false);
        b.Truncate(f);
        std::vector<double> nll;
        RS_RETURN_IF_ERROR(AppendScored(model, b, window, p - 1, o.chunk, nll));
        for (size_t i = 0; i < nll.size(); ++i) {
          sums[s][v].all += nll[i];
          if (is_distant[i]) sums[s][v].distant += nll[i];
          if (variants[s][v].name == "exact_kv") {
            exact_kv_nll_diff[s] = std::max(exact_kv_nll_diff[s], std::abs(nll[i] - exact[i]));
          }
        }
        spdlog::info("splice: window {}, split {}, {}: all-token NLL {:.4f}", w, split,
                     variants[s][v].name,
                     std::accumulate(nll.begin(), nll.end(), 0.0) / nll.size());
      }
    }
  }
  auto gap_closed = [](double rf, double variant, double exact) -> Json {
    return rf == exact ? Json(nullptr) : Json((rf - variant) / (rf - exact));
  };
  const Json exact_all = MeanOrNull(exact_sums.all, all_count);
  const Json exact_distant = MeanOrNull(exact_sums.distant, distant_count);
  Json splits = Json::array();
  for (size_t s = 0; s < o.splits.size(); ++s) {
    const Sums& rf = sums[s][0];  // variants[s][0] is plain RidgeFill
    Json named = Json::object();
    Json per_layer = Json::array();
    for (size_t v = 0; v < variants[s].size(); ++v) {
      const Sums& x = sums[s][v];
      Json entry = {{"all_nll", MeanOrNull(x.all, all_count)},
                    {"distant_nll", MeanOrNull(x.distant, distant_count)},
                    {"all_gap_closed", gap_closed(rf.all, x.all, exact_sums.all)},
                    {"distant_gap_closed",
                     distant_count == 0 ? Json(nullptr)
                                        : gap_closed(rf.distant, x.distant, exact_sums.distant)}};
      if (variants[s][v].only_layer >= 0) {
        entry["layer"] = variants[s][v].only_layer;
        per_layer.push_back(entry);
      } else {
        named[variants[s][v].name] = entry;
      }
    }
    Json split = {{"split_layer", o.splits[s]},
                  {"spliced_layers", {o.splits[s] + 2, c.num_layers - 1}},
                  {"layer_s_plus_1_max_abs_diff", exact_layer_diff[s]},
                  {"exact_kv_max_abs_nll_diff", exact_kv_nll_diff[s]},
                  {"variants", named}};
    if (options.per_layer) split["per_layer"] = per_layer;
    splits.push_back(split);
  }
  return Json{{"prompt_tokens", p},
              {"exact_tail_tokens", o.exact_tail_tokens},
              {"filled_tokens", f},
              {"windows", o.windows},
              {"distant_threshold_nats", o.distant_threshold_nats},
              {"all_tokens", all_count},
              {"distant_tokens", distant_count},
              {"exact", {{"all_nll", exact_all}, {"distant_nll", exact_distant}}},
              {"splits", splits}};
}

}  // namespace ridgeserve
