#include "engine/tokenizer/bpe_tokenizer.h"

#include <algorithm>
#include <deque>
#include <optional>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/tokenizer/byte_level.h"
#include "engine/tokenizer/chat_template.h"

namespace ridgeserve {
namespace {

// Texts of control tokens that end a turn or a document in the model families we serve
// (llama.cpp keeps the same list); generation stops on any of them, not only on eos.
constexpr std::string_view kEndOfGenerationTexts[] = {
    "<|endoftext|>", "<|im_end|>",    "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>",
    "<|end|>",       "<end_of_turn>", "<|return|>", "<EOT>",
};

class BpeTokenizer final : public Tokenizer {
 public:
  BpeTokenizer(TokenizerSpec spec, BpeModel bpe)
      : bpe_(std::move(bpe)),
        pre_tokenizer_(std::move(spec.pre_tokenizer)),
        added_(spec.added_tokens),
        bos_id_(spec.bos_id),
        eos_id_(spec.eos_id),
        add_bos_(spec.add_bos) {
    const size_t n = spec.tokens.size();
    token_bytes_.resize(n);
    special_.assign(n, false);
    // Decoding follows tokenizers' ByteLevel decoder: a token whose characters are all in
    // the byte mapping decodes to those bytes, any other token to its own UTF-8 text.
    for (size_t id = 0; id < n; ++id) {
      std::optional<std::string> bytes = ByteLevelToBytes(spec.tokens[id]);
      token_bytes_[id] = bytes.has_value() ? *std::move(bytes) : spec.tokens[id];
    }
    absl::flat_hash_set<int32_t> eog;
    for (const AddedToken& t : spec.added_tokens) {
      if (!t.special) continue;
      special_[t.id] = true;
      for (std::string_view text : kEndOfGenerationTexts) {
        if (t.content == text) eog.insert(t.id);
      }
    }
    if (eos_id_ >= 0) eog.insert(eos_id_);
    for (int32_t id : spec.extra_eog_ids) eog.insert(id);
    eog_ids_.assign(eog.begin(), eog.end());
    std::sort(eog_ids_.begin(), eog_ids_.end());

    auto has = [&](std::string_view text) {
      return std::any_of(spec.added_tokens.begin(), spec.added_tokens.end(),
                         [&](const AddedToken& t) { return t.content == text; });
    };
    chat_template_ =
        ChatTemplate::Detect(spec.chat_template, has("<|im_start|>"), has("<|start_header_id|>"),
                             bos_id_ >= 0 ? token_bytes_[bos_id_] : "");
  }

  std::vector<int32_t> Encode(std::string_view text, bool add_bos,
                              bool parse_special) const override {
    std::vector<int32_t> ids;
    ids.reserve(text.size() / 3 + 2);
    if (add_bos && add_bos_ && bos_id_ >= 0) ids.push_back(bos_id_);
    std::vector<AddedTokenMatcher::Segment> segments;
    added_.Split(text, parse_special, &segments);
    std::vector<std::string_view> pieces;
    std::deque<std::string> storage;
    for (const AddedTokenMatcher::Segment& segment : segments) {
      if (segment.id >= 0) {
        ids.push_back(segment.id);
        continue;
      }
      pieces.clear();
      pre_tokenizer_.Split(segment.text, &pieces, &storage);
      for (std::string_view piece : pieces) bpe_.Encode(piece, &ids);
    }
    return ids;
  }

  std::string Decode(std::span<const int32_t> ids, bool skip_special) const override {
    std::string out;
    for (int32_t id : ids) {
      if (id < 0 || id >= vocab_size()) continue;
      if (skip_special && special_[id]) continue;
      out += token_bytes_[id];
    }
    return out;
  }

  std::string TokenBytes(int32_t id) const override {
    if (id < 0 || id >= vocab_size()) return "";
    return token_bytes_[id];
  }

  int32_t vocab_size() const override { return static_cast<int32_t>(token_bytes_.size()); }
  int32_t bos_id() const override { return bos_id_; }
  int32_t eos_id() const override { return eos_id_; }
  const std::vector<int32_t>& end_of_generation_ids() const override { return eog_ids_; }
  bool IsSpecial(int32_t id) const override { return id >= 0 && id < vocab_size() && special_[id]; }

  ChatTemplateKind chat_template() const override { return chat_template_.kind(); }
  std::string ApplyChatTemplate(std::span<const ChatMessage> messages,
                                bool add_generation_prompt) const override {
    return chat_template_.Render(messages, add_generation_prompt);
  }

 private:
  BpeModel bpe_;
  PreTokenizer pre_tokenizer_;
  AddedTokenMatcher added_;
  std::vector<std::string> token_bytes_;  // [vocab_size] raw bytes of each token
  std::vector<bool> special_;             // [vocab_size]
  int32_t bos_id_;
  int32_t eos_id_;
  bool add_bos_;
  std::vector<int32_t> eog_ids_;  // sorted
  ChatTemplate chat_template_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> BuildBpeTokenizer(TokenizerSpec spec) {
  const int64_t n = static_cast<int64_t>(spec.tokens.size());
  if (n == 0) return absl::InvalidArgumentError("the vocabulary is empty");
  if (n > INT32_MAX) return absl::InvalidArgumentError("the vocabulary is too large");
  // `optional` ids may be -1 (none).
  auto check_id = [&](int64_t id, bool optional, const std::string& what) -> absl::Status {
    if ((optional && id == -1) || (id >= 0 && id < n)) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat(what, " id ", id, " is outside the vocabulary (size ", n, ")"));
  };
  absl::Status status = check_id(spec.bos_id, true, "bos");
  if (status.ok()) status = check_id(spec.eos_id, true, "eos");
  if (status.ok()) status = check_id(spec.bpe.unk_id, true, "unk");
  for (int32_t id : spec.extra_eog_ids) {
    if (status.ok()) status = check_id(id, false, "end-of-generation");
  }
  for (const AddedToken& t : spec.added_tokens) {
    if (status.ok())
      status = check_id(t.id, false, absl::StrCat("added token \"", t.content, "\""));
  }
  if (!status.ok()) return status;
  if (spec.add_bos && spec.bos_id < 0) {
    return absl::InvalidArgumentError("the model asks for a BOS token but names none");
  }
  absl::StatusOr<BpeModel> bpe = BpeModel::Create(spec.tokens, spec.merges, spec.bpe);
  if (!bpe.ok()) return bpe.status();
  return std::unique_ptr<Tokenizer>(new BpeTokenizer(std::move(spec), *std::move(bpe)));
}

}  // namespace ridgeserve
