// The CUDA-core decode kernels for an fp8 e4m3 cache, with bf16 or fp16 q and out: 2 x 6
// head_dims x 4 group tiles.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/paged_decode_select.cuh"

namespace kvpage::cuda::internal {

template DecodeKernelFn CudaCoreDecodeKernel<__nv_bfloat16, Fp8E4m3>(int32_t head_dim,
                                                                     int32_t group_tile);
template DecodeKernelFn CudaCoreDecodeKernel<__half, Fp8E4m3>(int32_t head_dim,
                                                              int32_t group_tile);

}  // namespace kvpage::cuda::internal
