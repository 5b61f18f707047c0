#include "engine/model/llama.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/common/status_macros.h"
#include "engine/ridgefill/ridgefill_maps.h"

namespace ridgeserve {

int32_t ForwardBatch::AddSequence(std::span<const int32_t> table_blocks, int32_t block_size,
                                  std::span<const int32_t> new_tokens, int32_t start_pos,
                                  bool want_logits) {
  const int32_t seq_index = static_cast<int32_t>(block_table_offsets.size()) - 1;
  block_tables.insert(block_tables.end(), table_blocks.begin(), table_blocks.end());
  block_table_offsets.push_back(static_cast<int32_t>(block_tables.size()));
  for (size_t i = 0; i < new_tokens.size(); ++i) {
    const int32_t pos = start_pos + static_cast<int32_t>(i);
    tokens.push_back(new_tokens[i]);
    positions.push_back(pos);
    seq.push_back(seq_index);
    slots.push_back(table_blocks[pos / block_size] * block_size + pos % block_size);
  }
  if (want_logits && !new_tokens.empty()) logit_rows.push_back(num_rows() - 1);
  return seq_index;
}

void ForwardBatch::RequestAllLogits() {
  logit_rows.resize(tokens.size());
  for (int32_t i = 0; i < num_rows(); ++i) logit_rows[i] = i;
}

LlamaModel::LlamaModel(const ModelConfig& config, ModelWeights weights, Backend& backend)
    : LlamaModel(config, std::move(weights), backend, *PlanShard(config, 0, 1), nullptr) {}

LlamaModel::LlamaModel(const ModelConfig& config, ModelWeights weights, Backend& backend,
                       const ShardLayout& shard, Communicator* comm)
    : config_(config),
      shard_(shard),
      comm_(shard.size > 1 ? comm : nullptr),
      heads_(shard.num_heads),
      kv_heads_(shard.num_kv_heads),
      q_dim_(shard.q_dim(config.head_dim)),
      kv_dim_(shard.kv_dim(config.head_dim)),
      ffn_(shard.ffn),
      weights_(std::move(weights)),
      backend_(backend) {}

absl::Status LlamaModel::EnsureWorkspace(int32_t rows, int64_t meta_ints) {
  auto alloc = [&](DeviceBuffer& buffer, int64_t n, size_t element) -> absl::Status {
    RS_ASSIGN_OR_RETURN(buffer, backend_.Alloc(element * n));
    return absl::OkStatus();
  };
  if (rows > capacity_rows_) {
    const int64_t qkv_dim = q_dim_ + 2 * kv_dim_;
    const int64_t r = rows;
    for (auto [buffer, n] : {std::pair{&x_, r * config_.hidden},
                             {&xn_, r * config_.hidden},
                             {&qkv_, r * qkv_dim},
                             {&attn_, r * q_dim_},
                             {&proj_, r * config_.hidden},
                             {&gate_up_, r * 2 * ffn_},
                             {&act_, r * ffn_},
                             {&head_in_, r * config_.hidden}}) {
      RS_RETURN_IF_ERROR(alloc(*buffer, n, sizeof(float)));
    }
    RS_RETURN_IF_ERROR(alloc(perm_, r, sizeof(int32_t)));
    capacity_rows_ = rows;
  }
  if (meta_ints > capacity_meta_) {
    RS_RETURN_IF_ERROR(alloc(step_meta_, meta_ints, sizeof(int32_t)));
    capacity_meta_ = meta_ints;
  }
  return absl::OkStatus();
}

absl::Status LlamaModel::UploadStepMeta(const ForwardBatch& batch) {
  const std::vector<int32_t>& rope =
      batch.rope_positions.empty() ? batch.positions : batch.rope_positions;
  const std::vector<int32_t>* parts[] = {
      &batch.tokens,     &batch.positions,           &batch.seq,          &batch.slots,
      &batch.logit_rows, &batch.block_table_offsets, &batch.block_tables, &rope};
  int64_t total = 0;
  for (const std::vector<int32_t>* part : parts) total += static_cast<int64_t>(part->size());
  RS_RETURN_IF_ERROR(EnsureWorkspace(batch.num_rows(), total));
  host_meta_.clear();
  int32_t* base = step_meta_.as<int32_t>();
  int32_t** pointers[] = {&meta_.tokens,       &meta_.positions,     &meta_.seq,
                          &meta_.slots,        &meta_.logit_rows,    &meta_.block_table_offsets,
                          &meta_.block_tables, &meta_.rope_positions};
  for (size_t i = 0; i < std::size(parts); ++i) {
    *pointers[i] = base + host_meta_.size();
    host_meta_.insert(host_meta_.end(), parts[i]->begin(), parts[i]->end());
  }
  backend_.CopyToDevice(base, host_meta_.data(), sizeof(int32_t) * host_meta_.size());
  return absl::OkStatus();
}

double ForwardProfile::SavedSecondsPerRow(int32_t split_layer, int32_t num_layers) const {
  for (const Fill& f : fills) {
    if (f.split_layer != split_layer || f.rows == 0) continue;
    return (num_layers - 1 - split_layer) * full_layer_row_seconds - f.seconds / f.rows;
  }
  return 0;
}

absl::Status LlamaModel::Forward(const ForwardBatch& input, PagedKvCache& cache,
                                 std::vector<float>& logits, ForwardCapture* capture,
                                 ForwardProfile* profile) {
  const int32_t n = input.num_rows();
  if (n == 0) return absl::InvalidArgumentError("forward: empty batch");
  if (profile != nullptr) *profile = ForwardProfile{};
  const int32_t num_layers = input.num_layers == 0 ? config_.num_layers : input.num_layers;
  if (num_layers < 0 || num_layers > config_.num_layers || num_layers > cache.shape().num_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("forward: num_layers ", input.num_layers, " outside [0, ", config_.num_layers,
                     "] or above the cache's ", cache.shape().num_layers, " layers"));
  }
  if (!input.rope_positions.empty() && static_cast<int32_t>(input.rope_positions.size()) != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "forward: rope_positions has ", input.rope_positions.size(), " entries for ", n, " rows"));
  }
  if (capture != nullptr) {
    for (int32_t d : capture->depths) {
      if (d < 0 || d > num_layers) {
        return absl::InvalidArgumentError(
            absl::StrCat("forward: capture depth ", d, " outside [0, ", num_layers, "]"));
      }
    }
    for (int32_t r : capture->query_rows) {
      if (r < 0 || r >= n) {
        return absl::InvalidArgumentError(
            absl::StrCat("forward: capture query row ", r, " outside [0, ", n, ")"));
      }
    }
    for (int32_t l : capture->query_layers) {
      if (l < 0 || l >= num_layers) {
        return absl::InvalidArgumentError(
            absl::StrCat("forward: capture query layer ", l, " outside [0, ", num_layers, ")"));
      }
    }
    capture->states.resize(capture->depths.size());
    capture->queries.assign(capture->query_layers.size(), {});
  }
  for (int32_t t : input.tokens) {
    if (t < 0 || t >= config_.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("forward: token id ", t, " outside vocabulary of ", config_.vocab_size));
    }
  }

  // RidgeFill: reorder rows by decreasing split (exact rows first), so that the rows still
  // running full layers at layer l — exact rows and filled rows with split >= l — are always
  // a prefix, and each split's filled rows are a contiguous range whose residual rows stay
  // frozen at h_s once the prefix has moved past them. Every op is row-invariant, so the
  // exact rows' results do not depend on the reordering.
  bool any_fill = false;
  if (!input.fill_split.empty()) {
    if (static_cast<int32_t>(input.fill_split.size()) != n) {
      return absl::InvalidArgumentError(absl::StrCat(
          "forward: fill_split has ", input.fill_split.size(), " entries for ", n, " rows"));
    }
    for (int32_t s : input.fill_split) {
      if (s < -1) {
        return absl::InvalidArgumentError(absl::StrCat("forward: fill split ", s, " < -1"));
      }
      any_fill |= s >= 0;
    }
  }
  ForwardBatch reordered;
  std::vector<FillGroup> groups;
  int32_t num_exact = n;
  std::vector<int32_t> order;      // input row of each reordered row
  std::vector<int32_t> new_index;  // reordered row of each input row
  if (any_fill) {
    if ((capture != nullptr && !capture->depths.empty()) || num_layers != config_.num_layers) {
      return absl::InvalidArgumentError(
          "forward: residual capture or num_layers with RidgeFill rows is not supported");
    }
    if (!input.fill_maps.empty() && static_cast<int32_t>(input.fill_maps.size()) != n) {
      return absl::InvalidArgumentError(absl::StrCat(
          "forward: fill_maps has ", input.fill_maps.size(), " entries for ", n, " rows"));
    }
    auto maps_of = [&](int32_t row) {
      const RidgeFillMaps* m = input.fill_maps.empty() ? nullptr : input.fill_maps[row];
      return m != nullptr ? m : ridgefill_maps_;
    };
    // Exact rows first, then filled rows by descending split, each split's rows by maps.
    auto key = [&](int32_t row) {
      const int32_t s = input.fill_split[row];
      return std::pair(s < 0 ? std::numeric_limits<int32_t>::max() : s,
                       s < 0 ? uintptr_t{0} : reinterpret_cast<uintptr_t>(maps_of(row)));
    };
    order.resize(n);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return key(a) > key(b); });
    const RidgeFillMaps* group_maps = nullptr;
    new_index.resize(n);
    reordered.block_table_offsets = input.block_table_offsets;
    reordered.block_tables = input.block_tables;
    for (int32_t i = 0; i < n; ++i) {
      const int32_t r = order[i];
      new_index[r] = i;
      reordered.tokens.push_back(input.tokens[r]);
      reordered.positions.push_back(input.positions[r]);
      if (!input.rope_positions.empty())
        reordered.rope_positions.push_back(input.rope_positions[r]);
      reordered.seq.push_back(input.seq[r]);
      reordered.slots.push_back(input.slots[r]);
      const int32_t s = input.fill_split[r];
      if (s < 0) continue;
      if (groups.empty() || groups.back().split != s || group_maps != maps_of(r)) {
        group_maps = maps_of(r);
        if (group_maps == nullptr) {
          return absl::FailedPreconditionError("forward: RidgeFill rows but no maps are loaded");
        }
        const RidgeFillSplitMaps* maps = group_maps->FindSplit(s, shard_.rank);
        if (maps == nullptr) {
          return absl::InvalidArgumentError(
              absl::StrCat("forward: no RidgeFill maps for split layer ", s));
        }
        if (groups.empty()) num_exact = i;
        groups.push_back(FillGroup{s, i, 0, maps});
      }
      ++groups.back().count;
    }
    for (int32_t r : input.logit_rows) {
      if (r < 0 || r >= n || input.fill_split[r] >= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("forward: logit row ", r, " is not an exact row"));
      }
      reordered.logit_rows.push_back(new_index[r]);
    }
  }
  const ForwardBatch& batch = any_fill ? reordered : input;
  // Captured query rows in the batch as run (exact rows keep their reordered places).
  std::vector<int32_t> query_rows;
  if (capture != nullptr) {
    for (int32_t r : capture->query_rows) {
      if (any_fill && input.fill_split[r] >= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("forward: capture query row ", r, " is not an exact row"));
      }
      query_rows.push_back(any_fill ? new_index[r] : r);
    }
  }

  RS_RETURN_IF_ERROR(UploadStepMeta(batch));

  const ModelConfig& c = config_;
  const int32_t q_dim = q_dim_, kv_dim = kv_dim_, qkv_dim = q_dim + 2 * kv_dim;
  float* x = x_.as<float>();  // reassigned when leverage promotion permutes the rows
  float* xn = xn_.as<float>();
  float* qkv = qkv_.as<float>();
  float* proj = proj_.as<float>();
  const float* inv_freq = weights_.rope_inv_freq.as<float>();
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  // Copies the residual stream x (after `depth` layers) into every capture slot asking for it.
  auto capture_at = [&](int32_t depth) {
    for (size_t i = 0; i < capture->depths.size(); ++i) {
      if (capture->depths[i] != depth) continue;
      std::vector<float>& out = capture->states[i];
      out.resize(static_cast<size_t>(n) * c.hidden);
      backend_.CopyToHost(out.data(), x, sizeof(float) * out.size());
    }
  };

  // Copies the captured query rows of layer l (post-RoPE, the rank's heads).
  auto capture_queries = [&](int32_t l, const float* q) {
    for (size_t i = 0; i < capture->query_layers.size(); ++i) {
      if (capture->query_layers[i] != l) continue;
      std::vector<float>& out = capture->queries[i];
      out.resize(query_rows.size() * q_dim);
      for (size_t j = 0; j < query_rows.size(); ++j) {
        backend_.CopyToHost(out.data() + j * q_dim,
                            q + static_cast<size_t>(query_rows[j]) * qkv_dim,
                            sizeof(float) * q_dim);
      }
    }
  };

  // Profiling (filled rows only): layers 0..lowest split run every row in full.
  const bool timed = profile != nullptr && !groups.empty();
  const int32_t lowest_split = groups.empty() ? -1 : groups.back().split;
  std::vector<double> fill_seconds(groups.size(), 0.0);
  double full_seconds = 0;
  auto Now = [&] {
    backend_.Synchronize();
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  };

  // Sums a row-parallel projection's partial rows over the ranks (TP > 1).
  auto all_reduce = [&](float* data, int32_t rows) -> absl::Status {
    if (comm_ == nullptr) return absl::OkStatus();
    return comm_->AllReduceSum(data, static_cast<size_t>(rows) * c.hidden);
  };

  backend_.Embed(weights_.token_embd, shard_.vocab_begin, meta_.tokens, n, x);
  RS_RETURN_IF_ERROR(all_reduce(x, n));
  for (int32_t l = 0; l < num_layers; ++l) {
    if (timed && l <= lowest_split) full_seconds -= Now();
    if (capture != nullptr) capture_at(l);
    for (size_t gi = 0; max_leverage_ > 0 && gi < groups.size(); ++gi) {
      if (groups[gi].split + 1 == l) {
        RS_RETURN_IF_ERROR(PromoteOutliers(gi, groups, num_exact, reordered, order, profile));
        x = x_.as<float>();  // the rows were permuted into a fresh buffer
      }
    }
    const LayerWeights& w = weights_.layers[l];
    const KvLayerView kv = cache.layer(l);
    // Rows running this layer in full: exact rows and filled rows whose split is >= l.
    int32_t na = num_exact;
    // Filled rows past their split only write this layer's K/V, before the full rows'
    // attention reads the cache.
    for (const FillGroup& g : groups) {
      if (g.split >= l) {
        na += g.count;
        continue;
      }
      if (g.count == 0) continue;
      if (timed) fill_seconds[&g - groups.data()] -= Now();
      WriteFilledKv(l, g, kv);
      if (timed) fill_seconds[&g - groups.data()] += Now();
    }
    if (na == 0) continue;
    const AttentionRows rows{na, meta_.positions, meta_.seq, meta_.block_table_offsets,
                             meta_.block_tables};
    // Attention block: x += o_proj(attention(rope(qkv(norm(x))))).
    backend_.RmsNorm(x, w.attn_norm.as<float>(), na, c.hidden, c.rms_eps, xn);
    backend_.Linear(xn, na, w.wqkv, w.bqkv.bytes() > 0 ? w.bqkv.as<float>() : nullptr, qkv);
    float* q = qkv;
    float* k = qkv + q_dim;
    float* v = qkv + q_dim + kv_dim;
    if (c.qk_norm) {
      backend_.RmsNormHeads(q, qkv_dim, na, heads_, c.head_dim, w.q_norm.as<float>(), c.rms_eps);
      backend_.RmsNormHeads(k, qkv_dim, na, kv_heads_, c.head_dim, w.k_norm.as<float>(), c.rms_eps);
    }
    backend_.Rope(q, qkv_dim, na, heads_, c.head_dim, meta_.rope_positions, inv_freq);
    backend_.Rope(k, qkv_dim, na, kv_heads_, c.head_dim, meta_.rope_positions, inv_freq);
    if (capture != nullptr) capture_queries(l, q);
    backend_.StoreKv(kv, k, v, qkv_dim, na, meta_.slots);
    backend_.Attention(q, qkv_dim, heads_, kv, rows, scale, attn_.as<float>());
    backend_.Linear(attn_.as<float>(), na, w.wo, nullptr, proj);
    RS_RETURN_IF_ERROR(all_reduce(proj, na));
    backend_.Add(x, proj, static_cast<size_t>(na) * c.hidden);
    // MLP block: x += down(silu(gate(norm(x))) * up(norm(x))).
    backend_.RmsNorm(x, w.ffn_norm.as<float>(), na, c.hidden, c.rms_eps, xn);
    backend_.Linear(xn, na, w.w_gate_up, nullptr, gate_up_.as<float>());
    backend_.SwiGlu(gate_up_.as<float>(), na, ffn_, act_.as<float>());
    backend_.Linear(act_.as<float>(), na, w.w_down, nullptr, proj);
    RS_RETURN_IF_ERROR(all_reduce(proj, na));
    backend_.Add(x, proj, static_cast<size_t>(na) * c.hidden);
    if (timed && l <= lowest_split) full_seconds += Now();
  }
  if (timed) {
    profile->full_layer_row_seconds = full_seconds / (static_cast<double>(lowest_split + 1) * n);
    profile->fills.clear();
    // One entry per split: groups of one split (several maps) are summed.
    for (size_t i = 0; i < groups.size(); ++i) {
      if (i == 0 || groups[i].split != groups[i - 1].split) {
        profile->fills.push_back({groups[i].split, 0, 0});
      }
      profile->fills.back().rows += groups[i].count;
      profile->fills.back().seconds += fill_seconds[i];
    }
  }
  if (capture != nullptr) capture_at(num_layers);

  const int32_t m = static_cast<int32_t>(batch.logit_rows.size());
  logits.clear();
  if (m == 0) return absl::OkStatus();
  if (m > capacity_logit_rows_) {
    const size_t floats = size_t(m) * shard_.vocab_stride;
    RS_ASSIGN_OR_RETURN(logits_, backend_.Alloc(sizeof(float) * floats));
    if (comm_ != nullptr) {
      RS_ASSIGN_OR_RETURN(gathered_, backend_.Alloc(sizeof(float) * floats * shard_.size));
    }
    capacity_logit_rows_ = m;
  }
  backend_.GatherRows(x, c.hidden, meta_.logit_rows, m, head_in_.as<float>());
  backend_.RmsNorm(head_in_.as<float>(), weights_.output_norm.as<float>(), m, c.hidden, c.rms_eps,
                   head_in_.as<float>());
  backend_.Linear(head_in_.as<float>(), m, weights_.lm_head_or_embedding(), nullptr,
                  logits_.as<float>());
  return GatherLogits(m, logits);
}

