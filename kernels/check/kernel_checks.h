// Device-vs-reference checks of the kvpage kernels on fresh random inputs, shared by the
// gpu-labelled tests (fixed seeds) and kvpage_gpu_check (fresh seeds). Each check poisons its
// outputs, runs the kernel, and compares with the CPU reference (kernel_reference.h):
// byte-exact for writes and copies, scale-aware tolerances for attention.
//
// Every function returns Unavailable when no device is visible (CUDA errors 100 and 35), so
// callers can skip; Internal with the first mismatch otherwise. Not thread-safe (one stream).
#ifndef KVPAGE_KERNELS_CHECK_KERNEL_CHECKS_H_
#define KVPAGE_KERNELS_CHECK_KERNEL_CHECKS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "kernels/check/decode_problem.h"
#include "kernels/check/prefill_problem.h"
#include "kvpage/dtype.h"

namespace kvpage::cuda::check {

// OK when a device is usable; Unavailable (skip) otherwise.
absl::Status RequireDevice();

struct WriteKvCase {
  DType dtype = DType::kBF16;  // of the inputs and (unless fp8) the cache
  int32_t num_tokens = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t block_size = 16;
  int32_t num_blocks = 0;
  bool mla = false;  // latent rows only (num_kv_heads 1, v null)
  bool fp8 = false;  // WriteKvFp8 into an e4m3 cache; dtype is then the input type
  std::string Name() const;
};
absl::Status CheckWriteKv(const WriteKvCase& c, uint32_t seed);

// Also reports the largest absolute error through max_abs_err when non-null.
absl::Status CheckPagedDecode(const DecodeCase& c, uint32_t seed, double* max_abs_err);

// PagedPrefill on check::PrefillProblem's batch against ref::PagedPrefill.
absl::Status CheckPagedPrefill(const PrefillCase& c, uint32_t seed);

struct CopyCase {
  int32_t num_slots = 0;
  int32_t num_pairs = 0;
  std::string Name() const;
};
// Three slot tensors (a KV-block-like one, a recurrent-state-like one, and one whose copy is
// shorter than its stride), copied with CopySlots, then CopyBlocks over two KV layers, then
// ZeroSlots; all byte-compared with the references.
absl::Status CheckCopies(const CopyCase& c, uint32_t seed);

// MergeAttnStates alone, with some empty splits.
absl::Status CheckMerge(int32_t num_seqs, int32_t num_heads, int32_t num_splits,
                        int32_t head_dim, DType dtype, uint32_t seed);

// Captures WriteKv, PagedDecode (split-KV, so the merge launch too), CopySlots and ZeroSlots
// on one stream into a CUDA graph with a plan and seq_lens for sequences of at most 200
// tokens, replays it once, then grows seq_lens on the device to up to 600 and replays it twice,
// and checks that the decode output is bit-identical to an eager run and matches the
// reference (proves no launcher syncs, allocates or otherwise breaks capture, and that a plan
// for shorter sequences stays exact).
// Also reports through programmatic_edges (when non-null) how many edges of the captured graph
// are programmatic (cudaGraphDependencyTypeProgrammatic): 1 on sm_90, where the split-KV merge
// is launched with programmatic dependent launch, 0 below.
absl::Status CheckGraphCapture(uint32_t seed, int* programmatic_edges = nullptr);

// PagedDecodeMla on tensor cores (64 query heads, 3 splits: the kernel, whose dynamic shared
// memory limit is set with cudaFuncSetAttribute at every launch, then the merge) captured
// into a CUDA graph and replayed twice: the output must be bit-identical to an eager run and
// match the reference.
absl::Status CheckMlaGraphCapture(uint32_t seed);

// The split-KV merge on the path MergeAttnStates takes on this device (programmatic dependent
// launch on sm_90, merge_launch.h), for a CUDA-core, a tensor-core and an MLA decode with 7
// splits: four times in a row, the workspace is filled with NaN on the stream right before the
// decode, so a merge that read the partial states before the split kernel finished would
// return NaN; every output must match the reference and be bit-identical to the first, and to
// the same partial states merged again with a plain launch. `path` (nullable) gets
// "programmatic" or "plain".
absl::Status CheckProgrammaticMerge(uint32_t seed, std::string* path);

}  // namespace kvpage::cuda::check

#endif  // KVPAGE_KERNELS_CHECK_KERNEL_CHECKS_H_
