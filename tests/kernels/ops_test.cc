// CPU backend: memory, copies and every op except Linear and Attention (own files), each
// against a naive double-precision reference written here.
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/simd.h"
#include "kernels/dtype.h"
#include "tests/kernels/kernel_test_util.h"

namespace ridgeserve {
namespace {

using ::ridgeserve::testing::BitwiseEqual;
using ::ridgeserve::testing::RandomFloats;

// Distance in units of the float spacing at `exact` (for normal results).
double UlpError(float got, double exact) {
  int exponent = 0;
  std::frexp(exact, &exponent);  // |exact| in [2^(e-1), 2^e)
  return std::abs(got - exact) / std::ldexp(1.0, exponent - 24);
}

// A backend that only counts frees, to check DeviceBuffer's ownership.
class CountingBackend final : public Backend {
 public:
  std::string_view name() const override { return "counting"; }
  DType DefaultKvCacheDType() const override { return DType::kF32; }
  absl::StatusOr<DeviceBuffer> Alloc(size_t bytes) override {
    return DeviceBuffer(this, new char[bytes], bytes);
  }
  void FreeRaw(void* data) override {
    ++frees;
    delete[] static_cast<char*>(data);
  }
  void CopyToDevice(void*, const void*, size_t) override {}
  void CopyToHost(void*, const void*, size_t) override {}
  void Synchronize() override {}
  absl::StatusOr<Weight> PackWeight(std::span<const HostTensor>) override { return Weight(); }
  absl::Status UnpackWeight(const Weight&, int64_t, int64_t, float*) override {
    return absl::OkStatus();
  }
  void Embed(const Weight&, int64_t, const int32_t*, int32_t, float*) override {}
  void RmsNorm(const float*, const float*, int32_t, int32_t, float, void*) override {}
  void RmsNormHeads(float*, int32_t, int32_t, int32_t, int32_t, const float*, float) override {}
  void LinearRows(LinearInput, int32_t, const Weight&, int64_t, int64_t, const float*,
                  float*) override {}
  void Rope(float*, int32_t, int32_t, int32_t, int32_t, const int32_t*, const float*) override {}
  void StoreKv(const KvLayerView&, const float*, const float*, int32_t, int32_t,
               const int32_t*) override {}
  void Attention(const float*, int32_t, int32_t, const KvLayerView&, const AttentionRows&, float,
                 void*) override {}
  void SwiGlu(const float*, int32_t, int32_t, void*) override {}
  void Add(float*, const float*, size_t) override {}
  void GatherRows(const float*, int32_t, const int32_t*, int32_t, float*) override {}
  void ShiftedRowDots(const float*, const float*, const float*, int32_t, int32_t,
                      double*) override {}
  void ShiftRows(const float*, const float*, int32_t, int32_t, float*) override {}
  void CopyColumns(const float*, int64_t, int32_t, int32_t, float*, int64_t) override {}
  void AttentionScores(const KvLayerView&, std::span<const int32_t>, const float*, int32_t,
                       std::span<const int32_t>, std::span<const float>, float, int32_t,
                       float*) override {}
  void CompactKv(const KvLayerView&, std::span<const int32_t>, std::span<const int32_t>,
                 int32_t) override {}
  void Sample(float*, int32_t, std::span<const SampleSpec>, std::span<const int32_t>,
              SampledToken*) override {}

