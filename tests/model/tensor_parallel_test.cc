// What one GPU holds under tensor parallelism: vLLM's head rules, exact bytes per token,
// weights and the whole-model-equivalent KV budget.
#include "kvpage/tensor_parallel.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "absl/strings/str_cat.h"

#include "kvpage/catalog.h"
#include "kvpage/planner.h"
#include "model/kv_sizing.h"

namespace kvpage {
namespace {

// K + V bytes of one token over every attention layer of `model`, in bf16.
int64_t TokenBytes(const ModelSpec& model) {
  int64_t bytes = 0;
  for (const LayerSpec& layer : model.layers) {
    if (!layer.IsAttention()) continue;
    bytes += *internal::AttentionTokenBytes(layer.attention, DType::kBF16);
  }
  return bytes;
}

ModelSpec Load(const char* name) {
  auto model = LoadModel(name);
  EXPECT_TRUE(model.ok()) << model.status();
  return *model;
}

TEST(TensorParallelTest, KvHeadsSplitThenReplicate) {
  EXPECT_EQ(KvHeadsPerGpu(8, 1), 8);
  EXPECT_EQ(KvHeadsPerGpu(8, 2), 4);
  EXPECT_EQ(KvHeadsPerGpu(8, 8), 1);
  EXPECT_EQ(KvHeadsPerGpu(8, 16), 1);  // replicated on 2 GPUs each
  EXPECT_EQ(KvHeadsPerGpu(2, 4), 1);
}

TEST(TensorParallelTest, Llama70bSplitsItsEightKvHeads) {
  const ModelSpec model = Load("llama-3.1-70b");
  // 80 layers x (K + V) x 8 heads x 128 x 2 bytes.
  ASSERT_EQ(TokenBytes(model), 327'680);
  const struct {
    int32_t tp, heads;
    int64_t token_bytes;
    int32_t factor;
  } cases[] = {{1, 8, 327'680, 1},
               {2, 4, 163'840, 2},
               {4, 2, 81'920, 4},
               {8, 1, 40'960, 8},
               {16, 1, 40'960, 8}};  // 16 GPUs, 8 heads: each head on 2 GPUs
  for (const auto& c : cases) {
    SCOPED_TRACE(c.tp);
    auto shard = ShardForTensorParallel(model, c.tp);
    ASSERT_TRUE(shard.ok()) << shard.status();
    EXPECT_EQ(shard->layers[0].attention.num_kv_heads, c.heads);
    EXPECT_EQ(shard->groups[0].spec.attention.num_kv_heads, c.heads);
    EXPECT_EQ(shard->num_attention_heads, 64 / c.tp);
    EXPECT_EQ(TokenBytes(*shard), c.token_bytes);
    EXPECT_EQ(shard->weight_bytes, (model.weight_bytes + c.tp - 1) / c.tp);
    EXPECT_EQ(TensorParallelCacheFactor(model, c.tp), c.factor);
  }
}

TEST(TensorParallelTest, Qwen3At16ReplicatesOneHeadPerGpu) {
  const ModelSpec model = Load("qwen3-8b");
  ASSERT_EQ(TokenBytes(model), 147'456);  // 36 x 2 x 8 x 128 x 2
  auto shard = ShardForTensorParallel(model, 16);
  ASSERT_TRUE(shard.ok()) << shard.status();
  EXPECT_EQ(shard->layers[0].attention.num_kv_heads, 1);
  EXPECT_EQ(TokenBytes(*shard), 18'432);  // 147,456 / 8, not / 16
  EXPECT_EQ(TensorParallelCacheFactor(model, 16), 8);
}

TEST(TensorParallelTest, MlaLatentStaysWholeOnEveryGpu) {
  const ModelSpec model = Load("deepseek-v2-lite");
  auto shard = ShardForTensorParallel(model, 4);
  ASSERT_TRUE(shard.ok()) << shard.status();
  EXPECT_EQ(TokenBytes(*shard), TokenBytes(model));
  // 27 layers x (512 + 64) x 2 bytes.
  EXPECT_EQ(TokenBytes(model), 31'104);
  EXPECT_EQ(TensorParallelCacheFactor(model, 4), 1);
  EXPECT_EQ(shard->weight_bytes, (model.weight_bytes + 3) / 4);
}

TEST(TensorParallelTest, GatedDeltaNetStateSplitsByTp) {
  const ModelSpec model = Load("qwen3.5-9b");  // 4 KV heads; GDN 16 key, 32 value heads
  auto shard = ShardForTensorParallel(model, 8);
  ASSERT_TRUE(shard.ok()) << shard.status();
  const LayerSpec* linear = nullptr;
  const LayerSpec* whole = nullptr;
  for (size_t i = 0; i < model.layers.size(); ++i) {
    if (model.layers[i].kind == LayerKind::kLinearAttention) {
      linear = &shard->layers[i];
      whole = &model.layers[i];
      break;
    }
  }
  ASSERT_NE(linear, nullptr);
  EXPECT_EQ(linear->linear.num_k_heads, 2);
  EXPECT_EQ(linear->linear.num_v_heads, 4);
  EXPECT_EQ(linear->linear.ConvValues() * 8, whole->linear.ConvValues());
  EXPECT_EQ(linear->linear.RecurrentValues() * 8, whole->linear.RecurrentValues());
  // Attention: 4 heads over 8 GPUs -> 1 each (shrinks by 4); the state by 8: the least is 4.
  EXPECT_EQ(TensorParallelCacheFactor(model, 8), 4);
  EXPECT_EQ(TensorParallelCacheFactor(model, 4), 4);
}

TEST(TensorParallelTest, RejectsTpThatDoesNotSplitTheHeads) {
  const ModelSpec qwen = Load("qwen3-8b");  // 32 query heads, 8 KV heads
  for (int32_t tp : {0, -2, 1025}) {
    const absl::Status s = CheckTensorParallel(qwen, tp);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << tp;
    EXPECT_NE(s.message().find(absl::StrCat("got ", tp)), absl::string_view::npos) << s;
  }
  absl::Status s = CheckTensorParallel(qwen, 3);
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_EQ(s.message(), "tp 3 does not divide qwen3-8b's attention heads (32)");
  s = CheckTensorParallel(qwen, 64);
  EXPECT_EQ(s.message(), "tp 64 does not divide qwen3-8b's attention heads (32)");
  // 24 query heads (tp 6 divides them), 16 GDN key heads (it does not).
  s = CheckTensorParallel(Load("qwen3.5-27b"), 6);
  EXPECT_EQ(s.message(), "tp 6 does not divide qwen3.5-27b's linear-attention key heads (16)");
  // 24 query heads and 8 KV heads at tp 12: 12 splits the queries, but neither of 8 and 12
  // divides the other.
  ModelSpec odd = qwen;
  odd.name = "odd";
  odd.num_attention_heads = 24;
  s = CheckTensorParallel(odd, 12);
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_NE(s.message().find("tp 12 and odd's 8 KV heads do not divide one another"),
            absl::string_view::npos) << s;
  EXPECT_TRUE(CheckTensorParallel(odd, 4).ok());
  EXPECT_TRUE(ShardForTensorParallel(qwen, 3).status().message().find("tp 3") !=
              absl::string_view::npos);
}

TEST(TensorParallelTest, BudgetCountsEachGpuInWholeModelBytes) {
  const ModelSpec model = Load("llama-3.1-70b");
  const int64_t h100 = 85'520'809'984;
  const int64_t usable = static_cast<int64_t>(h100 * 0.9);  // 76,968,728,985
  // tp 1: the weights (141 GB) do not fit.
  EXPECT_TRUE(absl::IsInvalidArgument(TensorParallelKvBudget(model, 1, h100, 0.9).status()));
  for (int32_t tp : {2, 4, 8, 16}) {
    SCOPED_TRACE(tp);
    const int64_t per_gpu = usable - (model.weight_bytes + tp - 1) / tp;
    auto budget = TensorParallelKvBudget(model, tp, h100, 0.9);
    ASSERT_TRUE(budget.ok()) << budget.status();
    EXPECT_EQ(*budget, per_gpu * std::min(tp, 8));
  }
  // tp 1 is KvBudgetFromGpu itself.
  const ModelSpec qwen = Load("qwen3-8b");
  EXPECT_EQ(*TensorParallelKvBudget(qwen, 1, h100, 0.9), *KvBudgetFromGpu(qwen, h100, 0.9));
}

}  // namespace
}  // namespace kvpage
