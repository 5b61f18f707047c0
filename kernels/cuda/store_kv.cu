#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/store_kv.h"

namespace ridgeserve::cuda {
namespace {

template <int kCode>
__device__ inline void Put(void* base, int64_t index, float value) {
  if constexpr (kCode == 0) {
    static_cast<float*>(base)[index] = value;
  } else if constexpr (kCode == 1) {
    static_cast<__half*>(base)[index] = __float2half_rn(value);
  } else {
    static_cast<__nv_bfloat16*>(base)[index] = __float2bfloat16_rn(value);
  }
}

template <int kCode>
__global__ void StoreKvKernel(void* cache_k, void* cache_v, const float* k, const float* v,
                              int32_t ld, int32_t width, int64_t total, const int32_t* slots) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = e / width, c = e % width;
    if (slots[i] < 0) continue;  // a padding row (Backend::StoreKv)
    const int64_t dst = int64_t{slots[i]} * width + c;
    Put<kCode>(cache_k, dst, k[i * ld + c]);
    Put<kCode>(cache_v, dst, v[i * ld + c]);
  }
}

}  // namespace

void LaunchStoreKv(void* cache_k, void* cache_v, int dtype_code, const float* k, const float* v,
                   int32_t ld, int32_t n, int32_t width, const int32_t* slots,
                   cudaStream_t stream) {
  const int64_t total = int64_t{n} * width;
  if (total <= 0) return;
  const unsigned blocks = ElementwiseBlocks(total);
  switch (dtype_code) {
    case 0:
      StoreKvKernel<0><<<blocks, kElementwiseThreads, 0, stream>>>(cache_k, cache_v, k, v, ld,
                                                                   width, total, slots);
      break;
    case 1:
      StoreKvKernel<1><<<blocks, kElementwiseThreads, 0, stream>>>(cache_k, cache_v, k, v, ld,
                                                                   width, total, slots);
      break;
    default:
      StoreKvKernel<2><<<blocks, kElementwiseThreads, 0, stream>>>(cache_k, cache_v, k, v, ld,
                                                                   width, total, slots);
  }
  CUDA_CHECK_LAUNCH(stream);
}

}  // namespace ridgeserve::cuda
