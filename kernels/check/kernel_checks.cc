// Device-vs-reference checks (kernel_checks.h).
#include "kernels/check/kernel_checks.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/check/device_buffer.h"
#include "kernels/cuda_status.h"
#include "kernels/paged_decode_launch.h"
#include "kvpage/cuda/copy_slots.h"
#include "kvpage/cuda/paged_decode.h"
#include "kvpage/cuda/paged_prefill.h"
#include "kvpage/cuda/write_kv.h"
#include "kvpage/kernel_layout.h"
#include "kvpage/kernel_reference.h"
#include "src/internal/status_macros.h"

namespace kvpage::cuda::check {
namespace {

constexpr uint16_t kHalfNan = 0xffff;  // a NaN in both f16 and bf16

absl::Status Sync(const char* what) {
  const cudaError_t err = cudaDeviceSynchronize();
  return err == cudaSuccess ? absl::OkStatus() : internal::CudaStatus(err, what);
}

std::vector<uint16_t> RandomHalves(size_t n, DType dtype, std::mt19937& rng) {
  std::normal_distribution<float> normal;
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = ref::FloatToHalf(normal(rng), dtype);
  return v;
}

}  // namespace

absl::Status RequireDevice() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) return internal::CudaStatus(err, "cudaGetDeviceCount");
  if (count == 0) return absl::UnavailableError("no CUDA device");
  return absl::OkStatus();
}

std::string WriteKvCase::Name() const {
  return absl::StrFormat("write_kv %s%s T=%d H=%d D=%d bs=%d%s", DTypeName(dtype),
                         fp8 ? "->fp8" : "", num_tokens, num_kv_heads, head_dim, block_size,
                         mla ? " mla" : "");
}

