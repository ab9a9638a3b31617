#include "sim/cost_model.h"

#include <cmath>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "kvpage/catalog.h"
#include "sim/calibrated_cost_model.h"
#include "sim/hardware_calibration.h"
#include "testing/toy_cost_model.h"

namespace kvpage::sim {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<RooflineCostModel> Make(const char* model, const char* gpu,
                                        RooflineOptions options = {}) {
  auto spec = LoadModel(model);
  auto hw = LoadGpu(gpu);
  EXPECT_TRUE(spec.ok() && hw.ok());
  auto cm = RooflineCostModel::Create(*spec, *hw, options);
  EXPECT_TRUE(cm.ok()) << cm.status();
  return std::move(cm).value();
}

StepShape Step(std::initializer_list<ScheduledRequest> requests) { return StepShape{requests}; }

// Qwen3-8B (bf16, untied embeddings): hidden 4096, 36 layers, 32 query heads, 8 KV heads,
// head_dim 128, intermediate 12288, vocab 151936.
//   per layer: q 4096·4096 + k,v 2·4096·1024 + o 4096·4096 + q/k norms 2·128
//              + MLP 3·4096·12288 + 2 layer norms 2·4096          = 192,946,432
//   embeddings + LM head: 2 · 151936 · 4096                         = 1,244,659,712
//   total: 36 · 192,946,432 + 1,244,659,712 + final norm 4096      = 8,190,735,360
constexpr double kQwenParams = 8190735360.0;
constexpr double kQwenTable = 151936.0 * 4096;  // 622,329,856 values per table

TEST(ModelSpecFieldsTest, DenseAndMoeCounts) {
  auto qwen = LoadModel("qwen3-8b");
  ASSERT_TRUE(qwen.ok());
  EXPECT_EQ(qwen->num_params, 8190735360);
  EXPECT_EQ(qwen->num_attention_heads, 32);
  EXPECT_EQ(qwen->num_embedding_params, 1244659712);
  EXPECT_EQ(qwen->num_experts, 0);
  EXPECT_EQ(qwen->NumActiveParams(), qwen->num_params);

  auto oss = LoadModel("gpt-oss-20b");
  ASSERT_TRUE(oss.ok());
  EXPECT_EQ(oss->num_experts, 32);
  EXPECT_EQ(oss->experts_per_token, 4);
  // 24 layers · 32 experts · 3 · 2880 · 2880 weight values (gate, up, down).
  EXPECT_EQ(oss->routed_expert_params, int64_t{24} * 32 * 3 * 2880 * 2880);
  // mxfp4: 17 bytes per 32 weights.
  EXPECT_EQ(oss->routed_expert_weight_bytes, oss->routed_expert_params * 17 / 32);
  EXPECT_EQ(oss->NumActiveParams(),
            oss->num_params - oss->routed_expert_params / 32 * 28);
}

// Under tensor parallelism each GPU reads its own copy of a replicated cache: the MLA latent
// whole on every GPU, a KV head on tp / num_kv_heads GPUs when there are fewer heads than GPUs.
TEST(RooflineTest, ReplicatedCachesAreReadByEveryGpuHoldingThem) {
  auto bytes = [](const char* model, int32_t tp) {
    return Make(model, "h100", RooflineOptions{.tp = tp})->constants().full_kv_bytes_per_token;
  };
  // Qwen3-8B: 147,456 B per token; 8 KV heads split over 8 GPUs, each on 2 of 16.
  EXPECT_DOUBLE_EQ(bytes("qwen3-8b", 8), 147456.0);
  EXPECT_DOUBLE_EQ(bytes("qwen3-8b", 16), 2 * 147456.0);  // / 16 = 18,432 B a GPU reads
  // DeepSeek-V2-Lite: 27 layers · 576 latent values · 2 B = 31,104 B, on each of 4 GPUs.
  EXPECT_DOUBLE_EQ(bytes("deepseek-v2-lite", 1), 31104.0);
  EXPECT_DOUBLE_EQ(bytes("deepseek-v2-lite", 4), 4 * 31104.0);
}

TEST(RooflineTest, QwenConstantsByHand) {
  auto cm = Make("qwen3-8b", "h100");
  const auto& c = cm->constants();
  // 2 · (8,190,735,360 − 1,244,659,712) = 2 · 6,946,075,648.
  EXPECT_DOUBLE_EQ(c.matmul_flops_per_token, 13892151296.0);
  EXPECT_DOUBLE_EQ(c.lm_head_flops_per_request, 2 * kQwenTable);
  // bf16 weights minus the untied input table: (8,190,735,360 − 622,329,856) · 2.
  EXPECT_DOUBLE_EQ(c.dense_weight_bytes, (kQwenParams - kQwenTable) * 2);
  EXPECT_DOUBLE_EQ(c.dense_weight_bytes, 15136811008.0);
  // K and V: 36 layers · 2 · 8 heads · 128 · 2 bytes = 147,456 bytes per token.
  EXPECT_DOUBLE_EQ(c.full_kv_bytes_per_token, 147456.0);
  // Per query–key pair and layer: QK^T 2·32·128 + PV 2·32·128 = 16,384; · 36 = 589,824.
  EXPECT_DOUBLE_EQ(c.full_flops_per_pair, 589824.0);
  EXPECT_EQ(c.num_layers, 36);
  EXPECT_DOUBLE_EQ(c.peak_flops, 989.4e12);
  EXPECT_DOUBLE_EQ(c.bandwidth, 3.35e12);
}

// One decode step of one Qwen3-8B request with 1,000 cached tokens on an H100 SXM.
//   FLOPs: matmuls 13,892,151,296 + LM head 1,244,659,712
//          + attention 589,824 · (1 · 1000 + 1) = 590,413,824     = 15,727,224,832
//   bytes: weights 15,136,811,008 + KV read 1000 · 147,456 + KV written 147,456
//                                                                  = 15,284,414,464
//   memory time 15,284,414,464 / (3.35e12 · 0.8) = 5.7031 ms (compute 0.035 ms)
//   overheads 126 + 36 · 32 + 4 µs = 1,282 µs  ->  6.9851 ms
TEST(RooflineTest, QwenDecodeStepOnH100ByHand) {
  auto cm = Make("qwen3-8b", "h100");
  StepCost cost = cm->Cost(Step({{1000, 1}}));
  EXPECT_DOUBLE_EQ(cost.flops, 15727224832.0);
  EXPECT_DOUBLE_EQ(cost.bytes, 15284414464.0);
  EXPECT_DOUBLE_EQ(cost.compute_s, 15727224832.0 / (989.4e12 * 0.45));
  EXPECT_DOUBLE_EQ(cost.memory_s, 15284414464.0 / (3.35e12 * 0.8));
  EXPECT_NEAR(cost.overhead_s, 1282e-6, 1e-15);
  EXPECT_NEAR(cost.total_s, 15284414464.0 / (3.35e12 * 0.8) + 1282e-6, 1e-15);
  EXPECT_NEAR(cost.total_s, 6.9851e-3, 1e-7);
  EXPECT_DOUBLE_EQ(cm->StepTime(Step({{1000, 1}})), cost.total_s);
}

// A 2,048-token prefill chunk after 512 cached tokens: compute-bound.
//   pairs: 2048 · 512 + 2048 · 2049 / 2 = 1,048,576 + 2,098,176 = 3,146,752
//   FLOPs: 13,892,151,296 · 2048 + 1,244,659,712 + 589,824 · 3,146,752
//        = 28,451,125,854,208 + 1,244,659,712 + 1,856,029,851,648 = 30,308,400,365,568
//   bytes: 15,136,811,008 + (512 + 2048) · 147,456 = 15,514,298,368
//   compute 30,308,400,365,568 / (989.4e12 · 0.45) = 68.07 ms > memory 5.79 ms
TEST(RooflineTest, QwenPrefillChunkIsComputeBound) {
  auto cm = Make("qwen3-8b", "h100");
  StepCost cost = cm->Cost(Step({{512, 2048}}));
  EXPECT_DOUBLE_EQ(cost.flops, 30308400365568.0);
  EXPECT_DOUBLE_EQ(cost.bytes, 15514298368.0);
  EXPECT_GT(cost.compute_s, cost.memory_s);
  EXPECT_NEAR(cost.total_s, 30308400365568.0 / (989.4e12 * 0.45) + 1282e-6, 1e-12);
}

TEST(RooflineTest, BatchTensorParallelAndKvDtype) {
  auto cm = Make("qwen3-8b", "h100");
  const StepShape batch = Step({{1000, 1}, {3000, 1}, {0, 16}});
  StepCost one = cm->Cost(batch);
  // Weights once; KV of every request: (1001 + 3001 + 16) · 147,456.
  EXPECT_DOUBLE_EQ(one.bytes, 15136811008.0 + 4018.0 * 147456);
  EXPECT_NEAR(one.overhead_s, (126 + 36 * 32 + 3 * 4) * 1e-6, 1e-15);

  RooflineOptions tp2;
  tp2.tp = 2;
  StepCost two = Make("qwen3-8b", "h100", tp2)->Cost(batch);
  EXPECT_DOUBLE_EQ(two.flops, one.flops / 2);
  EXPECT_DOUBLE_EQ(two.bytes, one.bytes / 2);
  EXPECT_DOUBLE_EQ(two.overhead_s, one.overhead_s);

  RooflineOptions fp8;
  fp8.kv_dtype = DType::kFP8;
  StepCost small = Make("qwen3-8b", "h100", fp8)->Cost(batch);
  EXPECT_DOUBLE_EQ(small.bytes, 15136811008.0 + 4018.0 * 73728);
  EXPECT_DOUBLE_EQ(small.flops, one.flops);

  EXPECT_EQ(cm->Cost(StepShape{}).total_s, 0.0);
}

// gpt-oss-20b: 12 full and 12 sliding (window 128) layers, 64 query heads, 8 KV heads,
// head_dim 64; 32 experts, 4 per token.
TEST(RooflineTest, SlidingWindowAndMoe) {
  auto cm = Make("gpt-oss-20b", "h100");
  const auto& c = cm->constants();
  EXPECT_EQ(c.sliding_window, 128);
  // Per layer per pair 2 · 64 · (64 + 64) = 16,384; 12 layers of each kind.
  EXPECT_DOUBLE_EQ(c.full_flops_per_pair, 12 * 16384.0);
  EXPECT_DOUBLE_EQ(c.sliding_flops_per_pair, 12 * 16384.0);
  // 2 · 8 · 64 · 2 bytes = 2,048 bytes per layer and token.
  EXPECT_DOUBLE_EQ(c.full_kv_bytes_per_token, 12 * 2048.0);
  EXPECT_DOUBLE_EQ(c.sliding_kv_bytes_per_token, 12 * 2048.0);

  // Beyond the window, more context only costs full layers.
  StepCost near = cm->Cost(Step({{4000, 1}}));
  StepCost far = cm->Cost(Step({{5000, 1}}));
  EXPECT_DOUBLE_EQ(far.flops - near.flops, 1000 * c.full_flops_per_pair);
  EXPECT_DOUBLE_EQ(far.bytes - near.bytes, 1000 * c.full_kv_bytes_per_token);
  // A 200-token prefill from scratch: sliding keys 1+2+…+128 + 72 · 128 = 8,256 + 9,216.
  StepCost prefill = cm->Cost(Step({{0, 200}}));
  const double full_pairs = 200.0 * 201 / 2;
  EXPECT_DOUBLE_EQ(prefill.flops, c.matmul_flops_per_token * 200 + c.lm_head_flops_per_request +
                                      c.full_flops_per_pair * full_pairs +
                                      c.sliding_flops_per_pair * (8256 + 9216));

  // One token touches 4 of 32 experts; many tokens touch nearly all.
  StepCost decode = cm->Cost(Step({{0, 1}}));
  const double kv1 = c.full_kv_bytes_per_token + c.sliding_kv_bytes_per_token;
  EXPECT_DOUBLE_EQ(decode.bytes, c.dense_weight_bytes + c.routed_weight_bytes * 4 / 32 + kv1);
  StepCost wide = cm->Cost(Step({{0, 1000}}));
  EXPECT_NEAR(wide.bytes, c.dense_weight_bytes + c.routed_weight_bytes + 1000 * kv1, 1.0);
}

// Qwen3.5-0.8B: 18 Gated DeltaNet layers (16 value heads, 128 × 128 state each) and 6 full
// layers. The state is read and written once per request and step.
TEST(RooflineTest, LinearAttentionState) {
  auto cm = Make("qwen3.5-0.8b", "h100");
  const auto& c = cm->constants();
  EXPECT_DOUBLE_EQ(c.linear_flops_per_token, 18 * 6.0 * 16 * 128 * 128);
  StepCost one = cm->Cost(Step({{100, 1}}));
  StepCost two = cm->Cost(Step({{100, 1}, {100, 1}}));
  EXPECT_DOUBLE_EQ(two.bytes - one.bytes,
                   101 * c.full_kv_bytes_per_token + 2 * c.linear_state_bytes);
  EXPECT_GT(c.linear_state_bytes, 18.0 * 1024 * 1024);  // ≥ 1 MiB fp32 recurrent state/layer
}

TEST(RooflineTest, MlaUsesTheLatent) {
  auto cm = Make("deepseek-v2-lite", "h100");
  const auto& c = cm->constants();
  // 27 layers, latent 512 + 64 = 576 values (bf16), 16 query heads.
  EXPECT_DOUBLE_EQ(c.full_kv_bytes_per_token, 27 * 576 * 2.0);
  EXPECT_DOUBLE_EQ(c.full_flops_per_pair, 27 * 4.0 * 16 * 576);
}

TEST(RooflineTest, Errors) {
  auto spec = LoadModel("qwen3-8b");
  auto a100 = LoadGpu("a100");
  ASSERT_TRUE(spec.ok() && a100.ok());
  RooflineOptions bad_tp;
  bad_tp.tp = 0;
  EXPECT_THAT(RooflineCostModel::Create(*spec, *a100, bad_tp).status().message(),
              HasSubstr("tp must be >= 1"));
  RooflineOptions fp8;
  fp8.compute_dtype = DType::kFP8;
  EXPECT_THAT(RooflineCostModel::Create(*spec, *a100, fp8).status().message(),
              HasSubstr("no fp8"));
}

TEST(GpuSpecTest, RooflineFactorsAreOptional) {
  const std::string base = R"({"name": "X", "memory_bytes": 1, "hbm_bandwidth_bytes_per_s": 2,
      "peak_dense_flops": {"bf16": 3, "fp16": 3, "fp8": 0})";
  auto plain = ParseGpuSpec(base + "}", "x.json");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->roofline.mfu, 1.0);
  EXPECT_EQ(plain->roofline.hbm_efficiency, 1.0);
  EXPECT_EQ(plain->roofline.step_overhead_s, 0.0);

  auto tuned = ParseGpuSpec(base + R"(, "roofline": {"mfu": 0.5, "layer_overhead_us": 20}})",
                            "x.json");
  ASSERT_TRUE(tuned.ok()) << tuned.status();
  EXPECT_EQ(tuned->roofline.mfu, 0.5);
  EXPECT_EQ(tuned->roofline.hbm_efficiency, 1.0);
  EXPECT_DOUBLE_EQ(tuned->roofline.layer_overhead_s, 20e-6);

  auto bad = ParseGpuSpec(base + R"(, "roofline": {"mfu": 1.5}})", "x.json");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("'mfu' must be in"));

  auto h100 = LoadGpu("h100");
  ASSERT_TRUE(h100.ok());
  EXPECT_EQ(h100->roofline.mfu, 0.45);
  EXPECT_EQ(h100->roofline.hbm_efficiency, 0.8);
  EXPECT_DOUBLE_EQ(h100->roofline.step_overhead_s, 126e-6);
  EXPECT_DOUBLE_EQ(h100->roofline.layer_overhead_s, 32e-6);
  EXPECT_DOUBLE_EQ(h100->roofline.request_overhead_s, 4e-6);
  EXPECT_EQ(LoadGpu("a100")->roofline.mfu, 0.38);
}

