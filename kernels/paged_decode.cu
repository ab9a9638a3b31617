// paged_decode: one query token per sequence over the blocks-first paged cache
// (include/kvpage/cuda/paged_decode.h).
//
// Design (CUDA cores, FlashInfer-style GQA grouping):
// - CTA = 4 warps; grid (kv_head x head_tile, sequence, split). The CTA holds kGroupTile query
//   heads of one KV head, so each K/V row is loaded once and used kGroupTile times.
// - head_dim is spread over kLanes = head_dim / 8 lanes, each holding one 16-byte vector
//   (8 values) of a token's K and V row; a warp therefore works on 32 / kLanes tokens at a
//   time and the CTA on kGroups = 128 / kLanes tokens. Each lane group unrolls kUnroll tokens
//   so 2 * kUnroll independent 16-byte loads are in flight per thread.
// - Scores are fp32 with log2(e) folded into the scale (exp2f); every lane group keeps its own
//   online-softmax state (m, l, acc), merged at the end across groups (shuffles) and warps
//   (shared memory).
// - The loop runs over AttendedRange ∩ this split only: tokens before a sliding window are
//   never touched, and their table entries are never read. Tokens past seq_len are not loaded,
//   so garbage (even NaN) in the tail of the last block cannot reach the output.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cuda_status.h"
#include "kernels/vec.cuh"
#include "kvpage/cuda/paged_decode.h"

