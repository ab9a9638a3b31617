// CPU references of the kvpage kernels: the oracle for the GPU tests. Straightforward loops
// with double accumulation; clarity over speed.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "kvpage/kernel_reference.h"

namespace kvpage::ref {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

uint16_t* Element(const KvCacheView& c, int32_t block, int32_t kv, int32_t token, int32_t head) {
  return static_cast<uint16_t*>(c.base) + KvElementOffset(c.block_stride, c.kv_stride,
                                                          c.token_stride, c.head_stride, block,
                                                          kv, token, head);
}

// The head_dim values of one K (kv = 0) or V (kv = 1) row, dequantised: f16/bf16 as they
// are, e4m3 times `fp8_scale`.
void ReadKvRow(const KvCacheView& c, int32_t block, int32_t kv, int32_t token, int32_t head,
               double fp8_scale, std::vector<double>* row) {
  const int64_t offset =
      KvElementOffset(c.block_stride, c.kv_stride, c.token_stride, c.head_stride, block, kv,
                      token, head);
  row->resize(c.head_dim);
  for (int32_t i = 0; i < c.head_dim; ++i) {
    (*row)[i] = c.dtype == DType::kFP8
                    ? E4m3ToFloat(static_cast<const uint8_t*>(c.base)[offset + i]) * fp8_scale
                    : HalfToFloat(static_cast<const uint16_t*>(c.base)[offset + i], c.dtype);
  }
}

absl::Status CheckSlotIds(absl::Span<const SlotTensor> tensors, const int32_t* ids,
                          int32_t count, const char* what) {
  for (int32_t i = 0; i < count; ++i) {
    if (ids[i] < 0) continue;
    for (size_t t = 0; t < tensors.size(); ++t) {
      if (ids[i] >= tensors[t].num_slots) {
        return absl::InvalidArgumentError(absl::StrCat(what, "[", i, "] = ", ids[i],
                                                       " is past num_slots ",
                                                       tensors[t].num_slots, " of tensor ", t));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CheckHalfCache(const KvCacheView& cache, const char* what) {
  absl::Status status = ValidateKvCacheView(cache);
  if (!status.ok()) return status;
  if (cache.dtype == DType::kFP8) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": the cache is fp8"));
  }
  return absl::OkStatus();
}

// Common checks of WriteKv and WriteKvFp8: the launchers' argument rules, and every slot
// inside the cache (the kernel skips a slot past the end; the reference calls it a bug).
absl::Status CheckWriteArgs(const uint16_t* k, const uint16_t* v, const int64_t* slot_mapping,
                            int32_t num_tokens, const KvCacheView& cache, const char* what) {
  absl::Status status = ValidateWriteKvArgs(k, v, slot_mapping, num_tokens, cache, what);
  if (!status.ok()) return status;
  const int64_t num_slots = static_cast<int64_t>(cache.num_blocks) * cache.block_size;
  for (int32_t t = 0; t < num_tokens; ++t) {
    if (slot_mapping[t] >= num_slots) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": slot_mapping[", t, "] = ",
                                                     slot_mapping[t], " is past ", num_slots,
                                                     " slots"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteKv(const uint16_t* k, const uint16_t* v, int64_t k_token_stride,
                     int64_t v_token_stride, const int64_t* slot_mapping, int32_t num_tokens,
                     const KvCacheView& cache) {
  absl::Status status = CheckHalfCache(cache, "WriteKv");
  if (!status.ok()) return status;
  status = CheckWriteArgs(k, v, slot_mapping, num_tokens, cache, "WriteKv");
  if (!status.ok()) return status;
  const size_t row_bytes = sizeof(uint16_t) * cache.head_dim;
  for (int32_t t = 0; t < num_tokens; ++t) {
    const int64_t slot = slot_mapping[t];
    if (slot < 0) continue;
    const int32_t block = static_cast<int32_t>(slot / cache.block_size);
    const int32_t offset = static_cast<int32_t>(slot % cache.block_size);
    for (int32_t h = 0; h < cache.num_kv_heads; ++h) {
      std::memcpy(Element(cache, block, 0, offset, h), k + t * k_token_stride + h * cache.head_dim,
                  row_bytes);
      if (v != nullptr) {
        std::memcpy(Element(cache, block, 1, offset, h),
                    v + t * v_token_stride + h * cache.head_dim, row_bytes);
      }
    }
  }
  return absl::OkStatus();
}

absl::Status WriteKvFp8(const uint16_t* k, const uint16_t* v, int64_t k_token_stride,
                        int64_t v_token_stride, const int64_t* slot_mapping, int32_t num_tokens,
                        DType input_dtype, float k_scale, float v_scale,
                        const KvCacheView& cache) {
  absl::Status status = ValidateWriteKvFp8(cache, input_dtype, k_scale, v_scale);
  if (!status.ok()) return status;
  status = CheckWriteArgs(k, v, slot_mapping, num_tokens, cache, "WriteKvFp8");
  if (!status.ok()) return status;
  const float inv_scale[2] = {1.0f / k_scale, 1.0f / v_scale};
  uint8_t* base = static_cast<uint8_t*>(cache.base);
  for (int32_t t = 0; t < num_tokens; ++t) {
    const int64_t slot = slot_mapping[t];
    if (slot < 0) continue;
    const int32_t block = static_cast<int32_t>(slot / cache.block_size);
    const int32_t offset = static_cast<int32_t>(slot % cache.block_size);
    for (int32_t kv = 0; kv < (v == nullptr ? 1 : 2); ++kv) {
      const uint16_t* src = kv == 0 ? k + t * k_token_stride : v + t * v_token_stride;
      for (int32_t h = 0; h < cache.num_kv_heads; ++h) {
        uint8_t* dst = base + KvElementOffset(cache.block_stride, cache.kv_stride,
                                              cache.token_stride, cache.head_stride, block, kv,
                                              offset, h);
        for (int32_t i = 0; i < cache.head_dim; ++i) {
          const float x = HalfToFloat(src[h * cache.head_dim + i], input_dtype);
          dst[i] = FloatToE4m3(x * inv_scale[kv]);
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::Status PagedDecode(const uint16_t* q, int64_t q_seq_stride, const KvCacheView& cache,
                         const BlockTableView& table, const DecodeParams& params, double* out,
                         double* lse) {
  absl::Status status = ValidateKvCacheView(cache);
  if (!status.ok()) return status;
  status = ValidateDecodeParams(cache, params, "PagedDecode");
  if (!status.ok()) return status;
  const int32_t hq = params.num_q_heads;
  const int32_t group = hq / cache.num_kv_heads;
  const int32_t d = cache.head_dim;
  const DType q_dtype = DecodeQueryDType(cache, params);
  std::vector<double> scores, kv_row;
  for (int32_t b = 0; b < table.num_seqs; ++b) {
    const TokenRange range = AttendedRange(table.seq_lens[b], params.window_left);
    // Resolve and check the blocks once per sequence.
    std::vector<int32_t> blocks(range.end - range.begin);
    for (int32_t t = range.begin; t < range.end; ++t) {
      const int32_t block = table.table[b * table.row_stride + t / cache.block_size];
      if (block < 0 || block >= cache.num_blocks) {
        return absl::InvalidArgumentError(absl::StrCat("PagedDecode: sequence ", b,
                                                       " position ", t, " maps to block ", block,
                                                       " outside [0, ", cache.num_blocks, ")"));
      }
      blocks[t - range.begin] = block;
    }
    for (int32_t h = 0; h < hq; ++h) {
      const int32_t kvh = h / group;
      const uint16_t* qh = q + b * q_seq_stride + static_cast<int64_t>(h) * d;
      double* o = out + (static_cast<int64_t>(b) * hq + h) * d;
      scores.assign(range.end - range.begin, 0.0);
      double max_score = kNegInf;
      for (int32_t t = range.begin; t < range.end; ++t) {
        ReadKvRow(cache, blocks[t - range.begin], 0, t % cache.block_size, kvh, params.k_scale,
                  &kv_row);
        double dot = 0.0;
        for (int32_t i = 0; i < d; ++i) {
          dot += static_cast<double>(HalfToFloat(qh[i], q_dtype)) * kv_row[i];
        }
        scores[t - range.begin] = dot * params.scale;
        max_score = std::max(max_score, scores[t - range.begin]);
      }
      double denom = 0.0;
      for (double& s : scores) {
        s = std::exp(s - max_score);
        denom += s;
      }
      for (int32_t i = 0; i < d; ++i) o[i] = 0.0;
      for (int32_t t = range.begin; t < range.end; ++t) {
        ReadKvRow(cache, blocks[t - range.begin], 1, t % cache.block_size, kvh, params.v_scale,
                  &kv_row);
        const double p = scores[t - range.begin] / denom;
        for (int32_t i = 0; i < d; ++i) o[i] += p * kv_row[i];
      }
      if (lse != nullptr) {
        lse[static_cast<int64_t>(b) * hq + h] =
            range.end > range.begin ? max_score + std::log(denom) : kNegInf;
      }
    }
  }
  return absl::OkStatus();
}

absl::Status PagedDecodeMla(const uint16_t* q, int64_t q_seq_stride, const KvCacheView& cache,
                            const BlockTableView& table, const DecodeParams& params,
                            int32_t latent_dim, double* out, double* lse) {
  if (cache.kv_stride != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PagedDecodeMla: the view has a V half (kv_stride ", cache.kv_stride, "), not MLA"));
  }
  if (latent_dim <= 0 || latent_dim > cache.head_dim) {
    return absl::InvalidArgumentError(absl::StrCat("PagedDecodeMla: latent_dim ", latent_dim,
                                                   " is outside (0, ", cache.head_dim, "]"));
  }
  // With kv_stride 0, V is the whole latent row: decode over it, then keep the latent part.
  const int64_t rows = static_cast<int64_t>(table.num_seqs) * params.num_q_heads;
  std::vector<double> full(static_cast<size_t>(std::max<int64_t>(rows, 0)) * cache.head_dim);
  absl::Status status = PagedDecode(q, q_seq_stride, cache, table, params, full.data(), lse);
  if (!status.ok()) return status;
  for (int64_t r = 0; r < rows; ++r) {
    std::copy_n(full.data() + r * cache.head_dim, latent_dim, out + r * latent_dim);
  }
  return absl::OkStatus();
}

absl::Status PagedPrefill(const uint16_t* q, int64_t q_token_stride,
                          const int32_t* query_start_loc, const KvCacheView& cache,
                          const BlockTableView& table, const DecodeParams& params, double* out,
                          double* lse) {
  const int64_t row = static_cast<int64_t>(params.num_q_heads) * cache.head_dim;
  for (int32_t b = 0; b < table.num_seqs; ++b) {
    const int32_t begin = query_start_loc[b], end = query_start_loc[b + 1];
    const int32_t seq_len = table.seq_lens[b];
    if (end < begin || end - begin > seq_len) {
      return absl::InvalidArgumentError(
          absl::StrCat("PagedPrefill: sequence ", b, " has queries [", begin, ", ", end,
                       ") but ", seq_len, " tokens"));
    }
    // One query at a time, as a decode of the sequence cut after the query's own token.
    for (int32_t i = begin; i < end; ++i) {
      const int32_t len = seq_len - (end - i) + 1;
      const BlockTableView one{.table = table.table + b * table.row_stride,
                               .row_stride = table.row_stride,
                               .seq_lens = &len,
                               .num_seqs = 1};
      absl::Status status =
          PagedDecode(q + i * q_token_stride, q_token_stride, cache, one, params, out + i * row,
                      lse == nullptr ? nullptr : lse + static_cast<int64_t>(i) * params.num_q_heads);
      if (!status.ok()) return status;
    }
  }
  return absl::OkStatus();
}

void MergeAttnStates(const float* partial_o, const float* partial_lse, int32_t num_seqs,
                     int32_t num_heads, int32_t num_splits, int32_t head_dim, double* out,
                     double* lse_out) {
  for (int64_t row = 0; row < static_cast<int64_t>(num_seqs) * num_heads; ++row) {
    const float* lse = partial_lse + row * num_splits;
    double max_lse = kNegInf;
    for (int32_t s = 0; s < num_splits; ++s) max_lse = std::max<double>(max_lse, lse[s]);
    double* o = out + row * head_dim;
    for (int32_t i = 0; i < head_dim; ++i) o[i] = 0.0;
    if (max_lse == kNegInf) {
      if (lse_out != nullptr) lse_out[row] = kNegInf;
      continue;
    }
    double total = 0.0;
    for (int32_t s = 0; s < num_splits; ++s) {
      if (lse[s] == -std::numeric_limits<float>::infinity()) continue;
      const double w = std::exp(lse[s] - max_lse);
      total += w;
      const float* os = partial_o + (row * num_splits + s) * head_dim;
      for (int32_t i = 0; i < head_dim; ++i) o[i] += w * os[i];
    }
    for (int32_t i = 0; i < head_dim; ++i) o[i] /= total;
    if (lse_out != nullptr) lse_out[row] = max_lse + std::log(total);
  }
}

absl::Status CopySlots(absl::Span<const SlotTensor> tensors, const int32_t* src,
                       const int32_t* dst, int32_t num_pairs) {
  for (size_t t = 0; t < tensors.size(); ++t) {
    absl::Status status = ValidateSlotTensor(tensors[t], static_cast<int64_t>(t));
    if (!status.ok()) return status;
  }
  absl::Status status = CheckSlotIds(tensors, src, num_pairs, "CopySlots: src");
  if (!status.ok()) return status;
  status = CheckSlotIds(tensors, dst, num_pairs, "CopySlots: dst");
  if (!status.ok()) return status;
  absl::flat_hash_set<int32_t> sources;
  absl::flat_hash_set<int32_t> destinations;
  for (int32_t i = 0; i < num_pairs; ++i) {
    if (src[i] < 0 || dst[i] < 0 || src[i] == dst[i]) continue;
    sources.insert(src[i]);
    if (!destinations.insert(dst[i]).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("CopySlots: pair ", i, " repeats destination ", dst[i]));
    }
  }
  for (int32_t slot : destinations) {
    if (sources.contains(slot)) {
      return absl::InvalidArgumentError(
          absl::StrCat("CopySlots: slot ", slot, " is both a source and a destination"));
    }
  }
  for (const SlotTensor& t : tensors) {
    char* base = static_cast<char*>(t.base);
    for (int32_t i = 0; i < num_pairs; ++i) {
      if (src[i] < 0 || dst[i] < 0 || src[i] == dst[i]) continue;
      std::memcpy(base + dst[i] * t.slot_stride_bytes, base + src[i] * t.slot_stride_bytes,
                  static_cast<size_t>(t.copy_bytes));
    }
  }
  return absl::OkStatus();
}

absl::Status ZeroSlots(absl::Span<const SlotTensor> tensors, const int32_t* slots,
                       int32_t num_slots) {
  for (size_t t = 0; t < tensors.size(); ++t) {
    absl::Status status = ValidateSlotTensor(tensors[t], static_cast<int64_t>(t));
    if (!status.ok()) return status;
  }
  absl::Status status = CheckSlotIds(tensors, slots, num_slots, "ZeroSlots: slots");
  if (!status.ok()) return status;
  for (const SlotTensor& t : tensors) {
    char* base = static_cast<char*>(t.base);
    for (int32_t i = 0; i < num_slots; ++i) {
      if (slots[i] < 0) continue;
      std::memset(base + slots[i] * t.slot_stride_bytes, 0, static_cast<size_t>(t.copy_bytes));
    }
  }
  return absl::OkStatus();
}

}  // namespace kvpage::ref