// ---- Calibrated model -------------------------------------------------------------------

TEST(GemmCurveTest, InterpolatesInLog2TokensAndClamps) {
  GemmCurve c;
  c.tokens = {1, 4, 16};
  c.efficiency = {0.1, 0.3, 0.5};
  EXPECT_DOUBLE_EQ(c.EfficiencyAt(2), 0.2);   // halfway between 1 and 4 in log2
  EXPECT_DOUBLE_EQ(c.EfficiencyAt(8), 0.4);
  EXPECT_DOUBLE_EQ(c.EfficiencyAt(0.5), 0.1);  // clamped below
  EXPECT_DOUBLE_EQ(c.EfficiencyAt(100), 0.5);  // clamped above
}

TEST(AllReduceTableTest, LogLogInsideLinearPastTheEnd) {
  AllReduceTable t;
  t.bytes = {1000, 4000};
  t.seconds = {10e-6, 40e-6};
  EXPECT_DOUBLE_EQ(t.SecondsFor(2000), 20e-6);  // exp(log 10 + 0.5 log 4) us
  EXPECT_DOUBLE_EQ(t.SecondsFor(10), 10e-6);    // the smallest message's time
  EXPECT_DOUBLE_EQ(t.SecondsFor(8000), 80e-6);  // bandwidth of the largest
}

