// A row vector subtracted from every row on the device (Backend::ShiftRows).
#ifndef RIDGESERVE_KERNELS_CUDA_SHIFT_ROWS_H_
#define RIDGESERVE_KERNELS_CUDA_SHIFT_ROWS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace ridgeserve::cuda {

// out[i, j] = a[i, j] − shift[j]; a and out [n, dim], shift [dim].
void LaunchShiftRows(const float* a, const float* shift, int32_t n, int32_t dim, float* out,
                     cudaStream_t stream);

}  // namespace ridgeserve::cuda

#endif  // RIDGESERVE_KERNELS_CUDA_SHIFT_ROWS_H_
