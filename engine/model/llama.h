// The Llama-family forward pass (Llama 3.x, SmolLM2, Mistral, Qwen2/2.5 with QKV bias, Qwen3
// with QK-norm) over a paged KV cache, for any mix of prefill chunks and decode rows.
#ifndef RIDGESERVE_ENGINE_MODEL_LLAMA_H_
#define RIDGESERVE_ENGINE_MODEL_LLAMA_H_

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "engine/kv/paged_kv_cache.h"
#include "engine/model/config.h"
#include "engine/model/shard.h"
#include "engine/model/weights.h"
#include "engine/parallel/communicator.h"
#include "kernels/backend.h"

namespace ridgeserve {

class LlamaModel;
class RowFill;

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
  // Layer plan per row (empty = every row runs every layer): -1 = the row runs every layer;
  // s >= 0 = it runs layers 0..s in full and then is a filled row: in each layer l > s only
  // its K/V are written, by row_fill[row] (RidgeFill's maps, engine/ridgefill/), from its
  // residual h_s, frozen after layer s. A filled row gets no logits and does not attend after
  // layer s; the rows running layer l in full see its K/V. Rows of one batch may have
  // different fills (a server that swapped maps finishes each request on those it started
  // with).
  std::vector<int32_t> fill_split;
  std::vector<const RowFill*> row_fill;  // beside fill_split; non-null for every filled row
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

// Filled rows of one split and one fill, as RowFill sees them: contiguous rows of the batch as
// run, on the model's backend.
struct FilledRows {
  int32_t split_layer = 0;  // the last layer the rows ran in full
  int32_t count = 0;
  const float* h = nullptr;                 // [count, hidden]: h_s, the residual after split
  const int32_t* rope_positions = nullptr;  // [count]
  const int32_t* slots = nullptr;           // [count] KV-cache slots
};

// What writes filled rows' K/V in the layers above their split (ForwardBatch::fill_split):
// RidgeFill's maps (engine/ridgefill/ridgefill_maps.h). The model knows layers, not maps; a
// fill knows maps and composes the model's K/V steps (LlamaModel::StoreKvFromInput,
// StoreKvFromProjection). Called on the thread running the model's Forward, with rows on its
// backend; `model` is the rank running it.
class RowFill {
 public:
  virtual ~RowFill() = default;
  // Whether this fill can fill rows of `split_layer` on `model` (InvalidArgument naming what
  // is missing otherwise); checked before the batch runs.
  virtual absl::Status CheckSplit(const LlamaModel& model, int32_t split_layer) const = 0;
  // Whether SelectExactRows may send rows of `split_layer` back to exact; the same answer on
  // every rank. When false, SelectExactRows is not called.
  virtual bool SelectsExactRows(int32_t split_layer) const = 0;
  // Before layer split + 1, on rank 0 only (the model broadcasts the decision at TP > 1):
  // sets exact[i] = 1 for each row i that should run every layer in full after all.
  virtual void SelectExactRows(LlamaModel& model, const FilledRows& rows,
                               std::span<int32_t> exact) const = 0;
  // Writes layer `layer`'s (> split) K/V of the rows into `kv`.
  virtual void WriteKv(LlamaModel& model, int32_t layer, const FilledRows& rows,
                       const KvLayerView& kv) const = 0;
};

// Optional copy of the residual stream during Forward (RidgeFill calibration, offline and
// online). Depth d is the stream after d layers: the input of layer d (before its input
// RMSNorm), which is also the output of layer d - 1; depth 0 is the embeddings, depth
// num_layers the stream before the final norm. Forward fills states[i] with [rows, hidden]
// host floats for depths[i]: every batch row, or with filled rows (ForwardBatch::fill_split)
// the exact rows only, in batch order (a filled row the fill promotes is not among them).
// Capturing does not change any computed value.
//
// Queries (SpecPC's draft attention scores): the post-RoPE query rows `query_rows` (distinct batch
// rows) at each layer of `query_layers`; queries[i] is [query_rows.size(), num_heads * head_dim]
// host floats for query_layers[i] (the rank's heads).
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
// fill work above each split is timed separately. The times are marks in the backend's queued
// work (Backend::MarkTime), so taking them does not wait for a device inside the layer loop;
// ReadTimes turns them into seconds once the step is over (it waits for the step's work).
struct ForwardProfile {
  using Span = std::pair<int32_t, int32_t>;  // the time marks at its start and end
  struct Fill {
    int32_t split_layer = 0;
    int32_t rows = 0;
    std::vector<Span> spans;  // writing these rows' K/V in layers > split
    double seconds = 0;       // their sum (ReadTimes)
  };
  Backend* clock = nullptr;           // whose time marks these are; null once read
  Span full;                          // layers 0..lowest split, every row in full
  double full_row_layers = 0;         // rows x layers of `full`
  double full_layer_row_seconds = 0;  // one row through one full layer (ReadTimes)
  std::vector<Fill> fills;            // one per split present in the batch (rows still filled)
  // Filled rows their fill sent back to exact (RowFill::SelectExactRows; RidgeFill's leverage
  // test), as input batch row indices. Not counted in `fills`.
  std::vector<int32_t> promoted_rows;

