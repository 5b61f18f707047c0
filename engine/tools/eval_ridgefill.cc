#include "engine/tools/eval_ridgefill.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/common/status_macros.h"
#include "engine/ridgefill/ridgefill_maps.h"
#include "engine/ridgefill_plan.h"
#include "engine/sampling/sampler.h"
#include "engine/tools/sequence_runner.h"
#include "engine/tools/tool_util.h"
#include "spdlog/spdlog.h"

namespace ridgeserve {
namespace {

using Json = nlohmann::json;

// The server's default: rows at positions < 4 stay exact (attention sinks).
constexpr int32_t kSinkTokens = RidgeFillPlanOptions{}.sink_tokens;

// RidgeFill of `tokens` as one Append with the server's planner and its defaults (the sinks,
// the last `exact_tail` rows and special tokens stay exact).
absl::StatusOr<RidgeFillRun> PlanFill(const Model& model, std::span<const int32_t> tokens,
                                      int32_t split, int32_t exact_tail) {
  RidgeFillPlanOptions plan;
  plan.exact_tail_tokens = exact_tail;
  RidgeFillRun fill{split, {}};
  RS_ASSIGN_OR_RETURN(fill.filled_rows, PlanRidgeFillRows(tokens, plan, [&](int32_t t) {
                        return model.tokenizer->IsSpecial(t);
                      }));
  return fill;
}

// -log softmax(logits)[target], in double.
double Nll(const float* logits, int32_t vocab, int32_t target) {
  return -LogSoftmaxAt(std::span(logits, vocab), target);
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
    out.push_back(Argmax(logits));
    if (i + 1 < new_tokens) {
      RS_RETURN_IF_ERROR(runner.Append(std::span(&out.back(), 1), 1, false, logits));
    }
  }
  return model.tokenizer->Decode(out, /*skip_special=*/true);
}

// Appends seq[runner.length() .. end) exactly, in pieces of `chunk` rows so the logits stay
// small ([chunk, vocab]), and appends each appended row i's next-token NLL (of seq[i + 1]) to
// `nll`; end < seq.size().
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

// Next-token NLLs of seq[r + 1 ..] given seq[.. r], ..., i.e. from rows r .. size - 2. Row r
// and everything before it is one Append (RidgeFill when `fill`; row r itself must be exact),
// the rest exact (AppendScored).
absl::StatusOr<std::vector<double>> ScoreFrom(Model& model, std::span<const int32_t> seq, int32_t r,
                                              const RidgeFillRun* fill, int32_t chunk) {
  const int32_t n = static_cast<int32_t>(seq.size());
  SequenceRunner runner(*model.llama, n);
  std::vector<float> logits;
  RS_RETURN_IF_ERROR(runner.Append(seq.subspan(0, r + 1), chunk, false, logits, fill));
  std::vector<double> nll = {Nll(logits.data(), model.config.vocab_size, seq[r + 1])};
  RS_RETURN_IF_ERROR(AppendScored(model, runner, seq, n - 1, chunk, nll));
  return nll;
}

// distant-loss's windows of the text: [BOS] text[w * body ..], prompt_tokens long each.
absl::StatusOr<std::vector<std::vector<int32_t>>> MakeWindows(const Model& model,
                                                              const DistantLossOptions& o) {
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
  std::vector<std::vector<int32_t>> windows;
  for (int32_t w = 0; w < o.windows; ++w) {
    std::vector<int32_t> window = bos;
    window.insert(window.end(), text.begin() + static_cast<int64_t>(w) * body,
                  text.begin() + static_cast<int64_t>(w + 1) * body);
    windows.push_back(std::move(window));
  }
  return windows;
}

// NLLs of window[f + 1 ..] with the tail window[f ..] alone as context, behind the same BOS
// (without it the first rows lack their attention sink and would look "distant-dependent" for
// the wrong reason). `exact` holds the full-context NLLs of the same targets (used when f = 0).
absl::StatusOr<std::vector<double>> TailOnlyNll(Model& model, std::span<const int32_t> window,
                                                int32_t f, const std::vector<double>& exact,
                                                int32_t chunk) {
  if (f == 0) return exact;
  std::vector<int32_t> seq = BosPrefix(*model.tokenizer);
  const int32_t head = static_cast<int32_t>(seq.size());
  seq.insert(seq.end(), window.begin() + f, window.end());
  return ScoreFrom(model, seq, head, nullptr, chunk);
}

// Tail tokens whose NLL drops by more than `threshold` nats when the distant context is there.
std::vector<bool> DistantMask(const std::vector<double>& exact,
                              const std::vector<double>& tail_only, double threshold) {
  std::vector<bool> is_distant(exact.size());
  for (size_t i = 0; i < exact.size(); ++i) is_distant[i] = tail_only[i] - exact[i] > threshold;
  return is_distant;
}

Json MeanOrNull(double sum, int64_t count) {
  return count == 0 ? Json(nullptr) : Json(sum / count);
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
          RS_ASSIGN_OR_RETURN(const RidgeFillRun fill,
                              PlanFill(model, prompt, o.splits[s], o.exact_tail_tokens));
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
  RS_ASSIGN_OR_RETURN(const std::vector<std::vector<int32_t>> windows, MakeWindows(model, o));
  const int32_t p = o.prompt_tokens;
  // Window layout: prefix rows 0 .. f - 1, tail rows f .. p - 1. Scored: targets
  // window[f + 1 .. p - 1] (the first tail token's predictor, row f - 1, is filled under
  // RidgeFill, so it is left out for every mode alike).
  const int32_t f = std::max(0, p - o.exact_tail_tokens);
  struct Sums {
    double exact = 0, fill = 0, tail_only = 0;
    int64_t count = 0;
  };
  Sums all;
  std::vector<Sums> fill_all(o.splits.size()), fill_distant(o.splits.size());
  Sums distant;
  for (int32_t w = 0; w < o.windows; ++w) {
    const std::vector<int32_t>& window = windows[w];
    RS_ASSIGN_OR_RETURN(std::vector<double> exact, ScoreFrom(model, window, f, nullptr, o.chunk));
    RS_ASSIGN_OR_RETURN(std::vector<double> tail_only,
                        TailOnlyNll(model, window, f, exact, o.chunk));
    const std::vector<bool> is_distant = DistantMask(exact, tail_only, o.distant_threshold_nats);
    for (size_t i = 0; i < exact.size(); ++i) {
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
      RS_ASSIGN_OR_RETURN(const RidgeFillRun fill,
                          PlanFill(model, std::span(window).first(f + 1), o.splits[s], 1));
      RS_ASSIGN_OR_RETURN(std::vector<double> rf, ScoreFrom(model, window, f, &fill, o.chunk));
      for (size_t i = 0; i < rf.size(); ++i) {
        fill_all[s].fill += rf[i];
        if (is_distant[i]) fill_distant[s].fill += rf[i];
      }
    }
    spdlog::info("distant-loss: window {}/{} done ({} distant tokens so far)", w + 1, o.windows,
                 distant.count);
  }
  auto increase = [](double exact, double fill, int64_t count) -> Json {
    return count == 0 || exact == 0 ? Json(nullptr) : Json((fill - exact) / exact);
  };
  Json splits = Json::array();
  for (size_t s = 0; s < o.splits.size(); ++s) {
    splits.push_back(
        {{"split_layer", o.splits[s]},
         {"all_tokens",
          {{"count", all.count},
           {"exact_nll", MeanOrNull(all.exact, all.count)},
           {"ridgefill_nll", MeanOrNull(fill_all[s].fill, all.count)},
           {"tail_only_nll", MeanOrNull(all.tail_only, all.count)},
           {"relative_increase", increase(all.exact, fill_all[s].fill, all.count)}}},
         {"distant_tokens",
          {{"count", distant.count},
           {"exact_nll", MeanOrNull(distant.exact, distant.count)},
           {"ridgefill_nll", MeanOrNull(fill_distant[s].fill, distant.count)},
           {"tail_only_nll", MeanOrNull(distant.tail_only, distant.count)},
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

absl::StatusOr<Json> RunTtft(Model& model, const TtftOptions& o) {
  RS_RETURN_IF_ERROR(CheckSplits(model, o.splits));
  const ModelConfig& c = model.config;
  const int32_t tail = o.exact_tail_tokens;
  if (tail < 1 || o.repetitions < 1 || o.chunk < 1) {
    return absl::InvalidArgumentError(
        "need --exact_tail_tokens >= 1, --repetitions >= 1, --chunk >= 1");
  }
  Json results = Json::array();
  for (int32_t length : o.prompt_tokens) {
    if (length <= 0 || length > c.context_length) {
      return absl::InvalidArgumentError(
          absl::StrCat("--lengths: ", length, " is outside 1..", c.context_length));
    }
    std::vector<int32_t> tokens(length);
    if (o.prompt_source.empty()) {
      std::mt19937 rng(1234);
      std::uniform_int_distribution<int32_t> pick(256, c.vocab_size - 1);
      for (int32_t& t : tokens) t = pick(rng);
    } else {
      for (int32_t i = 0; i < length; ++i) tokens[i] = o.prompt_source[i % o.prompt_source.size()];
    }
    SequenceRunner runner(*model.llama, length);
    std::vector<float> logits;
    auto time_prefill = [&](const RidgeFillRun* fill) -> absl::StatusOr<double> {
      runner.Reset();
      const auto start = ToolClock::now();
      RS_RETURN_IF_ERROR(runner.Append(tokens, o.chunk, false, logits, fill));
      return SecondsSince(start);
    };
    for (int32_t split : o.splits) {
      RS_ASSIGN_OR_RETURN(const RidgeFillRun fill, PlanFill(model, tokens, split, tail));
      double exact = std::numeric_limits<double>::infinity();
      double ridgefill = std::numeric_limits<double>::infinity();
      double estimated = 0;                          // from the fastest RidgeFill run
      for (int32_t r = 0; r < o.repetitions; ++r) {  // alternated, so drift hits both alike
        RS_ASSIGN_OR_RETURN(double e, time_prefill(nullptr));
        RS_ASSIGN_OR_RETURN(double f, time_prefill(&fill));
        exact = std::min(exact, e);
        if (f < ridgefill) estimated = runner.estimated_saved_seconds();
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
                         {"promoted_rows", runner.promoted_rows()}});
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
  RS_RETURN_IF_ERROR(CheckSplits(model, o.splits));
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
                          PlanFill(model, std::span(window).first(f + 1), split, 1));
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
  RS_RETURN_IF_ERROR(CheckSplits(model, o.splits));
  if (o.prompt_tokens.empty() || o.tails.empty()) {
    return absl::InvalidArgumentError("pareto: need --lengths and --tails");
  }
  // The project's target operating point (issue #4), relative to exact at the same prompt.
  constexpr double kMinSpeedup = 1.5, kMaxNeedleDrop = 0.05, kMaxNllIncrease = 0.05;
  Json points = Json::array();
  for (int32_t length : o.prompt_tokens) {
    std::vector<ParetoPoint> marks;
    std::vector<Json> rows;
    for (int32_t tail : o.tails) {
      TtftOptions t = o.ttft;
      t.prompt_tokens = {length};
      t.exact_tail_tokens = tail;
      t.splits = o.splits;
      RS_ASSIGN_OR_RETURN(const Json ttft, RunTtft(model, t));
      NeedleOptions n = o.needle;
      n.lengths = {length};
      n.exact_tail_tokens = tail;
      n.splits = o.splits;
      RS_ASSIGN_OR_RETURN(const Json needle, RunNeedle(model, n));
      DistantLossOptions d = o.distant;
      d.prompt_tokens = length;
      d.exact_tail_tokens = tail;
      d.splits = o.splits;
      RS_ASSIGN_OR_RETURN(const Json distant, RunDistantLoss(model, d));
      for (size_t s = 0; s < o.splits.size(); ++s) {
        const int32_t split = o.splits[s];
        Json row = {{"prompt_tokens", length}, {"split_layer", split}, {"exact_tail_tokens", tail}};
        for (const Json& r : ttft["results"]) {
          if (r["split_layer"] != split) continue;
          for (const char* key : {"speedup", "exact_seconds", "ridgefill_seconds",
                                  "measured_saved_seconds", "estimated_saved_seconds"}) {
            row[key] = r[key];
          }
        }
        // Needle: accuracy over every depth and trial.
        double exact_hits = 0, fill_hits = 0;
        int64_t trials = 0;
        for (const Json& r : needle["results"]) {
          if (r["split_layer"] != split) continue;
          const int64_t k = r["trials"].get<int64_t>();
          exact_hits += r["exact_accuracy"].get<double>() * k;
          fill_hits += r["ridgefill_accuracy"].get<double>() * k;
          trials += k;
        }
        row["needle_trials"] = trials;
        row["needle_exact_accuracy"] = exact_hits / trials;
        row["needle_ridgefill_accuracy"] = fill_hits / trials;
        const Json& ds = distant["splits"][s];
        row["distant_tokens"] = ds["distant_tokens"]["count"];
        row["distant_exact_nll"] = ds["distant_tokens"]["exact_nll"];
        row["distant_ridgefill_nll"] = ds["distant_tokens"]["ridgefill_nll"];
        row["distant_nll_increase"] = ds["distant_tokens"]["relative_increase"];
        row["all_exact_nll"] = ds["all_tokens"]["exact_nll"];
        row["all_ridgefill_nll"] = ds["all_tokens"]["ridgefill_nll"];
        row["all_nll_increase"] = ds["all_tokens"]["relative_increase"];
        ParetoPoint point;
        point.speedup = row["speedup"].get<double>();
        point.needle_drop = (exact_hits - fill_hits) / trials;
        // No distant-dependent tokens: quality unknown, never better than a measured point.
        point.distant_nll_increase = row["distant_nll_increase"].is_null()
                                         ? std::numeric_limits<double>::infinity()
                                         : row["distant_nll_increase"].get<double>();
        row["meets_target"] = point.speedup >= kMinSpeedup && point.needle_drop <= kMaxNeedleDrop &&
                              point.distant_nll_increase <= kMaxNllIncrease;
        marks.push_back(point);
        rows.push_back(row);
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