// A GPU with round numbers: peak 1e15 FLOP/s, 1e12 B/s; GEMMs at half of each, 5 us launch;
// attention prefill at a quarter of peak; one per-layer small op (2 us + 1 ns per element)
// and an embedding (3 us per step); all-reduce at tp 2 from 20 us (1 MB) to 200 us (100 MB).
const char* kToyGpu = R"({"name": "Toy", "memory_bytes": 1, "hbm_bandwidth_bytes_per_s": 1000000000000,
  "peak_dense_flops": {"bf16": 1000000000000000, "fp16": 1000000000000000, "fp8": 0},
  "calibration": {
    "gemm": [{"tp": 1, "launch_us": 5, "hbm_efficiency": 0.5, "tokens": [1, 1024], "efficiency": [0.5, 0.5]},
             {"tp": 2, "launch_us": 5, "hbm_efficiency": 0.5, "tokens": [1, 1024], "efficiency": [0.5, 0.5]}],
    "small_ops": [{"op": "norm", "width": "hidden", "per": "layer", "launch_us": 2, "ns_per_kilo_element": 1000},
                  {"op": "emb", "width": "hidden", "per": "step", "launch_us": 3, "ns_per_kilo_element": 0}],
    "all_reduce": [{"tp": 2, "bytes": [1000000, 100000000], "us": [20, 200]}],
    "attention": {"prefill_efficiency": 0.25}}})";

