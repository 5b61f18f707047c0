// Every op of the CUDA backend against the CPU backend (the reference, kernels/cpu) on the
// same random inputs, with the tolerance each op's arithmetic allows (stated per test), and
// the batch invariance of Linear and Attention on the device (a row alone vs in a batch).
// Skipped (not passed) without a GPU.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cuda/attention_plan.h"
#include "kernels/cuda/linear.h"
#include "kernels/cuda/linear_plan.h"
#include "kernels/cuda/reduce_ranks.h"
#include "kernels/dtype.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/kernels/kernel_test_util.h"
#include "tests/kernels/selection_problem.h"

namespace ridgeserve {
namespace {

using ::ridgeserve::testing::Download;
using ::ridgeserve::testing::DownloadActivations;
using ::ridgeserve::testing::FirstBitDifference;
using ::ridgeserve::testing::MaxAbs;
using ::ridgeserve::testing::MaxAbsDiff;
using ::ridgeserve::testing::RandomFloats;
using ::ridgeserve::testing::UnwrittenActivations;
using ::ridgeserve::testing::Upload;

HostTensor F32Tensor(const std::vector<float>& v, int64_t rows, int64_t cols) {
  return HostTensor{reinterpret_cast<const uint8_t*>(v.data()), DType::kF32, rows, cols,
                    sizeof(float) * cols};
}

std::vector<float> RoundedToBf16(std::vector<float> v) {
  for (float& x : v) x = ::ridgeserve::testing::RoundToBFloat16Reference(x);
  return v;
}

class CudaOpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    RS_REQUIRE_CUDA_DEVICE();
    cuda_ = ::ridgeserve::testing::MakeCudaBackend();
    ASSERT_NE(cuda_, nullptr);
    cpu_ = CreateCpuBackend(2);
  }

  // Runs `op` on both backends with the same inputs (host vectors uploaded to each) and
  // returns the two outputs of `out_size` floats: {cpu, cuda}. With `activation_out`, the op
  // writes the backend's ActivationDType (CUDA: bf16, widened here).
  template <typename Op>
  std::pair<std::vector<float>, std::vector<float>> Both(const std::vector<std::vector<float>>& in,
                                                         size_t out_size, Op op,
                                                         bool activation_out = false) {
    std::vector<float> results[2];
    Backend* backends[2] = {cpu_.get(), cuda_.get()};
    for (int b = 0; b < 2; ++b) {
      std::vector<DeviceBuffer> inputs;
      std::vector<float*> ptrs;
      for (const auto& v : in) {
        inputs.push_back(Upload(*backends[b], v));
        ptrs.push_back(inputs.back().as<float>());
      }
      DeviceBuffer out = Upload(*backends[b], std::vector<float>(out_size, 0.0f));
      op(*backends[b], ptrs, out.as<float>());
      results[b] = activation_out ? DownloadActivations(*backends[b], out, out_size)
                                  : Download<float>(*backends[b], out, out_size);
    }
    return {results[0], results[1]};
  }

  std::unique_ptr<Backend> cpu_;
  std::unique_ptr<Backend> cuda_;
};

// An activation op's CUDA output (bf16) against the CPU's (f32), whose f32 values differ by at
// most `f32_rel` of |cpu|: every element is the CPU's rounded to bf16 (RoundToBFloat16Reference),
// or next to it where the two f32 values straddle a rounding boundary, which at a few f32 ulps
// apart is rare: at least 99% of the elements are exactly bf16(cpu).
void ExpectBf16OfCpu(const std::vector<float>& cpu, const std::vector<float>& gpu, double f32_rel) {
  ASSERT_EQ(cpu.size(), gpu.size());
  size_t exact = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    const float want = ::ridgeserve::testing::RoundToBFloat16Reference(cpu[i]);
    exact += gpu[i] == want;
    // bf16 keeps 8 significant bits: rounding moves a value by at most 2^-8 of itself.
    ASSERT_LE(std::abs(double{gpu[i]} - cpu[i]), (f32_rel + 0x1p-8) * std::abs(cpu[i])) << i;
  }
  EXPECT_GE(exact, cpu.size() * 99 / 100);
  std::printf("[ measured ] %zu of %zu elements are bf16 of the CPU's exactly\n", exact,
              cpu.size());
}

// Same arithmetic as the CPU but for the order of the double sum of squares: the float scale
// almost always rounds the same, so 1 ulp of the f32 result (2^-23 relative) bounds the
// difference before the bf16 store.
TEST_F(CudaOpsTest, RmsNormMatchesCpu) {
  const int32_t n = 7, dim = 576;
  const auto x = RandomFloats(n * dim, 1, -3.0f, 3.0f);
  const auto w = RandomFloats(dim, 2, 0.5f, 1.5f);
  auto [cpu, gpu] = Both(
      {x, w}, n * dim,
      [&](Backend& b, auto& p, float* out) { b.RmsNorm(p[0], p[1], n, dim, 1e-5f, out); },
      /*activation_out=*/true);
  ExpectBf16OfCpu(cpu, gpu, 2.4e-7);
}

TEST_F(CudaOpsTest, RmsNormHeadsMatchesCpu) {
  const int32_t n = 5, heads = 3, hd = 64, ld = heads * hd + 32;
  const auto x = RandomFloats(n * ld, 3, -2.0f, 2.0f);
  const auto w = RandomFloats(hd, 4, 0.5f, 1.5f);
  auto [cpu, gpu] = Both({x, w}, n * ld, [&](Backend& b, auto& p, float* out) {
    b.CopyToDevice(out, x.data(), sizeof(float) * x.size());
    b.RmsNormHeads(out, ld, n, heads, hd, p[1], 1e-6f);
  });
  EXPECT_LE(MaxAbsDiff(cpu, gpu), 2.4e-7 * MaxAbs(cpu));
}

// theta is one float product on both; cos/sin in double rounded to float: CUDA's and glibc's
// double results differ by at most an ulp of double, which changes the float only at a
// rounding boundary. So outputs agree to a few float ulps of |x| (~1).
TEST_F(CudaOpsTest, RopeMatchesCpu) {
  const int32_t n = 6, heads = 4, hd = 64, ld = heads * hd + 16;
  const auto x = RandomFloats(n * ld, 5);
  std::vector<float> inv_freq(hd / 2);
  for (int j = 0; j < hd / 2; ++j) inv_freq[j] = std::pow(10000.0f, -2.0f * j / hd);
  const std::vector<int32_t> pos = {0, 1, 17, 255, 4097, 8191};
  std::vector<float> results[2];
  Backend* backends[2] = {cpu_.get(), cuda_.get()};
  for (int b = 0; b < 2; ++b) {
    DeviceBuffer xd = Upload(*backends[b], x), fd = Upload(*backends[b], inv_freq),
                 pd = Upload(*backends[b], pos);
    backends[b]->Rope(xd.as<float>(), ld, n, heads, hd, pd.as<int32_t>(), fd.as<float>());
    results[b] = Download<float>(*backends[b], xd, x.size());
  }
  EXPECT_LE(MaxAbsDiff(results[0], results[1]), 4.8e-7);
}

// CUDA's expf and the CPU's vector exp are each within 2 ulp: a few ulps of the f32 result
// before the bf16 store.
TEST_F(CudaOpsTest, SwiGluMatchesCpu) {
  const int32_t n = 9, ff = 1536;
  const auto gu = RandomFloats(n * 2 * ff, 6, -8.0f, 8.0f);
  auto [cpu, gpu] = Both(
      {gu}, n * ff, [&](Backend& b, auto& p, float* out) { b.SwiGlu(p[0], n, ff, out); },
      /*activation_out=*/true);
  ExpectBf16OfCpu(cpu, gpu, 1e-6);
}

TEST_F(CudaOpsTest, AddAndGatherRowsAreExact) {
  const auto x = RandomFloats(1000, 7), y = RandomFloats(1000, 8);
  auto [cpu, gpu] = Both({x, y}, 1000, [&](Backend& b, auto& p, float* out) {
    b.Add(p[0], p[1], 1000);
    b.CopyToDevice(out, x.data(), 0);
    b.GatherRows(p[0], 100, nullptr, 0, out);  // n = 0: nothing
    std::vector<int32_t> idx = {3, 0, 9, 9, 1, 2, 4, 5, 6, 7};
    DeviceBuffer id = Upload(b, idx);
    b.GatherRows(p[0], 100, id.as<int32_t>(), 10, out);
  });
  EXPECT_TRUE(::ridgeserve::testing::BitwiseEqual(cpu, gpu));
}

