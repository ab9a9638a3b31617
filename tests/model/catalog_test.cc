// Tests of kvpage/catalog.h: bundled model configs and GPU specs, lookup by name or path.
#include "kvpage/catalog.h"

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"

namespace kvpage {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsSupersetOf;

// Loads a bundled model, failing the test (and returning an empty spec) when it does not load.
ModelSpec MustLoad(const std::string& name) {
  absl::StatusOr<ModelSpec> spec = LoadModel(name);
  EXPECT_TRUE(spec.ok()) << name << ": " << spec.status();
  return spec.ok() ? *std::move(spec) : ModelSpec{};
}

std::vector<int32_t> Range(int32_t first, int32_t end, int32_t step) {
  std::vector<int32_t> out;
  for (int32_t i = first; i < end; i += step) out.push_back(i);
  return out;
}

// ---- Bundled models ---------------------------------------------------------------------

TEST(BundledModelsTest, ListIsSortedAndHoldsTheReferenceModels) {
  const std::vector<std::string> names = BundledModelNames();
  EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
  EXPECT_THAT(names, IsSupersetOf({"qwen3-8b", "mistral-7b-v0.3", "gemma-3-4b-it",
                                   "gpt-oss-20b", "deepseek-v2-lite", "qwen3.5-9b",
                                   "qwen3.5-0.8b"}));
}

TEST(BundledModelsTest, EveryModelLoadsAndItsGroupsPartitionTheLayers) {
  for (const std::string& name : BundledModelNames()) {
    SCOPED_TRACE(name);
    absl::StatusOr<ModelSpec> spec = LoadModel(name);
    ASSERT_TRUE(spec.ok()) << spec.status();
    EXPECT_EQ(spec->name, name);
    EXPECT_EQ(spec->source, "bundled:" + name);
    EXPECT_GT(spec->num_layers(), 0);
    EXPECT_GT(spec->num_params, 0);
    ASSERT_FALSE(spec->groups.empty());

    std::vector<int32_t> times_seen(spec->num_layers(), 0);
    for (const LayerGroup& group : spec->groups) {
      ASSERT_FALSE(group.layers.empty());
      EXPECT_TRUE(std::is_sorted(group.layers.begin(), group.layers.end()));
      for (int32_t layer : group.layers) {
        ASSERT_GE(layer, 0);
        ASSERT_LT(layer, spec->num_layers());
        ++times_seen[layer];
        EXPECT_EQ(spec->layers[layer], group.spec) << "layer " << layer;
      }
      const LayerSpec& s = group.spec;
      if (s.IsAttention()) {
        EXPECT_GT(s.attention.num_kv_heads, 0);
        EXPECT_GT(s.attention.head_dim_k, 0);
        if (s.kind == LayerKind::kMla) {
          EXPECT_EQ(s.attention.head_dim_v, 0);
        } else {
          EXPECT_GT(s.attention.head_dim_v, 0);
        }
        EXPECT_EQ(s.sliding_window > 0, s.kind == LayerKind::kSlidingWindow);
      } else {
        // MiniMax's lightning attention keeps no conv state (conv_kernel 1).
        EXPECT_EQ(s.linear.ConvValues() > 0, s.linear.conv_kernel > 1);
        EXPECT_GT(s.linear.RecurrentValues(), 0);
        EXPECT_GT(s.linear.NativeBytes(), 0);
      }
    }
    for (int32_t layer = 0; layer < spec->num_layers(); ++layer) {
      EXPECT_EQ(times_seen[layer], 1) << "layer " << layer;
    }
    // Groups are ordered by their first layer.
    for (size_t i = 1; i < spec->groups.size(); ++i) {
      EXPECT_LT(spec->groups[i - 1].layers.front(), spec->groups[i].layers.front());
    }
  }
}

TEST(BundledModelsTest, Gemma3_4BIsSlidingPlusEverySixthLayerGlobal) {
  const ModelSpec spec = MustLoad("gemma-3-4b-it");
  ASSERT_EQ(spec.groups.size(), 2u);
  const LayerGroup& sliding = spec.groups[0];
  EXPECT_EQ(sliding.spec.kind, LayerKind::kSlidingWindow);
  EXPECT_EQ(sliding.num_layers(), 29);
  EXPECT_EQ(sliding.spec.sliding_window, 1024);
  EXPECT_EQ(sliding.spec.attention, (AttentionShape{4, 256, 256}));
  const LayerGroup& full = spec.groups[1];
  EXPECT_EQ(full.spec.kind, LayerKind::kFullAttention);
  EXPECT_THAT(full.layers, ElementsAre(5, 11, 17, 23, 29));
  EXPECT_EQ(full.spec.attention, (AttentionShape{4, 256, 256}));
}

TEST(BundledModelsTest, Qwen35_9BIsLinearPlusEveryFourthLayerFull) {
  const ModelSpec spec = MustLoad("qwen3.5-9b");
  EXPECT_EQ(spec.dtype, DType::kBF16);
  ASSERT_EQ(spec.groups.size(), 2u);
  const LayerGroup& linear = spec.groups[0];
  EXPECT_EQ(linear.spec.kind, LayerKind::kLinearAttention);
  EXPECT_EQ(linear.num_layers(), 24);
  EXPECT_EQ(linear.spec.linear.conv_dtype, DType::kBF16);
  EXPECT_EQ(linear.spec.linear.recurrent_dtype, DType::kF32);
  EXPECT_EQ(linear.spec.linear.NativeBytes(), 2'146'304);
  const LayerGroup& full = spec.groups[1];
  EXPECT_EQ(full.spec.kind, LayerKind::kFullAttention);
  EXPECT_EQ(full.layers, Range(3, 32, 4));
  EXPECT_EQ(full.spec.attention, (AttentionShape{4, 256, 256}));
}

TEST(BundledModelsTest, Qwen35_0_8BIsLinearPlusSixFull) {
  const ModelSpec spec = MustLoad("qwen3.5-0.8b");
  ASSERT_EQ(spec.groups.size(), 2u);
  EXPECT_EQ(spec.groups[0].spec.kind, LayerKind::kLinearAttention);
  EXPECT_EQ(spec.groups[0].num_layers(), 18);
  EXPECT_EQ(spec.groups[1].spec.kind, LayerKind::kFullAttention);
  EXPECT_EQ(spec.groups[1].layers, Range(3, 24, 4));
  EXPECT_EQ(spec.groups[1].spec.attention, (AttentionShape{2, 256, 256}));
}

TEST(BundledModelsTest, DeepSeekV2LiteIsAllMla) {
  const ModelSpec spec = MustLoad("deepseek-v2-lite");
  ASSERT_EQ(spec.groups.size(), 1u);
  EXPECT_EQ(spec.groups[0].spec.kind, LayerKind::kMla);
  EXPECT_EQ(spec.groups[0].num_layers(), 27);
  EXPECT_EQ(spec.groups[0].spec.attention, (AttentionShape{1, 576, 0}));
}

TEST(BundledModelsTest, GptOss20BAlternatesSlidingAndFull) {
  const ModelSpec spec = MustLoad("gpt-oss-20b");
  ASSERT_EQ(spec.groups.size(), 2u);
  EXPECT_EQ(spec.groups[0].spec.kind, LayerKind::kSlidingWindow);
  EXPECT_EQ(spec.groups[0].spec.sliding_window, 128);
  EXPECT_EQ(spec.groups[0].layers, Range(0, 24, 2));
  EXPECT_EQ(spec.groups[0].spec.attention, (AttentionShape{8, 64, 64}));
  EXPECT_EQ(spec.groups[1].spec.kind, LayerKind::kFullAttention);
  EXPECT_EQ(spec.groups[1].layers, Range(1, 24, 2));
}

TEST(BundledModelsTest, Mistral7BV03IsAllFullWithDerivedHeadDim) {
  const ModelSpec spec = MustLoad("mistral-7b-v0.3");  // sliding_window: null, no head_dim
  ASSERT_EQ(spec.groups.size(), 1u);
  EXPECT_EQ(spec.groups[0].spec.kind, LayerKind::kFullAttention);
  EXPECT_EQ(spec.groups[0].num_layers(), 32);
  EXPECT_EQ(spec.groups[0].spec.attention, (AttentionShape{8, 128, 128}));
}

TEST(BundledModelsTest, Qwen3_8BIsAllFull) {
  const ModelSpec spec = MustLoad("qwen3-8b");  // use_sliding_window: false
  ASSERT_EQ(spec.groups.size(), 1u);
  EXPECT_EQ(spec.groups[0].spec.kind, LayerKind::kFullAttention);
  EXPECT_EQ(spec.groups[0].num_layers(), 36);
  EXPECT_EQ(spec.groups[0].spec.attention, (AttentionShape{8, 128, 128}));
}

TEST(LoadModelTest, UnknownNameIsNotFoundListingTheBundledNames) {
  absl::StatusOr<ModelSpec> spec = LoadModel("llama-9000");
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(spec.status().message(), HasSubstr("llama-9000"));
  for (const std::string& name : BundledModelNames()) {
    EXPECT_THAT(spec.status().message(), HasSubstr(name));
  }
}

TEST(LoadModelTest, AcceptsAPathToAConfig) {
  const std::string path = std::string(KVPAGE_SOURCE_DIR) + "/sim/data/models/qwen3-8b.json";
  absl::StatusOr<ModelSpec> spec = LoadModel(path);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name, "qwen3-8b");
  EXPECT_EQ(spec->source, path);
  EXPECT_EQ(spec->num_layers(), 36);
  EXPECT_EQ(spec->num_params, MustLoad("qwen3-8b").num_params);
}

