// Built by tests/package/check_consumer.cmake with nothing but `c++ $(pkg-config --cflags --libs
// kvpage)`: schedules one request (scheduler, block, model) and writes its first token's K/V
// through the kernels' CPU reference (kernel_ref). Prints "consumer_pkgconfig ok" on success.
#include <cstdint>
#include <cstdio>
#include <memory>
#include <vector>

#include "kvpage/catalog.h"
#include "kvpage/kernel_layout.h"
#include "kvpage/kernel_reference.h"
#include "kvpage/scheduler.h"

int main() {
  absl::StatusOr<kvpage::ModelSpec> model = kvpage::LoadModel("qwen3-8b");
  if (!model.ok()) return 1;
  kvpage::SchedulerConfig config;
  config.kv.kv_budget_bytes = int64_t{1} << 30;
  auto scheduler = kvpage::Scheduler::Create(*model, config);
  if (!scheduler.ok()) return 1;
  const std::vector<int32_t> prompt(100, 7);
  if (!(*scheduler)->AddRequest({.id = kvpage::RequestId(1), .prompt_token_ids = prompt}).ok()) {
    return 1;
  }
  const kvpage::SchedulerOutput& out = (*scheduler)->Schedule();
  if (out.requests.size() != 1 || out.attention.empty()) return 1;

  // One token of 1 KV head x 64 values into a two-block cache at the step's first slot.
  constexpr int32_t kBlocks = 2, kBlockSize = 16, kHeadDim = 64;
  std::vector<uint16_t> cache(2 * kBlocks * kBlockSize * kHeadDim, 0);
  const kvpage::KvCacheView view = kvpage::BlocksFirstKvCache(cache.data(), kBlocks, kBlockSize,
                                                              1, kHeadDim, kvpage::DType::kBF16);
  std::vector<uint16_t> k(kHeadDim, kvpage::ref::FloatToBf16(1.5f));
  std::vector<uint16_t> v(kHeadDim, kvpage::ref::FloatToBf16(-2.0f));
  const int64_t slot = out.attention[0].slot_mapping[0] % (kBlocks * kBlockSize);
  const absl::Status written =
      kvpage::ref::WriteKv(k.data(), v.data(), kHeadDim, kHeadDim, &slot, 1, view);
  if (!written.ok()) {
    std::fprintf(stderr, "consumer_pkgconfig: %s\n", written.ToString().c_str());
    return 1;
  }
  std::printf("consumer_pkgconfig ok: slot %lld\n", static_cast<long long>(slot));
  return 0;
}
