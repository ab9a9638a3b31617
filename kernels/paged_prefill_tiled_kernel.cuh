// Tiled varlen paged prefill on tensor cores (FlashAttention-2 style): the path PagedPrefill
// takes with plan.use_tensor_cores and a GQA group of at most 64
// (include/kvpage/cuda/paged_prefill.h).
//
// Design:
// - Work list. PrefillWorkListKernel (one CTA) cuts every sequence's queries
//   [query_start_loc[b], query_start_loc[b + 1]) into tiles of TileTokens(group) tokens and
//   writes each tile's first token into the workspace, padding tokens (outside
//   [query_start_loc[0], query_start_loc[num_seqs])) as tiles of their own marked ~first.
//   Grid (tile, kv_head, split): a decode is one tile, a 2,048-token chunk 2,048 / TileTokens
//   tiles, all in one launch.
// - Tile = 64 rows = TileTokens tokens x the group's query heads (row r: token r / group,
//   head r % group), so the query heads of one KV head share every K/V row read. 4 warps of
//   16 rows; Q stays in registers as mma A fragments.
// - K/V tiles of kKvTokens = 4096 / head_dim tokens (16 KiB of K and V whatever head_dim) are
//   gathered through the block table with cp.async into a kStages-deep shared ring (48 KiB);
//   every 16-token step lies in one block (block_size % 16 == 0), so one table read a step.
//   Tokens outside the tile's range are zero-filled, never read (NaN past a sequence's end
//   and -1 table entries before a window stay unread).
// - Per K/V tile and warp: S = Q K^T (m16n8k16, K by ldmatrix), the causal / prefix /
//   window mask per row (a row at position p sees AttendedRange(p + 1, window_left)), online
//   softmax on the C fragments (two quad shuffles a row), then O += P V with P's C fragments
//   reused as A fragments and V by ldmatrix.trans. A warp whose 16 rows see none of the tile
//   skips it. Shared rows are XOR-swizzled by 16-byte chunk as in the tensor-core decode.
// - Every K/V row of the tile's range is read once per tile, for all its rows (the emulated
//   test counts the copies).
// - Split-KV: split z takes SplitRange(tile's keys, chunk_tokens, z, num_splits); rows are
//   clamped to it, and the normalised partial o and its lse go to ws_o / ws_lse for
//   MergeAttnStates, as the decode kernels do.
//
// Layouts: q, out [total_tokens][num_q_heads][head_dim] (q token stride q_token_stride);
// cache blocks-first NHD through the strides in PrefillTiledArgs; workspace work
// [total_tokens + 1] int32 (tile entries, then at [total_tokens] their count); shared memory
// [stage][K|V][kKvTokens][head_dim / 8 chunks of 16 B].
#ifndef KVPAGE_KERNELS_PAGED_PREFILL_TILED_KERNEL_CUH_
#define KVPAGE_KERNELS_PAGED_PREFILL_TILED_KERNEL_CUH_

#include <cstdint>

#include "kernels/mma.cuh"
#include "kernels/paged_decode_kernel.cuh"
#include "kernels/vec.cuh"
#include "kvpage/kernel_layout.h"

