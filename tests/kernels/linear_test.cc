// CPU Linear on packed weights of every stored type: the arithmetic linear.h states (checked
// bitwise against an emulation written here from that text), accuracy against a double
// reference on the dequantized weights, the same bits on every dispatch path this CPU has, and
// the batch invariance the engine relies on.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/dtype.h"
#include "tests/kernels/kernel_test_util.h"

namespace ridgeserve {
namespace {

using ::ridgeserve::testing::FirstBitDifference;
using ::ridgeserve::testing::RandomFloats;

constexpr DType kAllTypes[] = {DType::kF32,  DType::kF16,  DType::kBF16, DType::kQ8_0, DType::kQ4_0,
                               DType::kQ4_1, DType::kQ5_0, DType::kQ5_1, DType::kQ2_K, DType::kQ3_K,
                               DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};

uint16_t FloatToHalf(float f) {
  const _Float16 h = static_cast<_Float16>(f);  // rounded to nearest; tiny values to subnormals
  uint16_t bits;
  std::memcpy(&bits, &h, sizeof(bits));
  return bits;
}

void PutHalf(uint8_t* p, float f) {
  const uint16_t h = FloatToHalf(f);
  std::memcpy(p, &h, sizeof(h));
}

// Stored rows [rows, cols] of `type` with random quants and small finite scales, so the values
// look like weights (|w| around 0.01 to 0.1).
struct Stored {
  std::vector<uint8_t> bytes;
  HostTensor view;
};

Stored MakeStored(DType type, int64_t rows, int64_t cols, uint32_t seed) {
  const TypeTraits traits = *GetTypeTraits(type);
  const size_t row_bytes = *StorageBytes(type, cols);
  Stored s;
  s.bytes.resize(row_bytes * rows);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  if (traits.block_elements == 1) {
    for (int64_t i = 0; i < rows * cols; ++i) {
      const float v = 0.1f * unit(rng);
      if (type == DType::kF32) {
        std::memcpy(&s.bytes[4 * i], &v, 4);
      } else if (type == DType::kF16) {
        PutHalf(&s.bytes[2 * i], v == 0 ? 0.01f : v);
      } else {
        uint32_t bits;
        std::memcpy(&bits, &v, 4);
        const uint16_t b = static_cast<uint16_t>(bits >> 16);
        std::memcpy(&s.bytes[2 * i], &b, 2);
      }
    }
  } else {
    for (uint8_t& b : s.bytes) b = static_cast<uint8_t>(rng());
    const size_t blocks = s.bytes.size() / traits.block_bytes;
    for (size_t b = 0; b < blocks; ++b) {
      uint8_t* block = &s.bytes[b * traits.block_bytes];
      const float d = 0.004f + 0.004f * std::abs(unit(rng));
      const float m = -0.03f * std::abs(unit(rng));
      switch (type) {
        case DType::kQ4_1:
        case DType::kQ5_1:
        case DType::kQ4_K:
        case DType::kQ5_K:
          PutHalf(block, type == DType::kQ4_K || type == DType::kQ5_K ? d / 8 : d);
          PutHalf(block + 2, type == DType::kQ4_K || type == DType::kQ5_K ? -m / 8 : m);
          break;
        case DType::kQ2_K:
          PutHalf(block + 80, d);
          PutHalf(block + 82, -m / 4);
          break;
        case DType::kQ3_K:
          PutHalf(block + 108, d / 8);
          break;
        case DType::kQ6_K:
          PutHalf(block + 208, d / 32);
          break;
        default:  // Q4_0, Q5_0, Q8_0: d first
          PutHalf(block, type == DType::kQ8_0 ? d / 16 : d);
          break;
      }
    }
  }
  s.view = HostTensor{s.bytes.data(), type, rows, cols, row_bytes};
  return s;
}

std::vector<float> Dequantized(const Stored& s) {
  std::vector<float> out(s.view.rows * s.view.cols);
  for (int64_t r = 0; r < s.view.rows; ++r) {
    EXPECT_TRUE(DequantizeRow(s.view.dtype, s.view.data + r * s.view.row_bytes, s.view.cols,
                              &out[r * s.view.cols])
                    .ok());
  }
  return out;
}

// linear.h's arithmetic, written from its text.
std::vector<float> Contract(const std::vector<float>& x, int32_t n, const std::vector<float>& w,
                            int64_t m, int64_t k, const float* bias) {
  std::vector<float> y(size_t(n) * m);
  const int64_t k8 = (k + 7) / 8 * 8;
  for (int32_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < m; ++j) {
      float acc[8] = {};
      for (int64_t c = 0; c < k8; c += 8) {
        for (int l = 0; l < 8; ++l) {
          const bool in = c + l < k;
          acc[l] = std::fma(in ? x[i * k + c + l] : 0.0f, in ? w[j * k + c + l] : 0.0f, acc[l]);
        }
      }
      float v = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
      if (bias != nullptr) v = v + bias[j];
      y[i * m + j] = v;
    }
  }
  return y;
}

// The int8 arithmetic of linear.h, written from its text, for the 32-block integer formats.
std::vector<float> ContractInt8(const std::vector<float>& x, int32_t n, const Stored& w,
                                const float* bias) {
  const int64_t m = w.view.rows, k = w.view.cols, nb = k / 32;
  const bool has_min = w.view.dtype != DType::kQ8_0;
  std::vector<int32_t> qx(size_t(n) * k);
  std::vector<float> dx(size_t(n) * nb), sx(size_t(n) * nb);
  for (int32_t i = 0; i < n; ++i) {
    for (int64_t b = 0; b < nb; ++b) {
      float amax = 0;
      for (int e = 0; e < 32; ++e) amax = std::max(amax, std::fabs(x[i * k + 32 * b + e]));
      int32_t sum = 0;
      for (int e = 0; e < 32; ++e) {
        const float v = x[i * k + 32 * b + e] * (amax > 0 ? 127.0f / amax : 0.0f);
        qx[i * k + 32 * b + e] = static_cast<int32_t>(std::nearbyint(v));
        sum += qx[i * k + 32 * b + e];
      }
      dx[i * nb + b] = amax / 127.0f;
      sx[i * nb + b] = dx[i * nb + b] * static_cast<float>(sum);
    }
  }
  std::vector<float> y(size_t(n) * m);
  for (int64_t j = 0; j < m; ++j) {
    std::vector<float> dw(nb), mw(nb);
    std::vector<uint8_t> q(k);
    IntegerBlocks32(w.view.dtype, w.view.data + j * w.view.row_bytes, k, dw.data(), mw.data(),
                    q.data());
    for (int32_t i = 0; i < n; ++i) {
      float acc[8] = {}, accm[8] = {};
      for (int64_t b = 0; b < nb; ++b) {
        int32_t p = 0;
        for (int e = 0; e < 32; ++e) {
          const int32_t qw = has_min ? q[32 * b + e] : static_cast<int8_t>(q[32 * b + e]);
          p += qw * qx[i * k + 32 * b + e];
        }
        acc[b % 8] = std::fma(static_cast<float>(p), dw[b] * dx[i * nb + b], acc[b % 8]);
        accm[b % 8] = std::fma(mw[b], sx[i * nb + b], accm[b % 8]);
      }
      auto r = [](const float* a) {
        return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
      };
      float v = has_min ? r(acc) + r(accm) : r(acc);
      if (bias != nullptr) v = v + bias[j];
      y[i * m + j] = v;
    }
  }
  return y;
}

std::string Name(DType t) { return std::string(GetTypeTraits(t)->name); }

struct Path {
  cpu::Isa isa;
  cpu::Activations activations;
};

std::vector<Path> AllPaths() {
  std::vector<Path> out;
  for (cpu::Isa isa : cpu::AvailableIsas()) {
    for (cpu::Activations a : {cpu::Activations::kF32, cpu::Activations::kInt8}) {
      out.push_back({isa, a});
    }
  }
  return out;
}

class LinearTest : public ::testing::TestWithParam<Path> {
 protected:
  std::unique_ptr<Backend> Make(int threads) {
    return CreateCpuBackend(threads, GetParam().isa, GetParam().activations);
  }
  bool Int8(DType type) const {
    return GetParam().activations == cpu::Activations::kInt8 && HasIntegerBlocks32(type);
  }
};

TEST_P(LinearTest, FollowsTheStatedArithmeticForEveryType) {
  auto backend = Make(2);
  for (DType type : kAllTypes) {
    const int64_t block = GetTypeTraits(type)->block_elements;
    for (int64_t k : {block == 1 ? int64_t{5} : block, 2 * block, int64_t{576 / block * block}}) {
      if (k == 0) continue;
      SCOPED_TRACE(Name(type) + " k=" + std::to_string(k));
      const int64_t m = 7;
      const Stored w = MakeStored(type, m, k, 11);
      const Weight packed = *backend->PackWeight({&w.view, 1});
      EXPECT_EQ(packed.rows(), m);
      EXPECT_EQ(packed.cols(), k);
      // The stored bytes, or for the 32-block formats f32 scales with the same integers (in
      // 16-row tiles, the last padded with zero rows, for int8 on AVX2 and better).
      const bool tiles = GetParam().activations == cpu::Activations::kInt8 &&
                         GetParam().isa >= cpu::Isa::kAvx2 && HasIntegerBlocks32(type);
      const size_t nb = static_cast<size_t>((tiles ? 16 : m) * k / 32);
      const size_t packed_bytes =
          !HasIntegerBlocks32(type)                                              ? w.bytes.size()
          : type == DType::kQ8_0                                                 ? nb * 36
          : type == DType::kQ4_0 || type == DType::kQ4_1 || type == DType::kQ4_K ? nb * 24
                                                                                 : nb * 40;
      EXPECT_EQ(packed.bytes(), packed_bytes);
      const std::vector<float> bias = RandomFloats(m, 4);
      // Fewer rows than a tile, and more (19: more than an AMX tile's 16).
      for (const float* b : {static_cast<const float*>(nullptr), bias.data()}) {
        for (int32_t n : {1, 2, 6, 19}) {
          const std::vector<float> x = RandomFloats(size_t(n) * k, 3);
          std::vector<float> y(size_t(n) * m);
          backend->Linear(x.data(), n, packed, b, y.data());
          const std::vector<float> want =
              Int8(type) ? ContractInt8(x, n, w, b) : Contract(x, n, Dequantized(w), m, k, b);
          EXPECT_EQ(FirstBitDifference(y.data(), want.data(), y.size()), -1);
          // UnpackWeight gives DequantizeRow's values whatever the packing.
          std::vector<float> rows(size_t(m) * k);
          ASSERT_TRUE(backend->UnpackWeight(packed, 0, m, rows.data()).ok());
          const std::vector<float> stored = Dequantized(w);
          EXPECT_EQ(FirstBitDifference(rows.data(), stored.data(), rows.size()), -1);
        }
      }
    }
  }
}

TEST_P(LinearTest, MatchesDoubleReference) {
  auto backend = Make(2);
  struct Shape {
    int32_t n;
    int64_t k, m;
  };
  for (DType type : {DType::kF32, DType::kQ4_1, DType::kQ8_0, DType::kQ6_K}) {
    for (const Shape& s : {Shape{1, 576, 576}, Shape{7, 576, 192}, Shape{33, 1536, 576},
                           Shape{64, 768, 3072}, Shape{2, 576, 4099}}) {
      if (s.k % GetTypeTraits(type)->block_elements != 0) continue;
      SCOPED_TRACE(Name(type) + " n=" + std::to_string(s.n) + " k=" + std::to_string(s.k) +
                   " m=" + std::to_string(s.m));
      const Stored w = MakeStored(type, s.m, s.k, 5);
      const std::vector<float> wf = Dequantized(w);
      const Weight packed = *backend->PackWeight({&w.view, 1});
      const std::vector<float> x = RandomFloats(size_t(s.n) * s.k, 1);
      std::vector<float> y(size_t(s.n) * s.m);
      backend->Linear(x.data(), s.n, packed, nullptr, y.data());
      // f32: error in units of u * sum_k |x w| (u = 2^-24), the scale of float rounding in a
      // dot product (a few are seen; the worst-case bound is k). int8: an activation moves by
      // at most half a step, amax_b / 254, so the bound is sum_b amax_b / 254 * sum |w| over
      // the block; the measured error must stay within it (plus float rounding).
      double worst = 0.0, worst_int8 = 0.0;
      for (int32_t i = 0; i < s.n; ++i) {
        for (int64_t j = 0; j < s.m; ++j) {
          double ref = 0.0, mag = 0.0, quant = 0.0;
          for (int64_t b = 0; b < s.k / 32; ++b) {
            double amax = 0.0, wsum = 0.0;
            for (int64_t c = 32 * b; c < 32 * b + 32; ++c) {
              const double p = double{x[i * s.k + c]} * wf[j * s.k + c];
              ref += p;
              mag += std::abs(p);
              amax = std::max(amax, std::abs(double{x[i * s.k + c]}));
              wsum += std::abs(double{wf[j * s.k + c]});
            }
            quant += amax / 254.0 * wsum;
          }
          const double err = std::abs(y[i * s.m + j] - ref);
          worst = std::max(worst, err / (mag * 0x1p-24));
          worst_int8 = std::max(worst_int8, err / (quant + 16 * mag * 0x1p-24));
        }
      }
      if (Int8(type)) {
        EXPECT_LE(worst_int8, 1.0);
        EXPECT_GT(worst, 100.0);  // and it really took the int8 path
      } else {
        EXPECT_LE(worst, 8.0);
      }
    }
  }
}

// A row's bits do not depend on how many rows share the call, where the row sits in it, the
// alignment of x, the output-row range asked for, or the thread count.
TEST_P(LinearTest, RowsAreBitwiseBatchInvariant) {
  struct Shape {
    int32_t n;
    int64_t k, m;
  };
  // The default model's projections: qkv, k/v, gate+up, down, and (narrowed) the LM head.
  for (const Shape& s : {Shape{130, 576, 960}, Shape{70, 576, 384}, Shape{70, 576, 3072},
                         Shape{70, 1536, 576}, Shape{9, 576, 8192}}) {
    for (DType type : {DType::kQ4_1, DType::kQ8_0, DType::kF32}) {
      SCOPED_TRACE(Name(type) + " k=" + std::to_string(s.k) + " m=" + std::to_string(s.m));
      auto two = Make(2);
      const Stored w = MakeStored(type, s.m, s.k, 6);
      const Weight packed = *two->PackWeight({&w.view, 1});
      const std::vector<float> x = RandomFloats(size_t(s.n) * s.k, 4);
      const std::vector<float> bias = RandomFloats(s.m, 6);
      std::vector<float> full(size_t(s.n) * s.m);
      two->Linear(x.data(), s.n, packed, bias.data(), full.data());
      auto check = [&](Backend& backend, int32_t first, int32_t count, int misalign) {
        std::vector<float> xs(size_t(count) * s.k + misalign);
        std::memcpy(xs.data() + misalign, &x[size_t(first) * s.k],
                    size_t(count) * s.k * sizeof(float));
        std::vector<float> part(size_t(count) * s.m);
        backend.Linear(xs.data() + misalign, count, packed, bias.data(), part.data());
        const int64_t diff =
            FirstBitDifference(part.data(), &full[size_t(first) * s.m], part.size());
        EXPECT_EQ(diff, -1) << "rows [" << first << ", " << first + count << ") misalign "
                            << misalign << ": first differing row "
                            << (diff < 0 ? -1 : first + diff / s.m);
      };
      for (int32_t count : {1, 2, 3, 4, 5, 7, 8, 17, 33, 64, 65}) {
        for (int32_t first : {0, 1, 5, s.n - count}) {
          if (first < 0 || first + count > s.n) continue;
          check(*two, first, count, (first + count) % 3);
        }
      }
      auto one = Make(1);
      auto three = Make(3);
      for (int32_t row = 0; row < s.n; row += 11) check(*one, row, 1, row % 2);
      check(*three, 0, s.n, 0);
      // Output-row ranges (the fill path takes the K/V rows of the fused QKV this way).
      for (auto [begin, rows] :
           {std::pair<int64_t, int64_t>{0, 1}, {1, 5}, {s.m / 3, s.m / 2}, {s.m - 7, 7}}) {
        std::vector<float> part(size_t(s.n) * rows);
        two->LinearRows(x.data(), s.n, packed, begin, rows, bias.data() + begin, part.data());
        for (int32_t i = 0; i < s.n; ++i) {
          ASSERT_EQ(FirstBitDifference(&part[i * rows], &full[i * s.m + begin], rows), -1)
              << "rows [" << begin << ", " << begin + rows << ") of x row " << i;
        }
      }
    }
  }
}

// Parts of different types (a Q4_K_M file's fused QKV mixes Q4_K and Q6_K) are one weight
// whose rows compute as each part alone.
TEST_P(LinearTest, MixedTypePartsStackAsOneWeight) {
  auto backend = Make(2);
  const int64_t k = 512;
  const Stored a = MakeStored(DType::kQ4_K, 10, k, 1), b = MakeStored(DType::kQ6_K, 4, k, 2),
               c = MakeStored(DType::kQ4_K, 4, k, 3);
  const HostTensor parts[] = {a.view, b.view, c.view};
  const Weight stacked = *backend->PackWeight(parts);
  ASSERT_EQ(stacked.rows(), 18);
  const std::vector<float> x = RandomFloats(size_t(3) * k, 9);
  std::vector<float> y(3 * 18);
  backend->Linear(x.data(), 3, stacked, nullptr, y.data());
  int64_t offset = 0;
  for (const Stored* s : {&a, &b, &c}) {
    const Weight alone = *backend->PackWeight({&s->view, 1});
    std::vector<float> ya(3 * s->view.rows);
    backend->Linear(x.data(), 3, alone, nullptr, ya.data());
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(FirstBitDifference(&ya[i * s->view.rows], &y[i * 18 + offset], s->view.rows), -1);
    }
    offset += s->view.rows;
  }
  // UnpackWeight and Embed give DequantizeRow's values across the segment boundaries.
  std::vector<float> rows(size_t(18) * k);
  ASSERT_TRUE(backend->UnpackWeight(stacked, 0, 18, rows.data()).ok());
  std::vector<float> want = Dequantized(a), wb = Dequantized(b), wc = Dequantized(c);
  want.insert(want.end(), wb.begin(), wb.end());
  want.insert(want.end(), wc.begin(), wc.end());
  EXPECT_EQ(FirstBitDifference(rows.data(), want.data(), want.size()), -1);
  const std::vector<int32_t> ids = {17, 0, 10, 13, 14};
  std::vector<float> embed(ids.size() * k);
  backend->Embed(stacked, 0, ids.data(), static_cast<int32_t>(ids.size()), embed.data());
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(FirstBitDifference(&embed[i * k], &want[ids[i] * k], k), -1) << ids[i];
  }
  EXPECT_EQ(backend->UnpackWeight(stacked, 10, 9, rows.data()).code(),
            absl::StatusCode::kOutOfRange);
}

