// Randomized operation sequences against KvCacheManager, for tiny and bundled models under both
// accounting modes. A seeded std::mt19937_64 drives a small server loop — add, prefix-hit and
// chunked prefill, decode (with lookahead and speculative tokens), rollback, sliding-window
// frees, preemption, finish, prefix-cache reset — under memory pressure. After every operation
// the manager's own CheckInvariants must hold, and the test checks from outside:
//   * a failed AllocateSlots changes nothing (usage, every request's tables, free orders);
//     with a memory backing that refuses maps at random (Options::refuse_map_chance), a
//     refused step changes no request's table and no pool's used blocks;
//   * tables cover the step's tokens, slot mappings and state slots exist, and no two live
//     requests write one slot (or one state slot) in one step;
//   * a shadow of the KV memory: every slot records a fingerprint of the token prefix whose K/V
//     it holds, so a prefix hit, a recurrent-state read or a request's own earlier tokens must
//     find exactly their own prefix there (catches stale hashes and overwritten shared pages);
//   * a router's mirror of the KV events stays consistent and covers every hit;
//   * a preempted request re-added with the same tokens hits what it had computed;
//   * with a host tier, saves and loads move the shadow memory as a server's copies would, so a
//     prefix loaded back must hold exactly its own fingerprints too; transfers complete late,
//     fail, or outlive their requests.
#include <gtest/gtest.h>

#include <algorithm>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <memory>
#include <optional>
#include <ostream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "block/manager_test_util.h"
#include "block/request_block_hashes.h"
#include "kvpage/block_hash.h"
#include "kvpage/catalog.h"
#include "kvpage/kv_cache_manager.h"

namespace kvpage {
namespace {

using testing::H;

constexpr uint64_t kHashSeed = 0x5eed;

uint64_t Mix(uint64_t x) {  // splitmix64
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

uint64_t Fnv(const std::string& text) {  // stable across standard libraries, unlike std::hash
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char ch : text) h = (h ^ ch) * 0x100000001b3ULL;
  return h;
}

// ---- Models -----------------------------------------------------------------------------------

ModelSpec WithWindow(ModelSpec spec, int32_t window) {
  for (LayerSpec& l : spec.layers) {
    if (l.kind == LayerKind::kSlidingWindow) l.sliding_window = window;
  }
  for (LayerGroup& g : spec.groups) {
    if (g.spec.kind == LayerKind::kSlidingWindow) g.spec.sliding_window = window;
  }
  spec.name += "-w" + std::to_string(window);
  return spec;
}

absl::StatusOr<ModelSpec> LoadCase(const std::string& label) {
  if (label == "tiny_full") return ParseModelSpec(testing::kTinyFull, "tiny_full", "tiny");
  if (label == "tiny_swa") return ParseModelSpec(testing::kTinyHybridSwa, "tiny_swa", "tiny");
  if (label == "tiny_chunked") {
    return ParseModelSpec(testing::kTinyChunked, "tiny_chunked", "tiny");
  }
  if (label == "tiny_gdn") return ParseModelSpec(testing::kTinyGdn, "tiny_gdn", "tiny");
  if (label == "tiny_dsa") return ParseModelSpec(testing::kTinyDsa, "tiny_dsa", "tiny");
  if (label == "tiny_jamba") return ParseModelSpec(testing::kTinyJamba, "tiny_jamba", "tiny");
  if (label == "tiny_minimax") {
    return ParseModelSpec(testing::kTinyMiniMax, "tiny_minimax", "tiny");
  }
  if (label == "tiny_kimi") return ParseModelSpec(testing::kTinyKimi, "tiny_kimi", "tiny");
  if (label == "gemma3_4b_w48") {
    // Gemma 3's 1024-token window never slides within a few dozen blocks: shrink it.
    auto spec = LoadModel("gemma-3-4b-it");
    if (!spec.ok()) return spec.status();
    return WithWindow(*std::move(spec), 48);
  }
  if (label == "qwen3_5_0_8b") return LoadModel("qwen3.5-0.8b");
  if (label == "gemma3_4b") return LoadModel("gemma-3-4b-it");
  if (label == "deepseek_v2_lite") return LoadModel("deepseek-v2-lite");
  if (label == "deepseek_v3_2") return LoadModel("deepseek-v3.2");
  return absl::NotFoundError(label);
}

// ---- Statistics ---------------------------------------------------------------------------------

struct Stats {
  int64_t ops = 0;
  int64_t adds = 0;
  int64_t allocations = 0;
  int64_t failed_allocations = 0;
  int64_t hits = 0;  // first allocations with a non-empty hit
  int64_t hit_tokens = 0;
  int64_t preempts = 0;
  int64_t preempt_hits = 0;
  int64_t spec_steps = 0;
  int64_t rollbacks = 0;
  int64_t evictions = 0;    // kRemoved events
  int64_t chunk_moves = 0;  // allocations during which some pool gave up a chunk
  int64_t resets = 0;
  int64_t finished = 0;
  int64_t max_live = 0;
  int64_t block_size = 0;
  int64_t host_loads = 0;  // LoadFromHost calls that started a load
  int64_t host_hits = 0;   // first allocations whose hit a load extended
  int64_t refused_maps = 0;  // map attempts the backing refused

  void Add(const Stats& o) {
    host_loads += o.host_loads;
    host_hits += o.host_hits;
    ops += o.ops;
    adds += o.adds;
    allocations += o.allocations;
    failed_allocations += o.failed_allocations;
    hits += o.hits;
    hit_tokens += o.hit_tokens;
    preempts += o.preempts;
    preempt_hits += o.preempt_hits;
    spec_steps += o.spec_steps;
    rollbacks += o.rollbacks;
    evictions += o.evictions;
    chunk_moves += o.chunk_moves;
    resets += o.resets;
    finished += o.finished;
    max_live = std::max(max_live, o.max_live);
    block_size = o.block_size;
    refused_maps += o.refused_maps;
  }
};

// ---- The fuzzer -------------------------------------------------------------------------------

// How a speculative step handles its draft tokens.
enum class DraftFlow {
  kNotAppended,  // drafts only counted in num_new_tokens; accepted ones appended afterwards
  kAppended,     // drafts appended first; rejected ones removed with RollbackTokens
};

struct Options {
  int32_t num_ops = 2000;
  bool spec_decode = true;
  bool rollback = true;
  // Roll back tokens that completed (and so cached) a block: the blocks leave the cache, or
  // the rollback is refused when another request shares them (RollbackLeavesStaleHashInPool).
  bool rollback_across_blocks = false;
  DraftFlow draft_flow = DraftFlow::kNotAppended;
  bool fork_from_history = true;  // new prompts may copy an earlier sequence
  // Pass an empty hit (a miss) as nullptr in models with linear-attention groups, instead of
  // the CacheHit itself (both are valid; EmptyHitCrashesLinearAttentionModels covers the latter).
  bool avoid_empty_hits_with_state = false;
  // A host tier about as large as the device budget (kvpage accounting only).
  std::optional<HostTierPolicy> host_tier;
  // The manager's memory backing refuses each map with this chance (0 = no backing).
  double refuse_map_chance = 0;
};

// A memory backing that refuses maps at random, as a GPU near full would, and checks that the
// manager never maps a chunk twice or unmaps one that is not mapped.
class FlakyBacking final : public MemoryBacking {
 public:
  FlakyBacking(uint64_t seed, double refuse_chance) : rng_(seed), refuse_chance_(refuse_chance) {}
  absl::Status MapChunk(int32_t pool, int32_t chunk) override {
    if (std::bernoulli_distribution(refuse_chance_)(rng_)) {
      ++refusals_;
      return absl::ResourceExhaustedError(absl::StrCat("refused chunk ", chunk, " of pool ", pool));
    }
    if (!mapped_.insert({pool, chunk}).second) Misuse("mapped twice", pool, chunk);
    return absl::OkStatus();
  }
  absl::Status UnmapChunk(int32_t pool, int32_t chunk) override {
    if (!mapped_.erase({pool, chunk})) Misuse("unmapped while not mapped", pool, chunk);
    return absl::OkStatus();
  }
  int64_t refusals() const { return refusals_; }
  int64_t num_mapped() const { return static_cast<int64_t>(mapped_.size()); }
  const std::string& misuse() const { return misuse_; }

 private:
  void Misuse(const char* what, int32_t pool, int32_t chunk) {
    if (misuse_.empty()) misuse_ = absl::StrCat("chunk ", chunk, " of pool ", pool, " ", what);
  }
  std::mt19937_64 rng_;
  const double refuse_chance_;
  int64_t refusals_ = 0;
  absl::flat_hash_set<std::pair<int32_t, int32_t>> mapped_;
  std::string misuse_;
};

struct Req {
  RequestId id;
  std::vector<int32_t> tokens;
  std::string salt;
  bool skip_read = false;
  int64_t prompt_len = 0;
  int64_t computed = 0;  // tokens whose K/V (and state) is written
  // Tokens an allocation has offered to the prefix cache: computed and known (sampled) at the
  // time. Drafts accepted after a step are offered by the next allocation only (as in vLLM).
  int64_t offered = 0;
  bool allocated = false;
  bool loading = false;    // LoadFromHost started a load that has not completed
  bool host_held = false;  // LoadFromHost holds blocks for it until its first allocation
  // Linear-attention groups: the current state is a prefix-cache snapshot (shared), so the next
  // step writes a fresh slot instead of updating in place.
  bool state_shared = false;
  int64_t max_processed = 0;  // largest num_processed_tokens a window release saw
  int64_t scheduled_step = -1;
  int64_t step_start = 0;  // computed tokens before the step it was last scheduled in
  int64_t max_len = 0;
  // fp[k]: fingerprint of the first k tokens (what a slot holding position k − 1 must contain).
  std::vector<uint64_t> fp;

  void Push(int32_t t) {
    tokens.push_back(t);
    fp.push_back(Mix(fp.back() ^ (static_cast<uint64_t>(t) * 0x100000001b3ULL)));
  }
  void Truncate(int64_t n) {
    tokens.resize(n);
    fp.resize(n + 1);
  }
};

uint64_t SaltFp(const std::string& salt) { return Mix(Fnv(salt) + 17); }

// What the kernels would have written: per pool and slot, the fingerprint of the token prefix
// whose K/V (or recurrent state) the slot holds; 0 = never written.
class ShadowMemory {
 public:
  void Write(int32_t pool, int64_t slot, uint64_t fp) {
    if (pool >= static_cast<int32_t>(pools_.size())) pools_.resize(pool + 1);
    std::vector<uint64_t>& v = pools_[pool];
    if (slot >= static_cast<int64_t>(v.size())) v.resize(2 * slot + 64, 0);
    v[slot] = fp;
  }
  uint64_t Read(int32_t pool, int64_t slot) const {
    if (pool >= static_cast<int32_t>(pools_.size())) return 0;
    const std::vector<uint64_t>& v = pools_[pool];
    return slot < static_cast<int64_t>(v.size()) ? v[slot] : 0;
  }

 private:
  std::vector<std::vector<uint64_t>> pools_;
};

class Fuzzer {
 public:
  Fuzzer(std::string label, const ModelSpec& spec, AccountingMode mode, uint64_t seed,
         Options options)
      : label_(std::move(label)), spec_(spec), mode_(mode), rng_(seed), opt_(options) {}

  const Stats& stats() const { return stats_; }

  void Run() {
    ASSERT_NO_FATAL_FAILURE(Build());
    for (int32_t i = 0; i < opt_.num_ops; ++i) {
      ++stats_.ops;
      ASSERT_NO_FATAL_FAILURE(Step()) << Trace();
      ASSERT_NO_FATAL_FAILURE(AfterOp()) << Trace();
    }
    ASSERT_NO_FATAL_FAILURE(DrainAll()) << Trace();
  }