namespace kvpage::cuda::internal {

constexpr int kPrefillTileRows = 64;     // query rows (token x head) of a CTA
constexpr int kPrefillThreads = 128;     // 4 warps of 16 rows
constexpr int kPrefillStages = 3;        // depth of the K/V ring
constexpr int kPrefillMaxGroup = kPrefillTileRows;
constexpr int kWorkListThreads = 1024;

// Tokens of a tile for a GQA group of `group` query heads (REQUIRES 1 <= group <= 64).
KVPAGE_HOST_DEVICE constexpr int32_t TileTokens(int32_t group) {
  return kPrefillTileRows / group;
}

// Resident CTAs per SM the tiled kernel is compiled for (3 x 4 warps up to head_dim 128, at
// most 168 registers; 2 at 256, whose O and Q fragments alone take 192 registers a lane).
constexpr int PrefillMinCtas(int head_dim) { return head_dim <= 128 ? 3 : 2; }

// Whether PagedPrefill takes the tiled kernel: tensor cores asked for (the checks that come
// with them, f16/bf16, head_dim 64/128/256 and block_size % 16 == 0, already passed) and a
// GQA group that fits a tile's rows. Otherwise the per-token decode path runs.
inline bool UseTiledPrefill(const KvCacheView& cache, const DecodeParams& params,
                            const DecodePlan& plan) {
  return plan.use_tensor_cores && params.num_q_heads / cache.num_kv_heads <= kPrefillMaxGroup;
}

// Upper bound of the work list's length: every sequence's tiles plus the padding's, never
// more than total_tokens (a tile has at least one token).
inline int32_t MaxPrefillTiles(int32_t total_tokens, int32_t num_seqs, int32_t tile_tokens) {
  const int64_t bound = (static_cast<int64_t>(total_tokens) + tile_tokens - 1) / tile_tokens +
                        num_seqs + 2;
  return static_cast<int32_t>(bound < total_tokens ? bound : total_tokens);
}

struct PrefillTiledArgs {
  void* out;       // [total_tokens][num_q_heads][head_dim]
  const void* q;   // [total_tokens][num_q_heads][head_dim], token stride q_token_stride
  int64_t q_token_stride;
  const void* cache;
  int64_t block_stride;
  int64_t kv_stride;
  int64_t token_stride;
  int64_t head_stride;
  const int32_t* table;
  int64_t row_stride;
  const int32_t* seq_lens;
  const int32_t* query_start_loc;  // [num_seqs + 1]
  const int32_t* work;             // PrefillWorkListKernel's output
  int32_t num_seqs;
  int32_t total_tokens;
  int32_t block_size;
  int32_t num_q_heads;
  int32_t group_size;
  float scale_log2;
  int32_t window_left;
  int32_t num_splits;
  int32_t chunk_tokens;  // keys of a split (SplitRange over the tile's range)
  float* ws_o;           // [total_tokens][num_q_heads][num_splits][head_dim]; null: 1 split
  float* ws_lse;         // [total_tokens][num_q_heads][num_splits]
};

// Tiles of `tile_tokens` over each sequence's queries, then over the padding before and
// after them; work[i] = the tile's first token (~first for padding), work[total_tokens] = the
// count. Tokens at or past total_tokens are never in a tile. One CTA of kWorkListThreads.
__global__ void __launch_bounds__(kWorkListThreads)
    PrefillWorkListKernel(const int32_t* __restrict__ query_start_loc, int32_t num_seqs,
                          int32_t total_tokens, int32_t tile_tokens, int32_t* __restrict__ work) {
  __shared__ int32_t sums[kWorkListThreads];
  const int32_t tid = static_cast<int32_t>(threadIdx.x);
  const int32_t per = (num_seqs + kWorkListThreads - 1) / kWorkListThreads;
  const int32_t lo = min(tid * per, num_seqs), hi = min(lo + per, num_seqs);
  auto bounds = [&](int32_t b, int32_t* begin, int32_t* end) {
    *begin = min(query_start_loc[b], total_tokens);
    *end = min(query_start_loc[b + 1], total_tokens);
  };
  int32_t mine = 0;
  for (int32_t b = lo; b < hi; ++b) {
    int32_t begin, end;
    bounds(b, &begin, &end);
    if (end > begin) mine += (end - begin + tile_tokens - 1) / tile_tokens;
  }
  sums[tid] = mine;
  __syncthreads();
  for (int32_t off = 1; off < kWorkListThreads; off *= 2) {  // inclusive scan
    const int32_t add = tid >= off ? sums[tid - off] : 0;
    __syncthreads();
    sums[tid] += add;
    __syncthreads();
  }
  int32_t at = sums[tid] - mine;
  for (int32_t b = lo; b < hi; ++b) {
    int32_t begin, end;
    bounds(b, &begin, &end);
    for (int32_t t = begin; t < end; t += tile_tokens) work[at++] = t;
  }
  if (tid == 0) {
    int32_t n = sums[kWorkListThreads - 1];
    const int32_t front_end = num_seqs > 0 ? min(max(query_start_loc[0], 0), total_tokens)
                                           : total_tokens;
    const int32_t back_begin =
        num_seqs > 0 ? max(min(query_start_loc[num_seqs], total_tokens), front_end)
                     : total_tokens;
    for (int32_t t = 0; t < front_end; t += tile_tokens) work[n++] = ~t;
    for (int32_t t = back_begin; t < total_tokens; t += tile_tokens) work[n++] = ~t;
    work[total_tokens] = n;
  }
}

// The query tokens of one tile and what its rows attend to.
struct PrefillTile {
  int32_t seq;        // -1: a padding tile
  int32_t first;      // first token
  int32_t tokens;     // tokens in the tile
  int32_t pos0;       // position of the first token in its sequence (may be < 0: no keys)
};

__device__ __forceinline__ PrefillTile FindPrefillTile(const PrefillTiledArgs& a,
                                                       int32_t entry, int32_t tile_tokens) {
  PrefillTile t;
  if (entry < 0) {
    t.seq = -1;
    t.first = ~entry;
    const int32_t front_end = a.num_seqs > 0 ? a.query_start_loc[0] : a.total_tokens;
    const int32_t end = t.first < front_end ? min(front_end, a.total_tokens) : a.total_tokens;
    t.tokens = min(tile_tokens, end - t.first);
    t.pos0 = -1;
    return t;
  }
  int32_t lo = 0, hi = a.num_seqs - 1;  // the last sequence starting at or before `entry`
  while (lo < hi) {
    const int32_t mid = (lo + hi + 1) / 2;
    if (a.query_start_loc[mid] <= entry) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const int32_t end = min(a.query_start_loc[lo + 1], a.total_tokens);
  t.seq = lo;
  t.first = entry;
  t.tokens = min(tile_tokens, end - entry);
  const int32_t q_len = a.query_start_loc[lo + 1] - a.query_start_loc[lo];
  t.pos0 = a.seq_lens[lo] - q_len + (entry - a.query_start_loc[lo]);
  return t;
}

// Zeroes the outputs of a padding tile's tokens for this KV head's query heads (with splits:
// writes empty partials of this split).
template <typename T, int kHeadDim>
__device__ __forceinline__ void ZeroPrefillTile(const PrefillTiledArgs& a, const PrefillTile& t,
                                                int32_t kv_head) {
  constexpr int kChunks = kHeadDim / 8;
  const int32_t per_token = a.group_size * kChunks;
  const int32_t count = t.tokens * per_token;
  for (int32_t e = static_cast<int32_t>(threadIdx.x); e < count; e += kPrefillThreads) {
    const int32_t token = t.first + e / per_token;
    const int32_t head = kv_head * a.group_size + e % per_token / kChunks;
    const int64_t row = static_cast<int64_t>(token) * a.num_q_heads + head;
    if (a.ws_o == nullptr) {
      T* dst = static_cast<T*>(a.out) + row * kHeadDim + e % kChunks * 8;
      *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
      continue;
    }
    // An empty partial (o 0, lse -inf): the merge writes the zero output.
    const int64_t at = row * a.num_splits + blockIdx.z;
    float4* dst = reinterpret_cast<float4*>(a.ws_o + at * kHeadDim + e % kChunks * 8);
    dst[0] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    dst[1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (e % kChunks == 0) a.ws_lse[at] = -INFINITY;
  }
}

// The query rows one lane holds (16 warp + g and + 8) and its warp's, in one split.
struct PrefillRows {
  int32_t pos[2];    // the last key each row sees (its position, clamped to the split)
  int32_t begin[2];  // the first (window start or split start); begin > pos: none
  // Over the warp (positions and window starts grow with the token): the keys any row sees
  // (lo > hi: none), the smallest last key and the largest first key (no mask inside).
  int32_t warp_lo, warp_hi, warp_pos_lo, warp_begin_hi;
};

__device__ __forceinline__ PrefillRows MakePrefillRows(const PrefillTiledArgs& a,
                                                       const PrefillTile& tile,
                                                       const TokenRange& range, int32_t warp,
                                                       int32_t g) {
  PrefillRows rows;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int32_t r = 16 * warp + g + 8 * h;
    const int32_t tok = r / a.group_size;
    const bool real = tok < tile.tokens && tile.pos0 + tok >= 0;
    rows.pos[h] = real ? min(tile.pos0 + tok, range.end - 1) : -1;
    rows.begin[h] =
        real ? max(AttendedRange(tile.pos0 + tok + 1, a.window_left).begin, range.begin) : 0;
  }
  const int32_t warp_tok_lo = 16 * warp / a.group_size;
  const int32_t warp_tok_hi = min((16 * warp + 15) / a.group_size, tile.tokens - 1);
  rows.warp_hi = min(tile.pos0 + warp_tok_hi, range.end - 1);
  rows.warp_lo = warp_tok_lo <= warp_tok_hi
                      ? max(AttendedRange(max(tile.pos0 + warp_tok_lo, 0) + 1,
                                          a.window_left).begin, range.begin)
                      : 0x7fffffff;
  rows.warp_pos_lo = min(tile.pos0 + warp_tok_lo, range.end - 1);
  rows.warp_begin_hi =
      warp_tok_lo <= warp_tok_hi
          ? max(AttendedRange(max(tile.pos0 + warp_tok_hi, 0) + 1, a.window_left).begin,
                range.begin)
          : 0;
  return rows;
}

// One K/V tile of the online softmax for the lane's rows g (h = 0) and g + 8 (h = 1): scales
// the scores s (C fragments of keys start + 8 j + 2 q (+1)), masks them unless `full` (no row
// crosses its causal or window edge inside the tile), turns them into weights, and rescales
// O, the running maxima (log2 domain, equal over the quad) and the lane's partial sums.
template <int kKeyTiles, int kDimTiles>
__device__ __forceinline__ void SoftmaxStep(const PrefillRows& rows, int32_t start, int32_t q,
                                            bool full, float scale_log2,
                                            float (&s)[kKeyTiles][4], float (&o)[kDimTiles][4],
                                            float (&m_run)[2], float (&l_part)[2]) {
#pragma unroll
  for (int j = 0; j < kKeyTiles; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) s[j][e] *= scale_log2;
  }
  if (!full) {
#pragma unroll
    for (int j = 0; j < kKeyTiles; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int32_t t = start + 8 * j + 2 * q + e % 2;
        if (t < rows.begin[e / 2] || t > rows.pos[e / 2]) s[j][e] = -INFINITY;
      }
    }
  }
  float corr[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float m_new = m_run[h];
#pragma unroll
    for (int j = 0; j < kKeyTiles; ++j) {
      m_new = fmaxf(m_new, fmaxf(s[j][2 * h], s[j][2 * h + 1]));
    }
    m_new = fmaxf(m_new, __shfl_xor_sync(0xffffffffu, m_new, 1));
    m_new = fmaxf(m_new, __shfl_xor_sync(0xffffffffu, m_new, 2));
    const bool empty = m_new == -INFINITY;
    corr[h] = empty ? 1.0f : exp2f(m_run[h] - m_new);
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < kKeyTiles; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float& x = s[j][2 * h + e];
        x = empty ? 0.0f : exp2f(x - m_new);
        sum += x;
      }
    }
    l_part[h] = l_part[h] * corr[h] + sum;
    m_run[h] = m_new;
  }