absl::Status LlamaModel::GatherLogits(int32_t m, std::vector<float>& logits) {
  const int32_t vocab = config_.vocab_size;
  if (comm_ == nullptr) {
    logits.resize(static_cast<size_t>(m) * vocab);
    backend_.CopyToHost(logits.data(), logits_.as<void>(), sizeof(float) * logits.size());
    return absl::OkStatus();
  }
  // Every rank sends [m, stride] floats (its [m, shard vocab] rows, padded on the last rank).
  const int32_t stride = shard_.vocab_stride;
  const size_t per_rank = static_cast<size_t>(m) * stride;
  RS_RETURN_IF_ERROR(comm_->AllGather(logits_.as<float>(), per_rank, gathered_.as<float>()));
  if (shard_.rank != 0) return absl::OkStatus();
  std::vector<float> host(per_rank * shard_.size);
  backend_.CopyToHost(host.data(), gathered_.as<void>(), sizeof(float) * host.size());
  logits.resize(static_cast<size_t>(m) * vocab);
  for (int32_t r = 0; r < shard_.size; ++r) {
    const int32_t begin = std::min(r * stride, vocab);
    const int32_t width = std::min(stride, vocab - begin);  // rank r's shard vocab
    for (int32_t i = 0; i < m; ++i) {
      const float* src = host.data() + r * per_rank + static_cast<size_t>(i) * width;
      std::copy(src, src + width, logits.begin() + static_cast<size_t>(i) * vocab + begin);
    }
  }
  return absl::OkStatus();
}

