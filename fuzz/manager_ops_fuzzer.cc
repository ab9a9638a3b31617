// Fuzzes KvCacheManager with operation sequences the fuzzer's bytes choose: add (shared
// prefixes, salts, bad token ids), first allocation with a prefix hit, chunked prefill,
// decode steps one request at a time and in batches (duplicates included), appends, rollbacks,
// window releases, frees, step boundaries, prefix-cache resets, host-tier loads and transfers
// completed (or failed) in any order, and raw calls with arbitrary numbers. Properties:
//   * every error is a Status with a message, and a refused call changes no usage;
//   * CheckInvariants holds after every operation, and num_requests() matches;
//   * at the end, with every request freed and every transfer completed, no block is in use,
//     and after a prefix-cache reset every block of every pool is clean (free count == total).
// The first bytes choose the model (full, sliding-window or linear-attention), the accounting
// mode, the budget (a handful of blocks, so memory runs short), the chunk size and the host
// tier (none, write-through or write-back; kvpage accounting).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "fuzz/fuzz_check.h"
#include "fuzz/fuzz_input.h"
#include "kvpage/kv_cache_manager.h"

namespace kvpage::fuzz {
namespace {

constexpr int32_t kVocab = 512;       // the fuzz models' vocab_size
constexpr int32_t kMaxLive = 12;      // requests alive at once
constexpr int32_t kMaxOps = 4096;     // operations per input
constexpr int64_t kMaxTokens = 1024;  // per request (max_model_len is 4096)

struct Live {
  RequestHandle handle;
  int64_t id = 0;
  int64_t prompt_len = 0;
  int64_t tokens = 0;    // known tokens
  int64_t computed = 0;  // tokens whose K/V is written (a step the manager accepted)
  bool allocated = false;
};

class ManagerRun {
 public:
  ManagerRun(const uint8_t* data, size_t size) : in_(data, size) {}

  void Run() {
    if (!Build()) return;
    for (int32_t op = 0; op < kMaxOps && !in_.empty(); ++op) {
      ++stats_.ops;
      Step();
      KVPAGE_FUZZ_CHECK_OK(m_->CheckInvariants());
      KVPAGE_FUZZ_CHECK(m_->num_requests() == static_cast<int64_t>(live_.size()));
      m_->TakeSlotsToZero();
      m_->DrainEvents();
    }
    Drain();
    if (std::getenv("KVPAGE_FUZZ_STATS") != nullptr) {
      std::fprintf(stderr,
                   "manager_ops: %d ops, %d adds, %d allocations (%d refused for memory, %d "
                   "with a hit), %d decode batches, %d rollbacks, %d frees, %d errors, %d host "
                   "loads\n",
                   stats_.ops, stats_.adds, stats_.allocations, stats_.no_memory, stats_.hits,
                   stats_.batches, stats_.rollbacks, stats_.frees, stats_.errors, stats_.loads);
    }
  }

 private:
  struct Stats {
    int32_t ops = 0, adds = 0, allocations = 0, no_memory = 0, hits = 0, batches = 0;
    int32_t rollbacks = 0, frees = 0, errors = 0, loads = 0;
  };

  bool Build() {
    const ModelSpec model = FuzzModel(in_.Byte());
    KvCacheConfig c;
    c.mode = in_.Flag() ? AccountingMode::kVllm : AccountingMode::kKvpage;
    c.block_size = in_.Flag() ? 16 : 8;
    c.hash_seed = 1;
    c.enable_prefix_caching = in_.Range(0, 7) != 0;
    c.enable_kv_events = true;
    c.decode_snapshot_interval_blocks = in_.Range(1, 4);
    // 512 bytes per 16-token full-attention block: 6 to 69 such blocks.
    c.kv_budget_bytes = int64_t{512} * in_.Range(6, 69) * (model.num_layers() + 1);
    c.chunk_bytes = std::max<int64_t>(1024, c.kv_budget_bytes / in_.Range(1, 16));
    const int32_t tier = in_.Range(0, 2);
    if (tier > 0 && c.mode == AccountingMode::kKvpage) {
      c.host_cache = {.budget_bytes = c.kv_budget_bytes * in_.Range(1, 4) / 2,
                      .policy = tier == 1 ? HostTierPolicy::kWriteThrough
                                          : HostTierPolicy::kWriteBack};
    }
    auto m = KvCacheManager::Create(model, c);
    if (!m.ok()) {  // a budget too small for one block of every group: a refusal, not a bug
      CheckError(m.status());
      return false;
    }
    m_ = *std::move(m);
    has_state_ = false;
    for (int32_t g = 0; g < m_->num_groups(); ++g) {
      has_state_ |= m_->group_kind(GroupId(g)) == LayerKind::kLinearAttention;
    }
    KVPAGE_FUZZ_CHECK_OK(m_->CheckInvariants());
    return true;
  }

