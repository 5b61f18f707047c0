#include "engine/draft/draft_model.h"

#include <charconv>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/common/status_macros.h"
#include "spdlog/spdlog.h"

namespace ridgeserve {
namespace {

// The first difference between the draft's tokenizer and the target's, or "" when they agree on
// every token's bytes and on the special tokens.
std::string TokenizerDifference(const Tokenizer& draft, const Tokenizer& target) {
  if (draft.vocab_size() != target.vocab_size()) {
    return absl::StrCat("vocabulary of ", draft.vocab_size(), " tokens, the target's ",
                        target.vocab_size());
  }
  if (draft.bos_id() != target.bos_id() || draft.eos_id() != target.eos_id()) {
    return absl::StrCat("BOS/EOS ", draft.bos_id(), "/", draft.eos_id(), ", the target's ",
                        target.bos_id(), "/", target.eos_id());
  }
  if (draft.end_of_generation_ids() != target.end_of_generation_ids()) {
    return "different end-of-generation tokens";
  }
  for (int32_t id = 0; id < target.vocab_size(); ++id) {
    if (draft.TokenBytes(id) != target.TokenBytes(id)) {
      return absl::StrCat("token ", id, " differs");
    }
    if (draft.IsSpecial(id) != target.IsSpecial(id)) {
      return absl::StrCat("token ", id, " is special in only one of them");
    }
  }
  return "";
}

}  // namespace

absl::StatusOr<std::unique_ptr<DraftModel>> LoadDraftModel(const std::string& spec,
                                                           const Model& target, Backend& backend) {
  auto draft = std::make_unique<DraftModel>();
  draft->name = spec;
  const int32_t target_layers = target.config.num_layers;
  if (absl::StartsWith(spec, "self:")) {
    const std::string_view k = std::string_view(spec).substr(5);
    int32_t layers = 0;
    const auto [end, ec] = std::from_chars(k.data(), k.data() + k.size(), layers);
    if (ec != std::errc() || end != k.data() + k.size() || layers < 1 || layers >= target_layers) {
      return absl::InvalidArgumentError(
          absl::StrCat("draft model \"", spec, "\": K in self:K must be in [1, ", target_layers - 1,
                       "] (the target has ", target_layers, " layers)"));
    }
    draft->llama = target.llama;
    draft->num_layers = layers;
    spdlog::info("draft model: the target's first {} of {} layers (self-draft)", layers,
                 target_layers);
    return draft;
  }
  RS_ASSIGN_OR_RETURN(draft->owned, LoadModel(spec, backend));
  if (std::string diff = TokenizerDifference(*draft->owned->tokenizer, *target.tokenizer);
      !diff.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("draft model ", spec, ": its tokenizer is not the target's (", diff, ")"));
  }
  draft->llama = draft->owned->llama;
  draft->num_layers = draft->owned->config.num_layers;
  return draft;
}

}  // namespace ridgeserve