 private:
  // ---- Setup ----

  void Build() {
    // Probe the pools' block sizes with a budget large enough for one block of anything.
    KvCacheConfig probe_config = BaseConfig();
    probe_config.kv_budget_bytes = int64_t{256} << 20;
    probe_config.chunk_bytes = probe_config.kv_budget_bytes;
    auto probe = KvCacheManager::Create(spec_, probe_config);
    ASSERT_TRUE(probe.ok()) << probe.status();
    bs_ = 0;
    for (int32_t g = 0; g < (*probe)->num_groups(); ++g) {
      if ((*probe)->group_kind(GroupId(g)) != LayerKind::kLinearAttention) {
        bs_ = (*probe)->group_block_size(GroupId(g));
        break;
      }
    }
    ASSERT_GT(bs_, 0);
    stats_.block_size = bs_;
    // A request holds ~8 attention blocks per group and up to 2 state slots per linear group;
    // the budget holds about 3.5 such requests, so memory runs short.
    // (In vllm mode every group's entry carries the block-id size of the shared pool.)
    int64_t per_request = 0;
    for (const PoolUsage& p : (*probe)->Usage().pools) {
      per_request += p.block_bytes * (p.kind == LayerKind::kLinearAttention ? 2 : 8);
    }
    KvCacheConfig config = BaseConfig();
    config.kv_budget_bytes = per_request * 7 / 2;
    if (opt_.host_tier.has_value()) {
      config.host_cache = {.budget_bytes = per_request * 4, .policy = *opt_.host_tier};
    }
    // kvpage mode: about a dozen chunks per pool, so chunks are mapped, idle and moved.
    config.chunk_bytes = std::max<int64_t>(1, config.kv_budget_bytes / 12);
    KvCacheConfig main_config = config;
    if (opt_.refuse_map_chance > 0) {
      backing_ = std::make_unique<FlakyBacking>(rng_(), opt_.refuse_map_chance);
      main_config.backing = backing_.get();
    }
    auto m = KvCacheManager::Create(spec_, main_config);
    ASSERT_TRUE(m.ok()) << m.status();
    m_ = *std::move(m);
    ASSERT_EQ(m_->group_block_size(GroupId(first_attention_group())), bs_);
    hasher_ = std::make_unique<BlockHasher>(HashAlgorithm::kXxh3_128, kHashSeed);
    // Blocks per chunk of each pool, observed: one token makes every pool map one chunk.
    // AfterOp checks that the mapped bytes keep adding up.
    auto geometry_probe = KvCacheManager::Create(spec_, config);
    ASSERT_TRUE(geometry_probe.ok()) << geometry_probe.status();
    AssertOk((*geometry_probe)->AddRequest({RequestId(1), {1}}).status());
    auto probed = (*geometry_probe)->AllocateSlots(H(**geometry_probe, 1), {.num_new_tokens = 1});
    ASSERT_TRUE(probed.ok() && *probed) << probed.status();
    for (const PoolUsage& p : (*geometry_probe)->Usage().pools) {
      ASSERT_EQ(p.mapped_chunks, 1);
      Geometry geo;
      geo.bpc = p.used_blocks + p.cached_free_blocks + p.clean_blocks;
      geo.chunk_bytes = geo.bpc * p.block_bytes;
      geo.max_chunks = config.kv_budget_bytes / geo.chunk_bytes;
      geo_.push_back(geo);
    }
    for (int32_t g = 0; g < m_->num_groups(); ++g) {
      const LayerKind kind = m_->group_kind(GroupId(g));
      has_linear_ |= kind == LayerKind::kLinearAttention;
      has_sliding_ |= kind == LayerKind::kSlidingWindow;
      has_chunked_ |= kind == LayerKind::kChunkedLocal;
      // vLLM 0.33's align-mode state blocks: the block a step replaced is freed when the
      // request is next allocated, inside AllocateSlots, as a window's dead blocks are.
      releases_state_ |= kind == LayerKind::kLinearAttention && mode_ == AccountingMode::kVllm &&
                         config.enable_prefix_caching &&
                         config.vllm_version != VllmVersion::kV0_29;
      if (kind != LayerKind::kLinearAttention) {
        ASSERT_EQ(m_->group_block_size(GroupId(g)), bs_) << "one hash block size expected";
      }
    }
    for (const LayerGroup& g : spec_.groups) {
      if (g.spec.kind == LayerKind::kSlidingWindow) window_ = g.spec.sliding_window;
      if (g.spec.kind == LayerKind::kChunkedLocal) chunk_ = g.spec.attention_chunk_size;
    }
    // Shared prompt material: a few system prompts and documents, in whole and half blocks.
    for (int32_t i = 0; i < 4; ++i) {
      const int64_t len = bs_ * (1 + i) + (i % 2 == 0 ? bs_ / 2 : 0);
      prefixes_.push_back(RandomTokens(len, 0, 1000));
    }
    for (int32_t i = 0; i < 3; ++i) documents_.push_back(RandomTokens(bs_ * (1 + i), 1000, 2000));
    max_live_ = 8;
    max_len_ = 12 * bs_;
    AssertOk(m_->CheckInvariants());
  }

  KvCacheConfig BaseConfig() const {
    KvCacheConfig c;
    c.mode = mode_;
    c.block_size = 16;
    c.hash_seed = kHashSeed;
    c.enable_kv_events = true;
    c.decode_snapshot_interval_blocks = 1;  // snapshot at every block boundary in decode too
    return c;
  }

  int32_t first_attention_group() const {
    for (int32_t g = 0; g < m_->num_groups(); ++g) {
      if (m_->group_kind(GroupId(g)) != LayerKind::kLinearAttention) return g;
    }
    return -1;
  }
  bool IsLinear(int32_t g) const {
    return m_->group_kind(GroupId(g)) == LayerKind::kLinearAttention;
  }
  // Groups that share memory: one block-id space in vllm mode, one pool per group in kvpage.
  int32_t PoolKey(int32_t g) const { return mode_ == AccountingMode::kVllm ? 0 : g; }
  static uint64_t Key(int32_t pool, int64_t slot) {
    return (static_cast<uint64_t>(pool) << 48) ^ static_cast<uint64_t>(slot);
  }

  // ---- Randomness ----

  // Not std::uniform_int_distribution: its output differs between standard libraries, and a
  // seed must name the same run everywhere.
  int64_t Uniform(int64_t lo, int64_t hi) {  // inclusive
    return lo + static_cast<int64_t>(rng_() % static_cast<uint64_t>(hi - lo + 1));
  }
  bool Chance(double p) { return static_cast<double>(rng_() >> 11) * 0x1.0p-53 < p; }
  template <typename T>
  T& PickOne(std::vector<T>& v) {
    return v[static_cast<size_t>(Uniform(0, static_cast<int64_t>(v.size()) - 1))];
  }
  template <typename T>
  T& PickOne(std::deque<T>& v) {
    return v[static_cast<size_t>(Uniform(0, static_cast<int64_t>(v.size()) - 1))];
  }
  std::vector<int32_t> RandomTokens(int64_t n, int32_t lo, int32_t hi) {
    std::vector<int32_t> t(n);
    for (auto& x : t) x = static_cast<int32_t>(Uniform(lo, hi - 1));
    return t;
  }
  // The model's next token: mostly a function of the prefix (so equal prefixes continue alike
  // and decode blocks get shared hashes), sometimes random.
  int32_t NextToken(uint64_t prefix_fp) {
    if (Chance(0.75)) return static_cast<int32_t>(3000 + Mix(prefix_fp) % 48);
    return static_cast<int32_t>(Uniform(3000, 3047));
  }

  // ---- Logging ----

  void Log(std::string line) {
    // KVPAGE_FUZZ_VERBOSE=1 echoes every operation (for crashes that skip the trace).
    if (verbose_) std::fprintf(stderr, "%s\n", line.c_str());
    log_.push_back(std::move(line));
    if (log_.size() > 40) log_.pop_front();
  }
  std::string Trace() const {
    std::string s =
        absl::StrCat("\n[", label_, " ", mode_ == AccountingMode::kVllm ? "vllm" : "kvpage", " op ",
                     stats_.ops, " step ", step_, "] last operations:\n");
    for (const std::string& l : log_) absl::StrAppend(&s, "  ", l, "\n");
    return s;
  }
  static void AssertOk(const absl::Status& s) { ASSERT_TRUE(s.ok()) << s; }

  // ---- One random operation ----

  void Step() {
    if (opt_.host_tier.has_value() && Chance(0.12)) return OpCompleteTransfer();
    const int64_t r = Uniform(0, 99);
    if (r < 14) return OpAdd();
    if (r < 60) return OpSchedule();
    if (r < 72) return OpNewStep();
    if (r < 77) return OpRemoveSkipped();
    if (r < 82) return OpPreempt();
    if (r < 90) return OpFinish();
    if (r < 94) return OpRollback();
    if (r < 95) return OpReset();
    if (r < 96 && Chance(0.3)) return OpDrainAndReset();
    return OpSchedule();
  }

  void AfterOp() {
    ASSERT_NO_FATAL_FAILURE(PumpTransfers());
    AssertOk(m_->CheckInvariants());
    ASSERT_NO_FATAL_FAILURE(ConsumeEvents());
    stats_.max_live = std::max<int64_t>(stats_.max_live, static_cast<int64_t>(live_.size()));
    ASSERT_EQ(m_->num_requests(), static_cast<int64_t>(live_.size()));
    // The pool geometry this test assumes (see Geometry) matches what the manager maps.
    const KvCacheUsage u = m_->Usage();
    int64_t mapped = 0;
    if (mode_ == AccountingMode::kKvpage) {
      for (size_t g = 0; g < u.pools.size(); ++g)
        mapped += u.pools[g].mapped_chunks * geo_[g].chunk_bytes;
      ASSERT_EQ(mapped, u.mapped_bytes);
    }
  }

  std::vector<Req*> Candidates(bool need_unscheduled, bool need_allocated = false) {
    std::vector<Req*> out;
    for (auto& r : live_) {
      if (need_unscheduled && r->scheduled_step == step_) continue;
      if (need_allocated && !r->allocated) continue;
      out.push_back(r.get());
    }
    return out;
  }
  Req* Pick(std::vector<Req*> c) { return c.empty() ? nullptr : PickOne(c); }

  void OpAdd() {
    if (static_cast<int32_t>(live_.size()) >= max_live_) return OpSchedule();
    auto r = std::make_unique<Req>();
    r->id = RequestId(next_id_++);
    if (Chance(0.1)) r->salt = Chance(0.5) ? "tenant-a" : "tenant-b";
    r->fp.push_back(SaltFp(r->salt));
    std::vector<int32_t> prompt;
    if (opt_.fork_from_history && !history_.empty() && Chance(0.2)) {
      // A later turn or a retry: an earlier sequence (same salt) plus maybe a new tail.
      const auto& [tokens, salt] = PickOne(history_);
      prompt = tokens;
      r->salt = salt;
      r->fp[0] = SaltFp(salt);
      if (Chance(0.5)) {
        const auto tail = RandomTokens(Uniform(1, bs_), 2000, 3000);
        prompt.insert(prompt.end(), tail.begin(), tail.end());
      }
    } else {
      prompt = PickOne(prefixes_);
      if (Chance(0.5)) {
        const auto& d = PickOne(documents_);
        prompt.insert(prompt.end(), d.begin(), d.end());
      }
      const auto tail = RandomTokens(Uniform(1, 2 * bs_), 2000, 3000);
      prompt.insert(prompt.end(), tail.begin(), tail.end());
    }
    if (static_cast<int64_t>(prompt.size()) > max_len_ - bs_) prompt.resize(max_len_ - bs_);
    for (int32_t t : prompt) r->Push(t);
    r->prompt_len = static_cast<int64_t>(prompt.size());
    r->max_len = std::min<int64_t>(max_len_, r->prompt_len + Uniform(1, 4 * bs_));
    r->skip_read = Chance(0.05);
    KvRequestSpec spec{r->id, prompt};
    spec.extras.cache_salt = r->salt;
    spec.skip_prefix_cache_read = r->skip_read;
    Log(absl::StrCat("add r", r->id.value, " prompt ", prompt.size(),
                     r->salt.empty() ? "" : " salted", r->skip_read ? " skip-read" : ""));
    AssertOk(m_->AddRequest(spec).status());
    ++stats_.adds;
    live_.push_back(std::move(r));
  }

