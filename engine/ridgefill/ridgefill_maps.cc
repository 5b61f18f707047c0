#include "engine/ridgefill/ridgefill_maps.h"

#include <cblas.h>

#include <atomic>
#include <cmath>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/common/status_macros.h"
#include "engine/model/config.h"
#include "engine/model/llama.h"
#include "engine/ridgefill/map_file.h"

namespace ridgeserve {
namespace {

absl::StatusOr<DeviceBuffer> Upload(Backend& backend, std::span<const float> host) {
  RS_ASSIGN_OR_RETURN(DeviceBuffer buf, backend.Alloc(sizeof(float) * host.size()));
  backend.CopyToDevice(buf.as<void>(), host.data(), sizeof(float) * host.size());
  return buf;
}

// An f32 host matrix [rows, cols] packed as a Weight.
absl::StatusOr<Weight> PackF32(Backend& backend, std::span<const float> host, int64_t rows,
                               int64_t cols) {
  const HostTensor view{reinterpret_cast<const uint8_t*>(host.data()), DType::kF32, rows, cols,
                        sizeof(float) * static_cast<size_t>(cols)};
  return backend.PackWeight({&view, 1});
}

// Layer l's K/V projection on the host: the rank's K/V rows [q_dim, q_dim + 2 kv_dim) of its
// fused QKV (its own KV heads at TP > 1).
struct KvRows {
  std::vector<float> weight;  // [2 kv_dim, hidden]
  std::vector<float> bias;    // [2 kv_dim] or empty
  std::vector<float> k_norm;  // [head_dim] or empty
};

absl::StatusOr<KvRows> ReadKvRows(LlamaModel& model, int32_t layer) {
  const ModelConfig& c = model.config();
  const LayerWeights& w = model.weights().layers[layer];
  Backend& backend = model.backend();
  const int32_t q_dim = model.shard().q_dim(c.head_dim);
  const int32_t kv2 = 2 * model.shard().kv_dim(c.head_dim);
  KvRows r;
  r.weight.resize(static_cast<size_t>(kv2) * c.hidden);
  RS_RETURN_IF_ERROR(backend.UnpackWeight(w.wqkv, q_dim, kv2, r.weight.data()));
  if (w.bqkv.bytes() > 0) {
    r.bias.resize(kv2);
    backend.CopyToHost(r.bias.data(), w.bqkv.as<float>() + q_dim, sizeof(float) * kv2);
  }
  if (c.qk_norm) {
    r.k_norm.resize(c.head_dim);
    backend.CopyToHost(r.k_norm.data(), w.k_norm.as<float>(), sizeof(float) * c.head_dim);
  }
  return r;
}

// A kv-target map's rows [2 kv_dim, cols] (K rows of every KV head, then V rows) cut to the
// rank's KV heads.
std::vector<float> KvHeadRows(std::span<const float> all, int32_t cols, int32_t total_kv_dim,
                              const ShardLayout& shard, int32_t head_dim) {
  const size_t begin = static_cast<size_t>(shard.kv_head_begin) * head_dim * cols;
  const size_t count = static_cast<size_t>(shard.kv_dim(head_dim)) * cols;
  std::vector<float> out(all.begin() + begin, all.begin() + begin + count);
  const size_t v_begin = static_cast<size_t>(total_kv_dim) * cols + begin;
  out.insert(out.end(), all.begin() + v_begin, all.begin() + v_begin + count);
  return out;
}

// One rank's maps (every rank's at TP = 1), on that rank's backend.
absl::StatusOr<std::vector<RidgeFillSplitMaps>> LoadRank(const MapSet& maps, LlamaModel& model) {
  const ModelConfig& config = model.config();
  const ShardLayout& shard = model.shard();
  Backend& backend = model.backend();
  const int32_t hidden = config.hidden, head_dim = config.head_dim;
  const int32_t kv_dim = shard.kv_dim(head_dim);  // the rank's
  const bool folded = maps.kind != MapTarget::kPreNorm;
  const int32_t out_dim = maps.kind == MapTarget::kKv ? 2 * config.kv_dim() : hidden;
  std::vector<RidgeFillSplitMaps> result;
  for (const SplitMaps& split : maps.splits) {
    const int32_t s = split.split_layer;
    if (s < 0 || s + 2 > config.num_layers) {
      return absl::InvalidArgumentError(
          absl::StrCat("ridgefill: split layer ", s, " outside [0, ", config.num_layers - 2, "]"));
    }
    RidgeFillSplitMaps out;
    out.split_layer = s;
    out.folded = folded;
    out.by_layer.resize(config.num_layers);
    if (!split.leverage_inverse.empty()) {
      out.leverage_mean.assign(split.leverage_mean.begin(), split.leverage_mean.end());
      // The leverage test runs on rank 0 only (LlamaModel broadcasts its decisions).
      if (shard.rank == 0) {
        const std::vector<float> inverse(split.leverage_inverse.begin(),
                                         split.leverage_inverse.end());
        RS_ASSIGN_OR_RETURN(out.leverage_inverse, PackF32(backend, inverse, hidden, hidden));
        RS_ASSIGN_OR_RETURN(out.leverage_shift, Upload(backend, out.leverage_mean));
      }
    }
    std::vector<bool> seen(config.num_layers, false);
    for (const TargetMap& t : split.targets) {
      if (t.layer < s + 2 || t.layer >= config.num_layers || seen[t.layer]) {
        return absl::InvalidArgumentError(
            absl::StrCat("ridgefill: split ", s, ": bad target layer ", t.layer));
      }
      const std::string where = absl::StrCat("ridgefill: split ", s, " layer ", t.layer, ": ");
      if (t.out_dim != out_dim || t.weight.size() != static_cast<size_t>(out_dim) * hidden ||
          t.bias.size() != static_cast<size_t>(out_dim)) {
        return absl::InvalidArgumentError(absl::StrCat(where, std::string(MapTargetName(maps.kind)),
                                                       " map is not [", out_dim, ", ", hidden,
                                                       "] + bias"));
      }
      // The rank's KV heads' key scales.
      std::vector<float> key_scale;
      if (!t.key_scale.empty()) {
        if (t.key_scale.size() != static_cast<size_t>(config.num_kv_heads)) {
          return absl::InvalidArgumentError(absl::StrCat(
              where, t.key_scale.size(), " key scales for ", config.num_kv_heads, " KV heads"));
        }
        for (float g : t.key_scale) {
          if (!std::isfinite(g) || !(g > 0)) {
            return absl::InvalidArgumentError(absl::StrCat(where, "key scale ", g, " not > 0"));
          }
        }
        key_scale.assign(t.key_scale.begin() + shard.kv_head_begin,
                         t.key_scale.begin() + shard.kv_head_begin + shard.num_kv_heads);
      }
      seen[t.layer] = true;
      RidgeFillLayerMap& m = out.by_layer[t.layer];
      m.layer = t.layer;
      const bool scale_k = !key_scale.empty();
      KvRows kv;
      if (folded || scale_k) {
        RS_ASSIGN_OR_RETURN(kv, ReadKvRows(model, t.layer));
      }
      // Host K/V weights A [2 kv_dim, hidden] and bias a [2 kv_dim] (empty = none).
      std::vector<float> a, a_bias;
      if (maps.kind == MapTarget::kKv) {
        a = KvHeadRows(t.weight, hidden, config.kv_dim(), shard, head_dim);
        a_bias = KvHeadRows(t.bias, 1, config.kv_dim(), shard, head_dim);
      } else if (maps.kind == MapTarget::kPostNorm) {
        // A = P W, a = P b + c.
        a.resize(static_cast<size_t>(2) * kv_dim * hidden);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 2 * kv_dim, hidden, hidden, 1.0f,
                    kv.weight.data(), hidden, t.weight.data(), hidden, 0.0f, a.data(), hidden);
        a_bias = kv.bias.empty() ? std::vector<float>(2 * kv_dim, 0.0f) : kv.bias;
        cblas_sgemv(CblasRowMajor, CblasNoTrans, 2 * kv_dim, hidden, 1.0f, kv.weight.data(), hidden,
                    t.bias.data(), 1, 1.0f, a_bias.data(), 1);
      } else {
        RS_ASSIGN_OR_RETURN(m.weight, PackF32(backend, t.weight, hidden, hidden));
        RS_ASSIGN_OR_RETURN(m.bias, Upload(backend, t.bias));
        if (scale_k && !config.qk_norm) {
          a = kv.weight;
          a_bias = kv.bias;
        }
      }
      if (scale_k && config.qk_norm) {
        // γ_h goes after k_norm, which would undo a scale folded into the projection.
        std::vector<float> k_norm(static_cast<size_t>(shard.num_kv_heads) * head_dim);
        for (int32_t h = 0; h < shard.num_kv_heads; ++h) {
          for (int32_t j = 0; j < head_dim; ++j) {
            k_norm[h * head_dim + j] = kv.k_norm[j] * key_scale[h];
          }
        }
        RS_ASSIGN_OR_RETURN(m.k_norm_scaled, Upload(backend, k_norm));
      } else if (scale_k) {
        for (int32_t h = 0; h < shard.num_kv_heads; ++h) {
          for (int32_t j = h * head_dim; j < (h + 1) * head_dim; ++j) {
            for (int32_t i = 0; i < hidden; ++i)
              a[static_cast<size_t>(j) * hidden + i] *= key_scale[h];
            if (!a_bias.empty()) a_bias[j] *= key_scale[h];
          }
        }
      }
      if (!a.empty()) {
        RS_ASSIGN_OR_RETURN(m.kv_weight, PackF32(backend, a, 2 * kv_dim, hidden));
        if (!a_bias.empty()) {
          RS_ASSIGN_OR_RETURN(m.kv_bias, Upload(backend, a_bias));
        }
      }
    }
    // The fill path predicts the input of every layer after s + 1; a gap has no fallback.
    for (int32_t l = s + 2; l < config.num_layers; ++l) {
      if (!seen[l]) {
        return absl::InvalidArgumentError(absl::StrCat("ridgefill: split ", s,
                                                       " has no map for layer ", l,
                                                       " (every layer in [s + 2, L) needs one)"));
      }
    }
    result.push_back(std::move(out));
  }
  return result;
}

}  // namespace

