// FlashInfer's batch prefill (its FA2-style tensor-core kernel, flashinfer/attention/prefill.cuh
// BatchPrefillWithPagedKVCacheDispatched, planned by scheduler.cuh's PrefillPlan) on kvpage's
// paged cache, for kvpage_flashinfer_peer: the cross-check against PagedPrefill and the prefill
// sweep shared with kvpage_gpu_check (prefill_sweep.h). Nothing of FlashInfer is in this
// repository; the API below is the one of the flashinfer-python 0.7.4 wheel's headers.
//
// The cache is kvpage's blocks-first NHD allocation [num_blocks][2][bs][H][D]: FlashInfer reads
// K = base, V = base + bs*H*D, both with page stride 2*bs*H*D, and each sequence's blocks as a
// CSR page list (prefill_sweep.h PrefillBatch). Causal mask, no RoPE, no window: query i of a
// chunk over a prefix of n tokens sees keys [0, n + i], as PagedPrefill's.
#include <cuda_bf16.h>

#include <flashinfer/attention/default_prefill_params.cuh>
#include <flashinfer/attention/mask.cuh>
#include <flashinfer/attention/prefill.cuh>
#include <flashinfer/attention/scheduler.cuh>
#include <flashinfer/attention/variants.cuh>

#include <cmath>
#include <cstdint>
#include <exception>
#include <stdexcept>
#include <string>

#include "kernels/check/flashinfer_peer.h"
#include "kernels/check/prefill_sweep.h"
#include "kvpage/cuda/paged_prefill.h"
#include "kvpage/kernel_layout.h"
#include "kvpage/kernel_reference.h"

namespace kvpage::cuda::peer {
namespace {

using check::kPrefillSweepBlockSize;
using check::kPrefillSweepHeadDim;
using check::kPrefillSweepKvHeads;
using check::PrefillBatch;
using check::PrefillChunk;
using Bf16 = __nv_bfloat16;
using Params = flashinfer::BatchPrefillPagedParams<Bf16, Bf16, Bf16, int32_t>;
using Variant = flashinfer::DefaultAttention</*custom_mask=*/false, /*sliding_window=*/false,
                                             /*logits_soft_cap=*/false, /*alibi=*/false>;
constexpr uint32_t kHeadDim = kPrefillSweepHeadDim;
constexpr int64_t kBlockElems = int64_t{kPrefillSweepBlockSize} * kPrefillSweepKvHeads * kHeadDim;
// PrefillPlan's query tile (FA2DetermineCtaTileQ in flashinfer/utils.cuh) is 128 rows for
// head_dim 128 whenever a sequence averages more than 64 (token, query head) rows, as every
// problem here does; only that instantiation is built, to keep the compile short.
constexpr uint32_t kCtaTileQ = 128;

// One batch on one cache, on the device in both forms.  A measuring tool's owner of raw device
// pointers: Free() releases them.
struct Problem {
  PrefillBatch b;
  int32_t group = 0;
  void* cache = nullptr;
  Bf16 *q = nullptr, *out = nullptr;
  int32_t *table = nullptr, *lens = nullptr, *qsl = nullptr;                 // kvpage's
  int32_t *indptr = nullptr, *indices = nullptr, *last_len = nullptr;       // FlashInfer's
  int64_t cache_bytes = 0;

