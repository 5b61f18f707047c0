// The CUDA Backend::Sample's host-side plan, as plain host code (no CUDA headers) so it is
// unit-tested on any machine (tests/gpu/sample_plan_test.cc).
//
// A row that walks its candidates in rank order (top-k or top-p on, kernels/sample.h) needs
// them sorted: it gets a SORT SLOT, a [vocab] segment of 64-bit keys (the logit's order-keeping
// bits above, the complement of the id below: descending keys are highest logit first, equal
// logits by lower id) that one segmented radix sort orders for every such row at once. Greedy
// rows and rows that walk in id order need no sort and get no slot.
//
// Everything a call needs on the device goes up in one copy, laid out as SampleUpload says.
#ifndef RIDGESERVE_KERNELS_CUDA_SAMPLE_PLAN_H_
#define RIDGESERVE_KERNELS_CUDA_SAMPLE_PLAN_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/sample_spec.h"

namespace ridgeserve::cuda {

// True when the row's draw walks its candidates in rank order.
bool NeedsRankOrder(const SampleSpec& spec, int32_t vocab);

struct SamplePlan {
  std::vector<int32_t> sort_slot;     // per spec: its sort slot, or -1
  std::vector<int32_t> slot_spec;     // per sort slot: its spec
  std::vector<int32_t> slot_offsets;  // slot s's keys are [slot_offsets[s], slot_offsets[s + 1])
  // The upload, byte offsets within one buffer: specs, then sort_slot, slot_spec,
  // slot_offsets and the penalty ids (int32 each).
  size_t specs_offset = 0;
  size_t sort_slot_offset = 0;
  size_t slot_spec_offset = 0;
  size_t slot_offsets_offset = 0;
  size_t penalty_offset = 0;
  size_t upload_bytes = 0;
  int32_t num_slots() const { return static_cast<int32_t>(slot_spec.size()); }
};

// Device bytes Sample keeps for `rows` specs over `vocab` ids with `penalty_ids` ids of penalty
// context (ReserveSampling): two key buffers the sort alternates between (every row may need
// its keys sorted), the upload, and the tokens. The sort's own temporary storage is a few
// kilobytes (left to the memory plan's reserve).
size_t SampleScratchBytes(int32_t rows, int32_t vocab, int64_t penalty_ids);

// The repetition penalty's bitmap (a bit per id), which a draw keeps in a CTA's shared memory.
size_t PenaltyBitmapBytes(int32_t vocab);

// InvalidArgument naming both sizes when the bitmap for `vocab` is over `limit_bytes`, the
// shared memory this device's sampling kernels may use (PrepareSampleKernels).
absl::Status CheckPenaltyBitmap(int32_t vocab, size_t limit_bytes);

// InvalidArgument when the sorted keys would not fit the sort's int offsets.
absl::StatusOr<SamplePlan> PlanSample(std::span<const SampleSpec> specs, int32_t vocab,
                                      size_t num_penalty_ids);

// Writes the plan's upload (plan.upload_bytes) to `dst`.
void PackSampleUpload(const SamplePlan& plan, std::span<const SampleSpec> specs,
                      std::span<const int32_t> penalty_ids, uint8_t* dst);

}  // namespace ridgeserve::cuda

#endif  // RIDGESERVE_KERNELS_CUDA_SAMPLE_PLAN_H_