  // Reads the marks into seconds (before the marks' backend is reset: its next profiled Run).
  void ReadTimes();

  // Estimated seconds saved per filled row of `split_layer`: the num_layers - 1 - split full
  // layers it skipped, less its share of the measured fill work. 0 if the split is absent.
  // After ReadTimes.
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
  // Allocates a step's scratch now (the backend's sampling scratch among it) for up to `rows`
  // rows of `seqs` sequences (one logit row each) whose block tables hold `block_table_ints`
  // entries in all (the engine does at start, for its step budget), so a step within them allocates
  // no workspace and finds its buffers where the step before left them (CUDA graphs need that), and
  // a device without room for them fails the start, not a request. A larger step still grows them.
  // ResourceExhausted naming the bytes when the backend cannot.
  absl::Status ReserveWorkspace(int32_t rows, int32_t seqs, int64_t block_table_ints);
  // The ints of such a step's metadata (one upload a step: UploadStepMeta).
  static int64_t StepMetaInts(int32_t rows, int32_t seqs, int64_t block_table_ints);

  // Decode steps on graphs (Backend::Record; DESIGN.md "Backend v2"). A step whose rows are each
  // one new token of a sequence, all with logits wanted in row order, every layer, without fills
  // or a capture, runs padded to the smallest bucket >= its rows: padding rows (token 0 at
  // position 0, each a sequence of its own on block 0) store no K/V and their logits are not
  // returned. The first step of a bucket runs unrecorded (every scratch then exists) and is
  // recorded; later ones upload their metadata and replay it. A recording goes stale when a
  // larger step grows the model's or the backend's scratch, or a step runs on other cache
  // memory, and is made again. On a backend without graphs the padded steps run unrecorded (the
  // tests' way to check them on a CPU). Empty `buckets` (the default): every step runs as it comes.
  //
  // At TP > 1 every rank takes the same path for a step (the choice depends only on the batch),
  // and a recording holds the rank's collectives, so all ranks must record together and replay
  // recordings made together (NCCL requires it): recordings are made only by RecordDecodeGraphs,
  // run on every rank at once. A step whose bucket has no current recording (other cache memory,
  // a grown scratch: the same on every rank) runs padded but eagerly, and a replay that fails
  // fails the step (Internal, or Aborted on an aborted group), rather than one rank running
  // differently from the others.
  void SetDecodeGraphBuckets(std::vector<int32_t> buckets);
  // The buckets for up to `max_rows` decode rows: 1, 2, 4, then every 8 to 64, every 16 to 256,
  // every 32 beyond, and max_rows itself last.
  static std::vector<int32_t> DecodeGraphBuckets(int32_t max_rows);
  // Runs and records every bucket's step now, on `cache`, with padding rows alone (they store
  // nothing), so that no request's step waits for a recording (the engine does at the start,
  // after every reservation; at TP > 1 on every rank at once, each on its own thread). A
  // recording that fails turns the graphs off, as in a step, and at TP > 1 is returned.
  absl::Status RecordDecodeGraphs(PagedKvCache& cache);
  // Decode steps run by replaying a recording, so far.
  int64_t decode_graph_replays() const { return decode_graph_replays_; }

