// Prefill, decode and RidgeFill speed of a model on one backend, for tests/gpu/run.sh (not a
// test). One JSON object on stdout, and each measurement on stderr as it is taken (decode
// first, then prefill and RidgeFill per length, then attention alone, then SpecKV's selection):
//   cuda_bench --backend cuda --model models/SmolLM2-135M-Instruct.Q4_1.gguf
//   cuda_bench --backend cuda --random_config tests/gpu/llama31_8b_config.json
//     --prefill_tokens 8192,32768 --decode_batches 1,16,64 --ridgefill_depths 0.5,0.667
//     --peak_tflops 989 --peak_hbm_gbps 4800
// --random_config: the architecture of a config.json with random bf16 weights (RandomModel),
// so a shape whose weights are not on the machine can be measured.
// Prefill: N prompt rows in chunks of --chunk (0: one pass), timed after one untimed warm-up of
// the same length, best of --repeats; with a peak, its model FLOPs (dense, causal attention, the
// last row's LM head) as a share of it (MFU). Decode: B sequences together after a
// --decode_context prompt each, --decode_tokens greedy steps timed, drawn on the backend as
// serving does; on a backend with graphs both eagerly (decode_bB_eager_tokens_per_s) and on
// decode graphs (decode_bB_tokens_per_s, the server's way); with a peak, the bytes a step must read
// (the weights but an untied embedding table, and the KV of every sequence at its mean context) as
// a share of it. RidgeFill: the same prefill with the rows from --ridgefill_sink_tokens to N -
// --exact_tail_tokens filled at split round(depth x layers) by random pre_norm maps (speed only),
// against the exact prefill. Attention alone (--attention_tokens): one Backend::Attention call
// over every row of an N-token prompt of the model's attention shape (random queries and K/V),
// on a cache of the backend's default type and, up to --attention_f16_up_to tokens, an f16 one
// (on CUDA: the tiles against the rows kernels), best of --repeats after a warm-up, with its
// FLOPs (4 x heads x head_dim x N(N+1)/2) per second. SpecKV's selection (--selection_tokens):
// one layer's Backend::AttentionScores (96 query rows over N - 96 keys) and CompactKv
// (--selection_budget entries per KV head) at a context of N, and that times the model's layers.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "engine/common/status_macros.h"
#include "engine/kv/paged_kv_cache.h"
#include "engine/model/model.h"
#include "engine/ridgefill/map_file.h"
#include "engine/ridgefill/ridgefill_maps.h"
#include "engine/tools/bench_util.h"
#include "engine/tools/random_model.h"
#include "engine/tools/sequence_runner.h"
#include "engine/tools/tool_util.h"
#include "kernels/backend_registry.h"
#include "tests/kernels/kernel_test_util.h"

ABSL_FLAG(std::string, backend, "cuda", "cpu or cuda");
ABSL_FLAG(std::string, model, "", "GGUF file or Hugging Face directory");
ABSL_FLAG(std::string, random_config, "",
          "instead of --model: this config.json's architecture with random bf16 weights");
ABSL_FLAG(std::string, prefill_tokens, "512,2048", "prompt lengths to time, comma separated");
ABSL_FLAG(int32_t, chunk, 0, "prefill rows per forward pass (0: the whole prompt in one)");
ABSL_FLAG(std::string, decode_batches, "1", "sequences decoding together, comma separated");
ABSL_FLAG(int32_t, decode_tokens, 128, "decode steps to time");
ABSL_FLAG(int32_t, decode_context, 512, "prompt length of each sequence before the decode steps");
ABSL_FLAG(std::string, ridgefill_depths, "",
          "RidgeFill splits to time as fractions of the layers, comma separated (empty: none)");
