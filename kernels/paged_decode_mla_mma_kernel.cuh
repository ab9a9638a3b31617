// Absorbed MLA decode on tensor cores (FlashMLA-style): the path PagedDecodeMla takes when
// the plan asks for tensor cores or leaves the choice to it (include/kvpage/cuda/paged_decode.h).
// Same arguments, outputs and split-KV partials as PagedDecodeMlaKernel
// (paged_decode_mla_kernel.cuh), which stays the reference.
//
// Design:
// - A CTA holds 16 x kRowGroups query heads of one sequence (16, 32 or 64: MlaDecodeHeadTile,
//   the smallest that holds them all, 64 and several CTAs above 64 heads) as the rows of the
//   mma tiles, so every latent row of the split is copied from global memory once per CTA,
//   for all its heads. Grid (head tiles, sequence, split).
// - Warps: 2 per row group of 16 heads. Warp (r, c) computes the scores S of its 16 rows over
//   half c of a K tile's tokens (QK^T over the 576-value row: 36 k steps, Q and K by
//   ldmatrix) and owns output dims [256 c, 256 c + 256) of the same rows (PV over the
//   512-value latent part of the same tile, V^T by ldmatrix.trans: O is 128 fp32 registers).
// - The two warps of a row group exchange their row maxima and write P (rounded to T) to
//   shared memory, so both see the same running maximum and the whole tile's P as A
//   fragments; their partial row sums meet at the end.
// - K tiles of kTileTokens tokens (32; 16 for one row group) are gathered through the block
//   table with cp.async into a kStages-deep shared ring, kThreads / kTileTokens threads a row
//   (one table read each). Q is copied once into shared memory. Rows are XOR-swizzled by
//   16-byte chunk (chunk c of row r at c ^ (r & 7)), so ldmatrix's eight rows hit eight bank
//   groups. Any block size works.
// - Tokens outside the split's part of AttendedRange(seq_len, window_left) are zero-filled,
//   never read, and masked to -inf, so NaN past seq_len never reaches an mma.
// - Split-KV writes normalised partials (o, natural-log lse) for MergeAttnStates, exactly as
//   PagedDecodeMlaKernel does.
//
// Layouts: q [num_seqs][num_q_heads][576] (seq stride q_seq_stride), out
// [num_seqs][num_q_heads][512]; the cache is MLA (one 576-value row per token, kv_stride 0).
// Dynamic shared memory (MlaMmaConfig::kSharedBytes): Q [rows][72 chunks], the K ring
// [stage][kTileTokens][72 chunks], P [rows][kTileTokens + 8 padding values], row statistics
// [row group][half][16] floats.
#ifndef KVPAGE_KERNELS_PAGED_DECODE_MLA_MMA_KERNEL_CUH_
#define KVPAGE_KERNELS_PAGED_DECODE_MLA_MMA_KERNEL_CUH_

#include <cstdint>

#include "kernels/grid_dependency.cuh"
#include "kernels/mma.cuh"
#include "kernels/paged_decode_kernel.cuh"
#include "kernels/paged_decode_mla_kernel.cuh"
#include "kernels/vec.cuh"
#include "kvpage/kernel_layout.h"

