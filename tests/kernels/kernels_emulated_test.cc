// The CUDA kernel sources (kernels/*_kernel.cuh) compiled with g++ against
// kernels/emulation/cuda_emulation.h and run on the CPU: every CUDA thread is a fiber, and
// shuffles and __syncthreads are real barriers. Checked against the CPU references like the
// GPU tests, so indexing, masking, the softmax merges and the split/merge protocol are tested
// in every build, with or without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/check/bandwidth_targets.h"
#include "kernels/check/decode_problem.h"
#include "kernels/check/prefill_problem.h"
#include "kernels/copy_slots_kernel.cuh"
#include "kernels/emulation/cuda_emulation.h"
#include "kernels/merge_attn_states_kernel.cuh"
#include "kernels/merge_launch.h"
#include "kernels/paged_decode_kernel.cuh"
#include "kernels/paged_decode_mla_kernel.cuh"
#include "kernels/paged_decode_mla_mma_kernel.cuh"
#include "kernels/paged_decode_mma_kernel.cuh"
#include "kernels/paged_decode_select.cuh"
#include "kernels/paged_prefill_kernel.cuh"
#include "kernels/paged_prefill_tiled_kernel.cuh"
#include "kernels/table_runs_kernel.cuh"
#include "kernels/write_kv_kernel.cuh"
#include "kvpage/kernel_reference.h"

