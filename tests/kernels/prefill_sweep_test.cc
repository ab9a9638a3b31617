// The prefill sweep kvpage_gpu_check and kvpage_flashinfer_peer share: its rows, FLOP and
// byte counts, and the two host forms (block table, page CSR) of one batch.
#include "kernels/check/prefill_sweep.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

namespace kvpage::cuda::check {
namespace {

TEST(PrefillSweepTest, SixteenRowsFromTheSmallestToTheLargest) {
  const std::vector<PrefillSweepCase> cases = PrefillSweepCases();
  ASSERT_EQ(cases.size(), 16u);  // 2 batches x 2 chunks x 2 prefixes x 2 groups
  EXPECT_EQ(PrefillSweepConfig(cases.front()), "bf16 B=1 chunk=512 prefix=0 Hkv=8 G=4 D=128 bs=16");
  EXPECT_EQ(PrefillSweepConfig(cases.back()),
            "bf16 B=4 chunk=2048 prefix=4096 Hkv=8 G=8 D=128 bs=16");
}

TEST(PrefillSweepTest, CausalFlops) {
  // 512 queries over no prefix: 512·513/2 = 131,328 (query, key) pairs, 32 query heads,
  // 4·128 FLOPs a pair and head: 2,151,677,952.
  EXPECT_EQ(PrefillSweepFlops({1, 512, 0, 4}), 2151677952.0);
  // 2,048 over 4,096: 2048·4096 + 2048·2049/2 = 10,486,784 pairs, 64 heads, 4 sequences:
  // 10,486,784 · 64 · 512 · 4 = 1,374,523,752,448.
  EXPECT_EQ(PrefillSweepFlops({4, 2048, 4096, 8}), 1374523752448.0);
  // Counted by hand: 3 queries over 5 cached tokens see 6 + 7 + 8 = 21 keys; 8 heads, 2
  // sequences: 21 · 8 · 512 · 2 = 172,032.
  EXPECT_EQ(PrefillSweepFlops({2, 3, 5, 1}), 172032.0);
}

TEST(PrefillSweepTest, BytesAreKvOnceAndQueriesInAndOut) {
  // K+V: 2·512·8·128·2 = 2,097,152; q and out: 2·512·32·128·2 = 8,388,608.
  EXPECT_EQ(PrefillSweepBytes({1, 512, 0, 4}), 10485760.0);
  // K+V: 2·4·6144·8·128·2 = 100,663,296; q and out: 2·4·2048·64·128·2 = 268,435,456.
  EXPECT_EQ(PrefillSweepBytes({4, 2048, 4096, 8}), 369098752.0);
}

TEST(PrefillSweepTest, TableAndCsrNameTheSameBlocks) {
  std::mt19937 rng(7);
  // Lengths 1, 33 and 32 in blocks of 16: 1, 3 and 2 blocks.
  const PrefillBatch b = MakePrefillBatch({{0, 1}, {20, 13}, {16, 16}}, 16, rng);
  EXPECT_EQ(b.seq_lens, (std::vector<int32_t>{1, 33, 32}));
  EXPECT_EQ(b.query_start_loc, (std::vector<int32_t>{0, 1, 14, 30}));
  EXPECT_EQ(b.total_tokens(), 30);
  EXPECT_EQ(b.page_indptr, (std::vector<int32_t>{0, 1, 4, 6}));
  EXPECT_EQ(b.last_page_len, (std::vector<int32_t>{1, 1, 16}));
  EXPECT_EQ(b.num_blocks, 6);
  EXPECT_EQ(b.max_blocks, 3);
  // Every block id once, and each table row holds its CSR slice then zeros.
  std::vector<int32_t> sorted = b.page_indices;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int32_t> ids(6);
  std::iota(ids.begin(), ids.end(), 0);
  EXPECT_EQ(sorted, ids);
  ASSERT_EQ(b.table.size(), 9u);
  for (int32_t s = 0; s < 3; ++s) {
    for (int32_t j = 0; j < 3; ++j) {
      const int32_t k = b.page_indptr[s] + j;
      const int32_t want = k < b.page_indptr[s + 1] ? b.page_indices[k] : 0;
      EXPECT_EQ(b.table[s * 3 + j], want) << "row " << s << " entry " << j;
    }
  }
}

}  // namespace
}  // namespace kvpage::cuda::check
