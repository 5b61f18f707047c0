// RidgeFillMaps::Load on a small synthetic LlamaModel (random K/V projection rows, CPU backend):
// shape and kind checks, and what each target kind uploads — pre_norm maps as given, post_norm
// folded with the layer's K/V rows (A = P W, a = P b + c), kv as given, and the key scale
// folded into the K rows — compared with products computed here in double.
#include "engine/ridgefill/ridgefill_maps.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "engine/model/config.h"
#include "engine/model/llama.h"
#include "engine/ridgefill/map_file.h"
#include "kernels/cpu/cpu_backend.h"
#include "tests/ridgefill/synthetic_model.h"

namespace ridgeserve {
namespace {

using testing_synthetic::Config;
using testing_synthetic::kHeadDim;
using testing_synthetic::kHeads;
using testing_synthetic::kHidden;
using testing_synthetic::kKvDim;
using testing_synthetic::kKvHeads;
using testing_synthetic::kLayers;
using testing_synthetic::kQDim;

std::vector<float> Random(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> dist;
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

class RidgeFillMapsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_ = CreateCpuBackend(1);
    const ModelConfig c = Config();
    ModelWeights w;
    std::mt19937 rng(7);
    for (int32_t l = 0; l < kLayers; ++l) {
      LayerWeights lw;
      wqkv_.push_back(Random(static_cast<size_t>(kQDim + 2 * kKvDim) * kHidden, rng));
      bqkv_.push_back(Random(kQDim + 2 * kKvDim, rng));
      lw.wqkv = Pack(wqkv_.back(), kQDim + 2 * kKvDim, kHidden);
      lw.bqkv = Upload(bqkv_.back());
      w.layers.push_back(std::move(lw));
    }
    model_ = std::make_unique<LlamaModel>(c, std::move(w), *backend_);
  }

  DeviceBuffer Upload(const std::vector<float>& v) {
    return testing_synthetic::Upload(*backend_, v);
  }
  Weight Pack(const std::vector<float>& v, int64_t rows, int64_t cols) {
    return testing_synthetic::Pack(*backend_, v, rows, cols);
  }
  std::vector<float> Download(const Weight& w) {
    std::vector<float> v(static_cast<size_t>(w.rows() * w.cols()));
    EXPECT_TRUE(backend_->UnpackWeight(w, 0, w.rows(), v.data()).ok());
    return v;
  }
  std::vector<float> Download(const DeviceBuffer& b) {
    std::vector<float> v(b.bytes() / sizeof(float));
    backend_->CopyToHost(v.data(), b.as<void>(), b.bytes());
    return v;
  }

