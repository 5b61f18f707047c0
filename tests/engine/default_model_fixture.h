// The default model (SmolLM2-135M-Instruct GGUF; `make model` fetches it) loaded once on the
// CPU backend for a test suite, plus deterministic random prompts.
#ifndef RIDGESERVE_TESTS_ENGINE_DEFAULT_MODEL_FIXTURE_H_
#define RIDGESERVE_TESTS_ENGINE_DEFAULT_MODEL_FIXTURE_H_

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <random>
#include <vector>

#include "engine/model/model.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"

namespace ridgeserve {

class DefaultModelTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // RIDGESERVE_CPU_ISA picks the kernel path, and RIDGESERVE_TEST_ACTIVATIONS (f32 when
    // unset) the Linear arithmetic, so ctest can run the suite on each.
    const char* activations_name = std::getenv("RIDGESERVE_TEST_ACTIVATIONS");
    auto activations =
        cpu::ParseActivations(activations_name != nullptr ? activations_name : "f32");
    ASSERT_TRUE(activations.ok()) << activations.status();
    auto backend = CreateCpuBackendFromEnvironment(0, *activations);
    ASSERT_TRUE(backend.ok()) << backend.status();
    backend_ = backend->release();
    auto model = LoadModel(RIDGESERVE_DEFAULT_MODEL, *backend_);
    ASSERT_TRUE(model.ok()) << model.status() << " (make model fetches it)";
    model_ = model->release();
  }
  static void TearDownTestSuite() {
    delete model_;
    delete backend_;
    model_ = nullptr;
    backend_ = nullptr;
  }

  // `n` ids drawn uniformly from the non-special part of the vocabulary.
  static std::vector<int32_t> RandomTokens(int n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int32_t> pick(256, model_->config.vocab_size - 1);
    std::vector<int32_t> tokens(n);
    for (int32_t& t : tokens) t = pick(rng);
    return tokens;
  }

  static inline Backend* backend_ = nullptr;
  static inline Model* model_ = nullptr;
};

}  // namespace ridgeserve

#endif  // RIDGESERVE_TESTS_ENGINE_DEFAULT_MODEL_FIXTURE_H_
