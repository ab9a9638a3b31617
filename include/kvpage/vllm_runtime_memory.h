// vLLM's memory on one GPU beside its weights and KV cache, estimated from config.json: what
// `kvpage plan --policy vllm --gpu` subtracts from the budget before sizing the KV cache.
//
// vLLM 0.33 sizes the cache at start-up as (vllm/v1/worker/gpu_worker.py:753-757)
//   kv = ceil(memory × gpu_memory_utilization) − consumed − transient peak − CUDA-graph estimate
// where `consumed` is the weights plus memory that stays allocated after its profiling run
// (non-torch buffers: NCCL and all-reduce buffers at tp > 1), the transient peak is the torch
// allocator's high-water mark of that run (one forward pass of max_num_batched_tokens tokens
// split over min(max_num_batched_tokens, max_num_seqs) requests, then the sampler on one
// token per request), and the CUDA-graph estimate extrapolates the capture of the largest
// graphs. The estimate here models each term from the model's shape; the formula, its
// constants and its error against 20 published vLLM start-up logs are in
// docs/capacity_planning.md §1.1.
#ifndef KVPAGE_VLLM_RUNTIME_MEMORY_H_
#define KVPAGE_VLLM_RUNTIME_MEMORY_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "kvpage/model_spec.h"

namespace kvpage {

struct PlanOptions;

// Bytes of one GPU, each term as vLLM's start-up profile counts it.
struct VllmRuntimeMemory {
  int64_t activation_bytes = 0;  // the profiling run's transient peak
  int64_t cuda_graph_bytes = 0;  // the CUDA-graph estimate; 0 with enforce_eager
  int64_t non_torch_bytes = 0;   // memory outside torch allocated after the start-up snapshot
  int64_t total() const { return activation_bytes + cuda_graph_bytes + non_torch_bytes; }
};

// The estimate for `model` (whole or ShardForTensorParallel's shard: only fields sharding
// keeps are read) under options.max_num_batched_tokens, max_num_seqs, tp and enforce_eager.
// InvalidArgument if options do not validate.
absl::StatusOr<VllmRuntimeMemory> EstimateVllmRuntimeMemory(const ModelSpec& model,
                                                            const PlanOptions& options);

// KvBudgetFromGpu(shard, ...) less EstimateVllmRuntimeMemory(shard, options): one GPU's KV
// budget as vLLM 0.33 would find it. `shard` is the model split by options.tp.
// InvalidArgument if utilization is not in (0, 1] or weights and runtime memory do not fit,
// naming both.
absl::StatusOr<int64_t> VllmKvBudgetFromGpu(const ModelSpec& shard, int64_t gpu_memory_bytes,
                                            double gpu_memory_utilization,
                                            const PlanOptions& options);

}  // namespace kvpage

#endif  // KVPAGE_VLLM_RUNTIME_MEMORY_H_
