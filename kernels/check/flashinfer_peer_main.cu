// kvpage_flashinfer_peer: FlashInfer's CUDA-core BatchDecode and its batch prefill on kvpage's
// paged cache, timed the way kvpage_gpu_check times PagedDecode and PagedPrefill, so the sweeps
// compare row by row. This file: the decode and the driver; flashinfer_prefill_peer.cu: the
// prefill.
//
// Built only with -DKVPAGE_FLASHINFER_INCLUDE=<dir holding flashinfer/attention/decode.cuh>
// (the include/ folder the flashinfer-python wheel ships under flashinfer/data/); nothing of
// FlashInfer is in this repository. docs/kernels.md §6.
//
// The cache is kvpage's blocks-first NHD allocation [num_blocks][2][bs][H][D]: FlashInfer reads
// it as K = base, V = base + bs*H*D, both with page stride 2*bs*H*D (docs/kernels.md §4), with
// each sequence's block ids as a CSR page list. Plans come from FlashInfer's own DecodePlan
// (split-KV when the batch does not fill the device), made outside the timed region.
//
// Usage: kvpage_flashinfer_peer [--csv PATH] [--quick] [--only decode|prefill]
//   Measures the device-to-device copy ceiling, then for decode checks, on random bf16 data,
//   that FlashInfer and kvpage's PagedDecode agree on the same cache, and runs the sweep batch
//   1/8/64/256 x context 1K/4K/32K x GQA 1/4/8 (bf16, 8 KV heads, D 128, block 16), the rows of
//   kvpage_gpu_check's decode sweep (GB/s); for prefill the same against PagedPrefill and the
//   prefill sweep of kernels/check/prefill_sweep.h (TFLOP/s). --quick: the checks and decode
//   batch 8 only. --only: one of the two. CSV columns: kvpage_gpu_check's but target_pct.
#include <cuda_runtime.h>

#include <flashinfer/attention/decode.cuh>
#include <flashinfer/attention/default_decode_params.cuh>
#include <flashinfer/attention/scheduler.cuh>
#include <flashinfer/attention/variants.cuh>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/check/flashinfer_peer.h"
#include "kvpage/cuda/paged_decode.h"
#include "kvpage/kernel_layout.h"
#include "kvpage/kernel_reference.h"

namespace kvpage::cuda::peer {
namespace {

using Params = flashinfer::BatchDecodeParams<__nv_bfloat16, __nv_bfloat16, __nv_bfloat16, int32_t>;
using Variant = flashinfer::DefaultAttention</*custom_mask=*/false, /*sliding_window=*/false,
                                             /*logits_soft_cap=*/false, /*alibi=*/false>;
constexpr uint32_t kHeadDim = 128;
constexpr int32_t kKvHeads = 8, kBlockSize = 16;

// One batch on one cache: every sequence `len` tokens, blocks a random permutation of the pool.
struct Problem {
  int32_t seqs = 0, len = 0, group = 0, blocks_per_seq = 0;
  void* cache = nullptr;
  __nv_bfloat16 *q = nullptr, *out = nullptr;
  int32_t *table = nullptr, *lens = nullptr;                       // kvpage's form
  int32_t *indices = nullptr, *indptr = nullptr, *last_len = nullptr;  // FlashInfer's CSR form
  std::vector<int32_t> indptr_h;
  int64_t cache_bytes = 0;

