// kvpage_gpu_check: one run on a GPU machine that
//   1. checks every kernel against the CPU reference on fresh random inputs,
//   2. measures the device-to-device copy ceiling (cudaMemcpyAsync, read + write bytes),
//   3. times each kernel with CUDA events (median of repeats, L2 flushed by a 256 MiB memset
//      outside the timed region, working sets of hundreds of MiB, far above L2),
// and prints a table of GB/s and percent of the copy ceiling, then the prefill sweep's
// TFLOP/s (prefill_sweep.h; both also written as CSV with --csv).
//
// Usage: kvpage_gpu_check [--quick] [--probe] [--allow-no-gpu] [--csv PATH] [--seed N]
//   --quick         correctness on the small cases only (for compute-sanitizer runs)
//   --probe         only the first step below: is there a GPU to check?
//   --allow-no-gpu  a dry run: no usable GPU exits 0 with "SKIP" instead of failing
//
// Exit status: 0 when every check passed; 1 when one failed; 2 for bad flags; 3 when there is
// no usable GPU (no driver, a driver older than the CUDA runtime, no device) or a check found
// none, with one line saying which (gpu_probe.h). A check cannot pass by being skipped.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "kernels/check/bandwidth_targets.h"
#include "kernels/check/check_cases.h"
#include "kernels/check/device_buffer.h"
#include "kernels/check/gpu_probe.h"
#include "kernels/check/kernel_checks.h"
#include "kernels/check/prefill_sweep.h"
#include "kvpage/cuda/copy_slots.h"
#include "kvpage/cuda/paged_decode.h"
#include "kvpage/cuda/paged_prefill.h"
#include "kvpage/cuda/write_kv.h"
#include "kvpage/kernel_layout.h"
#include "src/internal/status_macros.h"

namespace kvpage::cuda::check {
namespace {

constexpr int kRepeats = 25;
constexpr size_t kFlushBytes = size_t{256} << 20;

struct Timing {
  double median_us = 0, min_us = 0, max_us = 0;
};

struct Row {
  std::string kernel, config;
  double bytes = 0;
  Timing t;
  int32_t batch = 0, context = 0;  // decode rows: for the target (bandwidth_targets.h)
  double flops = 0;                 // prefill rows: causal attention FLOPs
};

class Bench {
 public:
  absl::Status Init() {
    KVPAGE_RETURN_IF_ERROR(flush_.Allocate(kFlushBytes));
    if (cudaEventCreate(&start_) != cudaSuccess || cudaEventCreate(&stop_) != cudaSuccess) {
      return absl::InternalError("cudaEventCreate");
    }
    return absl::OkStatus();
  }

  // Median/min/max of kRepeats timed launches after 3 warm-ups; L2 flushed before each.
  absl::StatusOr<Timing> Time(const std::function<absl::Status()>& launch) {
    for (int i = 0; i < 3; ++i) KVPAGE_RETURN_IF_ERROR(launch());
    std::vector<double> us;
    for (int r = 0; r < kRepeats; ++r) {
      cudaMemsetAsync(flush_.get(), r & 0xff, kFlushBytes, nullptr);
      cudaEventRecord(start_, nullptr);
      KVPAGE_RETURN_IF_ERROR(launch());
      cudaEventRecord(stop_, nullptr);
      const cudaError_t err = cudaEventSynchronize(stop_);
      if (err != cudaSuccess) return internal::CudaStatus(err, "timed launch");
      float ms = 0;
      cudaEventElapsedTime(&ms, start_, stop_);
      us.push_back(ms * 1e3);
    }
    std::sort(us.begin(), us.end());
    return Timing{us[us.size() / 2], us.front(), us.back()};
  }