  int frees = 0;
};

TEST(DeviceBufferTest, FreesExactlyOnceThroughMoves) {
  CountingBackend backend;
  {
    DeviceBuffer a = *backend.Alloc(16);
    DeviceBuffer b = std::move(a);  // move construction
    EXPECT_EQ(a.as<void>(), nullptr);
    EXPECT_EQ(a.bytes(), 0u);
    EXPECT_EQ(b.bytes(), 16u);
    DeviceBuffer c = *backend.Alloc(8);
    c = std::move(b);  // frees c's old memory
    EXPECT_EQ(backend.frees, 1);
    EXPECT_EQ(c.bytes(), 16u);
    DeviceBuffer& alias = c;
    c = std::move(alias);  // self-move keeps the memory
    EXPECT_EQ(backend.frees, 1);
    EXPECT_NE(c.as<void>(), nullptr);
  }
  EXPECT_EQ(backend.frees, 2);
}

// The default time marks (the CPU's): the wall clock when MarkTime returns, after the backend
// synchronizes; numbered from 0 after each ResetTimeMarks.
TEST(CpuTimeMarksTest, SecondsBetweenMarksAreTheWallClockBetweenThem) {
  auto backend = CreateCpuBackend(1);
  backend->ResetTimeMarks();
  const int32_t a = backend->MarkTime();
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  const int32_t b = backend->MarkTime();
  const int32_t c = backend->MarkTime();
  EXPECT_EQ(a, 0);
  EXPECT_EQ(b, 1);
  EXPECT_EQ(c, 2);
  EXPECT_GE(backend->SecondsBetween(a, b), 0.03);
  EXPECT_LT(backend->SecondsBetween(a, b), 30.0);
  EXPECT_GE(backend->SecondsBetween(b, c), 0.0);
  backend->ResetTimeMarks();
  EXPECT_EQ(backend->MarkTime(), 0);
}

TEST(CpuMemoryTest, AllocFailureIsAnError) {
  auto backend = CreateCpuBackend(1);
  const absl::StatusOr<DeviceBuffer> huge = backend->Alloc(size_t{1} << 62);
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(huge.status().message()), ::testing::HasSubstr("4611686018427387904"));
}

TEST(CpuMemoryTest, AllocIsAlignedAndUsable) {
  auto backend = CreateCpuBackend(2);
  EXPECT_EQ(backend->name(), "cpu");
  for (size_t bytes : {size_t{1}, size_t{63}, size_t{64}, size_t{1000}, size_t{1} << 20}) {
    DeviceBuffer buf = *backend->Alloc(bytes);
    ASSERT_NE(buf.as<void>(), nullptr) << bytes;
    EXPECT_EQ(buf.bytes(), bytes);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(buf.as<void>()) % 64, 0u) << bytes;
    std::memset(buf.as<void>(), 0xAB, bytes);
  }
  DeviceBuffer empty = *backend->Alloc(0);
  EXPECT_EQ(empty.as<void>(), nullptr);
  EXPECT_EQ(empty.bytes(), 0u);
}

TEST(CpuMemoryTest, CopiesRoundTrip) {
  auto backend = CreateCpuBackend(1);
  const std::vector<float> host = RandomFloats(1000, 1);
  DeviceBuffer dev = *backend->Alloc(host.size() * sizeof(float));
  backend->CopyToDevice(dev.as<void>(), host.data(), host.size() * sizeof(float));
  std::vector<float> back(host.size());
  backend->CopyToHost(back.data(), dev.as<void>(), back.size() * sizeof(float));
  backend->Synchronize();
  EXPECT_TRUE(BitwiseEqual(host, back));
}

// Each element is the float difference (exact in double, then rounded once), in place too.
TEST(CpuOpsTest, ShiftRowsSubtractTheVectorFromEveryRow) {
  auto backend = CreateCpuBackend(2);
  const int32_t n = 3, dim = 70;
  std::vector<float> a = RandomFloats(size_t(n) * dim, 6, -4.0f, 4.0f);
  const std::vector<float> shift = RandomFloats(dim, 7, 100.0f, 200.0f);
  std::vector<float> out(a.size());
  backend->ShiftRows(a.data(), shift.data(), n, dim, out.data());
  for (int32_t i = 0; i < n; ++i) {
    for (int32_t j = 0; j < dim; ++j) {
      const double exact = double(a[i * dim + j]) - double(shift[j]);
      ASSERT_EQ(out[i * dim + j], static_cast<float>(exact)) << i << ", " << j;
    }
  }
  backend->ShiftRows(a.data(), shift.data(), n, dim, a.data());
  EXPECT_TRUE(BitwiseEqual(a, out));
}

// Against a long double sum: the double sum of dim products is within dim ulps of it.
TEST(CpuOpsTest, ShiftedRowDotsAreDoubleSums) {
  auto backend = CreateCpuBackend(2);
  const int32_t n = 5, dim = 576;
  const std::vector<float> a = RandomFloats(size_t(n) * dim, 3, -4.0f, 4.0f);
  const std::vector<float> b = RandomFloats(size_t(n) * dim, 4, -4.0f, 4.0f);
  const std::vector<float> shift = RandomFloats(dim, 5);
  std::vector<double> out(n);
  backend->ShiftedRowDots(a.data(), shift.data(), b.data(), n, dim, out.data());
  for (int32_t i = 0; i < n; ++i) {
    long double want = 0, magnitude = 0;
    for (int32_t j = 0; j < dim; ++j) {
      const long double term =
          (static_cast<long double>(a[i * dim + j]) - shift[j]) * b[i * dim + j];
      want += term;
      magnitude += std::abs(term);
    }
    EXPECT_NEAR(out[i], static_cast<double>(want), static_cast<double>(magnitude) * dim * 0x1p-52)
        << i;
  }
}

