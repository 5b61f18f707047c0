#include "kernels/cuda/linear.h"

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_check.h"

namespace ridgeserve::cuda {
namespace {

constexpr uint32_t kAlignmentBytes = 16;
constexpr int kHeuristicResults = 64;

// Column-major views of the row-major problem: Yᵀ [rows, n] = W [rows, k] · Xᵀ [k, n], with W
// read as the column-major [k, rows] matrix transposed (op T) and X as column-major [k, n].
struct Layouts {
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  ~Layouts() {
    if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
    if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
    if (c != nullptr) cublasLtMatrixLayoutDestroy(c);
  }
  absl::Status Init(int64_t rows, int64_t n, int64_t k, int64_t ldy) {
    CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, k, rows, k));
    CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, k, n, k));
    CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&c, CUDA_R_32F, rows, n, ldy));
    return absl::OkStatus();
  }
};

template <typename T>
T AlgoConfig(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attr) {
  T value{};
  size_t written = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &value, sizeof(value), &written) !=
      CUBLAS_STATUS_SUCCESS) {
    return T{};
  }
  return value;
}

}  // namespace

absl::StatusOr<std::unique_ptr<CublasLinear>> CublasLinear::Create(void* workspace,
                                                                   size_t workspace_bytes,
                                                                   cudaStream_t stream,
                                                                   int64_t reference_n) {
  cublasLtHandle_t handle = nullptr;
  CUBLAS_RETURN_IF_ERROR(cublasLtCreate(&handle));
  std::unique_ptr<CublasLinear> linear(
      new CublasLinear(handle, workspace, workspace_bytes, stream, reference_n));
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&linear->desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t transa = CUBLAS_OP_T, transb = CUBLAS_OP_N;
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(linear->desc_, CUBLASLT_MATMUL_DESC_TRANSA,
                                                        &transa, sizeof(transa)));
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(linear->desc_, CUBLASLT_MATMUL_DESC_TRANSB,
                                                        &transb, sizeof(transb)));
  return linear;
}

CublasLinear::CublasLinear(cublasLtHandle_t handle, void* workspace, size_t workspace_bytes,
                           cudaStream_t stream, int64_t reference_n)
    : handle_(handle),
      workspace_(workspace),
      workspace_bytes_(workspace_bytes),
      stream_(stream),
      reference_n_(reference_n) {}

CublasLinear::~CublasLinear() {
  if (desc_ != nullptr) cublasLtMatmulDescDestroy(desc_);
  cublasLtDestroy(handle_);
}

absl::StatusOr<cublasLtMatmulHeuristicResult_t> CublasLinear::Heuristic(int64_t rows, int64_t n,
                                                                        int64_t k, int64_t ldy) {
  Layouts layouts;
  if (absl::Status s = layouts.Init(rows, n, k, ldy); !s.ok()) return s;
  cublasLtMatmulPreference_t pref = nullptr;
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&pref));
  const size_t workspace_bytes = workspace_bytes_;
  const uint32_t alignment = kAlignmentBytes, reductions = CUBLASLT_REDUCTION_SCHEME_NONE;
  cublasLtMatmulHeuristicResult_t results[kHeuristicResults] = {};
  int found = 0;
  cublasStatus_t status = cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes, sizeof(workspace_bytes));
  // Only algorithms without a reduction in the ranking (the filter below still checks).
  if (status == CUBLAS_STATUS_SUCCESS) {
    status = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                                  &reductions, sizeof(reductions));
  }
  for (auto attr :
       {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
    if (status == CUBLAS_STATUS_SUCCESS) {
      status = cublasLtMatmulPreferenceSetAttribute(pref, attr, &alignment, sizeof(alignment));
    }
  }
  if (status == CUBLAS_STATUS_SUCCESS) {
    status = cublasLtMatmulAlgoGetHeuristic(handle_, desc_, layouts.a, layouts.b, layouts.c,
                                            layouts.c, pref, kHeuristicResults, results, &found);
  }
  cublasLtMatmulPreferenceDestroy(pref);
  if (status != CUBLAS_STATUS_SUCCESS) {
    return CublasError(status, "cublasLtMatmulAlgoGetHeuristic", __FILE__, __LINE__);
  }
  for (int i = 0; i < found; ++i) {
    if (results[i].state != CUBLAS_STATUS_SUCCESS) continue;
    const cublasLtMatmulAlgo_t& algo = results[i].algo;
    // One kernel and one pass over k: no split-K partial sums, no separate reduction.
    if (AlgoConfig<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM) > 1) continue;
    if (AlgoConfig<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME) !=
        CUBLASLT_REDUCTION_SCHEME_NONE) {
      continue;
    }
    return results[i];
  }
  return absl::UnimplementedError(absl::StrCat("cuBLASLt offers no bf16 GEMM without split-K for [",
                                               rows, " x ", k, "] x [", k, " x ", n, "] (", found,
                                               " candidates)"));
}

