// Absorbed MLA decode kernel body (the DeepSeek shape: a 576-value latent row per token, 512
// latent + 64 rope; include/kvpage/cuda/paged_decode.h, PagedDecodeMla).
//
// Design (CUDA cores, first version):
// - Every query head attends to the same latent row, so a CTA holds kMlaHeadTile query heads
//   and reads each row once for all of them. Grid (head tiles, sequence, split), 4 warps.
// - A warp takes one token at a time (warp w: tokens begin + w, + 4, ...). Its 32 lanes hold
//   the row as 16-byte vectors: lane l owns values [8l, 8l + 8) and [256 + 8l, ...) of the
//   latent part (K and V at once: V is the latent part of the same row, loaded once), and
//   lanes 0-7 also [512 + 8l, ...) of the rope part (K only).
// - Scores: per-lane partial dots, summed with 5 butterfly shuffles; fp32 online softmax in
//   the log2 domain, identical in every lane of the warp; the 4 warps merge through shared
//   memory at the end. Split-KV writes (o, lse) partials exactly as PagedDecodeKernel does,
//   so MergeKernel combines them.
// - As PagedDecodeKernel: only AttendedRange ∩ split is looked up and loaded.
//
// Device code only; the launcher is in paged_decode_mla.cu. Also compiled on the host against
// kernels/emulation/cuda_emulation.h (tests/kernels).
#ifndef KVPAGE_KERNELS_PAGED_DECODE_MLA_KERNEL_CUH_
#define KVPAGE_KERNELS_PAGED_DECODE_MLA_KERNEL_CUH_

#include <cstdint>

#include "kernels/grid_dependency.cuh"
#include "kernels/paged_decode_kernel.cuh"
#include "kernels/vec.cuh"
#include "kvpage/kernel_layout.h"

namespace kvpage::cuda::internal {

constexpr int kMlaLatentDim = 512;
constexpr int kMlaRopeDim = 64;
constexpr int kMlaRowDim = kMlaLatentDim + kMlaRopeDim;
constexpr int kMlaHeadTile = MlaDecodeHeadTile(1, false);  // query heads a CTA holds (4)

template <typename T>
__global__ void __launch_bounds__(kDecodeThreads) PagedDecodeMlaKernel(const DecodeArgs a) {
  constexpr int kVec = kHalvesPerVec;
  constexpr int kG = kMlaHeadTile;
  constexpr int kLatentVecs = kMlaLatentDim / kVec / 32;  // 2 latent vectors a lane
  constexpr int kRopeLanes = kMlaRopeDim / kVec;          // lanes 0-7 hold a rope vector
  static_assert(kLatentVecs == 2 && kRopeLanes <= 32);

  __shared__ float smem_acc[kDecodeWarps][kG][kMlaLatentDim];
  __shared__ float smem_m[kDecodeWarps][kG];
  __shared__ float smem_l[kDecodeWarps][kG];

  const int32_t head0 = blockIdx.x * kG;
  const int32_t heads_here = min(kG, a.num_q_heads - head0);
  const int32_t seq = blockIdx.y;
  const int32_t split = blockIdx.z;
  const int32_t lane = threadIdx.x % 32;
  const int32_t warp = threadIdx.x / 32;
  const bool rope_lane = lane < kRopeLanes;
  // Offsets of this lane's vectors within a row: two latent, one rope (lanes 0-7).
  const int32_t off0 = lane * kVec;
  const int32_t off1 = (32 + lane) * kVec;
  const int32_t off2 = kMlaLatentDim + (rope_lane ? lane : 0) * kVec;

  // This lane's query slices, pre-scaled into the log2 domain; zeros for heads past the
  // tile's end and for the rope slice of lanes 8-31.
  float q[kG][3][kVec];
  const T* q_seq = static_cast<const T*>(a.q) + seq * a.q_seq_stride;
#pragma unroll
  for (int g = 0; g < kG; ++g) {
#pragma unroll
    for (int j = 0; j < 3; ++j) {
#pragma unroll
      for (int i = 0; i < kVec; ++i) q[g][j][i] = 0.0f;
    }
    if (g >= heads_here) continue;
    const T* qh = q_seq + static_cast<int64_t>(head0 + g) * kMlaRowDim;
    Unpack8<T>(LoadVec(qh + off0), q[g][0]);
    Unpack8<T>(LoadVec(qh + off1), q[g][1]);
    if (rope_lane) Unpack8<T>(LoadVec(qh + off2), q[g][2]);
#pragma unroll
    for (int j = 0; j < 3; ++j) {
#pragma unroll
      for (int i = 0; i < kVec; ++i) q[g][j][i] *= a.scale_log2;
    }
  }
  float m[kG], l[kG], acc[kG][2][kVec];
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
#pragma unroll
    for (int i = 0; i < kVec; ++i) acc[g][0][i] = acc[g][1][i] = 0.0f;
  }

