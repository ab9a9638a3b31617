// Tensor-core paged decode (mma.sync m16n8k16, bf16/f16 in, fp32 accumulate): the path
// PagedDecode takes with plan.use_tensor_cores, or by itself for GQA >= 2
// (UseDecodeTensorCores). Same arguments, grid and outputs as PagedDecodeKernel
// (paged_decode_kernel.cuh), which stays the reference (plan.force_cuda_cores).
//
// Design:
// - CTA = 256 / head_dim warps (4, 2, 1 for D = 64, 128, 256), so the pipeline buffers are
//   32 KiB whatever D; grid (kv_head x head tile, sequence, split); a head tile holds up to 8
//   query heads of one KV head (the GQA group padded to 8), so each K/V row is read once.
// - Each warp walks its own 16-token steps of the split: steps w, w + warps, ... of the
//   16-aligned tiling of the range, so a step never straddles a block (block_size % 16 == 0)
//   and needs one table read, made when the step's copies are issued, a step ahead.
// - Per step: S = Q K^T with Q as the A operand (rows = heads 0..7, rows 8..15 zero) and K as B,
//   D/8 mma; the online softmax runs once per head row on 4 values per lane and two quad
//   shuffles; P's C fragment is exactly the B fragment of P^T, so O^T = V^T P^T (m = head_dim,
//   n = 8 heads, k = 16 tokens) takes D/16 mma with V^T read by ldmatrix.trans. O^T lives in
//   D/4 fp32 registers a lane, with no padded rows.
// - K/V steps are double-buffered per warp with cp.async (zero fill for tokens outside the
//   range, so garbage or NaN past seq_len never reaches an mma), and only __syncwarp inside
//   the loop. Shared rows are XOR-swizzled by 16-byte chunk (chunk c of token r at c ^ (r & 7))
//   so ldmatrix's eight row reads hit eight different bank groups.
// - At the end the warps' states (m, l, O) meet in the same shared memory, as in the CUDA-core
//   kernel, and the merged rows are stored (or written as split-KV partials).
//
// Layouts: q, out [num_seqs][num_q_heads][head_dim]; cache blocks-first NHD through the strides
// in DecodeArgs; shared memory [warp][stage][K|V][16 tokens][head_dim / 8 chunks of 16 B].
#ifndef KVPAGE_KERNELS_PAGED_DECODE_MMA_KERNEL_CUH_
#define KVPAGE_KERNELS_PAGED_DECODE_MMA_KERNEL_CUH_

#include <cstdint>

#include "kernels/grid_dependency.cuh"
#include "kernels/mma.cuh"
#include "kernels/paged_decode_kernel.cuh"
#include "kernels/vec.cuh"
#include "kvpage/kernel_layout.h"

