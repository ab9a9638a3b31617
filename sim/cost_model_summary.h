// Which cost model prices a simulation's steps, said in words for a command's output.
//
// `kvpage sim` prices steps with the calibrated model when the GPU's hardware file (or the
// bundled file of the same GPU name) has a measured "calibration", else with the roofline
// (sim/cost_model.h) at the efficiencies of the file's "roofline" object. A roofline run is an
// estimate from the datasheet, not from measurements of that GPU, and the output must say so;
// CostModelSummary carries what to say.
//
// A plain value; thread-compatible.
#ifndef KVPAGE_SIM_COST_MODEL_SUMMARY_H_
#define KVPAGE_SIM_COST_MODEL_SUMMARY_H_

#include <string>

#include "absl/types/optional.h"
#include "kvpage/catalog.h"
#include "sim/hardware_calibration.h"

namespace kvpage::sim {

struct CostModelSummary {
  bool calibrated = false;
  std::string gpu;                 // GpuSpec::name
  std::string calibration_source;  // calibrated: where the calibration was read from
  RooflineFactors roofline;        // roofline: the factors it runs at

  // One line for text output, e.g. "cost model: no measured calibration for L40S: roofline
  // estimate at 32% of peak dense FLOP/s and 80% of memory bandwidth, plus 126 us per step,
  // 32 us per layer and 4 us per request".
  std::string Line() const;
  // A JSON object: {"kind": "calibrated"|"roofline", "calibration": source or null,
  // "mfu", "hbm_efficiency", "step_overhead_us", "layer_overhead_us", "request_overhead_us"
  // (roofline only, else null), "note": Line()}.
  std::string ToJson() const;
};

// The model that CreateDefaultCostModel (or a SimConfig's `calibration`) gives `gpu`:
// calibrated when `calibration` is set or the bundled file of `gpu.name` has one, else the
// roofline at `gpu.roofline`. A malformed bundled calibration counts as none here; creating
// the cost model reports it.
CostModelSummary SummarizeCostModel(const GpuSpec& gpu,
                                    const absl::optional<GpuCalibration>& calibration);

// `result_json` (one JSON object, as SimResultToJson writes it) with "cost_model":
// summary.ToJson() added as its last key. Returns `result_json` unchanged when it is not an
// object.
std::string WithCostModel(const std::string& result_json, const CostModelSummary& summary);

}  // namespace kvpage::sim

#endif  // KVPAGE_SIM_COST_MODEL_SUMMARY_H_
