// Memory layouts the kvpage kernels read and write, shared by the CUDA launchers
// (include/kvpage/cuda/) and the CPU references (kernel_reference.h).
//
// This header includes no CUDA header: it builds with g++ alone. The index helpers are
// `constexpr` and, when compiled by nvcc, also `__device__`, so host tests and kernels use the
// same arithmetic.
//
// Paged KV cache of one attention layer, blocks-first NHD (the layout vLLM's FlashInfer backend
// and its hybrid "blocks-first" layout use):
//
//   cache[num_blocks][2][block_size][num_kv_heads][head_dim]      index 0 = K, 1 = V
//
// addressed through explicit element strides, so the K and V halves are also strided views
// `[num_blocks, block_size, num_kv_heads, head_dim]` with block stride 2*block_size*H*D that
// FlashInfer and FlashAttention accept as they are (docs/kernels.md §4).
//
// MLA keeps one latent row per token, `[num_blocks, block_size, kv_lora_rank + rope_dim]`; it is
// a KvCacheView with num_kv_heads 1 and kv_stride 0 (K and V are the same memory), which
// write_kv and copy_blocks accept. Recurrent state pools are slot-major per layer: `[num_slots,
// ...]`, described to the copy kernels by a SlotTensor.
//
// Ids: block ids, state slots and block-table entries are int32; -1 means "skip". The slot
// mapping that write_kv consumes is int64 (`block_id * block_size + offset`), as the scheduler
// emits it. Element offsets are computed in int64.
#ifndef KVPAGE_KERNEL_LAYOUT_H_
#define KVPAGE_KERNEL_LAYOUT_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kvpage/dtype.h"

#if defined(__CUDACC__)
#define KVPAGE_HOST_DEVICE __host__ __device__
#else
#define KVPAGE_HOST_DEVICE
#endif