ABSL_FLAG(int32_t, exact_tail_tokens, 1024, "RidgeFill: the prompt's last rows that run exactly");
ABSL_FLAG(int32_t, ridgefill_sink_tokens, 4, "RidgeFill: the prompt's first rows that run exactly");
ABSL_FLAG(int32_t, repeats, 3, "timed prefill passes per length (best is reported)");
ABSL_FLAG(double, peak_tflops, 0, "dense peak of the device for MFU (H200 bf16: 989; 0: none)");
ABSL_FLAG(double, peak_hbm_gbps, 0, "memory bandwidth for decode's share (H200: 4800; 0: none)");
ABSL_FLAG(int32_t, threads, 0, "cpu backend threads (0: all)");
ABSL_FLAG(std::string, attention_tokens, "", "prompt lengths to time attention alone at");
ABSL_FLAG(std::string, selection_tokens, "",
          "contexts to time SpecKV's selection of one layer at (scores and compaction)");
ABSL_FLAG(int32_t, selection_budget, 1024, "SpecKV's budget for --selection_tokens");
ABSL_FLAG(int32_t, attention_f16_up_to, 0,
          "also time attention on an f16 cache at lengths up to this (0: never)");

namespace ridgeserve {
namespace {

using ::ridgeserve::testing::RandomFloats;

absl::StatusOr<std::vector<double>> ParseDoubles(const std::string& flag, const std::string& s) {
  std::vector<double> out;
  if (s.empty()) return out;
  for (absl::string_view piece : absl::StrSplit(s, ',')) {
    double v = 0;
    if (!absl::SimpleAtod(piece, &v) || !(v > 0 && v < 1)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, ": want fractions in (0, 1), got '", piece, "'"));
    }
    out.push_back(v);
  }
  return out;
}

// Seconds of the best of `repeats` prefills of `tokens` after one warm-up (with `fill`: RidgeFill).
absl::StatusOr<double> TimePrefill(LlamaModel& llama, const std::vector<int32_t>& tokens,
                                   int32_t chunk, int32_t repeats, const RidgeFillRun* fill) {
  const int32_t n = static_cast<int32_t>(tokens.size());
  std::vector<float> logits;
  double best = 1e30;
  for (int rep = 0; rep <= repeats; ++rep) {
    SequenceRunner runner(llama, n);
    const auto start = ToolClock::now();
    RS_RETURN_IF_ERROR(runner.Append(tokens, chunk > 0 ? chunk : n, false, logits, fill));
    if (rep > 0) best = std::min(best, SecondsSince(start));  // rep 0 warms up
  }
  return best;
}

// Random pre_norm maps at each split (speed only): every target layer's map is one shared
// [hidden, hidden] matrix near 0.
absl::StatusOr<std::unique_ptr<RidgeFillMaps>> RandomMaps(LlamaModel& llama,
                                                          const std::vector<int32_t>& splits,
                                                          std::vector<float>& weight,
                                                          std::vector<float>& bias) {
  const ModelConfig& c = llama.config();
  bias.assign(c.hidden, 0.0f);
  weight = RandomFloats(size_t(c.hidden) * c.hidden, 5, -1e-3f, 1e-3f);
  MapSet maps;
  maps.model = {0, c.name, c.num_layers, c.hidden};
  maps.num_kv_heads = c.num_kv_heads;
  maps.head_dim = c.head_dim;
  maps.kind = MapTarget::kPreNorm;
  for (int32_t s : splits) {
    SplitMaps split;
    split.split_layer = s;
    for (int32_t l = s + 2; l < c.num_layers; ++l) {
      TargetMap t;
      t.layer = l;
      t.out_dim = c.hidden;
      t.weight = weight;
      t.bias = bias;
      split.targets.push_back(t);
    }
    maps.splits.push_back(std::move(split));
  }
  RS_RETURN_IF_ERROR(ValidateMapSet(maps));  // a split outside [0, L - 3], or one twice
  return RidgeFillMaps::Load(maps, llama);
}

DeviceBuffer Upload(Backend& backend, const void* host, size_t bytes) {
  absl::StatusOr<DeviceBuffer> buffer = backend.Alloc(bytes);
  if (!buffer.ok()) return DeviceBuffer();
  backend.CopyToDevice(buffer->as<void>(), host, bytes);
  return *std::move(buffer);
}

