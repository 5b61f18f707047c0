#include "loadtest/arrival_process.h"

namespace ridgeserve::loadtest {

ArrivalProcess::ArrivalProcess(double rate, double burstiness, uint64_t seed)
    : rng_(seed), gamma_(burstiness, 1.0 / (rate * burstiness)) {}

double ArrivalProcess::NextInterval() { return gamma_(rng_); }

}  // namespace ridgeserve::loadtest