// CopyColumns moves a block between strides (rank 0's gather of the logits at TP > 1).
TEST_F(CudaOpsTest, CopyColumnsIsExact) {
  const auto src = RandomFloats(6 * 50, 9);
  auto [cpu, gpu] = Both({src}, 6 * 64, [&](Backend& b, auto& p, float* out) {
    b.CopyColumns(p[0] + 3, 50, 6, 40, out + 7, 64);
  });
  EXPECT_TRUE(::ridgeserve::testing::BitwiseEqual(cpu, gpu));
}

// RidgeFill's leverage: the same double products, summed in another fixed order (lanes, then a
// butterfly): within dim double ulps of the terms' magnitude, and bitwise reproducible.
TEST_F(CudaOpsTest, ShiftedRowDotsMatchCpu) {
  const int32_t n = 37, dim = 4096;
  const auto a = RandomFloats(size_t(n) * dim, 10, -4.0f, 4.0f);
  const auto b = RandomFloats(size_t(n) * dim, 11, -4.0f, 4.0f);
  const auto shift = RandomFloats(dim, 12);
  std::vector<double> results[2];
  Backend* backends[2] = {cpu_.get(), cuda_.get()};
  for (int k = 0; k < 2; ++k) {
    DeviceBuffer da = Upload(*backends[k], a), db = Upload(*backends[k], b);
    DeviceBuffer ds = Upload(*backends[k], shift);
    DeviceBuffer out = *backends[k]->Alloc(sizeof(double) * n);
    backends[k]->ShiftedRowDots(da.as<float>(), ds.as<float>(), db.as<float>(), n, dim,
                                out.as<double>());
    results[k] = Download<double>(*backends[k], out, n);
  }
  for (int32_t i = 0; i < n; ++i) {
    double magnitude = 0;
    for (int32_t j = 0; j < dim; ++j) {
      magnitude += std::abs((double(a[i * dim + j]) - shift[j]) * b[i * dim + j]);
    }
    EXPECT_NEAR(results[1][i], results[0][i], magnitude * dim * 0x1p-52) << i;
  }
}

// One float subtraction an element on both: bitwise equal, a vector far from the rows' values.
TEST_F(CudaOpsTest, ShiftRowsIsBitwiseCpu) {
  const int32_t n = 37, dim = 4096;
  const auto a = RandomFloats(size_t(n) * dim, 13, -4.0f, 4.0f);
  const auto shift = RandomFloats(dim, 14, 100.0f, 200.0f);
  std::vector<float> results[2];
  Backend* backends[2] = {cpu_.get(), cuda_.get()};
  for (int k = 0; k < 2; ++k) {
    DeviceBuffer da = Upload(*backends[k], a), ds = Upload(*backends[k], shift);
    DeviceBuffer out = *backends[k]->Alloc(sizeof(float) * a.size());
    backends[k]->ShiftRows(da.as<float>(), ds.as<float>(), n, dim, out.as<float>());
    results[k] = Download<float>(*backends[k], out, a.size());
  }
  EXPECT_TRUE(::ridgeserve::testing::BitwiseEqual(results[0], results[1]));
}

// StoreKv narrows with round to nearest even on both: bitwise equal caches, every dtype.
TEST_F(CudaOpsTest, StoreKvIsBitwiseCpu) {
  const int32_t kv_heads = 3, hd = 64, width = kv_heads * hd, ld = width * 3, n = 5;
  const int32_t blocks = 4, block_size = 16;
  auto k = RandomFloats(n * ld, 9, -70000.0f, 70000.0f);  // f16 overflow to inf included
  auto v = RandomFloats(n * ld, 10, -1e-6f, 1e-6f);       // f16 subnormals
  const std::vector<int32_t> slots = {0, 63, 17, 18, 40};
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    const size_t bytes = ElementBytes(dtype) * blocks * block_size * width;
    std::vector<uint8_t> caches[2][2];
    Backend* backends[2] = {cpu_.get(), cuda_.get()};
    for (int b = 0; b < 2; ++b) {
      DeviceBuffer kc = Upload(*backends[b], std::vector<uint8_t>(bytes, 0)),
                   vc = Upload(*backends[b], std::vector<uint8_t>(bytes, 0));
      DeviceBuffer kd = Upload(*backends[b], k), vd = Upload(*backends[b], v),
                   sd = Upload(*backends[b], slots);
      KvLayerView view{kc.as<uint8_t>(), vc.as<uint8_t>(), dtype, blocks, block_size, kv_heads, hd};
      backends[b]->StoreKv(view, kd.as<float>(), vd.as<float>(), ld, n, sd.as<int32_t>());
      caches[b][0] = Download<uint8_t>(*backends[b], kc, bytes);
      caches[b][1] = Download<uint8_t>(*backends[b], vc, bytes);
    }
    EXPECT_EQ(caches[0][0], caches[1][0]) << KvCacheDTypeName(dtype);
    EXPECT_EQ(caches[0][1], caches[1][1]) << KvCacheDTypeName(dtype);
  }
}

// A table of bf16-representable values: Embed is exact on both, and ids outside the table's
// rows (a vocabulary-parallel rank's) give zeros.
TEST_F(CudaOpsTest, EmbedIsExactForBf16Values) {
  const int64_t rows = 50, dim = 64;
  const auto table = RoundedToBf16(RandomFloats(rows * dim, 11));
  // With id_begin 10 the table holds ids 10..59: 9 and 100 are another rank's (zeros).
  const std::vector<int32_t> ids = {10, 59, 9, 100, 30};
  const int64_t id_begin = 10;
  std::vector<float> results[2];
  Backend* backends[2] = {cpu_.get(), cuda_.get()};
  for (int b = 0; b < 2; ++b) {
    const HostTensor t = F32Tensor(table, rows, dim);
    absl::StatusOr<Weight> w = backends[b]->PackWeight({&t, 1});
    ASSERT_TRUE(w.ok()) << w.status();
    DeviceBuffer id = Upload(*backends[b], ids);
    DeviceBuffer out = Upload(*backends[b], std::vector<float>(ids.size() * dim, -1.0f));
    backends[b]->Embed(*w, id_begin, id.as<int32_t>(), ids.size(), out.as<float>());
    results[b] = Download<float>(*backends[b], out, ids.size() * dim);
  }
  EXPECT_TRUE(::ridgeserve::testing::BitwiseEqual(results[0], results[1]));
  EXPECT_EQ(results[1][2 * dim], 0.0f);  // id 9 < id_begin
}

