// Helpers shared by the scheduler tests.
#ifndef KVPAGE_TESTS_SCHEDULER_SCHEDULER_TEST_UTIL_H_
#define KVPAGE_TESTS_SCHEDULER_SCHEDULER_TEST_UTIL_H_

#include <gtest/gtest.h>

#include "absl/status/status.h"

// Fails the test (and returns) unless the scheduler's CheckInvariants passes.
#define EXPECT_SCHED_INVARIANTS(s)            \
  do {                                        \
    absl::Status st_ = (s).CheckInvariants(); \
    ASSERT_TRUE(st_.ok()) << st_;             \
  } while (false)

#endif  // KVPAGE_TESTS_SCHEDULER_SCHEDULER_TEST_UTIL_H_
