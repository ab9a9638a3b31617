// Patching a persistent device block table with a step's table runs (the scheduler's
// AttentionBatch::table_runs and table_values, uploaded in its step image, kvpage/step_image.h).
// Built only with KVPAGE_BUILD_CUDA.
#ifndef KVPAGE_CUDA_TABLE_RUNS_H_
#define KVPAGE_CUDA_TABLE_RUNS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kvpage/kernel_layout.h"

namespace kvpage::cuda {

// Applies runs[0, num_runs) in order to `table` ([rows, stride] int32 on the device): one CTA
// per run, asynchronous on `stream`. runs and values are on the device (the step image).
// REQUIRES: every run lies inside the table and the values (the scheduler's do); runs of one
// step never overlap, so their order does not matter within a launch.
// InvalidArgument for num_runs < 0, stride <= 0, or null pointers with num_runs > 0; a CUDA
// launch error otherwise.
absl::Status ApplyTableRuns(const kvpage::TableRunView* runs, int32_t num_runs, const int32_t* values,
                            int32_t* table, int32_t stride, cudaStream_t stream);

}  // namespace kvpage::cuda

#endif  // KVPAGE_CUDA_TABLE_RUNS_H_