absl::StatusOr<cublasLtMatmulAlgo_t> CublasLinear::AlgorithmFor(int64_t k) {
  if (auto it = algorithms_.find(k); it != algorithms_.end()) return it->second;
  int64_t reference_n = reference_n_;
  absl::StatusOr<cublasLtMatmulHeuristicResult_t> algo =
      Heuristic(kReferenceRows, reference_n, k, kReferenceRows);
  if (!algo.ok() && reference_n != kReferenceN) {
    // A small reference batch may get only split-K algorithms: the default's, said.
    std::fprintf(stderr,
                 "ridgeserve: no cuBLASLt algorithm without split-K for k = %lld at %lld rows; "
                 "using the one chosen at %lld (%s)\n",
                 static_cast<long long>(k), static_cast<long long>(reference_n_),
                 static_cast<long long>(kReferenceN), std::string(algo.status().message()).c_str());
    reference_n = kReferenceN;
    algo = Heuristic(kReferenceRows, reference_n, k, kReferenceRows);
  }
  if (!algo.ok()) return algo.status();
  algorithms_.emplace(k, algo->algo);
  // Once per k, for reading a run's speed: which kernel every GEMM with this k runs.
  std::fprintf(stderr,
               "ridgeserve: cuBLASLt algorithm for k = %lld (chosen at %lld x %lld rows): id %d, "
               "tile %u, stages %u, CTA swizzling %u, workspace %zu of %zu bytes\n",
               static_cast<long long>(k), static_cast<long long>(kReferenceRows),
               static_cast<long long>(reference_n),
               AlgoConfig<int32_t>(algo->algo, CUBLASLT_ALGO_CONFIG_ID),
               AlgoConfig<uint32_t>(algo->algo, CUBLASLT_ALGO_CONFIG_TILE_ID),
               AlgoConfig<uint32_t>(algo->algo, CUBLASLT_ALGO_CONFIG_STAGES_ID),
               AlgoConfig<uint32_t>(algo->algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING),
               algo->workspaceSize, workspace_bytes_);
  return algo->algo;
}

void CublasLinear::Run(const uint16_t* x, int32_t n, const uint16_t* w, int64_t rows, int64_t k,
                       float* y, int64_t ldy) {
  if (n <= 0 || rows <= 0) return;
  const auto aligned = [](const void* p) {
    return reinterpret_cast<uintptr_t>(p) % kAlignmentBytes == 0;
  };
  if (k % 8 != 0 || ldy % 4 != 0 || !aligned(x) || !aligned(w) || !aligned(y)) {
    Fatal(absl::InvalidArgumentError(absl::StrCat("CUDA Linear: k = ", k, ", ldy = ", ldy,
                                                  " and the pointers must allow 16-byte aligned "
                                                  "rows (k a multiple of 8)")));
  }
  Layouts layouts;
  if (absl::Status s = layouts.Init(rows, n, k, ldy); !s.ok()) Fatal(s);
  absl::StatusOr<cublasLtMatmulAlgo_t> algo =
      AlgorithmForShape(rows, n, k, ldy, layouts.a, layouts.b, layouts.c);
  if (!algo.ok()) Fatal(algo.status());
  const float alpha = 1.0f, beta = 0.0f;
  const auto run = [&](const cublasLtMatmulAlgo_t& with) {
    return cublasLtMatmul(handle_, desc_, &alpha, w, layouts.a, x, layouts.b, &beta, y, layouts.c,
                          y, layouts.c, &with, workspace_, workspace_bytes_, stream_);
  };
  cublasStatus_t status = run(*algo);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED) {
    // The check passed but the GEMM refused (cublasLtMatmulAlgoCheck does not guarantee it
    // runs): the shape's own algorithm from now on.
    absl::StatusOr<cublasLtMatmulAlgo_t> own =
        FallBack(rows, n, k, ldy, "cublasLtMatmul refused it");
    if (!own.ok()) Fatal(own.status());
    status = run(*own);
  }
  if (status != CUBLAS_STATUS_SUCCESS) {
    Fatal(CublasError(status, "cublasLtMatmul", __FILE__, __LINE__));
  }
}

absl::StatusOr<cublasLtMatmulAlgo_t> CublasLinear::FallBack(int64_t rows, int64_t n, int64_t k,
                                                            int64_t ldy, const std::string& why) {
  absl::StatusOr<cublasLtMatmulHeuristicResult_t> own = Heuristic(rows, n, k, ldy);
  if (!own.ok()) return own.status();
  if (warned_.insert(k).second) {
    std::fprintf(stderr,
                 "ridgeserve: cuBLASLt's algorithm for k = %lld does not take [%lld x %lld] x "
                 "n = %lld (%s); using a per-shape one (batch invariance not guaranteed for "
                 "k = %lld)\n",
                 static_cast<long long>(k), static_cast<long long>(rows), static_cast<long long>(k),
                 static_cast<long long>(n), why.c_str(), static_cast<long long>(k));
  }
  shapes_[std::make_tuple(rows, n, k, ldy)] = own->algo;
  return own->algo;
}

absl::StatusOr<cublasLtMatmulAlgo_t> CublasLinear::AlgorithmForShape(int64_t rows, int64_t n,
                                                                     int64_t k, int64_t ldy,
                                                                     cublasLtMatrixLayout_t a,
                                                                     cublasLtMatrixLayout_t b,
                                                                     cublasLtMatrixLayout_t c) {
  const auto key = std::make_tuple(rows, n, k, ldy);
  if (auto it = shapes_.find(key); it != shapes_.end()) return it->second;
  absl::StatusOr<cublasLtMatmulAlgo_t> algo = AlgorithmFor(k);
  if (!algo.ok()) return algo.status();
  // Host-side only (allowed while a graph is recorded, though a recorded shape has run before).
  cublasLtMatmulHeuristicResult_t checked = {};
  const cublasStatus_t status =
      cublasLtMatmulAlgoCheck(handle_, desc_, a, b, c, c, &*algo, &checked);
  if (status != CUBLAS_STATUS_SUCCESS) {
    return FallBack(rows, n, k, ldy,
                    absl::StrCat("cublasLtMatmulAlgoCheck: ", cublasLtGetStatusName(status)));
  }
  if (checked.workspaceSize > workspace_bytes_) {
    return FallBack(rows, n, k, ldy,
                    absl::StrCat("it needs ", checked.workspaceSize, " bytes of workspace, ",
                                 workspace_bytes_, " here"));
  }
  shapes_.emplace(key, *algo);
  return *algo;
}

}  // namespace ridgeserve::cuda
