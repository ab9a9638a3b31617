// The project's bandwidth targets for kvpage_gpu_check, as percent of the measured
// device-to-device copy ceiling on the same GPU (issue 23; docs/kernels.md §6). Host-only.
#ifndef KVPAGE_KERNELS_CHECK_BANDWIDTH_TARGETS_H_
#define KVPAGE_KERNELS_CHECK_BANDWIDTH_TARGETS_H_

#include <cstdint>
#include <string_view>

namespace kvpage::cuda::check {

// paged_decode at batch >= 64 and context >= 4K; smaller shapes have no target (too few CTAs
// or bytes to reach the ceiling, and split-KV partials are not counted as traffic).
inline constexpr double kDecodeTargetPercent = 85.0;
inline constexpr int32_t kDecodeTargetMinBatch = 64;
inline constexpr int32_t kDecodeTargetMinContext = 4096;
// write_kv and the block copies.
inline constexpr double kCopyTargetPercent = 90.0;

// The target of one benchmark row in percent of the copy ceiling, 0 when it has none.
// `batch` and `context` matter for paged_decode only.
inline double TargetPercent(std::string_view kernel, int32_t batch, int32_t context) {
  if (kernel == "paged_decode") {
    return batch >= kDecodeTargetMinBatch && context >= kDecodeTargetMinContext
               ? kDecodeTargetPercent
               : 0.0;
  }
  if (kernel == "write_kv" || kernel == "copy_blocks") return kCopyTargetPercent;
  return 0.0;
}

// Whether a row measured at `percent` of the ceiling meets its target (rows without one do).
inline bool MeetsTarget(std::string_view kernel, int32_t batch, int32_t context,
                        double percent) {
  return percent >= TargetPercent(kernel, batch, context);
}

}  // namespace kvpage::cuda::check

#endif  // KVPAGE_KERNELS_CHECK_BANDWIDTH_TARGETS_H_