namespace kvpage::cuda::internal {

constexpr int kMlaMmaMaxHeads = 64;                 // query heads a CTA holds at most
constexpr int kMlaChunks = kMlaRowDim / 8;          // 72 chunks of 16 bytes a row
constexpr int kMlaRowBytes = kMlaRowDim * 2;        // 1,152
constexpr int kMlaKSteps = kMlaRowDim / 16;         // 36 k steps of S = Q K^T
constexpr int kMlaHalfDimTiles = kMlaLatentDim / 16;  // 32 n tiles of O a warp holds

// Sizes of the kernel for kRowGroups groups of 16 query heads (1, 2 or 4).
template <int kRowGroups>
struct MlaMmaConfig {
  static_assert(kRowGroups == 1 || kRowGroups == 2 || kRowGroups == 4);
  static constexpr int kRows = 16 * kRowGroups;
  static constexpr int kWarps = 2 * kRowGroups;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kTileTokens = kRowGroups == 1 ? 16 : 32;
  static constexpr int kHalfTokens = kTileTokens / 2;  // S columns of one warp
  static constexpr int kStages = kRowGroups == 4 ? 3 : 2;
  // Resident CTAs a SM is compiled for: 8 warps whatever kRowGroups, within 227 KiB.
  static constexpr int kMinCtas = 4 / kRowGroups;
  static constexpr int kTileBytes = kTileTokens * kMlaRowBytes;
  static constexpr int kPRowBytes = kTileTokens * 2 + 16;  // padded: conflict-free ldmatrix
  static constexpr int kQBytes = kRows * kMlaRowBytes;
  static constexpr int kRingOffset = kQBytes;
  static constexpr int kPOffset = kRingOffset + kStages * kTileBytes;
  static constexpr int kStatOffset = kPOffset + kRows * kPRowBytes;
  static constexpr int kSharedBytes = kStatOffset + kRowGroups * 2 * 16 * 4;
};

// The S fragments of one warp: [kHalfTokens / 8 n tiles][4].
template <int kRowGroups>
using MlaScores = float[MlaMmaConfig<kRowGroups>::kHalfTokens / 8][4];

// Shared address of row r, chunk `chunk` in a swizzled [rows][72 chunks] area.
__device__ __forceinline__ int32_t MlaSwizzled(int32_t r, int32_t chunk) {
  return r * kMlaRowBytes + ((chunk ^ (r & 7)) * 16);
}

// Byte offsets in a swizzled area of chunks step * j + x (j < kCount, all below 8) of row
// `row`. Chunk 8 b + y of a row sits at MlaSwizzled(row, y) + 128 b, so with b a constant of
// an unrolled loop every ldmatrix address is one of these plus an immediate.
template <int kCount>
__device__ __forceinline__ void MlaChunkOffsets(int32_t row, int32_t x, int32_t step,
                                                int32_t (&offs)[kCount]) {
#pragma unroll
  for (int j = 0; j < kCount; ++j) offs[j] = MlaSwizzled(row, step * j + x);
}

// The running state of the lane's rows g (h = 0) and g + 8 (h = 1) of its row group, over
// output dims 256 c + 8 n + 2 q (+1).
struct MlaRowState {
  float o[kMlaHalfDimTiles][4];
  float m_run[2];   // log2 domain, equal over the row group's two warps
  float l_part[2];  // this lane's part of the row sums over its warp's tokens
};

// One tile's position in the split and the warp's place in the CTA.
struct MlaWarpPlace {
  int32_t r;     // row group
  int32_t c;     // half: S columns [c * kHalfTokens, +kHalfTokens), O dims [256 c, +256)
  int32_t lane;
};

// Copies the CTA's query heads into the swizzled Q area (zero rows past the last head).
template <typename T, int kRowGroups>
__device__ __forceinline__ void MlaCopyQ(const DecodeArgs& a, int32_t head0, char* q_smem) {
  using C = MlaMmaConfig<kRowGroups>;
  const T* q_seq = static_cast<const T*>(a.q) + static_cast<int64_t>(blockIdx.y) * a.q_seq_stride;
  for (int32_t e = static_cast<int32_t>(threadIdx.x); e < C::kRows * kMlaChunks;
       e += C::kThreads) {
    const int32_t row = e / kMlaChunks, chunk = e % kMlaChunks;
    const bool valid = head0 + row < a.num_q_heads;
    const T* src = valid ? q_seq + static_cast<int64_t>(head0 + row) * kMlaRowDim + chunk * 8
                         : q_seq;
    CpAsync16(q_smem + MlaSwizzled(row, chunk), src, valid);
  }
}

// Issues the cp.async copies of the K tile starting at token t0 into `dst`: kPerRow threads
// a row (8 or 4), thread j of a row copying chunks j, j + kPerRow, ... Each thread reads the
// block table once and every copy's source and destination is a register plus an immediate;
// per copy instruction the kPerRow threads of a row read kPerRow x 16 contiguous bytes.
template <typename T, int kRowGroups>
__device__ __forceinline__ void MlaIssueTile(const DecodeArgs& a, const int32_t* table_row,
                                             int32_t t0, int32_t end, char* dst) {
  using C = MlaMmaConfig<kRowGroups>;
  constexpr int kPerRow = C::kThreads / C::kTileTokens;
  constexpr int kCopies = kMlaChunks / kPerRow;
  constexpr int kPerGroup = 8 / kPerRow;  // copies of a thread within 8 chunks (one swizzle group)
  static_assert(kPerRow * C::kTileTokens == C::kThreads && kPerGroup * kPerRow == 8);
  const int32_t row = static_cast<int32_t>(threadIdx.x) / kPerRow;
  const int32_t first = static_cast<int32_t>(threadIdx.x) % kPerRow;
  const int32_t t = t0 + row;
  const bool valid = t < end;  // tokens at or past `end` are never looked up (zero fill)
  const T* src = static_cast<const T*>(a.cache);
  if (valid) {
    const int64_t block = __ldg(table_row + t / a.block_size);
    src += block * a.block_stride + (t % a.block_size) * a.token_stride;
  }
  // Chunk first + kPerRow k sits at offs[k % kPerGroup] + 128 (k / kPerGroup).
  int32_t offs[kPerGroup];
  MlaChunkOffsets(row, first, kPerRow, offs);
#pragma unroll
  for (int k = 0; k < kCopies; ++k) {
    CpAsync16(dst + offs[k % kPerGroup] + 128 * (k / kPerGroup), src + (first + kPerRow * k) * 8,
              valid);
  }
}

// S = Q K^T for the warp's 16 rows and its kHalfTokens tokens of the tile in `k_tile`:
// s[j] = the C fragment of tokens 8 j .. 8 j + 7 of the half. Q and K by ldmatrix (K in
// pairs of 8-token matrices, or one 8-token matrix over two k steps).
template <typename T, int kRowGroups>
__device__ __forceinline__ void MlaTileScores(const char* q_smem, const char* k_tile,
                                              const MlaWarpPlace& w, MlaScores<kRowGroups>& s) {
  using C = MlaMmaConfig<kRowGroups>;
  constexpr int kN = C::kHalfTokens / 8;
  const int32_t lane = w.lane;
  const int32_t k_base = w.c * C::kHalfTokens;
  // Chunk 2 ks + x of the lane's Q row is at q_off[ks % 4] + 128 (ks / 4).
  int32_t q_off[4];
  MlaChunkOffsets(16 * w.r + (lane & 7) + ((lane >> 3) & 1) * 8, lane >> 4, 2, q_off);
#pragma unroll
  for (int j = 0; j < kN; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) s[j][e] = 0.0f;
  }
  if constexpr (kN == 2) {
    // Matrices: tokens 0-7 / 8-15 of the half, chunk 2 ks + 0 / 1: b of n tiles 0 and 1.
    int32_t k_off[4];
    MlaChunkOffsets(k_base + (lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1, 2, k_off);
#pragma unroll
    for (int ks = 0; ks < kMlaKSteps; ++ks) {
      uint32_t qa[4], kb[4];
      LdMatrixX4(qa, q_smem + q_off[ks % 4] + 128 * (ks / 4));
      LdMatrixX4(kb, k_tile + k_off[ks % 4] + 128 * (ks / 4));
      const uint32_t b0[2] = {kb[0], kb[1]}, b1[2] = {kb[2], kb[3]};
      Mma16816<T>(s[0], qa, b0);
      Mma16816<T>(s[1], qa, b1);
    }
  } else {
    // One 8-token matrix per chunk 2 ks .. 2 ks + 3 (ks even): b of k steps ks and ks + 1.
    int32_t k_off[2];
    MlaChunkOffsets(k_base + (lane & 7), lane >> 3, 4, k_off);
#pragma unroll
    for (int ks = 0; ks < kMlaKSteps; ks += 2) {
      uint32_t qa0[4], qa1[4], kb[4];
      LdMatrixX4(qa0, q_smem + q_off[ks % 4] + 128 * (ks / 4));
      LdMatrixX4(qa1, q_smem + q_off[(ks + 1) % 4] + 128 * (ks / 4));
      LdMatrixX4(kb, k_tile + k_off[ks % 4 / 2] + 128 * (ks / 4));
      const uint32_t b0[2] = {kb[0], kb[1]}, b1[2] = {kb[2], kb[3]};
      Mma16816<T>(s[0], qa0, b0);
      Mma16816<T>(s[0], qa1, b1);
    }
  }
}

// The online-softmax step of one tile for the warp's rows: scales and masks (tokens at or
// past `end`) the scores, meets the partner warp's row maxima in `stat`, turns the scores into
// weights written as T to the P area, and rescales O and the partial sums.
template <typename T, int kRowGroups>
__device__ __forceinline__ void MlaSoftmaxStep(const DecodeArgs& a, int32_t t0, int32_t end,
                                               const MlaWarpPlace& w, char* p_smem,
                                               float* stat, MlaScores<kRowGroups>& s,
                                               MlaRowState& st) {
  using C = MlaMmaConfig<kRowGroups>;
  constexpr int kN = C::kHalfTokens / 8;
  const int32_t g = w.lane / 4, q = w.lane % 4;
  const int32_t first = t0 + w.c * C::kHalfTokens;  // the token of column 0 of the half
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int j = 0; j < kN; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const bool in = first + 8 * j + 2 * q + e % 2 < end;
      s[j][e] = in ? s[j][e] * a.scale_log2 : -INFINITY;
      mx[e / 2] = fmaxf(mx[e / 2], s[j][e]);
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
    if (q == 0) stat[(2 * w.r + w.c) * 16 + g + 8 * h] = mx[h];
  }
  __syncthreads();
  float corr[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float partner = stat[(2 * w.r + 1 - w.c) * 16 + g + 8 * h];
    // Finite: every tile has a token in range, and all rows see the same tokens.
    const float m_new = fmaxf(st.m_run[h], fmaxf(mx[h], partner));
    corr[h] = exp2f(st.m_run[h] - m_new);  // 0 on the first tile (m_run = -inf)
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < kN; ++j) {
      s[j][2 * h] = exp2f(s[j][2 * h] - m_new);
      s[j][2 * h + 1] = exp2f(s[j][2 * h + 1] - m_new);
      sum += s[j][2 * h] + s[j][2 * h + 1];
      const int32_t row = 16 * w.r + g + 8 * h;
      const int32_t col = w.c * C::kHalfTokens + 8 * j + 2 * q;
      *reinterpret_cast<uint32_t*>(p_smem + row * C::kPRowBytes + col * 2) =
          PackPair<T>(s[j][2 * h], s[j][2 * h + 1]);
    }
    st.l_part[h] = st.l_part[h] * corr[h] + sum;
    st.m_run[h] = m_new;
  }
  if (corr[0] == 1.0f && corr[1] == 1.0f) return;  // neither maximum moved: O stays (exact)