  // The element type of the KV caches made for this model (Engine, SequenceRunner): F32, F16
  // or BF16 (--kv_cache_dtype). Forward takes whatever cache it is given.
  void SetKvCacheDType(DType dtype) { kv_cache_dtype_ = dtype; }
  DType kv_cache_dtype() const { return kv_cache_dtype_; }

  // The K/V steps a RowFill composes for `rows` (FilledRows) in layer `layer`; `kv` is that
  // layer's cache. StoreKvFromInput: from the layer's input residual `in` [rows.count, hidden]
  // (backend; not fill_scratch().input, where the norm's output goes), as for a full row: input
  // RMSNorm, the layer's K/V projection rows — or `kv_weight` and `kv_bias` ([2 kv_dim, hidden] and
  // [2 kv_dim] or null) in their place — then StoreKvFromProjection. StoreKvFromProjection: from
  // `kv_proj` [rows.count, 2 kv_dim] (K before QK-norm and RoPE, then V; overwritten): QK-norm with
  // the layer's k_norm, or `k_norm_heads` [kv_heads, head_dim] (one weight per KV head), RoPE,
  // store.
  void StoreKvFromInput(int32_t layer, const float* in, const FilledRows& rows,
                        const KvLayerView& kv, const Weight* kv_weight = nullptr,
                        const float* kv_bias = nullptr, const float* k_norm_heads = nullptr);
  void StoreKvFromProjection(int32_t layer, float* kv_proj, const FilledRows& rows,
                             const KvLayerView& kv, const float* k_norm_heads = nullptr);
  // Scratch a RowFill may use during its calls (backend, room for the batch's rows):
  // `hidden` and `input` [rows, hidden], `kv` [rows, 2 kv_dim]. StoreKvFromInput uses `kv` and
  // `input` itself (its RMSNorm's output), so neither holds anything across that call.
  struct FillScratch {
    float* hidden;
    float* kv;
    float* input;
  };
  FillScratch fill_scratch() { return {proj_.as<float>(), qkv_.as<float>(), xn_.as<float>()}; }

  // Runs the batch. The logits of batch.logit_rows stay on the backend until the next Run
  // (rank 0; at TP > 1 gathered there from every rank), for SampleLogits and CopyLogits. A
  // failed collective (the group aborted) is returned. With `capture`, also copies the
  // residual stream at capture->depths and the queries it asks for (see ForwardCapture). With
  // filled rows (batch.fill_split): logit rows must be exact rows, every filled row needs a
  // fill that CheckSplit accepts, and num_layers is not supported (InvalidArgument). Exact
  // rows' results are bitwise those of the plain path, and a filled row the fill sends back
  // to exact (SelectExactRows) runs as an exact row.
  // With `profile` and filled rows, layers are timed with time marks (Backend::MarkTime: layers
  // 0..lowest split as one span, then each group's fill in each layer above it) and the profile
  // is filled; without filled rows the profile is left empty.
  absl::Status Run(const ForwardBatch& batch, PagedKvCache& cache,
                   ForwardCapture* capture = nullptr, ForwardProfile* profile = nullptr);
  // What Run checks of a step (without a capture) before it runs anything: the batch, the
  // cache's layers, the fills' splits; Run returns the same error. The tensor-parallel executor
  // asks on the engine thread, so that a step the model refuses fails alone and the ranks'
  // group, which an NCCL group cannot recover from an abort, is not aborted for it.
  absl::Status CheckStep(const ForwardBatch& batch, const PagedKvCache& cache) const;
  // Run, then every logit row to `logits` ([batch.logit_rows.size(), vocab] on the host; rank
  // 0 only, other ranks leave it empty): for tools and tests that read whole distributions.
  absl::Status Forward(const ForwardBatch& batch, PagedKvCache& cache, std::vector<float>& logits,
                       ForwardCapture* capture = nullptr, ForwardProfile* profile = nullptr);
  // Rank 0, after Run: logit rows `rows` (indices into the batch's logit_rows) to `host`
  // ([rows.size(), vocab]); OutOfRange for a row the last Run did not compute.
  absl::Status CopyLogits(std::span<const int32_t> rows, float* host);
  // Rank 0, after Run: every logit row to `logits` (resized to [rows, vocab]).
  void CopyAllLogits(std::vector<float>& logits);
  // Rank 0, after Run: Backend::Sample on the logit rows (SampleSpec::row indexes the batch's
  // logit_rows): one token per spec to `out` (host); OutOfRange for a row the last Run did not
  // compute or a penalty range outside `penalty_ids`, InvalidArgument for two specs on one row.
  absl::Status SampleLogits(std::span<const SampleSpec> specs, std::span<const int32_t> penalty_ids,
                            SampledToken* out);

