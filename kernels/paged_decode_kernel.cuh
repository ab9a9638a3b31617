// paged_decode kernel body: one query token per sequence over the blocks-first paged cache
// (include/kvpage/cuda/paged_decode.h).
//
// Design (CUDA cores, FlashInfer-style GQA grouping):
// - CTA = 4 warps; grid (kv_head x head_tile, sequence, split). The CTA holds kGroupTile query
//   heads of one KV head, so each K/V row is loaded once and used kGroupTile times.
// - head_dim is spread over kLanes = head_dim / 8 lanes rounded up to 8, 16 or 32 (head_dim
//   80, 96 and 192 leave lanes idle), each holding 8 values of a token's K and V row (one
//   16-byte vector, or 8 bytes of an fp8 cache); a warp therefore works on 32 / kLanes tokens
//   at a time and the CTA on kGroups = 128 / kLanes tokens. Each lane group unrolls kUnroll
//   tokens so 2 * kUnroll independent K/V loads are in flight per thread.
// - Scores are fp32 with log2(e) folded into the scale (exp2f); every lane group keeps its own
//   online-softmax state (m, l, acc), merged at the end across groups (shuffles) and warps
//   (shared memory). An fp8 cache's k_scale is folded into the query scale and its v_scale
//   into the final normalisation, so the loop only widens e4m3 to f16 to f32.
// - The loop runs over AttendedRange ∩ this split only: tokens before a sliding window are
//   never touched, and their table entries are never read. Tokens past seq_len are not loaded,
//   so garbage (even NaN) in the tail of the last block cannot reach the output.
//
// Device code only; the launcher is in paged_decode.cu. Kept in a header so the same source
// also compiles on the host against kernels/emulation/cuda_emulation.h (tests/kernels).
#ifndef KVPAGE_KERNELS_PAGED_DECODE_KERNEL_CUH_
#define KVPAGE_KERNELS_PAGED_DECODE_KERNEL_CUH_

#include <cstdint>

#include "kernels/grid_dependency.cuh"
#include "kernels/vec.cuh"
#include "kvpage/kernel_layout.h"

namespace kvpage::cuda::internal {

constexpr int kDecodeThreads = 128;
constexpr int kDecodeWarps = kDecodeThreads / 32;
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
  // Query row i reads table row table_rows[i] (paged prefill: a query token reads its
  // sequence's row); null: row i.
  const int32_t* table_rows = nullptr;
  const int32_t* seq_lens;
  int32_t block_size;
  int32_t num_q_heads;
  int32_t group_size;  // query heads per KV head
  int32_t head_tiles;
  float scale_log2;    // softmax scale * log2(e), times k_scale for an fp8 cache
  float v_scale;       // fp8 cache: V's per-tensor scale, applied to the output; else 1
  int32_t window_left;
  int32_t num_splits;
  int32_t chunk_tokens;
  float* ws_o;         // [num_seqs][num_q_heads][num_splits][head_dim]; null if num_splits == 1
  float* ws_lse;       // [num_seqs][num_q_heads][num_splits]
};

// Merges the online-softmax state (m_b, l_b, acc_b) into (m, l, acc).
// Online-softmax state of kG query heads over one lane's kVec output values: running maximum
// m (log2 domain), running sum l, and the unnormalised output acc.
template <int kG, int kVec>
struct SoftmaxState {
  float m[kG];
  float l[kG];
  float acc[kG][kVec];

  __device__ __forceinline__ void Init() {
#pragma unroll
    for (int g = 0; g < kG; ++g) {
      m[g] = -INFINITY;
      l[g] = 0.0f;
#pragma unroll
      for (int i = 0; i < kVec; ++i) acc[g][i] = 0.0f;
    }
  }

