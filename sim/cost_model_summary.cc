#include "sim/cost_model_summary.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"

namespace kvpage::sim {

std::string CostModelSummary::Line() const {
  if (calibrated) {
    return absl::StrCat("cost model: calibrated for ", gpu, " (", calibration_source, ")");
  }
  const RooflineFactors& r = roofline;
  return absl::StrFormat(
      "cost model: no measured calibration for %s: roofline estimate at %.0f%% of peak dense "
      "FLOP/s and %.0f%% of memory bandwidth, plus %.0f us per step, %.0f us per layer and "
      "%.0f us per request",
      gpu, 100 * r.mfu, 100 * r.hbm_efficiency, 1e6 * r.step_overhead_s, 1e6 * r.layer_overhead_s,
      1e6 * r.request_overhead_s);
}

std::string CostModelSummary::ToJson() const {
  using ojson = nlohmann::ordered_json;
  ojson j;
  j["kind"] = calibrated ? "calibrated" : "roofline";
  j["calibration"] = calibrated ? ojson(calibration_source) : ojson(nullptr);
  for (const char* key : {"mfu", "hbm_efficiency", "step_overhead_us", "layer_overhead_us",
                          "request_overhead_us"}) {
    j[key] = nullptr;
  }
  if (!calibrated) {
    j["mfu"] = roofline.mfu;
    j["hbm_efficiency"] = roofline.hbm_efficiency;
    // Whole microseconds, as the hardware file states them.
    j["step_overhead_us"] = std::round(roofline.step_overhead_s * 1e6);
    j["layer_overhead_us"] = std::round(roofline.layer_overhead_s * 1e6);
    j["request_overhead_us"] = std::round(roofline.request_overhead_s * 1e6);
  }
  j["note"] = Line();
  return j.dump();
}

CostModelSummary SummarizeCostModel(const GpuSpec& gpu,
                                    const absl::optional<GpuCalibration>& calibration) {
  CostModelSummary s;
  s.gpu = gpu.name;
  s.roofline = gpu.roofline;
  if (calibration.has_value()) {
    s.calibrated = true;
    s.calibration_source = calibration->source;
    return s;
  }
  absl::StatusOr<GpuCalibration> bundled = BundledCalibration(gpu);
  if (bundled.ok()) {
    s.calibrated = true;
    s.calibration_source = bundled->source;
  }
  return s;
}

std::string WithCostModel(const std::string& result_json, const CostModelSummary& summary) {
  using ojson = nlohmann::ordered_json;
  ojson j = ojson::parse(result_json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return result_json;
  j["cost_model"] = ojson::parse(summary.ToJson());
  return j.dump(2) + "\n";
}

}  // namespace kvpage::sim
