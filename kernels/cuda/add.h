// Elementwise row arithmetic on the device: x += y (Backend::Add), a row vector subtracted
// from every row (Backend::ShiftRows).
#ifndef RIDGESERVE_KERNELS_CUDA_ADD_H_
#define RIDGESERVE_KERNELS_CUDA_ADD_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace ridgeserve::cuda {

void LaunchAdd(float* x, const float* y, size_t count, cudaStream_t stream);

// out[i, j] = a[i, j] − shift[j]; a and out [n, dim], shift [dim].
void LaunchShiftRows(const float* a, const float* shift, int32_t n, int32_t dim, float* out,
                     cudaStream_t stream);

}  // namespace ridgeserve::cuda

#endif  // RIDGESERVE_KERNELS_CUDA_ADD_H_
