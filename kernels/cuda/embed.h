// Embedding gather from a bf16 table on the device (Backend::Embed): out[i, :] = the table's
// row ids[i] - id_begin widened to f32 exactly, or zeros when that row is not in the table.
#ifndef RIDGESERVE_KERNELS_CUDA_EMBED_H_
#define RIDGESERVE_KERNELS_CUDA_EMBED_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace ridgeserve::cuda {

// table [rows, dim] bf16 (as uint16_t bits).
void LaunchEmbed(const uint16_t* table, int64_t rows, int64_t dim, int64_t id_begin,
                 const int32_t* ids, int32_t n, float* out, cudaStream_t stream);

}  // namespace ridgeserve::cuda

#endif  // RIDGESERVE_KERNELS_CUDA_EMBED_H_
