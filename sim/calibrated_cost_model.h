// The simulator's default step-time model: per-operation costs fitted to measured GPU
// profiles (sim/hardware_calibration.h), with attention from first principles.
//
// One step on each of `tp` GPUs, summed kernel by kernel (kernels of a step run one after
// another, so the terms add; docs/simulator.md derives each one and reports its error):
//   linear     L · Σ_g [launch + max(W_g / (B · hbm_eff), Q_g · 2 · T · N_g · K_g / (P · eff(T)))]
//              + L · Σ_e max(W_e · touched / (B · hbm_eff), Q_e · F_e / (P · eff(r)))  MoE experts
//   lm_head    launch + max(W_head / (B · hbm_eff), Q · 2 · R · vocab · hidden / (P · eff(R)))
//   attention  Σ_requests max(attention FLOPs / (P · attention_eff), KV bytes / (B · hbm_eff))
//   indexer    Σ_requests max(indexer FLOPs / (P8 · attention_eff), key bytes / (B · hbm_eff)),
//              not divided by tp (every GPU runs the whole indexer); P8 the fp8 peak, else P
//   small ops  L · Σ_layer ops (launch + per_element · T · hidden [/ tp]) + embedding
//   all-reduce tp > 1: 2 · L · AllReduce(T · hidden · 2 bytes)
// T new tokens, R requests, L layers; g runs over a decoder layer's four GEMMs (QKV, output,
// gate+up, down) with K_g × N_g weights of W_g bytes per GPU; B, P the datasheet bandwidth
// and peak; eff(T) the measured GEMM efficiency at T tokens for this tp; Q_g >= 1 the
// calibration's tile quantization (TileQuantization; 1 without one). The GEMM shapes come
// from ModelSpec: QKV and output from the attention heads, gate+up and down from the rest of a
// layer's dense parameters as a gated MLP (exact for Llama-style models; for MLA, linear
// attention and MoE layers an approximation that keeps the parameter count). Attention FLOPs
// and KV bytes, and those of the lightning indexer (DeepSeek-V3.2), are RooflineCostModel's.
// MoE experts: e runs over gate+up and down (2/3 and 1/3 of the expert weights W_e and FLOPs
// F_e per layer), touched = 1 − (1 − k/E)^T of the E experts get r = T · k / (E · touched)
// rows each, and Q_e counts their tiles as one grouped launch (expert width from
// routed_expert_params over every layer).
//
// Thread-safety: Cost is const and touches no shared state.
#ifndef KVPAGE_SIM_CALIBRATED_COST_MODEL_H_
#define KVPAGE_SIM_CALIBRATED_COST_MODEL_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/optional.h"
#include "kvpage/catalog.h"
#include "kvpage/model_spec.h"
#include "sim/cost_model.h"
#include "sim/hardware_calibration.h"

namespace kvpage::sim {

// The terms of one step, per GPU, in seconds unless named otherwise.
struct CalibratedStepCost {
  double linear_s = 0;      // decoder-layer projections and MLPs (experts included)
  double lm_head_s = 0;     // logits of the last token of each request
  double attention_s = 0;   // scores and KV reads (first principles)
  double indexer_s = 0;     // lightning indexer of sparse attention; 0 without one
  double small_ops_s = 0;   // norms, rope, activation, residual adds, embedding
  double all_reduce_s = 0;  // tensor-parallel collectives (0 at tp 1)
  double total_s = 0;       // sum of the above
  double gemm_efficiency = 0;  // measured FLOP/s fraction at this step's token count
  double flops = 0;         // matmul and attention FLOPs per GPU
  double bytes = 0;         // weights and KV read or written per GPU
  double mfu = 0;           // flops / (total_s · peak): model FLOPs utilisation of the step
};

class CalibratedCostModel : public CostModel {
 public:
  // InvalidArgument for bad options, a KV dtype the model cannot use, or a tp with no
  // GEMM curve or all-reduce table in `calibration` (the message lists the profiled ones).
  static absl::StatusOr<std::unique_ptr<CalibratedCostModel>> Create(
      const ModelSpec& model, const GpuSpec& gpu, const GpuCalibration& calibration,
      const RooflineOptions& options = {});

  double StepTime(const StepShape& step) const override { return Cost(step).total_s; }
  CalibratedStepCost Cost(const StepShape& step) const;

 private:
  CalibratedCostModel() = default;

  // One GEMM of m rows against a k × n weight (per GPU) of `bytes`.
  double Gemm(double m, double k, double n, double bytes) const;

  struct GemmShape {
    double k = 0;
    double n = 0;
  };

  // Counts FLOPs and bytes (its constants and per-request attention work); its own
  // efficiency factors are unused.
  std::unique_ptr<RooflineCostModel> counts_;
  GemmCurve gemm_;
  absl::optional<TileQuantization> tiles_;
  std::vector<GemmShape> layer_gemms_;  // one decoder layer, per GPU
  std::vector<GemmShape> expert_gemms_;  // one routed expert: gate+up, down; per GPU
  double bytes_per_param_ = 2;          // dense decoder weights
  std::vector<SmallOpCost> small_ops_;
  absl::optional<AllReduceTable> all_reduce_;  // tp > 1 only
  double attention_efficiency_ = 1;
  int32_t tp_ = 1;
  int32_t hidden_size_ = 0;
  int64_t vocab_size_ = 0;
  double dense_params_ = 0;         // decoder linear parameters that every token runs
  double dense_bytes_ = 0;
  double routed_active_params_ = 0;  // expert parameters one token runs
  double lm_head_bytes_ = 0;
};

// The model `kvpage sim` and `kvpage cost` use: calibrated when the bundled hardware file of
// `gpu` carries a calibration, else the roofline (RooflineCostModel).
absl::StatusOr<std::unique_ptr<CostModel>> CreateDefaultCostModel(const ModelSpec& model,
                                                                  const GpuSpec& gpu,
                                                                  const RooflineOptions& options);

}  // namespace kvpage::sim

#endif  // KVPAGE_SIM_CALIBRATED_COST_MODEL_H_