 private:
  DeviceBuffer flush_;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

constexpr int kExitNoGpu = 3;

// The driver, runtime and devices as the CUDA runtime reports them.
GpuProbe ProbeGpu() {
  GpuProbe probe;
  if (cudaDriverGetVersion(&probe.driver_version) != cudaSuccess) probe.driver_version = 0;
  if (cudaRuntimeGetVersion(&probe.runtime_version) != cudaSuccess) probe.runtime_version = 0;
  const cudaError_t err = cudaGetDeviceCount(&probe.device_count);
  probe.count_error = static_cast<int>(err);
  probe.count_error_name = cudaGetErrorName(err);
  if (err != cudaSuccess) probe.device_count = 0;
  return probe;
}

struct CheckCounts {
  int failures = 0;
  int skipped = 0;  // checks that found no device (Unavailable): never a pass
};

// Whether --quick keeps `c`, which follows `prev` among the CUDA-core-only and MLA cases: the
// first fp8 case, the first MLA case on each kernel and the head_dim 96 ones.
bool FirstOfKind(const DecodeCase& c, const DecodeCase& prev) {
  return (c.fp8_kv && !prev.fp8_kv) || (c.mla && !prev.mla) ||
         (c.mla && c.tensor_cores && !prev.tensor_cores) ||
         (!c.fp8_kv && !c.mla && c.head_dim == 96);
}

CheckCounts Correctness(bool quick, uint32_t seed) {
  CheckCounts counts;
  auto report = [&](const std::string& name, const absl::Status& s) {
    const char* verdict = s.ok() ? "PASS" : absl::IsUnavailable(s) ? "SKIP" : "FAIL";
    std::printf("%-4s %s%s%s\n", verdict, name.c_str(), s.ok() ? "" : ": ",
                s.ok() ? "" : std::string(s.message()).c_str());
    counts.failures += s.ok() || absl::IsUnavailable(s) ? 0 : 1;
    counts.skipped += absl::IsUnavailable(s) ? 1 : 0;
  };
  std::mt19937 seeds(seed);
  auto write_cases = WriteKvCases();
  auto decode_cases = DecodeCases();
  if (quick) {
    write_cases.resize(2);
    // The base cases, then the same on tensor cores (from n), then the CUDA-core-only ones.
    size_t n = 0;
    while (!decode_cases[n].tensor_cores) ++n;
    std::vector<DecodeCase> quick_cases = {
        decode_cases[0],     decode_cases[2],     decode_cases[8],     decode_cases[11],
        decode_cases[n],     decode_cases[n + 2], decode_cases[n + 8], decode_cases[n + 11]};
    // The first fp8 case, the first MLA case on each kernel and the head_dim 96 ones.
    for (size_t i = 2 * n; i < decode_cases.size(); ++i) {
      const DecodeCase& c = decode_cases[i];
      if (FirstOfKind(c, decode_cases[i - 1])) quick_cases.push_back(c);
    }
    decode_cases = quick_cases;
    for (auto& c : decode_cases) c.max_len = std::min(c.max_len, 600);
  }
  for (const auto& c : write_cases) report(c.Name(), CheckWriteKv(c, seeds()));
  for (const auto& c : decode_cases) {
    double err = 0;
    const absl::Status s = CheckPagedDecode(c, seeds(), &err);
    report(absl::StrFormat("%s (max abs err %.2e)", c.Name(), err), s);
  }
  for (const auto& c : PrefillCases()) report(c.Name(), CheckPagedPrefill(c, seeds()));
  report("merge bf16", CheckMerge(3, 4, 5, 128, DType::kBF16, seeds()));
  report("merge f16", CheckMerge(2, 3, 1, 64, DType::kF16, seeds()));
  for (const auto& c : CopyCases()) report(c.Name(), CheckCopies(c, seeds()));
  std::string merge_path = "?";
  const absl::Status pdl = CheckProgrammaticMerge(seeds(), &merge_path);
  report("split-KV merge, " + merge_path + " launch, NaN-poisoned partials", pdl);
  int edges = -1;
  const absl::Status graph = CheckGraphCapture(seeds(), &edges);
  report(absl::StrFormat("CUDA graph capture and replay (%d programmatic edges)", edges), graph);
  report("CUDA graph capture and replay of the tensor-core MLA decode",
         CheckMlaGraphCapture(seeds()));
  return counts;
}

absl::StatusOr<Row> BenchCopyCeiling(Bench& bench) {
  const size_t bytes = size_t{2} << 30;
  DeviceBuffer a, b;
  KVPAGE_RETURN_IF_ERROR(a.Allocate(bytes));
  KVPAGE_RETURN_IF_ERROR(b.Allocate(bytes));
  KVPAGE_ASSIGN_OR_RETURN(Timing t, bench.Time([&] {
    const cudaError_t err =
        cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice, nullptr);
    return err == cudaSuccess ? absl::OkStatus() : internal::CudaStatus(err, "memcpy");
  }));
  return Row{"memcpy D2D", "2 GiB", 2.0 * bytes, t};
}

absl::StatusOr<Row> BenchWriteKv(Bench& bench, std::mt19937& rng, bool fp8) {
  const int32_t tokens = 131072, heads = 8, d = 128, bs = 16;
  const int64_t row = int64_t{heads} * d;
  const int32_t blocks = tokens / bs;
  const int64_t cache_value_bytes = fp8 ? 1 : 2;
  std::vector<int64_t> slots(tokens);
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), rng);
  DeviceBuffer k, v, cache, dslots;
  KVPAGE_RETURN_IF_ERROR(k.Allocate(tokens * row * 2));
  KVPAGE_RETURN_IF_ERROR(v.Allocate(tokens * row * 2));
  cudaMemset(k.get(), 0x3c, k.bytes());
  cudaMemset(v.get(), 0x3c, v.bytes());
  KVPAGE_RETURN_IF_ERROR(cache.Allocate(int64_t{blocks} * 2 * bs * row * cache_value_bytes));
  KVPAGE_RETURN_IF_ERROR(dslots.Upload(slots));
  const KvCacheView view = BlocksFirstKvCache(cache.get(), blocks, bs, heads, d,
                                              fp8 ? DType::kFP8 : DType::kBF16);
  KVPAGE_ASSIGN_OR_RETURN(Timing t, bench.Time([&] {
    return fp8 ? WriteKvFp8(k.get(), v.get(), row, row, dslots.as<int64_t>(), tokens,
                            DType::kBF16, 0.05f, 0.05f, view, nullptr)
               : WriteKv(k.get(), v.get(), row, row, dslots.as<int64_t>(), tokens, view,
                         nullptr);
  }));
  const double bytes = 2.0 * tokens * row * (2 + cache_value_bytes) + 8.0 * tokens;
  return Row{fp8 ? "write_kv_fp8" : "write_kv",
             fp8 ? "bf16->e4m3 T=131072 H=8 D=128 bs=16, random slots"
                 : "bf16 T=131072 H=8 D=128 bs=16, random slots",
             bytes, t};
}