std::unique_ptr<CalibratedCostModel> MakeToy(int32_t tp) {
  return kvpage::testing::MakeToyCostModel(kToyGpu, "qwen3-8b", tp);
}

// Qwen3-8B (see kQwenParams): 6,946,075,648 decoder parameters in 36 layers; per layer the
// GEMMs are QKV 4,096 × 6,144 (32 + 2 · 8 heads of 128), output 4,096 × 4,096, gate+up
// 4,096 × 24,576 and down 12,288 × 4,096: 192,937,984 weights, 385,875,968 bytes (the rest of
// a layer is norms). LM head 622,329,856 values = 1,244,659,712 bytes; KV 147,456 B/token;
// 589,824 FLOPs per query-key pair over all layers.
TEST(CalibratedCostModelTest, QwenDecodeOnToyGpuByHand) {
  auto m = MakeToy(1);
  const CalibratedStepCost c = m->Cost(Step({{1023, 1}}));
  // 36 · 4 · 5 us + 36 · 385,875,968 B / 5e11 B/s (memory-bound).
  EXPECT_NEAR(c.linear_s, 7.2e-4 + 0.027783069696, 1e-12);
  EXPECT_NEAR(c.lm_head_s, 5e-6 + 0.002489319424, 1e-12);
  // 1,024 keys · 147,456 B / 5e11 B/s.
  EXPECT_NEAR(c.attention_s, 0.000301989888, 1e-12);
  EXPECT_EQ(c.indexer_s, 0);  // no sparse attention
  // 36 · (2 us + 4,096 ns) + 3 us.
  EXPECT_NEAR(c.small_ops_s, 0.000222456, 1e-12);
  EXPECT_EQ(c.all_reduce_s, 0);
  EXPECT_NEAR(c.total_s, 0.031521835008, 1e-12);
  EXPECT_DOUBLE_EQ(c.gemm_efficiency, 0.5);
}