namespace kvpage::cuda {
namespace {

using internal::kHalvesPerVec;
using internal::LoadVec;
using internal::Pack8;
using internal::Unpack8;

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

struct DecodeArgs {
  void* out;       // [num_seqs][num_q_heads][head_dim]
  const void* q;   // [num_seqs][num_q_heads][head_dim], seq stride q_seq_stride
  int64_t q_seq_stride;
  const void* cache;
  int64_t block_stride;
  int64_t kv_stride;
  int64_t token_stride;
  int64_t head_stride;
  const int32_t* table;
  int64_t row_stride;
  const int32_t* seq_lens;
  int32_t block_size;
  int32_t num_q_heads;
  int32_t group_size;  // query heads per KV head
  int32_t head_tiles;
  float scale_log2;    // softmax scale * log2(e)
  int32_t window_left;
  int32_t num_splits;
  int32_t chunk_tokens;
  float* ws_o;         // [num_seqs][num_q_heads][num_splits][head_dim]; null if num_splits == 1
  float* ws_lse;       // [num_seqs][num_q_heads][num_splits]
};

// Merges the online-softmax state (m_b, l_b, acc_b) into (m, l, acc).
template <int kN>
__device__ __forceinline__ void MergeState(float& m, float& l, float* acc, float m_b, float l_b,
                                           const float* acc_b) {
  const float m_new = fmaxf(m, m_b);
  const float c_a = m_new == -INFINITY ? 0.0f : exp2f(m - m_new);
  const float c_b = m_new == -INFINITY ? 0.0f : exp2f(m_b - m_new);
  l = l * c_a + l_b * c_b;
#pragma unroll
  for (int i = 0; i < kN; ++i) acc[i] = acc[i] * c_a + acc_b[i] * c_b;
  m = m_new;
}

template <typename T, int kHeadDim, int kGroupTile>
__global__ void __launch_bounds__(kThreads) PagedDecodeKernel(const DecodeArgs a) {
  constexpr int kVec = kHalvesPerVec;
  constexpr int kLanes = kHeadDim / kVec;  // lanes per token: 8, 16 or 32
  constexpr int kGroups = kThreads / kLanes;
  constexpr int kUnroll = kGroupTile >= 8 ? 2 : 4;
  static_assert(kLanes <= 32 && 32 % kLanes == 0);

  __shared__ float smem_acc[kWarps][kGroupTile][kHeadDim];
  __shared__ float smem_m[kWarps][kGroupTile];
  __shared__ float smem_l[kWarps][kGroupTile];

  const int32_t kv_head = blockIdx.x / a.head_tiles;
  const int32_t tile = blockIdx.x % a.head_tiles;
  const int32_t seq = blockIdx.y;
  const int32_t split = blockIdx.z;
  const int32_t head0 = kv_head * a.group_size + tile * kGroupTile;
  const int32_t heads_here = min(kGroupTile, a.group_size - tile * kGroupTile);
  const int32_t lane = threadIdx.x % kLanes;
  const int32_t group = threadIdx.x / kLanes;
  const int32_t warp = threadIdx.x / 32;

  // Query slice of every head of the tile, pre-scaled into the log2 domain.
  float q[kGroupTile][kVec];
  const T* q_seq = static_cast<const T*>(a.q) + seq * a.q_seq_stride;
#pragma unroll
  for (int g = 0; g < kGroupTile; ++g) {
    if (g < heads_here) {
      Unpack8<T>(LoadVec(q_seq + (head0 + g) * kHeadDim + lane * kVec), q[g]);
#pragma unroll
      for (int i = 0; i < kVec; ++i) q[g][i] *= a.scale_log2;
    } else {
#pragma unroll
      for (int i = 0; i < kVec; ++i) q[g][i] = 0.0f;
    }
  }

  float m[kGroupTile], l[kGroupTile], acc[kGroupTile][kVec];
#pragma unroll
  for (int g = 0; g < kGroupTile; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
#pragma unroll
    for (int i = 0; i < kVec; ++i) acc[g][i] = 0.0f;
  }

  const TokenRange range = SplitRange(AttendedRange(a.seq_lens[seq], a.window_left),
                                      a.chunk_tokens, split);
  const int32_t* table_row = a.table + seq * a.row_stride;
  const T* cache = static_cast<const T*>(a.cache);
  const int64_t head_offset = kv_head * a.head_stride + lane * kVec;

  // The trip count depends only on the range, so every lane of a warp runs every iteration
  // and the shuffles below always see full warps.
  for (int32_t base = range.begin; base < range.end; base += kGroups * kUnroll) {
    uint4 k_raw[kUnroll], v_raw[kUnroll];
    bool valid[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int32_t t = base + u * kGroups + group;
      valid[u] = t < range.end;
      k_raw[u] = make_uint4(0, 0, 0, 0);
      v_raw[u] = make_uint4(0, 0, 0, 0);
      if (valid[u]) {
        const int32_t block = __ldg(table_row + t / a.block_size);
        const int64_t off =
            block * a.block_stride + (t % a.block_size) * a.token_stride + head_offset;
        k_raw[u] = LoadVec(cache + off);
        v_raw[u] = LoadVec(cache + off + a.kv_stride);
      }
    }
    // Scores: partial dot products over this lane's 8 values, reduced over the token's lanes.
    float s[kUnroll][kGroupTile];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      float k[kVec];
      Unpack8<T>(k_raw[u], k);
#pragma unroll
      for (int g = 0; g < kGroupTile; ++g) {
        float dot = 0.0f;
#pragma unroll
        for (int i = 0; i < kVec; ++i) dot = fmaf(q[g][i], k[i], dot);
#pragma unroll
        for (int off = kLanes / 2; off > 0; off /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, off);
        s[u][g] = valid[u] ? dot : -INFINITY;
      }
    }
    // Online softmax: rescale the running state once per iteration, then turn scores into
    // probabilities relative to the new maximum.
#pragma unroll
    for (int g = 0; g < kGroupTile; ++g) {
      float m_new = m[g];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) m_new = fmaxf(m_new, s[u][g]);
      const bool empty = m_new == -INFINITY;
      const float corr = empty ? 1.0f : exp2f(m[g] - m_new);
      float sum = 0.0f;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        s[u][g] = empty ? 0.0f : exp2f(s[u][g] - m_new);
        sum += s[u][g];
      }
      l[g] = l[g] * corr + sum;
#pragma unroll
      for (int i = 0; i < kVec; ++i) acc[g][i] *= corr;
      m[g] = m_new;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      float v[kVec];
      Unpack8<T>(v_raw[u], v);
#pragma unroll
      for (int g = 0; g < kGroupTile; ++g) {
#pragma unroll
        for (int i = 0; i < kVec; ++i) acc[g][i] = fmaf(s[u][g], v[i], acc[g][i]);
      }
    }
  }

  // Merge the lane groups of a warp (same lane position, different tokens).