namespace kvpage {

// One attention layer's paged K/V cache. Strides are in elements of `dtype`.
// Invariants (ValidateKvCacheView): dtype is f16, bf16 or fp8 (e4m3; written by WriteKvFp8,
// read by decode with DecodeParams' scales); head_dim elements are contiguous and a multiple
// of one 16-byte vector (8 values, 16 for fp8); every stride is a multiple of that vector;
// base is 16-byte aligned. K of (block b, token t, head h) is at
//   base + b*block_stride + t*token_stride + h*head_stride, and V is kv_stride further.
struct KvCacheView {
  void* base = nullptr;
  int64_t block_stride = 0;  // elements from block b to block b+1
  int64_t kv_stride = 0;     // elements from K to V of the same block (0 for MLA)
  int64_t token_stride = 0;  // elements from token t to t+1 within a block
  int64_t head_stride = 0;   // elements from head h to h+1
  int32_t num_blocks = 0;
  int32_t block_size = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  DType dtype = DType::kBF16;
};

// Values in one 16-byte vector: 8 for f16/bf16, 16 for fp8. REQUIRES: one of those dtypes.
int64_t VectorElements(DType dtype);

// The contiguous blocks-first NHD view of `[num_blocks, 2, block_size, num_kv_heads, head_dim]`.
KvCacheView BlocksFirstKvCache(void* base, int32_t num_blocks, int32_t block_size,
                               int32_t num_kv_heads, int32_t head_dim, DType dtype);

// The MLA view of `[num_blocks, block_size, row_dim]` (row_dim = kv_lora_rank + rope_dim).
KvCacheView MlaKvCache(void* base, int32_t num_blocks, int32_t block_size, int32_t row_dim,
                       DType dtype);

// InvalidArgument naming the offending field when a view breaks the invariants above.
absl::Status ValidateKvCacheView(const KvCacheView& cache);

// The arguments of a write_kv call (WriteKv / WriteKvFp8, here and in kvpage/cuda/write_kv.h)
// that do not depend on where they live: num_tokens >= 0, k and slot_mapping present, and v
// present exactly when the view has a V half (kv_stride != 0). An MLA view (kv_stride 0) takes
// no v: its one latent row would be written twice. InvalidArgument naming the value; `what`
// prefixes the message.
absl::Status ValidateWriteKvArgs(const void* k, const void* v, const int64_t* slot_mapping,
                                 int32_t num_tokens, const KvCacheView& cache, const char* what);

// The view and the arguments of a write into an fp8 cache (WriteKvFp8, here and in
// kvpage/cuda/write_kv.h): a valid fp8 view, f16/bf16 input, positive finite scales.
// InvalidArgument naming the bad value.
absl::Status ValidateWriteKvFp8(const KvCacheView& cache, DType input_dtype, float k_scale,
                                float v_scale);

// Bytes from the start of a block's K to the end of its V when the block is one contiguous
// chunk (kv_stride == block_size * token_stride, token_stride == num_kv_heads * head_stride,
// head_stride == head_dim, or the MLA form); 0 when the block is not contiguous.
int64_t ContiguousBlockBytes(const KvCacheView& cache);

// Element offset of K (kv = 0) or V (kv = 1) of one token row of one head.
KVPAGE_HOST_DEVICE constexpr int64_t KvElementOffset(int64_t block_stride, int64_t kv_stride,
                                                     int64_t token_stride, int64_t head_stride,
                                                     int32_t block, int32_t kv, int32_t token,
                                                     int32_t head) {
  return static_cast<int64_t>(block) * block_stride + static_cast<int64_t>(kv) * kv_stride +
         static_cast<int64_t>(token) * token_stride + static_cast<int64_t>(head) * head_stride;
}

// Per-sequence block table: `table[num_seqs][row_stride]` int32 kernel-block ids, and
// `seq_lens[num_seqs]` int32 tokens already in the cache, including the query token's own K/V
// (write_kv runs before decode). Entries past cdiv(seq_len, block_size) are never read; entries
// before the sliding window are never read either, so they may be the null block.
struct BlockTableView {
  const int32_t* table = nullptr;
  int64_t row_stride = 0;
  const int32_t* seq_lens = nullptr;
  int32_t num_seqs = 0;
};

// A patch of a block table kept on the device: entries [first, first + count) of row `row`
// take values[value_offset, value_offset + count). The layout of the scheduler's
// kvpage::TableRun, so its runs are patched as they are (kvpage/cuda/table_runs.h).
struct TableRunView {
  int32_t row = 0;
  int32_t first = 0;
  int32_t count = 0;
  int32_t value_offset = 0;
};

// A half-open token range [begin, end) of one sequence.
struct TokenRange {
  int32_t begin = 0;
  int32_t end = 0;
};

// The tokens a decode query attends to: all of [0, seq_len) without a window, otherwise the
// query (at position seq_len - 1) and the window_left tokens before it.
// window_left < 0 means no window. An empty range when seq_len <= 0.
KVPAGE_HOST_DEVICE constexpr TokenRange AttendedRange(int32_t seq_len, int32_t window_left) {
  if (seq_len <= 0) return TokenRange{0, 0};
  int32_t begin = 0;
  if (window_left >= 0 && seq_len - 1 - window_left > 0) begin = seq_len - 1 - window_left;
  return TokenRange{begin, seq_len};
}

// Tokens of split `split` of `num_splits` when the attended range is cut into chunks of
// chunk_tokens tokens starting at its first token; empty once the split lies past the end. The
// last split runs to the end of the range whatever its length, so a plan made for a shorter
// maximum (a CUDA graph replayed after the sequences grew) still covers every token, only
// with more work in the last split.
// REQUIRES: chunk_tokens > 0, 0 <= split < num_splits.
KVPAGE_HOST_DEVICE constexpr TokenRange SplitRange(TokenRange attended, int32_t chunk_tokens,
                                                   int32_t split, int32_t num_splits) {
  const int64_t begin = static_cast<int64_t>(attended.begin) +
                        static_cast<int64_t>(split) * chunk_tokens;
  if (begin >= attended.end) return TokenRange{attended.end, attended.end};
  const int64_t end = split == num_splits - 1 ? attended.end : begin + chunk_tokens;
  return TokenRange{static_cast<int32_t>(begin),
                    static_cast<int32_t>(end < attended.end ? end : attended.end)};
}

// Decode attention options.
struct DecodeParams {
  int32_t num_q_heads = 0;   // a multiple of the cache's num_kv_heads
  float scale = 0.0f;        // softmax scale, usually 1/sqrt(head_dim)
  int32_t window_left = -1;  // sliding window (tokens before the query); -1 = off
  // fp8 (e4m3) caches only: the per-tensor scales WriteKvFp8 stored with (a value reads as
  // stored * scale), and the dtype of q and out (f16 or bf16). An f16/bf16 cache takes q and
  // out in its own dtype and requires both scales to be 1.
  float k_scale = 1.0f;
  float v_scale = 1.0f;
  DType fp8_query_dtype = DType::kBF16;
};

// The dtype of decode's q and out for this cache: the cache's own, or fp8_query_dtype for an
// fp8 cache.
DType DecodeQueryDType(const KvCacheView& cache, const DecodeParams& params);

// The decode arguments that do not depend on where they live (ref::PagedDecode and the
// launcher): num_q_heads a positive multiple of num_kv_heads; for an fp8 cache positive finite
// scales and an f16/bf16 fp8_query_dtype; otherwise scales of exactly 1. InvalidArgument
// naming the value; `what` prefixes the message. REQUIRES: a valid view.
absl::Status ValidateDecodeParams(const KvCacheView& cache, const DecodeParams& params,
                                  const char* what);

// How paged decode splits each sequence's KV range across CTAs. Fixed for a launch, so a
// CUDA graph captured with a plan can be replayed for any seq_lens: splits take chunk_tokens
// tokens each and the last one takes the rest of the range (SplitRange), so a longer sequence
// than planned is still exact, only less balanced.
// num_splits == 1 writes the output directly; otherwise partial (o, lse) go to a workspace
// and a merge kernel combines them.
struct DecodePlan {
  int32_t num_splits = 1;
  int32_t chunk_tokens = 0;  // tokens per split; a multiple of block_size
  // Which kernel runs. use_tensor_cores forces the tensor-core kernel (mma.sync; for
  // PagedDecode block_size a multiple of 16), force_cuda_cores the CUDA-core one, the
  // reference; setting both is InvalidArgument. With neither, the launcher chooses
  // (kvpage/cuda/paged_decode.h): PagedDecode and PagedDecodeMla take tensor cores where the
  // device, GQA group or head count, dtype, head_dim and block_size allow; PagedPrefill takes
  // CUDA cores.
  bool use_tensor_cores = false;
  bool force_cuda_cores = false;
};

// Host planning, FlashInfer's rule in simplified form. One wave is num_sms * ctas_per_sm CTAs
// (ctas_per_sm: what the decode kernel's registers and shared memory allow, e.g.
// cudaOccupancyMaxActiveBlocksPerMultiprocessor; kvpage::cuda::PlanDecodeForDevice asks the
// device). No split when the num_seqs * num_kv_heads * head_tiles CTAs already fill a wave;
// otherwise the most splits that keep the grid within one wave, with at least
// `min_chunk_tokens` tokens (rounded up to a block) per split. max_attended_tokens is the
// longest attended range in the batch (min(max_seq_len, window_left + 1) with a window).
// InvalidArgument naming the value if any count is not positive.
struct DecodePlanInputs {
  int32_t num_seqs = 0;
  int32_t num_kv_heads = 0;
  int32_t head_tiles = 1;  // CTAs per KV head (1 unless the GQA group exceeds 8)
  int32_t max_attended_tokens = 0;
  int32_t block_size = 0;
  int32_t num_sms = 0;
  int32_t ctas_per_sm = 0;  // resident decode CTAs per SM
  int32_t min_chunk_tokens = 256;
  int32_t max_splits = 64;
  bool tensor_cores = false;  // copied to DecodePlan::use_tensor_cores
  // Copied to DecodePlan::force_cuda_cores.
  bool force_cuda_cores = false;
};
absl::Status PlanDecode(const DecodePlanInputs& in, DecodePlan* plan);

// Query heads one PagedDecodeMla CTA holds: 4 on CUDA cores; on tensor cores the smallest of
// 16, 32 and 64 that holds num_q_heads, and 64 above that. MlaDecodeHeadTiles is the CTAs
// per sequence (DecodePlanInputs::head_tiles for an MLA cache, whose num_kv_heads is 1).
// REQUIRES: num_q_heads > 0.
KVPAGE_HOST_DEVICE constexpr int32_t MlaDecodeHeadTile(int32_t num_q_heads, bool tensor_cores) {
  if (!tensor_cores) return 4;
  return num_q_heads <= 16 ? 16 : num_q_heads <= 32 ? 32 : 64;
}
KVPAGE_HOST_DEVICE constexpr int32_t MlaDecodeHeadTiles(int32_t num_q_heads, bool tensor_cores) {
  const int32_t tile = MlaDecodeHeadTile(num_q_heads, tensor_cores);
  return (num_q_heads + tile - 1) / tile;
}

// Resident CTAs per SM of a kernel on an sm_90 GPU (H100/H200: 64K registers, 2,048 threads,
// 32 CTAs and 227 KiB of shared memory per SM; registers allocated per warp in units of 256,
// i.e. 8 per thread), the arithmetic of CUDA's occupancy calculator. For planning where no
// device can be asked and for tests; 0 when the kernel cannot run (too many registers,
// threads or shared memory). REQUIRES: registers_per_thread > 0, threads_per_cta > 0.
int32_t Sm90CtasPerSm(int32_t registers_per_thread, int32_t threads_per_cta,
                      int32_t shared_bytes_per_cta);

// One slot-major tensor of one layer for the copy kernels: slot s occupies bytes
// [base + s*slot_stride_bytes, + copy_bytes). A KV block is a slot whose bytes are K and V of
// the block; a recurrent (SSM) or conv state pool is a slot tensor per layer.
// Invariants: base, slot_stride_bytes and copy_bytes are multiples of 16, copy_bytes > 0,
// copy_bytes <= slot_stride_bytes.
struct SlotTensor {
  void* base = nullptr;
  int64_t slot_stride_bytes = 0;
  int64_t copy_bytes = 0;
  int32_t num_slots = 0;
};

// InvalidArgument naming the tensor index and field for a descriptor that breaks the
// invariants above.
absl::Status ValidateSlotTensor(const SlotTensor& tensor, int64_t index);

// The block-copy descriptor of one layer's KV cache (the whole block: K and V).
// InvalidArgument when the block is not one contiguous chunk.
absl::Status KvBlockSlotTensor(const KvCacheView& cache, SlotTensor* out);

}  // namespace kvpage

#endif  // KVPAGE_KERNEL_LAYOUT_H_