absl::StatusOr<std::unique_ptr<RidgeFillMaps>> RidgeFillMaps::Load(
    const MapSet& maps, std::span<LlamaModel* const> ranks, float max_leverage) {
  const ModelConfig& config = ranks.front()->config();
  if (maps.model.num_layers != config.num_layers || maps.model.hidden != config.hidden ||
      maps.num_kv_heads != config.num_kv_heads || maps.head_dim != config.head_dim) {
    return absl::InvalidArgumentError(
        absl::StrCat("ridgefill: maps are for ", maps.model.num_layers, " layers, hidden ",
                     maps.model.hidden, ", ", maps.num_kv_heads, " KV heads of ", maps.head_dim,
                     "; the model has ", config.num_layers, ", ", config.hidden, ", ",
                     config.num_kv_heads, " of ", config.head_dim));
  }
  auto result = std::unique_ptr<RidgeFillMaps>(new RidgeFillMaps());
  static std::atomic<uint64_t> next_id{1};
  result->id_ = next_id++;
  result->max_leverage_ = max_leverage;
  for (LlamaModel* rank : ranks) {
    RS_ASSIGN_OR_RETURN(std::vector<RidgeFillSplitMaps> splits, LoadRank(maps, *rank));
    result->by_rank_.push_back(std::move(splits));
  }
  return result;
}