#pragma unroll
  for (int n = 0; n < kDimTiles; ++n) {
    o[n][0] *= corr[0];
    o[n][1] *= corr[0];
    o[n][2] *= corr[1];
    o[n][3] *= corr[1];
  }
}

// Normalises and stores the lane's two rows (dims 8 n + 2 q, + 1): to out, or as the
// split's partial (o and its natural-log lse) to ws_o / ws_lse.
template <typename T, int kHeadDim>
__device__ __forceinline__ void StorePrefillRows(const PrefillTiledArgs& a,
                                                 const PrefillTile& tile, int32_t kv_head,
                                                 int32_t warp, int32_t lane,
                                                 const float (&o)[kHeadDim / 8][4],
                                                 const float (&m_run)[2],
                                                 const float (&l_part)[2]) {
  constexpr int kDimTiles = kHeadDim / 8;
  const int32_t g = lane / 4, q = lane % 4;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float l = l_part[h];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const int32_t r = 16 * warp + g + 8 * h;
    const int32_t tok = r / a.group_size;
    if (tok >= tile.tokens) continue;
    const float inv_l = l > 0.0f ? 1.0f / l : 0.0f;
    const int64_t row = static_cast<int64_t>(tile.first + tok) * a.num_q_heads +
                        kv_head * a.group_size + r % a.group_size;
    if (a.ws_o == nullptr) {
      T* dst = static_cast<T*>(a.out) + row * kHeadDim + 2 * q;
#pragma unroll
      for (int n = 0; n < kDimTiles; ++n) {
        *reinterpret_cast<uint32_t*>(dst + 8 * n) =
            PackPair<T>(o[n][2 * h] * inv_l, o[n][2 * h + 1] * inv_l);
      }
      continue;
    }
    // Split-KV partial: normalised o and the natural-log sum of exp(score).
    const int64_t at = row * a.num_splits + blockIdx.z;
    float* dst = a.ws_o + at * kHeadDim + 2 * q;
#pragma unroll
    for (int n = 0; n < kDimTiles; ++n) {
      *reinterpret_cast<float2*>(dst + 8 * n) =
          make_float2(o[n][2 * h] * inv_l, o[n][2 * h + 1] * inv_l);
    }
    if (q == 0) a.ws_lse[at] = l > 0.0f ? (m_run[h] + __log2f(l)) * kLn2 : -INFINITY;
  }
}

