#include "engine/model/llama.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/common/status_macros.h"
#include "spdlog/spdlog.h"

namespace ridgeserve {
namespace {

// The end of the run of consecutive values that starts at rows[begin].
size_t RunEnd(std::span<const int32_t> rows, size_t begin) {
  size_t end = begin + 1;
  while (end < rows.size() && rows[end] == rows[end - 1] + 1) ++end;
  return end;
}

}  // namespace

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
  // Recordings point at the buffers: they go before the first buffer moves, so a growth that
  // fails half-way leaves none pointing at freed memory.
  if (rows > capacity_rows_) {
    graphs_.clear();
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
    graphs_.clear();
    RS_RETURN_IF_ERROR(alloc(step_meta_, meta_ints, sizeof(int32_t)));
    capacity_meta_ = meta_ints;
  }
  return absl::OkStatus();
}

absl::Status LlamaModel::EnsureLogitRows(int32_t rows) {
  if (rows <= capacity_logit_rows_) return absl::OkStatus();
  graphs_.clear();  // before a buffer moves, as in EnsureWorkspace
  const size_t floats = size_t(rows) * shard_.vocab_stride;
  RS_ASSIGN_OR_RETURN(logits_, backend_.Alloc(sizeof(float) * floats));
  if (comm_ != nullptr) {
    RS_ASSIGN_OR_RETURN(gathered_, backend_.Alloc(sizeof(float) * floats * shard_.size));
    if (shard_.rank == 0) {
      RS_ASSIGN_OR_RETURN(head_logits_,
                          backend_.Alloc(sizeof(float) * size_t(rows) * config_.vocab_size));
    }
  }
  capacity_logit_rows_ = rows;
  return absl::OkStatus();
}

int64_t LlamaModel::StepMetaInts(int32_t rows, int32_t seqs, int64_t block_table_ints) {
  // UploadStepMeta's parts: five of a row each (token, position, sequence, slot, RoPE position)
  // and the logit rows, the block-table offsets and the block tables.
  return 5 * int64_t{rows} + seqs + (seqs + 1) + block_table_ints;
}

absl::Status LlamaModel::ReserveWorkspace(int32_t rows, int32_t seqs, int64_t block_table_ints) {
  RS_RETURN_IF_ERROR(EnsureWorkspace(rows, StepMetaInts(rows, seqs, block_table_ints)));
  RS_RETURN_IF_ERROR(EnsureLogitRows(seqs));
  RS_RETURN_IF_ERROR(backend_.ReserveOps(StepOpShapes(config_, shard_, rows, kv_cache_dtype_)));
  if (comm_ != nullptr) {
    RS_RETURN_IF_ERROR(comm_->ReserveAllReduce(static_cast<size_t>(rows) * config_.hidden));
  }
  // Each sequence's repetition-penalty context is at most the model's context.
  return shard_.rank == 0 ? backend_.ReserveSampling(seqs, config_.vocab_size,
                                                     int64_t{seqs} * config_.context_length)
                          : absl::OkStatus();
}

absl::Status LlamaModel::UploadStepMeta(const ForwardBatch& batch) {
  const std::vector<int32_t>& rope =
      batch.rope_positions.empty() ? batch.positions : batch.rope_positions;
  const std::vector<int32_t>* parts[] = {&batch.tokens,
                                         &batch.positions,
                                         &batch.seq,
                                         &batch.slots,
                                         &batch.logit_rows,
                                         &rope,
                                         &batch.block_table_offsets,
                                         &batch.block_tables};
  int64_t total = 0;
  for (const std::vector<int32_t>* part : parts) total += static_cast<int64_t>(part->size());
  RS_RETURN_IF_ERROR(EnsureWorkspace(batch.num_rows(), total));
  host_meta_.clear();
  int32_t* base = step_meta_.as<int32_t>();
  int32_t** pointers[] = {&meta_.tokens,
                          &meta_.positions,
                          &meta_.seq,
                          &meta_.slots,
                          &meta_.logit_rows,
                          &meta_.rope_positions,
                          &meta_.block_table_offsets,
                          &meta_.block_tables};
  for (size_t i = 0; i < std::size(parts); ++i) {
    *pointers[i] = base + host_meta_.size();
    host_meta_.insert(host_meta_.end(), parts[i]->begin(), parts[i]->end());
  }
  backend_.CopyToDevice(base, host_meta_.data(), sizeof(int32_t) * host_meta_.size());
  return absl::OkStatus();
}