  const TokenRange range = SplitRange(AttendedRange(a.seq_lens[seq], a.window_left),
                                      a.chunk_tokens, split, a.num_splits);
  const int32_t* table_row = a.table + seq * a.row_stride;
  const T* cache = static_cast<const T*>(a.cache);
  // All lanes of a warp share the token, so the shuffles always see full warps.
  for (int32_t t = range.begin + warp; t < range.end; t += kDecodeWarps) {
    const int32_t block = __ldg(table_row + t / a.block_size);
    const T* row = cache + block * a.block_stride + (t % a.block_size) * a.token_stride;
    float k0[kVec], k1[kVec], k2[kVec];
    Unpack8<T>(LoadVec(row + off0), k0);
    Unpack8<T>(LoadVec(row + off1), k1);
    const uint4 rope_raw = rope_lane ? LoadVec(row + off2) : make_uint4(0, 0, 0, 0);
    Unpack8<T>(rope_raw, k2);
#pragma unroll
    for (int g = 0; g < kG; ++g) {
      float dot = 0.0f;
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        dot = fmaf(q[g][0][i], k0[i], dot);
        dot = fmaf(q[g][1][i], k1[i], dot);
        dot = fmaf(q[g][2][i], k2[i], dot);
      }
#pragma unroll
      for (int off = 16; off > 0; off /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, off);
      const float m_new = fmaxf(m[g], dot);
      const float corr = exp2f(m[g] - m_new);  // 0 on the first token (m = -inf)
      const float p = exp2f(dot - m_new);
      l[g] = l[g] * corr + p;
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        acc[g][0][i] = fmaf(p, k0[i], acc[g][0][i] * corr);
        acc[g][1][i] = fmaf(p, k1[i], acc[g][1][i] * corr);
      }
      m[g] = m_new;
    }
  }

  // Merge the warps through shared memory; warp 0 finishes and stores.
#pragma unroll
  for (int g = 0; g < kG; ++g) {
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      smem_acc[warp][g][off0 + i] = acc[g][0][i];
      smem_acc[warp][g][off1 + i] = acc[g][1][i];
    }
    if (lane == 0) {
      smem_m[warp][g] = m[g];
      smem_l[warp][g] = l[g];
    }
  }
  __syncthreads();
  if (warp != 0) return;
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    float m_all = m[g];
#pragma unroll
    for (int w = 1; w < kDecodeWarps; ++w) m_all = fmaxf(m_all, smem_m[w][g]);
    float l_all = 0.0f;
    float o0[kVec], o1[kVec];
#pragma unroll
    for (int i = 0; i < kVec; ++i) o0[i] = o1[i] = 0.0f;
#pragma unroll
    for (int w = 0; w < kDecodeWarps; ++w) {
      const float m_w = w == 0 ? m[g] : smem_m[w][g];
      const float c = m_all == -INFINITY || m_w == -INFINITY ? 0.0f : exp2f(m_w - m_all);
      l_all += (w == 0 ? l[g] : smem_l[w][g]) * c;
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        o0[i] += c * smem_acc[w][g][off0 + i];
        o1[i] += c * smem_acc[w][g][off1 + i];
      }
    }
    if (g >= heads_here) break;
    const float inv_l = l_all > 0.0f ? 1.0f / l_all : 0.0f;
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      o0[i] *= inv_l;
      o1[i] *= inv_l;
    }
    const int64_t out_row = static_cast<int64_t>(seq) * a.num_q_heads + head0 + g;
    if (a.ws_o == nullptr) {
      T* dst = static_cast<T*>(a.out) + out_row * kMlaLatentDim;
      *reinterpret_cast<uint4*>(dst + off0) = Pack8<T>(o0);
      *reinterpret_cast<uint4*>(dst + off1) = Pack8<T>(o1);
    } else {
      float* dst = a.ws_o + (out_row * a.num_splits + split) * kMlaLatentDim;
      float4* d0 = reinterpret_cast<float4*>(dst + off0);
      float4* d1 = reinterpret_cast<float4*>(dst + off1);
      d0[0] = make_float4(o0[0], o0[1], o0[2], o0[3]);
      d0[1] = make_float4(o0[4], o0[5], o0[6], o0[7]);
      d1[0] = make_float4(o1[0], o1[1], o1[2], o1[3]);
      d1[1] = make_float4(o1[4], o1[5], o1[6], o1[7]);
      if (lane == 0) {
        a.ws_lse[out_row * a.num_splits + split] =
            l_all > 0.0f ? (m_all + __log2f(l_all)) * kLn2 : -INFINITY;
      }
    }
  }
  TriggerDependentGrids();  // after this thread's last store: the merge may be scheduled
}

// Kernel arguments and grid of one PagedDecodeMla call, shared by the launcher and the host
// emulation test. REQUIRES: arguments already validated by PagedDecodeMla.
inline DecodeLaunch MakeMlaDecodeLaunch(void* out, const void* q, int64_t q_seq_stride,
                                        const KvCacheView& cache, const BlockTableView& table,
                                        const DecodeParams& params, const DecodePlan& plan,
                                        void* workspace) {
  DecodeLaunch l = MakeDecodeLaunch(out, q, q_seq_stride, cache, table, params, plan, workspace);
  const int32_t tiles = MlaDecodeHeadTiles(params.num_q_heads, /*tensor_cores=*/false);
  l.args.head_tiles = tiles;
  const int64_t partial_rows =
      static_cast<int64_t>(table.num_seqs) * params.num_q_heads * plan.num_splits;
  l.args.ws_lse = plan.num_splits == 1 ? nullptr : l.args.ws_o + partial_rows * kMlaLatentDim;
  l.group_tile = kMlaHeadTile;
  l.tensor_cores = false;
  l.threads = kDecodeThreads;
  l.grid[0] = static_cast<unsigned int>(tiles);
  return l;
}

}  // namespace kvpage::cuda::internal

#endif  // KVPAGE_KERNELS_PAGED_DECODE_MLA_KERNEL_CUH_
