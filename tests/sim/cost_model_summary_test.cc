// What `kvpage sim` says about its cost model: calibrated for the profiled GPUs, a roofline
// estimate, named as such, for the others.
#include "sim/cost_model_summary.h"

#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "kvpage/catalog.h"
#include "nlohmann/json.hpp"
#include "sim/hardware_calibration.h"

namespace kvpage::sim {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::ordered_json;

GpuSpec MustLoadGpu(const std::string& name) {
  absl::StatusOr<GpuSpec> gpu = LoadGpu(name);
  EXPECT_TRUE(gpu.ok()) << gpu.status();
  return gpu.ok() ? *gpu : GpuSpec{};
}

TEST(CostModelSummaryTest, BundledCalibrationIsCalibrated) {
  const CostModelSummary s = SummarizeCostModel(MustLoadGpu("h100"), absl::nullopt);
  EXPECT_TRUE(s.calibrated);
  EXPECT_EQ(s.calibration_source, "bundled:h100-sxm");
  EXPECT_EQ(s.Line(), "cost model: calibrated for H100-SXM5-80GB (bundled:h100-sxm)");
  const json j = json::parse(s.ToJson());
  EXPECT_EQ(j["kind"], "calibrated");
  EXPECT_EQ(j["calibration"], "bundled:h100-sxm");
  EXPECT_TRUE(j["mfu"].is_null());
}

TEST(CostModelSummaryTest, GivenCalibrationWins) {
  GpuCalibration cal;
  cal.source = "my_l4.json";
  const CostModelSummary s = SummarizeCostModel(MustLoadGpu("l4"), cal);
  EXPECT_TRUE(s.calibrated);
  EXPECT_EQ(s.calibration_source, "my_l4.json");
}

// Every bundled GPU without a calibration runs the roofline and says so, with its factors.
TEST(CostModelSummaryTest, UncalibratedGpusAreRooflineEstimates) {
  for (const char* name : {"b200", "gb200", "h20", "l40s", "l4", "rtx-pro-6000", "mi300x",
                           "mi325x"}) {
    SCOPED_TRACE(name);
    const GpuSpec gpu = MustLoadGpu(name);
    const CostModelSummary s = SummarizeCostModel(gpu, absl::nullopt);
    EXPECT_FALSE(s.calibrated);
    EXPECT_THAT(s.Line(), HasSubstr("no measured calibration for " + gpu.name +
                                    ": roofline estimate at "));
    const json j = json::parse(s.ToJson());
    EXPECT_EQ(j["kind"], "roofline");
    EXPECT_TRUE(j["calibration"].is_null());
    EXPECT_EQ(j["mfu"].get<double>(), gpu.roofline.mfu);
    EXPECT_EQ(j["hbm_efficiency"].get<double>(), 0.8);
    EXPECT_EQ(j["step_overhead_us"].get<double>(), 126);
    EXPECT_EQ(j["layer_overhead_us"].get<double>(), 32);
    EXPECT_EQ(j["request_overhead_us"].get<double>(), 4);
  }
  EXPECT_EQ(SummarizeCostModel(MustLoadGpu("l40s"), absl::nullopt).Line(),
            "cost model: no measured calibration for L40S: roofline estimate at 32% of peak "
            "dense FLOP/s and 80% of memory bandwidth, plus 126 us per step, 32 us per layer "
            "and 4 us per request");
}

TEST(CostModelSummaryTest, WithCostModelAppendsTheObject) {
  const CostModelSummary s = SummarizeCostModel(MustLoadGpu("mi300x"), absl::nullopt);
  const json j = json::parse(WithCostModel(R"({"completed": 3, "x": 1.5})", s));
  ASSERT_EQ(j.size(), 3u);
  EXPECT_EQ(j.begin().key(), "completed");  // existing keys keep their order
  EXPECT_EQ(j["x"], 1.5);
  EXPECT_EQ(j["cost_model"]["kind"], "roofline");
  EXPECT_EQ(j["cost_model"]["mfu"], 0.45);
  // Not an object: returned as given.
  EXPECT_EQ(WithCostModel("[1, 2]", s), "[1, 2]");
  EXPECT_EQ(WithCostModel("not json", s), "not json");
}

}  // namespace
}  // namespace kvpage::sim
