// The paged decode launch shared by PagedDecode and PagedPrefill (internal).
#ifndef KVPAGE_KERNELS_PAGED_DECODE_LAUNCH_H_
#define KVPAGE_KERNELS_PAGED_DECODE_LAUNCH_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/merge_launch.h"
#include "kvpage/kernel_layout.h"

namespace kvpage::cuda::internal {

// PagedDecode's argument checks (InvalidArgument naming `what` and the value); touches
// nothing on the device.
absl::Status ValidatePagedDecode(const char* what, const void* out, const void* q,
                                 int64_t q_seq_stride, const KvCacheView& cache,
                                 const BlockTableView& table, const DecodeParams& params,
                                 const DecodePlan& plan, const void* workspace,
                                 int64_t workspace_bytes);

// PagedDecode (include/kvpage/cuda/paged_decode.h) with query row i reading table row
// table_rows[i] (device memory; null: row i). Errors name `what`.
absl::Status LaunchPagedDecode(const char* what, void* out, const void* q, int64_t q_seq_stride,
                               const KvCacheView& cache, const BlockTableView& table,
                               const int32_t* table_rows, const DecodeParams& params,
                               const DecodePlan& plan, void* workspace, int64_t workspace_bytes,
                               cudaStream_t stream);

// Compute capability major of the current device, asked once per device and cached (no sync,
// safe during stream capture); 0 when there is no usable device.
int32_t CurrentDeviceCcMajor();

// MergeAttnStates (include/kvpage/cuda/paged_decode.h) on the given path; MergeAttnStates
// itself takes ChooseMergeLaunch(CurrentDeviceCcMajor()). The GPU check runs both paths.
// REQUIRES: kProgrammatic only on a device of compute capability >= 9.0.
absl::Status LaunchMergeAttnStates(void* out, float* lse_out, const float* partial_o,
                                   const float* partial_lse, int32_t num_seqs,
                                   int32_t num_heads, int32_t num_splits, int32_t head_dim,
                                   DType dtype, MergeLaunchPath path, cudaStream_t stream);

}  // namespace kvpage::cuda::internal

#endif  // KVPAGE_KERNELS_PAGED_DECODE_LAUNCH_H_
