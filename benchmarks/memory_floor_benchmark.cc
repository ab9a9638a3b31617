// What the machine allows: the cost of touching N cache lines at random places in a working
// set of W MiB, the pattern of a decode step in which each of N requests needs one line that
// no other request shares (its own state, its table end, a pool record, a hash-map slot).
//
//   * BM_RandomLinesIndependent: every address is known up front (as when the step's request
//     list names them), so the core can keep many misses in flight: the floor per line when
//     the code prefetches perfectly.
//   * BM_RandomLinesDependent: each address comes from the previous line read (a linked list):
//     one full miss after another, what a pointer chase costs.
//
// Each line is read and written (a counter bumped), as the manager's updates are. Time = one
// pass over N lines; `per_line` = Time / N. With W of 4 MiB the lines sit in L3 once warm; at
// 256 MiB nearly every access misses L3 and the TLB. The numbers bound the block manager's and
// the scheduler's step: a design that needs k independent random lines per request cannot
// beat k × per_line × N on this machine.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "internal/prefetch.h"

namespace {

struct alignas(64) Line {
  uint64_t next = 0;  // the dependent variant's link
  uint64_t count = 0;
  uint64_t pad[6] = {};
};

// `lines` random distinct line indices of a working set of `total` lines.
std::vector<uint32_t> RandomLines(uint32_t total, uint32_t lines, uint64_t seed) {
  std::vector<uint32_t> all(total);
  std::iota(all.begin(), all.end(), 0u);
  std::mt19937_64 rng(seed);
  for (uint32_t i = 0; i < lines; ++i) {
    std::swap(all[i], all[i + rng() % (total - i)]);
  }
  all.resize(lines);
  return all;
}

void BM_RandomLinesIndependent(benchmark::State& state) {
  const uint32_t n = static_cast<uint32_t>(state.range(0));
  const uint32_t total = static_cast<uint32_t>((state.range(1) << 20) / sizeof(Line));
  std::vector<Line> memory(total);
  // A different set of lines each pass (as steps touch different blocks), 16 sets in turn.
  std::vector<std::vector<uint32_t>> sets;
  for (uint64_t s = 0; s < 16; ++s) sets.push_back(RandomLines(total, n, s));
  size_t pass = 0;
  for (auto _ : state) {
    const std::vector<uint32_t>& idx = sets[pass++ % sets.size()];
    constexpr uint32_t kAhead = 16;
    for (uint32_t i = 0; i < n; ++i) {
      if (i + kAhead < n) kvpage::PrefetchForWrite(&memory[idx[i + kAhead]]);
      ++memory[idx[i]].count;
    }
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * n);
  state.counters["per_line"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * n,
      benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

void BM_RandomLinesDependent(benchmark::State& state) {
  const uint32_t n = static_cast<uint32_t>(state.range(0));
  const uint32_t total = static_cast<uint32_t>((state.range(1) << 20) / sizeof(Line));
  std::vector<Line> memory(total);
  // One random cycle through every line; each pass walks the next n links of it.
  std::vector<uint32_t> order = RandomLines(total, total, 99);
  for (uint32_t i = 0; i < total; ++i) memory[order[i]].next = order[(i + 1) % total];
  uint64_t at = order[0];
  for (auto _ : state) {
    for (uint32_t i = 0; i < n; ++i) {
      Line& line = memory[at];
      ++line.count;
      at = line.next;
    }
    benchmark::DoNotOptimize(at);
  }
  state.SetItemsProcessed(state.iterations() * n);
  state.counters["per_line"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * n,
      benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

BENCHMARK(BM_RandomLinesIndependent)
    ->ArgNames({"lines", "working_set_mib"})
    ->ArgsProduct({{1024}, {4, 64, 256}})
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_RandomLinesDependent)
    ->ArgNames({"lines", "working_set_mib"})
    ->ArgsProduct({{1024}, {4, 64, 256}})
    ->Unit(benchmark::kMicrosecond);

}  // namespace
