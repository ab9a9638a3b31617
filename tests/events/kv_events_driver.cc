// kv_events_driver: a kvpage server (Scheduler + KvEventPublisher, fake model) driven over
// stdin, for tests that point a real router at it (tests/events/dynamo_indexer_test.py).
//
//   kv_events_driver [--model qwen3-8b] [--kv-budget-mib 256] [--block-size 16]
//
// Prints one JSON line at start: {"endpoint", "replay_endpoint", "block_size"} (both
// sockets bound to free ports on 127.0.0.1). Then, per line read:
//   "phase K"  runs workload phase K (K = 0, 1, 2, ...) to completion: 16 requests from four
//              families of shared prefixes, three aborted after their first step, under a
//              KV budget small enough to evict. Publishes each step's events, waits until the
//              publisher has sent them, and prints {"queries": [{"tokens": [...],
//              "expected": N}, ...], "stats": {...}}: every prompt so far (and a few prefixes
//              of them) with the tokens of its longest prefix the cache holds
//              (KvCacheManager::CachedPrefixTokens of the query plus one token).
//   "quit"     shuts the publisher down and exits 0.
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kvpage/catalog.h"
#include "kvpage/kv_event_publisher.h"
#include "kvpage/scheduler.h"

namespace {

using kvpage::RequestId;

std::vector<int32_t> Prompt(int64_t id) {
  const int32_t family = static_cast<int32_t>(id % 4);
  std::vector<int32_t> p;
  for (int32_t i = 0; i < 160 * (family + 1); ++i) p.push_back(1000 * family + i % 89 + 1);
  const int32_t suffix = 17 + static_cast<int32_t>((id * 53) % 120);
  for (int32_t i = 0; i < suffix; ++i) p.push_back(static_cast<int32_t>(40000 + id * 211 + i));
  return p;
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "kv_events_driver: %s\n", s.ToString().c_str());
  return 1;
}

class Driver {
 public:
  Driver(std::unique_ptr<kvpage::Scheduler> s, std::unique_ptr<kvpage::KvEventPublisher> p)
      : scheduler_(std::move(s)), publisher_(std::move(p)) {}

  absl::Status RunPhase(int64_t phase) {
    for (int64_t k = 0; k < 16; ++k) {
      const int64_t id = phase * 16 + k;
      prompts_.push_back(Prompt(id));
      absl::Status s = scheduler_->AddRequest(
          {.id = RequestId(id), .prompt_token_ids = prompts_.back(), .max_new_tokens = 24});
      if (!s.ok()) return s;
    }
    for (int64_t step = 0; scheduler_->HasUnfinishedRequests(); ++step) {
      const kvpage::SchedulerOutput& out = scheduler_->Schedule();
      kvpage::ModelOutput result;
      result.sampled_offsets.push_back(0);
      for (const kvpage::ScheduledRequest& r : out.requests) {
        if (r.samples) result.sampled_token_ids.push_back(static_cast<int32_t>(7 + step % 11));
        result.sampled_offsets.push_back(static_cast<int32_t>(result.sampled_token_ids.size()));
      }
      absl::StatusOr<kvpage::UpdateResult> u = scheduler_->Update(out, result);
      if (!u.ok()) return u.status();
      if (step == 0) {
        for (int64_t k = 2; k < 16; k += 5) (void)scheduler_->Abort(RequestId(phase * 16 + k));
      }
      std::vector<kvpage::KvEvent> events = scheduler_->DrainKvEvents();
      for (const kvpage::KvEvent& e : events) {
        removed_ += e.type == kvpage::KvEvent::Type::kRemoved ? 1 : 0;
      }
      publisher_->Publish(static_cast<double>(phase * 1000 + step), std::move(events));
    }
    if (!publisher_->Flush(absl::Seconds(30))) return absl::DeadlineExceededError("flush");
    return absl::OkStatus();
  }

  std::string Report() const {
    const kvpage::KvCacheManager& kv = scheduler_->kv_cache();
    std::vector<std::string> queries;
    auto add = [&](const std::vector<int32_t>& tokens) {
      // One more token: every full block of the query may hit (admission recomputes the last).
      std::vector<int32_t> longer = tokens;
      longer.push_back(0);
      queries.push_back(absl::StrCat("{\"tokens\":[", absl::StrJoin(tokens, ","),
                                     "],\"expected\":", kv.CachedPrefixTokens(longer), "}"));
    };
    for (const std::vector<int32_t>& p : prompts_) {
      add(p);
      add(std::vector<int32_t>(p.begin(), p.begin() + static_cast<int64_t>(p.size()) / 2));
    }
    const kvpage::KvEventPublisherStats st = publisher_->stats();
    return absl::StrCat("{\"queries\":[", absl::StrJoin(queries, ","), "],\"stats\":{",
                        "\"published_batches\":", st.published_batches,
                        ",\"dropped_batches\":", st.dropped_batches,
                        ",\"replay_requests\":", st.replay_requests,
                        ",\"removed_blocks\":", removed_, "}}");
  }

  void Shutdown() { publisher_->Shutdown(); }

 private:
  std::unique_ptr<kvpage::Scheduler> scheduler_;
  std::unique_ptr<kvpage::KvEventPublisher> publisher_;
  std::vector<std::vector<int32_t>> prompts_;
  int64_t removed_ = 0;  // kRemoved events so far: the cache evicted
};

}  // namespace

int main(int argc, char** argv) {
  std::string model_name = "qwen3-8b";
  int64_t budget_mib = 256;
  int32_t block_size = 16;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--model") model_name = argv[i + 1];
    if (flag == "--kv-budget-mib") budget_mib = std::atoll(argv[i + 1]);
    if (flag == "--block-size") block_size = std::atoi(argv[i + 1]);
  }
  absl::StatusOr<kvpage::ModelSpec> model = kvpage::LoadModel(model_name);
  if (!model.ok()) return Fail(model.status());
  kvpage::SchedulerConfig config;
  config.kv.kv_budget_bytes = budget_mib << 20;
  config.kv.block_size = block_size;
  config.kv.hash_seed = 1234;
  config.kv.enable_kv_events = true;
  config.max_num_seqs = 8;
  config.max_num_batched_tokens = 1024;
  auto scheduler = kvpage::Scheduler::Create(*model, config);
  if (!scheduler.ok()) return Fail(scheduler.status());
  auto publisher = kvpage::KvEventPublisher::Create(
      {.endpoint = "tcp://127.0.0.1:*", .replay_endpoint = "tcp://127.0.0.1:*"},
      kvpage::KvEventGroupInfos((*scheduler)->kv_cache()));
  if (!publisher.ok()) return Fail(publisher.status());
  std::printf("{\"endpoint\":\"%s\",\"replay_endpoint\":\"%s\",\"block_size\":%d}\n",
              (*publisher)->endpoint().c_str(), (*publisher)->replay_endpoint().c_str(),
              block_size);
  std::fflush(stdout);
  Driver driver(*std::move(scheduler), *std::move(publisher));
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line == "quit") break;
    if (line.rfind("phase ", 0) != 0) return Fail(absl::InvalidArgumentError(line));
    absl::Status s = driver.RunPhase(std::atoll(line.c_str() + 6));
    if (!s.ok()) return Fail(s);
    std::printf("%s\n", driver.Report().c_str());
    std::fflush(stdout);
  }
  driver.Shutdown();
  return 0;
}
