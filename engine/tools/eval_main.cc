// ridgeserve-eval: quality and speed evaluation. Each subcommand prints one JSON object on
// stdout; progress and logs go to stderr.
//   perplexity    --model M --text FILE [--ctx N] [--max_tokens N]
//   generate      --model M --prompt TEXT [--chat] [--max_new_tokens N] [sampling flags]
//   bench-prefill --model M --lengths 512,2048,8192 [--chunk N]
//   logits        --model M (--text FILE | --token_ids 1,2,3) --out FILE [--chunk N]
//   ttft          --model M --maps F --lengths 2048,4096 --exact_tail_tokens T
//                 [--split_layer S] [--text FILE] [--repetitions R] [--chunk N]
//                 [--draft_model self:8 [--spec_pc_budgets C,..] [--spec_kv_budgets C,..]]
//                 exact vs RidgeFill prefill time (to the first token's logits), alternated in
//                 one process, min over R repetitions each; every split in F unless S is given;
//                 with drafts also exact vs SpecPC and SpecKV ("spec_pc", "spec_kv")
//   needle        --model M --maps F --haystack FILE --lengths 2048,4096 --depths 0.1,0.5,0.9
//                 --trials N [--exact_tail_tokens T] [--split_layer S]
//                 passkey retrieval from the filled region, exact vs RidgeFill (eval_ridgefill.h)
//   distant-loss  --model M --maps F --text FILE [--prompt_tokens 4096] [--exact_tail_tokens T]
//                 [--split_layer S] [--windows N] [--distant_threshold_nats D]
//                 tail-token NLL, exact vs RidgeFill, all and distant-dependent tokens
//   next-token-kl --model M --maps F (--token_ids 1,2,3 | --text FILE) [--exact_tail_tokens T]
//                 [--split_layer S] [--chunk N]
//                 KL(exact ‖ RidgeFill) and top-1 agreement of the distribution after the prompt
//                 per split: what the server's shadow sampling measures, offline
//   splice        --model M --maps F --text FILE [--split_layer S] [--prompt_tokens N]
//                 [--exact_tail_tokens T] [--windows K] [--per_layer]
//                 distant-loss's NLLs with the filled rows' predicted K, V, both or only the
//                 key norms replaced by exact ones: which part of the fill carries the gap
//   pareto        --model M --maps F --text FILE --haystack FILE --lengths 8192
//                 --tails 512,1024,2048 [--trials N] [--depths ...] [--repetitions R]
//                 [--draft_model self:8,self:12 [--spec_pc_budgets 1024,2048]
//                 [--spec_kv_budgets 256,512,1024] [--spec_pc_lookahead_tokens L]
//                 [--spec_kv_lookahead_tokens L] [--spec_kernel N]
//                 [--spec_pc_original_positions]] [--plot FILE.png]
//                 ttft, needle, distant-loss and KV bytes per RidgeFill (split, tail) and, with
//                 drafts, per SpecPC and SpecKV (draft, budget) on the same prompts; Pareto-optimal
//                 points marked over all methods (eval_pareto.h); --plot draws speedup against
//                 needle accuracy and distant-token NLL with gnuplot
//   spec-pc       --model M --draft_model self:K|PATH (--token_ids 1,2,3 | --text FILE)
//                 --budget C [--lookahead_tokens L] [--spec_kernel N] [--chunk N]
//                 SpecPC's draft phase for one prompt: the draft's lookahead, its attention
//                 scores per prompt position and the kept positions (engine/draft/spec_pc.h)
//   spec-kv       --model M --draft_model self:K|PATH (--token_ids 1,2,3 | --text FILE)
//                 --budget C [--lookahead_tokens L] [--max_new_tokens N] [--chunk N]
//                 SpecKV for one prompt: the draft's lookahead, the kept positions per layer
//                 and KV head, and the greedy tokens decoded over them (engine/draft/spec_kv.h)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "engine/common/status_macros.h"
#include "engine/draft/draft_model.h"
#include "engine/draft/spec_kv.h"
#include "engine/draft/spec_pc.h"
#include "engine/model/model.h"
#include "engine/parallel/rank_group.h"
#include "engine/ridgefill/ridgefill_load.h"
#include "engine/sampling/sampler.h"
#include "engine/tools/bench_util.h"
#include "engine/tools/eval_pareto.h"
#include "engine/tools/eval_plot.h"
#include "engine/tools/eval_ridgefill.h"
#include "engine/tools/eval_spec_kv.h"
#include "engine/tools/eval_spec_pc.h"
#include "engine/tools/sequence_runner.h"
#include "engine/tools/tool_util.h"
#include "kernels/cpu/cpu_backend.h"
#include "nlohmann/json.hpp"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, model, "", "GGUF file or Hugging Face directory");
ABSL_FLAG(int32_t, threads, 0, "CPU threads (0 = all; shared between tensor-parallel ranks)");
ABSL_FLAG(int32_t, tensor_parallel, 1,
          "ranks to shard the model over (threads of this process on the CPU backend); "
          "perplexity, generate, bench-prefill and logits");