  void OpNewStep() {
    // Before the step boundary: every live request's computed K/V and state is intact.
    ASSERT_NO_FATAL_FAILURE(SweepContent());
    m_->NewStep();
    ++step_;
    step_writers_.clear();
    step_state_readers_.clear();
    Log(absl::StrCat("NewStep -> ", step_));
  }

  void OpRemoveSkipped() {
    Req* r = Pick(Candidates(false, true));
    if (r == nullptr) return OpSchedule();
    // Only tokens of finished steps count as processed: not those of this step.
    const int64_t processed = Uniform(0, r->scheduled_step == step_ ? r->step_start : r->computed);
    Log(absl::StrCat("RemoveSkippedBlocks r", r->id.value, " processed ", processed));
    const auto before = Tables(*r);
    AssertOk(m_->RemoveSkippedBlocks(H(*m_, r->id), processed));
    r->max_processed = std::max(r->max_processed, processed);
    const auto after = Tables(*r);
    for (int32_t g = 0; g < m_->num_groups(); ++g) {
      ASSERT_EQ(before[g].size(), after[g].size());
      for (size_t i = 0; i < before[g].size(); ++i) {
        if (after[g][i] == before[g][i]) continue;
        ASSERT_TRUE(FreesSkipped(GroupId(g))) << "group " << g;
        ASSERT_EQ(after[g][i], kNullBlock);
        // Only blocks wholly before the window (or chunk) of token `processed` may go.
        ASSERT_LE(static_cast<int64_t>(i + 1) * bs_, Skipped(GroupId(g), processed));
      }
    }
  }

  void OpPreempt() {
    Req* r = Pick(Candidates(true));
    if (r == nullptr) return OpNewStep();
    ++stats_.preempts;
    const int64_t new_id = next_id_++;
    Log(absl::StrCat("preempt r", r->id.value, " (", r->tokens.size(), " tokens, computed ",
                     r->computed, ") -> r", new_id));
    AssertOk(m_->Free(H(*m_, r->id)));
    AssertOk(m_->CheckInvariants());
    ASSERT_NO_FATAL_FAILURE(ConsumeEvents());
    auto fresh = std::make_unique<Req>();
    fresh->id = RequestId(new_id);
    fresh->salt = r->salt;
    fresh->fp.push_back(SaltFp(r->salt));
    for (int32_t t : r->tokens) fresh->Push(t);
    fresh->prompt_len = static_cast<int64_t>(fresh->tokens.size());
    fresh->max_len = std::max(r->max_len, fresh->prompt_len + 1);
    KvRequestSpec spec{fresh->id, fresh->tokens};
    spec.extras.cache_salt = fresh->salt;
    AssertOk(m_->AddRequest(spec).status());
    auto hit = m_->GetComputedBlocks(H(*m_, fresh->id));
    ASSERT_TRUE(hit.ok()) << hit.status();
    ASSERT_NO_FATAL_FAILURE(CheckHit(*fresh, *hit));
    ASSERT_NO_FATAL_FAILURE(CountQuery(*fresh, *hit));
    if (hit->num_tokens > 0) ++stats_.preempt_hits;
    // Whatever the request had computed in full blocks is still cached: nothing ran in between.
    const int64_t len = static_cast<int64_t>(fresh->tokens.size());
    const int64_t expect_blocks = std::min({r->computed, r->offered, len - 1}) / bs_;
    bool exact = !has_linear_ && r->allocated;
    if (has_sliding_ && exact) {
      const int64_t needed = CeilDiv(window_ - 1, bs_);
      const int64_t first = expect_blocks - needed;  // first block the window needs
      if (first >= 0 && (first + 1) * bs_ <= r->max_processed - window_ + 1) exact = false;
    }
    if (has_chunked_ && exact) {
      // The hit needs the blocks of the chunk holding token expect_blocks·bs; a release may
      // have freed (and eviction dropped) some of them.
      const int64_t first = expect_blocks * bs_ / chunk_ * chunk_ / bs_;
      if (first < r->max_processed / chunk_ * chunk_ / bs_) exact = false;
    }
    if (exact) {
      ASSERT_GE(hit->num_tokens, expect_blocks * bs_) << "preempted request lost its cached prefix";
    }
    ReplaceLive(r, std::move(fresh));
  }

  void OpFinish() {
    std::vector<Req*> c = Candidates(true);
    std::vector<Req*> done;
    for (Req* r : c) {
      if (static_cast<int64_t>(r->tokens.size()) >= r->max_len) done.push_back(r);
    }
    Req* r = !done.empty() ? Pick(done) : (Chance(0.3) ? Pick(c) : nullptr);
    if (r == nullptr) return OpSchedule();
    Log(absl::StrCat("finish r", r->id.value, " (", r->tokens.size(), " tokens)"));
    AssertOk(m_->Free(H(*m_, r->id)));
    Remember(*r);
    ++stats_.finished;
    RemoveLive(r);
  }

  void OpRollback() {
    // A recurrent state cannot be rolled back: only attention-only models.
    if (!opt_.rollback || has_linear_) return OpSchedule();
    // A request in decode whose last sampled tokens are withdrawn: the K/V of the remaining
    // last token is recomputed next step.
    std::vector<Req*> c;
    for (Req* r : Candidates(true, true)) {
      const int64_t generated = static_cast<int64_t>(r->tokens.size()) - r->prompt_len;
      if (generated >= 2 && r->computed == static_cast<int64_t>(r->tokens.size()) - 1)
        c.push_back(r);
    }
    Req* r = Pick(c);
    if (r == nullptr) return OpSchedule();
    const int64_t generated = static_cast<int64_t>(r->tokens.size()) - r->prompt_len;
    int64_t max_k = generated - 1;
    if (!opt_.rollback_across_blocks) {
      max_k = std::min<int64_t>(max_k, static_cast<int64_t>(r->tokens.size()) % bs_);
    }
    if (max_k < 1) return OpSchedule();
    const int64_t k = Uniform(1, max_k);
    Log(absl::StrCat("RollbackTokens r", r->id.value, " ", k, " of ", r->tokens.size()));
    const KvCacheUsage before = m_->Usage();
    const absl::Status s = m_->RollbackTokens(H(*m_, r->id), k);
    if (absl::IsFailedPrecondition(s)) {
      // Refused: a block those tokens completed is shared with another request.
      Log("  -> refused (shared block)");
      ASSERT_NO_FATAL_FAILURE(ExpectSameUsage(before, m_->Usage()));
      return;
    }
    Remember(*r);
    AssertOk(s);
    r->Truncate(static_cast<int64_t>(r->tokens.size()) - k);
    r->computed = std::min<int64_t>(r->computed, static_cast<int64_t>(r->tokens.size()) - 1);
    r->offered = std::min<int64_t>(r->offered, static_cast<int64_t>(r->tokens.size()));
    ++stats_.rollbacks;
  }

  void OpReset() {
    bool held = false;
    for (auto& r : live_) held |= r->allocated;
    if (opt_.host_tier.has_value()) {
      // Saves pin their blocks and loads hold theirs for the request until it is allocated.
      ASSERT_NO_FATAL_FAILURE(CompleteAllTransfers());
      held |= m_->Usage().used_bytes > 0;
    }
    const KvCacheUsage before = m_->Usage();
    const absl::Status s = m_->ResetPrefixCache();
    Log(absl::StrCat("ResetPrefixCache (blocks held: ", held, ") -> ", s.ToString()));
    if (held) {
      ASSERT_TRUE(absl::IsFailedPrecondition(s)) << s;
      ASSERT_NO_FATAL_FAILURE(ExpectSameUsage(before, m_->Usage()));
      return;
    }
    AssertOk(s);
    ++stats_.resets;
    for (const PoolUsage& p : m_->Usage().pools) ASSERT_EQ(p.cached_free_blocks, 0);
    expect_all_cleared_ = true;
  }

  void OpDrainAndReset() {
    // End the step, finish every request, and reset the cache (the pools must be empty).
    OpNewStep();
    if (::testing::Test::HasFatalFailure()) return;
    while (!live_.empty()) {
      Req* r = live_.back().get();
      Log(absl::StrCat("drain r", r->id.value));
      AssertOk(m_->Free(H(*m_, r->id)));
      Remember(*r);
      RemoveLive(r);
    }
    ASSERT_NO_FATAL_FAILURE(CompleteAllTransfers());
    const KvCacheUsage u = m_->Usage();
    ASSERT_EQ(u.used_bytes, 0);
    for (const PoolUsage& p : u.pools) ASSERT_EQ(p.used_blocks, 0);
    OpReset();
  }

  // ---- Scheduling one request for this step ----

  struct Snapshot {
    KvCacheUsage usage;
    std::vector<std::vector<std::vector<BlockId>>> tables;  // per live request
    std::vector<std::vector<BlockId>> free_order;           // per group
  };

  Snapshot Take() const {
    Snapshot s;
    s.usage = m_->Usage();
    for (const auto& r : live_) s.tables.push_back(Tables(*r));
    for (int32_t g = 0; g < m_->num_groups(); ++g)
      s.free_order.push_back(m_->FreeBlockOrder(GroupId(g)));
    return s;
  }

  std::vector<std::vector<BlockId>> Tables(const Req& r) const {
    std::vector<std::vector<BlockId>> t(m_->num_groups());
    for (int32_t g = 0; g < m_->num_groups(); ++g) {
      if (IsLinear(g)) continue;
      auto table = m_->BlockTable(H(*m_, r.id), GroupId(g));
      EXPECT_TRUE(table.ok()) << table.status();
      if (table.ok()) t[g].assign(table->begin(), table->end());
    }
    return t;
  }

  static std::string DescribeUsage(const KvCacheUsage& u) {
    std::string s = absl::StrCat("    usage: mapped ", u.mapped_bytes, "/", u.budget_bytes);
    for (const PoolUsage& p : u.pools) {
      absl::StrAppend(&s, " | g", p.group.value, " ", LayerKindName(p.kind), " bb ", p.block_bytes,
                      " used ", p.used_blocks, " cached ", p.cached_free_blocks, " clean ",
                      p.clean_blocks, " chunks ", p.mapped_chunks);
    }
    return s;
  }

  static void ExpectSameUsage(const KvCacheUsage& a, const KvCacheUsage& b) {
    ASSERT_EQ(a.budget_bytes, b.budget_bytes);
    ASSERT_EQ(a.mapped_bytes, b.mapped_bytes);
    ASSERT_EQ(a.used_bytes, b.used_bytes);
    ASSERT_EQ(a.pools.size(), b.pools.size());
    for (size_t i = 0; i < a.pools.size(); ++i) {
      ASSERT_EQ(a.pools[i].used_blocks, b.pools[i].used_blocks) << "group " << i;
      ASSERT_EQ(a.pools[i].cached_free_blocks, b.pools[i].cached_free_blocks) << "group " << i;
      ASSERT_EQ(a.pools[i].clean_blocks, b.pools[i].clean_blocks) << "group " << i;
      ASSERT_EQ(a.pools[i].mapped_chunks, b.pools[i].mapped_chunks) << "group " << i;
    }
  }