  // Maps for split 1 (layers 3, 4) of `kind`, random W and b, optional key scale.
  MapSet Maps(MapTarget kind, bool key_scale) {
    const int32_t out_dim = kind == MapTarget::kKv ? 2 * kKvDim : kHidden;
    std::mt19937 rng(11);
    MapSet m;
    m.model.model_name = "synthetic";
    m.model.num_layers = kLayers;
    m.model.hidden = kHidden;
    m.num_kv_heads = kKvHeads;
    m.head_dim = kHeadDim;
    m.kind = kind;
    SplitMaps s;
    s.split_layer = 1;
    for (int32_t l = 3; l < kLayers; ++l) {
      weights_.push_back(Random(static_cast<size_t>(out_dim) * kHidden, rng));
      biases_.push_back(Random(out_dim, rng));
      scales_.push_back({1.25f, 0.75f});
      TargetMap t;
      t.layer = l;
      t.out_dim = out_dim;
      t.weight = weights_.back();
      t.bias = biases_.back();
      if (key_scale) t.key_scale = scales_.back();
      s.targets.push_back(t);
    }
    m.splits.push_back(std::move(s));
    return m;
  }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<LlamaModel> model_;
  std::vector<std::vector<float>> wqkv_, bqkv_;
  // The map arrays a MapSet's views point into (moving the outer vectors keeps the buffers).
  std::vector<std::vector<float>> weights_, biases_, scales_;
};

TEST_F(RidgeFillMapsTest, PreNormUploadsTheMapAsGiven) {
  const MapSet m = Maps(MapTarget::kPreNorm, false);
  auto maps = RidgeFillMaps::Load(m, *model_);
  ASSERT_TRUE(maps.ok()) << maps.status();
  const RidgeFillSplitMaps* s = (*maps)->FindSplit(1);
  ASSERT_NE(s, nullptr);
  EXPECT_FALSE(s->folded);
  EXPECT_EQ(Download(s->by_layer[3].weight), weights_[0]);
  EXPECT_EQ(Download(s->by_layer[4].bias), biases_[1]);
  EXPECT_EQ(s->by_layer[3].kv_weight.bytes(), 0u);  // the model's own K/V rows are used
}

// Expected folded K/V weights of target t at `layer`: kind post_norm → P W, P b + c; kv → W, b.
// Then K rows of head h times scale[h] (when given).
void ExpectFolded(const std::vector<float>& got_w, const std::vector<float>& got_b,
                  const std::vector<float>& wqkv, const std::vector<float>& bqkv,
                  const std::vector<float>& w, const std::vector<float>& b, bool post_norm,
                  const std::vector<float>* scale) {
  ASSERT_EQ(got_w.size(), static_cast<size_t>(2 * kKvDim) * kHidden);
  ASSERT_EQ(got_b.size(), static_cast<size_t>(2 * kKvDim));
  for (int32_t j = 0; j < 2 * kKvDim; ++j) {
    const double g = scale != nullptr && j < kKvDim ? (*scale)[j / kHeadDim] : 1.0;
    const float* p = &wqkv[static_cast<size_t>(kQDim + j) * kHidden];
    double want_b = post_norm ? bqkv[kQDim + j] : b[j];
    for (int32_t i = 0; i < kHidden; ++i) {
      double want = 0;
      if (post_norm) {
        for (int32_t m = 0; m < kHidden; ++m) want += double{p[m]} * w[m * kHidden + i];
      } else {
        want = w[j * kHidden + i];
      }
      EXPECT_NEAR(got_w[j * kHidden + i], g * want, 1e-4 * (1 + std::fabs(want)))
          << "row " << j << " col " << i;
    }
    if (post_norm) {
      for (int32_t m = 0; m < kHidden; ++m) want_b += double{p[m]} * b[m];
    }
    EXPECT_NEAR(got_b[j], g * want_b, 1e-4 * (1 + std::fabs(want_b))) << "bias " << j;
  }
}

TEST_F(RidgeFillMapsTest, PostNormIsFoldedWithTheLayersKvRows) {
  for (bool key_scale : {false, true}) {
    weights_.clear();
    biases_.clear();
    scales_.clear();
    const MapSet m = Maps(MapTarget::kPostNorm, key_scale);
    auto maps = RidgeFillMaps::Load(m, *model_);
    ASSERT_TRUE(maps.ok()) << maps.status();
    const RidgeFillSplitMaps* s = (*maps)->FindSplit(1);
    ASSERT_TRUE(s->folded);
    for (int32_t t = 0; t < 2; ++t) {
      const RidgeFillLayerMap& lm = s->by_layer[3 + t];
      EXPECT_EQ(lm.weight.bytes(), 0u);
      ExpectFolded(Download(lm.kv_weight), Download(lm.kv_bias), wqkv_[3 + t], bqkv_[3 + t],
                   weights_[t], biases_[t], /*post_norm=*/true, key_scale ? &scales_[t] : nullptr);
    }
  }
}

TEST_F(RidgeFillMapsTest, KvIsUploadedWithTheKeyScaleFolded) {
  const MapSet m = Maps(MapTarget::kKv, true);
  auto maps = RidgeFillMaps::Load(m, *model_);
  ASSERT_TRUE(maps.ok()) << maps.status();
  const RidgeFillLayerMap& lm = (*maps)->FindSplit(1)->by_layer[4];
  ExpectFolded(Download(lm.kv_weight), Download(lm.kv_bias), wqkv_[4], bqkv_[4], weights_[1],
               biases_[1], /*post_norm=*/false, &scales_[1]);
}

TEST_F(RidgeFillMapsTest, PreNormKeyScaleScalesACopyOfTheModelsKvRows) {
  const MapSet m = Maps(MapTarget::kPreNorm, true);
  auto maps = RidgeFillMaps::Load(m, *model_);
  ASSERT_TRUE(maps.ok()) << maps.status();
  const RidgeFillLayerMap& lm = (*maps)->FindSplit(1)->by_layer[3];
  EXPECT_EQ(Download(lm.weight), weights_[0]);
  // The model's own K/V rows and bias, K rows scaled: the "kv" expectation with W = P, b = c.
  std::vector<float> p(wqkv_[3].begin() + static_cast<size_t>(kQDim) * kHidden, wqkv_[3].end());
  std::vector<float> c(bqkv_[3].begin() + kQDim, bqkv_[3].end());
  ExpectFolded(Download(lm.kv_weight), Download(lm.kv_bias), wqkv_[3], bqkv_[3], p, c,
               /*post_norm=*/false, &scales_[0]);
}

TEST_F(RidgeFillMapsTest, RejectsBadShapesAndScales) {
  {  // kv maps with pre_norm's width
    MapSet m = Maps(MapTarget::kPreNorm, false);
    m.kind = MapTarget::kKv;
    auto maps = RidgeFillMaps::Load(m, *model_);
    EXPECT_EQ(maps.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(maps.status().message().find("kv map is not"), std::string::npos) << maps.status();
  }
  {  // post_norm maps with kv's width
    MapSet m = Maps(MapTarget::kKv, false);
    m.kind = MapTarget::kPostNorm;
    EXPECT_EQ(RidgeFillMaps::Load(m, *model_).status().code(), absl::StatusCode::kInvalidArgument);
  }
  {  // a missing layer
    MapSet m = Maps(MapTarget::kKv, false);
    m.splits[0].targets.pop_back();
    auto maps = RidgeFillMaps::Load(m, *model_);
    EXPECT_EQ(maps.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(maps.status().message().find("no map for layer 4"), std::string::npos);
  }
  {  // a key scale that is not > 0, and one with the wrong count
    MapSet m = Maps(MapTarget::kKv, true);
    scales_[0] = {1.0f, 0.0f};
    m.splits[0].targets[0].key_scale = scales_[0];
    EXPECT_EQ(RidgeFillMaps::Load(m, *model_).status().code(), absl::StatusCode::kInvalidArgument);
    m.splits[0].targets[0].key_scale = std::span<const float>(scales_[1]).first(1);
    EXPECT_EQ(RidgeFillMaps::Load(m, *model_).status().code(), absl::StatusCode::kInvalidArgument);
  }
  {  // maps for another shape of model
    MapSet m = Maps(MapTarget::kKv, false);
    m.head_dim = 2;
    EXPECT_EQ(RidgeFillMaps::Load(m, *model_).status().code(), absl::StatusCode::kInvalidArgument);
  }
}

// The leverage test's decisions at seven thresholds against leverages (h − μ)ᵀ M (h − μ)
// computed here in double, for states whose mean dwarfs their spread (every channel's mean
// 1e5-1.2e6, spread 1): each row is sent back to exact exactly when its leverage is over the
// threshold, for every row not within 1e-4 of it. The rows are centred before M: computing
// M h − M μ instead loses (h − μ) to the rounding of M h, which this test sees in f32 (10
// decisions flipped, one for a leverage 2.3% above its threshold); a GEMM that rounds its input
// to bf16, as on CUDA, would lose it at means ~100 times the spread (estimated), as a model's
// massive-activation channels have.
TEST_F(RidgeFillMapsTest, LeverageTestIsExactEnoughWhereTheMeanDwarfsTheSpread) {
  const int32_t rows = 128;
  std::mt19937 rng(21);
  // M: symmetric positive definite, A Aᵀ / hidden + 0.1 I.
  const std::vector<float> a = Random(static_cast<size_t>(kHidden) * kHidden, rng);
  std::vector<float> inverse(static_cast<size_t>(kHidden) * kHidden);
  for (int32_t i = 0; i < kHidden; ++i) {
    for (int32_t j = 0; j < kHidden; ++j) {
      double sum = i == j ? 0.1 : 0.0;
      for (int32_t k = 0; k < kHidden; ++k)
        sum += double{a[i * kHidden + k]} * a[j * kHidden + k] / kHidden;
      inverse[i * kHidden + j] = static_cast<float>(sum);
    }
  }
  std::vector<float> mean(kHidden), h(static_cast<size_t>(rows) * kHidden);
  for (int32_t j = 0; j < kHidden; ++j) mean[j] = 1e5f * static_cast<float>(1 + j);
  const std::vector<float> spread = Random(h.size(), rng);
  for (size_t i = 0; i < h.size(); ++i) h[i] = mean[i % kHidden] + spread[i];
  std::vector<double> want(rows);
  for (int32_t r = 0; r < rows; ++r) {
    for (int32_t i = 0; i < kHidden; ++i) {
      for (int32_t j = 0; j < kHidden; ++j) {
        want[r] += (double{h[r * kHidden + i]} - mean[i]) * inverse[i * kHidden + j] *
                   (double{h[r * kHidden + j]} - mean[j]);
      }
    }
  }
  std::vector<double> sorted = want;
  std::sort(sorted.begin(), sorted.end());
  ASSERT_TRUE(model_->ReserveWorkspace(rows, 1, 1).ok());
  const DeviceBuffer on_backend = Upload(h);
  MapSet m = Maps(MapTarget::kPreNorm, false);
  m.splits[0].leverage_inverse = inverse;
  m.splits[0].leverage_mean = mean;
  int32_t checked = 0;
  for (int32_t eighth = 1; eighth < 8; ++eighth) {
    const float threshold = static_cast<float>(sorted[static_cast<size_t>(eighth * rows / 8)]);
    auto maps = RidgeFillMaps::Load(m, *model_, threshold);
    ASSERT_TRUE(maps.ok()) << maps.status();
    ASSERT_TRUE((*maps)->SelectsExactRows(1));
    std::vector<int32_t> exact(rows, -1);
    (*maps)->SelectExactRows(*model_, FilledRows{1, rows, on_backend.as<float>(), nullptr, nullptr},
                             exact);
    for (int32_t r = 0; r < rows; ++r) {
      if (std::fabs(want[r] - threshold) <= 1e-4 * threshold) continue;
      ++checked;
      EXPECT_EQ(exact[r], want[r] > threshold ? 1 : 0)
          << "row " << r << ": leverage " << want[r] << ", threshold " << threshold;
    }
  }
  EXPECT_GE(checked, 7 * rows - 14);
}

}  // namespace
}  // namespace ridgeserve
