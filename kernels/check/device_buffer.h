// RAII device memory for the checks and the GPU benchmark.
#ifndef KVPAGE_KERNELS_CHECK_DEVICE_BUFFER_H_
#define KVPAGE_KERNELS_CHECK_DEVICE_BUFFER_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <vector>

#include "absl/status/status.h"
#include "kernels/cuda_status.h"

namespace kvpage::cuda::check {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }

  absl::Status Allocate(size_t bytes) {
    if (ptr_ != nullptr) cudaFree(ptr_);
    bytes_ = bytes;
    const cudaError_t err = cudaMalloc(&ptr_, bytes == 0 ? 16 : bytes);
    if (err != cudaSuccess) ptr_ = nullptr;
    return err == cudaSuccess ? absl::OkStatus() : internal::CudaStatus(err, "cudaMalloc");
  }
  template <typename T>
  absl::Status Upload(const std::vector<T>& host) {
    absl::Status status = Allocate(host.size() * sizeof(T));
    if (!status.ok()) return status;
    const cudaError_t err =
        cudaMemcpy(ptr_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
    return err == cudaSuccess ? absl::OkStatus() : internal::CudaStatus(err, "upload");
  }
  // Copies host into the existing allocation. REQUIRES: it fits.
  template <typename T>
  absl::Status CopyIn(const std::vector<T>& host) {
    const cudaError_t err =
        cudaMemcpy(ptr_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
    return err == cudaSuccess ? absl::OkStatus() : internal::CudaStatus(err, "copy in");
  }
  template <typename T>
  absl::Status Download(std::vector<T>* host) const {
    host->resize(bytes_ / sizeof(T));
    const cudaError_t err = cudaMemcpy(host->data(), ptr_, bytes_, cudaMemcpyDeviceToHost);
    return err == cudaSuccess ? absl::OkStatus() : internal::CudaStatus(err, "download");
  }

  void* get() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace kvpage::cuda::check

#endif  // KVPAGE_KERNELS_CHECK_DEVICE_BUFFER_H_
