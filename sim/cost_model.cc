#include "sim/cost_model.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "internal/status_macros.h"
#include "model/kv_sizing.h"

namespace kvpage::sim {
namespace {

// Sum of min(q, w) for q in [a, b]: keys seen by the queries at 1-based positions a..b of a
// sliding layer with window w, or of a sparse layer whose queries attend their top w keys.
// REQUIRES: 1 <= a, a <= b + 1.
double WindowedKeys(int64_t a, int64_t b, int64_t w) {
  auto sum = [](int64_t lo, int64_t hi) {  // lo + ... + hi, 0 when empty
    return hi < lo ? 0.0 : (static_cast<double>(lo) + static_cast<double>(hi)) *
                               static_cast<double>(hi - lo + 1) / 2.0;
  };
  if (b <= w) return sum(a, b);
  if (a >= w) return static_cast<double>(b - a + 1) * static_cast<double>(w);
  return sum(a, w) + static_cast<double>(b - w) * static_cast<double>(w);
}

absl::StatusOr<double> KvBytesPerToken(const AttentionShape& a, DType kv_dtype) {
  KVPAGE_ASSIGN_OR_RETURN(int64_t k, RowBytes(kv_dtype, a.KValuesPerToken()));
  KVPAGE_ASSIGN_OR_RETURN(int64_t v, RowBytes(kv_dtype, a.VValuesPerToken()));
  return static_cast<double>(k + v);
}

// Query–key pairs of n new tokens after ctx cached ones, causal: the query at 1-based
// position q sees q keys, for q = ctx+1 .. ctx+n.
double CausalPairs(int64_t ctx, int64_t n) {
  return static_cast<double>(n) * static_cast<double>(ctx) +
         static_cast<double>(n) * static_cast<double>(n + 1) / 2.0;
}

// How many copies of a layer's per-token cache the tp GPUs hold and read together: 1 when they
// split its KV heads, tp for an MLA latent (every GPU holds it whole), tp / num_kv_heads when
// there are fewer KV heads than GPUs (each replicated), as vLLM 0.33 shards them
// (kvpage/tensor_parallel.h). The cost model divides every byte by tp, so a layer's bytes per
// token count each copy.
double CacheCopies(const LayerSpec& layer, int32_t tp) {
  if (layer.kind == LayerKind::kLinearAttention) return 1.0;
  if (layer.kind == LayerKind::kMla) return tp;
  const int32_t heads = layer.attention.num_kv_heads;
  return heads >= tp ? 1.0 : static_cast<double>(tp) / heads;
}

// Adds one MLA layer (absorbed: scores and outputs both run over the latent, rope part
// included). A layer with a lightning indexer (DeepSeek-V3.2 sparse attention) goes to the
// sparse terms: its queries attend their top index_topk keys (2,048), after the indexer's
// index_n_heads heads of index_head_dim score every earlier key as Σ_h w_h · relu(q_h · k)
// (DeepSeek-V3.2-Exp report, eq. 1 and §2.1.1, github.com/deepseek-ai/DeepSeek-V3.2-Exp
// DeepSeek_V3_2.pdf; vLLM's Indexer in vllm/model_executor/models/deepseek_v2.py). The
// per-head weighting, under 1% of the q · k FLOPs, is left out.
absl::Status AddMlaLayer(const ModelSpec& model, const AttentionShape& a, DType kv_dtype,
                         double copies, RooflineCostModel::Constants& c) {
  KVPAGE_ASSIGN_OR_RETURN(double kv, KvBytesPerToken(a, kv_dtype));
  kv *= copies;
  const double flops = 4.0 * model.num_attention_heads * a.head_dim_k;
  if (!a.HasIndexer() || model.index_topk <= 0) {
    c.full_kv_bytes_per_token += kv;
    c.full_flops_per_pair += flops;
    return absl::OkStatus();
  }
  c.sparse_kv_bytes_per_token += kv;
  c.sparse_flops_per_pair += flops;
  c.index_topk = model.index_topk;
  c.index_flops_per_pair += 2.0 * model.index_n_heads * a.index_head_dim;
  c.index_bytes_per_token += static_cast<double>(internal::IndexKeyTokenBytes(a));
  return absl::OkStatus();
}

absl::StatusOr<double> PeakFlops(const GpuSpec& gpu, DType compute) {
  switch (compute) {
    case DType::kF16:
      return static_cast<double>(gpu.peak_dense_flops_fp16);
    case DType::kFP8:
      if (gpu.peak_dense_flops_fp8 <= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("GPU ", gpu.name, " has no fp8 tensor cores; pick bf16 or f16"));
      }
      return static_cast<double>(gpu.peak_dense_flops_fp8);
    case DType::kBF16:
    case DType::kF32:
      return static_cast<double>(gpu.peak_dense_flops_bf16);
    case DType::kQ8_0:
      break;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("compute dtype ", DTypeName(compute), " is not a matmul type"));
}

}  // namespace