  void Make(const std::vector<PrefillChunk>& chunks, int32_t g, std::mt19937& rng,
            bool random_values) {
    b = check::MakePrefillBatch(chunks, kPrefillSweepBlockSize, rng);
    group = g;
    table = Upload(b.table), lens = Upload(b.seq_lens), qsl = Upload(b.query_start_loc);
    indptr = Upload(b.page_indptr), indices = Upload(b.page_indices);
    last_len = Upload(b.last_page_len);
    cache_bytes = b.num_blocks * 2 * kBlockElems * 2;
    const size_t q_elems = size_t(b.total_tokens()) * hq() * kHeadDim;
    cache = DeviceAlloc<void>(cache_bytes);
    q = DeviceAlloc<Bf16>(q_elems * 2);
    out = DeviceAlloc<Bf16>(q_elems * 2);
    if (!random_values) {
      PEER_CHECK_CUDA(cudaMemset(cache, 0x3c, cache_bytes));  // small finite bf16 values
      PEER_CHECK_CUDA(cudaMemset(q, 0x3c, q_elems * 2));
      return;
    }
    std::normal_distribution<float> normal;
    std::vector<uint16_t> h(static_cast<size_t>(cache_bytes / 2));
    for (auto& x : h) x = ref::FloatToHalf(normal(rng), DType::kBF16);
    PEER_CHECK_CUDA(cudaMemcpy(cache, h.data(), cache_bytes, cudaMemcpyHostToDevice));
    h.resize(q_elems);
    for (auto& x : h) x = ref::FloatToHalf(normal(rng), DType::kBF16);
    PEER_CHECK_CUDA(cudaMemcpy(q, h.data(), q_elems * 2, cudaMemcpyHostToDevice));
  }
  void Free() {
    for (void* p : {cache, static_cast<void*>(q), static_cast<void*>(out),
                    static_cast<void*>(table), static_cast<void*>(lens), static_cast<void*>(qsl),
                    static_cast<void*>(indptr), static_cast<void*>(indices),
                    static_cast<void*>(last_len)}) {
      cudaFree(p);
    }
  }
  int32_t hq() const { return kPrefillSweepKvHeads * group; }
  size_t out_elems() const { return size_t(b.total_tokens()) * hq() * kHeadDim; }
};

// FlashInfer's plan (made here, outside any timed region) and launch for one problem.
class FlashInferPrefill {
 public:
  explicit FlashInferPrefill(Problem& p) : p_(p) {
    float_ws_ = DeviceAlloc<void>(kFloatWs);
    int_ws_ = DeviceAlloc<void>(kIntWs);
    PEER_CHECK_CUDA(cudaMallocHost(&pinned_, kIntWs));
    PEER_CHECK_CUDA(flashinfer::PrefillPlan<int32_t>(
        float_ws_, kFloatWs, int_ws_, pinned_, kIntWs, info_, p.b.query_start_loc.data(),
        p.b.page_indptr.data(), p.b.total_tokens(), p.b.num_seqs(), p.hq(), kPrefillSweepKvHeads,
        kHeadDim, kHeadDim, kPrefillSweepBlockSize, /*enable_cuda_graph=*/false,
        /*sizeof_dtype_o=*/2, /*window_left=*/-1, /*fixed_split_size=*/-1,
        /*disable_split_kv=*/false, /*num_colocated_ctas=*/0, /*uniform_q_len=*/0,
        /*fixed_uniform_q_len=*/false, nullptr));
    PEER_CHECK_CUDA(cudaDeviceSynchronize());
    if (info_.cta_tile_q != kCtaTileQ) {
      throw std::runtime_error("PrefillPlan chose cta_tile_q " +
                               std::to_string(info_.cta_tile_q) + "; only 128 is built");
    }
  }
  ~FlashInferPrefill() {
    cudaFree(float_ws_);
    cudaFree(int_ws_);
    cudaFreeHost(pinned_);
  }
  FlashInferPrefill(const FlashInferPrefill&) = delete;
  FlashInferPrefill& operator=(const FlashInferPrefill&) = delete;

  bool split() const { return info_.split_kv; }
  int64_t cta_tile_q() const { return info_.cta_tile_q; }

  cudaError_t Run() {
    Params params = MakeParams();
    Bf16* tmp_v = nullptr;
    float* tmp_s = nullptr;
    if (info_.split_kv) {
      char* fb = static_cast<char*>(float_ws_);
      params.merge_indptr = IntWs(info_.merge_indptr_offset);
      tmp_v = reinterpret_cast<Bf16*>(fb + info_.v_offset);
      tmp_s = reinterpret_cast<float*>(fb + info_.s_offset);
    }
    return flashinfer::BatchPrefillWithPagedKVCacheDispatched<
        /*SAME_KV_STRIDES=*/true, kCtaTileQ, kHeadDim, kHeadDim, flashinfer::PosEncodingMode::kNone,
        /*USE_FP16_QK_REDUCTION=*/false, flashinfer::MaskMode::kCausal,
        /*USE_TOKEN_HEAD_SF=*/false, Variant, Params>(params, tmp_v, tmp_s,
                                                        /*enable_pdl=*/true, nullptr);
  }