  // Folds in kUnroll tokens: scores s (log2 domain; -inf = no token) and their V vectors. The
  // state is rescaled once per call, not once per token.
  template <typename KV, int kUnroll>
  __device__ __forceinline__ void Add(float (&s)[kUnroll][kG],
                                      const typename KV::Raw (&v_raw)[kUnroll]) {
#pragma unroll
    for (int g = 0; g < kG; ++g) {
      float m_new = m[g];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) m_new = fmaxf(m_new, s[u][g]);
      const bool empty = m_new == -INFINITY;
      const float corr = empty ? 1.0f : exp2f(m[g] - m_new);
      float sum = 0.0f;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        s[u][g] = empty ? 0.0f : exp2f(s[u][g] - m_new);  // now a probability weight
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
      KV::Unpack(v_raw[u], v);
#pragma unroll
      for (int g = 0; g < kG; ++g) {
#pragma unroll
        for (int i = 0; i < kVec; ++i) acc[g][i] = fmaf(s[u][g], v[i], acc[g][i]);
      }
    }
  }

  // Merges another state (m_b, l_b, acc_b) of head g into this one.
  __device__ __forceinline__ void Merge(int g, float m_b, float l_b, const float* acc_b) {
    const float m_new = fmaxf(m[g], m_b);
    const float c_a = m_new == -INFINITY ? 0.0f : exp2f(m[g] - m_new);
    const float c_b = m_new == -INFINITY ? 0.0f : exp2f(m_b - m_new);
    l[g] = l[g] * c_a + l_b * c_b;
#pragma unroll
    for (int i = 0; i < kVec; ++i) acc[g][i] = acc[g][i] * c_a + acc_b[i] * c_b;
    m[g] = m_new;
  }

  // Merges the lane groups of a warp (same lane position, different tokens): afterwards
  // every group of the warp holds the warp's state.
  template <int kLanes>
  __device__ __forceinline__ void MergeLaneGroups() {
#pragma unroll
    for (int off = kLanes; off < 32; off *= 2) {
#pragma unroll
      for (int g = 0; g < kG; ++g) {
        float acc_b[kVec];
#pragma unroll
        for (int i = 0; i < kVec; ++i) acc_b[i] = __shfl_xor_sync(0xffffffffu, acc[g][i], off);
        const float m_b = __shfl_xor_sync(0xffffffffu, m[g], off);
        const float l_b = __shfl_xor_sync(0xffffffffu, l[g], off);
        Merge(g, m_b, l_b, acc_b);
      }
    }
  }
};

// Loads this lane's slice of every query head of the tile, pre-scaled into the log2 domain;
// heads past heads_here (a partial tile) and idle lanes (!active) get zeros.
template <typename T, int kG, int kVec>
__device__ __forceinline__ void LoadQuery(const T* q_seq, int32_t head0, int32_t heads_here,
                                          int32_t head_dim, int32_t lane, bool active,
                                          float scale_log2, float (&q)[kG][kVec]) {
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    if (active && g < heads_here) {
      Unpack8<T>(LoadVec(q_seq + (head0 + g) * head_dim + lane * kVec), q[g]);
#pragma unroll
      for (int i = 0; i < kVec; ++i) q[g][i] *= scale_log2;
    } else {
#pragma unroll
      for (int i = 0; i < kVec; ++i) q[g][i] = 0.0f;
    }
  }
}

// Scores of kUnroll tokens: this lane's partial dot products, summed over the token's kLanes
// lanes with butterfly shuffles (every lane ends with the full score); -inf where !valid.
template <typename KV, int kUnroll, int kG, int kVec, int kLanes>
__device__ __forceinline__ void Scores(const float (&q)[kG][kVec],
                                       const typename KV::Raw (&k_raw)[kUnroll],
                                       const bool (&valid)[kUnroll],
                                       float (&s)[kUnroll][kG]) {
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    float k[kVec];
    KV::Unpack(k_raw[u], k);
#pragma unroll
    for (int g = 0; g < kG; ++g) {
      float dot = 0.0f;
#pragma unroll
      for (int i = 0; i < kVec; ++i) dot = fmaf(q[g][i], k[i], dot);
#pragma unroll
      for (int off = kLanes / 2; off > 0; off /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, off);
      s[u][g] = valid[u] ? dot : -INFINITY;
    }
  }
}

// Lanes that hold one token's row: head_dim / 8 rounded up to a power of two (8, 16 or 32);
// for head_dim 80, 96 and 192 the lanes past head_dim / 8 idle.
__host__ __device__ constexpr int DecodeLanes(int head_dim) {
  return head_dim <= 64 ? 8 : head_dim <= 128 ? 16 : 32;
}

// Resident CTAs per SM the CUDA-core kernel is built for (__launch_bounds__' minimum): 7, 6,
// 3, 2 for group tiles 1, 2, 4, 8 (at most 72, 80, 168 and 255 registers).
__host__ __device__ constexpr int DecodeMinCtas(int group_tile) {
  return group_tile == 1 ? 7 : group_tile == 2 ? 6 : group_tile == 4 ? 3 : 2;
}