  void Step() {
    switch (in_.Byte() % 14) {
      case 0: return Add();
      case 1: return FirstAllocation();
      case 2: return Continue();
      case 3: return Sample();
      case 4: return DecodeBatch();
      case 5: return SampleBatch();
      case 6: return Rollback();
      case 7: return Release();
      case 8: return FreeOne();
      case 9: return m_->NewStep();
      case 10: return Reset();
      case 11: return LoadOne();
      case 12: return Transfers();
      default: return Raw();
    }
  }

  // A live request chosen by the next byte, optionally filtered; null when none fits.
  template <typename Pred>
  Live* Pick(Pred pred) {
    std::vector<Live*> c;
    for (Live& l : live_) {
      if (pred(l)) c.push_back(&l);
    }
    return c.empty() ? nullptr : c[in_.Byte() % c.size()];
  }
  Live* PickAny() {
    return Pick([](const Live&) { return true; });
  }

  std::vector<int32_t> Prompt() {
    // One of four shared streams up to a byte-chosen length, then a unique tail: prompts
    // share prefixes and hit each other's blocks.
    const int32_t stream = in_.Range(0, 3);
    const int32_t shared = in_.Range(0, 80);
    const int32_t tail = in_.Range(shared == 0 ? 1 : 0, 40);
    std::vector<int32_t> p;
    for (int32_t i = 0; i < shared; ++i) p.push_back((stream * 97 + i * 31) % kVocab);
    for (int32_t i = 0; i < tail; ++i) p.push_back(in_.Byte());
    return p;
  }

  void Add() {
    KvRequestSpec spec;
    const uint8_t kind = in_.Byte();
    spec.id = RequestId(next_id_++);
    spec.prompt_tokens = Prompt();
    // (push_back, not a literal's assignment: GCC 12 warns wrongly about the latter here.)
    if (kind % 5 == 0) spec.extras.cache_salt.push_back(kind % 2 ? 'a' : 'b');
    spec.skip_prefix_cache_read = kind % 11 == 0;
    bool bad = false;
    if (kind % 17 == 1 && !live_.empty()) {
      spec.id = RequestId(live_.front().id);  // a live id: AlreadyExists
      bad = true;
    } else if (kind % 17 == 2) {
      spec.prompt_tokens.push_back(kind % 2 ? kVocab : -1);  // outside the vocabulary
      bad = true;
    } else if (kind % 17 == 3) {
      spec.prompt_tokens.clear();
      bad = true;
    } else if (static_cast<int32_t>(live_.size()) >= kMaxLive) {
      return;
    }
    const int64_t len = static_cast<int64_t>(spec.prompt_tokens.size());
    const int64_t id = spec.id.value;
    const KvCacheUsage before = m_->Usage();
    auto h = m_->AddRequest(std::move(spec));
    if (bad) {
      CheckError(h.status());
      CheckSameUsage(before);
      return;
    }
    KVPAGE_FUZZ_CHECK_OK(h.status());
    live_.push_back({*h, id, len, len, 0, false});
    ++stats_.adds;
  }

  // After an accepted step: computed tokens move on (never past the known ones: num_new
  // may count drafts, which are not tokens yet).
  static void Computed(Live& l, int64_t c, int64_t n) {
    l.computed = std::min(c + n, l.tokens);
    l.allocated = true;
  }