// PackWeight keeps bf16(DequantizeRow(x)): UnpackWeight gives the CPU's unpacked values rounded
// to bf16, exactly, for a float type, a half type, bf16 (copied as it is, from rows 144 bytes
// apart) and a block-quantized type, with parts stacked.
TEST_F(CudaOpsTest, PackWeightIsBf16OfDequantizedRows) {
  const int64_t cols = 64;
  const auto f32 = RandomFloats(3 * cols, 12);
  std::vector<uint16_t> f16(5 * cols);
  for (size_t i = 0; i < f16.size(); ++i) f16[i] = FloatToHalf(0.01f * float(i % 97) - 0.4f);
  // Q8_0: blocks of an f16 scale and 32 int8.
  std::vector<uint8_t> q8(4 * (cols / 32) * 34);
  std::mt19937 rng(13);
  for (size_t b = 0; b < q8.size() / 34; ++b) {
    const uint16_t d = FloatToHalf(0.001f * float(1 + b));
    std::memcpy(&q8[b * 34], &d, 2);
    for (int e = 0; e < 32; ++e) q8[b * 34 + 2 + e] = static_cast<uint8_t>(rng());
  }
  const size_t bf16_pitch = 2 * cols + 16;  // bytes: 8 elements a row unused
  std::vector<uint16_t> bf16(2 * bf16_pitch / sizeof(uint16_t));
  for (size_t i = 0; i < bf16.size(); ++i) bf16[i] = static_cast<uint16_t>(0x3c00 + 37 * i);
  const HostTensor parts[4] = {
      F32Tensor(f32, 3, cols),
      {reinterpret_cast<const uint8_t*>(f16.data()), DType::kF16, 5, cols, 2 * cols},
      {reinterpret_cast<const uint8_t*>(bf16.data()), DType::kBF16, 2, cols, bf16_pitch},
      {q8.data(), DType::kQ8_0, 4, cols, (cols / 32) * 34}};
  absl::StatusOr<Weight> wc = cpu_->PackWeight(parts), wg = cuda_->PackWeight(parts);
  ASSERT_TRUE(wc.ok() && wg.ok());
  ASSERT_EQ(wg->rows(), 14);
  EXPECT_EQ(wg->bytes(), size_t{14} * cols * 2);
  std::vector<float> c(14 * cols), g(14 * cols);
  ASSERT_TRUE(cpu_->UnpackWeight(*wc, 0, 14, c.data()).ok());
  ASSERT_TRUE(cuda_->UnpackWeight(*wg, 0, 14, g.data()).ok());
  EXPECT_TRUE(::ridgeserve::testing::BitwiseEqual(RoundedToBf16(c), g));
  EXPECT_EQ(cuda_->UnpackWeight(*wg, 12, 3, g.data()).code(), absl::StatusCode::kOutOfRange);
  const HostTensor bad{nullptr, DType::kI32, 1, cols, 4 * cols};
  EXPECT_EQ(cuda_->PackWeight({&bad, 1}).status().code(), absl::StatusCode::kUnimplemented);
  // A width the GEMMs cannot take is refused at the load, naming it.
  const HostTensor narrow = F32Tensor(f32, 3, 60);
  const absl::Status refused = cuda_->PackWeight({&narrow, 1}).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("60 columns"), std::string::npos) << refused;
}

// A weight of several staging chunks lands whole and in order: Q8_0 [2500, 4096] and
// [500, 4096] parts (1024 bf16 rows a chunk: chunks of 1024, 1024, 452 and 500 rows, through
// both halves of the staging and back, each half refilled only after its upload).
TEST_F(CudaOpsTest, PackWeightOfSeveralChunksIsBf16OfDequantizedRows) {
  const int64_t cols = 4096;
  const size_t row_bytes = (cols / 32) * 34;
  std::vector<uint8_t> q8(3000 * row_bytes);
  std::mt19937 rng(29);
  for (uint8_t& b : q8) b = static_cast<uint8_t>(rng());
  for (size_t b = 0; b < q8.size(); b += 34) {
    const uint16_t d = FloatToHalf(0.001f * float(1 + (b / 34) % 50));
    std::memcpy(&q8[b], &d, 2);
  }
  const HostTensor parts[2] = {{q8.data(), DType::kQ8_0, 2500, cols, row_bytes},
                               {q8.data() + 2500 * row_bytes, DType::kQ8_0, 500, cols, row_bytes}};
  absl::StatusOr<Weight> wc = cpu_->PackWeight(parts), wg = cuda_->PackWeight(parts);
  ASSERT_TRUE(wc.ok() && wg.ok());
  ASSERT_EQ(wg->rows(), 3000);
  std::vector<float> c(3000 * cols), g(3000 * cols);
  ASSERT_TRUE(cpu_->UnpackWeight(*wc, 0, 3000, c.data()).ok());
  ASSERT_TRUE(cuda_->UnpackWeight(*wg, 0, 3000, g.data()).ok());
  EXPECT_TRUE(::ridgeserve::testing::BitwiseEqual(RoundedToBf16(c), g));
}

TEST_F(CudaOpsTest, AllocFailureIsResourceExhaustedNamingBytes) {
  const size_t huge = size_t{1} << 50;
  absl::StatusOr<DeviceBuffer> b = cuda_->Alloc(huge);
  ASSERT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(b.status().message().find("1125899906842624"), std::string::npos) << b.status();
  absl::StatusOr<DeviceBuffer> ok = cuda_->Alloc(1024);  // the error did not stick
  EXPECT_TRUE(ok.ok()) << ok.status();
}

// Linear against the CPU on the same bf16-rounded x and w (so only the GEMM's f32 accumulation
// differs): |Δ| <= 2^-17 * Σ_k |x_k w_k|. The products are exact in f32; the sums differ in
// order and, on tensor cores, in rounding (each k-block's partial sum may be truncated, a bias
// of up to ~1 ulp of the running sum per block: 96 blocks at k = 1536 is ~1e-4 of |y| ~ 50,
// 2^-17 * Σ|x w| ~ 3e-3 there). A wrong element is off by O(|y|). The unrounded comparison,
// what the model sees, is bounded by bf16 rounding of both factors: 2 * 2^-8 * Σ|x w|.
TEST_F(CudaOpsTest, LinearMatchesCpuOnBf16Inputs) {
  // 62 and 1001 output widths: computed through the padded scratch, 300 rows in two GEMMs.
  for (auto [n, rows, k] :
       {std::tuple{1, 960, 576}, std::tuple{37, 1536, 576}, std::tuple{5, 576, 1536},
        std::tuple{3, 62, 64}, std::tuple{300, 62, 64}, std::tuple{300, 1001, 64}}) {
    const auto x = RandomFloats(n * k, 14 + n);
    const auto w = RandomFloats(rows * k, 15 + rows);
    const auto bias = RandomFloats(rows, 16);
    const auto xr = RoundedToBf16(x), wr = RoundedToBf16(w);
    std::vector<float> out[3];
    for (int b = 0; b < 3; ++b) {
      Backend& be = b == 0 ? *cpu_ : *cuda_;
      const auto& xs = b == 0 ? xr : b == 1 ? x : xr;
      const HostTensor t = F32Tensor(b == 0 ? wr : w, rows, k);
      absl::StatusOr<Weight> pw = be.PackWeight({&t, 1});
      ASSERT_TRUE(pw.ok()) << pw.status();
      DeviceBuffer xd = Upload(be, xs), bd = Upload(be, bias),
                   yd = Upload(be, std::vector<float>(n * rows));
      be.Linear(xd.as<float>(), n, *pw, bd.as<float>(), yd.as<float>());
      out[b] = Download<float>(be, yd, n * rows);
    }
    EXPECT_TRUE(::ridgeserve::testing::BitwiseEqual(out[1], out[2]))
        << "x is rounded to bf16 on the device exactly as the reference rounds it";
    for (int i = 0; i < n; ++i) {
      for (int j = 0; j < rows; ++j) {
        double mag = 0;
        for (int e = 0; e < k; ++e) mag += std::abs(double{xr[i * k + e]} * wr[j * k + e]);
        ASSERT_NEAR(out[0][i * rows + j], out[1][i * rows + j], 0x1p-17 * mag + 1e-6)
            << "n " << n << " rows " << rows << " k " << k << " at " << i << ", " << j;
      }
    }
  }
}

// bf16 bits of each value (rounded to nearest even).
std::vector<uint16_t> Bf16Bits(const std::vector<float>& v) {
  std::vector<uint16_t> bits(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const float r = ::ridgeserve::testing::RoundToBFloat16Reference(v[i]);
    uint32_t u = 0;
    std::memcpy(&u, &r, sizeof(u));
    bits[i] = static_cast<uint16_t>(u >> 16);
  }
  return bits;
}

// The model hands Linear bf16 rows (Backend::ActivationDType: RmsNorm, SwiGlu and Attention
// store them); other callers f32 rows, which Linear rounds first. The same values either way
// give bitwise the same y: through the direct GEMM, the padded-width scratch (62, 1001 wide) and
// a row range.
TEST_F(CudaOpsTest, LinearOnBf16RowsEqualsLinearOnTheirF32Values) {
  ASSERT_EQ(cuda_->ActivationDType(), DType::kBF16);
  for (auto [n, rows, k, begin, count] :
       {std::tuple{1, 960, 576, 0, 960}, std::tuple{37, 1536, 576, 0, 1536},
        std::tuple{300, 1001, 64, 0, 1001}, std::tuple{300, 62, 64, 0, 62},
        std::tuple{9, 960, 576, 320, 192}}) {
    SCOPED_TRACE(::testing::Message() << "n " << n << " rows " << rows << " k " << k);
    const auto x = RandomFloats(n * k, 60 + n);
    const auto w = RandomFloats(rows * k, 61 + rows);
    const HostTensor t = F32Tensor(w, rows, k);
    absl::StatusOr<Weight> pw = cuda_->PackWeight({&t, 1});
    ASSERT_TRUE(pw.ok()) << pw.status();
    DeviceBuffer xf = Upload(*cuda_, x), xb = Upload(*cuda_, Bf16Bits(x));
    std::vector<float> y[2];
    for (int b = 0; b < 2; ++b) {
      DeviceBuffer yd = Upload(*cuda_, std::vector<float>(size_t(n) * count, NAN));
      const LinearInput in =
          b == 0 ? LinearInput(xf.as<float>()) : LinearInput(xb.as<void>(), DType::kBF16);
      cuda_->LinearRows(in, n, *pw, begin, count, nullptr, yd.as<float>());
      y[b] = Download<float>(*cuda_, yd, size_t(n) * count);
    }
    ASSERT_TRUE(std::all_of(y[1].begin(), y[1].end(), [](float v) { return std::isfinite(v); }));
    EXPECT_EQ(FirstBitDifference(y[0].data(), y[1].data(), y[0].size()), -1);
  }
}

