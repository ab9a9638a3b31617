// write_kv: the step's K/V rows -> paged cache slots (include/kvpage/cuda/write_kv.h).
#include <cuda_runtime.h>

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cuda_status.h"
#include "kernels/write_kv_kernel.cuh"
#include "kvpage/cuda/write_kv.h"

namespace kvpage::cuda {
namespace {

using internal::kWriteKvThreads;
using internal::MakeWriteKvArgs;
using internal::WriteKvArgs;
using internal::WriteKvKernel;

}  // namespace

absl::Status WriteKv(const void* k, const void* v, int64_t k_token_stride,
                     int64_t v_token_stride, const int64_t* slot_mapping, int32_t num_tokens,
                     const KvCacheView& cache, cudaStream_t stream) {
  absl::Status status = ValidateKvCacheView(cache);
  if (!status.ok()) return status;
  if (num_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat("WriteKv: num_tokens ", num_tokens, " < 0"));
  }
  if (k == nullptr || slot_mapping == nullptr) {
    return absl::InvalidArgumentError("WriteKv: k or slot_mapping is null");
  }
  if (v == nullptr && cache.kv_stride != 0) {
    return absl::InvalidArgumentError("WriteKv: v is null but the view has a V half");
  }
  if (reinterpret_cast<uintptr_t>(k) % 16 != 0 || reinterpret_cast<uintptr_t>(v) % 16 != 0) {
    return absl::InvalidArgumentError("WriteKv: k or v is not 16-byte aligned");
  }
  if (k_token_stride % 8 != 0 || v_token_stride % 8 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("WriteKv: token strides ", k_token_stride,
                                                   " / ", v_token_stride,
                                                   " are not multiples of 8 elements"));
  }
  if (num_tokens == 0) return absl::OkStatus();
  const WriteKvArgs a =
      MakeWriteKvArgs(k, v, k_token_stride, v_token_stride, slot_mapping, cache);
  WriteKvKernel<<<num_tokens, kWriteKvThreads, 0, stream>>>(a);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return internal::CudaStatus(err, "WriteKvKernel");
  return absl::OkStatus();
}

}  // namespace kvpage::cuda
