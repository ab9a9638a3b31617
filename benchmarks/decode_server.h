// DecodeServer: a scheduler in steady decode, shared by the scheduler benchmark and the
// instruction counter (decode_step_counter.cc). N requests with prompts of 1,000 to 2,023
// tokens are prefilled until every one decodes a token per step; prefix caching on or off.
#ifndef KVPAGE_BENCHMARKS_DECODE_SERVER_H_
#define KVPAGE_BENCHMARKS_DECODE_SERVER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kvpage/catalog.h"
#include "kvpage/kv_cache_manager.h"
#include "kvpage/scheduler.h"

namespace kvpage_bench {

using kvpage::ModelOutput;
using kvpage::RequestId;
using kvpage::Scheduler;
using kvpage::SchedulerConfig;
using kvpage::SchedulerOutput;

// Steps between resets: requests grow by one token a step, so the cache is sized for this.
constexpr int32_t kStepsPerRound = 8192;

class DecodeServer {
 public:
  DecodeServer(const char* model_name, int32_t num_requests, bool prefix_caching)
      : num_requests_(num_requests) {
    auto model = kvpage::LoadModel(model_name);
    if (!model.ok()) {
      error_ = std::string(model.status().message());
      return;
    }
    model_ = *model;
    config_.max_num_seqs = num_requests;
    config_.max_num_batched_tokens = 8192;
    config_.kv.hash_seed = 1;
    config_.kv.enable_prefix_caching = prefix_caching;
    config_.max_model_len = 16384;
    // Prompts of 1,000 to 2,023 tokens: requests sit at every offset within their blocks, so
    // one in 16 starts a new block each step.
    int64_t tokens = 0;
    for (int32_t i = 0; i < num_requests; ++i) tokens += PromptLen(i) + kStepsPerRound + 64;
    // Size the budget from the pools' block sizes (a probe manager) for the peak token count.
    kvpage::KvCacheConfig probe_config;
    probe_config.kv_budget_bytes = int64_t{4} << 30;
    auto probe = kvpage::KvCacheManager::Create(model_, probe_config);
    if (!probe.ok()) {
      error_ = std::string(probe.status().message());
      return;
    }
    int64_t bytes = 0;
    for (const auto& pool : (*probe)->Usage().pools) {
      bytes += (tokens / 16 + 2 * num_requests) * pool.block_bytes + probe_config.chunk_bytes;
    }
    config_.kv.kv_budget_bytes = bytes + bytes / 4;
    Reset();
  }

  const std::string& error() const { return error_; }
  Scheduler& scheduler() { return *scheduler_; }
  int32_t steps_left() const { return steps_left_; }

  // A new scheduler with every request prefilled and decoding.
  void Reset() {
    auto s = Scheduler::Create(model_, config_);
    if (!s.ok()) {
      error_ = std::string(s.status().message());
      return;
    }
    scheduler_ = *std::move(s);
    for (int32_t i = 0; i < num_requests_; ++i) {
      kvpage::RequestSpec r;
      r.id = RequestId(i);
      r.prompt_token_ids.resize(static_cast<size_t>(PromptLen(i)));
      for (size_t t = 0; t < r.prompt_token_ids.size(); ++t) {
        r.prompt_token_ids[t] = static_cast<int32_t>((t * 31 + static_cast<size_t>(i) * 7919) % 150000);
      }
      r.max_new_tokens = kStepsPerRound * 2;
      if (!scheduler_->AddRequest(std::move(r)).ok()) error_ = "AddRequest failed";
    }
    // Prefill until everyone decodes.
    while (error_.empty()) {
      const SchedulerOutput& out = scheduler_->Schedule();
      bool all_decode = static_cast<int32_t>(out.requests.size()) == num_requests_;
      for (const auto& r : out.requests) all_decode &= r.num_scheduled_tokens == 1;
      if (!Apply(out)) return;
      if (all_decode) break;
    }
    steps_left_ = kStepsPerRound;
  }

  // One sampled token per sampling request, written by index into buffers that keep their
  // size from step to step (as a server's sampler output would be): the benchmark times the
  // scheduler, not the building of its input.
  bool Apply(const SchedulerOutput& out) {
    const size_t n = out.requests.size();
    result_.sampled_token_ids.resize(n);
    if (out.one_sample_each) {
      // One token per request, in order: no offsets to write (ModelOutput::sampled_offsets).
      int32_t* tokens = result_.sampled_token_ids.data();
      for (size_t i = 0; i < n; ++i) tokens[i] = static_cast<int32_t>(i & 1023);
      result_.sampled_offsets.clear();
      return Update(out);
    }
    result_.sampled_offsets.resize(n + 1);
    int32_t* tokens = result_.sampled_token_ids.data();
    int32_t* offsets = result_.sampled_offsets.data();
    int32_t count = 0;
    offsets[0] = 0;
    for (size_t i = 0; i < n; ++i) {
      const auto& r = out.requests[i];
      // Any valid token will do; the row index costs less than a function of the id.
      if (r.samples) tokens[count++] = static_cast<int32_t>(i & 1023);
      offsets[i + 1] = count;
    }
    result_.sampled_token_ids.resize(static_cast<size_t>(count));
    return Update(out);
  }

 private:
  static int64_t PromptLen(int32_t i) { return 1000 + i % 1024; }

  bool Update(const SchedulerOutput& out) {
    auto update = scheduler_->Update(out, result_);
    if (!update.ok()) {
      error_ = std::string(update.status().message());
      return false;
    }
    --steps_left_;
    return true;
  }

  int32_t num_requests_;
  kvpage::ModelSpec model_;
  SchedulerConfig config_;
  std::unique_ptr<Scheduler> scheduler_;
  ModelOutput result_;
  int32_t steps_left_ = 0;
  std::string error_;
};

}  // namespace kvpage_bench

#endif  // KVPAGE_BENCHMARKS_DECODE_SERVER_H_