namespace kvpage::cuda::internal {

constexpr int kMmaStepTokens = 16;  // the k of the P.V mma
constexpr int kMmaHeads = 8;        // query heads a CTA holds (the n of the P.V mma)
constexpr int kMmaStages = 2;

template <typename T, int kHeadDim>
__global__ void __launch_bounds__(MmaDecodeThreads(kHeadDim))
    PagedDecodeMmaKernel(const DecodeArgs a) {
  constexpr int kWarps = 256 / kHeadDim;
  constexpr int kChunks = kHeadDim / 8;       // 16-byte chunks of a token row
  constexpr int kSteps = kHeadDim / 16;       // k steps of S, m tiles of O^T
  constexpr int kRowBytes = kHeadDim * 2;
  constexpr int kTileBytes = kMmaStepTokens * kRowBytes;  // K or V of one step
  constexpr int kLaneCopies = kMmaStepTokens * kChunks / 32;
  static_assert(kChunks >= 8 && kLaneCopies >= 1);
  __shared__ __align__(128) uint4 smem[kWarps * kMmaStages * 2 * kTileBytes / 16];
  char* const smem_bytes = reinterpret_cast<char*>(smem);

  const int32_t kv_head = blockIdx.x / a.head_tiles;
  const int32_t tile = blockIdx.x % a.head_tiles;
  const int32_t seq = blockIdx.y;
  const int32_t split = blockIdx.z;
  const int32_t head0 = kv_head * a.group_size + tile * kMmaHeads;
  const int32_t heads_here = min(kMmaHeads, a.group_size - tile * kMmaHeads);
  const int32_t warp = threadIdx.x / 32;
  const int32_t lane = threadIdx.x % 32;
  const int32_t g = lane / 4, q = lane % 4;

  // Q as the A operand: a0/a2 of each k step for head row g; rows 8..15 (a1/a3) are zero.
  uint32_t qa[kSteps][2];
  {
    const T* q_row = static_cast<const T*>(a.q) + seq * a.q_seq_stride + (head0 + g) * kHeadDim;
#pragma unroll
    for (int ks = 0; ks < kSteps; ++ks) {
      qa[ks][0] = g < heads_here ? *reinterpret_cast<const uint32_t*>(q_row + 16 * ks + 2 * q) : 0;
      qa[ks][1] =
          g < heads_here ? *reinterpret_cast<const uint32_t*>(q_row + 16 * ks + 8 + 2 * q) : 0;
    }
  }

  const TokenRange range = SplitRange(AttendedRange(a.seq_lens[seq], a.window_left),
                                      a.chunk_tokens, split, a.num_splits);
  const int32_t first_step = range.begin / kMmaStepTokens;
  const int32_t num_steps =
      range.end > range.begin ? (range.end + kMmaStepTokens - 1) / kMmaStepTokens - first_step
                              : 0;
  const int32_t my_steps = num_steps > warp ? (num_steps - warp + kWarps - 1) / kWarps : 0;
  const int32_t* table_row =
      a.table + (a.table_rows != nullptr ? a.table_rows[seq] : seq) * a.row_stride;
  const T* cache = static_cast<const T*>(a.cache) + kv_head * a.head_stride;

  // Issues the cp.async copies of this warp's i-th step into `stage`.
  auto issue = [&](int32_t i, int32_t stage) {
    const int32_t start = (first_step + warp + i * kWarps) * kMmaStepTokens;
    const int64_t block = __ldg(table_row + start / a.block_size);
    const T* rows = cache + block * a.block_stride + (start % a.block_size) * a.token_stride;
    char* k_dst = smem_bytes + ((warp * kMmaStages + stage) * 2) * kTileBytes;
#pragma unroll
    for (int c = 0; c < kLaneCopies; ++c) {
      const int32_t e = lane + 32 * c;
      const int32_t r = e / kChunks, chunk = e % kChunks;
      const int32_t t = start + r;
      const bool valid = t >= range.begin && t < range.end;
      const T* src = rows + r * a.token_stride + chunk * 8;
      const int32_t at = r * kRowBytes + ((chunk ^ (r & 7)) * 16);
      CpAsync16(k_dst + at, src, valid);
      CpAsync16(k_dst + kTileBytes + at, src + a.kv_stride, valid);
    }
  };

  float o[kSteps][4];  // O^T: o[mt][i] = O[head 2q + i % 2][dim 16 mt + g + 8 (i / 2)]
#pragma unroll
  for (int mt = 0; mt < kSteps; ++mt) {
#pragma unroll
    for (int i = 0; i < 4; ++i) o[mt][i] = 0.0f;
  }
  float m_run = -INFINITY;  // of head row g (log2 domain), the same in the lane's quad
  float l_part = 0.0f;      // this lane's part of head g's sum

  // ldmatrix row address of this lane in a [16 tokens][kChunks] tile, for chunk pair `pair`.
  const int32_t ld_row = (lane & 7) + ((lane >> 4) << 3);
  const int32_t ld_half = (lane >> 3) & 1;

  if (my_steps > 0) issue(0, 0);
  CpAsyncCommit();
  for (int32_t i = 0; i < my_steps; ++i) {
    if (i + 1 < my_steps) issue(i + 1, (i + 1) % kMmaStages);
    CpAsyncCommit();
    CpAsyncWait<1>();
    __syncwarp();
    const char* k_tile = smem_bytes + ((warp * kMmaStages + i % kMmaStages) * 2) * kTileBytes;
    const char* v_tile = k_tile + kTileBytes;
    const int32_t start = (first_step + warp + i * kWarps) * kMmaStepTokens;

    // S = Q K^T: s[j] holds head g's scores of tokens 8j + 2q, 8j + 2q + 1 (s[j][2..3]: pad).
    float s[2][4] = {{0, 0, 0, 0}, {0, 0, 0, 0}};
#pragma unroll
    for (int ks = 0; ks < kSteps; ++ks) {
      uint32_t kb[4];
      const int32_t chunk = 2 * ks + ld_half;
      LdMatrixX4(kb, k_tile + ld_row * kRowBytes + ((chunk ^ (ld_row & 7)) * 16));
      const uint32_t qa4[4] = {qa[ks][0], 0u, qa[ks][1], 0u};
      const uint32_t b0[2] = {kb[0], kb[1]};
      const uint32_t b1[2] = {kb[2], kb[3]};
      Mma16816<T>(s[0], qa4, b0);
      Mma16816<T>(s[1], qa4, b1);
    }

    // Online softmax of head row g over the step's 16 tokens (4 here, 12 in the quad).
    float m_new = m_run;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int32_t t = start + 8 * j + 2 * q + h;
        s[j][h] = t >= range.begin && t < range.end ? s[j][h] * a.scale_log2 : -INFINITY;
        m_new = fmaxf(m_new, s[j][h]);
      }
    }
    m_new = fmaxf(m_new, __shfl_xor_sync(0xffffffffu, m_new, 1));
    m_new = fmaxf(m_new, __shfl_xor_sync(0xffffffffu, m_new, 2));
    const bool empty = m_new == -INFINITY;
    const float corr = empty ? 1.0f : exp2f(m_run - m_new);
    float p[2][2];
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        p[j][h] = empty ? 0.0f : exp2f(s[j][h] - m_new);
        sum += p[j][h];
      }
    }
    l_part = l_part * corr + sum;
    m_run = m_new;

    // O^T columns are heads 2q and 2q + 1, whose factors live in quads 2q and 2q + 1.
    const float corr0 = __shfl_sync(0xffffffffu, corr, 8 * q);
    const float corr1 = __shfl_sync(0xffffffffu, corr, 8 * q + 4);
    // P's C fragment is P^T's B fragment: b0 = tokens 2q, 2q + 1; b1 = tokens 8 + 2q, 9 + 2q.
    const uint32_t pb[2] = {PackPair<T>(p[0][0], p[0][1]), PackPair<T>(p[1][0], p[1][1])};
