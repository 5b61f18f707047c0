// dst[i, :] = src[index[i], :] on the device (Backend::GatherRows).
#ifndef RIDGESERVE_KERNELS_CUDA_GATHER_ROWS_H_
#define RIDGESERVE_KERNELS_CUDA_GATHER_ROWS_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace ridgeserve::cuda {

void LaunchGatherRows(const float* src, int32_t dim, const int32_t* index, int32_t n, float* dst,
                      cudaStream_t stream);

}  // namespace ridgeserve::cuda

#endif  // RIDGESERVE_KERNELS_CUDA_GATHER_ROWS_H_