void ForwardProfile::ReadTimes() {
  if (clock == nullptr) return;  // no filled rows, or read already
  full_layer_row_seconds = clock->SecondsBetween(full.first, full.second) / full_row_layers;
  for (Fill& f : fills) {
    for (const auto& [begin, end] : f.spans) f.seconds += clock->SecondsBetween(begin, end);
  }
  clock = nullptr;
}

double ForwardProfile::SavedSecondsPerRow(int32_t split_layer, int32_t num_layers) const {
  assert(clock == nullptr);  // ReadTimes first
  for (const Fill& f : fills) {
    if (f.split_layer != split_layer || f.rows == 0) continue;
    return (num_layers - 1 - split_layer) * full_layer_row_seconds - f.seconds / f.rows;
  }
  return 0;
}

absl::Status LlamaModel::CheckBatch(const ForwardBatch& input, int32_t num_layers,
                                    const ForwardCapture* capture) const {
  const int32_t n = input.num_rows();
  if (n == 0) return absl::InvalidArgumentError("forward: empty batch");
  if (num_layers < 0 || num_layers > config_.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("forward: num_layers ", input.num_layers,
                                                   " outside [0, ", config_.num_layers, "]"));
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
    // Distinct rows: RunFullLayer packs them into a buffer of the step's rows.
    std::vector<bool> asked(n, false);
    for (int32_t r : capture->query_rows) {
      if (r < 0 || r >= n) {
        return absl::InvalidArgumentError(
            absl::StrCat("forward: capture query row ", r, " outside [0, ", n, ")"));
      }
      if (asked[r]) {
        return absl::InvalidArgumentError(
            absl::StrCat("forward: capture query row ", r, " asked for twice"));
      }
      asked[r] = true;
    }
    for (int32_t l : capture->query_layers) {
      if (l < 0 || l >= num_layers) {
        return absl::InvalidArgumentError(
            absl::StrCat("forward: capture query layer ", l, " outside [0, ", num_layers, ")"));
      }
    }
  }
  for (int32_t t : input.tokens) {
    if (t < 0 || t >= config_.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("forward: token id ", t, " outside vocabulary of ", config_.vocab_size));
    }
  }
  return absl::OkStatus();
}

