// Programmatic dependent launch (sm_90+): the device half.
//
// A kernel launched with cudaLaunchAttributeProgrammaticStreamSerialization may start while the
// kernel before it on the stream is still running. It must call WaitForPrimaryGrids() before
// it touches any memory the earlier kernel writes or reads: griddepcontrol.wait returns once
// every prerequisite grid has completed and its memory operations are visible, whatever the
// prerequisite did. TriggerDependentGrids() (griddepcontrol.launch_dependents) only lets the
// dependent grid be scheduled earlier; it carries no memory ordering, so where it sits never
// affects correctness.
//
// Both compile to nothing below sm_90, and on the host (the CPU emulation), where kernels run
// one after another anyway.
#ifndef KVPAGE_KERNELS_GRID_DEPENDENCY_CUH_
#define KVPAGE_KERNELS_GRID_DEPENDENCY_CUH_

#include "kernels/vec.cuh"

namespace kvpage::cuda::internal {

__device__ __forceinline__ void WaitForPrimaryGrids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void TriggerDependentGrids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

}  // namespace kvpage::cuda::internal

#endif  // KVPAGE_KERNELS_GRID_DEPENDENCY_CUH_
