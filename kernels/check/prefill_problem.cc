// Random paged-prefill problems and their comparison with ref::PagedPrefill.
#include "kernels/check/prefill_problem.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <numeric>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kvpage/kernel_reference.h"

namespace kvpage::cuda::check {
namespace {

constexpr int32_t kSeqs[][2] = {{37, 37}, {50, 13}, {20, 1}, {0, 0},
                                {64, 16}, {100, 5}, {1, 1},  {129, 1}};
constexpr int32_t kPadding = 3;

// NaN in the null block and in every slot past a sequence's end.
void PoisonUnused(PrefillProblem& p, const KvCacheView& view) {
  const int32_t bs = p.c.block_size;
  const uint16_t nan_bits = p.c.dtype == DType::kBF16 ? 0x7fc0 : 0x7e00;
  std::fill(p.cache.begin(), p.cache.begin() + view.block_stride, nan_bits);
  for (int32_t b = 0; b < p.num_seqs(); ++b) {
    if (p.lens[b] % bs == 0) continue;
    const int32_t block = p.table[static_cast<size_t>(b) * p.max_blocks + p.lens[b] / bs];
    for (int32_t t = p.lens[b] % bs; t < bs; ++t) {
      for (int64_t kv = 0; kv < 2; ++kv) {
        uint16_t* row = p.cache.data() + block * view.block_stride + kv * view.kv_stride +
                        t * view.token_stride;
        std::fill(row, row + int64_t{p.c.num_kv_heads} * p.c.head_dim, nan_bits);
      }
    }
  }
}

}  // namespace

std::string PrefillCase::Name() const {
  return absl::StrFormat("prefill %s kv_heads=%d group=%d head_dim=%d block=%d window=%d%s "
                         "splits=%d",
                         DTypeName(dtype), num_kv_heads, group, head_dim, block_size,
                         window_left, tensor_cores ? " tc" : "", num_splits);
}

KvCacheView PrefillProblem::View(void* base) const {
  return BlocksFirstKvCache(base, num_blocks, c.block_size, c.num_kv_heads, c.head_dim,
                            c.dtype);
}

absl::Status MakePrefillProblem(const PrefillCase& c, uint32_t seed, PrefillProblem* out) {
  if (c.dtype != DType::kBF16 && c.dtype != DType::kF16) {
    return absl::InvalidArgumentError(absl::StrCat(c.Name(), ": dtype must be f16 or bf16"));
  }
  PrefillProblem p;
  p.c = c;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int32_t bs = c.block_size;
  p.num_blocks = 1;  // the null block
  p.query_start_loc = {0};
  for (const auto& sq : kSeqs) {
    p.lens.push_back(sq[0]);
    p.query_start_loc.push_back(p.query_start_loc.back() + sq[1]);
    p.max_blocks = std::max(p.max_blocks, (sq[0] + bs - 1) / bs);
    p.num_blocks += (sq[0] + bs - 1) / bs;
  }
  p.real_tokens = p.query_start_loc.back();
  p.total_tokens = p.real_tokens + kPadding;
  std::vector<int32_t> ids(static_cast<size_t>(p.num_blocks - 1));
  std::iota(ids.begin(), ids.end(), 1);
  std::shuffle(ids.begin(), ids.end(), rng);
  p.table.assign(static_cast<size_t>(p.num_seqs()) * p.max_blocks, 0);
  size_t next = 0;
  for (int32_t b = 0; b < p.num_seqs(); ++b) {
    const int32_t first_query = p.lens[b] - (p.query_start_loc[b + 1] - p.query_start_loc[b]);
    const int32_t begin = AttendedRange(first_query + 1, c.window_left).begin;
    for (int32_t j = 0; j < (p.lens[b] + bs - 1) / bs; ++j) {
      p.table[static_cast<size_t>(b) * p.max_blocks + j] = (j + 1) * bs <= begin ? -1 : ids[next];
      ++next;
    }
  }
  p.cache.resize(static_cast<size_t>(p.num_blocks) * 2 * bs * c.num_kv_heads * c.head_dim);
  for (uint16_t& v : p.cache) v = ref::FloatToHalf(normal(rng), c.dtype);
  const KvCacheView view = p.View(p.cache.data());
  PoisonUnused(p, view);
  const int32_t hq = p.num_q_heads();
  p.q.resize(static_cast<size_t>(p.total_tokens) * hq * c.head_dim);
  for (uint16_t& v : p.q) v = ref::FloatToHalf(normal(rng), c.dtype);
  p.params = DecodeParams{hq, 1.0f / std::sqrt(static_cast<float>(c.head_dim)), c.window_left};
  p.plan.num_splits = c.num_splits;
  p.plan.chunk_tokens = c.num_splits > 1 ? 32 : 0;
  p.plan.use_tensor_cores = c.tensor_cores;
  p.want.resize(static_cast<size_t>(p.real_tokens) * hq * c.head_dim);
  const absl::Status status = ref::PagedPrefill(
      p.q.data(), int64_t{hq} * c.head_dim, p.query_start_loc.data(), view,
      BlockTableView{p.table.data(), p.max_blocks, p.lens.data(), p.num_seqs()}, p.params,
      p.want.data(), nullptr);
  if (!status.ok()) return status;
  *out = std::move(p);
  return absl::OkStatus();
}

absl::Status ComparePrefill(const PrefillProblem& p, const std::vector<uint16_t>& got) {
  const int32_t hq = p.num_q_heads(), d = p.c.head_dim;
  const size_t expected = static_cast<size_t>(p.total_tokens) * hq * d;
  if (got.size() < expected) {
    return absl::InternalError(absl::StrCat(p.c.Name(), ": ", got.size(), " outputs, want ",
                                            expected));
  }
  const double tol = p.c.dtype == DType::kBF16 ? 1e-2 : 2e-3;
  int64_t bad = 0;
  std::string first;
  for (size_t i = 0; i < expected; ++i) {
    const double g = ref::HalfToFloat(got[i], p.c.dtype);
    const double w = i < p.want.size() ? p.want[i] : 0.0;  // padding tokens: zero
    if (std::abs(g - w) <= tol + tol * std::abs(w)) continue;
    if (bad++ == 0) {
      first = absl::StrCat("token ", i / (hq * d), " head ", i / d % hq, " dim ", i % d,
                           ": got ", g, ", want ", w);
    }
  }
  if (bad == 0) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(p.c.Name(), ": ", bad, " bad outputs; first ", first));
}

}  // namespace kvpage::cuda::check
