// How the cost models price DeepSeek-V3.2's sparse attention: the lightning indexer scores the
// whole context, the MLA attention runs over at most index_topk keys per query.
#include <memory>

#include <gtest/gtest.h>

#include "kvpage/catalog.h"
#include "sim/calibrated_cost_model.h"
#include "sim/cost_model.h"
#include "sim/hardware_calibration.h"
#include "testing/toy_cost_model.h"

namespace kvpage::sim {
namespace {

using Work = RooflineCostModel::AttentionWork;

std::unique_ptr<RooflineCostModel> Roofline(const char* model) {
  auto spec = LoadModel(model);
  auto gpu = LoadGpu("h200");
  EXPECT_TRUE(spec.ok() && gpu.ok());
  auto m = RooflineCostModel::Create(*spec, *gpu);
  EXPECT_TRUE(m.ok()) << m.status();
  return std::move(m).value();
}

void ExpectWork(const RooflineCostModel& m, ScheduledRequest r, Work attention, Work indexer) {
  SCOPED_TRACE(r.num_computed_tokens);
  EXPECT_DOUBLE_EQ(m.Attention(r).flops, attention.flops);
  EXPECT_DOUBLE_EQ(m.Attention(r).bytes, attention.bytes);
  EXPECT_DOUBLE_EQ(m.Indexer(r).flops, indexer.flops);
  EXPECT_DOUBLE_EQ(m.Indexer(r).bytes, indexer.bytes);
}

// DeepSeek-V3.2 (sim/data/models/deepseek-v3.2.json, bf16): 61 MLA layers, 128 query heads,
// latent 512 + 64 = 576 values; indexer of 64 heads of 128 values, index_topk 2,048.
//   MLA FLOPs per query–key pair: 61 · 4 · 128 · 576       = 17,989,632
//   latent bytes per token:       61 · 576 · 2             =     70,272
//   indexer FLOPs per pair:       61 · 2 · 64 · 128        =    999,424
//   indexer key bytes per token:  61 · (128 + 128/128 · 4) =      8,052
constexpr double kMlaFlops = 17989632, kLatentBytes = 70272;
constexpr double kIndexFlops = 999424, kIndexBytes = 8052;

TEST(SparseAttentionCostTest, ConstantsByHand) {
  const auto sparse = Roofline("deepseek-v3.2");  // keeps the model its constants belong to
  const auto& c = sparse->constants();
  EXPECT_EQ(c.index_topk, 2048);
  EXPECT_DOUBLE_EQ(c.sparse_flops_per_pair, kMlaFlops);
  EXPECT_DOUBLE_EQ(c.sparse_kv_bytes_per_token, kLatentBytes);
  EXPECT_DOUBLE_EQ(c.index_flops_per_pair, kIndexFlops);
  EXPECT_DOUBLE_EQ(c.index_bytes_per_token, kIndexBytes);
  EXPECT_DOUBLE_EQ(c.index_peak_flops, 1978.9e12);  // H200's fp8 peak; bf16 is 989.4e12
  EXPECT_EQ(c.full_flops_per_pair, 0);
  EXPECT_EQ(c.full_kv_bytes_per_token, 0);

  // DeepSeek-V3: the same MLA without an indexer is priced as dense MLA, as before.
  const auto v3 = Roofline("deepseek-v3");
  const auto& dense = v3->constants();
  EXPECT_DOUBLE_EQ(dense.full_flops_per_pair, kMlaFlops);
  EXPECT_DOUBLE_EQ(dense.full_kv_bytes_per_token, kLatentBytes);
  EXPECT_EQ(dense.index_topk, 0);
  EXPECT_EQ(dense.sparse_flops_per_pair, 0);
  EXPECT_EQ(dense.index_flops_per_pair, 0);
  EXPECT_EQ(dense.index_bytes_per_token, 0);
}

// Below index_topk every query selects all its keys: V3.2's attention is V3's dense MLA.
TEST(SparseAttentionCostTest, BelowTopkTheAttentionIsDense) {
  auto sparse = Roofline("deepseek-v3.2");
  auto dense = Roofline("deepseek-v3");
  for (ScheduledRequest r : {ScheduledRequest{1023, 1}, ScheduledRequest{2047, 1},
                             ScheduledRequest{0, 2048}, ScheduledRequest{100, 7}}) {
    EXPECT_DOUBLE_EQ(sparse->Attention(r).flops, dense->Attention(r).flops);
    EXPECT_DOUBLE_EQ(sparse->Attention(r).bytes, dense->Attention(r).bytes);
    EXPECT_EQ(dense->Indexer(r).flops, 0);
    EXPECT_EQ(dense->Indexer(r).bytes, 0);
  }
}

// Decode (one new token after c cached ones): the query selects min(c + 1, 2,048) keys; the
// indexer scores all c + 1.
//   c = 1,023: attention 17,989,632 · 1,024 = 18,421,383,168 FLOPs,
//              70,272 · (1,023 read + 1 written) = 71,958,528 B;
//              indexer 999,424 · 1,024 = 1,023,410,176 FLOPs, 8,052 · 1,024 = 8,245,248 B
//   c = 8,191: attention 17,989,632 · 2,048 = 36,842,766,336 FLOPs,
//              70,272 · (2,048 + 1) = 143,987,328 B;
//              indexer 999,424 · 8,192 = 8,187,281,408 FLOPs, 8,052 · 8,192 = 65,961,984 B
//   c = 16,383: attention as at 8,191; indexer 16,374,562,816 FLOPs, 131,923,968 B (doubled)
TEST(SparseAttentionCostTest, DecodeAttentionIsFlatPastTopkAndTheIndexerGrows) {
  auto m = Roofline("deepseek-v3.2");
  auto expect = [&](ScheduledRequest r, Work a, Work i) { ExpectWork(*m, r, a, i); };
  expect({1023, 1}, {18421383168.0, 71958528.0}, {1023410176.0, 8245248.0});
  expect({8191, 1}, {36842766336.0, 143987328.0}, {8187281408.0, 65961984.0});
  expect({16383, 1}, {36842766336.0, 143987328.0}, {16374562816.0, 131923968.0});
}

// A 2,048-token prefill chunk after c cached tokens. Query q (1-based) selects min(q, 2,048)
// keys; the indexer scores the causal pairs 2,048 · c + 2,048 · 2,049 / 2.
//   c = 0:      selected = pairs = 2,098,176
//               attention 17,989,632 · 2,098,176 = 37,745,414,111,232 FLOPs,
//               70,272 · (0 read + 2,048 written) = 143,917,056 B
//               indexer 999,424 · 2,098,176 = 2,096,967,450,624 FLOPs, 8,052 · 2,048 B
//   c = 8,192:  selected = 2,048 · 2,048 = 4,194,304 (every query is past 2,048)
//               attention 17,989,632 · 4,194,304 = 75,453,985,456,128 FLOPs,
//               70,272 · (8,192 + 2,048) = 719,585,280 B (the selections may cover it all)
//               pairs 16,777,216 + 2,098,176 = 18,875,392:
//               indexer 18,864,519,774,208 FLOPs, 8,052 · 10,240 = 82,452,480 B
//   c = 16,384: attention FLOPs as at 8,192; bytes 70,272 · 18,432 = 1,295,253,504;
//               pairs 35,652,608: indexer 35,632,072,097,792 FLOPs, 148,414,464 B
TEST(SparseAttentionCostTest, PrefillQueriesEachAttendAtMostTopk) {
  auto m = Roofline("deepseek-v3.2");
  auto expect = [&](ScheduledRequest r, Work a, Work i) { ExpectWork(*m, r, a, i); };
  expect({0, 2048}, {37745414111232.0, 143917056.0}, {2096967450624.0, 8052.0 * 2048});
  expect({8192, 2048}, {75453985456128.0, 719585280.0}, {18864519774208.0, 82452480.0});
  expect({16384, 2048}, {75453985456128.0, 1295253504.0}, {35632072097792.0, 148414464.0});

  // The roofline step adds both kernels' FLOPs and bytes to its single max.
  const StepCost cost = m->Cost(StepShape{{{8192, 2048}}});
  const auto& c = m->constants();
  EXPECT_DOUBLE_EQ(cost.flops, c.matmul_flops_per_token * 2048 + c.lm_head_flops_per_request +
                                   75453985456128.0 + 18864519774208.0);
}

// With tensor parallelism each GPU runs the whole indexer; everything else is split.
TEST(SparseAttentionCostTest, TensorParallelGpusEachRunTheWholeIndexer) {
  auto spec = LoadModel("deepseek-v3.2");
  auto gpu = LoadGpu("h200");
  ASSERT_TRUE(spec.ok() && gpu.ok());
  RooflineOptions tp8;
  tp8.tp = 8;
  auto m = RooflineCostModel::Create(*spec, *gpu, tp8);
  ASSERT_TRUE(m.ok()) << m.status();
  const auto& c = (*m)->constants();
  const ScheduledRequest r{65535, 1};
  const Work attention = (*m)->Attention(r), indexer = (*m)->Indexer(r);
  // 999,424 · 65,536 FLOPs and 8,052 · 65,536 bytes on every GPU.
  EXPECT_DOUBLE_EQ(indexer.flops, 65498251264.0);
  EXPECT_DOUBLE_EQ(indexer.bytes, 527695872.0);
  const StepCost cost = (*m)->Cost(StepShape{{r}});
  const double split = c.matmul_flops_per_token + c.lm_head_flops_per_request + attention.flops;
  EXPECT_DOUBLE_EQ(cost.flops, split / 8 + indexer.flops);
  // The indexer's FLOPs run at the fp8 peak; H200's roofline mfu is 0.45.
  EXPECT_DOUBLE_EQ(cost.compute_s,
                   split / 8 / (989.4e12 * 0.45) + indexer.flops / (1978.9e12 * 0.45));
}

// The toy GPU of cost_model_test (bf16 peak 1e15, fp8 peak 2e15, 1e12 B/s; attention at 0.25
// of peak, reads at 0.5 of the bandwidth): attention FLOPs at 2.5e14 /s, the indexer's (fp8)
// at 5e14 /s, bytes at 5e11 B/s. Each kernel costs max(FLOPs / its rate, bytes / 5e11):
//   decode c = 1,023:  attention max(7.37e-5, 71,958,528 / 5e11)  = 143.917056 us
//                      indexer   max(4.09e-6, 8,245,248 / 5e11)   =  16.490496 us
//   decode c = 8,191:  attention 143,987,328 / 5e11              = 287.974656 us
//                      indexer   65,961,984 / 5e11               = 131.923968 us
//   decode c = 16,383: attention 287.974656 us; indexer 131,923,968 / 5e11 = 263.847936 us
//   prefill 2,048 after 8,192:  attention 75,453,985,456,128 / 2.5e14 = 0.301815941824512 s
//                               indexer 18,864,519,774,208 / 5e14 = 0.037729039548416 s
//   after 16,384: attention 0.301815941824512 s; indexer 35,632,072,097,792 / 5e14
//                 = 0.071264144195584 s
const char* kToyGpu = R"({"name": "Toy", "memory_bytes": 1,
  "hbm_bandwidth_bytes_per_s": 1000000000000,
  "peak_dense_flops": {"bf16": 1000000000000000, "fp16": 1000000000000000,
                       "fp8": 2000000000000000},
  "calibration": {
    "gemm": [{"tp": 1, "launch_us": 5, "hbm_efficiency": 0.5, "tokens": [1, 1024],
              "efficiency": [0.5, 0.5]},
             {"tp": 8, "launch_us": 5, "hbm_efficiency": 0.5, "tokens": [1, 1024],
              "efficiency": [0.5, 0.5]}],
    "small_ops": [],
    "all_reduce": [{"tp": 8, "bytes": [1000000, 100000000], "us": [20, 200]}],
    "attention": {"prefill_efficiency": 0.25}}})";

