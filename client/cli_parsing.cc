#include "client/cli_parsing.h"

#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace ridgeserve {

std::vector<std::string> CollectRepeatedFlag(int argc, char** argv, const std::string& name) {
  std::vector<std::string> values;
  const std::string forms[] = {"--" + name, "-" + name};
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--") break;
    for (const std::string& form : forms) {
      if (arg == form && i + 1 < argc) {
        values.push_back(argv[++i]);
        break;
      }
      if (arg.rfind(form + "=", 0) == 0) {
        values.push_back(arg.substr(form.size() + 1));
        break;
      }
    }
  }
  return values;
}

absl::StatusOr<std::vector<std::string>> ParseStopList(const std::string& flag_value) {
  // Split on commas not preceded by a backslash, keeping "\," for the unescape step.
  std::vector<std::string> raw(1);
  for (size_t i = 0; i < flag_value.size(); ++i) {
    const char c = flag_value[i];
    if (c == '\\' && i + 1 < flag_value.size()) {
      if (flag_value[i + 1] == ',') {
        raw.back() += ',';
      } else {
        raw.back() += c;
        raw.back() += flag_value[i + 1];
      }
      ++i;
    } else if (c == ',') {
      raw.emplace_back();
    } else {
      raw.back() += c;
    }
  }
  std::vector<std::string> out;
  for (const std::string& item : raw) {
    std::string decoded;
    std::string error;
    if (!absl::CUnescape(item, &decoded, &error)) {
      return absl::InvalidArgumentError(absl::StrCat("--stop \"", item, "\": ", error));
    }
    if (decoded.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--stop \"", flag_value, "\": empty stop string"));
    }
    out.push_back(std::move(decoded));
  }
  return out;
}

absl::StatusOr<std::vector<int32_t>> ParseIdList(const std::string& flag,
                                                 const std::string& value) {
  std::vector<int32_t> ids;
  for (absl::string_view part : absl::StrSplit(value, ',', absl::SkipWhitespace())) {
    int32_t id;
    if (!absl::SimpleAtoi(part, &id)) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, ": not an integer: ", part));
    }
    ids.push_back(id);
  }
  return ids;
}

absl::StatusOr<v1::PrefillOptions::Mode> ParsePrefillMode(const std::string& name) {
  const std::string lower = absl::AsciiStrToLower(name);
  if (lower == "exact") return v1::PrefillOptions::EXACT;
  if (lower == "ridgefill") return v1::PrefillOptions::RIDGEFILL;
  if (lower == "spec_pc") return v1::PrefillOptions::SPEC_PC;
  if (lower == "spec_kv") return v1::PrefillOptions::SPEC_KV;
  return absl::InvalidArgumentError(
      absl::StrCat("--mode must be exact, ridgefill, spec_pc or spec_kv, got ", name));
}

absl::StatusOr<std::string> ReadPrompt(const std::vector<std::string>& positional,
                                       const std::string& prompt_flag,
                                       const std::string& file_flag) {
  const int sources = !positional.empty() + !prompt_flag.empty() + !file_flag.empty();
  if (sources > 1) {
    return absl::InvalidArgumentError(
        "give the prompt once: as an argument, with --prompt or with --file");
  }
  if (!positional.empty()) return absl::StrJoin(positional, " ");
  if (!prompt_flag.empty()) return prompt_flag;
  std::stringstream buffer;
  if (!file_flag.empty()) {
    std::ifstream in(file_flag, std::ios::binary);
    if (!in) return absl::NotFoundError(absl::StrCat("--file ", file_flag, ": cannot open"));
    buffer << in.rdbuf();
  } else {
    buffer << std::cin.rdbuf();
  }
  return buffer.str();
}

}  // namespace ridgeserve
