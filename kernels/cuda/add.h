// x += y elementwise on the device (Backend::Add).
#ifndef RIDGESERVE_KERNELS_CUDA_ADD_H_
#define RIDGESERVE_KERNELS_CUDA_ADD_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace ridgeserve::cuda {

void LaunchAdd(float* x, const float* y, size_t count, cudaStream_t stream);

}  // namespace ridgeserve::cuda

#endif  // RIDGESERVE_KERNELS_CUDA_ADD_H_
