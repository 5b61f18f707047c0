// Tokenizer Encode / Decode / StreamDecoder (engine/tokenizer/) on arbitrary bytes: invalid
// UTF-8, special-token look-alikes ("<|im_start", "<|im_end|>" inside words), long runs.
//
// Input: byte 0 picks the tokenizer and flags, the rest is the text; the same bytes read as
// little-endian int32 ids are decoded too. Tokenizers: the tiny test models' tokenizer.json
// (tests/fuzz/data/, every byte in the vocabulary, so Decode(Encode(text)) must give the text
// back) and, when it is there, the default model's GGUF (SmolLM2: its real regex and 49,152
// tokens, some bytes missing, so only the id range is checked).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "engine/model/gguf.h"
#include "engine/tokenizer/tokenizer.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using ridgeserve::Tokenizer;

struct Loaded {
  std::unique_ptr<Tokenizer> tokenizer;
  bool round_trips;  // every byte has a token and there is no normalizer
};

std::vector<Loaded> LoadTokenizers() {
  std::vector<Loaded> out;
  for (const char* dir : {"tiny_llama3", "tiny_qwen3"}) {
    auto tok = Tokenizer::FromHfDir(std::string(RIDGESERVE_SOURCE_DIR) + "/tests/fuzz/data/" + dir);
    if (!tok.ok()) ridgeserve::fuzz::Fail("cannot load a tokenizer from tests/fuzz/data");
    out.push_back({std::move(*tok), true});
  }
  std::error_code ec;
  if (std::filesystem::exists(RIDGESERVE_DEFAULT_MODEL, ec)) {
    auto gguf = ridgeserve::GgufFile::Open(RIDGESERVE_DEFAULT_MODEL);
    if (gguf.ok()) {
      auto tok = Tokenizer::FromGguf(**gguf);
      if (tok.ok()) out.push_back({std::move(*tok), false});
    }
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ridgeserve;
  static const std::vector<Loaded>* tokenizers = new std::vector<Loaded>(LoadTokenizers());
  if (size == 0) return 0;
  const uint8_t control = data[0];
  const Loaded& loaded = (*tokenizers)[control % tokenizers->size()];
  const Tokenizer& tok = *loaded.tokenizer;
  const bool parse_special = (control & 0x10) != 0;
  const bool add_bos = (control & 0x20) != 0;
  std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);

  std::vector<int32_t> ids = tok.Encode(text, add_bos, parse_special);
  for (int32_t id : ids) {
    if (id < 0 || id >= tok.vocab_size()) fuzz::Fail("Encode gave an id outside the vocabulary");
  }
  (void)tok.Decode(ids);
  if (loaded.round_trips) {
    std::vector<int32_t> plain = tok.Encode(text, /*add_bos=*/false, parse_special);
    if (tok.Decode(plain) != text) fuzz::Fail("Decode(Encode(text)) is not the text");
  }
  (void)tok.Decode(ids, /*skip_special=*/true);

  // The same bytes as ids: any int32, in or out of the vocabulary.
  std::vector<int32_t> raw_ids(text.size() / 4);
  if (!raw_ids.empty()) std::memcpy(raw_ids.data(), text.data(), raw_ids.size() * 4);
  (void)tok.Decode(raw_ids);
  StreamDecoder stream(tok, /*skip_special=*/(control & 0x40) != 0);
  std::string streamed;
  for (int32_t id : raw_ids) streamed += stream.Push(id);
  streamed += stream.Flush();
  for (int32_t id : raw_ids) (void)tok.TokenBytes(id), (void)tok.IsSpecial(id);
  return 0;
}