absl::Status LlamaModel::PromoteOutliers(size_t gi, std::vector<FillGroup>& groups,
                                         int32_t& num_exact, ForwardBatch& batch,
                                         std::vector<int32_t>& order, ForwardProfile* profile) {
  FillGroup& g = groups[gi];
  const RidgeFillSplitMaps& maps = *g.maps;
  const int32_t hidden = config_.hidden;
  if (maps.leverage_mean.empty() || g.count == 0) return absl::OkStatus();
  // promote[i] = 1 when row g.begin + i is an outlier: decided on rank 0, broadcast.
  std::vector<int32_t> promote(g.count, 0);
  if (shard_.rank == 0) {
    // leverage = (h − μ) · (M h − M μ), with M h − M μ from one GEMM on the backend.
    const float* h_s = x_.as<float>() + static_cast<size_t>(g.begin) * hidden;
    backend_.Linear(h_s, g.count, maps.leverage_inverse, maps.leverage_bias.as<float>(),
                    proj_.as<float>());
    std::vector<float> h(static_cast<size_t>(g.count) * hidden), y(h.size());
    backend_.CopyToHost(h.data(), h_s, sizeof(float) * h.size());
    backend_.CopyToHost(y.data(), proj_.as<float>(), sizeof(float) * y.size());
    for (int32_t i = 0; i < g.count; ++i) {
      double leverage = 0;
      for (int32_t j = 0; j < hidden; ++j) {
        leverage +=
            (static_cast<double>(h[static_cast<size_t>(i) * hidden + j]) - maps.leverage_mean[j]) *
            y[static_cast<size_t>(i) * hidden + j];
      }
      promote[i] = leverage > max_leverage_;
    }
  }
  if (comm_ != nullptr) {
    const size_t bytes = sizeof(int32_t) * promote.size();
    backend_.CopyToDevice(perm_.as<void>(), promote.data(), bytes);
    RS_RETURN_IF_ERROR(comm_->Broadcast(perm_.as<void>(), bytes, 0));
    backend_.CopyToHost(promote.data(), perm_.as<void>(), bytes);
  }
  std::vector<int32_t> promoted, kept;
  for (int32_t i = 0; i < g.count; ++i) (promote[i] ? promoted : kept).push_back(g.begin + i);
  if (promoted.empty()) return absl::OkStatus();
  // Rotate rows [num_exact, g.begin + count): promoted rows join the exact prefix, the groups
  // of higher splits (still running full layers) move up behind them, the kept rows stay last.
  const int32_t n = batch.num_rows();
  const int32_t p = static_cast<int32_t>(promoted.size());
  std::vector<int32_t> perm(n);  // new row i comes from old row perm[i]
  std::iota(perm.begin(), perm.end(), 0);
  int32_t next = num_exact;
  for (int32_t r : promoted) perm[next++] = r;
  for (int32_t r = num_exact; r < g.begin; ++r) perm[next++] = r;
  for (int32_t r : kept) perm[next++] = r;
  backend_.CopyToDevice(perm_.as<void>(), perm.data(), sizeof(int32_t) * n);
  backend_.GatherRows(x_.as<float>(), hidden, perm_.as<int32_t>(), n, head_in_.as<float>());
  std::swap(x_, head_in_);
  auto permute = [&](std::vector<int32_t>& v, int32_t* device) {
    std::vector<int32_t> old = v;
    for (int32_t i = 0; i < n; ++i) v[i] = old[perm[i]];
    if (device != nullptr) backend_.CopyToDevice(device, v.data(), sizeof(int32_t) * n);
  };
  permute(batch.positions, meta_.positions);
  if (batch.rope_positions.empty()) {
    backend_.CopyToDevice(meta_.rope_positions, batch.positions.data(), sizeof(int32_t) * n);
  } else {
    permute(batch.rope_positions, meta_.rope_positions);
  }
  permute(batch.seq, meta_.seq);
  permute(batch.slots, meta_.slots);
  permute(order, nullptr);
  if (profile != nullptr) {
    for (int32_t i = num_exact; i < num_exact + p; ++i) profile->promoted_rows.push_back(order[i]);
  }
  num_exact += p;
  for (size_t k = 0; k < gi; ++k) groups[k].begin += p;
  g.begin += p;
  g.count -= p;
  return absl::OkStatus();
}

}  // namespace ridgeserve
