// How the split-KV merge is launched (internal, host only, no CUDA include, so the CPU tests
// check the choice).
#ifndef KVPAGE_KERNELS_MERGE_LAUNCH_H_
#define KVPAGE_KERNELS_MERGE_LAUNCH_H_

#include <cstdint>

namespace kvpage::cuda::internal {

enum class MergeLaunchPath {
  kPlain,         // <<<>>>: starts after the split kernel has finished
  kProgrammatic,  // cudaLaunchKernelEx with programmatic stream serialization (sm_90+): the
                  // merge may be scheduled while the split kernel drains, and waits in
                  // griddepcontrol.wait before it reads the partial states
};

// The path for the merge on a device of compute capability `cc_major`.x (0 when unknown).
// Programmatic launch needs compute capability 9.0: below it the launch attribute is not
// supported and the kernels are compiled without griddepcontrol.
constexpr MergeLaunchPath ChooseMergeLaunch(int32_t cc_major) {
  return cc_major >= 9 ? MergeLaunchPath::kProgrammatic : MergeLaunchPath::kPlain;
}

}  // namespace kvpage::cuda::internal

#endif  // KVPAGE_KERNELS_MERGE_LAUNCH_H_