// Q as A fragments: qa[ks] = the lane's rows g, g + 8 of dims 16 ks + 2q (+1) and + 8 (zero
// for rows that are no query).
template <typename T, int kHeadDim>
__device__ __forceinline__ void LoadQFragments(const PrefillTiledArgs& a, const PrefillTile& tile,
                                               int32_t kv_head, int32_t warp, int32_t lane,
                                               uint32_t (&qa)[kHeadDim / 16][4]) {
  constexpr int kKSteps = kHeadDim / 16;
  const int32_t g = lane / 4, q = lane % 4;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int32_t r = 16 * warp + g + 8 * h;
    const int32_t tok = r / a.group_size;
    const bool real = tok < tile.tokens;
    const T* q_row = static_cast<const T*>(a.q) +
                     static_cast<int64_t>(tile.first + (real ? tok : 0)) * a.q_token_stride +
                     (kv_head * a.group_size + r % a.group_size) * kHeadDim;
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
      qa[ks][h] = real ? *reinterpret_cast<const uint32_t*>(q_row + 16 * ks + 2 * q) : 0u;
      qa[ks][h + 2] = real ? *reinterpret_cast<const uint32_t*>(q_row + 16 * ks + 8 + 2 * q) : 0u;
    }
  }
}

// S = Q K^T of one K/V tile (rows [16 tokens][kHeadDim / 8 swizzled chunks] in shared
// memory): s[j] = the C fragment of keys 8 j .. 8 j + 7. K is read by ldmatrix in pairs of
// 8-key matrices (rows 0-7 / 8-15 with the two chunk halves), as in the tensor-core decode.
template <typename T, int kHeadDim>
__device__ __forceinline__ void TileScores(const uint32_t (&qa)[kHeadDim / 16][4],
                                           const char* k_tile, int32_t lane,
                                           float (&s)[512 / kHeadDim][4]) {
  constexpr int kKSteps = kHeadDim / 16, kKeyTiles = 512 / kHeadDim, kRowBytes = kHeadDim * 2;
  const int32_t k_row = (lane & 7) + ((lane >> 4) << 3), k_half = (lane >> 3) & 1;
#pragma unroll
  for (int j = 0; j < kKeyTiles; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) s[j][e] = 0.0f;
  }