namespace kvpage::cuda {
namespace {

using check::DecodeCase;
using check::DecodeProblem;
using emulation::Launch;

constexpr uint16_t kHalfNan = 0xffff;

// The CUDA-core kernel for q/out type T and cache element type TC (T or Fp8E4m3), chosen as
// the launcher chooses it.
template <typename T, typename TC>
void LaunchCudaCoreDecode(const internal::DecodeLaunch& l, int32_t head_dim) {
  const internal::DecodeKernelFn kernel =
      internal::CudaCoreDecodeKernel<T, TC>(head_dim, l.group_tile);
  ASSERT_NE(kernel, nullptr) << "no decode kernel for head_dim " << head_dim;
  Launch(dim3(l.grid[0], l.grid[1], l.grid[2]), dim3(internal::kDecodeThreads), kernel, l.args);
}

template <typename T>
void LaunchDecode(const internal::DecodeLaunch& l, int32_t head_dim, bool fp8_kv) {
  const dim3 grid(l.grid[0], l.grid[1], l.grid[2]);
  const dim3 block(static_cast<unsigned int>(l.threads));
  if (l.tensor_cores) {
    ASSERT_FALSE(fp8_kv) << "the tensor-core kernel reads no fp8 cache";
    if (head_dim == 64) Launch(grid, block, internal::PagedDecodeMmaKernel<T, 64>, l.args);
    if (head_dim == 128) Launch(grid, block, internal::PagedDecodeMmaKernel<T, 128>, l.args);
    if (head_dim == 256) Launch(grid, block, internal::PagedDecodeMmaKernel<T, 256>, l.args);
    return;
  }
  if (fp8_kv) {
    LaunchCudaCoreDecode<T, internal::Fp8E4m3>(l, head_dim);
  } else {
    LaunchCudaCoreDecode<T, T>(l, head_dim);
  }
}

// The MLA kernel of a PagedDecodeMla launch: CUDA cores, or tensor cores with the row groups
// of l.group_tile and their dynamic shared memory.
template <typename T, int kRowGroups>
void LaunchMlaMma(const internal::DecodeLaunch& l) {
  using C = internal::MlaMmaConfig<kRowGroups>;
  ASSERT_EQ(l.threads, C::kThreads);
  emulation::LaunchShared(dim3(l.grid[0], l.grid[1], l.grid[2]), dim3(C::kThreads),
                          C::kSharedBytes, internal::PagedDecodeMlaMmaKernel<T, kRowGroups>,
                          l.args);
}
template <typename T>
void LaunchMla(const internal::DecodeLaunch& l) {
  if (!l.tensor_cores) {
    Launch(dim3(l.grid[0], l.grid[1], l.grid[2]), dim3(l.threads),
           internal::PagedDecodeMlaKernel<T>, l.args);
  } else if (l.group_tile == 16) {
    LaunchMlaMma<T, 1>(l);
  } else if (l.group_tile == 32) {
    LaunchMlaMma<T, 2>(l);
  } else {
    ASSERT_EQ(l.group_tile, 64);
    LaunchMlaMma<T, 4>(l);
  }
}

// What the PagedDecode launcher does, with the emulated launches.
std::vector<uint16_t> RunDecode(const DecodeProblem& p) {
  const DecodeCase& c = p.c;
  const int32_t hq = p.num_q_heads();
  std::vector<uint16_t> out(static_cast<size_t>(p.out_elements()), kHalfNan);
  const int64_t rows = static_cast<int64_t>(c.num_seqs) * hq;
  const int32_t out_dim = p.out_dim();
  std::vector<float> ws(p.plan.num_splits > 1 ? rows * p.plan.num_splits * (out_dim + 1) : 0,
                        NAN);
  std::vector<uint16_t> cache = p.cache;
  // PagedDecodeMla's choice on an sm_90 device.
  const bool mla_mma = c.mla && internal::UseMlaTensorCores(p.params, p.plan, /*cc_major=*/9);
  EXPECT_EQ(mla_mma, c.mla && c.MlaTensorCores()) << c.Name();
  const auto make_launch = !c.mla  ? internal::MakeDecodeLaunch
                           : mla_mma ? internal::MakeMlaMmaDecodeLaunch
                                     : internal::MakeMlaDecodeLaunch;
  const internal::DecodeLaunch l = make_launch(
      out.data(), p.q.data(), static_cast<int64_t>(hq) * c.head_dim, p.View(cache.data()),
      BlockTableView{p.table.data(), p.max_blocks, p.lens.data(), c.num_seqs}, p.params, p.plan,
      ws.data());
  const bool bf16 = c.dtype == DType::kBF16;
  if (c.mla && bf16) {
    LaunchMla<__nv_bfloat16>(l);
  } else if (c.mla) {
    LaunchMla<__half>(l);
  } else if (bf16) {
    LaunchDecode<__nv_bfloat16>(l, c.head_dim, c.fp8_kv);
  } else {
    LaunchDecode<__half>(l, c.head_dim, c.fp8_kv);
  }
  if (p.plan.num_splits > 1) {
    const dim3 merge_grid(static_cast<unsigned int>(rows));
    const dim3 block(internal::kMergeThreads);
    if (bf16) {
      Launch(merge_grid, block, internal::MergeKernel<__nv_bfloat16>,
             reinterpret_cast<__nv_bfloat16*>(out.data()), static_cast<float*>(nullptr),
             static_cast<const float*>(l.args.ws_o), static_cast<const float*>(l.args.ws_lse),
             p.plan.num_splits, out_dim);
    } else {
      Launch(merge_grid, block, internal::MergeKernel<__half>,
             reinterpret_cast<__half*>(out.data()), static_cast<float*>(nullptr),
             static_cast<const float*>(l.args.ws_o), static_cast<const float*>(l.args.ws_lse),
             p.plan.num_splits, out_dim);
    }
  }
  EXPECT_EQ(cache, p.cache) << "decode wrote to the cache";
  return out;
}

TEST(EmulatedKernelsTest, PagedDecodeMatchesReference) {
  // dtype, seqs, kv heads, group, head_dim, block, max_len, window, splits
  const DecodeCase cases[] = {
      {DType::kBF16, 7, 2, 4, 128, 16, 100, -1, 0},
      {DType::kF16, 7, 1, 8, 256, 64, 150, -1, 0},   // GQA 8, head_dim 256, block 64
      {DType::kBF16, 6, 1, 1, 64, 16, 70, -1, 0},
      {DType::kF16, 6, 2, 2, 64, 64, 130, -1, 0},
      {DType::kBF16, 6, 1, 6, 128, 16, 90, -1, 0},   // group 6 in a tile of 8
      {DType::kBF16, 6, 1, 16, 128, 16, 40, -1, 0},  // two CTAs per KV head
      {DType::kBF16, 8, 2, 2, 128, 16, 200, 37, 0},  // sliding window
      {DType::kF16, 7, 1, 8, 256, 64, 300, 100, 0},
      {DType::kBF16, 6, 1, 4, 128, 16, 700, -1, 5},  // split-KV
      {DType::kF16, 6, 1, 4, 64, 16, 500, 150, 3},   // split-KV inside a window
      {DType::kBF16, 7, 1, 4, 128, 16, 1200, -1, 0},  // planned split (a wave of 64 CTAs)
  };
  for (bool tensor_cores : {false, true}) {
    uint32_t seed = 300;
    for (DecodeCase c : cases) {
      c.tensor_cores = tensor_cores;
      DecodeProblem p;
      ASSERT_TRUE(check::MakeDecodeProblem(c, seed++, 16, 4, &p).ok());
      if (c.num_splits > 0 || c.max_len == 1200) {
        EXPECT_GT(p.plan.num_splits, 1) << c.Name();
      }
      double err = 0;
      EXPECT_EQ(check::CompareDecode(p, RunDecode(p), &err), absl::OkStatus()) << c.Name();
    }
  }
}

// An fp8 e4m3 cache (per-tensor scales 0.0213 / 0.0087) read by the CUDA-core kernel with
// bf16 or fp16 q and out: the reference dequantises the same stored bytes, so the tolerances
// are the 16-bit ones.
TEST(EmulatedKernelsTest, PagedDecodeReadsFp8Cache) {
  // dtype (q, out), seqs, kv heads, group, head_dim, block, max_len, window, splits
  const DecodeCase cases[] = {
      {DType::kBF16, 7, 2, 4, 128, 16, 100, -1, 0},
      {DType::kF16, 6, 1, 1, 64, 16, 70, -1, 0},
      {DType::kBF16, 7, 1, 8, 256, 64, 150, -1, 0},
      {DType::kF16, 8, 2, 2, 128, 16, 200, 37, 0},   // sliding window
      {DType::kBF16, 6, 1, 4, 128, 16, 700, -1, 5},  // split-KV
      {DType::kBF16, 6, 1, 6, 96, 16, 90, -1, 0},    // head_dim 96, group 6
      {DType::kF16, 6, 2, 2, 80, 64, 130, -1, 0},
      {DType::kBF16, 6, 1, 4, 192, 16, 300, -1, 3},
  };
  uint32_t seed = 500;
  for (DecodeCase c : cases) {
    c.fp8_kv = true;
    DecodeProblem p;
    ASSERT_TRUE(check::MakeDecodeProblem(c, seed++, 16, 4, &p).ok());
    ASSERT_EQ(p.params.k_scale, check::kFp8KScale);
    double err = 0;
    EXPECT_EQ(check::CompareDecode(p, RunDecode(p), &err), absl::OkStatus()) << c.Name();
  }
}

// head_dim 80, 96 and 192 on the CUDA-core kernel: 10, 12 and 24 lanes of a token's 16 or 32
// hold data, the rest idle (docs/kernels.md §3).
TEST(EmulatedKernelsTest, PagedDecodeHeadDims80_96_192) {
  // dtype, seqs, kv heads, group, head_dim, block, max_len, window, splits
  const DecodeCase cases[] = {
      {DType::kBF16, 7, 2, 4, 80, 16, 100, -1, 0},
      {DType::kF16, 7, 1, 8, 96, 64, 150, -1, 0},
      {DType::kBF16, 6, 2, 1, 192, 16, 130, -1, 0},
      {DType::kF16, 8, 1, 2, 80, 16, 200, 37, 0},     // sliding window
      {DType::kBF16, 6, 1, 4, 192, 16, 700, -1, 5},   // split-KV
      {DType::kBF16, 6, 1, 16, 96, 16, 40, -1, 0},    // two CTAs per KV head
      {DType::kF16, 6, 1, 6, 192, 64, 300, 100, 0},   // group 6, window
      {DType::kBF16, 7, 1, 4, 80, 16, 1200, -1, 0},   // planned split
  };
  uint32_t seed = 600;
  for (const DecodeCase& c : cases) {
    DecodeProblem p;
    ASSERT_TRUE(check::MakeDecodeProblem(c, seed++, 16, 4, &p).ok());
    double err = 0;
    EXPECT_EQ(check::CompareDecode(p, RunDecode(p), &err), absl::OkStatus()) << c.Name();
  }
}

// Absorbed MLA decode on CUDA cores (the plan forces the reference kernel), the DeepSeek
// shape (576-value latent rows, 512 out), against ref::PagedDecodeMla: 16 query heads (4 CTAs
// of 4), a partial tile of 2, a window, splits.
TEST(EmulatedKernelsTest, PagedDecodeMlaMatchesReference) {
  // dtype, seqs, kv heads, group (= query heads), row, block, max_len, window, splits
  const DecodeCase cases[] = {
      {DType::kBF16, 7, 1, 16, 576, 64, 150, -1, 0},
      {DType::kF16, 6, 1, 6, 576, 16, 100, -1, 0},   // tiles of 4 and 2
      {DType::kBF16, 8, 1, 4, 576, 16, 200, 37, 0},  // sliding window
      {DType::kF16, 6, 1, 8, 576, 64, 700, -1, 4},   // split-KV
      {DType::kBF16, 6, 1, 1, 576, 16, 300, 100, 3},  // split-KV in a window, one head
  };
  uint32_t seed = 700;
  for (DecodeCase c : cases) {
    c.mla = true;
    c.cuda_cores = true;
    DecodeProblem p;
    ASSERT_TRUE(check::MakeDecodeProblem(c, seed++, 16, 2, &p).ok());
    double err = 0;
    EXPECT_EQ(check::CompareDecode(p, RunDecode(p), &err), absl::OkStatus()) << c.Name();
  }
}

// The tensor-core MLA kernel against ref::PagedDecodeMla: 16, 32, 64 and 128 query heads
// (CTAs of 16, 32, 64 and two of 64), a partial row group (6 heads, forced; 40 heads, chosen),
// blocks of 16, 32 and 64, sliding windows, splits (also inside a window), and lengths 1,
// bs - 1, bs, bs + 1, 0 and random up to max_len (MakeDecodeProblem), so the last K tile is
// partial and some tiles straddle blocks.
TEST(EmulatedKernelsTest, PagedDecodeMlaTensorCoresMatchReference) {
  // dtype, seqs, kv heads, group (= query heads), row, block, max_len, window, splits
  const DecodeCase cases[] = {
      {DType::kBF16, 7, 1, 16, 576, 16, 100, -1, 0},
      {DType::kF16, 6, 1, 64, 576, 32, 90, -1, 0},
      {DType::kBF16, 6, 1, 128, 576, 16, 70, -1, 0},   // two CTAs of 64 heads
      {DType::kF16, 6, 1, 32, 576, 64, 150, 37, 0},    // sliding window
      {DType::kBF16, 6, 1, 16, 576, 32, 300, -1, 3},   // split-KV
      {DType::kBF16, 6, 1, 64, 576, 16, 200, 100, 2},  // split-KV inside a window
      {DType::kF16, 6, 1, 40, 576, 16, 60, -1, 0},     // 40 heads: a CTA of 64, 24 masked
      {DType::kBF16, 6, 1, 6, 576, 32, 80, 20, 0, 0, /*tensor_cores=*/true},  // forced, 6
  };
  uint32_t seed = 750;
  for (DecodeCase c : cases) {
    c.mla = true;
    ASSERT_TRUE(c.MlaTensorCores()) << c.Name();
    DecodeProblem p;
    ASSERT_TRUE(check::MakeDecodeProblem(c, seed++, 16, 2, &p).ok());
    if (c.num_splits > 0) {
      EXPECT_GT(p.plan.num_splits, 1) << c.Name();
    }
    double err = 0;
    EXPECT_EQ(check::CompareDecode(p, RunDecode(p), &err), absl::OkStatus()) << c.Name();
  }
}

// The tensor-core MLA kernel keeps 8 warps resident per SM on sm_90 at any register count
// ptxas may choose (up to 255): 16 heads = 4 CTAs of 2 warps, 32 = 2 of 4, 64 = 1 of 8.
// Shared memory (Q + ring + P + row statistics):
//   16 heads: 16 x 1,152 + 2 x 16 x 1,152 + 16 x 48 + 128 = 56,192 B; 4 x (56,192 + 1 KiB) fit
//   233,472 B; registers 4 x 2 warps x 8,192 = 65,536;
//   32 heads: 36,864 + 2 x 36,864 + 32 x 80 + 256 = 113,408 B, 2 CTAs;
//   64 heads: 73,728 + 3 x 36,864 + 64 x 80 + 512 = 189,952 B, 1 CTA.
TEST(EmulatedKernelsTest, MlaTensorCoreKernelKeepsEightWarpsPerSm) {
  using internal::MlaMmaConfig;
  EXPECT_EQ(MlaMmaConfig<1>::kSharedBytes, 56192);
  EXPECT_EQ(MlaMmaConfig<2>::kSharedBytes, 113408);
  EXPECT_EQ(MlaMmaConfig<4>::kSharedBytes, 189952);
  EXPECT_EQ(Sm90CtasPerSm(255, MlaMmaConfig<1>::kThreads, MlaMmaConfig<1>::kSharedBytes), 4);
  EXPECT_EQ(Sm90CtasPerSm(255, MlaMmaConfig<2>::kThreads, MlaMmaConfig<2>::kSharedBytes), 2);
  EXPECT_EQ(Sm90CtasPerSm(255, MlaMmaConfig<4>::kThreads, MlaMmaConfig<4>::kSharedBytes), 1);
  EXPECT_EQ(MlaMmaConfig<1>::kMinCtas * MlaMmaConfig<1>::kWarps, 8);
  EXPECT_EQ(MlaMmaConfig<2>::kMinCtas * MlaMmaConfig<2>::kWarps, 8);
  EXPECT_EQ(MlaMmaConfig<4>::kMinCtas * MlaMmaConfig<4>::kWarps, 8);
  // CTAs a sequence takes: the tile holding all heads, 64 above that.
  EXPECT_EQ(MlaDecodeHeadTile(6, true), 16);
  EXPECT_EQ(MlaDecodeHeadTile(32, true), 32);
  EXPECT_EQ(MlaDecodeHeadTile(40, true), 64);
  EXPECT_EQ(MlaDecodeHeadTiles(128, true), 2);
  EXPECT_EQ(MlaDecodeHeadTiles(128, false), 32);
}

// Which MLA kernel PagedDecodeMla runs (UseMlaTensorCores): the forced one, else tensor cores
// for more than 4 heads on compute capability >= 8.
TEST(EmulatedKernelsTest, MlaDecodePathChoice) {
  const DecodeParams h16{16, 0.1f, -1}, h4{4, 0.1f, -1}, h5{5, 0.1f, -1};
  const DecodePlan any{}, tc{1, 0, true, false}, cuda{1, 0, false, true};
  EXPECT_TRUE(internal::UseMlaTensorCores(h16, any, 9));
  EXPECT_TRUE(internal::UseMlaTensorCores(h5, any, 8));
  EXPECT_FALSE(internal::UseMlaTensorCores(h4, any, 9));
  EXPECT_FALSE(internal::UseMlaTensorCores(h16, any, 7));
  EXPECT_FALSE(internal::UseMlaTensorCores(h16, cuda, 9));
  EXPECT_TRUE(internal::UseMlaTensorCores(h4, tc, 9));
}

// Which GQA kernel PagedDecode runs (UseDecodeTensorCores): the forced one, else tensor cores
// for a group of at least 2 on compute capability >= 8 where the kernel exists (f16/bf16,
// head_dim 64/128/256, block_size a multiple of 16).
TEST(EmulatedKernelsTest, DecodePathChoice) {
  alignas(16) static uint16_t cache[16];
  const auto view = [&](int32_t bs, int32_t d, DType dtype) {
    return BlocksFirstKvCache(cache, 1, bs, 2, d, dtype);  // 2 KV heads
  };
  const DecodeParams gqa1{2, 0.1f, -1}, gqa2{4, 0.1f, -1}, gqa8{16, 0.1f, -1};
  const DecodePlan any{}, tc{1, 0, true, false}, cuda{1, 0, false, true};
  using internal::UseDecodeTensorCores;
  EXPECT_TRUE(UseDecodeTensorCores(view(16, 128, DType::kBF16), gqa2, any, 9));
  EXPECT_TRUE(UseDecodeTensorCores(view(32, 64, DType::kF16), gqa8, any, 8));
  EXPECT_TRUE(UseDecodeTensorCores(view(64, 256, DType::kBF16), gqa8, any, 10));
  EXPECT_FALSE(UseDecodeTensorCores(view(16, 128, DType::kBF16), gqa1, any, 9));  // GQA 1
  EXPECT_FALSE(UseDecodeTensorCores(view(16, 128, DType::kBF16), gqa8, any, 7));  // sm_7x
  EXPECT_FALSE(UseDecodeTensorCores(view(8, 128, DType::kBF16), gqa8, any, 9));   // bs 8
  EXPECT_FALSE(UseDecodeTensorCores(view(16, 96, DType::kBF16), gqa8, any, 9));   // D 96
  EXPECT_FALSE(UseDecodeTensorCores(view(16, 128, DType::kFP8), gqa8, any, 9));   // fp8
  EXPECT_FALSE(UseDecodeTensorCores(view(16, 128, DType::kBF16), gqa8, cuda, 9));
  EXPECT_TRUE(UseDecodeTensorCores(view(16, 128, DType::kBF16), gqa1, tc, 9));
}

// Counts the cp.async reads of each latent row of an MLA cache (emulation::cp_async_observer);
// reads outside the cache (the query) are counted apart.
struct RowReads {
  static inline const char* base = nullptr;
  static inline int64_t rows = 0;
  static inline std::vector<int64_t> chunks;  // 16-byte copies per cache row
  static inline int64_t others = 0;
  static void Observe(const void* src) {
    const int64_t at = static_cast<const char*>(src) - base;
    const int64_t row = at >= 0 ? at / (internal::kMlaRowBytes) : -1;
    if (row >= 0 && row < rows) {
      ++chunks[static_cast<size_t>(row)];
    } else {
      ++others;
    }
  }
};

// Each latent row the tensor-core MLA kernel attends to is copied from global memory exactly
// once per CTA: all 72 chunks of it, once, for the CTA's 64 heads (the CUDA-core kernel loads
// it once per 4 heads, 32 times at 128 heads). One sequence of 300 tokens in blocks of 16 (19
// blocks, the last holding 12 tokens), 128 heads = 2 CTAs:
// - no window, 1 split: the rows of tokens 0 .. 299 are copied 2 x 72 = 144 times each,
//   300 x 144 = 43,200 copies; the 4 rows past token 299 in the last block and the pool's
//   20th block, which no token uses, 0 times; the query 2 CTAs x 64 heads x 72 chunks = 9,216;
// - window_left 99 with 3 splits: rows 200 .. 299 (AttendedRange(300, 99)) 144 times each,
//   the rest never (the splits cut the window, they do not repeat it); the query once per
//   CTA and split: 3 x 9,216 = 27,648.
TEST(EmulatedKernelsTest, PagedDecodeMlaTensorCoresReadEachRowOncePerCta) {
  constexpr int32_t kLen = 300, kBs = 16, kHeads = 128, kBlocks = 20;
  std::mt19937 rng(35);
  std::normal_distribution<float> normal;
  std::vector<uint16_t> cache(static_cast<size_t>(kBlocks) * kBs * internal::kMlaRowDim);
  for (uint16_t& v : cache) v = ref::FloatToBf16(normal(rng));
  std::vector<uint16_t> q(static_cast<size_t>(kHeads) * internal::kMlaRowDim);
  for (uint16_t& v : q) v = ref::FloatToBf16(normal(rng));
  std::vector<int32_t> table(kBlocks);
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), rng);  // block 19 of the pool stays unused
  const std::vector<int32_t> lens = {kLen};
  const KvCacheView view =
      MlaKvCache(cache.data(), kBlocks, kBs, internal::kMlaRowDim, DType::kBF16);
  const BlockTableView tv{table.data(), kBlocks, lens.data(), 1};
  struct Run {
    int32_t window_left, splits, first_row;
    int64_t query_copies;
  };
  for (const Run& run : {Run{-1, 1, 0, 9216}, Run{99, 3, 200, 27648}}) {
    const DecodeParams params{kHeads, 0.0417f, run.window_left};
    const DecodePlan plan{run.splits, run.splits == 1 ? 0 : 48, false, false};
    ASSERT_TRUE(internal::UseMlaTensorCores(params, plan, 9));
    std::vector<uint16_t> out(static_cast<size_t>(kHeads) * internal::kMlaLatentDim, kHalfNan);
    std::vector<float> ws(run.splits > 1 ? kHeads * run.splits * (internal::kMlaLatentDim + 1)
                                         : 0, NAN);
    const internal::DecodeLaunch l = internal::MakeMlaMmaDecodeLaunch(
        out.data(), q.data(), int64_t{kHeads} * internal::kMlaRowDim, view, tv, params, plan,
        ws.data());
    ASSERT_EQ(l.grid[0], 2u);
    RowReads::base = static_cast<const char*>(view.base);
    RowReads::rows = int64_t{kBlocks} * kBs;
    RowReads::chunks.assign(static_cast<size_t>(RowReads::rows), 0);
    RowReads::others = 0;
    emulation::cp_async_observer = &RowReads::Observe;
    LaunchMla<__nv_bfloat16>(l);
    emulation::cp_async_observer = nullptr;
    int64_t total = 0;
    for (int32_t t = 0; t < kBlocks * kBs; ++t) {
      // Token t is row t % 16 of block table[t / 16]; tokens >= 300 are no token.
      const int64_t row = int64_t{table[t / kBs]} * kBs + t % kBs;
      const int64_t want = t >= run.first_row && t < kLen ? 144 : 0;
      EXPECT_EQ(RowReads::chunks[static_cast<size_t>(row)], want) << "token " << t;
      total += RowReads::chunks[static_cast<size_t>(row)];
    }
    EXPECT_EQ(total, int64_t{kLen - run.first_row} * 144);
    EXPECT_EQ(RowReads::others, run.query_copies);
    if (run.splits > 1) {
      Launch(dim3(kHeads), dim3(internal::kMergeThreads), internal::MergeKernel<__nv_bfloat16>,
             reinterpret_cast<__nv_bfloat16*>(out.data()), static_cast<float*>(nullptr),
             static_cast<const float*>(l.args.ws_o), static_cast<const float*>(l.args.ws_lse),
             run.splits, internal::kMlaLatentDim);
    }
    std::vector<double> want(out.size());
    ASSERT_TRUE(ref::PagedDecodeMla(q.data(), int64_t{kHeads} * internal::kMlaRowDim, view, tv,
                                    params, internal::kMlaLatentDim, want.data(), nullptr)
                    .ok());
    int64_t bad = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      bad += !(std::fabs(ref::Bf16ToFloat(out[i]) - want[i]) <= 1e-2 + 1e-2 * std::fabs(want[i]));
    }
    EXPECT_EQ(bad, 0) << "window " << run.window_left;
  }
}