ABSL_FLAG(std::string, cpu_activations, "f32",
          "CPU Linear arithmetic: f32 (the default: float math on the exact weights) or int8");
ABSL_FLAG(std::string, kv_cache_dtype, "auto",
          "KV cache element type: f32, bf16, f16 (rounded to nearest even when stored, widened "
          "exactly when read) or auto (the backend's default: f16 on the CPU)");
ABSL_FLAG(std::string, text, "", "input text file");
ABSL_FLAG(int32_t, ctx, 1024, "perplexity: window length in tokens");
ABSL_FLAG(int32_t, max_tokens, 0, "perplexity: use at most this many tokens of the text (0 = all)");
ABSL_FLAG(std::string, prompt, "", "generate: prompt text");
ABSL_FLAG(bool, chat, false, "generate: wrap the prompt in the model's chat template");
ABSL_FLAG(int32_t, max_new_tokens, 128, "generate: tokens to generate at most");
ABSL_FLAG(float, temperature, 0.0f, "generate: sampling temperature (0 = greedy)");
ABSL_FLAG(float, top_p, 1.0f, "generate: nucleus sampling mass");
ABSL_FLAG(int32_t, top_k, 0, "generate: keep the k most likely tokens (0 = off)");
ABSL_FLAG(float, min_p, 0.0f, "generate: drop tokens below min_p * max probability");
ABSL_FLAG(float, repetition_penalty, 1.0f, "generate: repetition penalty (1 = off)");
ABSL_FLAG(uint64_t, seed, 0, "generate: sampling seed");
ABSL_FLAG(std::string, lengths, "512,2048,8192", "bench-prefill: prompt lengths");
ABSL_FLAG(std::string, streams, "1,16", "bench-decode: numbers of sequences decoding together");
ABSL_FLAG(int32_t, decode_steps, 64, "bench-decode: timed decode steps");
ABSL_FLAG(int32_t, chunk, 512, "prefill chunk (rows per forward pass)");
ABSL_FLAG(std::string, token_ids, "", "logits: comma-separated input token ids");
ABSL_FLAG(std::string, out, "", "logits: output file for float32 logits [tokens, vocab]");
ABSL_FLAG(std::string, maps, "", "ttft: RidgeFill map file");
ABSL_FLAG(int32_t, split_layer, -1, "ttft: split layer (-1 = every split in --maps)");
ABSL_FLAG(int32_t, exact_tail_tokens, 1024, "ttft: prompt tokens at the end that run exactly");
ABSL_FLAG(int32_t, repetitions, 2, "ttft: timed runs per mode (the minimum is reported)");
ABSL_FLAG(std::string, haystack, "", "needle: filler text file (not the maps' calibration text)");
ABSL_FLAG(std::string, depths, "0.1,0.5,0.9", "needle: needle depths in the filled region");
ABSL_FLAG(int32_t, trials, 5, "needle: trials per (length, depth)");
ABSL_FLAG(int32_t, prompt_tokens, 4096, "distant-loss: window length in tokens");
ABSL_FLAG(int32_t, windows, 1, "distant-loss: consecutive windows of --text to average over");
ABSL_FLAG(double, distant_threshold_nats, 1.0,
          "distant-loss: a tail token is distant-dependent when its NLL with the full context "
          "is lower than with the tail alone by more than this");
ABSL_FLAG(double, max_leverage, 0,
          "RidgeFill: run filled rows whose leverage exceeds this exactly (0: off)");
ABSL_FLAG(bool, per_layer, false, "splice: also splice exact K and V into one layer at a time");
ABSL_FLAG(std::string, draft_model, "", "spec-pc: self:K (the model's first K layers) or a path");
ABSL_FLAG(int32_t, budget, 1024, "spec-pc: prompt tokens kept");
ABSL_FLAG(int32_t, lookahead_tokens, 1, "spec-pc: tokens the draft decodes after the prompt");
ABSL_FLAG(int32_t, spec_kernel, 0, "spec-pc: pooling / neighbour width (0 = the model's default)");
ABSL_FLAG(std::string, tails, "512,1024,2048", "pareto: exact tail lengths to evaluate");
ABSL_FLAG(std::string, spec_pc_budgets, "",
          "pareto: SpecPC budgets (kept prompt tokens) per --draft_model (a comma list there)");
ABSL_FLAG(int32_t, spec_pc_lookahead_tokens, 1, "pareto: SpecPC's draft lookahead tokens");
ABSL_FLAG(bool, spec_pc_original_positions, false,
          "pareto, ttft: SpecPC's kept tokens keep their prompt positions (as the server's "
          "--spec_pc_original_positions) instead of being renumbered");