// Time marks are events on the stream (the RidgeFill profile's clock): marking does not wait
// for the device. 100 GEMMs of [2048, 4096] x [4096, 4096] (about 7 TFLOP) are queued between two
// marks; the host returns from queuing and marking in much less than the device time the marks
// measure.
TEST_F(CudaOpsTest, TimeMarksDoNotWaitForTheDevice) {
  const int32_t n = 2048, k = 4096;
  const auto w = RandomFloats(size_t(k) * k, 70);
  const HostTensor t = F32Tensor(w, k, k);
  absl::StatusOr<Weight> pw = cuda_->PackWeight({&t, 1});
  ASSERT_TRUE(pw.ok()) << pw.status();
  DeviceBuffer x = Upload(*cuda_, Bf16Bits(RandomFloats(size_t(n) * k, 71)));
  DeviceBuffer y = Upload(*cuda_, std::vector<float>(size_t(n) * k));
  const LinearInput in(x.as<void>(), DType::kBF16);
  cuda_->Linear(in, n, *pw, nullptr, y.as<float>());  // the GEMM's algorithm chosen, warm
  cuda_->Synchronize();
  cuda_->ResetTimeMarks();
  const auto start = std::chrono::steady_clock::now();
  const int32_t a = cuda_->MarkTime();
  for (int i = 0; i < 100; ++i) cuda_->Linear(in, n, *pw, nullptr, y.as<float>());
  const int32_t b = cuda_->MarkTime();
  const double host =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double device = cuda_->SecondsBetween(a, b);
  std::printf(
      "[ measured ] 100 GEMMs: %.3f ms on the device between the marks, %.3f ms on the "
      "host to queue and mark them\n",
      1e3 * device, 1e3 * host);
  EXPECT_GT(device, 2 * host);
  EXPECT_EQ(cuda_->MarkTime(), 2);
}

// `linear(start, n, y)` computes rows [start, start + n) of some x into y [n, width]. Runs it
// over all max_n rows, then for batches of `sizes` at three places each: "" when every row has
// the same bits in every call, else where they first differ. y is NaN before each call, so a
// row left unwritten differs.
std::string FirstBatchDependence(Backend& cuda, int32_t max_n, int64_t width,
                                 std::span<const int32_t> sizes, DeviceBuffer& y,
                                 const std::function<void(int32_t, int32_t, float*)>& linear) {
  const std::vector<float> nan(static_cast<size_t>(max_n) * width, NAN);
  auto run = [&](int32_t start, int32_t n) {
    cuda.CopyToDevice(y.as<void>(), nan.data(), sizeof(float) * n * width);
    linear(start, n, y.as<float>());
    return Download<float>(cuda, y, static_cast<size_t>(n) * width);
  };
  const std::vector<float> full = run(0, max_n);
  if (!std::all_of(full.begin(), full.end(), [](float v) { return std::isfinite(v); })) {
    return absl::StrCat("the batch of ", max_n, " rows left outputs unwritten (NaN)");
  }
  for (int32_t n : sizes) {
    if (n > max_n) continue;
    for (int32_t start : {0, std::min(5, max_n - n), max_n - n}) {
      const std::vector<float> part = run(start, n);
      const int64_t d =
          FirstBitDifference(part.data(), full.data() + int64_t{start} * width, part.size());
      if (d >= 0) {
        return absl::StrCat("rows ", start, "..", start + n, " as a batch of ", n, ": row ",
                            start + d / width, " column ", d % width, " is ", part[d], ", ",
                            full[int64_t{start} * width + d], " in the batch of ", max_n);
      }
    }
  }
  return "";
}

// Batch invariance of Linear on the device: row i of x gives the same bits alone, at any place
// in batches of several sizes, and through LinearRows over a sub-range of the weight's rows.
// What this measures is cuBLASLt with one algorithm per k (kernels/cuda/linear.h).
TEST_F(CudaOpsTest, LinearRowIsBitwiseTheSameAloneAndInBatches) {
  const int32_t rows = 1536, k = 576, max_n = 512;
  const auto x = RandomFloats(max_n * k, 17);
  const auto w = RandomFloats(rows * k, 18);
  const HostTensor t = F32Tensor(w, rows, k);
  absl::StatusOr<Weight> pw = cuda_->PackWeight({&t, 1});
  ASSERT_TRUE(pw.ok());
  DeviceBuffer xd = Upload(*cuda_, x), yd = Upload(*cuda_, std::vector<float>(max_n * rows));
  const int32_t sizes[] = {1, 2, 3, 8, 17, 64, 129, 300};
  EXPECT_EQ(FirstBatchDependence(*cuda_, max_n, rows, sizes, yd,
                                 [&](int32_t start, int32_t n, float* y) {
                                   cuda_->Linear(xd.as<float>() + int64_t{start} * k, n, *pw,
                                                 nullptr, y);
                                 }),
            "");
  cuda_->Linear(xd.as<float>(), 4, *pw, nullptr, yd.as<float>());
  const std::vector<float> full = Download<float>(*cuda_, yd, 4 * rows);
  // Rows [384, 384 + 192) of w (a fused projection's K part, as RidgeFill reads it).
  cuda_->CopyToDevice(yd.as<void>(), std::vector<float>(4 * 192, NAN).data(),
                      sizeof(float) * 4 * 192);
  cuda_->LinearRows(xd.as<float>(), 4, *pw, 384, 192, nullptr, yd.as<float>());
  const std::vector<float> sub = Download<float>(*cuda_, yd, 4 * 192);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(FirstBitDifference(sub.data() + i * 192, full.data() + int64_t{i} * rows + 384, 192),
              -1)
        << "row " << i << " through LinearRows";
  }
}

// Llama-3.1-8B's projections: QKV (and its K/V rows through LinearRows, as RidgeFill reads
// them), O, gate-up, down and the LM head (up to 256 rows).
struct Llama8BShape {
  int64_t rows, k;
  int32_t max_n;
  int64_t sub_begin, sub_rows;  // a LinearRows range, or 0 rows
};
constexpr Llama8BShape kLlama8BShapes[] = {{6144, 4096, 2048, 4096, 2048},
                                           {4096, 4096, 2048, 0, 0},
                                           {28672, 4096, 2048, 0, 0},
                                           {4096, 14336, 2048, 0, 0},
                                           {128256, 4096, 256, 0, 0}};
constexpr int32_t kLlama8BBatches[] = {1, 3, 64, 256, 2048};