// Plans made for shorter sequences than the batch has (a CUDA graph captured early and
// replayed after the sequences grew): the last split runs to the end, so the output is still
// the reference's. Planned for 100 tokens, 3 splits of 48 cover 144 of up to 700.
TEST(EmulatedKernelsTest, PagedDecodeWithAPlanForShorterSequences) {
  // dtype, seqs, kv heads, group, head_dim, block, max_len, window, splits, planned for
  const DecodeCase cases[] = {
      {DType::kBF16, 6, 1, 4, 128, 16, 700, -1, 3, 100},
      {DType::kF16, 7, 2, 2, 64, 16, 900, -1, 0, 300},    // PlanDecode: 2 x 160 for 300
      {DType::kBF16, 6, 1, 4, 128, 16, 900, 400, 2, 150},  // window of 401; 2 x 80
  };
  for (bool tensor_cores : {false, true}) {
    uint32_t seed = 400;
    for (DecodeCase c : cases) {
      c.tensor_cores = tensor_cores;
      DecodeProblem p;
      ASSERT_TRUE(check::MakeDecodeProblem(c, seed++, 16, 4, &p).ok());
      EXPECT_GT(p.plan.num_splits, 1) << c.Name();
      EXPECT_LT(int64_t{p.plan.num_splits} * p.plan.chunk_tokens, c.max_len) << c.Name();
      double err = 0;
      EXPECT_EQ(check::CompareDecode(p, RunDecode(p), &err), absl::OkStatus()) << c.Name();
    }
  }
}