ABSL_FLAG(std::string, spec_kv_budgets, "",
          "pareto: SpecKV budgets (KV entries kept per layer and head) per --draft_model");
ABSL_FLAG(int32_t, spec_kv_lookahead_tokens, 64,
          "pareto: SpecKV's draft answer at most (the needle: at most its answer's length)");
ABSL_FLAG(std::string, plot, "",
          "pareto: PNG of speedup against needle accuracy and distant-token NLL (gnuplot)");

namespace ridgeserve {
namespace {

using Clock = ToolClock;
using Json = nlohmann::json;

class Eval {
 public:
  absl::Status Init() {
    RS_ASSIGN_OR_RETURN(const cpu::Activations activations,
                        cpu::ParseActivations(absl::GetFlag(FLAGS_cpu_activations)));
    RS_ASSIGN_OR_RETURN(const cpu::Isa isa, cpu::IsaFromEnvironment());
    RS_ASSIGN_OR_RETURN(ranks_, CreateRankGroup("cpu", absl::GetFlag(FLAGS_tensor_parallel),
                                                {.num_threads = absl::GetFlag(FLAGS_threads),
                                                 .isa = isa,
                                                 .activations = activations}));
    backend_ = ranks_.backends.front().get();
    const std::string path = absl::GetFlag(FLAGS_model);
    if (path.empty()) return absl::InvalidArgumentError("--model is required");
    const auto start = Clock::now();
    RS_ASSIGN_OR_RETURN(model_, LoadModel(path, ranks_.backend_ptrs(), ranks_.comms));
    RS_ASSIGN_OR_RETURN(const DType kv_dtype,
                        ResolveKvCacheDType(absl::GetFlag(FLAGS_kv_cache_dtype), *backend_));
    for (LlamaModel* rank : model_->rank_models()) rank->SetKvCacheDType(kv_dtype);
    spdlog::info("model loaded in {:.2f} s", SecondsSince(start));
    return absl::OkStatus();
  }

  absl::StatusOr<Json> Perplexity() {
    RS_ASSIGN_OR_RETURN(std::string text, ReadFile(absl::GetFlag(FLAGS_text)));
    std::vector<int32_t> tokens = model_->tokenizer->Encode(text, /*add_bos=*/true,
                                                            /*parse_special=*/false);
    const int32_t max_tokens = absl::GetFlag(FLAGS_max_tokens);
    if (max_tokens > 0 && static_cast<int32_t>(tokens.size()) > max_tokens) {
      tokens.resize(max_tokens);
    }
    const int32_t ctx = std::min(absl::GetFlag(FLAGS_ctx), model_->config.context_length);
    if (ctx < 2) return absl::InvalidArgumentError("--ctx must be at least 2");
    // Non-overlapping windows of `ctx` tokens; every token but a window's first is scored
    // given the window's preceding tokens.
    SequenceRunner runner(*model_, ctx);
    const int32_t vocab = model_->config.vocab_size;
    std::vector<float> logits;
    double nll = 0;
    int64_t scored = 0;
    const auto start = Clock::now();
    for (size_t begin = 0; begin + 1 < tokens.size(); begin += ctx) {
      const size_t count = std::min<size_t>(ctx, tokens.size() - begin);
      runner.Reset();
      RS_RETURN_IF_ERROR(runner.Append(std::span(tokens).subspan(begin, count),
                                       absl::GetFlag(FLAGS_chunk), /*all_logits=*/true, logits));
      for (size_t i = 0; i + 1 < count; ++i) {
        nll -= LogSoftmaxAt(std::span(logits).subspan(i * vocab, vocab), tokens[begin + i + 1]);
        ++scored;
      }
      spdlog::info("perplexity: {}/{} tokens, running ppl {:.4f}", begin + count, tokens.size(),
                   std::exp(nll / std::max<int64_t>(scored, 1)));
    }
    if (scored == 0) return absl::InvalidArgumentError("text has fewer than 2 tokens");
    const double seconds = SecondsSince(start);
    return Json{{"tokens", scored},
                {"nll", nll / scored},
                {"perplexity", std::exp(nll / scored)},
                {"tokens_per_second", tokens.size() / seconds}};
  }

