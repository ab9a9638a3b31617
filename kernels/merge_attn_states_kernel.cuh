// merge_attn_states kernel body: combines split-KV partial (o, lse) states.
//
// Device code only; the launcher is in merge_attn_states.cu. Kept in a header so the same
// source also compiles on the host against kernels/emulation/cuda_emulation.h (tests/kernels).
#ifndef KVPAGE_KERNELS_MERGE_ATTN_STATES_KERNEL_CUH_
#define KVPAGE_KERNELS_MERGE_ATTN_STATES_KERNEL_CUH_

#include <cstdint>

#include "kernels/grid_dependency.cuh"
#include "kernels/vec.cuh"

namespace kvpage::cuda::internal {

constexpr int kMergeThreads = 128;

template <typename T>
__device__ __forceinline__ T FromFloat(float x);
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half FromFloat(float x) {
  return __float2half_rn(x);
}

// grid.x = sequence * num_heads + head. Every thread finds the row's maximum lse (the splits
// are few and the loads hit L1), then owns head_dim elements i, i + kMergeThreads, ...
// Launched with programmatic stream serialization on sm_90 (merge_launch.h), so it first waits
// for the split kernel: nothing is read or written before WaitForPrimaryGrids.
template <typename T>
__global__ void __launch_bounds__(kMergeThreads)
    MergeKernel(T* out, float* lse_out, const float* partial_o, const float* partial_lse,
                int32_t num_splits, int32_t head_dim) {
  WaitForPrimaryGrids();
  const int64_t row = blockIdx.x;
  const float* lse = partial_lse + row * num_splits;
  float max_lse = -INFINITY;
  for (int32_t s = 0; s < num_splits; ++s) max_lse = fmaxf(max_lse, lse[s]);
  float total = 0.0f;
  if (max_lse != -INFINITY) {
    for (int32_t s = 0; s < num_splits; ++s) total += __expf(lse[s] - max_lse);
  }
  const float inv_total = total > 0.0f ? 1.0f / total : 0.0f;
  for (int32_t i = threadIdx.x; i < head_dim; i += kMergeThreads) {
    float acc = 0.0f;
    if (max_lse != -INFINITY) {
      for (int32_t s = 0; s < num_splits; ++s) {
        const float w = __expf(lse[s] - max_lse);  // 0 for an empty split
        if (w > 0.0f) acc += w * partial_o[(row * num_splits + s) * head_dim + i];
      }
    }
    out[row * head_dim + i] = FromFloat<T>(acc * inv_total);
  }
  if (lse_out != nullptr && threadIdx.x == 0) {
    lse_out[row] = max_lse == -INFINITY ? -INFINITY : max_lse + logf(total);
  }
}

}  // namespace kvpage::cuda::internal

#endif  // KVPAGE_KERNELS_MERGE_ATTN_STATES_KERNEL_CUH_