// The same at those shapes, where Hopper's GEMM kernels have the room to divide k differently
// by batch size, 1 to 2048 rows.
TEST_F(CudaOpsTest, LinearRowIsBitwiseTheSameAtLlama31_8BShapes) {
  uint32_t seed = 90;
  for (const Llama8BShape& s : kLlama8BShapes) {
    SCOPED_TRACE(::testing::Message() << "[" << s.rows << " x " << s.k << "]");
    const auto w = RandomFloats(static_cast<size_t>(s.rows) * s.k, ++seed);
    const auto x = RandomFloats(static_cast<size_t>(s.max_n) * s.k, ++seed);
    const HostTensor t = F32Tensor(w, s.rows, s.k);
    absl::StatusOr<Weight> pw = cuda_->PackWeight({&t, 1});
    ASSERT_TRUE(pw.ok()) << pw.status();
    DeviceBuffer xd = Upload(*cuda_, x);
    absl::StatusOr<DeviceBuffer> yd = cuda_->Alloc(sizeof(float) * s.max_n * s.rows);
    ASSERT_TRUE(yd.ok()) << yd.status();
    const std::string found = FirstBatchDependence(
        *cuda_, s.max_n, s.rows, kLlama8BBatches, *yd, [&](int32_t start, int32_t n, float* y) {
          cuda_->Linear(xd.as<float>() + start * s.k, n, *pw, nullptr, y);
        });
    EXPECT_EQ(found, "");
    std::printf("[ measured ] Linear [%lld x %lld], 1..%d rows (32 MiB workspace): %s\n",
                static_cast<long long>(s.rows), static_cast<long long>(s.k), s.max_n,
                found.empty() ? "bitwise batch invariant" : found.c_str());
    if (s.sub_rows == 0) continue;
    cuda_->Linear(xd.as<float>(), 8, *pw, nullptr, yd->as<float>());
    const std::vector<float> full = Download<float>(*cuda_, *yd, 8 * s.rows);
    EXPECT_EQ(FirstBatchDependence(*cuda_, s.max_n, s.sub_rows, kLlama8BBatches, *yd,
                                   [&](int32_t start, int32_t n, float* y) {
                                     cuda_->LinearRows(xd.as<float>() + start * s.k, n, *pw,
                                                       s.sub_begin, s.sub_rows, nullptr, y);
                                   }),
              "")
        << "through LinearRows";
    cuda_->LinearRows(xd.as<float>(), 8, *pw, s.sub_begin, s.sub_rows, nullptr, yd->as<float>());
    const std::vector<float> sub = Download<float>(*cuda_, *yd, 8 * s.sub_rows);
    for (int i = 0; i < 8; ++i) {
      EXPECT_EQ(FirstBitDifference(sub.data() + i * s.sub_rows,
                                   full.data() + i * s.rows + s.sub_begin, s.sub_rows),
                -1)
          << "row " << i << " through LinearRows vs Linear";
    }
  }
}

// The alternative, should the backend's GEMMs not be batch invariant: cuBLASLt algorithms that
// need no workspace (so no k divided across CTAs through it), the same check at the same
// shapes, printed; asserted only that each shape gets an algorithm and writes every output.
TEST_F(CudaOpsTest, LinearWithoutWorkspaceIsMeasuredAtLlama31_8BShapes) {
  absl::StatusOr<int64_t> reference_n =
      cuda::GemmReferenceN(std::getenv("RIDGESERVE_CUDA_GEMM_REFERENCE_N"));
  ASSERT_TRUE(reference_n.ok()) << reference_n.status();
  absl::StatusOr<std::unique_ptr<cuda::CublasLinear>> linear = cuda::CublasLinear::Create(
      nullptr, 0, static_cast<cudaStream_t>(CudaBackendStream(*cuda_)), *reference_n);
  ASSERT_TRUE(linear.ok()) << linear.status();
  uint32_t seed = 90;
  for (const Llama8BShape& s : kLlama8BShapes) {
    SCOPED_TRACE(::testing::Message() << "[" << s.rows << " x " << s.k << "]");
    const auto w = RandomFloats(static_cast<size_t>(s.rows) * s.k, ++seed);
    const auto x = RandomFloats(static_cast<size_t>(s.max_n) * s.k, ++seed);
    // Asked first: Run stops the process where no algorithm exists.
    const absl::StatusOr<cublasLtMatmulAlgo_t> algo = (*linear)->AlgorithmFor(s.k);
    ASSERT_TRUE(algo.ok()) << algo.status();
    DeviceBuffer wb = Upload(*cuda_, Bf16Bits(w)), xb = Upload(*cuda_, Bf16Bits(x));
    absl::StatusOr<DeviceBuffer> yd = cuda_->Alloc(sizeof(float) * s.max_n * s.rows);
    ASSERT_TRUE(yd.ok()) << yd.status();
    const std::string found = FirstBatchDependence(
        *cuda_, s.max_n, s.rows, kLlama8BBatches, *yd, [&](int32_t start, int32_t n, float* y) {
          (*linear)->Run(xb.as<uint16_t>() + start * s.k, n, wb.as<uint16_t>(), s.rows, s.k, y,
                         s.rows);
        });
    EXPECT_EQ(found.find("unwritten"), std::string::npos) << found;
    std::printf("[ measured ] Linear [%lld x %lld], 1..%d rows (no workspace): %s\n",
                static_cast<long long>(s.rows), static_cast<long long>(s.k), s.max_n,
                found.empty() ? "bitwise batch invariant" : found.c_str());
  }
}

// The tensor-parallel all-reduce's sum (the NCCL communicator's, after its all-gather): in rank
// order, bitwise the CPU's left-to-right f32 sum, on values of many magnitudes where the order
// shows (element 0: (1e8 + 1) - 1e8 = 0 in f32; ranks 0, 2, 1 would give 1).
TEST_F(CudaOpsTest, SumRanksInOrderIsTheRankOrderSum) {
  for (int ranks : {2, 3, 4}) {
    const size_t count = 100003;
    std::vector<float> gathered = RandomFloats(ranks * count, 70 + ranks);
    for (size_t i = 0; i < gathered.size(); ++i)
      gathered[i] *= std::pow(10.0f, static_cast<float>(i % 9) - 4.0f);
    gathered[0] = 1e8f;
    gathered[count] = 1.0f;
    if (ranks >= 3) gathered[2 * count] = -1e8f;
    std::vector<float> want(count);
    for (size_t i = 0; i < count; ++i) {
      float sum = gathered[i];
      for (int r = 1; r < ranks; ++r) sum += gathered[r * count + i];
      want[i] = sum;
    }
    if (ranks >= 3) {
      ASSERT_EQ(want[0], 0.0f);
    }
    DeviceBuffer in = Upload(*cuda_, gathered),
                 out = Upload(*cuda_, std::vector<float>(count, NAN));
    cuda::LaunchSumRanksInOrder(in.as<float>(), ranks, count, out.as<float>(),
                                static_cast<cudaStream_t>(CudaBackendStream(*cuda_)));
    const std::vector<float> got = Download<float>(*cuda_, out, count);
    EXPECT_EQ(FirstBitDifference(got.data(), want.data(), count), -1) << ranks << " ranks";
  }
}

// --- attention ------------------------------------------------------------------------------

struct AttnCase {
  int32_t num_heads, num_kv_heads, head_dim, block_size;
  std::vector<int32_t> seq_lens;
  DType dtype;
};

// A paged cache holding random K/V for each sequence in shuffled blocks, on one backend, and
// query rows: every position of each sequence (prefill rows) unless `last_only` (decode rows).
struct PagedSetup {
  std::vector<int32_t> positions, seq, offsets, tables;
  std::vector<float> q;
  DeviceBuffer k, v, dpos, dseq, doff, dtab, dq, dout;
  KvLayerView view;
  AttentionRows rows;
  int32_t out_width = 0;