#pragma unroll
  for (int n = 0; n < kMlaHalfDimTiles; ++n) {
    st.o[n][0] *= corr[0];
    st.o[n][1] *= corr[0];
    st.o[n][2] *= corr[1];
    st.o[n][3] *= corr[1];
  }
}

// O += P V over the tile's tokens for the warp's rows and dims: P by ldmatrix from the P
// area, V (the latent part of the K tile) by ldmatrix.trans, matrices 0/1 giving b0/b1 of dim
// tile 2 np and 2/3 those of 2 np + 1.
template <typename T, int kRowGroups>
__device__ __forceinline__ void MlaAccumulatePV(const char* p_smem, const char* v_tile,
                                                const MlaWarpPlace& w, MlaRowState& st) {
  using C = MlaMmaConfig<kRowGroups>;
  const int32_t lane = w.lane;
  const int32_t p_row = 16 * w.r + (lane & 7) + ((lane >> 3) & 1) * 8, p_half = lane >> 4;
  // Chunk 32 c + 2 np + x of the lane's V row (row & 7 is the same for 16 kk + v_row) is at
  // v_off[np % 4] + 128 (np / 4), past the half's first 32 chunks.
  int32_t v_off[4];
  MlaChunkOffsets((lane & 7) + ((lane >> 3) & 1) * 8, lane >> 4, 2, v_off);
  const char* v_dims = v_tile + 32 * 16 * w.c;
#pragma unroll
  for (int kk = 0; kk < C::kTileTokens / 16; ++kk) {
    uint32_t pa[4];
    LdMatrixX4(pa, p_smem + p_row * C::kPRowBytes + (2 * kk + p_half) * 16);
#pragma unroll
    for (int np = 0; np < kMlaHalfDimTiles / 2; ++np) {
      uint32_t vb[4];
      LdMatrixX4Trans(vb, v_dims + v_off[np % 4] + 128 * (np / 4) + 16 * kk * kMlaRowBytes);
      const uint32_t b0[2] = {vb[0], vb[1]}, b1[2] = {vb[2], vb[3]};
      Mma16816<T>(st.o[2 * np], pa, b0);
      Mma16816<T>(st.o[2 * np + 1], pa, b1);
    }
  }
}

