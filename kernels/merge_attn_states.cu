// merge_attn_states: combines split-KV partial (o, lse) states
// (include/kvpage/cuda/paged_decode.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cuda_status.h"
#include "kernels/merge_attn_states_kernel.cuh"
#include "kernels/merge_launch.h"
#include "kernels/paged_decode_launch.h"
#include "kvpage/cuda/paged_decode.h"

namespace kvpage::cuda {
namespace {

using internal::kMergeThreads;
using internal::MergeKernel;
using internal::MergeLaunchPath;

template <typename T>
cudaError_t LaunchMergeKernel(MergeLaunchPath path, dim3 grid, T* out, float* lse_out,
                              const float* partial_o, const float* partial_lse,
                              int32_t num_splits, int32_t head_dim, cudaStream_t stream) {
  if (path == MergeLaunchPath::kPlain) {
    MergeKernel<T><<<grid, kMergeThreads, 0, stream>>>(out, lse_out, partial_o, partial_lse,
                                                       num_splits, head_dim);
    return cudaGetLastError();
  }
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = dim3(kMergeThreads);
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  config.attrs = attribute;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, MergeKernel<T>, out, lse_out, partial_o, partial_lse,
                            num_splits, head_dim);
}

}  // namespace

int32_t internal::CurrentDeviceCcMajor() {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 0;
  // Asked once per device: cudaDeviceGetAttribute neither synchronizes nor breaks capture, but
  // a launch should not pay for it every time. 0 means not asked yet.
  constexpr int kMaxDevices = 64;
  static std::atomic<int32_t> cached[kMaxDevices];
  const bool cacheable = device >= 0 && device < kMaxDevices;
  int32_t major = cacheable ? cached[device].load(std::memory_order_relaxed) : 0;
  if (major == 0) {
    int value = 0;
    if (cudaDeviceGetAttribute(&value, cudaDevAttrComputeCapabilityMajor, device) !=
        cudaSuccess) {
      return 0;
    }
    major = value;
    if (cacheable) cached[device].store(major, std::memory_order_relaxed);
  }
  return major;
}

absl::Status MergeAttnStates(void* out, float* lse_out, const float* partial_o,
                             const float* partial_lse, int32_t num_seqs, int32_t num_heads,
                             int32_t num_splits, int32_t head_dim, DType dtype,
                             cudaStream_t stream) {
  return internal::LaunchMergeAttnStates(
      out, lse_out, partial_o, partial_lse, num_seqs, num_heads, num_splits, head_dim, dtype,
      internal::ChooseMergeLaunch(internal::CurrentDeviceCcMajor()), stream);
}

absl::Status internal::LaunchMergeAttnStates(void* out, float* lse_out, const float* partial_o,
                                             const float* partial_lse, int32_t num_seqs,
                                             int32_t num_heads, int32_t num_splits,
                                             int32_t head_dim, DType dtype, MergeLaunchPath path,
                                             cudaStream_t stream) {
  if (num_seqs < 0 || num_heads <= 0 || num_splits <= 0 || head_dim <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("MergeAttnStates: bad sizes (num_seqs ", num_seqs, ", num_heads ",
                     num_heads, ", num_splits ", num_splits, ", head_dim ", head_dim, ")"));
  }
  if (dtype != DType::kBF16 && dtype != DType::kF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("MergeAttnStates: dtype ", DTypeName(dtype), " is not f16 or bf16"));
  }
  if (out == nullptr || partial_o == nullptr || partial_lse == nullptr) {
    return absl::InvalidArgumentError("MergeAttnStates: null out or partial state");
  }
  const int64_t rows = static_cast<int64_t>(num_seqs) * num_heads;
  if (rows == 0) return absl::OkStatus();
  if (rows > 0x7fffffff) {
    return absl::InvalidArgumentError(absl::StrCat("MergeAttnStates: ", rows, " rows"));
  }
  const dim3 grid(static_cast<uint32_t>(rows));
  const cudaError_t err =
      dtype == DType::kBF16
          ? LaunchMergeKernel(path, grid, static_cast<__nv_bfloat16*>(out), lse_out, partial_o,
                              partial_lse, num_splits, head_dim, stream)
          : LaunchMergeKernel(path, grid, static_cast<__half*>(out), lse_out, partial_o,
                              partial_lse, num_splits, head_dim, stream);
  if (err != cudaSuccess) return internal::CudaStatus(err, "MergeKernel");
  return absl::OkStatus();
}

}  // namespace kvpage::cuda
