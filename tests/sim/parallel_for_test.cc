// ParallelFor runs every index exactly once, on at most `jobs` threads.
#include "sim/parallel_for.h"

#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

namespace kvpage::sim {
namespace {

TEST(ParallelForTest, RunsEveryIndexOnce) {
  for (int32_t jobs : {0, 1, 3, 64}) {
    std::vector<std::atomic<int>> runs(100);
    ParallelFor(100, jobs, [&](int64_t i) { runs[i].fetch_add(1); });
    for (size_t i = 0; i < runs.size(); ++i) EXPECT_EQ(runs[i].load(), 1) << jobs << " " << i;
  }
}

TEST(ParallelForTest, UsesAtMostJobsThreadsAndNoneForNoTask) {
  std::mutex mu;
  std::set<std::thread::id> threads;
  ParallelFor(40, 3, [&](int64_t) {
    std::lock_guard<std::mutex> lock(mu);
    threads.insert(std::this_thread::get_id());
  });
  EXPECT_GE(threads.size(), 1u);
  EXPECT_LE(threads.size(), 3u);
  int calls = 0;
  ParallelFor(0, 8, [&](int64_t) { ++calls; });
  EXPECT_EQ(calls, 0);
}

TEST(ParallelForTest, OneJobRunsInOrderOnTheCallingThread) {
  std::vector<int64_t> order;
  const std::thread::id caller = std::this_thread::get_id();
  ParallelFor(5, 1, [&](int64_t i) {
    EXPECT_EQ(std::this_thread::get_id(), caller);
    order.push_back(i);
  });
  EXPECT_EQ(order, (std::vector<int64_t>{0, 1, 2, 3, 4}));
}

}  // namespace
}  // namespace kvpage::sim
