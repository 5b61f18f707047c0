// The Tokenizer implementation both loaders (GGUF metadata, tokenizer.json) build: byte-level
// BPE + pre-tokenizer + added tokens + chat template. Loaders fill a TokenizerSpec and call
// BuildBpeTokenizer, which validates it.
#ifndef RIDGESERVE_ENGINE_TOKENIZER_BPE_TOKENIZER_H_
#define RIDGESERVE_ENGINE_TOKENIZER_BPE_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/tokenizer/added_tokens.h"
#include "engine/tokenizer/bpe.h"
#include "engine/tokenizer/pretokenizer.h"
#include "engine/tokenizer/tokenizer.h"

namespace ridgeserve {

struct TokenizerSpec {
  // tokens[id] in byte-level form; holes (ids no entry names) are empty strings.
  std::vector<std::string> tokens;
  std::vector<std::pair<std::string, std::string>> merges;  // rank order
  BpeOptions bpe;
  PreTokenizer pre_tokenizer;
  // Matched in the raw text before pre-tokenization; `special` ones are also IsSpecial()
  // and skipped by Decode(skip_special).
  std::vector<AddedToken> added_tokens;
  int32_t bos_id = -1;
  int32_t eos_id = -1;
  bool add_bos = false;
  // Extra end-of-generation ids beyond eos (eot, eom, generation_config's eos list).
  std::vector<int32_t> extra_eog_ids;
  std::string chat_template;  // Jinja source, empty when the model has none
};

absl::StatusOr<std::unique_ptr<Tokenizer>> BuildBpeTokenizer(TokenizerSpec spec);

}  // namespace ridgeserve

#endif  // RIDGESERVE_ENGINE_TOKENIZER_BPE_TOKENIZER_H_