  void FirstAllocation() {
    Live* l = Pick([](const Live& x) { return !x.allocated; });
    if (l == nullptr) return;
    auto hit = m_->GetComputedBlocks(l->handle);
    KVPAGE_FUZZ_CHECK_OK(hit.status());
    KVPAGE_FUZZ_CHECK(hit->num_tokens < l->tokens);
    const int64_t left = l->tokens - hit->num_tokens;
    const int64_t n = std::min<int64_t>(left, in_.Range(1, 64));
    AllocationRequest req{.num_computed_tokens = hit->num_tokens, .num_new_tokens = n};
    req.hit = hit->num_tokens > 0 || in_.Flag() ? &*hit : nullptr;
    stats_.hits += hit->num_tokens > 0;
    req.num_lookahead_tokens = in_.Range(0, 3);
    Allocate(*l, req);
  }

  void Continue() {
    Live* l = Pick([](const Live& x) { return x.allocated && x.computed < x.tokens; });
    if (l == nullptr) return;
    AllocationRequest req{.num_computed_tokens = l->computed};
    req.num_new_tokens = std::min<int64_t>(l->tokens - l->computed, in_.Range(1, 48));
    // Drafts beyond the known tokens (speculative decoding counts them in num_new_tokens).
    if (req.num_computed_tokens + req.num_new_tokens == l->tokens) {
      req.num_new_tokens += in_.Range(0, 3);
    }
    const uint8_t p = in_.Byte();
    req.num_processed_tokens = p % 4 == 0 ? -1 : p % (l->computed + 1);
    Allocate(*l, req);
  }

  void Allocate(Live& l, const AllocationRequest& req) {
    const KvCacheUsage before = m_->Usage();
    auto ok = m_->AllocateSlots(l.handle, req);
    if (!ok.ok()) {
      CheckError(ok.status());
      ++stats_.errors;
      return;
    }
    ++stats_.allocations;
    stats_.no_memory += !*ok;
    if (*ok) {
      Computed(l, req.num_computed_tokens, req.num_new_tokens);
    } else {
      // No memory: only window releases may have freed blocks.
      KVPAGE_FUZZ_CHECK(m_->Usage().used_bytes <= before.used_bytes);
    }
  }

  int32_t Token() { return in_.Byte() % kVocab; }

  void Sample() {
    Live* l = Pick([](const Live& x) { return x.allocated && x.computed == x.tokens; });
    if (l == nullptr) return;
    std::vector<int32_t> t(static_cast<size_t>(in_.Range(1, 3)));
    for (int32_t& x : t) x = Token();
    if (l->tokens + static_cast<int64_t>(t.size()) > kMaxTokens) return;
    KVPAGE_FUZZ_CHECK_OK(m_->AppendTokens(l->handle, t));
    l->tokens += static_cast<int64_t>(t.size());
  }

  void DecodeBatch() {
    std::vector<DecodeStep> steps;
    std::vector<Live*> who;
    for (Live& l : live_) {
      if (l.allocated && l.computed == l.tokens - 1) {
        steps.push_back({l.handle, l.computed, 1});
        who.push_back(&l);
      }
    }
    if (steps.empty()) return;
    const KvCacheUsage before = m_->Usage();
    if (in_.Range(0, 9) == 0) {  // a request named twice: refused, nothing changes
      steps.push_back(steps[in_.Byte() % steps.size()]);
      CheckError(m_->AllocateDecodeStep(steps).status());
      CheckSameUsage(before);
      return;
    }
    auto served = m_->AllocateDecodeStep(steps);
    KVPAGE_FUZZ_CHECK_OK(served.status());
    KVPAGE_FUZZ_CHECK(*served >= 0 && *served <= static_cast<int64_t>(steps.size()));
    ++stats_.batches;
    for (int64_t i = 0; i < *served; ++i) Computed(*who[i], who[i]->computed, 1);
  }