absl::Status LlamaModel::PlanRows(const ForwardBatch& input, int32_t num_layers,
                                  const ForwardCapture* capture, RowPlan& plan) const {
  const int32_t n = input.num_rows();
  plan.num_exact = n;
  bool any_fill = false;
  if (!input.fill_split.empty()) {
    if (static_cast<int32_t>(input.fill_split.size()) != n ||
        static_cast<int32_t>(input.row_fill.size()) != n) {
      return absl::InvalidArgumentError(
          absl::StrCat("forward: fill_split and row_fill have ", input.fill_split.size(), " and ",
                       input.row_fill.size(), " entries for ", n, " rows"));
    }
    for (int32_t r = 0; r < n; ++r) {
      const int32_t s = input.fill_split[r];
      if (s < -1 || s >= num_layers) {
        return absl::InvalidArgumentError(
            absl::StrCat("forward: fill split ", s, " outside [-1, ", num_layers, ")"));
      }
      if (s >= 0 && input.row_fill[r] == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat("forward: filled row ", r, " has no fill"));
      }
      any_fill |= s >= 0;
    }
  }
  if (!any_fill) return absl::OkStatus();
  if (num_layers != config_.num_layers) {
    return absl::InvalidArgumentError("forward: num_layers with filled rows is not supported");
  }
  // Exact rows first, then filled rows by descending split, each split's rows by fill: the rows
  // still running full layers at layer l — exact rows and filled rows with split >= l — are then
  // always a prefix, and each group's residual rows stay frozen at h_s once the prefix has
  // moved past them. Every op is row-invariant, so the exact rows' results do not depend on
  // the reordering.
  auto key = [&](int32_t row) {
    const int32_t s = input.fill_split[row];
    return std::pair(s < 0 ? std::numeric_limits<int32_t>::max() : s,
                     s < 0 ? uintptr_t{0} : reinterpret_cast<uintptr_t>(input.row_fill[row]));
  };
  plan.order.resize(n);
  std::iota(plan.order.begin(), plan.order.end(), 0);
  std::stable_sort(plan.order.begin(), plan.order.end(),
                   [&](int32_t a, int32_t b) { return key(a) > key(b); });
  plan.new_index.resize(n);
  ForwardBatch& batch = plan.batch;
  batch.block_table_offsets = input.block_table_offsets;
  batch.block_tables = input.block_tables;
  for (int32_t i = 0; i < n; ++i) {
    const int32_t r = plan.order[i];
    plan.new_index[r] = i;
    batch.tokens.push_back(input.tokens[r]);
    batch.positions.push_back(input.positions[r]);
    if (!input.rope_positions.empty()) batch.rope_positions.push_back(input.rope_positions[r]);
    batch.seq.push_back(input.seq[r]);
    batch.slots.push_back(input.slots[r]);
    const int32_t s = input.fill_split[r];
    if (s < 0) continue;
    const RowFill* fill = input.row_fill[r];
    if (plan.groups.empty() || plan.groups.back().split != s || plan.groups.back().fill != fill) {
      RS_RETURN_IF_ERROR(fill->CheckSplit(*this, s));
      if (plan.groups.empty()) plan.num_exact = i;
      plan.groups.push_back(FillGroup{s, i, 0, fill});
    }
    ++plan.groups.back().count;
  }
  for (int32_t r : input.logit_rows) {
    if (r < 0 || r >= n || input.fill_split[r] >= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("forward: logit row ", r, " is not an exact row"));
    }
    batch.logit_rows.push_back(plan.new_index[r]);
  }
  if (capture != nullptr) {
    for (int32_t r : capture->query_rows) {
      if (input.fill_split[r] >= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("forward: capture query row ", r, " is not an exact row"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status LlamaModel::Forward(const ForwardBatch& batch, PagedKvCache& cache,
                                 std::vector<float>& logits, ForwardCapture* capture,
                                 ForwardProfile* profile) {
  logits.clear();
  RS_RETURN_IF_ERROR(Run(batch, cache, capture, profile));
  if (shard_.rank == 0) CopyAllLogits(logits);
  return absl::OkStatus();
}

void LlamaModel::CopyAllLogits(std::vector<float>& logits) {
  logits.resize(static_cast<size_t>(last_logit_rows_) * config_.vocab_size);
  backend_.CopyToHost(logits.data(), head_logits(), sizeof(float) * logits.size());
}

absl::Status LlamaModel::CopyLogits(std::span<const int32_t> rows, float* host) {
  const int64_t vocab = config_.vocab_size;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] < 0 || rows[i] >= last_logit_rows_) {
      return absl::OutOfRangeError(absl::StrCat("logit row ", rows[i], " of ", last_logit_rows_));
    }
  }
  // A copy (one synchronization on a device) for each run of consecutive rows.
  for (size_t i = 0; i < rows.size();) {
    const size_t end = RunEnd(rows, i);
    backend_.CopyToHost(host + i * vocab, head_logits() + rows[i] * vocab,
                        sizeof(float) * vocab * (end - i));
    i = end;
  }
  return absl::OkStatus();
}

absl::Status LlamaModel::SampleLogits(std::span<const SampleSpec> specs,
                                      std::span<const int32_t> penalty_ids, SampledToken* out) {
  std::vector<bool> drawn(last_logit_rows_, false);
  for (const SampleSpec& spec : specs) {
    if (spec.row < 0 || spec.row >= last_logit_rows_) {
      return absl::OutOfRangeError(
          absl::StrCat("sample: logit row ", spec.row, " of ", last_logit_rows_));
    }
    if (drawn[spec.row]) {
      return absl::InvalidArgumentError(absl::StrCat("sample: two specs draw from row ", spec.row));
    }
    drawn[spec.row] = true;
    if (spec.penalty_begin < 0 || spec.penalty_begin > spec.penalty_end ||
        static_cast<size_t>(spec.penalty_end) > penalty_ids.size()) {
      return absl::OutOfRangeError(absl::StrCat("sample: penalty ids [", spec.penalty_begin, ", ",
                                                spec.penalty_end, ") of ", penalty_ids.size()));
    }
  }
  if (!specs.empty()) {
    backend_.Sample(head_logits(), config_.vocab_size, specs, penalty_ids, out);
  }
  return absl::OkStatus();
}

absl::Status LlamaModel::CheckFits(const ForwardBatch& input, int32_t num_layers,
                                   const ForwardCapture* capture, const PagedKvCache& cache) const {
  RS_RETURN_IF_ERROR(CheckBatch(input, num_layers, capture));
  if (num_layers > cache.shape().num_layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "forward: ", num_layers, " layers to run, the cache has ", cache.shape().num_layers));
  }
  return absl::OkStatus();
}

