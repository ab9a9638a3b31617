// Fuzzes the Scheduler with step sequences the fuzzer's bytes choose: requests added (shared
// prefixes, stop tokens, priorities, bad token ids and arrival times), steps whose results
// accept some drafts and propose new ones, aborts between Schedule and Update, repeated
// Schedule calls, malformed results, in a KV cache small enough to preempt. Properties:
//   * every error is a Status with a message, and a refused Update changes nothing (the right
//     result for the same output then goes through);
//   * CheckInvariants holds after every operation;
//   * the live requests are the ones added and neither finished nor aborted;
//   * at the end, after every request is aborted or finished, no block is in use;
//   * every step's image (kvpage/step_image.h) holds the output's arrays where its layout
//     says, and a buffer one byte short is refused.
// The first bytes choose the model (full, sliding-window or linear-attention) and the
// configuration (budget, step budget, max_num_seqs, chunked prefill, policy, drafts).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "fuzz/fuzz_check.h"
#include "fuzz/fuzz_input.h"
#include "kvpage/scheduler.h"
#include "kvpage/step_image.h"

namespace kvpage::fuzz {
namespace {

constexpr int32_t kVocab = 512;   // the fuzz models' vocab_size
constexpr int32_t kStop = 7;      // the stop token some requests carry
constexpr int32_t kMaxOps = 2048;
constexpr int32_t kMaxLive = 24;

class SchedulerRun {
 public:
  SchedulerRun(const uint8_t* data, size_t size) : in_(data, size) {}

  void Run() {
    if (!Build()) return;
    for (int32_t op = 0; op < kMaxOps && !in_.empty(); ++op) {
      ++ops_;
      switch (in_.Byte() % 8) {
        case 0:
        case 1: Add(); break;
        case 2: Abort(); break;
        default: Step(); break;
      }
      KVPAGE_FUZZ_CHECK_OK(s_->CheckInvariants());
      s_->DrainKvEvents();
      KVPAGE_FUZZ_CHECK(s_->HasUnfinishedRequests() == !live_.empty());
      KVPAGE_FUZZ_CHECK(s_->num_running() + s_->num_waiting() ==
                        static_cast<int32_t>(live_.size()));
    }
    Drain();
    if (std::getenv("KVPAGE_FUZZ_STATS") != nullptr) {
      std::fprintf(stderr,
                   "scheduler_steps: %d ops, %d adds, %d steps, %d finished, %d aborted, %lld "
                   "preemptions, %lld drafts accepted\n",
                   ops_, adds_, steps_, finished_, aborted_,
                   static_cast<long long>(s_->stats().preemptions),
                   static_cast<long long>(accepted_));
    }
  }

 private:
  bool Build() {
    const ModelSpec model = FuzzModel(in_.Byte());
    SchedulerConfig c;
    c.kv.mode = in_.Flag() ? AccountingMode::kVllm : AccountingMode::kKvpage;
    c.kv.block_size = in_.Flag() ? 16 : 8;
    c.kv.hash_seed = 2;
    c.kv.enable_prefix_caching = in_.Range(0, 7) != 0;
    c.kv.enable_kv_events = in_.Flag();
    // 512 bytes per 16-token block and layer: 3 to 40 blocks per layer (and a spare), so
    // decoding requests outgrow the cache and preempt each other.
    c.kv.kv_budget_bytes = int64_t{512} * in_.Range(3, 40) * (model.num_layers() + 1);
    c.kv.chunk_bytes = std::max<int64_t>(1024, c.kv.kv_budget_bytes / in_.Range(1, 16));
    c.max_num_batched_tokens = in_.Range(8, 263);
    c.max_num_seqs = in_.Range(1, 8);
    c.enable_chunked_prefill = in_.Range(0, 3) != 0;
    c.long_prefill_token_threshold = in_.Flag() ? 0 : in_.Range(1, 64);
    c.policy = in_.Flag() ? SchedulingPolicy::kPriority : SchedulingPolicy::kFcfs;
    c.reserve_full_prompt = in_.Flag();
    c.watermark = in_.Range(0, 3) * 0.05;
    c.num_speculative_tokens = in_.Range(0, 3);
    auto s = Scheduler::Create(model, c);
    if (!s.ok()) {  // e.g. drafts with linear attention, or a cache too small for any request
      CheckError(s.status());
      return false;
    }
    s_ = *std::move(s);
    spec_ = c.num_speculative_tokens;
    return true;
  }

