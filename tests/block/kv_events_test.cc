// KV events of a hybrid model, group by group: every group's stream must be consistent on its
// own, so a router that mirrors one group (Dynamo's indexer mirrors group 0) never meets a
// parent it does not know or a removal of a block it never saw. Checked on qwen3.5-0.8b (full
// attention plus Gated DeltaNet state) under shared prefixes, evictions and aborts:
//   - a kStored hash is new to its group, its parent (if any) was stored by the group and not
//     removed since, and the chain of token_ids from the root rehashes to the event's hash;
//   - a kRemoved hash was stored by its group and not removed since.
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "kvpage/block_hash.h"
#include "kvpage/catalog.h"
#include "kvpage/kv_events.h"
#include "kvpage/scheduler.h"

namespace kvpage {
namespace {

constexpr uint64_t kSeed = 11;
constexpr int32_t kBlockSize = 16;

// What one group's stream says it holds: each hash with every token from position 0 to the
// end of its block (the chain of token_ids through its parents).
struct GroupMirror {
  absl::flat_hash_map<BlockHash, std::vector<int32_t>> held;
  int64_t stored = 0;
  int64_t removed = 0;
  int64_t multi_block = 0;  // stored events covering more than one block of tokens
  int64_t with_lora = 0;
};

class StreamChecker {
 public:
  explicit StreamChecker(int32_t num_groups) : groups_(static_cast<size_t>(num_groups)) {}

  void Consume(const std::vector<KvEvent>& events) {
    for (const KvEvent& e : events) {
      switch (e.type) {
        case KvEvent::Type::kStored: Stored(e); break;
        case KvEvent::Type::kRemoved: Removed(e); break;
        case KvEvent::Type::kAllCleared:
          for (GroupMirror& g : groups_) g.held.clear();
          break;
      }
    }
  }
  const GroupMirror& group(int32_t g) const { return groups_[static_cast<size_t>(g)]; }

 private:
  void Stored(const KvEvent& e) {
    GroupMirror& g = groups_.at(static_cast<size_t>(e.group.value));
    ++g.stored;
    ASSERT_FALSE(g.held.contains(e.hash)) << "group " << e.group.value << " stored a hash twice";
    ASSERT_FALSE(e.token_ids.empty());
    ASSERT_EQ(e.token_ids.size() % kBlockSize, 0u);
    if (e.token_ids.size() > kBlockSize) ++g.multi_block;
    if (e.lora_id != 0) ++g.with_lora;
    std::vector<int32_t> prefix;
    if (e.has_parent) {
      auto it = g.held.find(e.parent);
      ASSERT_NE(it, g.held.end()) << "group " << e.group.value << " event " << g.stored
                                  << " names a parent the group does not hold";
      prefix = it->second;
    }
    prefix.insert(prefix.end(), e.token_ids.begin(), e.token_ids.end());
    // The tokens from the root rehash to the event's hash: token_ids are exactly right.
    BlockHashExtras extras;
    extras.lora_id = e.lora_id;
    BlockHash h = hasher_.root();
    for (size_t at = 0; at < prefix.size(); at += kBlockSize) {
      h = hasher_.HashBlock(h, absl::MakeConstSpan(prefix).subspan(at, kBlockSize), extras,
                            static_cast<int64_t>(at));
    }
    ASSERT_EQ(h, e.hash) << "group " << e.group.value << ": token_ids do not rehash";
    g.held.emplace(e.hash, std::move(prefix));
  }

  void Removed(const KvEvent& e) {
    GroupMirror& g = groups_.at(static_cast<size_t>(e.group.value));
    ++g.removed;
    ASSERT_EQ(g.held.erase(e.hash), 1u)
        << "group " << e.group.value << " removed a hash it does not hold";
  }