  void Build(Backend& b, const AttnCase& c, uint32_t seed, bool last_only, uint32_t layout_seed) {
    const int32_t width = c.num_kv_heads * c.head_dim;
    int32_t total_blocks = 0;
    for (int32_t len : c.seq_lens) total_blocks += (len + c.block_size - 1) / c.block_size;
    std::vector<int32_t> perm(total_blocks);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), std::mt19937(layout_seed));
    offsets = {0};
    tables.clear();
    for (int32_t len : c.seq_lens) {
      for (int32_t i = 0; i < (len + c.block_size - 1) / c.block_size; ++i) {
        tables.push_back(perm[tables.size()]);
      }
      offsets.push_back(static_cast<int32_t>(tables.size()));
    }
    // K/V rows per sequence position (independent of the layout), stored into the slots.
    std::vector<float> kd, vd;
    std::vector<int32_t> slots;
    for (size_t s = 0; s < c.seq_lens.size(); ++s) {
      const auto ks = RandomFloats(size_t(c.seq_lens[s]) * width, seed + 100 * s);
      const auto vs = RandomFloats(size_t(c.seq_lens[s]) * width, seed + 100 * s + 1);
      kd.insert(kd.end(), ks.begin(), ks.end());
      vd.insert(vd.end(), vs.begin(), vs.end());
      for (int32_t p = 0; p < c.seq_lens[s]; ++p) {
        slots.push_back(tables[offsets[s] + p / c.block_size] * c.block_size + p % c.block_size);
      }
    }
    const size_t bytes = ElementBytes(c.dtype) * size_t(total_blocks) * c.block_size * width;
    k = Upload(b, std::vector<uint8_t>(bytes, 0));
    v = Upload(b, std::vector<uint8_t>(bytes, 0));
    view = KvLayerView{k.as<uint8_t>(), v.as<uint8_t>(), c.dtype,   total_blocks,
                       c.block_size,    c.num_kv_heads,  c.head_dim};
    {
      DeviceBuffer kk = Upload(b, kd), vv = Upload(b, vd), ss = Upload(b, slots);
      b.StoreKv(view, kk.as<float>(), vv.as<float>(), width, static_cast<int32_t>(slots.size()),
                ss.as<int32_t>());
      b.Synchronize();
    }
    positions.clear();
    seq.clear();
    for (size_t s = 0; s < c.seq_lens.size(); ++s) {
      for (int32_t p = last_only ? c.seq_lens[s] - 1 : 0; p < c.seq_lens[s]; ++p) {
        positions.push_back(p);
        seq.push_back(static_cast<int32_t>(s));
      }
    }
    out_width = c.num_heads * c.head_dim;
    // On a bf16 cache the queries are bf16 values already: the tiles' rounding of them is exact.
    q = RandomFloats(positions.size() * out_width, seed + 7);
    if (c.dtype == DType::kBF16) q = RoundedToBf16(q);
    dpos = Upload(b, positions);
    dseq = Upload(b, seq);
    doff = Upload(b, offsets);
    dtab = Upload(b, tables);
    dq = Upload(b, q);
    dout = UnwrittenActivations(b, positions.size() * out_width);
    rows = AttentionRows{static_cast<int32_t>(positions.size()), dpos.as<int32_t>(),
                         dseq.as<int32_t>(), doff.as<int32_t>(), dtab.as<int32_t>()};
  }

  // The scale: 1/sqrt(head_dim) on f32 and f16 caches (scores of std ~0.33, softmax near
  // uniform); 1 on bf16 ones (std ~2.7-3.8: a few keys carry most of a row's weight, so a tile
  // or a split slot of keys left out moves the output by O(0.1), far above the tolerance).
  static float Scale(const AttnCase& c) {
    return c.dtype == DType::kBF16 ? 1.0f : 1.0f / std::sqrt(float(c.head_dim));
  }

  std::vector<float> Run(Backend& b, const AttnCase& c) {
    b.Attention(dq.as<float>(), out_width, c.num_heads, view, rows, Scale(c), dout.as<void>());
    return DownloadActivations(b, dout, positions.size() * out_width);
  }
};

// CUDA vs CPU attention, prefill and decode rows, GQA groups 1..8, head dims 64 and 128, block
// sizes 16 and 32, every cache dtype, contexts crossing partitions (256) and, at 4500, slots of
// two partitions. The rows kernels (F32 and F16 caches) compute softmax · V in f32 from the same
// cached values (widened exactly) in another order: |Δ| <= 2e-5 (V in [-1, 1], scores O(1)).
// The tiles (BF16 caches; bf16 queries, so only the weights round) round the softmax weights to
// bf16 for the tensor cores: each off by at most 2^-8 of itself, the output by at most
// 2^-8 · max |v - out| <= 2^-8 · 2: |Δ| <= 8e-3. Their scores are peaked (PagedSetup::Scale), so
// keys left out would show. Both families then store the output in bf16 (the o_proj input,
// Backend::ActivationDType), which moves each element by at most 2^-8 of itself more.
TEST_F(CudaOpsTest, AttentionMatchesCpu) {
  const std::vector<AttnCase> cases = {
      {9, 3, 64, 16, {1, 40, 300}, DType::kF32},     {9, 3, 64, 32, {257, 33}, DType::kBF16},
      {8, 8, 128, 16, {100, 513}, DType::kF16},      {16, 2, 64, 16, {700}, DType::kBF16},
      {4, 1, 64, 16, {4500}, DType::kF32},           {32, 8, 128, 16, {1, 70, 4500}, DType::kBF16},
      {12, 2, 128, 32, {64, 65, 129}, DType::kBF16},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const AttnCase& c = cases[i];
    const bool tiles = c.dtype == DType::kBF16;
    for (bool decode : {false, true}) {
      PagedSetup on_cpu, on_gpu;
      on_cpu.Build(*cpu_, c, 20 + i, decode, 7);
      on_gpu.Build(*cuda_, c, 20 + i, decode, 7);
      const auto a = on_cpu.Run(*cpu_, c), b = on_gpu.Run(*cuda_, c);
      ASSERT_EQ(a.size(), b.size());
      const double bound = tiles ? 8e-3 : 2e-5;
      for (size_t e = 0; e < a.size(); ++e) {
        // The rounding's share scales with the device's f32 value, within `bound` of a[e].
        ASSERT_LE(std::abs(double{a[e]} - b[e]), bound + 0x1p-8 * (std::abs(a[e]) + bound))
            << "case " << i << (decode ? " decode" : " prefill") << ", element " << e;
      }
      const double diff = MaxAbsDiff(a, b);
      std::printf("[ measured ] attention case %zu %s (%s): max |cuda - cpu| = %.3g\n", i,
                  decode ? "decode" : "prefill", tiles ? "tiles" : "rows", diff);
    }
  }
}

// Rows `which` of `all` (same cache, same queries) run as one call in that order.
std::vector<float> RunRowsOf(Backend& b, const AttnCase& c, const PagedSetup& all,
                             const std::vector<size_t>& which, uint32_t seed,
                             uint32_t layout_seed) {
  PagedSetup some;
  some.Build(b, c, seed, /*last_only=*/false, layout_seed);
  some.positions.clear();
  some.seq.clear();
  some.q.clear();
  for (size_t r : which) {
    some.positions.push_back(all.positions[r]);
    some.seq.push_back(all.seq[r]);
    some.q.insert(some.q.end(), all.q.begin() + r * all.out_width,
                  all.q.begin() + (r + 1) * all.out_width);
  }
  some.dpos = Upload(b, some.positions);
  some.dseq = Upload(b, some.seq);
  some.dq = Upload(b, some.q);
  some.dout = UnwrittenActivations(b, which.size() * all.out_width);
  some.rows.num_rows = static_cast<int32_t>(which.size());
  some.rows.positions = some.dpos.as<int32_t>();
  some.rows.seq = some.dseq.as<int32_t>();
  return some.Run(b, c);
}

