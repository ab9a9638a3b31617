// Fuzzes `kvpage cost --batch`: the input is the batch text. ParseCostBatch either refuses it
// with a message or returns one request per entry, each with a context >= 0 and 1 to 2^30 new
// tokens; both cost models then predict a finite step time >= 0 whose terms are finite too.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "cli/cost_batch.h"
#include "fuzz/fuzz_check.h"
#include "kvpage/catalog.h"
#include "sim/calibrated_cost_model.h"
#include "sim/cost_model.h"
#include "sim/hardware_calibration.h"

namespace kvpage::fuzz {
namespace {

// One model per kind of cost: dense (qwen3-8b), sliding window (gemma-3-4b-it), MLA
// (deepseek-v2-lite), on an H100 with its bundled calibration.
struct Models {
  Models() {
    const GpuSpec gpu = LoadGpu("h100").value();
    const sim::GpuCalibration cal = sim::LoadGpuCalibration("h100").value();
    for (const char* name : {"qwen3-8b", "gemma-3-4b-it", "deepseek-v2-lite"}) {
      const ModelSpec model = LoadModel(name).value();
      roofline.push_back(sim::RooflineCostModel::Create(model, gpu, {}).value());
      calibrated.push_back(sim::CalibratedCostModel::Create(model, gpu, cal, {}).value());
    }
  }
  std::vector<std::unique_ptr<sim::RooflineCostModel>> roofline;
  std::vector<std::unique_ptr<sim::CalibratedCostModel>> calibrated;
};

bool Finite(double v) { return std::isfinite(v) && v >= 0; }

}  // namespace
}  // namespace kvpage::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvpage;
  static const fuzz::Models* models = new fuzz::Models();
  const std::string text(reinterpret_cast<const char*>(data), size);
  const absl::StatusOr<sim::StepShape> step = cli::ParseCostBatch(text);
  if (!step.ok()) {
    fuzz::CheckError(step.status());
    return 0;
  }
  KVPAGE_FUZZ_CHECK(!step->requests.empty());
  for (const sim::ScheduledRequest& r : step->requests) {
    KVPAGE_FUZZ_CHECK(r.num_computed_tokens >= 0);
    KVPAGE_FUZZ_CHECK(r.num_new_tokens >= 1 && r.num_new_tokens <= (1 << 30));
  }
  for (const auto& m : models->roofline) {
    const sim::StepCost c = m->Cost(*step);
    KVPAGE_FUZZ_CHECK(fuzz::Finite(c.total_s) && fuzz::Finite(c.compute_s) &&
                      fuzz::Finite(c.memory_s) && fuzz::Finite(c.overhead_s));
  }
  for (const auto& m : models->calibrated) {
    const sim::CalibratedStepCost c = m->Cost(*step);
    KVPAGE_FUZZ_CHECK(fuzz::Finite(c.total_s) && fuzz::Finite(c.linear_s) &&
                      fuzz::Finite(c.attention_s));
  }
  return 0;
}