absl::Status CheckWriteKv(const WriteKvCase& c, uint32_t seed) {
  KVPAGE_RETURN_IF_ERROR(RequireDevice());
  std::mt19937 rng(seed);
  const int32_t heads = c.mla ? 1 : c.num_kv_heads;
  const int64_t row = static_cast<int64_t>(heads) * c.head_dim;
  const std::vector<uint16_t> k = RandomHalves(c.num_tokens * row, c.dtype, rng);
  const std::vector<uint16_t> v = RandomHalves(c.num_tokens * row, c.dtype, rng);
  // Distinct random slots, every fifth token padding (-1).
  std::vector<int64_t> all(static_cast<size_t>(c.num_blocks) * c.block_size);
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng);
  std::vector<int64_t> slots(c.num_tokens);
  for (int32_t t = 0; t < c.num_tokens; ++t) slots[t] = t % 5 == 3 ? -1 : all[t];
  const DType cache_dtype = c.fp8 ? DType::kFP8 : c.dtype;
  const int64_t cache_bytes = static_cast<int64_t>(c.num_blocks) * c.block_size * row *
                              (c.mla ? 1 : 2) * BytesPerValue(cache_dtype);
  std::vector<uint8_t> cache(cache_bytes, 0xaa);

  DeviceBuffer dk, dv, dslots, dcache;
  KVPAGE_RETURN_IF_ERROR(dk.Upload(k));
  KVPAGE_RETURN_IF_ERROR(dv.Upload(v));
  KVPAGE_RETURN_IF_ERROR(dslots.Upload(slots));
  KVPAGE_RETURN_IF_ERROR(dcache.Upload(cache));
  auto view = [&](void* base) {
    return c.mla ? MlaKvCache(base, c.num_blocks, c.block_size, c.head_dim, cache_dtype)
                 : BlocksFirstKvCache(base, c.num_blocks, c.block_size, heads, c.head_dim,
                                      cache_dtype);
  };
  const void* dv_ptr = c.mla ? nullptr : dv.get();
  const uint16_t* v_ptr = c.mla ? nullptr : v.data();
  constexpr float kKScale = 0.05f, kVScale = 0.125f;  // spread values over e4m3's range
  if (c.fp8) {
    KVPAGE_RETURN_IF_ERROR(WriteKvFp8(dk.get(), dv_ptr, row, row, dslots.as<int64_t>(),
                                      c.num_tokens, c.dtype, kKScale, kVScale,
                                      view(dcache.get()), nullptr));
  } else {
    KVPAGE_RETURN_IF_ERROR(WriteKv(dk.get(), dv_ptr, row, row, dslots.as<int64_t>(),
                                   c.num_tokens, view(dcache.get()), nullptr));
  }
  KVPAGE_RETURN_IF_ERROR(Sync("WriteKv"));
  std::vector<uint8_t> got;
  KVPAGE_RETURN_IF_ERROR(dcache.Download(&got));
  // The reference needs a 16-byte aligned host base: vector storage from operator new is.
  if (c.fp8) {
    KVPAGE_RETURN_IF_ERROR(ref::WriteKvFp8(k.data(), v_ptr, row, row, slots.data(),
                                           c.num_tokens, c.dtype, kKScale, kVScale,
                                           view(cache.data())));
  } else {
    KVPAGE_RETURN_IF_ERROR(
        ref::WriteKv(k.data(), v_ptr, row, row, slots.data(), c.num_tokens, view(cache.data())));
  }
  for (int64_t i = 0; i < cache_bytes; ++i) {
    if (got[i] != cache[i]) {
      return absl::InternalError(absl::StrFormat("%s: byte %d is 0x%02x, expected 0x%02x",
                                                 c.Name(), i, got[i], cache[i]));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckPagedDecode(const DecodeCase& c, uint32_t seed, double* max_abs_err) {
  KVPAGE_RETURN_IF_ERROR(RequireDevice());
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  int32_t ctas_per_sm = 0;
  if (c.mla) {
    KVPAGE_ASSIGN_OR_RETURN(ctas_per_sm,
                            MlaDecodeCtasPerSm(c.dtype, c.group, c.MlaTensorCores()));
  } else {
    KVPAGE_ASSIGN_OR_RETURN(ctas_per_sm, DecodeCtasPerSm(c.fp8_kv ? DType::kFP8 : c.dtype,
                                                         c.head_dim, c.group, c.tensor_cores));
  }
  DecodeProblem p;
  KVPAGE_RETURN_IF_ERROR(MakeDecodeProblem(c, seed, std::max(sms, 1), ctas_per_sm, &p));
  const int32_t hq = p.num_q_heads();
  DeviceBuffer dcache, dq, dtable, dlens, dout, dws;
  KVPAGE_RETURN_IF_ERROR(dcache.Upload(p.cache));
  KVPAGE_RETURN_IF_ERROR(dq.Upload(p.q));
  KVPAGE_RETURN_IF_ERROR(dtable.Upload(p.table));
  KVPAGE_RETURN_IF_ERROR(dlens.Upload(p.lens));
  KVPAGE_RETURN_IF_ERROR(
      dout.Upload(std::vector<uint16_t>(static_cast<size_t>(p.out_elements()), kHalfNan)));
  const int64_t ws_bytes = DecodeWorkspaceBytes(p.plan, c.num_seqs, hq, p.out_dim());
  KVPAGE_RETURN_IF_ERROR(dws.Allocate(static_cast<size_t>(ws_bytes)));
  const auto decode = c.mla ? PagedDecodeMla : PagedDecode;
  KVPAGE_RETURN_IF_ERROR(decode(
      dout.get(), dq.get(), static_cast<int64_t>(hq) * c.head_dim, p.View(dcache.get()),
      BlockTableView{dtable.as<int32_t>(), p.max_blocks, dlens.as<int32_t>(), c.num_seqs},
      p.params, p.plan, dws.get(), ws_bytes, nullptr));
  KVPAGE_RETURN_IF_ERROR(Sync("PagedDecode"));
  std::vector<uint16_t> got;
  KVPAGE_RETURN_IF_ERROR(dout.Download(&got));
  return CompareDecode(p, got, max_abs_err);
}

absl::Status CheckPagedPrefill(const PrefillCase& c, uint32_t seed) {
  KVPAGE_RETURN_IF_ERROR(RequireDevice());
  PrefillProblem p;
  KVPAGE_RETURN_IF_ERROR(MakePrefillProblem(c, seed, &p));
  const int32_t hq = p.num_q_heads();
  DeviceBuffer dcache, dq, dtable, dlens, dqsl, dout, dws;
  KVPAGE_RETURN_IF_ERROR(dcache.Upload(p.cache));
  KVPAGE_RETURN_IF_ERROR(dq.Upload(p.q));
  KVPAGE_RETURN_IF_ERROR(dtable.Upload(p.table));
  KVPAGE_RETURN_IF_ERROR(dlens.Upload(p.lens));
  KVPAGE_RETURN_IF_ERROR(dqsl.Upload(p.query_start_loc));
  KVPAGE_RETURN_IF_ERROR(dout.Upload(std::vector<uint16_t>(
      static_cast<size_t>(p.total_tokens) * hq * c.head_dim, kHalfNan)));
  const int64_t ws_bytes = PrefillWorkspaceBytes(p.plan, p.total_tokens, hq, c.head_dim);
  KVPAGE_RETURN_IF_ERROR(dws.Allocate(static_cast<size_t>(ws_bytes)));
  KVPAGE_RETURN_IF_ERROR(PagedPrefill(
      dout.get(), dq.get(), static_cast<int64_t>(hq) * c.head_dim, dqsl.as<int32_t>(),
      p.total_tokens, p.View(dcache.get()),
      BlockTableView{dtable.as<int32_t>(), p.max_blocks, dlens.as<int32_t>(), p.num_seqs()},
      p.params, p.plan, dws.get(), ws_bytes, nullptr));
  KVPAGE_RETURN_IF_ERROR(Sync("PagedPrefill"));
  std::vector<uint16_t> got;
  KVPAGE_RETURN_IF_ERROR(dout.Download(&got));
  return ComparePrefill(p, got);
}

std::string CopyCase::Name() const {
  return absl::StrFormat("copies slots=%d pairs=%d", num_slots, num_pairs);
}

absl::Status CheckCopies(const CopyCase& c, uint32_t seed) {
  KVPAGE_RETURN_IF_ERROR(RequireDevice());
  std::mt19937 rng(seed);
  // (stride, copy bytes): a 64 KiB KV block, a 48 KiB + 16 B state, a short copy in a
  // longer stride.
  const int64_t shapes[3][2] = {{65536, 65536}, {49168, 49168}, {4096, 592}};
  std::vector<std::vector<uint8_t>> host(3);
  std::vector<DeviceBuffer> dev(3);
  std::vector<SlotTensor> dev_tensors(3), host_tensors(3);
  for (int i = 0; i < 3; ++i) {
    host[i].resize(static_cast<size_t>(shapes[i][0]) * c.num_slots);
    for (auto& byte : host[i]) byte = static_cast<uint8_t>(rng());
    KVPAGE_RETURN_IF_ERROR(dev[i].Upload(host[i]));
    dev_tensors[i] = SlotTensor{dev[i].get(), shapes[i][0], shapes[i][1], c.num_slots};
    host_tensors[i] = SlotTensor{host[i].data(), shapes[i][0], shapes[i][1], c.num_slots};
  }
  // Distinct sources from the first half, distinct destinations from the second; plus a -1
  // pair and a src == dst pair.
  std::vector<int32_t> perm(c.num_slots);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  const int32_t half = c.num_slots / 2;
  std::vector<int32_t> src, dst;
  for (int32_t i = 0; i < std::min(c.num_pairs, half); ++i) {
    src.push_back(perm[i]);
    dst.push_back(perm[half + i]);
  }
  src.push_back(-1);
  dst.push_back(perm[0]);
  src.push_back(perm[1]);
  dst.push_back(perm[1]);
  const int32_t n = static_cast<int32_t>(src.size());
  DeviceBuffer dsrc, ddst;
  KVPAGE_RETURN_IF_ERROR(dsrc.Upload(src));
  KVPAGE_RETURN_IF_ERROR(ddst.Upload(dst));

  // A second KV layer shaped like tensor 0: 16-token blocks of 8 heads x 128 bf16 = 64 KiB.
  std::vector<uint8_t> layer2(host[0].size());
  for (auto& byte : layer2) byte = static_cast<uint8_t>(rng());
  DeviceBuffer dlayer2;
  KVPAGE_RETURN_IF_ERROR(dlayer2.Upload(layer2));

  auto compare = [&](const char* what) -> absl::Status {
    for (int i = 0; i < 4; ++i) {
      std::vector<uint8_t> got;
      KVPAGE_RETURN_IF_ERROR(i < 3 ? dev[i].Download(&got) : dlayer2.Download(&got));
      const std::vector<uint8_t>& want = i < 3 ? host[i] : layer2;
      if (got != want) {
        size_t j = 0;
        while (got[j] == want[j]) ++j;
        return absl::InternalError(absl::StrFormat("%s %s: tensor %d differs at byte %d",
                                                   c.Name(), what, i, j));
      }
    }
    return absl::OkStatus();
  };

  KVPAGE_RETURN_IF_ERROR(CopySlots(dev_tensors, dsrc.as<int32_t>(), ddst.as<int32_t>(), n,
                                   nullptr));
  KVPAGE_RETURN_IF_ERROR(Sync("CopySlots"));
  KVPAGE_RETURN_IF_ERROR(ref::CopySlots(host_tensors, src.data(), dst.data(), n));
  KVPAGE_RETURN_IF_ERROR(compare("CopySlots"));

  // CopyBlocks over two layers in one launch, copying back the other way (dst -> src).
  const KvCacheView layers[] = {
      BlocksFirstKvCache(dev[0].get(), c.num_slots, 16, 8, 128, DType::kBF16),
      BlocksFirstKvCache(dlayer2.get(), c.num_slots, 16, 8, 128, DType::kBF16)};
  KVPAGE_RETURN_IF_ERROR(CopyBlocks(layers, ddst.as<int32_t>(), dsrc.as<int32_t>(), n, nullptr));
  KVPAGE_RETURN_IF_ERROR(Sync("CopyBlocks"));
  for (uint8_t* base : {host[0].data(), layer2.data()}) {
    SlotTensor t;
    KVPAGE_RETURN_IF_ERROR(KvBlockSlotTensor(
        BlocksFirstKvCache(base, c.num_slots, 16, 8, 128, DType::kBF16), &t));
    KVPAGE_RETURN_IF_ERROR(ref::CopySlots({&t, 1}, dst.data(), src.data(), n));
  }
  KVPAGE_RETURN_IF_ERROR(compare("CopyBlocks"));

  KVPAGE_RETURN_IF_ERROR(ZeroSlots(dev_tensors, ddst.as<int32_t>(), n, nullptr));
  KVPAGE_RETURN_IF_ERROR(Sync("ZeroSlots"));
  KVPAGE_RETURN_IF_ERROR(ref::ZeroSlots(host_tensors, dst.data(), n));
  return compare("ZeroSlots");
}

absl::Status CheckMerge(int32_t num_seqs, int32_t num_heads, int32_t num_splits,
                        int32_t head_dim, DType dtype, uint32_t seed) {
  KVPAGE_RETURN_IF_ERROR(RequireDevice());
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  const int64_t rows = static_cast<int64_t>(num_seqs) * num_heads;
  std::vector<float> o(rows * num_splits * head_dim), lse(rows * num_splits);
  for (auto& x : o) x = normal(rng);
  for (int64_t i = 0; i < static_cast<int64_t>(lse.size()); ++i) {
    // Every third split empty; the last row entirely empty.
    const bool empty = i % 3 == 1 || i / num_splits == rows - 1;
    lse[i] = empty ? -INFINITY : 4.0f * normal(rng);
  }
  DeviceBuffer d_o, d_lse, d_out, d_lse_out;
  KVPAGE_RETURN_IF_ERROR(d_o.Upload(o));
  KVPAGE_RETURN_IF_ERROR(d_lse.Upload(lse));
  KVPAGE_RETURN_IF_ERROR(d_out.Upload(std::vector<uint16_t>(rows * head_dim, kHalfNan)));
  KVPAGE_RETURN_IF_ERROR(d_lse_out.Allocate(rows * sizeof(float)));
  KVPAGE_RETURN_IF_ERROR(MergeAttnStates(d_out.get(), d_lse_out.as<float>(), d_o.as<float>(),
                                         d_lse.as<float>(), num_seqs, num_heads, num_splits,
                                         head_dim, dtype, nullptr));
  KVPAGE_RETURN_IF_ERROR(Sync("MergeAttnStates"));
  std::vector<uint16_t> got;
  std::vector<float> got_lse;
  KVPAGE_RETURN_IF_ERROR(d_out.Download(&got));
  KVPAGE_RETURN_IF_ERROR(d_lse_out.Download(&got_lse));
  std::vector<double> want(rows * head_dim), want_lse(rows);
  ref::MergeAttnStates(o.data(), lse.data(), num_seqs, num_heads, num_splits, head_dim,
                       want.data(), want_lse.data());
  const double tol = dtype == DType::kBF16 ? 1e-2 : 2e-3;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = ref::HalfToFloat(got[i], dtype);
    if (!(std::fabs(g - want[i]) <= tol + tol * std::fabs(want[i]))) {
      return absl::InternalError(
          absl::StrFormat("merge: element %d is %g, expected %g", i, g, want[i]));
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    const bool both_empty = std::isinf(want_lse[r]) && std::isinf(got_lse[r]) && got_lse[r] < 0;
    const double lse_tol = 1e-4 * (1 + std::fabs(want_lse[r]));
    if (!both_empty && !(std::fabs(got_lse[r] - want_lse[r]) <= lse_tol)) {
      return absl::InternalError(
          absl::StrFormat("merge: lse %d is %g, expected %g", r, got_lse[r], want_lse[r]));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckProgrammaticMerge(uint32_t seed, std::string* path) {
  KVPAGE_RETURN_IF_ERROR(RequireDevice());
  const internal::MergeLaunchPath chosen =
      internal::ChooseMergeLaunch(internal::CurrentDeviceCcMajor());
  if (path != nullptr) {
    *path = chosen == internal::MergeLaunchPath::kProgrammatic ? "programmatic" : "plain";
  }
  // dtype, seqs, kv heads, group, head_dim, block, max_len, window, splits
  DecodeCase cases[] = {
      {DType::kBF16, 6, 8, 4, 128, 16, 5000, -1, 7},
      {DType::kF16, 6, 8, 4, 128, 16, 5000, -1, 7},
      {DType::kBF16, 6, 1, 16, 576, 64, 5000, -1, 7},
      {DType::kF16, 6, 1, 64, 576, 64, 5000, -1, 7},
  };
  cases[0].cuda_cores = true;
  cases[1].tensor_cores = true;
  cases[2].mla = true;
  cases[2].cuda_cores = true;
  cases[3].mla = true;
  cases[3].tensor_cores = true;
  std::mt19937 seeds(seed);
  for (const DecodeCase& c : cases) {
    DecodeProblem p;
    KVPAGE_RETURN_IF_ERROR(MakeDecodeProblem(c, seeds(), 1, 1, &p));
    const int32_t hq = p.num_q_heads();
    DeviceBuffer dcache, dq, dtable, dlens, dout, dplain, dws;
    KVPAGE_RETURN_IF_ERROR(dcache.Upload(p.cache));
    KVPAGE_RETURN_IF_ERROR(dq.Upload(p.q));
    KVPAGE_RETURN_IF_ERROR(dtable.Upload(p.table));
    KVPAGE_RETURN_IF_ERROR(dlens.Upload(p.lens));
    const std::vector<uint16_t> poison(static_cast<size_t>(p.out_elements()), kHalfNan);
    KVPAGE_RETURN_IF_ERROR(dout.Upload(poison));
    KVPAGE_RETURN_IF_ERROR(dplain.Upload(poison));
    const int64_t ws_bytes = DecodeWorkspaceBytes(p.plan, c.num_seqs, hq, p.out_dim());
    KVPAGE_RETURN_IF_ERROR(dws.Allocate(static_cast<size_t>(ws_bytes)));
    const auto decode = c.mla ? PagedDecodeMla : PagedDecode;
    std::vector<uint16_t> first;
    for (int run = 0; run < 4; ++run) {
      // NaN partial states, ordered before the decode kernel by the stream.
      cudaError_t err = cudaMemsetAsync(dws.get(), 0xff, static_cast<size_t>(ws_bytes), nullptr);
      if (err != cudaSuccess) return internal::CudaStatus(err, "cudaMemsetAsync");
      KVPAGE_RETURN_IF_ERROR(decode(
          dout.get(), dq.get(), static_cast<int64_t>(hq) * c.head_dim, p.View(dcache.get()),
          BlockTableView{dtable.as<int32_t>(), p.max_blocks, dlens.as<int32_t>(), c.num_seqs},
          p.params, p.plan, dws.get(), ws_bytes, nullptr));
      KVPAGE_RETURN_IF_ERROR(Sync("PagedDecode (split-KV)"));
      std::vector<uint16_t> got;
      KVPAGE_RETURN_IF_ERROR(dout.Download(&got));
      KVPAGE_RETURN_IF_ERROR(CompareDecode(p, got, nullptr));
      if (run == 0) {
        first = got;
      } else if (got != first) {
        return absl::InternalError(
            absl::StrFormat("%s: run %d differs from the first run", c.Name(), run));
      }
    }
    // The last run's partial states, merged again after a full sync with a plain launch.
    const float* ws = dws.as<float>();
    const int64_t partial_rows = static_cast<int64_t>(c.num_seqs) * hq * p.plan.num_splits;
    KVPAGE_RETURN_IF_ERROR(internal::LaunchMergeAttnStates(
        dplain.get(), nullptr, ws, ws + partial_rows * p.out_dim(), c.num_seqs, hq,
        p.plan.num_splits, p.out_dim(), c.dtype, internal::MergeLaunchPath::kPlain, nullptr));
    KVPAGE_RETURN_IF_ERROR(Sync("MergeAttnStates (plain)"));
    std::vector<uint16_t> plain;
    KVPAGE_RETURN_IF_ERROR(dplain.Download(&plain));
    if (plain != first) {
      return absl::InternalError(absl::StrFormat(
          "%s: the plain merge of the same partial states differs", c.Name()));
    }
  }
  return absl::OkStatus();
}

namespace {

// Captures record() on `stream` into a graph and launches it `replays` times, synchronising
// after each.
absl::Status CaptureAndReplay(cudaStream_t stream, const std::function<absl::Status()>& record,
                              int replays) {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  cudaError_t err = cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
  if (err != cudaSuccess) return internal::CudaStatus(err, "cudaStreamBeginCapture");
  const absl::Status recorded = record();
  err = cudaStreamEndCapture(stream, &graph);
  absl::Status status = !recorded.ok()       ? recorded
                        : err != cudaSuccess ? internal::CudaStatus(err, "cudaStreamEndCapture")
                                             : absl::OkStatus();
  if (status.ok()) {
    err = cudaGraphInstantiate(&exec, graph, 0);
    if (err != cudaSuccess) status = internal::CudaStatus(err, "cudaGraphInstantiate");
  }
  for (int replay = 0; status.ok() && replay < replays; ++replay) {
    err = cudaGraphLaunch(exec, stream);
    if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
    if (err != cudaSuccess) status = internal::CudaStatus(err, "cudaGraphLaunch");
  }
  if (exec != nullptr) cudaGraphExecDestroy(exec);
  if (graph != nullptr) cudaGraphDestroy(graph);
  return status;
}

}  // namespace

absl::Status CheckMlaGraphCapture(uint32_t seed) {
  KVPAGE_RETURN_IF_ERROR(RequireDevice());
  DecodeCase c{DType::kBF16, 5, 1, 64, 576, 64, 700, -1, 3};
  c.mla = true;
  c.tensor_cores = true;
  DecodeProblem p;
  KVPAGE_RETURN_IF_ERROR(MakeDecodeProblem(c, seed, 1, 1, &p));
  const int32_t hq = p.num_q_heads();
  DeviceBuffer dcache, dq, dtable, dlens, eager, graphed, dws;
  KVPAGE_RETURN_IF_ERROR(dcache.Upload(p.cache));
  KVPAGE_RETURN_IF_ERROR(dq.Upload(p.q));
  KVPAGE_RETURN_IF_ERROR(dtable.Upload(p.table));
  KVPAGE_RETURN_IF_ERROR(dlens.Upload(p.lens));
  const std::vector<uint16_t> poison(static_cast<size_t>(p.out_elements()), kHalfNan);
  KVPAGE_RETURN_IF_ERROR(eager.Upload(poison));
  KVPAGE_RETURN_IF_ERROR(graphed.Upload(poison));
  const int64_t ws_bytes = DecodeWorkspaceBytes(p.plan, c.num_seqs, hq, p.out_dim());
  KVPAGE_RETURN_IF_ERROR(dws.Allocate(static_cast<size_t>(ws_bytes)));
  cudaStream_t stream = nullptr;
  cudaError_t err = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (err != cudaSuccess) return internal::CudaStatus(err, "cudaStreamCreate");
  auto decode = [&](void* out) {
    return PagedDecodeMla(
        out, dq.get(), static_cast<int64_t>(hq) * c.head_dim, p.View(dcache.get()),
        BlockTableView{dtable.as<int32_t>(), p.max_blocks, dlens.as<int32_t>(), c.num_seqs},
        p.params, p.plan, dws.get(), ws_bytes, stream);
  };
  absl::Status status = decode(eager.get());
  if (status.ok()) {
    err = cudaStreamSynchronize(stream);
    if (err != cudaSuccess) status = internal::CudaStatus(err, "eager MLA decode");
  }
  if (status.ok()) status = CaptureAndReplay(stream, [&] { return decode(graphed.get()); }, 2);
  cudaStreamDestroy(stream);
  KVPAGE_RETURN_IF_ERROR(status);
  std::vector<uint16_t> got_eager, got_graph;
  KVPAGE_RETURN_IF_ERROR(eager.Download(&got_eager));
  KVPAGE_RETURN_IF_ERROR(graphed.Download(&got_graph));
  if (got_eager != got_graph) {
    return absl::InternalError("MLA graph replay: output differs from the eager run");
  }
  return CompareDecode(p, got_graph, nullptr);
}

absl::Status CheckGraphCapture(uint32_t seed, int* programmatic_edges) {
  KVPAGE_RETURN_IF_ERROR(RequireDevice());
  // The plan and the graph are made for sequences of at most 200 tokens; the graph is replayed
  // after they grew to up to 600 (the last split runs to the end).
  DecodeProblem p;
  const DecodeCase c{DType::kBF16, 6, 2, 4, 128, 16, 600, -1, 3, /*plan_tokens=*/200};
  KVPAGE_RETURN_IF_ERROR(MakeDecodeProblem(c, seed, 1, 1, &p));
  std::vector<int32_t> short_lens = p.lens;
  for (int32_t& len : short_lens) len = std::min(len, c.plan_tokens);
  const int32_t hq = p.num_q_heads();
  DeviceBuffer dcache, dq, dtable, dlens, eager, graphed, dws;
  KVPAGE_RETURN_IF_ERROR(dcache.Upload(p.cache));
  KVPAGE_RETURN_IF_ERROR(dq.Upload(p.q));
  KVPAGE_RETURN_IF_ERROR(dtable.Upload(p.table));
  KVPAGE_RETURN_IF_ERROR(dlens.Upload(p.lens));
  const std::vector<uint16_t> poison(static_cast<size_t>(p.out_elements()), kHalfNan);
  KVPAGE_RETURN_IF_ERROR(eager.Upload(poison));
  KVPAGE_RETURN_IF_ERROR(graphed.Upload(poison));
  const int64_t ws_bytes = DecodeWorkspaceBytes(p.plan, c.num_seqs, hq, c.head_dim);
  KVPAGE_RETURN_IF_ERROR(dws.Allocate(static_cast<size_t>(ws_bytes)));
  // Scratch for the other launchers: a one-block KV cache written from q's first rows, and a
  // 4-slot state tensor.
  DeviceBuffer scratch_cache, slots, state, ids;
  KVPAGE_RETURN_IF_ERROR(scratch_cache.Allocate(2 * 2 * 16 * 2 * 128 * 2));  // 2 blocks
  KVPAGE_RETURN_IF_ERROR(slots.Upload(std::vector<int64_t>{0, 5, -1}));
  KVPAGE_RETURN_IF_ERROR(state.Allocate(4 * 4096));
  KVPAGE_RETURN_IF_ERROR(ids.Upload(std::vector<int32_t>{0, 1, 2, 3}));
  const KvCacheView scratch_view =
      BlocksFirstKvCache(scratch_cache.get(), 2, 16, 2, 128, DType::kBF16);
  const SlotTensor state_tensor{state.get(), 4096, 4096, 4};

  cudaStream_t stream = nullptr;
  cudaError_t err = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (err != cudaSuccess) return internal::CudaStatus(err, "cudaStreamCreate");
  auto decode = [&](void* out) {
    return PagedDecode(
        out, dq.get(), static_cast<int64_t>(hq) * c.head_dim, p.View(dcache.get()),
        BlockTableView{dtable.as<int32_t>(), p.max_blocks, dlens.as<int32_t>(), c.num_seqs},
        p.params, p.plan, dws.get(), ws_bytes, stream);
  };
  auto record = [&]() -> absl::Status {
    KVPAGE_RETURN_IF_ERROR(WriteKv(dq.get(), dq.get(), 256, 256, slots.as<int64_t>(), 3,
                                   scratch_view, stream));
    KVPAGE_RETURN_IF_ERROR(decode(graphed.get()));
    KVPAGE_RETURN_IF_ERROR(CopySlots({&state_tensor, 1}, ids.as<int32_t>(),
                                     ids.as<int32_t>() + 2, 2, stream));
    return ZeroSlots({&state_tensor, 1}, ids.as<int32_t>(), 1, stream);
  };
  absl::Status status = decode(eager.get());
  if (status.ok()) {
    err = cudaStreamSynchronize(stream);
    if (err != cudaSuccess) status = internal::CudaStatus(err, "eager decode");
  }
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  if (status.ok()) status = dlens.CopyIn(short_lens);
  if (status.ok()) {
    err = cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
    if (err != cudaSuccess) status = internal::CudaStatus(err, "cudaStreamBeginCapture");
  }
  if (status.ok()) {
    const absl::Status recorded = record();
    err = cudaStreamEndCapture(stream, &graph);
    status = !recorded.ok()          ? recorded
             : err != cudaSuccess    ? internal::CudaStatus(err, "cudaStreamEndCapture")
                                     : absl::OkStatus();
  }
  if (status.ok() && programmatic_edges != nullptr) {
    size_t n = 0;
    err = cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &n);
    std::vector<cudaGraphNode_t> from(n), to(n);
    std::vector<cudaGraphEdgeData> data(n);
    if (err == cudaSuccess && n > 0) {
      err = cudaGraphGetEdges(graph, from.data(), to.data(), data.data(), &n);
    }
    if (err != cudaSuccess) status = internal::CudaStatus(err, "cudaGraphGetEdges");
    *programmatic_edges = static_cast<int>(std::count_if(
        data.begin(), data.end(),
        [](const cudaGraphEdgeData& e) { return e.type == cudaGraphDependencyTypeProgrammatic; }));
  }
  if (status.ok()) {
    err = cudaGraphInstantiate(&exec, graph, 0);
    if (err != cudaSuccess) status = internal::CudaStatus(err, "cudaGraphInstantiate");
  }
  for (int replay = 0; status.ok() && replay < 3; ++replay) {
    if (replay == 1) status = dlens.CopyIn(p.lens);  // the sequences grew
    if (!status.ok()) break;
    err = cudaGraphLaunch(exec, stream);
    if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
    if (err != cudaSuccess) status = internal::CudaStatus(err, "cudaGraphLaunch");
  }
  if (exec != nullptr) cudaGraphExecDestroy(exec);
  if (graph != nullptr) cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  KVPAGE_RETURN_IF_ERROR(status);

  std::vector<uint16_t> got_eager, got_graph;
  KVPAGE_RETURN_IF_ERROR(eager.Download(&got_eager));
  KVPAGE_RETURN_IF_ERROR(graphed.Download(&got_graph));
  if (got_eager != got_graph) {
    return absl::InternalError("graph replay: decode output differs from the eager run");
  }
  return CompareDecode(p, got_graph, nullptr);
}

}  // namespace kvpage::cuda::check