  void Add() {
    RequestSpec r;
    const uint8_t kind = in_.Byte();
    r.id = RequestId(next_id_++);
    const int32_t stream = in_.Range(0, 3);
    const int32_t shared = in_.Range(0, 96);
    const int32_t tail = in_.Range(shared == 0 ? 1 : 0, 48);
    for (int32_t i = 0; i < shared; ++i) r.prompt_token_ids.push_back((stream * 89 + i * 13) % kVocab);
    for (int32_t i = 0; i < tail; ++i) r.prompt_token_ids.push_back(in_.Byte());
    r.max_new_tokens = in_.Range(1, 200);
    if (kind % 3 == 0) r.stop_token_ids = {kStop};
    r.priority = in_.Range(0, 3);
    r.arrival_time = static_cast<double>(next_id_);
    if (kind % 7 == 0) r.cache_salt = "salt";
    bool bad = true;
    switch (kind % 23) {
      case 1: r.prompt_token_ids.push_back(kVocab); break;
      case 2: r.prompt_token_ids.push_back(-1); break;
      case 3: r.arrival_time = std::numeric_limits<double>::quiet_NaN(); break;
      case 4: r.arrival_time = -std::numeric_limits<double>::infinity(); break;
      case 5: r.max_new_tokens = 0; break;
      case 6:
        if (live_.empty()) return;
        r.id = RequestId(*live_.begin());
        break;
      default: bad = false;
    }
    if (!bad && static_cast<int32_t>(live_.size()) >= kMaxLive) return;
    const int64_t id = r.id.value;
    const int64_t len = static_cast<int64_t>(r.prompt_token_ids.size());
    const absl::Status st = s_->AddRequest(std::move(r));
    if (bad) {
      CheckError(st);
      return;
    }
    if (absl::IsOutOfRange(st)) {  // no room for an output token under max_model_len
      KVPAGE_FUZZ_CHECK(len >= s_->max_model_len());
      return;
    }
    KVPAGE_FUZZ_CHECK_OK(st);
    live_.insert(id);
    ++adds_;
  }

  void Abort() {
    if (live_.empty() || in_.Range(0, 7) == 0) {
      CheckError(s_->Abort(RequestId(next_id_ + 1000)));  // unknown: NotFound
      return;
    }
    std::vector<int64_t> ids(live_.begin(), live_.end());
    std::sort(ids.begin(), ids.end());
    const int64_t id = ids[in_.Byte() % ids.size()];
    KVPAGE_FUZZ_CHECK_OK(s_->Abort(RequestId(id)));
    live_.erase(id);
    ++aborted_;
  }

  // The result of `out` the bytes choose: accepted drafts and new drafts per request.
  ModelOutput Result(const SchedulerOutput& out) {
    ModelOutput m;
    m.sampled_offsets.push_back(0);
    m.draft_offsets.push_back(0);
    for (const ScheduledRequest& sr : out.requests) {
      if (sr.samples) {
        const int32_t k = 1 + in_.Range(0, sr.num_draft_tokens);
        for (int32_t i = 0; i < k; ++i) {
          const uint8_t b = in_.Byte();
          m.sampled_token_ids.push_back(b % 16 == 0 ? kStop : b % kVocab);
        }
      }
      m.sampled_offsets.push_back(static_cast<int32_t>(m.sampled_token_ids.size()));
      const int32_t drafts = spec_ > 0 ? in_.Range(0, spec_) : 0;
      for (int32_t i = 0; i < drafts; ++i) m.draft_token_ids.push_back(in_.Byte() % kVocab);
      m.draft_offsets.push_back(static_cast<int32_t>(m.draft_token_ids.size()));
    }
    return m;
  }

  // A malformed variant of `good`, or nothing when the bytes pick none.
  bool Corrupt(const SchedulerOutput& out, ModelOutput& m) {
    switch (in_.Byte() % 8) {
      case 0:
        if (m.sampled_token_ids.empty()) return false;
        m.sampled_token_ids[0] = kVocab;  // outside the vocabulary
        return true;
      case 1:
        if (spec_ > 0) return false;
        m.draft_token_ids = {1};  // drafts while speculative decoding is off
        m.draft_offsets.assign(out.requests.size() + 1, 1);
        m.draft_offsets[0] = 0;
        return true;
      case 2:
        m.sampled_offsets.push_back(m.sampled_offsets.back());  // one offset too many
        return true;
      default: return false;
    }
  }

  // An array of `out` is where the image's layout puts it.
  template <typename T>
  static void CheckArray(const std::vector<std::byte>& image, const ImageArray& a,
                         const std::vector<T>& want) {
    KVPAGE_FUZZ_CHECK(a.count == static_cast<int64_t>(want.size()));
    KVPAGE_FUZZ_CHECK(a.offset % kStepImageAlignment == 0);
    KVPAGE_FUZZ_CHECK(a.offset + a.count * static_cast<int64_t>(sizeof(T)) <=
                      static_cast<int64_t>(image.size()));
    KVPAGE_FUZZ_CHECK(want.empty() ||
                      std::memcmp(image.data() + a.offset, want.data(), want.size() * sizeof(T)) == 0);
  }