absl::StatusOr<Row> BenchCopyBlocks(Bench& bench, std::mt19937& rng) {
  const int32_t layers = 4, blocks = 8192, pairs = 2048;
  std::vector<DeviceBuffer> caches(layers);
  std::vector<KvCacheView> views;
  for (auto& c : caches) {
    KVPAGE_RETURN_IF_ERROR(c.Allocate(int64_t{blocks} * 65536));
    views.push_back(BlocksFirstKvCache(c.get(), blocks, 16, 8, 128, DType::kBF16));
  }
  std::vector<int32_t> perm(blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int32_t> src(perm.begin(), perm.begin() + pairs);
  std::vector<int32_t> dst(perm.begin() + blocks / 2, perm.begin() + blocks / 2 + pairs);
  DeviceBuffer dsrc, ddst;
  KVPAGE_RETURN_IF_ERROR(dsrc.Upload(src));
  KVPAGE_RETURN_IF_ERROR(ddst.Upload(dst));
  KVPAGE_ASSIGN_OR_RETURN(Timing t, bench.Time([&] {
    return CopyBlocks(views, dsrc.as<int32_t>(), ddst.as<int32_t>(), pairs, nullptr);
  }));
  return Row{"copy_blocks", "4 layers x 2048 pairs of 64 KiB blocks", 2.0 * layers * pairs * 65536,
             t};
}

absl::StatusOr<Row> BenchStateSlots(Bench& bench, bool zero) {
  const int32_t layers = 8, slots = 64, pairs = 32;
  const int64_t slot_bytes = int64_t{2} << 20;  // a GDN recurrent state: 32x128x128 fp32
  std::vector<DeviceBuffer> pools(layers);
  std::vector<SlotTensor> tensors;
  for (auto& p : pools) {
    KVPAGE_RETURN_IF_ERROR(p.Allocate(slots * slot_bytes));
    tensors.push_back(SlotTensor{p.get(), slot_bytes, slot_bytes, slots});
  }
  std::vector<int32_t> src(pairs), dst(pairs);
  std::iota(src.begin(), src.end(), 0);
  std::iota(dst.begin(), dst.end(), slots / 2);
  DeviceBuffer dsrc, ddst;
  KVPAGE_RETURN_IF_ERROR(dsrc.Upload(src));
  KVPAGE_RETURN_IF_ERROR(ddst.Upload(dst));
  KVPAGE_ASSIGN_OR_RETURN(Timing t, bench.Time([&] {
    return zero ? ZeroSlots(tensors, ddst.as<int32_t>(), pairs, nullptr)
                : CopySlots(tensors, dsrc.as<int32_t>(), ddst.as<int32_t>(), pairs, nullptr);
  }));
  const double moved = double{layers} * pairs * slot_bytes;
  return Row{zero ? "zero_slots" : "copy_slots", "8 layers x 32 slots of 2 MiB state",
             zero ? moved : 2.0 * moved, t};
}

struct DecodeBenchCase {
  int32_t seqs, len, kv_heads, group, head_dim, block_size;
  bool tensor_cores = false;
};

absl::StatusOr<Row> BenchDecode(Bench& bench, const DecodeBenchCase& c, std::mt19937& rng) {
  const int32_t blocks_per_seq = (c.len + c.block_size - 1) / c.block_size;
  const int32_t blocks = c.seqs * blocks_per_seq;
  const int32_t hq = c.kv_heads * c.group;
  const int64_t row = int64_t{c.kv_heads} * c.head_dim;
  std::vector<int32_t> table(blocks);
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), rng);  // never reused across sequences
  std::vector<int32_t> lens(c.seqs, c.len);
  DeviceBuffer cache, q, out, dtable, dlens, ws;
  const int64_t cache_bytes = int64_t{blocks} * 2 * c.block_size * row * 2;
  KVPAGE_RETURN_IF_ERROR(cache.Allocate(cache_bytes));
  cudaMemset(cache.get(), 0x3c, cache_bytes);  // small finite bf16 values
  KVPAGE_RETURN_IF_ERROR(q.Allocate(int64_t{c.seqs} * hq * c.head_dim * 2));
  cudaMemset(q.get(), 0x3c, q.bytes());
  KVPAGE_RETURN_IF_ERROR(out.Allocate(q.bytes()));
  KVPAGE_RETURN_IF_ERROR(dtable.Upload(table));
  KVPAGE_RETURN_IF_ERROR(dlens.Upload(lens));
  DecodePlanInputs in;
  in.num_seqs = c.seqs;
  in.num_kv_heads = c.kv_heads;
  in.head_tiles = DecodeHeadTiles(c.group);
  in.max_attended_tokens = c.len;
  in.block_size = c.block_size;
  in.tensor_cores = c.tensor_cores;
  in.force_cuda_cores = !c.tensor_cores;  // rows without "mma" stay on CUDA cores
  DecodePlan plan;
  KVPAGE_RETURN_IF_ERROR(PlanDecodeForDevice(in, DType::kBF16, c.head_dim, c.group, &plan));
  const int64_t ws_bytes = DecodeWorkspaceBytes(plan, c.seqs, hq, c.head_dim);
  KVPAGE_RETURN_IF_ERROR(ws.Allocate(ws_bytes));
  const KvCacheView view =
      BlocksFirstKvCache(cache.get(), blocks, c.block_size, c.kv_heads, c.head_dim, DType::kBF16);
  const DecodeParams params{hq, 1.0f / std::sqrt(static_cast<float>(c.head_dim)), -1};
  KVPAGE_ASSIGN_OR_RETURN(Timing t, bench.Time([&] {
    return PagedDecode(out.get(), q.get(), int64_t{hq} * c.head_dim, view,
                       {dtable.as<int32_t>(), blocks_per_seq, dlens.as<int32_t>(), c.seqs},
                       params, plan, ws.get(), ws_bytes, nullptr);
  }));
  // Bytes the kernel must move: K and V of every token, q in, out, the table.
  const double bytes = 2.0 * c.seqs * c.len * row * 2 + 2.0 * q.bytes() + 4.0 * blocks;
  return Row{"paged_decode",
             absl::StrFormat("bf16 B=%d ctx=%d Hkv=%d G=%d D=%d bs=%d splits=%d%s", c.seqs,
                             c.len, c.kv_heads, c.group, c.head_dim, c.block_size,
                             plan.num_splits, c.tensor_cores ? " mma" : ""),
             bytes, t, c.seqs, c.len};
}

