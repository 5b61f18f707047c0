// y = x · wᵀ through cuBLASLt for the CUDA backend (Backend::LinearRows): bf16 x and w, f32
// accumulation ("compute 32F"), f32 y; the bias is added after the product by its own kernel.
//
// Batch invariance. cuBLASLt picks kernels (tile shape, split-K, stream-K style reductions) by
// shape, so the same row could get different bits alone and in a batch. Here one algorithm is
// chosen per inner dimension k, ONCE, from cuBLASLt's heuristic at a fixed reference shape
// (kReferenceRows x the reference batch, linear_plan.h) and kept for every later call with that
// k, whatever n, the
// row range or the row count; algorithms with split-K or a reduction scheme are refused. (If
// cuBLASLt refuses that algorithm for some shape, asked once per shape with
// cublasLtMatmulAlgoCheck on the host, calls of that shape take their own, with a warning on
// stderr naming k: the property then does not hold for that k.) With
// one kernel, each output element is one fixed K-loop over the same k, so a row's result is
// expected not to depend on n or its place in x. That is an expectation about cuBLASLt's
// kernels, not a documented guarantee: tests/gpu/cuda_ops_test.cc measures it (a row alone vs
// in batches of several sizes, bitwise) and the README states what was measured.
#ifndef RIDGESERVE_KERNELS_CUDA_LINEAR_H_
#define RIDGESERVE_KERNELS_CUDA_LINEAR_H_

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>

#include "absl/status/statusor.h"
#include "kernels/cuda/linear_plan.h"

namespace ridgeserve::cuda {

// cuBLASLt workspace, fixed so the heuristic's answer cannot change with free memory.
inline constexpr size_t kGemmWorkspaceBytes = size_t{32} << 20;

class CublasLinear {
 public:
  // `workspace` is `workspace_bytes` of device memory owned by the caller (the backend:
  // kGemmWorkspaceBytes; 0 and nullptr allow only algorithms that need none);
  // `reference_n` the batch of the heuristic's reference shape (GemmReferenceN).
  static absl::StatusOr<std::unique_ptr<CublasLinear>> Create(void* workspace,
                                                              size_t workspace_bytes,
                                                              cudaStream_t stream,
                                                              int64_t reference_n);
  ~CublasLinear();
  CublasLinear(const CublasLinear&) = delete;
  CublasLinear& operator=(const CublasLinear&) = delete;

  // y[n, rows] (rows `ldy` apart, ldy >= rows) = x[n, k] · w[rows, k]ᵀ; x and w bf16 (as
  // uint16_t bits), rows k apart. Pointers 16-byte aligned and k a multiple of 8 (checked).
  void Run(const uint16_t* x, int32_t n, const uint16_t* w, int64_t rows, int64_t k, float* y,
           int64_t ldy);

  // The algorithm used for inner dimension k, chosen on first use (ReserveOps asks for every
  // k of the model at the start, so a k without one fails the start, not a request).
  absl::StatusOr<cublasLtMatmulAlgo_t> AlgorithmFor(int64_t k);

 private:
  CublasLinear(cublasLtHandle_t handle, void* workspace, size_t workspace_bytes,
               cudaStream_t stream, int64_t reference_n);
  // cuBLASLt's first algorithm for this shape with one pass over k (no split-K, no reduction),
  // with the workspace it needs.
  absl::StatusOr<cublasLtMatmulHeuristicResult_t> Heuristic(int64_t rows, int64_t n, int64_t k,
                                                            int64_t ldy);
  // The algorithm for a call of this shape (a, b, c its layouts): AlgorithmFor(k) where
  // cuBLASLt takes it with a workspace within ours, else FallBack's; decided on the shape's
  // first call and kept.
  absl::StatusOr<cublasLtMatmulAlgo_t> AlgorithmForShape(int64_t rows, int64_t n, int64_t k,
                                                         int64_t ldy, cublasLtMatrixLayout_t a,
                                                         cublasLtMatrixLayout_t b,
                                                         cublasLtMatrixLayout_t c);

  cublasLtHandle_t handle_;
  cublasLtMatmulDesc_t desc_ = nullptr;
  void* workspace_;
  size_t workspace_bytes_;
  cudaStream_t stream_;
  int64_t reference_n_;
  // The shape's own Heuristic, kept for it from now on, with a warning (once per k) saying
  // `why` the per-k algorithm is not used.
  absl::StatusOr<cublasLtMatmulAlgo_t> FallBack(int64_t rows, int64_t n, int64_t k, int64_t ldy,
                                                const std::string& why);

  std::map<int64_t, cublasLtMatmulAlgo_t> algorithms_;  // by k
  // By (rows, n, k, ldy), every shape called so far.
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t>, cublasLtMatmulAlgo_t> shapes_;
  std::set<int64_t> warned_;  // k that fell back to a per-shape one
};

}  // namespace ridgeserve::cuda

#endif  // RIDGESERVE_KERNELS_CUDA_LINEAR_H_
