// Which cuBLASLt algorithm the CUDA Linear (kernels/cuda/linear.h) keeps for each inner
// dimension k, as plain host code: the shape its heuristic is asked about. One algorithm per k,
// whatever the shape it was chosen at, so a row's bits do not depend on the batch either way.
//
// RIDGESERVE_CUDA_GEMM_REFERENCE_N sets the reference batch (default kReferenceN). cuBLASLt
// answers a large batch with large tiles, which suit prefill; a decode step of a few rows then
// runs on rows / tile-rows CTAs, which may leave SMs idle. A smaller reference batch gives
// smaller tiles (more CTAs at decode, less reuse at prefill): tests/gpu/run.sh times both.
#ifndef RIDGESERVE_KERNELS_CUDA_LINEAR_PLAN_H_
#define RIDGESERVE_KERNELS_CUDA_LINEAR_PLAN_H_

#include <cstdint>

#include "absl/status/statusor.h"

namespace ridgeserve::cuda {

// The heuristic's reference shape: rows of a large projection, and a prefill-sized batch (an
// algorithm for n = 1 would be a split-K or GEMV kernel, which a batch cannot share).
inline constexpr int64_t kReferenceRows = 4096;
inline constexpr int64_t kReferenceN = 256;

// The reference batch for RIDGESERVE_CUDA_GEMM_REFERENCE_N = `env_value` (null or empty: the
// default); InvalidArgument naming the variable unless it is an integer in [1, 65536].
absl::StatusOr<int64_t> GemmReferenceN(const char* env_value);

}  // namespace ridgeserve::cuda

#endif  // RIDGESERVE_KERNELS_CUDA_LINEAR_PLAN_H_