TEST(CpuOpsTest, CopyColumnsCopiesABlockBetweenStrides) {
  auto backend = CreateCpuBackend(1);
  const std::vector<float> src = RandomFloats(4 * 10, 6);
  std::vector<float> dst(4 * 16, -1.0f);
  backend->CopyColumns(src.data() + 2, 10, 4, 7, dst.data() + 5, 16);  // src cols 2..8
  for (int i = 0; i < 4; ++i) {
    for (int j = 0; j < 16; ++j) {
      const float want = j >= 5 && j < 12 ? src[i * 10 + 2 + (j - 5)] : -1.0f;
      ASSERT_EQ(dst[i * 16 + j], want) << i << "," << j;
    }
  }
}

TEST(CpuOpsTest, EmbedAndGatherRowsCopyRows) {
  auto backend = CreateCpuBackend(2);
  const int32_t vocab = 50, dim = 37;
  const std::vector<float> table = RandomFloats(size_t(vocab) * dim, 2);
  const std::vector<int32_t> ids = {0, 49, 7, 7, 13, 0, 25};
  const int32_t n = static_cast<int32_t>(ids.size());
  std::vector<float> embed(size_t(n) * dim), gather(size_t(n) * dim);
  const HostTensor view{reinterpret_cast<const uint8_t*>(table.data()), DType::kF32, vocab, dim,
                        sizeof(float) * dim};
  const Weight packed = *backend->PackWeight({&view, 1});
  backend->Embed(packed, 0, ids.data(), n, embed.data());
  backend->GatherRows(table.data(), dim, ids.data(), n, gather.data());
  for (int32_t i = 0; i < n; ++i) {
    for (int32_t j = 0; j < dim; ++j) {
      ASSERT_EQ(embed[i * dim + j], table[ids[i] * dim + j]) << i << "," << j;
      ASSERT_EQ(gather[i * dim + j], table[ids[i] * dim + j]) << i << "," << j;
    }
  }
  // A vocabulary-parallel rank holding rows [20, 40) of the table: its ids are looked up,
  // every other id gives a zero row (the ranks' rows then sum to the whole lookup).
  const HostTensor slice = view.Rows(20, 20);
  const Weight part = *backend->PackWeight({&slice, 1});
  std::fill(embed.begin(), embed.end(), -1.0f);
  backend->Embed(part, 20, ids.data(), n, embed.data());
  for (int32_t i = 0; i < n; ++i) {
    const bool held = ids[i] >= 20 && ids[i] < 40;
    for (int32_t j = 0; j < dim; ++j) {
      ASSERT_EQ(embed[i * dim + j], held ? table[ids[i] * dim + j] : 0.0f) << i << "," << j;
    }
  }
}

// y = x / sqrt(mean(x^2) + eps) * w in double.
std::vector<double> RmsNormReference(const float* x, const float* w, int32_t dim, float eps) {
  double ss = 0.0;
  for (int32_t j = 0; j < dim; ++j) ss += double{x[j]} * x[j];
  const double r = 1.0 / std::sqrt(ss / dim + double{eps});
  std::vector<double> y(dim);
  for (int32_t j = 0; j < dim; ++j) y[j] = x[j] * r * w[j];
  return y;
}

// Three float roundings (r, x * r, * w) of half an ulp each, relative: within 3 ulp.
constexpr double kNormUlps = 3.0;

TEST(CpuOpsTest, RmsNormMatchesDoubleReference) {
  auto backend = CreateCpuBackend(2);
  struct Case {
    int32_t n, dim;
    float eps, scale;
  };
  for (const Case& c :
       {Case{3, 576, 1e-5f, 1.0f}, Case{100, 576, 1e-5f, 30.0f}, Case{5, 7, 1e-6f, 1e-3f},
        Case{2, 1, 1e-5f, 1.0f}, Case{64, 1000, 1e-5f, 1.0f}, Case{1, 4096, 1e-6f, 1.0f}}) {
    SCOPED_TRACE(::testing::Message() << "n=" << c.n << " dim=" << c.dim);
    const std::vector<float> x = RandomFloats(size_t(c.n) * c.dim, 3, -c.scale, c.scale);
    const std::vector<float> w = RandomFloats(c.dim, 4, 0.5f, 1.5f);
    std::vector<float> out(x.size());
    backend->RmsNorm(x.data(), w.data(), c.n, c.dim, c.eps, out.data());
    double worst = 0.0;
    for (int32_t i = 0; i < c.n; ++i) {
      const auto ref = RmsNormReference(&x[i * c.dim], w.data(), c.dim, c.eps);
      for (int32_t j = 0; j < c.dim; ++j)
        worst = std::max(worst, UlpError(out[i * c.dim + j], ref[j]));
    }
    EXPECT_LE(worst, kNormUlps);
    // In place gives the same bits.
    std::vector<float> in_place = x;
    backend->RmsNorm(in_place.data(), w.data(), c.n, c.dim, c.eps, in_place.data());
    EXPECT_TRUE(BitwiseEqual(in_place, out));
  }
}