#pragma unroll
    for (int mt = 0; mt < kSteps; ++mt) {
      o[mt][0] *= corr0;
      o[mt][1] *= corr1;
      o[mt][2] *= corr0;
      o[mt][3] *= corr1;
      uint32_t va[4];
      const int32_t chunk = 2 * mt + ld_half;
      LdMatrixX4Trans(va, v_tile + ld_row * kRowBytes + ((chunk ^ (ld_row & 7)) * 16));
      Mma16816<T>(o[mt], va, pb);
    }
    __syncwarp();  // every lane is done with this stage before it is refilled
  }
  CpAsyncWait<0>();
  l_part += __shfl_xor_sync(0xffffffffu, l_part, 1);
  l_part += __shfl_xor_sync(0xffffffffu, l_part, 2);

  // The warps meet in the pipeline buffers: m and l [warp][head], O [warp][head][dim].
  __syncthreads();
  float* const ms = reinterpret_cast<float*>(smem);
  float* const ls = ms + kWarps * kMmaHeads;
  float* const os = ls + kWarps * kMmaHeads;
  if (q == 0) {
    ms[warp * kMmaHeads + g] = m_run;
    ls[warp * kMmaHeads + g] = l_part;
  }
#pragma unroll
  for (int mt = 0; mt < kSteps; ++mt) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int32_t head = 2 * q + i % 2, dim = 16 * mt + g + 8 * (i / 2);
      os[(warp * kMmaHeads + head) * kHeadDim + dim] = o[mt][i];
    }
  }
  __syncthreads();

  for (int32_t task = threadIdx.x; task < kMmaHeads * kChunks; task += 32 * kWarps) {
    const int32_t head = task / kChunks, chunk = task % kChunks;
    if (head >= heads_here) continue;
    float m = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) m = fmaxf(m, ms[w * kMmaHeads + head]);
    float l = 0.0f, out[8] = {0, 0, 0, 0, 0, 0, 0, 0};
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float m_w = ms[w * kMmaHeads + head];
      const float f = m_w == -INFINITY ? 0.0f : exp2f(m_w - m);
      l += f * ls[w * kMmaHeads + head];
      const float* src = os + (w * kMmaHeads + head) * kHeadDim + chunk * 8;