INSTANTIATE_TEST_SUITE_P(EveryPathThisCpuHas, LinearTest, ::testing::ValuesIn(AllPaths()),
                         [](const ::testing::TestParamInfo<Path>& info) {
                           return std::string(cpu::IsaName(info.param.isa)) + "_" +
                                  std::string(cpu::ActivationsName(info.param.activations));
                         });

// Every path gives the scalar path's bits (the scalar path is the arithmetic written out).
TEST(LinearDispatchTest, EveryPathGivesTheSameBits) {
  const std::vector<cpu::Isa> isas = cpu::AvailableIsas();
  ASSERT_EQ(isas.front(), cpu::Isa::kScalar);
  std::printf("CPU kernel paths on this machine:");
  for (cpu::Isa isa : isas) std::printf(" %s", std::string(cpu::IsaName(isa)).c_str());
  std::printf("\n");
  for (cpu::Activations a : {cpu::Activations::kF32, cpu::Activations::kInt8}) {
    auto reference = CreateCpuBackend(2, cpu::Isa::kScalar, a);
    for (DType type : kAllTypes) {
      const int64_t k = GetTypeTraits(type)->block_elements == 1 ? 587 : 768;
      const Stored w = MakeStored(type, 37, k, 21);
      const std::vector<float> x = RandomFloats(size_t(19) * k, 22);
      const Weight ref_weight = *reference->PackWeight({&w.view, 1});
      std::vector<float> want(19 * 37);
      reference->Linear(x.data(), 19, ref_weight, nullptr, want.data());
      for (cpu::Isa isa : isas) {
        auto backend = CreateCpuBackend(2, isa, a);
        const Weight packed = *backend->PackWeight({&w.view, 1});
        std::vector<float> y(want.size());
        backend->Linear(x.data(), 19, packed, nullptr, y.data());
        EXPECT_EQ(FirstBitDifference(y.data(), want.data(), y.size()), -1)
            << Name(type) << " on " << cpu::IsaName(isa) << " " << cpu::ActivationsName(a);
      }
    }
  }
}