TEST(CalibratedCostModelTest, TensorParallelPrefillAddsAllReduce) {
  auto m = MakeToy(2);
  const CalibratedStepCost c = m->Cost(Step({{0, 1024}}));
  // 1,024 tokens · 4,096 · 2 B = 8,388,608 B per all-reduce, 2 per layer.
  const double ar = std::exp(std::log(20e-6) + std::log(8388608 / 1e6) / std::log(100.0) *
                                                   std::log(10.0));
  EXPECT_NEAR(c.all_reduce_s, 72 * ar, 1e-12);
  EXPECT_NEAR(c.all_reduce_s, 0.004170685501065743, 1e-12);
  // 36 · 4 · 5 us + 2 · 1,024 · 36 · 192,937,984 / 2 / 5e14 (compute-bound: 1,024 tokens
  // against 1,000 FLOP per weight byte at the toy's efficiencies).
  EXPECT_NEAR(c.linear_s, 0.014944931684352, 1e-12);
  // 524,800 pairs · 589,824 / 2 / 2.5e14.
  EXPECT_NEAR(c.attention_s, 0.0006190792704, 1e-12);
  EXPECT_NEAR(c.total_s, 0.17205430016781775, 1e-11);
}

TEST(TileQuantizationTest, FactorByHand) {
  TileQuantization q;
  q.sm_count = 132;
  q.tiles = {{64, 128}, {128, 128}};
  q.k_multiple = 512;
  // 816 × 2,560: 13 · 20 = 260 tiles of 64 × 128 in 2 waves (16,384 rows · columns per SM)
  // beat 7 · 20 = 140 tiles of 128 × 128, also 2 waves (32,768); K 2,560 needs no padding.
  // Q = 2 · 64 · 128 · 132 / (816 · 2,560) = 88 / 85.
  EXPECT_DOUBLE_EQ(q.Factor(816, 2560, 2560), 88.0 / 85.0);
  // 100 × 3,000, K 4,000 -> 4,096: 2 · 24 = 48 tiles of 64 × 128, one wave.
  EXPECT_DOUBLE_EQ(q.Factor(100, 3000, 4000), 8192.0 * 132 * 4096 / (100.0 * 3000 * 4000));
  // 256 experts of 64 rows × 4,096 launched together: 256 · 32 = 8,192 tiles of 64 × 128 in
  // 63 waves, Q = 63 · 132 · 64 · 128 / (256 · 64 · 4,096) = 1.01513671875.
  EXPECT_DOUBLE_EQ(q.Factor(64, 4096, 7168, 256), 1.01513671875);
  q.tiles = {{1, 1}};
  q.sm_count = 1;
  q.k_multiple = 1;
  EXPECT_DOUBLE_EQ(q.Factor(7, 5, 3), 1.0);  // unit tiles waste nothing
}

TEST(TileQuantizationTest, SplitKFillsIdleSms) {
  TileQuantization q;
  q.sm_count = 132;
  q.tiles = {{128, 128}};
  q.k_multiple = 256;
  // 16 × 1,280, K 8,192: 10 tiles in one wave, each over all of K:
  // Q = 132 · 128 · 128 · 8,192 / (16 · 1,280 · 8,192) = 105.6.
  EXPECT_DOUBLE_EQ(q.Factor(16, 1280, 8192), 105.6);
  // Up to 8 slices of 1,024: 80 tiles, still one wave, an eighth of the depth.
  q.split_k = 8;
  EXPECT_DOUBLE_EQ(q.Factor(16, 1280, 8192), 13.2);
  // 1,024 × 4,096: 256 tiles already fill 2 waves of 132 (Q = 264 / 256); splitting only adds
  // waves (2 slices: 512 tiles in 4 waves of half the depth, the same work; never less).
  EXPECT_DOUBLE_EQ(q.Factor(1024, 4096, 4096), 264.0 / 256.0);
  // K 600, slices rounded up to 256: one slice is 768 deep, two 512, three or more 256; up to
  // 8 · 10 = 80 tiles stay in one wave, so Q = 132 · 16,384 · 256 / (16 · 1,280 · 600).
  EXPECT_DOUBLE_EQ(q.Factor(16, 1280, 600), 132.0 * 16384 * 256 / (16.0 * 1280 * 600));
}

