// Command-line helpers of ridgeserve-cli that need no server: where the prompt comes from,
// repeatable --stop flags, comma-separated id lists, prefill mode names.
#ifndef RIDGESERVE_CLIENT_CLI_PARSING_H_
#define RIDGESERVE_CLIENT_CLI_PARSING_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ridgeserve/v1/ridgeserve.pb.h"

namespace ridgeserve {

// Every value of a repeated string flag (`--name=V`, `--name V`, `-name=V`, `-name V`), in
// order, up to a `--` terminator. absl flags keep only the last occurrence, so these are
// collected from argv before absl parses it.
std::vector<std::string> CollectRepeatedFlag(int argc, char** argv, const std::string& name);

// Splits "a,b\,c,\n" into {"a", "b,c", "\n"}: commas separate, "\," is a literal comma, and
// C escapes (\n, \t, \\, \x41, ...) are decoded. InvalidArgument on a bad escape or an empty
// item.
absl::StatusOr<std::vector<std::string>> ParseStopList(const std::string& flag_value);

// "1, 2,3" -> {1, 2, 3}.
absl::StatusOr<std::vector<int32_t>> ParseIdList(const std::string& flag, const std::string& value);

// "exact", "ridgefill", "spec_pc", "spec_kv" (any case).
absl::StatusOr<v1::PrefillOptions::Mode> ParsePrefillMode(const std::string& name);

// The prompt: the positional words joined by spaces, else --prompt, else the --file contents,
// else all of stdin. InvalidArgument when more than one source is given.
absl::StatusOr<std::string> ReadPrompt(const std::vector<std::string>& positional,
                                       const std::string& prompt_flag,
                                       const std::string& file_flag);

}  // namespace ridgeserve

#endif  // RIDGESERVE_CLIENT_CLI_PARSING_H_