  void OpSchedule() {
    Req* r = Pick(Candidates(true));
    if (r == nullptr) return OpNewStep();
    const int64_t len = static_cast<int64_t>(r->tokens.size());
    if (r->allocated && r->computed == len - 1 && len >= r->max_len) return;  // waits to finish

    AllocationRequest req;
    std::optional<CacheHit> hit;
    int64_t c = r->computed;
    // Whether nothing but this step's blocks can change the pools' used counts (no window
    // release inside AllocateSlots).
    // (A host load's blocks are held until the first allocation, which gives back any that
    // a duplicate computed meanwhile serves instead.)
    bool exact_count = (!r->allocated && !r->host_held) ||
                       !(has_sliding_ || has_chunked_ || releases_state_);
    if (r->host_held) exact_count = false;
    if (!r->allocated && opt_.host_tier.has_value()) {
      bool wait = false;
      ASSERT_NO_FATAL_FAILURE(MaybeLoad(*r, &wait));
      if (wait) return;
    }
    if (!r->allocated) {
      auto h = m_->GetComputedBlocks(H(*m_, r->id));
      ASSERT_TRUE(h.ok()) << h.status();
      hit = *std::move(h);
      ASSERT_NO_FATAL_FAILURE(CheckHit(*r, *hit));
      ASSERT_NO_FATAL_FAILURE(CountQuery(*r, *hit));
      c = hit->num_tokens;
      req.hit = &*hit;
      if (opt_.avoid_empty_hits_with_state && has_linear_ && c == 0) req.hit = nullptr;
    } else {
      // Async scheduling: the last step may still be running on the device.
      const int64_t processed = Chance(0.3) ? std::max<int64_t>(0, c - Uniform(0, 3)) : c;
      req.num_processed_tokens = processed == c && Chance(0.5) ? -1 : processed;
      if (Chance(0.5) || releases_state_) {
        // Release dead window blocks (and replaced state blocks) first, so the all-or-nothing
        // check below is exact.
        AssertOk(m_->RemoveSkippedBlocks(H(*m_, r->id), processed));
        exact_count = true;
      }
      r->max_processed = std::max(r->max_processed, processed);
    }
    req.num_computed_tokens = c;

    // This step's tokens: a prefill chunk, or one decode token (+ drafts).
    const bool decode = r->allocated && c == len - 1;
    int64_t n = 0;
    int64_t num_drafts = 0;
    std::vector<int32_t> drafts;
    if (!decode) {
      const int64_t remaining = len - c;
      const int64_t to_boundary = (c / bs_ + 1) * bs_ - c + bs_ * Uniform(0, 3);
      const int64_t roll = Uniform(0, 9);
      n = roll < 4   ? remaining
          : roll < 7 ? std::min(remaining, to_boundary)
                     : Uniform(1, remaining);
    } else {
      n = 1;
      if (opt_.spec_decode && !has_linear_ && Chance(0.25)) {
        num_drafts = Uniform(1, 4);
        num_drafts = std::min(num_drafts, r->max_len - len);
      }
      n += num_drafts;
    }
    if (Chance(0.15)) req.num_lookahead_tokens = Uniform(1, 3);
    req.num_new_tokens = n;
    // The step's token sequence (drafts included) and its fingerprints.
    Req step_seq = *r;
    if (num_drafts > 0) {
      for (int64_t i = 0; i < num_drafts; ++i) {
        const int32_t t =
            Chance(0.6) ? NextToken(step_seq.fp.back()) : static_cast<int32_t>(Uniform(3000, 3047));
        drafts.push_back(t);
        step_seq.Push(t);
      }
      if (opt_.draft_flow == DraftFlow::kAppended) {
        AssertOk(m_->AppendTokens(H(*m_, r->id), drafts));
        for (int32_t t : drafts) r->Push(t);
      }
    }

    ASSERT_NO_FATAL_FAILURE(ConsumeEvents());
    (void)m_->TakeSlotsToZero();
    const Snapshot before = Take();
    const std::vector<std::vector<BlockId>> own_before = hit.has_value() ? hit->blocks : Tables(*r);
    auto needed = m_->BlocksNeeded(H(*m_, r->id), req);
    ASSERT_TRUE(needed.ok()) << needed.status();

    Log(absl::StrCat("AllocateSlots r", r->id.value, " c ", c, " n ", n, " drafts ", num_drafts,
                     " la ", req.num_lookahead_tokens, " processed ", req.num_processed_tokens,
                     hit.has_value() ? absl::StrCat(" hit ", hit->num_tokens) : "", " needs ",
                     *needed, " (len ", len, ")"));
    if (verbose_) Log(DescribeUsage(before.usage));
    const int64_t refusals_before = backing_ != nullptr ? backing_->refusals() : 0;
    auto ok = m_->AllocateSlots(H(*m_, r->id), req);
    ASSERT_TRUE(ok.ok()) << ok.status();
    AssertOk(m_->CheckInvariants());
    const bool refused = backing_ != nullptr && backing_->refusals() > refusals_before;
    // Write-back saves read blocks this step is about to overwrite: copy them first.
    if (*ok) {
      ASSERT_NO_FATAL_FAILURE(PumpTransfers());
    }
    if (!*ok) {
      ++stats_.failed_allocations;
      Log(refused ? "  -> false (map refused)" : "  -> false");
      if (refused) {
        ASSERT_FALSE(m_->backing_status().ok());
        ASSERT_NO_FATAL_FAILURE(ExpectNoRequestChanged(before, *r));
      } else {
        ASSERT_NO_FATAL_FAILURE(ExpectUnchanged(before, *r));
      }
      if (num_drafts > 0 && opt_.draft_flow == DraftFlow::kAppended) {
        // Nothing was allocated, so nothing can share the drafts' blocks.
        AssertOk(m_->RollbackTokens(H(*m_, r->id), num_drafts));
        r->Truncate(len);
      }
      return;
    }
    ++stats_.allocations;
    {
      // BlocksNeeded said how many blocks leave the free lists (new ones and hits now free).
      const KvCacheUsage u = m_->Usage();
      int64_t taken = 0;
      for (size_t g = 0; g < u.pools.size(); ++g) {
        if (mode_ == AccountingMode::kVllm && g > 0) break;  // one pool behind every group
        taken += u.pools[g].used_blocks - before.usage.pools[g].used_blocks;
      }
      if (exact_count) {
        ASSERT_EQ(taken, *needed) << "BlocksNeeded disagrees with what AllocateSlots took";
      } else {
        ASSERT_LE(taken, *needed);
      }
    }
    if (hit.has_value() && hit->num_tokens > 0) {
      ++stats_.hits;
      stats_.hit_tokens += hit->num_tokens;
      if (r->host_held) ++stats_.host_hits;
    }
    r->host_held = false;
    int32_t chunks_released = 0;
    const KvCacheUsage after_usage = m_->Usage();
    for (size_t i = 0; i < after_usage.pools.size(); ++i) {
      if (after_usage.pools[i].mapped_chunks < before.usage.pools[i].mapped_chunks)
        ++chunks_released;
    }
    if (chunks_released > 0) ++stats_.chunk_moves;

    ASSERT_NO_FATAL_FAILURE(
        CheckTables(*r, own_before, c + n + req.num_lookahead_tokens, hit.has_value()));
    ASSERT_NO_FATAL_FAILURE(WriteStep(*r, step_seq, c, n, req.num_lookahead_tokens));
    r->allocated = true;
    r->scheduled_step = step_;
    r->step_start = c;
    r->state_shared = (c + n) % bs_ == 0 && c + n <= static_cast<int64_t>(r->tokens.size());
    r->offered =
        std::max(r->offered, std::min<int64_t>(c + n, static_cast<int64_t>(r->tokens.size())));

    // After the step: the new K/V is computed; sample.
    if (num_drafts == 0) {
      r->computed = c + n;
      if (r->computed == static_cast<int64_t>(r->tokens.size())) {
        const int32_t t = NextToken(r->fp.back());
        AssertOk(m_->AppendTokens(H(*m_, r->id), {t}));
        r->Push(t);
      }
      return;
    }
    // Speculative step: accept a prefix of the drafts, then a bonus token.
    ++stats_.spec_steps;
    const int64_t accepted = Uniform(0, num_drafts);
    if (opt_.draft_flow == DraftFlow::kAppended) {
      if (accepted < num_drafts) {
        const absl::Status s = m_->RollbackTokens(H(*m_, r->id), num_drafts - accepted);
        if (absl::IsFailedPrecondition(s)) {
          // Another request already shares a block the drafts completed: appending drafts
          // before verifying them is misuse the manager refuses. Give the request up.
          Log("  rollback refused (shared block): finish the request");
          AssertOk(m_->Free(H(*m_, r->id)));
          RemoveLive(r);
          return;
        }
        Remember(*r);  // the sequence with its rejected drafts
        AssertOk(s);
        r->Truncate(len + accepted);
        r->offered = std::min<int64_t>(r->offered, len + accepted);
        ++stats_.rollbacks;
      }
    } else {
      const std::vector<int32_t> keep(drafts.begin(), drafts.begin() + accepted);
      AssertOk(m_->AppendTokens(H(*m_, r->id), keep));
      for (int32_t t : keep) r->Push(t);
    }
    Log(absl::StrCat("  accepted ", accepted, " of ", num_drafts));
    r->computed = len + accepted;
    const int32_t bonus = NextToken(r->fp.back());
    AssertOk(m_->AppendTokens(H(*m_, r->id), {bonus}));
    r->Push(bonus);
  }


  // A step refused by the backing: no request's table (but for the window blocks the request
  // released) and no pool's used blocks changed. Idle chunks may have been given back to make
  // room (their kRemoved events are left for the router's mirror), and the hit's blocks went
  // back to the cache.
  // Every live request's tables after a step that was refused or failed: only r's entries
  // may have changed, and only to the null block (blocks it released; `windows_only`: of a
  // sliding window). Sets *released when some did.
  void ExpectOnlyReleases(const Snapshot& before, const Snapshot& after, const Req& r,
                          bool windows_only, bool* released) {
    ASSERT_EQ(before.tables.size(), after.tables.size());
    for (size_t q = 0; q < before.tables.size(); ++q) {
      for (int32_t g = 0; g < m_->num_groups(); ++g) {
        const auto& a = before.tables[q][g];
        const auto& b = after.tables[q][g];
        ASSERT_EQ(a.size(), b.size()) << "request r" << live_[q]->id.value << " group " << g;
        for (size_t i = 0; i < a.size(); ++i) {
          if (a[i] == b[i]) continue;
          ASSERT_EQ(live_[q]->id, r.id) << "a failed allocation changed another request's table";
          if (windows_only) {
            ASSERT_TRUE(FreesSkipped(GroupId(g))) << "group " << g;
          }
          ASSERT_EQ(b[i], kNullBlock);
          *released = true;
        }
      }
    }
  }

  void ExpectNoRequestChanged(const Snapshot& before, const Req& r) {
    const Snapshot after = Take();
    bool window_freed = false;
    ASSERT_NO_FATAL_FAILURE(ExpectOnlyReleases(before, after, r, false, &window_freed));
    if (!window_freed) {
      for (size_t i = 0; i < before.usage.pools.size(); ++i) {
        ASSERT_EQ(before.usage.pools[i].used_blocks, after.usage.pools[i].used_blocks);
      }
    }
    ASSERT_TRUE(m_->TakeSlotsToZero().empty());
  }