  absl::StatusOr<Json> Generate() {
    const Tokenizer& tok = *model_->tokenizer;
    std::vector<int32_t> prompt;
    if (absl::GetFlag(FLAGS_chat)) {
      const ChatMessage message{"user", absl::GetFlag(FLAGS_prompt)};
      const std::string text = tok.ApplyChatTemplate({&message, 1}, /*add_generation_prompt=*/true);
      // The template already starts with BOS where the model wants one.
      prompt = tok.Encode(text, /*add_bos=*/false, /*parse_special=*/true);
    } else {
      prompt = tok.Encode(absl::GetFlag(FLAGS_prompt), /*add_bos=*/true, /*parse_special=*/false);
    }
    if (prompt.empty()) return absl::InvalidArgumentError("--prompt is empty");
    SamplingParams params;
    params.temperature = absl::GetFlag(FLAGS_temperature);
    params.top_p = absl::GetFlag(FLAGS_top_p);
    params.top_k = absl::GetFlag(FLAGS_top_k);
    params.min_p = absl::GetFlag(FLAGS_min_p);
    params.repetition_penalty = absl::GetFlag(FLAGS_repetition_penalty);
    params.seed = absl::GetFlag(FLAGS_seed);
    params.has_seed = true;
    RS_RETURN_IF_ERROR(ValidateSamplingParams(params));
    Sampler sampler(params);

    const int32_t max_new = absl::GetFlag(FLAGS_max_new_tokens);
    const int32_t capacity =
        std::min<int32_t>(model_->config.context_length, prompt.size() + max_new);
    if (static_cast<int32_t>(prompt.size()) >= capacity) {
      return absl::OutOfRangeError(
          absl::StrCat("prompt of ", prompt.size(), " tokens fills the context"));
    }
    SequenceRunner runner(*model_, capacity);
    std::vector<int32_t> context = prompt;
    std::vector<int32_t> generated;
    std::vector<float> logits;
    const auto start = Clock::now();
    RS_RETURN_IF_ERROR(runner.Append(prompt, absl::GetFlag(FLAGS_chunk), false, logits));
    double ttft = 0;
    const auto decode_start = Clock::now();
    while (static_cast<int32_t>(generated.size()) < max_new && runner.length() < capacity) {
      const int32_t token = sampler.Sample(logits, context).token;
      if (generated.empty()) ttft = SecondsSince(start);
      if (sampler.IsStop(token, tok.end_of_generation_ids())) break;
      generated.push_back(token);
      context.push_back(token);
      if (runner.length() + 1 > capacity) break;
      const int32_t one[] = {token};
      RS_RETURN_IF_ERROR(runner.Append(one, 1, false, logits));
    }
    const double decode_seconds = SecondsSince(decode_start);
    return Json{{"text", tok.Decode(generated, /*skip_special=*/true)},
                {"token_ids", generated},
                {"prompt_tokens", prompt.size()},
                {"ttft_seconds", ttft},
                {"tokens_per_second", generated.empty() ? 0.0 : generated.size() / decode_seconds}};
  }

  absl::StatusOr<Json> BenchPrefill() {
    RS_ASSIGN_OR_RETURN(std::vector<int32_t> lengths,
                        ParseIntList("lengths", absl::GetFlag(FLAGS_lengths)));
    const ModelConfig& c = model_->config;
    Json results = Json::array();
    for (int32_t length : lengths) {
      if (length <= 0 || length > c.context_length) {
        return absl::InvalidArgumentError(
            absl::StrCat("--lengths: ", length, " is outside 1..", c.context_length));
      }
      const std::vector<int32_t> tokens = RandomTokenIds(length, c.vocab_size, 1234);
      SequenceRunner runner(*model_, length);
      std::vector<float> logits;
      const auto start = Clock::now();
      RS_RETURN_IF_ERROR(runner.Append(tokens, absl::GetFlag(FLAGS_chunk), false, logits));
      const double seconds = SecondsSince(start);
      results.push_back({{"prompt_tokens", length},
                         {"seconds", seconds},
                         {"tokens_per_second", length / seconds},
                         {"gflop_per_second", PrefillFlops(c, length) / seconds / 1e9}});
      spdlog::info("bench-prefill: {} tokens in {:.3f} s", length, seconds);
    }
    return Json{{"results", results}, {"chunk", absl::GetFlag(FLAGS_chunk)}};
  }

  // Greedy decode of S sequences together, one forward pass per step (as the engine batches
  // decode rows): each sequence has a 128-token prompt; `--decode_steps` steps are timed.
  absl::StatusOr<Json> BenchDecode() {
    RS_ASSIGN_OR_RETURN(std::vector<int32_t> stream_counts,
                        ParseIntList("streams", absl::GetFlag(FLAGS_streams)));
    const int32_t steps = absl::GetFlag(FLAGS_decode_steps);
    constexpr int32_t kPrompt = 128;
    // TimeBatchedDecode runs one untimed step before the timed ones.
    if (steps < 1 || kPrompt + steps + 1 > model_->config.context_length) {
      return absl::InvalidArgumentError("--decode_steps: outside 1..context - 129");
    }
    Json results = Json::array();
    for (int32_t streams : stream_counts) {
      if (streams < 1) return absl::InvalidArgumentError("--streams: want counts >= 1");
      RS_ASSIGN_OR_RETURN(const double seconds,
                          TimeBatchedDecode(*model_->llama, streams, kPrompt, steps, 99));
      results.push_back({{"streams", streams},
                         {"steps", steps},
                         {"seconds", seconds},
                         {"tokens_per_second", streams * steps / seconds}});
      spdlog::info("bench-decode: {} streams x {} steps in {:.3f} s", streams, steps, seconds);
    }
    return Json{{"results", results}, {"prompt_tokens", kPrompt}};
  }

