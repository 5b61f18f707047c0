// GGUF reader (engine/model/gguf.*) and the tokenizer built from GGUF metadata
// (Tokenizer::FromGguf) on arbitrary file bytes. The reader must answer every input with a
// file or one error; a file it accepts must serve every accessor and ReadF32 of every tensor.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "engine/model/gguf.h"
#include "engine/tokenizer/tokenizer.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

// Keys the model and tokenizer loaders read, asked through every accessor so type mismatches
// are exercised too.
constexpr std::string_view kKeys[] = {
    "general.architecture",        "general.name",
    "general.alignment",           "llama.block_count",
    "llama.context_length",        "llama.rope.freq_base",
    "tokenizer.ggml.model",        "tokenizer.ggml.tokens",
    "tokenizer.ggml.merges",       "tokenizer.ggml.token_type",
    "tokenizer.ggml.bos_token_id", "tokenizer.ggml.add_bos_token",
    "tokenizer.chat_template",     "tokenizer.ggml.pre",
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ridgeserve;
  std::string path = fuzz::WriteScratchFile(
      "input.gguf", std::string_view(reinterpret_cast<const char*>(data), size));
  auto file = GgufFile::Open(path);
  if (!file.ok()) {
    if (file.status().message().empty()) fuzz::Fail("an error without a message");
    return 0;
  }
  const GgufFile& gguf = **file;
  (void)gguf.version();
  for (std::string_view key : kKeys) {
    (void)gguf.Has(key);
    (void)gguf.GetInt(key);
    (void)gguf.GetFloat(key);
    (void)gguf.GetBool(key);
    (void)gguf.GetString(key);
    (void)gguf.GetStringArray(key);
    (void)gguf.GetIntArray(key);
    (void)gguf.GetFloatArray(key);
  }
  for (const TensorInfo& tensor : gguf.tensors()) {
    if (gguf.FindTensor(tensor.name) == nullptr) fuzz::Fail("a listed tensor is not found");
    auto values = gguf.ReadF32(tensor);
    if (values.ok() && static_cast<int64_t>(values->size()) != tensor.num_elements) {
      fuzz::Fail("ReadF32 returned the wrong element count");
    }
  }
  auto tokenizer = Tokenizer::FromGguf(gguf);
  if (tokenizer.ok()) {
    std::vector<int32_t> ids = (*tokenizer)->Encode("Hello <|im_start|> world\xff", true, true);
    (void)(*tokenizer)->Decode(ids);
  }
  return 0;
}