  void SampleBatch() {
    std::vector<DecodeToken> tokens;
    std::vector<Live*> who;
    for (Live& l : live_) {
      if (l.allocated && l.computed == l.tokens && l.tokens < kMaxTokens) {
        tokens.push_back({l.handle, Token()});
        who.push_back(&l);
      }
    }
    if (tokens.empty()) return;
    if (in_.Range(0, 9) == 0) {  // one id outside the vocabulary: nothing is appended
      tokens[in_.Byte() % tokens.size()].token = kVocab + in_.Byte();
      CheckError(m_->AppendDecodeTokens(tokens));
      return;
    }
    KVPAGE_FUZZ_CHECK_OK(m_->AppendDecodeTokens(tokens));
    for (Live* l : who) ++l->tokens;
  }

  void Rollback() {
    Live* l = Pick([](const Live& x) { return x.tokens > x.prompt_len; });
    if (l == nullptr) return;
    const int64_t k = in_.Byte() % (l->tokens - l->prompt_len + 1);
    const KvCacheUsage before = m_->Usage();
    const absl::Status s = m_->RollbackTokens(l->handle, k);
    // A recurrent state that includes the tokens cannot be rewound.
    if (has_state_ && l->allocated && k > 0) KVPAGE_FUZZ_CHECK(!s.ok());
    if (!s.ok()) {
      // A shared block, a state that cannot rewind, or a window that moved past the tokens.
      KVPAGE_FUZZ_CHECK(absl::IsFailedPrecondition(s));
      CheckError(s);
      CheckSameUsage(before);
      return;
    }
    l->tokens -= k;
    stats_.rollbacks += k > 0;
    // The last kept token is computed again (its successor was withdrawn).
    l->computed = std::min(l->computed, l->tokens - 1);
  }

  void Release() {
    Live* l = PickAny();
    if (l == nullptr) return;
    const uint8_t b = in_.Byte();
    if (b % 8 == 0) {  // outside [0, tokens]
      CheckError(m_->RemoveSkippedBlocks(l->handle, b % 16 == 0 ? -7 : l->tokens + 1));
      return;
    }
    KVPAGE_FUZZ_CHECK_OK(m_->RemoveSkippedBlocks(l->handle, b % (l->computed + 1)));
  }

  void FreeOne() {
    Live* l = PickAny();
    if (l == nullptr) return;
    KVPAGE_FUZZ_CHECK_OK(m_->Free(l->handle));
    // A stale handle afterwards names nothing.
    CheckError(m_->Free(l->handle));
    live_.erase(live_.begin() + (l - live_.data()));
    ++stats_.frees;
  }

  // LoadFromHost for a request before its first allocation: tokens, or 0; refused while it
  // holds blocks or loads already.
  void LoadOne() {
    Live* l = PickAny();
    if (l == nullptr) return;
    auto loaded = m_->LoadFromHost(l->handle);
    if (!loaded.ok()) {
      KVPAGE_FUZZ_CHECK(absl::IsFailedPrecondition(loaded.status()));
      CheckError(loaded.status());
      return;
    }
    KVPAGE_FUZZ_CHECK(*loaded >= 0 && *loaded < l->tokens && !l->allocated);
    stats_.loads += *loaded > 0;
  }

  // Takes the queued copies, or completes (or fails) one taken transfer, or a bad id.
  void Transfers() {
    const uint8_t b = in_.Byte();
    if (b % 3 == 0 || open_.empty()) {
      const TierTransfers t = m_->TakeTransfers();
      KVPAGE_FUZZ_CHECK((t.id == 0) == t.empty());
      if (t.id != 0) open_.push_back(t.id);
      return;
    }
    if (b % 17 == 1) {
      CheckError(m_->CompleteTransfers(next_bad_id_++));
      return;
    }
    const size_t i = in_.Byte() % open_.size();
    KVPAGE_FUZZ_CHECK_OK(m_->CompleteTransfers(open_[i], b % 7 != 2));
    CheckError(m_->CompleteTransfers(open_[i]));  // once only
    open_.erase(open_.begin() + static_cast<std::ptrdiff_t>(i));
  }

  void CompleteAll() {
    for (int round = 0; round < 2; ++round) {  // completing may not queue more, but check
      const TierTransfers t = m_->TakeTransfers();
      if (t.id != 0) open_.push_back(t.id);
      for (uint64_t id : open_) KVPAGE_FUZZ_CHECK_OK(m_->CompleteTransfers(id));
      open_.clear();
    }
  }

