#include "engine/tokenizer/chat_template.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"

namespace ridgeserve {
namespace {

constexpr char kImStart[] = "<|im_start|>";
constexpr char kImEnd[] = "<|im_end|>";
constexpr char kStartHeader[] = "<|start_header_id|>";
constexpr char kEndHeader[] = "<|end_header_id|>";
constexpr char kEotId[] = "<|eot_id|>";

// Jinja's `trim` filter: Python's str.strip(), whitespace at both ends.
absl::string_view Trim(absl::string_view s) {
  constexpr absl::string_view kSpace = " \t\n\r\v\f";
  const size_t begin = s.find_first_not_of(kSpace);
  if (begin == absl::string_view::npos) return {};
  const size_t end = s.find_last_not_of(kSpace);
  return s.substr(begin, end - begin + 1);
}

}  // namespace

std::string ExtractChatMLDefaultSystem(std::string_view template_std) {
  // This absl's string functions take absl::string_view, which is not std::string_view.
  const absl::string_view template_text(template_std.data(), template_std.size());
  const std::string marker = absl::StrCat(kImStart, "system");
  size_t pos = 0;
  while ((pos = template_text.find(marker, pos)) != absl::string_view::npos) {
    pos += marker.size();
    absl::string_view rest = template_text.substr(pos);
    // The newline after the role: a real newline (JSON/GGUF already unescaped it) or the
    // two characters \n of a Jinja string escape.
    if (!absl::ConsumePrefix(&rest, "\n") && !absl::ConsumePrefix(&rest, "\\n")) continue;
    const size_t end = rest.find(kImEnd);
    if (end == absl::string_view::npos) continue;
    const absl::string_view body = rest.substr(0, end);
    // A literal ends at a quote; '{' starts a Jinja expression or statement.
    if (body.empty() || body.find_first_of("'\"{}") != absl::string_view::npos) continue;
    return absl::StrReplaceAll(body, {{"\\n", "\n"}, {"\\'", "'"}});
  }
  return "";
}

ChatTemplate ChatTemplate::Detect(std::string_view template_text, bool has_im_start,
                                  bool has_start_header, std::string bos_text) {
  ChatTemplate t;
  t.bos_text_ = std::move(bos_text);
  if (template_text.find(kImStart) != std::string_view::npos) {
    t.kind_ = ChatTemplateKind::kChatML;
  } else if (template_text.find(kStartHeader) != std::string_view::npos) {
    t.kind_ = ChatTemplateKind::kLlama3;
  } else if (template_text.empty() && !has_im_start && has_start_header) {
    t.kind_ = ChatTemplateKind::kLlama3;
  } else {
    // No template, or one of another family: ChatML is the most common convention.
    t.kind_ = ChatTemplateKind::kChatML;
  }
  if (t.kind_ == ChatTemplateKind::kChatML) {
    t.default_system_ = ExtractChatMLDefaultSystem(template_text);
  }
  return t;
}

std::string ChatTemplate::Render(std::span<const ChatMessage> messages,
                                 bool add_generation_prompt) const {
  std::string out;
  if (kind_ == ChatTemplateKind::kChatML) {
    if (!default_system_.empty() && !messages.empty() && messages[0].role != "system") {
      absl::StrAppend(&out, kImStart, "system\n", default_system_, kImEnd, "\n");
    }
    for (const ChatMessage& m : messages) {
      absl::StrAppend(&out, kImStart, m.role, "\n", m.content, kImEnd, "\n");
    }
    if (add_generation_prompt) absl::StrAppend(&out, kImStart, "assistant\n");
    return out;
  }
  // Llama 3: BOS once, then each message with its content trimmed (the template's `| trim`).
  out = bos_text_;
  for (const ChatMessage& m : messages) {
    absl::StrAppend(&out, kStartHeader, m.role, kEndHeader, "\n\n", Trim(m.content), kEotId);
  }
  if (add_generation_prompt) absl::StrAppend(&out, kStartHeader, "assistant", kEndHeader, "\n\n");
  return out;
}

}  // namespace ridgeserve
