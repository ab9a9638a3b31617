// Capacity planning: how many bytes one request of context length L reserves for a model,
// under kvpage's allocator and under the runtimes people use today, and how many such
// requests fit in a KV budget.
//
// Three reservation policies (docs/capacity_planning.md derives each with a worked example):
//   * kKvpage   — a dry run of kvpage's block manager (KvCacheManager): per-layer-group pools
//                 with no page padding and no padding layers; a sliding-window request holds
//                 only the blocks its window reaches, while the in-flight chunk allowance is
//                 kept once per pool (`PlanRow::shared_bytes`); recurrent state unpadded in its
//                 native dtypes.
//   * kVllm     — what vLLM (PlanOptions::vllm_version) sets aside for one max-length
//                 request, as its capacity log counts it (hybrid allocator:
//                 equal-size layer groups with padding layers, one block id = group_size pages,
//                 page unification, Mamba page padding, per-request SWA in-flight allowance).
//   * kLlamaCpp — what `llama-server -c L --parallel N` allocates (cells padded to 256,
//                 per-sequence streams, SWA cells = window + ubatch, f32 recurrent state).
//
// With tensor parallelism (PlanOptions::tp > 1) every policy plans what one of the tp GPUs
// holds: the model as ShardForTensorParallel splits it (kvpage/tensor_parallel.h), so bytes,
// budgets and concurrencies are per GPU.
//
// All functions are pure: thread-safe, no I/O, no logging.
#ifndef KVPAGE_PLANNER_H_
#define KVPAGE_PLANNER_H_

#include <cstdint>
#include <optional>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kvpage/dtype.h"
#include "kvpage/model_spec.h"
#include "kvpage/vllm_runtime_memory.h"
#include "kvpage/vllm_version.h"

namespace kvpage {

enum class Policy : uint8_t { kKvpage, kVllm, kLlamaCpp };

absl::string_view PolicyName(Policy policy);  // "kvpage", "vllm", "llamacpp"
absl::StatusOr<Policy> ParsePolicy(absl::string_view text);

// (CheckVllmBlockSize, for --block-size under --policy vllm: kvpage/vllm_version.h.)

// Flags of all three policies; each policy reads only the ones that apply to it. Names and
// defaults follow vLLM's engine arguments and llama-server's options.
struct PlanOptions {
  Policy policy = Policy::kKvpage;
  // KV cache dtype of attention layers. Unset: the model dtype (kvpage, vllm) or f16
  // (llamacpp, whose -ctk/-ctv default). Recurrent state keeps its own dtypes.
  std::optional<DType> kv_cache_dtype;

  // kvpage and vllm.
  int32_t block_size = 16;
  int32_t max_num_batched_tokens = 8192;  // vLLM's LLM-class default on an A100 80GB
  bool enable_prefix_caching = true;
  // vllm only: async scheduling keeps two batches in flight (vLLM >= 0.26 default).
  bool async_scheduling = true;
  // vllm only: the release to follow. 0.29 and 0.33 reserve the same for one max-length
  // request on the paths modelled (docs/capacity_planning.md §3.2).
  VllmVersion vllm_version = kCurrentVllmVersion;
  // All policies: tensor-parallel degree; the plan is of one GPU's share of the model.
  int32_t tp = 1;
  // vllm only: VLLM_ALLOW_LONG_MAX_MODEL_LEN=1, which lets a length above the model's derived
  // limit through; PlanRow::refusal then checks memory only.
  bool allow_long_max_model_len = false;
  // vllm only: the GPU one GPU's budget was derived from (KvBudgetFromGpu). When set, a
  // refusal names the --gpu-memory-utilization and --tp that would let vLLM start; unset with
  // an explicit budget.
  std::optional<int64_t> gpu_memory_bytes;
  double gpu_memory_utilization = 0.9;
  // vllm only: --max-num-seqs (vLLM 0.33's `vllm serve` default on an H100 or H200) and
  // --enforce-eager (no CUDA graphs), which set its runtime memory (kvpage/vllm_runtime_memory.h).
  int32_t max_num_seqs = 1024;
  bool enforce_eager = false;

  // llamacpp only.
  int32_t ubatch = 512;   // --ubatch-size
  int32_t batch = 2048;   // --batch-size
  int32_t parallel = 1;   // --parallel
  bool kv_unified = false;
  bool swa_full = false;