// Adds the partner warp's partial row sums (through `stat`), normalises and stores the
// lane's rows: to out, or as the split's partial (o and its natural-log lse).
template <typename T>
__device__ __forceinline__ void MlaStoreRows(const DecodeArgs& a, int32_t head0,
                                             const MlaWarpPlace& w, float* stat,
                                             const MlaRowState& st) {
  const int32_t g = w.lane / 4, q = w.lane % 4;
  float l[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] = st.l_part[h];
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    if (q == 0) stat[(2 * w.r + w.c) * 16 + g + 8 * h] = l[h];
  }
  __syncthreads();
  const int32_t seq = static_cast<int32_t>(blockIdx.y), split = static_cast<int32_t>(blockIdx.z);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float l_all = l[h] + stat[(2 * w.r + 1 - w.c) * 16 + g + 8 * h];
    const int32_t head = head0 + 16 * w.r + g + 8 * h;
    if (head >= a.num_q_heads) continue;
    const float inv_l = l_all > 0.0f ? 1.0f / l_all : 0.0f;
    const int64_t out_row = static_cast<int64_t>(seq) * a.num_q_heads + head;
    const int32_t dim0 = 256 * w.c + 2 * q;
    if (a.ws_o == nullptr) {
      T* dst = static_cast<T*>(a.out) + out_row * kMlaLatentDim + dim0;
#pragma unroll
      for (int n = 0; n < kMlaHalfDimTiles; ++n) {
        *reinterpret_cast<uint32_t*>(dst + 8 * n) =
            PackPair<T>(st.o[n][2 * h] * inv_l, st.o[n][2 * h + 1] * inv_l);
      }
      continue;
    }
    const int64_t at = out_row * a.num_splits + split;
    float* dst = a.ws_o + at * kMlaLatentDim + dim0;