TEST(LoadModelTest, MalformedConfigFileIsInvalidArgumentNamingThePath) {
  const std::filesystem::path path =
      std::filesystem::path(testing::TempDir()) / "kvpage_catalog_test_broken.json";
  {
    std::ofstream out(path);
    out << R"({"num_hidden_layers": 4, "hidden_size": "wide"})";
  }
  absl::StatusOr<ModelSpec> spec = LoadModel(path.string());
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(spec.status().message(), HasSubstr(path.string()));
  EXPECT_THAT(spec.status().message(), HasSubstr("hidden_size"));
}

// ---- GPUs -------------------------------------------------------------------------------

// Loads a bundled GPU, failing the test (and returning an empty spec) when it does not load.
GpuSpec MustLoadGpu(const std::string& name) {
  absl::StatusOr<GpuSpec> gpu = LoadGpu(name);
  EXPECT_TRUE(gpu.ok()) << name << ": " << gpu.status();
  return gpu.ok() ? *std::move(gpu) : GpuSpec{};
}

TEST(GpuTest, BundledGpuNames) {
  EXPECT_THAT(BundledGpuNames(),
              ElementsAre("a100-sxm-80gb", "b200-sxm", "gb200", "h100-sxm", "h20", "h200-sxm",
                          "l4", "l40s", "mi300x", "mi325x", "rtx-pro-6000-server"));
  EXPECT_THAT(BundledGpuAliases(), ElementsAre("a100", "b200", "gb200", "h100", "h20", "h200",
                                               "l4", "l40s", "mi300x", "mi325x", "rtx-pro-6000"));
}

