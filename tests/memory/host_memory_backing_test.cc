// HostMemoryBacking: reserved ranges per layer tensor, pages committed per chunk, released
// (resident set and protection) when the chunk goes back.
#include "kvpage/host_memory_backing.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>


#include "kvpage/catalog.h"
#include "kvpage/kv_cache_manager.h"
#include "kvpage/planner.h"
#include "kvpage/scheduler.h"
#include "memory/resident_bytes.h"

// AddressSanitizer's own allocator cannot work under an address-space cap.
#if defined(__SANITIZE_ADDRESS__)
#define KVPAGE_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVPAGE_UNDER_ASAN 1
#endif
#endif
#ifndef KVPAGE_UNDER_ASAN
#define KVPAGE_UNDER_ASAN 0
#endif

namespace kvpage {
namespace {

constexpr int64_t kKiB = 1024, kMiB = 1024 * kKiB, kGiB = 1024 * kMiB;

// A layout of one pool with one tensor: 4 chunks of 2 blocks of 64 KiB.
MemoryLayout OneTensor() {
  MemoryLayout layout;
  layout.pools.push_back(PoolLayout{.block_bytes = 64 * kKiB, .blocks_per_chunk = 2, .max_chunks = 4});
  CacheTensor t;
  t.group = GroupId(0);
  t.kind = CacheTensorKind::kKv;
  t.block_bytes = 64 * kKiB;
  t.block_size = 16;
  t.attention = AttentionShape{.num_kv_heads = 8, .head_dim_k = 128, .head_dim_v = 128};
  layout.tensors.push_back(t);
  layout.budget_bytes = 4 * 128 * kKiB;
  return layout;
}

void TouchAll(char* p, int64_t bytes) {
  for (int64_t i = 0; i < bytes; i += 4096) p[i] = 1;
}

// A cast integer that names no TensorPart is refused, not read as K.
TEST(HostMemoryBacking, ViewOfAPartThatIsNotOneIsRefused) {
  HostMemoryBacking backing;
  ASSERT_TRUE(backing.Reserve(OneTensor()).ok());
  const auto view = backing.View(GroupId(0), 0, static_cast<TensorPart>(99));
  ASSERT_TRUE(absl::IsInvalidArgument(view.status())) << view.status();
  EXPECT_EQ(view.status().message(), "tensor part 99 is not a TensorPart");
  EXPECT_TRUE(backing.View(GroupId(0), 0, TensorPart::kValue).ok());
}

TEST(HostMemoryBacking, ReturnedChunkLeavesTheResidentSet) {
  HostMemoryBacking backing;
  ASSERT_TRUE(backing.Reserve(OneTensor()).ok());
  TensorView k = *backing.View(GroupId(0), 0, TensorPart::kKey);
  char* base = static_cast<char*>(k.base);
  // 9 block ids (null + 4 × 2) of 64 KiB.
  EXPECT_EQ(backing.reserved_bytes(), 9 * 64 * kKiB);
  EXPECT_EQ(backing.mapped_bytes(), 64 * kKiB);  // the null block
  ASSERT_TRUE(backing.MapChunk(0, 1).ok());      // blocks 3 and 4
  EXPECT_EQ(backing.mapped_bytes(), 3 * 64 * kKiB);
  TouchAll(base + 3 * 64 * kKiB, 128 * kKiB);
  EXPECT_EQ(ResidentBytes(base, backing.reserved_bytes()), 128 * kKiB);
  ASSERT_TRUE(backing.UnmapChunk(0, 1).ok());
  EXPECT_EQ(ResidentBytes(base, backing.reserved_bytes()), 0);
  EXPECT_EQ(backing.mapped_bytes(), 64 * kKiB);
  EXPECT_EQ(backing.peak_mapped_bytes(), 3 * 64 * kKiB);
  // Mapped again, the chunk reads zeros: nothing of the old contents survives.
  ASSERT_TRUE(backing.MapChunk(0, 1).ok());
  EXPECT_EQ(base[3 * 64 * kKiB], 0);
}

TEST(HostMemoryBacking, TouchingAnUnmappedChunkFaults) {
  HostMemoryBacking backing;
  ASSERT_TRUE(backing.Reserve(OneTensor()).ok());
  char* base = static_cast<char*>(backing.View(GroupId(0), 0, TensorPart::kKey)->base);
  ASSERT_TRUE(backing.MapChunk(0, 0).ok());
  ASSERT_TRUE(backing.MapChunk(0, 1).ok());
  ASSERT_TRUE(backing.UnmapChunk(0, 1).ok());
  auto touch_in_child = [](volatile char* p) {
    const pid_t pid = fork();
    if (pid == 0) {
      signal(SIGSEGV, SIG_DFL);  // a sanitizer's handler would turn the fault into an exit
      *p = 1;
      _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFSIGNALED(status) ? WTERMSIG(status) : 0;
  };
  EXPECT_EQ(touch_in_child(base + 1 * 64 * kKiB), 0);        // chunk 0, mapped
  EXPECT_EQ(touch_in_child(base + 3 * 64 * kKiB), SIGSEGV);  // chunk 1, returned
  EXPECT_EQ(touch_in_child(base + 7 * 64 * kKiB), SIGSEGV);  // chunk 3, never mapped
  EXPECT_EQ(touch_in_child(base), 0);                        // the null block
}

TEST(HostMemoryBacking, SharedPagesStayWhileANeighbourIsMapped) {
  // 3 KiB blocks, 1 per chunk: chunk c covers [3(c+1), 3(c+2)) KiB, so chunks share pages.
  MemoryLayout layout;
  layout.pools.push_back(PoolLayout{.block_bytes = 3 * kKiB, .blocks_per_chunk = 1, .max_chunks = 8});
  CacheTensor t;
  t.kind = CacheTensorKind::kConvState;
  t.block_bytes = 3 * kKiB;
  layout.tensors.push_back(t);
  HostMemoryBacking backing;
  ASSERT_TRUE(backing.Reserve(layout).ok());
  EXPECT_EQ(backing.reserved_bytes(), 28 * kKiB);  // 9 × 3 KiB rounded to 7 pages
  EXPECT_EQ(backing.mapped_bytes(), 4 * kKiB);    // page 0: the null block
  ASSERT_TRUE(backing.MapChunk(0, 0).ok());       // [3, 6) KiB: page 1 added
  EXPECT_EQ(backing.mapped_bytes(), 8 * kKiB);
  ASSERT_TRUE(backing.MapChunk(0, 1).ok());       // [6, 9) KiB: page 2 added
  EXPECT_EQ(backing.mapped_bytes(), 12 * kKiB);
  ASSERT_TRUE(backing.UnmapChunk(0, 0).ok());     // pages 0 and 1 are still held
  EXPECT_EQ(backing.mapped_bytes(), 12 * kKiB);
  ASSERT_TRUE(backing.UnmapChunk(0, 1).ok());     // pages 1 and 2 go
  EXPECT_EQ(backing.mapped_bytes(), 4 * kKiB);
}

TEST(HostMemoryBacking, MisuseIsAStatus) {
  HostMemoryBacking backing;
  EXPECT_TRUE(absl::IsFailedPrecondition(backing.MapChunk(0, 0)));
  EXPECT_TRUE(absl::IsUnimplemented(backing.Reserve(MemoryLayout{})));
  ASSERT_TRUE(backing.Reserve(OneTensor()).ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(backing.Reserve(OneTensor())));
  EXPECT_TRUE(absl::IsInvalidArgument(backing.MapChunk(0, 4)));
  EXPECT_TRUE(absl::IsInvalidArgument(backing.MapChunk(1, 0)));
  EXPECT_TRUE(absl::IsFailedPrecondition(backing.UnmapChunk(0, 0)));
  ASSERT_TRUE(backing.MapChunk(0, 0).ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(backing.MapChunk(0, 0)));
  EXPECT_TRUE(absl::IsNotFound(backing.View(GroupId(0), 0, TensorPart::kLatent).status()));
  EXPECT_TRUE(absl::IsNotFound(backing.View(GroupId(1), 0, TensorPart::kKey).status()));
}

// Address space the process may not have: Create fails with the backing's status, in a child
// whose address space is capped.
TEST(HostMemoryBacking, ReserveFailureFailsCreate) {
  if (KVPAGE_UNDER_ASAN) GTEST_SKIP() << "AddressSanitizer needs more address space than the cap";
  const ModelSpec model = *LoadModel("gemma-3-4b-it");
  const pid_t pid = fork();
  if (pid == 0) {
    rlimit cap{.rlim_cur = 8 * static_cast<rlim_t>(kGiB), .rlim_max = 8 * static_cast<rlim_t>(kGiB)};
    setrlimit(RLIMIT_AS, &cap);
    HostMemoryBacking backing;
    KvCacheConfig config;
    config.kv_budget_bytes = 64 * kGiB;
    config.backing = &backing;
    auto manager = KvCacheManager::Create(model, config);
    _exit(absl::IsResourceExhausted(manager.status()) ? 0 : 1);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
}  // namespace kvpage
