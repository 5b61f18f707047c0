// Tokenizer::FromHfDir: a Hugging Face tokenizer.json (byte-level BPE models only), with
// tokenizer_config.json (bos/eos, add_bos_token, chat_template), chat_template.jinja and
// generation_config.json (eos_token_id list) when present.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/tokenizer/bpe_tokenizer.h"
#include "engine/tokenizer/byte_level.h"
#include "engine/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"

namespace ridgeserve {
namespace {

// Token ids are indices into the token table, which is as long as the largest id + 1: a file
// with one absurd id would allocate gigabytes (fuzzing found an id of 988,888,887: 31.6 GB).
// The largest vocabularies in use have about 262,000 tokens; ids below 2^21 leave 8 times
// that and bound the table at 2.1 million entries (67 MB).
constexpr int64_t kMaxTokenId = (int64_t{1} << 21) - 1;

using Json = nlohmann::json;

absl::StatusOr<std::string> ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path.string(), ": cannot open"));
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat(path.string(), ": read failed"));
  return buffer.str();
}

// Parses a JSON file; nullopt when the file does not exist.
absl::StatusOr<std::optional<Json>> ReadJson(const std::filesystem::path& path, bool required) {
  if (!required && !std::filesystem::exists(path)) return std::optional<Json>();
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return text.status();
  Json json;
  try {
    json = Json::parse(*text);
  } catch (const Json::exception& e) {
    // The message carries the byte position and what was expected.
    return absl::InvalidArgumentError(absl::StrCat(path.string(), ": ", e.what()));
  }
  return std::optional<Json>(std::move(json));
}

// A string field, or `fallback` when it is absent or null.
std::string StringOr(const Json& object, const char* key, std::string fallback) {
  auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : fallback;
}

bool BoolOr(const Json& object, const char* key, bool fallback) {
  auto it = object.find(key);
  return it != object.end() && it->is_boolean() ? it->get<bool>() : fallback;
}

absl::Status ParseVocab(const Json& model, TokenizerSpec* spec) {
  auto vocab = model.find("vocab");
  if (vocab == model.end() || !vocab->is_object()) {
    return absl::InvalidArgumentError("model.vocab is missing or not an object");
  }
  for (const auto& [token, id] : vocab->items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > kMaxTokenId) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model.vocab[\"", token, "\"] is not a valid id (0 to ", kMaxTokenId, "): ", id.dump()));
    }
    const size_t index = id.get<size_t>();
    if (index >= spec->tokens.size()) spec->tokens.resize(index + 1);
    if (!spec->tokens[index].empty()) {
      return absl::InvalidArgumentError(absl::StrCat("model.vocab: id ", index, " is used by \"",
                                                     spec->tokens[index], "\" and \"", token,
                                                     "\""));
    }
    spec->tokens[index] = token;
  }
  return absl::OkStatus();
}

absl::Status ParseMerges(const Json& model, TokenizerSpec* spec) {
  auto merges = model.find("merges");
  if (merges == model.end() || !merges->is_array()) {
    return absl::InvalidArgumentError("model.merges is missing or not an array");
  }
  spec->merges.reserve(merges->size());
  for (size_t rank = 0; rank < merges->size(); ++rank) {
    const Json& merge = (*merges)[rank];
    // Two spellings: "left right" (older files) or ["left", "right"].
    if (merge.is_string()) {
      const std::string& text = merge.get_ref<const std::string&>();
      const size_t space = text.find(' ');
      if (space != std::string::npos && text.find(' ', space + 1) == std::string::npos) {
        spec->merges.emplace_back(text.substr(0, space), text.substr(space + 1));
        continue;
      }
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() &&
               merge[1].is_string()) {
      spec->merges.emplace_back(merge[0].get<std::string>(), merge[1].get<std::string>());
      continue;
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "model.merges[", rank, "] is not \"left right\" or [left, right]: ", merge.dump()));
  }
  return absl::OkStatus();
}

