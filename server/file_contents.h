// Whole small files (token lists, PEM certificates and keys) read at startup or on SIGHUP.
#ifndef RIDGESERVE_SERVER_FILE_CONTENTS_H_
#define RIDGESERVE_SERVER_FILE_CONTENTS_H_

#include <string>

#include "absl/status/statusor.h"

namespace ridgeserve {

// The bytes of `path`, or InvalidArgument "PATH: cannot read it (REASON)".
absl::StatusOr<std::string> ReadFileContents(const std::string& path);

}  // namespace ridgeserve

#endif  // RIDGESERVE_SERVER_FILE_CONTENTS_H_