// ---- Paged prefill: varlen query chunks over the paged cache ----

// The merge of split-KV partials over `rows` output rows, with the emulated launch.
template <typename T>
void LaunchMerge(void* out, const float* ws_o, const float* ws_lse, int64_t rows,
                 int32_t splits, int32_t head_dim) {
  Launch(dim3(static_cast<unsigned int>(rows)), dim3(internal::kMergeThreads),
         internal::MergeKernel<T>, static_cast<T*>(out), static_cast<float*>(nullptr), ws_o,
         ws_lse, splits, head_dim);
}

// The tiled path of PagedPrefill: the work list into `work` (total_tokens + 1 entries), then
// one CTA per tile, KV head and split, then the merge when there are splits.
template <typename T>
void LaunchTiledPrefill(const internal::PrefillTiledArgs& a, int32_t head_dim,
                        int32_t num_kv_heads, int32_t* work) {
  const int32_t tile_tokens = internal::TileTokens(a.group_size);
  Launch(dim3(1), dim3(internal::kWorkListThreads), internal::PrefillWorkListKernel,
         a.query_start_loc, a.num_seqs, a.total_tokens, tile_tokens, work);
  const dim3 grid(static_cast<unsigned int>(
                      internal::MaxPrefillTiles(a.total_tokens, a.num_seqs, tile_tokens)),
                  static_cast<unsigned int>(num_kv_heads),
                  static_cast<unsigned int>(a.num_splits));
  const dim3 block(internal::kPrefillThreads);
  if (head_dim == 64) Launch(grid, block, internal::PagedPrefillTiledKernel<T, 64>, a);
  if (head_dim == 128) Launch(grid, block, internal::PagedPrefillTiledKernel<T, 128>, a);
  if (head_dim == 256) Launch(grid, block, internal::PagedPrefillTiledKernel<T, 256>, a);
  if (a.num_splits > 1) {
    LaunchMerge<T>(a.out, a.ws_o, a.ws_lse, int64_t{a.total_tokens} * a.num_q_heads,
                   a.num_splits, head_dim);
  }
}