absl::Status ParseModel(const Json& root, TokenizerSpec* spec) {
  auto model = root.find("model");
  if (model == root.end() || !model->is_object()) {
    return absl::InvalidArgumentError("\"model\" is missing or not an object");
  }
  const std::string type = StringOr(*model, "type", "BPE");
  if (type != "BPE") {
    return absl::UnimplementedError(
        absl::StrCat("model.type \"", type, "\" is not supported (only byte-level BPE)"));
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (!StringOr(*model, key, "").empty()) {
      return absl::UnimplementedError(absl::StrCat("model.", key, " is not supported"));
    }
  }
  if (absl::Status s = ParseVocab(*model, spec); !s.ok()) return s;
  if (absl::Status s = ParseMerges(*model, spec); !s.ok()) return s;
  // dropout is a training-time option; inference always merges.
  spec->bpe.ignore_merges = BoolOr(*model, "ignore_merges", false);
  spec->bpe.fuse_unk = BoolOr(*model, "fuse_unk", false);
  const std::string unk = StringOr(*model, "unk_token", "");
  if (!unk.empty()) {
    auto it = std::find(spec->tokens.begin(), spec->tokens.end(), unk);
    if (it == spec->tokens.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("model.unk_token \"", unk, "\" is not in model.vocab"));
    }
    spec->bpe.unk_id = static_cast<int32_t>(it - spec->tokens.begin());
  }
  return absl::OkStatus();
}

absl::Status ParseNormalizer(const Json& root) {
  auto normalizer = root.find("normalizer");
  if (normalizer == root.end() || normalizer->is_null()) return absl::OkStatus();
  const std::string type = StringOr(*normalizer, "type", "");
  if (type == "Sequence" && normalizer->contains("normalizers")) {
    for (const Json& inner : (*normalizer)["normalizers"]) {
      Json wrapper = {{"normalizer", inner}};
      if (absl::Status s = ParseNormalizer(wrapper); !s.ok()) return s;
    }
    return absl::OkStatus();
  }
  // NFC (Qwen2) is accepted but not applied: byte-level BPE handles any text, and text from
  // clients is almost always NFC already; decomposed input may tokenize differently.
  if (type == "NFC") return absl::OkStatus();
  return absl::UnimplementedError(
      absl::StrCat("normalizer \"", type, "\" is not supported (none or NFC)"));
}

// Adds the steps of one pre-tokenizer node; `byte_level` is set when a ByteLevel step is seen.
absl::Status AddPreTokenizer(const Json& node, PreTokenizer* pre, bool* byte_level) {
  const std::string type = StringOr(node, "type", "");
  if (type == "Sequence") {
    auto steps = node.find("pretokenizers");
    if (steps == node.end() || !steps->is_array()) {
      return absl::InvalidArgumentError("pre_tokenizer Sequence without \"pretokenizers\"");
    }
    for (const Json& step : *steps) {
      if (absl::Status s = AddPreTokenizer(step, pre, byte_level); !s.ok()) return s;
    }
    return absl::OkStatus();
  }
  if (type == "ByteLevel") {
    *byte_level = true;
    return pre->AddByteLevel(BoolOr(node, "add_prefix_space", true),
                             BoolOr(node, "use_regex", true));
  }
  if (type == "Digits") return pre->AddDigits(BoolOr(node, "individual_digits", false));
  if (type == "Split") {
    auto pattern = node.find("pattern");
    bool is_regex = false;
    std::string text;
    if (pattern != node.end() && pattern->is_object()) {
      if (pattern->contains("Regex") && (*pattern)["Regex"].is_string()) {
        is_regex = true;
        text = (*pattern)["Regex"].get<std::string>();
      } else if (pattern->contains("String") && (*pattern)["String"].is_string()) {
        text = (*pattern)["String"].get<std::string>();
      } else {
        pattern = node.end();
      }
    }
    if (pattern == node.end()) {
      return absl::InvalidArgumentError("pre_tokenizer Split needs pattern {Regex|String}");
    }
    absl::StatusOr<SplitBehavior> behavior =
        ParseSplitBehavior(StringOr(node, "behavior", "Isolated"));
    if (!behavior.ok()) return behavior.status();
    return pre->AddSplit(text, is_regex, *behavior, BoolOr(node, "invert", false));
  }
  return absl::UnimplementedError(absl::StrCat(
      "pre_tokenizer \"", type, "\" is not supported (Sequence, Split, Digits, ByteLevel)"));
}

