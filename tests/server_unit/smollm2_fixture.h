// The default model's tokenizer and config (SmolLM2-135M-Instruct GGUF; `make model` fetches
// it), shared by the tests that need a real vocabulary and chat template.
#ifndef RIDGESERVE_TESTS_SERVER_UNIT_SMOLLM2_FIXTURE_H_
#define RIDGESERVE_TESTS_SERVER_UNIT_SMOLLM2_FIXTURE_H_

#include <memory>

#include "engine/model/config.h"
#include "engine/model/gguf.h"
#include "engine/tokenizer/tokenizer.h"
#include "gtest/gtest.h"

namespace ridgeserve {

class SmolLM2Test : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (tokenizer_ != nullptr) return;
    auto gguf = GgufFile::Open(RIDGESERVE_DEFAULT_MODEL);
    ASSERT_TRUE(gguf.ok()) << gguf.status() << " (make model fetches it)";
    auto tokenizer = Tokenizer::FromGguf(**gguf);
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    auto config = ConfigFromGguf(**gguf, {});
    ASSERT_TRUE(config.ok()) << config.status();
    tokenizer_ = tokenizer->release();
    config_ = new ModelConfig(*config);
  }
  // Kept for the whole binary: several suites share them.
  static inline const Tokenizer* tokenizer_ = nullptr;
  static inline const ModelConfig* config_ = nullptr;
};

}  // namespace ridgeserve

#endif  // RIDGESERVE_TESTS_SERVER_UNIT_SMOLLM2_FIXTURE_H_
