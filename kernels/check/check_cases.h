// The shapes every GPU correctness run covers: the gpu-labelled tests run them with fixed
// seeds, kvpage_gpu_check with fresh ones.
#ifndef KVPAGE_KERNELS_CHECK_CHECK_CASES_H_
#define KVPAGE_KERNELS_CHECK_CHECK_CASES_H_

#include <iterator>
#include <vector>

#include "kernels/check/kernel_checks.h"

namespace kvpage::cuda::check {

inline std::vector<WriteKvCase> WriteKvCases() {
  return {
      {DType::kBF16, 100, 8, 128, 16, 64, false},
      {DType::kF16, 37, 2, 256, 64, 8, false},
      {DType::kBF16, 1, 4, 64, 16, 4, false},
      {DType::kBF16, 50, 1, 576, 64, 4, true},  // MLA latent rows
      {DType::kBF16, 60, 8, 128, 16, 32, false, true},  // fp8 e4m3 cache
      {DType::kF16, 20, 2, 256, 64, 4, false, true},
      {DType::kBF16, 30, 1, 576, 64, 2, true, true},  // fp8 MLA
  };
}

// Every case on the CUDA-core kernel, then again on the tensor-core one (each forced), then
// the shapes only the CUDA-core kernel has (fp8 caches, head_dim 80/96/192, which PagedDecode
// never takes to tensor cores), then MLA (PagedDecodeMla) on the CUDA-core kernel, then on
// the tensor-core one (each forced).
inline std::vector<DecodeCase> DecodeCases() {
  // dtype, seqs, kv heads, group, head_dim, block, max_len, window, splits
  std::vector<DecodeCase> cases = {
      {DType::kBF16, 8, 8, 4, 128, 16, 300, -1, 0},
      {DType::kF16, 8, 8, 4, 128, 16, 300, -1, 0},
      {DType::kF16, 7, 2, 8, 256, 64, 200, -1, 0},   // GQA 8, head_dim 256, block 64
      {DType::kBF16, 7, 2, 8, 256, 16, 200, -1, 0},
      {DType::kBF16, 6, 1, 1, 64, 16, 100, -1, 0},
      {DType::kF16, 6, 4, 2, 64, 64, 150, -1, 0},
      {DType::kBF16, 6, 2, 6, 128, 16, 500, -1, 0},  // group 6 in a tile of 8
      {DType::kBF16, 6, 1, 16, 128, 16, 90, -1, 0},  // two CTAs per KV head
      {DType::kBF16, 9, 4, 2, 128, 16, 700, 127, 0},  // sliding window
      {DType::kF16, 9, 2, 8, 256, 64, 700, 200, 0},
      {DType::kBF16, 6, 8, 4, 128, 16, 5000, -1, 7},  // split-KV
      {DType::kF16, 6, 2, 4, 256, 64, 3000, 1000, 3},  // split-KV inside a window
      {DType::kBF16, 6, 8, 4, 128, 16, 8192, -1, 0},   // device plan
      {DType::kBF16, 6, 2, 4, 128, 16, 900, -1, 2, 200},  // plan for shorter sequences
  };
  const size_t n = cases.size();
  for (size_t i = 0; i < n; ++i) {
    cases[i].cuda_cores = true;
    cases.push_back(cases[i]);
    cases.back().tensor_cores = true;
    cases.back().cuda_cores = false;
  }
  // dtype (q, out), seqs, kv heads, group, head_dim, block, max_len, window, splits
  const DecodeCase fp8[] = {
      {DType::kBF16, 8, 8, 4, 128, 16, 300, -1, 0},
      {DType::kF16, 7, 2, 8, 256, 64, 200, -1, 0},
      {DType::kBF16, 6, 1, 1, 64, 16, 100, -1, 0},
      {DType::kF16, 9, 4, 2, 128, 16, 700, 127, 0},   // sliding window
      {DType::kBF16, 6, 8, 4, 128, 16, 5000, -1, 7},  // split-KV
      {DType::kBF16, 6, 2, 6, 96, 16, 500, -1, 0},
      {DType::kF16, 6, 2, 4, 192, 64, 3000, 1000, 3},
  };
  for (DecodeCase c : fp8) {
    c.fp8_kv = true;
    cases.push_back(c);
  }
  const DecodeCase head_dims[] = {
      {DType::kBF16, 8, 8, 4, 80, 16, 300, -1, 0},
      {DType::kF16, 7, 2, 8, 96, 64, 200, -1, 0},
      {DType::kBF16, 6, 4, 1, 192, 16, 150, -1, 0},
      {DType::kBF16, 6, 1, 16, 96, 16, 90, -1, 0},     // two CTAs per KV head
      {DType::kF16, 9, 2, 2, 80, 16, 700, 200, 0},     // sliding window
      {DType::kBF16, 6, 8, 4, 192, 16, 5000, -1, 7},   // split-KV
      {DType::kBF16, 6, 8, 8, 80, 16, 8192, -1, 0},    // device plan
  };
  cases.insert(cases.end(), std::begin(head_dims), std::end(head_dims));
  // Absorbed MLA, DeepSeek's row (512 latent + 64 rope); group = query heads.
  const DecodeCase mla[] = {
      {DType::kBF16, 8, 1, 16, 576, 64, 300, -1, 0},
      {DType::kF16, 7, 1, 6, 576, 16, 200, -1, 0},
      {DType::kBF16, 9, 1, 16, 576, 64, 700, 127, 0},  // sliding window
      {DType::kBF16, 6, 1, 16, 576, 64, 5000, -1, 7},  // split-KV
      {DType::kF16, 6, 1, 128, 576, 64, 3000, -1, 0},  // DeepSeek-V3's 128 heads, planned
      {DType::kBF16, 7, 1, 64, 576, 32, 900, -1, 0},   // one CTA of 64 heads, block 32
      {DType::kF16, 7, 1, 32, 576, 16, 600, 200, 3},   // 32 heads, split-KV in a window
      {DType::kBF16, 6, 1, 40, 576, 64, 4000, -1, 0},  // 40 heads in a CTA of 64, planned
  };
  for (bool tensor_cores : {false, true}) {
    for (DecodeCase c : mla) {
      c.mla = true;
      c.tensor_cores = tensor_cores;
      c.cuda_cores = !tensor_cores;
      cases.push_back(c);
    }
  }
  return cases;
}

inline std::vector<CopyCase> CopyCases() { return {{64, 20}, {8, 3}}; }

// Paged prefill (check::PrefillProblem's batch of chunks, decodes and padding).
inline std::vector<PrefillCase> PrefillCases() {
  // dtype, kv heads, group, head_dim, block, window, tensor cores, splits
  return {
      {DType::kBF16, 8, 4, 128, 16, -1, false, 1},
      {DType::kF16, 2, 8, 256, 16, 20, false, 1},  // sliding window inside the chunks
      {DType::kBF16, 2, 6, 64, 8, 10, false, 1},   // group 6 in a tile of 8, block 8
      {DType::kBF16, 4, 4, 128, 16, -1, false, 3},  // split-KV per query
      {DType::kBF16, 8, 4, 128, 16, -1, true, 1},  // tensor cores: the tiled kernel
      {DType::kBF16, 4, 1, 64, 16, -1, true, 1},   // tiled, GQA 1
      {DType::kF16, 2, 8, 256, 32, 20, true, 1},   // tiled, GQA 8, window
      {DType::kF16, 2, 4, 128, 32, 30, true, 2},   // tensor cores, split: per token
  };
}

}  // namespace kvpage::cuda::check

#endif  // KVPAGE_KERNELS_CHECK_CHECK_CASES_H_