// Unit tiles on one SM waste nothing: the same times as no tile term, dense and MoE alike;
// 128 × 128 tiles on 100 SMs only add time.
TEST(CalibratedCostModelTest, UnitTilesChangeNothingMoeIncluded) {
  auto linear = [](const std::string& tiles, const char* model, int32_t tokens) {
    std::string json = kToyGpu;
    const std::string key = R"("attention": {)";
    json.replace(json.find(key), key.size(), R"("tiles": )" + tiles + ", " + key);
    auto gpu = ParseGpuSpec(json, "toy");
    auto cal = ParseGpuCalibration(json, "toy");
    auto spec = LoadModel(model);
    EXPECT_TRUE(gpu.ok() && cal.ok() && spec.ok()) << cal.status();
    auto m = CalibratedCostModel::Create(*spec, *gpu, *cal);
    EXPECT_TRUE(m.ok()) << m.status();
    return (*m)->Cost(Step({{0, tokens}})).linear_s;
  };
  const std::string unit = R"({"sm_count": 1, "tiles": [[1, 1]], "k_multiple": 1})";
  const std::string big = R"({"sm_count": 100, "tiles": [[128, 128]], "k_multiple": 1})";
  for (const char* model : {"qwen3-8b", "deepseek-v2-lite", "qwen3.5-35b-a3b"}) {
    for (int32_t tokens : {1, 100, 3000}) {
      const double none = linear("null", model, tokens);
      EXPECT_DOUBLE_EQ(linear(unit, model, tokens), none) << model << " " << tokens;
      EXPECT_GE(linear(big, model, tokens), none) << model << " " << tokens;
    }
    EXPECT_GT(linear(big, model, 3000), linear("null", model, 3000)) << model;
  }
}

TEST(CalibratedCostModelTest, TileQuantizationSlowsPartialWaves) {
  std::string json = kToyGpu;
  const std::string key = R"("attention": {)";
  json.replace(json.find(key), key.size(),
               R"("tiles": {"sm_count": 100, "tiles": [[128, 128]], "k_multiple": 1}, )" + key);
  auto gpu = ParseGpuSpec(json, "toy");
  auto cal = ParseGpuCalibration(json, "toy");
  auto spec = LoadModel("qwen3-8b");
  ASSERT_TRUE(gpu.ok() && cal.ok() && spec.ok()) << cal.status();
  auto m = CalibratedCostModel::Create(*spec, *gpu, *cal);
  ASSERT_TRUE(m.ok()) << m.status();
  // 1,000 tokens = 8 row tiles. QKV: 8 · 48 tiles in 4 waves of 100, Q = 4 · 100 · 128 · 128 /
  // (1,000 · 6,144) = 16/15; output: 8 · 32 in 3 waves, Q = 6/5; gate+up: 8 · 192 in 16 waves,
  // 16/15; down: 6/5. Each is compute-bound (Q · 1,000 tokens > 1,000 FLOP per byte):
  // 36 · Σ (5 us + 2 · 1,000 · K · N · Q / 5e14).
  const double gemms = 4096.0 * 6144 * 16 / 15 + 4096.0 * 4096 * 6 / 5 +
                       4096.0 * 24576 * 16 / 15 + 12288.0 * 4096 * 6 / 5;
  const CalibratedStepCost c = (*m)->Cost(Step({{0, 1000}}));
  EXPECT_NEAR(c.linear_s, 36 * (4 * 5e-6 + 2 * 1000 * gemms / 5e14), 1e-12);
  EXPECT_NEAR(c.linear_s, 0.0316437645312, 1e-12);
}

TEST(CalibratedCostModelTest, RejectsUnprofiledTp) {
  auto gpu = ParseGpuSpec(kToyGpu, "toy");
  auto cal = ParseGpuCalibration(kToyGpu, "toy");
  auto spec = LoadModel("qwen3-8b");
  ASSERT_TRUE(gpu.ok() && cal.ok() && spec.ok());
  RooflineOptions options;
  options.tp = 4;
  auto m = CalibratedCostModel::Create(*spec, *gpu, *cal, options);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(m.status().message(), HasSubstr("tp 4 was not profiled"));
  EXPECT_THAT(m.status().message(), HasSubstr("has tp 1, 2"));
}