// What PagedPrefill launches: the tiled kernel when UseTiledPrefill says so; otherwise
// PrefillRowsKernel, then the decode kernels over its rows (and the merge with splits).
std::vector<uint16_t> RunPrefill(const check::PrefillProblem& p) {
  const int32_t total = p.total_tokens, hq = p.num_q_heads(), d = p.c.head_dim;
  std::vector<uint16_t> out(static_cast<size_t>(total) * hq * d, kHalfNan);
  std::vector<uint16_t> cache = p.cache;
  const KvCacheView view = p.View(cache.data());
  const BlockTableView table{p.table.data(), p.max_blocks, p.lens.data(), p.num_seqs()};
  const bool bf16 = p.c.dtype == DType::kBF16;
  const int64_t out_rows = int64_t{total} * hq;
  const int32_t splits = p.plan.num_splits;
  std::vector<float> ws(splits > 1 ? out_rows * splits * (d + 1) : 0, NAN);
  if (internal::UseTiledPrefill(view, p.params, p.plan)) {
    std::vector<int32_t> work(static_cast<size_t>(total) + 1, -7);
    const internal::PrefillTiledArgs a = internal::MakePrefillTiledArgs(
        out.data(), p.q.data(), int64_t{hq} * d, p.query_start_loc.data(), total, view, table,
        p.params, p.plan, work.data(), ws.data());
    if (bf16) {
      LaunchTiledPrefill<__nv_bfloat16>(a, d, p.c.num_kv_heads, work.data());
    } else {
      LaunchTiledPrefill<__half>(a, d, p.c.num_kv_heads, work.data());
    }
    EXPECT_EQ(cache, p.cache) << "prefill wrote to the cache";
    return out;
  }
  std::vector<int32_t> rows(static_cast<size_t>(total), -7), lens(rows.size(), -7);
  Launch(dim3((total + internal::kPrefillRowsThreads - 1) / internal::kPrefillRowsThreads),
         dim3(internal::kPrefillRowsThreads), internal::PrefillRowsKernel,
         p.query_start_loc.data(), p.lens.data(), p.num_seqs(), total, rows.data(),
         lens.data());
  for (int32_t t = p.real_tokens; t < total; ++t) EXPECT_EQ(lens[t], 0) << "padding " << t;
  const internal::DecodeLaunch l = internal::MakePrefillLaunch(
      out.data(), p.q.data(), int64_t{hq} * d, view, table, total, rows.data(), lens.data(),
      p.params, p.plan, ws.data());
  if (bf16) {
    LaunchDecode<__nv_bfloat16>(l, d, false);
  } else {
    LaunchDecode<__half>(l, d, false);
  }
  if (splits > 1 && bf16) {
    LaunchMerge<__nv_bfloat16>(out.data(), l.args.ws_o, l.args.ws_lse, out_rows, splits, d);
  } else if (splits > 1) {
    LaunchMerge<__half>(out.data(), l.args.ws_o, l.args.ws_lse, out_rows, splits, d);
  }
  EXPECT_EQ(cache, p.cache) << "prefill wrote to the cache";
  return out;
}

// Chunks over cached prefixes, whole prompts, decodes, an empty sequence and padding tokens in
// one batch (check::PrefillProblem), against ref::PagedPrefill: causal within each chunk, the
// prefix in full, sliding windows whose earlier table entries are -1.
TEST(EmulatedKernelsTest, PagedPrefillMatchesReference) {
  // dtype, kv heads, group, head_dim, block, window, tensor cores, splits
  const check::PrefillCase cases[] = {
      {DType::kBF16, 2, 4, 128, 16, -1, false, 1},
      {DType::kF16, 1, 2, 256, 16, 20, false, 1},  // sliding window inside the chunks
      {DType::kBF16, 1, 6, 64, 8, 10, false, 1},   // group 6 in a tile of 8, block 8
      {DType::kBF16, 2, 4, 128, 16, -1, false, 3},  // split-KV per query
      {DType::kBF16, 2, 2, 64, 16, -1, true, 1},   // tensor cores
      {DType::kF16, 1, 4, 128, 32, 30, true, 2},
  };
  uint32_t seed = 700;
  for (const check::PrefillCase& c : cases) {
    check::PrefillProblem p;
    ASSERT_TRUE(check::MakePrefillProblem(c, seed++, &p).ok()) << c.Name();
    EXPECT_EQ(check::ComparePrefill(p, RunPrefill(p)), absl::OkStatus()) << c.Name();
  }
}