#pragma unroll
  for (int off = kLanes; off < 32; off *= 2) {
#pragma unroll
    for (int g = 0; g < kGroupTile; ++g) {
      float acc_b[kVec];
#pragma unroll
      for (int i = 0; i < kVec; ++i) acc_b[i] = __shfl_xor_sync(0xffffffffu, acc[g][i], off);
      const float m_b = __shfl_xor_sync(0xffffffffu, m[g], off);
      const float l_b = __shfl_xor_sync(0xffffffffu, l[g], off);
      MergeState<kVec>(m[g], l[g], acc[g], m_b, l_b, acc_b);
    }
  }
  // Then the warps, through shared memory; the first lane group of warp 0 finishes.
  if (threadIdx.x % 32 < kLanes) {
#pragma unroll
    for (int g = 0; g < kGroupTile; ++g) {
#pragma unroll
      for (int i = 0; i < kVec; ++i) smem_acc[warp][g][lane * kVec + i] = acc[g][i];
      if (lane == 0) {
        smem_m[warp][g] = m[g];
        smem_l[warp][g] = l[g];
      }
    }
  }
  __syncthreads();
  if (warp != 0 || lane != static_cast<int32_t>(threadIdx.x)) return;
#pragma unroll
  for (int w = 1; w < kWarps; ++w) {
#pragma unroll
    for (int g = 0; g < kGroupTile; ++g) {
      MergeState<kVec>(m[g], l[g], acc[g], smem_m[w][g], smem_l[w][g],
                       &smem_acc[w][g][lane * kVec]);
    }
  }

#pragma unroll
  for (int g = 0; g < kGroupTile; ++g) {
    if (g >= heads_here) break;
    const float inv_l = l[g] > 0.0f ? 1.0f / l[g] : 0.0f;
    float o[kVec];
#pragma unroll
    for (int i = 0; i < kVec; ++i) o[i] = acc[g][i] * inv_l;
    const int64_t row = static_cast<int64_t>(seq) * a.num_q_heads + head0 + g;
    if (a.ws_o == nullptr) {
      *reinterpret_cast<uint4*>(static_cast<T*>(a.out) + row * kHeadDim + lane * kVec) =
          Pack8<T>(o);
    } else {
      float4* dst = reinterpret_cast<float4*>(
          a.ws_o + (row * a.num_splits + split) * kHeadDim + lane * kVec);
      dst[0] = make_float4(o[0], o[1], o[2], o[3]);
      dst[1] = make_float4(o[4], o[5], o[6], o[7]);
      if (lane == 0) {
        a.ws_lse[row * a.num_splits + split] =
            l[g] > 0.0f ? (m[g] + __log2f(l[g])) * kLn2 : -INFINITY;
      }
    }
  }
}

