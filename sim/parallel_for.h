// Runs independent tasks on a few threads: the CLI's SLO search runs one replica search per
// (tp, router) pair at once.
#ifndef KVPAGE_SIM_PARALLEL_FOR_H_
#define KVPAGE_SIM_PARALLEL_FOR_H_

#include <cstdint>
#include <functional>

namespace kvpage::sim {

// Calls task(i) once for every i in [0, count), on min(jobs, count) threads (the calling thread
// is one of them), each taking the next unstarted index; returns when all have returned.
// Tasks must not throw and must synchronise whatever they share. jobs <= 1 runs them in order
// on the calling thread. REQUIRES: count >= 0.
void ParallelFor(int64_t count, int32_t jobs, const std::function<void(int64_t)>& task);

}  // namespace kvpage::sim

#endif  // KVPAGE_SIM_PARALLEL_FOR_H_
