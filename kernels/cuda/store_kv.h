// Writes rows of K and V to their cache slots (Backend::StoreKv), narrowed to the cache's type
// with round to nearest even (__float2half_rn, __float2bfloat16_rn: ConvertFromFloat's
// rounding, overflow to infinity, NaN stays NaN).
#ifndef RIDGESERVE_KERNELS_CUDA_STORE_KV_H_
#define RIDGESERVE_KERNELS_CUDA_STORE_KV_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace ridgeserve::cuda {

// dtype_code: 0 = F32, 1 = F16, 2 = BF16 (kernels/dtype.h types, mapped by the backend).
// k, v rows `ld` apart, `width` = num_kv_heads * head_dim elements each; slots [n].
void LaunchStoreKv(void* cache_k, void* cache_v, int dtype_code, const float* k, const float* v,
                   int32_t ld, int32_t n, int32_t width, const int32_t* slots, cudaStream_t stream);

}  // namespace ridgeserve::cuda

#endif  // RIDGESERVE_KERNELS_CUDA_STORE_KV_H_
