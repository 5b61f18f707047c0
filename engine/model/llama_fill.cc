// RidgeFill's fill path: K/V of filled rows in the layers above their split (the map kinds
// are described in engine/ridgefill/ridgefill_maps.h).
#include "engine/model/llama.h"
#include "engine/ridgefill/ridgefill_maps.h"

namespace ridgeserve {

void LlamaModel::WriteFilledKv(int32_t l, const FillGroup& g, const KvLayerView& kv) {
  const ModelConfig& c = config_;
  const LayerWeights& w = weights_.layers[l];
  const int32_t q_dim = q_dim_, kv_dim = kv_dim_;
  float* xn = xn_.as<float>();
  float* qkv = qkv_.as<float>();
  float* proj = proj_.as<float>();
  const float* h_s = x_.as<float>() + static_cast<size_t>(g.begin) * c.hidden;
  const RidgeFillLayerMap* map = l >= g.split + 2 ? &g.maps->by_layer[l] : nullptr;
  const float* model_kv_bias = w.bqkv.bytes() > 0 ? w.bqkv.as<float>() + q_dim : nullptr;
  if (map != nullptr && g.maps->folded) {
    // post_norm / kv: K (before RoPE and QK-norm) and V straight from h_s.
    backend_.Linear(h_s, g.count, map->kv_weight, map->kv_bias.as<float>(), qkv);
  } else {
    const float* in = h_s;  // layer s + 1 sees the exact h_s
    if (map != nullptr) {
      backend_.Linear(h_s, g.count, map->weight, map->bias.as<float>(), proj);
      in = proj;
    }
    backend_.RmsNorm(in, w.attn_norm.as<float>(), g.count, c.hidden, c.rms_eps, xn);
    // Only the K/V rows [q_dim, q_dim + 2 kv_dim) of the fused QKV projection are computed,
    // unless the map carries its own (the key scale folded in).
    if (map != nullptr && !map->kv_weight.empty()) {
      backend_.Linear(xn, g.count, map->kv_weight, map->kv_bias.as<float>(), qkv);
    } else {
      backend_.LinearRows(xn, g.count, w.wqkv, q_dim, 2 * kv_dim, model_kv_bias, qkv);
    }
  }
  float* k = qkv;
  float* v = qkv + kv_dim;
  if (c.qk_norm) {
    if (map != nullptr && map->k_norm_scaled.bytes() > 0) {
      // k_norm times the key scale, one head at a time.
      for (int32_t h = 0; h < kv_heads_; ++h) {
        backend_.RmsNormHeads(k + h * c.head_dim, 2 * kv_dim, g.count, 1, c.head_dim,
                              map->k_norm_scaled.as<float>() + h * c.head_dim, c.rms_eps);
      }
    } else {
      backend_.RmsNormHeads(k, 2 * kv_dim, g.count, kv_heads_, c.head_dim, w.k_norm.as<float>(),
                            c.rms_eps);
    }
  }
  backend_.Rope(k, 2 * kv_dim, g.count, kv_heads_, c.head_dim, meta_.rope_positions + g.begin,
                weights_.rope_inv_freq.as<float>());
  backend_.StoreKv(kv, k, v, 2 * kv_dim, g.count, meta_.slots + g.begin);
}

}  // namespace ridgeserve
