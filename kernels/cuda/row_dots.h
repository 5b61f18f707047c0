// Backend::ShiftedRowDots on the device (RidgeFill's leverage test): one warp per row, lane l
// summing the products of columns l, l + 32, ... in order in double, the lanes then by a fixed
// butterfly of shuffles. Bitwise reproducible; within double rounding of the CPU's j-order sum.
#ifndef RIDGESERVE_KERNELS_CUDA_ROW_DOTS_H_
#define RIDGESERVE_KERNELS_CUDA_ROW_DOTS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace ridgeserve::cuda {

// out[i] = Σ_j (a[i, j] − shift[j]) · b[i, j]; a, b [n, dim], shift [dim], out [n].
void LaunchShiftedRowDots(const float* a, const float* shift, const float* b, int32_t n,
                          int32_t dim, double* out, cudaStream_t stream);

}  // namespace ridgeserve::cuda

#endif  // RIDGESERVE_KERNELS_CUDA_ROW_DOTS_H_