  // --token_ids, else --text encoded with BOS.
  absl::StatusOr<std::vector<int32_t>> InputTokens() {
    if (!absl::GetFlag(FLAGS_token_ids).empty()) {
      return ParseIntList("token_ids", absl::GetFlag(FLAGS_token_ids));
    }
    RS_ASSIGN_OR_RETURN(std::string text, ReadFile(absl::GetFlag(FLAGS_text)));
    return model_->tokenizer->Encode(text, /*add_bos=*/true, /*parse_special=*/false);
  }

  absl::StatusOr<Json> SpecPc() {
    RS_ASSIGN_OR_RETURN(std::vector<int32_t> tokens, InputTokens());
    if (tokens.empty()) return absl::InvalidArgumentError("no input tokens");
    RS_ASSIGN_OR_RETURN(std::unique_ptr<DraftModel> draft,
                        LoadDraftModel(absl::GetFlag(FLAGS_draft_model), *model_, *backend_));
    SpecPcParams p =
        DefaultSpecPcParams(model_->config, draft->num_layers, absl::GetFlag(FLAGS_budget),
                            absl::GetFlag(FLAGS_lookahead_tokens));
    if (absl::GetFlag(FLAGS_spec_kernel) > 0) p.kernel = absl::GetFlag(FLAGS_spec_kernel);
    if (p.budget < 1 || p.lookahead_tokens < 1 || p.window >= static_cast<int32_t>(tokens.size())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--budget and --lookahead_tokens must be >= 1 and the prompt longer than the window (",
          p.window, ")"));
    }
    RS_ASSIGN_OR_RETURN(SpecPcDraftResult r,
                        RunSpecPcDraft(*draft->llama, p, tokens, absl::GetFlag(FLAGS_chunk),
                                       model_->llama->kv_cache_dtype()));
    std::vector<int32_t> layers;
    for (int32_t l = p.first_layer; l < p.num_layers; ++l) layers.push_back(l);
    return Json{{"prompt_tokens", tokens.size()},
                {"params",
                 {{"budget", p.budget},
                  {"lookahead_tokens", p.lookahead_tokens},
                  {"window", p.window},
                  {"kernel", p.kernel},
                  {"first_layer", p.first_layer},
                  {"num_layers", p.num_layers}}},
                {"lookahead_ids", r.lookahead_ids},
                {"scores", r.scores},
                {"kept", r.kept},
                {"draft_queries_layers", layers}};
  }

  absl::StatusOr<Json> SpecKv() {
    RS_ASSIGN_OR_RETURN(std::vector<int32_t> tokens, InputTokens());
    if (tokens.empty()) return absl::InvalidArgumentError("no input tokens");
    RS_ASSIGN_OR_RETURN(std::unique_ptr<DraftModel> draft,
                        LoadDraftModel(absl::GetFlag(FLAGS_draft_model), *model_, *backend_));
    SpecKvParams p;
    p.budget = absl::GetFlag(FLAGS_budget);
    p.lookahead_tokens = absl::GetFlag(FLAGS_lookahead_tokens);
    if (absl::GetFlag(FLAGS_spec_kernel) > 0) p.kernel = absl::GetFlag(FLAGS_spec_kernel);
    const int32_t max_new = absl::GetFlag(FLAGS_max_new_tokens);
    SpecKvSequence sequence(*model_->llama, static_cast<int32_t>(tokens.size()), max_new,
                            model_->llama->kv_cache_dtype());
    std::vector<float> logits;
    RS_RETURN_IF_ERROR(sequence.Prefill(*draft->llama, draft->num_layers, p, tokens,
                                        absl::GetFlag(FLAGS_chunk),
                                        model_->tokenizer->end_of_generation_ids(), logits));
    const int32_t kv_entries = sequence.cached_entries();
    std::vector<int32_t> generated;
    while (static_cast<int32_t>(generated.size()) < max_new) {
      generated.push_back(Argmax(logits));
      if (static_cast<int32_t>(generated.size()) == max_new) break;
      const int32_t one[] = {generated.back()};
      RS_RETURN_IF_ERROR(sequence.Append(one, 1, false, logits));
    }
    return Json{{"prompt_tokens", tokens.size()},
                {"params",
                 {{"budget", p.budget},
                  {"lookahead_tokens", p.lookahead_tokens},
                  {"window", p.window},
                  {"kernel", p.kernel},
                  {"draft_layers", draft->num_layers}}},
                {"lookahead_ids", sequence.lookahead_ids()},
                {"kept", sequence.kept()},
                {"kv_entries_after_prefill", kv_entries},
                {"generated", generated}};
  }