// The tiled kernel (tensor cores) on the same mixed batches: GQA 1, 4, 6 and 8, head_dim 64,
// 128 and 256, blocks of 16 and 32, sliding windows inside the chunks, split-KV. With
// group 8 a tile holds 8 tokens, so the 37-token prompt takes 5 tiles; with head_dim 64 a K/V
// tile holds 64 tokens, so the 129-token decode reads 3.
TEST(EmulatedKernelsTest, PagedPrefillTiledMatchesReference) {
  // dtype, kv heads, group, head_dim, block, window, tensor cores, splits
  const check::PrefillCase cases[] = {
      {DType::kBF16, 2, 1, 64, 16, -1, true, 1},
      {DType::kF16, 1, 4, 128, 32, -1, true, 1},
      {DType::kBF16, 1, 8, 256, 16, -1, true, 1},
      {DType::kBF16, 2, 4, 64, 32, 20, true, 1},   // sliding window
      {DType::kF16, 1, 8, 128, 16, 30, true, 1},
      {DType::kBF16, 1, 1, 256, 32, 45, true, 1},
      {DType::kBF16, 1, 6, 128, 16, -1, true, 1},  // 10 tokens a tile, 4 rows idle
      {DType::kBF16, 1, 4, 128, 16, -1, true, 3},  // split-KV: 32 keys a split, then the rest
      {DType::kF16, 2, 8, 64, 32, 30, true, 2},    // split-KV inside a window
  };
  uint32_t seed = 900;
  for (const check::PrefillCase& c : cases) {
    check::PrefillProblem p;
    ASSERT_TRUE(check::MakePrefillProblem(c, seed++, &p).ok()) << c.Name();
    ASSERT_TRUE(internal::UseTiledPrefill(p.View(p.cache.data()), p.params, p.plan)) << c.Name();
    EXPECT_EQ(check::ComparePrefill(p, RunPrefill(p)), absl::OkStatus()) << c.Name();
  }
}

// Counts the cp.async reads of each cache block (emulation::cp_async_observer).
struct BlockReads {
  static inline const char* base = nullptr;
  static inline int64_t block_bytes = 0;
  static inline std::vector<int64_t> copies;
  static void Observe(const void* src) {
    ++copies[static_cast<size_t>((static_cast<const char*>(src) - base) / block_bytes)];
  }
};

// A 2,048-token chunk over a 256-token cached prefix (GQA 1, head_dim 64, blocks of 16): 32
// tiles of 64 queries; tile i reads its keys [0, 256 + 64 (i + 1)), blocks 0 .. 19 + 4 i, each
// once: 2,624 block reads of 16 tokens x 8 chunks x K and V = 256 copies each, where the
// per-token path reads a block once per query that sees it.
TEST(EmulatedKernelsTest, PagedPrefillTiledReadsEachBlockOncePerTile) {
  constexpr int32_t kPrefix = 256, kChunk = 2048, kLen = kPrefix + kChunk, kBs = 16, kD = 64;
  constexpr int32_t kBlocks = kLen / kBs;  // 144, plus nothing else in the cache
  std::mt19937 rng(21);
  std::normal_distribution<float> normal;
  std::vector<uint16_t> cache(static_cast<size_t>(kBlocks) * 2 * kBs * kD);
  for (uint16_t& v : cache) v = ref::FloatToBf16(normal(rng));
  std::vector<uint16_t> q(static_cast<size_t>(kChunk) * kD);
  for (uint16_t& v : q) v = ref::FloatToBf16(normal(rng));
  std::vector<int32_t> table(kBlocks);
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), rng);
  const std::vector<int32_t> lens = {kLen}, qsl = {0, kChunk};
  const KvCacheView view = BlocksFirstKvCache(cache.data(), kBlocks, kBs, 1, kD, DType::kBF16);
  const BlockTableView tv{table.data(), kBlocks, lens.data(), 1};
  const DecodeParams params{1, 0.125f, -1};
  const DecodePlan plan{1, 0, true};
  ASSERT_TRUE(internal::UseTiledPrefill(view, params, plan));

  std::vector<uint16_t> out(q.size(), kHalfNan);
  std::vector<int32_t> work(kChunk + 1, -7);
  BlockReads::base = static_cast<const char*>(view.base);
  BlockReads::block_bytes = view.block_stride * 2;
  BlockReads::copies.assign(kBlocks, 0);
  emulation::cp_async_observer = &BlockReads::Observe;
  LaunchTiledPrefill<__nv_bfloat16>(
      internal::MakePrefillTiledArgs(out.data(), q.data(), kD, qsl.data(), kChunk, view, tv,
                                     params, plan, work.data(), nullptr),
      kD, 1, work.data());
  emulation::cp_async_observer = nullptr;

  ASSERT_EQ(work[kChunk], 32);  // tiles
  int64_t block_reads = 0;
  for (int32_t j = 0; j < kBlocks; ++j) {
    // Tile i reads block j iff 16 j < 256 + 64 (i + 1): all 32 tiles for j < 20, then one
    // tile fewer every 4 blocks.
    const int32_t tiles = 32 - std::max(0, (j - kPrefix / kBs) / 4);
    const int64_t copies = BlockReads::copies[static_cast<size_t>(table[j])];
    EXPECT_EQ(copies, int64_t{256} * tiles) << "block " << j;
    block_reads += copies / 256;
  }
  EXPECT_EQ(block_reads, 2624);

  std::vector<double> want(q.size());
  ASSERT_TRUE(ref::PagedPrefill(q.data(), kD, qsl.data(), view, tv, params, want.data(),
                                nullptr).ok());
  int64_t bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    bad += std::fabs(ref::Bf16ToFloat(out[i]) - want[i]) > 1e-2 + 1e-2 * std::fabs(want[i]);
  }
  EXPECT_EQ(bad, 0);
}

