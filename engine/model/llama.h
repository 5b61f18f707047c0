// The Llama-family forward pass (Llama 3.x, SmolLM2, Mistral, Qwen2/2.5 with QKV bias, Qwen3
// with QK-norm) over a paged KV cache, for any mix of prefill chunks and decode rows.
#ifndef RIDGESERVE_ENGINE_MODEL_LLAMA_H_
#define RIDGESERVE_ENGINE_MODEL_LLAMA_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "engine/kv/paged_kv_cache.h"
#include "engine/model/config.h"
#include "engine/model/shard.h"
#include "engine/model/weights.h"
#include "engine/parallel/communicator.h"
#include "kernels/backend.h"

namespace ridgeserve {

class RidgeFillMaps;  // engine/ridgefill/ridgefill_maps.h
struct RidgeFillSplitMaps;

// One forward step: rows from one or more sequences. Every row's K/V is written to its slot
// before attention, so rows of the same sequence in one step see each other causally.
struct ForwardBatch {
  std::vector<int32_t> tokens;     // [rows]
  std::vector<int32_t> positions;  // [rows] absolute position in its sequence
  std::vector<int32_t> seq;        // [rows] index of the row's sequence
  std::vector<int32_t> slots;      // [rows] KV-cache slot the row's K/V go to
  // Sequence s's blocks are block_tables[block_table_offsets[s] .. block_table_offsets[s + 1])
  // (AttentionRows): appended per sequence, never re-laid out.
  std::vector<int32_t> block_table_offsets = {0};  // [num_seqs + 1]
  std::vector<int32_t> block_tables;
  std::vector<int32_t> logit_rows;  // rows whose logits are wanted, in output order
  // RidgeFill, per row (empty = every row exact): -1 = exact row; s >= 0 = filled row with
  // split layer s (LlamaModel::SetRidgeFillMaps must hold maps for s). A filled row runs
  // layers 0..s exactly, then only writes K/V: at layer s + 1 from the exact h_s, at each
  // layer l >= s + 2 from ĥ_l = W_l h_s + b_l. It gets no logits and its own row does not
  // attend after layer s. Exact rows run every layer and see the filled rows' K/V.
  std::vector<int32_t> fill_split;
  // Per row beside fill_split, the maps a filled row uses (empty, or nullptr for a row: the
  // model's, SetRidgeFillMaps). Rows of one batch may use different maps (a server that
  // swapped maps finishes each request on the maps it started with).
  std::vector<const RidgeFillMaps*> fill_maps;
  // RoPE position per row where it differs from `positions` (empty: the same). `positions`
  // stay the rows' places in the cache (causal order and slots); SpecPC with original
  // positions runs its kept tokens at cache places 0.. with their prompt positions here.
  std::vector<int32_t> rope_positions;
  // Layers to run: 0 = all; k > 0 = the first k, then the final norm and LM head (the self-draft
  // of SpecPC, engine/draft/draft_model.h). The cache needs at least k layers.
  int32_t num_layers = 0;

  int32_t num_rows() const { return static_cast<int32_t>(tokens.size()); }
  // Appends a sequence's rows for `tokens` at positions start_pos.. (blocks reserved) and
  // returns the sequence index. With want_logits the last row's logits are requested.
  int32_t AddSequence(std::span<const int32_t> blocks, int32_t block_size,
                      std::span<const int32_t> tokens, int32_t start_pos, bool want_logits);
  int32_t AddSequence(const BlockTable& table, int32_t block_size, std::span<const int32_t> tokens,
                      int32_t start_pos, bool want_logits) {
    return AddSequence(table.blocks(), block_size, tokens, start_pos, want_logits);
  }
  // Requests logits for every row (perplexity, reference comparisons).
  void RequestAllLogits();
};

// Optional copy of the residual stream during Forward (offline tools: RidgeFill calibration).
// Depth d is the stream after d layers: the input of layer d (before its input RMSNorm), which
// is also the output of layer d - 1; depth 0 is the embeddings, depth num_layers the stream
// before the final norm. Forward fills states[i] with [batch rows, hidden] host floats for
// depths[i]. Capturing does not change any computed value.
//
// Queries (SpecPC's draft attention scores): the post-RoPE query rows `query_rows` (batch rows)
// at each layer of `query_layers`; queries[i] is [query_rows.size(), num_heads * head_dim] host
// floats for query_layers[i] (the rank's heads).
struct ForwardCapture {
  std::vector<int32_t> depths;  // each in [0, num_layers]
  std::vector<std::vector<float>> states;
  std::vector<int32_t> query_rows;
  std::vector<int32_t> query_layers;
  std::vector<std::vector<float>> queries;
};

// What one Forward with filled rows measured, for RidgeFill's TTFT-saved estimate (DESIGN.md:
// savings are measured, not assumed). The layers every row runs in full (0..lowest split) are
// timed, giving the cost of one row through one full layer at this batch's positions; the
// fill work above each split is timed separately.
struct ForwardProfile {
  struct Fill {
    int32_t split_layer = 0;
    int32_t rows = 0;
    double seconds = 0;  // writing these rows' K/V in layers > split
  };
  double full_layer_row_seconds = 0;  // mean seconds of one row through one full layer
  std::vector<Fill> fills;            // one per split present in the batch (rows still filled)
  // Filled rows the leverage test ran exactly after all (batch row indices; see
  // LlamaModel::SetRidgeFillMaxLeverage). Not counted in `fills`.
  std::vector<int32_t> promoted_rows;

