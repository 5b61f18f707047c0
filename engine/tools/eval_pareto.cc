#include "engine/tools/eval_pareto.h"

#include <algorithm>
#include <limits>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/common/status_macros.h"

namespace ridgeserve {
namespace {

using Json = nlohmann::json;

// The project's target operating point (issue #4), relative to exact at the same prompt.
constexpr double kMinSpeedup = 1.5, kMaxNeedleDrop = 0.05, kMaxNllIncrease = 0.05;

// True when `row` has every field of `match` with the same value.
bool Matches(const Json& row, const Json& match) {
  return std::all_of(match.items().begin(), match.items().end(), [&](const auto& item) {
    return row.contains(item.key()) && row[item.key()] == item.value();
  });
}

// Adds to `row` (which has "speedup") the needle accuracy over every depth and trial of the
// needle rows matching `match`, and distant-loss's numbers from `distant` (a
// DistantLossTally::Summary), under `method`'s keys; returns the row's Pareto point.
ParetoPoint AddQuality(Json& row, const std::string& method, const Json& needle_rows,
                       const Json& match, const Json& distant) {
  double exact_hits = 0, hits = 0;
  int64_t trials = 0;
  for (const Json& r : needle_rows) {
    if (!Matches(r, match)) continue;
    const int64_t k = r["trials"].get<int64_t>();
    exact_hits += r["exact_accuracy"].get<double>() * k;
    hits += r[absl::StrCat(method, "_accuracy")].get<double>() * k;
    trials += k;
  }
  const std::string nll = absl::StrCat(method, "_nll");
  row["needle_trials"] = trials;
  row["needle_exact_accuracy"] = exact_hits / trials;
  row[absl::StrCat("needle_", method, "_accuracy")] = hits / trials;
  row["distant_tokens"] = distant["distant_tokens"]["count"];
  row["distant_exact_nll"] = distant["distant_tokens"]["exact_nll"];
  row[absl::StrCat("distant_", nll)] = distant["distant_tokens"][nll];
  row["distant_nll_increase"] = distant["distant_tokens"]["relative_increase"];
  row["all_exact_nll"] = distant["all_tokens"]["exact_nll"];
  row[absl::StrCat("all_", nll)] = distant["all_tokens"][nll];
  row["all_nll_increase"] = distant["all_tokens"]["relative_increase"];
  ParetoPoint point;
  point.speedup = row["speedup"].get<double>();
  point.needle_drop = (exact_hits - hits) / trials;
  // No distant-dependent tokens: quality unknown, never better than a measured point.
  point.distant_nll_increase = row["distant_nll_increase"].is_null()
                                   ? std::numeric_limits<double>::infinity()
                                   : row["distant_nll_increase"].get<double>();
  row["meets_target"] = point.speedup >= kMinSpeedup && point.needle_drop <= kMaxNeedleDrop &&
                        point.distant_nll_increase <= kMaxNllIncrease;
  return point;
}

}  // namespace

void MarkPareto(std::vector<ParetoPoint>& points) {
  auto dominates = [](const ParetoPoint& x, const ParetoPoint& y) {
    const bool no_worse = x.speedup >= y.speedup && x.needle_drop <= y.needle_drop &&
                          x.distant_nll_increase <= y.distant_nll_increase;
    const bool better = x.speedup > y.speedup || x.needle_drop < y.needle_drop ||
                        x.distant_nll_increase < y.distant_nll_increase;
    return no_worse && better;
  };
  for (ParetoPoint& y : points) {
    y.pareto_optimal = std::none_of(points.begin(), points.end(),
                                    [&](const ParetoPoint& x) { return dominates(x, y); });
  }
}

absl::StatusOr<Json> RunPareto(Model& model, const ParetoOptions& o) {
  if (o.prompt_tokens.empty() || o.tails.empty()) {
    return absl::InvalidArgumentError("pareto: need --lengths and --tails");
  }
  const bool spec_pc = !o.spec_pc.drafts.empty(), spec_kv = !o.spec_kv.drafts.empty();
  const size_t bytes_per_token =
      KvBytesPerToken(model.config, model.config.num_layers, model.llama->kv_cache_dtype());
  Json points = Json::array();
  for (int32_t length : o.prompt_tokens) {
    std::vector<ParetoPoint> marks;
    std::vector<Json> rows;
    Json spec_ttft, kv_ttft;
    TtftSetup length_ttft = o.ttft;
    length_ttft.prompt_tokens = {length};
    if (spec_pc) {
      RS_ASSIGN_OR_RETURN(spec_ttft, RunSpecPcTtft(model, o.spec_pc, length_ttft));
    }
    if (spec_kv) {
      RS_ASSIGN_OR_RETURN(kv_ttft, RunSpecKvTtft(model, o.spec_kv, length_ttft));
    }
    // One row per (draft, budget) of a draft-based method, from its ttft, needle and
    // distant-loss results; `keys` are copied from its ttft row.
    auto add_rows = [&](const std::string& method, const Json& ttft, const Json& needle,
                        const Json& distant, int32_t tail, int32_t lookahead,
                        std::initializer_list<const char*> keys) {
      for (size_t i = 0; i < ttft["results"].size(); ++i) {
        const Json& time = ttft["results"][i];
        const Json match = {{"draft_model", time["draft_model"]}, {"budget", time["budget"]}};
        Json row = match;
        row.update({{"method", method},
                    {"prompt_tokens", length},
                    {"exact_tail_tokens", tail},
                    {"lookahead_tokens", lookahead}});
        for (const char* key : keys) row[key] = time[key];
        marks.push_back(AddQuality(row, method, needle["results"], match, distant["results"][i]));
        rows.push_back(row);
      }
    };
    for (int32_t tail : o.tails) {
      TtftOptions t = o.ttft;
      t.prompt_tokens = {length};
      t.exact_tail_tokens = tail;
      t.splits = o.splits;
      t.maps = o.maps;
      RS_ASSIGN_OR_RETURN(const Json ttft, RunTtft(model, t));
      NeedleOptions n = o.needle;
      n.lengths = {length};
      n.exact_tail_tokens = tail;
      n.splits = o.splits;
      n.maps = o.maps;
      RS_ASSIGN_OR_RETURN(const Json needle, RunNeedle(model, n));
      DistantLossOptions d = o.distant;
      d.prompt_tokens = length;
      d.exact_tail_tokens = tail;
      d.splits = o.splits;
      d.maps = o.maps;
      RS_ASSIGN_OR_RETURN(const Json distant, RunDistantLoss(model, d));
      for (size_t s = 0; s < o.splits.size(); ++s) {
        const int32_t split = o.splits[s];
        Json row = {{"method", "ridgefill"},
                    {"prompt_tokens", length},
                    {"split_layer", split},
                    {"exact_tail_tokens", tail},
                    {"kv_bytes", length * bytes_per_token},
                    {"exact_kv_bytes", length * bytes_per_token}};
        for (const Json& r : ttft["results"]) {
          if (r["split_layer"] != split) continue;
          for (const char* key : {"speedup", "exact_seconds", "ridgefill_seconds",
                                  "measured_saved_seconds", "estimated_saved_seconds"}) {
            row[key] = r[key];
          }
        }
        marks.push_back(AddQuality(row, "ridgefill", needle["results"], {{"split_layer", split}},
                                   distant["splits"][s]));
        rows.push_back(row);
      }
      if (spec_pc) {
        RS_ASSIGN_OR_RETURN(const Json needle_pc, RunSpecPcNeedle(model, o.spec_pc, n));
        RS_ASSIGN_OR_RETURN(const Json distant_pc, RunSpecPcDistantLoss(model, o.spec_pc, d));
        add_rows("spec_pc", spec_ttft, needle_pc, distant_pc, tail, o.spec_pc.lookahead_tokens,
                 {"speedup", "exact_seconds", "spec_pc_seconds", "draft_seconds",
                  "target_prefill_seconds", "kept_tokens", "kv_bytes", "exact_kv_bytes",
                  "draft_kv_bytes", "original_positions"});
      }
      if (spec_kv) {
        RS_ASSIGN_OR_RETURN(const Json needle_kv, RunSpecKvNeedle(model, o.spec_kv, n));
        RS_ASSIGN_OR_RETURN(const Json distant_kv, RunSpecKvDistantLoss(model, o.spec_kv, d));
        add_rows("spec_kv", kv_ttft, needle_kv, distant_kv, tail, o.spec_kv.lookahead_tokens,
                 {"speedup", "exact_seconds", "spec_kv_seconds", "kv_bytes", "exact_kv_bytes"});
      }
    }
    MarkPareto(marks);
    for (size_t i = 0; i < rows.size(); ++i) {
      rows[i]["pareto_optimal"] = marks[i].pareto_optimal;
      points.push_back(rows[i]);
    }
  }
  return Json{{"points", points},
              {"pareto_objectives",
               {"speedup (max)", "needle accuracy drop vs exact (min)",
                "distant-token NLL relative increase vs exact (min)"}},
              {"target",
               {{"min_speedup", kMinSpeedup},
                {"max_needle_drop", kMaxNeedleDrop},
                {"max_distant_nll_increase", kMaxNllIncrease}}}};
}

}  // namespace ridgeserve