  void Make(int32_t s, int32_t l, int32_t g, std::mt19937& rng, bool random_values) {
    seqs = s, len = l, group = g;
    blocks_per_seq = (len + kBlockSize - 1) / kBlockSize;
    const int32_t blocks = seqs * blocks_per_seq;
    std::vector<int32_t> perm(blocks);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    table = Upload(perm);  // row b = perm[b * blocks_per_seq, ...): the same list as CSR
    indices = table;
    indptr_h.resize(seqs + 1);
    for (int32_t b = 0; b <= seqs; ++b) indptr_h[b] = b * blocks_per_seq;
    indptr = Upload(indptr_h);
    lens = Upload(std::vector<int32_t>(seqs, len));
    last_len = Upload(std::vector<int32_t>(seqs, len - (blocks_per_seq - 1) * kBlockSize));
    cache_bytes = int64_t{blocks} * 2 * kBlockSize * kKvHeads * kHeadDim * 2;
    const size_t q_elems = size_t(seqs) * kKvHeads * group * kHeadDim;
    cache = DeviceAlloc<void>(cache_bytes);
    q = DeviceAlloc<__nv_bfloat16>(q_elems * 2);
    out = DeviceAlloc<__nv_bfloat16>(q_elems * 2);
    if (random_values) {
      std::normal_distribution<float> normal;
      std::vector<uint16_t> h(static_cast<size_t>(cache_bytes / 2));
      for (auto& x : h) x = kvpage::ref::FloatToHalf(normal(rng), kvpage::DType::kBF16);
      PEER_CHECK_CUDA(cudaMemcpy(cache, h.data(), cache_bytes, cudaMemcpyHostToDevice));
      h.resize(q_elems);
      for (auto& x : h) x = kvpage::ref::FloatToHalf(normal(rng), kvpage::DType::kBF16);
      PEER_CHECK_CUDA(cudaMemcpy(q, h.data(), q_elems * 2, cudaMemcpyHostToDevice));
    } else {
      PEER_CHECK_CUDA(cudaMemset(cache, 0x3c, cache_bytes));  // small finite bf16 values
      PEER_CHECK_CUDA(cudaMemset(q, 0x3c, q_elems * 2));
    }
  }
  void Free() {
    for (void* p : {cache, static_cast<void*>(q), static_cast<void*>(out),
                    static_cast<void*>(table), static_cast<void*>(indptr),
                    static_cast<void*>(lens), static_cast<void*>(last_len)}) {
      cudaFree(p);
    }
  }
  int32_t hq() const { return kKvHeads * group; }
  // What the kernel must move: K and V of every token, q in, out, the table.
  double Bytes() const {
    return 2.0 * seqs * len * kKvHeads * kHeadDim * 2 + 2.0 * 2 * seqs * hq() * kHeadDim +
           4.0 * seqs * blocks_per_seq;
  }
};

// FlashInfer's plan and launch for one problem (workspace owned here).
class FlashInferDecode {
 public:
  explicit FlashInferDecode(const Problem& p) : p_(p) {
    float_ws_ = DeviceAlloc<void>(kFloatWs);
    int_ws_ = DeviceAlloc<void>(kIntWs);
    PEER_CHECK_CUDA(cudaMallocHost(&pinned_, kIntWs));
    cudaError_t err = cudaErrorInvalidValue;
    // FlashInfer picks its kernel by group size at run time; its work estimation is a template.
    auto plan = [&](auto estimate) {
      err = flashinfer::DecodePlan<kHeadDim, flashinfer::PosEncodingMode::kNone, Variant, Params>(
          float_ws_, kFloatWs, int_ws_, pinned_, kIntWs, info_,
          const_cast<int32_t*>(p.indptr_h.data()), p.seqs, p.hq(), kBlockSize,
          /*enable_cuda_graph=*/false, nullptr, estimate);
    };
    switch (p.group) {
      case 1: plan(Estimate<1>); break;
      case 4: plan(Estimate<4>); break;
      case 8: plan(Estimate<8>); break;
      default: std::fprintf(stderr, "group %d not in the sweep\n", p.group); std::exit(1);
    }
    PEER_CHECK_CUDA(err);
    PEER_CHECK_CUDA(cudaDeviceSynchronize());
  }
  ~FlashInferDecode() {
    cudaFree(float_ws_);
    cudaFree(int_ws_);
    cudaFreeHost(pinned_);
  }
  bool split() const { return info_.split_kv; }

  cudaError_t Run() {
    const int64_t page_stride = int64_t{2} * kBlockSize * kKvHeads * kHeadDim;
    const int64_t strides[3] = {page_stride, kKvHeads * kHeadDim, kHeadDim};  // page, token, head
    auto* k = static_cast<__nv_bfloat16*>(p_.cache);
    flashinfer::paged_kv_t<__nv_bfloat16, int32_t> kv(
        kKvHeads, kBlockSize, kHeadDim, p_.seqs, flashinfer::QKVLayout::kNHD, k,
        k + kBlockSize * kKvHeads * kHeadDim, strides, strides, p_.indices, p_.indptr,
        p_.last_len);
    Params params;
    params.q = p_.q;
    params.paged_kv = kv;
    params.o = p_.out;
    params.lse = nullptr;
    params.num_qo_heads = p_.hq();
    params.q_stride_n = p_.hq() * kHeadDim;
    params.q_stride_h = kHeadDim;
    params.window_left = -1;
    params.sm_scale = 1.0f / std::sqrt(float{kHeadDim});
    params.rope_rcp_scale = 1.0f;
    params.rope_rcp_theta = 1.0f / 1e4f;
    params.padded_batch_size = info_.padded_batch_size;
    char* ib = static_cast<char*>(int_ws_);
    params.request_indices = reinterpret_cast<int32_t*>(ib + info_.request_indices_offset);
    params.kv_tile_indices = reinterpret_cast<int32_t*>(ib + info_.kv_tile_indices_offset);
    params.o_indptr = reinterpret_cast<int32_t*>(ib + info_.o_indptr_offset);
    params.kv_chunk_size_ptr = reinterpret_cast<int32_t*>(ib + info_.kv_chunk_size_ptr_offset);
    __nv_bfloat16* tmp_v = nullptr;
    float* tmp_s = nullptr;
    if (info_.split_kv) {
      char* fb = static_cast<char*>(float_ws_);
      tmp_v = reinterpret_cast<__nv_bfloat16*>(fb + info_.v_offset);
      tmp_s = reinterpret_cast<float*>(fb + info_.s_offset);
    }
    return flashinfer::BatchDecodeWithPagedKVCacheDispatched<
        kHeadDim, flashinfer::PosEncodingMode::kNone, Variant, Params>(
        params, tmp_v, tmp_s, /*enable_pdl=*/true, nullptr);
  }