// T: the dtype of q and out (f16/bf16). TC: the cache's element type, T or Fp8E4m3.
// The second __launch_bounds__ argument states the occupancy the kernel is built for (its
// register count from ptxas, docs/kernels.md §7): left free, ptxas sometimes spills a register
// to reach the next occupancy step, which the build forbids.
template <typename T, int kHeadDim, int kGroupTile, typename TC = T>
__global__ void __launch_bounds__(kDecodeThreads, DecodeMinCtas(kGroupTile))
    PagedDecodeKernel(const DecodeArgs a) {
  using KV = KvVec8<TC>;
  using Raw = typename KV::Raw;
  constexpr int kVec = kHalvesPerVec;
  constexpr int kLanes = DecodeLanes(kHeadDim);
  constexpr int kGroups = kDecodeThreads / kLanes;
  constexpr int kUnroll = kGroupTile >= 8 ? 2 : 4;
  static_assert(kHeadDim % kVec == 0 && kHeadDim <= kLanes * kVec && kLanes <= 32);

  __shared__ float smem_acc[kDecodeWarps][kGroupTile][kLanes * kVec];
  __shared__ float smem_m[kDecodeWarps][kGroupTile];
  __shared__ float smem_l[kDecodeWarps][kGroupTile];

  const int32_t kv_head = blockIdx.x / a.head_tiles;
  const int32_t tile = blockIdx.x % a.head_tiles;
  const int32_t seq = blockIdx.y;
  const int32_t split = blockIdx.z;
  const int32_t head0 = kv_head * a.group_size + tile * kGroupTile;
  const int32_t heads_here = min(kGroupTile, a.group_size - tile * kGroupTile);
  const int32_t lane = threadIdx.x % kLanes;
  const int32_t group = threadIdx.x / kLanes;
  const int32_t warp = threadIdx.x / 32;
  const bool active = lane * kVec < kHeadDim;  // false only on the padding lanes

  float q[kGroupTile][kVec];
  LoadQuery<T>(static_cast<const T*>(a.q) + seq * a.q_seq_stride, head0, heads_here, kHeadDim,
               lane, active, a.scale_log2, q);
  SoftmaxState<kGroupTile, kVec> state;
  state.Init();

  const TokenRange range = SplitRange(AttendedRange(a.seq_lens[seq], a.window_left),
                                      a.chunk_tokens, split, a.num_splits);
  // Idle lanes see an empty range (no loads, -inf scores) but run every iteration.
  const int32_t lane_end = active ? range.end : range.begin;
  const int32_t* table_row =
      a.table + (a.table_rows != nullptr ? a.table_rows[seq] : seq) * a.row_stride;
  const auto* cache = static_cast<const typename KV::Elem*>(a.cache);
  const int64_t head_offset = kv_head * a.head_stride + lane * kVec;

  // The trip count depends only on the range, so every lane of a warp runs every iteration
  // and the shuffles always see full warps. Lane group `group` takes tokens
  // base + u * kGroups + group; tokens past the range are neither looked up nor loaded.
  for (int32_t base = range.begin; base < range.end; base += kGroups * kUnroll) {
    Raw k_raw[kUnroll], v_raw[kUnroll];
    bool valid[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int32_t t = base + u * kGroups + group;
      valid[u] = t < lane_end;
      k_raw[u] = KV::Zero();
      v_raw[u] = KV::Zero();
      if (valid[u]) {
        const int32_t block = __ldg(table_row + t / a.block_size);
        const int64_t off =
            block * a.block_stride + (t % a.block_size) * a.token_stride + head_offset;
        k_raw[u] = KV::Load(cache + off);
        v_raw[u] = KV::Load(cache + off + a.kv_stride);
      }
    }
    float s[kUnroll][kGroupTile];
    Scores<KV, kUnroll, kGroupTile, kVec, kLanes>(q, k_raw, valid, s);
    state.template Add<KV, kUnroll>(s, v_raw);
  }

  // Merge the lane groups of each warp, then the warps through shared memory; the first lane
  // group of warp 0 finishes and stores.
  state.template MergeLaneGroups<kLanes>();
  if (threadIdx.x % 32 < kLanes) {
#pragma unroll
    for (int g = 0; g < kGroupTile; ++g) {
#pragma unroll
      for (int i = 0; i < kVec; ++i) smem_acc[warp][g][lane * kVec + i] = state.acc[g][i];
      if (lane == 0) {
        smem_m[warp][g] = state.m[g];
        smem_l[warp][g] = state.l[g];
      }
    }
  }
  __syncthreads();
  if (warp != 0 || lane != static_cast<int32_t>(threadIdx.x)) return;
#pragma unroll
  for (int w = 1; w < kDecodeWarps; ++w) {
#pragma unroll
    for (int g = 0; g < kGroupTile; ++g) {
      state.Merge(g, smem_m[w][g], smem_l[w][g], &smem_acc[w][g][lane * kVec]);
    }
  }

  if (!active) return;
#pragma unroll
  for (int g = 0; g < kGroupTile; ++g) {
    if (g >= heads_here) break;
    const float l = state.l[g];
    const float inv_l = l > 0.0f ? a.v_scale / l : 0.0f;
    float o[kVec];
#pragma unroll
    for (int i = 0; i < kVec; ++i) o[i] = state.acc[g][i] * inv_l;
    const int64_t row = static_cast<int64_t>(seq) * a.num_q_heads + head0 + g;
    if (a.ws_o == nullptr) {
      *reinterpret_cast<uint4*>(static_cast<T*>(a.out) + row * kHeadDim + lane * kVec) =
          Pack8<T>(o);
    } else {
      // Split-KV partial: normalised o and the natural-log sum of exp(score).
      float4* dst = reinterpret_cast<float4*>(
          a.ws_o + (row * a.num_splits + split) * kHeadDim + lane * kVec);
      dst[0] = make_float4(o[0], o[1], o[2], o[3]);
      dst[1] = make_float4(o[4], o[5], o[6], o[7]);
      if (lane == 0) {
        a.ws_lse[row * a.num_splits + split] =
            l > 0.0f ? (state.m[g] + __log2f(l)) * kLn2 : -INFINITY;
      }
    }
  }
  TriggerDependentGrids();  // after this thread's last store: the merge may be scheduled
}

