// Backend::Sample on the device (kernels/sample.h's definition; the plan in sample_plan.h).
// Three launches on the stream:
//   keys:  one CTA per sort slot writes its row's 64-bit keys (penalized logits);
//   sort:  cub::DeviceSegmentedRadixSort orders every slot's keys, descending, at once
//          (alternating between two key buffers, so its own storage stays small);
//   draw:  one CTA per spec: the repetition penalty from a bitmap of its ids in shared
//          memory, then argmax, or the weights' prefix sums in id or rank order, the draw
//          and the log-probability.
// Sums are in double, each thread summing a contiguous chunk in order and the chunks combined
// by a fixed tree (cub's block scan and reduce), so a row's token is a function of its logits,
// spec and ids alone: bitwise reproducible, and the CPU's token except where the target lands
// within rounding of a cumulative boundary (the chunked sum and CUDA's expf differ from the
// CPU's sequential sum and glibc's expf in the last bits).
#ifndef RIDGESERVE_KERNELS_CUDA_SAMPLE_H_
#define RIDGESERVE_KERNELS_CUDA_SAMPLE_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "kernels/sample_spec.h"

namespace ridgeserve::cuda {

struct SampleArgs {
  const float* logits = nullptr;  // [rows, vocab]
  int32_t vocab = 0;
  // The penalty bitmap's shared memory (PenaltyBitmapBytes, checked against the limit
  // PrepareSampleKernels gave).
  size_t bitmap_bytes = 0;
  int32_t num_specs = 0;
  int32_t num_slots = 0;
  // The upload (SamplePlan's layout), on the device.
  const SampleSpec* specs = nullptr;
  const int32_t* sort_slot = nullptr;
  const int32_t* slot_spec = nullptr;
  const int32_t* slot_offsets = nullptr;
  const int32_t* penalty_ids = nullptr;
  // Workspace: two key buffers [num_slots * vocab] each (the keys start in keys[0]; the sort
  // leaves them in either), the sort's temporary storage.
  uint64_t* keys[2] = {nullptr, nullptr};
  void* sort_temp = nullptr;
  size_t sort_temp_bytes = 0;
  SampledToken* out = nullptr;  // [num_specs], on the device
};

// The sort's temporary storage for `num_slots` slots of `vocab` keys.
size_t SampleSortTempBytes(int32_t num_slots, int32_t vocab);

// Lets the kernels use all the shared memory a CTA may opt into (`optin_bytes`, the current
// device's cudaDevAttrMaxSharedMemoryPerBlockOptin) beside their own, and returns that many
// bytes: the largest penalty bitmap they take (CheckPenaltyBitmap in sample_plan.h). Once per
// device, at the backend's start, with the device current.
absl::StatusOr<size_t> PrepareSampleKernels(int optin_bytes);

// args.bitmap_bytes must be within PrepareSampleKernels' limit: the caller checks it (not
// checked again here).
void LaunchSample(const SampleArgs& args, cudaStream_t stream);

}  // namespace ridgeserve::cuda

#endif  // RIDGESERVE_KERNELS_CUDA_SAMPLE_H_
