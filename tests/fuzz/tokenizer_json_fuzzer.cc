// tokenizer.json loader (Tokenizer::FromHfDir, engine/tokenizer/load_hf.cc) on arbitrary
// bytes. Input: tokenizer.json, optionally followed by "\n--config--\n" and
// tokenizer_config.json. A tokenizer that loads is then used on a few fixed strings.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "engine/tokenizer/tokenizer.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ridgeserve;
  std::string_view input(reinterpret_cast<const char*>(data), size);
  fuzz::ClearScratchDir();
  std::vector<std::string_view> parts = fuzz::Split(input, "\n--config--\n");
  fuzz::WriteScratchFile("tokenizer.json", parts[0]);
  if (parts.size() > 1) fuzz::WriteScratchFile("tokenizer_config.json", parts[1]);
  auto tokenizer = Tokenizer::FromHfDir(fuzz::ScratchDir());
  if (!tokenizer.ok()) {
    if (tokenizer.status().message().empty()) fuzz::Fail("an error without a message");
    return 0;
  }
  const Tokenizer& tok = **tokenizer;
  for (std::string_view text : {"Hello, world! 123", "<|im_start|>user\n\xc3\x28<|im_end|>", ""}) {
    for (bool special : {false, true}) {
      std::vector<int32_t> ids = tok.Encode(text, true, special);
      for (int32_t id : ids) {
        if (id < 0 || id >= tok.vocab_size()) fuzz::Fail("Encode gave an id outside the vocab");
      }
      (void)tok.Decode(ids);
      (void)tok.Decode(ids, true);
    }
  }
  ChatMessage message{"user", "Hi"};
  (void)tok.ApplyChatTemplate({&message, 1}, true);
  return 0;
}