TEST(CpuOpsTest, RmsNormHeadsNormalizesEachHeadAndLeavesPadding) {
  auto backend = CreateCpuBackend(2);
  const int32_t n = 9, num_heads = 5, head_dim = 24, ld = num_heads * head_dim + 11;
  const float eps = 1e-6f;
  const std::vector<float> x = RandomFloats(size_t(n) * ld, 5, -3.0f, 3.0f);
  const std::vector<float> w = RandomFloats(head_dim, 6, 0.5f, 1.5f);
  std::vector<float> y = x;
  backend->RmsNormHeads(y.data(), ld, n, num_heads, head_dim, w.data(), eps);
  double worst = 0.0;
  for (int32_t i = 0; i < n; ++i) {
    for (int32_t h = 0; h < num_heads; ++h) {
      const int32_t off = i * ld + h * head_dim;
      const auto ref = RmsNormReference(&x[off], w.data(), head_dim, eps);
      for (int32_t d = 0; d < head_dim; ++d) worst = std::max(worst, UlpError(y[off + d], ref[d]));
    }
    for (int32_t j = num_heads * head_dim; j < ld; ++j) ASSERT_EQ(y[i * ld + j], x[i * ld + j]);
  }
  EXPECT_LE(worst, kNormUlps);
}

// Rotation by the documented angle theta = float(pos) * inv_freq[j] (float product), done in
// double.
void RopeReference(const float* x, int32_t num_heads, int32_t head_dim, int32_t pos,
                   const float* inv_freq, std::vector<double>& out) {
  const int32_t half = head_dim / 2;
  out.assign(size_t(num_heads) * head_dim, 0.0);
  for (int32_t h = 0; h < num_heads; ++h) {
    for (int32_t j = 0; j < half; ++j) {
      const float theta = static_cast<float>(pos) * inv_freq[j];
      const double c = std::cos(double{theta}), s = std::sin(double{theta});
      const double a = x[h * head_dim + j], b = x[h * head_dim + j + half];
      out[h * head_dim + j] = a * c - b * s;
      out[h * head_dim + j + half] = a * s + b * c;
    }
  }
}

TEST(CpuOpsTest, RopeMatchesDoubleReference) {
  auto backend = CreateCpuBackend(2);
  struct Case {
    int32_t num_heads, head_dim, ld_pad;
    float theta;
  };
  const std::vector<int32_t> positions = {0, 1, 2, 17, 63, 64, 1000, 4095, 8191, 131071};
  const int32_t n = static_cast<int32_t>(positions.size());
  for (const Case& c : {Case{9, 64, 0, 100000.0f}, Case{3, 64, 5, 100000.0f},
                        Case{4, 128, 0, 500000.0f}, Case{2, 2, 1, 10000.0f}}) {
    SCOPED_TRACE(::testing::Message() << "heads=" << c.num_heads << " head_dim=" << c.head_dim);
    const int32_t width = c.num_heads * c.head_dim, ld = width + c.ld_pad;
    std::vector<float> inv_freq(c.head_dim / 2);
    for (int32_t j = 0; j < c.head_dim / 2; ++j) {
      inv_freq[j] = static_cast<float>(std::pow(double{c.theta}, -2.0 * j / c.head_dim));
    }
    const std::vector<float> x = RandomFloats(size_t(n) * ld, 7, -2.0f, 2.0f);
    std::vector<float> y = x;
    backend->Rope(y.data(), ld, n, c.num_heads, c.head_dim, positions.data(), inv_freq.data());
    std::vector<double> ref;
    double worst = 0.0;
    for (int32_t i = 0; i < n; ++i) {
      RopeReference(&x[i * ld], c.num_heads, c.head_dim, positions[i], inv_freq.data(), ref);
      for (int32_t k = 0; k < width; ++k) {
        // Error relative to the pair's magnitude: cos/sin rounded to float, two products and
        // a sum in float.
        const int32_t h = k / c.head_dim, j = k % (c.head_dim / 2);
        const double pair = std::abs(x[i * ld + h * c.head_dim + j]) +
                            std::abs(x[i * ld + h * c.head_dim + j + c.head_dim / 2]);
        worst = std::max(worst, std::abs(y[i * ld + k] - ref[k]) / pair);
      }
      for (int32_t k = width; k < ld; ++k) ASSERT_EQ(y[i * ld + k], x[i * ld + k]);
    }
    EXPECT_LE(worst, 2.5e-7);
    // Position 0 is the identity, exactly.
    for (int32_t k = 0; k < width; ++k) ASSERT_EQ(y[k], x[k]) << k;
  }
}