  // Estimated seconds saved per filled row of `split_layer`: the num_layers - 1 - split full
  // layers it skipped, less its share of the measured fill work. 0 if the split is absent.
  double SavedSecondsPerRow(int32_t split_layer, int32_t num_layers) const;
};

// Tensor parallelism (DESIGN.md, "Scale"): a LlamaModel is one rank of a group when its
// ShardLayout has size > 1. Its weights are the rank's slices (LoadWeights), its KV cache holds
// the rank's KV heads, and every rank's Forward runs the same batch, meeting the others in the
// Communicator: after the embedding (vocabulary-parallel: each rank looks up its rows and
// zeros the rest), after the attention and MLP output projections (row-parallel partial
// sums), and to gather the LM head's vocabulary slices. The residual stream is the same on
// every rank, bit for bit (the all-reduce gives every rank the same sum). Rank 0 gets the
// logits; the leverage test runs on rank 0 and its decisions are broadcast.
//
// Threading: one thread drives a LlamaModel (the engine thread, or at TP > 1 the rank's own).
class LlamaModel {
 public:
  // The whole model on one backend (TP = 1).
  LlamaModel(const ModelConfig& config, ModelWeights weights, Backend& backend);
  // One rank: weights loaded for `shard`, `comm` the rank's communicator (used when
  // shard.size > 1; must outlive the model).
  LlamaModel(const ModelConfig& config, ModelWeights weights, Backend& backend,
             const ShardLayout& shard, Communicator* comm);

  // The architecture of the whole model (not the rank's slice: see shard()).
  const ModelConfig& config() const { return config_; }
  const ShardLayout& shard() const { return shard_; }
  Communicator* communicator() const { return comm_; }  // null at TP = 1
  Backend& backend() { return backend_; }
  // The weights on the backend (read-only; offline tools read norms and projections).
  const ModelWeights& weights() const { return weights_; }

  // The element type of the KV caches made for this model (Engine, SequenceRunner): F32, F16
  // or BF16 (--kv_cache_dtype). Forward takes whatever cache it is given.
  void SetKvCacheDType(DType dtype) { kv_cache_dtype_ = dtype; }
  DType kv_cache_dtype() const { return kv_cache_dtype_; }

  // Maps for rows with a fill split (nullptr = none; batches with filled rows then fail).
  // Not owned; must outlive every Forward that uses them and live on this model's backend.
  void SetRidgeFillMaps(const RidgeFillMaps* maps) { ridgefill_maps_ = maps; }
  const RidgeFillMaps* ridgefill_maps() const { return ridgefill_maps_; }
  // Leverage-based row selection (DESIGN.md): a filled row whose h_s has leverage
  // (h_s − μ)ᵀ (G + λI)⁻¹ (h_s − μ) above `max_leverage` under its split's calibration Gram G
  // runs every layer exactly instead (it lies far outside what the map was fitted on). 0 turns
  // it off; maps without leverage data never promote.
  void SetRidgeFillMaxLeverage(float max_leverage) { max_leverage_ = max_leverage; }