absl::Status LlamaModel::CheckStep(const ForwardBatch& batch, const PagedKvCache& cache) const {
  const int32_t num_layers = batch.num_layers == 0 ? config_.num_layers : batch.num_layers;
  RS_RETURN_IF_ERROR(CheckFits(batch, num_layers, nullptr, cache));
  RowPlan plan;
  return PlanRows(batch, num_layers, nullptr, plan);
}

absl::Status LlamaModel::Run(const ForwardBatch& input, PagedKvCache& cache,
                             ForwardCapture* capture, ForwardProfile* profile) {
  last_logit_rows_ = 0;
  if (profile != nullptr) *profile = ForwardProfile{};
  const int32_t num_layers = input.num_layers == 0 ? config_.num_layers : input.num_layers;
  RS_RETURN_IF_ERROR(CheckFits(input, num_layers, capture, cache));
  if (RunsOnGraph(input, num_layers, capture)) {
    return RunDecodeGraph(
        input, cache,
        *std::lower_bound(graph_buckets_.begin(), graph_buckets_.end(), input.num_rows()),
        /*may_record=*/comm_ == nullptr);
  }
  RowPlan plan;
  RS_RETURN_IF_ERROR(PlanRows(input, num_layers, capture, plan));
  const bool any_fill = !plan.groups.empty();
  const ForwardBatch& batch = any_fill ? plan.batch : input;
  const int32_t n = batch.num_rows();
  // Captured query rows in the batch as run (exact rows keep their reordered places).
  std::vector<int32_t> query_rows;
  if (capture != nullptr) {
    capture->states.resize(capture->depths.size());
    capture->queries.assign(capture->query_layers.size(), {});
    for (int32_t r : capture->query_rows) query_rows.push_back(any_fill ? plan.new_index[r] : r);
  }
  RS_RETURN_IF_ERROR(UploadStepMeta(batch));

  // Copies the residual stream (after `depth` layers) into every capture slot asking for it:
  // the rows exact from the start, which stay the first plan.num_exact rows in their input
  // order (promoted rows join behind them).
  const int32_t captured_rows = plan.num_exact;
  auto capture_at = [&](int32_t depth) {
    if (capture == nullptr) return;
    for (size_t i = 0; i < capture->depths.size(); ++i) {
      if (capture->depths[i] != depth) continue;
      std::vector<float>& out = capture->states[i];
      out.resize(static_cast<size_t>(captured_rows) * config_.hidden);
      backend_.CopyToHost(out.data(), x_.as<float>(), sizeof(float) * out.size());
    }
  };
  // Profiling (filled rows only), with time marks in the queued work: layers 0..lowest split
  // run every row in full and nothing else (no group fills or promotes there), one span; each
  // group's K/V writes a span a layer, in its split's entry (groups of one split are adjacent).
  std::vector<FillGroup>& groups = plan.groups;
  const bool timed = profile != nullptr && any_fill;
  const int32_t lowest_split = any_fill ? groups.back().split : -1;
  std::vector<size_t> fill_of(groups.size());  // each group's entry in profile->fills
  if (timed) {
    backend_.ResetTimeMarks();
    for (size_t i = 0; i < groups.size(); ++i) {
      if (i == 0 || groups[i].split != groups[i - 1].split) {
        profile->fills.emplace_back().split_layer = groups[i].split;
      }
      fill_of[i] = profile->fills.size() - 1;
    }
  }

  RS_RETURN_IF_ERROR(EmbedRows(n));
  for (int32_t l = 0; l < num_layers; ++l) {
    if (timed && l == 0) profile->full.first = backend_.MarkTime();
    capture_at(l);
    for (size_t gi = 0; gi < groups.size(); ++gi) {
      if (groups[gi].split + 1 == l) RS_RETURN_IF_ERROR(PromoteRows(gi, plan, profile));
    }
    const KvLayerView kv = cache.layer(l);
    // Rows running this layer in full: exact rows and filled rows whose split is >= l.
    int32_t na = plan.num_exact;
    // Filled rows past their split only write this layer's K/V, before the full rows'
    // attention reads the cache.
    for (size_t gi = 0; gi < groups.size(); ++gi) {
      const FillGroup& g = groups[gi];
      if (g.split >= l) {
        na += g.count;
        continue;
      }
      if (g.count == 0) continue;
      const int32_t begin = timed ? backend_.MarkTime() : 0;
      g.fill->WriteKv(*this, l, RowsOf(g), kv);
      if (timed) profile->fills[fill_of[gi]].spans.emplace_back(begin, backend_.MarkTime());
    }
    if (na > 0) RS_RETURN_IF_ERROR(RunFullLayer(l, na, kv, capture, query_rows));
    if (timed && l == lowest_split) profile->full.second = backend_.MarkTime();
  }
  if (timed) {
    profile->clock = &backend_;
    profile->full_row_layers = static_cast<double>(lowest_split + 1) * n;
    // The rows still filled, after promotions.
    for (size_t i = 0; i < groups.size(); ++i) profile->fills[fill_of[i]].rows += groups[i].count;
  }
  capture_at(num_layers);
  return RunLmHead(batch);
}