// A decode kernel as a function pointer.
using DecodeKernelFn = void (*)(DecodeArgs);

// The CUDA-core kernel PagedDecodeKernel<T, head_dim, group_tile, TC> for q/out type T and
// cache element type TC (T, or Fp8E4m3 with T bf16 or fp16); null for a head_dim other than
// 64, 80, 96, 128, 192 or 256. Defined in paged_decode_select.cuh.
template <typename T, typename TC>
DecodeKernelFn CudaCoreDecodeKernel(int32_t head_dim, int32_t group_tile);

// Query heads one CTA holds (the GQA group rounded up to 1, 2, 4 or 8) and CTAs per KV head.
inline int32_t GroupTile(int32_t group_size) {
  if (group_size <= 1) return 1;
  if (group_size <= 2) return 2;
  if (group_size <= 4) return 4;
  return 8;
}
inline int32_t HeadTiles(int32_t group_size) {
  const int32_t tile = GroupTile(group_size);
  return (group_size + tile - 1) / tile;
}

// Threads of the tensor-core decode CTA (paged_decode_mma_kernel.cuh) for a head_dim: 256 / D
// warps, so its double-buffered 16-token K/V steps take 32 KiB of shared memory for every D.
constexpr int MmaDecodeThreads(int head_dim) { return 32 * (256 / head_dim); }

// Kernel arguments, template tile and grid (x, y, z) of one call, shared by the launcher and
// the host emulation test. REQUIRES: arguments already validated by PagedDecode.
struct DecodeLaunch {
  DecodeArgs args;
  int32_t group_tile;   // CUDA-core kernel: query heads a CTA holds
  bool tensor_cores;    // PagedDecodeMmaKernel instead (8 heads a CTA)
  int32_t threads;      // CTA size of the chosen kernel
  unsigned int grid[3];
};
inline DecodeLaunch MakeDecodeLaunch(void* out, const void* q, int64_t q_seq_stride,
                                     const KvCacheView& cache, const BlockTableView& table,
                                     const DecodeParams& params, const DecodePlan& plan,
                                     void* workspace) {
  const int32_t hq = params.num_q_heads;
  const int32_t group = hq / cache.num_kv_heads;
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
  a.head_tiles = HeadTiles(group);
  const bool fp8 = cache.dtype == DType::kFP8;
  a.scale_log2 = params.scale * kLog2e * (fp8 ? params.k_scale : 1.0f);
  a.v_scale = fp8 ? params.v_scale : 1.0f;
  a.window_left = params.window_left;
  a.num_splits = plan.num_splits;
  // One split covers the whole attended range whatever the planned chunk.
  a.chunk_tokens = plan.num_splits == 1 ? 0x7fffffff : plan.chunk_tokens;
  float* ws = static_cast<float*>(workspace);
  const int64_t partial_rows = static_cast<int64_t>(table.num_seqs) * hq * plan.num_splits;
  a.ws_o = plan.num_splits == 1 ? nullptr : ws;
  a.ws_lse = plan.num_splits == 1 ? nullptr : ws + partial_rows * cache.head_dim;
  const int32_t threads =
      plan.use_tensor_cores ? MmaDecodeThreads(cache.head_dim) : kDecodeThreads;
  return DecodeLaunch{a, GroupTile(group), plan.use_tensor_cores, threads,
                      {static_cast<unsigned int>(cache.num_kv_heads * a.head_tiles),
                       static_cast<unsigned int>(table.num_seqs),
                       static_cast<unsigned int>(plan.num_splits)}};
}

}  // namespace kvpage::cuda::internal

#endif  // KVPAGE_KERNELS_PAGED_DECODE_KERNEL_CUH_