  // Runs the batch; writes logits [batch.logit_rows.size(), vocab] to `logits` (host; rank 0
  // only, other ranks leave it empty). A failed collective (the group aborted) is returned. With
  // `capture`, also copies the residual stream at capture->depths and the queries it asks for
  // (see ForwardCapture). With filled rows (batch.fill_split): logit rows must be exact rows,
  // and capture and num_layers are not supported (InvalidArgument). Exact rows' results are
  // bitwise those of the plain path.
  // With `profile` and filled rows, layers are timed (the backend is synchronized per layer)
  // and the profile is filled; without filled rows the profile is left empty.
  absl::Status Forward(const ForwardBatch& batch, PagedKvCache& cache, std::vector<float>& logits,
                       ForwardCapture* capture = nullptr, ForwardProfile* profile = nullptr);

 private:
  // Filled rows of one split layer and one set of maps, contiguous in the reordered batch.
  struct FillGroup {
    int32_t split = 0;
    int32_t begin = 0;  // first row
    int32_t count = 0;
    const RidgeFillSplitMaps* maps = nullptr;
  };
  // Writes layer `layer`'s K/V for a group's filled rows (layer > g.split) into `kv`: from the
  // exact h_s at layer s + 1, from the RidgeFill map's prediction above (llama_fill.cc).
  void WriteFilledKv(int32_t layer, const FillGroup& g, const KvLayerView& kv);
  // Leverage-based row selection for groups[gi] at layer split + 1: its rows whose h_s is an
  // outlier join the exact rows (rows permuted on the backend and in `batch`/`order`, group
  // bounds and num_exact updated); their input rows are added to profile->promoted_rows.
  absl::Status PromoteOutliers(size_t gi, std::vector<FillGroup>& groups, int32_t& num_exact,
                               ForwardBatch& batch, std::vector<int32_t>& order,
                               ForwardProfile* profile);
  // The rank's head-sliced LM head output [m, shard.vocab] in logits_ → `logits` [m, vocab]
  // on rank 0, gathered from every rank.
  absl::Status GatherLogits(int32_t m, std::vector<float>& logits);

  // Scratch for `rows` rows and `meta_ints` int32 of step metadata; grows on demand.
  // ResourceExhausted when it cannot.
  absl::Status EnsureWorkspace(int32_t rows, int64_t meta_ints);
  // Uploads the step's metadata in one copy and points meta_ at it.
  absl::Status UploadStepMeta(const ForwardBatch& batch);

  ModelConfig config_;
  ShardLayout shard_;
  Communicator* comm_ = nullptr;  // null at TP = 1
  // The rank's widths: query and KV heads and their dims, MLP features.
  int32_t heads_ = 0, kv_heads_ = 0, q_dim_ = 0, kv_dim_ = 0, ffn_ = 0;
  ModelWeights weights_;
  Backend& backend_;
  DType kv_cache_dtype_ = DType::kF32;
  const RidgeFillMaps* ridgefill_maps_ = nullptr;
  float max_leverage_ = 0;

  // The step's metadata on the backend, in one buffer (step_meta_) uploaded once per Forward:
  // per row token, position, sequence and slot, the logit rows, the block tables, the RoPE
  // positions.
  struct StepMeta {
    int32_t* tokens = nullptr;
    int32_t* positions = nullptr;
    int32_t* seq = nullptr;
    int32_t* slots = nullptr;
    int32_t* logit_rows = nullptr;
    int32_t* block_table_offsets = nullptr;
    int32_t* block_tables = nullptr;
    int32_t* rope_positions = nullptr;
  };
  StepMeta meta_;
  std::vector<int32_t> host_meta_;  // staging for the upload, reused

  int32_t capacity_rows_ = 0;
  int64_t capacity_meta_ = 0;
  int32_t capacity_logit_rows_ = 0;
  DeviceBuffer x_;          // [rows, hidden] residual stream
  DeviceBuffer xn_;         // [rows, hidden] normalized
  DeviceBuffer qkv_;        // [rows, q_dim + 2 kv_dim]
  DeviceBuffer attn_;       // [rows, q_dim]
  DeviceBuffer proj_;       // [rows, hidden]
  DeviceBuffer gate_up_;    // [rows, 2 ffn]
  DeviceBuffer act_;        // [rows, ffn]
  DeviceBuffer step_meta_;  // int32, StepMeta's arrays
  DeviceBuffer head_in_;    // [rows, hidden] rows gathered for the LM head; scratch before that
  DeviceBuffer perm_;       // int32 [rows]: row permutation (leverage promotion)
  DeviceBuffer logits_;     // [logit rows, shard vocab stride]
  DeviceBuffer gathered_;   // TP > 1: [ranks, logit rows, shard vocab stride]
};

}  // namespace ridgeserve

#endif  // RIDGESERVE_ENGINE_MODEL_LLAMA_H_
