// The CUDA-core decode instantiation for a runtime head_dim and group tile: the definition of
// CudaCoreDecodeKernel (declared in paged_decode_kernel.cuh). Included by the translation
// units that instantiate it (paged_decode_bf16.cu, paged_decode_f16.cu, paged_decode_fp8.cu:
// one per cache dtype, so nvcc compiles the kernels in parallel and ccache reuses each) and
// by the host emulation test.
#ifndef KVPAGE_KERNELS_PAGED_DECODE_SELECT_CUH_
#define KVPAGE_KERNELS_PAGED_DECODE_SELECT_CUH_

#include <cstdint>

#include "kernels/paged_decode_kernel.cuh"

namespace kvpage::cuda::internal {

template <typename T, int kHeadDim, typename TC>
DecodeKernelFn CudaCoreDecodeKernelForTile(int32_t group_tile) {
  switch (group_tile) {
    case 1:
      return PagedDecodeKernel<T, kHeadDim, 1, TC>;
    case 2:
      return PagedDecodeKernel<T, kHeadDim, 2, TC>;
    case 4:
      return PagedDecodeKernel<T, kHeadDim, 4, TC>;
    default:
      return PagedDecodeKernel<T, kHeadDim, 8, TC>;
  }
}

template <typename T, typename TC>
DecodeKernelFn CudaCoreDecodeKernel(int32_t head_dim, int32_t group_tile) {
  switch (head_dim) {
    case 64:
      return CudaCoreDecodeKernelForTile<T, 64, TC>(group_tile);
    case 80:
      return CudaCoreDecodeKernelForTile<T, 80, TC>(group_tile);
    case 96:
      return CudaCoreDecodeKernelForTile<T, 96, TC>(group_tile);
    case 128:
      return CudaCoreDecodeKernelForTile<T, 128, TC>(group_tile);
    case 192:
      return CudaCoreDecodeKernelForTile<T, 192, TC>(group_tile);
    case 256:
      return CudaCoreDecodeKernelForTile<T, 256, TC>(group_tile);
    default:
      return nullptr;
  }
}

}  // namespace kvpage::cuda::internal

#endif  // KVPAGE_KERNELS_PAGED_DECODE_SELECT_CUH_