#pragma unroll
    for (int n = 0; n < kMlaHalfDimTiles; ++n) {
      *reinterpret_cast<float2*>(dst + 8 * n) =
          make_float2(st.o[n][2 * h] * inv_l, st.o[n][2 * h + 1] * inv_l);
    }
    if (w.c == 0 && q == 0) {
      a.ws_lse[at] = l_all > 0.0f ? (st.m_run[h] + __log2f(l_all)) * kLn2 : -INFINITY;
    }
  }
}

template <typename T, int kRowGroups>
__global__ void __launch_bounds__(MlaMmaConfig<kRowGroups>::kThreads,
                                  MlaMmaConfig<kRowGroups>::kMinCtas)
    PagedDecodeMlaMmaKernel(const DecodeArgs a) {
  using C = MlaMmaConfig<kRowGroups>;
  char* const smem = DynamicShared();
  char* const q_smem = smem;
  char* const ring = smem + C::kRingOffset;
  char* const p_smem = smem + C::kPOffset;
  float* const stat = reinterpret_cast<float*>(smem + C::kStatOffset);

  const int32_t head0 = static_cast<int32_t>(blockIdx.x) * C::kRows;
  const int32_t seq = static_cast<int32_t>(blockIdx.y);
  const int32_t warp = static_cast<int32_t>(threadIdx.x) / 32;
  const MlaWarpPlace w{warp / 2, warp % 2, static_cast<int32_t>(threadIdx.x) % 32};

  const TokenRange range =
      SplitRange(AttendedRange(a.seq_lens[seq], a.window_left), a.chunk_tokens,
                 static_cast<int32_t>(blockIdx.z), a.num_splits);
  const int32_t num_tiles =
      range.end > range.begin ? (range.end - range.begin + C::kTileTokens - 1) / C::kTileTokens
                              : 0;
  const int32_t* table_row = a.table + static_cast<int64_t>(seq) * a.row_stride;

  MlaRowState st;
#pragma unroll
  for (int n = 0; n < kMlaHalfDimTiles; ++n) {
#pragma unroll
    for (int i = 0; i < 4; ++i) st.o[n][i] = 0.0f;
  }
  st.m_run[0] = st.m_run[1] = -INFINITY;
  st.l_part[0] = st.l_part[1] = 0.0f;

  MlaCopyQ<T, kRowGroups>(a, head0, q_smem);  // joins the first commit group
#pragma unroll
  for (int s = 0; s < C::kStages - 1; ++s) {
    if (s < num_tiles) {
      MlaIssueTile<T, kRowGroups>(a, table_row, range.begin + s * C::kTileTokens, range.end,
                                  ring + s * C::kTileBytes);
    }
    CpAsyncCommit();
  }
  for (int32_t i = 0; i < num_tiles; ++i) {
    const int32_t ahead = i + C::kStages - 1;
    if (ahead < num_tiles) {
      MlaIssueTile<T, kRowGroups>(a, table_row, range.begin + ahead * C::kTileTokens,
                                  range.end, ring + (ahead % C::kStages) * C::kTileBytes);
    }
    CpAsyncCommit();
    CpAsyncWait<C::kStages - 1>();
    __syncthreads();
    const char* k_tile = ring + (i % C::kStages) * C::kTileBytes;
    MlaScores<kRowGroups> s;
    MlaTileScores<T, kRowGroups>(q_smem, k_tile, w, s);
    MlaSoftmaxStep<T, kRowGroups>(a, range.begin + i * C::kTileTokens, range.end, w, p_smem,
                                  stat, s, st);
    __syncthreads();  // P complete
    MlaAccumulatePV<T, kRowGroups>(p_smem, k_tile, w, st);
    __syncthreads();  // the stage, P and stat are free again
  }
  CpAsyncWait<0>();

  MlaStoreRows<T>(a, head0, w, stat, st);
  TriggerDependentGrids();  // after this thread's last store: the merge may be scheduled
}