  // InvalidArgument naming the offending field (non-positive or absurdly large sizes, a
  // block_size vLLM refuses under the vllm policy). An ubatch above batch is legal: llama.cpp
  // clamps it, and so does the llamacpp policy.
  absl::Status Validate() const;
  // The dtype actually used for attention KV under `policy` for a model stored in `model`.
  DType ResolvedKvDtype(DType model) const;
};

// One layer group as the policy lays it out.
struct GroupReservation {
  LayerKind kind = LayerKind::kFullAttention;
  int32_t num_layers = 0;      // real layers in the group
  int32_t padding_layers = 0;  // vllm: layers added to equalise group sizes
  int32_t block_size = 0;      // tokens per block; 1 for llamacpp cells; 0 for recurrent state
  int64_t blocks = 0;          // blocks (llamacpp: cells; recurrent: state slots) reserved
  int64_t reserved_bytes = 0;  // bytes one request reserves in this group
};

struct PlanRow {
  int64_t context = 0;
  int64_t reserved_bytes = 0;  // everything one request of this context reserves
  int64_t kv_bytes = 0;        // reserved_bytes − state_bytes
  int64_t state_bytes = 0;     // the length-independent part: linear-attention state
  // kvpage: bytes the pools keep once for all requests, not per request: what the
  // sliding-window pools held beyond the window at the peak of the dry run's prefill (a step's
  // tokens in flight). Counted in max_concurrency, not in reserved_bytes. 0 for other policies.
  int64_t shared_bytes = 0;
  // kvpage: bytes of one prefix-cache state snapshot (a "double block"), cached on top of the
  // live state when prefix caching is on; not part of reserved_bytes. 0 otherwise.
  int64_t snapshot_bytes = 0;
  double bytes_per_token = 0;                // reserved_bytes / context
  std::optional<int64_t> max_concurrency;    // requests of `context` that fit; unset w/o budget
  std::vector<GroupReservation> groups;
  // vllm policy: why vLLM (0.33) would refuse to start with --max-model-len = context (empty
  // when it would start), and the settings each of which would let it ("--max-model-len
  // 14560", "--kv-cache-dtype fp8", "--gpu-memory-utilization 0.95", "--tp 2", ...). Checked
  // as vLLM checks at start-up: the length against the model's derived limit
  // (VllmDerivedMaxModelLen) unless allow_long_max_model_len, then, with a budget, one request
  // of that length against the budget less vLLM's null block; the longest length that fits
  // is vLLM's own estimate. max_concurrency stays the capacity-log figure either way.
  std::string refusal;
  std::vector<std::string> fixes;
};

// The longest --max-model-len vLLM accepts for `model` without VLLM_ALLOW_LONG_MAX_MODEL_LEN
// (vllm/config/model.py, _get_and_verify_max_len, 0.33): max_position_embeddings, times the
// RoPE scaling factor unless the scaling type already counts it (YaRN, Llama 3, LongRoPE, su,
// DeepSeek's) or the model is Gemma 3. A config's model_max_length above it is accepted too.
// The tokenizer's model_max_length, which can lower it, is not read.
int64_t VllmDerivedMaxModelLen(const ModelSpec& model);

struct Plan {
  std::string model;
  Policy policy = Policy::kKvpage;
  DType kv_cache_dtype = DType::kBF16;
  int32_t tp = 1;  // tensor-parallel degree; > 1: every byte count below is one GPU's
  std::optional<int64_t> kv_budget_bytes;
  // vllm policy with a budget from a GPU: the runtime memory subtracted from it
  // (VllmKvBudgetFromGpu). Unset otherwise.
  std::optional<VllmRuntimeMemory> vllm_runtime;
  std::vector<PlanRow> rows;  // one per requested context, in the order given
};

// Plans every context in `contexts` (each > 0). `kv_budget_bytes`, when set, fills
// max_concurrency. Errors: InvalidArgument for bad options or contexts, or when the policy
// cannot represent the model with these options (e.g. q8_0 under vllm), naming the value,
// or CheckTensorParallel's error when options.tp cannot split the model.
absl::StatusOr<Plan> MakePlan(const ModelSpec& model, const PlanOptions& options,
                              absl::Span<const int64_t> contexts,
                              std::optional<int64_t> kv_budget_bytes = std::nullopt);

// KV budget on a GPU before any runtime's own memory: memory × utilization − weights.
// VllmKvBudgetFromGpu (kvpage/vllm_runtime_memory.h) also subtracts vLLM's activation,
// CUDA-graph and non-torch memory.
// InvalidArgument if utilization is not in (0, 1] or the weights do not fit.
absl::StatusOr<int64_t> KvBudgetFromGpu(const ModelSpec& model, int64_t gpu_memory_bytes,
                                        double gpu_memory_utilization);

// The KV budget of `tp` GPUs of `gpu_memory_bytes` each, expressed in bytes of the whole
// model's cache (what a simulator that sizes blocks from the unsplit model needs): each GPU's
// KvBudgetFromGpu of its shard (ShardForTensorParallel), times TensorParallelCacheFactor.
// tp 1 is KvBudgetFromGpu(model, ...). With a replicated MLA latent the budget does not grow
// with tp; with replicated KV heads it grows by num_kv_heads, not tp. Exact when every layer
// group shrinks by the same factor, else conservative (the least factor).
// Errors: CheckTensorParallel's, then KvBudgetFromGpu's for the shard.
absl::StatusOr<int64_t> TensorParallelKvBudget(const ModelSpec& model, int32_t tp,
                                               int64_t gpu_memory_bytes,
                                               double gpu_memory_utilization);

}  // namespace kvpage

#endif  // KVPAGE_PLANNER_H_