struct MlaBenchCase {
  int32_t seqs, len, heads;
  bool tensor_cores;
};

// PagedDecodeMla on bf16 latent rows (blocks of 64, DeepSeek's), each path forced.
absl::StatusOr<Row> BenchDecodeMla(Bench& bench, const MlaBenchCase& c, std::mt19937& rng) {
  constexpr int32_t kRow = 576, kLatent = 512, kBs = 64;
  const int32_t blocks_per_seq = (c.len + kBs - 1) / kBs;
  const int32_t blocks = c.seqs * blocks_per_seq;
  std::vector<int32_t> table(blocks);
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), rng);
  std::vector<int32_t> lens(c.seqs, c.len);
  DeviceBuffer cache, q, out, dtable, dlens, ws;
  const int64_t cache_bytes = int64_t{blocks} * kBs * kRow * 2;
  KVPAGE_RETURN_IF_ERROR(cache.Allocate(cache_bytes));
  cudaMemset(cache.get(), 0x3c, cache_bytes);  // small finite bf16 values
  KVPAGE_RETURN_IF_ERROR(q.Allocate(int64_t{c.seqs} * c.heads * kRow * 2));
  cudaMemset(q.get(), 0x3c, q.bytes());
  KVPAGE_RETURN_IF_ERROR(out.Allocate(int64_t{c.seqs} * c.heads * kLatent * 2));
  KVPAGE_RETURN_IF_ERROR(dtable.Upload(table));
  KVPAGE_RETURN_IF_ERROR(dlens.Upload(lens));
  int device = 0, sms = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  DecodePlanInputs in;
  in.num_seqs = c.seqs;
  in.num_kv_heads = 1;
  in.head_tiles = MlaDecodeHeadTiles(c.heads, c.tensor_cores);
  in.max_attended_tokens = c.len;
  in.block_size = kBs;
  in.num_sms = sms;
  KVPAGE_ASSIGN_OR_RETURN(in.ctas_per_sm,
                          MlaDecodeCtasPerSm(DType::kBF16, c.heads, c.tensor_cores));
  in.tensor_cores = c.tensor_cores;
  DecodePlan plan;
  KVPAGE_RETURN_IF_ERROR(PlanDecode(in, &plan));
  plan.force_cuda_cores = !c.tensor_cores;
  const int64_t ws_bytes = DecodeWorkspaceBytes(plan, c.seqs, c.heads, kLatent);
  KVPAGE_RETURN_IF_ERROR(ws.Allocate(ws_bytes));
  const KvCacheView view = MlaKvCache(cache.get(), blocks, kBs, kRow, DType::kBF16);
  const DecodeParams params{c.heads, 1.0f / std::sqrt(192.0f), -1};
  KVPAGE_ASSIGN_OR_RETURN(Timing t, bench.Time([&] {
    return PagedDecodeMla(out.get(), q.get(), int64_t{c.heads} * kRow, view,
                          {dtable.as<int32_t>(), blocks_per_seq, dlens.as<int32_t>(), c.seqs},
                          params, plan, ws.get(), ws_bytes, nullptr);
  }));
  // Bytes the kernel must move: every token's latent row once, q in, out, the table.
  const double bytes =
      double{kRow} * 2 * c.seqs * c.len + double(q.bytes()) + double(out.bytes()) + 4.0 * blocks;
  return Row{"paged_decode_mla",
             absl::StrFormat("bf16 B=%d ctx=%d H=%d bs=%d splits=%d %s", c.seqs, c.len,
                             c.heads, kBs, plan.num_splits, c.tensor_cores ? "mma" : "cuda"),
             bytes, t, c.seqs, c.len};
}