absl::Status ParsePreTokenizer(const Json& root, TokenizerSpec* spec) {
  auto node = root.find("pre_tokenizer");
  bool byte_level = false;
  if (node != root.end() && !node->is_null()) {
    if (absl::Status s = AddPreTokenizer(*node, &spec->pre_tokenizer, &byte_level); !s.ok()) {
      return s;
    }
  }
  if (!byte_level) {
    return absl::UnimplementedError(
        "pre_tokenizer has no ByteLevel step: only byte-level BPE tokenizers are supported");
  }
  auto decoder = root.find("decoder");
  if (decoder != root.end() && !decoder->is_null() &&
      StringOr(*decoder, "type", "") != "ByteLevel") {
    return absl::UnimplementedError(absl::StrCat("decoder \"", StringOr(*decoder, "type", ""),
                                                 "\" is not supported (ByteLevel)"));
  }
  return absl::OkStatus();
}

absl::Status ParseAddedTokens(const Json& root, TokenizerSpec* spec) {
  auto added = root.find("added_tokens");
  if (added == root.end() || added->is_null()) return absl::OkStatus();
  if (!added->is_array()) return absl::InvalidArgumentError("added_tokens is not an array");
  for (size_t i = 0; i < added->size(); ++i) {
    const Json& entry = (*added)[i];
    if (!entry.is_object() || !entry.contains("id") || !entry["id"].is_number_integer() ||
        !entry.contains("content") || !entry["content"].is_string() ||
        entry["id"].get<int64_t>() < 0 || entry["id"].get<int64_t>() > kMaxTokenId) {
      return absl::InvalidArgumentError(absl::StrCat("added_tokens[", i,
                                                     "] needs an integer id from 0 to ",
                                                     kMaxTokenId, " and a string content"));
    }
    AddedToken token;
    token.id = entry["id"].get<int32_t>();
    token.content = entry["content"].get<std::string>();
    token.special = BoolOr(entry, "special", false);
    token.lstrip = BoolOr(entry, "lstrip", false);
    token.rstrip = BoolOr(entry, "rstrip", false);
    // Added tokens beyond model.vocab extend the id space.
    if (static_cast<size_t>(token.id) >= spec->tokens.size()) spec->tokens.resize(token.id + 1);
    if (spec->tokens[token.id].empty()) spec->tokens[token.id] = token.content;
    spec->added_tokens.push_back(std::move(token));
  }
  return absl::OkStatus();
}

// Id of a token named by its text: an added token's content, or a vocabulary entry.
int32_t FindTokenId(const TokenizerSpec& spec, const std::string& text) {
  for (const AddedToken& t : spec.added_tokens) {
    if (t.content == text) return t.id;
  }
  std::string byte_level;
  AppendByteLevel(text, &byte_level);
  for (size_t id = 0; id < spec.tokens.size(); ++id) {
    if (spec.tokens[id] == byte_level || spec.tokens[id] == text) return static_cast<int32_t>(id);
  }
  return -1;
}

// The first special token of the post-processor's single-sequence template (Llama 3's
// "<|begin_of_text|>"): tokenizers adds it when encoding with special tokens.
std::string TemplateBos(const Json& processor) {
  if (!processor.is_object()) return "";
  const std::string type = StringOr(processor, "type", "");
  if (type == "Sequence" && processor.contains("processors")) {
    for (const Json& inner : processor["processors"]) {
      if (std::string bos = TemplateBos(inner); !bos.empty()) return bos;
    }
    return "";
  }
  if (type != "TemplateProcessing" || !processor.contains("single")) return "";
  const Json& single = processor["single"];
  if (!single.is_array() || single.empty() || !single[0].is_object()) return "";
  auto special = single[0].find("SpecialToken");
  if (special == single[0].end() || !special->is_object()) return "";
  return StringOr(*special, "id", "");
}

// A token named in tokenizer_config.json: a string, or an AddedToken object {content: ...}.
std::string ConfigToken(const Json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) return StringOr(*it, "content", "");
  return "";
}

