#include "sim/calibrated_cost_model.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "internal/status_macros.h"

namespace kvpage::sim {
namespace {

// Activations cross the all-reduce in 16-bit floats.
constexpr double kActivationBytes = 2;

std::string TpList(const GpuCalibration& cal) {
  return absl::StrJoin(cal.ProfiledTp(), ", ");
}

// The (K, N) of one decoder layer's four GEMMs before the tp split, as the profiles time them:
// QKV projection, output projection, gate and up fused, down. `layer_params`: the dense
// parameters of one layer, norms included.
std::vector<std::pair<double, double>> LayerGemmShapes(const ModelSpec& model,
                                                       double layer_params) {
  const double h = model.hidden_size;
  double qkv_n = 0, o_k = 0;
  for (const LayerSpec& layer : model.layers) {
    if (layer.kind != LayerKind::kFullAttention && layer.kind != LayerKind::kSlidingWindow) {
      continue;
    }
    const AttentionShape& a = layer.attention;
    const double v_dim = a.head_dim_v > 0 ? a.head_dim_v : a.head_dim_k;
    qkv_n = static_cast<double>(model.num_attention_heads) * a.head_dim_k +
            static_cast<double>(a.num_kv_heads) * (a.head_dim_k + v_dim);
    o_k = static_cast<double>(model.num_attention_heads) * v_dim;
    break;
  }
  // Two norms per layer are not GEMM weights; the rest past attention is a gated MLP.
  double mlp = layer_params - 2 * h - h * qkv_n - o_k * h;
  if (mlp < 0) {
    qkv_n = o_k = 0;
    mlp = std::max(0.0, layer_params - 2 * h);
  }
  const double ffn = std::max(1.0, std::round(mlp / (3 * h)));
  std::vector<std::pair<double, double>> out;
  if (qkv_n > 0) out.insert(out.end(), {{h, qkv_n}, {o_k, h}});
  out.insert(out.end(), {{h, 2 * ffn}, {ffn, h}});
  return out;
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
  m->tiles_ = calibration.tiles;
  if (ar != nullptr) m->all_reduce_ = *ar;
  m->small_ops_ = calibration.small_ops;
  m->attention_efficiency_ = calibration.attention_prefill_efficiency;
  m->hidden_size_ = model.hidden_size;
  m->vocab_size_ = model.vocab_size;

  const double vocab_hidden = static_cast<double>(model.vocab_size) * model.hidden_size;
  m->lm_head_bytes_ = vocab_hidden * static_cast<double>(BytesPerValue(model.dtype));
  const double routed_inactive =
      static_cast<double>(model.num_params) - static_cast<double>(model.NumActiveParams());
  m->routed_active_params_ = static_cast<double>(model.routed_expert_params) - routed_inactive;
  m->dense_params_ = c.matmul_flops_per_token / 2.0 - m->routed_active_params_;
  m->dense_bytes_ = std::max(0.0, c.dense_weight_bytes - m->lm_head_bytes_);
  m->bytes_per_param_ = m->dense_params_ > 0 ? m->dense_bytes_ / m->dense_params_ : 2.0;
  if (c.num_layers > 0 && m->dense_params_ > 0) {
    // Split across tp GPUs as the profiles do: QKV and gate+up by columns, output and down
    // by rows (whole numbers, as in scripts/fit_cost_model.py).
    const std::vector<std::pair<double, double>> shapes =
        LayerGemmShapes(model, m->dense_params_ / c.num_layers);
    for (size_t i = 0; i < shapes.size(); ++i) {
      const auto [k, n] = shapes[i];
      // Even entries (QKV, gate+up) read the hidden state: split by columns.
      m->layer_gemms_.push_back(i % 2 == 0 ? GemmShape{k, std::floor(n / options.tp)}
                                           : GemmShape{std::floor(k / options.tp), n});
    }
  }
  if (c.num_experts > 0 && c.num_layers > 0 && model.routed_expert_params > 0) {
    const double width = std::max(
        1.0, std::round(static_cast<double>(model.routed_expert_params) /
                        (3.0 * c.num_experts * c.num_layers * model.hidden_size)));
    const double h = model.hidden_size;
    m->expert_gemms_ = {GemmShape{h, std::max(1.0, std::floor(2 * width / options.tp))},
                        GemmShape{std::max(1.0, std::floor(width / options.tp)), h}};
  }
  return m;
}

double CalibratedCostModel::Gemm(double m, double k, double n, double bytes) const {
  const RooflineCostModel::Constants& c = counts_->constants();
  const double memory = bytes / (c.bandwidth * gemm_.hbm_efficiency);
  if (m <= 0 || n <= 0 || k <= 0) return gemm_.launch_s + memory;
  const double q = tiles_.has_value() ? tiles_->Factor(m, n, k) : 1.0;
  const double compute = 2.0 * m * n * k * q / (c.peak_flops * gemm_.EfficiencyAt(m));
  return gemm_.launch_s + std::max(memory, compute);
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

  cost.gemm_efficiency = gemm_.EfficiencyAt(tokens);
  double weight_bytes = dense_bytes_ + lm_head_bytes_;
  for (const GemmShape& g : layer_gemms_) {
    cost.linear_s += layers * Gemm(tokens, g.k, g.n, g.k * g.n * bytes_per_param_);
  }
  if (c.num_experts > 0 && routed_active_params_ > 0 && tokens > 0) {
    const double k_over_e = static_cast<double>(c.experts_per_token) / c.num_experts;
    const double touched_share = 1.0 - std::pow(1.0 - k_over_e, tokens);
    const double touched = c.routed_weight_bytes * touched_share;
    weight_bytes += touched;
    // The experts that get rows this step, and the rows each gets on average.
    const double experts = c.num_experts * touched_share;
    const double rows = tokens * c.experts_per_token / experts;
    const double eff = gemm_.EfficiencyAt(rows);
    for (size_t i = 0; i < expert_gemms_.size(); ++i) {
      const GemmShape& g = expert_gemms_[i];
      const double share = i == 0 ? 2.0 / 3.0 : 1.0 / 3.0;  // gate+up, down
      const double q = tiles_.has_value() ? tiles_->Factor(rows, g.n, g.k, experts) : 1.0;
      cost.linear_s += std::max(touched * share / tp / bandwidth,
                                q * 2.0 * tokens * routed_active_params_ * share / tp /
                                    (c.peak_flops * eff));
    }
  }
  cost.lm_head_s = Gemm(requests, hidden_size_, static_cast<double>(vocab_size_) / tp,
                        lm_head_bytes_ / tp);

  // Per GPU. The attention and the indexer are kernels of their own, each bound by FLOPs or
  // bytes; the attention is split across the tp GPUs, the indexer runs whole on each.
  double attention_flops = 0, kv_bytes = 0;
  auto kernel = [&](const RooflineCostModel::AttentionWork& w, double split, double peak) {
    attention_flops += w.flops / split;
    kv_bytes += w.bytes / split;
    return std::max(w.flops / split / (peak * attention_efficiency_), w.bytes / split / bandwidth);
  };
  for (const ScheduledRequest& r : step.requests) {
    cost.attention_s += kernel(counts_->Attention(r), tp, c.peak_flops);
    if (c.index_topk > 0) cost.indexer_s += kernel(counts_->Indexer(r), 1.0, c.index_peak_flops);
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

  cost.total_s = cost.linear_s + cost.lm_head_s + cost.attention_s + cost.indexer_s +
                 cost.small_ops_s + cost.all_reduce_s;
  cost.flops =
      (c.matmul_flops_per_token * tokens + c.lm_head_flops_per_request * requests) / tp +
      attention_flops;
  cost.bytes = weight_bytes / tp + kv_bytes;
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