// PagedPrefill on a prefill sweep row: the tiled tensor-core path, one split (no planner picks
// prefill splits), every sequence a chunk over its cached prefix.
absl::StatusOr<Row> BenchPrefill(Bench& bench, const PrefillSweepCase& c, std::mt19937& rng) {
  const PrefillBatch b = MakePrefillBatch(
      std::vector<PrefillChunk>(c.seqs, {c.prefix, c.chunk}), kPrefillSweepBlockSize, rng);
  const int32_t hq = c.num_q_heads(), d = kPrefillSweepHeadDim;
  DeviceBuffer cache, q, out, dtable, dlens, dqsl, ws;
  const int64_t cache_bytes =
      int64_t{b.num_blocks} * 2 * kPrefillSweepBlockSize * kPrefillSweepKvHeads * d * 2;
  KVPAGE_RETURN_IF_ERROR(cache.Allocate(cache_bytes));
  cudaMemset(cache.get(), 0x3c, cache_bytes);  // small finite bf16 values
  KVPAGE_RETURN_IF_ERROR(q.Allocate(int64_t{b.total_tokens()} * hq * d * 2));
  cudaMemset(q.get(), 0x3c, q.bytes());
  KVPAGE_RETURN_IF_ERROR(out.Allocate(q.bytes()));
  KVPAGE_RETURN_IF_ERROR(dtable.Upload(b.table));
  KVPAGE_RETURN_IF_ERROR(dlens.Upload(b.seq_lens));
  KVPAGE_RETURN_IF_ERROR(dqsl.Upload(b.query_start_loc));
  DecodePlan plan;
  plan.use_tensor_cores = true;
  const int64_t ws_bytes = PrefillWorkspaceBytes(plan, b.total_tokens(), hq, d);
  KVPAGE_RETURN_IF_ERROR(ws.Allocate(ws_bytes));
  const KvCacheView view = BlocksFirstKvCache(cache.get(), b.num_blocks, kPrefillSweepBlockSize,
                                              kPrefillSweepKvHeads, d, DType::kBF16);
  const DecodeParams params{hq, 1.0f / std::sqrt(static_cast<float>(d)), -1};
  KVPAGE_ASSIGN_OR_RETURN(Timing t, bench.Time([&] {
    const BlockTableView table{dtable.as<int32_t>(), b.max_blocks, dlens.as<int32_t>(),
                               b.num_seqs()};
    return PagedPrefill(out.get(), q.get(), int64_t{hq} * d, dqsl.as<int32_t>(), b.total_tokens(),
                        view, table, params, plan, ws.get(), ws_bytes, nullptr);
  }));
  Row row{"paged_prefill", PrefillSweepConfig(c), PrefillSweepBytes(c), t};
  row.flops = PrefillSweepFlops(c);
  return row;
}

