// Random paged-decode problems and their reference comparison (decode_problem.h).
#include "kernels/check/decode_problem.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "absl/strings/str_format.h"
#include "kvpage/kernel_reference.h"

namespace kvpage::cuda::check {
namespace {

constexpr uint16_t kHalfNan = 0xffff;  // a NaN in both f16 and bf16

int32_t CeilDiv(int64_t a, int64_t b) { return static_cast<int32_t>((a + b - 1) / b); }

// CTAs per KV head, as the launchers: 8 query heads a CTA; for MLA MlaDecodeHeadTiles.
int32_t HeadTiles(const DecodeCase& c) {
  return c.mla ? MlaDecodeHeadTiles(c.group, c.MlaTensorCores())
               : std::max(1, (c.group + 7) / 8);
}

}  // namespace

std::string DecodeCase::Name() const {
  std::string name =
      absl::StrFormat("paged_decode %s B=%d Hkv=%d G=%d D=%d bs=%d len<=%d win=%d splits=%d",
                      DTypeName(dtype), num_seqs, num_kv_heads, group, head_dim, block_size,
                      max_len, window_left, num_splits);
  if (plan_tokens > 0) name += absl::StrFormat(" planned for %d", plan_tokens);
  if (fp8_kv) name += " fp8 KV";
  if (mla) name += " MLA";
  if (tensor_cores) name += " tensor cores";
  if (cuda_cores) name += " CUDA cores";
  return name;
}

absl::Status MakeDecodeProblem(const DecodeCase& c, uint32_t seed, int32_t num_sms,
                               int32_t ctas_per_sm, DecodeProblem* p) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  p->c = c;
  const int32_t bs = c.block_size;
  const int32_t edges[] = {1, bs - 1, bs, bs + 1, c.max_len, 0};
  std::uniform_int_distribution<int32_t> len_dist(1, std::max(1, c.max_len));
  p->lens.assign(c.num_seqs, 0);
  for (int32_t b = 0; b < c.num_seqs; ++b) {
    p->lens[b] = b < 6 ? std::clamp(edges[b], 0, c.max_len) : len_dist(rng);
  }
  p->max_blocks = std::max(1, CeilDiv(c.max_len, bs));
  int64_t used = 0;
  for (int32_t len : p->lens) used += CeilDiv(len, bs);
  p->num_blocks = static_cast<int32_t>(used) + 9;
  std::vector<int32_t> ids(p->num_blocks - 1);
  std::iota(ids.begin(), ids.end(), 1);
  std::shuffle(ids.begin(), ids.end(), rng);

  const int64_t row = static_cast<int64_t>(c.num_kv_heads) * c.head_dim;
  // kHalfNan is two 0xff bytes: NaN in e4m3 too.
  const int32_t halves = c.mla ? 1 : 2;  // an MLA block holds one latent row per token
  const int64_t elements = static_cast<int64_t>(p->num_blocks) * halves * bs * row;
  p->cache.assign(static_cast<size_t>(c.fp8_kv ? (elements + 1) / 2 : elements), kHalfNan);
  const KvCacheView view = p->View(p->cache.data());
  p->table.assign(static_cast<size_t>(c.num_seqs) * p->max_blocks, -1);
  size_t next = 0;
  for (int32_t b = 0; b < c.num_seqs; ++b) {
    const TokenRange attended = AttendedRange(p->lens[b], c.window_left);
    for (int32_t j = 0; j < CeilDiv(p->lens[b], bs); ++j) {
      const int32_t block = ids[next++];
      // The manager frees blocks wholly before the window and puts the null block there.
      p->table[b * p->max_blocks + j] = (j + 1) * bs <= attended.begin ? 0 : block;
      for (int32_t t = j * bs; t < std::min((j + 1) * bs, p->lens[b]); ++t) {
        for (int32_t kv = 0; kv < halves; ++kv) {
          const int64_t at = KvElementOffset(view.block_stride, view.kv_stride,
                                             view.token_stride, view.head_stride, block, kv,
                                             t % bs, 0);
          if (c.fp8_kv) {
            uint8_t* dst = reinterpret_cast<uint8_t*>(p->cache.data()) + at;
            const float inv_scale = 1.0f / (kv == 0 ? kFp8KScale : kFp8VScale);
            for (int64_t i = 0; i < row; ++i) dst[i] = ref::FloatToE4m3(normal(rng) * inv_scale);
          } else {
            uint16_t* dst = p->cache.data() + at;
            for (int64_t i = 0; i < row; ++i) dst[i] = ref::FloatToHalf(normal(rng), c.dtype);
          }
        }
      }
    }
  }
  // q rows are head_dim long (the whole latent row for MLA), out rows out_dim().
  p->q.resize(static_cast<size_t>(c.num_seqs) * p->num_q_heads() * c.head_dim);
  for (auto& x : p->q) x = ref::FloatToHalf(normal(rng), c.dtype);
  p->params = DecodeParams{p->num_q_heads(), 1.0f / std::sqrt(static_cast<float>(c.head_dim)),
                           c.window_left};
  if (c.fp8_kv) {
    p->params.k_scale = kFp8KScale;
    p->params.v_scale = kFp8VScale;
    p->params.fp8_query_dtype = c.dtype;
  }