// The mma.sync emulation on small integers (exact in bf16 and fp32): a warp builds A (16 x 16)
// and B (16 x 8) fragments from their definitions in kernels/mma.cuh and gets C = A B + C.
TEST(EmulatedKernelsTest, MmaFragmentsMultiplyMatrices) {
  auto a_val = [](int r, int k) { return static_cast<float>((r * 3 + k * 5) % 7 - 3); };
  auto b_val = [](int k, int n) { return static_cast<float>((k * 2 + n * 7) % 5 - 2); };
  std::vector<float> got(16 * 8, NAN);
  auto kernel = [](float* out, decltype(a_val) av, decltype(b_val) bv) {
    const int lane = static_cast<int>(threadIdx.x), g = lane / 4, q = lane % 4;
    auto pack = [](float lo, float hi) { return internal::PackPair<__nv_bfloat16>(lo, hi); };
    const uint32_t a[4] = {pack(av(g, 2 * q), av(g, 2 * q + 1)),
                           pack(av(g + 8, 2 * q), av(g + 8, 2 * q + 1)),
                           pack(av(g, 2 * q + 8), av(g, 2 * q + 9)),
                           pack(av(g + 8, 2 * q + 8), av(g + 8, 2 * q + 9))};
    const uint32_t b[2] = {pack(bv(2 * q, g), bv(2 * q + 1, g)),
                           pack(bv(2 * q + 8, g), bv(2 * q + 9, g))};
    float d[4] = {1.0f, 1.0f, 1.0f, 1.0f};
    internal::Mma16816<__nv_bfloat16>(d, a, b);
    out[g * 8 + 2 * q] = d[0];
    out[g * 8 + 2 * q + 1] = d[1];
    out[(g + 8) * 8 + 2 * q] = d[2];
    out[(g + 8) * 8 + 2 * q + 1] = d[3];
  };
  Launch(dim3(1), dim3(32), kernel, got.data(), a_val, b_val);
  for (int r = 0; r < 16; ++r) {
    for (int n = 0; n < 8; ++n) {
      float want = 1.0f;
      for (int k = 0; k < 16; ++k) want += a_val(r, k) * b_val(k, n);
      EXPECT_EQ(got[r * 8 + n], want) << r << " " << n;
    }
  }
}

// The GPU check flags rows below the project's targets: paged_decode 85% of the copy ceiling
// at batch >= 64 and context >= 4K, write_kv and copy_blocks 90%.
TEST(GpuCheckTargetsTest, DecodeTargetIs85PercentAtBatch64Context4K) {
  EXPECT_EQ(check::TargetPercent("paged_decode", 64, 4096), 85.0);
  EXPECT_FALSE(check::MeetsTarget("paged_decode", 64, 4096, 84.9));
  EXPECT_FALSE(check::MeetsTarget("paged_decode", 256, 32768, 80.0));
  EXPECT_TRUE(check::MeetsTarget("paged_decode", 64, 4096, 85.0));
  EXPECT_EQ(check::TargetPercent("paged_decode", 8, 32768), 0.0);  // too small a batch
  EXPECT_EQ(check::TargetPercent("paged_decode", 256, 1024), 0.0);
  EXPECT_TRUE(check::MeetsTarget("paged_decode", 8, 32768, 20.0));
  EXPECT_EQ(check::TargetPercent("write_kv", 0, 0), 90.0);
  EXPECT_EQ(check::TargetPercent("copy_blocks", 0, 0), 90.0);
  EXPECT_EQ(check::TargetPercent("zero_slots", 0, 0), 0.0);
}

// The merge is launched with programmatic dependent launch exactly on compute capability 9.0
// and above (0: the device could not be asked).
TEST(EmulatedKernelsTest, MergeLaunchPathFollowsComputeCapability) {
  using internal::ChooseMergeLaunch;
  using internal::MergeLaunchPath;
  EXPECT_EQ(ChooseMergeLaunch(0), MergeLaunchPath::kPlain);
  EXPECT_EQ(ChooseMergeLaunch(7), MergeLaunchPath::kPlain);
  EXPECT_EQ(ChooseMergeLaunch(8), MergeLaunchPath::kPlain);
  EXPECT_EQ(ChooseMergeLaunch(9), MergeLaunchPath::kProgrammatic);
  EXPECT_EQ(ChooseMergeLaunch(10), MergeLaunchPath::kProgrammatic);
  EXPECT_EQ(ChooseMergeLaunch(12), MergeLaunchPath::kProgrammatic);
}

TEST(EmulatedKernelsTest, MergeMatchesReference) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  const int32_t rows = 6, splits = 4, d = 64;
  std::vector<float> o(rows * splits * d), lse(rows * splits);
  for (auto& x : o) x = normal(rng);
  for (int32_t i = 0; i < rows * splits; ++i) {
    lse[i] = (i % 3 == 1 || i / splits == rows - 1) ? -INFINITY : 3.0f * normal(rng);
  }
  std::vector<uint16_t> out(rows * d, kHalfNan);
  std::vector<float> lse_out(rows, NAN);
  Launch(dim3(rows), dim3(internal::kMergeThreads), internal::MergeKernel<__half>,
         reinterpret_cast<__half*>(out.data()), lse_out.data(),
         static_cast<const float*>(o.data()), static_cast<const float*>(lse.data()), splits, d);
  std::vector<double> want(rows * d), want_lse(rows);
  ref::MergeAttnStates(o.data(), lse.data(), 1, rows, splits, d, want.data(), want_lse.data());
  for (int32_t i = 0; i < rows * d; ++i) {
    EXPECT_NEAR(ref::F16ToFloat(out[i]), want[i], 2e-3 + 2e-3 * std::fabs(want[i])) << i;
  }
  for (int32_t r = 0; r < rows - 1; ++r) EXPECT_NEAR(lse_out[r], want_lse[r], 1e-4) << r;
  EXPECT_EQ(lse_out[rows - 1], -INFINITY);
  EXPECT_EQ(out[(rows - 1) * d], 0);  // an all-empty row is exactly zero
}

TEST(EmulatedKernelsTest, WriteKvMatchesReferenceByteForByte) {
  struct Case {
    int32_t tokens, heads, d, bs, blocks;
    bool mla;
  };
  const Case cases[] = {{40, 4, 128, 16, 8, false}, {9, 2, 256, 64, 2, false},
                        {12, 1, 576, 64, 2, true}};
  std::mt19937 rng(9);
  for (const Case& c : cases) {
    const int64_t row = static_cast<int64_t>(c.heads) * c.d;
    std::vector<uint16_t> k(c.tokens * row), v(c.tokens * row);
    for (auto& x : k) x = static_cast<uint16_t>(rng());
    for (auto& x : v) x = static_cast<uint16_t>(rng());
    std::vector<int64_t> slots(static_cast<size_t>(c.blocks) * c.bs);
    std::iota(slots.begin(), slots.end(), 0);
    std::shuffle(slots.begin(), slots.end(), rng);
    slots.resize(c.tokens);
    slots[3] = -1;
    slots[5] = int64_t{c.blocks} * c.bs;  // past the cache: skipped by the kernel
    std::vector<uint16_t> got(static_cast<size_t>(c.blocks) * c.bs * row * (c.mla ? 1 : 2),
                              0xaaaa);
    std::vector<uint16_t> want = got;
    auto view = [&](std::vector<uint16_t>& base) {
      return c.mla ? MlaKvCache(base.data(), c.blocks, c.bs, c.d, DType::kBF16)
                   : BlocksFirstKvCache(base.data(), c.blocks, c.bs, c.heads, c.d, DType::kBF16);
    };
    const uint16_t* v_ptr = c.mla ? nullptr : v.data();
    Launch(dim3(c.tokens), dim3(internal::kWriteKvThreads), internal::WriteKvKernel,
           internal::MakeWriteKvArgs(k.data(), v_ptr, row, row, slots.data(), view(got)));
    slots[5] = -1;  // the reference rejects out-of-range slots instead of skipping them
    ASSERT_TRUE(ref::WriteKv(k.data(), v_ptr, row, row, slots.data(), c.tokens, view(want)).ok());
    EXPECT_EQ(got, want) << c.tokens << " tokens, mla " << c.mla;
  }
}