absl::Status RidgeFillMaps::CheckSplit(const LlamaModel& model, int32_t split_layer) const {
  if (FindSplit(split_layer, model.shard().rank) == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("forward: no RidgeFill maps for split layer ", split_layer));
  }
  return absl::OkStatus();
}

bool RidgeFillMaps::SelectsExactRows(int32_t split_layer) const {
  const RidgeFillSplitMaps* maps = FindSplit(split_layer);
  return max_leverage_ > 0 && maps != nullptr && !maps->leverage_mean.empty();
}

void RidgeFillMaps::SelectExactRows(LlamaModel& model, const FilledRows& rows,
                                    std::span<int32_t> exact) const {
  const RidgeFillSplitMaps& maps = *FindSplit(rows.split_layer, model.shard().rank);
  const int32_t hidden = model.config().hidden;
  Backend& backend = model.backend();
  // leverage = (h − μ) · M (h − μ): the rows centred in f32, one GEMM, the row dots on the
  // backend; only the rows' leverages come back. Centred before the GEMM, not M h − M μ after
  // it: a backend that rounds a GEMM's input (CUDA: bf16) would round h, whose channels with a
  // large mean (massive activations) dwarf their spread, and M, the inverse of the spread,
  // magnifies exactly those directions.
  const LlamaModel::FillScratch scratch = model.fill_scratch();
  backend.ShiftRows(rows.h, maps.leverage_shift.as<float>(), rows.count, hidden, scratch.input);
  backend.Linear(scratch.input, rows.count, maps.leverage_inverse, nullptr, scratch.hidden);
  // A double a row in the K/V scratch (2 kv_dim floats a row), which the fill has not used yet.
  double* leverages = reinterpret_cast<double*>(scratch.kv);
  backend.ShiftedRowDots(rows.h, maps.leverage_shift.as<float>(), scratch.hidden, rows.count,
                         hidden, leverages);
  std::vector<double> leverage(rows.count);
  backend.CopyToHost(leverage.data(), leverages, sizeof(double) * leverage.size());
  for (int32_t i = 0; i < rows.count; ++i) exact[i] = leverage[i] > max_leverage_;
}