int64_t StepShape::NumNewTokens() const {
  int64_t n = 0;
  for (const ScheduledRequest& r : requests) n += r.num_new_tokens;
  return n;
}

absl::Status RooflineOptions::Validate() const {
  if (tp < 1) return absl::InvalidArgumentError(absl::StrCat("tp must be >= 1, got ", tp));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<RooflineCostModel>> RooflineCostModel::Create(
    const ModelSpec& model, const GpuSpec& gpu, const RooflineOptions& options) {
  KVPAGE_RETURN_IF_ERROR(options.Validate());
  Constants c;
  const DType kv_dtype = options.kv_dtype.value_or(model.dtype);
  KVPAGE_ASSIGN_OR_RETURN(c.peak_flops, PeakFlops(gpu, options.compute_dtype.value_or(model.dtype)));
  c.bandwidth = static_cast<double>(gpu.hbm_bandwidth_bytes_per_s);
  // vLLM scores with DeepGEMM's fp8 MQA-logits kernels (fp8_fp4_mqa_logits and
  // fp8_fp4_paged_mqa_logits in vllm/model_executor/layers/sparse_attn_indexer.py).
  c.index_peak_flops = gpu.peak_dense_flops_fp8 > 0
                           ? static_cast<double>(gpu.peak_dense_flops_fp8)
                           : c.peak_flops;
  c.num_layers = model.num_layers();

  const double vocab_hidden = static_cast<double>(model.vocab_size) * model.hidden_size;
  c.matmul_flops_per_token =
      2.0 * static_cast<double>(model.NumActiveParams() - model.num_embedding_params);
  c.lm_head_flops_per_request = 2.0 * vocab_hidden;
  // An untied input-embedding table is gathered a few rows at a time, never streamed.
  const bool untied = static_cast<double>(model.num_embedding_params) > vocab_hidden;
  const double input_table_bytes =
      untied ? vocab_hidden * static_cast<double>(BytesPerValue(model.dtype)) : 0.0;
  c.routed_weight_bytes = static_cast<double>(model.routed_expert_weight_bytes);
  c.dense_weight_bytes =
      static_cast<double>(model.weight_bytes) - c.routed_weight_bytes - input_table_bytes;
  c.num_experts = model.num_experts;
  c.experts_per_token = model.experts_per_token;

  const double q_heads = model.num_attention_heads;
  for (const LayerSpec& layer : model.layers) {
    const AttentionShape& a = layer.attention;
    const double copies = CacheCopies(layer, options.tp);
    switch (layer.kind) {
      case LayerKind::kChunkedLocal:  // upper bound: as if every token read the whole context
      case LayerKind::kFullAttention: {
        KVPAGE_ASSIGN_OR_RETURN(double kv, KvBytesPerToken(a, kv_dtype));
        c.full_kv_bytes_per_token += kv * copies;
        c.full_flops_per_pair += 2.0 * q_heads * (a.head_dim_k + a.head_dim_v);
        break;
      }
      case LayerKind::kMla:
        KVPAGE_RETURN_IF_ERROR(AddMlaLayer(model, a, kv_dtype, copies, c));
        break;
      case LayerKind::kSlidingWindow: {
        KVPAGE_ASSIGN_OR_RETURN(double kv, KvBytesPerToken(a, kv_dtype));
        c.sliding_kv_bytes_per_token += kv * copies;
        c.sliding_flops_per_pair += 2.0 * q_heads * (a.head_dim_k + a.head_dim_v);
        c.sliding_window = layer.sliding_window;
        break;
      }
      case LayerKind::kLinearAttention:
        // Gated DeltaNet per token: S^T k, the rank-1 state update and the S^T q readout,
        // each 2 · d_k · d_v per value head.
        c.linear_flops_per_token += 6.0 * static_cast<double>(layer.linear.RecurrentValues());
        c.linear_state_bytes += static_cast<double>(layer.linear.NativeBytes());
        break;
    }
  }
  return std::unique_ptr<RooflineCostModel>(new RooflineCostModel(c, gpu.roofline, options.tp));
}

RooflineCostModel::AttentionWork RooflineCostModel::Attention(const ScheduledRequest& r) const {
  const int64_t ctx = r.num_computed_tokens, n = r.num_new_tokens;
  AttentionWork w;
  w.flops = c_.full_flops_per_pair * CausalPairs(ctx, n) +
            c_.linear_flops_per_token * static_cast<double>(n);
  if (c_.sliding_window > 0) {
    w.flops += c_.sliding_flops_per_pair * WindowedKeys(ctx + 1, ctx + n, c_.sliding_window);
  }
  w.bytes = c_.full_kv_bytes_per_token * static_cast<double>(ctx + n) +
            c_.sliding_kv_bytes_per_token *
                static_cast<double>(std::min<int64_t>(ctx, c_.sliding_window) + n) +
            2.0 * c_.linear_state_bytes;
  if (c_.index_topk > 0) {
    // Each query attends its top index_topk keys. The queries of one request may select
    // different keys, so the cached rows read are the selections summed, at most the
    // context; the new tokens' rows are written.
    const double selected = WindowedKeys(ctx + 1, ctx + n, c_.index_topk);
    w.flops += c_.sparse_flops_per_pair * selected;
    w.bytes += c_.sparse_kv_bytes_per_token *
               (std::min(static_cast<double>(ctx), selected) + static_cast<double>(n));
  }
  return w;
}

RooflineCostModel::AttentionWork RooflineCostModel::Indexer(const ScheduledRequest& r) const {
  const int64_t ctx = r.num_computed_tokens, n = r.num_new_tokens;
  AttentionWork w;
  w.flops = c_.index_flops_per_pair * CausalPairs(ctx, n);
  w.bytes = c_.index_bytes_per_token * static_cast<double>(ctx + n);
  return w;
}

StepCost RooflineCostModel::Cost(const StepShape& step) const {
  StepCost cost;
  if (step.requests.empty()) return cost;
  const double tokens = static_cast<double>(step.NumNewTokens());
  const double requests = static_cast<double>(step.requests.size());

  double flops = c_.matmul_flops_per_token * tokens + c_.lm_head_flops_per_request * requests;
  double weights = c_.dense_weight_bytes;
  if (c_.num_experts > 0) {
    // Expected share of experts at least one of `tokens` uniform top-k draws lands on.
    const double miss = 1.0 - static_cast<double>(c_.experts_per_token) / c_.num_experts;
    weights += c_.routed_weight_bytes * (1.0 - std::pow(miss, tokens));
  }
  double kv = 0;
  AttentionWork index;  // not split: every GPU runs the whole indexer
  for (const ScheduledRequest& r : step.requests) {
    const AttentionWork a = Attention(r);
    const AttentionWork i = Indexer(r);
    flops += a.flops;
    kv += a.bytes;
    index.flops += i.flops;
    index.bytes += i.bytes;
  }
  const double tp = tp_;
  cost.flops = flops / tp + index.flops;
  cost.bytes = (weights + kv) / tp + index.bytes;
  cost.compute_s = flops / tp / (c_.peak_flops * f_.mfu) +
                   index.flops / (c_.index_peak_flops * f_.mfu);
  cost.memory_s = cost.bytes / (c_.bandwidth * f_.hbm_efficiency);
  cost.overhead_s = f_.step_overhead_s + f_.layer_overhead_s * c_.num_layers +
                    f_.request_overhead_s * requests;
  cost.total_s = std::max(cost.compute_s, cost.memory_s) + cost.overhead_s;
  return cost;
}

}  // namespace kvpage::sim
