// Helpers of the GPU tests: skip without a device, copy vectors to and from a backend, error
// measures. Tests use the Backend interface only, so the same code feeds the CPU reference.
#ifndef RIDGESERVE_TESTS_GPU_GPU_TEST_UTIL_H_
#define RIDGESERVE_TESTS_GPU_GPU_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string_view>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"

// Ends the test as SKIPPED (ctest shows it skipped, not passed) on a machine without a GPU; as
// FAILED, with the reason, where RIDGESERVE_REQUIRE_GPU=1 says there must be one (run.sh).
#define RS_REQUIRE_CUDA_DEVICE()                                               \
  do {                                                                         \
    if (::ridgeserve::CudaDeviceCount() == 0) {                                \
      if (::ridgeserve::testing::GpuRequired()) {                              \
        GTEST_FAIL() << "RIDGESERVE_REQUIRE_GPU=1, but "                       \
                     << ::ridgeserve::CreateCudaBackend(0).status().message(); \
      }                                                                        \
      GTEST_SKIP() << "no CUDA device visible: GPU test skipped";              \
    }                                                                          \
  } while (0)

namespace ridgeserve::testing {

inline bool GpuRequired() {
  const char* required = std::getenv("RIDGESERVE_REQUIRE_GPU");
  return required != nullptr && std::string_view(required) == "1";
}

// A copy of `v` in `backend`'s memory.
template <typename T>
DeviceBuffer Upload(Backend& backend, const std::vector<T>& v) {
  absl::StatusOr<DeviceBuffer> buffer = backend.Alloc(sizeof(T) * std::max<size_t>(v.size(), 1));
  EXPECT_TRUE(buffer.ok()) << buffer.status();
  if (!v.empty()) backend.CopyToDevice(buffer->as<void>(), v.data(), sizeof(T) * v.size());
  return std::move(*buffer);
}

template <typename T>
std::vector<T> Download(Backend& backend, const DeviceBuffer& buffer, size_t n) {
  std::vector<T> v(n);
  if (n > 0) backend.CopyToHost(v.data(), buffer.as<void>(), sizeof(T) * n);
  return v;
}

// `n` elements of an activation op's output (RmsNorm, SwiGlu, Attention) from `backend`'s
// memory as floats: its Backend::ActivationDType, f32 or bf16 (widened exactly).
inline std::vector<float> DownloadActivations(Backend& backend, const DeviceBuffer& buffer,
                                              size_t n) {
  const DType type = backend.ActivationDType();
  const std::vector<uint8_t> bytes = Download<uint8_t>(backend, buffer, ElementBytes(type) * n);
  std::vector<float> v(n);
  EXPECT_TRUE(DequantizeRow(type, bytes.data(), static_cast<int64_t>(n), v.data()).ok());
  return v;
}

// Room for `n` activation op outputs, each reading as NaN until written (all bits set is a NaN
// in f32 and in bf16).
inline DeviceBuffer UnwrittenActivations(Backend& backend, size_t n) {
  return Upload(backend, std::vector<uint8_t>(sizeof(float) * n, 0xFF));
}

// Infinite where either side holds a NaN (an output left unwritten reads as one where a test
// fills its outputs with NaN first) or the sizes differ.
inline double MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = a.size() == b.size() ? 0.0 : INFINITY;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    const double d = std::abs(double{a[i]} - double{b[i]});
    if (std::isnan(d)) return INFINITY;
    worst = std::max(worst, d);
  }
  return worst;
}

// NaN where `a` holds one: a bound made from it fails every comparison.
inline double MaxAbs(const std::vector<float>& a) {
  double m = 0.0;
  for (float x : a) {
    if (std::isnan(x)) return NAN;
    m = std::max(m, std::abs(double{x}));
  }
  return m;
}

// Every CUDA test makes its own backend; nullptr (and the test skips) without a device.
inline std::unique_ptr<Backend> MakeCudaBackend() {
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateCudaBackend(0);
  EXPECT_TRUE(backend.ok()) << backend.status();
  return backend.ok() ? std::move(*backend) : nullptr;
}

}  // namespace ridgeserve::testing

#endif  // RIDGESERVE_TESTS_GPU_GPU_TEST_UTIL_H_
