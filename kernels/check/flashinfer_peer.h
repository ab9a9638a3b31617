// Shared by the two halves of kvpage_flashinfer_peer (flashinfer_peer_main.cu: FlashInfer's
// decode and the driver; flashinfer_prefill_peer.cu: its batch prefill): device memory,
// timing the way kvpage_gpu_check's Bench::Time does, and the prefill half's entry points.
// CUDA runtime only; none of FlashInfer's headers (docs/kernels.md §6).
#ifndef KVPAGE_KERNELS_CHECK_FLASHINFER_PEER_H_
#define KVPAGE_KERNELS_CHECK_FLASHINFER_PEER_H_

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

// The peer is a measuring tool, not the library: a CUDA error ends it with the call named.
#define PEER_CHECK_CUDA(expr)                                                             \
  do {                                                                                    \
    const cudaError_t e_ = (expr);                                                        \
    if (e_ != cudaSuccess) {                                                              \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr,                  \
                   cudaGetErrorString(e_));                                               \
      std::exit(1);                                                                       \
    }                                                                                     \
  } while (0)

namespace kvpage::cuda::peer {

inline constexpr int kRepeats = 25;
inline constexpr size_t kFlushBytes = size_t{256} << 20;

template <typename T>
T* DeviceAlloc(size_t bytes) {
  void* p = nullptr;
  PEER_CHECK_CUDA(cudaMalloc(&p, std::max<size_t>(bytes, 16)));
  return static_cast<T*>(p);
}

template <typename T>
T* Upload(const std::vector<T>& v) {
  T* p = DeviceAlloc<T>(v.size() * sizeof(T));
  PEER_CHECK_CUDA(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return p;
}

// Median, min and max in microseconds of kRepeats launches after 3 warm-ups, L2 flushed by
// a kFlushBytes memset of `flush` before each, outside the timed region.
template <typename F>
void Time(F launch, void* flush, double* med, double* lo, double* hi) {
  cudaEvent_t a, b;
  PEER_CHECK_CUDA(cudaEventCreate(&a));
  PEER_CHECK_CUDA(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) PEER_CHECK_CUDA(launch());
  std::vector<double> us;
  for (int r = 0; r < kRepeats; ++r) {
    PEER_CHECK_CUDA(cudaMemsetAsync(flush, r & 0xff, kFlushBytes, nullptr));
    PEER_CHECK_CUDA(cudaEventRecord(a, nullptr));
    PEER_CHECK_CUDA(launch());
    PEER_CHECK_CUDA(cudaEventRecord(b, nullptr));
    PEER_CHECK_CUDA(cudaEventSynchronize(b));
    float ms = 0;
    PEER_CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
    us.push_back(ms * 1e3);
  }
  std::sort(us.begin(), us.end());
  *med = us[us.size() / 2], *lo = us.front(), *hi = us.back();
  cudaEventDestroy(a);
  cudaEventDestroy(b);
}

// FlashInfer's BatchPrefillWithPagedKVCache against kvpage's PagedPrefill (tiled) on random
// bf16 data in one cache, GQA 4 and 8; prints a PASS or FAIL line for each. True if all agree.
bool CheckFlashInferPrefill(std::mt19937& rng);

// The prefill sweep (kernels/check/prefill_sweep.h) on FlashInfer: a table of TFLOP/s and, when
// `csv` is open, its rows (the columns of kvpage_gpu_check's CSV but target_pct). `ceiling`:
// the copy ceiling in GB/s, for pct_ceiling. Failed rows print FAIL; returns their number.
int SweepFlashInferPrefill(void* flush, double ceiling, FILE* csv, std::mt19937& rng);

}  // namespace kvpage::cuda::peer

#endif  // KVPAGE_KERNELS_CHECK_FLASHINFER_PEER_H_
