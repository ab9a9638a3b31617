#include "sim/host_link.h"

#include <cstdint>
#include <limits>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace kvpage::sim {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

TierTransfers Transfer(uint64_t id, std::vector<int32_t> save_groups,
                       std::vector<int32_t> load_groups) {
  TierTransfers t;
  t.id = id;
  for (int32_t g : save_groups) t.saves.push_back({GroupId(g), BlockId(1), 1});
  for (int32_t g : load_groups) t.loads.push_back({GroupId(g), BlockId(1), 1});
  return t;
}

// Blocks of 1,000 and 500 bytes on a 1,000 B/s link: a block of group 0 takes 1 s.
TEST(HostLinkTest, TransfersRunOneAfterAnotherSavesFirst) {
  HostLink link({1000, 500}, 1000.0);
  EXPECT_TRUE(link.empty());
  EXPECT_EQ(link.next_done_s(), std::numeric_limits<double>::infinity());
  // Two saves of group 0 (2 s), then a load of group 1 (0.5 s): the saves end at 2.
  EXPECT_DOUBLE_EQ(link.Queue(Transfer(1, {0, 0}, {1}), 0.0), 2.0);
  EXPECT_DOUBLE_EQ(link.next_done_s(), 2.5);
  // Handed over at 1 s, it waits for the first until 2.5 s; no saves: nothing waits on it.
  EXPECT_DOUBLE_EQ(link.Queue(Transfer(2, {}, {0}), 1.0), 1.0);
  EXPECT_DOUBLE_EQ(link.busy_s(), 3.5);
  EXPECT_THAT(link.TakeDone(2.4), IsEmpty());
  EXPECT_THAT(link.TakeDone(2.5), ElementsAre(1u));
  EXPECT_DOUBLE_EQ(link.next_done_s(), 3.5);
  EXPECT_THAT(link.TakeDone(100.0), ElementsAre(2u));
  EXPECT_TRUE(link.empty());
  // An idle link starts a transfer at once.
  EXPECT_DOUBLE_EQ(link.Queue(Transfer(3, {1}, {}), 20.0), 20.5);
  EXPECT_DOUBLE_EQ(link.next_done_s(), 20.5);
  EXPECT_DOUBLE_EQ(link.busy_s(), 4.0);
}

TEST(HostLinkTest, SeveralDoneAtOnceComeOldestFirst) {
  HostLink link({1000}, 1000.0);
  link.Queue(Transfer(7, {0}, {}), 0.0);
  link.Queue(Transfer(8, {}, {0}), 0.0);
  link.Queue(Transfer(9, {0}, {0}), 0.0);
  EXPECT_THAT(link.TakeDone(2.0), ElementsAre(7u, 8u));
  EXPECT_THAT(link.TakeDone(4.0), ElementsAre(9u));
}

}  // namespace
}  // namespace kvpage::sim