void LlamaModel::SetDecodeGraphBuckets(std::vector<int32_t> buckets) {
  graph_buckets_ = std::move(buckets);
  graphs_.clear();
}

std::vector<int32_t> LlamaModel::DecodeGraphBuckets(int32_t max_rows) {
  std::vector<int32_t> buckets;
  for (int32_t b = 1; b < max_rows;) {
    buckets.push_back(b);
    b = b < 8 ? (b == 4 ? 8 : 2 * b) : b < 64 ? b + 8 : b < 256 ? b + 16 : b + 32;
  }
  if (max_rows > 0) buckets.push_back(max_rows);
  return buckets;
}

bool LlamaModel::RunsOnGraph(const ForwardBatch& batch, int32_t num_layers,
                             const ForwardCapture* capture) const {
  const int32_t n = batch.num_rows();
  if (graph_buckets_.empty() || n == 0 || n > graph_buckets_.back() || capture != nullptr ||
      num_layers != config_.num_layers || !batch.fill_split.empty() ||
      static_cast<int32_t>(batch.block_table_offsets.size()) != n + 1 ||
      static_cast<int32_t>(batch.logit_rows.size()) != n) {
    return false;
  }
  for (int32_t i = 0; i < n; ++i) {
    if (batch.seq[i] != i || batch.logit_rows[i] != i) return false;
  }
  return true;
}

absl::Status LlamaModel::RecordDecodeGraphs(PagedKvCache& cache) {
  ForwardBatch none;  // every row of the bucket a padding row
  none.block_table_offsets = {0};
  const std::vector<int32_t> buckets = graph_buckets_;  // a failed recording clears them
  for (const int32_t bucket : buckets) {
    if (graph_buckets_.empty()) break;
    RS_RETURN_IF_ERROR(RunDecodeGraph(none, cache, bucket, /*may_record=*/true));
  }
  return absl::OkStatus();
}

