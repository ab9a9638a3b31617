// ApplyTableRuns (include/kvpage/cuda/table_runs.h).
#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"
#include "kernels/cuda_status.h"
#include "kernels/table_runs_kernel.cuh"
#include "kvpage/cuda/table_runs.h"

namespace kvpage::cuda {

absl::Status ApplyTableRuns(const kvpage::TableRunView* runs, int32_t num_runs, const int32_t* values,
                            int32_t* table, int32_t stride, cudaStream_t stream) {
  if (num_runs < 0) {
    return absl::InvalidArgumentError(absl::StrCat("ApplyTableRuns: num_runs ", num_runs, " < 0"));
  }
  if (stride <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("ApplyTableRuns: stride ", stride, " <= 0"));
  }
  if (num_runs == 0) return absl::OkStatus();
  if (runs == nullptr || values == nullptr || table == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("ApplyTableRuns: null runs, values or table with ", num_runs, " runs"));
  }
  internal::ApplyTableRunsKernel<<<num_runs, internal::kTableRunThreads, 0, stream>>>(
      runs, values, table, stride);
  const cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? absl::OkStatus() : internal::CudaStatus(err, "ApplyTableRuns");
}

}  // namespace kvpage::cuda