#pragma unroll
  for (int kp = 0; kp < kKeyTiles / 2; ++kp) {  // 16 keys a pass
    const int32_t row = 16 * kp + k_row;
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
      uint32_t kb[4];
      const int32_t chunk = 2 * ks + k_half;
      LdMatrixX4(kb, k_tile + row * kRowBytes + ((chunk ^ (row & 7)) * 16));
      const uint32_t b0[2] = {kb[0], kb[1]};
      const uint32_t b1[2] = {kb[2], kb[3]};
      Mma16816<T>(s[2 * kp], qa[ks], b0);
      Mma16816<T>(s[2 * kp + 1], qa[ks], b1);
    }
  }
}

// O += P V for one K/V tile: P's C fragments of key tiles 2 kk, 2 kk + 1 are the A fragment
// of k step kk; V is read by ldmatrix.trans, matrices 0/1 giving b0/b1 of dim tile 2 np and
// 2/3 those of 2 np + 1.
template <typename T, int kHeadDim>
__device__ __forceinline__ void AccumulatePV(const float (&s)[512 / kHeadDim][4],
                                             const char* v_tile, int32_t lane,
                                             float (&o)[kHeadDim / 8][4]) {
  constexpr int kKvTokens = 4096 / kHeadDim, kDimTiles = kHeadDim / 8;
  constexpr int kRowBytes = kHeadDim * 2;
  const int32_t v_row = (lane & 7) + (((lane >> 3) & 1) << 3), v_half = lane >> 4;
#pragma unroll
  for (int kk = 0; kk < kKvTokens / 16; ++kk) {
    const uint32_t pa[4] = {PackPair<T>(s[2 * kk][0], s[2 * kk][1]),
                            PackPair<T>(s[2 * kk][2], s[2 * kk][3]),
                            PackPair<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                            PackPair<T>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
    const int32_t row = 16 * kk + v_row;
#pragma unroll
    for (int np = 0; np < kDimTiles / 2; ++np) {
      uint32_t vb[4];
      const int32_t chunk = 2 * np + v_half;
      LdMatrixX4Trans(vb, v_tile + row * kRowBytes + ((chunk ^ (row & 7)) * 16));
      const uint32_t b0[2] = {vb[0], vb[1]};
      const uint32_t b1[2] = {vb[2], vb[3]};
      Mma16816<T>(o[2 * np], pa, b0);
      Mma16816<T>(o[2 * np + 1], pa, b1);
    }
  }
}

template <typename T, int kHeadDim>
__global__ void __launch_bounds__(kPrefillThreads, PrefillMinCtas(kHeadDim))
    PagedPrefillTiledKernel(const PrefillTiledArgs a) {
  constexpr int kChunks = kHeadDim / 8;         // 16-byte chunks of a token row
  constexpr int kKSteps = kHeadDim / 16;        // k steps of S = Q K^T
  constexpr int kDimTiles = kHeadDim / 8;       // n tiles of O
  constexpr int kKvTokens = 4096 / kHeadDim;    // tokens of a K/V tile: 64, 32 or 16
  constexpr int kKeyTiles = kKvTokens / 8;      // n tiles of S
  constexpr int kRowBytes = kHeadDim * 2;
  constexpr int kTileBytes = kKvTokens * kRowBytes;  // K or V of one tile (8 KiB)
  constexpr int kThreadCopies = kKvTokens * kChunks / kPrefillThreads;
  static_assert(kChunks >= 8 && kThreadCopies >= 1 && kKvTokens % 16 == 0);
  __shared__ __align__(128) uint4 smem[kPrefillStages * 2 * kTileBytes / 16];
  char* const smem_bytes = reinterpret_cast<char*>(smem);

  const int32_t kv_head = static_cast<int32_t>(blockIdx.y);
  const int32_t tile_tokens = TileTokens(a.group_size);
  if (static_cast<int32_t>(blockIdx.x) >= a.work[a.total_tokens]) return;
  const PrefillTile tile = FindPrefillTile(a, a.work[blockIdx.x], tile_tokens);
  if (tile.seq < 0) {
    ZeroPrefillTile<T, kHeadDim>(a, tile, kv_head);
    return;
  }
  const int32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int32_t g = lane / 4, q = lane % 4;

  // Keys of the whole tile, from the first row's window start to the last row's position,
  // and this CTA's split of them.
  const int32_t last_pos = tile.pos0 + tile.tokens - 1;
  const TokenRange tile_range =
      last_pos >= 0 ? TokenRange{AttendedRange(max(tile.pos0, 0) + 1, a.window_left).begin,
                                 last_pos + 1}
                    : TokenRange{0, 0};
  const TokenRange range = SplitRange(tile_range, a.chunk_tokens,
                                      static_cast<int32_t>(blockIdx.z), a.num_splits);

  const PrefillRows rows = MakePrefillRows(a, tile, range, warp, g);

  uint32_t qa[kKSteps][4];
  LoadQFragments<T, kHeadDim>(a, tile, kv_head, warp, lane, qa);

  const int32_t kv_start = range.begin / 16 * 16;
  const int32_t num_kv_tiles =
      range.end > range.begin ? (range.end - kv_start + kKvTokens - 1) / kKvTokens : 0;
  const int32_t* table_row = a.table + static_cast<int64_t>(tile.seq) * a.row_stride;
  const T* cache = static_cast<const T*>(a.cache) + kv_head * a.head_stride;

  // Issues the cp.async copies of K/V tile i into `stage`. A thread's rows are
  // kCopyRows apart (< block_size), so one division finds the first row's block and the
  // others step along.
  constexpr int kCopyRows = kPrefillThreads / kChunks;
  const int32_t copy_row = static_cast<int32_t>(threadIdx.x) / kChunks;
  const int32_t copy_chunk = static_cast<int32_t>(threadIdx.x) % kChunks;
  auto issue = [&](int32_t i, int32_t stage) {
    char* k_dst = smem_bytes + stage * 2 * kTileBytes;
    const int32_t t0 = kv_start + i * kKvTokens + copy_row;
    int32_t block_index = t0 / a.block_size, offset = t0 % a.block_size;
#pragma unroll
    for (int c = 0; c < kThreadCopies; ++c) {
      const int32_t r = copy_row + kCopyRows * c;
      const int32_t t = t0 + kCopyRows * c;
      const bool valid = t >= range.begin && t < range.end;
      const T* src = cache;
      if (valid) {
        const int64_t block = __ldg(table_row + block_index);
        src = cache + block * a.block_stride + offset * a.token_stride + copy_chunk * 8;
      }
      const int32_t at = r * kRowBytes + ((copy_chunk ^ (r & 7)) * 16);
      CpAsync16(k_dst + at, src, valid);
      CpAsync16(k_dst + kTileBytes + at, src + a.kv_stride, valid);
      offset += kCopyRows;
      if (offset >= a.block_size) {
        offset -= a.block_size;
        ++block_index;
      }
    }
  };

  float o[kDimTiles][4];  // o[n][0..1] = O[row g][8n + 2q, +1]; o[n][2..3] for row g + 8
#pragma unroll
  for (int n = 0; n < kDimTiles; ++n) {
#pragma unroll
    for (int i = 0; i < 4; ++i) o[n][i] = 0.0f;
  }
  float m_run[2] = {-INFINITY, -INFINITY};  // log2 domain, the same over the lane's quad
  float l_part[2] = {0.0f, 0.0f};           // this lane's part of each row's sum

#pragma unroll
  for (int s = 0; s < kPrefillStages - 1; ++s) {
    if (s < num_kv_tiles) issue(s, s);
    CpAsyncCommit();
  }
  for (int32_t i = 0; i < num_kv_tiles; ++i) {
    const int32_t ahead = i + kPrefillStages - 1;
    if (ahead < num_kv_tiles) issue(ahead, ahead % kPrefillStages);
    CpAsyncCommit();
    CpAsyncWait<kPrefillStages - 1>();
    __syncthreads();
    const int32_t start = kv_start + i * kKvTokens;
    if (rows.warp_hi >= start && rows.warp_lo < start + kKvTokens) {
      // Every row of the warp sees every key of the tile: no mask needed.
      const bool full = start + kKvTokens - 1 <= rows.warp_pos_lo && start >= rows.warp_begin_hi;
      const char* k_tile = smem_bytes + (i % kPrefillStages) * 2 * kTileBytes;
      const char* v_tile = k_tile + kTileBytes;
      float s[kKeyTiles][4];
      TileScores<T, kHeadDim>(qa, k_tile, lane, s);
      SoftmaxStep<kKeyTiles, kDimTiles>(rows, start, q, full, a.scale_log2, s, o, m_run, l_part);
      AccumulatePV<T, kHeadDim>(s, v_tile, lane, o);
    }
    __syncthreads();  // every warp is done with this stage before it is refilled
  }
  CpAsyncWait<0>();

  StorePrefillRows<T, kHeadDim>(a, tile, kv_head, warp, lane, o, m_run, l_part);
}

// Kernel arguments of one PagedPrefill call on the tiled path, shared by the launcher and
// the host emulation test. REQUIRES: arguments validated by PagedPrefill.
inline PrefillTiledArgs MakePrefillTiledArgs(void* out, const void* q, int64_t q_token_stride,
                                             const int32_t* query_start_loc,
                                             int32_t total_tokens, const KvCacheView& cache,
                                             const BlockTableView& table,
                                             const DecodeParams& params,
                                             const DecodePlan& plan, const int32_t* work,
                                             void* split_workspace) {
  PrefillTiledArgs a;
  a.out = out;
  a.q = q;
  a.q_token_stride = q_token_stride;
  a.cache = cache.base;
  a.block_stride = cache.block_stride;
  a.kv_stride = cache.kv_stride;
  a.token_stride = cache.token_stride;
  a.head_stride = cache.head_stride;
  a.table = table.table;
  a.row_stride = table.row_stride;
  a.seq_lens = table.seq_lens;
  a.query_start_loc = query_start_loc;
  a.work = work;
  a.num_seqs = table.num_seqs;
  a.total_tokens = total_tokens;
  a.block_size = cache.block_size;
  a.num_q_heads = params.num_q_heads;
  a.group_size = params.num_q_heads / cache.num_kv_heads;
  a.scale_log2 = params.scale * kLog2e;
  a.window_left = params.window_left;
  a.num_splits = plan.num_splits;
  // One split covers the whole range whatever the planned chunk.
  a.chunk_tokens = plan.num_splits == 1 ? 0x7fffffff : plan.chunk_tokens;
  float* ws = static_cast<float*>(split_workspace);
  const int64_t partial_rows =
      static_cast<int64_t>(total_tokens) * a.num_q_heads * plan.num_splits;
  a.ws_o = plan.num_splits == 1 ? nullptr : ws;
  a.ws_lse = plan.num_splits == 1 ? nullptr : ws + partial_rows * cache.head_dim;
  return a;
}

}  // namespace kvpage::cuda::internal

#endif  // KVPAGE_KERNELS_PAGED_PREFILL_TILED_KERNEL_CUH_
