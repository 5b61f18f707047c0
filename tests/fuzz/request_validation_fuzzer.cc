// Request validation (server/request_validation.*) on arbitrary request bytes, parsed as the
// server parses them (ParseRequest, server/raw_messages.*): as a GenerateRequest through
// ValidateGenerateRequest, and as a TokenizeRequest through TokenizeRequestInput. Anything
// accepted must satisfy what the engine relies on: prompt ids in the vocabulary, prompt +
// max_new_tokens within the context, stop strings within their limits.
//
// The tokenizer is the tiny test model's (tests/fuzz/data/tiny_llama3, ChatML-like template,
// BOS), the model a 256-token context; the server options alternate between RidgeFill maps
// loaded (splits 0 and 2) and none, by the input's length.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/tokenizer/tokenizer.h"
#include "grpcpp/impl/grpc_library.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "ridgeserve/v1/ridgeserve.pb.h"
#include "server/raw_messages.h"
#include "server/request_validation.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

struct Fixture {
  std::unique_ptr<ridgeserve::Tokenizer> tokenizer;
  ridgeserve::ModelConfig config;
  ridgeserve::ServerOptions with_maps;
  ridgeserve::ServerOptions without_maps;
};

const Fixture& GetFixture() {
  static const Fixture* fixture = [] {
    static grpc::internal::GrpcLibraryInitializer grpc_init;
    grpc_init.summon();
    auto* f = new Fixture;
    auto tok = ridgeserve::Tokenizer::FromHfDir(std::string(RIDGESERVE_SOURCE_DIR) +
                                                "/tests/fuzz/data/tiny_llama3");
    if (!tok.ok()) ridgeserve::fuzz::Fail("cannot load tests/fuzz/data/tiny_llama3");
    f->tokenizer = std::move(*tok);
    f->config.name = "tiny";
    f->config.num_layers = 4;
    f->config.hidden = 64;
    f->config.vocab_size = f->tokenizer->vocab_size();
    f->config.context_length = 256;
    f->with_maps.ridgefill_split_layers = {0, 2};
    f->with_maps.default_split_layer = 2;
    f->without_maps.ridgefill_unavailable = "no maps loaded";
    return f;
  }();
  return *fixture;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ridgeserve;
  const Fixture& f = GetFixture();
  grpc::Slice slice(data, size);
  grpc::ByteBuffer bytes(&slice, 1);

  v1::GenerateRequest request;
  if (ParseRequest(bytes, request).ok()) {
    const ServerOptions& options = size % 2 == 0 ? f.with_maps : f.without_maps;
    auto validated = ValidateGenerateRequest(request, *f.tokenizer, f.config, options);
    if (validated.ok()) {
      const EngineRequest& engine = validated->engine;
      if (engine.prompt.empty()) fuzz::Fail("an accepted request has an empty prompt");
      for (int32_t id : engine.prompt) {
        if (id < 0 || id >= f.config.vocab_size) fuzz::Fail("a prompt id outside the vocab");
      }
      if (engine.max_new_tokens < 1 ||
          static_cast<int64_t>(engine.prompt.size()) + engine.max_new_tokens >
              f.config.context_length) {
        fuzz::Fail("an accepted request does not fit the context");
      }
      if (validated->stop.size() > static_cast<size_t>(kMaxStopStrings)) {
        fuzz::Fail("too many stop strings accepted");
      }
      for (const std::string& stop : validated->stop) {
        if (stop.empty() || stop.size() > static_cast<size_t>(kMaxStopStringBytes)) {
          fuzz::Fail("a stop string outside 1..256 bytes accepted");
        }
      }
    } else if (validated.status().message().empty()) {
      fuzz::Fail("a refusal without a message");
    }
  }

  v1::TokenizeRequest tokenize;
  if (ParseRequest(bytes, tokenize).ok()) {
    auto ids = TokenizeRequestInput(tokenize, *f.tokenizer);
    if (ids.ok()) {
      for (int32_t id : *ids) {
        if (id < 0 || id >= f.config.vocab_size) fuzz::Fail("a token id outside the vocab");
      }
    }
  }
  return 0;
}