absl::Status LlamaModel::RunDecodeGraph(const ForwardBatch& batch, PagedKvCache& cache,
                                        int32_t bucket, bool may_record) {
  const int32_t n = batch.num_rows();
  ForwardBatch& padded = graph_batch_;
  padded = batch;
  // The padding rows: each a sequence of its own (so every part of the metadata but the block
  // tables, which come last, has the same size for every step of the bucket, and a recording
  // finds it where it was), its table block 0, the row at its position 0.
  for (int32_t r = n; r < bucket; ++r) {
    padded.tokens.push_back(0);
    padded.positions.push_back(0);
    padded.seq.push_back(r);
    padded.slots.push_back(-1);
    padded.logit_rows.push_back(r);
    if (!padded.rope_positions.empty()) padded.rope_positions.push_back(0);
    padded.block_tables.push_back(0);
    padded.block_table_offsets.push_back(static_cast<int32_t>(padded.block_tables.size()));
  }
  RS_RETURN_IF_ERROR(UploadStepMeta(padded));
  // The recordings write to the cache memory they were made with: every layer's K and V.
  graph_cache_key_.clear();
  for (int32_t l = 0; l < config_.num_layers; ++l) {
    const KvLayerView kv = cache.layer(l);
    graph_cache_key_.push_back(kv.k);
    graph_cache_key_.push_back(kv.v);
  }
  bool same_cache = graph_cache_key_ == recorded_cache_key_;
  if (!same_cache && may_record) {
    graphs_.clear();
    recorded_cache_key_ = graph_cache_key_;
    same_cache = true;
  }
  // UploadStepMeta may have grown (and dropped the recordings) before this lookup.
  // A recording replays only with the metadata where it was recorded (a check: the layout
  // above keeps it there).
  auto recorded = graphs_.find(bucket);
  const bool current = same_cache && recorded != graphs_.end() && recorded->second.meta == meta_;
  bool replayed = false;
  if (current) {
    const auto replay = [&] {
      replayed = recorded->second.graph->Replay();
      return absl::OkStatus();
    };
    // At TP > 1 the replay launches this rank's collectives: not on a group an abort has torn
    // down. Every rank replays, or the step fails (NCCL: a launch uses one capture's graphs on
    // every rank).
    RS_RETURN_IF_ERROR(comm_ != nullptr ? comm_->Launch(replay) : replay());
    if (!replayed && comm_ != nullptr) {
      return absl::InternalError(absl::StrCat("replaying the decode graph for ", bucket,
                                              " rows failed on tensor-parallel rank ",
                                              shard_.rank));
    }
  }
  if (replayed) {
    ++decode_graph_replays_;
  } else {
    RS_RETURN_IF_ERROR(RunDecodeRows(padded, cache));
    if (may_record && backend_.SupportsGraphs()) {
      absl::StatusOr<std::unique_ptr<BackendGraph>> graph =
          backend_.Record([&] { return RunDecodeRows(padded, cache); });
      if (graph.ok()) {
        graphs_[bucket] = {*std::move(graph), meta_};
      } else {
        // This step ran unrecorded and is done; later steps run unrecorded too (at TP > 1 on
        // every rank: the start fails).
        spdlog::error("decode graphs off: recording {} rows failed: {}", bucket,
                      graph.status().ToString());
        graph_buckets_.clear();
        if (comm_ != nullptr) return graph.status();
      }
    }
  }
  last_logit_rows_ = n;
  return absl::OkStatus();
}

absl::Status LlamaModel::EmbedRows(int32_t n) {
  backend_.Embed(weights_.token_embd, shard_.vocab_begin, meta_.tokens, n, x_.as<float>());
  if (comm_ == nullptr) return absl::OkStatus();
  return comm_->AllReduceSum(x_.as<float>(), static_cast<size_t>(n) * config_.hidden);
}

absl::Status LlamaModel::RunDecodeRows(const ForwardBatch& batch, PagedKvCache& cache) {
  const int32_t n = batch.num_rows();
  RS_RETURN_IF_ERROR(EmbedRows(n));
  for (int32_t l = 0; l < config_.num_layers; ++l) {
    RS_RETURN_IF_ERROR(RunFullLayer(l, n, cache.layer(l), nullptr, {}));
  }
  return RunLmHead(batch);
}

