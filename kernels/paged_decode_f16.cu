// The CUDA-core decode kernels for a f16 cache (f16 q and out): 6 head_dims x 4 group tiles.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/paged_decode_select.cuh"

namespace kvpage::cuda::internal {

template DecodeKernelFn CudaCoreDecodeKernel<__half, __half>(int32_t head_dim,
                                                          int32_t group_tile);

}  // namespace kvpage::cuda::internal