  void ExpectUnchanged(const Snapshot& before, const Req& r) {
    const Snapshot after = Take();
    // AllocateSlots releases dead window blocks of the request even when it fails.
    bool window_freed = false;
    ASSERT_NO_FATAL_FAILURE(ExpectOnlyReleases(before, after, r, true, &window_freed));
    if (!window_freed) {
      ASSERT_NO_FATAL_FAILURE(ExpectSameUsage(before.usage, after.usage));
      for (int32_t g = 0; g < m_->num_groups(); ++g) {
        ASSERT_EQ(before.free_order[g], after.free_order[g]) << "free order of group " << g;
      }
    } else {
      ASSERT_EQ(before.usage.mapped_bytes, after.usage.mapped_bytes);
      for (size_t i = 0; i < before.usage.pools.size(); ++i) {
        const PoolUsage& a = before.usage.pools[i];
        const PoolUsage& b = after.usage.pools[i];
        ASSERT_EQ(a.mapped_chunks, b.mapped_chunks);
        ASSERT_EQ(a.used_blocks + a.cached_free_blocks + a.clean_blocks,
                  b.used_blocks + b.cached_free_blocks + b.clean_blocks);
      }
    }
    ASSERT_TRUE(m_->TakeSlotsToZero().empty());
    ASSERT_TRUE(m_->DrainEvents().empty()) << "a failed allocation emitted KV events";
  }

  void CheckTables(const Req& r, const std::vector<std::vector<BlockId>>& own_before, int64_t total,
                   bool first) {
    for (int32_t g = 0; g < m_->num_groups(); ++g) {
      if (IsLinear(g)) continue;
      auto table = m_->BlockTable(H(*m_, r.id), GroupId(g));
      ASSERT_TRUE(table.ok()) << table.status();
      const auto& old = own_before[g];
      const int64_t expect =
          std::max<int64_t>(static_cast<int64_t>(old.size()), CeilDiv(total, bs_));
      ASSERT_EQ(static_cast<int64_t>(table->size()), expect) << "group " << g;
      for (size_t i = 0; i < old.size(); ++i) {
        if ((*table)[i] == old[i]) continue;
        ASSERT_FALSE(first) << "a hit block was replaced in group " << g;
        ASSERT_TRUE(FreesSkipped(GroupId(g))) << "group " << g;
        ASSERT_EQ((*table)[i], kNullBlock);
      }
    }
  }

  // Records this step's writes in the shadow memory, checking the slots first.
  void WriteStep(const Req& r, const Req& seq, int64_t c, int64_t n, int64_t lookahead) {
    const auto holders = Holders(r.id);
    for (int32_t g = 0; g < m_->num_groups(); ++g) {
      const int32_t pk = PoolKey(g);
      if (IsLinear(g)) {
        auto s = m_->GetStateSlots(H(*m_, r.id), GroupId(g));
        ASSERT_TRUE(s.ok()) << s.status();
        ASSERT_GE(s->read_slot, 1);
        ASSERT_GE(s->write_slot, 1);
        if (c == 0) {
          ASSERT_EQ(s->read_slot, s->write_slot) << "a fresh state is written where it is zeroed";
          zero_expected_.push_back({g, s->write_slot});
        } else {
          const uint64_t state = shadow_state_.Read(pk, s->read_slot);
          ASSERT_NE(state, 0u) << "group " << g << " reads unwritten state slot " << s->read_slot;
          ASSERT_EQ(state, seq.fp[c]) << "group " << g << " state slot " << s->read_slot
                                      << " does not hold the state after " << c << " tokens";
        }
        auto w = step_writers_.find(Key(pk, s->write_slot));
        ASSERT_TRUE(w == step_writers_.end() || w->second == r.id.value)
            << "state slot " << s->write_slot << " of group " << g << " is also written by r"
            << w->second << " in this step";
        auto rd = step_state_readers_.find(Key(pk, s->write_slot));
        ASSERT_TRUE(rd == step_state_readers_.end() || rd->second == r.id.value)
            << "state slot " << s->write_slot << " is read by r" << rd->second << " in this step";
        auto rw = step_writers_.find(Key(pk, s->read_slot));
        ASSERT_TRUE(rw == step_writers_.end() || rw->second == r.id.value)
            << "state slot " << s->read_slot << " is written by r" << rw->second << " in this step";
        if (mode_ == AccountingMode::kVllm) {
          for (int32_t slot : {s->read_slot, s->write_slot}) {
            auto h = holders.find(Key(pk, slot));
            if (h == holders.end()) continue;
            for (const Holder& x : h->second) {
              ASSERT_EQ(x.group, g)
                  << "block " << slot << " is a state slot of group " << g << " and held by r"
                  << x.req->id.value << " in group " << x.group;
            }
          }
        }
        step_writers_[Key(pk, s->write_slot)] = r.id.value;
        step_state_readers_[Key(pk, s->read_slot)] = r.id.value;
        shadow_state_.Write(pk, s->write_slot, seq.fp[c + n]);
        continue;
      }
      std::vector<int64_t> slots(static_cast<size_t>(n + lookahead));
      AssertOk(m_->FillSlotMapping(H(*m_, r.id), GroupId(g), c, absl::MakeSpan(slots)));
      for (int64_t i = 0; i < n; ++i) {
        const int64_t pos = c + i;
        const int64_t block = slots[i] / bs_;
        ASSERT_EQ(slots[i] % bs_, pos % bs_);
        const uint64_t key = Key(pk, block);
        auto w = step_writers_.find(key);
        ASSERT_TRUE(w == step_writers_.end() || w->second == r.id.value)
            << "group " << g << " block " << block << " (position " << pos << " of r" << r.id.value
            << ") is also written by r" << w->second << " in this step";
        step_writers_[key] = r.id.value;
        const uint64_t content = seq.fp[pos + 1];
        auto h = holders.find(key);
        if (h != holders.end()) {
          for (const Holder& x : h->second) {
            ASSERT_EQ(x.group, g) << "block " << block << " written in group " << g
                                  << " is held by r" << x.req->id.value << " in group " << x.group;
            ASSERT_EQ(x.index, pos / bs_);
            if (pos < x.req->computed) {
              ASSERT_EQ(x.req->fp[pos + 1], content)
                  << "r" << r.id.value << " overwrites position " << pos << " of block " << block
                  << " in group " << g << ", which r" << x.req->id.value
                  << " shares and has computed";
            }
          }
        }
        shadow_kv_.Write(pk, slots[i], content);
      }
    }
    std::vector<SlotToZero> zero = m_->TakeSlotsToZero();
    ASSERT_EQ(zero.size(), zero_expected_.size());
    for (size_t i = 0; i < zero.size(); ++i) {
      ASSERT_EQ(zero[i].group.value, zero_expected_[i].first);
      ASSERT_EQ(zero[i].slot, zero_expected_[i].second);
    }
    zero_expected_.clear();
  }

  struct Holder {
    const Req* req;
    int32_t group;
    int64_t index;
  };

  // (pool, block) -> who else holds it: attention tables and current state slots.
  absl::flat_hash_map<uint64_t, std::vector<Holder>> Holders(RequestId except) const {
    absl::flat_hash_map<uint64_t, std::vector<Holder>> out;
    for (const auto& q : live_) {
      if (q->id == except || !q->allocated) continue;
      for (int32_t g = 0; g < m_->num_groups(); ++g) {
        if (IsLinear(g)) {
          auto s = m_->GetStateSlots(H(*m_, q->id), GroupId(g));
          if (!s.ok()) continue;
          for (int32_t slot : {s->read_slot, s->write_slot}) {
            if (slot > 0) out[Key(PoolKey(g), slot)].push_back({q.get(), g, -1});
          }
          continue;
        }
        auto t = m_->BlockTable(H(*m_, q->id), GroupId(g));
        if (!t.ok()) continue;
        for (size_t i = 0; i < t->size(); ++i) {
          if ((*t)[i] != kNullBlock) {
            out[Key(PoolKey(g), (*t)[i].value)].push_back({q.get(), g, static_cast<int64_t>(i)});
          }
        }
      }
    }
    return out;
  }

  // ---- Content checks ----

  void CountQuery(const Req& r, const CacheHit& hit) {
    if (!r.skip_read) {
      ++expected_stats_.queries;
      expected_stats_.queried_tokens += static_cast<int64_t>(r.tokens.size());
      expected_stats_.hit_tokens += hit.num_tokens;
    }
    const PrefixCacheStats s = m_->prefix_cache_stats();
    ASSERT_EQ(s.queries, expected_stats_.queries);
    ASSERT_EQ(s.queried_tokens, expected_stats_.queried_tokens);
    ASSERT_EQ(s.hit_tokens, expected_stats_.hit_tokens);
  }

  // The hit's blocks hold this request's prefix, and the events announced them.
  void CheckHit(const Req& r, const CacheHit& hit) {
    ASSERT_EQ(static_cast<int32_t>(hit.blocks.size()), m_->num_groups());
    ASSERT_EQ(hit.num_tokens % bs_, 0);
    ASSERT_LT(hit.num_tokens, static_cast<int64_t>(r.tokens.size()));
    if (r.skip_read) {
      ASSERT_EQ(hit.num_tokens, 0);
    }
    if (hit.num_tokens == 0) return;
    BlockHashExtras extras;
    extras.cache_salt = r.salt;
    RequestBlockHashes hashes(static_cast<int32_t>(bs_), extras);
    hashes.Update(*hasher_, r.tokens);
    const int64_t blocks = hit.num_tokens / bs_;
    for (int32_t g = 0; g < m_->num_groups(); ++g) {
      const int32_t pk = PoolKey(g);
      const auto& b = hit.blocks[g];
      if (IsLinear(g)) {
        ASSERT_EQ(b.size(), 1u);
        ASSERT_TRUE(mirror_.contains({g, hashes.hashes()[blocks - 1]}))
            << "hit snapshot of group " << g << " was never announced";
        ASSERT_EQ(shadow_state_.Read(pk, b[0].value), r.fp[hit.num_tokens])
            << "hit state slot " << b[0].value << " of group " << g << " holds another prefix";
        continue;
      }
      ASSERT_EQ(static_cast<int64_t>(b.size()), blocks) << "group " << g;
      for (int64_t i = 0; i < blocks; ++i) {
        if (b[i] == kNullBlock) {
          ASSERT_TRUE(FreesSkipped(GroupId(g))) << "group " << g;
          continue;
        }
        ASSERT_TRUE(mirror_.contains({g, hashes.hashes()[i]}))
            << "hit block " << i << " of group " << g << " was never announced";
        for (int64_t p = i * bs_; p < (i + 1) * bs_; ++p) {
          ASSERT_EQ(shadow_kv_.Read(pk, int64_t{b[i].value} * bs_ + p % bs_), r.fp[p + 1])
              << "hit block " << b[i].value << " (index " << i << ", group " << g
              << ") holds another prefix at position " << p << " for r" << r.id.value;
        }
      }
      if (FreesSkipped(GroupId(g))) {
        // The window (or chunk) of the first recomputed token must be covered.
        const int64_t first_needed = Skipped(GroupId(g), hit.num_tokens) / bs_;
        for (int64_t i = first_needed; i < blocks; ++i) ASSERT_NE(b[i], kNullBlock);
      }
    }
  }

  // Every computed position of the request still holds its own prefix.
  void CheckOwnContent(const Req& r) {
    if (!r.allocated) return;
    const auto tables = Tables(r);
    for (int32_t g = 0; g < m_->num_groups(); ++g) {
      const int32_t pk = PoolKey(g);
      if (IsLinear(g)) {
        auto s = m_->GetStateSlots(H(*m_, r.id), GroupId(g));
        ASSERT_TRUE(s.ok());
        // After a committed step the request reads its write slot of the last step.
        ASSERT_EQ(shadow_state_.Read(pk, s->write_slot), r.fp[r.computed])
            << "state of r" << r.id.value << " group " << g << " slot " << s->write_slot;
        continue;
      }
      const auto& t = tables[g];
      for (int64_t p = 0; p < r.computed; ++p) {
        const size_t i = static_cast<size_t>(p / bs_);
        ASSERT_LT(i, t.size());
        if (t[i] == kNullBlock) continue;
        ASSERT_EQ(shadow_kv_.Read(pk, int64_t{t[i].value} * bs_ + p % bs_), r.fp[p + 1])
            << "r" << r.id.value << " group " << g << " block " << t[i].value << " position " << p
            << " was overwritten";
      }
    }
  }