TEST(EmulatedKernelsTest, WriteKvFp8MatchesReferenceByteForByte) {
  struct Case {
    DType dtype;
    int32_t tokens, heads, d, bs, blocks;
    bool mla;
  };
  const Case cases[] = {{DType::kBF16, 20, 2, 128, 16, 4, false},
                        {DType::kF16, 9, 1, 256, 64, 1, false},
                        {DType::kBF16, 7, 1, 576, 64, 1, true}};
  std::mt19937 rng(17);
  std::normal_distribution<float> normal;
  for (const Case& c : cases) {
    const int64_t row = static_cast<int64_t>(c.heads) * c.d;
    std::vector<uint16_t> k(c.tokens * row), v(c.tokens * row);
    // Wide values so some saturate at +-448 after scaling.
    for (auto& x : k) x = ref::FloatToHalf(30.0f * normal(rng), c.dtype);
    for (auto& x : v) x = ref::FloatToHalf(normal(rng), c.dtype);
    std::vector<int64_t> slots(static_cast<size_t>(c.blocks) * c.bs);
    std::iota(slots.begin(), slots.end(), 0);
    std::shuffle(slots.begin(), slots.end(), rng);
    slots.resize(c.tokens);
    slots[2] = -1;
    std::vector<uint8_t> got(static_cast<size_t>(c.blocks) * c.bs * row * (c.mla ? 1 : 2),
                             0xaa);
    std::vector<uint8_t> want = got;
    auto view = [&](std::vector<uint8_t>& base) {
      return c.mla ? MlaKvCache(base.data(), c.blocks, c.bs, c.d, DType::kFP8)
                   : BlocksFirstKvCache(base.data(), c.blocks, c.bs, c.heads, c.d, DType::kFP8);
    };
    const uint16_t* v_ptr = c.mla ? nullptr : v.data();
    const internal::WriteKvFp8Args args = internal::MakeWriteKvFp8Args(
        k.data(), v_ptr, row, row, slots.data(), 0.1f, 0.01f, view(got));
    if (c.dtype == DType::kBF16) {
      Launch(dim3(c.tokens), dim3(internal::kWriteKvThreads),
             internal::WriteKvFp8Kernel<__nv_bfloat16>, args);
    } else {
      Launch(dim3(c.tokens), dim3(internal::kWriteKvThreads), internal::WriteKvFp8Kernel<__half>,
             args);
    }
    ASSERT_TRUE(ref::WriteKvFp8(k.data(), v_ptr, row, row, slots.data(), c.tokens, c.dtype, 0.1f,
                                0.01f, view(want))
                    .ok());
    EXPECT_EQ(got, want) << c.tokens << " tokens, mla " << c.mla;
    EXPECT_NE(std::find(want.begin(), want.end(), 0x7e), want.end());  // saturation happened
  }
}

TEST(EmulatedKernelsTest, CopyAndZeroSlotsMatchReferenceByteForByte) {
  // (stride, copy bytes): two chunks plus 16 bytes, and a short copy inside a longer stride.
  const int64_t shapes[2][2] = {{32784, 32784}, {4096, 592}};
  const int32_t num_slots = 10;
  std::mt19937 rng(13);
  std::vector<std::vector<uint8_t>> got(2), want(2);
  internal::SlotArgs args{};
  std::vector<SlotTensor> host_tensors;
  for (int i = 0; i < 2; ++i) {
    got[i].resize(shapes[i][0] * num_slots);
    for (auto& b : got[i]) b = static_cast<uint8_t>(rng());
    want[i] = got[i];
    args.t[i] = internal::SlotDesc{reinterpret_cast<char*>(got[i].data()), shapes[i][0],
                                   shapes[i][1]};
    host_tensors.push_back(SlotTensor{want[i].data(), shapes[i][0], shapes[i][1], num_slots});
  }
  const int32_t src[] = {0, 1, 2, -1, 4};
  const int32_t dst[] = {7, 5, 9, 3, 4};
  const unsigned int chunks = static_cast<unsigned int>(
      (shapes[0][1] + internal::kCopyChunkBytes - 1) / internal::kCopyChunkBytes);
  Launch(dim3(chunks, 5, 2), dim3(internal::kCopyThreads), internal::CopySlotsKernel, args,
         static_cast<const int32_t*>(src), static_cast<const int32_t*>(dst));
  ASSERT_TRUE(ref::CopySlots(host_tensors, src, dst, 5).ok());
  EXPECT_EQ(got, want);
  Launch(dim3(chunks, 5, 2), dim3(internal::kCopyThreads), internal::ZeroSlotsKernel, args,
         static_cast<const int32_t*>(dst));
  ASSERT_TRUE(ref::ZeroSlots(host_tensors, dst, 5).ok());
  EXPECT_EQ(got, want);
}

// Runs longer than a CTA (300 entries), one-entry runs and a run ending a row patch exactly
// their entries; the rest of the table keeps its values.
TEST(EmulatedKernelsTest, TableRunsPatchExactlyTheirEntries) {
  const int32_t stride = 320, rows = 4;
  std::vector<int32_t> table(static_cast<size_t>(stride) * rows);
  std::iota(table.begin(), table.end(), 1000);
  std::vector<int32_t> values(310);
  std::iota(values.begin(), values.end(), -400);
  const std::vector<kvpage::TableRunView> runs = {
      {.row = 2, .first = 10, .count = 300, .value_offset = 0},
      {.row = 0, .first = 0, .count = 1, .value_offset = 300},
      {.row = 3, .first = 311, .count = 9, .value_offset = 301}};
  std::vector<int32_t> want = table;
  for (const kvpage::TableRunView& r : runs) {
    for (int32_t i = 0; i < r.count; ++i) {
      want[static_cast<size_t>(r.row) * stride + r.first + i] = values[r.value_offset + i];
    }
  }
  Launch(dim3(static_cast<unsigned int>(runs.size())), dim3(internal::kTableRunThreads),
         internal::ApplyTableRunsKernel, runs.data(), static_cast<const int32_t*>(values.data()),
         table.data(), stride);
  EXPECT_EQ(table, want);
  EXPECT_EQ(table[static_cast<size_t>(2) * stride + 309], values[299]);
  EXPECT_EQ(table[static_cast<size_t>(2) * stride + 310], 1000 + 2 * stride + 310);  // untouched
}

}  // namespace
}  // namespace kvpage::cuda