 private:
  // `buffer` as a Linear input written by an activation op (RmsNorm, SwiGlu, Attention): of the
  // backend's ActivationDType.
  LinearInput Activations(const DeviceBuffer& buffer) const {
    return {buffer.as<void>(), backend_.ActivationDType()};
  }
  // Filled rows of one split layer and one fill, contiguous in the reordered batch.
  struct FillGroup {
    int32_t split = 0;
    int32_t begin = 0;  // first row
    int32_t count = 0;
    const RowFill* fill = nullptr;
  };
  // The batch as run: rows reordered so that exact rows come first, then filled rows by
  // descending split, each split's rows by fill (see Forward).
  struct RowPlan {
    ForwardBatch batch;              // the reordered batch (unused when no row is filled)
    std::vector<FillGroup> groups;   // in batch order: descending split
    int32_t num_exact = 0;           // rows [0, num_exact) run every layer
    std::vector<int32_t> order;      // input row of each reordered row
    std::vector<int32_t> new_index;  // reordered row of each input row
  };
  // The batch's and the capture's arguments (InvalidArgument naming the bad one).
  absl::Status CheckBatch(const ForwardBatch& batch, int32_t num_layers,
                          const ForwardCapture* capture) const;
  // CheckBatch, and the cache holding num_layers layers.
  absl::Status CheckFits(const ForwardBatch& batch, int32_t num_layers,
                         const ForwardCapture* capture, const PagedKvCache& cache) const;
  // Groups `input`'s filled rows into `plan` (plan->groups empty when no row is filled).
  absl::Status PlanRows(const ForwardBatch& input, int32_t num_layers,
                        const ForwardCapture* capture, RowPlan& plan) const;
  // One layer in full for the first `na` rows: attention, then MLP, into x_.
  absl::Status RunFullLayer(int32_t layer, int32_t na, const KvLayerView& kv,
                            ForwardCapture* capture, std::span<const int32_t> query_rows);
  // The group's rows as a RowFill sees them.
  FilledRows RowsOf(const FillGroup& g) const;
  // The fill's exact-row selection for plan.groups[gi] before layer split + 1: its rows sent
  // back to exact join the exact prefix (rows permuted on the backend and in the plan, group
  // bounds and num_exact updated); their input rows are added to profile->promoted_rows.
  absl::Status PromoteRows(size_t gi, RowPlan& plan, ForwardProfile* profile);
  // Whether Run takes the graph path for `batch` (SetDecodeGraphBuckets). (A profile has nothing
  // to hold without fills, so it does not decide: at TP > 1 only rank 0 is given one.)
  bool RunsOnGraph(const ForwardBatch& batch, int32_t num_layers,
                   const ForwardCapture* capture) const;
  // The graph path: `batch` padded to `bucket` (>= its rows), replayed, or run and, with
  // `may_record`, recorded (at TP > 1 a rank records only with the others, in
  // RecordDecodeGraphs; a step whose recording is not current runs eagerly instead, on every rank
  // alike, as what makes a recording stale (other cache memory, a grown scratch) depends on the
  // batch and the caches, not on the rank).
  absl::Status RunDecodeGraph(const ForwardBatch& batch, PagedKvCache& cache, int32_t bucket,
                              bool may_record);
  // Embedding, every layer in full and the LM head for the uploaded metadata of `batch` (no
  // fills, no capture): what a decode graph records.
  absl::Status RunDecodeRows(const ForwardBatch& batch, PagedKvCache& cache);
  // The uploaded tokens' embeddings of the n rows into x_ (at TP > 1 each rank's vocabulary
  // share, summed over the ranks).
  absl::Status EmbedRows(int32_t n);
  // The LM head for the batch's logit rows into logits_ (and at TP > 1 gathered into
  // head_logits_ on rank 0).
  absl::Status RunLmHead(const ForwardBatch& batch);
  // The rank's head-sliced LM head output [m, shard.vocab] in logits_ → head_logits_
  // [m, vocab] on rank 0, gathered from every rank.
  absl::Status GatherLogits(int32_t m);
  // Rank 0's [last_logit_rows_, vocab] logits of the last Run.
  float* head_logits() { return comm_ == nullptr ? logits_.as<float>() : head_logits_.as<float>(); }