void RidgeFillMaps::WriteKv(LlamaModel& model, int32_t layer, const FilledRows& rows,
                            const KvLayerView& kv) const {
  if (layer == rows.split_layer + 1) {
    model.StoreKvFromInput(layer, rows.h, rows, kv);  // layer s + 1 sees the exact h_s
    return;
  }
  const RidgeFillSplitMaps& split = *FindSplit(rows.split_layer, model.shard().rank);
  const RidgeFillLayerMap& map = split.by_layer[layer];
  const LlamaModel::FillScratch scratch = model.fill_scratch();
  Backend& backend = model.backend();
  const float* k_norm = map.k_norm_scaled.bytes() > 0 ? map.k_norm_scaled.as<float>() : nullptr;
  const float* kv_bias = map.kv_bias.bytes() > 0 ? map.kv_bias.as<float>() : nullptr;
  if (split.folded) {
    // post_norm / kv: K (before RoPE and QK-norm) and V straight from h_s.
    backend.Linear(rows.h, rows.count, map.kv_weight, kv_bias, scratch.kv);
    model.StoreKvFromProjection(layer, scratch.kv, rows, kv, k_norm);
    return;
  }
  // pre_norm: ĥ_l = W_l h_s + b_l, then the layer's K/V (or the map's, the key scale folded in).
  backend.Linear(rows.h, rows.count, map.weight, map.bias.as<float>(), scratch.hidden);
  model.StoreKvFromInput(layer, scratch.hidden, rows, kv,
                         map.kv_weight.empty() ? nullptr : &map.kv_weight, kv_bias, k_norm);
}

}  // namespace ridgeserve