 private:
  int32_t* IntWs(int64_t offset) const {
    return reinterpret_cast<int32_t*>(static_cast<char*>(int_ws_) + offset);
  }

  Params MakeParams() const {
    // page (K and V of a block), token, head.
    const int64_t strides[3] = {2 * kBlockElems, kPrefillSweepKvHeads * kHeadDim, kHeadDim};
    auto* k = static_cast<Bf16*>(p_.cache);
    Params params;
    params.q = p_.q;
    params.paged_kv = flashinfer::paged_kv_t<Bf16, int32_t>(
        kPrefillSweepKvHeads, kPrefillSweepBlockSize, kHeadDim, p_.b.num_seqs(),
        flashinfer::QKVLayout::kNHD, k, k + kBlockElems, strides, strides, p_.indices,
        p_.indptr, p_.last_len);
    params.q_indptr = p_.qsl;
    params.o = p_.out;
    params.group_size = flashinfer::uint_fastdiv(static_cast<uint32_t>(p_.group));
    params.num_qo_heads = p_.hq();
    params.q_stride_n = p_.hq() * kHeadDim;
    params.q_stride_h = kHeadDim;
    params.window_left = -1;
    params.sm_scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
    params.rope_rcp_scale = 1.0f;
    params.rope_rcp_theta = 1.0f / 1e4f;
    params.request_indices = IntWs(info_.request_indices_offset);
    params.qo_tile_indices = IntWs(info_.qo_tile_indices_offset);
    params.kv_tile_indices = IntWs(info_.kv_tile_indices_offset);
    params.o_indptr = IntWs(info_.o_indptr_offset);
    params.kv_chunk_size_ptr = IntWs(info_.kv_chunk_size_ptr_offset);
    params.padded_batch_size = static_cast<uint32_t>(info_.padded_batch_size);
    params.max_total_num_rows = static_cast<uint32_t>(info_.total_num_rows);
    return params;
  }

