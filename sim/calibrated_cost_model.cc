#include "sim/calibrated_cost_model.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "internal/status_macros.h"

namespace kvpage::sim {
namespace {

// The profiles time QKV, output, up (gate and up fused) and down projections: four GEMM
// kernels per decoder layer.
constexpr double kGemmsPerLayer = 4;
// Activations cross the all-reduce in 16-bit floats.
constexpr double kActivationBytes = 2;

std::string TpList(const GpuCalibration& cal) {
  return absl::StrJoin(cal.ProfiledTp(), ", ");
}

}  // namespace

absl::StatusOr<std::unique_ptr<CalibratedCostModel>> CalibratedCostModel::Create(
    const ModelSpec& model, const GpuSpec& gpu, const GpuCalibration& calibration,
    const RooflineOptions& options) {
  KVPAGE_ASSIGN_OR_RETURN(std::unique_ptr<RooflineCostModel> roofline,
                          RooflineCostModel::Create(model, gpu, options));
  std::unique_ptr<CalibratedCostModel> m(new CalibratedCostModel());
  const RooflineCostModel::Constants& c = roofline->constants();
  m->counts_ = std::move(roofline);
  m->tp_ = options.tp;
  const GemmCurve* curve = calibration.GemmFor(options.tp);
  const AllReduceTable* ar = calibration.AllReduceFor(options.tp);
  if (curve == nullptr || (options.tp > 1 && ar == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tp ", options.tp, " was not profiled for ", gpu.name, " (", calibration.source,
        " has tp ", TpList(calibration), ")"));
  }
  m->gemm_ = *curve;
  if (ar != nullptr) m->all_reduce_ = *ar;
  m->small_ops_ = calibration.small_ops;
  m->attention_efficiency_ = calibration.attention_prefill_efficiency;
  m->hidden_size_ = model.hidden_size;

  const double vocab_hidden = static_cast<double>(model.vocab_size) * model.hidden_size;
  m->lm_head_bytes_ = vocab_hidden * static_cast<double>(BytesPerValue(model.dtype));
  const double routed_inactive =
      static_cast<double>(model.num_params) - static_cast<double>(model.NumActiveParams());
  m->routed_active_params_ = static_cast<double>(model.routed_expert_params) - routed_inactive;
  m->dense_params_ = c.matmul_flops_per_token / 2.0 - m->routed_active_params_;
  m->dense_bytes_ = std::max(0.0, c.dense_weight_bytes - m->lm_head_bytes_);
  return m;
}

CalibratedStepCost CalibratedCostModel::Cost(const StepShape& step) const {
  CalibratedStepCost cost;
  if (step.requests.empty()) return cost;
  const RooflineCostModel::Constants& c = counts_->constants();
  const double tp = tp_;
  const double tokens = static_cast<double>(step.NumNewTokens());
  const double requests = static_cast<double>(step.requests.size());
  const double layers = c.num_layers;
  const double bandwidth = c.bandwidth * gemm_.hbm_efficiency;
  auto gemm = [&](double params, double bytes, double rows) {
    return std::max(bytes / tp / bandwidth,
                    2.0 * rows * params / tp / (c.peak_flops * gemm_.EfficiencyAt(rows)));
  };

  cost.gemm_efficiency = gemm_.EfficiencyAt(tokens);
  double weight_bytes = dense_bytes_ + lm_head_bytes_;
  cost.linear_s = layers * kGemmsPerLayer * gemm_.launch_s + gemm(dense_params_, dense_bytes_,
                                                                  tokens);
  if (c.num_experts > 0 && routed_active_params_ > 0) {
    const double k_over_e = static_cast<double>(c.experts_per_token) / c.num_experts;
    const double touched = c.routed_weight_bytes * (1.0 - std::pow(1.0 - k_over_e, tokens));
    weight_bytes += touched;
    // Each expert sees tokens · k / E rows on average.
    cost.linear_s += std::max(touched / tp / bandwidth,
                              2.0 * tokens * routed_active_params_ / tp /
                                  (c.peak_flops * gemm_.EfficiencyAt(tokens * k_over_e)));
  }
  cost.lm_head_s = gemm_.launch_s + gemm(c.lm_head_flops_per_request / 2.0, lm_head_bytes_,
                                         requests);

  double attention_flops = 0, kv_bytes = 0;
  for (const ScheduledRequest& r : step.requests) {
    const RooflineCostModel::AttentionWork w = counts_->Attention(r);
    cost.attention_s += std::max(w.flops / tp / (c.peak_flops * attention_efficiency_),
                                 w.bytes / tp / bandwidth);
    attention_flops += w.flops;
    kv_bytes += w.bytes;
  }

  for (const SmallOpCost& op : small_ops_) {
    const double elements = tokens * hidden_size_ / (op.split_by_tp ? tp : 1.0);
    cost.small_ops_s +=
        (op.per_step ? 1.0 : layers) * (op.launch_s + op.seconds_per_element * elements);
  }
  if (all_reduce_.has_value()) {
    cost.all_reduce_s =
        2.0 * layers * all_reduce_->SecondsFor(tokens * hidden_size_ * kActivationBytes);
  }

  cost.total_s = cost.linear_s + cost.lm_head_s + cost.attention_s + cost.small_ops_s +
                 cost.all_reduce_s;
  cost.flops = (c.matmul_flops_per_token * tokens + c.lm_head_flops_per_request * requests +
                attention_flops) / tp;
  cost.bytes = (weight_bytes + kv_bytes) / tp;
  cost.mfu = cost.flops / (cost.total_s * c.peak_flops);
  return cost;
}

absl::StatusOr<std::unique_ptr<CostModel>> CreateDefaultCostModel(const ModelSpec& model,
                                                                  const GpuSpec& gpu,
                                                                  const RooflineOptions& options) {
  absl::StatusOr<GpuCalibration> cal = BundledCalibration(gpu);
  if (cal.ok()) {
    KVPAGE_ASSIGN_OR_RETURN(std::unique_ptr<CalibratedCostModel> m,
                            CalibratedCostModel::Create(model, gpu, *cal, options));
    return std::unique_ptr<CostModel>(std::move(m));
  }
  if (!absl::IsNotFound(cal.status())) return cal.status();
  KVPAGE_ASSIGN_OR_RETURN(std::unique_ptr<RooflineCostModel> m,
                          RooflineCostModel::Create(model, gpu, options));
  return std::unique_ptr<CostModel>(std::move(m));
}

}  // namespace kvpage::sim