absl::Status LlamaModel::RunFullLayer(int32_t l, int32_t na, const KvLayerView& kv,
                                      ForwardCapture* capture,
                                      std::span<const int32_t> query_rows) {
  const ModelConfig& c = config_;
  const LayerWeights& w = weights_.layers[l];
  const int32_t q_dim = q_dim_, kv_dim = kv_dim_, qkv_dim = q_dim + 2 * kv_dim;
  float* x = x_.as<float>();
  float* qkv = qkv_.as<float>();
  float* proj = proj_.as<float>();
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  // Sums a row-parallel projection's partial rows over the ranks (TP > 1).
  auto all_reduce = [&](float* data) -> absl::Status {
    if (comm_ == nullptr) return absl::OkStatus();
    return comm_->AllReduceSum(data, static_cast<size_t>(na) * c.hidden);
  };
  const AttentionRows rows{na, meta_.positions, meta_.seq, meta_.block_table_offsets,
                           meta_.block_tables};
  // Attention block: x += o_proj(attention(rope(qkv(norm(x))))).
  backend_.RmsNorm(x, w.attn_norm.as<float>(), na, c.hidden, c.rms_eps, xn_.as<void>());
  backend_.Linear(Activations(xn_), na, w.wqkv, w.bqkv.bytes() > 0 ? w.bqkv.as<float>() : nullptr,
                  qkv);
  float* q = qkv;
  float* k = qkv + q_dim;
  float* v = qkv + q_dim + kv_dim;
  if (c.qk_norm) {
    backend_.RmsNormHeads(q, qkv_dim, na, heads_, c.head_dim, w.q_norm.as<float>(), c.rms_eps);
    backend_.RmsNormHeads(k, qkv_dim, na, kv_heads_, c.head_dim, w.k_norm.as<float>(), c.rms_eps);
  }
  const float* inv_freq = weights_.rope_inv_freq.as<float>();
  backend_.Rope(q, qkv_dim, na, heads_, c.head_dim, meta_.rope_positions, inv_freq);
  backend_.Rope(k, qkv_dim, na, kv_heads_, c.head_dim, meta_.rope_positions, inv_freq);
  // The captured query rows of this layer (post-RoPE, the rank's heads): packed into attn_ (free
  // until the attention below) on the backend, a run of consecutive rows at a time, and copied
  // back at once (one synchronization on a device, not one a row).
  for (size_t i = 0; capture != nullptr && i < capture->query_layers.size(); ++i) {
    if (capture->query_layers[i] != l) continue;
    float* packed = attn_.as<float>();
    for (size_t j = 0; j < query_rows.size();) {
      const size_t end = RunEnd(query_rows, j);
      backend_.CopyColumns(q + static_cast<size_t>(query_rows[j]) * qkv_dim, qkv_dim,
                           static_cast<int32_t>(end - j), q_dim, packed + j * q_dim, q_dim);
      j = end;
    }
    std::vector<float>& out = capture->queries[i];
    out.resize(query_rows.size() * q_dim);
    backend_.CopyToHost(out.data(), packed, sizeof(float) * out.size());
  }
  backend_.StoreKv(kv, k, v, qkv_dim, na, meta_.slots);
  backend_.Attention(q, qkv_dim, heads_, kv, rows, scale, attn_.as<void>());
  backend_.Linear(Activations(attn_), na, w.wo, nullptr, proj);
  RS_RETURN_IF_ERROR(all_reduce(proj));
  backend_.Add(x, proj, static_cast<size_t>(na) * c.hidden);
  // MLP block: x += down(silu(gate(norm(x))) * up(norm(x))).
  backend_.RmsNorm(x, w.ffn_norm.as<float>(), na, c.hidden, c.rms_eps, xn_.as<void>());
  backend_.Linear(Activations(xn_), na, w.w_gate_up, nullptr, gate_up_.as<float>());
  backend_.SwiGlu(gate_up_.as<float>(), na, ffn_, act_.as<void>());
  backend_.Linear(Activations(act_), na, w.w_down, nullptr, proj);
  RS_RETURN_IF_ERROR(all_reduce(proj));
  backend_.Add(x, proj, static_cast<size_t>(na) * c.hidden);
  return absl::OkStatus();
}

absl::Status LlamaModel::RunLmHead(const ForwardBatch& batch) {
  const ModelConfig& c = config_;
  const int32_t m = static_cast<int32_t>(batch.logit_rows.size());
  if (m == 0) return absl::OkStatus();
  RS_RETURN_IF_ERROR(EnsureLogitRows(m));
  backend_.GatherRows(x_.as<float>(), c.hidden, meta_.logit_rows, m, head_in_.as<float>());
  backend_.RmsNorm(head_in_.as<float>(), weights_.output_norm.as<float>(), m, c.hidden, c.rms_eps,
                   xn_.as<void>());
  backend_.Linear(Activations(xn_), m, weights_.lm_head_or_embedding(), nullptr,
                  logits_.as<float>());
  RS_RETURN_IF_ERROR(GatherLogits(m));
  last_logit_rows_ = m;
  return absl::OkStatus();
}

absl::Status LlamaModel::GatherLogits(int32_t m) {
  if (comm_ == nullptr) return absl::OkStatus();
  // Every rank sends [m, stride] floats (its [m, shard vocab] rows, padded on the last rank).
  const int32_t vocab = config_.vocab_size;
  const int32_t stride = shard_.vocab_stride;
  const size_t per_rank = static_cast<size_t>(m) * stride;
  RS_RETURN_IF_ERROR(comm_->AllGather(logits_.as<float>(), per_rank, gathered_.as<float>()));
  if (shard_.rank != 0) return absl::OkStatus();
  for (int32_t r = 0; r < shard_.size; ++r) {
    const int32_t begin = std::min(r * stride, vocab);
    const int32_t width = std::min(stride, vocab - begin);  // rank r's shard vocab
    if (width == 0) continue;
    backend_.CopyColumns(gathered_.as<float>() + r * per_rank, width, m, width,
                         head_logits_.as<float>() + begin, vocab);
  }
  return absl::OkStatus();
}