absl::Status ParseConfigs(const std::filesystem::path& dir, const Json& root, TokenizerSpec* spec) {
  absl::StatusOr<std::optional<Json>> config = ReadJson(dir / "tokenizer_config.json", false);
  if (!config.ok()) return config.status();
  absl::StatusOr<std::optional<Json>> generation = ReadJson(dir / "generation_config.json", false);
  if (!generation.ok()) return generation.status();
  const Json empty = Json::object();
  const Json& cfg = config->has_value() && (*config)->is_object() ? **config : empty;
  const Json& gen = generation->has_value() && (*generation)->is_object() ? **generation : empty;

  auto resolve = [&](const std::string& text, const char* what, int32_t* id) -> absl::Status {
    if (text.empty()) return absl::OkStatus();
    *id = FindTokenId(*spec, text);
    if (*id < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " \"", text, "\" is not a token of tokenizer.json"));
    }
    return absl::OkStatus();
  };
  const std::string template_bos =
      root.contains("post_processor") ? TemplateBos(root["post_processor"]) : "";
  if (absl::Status s = resolve(template_bos, "post_processor BOS", &spec->bos_id); !s.ok()) {
    return s;
  }
  spec->add_bos = BoolOr(cfg, "add_bos_token", !template_bos.empty());
  if (absl::Status s = resolve(ConfigToken(cfg, "bos_token"), "bos_token", &spec->bos_id);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = resolve(ConfigToken(cfg, "eos_token"), "eos_token", &spec->eos_id);
      !s.ok()) {
    return s;
  }
  // generation_config.json: eos_token_id is one id or a list (Llama 3.x: end_of_text, eom,
  // eot); all of them end generation.
  if (auto it = gen.find("eos_token_id"); it != gen.end()) {
    const Json list = it->is_array() ? *it : Json::array({*it});
    for (const Json& id : list) {
      if (!id.is_number_integer()) continue;
      spec->extra_eog_ids.push_back(id.get<int32_t>());
      if (spec->eos_id < 0) spec->eos_id = id.get<int32_t>();
    }
  }
  if (spec->bos_id < 0) {
    if (auto it = gen.find("bos_token_id"); it != gen.end() && it->is_number_integer()) {
      spec->bos_id = it->get<int32_t>();
    }
  }

  // chat_template: a string, or a list of {name, template} (take "default"), or a separate
  // chat_template.jinja file (newer repositories).
  if (auto it = cfg.find("chat_template"); it != cfg.end()) {
    if (it->is_string()) {
      spec->chat_template = it->get<std::string>();
    } else if (it->is_array()) {
      for (const Json& entry : *it) {
        if (entry.is_object() && StringOr(entry, "name", "") == "default") {
          spec->chat_template = StringOr(entry, "template", "");
        }
      }
    }
  }
  if (spec->chat_template.empty() && std::filesystem::exists(dir / "chat_template.jinja")) {
    absl::StatusOr<std::string> text = ReadFile(dir / "chat_template.jinja");
    if (!text.ok()) return text.status();
    spec->chat_template = *std::move(text);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Load(const std::filesystem::path& dir) {
  const std::filesystem::path path = dir / "tokenizer.json";
  absl::StatusOr<std::optional<Json>> root = ReadJson(path, true);
  if (!root.ok()) return root.status();
  const Json& json = **root;
  auto annotate = [&](const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat(path.string(), ": ", s.message()));
  };
  if (!json.is_object()) return annotate(absl::InvalidArgumentError("not a JSON object"));
  TokenizerSpec spec;
  absl::Status status = ParseModel(json, &spec);
  if (status.ok()) status = ParseNormalizer(json);
  if (status.ok()) status = ParsePreTokenizer(json, &spec);
  if (status.ok()) status = ParseAddedTokens(json, &spec);
  if (!status.ok()) return annotate(status);
  if (status = ParseConfigs(dir, json, &spec); !status.ok()) return status;
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = BuildBpeTokenizer(std::move(spec));
  if (!tokenizer.ok()) return annotate(tokenizer.status());
  return tokenizer;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromHfDir(const std::string& dir) {
  // nlohmann::json throws on type mismatches the checks above missed; keep that inside.
  try {
    return Load(dir);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(dir, "/tokenizer.json: ", e.what()));
  }
}

}  // namespace ridgeserve