  absl::StatusOr<Json> Logits() {
    RS_ASSIGN_OR_RETURN(std::vector<int32_t> tokens, InputTokens());
    const std::string out = absl::GetFlag(FLAGS_out);
    if (out.empty()) return absl::InvalidArgumentError("--out is required");
    if (tokens.empty()) return absl::InvalidArgumentError("no input tokens");
    SequenceRunner runner(*model_, static_cast<int32_t>(tokens.size()));
    std::vector<float> logits;
    RS_RETURN_IF_ERROR(runner.Append(tokens, absl::GetFlag(FLAGS_chunk), true, logits));
    std::ofstream file(out, std::ios::binary);
    file.write(reinterpret_cast<const char*>(logits.data()), sizeof(float) * logits.size());
    if (!file) return absl::InternalError(absl::StrCat(out, ": write failed"));
    return Json{{"tokens", tokens.size()},
                {"vocab_size", model_->config.vocab_size},
                {"token_ids", tokens}};
  }

  absl::StatusOr<Json> Ttft() {
    TtftOptions o;
    RS_ASSIGN_OR_RETURN(o.splits, LoadMaps());
    o.maps = maps_.maps.get();
    RS_ASSIGN_OR_RETURN(o, TtftFlags(std::move(o)));
    RS_ASSIGN_OR_RETURN(o.prompt_tokens, ParseIntList("lengths", absl::GetFlag(FLAGS_lengths)));
    o.exact_tail_tokens = absl::GetFlag(FLAGS_exact_tail_tokens);
    RS_ASSIGN_OR_RETURN(Json out, RunTtft(*model_, o));
    // With drafts, SpecPC's and SpecKV's times on the same prompts.
    RS_ASSIGN_OR_RETURN(const SpecPcEvalOptions spec_pc, SpecPcFlags());
    RS_ASSIGN_OR_RETURN(const SpecKvEvalOptions spec_kv, SpecKvFlags());
    if (!spec_pc.drafts.empty()) {
      RS_ASSIGN_OR_RETURN(out["spec_pc"], RunSpecPcTtft(*model_, spec_pc, o));
    }
    if (!spec_kv.drafts.empty()) {
      RS_ASSIGN_OR_RETURN(out["spec_kv"], RunSpecKvTtft(*model_, spec_kv, o));
    }
    return out;
  }

  // ttft's prompt (--text's tokens, repeated if short; else pseudo-random), repetitions, chunk.
  absl::StatusOr<TtftOptions> TtftFlags(TtftOptions o) {
    if (!absl::GetFlag(FLAGS_text).empty()) {
      RS_ASSIGN_OR_RETURN(std::string text, ReadFile(absl::GetFlag(FLAGS_text)));
      o.prompt_source = model_->tokenizer->Encode(text, /*add_bos=*/true, /*parse_special=*/false);
      if (o.prompt_source.empty()) return absl::InvalidArgumentError("--text has no tokens");
    }
    o.repetitions = absl::GetFlag(FLAGS_repetitions);
    o.chunk = absl::GetFlag(FLAGS_chunk);
    return o;
  }

  // Loads --maps for the model (into maps_) and returns the splits to evaluate: --split_layer when
  // given, else every split in the file.
  absl::StatusOr<std::vector<int32_t>> LoadMaps() {
    const std::string maps_path = absl::GetFlag(FLAGS_maps);
    if (maps_path.empty()) return absl::InvalidArgumentError("--maps is required");
    // The map file must have been fitted on this very model (fingerprint of its tensors).
    RS_ASSIGN_OR_RETURN(maps_,
                        LoadRidgeFillMaps(maps_path, *model_,
                                          static_cast<float>(absl::GetFlag(FLAGS_max_leverage))));
    const RidgeFillMaps& maps = *maps_.maps;
    std::vector<int32_t> splits = maps.split_layers();
    if (const int32_t s = absl::GetFlag(FLAGS_split_layer); s >= 0) {
      if (maps.FindSplit(s) == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat("--split_layer ", s, ": no maps for it in ", maps_path));
      }
      splits = {s};
    }
    return splits;
  }

  absl::StatusOr<Json> Needle() {
    NeedleOptions o;
    RS_ASSIGN_OR_RETURN(o.splits, LoadMaps());
    o.maps = maps_.maps.get();
    RS_ASSIGN_OR_RETURN(o, NeedleFlags(std::move(o)));
    RS_ASSIGN_OR_RETURN(o.lengths, ParseIntList("lengths", absl::GetFlag(FLAGS_lengths)));
    o.exact_tail_tokens = absl::GetFlag(FLAGS_exact_tail_tokens);
    return RunNeedle(*model_, o);
  }