  // Scratch for `rows` rows and `meta_ints` int32 of step metadata; grows on demand.
  // ResourceExhausted when it cannot.
  absl::Status EnsureWorkspace(int32_t rows, int64_t meta_ints);
  // The LM head's output (and, at TP > 1, the gathered one) for `rows` logit rows; grows on
  // demand.
  absl::Status EnsureLogitRows(int32_t rows);
  // Uploads the step's metadata in one copy and points meta_ at it. The parts sized by the
  // rows and sequences come first and the block tables last, so a batch of the same rows and
  // sequences finds every part where the last one was (graphs replay with these pointers).
  absl::Status UploadStepMeta(const ForwardBatch& batch);

  ModelConfig config_;
  ShardLayout shard_;
  Communicator* comm_ = nullptr;  // null at TP = 1
  // The rank's widths: query and KV heads and their dims, MLP features.
  int32_t heads_ = 0, kv_heads_ = 0, q_dim_ = 0, kv_dim_ = 0, ffn_ = 0;
  ModelWeights weights_;
  Backend& backend_;
  DType kv_cache_dtype_ = DType::kF32;

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
    bool operator==(const StepMeta&) const = default;
  };
  StepMeta meta_;
  std::vector<int32_t> host_meta_;  // staging for the upload, reused

  int32_t capacity_rows_ = 0;
  int64_t capacity_meta_ = 0;
  int32_t capacity_logit_rows_ = 0;
  // Sized in f32; xn_, attn_ and act_ hold ActivationDType elements where an activation op wrote
  // them (and f32 where they serve as scratch: captured queries, RidgeFill's leverage test).
  DeviceBuffer x_;            // [rows, hidden] residual stream
  DeviceBuffer xn_;           // [rows, hidden] normalized
  DeviceBuffer qkv_;          // [rows, q_dim + 2 kv_dim]
  DeviceBuffer attn_;         // [rows, q_dim]
  DeviceBuffer proj_;         // [rows, hidden]
  DeviceBuffer gate_up_;      // [rows, 2 ffn]
  DeviceBuffer act_;          // [rows, ffn]
  DeviceBuffer step_meta_;    // int32, StepMeta's arrays
  DeviceBuffer head_in_;      // [rows, hidden] rows gathered for the LM head; scratch before that
  DeviceBuffer perm_;         // int32 [rows]: row permutation (leverage promotion)
  DeviceBuffer logits_;       // [logit rows, shard vocab stride]
  DeviceBuffer gathered_;     // TP > 1: [ranks, logit rows, shard vocab stride]
  DeviceBuffer head_logits_;  // TP > 1, rank 0: [logit rows, vocab]
  int32_t last_logit_rows_ = 0;  // the last Run's
  // Decode graphs by bucket (SetDecodeGraphBuckets); dropped when the model's scratch or the
  // cache moves.
  std::vector<int32_t> graph_buckets_;
  struct Recording {
    std::unique_ptr<BackendGraph> graph;
    StepMeta meta;  // where the recorded ops read the metadata
  };
  std::map<int32_t, Recording> graphs_;
  // Every layer's K and V of the cache graphs_ write to, and of this step's.
  std::vector<const void*> recorded_cache_key_, graph_cache_key_;
  ForwardBatch graph_batch_;  // the padded batch, reused
  int64_t decode_graph_replays_ = 0;
};

}  // namespace ridgeserve

#endif  // RIDGESERVE_ENGINE_MODEL_LLAMA_H_