  static constexpr size_t kFloatWs = size_t{256} << 20, kIntWs = size_t{8} << 20;
  Problem& p_;
  void *float_ws_ = nullptr, *int_ws_ = nullptr, *pinned_ = nullptr;
  flashinfer::PrefillPlanInfo info_;
};

// kvpage's PagedPrefill (tiled, tensor cores) into p.out.
absl::Status RunKvpage(const Problem& p) {
  DecodePlan plan;
  plan.use_tensor_cores = true;
  const int64_t ws_bytes = PrefillWorkspaceBytes(plan, p.b.total_tokens(), p.hq(), kHeadDim);
  void* ws = DeviceAlloc<void>(static_cast<size_t>(ws_bytes));
  const KvCacheView view = BlocksFirstKvCache(p.cache, p.b.num_blocks, kPrefillSweepBlockSize,
                                              kPrefillSweepKvHeads, kHeadDim, DType::kBF16);
  const DecodeParams params{p.hq(), 1.0f / std::sqrt(static_cast<float>(kHeadDim)), -1};
  const absl::Status s = PagedPrefill(
      p.out, p.q, int64_t{p.hq()} * kHeadDim, p.qsl, p.b.total_tokens(), view,
      {p.table, p.b.max_blocks, p.lens, p.b.num_seqs()}, params, plan, ws, ws_bytes, nullptr);
  PEER_CHECK_CUDA(cudaDeviceSynchronize());
  cudaFree(ws);
  return s;
}

std::vector<uint16_t> Download(const Problem& p) {
  std::vector<uint16_t> h(p.out_elems());
  PEER_CHECK_CUDA(cudaMemcpy(h.data(), p.out, h.size() * 2, cudaMemcpyDeviceToHost));
  return h;
}

// The largest |fi - kv|, and in *bad how many exceed 2e-2 + 2e-2·|kv|: each bf16 output is
// within 1e-2 + 1e-2·|exact| of the exact value (kvpage_gpu_check's bound for PagedPrefill
// against the CPU reference), so two kernels differ by at most about twice that.
double CompareOutputs(const std::vector<uint16_t>& fi, const std::vector<uint16_t>& kv,
                      int64_t* bad) {
  double max_diff = 0;
  *bad = 0;
  for (size_t i = 0; i < fi.size(); ++i) {
    const double want = ref::HalfToFloat(kv[i], DType::kBF16);
    const double d = std::fabs(ref::HalfToFloat(fi[i], DType::kBF16) - want);
    if (!(d <= 2e-2 + 2e-2 * std::fabs(want))) ++*bad;  // NaN counts as bad
    max_diff = std::isnan(d) ? INFINITY : std::max(max_diff, d);
  }
  return max_diff;
}

// One cross-check problem on both kernels; false (and a FAIL line) if they disagree.
bool CheckOne(int32_t group, std::mt19937& rng) {
  // A whole prompt, a chunk over a prefix that ends mid-block, a chunk starting on a block edge.
  const std::vector<PrefillChunk> chunks = {{0, 300}, {700, 129}, {1024, 77}};
  Problem p;
  p.Make(chunks, group, rng, /*random_values=*/true);
  FlashInferPrefill fi(p);
  PEER_CHECK_CUDA(fi.Run());
  PEER_CHECK_CUDA(cudaDeviceSynchronize());
  const std::vector<uint16_t> got = Download(p);
  const absl::Status s = RunKvpage(p);
  int64_t bad = 0;
  const double max_diff = CompareOutputs(got, Download(p), &bad);
  const bool pass = s.ok() && bad == 0;
  std::printf("%-4s flashinfer prefill vs kvpage, bf16 G=%d, chunks 300/129/77 over 0/700/1024 "
              "(cta_tile_q %lld%s): max |diff| %.3g, %lld outside tolerance%s\n",
              pass ? "PASS" : "FAIL", group, static_cast<long long>(fi.cta_tile_q()),
              fi.split() ? ", split" : "", max_diff, static_cast<long long>(bad),
              s.ok() ? "" : (" (" + std::string(s.message()) + ")").c_str());
  p.Free();
  return pass;
}

}  // namespace

bool CheckFlashInferPrefill(std::mt19937& rng) {
  bool ok = true;
  for (int32_t group : {4, 8}) {
    try {
      ok = CheckOne(group, rng) && ok;
    } catch (const std::exception& e) {
      std::printf("FAIL flashinfer prefill G=%d: %s\n", group, e.what());
      ok = false;
    }
  }
  return ok;
}

int SweepFlashInferPrefill(void* flush, double ceiling, FILE* csv, std::mt19937& rng) {
  std::printf("%-19s %-52s %9s %10s %8s %8s\n", "kernel", "config", "GFLOP", "median_us",
              "TFLOP/s", "GB/s");
  int failures = 0;
  for (const check::PrefillSweepCase& c : check::PrefillSweepCases()) {
    Problem p;
    p.Make(std::vector<PrefillChunk>(c.seqs, {c.prefix, c.chunk}), c.group, rng,
           /*random_values=*/false);
    const std::string config = check::PrefillSweepConfig(c);
    try {
      FlashInferPrefill fi(p);
      double med, lo, hi;
      Time([&] { return fi.Run(); }, flush, &med, &lo, &hi);
      const double flops = check::PrefillSweepFlops(c), bytes = check::PrefillSweepBytes(c);
      const double tflops = flops / (med * 1e6), gbps = bytes / (med * 1e3);
      std::printf("%-19s %-52s %9.1f %10.1f %8.1f %8.0f%s\n", "flashinfer_prefill",
                  config.c_str(), flops / 1e9, med, tflops, gbps, fi.split() ? " split" : "");
      if (csv != nullptr) {
        std::fprintf(csv, "flashinfer_prefill,\"%s\",%.0f,%.2f,%.2f,%.2f,%.1f,%.1f,%.1f\n",
                     config.c_str(), bytes, med, lo, hi, gbps,
                     ceiling > 0 ? 100.0 * gbps / ceiling : 0, tflops);
      }
    } catch (const std::exception& e) {
      std::printf("FAIL flashinfer_prefill %s: %s\n", config.c_str(), e.what());
      ++failures;
    }
    p.Free();
  }
  return failures;
}

}  // namespace kvpage::cuda::peer