#pragma unroll
      for (int d = 0; d < 8; ++d) out[d] += f * src[d];
    }
    const float inv_l = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
    for (int d = 0; d < 8; ++d) out[d] *= inv_l;
    const int64_t row = static_cast<int64_t>(seq) * a.num_q_heads + head0 + head;
    if (a.ws_o == nullptr) {
      *reinterpret_cast<uint4*>(static_cast<T*>(a.out) + row * kHeadDim + chunk * 8) =
          Pack8<T>(out);
    } else {
      float4* dst = reinterpret_cast<float4*>(a.ws_o + (row * a.num_splits + split) * kHeadDim +
                                              chunk * 8);
      dst[0] = make_float4(out[0], out[1], out[2], out[3]);
      dst[1] = make_float4(out[4], out[5], out[6], out[7]);
      if (chunk == 0) {
        a.ws_lse[row * a.num_splits + split] = l > 0.0f ? (m + __log2f(l)) * kLn2 : -INFINITY;
      }
    }
  }
  TriggerDependentGrids();  // after this thread's last store: the merge may be scheduled
}

// Whether PagedDecode would take this kernel when the plan forces neither path: a GQA group
// of at least 2 (with one query head per KV head the CUDA-core kernel also reads each row
// once, with no padded mma rows), a kernel that exists (f16/bf16 cache, head_dim 64, 128 or
// 256, block_size a multiple of 16) and sm_80-class tensor cores (cc_major >= 8).
inline bool AutoDecodeTensorCores(DType cache_dtype, int32_t head_dim, int32_t group_size,
                                  int32_t block_size, int32_t cc_major) {
  const bool dtype_ok = cache_dtype == DType::kBF16 || cache_dtype == DType::kF16;
  const bool dim_ok = head_dim == 64 || head_dim == 128 || head_dim == 256;
  return cc_major >= 8 && group_size >= 2 && dtype_ok && dim_ok &&
         block_size % kMmaStepTokens == 0;
}

// The kernel PagedDecode runs: forced by plan.use_tensor_cores or plan.force_cuda_cores,
// otherwise AutoDecodeTensorCores. REQUIRES: a validated view (num_kv_heads > 0).
inline bool UseDecodeTensorCores(const KvCacheView& cache, const DecodeParams& params,
                                 const DecodePlan& plan, int32_t cc_major) {
  if (plan.use_tensor_cores || plan.force_cuda_cores) return plan.use_tensor_cores;
  return AutoDecodeTensorCores(cache.dtype, cache.head_dim,
                               params.num_q_heads / cache.num_kv_heads, cache.block_size,
                               cc_major);
}

}  // namespace kvpage::cuda::internal

#endif  // KVPAGE_KERNELS_PAGED_DECODE_MMA_KERNEL_CUH_