  BlockHasher hasher_{HashAlgorithm::kXxh3_128, kSeed};
  std::vector<GroupMirror> groups_;
};

// Prompts of four families: a shared prefix of 100–400 tokens, then a suffix of its own.
std::vector<int32_t> Prompt(int64_t id) {
  const int32_t family = static_cast<int32_t>(id % 4);
  std::vector<int32_t> p;
  for (int32_t i = 0; i < 100 * (family + 1); ++i) p.push_back(1000 * family + i % 97 + 1);
  const int32_t suffix = 20 + static_cast<int32_t>((id * 37) % 90);
  for (int32_t i = 0; i < suffix; ++i) p.push_back(static_cast<int32_t>(50000 + id * 131 + i));
  return p;
}

ModelOutput Sample(const SchedulerOutput& out, int32_t step) {
  ModelOutput m;
  m.sampled_offsets.push_back(0);
  for (const ScheduledRequest& r : out.requests) {
    if (r.samples) m.sampled_token_ids.push_back(7 + step % 13);
    m.sampled_offsets.push_back(static_cast<int32_t>(m.sampled_token_ids.size()));
  }
  return m;
}

TEST(KvEventsTest, EveryGroupStreamOfAHybridModelIsConsistentOnItsOwn) {
  absl::StatusOr<ModelSpec> model = LoadModel("qwen3.5-0.8b");
  ASSERT_TRUE(model.ok()) << model.status();
  SchedulerConfig c;
  c.kv.kv_budget_bytes = int64_t{96} << 20;  // small: the cache evicts
  c.kv.block_size = kBlockSize;
  c.kv.hash_seed = kSeed;
  c.kv.enable_kv_events = true;
  c.kv.decode_snapshot_interval_blocks = 2;  // snapshots during decode too
  c.max_num_batched_tokens = 512;            // prompts run in several chunks
  c.max_num_seqs = 8;
  auto s = Scheduler::Create(*model, c);
  ASSERT_TRUE(s.ok()) << s.status();
  Scheduler& sched = **s;
  const int32_t num_groups = sched.kv_cache().num_groups();
  ASSERT_EQ(num_groups, 2);
  // kvpage orders the groups state first.
  ASSERT_EQ(sched.kv_cache().group_kind(GroupId(0)), LayerKind::kLinearAttention);
  ASSERT_EQ(sched.kv_cache().group_kind(GroupId(1)), LayerKind::kFullAttention);

  StreamChecker checker(num_groups);
  int64_t next_id = 0;
  for (int32_t step = 0; step < 3000 && (next_id < 60 || sched.HasUnfinishedRequests()); ++step) {
    if (next_id < 60 && step % 3 == 0) {
      RequestSpec r{.id = RequestId(next_id), .prompt_token_ids = Prompt(next_id),
                    .max_new_tokens = 40 + static_cast<int32_t>(next_id % 5) * 10,
                    .lora_id = next_id % 10 == 9 ? 3 : 0};  // LoRA ids reach the events
      ASSERT_TRUE(sched.AddRequest(std::move(r)).ok());
      ++next_id;
    }
    if (step % 17 == 5 && next_id > 2) {
      (void)sched.Abort(RequestId(next_id - 2));  // may have finished already: NotFound is fine
    }
    const SchedulerOutput& out = sched.Schedule();
    ASSERT_TRUE(sched.Update(out, Sample(out, step)).ok());
    checker.Consume(sched.DrainKvEvents());
    if (::testing::Test::HasFatalFailure()) return;
    ASSERT_TRUE(sched.CheckInvariants().ok());
  }
  EXPECT_FALSE(sched.HasUnfinishedRequests());
  const GroupMirror& state = checker.group(0);
  const GroupMirror& attention = checker.group(1);
  // The workload exercised what the checks are about: evictions in both groups, snapshots
  // whose parent lies more than one block back, LoRA requests.
  EXPECT_EQ(attention.stored, 1128);
  EXPECT_EQ(attention.removed, 1028);
  EXPECT_EQ(attention.multi_block, 0);
  EXPECT_EQ(attention.with_lora, 191);
  EXPECT_EQ(state.stored, 246);
  EXPECT_EQ(state.removed, 243);
  EXPECT_EQ(state.multi_block, 241);
  EXPECT_EQ(state.with_lora, 28);
  EXPECT_EQ(attention.stored - attention.removed, static_cast<int64_t>(attention.held.size()));
  EXPECT_EQ(state.stored - state.removed, static_cast<int64_t>(state.held.size()));
}

// A bare pool records hash and parent only; without events the groups pass nothing.
TEST(KvEventsTest, NoDetailIsRecordedWhenEventsAreOff) {
  absl::StatusOr<ModelSpec> model = LoadModel("qwen3.5-0.8b");
  ASSERT_TRUE(model.ok()) << model.status();
  SchedulerConfig c;
  c.kv.kv_budget_bytes = int64_t{96} << 20;
  c.kv.hash_seed = kSeed;
  auto s = Scheduler::Create(*model, c);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_TRUE((*s)->AddRequest(RequestSpec{.id = RequestId(1), .prompt_token_ids = Prompt(1),
                                          .max_new_tokens = 4})
                  .ok());
  while ((*s)->HasUnfinishedRequests()) {
    const SchedulerOutput& out = (*s)->Schedule();
    ASSERT_TRUE((*s)->Update(out, Sample(out, 0)).ok());
  }
  EXPECT_TRUE((*s)->DrainKvEvents().empty());
}

}  // namespace
}  // namespace kvpage