TEST(LinearPackTest, RefusesWhatItCannotHold) {
  auto backend = CreateCpuBackend(1);
  const Stored a = MakeStored(DType::kQ4_1, 2, 64, 1), b = MakeStored(DType::kQ4_1, 2, 96, 1);
  const HostTensor mismatched[] = {a.view, b.view};
  EXPECT_THAT(std::string(backend->PackWeight(mismatched).status().message()),
              ::testing::HasSubstr("columns"));
  HostTensor ints = a.view;
  ints.dtype = DType::kI32;
  EXPECT_EQ(backend->PackWeight({&ints, 1}).status().code(), absl::StatusCode::kUnimplemented);
  HostTensor q81 = a.view;
  q81.dtype = DType::kQ8_1;
  EXPECT_EQ(backend->PackWeight({&q81, 1}).status().code(), absl::StatusCode::kUnimplemented);
  HostTensor ragged = a.view;
  ragged.cols = 40;
  EXPECT_EQ(backend->PackWeight({&ragged, 1}).status().code(), absl::StatusCode::kInvalidArgument);
  // A tensor-parallel shard: whole blocks of columns, and rows.
  EXPECT_TRUE(a.view.Cols(32, 32).ok());
  EXPECT_FALSE(a.view.Cols(16, 32).ok());
  const Weight shard = *backend->PackWeight({&a.view, 1});
  std::vector<float> all(2 * 64), right(1 * 32);
  ASSERT_TRUE(backend->UnpackWeight(shard, 0, 2, all.data()).ok());
  const HostTensor view = a.view.Rows(1, 1).Cols(32, 32).value();
  const Weight part = *backend->PackWeight({&view, 1});
  ASSERT_TRUE(backend->UnpackWeight(part, 0, 1, right.data()).ok());
  EXPECT_EQ(FirstBitDifference(right.data(), &all[64 + 32], 32), -1);
}

}  // namespace
}  // namespace ridgeserve