// Batch invariance on the device, for each kernel family (F16 cache: rows; BF16: tiles): a
// row's output is bitwise the same whichever form ran it (split-KV for <= kSplitMaxRows rows,
// the walker above), alone or in a batch, in whatever tile and place, and whatever the paging
// (block size, block order).
TEST_F(CudaOpsTest, AttentionRowIsBitwiseTheSameAloneInBatchesAndAnyPaging) {
  // Group 3 (tiles of 21 rows) at head_dim 64 on both families; group 4 (16 rows) at 128.
  const std::vector<AttnCase> cases = {{9, 3, 64, 16, {600, 90, 4400}, DType::kF16},
                                       {9, 3, 64, 16, {600, 90, 4400}, DType::kBF16},
                                       {32, 8, 128, 16, {600, 90, 4400}, DType::kBF16}};
  for (const AttnCase& c : cases) {
    SCOPED_TRACE(::testing::Message()
                 << (c.dtype == DType::kBF16 ? "tiles (bf16 cache)" : "rows (f16 cache)")
                 << ", head_dim " << c.head_dim);
    PagedSetup all;
    all.Build(*cuda_, c, 40, /*last_only=*/false, 1);  // 5090 rows: the walker
    ASSERT_GT(all.positions.size(), size_t(cuda::kSplitMaxRows));
    const std::vector<float> batch = all.Run(*cuda_, c);
    // Outputs start as NaN: equal bits must be written ones.
    ASSERT_TRUE(std::all_of(batch.begin(), batch.end(), [](float x) { return std::isfinite(x); }))
        << "an output of the 5090 rows was not written";
    auto expect_rows = [&](const std::vector<size_t>& which, const std::vector<float>& got,
                           const char* how) {
      ASSERT_TRUE(std::all_of(got.begin(), got.end(), [](float x) { return std::isfinite(x); }))
          << "an output " << how << " was not written";
      for (size_t i = 0; i < which.size(); ++i) {
        const size_t r = which[i];
        ASSERT_EQ(FirstBitDifference(got.data() + i * all.out_width,
                                     batch.data() + r * all.out_width, all.out_width),
                  -1)
            << "row " << r << " (sequence " << all.seq[r] << ", position " << all.positions[r]
            << ") " << how << " vs in the 5090 rows";
      }
    };
    // Rows alone (1 row: split-KV), including the last of each sequence.
    for (size_t r : {size_t{599}, size_t{689}, all.positions.size() - 1, size_t{0}, size_t{300}}) {
      expect_rows({r}, RunRowsOf(*cuda_, c, all, {r}, 40, 1), "alone");
    }
    // 100 consecutive rows of sequence 2 (split-KV over tiles of several rows), with the
    // three sequences' first rows before them (tiles of one row).
    std::vector<size_t> run = {0, 600, 690};
    for (size_t r = 4000; r < 4100; ++r) run.push_back(r);
    expect_rows(run, RunRowsOf(*cuda_, c, all, run, 40, 1), "in 103 rows");
    // All rows shuffled (the walker over runs of a few rows: many more tiles than CTAs).
    std::vector<size_t> shuffled(all.positions.size());
    std::iota(shuffled.begin(), shuffled.end(), 0);
    std::shuffle(shuffled.begin(), shuffled.end(), std::mt19937(5));
    expect_rows(shuffled, RunRowsOf(*cuda_, c, all, shuffled, 40, 1), "shuffled");
    // Decode rows of the three sequences (3 rows: split-KV) with another block size and order.
    AttnCase c32 = c;
    c32.block_size = 32;
    std::vector<size_t> last_rows;
    size_t row = 0;
    for (int32_t len : c.seq_lens) {
      row += len;
      last_rows.push_back(row - 1);
    }
    expect_rows(last_rows, RunRowsOf(*cuda_, c32, all, last_rows, 40, 99),
                "as decode rows with block size 32");
  }
}

// SpecPC's and SpecKV's scores: the CPU's within float rounding (the device adds the dot
// products and each row's softmax in other orders and exp is expf: a few ulp, stated in
// kernels/cuda/attention_scores.h), relative to each score, on every cache type, with NaN in
// every slot the sequence does not own, at the shapes of SmolLM2, Llama-3.1-8B (group 4, dim 128),
// a group of 16 at dim 256, head_dim 24 (a partial lane), and with keys no row sees.
TEST_F(CudaOpsTest, AttentionScoresMatchCpu) {
  using ::ridgeserve::testing::ScoresCase;
  using ::ridgeserve::testing::SelectionProblem;
  const ScoresCase cases[] = {
      {{9, 3, 64, 16, 300, DType::kBF16}, {3, 250, 270, 285, 299}, 280},
      {{32, 8, 128, 16, 2100, DType::kBF16}, {2000, 2040, 2080, 2099}, 2050},
      {{16, 1, 256, 32, 500, DType::kF16}, {450, 499}, 480},
      {{4, 4, 24, 16, 90, DType::kF32, 6.0f}, {60, 70, 89}, 80},
      // Keys no row sees (score 0, not read: count is past the sequence's blocks).
      {{6, 2, 32, 16, 40, DType::kF16}, {5, 9}, 60},
  };
  uint32_t seed = 300;
  for (size_t i = 0; i < std::size(cases); ++i) {
    const ScoresCase& c = cases[i];
    SelectionProblem problem(c.shape, seed++);
    const std::vector<float> q = problem.Queries(c.positions.size(), seed++);
    std::vector<float> weights = RandomFloats(c.positions.size(), seed++, 0.0f, 1.0f);
    weights.back() = 1.0f;
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.shape.head_dim));
    const size_t n = static_cast<size_t>(c.shape.num_kv_heads) * c.count;
    std::vector<float> cpu(n, -1.0f), gpu(n, -1.0f);
    cpu_->AttentionScores(problem.View(problem.k.data(), problem.v.data()), problem.blocks,
                          q.data(), c.shape.num_heads, c.positions, weights, scale, c.count,
                          cpu.data());
    DeviceBuffer k = Upload(*cuda_, problem.k), v = Upload(*cuda_, problem.v);
    cuda_->AttentionScores(problem.View(k.as<uint8_t>(), v.as<uint8_t>()), problem.blocks, q.data(),
                           c.shape.num_heads, c.positions, weights, scale, c.count, gpu.data());
    double worst = 0;
    for (size_t e = 0; e < n; ++e) {
      worst = std::max(worst, std::abs(double{gpu[e]} - cpu[e]) / std::max(cpu[e], 1e-6f));
    }
    std::printf("[ measured ] attention scores case %zu: max relative |cuda - cpu| = %.3g\n", i,
                worst);
    EXPECT_LE(worst, 1e-4) << "case " << i;
  }
}

// SpecKV's compaction moves the bits the CPU's moves, on every cache type.
TEST_F(CudaOpsTest, CompactKvIsBitwiseCpu) {
  using ::ridgeserve::testing::SelectionProblem;
  for (const DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    SelectionProblem problem({32, 8, 128, 16, 1500, dtype}, 400);
    const int32_t n = 600;
    const std::vector<int32_t> from = ::ridgeserve::testing::KeptPlaces(8, 1500, n, 401);
    DeviceBuffer k = Upload(*cuda_, problem.k), v = Upload(*cuda_, problem.v);
    cuda_->CompactKv(problem.View(k.as<uint8_t>(), v.as<uint8_t>()), problem.blocks, from, n);
    cpu_->CompactKv(problem.View(problem.k.data(), problem.v.data()), problem.blocks, from, n);
    EXPECT_EQ(Download<uint8_t>(*cuda_, k, problem.k.size()), problem.k) << KvCacheDTypeName(dtype);
    EXPECT_EQ(Download<uint8_t>(*cuda_, v, problem.v.size()), problem.v) << KvCacheDTypeName(dtype);
  }
}

// Backend::Sample: a step of mixed specs (greedy, plain, top-k, top-p, min-p, penalties,
// log-probabilities) on each backend, each spec drawn 20 times (draws 0..19). The CUDA token is
// the CPU's except where the target lands within rounding of a cumulative boundary (CUDA's expf
// and chunked double sums against glibc's and a sequential sum: ~1e-7 relative), so at most one
// draw in a thousand may differ; log-probabilities are double sums of the same terms. The
// vocabularies are the default model's and one whose penalty bitmap (50,000 bytes) needs more
// than the 48 KiB of shared memory a kernel gets without opting in.
TEST_F(CudaOpsTest, SampleMatchesCpu) {
  for (int32_t vocab : {49152, 400000}) {
    SCOPED_TRACE(vocab);
    const int32_t rows = 64;
    const std::vector<float> logits =
        RandomFloats(static_cast<size_t>(rows) * vocab, 41, -8.0f, 8.0f);
    std::vector<int32_t> penalty_ids;
    std::vector<SampleSpec> specs = ::ridgeserve::testing::MixedSampleSpecs(rows, penalty_ids);
    DeviceBuffer on_cpu = Upload(*cpu_, logits);
    DeviceBuffer on_cuda = Upload(*cuda_, logits);
    int draws = 0, differ = 0;
    double max_logprob_diff = 0;
    for (int d = 0; d < 20; ++d) {
      for (SampleSpec& s : specs) s.draw = d;
      std::vector<SampledToken> want(specs.size()), got(specs.size());
      cpu_->Sample(on_cpu.as<float>(), vocab, specs, penalty_ids, want.data());
      cuda_->Sample(on_cuda.as<float>(), vocab, specs, penalty_ids, got.data());
      for (size_t i = 0; i < specs.size(); ++i) {
        ++draws;
        if (got[i].token != want[i].token) {
          ++differ;
          continue;
        }
        max_logprob_diff =
            std::max(max_logprob_diff, std::abs(double(got[i].logprob) - want[i].logprob));
      }
    }
    std::printf(
        "[ measured ] sample, vocab %d: %d of %d draws differ from the CPU; max |logprob diff| "
        "%.3g\n",
        vocab, differ, draws, max_logprob_diff);
    EXPECT_LE(differ * 1000, draws);
    EXPECT_LE(max_logprob_diff, 1e-5);
    // The logits are read, not changed.
    EXPECT_EQ(Download<float>(*cuda_, on_cuda, logits.size()), logits);
  }
}

