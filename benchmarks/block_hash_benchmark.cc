// How fast prefix-caching hashes are computed. Every prompt token is hashed once on admission,
// so hashing must stay far below the cost of prefill: the target is >= 1 G tokens/s for
// XXH3-128 over 16-token blocks on one core. Items processed are tokens, so the report's
// items_per_second reads as tokens/s.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <vector>

#include "block/request_block_hashes.h"
#include "kvpage/block_hash.h"

namespace {

using kvpage::BlockHash;
using kvpage::BlockHasher;
using kvpage::BlockHashExtras;
using kvpage::HashAlgorithm;
using kvpage::RequestBlockHashes;

constexpr int64_t kRequestTokens = 32768;
constexpr uint64_t kSeed = 42;

// Token ids spread over a 150K vocabulary, reproducible run to run.
std::vector<int32_t> MakeTokens(int64_t count) {
  std::vector<int32_t> tokens(static_cast<size_t>(count));
  uint32_t x = 12345;
  for (int32_t& token : tokens) {
    x = x * 1664525u + 1013904223u;
    token = static_cast<int32_t>(x % 150000u);
  }
  return tokens;
}

// Hashes a whole 32K-token prompt; range(0) is the block size. 256-token blocks encode to more
// than 1 KiB and take the streaming path.
void BM_HashTokens(benchmark::State& state, HashAlgorithm algorithm) {
  const BlockHasher hasher(algorithm, kSeed);
  const std::vector<int32_t> tokens = MakeTokens(kRequestTokens);
  RequestBlockHashes hashes(static_cast<int32_t>(state.range(0)), BlockHashExtras{});
  for (auto _ : state) {
    hashes.Truncate(0);  // keeps the vector's capacity: measures hashing, not allocation
    hashes.Update(hasher, tokens);
    benchmark::DoNotOptimize(hashes.hashes().data());
  }
  state.SetItemsProcessed(state.iterations() * kRequestTokens);
}
BENCHMARK_CAPTURE(BM_HashTokens, xxh3, HashAlgorithm::kXxh3_128)->Arg(16)->Arg(64)->Arg(256);
BENCHMARK_CAPTURE(BM_HashTokens, sha256, HashAlgorithm::kSha256)->Arg(16);

// One block on its own; range(0) is the block size.
void BM_HashBlock(benchmark::State& state, HashAlgorithm algorithm) {
  const BlockHasher hasher(algorithm, kSeed);
  const std::vector<int32_t> tokens = MakeTokens(state.range(0));
  const BlockHashExtras extras;
  BlockHash parent = hasher.root();
  for (auto _ : state) {
    // Chaining each result into the next call keeps the calls from overlapping or being hoisted.
    parent = hasher.HashBlock(parent, tokens, extras, /*block_start=*/16);
    benchmark::DoNotOptimize(parent);
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}
BENCHMARK_CAPTURE(BM_HashBlock, xxh3, HashAlgorithm::kXxh3_128)->Arg(16);
BENCHMARK_CAPTURE(BM_HashBlock, sha256, HashAlgorithm::kSha256)->Arg(16);

}  // namespace