  void SweepContent() {
    for (const auto& r : live_) ASSERT_NO_FATAL_FAILURE(CheckOwnContent(*r));
    if (mode_ != AccountingMode::kVllm) return;
    // One block-id space: a block belongs to one group at a time.
    absl::flat_hash_map<int32_t, int32_t> owner;
    for (const auto& r : live_) {
      if (!r->allocated) continue;
      for (int32_t g = 0; g < m_->num_groups(); ++g) {
        std::vector<int32_t> ids;
        if (IsLinear(g)) {
          auto s = m_->GetStateSlots(H(*m_, r->id), GroupId(g));
          ASSERT_TRUE(s.ok()) << s.status();
          ids = {s->read_slot, s->write_slot};
        } else {
          auto t = m_->BlockTable(H(*m_, r->id), GroupId(g));
          ASSERT_TRUE(t.ok()) << t.status();
          for (BlockId b : *t) {
            if (b != kNullBlock) ids.push_back(b.value);
          }
        }
        for (int32_t id : ids) {
          auto [it, inserted] = owner.try_emplace(id, g);
          ASSERT_EQ(it->second, g)
              << "block " << id << " is held by groups " << it->second << " and " << g;
        }
      }
    }
  }

  // ---- Events ----

  void ConsumeEvents() {
    for (const KvEvent& e : m_->DrainEvents()) {
      if (e.medium == KvMedium::kHost) {
        ASSERT_NO_FATAL_FAILURE(MirrorHostEvent(e));
        continue;
      }
      switch (e.type) {
        case KvEvent::Type::kStored:
          ASSERT_TRUE(mirror_.insert({e.group.value, e.hash}).second)
              << "stored twice without removal: group " << e.group.value;
          break;
        case KvEvent::Type::kRemoved:
          ASSERT_EQ(mirror_.erase({e.group.value, e.hash}), 1u)
              << "removed a hash never stored: group " << e.group.value;
          ++stats_.evictions;
          break;
        case KvEvent::Type::kAllCleared:
          ASSERT_TRUE(expect_all_cleared_) << "unexpected kAllCleared";
          mirror_.clear();
          break;
      }
    }
    expect_all_cleared_ = false;
  }

  // ---- Host tier ----

  // Starts loading r's prefix from the host tier, or waits for the load in flight; *wait =
  // true while r must not be allocated.
  void MaybeLoad(Req& r, bool* wait) {
    if (r.loading) {
      auto loading = m_->IsLoading(H(*m_, r.id));
      ASSERT_TRUE(loading.ok()) << loading.status();
      r.loading = *loading;
      *wait = r.loading;
      return;
    }
    auto loaded = m_->LoadFromHost(H(*m_, r.id));
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    if (*loaded == 0) return;
    Log(absl::StrCat("LoadFromHost r", r.id.value, " -> ", *loaded, " tokens"));
    ++stats_.host_loads;
    r.loading = r.host_held = true;
    *wait = true;
  }

  // Takes the queued copies and runs them on the shadow memory, as a server would on the
  // device: a save copies a device block's contents to its host slot, a load the reverse.
  void PumpTransfers() {
    if (!opt_.host_tier.has_value()) return;
    const TierTransfers t = m_->TakeTransfers();
    if (t.id == 0) return;
    Log(absl::StrCat("transfer ", t.id, ": ", t.saves.size(), " saves, ", t.loads.size(),
                     " loads"));
    for (const TierCopy& c : t.saves) Copy(c.group, c.device.value, c.host, /*to_host=*/true);
    for (const TierCopy& c : t.loads) Copy(c.group, c.host, c.device.value, /*to_host=*/false);
    open_transfers_.push_back(t.id);
  }

  void Copy(GroupId group, int64_t from, int64_t to, bool to_host) {
    const int32_t pk = PoolKey(group.value);
    if (IsLinear(group.value)) {
      ShadowMemory& src = to_host ? shadow_state_ : host_state_;
      (to_host ? host_state_ : shadow_state_).Write(pk, to, src.Read(pk, from));
      return;
    }
    ShadowMemory& src = to_host ? shadow_kv_ : host_kv_;
    ShadowMemory& dst = to_host ? host_kv_ : shadow_kv_;
    for (int64_t i = 0; i < bs_; ++i) dst.Write(pk, to * bs_ + i, src.Read(pk, from * bs_ + i));
  }

  void OpCompleteTransfer() {
    if (open_transfers_.empty()) return OpSchedule();
    const size_t i = static_cast<size_t>(Uniform(0, static_cast<int64_t>(open_transfers_.size()) - 1));
    const uint64_t id = open_transfers_[i];
    const bool succeeded = !Chance(0.1);
    open_transfers_.erase(open_transfers_.begin() + static_cast<std::ptrdiff_t>(i));
    Log(absl::StrCat("CompleteTransfers ", id, succeeded ? "" : " (failed)"));
    AssertOk(m_->CompleteTransfers(id, succeeded));
  }

  void CompleteAllTransfers() {
    ASSERT_NO_FATAL_FAILURE(PumpTransfers());
    for (uint64_t id : open_transfers_) AssertOk(m_->CompleteTransfers(id));
    open_transfers_.clear();
    // Completing a load can free nothing new, but completed saves queue no more copies.
    ASSERT_NO_FATAL_FAILURE(PumpTransfers());
    for (uint64_t id : open_transfers_) AssertOk(m_->CompleteTransfers(id));
    open_transfers_.clear();
    ASSERT_NO_FATAL_FAILURE(ConsumeEvents());
  }

  void MirrorHostEvent(const KvEvent& e) {
    const std::pair<int32_t, BlockHash> key{e.group.value, e.hash};
    if (e.type == KvEvent::Type::kStored) {
      ASSERT_TRUE(host_mirror_.insert(key).second) << "host tier stored a hash twice";
    } else {
      ASSERT_EQ(e.type, KvEvent::Type::kRemoved);
      ASSERT_EQ(host_mirror_.erase(key), 1u) << "host tier removed a hash it never stored";
    }
  }

  // ---- Bookkeeping ----

  void Remember(const Req& r) {
    history_.push_back({r.tokens, r.salt});
    if (history_.size() > 16) history_.pop_front();
  }
  void RemoveLive(Req* r) {
    std::erase_if(live_, [r](const std::unique_ptr<Req>& x) { return x.get() == r; });
  }
  void ReplaceLive(Req* r, std::unique_ptr<Req> fresh) {
    for (auto& x : live_) {
      if (x.get() == r) x = std::move(fresh);
    }
  }

  void DrainAll() {
    while (!live_.empty()) {
      AssertOk(m_->Free(H(*m_, live_.back()->id)));
      live_.pop_back();
      AssertOk(m_->CheckInvariants());
    }
    ASSERT_NO_FATAL_FAILURE(CompleteAllTransfers());
    ASSERT_NO_FATAL_FAILURE(ConsumeEvents());
    const KvCacheUsage u = m_->Usage();
    ASSERT_EQ(u.used_bytes, 0);
    for (const PoolUsage& p : u.pools) ASSERT_EQ(p.used_blocks, 0);
    AssertOk(m_->CheckInvariants());
    ASSERT_EQ(m_->num_requests(), 0);
    if (backing_ != nullptr) {
      stats_.refused_maps = backing_->refusals();
      ASSERT_EQ(backing_->misuse(), "");
      m_->CompleteStep();  // no step pending: the release runs now
      m_->ReleaseIdleChunks();
      ASSERT_EQ(backing_->num_mapped(), 0);
      ASSERT_EQ(m_->Usage().mapped_bytes, 0);
    }
  }

  struct PairHash {
    size_t operator()(const std::pair<int32_t, BlockHash>& k) const {
      return static_cast<size_t>(
          Mix(k.second.lo ^ Mix(k.second.hi + static_cast<uint64_t>(k.first))));
    }
  };

  const std::string label_;
  const ModelSpec spec_;
  const AccountingMode mode_;
  std::mt19937_64 rng_;
  const Options opt_;
  Stats stats_;

  // Whether group g frees the blocks of skipped tokens (a window's past, finished chunks).
  bool FreesSkipped(GroupId g) const {
    const LayerKind kind = m_->group_kind(g);
    return kind == LayerKind::kSlidingWindow || kind == LayerKind::kChunkedLocal;
  }
  // The leading tokens of the first `processed` that no token from `processed` on reads in
  // group g (the manager's SkippedTokens, restated).
  int64_t Skipped(GroupId g, int64_t processed) const {
    switch (m_->group_kind(g)) {
      case LayerKind::kSlidingWindow: return std::max<int64_t>(0, processed - window_ + 1);
      case LayerKind::kChunkedLocal: return processed / chunk_ * chunk_;
      default: return 0;
    }
  }

  std::unique_ptr<FlakyBacking> backing_;  // outlives m_
  std::unique_ptr<KvCacheManager> m_;
  std::unique_ptr<BlockHasher> hasher_;
  int64_t bs_ = 0;
  int32_t window_ = 0;
  int32_t chunk_ = 0;  // attention_chunk_size of the chunked-local layers
  bool has_linear_ = false;
  bool has_sliding_ = false;
  bool has_chunked_ = false;  // a chunked-local group (kvpage mode; vLLM promotes hybrids)
  bool releases_state_ = false;  // AllocateSlots frees replaced state blocks (vllm 0.33)
  int32_t max_live_ = 8;
  int64_t max_len_ = 0;
  std::vector<std::vector<int32_t>> prefixes_, documents_;

