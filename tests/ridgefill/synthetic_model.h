// The small synthetic LlamaModel the RidgeFill map tests build on the CPU backend (5 layers,
// hidden 12, 2 query and 2 KV heads of 4, QKV bias), and f32 uploads to it.
#ifndef RIDGESERVE_TESTS_RIDGEFILL_SYNTHETIC_MODEL_H_
#define RIDGESERVE_TESTS_RIDGEFILL_SYNTHETIC_MODEL_H_

#include <cstdint>
#include <vector>

#include "engine/model/config.h"
#include "kernels/backend.h"

namespace ridgeserve::testing_synthetic {

constexpr int32_t kLayers = 5, kHidden = 12, kHeads = 2, kKvHeads = 2, kHeadDim = 4;
constexpr int32_t kKvDim = kKvHeads * kHeadDim, kQDim = kHeads * kHeadDim;

inline ModelConfig Config() {
  ModelConfig c;
  c.name = "synthetic";
  c.num_layers = kLayers;
  c.hidden = kHidden;
  c.num_heads = kHeads;
  c.num_kv_heads = kKvHeads;
  c.head_dim = kHeadDim;
  c.qkv_bias = true;
  return c;
}

inline DeviceBuffer Upload(Backend& backend, const std::vector<float>& v) {
  DeviceBuffer b = *backend.Alloc(sizeof(float) * v.size());
  backend.CopyToDevice(b.as<void>(), v.data(), sizeof(float) * v.size());
  return b;
}

// v as an f32 [rows, cols] weight packed by `backend`.
inline Weight Pack(Backend& backend, const std::vector<float>& v, int64_t rows, int64_t cols) {
  const HostTensor view{reinterpret_cast<const uint8_t*>(v.data()), DType::kF32, rows, cols,
                        sizeof(float) * static_cast<size_t>(cols)};
  return *backend.PackWeight({&view, 1});
}

}  // namespace ridgeserve::testing_synthetic

#endif  // RIDGESERVE_TESTS_RIDGEFILL_SYNTHETIC_MODEL_H_
