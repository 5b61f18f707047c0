// Tokenizer::FromGguf: the vocabulary as llama.cpp's converter stores it (tokenizer.ggml.*).
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/model/gguf.h"
#include "engine/tokenizer/bpe_tokenizer.h"
#include "engine/tokenizer/tokenizer.h"

namespace ridgeserve {
namespace {

// tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
constexpr int64_t kTokenTypeControl = 3;
constexpr int64_t kTokenTypeUserDefined = 4;

absl::Status Annotate(const GgufFile& gguf, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat(gguf.path(), ": tokenizer: ", status.message()));
}

// An optional integer key: -1 when absent.
absl::StatusOr<int64_t> OptionalId(const GgufFile& gguf, std::string_view key) {
  if (!gguf.Has(key)) return -1;
  return gguf.GetInt(key);
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Load(const GgufFile& gguf) {
  absl::StatusOr<std::string> model = gguf.GetString("tokenizer.ggml.model");
  if (!model.ok()) return model.status();
  if (*model != "gpt2") {
    return absl::UnimplementedError(absl::StrCat("tokenizer.ggml.model \"", *model,
                                                 "\" is not supported (only byte-level BPE, "
                                                 "\"gpt2\")"));
  }
  TokenizerSpec spec;
  absl::StatusOr<std::vector<std::string>> tokens = gguf.GetStringArray("tokenizer.ggml.tokens");
  if (!tokens.ok()) return tokens.status();
  spec.tokens = *std::move(tokens);

  std::vector<int64_t> types;
  if (gguf.Has("tokenizer.ggml.token_type")) {
    absl::StatusOr<std::vector<int64_t>> t = gguf.GetIntArray("tokenizer.ggml.token_type");
    if (!t.ok()) return t.status();
    types = *std::move(t);
    if (types.size() != spec.tokens.size()) {
      return absl::InvalidArgumentError(absl::StrCat("tokenizer.ggml.token_type has ", types.size(),
                                                     " entries for ", spec.tokens.size(),
                                                     " tokens"));
    }
  }
  for (size_t id = 0; id < types.size(); ++id) {
    if (types[id] != kTokenTypeControl && types[id] != kTokenTypeUserDefined) continue;
    AddedToken t;
    t.id = static_cast<int32_t>(id);
    t.content = spec.tokens[id];
    t.special = types[id] == kTokenTypeControl;
    spec.added_tokens.push_back(std::move(t));
  }

  absl::StatusOr<std::vector<std::string>> merges = gguf.GetStringArray("tokenizer.ggml.merges");
  if (!merges.ok()) return merges.status();
  spec.merges.reserve(merges->size());
  for (size_t rank = 0; rank < merges->size(); ++rank) {
    const std::string& merge = (*merges)[rank];
    // Byte-level tokens hold no raw spaces; search from 1 as llama.cpp does.
    const size_t space = merge.find(' ', 1);
    if (space == std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer.ggml.merges[", rank, "] \"", merge, "\" is not \"left right\""));
    }
    spec.merges.emplace_back(merge.substr(0, space), merge.substr(space + 1));
  }

  std::string pre = "default";
  if (gguf.Has("tokenizer.ggml.pre")) {
    absl::StatusOr<std::string> p = gguf.GetString("tokenizer.ggml.pre");
    if (!p.ok()) return p.status();
    pre = *std::move(p);
  }
  absl::StatusOr<PreTokenizer> pre_tokenizer = PreTokenizer::ForGgufPre(pre);
  if (!pre_tokenizer.ok()) return pre_tokenizer.status();
  spec.pre_tokenizer = *std::move(pre_tokenizer);
  // Llama 3's merges do not reach every token; llama.cpp and tokenizers both look the whole
  // piece up first.
  spec.bpe.ignore_merges = pre == "llama-bpe" || pre == "llama3";

  // Special ids; -1 when the key is absent.
  int64_t ids[4];
  constexpr const char* kIdKeys[4] = {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                                      "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"};
  for (int i = 0; i < 4; ++i) {
    absl::StatusOr<int64_t> id = OptionalId(gguf, kIdKeys[i]);
    if (!id.ok()) return id.status();
    if (*id == 0xFFFFFFFF) *id = -1;  // some converters write u32 -1 for "none"
    if (*id < -1 || *id >= static_cast<int64_t>(spec.tokens.size())) {
      return absl::InvalidArgumentError(absl::StrCat(
          kIdKeys[i], " = ", *id, " is outside the vocabulary (size ", spec.tokens.size(), ")"));
    }
    ids[i] = *id;
  }
  spec.bos_id = static_cast<int32_t>(ids[0]);
  spec.eos_id = static_cast<int32_t>(ids[1]);
  for (int i = 2; i < 4; ++i) {
    if (ids[i] >= 0) spec.extra_eog_ids.push_back(static_cast<int32_t>(ids[i]));
  }
  if (gguf.Has("tokenizer.ggml.add_bos_token")) {
    absl::StatusOr<bool> add_bos = gguf.GetBool("tokenizer.ggml.add_bos_token");
    if (!add_bos.ok()) return add_bos.status();
    spec.add_bos = *add_bos;
  } else {
    spec.add_bos = pre == "llama-bpe" || pre == "llama3";  // llama.cpp's default
  }
  if (gguf.Has("tokenizer.chat_template")) {
    absl::StatusOr<std::string> chat_template = gguf.GetString("tokenizer.chat_template");
    if (!chat_template.ok()) return chat_template.status();
    spec.chat_template = *std::move(chat_template);
  }
  return BuildBpeTokenizer(std::move(spec));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromGguf(const GgufFile& gguf) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Load(gguf);
  if (!tokenizer.ok()) return Annotate(gguf, tokenizer.status());
  return tokenizer;
}

}  // namespace ridgeserve
