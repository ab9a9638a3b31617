// Plans a bundled model, schedules one request and reads a trace line through the simulator's
// parser, encodes its KV events: every exported library, linked from outside kvpage. Prints "consumer ok" on success.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "kvpage/catalog.h"
#include "kvpage/kv_event_wire.h"
#include "kvpage/planner.h"
#include "kvpage/scheduler.h"
#include "sim/trace.h"

namespace {

// AddRequest may return a Status or a StatusOr of a handle; the consumer works with either.
const absl::Status& StatusOf(const absl::Status& status) { return status; }
template <typename T>
const absl::Status& StatusOf(const absl::StatusOr<T>& result) {
  return result.status();
}

int Fail(const char* what, const absl::Status& status) {
  std::fprintf(stderr, "consumer: %s: %s\n", what, status.ToString().c_str());
  return 1;
}

}  // namespace

int main() {
  absl::StatusOr<kvpage::ModelSpec> model = kvpage::LoadModel("qwen3-8b");
  if (!model.ok()) return Fail("LoadModel", model.status());

  const std::vector<int64_t> contexts = {4096};
  absl::StatusOr<kvpage::Plan> plan = kvpage::MakePlan(*model, kvpage::PlanOptions{}, contexts);
  if (!plan.ok()) return Fail("MakePlan", plan.status());

  kvpage::SchedulerConfig config;
  config.kv.kv_budget_bytes = int64_t{1} << 30;
  absl::StatusOr<std::unique_ptr<kvpage::Scheduler>> scheduler =
      kvpage::Scheduler::Create(*model, config);
  if (!scheduler.ok()) return Fail("Scheduler::Create", scheduler.status());
  const std::vector<int32_t> prompt(100, 7);
  auto added = (*scheduler)->AddRequest(
      {.id = kvpage::RequestId(1), .prompt_token_ids = prompt, .max_new_tokens = 4});
  if (!added.ok()) return Fail("AddRequest", StatusOf(added));
  const kvpage::SchedulerOutput& out = (*scheduler)->Schedule();
  if (out.requests.size() != 1) {
    std::fprintf(stderr, "consumer: scheduled %zu requests, want 1\n", out.requests.size());
    return 1;
  }

  // kvpage::events: the request's events as the wire payload a router reads.
  absl::StatusOr<std::string> payload = kvpage::EncodeKvEventBatch(
      0.0, (*scheduler)->DrainKvEvents(), kvpage::KvEventGroupInfos((*scheduler)->kv_cache()));
  if (!payload.ok()) return Fail("EncodeKvEventBatch", payload.status());
  if (!kvpage::DecodeKvEventBatch(*payload).ok()) return Fail("DecodeKvEventBatch", payload.status());

  absl::StatusOr<std::vector<kvpage::sim::TraceRequest>> trace = kvpage::sim::ParseTrace(
      kvpage::sim::TraceFormat::kMooncake,
      R"({"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]})",
      "consumer", kvpage::sim::TraceOptions{});
  if (!trace.ok()) return Fail("ParseTrace", trace.status());
  if (trace->size() != 1) return Fail("ParseTrace", absl::InternalError("want one request"));

  std::printf("consumer ok: %s reserves %lld bytes at 4K\n", model->name.c_str(),
              static_cast<long long>(plan->rows[0].reserved_bytes));
  return 0;
}
