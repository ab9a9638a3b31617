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

// Same windowed key count as the roofline (cost_model.cc); duplicated to keep that file's
// helper private. Sum of min(q, w) for q in [a, b].
double WindowedKeys(int64_t a, int64_t b, int64_t w) {
  auto sum = [](int64_t lo, int64_t hi) {
    return hi < lo ? 0.0 : (static_cast<double>(lo) + static_cast<double>(hi)) *
                               static_cast<double>(hi - lo + 1) / 2.0;
  };
  if (b <= w) return sum(a, b);
  if (a >= w) return static_cast<double>(b - a + 1) * static_cast<double>(w);
  return sum(a, w) + static_cast<double>(b - w) * static_cast<double>(w);
}

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
  m->c_ = roofline->constants();
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
  m->dense_params_ = m->c_.matmul_flops_per_token / 2.0 - m->routed_active_params_;
  m->dense_bytes_ = std::max(0.0, m->c_.dense_weight_bytes - m->lm_head_bytes_);
  return m;
}

CalibratedStepCost CalibratedCostModel::Cost(const StepShape& step) const {
  CalibratedStepCost cost;
  if (step.requests.empty()) return cost;
  const double tp = tp_;
  const double tokens = static_cast<double>(step.NumNewTokens());
  const double requests = static_cast<double>(step.requests.size());
  const double layers = c_.num_layers;
  const double bandwidth = c_.bandwidth * gemm_.hbm_efficiency;
  auto gemm = [&](double params, double bytes, double rows) {
    return std::max(bytes / tp / bandwidth,
                    2.0 * rows * params / tp / (c_.peak_flops * gemm_.EfficiencyAt(rows)));
  };

  cost.gemm_efficiency = gemm_.EfficiencyAt(tokens);
  double weight_bytes = dense_bytes_ + lm_head_bytes_;
  cost.linear_s = layers * kGemmsPerLayer * gemm_.launch_s + gemm(dense_params_, dense_bytes_,
                                                                  tokens);
  if (c_.num_experts > 0 && routed_active_params_ > 0) {
    const double k_over_e = static_cast<double>(c_.experts_per_token) / c_.num_experts;
    const double touched = c_.routed_weight_bytes * (1.0 - std::pow(1.0 - k_over_e, tokens));
    weight_bytes += touched;
    // Each expert sees tokens · k / E rows on average.
    cost.linear_s += std::max(touched / tp / bandwidth,
                              2.0 * tokens * routed_active_params_ / tp /
                                  (c_.peak_flops * gemm_.EfficiencyAt(tokens * k_over_e)));
  }
  cost.lm_head_s = gemm_.launch_s + gemm(c_.lm_head_flops_per_request / 2.0, lm_head_bytes_,
                                         requests);

  double attention_flops = 0, kv_bytes = 0;
  for (const ScheduledRequest& r : step.requests) {
    const int64_t ctx = r.num_computed_tokens, n = r.num_new_tokens;
    const double pairs = static_cast<double>(n) * static_cast<double>(ctx) +
                         static_cast<double>(n) * static_cast<double>(n + 1) / 2.0;
    double flops = c_.full_flops_per_pair * pairs +
                   c_.linear_flops_per_token * static_cast<double>(n);
    if (c_.sliding_window > 0) {
      flops += c_.sliding_flops_per_pair * WindowedKeys(ctx + 1, ctx + n, c_.sliding_window);
    }
    const double bytes = c_.full_kv_bytes_per_token * static_cast<double>(ctx + n) +
                         c_.sliding_kv_bytes_per_token *
                             static_cast<double>(std::min<int64_t>(ctx, c_.sliding_window) + n) +
                         2.0 * c_.linear_state_bytes;
    cost.attention_s += std::max(flops / tp / (c_.peak_flops * attention_efficiency_),
                                 bytes / tp / bandwidth);
    attention_flops += flops;
    kv_bytes += bytes;
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
  cost.flops = (c_.matmul_flops_per_token * tokens + c_.lm_head_flops_per_request * requests +
                attention_flops) / tp;
  cost.bytes = (weight_bytes + kv_bytes) / tp;
  cost.mfu = cost.flops / (cost.total_s * c_.peak_flops);
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