template <typename T, int kHeadDim>
cudaError_t LaunchForHeadDim(const DecodeArgs& a, int32_t group_tile, dim3 grid,
                             cudaStream_t stream) {
  switch (group_tile) {
    case 1:
      PagedDecodeKernel<T, kHeadDim, 1><<<grid, kThreads, 0, stream>>>(a);
      break;
    case 2:
      PagedDecodeKernel<T, kHeadDim, 2><<<grid, kThreads, 0, stream>>>(a);
      break;
    case 4:
      PagedDecodeKernel<T, kHeadDim, 4><<<grid, kThreads, 0, stream>>>(a);
      break;
    default:
      PagedDecodeKernel<T, kHeadDim, 8><<<grid, kThreads, 0, stream>>>(a);
      break;
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchForType(const DecodeArgs& a, int32_t head_dim, int32_t group_tile, dim3 grid,
                          cudaStream_t stream) {
  switch (head_dim) {
    case 64:
      return LaunchForHeadDim<T, 64>(a, group_tile, grid, stream);
    case 128:
      return LaunchForHeadDim<T, 128>(a, group_tile, grid, stream);
    default:
      return LaunchForHeadDim<T, 256>(a, group_tile, grid, stream);
  }
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

int32_t DecodeGroupTile(int32_t group_size) {
  if (group_size <= 1) return 1;
  if (group_size <= 2) return 2;
  if (group_size <= 4) return 4;
  return 8;
}

int32_t DecodeHeadTiles(int32_t group_size) {
  const int32_t tile = DecodeGroupTile(group_size);
  return (group_size + tile - 1) / tile;
}

int64_t DecodeWorkspaceBytes(const DecodePlan& plan, int32_t num_seqs, int32_t num_q_heads,
                             int32_t head_dim) {
  if (plan.num_splits <= 1) return 0;
  return static_cast<int64_t>(num_seqs) * num_q_heads * plan.num_splits * (head_dim + 1) *
         static_cast<int64_t>(sizeof(float));
}

absl::Status PagedDecode(void* out, const void* q, int64_t q_seq_stride, const KvCacheView& cache,
                         const BlockTableView& table, const DecodeParams& params,
                         const DecodePlan& plan, void* workspace, int64_t workspace_bytes,
                         cudaStream_t stream) {
  absl::Status status = ValidateKvCacheView(cache);
  if (!status.ok()) return status;
  const int32_t d = cache.head_dim;
  if (d != 64 && d != 128 && d != 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("PagedDecode: head_dim ", d, " is not 64, 128 or 256"));
  }
  if (cache.kv_stride == 0) {
    return absl::InvalidArgumentError("PagedDecode: MLA views (kv_stride 0) are not supported");
  }
  const int32_t hq = params.num_q_heads;
  if (hq <= 0 || hq % cache.num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("PagedDecode: num_q_heads ", hq,
                                                   " is not a positive multiple of num_kv_heads ",
                                                   cache.num_kv_heads));
  }
  if (out == nullptr || q == nullptr || table.table == nullptr || table.seq_lens == nullptr) {
    return absl::InvalidArgumentError("PagedDecode: null out, q, table or seq_lens");
  }
  if (!Aligned16(out) || !Aligned16(q) || q_seq_stride % 8 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PagedDecode: out/q must be 16-byte aligned and q_seq_stride (", q_seq_stride,
        ") a multiple of 8"));
  }
  if (table.num_seqs < 0 || table.num_seqs > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("PagedDecode: num_seqs ", table.num_seqs, " is outside [0, 65535]"));
  }
  if (plan.num_splits < 1 || plan.num_splits > 65535 ||
      (plan.num_splits > 1 && plan.chunk_tokens <= 0)) {
    return absl::InvalidArgumentError(absl::StrCat("PagedDecode: plan num_splits ",
                                                   plan.num_splits, " chunk_tokens ",
                                                   plan.chunk_tokens));
  }
  const int64_t needed = DecodeWorkspaceBytes(plan, table.num_seqs, hq, d);
  if (needed > 0 && (workspace == nullptr || !Aligned16(workspace) || workspace_bytes < needed)) {
    return absl::InvalidArgumentError(absl::StrCat("PagedDecode: workspace of ", workspace_bytes,
                                                   " bytes (16-byte aligned) needed ", needed));
  }
  if (table.num_seqs == 0) return absl::OkStatus();

  const int32_t group = hq / cache.num_kv_heads;
  const int32_t group_tile = DecodeGroupTile(group);
  DecodeArgs a;
  a.out = out;
  a.q = q;
  a.q_seq_stride = q_seq_stride;
  a.cache = cache.base;
  a.block_stride = cache.block_stride;
  a.kv_stride = cache.kv_stride;
  a.token_stride = cache.token_stride;
  a.head_stride = cache.head_stride;
  a.table = table.table;
  a.row_stride = table.row_stride;
  a.seq_lens = table.seq_lens;
  a.block_size = cache.block_size;
  a.num_q_heads = hq;
  a.group_size = group;
  a.head_tiles = DecodeHeadTiles(group);
  a.scale_log2 = params.scale * kLog2e;
  a.window_left = params.window_left;
  a.num_splits = plan.num_splits;
  // One split covers the whole attended range whatever the planned chunk.
  a.chunk_tokens = plan.num_splits == 1 ? 0x7fffffff : plan.chunk_tokens;
  float* ws = static_cast<float*>(workspace);
  const int64_t partial_floats = static_cast<int64_t>(table.num_seqs) * hq * plan.num_splits;
  a.ws_o = plan.num_splits == 1 ? nullptr : ws;
  a.ws_lse = plan.num_splits == 1 ? nullptr : ws + partial_floats * d;

  const dim3 grid(static_cast<uint32_t>(cache.num_kv_heads * a.head_tiles),
                  static_cast<uint32_t>(table.num_seqs), static_cast<uint32_t>(plan.num_splits));
  const cudaError_t err =
      cache.dtype == DType::kBF16
          ? LaunchForType<__nv_bfloat16>(a, d, group_tile, grid, stream)
          : LaunchForType<__half>(a, d, group_tile, grid, stream);
  if (err != cudaSuccess) return internal::CudaStatus(err, "PagedDecodeKernel");
  if (plan.num_splits == 1) return absl::OkStatus();
  return MergeAttnStates(out, nullptr, a.ws_o, a.ws_lse, table.num_seqs, hq, plan.num_splits, d,
                         cache.dtype, stream);
}

}  // namespace kvpage::cuda
