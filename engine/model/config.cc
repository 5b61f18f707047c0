#include "engine/model/config.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/common/status_macros.h"
#include "engine/model/gguf.h"
#include "nlohmann/json.hpp"

namespace ridgeserve {
namespace {

absl::StatusOr<Architecture> ParseArchitecture(const std::string& name, const std::string& where) {
  if (name == "llama") return Architecture::kLlama;
  if (name == "mistral") return Architecture::kMistral;
  if (name == "qwen2") return Architecture::kQwen2;
  if (name == "qwen3") return Architecture::kQwen3;
  return absl::UnimplementedError(absl::StrCat(where, ": unsupported architecture \"", name,
                                               "\" (supported: llama, mistral, qwen2, qwen3)"));
}

// Bounds that keep a corrupted file from asking for absurd allocations.
absl::Status Validate(const ModelConfig& c, const std::string& where) {
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": hparams: ", what));
  };
  auto in_range = [](int64_t v, int64_t lo, int64_t hi) { return v >= lo && v <= hi; };
  if (!in_range(c.num_layers, 1, 1024)) return bad(absl::StrCat("num_layers ", c.num_layers));
  if (!in_range(c.hidden, 1, 1 << 17)) return bad(absl::StrCat("hidden size ", c.hidden));
  if (!in_range(c.ffn, 1, 1 << 19)) return bad(absl::StrCat("ffn size ", c.ffn));
  if (!in_range(c.num_heads, 1, 4096)) return bad(absl::StrCat("head count ", c.num_heads));
  if (!in_range(c.num_kv_heads, 1, c.num_heads) || c.num_heads % c.num_kv_heads != 0) {
    return bad(absl::StrCat("kv head count ", c.num_kv_heads, " does not divide head count ",
                            c.num_heads));
  }
  if (!in_range(c.head_dim, 2, 1024) || c.head_dim % 2 != 0) {
    return bad(absl::StrCat("head_dim ", c.head_dim));
  }
  if (!in_range(c.vocab_size, 1, 1 << 22)) return bad(absl::StrCat("vocab size ", c.vocab_size));
  if (!in_range(c.context_length, 1, 1 << 24)) {
    return bad(absl::StrCat("context length ", c.context_length));
  }
  if (!(c.rms_eps > 0 && c.rms_eps < 1)) return bad(absl::StrCat("rms eps ", c.rms_eps));
  if (!(c.rope_theta > 1 && std::isfinite(c.rope_theta))) {
    return bad(absl::StrCat("rope theta ", c.rope_theta));
  }
  return absl::OkStatus();
}

std::vector<float> BaseInvFreq(float theta, int32_t head_dim) {
  std::vector<float> inv_freq(head_dim / 2);
  for (int32_t j = 0; j < head_dim / 2; ++j) {
    inv_freq[j] = static_cast<float>(std::pow(static_cast<double>(theta), -2.0 * j / head_dim));
  }
  return inv_freq;
}

// Llama 3.x "llama3" rope_scaling: long wavelengths are slowed by `factor`, short ones kept,
// the band between interpolated smoothly.
void ApplyLlama3Scaling(const nlohmann::json& s, std::vector<float>& inv_freq) {
  const double factor = s.value("factor", 8.0);
  const double low = s.value("low_freq_factor", 1.0);
  const double high = s.value("high_freq_factor", 4.0);
  const double old_ctx = s.value("original_max_position_embeddings", 8192.0);
  const double low_wavelen = old_ctx / low;
  const double high_wavelen = old_ctx / high;
  for (float& f : inv_freq) {
    const double wavelen = 2 * M_PI / f;
    if (wavelen < high_wavelen) continue;
    if (wavelen > low_wavelen) {
      f = static_cast<float>(f / factor);
    } else {
      const double smooth = (old_ctx / wavelen - low) / (high - low);
      f = static_cast<float>((1 - smooth) * f / factor + smooth * f);
    }
  }
}

}  // namespace