  void Reset() {
    bool held = false;
    for (const Live& l : live_) held |= l.allocated;
    // Saves pin their blocks and loads hold theirs until the request's first allocation.
    held |= m_->Usage().used_bytes > 0;
    const absl::Status s = m_->ResetPrefixCache();
    // Refused exactly while some request holds blocks.
    KVPAGE_FUZZ_CHECK(s.ok() == !held);
    if (!s.ok()) {
      KVPAGE_FUZZ_CHECK(absl::IsFailedPrecondition(s));
      CheckError(s);
    }
  }

  // AllocateSlots with numbers straight from the bytes: an error, or a consistent step.
  void Raw() {
    Live* l = PickAny();
    if (l == nullptr) return;
    AllocationRequest req;
    req.num_computed_tokens = static_cast<int16_t>(in_.U16());
    req.num_new_tokens = static_cast<int16_t>(in_.U16());
    req.num_lookahead_tokens = static_cast<int8_t>(in_.Byte());
    req.num_processed_tokens = static_cast<int8_t>(in_.Byte());
    if (in_.Flag()) req.num_reserve_tokens = in_.U16();
    const KvCacheUsage before = m_->Usage();
    auto ok = m_->AllocateSlots(l->handle, req);
    if (!ok.ok()) {
      CheckError(ok.status());
      CheckSameUsage(before);
      return;
    }
    // Accepted: the numbers were valid, so the step stands (computed may go back: a
    // recomputation).
    KVPAGE_FUZZ_CHECK(req.num_computed_tokens >= 0 && req.num_new_tokens > 0);
    KVPAGE_FUZZ_CHECK(req.num_computed_tokens <= l->tokens);
    if (*ok) Computed(*l, req.num_computed_tokens, req.num_new_tokens);
  }

  void CheckSameUsage(const KvCacheUsage& before) const {
    const KvCacheUsage after = m_->Usage();
    KVPAGE_FUZZ_CHECK(after.used_bytes == before.used_bytes);
    KVPAGE_FUZZ_CHECK(after.pools.size() == before.pools.size());
    for (size_t p = 0; p < after.pools.size(); ++p) {
      KVPAGE_FUZZ_CHECK(after.pools[p].used_blocks == before.pools[p].used_blocks);
    }
  }

  // Every request freed: every block back, and after a reset every block clean.
  void Drain() {
    while (!live_.empty()) {
      KVPAGE_FUZZ_CHECK_OK(m_->Free(live_.back().handle));
      live_.pop_back();
      KVPAGE_FUZZ_CHECK_OK(m_->CheckInvariants());
    }
    CompleteAll();
    KVPAGE_FUZZ_CHECK_OK(m_->CheckInvariants());
    KVPAGE_FUZZ_CHECK(m_->num_requests() == 0);
    KvCacheUsage u = m_->Usage();
    KVPAGE_FUZZ_CHECK(u.used_bytes == 0);
    KVPAGE_FUZZ_CHECK(u.mapped_bytes <= u.budget_bytes);
    for (const PoolUsage& p : u.pools) KVPAGE_FUZZ_CHECK(p.used_blocks == 0);
    KVPAGE_FUZZ_CHECK_OK(m_->ResetPrefixCache());
    KVPAGE_FUZZ_CHECK_OK(m_->CheckInvariants());
    u = m_->Usage();
    for (const PoolUsage& p : u.pools) {
      KVPAGE_FUZZ_CHECK(p.used_blocks == 0 && p.cached_free_blocks == 0);
    }
  }

  ByteReader in_;
  Stats stats_;
  std::unique_ptr<KvCacheManager> m_;
  std::vector<Live> live_;
  int64_t next_id_ = 0;
  bool has_state_ = false;
  std::vector<uint64_t> open_;     // transfers taken, not completed
  uint64_t next_bad_id_ = 1 << 20;  // ids never handed out
};

}  // namespace
}  // namespace kvpage::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kvpage::fuzz::ManagerRun(data, size).Run();
  return 0;
}
