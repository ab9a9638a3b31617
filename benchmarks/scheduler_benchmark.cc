// One scheduling step of a server in steady decode: Schedule() + Update() with N running
// requests that each decode one token (targets and results: docs/benchmarks.md).
#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "decode_server.h"
#include "kvpage/step_image.h"

namespace {

using kvpage_bench::DecodeServer;
using kvpage::SchedulerOutput;

void RunScheduleUpdate(benchmark::State& state, const char* model_name, bool prefix_caching) {
  const int32_t n = static_cast<int32_t>(state.range(0));
  DecodeServer server(model_name, n, prefix_caching);
  if (!server.error().empty()) {
    state.SkipWithError(server.error().c_str());
    return;
  }
  for (auto _ : state) {
    if (server.steps_left() == 0) {
      state.PauseTiming();
      server.Reset();
      state.ResumeTiming();
    }
    const SchedulerOutput& out = server.scheduler().Schedule();
    if (static_cast<int32_t>(out.requests.size()) != n || !server.Apply(out)) {
      state.SkipWithError(server.error().empty() ? "not every request decoded" : server.error().c_str());
      return;
    }
  }
  state.SetItemsProcessed(state.iterations() * n);
  state.counters["per_request_ns"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * n * 1e-9,
      benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

void BM_ScheduleUpdate(benchmark::State& state, const char* model_name) {
  RunScheduleUpdate(state, model_name, /*prefix_caching=*/true);
}
void BM_ScheduleUpdateNoPrefixCache(benchmark::State& state, const char* model_name) {
  RunScheduleUpdate(state, model_name, /*prefix_caching=*/false);
}

// The same steps, each packed into its step image (kvpage/step_image.h) as a server uploading
// it would; the time is the packing alone. Counters: the image's bytes per step against the
// bytes of the whole block tables (what uploading them every step would move).
void BM_StepImage(benchmark::State& state, const char* model_name) {
  const int32_t n = static_cast<int32_t>(state.range(0));
  DecodeServer server(model_name, n, /*prefix_caching=*/true);
  if (!server.error().empty()) {
    state.SkipWithError(server.error().c_str());
    return;
  }
  std::vector<std::byte> staging;
  double image_bytes = 0, table_bytes = 0;
  for (auto _ : state) {
    state.PauseTiming();
    if (server.steps_left() == 0) server.Reset();
    const SchedulerOutput& out = server.scheduler().Schedule();
    state.ResumeTiming();
    staging.resize(static_cast<size_t>(kvpage::LayoutStepImage(out).bytes));
    const auto layout = kvpage::WriteStepImage(out, absl::MakeSpan(staging));
    state.PauseTiming();
    if (!layout.ok() || !server.Apply(out)) {
      state.SkipWithError("the step failed");
      return;
    }
    image_bytes += static_cast<double>(layout->bytes);
    for (const kvpage::AttentionBatch& g : out.attention) {
      table_bytes += static_cast<double>(g.block_table.size() * sizeof(int32_t));
    }
    state.ResumeTiming();
  }
  state.counters["image_bytes"] = image_bytes / static_cast<double>(state.iterations());
  state.counters["table_bytes"] = table_bytes / static_cast<double>(state.iterations());
}

BENCHMARK_CAPTURE(BM_StepImage, qwen3_8b, "qwen3-8b")
    ->ArgName("requests")
    ->Arg(1024)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_StepImage, gemma3_4b, "gemma-3-4b-it")
    ->ArgName("requests")
    ->Arg(1024)
    ->Unit(benchmark::kMicrosecond);

BENCHMARK_CAPTURE(BM_ScheduleUpdate, qwen3_8b, "qwen3-8b")
    ->ArgName("requests")
    ->Arg(256)->Arg(1024)->Arg(4096)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_ScheduleUpdate, gemma3_4b, "gemma-3-4b-it")
    ->ArgName("requests")
    ->Arg(1024)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_ScheduleUpdateNoPrefixCache, qwen3_8b, "qwen3-8b")
    ->ArgName("requests")
    ->Arg(1024)
    ->Unit(benchmark::kMicrosecond);

}  // namespace