// MLA: batch 8/64/128 x context 4K x 16/64/128 heads, each on both kernels.
void AddMlaBenchRows(Bench& bench, std::mt19937& rng, std::vector<absl::StatusOr<Row>>& rows) {
  for (int32_t batch : {8, 64, 128}) {
    for (int32_t heads : {16, 64, 128}) {
      for (bool tensor_cores : {false, true}) {
        rows.push_back(BenchDecodeMla(bench, {batch, 4096, heads, tensor_cores}, rng));
      }
    }
  }
}

struct Flags {
  bool quick = false, probe_only = false, allow_no_gpu = false;
  std::string csv;
  uint32_t seed = std::random_device{}();
};

// False, after printing the usage, on a flag it does not know.
bool ParseFlags(int argc, char** argv, Flags& f) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      f.quick = true;
    } else if (std::strcmp(argv[i], "--probe") == 0) {
      f.probe_only = true;
    } else if (std::strcmp(argv[i], "--allow-no-gpu") == 0) {
      f.allow_no_gpu = true;
    } else if (std::strcmp(argv[i], "--csv") == 0 && i + 1 < argc) {
      f.csv = argv[++i];
    } else if (std::strcmp(argv[i], "--seed") == 0 && i + 1 < argc) {
      f.seed = static_cast<uint32_t>(std::stoul(argv[++i]));
    } else {
      std::fprintf(stderr,
                   "usage: %s [--quick] [--probe] [--allow-no-gpu] [--csv PATH] [--seed N]\n",
                   argv[0]);
      return false;
    }
  }
  return true;
}

