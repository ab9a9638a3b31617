// How long one forward step of a batch takes on a GPU: the simulator's clock advances by it.
//
// A step runs a set of scheduled requests; request r contributes `num_new_tokens` tokens whose
// attention covers its `num_computed_tokens` earlier tokens (prefix-cache hits and earlier
// prefill chunks or decode steps included) plus the new tokens themselves. `CostModel` is the
// interface the event loop calls. The default is `CalibratedCostModel`
// (sim/calibrated_cost_model.h), fitted to measured kernel times; `RooflineCostModel`, built
// only from a model config and a GPU datasheet plus the efficiency factors in the hardware
// file, is the fallback for a GPU without a calibration.
//
// Roofline (docs/simulator.md derives every term):
//   time = max(FLOPs / (peak · mfu), bytes / (bandwidth · hbm_efficiency))
//          + step_overhead + num_layers · layer_overhead + num_requests · request_overhead
//   FLOPs = 2 · (active non-embedding params) · new tokens     dense matmuls
//         + 2 · vocab · hidden · num_requests                  LM head, last token only
//         + attention: per attention layer and query–key pair 2 · q_heads · (d_k + d_v)
//           (MLA, absorbed: 4 · q_heads · latent); sliding layers see at most `window` keys,
//           sparse MLA layers (DeepSeek-V3.2) at most `index_topk`
//         + lightning indexer (sparse MLA layers): 2 · index_n_heads · index_head_dim per
//           query–key pair over the whole causal context, at the fp8 peak where the GPU has one
//         + linear attention: 6 · n_v · d_k · d_v per token and layer
//   bytes = streamed weights (all but an untied input-embedding table; MoE routed experts
//           scaled by the expected fraction a step touches, 1 − (1 − k/E)^tokens)
//         + cached KV read (each request's context, windowed for sliding layers; for sparse
//           layers the keys its queries select, at most the context)
//         + KV written (every new token, every attention layer)
//         + indexer keys of the whole context read and of the new tokens written
//         + linear-attention state read and written once per request and layer
// With tensor parallelism every FLOP and byte term but the indexer's is divided by `tp` (vLLM
// replicates the indexer on every GPU), the cache bytes after counting each copy the GPUs keep
// of a replicated MLA latent or KV head; overheads are not, and no communication term is added.
//
// Thread-safety: StepTime is const and touches no shared state; a model may be shared.
#ifndef KVPAGE_SIM_COST_MODEL_H_
#define KVPAGE_SIM_COST_MODEL_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/optional.h"
#include "kvpage/catalog.h"
#include "kvpage/dtype.h"
#include "kvpage/model_spec.h"

namespace kvpage::sim {

struct ScheduledRequest {
  int64_t num_computed_tokens = 0;  // context already in the KV cache before this step
  int32_t num_new_tokens = 0;       // tokens this step computes for the request (>= 1)
};

// What one step computes. An empty step costs nothing.
struct StepShape {
  std::vector<ScheduledRequest> requests;

  int64_t NumNewTokens() const;
};

class CostModel {
 public:
  virtual ~CostModel() = default;
  // Seconds the step takes on the GPU(s), >= 0.
  virtual double StepTime(const StepShape& step) const = 0;
};

struct RooflineOptions {
  int32_t tp = 1;  // tensor-parallel degree, >= 1
  // KV cache element type; defaults to the model dtype. q8_0 needs rows that are a multiple
  // of 32 values.
  absl::optional<DType> kv_dtype;
  // Matmul datatype choosing the peak: bf16 (default: the model dtype, f32 counted as bf16),
  // f16, or fp8 (needs a GPU with fp8 tensor cores).
  absl::optional<DType> compute_dtype;
  absl::Status Validate() const;
};

// The terms of one step, per GPU.
struct StepCost {
  double flops = 0;
  double bytes = 0;
  double compute_s = 0;   // flops / (peak · mfu)
  double memory_s = 0;    // bytes / (bandwidth · hbm_efficiency)
  double overhead_s = 0;  // fixed step, layer and request terms
  double total_s = 0;     // max(compute_s, memory_s) + overhead_s
};

class RooflineCostModel : public CostModel {
 public:
  // InvalidArgument for bad options, a KV dtype the model's rows cannot use, or an fp8
  // compute dtype on a GPU without fp8.
  static absl::StatusOr<std::unique_ptr<RooflineCostModel>> Create(
      const ModelSpec& model, const GpuSpec& gpu, const RooflineOptions& options = {});

  double StepTime(const StepShape& step) const override { return Cost(step).total_s; }
  StepCost Cost(const StepShape& step) const;

  // Attention work of one request in a step, all tp GPUs together (before dividing by tp):
  // score and output FLOPs (linear-attention updates included) and KV / state bytes read and
  // written, each replicated cache copy counted.
  struct AttentionWork {
    double flops = 0;
    double bytes = 0;
  };
  AttentionWork Attention(const ScheduledRequest& r) const;
  // The lightning indexer's work for one request (DeepSeek-V3.2 sparse attention), a kernel
  // of its own before the attention: every new token scores every earlier token and itself.
  // Zero for a model without an indexer. Every tensor-parallel GPU does all of it (vLLM's
  // Indexer is "replicated", vllm/model_executor/models/deepseek_v2.py).
  AttentionWork Indexer(const ScheduledRequest& r) const;

  // Per-model constants (whole model, before dividing by tp), exposed for tests and docs.
  struct Constants {
    double matmul_flops_per_token = 0;    // 2 · active non-embedding params
    double lm_head_flops_per_request = 0;  // 2 · vocab · hidden
    double dense_weight_bytes = 0;         // streamed weights other than routed experts
    double routed_weight_bytes = 0;        // all routed experts
    int32_t num_experts = 0;
    int32_t experts_per_token = 0;
    // Attention layers, summed over layers of each kind. Cache bytes count every copy the tp
    // GPUs hold (an MLA latent tp times, a KV head replicated on several GPUs once each), so
    // that divided by tp they are what one GPU reads.
    double full_flops_per_pair = 0;        // full-attention and dense MLA layers
    double sliding_flops_per_pair = 0;     // sliding layers (all share one window)
    int32_t sliding_window = 0;
    double full_kv_bytes_per_token = 0;    // full-attention and dense MLA layers
    double sliding_kv_bytes_per_token = 0;
    // Sparse MLA layers (DeepSeek-V3.2): each query attends at most `index_topk` keys, chosen
    // by the lightning indexer, which scores the whole context.
    double sparse_flops_per_pair = 0;
    double sparse_kv_bytes_per_token = 0;
    int32_t index_topk = 0;
    double index_flops_per_pair = 0;       // 2 · index_n_heads · index_head_dim per layer
    double index_bytes_per_token = 0;      // indexer keys, 132 B per layer for V3.2
    double index_peak_flops = 0;  // the fp8 peak (the indexer's q · k run in fp8), else peak_flops
    double linear_flops_per_token = 0;
    double linear_state_bytes = 0;         // per request, all linear layers
    int32_t num_layers = 0;
    double peak_flops = 0;
    double bandwidth = 0;
  };
  const Constants& constants() const { return c_; }

 private:
  RooflineCostModel(const Constants& c, const RooflineFactors& f, int32_t tp)
      : c_(c), f_(f), tp_(tp) {}

  Constants c_;
  RooflineFactors f_;
  int32_t tp_;
};

}  // namespace kvpage::sim

#endif  // KVPAGE_SIM_COST_MODEL_H_
