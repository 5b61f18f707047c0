// The tensor-parallel all-reduce's sum on the device (engine/parallel/nccl_communicator): after
// an all-gather, out[i] = ((in[0][i] + in[1][i]) + in[2][i]) + ..., in rank order, as the
// Communicator interface asks, so every rank holds the same bits as the CPU's thread
// communicator would.
#ifndef RIDGESERVE_KERNELS_CUDA_REDUCE_RANKS_H_
#define RIDGESERVE_KERNELS_CUDA_REDUCE_RANKS_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace ridgeserve::cuda {

// gathered [ranks, count] (rank r's values at r * count), out [count] (may alias gathered's
// first row).
void LaunchSumRanksInOrder(const float* gathered, int ranks, size_t count, float* out,
                           cudaStream_t stream);

}  // namespace ridgeserve::cuda

#endif  // RIDGESERVE_KERNELS_CUDA_REDUCE_RANKS_H_