// Prints the device, or the one line saying why there is none to check. Returns true to go
// on; otherwise `exit_status` is set (kExitNoGpu, or 0 for --allow-no-gpu and --probe).
bool ReportDevice(const Flags& f, int& exit_status) {
  const GpuProbe probe = ProbeGpu();
  if (const absl::Status usable = CheckUsableGpu(probe); !usable.ok()) {
    const std::string why(usable.message());
    std::printf(f.allow_no_gpu ? "SKIP: %s (--allow-no-gpu)\n" : "FAIL: %s\n", why.c_str());
    exit_status = f.allow_no_gpu ? 0 : kExitNoGpu;
    return false;
  }
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, 0);
  std::printf("device: %s, %d SMs, L2 %d MiB, %.1f GiB; driver CUDA %s, runtime CUDA %s; seed %u\n",
              prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20,
              prop.totalGlobalMem / double(1 << 30),
              CudaVersionName(probe.driver_version).c_str(),
              CudaVersionName(probe.runtime_version).c_str(), f.seed);
  exit_status = 0;
  return !f.probe_only;
}

// The decode sweep: batch 1/8/64/256 x context 1K/4K/32K x GQA 1/4/8 (bf16, 8 KV heads, D 128,
// block 16; the largest moves 34 GB of K/V), GQA 4/8 also on tensor cores ("mma"), then block
// 64 and D 256 at the target shape on both kernels.
std::vector<DecodeBenchCase> DecodeBenchCases() {
  std::vector<DecodeBenchCase> cases;
  for (int32_t batch : {1, 8, 64, 256}) {
    for (int32_t context : {1024, 4096, 32768}) {
      for (int32_t group : {1, 4, 8}) cases.push_back({batch, context, 8, group, 128, 16});
      for (int32_t group : {4, 8}) {
        cases.push_back({batch, context, 8, group, 128, 16, /*tensor_cores=*/true});
      }
    }
  }
  cases.push_back({64, 4096, 8, 4, 128, 64});
  cases.push_back({64, 4096, 2, 8, 256, 16});
  cases.push_back({64, 4096, 8, 4, 128, 64, true});
  cases.push_back({64, 4096, 2, 8, 256, 16, true});
  return cases;
}

// Every timed row; the copy ceiling first.
std::vector<absl::StatusOr<Row>> RunBenches(Bench& bench, std::mt19937& rng) {
  std::vector<absl::StatusOr<Row>> rows;
  rows.push_back(BenchCopyCeiling(bench));
  rows.push_back(BenchWriteKv(bench, rng, false));
  rows.push_back(BenchWriteKv(bench, rng, true));
  rows.push_back(BenchCopyBlocks(bench, rng));
  rows.push_back(BenchStateSlots(bench, false));
  rows.push_back(BenchStateSlots(bench, true));
  for (const auto& c : DecodeBenchCases()) rows.push_back(BenchDecode(bench, c, rng));
  AddMlaBenchRows(bench, rng, rows);
  for (const auto& c : PrefillSweepCases()) rows.push_back(BenchPrefill(bench, c, rng));
  return rows;
}

struct Tally {
  int failures = 0, below_target = 0;
};

// The CSV line of a row (every column; target 0 where none, tflops 0 for a copy or decode).
void WriteCsvRow(FILE* out, const Row& r, double gbps, double pct, double target) {
  if (out == nullptr) return;
  std::fprintf(out, "%s,\"%s\",%.0f,%.2f,%.2f,%.2f,%.1f,%.1f,%.0f,%.1f\n", r.kernel.c_str(),
               r.config.c_str(), r.bytes, r.t.median_us, r.t.min_us, r.t.max_us, gbps, pct,
               target, r.flops / (r.t.median_us * 1e6));
}

// The bandwidth table: rows without FLOPs, in GB/s and percent of the copy ceiling.
void PrintBandwidthRows(const std::vector<absl::StatusOr<Row>>& rows, double ceiling, FILE* out,
                        Tally& tally) {
  std::printf("\n%-16s %-52s %9s %10s %10s %10s %8s %7s %7s\n", "kernel", "config", "MB",
              "median_us", "min_us", "max_us", "GB/s", "%copy", "target");
  for (const auto& r : rows) {
    if (!r.ok()) {
      std::printf("FAIL %s\n", std::string(r.status().message()).c_str());
      ++tally.failures;
      continue;
    }
    if (r->flops > 0) continue;
    const double gbps = r->bytes / (r->t.median_us * 1e3);
    const double pct = ceiling > 0 ? 100.0 * gbps / ceiling : 0;
    const double target = TargetPercent(r->kernel, r->batch, r->context);
    const bool meets = MeetsTarget(r->kernel, r->batch, r->context, pct);
    tally.below_target += meets ? 0 : 1;
    std::printf("%-16s %-52s %9.1f %10.1f %10.1f %10.1f %8.0f %6.1f%% %s\n", r->kernel.c_str(),
                r->config.c_str(), r->bytes / 1e6, r->t.median_us, r->t.min_us, r->t.max_us,
                gbps, pct,
                target == 0 ? "-" : absl::StrFormat("%s%.0f%%", meets ? ">=" : "BELOW ", target)
                                        .c_str());
    WriteCsvRow(out, *r, gbps, pct, target);
  }
}

