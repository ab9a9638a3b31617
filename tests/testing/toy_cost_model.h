// A CalibratedCostModel on a hand-written GPU file, for cost tests whose expected times are
// worked out by hand from that file's round numbers.
#ifndef KVPAGE_TESTS_TESTING_TOY_COST_MODEL_H_
#define KVPAGE_TESTS_TESTING_TOY_COST_MODEL_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>

#include "kvpage/catalog.h"
#include "sim/calibrated_cost_model.h"
#include "sim/hardware_calibration.h"

namespace kvpage::testing {

// `gpu_json` holds both the GpuSpec and its "calibration"; `model` is a bundled name.
inline std::unique_ptr<sim::CalibratedCostModel> MakeToyCostModel(const char* gpu_json,
                                                                  const std::string& model,
                                                                  int32_t tp) {
  auto gpu = ParseGpuSpec(gpu_json, "toy");
  auto cal = sim::ParseGpuCalibration(gpu_json, "toy");
  auto spec = LoadModel(model);
  EXPECT_TRUE(gpu.ok() && cal.ok() && spec.ok()) << cal.status();
  sim::RooflineOptions options;
  options.tp = tp;
  auto m = sim::CalibratedCostModel::Create(*spec, *gpu, *cal, options);
  EXPECT_TRUE(m.ok()) << m.status();
  return std::move(m).value();
}

}  // namespace kvpage::testing

#endif  // KVPAGE_TESTS_TESTING_TOY_COST_MODEL_H_
