// Philox4x64-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011): a
// counter-based generator, so a draw is a pure function of (key, counter) and the host and a
// device compute the same bits with no state to carry between them. The outputs equal
// Random123's and NumPy's numpy.random.Philox for the same key and counter
// (tests/kernels/sample_test.cc checks them).
#ifndef RIDGESERVE_KERNELS_PHILOX_H_
#define RIDGESERVE_KERNELS_PHILOX_H_

#include <cstdint>

#if defined(__CUDACC__)
#define RS_HOST_DEVICE __host__ __device__
#else
#define RS_HOST_DEVICE
#endif

namespace ridgeserve {

struct Philox4x64 {
  uint64_t v[4];
};

RS_HOST_DEVICE inline void MulHiLo64(uint64_t a, uint64_t b, uint64_t& hi, uint64_t& lo) {
#if defined(__CUDA_ARCH__)
  hi = __umul64hi(a, b);
  lo = a * b;
#else
  const unsigned __int128 product = static_cast<unsigned __int128>(a) * b;
  hi = static_cast<uint64_t>(product >> 64);
  lo = static_cast<uint64_t>(product);
#endif
}

// The block for `counter` under `key` (ten rounds).
RS_HOST_DEVICE inline Philox4x64 Philox4x64_10(Philox4x64 counter, uint64_t key0, uint64_t key1) {
  constexpr uint64_t kMul0 = 0xD2E7470EE14C6C93ull, kMul1 = 0xCA5A826395121157ull;
  constexpr uint64_t kWeyl0 = 0x9E3779B97F4A7C15ull, kWeyl1 = 0xBB67AE8584CAA73Bull;
  uint64_t* c = counter.v;
  for (int round = 0; round < 10; ++round) {
    uint64_t hi0, lo0, hi1, lo1;
    MulHiLo64(kMul0, c[0], hi0, lo0);
    MulHiLo64(kMul1, c[2], hi1, lo1);
    const uint64_t next[4] = {hi1 ^ c[1] ^ key0, lo1, hi0 ^ c[3] ^ key1, lo0};
    for (int i = 0; i < 4; ++i) c[i] = next[i];
    key0 += kWeyl0;
    key1 += kWeyl1;
  }
  return counter;
}

// A request's `draw`-th uniform in [0, 1): the top 53 bits of the first word of the block at
// counter (draw, 0, 0, 0) under key (seed, 0).
RS_HOST_DEVICE inline double DrawUniform(uint64_t seed, uint64_t draw) {
  const Philox4x64 block = Philox4x64_10(Philox4x64{{draw, 0, 0, 0}}, seed, 0);
  return static_cast<double>(block.v[0] >> 11) * 0x1.0p-53;
}

}  // namespace ridgeserve

#endif  // RIDGESERVE_KERNELS_PHILOX_H_
