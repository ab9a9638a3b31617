// How long a capacity question takes: loading a config and planning one context length.
// The planner runs inside the simulator's admission path later, so it must be cheap.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <vector>

#include "kvpage/catalog.h"
#include "kvpage/planner.h"

namespace {

void BM_LoadBundledModel(benchmark::State& state) {
  for (auto _ : state) {
    auto model = kvpage::LoadModel("qwen3.5-9b");
    benchmark::DoNotOptimize(model);
  }
}
BENCHMARK(BM_LoadBundledModel);

void BM_PlanOneContext(benchmark::State& state, const char* model_name, kvpage::Policy policy) {
  const kvpage::ModelSpec model = *kvpage::LoadModel(model_name);
  kvpage::PlanOptions options;
  options.policy = policy;
  const std::vector<int64_t> contexts = {32768};
  const int64_t budget = int64_t{64} << 30;
  for (auto _ : state) {
    auto plan = kvpage::MakePlan(model, options, contexts, budget);
    benchmark::DoNotOptimize(plan);
  }
}
BENCHMARK_CAPTURE(BM_PlanOneContext, gemma3_kvpage, "gemma-3-4b-it", kvpage::Policy::kKvpage);
BENCHMARK_CAPTURE(BM_PlanOneContext, gemma3_vllm, "gemma-3-4b-it", kvpage::Policy::kVllm);
BENCHMARK_CAPTURE(BM_PlanOneContext, gemma3_llamacpp, "gemma-3-4b-it", kvpage::Policy::kLlamaCpp);
BENCHMARK_CAPTURE(BM_PlanOneContext, qwen35_vllm, "qwen3.5-9b", kvpage::Policy::kVllm);

}  // namespace
