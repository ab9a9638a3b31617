// Deterministic random numbers for the simulator: splitmix64 and what is built on it.
//
// The standard library's distributions are implementation-defined (libstdc++ and libc++ give
// different streams for the same engine), so a replay would not be bit-reproducible across
// toolchains. Everything here is written out explicitly instead. Not thread-safe; use one
// generator per thread.
#ifndef KVPAGE_SIM_RANDOM_H_
#define KVPAGE_SIM_RANDOM_H_

#include <cmath>
#include <cstdint>
#include <numbers>

#include "sim/trace.h"

namespace kvpage::sim {

// splitmix64 (Steele, Lea, Flood, "Fast splittable pseudorandom number generators", OOPSLA
// 2014; constants as in Vigna's public-domain splitmix64.c).
inline constexpr uint64_t kSplitMix64Gamma = 0x9E3779B97F4A7C15ULL;

inline uint64_t SplitMix64Finalize(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}

  uint64_t Next() {
    state_ += kSplitMix64Gamma;
    return SplitMix64Finalize(state_);
  }
  // Uniform in [0, 1) with 53 random bits.
  double Uniform01() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }
  // Uniform integer in [lo, hi] (modulo bias below 2^-40 for ranges under 2^24).
  int64_t UniformInt(int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(Next() % static_cast<uint64_t>(hi - lo + 1));
  }
  // Exponential with mean 1 / rate.
  double Exponential(double rate) { return -std::log1p(-Uniform01()) / rate; }
  // Standard normal by the Box–Muller transform (one of the pair is discarded).
  double Normal() {
    const double u1 = 1.0 - Uniform01();  // (0, 1]: log stays finite
    const double u2 = Uniform01();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
  }

 private:
  uint64_t state_;
};

// Successive arrival times of an ArrivalOptions process: the first at 0, then gaps of
// 1 / rate (kFixed) or exponential gaps with mean 1 / rate (kPoisson); always 0 for kBurst.
// REQUIRES: options.Validate().ok().
class ArrivalClock {
 public:
  ArrivalClock(const ArrivalOptions& options, uint64_t seed)
      : options_(options), rng_(seed ^ 0xA5A5A5A5A5A5A5A5ULL) {}

  double Next() {
    if (options_.kind == ArrivalKind::kBurst) return 0.0;
    const double t = count_ == 0 ? 0.0
                     : options_.kind == ArrivalKind::kFixed
                         ? static_cast<double>(count_) / options_.rate_per_s
                         : last_ + rng_.Exponential(options_.rate_per_s);
    ++count_;
    last_ = t;
    return t;
  }

 private:
  ArrivalOptions options_;
  SplitMix64 rng_;
  int64_t count_ = 0;
  double last_ = 0.0;
};

}  // namespace kvpage::sim

#endif  // KVPAGE_SIM_RANDOM_H_