TEST(CpuOpsTest, SwiGluMatchesDoubleReference) {
  auto backend = CreateCpuBackend(2);
  for (int32_t ff : {1536, 37, 8, 1}) {
    SCOPED_TRACE(::testing::Message() << "ff=" << ff);
    const int32_t n = 21;
    std::vector<float> gate_up = RandomFloats(size_t(n) * 2 * ff, 8, -12.0f, 12.0f);
    // Extremes: exp(-g) overflows for very negative g and vanishes for large g.
    const float extremes[] = {-1000.0f, -104.0f, -88.0f, -20.0f, 0.0f, 1e-30f, 20.0f, 89.0f, 1e4f};
    for (size_t e = 0; e < std::size(extremes) && e < size_t(ff); ++e) gate_up[e] = extremes[e];
    std::vector<float> out(size_t(n) * ff);
    backend->SwiGlu(gate_up.data(), n, ff, out.data());
    for (int32_t i = 0; i < n; ++i) {
      for (int32_t j = 0; j < ff; ++j) {
        const double g = gate_up[size_t(i) * 2 * ff + j], u = gate_up[size_t(i) * 2 * ff + ff + j];
        const double ref = g / (1.0 + std::exp(-g)) * u;
        // exp within 2 ulp, then add, divide and multiply: 4 ulp of the result.
        ASSERT_NEAR(out[i * ff + j], ref, 4 * 6e-8 * std::abs(ref) + 1e-37)
            << "g=" << g << " u=" << u;
      }
    }
  }
}

TEST(CpuOpsTest, AddIsElementwise) {
  auto backend = CreateCpuBackend(2);
  for (size_t count : {size_t{1}, size_t{1000}, size_t{300000}}) {
    std::vector<float> x = RandomFloats(count, 9);
    const std::vector<float> y = RandomFloats(count, 10);
    const std::vector<float> x0 = x;
    backend->Add(x.data(), y.data(), count);
    for (size_t i = 0; i < count; ++i) ASSERT_EQ(x[i], x0[i] + y[i]) << i;
  }
}

// StoreKv writes exactly the given slots, each value converted to the cache's dtype as the
// reference rounding gives it; the other slots keep their bytes.
TEST(CpuOpsTest, StoreKvWritesSlotsOnly) {
  auto backend = CreateCpuBackend(2);
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    SCOPED_TRACE(::testing::Message() << "dtype " << static_cast<int>(dtype));
    KvLayerView cache;
    cache.dtype = dtype;
    cache.num_blocks = 6;
    cache.block_size = 4;
    cache.num_kv_heads = 3;
    cache.head_dim = 8;
    const int32_t width = cache.num_kv_heads * cache.head_dim;
    const size_t slot_bytes = ElementBytes(dtype) * width;
    const size_t num_slots = size_t(cache.num_blocks) * cache.block_size;
    std::vector<uint8_t> k_cache(num_slots * slot_bytes, 0xA5),
        v_cache(num_slots * slot_bytes, 0x5A);
    cache.k = k_cache.data();
    cache.v = v_cache.data();
    const std::vector<int32_t> slots = {5, 0, 23, 11, 12};
    const int32_t n = static_cast<int32_t>(slots.size()), ld = 2 * width + 3;  // fused-QKV style
    const std::vector<float> kv = RandomFloats(size_t(n) * ld, 11, -300.0f, 300.0f);
    backend->StoreKv(cache, kv.data(), kv.data() + width, ld, n, slots.data());
    auto stored = [&](const std::vector<uint8_t>& c, size_t slot, int32_t e) {
      float out;
      EXPECT_TRUE(
          DequantizeRow(dtype, c.data() + slot * slot_bytes + ElementBytes(dtype) * e, 1, &out)
              .ok());
      return out;
    };
    auto reference = [&](float x) {
      if (dtype == DType::kF16) return ::ridgeserve::testing::RoundToHalfReference(x);
      if (dtype == DType::kBF16) return ::ridgeserve::testing::RoundToBFloat16Reference(x);
      return x;
    };
    std::vector<bool> written(num_slots, false);
    for (int32_t i = 0; i < n; ++i) {
      written[slots[i]] = true;
      for (int32_t c = 0; c < width; ++c) {
        ASSERT_EQ(stored(k_cache, slots[i], c), reference(kv[i * ld + c]));
        ASSERT_EQ(stored(v_cache, slots[i], c), reference(kv[i * ld + width + c]));
      }
    }
    for (size_t slot = 0; slot < num_slots; ++slot) {
      if (written[slot]) continue;
      for (size_t b = 0; b < slot_bytes; ++b) {
        ASSERT_EQ(k_cache[slot * slot_bytes + b], 0xA5);
        ASSERT_EQ(v_cache[slot * slot_bytes + b], 0x5A);
      }
    }
  }
}

