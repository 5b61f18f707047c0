// Open-loop inter-arrival times, with vLLM benchmark_serving's semantics: gamma intervals of
// shape B (the burstiness) and scale 1 / (rate * B), so the mean rate is `rate` for every B;
// B = 1 is a Poisson process (exponential intervals), B < 1 burstier, B > 1 more regular.
#ifndef RIDGESERVE_LOADTEST_ARRIVAL_PROCESS_H_
#define RIDGESERVE_LOADTEST_ARRIVAL_PROCESS_H_

#include <cstdint>
#include <random>

namespace ridgeserve::loadtest {

class ArrivalProcess {
 public:
  // rate > 0 (requests per second), burstiness > 0.
  ArrivalProcess(double rate, double burstiness, uint64_t seed);

  // Seconds from one arrival to the next.
  double NextInterval();

 private:
  std::mt19937_64 rng_;
  std::gamma_distribution<double> gamma_;
};

}  // namespace ridgeserve::loadtest

#endif  // RIDGESERVE_LOADTEST_ARRIVAL_PROCESS_H_