// One bundled file's figures, as its README row states them.
struct GpuFigures {
  const char* alias;
  const char* name;
  int64_t memory_bytes;
  int64_t bandwidth;
  int64_t bf16;
  int64_t fp8;
  double mfu;  // roofline factor (no calibration for these GPUs)
};

TEST(GpuTest, NewBundledGpusLoadWithTheirSourcedFigures) {
  const GpuFigures kGpus[] = {
      // 183359 MiB, 7.7 TB/s, 4.5 / 9 PFLOPS sparse halved
      {"b200", "B200-SXM-180GB", 192'265'846'784, 7'700'000'000'000, 2'250'000'000'000'000,
       4'500'000'000'000'000, 0.45},
      // 189471 MiB per GPU, 8 TB/s, 5 / 10 PFLOPS sparse halved
      {"gb200", "GB200", 198'674'743'296, 8'000'000'000'000, 2'500'000'000'000'000,
       5'000'000'000'000'000, 0.45},
      // 97871 MiB, 4.0 TB/s, 148 / 296 TFLOPS dense
      {"h20", "H20-96GB", 102'625'181'696, 4'000'000'000'000, 148'000'000'000'000,
       296'000'000'000'000, 0.45},
      // 46068 MiB, 864 GB/s, 362.05 dense, 1466 sparse halved
      {"l40s", "L40S", 48'305'799'168, 864'000'000'000, 362'050'000'000'000,
       733'000'000'000'000, 0.32},
      // 23034 MiB, 300 GB/s, 242 / 485 sparse halved
      {"l4", "L4", 24'152'899'584, 300'000'000'000, 121'000'000'000'000, 242'500'000'000'000,
       0.32},
      // 97887 MiB, 512-bit x 28 Gbps, 4000 FP4 TOPS sparse -> 500 bf16 / 1000 fp8 dense
      {"rtx-pro-6000", "RTX-PRO-6000-Blackwell-Server", 102'641'958'912, 1'792'000'000'000,
       500'000'000'000'000, 1'000'000'000'000'000, 0.32},
      // rocm-smi total, 5.3 TB/s, 1307.4 / 2614.9 dense
      {"mi300x", "MI300X", 206'141'652'992, 5'300'000'000'000, 1'307'400'000'000'000,
       2'614'900'000'000'000, 0.45},
      // 256 GiB (datasheet; no rocm-smi log), 6 TB/s
      {"mi325x", "MI325X", 274'877'906'944, 6'000'000'000'000, 1'307'400'000'000'000,
       2'614'900'000'000'000, 0.45},
  };
  for (const GpuFigures& want : kGpus) {
    SCOPED_TRACE(want.alias);
    const GpuSpec gpu = MustLoadGpu(want.alias);
    EXPECT_EQ(gpu.name, want.name);
    EXPECT_EQ(gpu.memory_bytes, want.memory_bytes);
    EXPECT_EQ(gpu.hbm_bandwidth_bytes_per_s, want.bandwidth);
    EXPECT_EQ(gpu.peak_dense_flops_bf16, want.bf16);
    EXPECT_EQ(gpu.peak_dense_flops_fp16, want.bf16);
    EXPECT_EQ(gpu.peak_dense_flops_fp8, want.fp8);
    EXPECT_EQ(gpu.roofline.mfu, want.mfu);
    EXPECT_EQ(gpu.roofline.hbm_efficiency, 0.8);
    EXPECT_DOUBLE_EQ(gpu.roofline.step_overhead_s, 126e-6);
    // Every name and alias finds the same file, in any case.
    EXPECT_EQ(MustLoadGpu(gpu.name).memory_bytes, want.memory_bytes);
    for (const std::string& alias : gpu.aliases) {
      EXPECT_EQ(MustLoadGpu(absl::AsciiStrToUpper(alias)).name, want.name) << alias;
    }
  }
}

// No two bundled GPUs share a name or alias: LoadGpu would silently return the first.
TEST(GpuTest, BundledNamesAndAliasesAreUnique) {
  std::set<std::string> seen;
  for (const std::string& file : BundledGpuNames()) {
    const GpuSpec gpu = MustLoadGpu(file);
    std::vector<std::string> keys = gpu.aliases;
    keys.push_back(absl::AsciiStrToLower(gpu.name));
    keys.push_back(file);
    std::set<std::string> own(keys.begin(), keys.end());  // a file may repeat its own name
    for (const std::string& key : own) EXPECT_TRUE(seen.insert(key).second) << key;
  }
}

TEST(GpuTest, H100ByAlias) {
  const GpuSpec gpu = MustLoadGpu("h100");
  EXPECT_EQ(gpu.name, "H100-SXM5-80GB");
  EXPECT_EQ(gpu.memory_bytes, 85'520'809'984);  // 81559 MiB
  EXPECT_EQ(gpu.hbm_bandwidth_bytes_per_s, 3'350'000'000'000);
  EXPECT_EQ(gpu.peak_dense_flops_bf16, 989'400'000'000'000);
  EXPECT_EQ(gpu.peak_dense_flops_fp8, 1'978'900'000'000'000);
  EXPECT_THAT(gpu.aliases, ElementsAre("h100", "h100-sxm"));
}

TEST(GpuTest, H200ByUpperCaseAlias) {
  const GpuSpec gpu = MustLoadGpu("H200");
  EXPECT_EQ(gpu.name, "H200-SXM-141GB");
  EXPECT_EQ(gpu.memory_bytes, 150'754'820'096);  // 143771 MiB
  EXPECT_EQ(gpu.hbm_bandwidth_bytes_per_s, 4'800'000'000'000);
}

TEST(GpuTest, A100ByFileNameAndByFullName) {
  const GpuSpec gpu = MustLoadGpu("a100-sxm-80gb");
  EXPECT_EQ(gpu.name, "A100-SXM4-80GB");
  EXPECT_EQ(gpu.memory_bytes, 85'899'345'920);  // 81920 MiB
  EXPECT_EQ(gpu.hbm_bandwidth_bytes_per_s, 2'039'000'000'000);
  EXPECT_EQ(gpu.peak_dense_flops_fp16, 312'000'000'000'000);
  EXPECT_EQ(gpu.peak_dense_flops_fp8, 0);  // no fp8 tensor cores on Ampere
  EXPECT_EQ(MustLoadGpu("a100-sxm4-80gb").memory_bytes, 85'899'345'920);
}

TEST(GpuTest, UnknownGpuIsNotFound) {
  absl::StatusOr<GpuSpec> gpu = LoadGpu("tpu");
  ASSERT_FALSE(gpu.ok());
  EXPECT_EQ(gpu.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(gpu.status().message(), HasSubstr("'tpu'"));
  EXPECT_THAT(gpu.status().message(), HasSubstr("h100-sxm"));
  EXPECT_THAT(gpu.status().message(), HasSubstr("(or their aliases a100, b200, gb200, h100, h20, "
                                                "h200, l4, l40s, mi300x, mi325x, rtx-pro-6000)"));
}

// A complete hardware document with `memory_bytes` and bandwidth given as JSON literals.
std::string GpuJson(const std::string& memory_field, const std::string& bandwidth) {
  return R"({"name": "Test-GPU", "aliases": ["tg"], )" + memory_field +
         R"("hbm_bandwidth_bytes_per_s": )" + bandwidth +
         R"(, "peak_dense_flops": {"bf16": 1000, "fp16": 1000, "fp8": 0}})";
}

TEST(GpuTest, ParsesAWellFormedDocument) {
  absl::StatusOr<GpuSpec> gpu = ParseGpuSpec(GpuJson(R"("memory_bytes": 1024, )", "2048"), "t");
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  EXPECT_EQ(gpu->name, "Test-GPU");
  EXPECT_THAT(gpu->aliases, ElementsAre("tg"));
  EXPECT_EQ(gpu->memory_bytes, 1024);
  EXPECT_EQ(gpu->hbm_bandwidth_bytes_per_s, 2048);
  EXPECT_EQ(gpu->peak_dense_flops_bf16, 1000);
  EXPECT_EQ(gpu->peak_dense_flops_fp8, 0);
}

// Expects ParseGpuSpec(text, "gpu.json") to be InvalidArgument mentioning `what`.
void ExpectBadGpu(const std::string& text, const std::string& what) {
  absl::StatusOr<GpuSpec> gpu = ParseGpuSpec(text, "gpu.json");
  ASSERT_FALSE(gpu.ok()) << text;
  EXPECT_EQ(gpu.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(gpu.status().message(), HasSubstr("gpu.json"));
  EXPECT_THAT(gpu.status().message(), HasSubstr(what));
}

TEST(GpuTest, MissingMemoryBytesIsInvalidArgument) {
  ExpectBadGpu(GpuJson("", "2048"), "memory_bytes");
}

TEST(GpuTest, NegativeBandwidthIsInvalidArgument) {
  ExpectBadGpu(GpuJson(R"("memory_bytes": 1024, )", "-5"), "hbm_bandwidth_bytes_per_s");
}

TEST(GpuTest, FractionalMemoryIsInvalidArgument) {
  ExpectBadGpu(GpuJson(R"("memory_bytes": 1.5e9, )", "2048"), "memory_bytes");
}

TEST(GpuTest, NotJsonIsInvalidArgument) { ExpectBadGpu("{\"name\": ", "JSON"); }

TEST(GpuTest, LoadsAHardwareFileByPath) {
  const std::filesystem::path path =
      std::filesystem::path(testing::TempDir()) / "kvpage_catalog_test_gpu.json";
  {
    std::ofstream out(path);
    out << GpuJson(R"("memory_bytes": 4096, )", "8192");
  }
  absl::StatusOr<GpuSpec> gpu = LoadGpu(path.string());
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  EXPECT_EQ(gpu->name, "Test-GPU");
  EXPECT_EQ(gpu->memory_bytes, 4096);
}

}  // namespace
}  // namespace kvpage
