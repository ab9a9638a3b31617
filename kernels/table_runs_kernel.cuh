// The table-run patch kernel (launcher: table_runs.cu). In a header so the same source runs on
// the CPU under kernels/emulation/cuda_emulation.h (tests/kernels).
#ifndef KVPAGE_KERNELS_TABLE_RUNS_KERNEL_CUH_
#define KVPAGE_KERNELS_TABLE_RUNS_KERNEL_CUH_

#include <cstdint>

#include "kvpage/kernel_layout.h"

namespace kvpage::cuda::internal {

constexpr int kTableRunThreads = 128;

// CTA x patches run x: its threads write the run's entries, strided by the CTA size.
__global__ void __launch_bounds__(kTableRunThreads)
    ApplyTableRunsKernel(const kvpage::TableRunView* runs, const int32_t* values, int32_t* table,
                         int32_t stride) {
  const kvpage::TableRunView run = runs[blockIdx.x];
  int32_t* dst = table + static_cast<int64_t>(run.row) * stride + run.first;
  const int32_t* src = values + run.value_offset;
  for (int32_t i = static_cast<int32_t>(threadIdx.x); i < run.count; i += kTableRunThreads) {
    dst[i] = src[i];
  }
}

}  // namespace kvpage::cuda::internal

#endif  // KVPAGE_KERNELS_TABLE_RUNS_KERNEL_CUH_
