#include "loadtest/request_record.h"

namespace ridgeserve::loadtest {

const char* PrefillKindName(PrefillKind kind) {
  return kind == PrefillKind::kRidgeFill ? "ridgefill" : "exact";
}

}  // namespace ridgeserve::loadtest