absl::StatusOr<ModelConfig> ConfigFromGguf(const GgufFile& gguf,
                                           const std::vector<float>& rope_freq_factors) {
  const std::string& where = gguf.path();
  ModelConfig c;
  auto arch = gguf.GetString("general.architecture");
  if (!arch.ok()) return arch.status();
  c.arch_name = *arch;
  auto parsed = ParseArchitecture(c.arch_name, where);
  if (!parsed.ok()) return parsed.status();
  c.arch = *parsed;
  c.name = gguf.GetString("general.name").value_or(c.arch_name);
  const std::string p = c.arch_name + ".";

  auto get_int = [&](const std::string& key, int32_t& out) -> absl::Status {
    auto v = gguf.GetInt(p + key);
    if (!v.ok()) return v.status();
    if (*v < 0 || *v > (int64_t{1} << 30)) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": hparams: ", p, key, " = ", *v));
    }
    out = static_cast<int32_t>(*v);
    return absl::OkStatus();
  };
  for (auto [key, field] : {std::pair<const char*, int32_t*>{"block_count", &c.num_layers},
                            {"context_length", &c.context_length},
                            {"embedding_length", &c.hidden},
                            {"feed_forward_length", &c.ffn},
                            {"attention.head_count", &c.num_heads}}) {
    if (absl::Status s = get_int(key, *field); !s.ok()) return s;
  }
  c.num_kv_heads = c.num_heads;
  if (gguf.Has(p + "attention.head_count_kv")) {
    if (absl::Status s = get_int("attention.head_count_kv", c.num_kv_heads); !s.ok()) return s;
  }
  c.head_dim = c.num_heads > 0 ? c.hidden / c.num_heads : 0;
  if (gguf.Has(p + "attention.key_length")) {
    if (absl::Status s = get_int("attention.key_length", c.head_dim); !s.ok()) return s;
  }
  auto eps = gguf.GetFloat(p + "attention.layer_norm_rms_epsilon");
  if (!eps.ok()) return eps.status();
  c.rms_eps = static_cast<float>(*eps);
  c.rope_theta = static_cast<float>(gguf.GetFloat(p + "rope.freq_base").value_or(10000.0));
  if (gguf.Has(p + "rope.dimension_count")) {
    int32_t rope_dims = 0;
    if (absl::Status s = get_int("rope.dimension_count", rope_dims); !s.ok()) return s;
    if (rope_dims != c.head_dim) {
      return absl::UnimplementedError(absl::StrCat(where, ": hparams: partial rotary (", rope_dims,
                                                   " of ", c.head_dim, " dims)"));
    }
  }
  c.qkv_bias = gguf.FindTensor("blk.0.attn_q.bias") != nullptr;
  c.qk_norm = gguf.FindTensor("blk.0.attn_q_norm.weight") != nullptr;
  c.tied_embeddings = gguf.FindTensor("output.weight") == nullptr;
  const TensorInfo* embd = gguf.FindTensor("token_embd.weight");
  if (embd == nullptr || embd->shape.size() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": tensors: token_embd.weight missing or not 2-D"));
  }
  c.vocab_size = static_cast<int32_t>(embd->shape[0]);
  if (absl::Status s = Validate(c, where); !s.ok()) return s;

  c.rope_inv_freq = BaseInvFreq(c.rope_theta, c.head_dim);
  if (!rope_freq_factors.empty()) {
    if (rope_freq_factors.size() != c.rope_inv_freq.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": tensors: rope_freqs.weight has ", rope_freq_factors.size(),
                       " entries, expected ", c.rope_inv_freq.size()));
    }
    for (size_t j = 0; j < c.rope_inv_freq.size(); ++j) {
      c.rope_inv_freq[j] /= rope_freq_factors[j];
    }
  }
  return c;
}

absl::StatusOr<ModelConfig> ConfigFromHfJson(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::stringstream buffer;
  buffer << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(buffer.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
  }
  ModelConfig c;
  c.arch_name = j.value("model_type", "");
  auto parsed = ParseArchitecture(c.arch_name, path);
  if (!parsed.ok()) return parsed.status();
  c.arch = *parsed;
  try {
    c.name = j.value("_name_or_path", c.arch_name);
    c.num_layers = j.at("num_hidden_layers").get<int32_t>();
    c.hidden = j.at("hidden_size").get<int32_t>();
    c.ffn = j.at("intermediate_size").get<int32_t>();
    c.num_heads = j.at("num_attention_heads").get<int32_t>();
    c.num_kv_heads = j.value("num_key_value_heads", c.num_heads);
    c.head_dim = c.num_heads > 0 ? c.hidden / c.num_heads : 0;
    if (j.contains("head_dim") && j["head_dim"].is_number_integer()) {
      c.head_dim = j["head_dim"].get<int32_t>();
    }
    c.vocab_size = j.at("vocab_size").get<int32_t>();
    c.context_length = j.value("max_position_embeddings", 4096);
    c.rms_eps = j.value("rms_norm_eps", 1e-6f);
    c.rope_theta = j.value("rope_theta", 10000.0f);
    c.tied_embeddings = j.value("tie_word_embeddings", false);
    c.qkv_bias = c.arch == Architecture::kQwen2 || j.value("attention_bias", false);
    c.qk_norm = c.arch == Architecture::kQwen3;
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": hparams: ", e.what()));
  }
  if (absl::Status s = Validate(c, path); !s.ok()) return s;
  c.rope_inv_freq = BaseInvFreq(c.rope_theta, c.head_dim);
  if (j.contains("rope_scaling") && j["rope_scaling"].is_object()) {
    const nlohmann::json& s = j["rope_scaling"];
    try {
      const std::string type = s.value("rope_type", s.value("type", ""));
      if (type == "llama3") {
        ApplyLlama3Scaling(s, c.rope_inv_freq);
      } else if (!type.empty() && type != "default") {
        return absl::UnimplementedError(
            absl::StrCat(path, ": hparams: rope_scaling type \"", type, "\" is not supported"));
      }
    } catch (const nlohmann::json::exception& e) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": hparams: rope_scaling: ", e.what()));
    }
  }
  return c;
}

absl::StatusOr<ModelConfig> ReadModelConfig(const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError("no model path given");
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return ConfigFromHfJson(path + "/config.json");
  if (absl::EndsWith(path, ".json")) return ConfigFromHfJson(path);
  RS_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> gguf, GgufFile::Open(path));
  return ConfigFromGguf(*gguf, {});
}

}  // namespace ridgeserve
