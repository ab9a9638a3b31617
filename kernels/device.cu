// Device discovery and a launch smoke test. The kernels (write_kv, paged_decode,
// copy_slots/copy_blocks) live in their own files next to this one; docs/kernels.md.
#include <cuda_runtime.h>

#include <vector>

#include "kernels/cuda_status.h"
#include "kvpage/cuda/device.h"

namespace kvpage::cuda {
namespace {

// out: int32 [n], one value per thread.
__global__ void FillKernel(int* out, int n, int value) {
  const int i = static_cast<int>(threadIdx.x);
  if (i < n) out[i] = value;
}

}  // namespace

absl::StatusOr<int> DeviceCount() {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) return internal::CudaStatus(err, "cudaGetDeviceCount");
  return count;
}

absl::Status SmokeTest(int n, int value) {
  if (n <= 0 || n > 1024) return absl::InvalidArgumentError("SmokeTest: n must be in [1, 1024]");
  int* device = nullptr;
  cudaError_t err = cudaMalloc(&device, sizeof(int) * n);
  if (err != cudaSuccess) return internal::CudaStatus(err, "cudaMalloc");
  FillKernel<<<1, n>>>(device, n, value);
  err = cudaGetLastError();
  std::vector<int> host(n, ~value);
  if (err == cudaSuccess) {
    err = cudaMemcpy(host.data(), device, sizeof(int) * n, cudaMemcpyDeviceToHost);
  }
  cudaFree(device);
  if (err != cudaSuccess) return internal::CudaStatus(err, "FillKernel");
  for (int i = 0; i < n; ++i) {
    if (host[i] != value) return absl::InternalError("FillKernel wrote a wrong value");
  }
  return absl::OkStatus();
}

}  // namespace kvpage::cuda
