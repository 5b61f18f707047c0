#include "kernels/cuda/sample_plan.h"

#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"

namespace ridgeserve::cuda {

bool NeedsRankOrder(const SampleSpec& spec, int32_t vocab) {
  return spec.temperature != 0.0f && ((spec.top_k > 0 && spec.top_k < vocab) || spec.top_p < 1.0f);
}

size_t SampleScratchBytes(int32_t rows, int32_t vocab, int64_t penalty_ids) {
  const size_t n = static_cast<size_t>(rows);
  const size_t keys = sizeof(uint64_t) * n * static_cast<size_t>(vocab);
  // Upload: specs, sort slots, slot specs, slot offsets (n + 1) and the penalty ids.
  const size_t upload =
      sizeof(SampleSpec) * n + sizeof(int32_t) * (3 * n + 1 + static_cast<size_t>(penalty_ids));
  return 2 * keys + upload + sizeof(SampledToken) * n;
}

size_t PenaltyBitmapBytes(int32_t vocab) {
  return sizeof(uint32_t) * ((static_cast<size_t>(vocab) + 31) / 32);
}

absl::Status CheckPenaltyBitmap(int32_t vocab, size_t limit_bytes) {
  const size_t bytes = PenaltyBitmapBytes(vocab);
  if (bytes <= limit_bytes) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "CUDA sampling: a vocabulary of ", vocab, " ids needs ", bytes,
      " bytes of shared memory for its repetition-penalty bitmap; this device gives the "
      "sampling kernels ",
      limit_bytes));
}

absl::StatusOr<SamplePlan> PlanSample(std::span<const SampleSpec> specs, int32_t vocab,
                                      size_t num_penalty_ids) {
  SamplePlan plan;
  plan.sort_slot.assign(specs.size(), -1);
  plan.slot_offsets.push_back(0);
  for (size_t i = 0; i < specs.size(); ++i) {
    if (!NeedsRankOrder(specs[i], vocab)) continue;
    if (plan.slot_offsets.back() > std::numeric_limits<int32_t>::max() - vocab) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sample: ", plan.num_slots() + 1, " sorted rows of ", vocab, " keys exceed 2^31"));
    }
    plan.sort_slot[i] = plan.num_slots();
    plan.slot_spec.push_back(static_cast<int32_t>(i));
    plan.slot_offsets.push_back(plan.slot_offsets.back() + vocab);
  }
  plan.specs_offset = 0;
  plan.sort_slot_offset = sizeof(SampleSpec) * specs.size();
  plan.slot_spec_offset = plan.sort_slot_offset + sizeof(int32_t) * plan.sort_slot.size();
  plan.slot_offsets_offset = plan.slot_spec_offset + sizeof(int32_t) * plan.slot_spec.size();
  plan.penalty_offset = plan.slot_offsets_offset + sizeof(int32_t) * plan.slot_offsets.size();
  plan.upload_bytes = plan.penalty_offset + sizeof(int32_t) * num_penalty_ids;
  return plan;
}

void PackSampleUpload(const SamplePlan& plan, std::span<const SampleSpec> specs,
                      std::span<const int32_t> penalty_ids, uint8_t* dst) {
  std::memcpy(dst + plan.specs_offset, specs.data(), sizeof(SampleSpec) * specs.size());
  std::memcpy(dst + plan.sort_slot_offset, plan.sort_slot.data(),
              sizeof(int32_t) * plan.sort_slot.size());
  std::memcpy(dst + plan.slot_spec_offset, plan.slot_spec.data(),
              sizeof(int32_t) * plan.slot_spec.size());
  std::memcpy(dst + plan.slot_offsets_offset, plan.slot_offsets.data(),
              sizeof(int32_t) * plan.slot_offsets.size());
  std::memcpy(dst + plan.penalty_offset, penalty_ids.data(), sizeof(int32_t) * penalty_ids.size());
}

}  // namespace ridgeserve::cuda
