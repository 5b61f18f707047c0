// Byte-level BPE tokenizer (GPT-2 style, as used by Llama 3, SmolLM2, Qwen2/2.5/3), built
// from GGUF metadata (tokenizer.ggml.*) or a Hugging Face tokenizer.json. Pre-tokenization
// uses the model's regex through PCRE2 (UTF + UCP); special tokens are matched before the
// regex when parse_special is set. Immutable after construction: safe to share across threads.
#ifndef RIDGESERVE_ENGINE_TOKENIZER_TOKENIZER_H_
#define RIDGESERVE_ENGINE_TOKENIZER_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace ridgeserve {

class GgufFile;

struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};

enum class ChatTemplateKind { kChatML, kLlama3 };

class Tokenizer {
 public:
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromGguf(const GgufFile& gguf);
  // `dir` holds tokenizer.json and optionally tokenizer_config.json (chat template, bos/eos,
  // add_bos_token).
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromHfDir(const std::string& dir);
  virtual ~Tokenizer() = default;

  // Token ids for `text`. Prepends BOS when the model asks for it and add_bos is set.
  // With parse_special, special-token strings in the text (e.g. "<|im_start|>") become their
  // ids; without it they are tokenized as plain text. Ids match Hugging Face tokenizers.
  // `text` need not be valid UTF-8: invalid bytes are encoded as bytes; a byte whose symbol
  // the vocabulary lacks is dropped, as tokenizers drops it (SmolLM2 lacks 0x04, 0xFF, ...).
  virtual std::vector<int32_t> Encode(std::string_view text, bool add_bos,
                                      bool parse_special) const = 0;
  // The bytes of the tokens concatenated (special tokens as their text unless skip_special).
  virtual std::string Decode(std::span<const int32_t> ids, bool skip_special = false) const = 0;
  // Raw bytes of one token (may be a partial UTF-8 character).
  virtual std::string TokenBytes(int32_t id) const = 0;

  virtual int32_t vocab_size() const = 0;
  virtual int32_t bos_id() const = 0;  // -1 when none
  virtual int32_t eos_id() const = 0;
  // Every id that ends generation (eos, <|im_end|>, <|eot_id|>, <|end_of_text|>, ...).
  virtual const std::vector<int32_t>& end_of_generation_ids() const = 0;
  virtual bool IsSpecial(int32_t id) const = 0;

  // The chat template chosen from the model's metadata (tokenizer.chat_template).
  virtual ChatTemplateKind chat_template() const = 0;
  // The prompt text for `messages` (special tokens as text: encode with parse_special, and
  // with add_bos = false: Llama 3's prompt already starts with the BOS text).
  // ChatML inserts SmolLM2's default system prompt when the first message is not a system
  // message and the model's template does so.
  virtual std::string ApplyChatTemplate(std::span<const ChatMessage> messages,
                                        bool add_generation_prompt) const = 0;
};

// Incremental detokenizer for streaming: Push returns the text that became complete, never
// splitting a UTF-8 character; Flush returns what is left (invalid trailing bytes as U+FFFD).
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special = true);
  std::string Push(int32_t id);
  std::string Flush();

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_;
  std::string pending_;  // bytes of an incomplete UTF-8 character
};

}  // namespace ridgeserve

#endif  // RIDGESERVE_ENGINE_TOKENIZER_TOKENIZER_H_