// The prefill table: TFLOP/s (causal FLOPs / median time) and the GB/s of its least traffic.
void PrintPrefillRows(const std::vector<absl::StatusOr<Row>>& rows, double ceiling, FILE* out) {
  std::printf("\n%-16s %-52s %9s %10s %10s %10s %8s %8s\n", "kernel", "config", "GFLOP",
              "median_us", "min_us", "max_us", "TFLOP/s", "GB/s");
  for (const auto& r : rows) {
    if (!r.ok() || r->flops == 0) continue;
    const double gbps = r->bytes / (r->t.median_us * 1e3);
    std::printf("%-16s %-52s %9.1f %10.1f %10.1f %10.1f %8.1f %8.0f\n", r->kernel.c_str(),
                r->config.c_str(), r->flops / 1e9, r->t.median_us, r->t.min_us, r->t.max_us,
                r->flops / (r->t.median_us * 1e6), gbps);
    WriteCsvRow(out, *r, gbps, ceiling > 0 ? 100.0 * gbps / ceiling : 0, 0);
  }
}

// Times every kernel and prints both tables; the number of rows that failed to run.
int Benchmark(const Flags& flags) {
  Bench bench;
  if (absl::Status s = bench.Init(); !s.ok()) {
    std::printf("FAIL bench init: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  std::mt19937 rng(flags.seed);
  const std::vector<absl::StatusOr<Row>> rows = RunBenches(bench, rng);
  double ceiling = 0;
  if (rows[0].ok()) ceiling = rows[0]->bytes / (rows[0]->t.median_us * 1e3);  // GB/s
  FILE* out = flags.csv.empty() ? nullptr : std::fopen(flags.csv.c_str(), "w");
  if (out != nullptr) {
    std::fprintf(out, "kernel,config,bytes,median_us,min_us,max_us,gbps,pct_ceiling,target_pct,"
                      "tflops\n");
  }
  Tally tally;
  PrintBandwidthRows(rows, ceiling, out, tally);
  PrintPrefillRows(rows, ceiling, out);
  if (out != nullptr) std::fclose(out);
  std::printf("\nbytes: read + write the kernel must move (decode: K+V of every token, q, out,"
              " table; split-KV partials not counted; prefill: K+V once, q, out). Targets:"
              " paged_decode >= %.0f%% at batch >= %d and context >= %d, write_kv and"
              " copy_blocks >= %.0f%% of the copy ceiling; %d row(s) below target.\n",
              kDecodeTargetPercent, kDecodeTargetMinBatch, kDecodeTargetMinContext,
              kCopyTargetPercent, tally.below_target);
  return tally.failures;
}

int Run(int argc, char** argv) {
  Flags flags;
  if (!ParseFlags(argc, argv, flags)) return 2;
  int exit_status = 0;
  if (!ReportDevice(flags, exit_status)) return exit_status;
  const CheckCounts counts = Correctness(flags.quick, flags.seed);
  std::printf("correctness: %d failure(s), %d skipped\n", counts.failures, counts.skipped);
  if (counts.skipped > 0 && !flags.allow_no_gpu) {
    std::printf("FAIL: no usable GPU: %d check(s) found no device\n", counts.skipped);
    return kExitNoGpu;
  }
  if (flags.quick) return counts.failures == 0 ? 0 : 1;
  return counts.failures + Benchmark(flags) == 0 ? 0 : 1;
}

}  // namespace
}  // namespace kvpage::cuda::check

int main(int argc, char** argv) { return kvpage::cuda::check::Run(argc, argv); }