FilledRows LlamaModel::RowsOf(const FillGroup& g) const {
  return FilledRows{g.split, g.count,
                    x_.as<float>() + static_cast<size_t>(g.begin) * config_.hidden,
                    meta_.rope_positions + g.begin, meta_.slots + g.begin};
}

absl::Status LlamaModel::PromoteRows(size_t gi, RowPlan& plan, ForwardProfile* profile) {
  std::vector<FillGroup>& groups = plan.groups;
  FillGroup& g = groups[gi];
  if (g.count == 0 || !g.fill->SelectsExactRows(g.split)) return absl::OkStatus();
  // promote[i] = 1 when row g.begin + i runs in full after all: decided on rank 0, broadcast.
  std::vector<int32_t> promote(g.count, 0);
  if (shard_.rank == 0) g.fill->SelectExactRows(*this, RowsOf(g), promote);
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
  ForwardBatch& batch = plan.batch;
  const int32_t n = batch.num_rows();
  const int32_t p = static_cast<int32_t>(promoted.size());
  std::vector<int32_t> perm(n);  // new row i comes from old row perm[i]
  std::iota(perm.begin(), perm.end(), 0);
  int32_t next = plan.num_exact;
  for (int32_t r : promoted) perm[next++] = r;
  for (int32_t r = plan.num_exact; r < g.begin; ++r) perm[next++] = r;
  for (int32_t r : kept) perm[next++] = r;
  backend_.CopyToDevice(perm_.as<void>(), perm.data(), sizeof(int32_t) * n);
  backend_.GatherRows(x_.as<float>(), config_.hidden, perm_.as<int32_t>(), n, head_in_.as<float>());
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
  permute(plan.order, nullptr);
  if (profile != nullptr) {
    for (int32_t i = plan.num_exact; i < plan.num_exact + p; ++i) {
      profile->promoted_rows.push_back(plan.order[i]);
    }
  }
  plan.num_exact += p;
  for (size_t k = 0; k < gi; ++k) groups[k].begin += p;
  g.begin += p;
  g.count -= p;
  return absl::OkStatus();
}

void LlamaModel::StoreKvFromInput(int32_t layer, const float* in, const FilledRows& rows,
                                  const KvLayerView& kv, const Weight* kv_weight,
                                  const float* kv_bias, const float* k_norm_heads) {
  const ModelConfig& c = config_;
  const LayerWeights& w = weights_.layers[layer];
  float* kv_proj = qkv_.as<float>();
  assert(in != xn_.as<float>());  // the norm writes xn_ in ActivationDType
  backend_.RmsNorm(in, w.attn_norm.as<float>(), rows.count, c.hidden, c.rms_eps, xn_.as<void>());
  const LinearInput xn = Activations(xn_);
  if (kv_weight != nullptr) {
    backend_.Linear(xn, rows.count, *kv_weight, kv_bias, kv_proj);
  } else {
    // Only the K/V rows [q_dim, q_dim + 2 kv_dim) of the fused QKV projection.
    const float* bias = w.bqkv.bytes() > 0 ? w.bqkv.as<float>() + q_dim_ : nullptr;
    backend_.LinearRows(xn, rows.count, w.wqkv, q_dim_, 2 * kv_dim_, bias, kv_proj);
  }
  StoreKvFromProjection(layer, kv_proj, rows, kv, k_norm_heads);
}

void LlamaModel::StoreKvFromProjection(int32_t layer, float* kv_proj, const FilledRows& rows,
                                       const KvLayerView& kv, const float* k_norm_heads) {
  const ModelConfig& c = config_;
  const int32_t stride = 2 * kv_dim_;
  float* k = kv_proj;
  float* v = kv_proj + kv_dim_;
  if (c.qk_norm && k_norm_heads != nullptr) {
    for (int32_t h = 0; h < kv_heads_; ++h) {
      backend_.RmsNormHeads(k + h * c.head_dim, stride, rows.count, 1, c.head_dim,
                            k_norm_heads + h * c.head_dim, c.rms_eps);
    }
  } else if (c.qk_norm) {
    backend_.RmsNormHeads(k, stride, rows.count, kv_heads_, c.head_dim,
                          weights_.layers[layer].k_norm.as<float>(), c.rms_eps);
  }
  backend_.Rope(k, stride, rows.count, kv_heads_, c.head_dim, rows.rope_positions,
                weights_.rope_inv_freq.as<float>());
  backend_.StoreKv(kv, k, v, stride, rows.count, rows.slots);
}

}  // namespace ridgeserve
