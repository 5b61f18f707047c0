// formats_tensor_dump: the test-side window onto the readers, for Python checks that compare
// against the gguf / safetensors packages.
//
//   formats_tensor_dump PATH [--out DIR] [--tensor NAME]... [--key KEY]...
//
// PATH is a GGUF file, or a safetensors directory / .safetensors file. Prints one JSON object:
//   {"format": "gguf"|"safetensors", "version": 3,
//    "tensors": [{"name", "type", "shape", "num_bytes", "file"?}],
//    "keys": {KEY: {"has": bool, "int": v | {"error": CODE}, "float": ..., "bool": ...,
//                   "string": ..., "string_array": ..., "int_array": ..., "float_array": ...}}}
// With --out, each tensor (every one, or only the --tensor ones) is written to DIR as raw
// little-endian f32 from ReadF32, and "file" names it. A reader error prints
// {"error": {"code": CODE, "message": MESSAGE}} and exits 2.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/model/gguf.h"
#include "engine/model/safetensors.h"
#include "kernels/dtype.h"
#include "nlohmann/json.hpp"

namespace ridgeserve {
namespace {

using Json = nlohmann::json;

Json ErrorJson(const absl::Status& status) {
  return Json{{"code", absl::StatusCodeToString(status.code())},
              {"message", std::string(status.message())}};
}

template <typename T>
Json ValueOrError(const absl::StatusOr<T>& value) {
  if (!value.ok()) return Json{{"error", ErrorJson(value.status())}};
  return Json(*value);
}

Json DumpKey(const GgufFile& gguf, const std::string& key) {
  return Json{{"has", gguf.Has(key)},
              {"int", ValueOrError(gguf.GetInt(key))},
              {"float", ValueOrError(gguf.GetFloat(key))},
              {"bool", ValueOrError(gguf.GetBool(key))},
              {"string", ValueOrError(gguf.GetString(key))},
              {"string_array", ValueOrError(gguf.GetStringArray(key))},
              {"int_array", ValueOrError(gguf.GetIntArray(key))},
              {"float_array", ValueOrError(gguf.GetFloatArray(key))}};
}

int Fail(const absl::Status& status) {
  std::cout << Json{{"error", ErrorJson(status)}}.dump(-1, ' ', false,
                                                       Json::error_handler_t::replace)
            << "\n";
  return 2;
}

int Main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: formats_tensor_dump PATH [--out DIR] [--tensor NAME]... [--key KEY]...\n";
    return 1;
  }
  const std::string path = argv[1];
  std::string out_dir;
  std::set<std::string> only;
  std::vector<std::string> keys;
  for (int i = 2; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) {
      std::cerr << "missing value for " << flag << "\n";
      return 1;
    }
    const std::string value = argv[++i];
    if (flag == "--out") {
      out_dir = value;
    } else if (flag == "--tensor") {
      only.insert(value);
    } else if (flag == "--key") {
      keys.push_back(value);
    } else {
      std::cerr << "unknown flag " << flag << "\n";
      return 1;
    }
  }

  Json result;
  std::unique_ptr<TensorSource> source;
  const bool is_gguf = path.size() < 12 || path.substr(path.size() - 12) != ".safetensors";
  std::error_code ec;
  if (is_gguf && !std::filesystem::is_directory(path, ec)) {
    absl::StatusOr<std::unique_ptr<GgufFile>> gguf = GgufFile::Open(path);
    if (!gguf.ok()) return Fail(gguf.status());
    result["format"] = "gguf";
    result["version"] = (*gguf)->version();
    Json key_json = Json::object();
    for (const std::string& key : keys) key_json[key] = DumpKey(**gguf, key);
    result["keys"] = key_json;
    source = *std::move(gguf);
  } else {
    absl::StatusOr<std::unique_ptr<SafetensorsModel>> st = SafetensorsModel::Open(path);
    if (!st.ok()) return Fail(st.status());
    result["format"] = "safetensors";
    source = *std::move(st);
  }

  Json tensors = Json::array();
  int index = 0;
  for (const TensorInfo& info : source->tensors()) {
    absl::StatusOr<TypeTraits> traits = GetTypeTraits(info.type);
    Json t{{"name", info.name},
           {"type", traits.ok() ? std::string(traits->name) : "?"},
           {"shape", info.shape},
           {"num_elements", info.num_elements},
           {"num_bytes", info.num_bytes}};
    if (!out_dir.empty() && (only.empty() || only.contains(info.name))) {
      absl::StatusOr<std::vector<float>> values = source->ReadF32(info);
      if (!values.ok()) return Fail(values.status());
      const std::string file = std::to_string(index) + ".f32";
      std::ofstream out(out_dir + "/" + file, std::ios::binary);
      out.write(reinterpret_cast<const char*>(values->data()),
                static_cast<std::streamsize>(values->size() * sizeof(float)));
      if (!out) {
        std::cerr << "cannot write " << out_dir << "/" << file << "\n";
        return 1;
      }
      t["file"] = file;
    }
    tensors.push_back(std::move(t));
    ++index;
  }
  result["tensors"] = std::move(tensors);
  std::cout << result.dump(-1, ' ', false, Json::error_handler_t::replace) << "\n";
  return 0;
}

}  // namespace
}  // namespace ridgeserve

int main(int argc, char** argv) { return ridgeserve::Main(argc, argv); }