  // needle's haystack, depths, trials, chunk and seed.
  absl::StatusOr<NeedleOptions> NeedleFlags(NeedleOptions o) {
    if (absl::GetFlag(FLAGS_haystack).empty()) {
      return absl::InvalidArgumentError("--haystack is required");
    }
    RS_ASSIGN_OR_RETURN(o.haystack_text, ReadFile(absl::GetFlag(FLAGS_haystack)));
    for (absl::string_view d : absl::StrSplit(absl::GetFlag(FLAGS_depths), ',')) {
      double depth = 0;
      if (!absl::SimpleAtod(d, &depth)) {
        return absl::InvalidArgumentError(absl::StrCat("--depths: bad number \"", d, "\""));
      }
      o.depths.push_back(depth);
    }
    o.trials = absl::GetFlag(FLAGS_trials);
    o.chunk = absl::GetFlag(FLAGS_chunk);
    o.seed = absl::GetFlag(FLAGS_seed);
    return o;
  }

  // distant-loss's text, prompt length, tail, windows, threshold and chunk.
  absl::StatusOr<DistantLossOptions> DistantLossFlags(DistantLossOptions o) {
    RS_ASSIGN_OR_RETURN(o.text, ReadFile(absl::GetFlag(FLAGS_text)));
    o.prompt_tokens = absl::GetFlag(FLAGS_prompt_tokens);
    o.exact_tail_tokens = absl::GetFlag(FLAGS_exact_tail_tokens);
    o.windows = absl::GetFlag(FLAGS_windows);
    o.distant_threshold_nats = absl::GetFlag(FLAGS_distant_threshold_nats);
    o.chunk = absl::GetFlag(FLAGS_chunk);
    return o;
  }

  absl::StatusOr<Json> DistantLoss() {
    DistantLossOptions o;
    RS_ASSIGN_OR_RETURN(o.splits, LoadMaps());
    o.maps = maps_.maps.get();
    RS_ASSIGN_OR_RETURN(o, DistantLossFlags(std::move(o)));
    return RunDistantLoss(*model_, o);
  }

  absl::StatusOr<Json> NextTokenKl() {
    NextTokenKlOptions o;
    RS_ASSIGN_OR_RETURN(o.splits, LoadMaps());
    o.maps = maps_.maps.get();
    RS_ASSIGN_OR_RETURN(o.tokens, InputTokens());
    o.exact_tail_tokens = absl::GetFlag(FLAGS_exact_tail_tokens);
    o.chunk = absl::GetFlag(FLAGS_chunk);
    return RunNextTokenKl(*model_, o);
  }

  absl::StatusOr<Json> Splice() {
    SpliceOptions o;
    RS_ASSIGN_OR_RETURN(o.window.splits, LoadMaps());
    o.window.maps = maps_.maps.get();
    RS_ASSIGN_OR_RETURN(o.window, DistantLossFlags(std::move(o.window)));
    o.per_layer = absl::GetFlag(FLAGS_per_layer);
    return RunSplice(*model_, o);
  }

  absl::StatusOr<Json> Pareto() {
    ParetoOptions o;
    RS_ASSIGN_OR_RETURN(o.splits, LoadMaps());
    o.maps = maps_.maps.get();
    RS_ASSIGN_OR_RETURN(o.prompt_tokens, ParseIntList("lengths", absl::GetFlag(FLAGS_lengths)));
    RS_ASSIGN_OR_RETURN(o.tails, ParseIntList("tails", absl::GetFlag(FLAGS_tails)));
    RS_ASSIGN_OR_RETURN(o.ttft, TtftFlags(TtftOptions{}));
    RS_ASSIGN_OR_RETURN(o.needle, NeedleFlags(NeedleOptions{}));
    RS_ASSIGN_OR_RETURN(o.distant, DistantLossFlags(DistantLossOptions{}));
    RS_ASSIGN_OR_RETURN(o.spec_pc, SpecPcFlags());
    RS_ASSIGN_OR_RETURN(o.spec_kv, SpecKvFlags());
    if (!absl::GetFlag(FLAGS_draft_model).empty() && o.spec_pc.drafts.empty() &&
        o.spec_kv.drafts.empty()) {
      return absl::InvalidArgumentError(
          "pareto: --draft_model needs --spec_pc_budgets or --spec_kv_budgets");
    }
    RS_ASSIGN_OR_RETURN(Json out, RunPareto(*model_, o));
    if (const std::string plot = absl::GetFlag(FLAGS_plot); !plot.empty()) {
      if (absl::Status s = DrawParetoPlot(out, plot); !s.ok()) {
        std::fprintf(stderr, "ridgeserve-eval: plot: %s\n", s.ToString().c_str());
      } else {
        spdlog::info("plot: {}", plot);
      }
    }
    return out;
  }