// A one-layer cache of `dtype` holding n tokens of one sequence (blocks 0, 1, ... in order) with
// random K/V drawn from `seed`. The positions 0..n-1 stay uploaded in *positions_buffer.
absl::StatusOr<PagedKvCache> RandomOneLayerCache(Backend& backend, const ModelConfig& c, int32_t n,
                                                 DType dtype, uint32_t seed,
                                                 DeviceBuffer* positions_buffer) {
  constexpr int32_t kBlock = 16;
  RS_ASSIGN_OR_RETURN(
      PagedKvCache cache,
      PagedKvCache::Create(backend, KvCacheShape{1, c.num_kv_heads, c.head_dim, kBlock,
                                                 (n + kBlock - 1) / kBlock, dtype}));
  const int32_t kv_width = c.num_kv_heads * c.head_dim;
  const std::vector<float> k = RandomFloats(size_t(n) * kv_width, seed),
                           v = RandomFloats(size_t(n) * kv_width, seed + 1);
  std::vector<int32_t> positions(n);
  std::iota(positions.begin(), positions.end(), 0);
  DeviceBuffer dk = Upload(backend, k.data(), sizeof(float) * k.size());
  DeviceBuffer dv = Upload(backend, v.data(), sizeof(float) * v.size());
  *positions_buffer = Upload(backend, positions.data(), sizeof(int32_t) * n);
  for (const DeviceBuffer* b :
       std::initializer_list<const DeviceBuffer*>{&dk, &dv, positions_buffer}) {
    if (b->as<void>() == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat("a cache of ", n, " tokens: no memory"));
    }
  }
  backend.StoreKv(cache.layer(0), dk.as<float>(), dv.as<float>(), kv_width, n,
                  positions_buffer->as<int32_t>());
  return cache;
}

// Seconds of the best of `repeats` Attention calls over the n rows of one n-token sequence (K/V
// stored first) on a one-layer cache of `dtype`, after one untimed call.
absl::StatusOr<double> TimeAttention(Backend& backend, const ModelConfig& c, int32_t n, DType dtype,
                                     int32_t repeats) {
  DeviceBuffer dpos;
  RS_ASSIGN_OR_RETURN(PagedKvCache cache, RandomOneLayerCache(backend, c, n, dtype, 7, &dpos));
  const int32_t blocks = cache.shape().num_blocks;
  const int32_t q_width = c.num_heads * c.head_dim;
  std::vector<int32_t> seq(n, 0), tables(blocks), offsets = {0, blocks};
  std::iota(tables.begin(), tables.end(), 0);
  const std::vector<float> q = RandomFloats(size_t(n) * q_width, 9);
  DeviceBuffer dq = Upload(backend, q.data(), sizeof(float) * q.size());
  DeviceBuffer dseq = Upload(backend, seq.data(), sizeof(int32_t) * n);
  DeviceBuffer doff = Upload(backend, offsets.data(), sizeof(int32_t) * offsets.size());
  DeviceBuffer dtab = Upload(backend, tables.data(), sizeof(int32_t) * tables.size());
  absl::StatusOr<DeviceBuffer> out = backend.Alloc(sizeof(float) * size_t(n) * q_width);
  if (!out.ok()) return out.status();
  for (const DeviceBuffer* b : {&dq, &dseq, &doff, &dtab}) {
    if (b->as<void>() == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat("attention at ", n, " tokens: no memory"));
    }
  }
  const KvLayerView layer = cache.layer(0);
  const AttentionRows rows{n, dpos.as<int32_t>(), dseq.as<int32_t>(), doff.as<int32_t>(),
                           dtab.as<int32_t>()};
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  double best = 1e30;
  for (int rep = 0; rep <= repeats; ++rep) {
    backend.Synchronize();
    const auto start = ToolClock::now();
    backend.Attention(dq.as<float>(), q_width, c.num_heads, layer, rows, scale, out->as<void>());
    backend.Synchronize();
    if (rep > 0) best = std::min(best, SecondsSince(start));  // rep 0 warms up
  }
  return best;
}