  std::vector<std::unique_ptr<Req>> live_;
  std::deque<std::pair<std::vector<int32_t>, std::string>> history_;
  int64_t next_id_ = 1;
  int64_t step_ = 0;
  absl::flat_hash_map<uint64_t, int64_t> step_writers_;  // (pool, block/state slot) -> request
  absl::flat_hash_map<uint64_t, int64_t> step_state_readers_;  // (pool, state slot) -> request
  ShadowMemory shadow_kv_;     // (pool, token slot) -> prefix fingerprint
  ShadowMemory shadow_state_;  // (pool, state slot) -> prefix fingerprint
  ShadowMemory host_kv_;       // (pool, host slot · block size + offset) -> fingerprint
  ShadowMemory host_state_;    // (pool, host slot) -> fingerprint
  std::vector<uint64_t> open_transfers_;  // taken, not completed
  std::vector<std::pair<int32_t, int32_t>> zero_expected_;
  absl::flat_hash_set<std::pair<int32_t, BlockHash>, PairHash> mirror_;
  absl::flat_hash_set<std::pair<int32_t, BlockHash>, PairHash> host_mirror_;  // medium kHost
  bool expect_all_cleared_ = false;
  PrefixCacheStats expected_stats_;
  struct Geometry {
    int64_t bpc = 1;
    int64_t chunk_bytes = 0;
    int64_t max_chunks = 0;
  };
  std::vector<Geometry> geo_;  // per pool (= per group in kvpage mode)
  std::deque<std::string> log_;
  const bool verbose_ = std::getenv("KVPAGE_FUZZ_VERBOSE") != nullptr;
};

// ---- Bugs the fuzzer found, kept as small deterministic regression tests --------------------------
//
// Before their fixes, the two chunk-move bugs aborted on KVPAGE_DCHECK in a debug build and
// corrupted memory in a release build (BlockPool::Allocate evicted from an empty LRU list).

using testing::Concat;
using testing::Ids;
using testing::Tokens;

// kTinyHybridSwa in kvpage mode with 2 KiB chunks: group 0 (full attention, 512-byte blocks)
// gets 4 blocks per chunk, group 1 (sliding window 32, 1024-byte blocks) 2 blocks per chunk.
std::unique_ptr<KvCacheManager> SwaManager(int64_t budget) {
  KvCacheConfig c;
  c.kv_budget_bytes = budget;
  c.chunk_bytes = 2048;
  c.hash_seed = 11;
  auto spec = ParseModelSpec(testing::kTinyHybridSwa, "tiny_swa", "tiny");
  EXPECT_TRUE(spec.ok()) << spec.status();
  auto m = KvCacheManager::Create(*spec, c);
  EXPECT_TRUE(m.ok()) << m.status();
  return *std::move(m);
}

void Prefill(KvCacheManager& m, int64_t id, const std::vector<int32_t>& prompt) {
  ASSERT_TRUE(m.AddRequest({RequestId(id), prompt}).ok());
  auto ok = m.AllocateSlots(H(m, RequestId(id)), {.num_new_tokens = static_cast<int64_t>(prompt.size())});
  ASSERT_TRUE(ok.ok()) << ok.status();
  ASSERT_TRUE(*ok);
  m.CompleteStep();  // the prefill has run: its full blocks are cached
  ASSERT_TRUE(m.CheckInvariants().ok()) << m.CheckInvariants();
}

// Fixed bug: CanTake() counts an idle chunk as spare (to be given to another pool) although the hit
// blocks it holds are about to be touched, which makes the chunk busy. TakeFromPool then finds
// nothing to release and BlockPool::Allocate runs past the end of its free blocks.
TEST(KvCacheManagerFuzzRepro, HitBlocksInAnIdleChunkAreCountedAsSpare) {
  auto m = SwaManager(12 * 2048 + 1024);  // 12 chunks + 1 KiB that no chunk fits in
  // rH: 32 tokens, its two blocks alone in chunk 0 of both groups. Three longer requests fill
  // the rest of the 12 chunks exactly (group 0: 4 chunks, group 1: 8).
  ASSERT_NO_FATAL_FAILURE(Prefill(*m, 1, Tokens(32)));
  ASSERT_NO_FATAL_FAILURE(Prefill(*m, 2, Tokens(49, 1000)));
  ASSERT_NO_FATAL_FAILURE(Prefill(*m, 3, Tokens(49, 2000)));
  ASSERT_NO_FATAL_FAILURE(Prefill(*m, 4, Tokens(81, 3000)));
  // rH finishes: its blocks stay cached, group 1's chunk 0 is idle. Each long request releases
  // its first (out-of-window) sliding block: free blocks in group-1 chunks that stay busy.
  ASSERT_TRUE(m->Free(H(*m, RequestId(1))).ok());
  ASSERT_TRUE(m->RemoveSkippedBlocks(H(*m, RequestId(2)), 49).ok());
  ASSERT_TRUE(m->RemoveSkippedBlocks(H(*m, RequestId(3)), 49).ok());
  ASSERT_TRUE(m->RemoveSkippedBlocks(H(*m, RequestId(4)), 47).ok());
  ASSERT_TRUE(m->CheckInvariants().ok()) << m->CheckInvariants();
  KvCacheUsage u = m->Usage();
  ASSERT_EQ(u.mapped_bytes, 12 * 2048);
  ASSERT_EQ(u.pools[0].mapped_chunks, 4);
  ASSERT_EQ(u.pools[0].cached_free_blocks + u.pools[0].clean_blocks, 2);  // rH's 1, 2
  ASSERT_EQ(u.pools[1].mapped_chunks, 8);
  ASSERT_EQ(u.pools[1].cached_free_blocks + u.pools[1].clean_blocks, 5);  // 1, 2 | 3, 7, 11

  // 33 tokens hit rH's 32 in both groups and need one new block in each. Group 0 needs a chunk;
  // CanTake counts group 1's idle chunk 0 as spare, but it holds the two sliding hit blocks.
  ASSERT_TRUE(m->AddRequest({RequestId(5), Concat(Tokens(32), Tokens(1, 7000))}).ok());
  auto hit = m->GetComputedBlocks(H(*m, RequestId(5)));
  ASSERT_TRUE(hit.ok());
  ASSERT_EQ(hit->num_tokens, 32);
  ASSERT_EQ(Ids(hit->blocks[0]), (std::vector<int32_t>{1, 2}));
  ASSERT_EQ(Ids(hit->blocks[1]), (std::vector<int32_t>{1, 2}));
  const std::vector<BlockId> order0 = m->FreeBlockOrder(GroupId(0));
  const std::vector<BlockId> order1 = m->FreeBlockOrder(GroupId(1));
  // Expected: no memory for this step, so false and nothing changed.
  // Observed: KVPAGE_DCHECK(pool.AllocatableNow() >= n) in TakeFromPool (debug) / an eviction
  // from an empty LRU list in BlockPool::Allocate (release).
  auto ok = m->AllocateSlots(H(*m, RequestId(5)),
                             {.num_computed_tokens = 32, .num_new_tokens = 1, .hit = &*hit});
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_FALSE(*ok);
  EXPECT_TRUE(m->CheckInvariants().ok()) << m->CheckInvariants();
  EXPECT_EQ(m->FreeBlockOrder(GroupId(0)), order0);
  EXPECT_EQ(m->FreeBlockOrder(GroupId(1)), order1);
}

// Fixed bug: a pool served early maps fresh chunks instead of evicting its own cached blocks (as
// BlockPool::Allocate prefers while the budget's free bytes exceed its headroom), spending
// bytes that CanTake() had set aside for a pool served later, which then cannot get its chunks.
TEST(KvCacheManagerFuzzRepro, FirstPoolSpendsTheBytesALaterPoolNeeds) {
  auto m = SwaManager(9 * 2048);  // headroom: min(2 chunks, budget / 4) = 4096 bytes
  ASSERT_NO_FATAL_FAILURE(Prefill(*m, 1, Tokens(33)));  // 3 blocks per group, 2 of them cached
  ASSERT_TRUE(m->Free(H(*m, RequestId(1))).ok());
  KvCacheUsage u = m->Usage();
  ASSERT_EQ(u.mapped_bytes, 3 * 2048);
  ASSERT_EQ(u.pools[0].cached_free_blocks, 2);  // group 0: 2 cached + 2 clean in one chunk
  ASSERT_EQ(u.pools[0].clean_blocks, 2);
  ASSERT_EQ(u.pools[1].cached_free_blocks, 2);  // group 1: 2 cached + 2 clean in two chunks
  ASSERT_EQ(u.pools[1].clean_blocks, 2);

  // 192 unrelated tokens: 12 blocks per group. Group 0 can serve them from its 4 free blocks
  // (evicting 2) and 2 new chunks; group 1 needs its 4 free blocks and 4 new chunks: exactly
  // the 6 chunks left in the budget. CanTake agrees.
  ASSERT_TRUE(m->AddRequest({RequestId(2), Tokens(192, 1000)}).ok());
  EXPECT_EQ(*m->BlocksNeeded(H(*m, RequestId(2)), {.num_new_tokens = 192}), 24);
  // Expected: true, group 0 mapping 2 chunks and group 1 mapping 4.
  // Observed: group 0 maps a third chunk to keep its 2 cached blocks (6 KiB free > 4 KiB
  // headroom), group 1 can map only 3, and KVPAGE_DCHECK(pool.AllocatableNow() >= n) fires
  // (debug) / BlockPool::Allocate evicts from an empty LRU list (release).
  auto ok = m->AllocateSlots(H(*m, RequestId(2)), {.num_new_tokens = 192});
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE(*ok);
  EXPECT_TRUE(m->CheckInvariants().ok()) << m->CheckInvariants();
  u = m->Usage();
  EXPECT_EQ(u.pools[0].mapped_chunks, 3);
  EXPECT_EQ(u.pools[1].mapped_chunks, 6);
}

// Fixed bug: RollbackTokens drops the request's hashes of the blocks the rolled-back tokens completed,
// but the pool keeps serving those blocks under the old hashes. The request then overwrites
// them with its new tokens (and CacheBlock never re-registers them: they are still hashed), so
// a later request with the old prefix gets another prefix's K/V.
TEST(KvCacheManagerFuzzRepro, RollbackLeavesStaleHashInPool) {
  KvCacheConfig c;
  c.kv_budget_bytes = 10 * 16 * 32;  // kTinyFull: 10 blocks of 16 tokens
  c.chunk_bytes = c.kv_budget_bytes;
  c.hash_seed = 7;
  auto spec = ParseModelSpec(testing::kTinyFull, "tiny_full", "tiny");
  ASSERT_TRUE(spec.ok());
  auto created = KvCacheManager::Create(*spec, c);
  ASSERT_TRUE(created.ok());
  KvCacheManager& m = **created;
  // Prompt of 10 tokens; then 7 tokens (sampled, or drafts appended before the step) computed
  // in one step complete block 0, which is cached.
  const std::vector<int32_t> old_tail = Tokens(7, 500);
  ASSERT_NO_FATAL_FAILURE(Prefill(m, 1, Tokens(10)));
  ASSERT_TRUE(m.AppendTokens(H(m, RequestId(1)), old_tail).ok());
  ASSERT_TRUE(*m.AllocateSlots(H(m, RequestId(1)), {.num_computed_tokens = 10, .num_new_tokens = 7}));
  m.CompleteStep();
  // Tokens 14..16 are withdrawn: block 0 (tokens 0..15) is no longer what its hash says.
  ASSERT_TRUE(m.RollbackTokens(H(m, RequestId(1)), 3).ok());
  ASSERT_TRUE(m.CheckInvariants().ok());

  // Expected: the old 16-token prefix is no longer served from request 1's block.
  // Observed: hit of 16 tokens in block 1, which request 1 is about to overwrite.
  ASSERT_TRUE(m.AddRequest({RequestId(2), Concat(Tokens(10), old_tail)}).ok());
  auto hit = m.GetComputedBlocks(H(m, RequestId(2)));
  ASSERT_TRUE(hit.ok());
  EXPECT_EQ(hit->num_tokens, 0) << "block "
                                << (hit->blocks[0].empty() ? -1 : hit->blocks[0][0].value);

  // Request 1 recomputes positions 13..15 with new tokens and frees its blocks: block 0 now
  // holds the new prefix, which should be what a third request hits.
  const std::vector<int32_t> new_tail = Tokens(4, 900);
  ASSERT_TRUE(m.AppendTokens(H(m, RequestId(1)), new_tail).ok());
  ASSERT_TRUE(*m.AllocateSlots(H(m, RequestId(1)), {.num_computed_tokens = 13, .num_new_tokens = 5}));
  m.CompleteStep();
  ASSERT_TRUE(m.Free(H(m, RequestId(1))).ok());
  std::vector<int32_t> new_prefix = Concat(Concat(Tokens(10), Tokens(4, 500)), new_tail);
  ASSERT_TRUE(m.AddRequest({RequestId(3), new_prefix}).ok());
  EXPECT_EQ(m.GetComputedBlocks(H(m, RequestId(3)))->num_tokens, 16) << "the new prefix is not served";
  ASSERT_TRUE(m.AddRequest({RequestId(4), Concat(Tokens(10), old_tail)}).ok());
  EXPECT_EQ(m.GetComputedBlocks(H(m, RequestId(4)))->num_tokens, 0) << "the old prefix is still served";
}

// Fixed bug (issue 25 item 9): RollbackTokens accepted a rollback into blocks the sliding window
// had already freed. The request's table then lacks a block the window of its last token reads
// (the K/V is gone: the freed block may be evicted and reused), and a preempted copy of the
// request cannot hit its prefix. Found as "a preempted and re-added request gets 0 cached tokens
// where 32 are expected" on gemma3_4b_w48 (vllm accounting, 21 tokens rolled back).
TEST(KvCacheManagerFuzzRepro, RollbackIntoFreedWindowBlocks) {
  auto m = SwaManager(64 * 2048);  // kTinyHybridSwa: group 1 slides a 32-token window
  ASSERT_NO_FATAL_FAILURE(Prefill(*m, 1, Tokens(10)));
  const RequestHandle h = H(*m, RequestId(1));
  // Decode to 60 tokens, one token per step; the step computing token 59 frees block 0 of the
  // sliding group (token 59 reads [28, 59]: block 0 holds 0..15).
  for (int64_t n = 10; n < 60; ++n) {
    ASSERT_TRUE(m->AppendTokens(h, {static_cast<int32_t>(100 + n)}).ok());
    auto ok = m->AllocateSlots(h, {.num_computed_tokens = n, .num_new_tokens = 1});
    ASSERT_TRUE(ok.ok() && *ok) << ok.status();
  }
  auto table = m->BlockTable(h, GroupId(1));
  ASSERT_TRUE(table.ok());
  ASSERT_EQ(table->size(), 4u);
  ASSERT_EQ((*table)[0], kNullBlock);
  ASSERT_NE((*table)[1], kNullBlock);
  const std::vector<BlockId> before(table->begin(), table->end());

  // Keeping 47 tokens: token 46 reads [15, 46], which starts in the freed block 0.
  // Expected: FailedPrecondition naming block 0 of group 1, nothing changed.
  // Observed: OK, and the request goes on with block 0 missing from its window.
  const absl::Status refused = m->RollbackTokens(h, 13);
  EXPECT_TRUE(absl::IsFailedPrecondition(refused)) << refused;
  EXPECT_EQ(refused.message(),
            "cannot compute token 46 of request 1 again: block 0 of sliding-window group 1, "
            "which its window reads, is already freed");
  EXPECT_EQ(m->Tokens(h)->size(), 60u);
  EXPECT_EQ(std::vector<BlockId>(m->BlockTable(h, GroupId(1))->begin(),
                                 m->BlockTable(h, GroupId(1))->end()),
            before);
  // Keeping 48 tokens: token 47 reads [16, 47], blocks 1 and 2, both held.
  EXPECT_TRUE(m->RollbackTokens(h, 12).ok());
  EXPECT_EQ(m->Tokens(h)->size(), 48u);
  EXPECT_TRUE(m->CheckInvariants().ok()) << m->CheckInvariants();
}

// Fixed bug: a miss from GetComputedBlocks (num_tokens 0, every group's list empty) passed as `hit`,
// as the header's usage example does, makes PlanState read hit->blocks[g][0] of an empty vector
// for each linear-attention group (and Allocate step 2 does the same).
TEST(KvCacheManagerFuzzRepro, EmptyHitCrashesLinearAttentionModels) {
  KvCacheConfig c;
  c.kv_budget_bytes = 1 << 20;
  c.chunk_bytes = 64 << 10;
  c.hash_seed = 3;
  auto spec = ParseModelSpec(testing::kTinyGdn, "tiny_gdn", "tiny");
  ASSERT_TRUE(spec.ok());
  auto created = KvCacheManager::Create(*spec, c);
  ASSERT_TRUE(created.ok());
  KvCacheManager& m = **created;
  ASSERT_TRUE(m.AddRequest({RequestId(1), Tokens(20)}).ok());
  auto hit = m.GetComputedBlocks(H(m, RequestId(1)));
  ASSERT_TRUE(hit.ok());
  ASSERT_EQ(hit->num_tokens, 0);
  ASSERT_EQ(hit->blocks.size(), 2u);
  ASSERT_TRUE(hit->blocks[0].empty() && hit->blocks[1].empty());
  const AllocationRequest req{.num_computed_tokens = 0, .num_new_tokens = 20, .hit = &*hit};
  // Expected: the same as without a hit: 2 blocks of attention + 1 state slot, then true.
  // Observed: out-of-bounds read of hit->blocks[g][0] (SIGSEGV).
  auto needed = m.BlocksNeeded(H(m, RequestId(1)), req);
  ASSERT_TRUE(needed.ok()) << needed.status();
  EXPECT_EQ(*needed, 3);
  auto ok = m.AllocateSlots(H(m, RequestId(1)), req);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE(*ok);
  EXPECT_EQ(m.TakeSlotsToZero().size(), 1u);
  EXPECT_TRUE(m.CheckInvariants().ok()) << m.CheckInvariants();
}

// ---- Test cases ---------------------------------------------------------------------------------

struct FuzzCase {
  std::string model;
  AccountingMode mode;
};

void PrintTo(const FuzzCase& c, std::ostream* os) {
  *os << c.model << (c.mode == AccountingMode::kVllm ? "/vllm" : "/kvpage");
}

class KvCacheManagerFuzzTest : public ::testing::TestWithParam<FuzzCase> {};

void RunCase(const FuzzCase& fc, const Options& options, const std::vector<uint64_t>& seeds) {
  auto spec = LoadCase(fc.model);
  ASSERT_TRUE(spec.ok()) << spec.status();
  Stats total;
  for (uint64_t seed : seeds) {
    SCOPED_TRACE(absl::StrCat("seed ", seed));
    Fuzzer f(fc.model, *spec, fc.mode,
             seed ^ Fnv(fc.model) ^ (fc.mode == AccountingMode::kVllm ? 0x7f4a7c15 : 0), options);
    ASSERT_NO_FATAL_FAILURE(f.Run());
    total.Add(f.stats());
  }
  std::printf(
      "[ fuzz     ] %-18s %-6s bs %" PRId64 " ops %" PRId64 " adds %" PRId64 " allocs %" PRId64
      " failed %" PRId64 " hits %" PRId64 " (%" PRId64 " tokens) preempts %" PRId64 " (hit %" PRId64
      ") spec %" PRId64 " rollbacks %" PRId64 " evictions %" PRId64 " chunk-moves %" PRId64
      " resets %" PRId64 " max-live %" PRId64 " host-loads %" PRId64 " (hits %" PRId64 ")\n",
      fc.model.c_str(), fc.mode == AccountingMode::kVllm ? "vllm" : "kvpage", total.block_size,
      total.ops, total.adds, total.allocations, total.failed_allocations, total.hits,
      total.hit_tokens, total.preempts, total.preempt_hits, total.spec_steps, total.rollbacks,
      total.evictions, total.chunk_moves, total.resets, total.max_live, total.host_loads,
      total.host_hits);
  // The run must have exercised the interesting paths.
  EXPECT_GT(total.failed_allocations, 0) << "no memory pressure";
  EXPECT_GT(total.hits, 0) << "no prefix hits";
  EXPECT_GT(total.evictions, 0) << "no evictions";
  if (options.host_tier.has_value()) {
    EXPECT_GT(total.host_hits, 0) << "no hit came from the host";
  }
  if (options.refuse_map_chance > 0) {
    std::printf("[ fuzz     ] %-18s refused maps %" PRId64 "\n", fc.model.c_str(),
                total.refused_maps);
    // (vllm accounting maps its one chunk once per run.)
    if (fc.mode == AccountingMode::kKvpage) {
      EXPECT_GT(total.refused_maps, 0) << "none refused";
    }
  }
}

// Run length from the environment, so anyone can run a long campaign without rebuilding:
//   KVPAGE_FUZZ_OPS        operations per seed (default 2000)
//   KVPAGE_FUZZ_SEEDS      seeds per case (default 3)
//   KVPAGE_FUZZ_SEED_BASE  first seed (default 1): seeds are BASE, BASE + 1, ...
// A value that is not a whole number in range fails the test rather than silently running
// the default.
int64_t EnvInt(const char* name, int64_t fallback, int64_t lo, int64_t hi) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return fallback;
  int64_t v = 0;
  if (!absl::SimpleAtoi(text, &v) || v < lo || v > hi) {
    ADD_FAILURE() << name << "=" << text << " is not an integer in [" << lo << ", " << hi << "]";
    return fallback;
  }
  return v;
}

Options WithEnv(Options o) {
  o.num_ops = static_cast<int32_t>(EnvInt("KVPAGE_FUZZ_OPS", o.num_ops, 0, INT32_MAX));
  return o;
}

std::vector<uint64_t> EnvSeeds() {
  const int64_t n = EnvInt("KVPAGE_FUZZ_SEEDS", 3, 1, 1 << 20);
  const int64_t base = EnvInt("KVPAGE_FUZZ_SEED_BASE", 1, 0, INT64_MAX - (1 << 20));
  std::vector<uint64_t> seeds;
  for (int64_t i = 0; i < n; ++i) seeds.push_back(static_cast<uint64_t>(base + i));
  return seeds;
}

TEST_P(KvCacheManagerFuzzTest, RandomOperations) {
  RunCase(GetParam(), WithEnv(Options{}), EnvSeeds());
}

TEST_P(KvCacheManagerFuzzTest, RandomOperationsRollingBackCachedBlocks) {
  Options o;
  o.rollback_across_blocks = true;  // RollbackLeavesStaleHashInPool
  RunCase(GetParam(), WithEnv(o), EnvSeeds());
}

// A backing that refuses one map in four: refused steps change no request, and the run still
// ends with every block free, every chunk unmapped and the invariants holding.
TEST_P(KvCacheManagerFuzzTest, RandomOperationsWithRefusedMaps) {
  Options o;
  o.refuse_map_chance = 0.25;
  RunCase(GetParam(), WithEnv(o), EnvSeeds());
}

TEST_P(KvCacheManagerFuzzTest, RandomOperationsWithAppendedDrafts) {
  Options o;
  o.draft_flow = DraftFlow::kAppended;  // rejected drafts are rolled back: the same stale hashes
  RunCase(GetParam(), WithEnv(o), EnvSeeds());
}

// The host tier exists under kvpage accounting only.
class KvCacheManagerHostTierFuzzTest : public ::testing::TestWithParam<FuzzCase> {};

TEST_P(KvCacheManagerHostTierFuzzTest, RandomOperations) {
  for (HostTierPolicy policy : {HostTierPolicy::kWriteThrough, HostTierPolicy::kWriteBack}) {
    SCOPED_TRACE(policy == HostTierPolicy::kWriteBack ? "write-back" : "write-through");
    Options o;
    o.host_tier = policy;
    RunCase(GetParam(), WithEnv(o), EnvSeeds());
  }
}

std::vector<FuzzCase> AllCases() {
  std::vector<FuzzCase> cases;
  for (const char* model : {"tiny_full", "tiny_swa", "tiny_chunked", "tiny_gdn", "tiny_dsa",
                            "tiny_jamba", "tiny_minimax", "tiny_kimi", "qwen3_5_0_8b", "gemma3_4b",
                            "gemma3_4b_w48", "deepseek_v2_lite", "deepseek_v3_2"}) {
    for (AccountingMode mode : {AccountingMode::kKvpage, AccountingMode::kVllm}) {
      cases.push_back({model, mode});
    }
  }
  return cases;
}

std::vector<FuzzCase> KvpageCases() {
  std::vector<FuzzCase> cases = AllCases();
  std::erase_if(cases, [](const FuzzCase& c) { return c.mode != AccountingMode::kKvpage; });
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Models, KvCacheManagerHostTierFuzzTest, ::testing::ValuesIn(KvpageCases()),
                         [](const ::testing::TestParamInfo<FuzzCase>& p) { return p.param.model; });

INSTANTIATE_TEST_SUITE_P(Models, KvCacheManagerFuzzTest, ::testing::ValuesIn(AllCases()),
                         [](const ::testing::TestParamInfo<FuzzCase>& p) {
                           return absl::StrCat(p.param.model, p.param.mode == AccountingMode::kVllm
                                                                  ? "_vllm"
                                                                  : "_kvpage");
                         });

}  // namespace
}  // namespace kvpage