  int32_t max_attended = 0;
  for (int32_t len : p->lens) {
    const TokenRange r = AttendedRange(len, c.window_left);
    max_attended = std::max(max_attended, r.end - r.begin);
  }
  if (c.plan_tokens > 0) max_attended = std::min(max_attended, c.plan_tokens);
  if (c.num_splits > 0) {
    const int32_t tokens = std::max(max_attended, 1);
    const int32_t chunk = std::max(1, CeilDiv(CeilDiv(tokens, c.num_splits), bs)) * bs;
    p->plan = DecodePlan{CeilDiv(tokens, chunk), chunk, c.tensor_cores, c.cuda_cores};
    return absl::OkStatus();
  }
  DecodePlanInputs in;
  in.num_seqs = c.num_seqs;
  in.num_kv_heads = c.num_kv_heads;
  in.head_tiles = HeadTiles(c);
  in.max_attended_tokens = max_attended;
  in.block_size = bs;
  in.num_sms = num_sms;
  in.ctas_per_sm = ctas_per_sm;
  in.tensor_cores = c.tensor_cores;
  const absl::Status status = PlanDecode(in, &p->plan);
  p->plan.force_cuda_cores = c.cuda_cores;
  return status;
}

absl::Status CompareDecode(const DecodeProblem& p, const std::vector<uint16_t>& got,
                           double* max_abs_err) {
  const DecodeCase& c = p.c;
  std::vector<double> want(static_cast<size_t>(p.out_elements()));
  const int64_t q_stride = static_cast<int64_t>(p.num_q_heads()) * c.head_dim;
  const KvCacheView view = p.View(const_cast<uint16_t*>(p.cache.data()));
  const BlockTableView table{p.table.data(), p.max_blocks, p.lens.data(), c.num_seqs};
  absl::Status status =
      c.mla ? ref::PagedDecodeMla(p.q.data(), q_stride, view, table, p.params, kMlaLatentDim,
                                  want.data(), nullptr)
            : ref::PagedDecode(p.q.data(), q_stride, view, table, p.params, want.data(),
                               nullptr);
  if (!status.ok()) return status;
  if (got.size() != want.size()) {
    return absl::InternalError(absl::StrFormat("%s: %d outputs, expected %d", c.Name(),
                                               got.size(), want.size()));
  }
  const double tol = c.dtype == DType::kBF16 ? 1e-2 : 2e-3;
  double max_err = 0.0, err_sq = 0.0, ref_sq = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = ref::HalfToFloat(got[i], c.dtype);
    const double err = std::fabs(g - want[i]);
    if (!(err <= tol + tol * std::fabs(want[i]))) {  // also catches NaN
      return absl::InternalError(absl::StrFormat(
          "%s (plan %d x %d): element %d (seq %d head %d) is %g, expected %g", c.Name(),
          p.plan.num_splits, p.plan.chunk_tokens, i, i / (p.num_q_heads() * p.out_dim()),
          (i / p.out_dim()) % p.num_q_heads(), g, want[i]));
    }
    max_err = std::max(max_err, err);
    err_sq += err * err;
    ref_sq += want[i] * want[i];
  }
  const double rel_l2 = ref_sq > 0 ? std::sqrt(err_sq / ref_sq) : std::sqrt(err_sq);
  if (rel_l2 > (c.dtype == DType::kBF16 ? 5e-3 : 1e-3)) {
    return absl::InternalError(absl::StrFormat("%s: relative L2 error %g", c.Name(), rel_l2));
  }
  if (max_abs_err != nullptr) *max_abs_err = max_err;
  return absl::OkStatus();
}

}  // namespace kvpage::cuda::check