TEST(HardwareCalibrationTest, ParseErrorsNameTheField) {
  EXPECT_EQ(ParseGpuCalibration(R"({"name": "X"})", "x.json").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(ParseGpuCalibration("[1]", "x.json").status().code(),
            absl::StatusCode::kInvalidArgument);
  auto with = [](const std::string& gemm) {
    return ParseGpuCalibration(
        R"({"calibration": {"attention": {"prefill_efficiency": 0.5}, "gemm": [)" + gemm + "]}}",
        "x.json");
  };
  EXPECT_TRUE(with(R"({"tp": 1, "launch_us": 1, "hbm_efficiency": 0.8, "tokens": [1], "efficiency": [0.5]})").ok());
  auto bad_eff = with(R"({"tp": 1, "launch_us": 1, "hbm_efficiency": 0.8, "tokens": [1], "efficiency": [1.5]})");
  EXPECT_EQ(bad_eff.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad_eff.status().message(), HasSubstr("'efficiency' values must be in [1e-06, 1], got 1.5"));
  auto unordered = with(R"({"tp": 1, "launch_us": 1, "hbm_efficiency": 0.8, "tokens": [4, 2], "efficiency": [0.5, 0.5]})");
  EXPECT_THAT(unordered.status().message(), HasSubstr("'tokens' must be increasing, got 2 after 4"));
  auto lengths = with(R"({"tp": 1, "launch_us": 1, "hbm_efficiency": 0.8, "tokens": [1, 2], "efficiency": [0.5]})");
  EXPECT_THAT(lengths.status().message(), HasSubstr("one value per token count (2), got 1"));
  auto no_tp = with(R"({"launch_us": 1, "hbm_efficiency": 0.8, "tokens": [1], "efficiency": [0.5]})");
  EXPECT_THAT(no_tp.status().message(), HasSubstr("gemm[0]: calibration field 'tp' is missing"));
  auto tiles = [](const std::string& t) {
    return ParseGpuCalibration(
        R"({"calibration": {"attention": {"prefill_efficiency": 0.5}, "tiles": )" + t +
            R"(, "gemm": [{"tp": 1, "launch_us": 1, "hbm_efficiency": 0.8, "tokens": [1], "efficiency": [0.5]}]}})",
        "x.json");
  };
  EXPECT_TRUE(tiles("null").ok());
  auto good = tiles(R"({"sm_count": 132, "tiles": [[64, 128], [128, 128]], "k_multiple": 512})");
  ASSERT_TRUE(good.ok()) << good.status();
  ASSERT_TRUE(good->tiles.has_value());
  EXPECT_EQ(good->tiles->tiles.size(), 2u);
  auto half = tiles(R"({"sm_count": 132, "tiles": [[128]], "k_multiple": 1})");
  EXPECT_THAT(half.status().message(),
              HasSubstr("'tiles.tiles' must hold [tm, tn] pairs of integers in [1, 65536], got [128]"));
  auto sms = tiles(R"({"sm_count": 1.5, "tiles": [[128, 128]], "k_multiple": 1})");
  EXPECT_THAT(sms.status().message(), HasSubstr("'sm_count' must be an integer, got 1.5"));
  EXPECT_EQ(good->tiles->split_k, 1);  // absent: no split-K
  auto split = tiles(R"({"sm_count": 132, "tiles": [[128, 128]], "k_multiple": 256, "split_k": 8})");
  ASSERT_TRUE(split.ok()) << split.status();
  EXPECT_EQ(split->tiles->split_k, 8);
  auto zero = tiles(R"({"sm_count": 132, "tiles": [[128, 128]], "k_multiple": 1, "split_k": 0})");
  EXPECT_THAT(zero.status().message(), HasSubstr("'split_k'"));
  EXPECT_EQ(LoadGpuCalibration("no-such-gpu").status().code(), absl::StatusCode::kNotFound);
}

// The bundled fits (sim/data/hardware/*.json). These numbers move when the constants are
// refitted: rerun `kvpage cost` with the same arguments and update them.
TEST(CalibratedCostModelTest, BundledA100ExampleBatch) {
  auto spec = LoadModel("llama-3.1-8b");
  auto gpu = LoadGpu("a100");
  auto cal = LoadGpuCalibration("a100");
  ASSERT_TRUE(spec.ok() && gpu.ok() && cal.ok()) << cal.status();
  auto m = CalibratedCostModel::Create(*spec, *gpu, *cal);
  ASSERT_TRUE(m.ok()) << m.status();
  const CalibratedStepCost c = (*m)->Cost(Step({{1024, 512}, {2048, 1}, {2048, 1}}));
  EXPECT_NEAR(c.linear_s, 0.035122398, 1e-10);
  EXPECT_NEAR(c.lm_head_s, 0.000658032495, 1e-12);
  EXPECT_NEAR(c.attention_s, 0.00253758206, 1e-11);
  EXPECT_NEAR(c.small_ops_s, 0.00288367879, 1e-11);
  EXPECT_EQ(c.all_reduce_s, 0);
  EXPECT_NEAR(c.total_s, 0.0412016914, 1e-10);
  EXPECT_NEAR(c.gemm_efficiency, 0.665314474, 1e-9);
}

// The H100 fit has tile quantization (64x128 and 128x128 tiles over 132 SMs, K to a multiple
// of 512). The expected linear times are scripts/fit_cost_model.py's predict_linear summed
// over the same GEMM shapes (Llama-3.1-8B: 4,096 hidden, 32 + 2 · 8 heads of 128, MLP 14,336;
// 70B: 8,192, 64 + 2 · 8, 28,672) times the layers, so the C++ and Python models agree.
TEST(CalibratedCostModelTest, BundledH100TilesMatchTheFitter) {
  auto gpu = LoadGpu("h100");
  auto cal = LoadGpuCalibration("h100");
  ASSERT_TRUE(gpu.ok() && cal.ok()) << cal.status();
  ASSERT_TRUE(cal->tiles.has_value());
  auto small = CalibratedCostModel::Create(*LoadModel("llama-3.1-8b"), *gpu, *cal);
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_NEAR((*small)->Cost(Step({{0, 1000}})).linear_s, 0.021103979719437914, 1e-12);
  RooflineOptions tp4;
  tp4.tp = 4;
  auto large = CalibratedCostModel::Create(*LoadModel("llama-3.1-70b"), *gpu, *cal, tp4);
  ASSERT_TRUE(large.ok()) << large.status();
  EXPECT_NEAR((*large)->Cost(Step({{0, 776}})).linear_s, 0.04980296553541792, 1e-12);
}

// The same curves with split-K up to 8 (a `--split-k 8` fit would write it): predict_linear
// with that tile set gives these, so both sides split K alike.
TEST(CalibratedCostModelTest, SplitKMatchesTheFitter) {
  auto gpu = LoadGpu("h100");
  auto cal = LoadGpuCalibration("h100");
  ASSERT_TRUE(gpu.ok() && cal.ok()) << cal.status();
  ASSERT_TRUE(cal->tiles.has_value());
  GpuCalibration split = *cal;
  split.tiles->split_k = 8;
  auto small = CalibratedCostModel::Create(*LoadModel("llama-3.1-8b"), *gpu, split);
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_NEAR((*small)->Cost(Step({{0, 1000}})).linear_s, 0.02075952836838968, 1e-12);
  RooflineOptions tp4;
  tp4.tp = 4;
  auto large = CalibratedCostModel::Create(*LoadModel("llama-3.1-70b"), *gpu, split, tp4);
  ASSERT_TRUE(large.ok()) << large.status();
  EXPECT_NEAR((*large)->Cost(Step({{0, 64}})).linear_s, 0.013083348949420447, 1e-12);
}

// Issue 21's gate: Llama-3(.1)-8B prefill of 512..8,192 tokens on A100 at 55-75% MFU.
TEST(CalibratedCostModelTest, A100PrefillMfuIsInTheMeasuredRange) {
  auto spec = LoadModel("llama-3.1-8b");
  auto gpu = LoadGpu("a100");
  auto cal = LoadGpuCalibration("a100");
  ASSERT_TRUE(spec.ok() && gpu.ok() && cal.ok());
  auto m = CalibratedCostModel::Create(*spec, *gpu, *cal);
  ASSERT_TRUE(m.ok());
  for (int32_t n : {512, 1024, 2048, 4096, 8192}) {
    const double mfu = (*m)->Cost(Step({{0, n}})).mfu;
    EXPECT_GE(mfu, 0.55) << n;
    EXPECT_LE(mfu, 0.75) << n;
  }
  // Decode stays bandwidth-bound: one token reads every weight once.
  const CalibratedStepCost d = (*m)->Cost(Step({{2047, 1}}));
  EXPECT_LT(d.mfu, 0.01);
}

TEST(CalibratedCostModelTest, H100TensorParallelCostsAllReduce) {
  auto spec = LoadModel("llama-3.1-70b");
  auto gpu = LoadGpu("h100");
  auto cal = LoadGpuCalibration("h100");
  ASSERT_TRUE(spec.ok() && gpu.ok() && cal.ok());
  RooflineOptions tp4;
  tp4.tp = 4;
  auto m = CalibratedCostModel::Create(*spec, *gpu, *cal, tp4);
  ASSERT_TRUE(m.ok()) << m.status();
  const CalibratedStepCost c = (*m)->Cost(Step({{0, 2048}}));
  // 80 layers · 2 · AllReduce(2,048 · 8,192 · 2 B = 32 MiB) on 4 H100s.
  EXPECT_NEAR(c.all_reduce_s, 160 * cal->AllReduceFor(4)->SecondsFor(33554432), 1e-12);
  EXPECT_NEAR(c.all_reduce_s, 0.02672, 1e-9);
}

TEST(CalibratedCostModelTest, DefaultModelIsCalibratedWhenTheGpuHasACalibration) {
  auto spec = LoadModel("qwen3-8b");
  auto h100 = LoadGpu("h100");
  ASSERT_TRUE(spec.ok() && h100.ok());
  auto calibrated = CreateDefaultCostModel(*spec, *h100, {});
  ASSERT_TRUE(calibrated.ok());
  EXPECT_NE(dynamic_cast<const CalibratedCostModel*>(calibrated->get()), nullptr);
  GpuSpec custom = *h100;
  custom.name = "Custom";
  auto roofline = CreateDefaultCostModel(*spec, custom, {});
  ASSERT_TRUE(roofline.ok());
  EXPECT_NE(dynamic_cast<const RooflineCostModel*>(roofline->get()), nullptr);
}

}  // namespace
}  // namespace kvpage::sim