  // pareto's SpecPC settings: the drafts of --draft_model (a comma list, loaded once each) and
  // --spec_pc_budgets; none without --draft_model.
  absl::StatusOr<SpecPcEvalOptions> SpecPcFlags() {
    SpecPcEvalOptions o;
    const std::string budgets = absl::GetFlag(FLAGS_spec_pc_budgets);
    if (budgets.empty()) return o;
    RS_ASSIGN_OR_RETURN(o.budgets, ParseIntList("spec_pc_budgets", budgets));
    RS_ASSIGN_OR_RETURN(o.drafts, Drafts());
    o.lookahead_tokens = absl::GetFlag(FLAGS_spec_pc_lookahead_tokens);
    o.kernel = absl::GetFlag(FLAGS_spec_kernel);
    o.original_positions = absl::GetFlag(FLAGS_spec_pc_original_positions);
    return o;
  }

  // pareto's SpecKV settings: the same drafts and --spec_kv_budgets.
  absl::StatusOr<SpecKvEvalOptions> SpecKvFlags() {
    SpecKvEvalOptions o;
    const std::string budgets = absl::GetFlag(FLAGS_spec_kv_budgets);
    if (budgets.empty()) return o;
    RS_ASSIGN_OR_RETURN(o.budgets, ParseIntList("spec_kv_budgets", budgets));
    RS_ASSIGN_OR_RETURN(o.drafts, Drafts());
    o.lookahead_tokens = absl::GetFlag(FLAGS_spec_kv_lookahead_tokens);
    return o;
  }

  // The drafts of --draft_model (a comma list), loaded once each.
  absl::StatusOr<std::vector<const DraftModel*>> Drafts() {
    if (absl::GetFlag(FLAGS_draft_model).empty()) {
      return absl::InvalidArgumentError(
          "--spec_pc_budgets and --spec_kv_budgets need --draft_model");
    }
    if (drafts_.empty()) {
      for (absl::string_view spec : absl::StrSplit(absl::GetFlag(FLAGS_draft_model), ',')) {
        RS_ASSIGN_OR_RETURN(std::unique_ptr<DraftModel> draft,
                            LoadDraftModel(std::string(spec), *model_, *backend_));
        drafts_.push_back(std::move(draft));
      }
    }
    std::vector<const DraftModel*> out;
    for (const std::unique_ptr<DraftModel>& d : drafts_) out.push_back(d.get());
    return out;
  }

 private:
  RankGroup ranks_;             // one CPU backend per tensor-parallel rank
  Backend* backend_ = nullptr;  // rank 0's
  std::unique_ptr<Model> model_;
  LoadedRidgeFillMaps maps_;
  std::vector<std::unique_ptr<DraftModel>> drafts_;  // pareto's
};

absl::StatusOr<Json> Run(const std::string& command) {
  Eval eval;
  if (command != "perplexity" && command != "generate" && command != "bench-prefill" &&
      command != "bench-decode" && command != "logits" && command != "ttft" &&
      command != "needle" && command != "distant-loss" && command != "next-token-kl" &&
      command != "splice" && command != "pareto" && command != "spec-pc" && command != "spec-kv") {
    return absl::InvalidArgumentError(absl::StrCat("unknown command \"", command, "\""));
  }
  if (absl::GetFlag(FLAGS_tensor_parallel) != 1 && command != "perplexity" &&
      command != "generate" && command != "bench-prefill" && command != "logits") {
    return absl::InvalidArgumentError(
        absl::StrCat("--tensor_parallel: ", command, " runs at 1 only"));
  }
  RS_RETURN_IF_ERROR(eval.Init());
  if (command == "perplexity") return eval.Perplexity();
  if (command == "generate") return eval.Generate();
  if (command == "bench-prefill") return eval.BenchPrefill();
  if (command == "bench-decode") return eval.BenchDecode();
  if (command == "ttft") return eval.Ttft();
  if (command == "needle") return eval.Needle();
  if (command == "distant-loss") return eval.DistantLoss();
  if (command == "next-token-kl") return eval.NextTokenKl();
  if (command == "splice") return eval.Splice();
  if (command == "pareto") return eval.Pareto();
  if (command == "spec-pc") return eval.SpecPc();
  if (command == "spec-kv") return eval.SpecKv();
  return eval.Logits();
}

}  // namespace
}  // namespace ridgeserve

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "ridgeserve-eval "
      "<perplexity|generate|bench-prefill|bench-decode|logits|ttft|needle|distant-loss|"
      "next-token-kl|splice|"
      "pareto|spec-pc|spec-kv> "
      "--model M [flags]");
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  spdlog::set_default_logger(spdlog::stderr_color_mt("eval"));
  if (args.size() != 2) {
    std::fprintf(stderr, "usage: %s\n", absl::ProgramUsageMessage().data());
    return 2;
  }
  absl::StatusOr<nlohmann::json> result = ridgeserve::Run(args[1]);
  if (!result.ok()) {
    std::fprintf(stderr, "ridgeserve-eval: %s\n", result.status().ToString().c_str());
    return 1;
  }
  std::printf("%s\n", result->dump().c_str());
  return 0;
}