  static void CheckStepImage(const SchedulerOutput& out) {
    const StepImageLayout layout = LayoutStepImage(out);
    std::vector<std::byte> image(static_cast<size_t>(layout.bytes));
    if (layout.bytes > 0) {
      CheckError(WriteStepImage(out, absl::MakeSpan(image).first(image.size() - 1)).status());
    }
    auto written = WriteStepImage(out, absl::MakeSpan(image));
    KVPAGE_FUZZ_CHECK_OK(written.status());
    KVPAGE_FUZZ_CHECK(written->bytes == layout.bytes);
    CheckArray(image, written->query_start_loc, out.query_start_loc);
    CheckArray(image, written->seq_lens, out.seq_lens);
    KVPAGE_FUZZ_CHECK(written->attention.size() == out.attention.size());
    for (size_t g = 0; g < out.attention.size(); ++g) {
      CheckArray(image, written->attention[g].slot_mapping, out.attention[g].slot_mapping);
    }
  }

  void Step() {
    const SchedulerOutput& out = s_->Schedule();
    CheckStepImage(out);
    if (in_.Range(0, 7) == 0) {
      // Schedule again before Update: the same step, unchanged.
      const SchedulerOutput& again = s_->Schedule();
      KVPAGE_FUZZ_CHECK(&again == &out);
    }
    ModelOutput result = Result(out);
    ModelOutput bad = result;
    if (Corrupt(out, bad)) {
      CheckError(s_->Update(out, bad).status());
      KVPAGE_FUZZ_CHECK_OK(s_->CheckInvariants());
    }
    if (!out.requests.empty() && in_.Range(0, 9) == 0) {
      // Aborted between Schedule and Update: its tokens are dropped.
      const int64_t id = out.requests[in_.Byte() % out.requests.size()].id.value;
      if (live_.contains(id)) {
        KVPAGE_FUZZ_CHECK_OK(s_->Abort(RequestId(id)));
        live_.erase(id);
      }
    }
    auto u = s_->Update(out, result);
    KVPAGE_FUZZ_CHECK_OK(u.status());
    ++steps_;
    accepted_ += u->stats.num_accepted_drafts;
    for (const FinishedRequest& f : u->finished) {
      ++finished_;
      KVPAGE_FUZZ_CHECK(live_.erase(f.id.value) == 1);
      KVPAGE_FUZZ_CHECK(f.num_output_tokens >= 1);
    }
    // A second Update of the same output is refused.
    CheckError(s_->Update(out, result).status());
  }

  // Runs the rest to completion (bounded), aborts what is left: every block comes back.
  void Drain() {
    for (int32_t step = 0; step < 4096 && s_->HasUnfinishedRequests(); ++step) {
      const SchedulerOutput& out = s_->Schedule();
      ModelOutput m;
      for (const ScheduledRequest& sr : out.requests) {
        if (sr.samples) m.sampled_token_ids.push_back(1);
        m.sampled_offsets.push_back(static_cast<int32_t>(m.sampled_token_ids.size()));
      }
      m.sampled_offsets.insert(m.sampled_offsets.begin(), 0);
      auto u = s_->Update(out, m);
      KVPAGE_FUZZ_CHECK_OK(u.status());
      for (const FinishedRequest& f : u->finished) live_.erase(f.id.value);
      KVPAGE_FUZZ_CHECK_OK(s_->CheckInvariants());
    }
    std::vector<int64_t> ids(live_.begin(), live_.end());
    for (int64_t id : ids) KVPAGE_FUZZ_CHECK_OK(s_->Abort(RequestId(id)));
    KVPAGE_FUZZ_CHECK(!s_->HasUnfinishedRequests());
    KVPAGE_FUZZ_CHECK_OK(s_->CheckInvariants());
    const KvCacheManager& kv = s_->kv_cache();
    KVPAGE_FUZZ_CHECK(kv.num_requests() == 0);
    const KvCacheUsage usage = kv.Usage();
    KVPAGE_FUZZ_CHECK(usage.used_bytes == 0);
    for (const PoolUsage& p : usage.pools) KVPAGE_FUZZ_CHECK(p.used_blocks == 0);
  }

  ByteReader in_;
  std::unique_ptr<Scheduler> s_;
  absl::flat_hash_set<int64_t> live_;
  int64_t next_id_ = 0;
  int32_t spec_ = 0;
  int32_t ops_ = 0, adds_ = 0, steps_ = 0, finished_ = 0, aborted_ = 0;
  int64_t accepted_ = 0;
};

}  // namespace
}  // namespace kvpage::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kvpage::fuzz::SchedulerRun(data, size).Run();
  return 0;
}