// DequantizeRowsToBf16 (how the CUDA backend stores weights) gives, at any thread count, each
// row's DequantizeRow values rounded by the test's reference bf16 rounding, for tensors of
// K-quant, 32-block and f16 rows stored with padding between rows; it refuses rows closer than
// their storage and a width of partial blocks, naming them.
TEST(DTypeTest, DequantizeRowsToBf16IsEachRowRoundedAtAnyThreadCount) {
  std::mt19937 rng(23);
  for (const auto& [type, cols] :
       {std::pair{DType::kQ4_K, int64_t{512}}, std::pair{DType::kQ8_0, int64_t{96}},
        std::pair{DType::kF16, int64_t{40}}}) {
    SCOPED_TRACE(static_cast<int>(type));
    const int64_t rows = 37;
    const size_t stored = *StorageBytes(type, cols);
    const size_t row_bytes = stored + 24;
    std::vector<uint8_t> bytes(rows * row_bytes);
    for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
    // Finite values: the f16 fields (scales, or the weights themselves) from finite floats.
    const auto put_half = [&](size_t at, float v) {
      const uint16_t h = FloatToHalf(v);
      std::memcpy(&bytes[at], &h, sizeof(h));
    };
    std::uniform_real_distribution<float> value(-0.5f, 0.5f);
    for (int64_t r = 0; r < rows; ++r) {
      const size_t row = r * row_bytes;
      if (type == DType::kF16) {
        for (int64_t c = 0; c < cols; ++c) put_half(row + 2 * c, value(rng));
      } else {
        const size_t block = type == DType::kQ4_K ? 144 : 34;  // d (f16) first
        for (size_t b = 0; b < stored; b += block) {
          put_half(row + b, 0.01f * value(rng));
          if (type == DType::kQ4_K) put_half(row + b + 2, 0.003f * value(rng));  // dmin
        }
      }
    }
    std::vector<float> want(rows * cols);
    for (int64_t r = 0; r < rows; ++r) {
      ASSERT_TRUE(DequantizeRow(type, &bytes[r * row_bytes], cols, &want[r * cols]).ok());
    }
    for (float& w : want) w = ::ridgeserve::testing::RoundToBFloat16Reference(w);
    for (int threads : {0, 1, 2, 3}) {
      std::vector<uint16_t> got(rows * cols, 0xFFFF);
      ASSERT_TRUE(
          DequantizeRowsToBf16(type, bytes.data(), row_bytes, rows, cols, got.data(), threads)
              .ok());
      std::vector<float> widened(got.size());
      for (size_t i = 0; i < got.size(); ++i) {
        const uint32_t b = uint32_t{got[i]} << 16;
        std::memcpy(&widened[i], &b, sizeof(b));
      }
      EXPECT_TRUE(::ridgeserve::testing::BitwiseEqual(want, widened)) << threads << " threads";
    }
  }
  uint16_t out[64];
  const uint8_t row[144] = {};
  const absl::Status close = DequantizeRowsToBf16(DType::kQ8_0, row, 33, 2, 32, out, 1);
  EXPECT_EQ(close.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(close.message()), ::testing::HasSubstr("33 bytes apart hold 34"));
  const absl::Status partial = DequantizeRowsToBf16(DType::kQ4_K, row, 144, 1, 200, out, 1);
  EXPECT_EQ(partial.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(partial.message()), ::testing::HasSubstr("200"));
}

