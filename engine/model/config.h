// Model architecture hyperparameters, read from the weights' own metadata (GGUF keys or a
// Hugging Face config.json). Kept apart from server options and per-request options.
#ifndef RIDGESERVE_ENGINE_MODEL_CONFIG_H_
#define RIDGESERVE_ENGINE_MODEL_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ridgeserve {

class GgufFile;

enum class Architecture { kLlama, kMistral, kQwen2, kQwen3 };

struct ModelConfig {
  Architecture arch = Architecture::kLlama;
  std::string arch_name;  // "llama", "qwen2", ...
  std::string name;       // general.name or the directory name
  int32_t num_layers = 0;
  int32_t hidden = 0;
  int32_t ffn = 0;
  int32_t num_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t vocab_size = 0;
  int32_t context_length = 0;
  float rms_eps = 1e-5f;
  float rope_theta = 10000.0f;
  bool qkv_bias = false;         // Qwen2/2.5
  bool qk_norm = false;          // Qwen3
  bool tied_embeddings = false;  // LM head is the token embedding
  // Rotary inverse frequencies [head_dim / 2], Llama 3 scaling already applied:
  // inv_freq[j] = theta^(-2j/head_dim) / scaling_factor[j].
  std::vector<float> rope_inv_freq;

  int32_t q_dim() const { return num_heads * head_dim; }
  int32_t kv_dim() const { return num_kv_heads * head_dim; }
};

// `rope_freq_factors` is GGUF's rope_freqs.weight (empty when the file has none).
absl::StatusOr<ModelConfig> ConfigFromGguf(const GgufFile& gguf,
                                           const std::vector<float>& rope_freq_factors);
// `path` is a config.json.
absl::StatusOr<ModelConfig> ConfigFromHfJson(const std::string& path);
// The architecture of a GGUF file, a Hugging Face directory or its config.json, without reading
// weights (and without GGUF's rope frequency factors: enough to plan memory, not to run).
absl::StatusOr<ModelConfig> ReadModelConfig(const std::string& path);

}  // namespace ridgeserve

#endif  // RIDGESERVE_ENGINE_MODEL_CONFIG_H_