 private:
  template <uint32_t kGroup>
  static cudaError_t Estimate(bool& split_kv, uint32_t& max_grid, uint32_t& pages_per_chunk,
                              uint32_t& new_batch, uint32_t& gdy, uint32_t batch,
                              int32_t* indptr_h, const uint32_t hq, const uint32_t page_size,
                              bool cuda_graph, cudaStream_t stream) {
    return flashinfer::BatchDecodeWithPagedKVCacheWorkEstimationDispatched<
        kGroup, kHeadDim, flashinfer::PosEncodingMode::kNone, Variant, Params>(
        split_kv, max_grid, pages_per_chunk, new_batch, gdy, batch, indptr_h, hq, page_size,
        cuda_graph, stream);
  }

  static constexpr size_t kFloatWs = size_t{256} << 20, kIntWs = size_t{8} << 20;
  const Problem& p_;
  void *float_ws_ = nullptr, *int_ws_ = nullptr, *pinned_ = nullptr;
  flashinfer::DecodePlanInfo info_;
};

// FlashInfer against kvpage's PagedDecode (itself checked against the CPU reference by
// kvpage_gpu_check) on random data: both read the same cache through their own tables.
bool CrossCheck(std::mt19937& rng) {
  bool ok = true;
  for (int32_t group : {1, 4, 8}) {
    Problem p;
    p.Make(/*seqs=*/5, /*len=*/1000 + 37 * group, group, rng, /*random_values=*/true);
    const size_t n = size_t(p.seqs) * p.hq() * kHeadDim;
    std::vector<uint16_t> fi(n), kv(n);
    FlashInferDecode decode(p);
    PEER_CHECK_CUDA(decode.Run());
    PEER_CHECK_CUDA(cudaMemcpy(fi.data(), p.out, n * 2, cudaMemcpyDeviceToHost));
    const kvpage::KvCacheView view = kvpage::BlocksFirstKvCache(
        p.cache, p.seqs * p.blocks_per_seq, kBlockSize, kKvHeads, kHeadDim, kvpage::DType::kBF16);
    const kvpage::DecodeParams params{p.hq(), 1.0f / std::sqrt(float{kHeadDim}), -1};
    const absl::Status s = kvpage::cuda::PagedDecode(
        p.out, p.q, int64_t{p.hq()} * kHeadDim, view,
        {p.table, p.blocks_per_seq, p.lens, p.seqs}, params, kvpage::DecodePlan{}, nullptr, 0,
        nullptr);
    PEER_CHECK_CUDA(cudaDeviceSynchronize());
    PEER_CHECK_CUDA(cudaMemcpy(kv.data(), p.out, n * 2, cudaMemcpyDeviceToHost));
    double max_diff = 0;
    for (size_t i = 0; i < n; ++i) {
      const double d = std::fabs(kvpage::ref::HalfToFloat(fi[i], kvpage::DType::kBF16) -
                                 kvpage::ref::HalfToFloat(kv[i], kvpage::DType::kBF16));
      max_diff = std::isnan(d) ? INFINITY : std::max(max_diff, d);
    }
    const bool pass = s.ok() && max_diff <= 2e-2;  // two bf16 roundings of values below 4
    std::printf("%-4s flashinfer vs kvpage, bf16 G=%d, 5 x %d tokens: max |diff| %.3g%s\n",
                pass ? "PASS" : "FAIL", group, p.len, max_diff,
                s.ok() ? "" : (" (" + std::string(s.message()) + ")").c_str());
    ok = ok && pass;
    p.Free();
  }
  return ok;
}

// The device-to-device copy ceiling in GB/s: cudaMemcpyAsync of 2 GiB, read + write counted.
double CopyCeiling(void* flush) {
  const size_t copy_bytes = size_t{2} << 30;
  void* a = DeviceAlloc<void>(copy_bytes);
  void* b = DeviceAlloc<void>(copy_bytes);
  double med, lo, hi;
  Time([&] { return cudaMemcpyAsync(b, a, copy_bytes, cudaMemcpyDeviceToDevice, nullptr); },
       flush, &med, &lo, &hi);
  cudaFree(a);
  cudaFree(b);
  return 2.0 * copy_bytes / (med * 1e3);
}

// The decode sweep (batch 8 only with `quick`), printed and written to `csv` when open.
void SweepDecode(void* flush, double ceiling, FILE* csv, bool quick, std::mt19937& rng) {
  std::printf("%-18s %-40s %9s %10s %8s %7s\n", "kernel", "config", "MB", "median_us", "GB/s",
              "%copy");
  for (int32_t batch : {1, 8, 64, 256}) {
    if (quick && batch != 8) continue;
    for (int32_t context : {1024, 4096, 32768}) {
      for (int32_t group : {1, 4, 8}) {
        Problem p;
        p.Make(batch, context, group, rng, /*random_values=*/false);
        FlashInferDecode decode(p);
        double med, lo, hi;
        Time([&] { return decode.Run(); }, flush, &med, &lo, &hi);
        const double gbps = p.Bytes() / (med * 1e3);
        char config[96];
        std::snprintf(config, sizeof(config), "bf16 B=%d ctx=%d Hkv=%d G=%d D=%u bs=%d%s", batch,
                      context, kKvHeads, group, kHeadDim, kBlockSize,
                      decode.split() ? " split" : "");
        std::printf("%-18s %-40s %9.1f %10.1f %8.0f %6.1f%%\n", "flashinfer_decode", config,
                    p.Bytes() / 1e6, med, gbps, 100.0 * gbps / ceiling);
        if (csv != nullptr) {
          std::fprintf(csv, "flashinfer_decode,\"%s\",%.0f,%.2f,%.2f,%.2f,%.1f,%.1f,0\n", config,
                       p.Bytes(), med, lo, hi, gbps, 100.0 * gbps / ceiling);
        }
        p.Free();
      }
    }
  }
}

struct Flags {
  std::string csv;
  bool quick = false, decode = true, prefill = true;
};

// False, after printing the usage, on a flag it does not know.
bool ParseFlags(int argc, char** argv, Flags& f) {
  for (int i = 1; i < argc; ++i) {
    const bool has_value = i + 1 < argc;
    if (std::strcmp(argv[i], "--csv") == 0 && has_value) {
      f.csv = argv[++i];
    } else if (std::strcmp(argv[i], "--quick") == 0) {
      f.quick = true;
    } else if (std::strcmp(argv[i], "--only") == 0 && has_value &&
               (std::strcmp(argv[i + 1], "decode") == 0 ||
                std::strcmp(argv[i + 1], "prefill") == 0)) {
      f.decode = std::strcmp(argv[++i], "decode") == 0;
      f.prefill = !f.decode;
    } else {
      std::fprintf(stderr, "usage: %s [--csv PATH] [--quick] [--only decode|prefill]\n",
                   argv[0]);
      return false;
    }
  }
  return true;
}

int Run(int argc, char** argv) {
  Flags flags;
  if (!ParseFlags(argc, argv, flags)) return 2;
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("SKIP: no CUDA device\n");
    return 0;
  }
  std::mt19937 rng(23);
  bool agree = true;
  if (flags.decode) agree = CrossCheck(rng) && agree;
  if (flags.prefill) agree = CheckFlashInferPrefill(rng) && agree;
  void* flush = DeviceAlloc<void>(kFlushBytes);
  const double ceiling = CopyCeiling(flush);
  std::printf("\nmemcpy D2D 2 GiB: %.0f GB/s (the ceiling for %%copy)\n\n", ceiling);
  FILE* out = flags.csv.empty() ? nullptr : std::fopen(flags.csv.c_str(), "w");
  if (out != nullptr) {
    std::fprintf(out, "kernel,config,bytes,median_us,min_us,max_us,gbps,pct_ceiling,tflops\n");
  }
  if (flags.decode) SweepDecode(flush, ceiling, out, flags.quick, rng);
  if (flags.decode && flags.prefill) std::printf("\n");
  const int failed_rows = flags.prefill ? SweepFlashInferPrefill(flush, ceiling, out, rng) : 0;
  if (out != nullptr) std::fclose(out);
  cudaFree(flush);
  return agree && failed_rows == 0 ? 0 : 1;
}

}  // namespace
}  // namespace kvpage::cuda::peer

int main(int argc, char** argv) { return kvpage::cuda::peer::Run(argc, argv); }