// Whether PagedDecodeMla runs this kernel: always with plan.use_tensor_cores, never with
// plan.force_cuda_cores; otherwise where the device has sm_80-class tensor cores (compute
// capability major `cc_major` >= 8) and there are more query heads than the CUDA-core
// kernel's tile of kMlaHeadTile, which would read each row more than once per token.
// REQUIRES: not both flags (PagedDecodeMla rejects that).
inline bool UseMlaTensorCores(const DecodeParams& params, const DecodePlan& plan,
                              int32_t cc_major) {
  if (plan.use_tensor_cores || plan.force_cuda_cores) return plan.use_tensor_cores;
  return cc_major >= 8 && params.num_q_heads > kMlaHeadTile;
}

// Kernel arguments and grid of one PagedDecodeMla call on tensor cores, shared by the
// launcher and the host emulation test: group_tile = query heads a CTA holds (16, 32 or 64).
// REQUIRES: arguments already validated by PagedDecodeMla.
inline DecodeLaunch MakeMlaMmaDecodeLaunch(void* out, const void* q, int64_t q_seq_stride,
                                           const KvCacheView& cache, const BlockTableView& table,
                                           const DecodeParams& params, const DecodePlan& plan,
                                           void* workspace) {
  DecodeLaunch l = MakeMlaDecodeLaunch(out, q, q_seq_stride, cache, table, params, plan,
                                       workspace);
  const int32_t rows = MlaDecodeHeadTile(params.num_q_heads, /*tensor_cores=*/true);
  const int32_t tiles = MlaDecodeHeadTiles(params.num_q_heads, /*tensor_cores=*/true);
  l.args.head_tiles = tiles;
  l.group_tile = rows;
  l.tensor_cores = true;
  l.threads = 4 * rows;  // 2 warps (64 threads) a row group of 16
  l.grid[0] = static_cast<unsigned int>(tiles);
  return l;
}

}  // namespace kvpage::cuda::internal

#endif  // KVPAGE_KERNELS_PAGED_DECODE_MLA_MMA_KERNEL_CUH_
