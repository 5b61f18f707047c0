// Early-return helpers for absl::Status / absl::StatusOr.
#ifndef RIDGESERVE_ENGINE_COMMON_STATUS_MACROS_H_
#define RIDGESERVE_ENGINE_COMMON_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define RS_STATUS_CONCAT_INNER(a, b) a##b
#define RS_STATUS_CONCAT(a, b) RS_STATUS_CONCAT_INNER(a, b)

// Returns the status from the enclosing function when `expr` is not OK.
#define RS_RETURN_IF_ERROR(expr)                                \
  do {                                                          \
    if (::absl::Status rs_status_ = (expr); !rs_status_.ok()) { \
      return rs_status_;                                        \
    }                                                           \
  } while (0)

// `lhs = value of expr`, or returns its status when not OK.
#define RS_ASSIGN_OR_RETURN(lhs, expr) \
  RS_ASSIGN_OR_RETURN_IMPL(RS_STATUS_CONCAT(rs_statusor_, __LINE__), lhs, expr)
#define RS_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.ok()) return tmp.status();            \
  lhs = std::move(*tmp)

#endif  // RIDGESERVE_ENGINE_COMMON_STATUS_MACROS_H_
