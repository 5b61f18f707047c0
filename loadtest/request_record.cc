#include "loadtest/request_record.h"

namespace ridgeserve::loadtest {

const char* PrefillKindName(PrefillKind kind) {
  switch (kind) {
    case PrefillKind::kRidgeFill:
      return "ridgefill";
    case PrefillKind::kSpecPc:
      return "spec_pc";
    case PrefillKind::kSpecKv:
      return "spec_kv";
    case PrefillKind::kExact:
      break;
  }
  return "exact";
}

}  // namespace ridgeserve::loadtest