// HalfToFloat and DequantizeRow's F16 rows (a vectorized loop over it where the compiler can)
// against GCC's _Float16 widening at every one of the 65,536 f16 values: the same bits, and a NaN
// keeps its payload (the f16 mantissa in the f32 mantissa's top bits; the sign too).
TEST(DTypeTest, HalfToFloatIsExactForEveryHalf) {
  std::vector<uint16_t> all(0x10000);
  std::iota(all.begin(), all.end(), uint16_t{0});
  std::vector<float> row(all.size());
  ASSERT_TRUE(DequantizeRow(DType::kF16, reinterpret_cast<const uint8_t*>(all.data()),
                            static_cast<int64_t>(all.size()), row.data())
                  .ok());
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    _Float16 x16;
    std::memcpy(&x16, &all[h], sizeof(x16));
    const float want = static_cast<float>(x16);
    uint32_t want_bits;
    std::memcpy(&want_bits, &want, sizeof(want_bits));
    if (std::isnan(want)) want_bits = ((h & 0x8000u) << 16) | 0x7F800000u | ((h & 0x3FFu) << 13);
    for (const float got : {HalfToFloat(static_cast<uint16_t>(h)), row[h]}) {
      uint32_t bits;
      std::memcpy(&bits, &got, sizeof(bits));
      ASSERT_EQ(bits, want_bits) << "f16 bits 0x" << std::hex << h;
    }
  }
}

// FloatToHalf / FloatToBFloat16 (the KV cache's rounding) against the test's reference
// rounding on every f32 exponent, the rounding boundaries, ties, subnormals, overflow and NaN.
TEST(DTypeTest, FloatToHalfAndBFloat16RoundToNearestEven) {
  std::vector<float> xs;
  std::mt19937 rng(17);
  for (int i = 0; i < 200000; ++i) {
    const uint32_t bits = static_cast<uint32_t>(rng());
    float x;
    std::memcpy(&x, &bits, sizeof(x));
    xs.push_back(x);
  }
  // Values near every f16 and bf16 value: the value, the midpoints and one f32 ulp around.
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const float f16 = HalfToFloat(static_cast<uint16_t>(h));
    const uint32_t b16 = h << 16;
    float bf;
    std::memcpy(&bf, &b16, sizeof(bf));
    for (float v : {f16, bf}) {
      if (!std::isfinite(v)) continue;
      xs.push_back(v);
      xs.push_back(std::nextafter(v, INFINITY));
      xs.push_back(std::nextafter(v, -INFINITY));
    }
    const float next16 = HalfToFloat(static_cast<uint16_t>(h + 1));
    if ((h & 0x7FFFu) < 0x7BFFu && std::isfinite(next16)) {
      const float mid = static_cast<float>((double{f16} + next16) / 2);  // exact in f32
      xs.insert(xs.end(), {mid, std::nextafter(mid, INFINITY), std::nextafter(mid, -INFINITY)});
    }
  }
  xs.insert(xs.end(), {65504.0f, 65519.996f, 65520.0f, 1e30f, -1e30f, INFINITY, -INFINITY, 0x1p-25f,
                       0x1.8p-25f, 0x1p-26f, 3.0e38f, 3.4028235e38f, -0.0f});
  // StoreKv's vectorized narrowing gives FloatToHalf's and FloatToBFloat16's bits (NaN too).
  std::vector<uint16_t> f16(xs.size()), bf16(xs.size());
  cpu::simd::NarrowF16(xs.data(), static_cast<int64_t>(xs.size()),
                       reinterpret_cast<uint8_t*>(f16.data()));
  cpu::simd::NarrowBF16(xs.data(), static_cast<int64_t>(xs.size()),
                        reinterpret_cast<uint8_t*>(bf16.data()));
  for (size_t i = 0; i < xs.size(); ++i) {
    ASSERT_EQ(f16[i], FloatToHalf(xs[i])) << xs[i];
    ASSERT_EQ(bf16[i], FloatToBFloat16(xs[i])) << xs[i];
  }
  for (float x : xs) {
    const float half = HalfToFloat(FloatToHalf(x));
    const float want_half = ::ridgeserve::testing::RoundToHalfReference(x);
    uint32_t bf_bits = uint32_t{FloatToBFloat16(x)} << 16;
    float bf;
    std::memcpy(&bf, &bf_bits, sizeof(bf));
    const float want_bf = ::ridgeserve::testing::RoundToBFloat16Reference(x);
    if (std::isnan(x)) {
      ASSERT_TRUE(std::isnan(half) && std::isnan(bf));
      continue;
    }
    ASSERT_EQ(std::memcmp(&half, &want_half, 4), 0)
        << x << " -> f16 " << half << " want " << want_half;
    ASSERT_EQ(std::memcmp(&bf, &want_bf, 4), 0) << x << " -> bf16 " << bf << " want " << want_bf;
  }
}