// SpecKV's selection of one layer at a context of n tokens (a prompt of n - 64 and a lookahead
// answer of 64): AttentionScores of the 96 captured query rows (the prompt's last 32 and the
// answer's 64) over the prompt's keys outside the window, and CompactKv of `budget` entries per
// KV head. The best of `repeats` each (after an untimed call), seconds.
constexpr int32_t kWindow = 32, kLookahead = 64;  // SpecKV's window; the answer timed
absl::StatusOr<std::pair<double, double>> TimeSelection(Backend& backend, const ModelConfig& c,
                                                        int32_t n, int32_t budget,
                                                        int32_t repeats) {
  DeviceBuffer dpos;
  RS_ASSIGN_OR_RETURN(PagedKvCache cache,
                      RandomOneLayerCache(backend, c, n, backend.DefaultKvCacheDType(), 11, &dpos));
  const int32_t prompt = n - kLookahead, scored = prompt - kWindow;
  std::vector<int32_t> blocks(cache.shape().num_blocks), positions(kWindow + kLookahead);
  std::iota(blocks.begin(), blocks.end(), 0);
  std::iota(positions.begin(), positions.end(), scored);
  const std::vector<float> weights(positions.size(), 1.0f);
  const std::vector<float> q = RandomFloats(positions.size() * c.num_heads * c.head_dim, 13);
  std::vector<float> scores(size_t(c.num_kv_heads) * scored);
  // Every KV head keeps the window and budget - window places spread over the rest.
  std::vector<int32_t> from;
  for (int32_t g = 0; g < c.num_kv_heads; ++g) {
    for (int32_t i = 0; i < budget; ++i) {
      from.push_back(i < budget - kWindow ? int32_t(int64_t{i} * scored / (budget - kWindow))
                                          : scored + (i - (budget - kWindow)));
    }
  }
  const KvLayerView layer = cache.layer(0);
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  double best_scores = 1e30, best_compact = 1e30;
  for (int rep = 0; rep <= repeats; ++rep) {
    backend.Synchronize();
    auto start = ToolClock::now();
    backend.AttentionScores(layer, blocks, q.data(), c.num_heads, positions, weights, scale, scored,
                            scores.data());
    if (rep > 0) best_scores = std::min(best_scores, SecondsSince(start));
    start = ToolClock::now();
    backend.CompactKv(layer, blocks, from, budget);
    backend.Synchronize();
    if (rep > 0) best_compact = std::min(best_compact, SecondsSince(start));
  }
  return std::make_pair(best_scores, best_compact);
}