// A spec's token and log-probability are bitwise the same drawn alone and in a batch, and a
// greedy tie goes to the lowest id.
TEST_F(CudaOpsTest, SampleIsBatchInvariantAndBreaksTiesByLowestId) {
  const int32_t rows = 32, vocab = 49152;
  std::vector<float> logits = RandomFloats(static_cast<size_t>(rows) * vocab, 42, -8.0f, 8.0f);
  logits[100] = logits[7000] = 20.0f;  // row 0: a tie at the top
  std::vector<int32_t> penalty_ids;
  std::vector<SampleSpec> specs = ::ridgeserve::testing::MixedSampleSpecs(rows, penalty_ids);
  DeviceBuffer on_cuda = Upload(*cuda_, logits);
  std::vector<SampledToken> batched(specs.size());
  cuda_->Sample(on_cuda.as<float>(), vocab, specs, penalty_ids, batched.data());
  for (size_t i = 0; i < specs.size(); ++i) {
    SampledToken alone;
    cuda_->Sample(on_cuda.as<float>(), vocab, std::span(&specs[i], 1), penalty_ids, &alone);
    EXPECT_EQ(alone.token, batched[i].token) << "spec " << i;
    EXPECT_EQ(std::memcmp(&alone.logprob, &batched[i].logprob, sizeof(float)), 0) << "spec " << i;
  }
  // Row 0's tie at the top: greedy, top-k 1 and a tiny top-p keep the lower id, in the sorted
  // keys as in the argmax.
  SampleSpec greedy;
  greedy.temperature = 0.0f;
  SampleSpec top_k = greedy;
  top_k.temperature = 1.0f;
  top_k.top_k = 1;
  SampleSpec top_p = top_k;
  top_p.top_k = 0;
  top_p.top_p = 0.01f;
  for (const SampleSpec& spec : {greedy, top_k, top_p}) {
    for (uint64_t draw = 0; draw < 8; ++draw) {
      SampleSpec s = spec;
      s.draw = draw;
      SampledToken top;
      cuda_->Sample(on_cuda.as<float>(), vocab, std::span(&s, 1), {}, &top);
      EXPECT_EQ(top.token, 100) << "top_k " << s.top_k << " top_p " << s.top_p;
    }
  }
}

// The device bytes the ops `prepare(backend)` returns take when they run on `backend`, after
// `prepare` (allocations, reservations). The same ops run first on a backend of their own, gone
// before the count: CUDA loads a kernel's code into device memory at its first launch (lazy
// module loading), which is not the backend's allocation.
template <typename Prepare>
int64_t DeviceBytesTaken(Backend& backend, Prepare prepare) {
  {
    std::unique_ptr<Backend> warm = ::ridgeserve::testing::MakeCudaBackend();
    prepare (*warm)();
    warm->Synchronize();
  }
  const std::function<void()> ops = prepare(backend);
  backend.Synchronize();
  const size_t free_before = backend.MemoryInfo()->free_bytes;
  ops();
  backend.Synchronize();
  return static_cast<int64_t>(free_before) - static_cast<int64_t>(backend.MemoryInfo()->free_bytes);
}

// After ReserveSampling(rows, vocab, penalty_ids), drawing up to that many rows, every one
// sorted and penalized by a context of 40,000 ids (2.56 MB of them in all, over the driver's
// 2 MiB granularity), takes no more device memory.
TEST_F(CudaOpsTest, SamplingWithinTheReservationAllocatesNothing) {
  const int32_t rows = 16, vocab = 49152, context = 40000;
  const std::vector<float> logits =
      RandomFloats(static_cast<size_t>(rows) * vocab, 43, -8.0f, 8.0f);
  std::vector<int32_t> penalty_ids(static_cast<size_t>(rows) * context);
  std::mt19937 rng(44);
  for (int32_t& id : penalty_ids) id = static_cast<int32_t>(rng() % vocab);
  std::vector<SampleSpec> specs(rows);
  for (int32_t r = 0; r < rows; ++r) {
    specs[r].row = r;
    specs[r].top_p = 0.9f;
    specs[r].top_k = 50;
    specs[r].repetition_penalty = 1.3f;
    specs[r].penalty_begin = r * context;
    specs[r].penalty_end = (r + 1) * context;
  }
  const int64_t taken = DeviceBytesTaken(*cuda_, [&](Backend& b) -> std::function<void()> {
    EXPECT_TRUE(b.ReserveSampling(rows, vocab, int64_t{rows} * context).ok());
    auto on_device = std::make_shared<DeviceBuffer>(Upload(b, logits));
    return [&b, &specs, &penalty_ids, on_device, vocab] {
      std::vector<SampledToken> out(specs.size());
      b.Sample(on_device->as<float>(), vocab, specs, penalty_ids, out.data());
    };
  });
  EXPECT_EQ(taken, 0);
}

// A vocabulary whose penalty bitmap is over what this device lets a CTA hold (8M ids: 1 MiB,
// over every GPU's shared memory) is refused at the reservation, naming it, not at a launch.
TEST_F(CudaOpsTest, ReserveSamplingRefusesAVocabularyOverTheSharedMemory) {
  const absl::Status refused = cuda_->ReserveSampling(1, 8 << 20, 0);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_NE(refused.message().find("8388608 ids"), std::string::npos) << refused;
  EXPECT_TRUE(cuda_->ReserveSampling(1, 400000, 0).ok());
}

// The same for the ops' scratch (Backend::ReserveOps): after a reservation for 300-row steps,
// Linears of every width the shapes name (4001 through the padded output) and attention over
// 300 rows on a bf16 cache (the tiles) and an f16 one (the rows kernels) allocate nothing. Each
// part of the scratch is over 2 MiB here (the driver's granularity), so a growth would show.
TEST_F(CudaOpsTest, OpsWithinTheReservationAllocateNothing) {
  const int32_t n = 300, k = 4096;
  const AttnCase bf16{9, 3, 64, 16, {40, 260}, DType::kBF16};
  AttnCase f16 = bf16;
  f16.dtype = DType::kF16;
  const OpShapes shapes{.rows = n,
                        .linear_ks = {k},
                        .f32_linear_k = k,  // x is given as f32 rows: its bf16 copy is scratch
                        .linear_widths = {1536, 4001},
                        .num_heads = 9,
                        .num_kv_heads = 3,
                        .head_dim = 64,
                        .kv_dtype = DType::kBF16};
  std::vector<std::vector<float>> values;
  for (int32_t rows : {1536, 4001}) values.push_back(RandomFloats(size_t(rows) * k, 60 + rows));
  const std::vector<float> x = RandomFloats(size_t(n) * k, 61);
  struct State {
    std::vector<Weight> weights;
    DeviceBuffer x, y;
    PagedSetup with_tiles, with_rows;
  };
  const int64_t taken = DeviceBytesTaken(*cuda_, [&](Backend& b) -> std::function<void()> {
    EXPECT_TRUE(b.ReserveOps(shapes).ok());
    auto state = std::make_shared<State>();
    for (const std::vector<float>& w : values) {
      const int64_t rows = static_cast<int64_t>(w.size()) / k;
      const HostTensor t = F32Tensor(w, rows, k);
      absl::StatusOr<Weight> pw = b.PackWeight({&t, 1});
      EXPECT_TRUE(pw.ok()) << pw.status();
      if (pw.ok()) state->weights.push_back(*std::move(pw));
    }
    state->x = Upload(b, x);
    state->y = Upload(b, std::vector<float>(size_t(n) * 4001));
    state->with_tiles.Build(b, bf16, 62, /*last_only=*/false, 7);
    state->with_rows.Build(b, f16, 62, /*last_only=*/false, 7);
    EXPECT_EQ(state->with_tiles.rows.num_rows, n);
    return [&b, state, n, bf16, f16] {
      for (const Weight& w : state->weights) {
        b.Linear(state->x.as<float>(), n, w, nullptr, state->y.as<float>());
      }
      state->with_tiles.Run(b, bf16);
      state->with_rows.Run(b, f16);
    };
  });
  EXPECT_EQ(taken, 0);
}

}  // namespace
}  // namespace ridgeserve
