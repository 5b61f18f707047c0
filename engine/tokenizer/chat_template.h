// Chat templates. ridgeserve does not run Jinja: it recognises the template family from the
// model's template text (ChatML or Llama 3) and renders that family's format, taking the
// model-specific parts (a default system prompt, the BOS text) from the metadata.
#ifndef RIDGESERVE_ENGINE_TOKENIZER_CHAT_TEMPLATE_H_
#define RIDGESERVE_ENGINE_TOKENIZER_CHAT_TEMPLATE_H_

#include <span>
#include <string>
#include <string_view>

#include "engine/tokenizer/tokenizer.h"

namespace ridgeserve {

class ChatTemplate {
 public:
  // `template_text`: the model's Jinja template, empty when it has none; the family is then
  // guessed from the vocabulary (`has_im_start`, `has_start_header`), ChatML by default.
  // `bos_text`: the BOS token's text (Llama 3 starts prompts with it), empty when none.
  static ChatTemplate Detect(std::string_view template_text, bool has_im_start,
                             bool has_start_header, std::string bos_text);

  ChatTemplateKind kind() const { return kind_; }
  // ChatML only: the system prompt the template inserts when the conversation does not start
  // with one (SmolLM2, Qwen2/2.5); empty when the template has none.
  const std::string& default_system() const { return default_system_; }

  std::string Render(std::span<const ChatMessage> messages, bool add_generation_prompt) const;

 private:
  ChatTemplateKind kind_ = ChatTemplateKind::kChatML;
  std::string default_system_;
  std::string bos_text_;
};

// The literal text a ChatML template writes as the system message when none is given:
// "<|im_start|>system\n<TEXT><|im_end|>" inside a string literal of the template, with no
// Jinja expression inside. Empty when there is none. Exposed for tests.
std::string ExtractChatMLDefaultSystem(std::string_view template_text);

}  // namespace ridgeserve

#endif  // RIDGESERVE_ENGINE_TOKENIZER_CHAT_TEMPLATE_H_