absl::Status Run(std::string& json) {
  RS_ASSIGN_OR_RETURN(std::vector<int32_t> lengths,
                      ParseIntList("prefill_tokens", absl::GetFlag(FLAGS_prefill_tokens)));
  RS_ASSIGN_OR_RETURN(std::vector<int32_t> batches,
                      ParseIntList("decode_batches", absl::GetFlag(FLAGS_decode_batches)));
  RS_ASSIGN_OR_RETURN(std::vector<double> depths,
                      ParseDoubles("ridgefill_depths", absl::GetFlag(FLAGS_ridgefill_depths)));
  RS_ASSIGN_OR_RETURN(std::vector<int32_t> attention_lengths,
                      ParseIntList("attention_tokens", absl::GetFlag(FLAGS_attention_tokens)));
  for (int32_t n : attention_lengths) {
    if (n < 1) return absl::InvalidArgumentError("--attention_tokens: want lengths >= 1");
  }
  RS_ASSIGN_OR_RETURN(std::vector<int32_t> selection_lengths,
                      ParseIntList("selection_tokens", absl::GetFlag(FLAGS_selection_tokens)));
  const int32_t budget = absl::GetFlag(FLAGS_selection_budget);
  for (int32_t n : selection_lengths) {
    if (budget <= kWindow || n < kLookahead + kWindow + budget) {
      return absl::InvalidArgumentError(
          absl::StrCat("--selection_tokens: want at least ", kLookahead + kWindow + budget,
                       " (--selection_budget ", budget, " over SpecKV's window of ", kWindow,
                       " and a 64-token answer)"));
    }
  }
  const std::string name = absl::GetFlag(FLAGS_backend);
  RS_ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend,
                      CreateBackend(name, {.num_threads = absl::GetFlag(FLAGS_threads)}));
  const std::string random_config = absl::GetFlag(FLAGS_random_config);
  RS_ASSIGN_OR_RETURN(std::unique_ptr<Model> model,
                      random_config.empty() ? LoadModel(absl::GetFlag(FLAGS_model), *backend)
                                            : RandomModel(random_config, *backend, 1));
  LlamaModel& llama = *model->llama;
  llama.SetKvCacheDType(backend->DefaultKvCacheDType());
  const ModelConfig& c = model->config;
  const double peak_tflops = absl::GetFlag(FLAGS_peak_tflops);
  const double peak_gbps = absl::GetFlag(FLAGS_peak_hbm_gbps);
  const int32_t chunk = absl::GetFlag(FLAGS_chunk), repeats = absl::GetFlag(FLAGS_repeats);
  json = absl::StrCat("{\"backend\": \"", name, "\", \"model\": \"", model->path,
                      "\", \"weight_bytes\": ", llama.weights().resident_bytes());
  // Each measurement also goes to stderr as it is taken: a run stopped by its timeout keeps them.
  size_t reported = 0;
  auto progress = [&] {
    std::fprintf(stderr, "cuda_bench: %s\n", json.substr(reported).c_str());
    std::fflush(stderr);
    reported = json.size();
  };

  std::vector<int32_t> splits;
  for (double d : depths) splits.push_back(static_cast<int32_t>(std::lround(d * c.num_layers)));
  std::vector<float> map_weight, map_bias;  // the maps' host arrays, alive while they load
  std::unique_ptr<RidgeFillMaps> maps;
  if (!splits.empty()) {
    absl::StatusOr<std::unique_ptr<RidgeFillMaps>> loaded =
        RandomMaps(llama, splits, map_weight, map_bias);
    if (!loaded.ok()) {
      return absl::Status(loaded.status().code(),
                          absl::StrCat("--ridgefill_depths: ", loaded.status().message()));
    }
    maps = *std::move(loaded);
  }
  const int32_t context = absl::GetFlag(FLAGS_decode_context);
  const int32_t steps = absl::GetFlag(FLAGS_decode_tokens);
  const double kv_bytes_per_token =
      2.0 * c.num_layers * c.num_kv_heads * c.head_dim * ElementBytes(llama.kv_cache_dtype());
  // A step reads every weight but an untied embedding table, of which it gathers B rows.
  const ModelWeights& w = llama.weights();
  const double weight_bytes =
      static_cast<double>(w.resident_bytes() - (w.lm_head.empty() ? 0 : w.token_embd.bytes()));
  // On a backend with graphs, each batch eagerly and then on decode graphs (the server's way),
  // in the same run.
  const bool graphs = llama.backend().SupportsGraphs();
  for (int32_t b : batches) {
    const std::string key = absl::StrCat(", \"decode_b", b);
    if (graphs) {
      llama.SetDecodeGraphBuckets({});
      RS_ASSIGN_OR_RETURN(const double eager, TimeBatchedDecode(llama, b, context, steps, 2));
      absl::StrAppend(&json, key, "_eager_tokens_per_s\": ", b * steps / eager);
      llama.SetDecodeGraphBuckets(LlamaModel::DecodeGraphBuckets(b));
    }
    RS_ASSIGN_OR_RETURN(const double seconds, TimeBatchedDecode(llama, b, context, steps, 2));
    llama.SetDecodeGraphBuckets({});
    absl::StrAppend(&json, key, "_tokens_per_s\": ", b * steps / seconds);
    if (peak_gbps > 0) {
      // The KV of every sequence at its mean context over the timed steps (1..steps: step 0
      // is TimeBatchedDecode's untimed one).
      const double bytes = weight_bytes + b * (context + (steps + 1) / 2.0) * kv_bytes_per_token;
      absl::StrAppend(&json, key, "_hbm_share\": ", bytes * steps / seconds / (peak_gbps * 1e9));
    }
    progress();
  }
  for (int32_t n : lengths) {
    if (n < 1) return absl::InvalidArgumentError("--prefill_tokens: want lengths >= 1");
    const std::vector<int32_t> tokens = RandomTokenIds(n, c.vocab_size, 1);
    RS_ASSIGN_OR_RETURN(const double seconds, TimePrefill(llama, tokens, chunk, repeats, nullptr));
    const std::string key = absl::StrCat(", \"prefill_", n);
    absl::StrAppend(&json, key, "_tokens_per_s\": ", n / seconds, key, "_seconds\": ", seconds);
    if (peak_tflops > 0) {
      absl::StrAppend(&json, key, "_mfu\": ", PrefillFlops(c, n) / seconds / (peak_tflops * 1e12));
    }
    const int32_t sink = absl::GetFlag(FLAGS_ridgefill_sink_tokens);
    const int32_t exact_from = n - absl::GetFlag(FLAGS_exact_tail_tokens);
    for (int32_t s : splits) {
      if (exact_from <= sink) continue;  // nothing to fill
      RidgeFillRun fill{s, std::vector<uint8_t>(n, 0), maps.get()};
      std::fill(fill.filled_rows.begin() + sink, fill.filled_rows.begin() + exact_from, 1);
      RS_ASSIGN_OR_RETURN(const double filled, TimePrefill(llama, tokens, chunk, repeats, &fill));
      absl::StrAppend(&json, ", \"ridgefill_", n, "_split", s, "_seconds\": ", filled,
                      ", \"ridgefill_", n, "_split", s, "_speedup\": ", seconds / filled);
    }
    progress();
  }

  for (int32_t n : attention_lengths) {
    std::vector<DType> dtypes = {backend->DefaultKvCacheDType()};
    if (n <= absl::GetFlag(FLAGS_attention_f16_up_to) && dtypes[0] != DType::kF16) {
      dtypes.push_back(DType::kF16);
    }
    // Causal: row p attends to p + 1 positions, 2 FLOPs each for the scores and for P V.
    const double flops = 4.0 * c.num_heads * c.head_dim * (double(n) * (n + 1) / 2);
    for (DType dtype : dtypes) {
      RS_ASSIGN_OR_RETURN(const double seconds, TimeAttention(*backend, c, n, dtype, repeats));
      const std::string key =
          absl::StrCat(", \"attention_", n, "_", std::string(KvCacheDTypeName(dtype)));
      absl::StrAppend(&json, key, "_seconds\": ", seconds, key,
                      "_tflops\": ", flops / seconds / 1e12);
    }
    progress();
  }

  for (int32_t n : selection_lengths) {
    RS_ASSIGN_OR_RETURN(const auto seconds, TimeSelection(*backend, c, n, budget, repeats));
    const std::string key = absl::StrCat(", \"selection_", n);
    absl::StrAppend(&json, key, "_scores_seconds\": ", seconds.first, key,
                    "_compact_seconds\": ", seconds.second, key,
                    "_all_layers_seconds\": ", c.num_layers * (seconds.first + seconds.second));
    progress();
  }

  absl::StrAppend(&json, ", \"decode_context\": ", context, "}");
  return absl::OkStatus();
}

}  // namespace
}  // namespace ridgeserve

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  std::string json;
  if (absl::Status s = ridgeserve::Run(json); !s.ok()) {
    std::fprintf(stderr, "cuda_bench: %s\n", std::string(s.message()).c_str());
    return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  std::printf("%s\n", json.c_str());
  return 0;
}
