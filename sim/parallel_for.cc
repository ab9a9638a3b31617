#include "sim/parallel_for.h"

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

namespace kvpage::sim {

void ParallelFor(int64_t count, int32_t jobs, const std::function<void(int64_t)>& task) {
  std::atomic<int64_t> next{0};
  auto worker = [&] {
    for (int64_t i = next.fetch_add(1); i < count; i = next.fetch_add(1)) task(i);
  };
  const int64_t threads = std::min<int64_t>(std::max(jobs, 1), count);
  std::vector<std::thread> pool;
  for (int64_t t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (std::thread& t : pool) t.join();
}

}  // namespace kvpage::sim