std::unique_ptr<CalibratedCostModel> MakeToy(int32_t tp) {
  return kvpage::testing::MakeToyCostModel(kToyGpu, "deepseek-v3.2", tp);
}

TEST(SparseAttentionCostTest, CalibratedPricesTheIndexerAsItsOwnKernel) {
  auto m = MakeToy(1);
  auto expect = [&](ScheduledRequest r, double attention_s, double indexer_s) {
    SCOPED_TRACE(r.num_computed_tokens);
    const CalibratedStepCost c = m->Cost(StepShape{{r}});
    EXPECT_NEAR(c.attention_s, attention_s, 1e-15);
    EXPECT_NEAR(c.indexer_s, indexer_s, 1e-15);
    EXPECT_NEAR(c.total_s,
                c.linear_s + c.lm_head_s + c.attention_s + c.indexer_s + c.small_ops_s, 1e-15);
  };
  expect({1023, 1}, 143.917056e-6, 16.490496e-6);
  expect({8191, 1}, 287.974656e-6, 131.923968e-6);
  expect({16383, 1}, 287.974656e-6, 263.847936e-6);
  expect({8192, 2048}, 0.301815941824512, 0.037729039548416);
  expect({16384, 2048}, 0.301815941824512, 0.071264144195584);
}

// At tp 8 each GPU runs an eighth of the attention's FLOPs but reads the whole latent (vLLM
// replicates it), and runs all of the indexer. Decode at 16,383 is bound by its 143,987,328
// latent bytes, so it takes as long as at tp 1 (287.974656 us); the prefill chunk after 16,384
// is FLOP-bound (75,453,985,456,128 / 8 / 2.5e14 against 18,432 rows × 70,272 B / 5e11 =
// 2.59 ms), an eighth of its tp-1 time.
TEST(SparseAttentionCostTest, CalibratedTpSplitsFlopsNotTheLatentOrTheIndexer) {
  auto one = MakeToy(1), eight = MakeToy(8);
  const ScheduledRequest decode{16383, 1}, prefill{16384, 2048};
  EXPECT_NEAR(eight->Cost(StepShape{{decode}}).attention_s, 287.974656e-6, 1e-15);
  EXPECT_NEAR(eight->Cost(StepShape{{prefill}}).attention_s, 0.301815941824512 / 8, 1e-15);
  for (ScheduledRequest r : {decode, prefill}) {
    EXPECT_DOUBLE_EQ(eight->Cost(StepShape{{r}}).indexer_s, one->Cost(StepShape{{r}}).indexer_s);
  }
}

}  // namespace
}  // namespace kvpage::sim