// Row-wise ops give the same bits for a row alone, in a batch, and with 1 or 2 threads.
TEST(CpuOpsTest, RowOpsAreBatchInvariant) {
  auto one = CreateCpuBackend(1);
  auto two = CreateCpuBackend(2);
  const int32_t n = 200, dim = 576, ff = 1536, heads = 9, head_dim = 64;
  const std::vector<float> x = RandomFloats(size_t(n) * 2 * ff, 12, -4.0f, 4.0f);
  const std::vector<float> w = RandomFloats(2 * ff, 13, 0.5f, 1.5f);
  std::vector<int32_t> positions(n);
  for (int32_t i = 0; i < n; ++i) positions[i] = 37 * i;
  std::vector<float> inv_freq(head_dim / 2);
  for (int32_t j = 0; j < head_dim / 2; ++j) inv_freq[j] = std::pow(1e5f, -2.0f * j / head_dim);

  auto run = [&](Backend& b, int32_t first, int32_t count, std::vector<float>& norm,
                 std::vector<float>& rope, std::vector<float>& swiglu) {
    b.RmsNorm(&x[first * dim], w.data(), count, dim, 1e-5f, &norm[first * dim]);
    std::copy(&x[first * dim], &x[(first + count) * dim], &rope[first * dim]);
    b.Rope(&rope[first * dim], dim, count, heads, head_dim, &positions[first], inv_freq.data());
    b.SwiGlu(&x[size_t(first) * 2 * ff], count, ff, &swiglu[size_t(first) * ff]);
  };
  std::vector<float> norm_all(size_t(n) * dim), rope_all(size_t(n) * dim), swi_all(size_t(n) * ff);
  run(*two, 0, n, norm_all, rope_all, swi_all);
  std::vector<float> norm_one(norm_all.size()), rope_one(rope_all.size()), swi_one(swi_all.size());
  for (int32_t i = 0; i < n; ++i) run(*one, i, 1, norm_one, rope_one, swi_one);
  EXPECT_TRUE(BitwiseEqual(norm_all, norm_one));
  EXPECT_TRUE(BitwiseEqual(rope_all, rope_one));
  EXPECT_TRUE(BitwiseEqual(swi_all, swi_one));
}

// simd::Exp drives attention's softmax and SwiGlu: within 2 ulp of exp over its normal range.
TEST(SimdExpTest, WithinTwoUlpAndEdgeCases) {
  using cpu::simd::kLanes;
  double worst = 0.0;
  float worst_x = 0.0f;
  std::vector<float> xs;
  for (double x = -87.0; x <= 88.5; x += 1.0 / 4096) xs.push_back(static_cast<float>(x));
  for (float x : RandomFloats(100000, 14, -2.0f, 2.0f)) xs.push_back(x);
  while (xs.size() % kLanes != 0) xs.push_back(0.0f);
  float out[kLanes];
  for (size_t i = 0; i < xs.size(); i += kLanes) {
    cpu::simd::Store(out, cpu::simd::Exp(cpu::simd::Load(&xs[i])));
    for (int l = 0; l < kLanes; ++l) {
      const double err = UlpError(out[l], std::exp(double{xs[i + l]}));
      if (err > worst) {
        worst = err;
        worst_x = xs[i + l];
      }
    }
  }
  EXPECT_LE(worst, 2.0) << "at x=" << worst_x;

  const float inf = std::numeric_limits<float>::infinity();
  float special[kLanes];
  const float inputs[] = {0.0f, -inf, inf, std::nanf(""), -200.0f, 100.0f, 88.7f, -0.0f};
  for (int l = 0; l < kLanes; ++l) special[l] = inputs[l % std::size(inputs)];
  cpu::simd::Store(out, cpu::simd::Exp(cpu::simd::Load(special)));
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], 0.0f);
  EXPECT_EQ(out[2], inf);
  EXPECT_TRUE(std::isnan(out[3]));
  EXPECT_EQ(out[4], 0.0f);
  EXPECT_EQ(out[5], inf);
  EXPECT_LE(UlpError(out[6], std::exp(double{88.7f})), 2.0);
  EXPECT_EQ(out[7], 1.0f);
}

}  // namespace
}  // namespace ridgeserve
