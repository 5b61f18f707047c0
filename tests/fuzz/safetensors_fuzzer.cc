// Safetensors reader (engine/model/safetensors.*), single file and sharded through
// model.safetensors.index.json, on arbitrary bytes.
//
// Input: a single file's bytes; or, when it contains the separator "\n--shard--\n", the index
// JSON followed by the shards, written as shard-1.safetensors, shard-2.safetensors, ... (the
// seeds' index names those files).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "engine/model/safetensors.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ridgeserve;
  std::string_view input(reinterpret_cast<const char*>(data), size);
  fuzz::ClearScratchDir();
  std::vector<std::string_view> parts = fuzz::Split(input, "\n--shard--\n");
  if (parts.size() == 1) {
    fuzz::WriteScratchFile("model.safetensors", input);
  } else {
    fuzz::WriteScratchFile("model.safetensors.index.json", parts[0]);
    for (size_t i = 1; i < parts.size(); ++i) {
      fuzz::WriteScratchFile("shard-" + std::to_string(i) + ".safetensors", parts[i]);
    }
  }
  auto model = SafetensorsModel::Open(fuzz::ScratchDir());
  if (!model.ok()) {
    if (model.status().message().empty()) fuzz::Fail("an error without a message");
    return 0;
  }
  for (const TensorInfo& tensor : (*model)->tensors()) {
    if ((*model)->FindTensor(tensor.name) == nullptr) fuzz::Fail("a listed tensor is not found");
    auto values = (*model)->ReadF32(tensor);
    if (values.ok() && static_cast<int64_t>(values->size()) != tensor.num_elements) {
      fuzz::Fail("ReadF32 returned the wrong element count");
    }
  }
  return 0;
}
